/* gddr-bench -- how fast gddr-ps moves and applies tensors, measured next
 * to the ceilings it is built on, in the same run.
 *
 *   gddr-bench                 the full set (a few minutes)
 *   gddr-bench --quick         small sizes and few repetitions (seconds)
 *   gddr-bench --sizes 4K,1M --reps 7 --clients 1,4 --sections pushpull,apply
 *   gddr-bench --server-cpu 1 ...   every server it starts bound to CPU 1
 *
 * Sections (each prints a table for people and one "BENCH ..." line per
 * row for machines):
 *
 *   pushpull   gddr_push + gddr_pull of one tensor through libgddr-client
 *              against a real gddr-ps, beside a bare ZeroMQ ROUTER/DEALER
 *              pair doing the same two round trips (push N bytes, empty
 *              ack; empty request, N bytes back). MB/s = 2 x N x round
 *              trips / time; ratio = gddr / raw.
 *   durability push+pull against gddr-ps with push_log off, batch and always
 *              (server/pushlog.c), interleaved, beside a 64 MiB write +
 *              fdatasync of the same disk
 *   clients    the same at one size with several concurrent clients (each
 *              with its own tensor): aggregate MB/s against raw with as
 *              many DEALERs, and against raw+apply.
 *   gddr       gddr_step (push + pull in the server's mode) with dense
 *              pushes, GDDR alpha 0.4 (alone and with delay_auto) and 8-bit
 *              delta pulls (alone and with pull_delta_auto), five clients
 *              in one thread taking one step each in turn: time per step
 *              and the ratio to dense.
 *   apply      the server's validation (norm and finiteness) and apply of
 *              one dense SGD push of 1 MiB and of a large one, GB/s of
 *              payload with 1, 2 and all threads: the way before (norm on
 *              one thread), now in place, and under copy on write with two
 *              reads and with one (server/push.c) -- beside memcpy of the
 *              same bytes in the same process.
 *   threads    push+pull of a large tensor against gddr-ps started with
 *              threads = 1, 2 and all cores.
 *   servers    one tensor over one server and split over two.
 *   gap        a 1 MiB push after a push, 1 ms idle, a pull (bench_gap.c).
 *   rows       gddr_pull_rows + gddr_push_rows of n random keys x dim
 *              floats (--rows-keys, --rows-dims, --rows-clients), beside
 *              ps-lite's key-value exchange over bare ZeroMQ (bench_rows.c,
 *              this binary run with --kv-server); every run checks the
 *              values it pulls.
 *
 * Every figure is the median of --reps repetitions; the gddr and raw runs
 * of a row alternate inside each repetition, so machine noise hits both.
 * The servers are separate processes (gddr-ps from the folder of this
 * binary; the raw server, bench_raw.c, is this binary run with
 * --raw-server), as in production; on 2 cores client and server compete
 * for them.
 */
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_apply.h"
#include "bench_gap.h"
#include "bench_proc.h"
#include "bench_raw.h"
#include "bench_rows.h"
#include "gddr/gddr.h"
#include "log.h"
#include "numparse.h"

#define MAXV 16

static void start_gddr(bench_proc *p, int threads)
{
    bench_start_shard(p, threads, 0, 1, NULL);
}

/* ---- one measurement: several clients in threads --------------------------------- */

/* K_GDDR: gddr_push + gddr_pull; K_RAW: the bare ZeroMQ round trips. */
typedef enum { K_GDDR, K_RAW } kind;
/* The gddr section's steps (steps_in_turns) are timed after step_warm
 * steps: a training run's steady state (pull_delta_auto's first probes, at
 * about 16, 51 and 119, and delay_auto's, at about 24 and 81, are behind
 * it), and no kind's figure holds its first allocations. */
enum { STEP_WARM = 130 };
static int step_warm = STEP_WARM; /* --warm-steps: a longer run's steady state */

