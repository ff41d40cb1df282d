/* checkpoint_read.c -- loading the newest valid checkpoint (checkpoint.h).
 *
 * One sequential pass with pread() through a 1 MiB buffer (large section
 * data is read straight into its own malloc'd buffer), checking each length
 * against the end of the content before trusting it, and the CRC at the
 * end. A file that fails a check is skipped for the next older one; one
 * that cannot be read is an error (the format: checkpoint_format.c).
 */
#define _GNU_SOURCE
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "checkpoint_format.h"
#include "crc32c.h"
#include "log.h"

#define CKPT_RDBUF (1u << 20)

typedef struct rdr {
    int fd;
    uint64_t pos;     /* content bytes consumed */
    uint64_t filepos; /* bytes read from the file */
    uint64_t end;     /* content length: bytes covered by the CRC */
    uint8_t *buf;
    size_t blen, boff;
    uint32_t crc;
} rdr;

/* Reads exactly n bytes at off. 0, -errno, or 1 for a short read. */
static int pread_full(int fd, void *dst, size_t n, uint64_t off)
{
    uint8_t *p = dst;
    while (n) {
        size_t want = n > (1u << 30) ? (1u << 30) : n;
        ssize_t k = pread(fd, p, want, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (k == 0)
            return 1;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* Consumes n content bytes into dst (the caller checked pos + n <= end). */
static int rd(rdr *r, void *dst, uint64_t n)
{
    uint8_t *d = dst;
    while (n) {
        if (r->boff < r->blen) {
            size_t take = r->blen - r->boff;
            if (take > n)
                take = (size_t)n;
            memcpy(d, r->buf + r->boff, take);
            r->boff += take;
            d += take;
            n -= take;
            r->pos += take;
            continue;
        }
        if (n >= CKPT_RDBUF) {
            int k = pread_full(r->fd, d, (size_t)n, r->filepos);
            if (k)
                return k;
            r->crc = gddr__crc32c(r->crc, d, (size_t)n);
            r->filepos += n;
            r->pos += n;
            return 0;
        }
        uint64_t want = r->end - r->filepos;
        if (want == 0)
            return 1; /* callers check bounds first; never spin */
        if (want > CKPT_RDBUF)
            want = CKPT_RDBUF;
        int k = pread_full(r->fd, r->buf, (size_t)want, r->filepos);
        if (k)
            return k;
        r->crc = gddr__crc32c(r->crc, r->buf, (size_t)want);
        r->filepos += want;
        r->blen = (size_t)want;
        r->boff = 0;
    }
    return 0;
}

/* Loads one file. GDDR_OK; 1 = invalid (why says so); GDDR_EIO/ENOMEM (err). */
static int load_file(const char *path, uint64_t seq, gddr_ckpt *out, char *why, size_t whylen,
                     char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            gddr__ckpt_seterr(why, whylen, "removed while loading");
            return 1;
        }
        gddr__ckpt_seterr(err, errlen, "open %s: %s", path, strerror(errno));
        return GDDR_EIO;
    }
    rdr r = { .fd = fd };
    gddr_ckpt_section *s = NULL;
    size_t n = 0, cap = 0;
    int rc = 1;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        gddr__ckpt_seterr(err, errlen, "stat %s: %s", path, strerror(errno));
        rc = GDDR_EIO;
        goto done;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (!S_ISREG(sb.st_mode)) {
        gddr__ckpt_seterr(why, whylen, "not a regular file");
        goto done;
    }
    if (size < CKPT_HDR_LEN + CKPT_TRL_LEN) {
        gddr__ckpt_seterr(why, whylen, "short file (%" PRIu64 " bytes)", size);
        goto done;
    }
    uint8_t hdr[CKPT_HDR_LEN], trl[CKPT_TRL_LEN];
    int k = pread_full(fd, trl, CKPT_TRL_LEN, size - CKPT_TRL_LEN);
    if (k == 0)
        k = pread_full(fd, hdr, CKPT_HDR_LEN, 0);
    if (k < 0) {
        gddr__ckpt_seterr(err, errlen, "read %s: %s", path, strerror(-k));
        rc = GDDR_EIO;
        goto done;
    }
    if (k > 0) {
        gddr__ckpt_seterr(why, whylen, "file shrank while loading");
        goto done;
    }
    uint32_t count, stored;
    uint64_t content;
    if (gddr__ckpt_decode_ends(hdr, trl, size, seq, &count, &content, &stored, why, whylen))
        goto done;
    r.end = content;
    r.buf = malloc(CKPT_RDBUF);
    if (!r.buf) {
        gddr__ckpt_seterr(err, errlen, "loading %s: out of memory", path);
        rc = GDDR_ENOMEM;
        goto done;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint8_t tmp[CKPT_HDR_LEN];
    if ((k = rd(&r, tmp, CKPT_HDR_LEN)) != 0)
        goto rderr;
    for (uint32_t i = 0; i < count; i++) {
        uint8_t rec[2 + 80]; /* u16 name length, then at most 78: name, pad, u64 length */
        if (r.end - r.pos < 2) {
            gddr__ckpt_seterr(why, whylen, "section %" PRIu32 " runs past the end", i);
            goto done;
        }
        if ((k = rd(&r, rec, 2)) != 0)
            goto rderr;
        uint16_t nl = ckpt_get16(rec);
        if (nl == 0 || nl > CKPT_NAME_MAX) {
            gddr__ckpt_seterr(why, whylen, "section %" PRIu32 " name length %u invalid", i,
                              (unsigned)nl);
            goto done;
        }
        uint64_t rest = ckpt_align8(2u + nl) - 2 + 8; /* name, pad, data length */
        if (r.end - r.pos < rest) {
            gddr__ckpt_seterr(why, whylen, "section %" PRIu32 " runs past the end", i);
            goto done;
        }
        if ((k = rd(&r, rec + 2, rest)) != 0)
            goto rderr;
        if (memchr(rec + 2, '\0', nl)) {
            gddr__ckpt_seterr(why, whylen, "section %" PRIu32 " name contains NUL", i);
            goto done;
        }
        uint64_t dlen = ckpt_get64(rec + 2 + rest - 8);
        uint64_t left = r.end - r.pos;
        if (dlen > left || ckpt_align8(dlen) > left) {
            gddr__ckpt_seterr(why, whylen,
                              "section %" PRIu32 " length %" PRIu64 " runs past the end (%" PRIu64
                              " bytes left)",
                              i, dlen, left);
            goto done;
        }
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            gddr_ckpt_section *ns = realloc(s, ncap * sizeof *ns);
            if (!ns) {
                gddr__ckpt_seterr(err, errlen, "loading %s: out of memory", path);
                rc = GDDR_ENOMEM;
                goto done;
            }
            s = ns;
            cap = ncap;
        }
        gddr_ckpt_section *sec = &s[n];
        memset(sec, 0, sizeof *sec);
        memcpy(sec->name, rec + 2, nl);
        sec->len = dlen;
        sec->data = malloc(dlen ? (size_t)dlen : 1);
        if (!sec->data) {
            gddr__ckpt_seterr(err, errlen,
                              "loading %s: out of memory for section %s (%" PRIu64 " bytes)",
                              path, sec->name, dlen);
            rc = GDDR_ENOMEM;
            goto done;
        }
        n++;
        if ((k = rd(&r, sec->data, dlen)) != 0)
            goto rderr;
        uint8_t pad[8];
        if ((k = rd(&r, pad, ckpt_align8(dlen) - dlen)) != 0)
            goto rderr;
    }
    if (r.pos != r.end) {
        gddr__ckpt_seterr(why, whylen, "%" PRIu64 " stray bytes after the last section",
                          r.end - r.pos);
        goto done;
    }
    /* The buffered reader hashes whole buffers; account for what it read. */
    if (r.filepos != r.end) { /* cannot happen: pos == end and filepos <= end */
        gddr__ckpt_seterr(why, whylen, "internal read accounting error");
        goto done;
    }
    if (stored != r.crc) {
        gddr__ckpt_seterr(why, whylen,
                          "CRC mismatch (stored %08" PRIx32 ", computed %08" PRIx32 ")",
                          stored, r.crc);
        goto done;
    }
    out->seq = seq;
    snprintf(out->path, sizeof out->path, "%s", path);
    out->n = n;
    out->s = s;
    s = NULL;
    n = 0;
    rc = GDDR_OK;
    goto done;

rderr:
    if (k < 0) {
        gddr__ckpt_seterr(err, errlen, "read %s: %s", path, strerror(-k));
        rc = GDDR_EIO;
    } else {
        gddr__ckpt_seterr(why, whylen, "file shrank while loading");
        rc = 1;
    }
done:
    gddr__ckpt_free_sections(s, n);
    free(r.buf);
    close(fd);
    return rc;
}

int gddr__ckpt_load_newest(const char *dir, gddr_ckpt *out, char *err, size_t errlen)
{
    return gddr__ckpt_load_upto(dir, UINT64_MAX, 0, out, err, errlen);
}

int gddr__ckpt_load_upto(const char *dir, uint64_t max_seq, int only, gddr_ckpt *out, char *err,
                         size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out)
        return GDDR_EINVAL;
    memset(out, 0, sizeof *out);
    if (!dir) {
        gddr__ckpt_seterr(err, errlen, "checkpoint: no directory");
        return GDDR_EINVAL;
    }
    uint64_t *v;
    size_t n;
    int rc = gddr__ckpt_scan_dir(dir, &v, &n, NULL, err, errlen);
    if (rc != GDDR_OK)
        return rc;
    rc = 1;
    for (size_t i = 0; i < n; i++) {
        char path[4096], why[256] = "";
        if (v[i] > max_seq || (only && v[i] != max_seq))
            continue;
        if (!gddr__ckpt_path(path, sizeof path, dir, v[i], 0)) {
            gddr__ckpt_seterr(err, errlen, "checkpoint: path too long: %s", dir);
            rc = GDDR_EINVAL;
            break;
        }
        int k = load_file(path, v[i], out, why, sizeof why, err, errlen);
        if (k == 1) {
            gddr_log(GDDR_LOG_WARN, "checkpoint %s skipped: %s", path, why);
            continue;
        }
        rc = k;
        break;
    }
    free(v);
    if (rc != GDDR_OK)
        memset(out, 0, sizeof *out);
    return rc;
}

const gddr_ckpt_section *gddr__ckpt_find(const gddr_ckpt *c, const char *name)
{
    if (!c || !name)
        return NULL;
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->s[i].name, name) == 0)
            return &c->s[i];
    return NULL;
}

void gddr__ckpt_free(gddr_ckpt *c)
{
    if (!c)
        return;
    gddr__ckpt_free_sections(c->s, c->n);
    memset(c, 0, sizeof *c);
}
