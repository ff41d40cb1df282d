/* check_optim.c -- the server's optimizers and fill, against a real gddr-ps.
 *
 *   fill_exact            held chunks in a sync step count as the mean of
 *                         those who sent them; the credit comes off when the
 *                         holder sends; the sum is exact (and without fill,
 *                         or without Push.held, the old arithmetic)
 *   fill_survives_restart the credits are in the checkpoint and carry on
 *   flush_joins_step      a closing worker's flush adds to the last step, no
 *                         momentum coasting over the flushed chunks
 *   momentum_fill_converges  GDDR (alpha 0.4) with momentum 0.9 on a stiff
 *                         quadratic converges like dense with fill, and does
 *                         not without it
 *   optimizers_match_reference  adam, adamw, adagrad, sgd+weight decay,
 *                         async and sync, against the formulas computed here
 *   register_optimizer    per-tensor optimizers: chosen at registration,
 *                         reported back, a contradiction refused
 *   push_lr               a push's own lr (gddr_set_lr) replaces the tensor's
 *   fresh_fill_normalising  adagrad (as adam, adamw): a held chunk is
 *                         filled with the mean of the fresh pushes only (not
 *                         the releases), no fill when none is fresh; which
 *                         holds are open survives a restart
 *   fill_bound_fits_workers  the default max_fill_bytes holds every
 *                         expected worker's fill state and the fresh sums
 *                         of a 4 MiB tensor (no worker is left without fill)
 *   async_adam_fill       async adam: a chunk a push holds back is stepped
 *                         with m-hat (async_fill = moment), credited, and
 *                         the credit comes off when the chunk is sent (not
 *                         with fill_held off, nor for sgd, nor under recent
 *                         with one worker)
 *   async_fill_recent     async adam, two workers: a held chunk is stepped
 *                         with the last fresh push of it from another
 *                         worker (async_fill = recent), each such push
 *                         once per holder, else not at all; a release
 *                         does not become the estimate, and the credits
 *                         come off exactly; one worker's own pushes never
 *                         stand in for its held chunks; async_fill =
 *                         moment keeps m-hat; when an async warm-up ends,
 *                         the first sync step's fill is the fresh mean of
 *                         that step alone; after a SIGHUP switches
 *                         async_fill, no values from before stand in
 */
#define _GNU_SOURCE
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ps.h"
#include "table_int.h"
#include "files.h"
#include "harness.h"
#include "wirekit.h"

#define WAIT_MS 20000

/* A push through the wire: bitmap (NULL dense), Push.held, Push.flush. */
static void raw_push_full(raw_conn *r, uint32_t id, const float *vals, size_t nvals, const uint8_t *bm,
                          size_t bmlen, int held, int flush, uint64_t version)
{
    raw_push_send(r, id, vals, nvals, version, ++r->step, 1.0f, bm, bmlen, held, flush);
    Gddr__Reply *rep = raw_recv(r, WAIT_MS, NULL);
    ck_assert_msg(rep && rep->body_case == GDDR__REPLY__BODY_PUSH, "push of rank %u: %s", r->rank,
                  rep && rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "no reply");
    gddr__reply__free_unpacked(rep, NULL);
}

/* Registers key (n zeros) through the wire; returns its id. */
static uint32_t raw_register(raw_conn *r, const char *key, size_t n)
{
    float *z = calloc(n, 4);
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__InitTensor in = GDDR__INIT_TENSOR__INIT;
    raw_request(r, &rq);
    in.key = (char *)key;
    in.n = n;
    in.payload_bytes = n * 4;
    rq.body_case = GDDR__REQUEST__BODY_INIT;
    rq.init = &in;
    gddr__raw raw = { z, n * 4, NULL, NULL };
    ck_assert(gddr__send(r->sock, NULL, &rq.base, &raw, 1) >= 0);
    Gddr__Reply *rep = raw_recv(r, WAIT_MS, NULL);
    ck_assert_msg(rep && rep->body_case == GDDR__REPLY__BODY_INIT, "register %s", key);
    uint32_t id = rep->init->id;
    gddr__reply__free_unpacked(rep, NULL);
    free(z);
    return id;
}

static void assert_near(const float *got, const float *want, size_t n, float tol, const char *what)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i])),
                      "%s: element %zu is %.9g, expected %.9g", what, i, (double)got[i], (double)want[i]);
}

/* ---- fill ------------------------------------------------------------------------ */

enum { FN = 8 }; /* two chunks of 4 */
static const float FA0[4] = { 1, 2, 3, 4 };                  /* worker 0, step A: chunk 0 only */
static const float FB[FN] = { 10, 20, 30, 40, 5, 6, 7, 8 };  /* worker 1, step A: dense */
static const float FC[FN] = { 1, 1, 1, 1, 6, 8, 10, 12 };   /* worker 0, step B: its held chunk 1 + fresh */
static const float FD[FN] = { 1, 1, 1, 1, 2, 2, 2, 2 };     /* worker 1, step B */

static void fill_step_a(raw_conn *w0, raw_conn *w1, uint32_t id, int held)
{
    uint8_t bm = 0x01;
    raw_push_full(w0, id, FA0, 4, &bm, 1, held, 0, 0);
    raw_push_full(w1, id, FB, FN, NULL, 0, 0, 0, 0);
}

static void fill_step_b(raw_conn *w0, raw_conn *w1, uint32_t id)
{
    raw_push_full(w0, id, FC, FN, NULL, 0, 0, 0, 1);
    raw_push_full(w1, id, FD, FN, NULL, 0, 0, 0, 1);
}

/* After step A with fill: chunk 0 the mean of both, chunk 1 the mean of the
 * one that sent it (worker 1). */
static const float FILL_A[FN] = { -5.5f, -11, -16.5f, -22, -5, -6, -7, -8 };
/* After step B: worker 0's chunk 1 less its credit (FB's chunk 1) joins
 * worker 1's; the sum over both steps is every gradient / 2, exactly. */
static const float FILL_B[FN] = { -6.5f, -12, -17.5f, -23, -6.5f, -8, -9.5f, -11 };

static void fill_case(const char *fill, int held, const float *want_a, const char *what)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "lr=1", "chunk=4", fill);
    raw_conn w0, w1;
    raw_open(&w0, s.endpoint);
    raw_open(&w1, s.endpoint);
    raw_hello(&w0, 0, 2);
    raw_hello(&w1, 1, 2);
    uint32_t id = raw_register(&w0, "f", FN);
    fill_step_a(&w0, &w1, id, held);
    float w[FN];
    server_values_within(s.endpoint, "f", w, FN, 1, WAIT_MS);
    assert_same_floats(w, want_a, FN, what);
    if (want_a == FILL_A) {
        fill_step_b(&w0, &w1, id);
        server_values_within(s.endpoint, "f", w, FN, 2, WAIT_MS);
        assert_same_floats(w, FILL_B, FN, "fill, step B (credit taken off)");
    }
    raw_close(&w0);
    raw_close(&w1);
    stop_server(&s);
}

