/* bench_kernels.c -- how close each kernel of kernels/ comes to memory speed.
 *
 *   build/bin/bench_kernels [-c CHUNK] [SIZE_MI ...]     (default 1 16 64)
 *
 * Every kernel here is memory bound, so the number that matters is the
 * fraction of copy bandwidth it reaches (llm.c dev/cuda style "napkin
 * math"). For each size and kernel the program counts the bytes the kernel
 * must read and write, times it (warm-up first, median of several runs) and
 * prints GB/s next to the ratio against a plain copy that moves the same
 * bytes, measured in the same run: memcpy() for the CPU twin,
 * device-to-device cudaMemcpyAsync for the GPU. Before timing a GPU kernel
 * it checks one run against the CPU twin on the same inputs. Without a
 * usable GPU it runs the CPU part, says why the GPU part is skipped, and
 * exits 0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blas.h"
#include "dc.h"
#include "fused.h"
#include "gddr/gddr.h"
#include "gddr_hash.h"
#include "kcompare.h"
#include "log.h"
#include "replay.h"
#include "residual.h"

#ifdef GDDR_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

enum { OP_RESIDUAL, OP_PACK, OP_UNPACK, OP_DC_DIAG, OP_DC_ADAPTIVE, OP_REPLAY, OP_NRM2, OP_AXPY,
       OP_SUMSQ, OP_FUSED, OP_FUSED_DC, OP_FUSED_DENSE, OP_SCORES, NOPS,
       OP_SUMSQ_FP32 = NOPS, OP_ASUM, OP_ASUM_FP32, NALL };
/* OP_SUMSQ to OP_FUSED_DENSE are the device step's passes (fused.h): pass
 * 1, and pass 2 as a GDDR step without and with clipping + DC-ASGD-a, and
 * as a dense one; OP_SCORES the extra pass of hold_schedule = smallest
 * (residual.h: the chunks' sums of (r + g)^2). The ops from NOPS on have no GPU form: the reductions to
 * float precision the host's checks use, next to the double ones. */
static const char *op_names[NALL] = { "residual_step", "pack", "unpack(acc)", "dc diag",
                                      "dc adaptive", "replay", "nrm2", "axpy",
                                      "sumsq (pass1)", "fused gddr", "fused gddr+dc", "fused dense+dc",
                                      "chunk scores", "sumsq fp32", "asum", "asum fp32" };

/* One set of buffers, on the host or the device. */
typedef struct bufs {
    float *g, *r, *packed, *wn, *wb, *ms, *rem, *dense;
    uint32_t *age;
    uint8_t *bm;
    uint32_t *rank;   /* the fused passes' plan: the initial bitmap's chunks */
    float *ctl;       /* clip factor 0.5, go */
    double *sum;      /* sumsq / L1 output */
    double *score;    /* chunk scores (nc) */
} bufs;

typedef struct shape {
    size_t n, nc, nb;
    uint32_t chunk;
    size_t npacked;   /* floats the bitmap in bm selects (about n/2) */
    size_t nplanned;  /* floats the plan in rank sends */
} shape;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int k)
{
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    return v[k / 2];
}

/* Bytes each kernel must move at least: every input read once, every output
 * written once. Packed traffic depends on how many chunks are selected. */
static double traffic(int op, const shape *s)
{
    const double n = (double)s->n, np = (double)s->npacked, meta = 8.0 * s->nc + s->nb;
    switch (op) {
    case OP_RESIDUAL: return 12 * n + 4 * np + meta;  /* g, r in/out, packed, age, bitmap */
    case OP_PACK: return 8 * np + s->nb;
    case OP_UNPACK: return 12 * np + s->nb;
    case OP_DC_DIAG: return 16 * n;
    case OP_DC_ADAPTIVE: return 24 * n;
    case OP_REPLAY: return 16 * n;
    case OP_NRM2: return 4 * n;
    case OP_SUMSQ:
    case OP_SUMSQ_FP32:
    case OP_ASUM:
    case OP_ASUM_FP32: return 4 * n;
    case OP_FUSED: return 12 * n + 4.0 * s->nplanned + 4.0 * s->nc;      /* g, r in/out, out, rank */
    case OP_FUSED_DC: return 28 * n + 4.0 * s->nplanned + 4.0 * s->nc;   /* + w_new, w_bak, ms in/out */
    case OP_FUSED_DENSE: return 24 * n;                                  /* g, w_new, w_bak, ms, out */
    case OP_SCORES: return 8 * n + 8.0 * s->nc;                          /* g, r; a double a chunk */
    default: return 12 * n;                           /* axpy */
    }
}

