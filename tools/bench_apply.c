/* bench_apply.c -- gddr-bench's apply section (see bench_apply.h): the
 * server's validation and apply of one dense SGD push, in this process,
 * through the same pool and jobs gddr-ps uses (server/apply.c), beside
 * memcpy of the same bytes. */
#include "bench_apply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_proc.h"
#include "blas.h"
#include "ps.h"

#define MAXV 16

/* Seconds per run of fn(arg), repeated until 20 ms have passed. */
static double per_run(void (*fn)(void *), void *arg)
{
    int n = 0;
    double t0 = bench_now(), t;
    do {
        fn(arg);
        n++;
    } while ((t = bench_now() - t0) < 0.02);
    return t / n;
}

typedef struct apply_arg {
    ps_pool *pool;
    ps_job job;
    double *sq;
    const float *g;
    float *dst;
    size_t n, bytes;
} apply_arg;

static void run_memcpy(void *p)
{
    apply_arg *a = p;
    memcpy(a->dst, a->g, a->bytes);
}

/* Before: the front thread's norm (one thread), then the apply over the pool. */
static void run_serial_then_apply(void *p)
{
    apply_arg *a = p;
    volatile double x = gddr_nrm2_cpu(a->g, a->n);
    (void)x;
    ps_job j = a->job;
    ps_pool_run(a->pool, &j);
}

/* The norm over the pool, then the apply: in place, or into dst. */
static void pool_then_apply(apply_arg *a, float *dst)
{
    ps_job v = { .t = a->job.t, .vals = a->g };
    volatile double x = ps_payload_norm(a->pool, &v, a->sq);
    (void)x;
    ps_job j = a->job;
    j.dst = dst;
    ps_pool_run(a->pool, &j);
}

/* Now, when no reply holds the tensor's buffer: in place. */
static void run_pool_then_apply(void *p)
{
    pool_then_apply(p, NULL);
}

/* Copy on write (a reply holds the buffer) with two reads: momentum, Adam. */
static void run_pool_then_cow(void *p)
{
    pool_then_apply(p, ((apply_arg *)p)->dst);
}

/* Copy on write, plain SGD now: the norm taken in the read that applies. */
static void run_fused(void *p)
{
    apply_arg *a = p;
    ps_job j = a->job;
    j.sq = a->sq;
    j.dst = a->dst;
    ps_pool_run(a->pool, &j);
    volatile double x = ps_job_norm(&j);
    (void)x;
}

/* The server's validate + apply of one dense SGD push, three ways, against
 * memcpy of the payload (GB/s of payload). */
void bench_apply_section(size_t bytes, int reps)
{
    size_t n = bytes / 4;
    ps_tensor t;
    memset(&t, 0, sizeof t);
    t.n = n;
    t.chunk = 1024;
    t.nchunks = (n + t.chunk - 1) / t.chunk;
    t.w = malloc(bytes);
    float *g = malloc(bytes), *dst = malloc(bytes);
    double *sq = malloc(t.nchunks * sizeof *sq);
    for (size_t i = 0; i < n; i++) {
        t.w[i] = 1.0f;
        g[i] = 1e-3f * (float)(i % 101);
    }
    memcpy(dst, g, bytes);
    int threads[3], nth = bench_thread_counts(threads);
    char h[32];
    printf("\n## validate and apply one push of %s (GB/s of payload; median of %d; memcpy of the same bytes beside)\n\n",
           bench_human(bytes, h, sizeof h), reps);
    printf("| pass | threads | GB/s | memcpy GB/s | ratio |\n|---|---|---|---|---|\n");
    static const struct {
        const char *name, *tag;
        void (*fn)(void *);
    } ways[] = {
        { "norm on one thread, then apply in place (before)", "serial", run_serial_then_apply },
        { "norm over the pool, then apply in place (now)", "pool", run_pool_then_apply },
        { "copy on write: norm over the pool, then apply (momentum, adam)", "pool_cow", run_pool_then_cow },
        { "copy on write: validate while applying (plain sgd)", "fused_cow", run_fused },
    };
    for (int ti = 0; ti < nth; ti++) {
        ps_pool *pool = NULL;
        ps_pool_start(&pool, threads[ti]);
        apply_arg a = { pool, { .kind = PS_JOB_APPLY, .t = &t, .vals = g, .vscale = 1.0f, .scale = 1.0f,
                                .upd = { .kind = PS_OPT_SGD, .lr = 1e-6f } },
                        sq, g, dst, n, bytes };
        for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
            double r[MAXV], m[MAXV], q[MAXV];
            for (int k = 0; k < reps; k++) {
                m[k] = (double)bytes / per_run(run_memcpy, &a) / 1e9;
                r[k] = (double)bytes / per_run(ways[w].fn, &a) / 1e9;
                q[k] = r[k] / m[k];
            }
            double rm = bench_median(r, reps), mm = bench_median(m, reps), qm = bench_median(q, reps);
            printf("| %s | %d | %.2f | %.2f | %.2f |\n", ways[w].name, threads[ti], rm, mm, qm);
            fprintf(stderr, "BENCH section=apply way=%s bytes=%zu threads=%d gbps=%.2f memcpy_gbps=%.2f ratio=%.3f\n",
                    ways[w].tag, bytes, threads[ti], rm, mm, qm);
        }
        ps_pool_stop(&pool);
        fflush(stdout);
    }
    free(t.w);
    free(g);
    free(dst);
    free(sq);
}