typedef struct worker {
    kind k;
    const char *ep;
    int rank, world, iters;
    size_t n;
    pthread_barrier_t *start;
    double seconds;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    float *g = malloc(w->n * 4), *p = malloc(w->n * 4);
    for (size_t i = 0; i < w->n; i++)
        g[i] = 1e-3f * (float)(i % 97);
    memset(p, 0, w->n * 4);
    gddr_client *c = NULL;
    raw_client r;
    int id = 0;
    if (w->k == K_RAW) {
        raw_connect(&r, w->ep);
        raw_roundtrips(&r, g, p, w->n * 4); /* connect and warm up */
    } else {
        c = bench_connect(w->ep, w->rank, w->world, 0.0, 0, 0);
        char key[32];
        snprintf(key, sizeof key, "bench.%d.%zu", w->rank, w->n);
        if (gddr_register(c, key, p, w->n, &id, NULL) != GDDR_OK)
            bench_die("register: %s", gddr_client_errmsg(c));
        gddr_push(c, id, g, NULL);
        gddr_pull(c, id, p, 0, NULL);
    }
    pthread_barrier_wait(w->start);
    double t0 = bench_now();
    for (int i = 0; i < w->iters; i++) {
        if (w->k == K_RAW) {
            raw_roundtrips(&r, g, p, w->n * 4);
        } else {
            if (gddr_push(c, id, g, NULL) != GDDR_OK || gddr_pull(c, id, p, 0, NULL) != GDDR_OK)
                bench_die("push/pull: %s", gddr_client_errmsg(c));
        }
    }
    w->seconds = bench_now() - t0;
    if (w->k == K_RAW)
        raw_close(&r);
    else
        gddr_client_close(&c);
    free(g);
    free(p);
    return NULL;
}

/* Runs `clients` concurrent clients of kind k, `iters` round trips each;
 * returns the aggregate MB/s (2 x bytes x iterations / the slowest). */
static double run(kind k, const char *ep, int clients, size_t n, int iters)
{
    worker w[64];
    pthread_t th[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)clients);
    for (int i = 0; i < clients; i++) {
        w[i] = (worker){ k, ep, i, clients, iters, n, &start, 0 };
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    double slowest = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        if (w[i].seconds > slowest)
            slowest = w[i].seconds;
    }
    pthread_barrier_destroy(&start);
    return 2.0 * (double)n * 4 * iters * clients / slowest / 1e6;
}

static int iters_for(size_t bytes, double budget_mb)
{
    double it = budget_mb * 1e6 / (2.0 * (double)bytes);
    return it < 3 ? 3 : it > 4000 ? 4000 : (int)it;
}

/* ---- sections ------------------------------------------------------------------------ */

static int reps = 5;
static double budget_mb = 256;

/* gddr-ps against the raw server and the raw server that applies (as),
 * `clients` clients of n floats, `reps` times in turns: the medians of
 * gddr's, raw's and raw+apply's aggregate MB/s and of the three ratios. */
typedef struct three {
    double gddr, raw, apply, ratio, ratio_apply, apply_over_raw;
} three;

static three against_raw(const bench_proc *gs, const bench_proc *rs, const bench_proc *as, int clients, size_t n,
                         int it)
{
    double g[MAXV], r[MAXV], a[MAXV], q[MAXV], qa[MAXV], ar[MAXV];
    char h[32];
    if (!raw_check_apply(as->endpoint, n * 4))
        bench_die("the raw+apply server did not apply a push of %s as it should", bench_human(n * 4, h, sizeof h));
    for (int k = 0; k < reps; k++) {
        g[k] = run(K_GDDR, gs->endpoint, clients, n, it);
        r[k] = run(K_RAW, rs->endpoint, clients, n, it);
        a[k] = run(K_RAW, as->endpoint, clients, n, it);
        q[k] = g[k] / r[k];
        qa[k] = g[k] / a[k];
        ar[k] = a[k] / r[k];
    }
    return (three){ bench_median(g, reps), bench_median(r, reps), bench_median(a, reps),
                    bench_median(q, reps), bench_median(qa, reps), bench_median(ar, reps) };
}

static void bench_line(const char *section, size_t bytes, int clients, const three *t)
{
    fprintf(stderr,
            "BENCH section=%s bytes=%zu clients=%d gddr_mbps=%.1f raw_mbps=%.1f ratio=%.3f raw_apply_mbps=%.1f "
            "ratio_apply=%.3f apply_over_raw=%.3f\n",
            section, bytes, clients, t->gddr, t->raw, t->ratio, t->apply, t->ratio_apply, t->apply_over_raw);
}

