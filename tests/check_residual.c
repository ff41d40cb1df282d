/* check_residual.c -- GDDR delayed reconvergence end to end (docs/design.md
 * section 6 steps 4-6, section 5 sparse apply).
 *
 * Each test starts its own gddr-ps (tests/harness.h) and drives it with
 * libgddr-client or a raw ZeroMQ DEALER speaking proto/gddr.proto. Values
 * are small integers (and learning rates powers of two), so every expected
 * number is exact in float and compared bitwise. All waits are bounded.
 *
 *   build/bin/gddr-tests residual
 */
#define _GNU_SOURCE
#include <check.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "blas.h"
#include "gddr/gddr.h"
#include "gddr_hash.h"
#include "gpu.h"
#include "harness.h"
#include "wirekit.h"
#include "residual.h"
#include "suites.h"
#include "wire.h"

/* Test hooks and internals of libgddr-client (the session a push carries). */
#include "../client/src/client_int.h"

/* No test asserts that something was fast (a loaded machine or a sanitizer
 * build is slow): deadlines only catch a hang. */
#define TCASE_TIMEOUT 120
#define REPLY_WAIT_MS 30000
/* The experiment script runs several short trainings (seconds normally). */
#define EXPERIMENT_WAIT_MS 240000
#define SEED 0x1234abcdull

/* ---- servers and clients --------------------------------------------------- */

/* The tests' client options: these, the library's defaults otherwise. */
static gddr_client_opts test_opts(const char *ep, int rank, int world, double alpha)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = REPLY_WAIT_MS;
    o.reconnect_timeout_ms = 1000;
    o.delay_fraction = alpha;
    o.seed = SEED;
    o.hold_schedule = GDDR_HOLD_RANDOM; /* what these tests' masks were written for */
    return o;
}

static gddr_client *open_opts(const gddr_client_opts *o)
{
    gddr_client *c = NULL;
    int rc = gddr_client_open(o, &c);
    ck_assert_msg(rc == GDDR_OK, "gddr_client_open(%s, rank %d): %s", o->server, o->rank,
                  gddr_strerror(rc));
    return c;
}

static gddr_client *open_client_ex(const char *ep, int rank, int world, double alpha, int timeout_ms,
                                   int reconnect_ms, int pipelined)
{
    gddr_client_opts o = test_opts(ep, rank, world, alpha);
    o.timeout_ms = timeout_ms;
    o.reconnect_timeout_ms = reconnect_ms;
    o.async_pipeline = pipelined;
    return open_opts(&o);
}

static gddr_client *open_client(const char *ep, int rank, int world, double alpha)
{
    return open_client_ex(ep, rank, world, alpha, REPLY_WAIT_MS, 1000, 1);
}

static void pull_exact(gddr_client *c, int id, const float *want, size_t n, uint64_t min_version,
                       const char *what)
{
    float *got = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(got);
    uint64_t v = 0;
    int rc = gddr_pull(c, id, got, min_version, &v);
    ck_assert_msg(rc == GDDR_OK, "%s: pull: %s (%s)", what, gddr_strerror(rc), gddr_client_errmsg(c));
    ck_assert_msg(v >= min_version, "%s: version %" PRIu64 " < %" PRIu64, what, v, min_version);
    assert_same_floats(got, want, n, what);
    free(got);
}

static int server_tau(gddr_client *c)
{
    gddr_server_stats st;
    int rc = gddr_server_stats_get(c, &st);
    ck_assert_msg(rc == GDDR_OK, "stats: %s", gddr_strerror(rc));
    return st.tau;
}

/* ---- the raw wire --------------------------------------------------------------- */

/* Sends a push of rank `rank`: nvals floats in the frame, the header
 * claiming payload_bytes. bm NULL: dense. Returns the req_id. */
static uint64_t raw_push(raw_conn *r, uint32_t rank, uint32_t id, const float *vals, size_t nvals,
                         uint64_t payload_bytes, const uint8_t *bm, size_t bmlen, uint64_t version,
                         float norm)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Push p = GDDR__PUSH__INIT;
    rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq.req_id = ++r->next_id;
    rq.rank = rank;
    p.id = id;
    p.birth_version = version;
    p.base_version = version;
    p.grad_norm = norm;
    p.step = r->step++; /* every push a new one (a repeated step is a resend) */
    p.bitmap.data = (uint8_t *)bm;
    p.bitmap.len = bm ? bmlen : 0;
    p.payload_bytes = payload_bytes;
    rq.body_case = GDDR__REQUEST__BODY_PUSH;
    rq.push = &p;
    gddr__raw raw = { vals, nvals * sizeof(float), NULL, NULL };
    ck_assert_msg(gddr__send(r->sock, NULL, &rq.base, &raw, 1) >= 0, "send: %s",
                  zmq_strerror(errno));
    return rq.req_id;
}


/* Expects a push reply to rid; returns applied and stores the version. */
static int raw_push_ok(raw_conn *r, uint64_t rid, uint64_t *version, const char *what)
{
    Gddr__Reply *rep = raw_recv(r, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rep != NULL, "%s: no reply", what);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH, "%s: refused: %s", what,
                  rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "?");
    ck_assert_uint_eq(rep->req_id, rid);
    int applied = rep->push->applied;
    if (version)
        *version = rep->push->version;
    gddr__reply__free_unpacked(rep, NULL);
    return applied;
}

static void raw_push_refused(raw_conn *r, uint64_t rid, int code, const char *what)
{
    Gddr__Reply *rep = raw_recv(r, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rep != NULL, "%s: no reply", what);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR, "%s: accepted, expected %s", what,
                  gddr_strerror(code));
    ck_assert_msg((int)rep->error->code == code, "%s: error %u (%s), expected %d (%s)", what,
                  rep->error->code, rep->error->message, code, gddr_strerror(code));
    ck_assert_uint_eq(rep->req_id, rid);
    gddr__reply__free_unpacked(rep, NULL);
}

/* Packs the chunks of `dense` selected by bm (chunk size k, n floats). */
static size_t pack(const float *dense, size_t n, uint32_t k, const uint8_t *bm, float *out)
{
    size_t np = 0;
    ck_assert_int_eq(gddr_pack_cpu(dense, n, k, bm, out, &np), GDDR_OK);
    return np;
}

/* ---- 1. wire size of a sparse push ------------------------------------------------ */

/* The push of a GDDR step is its protobuf header (bitmap included) plus one
 * raw frame of exactly the sent chunks: the client's bytes_pushed grows by
 * that and nothing else. The mask is replayed here with the CPU kernel. */
START_TEST(test_wire_size_of_sparse_push)
{
    gt_server s;
    START_SERVER(s, "chunk=16", "lr=0.5", "tau_dynamic=false", "tau_init=4", "tau_min=1");
    enum { N = 100, K = 16, STEPS = 12 }; /* 7 chunks: 6 x 16 + 4 */
    const uint32_t nch = (uint32_t)gddr_nchunks(N, K);
    float init[N] = { 0 };
    gddr_client *c = open_client(s.endpoint, 0, 1, 0.5);
    int id;
    ck_assert_int_eq(gddr_register(c, "ws", init, N, &id, NULL), GDDR_OK);
    float r[N] = { 0 }, g[N], packed[N], params[N];
    uint32_t age[8] = { 0 };
    uint8_t bm[1];
    int saw_sparse = 0, saw_dense = 0;
    for (int k = 0; k < STEPS; k++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)((i + 3 * k) % 5 - 2 + (i == 0));
        gddr_client_counters before, after;
        gddr_client_counters_get(c, &before);
        const float *gp[1] = { g };
        float *pp[1] = { params };
        ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
        gddr_client_counters_get(c, &after);

        /* What the client must have sent. */
        gddr_residual_args a = { N, K, 0.5f, 4, SEED, 0, gddr_key_hash("ws"), (uint64_t)k, 0, 0, 0, NULL };
        size_t np = 0, ns = 0;
        ck_assert_int_eq(gddr_residual_step_cpu(&a, g, r, age, packed, bm, &np, &ns), GDDR_OK);
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Push p = GDDR__PUSH__INIT;
        rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
        rq.req_id = 3 + 2 * (uint64_t)k; /* any id of the same varint length */
        rq.rank = 0;
        rq.session = c->session; /* the client's own, as it sends it */
        p.id = 0;
        p.birth_version = p.base_version = (uint64_t)k; /* async: one version per step */
        p.step = (uint64_t)k;
        p.grad_norm = (float)gddr_nrm2_cpu(g, N);
        if (ns < nch) {
            p.bitmap.data = bm;
            p.bitmap.len = sizeof bm;
            p.held = 1; /* the absent chunks are in the residual (Push.held) */
            saw_sparse = 1;
        } else {
            saw_dense = 1;
        }
        p.payload_bytes = np * 4;
        p.residual_l1 = (float)gddr_asum_cpu(r, N); /* what it holds after the push */
        rq.body_case = GDDR__REQUEST__BODY_PUSH;
        rq.push = &p;
        size_t hdr = protobuf_c_message_get_packed_size(&rq.base);
        uint64_t got = after.bytes_pushed - before.bytes_pushed;
        ck_assert_msg(got == hdr + 4 * np,
                      "step %d: push of %zu of %u chunks (%zu values) took %" PRIu64
                      " bytes, expected header %zu + payload %zu",
                      k, ns, nch, np, got, hdr, 4 * np);
        ck_assert_uint_eq(after.values_pushed - before.values_pushed, np);
    }
    ck_assert_msg(saw_sparse, "no step sent a sparse push");
    (void)saw_dense;
    /* And the residual the client keeps is the one replayed here. */
    float rc_[N];
    ck_assert_int_eq(gddr__residual_get(c, id, rc_), GDDR_OK);
    assert_same_floats(rc_, r, N, "client residual vs the CPU kernel replay");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 2. sparse apply touches only present chunks (momentum) ----------------------- */

