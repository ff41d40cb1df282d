/* check_shard.c -- one model over several gddr-ps (client/src/shard.c).
 *
 * What must hold: a sync run over three servers gives bit for bit the
 * parameters of the same run over one (placement, per-piece masks and
 * versions change nothing); placement is stable (adding a server moves
 * only the keys it wins) and splits large tensors into whole chunks; the
 * calls a trainer uses (register, push, pull, tickets, stats, metrics,
 * checkpoints) work across shards; and a shard killed with SIGKILL and
 * restarted from its checkpoint costs only its own updates since that
 * checkpoint while the run completes.
 */
#define _GNU_SOURCE
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../client/src/shard.h" /* gddr__shard_placement, gddr__metrics_merge */
#include "files.h"
#include "gddr/gddr.h"
#include "harness.h"
#include "suites.h"

#define WAIT_MS 60000

/* ---- placement ------------------------------------------------------------------- */

START_TEST(test_placement)
{
    size_t off[8], len[8];
    int sh[8], moved = 0, wrong = 0;
    /* Whole tensors: adding a fourth server moves only keys it wins. */
    for (int k = 0; k < 1000; k++) {
        char key[32];
        snprintf(key, sizeof key, "layer%d.weight", k);
        ck_assert_int_eq(gddr__shard_placement(key, 1000, 1024, 3, off, len, sh), 1);
        int s3 = sh[0];
        ck_assert_int_eq(gddr__shard_placement(key, 1000, 1024, 4, off, len, sh), 1);
        if (sh[0] != s3) {
            moved++;
            wrong += sh[0] != 3;
        }
        ck_assert(off[0] == 0 && len[0] == 1000);
    }
    ck_assert_msg(wrong == 0, "%d keys moved between old servers", wrong);
    ck_assert_msg(moved > 150 && moved < 350, "%d of 1000 keys moved to the new server (expected ~250)",
                  moved);
    /* Split: runs of whole chunks, in order, covering the tensor. */
    size_t n = 1000000 + 17;
    int np = gddr__shard_placement("big", n, 1024, 3, off, len, sh);
    ck_assert_int_eq(np, 3);
    size_t at = 0;
    for (int k = 0; k < np; k++) {
        ck_assert_int_eq(sh[k], k);
        ck_assert_uint_eq(off[k], at);
        ck_assert_uint_eq(off[k] % 1024, 0);
        at += len[k];
    }
    ck_assert_uint_eq(at, n);
    printf("shard: placement: %d of 1000 keys moved to a 4th server, none between the others\n", moved);
}
END_TEST

START_TEST(test_metrics_merge)
{
    const char *a = "# HELP x_total X.\n# TYPE x_total counter\nx_total 3\ny{t=\"w\"} 1\n";
    const char *b = "# HELP x_total X.\n# TYPE x_total counter\nx_total 4\ny{t=\"w\"} 2\n";
    const char *in[2] = { a, b };
    char *m = gddr__metrics_merge(in, 2);
    ck_assert_str_eq(m, "# HELP x_total X.\n# TYPE x_total counter\nx_total{shard=\"0\"} 3\n"
                        "y{shard=\"0\",t=\"w\"} 1\nx_total{shard=\"1\"} 4\ny{shard=\"1\",t=\"w\"} 2\n");
    free(m);
}
END_TEST

/* ---- sync over three servers == over one ----------------------------------------- */

enum { SW = 2, SSTEPS = 8 };
static const size_t SN[3] = { 100, 200000, 600001 }; /* whole, whole (800 KB), split (2.4 MB) */

typedef struct srun {
    const char *ep;
    int rank;
    float *out[3];
    pthread_barrier_t *seen;
    char err[300];
} srun;

