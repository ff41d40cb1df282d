/* data.c -- the IDX loader, the synthetic dataset and worker shards.
 *
 * IDX is the format of MNIST and Fashion-MNIST: a big-endian header (magic,
 * then one uint32 per dimension) followed by raw unsigned bytes. zlib's
 * gzread reads gzip and plain files alike, so one code path serves both.
 * Pixels become floats in [0,1] as they are read, in chunks, so a 47 MB
 * image file never sits in memory twice.
 */
#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "gddr/gddr.h"

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u
#define IDX_CLASSES 10
/* No real IDX image is near this; the limit keeps n*dim far from overflow. */
#define IDX_MAX_DIM (1 << 20)

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Reads up to len bytes, looping because gzread takes an unsigned int and
 * may return short counts. Returns the bytes read, or -1 on a read error
 * (a gzip stream cut short reads as a short count, not an error). */
static long long read_full(gzFile f, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        size_t want = len - got;
        if (want > (1u << 30))
            want = 1u << 30;
        int r = gzread(f, (char *)buf + got, (unsigned)want);
        if (r < 0) {
            int zerr;
            gzerror(f, &zerr);
            /* zlib reports a truncated gzip member as Z_BUF_ERROR. */
            return zerr == Z_BUF_ERROR ? (long long)got : -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (long long)got;
}

/* Opens an IDX file and reads its magic and `ndims` dimensions. */
static int idx_open(const char *path, uint32_t magic, int ndims, uint32_t *dims, gzFile *out,
                    char *err, size_t errlen)
{
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        seterr(err, errlen, "%s: cannot open: %s", path,
               errno ? strerror(errno) : "out of memory");
        return GDDR_EIO;
    }
    unsigned char hdr[4 * 4];
    size_t hlen = 4 * (size_t)(1 + ndims);
    long long r = read_full(f, hdr, hlen);
    if (r < 0 || (size_t)r < hlen) {
        seterr(err, errlen, "%s: %s", path,
               r < 0 ? "read error in the header" : "truncated header");
        gzclose(f);
        return GDDR_EIO;
    }
    uint32_t got = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (got != magic) {
        seterr(err, errlen, "%s: bad magic 0x%08x, want 0x%08x (IDX, unsigned bytes, %d dims)",
               path, got, magic, ndims);
        gzclose(f);
        return GDDR_EIO;
    }
    for (int i = 0; i < ndims; i++) {
        const unsigned char *p = hdr + 4 * (1 + i);
        dims[i] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    }
    *out = f;
    return GDDR_OK;
}

/* Fails when anything follows the data, which means the header lies, or
 * when the gzip stream did not end cleanly. */
static int idx_check_end(gzFile f, const char *path, char *err, size_t errlen)
{
    unsigned char extra;
    if (read_full(f, &extra, 1) != 0) {
        seterr(err, errlen, "%s: trailing data after the count the header gives", path);
        return GDDR_EIO;
    }
    /* A gzip file cut inside its trailer still yields every byte; zlib only
     * says so through the error state. */
    int zerr;
    gzerror(f, &zerr);
    if (zerr != Z_OK) {
        seterr(err, errlen, "%s: gzip stream ends early or is corrupt", path);
        return GDDR_EIO;
    }
    return GDDR_OK;
}