static uint64_t bench_step;

/* Pass 2's arguments for a fused op; b holds host or device pointers. */
static void fused_for(int op, const shape *s, const bufs *b, gddr_fused_args *a, gddr_fused_bufs *fb)
{
    gddr_fused_args fa = { s->n, s->chunk, op != OP_FUSED_DENSE, op != OP_FUSED,
                           { s->n, 1e-3f, GDDR_DC_DIAG, 1, 0.95f, 1e-7f, 1.0f } };
    gddr_fused_bufs f = { b->g, b->wn, b->wb, b->ms, b->r, b->rank,
                          op == OP_FUSED_DENSE ? b->dense : b->packed, b->sum, b->ctl };
    *a = fa;
    *fb = f;
}

static int run_cpu(int op, const shape *s, bufs *b)
{
    gddr_residual_args ra = { s->n, s->chunk, 0.5f, 4, 42, 0, gddr_key_hash("bench"),
                              bench_step++, 0, 0, 0, NULL };
    gddr_dc_args da = { s->n, 1e-3f, GDDR_DC_DIAG, op == OP_DC_ADAPTIVE, 0.95f, 1e-7f, 1.0f };
    size_t np, ns;
    switch (op) {
    case OP_RESIDUAL: return gddr_residual_step_cpu(&ra, b->g, b->r, b->age, b->packed, b->bm,
                                                    &np, &ns);
    case OP_PACK: return gddr_pack_cpu(b->g, s->n, s->chunk, b->bm, b->packed, &np);
    case OP_UNPACK: return gddr_unpack_cpu(b->packed, b->bm, s->n, s->chunk, 0.5f, 1, b->dense);
    case OP_DC_DIAG:
    case OP_DC_ADAPTIVE: return gddr_dc_cpu(&da, b->g, b->wn, b->wb, b->ms);
    case OP_REPLAY: return gddr_replay_cpu(b->r, b->rem, s->n, 0.5f, 0);
    case OP_NRM2: {
        volatile double x = gddr_nrm2_cpu(b->g, s->n);
        (void)x;
        return GDDR_OK;
    }
    case OP_SUMSQ: *b->sum = gddr_sumsq_cpu(b->g, s->n); return GDDR_OK;
    case OP_SCORES: return gddr_chunk_scores_cpu(b->g, b->r, s->n, s->chunk, b->score);
    case OP_SUMSQ_FP32: *b->sum = gddr_sumsq_fp32_cpu(b->g, s->n); return GDDR_OK;
    case OP_ASUM: *b->sum = gddr_asum_cpu(b->g, s->n); return GDDR_OK;
    case OP_ASUM_FP32: *b->sum = gddr_asum_fp32_cpu(b->g, s->n); return GDDR_OK;
    case OP_FUSED:
    case OP_FUSED_DC:
    case OP_FUSED_DENSE: {
        gddr_fused_args fa;
        gddr_fused_bufs fb;
        fused_for(op, s, b, &fa, &fb);
        return gddr_fused_cpu(&fa, &fb);
    }
    default: gddr_axpy_cpu(b->dense, b->g, s->n, 0.5f); return GDDR_OK;
    }
}

static float *xalloc_f(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    return p;
}

static void fill(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)(gddr__mix64(seed + i) >> 40) * (1.0f / 16777216.0f);
}

/* Host buffers with fixed contents, and a bitmap that selects about half the
 * chunks (what one residual step at alpha = 0.5 sends). */