/* With momentum an absent chunk must keep both its value and its velocity:
 * a later push of that chunk sees the velocity it had, not a decayed one. */
START_TEST(test_sparse_apply_momentum_present_only)
{
    gt_server s;
    START_SERVER(s, "chunk=4", "lr=0.5", "momentum=0.5");
    enum { N = 12 }; /* 3 chunks */
    float w[N], v[N] = { 0 };
    for (int i = 0; i < N; i++)
        w[i] = (float)(i - 5);
    gddr_client *c = open_client(s.endpoint, 0, 1, 0);
    int id;
    ck_assert_int_eq(gddr_register(c, "m", w, N, &id, NULL), GDDR_OK);
    raw_conn rw;
    raw_open(&rw, s.endpoint);
    raw_hello(&rw, 1, 2); /* pushes come from a worker */
    uint64_t ver = 0;
    /* push 1: chunks 0 and 2; push 2: chunk 1; push 3: chunk 0; push 4: dense */
    const uint8_t masks[4] = { 0x05, 0x02, 0x01, 0x07 };
    for (int k = 0; k < 4; k++) {
        float g[N], pk[N];
        for (int i = 0; i < N; i++)
            g[i] = (float)((i * 3 + k) % 7 - 3);
        uint8_t bm = masks[k];
        size_t np = pack(g, N, 4, &bm, pk);
        int dense = bm == 0x07;
        uint64_t rid = raw_push(&rw, 1, (uint32_t)id, dense ? g : pk, dense ? N : np,
                                (dense ? N : np) * 4, dense ? NULL : &bm, 1, ver, 1.0f);
        ck_assert(raw_push_ok(&rw, rid, &ver, "momentum push"));
        for (int ch = 0; ch < 3; ch++) {
            if (!(bm >> ch & 1))
                continue;
            for (int i = ch * 4; i < ch * 4 + 4; i++) {
                v[i] = 0.5f * v[i] + 0.5f * g[i];
                w[i] -= v[i];
            }
        }
        char what[64];
        snprintf(what, sizeof what, "after momentum push %d (mask 0x%02x)", k + 1, bm);
        pull_exact(c, id, w, N, 0, what);
    }
    raw_close(&rw);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 3. sync: sparse reduction vs a dense reference, malformed pushes ------------- */

START_TEST(test_sync_sparse_reduction)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "chunk=4", "lr=0.5");
    enum { N = 14, NCH = 4 }; /* chunks 4, 4, 4, 2 */
    float w0[N];
    for (int i = 0; i < N; i++)
        w0[i] = (float)(3 * i - 20);
    gddr_client *c0 = open_client(s.endpoint, 0, 2, 0);
    gddr_client *c1 = open_client(s.endpoint, 1, 2, 0);
    int ids, idd, id9;
    ck_assert_int_eq(gddr_register(c0, "sp", w0, N, &ids, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c0, "dn", w0, N, &idd, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c1, "sp", w0, N, &ids, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c1, "dn", w0, N, &idd, NULL), GDDR_OK);
    float z36[36] = { 0 };
    ck_assert_int_eq(gddr_register(c0, "nine", z36, 36, &id9, NULL), GDDR_OK); /* 9 chunks */
    /* The raw connections take over ranks 0 and 1 (the clients leave); an
     * observer pulls. */
    gddr_client_close(&c1);
    gddr_client_close(&c0);
    c0 = open_observer_on(s.endpoint, REPLY_WAIT_MS);
    ck_assert_int_eq(gddr_register(c0, "sp", w0, N, &ids, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c0, "dn", w0, N, &idd, NULL), GDDR_OK);
    raw_conn r0, r1;
    raw_open(&r0, s.endpoint);
    raw_open(&r1, s.endpoint);
    raw_hello(&r0, 0, 2);
    raw_hello(&r1, 1, 2);

    float w[N];
    memcpy(w, w0, sizeof w);
    /* Steps: (rank 0 mask, rank 1 mask). Chunk 1 is absent from both in
     * step 1; in step 2 rank 0 sends nothing at all (an empty bitmap). */
    const uint8_t m0[3] = { 0x05, 0x00, 0x0f };
    const uint8_t m1[3] = { 0x0c, 0x02, 0x09 };
    for (int k = 0; k < 3; k++) {
        float g0[N], g1[N], p0[N], p1[N], d0[N] = { 0 }, d1[N] = { 0 };
        for (int i = 0; i < N; i++) {
            g0[i] = (float)((i + k) % 5 - 2);
            g1[i] = (float)((2 * i + k) % 7 - 3);
        }
        uint8_t b0 = m0[k], b1 = m1[k];
        size_t n0 = pack(g0, N, 4, &b0, p0), n1 = pack(g1, N, 4, &b1, p1);
        /* The dense reference: the same pushes with zeros where absent. */
        ck_assert_int_eq(gddr_unpack_cpu(p0, &b0, N, 4, 1.0f, 0, d0), GDDR_OK);
        ck_assert_int_eq(gddr_unpack_cpu(p1, &b1, N, 4, 1.0f, 0, d1), GDDR_OK);
        uint64_t v = (uint64_t)k, ver = 0;
        uint64_t rid = raw_push(&r0, 0, (uint32_t)ids, p0, n0, n0 * 4, &b0, 1, v, 1.0f);
        ck_assert(!raw_push_ok(&r0, rid, NULL, "sync sparse push of rank 0"));
        rid = raw_push(&r0, 0, (uint32_t)idd, d0, N, N * 4, NULL, 0, v, 1.0f);
        ck_assert(!raw_push_ok(&r0, rid, NULL, "sync dense push of rank 0"));
        if (k == 2) {
            /* Malformed pushes of rank 1 while the step is open: each is
             * refused and neither counts as rank 1's push nor touches the
             * accumulator (the step must still be waiting afterwards). */
            uint8_t bad = 0x1d; /* a padding bit (chunk 4 of 4) */
            rid = raw_push(&r1, 1, (uint32_t)ids, p1, n1, n1 * 4, &bad, 1, v, 1.0f);
            raw_push_refused(&r1, rid, GDDR_EBITMAP, "bitmap with a padding bit");
            bad = 0x0b; /* chunks 0, 1, 3: 10 values, payload holds 6 */
            rid = raw_push(&r1, 1, (uint32_t)ids, p1, n1, n1 * 4, &bad, 1, v, 1.0f);
            raw_push_refused(&r1, rid, GDDR_EBITMAP, "bitmap selecting more than the payload");
            bad = 0x01; /* chunk 0 only: 4 values, payload holds 6 */
            rid = raw_push(&r1, 1, (uint32_t)ids, p1, n1, n1 * 4, &bad, 1, v, 1.0f);
            raw_push_refused(&r1, rid, GDDR_EBITMAP, "bitmap selecting less than the payload");
            uint8_t two[2] = { b1, 0 };
            rid = raw_push(&r1, 1, (uint32_t)ids, p1, n1, n1 * 4, two, 2, v, 1.0f);
            raw_push_refused(&r1, rid, GDDR_EBITMAP, "bitmap of 2 bytes for 4 chunks");
            rid = raw_push(&r1, 1, (uint32_t)ids, p1, n1, n1 * 4 + 4, &b1, 1, v, 1.0f);
            raw_push_refused(&r1, rid, GDDR_ELENGTH, "header payload_bytes not the frame's");
            float nanp[N];
            memcpy(nanp, p1, sizeof nanp);
            nanp[n1 - 1] = NAN;
            rid = raw_push(&r1, 1, (uint32_t)ids, nanp, n1, n1 * 4, &b1, 1, v, 1.0f);
            raw_push_refused(&r1, rid, GDDR_ENONFINITE, "sparse payload with a NaN");
            /* 9 chunks: a 2-byte bitmap whose second byte names chunk 9 */
            uint8_t nine[2] = { 0x01, 0x02 };
            float four[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
            rid = raw_push(&r1, 1, (uint32_t)id9, four, 8, 32, nine, 2, 0, 1.0f);
            raw_push_refused(&r1, rid, GDDR_EBITMAP, "bit of chunk 9 of 9 (second byte)");
            gddr_server_stats st;
            ck_assert_int_eq(gddr_server_stats_get(c0, &st), GDDR_OK);
            ck_assert_uint_eq(st.versions_total, 4); /* 2 steps x 2 tensors */
        }
        rid = raw_push(&r1, 1, (uint32_t)ids, p1, n1, n1 * 4, &b1, 1, v, 1.0f);
        ck_assert(raw_push_ok(&r1, rid, &ver, "sync sparse push of rank 1"));
        ck_assert_uint_eq(ver, v + 1);
        rid = raw_push(&r1, 1, (uint32_t)idd, d1, N, N * 4, NULL, 0, v, 1.0f);
        ck_assert(raw_push_ok(&r1, rid, &ver, "sync dense push of rank 1"));
        /* expected = w - lr * (sum over the pushes that carry the chunk) / N */
        for (int i = 0; i < N; i++) {
            int ch = i / 4;
            float sum = 0.5f * ((b0 >> ch & 1) ? g0[i] : 0.0f) + 0.5f * ((b1 >> ch & 1) ? g1[i] : 0.0f);
            w[i] -= sum * 0.5f;
        }
        char what[80];
        snprintf(what, sizeof what, "sync step %d: sparse pushes", k + 1);
        pull_exact(c0, ids, w, N, (uint64_t)k + 1, what);
        snprintf(what, sizeof what, "sync step %d: dense reference", k + 1);
        pull_exact(c0, idd, w, N, (uint64_t)k + 1, what);
    }
    /* chunk 1 was touched only in steps 2 and 3 */
    (void)NCH;
    raw_close(&r0);
    raw_close(&r1);
    gddr_client_close(&c0);
    stop_server(&s);
}
END_TEST