static void section_pushpull(const size_t *sizes, int nsizes)
{
    bench_proc gs = { 0 }, rs = { 0 }, as = { 0 };
    start_gddr(&gs, 2);
    bench_start_raw(&rs, 0);
    bench_start_raw(&as, 1);
    printf("\n## push+pull, 1 client (MB/s = 2 x payload x round trips / time; median of %d)\n\n", reps);
    printf("raw+apply: the raw server that also reads each push once for its norm and applies it in "
           "place after the ack (bench_raw.c): the ceiling of any server that keeps the model.\n\n");
    printf("| size | gddr MB/s | raw ZeroMQ MB/s | ratio | raw+apply MB/s | gddr / raw+apply | raw+apply / "
           "raw | gddr us/round trip |\n|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < nsizes; s++) {
        char h[32];
        three t = against_raw(&gs, &rs, &as, 1, sizes[s] / 4, iters_for(sizes[s], budget_mb));
        printf("| %s | %.0f | %.0f | %.2f | %.0f | %.2f | %.2f | %.0f |\n", bench_human(sizes[s], h, sizeof h),
               t.gddr, t.raw, t.ratio, t.apply, t.ratio_apply, t.apply_over_raw, 2.0 * (double)sizes[s] / t.gddr);
        bench_line("pushpull", sizes[s], 1, &t);
        fflush(stdout);
    }
    bench_stop(&gs);
    bench_stop(&rs);
    bench_stop(&as);
}

/* push+pull against gddr-ps with push_log off, batch and always (one
 * server each, checkpoint_dir in a scratch folder, no periodic
 * checkpoints), the three interleaved in every repetition; ratios to off. */
static void section_durability(const size_t *sizes, int nsizes)
{
    static const char *const modes[] = { "off", "batch", "always" };
    char dir[64] = "/tmp/gddr-bench-plog-XXXXXX";
    if (!mkdtemp(dir))
        bench_die("mkdtemp: %s", strerror(errno));
    bench_proc gs[3] = { { 0 } };
    char ck[3][200], pl[3][64];
    for (int m = 0; m < 3; m++) {
        char sub[128];
        snprintf(sub, sizeof sub, "%s/%s", dir, modes[m]);
        mkdir(sub, 0700);
        snprintf(ck[m], sizeof ck[m], "checkpoint_dir=%s", sub);
        snprintf(pl[m], sizeof pl[m], "push_log=%s", modes[m]);
        const char *sets[] = { ck[m], pl[m], "checkpoint_interval_s=0", NULL };
        bench_start_sets(&gs[m], 2, 0, 1, sets);
    }
    double disk = bench_disk_write_sync(dir, (size_t)64 << 20);
    printf("\n## push+pull with the push log (MB/s; median of %d; ratio to push_log = off in the same "
           "repetition)\n\nDisk: 64 MiB written and fdatasync'd in %.0f ms (%.0f MB/s).\n\n",
           reps, disk * 1e3, 64.0 * 1.048576 / disk);
    printf("| size | off MB/s | batch MB/s | always MB/s | batch / off | always / off |\n"
           "|---|---|---|---|---|---|\n");
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s] / 4;
        int it = iters_for(sizes[s], budget_mb);
        double v[3][MAXV], qb[MAXV], qa[MAXV];
        for (int k = 0; k < reps; k++) {
            for (int m = 0; m < 3; m++)
                v[m][k] = run(K_GDDR, gs[m].endpoint, 1, n, it);
            qb[k] = v[1][k] / v[0][k];
            qa[k] = v[2][k] / v[0][k];
        }
        double o = bench_median(v[0], reps), b = bench_median(v[1], reps), a = bench_median(v[2], reps);
        double qbm = bench_median(qb, reps), qam = bench_median(qa, reps);
        char h[32];
        printf("| %s | %.0f | %.0f | %.0f | %.2f | %.2f |\n", bench_human(sizes[s], h, sizeof h), o, b, a, qbm, qam);
        fprintf(stderr, "BENCH section=durability bytes=%zu off_mbps=%.1f batch_mbps=%.1f always_mbps=%.1f "
                "ratio=%.3f always_ratio=%.3f disk_mbps=%.1f\n",
                sizes[s], o, b, a, qbm, qam, 64.0 * 1.048576 / disk);
        fflush(stdout);
    }
    for (int m = 0; m < 3; m++)
        bench_stop(&gs[m]);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "gddr-bench: could not remove %s\n", dir);
}

