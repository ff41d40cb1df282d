/* check_model.c -- tests of client/train: the IDX loader, the synthetic
 * dataset, shards, and the two models' gradients and training.
 *
 * Gradients are checked against central finite differences; training is
 * checked by what it reaches, not by exit codes. The IDX tests write their
 * own small files (plain and gzip) into a fresh directory under /tmp. The
 * Fashion-MNIST test runs only where the Debian package is installed.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "gddr/gddr.h"
#include "../client/train/model.h"

/* Overridable so that the skip path can be tried where the package is. */
#ifndef FMNIST_DIR
#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#endif

/* ---- helpers -------------------------------------------------------------- */

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Uniform in [-a, a]. */
static float unif(uint64_t *s, float a)
{
    return a * (2.0f * (float)(lcg(s) & 0xffffff) / (float)0xffffff - 1.0f);
}

/* A scratch directory with two file names in it; removed by tmp_done. */
typedef struct {
    char dir[64], img[96], lab[96];
} tmpfiles;

static void tmp_make(tmpfiles *t)
{
    snprintf(t->dir, sizeof t->dir, "/tmp/gddr-check-model-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(t->dir));
    snprintf(t->img, sizeof t->img, "%s/images", t->dir);
    snprintf(t->lab, sizeof t->lab, "%s/labels", t->dir);
}

static void tmp_done(tmpfiles *t)
{
    unlink(t->img);
    unlink(t->lab);
    rmdir(t->dir);
}

static void be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Writes an IDX file: magic, ndims sizes, then len data bytes; gzip when gz. */
static void write_idx(const char *path, int gz, uint32_t magic, const uint32_t *dims, int ndims,
                      const unsigned char *data, size_t len)
{
    unsigned char hdr[16];
    be32(hdr, magic);
    for (int i = 0; i < ndims; i++)
        be32(hdr + 4 * (1 + i), dims[i]);
    size_t hlen = 4 * (size_t)(1 + ndims);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, hdr, (unsigned)hlen), (int)hlen);
        if (len)
            ck_assert_int_eq(gzwrite(f, data, (unsigned)len), (int)len);
        ck_assert_int_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(hdr, 1, hlen, f), hlen);
        if (len)
            ck_assert_uint_eq(fwrite(data, 1, len, f), len);
        ck_assert_int_eq(fclose(f), 0);
    }
}

/* Three 2x2 images with pixels 0, 20, ..., 220 and labels 0, 9, 4. */
static const unsigned char PIX[12] = {0, 20, 40, 60, 80, 100, 120, 140, 160, 180, 200, 220};
static const unsigned char LAB[3] = {0, 9, 4};

static void write_small(const tmpfiles *t, int gz_img, int gz_lab)
{
    uint32_t idims[3] = {3, 2, 2}, ldims[1] = {3};
    write_idx(t->img, gz_img, 0x00000803, idims, 3, PIX, sizeof PIX);
    write_idx(t->lab, gz_lab, 0x00000801, ldims, 1, LAB, sizeof LAB);
}

static void check_small(const gddr_dataset *d)
{
    ck_assert_int_eq(d->n, 3);
    ck_assert_int_eq(d->dim, 4);
    ck_assert_int_eq(d->classes, 10);
    ck_assert_int_eq(d->owns, 1);
    for (int i = 0; i < 12; i++)
        ck_assert_float_eq(d->x[i], (float)PIX[i] / 255.0f);
    ck_assert_float_eq(d->x[11], 220.0f / 255.0f);
    for (int i = 0; i < 3; i++)
        ck_assert_uint_eq(d->y[i], LAB[i]);
}