/* ---- 4. conservation through the real server -------------------------------------- */

/* lr = 1, async, one worker, integer gradients, alpha = 0.5: after every
 * step the server's w0 - w is exactly sum(g) - r, no chunk is older than
 * tau, and a chunk that was just sent holds no residual. */
START_TEST(test_conservation_end_to_end)
{
    gt_server s;
    START_SERVER(s, "chunk=8", "lr=1", "tau_dynamic=false", "tau_init=3", "tau_min=1");
    enum { N = 50, STEPS = 40 }; /* 7 chunks: 6 x 8 + 2 */
    float w0[N], sumg[N] = { 0 }, g[N], params[N], r[N];
    for (int i = 0; i < N; i++)
        w0[i] = (float)(i % 9 - 4);
    gddr_client *c = open_client(s.endpoint, 0, 1, 0.5);
    int id;
    ck_assert_int_eq(gddr_register(c, "cons", w0, N, &id, NULL), GDDR_OK);
    uint32_t age[8];
    size_t nch = 0;
    uint32_t max_age = 0;
    for (int k = 0; k < STEPS; k++) {
        for (int i = 0; i < N; i++) {
            g[i] = (float)((i * 7 + k * 3) % 11 - 5);
            sumg[i] += g[i];
        }
        const float *gp[1] = { g };
        float *pp[1] = { params };
        int rc = gddr_step(c, gp, pp);
        ck_assert_msg(rc == GDDR_OK, "step %d: %s (%s)", k, gddr_strerror(rc), gddr_client_errmsg(c));
        ck_assert_int_eq(gddr__residual_get(c, id, r), GDDR_OK);
        ck_assert_int_eq(gddr__residual_age_get(c, id, age, &nch), GDDR_OK);
        ck_assert_uint_eq(nch, 7);
        for (int i = 0; i < N; i++) {
            float lhs = w0[i] - params[i], rhs = sumg[i] - r[i];
            ck_assert_msg(lhs == rhs, "step %d, element %d: w0 - w = %g but sum(g) - r = %g", k, i,
                          (double)lhs, (double)rhs);
        }
        for (size_t ch = 0; ch < nch; ch++) {
            ck_assert_msg(age[ch] <= 3, "step %d: chunk %zu is %u steps old, tau is 3", k, ch, age[ch]);
            if (age[ch] > max_age)
                max_age = age[ch];
            if (age[ch] == 0)
                for (size_t i = ch * 8; i < ch * 8 + 8 && i < N; i++)
                    ck_assert_msg(r[i] == 0.0f, "step %d: chunk %zu was sent but r[%zu] = %g", k,
                                  ch, i, (double)r[i]);
        }
    }
    ck_assert_msg(max_age == 3, "with alpha 0.5 some chunk should reach age tau = 3 in %d steps",
                  STEPS);
    /* The server agrees (not just the parameters the step returned). */
    float want[N];
    for (int i = 0; i < N; i++)
        want[i] = w0[i] - (sumg[i] - r[i]);
    pull_exact(c, id, want, N, 0, "server w after the last step");
    gddr_client_counters k;
    gddr_client_counters_get(c, &k);
    ck_assert_msg(k.values_pushed < (uint64_t)N * STEPS, "GDDR pushed %" PRIu64 " values, dense is %d",
                  k.values_pushed, N * STEPS);
    ck_assert_uint_eq(k.tau_count, STEPS);
    ck_assert_uint_eq(k.tau_sum, 3 * STEPS);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* delay_auto (client/src/step.c): a step holds chunks or pushes every
 * chunk, on pullpick.c's schedule (its probes run both kinds whatever the
 * timings). The first dense step after GDDR ones sends the residual too:
 * after it r is zero, and while the pushes stay dense r stays zero and every
 * push carries all N values. Through every switch the server's w0 - w is
 * exactly sum(g) - r (lr = 1, integer gradients): nothing is lost or sent
 * twice. Both kinds' costs were measured (a cost never taken stays -1). */