static int load_images(const char *path, gddr_dataset *d, char *err, size_t errlen)
{
    uint32_t dims[3];
    gzFile f;
    int rc = idx_open(path, IDX_MAGIC_IMAGES, 3, dims, &f, err, errlen);
    if (rc)
        return rc;
    if (dims[0] == 0 || dims[0] > INT32_MAX || dims[1] == 0 || dims[2] == 0 ||
        (uint64_t)dims[1] * dims[2] > IDX_MAX_DIM) {
        seterr(err, errlen, "%s: bad dims %u x %u x %u", path, dims[0], dims[1], dims[2]);
        gzclose(f);
        return GDDR_EIO;
    }
    d->n = (int)dims[0];
    d->dim = (int)(dims[1] * dims[2]);
    size_t total = (size_t)d->n * (size_t)d->dim;
    d->x = malloc(total * sizeof(float));
    unsigned char *buf = malloc(1 << 16);
    if (!d->x || !buf) {
        seterr(err, errlen, "%s: out of memory for %zu pixels", path, total);
        free(buf);
        gzclose(f);
        return GDDR_ENOMEM;
    }
    /* A table gives exactly pixel/255 without a division per pixel. */
    float lut[256];
    for (int v = 0; v < 256; v++)
        lut[v] = (float)v / 255.0f;
    size_t done = 0;
    while (done < total) {
        size_t want = total - done < (1 << 16) ? total - done : (1 << 16);
        long long r = read_full(f, buf, want);
        if (r < 0) {
            seterr(err, errlen, "%s: read error after %zu of %zu pixels", path, done, total);
            rc = GDDR_EIO;
            break;
        }
        for (long long i = 0; i < r; i++)
            d->x[done + (size_t)i] = lut[buf[i]];
        done += (size_t)r;
        if ((size_t)r < want) {
            seterr(err, errlen, "%s: truncated: %zu of %d images", path,
                   done / (size_t)d->dim, d->n);
            rc = GDDR_EIO;
            break;
        }
    }
    if (rc == GDDR_OK)
        rc = idx_check_end(f, path, err, errlen);
    free(buf);
    gzclose(f);
    return rc;
}

static int load_labels(const char *path, gddr_dataset *d, char *err, size_t errlen)
{
    uint32_t count;
    gzFile f;
    int rc = idx_open(path, IDX_MAGIC_LABELS, 1, &count, &f, err, errlen);
    if (rc)
        return rc;
    if (count != (uint32_t)d->n) {
        seterr(err, errlen, "%s: %u labels but %d images", path, count, d->n);
        gzclose(f);
        return GDDR_EIO;
    }
    d->y = malloc((size_t)d->n);
    if (!d->y) {
        seterr(err, errlen, "%s: out of memory for %d labels", path, d->n);
        gzclose(f);
        return GDDR_ENOMEM;
    }
    long long r = read_full(f, d->y, (size_t)d->n);
    if (r < 0 || r < d->n) {
        if (r < 0)
            seterr(err, errlen, "%s: read error in the labels", path);
        else
            seterr(err, errlen, "%s: truncated: %lld of %d labels", path, r, d->n);
        gzclose(f);
        return GDDR_EIO;
    }
    for (int i = 0; i < d->n; i++) {
        if (d->y[i] >= IDX_CLASSES) {
            seterr(err, errlen, "%s: label %u at index %d is not < %d", path, d->y[i], i,
                   IDX_CLASSES);
            gzclose(f);
            return GDDR_EIO;
        }
    }
    rc = idx_check_end(f, path, err, errlen);
    gzclose(f);
    return rc;
}

int gddr_idx_load(const char *images_path, const char *labels_path, gddr_dataset *out,
                  char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out)
        return GDDR_EINVAL;
    memset(out, 0, sizeof *out);
    if (!images_path || !labels_path) {
        seterr(err, errlen, "gddr_idx_load: NULL path");
        return GDDR_EINVAL;
    }
    gddr_dataset d = {.classes = IDX_CLASSES, .owns = 1};
    int rc = load_images(images_path, &d, err, errlen);
    if (rc == GDDR_OK)
        rc = load_labels(labels_path, &d, err, errlen);
    if (rc != GDDR_OK) {
        gddr_dataset_free(&d);
        return rc;
    }
    *out = d;
    return GDDR_OK;
}