static void *sync_worker(void *arg)
{
    srun *a = arg;
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = a->ep;
    o.rank = a->rank;
    o.world_size = SW;
    o.timeout_ms = 30000;
    o.delay_fraction = 0.4; /* the hold mask must not change with sharding */
    o.dc_lambda = 0.1;      /* nor DC-ASGD (elementwise, per piece) */
    gddr_client *c = NULL;
    float *w[3], *g[3];
    int id[3];
    if (gddr_client_open(&o, &c) != GDDR_OK) {
        snprintf(a->err, sizeof a->err, "rank %d: cannot open %s", a->rank, a->ep);
        pthread_barrier_wait(a->seen);
        pthread_barrier_wait(a->seen);
        return NULL;
    }
    for (int k = 0; k < 3; k++) {
        w[k] = malloc(SN[k] * 4);
        g[k] = malloc(SN[k] * 4);
        for (size_t i = 0; i < SN[k]; i++)
            w[k][i] = (float)((i * 31 + (size_t)k) % 97) * 0.01f;
        char key[16];
        snprintf(key, sizeof key, "t%d", k);
        if (gddr_register(c, key, w[k], SN[k], &id[k], NULL) != GDDR_OK || id[k] != k) {
            snprintf(a->err, sizeof a->err, "rank %d: register %s: %s", a->rank, key,
                     gddr_client_errmsg(c));
            goto out;
        }
    }
    for (int s = 0; s < SSTEPS; s++) {
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < SN[k]; i++)
                g[k][i] = (float)((i * 7 + (size_t)s * 13 + (size_t)a->rank * 5) % 23) * 0.05f - 0.5f;
        const float *gp[3] = { g[0], g[1], g[2] };
        float *wp[3] = { w[0], w[1], w[2] };
        if (gddr_step(c, gp, wp) != GDDR_OK) {
            snprintf(a->err, sizeof a->err, "rank %d step %d: %s", a->rank, s, gddr_client_errmsg(c));
            goto out;
        }
    }
    for (int k = 0; k < 3; k++)
        memcpy(a->out[k], w[k], SN[k] * 4);
out:
    /* Held until the main thread has read the servers: what they hold
     * after the same steps is compared, not the order closing workers
     * flush their residuals in. */
    pthread_barrier_wait(a->seen);
    pthread_barrier_wait(a->seen);
    for (int k = 0; k < 3; k++)
        free(w[k]), free(g[k]);
    gddr_client_counters kk;
    gddr_client_counters_get(c, &kk);
    if (!a->err[0] && kk.steps != SSTEPS)
        snprintf(a->err, sizeof a->err, "rank %d: %" PRIu64 " steps counted", a->rank, kk.steps);
    gddr_client_close(&c);
    return NULL;
}

/* Values and version of tensor key (n floats) on one server. */
static uint64_t observe_one(const char *ep, const char *key, size_t n, float *out)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.observer = 1;
    o.timeout_ms = 30000;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float *zero = calloc(n, 4);
    int id;
    uint64_t v = 0;
    ck_assert_int_eq(gddr_register(c, key, zero, n, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull(c, id, out, 0, &v), GDDR_OK);
    free(zero);
    gddr_client_close(&c);
    return v;
}

/* The server side of a run, as an observer sees it (versions and values). */
static void observe_all(const char *ep, float *out[3], uint64_t ver[3])
{
    for (int k = 0; k < 3; k++) {
        char key[16];
        snprintf(key, sizeof key, "t%d", k);
        ver[k] = observe_one(ep, key, SN[k], out[k]);
    }
}

static void run_sync(const char *ep, float *out[SW][3], float *srv[3], uint64_t ver[3])
{
    pthread_t th[SW];
    srun a[SW];
    pthread_barrier_t seen;
    pthread_barrier_init(&seen, NULL, SW + 1);
    for (int r = 0; r < SW; r++) {
        a[r] = (srun){ ep, r, { out[r][0], out[r][1], out[r][2] }, &seen, "" };
        ck_assert_int_eq(pthread_create(&th[r], NULL, sync_worker, &a[r]), 0);
    }
    pthread_barrier_wait(&seen);
    int ok = 1;
    for (int r = 0; r < SW; r++)
        ok &= !a[r].err[0];
    if (ok)
        observe_all(ep, srv, ver);
    pthread_barrier_wait(&seen);
    for (int r = 0; r < SW; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&seen);
    for (int r = 0; r < SW; r++)
        ck_assert_msg(!a[r].err[0], "%s: %s", ep, a[r].err);
}

static float *fvec(size_t n)
{
    float *v = calloc(n, 4);
    ck_assert_ptr_nonnull(v);
    return v;
}