START_TEST(test_delay_auto_conservation)
{
    gt_server s;
    START_SERVER(s, "chunk=8", "lr=1", "tau_dynamic=false", "tau_init=3", "tau_min=1");
    enum { N = 50, STEPS = 80 };
    gddr_client_opts o = test_opts(s.endpoint, 0, 1, 0.5);
    o.hold_schedule = GDDR_HOLD_SMALLEST;
    o.delay_auto = 1;
    gddr_client *c = open_opts(&o);
    float w0[N], sumg[N] = { 0 }, g[N], params[N], r[N];
    for (int i = 0; i < N; i++)
        w0[i] = (float)(i % 9 - 4);
    int id;
    ck_assert_int_eq(gddr_register(c, "auto", w0, N, &id, NULL), GDDR_OK);
    int kinds[2] = { 0, 0 }, flushes = 0, held = 0, prev = -1;
    for (int k = 0; k < STEPS; k++) {
        for (int i = 0; i < N; i++) {
            g[i] = (float)((i * 7 + k * 3) % 11 - 5);
            sumg[i] += g[i];
        }
        int dense = gddr__pullpick_next_whole(&c->push_pick);
        gddr_client_counters k0, k1;
        gddr_client_counters_get(c, &k0);
        const float *gp[1] = { g };
        float *pp[1] = { params };
        int rc = gddr_step(c, gp, pp);
        ck_assert_msg(rc == GDDR_OK, "step %d: %s (%s)", k, gddr_strerror(rc), gddr_client_errmsg(c));
        gddr_client_counters_get(c, &k1);
        uint64_t pushed = k1.values_pushed - k0.values_pushed;
        ck_assert_int_eq(gddr__residual_get(c, id, r), GDDR_OK);
        if (dense) {
            ck_assert_msg(pushed == N, "step %d: a dense step pushed %" PRIu64 " of %d values", k, pushed, N);
            for (int i = 0; i < N; i++)
                ck_assert_msg(r[i] == 0.0f, "step %d (dense%s): r[%d] = %g", k, prev == 0 ? ", a flush" : "",
                              i, (double)r[i]);
            flushes += prev == 0;
        } else {
            held += pushed < N;
        }
        for (int i = 0; i < N; i++) {
            float lhs = w0[i] - params[i], rhs = sumg[i] - r[i];
            ck_assert_msg(lhs == rhs, "step %d (%s), element %d: w0 - w = %g but sum(g) - r = %g", k,
                          dense ? "dense" : "GDDR", i, (double)lhs, (double)rhs);
        }
        kinds[dense]++;
        prev = dense;
    }
    ck_assert_msg(kinds[0] >= PICK_FIRST && kinds[1] >= PICK_PROBE_MIN && flushes >= 1 && held >= PICK_FIRST,
                  "%d GDDR steps (%d held chunks), %d dense (%d flushes)", kinds[0], held, kinds[1], flushes);
    const gddr__pullpick *pk = &c->push_pick;
    ck_assert_msg(pk->probes >= 1 && pk->last_cost[0] > 0 && pk->last_cost[1] > 0,
                  "push costs not measured: %" PRIu64 " probes, %.0f / %.0f us", pk->probes, pk->last_cost[0],
                  pk->last_cost[1]);
    float want[N];
    for (int i = 0; i < N; i++)
        want[i] = w0[i] - (sumg[i] - r[i]);
    pull_exact(c, id, want, N, 0, "server w after the last step");
    printf("residual: delay_auto, %d steps on loopback: %d GDDR and %d dense, %" PRIu64 " probes, %" PRIu64
           " changes of kind (%.0f us GDDR, %.0f us dense at the last decision)\n", STEPS, kinds[0], kinds[1],
           pk->probes, pk->flips, pk->last_cost[0], pk->last_cost[1]);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 5. dynamic tau ---------------------------------------------------------------- */

/* Pushes a gradient of norm `norm` (all n entries equal). */
static void push_norm(gddr_client *c, int id, size_t n, float norm)
{
    float g[64];
    for (size_t i = 0; i < n; i++)
        g[i] = norm / sqrtf((float)n);
    int rc = gddr_push(c, id, g, NULL);
    ck_assert_msg(rc == GDDR_OK, "push: %s (%s)", gddr_strerror(rc), gddr_client_errmsg(c));
}

START_TEST(test_dynamic_tau)
{
    gt_server s;
    /* defaults: tau 2..8, start 4, rates 0.6 / 0.3, EMA 0.9; patience 5 */
    START_SERVER(s, "lr=0.0001", "tau_patience=5");
    enum { N = 64 };
    float w0[N] = { 0 };
    gddr_client *c = open_client(s.endpoint, 0, 1, 0);
    int id;
    ck_assert_int_eq(gddr_register(c, "tau", w0, N, &id, NULL), GDDR_OK);
    ck_assert_int_eq(server_tau(c), 4);
    /* Calm: tau climbs one step per 5 calm pushes, up to tau_max. */
    int k = 0, tau = 4;
    for (; k < 200 && tau < 8; k++) {
        push_norm(c, id, N, 1.0f);
        int t = server_tau(c);
        ck_assert_msg(t >= tau && t <= tau + 1, "calm push %d: tau went from %d to %d", k, tau, t);
        tau = t;
    }
    ck_assert_msg(tau == 8, "tau is %d after %d calm pushes, expected tau_max 8", tau, k);
    ck_assert_msg(k <= 30, "tau needed %d calm pushes to climb from 4 to 8", k);
    push_norm(c, id, N, 1.0f);
    ck_assert_int_eq(server_tau(c), 8); /* stays at the bound */
    /* A spike: halved at once. */
    push_norm(c, id, N, 100.0f);
    ck_assert_int_eq(server_tau(c), 4);
    /* Calm again: back up to tau_max, never below tau_min on the way. */
    tau = 4;
    int lowest = 4;
    for (k = 0; k < 600 && tau < 8; k++) {
        push_norm(c, id, N, 1.0f);
        tau = server_tau(c);
        if (tau < lowest)
            lowest = tau;
    }
    ck_assert_msg(tau == 8, "tau is %d after %d calm pushes following the spike", tau, k);
    ck_assert_msg(lowest >= 2, "tau fell to %d, below tau_min", lowest);
    /* Lasting turbulence (norms alternating 1 and 50): tau keeps shrinking
     * down to tau_min and stays there. */
    for (k = 0; k < 40; k++) {
        push_norm(c, id, N, k % 2 ? 50.0f : 1.0f);
        tau = server_tau(c);
        ck_assert_msg(tau >= 2, "turbulent push %d: tau %d below tau_min", k, tau);
    }
    ck_assert_msg(tau == 2, "tau is %d after 40 turbulent pushes, expected tau_min 2", tau);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 6. the client obeys the tau of the replies ------------------------------------ */

/* delay_fraction is the share of chunks held back, whatever tau: at tau 2
 * a hold probability of alpha itself would send 1/(1 + a + a^2) = 64% of
 * the chunks at alpha 0.4, not 60% (gddr_hold_probability). Counted in
 * values pushed over 200 steps of a 4096-chunk tensor, for tau 2 and 8. */
static double sent_share(int tau)
{
    gt_server s;
    char t[32];
    snprintf(t, sizeof t, "tau_init=%d", tau);
    START_SERVER(s, "chunk=4", "lr=0.0001", "tau_dynamic=false", t);
    enum { N = 4 * 4096, STEPS = 200 };
    float *w0 = calloc(N, 4), *g = calloc(N, 4), *params = calloc(N, 4);
    gddr_client *c = open_client(s.endpoint, 0, 1, 0.4);
    int id;
    ck_assert_int_eq(gddr_register(c, "share", w0, N, &id, NULL), GDDR_OK);
    for (int i = 0; i < N; i++)
        g[i] = 1.0f / 1024;
    gddr_client_counters k0, k1;
    for (int k = 0; k < STEPS + 20; k++) {
        if (k == 20) /* the first steps: every chunk young, more held */
            ck_assert_int_eq(gddr_client_counters_get(c, &k0), GDDR_OK);
        const float *gp[1] = { g };
        float *pp[1] = { params };
        ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
    }
    ck_assert_int_eq(gddr_client_counters_get(c, &k1), GDDR_OK);
    gddr_client_close(&c);
    stop_server(&s);
    free(w0), free(g), free(params);
    return (double)(k1.values_pushed - k0.values_pushed) / ((double)STEPS * N);
}

START_TEST(test_held_share_is_alpha)
{
    for (int tau = 2; tau <= 8; tau += 6) {
        double share = sent_share(tau);
        printf("residual: alpha 0.4, tau %d: %.4f of the values sent\n", tau, share);
        ck_assert_msg(fabs(share - 0.6) < 0.01, "alpha 0.4, tau %d: %.4f of the values sent, not 0.60",
                      tau, share);
    }
    /* The probability itself: 1 + p + ... + p^tau = 1 / (1 - alpha). */
    for (uint32_t tau = 1; tau <= 8; tau++) {
        double p = gddr_hold_probability(0.4f, tau), sum = 1, pk = 1;
        for (uint32_t k = 0; k < tau; k++)
            sum += (pk *= p);
        ck_assert_msg(fabs(sum - 1 / 0.6) < 1e-5, "tau %u: p %.7f, sum %.7f", tau, p, sum);
    }
    /* alpha 0.6 at tau 1 cannot be: every chunk is held every other step. */
    ck_assert(gddr_hold_probability(0.6f, 1) == 1.0f);
    ck_assert(gddr_hold_probability(0.0f, 4) == 0.0f);
    ck_assert(gddr_hold_probability(0.4f, 40) < 0.4001f && gddr_hold_probability(0.4f, 40) >= 0.4f);
}
END_TEST

/* hold_schedule reaches the mask: with auto, a sync server's workers get
 * the staggered schedule (period floor(tau / alpha), phases spread by rank
 * over the world size: 0, 2, 5, 7 of 10 for 4 workers at tau 4, alpha 0.4),
 * an async server's the smallest chunks (no period: the pick, not the
 * hash); the option overrides each way. The schedules' effect on the masks
 * is gddr-tests kernels residual_staggered and residual_smallest. */
static gddr_residual_args hold_args(const char *ep, int rank, int schedule)
{
    gddr_client_opts o = test_opts(ep, rank, 4, 0.4);
    o.hold_schedule = schedule;
    gddr_client *c = open_opts(&o);
    float w0[64] = { 0 };
    int id;
    ck_assert_int_eq(gddr_register(c, "t", w0, 64, &id, NULL), GDDR_OK);
    gddr_residual_args a = gddr__residual_args(c, id);
    gddr_client_close(&c);
    return a;
}

START_TEST(test_hold_schedule_by_mode)
{
    static const uint32_t phases[4] = { 0, 2, 5, 7 };
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=4", "chunk=4", "tau_dynamic=false", "tau_init=4");
    for (int r = 0; r < 4; r++) {
        gddr_residual_args a = hold_args(s.endpoint, r, GDDR_HOLD_AUTO);
        ck_assert_uint_eq(a.tau, 4);
        ck_assert_uint_eq(a.period, 10);
        ck_assert_uint_eq(a.phase, phases[r]);
        ck_assert(a.alpha > 0);
    }
    ck_assert_uint_eq(hold_args(s.endpoint, 1, GDDR_HOLD_RANDOM).period, 0);
    {
        gddr_client_opts o = test_opts(s.endpoint, 1, 4, 0.4);
        o.hold_schedule = GDDR_HOLD_AUTO;
        gddr_client *c = open_opts(&o);
        ck_assert(!gddr__holds_smallest(c)); /* sync: staggered */
        gddr_client_close(&c);
    }
    stop_server(&s);
    /* In sync the cycle runs on the tensor's version, not the worker's own
     * step count: a worker that starts after 3 steps (a restart, a late
     * join) takes its place in the others' cycle: rank 0's phase 0 + 3. */
    START_SERVER(s, "mode=sync", "workers=1", "chunk=4", "tau_dynamic=false", "tau_init=4",
                 "lr=0.001");
    {
        gddr_client_opts o = test_opts(s.endpoint, 0, 4, 0.4);
        o.hold_schedule = GDDR_HOLD_AUTO;
        gddr_client *w = open_opts(&o);
        float w0[64] = { 0 }, g[64], params[64];
        int id;
        ck_assert_int_eq(gddr_register(w, "t", w0, 64, &id, NULL), GDDR_OK);
        for (int i = 0; i < 64; i++)
            g[i] = 0.01f * (float)(i % 7);
        for (int k = 0; k < 3; k++) {
            const float *gp[1] = { g };
            float *pp[1] = { params };
            ck_assert_int_eq(gddr_step(w, gp, pp), GDDR_OK);
        }
        ck_assert_uint_eq(gddr__residual_args(w, id).phase, 3);
        gddr_client_close(&w);
    }
    /* a new process for the rank: its step count is 0, the tensor is at
     * version 4 (the first one's flush at close made a version) */
    gddr_residual_args late = hold_args(s.endpoint, 0, GDDR_HOLD_AUTO);
    ck_assert_uint_eq(late.period, 10);
    ck_assert_uint_eq(late.phase, 4);
    stop_server(&s);
    START_SERVER(s, "chunk=4", "tau_dynamic=false", "tau_init=4");
    ck_assert_uint_eq(hold_args(s.endpoint, 1, GDDR_HOLD_AUTO).period, 0);
    /* auto in async: the smallest chunks (random only when asked for) */
    for (int k = 0; k < 3; k++) {
        static const int sched[3] = { GDDR_HOLD_AUTO, GDDR_HOLD_SMALLEST, GDDR_HOLD_RANDOM };
        gddr_client_opts o = test_opts(s.endpoint, 1, 4, 0.4);
        o.hold_schedule = sched[k];
        gddr_client *c = open_opts(&o);
        ck_assert_int_eq(gddr__holds_smallest(c), k < 2);
        gddr_client_close(&c);
    }
    gddr_residual_args a = hold_args(s.endpoint, 3, GDDR_HOLD_STAGGERED);
    ck_assert_uint_eq(a.period, 10);
    ck_assert_uint_eq(a.phase, 7);
    stop_server(&s);
}
END_TEST

/* hold_schedule = smallest through a client: the chunks with the least
 * r + g stay in the residual, the others go, and a chunk that reached tau
 * goes whatever its size. 16 chunks of 4 at delay_fraction 0.5 (8 held a
 * step); chunk c's gradient is (c + 1) / 16 in every element, except
 * chunk 3, which is 0. */
START_TEST(test_hold_smallest_client)
{
    gt_server s;
    START_SERVER(s, "chunk=4", "tau_dynamic=false", "tau_init=2", "lr=0.001");
    gddr_client_opts o = test_opts(s.endpoint, 0, 1, 0.5);
    o.hold_schedule = GDDR_HOLD_SMALLEST;
    gddr_client *c = open_opts(&o);
    float w0[64] = { 0 }, g[64], params[64], r[64];
    int id;
    ck_assert_int_eq(gddr_register(c, "t", w0, 64, &id, NULL), GDDR_OK);
    for (int i = 0; i < 64; i++)
        g[i] = i / 4 == 3 ? 0.0f : (float)(i / 4 + 1) / 16.0f;
    const float *gp[1] = { g };
    float *pp[1] = { params };
    uint32_t ages[16];
    size_t na = 16;
    /* step 1: chunks 0-7 are the smallest (3 the least) and stay */
    ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
    ck_assert_int_eq(gddr__residual_get(c, id, r), GDDR_OK);
    for (int i = 0; i < 64; i++)
        ck_assert_msg(r[i] == (i < 32 ? g[i] : 0.0f), "step 1: r[%d] = %g", i, r[i]);
    /* step 2: u = r + g is 2g on chunks 0-7 (in sixteenths: 2 4 6 0 10 12
     * 14 16) and g on 8-15 (9 ... 16): the 8 smallest are 3 0 1 2 8, then
     * 4 and 9 at 10 (the lower index first), then 10 at 11 */
    ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
    ck_assert_int_eq(gddr__residual_get(c, id, r), GDDR_OK);
    for (int i = 0; i < 64; i++) {
        int k = i / 4;
        float want = k <= 4 ? 2 * g[i] : k >= 8 && k <= 10 ? g[i] : 0.0f;
        ck_assert_msg(r[i] == want, "step 2: r[%d] = %g, want %g", i, r[i], want);
    }
    ck_assert_int_eq(gddr__residual_age_get(c, id, ages, &na), GDDR_OK);
    ck_assert(ages[0] == 2 && ages[4] == 2 && ages[8] == 1 && ages[5] == 0);
    /* step 3: 0-4 reached tau 2 and go, however small; of the rest, 8-10
     * (2g: 18 20 22) are now the largest and go too: 5-7 and 11-15 stay */
    ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
    ck_assert_int_eq(gddr__residual_get(c, id, r), GDDR_OK);
    for (int i = 0; i < 64; i++) {
        int k = i / 4;
        float want = (k >= 5 && k <= 7) || k >= 11 ? g[i] : 0.0f;
        ck_assert_msg(r[i] == want, "step 3: r[%d] = %g, want %g", i, r[i], want);
    }
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* Sync steps feed the tau controller at the step's close, in rank order
 * (server/tau.c): tau does not move inside a step, so every worker of a
 * step holds under the same tau (the staggered schedule's cycles are tau
 * long), and the same pushes give the same tau whatever order they arrive
 * in. Two tensors get the same norms each step, rank 0 first for one and
 * rank 1 first for the other; every reply's tau is compared. */
static uint32_t push_tau(raw_conn *r, uint32_t rank, int id, float norm, uint64_t v, int *applied)
{
    enum { N = 16 };
    float g[N];
    for (int i = 0; i < N; i++)
        g[i] = norm / 4.0f; /* |g| = norm */
    uint64_t rid = raw_push(r, rank, (uint32_t)id, g, N, N * 4, NULL, 0, v, norm);
    Gddr__Reply *rep = raw_recv(r, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rep && rep->body_case == GDDR__REPLY__BODY_PUSH && rep->req_id == rid,
                  "rank %u: no push reply", rank);
    uint32_t tau = rep->tau;
    *applied = rep->push->applied;
    gddr__reply__free_unpacked(rep, NULL);
    return tau;
}

START_TEST(test_sync_tau_by_rank)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "lr=0.0001", "tau_patience=1");
    float w0[16] = { 0 };
    gddr_client *c = open_client(s.endpoint, 0, 2, 0);
    int ida, idb;
    ck_assert_int_eq(gddr_register(c, "ta", w0, 16, &ida, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c, "tb", w0, 16, &idb, NULL), GDDR_OK);
    gddr_client_close(&c);
    raw_conn r0, r1;
    raw_open(&r0, s.endpoint);
    raw_open(&r1, s.endpoint);
    raw_hello(&r0, 0, 2);
    raw_hello(&r1, 1, 2);
    /* calm, a spike from rank 1, calm, one from rank 0, ... */
    static const float norms[][2] = { { 1, 1 }, { 1, 9 }, { 2, 1 }, { 1, 1 }, { 30, 2 }, { 1, 1 },
                                      { 1, 1 }, { 1, 1 }, { 3, 40 }, { 1, 1 }, { 1, 2 }, { 1, 1 },
                                      { 1, 1 }, { 1, 1 }, { 1, 1 }, { 1, 1 } };
    uint32_t before = 4, moves = 0;
    for (uint64_t k = 0; k < sizeof norms / sizeof norms[0]; k++) {
        int ap[4];
        uint32_t a0 = push_tau(&r0, 0, ida, norms[k][0], k, &ap[0]);
        uint32_t a1 = push_tau(&r1, 1, ida, norms[k][1], k, &ap[1]);
        uint32_t b1 = push_tau(&r1, 1, idb, norms[k][1], k, &ap[2]);
        uint32_t b0 = push_tau(&r0, 0, idb, norms[k][0], k, &ap[3]);
        ck_assert_msg(!ap[0] && ap[1] && !ap[2] && ap[3], "step %llu: the second push completes it",
                      (unsigned long long)k);
        ck_assert_msg(a0 == before && b1 == before,
                      "step %llu: tau moved inside the step (%u, %u; %u before it)",
                      (unsigned long long)k, a0, b1, before);
        ck_assert_msg(a1 == b0, "step %llu: tau %u with rank 0 first, %u with rank 1 first",
                      (unsigned long long)k, a1, b0);
        moves += a1 != before;
        before = a1;
    }
    ck_assert_msg(moves >= 2, "tau moved %u times: the norms did not exercise the controller", moves);
    raw_close(&r0);
    raw_close(&r1);
    stop_server(&s);
}
END_TEST

START_TEST(test_client_obeys_reply_tau)
{
    gt_server s;
    /* tau starts at 8; no smoothing, so each push's own change rate
     * decides; tau_rate_low = 0: never calm enough to grow back. */
    START_SERVER(s, "chunk=4", "lr=0.0001", "tau_init=8", "tau_min=2", "tau_max=8", "tau_ema=0",
                 "tau_rate_high=0.5", "tau_rate_low=0", "tau_patience=1");
    enum { N = 64 }; /* 16 chunks */
    float w0[N] = { 0 }, g[N], params[N];
    gddr_client *c = open_client(s.endpoint, 0, 1, 0.9);
    int id;
    ck_assert_int_eq(gddr_register(c, "obey", w0, N, &id, NULL), GDDR_OK);
    uint32_t age[16];
    size_t nch;
    uint32_t max_before = 0;
    /* norms: 1 x 20 (tau 8), 100, 100, 1 (8 -> 4 -> 2), then 1 forever */
    for (int k = 0; k < 40; k++) {
        float norm = (k == 20 || k == 21) ? 100.0f : 1.0f;
        for (int i = 0; i < N; i++)
            g[i] = norm / 8.0f;
        const float *gp[1] = { g };
        float *pp[1] = { params };
        ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
        ck_assert_int_eq(gddr__residual_age_get(c, id, age, &nch), GDDR_OK);
        uint32_t mx = 0;
        for (size_t ch = 0; ch < nch; ch++)
            mx = age[ch] > mx ? age[ch] : mx;
        if (k < 20) {
            ck_assert_msg(mx <= 8, "step %d: age %u over tau 8", k, mx);
            max_before = mx > max_before ? mx : max_before;
        }
        if (k == 22)
            ck_assert_int_eq(server_tau(c), 2);
        /* step 22's reply said tau = 2: from step 23 on, nothing older */
        if (k >= 23)
            ck_assert_msg(mx <= 2, "step %d: a chunk is %u steps old after the server asked for tau 2",
                          k, mx);
    }
    ck_assert_msg(max_before > 2, "with alpha 0.9 and tau 8 some chunk should be older than 2 (max %u)",
                  max_before);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 7. the pipeline --------------------------------------------------------------- */

enum { PN = 40, PSTEPS = 25 };

static void pipe_grad(int k, float *g)
{
    for (int i = 0; i < PN; i++)
        g[i] = (float)((i * 5 + k * 7) % 13 - 6);
}

/* One run of PSTEPS steps; pipelined: submit k, then wait k-1. Records
 * the parameters each step returned and the final server w. */
static void pipe_run(int pipelined, int threaded, float hist[PSTEPS][PN], float *final)
{
    gt_server s;
    START_SERVER(s, "chunk=8", "lr=0.5", "tau_dynamic=false", "tau_init=4");
    float w0[PN];
    for (int i = 0; i < PN; i++)
        w0[i] = (float)(i % 7);
    gddr_client *c = open_client_ex(s.endpoint, 0, 1, 0.4, REPLY_WAIT_MS, 1000, threaded);
    int id;
    ck_assert_int_eq(gddr_register(c, "pipe", w0, PN, &id, NULL), GDDR_OK);
    float g[PN], params[PN];
    const float *gp[1] = { g };
    float *pp[1] = { params };
    for (int k = 0; k < PSTEPS; k++) {
        pipe_grad(k, g);
        if (!pipelined) {
            ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
            memcpy(hist[k], params, sizeof params);
            continue;
        }
        int rc = gddr_step_submit(c, gp);
        ck_assert_msg(rc == GDDR_OK, "submit %d: %s", k, gddr_strerror(rc));
        if (k == 0) {
            /* In flight: the client belongs to the library thread. */
            ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_ESTATE);
            continue;
        }
        if (k == 1) /* two in flight: no third */
            ck_assert_int_eq(gddr_step_submit(c, gp), GDDR_ESTATE);
        rc = gddr_step_wait(c, pp);
        ck_assert_msg(rc == GDDR_OK, "wait %d: %s (%s)", k - 1, gddr_strerror(rc), gddr_client_errmsg(c));
        memcpy(hist[k - 1], params, sizeof params);
    }
    if (pipelined) {
        ck_assert_int_eq(gddr_step_wait(c, pp), GDDR_OK);
        memcpy(hist[PSTEPS - 1], params, sizeof params);
        ck_assert_int_eq(gddr_step_wait(c, pp), GDDR_ESTATE); /* nothing in flight */
    }
    /* Drained: the client is the caller's again. */
    uint64_t v = 0;
    ck_assert_int_eq(gddr_pull(c, id, final, 0, &v), GDDR_OK);
    ck_assert_uint_eq(v, PSTEPS);
    gddr_client_counters k;
    gddr_client_counters_get(c, &k);
    ck_assert_uint_eq(k.steps, PSTEPS);
    ck_assert_msg(k.step_ns > 0, "no step time counted");
    gddr_client_close(&c);
    stop_server(&s);
}

/* The gradients do not depend on the parameters here, so pipelining
 * changes nothing but the tags (one-step-stale births): the masks, the
 * pushes and therefore every returned parameter vector and the final w
 * are bitwise those of plain gddr_step. (In real training the gradient
 * is computed on one-step-stale parameters, and the runs differ.) */
START_TEST(test_pipeline_matches_step)
{
    static float h_step[PSTEPS][PN], h_pipe[PSTEPS][PN], h_inline[PSTEPS][PN];
    float f_step[PN], f_pipe[PN], f_inline[PN];
    pipe_run(0, 1, h_step, f_step);
    pipe_run(1, 1, h_pipe, f_pipe);
    pipe_run(1, 0, h_inline, f_inline); /* async_pipeline = 0: no thread */
    for (int k = 0; k < PSTEPS; k++) {
        char what[64];
        snprintf(what, sizeof what, "parameters after step %d (pipelined)", k);
        assert_same_floats(h_pipe[k], h_step[k], PN, what);
        snprintf(what, sizeof what, "parameters after step %d (inline)", k);
        assert_same_floats(h_inline[k], h_step[k], PN, what);
    }
    assert_same_floats(f_pipe, f_step, PN, "final server w, pipelined vs gddr_step");
    assert_same_floats(f_inline, f_step, PN, "final server w, inline vs gddr_step");
}
END_TEST

/* A dead server: the wait returns GDDR_ETIMEDOUT (its bound: 3 * timeout
 * + reconnect + 2 s = 3.4 s) and closing the client (which joins the
 * library thread) does not hang. The times are printed; the asserted
 * bounds are 10 times larger and only catch a hang. */
START_TEST(test_pipeline_server_gone)
{
    gt_server s;
    START_SERVER(s, "chunk=8", "lr=0.5");
    enum { N = 24 };
    float w0[N] = { 0 }, g[N], params[N];
    for (int i = 0; i < N; i++)
        g[i] = (float)(i % 3);
    gddr_client *c = open_client_ex(s.endpoint, 0, 1, 0.4, 300, 500, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "gone", w0, N, &id, NULL), GDDR_OK);
    const float *gp[1] = { g };
    float *pp[1] = { params };
    ck_assert_int_eq(gddr_step_submit(c, gp), GDDR_OK);
    ck_assert_int_eq(gddr_step_wait(c, pp), GDDR_OK);
    ck_assert_int_eq(gt_server_signal(&s, SIGKILL), 0);
    ck_assert_int_eq(gt_wait_pid(s.pid, REPLY_WAIT_MS, NULL), 1);
    s.pid = 0;
    int64_t t0 = gt_now_ms();
    ck_assert_int_eq(gddr_step_submit(c, gp), GDDR_OK);
    ck_assert_int_eq(gddr_step_submit(c, gp), GDDR_OK);
    int rc = gddr_step_wait(c, pp);
    int64_t ms = gt_now_ms() - t0;
    ck_assert_msg(rc == GDDR_ETIMEDOUT, "wait with the server gone: %s, expected %s", gddr_strerror(rc),
                  gddr_strerror(GDDR_ETIMEDOUT));
    ck_assert_msg(ms < 34000, "the wait for a dead server hung for %lld ms", (long long)ms);
    t0 = gt_now_ms();
    gddr_client_close(&c); /* the second step may still be in flight */
    int64_t close_ms = gt_now_ms() - t0;
    fprintf(stderr, "residual: pipelined wait with the server gone: GDDR_ETIMEDOUT after %lld ms "
                    "(bound 3400 ms), close took %lld ms\n",
            (long long)ms, (long long)close_ms);
    ck_assert_msg(close_ms < 34000, "closing the client hung for %lld ms", (long long)close_ms);
}
END_TEST