static void section_clients(const int *clients, int ncl, size_t bytes)
{
    bench_proc gs = { 0 }, rs = { 0 }, as = { 0 };
    char h[32];
    start_gddr(&gs, 2);
    bench_start_raw(&rs, 0);
    /* The raw server that applies (one thread, every client's pushes into
     * one tensor of the same size): what applying costs a server with this
     * many clients on this machine's cores, in the same run. */
    bench_start_raw(&as, 1);
    printf("\n## concurrent clients, %s each (aggregate MB/s; median of %d)\n\n",
           bench_human(bytes, h, sizeof h), reps);
    printf("| clients | gddr MB/s | raw ZeroMQ MB/s | ratio | raw+apply MB/s | gddr / raw+apply | raw+apply / raw "
           "|\n|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < ncl; c++) {
        three t = against_raw(&gs, &rs, &as, clients[c], bytes / 4, iters_for(bytes * (size_t)clients[c], budget_mb));
        printf("| %d | %.0f | %.0f | %.2f | %.0f | %.2f | %.2f |\n", clients[c], t.gddr, t.raw, t.ratio, t.apply,
               t.ratio_apply, t.apply_over_raw);
        bench_line("clients", bytes, clients[c], &t);
        fflush(stdout);
    }
    bench_stop(&gs);
    bench_stop(&rs);
    bench_stop(&as);
}

/* The gddr section's five clients in one thread, one step each in turn
 * (dense, alpha 0.4, alpha 0.4 with delay_auto, 8-bit pulls, 8-bit pulls
 * with pull_delta_auto), each on its own tensor: every kind meets the same
 * moments of this machine's load, where rows timed one after the other
 * differed by up to 24 % between two runs of the same dense client. Each
 * client takes step_warm steps (in turns too) before `iters` timed ones;
 * us[k] is kind k's mean step. */
enum { NSTEPK = 5 };
static void steps_in_turns(const char *ep, size_t n, int iters, double us[NSTEPK])
{
    static const double alpha[NSTEPK] = { 0.0, 0.4, 0.4, 0.0, 0.0 };
    static const int qbits[NSTEPK] = { 0, 0, 0, 8, 8 };
    static const int autos[NSTEPK] = { 0, 0, BENCH_DELAY_AUTO, 0, BENCH_PULL_AUTO };
    gddr_client *c[NSTEPK];
    float *g[NSTEPK], *p[NSTEPK];
    double spent[NSTEPK] = { 0 };
    for (int k = 0; k < NSTEPK; k++) {
        c[k] = bench_connect(ep, k, NSTEPK, alpha[k], qbits[k], autos[k]);
        g[k] = malloc(n * 4);
        p[k] = calloc(n, 4);
        if (!g[k] || !p[k])
            bench_die("%s", "out of memory");
        for (size_t i = 0; i < n; i++)
            g[k][i] = 1e-3f * (float)(i % 97);
        char key[48];
        snprintf(key, sizeof key, "bench.turns.%d.%zu", k, n);
        int id;
        if (gddr_register(c[k], key, p[k], n, &id, NULL) != GDDR_OK)
            bench_die("register: %s", gddr_client_errmsg(c[k]));
    }
    for (int i = 0; i < step_warm + iters; i++) {
        for (int k = 0; k < NSTEPK; k++) {
            const float *gp[1] = { g[k] };
            float *pp[1] = { p[k] };
            double t0 = bench_now();
            if (gddr_step(c[k], gp, pp) != GDDR_OK)
                bench_die("step: %s", gddr_client_errmsg(c[k]));
            if (i >= step_warm)
                spent[k] += bench_now() - t0;
        }
    }
    for (int k = 0; k < NSTEPK; k++) {
        us[k] = spent[k] / iters * 1e6;
        gddr_client_close(&c[k]);
        free(g[k]);
        free(p[k]);
    }
}

