/* bench_table.c -- the sparse table engine at the size of issue 19's target:
 * 10M rows of 64 floats (sgd, always admitted), its resident memory per row
 * against ps_table_row_bytes, and pulls of 64k random existing keys against
 * a plain memcpy of the same bytes, and sgd steps of those rows; and what a
 * checkpoint's copy of the table costs the front thread (server/
 * table_persist.c: a fresh malloc and one memcpy per array). Not run by
 * make check.
 *
 *   build/bin/bench_table [rows [dim [sgd|adagrad|adam]]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "table.h"

#define BATCH 65536
#define REPS 5

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long rss_bytes(void)
{
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &res) != 2)
        res = 0;
    if (f)
        fclose(f);
    return res * sysconf(_SC_PAGESIZE);
}

static uint64_t key_of(uint64_t i)
{
    return gddr_splitmix64(i ^ 0x5eed);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    uint64_t rows = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000000;
    uint32_t dim = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 64;
    const char *opt = argc > 3 ? argv[3] : "sgd";
    ps_table_conf c = { .dim = dim, .init = PS_TINIT_UNIFORM, .init_scale = 0.01f,
                        .init_seed = 1, .admit = PS_TADMIT_ALWAYS, .opt = PS_TOPT_SGD,
                        .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f };
    c.opt = strcmp(opt, "adam") == 0 ? PS_TOPT_ADAM : strcmp(opt, "adagrad") == 0 ? PS_TOPT_ADAGRAD
                                                                                   : PS_TOPT_SGD;
    char why[128];
    if (ps_table_conf_check(&c, why, sizeof why) < 0) {
        fprintf(stderr, "bench_table: %s\n", why);
        return 2;
    }
    uint64_t *keys = malloc(BATCH * sizeof *keys);
    float *out = malloc((size_t)BATCH * dim * sizeof *out);
    float *src = malloc((size_t)BATCH * dim * sizeof *src);
    if (!keys || !out || !src)
        return 1;
    memset(out, 0, (size_t)BATCH * dim * sizeof *out);
    /* Normal floats: the copy is the steps' gradient (denormals would time
     * the FPU's slow path). */
    for (size_t i = 0; i < (size_t)BATCH * dim; i++)
        src[i] = 1e-3f * (float)(i % 7);
    long rss0 = rss_bytes();
    ps_table *t;
    if (ps_table_new(&c, NULL, 0, &t) < 0)
        return 1;
    double t0 = now();
    for (uint64_t i = 0; i < rows; i += BATCH) {
        size_t n = rows - i < BATCH ? rows - i : BATCH;
        for (size_t j = 0; j < n; j++)
            keys[j] = key_of(i + j);
        if (ps_table_pull(t, keys, n, 1, out, NULL) < 0) {
            fprintf(stderr, "bench_table: no memory at %llu rows\n", (unsigned long long)i);
            return 1;
        }
    }
    double fill = now() - t0;
    long rss = rss_bytes() - rss0;
    size_t rb = ps_table_row_bytes(&c);
    printf("fill: %llu rows x %u floats in %.2f s (%.2f M rows/s)\n", (unsigned long long)rows,
           dim, fill, rows / fill / 1e6);
    printf("memory: resident %.1f bytes/row, allocated %.1f bytes/row, row_bytes %zu "
           "(resident/row_bytes %.3f)\n",
           (double)rss / rows, (double)ps_table_bytes(t) / rows, rb, (double)rss / rows / rb);

    double tp[REPS], tm[REPS], ta[REPS];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int rep = 0; rep < REPS; rep++) {
        for (size_t j = 0; j < BATCH; j++) {
            r = gddr_splitmix64(r);
            keys[j] = key_of((r >> 11) % rows);
        }
        size_t made = 0;
        double a = now();
        ps_table_pull(t, keys, BATCH, 1, out, &made);
        tp[rep] = now() - a;
        if (made) {
            fprintf(stderr, "bench_table: a pull created %zu rows\n", made);
            return 1;
        }
        a = now();
        memcpy(out, src, (size_t)BATCH * dim * sizeof *out);
        tm[rep] = now() - a;
        /* An sgd step of the same rows (out as the gradient). */
        a = now();
        if (ps_table_apply(t, keys, BATCH, out, 1.0f, 0.1f) != BATCH)
            return 1;
        ta[rep] = now() - a;
        /* keep the copy */
        if (out[rep] == 12345.0f)
            printf(".");
    }
    qsort(tp, REPS, sizeof *tp, cmp);
    qsort(tm, REPS, sizeof *tm, cmp);
    qsort(ta, REPS, sizeof *ta, cmp);
    printf("pull: %d random existing keys: %.2f M rows/s (median of %d; %.2f ms), "
           "memcpy of the same %zu bytes %.2f ms: pull/memcpy time %.1fx\n",
           BATCH, BATCH / tp[REPS / 2] / 1e6, REPS, tp[REPS / 2] * 1e3,
           (size_t)BATCH * dim * sizeof(float), tm[REPS / 2] * 1e3, tp[REPS / 2] / tm[REPS / 2]);
    printf("apply (%s): the same keys: %.2f M rows/s (median of %d)\n", opt,
           BATCH / ta[REPS / 2] / 1e6, REPS);
    /* A checkpoint's copy, as table_persist.c takes it on the front thread:
     * a fresh buffer (first touch of every page included) and one memcpy
     * per array. */
    ps_table_view v;
    ps_table_view_get(t, &v);
    size_t vals = (size_t)v.rows * v.dim * 4, bytes = v.rows * 16 + v.rows * 4 + vals * (1 + v.nstate);
    double tc[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        double a = now();
        char *buf = malloc(bytes), *p = buf;
        if (!buf)
            return 1;
        memcpy(p, v.meta, v.rows * 16), p += v.rows * 16;
        memcpy(p, v.steps, v.rows * 4), p += v.rows * 4;
        memcpy(p, v.w, vals), p += vals;
        if (v.nstate)
            memcpy(p, v.s, vals * v.nstate);
        tc[rep] = now() - a;
        if (buf[bytes / 2] == 42)
            printf(".");
        free(buf);
    }
    qsort(tc, REPS, sizeof *tc, cmp);
    printf("checkpoint copy (%s): %llu rows, %.1f MiB in %.1f ms (median of %d; %.2f GB/s)\n", opt,
           (unsigned long long)v.rows, bytes / 1048576.0, tc[REPS / 2] * 1e3, REPS,
           bytes / tc[REPS / 2] / 1e9);
    /* An incremental one after a tenth of the rows were stepped: every
     * row's key, touch and step count, the dirty bits, the changed rows. */
    ps_table_dirty_clear(t);
    for (uint64_t i = 0; i < rows / 10; i += BATCH) {
        size_t n = rows / 10 - i < BATCH ? rows / 10 - i : BATCH;
        for (size_t j = 0; j < n; j++)
            keys[j] = key_of(i + j); /* distinct keys: a tenth of the rows */
        if (ps_table_apply(t, keys, n, src, 1.0f, 0.1f) < 0)
            return 1;
    }
    ps_table_view_get(t, &v);
    uint64_t nd = ps_table_dirty_count(t), words = (v.rows + 63) / 64;
    size_t row = (size_t)v.dim * 4, dbytes = v.rows * 20 + words * 8 + nd * row * (1 + v.nstate);
    for (int rep = 0; rep < REPS; rep++) {
        double a = now();
        char *buf = malloc(dbytes), *p = buf;
        if (!buf)
            return 1;
        memcpy(p, v.meta, v.rows * 16), p += v.rows * 16;
        memcpy(p, v.steps, v.rows * 4), p += v.rows * 4;
        memcpy(p, v.dirty, words * 8), p += words * 8;
        for (uint64_t k = 0; k < v.rows; k++)
            if (v.dirty[k >> 6] >> (k & 63) & 1)
                memcpy(p, v.w + k * v.dim, row), p += row;
        for (uint64_t k = 0; v.nstate && k < v.rows; k++)
            if (v.dirty[k >> 6] >> (k & 63) & 1)
                memcpy(p, v.s + k * v.dim * v.nstate, row * v.nstate), p += row * v.nstate;
        tc[rep] = now() - a;
        if (buf[dbytes / 2] == 42)
            printf(".");
        free(buf);
    }
    qsort(tc, REPS, sizeof *tc, cmp);
    printf("incremental copy (%s): %llu of %llu rows changed, %.1f MiB in %.1f ms (median of %d)\n", opt,
           (unsigned long long)nd, (unsigned long long)v.rows, dbytes / 1048576.0, tc[REPS / 2] * 1e3,
           REPS);
    ps_table_free(t);
    free(keys);
    free(out);
    free(src);
    return 0;
}
