/* bench_gap.c -- gddr-bench's "gap" section: what one push costs depending
 * on what its connection did just before, through libgddr-client against
 * gddr-ps and through bare ZeroMQ against the raw server (bench_raw.c), in
 * the same run:
 *
 *   after a push   pushes back to back (the connection never idles)
 *   after 1 ms     each push after 1 ms of sleep (what a worker's compute
 *                  between two steps looks like to the data path)
 *   after a pull   each push right after a pull of the same size (the
 *                  pushpull section's pattern)
 *
 * Each figure is the median time of one push call (its ack included) over
 * the repetition's pushes, then the median over the repetitions. The
 * pushpull section's round trips follow the third row's pattern;
 * docs/performance.md ("A push after an idle connection") says what the
 * rows show. */
#include "bench_gap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_proc.h"
#include "bench_raw.h"
#include "gddr/gddr.h"

#define GAP_CASES 3
#define GAP_MAXREPS 16

static const char *const case_name[GAP_CASES] = { "after a push", "after 1 ms idle", "after a pull" };

static void idle_1ms(void)
{
    struct timespec ts = { 0, 1000000 };
    nanosleep(&ts, NULL);
}

/* What a case drives: libgddr-client against gddr-ps, or the raw client
 * against the raw server, each with the same payload. */
typedef struct gap_target {
    gddr_client *c;
    int id;
    raw_client *r;
    const float *g;
    float *p;
    size_t bytes;
} gap_target;

static void gap_pull(gap_target *x)
{
    if (x->r)
        raw_pull(x->r, x->p, x->bytes);
    else if (gddr_pull(x->c, x->id, x->p, 0, NULL) != GDDR_OK)
        bench_die("gap: pull: %s", gddr_client_errmsg(x->c));
}

static void gap_push(gap_target *x)
{
    if (x->r)
        raw_push(x->r, x->g, x->bytes);
    else if (gddr_push(x->c, x->id, x->g, NULL) != GDDR_OK)
        bench_die("gap: push: %s", gddr_client_errmsg(x->c));
}

/* The median microseconds of one push in case k, over `it` pushes. */
static double gap_case(gap_target *x, int k, int it, double *t)
{
    for (int i = 0; i < it; i++) {
        if (k == 1)
            idle_1ms();
        else if (k == 2)
            gap_pull(x);
        double t0 = bench_now();
        gap_push(x);
        t[i] = (bench_now() - t0) * 1e6;
    }
    return bench_median(t, it);
}

void bench_gap_section(size_t bytes, int reps, int iters)
{
    if (reps > GAP_MAXREPS)
        reps = GAP_MAXREPS;
    bench_proc gs = { 0 }, rs = { 0 };
    bench_start_shard(&gs, 2, 0, 1, NULL);
    bench_start_raw(&rs, 0);
    size_t n = bytes / 4;
    float *g = malloc(bytes), *p = malloc(bytes);
    double *t = malloc((size_t)iters * sizeof *t);
    if (!g || !p || !t)
        bench_die("gap: %s", "no memory");
    for (size_t i = 0; i < n; i++)
        g[i] = 1e-3f * (float)(i % 97);
    memset(p, 0, bytes);

    gddr_client *c = bench_connect(gs.endpoint, 0, 1, 0, 0, 0);
    int id = 0;
    if (gddr_register(c, "bench.gap", p, n, &id, NULL) != GDDR_OK)
        bench_die("gap: register: %s", gddr_client_errmsg(c));
    raw_client r;
    raw_connect(&r, rs.endpoint);
    raw_roundtrips(&r, g, p, bytes); /* connect and warm up */

    gap_target gx = { .c = c, .id = id, .g = g, .p = p, .bytes = bytes };
    gap_target rx = { .r = &r, .g = g, .p = p, .bytes = bytes };
    double gm[GAP_CASES][GAP_MAXREPS], rm[GAP_CASES][GAP_MAXREPS];
    for (int rep = 0; rep < reps; rep++)
        for (int k = 0; k < GAP_CASES; k++) {
            gm[k][rep] = gap_case(&gx, k, iters, t);
            rm[k][rep] = gap_case(&rx, k, iters, t);
        }
    printf("\n## one push of %zu KiB by what came before it (us per push call, ack included; "
           "median of %d pushes, then of %d repetitions)\n\n",
           bytes >> 10, iters, reps);
    printf("| before the push | gddr us | raw ZeroMQ us | gddr - raw us | gddr - raw, less the "
           "first row's |\n|---|---|---|---|---|\n");
    double base = 0;
    for (int k = 0; k < GAP_CASES; k++) {
        double gv = bench_median(gm[k], reps), rv = bench_median(rm[k], reps);
        if (k == 0)
            base = gv - rv;
        printf("| %s | %.0f | %.0f | %.0f | %.0f |\n", case_name[k], gv, rv, gv - rv, gv - rv - base);
        fprintf(stderr, "BENCH section=gap bytes=%zu before=%d gddr_us=%.1f raw_us=%.1f ratio=%.3f\n",
                bytes, k, gv, rv, rv / gv); /* ratio as elsewhere: > 1 when gddr is faster */
    }
    fflush(stdout);
    gddr_client_close(&c);
    raw_close(&r);
    free(g);
    free(p);
    free(t);
    bench_stop(&gs);
    bench_stop(&rs);
}