static void section_gddr(size_t bytes)
{
    bench_proc gs = { 0 };
    char h[32];
    /* lr > 0 (elsewhere 0): every step moves every value, so delta pulls encode real differences. */
    bench_start_shard(&gs, 2, 0, 1, "lr=0.0001");
    int it = iters_for(bytes, budget_mb);
    double d[MAXV], a[MAXV], q[MAXV], e[MAXV], eq[MAXV], f[MAXV], fq[MAXV], b[MAXV], bq[MAXV];
    for (int k = 0; k < reps; k++) {
        double us[NSTEPK];
        steps_in_turns(gs.endpoint, bytes / 4, it, us);
        d[k] = us[0];
        a[k] = us[1];
        b[k] = us[2];
        e[k] = us[3];
        f[k] = us[4];
        q[k] = a[k] / d[k];
        bq[k] = b[k] / d[k];
        eq[k] = e[k] / d[k];
        fq[k] = f[k] / d[k];
    }
    double dm = bench_median(d, reps), am = bench_median(a, reps), qm = bench_median(q, reps);
    double em = bench_median(e, reps), eqm = bench_median(eq, reps);
    double fm = bench_median(f, reps), fqm = bench_median(fq, reps);
    double bm = bench_median(b, reps), bqm = bench_median(bq, reps);
    printf("\n## gddr_step of %s: dense vs GDDR alpha 0.4 pushes (alone and with delay_auto), vs "
           "8-bit delta pulls, and vs 8-bit delta pulls with pull_delta_auto (us per step: push + "
           "pull; the five clients one step each in turn; median of %d; %d steps timed after %d warm-up "
           "steps)\n\n",
           bench_human(bytes, h, sizeof h), reps, it, step_warm);
    printf("| dense us | alpha 0.4 us | ratio | alpha 0.4, auto us | ratio | dense, q8 pulls us | ratio "
           "| q8, auto us | ratio |\n"
           "|---|---|---|---|---|---|---|---|---|\n"
           "| %.0f | %.0f | %.2f | %.0f | %.2f | %.0f | %.2f | %.0f | %.2f |\n", dm, am, qm, bm, bqm, em,
           eqm, fm, fqm);
    fprintf(stderr, "BENCH section=gddr bytes=%zu dense_us=%.1f alpha04_us=%.1f ratio=%.3f\n", bytes,
            dm, am, qm);
    fprintf(stderr, "BENCH section=gddr_auto bytes=%zu dense_us=%.1f alpha04_auto_us=%.1f ratio=%.3f\n",
            bytes, dm, bm, bqm);
    fprintf(stderr, "BENCH section=gddr_q8 bytes=%zu dense_us=%.1f q8_pulls_us=%.1f ratio=%.3f\n", bytes,
            dm, em, eqm);
    fprintf(stderr, "BENCH section=gddr_q8auto bytes=%zu dense_us=%.1f q8_auto_us=%.1f ratio=%.3f\n", bytes,
            dm, fm, fqm);
    fflush(stdout);
    bench_stop(&gs);
}

/* One model over one server and over two (client/src/shard.c): `clients`
 * clients, each pushing and pulling its own tensor of `bytes` (above the
 * 1 MiB split threshold, so every tensor is split over both servers). On
 * one host the two servers share its cores and loopback; what two hosts
 * would give is computed, not measured: twice the one-server figure, the
 * servers being the bound and each getting a host of its own. */
static void section_servers(size_t bytes, int clients)
{
    bench_proc one = { 0 }, a = { 0 }, b = { 0 };
    char h[32], both[600];
    start_gddr(&one, 2);
    bench_start_shard(&a, 2, 0, 2, NULL);
    bench_start_shard(&b, 2, 1, 2, NULL);
    snprintf(both, sizeof both, "%s,%s", a.endpoint, b.endpoint);
    int it = iters_for(bytes * (size_t)clients, budget_mb);
    double m1[MAXV], m2[MAXV], q[MAXV];
    for (int k = 0; k < reps; k++) {
        m1[k] = run(K_GDDR, one.endpoint, clients, bytes / 4, it);
        m2[k] = run(K_GDDR, both, clients, bytes / 4, it);
        q[k] = m2[k] / m1[k];
    }
    double g1 = bench_median(m1, reps), g2 = bench_median(m2, reps), qm = bench_median(q, reps);
    printf("\n## servers: %d clients, a %s tensor each, push+pull (aggregate MB/s; median of %d)\n\n",
           clients, bench_human(bytes, h, sizeof h), reps);
    printf("| servers | aggregate MB/s | vs 1 server |\n|---|---|---|\n");
    printf("| 1 | %.0f | 1.00 |\n| 2, same host (measured) | %.0f | %.2f |\n", g1, g2, qm);
    printf("| 2, two hosts (computed: 2 x the 1-server figure) | %.0f | 2.00 |\n", 2 * g1);
    fprintf(stderr, "BENCH section=servers bytes=%zu clients=%d one_mbps=%.1f two_mbps=%.1f ratio=%.3f "
                    "two_hosts_computed_mbps=%.1f\n", bytes, clients, g1, g2, qm, 2 * g1);
    fflush(stdout);
    bench_stop(&one);
    bench_stop(&a);
    bench_stop(&b);
}