START_TEST(test_fill_exact)
{
    static const float nofill[FN] = { -5.5f, -11, -16.5f, -22, -2.5f, -3, -3.5f, -4 };
    fill_case("fill_held=true", 1, FILL_A, "fill, step A");
    /* Without fill, or from a push that does not say its absent chunks are
     * held, an absent chunk is a zero of the step. */
    fill_case("fill_held=false", 1, nofill, "fill_held = false, step A");
    fill_case("fill_held=true", 0, nofill, "a sparse push without Push.held, step A");
}
END_TEST

START_TEST(test_fill_survives_restart)
{
    char dir[] = "/tmp/gddr-test-fill-XXXXXX", set[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(set, sizeof set, "checkpoint_dir=%s", dir);
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "lr=1", "chunk=4", "checkpoint_interval_s=0", set);
    raw_conn w0, w1;
    raw_open(&w0, s.endpoint);
    raw_open(&w1, s.endpoint);
    w0.session = 0x1111; /* sessions of their own: the same workers after the restart */
    w1.session = 0x2222;
    raw_hello(&w0, 0, 2);
    raw_hello(&w1, 1, 2);
    uint32_t id = raw_register(&w0, "f", FN);
    fill_step_a(&w0, &w1, id, 1);
    float w[FN];
    server_values_within(s.endpoint, "f", w, FN, 1, WAIT_MS);
    stop_server(&s); /* SIGTERM writes the final checkpoint */
    gddr_ckpt c;
    char err[256];
    ck_assert_int_eq(gddr__ckpt_load_newest(dir, &c, err, sizeof err), GDDR_OK);
    const gddr_ckpt_section *sec = gddr__ckpt_find(&c, "fill/0/0");
    ck_assert_msg(sec && sec->len == 16 + FN * 4 + 2 + 2, "no fill credits of worker 0 in %s", c.path);
    float cred[FN];
    memcpy(cred, (const char *)sec->data + 16, sizeof cred);
    const float want[FN] = { 0, 0, 0, 0, 5, 6, 7, 8 }; /* what was filled in for its chunk 1 */
    assert_same_floats(cred, want, FN, "worker 0's credits in the checkpoint");
    gddr__ckpt_free(&c);

    START_SERVER(s, "mode=sync", "workers=2", "lr=1", "chunk=4", "checkpoint_interval_s=0", set);
    uint64_t step0 = w0.step, step1 = w1.step;
    raw_close(&w0);
    raw_close(&w1);
    raw_open(&w0, s.endpoint);
    raw_open(&w1, s.endpoint);
    w0.session = 0x1111, w0.step = step0;
    w1.session = 0x2222, w1.step = step1;
    raw_hello(&w0, 0, 2);
    raw_hello(&w1, 1, 2);
    id = raw_register(&w0, "f", FN);
    fill_step_b(&w0, &w1, id);
    server_values_within(s.endpoint, "f", w, FN, 2, WAIT_MS);
    assert_same_floats(w, FILL_B, FN, "fill across a restart, step B");
    raw_close(&w0);
    raw_close(&w1);
    stop_server(&s);
    gt_rm_rf(dir);
}
END_TEST

/* ---- fill from fresh pushes (adam, adamw, adagrad) ------------------------------- */

enum { XN = 8 }; /* two chunks of 4; chunk 0 is always sent by everyone (its step mean is 2) */

/* One worker's push: chunk 0 = c0, chunk 1 = c1 (sent) or held. */
static void x_push(raw_conn *r, uint32_t id, float c0, const float *c1)
{
    float v[XN] = { c0, c0, c0, c0 };
    if (c1) {
        memcpy(v + 4, c1, 4 * sizeof(float));
        raw_push_full(r, id, v, XN, NULL, 0, 1, 0, 0);
    } else {
        uint8_t bm = 0x01;
        raw_push_full(r, id, v, 4, &bm, 1, 1, 0, 0);
    }
}

/* adagrad, lr, eps 1e-8: the expected values after the steps' mean
 * gradients d (chunk 1's four values; chunk 0's are 2). */
static void x_adagrad(double *w, double *G, const double d1[4], double lr)
{
    for (int i = 0; i < XN; i++) {
        double d = i < 4 ? 2.0 : d1[i - 4];
        G[i] += d * d;
        w[i] -= lr * d / (sqrt(G[i]) + 1e-8);
    }
}

static void x_expect(const char *ep, const double *want, uint64_t v, const char *what)
{
    float w[XN], f[XN];
    server_values_within(ep, "x", w, XN, v, WAIT_MS);
    for (int i = 0; i < XN; i++)
        f[i] = (float)want[i];
    assert_near(w, f, XN, 1e-5f, what);
}

/* Worker r's chunk-1 credits and open holds in the checkpoint in dir. */
static void x_fill_state(const char *dir, int r, float cred[4], uint8_t open[2])
{
    gddr_ckpt c;
    char err[256], name[32];
    ck_assert_int_eq(gddr__ckpt_load_newest(dir, &c, err, sizeof err), GDDR_OK);
    snprintf(name, sizeof name, "fill/%d/0", r);
    const gddr_ckpt_section *sec = gddr__ckpt_find(&c, name);
    ck_assert_msg(sec && sec->len == 16 + XN * 4 + 2 + 2, "no %s (credits and open holds) in %s", name,
                  c.path);
    memcpy(cred, (const char *)sec->data + 16 + 16, 4 * sizeof(float));
    memcpy(open, (const char *)sec->data + 16 + XN * 4 + 2, 2);
    gddr__ckpt_free(&c);
}