/* Expects gddr_idx_load to fail with a message naming `path` and saying `what`. */
static void expect_reject(const tmpfiles *t, const char *path, const char *what)
{
    gddr_dataset d;
    char err[256] = "unchanged";
    int rc = gddr_idx_load(t->img, t->lab, &d, err, sizeof err);
    ck_assert_int_ne(rc, GDDR_OK);
    ck_assert_ptr_null(d.x);
    ck_assert_int_eq(d.n, 0);
    ck_assert_msg(strncmp(err, path, strlen(path)) == 0, "err does not start with %s: %s", path,
                  err);
    ck_assert_msg(strstr(err, what) != NULL, "err lacks \"%s\": %s", what, err);
}

/* ---- IDX loader ----------------------------------------------------------- */

START_TEST(test_idx_plain_and_gzip)
{
    /* Every mix of plain and gzip: gzread reads both. */
    for (int mix = 0; mix < 4; mix++) {
        tmpfiles t;
        tmp_make(&t);
        write_small(&t, mix & 1, mix >> 1);
        gddr_dataset d;
        char err[256] = "";
        ck_assert_int_eq(gddr_idx_load(t.img, t.lab, &d, err, sizeof err), GDDR_OK);
        ck_assert_str_eq(err, "");
        check_small(&d);
        gddr_dataset_free(&d);
        ck_assert_ptr_null(d.x);
        tmp_done(&t);
    }
}
END_TEST

START_TEST(test_idx_rejects)
{
    tmpfiles t;
    tmp_make(&t);
    uint32_t idims[3] = {3, 2, 2}, ldims[1] = {3}, l4[1] = {4};
    unsigned char lab4[4] = {0, 1, 2, 3}, bad[3] = {0, 10, 4}, pix13[13] = {0};

    /* Label file where the image file should be, and the other way round. */
    write_small(&t, 1, 0);
    write_idx(t.img, 1, 0x00000801, idims, 1, PIX, sizeof PIX);
    expect_reject(&t, t.img, "bad magic");
    write_small(&t, 0, 1);
    write_idx(t.lab, 1, 0x00000803, idims, 3, LAB, sizeof LAB);
    expect_reject(&t, t.lab, "bad magic");

    /* The header promises 3 images; the file holds 2.5. */
    write_small(&t, 0, 0);
    write_idx(t.img, 0, 0x00000803, idims, 3, PIX, 10);
    expect_reject(&t, t.img, "truncated");
    write_idx(t.img, 1, 0x00000803, idims, 3, PIX, 10);
    expect_reject(&t, t.img, "truncated");

    /* A header cut short. */
    write_idx(t.img, 0, 0x00000803, idims, 1, NULL, 0);
    expect_reject(&t, t.img, "truncated header");

    /* Counts that disagree, a label out of range, trailing bytes, 0 images. */
    write_small(&t, 0, 0);
    write_idx(t.lab, 1, 0x00000801, l4, 1, lab4, sizeof lab4);
    expect_reject(&t, t.lab, "4 labels but 3 images");
    write_small(&t, 0, 0);
    write_idx(t.lab, 0, 0x00000801, ldims, 1, bad, sizeof bad);
    expect_reject(&t, t.lab, "label 10 at index 1");
    write_small(&t, 0, 0);
    write_idx(t.img, 0, 0x00000803, idims, 3, pix13, sizeof pix13);
    expect_reject(&t, t.img, "trailing");
    uint32_t zero[3] = {0, 2, 2};
    write_idx(t.img, 0, 0x00000803, zero, 3, NULL, 0);
    expect_reject(&t, t.img, "bad dims");

    /* A missing file. */
    write_small(&t, 0, 0);
    unlink(t.lab);
    expect_reject(&t, t.lab, "cannot open");
    tmp_done(&t);
}
END_TEST