/* ---- 8. the experiment script, quick ------------------------------------------------ */

/* experiment-gddr.sh --quick: alpha 0.4 sends fewer values and bytes than
 * dense, the server's model still learns, and the pipelined row is there. */
START_TEST(test_gddr_experiment_saves_bytes)
{
    char *argv[] = { "/bin/bash", "scripts/experiment-gddr.sh", "--quick", NULL };
    char *out = NULL, err[256] = "";
    int status = 0;
    int64_t t0 = gt_now_ms();
    int rc = gt_run_capture(argv, EXPERIMENT_WAIT_MS, 0, &out, &status, err, sizeof err);
    int64_t ms = gt_now_ms() - t0;
    ck_assert_msg(rc == 0, "experiment-gddr.sh --quick: %s", err);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "experiment-gddr.sh --quick failed:\n%s",
                  out ? out : "");
    fprintf(stderr, "residual: experiment-gddr.sh --quick took %lld ms\n", (long long)ms);
    /* the alpha = 0.4 row: fewer values and bytes than dense */
    const char *row = out ? strstr(out, "| GDDR a=0.4 tau=4 sync ") : NULL;
    ck_assert_msg(row != NULL, "no alpha 0.4 row in:\n%s", out ? out : "");
    double acc, dacc, wacc, loss, vals, theory, bytes;
    int n = sscanf(row, "| GDDR a=0.4 tau=4 sync | %lf | %lf | %lf | %lf | %lf | %lf | %lf", &acc,
                   &dacc, &wacc, &loss, &vals, &theory, &bytes);
    ck_assert_msg(n == 7, "cannot read the alpha 0.4 row (%d fields): %.200s", n, row);
    /* The server's final model (after the flushes) learned the easy set. */
    ck_assert_msg(acc > 0.9 && acc <= 1.0, "server's accuracy %.4f", acc);
    ck_assert_msg(vals > 0.3 && vals < 0.8, "values per step vs dense %.3f", vals);
    ck_assert_msg(bytes < 0.8, "push bytes vs dense %.3f", bytes);
    ck_assert_msg(strstr(out, "| GDDR a=0.4 tau=4 sync pipe ") != NULL, "no pipelined row");
    free(out);
}
END_TEST