START_TEST(test_sync_three_equals_one)
{
    gt_server one, s3[3];
#define SYNC_SETS "mode=sync", "workers=2", "lr=0.5", "chunk=256", "tau_dynamic=false"
    START_SERVER(one, SYNC_SETS);
    char list[1600] = "";
    for (int s = 0; s < 3; s++) {
        char idx[32], cnt[32] = "shard_count=3";
        snprintf(idx, sizeof idx, "shard_index=%d", s);
        START_SERVER(s3[s], SYNC_SETS, idx, cnt);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", s ? ", " : "", s3[s].endpoint);
    }
    float *wa[SW][3], *wb[SW][3], *sa[3], *sb[3];
    uint64_t va[3], vb[3];
    for (int k = 0; k < 3; k++) {
        sa[k] = fvec(SN[k]), sb[k] = fvec(SN[k]);
        for (int r = 0; r < SW; r++)
            wa[r][k] = fvec(SN[k]), wb[r][k] = fvec(SN[k]);
    }
    run_sync(one.endpoint, wa, sa, va);
    run_sync(list, wb, sb, vb);
    for (int k = 0; k < 3; k++) {
        char what[64];
        snprintf(what, sizeof what, "server values of t%d", k);
        assert_same_floats(sb[k], sa[k], SN[k], what);
        ck_assert_uint_eq(va[k], SSTEPS);
        ck_assert_uint_eq(vb[k], SSTEPS);
        for (int r = 0; r < SW; r++) {
            snprintf(what, sizeof what, "rank %d's values of t%d", r, k);
            assert_same_floats(wb[r][k], wa[r][k], SN[k], what);
        }
    }
    /* The pieces really were spread: each server holds part of the model. */
    for (int s = 0; s < 3; s++) {
        gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
        o.server = s3[s].endpoint;
        o.observer = 1;
        gddr_client *c = NULL;
        ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
        double pushes = gt_server_metric(c, "gddr_pushes_total");
        ck_assert_msg(pushes >= SW * SSTEPS, "server %d took %g pushes", s, pushes);
        gddr_client_close(&c);
    }
    printf("shard: %d sync steps of 2 workers (GDDR 0.4, DC 0.1) over 3 servers: bit-identical to 1 server\n",
           SSTEPS);
    for (int k = 0; k < 3; k++) {
        free(sa[k]), free(sb[k]);
        for (int r = 0; r < SW; r++)
            free(wa[r][k]), free(wb[r][k]);
    }
    stop_server(&one);
    for (int s = 0; s < 3; s++)
        stop_server(&s3[s]);
}
END_TEST

/* ---- a shard killed mid-run ------------------------------------------------------ */

/* One worker (lr 1, gradients of 1, async) steps over servers A and B; a
 * tensor split over both and a small one on each. It stops at two gates:
 * after KSTEP1 steps B writes a checkpoint; after KSTEP2, B is killed with
 * SIGKILL and restarted from that checkpoint; then it runs to KSTEPS. B
 * loses exactly the updates between the checkpoint and the kill (its own
 * interval), A nothing, and every step returns OK. */
enum { KSTEP1 = 30, KSTEP2 = 45, KSTEPS = 90, KBIG = 400000 };

typedef struct kill_arg {
    const char *list;
    pthread_barrier_t *gate;
    int rc, failed_step;
    char err[300];
    char keys[2][16];   /* a small tensor on A and one on B */
} kill_arg;

