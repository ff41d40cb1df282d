/* check_consistency.c -- consistency modes, the update rule and staleness
 * remedies, end to end (docs/design.md sections 3-6).
 *
 * Every test starts its own gddr-ps through tests/harness.h and drives it
 * with libgddr-client: several clients in one thread stand for several
 * workers, non-blocking pulls stand for a worker parked in a sync step or at
 * the ssp bound. Values are chosen so that every expected number is exact
 * in float (integers, halves, quarters), and the tests compare bitwise
 * unless a formula has a square root in it (adaptive DC-ASGD).
 *
 * Whether a parked pull is still parked is read from the server's own
 * counter of served pulls (gddr_server_stats_get through a client that has
 * nothing in flight): a client-side gddr_wait() with a short timeout would
 * abandon the ticket, and its late reply would be dropped.
 *
 * The last three tests run the programs: the seed experiment (four
 * gddr-train --workload quadratic runs), --simulate-staleness with DC-ASGD
 * on, and scripts/experiment-staleness.sh --quick.
 *
 *   build/bin/gddr-tests consistency
 */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gddr/gddr.h"
#include "harness.h"
#include "syncstep.h"
#include "wirekit.h"
#include "suites.h"

#define TCASE_TIMEOUT 30
#define REPLY_WAIT_MS 5000

/* ---- helpers --------------------------------------------------------------- */

/* Opens a client with options o (server, rank and world filled in here). */
static gddr_client *open_client_o(const char *ep, int rank, int world, gddr_client_opts o)
{
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = REPLY_WAIT_MS;
    o.reconnect_timeout_ms = 1000;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    ck_assert_msg(rc == GDDR_OK, "gddr_client_open(%s, rank %d): %s", ep, rank, gddr_strerror(rc));
    return c;
}

static gddr_client *open_client(const char *ep, int rank, int world)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    return open_client_o(ep, rank, world, o);
}

static void assert_close_floats(const float *got, const double *want, size_t n, double tol,
                                const char *what)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs((double)got[i] - want[i]) <= tol * (1.0 + fabs(want[i])),
                      "%s: element %zu is %.9g, expected %.9g (tolerance %g)", what, i,
                      (double)got[i], want[i], tol);
}

/* Pulls tensor id (min_version 0) and checks it is `want` at `version`. */
static void assert_state(gddr_client *c, int id, const float *want, size_t n, uint64_t version,
                         const char *what)
{
    float got[64];
    ck_assert(n <= 64);
    uint64_t v = 12345;
    int rc = gddr_pull(c, id, got, 0, &v);
    ck_assert_msg(rc == GDDR_OK, "%s: pull failed: %s (%s)", what, gddr_strerror(rc),
                  gddr_client_errmsg(c));
    ck_assert_msg(v == version, "%s: version is %" PRIu64 ", expected %" PRIu64, what, v, version);
    assert_same_floats(got, want, n, what);
}

/* A push tagged explicitly; returns the version in the reply. */
static uint64_t push_tagged(gddr_client *c, int id, const float *g, uint64_t birth, uint64_t base,
                            const char *what)
{
    gddr_push_tags tags;
    memset(&tags, 0, sizeof tags);
    tags.has_birth = 1;
    tags.birth_version = birth;
    tags.base_version = base;
    uint64_t v = 999999;
    int rc = gddr_push_ex(c, id, g, &tags, &v);
    ck_assert_msg(rc == GDDR_OK, "%s: push: %s (%s)", what, gddr_strerror(rc), gddr_client_errmsg(c));
    return v;
}

/* A plain push (tagged with the client's last pulled version). */
static uint64_t push_plain(gddr_client *c, int id, const float *g, const char *what)
{
    uint64_t v = 999999;
    int rc = gddr_push(c, id, g, &v);
    ck_assert_msg(rc == GDDR_OK, "%s: push: %s (%s)", what, gddr_strerror(rc), gddr_client_errmsg(c));
    return v;
}

static void fill(float *v, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        v[i] = a;
}

/* ---- 1. sync: one version per step, pulls wait for every live worker ------- */

START_TEST(test_sync_one_version_per_step)
{
    enum { W = 4, N = 6, STEPS = 3 };
    const float lr = 0.5f;
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=4", "lr=0.5", "chunk=4");
    gddr_client *c[W];
    int id[W];
    float w[N], g[W][N], got[N];
    for (int i = 0; i < N; i++)
        w[i] = (float)(2 * i) - 3.0f;
    for (int r = 0; r < W; r++) {
        c[r] = open_client(s.endpoint, r, W);
        gddr_server_info info;
        ck_assert_int_eq(gddr_client_info(c[r], &info), GDDR_OK);
        ck_assert_int_eq(info.mode, GDDR_MODE_SYNC);
        ck_assert_int_eq(gddr_register(c[r], "sync.w", w, N, &id[r], NULL), GDDR_OK);
    }
    for (int v = 0; v < STEPS; v++) {
        /* Integer gradients: lr * sum / 4 is exact. */
        for (int r = 0; r < W; r++)
            for (int i = 0; i < N; i++)
                g[r][i] = (float)((r + 1) * (v + 1) * ((i % 3) - 1) + r - i);
        /* Every worker computes on the parameters of version v. */
        for (int r = 1; r < W; r++) {
            uint64_t pv = 99;
            ck_assert_int_eq(gddr_pull(c[r], id[r], got, (uint64_t)v, &pv), GDDR_OK);
            ck_assert_uint_eq(pv, (uint64_t)v);
        }
        uint64_t pulls_before = get_stats(c[W - 1]).pulls;

        /* Rank 0 pushes step v, then waits for version v+1. */
        ck_assert_uint_eq(push_plain(c[0], id[0], g[0], "rank 0"), (uint64_t)v);
        gddr_ticket tk;
        memset(got, 0, sizeof got);
        ck_assert_int_eq(gddr_pull_async(c[0], id[0], got, (uint64_t)v + 1, &tk), GDDR_OK);
        /* Ranks 1..W-2 push; nothing is applied yet. */
        for (int r = 1; r < W - 1; r++)
            ck_assert_msg(push_plain(c[r], id[r], g[r], "rank r") == (uint64_t)v,
                          "step %d: push of rank %d was applied before all %d workers pushed", v,
                          r, W);
        /* After W-1 pushes: the parked pull was not served, the version did
         * not move, and the values are those of the last step. */
        gddr_server_stats st = get_stats(c[W - 1]);
        ck_assert_msg(st.pulls == pulls_before,
                      "step %d: a pull for version %d was served after only %d of %d pushes", v,
                      v + 1, W - 1, W);
        ck_assert_uint_eq(st.versions_total, (uint64_t)v);
        ck_assert_uint_eq(st.pushes, (uint64_t)(v * W + W - 1));
        assert_state(c[W - 1], id[W - 1], w, N, (uint64_t)v, "sync step half collected");

        /* The last worker completes the step: one bump, the mean applied. */
        ck_assert_msg(push_plain(c[W - 1], id[W - 1], g[W - 1], "last rank") == (uint64_t)v + 1,
                      "step %d: the last push did not complete the step", v);
        for (int i = 0; i < N; i++) {
            float acc = 0.0f;
            for (int r = 0; r < W; r++)
                acc += lr * g[r][i];
            w[i] -= acc * 0.25f;
        }
        uint64_t got_v = 0;
        int rc = gddr_wait(c[0], tk, 3000, &got_v);
        ck_assert_msg(rc == GDDR_OK, "step %d: the parked pull never completed: %s (%s)", v,
                      gddr_strerror(rc), gddr_client_errmsg(c[0]));
        ck_assert_uint_eq(got_v, (uint64_t)v + 1);
        assert_same_floats(got, w, N, "parked pull released by the step");
        st = get_stats(c[1]);
        ck_assert_uint_eq(st.versions_total, (uint64_t)v + 1);
        ck_assert_uint_eq(st.pushes, (uint64_t)(v + 1) * W);
        /* Every push of a sync step is measured fresh. */
        ck_assert_uint_eq(st.staleness_max, 0);
    }
    for (int r = 0; r < W; r++)
        gddr_client_close(&c[r]);
    stop_server(&s);
}
END_TEST