START_TEST(test_fresh_fill_normalising)
{
    char dir[] = "/tmp/gddr-test-xfill-XXXXXX", set[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(set, sizeof set, "checkpoint_dir=%s", dir);
    const double lr = 0.5;
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=3", "kind=adagrad", "lr=0.5", "chunk=4",
                 "checkpoint_interval_s=0", set);
    raw_conn w[3];
    for (int r = 0; r < 3; r++) {
        raw_open(&w[r], s.endpoint);
        w[r].session = 0x100 + (uint64_t)r; /* the same workers after the restart */
        raw_hello(&w[r], (uint32_t)r, 3);
    }
    uint32_t id = raw_register(&w[0], "x", XN);
    double want[XN] = { 0 }, G[XN] = { 0 };

    /* A: worker 0 holds chunk 1; 1 and 2 are fresh: the fill is their mean
     * (5.5 11 16.5 22), credited to worker 0. */
    static const float a1[4] = { 10, 20, 30, 40 }, a2[4] = { 1, 2, 3, 4 };
    x_push(&w[0], id, 1, NULL), x_push(&w[1], id, 2, a1), x_push(&w[2], id, 3, a2);
    x_adagrad(want, G, (const double[4]){ 5.5, 11, 16.5, 22 }, lr);
    x_expect(s.endpoint, want, 1, "step A: the holder filled with the fresh mean");

    /* B: worker 0 releases chunk 1 (7 each, net 7 - credit = 1.5 -4 -9.5
     * -15), worker 1 holds it, worker 2 is fresh (100 200 300 400). The
     * fill is worker 2's alone (the carriers' mean, 50.75 98 ..., would
     * bounce worker 0's deviation back through worker 1's credit). */
    static const float b0[4] = { 7, 7, 7, 7 }, b2[4] = { 100, 200, 300, 400 };
    x_push(&w[0], id, 1, b0), x_push(&w[1], id, 2, NULL), x_push(&w[2], id, 3, b2);
    x_adagrad(want, G, (const double[4]){ (1.5 + 200) / 3, (-4 + 400) / 3.0, (-9.5 + 600) / 3, (-15 + 800) / 3.0 },
              lr);
    x_expect(s.endpoint, want, 2, "step B: the fill is the fresh push's, not the release's");

    /* C: worker 1 releases (50 each, net -50 -150 -250 -350), 0 and 2 hold:
     * no fresh push, so no fill -- their credits stay 0, their holds open. */
    static const float c1[4] = { 50, 50, 50, 50 };
    x_push(&w[0], id, 1, NULL), x_push(&w[1], id, 2, c1), x_push(&w[2], id, 3, NULL);
    x_adagrad(want, G, (const double[4]){ -50.0 / 3, -150.0 / 3, -250.0 / 3, -350.0 / 3 }, lr);
    x_expect(s.endpoint, want, 3, "step C: no fresh push, no fill");
    stop_server(&s); /* SIGTERM writes the final checkpoint */
    static const float zero[4] = { 0 };
    const uint8_t open_want[3][2] = { { 0, 1 }, { 0, 0 }, { 0, 1 } };
    for (int r = 0; r < 3; r++) {
        float cred[4];
        uint8_t open[2];
        char what[64];
        x_fill_state(dir, r, cred, open);
        snprintf(what, sizeof what, "worker %d's chunk-1 credit after step C", r);
        assert_same_floats(cred, zero, 4, what);
        ck_assert_msg(open[0] == open_want[r][0] && open[1] == open_want[r][1],
                      "worker %d's open holds in the checkpoint: %u %u, expected %u %u", r, open[0], open[1],
                      open_want[r][0], open_want[r][1]);
    }

    /* D, after a restart: 0 and 2 release (9 and 5), 1 holds. Both are
     * releases (the open holds came back from the checkpoint), so again no
     * fill: chunk 1's step is (9 + 5) / 3, not (9 + 5 + 7) / 3. */
    START_SERVER(s, "mode=sync", "workers=3", "kind=adagrad", "lr=0.5", "chunk=4",
                 "checkpoint_interval_s=0", set);
    for (int r = 0; r < 3; r++) {
        uint64_t step = w[r].step;
        raw_close(&w[r]);
        raw_open(&w[r], s.endpoint);
        w[r].session = 0x100 + (uint64_t)r, w[r].step = step;
        raw_hello(&w[r], (uint32_t)r, 3);
    }
    id = raw_register(&w[0], "x", XN);
    static const float d0[4] = { 9, 9, 9, 9 }, d2[4] = { 5, 5, 5, 5 };
    x_push(&w[0], id, 1, d0), x_push(&w[1], id, 2, NULL), x_push(&w[2], id, 3, d2);
    x_adagrad(want, G, (const double[4]){ 14.0 / 3, 14.0 / 3, 14.0 / 3, 14.0 / 3 }, lr);
    x_expect(s.endpoint, want, 4, "step D after a restart: releases stay releases");
    for (int r = 0; r < 3; r++)
        raw_close(&w[r]);
    stop_server(&s);
    gt_rm_rf(dir);
}
END_TEST

START_TEST(test_fill_bound_fits_workers)
{
    enum { BN = 1 << 20, BC = 1 << 16, BCHUNKS = BN / BC };
    char dir[] = "/tmp/gddr-test-fbound-XXXXXX", set[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(set, sizeof set, "checkpoint_dir=%s", dir);
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=3", "kind=adam", "chunk=65536", "checkpoint_interval_s=0", set);
    float *v = calloc(BN, sizeof(float));
    for (size_t i = 0; i < BN; i++)
        v[i] = 0.001f * (float)(i % 97);
    raw_conn w[3];
    uint32_t id = 0;
    for (int r = 0; r < 3; r++) {
        raw_open(&w[r], s.endpoint);
        raw_hello(&w[r], (uint32_t)r, 3);
        if (r == 0)
            id = raw_register(&w[0], "big", BN);
    }
    /* Each worker holds back a chunk of its own (r), so each needs fill. */
    for (int r = 0; r < 3; r++) {
        uint8_t bm[BCHUNKS / 8] = { 0xff, 0xff };
        bm[0] = (uint8_t)(0xff & ~(1u << r));
        raw_push_full(&w[r], id, v, BN - BC, bm, sizeof bm, 1, 0, 0);
    }
    float *got = malloc(BN * sizeof(float));
    server_values_within(s.endpoint, "big", got, BN, 1, WAIT_MS);
    free(got);
    for (int r = 0; r < 3; r++)
        raw_close(&w[r]);
    stop_server(&s);
    gddr_ckpt c;
    char err[256];
    ck_assert_int_eq(gddr__ckpt_load_newest(dir, &c, err, sizeof err), GDDR_OK);
    for (int r = 0; r < 3; r++) {
        char name[32];
        snprintf(name, sizeof name, "fill/%d/0", r);
        ck_assert_msg(gddr__ckpt_find(&c, name) != NULL,
                      "worker %d has no fill state with the default max_fill_bytes (it was left "
                      "without fill)", r);
    }
    gddr__ckpt_free(&c);
    free(v);
    gt_rm_rf(dir);
}
END_TEST

/* sync, momentum 0.9, lr 1, one worker: a step of g = 1 makes v = 1, w = -1;
 * a flush of 2 joins it: v = 3, w = -3 (as its own step it would coast:
 * v = 0.9 + 2, w = -3.9); the next step of g = 0 moves w by 0.9 * 3. */
START_TEST(test_flush_joins_step)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=1", "lr=1", "momentum=0.9");
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 0, 1);
    uint32_t id = raw_register(&r, "j", 1);
    float one = 1, two = 2, zero = 0, w;
    raw_push_full(&r, id, &one, 1, NULL, 0, 0, 0, 0);
    server_values_within(s.endpoint, "j", &w, 1, 1, WAIT_MS);
    ck_assert_msg(w == -1.0f, "after the step w = %.9g", (double)w);
    raw_push_full(&r, id, &two, 1, NULL, 0, 0, 1, 1);
    server_values_within(s.endpoint, "j", &w, 1, 2, WAIT_MS);
    ck_assert_msg(fabsf(w - -3.0f) < 1e-6f, "after the flush w = %.9g, expected -3 (a flush that coasts: -3.9)",
                  (double)w);
    raw_push_full(&r, id, &zero, 1, NULL, 0, 0, 0, 2);
    server_values_within(s.endpoint, "j", &w, 1, 3, WAIT_MS);
    ck_assert_msg(fabsf(w - -5.7f) < 1e-5f, "after a zero step w = %.9g, expected -5.7", (double)w);
    raw_close(&r);
    stop_server(&s);
}
END_TEST

/* ---- momentum and GDDR on a stiff quadratic ---------------------------------------- */

enum { QN = 2048, QW = 4, QSTEPS = 200 };