static void *kill_worker(void *arg)
{
    kill_arg *a = arg;
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = a->list;
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 2000;             /* notice the dead shard soon */
    o.reconnect_timeout_ms = 120000; /* and wait for it long */
    gddr_client *c = NULL;
    float *w[3], *g[3];
    size_t n[3] = { KBIG, 64, 64 };
    const char *key[3] = { "big", a->keys[0], a->keys[1] };
    if ((a->rc = gddr_client_open(&o, &c)) != GDDR_OK) {
        snprintf(a->err, sizeof a->err, "open: %s", gddr_strerror(a->rc));
        for (int k = 0; k < 4; k++)
            pthread_barrier_wait(a->gate);
        return NULL;
    }
    for (int k = 0; k < 3; k++) {
        w[k] = calloc(n[k], 4);
        g[k] = malloc(n[k] * 4);
        for (size_t i = 0; i < n[k]; i++)
            g[k][i] = 1.0f;
        int id;
        if (a->rc == GDDR_OK && (a->rc = gddr_register(c, key[k], w[k], n[k], &id, NULL)) != GDDR_OK)
            snprintf(a->err, sizeof a->err, "register %s: %s", key[k], gddr_client_errmsg(c));
    }
    for (int s = 0; s < KSTEPS; s++) {
        if (s == KSTEP1 || s == KSTEP2) {
            pthread_barrier_wait(a->gate); /* here */
            pthread_barrier_wait(a->gate); /* go on */
        }
        if (a->rc != GDDR_OK)
            continue;
        const float *gp[3] = { g[0], g[1], g[2] };
        float *wp[3] = { w[0], w[1], w[2] };
        if ((a->rc = gddr_step(c, gp, wp)) != GDDR_OK) {
            a->failed_step = s;
            snprintf(a->err, sizeof a->err, "step %d: %s", s, gddr_client_errmsg(c));
        }
    }
    for (int k = 0; k < 3; k++)
        free(w[k]), free(g[k]);
    gddr_client_close(&c);
    return NULL;
}

static void assert_all(const float *v, size_t n, float want, const char *what)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(v[i] == want, "%s: element %zu is %g, expected %g", what, i, (double)v[i],
                      (double)want);
}

START_TEST(test_shard_killed)
{
    char dir[64], ckdir[128], loga[160], logb[160], logb2[160], ckset[200], listen[300];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt-b", dir);
    snprintf(loga, sizeof loga, "%s/a.log", dir);
    snprintf(logb, sizeof logb, "%s/b.log", dir);
    snprintf(logb2, sizeof logb2, "%s/b-restart.log", dir);
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    gt_server A, B;
    const char *seta[] = { "lr=1", "chunk=256", "shard_count=2", "shard_index=0", NULL };
    const char *setb[] = { "lr=1", "chunk=256", "shard_count=2", "shard_index=1", ckset, NULL };
    gt_start_logged(&A, loga, seta);
    gt_start_logged(&B, logb, setb);
    snprintf(listen, sizeof listen, "listen=%s", B.endpoint);
    char list[700];
    snprintf(list, sizeof list, "%s,%s", A.endpoint, B.endpoint);
    kill_arg a = { list, NULL, GDDR_OK, -1, "", { "", "" } };
    /* Small tensors whose key each server wins. */
    size_t off[2], len[2];
    int sh[2];
    for (int k = 0, found = 0; found < 3; k++) {
        char key[16];
        snprintf(key, sizeof key, "s%d", k);
        gddr__shard_placement(key, 64, 256, 2, off, len, sh);
        if (!(found & (1 << sh[0]))) {
            snprintf(a.keys[sh[0]], sizeof a.keys[0], "%s", key);
            found |= 1 << sh[0];
        }
    }
    pthread_barrier_t gate;
    pthread_barrier_init(&gate, NULL, 2);
    a.gate = &gate;
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, kill_worker, &a), 0);

    pthread_barrier_wait(&gate); /* KSTEP1 steps done: B writes a checkpoint */
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = B.endpoint;
    o.observer = 1;
    gddr_client *ob = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &ob), GDDR_OK);
    ck_assert_int_eq(gddr_request_checkpoint(ob), GDDR_OK);
    int64_t deadline = gt_now_ms() + WAIT_MS;
    while (gt_server_metric(ob, "gddr_checkpoints_total") < 1 && gt_now_ms() < deadline)
        usleep(20000);
    ck_assert_msg(gt_server_metric(ob, "gddr_checkpoints_total") >= 1, "B wrote no checkpoint");
    gddr_client_close(&ob);
    pthread_barrier_wait(&gate);

    pthread_barrier_wait(&gate); /* KSTEP2 steps done: B dies, the worker goes on */
    int st = 0;
    kill(B.pid, SIGKILL);
    ck_assert_int_eq(gt_wait_pid(B.pid, WAIT_MS, &st), 1);
    B.pid = 0;
    pthread_barrier_wait(&gate);
    const char *setb2[] = { setb[0], setb[1], setb[2], setb[3], ckset, listen, NULL };
    gt_start_logged(&B, logb2, setb2);
    ck_assert_msg(gt_wait_for_text(logb2, "restored checkpoint", WAIT_MS) >= 0, "B restored nothing");

    pthread_join(th, NULL);
    pthread_barrier_destroy(&gate);
    ck_assert_msg(a.rc == GDDR_OK, "the run did not complete: %s", a.err);

    /* A lost nothing; B lost exactly its updates after the checkpoint. */
    float *v = malloc(KBIG * 4);
    const int lost = KSTEP2 - KSTEP1;
    uint64_t ver = observe_one(A.endpoint, a.keys[0], 64, v);
    ck_assert_uint_eq(ver, KSTEPS);
    assert_all(v, 64, -(float)KSTEPS, "A's small tensor");
    ver = observe_one(B.endpoint, a.keys[1], 64, v);
    ck_assert_uint_eq(ver, KSTEPS - lost);
    assert_all(v, 64, -(float)(KSTEPS - lost), "B's small tensor");
    /* The split tensor: its first half on A, its second on B. */
    size_t poff[2], plen[2];
    int psh[2];
    ck_assert_int_eq(gddr__shard_placement("big", KBIG, 256, 2, poff, plen, psh), 2);
    ver = observe_one(A.endpoint, "big", plen[0], v);
    ck_assert_uint_eq(ver, KSTEPS);
    assert_all(v, plen[0], -(float)KSTEPS, "A's piece of the split tensor");
    ver = observe_one(B.endpoint, "big", plen[1], v);
    ck_assert_uint_eq(ver, KSTEPS - lost);
    assert_all(v, plen[1], -(float)(KSTEPS - lost), "B's piece of the split tensor");
    free(v);
    printf("shard: B killed after step %d (checkpoint at %d) and restarted: run completed, A at %d, "
           "B at %d (lost its %d updates since the checkpoint)\n",
           KSTEP2, KSTEP1, KSTEPS, KSTEPS - lost, lost);
    stop_server(&A);
    stop_server(&B);
    gt_rm_rf(dir);
}
END_TEST