static void section_threads(size_t bytes)
{
    int threads[3], nth = bench_thread_counts(threads);
    char h[32];
    printf("\n## push+pull of %s against gddr-ps with 1, 2 and all apply threads (MB/s; median of %d)\n\n",
           bench_human(bytes, h, sizeof h), reps);
    printf("| server threads | gddr MB/s |\n|---|---|\n");
    for (int ti = 0; ti < nth; ti++) {
        bench_proc gs = { 0 };
        start_gddr(&gs, threads[ti]);
        double g[MAXV];
        for (int k = 0; k < reps; k++)
            g[k] = run(K_GDDR, gs.endpoint, 1, bytes / 4, iters_for(bytes, budget_mb));
        double gm = bench_median(g, reps);
        printf("| %d | %.0f |\n", threads[ti], gm);
        fprintf(stderr, "BENCH section=threads bytes=%zu server_threads=%d gddr_mbps=%.1f\n", bytes,
                threads[ti], gm);
        bench_stop(&gs);
        fflush(stdout);
    }
}

/* ---- command line ------------------------------------------------------------------- */

/* "64K" -> 65536 (K, M, G: powers of 1024). */
static size_t parse_count(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k')
        v *= 1024;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024;
    else if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024 * 1024;
    return v < 1 ? 1 : (size_t)v;
}

/* A comma-separated list of counts into out (at most max); returns how many. */
static int parse_list(const char *list, size_t *out, int max)
{
    int n = 0;
    for (const char *p = list; p && *p && n < max;) {
        out[n++] = parse_count(p);
        p = strchr(p, ',');
        if (p)
            p++;
    }
    return n;
}

/* A byte size ("1M"), a whole number of floats. */
static size_t parse_size(const char *s)
{
    return parse_count(s) / 4 * 4;
}