typedef struct qworker {
    const char *ep;
    int rank, rc;
    gddr_client *c;
} qworker;

/* f(w) = sum h_i (w_i - 1)^2 / 2 with lr*h up to 0.5: heavy-ball with mu 0.9
 * converges (stable to lr*h < 3.8), while a gradient a step late on part of
 * the chunks is unstable beyond lr*h ~ 0.2. */
static float q_h(size_t i)
{
    return 0.1f + 4.9f * (float)(i % 97) / 96.0f;
}

static void *q_main(void *arg)
{
    qworker *a = arg;
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = a->ep;
    o.rank = a->rank;
    o.world_size = QW;
    o.timeout_ms = 30000;
    o.delay_fraction = 0.4;
    a->rc = gddr_client_open(&o, &a->c);
    float *w = calloc(QN, 4), *g = calloc(QN, 4);
    int id;
    if (a->rc == GDDR_OK)
        a->rc = gddr_register(a->c, "q", w, QN, &id, NULL);
    const float *gp[1] = { g };
    float *wp[1] = { w };
    for (int s = 0; s < QSTEPS && a->rc == GDDR_OK; s++) {
        for (size_t i = 0; i < QN; i++)
            g[i] = q_h(i) * (w[i] - 1.0f);
        a->rc = gddr_step(a->c, gp, wp);
    }
    free(w), free(g);
    return NULL;
}

/* Trains QW GDDR workers and returns the largest |w - 1| of the server's
 * model after they closed (INFINITY when a step failed: a gradient went
 * non-finite). */
static double q_run(const char *fill)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=4", "lr=0.1", "momentum=0.9", "chunk=128",
                 "tau_dynamic=false", "tau_init=4", fill);
    qworker a[QW];
    pthread_t th[QW];
    for (int r = 0; r < QW; r++) {
        a[r] = (qworker){ s.endpoint, r, 0, NULL };
        ck_assert_int_eq(pthread_create(&th[r], NULL, q_main, &a[r]), 0);
    }
    int failed = 0;
    for (int r = 0; r < QW; r++) {
        pthread_join(th[r], NULL);
        failed |= a[r].rc != GDDR_OK;
    }
    for (int r = 0; r < QW; r++)
        gddr_client_close(&a[r].c);
    double worst = INFINITY;
    if (!failed) {
        float *w = malloc(QN * 4);
        server_values_within(s.endpoint, "q", w, QN, QSTEPS, WAIT_MS);
        worst = 0;
        for (size_t i = 0; i < QN; i++)
            worst = fmax(worst, isfinite(w[i]) ? fabs(w[i] - 1.0) : INFINITY);
        free(w);
    }
    stop_server(&s);
    return worst;
}

START_TEST(test_momentum_fill_converges)
{
    double with = q_run("fill_held=true"), without = q_run("fill_held=false");
    printf("optim: GDDR alpha 0.4, momentum 0.9, stiff quadratic, %d steps: max |w - 1| %.3g with fill, "
           "%.3g without\n", QSTEPS, with, without);
    ck_assert_msg(with < 1e-3, "with fill the server's model is %.3g from the optimum", with);
    ck_assert_msg(without > 0.1, "without fill it converged too (%.3g): this test proves nothing", without);
}
END_TEST

/* ---- optimizers -------------------------------------------------------------------- */

enum { ON = 300, OSTEPS = 6 };

static float o_grad(int step, size_t i)
{
    return 0.3f * sinf(0.7f * (float)i + (float)step) + 0.01f * (float)step;
}

/* The reference: what optim.c's formulas give, in the same float order.
 * kind as the wire's OptimizerKind. */
static void o_reference(int kind, float lr, float mu, float wd, float *w)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float m[ON] = { 0 }, v[ON] = { 0 };
    for (size_t i = 0; i < ON; i++)
        w[i] = 0.5f - 0.001f * (float)i;
    for (int k = 1; k <= OSTEPS; k++) {
        float bc1 = (float)(1.0 / (1.0 - pow(0.9, k))), bc2 = (float)(1.0 / (1.0 - pow(0.999, k)));
        for (size_t i = 0; i < ON; i++) {
            float d = 1.0f * o_grad(k - 1, i);
            switch (kind) {
            case 0:
                d += wd * w[i];
                m[i] = mu * m[i] + lr * d;
                w[i] = w[i] - m[i];
                break;
            case 1:
            case 2: {
                if (kind == 1)
                    d += wd * w[i];
                m[i] = b1 * m[i] + (1.0f - b1) * d;
                v[i] = b2 * v[i] + (1.0f - b2) * (d * d);
                float st = (m[i] * bc1) / (sqrtf(v[i] * bc2) + eps);
                if (kind == 2)
                    st += wd * w[i];
                w[i] = w[i] - lr * st;
                break;
            }
            case 3:
                d += wd * w[i];
                m[i] += d * d;
                w[i] = w[i] - lr * d / (sqrtf(m[i]) + 1e-10f);
                break;
            }
        }
    }
}

static void o_case(const char *mode, const char *spec, int kind, float lr, float mu, float wd)
{
    gt_server s;
    START_SERVER(s, mode, "workers=1", "lr=0.5");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w[ON], want[ON], g[ON];
    for (size_t i = 0; i < ON; i++)
        w[i] = 0.5f - 0.001f * (float)i;
    int id;
    ck_assert_msg(gddr_register_opt(c, "o", w, ON, spec, &id, NULL) == GDDR_OK, "%s: %s", spec,
                  gddr_client_errmsg(c));
    const float *gp[1] = { g };
    float *wp[1] = { w };
    for (int k = 0; k < OSTEPS; k++) {
        for (size_t i = 0; i < ON; i++)
            g[i] = o_grad(k, i);
        ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
    }
    o_reference(kind, lr, mu, wd, want);
    char what[160];
    snprintf(what, sizeof what, "%s, %s", spec, mode);
    assert_near(w, want, ON, 2e-6f, what);
    gddr_client_close(&c);
    stop_server(&s);
}

START_TEST(test_optimizers_match_reference)
{
    const char *modes[] = { "mode=async", "mode=sync" };
    for (int m = 0; m < 2; m++) {
        o_case(modes[m], "adam lr=0.01 weight_decay=0.01", 1, 0.01f, 0, 0.01f);
        o_case(modes[m], "adamw lr=0.01 weight_decay=0.1", 2, 0.01f, 0, 0.1f);
        o_case(modes[m], "adagrad lr=0.05", 3, 0.05f, 0, 0);
        o_case(modes[m], "sgd lr=0.1 momentum=0.9 weight_decay=0.01", 0, 0.1f, 0.9f, 0.01f);
        o_case(modes[m], "sgd", 0, 0.5f, 0, 0); /* lr 0: the server's */
    }
}
END_TEST