/* ---- 2. sync_quorum: late pushes are folded, never dropped ------------------ */

/* sync.c ps_sync_try_complete: a step is applied once K distinct ranks
 * pushed their push of it, and it is divided by the number of LIVE workers
 * (not by K, not by the pushes that arrived), so every push counts with
 * weight lr/N however late it comes: N * (sum applied) = lr * (sum pushed).
 * A late push (its step completed without it: members.c ps_sync_place) is
 * mass in the open step, not a rank's push of it. */
START_TEST(test_sync_quorum_folds_late_pushes)
{
    enum { W = 4, N = 4 };
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=4", "sync_quorum=2", "lr=0.5");
    gddr_client *c[W];
    int id[W];
    const float w0[N] = { 10.0f, -3.0f, 0.5f, 100.0f };
    const float base[N] = { 1.0f, 2.0f, -1.0f, 4.0f };
    for (int r = 0; r < W; r++) {
        c[r] = open_client(s.endpoint, r, W);
        ck_assert_int_eq(gddr_register(c[r], "quorum.w", w0, N, &id[r], NULL), GDDR_OK);
    }
    float g[N], want[N];
    float sum = 0.0f; /* sum of the multipliers pushed so far */
    memcpy(want, w0, sizeof want);
#define QPUSH(rank, mult, birth, expect_version)                                              \
    do {                                                                                      \
        for (int i_ = 0; i_ < N; i_++)                                                        \
            g[i_] = (float)(mult) * base[i_];                                                 \
        sum += (float)(mult);                                                                 \
        uint64_t v_ = push_tagged(c[rank], id[rank], g, (birth), (birth), "quorum push");     \
        ck_assert_msg(v_ == (expect_version), "push of %d by rank %d returned version %" PRIu64 \
                      ", expected %d", (mult), (rank), v_, (expect_version));                 \
    } while (0)

    /* (rank, multiplier, version the gradient was computed on, version in
     * the reply). Step 1: ranks 0 and 1 make the quorum; applied with
     * divisor 4. */
    QPUSH(0, 1, 0, 0);
    QPUSH(1, 2, 0, 1);
    for (int i = 0; i < N; i++)
        want[i] = w0[i] - 0.5f * 3.0f * base[i] / 4.0f;
    assert_state(c[0], id[0], want, N, 1, "quorum step 1 (2 of 4 pushes, divided by 4)");
    /* Ranks 2 and 3 computed on version 0 too; their first pushes (the
     * server knows no earlier one) are their pushes of step 2. */
    QPUSH(2, 3, 0, 1);
    QPUSH(3, 4, 0, 2);
    /* Rank 0's next push belonged to step 2, which completed without it:
     * late, its values join step 3 as mass (not as rank 0's push of it).
     * Its push after that is its push of step 3; rank 1's (step 2 went on
     * without it too) is late mass; rank 2's completes step 3. */
    QPUSH(0, 5, 2, 2);
    QPUSH(0, 6, 2, 2);
    QPUSH(1, 7, 1, 2);
    gddr_server_stats st = get_stats(c[3]);
    ck_assert_uint_eq(st.versions_total, 2);
    QPUSH(2, 8, 2, 3);
    /* A late push is not lost: it waits in the open step for a quorum. */
    QPUSH(3, 9, 3, 3);
    QPUSH(0, 10, 3, 3);
    QPUSH(2, 11, 3, 4);
#undef QPUSH
    ck_assert_msg(sum == 66.0f, "test bookkeeping: sum %g", (double)sum);
    for (int i = 0; i < N; i++)
        want[i] = w0[i] - 0.5f * 66.0f * base[i] / 4.0f; /* w0 - lr * sum(g) / N */
    assert_state(c[0], id[0], want, N, 4, "after 11 pushes in 4 quorum steps");
    st = get_stats(c[0]);
    ck_assert_uint_eq(st.pushes, 11);
    ck_assert_uint_eq(st.versions_total, 4);
    /* tau = version at the push - base: 0,0 | 1,1 | 0,0,1,0 | 0,0,0. */
    const uint64_t hist[5] = { 8, 3, 0, 0, 0 };
    for (int t = 0; t < 5; t++)
        ck_assert_msg(st.staleness_hist[t] == hist[t], "staleness_hist[%d] = %" PRIu64
                      ", expected %" PRIu64, t, st.staleness_hist[t], hist[t]);
    for (int r = 0; r < W; r++)
        gddr_client_close(&c[r]);
    stop_server(&s);
}
END_TEST

/* In sync mode tau is 0 unless the quorum folded a late push; AdaDelay
 * then scales that push alone. lr=1, adadelay=1: tau 1 -> lr_eff 1/2. */
START_TEST(test_sync_adadelay_scales_folded_push)
{
    enum { N = 4 };
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "sync_quorum=1", "lr=1", "adadelay=1");
    gddr_client *a = open_client(s.endpoint, 0, 2), *b = open_client(s.endpoint, 1, 2);
    const float w0[N] = { 10, 20, 30, 40 };
    float g[N], want[N];
    int ia, ib;
    ck_assert_int_eq(gddr_register(a, "fold.w", w0, N, &ia, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(b, "fold.w", w0, N, &ib, NULL), GDDR_OK);
    fill(g, N, 8.0f);
    ck_assert_uint_eq(push_tagged(a, ia, g, 0, 0, "fresh"), 1);   /* 8 * 1 / 2 */
    ck_assert_uint_eq(push_tagged(b, ib, g, 0, 0, "tau 1"), 2);   /* 8 * 0.5 / 2 */
    for (int i = 0; i < N; i++)
        want[i] = w0[i] - 6.0f;
    assert_state(a, ia, want, N, 2, "a fresh and a folded push with adadelay=1");
    gddr_server_stats st = get_stats(a);
    ck_assert_uint_eq(st.staleness_hist[0], 1);
    ck_assert_uint_eq(st.staleness_hist[1], 1);
    gddr_client_close(&a);
    gddr_client_close(&b);
    stop_server(&s);
}
END_TEST