START_TEST(test_idx_truncated_gzip)
{
    /* Random pixels do not compress, so cutting the .gz file in half cuts
     * the deflate stream itself; cutting 4 bytes leaves every pixel but
     * loses the gzip trailer, which must fail too. */
    tmpfiles t;
    tmp_make(&t);
    enum { N = 40, P = N * 28 * 28 };
    unsigned char *pix = malloc(P), lab[N] = {0};
    uint64_t s = 7;
    for (int i = 0; i < P; i++)
        pix[i] = (unsigned char)lcg(&s);
    uint32_t idims[3] = {N, 28, 28}, ldims[1] = {N};
    write_idx(t.lab, 0, 0x00000801, ldims, 1, lab, N);
    for (int cut = 0; cut < 3; cut++) {
        write_idx(t.img, 1, 0x00000803, idims, 3, pix, P);
        gddr_dataset d;
        char err[256] = "";
        if (cut == 0) {
            ck_assert_int_eq(gddr_idx_load(t.img, t.lab, &d, err, sizeof err), GDDR_OK);
            ck_assert_float_eq(d.x[P - 1], (float)pix[P - 1] / 255.0f);
            gddr_dataset_free(&d);
            continue;
        }
        FILE *f = fopen(t.img, "rb");
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fclose(f);
        ck_assert_int_gt(size, P / 2);
        ck_assert_int_eq(truncate(t.img, cut == 1 ? size / 2 : size - 4), 0);
        expect_reject(&t, t.img, cut == 1 ? "truncated" : "gzip stream");
    }
    free(pix);
    tmp_done(&t);
}
END_TEST