/* ---- 9. the device path (GPU cases: registered only with a GPU) ---------------------------------------- */

/* Says which GPU and plugin serve a device case. The device cases are
 * registered only where a GPU is usable (tests/gpu.h); elsewhere the case
 * gpu_skipped says why. */
static void gpu_say(const char *what)
{
    char why[256];
    ck_assert_msg(gddr_cuda_available(why, sizeof why), "%s: the GPU went away: %s", what, why);
    fprintf(stderr, "residual: %s on %s (plugin %s)\n", what, why, gddr__cuda_plugin_path());
}

static char gpu_why[256];

START_TEST(test_gpu_skipped)
{
    printf("SKIP residual gpu (device_step, gpu_device_cases): %s\n", gpu_why);
    fflush(stdout);
    ck_assert(gpu_why[0] != 0);
}
END_TEST

/* Device gradients give the same pushes as host gradients: the same final
 * w and residual, bitwise (the CUDA kernel's masks equal the CPU's and
 * u = r + g is one rounding). */
START_TEST(test_device_step_matches_host)
{
    gpu_say("device_step");
    enum { N = 3000, STEPS = 20 };
    float finals[2][N], resid[2][N];
    for (int pass = 0; pass < 2; pass++) {
        gt_server s;
        START_SERVER(s, "chunk=256", "lr=0.5", "tau_dynamic=false", "tau_init=4");
        static float w0[N], g[N], params[N];
        for (int i = 0; i < N; i++)
            w0[i] = (float)(i % 11);
        gddr_client *c = open_client(s.endpoint, 0, 1, 0.4);
        int id;
        ck_assert_int_eq(gddr_register(c, "dev", w0, N, &id, NULL), GDDR_OK);
        float *dg = NULL, *dp = NULL;
        if (pass == 1) {
            ck_assert_int_eq(gddr_cuda_malloc((void **)&dg, N * 4), GDDR_OK);
            ck_assert_int_eq(gddr_cuda_malloc((void **)&dp, N * 4), GDDR_OK);
        }
        for (int k = 0; k < STEPS; k++) {
            for (int i = 0; i < N; i++)
                g[i] = (float)((i * 3 + k) % 9 - 4);
            const float *gp[1] = { pass ? dg : g };
            float *pp[1] = { pass ? dp : params };
            if (pass) {
                ck_assert_int_eq(gddr_cuda_memcpy_h2d(dg, g, N * 4, NULL), GDDR_OK);
                ck_assert_int_eq(gddr_cuda_sync(NULL), GDDR_OK);
            }
            int rc = gddr_step(c, gp, pp);
            ck_assert_msg(rc == GDDR_OK, "pass %d step %d: %s (%s)", pass, k, gddr_strerror(rc),
                          gddr_client_errmsg(c));
        }
        if (pass) {
            ck_assert_int_eq(gddr_cuda_memcpy_d2h(params, dp, N * 4, NULL), GDDR_OK);
            ck_assert_int_eq(gddr_cuda_sync(NULL), GDDR_OK);
        }
        memcpy(finals[pass], params, sizeof params);
        ck_assert_int_eq(gddr__residual_get(c, id, resid[pass]), GDDR_OK);
        gddr_client_close(&c);
        gddr_cuda_free(dg);
        gddr_cuda_free(dp);
        stop_server(&s);
    }
    assert_same_floats(finals[1], finals[0], N, "parameters, device vs host gradients");
    assert_same_floats(resid[1], resid[0], N, "residual, device vs host");
}
END_TEST