/* members.c ps_sync_place: where a worker's sync push goes, by the
 * worker's own step numbers (docs/protocol.md, "Late pushes"). */
START_TEST(test_sync_place_rule)
{
    uint64_t ss = 0;
    /* Not known (first push, new process, after a restart): the open step. */
    ck_assert_uint_eq(ps_sync_place(&ss, 0, 0, 7, 5, 0), 0);
    ck_assert_uint_eq(ss, 5);
    /* On time: its step after the last one's. */
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 7, 8, 6, 0), 0);
    ck_assert_uint_eq(ss, 6);
    /* Steps 7, 8 and 9 completed without it (open is 10): its step 9 is
     * step 7 here, 3 behind, and its place moves one step per push
     * (catching up) ... */
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 8, 9, 10, 0), 3);
    ck_assert_uint_eq(ss, 7);
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 9, 10, 10, 0), 2);
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 10, 11, 10, 0), 1);
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 11, 12, 10, 0), 0);
    ck_assert_uint_eq(ss, 10);
    /* ... or, with one phase (jump), its next push is the open step's. */
    ss = 6;
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 8, 9, 10, 1), 3);
    ck_assert_uint_eq(ss, 9);
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 9, 10, 10, 1), 0);
    ck_assert_uint_eq(ss, 10);
    /* Ahead of the steps here (numbers that skipped): the open step. */
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 10, 15, 11, 0), 0);
    ck_assert_uint_eq(ss, 11);
    /* A record of another session (known = 0) or a step not after the
     * last: not known, the open step. */
    ck_assert_uint_eq(ps_sync_place(&ss, 1, 20, 3, 12, 0), 0);
    ck_assert_uint_eq(ss, 12);
    /* A push the restore aligner found 2 steps before the open step 12. */
    ck_assert_uint_eq(ps_sync_place_late(&ss, 2, 12), 2);
    ck_assert_uint_eq(ss, 10);
    /* The aligner's want: its last push (step 40) was in the open step 12,
     * or the one before; by its place when the checkpoint had it (step 9:
     * its step 40 + 3 is the open step's). Returned + 1 (0: unknown). */
    ck_assert_uint_eq(ps_align_wanted(40, 0, 12, 1), 41);
    ck_assert_uint_eq(ps_align_wanted(40, 0, 12, 0), 42);
    ck_assert_uint_eq(ps_align_wanted(40, 12, 12, 1), 41);
    ck_assert_uint_eq(ps_align_wanted(40, 9, 12, 0), 44);
}
END_TEST

/* ---- 3. ssp: a fast worker is held at the bound ----------------------------- */