START_TEST(test_register_optimizer)
{
    gt_server s;
    START_SERVER(s, "kind=adam", "lr=0.002", "beta2=0.99");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w[4] = { 0 };
    int a, b;
    char text[256];
    ck_assert_int_eq(gddr_register(c, "default", w, 4, &a, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_tensor_optimizer(c, a, text, sizeof text), GDDR_OK);
    ck_assert_str_eq(text, "adam lr=0.002 beta1=0.9 beta2=0.99 eps=1e-08 weight_decay=0");
    ck_assert_int_eq(gddr_register_opt(c, "own", w, 4, "adagrad lr=0.3", &b, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_tensor_optimizer(c, b, text, sizeof text), GDDR_OK);
    ck_assert_str_eq(text, "adagrad lr=0.3 eps=1e-10 weight_decay=0");
    /* Not a text the library takes: refused before anything is sent. */
    ck_assert_int_eq(gddr_register_opt(c, "bad", w, 4, "adam betas=0.9", &b, NULL), GDDR_EINVAL);
    ck_assert_msg(strstr(gddr_client_errmsg(c), "betas"), "%s", gddr_client_errmsg(c));
    ck_assert_int_eq(gddr_register_opt(c, "bad", w, 4, "lion", &b, NULL), GDDR_EINVAL);
    /* Another process registers the same key with another optimizer. */
    gddr_client_opts o2 = o;
    o2.rank = 0;
    o2.observer = 1;
    gddr_client *c2 = NULL;
    ck_assert_int_eq(gddr_client_open(&o2, &c2), GDDR_OK);
    ck_assert_int_eq(gddr_register_opt(c2, "own", w, 4, "adam", &b, NULL), GDDR_ECONFIG);
    ck_assert_msg(strstr(gddr_client_errmsg(c2), "runs adagrad lr=0.3"), "%s", gddr_client_errmsg(c2));
    ck_assert_int_eq(gddr_register_opt(c2, "own", w, 4, "adagrad lr=0.3", &b, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c2, "own2", w, 4, &b, NULL), GDDR_ENOKEY); /* observers register nothing */
    gddr_client_close(&c2);
    gddr_client_close(&c);
    /* On the wire: an optimizer the server refuses. */
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 0, 1);
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__InitTensor in = GDDR__INIT_TENSOR__INIT;
    Gddr__Optimizer oz = GDDR__OPTIMIZER__INIT;
    oz.kind = GDDR__OPTIMIZER_KIND__OPT_ADAM;
    oz.beta1 = 1.0;
    oz.beta2 = 0.999;
    oz.eps = 1e-8;
    rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq.req_id = ++r.next_id;
    rq.session = r.session;
    in.key = "wire";
    in.n = 4;
    in.payload_bytes = 16;
    in.optimizer = &oz;
    rq.body_case = GDDR__REQUEST__BODY_INIT;
    rq.init = &in;
    gddr__raw raw = { w, 16, NULL, NULL };
    ck_assert(gddr__send(r.sock, NULL, &rq.base, &raw, 1) >= 0);
    Gddr__Reply *rep = raw_recv(&r, WAIT_MS, NULL);
    ck_assert_msg(rep && rep->body_case == GDDR__REPLY__BODY_ERROR && rep->error->code == GDDR_EINVAL &&
                      strstr(rep->error->message, "beta1"),
                  "beta1 = 1 was not refused with E_INVAL");
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    stop_server(&s);
}
END_TEST

START_TEST(test_push_lr)
{
    gt_server s;
    START_SERVER(s, "lr=0.1");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w = 0, g = 1;
    int id;
    ck_assert_int_eq(gddr_register(c, "l", &w, 1, &id, NULL), GDDR_OK);
    const float *gp[1] = { &g };
    float *wp[1] = { &w };
    ck_assert_int_eq(gddr_set_lr(c, 0.5), GDDR_OK);
    ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
    ck_assert_msg(w == -0.5f, "with the push's lr 0.5: w = %.9g", (double)w);
    ck_assert_int_eq(gddr_set_lr(c, 0), GDDR_OK);
    ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
    ck_assert_msg(fabsf(w - -0.6f) < 1e-7f, "back to the tensor's lr 0.1: w = %.9g", (double)w);
    ck_assert_int_eq(gddr_set_lr(c, -1), GDDR_EINVAL);
    ck_assert_int_eq(gddr_set_lr(c, NAN), GDDR_EINVAL);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- async fill (adam) --------------------------------------------------------- */

/* One Adam step of element w with gradient d making version k (optim.c's
 * float order). */
static void adam_ref(float *w, float *m, float *v, float d, int k, float lr)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float bc1 = (float)(1.0 / (1.0 - pow(0.9, k))), bc2 = (float)(1.0 / (1.0 - pow(0.999, k)));
    *m = b1 * *m + (1.0f - b1) * d;
    *v = b2 * *v + (1.0f - b2) * (d * d);
    *w = *w - lr * ((*m * bc1) / (sqrtf(*v * bc2) + eps));
}

static void async_fill_case(const char *kind, const char *fill, const char *afill, int filled)
{
    static const float g1[FN] = { 1, 2, 3, 4, 0.5f, -1, 2, -0.25f };
    static const float g2[4] = { 0.5f, 0.5f, -1, 1 };                    /* chunk 0; chunk 1 held */
    static const float g3[FN] = { 1, -2, 1, 1, 1.5f, -2, 3, 0.75f };     /* chunk 1: two steps' sum */
    const float lr = 0.01f;
    gt_server s;
    START_SERVER(s, "mode=async", "workers=1", "lr=0.01", "chunk=4", kind, fill, afill);
    raw_conn w0;
    raw_open(&w0, s.endpoint);
    raw_hello(&w0, 0, 1);
    uint32_t id = raw_register(&w0, "af", FN);
    uint8_t bm = 0x01;
    raw_push_full(&w0, id, g1, FN, NULL, 0, 0, 0, 0);
    raw_push_full(&w0, id, g2, 4, &bm, 1, 1, 0, 1);
    float got[FN], want[FN];
    server_values_within(s.endpoint, "af", got, FN, 2, WAIT_MS);
    int adam = strstr(kind, "adam") != NULL;
    float w[FN] = { 0 }, m[FN] = { 0 }, v[FN] = { 0 }, cred[FN] = { 0 };
    for (size_t i = 0; i < FN; i++) {
        if (!adam) {
            w[i] = -lr * g1[i] - (i < 4 ? lr * g2[i] : 0.0f);
            continue;
        }
        adam_ref(&w[i], &m[i], &v[i], g1[i], 1, lr);
        if (i < 4) {
            adam_ref(&w[i], &m[i], &v[i], g2[i], 2, lr);
        } else if (filled) {
            cred[i] = m[i] * (float)(1.0 / (1.0 - pow(0.9, 1))); /* m-hat after version 1 */
            adam_ref(&w[i], &m[i], &v[i], cred[i], 2, lr);
        }
    }
    memcpy(want, w, sizeof want);
    char what[128];
    snprintf(what, sizeof what, "%s %s: after the held push", kind, fill);
    assert_near(got, want, FN, 1e-6f, what);
    if (adam) {
        raw_push_full(&w0, id, g3, FN, NULL, 0, 0, 0, 2);
        server_values_within(s.endpoint, "af", got, FN, 3, WAIT_MS);
        for (size_t i = 0; i < FN; i++)
            adam_ref(&w[i], &m[i], &v[i], g3[i] - cred[i], 3, lr);
        snprintf(what, sizeof what, "%s %s: the held chunk sent, its credit off", kind, fill);
        assert_near(got, w, FN, 1e-6f, what);
    }
    raw_close(&w0);
    stop_server(&s);
}

START_TEST(test_async_adam_fill)
{
    async_fill_case("kind=adam", "fill_held=true", "async_fill=moment", 1);
    /* recent: one worker's own pushes never stand in: as without fill */
    async_fill_case("kind=adam", "fill_held=true", "async_fill=recent", 0);
    async_fill_case("kind=adam", "fill_held=false", "async_fill=moment", 0);
    async_fill_case("kind=sgd", "fill_held=true", "async_fill=moment", 0);
}
END_TEST

/* Ranks 0 and 1 of 2 on s, both registered to tensor key of FN values. */
static uint32_t open_two(gt_server *s, raw_conn *w0, raw_conn *w1, const char *key)
{
    raw_open(w0, s->endpoint);
    raw_hello(w0, 0, 2);
    raw_open(w1, s->endpoint);
    raw_hello(w1, 1, 2);
    uint32_t id = raw_register(w0, key, FN);
    ck_assert_uint_eq(raw_register(w1, key, FN), id);
    return id;
}

/* The server's Adam over FN values, step by step, for the async fill cases. */
typedef struct adam_model {
    float w[FN], m[FN], v[FN];
    int k;     /* the version the last step made */
    float lr;
} adam_model;

/* What a held chunk is stepped with in ref_step: m-hat, nothing (it waits
 * for its release: async_fill = recent with no values the holder may use),
 * or given values. */
static const float FILL_MHAT[1], FILL_WAIT[1];

/* One step of the model for values pushed with the pusher's credits cr:
 * chunk 1 of a held push (vals then holds chunk 0 only) is stepped with
 * est (FILL_MHAT: m-hat; FILL_WAIT: not at all) and credited; a chunk sent
 * takes its credit off. */
static void ref_step(adam_model *a, const float *vals, float *cr, int held, const float *est)
{
    a->k++;
    for (size_t i = 0; i < FN; i++) {
        float d;
        if (i < 4 || !held) {
            d = vals[i] - cr[i];
            cr[i] = 0;
        } else if (est == FILL_WAIT) {
            continue;
        } else {
            d = est == FILL_MHAT ? a->m[i] * (float)(1.0 / (1.0 - pow(0.9, a->k - 1))) : est[i];
            cr[i] += d;
        }
        adam_ref(&a->w[i], &a->m[i], &a->v[i], d, a->k, a->lr);
    }
}

/* A push of w's through the wire and the same step of the model a: dense,
 * or (held) chunk 0 only with chunk 1 held; the version it was computed on
 * is the model's. */
static void push_ref(raw_conn *w, uint32_t id, adam_model *a, const float *vals, float *cr, int held,
                     const float *est)
{
    static const uint8_t bm = 0x01;
    raw_push_full(w, id, vals, held ? 4 : FN, held ? &bm : NULL, held ? 1 : 0, held, 0, (uint64_t)a->k);
    ref_step(a, vals, cr, held, est);
}

/* Two async workers under adam: w1 holds chunk 1 (elements 4-7) three
 * times; what stands in for it is the chunk's last fresh push (w0's,
 * async_fill = recent), or always m-hat (moment). Under recent, a holder
 * gets each fresh push's values once: before the first one, and when the
 * last fresh push is one it had already (w1's release in between is not
 * fresh and must not become the estimate), the chunk is not stepped. */
static void async_fill_recent_case(const char *afill, int recent)
{
    static const float g1[FN] = { 1, 2, 3, 4, 0.5f, -1, 2, -0.25f };    /* w0 */
    static const float ga[4] = { 0.5f, 0.5f, -1, 1 };                   /* w1, chunk 1 held */
    static const float g3[FN] = { -1, 1, 0.5f, 2, 3, -0.5f, 1.5f, 1 };   /* w0 */
    static const float gb[4] = { 1, -1, 0.25f, 0.5f };                  /* w1, chunk 1 held */
    static const float gc[FN] = { 2, 1, -1, 0.5f, -2, 4, 0.5f, -3 };     /* w1: the release */
    static const float gd[4] = { -0.5f, 2, 1, -1 };                     /* w1, chunk 1 held */
    gt_server s;
    START_SERVER(s, "mode=async", "workers=2", "lr=0.01", "chunk=4", "kind=adam", afill);
    raw_conn w0, w1;
    uint32_t id = open_two(&s, &w0, &w1, "ar");
    adam_model a = { .lr = 0.01f };
    float none[FN] = { 0 }, cred[FN] = { 0 };
    float got[FN];
    char what[96];
    push_ref(&w0, id, &a, g1, none, 0, FILL_MHAT);
    /* the first holder: nothing fresh yet */
    push_ref(&w1, id, &a, ga, cred, 1, recent ? FILL_WAIT : FILL_MHAT);
    push_ref(&w0, id, &a, g3, none, 0, FILL_MHAT);
    push_ref(&w1, id, &a, gb, cred, 1, recent ? g3 : FILL_MHAT); /* recent: w0's g3 stands in */
    push_ref(&w1, id, &a, gc, cred, 0, FILL_MHAT); /* the release, net of both credits */
    /* The release is not fresh, so g3 is still the last fresh push, and
     * w1 had it already: the chunk waits. */
    push_ref(&w1, id, &a, gd, cred, 1, recent ? FILL_WAIT : FILL_MHAT);
    server_values_within(s.endpoint, "ar", got, FN, 6, WAIT_MS);
    snprintf(what, sizeof what, "%s: after six pushes", afill);
    assert_near(got, a.w, FN, 1e-6f, what);
    raw_close(&w0);
    raw_close(&w1);
    stop_server(&s);
}

/* A hybrid run (sync after an async warm-up of 3 versions) under adam: the
 * last fresh values the warm-up kept must not leak into the first sync
 * step's fresh-push mean, which fills w1's held chunk 1 with w0's g4. */
static void async_fill_warmup_ends_case(void)
{
    static const float g1[FN] = { 1, 2, 3, 4, 0.5f, -1, 2, -0.25f };    /* w0, async */
    static const float ga[4] = { 0.5f, 0.5f, -1, 1 };                   /* w1, async, chunk 1 held */
    static const float g3[FN] = { -1, 1, 0.5f, 2, 3, -0.5f, 1.5f, 1 };   /* w0, async: ends it */
    static const float g4[FN] = { 2, 1, -1, 0.5f, -2, 4, 0.5f, -3 };     /* w0, the sync step */
    static const float gb[4] = { 1, -1, 0.25f, 0.5f };                  /* w1, the sync step, held */
    const float lr = 0.01f;
    gt_server s;
    START_SERVER(s, "mode=sync", "async_warmup_steps=3", "workers=2", "lr=0.01", "chunk=4", "kind=adam");
    raw_conn w0, w1;
    uint32_t id = open_two(&s, &w0, &w1, "hw");
    uint8_t bm = 0x01;
    float w[FN] = { 0 }, m[FN] = { 0 }, v[FN] = { 0 }, got[FN];
    raw_push_full(&w0, id, g1, FN, NULL, 0, 0, 0, 0);
    raw_push_full(&w1, id, ga, 4, &bm, 1, 1, 0, 1);
    raw_push_full(&w0, id, g3, FN, NULL, 0, 0, 0, 2);
    for (size_t i = 0; i < FN; i++) {
        adam_ref(&w[i], &m[i], &v[i], g1[i], 1, lr);
        if (i < 4) /* chunk 1, held with nothing fresh from w0 since it was made: waits */
            adam_ref(&w[i], &m[i], &v[i], ga[i], 2, lr);
        adam_ref(&w[i], &m[i], &v[i], g3[i], 3, lr);
    }
    server_values_within(s.endpoint, "hw", got, FN, 3, WAIT_MS);
    assert_near(got, w, FN, 1e-6f, "hybrid: after the async warm-up");
    w1.step = w0.step; /* the sync step: the same Push.step from both */
    raw_push_full(&w0, id, g4, FN, NULL, 0, 0, 0, 3);
    raw_push_full(&w1, id, gb, 4, &bm, 1, 1, 0, 3);
    /* chunk 0: the mean of both; chunk 1: w0's g4 (the one fresh push, its
     * mean credited to w1 and counted for it): (g4 + g4) / 2 */
    for (size_t i = 0; i < FN; i++)
        adam_ref(&w[i], &m[i], &v[i], i < 4 ? (g4[i] + gb[i]) * 0.5f : (g4[i] + g4[i]) * 0.5f, 4, lr);
    server_values_within(s.endpoint, "hw", got, FN, 4, WAIT_MS);
    assert_near(got, w, FN, 1e-6f, "hybrid: the first sync step's fill");
    raw_close(&w0);
    raw_close(&w1);
    stop_server(&s);
}

/* async_fill switched by SIGHUP, recent -> moment -> recent: moment keeps
 * no fresh values, so after the switch back a held chunk waits until the
 * chunk is next sent fresh, never stepped with the values recent kept
 * before the switch (w0's g3 here, two fresh pushes old by then). */
static void async_fill_reload_case(void)
{
    static const float g1[FN] = { 1, 2, 3, 4, 0.5f, -1, 2, -0.25f };    /* w0 */
    static const float ga[4] = { 0.5f, 0.5f, -1, 1 };                   /* w1, chunk 1 held */
    static const float g3[FN] = { -1, 1, 0.5f, 2, 3, -0.5f, 1.5f, 1 };   /* w0: recent keeps it */
    static const float g4[FN] = { 2, 1, -1, 0.5f, -2, 4, 0.5f, -3 };     /* w0, under moment */
    static const float gb[4] = { 1, -1, 0.25f, 0.5f };                  /* w1, held: m-hat */
    static const float g5[FN] = { 0.5f, -1, 1, 1, -1, 2, -0.5f, 1.5f };  /* w0: fresh again */
    static const float gd[4] = { -0.5f, 2, 1, -1 };                     /* w1, held: g5 */
    char dir[64], path[96], at[100], what[96];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/ps.ini", dir);
    snprintf(at, sizeof at, "@%s", path);
    gt_write_file(path, "[consistency]\nasync_fill = recent\n");
    gt_server s;
    START_SERVER(s, at, "mode=async", "workers=2", "lr=0.01", "chunk=4", "kind=adam");
    raw_conn w0, w1;
    uint32_t id = open_two(&s, &w0, &w1, "hup");
    gddr_client *obs = open_observer_on(s.endpoint, WAIT_MS);
    adam_model a = { .lr = 0.01f };
    float none[FN] = { 0 }, cred[FN] = { 0 }, got[FN];
    push_ref(&w0, id, &a, g1, none, 0, FILL_MHAT);
    push_ref(&w1, id, &a, ga, cred, 1, FILL_WAIT);
    push_ref(&w0, id, &a, g3, none, 0, FILL_MHAT);
    gt_write_file(path, "[consistency]\nasync_fill = moment\n");
    ck_assert_int_eq(gt_server_signal(&s, SIGHUP), 0);
    gt_wait_metric(obs, "gddr_config_reloads_total", 1, WAIT_MS);
    push_ref(&w0, id, &a, g4, none, 0, FILL_MHAT);
    gt_write_file(path, "[consistency]\nasync_fill = recent\n");
    ck_assert_int_eq(gt_server_signal(&s, SIGHUP), 0);
    gt_wait_metric(obs, "gddr_config_reloads_total", 2, WAIT_MS);
    push_ref(&w1, id, &a, gb, cred, 1, FILL_WAIT);
    push_ref(&w0, id, &a, g5, none, 0, FILL_MHAT);
    push_ref(&w1, id, &a, gd, cred, 1, g5);
    server_values_within(s.endpoint, "hup", got, FN, 7, WAIT_MS);
    snprintf(what, sizeof what, "async_fill reloaded recent -> moment -> recent");
    assert_near(got, a.w, FN, 1e-6f, what);
    gddr_client_close(&obs);
    raw_close(&w0);
    raw_close(&w1);
    stop_server(&s);
    gt_rm_rf(dir);
}

/* One async worker under adam (recent): its own fresh pushes never stand
 * in for the chunks it holds (they were applied once already, and with
 * one worker the same values would stand in for every step of a hold):
 * a held chunk waits for its release. */
static void async_fill_own_case(void)
{
    static const float g1[FN] = { 1, 2, 3, 4, 0.5f, -1, 2, -0.25f };
    static const float ga[4] = { 0.5f, 0.5f, -1, 1 };                   /* chunk 1 held */
    static const float g3[FN] = { -1, 1, 0.5f, 2, 3, -0.5f, 1.5f, 1 };   /* its release */
    static const float g4[FN] = { 2, 1, -1, 0.5f, -2, 4, 0.5f, -3 };     /* fresh: kept */
    static const float gb[4] = { 1, -1, 0.25f, 0.5f };                  /* held: waits */
    static const float g5[FN] = { 0.5f, -1, 1, 1, -1, 2, -0.5f, 1.5f };  /* the release */
    gt_server s;
    START_SERVER(s, "mode=async", "workers=1", "lr=0.01", "chunk=4", "kind=adam");
    raw_conn w0;
    raw_open(&w0, s.endpoint);
    raw_hello(&w0, 0, 1);
    uint32_t id = raw_register(&w0, "own", FN);
    adam_model a = { .lr = 0.01f };
    float cred[FN] = { 0 }, got[FN];
    push_ref(&w0, id, &a, g1, cred, 0, FILL_MHAT);
    push_ref(&w0, id, &a, ga, cred, 1, FILL_WAIT);
    push_ref(&w0, id, &a, g3, cred, 0, FILL_MHAT);
    push_ref(&w0, id, &a, g4, cred, 0, FILL_MHAT);
    push_ref(&w0, id, &a, gb, cred, 1, FILL_WAIT); /* g4 is its own: no stand-in */
    push_ref(&w0, id, &a, g5, cred, 0, FILL_MHAT);
    server_values_within(s.endpoint, "own", got, FN, 6, WAIT_MS);
    assert_near(got, a.w, FN, 1e-6f, "one worker: its own pushes do not stand in");
    raw_close(&w0);
    stop_server(&s);
}

START_TEST(test_async_fill_recent)
{
    async_fill_recent_case("async_fill=recent", 1);
    async_fill_recent_case("async_fill=moment", 0);
    async_fill_warmup_ends_case();
    async_fill_reload_case();
    async_fill_own_case();
}
END_TEST

/* The optimizer loops are vectorised (common/vec.h): the whole array in one
 * call (vector body) must give what one element per call gives (the scalar
 * tail), bit for bit, for every optimizer form, in place and into a copy,
 * and for the rows' step (server/table_row.c) too. */
static void rnd_fill(float *x, size_t n, uint32_t *seed, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(*seed >> 8) / 16777216.0f;
    }
}