/* ---- 10. the device path on the CPU (tests/fake_cuda.c) ------------------------------- */

/* The fake plugin serves "device" memory from the host and runs the CPU
 * twins, so step.c's device orchestration -- the plan, the fused passes,
 * the single wait, the copies, the error routing -- runs here without a
 * GPU. It proves nothing about the CUDA kernels themselves (check_kernels
 * compares those with the twins on a GPU). */
static void load_fake_cuda(void)
{
    char path[1024], why[1024];
    snprintf(path, sizeof path, "%s/../tests/libgddr-fakecuda.so", gt_bin_dir());
    int rc = gddr__cuda_plugin_load(path, why, sizeof why);
    ck_assert_msg(rc == GDDR_OK, "loading %s: %s", path, why);
}

static void *fake_sym(const char *name)
{
    void *f = dlsym(gddr__cuda_plugin_handle(), name);
    ck_assert_msg(f != NULL, "the fake plugin lacks %s", name);
    return f;
}

static int fake_syncs(void)
{
    int (*f)(void);
    void *sym = fake_sym("gddr_fake_cuda_syncs");
    memcpy(&f, &sym, sizeof f);
    return f();
}

static void fake_fail(const char *call)
{
    void (*f)(const char *);
    void *sym = fake_sym("gddr_fake_cuda_fail");
    memcpy(&f, &sym, sizeof f);
    f(call);
}

typedef struct dev_case {
    const char *name;
    double alpha, clip, dc_lambda;
    int dc_adaptive, dc_mode;
    int waits; /* stream waits per step from the second on */
    int hold;  /* hold_schedule (0: random here; auto would hold the smallest in async) */
    int dense_window; /* delay_auto, its kind set by hand: steps 4-7 push every chunk (4 the
                         flush of the residual, 5 the NaN step), the others hold */
} dev_case;

static const dev_case dev_cases[] = {
    { "gddr", 0.4, 0.0, 0.0, 0, GDDR_DC_DIAG, 2, 0, 0 },
    { "gddr+staggered", 0.4, 0.0, 0.0, 0, GDDR_DC_DIAG, 2, GDDR_HOLD_STAGGERED, 0 },
    /* every tensor's scores come down before the plans: one wait more a step */
    { "gddr+smallest", 0.4, 0.0, 0.0, 0, GDDR_DC_DIAG, 3, GDDR_HOLD_SMALLEST, 0 },
    { "gddr+smallest+clip+dc-a", 0.4, 30.0, 0.01, 1, GDDR_DC_DIAG, 4, GDDR_HOLD_SMALLEST, 0 },
    { "gddr+clip", 0.4, 30.0, 0.0, 0, GDDR_DC_DIAG, 2, 0, 0 },
    { "gddr+delay_auto", 0.4, 0.0, 0.0, 0, GDDR_DC_DIAG, 2, 0, 1 },
    { "gddr+clip+dc-a+delay_auto", 0.4, 30.0, 0.01, 1, GDDR_DC_DIAG, 3, 0, 1 },
    { "gddr+clip+dc-a", 0.4, 30.0, 0.01, 1, GDDR_DC_DIAG, 3, 0, 0 },
    { "gddr+dc-identity", 0.5, 0.0, 0.02, 0, GDDR_DC_IDENTITY, 3, 0, 0 },
    /* dense and unchanged: a NaN in one tensor stops the other's push too */
    { "dense", 0.0, 0.0, 0.0, 0, GDDR_DC_DIAG, 2, 0, 0 },
    { "dense+clip", 0.0, 30.0, 0.0, 0, GDDR_DC_DIAG, 2, 0, 0 },
    { "dense+dc", 0.0, 0.0, 0.01, 1, GDDR_DC_DIAG, 3, 0, 0 },
};

/* Two tensors (the second's last chunk is short), so the waits counted are
 * per step, not per tensor. */
enum { DN = 3000, DN2 = 1700, DALL = DN + DN2, DSTEPS = 12, DNAN_STEP = 5 };

/* One run: pass 0 hands host buffers, pass 1 "device" buffers. Step
 * DNAN_STEP carries a NaN and must fail without changing anything. final,
 * resid and ages hold both tensors, one after the other. */
static void dev_run(const dev_case *k, int pass, int fake, float *final, float *resid,
                    uint32_t *ages, size_t *nages)
{
    gt_server s;
    START_SERVER(s, "chunk=256", "lr=0.5", "tau_dynamic=false", "tau_init=4", "mode=async");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.timeout_ms = REPLY_WAIT_MS;
    o.reconnect_timeout_ms = 1000;
    o.delay_fraction = k->alpha;
    o.seed = SEED;
    o.clip_norm = k->clip;
    o.dc_lambda = k->dc_lambda;
    o.dc_adaptive = k->dc_adaptive;
    o.dc_mode = k->dc_mode;
    o.hold_schedule = k->hold ? k->hold : GDDR_HOLD_RANDOM;
    o.delay_auto = k->dense_window;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    static float w0[DALL], g[DALL], params[DALL];
    for (int i = 0; i < DALL; i++)
        w0[i] = (float)(i % 11) * 0.125f;
    int id, id2;
    ck_assert_int_eq(gddr_register(c, "dev", w0, DN, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c, "dev2", w0 + DN, DN2, &id2, NULL), GDDR_OK);
    float *dg = NULL, *dp = NULL;
    if (pass) {
        ck_assert_int_eq(gddr_cuda_malloc((void **)&dg, DALL * 4), GDDR_OK);
        ck_assert_int_eq(gddr_cuda_malloc((void **)&dp, DALL * 4), GDDR_OK);
    }
    for (int step = 0; step < DSTEPS; step++) {
        for (int i = 0; i < DALL; i++)
            g[i] = (float)((i * 3 + step) % 9 - 4) * 0.5f * (i < DN ? 1.0f : 0.75f);
        if (step == DNAN_STEP)
            g[DN / 2] = NAN;
        if (pass)
            ck_assert_int_eq(gddr_cuda_memcpy_h2d(dg, g, DALL * 4, NULL), GDDR_OK);
        const float *gp[2] = { pass ? dg : g, pass ? dg + DN : g + DN };
        float *pp[2] = { pass ? dp : params, pass ? dp + DN : params + DN };
        static float r_before[DALL];
        if (step == DNAN_STEP) {
            ck_assert_int_eq(gddr__residual_get(c, id, r_before), GDDR_OK);
            ck_assert_int_eq(gddr__residual_get(c, id2, r_before + DN), GDDR_OK);
        }
        if (k->dense_window) { /* no decision in 1000 steps: the kind is ours */
            gddr__pullpick *pk = &c->push_pick;
            pk->whole = step >= 4 && step < 8;
            pk->probing = 0;
            pk->left = pk->every = 1000;
        }
        gddr_client_counters k0, k1;
        gddr_client_counters_get(c, &k0);
        int waits = pass && fake ? fake_syncs() : 0;
        int rc = gddr_step(c, gp, pp);
        if (step == DNAN_STEP) {
            ck_assert_msg(rc == GDDR_ENONFINITE, "%s pass %d: NaN step gave %s", k->name, pass,
                          gddr_strerror(rc));
            ck_assert_msg(strstr(gddr_client_errmsg(c), "'dev' holds NaN"), "%s",
                          gddr_client_errmsg(c));
            static float r_after[DALL];
            ck_assert_int_eq(gddr__residual_get(c, id, r_after), GDDR_OK);
            ck_assert_int_eq(gddr__residual_get(c, id2, r_after + DN), GDDR_OK);
            assert_same_floats(r_after, r_before, DALL, "residuals after a refused NaN step");
            continue;
        }
        ck_assert_msg(rc == GDDR_OK, "%s pass %d step %d: %s (%s)", k->name, pass, step,
                      gddr_strerror(rc), gddr_client_errmsg(c));
        if (pass && fake && step > 0)
            ck_assert_msg(fake_syncs() - waits == k->waits, "%s step %d: %d stream waits, want %d",
                          k->name, step, fake_syncs() - waits, k->waits);
        gddr_client_counters_get(c, &k1);
        if (k->dense_window && step >= 4 && step < 8) { /* every value, nothing left held */
            ck_assert_uint_eq(k1.values_pushed - k0.values_pushed, DALL);
            static float rz[DALL];
            ck_assert_int_eq(gddr__residual_get(c, id, rz), GDDR_OK);
            ck_assert_int_eq(gddr__residual_get(c, id2, rz + DN), GDDR_OK);
            for (int i = 0; i < DALL; i++)
                ck_assert_msg(rz[i] == 0.0f, "%s pass %d step %d: r[%d] = %g after a dense step", k->name,
                              pass, step, i, (double)rz[i]);
        }
    }
    if (pass)
        ck_assert_int_eq(gddr_cuda_memcpy_d2h(params, dp, DALL * 4, NULL), GDDR_OK);
    memcpy(final, params, sizeof params);
    ck_assert_int_eq(gddr__residual_get(c, id, resid), GDDR_OK);
    ck_assert_int_eq(gddr__residual_get(c, id2, resid + DN), GDDR_OK);
    size_t na2 = 0;
    ck_assert_int_eq(gddr__residual_age_get(c, id, ages, nages), GDDR_OK);
    ck_assert_int_eq(gddr__residual_age_get(c, id2, ages + *nages, &na2), GDDR_OK);
    *nages += na2;
    gddr_client_close(&c);
    if (pass) {
        ck_assert_int_eq(gddr_cuda_free(dg), GDDR_OK);
        ck_assert_int_eq(gddr_cuda_free(dp), GDDR_OK);
    }
    stop_server(&s);
}