/* The calls besides gddr_step, across two servers: register, push and pull
 * (blocking and by ticket) of a split and a whole tensor, versions, stats,
 * metrics (every sample labelled by shard), checkpoints, counters. */
START_TEST(test_api_across_shards)
{
    gt_server A, B;
    START_SERVER(A, "lr=1", "chunk=256", "shard_count=2", "shard_index=0");
    START_SERVER(B, "lr=1", "chunk=256", "shard_count=2", "shard_index=1");
    char list[700];
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = list;
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 30000;
    o.reconnect_timeout_ms = 2000;
    gddr_client *c = NULL;
    /* The list in the wrong order, or one server alone: refused at once. */
    snprintf(list, sizeof list, "%s, %s", B.endpoint, A.endpoint);
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_ECONFIG);
    ck_assert_ptr_null(c);
    /* ... and the error says what to change (the server's own sentence),
     * not only "bad configuration". */
    char ini[] = "/tmp/gddr-test-shard-ini-XXXXXX", err[1024] = "";
    int fd = mkstemp(ini);
    ck_assert_int_ge(fd, 0);
    dprintf(fd, "[client]\nserver = %s\nrank = 0\nworld_size = 1\n", list);
    close(fd);
    ck_assert_int_eq(gddr_client_open_ini(ini, NULL, &c, err, sizeof err), GDDR_ECONFIG);
    unlink(ini);
    ck_assert_msg(strstr(err, "in the order of their shard_index"), "err: %s", err);
    snprintf(list, sizeof list, "%s", B.endpoint);
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_ECONFIG);
    snprintf(list, sizeof list, "%s, %s", A.endpoint, B.endpoint);
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    enum { NB = 300000, NS = 10 };
    float *w = calloc(NB, 4), *g = malloc(NB * 4), *out = malloc(NB * 4);
    for (int i = 0; i < NB; i++)
        g[i] = 1.0f;
    int big, small;
    uint64_t v = 99;
    ck_assert_int_eq(gddr_register(c, "big", w, NB, &big, &v), GDDR_OK);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(gddr_register(c, "small", w, NS, &small, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c, "small", w, NS, &small, NULL), GDDR_EINVAL);
    ck_assert_int_eq(gddr_push(c, big, g, &v), GDDR_OK);
    ck_assert_uint_eq(v, 1);
    gddr_ticket t1, t2, t3;
    ck_assert_int_eq(gddr_push_async(c, big, g, NULL, &t1), GDDR_OK);
    ck_assert_int_eq(gddr_push_async(c, small, g, NULL, &t2), GDDR_OK);
    ck_assert_int_eq(gddr_wait(c, t1, 30000, &v), GDDR_OK);
    ck_assert_uint_eq(v, 2);
    ck_assert_int_eq(gddr_wait(c, t2, 30000, &v), GDDR_OK);
    ck_assert_uint_eq(v, 1);
    ck_assert_int_eq(gddr_wait(c, t2, 1000, NULL), GDDR_ENOTICKET);
    ck_assert_int_eq(gddr_pull_async(c, big, out, 2, &t3), GDDR_OK);
    ck_assert_int_eq(gddr_wait(c, t3, 30000, &v), GDDR_OK);
    ck_assert_uint_eq(v, 2);
    assert_all(out, NB, -2.0f, "the split tensor after two pushes");
    ck_assert_int_eq(gddr_pull(c, small, out, 0, &v), GDDR_OK);
    assert_all(out, NS, -1.0f, "the whole tensor after one push");
    /* A NaN in one piece of the split tensor is refused before either
     * server applies the other piece: push, async push, step (the NaN at
     * either end, so on either server). The counts below see no push. */
    float small_out[NS];
    for (int end = 0; end < 2; end++) {
        g[end ? NB - 1 : 0] = NAN;
        ck_assert_int_eq(gddr_push(c, big, g, &v), GDDR_ENONFINITE);
        ck_assert_int_eq(gddr_push_async(c, big, g, NULL, &t1), GDDR_ENONFINITE);
        const float *gs[2] = { g, g + NB - NS };
        float *ps[2] = { out, small_out };
        ck_assert_int_eq(gddr_step(c, gs, ps), GDDR_ENONFINITE);
        ck_assert_msg(strstr(gddr_client_errmsg(c), "'big' holds NaN"), "%s", gddr_client_errmsg(c));
        g[end ? NB - 1 : 0] = 1.0f;
    }
    ck_assert_int_eq(gddr_pull(c, big, out, 0, &v), GDDR_OK);
    ck_assert_uint_eq(v, 2);
    assert_all(out, NB, -2.0f, "the split tensor after refused NaN pushes");
    ck_assert_int_eq(gddr_pull(c, small, out, 0, &v), GDDR_OK);
    assert_all(out, NS, -1.0f, "the whole tensor after a refused NaN step");
    ck_assert_int_eq(gddr_tensor_version(c, big, &v), GDDR_OK);
    ck_assert_uint_eq(v, 2);
    ck_assert_int_eq(gddr_pull(c, 7, out, 0, NULL), GDDR_EINVAL);
    /* Stats and metrics: both servers took part of the split tensor. */
    gddr_server_stats st;
    ck_assert_int_eq(gddr_server_stats_get(c, &st), GDDR_OK);
    ck_assert_uint_eq(st.pushes, 2 * 2 + 1); /* two pushes of two pieces, one whole */
    char *text = NULL;
    ck_assert_int_eq(gddr_server_metrics_text(c, &text), GDDR_OK);
    ck_assert_msg(strstr(text, "gddr_pushes_total{shard=\"0\"}") && strstr(text, "gddr_pushes_total{shard=\"1\"}"),
                  "metrics: %.400s", text);
    int help = 0;
    for (const char *p = text; (p = strstr(p, "# HELP gddr_pushes_total ")); p++)
        help++;
    ck_assert_int_eq(help, 1);
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        ck_assert_msg(p[0] == '#' || strstr(p, "shard=\"") < (e ? e : p + strlen(p)),
                      "a sample without its shard: %.80s", p);
        p = e ? e + 1 : p + strlen(p);
    }
    free(text);
    ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK); /* no checkpoint_dir: acknowledged */
    gddr_client_counters k;
    ck_assert_int_eq(gddr_client_counters_get(c, &k), GDDR_OK);
    ck_assert_uint_eq(k.pushes, 5);
    ck_assert_uint_ge(k.pulls, 3);
    gddr_server_info info;
    ck_assert_int_eq(gddr_client_info(c, &info), GDDR_OK);
    ck_assert_int_eq(info.chunk, 256);
    gddr_client_close(&c);
    free(w), free(g), free(out);
    stop_server(&A);
    stop_server(&B);
}
END_TEST