START_TEST(test_loops_vector_equals_scalar)
{
    enum { VN = 1029 };
    static const struct { int kind; float mu, wd; } forms[] = {
        { PS_OPT_SGD, 0, 0 },      { PS_OPT_SGD, 0, 0.01f },  { PS_OPT_SGD, 0.9f, 0 },
        { PS_OPT_SGD, 0.9f, 0.01f }, { PS_OPT_ADAM, 0, 0 },   { PS_OPT_ADAM, 0, 0.01f },
        { PS_OPT_ADAMW, 0, 0.01f }, { PS_OPT_ADAMW, 0, 0 },   { PS_OPT_ADAGRAD, 0, 0 },
        { PS_OPT_ADAGRAD, 0, 0.01f },
    };
    static float w0[VN], g[VN], s10[VN], s20[VN], cr0[VN];
    static float wa[VN], oa[VN], s1a[VN], s2a[VN], cra[VN], wb[VN], ob[VN], s1b[VN], s2b[VN], crb[VN];
    uint32_t seed = 7;
    rnd_fill(w0, VN, &seed, -1, 1);
    rnd_fill(g, VN, &seed, -2, 2);
    rnd_fill(s10, VN, &seed, -0.1f, 0.1f);
    rnd_fill(s20, VN, &seed, 0, 0.01f);
    rnd_fill(cr0, VN, &seed, -1, 1);
    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++)
        for (int inplace = 0; inplace < 2; inplace++)
            for (int fill = 0; fill < 3; fill++) { /* 1: m-hat, 2: an estimate (g) */
                ps_upd u = { .kind = forms[f].kind, .lr = 0.05f, .mu = forms[f].mu, .b1 = 0.9f,
                             .b2 = 0.999f, .eps = 1e-8f, .wd = forms[f].wd, .bc1 = 1.9f,
                             .bc2 = 1.3f, .mh = 2.1f };
                if (forms[f].kind == PS_OPT_ADAGRAD)
                    for (size_t i = 0; i < VN; i++)
                        s10[i] = fabsf(s10[i]);
                memcpy(wa, w0, sizeof wa), memcpy(wb, w0, sizeof wb);
                memcpy(s1a, s10, sizeof s1a), memcpy(s1b, s10, sizeof s1b);
                memcpy(s2a, s20, sizeof s2a), memcpy(s2b, s20, sizeof s2b);
                memcpy(cra, cr0, sizeof cra), memcpy(crb, cr0, sizeof crb);
                float *outa = inplace ? wa : oa, *outb = inplace ? wb : ob;
                if (fill)
                    ps_upd_fill(&u, outa, wa, s1a, s2a, cra, fill == 2 ? g : NULL, VN);
                else
                    ps_upd_run(&u, outa, wa, s1a, s2a, g, 0.7f, VN);
                for (size_t i = 0; i < VN; i++) {
                    if (fill)
                        ps_upd_fill(&u, outb + i, wb + i, s1b + i, s2b + i, crb + i,
                                    fill == 2 ? g + i : NULL, 1);
                    else
                        ps_upd_run(&u, outb + i, wb + i, s1b + i, s2b + i, g + i, 0.7f, 1);
                }
                ck_assert_msg(memcmp(outa, outb, sizeof oa) == 0 && memcmp(s1a, s1b, sizeof s1a) == 0 &&
                              memcmp(s2a, s2b, sizeof s2a) == 0 && memcmp(cra, crb, sizeof cra) == 0,
                              "form %zu (kind %d), in place %d, fill %d: vector and scalar differ", f,
                              forms[f].kind, inplace, fill);
            }
    /* rows: a row of dim VN against VN rows of dim 1 */
    static const ps_topt topts[] = { PS_TOPT_SGD, PS_TOPT_ADAGRAD, PS_TOPT_ADAM };
    static float sa[2 * VN], sb[2];
    for (size_t k = 0; k < 3; k++) {
        ps_table_conf c = { .dim = VN, .opt = topts[k], .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8 };
        ps_table_conf c1 = c;
        c1.dim = 1;
        memcpy(wa, w0, sizeof wa), memcpy(wb, w0, sizeof wb);
        for (size_t i = 0; i < VN; i++)
            sa[i] = fabsf(s10[i]), sa[VN + i] = s20[i];
        uint32_t sta = 3;
        for (int rep = 0; rep < 3; rep++)
            ps_trow_step(&c, wa, sa, &sta, g, 0.7f, 0.05f);
        for (size_t i = 0; i < VN; i++) {
            uint32_t stb = 3;
            sb[0] = fabsf(s10[i]), sb[1] = s20[i];
            for (int rep = 0; rep < 3; rep++)
                ps_trow_step(&c1, wb + i, sb, &stb, g + i, 0.7f, 0.05f);
            ck_assert_msg(memcmp(wb + i, wa + i, 4) == 0 && memcmp(&sb[0], &sa[i], 4) == 0 &&
                              (topts[k] != PS_TOPT_ADAM || memcmp(&sb[1], &sa[VN + i], 4) == 0),
                          "rows, optimizer %d, element %zu: vector and scalar differ", (int)topts[k], i);
        }
    }
}
END_TEST

Suite *suite_optim(void)
{
    Suite *s = suite_create("optim");
    GT_ADD_CASE(s, "fill_exact", test_fill_exact, 60);
    GT_ADD_CASE(s, "fill_survives_restart", test_fill_survives_restart, 60);
    GT_ADD_CASE(s, "flush_joins_step", test_flush_joins_step, 60);
    GT_ADD_CASE(s, "momentum_fill_converges", test_momentum_fill_converges, 120);
    GT_ADD_CASE(s, "optimizers_match_reference", test_optimizers_match_reference, 120);
    GT_ADD_CASE(s, "register_optimizer", test_register_optimizer, 60);
    GT_ADD_CASE(s, "push_lr", test_push_lr, 60);
    GT_ADD_CASE(s, "fresh_fill_normalising", test_fresh_fill_normalising, 60);
    GT_ADD_CASE(s, "fill_bound_fits_workers", test_fill_bound_fits_workers, 60);
    GT_ADD_CASE(s, "async_adam_fill", test_async_adam_fill, 60);
    GT_ADD_CASE(s, "async_fill_recent", test_async_fill_recent, 60);
    GT_ADD_CASE(s, "loops_vector_equals_scalar", test_loops_vector_equals_scalar, 60);
    return s;
}