int gddr_fashion_mnist_load(const char *dir, gddr_dataset *train, gddr_dataset *test,
                            char *err, size_t errlen)
{
    if (!dir || !train || !test) {
        seterr(err, errlen, "gddr_fashion_mnist_load: NULL argument");
        return GDDR_EINVAL;
    }
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    char img[4096], lab[4096];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", dir);
    int rc = gddr_idx_load(img, lab, train, err, errlen);
    if (rc)
        return rc;
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(lab, sizeof lab, "%s/t10k-labels-idx1-ubyte.gz", dir);
    rc = gddr_idx_load(img, lab, test, err, errlen);
    if (rc == GDDR_OK && test->dim != train->dim) {
        seterr(err, errlen, "%s: %d pixels per image but the training set has %d", img,
               test->dim, train->dim);
        rc = GDDR_EIO;
    }
    if (rc) {
        gddr_dataset_free(train);
        gddr_dataset_free(test);
    }
    return rc;
}

/* splitmix64: tiny, seedable with any value, and identical everywhere. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0,1) from the top 53 bits. */
static double rng_unif(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

void gddr_dataset_synthetic(gddr_dataset *out, int n, int dim, int classes, uint64_t seed)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (n < 1 || dim < 1 || classes < 2 || classes > 256)
        return;
    uint64_t s = seed;
    float *centre = malloc((size_t)classes * (size_t)dim * sizeof(float));
    gddr_dataset d = {.n = n, .dim = dim, .classes = classes, .owns = 1};
    d.x = malloc((size_t)n * (size_t)dim * sizeof(float));
    d.y = malloc((size_t)n);
    if (!centre || !d.x || !d.y) {
        free(centre);
        gddr_dataset_free(&d);
        return;
    }
    for (size_t i = 0; i < (size_t)classes * (size_t)dim; i++)
        centre[i] = (float)(0.1 + 0.8 * rng_unif(&s));
    for (int i = 0; i < n; i++) {
        int c = (int)(rng_next(&s) % (uint64_t)classes);
        d.y[i] = (uint8_t)c;
        float *row = d.x + (size_t)i * (size_t)dim;
        for (int k = 0; k < dim; k++) {
            /* Box-Muller; one normal per pair of uniforms keeps it simple. */
            double u1 = rng_unif(&s), u2 = rng_unif(&s);
            double g = sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
            double v = centre[(size_t)c * (size_t)dim + (size_t)k] + 0.15 * g;
            row[k] = (float)(v < 0.0 ? 0.0 : v > 1.0 ? 1.0 : v);
        }
    }
    free(centre);
    *out = d;
}

int gddr_dataset_shard(const gddr_dataset *in, int rank, int world, gddr_dataset *out)
{
    if (!out)
        return GDDR_EINVAL;
    memset(out, 0, sizeof *out);
    if (!in || world < 1 || rank < 0 || rank >= world || in->n < 0 || in->dim < 1 ||
        (in->n > 0 && (!in->x || !in->y)))
        return GDDR_EINVAL;
    int n = in->n > rank ? (in->n - rank + world - 1) / world : 0;
    gddr_dataset d = {.n = n, .dim = in->dim, .classes = in->classes, .owns = 1};
    /* malloc(0) may return NULL; one spare element keeps NULL meaning failure. */
    d.x = malloc(((size_t)n * (size_t)in->dim + 1) * sizeof(float));
    d.y = malloc((size_t)n + 1);
    if (!d.x || !d.y) {
        gddr_dataset_free(&d);
        return GDDR_ENOMEM;
    }
    size_t row = (size_t)in->dim * sizeof(float);
    for (int j = 0; j < n; j++) {
        size_t i = (size_t)rank + (size_t)j * (size_t)world;
        memcpy(d.x + (size_t)j * (size_t)in->dim, in->x + i * (size_t)in->dim, row);
        d.y[j] = in->y[i];
    }
    *out = d;
    return GDDR_OK;
}

void gddr_dataset_free(gddr_dataset *d)
{
    if (!d)
        return;
    if (d->owns) {
        free(d->x);
        free(d->y);
    }
    memset(d, 0, sizeof *d);
}