/* ---- sync steps across a restarted shard (issue 24 item 2) ------------------------ */

#define RW 4           /* workers */
#define RN 300000      /* a tensor split over all three servers (1.2 MB) */

typedef struct rk_run {
    const char *list;
    int rank;
    atomic_int *stop;
    atomic_int *steps;
    int rc;
    char err[300];
} rk_run;

static void *rk_worker(void *arg)
{
    rk_run *a = arg;
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = a->list;
    o.rank = a->rank;
    o.world_size = RW;
    o.timeout_ms = 1000;             /* notice a dead shard soon */
    o.reconnect_timeout_ms = 20000;  /* a deadlock ends the run in 20 s */
    gddr_client *c = NULL;
    if ((a->rc = gddr_client_open(&o, &c)) != GDDR_OK) {
        snprintf(a->err, sizeof a->err, "rank %d: open: %s", a->rank, gddr_strerror(a->rc));
        return NULL;
    }
    float *w = calloc(RN, 4), *g = malloc(RN * 4);
    for (size_t i = 0; i < RN; i++)
        g[i] = 1e-4f;
    int id;
    if ((a->rc = gddr_register(c, "split", w, RN, &id, NULL)) != GDDR_OK)
        snprintf(a->err, sizeof a->err, "rank %d: register: %s", a->rank, gddr_client_errmsg(c));
    for (int s = 0; a->rc == GDDR_OK && !atomic_load(a->stop); s++) {
        const float *gp[1] = { g };
        float *wp[1] = { w };
        if ((a->rc = gddr_step(c, gp, wp)) != GDDR_OK)
            snprintf(a->err, sizeof a->err, "rank %d step %d: %s", a->rank, s, gddr_client_errmsg(c));
        else
            atomic_fetch_add(a->steps, 1);
    }
    free(w), free(g);
    gddr_client_close(&c);
    return NULL;
}