static void host_init(const shape *s0, shape *s, bufs *h)
{
    *s = *s0;
    h->g = xalloc_f(s->n), h->r = xalloc_f(s->n), h->packed = xalloc_f(s->n);
    h->wn = xalloc_f(s->n), h->wb = xalloc_f(s->n), h->ms = xalloc_f(s->n);
    h->rem = xalloc_f(s->n), h->dense = xalloc_f(s->n);
    h->age = calloc(s->nc, sizeof *h->age);
    h->bm = malloc(s->nb ? s->nb : 1);
    h->rank = malloc((s->nc ? s->nc : 1) * sizeof *h->rank);
    h->ctl = malloc(2 * sizeof *h->ctl);
    h->sum = malloc(sizeof *h->sum);
    h->score = calloc(s->nc ? s->nc : 1, sizeof *h->score);
    if (!h->age || !h->bm || !h->rank || !h->ctl || !h->sum || !h->score)
        exit(1);
    h->ctl[0] = 0.5f, h->ctl[1] = 1.0f;
    *h->sum = 0.0;
    fill(h->g, s->n, 1, -1, 1), fill(h->r, s->n, 2, -1, 1), fill(h->wn, s->n, 3, -1, 1);
    fill(h->wb, s->n, 4, -1, 1), fill(h->ms, s->n, 5, 0, 1), fill(h->rem, s->n, 6, -1, 1);
    fill(h->dense, s->n, 7, -1, 1), fill(h->packed, s->n, 8, -1, 1);
    for (size_t b = 0; b < s->nb; b++)
        h->bm[b] = (uint8_t)(gddr__mix64(b + 99) >> 13);
    gddr_bitmap_count(h->bm, s->n, s->chunk, NULL, &s->npacked);
    s->nplanned = s->npacked;
    uint32_t sent = 0;
    for (size_t c = 0; c < s->nc; c++)
        h->rank[c] = (h->bm[c >> 3] >> (c & 7)) & 1 ? sent++ : GDDR_HELD;
}

static void host_free(bufs *h)
{
    free(h->g), free(h->r), free(h->packed), free(h->wn), free(h->wb), free(h->ms);
    free(h->rem), free(h->dense), free(h->age), free(h->bm), free(h->rank), free(h->ctl);
    free(h->sum), free(h->score);
}

/* memcpy of half the traffic moves the same bytes (one read, one write). */
static double cpu_memcpy_s(size_t bytes, char *dst, const char *src)
{
    double t[5];
    memcpy(dst, src, bytes);
    for (int k = 0; k < 5; k++) {
        const double t0 = now_s();
        memcpy(dst, src, bytes);
        t[k] = now_s() - t0;
    }
    return median(t, 5);
}

static void bench_cpu(const shape *s0)
{
    shape s;
    bufs h;
    host_init(s0, &s, &h);
    size_t cbytes = (size_t)(traffic(OP_FUSED_DC, &s) / 2);
    char *src = malloc(cbytes), *dst = malloc(cbytes);
    if (!src || !dst)
        exit(1);
    memset(src, 1, cbytes);
    printf("\nCPU  n = %zu floats (%.1f MB), chunk %u, %zu of %zu chunks selected\n", s.n,
           s.n * 4.0 / 1e6, s.chunk, s.npacked / (s.chunk ? s.chunk : 1), s.nc);
    printf("  %-14s %10s %10s %10s %12s\n", "kernel", "ms", "GB/s", "memcpy GB/s", "vs memcpy");
    for (int op = 0; op < NALL; op++) {
        double t[3];
        if (run_cpu(op, &s, &h) != GDDR_OK) {
            printf("  %-14s failed\n", op_names[op]);
            continue;
        }
        for (int k = 0; k < 3; k++) {
            const double t0 = now_s();
            run_cpu(op, &s, &h);
            t[k] = now_s() - t0;
        }
        /* The residual step rewrites the bitmap that pack and unpack use. */
        gddr_bitmap_count(h.bm, s.n, s.chunk, NULL, &s.npacked);
        const double ms = median(t, 3) * 1e3, bytes = traffic(op, &s);
        const double tc = cpu_memcpy_s((size_t)(bytes / 2), dst, src);
        printf("  %-14s %10.3f %10.2f %10.2f %11.0f%%\n", op_names[op], ms, bytes / ms / 1e6,
               bytes / tc / 1e9, 100.0 * tc * 1e3 / ms);
    }
    free(src), free(dst);
    host_free(&h);
}

#ifdef GDDR_HAVE_CUDA