START_TEST(test_fashion_mnist)
{
    if (access(FMNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("SKIP fashion-mnist: package dataset-fashion-mnist not installed\n");
        return;
    }
    gddr_dataset tr, te;
    char err[512] = "";
    int rc = gddr_fashion_mnist_load(FMNIST_DIR, &tr, &te, err, sizeof err);
    ck_assert_msg(rc == GDDR_OK, "load failed: %s", err);
    ck_assert_int_eq(tr.n, 60000);
    ck_assert_int_eq(te.n, 10000);
    ck_assert_int_eq(tr.dim, 784);
    ck_assert_int_eq(te.dim, 784);
    const gddr_dataset *sets[2] = {&tr, &te};
    for (int s = 0; s < 2; s++) {
        int count[10] = {0};
        float lo = 1.0f, hi = 0.0f;
        for (int i = 0; i < sets[s]->n; i++) {
            ck_assert_uint_lt(sets[s]->y[i], 10);
            count[sets[s]->y[i]]++;
        }
        for (size_t i = 0; i < (size_t)sets[s]->n * 784; i++) {
            lo = sets[s]->x[i] < lo ? sets[s]->x[i] : lo;
            hi = sets[s]->x[i] > hi ? sets[s]->x[i] : hi;
        }
        ck_assert_float_eq(lo, 0.0f);
        ck_assert_float_eq(hi, 1.0f);
        for (int c = 0; c < 10; c++)
            ck_assert_int_eq(count[c], s == 0 ? 6000 : 1000);
    }
    gddr_dataset_free(&tr);
    gddr_dataset_free(&te);
}
END_TEST

/* ---- synthetic data and shards -------------------------------------------- */

/* The synthetic set: the same seed gives the same data, another seed other
 * data; values in [0, 1], every class well represented; fewer than two
 * classes give an empty set. */
START_TEST(test_synthetic_seeded_bounded_balanced)
{
    gddr_dataset a, b, c;
    gddr_dataset_synthetic(&a, 500, 7, 3, 11);
    gddr_dataset_synthetic(&b, 500, 7, 3, 11);
    gddr_dataset_synthetic(&c, 500, 7, 3, 12);
    ck_assert_int_eq(a.n, 500);
    ck_assert_int_eq(a.dim, 7);
    ck_assert_int_eq(a.classes, 3);
    ck_assert_mem_eq(a.x, b.x, 500 * 7 * sizeof(float));
    ck_assert_mem_eq(a.y, b.y, 500);
    ck_assert(memcmp(a.x, c.x, 500 * 7 * sizeof(float)) != 0);
    int count[3] = {0};
    for (int i = 0; i < 500; i++) {
        ck_assert_uint_lt(a.y[i], 3);
        count[a.y[i]]++;
        for (int k = 0; k < 7; k++)
            ck_assert(a.x[i * 7 + k] >= 0.0f && a.x[i * 7 + k] <= 1.0f);
    }
    for (int k = 0; k < 3; k++)
        ck_assert_int_gt(count[k], 100);
    gddr_dataset_free(&a);
    gddr_dataset_free(&b);
    gddr_dataset_free(&c);
    gddr_dataset_synthetic(&a, 10, 3, 1, 1);
    ck_assert_int_eq(a.n, 0);
    ck_assert_ptr_null(a.x);
}
END_TEST

START_TEST(test_shard_partitions)
{
    enum { N = 10, D = 3, W = 4 };
    gddr_dataset in, sh[W];
    gddr_dataset_synthetic(&in, N, D, 3, 5);
    int seen[N] = {0}, total = 0;
    const int want_n[W] = {3, 3, 2, 2};
    for (int r = 0; r < W; r++) {
        ck_assert_int_eq(gddr_dataset_shard(&in, r, W, &sh[r]), GDDR_OK);
        ck_assert_int_eq(sh[r].n, want_n[r]);
        ck_assert_int_eq(sh[r].dim, D);
        ck_assert_int_eq(sh[r].classes, 3);
        total += sh[r].n;
        for (int j = 0; j < sh[r].n; j++) {
            int i = r + j * W;
            seen[i]++;
            ck_assert_mem_eq(sh[r].x + j * D, in.x + i * D, D * sizeof(float));
            ck_assert_uint_eq(sh[r].y[j], in.y[i]);
        }
    }
    ck_assert_int_eq(total, N);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(seen[i], 1);
    /* The shards own their rows, so the input may go first. */
    float first = in.x[2 * D];
    gddr_dataset_free(&in);
    ck_assert_float_eq(sh[2].x[0], first);
    gddr_dataset empty;
    gddr_dataset_synthetic(&in, 2, D, 3, 5);
    ck_assert_int_eq(gddr_dataset_shard(&in, 3, W, &empty), GDDR_OK);
    ck_assert_int_eq(empty.n, 0);
    gddr_dataset_free(&empty);
    ck_assert_int_eq(gddr_dataset_shard(&in, W, W, &empty), GDDR_EINVAL);
    ck_assert_int_eq(gddr_dataset_shard(&in, -1, W, &empty), GDDR_EINVAL);
    ck_assert_int_eq(gddr_dataset_shard(&in, 0, 0, &empty), GDDR_EINVAL);
    ck_assert_int_eq(gddr_dataset_shard(NULL, 0, 1, &empty), GDDR_EINVAL);
    gddr_dataset_free(&in);
    for (int r = 0; r < W; r++)
        gddr_dataset_free(&sh[r]);
}
END_TEST

/* ---- models --------------------------------------------------------------- */

START_TEST(test_model_layout)
{
    gddr_model *m = NULL;
    ck_assert_int_eq(gddr_model_create(GDDR_MODEL_MLP, 784, 128, 10, &m), GDDR_OK);
    const char *names[4] = {"mlp.W1", "mlp.b1", "mlp.W2", "mlp.b2"};
    const size_t lens[4] = {784 * 128, 128, 128 * 10, 10};
    ck_assert_int_eq(gddr_model_ntensors(m), 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(gddr_model_tensor_name(m, i), names[i]);
        ck_assert_uint_eq(gddr_model_tensor_len(m, i), lens[i]);
        ck_assert_ptr_nonnull(gddr_model_params(m, i));
        ck_assert_ptr_nonnull(gddr_model_grads(m, i));
    }
    ck_assert_ptr_null(gddr_model_tensor_name(m, 4));
    ck_assert_ptr_null(gddr_model_params(m, -1));
    gddr_model_free(&m);
    ck_assert_ptr_null(m);
    gddr_model_free(&m);

    ck_assert_int_eq(gddr_model_create(GDDR_MODEL_SOFTMAX, 20, 0, 4, &m), GDDR_OK);
    ck_assert_int_eq(gddr_model_ntensors(m), 2);
    ck_assert_str_eq(gddr_model_tensor_name(m, 0), "softmax.W");
    ck_assert_uint_eq(gddr_model_tensor_len(m, 0), 80);
    ck_assert_str_eq(gddr_model_tensor_name(m, 1), "softmax.b");
    ck_assert_uint_eq(gddr_model_tensor_len(m, 1), 4);
    gddr_model_free(&m);

    ck_assert_int_eq(gddr_model_create(GDDR_MODEL_MLP, 5, 0, 3, &m), GDDR_EINVAL);
    ck_assert_int_eq(gddr_model_create(GDDR_MODEL_SOFTMAX, 0, 4, 3, &m), GDDR_EINVAL);
    ck_assert_int_eq(gddr_model_create((gddr_model_kind)7, 5, 4, 3, &m), GDDR_EINVAL);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(test_init_deterministic)
{
    gddr_model *a, *b;
    ck_assert_int_eq(gddr_model_create(GDDR_MODEL_MLP, 30, 16, 5, &a), GDDR_OK);
    ck_assert_int_eq(gddr_model_create(GDDR_MODEL_MLP, 30, 16, 5, &b), GDDR_OK);
    gddr_model_init(a, 99);
    gddr_model_init(b, 99);
    for (int i = 0; i < 4; i++)
        ck_assert_mem_eq(gddr_model_params(a, i), gddr_model_params(b, i),
                         gddr_model_tensor_len(a, i) * sizeof(float));
    gddr_model_init(b, 100);
    ck_assert(memcmp(gddr_model_params(a, 0), gddr_model_params(b, 0), 30 * 16 * 4) != 0);
    /* He-uniform bound sqrt(6/30) for W1, zero biases. */
    float mx = 0.0f;
    for (int i = 0; i < 30 * 16; i++)
        mx = fmaxf(mx, fabsf(gddr_model_params(a, 0)[i]));
    ck_assert(mx <= sqrtf(6.0f / 30.0f) && mx > 0.8f * sqrtf(6.0f / 30.0f));
    for (int i = 0; i < 16; i++)
        ck_assert_float_eq(gddr_model_params(a, 1)[i], 0.0f);
    gddr_model_free(&a);
    gddr_model_free(&b);
}
END_TEST

/* Compares every analytic gradient with (L(p+h) - L(p-h)) / 2h. */
static void grad_check(gddr_model_kind kind)
{
    enum { D = 5, H = 4, C = 3 };
    gddr_dataset ds;
    gddr_dataset_synthetic(&ds, 6, D, C, 3);
    gddr_model *m;
    ck_assert_int_eq(gddr_model_create(kind, D, H, C, &m), GDDR_OK);
    gddr_model_init(m, 1);
    /* Random biases and softmax weights, so that no gradient is trivial. */
    uint64_t s = 17;
    for (int t = 0; t < gddr_model_ntensors(m); t++)
        if (kind == GDDR_MODEL_SOFTMAX || (t & 1))
            for (size_t i = 0; i < gddr_model_tensor_len(m, t); i++)
                gddr_model_params(m, t)[i] = unif(&s, 0.5f);
    /* Index 2 twice: a repeated example must count twice. */
    const int idx[7] = {0, 1, 2, 3, 4, 5, 2};
    double loss = gddr_model_loss_grad(m, &ds, idx, 7);
    ck_assert(isfinite(loss) && loss > 0.0);
    /* Every later call overwrites the gradients, so keep them all first. */
    float *grads[4] = {NULL};
    for (int t = 0; t < gddr_model_ntensors(m); t++) {
        size_t n = gddr_model_tensor_len(m, t);
        grads[t] = malloc(n * sizeof(float));
        memcpy(grads[t], gddr_model_grads(m, t), n * sizeof(float));
    }
    const float eps = 1e-2f;
    double worst = 0.0;
    int checked = 0;
    for (int t = 0; t < gddr_model_ntensors(m); t++) {
        const float *g = grads[t];
        for (size_t i = 0; i < gddr_model_tensor_len(m, t); i++) {
            float *p = gddr_model_params(m, t) + i, keep = *p;
            *p = keep + eps;
            double lp = gddr_model_loss_grad(m, &ds, idx, 7);
            *p = keep - eps;
            double lm = gddr_model_loss_grad(m, &ds, idx, 7);
            *p = keep;
            double num = (lp - lm) / (2.0 * eps);
            double rel = fabs(num - g[i]) / fmax(fmax(fabs(num), fabs(g[i])), 1e-3);
            ck_assert_msg(rel < 1e-2, "%s[%zu]: analytic %g numeric %g (rel %g)",
                          gddr_model_tensor_name(m, t), i, g[i], num, rel);
            worst = fmax(worst, rel);
            checked++;
        }
        free(grads[t]);
    }
    printf("grad check %s: %d params, worst relative error %.2e\n",
           kind == GDDR_MODEL_MLP ? "mlp" : "softmax", checked, worst);
    gddr_model_free(&m);
    gddr_dataset_free(&ds);
}

START_TEST(test_grad_softmax) { grad_check(GDDR_MODEL_SOFTMAX); }
END_TEST

START_TEST(test_grad_mlp) { grad_check(GDDR_MODEL_MLP); }
END_TEST

START_TEST(test_loss_grad_deterministic)
{
    gddr_dataset ds;
    gddr_dataset_synthetic(&ds, 300, 20, 4, 8);
    gddr_model *m;
    ck_assert_int_eq(gddr_model_create(GDDR_MODEL_MLP, 20, 16, 4, &m), GDDR_OK);
    gddr_model_init(m, 4);
    int idx[300];
    for (int i = 0; i < 300; i++)
        idx[i] = i;
    double l1 = gddr_model_loss_grad(m, &ds, idx, 300);
    float g1[20 * 16];
    memcpy(g1, gddr_model_grads(m, 0), sizeof g1);
    /* A smaller batch in between must not leave anything behind. */
    ck_assert(isfinite(gddr_model_loss_grad(m, &ds, idx + 7, 3)));
    double l2 = gddr_model_loss_grad(m, &ds, idx, 300);
    ck_assert(l1 == l2);
    ck_assert_mem_eq(g1, gddr_model_grads(m, 0), sizeof g1);
    /* evaluate sees the same loss and leaves the gradients alone. */
    double mean;
    double acc = gddr_model_evaluate(m, &ds, &mean);
    ck_assert(acc >= 0.0 && acc <= 1.0);
    ck_assert_double_eq_tol(mean, l1, 1e-6 * l1);
    ck_assert_mem_eq(g1, gddr_model_grads(m, 0), sizeof g1);
    /* Bad input gives NAN rather than reading out of bounds. */
    int bad[2] = {0, 300};
    ck_assert(isnan(gddr_model_loss_grad(m, &ds, bad, 2)));
    ck_assert(isnan(gddr_model_loss_grad(m, &ds, idx, 0)));
    ds.dim = 19;
    ck_assert(isnan(gddr_model_loss_grad(m, &ds, idx, 2)));
    ck_assert(isnan(gddr_model_evaluate(m, &ds, &mean)) && isnan(mean));
    ds.dim = 20;
    gddr_model_free(&m);
    gddr_dataset_free(&ds);
}
END_TEST

/* Plain minibatch SGD; returns the accuracy and fills the losses. */
static double train_sgd(gddr_model_kind kind, int steps, float lr, double *loss0, double *loss1)
{
    enum { N = 2000, D = 20, C = 4, B = 32 };
    gddr_dataset ds;
    gddr_dataset_synthetic(&ds, N, D, C, 42);
    gddr_model *m;
    ck_assert_int_eq(gddr_model_create(kind, D, 32, C, &m), GDDR_OK);
    gddr_model_init(m, 1);
    gddr_model_evaluate(m, &ds, loss0);
    uint64_t s = 5;
    int idx[B];
    for (int step = 0; step < steps; step++) {
        for (int b = 0; b < B; b++)
            idx[b] = (int)(lcg(&s) % N);
        ck_assert(isfinite(gddr_model_loss_grad(m, &ds, idx, B)));
        for (int t = 0; t < gddr_model_ntensors(m); t++) {
            float *p = gddr_model_params(m, t), *g = gddr_model_grads(m, t);
            for (size_t i = 0; i < gddr_model_tensor_len(m, t); i++)
                p[i] -= lr * g[i];
        }
    }
    double acc = gddr_model_evaluate(m, &ds, loss1);
    gddr_model_free(&m);
    gddr_dataset_free(&ds);
    return acc;
}

START_TEST(test_softmax_sgd)
{
    double l0, l1;
    double acc = train_sgd(GDDR_MODEL_SOFTMAX, 300, 0.5f, &l0, &l1);
    printf("softmax sgd: loss %.4f -> %.4f, accuracy %.4f\n", l0, l1, acc);
    /* Zero weights predict uniformly: the loss starts at ln 4. */
    ck_assert_double_eq_tol(l0, log(4.0), 1e-6);
    ck_assert(l1 < 0.5 * l0);
    ck_assert(acc > 0.9);
}
END_TEST

START_TEST(test_mlp_sgd)
{
    double l0, l1;
    double acc = train_sgd(GDDR_MODEL_MLP, 300, 0.2f, &l0, &l1);
    printf("mlp sgd: loss %.4f -> %.4f, accuracy %.4f\n", l0, l1, acc);
    ck_assert(l1 < 0.5 * l0);
    ck_assert(acc > 0.9);
}
END_TEST

START_TEST(test_quadratic)
{
    ck_assert_double_eq(gddr_quadratic_loss(5.0), 0.0);
    ck_assert_double_eq(gddr_quadratic_loss(3.0), 2.0);
    ck_assert_double_eq(gddr_quadratic_grad(7.0), 2.0);
    /* Gradient descent with step 0.5 halves the distance to 5 each step. */
    double w = 1.0;
    for (int i = 0; i < 10; i++)
        w -= 0.5 * gddr_quadratic_grad(w);
    ck_assert_double_eq_tol(w, 5.0 - 4.0 / 1024.0, 1e-12);
}
END_TEST

Suite *suite_model(void)
{
    Suite *s = suite_create("model");
    TCase *data = tcase_create("data");
    tcase_set_timeout(data, 60);
    tcase_add_test(data, test_idx_plain_and_gzip);
    tcase_add_test(data, test_idx_rejects);
    tcase_add_test(data, test_idx_truncated_gzip);
    tcase_add_test(data, test_fashion_mnist);
    tcase_add_test(data, test_synthetic_seeded_bounded_balanced);
    tcase_add_test(data, test_shard_partitions);
    suite_add_tcase(s, data);
    TCase *model = tcase_create("model");
    tcase_set_timeout(model, 30);
    tcase_add_test(model, test_model_layout);
    tcase_add_test(model, test_init_deterministic);
    tcase_add_test(model, test_grad_softmax);
    tcase_add_test(model, test_grad_mlp);
    tcase_add_test(model, test_loss_grad_deterministic);
    tcase_add_test(model, test_softmax_sgd);
    tcase_add_test(model, test_mlp_sgd);
    tcase_add_test(model, test_quadratic);
    suite_add_tcase(s, model);
    return s;
}