/* Three servers in sync mode, checkpointing every 50 ms, four workers
 * stepping a tensor split over all three; each server in turn is killed
 * with SIGKILL at a random point of the run and restarted from its newest
 * checkpoint (which often holds an open step). The run must go on: before
 * the steps lined up after a restore, a restarted shard could collect one
 * worker's push into a step of its own that no other shard had, and every
 * worker waited until reconnect_timeout_ms ended it. GDDR_SHARD_KILLS sets
 * the number of kills (default 12, four per server: about 30 s; before the
 * fix, three 30-kill runs deadlocked, each by its 12th kill; three 6-kill runs passed). */
START_TEST(test_shard_restart_sync_steps)
{
    int kills = 12;
    const char *ev = getenv("GDDR_SHARD_KILLS");
    if (ev && atoi(ev) > 0)
        kills = atoi(ev);
    char dir[64], ck[3][128], ckset[3][400], idx[3][32], lst[3][300];
    gt_mk_tmpdir(dir, sizeof dir);
    gt_server sv[3];
    char list[1600] = "";
    for (int s = 0; s < 3; s++) {
        snprintf(ck[s], sizeof ck[s], "%s/ck%d", dir, s);
        snprintf(ckset[s], sizeof ckset[s], "checkpoint_dir=%s", ck[s]);
        snprintf(idx[s], sizeof idx[s], "shard_index=%d", s);
        char log[160];
        snprintf(log, sizeof log, "%s/s%d-0.log", dir, s);
        const char *sets[] = { "mode=sync", "workers=4", "lr=0.1", "chunk=256", "shard_count=3", idx[s],
                               ckset[s], "checkpoint_interval_s=0.05", NULL };
        gt_start_logged(&sv[s], log, sets);
        snprintf(lst[s], sizeof lst[s], "listen=%s", sv[s].endpoint);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", s ? "," : "", sv[s].endpoint);
    }
    atomic_int stop = 0, steps = 0;
    rk_run a[RW];
    pthread_t th[RW];
    for (int r = 0; r < RW; r++) {
        a[r] = (rk_run){ list, r, &stop, &steps, GDDR_OK, "" };
        ck_assert_int_eq(pthread_create(&th[r], NULL, rk_worker, &a[r]), 0);
    }
    /* The kill points are random; GDDR_SHARD_SEED replays a run (the seed
     * is in every failure message). */
    const char *se = getenv("GDDR_SHARD_SEED");
    unsigned seed = se && *se ? (unsigned)strtoul(se, NULL, 10) : (unsigned)gt_now_ms();
    const unsigned seed0 = seed;
    int64_t t0 = gt_now_ms();
    int failed = 0;
    for (int k = 0; k < kills && !failed; k++) {
        /* Some steps first, then a random point within the next few. */
        int want = atomic_load(&steps) + RW * 3;
        int64_t deadline = gt_now_ms() + WAIT_MS;
        while (atomic_load(&steps) < want && gt_now_ms() < deadline) {
            for (int r = 0; r < RW; r++)
                failed |= a[r].rc != GDDR_OK;
            if (failed)
                break;
            usleep(5000);
        }
        if (failed)
            break;
        ck_assert_msg(atomic_load(&steps) >= want, "kill %d: the run made no progress in %d ms (GDDR_SHARD_SEED=%u)",
                      k, WAIT_MS, seed0);
        usleep((useconds_t)(rand_r(&seed) % 150000));
        int s = k % 3;
        kill(sv[s].pid, SIGKILL);
        ck_assert_int_eq(gt_wait_pid(sv[s].pid, WAIT_MS, NULL), 1);
        sv[s].pid = 0;
        char log[160];
        snprintf(log, sizeof log, "%s/s%d-%d.log", dir, s, k + 1);
        const char *sets[] = { "mode=sync", "workers=4", "lr=0.1", "chunk=256", "shard_count=3", idx[s],
                               ckset[s], "checkpoint_interval_s=0.05", lst[s], NULL };
        gt_start_logged(&sv[s], log, sets);
        ck_assert_msg(gt_wait_for_text(log, "restored checkpoint", WAIT_MS) >= 0,
                      "kill %d: server %d restored nothing", k, s);
    }
    /* Steps after the last restart too. */
    int want = atomic_load(&steps) + RW * 3;
    int64_t deadline = gt_now_ms() + WAIT_MS;
    while (!failed && atomic_load(&steps) < want && gt_now_ms() < deadline) {
        for (int r = 0; r < RW; r++)
            failed |= a[r].rc != GDDR_OK;
        usleep(5000);
    }
    atomic_store(&stop, 1);
    for (int r = 0; r < RW; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < RW; r++)
        ck_assert_msg(a[r].rc == GDDR_OK, "%s (GDDR_SHARD_SEED=%u)", a[r].err, seed0);
    /* How many restarts came back with a step open that a later step closed. */
    int closed = 0;
    for (int k = 0; k < kills; k++) {
        char log[160];
        snprintf(log, sizeof log, "%s/s%d-%d.log", dir, k % 3, k + 1);
        closed += gt_wait_for_text(log, "that step closes with", 0) >= 0;
    }
    printf("shard: %d kills (each server %d times) of a 3-server sync run of 4 workers, %d steps, %.1f s: "
           "the run went on (%d restarts closed a restored open step early; GDDR_SHARD_SEED=%u)\n",
           kills, (kills + 2) / 3, atomic_load(&steps) / RW, (double)(gt_now_ms() - t0) / 1000.0, closed,
           seed0);
    for (int s = 0; s < 3; s++)
        stop_server(&sv[s]);
    gt_rm_rf(dir);
}
END_TEST

Suite *suite_shard(void)
{
    Suite *s = suite_create("shard");
    GT_ADD_CASE(s, "placement", test_placement, 30);
    GT_ADD_CASE(s, "metrics_merge", test_metrics_merge, 30);
    GT_ADD_CASE(s, "sync_three_equals_one", test_sync_three_equals_one, 240);
    GT_ADD_CASE(s, "shard_killed", test_shard_killed, 300);
    GT_ADD_CASE(s, "api_across_shards", test_api_across_shards, 120);
    GT_ADD_CASE(s, "restart_sync_steps", test_shard_restart_sync_steps, 600);
    return s;
}