#define CK(call)                                                                              \
    do {                                                                                      \
        int rc_ = (call);                                                                     \
        if (rc_ != GDDR_OK) {                                                                 \
            fprintf(stderr, "bench_kernels: %s failed: %s\n", #call, gddr_strerror(rc_));     \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define CUCK(call) CK((call) == cudaSuccess ? GDDR_OK : GDDR_ECUDA)

static gddr_cuda_ctx *ctx;

static int run_gpu(int op, const shape *s, bufs *d)
{
    void *st = gddr_cuda_ctx_stream(ctx);
    gddr_residual_args ra = { s->n, s->chunk, 0.5f, 4, 42, 0, gddr_key_hash("bench"),
                              bench_step++, 0, 0, 0, NULL };
    gddr_dc_args da = { s->n, 1e-3f, GDDR_DC_DIAG, op == OP_DC_ADAPTIVE, 0.95f, 1e-7f, 1.0f };
    size_t np, ns;
    double nrm;
    switch (op) {
    case OP_RESIDUAL: return gddr_residual_step_cuda(&ra, d->g, d->r, d->age, d->packed, d->bm,
                                                     &np, &ns, st);
    case OP_PACK: return gddr_pack_cuda(d->g, s->n, s->chunk, d->bm, d->packed, &np, st);
    case OP_UNPACK:
        return gddr_unpack_cuda(d->packed, d->bm, s->n, s->chunk, 0.5f, 1, d->dense, st);
    case OP_DC_DIAG:
    case OP_DC_ADAPTIVE: return gddr_dc_cuda(&da, d->g, d->wn, d->wb, d->ms, st);
    case OP_REPLAY: return gddr_replay_cuda(d->r, d->rem, s->n, 0.5f, 0, st);
    case OP_NRM2: return gddr_nrm2_cuda(ctx, d->g, s->n, &nrm);
    case OP_SUMSQ: return gddr_sumsq_cuda(ctx, d->g, s->n, d->sum);
    case OP_SCORES: return gddr_chunk_scores_cuda(d->g, d->r, s->n, s->chunk, d->score, st);
    case OP_FUSED:
    case OP_FUSED_DC:
    case OP_FUSED_DENSE: {
        gddr_fused_args fa;
        gddr_fused_bufs fb;
        fused_for(op, s, d, &fa, &fb);
        return gddr_fused_cuda(ctx, &fa, &fb);
    }
    default: return gddr_axpy_cuda(ctx, d->dense, d->g, s->n, 0.5f);
    }
}

static void *dup_to_dev(const void *h, size_t bytes)
{
    void *d;
    CK(gddr_cuda_malloc(&d, bytes));
    CK(gddr_cuda_memcpy_h2d(d, h, bytes, NULL));
    return d;
}

static void dev_init(const shape *s, const bufs *h, bufs *d)
{
    const size_t fb = s->n * sizeof(float);
    d->g = dup_to_dev(h->g, fb), d->r = dup_to_dev(h->r, fb), d->packed = dup_to_dev(h->packed, fb);
    d->wn = dup_to_dev(h->wn, fb), d->wb = dup_to_dev(h->wb, fb), d->ms = dup_to_dev(h->ms, fb);
    d->rem = dup_to_dev(h->rem, fb), d->dense = dup_to_dev(h->dense, fb);
    d->age = dup_to_dev(h->age, s->nc * sizeof *h->age);
    d->bm = dup_to_dev(h->bm, s->nb ? s->nb : 1);
    d->rank = dup_to_dev(h->rank, (s->nc ? s->nc : 1) * sizeof *h->rank);
    d->ctl = dup_to_dev(h->ctl, 2 * sizeof *h->ctl);
    d->sum = dup_to_dev(h->sum, sizeof *h->sum);
    d->score = dup_to_dev(h->score, (s->nc ? s->nc : 1) * sizeof *h->score);
    CK(gddr_cuda_sync(NULL));
}

static void dev_free(bufs *d)
{
    void *p[] = { d->g, d->r, d->packed, d->wn, d->wb, d->ms, d->rem, d->dense, d->age, d->bm,
                  d->rank, d->ctl, d->sum, d->score };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        CK(gddr_cuda_free(p[i]));
}

/* Runs one GPU call and its CPU twin on identical fresh inputs and compares
 * the output the op writes. Returns the number of mismatches. */
static size_t check_op(int op, const shape *s0)
{
    shape s;
    bufs h, d;
    host_init(s0, &s, &h);
    dev_init(&s, &h, &d);
    const uint64_t step = bench_step;
    CK(run_cpu(op, &s, &h));
    bench_step = step; /* the same mask on both sides */
    CK(run_gpu(op, &s, &d));
    CK(gddr_cuda_sync(gddr_cuda_ctx_stream(ctx)));
    float *got = xalloc_f(s.n);
    size_t bad = 0;
    double err = 0.0;
#define FETCH(field) CK(gddr_cuda_memcpy_d2h(got, d.field, s.n * sizeof(float), NULL))
    switch (op) {
    case OP_RESIDUAL: {
        uint8_t *bm = malloc(s.nb ? s.nb : 1);
        CK(gddr_cuda_memcpy_d2h(bm, d.bm, s.nb, NULL));
        bad += kc_compare_u8("bitmap", bm, h.bm, s.nb);
        free(bm);
        gddr_bitmap_count(h.bm, s.n, s.chunk, NULL, &s.npacked);
        FETCH(r);
        bad += kc_compare_f32("r", got, h.r, s.n, 0, 0, &err);
        FETCH(packed);
        bad += kc_compare_f32("packed", got, h.packed, s.npacked, 0, 0, &err);
        break;
    }
    case OP_PACK:
        FETCH(packed);
        bad += kc_compare_f32("packed", got, h.packed, s.npacked, 0, 0, &err);
        break;
    case OP_UNPACK:
    case OP_AXPY:
        FETCH(dense);
        bad += kc_compare_f32("dense", got, h.dense, s.n, 1e-6, 1e-6, &err);
        break;
    case OP_DC_DIAG:
    case OP_DC_ADAPTIVE:
        FETCH(g);
        bad += kc_compare_f32("g", got, h.g, s.n, 1e-6, 1e-5, &err);
        break;
    case OP_REPLAY:
        FETCH(r);
        bad += kc_compare_f32("r", got, h.r, s.n, 1e-6, 1e-6, &err);
        break;
    case OP_FUSED:
    case OP_FUSED_DC:
        /* Same rounding as the twin: bit for bit; the L1 sum in another order. */
        FETCH(r);
        bad += kc_compare_f32("r", got, h.r, s.n, 0, 0, &err);
        FETCH(packed);
        bad += kc_compare_f32("packed", got, h.packed, s.nplanned, 0, 0, &err);
        /* fall through */
    case OP_SUMSQ: {
        /* Both sides sum n non-negative doubles, in different orders (the
         * twin in 16 lanes, the GPU per thread and then in a tree): each is
         * within gamma_n = n u / (1 - n u) of the exact sum (u = 2^-53), so
         * they differ by at most 2 gamma_n of it. A fixed 1e-12 failed at
         * 67M floats on an H200. */
        double g = 0.0;
        CK(gddr_cuda_memcpy_d2h(&g, d.sum, sizeof g, NULL));
        CK(gddr_cuda_sync(NULL));
        const double u = 0x1p-53, nu = (double)s.n * u, gamma = nu / (1.0 - nu);
        if (!(fabs(g - *h.sum) <= 2.0 * gamma * fabs(*h.sum))) {
            fprintf(stderr, "%s: the GPU's sum %.17g, the twin's %.17g: relative difference %.3g, bound %.3g\n",
                    op_names[op], g, *h.sum, fabs(g - *h.sum) / fabs(*h.sum), 2.0 * gamma);
            bad++;
        }
        break;
    }
    case OP_FUSED_DENSE:
        FETCH(dense);
        bad += kc_compare_f32("dense", got, h.dense, s.n, 0, 0, &err);
        break;
    case OP_SCORES: { /* the same lane order: bit for bit */
        const size_t nc = s.nc ? s.nc : 1;
        double *sc = malloc(nc * sizeof *sc);
        if (!sc)
            exit(1);
        CK(gddr_cuda_memcpy_d2h(sc, d.score, nc * sizeof *sc, NULL));
        CK(gddr_cuda_sync(NULL));
        for (size_t c = 0; c < s.nc; c++)
            bad += memcmp(&sc[c], &h.score[c], sizeof *sc) != 0;
        free(sc);
        break;
    }
    default: {
        double g = 0.0;
        CK(gddr_nrm2_cuda(ctx, d.g, s.n, &g));
        const double want = gddr_nrm2_cpu(h.g, s.n);
        err = g > want ? g - want : want - g;
        bad += err > 1e-5 * want;
    }
    }
#undef FETCH
    CK(gddr_cuda_sync(NULL));
    free(got);
    dev_free(&d);
    host_free(&h);
    return bad;
}

static double gpu_time_ms(int op, const shape *s, bufs *d, cudaEvent_t e0, cudaEvent_t e1,
                          void *copy_dst, const void *copy_src, size_t copy_bytes)
{
    enum { WARM = 3, RUNS = 15 };
    cudaStream_t st = (cudaStream_t)gddr_cuda_ctx_stream(ctx);
    double t[RUNS];
    for (int k = 0; k < WARM + RUNS; k++) {
        CUCK(cudaEventRecord(e0, st));
        if (op >= 0)
            CK(run_gpu(op, s, d));
        else
            CUCK(cudaMemcpyAsync(copy_dst, copy_src, copy_bytes, cudaMemcpyDeviceToDevice, st));
        CUCK(cudaEventRecord(e1, st));
        CUCK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CUCK(cudaEventElapsedTime(&ms, e0, e1));
        if (k >= WARM)
            t[k - WARM] = ms;
    }
    return median(t, RUNS);
}

static void bench_gpu(const shape *s0)
{
    shape s;
    bufs h, d;
    host_init(s0, &s, &h);
    dev_init(&s, &h, &d);
    const size_t cbytes = (size_t)(traffic(OP_FUSED_DC, &s) / 2);
    void *csrc, *cdst;
    CK(gddr_cuda_malloc(&csrc, cbytes));
    CK(gddr_cuda_malloc(&cdst, cbytes));
    cudaEvent_t e0, e1;
    CUCK(cudaEventCreate(&e0));
    CUCK(cudaEventCreate(&e1));
    printf("\nGPU  n = %zu floats (%.1f MB), chunk %u\n", s.n, s.n * 4.0 / 1e6, s.chunk);
    printf("  %-14s %6s %10s %10s %12s %10s\n", "kernel", "check", "ms", "GB/s", "memcpy GB/s",
           "vs memcpy");
    for (int op = 0; op < NOPS; op++) {
        const size_t bad = check_op(op, &s);
        const double ms = gpu_time_ms(op, &s, &d, e0, e1, NULL, NULL, 0);
        CK(gddr_cuda_memcpy_d2h(h.bm, d.bm, s.nb, NULL));
        gddr_bitmap_count(h.bm, s.n, s.chunk, NULL, &s.npacked);
        const double bytes = traffic(op, &s);
        const double mc = gpu_time_ms(-1, &s, &d, e0, e1, cdst, csrc, (size_t)(bytes / 2));
        printf("  %-14s %6s %10.4f %10.1f %12.1f %9.0f%%\n", op_names[op], bad ? "FAIL" : "ok",
               ms, bytes / ms / 1e6, bytes / mc / 1e6, 100.0 * mc / ms);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    CK(gddr_cuda_free(csrc));
    CK(gddr_cuda_free(cdst));
    dev_free(&d);
    host_free(&h);
}
#endif /* GDDR_HAVE_CUDA */

int main(int argc, char **argv)
{
    gddr__log_to_stderr("bench_kernels", GDDR_LOG_WARN);
    uint32_t chunk = 1024;
    size_t sizes[16];
    int nsizes = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            chunk = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (nsizes < 16 && atof(argv[i]) > 0) {
            sizes[nsizes++] = (size_t)(atof(argv[i]) * 1048576.0);
        } else {
            fprintf(stderr, "usage: %s [-c CHUNK] [SIZE_MI ...]\n", argv[0]);
            return 2;
        }
    }
    if (chunk == 0)
        chunk = 1024;
    if (nsizes == 0) {
        sizes[0] = 1u << 20, sizes[1] = 16u << 20, sizes[2] = 64u << 20;
        nsizes = 3;
    }
    printf("bench_kernels: GB/s counts the bytes each kernel must read and write; "
           "\"vs memcpy\" is a copy moving the same bytes, timed in this run.\n");
    for (int i = 0; i < nsizes; i++) {
        const shape s = { sizes[i], gddr_nchunks(sizes[i], chunk),
                          gddr_bitmap_bytes(gddr_nchunks(sizes[i], chunk)), chunk, 0, 0 };
        bench_cpu(&s);
    }

    char why[256];
    if (!gddr_cuda_available(why, sizeof why)) {
        printf("\nGPU: skipped: %s\n", why);
        return 0;
    }
#ifdef GDDR_HAVE_CUDA
    CK(gddr_cuda_ctx_create(&ctx));
    for (int i = 0; i < nsizes; i++) {
        const shape s = { sizes[i], gddr_nchunks(sizes[i], chunk),
                          gddr_bitmap_bytes(gddr_nchunks(sizes[i], chunk)), chunk, 0, 0 };
        bench_gpu(&s);
    }
    gddr_cuda_ctx_destroy(&ctx);
#endif
    return 0;
}