/* The device path gives what the host path gives, bit for bit: parameters,
 * residual and chunk ages, with clipping, DC-ASGD (diag, identity,
 * adaptive), GDDR and dense pushes, and a refused NaN step in the middle;
 * and it waits for the stream once before the push (once more with
 * DC-ASGD, whose gradient is checked before w' is pulled) plus once for the
 * parameters. */
/* Runs every case with host and with device gradients and compares:
 * bitwise, or within tol_clip relative for the cases that clip. */
static void dev_cases_vs_host(int fake, double tol_clip)
{
    for (size_t ci = 0; ci < sizeof dev_cases / sizeof dev_cases[0]; ci++) {
        const dev_case *k = &dev_cases[ci];
        static float fin[2][DALL], res[2][DALL];
        static uint32_t ages[2][DALL];
        size_t na[2];
        for (int pass = 0; pass < 2; pass++)
            dev_run(k, pass, fake, fin[pass], res[pass], ages[pass], &na[pass]);
        const double tol = k->clip > 0 ? tol_clip : 0.0;
        char what[128];
        for (int v = 0; v < 2; v++) {
            const float *got = v ? res[1] : fin[1], *want = v ? res[0] : fin[0];
            snprintf(what, sizeof what, "%s: %s, device vs host", k->name,
                     v ? "residual" : "parameters");
            if (tol == 0.0)
                assert_same_floats(got, want, DALL, what);
            for (int i = 0; tol > 0.0 && i < DALL; i++)
                ck_assert_msg(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])),
                              "%s: element %d: %.9g vs %.9g", what, i, got[i], want[i]);
        }
        ck_assert_msg(na[0] == na[1] && memcmp(ages[0], ages[1], na[0] * sizeof ages[0][0]) == 0,
                      "%s: ages differ", k->name);
        /* Not vacuous: the run moved the parameters. */
        ck_assert_msg(fin[0][1] != 0.125f && fin[0][DN + 1] != (float)((DN + 1) % 11) * 0.125f,
                      "%s: parameters never moved", k->name);
    }
}

START_TEST(test_fake_device_matches_host)
{
    load_fake_cuda();
    dev_cases_vs_host(1, 0.0);
}
END_TEST

/* The same cases on a GPU through the real plugin, found by the loader's
 * search. Bit for bit where no clipping happens; with clipping the GPU's
 * sum of squares adds in another order than the CPU's, the factor may
 * differ in its last bit, so values agree within 1e-5 relative there. */
START_TEST(test_gpu_device_cases)
{
    gpu_say("device_cases");
    dev_cases_vs_host(0, 1e-5);
}
END_TEST

typedef struct log_capture {
    char text[4096];
    int errors;
} log_capture;

static void capture_log(void *user, int level, const char *msg)
{
    log_capture *l = user;
    if (level == GDDR_LOG_ERROR)
        l->errors++;
    size_t used = strlen(l->text);
    snprintf(l->text + used, sizeof l->text - used, "%d %s\n", level, msg);
}

/* A CUDA error inside the device step reaches the client: its error
 * message and an error line in the client's own log name the tensor, the
 * operation and what the plugin said; the step's plan is undone, and the
 * next step runs. */
START_TEST(test_fake_device_error_reaches_client)
{
    load_fake_cuda();
    gt_server s;
    START_SERVER(s, "chunk=256", "lr=0.5", "tau_dynamic=false", "tau_init=4");
    static log_capture lc;
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.timeout_ms = REPLY_WAIT_MS;
    o.delay_fraction = 0.4;
    o.seed = SEED;
    o.log = capture_log;
    o.log_user = &lc;
    o.log_level = GDDR_LOG_WARN;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    enum { N = 1000 };
    static float w0[N], g[N];
    int id;
    ck_assert_int_eq(gddr_register(c, "layer7", w0, N, &id, NULL), GDDR_OK);
    float *dg = NULL, *dp = NULL;
    ck_assert_int_eq(gddr_cuda_malloc((void **)&dg, N * 4), GDDR_OK);
    ck_assert_int_eq(gddr_cuda_malloc((void **)&dp, N * 4), GDDR_OK);
    for (int i = 0; i < N; i++)
        g[i] = (float)(i % 5) - 2.0f;
    ck_assert_int_eq(gddr_cuda_memcpy_h2d(dg, g, N * 4, NULL), GDDR_OK);
    const float *gp[1] = { dg };
    float *pp[1] = { dp };

    /* The first step fails creating the context. */
    fake_fail("gddr_cuda_ctx_create");
    ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_ECUDA);
    ck_assert_msg(strstr(gddr_client_errmsg(c), "creating a CUDA stream") &&
                      strstr(gddr_client_errmsg(c), "fake_cuda: gddr_cuda_ctx_create: injected"),
                  "errmsg: %s", gddr_client_errmsg(c));
    ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);

    uint32_t age0[8], age1[8];
    size_t nch;
    ck_assert_int_eq(gddr__residual_age_get(c, id, age0, &nch), GDDR_OK);
    ck_assert_uint_eq(nch, 4);
    lc.text[0] = 0, lc.errors = 0;
    fake_fail("gddr_fused_cuda");
    ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_ECUDA);
    const char *em = gddr_client_errmsg(c);
    ck_assert_msg(strstr(em, "'layer7'") && strstr(em, "the fused pass") &&
                      strstr(em, "fake_cuda: gddr_fused_cuda: injected failure"),
                  "errmsg: %s", em);
    ck_assert_msg(lc.errors == 1 && strstr(lc.text, "fake_cuda: gddr_fused_cuda: injected failure"),
                  "log (%d errors): %s", lc.errors, lc.text);
    ck_assert_int_eq(gddr__residual_age_get(c, id, age1, &nch), GDDR_OK);
    ck_assert_int_eq(memcmp(age0, age1, sizeof age0[0] * nch), 0); /* the plan was undone */
    ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);

    gddr_client_close(&c);
    ck_assert_int_eq(gddr_cuda_free(dg), GDDR_OK);
    ck_assert_int_eq(gddr_cuda_free(dp), GDDR_OK);
    stop_server(&s);
}
END_TEST

/* ---- suite ---------------------------------------------------------------------------- */

#define ADD_CASE(s, name, fn) GT_ADD_CASE(s, name, fn, TCASE_TIMEOUT)

Suite *suite_residual(void)
{
    Suite *s = suite_create("residual");
    ADD_CASE(s, "wire_size", test_wire_size_of_sparse_push);
    ADD_CASE(s, "sparse_apply_momentum", test_sparse_apply_momentum_present_only);
    ADD_CASE(s, "sync_sparse_reduction", test_sync_sparse_reduction);
    ADD_CASE(s, "conservation", test_conservation_end_to_end);
    ADD_CASE(s, "dynamic_tau", test_dynamic_tau);
    ADD_CASE(s, "client_obeys_tau", test_client_obeys_reply_tau);
    ADD_CASE(s, "held_share_is_alpha", test_held_share_is_alpha);
    ADD_CASE(s, "hold_schedule_by_mode", test_hold_schedule_by_mode);
    ADD_CASE(s, "hold_smallest_client", test_hold_smallest_client);
    ADD_CASE(s, "sync_tau_by_rank", test_sync_tau_by_rank);
    ADD_CASE(s, "pipeline_matches_step", test_pipeline_matches_step);
    ADD_CASE(s, "pipeline_server_gone", test_pipeline_server_gone);
    GT_ADD_CASE(s, "gddr_experiment_saves_bytes", test_gddr_experiment_saves_bytes, EXPERIMENT_WAIT_MS / 1000 + 60);
    ADD_CASE(s, "delay_auto_conservation", test_delay_auto_conservation);
    ADD_CASE(s, "fake_device_matches_host", test_fake_device_matches_host);
    ADD_CASE(s, "fake_device_error", test_fake_device_error_reaches_client);
    if (gt_gpu_probe(gpu_why, sizeof gpu_why)) {
        ADD_CASE(s, "device_step", test_device_step_matches_host);
        ADD_CASE(s, "gpu_device_cases", test_gpu_device_cases);
    } else {
        ADD_CASE(s, "gpu_skipped", test_gpu_skipped);
    }
    return s;
}