static int has(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        if (strncmp(p, name, n) == 0 && (p[n] == 0 || p[n] == ','))
            return 1;
        p = strchr(p, ',');
        if (p)
            p++;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--raw-server") == 0)
        return raw_server(argv[2], 0);
    if (argc == 3 && strcmp(argv[1], "--raw-apply-server") == 0)
        return raw_server(argv[2], 1);
    if (argc == 3 && strcmp(argv[1], "--kv-server") == 0)
        return bench_kv_server(argv[2]);
    bench_proc_init();
    const char *sizes_s = "4K,64K,1M,16M,64M,256M", *clients_s = "4,16";
    const char *sections = "pushpull,durability,clients,gddr,apply,threads,servers,gap,rows";
    const char *rkeys_s = "1K,64K", *rdims_s = "16,64,128", *rclients_s = "1,4";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            sizes_s = "4K,64K,1M";
            clients_s = "4";
            rdims_s = "64";
            reps = 3;
            budget_mb = 32;
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            sizes_s = argv[++i];
        } else if (strcmp(argv[i], "--clients") == 0 && i + 1 < argc) {
            clients_s = argv[++i];
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            long long v;
            if (gddr__arg_int("gddr-bench", "--reps", argv[++i], 1, MAXV, &v) < 0)
                return 2;
            reps = (int)v;
        } else if (strcmp(argv[i], "--rows-keys") == 0 && i + 1 < argc) {
            rkeys_s = argv[++i];
        } else if (strcmp(argv[i], "--rows-dims") == 0 && i + 1 < argc) {
            rdims_s = argv[++i];
        } else if (strcmp(argv[i], "--rows-clients") == 0 && i + 1 < argc) {
            rclients_s = argv[++i];
        } else if (strcmp(argv[i], "--sections") == 0 && i + 1 < argc) {
            sections = argv[++i];
        } else if (strcmp(argv[i], "--server-cpu") == 0 && i + 1 < argc) {
            long long v;
            if (gddr__arg_int("gddr-bench", "--server-cpu", argv[++i], 0, CPU_SETSIZE - 1, &v) < 0)
                return 2;
            bench_server_cpu = (int)v;
        } else if (strcmp(argv[i], "--warm-steps") == 0 && i + 1 < argc) {
            long long v;
            if (gddr__arg_int("gddr-bench", "--warm-steps", argv[++i], 0, 1000000, &v) < 0)
                return 2;
            step_warm = (int)v;
        } else if (strcmp(argv[i], "--log") == 0 && i + 1 < argc) {
            /* The clients' own lines (delay_auto's and pull_delta_auto's
             * changes of kind at info, every probe's outcome at debug). */
            bench_client_log = gddr__log_level_parse(argv[++i]);
            if (bench_client_log < 0) {
                fprintf(stderr, "gddr-bench: --log wants error, warn, info or debug, not '%s'\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--budget-mb") == 0 && i + 1 < argc) {
            if (gddr__arg_num("gddr-bench", "--budget-mb", argv[++i], 1, 1e7, &budget_mb) < 0)
                return 2;
        } else {
            fprintf(stderr, "usage: gddr-bench [--quick] [--sizes 4K,1M,...] [--clients 4,16] [--reps N]\n"
                            "                  [--sections pushpull,durability,clients,gddr,apply,threads,servers,gap,rows]\n"
                            "                  [--budget-mb MB] [--rows-keys 1K,64K] [--rows-dims 16,64,128]\n"
                            "                  [--rows-clients 1,4] [--server-cpu N] [--warm-steps N]\n"
                            "                  [--log error|warn|info|debug]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAXV)
        reps = reps < 1 ? 1 : MAXV;
    size_t sizes[16];
    int nsizes = 0;
    for (const char *p = sizes_s; p && *p && nsizes < 16;) {
        sizes[nsizes++] = parse_size(p);
        p = strchr(p, ',');
        if (p)
            p++;
    }
    int clients[8], ncl = 0;
    for (const char *p = clients_s; p && *p && ncl < 8;) {
        char one[32];
        size_t len = strcspn(p, ",");
        snprintf(one, sizeof one, "%.*s", (int)(len < sizeof one ? len : sizeof one - 1), p);
        long long c;
        if (gddr__arg_int("gddr-bench", "--clients", one, 1, 64, &c) < 0)
            return 2;
        clients[ncl++] = (int)c;
        p = p[len] ? p + len + 1 : NULL;
    }
    signal(SIGPIPE, SIG_IGN);
    printf("# gddr-bench: %ld cores, gddr-ps from %s, %d repetitions per figure\n",
           sysconf(_SC_NPROCESSORS_ONLN), bench_bin_dir, reps);
    size_t one_mib = 1u << 20, big = (size_t)64 << 20;
    if (has(sections, "pushpull"))
        section_pushpull(sizes, nsizes);
    if (has(sections, "durability"))
        section_durability(sizes, nsizes);
    if (has(sections, "clients") && ncl)
        section_clients(clients, ncl, one_mib);
    if (has(sections, "gddr"))
        section_gddr(one_mib);
    if (has(sections, "apply")) {
        bench_apply_section((size_t)1 << 20, reps);
        bench_apply_section(budget_mb < 64 ? (size_t)16 << 20 : big, reps);
    }
    if (has(sections, "threads"))
        section_threads(budget_mb < 64 ? (size_t)16 << 20 : big);
    if (has(sections, "servers"))
        section_servers((size_t)4 << 20, 4);
    if (has(sections, "gap"))
        bench_gap_section(one_mib, reps, budget_mb < 64 ? 60 : 300);
    if (has(sections, "rows")) {
        size_t rk[8], rd[8], rc[8];
        uint32_t dims[8];
        int clis[8];
        bench_rows_cfg rcfg = { rk, parse_list(rkeys_s, rk, 8), dims, parse_list(rdims_s, rd, 8),
                                clis, parse_list(rclients_s, rc, 8), reps, budget_mb };
        for (int i = 0; i < rcfg.ndims; i++)
            dims[i] = (uint32_t)rd[i];
        for (int i = 0; i < rcfg.ncl; i++)
            clis[i] = rc[i] > 64 ? 64 : (int)rc[i];
        bench_rows_section(&rcfg);
    }
    return 0;
}