START_TEST(test_ssp_holds_fast_worker)
{
    enum { N = 4 };
    gt_server s;
    START_SERVER(s, "mode=ssp", "staleness_bound=2", "workers=2", "lr=0.5");
    gddr_client *fast = open_client(s.endpoint, 0, 2), *slow = open_client(s.endpoint, 1, 2);
    gddr_server_info info;
    ck_assert_int_eq(gddr_client_info(fast, &info), GDDR_OK);
    ck_assert_int_eq(info.mode, GDDR_MODE_SSP);
    float w[N] = { 0 }, g[N], got[N];
    int idf, ids;
    ck_assert_int_eq(gddr_register(fast, "ssp.w", w, N, &idf, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(slow, "ssp.w", w, N, &ids, NULL), GDDR_OK);
    fill(g, N, 1.0f);
    uint64_t v = 0;

    /* The fast worker runs steps 0, 1, 2 while the slow one (clock 0) has
     * pushed nothing: with s = 2 it may begin steps 1 and 2... */
    for (int step = 0; step < 2; step++) {
        ck_assert_uint_eq(push_plain(fast, idf, g, "fast"), ++v);
        ck_assert_uint_eq(gddr_next_step(fast), (uint64_t)step + 1);
        uint64_t pv = 0;
        int rc = gddr_pull(fast, idf, got, 0, &pv);
        ck_assert_msg(rc == GDDR_OK, "fast worker's pull for step %d (slow at 0, s=2): %s", step + 1,
                      gddr_strerror(rc));
        ck_assert_uint_eq(pv, v);
    }
    /* ...but not step 3. */
    ck_assert_uint_eq(push_plain(fast, idf, g, "fast"), ++v);
    ck_assert_uint_eq(gddr_next_step(fast), 3);
    gddr_ticket tk;
    ck_assert_int_eq(gddr_pull_async(fast, idf, got, 0, &tk), GDDR_OK);
    gddr_server_stats st = get_stats(slow);
    ck_assert_msg(st.pulls == 2, "the fast worker's pull for step 3 was served with the slow "
                                 "worker at step 0 and staleness_bound=2 (%" PRIu64 " pulls)",
                  st.pulls);
    /* The slow worker is not held. */
    uint64_t pv = 0;
    ck_assert_int_eq(gddr_pull(slow, ids, got, 0, &pv), GDDR_OK);
    ck_assert_uint_eq(pv, 3);
    /* Its push of step 0 moves the slowest clock to 1: the fast one goes on. */
    ck_assert_uint_eq(push_plain(slow, ids, g, "slow"), ++v);
    int rc = gddr_wait(fast, tk, 3000, &pv);
    ck_assert_msg(rc == GDDR_OK, "the fast worker stayed parked after the slow one advanced: %s",
                  gddr_strerror(rc));
    ck_assert_uint_eq(pv, 4);
    float want[N];
    fill(want, N, -2.0f); /* four pushes of 0.5 * 1 */
    assert_same_floats(got, want, N, "pull released by the slow worker's push");

    /* Step 4 is again one too many (slow at clock 1)... */
    ck_assert_uint_eq(push_plain(fast, idf, g, "fast"), ++v);
    ck_assert_uint_eq(gddr_next_step(fast), 4);
    ck_assert_int_eq(gddr_pull_async(fast, idf, got, 0, &tk), GDDR_OK);
    st = get_stats(slow);
    ck_assert_msg(st.pulls == 4, "pull for step 4 with the slowest at clock 1 was served");
    /* ...until the slow worker leaves: the bound follows live workers. */
    gddr_client_close(&slow);
    rc = gddr_wait(fast, tk, 3000, &pv);
    ck_assert_msg(rc == GDDR_OK, "the fast worker stayed parked after the slow one left: %s",
                  gddr_strerror(rc));
    ck_assert_uint_eq(pv, 5);
    gddr_client_close(&fast);
    stop_server(&s);
}
END_TEST

/* ---- 4. hybrid: async for W versions, then sync ----------------------------- */

START_TEST(test_hybrid_switches_at_warmup)
{
    enum { N = 4, WARM = 3 };
    gt_server s;
    START_SERVER(s, "mode=sync", "async_warmup_steps=3", "workers=2", "lr=0.5");
    gddr_client *a = open_client(s.endpoint, 0, 2);
    gddr_server_info info;
    ck_assert_int_eq(gddr_client_info(a, &info), GDDR_OK);
    ck_assert_msg(info.mode == GDDR_MODE_ASYNC, "hybrid server says mode %d at hello before warm-up",
                  info.mode);
    float w[N] = { 0 }, g[N], want[N];
    int ia, ib;
    ck_assert_int_eq(gddr_register(a, "hyb.w", w, N, &ia, NULL), GDDR_OK);
    fill(g, N, 1.0f);
    /* Warm-up: each push is applied on arrival (the other worker never
     * pushes), and the replies say async until the version reaches W. */
    for (int k = 1; k <= WARM; k++) {
        ck_assert_uint_eq(push_plain(a, ia, g, "warm-up"), (uint64_t)k);
        ck_assert_int_eq(gddr_client_info(a, &info), GDDR_OK);
        ck_assert_msg(info.mode == (k < WARM ? GDDR_MODE_ASYNC : GDDR_MODE_SYNC),
                      "after warm-up push %d (version %d) the reply says mode %d", k, k, info.mode);
        if (k == 1) {
            /* A worker joining during warm-up hears async. */
            gddr_client *b = open_client(s.endpoint, 1, 2);
            ck_assert_int_eq(gddr_client_info(b, &info), GDDR_OK);
            ck_assert_int_eq(info.mode, GDDR_MODE_ASYNC);
            gddr_client_close(&b);
        }
    }
    fill(want, N, -1.5f);
    assert_state(a, ia, want, N, WARM, "after the warm-up");
    /* A worker joining now hears sync. */
    gddr_client *b = open_client(s.endpoint, 1, 2);
    ck_assert_int_eq(gddr_client_info(b, &info), GDDR_OK);
    ck_assert_msg(info.mode == GDDR_MODE_SYNC, "hello after the warm-up says mode %d", info.mode);
    ck_assert_int_eq(gddr_register(b, "hyb.w", w, N, &ib, NULL), GDDR_OK);
    /* From version W on, pushes are collected into sync steps. */
    fill(g, N, 2.0f);
    ck_assert_msg(push_plain(a, ia, g, "first sync push") == WARM,
                  "the first push after the warm-up was applied at once");
    ck_assert_uint_eq(get_stats(b).versions_total, WARM);
    ck_assert_uint_eq(push_plain(b, ib, g, "second sync push"), WARM + 1);
    fill(want, N, -2.5f); /* -1.5 - 0.5 * (2 + 2) / 2 */
    assert_state(a, ia, want, N, WARM + 1, "first sync step after the warm-up");
    gddr_client_close(&a);
    gddr_client_close(&b);
    stop_server(&s);
}
END_TEST

/* ---- 5. AdaDelay: lr_eff = lr / (1 + adadelay * tau), tau from base --------- */

START_TEST(test_adadelay_exact)
{
    enum { N = 4 };
    gt_server s;
    START_SERVER(s, "lr=1", "adadelay=1");
    gddr_client *c = open_client(s.endpoint, 0, 1);
    const float w0[N] = { 16.0f, 8.0f, -4.0f, 2.0f };
    float w[N], g[N];
    int id;
    ck_assert_int_eq(gddr_register(c, "ada.w", w0, N, &id, NULL), GDDR_OK);
    memcpy(w, w0, sizeof w);
    /* Three fresh pushes (tau 0, lr_eff 1). */
    fill(g, N, 1.0f);
    for (uint64_t k = 0; k < 3; k++) {
        ck_assert_uint_eq(push_tagged(c, id, g, k, k, "fresh"), k + 1);
        for (int i = 0; i < N; i++)
            w[i] -= 1.0f;
    }
    assert_state(c, id, w, N, 3, "three fresh pushes");
    /* Born at 0, applied at 3: tau 3, lr_eff = 1 / 4. */
    const float g3[N] = { 4.0f, 8.0f, -4.0f, 2.0f };
    ck_assert_uint_eq(push_tagged(c, id, g3, 0, 0, "tau 3"), 4);
    for (int i = 0; i < N; i++)
        w[i] -= 0.25f * g3[i];
    assert_state(c, id, w, N, 4, "a push of staleness 3 with lr=1, adadelay=1");
    /* Born at 0 but compensated to 3 (DC-ASGD): tau counts from the base,
     * 4 - 3 = 1, lr_eff = 1 / 2. */
    fill(g, N, 2.0f);
    ck_assert_uint_eq(push_tagged(c, id, g, 0, 3, "base 3"), 5);
    for (int i = 0; i < N; i++)
        w[i] -= 1.0f;
    assert_state(c, id, w, N, 5, "a push born at 0 with base 3 at version 4");
    gddr_server_stats st = get_stats(c);
    ck_assert_uint_eq(st.staleness_hist[0], 3);
    ck_assert_uint_eq(st.staleness_hist[1], 1);
    ck_assert_uint_eq(st.staleness_hist[3], 1);
    ck_assert_uint_eq(st.staleness_max, 3);
    ck_assert_msg(fabs(st.staleness_mean - 0.8) < 1e-12, "staleness_mean %g", st.staleness_mean);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 6. momentum ------------------------------------------------------------ */

START_TEST(test_momentum_exact)
{
    enum { N = 4 };
    /* async: v = 0.5 v + 0.5 g; w -= v. */
    gt_server s;
    START_SERVER(s, "lr=0.5", "momentum=0.5");
    gddr_client *c = open_client(s.endpoint, 0, 1);
    float w[N] = { 0 };
    int id;
    ck_assert_int_eq(gddr_register(c, "mom.w", w, N, &id, NULL), GDDR_OK);
    const float g1[N] = { 8, 8, -8, 4 }, g2[N] = { 8, 0, 8, -4 }, g3[N] = { 0, 0, 0, 0 };
    const float w1[N] = { -4, -4, 4, -2 };     /* v = (4, 4, -4, 2) */
    const float w2[N] = { -10, -6, 2, -1 };    /* v = (6, 2, 2, -1) */
    const float w3[N] = { -13, -7, 1, -0.5f }; /* v = (3, 1, 1, -0.5): momentum alone */
    ck_assert_uint_eq(push_tagged(c, id, g1, 0, 0, "g1"), 1);
    assert_state(c, id, w1, N, 1, "momentum, push 1");
    ck_assert_uint_eq(push_tagged(c, id, g2, 1, 1, "g2"), 2);
    assert_state(c, id, w2, N, 2, "momentum, push 2");
    ck_assert_uint_eq(push_tagged(c, id, g3, 2, 2, "g3"), 3);
    assert_state(c, id, w3, N, 3, "momentum, push 3 (zero gradient)");
    gddr_client_close(&c);
    stop_server(&s);

    /* sync: the step mean goes through the same velocity. */
    START_SERVER(s, "mode=sync", "workers=2", "lr=0.5", "momentum=0.5");
    gddr_client *a = open_client(s.endpoint, 0, 2), *b = open_client(s.endpoint, 1, 2);
    int ia, ib;
    fill(w, N, 0.0f);
    ck_assert_int_eq(gddr_register(a, "smom.w", w, N, &ia, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(b, "smom.w", w, N, &ib, NULL), GDDR_OK);
    float ga[N], gb[N], want[N];
    fill(ga, N, 8.0f);
    fill(gb, N, 0.0f);
    push_tagged(a, ia, ga, 0, 0, "sync a1");
    ck_assert_uint_eq(push_tagged(b, ib, gb, 0, 0, "sync b1"), 1);
    fill(want, N, -2.0f); /* v = 0.5 * 8 / 2 = 2 */
    assert_state(a, ia, want, N, 1, "sync momentum, step 1");
    fill(ga, N, 0.0f);
    push_tagged(a, ia, ga, 1, 1, "sync a2");
    ck_assert_uint_eq(push_tagged(b, ib, gb, 1, 1, "sync b2"), 2);
    fill(want, N, -3.0f); /* v = 0.5 * 2 = 1 */
    assert_state(a, ia, want, N, 2, "sync momentum, step 2 (zero gradients)");
    gddr_client_close(&a);
    gddr_client_close(&b);
    stop_server(&s);
}
END_TEST

/* Momentum with a varying lr_eff (AdaDelay). server/apply.c folds each
 * push's own lr_eff into the velocity: v = mu v + lr_eff g; w -= v, so a
 * stale push is damped alone and the history keeps its step size
 * (docs/design.md section 5). The original design wrote v = mu v + G;
 * w -= lr_eff v instead, which would scale the whole velocity by the newest
 * push's staleness (docs/design-decisions.md, "lr inside the momentum
 * buffer"). The two agree whenever lr_eff is constant (test_momentum_exact).
 * This test pins what apply.c does; the expected vector under the original
 * formula is given alongside. */
START_TEST(test_momentum_with_adadelay)
{
    enum { N = 4 };
    gt_server s;
    START_SERVER(s, "lr=1", "adadelay=1", "momentum=0.5");
    gddr_client *c = open_client(s.endpoint, 0, 1);
    float w[N] = { 0 };
    int id;
    ck_assert_int_eq(gddr_register(c, "mada.w", w, N, &id, NULL), GDDR_OK);
    float g[N];
    fill(g, N, 8.0f);
    ck_assert_uint_eq(push_tagged(c, id, g, 0, 0, "fresh"), 1); /* v = 8, w = -8 */
    ck_assert_uint_eq(push_tagged(c, id, g, 0, 0, "tau 1"), 2); /* lr_eff = 1/2 */
    const float want_apply[N] = { -16, -16, -16, -16 };  /* v = 0.5*8 + 0.5*8 = 8 */
    /* The original formula: v = 0.5*8 + 8 = 12, w = -8 - 0.5*12 = -14. */
    assert_state(c, id, want_apply, N, 2, "momentum 0.5 with a push of tau 1, adadelay 1");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 7. DC-ASGD through the client ------------------------------------------ */

/* docs/design.md section 6 step 3 in double precision: g <- g + lam * h with
 * h = g*g*(w' - w_bak) (diag) or w' - w_bak (identity); adaptive:
 * ms <- decay ms + (1 - decay) g^2 (g before compensation),
 * lam = lam0 / sqrt(ms + eps). */
/* t: the client's t-th compensation (1, 2, ...): ms is bias-corrected by
 * 1 / (1 - decay^t) before use, as Adam does. */
static void dc_reference(double *g, const double *wnew, const double *wbak, double *ms, int n,
                         double lam0, int mode, int adaptive, double decay, int t)
{
    for (int i = 0; i < n; i++) {
        double d = wnew[i] - wbak[i], lam = lam0;
        if (adaptive) {
            ms[i] = decay * ms[i] + (1.0 - decay) * g[i] * g[i];
            lam = lam0 / sqrt(ms[i] / (1.0 - pow(decay, t)) + 1e-7);
        }
        g[i] += lam * (mode == GDDR_DC_DIAG ? g[i] * g[i] * d : d);
    }
}

/* Two gddr_step_from() calls of one worker on an async server (lr 0.5)
 * whose parameters moved since the gradient's parameters were pulled. */
static void dc_case(const char *ep, const char *key, int mode, int adaptive)
{
    enum { N = 4 };
    const double lr = 0.5, lam0 = 0.5, decay = 0.75;
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.dc_lambda = lam0;
    o.dc_mode = mode;
    o.dc_adaptive = adaptive;
    o.dc_ms_decay = decay;
    gddr_client *c = open_client_o(ep, 0, 1, o);
    char what[128], what1[160], what2[160];
    snprintf(what, sizeof what, "DC %s%s", mode == GDDR_DC_DIAG ? "diag" : "identity",
             adaptive ? " adaptive" : "");
    snprintf(what1, sizeof what1, "%s, step 1", what);
    snprintf(what2, sizeof what2, "%s, step 2", what);

    /* w0 (version 0) -> w_mid (1, which the client pulls) -> w1 (2). */
    const float w0[N] = { 0.5f, -1.0f, 2.0f, 0.0f };
    const float to_mid[N] = { -1.0f, 0.0f, 0.0f, -2.0f };  /* w_mid = (1, -1, 2, 1) */
    const float to_w1[N] = { -1.0f, 2.0f, 0.0f, -6.0f };   /* w1 = (1.5, -2, 2, 4) */
    const float w1[N] = { 1.5f, -2.0f, 2.0f, 4.0f };
    int id;
    ck_assert_int_eq(gddr_register(c, key, w0, N, &id, NULL), GDDR_OK);
    ck_assert_uint_eq(push_tagged(c, id, to_mid, 0, 0, what), 1);
    float mid[N];
    ck_assert_int_eq(gddr_pull(c, id, mid, 0, NULL), GDDR_OK); /* the client's last pull */
    ck_assert_uint_eq(push_tagged(c, id, to_w1, 1, 1, what), 2);

    /* Step 1: a gradient computed on w0 (version 0), not on the last pull. */
    const float g1[N] = { 1.0f, 2.0f, -1.0f, 0.5f };
    double gc[N], wn[N], wb[N], ms[N] = { 0 };
    for (int i = 0; i < N; i++) {
        gc[i] = g1[i];
        wn[i] = w1[i];
        wb[i] = w0[i];
    }
    dc_reference(gc, wn, wb, ms, N, lam0, mode, adaptive, decay, 1);
    if (!adaptive) {
        /* The reference against numbers worked out by hand (d = (1,-1,0,4)). */
        const double hand_diag[N] = { 1.5, 0.0, -1.0, 1.0 };
        const double hand_ident[N] = { 1.5, 1.5, -1.0, 2.5 };
        for (int i = 0; i < N; i++)
            ck_assert(gc[i] == (mode == GDDR_DC_DIAG ? hand_diag : hand_ident)[i]);
    } else {
        /* ms = 0.25 g^2, bias-corrected by 1/(1-0.75) = 4: g^2, so
         * lam = 0.5 / |g| (up to eps). */
        const double hand_diag[N] = { 1.5, 1.0, -1.0, 1.5 };
        const double hand_ident[N] = { 1.5, 1.75, -1.0, 4.5 };
        for (int i = 0; i < N; i++)
            ck_assert(fabs(gc[i] - (mode == GDDR_DC_DIAG ? hand_diag : hand_ident)[i]) < 1e-5);
    }
    double w2[N];
    for (int i = 0; i < N; i++)
        w2[i] = w1[i] - lr * gc[i];

    const float *grads[1] = { g1 };
    const float *on[1] = { w0 };
    const uint64_t vers[1] = { 0 };
    float params[N];
    float *out[1] = { params };
    int rc = gddr_step_from(c, grads, on, vers, out);
    ck_assert_msg(rc == GDDR_OK, "%s: step 1: %s (%s)", what, gddr_strerror(rc), gddr_client_errmsg(c));
    /* async with DC: the step hands back the parameters after its own push
     * (version 3), not the w' DC pulled before it (docs/design.md section 6
     * step 6; the original design said w', docs/design-decisions.md explains
     * why we pull again). */
    assert_close_floats(params, w2, N, adaptive ? 1e-5 : 0.0, "DC step 1 returns w after its push");
    uint64_t tv = 0;
    ck_assert_int_eq(gddr_tensor_version(c, id, &tv), GDDR_OK);
    ck_assert_uint_eq(tv, 3);
    float got[N];
    uint64_t v = 0;
    ck_assert_int_eq(gddr_pull(c, id, got, 0, &v), GDDR_OK);
    ck_assert_uint_eq(v, 3);
    assert_same_floats(got, params, N, "step 1's parameters are the server's");
    assert_close_floats(got, w2, N, adaptive ? 1e-5 : 0.0, what1);

    /* Step 2: computed on w1, the parameters step 1 handed back (version 2);
     * the server is at w2 (version 3). ms carries over from step 1. */
    const float g2[N] = { 2.0f, -2.0f, 1.0f, 1.0f };
    for (int i = 0; i < N; i++) {
        gc[i] = g2[i];
        wn[i] = (double)got[i];
        wb[i] = w1[i];
    }
    dc_reference(gc, wn, wb, ms, N, lam0, mode, adaptive, decay, 2);
    double w3[N];
    for (int i = 0; i < N; i++)
        w3[i] = (double)got[i] - lr * gc[i];
    const float *grads2[1] = { g2 };
    const float *on2[1] = { w1 };
    const uint64_t vers2[1] = { 2 };
    rc = gddr_step_from(c, grads2, on2, vers2, out);
    ck_assert_msg(rc == GDDR_OK, "%s: step 2: %s", what, gddr_strerror(rc));
    ck_assert_int_eq(gddr_pull(c, id, got, 0, &v), GDDR_OK);
    ck_assert_uint_eq(v, 4);
    assert_same_floats(params, got, N, "DC step 2 returns w after its push");
    assert_close_floats(got, w3, N, adaptive ? 1e-5 : 0.0, what2);
    if (mode == GDDR_DC_DIAG && !adaptive) {
        const float hand_w3[N] = { 0.5f, -1.0f, 1.875f, 3.125f };
        assert_same_floats(got, hand_w3, N, "DC diag step 2, by hand");
    }
    /* The pushes were compensated to the version DC pulled: tau 0. */
    gddr_client_counters k;
    ck_assert_int_eq(gddr_client_counters_get(c, &k), GDDR_OK);
    ck_assert_uint_eq(k.staleness_sum, 0);
    ck_assert_uint_eq(k.steps, 2);
    gddr_client_close(&c);
}

START_TEST(test_dc_asgd_through_client)
{
    gt_server s;
    START_SERVER(s, "lr=0.5", "chunk=2");
    dc_case(s.endpoint, "dc.diag", GDDR_DC_DIAG, 0);
    dc_case(s.endpoint, "dc.identity", GDDR_DC_IDENTITY, 0);
    dc_case(s.endpoint, "dc.diag.a", GDDR_DC_DIAG, 1);
    dc_case(s.endpoint, "dc.identity.a", GDDR_DC_IDENTITY, 1);
    gddr_client *c = open_client(s.endpoint, 1, 2);
    gddr_server_stats st = get_stats(c);
    ck_assert_uint_eq(st.staleness_max, 0);
    ck_assert_uint_eq(st.pushes, 4 * 4);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 8. clip_norm: one global norm over every tensor ------------------------ */

START_TEST(test_clip_norm_global)
{
    enum { N = 2 };
    gt_server s;
    START_SERVER(s, "lr=1");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.clip_norm = 2.0;
    gddr_client *c = open_client_o(s.endpoint, 0, 1, o);
    const float a0[N] = { 10, 20 }, b0[N] = { -10, 0 };
    int ia, ib;
    ck_assert_int_eq(gddr_register(c, "clip.a", a0, N, &ia, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c, "clip.b", b0, N, &ib, NULL), GDDR_OK);
    float pa[N], pb[N];
    float *out[2] = { pa, pb };
    /* Global norm 4 -> scale 1/2 for both (per-tensor clipping would scale
     * each by 1/sqrt(2)). */
    const float ga[N] = { 2, 2 }, gb[N] = { 2, -2 };
    const float *g[2] = { ga, gb };
    int rc = gddr_step(c, g, out);
    ck_assert_msg(rc == GDDR_OK, "step: %s (%s)", gddr_strerror(rc), gddr_client_errmsg(c));
    const float a1[N] = { 9, 19 }, b1[N] = { -11, 1 };
    assert_same_floats(pa, a1, N, "clip: tensor a after a step of global norm 4");
    assert_same_floats(pb, b1, N, "clip: tensor b after a step of global norm 4");
    /* Under the limit: untouched. */
    const float sa[N] = { 0.5f, 0 }, sb[N] = { 0, -0.5f };
    const float *g2[2] = { sa, sb };
    ck_assert_int_eq(gddr_step(c, g2, out), GDDR_OK);
    const float a2[N] = { 8.5f, 19 }, b2[N] = { -11, 1.5f };
    assert_same_floats(pa, a2, N, "clip: tensor a after a small step");
    assert_same_floats(pb, b2, N, "clip: tensor b after a small step");
    assert_state(c, ia, a2, N, 2, "clip: server a");
    assert_state(c, ib, b2, N, 2, "clip: server b");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 9. staleness statistics: per worker, EMA, alarm once per crossing ------ */

static int count_lines_with(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle))
            n++;
    fclose(f);
    return n;
}

START_TEST(test_staleness_per_worker_and_alarm)
{
    enum { N = 4 };
    /* The server's stderr goes to a file (the child inherits fd 2). */
    char logpath[] = "/tmp/gddr-test-alarm-XXXXXX";
    int lfd = mkstemp(logpath);
    ck_assert_int_ge(lfd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(lfd, 2);
    gt_server s;
    const char *sets[] = { "lr=1", "staleness_ema_decay=0.5", "staleness_alarm=2",
                           "log_level=info", NULL };
    char err[512] = "";
    int rc = gt_server_start(&s, sets, err, sizeof err);
    dup2(saved, 2);
    close(saved);
    close(lfd);
    if (rc != 0)
        unlink(logpath);
    ck_assert_msg(rc == 0, "cannot start gddr-ps: %s", err);

    gddr_client *c[2] = { open_client(s.endpoint, 0, 2), open_client(s.endpoint, 1, 2) };
    float w[N] = { 0 }, g[N] = { 0 };
    int id[2];
    ck_assert_int_eq(gddr_register(c[0], "st.w", w, N, &id[0], NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c[1], "st.w", w, N, &id[1], NULL), GDDR_OK);
    /* (worker, tau) in order; push k is applied at version k. EMA with
     * decay 1/2: 0, .5, 1.25, 2.125 (crosses 2), 3.0625, 1.53125 (back),
     * .765625, 3.8828125 (crosses again). */
    static const int who[8] = { 0, 1, 0, 1, 1, 0, 0, 1 };
    static const int tau[8] = { 0, 1, 2, 3, 4, 0, 0, 7 };
    double ema = 0;
    for (int k = 0; k < 8; k++) {
        uint64_t b = (uint64_t)(k - tau[k]);
        ck_assert_uint_eq(push_tagged(c[who[k]], id[who[k]], g, b, b, "stats"), (uint64_t)k + 1);
        ema = k ? 0.5 * ema + 0.5 * tau[k] : tau[k];
    }
    gddr_server_stats s0 = get_stats(c[0]), s1 = get_stats(c[1]);
    ck_assert_uint_eq(s0.pushes, 8);
    ck_assert_uint_eq(s0.worker_pushes, 4);
    ck_assert_uint_eq(s1.worker_pushes, 4);
    ck_assert_msg(s0.worker_staleness_mean == 0.5, "worker 0 mean tau %g, expected 0.5",
                  s0.worker_staleness_mean);
    ck_assert_msg(s1.worker_staleness_mean == 3.5 + 0.25, "worker 1 mean tau %g, expected 3.75",
                  s1.worker_staleness_mean);
    ck_assert_msg(s0.staleness_mean == 17.0 / 8.0, "global mean tau %g, expected 2.125",
                  s0.staleness_mean);
    ck_assert_uint_eq(s0.staleness_max, 7);
    ck_assert_msg(s0.staleness_ema == ema && ema == 3.8828125, "staleness EMA %.10g, expected %.10g",
                  s0.staleness_ema, ema);
    static const uint64_t hist[17] = { 3, 1, 1, 1, 1, 0, 0, 1 };
    for (int t = 0; t < 17; t++)
        ck_assert_msg(s1.staleness_hist[t] == hist[t], "staleness_hist[%d] = %" PRIu64
                      ", expected %" PRIu64, t, s1.staleness_hist[t], hist[t]);
    gddr_client_close(&c[0]);
    gddr_client_close(&c[1]);
    stop_server(&s);
    int up = count_lines_with(logpath, "crossed staleness_alarm");
    int down = count_lines_with(logpath, "back under staleness_alarm");
    unlink(logpath);
    ck_assert_msg(up == 2, "the alarm was logged %d times for 2 upward crossings", up);
    ck_assert_msg(down == 1, "the all-clear was logged %d times for 1 downward crossing", down);
}
END_TEST

/* ---- 10. the seed experiment through the real programs ---------------------- */

/* Starts gddr-ps with sets, runs one gddr-train --workload quadratic
 * against it with the extra flags, returns RESULT w=. */
static double seed_run(const char *const *sets, const char *const *extra, const char *what)
{
    gt_server s;
    char err[512] = "";
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s: gddr-ps: %s", what, err);
    char bin[512];
    gt_bin_path(bin, sizeof bin, "gddr-train");
    char *argv[32] = { bin, "--server", s.endpoint, "--rank", "0", "--world", "1", "--workload",
                       "quadratic", "--steps", "200", "--quiet", "--timeout-ms", "5000" };
    int a = 14;
    for (int i = 0; extra && extra[i]; i++)
        argv[a++] = (char *)extra[i];
    argv[a] = NULL;
    char *out = NULL;
    int st = 0;
    int rc = gt_run_capture(argv, 15000, 0, &out, &st, err, sizeof err);
    ck_assert_msg(rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: gddr-train: %s; output:\n%s",
                  what, err, out ? out : "");
    double w = NAN;
    ck_assert_msg(gt_result_double(out, "w", &w) == 0, "%s: no RESULT w= in:\n%s", what, out);
    free(out);
    stop_server(&s);
    return w;
}

START_TEST(test_seed_reproduction)
{
    /* f(w) = 0.5 (w-5)^2, w0 = 0, lr = 0.4, 200 steps, one worker. */
    const char *sync_sets[] = { "mode=sync", "workers=1", "lr=0.4", NULL };
    const char *async_sets[] = { "mode=async", "lr=0.4", NULL };
    const char *ada_sets[] = { "mode=async", "lr=0.4", "adadelay=0.5", NULL };
    const char *stale[] = { "--simulate-staleness", "5", NULL };
    const char *comp[] = { "--simulate-staleness", "5", "--dc-mode", "identity", "--dc-lambda", "1",
                           NULL };
    double w_sync = seed_run(sync_sets, NULL, "sync");
    double w_async = seed_run(async_sets, stale, "async, delay 5");
    double w_comp = seed_run(async_sets, comp, "async + compensation");
    double w_ada = seed_run(ada_sets, stale, "async + AdaDelay 0.5");
    fprintf(stderr, "consistency: seed table: sync %.6f, async %.1f, async+comp %.6f, async+adadelay %.6f\n",
            w_sync, w_async, w_comp, w_ada);
    ck_assert_msg(fabs(w_sync - 5.0) < 1e-3, "sync ended at w = %.6f, not 5", w_sync);
    ck_assert_msg(fabs(w_async - 5.0) > 100.0, "async with delay 5 ended at w = %.6f: it did not "
                  "diverge as in the seed", w_async);
    /* The seed's Python (float64) ends at -43876.48; float32 is close. */
    ck_assert_msg(fabs(w_async - -43876.484) < 0.01 * 43876.484,
                  "async with delay 5 ended at w = %.1f, the seed's Python at -43876.5", w_async);
    ck_assert_msg(fabs(w_comp - 5.0) < 1e-3, "async + compensation ended at w = %.6f", w_comp);
    ck_assert_msg(fabs(w_ada - 5.0) < 1e-3, "async + AdaDelay ended at w = %.6f", w_ada);
}
END_TEST

/* gddr-train --simulate-staleness D computes step s's gradient on the
 * parameters of step s-D. With DC-ASGD on, the delay must stay D: a
 * compensation too small to matter (identity, lambda 1e-20) must give the
 * plain async trajectory. (The seed's compensation row cannot show this:
 * identity compensation with lambda 1 is exact on a quadratic of unit
 * curvature whatever the delay.) */
START_TEST(test_simulate_staleness_with_dc_keeps_delay)
{
    const char *async_sets[] = { "mode=async", "lr=0.4", NULL };
    const char *stale[] = { "--simulate-staleness", "5", "--steps", "40", NULL };
    const char *stale_dc0[] = { "--simulate-staleness", "5", "--steps", "40", "--dc-mode",
                                "identity", "--dc-lambda", "1e-20", NULL };
    double w_plain = seed_run(async_sets, stale, "async, delay 5, 40 steps");
    double w_dc0 = seed_run(async_sets, stale_dc0, "async, delay 5, 40 steps, DC lambda 1e-20");
    /* The seed's Python after 40 steps: delay 5 -> -23.71456, delay 6 -> -37.4592. */
    ck_assert_msg(fabs(w_plain - -23.71456) < 1e-3, "plain async, delay 5, 40 steps: w = %.6f, "
                  "the seed's Python gives -23.71456", w_plain);
    ck_assert_msg(fabs(w_dc0 - w_plain) < 1e-3,
                  "with DC on (lambda 1e-20) --simulate-staleness 5 ended at w = %.6f, without DC "
                  "at %.6f (delay 6 would give -37.4592)", w_dc0, w_plain);
}
END_TEST

/* ---- 11. scripts/experiment-staleness.sh --quick ----------------------------- */

/* Splits a markdown table row "| a | b | ... |" into trimmed cells, in
 * place. Returns the number of cells. */
static int md_cells(char *line, char **cells, int max)
{
    int n = 0;
    char *p = line[0] == '|' ? line + 1 : line;
    while (*p && n < max) {
        char *bar = strchr(p, '|');
        if (!bar)
            break;
        *bar = 0;
        while (*p == ' ')
            p++;
        char *e = p + strlen(p);
        while (e > p && e[-1] == ' ')
            *--e = 0;
        cells[n++] = p;
        p = bar + 1;
    }
    return n;
}

/* experiment-staleness.sh --quick prints each mode's row once; sync
 * measures no staleness; the plain modes learn the easy set. */
START_TEST(test_staleness_experiment_rows)
{
    char *argv[] = { "/bin/bash", "scripts/experiment-staleness.sh", "--quick", NULL };
    char *out = NULL, err[512] = "";
    int st = 0;
    int64_t t0 = gt_now_ms();
    int rc = gt_run_capture(argv, 80000, 1, &out, &st, err, sizeof err);
    int64_t ms = gt_now_ms() - t0;
    ck_assert_msg(rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "experiment-staleness.sh --quick: %s (status %d); output:\n%s", err,
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1, out ? out : "");
    fprintf(stderr, "consistency: experiment-staleness.sh --quick took %lld ms\n", (long long)ms);
    static const char *const rows[] = { "sync", "async", "async+AdaDelay 0.5",
                                        "async+DC-ASGD lam=0.04", "async+DC-ASGD-a lam0=2",
                                        "ssp s=2", "hybrid (async->sync)" };
    int seen[7] = { 0 };
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] != '|' || strncmp(line, "| run", 5) == 0 || strncmp(line, "|---", 4) == 0)
            continue;
        char *cell[9];
        int n = md_cells(line, cell, 9);
        ck_assert_msg(n == 8, "table row with %d cells: %s", n, line);
        int r = -1;
        for (int i = 0; i < 7; i++)
            if (strcmp(cell[0], rows[i]) == 0)
                r = i;
        ck_assert_msg(r >= 0, "unexpected row '%s'", cell[0]);
        seen[r]++;
        /* run | server acc | workers' acc [range] | loss | mean tau | max tau | wall | MB */
        double tau_mean = atof(cell[4]), bytes = atof(cell[7]);
        ck_assert_msg(bytes > 0, "row %s moved %g MB", cell[0], bytes);
        if (r == 0)
            ck_assert_msg(strcmp(cell[4], "0.00") == 0 && strcmp(cell[5], "0") == 0,
                          "sync row measured staleness %s / %s", cell[4], cell[5]);
        /* (Whether async rows see staleness depends on how the workers
         * overlap on a busy machine: 20 steps each may not overlap at all.) */
        ck_assert_msg(tau_mean >= 0 && (r != 0 || tau_mean == 0), "row %s: mean tau %s", cell[0],
                      cell[4]);
        if (r <= 2 || r == 5) { /* these must not diverge on the easy synthetic set */
            double acc = atof(cell[1]), wacc = atof(cell[2]);
            ck_assert_msg(acc > 0.5 && acc <= 1.0, "row %s: server's accuracy %s", cell[0], cell[1]);
            ck_assert_msg(wacc > 0.5 && wacc <= 1.0, "row %s: workers' accuracy %s", cell[0], cell[2]);
        }
    }
    for (int i = 0; i < 7; i++)
        ck_assert_msg(seen[i] == 1, "row '%s' appears %d times in:\n%s", rows[i], seen[i], out);
    free(out);
}
END_TEST

/* ---- suite --------------------------------------------------------------------- */

#define ADD_CASE GT_ADD_CASE

Suite *suite_consistency(void)
{
    Suite *s = suite_create("consistency");
    ADD_CASE(s, "sync_version_per_step", test_sync_one_version_per_step, TCASE_TIMEOUT);
    ADD_CASE(s, "sync_quorum_folding", test_sync_quorum_folds_late_pushes, TCASE_TIMEOUT);
    ADD_CASE(s, "sync_adadelay_folded", test_sync_adadelay_scales_folded_push, TCASE_TIMEOUT);
    ADD_CASE(s, "sync_place_rule", test_sync_place_rule, TCASE_TIMEOUT);
    ADD_CASE(s, "ssp_bound", test_ssp_holds_fast_worker, TCASE_TIMEOUT);
    ADD_CASE(s, "hybrid_switch", test_hybrid_switches_at_warmup, TCASE_TIMEOUT);
    ADD_CASE(s, "adadelay_exact", test_adadelay_exact, TCASE_TIMEOUT);
    ADD_CASE(s, "momentum_exact", test_momentum_exact, TCASE_TIMEOUT);
    ADD_CASE(s, "momentum_adadelay", test_momentum_with_adadelay, TCASE_TIMEOUT);
    ADD_CASE(s, "dc_asgd", test_dc_asgd_through_client, TCASE_TIMEOUT);
    ADD_CASE(s, "clip_norm", test_clip_norm_global, TCASE_TIMEOUT);
    ADD_CASE(s, "staleness_stats", test_staleness_per_worker_and_alarm, TCASE_TIMEOUT);
    ADD_CASE(s, "seed_reproduction", test_seed_reproduction, TCASE_TIMEOUT);
    ADD_CASE(s, "simulate_staleness_dc", test_simulate_staleness_with_dc_keeps_delay, TCASE_TIMEOUT);
    ADD_CASE(s, "staleness_experiment_rows", test_staleness_experiment_rows, 90);
    return s;
}
