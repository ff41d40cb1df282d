/* check_server.c -- integration tests of gddr-ps
 * (docs/design.md sections 2, 4, 5, 8).
 *
 * Every test starts its own gddr-ps on an OS-chosen loopback port through
 * tests/harness.h, talks to it with libgddr-client or with a raw ZeroMQ
 * DEALER speaking the wire directly (proto/gddr.proto), asserts computed
 * values, and stops what it started. All waits are bounded.
 *
 *   build/bin/gddr-tests server
 */
#define _GNU_SOURCE
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "gddr/gddr.h"
#include "files.h"
#include "harness.h"
#include "wirekit.h"
#include "suites.h"
#include "wire.h"

/* No test asserts that something was fast (a loaded machine or a sanitizer
 * build is slow): deadlines only catch a hang. */
#define TCASE_TIMEOUT 120
#define REPLY_WAIT_MS 30000

/* ---- servers and clients --------------------------------------------------- */

/* Starts a server with the given "key=value" settings (NULL-terminated). */
/* Opens a client or returns NULL with *rc set (usable from threads). */
static gddr_client *try_client(const char *ep, int rank, int world, int timeout_ms, int *rc)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = timeout_ms;
    o.reconnect_timeout_ms = 1000;
    gddr_client *c = NULL;
    *rc = gddr_client_open(&o, &c);
    return *rc == GDDR_OK ? c : NULL;
}

static gddr_client *open_client(const char *ep, int rank, int world)
{
    int rc;
    gddr_client *c = try_client(ep, rank, world, REPLY_WAIT_MS, &rc);
    ck_assert_msg(c != NULL, "gddr_client_open(%s, rank %d): %s", ep, rank, gddr_strerror(rc));
    return c;
}

/* Pulls tensor id and checks it is exactly `want` at `version`. */
static void assert_state(gddr_client *c, int id, const float *want, size_t n, uint64_t version,
                         const char *what)
{
    float *got = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(got);
    uint64_t v = 12345;
    int rc = gddr_pull(c, id, got, 0, &v);
    ck_assert_msg(rc == GDDR_OK, "%s: pull failed: %s (%s)", what, gddr_strerror(rc),
                  gddr_client_errmsg(c));
    ck_assert_msg(v == version, "%s: version is %" PRIu64 ", expected %" PRIu64, what, v, version);
    assert_same_floats(got, want, n, what);
    free(got);
}

/* ---- the raw wire ------------------------------------------------------------ */

/* A fresh request header with a valid envelope. */
static void raw_req(raw_conn *r, Gddr__Request *rq)
{
    gddr__request__init(rq);
    rq->protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq->req_id = ++r->next_id;
    rq->rank = r->rank;
    rq->session = r->session;
}

/* Sends arbitrary header bytes followed by raw frames. */
static void raw_send_bytes(raw_conn *r, const void *hdr, size_t hlen, const gddr__raw *raws,
                           int nraw)
{
    int rc = zmq_send(r->sock, hdr, hlen, nraw > 0 ? ZMQ_SNDMORE : 0);
    ck_assert_msg(rc == (int)hlen, "zmq_send header: %s", zmq_strerror(errno));
    for (int i = 0; i < nraw; i++) {
        rc = zmq_send(r->sock, raws[i].data, raws[i].len, i + 1 < nraw ? ZMQ_SNDMORE : 0);
        ck_assert_msg(rc == (int)raws[i].len, "zmq_send frame: %s", zmq_strerror(errno));
    }
}

static void raw_send(raw_conn *r, const Gddr__Request *rq, const gddr__raw *raws, int nraw)
{
    ck_assert_msg(gddr__send(r->sock, NULL, &rq->base, raws, nraw) >= 0, "gddr__send: %s",
                  zmq_strerror(errno));
}

/* Expects an error reply with `code` to request id req_id (or, with
 * allow_zero, to no request: when the server could not read the header). */
static void raw_expect_error_ex(raw_conn *r, uint64_t req_id, int allow_zero, int code,
                                const char *what)
{
    Gddr__Reply *rep = raw_recv(r, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rep != NULL, "%s: no reply within %d ms", what, REPLY_WAIT_MS);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR,
                  "%s: expected an error reply (%s), got reply body %d", what, gddr_strerror(code),
                  rep->body_case);
    ck_assert_msg((int)rep->error->code == code, "%s: error code %u (%s: %s), expected %d (%s)",
                  what, rep->error->code, gddr_strerror((int)rep->error->code),
                  rep->error->message ? rep->error->message : "", code, gddr_strerror(code));
    ck_assert_msg(rep->error->message && rep->error->message[0],
                  "%s: the error reply carries no message", what);
    ck_assert_msg(rep->req_id == req_id || (allow_zero && rep->req_id == 0),
                  "%s: reply req_id %" PRIu64 ", expected %" PRIu64, what, rep->req_id, req_id);
    ck_assert_msg(rep->epoch != 0, "%s: reply carries no epoch", what);
    ck_assert_msg(rep->protocol == GDDR__CONST__PROTOCOL_VERSION, "%s: reply protocol %u", what,
                  rep->protocol);
    gddr__reply__free_unpacked(rep, NULL);
}

static void raw_expect_error(raw_conn *r, uint64_t req_id, int code, const char *what)
{
    raw_expect_error_ex(r, req_id, 0, code, what);
}

/* Expects a push reply (accepted) to request id req_id. */
static void raw_expect_push_ok(raw_conn *r, uint64_t req_id, const char *what)
{
    Gddr__Reply *rep = raw_recv(r, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rep != NULL, "%s: no reply within %d ms", what, REPLY_WAIT_MS);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH, "%s: expected a push reply, got %d%s%s",
                  what, rep->body_case, rep->body_case == GDDR__REPLY__BODY_ERROR ? ": " : "",
                  rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "");
    ck_assert_msg(rep->req_id == req_id, "%s: reply req_id %" PRIu64 ", expected %" PRIu64, what,
                  rep->req_id, req_id);
    gddr__reply__free_unpacked(rep, NULL);
}

/* Sends a push built from its parts; returns its req_id. */
static uint64_t raw_push(raw_conn *r, uint32_t id, const float *vals, size_t nvals,
                         uint64_t payload_bytes, const uint8_t *bm, size_t bmlen, uint64_t birth,
                         uint64_t base, float norm)
{
    Gddr__Request rq;
    Gddr__Push p = GDDR__PUSH__INIT;
    raw_req(r, &rq);
    p.id = id;
    p.birth_version = birth;
    p.base_version = base;
    p.grad_norm = norm;
    p.step = r->step++; /* a new push each time, not a resend */
    p.bitmap.data = (uint8_t *)bm;
    p.bitmap.len = bm ? bmlen : 0;
    p.payload_bytes = payload_bytes;
    rq.body_case = GDDR__REQUEST__BODY_PUSH;
    rq.push = &p;
    gddr__raw raw = { vals, nvals * sizeof(float), NULL, NULL };
    raw_send(r, &rq, &raw, 1);
    return rq.req_id;
}

/* Registers through the wire; returns the reply (caller frees). */
static Gddr__Reply *raw_init(raw_conn *r, const char *key, const float *vals, size_t n,
                             uint64_t payload_bytes, size_t frame_n, uint64_t *req_id)
{
    Gddr__Request rq;
    Gddr__InitTensor in = GDDR__INIT_TENSOR__INIT;
    raw_req(r, &rq);
    in.key = (char *)key;
    in.n = n;
    in.payload_bytes = payload_bytes;
    rq.body_case = GDDR__REQUEST__BODY_INIT;
    rq.init = &in;
    gddr__raw raw = { vals, frame_n * sizeof(float), NULL, NULL };
    raw_send(r, &rq, &raw, 1);
    if (req_id)
        *req_id = rq.req_id;
    Gddr__Reply *rep = raw_recv(r, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rep != NULL, "init '%s': no reply", key);
    ck_assert_msg(rep->req_id == rq.req_id, "init '%s': reply req_id %" PRIu64 ", expected %" PRIu64,
                  key, rep->req_id, rq.req_id);
    return rep;
}

/* ---- 1. register, pull, push: exact values ----------------------------------- */

START_TEST(test_register_pull_push_exact)
{
    gt_server s;
    START_SERVER(s, "chunk=64", "lr=0.5");
    enum { N = 300 }; /* 5 chunks of 64, the last short (44) */
    const float lr = 0.5f;
    float init[N], g[N], want[N], got[N];
    for (int i = 0; i < N; i++) {
        init[i] = sinf((float)i * 0.731f) * 3.7f + 0.01f * (float)i;
        g[i] = cosf((float)i * 0.37f) * 2.3f - 0.5f;
    }
    gddr_client *c = open_client(s.endpoint, 0, 2);
    gddr_server_info info;
    ck_assert_int_eq(gddr_client_info(c, &info), GDDR_OK);
    ck_assert_int_eq(info.chunk, 64);
    ck_assert_int_eq(info.mode, GDDR_MODE_ASYNC);
    ck_assert_int_eq(info.rank, 0);
    ck_assert_msg(info.epoch != 0, "hello carried no epoch");

    int id = -1;
    uint64_t v = 99;
    ck_assert_int_eq(gddr_register(c, "w", init, N, &id, &v), GDDR_OK);
    ck_assert_int_eq(id, 0);
    ck_assert_uint_eq(v, 0);

    /* Pull: exactly the registered values, version 0. */
    memset(got, 0xff, sizeof got);
    v = 99;
    ck_assert_int_eq(gddr_pull(c, id, got, 0, &v), GDDR_OK);
    ck_assert_uint_eq(v, 0);
    assert_same_floats(got, init, N, "pull after register");

    /* One push: w - lr*g, computed in float, version 1. */
    for (int i = 0; i < N; i++)
        want[i] = init[i] - lr * g[i];
    v = 99;
    ck_assert_int_eq(gddr_push(c, id, g, &v), GDDR_OK);
    ck_assert_msg(v == 1, "push returned version %" PRIu64 ", expected 1", v);
    assert_state(c, id, want, N, 1, "after one push");

    /* A second worker registering the same key and length gets the existing
     * tensor: success, version 1, values unchanged (its init is ignored). */
    gddr_client *c2 = open_client(s.endpoint, 1, 2);
    float other[N];
    for (int i = 0; i < N; i++)
        other[i] = 42.0f + (float)i;
    int id2 = -1;
    v = 99;
    ck_assert_int_eq(gddr_register(c2, "w", other, N, &id2, &v), GDDR_OK);
    ck_assert_msg(v == 1, "re-registration returned version %" PRIu64 ", expected 1", v);
    assert_state(c2, id2, want, N, 1, "after re-registration (second client)");

    /* Another length is GDDR_ELENGTH and changes nothing. */
    float longer[N + 1];
    memcpy(longer, other, sizeof other);
    longer[N] = 1.0f;
    int id3 = -1;
    int rc = gddr_register(c2, "w2", init, N, &id3, NULL); /* a second tensor is fine */
    ck_assert_int_eq(rc, GDDR_OK);
    gddr_client *c3 = open_client(s.endpoint, 2, 3);
    rc = gddr_register(c3, "w", longer, N + 1, &id3, NULL);
    ck_assert_msg(rc == GDDR_ELENGTH, "re-registration with another length: %s, expected %s",
                  gddr_strerror(rc), gddr_strerror(GDDR_ELENGTH));
    rc = gddr_register(c3, "w", longer, N - 1, &id3, NULL);
    ck_assert_msg(rc == GDDR_ELENGTH, "re-registration with a shorter length: %s",
                  gddr_strerror(rc));
    assert_state(c, id, want, N, 1, "after the refused re-registrations");

    /* On the wire: created is false for the existing key, true for a new one,
     * and the id and version are the existing tensor's. */
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 3, 4); /* pushing and registering take a worker */
    Gddr__Reply *rep = raw_init(&r, "w", other, N, N * 4, N, NULL);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_INIT);
    ck_assert_msg(!rep->init->created, "re-registering 'w' says created = true");
    ck_assert_uint_eq(rep->init->id, 0);
    ck_assert_uint_eq(rep->init->version, 1);
    ck_assert_uint_eq(rep->init->n, N);
    gddr__reply__free_unpacked(rep, NULL);
    rep = raw_init(&r, "fresh", other, 10, 40, 10, NULL);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_INIT);
    ck_assert_msg(rep->init->created, "registering a new key says created = false");
    ck_assert_uint_eq(rep->init->id, 2);
    ck_assert_uint_eq(rep->init->version, 0);
    gddr__reply__free_unpacked(rep, NULL);
    /* payload_bytes that disagrees with n, and a frame that disagrees with
     * payload_bytes: GDDR_ELENGTH, nothing registered. */
    uint64_t rid;
    rep = raw_init(&r, "bad1", other, 10, 44, 11, &rid);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_ERROR);
    ck_assert_uint_eq(rep->error->code, GDDR_ELENGTH);
    gddr__reply__free_unpacked(rep, NULL);
    rep = raw_init(&r, "bad2", other, 10, 40, 9, &rid);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_ERROR);
    ck_assert_uint_eq(rep->error->code, GDDR_ELENGTH);
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    assert_state(c, id, want, N, 1, "after the raw registrations");

    gddr_server_stats st = get_stats(c);
    ck_assert_uint_eq(st.pushes, 1);
    ck_assert_uint_eq(st.versions_total, 1);
    ck_assert_uint_eq(st.rejected, 4);

    gddr_client_close(&c3);
    gddr_client_close(&c2);
    gddr_client_close(&c);
    ck_assert_ptr_null(c);
    stop_server(&s);
}
END_TEST

/* A sparse push touches only the chunks in its bitmap
 * (docs/design.md section 5). */
START_TEST(test_sparse_push_exact)
{
    gt_server s;
    START_SERVER(s, "chunk=64", "lr=0.25");
    enum { N = 200 }; /* chunks: 64, 64, 64, 8 */
    float init[N], want[N];
    for (int i = 0; i < N; i++)
        init[i] = 1.5f * (float)(i % 13) - 4.0f + 0.001f * (float)i;
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "sp", init, N, &id, NULL), GDDR_OK);
    /* chunks 1 and 3: 64 + 8 values, contiguous in chunk order */
    float vals[72];
    for (int i = 0; i < 72; i++)
        vals[i] = 0.75f * (float)i - 20.0f;
    memcpy(want, init, sizeof want);
    for (int i = 0; i < 64; i++)
        want[64 + i] = init[64 + i] - 0.25f * vals[i];
    for (int i = 0; i < 8; i++)
        want[192 + i] = init[192 + i] - 0.25f * vals[64 + i];
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 1, 2); /* pushing and registering take a worker */
    uint8_t bm = 0x0a;
    uint64_t rid = raw_push(&r, (uint32_t)id, vals, 72, 72 * 4, &bm, 1, 0, 0, 1.0f);
    Gddr__Reply *rep = raw_recv(&r, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rep != NULL, "sparse push: no reply");
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH, "sparse push refused: %s",
                  rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "?");
    ck_assert_uint_eq(rep->req_id, rid);
    ck_assert_uint_eq(rep->push->version, 1);
    ck_assert(rep->push->applied);
    ck_assert_uint_eq(rep->push->staleness, 0);
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    assert_state(c, id, want, N, 1, "after a sparse push of chunks 1 and 3");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 2. concurrent pushes ------------------------------------------------------ */

#define CONC_WORKERS 4
#define CONC_PUSHES 50
#define CONC_BIG 200000 /* above the server's inline limit (65536): parallel apply */
#define CONC_SMALL 1000

typedef struct conc_arg {
    const char *ep;
    int rank;
    pthread_barrier_t *bar;
    int fail;
    char why[256];
} conc_arg;

static float conc_init(int i) { return (float)(i % 17) - 8.0f; }
static float conc_grad(int rank, int i) { return (float)((rank + 1) * ((i % 3) - 1)); }

static void *conc_worker(void *p)
{
    conc_arg *a = p;
    int rc;
    float *big = malloc(CONC_BIG * sizeof(float)), *small = malloc(CONC_SMALL * sizeof(float));
    gddr_client *c = try_client(a->ep, a->rank, CONC_WORKERS, REPLY_WAIT_MS, &rc);
    int ib = -1, is = -1;
    if (!c) {
        snprintf(a->why, sizeof a->why, "open: %s", gddr_strerror(rc));
        goto out;
    }
    for (int i = 0; i < CONC_BIG; i++)
        big[i] = conc_init(i);
    for (int i = 0; i < CONC_SMALL; i++)
        small[i] = conc_init(i);
    if ((rc = gddr_register(c, "big", big, CONC_BIG, &ib, NULL)) != GDDR_OK ||
        (rc = gddr_register(c, "small", small, CONC_SMALL, &is, NULL)) != GDDR_OK) {
        snprintf(a->why, sizeof a->why, "register: %s", gddr_strerror(rc));
        goto out;
    }
    for (int i = 0; i < CONC_BIG; i++)
        big[i] = conc_grad(a->rank, i);
    for (int i = 0; i < CONC_SMALL; i++)
        small[i] = conc_grad(a->rank, i);
    pthread_barrier_wait(a->bar);
    uint64_t lastb = 0, lasts = 0;
    for (int k = 0; k < CONC_PUSHES; k++) {
        uint64_t vb = 0, vs = 0;
        if ((rc = gddr_push(c, ib, big, &vb)) != GDDR_OK ||
            (rc = gddr_push(c, is, small, &vs)) != GDDR_OK) {
            snprintf(a->why, sizeof a->why, "push %d: %s (%s)", k, gddr_strerror(rc),
                     gddr_client_errmsg(c));
            goto out;
        }
        /* Each push bumps the version once, so the versions one worker sees
         * strictly increase and never pass the total. */
        if (vb <= lastb || vs <= lasts || vb > CONC_WORKERS * CONC_PUSHES ||
            vs > CONC_WORKERS * CONC_PUSHES) {
            snprintf(a->why, sizeof a->why,
                     "push %d returned versions big %" PRIu64 " small %" PRIu64
                     " after %" PRIu64 " / %" PRIu64, k, vb, vs, lastb, lasts);
            goto out;
        }
        lastb = vb, lasts = vs;
    }
    free(big), free(small);
    gddr_client_close(&c);
    return NULL;
out:
    a->fail = 1;
    /* The others wait at the barrier; a failure before it must not hang. */
    if (ib < 0 || is < 0)
        pthread_barrier_wait(a->bar);
    free(big), free(small);
    gddr_client_close(&c);
    return NULL;
}

START_TEST(test_concurrent_pushes_exact)
{
    gt_server s;
    START_SERVER(s, "threads=2", "lr=1", "chunk=1024");
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, CONC_WORKERS);
    pthread_t th[CONC_WORKERS];
    conc_arg args[CONC_WORKERS];
    int64_t t0 = gt_now_ms();
    for (int r = 0; r < CONC_WORKERS; r++) {
        args[r] = (conc_arg){ s.endpoint, r, &bar, 0, "" };
        ck_assert_int_eq(pthread_create(&th[r], NULL, conc_worker, &args[r]), 0);
    }
    for (int r = 0; r < CONC_WORKERS; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&bar);
    for (int r = 0; r < CONC_WORKERS; r++)
        ck_assert_msg(!args[r].fail, "worker %d: %s", r, args[r].why);
    fprintf(stderr, "server: concurrent: %d workers x %d pushes of %d + %d floats in %lld ms\n",
            CONC_WORKERS, CONC_PUSHES, CONC_BIG, CONC_SMALL, (long long)(gt_now_ms() - t0));

    /* w = init - lr * sum over workers and pushes, exact (small integers). */
    gddr_client *c = open_client(s.endpoint, 0, CONC_WORKERS);
    float *big = malloc(CONC_BIG * sizeof(float)), *want = malloc(CONC_BIG * sizeof(float));
    ck_assert_ptr_nonnull(big);
    ck_assert_ptr_nonnull(want);
    for (int i = 0; i < CONC_BIG; i++) {
        float sum = 0;
        for (int r = 0; r < CONC_WORKERS; r++)
            sum += conc_grad(r, i);
        want[i] = conc_init(i) - (float)CONC_PUSHES * sum;
        big[i] = conc_init(i);
    }
    int ib, is;
    ck_assert_int_eq(gddr_register(c, "big", big, CONC_BIG, &ib, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c, "small", big, CONC_SMALL, &is, NULL), GDDR_OK);
    uint64_t v = 0;
    ck_assert_int_eq(gddr_pull(c, ib, big, 0, &v), GDDR_OK);
    ck_assert_msg(v == CONC_WORKERS * CONC_PUSHES, "big: version %" PRIu64 ", expected %d", v,
                  CONC_WORKERS * CONC_PUSHES);
    for (int i = 0; i < CONC_BIG; i++)
        ck_assert_msg(big[i] == want[i], "big[%d] = %.9g, expected %.9g (init %g, sum of grads %g)", i,
                      (double)big[i], (double)want[i], (double)conc_init(i),
                      (double)(conc_init(i) - want[i]));
    ck_assert_int_eq(gddr_pull(c, is, big, 0, &v), GDDR_OK);
    ck_assert_msg(v == CONC_WORKERS * CONC_PUSHES, "small: version %" PRIu64 ", expected %d", v,
                  CONC_WORKERS * CONC_PUSHES);
    for (int i = 0; i < CONC_SMALL; i++)
        ck_assert_msg(big[i] == want[i], "small[%d] = %.9g, expected %.9g", i, (double)big[i],
                      (double)want[i]);
    gddr_server_stats st = get_stats(c);
    ck_assert_uint_eq(st.pushes, 2 * CONC_WORKERS * CONC_PUSHES);
    ck_assert_uint_eq(st.versions_total, 2 * CONC_WORKERS * CONC_PUSHES);
    ck_assert_uint_eq(st.rejected, 0);
    free(big), free(want);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 3. no torn reads ---------------------------------------------------------- */

#define TORN_N 300000
#define TORN_PUSHES 100 /* per pusher */
#define TORN_PULLS 200  /* at least */
#define TORN_INIT 1000.0f

typedef struct torn_arg {
    const char *ep;
    int rank;
    pthread_barrier_t *bar;
    volatile int *pushers_left;
    pthread_mutex_t *mu;
    int fail;
    char why[256];
    int pulls, distinct;
    uint64_t first_v, last_v;
} torn_arg;

static void *torn_pusher(void *p)
{
    torn_arg *a = p;
    int rc, id = -1;
    float *g = malloc(TORN_N * sizeof(float));
    for (int i = 0; i < TORN_N; i++)
        g[i] = TORN_INIT;
    gddr_client *c = try_client(a->ep, a->rank, 3, REPLY_WAIT_MS, &rc);
    if (!c || (rc = gddr_register(c, "torn", g, TORN_N, &id, NULL)) != GDDR_OK) {
        snprintf(a->why, sizeof a->why, "open/register: %s", gddr_strerror(rc));
        a->fail = 1;
    }
    for (int i = 0; i < TORN_N; i++)
        g[i] = 1.0f;
    pthread_barrier_wait(a->bar);
    for (int k = 0; !a->fail && k < TORN_PUSHES; k++)
        if ((rc = gddr_push(c, id, g, NULL)) != GDDR_OK) {
            snprintf(a->why, sizeof a->why, "push %d: %s", k, gddr_strerror(rc));
            a->fail = 1;
        }
    pthread_mutex_lock(a->mu);
    (*a->pushers_left)--;
    pthread_mutex_unlock(a->mu);
    free(g);
    gddr_client_close(&c);
    return NULL;
}

static void *torn_puller(void *p)
{
    torn_arg *a = p;
    int rc, id = -1;
    float *w = malloc(TORN_N * sizeof(float));
    for (int i = 0; i < TORN_N; i++)
        w[i] = TORN_INIT;
    gddr_client *c = try_client(a->ep, a->rank, 3, REPLY_WAIT_MS, &rc);
    if (!c || (rc = gddr_register(c, "torn", w, TORN_N, &id, NULL)) != GDDR_OK) {
        snprintf(a->why, sizeof a->why, "open/register: %s", gddr_strerror(rc));
        a->fail = 1;
    }
    pthread_barrier_wait(a->bar);
    uint64_t prev = UINT64_MAX;
    for (int k = 0; !a->fail; k++) {
        pthread_mutex_lock(a->mu);
        int left = *a->pushers_left;
        pthread_mutex_unlock(a->mu);
        uint64_t v = 0;
        if ((rc = gddr_pull(c, id, w, 0, &v)) != GDDR_OK) {
            snprintf(a->why, sizeof a->why, "pull %d: %s", k, gddr_strerror(rc));
            a->fail = 1;
            break;
        }
        const float want = TORN_INIT - (float)v;
        for (int i = 0; i < TORN_N; i++)
            if (w[i] != want) {
                snprintf(a->why, sizeof a->why,
                         "pull %d at version %" PRIu64 ": element %d is %g, element 0 is %g, expected all %g (torn read)",
                         k, v, i, (double)w[i], (double)w[0], (double)want);
                a->fail = 1;
                break;
            }
        if (prev != UINT64_MAX && v < prev) {
            snprintf(a->why, sizeof a->why, "pull %d: version went back from %" PRIu64 " to %" PRIu64,
                     k, prev, v);
            a->fail = 1;
        }
        if (k == 0)
            a->first_v = v;
        if (v != prev)
            a->distinct++;
        prev = v;
        a->last_v = v;
        a->pulls = k + 1;
        /* Go on until both the pull count is reached and the pushers were
         * done before this pull started (so the last pull sees the end). */
        if (k + 1 >= TORN_PULLS && left == 0)
            break;
        if (k > 100000) {
            snprintf(a->why, sizeof a->why, "pushers never finished");
            a->fail = 1;
        }
    }
    free(w);
    gddr_client_close(&c);
    return NULL;
}

START_TEST(test_no_torn_reads)
{
    gt_server s;
    START_SERVER(s, "threads=2", "lr=1", "chunk=1024");
    pthread_barrier_t bar;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    volatile int left = 2;
    pthread_barrier_init(&bar, NULL, 3);
    torn_arg a[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        memset(&a[i], 0, sizeof a[i]);
        a[i].ep = s.endpoint;
        a[i].rank = i;
        a[i].bar = &bar;
        a[i].pushers_left = &left;
        a[i].mu = &mu;
    }
    ck_assert_int_eq(pthread_create(&th[0], NULL, torn_pusher, &a[0]), 0);
    ck_assert_int_eq(pthread_create(&th[1], NULL, torn_pusher, &a[1]), 0);
    ck_assert_int_eq(pthread_create(&th[2], NULL, torn_puller, &a[2]), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(!a[i].fail, "thread %d: %s", i, a[i].why);
    fprintf(stderr, "server: torn reads: %d pulls saw %d distinct versions (%" PRIu64 "..%" PRIu64 ")\n",
            a[2].pulls, a[2].distinct, a[2].first_v, a[2].last_v);
    ck_assert_int_ge(a[2].pulls, TORN_PULLS);
    ck_assert_uint_eq(a[2].last_v, 2 * TORN_PUSHES);
    ck_assert_msg(a[2].distinct >= 2, "the puller saw only one version: no overlap with pushes");
    stop_server(&s);
}
END_TEST

/* ---- 4. bad requests ------------------------------------------------------------ */

START_TEST(test_bad_requests)
{
    gt_server s;
    START_SERVER(s, "chunk=64", "lr=0.5");
    enum { N = 200 }; /* 4 chunks: 64, 64, 64, 8; bitmap of 1 byte */
    float init[N], g[N], want[N], bad[N + 1];
    for (int i = 0; i < N; i++) {
        init[i] = 0.5f * (float)i - 7.25f;
        g[i] = (float)((i * 7) % 11) - 5.0f;
        want[i] = init[i] - 0.5f * g[i];
    }
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "t", init, N, &id, NULL), GDDR_OK);
    uint64_t v;
    ck_assert_int_eq(gddr_push(c, id, g, &v), GDDR_OK);
    ck_assert_uint_eq(v, 1);
    assert_state(c, id, want, N, 1, "before the bad requests");
    gddr_server_stats st0 = get_stats(c);
    ck_assert_uint_eq(st0.rejected, 0);
    ck_assert_uint_eq(st0.pushes, 1);

    /* Through the API: unknown ids are refused (client-side, GDDR_ENOKEY). */
    float buf[N];
    int rc = gddr_pull(c, 7, buf, 0, NULL);
    ck_assert_msg(rc == GDDR_ENOKEY, "pull of unknown id 7: %s", gddr_strerror(rc));
    rc = gddr_push(c, -1, g, NULL);
    ck_assert_msg(rc == GDDR_ENOKEY, "push to unknown id -1: %s", gddr_strerror(rc));
    assert_state(c, id, want, N, 1, "after API calls with unknown ids");

    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 1, 2); /* pushing and registering take a worker */
    uint64_t rid;
    int nbad = 0;
    const uint32_t uid = (uint32_t)id;
#define EXPECT(code, what)                                                                    \
    do {                                                                                      \
        raw_expect_error(&r, rid, (code), (what));                                            \
        nbad++;                                                                               \
        assert_state(c, id, want, N, 1, "after " what);                                       \
    } while (0)

    for (int i = 0; i <= N; i++)
        bad[i] = 1.0f;
    /* wrong lengths */
    rid = raw_push(&r, uid, bad, N - 1, (N - 1) * 4, NULL, 0, 1, 1, 1.0f);
    EXPECT(GDDR_ELENGTH, "a dense push one value short");
    rid = raw_push(&r, uid, bad, N + 1, (N + 1) * 4, NULL, 0, 1, 1, 1.0f);
    EXPECT(GDDR_ELENGTH, "a dense push one value long");
    rid = raw_push(&r, uid, bad, N - 1, N * 4, NULL, 0, 1, 1, 1.0f);
    EXPECT(GDDR_ELENGTH, "a push whose frame is shorter than payload_bytes");
    /* unknown tensor */
    {
        Gddr__Request rq;
        Gddr__Pull p = GDDR__PULL__INIT;
        raw_req(&r, &rq);
        p.id = 7;
        p.wait_ms = 100;
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        raw_send(&r, &rq, NULL, 0);
        rid = rq.req_id;
        EXPECT(GDDR_ENOKEY, "a pull of unknown tensor id 7");
    }
    rid = raw_push(&r, 7, bad, N, N * 4, NULL, 0, 0, 0, 1.0f);
    EXPECT(GDDR_ENOKEY, "a push to unknown tensor id 7");
    /* garbage and truncated headers */
    {
        const unsigned char junk[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0x01, 0x02, 0x03 };
        raw_send_bytes(&r, junk, sizeof junk, NULL, 0);
        rid = 0;
        EXPECT(GDDR_EPROTO, "a garbage header");
        gddr__raw raw = { bad, N * 4, NULL, NULL };
        raw_send_bytes(&r, "\x0f\x0f\x0f", 3, &raw, 1);
        rid = 0;
        EXPECT(GDDR_EPROTO, "a garbage header followed by a payload");

        Gddr__Request rq;
        Gddr__Pull p = GDDR__PULL__INIT;
        raw_req(&r, &rq);
        p.id = uid;
        p.wait_ms = 100;
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        uint8_t packed[128];
        size_t len = gddr__request__pack(&rq, packed);
        ck_assert_uint_gt(len, 2);
        raw_send_bytes(&r, packed, len - 1, NULL, 0);
        rid = 0;
        EXPECT(GDDR_EPROTO, "a truncated header");
    }
    /* wrong protocol version, missing payload frame, extra frames */
    {
        Gddr__Request rq;
        Gddr__Pull p = GDDR__PULL__INIT;
        raw_req(&r, &rq);
        rq.protocol = GDDR__CONST__PROTOCOL_VERSION + 1;
        p.id = uid;
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        raw_send(&r, &rq, NULL, 0);
        rid = rq.req_id;
        EXPECT(GDDR_EPROTO, "a request of another protocol version");

        Gddr__Push pu = GDDR__PUSH__INIT;
        raw_req(&r, &rq);
        pu.id = uid;
        pu.birth_version = pu.base_version = 1;
        pu.payload_bytes = N * 4;
        rq.body_case = GDDR__REQUEST__BODY_PUSH;
        rq.push = &pu;
        raw_send(&r, &rq, NULL, 0);
        rid = rq.req_id;
        EXPECT(GDDR_EPROTO, "a push without its payload frame");

        raw_req(&r, &rq);
        rq.body_case = GDDR__REQUEST__BODY_PUSH;
        rq.push = &pu;
        gddr__raw two[2] = { { bad, N * 4, NULL, NULL }, { bad, N * 4, NULL, NULL } };
        raw_send(&r, &rq, two, 2);
        rid = rq.req_id;
        EXPECT(GDDR_EPROTO, "a push with an extra frame and no residual_snapshot");

        raw_req(&r, &rq);
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
        gddr__raw one = { bad, 16, NULL, NULL };
        raw_send(&r, &rq, &one, 1);
        rid = rq.req_id;
        EXPECT(GDDR_EPROTO, "a pull with a value frame");

        raw_req(&r, &rq);
        rq.body_case = GDDR__REQUEST__BODY__NOT_SET;
        raw_send(&r, &rq, NULL, 0);
        rid = rq.req_id;
        EXPECT(GDDR_EPROTO, "a request without a body");

        raw_req(&r, &rq);
        rq.rank = 5000; /* max_workers defaults to 1024 */
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        raw_send(&r, &rq, NULL, 0);
        rid = rq.req_id;
        EXPECT(GDDR_EWORKER, "a request from rank 5000");

        /* more frames than any message has (GDDR_MAX_FRAMES = 8) */
        raw_req(&r, &rq);
        rq.body_case = GDDR__REQUEST__BODY_PUSH;
        rq.push = &pu;
        gddr__raw many[9];
        for (int i = 0; i < 9; i++)
            many[i] = (gddr__raw){ bad, N * 4, NULL, NULL };
        raw_send(&r, &rq, many, 9);
        /* The server drops frames past the 8th and does not parse the
         * header, so it may answer with req_id 0. */
        raw_expect_error_ex(&r, rq.req_id, 1, GDDR_EPROTO, "a push with 9 value frames");
        nbad++;
        assert_state(c, id, want, N, 1, "after a push with 9 value frames");
    }
    /* registrations that must be refused (and must not create anything) */
    {
        static const char *const keys[] = { "", "has space", "tab\there", "\x7f" };
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            Gddr__Reply *rep = raw_init(&r, keys[k], bad, 4, 16, 4, &rid);
            ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR &&
                              rep->error->code == GDDR_EINVAL,
                          "registering key '%s': body %d code %u, expected GDDR_EINVAL", keys[k],
                          rep->body_case,
                          rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->code : 0);
            gddr__reply__free_unpacked(rep, NULL);
            nbad++;
        }
        char longkey[140];
        memset(longkey, 'k', 128);
        longkey[128] = 0;
        Gddr__Reply *rep = raw_init(&r, longkey, bad, 4, 16, 4, &rid);
        ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR && rep->error->code == GDDR_EINVAL,
                      "registering a 128-character key was not refused with GDDR_EINVAL");
        gddr__reply__free_unpacked(rep, NULL);
        nbad++;
        float nanv[4] = { 1, NAN, 2, 3 };
        rep = raw_init(&r, "nan-init", nanv, 4, 16, 4, &rid);
        ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR &&
                          rep->error->code == GDDR_ENONFINITE,
                      "registering NaN initial values was not refused with GDDR_ENONFINITE");
        gddr__reply__free_unpacked(rep, NULL);
        nbad++;
        rep = raw_init(&r, "zero", bad, 0, 0, 0, &rid);
        ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR && rep->error->code == GDDR_ELENGTH,
                      "registering 0 values was not refused with GDDR_ELENGTH");
        gddr__reply__free_unpacked(rep, NULL);
        nbad++;
        /* None of them exists: the next new key gets id 1. */
        rep = raw_init(&r, "ok-key", bad, 4, 16, 4, &rid);
        ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_INIT);
        ck_assert(rep->init->created);
        ck_assert_uint_eq(rep->init->id, 1);
        gddr__reply__free_unpacked(rep, NULL);
        assert_state(c, id, want, N, 1, "after the refused registrations");
    }
    /* bitmaps that do not match the payload */
    {
        uint8_t bm = 0x03; /* chunks 0 and 1: 128 values */
        rid = raw_push(&r, uid, bad, 64, 64 * 4, &bm, 1, 1, 1, 1.0f);
        EXPECT(GDDR_EBITMAP, "a bitmap selecting 128 values with a payload of 64");
        bm = 0x08; /* chunk 3 is short: 8 values */
        rid = raw_push(&r, uid, bad, 64, 64 * 4, &bm, 1, 1, 1, 1.0f);
        EXPECT(GDDR_EBITMAP, "a bitmap selecting the short last chunk with 64 values");
        bm = 0x11; /* chunk 4 does not exist */
        rid = raw_push(&r, uid, bad, 64, 64 * 4, &bm, 1, 1, 1, 1.0f);
        EXPECT(GDDR_EBITMAP, "a bitmap with a bit past the last chunk");
        uint8_t bm2[2] = { 0x01, 0x00 };
        rid = raw_push(&r, uid, bad, 64, 64 * 4, bm2, 2, 1, 1, 1.0f);
        EXPECT(GDDR_EBITMAP, "a bitmap of 2 bytes for 4 chunks");
    }
    /* non-finite values */
    {
        float nanv[N];
        memcpy(nanv, g, sizeof nanv);
        nanv[N / 2] = NAN;
        rid = raw_push(&r, uid, nanv, N, N * 4, NULL, 0, 1, 1, 1.0f);
        EXPECT(GDDR_ENONFINITE, "a dense push with a NaN");
        nanv[N / 2] = g[N / 2];
        nanv[N - 1] = -INFINITY;
        rid = raw_push(&r, uid, nanv, N, N * 4, NULL, 0, 1, 1, 1.0f);
        EXPECT(GDDR_ENONFINITE, "a dense push with -Inf in the last element");
        nanv[N - 1] = g[N - 1];
        rid = raw_push(&r, uid, nanv, N, N * 4, NULL, 0, 1, 1, NAN);
        EXPECT(GDDR_ENONFINITE, "a push whose grad_norm is NaN");
        uint8_t bm = 0x08;
        float sp[8] = { 1, 2, 3, 4, 5, 6, 7, INFINITY };
        rid = raw_push(&r, uid, sp, 8, 8 * 4, &bm, 1, 1, 1, 1.0f);
        EXPECT(GDDR_ENONFINITE, "a sparse push with +Inf");
    }
    /* versions from the future */
    {
        rid = raw_push(&r, uid, g, N, N * 4, NULL, 0, 2, 2, 1.0f);
        EXPECT(GDDR_EVERSION, "a push based on version 2 of a tensor at version 1");
        rid = raw_push(&r, uid, g, N, N * 4, NULL, 0, 0, 1000000, 1.0f);
        EXPECT(GDDR_EVERSION, "a push based on version 1000000");
        rid = raw_push(&r, uid, g, N, N * 4, NULL, 0, 1, 0, 1.0f);
        EXPECT(GDDR_EVERSION, "a push whose birth (1) is after its base (0)");
        Gddr__Request rq;
        Gddr__Pull p = GDDR__PULL__INIT;
        raw_req(&r, &rq);
        p.id = uid;
        p.min_version = 1000;
        p.wait_ms = 100;
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        raw_send(&r, &rq, NULL, 0);
        rid = rq.req_id;
        EXPECT(GDDR_EVERSION, "a pull asking for version 1000");
    }
#undef EXPECT

    /* The raw connection is still served normally. */
    {
        Gddr__Request rq;
        Gddr__Pull p = GDDR__PULL__INIT;
        raw_req(&r, &rq);
        p.id = uid;
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        raw_send(&r, &rq, NULL, 0);
        gddr__frames f;
        Gddr__Reply *rep = raw_recv(&r, REPLY_WAIT_MS, &f);
        ck_assert_msg(rep != NULL, "raw pull after the bad requests: no reply");
        ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_PULL);
        ck_assert_uint_eq(rep->req_id, rq.req_id);
        ck_assert_uint_eq(rep->pull->version, 1);
        ck_assert_uint_eq(rep->pull->payload_bytes, N * 4);
        ck_assert_int_eq(f.n, 2);
        ck_assert_uint_eq(gddr__frame_size(&f, 1), N * 4);
        assert_same_floats(gddr__frame_data(&f, 1), want, N, "raw pull after the bad requests");
        gddr__frames_close(&f);
        gddr__reply__free_unpacked(rep, NULL);
    }
    raw_close(&r);

    gddr_server_stats st = get_stats(c);
    ck_assert_msg(st.rejected == st0.rejected + (uint64_t)nbad,
                  "rejected counter is %" PRIu64 ", expected %d more than %" PRIu64, st.rejected,
                  nbad, st0.rejected);
    ck_assert_uint_eq(st.pushes, 1);
    ck_assert_uint_eq(st.versions_total, 1);

    /* And a good push still works and is exact. */
    float want2[N];
    for (int i = 0; i < N; i++)
        want2[i] = want[i] - 0.5f * g[i];
    ck_assert_int_eq(gddr_push(c, id, g, &v), GDDR_OK);
    ck_assert_uint_eq(v, 2);
    assert_state(c, id, want2, N, 2, "a good push after the bad ones");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* A message above max_message_bytes is dropped by ZeroMQ; the server lives
 * on, unchanged, and serves others. */
START_TEST(test_oversized_message)
{
    gt_server s;
    START_SERVER(s, "max_message_bytes=4096", "lr=0.5");
    enum { N = 100 };
    float init[N];
    for (int i = 0; i < N; i++)
        init[i] = (float)i;
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "small", init, N, &id, NULL), GDDR_OK);
    gddr_client_close(&c);
    float *big = calloc(2048, sizeof(float));
    ck_assert_ptr_nonnull(big);
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 1, 2); /* pushing and registering take a worker */
    /* A header claiming more values than max_message_bytes allows. */
    uint64_t rid;
    Gddr__Reply *rep = raw_init(&r, "huge", big, 2000, 2000 * 4, 4, &rid);
    (void)rid;
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_ERROR);
    ck_assert_uint_eq(rep->error->code, GDDR_ELENGTH);
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    /* A push bigger than the limit: ZeroMQ drops it (and the connection). */
    raw_open(&r, s.endpoint);
    raw_hello(&r, 2, 3); /* pushing and registering take a worker */
    raw_push(&r, (uint32_t)id, big, 2048, 2048 * 4, NULL, 0, 0, 0, 0.0f);
    rep = raw_recv(&r, 500, NULL);
    if (rep) { /* an error reply would be fine too; a push reply would not */
        ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_ERROR);
        gddr__reply__free_unpacked(rep, NULL);
    }
    raw_close(&r);
    free(big);
    c = open_client(s.endpoint, 0, 1);
    ck_assert_int_eq(gddr_register(c, "small", init, N, &id, NULL), GDDR_OK);
    assert_state(c, id, init, N, 0, "after an oversized push");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* A request refused before it is served must not change the server's
 * state (docs/design.md section 8) -- membership included: a stranger rank
 * whose only request was rejected is not a live worker, and in sync mode a
 * step must not wait for it. */
START_TEST(test_rejected_stranger_is_not_a_worker)
{
    gt_server s;
    /* worker_timeout_s far beyond every wait below: had rank 7 become a
     * worker, the sync step would wait for it, and no wait here would end. */
    START_SERVER(s, "mode=sync", "workers=0", "lr=0.5", "worker_timeout_s=3600");
    enum { N = 8 };
    float init[N] = { 1, 2, 3, 4, 5, 6, 7, 8 }, g[N] = { 1, 1, 1, 1, 1, 1, 1, 1 }, want[N];
    for (int i = 0; i < N; i++)
        want[i] = init[i] - 0.5f * g[i];
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "s", init, N, &id, NULL), GDDR_OK);
    gddr_server_stats st = get_stats(c);
    ck_assert_int_eq(st.live_workers, 1);

    raw_conn r;
    raw_open(&r, s.endpoint);
    Gddr__Request rq;
    Gddr__Pull p = GDDR__PULL__INIT;
    raw_req(&r, &rq);
    rq.rank = 7;
    p.id = 99;
    rq.body_case = GDDR__REQUEST__BODY_PULL;
    rq.pull = &p;
    raw_send(&r, &rq, NULL, 0);
    raw_expect_error(&r, rq.req_id, GDDR_ENOKEY, "a pull of unknown tensor 99 from rank 7");
    raw_close(&r);

    st = get_stats(c);
    ck_assert_msg(st.live_workers == 1,
                  "a rejected request from rank 7 made it a live worker (live_workers %d)",
                  st.live_workers);
    /* The only worker's push completes the sync step at once. */
    uint64_t v = 0;
    ck_assert_int_eq(gddr_push(c, id, g, &v), GDDR_OK);
    float out[N];
    gddr_ticket tk;
    ck_assert_int_eq(gddr_pull_async(c, id, out, 1, &tk), GDDR_OK);
    int rc = gddr_wait(c, tk, REPLY_WAIT_MS, &v);
    ck_assert_msg(rc == GDDR_OK,
                  "sync step of the only worker did not complete within %d s after a stranger's "
                  "rejected request (worker_timeout_s 3600): %s", REPLY_WAIT_MS / 1000,
                  gddr_strerror(rc));
    ck_assert_uint_eq(v, 1);
    assert_same_floats(out, want, N, "sync step of one worker");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 5. no server ------------------------------------------------------------- */

START_TEST(test_no_server_times_out)
{
    /* Learn a free loopback port, then free it. */
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_bind(sock, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t len = sizeof ep;
    ck_assert_int_eq(zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    zmq_close(sock);
    zmq_ctx_term(ctx);

    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 300;
    o.reconnect_timeout_ms = 300;
    gddr_client *c = (gddr_client *)&o; /* must be overwritten with NULL */
    int64_t t0 = gt_now_ms();
    int rc = gddr_client_open(&o, &c);
    int64_t ms = gt_now_ms() - t0;
    ck_assert_msg(rc == GDDR_ETIMEDOUT, "open with no server at %s: %s, expected %s", ep,
                  gddr_strerror(rc), gddr_strerror(GDDR_ETIMEDOUT));
    ck_assert_ptr_null(c);
    fprintf(stderr, "server: gddr_client_open with no server gave up after %lld ms (timeout_ms 300)\n",
            (long long)ms);
    /* It waited for its timeout (a bound load cannot break) and did not
     * hang; how soon it gave up is not asserted. */
    ck_assert_msg(ms >= 250, "gddr_client_open gave up after %lld ms, before timeout_ms = 300",
                  (long long)ms);
    ck_assert_msg(ms < 30000, "gddr_client_open with no server hung for %lld ms (timeout_ms = 300)",
                  (long long)ms);
}
END_TEST

/* ---- 6. max_grad_norm ------------------------------------------------------------ */

START_TEST(test_max_grad_norm)
{
    gt_server s;
    START_SERVER(s, "max_grad_norm=1", "lr=0.5");
    enum { N = 100 };
    float init[N], g[N], want[N];
    for (int i = 0; i < N; i++) {
        init[i] = 0.25f * (float)i;
        g[i] = 1.0f; /* norm 10 */
    }
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "m", init, N, &id, NULL), GDDR_OK);
    uint64_t v = 77;
    int rc = gddr_push(c, id, g, &v);
    ck_assert_msg(rc == GDDR_EGRADNORM, "push of norm 10 with max_grad_norm=1: %s",
                  gddr_strerror(rc));
    assert_state(c, id, init, N, 0, "after a push of norm 10");

    /* A lie about the norm does not help: the server measures it too. */
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 1, 2); /* pushing and registering take a worker */
    uint64_t rid = raw_push(&r, (uint32_t)id, g, N, N * 4, NULL, 0, 0, 0, 0.5f);
    raw_expect_error(&r, rid, GDDR_EGRADNORM, "a push of norm 10 that reports 0.5");
    raw_close(&r);
    assert_state(c, id, init, N, 0, "after the refused pushes");
    gddr_server_stats st = get_stats(c);
    ck_assert_uint_eq(st.rejected, 2);
    ck_assert_uint_eq(st.pushes, 0);

    /* The guard judges what would be applied: a reported norm is only the
     * fresh gradient's (before client-side clipping; it feeds the tau
     * controller), so small values reporting 5 are applied, exactly. */
    float tiny[N], mid[N];
    for (int i = 0; i < N; i++) {
        tiny[i] = 0.01f;
        mid[i] = init[i] - 0.5f * tiny[i];
    }
    raw_open(&r, s.endpoint);
    raw_hello(&r, 2, 3); /* pushing and registering take a worker */
    rid = raw_push(&r, (uint32_t)id, tiny, N, N * 4, NULL, 0, 0, 0, 5.0f);
    raw_expect_push_ok(&r, rid, "a push of norm 0.1 that reports 5");
    raw_close(&r);
    assert_state(c, id, mid, N, 1, "after a push of norm 0.1 reporting 5");

    /* Under the limit (norm 0.5) it is applied, exactly. */
    for (int i = 0; i < N; i++) {
        g[i] = 0.05f;
        want[i] = mid[i] - 0.5f * g[i];
    }
    ck_assert_int_eq(gddr_push(c, id, g, &v), GDDR_OK);
    ck_assert_uint_eq(v, 2);
    assert_state(c, id, want, N, 2, "after a push of norm 0.5");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* A bad push changes nothing, whichever way its payload is validated
 * (server/push.c): in the read that applies it (async SGD while a pull
 * reply holds the tensor's buffer: the update goes to a fresh buffer, made
 * current only if the push is good), or first, over the apply threads
 * (no reply holding it; momentum always). NaN or Inf in the last element
 * of the last chunk and in the first, dense and sparse, and a norm over
 * max_grad_norm, each between good pushes whose results must be exact;
 * gddr_pushes_validated_in_apply_total says which way ran. */
static void bad_large_case(const char *mom) /* NULL: plain SGD */
{
    gt_server s;
    START_SERVER(s, "max_grad_norm=4000", "lr=0.5", mom);
    enum { N = (1 << 20) + 3 }; /* 4 MiB: replies held unread do not fit the socket buffers */
    float *init = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    float *want = malloc(N * sizeof(float)), *vel = calloc(N, sizeof(float));
    float *bad = malloc(N * sizeof(float));
    ck_assert(init && g && want && vel && bad);
    for (int i = 0; i < N; i++) {
        init[i] = 0.001f * (float)(i % 977);
        g[i] = 0.002f * (float)(i % 13) - 0.01f;
        want[i] = init[i];
    }
    float mu = mom ? 0.9f : 0.0f;
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "big", init, N, &id, NULL), GDDR_OK);
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 1, 2);
    uint64_t version = 0, rid;
    size_t nch = (N + 1023) / 1024, last = N - (nch - 1) * 1024;
    uint8_t bm[1025] = { 0 };
    bm[0] = 1;
    bm[(nch - 1) / 8] |= (uint8_t)(1u << ((nch - 1) % 8));
    float *sp = calloc(1024 + last, sizeof(float));
    ck_assert_ptr_nonnull(sp);
    sp[1024 + last - 1] = INFINITY;
    for (int held = 0; held < 2; held++) {
        raw_conn slow;
        if (held) {
            /* Pull replies left unread hold the tensor's buffer. */
            raw_open(&slow, s.endpoint);
            int one = 1, small = 65536;
            zmq_setsockopt(slow.sock, ZMQ_RCVHWM, &one, sizeof one);
            zmq_setsockopt(slow.sock, ZMQ_RCVBUF, &small, sizeof small);
        }
        /* Before each push (held phase): a pull whose reply stays unread,
         * answered before the push is sent. */
#define HOLD()                                                                              \
    do {                                                                                    \
        if (!held)                                                                          \
            break;                                                                          \
        double pulls0_ = gt_server_metric(c, "gddr_pulls_total");                           \
        Gddr__Request rq_;                                                                  \
        Gddr__Pull p_ = GDDR__PULL__INIT;                                                   \
        raw_req(&slow, &rq_);                                                               \
        p_.id = (uint32_t)id;                                                               \
        rq_.body_case = GDDR__REQUEST__BODY_PULL;                                           \
        rq_.pull = &p_;                                                                     \
        raw_send(&slow, &rq_, NULL, 0);                                                     \
        int64_t end_ = gt_now_ms() + 30000;                                                 \
        while (gt_server_metric(c, "gddr_pulls_total") < pulls0_ + 1 && gt_now_ms() < end_) \
            usleep(1000);                                                                   \
    } while (0)
        /* Unread replies fill the slow client's queue (RCVHWM 1: about two
         * 4 MiB replies) and the socket buffers (up to tcp_wmem's 4 MB on
         * the server's side: about one more); from the fourth on every
         * reply stays in gddr-ps's queue, holding the buffer. Two were not
         * always enough on a loaded machine (5 of 6 pushes fused once). */
        for (int k = 0; k < 4; k++)
            HOLD();
        double fused0 = gt_server_metric(c, "gddr_pushes_validated_in_apply_total");
        /* one good dense push: w -= 0.5 g (momentum: v = mu v + 0.5 g, w -= v) */
#define GOOD_PUSH(what)                                                                      \
    do {                                                                                     \
        HOLD();                                                                              \
        rid = raw_push(&r, (uint32_t)id, g, N, (uint64_t)N * 4, NULL, 0, version, version,   \
                       1.0f);                                                                \
        raw_expect_push_ok(&r, rid, what);                                                   \
        for (int i = 0; i < N; i++) {                                                        \
            vel[i] = mu * vel[i] + 0.5f * (1.0f * g[i]);                                     \
            want[i] = mom ? want[i] - vel[i] : want[i] - 0.5f * (1.0f * g[i]);               \
        }                                                                                    \
        version++;                                                                           \
        assert_state(c, id, want, N, version, what);                                         \
    } while (0)
        GOOD_PUSH("a good push");
        memcpy(bad, g, N * sizeof(float));
        bad[N - 1] = NAN;
        HOLD();
        rid = raw_push(&r, (uint32_t)id, bad, N, (uint64_t)N * 4, NULL, 0, version, version, 1.0f);
        raw_expect_error(&r, rid, GDDR_ENONFINITE, "a dense push with NaN in its last element");
        assert_state(c, id, want, N, version, "after a dense push with NaN in its last element");
        bad[N - 1] = g[N - 1];
        bad[0] = INFINITY;
        HOLD();
        rid = raw_push(&r, (uint32_t)id, bad, N, (uint64_t)N * 4, NULL, 0, version, version, 1.0f);
        raw_expect_error(&r, rid, GDDR_ENONFINITE, "a dense push with Inf in its first element");
        assert_state(c, id, want, N, version, "after a dense push with Inf in its first element");
        /* sparse: chunk 0 and the last (short), +Inf in the last value */
        HOLD();
        rid = raw_push(&r, (uint32_t)id, sp, 1024 + last, (1024 + last) * 4, bm, (nch + 7) / 8,
                       version, version, 1.0f);
        raw_expect_error(&r, rid, GDDR_ENONFINITE, "a sparse push with +Inf in its last value");
        assert_state(c, id, want, N, version, "after a sparse push with +Inf in its last value");
        /* norm 4 * sqrt(N) = 4096 > 4000 */
        for (int i = 0; i < N; i++)
            bad[i] = 4.0f;
        HOLD();
        rid = raw_push(&r, (uint32_t)id, bad, N, (uint64_t)N * 4, NULL, 0, version, version, 1.0f);
        raw_expect_error(&r, rid, GDDR_EGRADNORM, "a push of norm 4096 with max_grad_norm=4000");
        assert_state(c, id, want, N, version, "after a push over max_grad_norm");
        GOOD_PUSH("a good push after the refused ones");
#undef GOOD_PUSH
#undef HOLD
        double fused = gt_server_metric(c, "gddr_pushes_validated_in_apply_total") - fused0;
        if (held && !mom)
            ck_assert_msg(fused == 6, "with a pull reply holding the buffer %g of 6 pushes of async "
                          "SGD were validated in the read that applied them", fused);
        else
            ck_assert_msg(fused == 0, "%g pushes validated while applied (%s, reply held %d): "
                          "that needs a fresh buffer anyway and no state", fused, mom ? mom : "sgd", held);
        if (held)
            raw_close(&slow);
    }
    gddr_server_stats st = get_stats(c);
    ck_assert_uint_eq(st.rejected, 8);
    ck_assert_uint_eq(st.pushes, 4);
    raw_close(&r);
    gddr_client_close(&c);
    stop_server(&s);
    free(init), free(g), free(want), free(vel), free(bad), free(sp);
}

START_TEST(test_bad_large_push_changes_nothing)
{
    bad_large_case(NULL);
    bad_large_case("momentum=0.9");
}
END_TEST

/* ---- 7. the trainer ------------------------------------------------------------- */

START_TEST(test_trainer_softmax)
{
    gt_server s;
    START_SERVER(s, "lr=0.2");
    char bin[512];
    gt_bin_path(bin, sizeof bin, "gddr-train");
    char *argv[] = { bin, "--server", s.endpoint, "--synthetic", "2000", "--workload", "softmax",
                     "--steps", "300", "--rank", "0", "--world", "1", "--progress", "0",
                     "--timeout-ms", "5000", NULL };
    char *out = NULL, err[512] = "";
    int st = 0;
    int64_t t0 = gt_now_ms();
    int rc = gt_run_capture(argv, 90000, 0, &out, &st, err, sizeof err);
    int64_t ms = gt_now_ms() - t0;
    ck_assert_msg(rc == 0, "gddr-train: %s; output:\n%s", err, out ? out : "");
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gddr-train exited with %d; output:\n%s",
                  WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), out ? out : "");
    double loss = -1, acc = -1, steps = -1;
    ck_assert_msg(gt_result_double(out, "train_loss", &loss) == 0, "no train_loss in:\n%s", out);
    ck_assert_msg(gt_result_double(out, "test_accuracy", &acc) == 0, "no test_accuracy in:\n%s", out);
    ck_assert_msg(gt_result_double(out, "steps", &steps) == 0, "no steps in:\n%s", out);
    char rank[16];
    ck_assert_int_eq(gt_result_field(out, "rank", rank, sizeof rank), 0);
    ck_assert_str_eq(rank, "0");
    fprintf(stderr, "server: trainer: train_loss %.4f test_accuracy %.4f in %lld ms\n", loss, acc,
            (long long)ms);
    ck_assert_msg(steps == 300, "steps=%g, expected 300", steps);
    ck_assert_msg(loss >= 0 && loss < 1.0, "train_loss %g is not well below ln(10) = 2.30", loss);
    ck_assert_msg(acc > 0.5 && acc <= 1.0, "test_accuracy %g is not above 0.5", acc);
    free(out);

    /* The server saw 300 steps of pushes. */
    gddr_client *c = open_client(s.endpoint, 1, 2);
    gddr_server_stats ss = get_stats(c);
    ck_assert_msg(ss.pushes >= 300 && ss.pushes % 300 == 0,
                  "server counted %" PRIu64 " pushes for 300 steps", ss.pushes);
    ck_assert_uint_eq(ss.rejected, 0);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 8. staleness histogram -------------------------------------------------------- */

START_TEST(test_staleness_histogram)
{
    gt_server s;
    START_SERVER(s, "lr=0.5");
    enum { N = 16 };
    float init[N], g[N];
    for (int i = 0; i < N; i++) {
        init[i] = (float)i;
        g[i] = 0.125f;
    }
    gddr_client *c = open_client(s.endpoint, 3, 4);
    int id;
    ck_assert_int_eq(gddr_register(c, "h", init, N, &id, NULL), GDDR_OK);
    gddr_push_tags tags;
    memset(&tags, 0, sizeof tags);
    tags.has_birth = 1;
    tags.birth_version = 0;
    tags.base_version = 0;
    for (int k = 0; k < 5; k++) {
        uint64_t v = 0;
        int rc = gddr_push_ex(c, id, g, &tags, &v);
        ck_assert_msg(rc == GDDR_OK, "push %d: %s", k, gddr_strerror(rc));
        ck_assert_uint_eq(v, (uint64_t)k + 1);
    }
    gddr_server_stats st = get_stats(c);
    ck_assert_uint_eq(st.pushes, 5);
    ck_assert_uint_eq(st.versions_total, 5);
    for (int t = 0; t < 17; t++)
        ck_assert_msg(st.staleness_hist[t] == (t < 5 ? 1u : 0u),
                      "staleness_hist[%d] = %" PRIu64 ", expected %d", t, st.staleness_hist[t],
                      t < 5 ? 1 : 0);
    ck_assert_uint_eq(st.staleness_max, 4);
    ck_assert_msg(fabs(st.staleness_mean - 2.0) < 1e-12, "staleness_mean %g, expected 2",
                  st.staleness_mean);
    ck_assert_uint_eq(st.worker_pushes, 5);
    ck_assert_msg(fabs(st.worker_staleness_mean - 2.0) < 1e-12,
                  "worker_staleness_mean %g, expected 2", st.worker_staleness_mean);
    ck_assert_msg(st.staleness_ema > 0 && st.staleness_ema < 4, "staleness_ema %g",
                  st.staleness_ema);
    ck_assert_msg(st.epoch != 0, "stats carry no epoch");
    /* Another worker has pushed nothing. */
    gddr_client *c2 = open_client(s.endpoint, 0, 4);
    gddr_server_stats st2 = get_stats(c2);
    ck_assert_uint_eq(st2.worker_pushes, 0);
    ck_assert_uint_eq(st2.pushes, 5);
    gddr_client_close(&c2);
    /* The values moved by five pushes: 5 * 0.5 * 0.125 (exact). */
    float want[N];
    for (int i = 0; i < N; i++)
        want[i] = init[i] - 0.3125f;
    assert_state(c, id, want, N, 5, "after five pushes");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 9. metrics ------------------------------------------------------------------- */

/* Every sample line of a Prometheus text is NAME[{LABELS}] VALUE. */
static void assert_prometheus_syntax(const char *text)
{
    char *copy = strdup(text), *save = NULL;
    int lineno = 0;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        if (line[0] == '#') {
            ck_assert_msg(strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0,
                          "metrics line %d: bad comment '%s'", lineno, line);
            continue;
        }
        const char *p = line;
        ck_assert_msg((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_',
                      "metrics line %d: bad name in '%s'", lineno, line);
        while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
               *p == '_' || *p == ':')
            p++;
        if (*p == '{') {
            p = strchr(p, '}');
            ck_assert_msg(p != NULL, "metrics line %d: unclosed labels in '%s'", lineno, line);
            p++;
        }
        ck_assert_msg(*p == ' ', "metrics line %d: no space before the value in '%s'", lineno, line);
        char *end;
        strtod(p + 1, &end);
        ck_assert_msg(end != p + 1 && *end == 0, "metrics line %d: bad value in '%s'", lineno, line);
    }
    free(copy);
}

START_TEST(test_metrics_text)
{
    gt_server s;
    START_SERVER(s, "lr=0.5");
    enum { N = 8 };
    float init[N] = { 1, 2, 3, 4, 5, 6, 7, 8 }, g[N] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "m", init, N, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
    /* One refused push shows up by reason. */
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 1, 2); /* pushing and registering take a worker */
    uint64_t rid = raw_push(&r, (uint32_t)id, g, N - 1, (N - 1) * 4, NULL, 0, 0, 0, 1.0f);
    raw_expect_error(&r, rid, GDDR_ELENGTH, "a short push");
    raw_close(&r);

    char *text = NULL;
    int rc = gddr_server_metrics_text(c, &text);
    ck_assert_msg(rc == GDDR_OK, "gddr_server_metrics_text: %s", gddr_strerror(rc));
    ck_assert_ptr_nonnull(text);
    static const char *const want[] = {
        "# TYPE gddr_pushes_total counter\n",
        "\ngddr_pushes_total 1\n",
        "\ngddr_versions_total 1\n",
        "\ngddr_rejected_total{reason=\"GDDR_ELENGTH\"} 1\n",
        "# TYPE gddr_staleness histogram\n",
        "\ngddr_staleness_bucket{le=\"0\"} 1\n",
        "\ngddr_staleness_bucket{le=\"1\"} 1\n",
        "\ngddr_staleness_bucket{le=\"15\"} 1\n",
        "\ngddr_staleness_bucket{le=\"+Inf\"} 1\n",
        "\ngddr_staleness_sum 0\n",
        "\ngddr_staleness_count 1\n",
        "\ngddr_tensor_version{tensor=\"m\"} 1\n",
        "# TYPE gddr_shard_info gauge\n",
        "\ngddr_shard_info{shard_index=\"0\",shard_count=\"1\"} 1\n", /* unsharded: 0 of 1 */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(text, want[i]) != NULL, "metrics text lacks '%s'; text:\n%s", want[i],
                      text);
    assert_prometheus_syntax(text);
    free(text);
    /* The client is still in step with the server afterwards. */
    gddr_server_stats st = get_stats(c);
    ck_assert_uint_eq(st.pushes, 1);
    ck_assert_uint_eq(st.rejected, 1);

    /* Asking for the metrics while a non-blocking pull is in flight must not
     * lose that pull's reply. */
    float out[N], wantv[N];
    for (int i = 0; i < N; i++)
        wantv[i] = init[i] - 0.5f * g[i];
    memset(out, 0, sizeof out);
    gddr_ticket tk;
    ck_assert_int_eq(gddr_pull_async(c, id, out, 0, &tk), GDDR_OK);
    text = NULL;
    rc = gddr_server_metrics_text(c, &text);
    ck_assert_msg(rc == GDDR_OK, "gddr_server_metrics_text with a pull in flight: %s",
                  gddr_strerror(rc));
    free(text);
    uint64_t v = 0;
    rc = gddr_wait(c, tk, REPLY_WAIT_MS, &v);
    ck_assert_msg(rc == GDDR_OK,
                  "a pull in flight across gddr_server_metrics_text() never completed: %s (%s)",
                  gddr_strerror(rc), gddr_client_errmsg(c));
    ck_assert_uint_eq(v, 1);
    assert_same_floats(out, wantv, N, "pull in flight across gddr_server_metrics_text()");
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 10. SIGTERM ------------------------------------------------------------------- */

/* gddr-bench runs and reports every row it promises (figures are not
 * asserted: they belong to the machine, docs/performance.md), and its
 * raw+apply ceiling applies pushes exactly (checked by gddr-bench itself:
 * a run whose ceiling server does not exits 1). */
START_TEST(test_bench_reports)
{
    char bin[512], *out = NULL, err[256];
    gt_bin_path(bin, sizeof bin, "gddr-bench");
    /* The BENCH lines go to stderr: run it through a shell to merge them. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' --sections pushpull,clients,gddr,apply,servers,gap --sizes 4K,64K --clients 2 --reps 1 "
             "--budget-mb 1 2>&1",
             bin);
    char *sh[] = { "/bin/sh", "-c", cmd, NULL };
    int st = 0;
    ck_assert_int_eq(gt_run_capture(sh, 120000, 0, &out, &st, err, sizeof err), 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gddr-bench failed:\n%s", out);
    static const char *const want[] = { "BENCH section=pushpull bytes=4096 ",
                                        "BENCH section=pushpull bytes=65536 ",
                                        "BENCH section=clients bytes=1048576 clients=2 ",
                                        "BENCH section=gddr ", "BENCH section=gddr_auto ",
                                        "BENCH section=gddr_q8 ", "BENCH section=gddr_q8auto ",
                                        "BENCH section=apply way=serial ",
                                        "BENCH section=apply way=pool ",
                                        "BENCH section=apply way=pool_cow ",
                                        "BENCH section=apply way=fused_cow ",
                                        "BENCH section=servers ",
                                        "BENCH section=gap bytes=1048576 before=0 ",
                                        "BENCH section=gap bytes=1048576 before=1 ",
                                        "BENCH section=gap bytes=1048576 before=2 " };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *line = strstr(out, want[i]);
        ck_assert_msg(line, "no '%s' line in:\n%s", want[i], out);
        const char *r = strstr(line, "ratio=");
        ck_assert_msg(r && atof(r + 6) > 0, "no positive ratio in: %.200s", line);
        /* The pushpull and clients rows also run the raw server that
         * validates and applies (gddr-bench dies when it does not apply
         * exactly). */
        const char *a = strstr(line, "ratio_apply=");
        ck_assert_msg((!strstr(want[i], "pushpull") && !strstr(want[i], "clients")) || (a && atof(a + 12) > 0),
                      "no positive ratio_apply in: %.200s", line);
    }
    free(out);
}
END_TEST

/* gddr-bench's rows section, smallest: 1k keys x 16 floats, 1 and 2
 * clients, against gddr-ps and the bare key-value server. Every run checks
 * the values it pulls (after a push: before - 0.5 x gradient, exactly) and
 * exits 1 on a wrong one; the count of values it checked is asserted here,
 * so a run that checked nothing fails too. */
START_TEST(test_bench_rows_checks)
{
    char bin[512], *out = NULL, err[256];
    gt_bin_path(bin, sizeof bin, "gddr-bench");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --sections rows --rows-keys 1K --rows-dims 16 --rows-clients 1,2 "
                              "--reps 1 --budget-mb 1 2>&1", bin);
    char *sh[] = { "/bin/sh", "-c", cmd, NULL };
    int st = 0;
    ck_assert_int_eq(gt_run_capture(sh, 120000, 0, &out, &st, err, sizeof err), 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gddr-bench failed:\n%s", out);
    for (int cl = 1; cl <= 2; cl++) {
        char want[128];
        snprintf(want, sizeof want, "BENCH section=rows keys=1024 dim=16 clients=%d ", cl);
        const char *line = strstr(out, want);
        ck_assert_msg(line, "no '%s' line in:\n%s", want, out);
        const char *r = strstr(line, "ratio=");
        ck_assert_msg(r && atof(r + 6) > 0, "no positive ratio in: %.200s", line);
    }
    /* per run and client: 1024 x 16 values after the warm-up push and as
     * many after the timed rounds; runs: (1 + 2 clients) x (gddr + bare) */
    const char *v = strstr(out, "BENCH section=rows_check values=");
    ck_assert_msg(v, "no rows_check line in:\n%s", out);
    ck_assert_int_eq(atoll(v + strlen("BENCH section=rows_check values=")), 2LL * 1024 * 16 * 3 * 2);
    free(out);
}
END_TEST

START_TEST(test_sigterm_exits_zero)
{
    gt_server s;
    START_SERVER(s, "lr=0.5");
    enum { N = 32 };
    float init[N] = { 0 };
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "x", init, N, &id, NULL), GDDR_OK);
    /* A pull parked for version 1 (nothing will push) is answered with
     * GDDR_ESHUTDOWN when the server stops. */
    float out[N];
    gddr_ticket tk;
    ck_assert_int_eq(gddr_pull_async(c, id, out, 1, &tk), GDDR_OK);
    gddr_server_stats st = get_stats(c); /* the server has read the pull by now */
    ck_assert_uint_eq(st.pulls, 0);
    int64_t t0 = gt_now_ms();
    ck_assert_int_eq(gt_server_signal(&s, SIGTERM), 0);
    int rc = gddr_wait(c, tk, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rc == GDDR_ESHUTDOWN, "parked pull at SIGTERM: %s, expected %s",
                  gddr_strerror(rc), gddr_strerror(GDDR_ESHUTDOWN));
    int status = 0;
    int w = gt_wait_pid(s.pid, REPLY_WAIT_MS, &status);
    int64_t ms = gt_now_ms() - t0;
    if (w != 1)
        gt_server_stop(&s, 0, NULL);
    else
        s.pid = 0;
    ck_assert_msg(w == 1, "gddr-ps still runs %d s after SIGTERM", REPLY_WAIT_MS / 1000);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "gddr-ps ended with %s %d after SIGTERM",
                  WIFEXITED(status) ? "status" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    fprintf(stderr, "server: gddr-ps exited %lld ms after SIGTERM\n", (long long)ms);
    gddr_client_close(&c);

    /* SIGINT, idle: the same. */
    START_SERVER(s, NULL);
    ck_assert_int_eq(gt_server_signal(&s, SIGINT), 0);
    w = gt_wait_pid(s.pid, REPLY_WAIT_MS, &status);
    if (w != 1)
        gt_server_stop(&s, 0, NULL);
    else
        s.pid = 0;
    ck_assert_msg(w == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "gddr-ps after SIGINT: wait %d, status %d", w, status);
}
END_TEST

/* ---- 10. shard layout ------------------------------------------------------------- */

/* A raw hello as `rank` of `world` (or as an observer) that says where the
 * client's server list puts this server: shard idx of cnt (cnt 0: no
 * layout, as an unsharded or older client). Returns the reply. */
static Gddr__Reply *shard_hello(raw_conn *r, uint32_t rank, uint32_t world, int observer,
                                uint32_t idx, uint32_t cnt)
{
    Gddr__Request rq;
    Gddr__Hello h = GDDR__HELLO__INIT;
    r->rank = rank;
    raw_req(r, &rq);
    rq.observer = observer;
    h.world_size = world;
    h.client = "shard layout test";
    h.shard_index = idx;
    h.shard_count = cnt;
    rq.body_case = GDDR__REQUEST__BODY_HELLO;
    rq.hello = &h;
    raw_send(r, &rq, NULL, 0);
    Gddr__Reply *rep = raw_recv(r, REPLY_WAIT_MS, NULL);
    ck_assert_msg(rep != NULL, "hello claiming shard %u of %u: no reply", idx, cnt);
    ck_assert_uint_eq(rep->req_id, rq.req_id);
    return rep;
}

/* Accepted, and the reply says the server's own layout. */
static void expect_shard_ok(raw_conn *r, uint32_t rank, int observer, uint32_t idx, uint32_t cnt,
                            uint32_t server_idx, uint32_t server_cnt)
{
    Gddr__Reply *rep = shard_hello(r, rank, 4, observer, idx, cnt);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_HELLO,
                  "hello claiming shard %u of %u refused: %s", idx, cnt,
                  rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "?");
    ck_assert_uint_eq(rep->hello->shard_index, server_idx);
    ck_assert_uint_eq(rep->hello->shard_count, server_cnt);
    gddr__reply__free_unpacked(rep, NULL);
}

/* Refused for good (E_CONFIG, no retry hint) with a message holding both
 * needles. */
static void expect_shard_refused(raw_conn *r, uint32_t rank, int observer, uint32_t idx,
                                 uint32_t cnt, const char *needle1, const char *needle2)
{
    Gddr__Reply *rep = shard_hello(r, rank, 4, observer, idx, cnt);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR,
                  "hello claiming shard %u of %u was accepted", idx, cnt);
    ck_assert_msg(rep->error->code == GDDR_ECONFIG, "hello claiming shard %u of %u: %s (%s)", idx,
                  cnt, gddr_strerror((int)rep->error->code), rep->error->message);
    ck_assert_uint_eq(rep->error->retry_ms, 0);
    ck_assert_msg(strstr(rep->error->message, needle1) && strstr(rep->error->message, needle2),
                  "refusal '%s' lacks '%s' or '%s'", rep->error->message, needle1, needle2);
    gddr__reply__free_unpacked(rep, NULL);
}

/* A worker whose server list puts a server at another place than its
 * shard_index of shard_count gets a clear refusal instead of a silently
 * mixed model; a refused hello makes no worker. */
START_TEST(test_shard_layout)
{
    gt_server s;
    START_SERVER(s, "shard_index=1", "shard_count=3", "worker_timeout_s=3600");
    raw_conn r;
    raw_open(&r, s.endpoint);
    expect_shard_refused(&r, 0, 0, 0, 2, "this server is shard 1 of 3", "puts it at 0 of 2");
    expect_shard_refused(&r, 0, 0, 0, 3, "shard 1 of 3", "at 0 of 3");   /* the wrong place */
    expect_shard_refused(&r, 0, 0, 1, 2, "shard 1 of 3", "at 1 of 2");   /* a shorter list */
    expect_shard_refused(&r, 0, 0, 0, 0, "shard 1 of 3", "sharded over 3 servers"); /* no layout */
    expect_shard_refused(&r, 0, 1, 2, 3, "shard 1 of 3", "at 2 of 3");   /* an observer's claim */
    expect_shard_ok(&r, 0, 1, 0, 0, 1, 3); /* an observer without a claim reads this one shard */
    expect_shard_ok(&r, 2, 0, 1, 3, 1, 3); /* the right place: worker 2 */
    raw_close(&r);
    /* Only the accepted hello made a worker (the metrics list every rank
     * ever accepted); the refused ones as rank 0 changed nothing. */
    gddr_client *obs = open_observer_on(s.endpoint, REPLY_WAIT_MS);
    char *text = NULL;
    ck_assert_int_eq(gddr_server_metrics_text(obs, &text), GDDR_OK);
    ck_assert_msg(strstr(text, "\ngddr_shard_info{shard_index=\"1\",shard_count=\"3\"} 1\n"),
                  "no shard gauge in:\n%s", text);
    ck_assert_msg(strstr(text, "\ngddr_worker_pushes_total{rank=\"2\"} 0\n") &&
                      !strstr(text, "gddr_worker_pushes_total{rank=\"0\"}"),
                  "workers other than rank 2 in:\n%s", text);
    free(text);
    gddr_client_close(&obs);
    /* A worker that lists only this server (no layout in its hello) fails
     * at once with the server's sentence, not after its reconnect time. */
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1;
    o.reconnect_timeout_ms = 600000;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    ck_assert_msg(rc == GDDR_ECONFIG, "a one-endpoint worker on shard 1 of 3: %s",
                  gddr_strerror(rc));
    ck_assert_ptr_null(c);
    stop_server(&s);

    /* An unsharded server is 0 of 1: a hello without a layout and one that
     * says 0 of 1 are both taken; a list of two is not. */
    START_SERVER(s, "worker_timeout_s=3600");
    raw_open(&r, s.endpoint);
    expect_shard_refused(&r, 0, 0, 0, 2, "this server is shard 0 of 1", "puts it at 0 of 2");
    expect_shard_ok(&r, 0, 0, 0, 0, 0, 1);
    expect_shard_ok(&r, 0, 0, 0, 1, 0, 1);
    raw_close(&r);
    stop_server(&s);
}
END_TEST

/* Worker 0 on one shard (server list position idx of cnt): registers a
 * tensor and pushes `pushes` times. */
static void shard_worker_pushes(const char *ep, uint32_t idx, uint32_t cnt, int pushes)
{
    raw_conn r;
    raw_open(&r, ep);
    expect_shard_ok(&r, 0, 0, idx, cnt, idx, cnt);
    float v[4] = { 1, 2, 3, 4 }, g[4] = { 1, 1, 1, 1 };
    uint64_t rid;
    Gddr__Reply *rep = raw_init(&r, "w", v, 4, 16, 4, &rid);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_INIT);
    uint32_t id = rep->init->id;
    gddr__reply__free_unpacked(rep, NULL);
    for (int k = 0; k < pushes; k++) {
        r.step++;
        raw_expect_push_ok(&r, raw_push(&r, id, g, 4, 16, NULL, 0, (uint64_t)k, (uint64_t)k, 2.0f),
                           "a push to one shard");
    }
    raw_close(&r);
}

/* The column of `name` in a whitespace-separated header line, or -1. */
static int column_of(const char *header, const char *name)
{
    char *copy = strdup(header), *save = NULL;
    int col = 0, found = -1;
    for (char *t = strtok_r(copy, " \n", &save); t; t = strtok_r(NULL, " \n", &save), col++)
        if (strcmp(t, name) == 0) {
            found = col;
            break;
        }
    free(copy);
    return found;
}

/* Token `col` of the line of text that starts with `start`, into out. */
static void token_of_line(const char *text, const char *start, int col, char *out, size_t len)
{
    const char *p = text;
    while (p && strncmp(p, start, strlen(start)) != 0) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    ck_assert_msg(p != NULL, "no line starting with '%s' in:\n%s", start, text);
    char *line = strndup(p, strcspn(p, "\n")), *save = NULL;
    char *t = strtok_r(line, " ", &save);
    for (int k = 0; t && k < col; k++)
        t = strtok_r(NULL, " ", &save);
    ck_assert_msg(t != NULL, "line '%s' has no column %d", line, col);
    snprintf(out, len, "%s", t);
    free(line);
}

/* Runs gddr-ctl with args and returns its output (exit status 0 asserted). */
static char *run_ctl(char *const *args)
{
    char bin[512], err[256] = "", *out = NULL;
    char *argv[16];
    int a = 0, st = 0;
    gt_bin_path(bin, sizeof bin, "gddr-ctl");
    argv[a++] = bin;
    for (int k = 0; args[k] && a < 15; k++)
        argv[a++] = args[k];
    argv[a] = NULL;
    int rc = gt_run_capture(argv, 30000, 0, &out, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "gddr-ctl: %s", err);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gddr-ctl %s failed:\n%s", args[2], out);
    return out;
}

/* The merged text of several servers is one valid exposition: every sample
 * carries shard="0" or shard="1", no series appears twice, each family's
 * HELP and TYPE appear once and its samples follow them, together. */
static void assert_merged_metrics(const char *text)
{
    assert_prometheus_syntax(text);
    char *copy = strdup(text), *save = NULL;
    char **series = calloc(4096, sizeof *series), **fams = calloc(512, sizeof *fams);
    int ns = 0, nfam = 0;
    char cur[128] = "";
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "# TYPE ", 7) == 0) {
            snprintf(cur, sizeof cur, "%.*s", (int)strcspn(line + 7, " "), line + 7);
            for (int k = 0; k < nfam; k++)
                ck_assert_msg(strcmp(fams[k], cur) != 0, "TYPE of %s twice", cur);
            ck_assert_int_lt(nfam, 512);
            fams[nfam++] = strdup(cur);
            continue;
        }
        if (line[0] == '#')
            continue;
        size_t nl = strcspn(line, "{ ");
        ck_assert_msg(strncmp(line, cur, strlen(cur)) == 0 && cur[0],
                      "sample '%s' is not under its family's TYPE (last TYPE: %s)", line, cur);
        ck_assert_msg(strncmp(line + nl, "{shard=\"0\"", 10) == 0 ||
                          strncmp(line + nl, "{shard=\"1\"", 10) == 0,
                      "sample without a shard label: '%s'", line);
        size_t sl = strcspn(line, " ");
        if (line[nl] == '{')
            sl = (size_t)(strchr(line, '}') - line) + 1;
        char *key = strndup(line, sl);
        for (int k = 0; k < ns; k++)
            ck_assert_msg(strcmp(series[k], key) != 0, "series %s appears twice", key);
        ck_assert_int_lt(ns, 4096);
        series[ns++] = key;
    }
    ck_assert_int_gt(ns, 20);
    for (int k = 0; k < ns; k++)
        free(series[k]);
    for (int k = 0; k < nfam; k++)
        free(fams[k]);
    free(series);
    free(fams);
    free(copy);
}

/* gddr-ctl over the two servers of a sharded model: status sums the
 * counters, metrics merges the texts with a shard label. */
START_TEST(test_ctl_several_servers)
{
    gt_server s0, s1;
    START_SERVER(s0, "shard_index=0", "shard_count=2", "lr=0.5");
    START_SERVER(s1, "shard_index=1", "shard_count=2", "lr=0.5");
    shard_worker_pushes(s0.endpoint, 0, 2, 2);
    shard_worker_pushes(s1.endpoint, 1, 2, 3);
    char list[600];
    snprintf(list, sizeof list, "%s, %s", s0.endpoint, s1.endpoint);

    char *a1[] = { "-s", list, "metrics", NULL };
    char *text = run_ctl(a1);
    assert_merged_metrics(text);
    static const char *const want[] = {
        "\ngddr_pushes_total{shard=\"0\"} 2\n",
        "\ngddr_pushes_total{shard=\"1\"} 3\n",
        "\ngddr_tensor_version{shard=\"1\",tensor=\"w\"} 3\n",
        "\ngddr_shard_info{shard=\"1\",shard_index=\"1\",shard_count=\"2\"} 1\n",
        "\ngddr_staleness_bucket{shard=\"0\",le=\"+Inf\"} 2\n",
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        ck_assert_msg(strstr(text, want[k]), "merged metrics lack '%s':\n%s", want[k], text);
    free(text);

    /* The same servers named by two -s, in the other order: the labels are
     * the shards the servers say they are, not their places in the list. */
    char *a2[] = { "-s", s1.endpoint, "-s", s0.endpoint, "metrics", NULL };
    text = run_ctl(a2);
    assert_merged_metrics(text);
    ck_assert_msg(strstr(text, "\ngddr_pushes_total{shard=\"1\"} 3\n"), "%s", text);
    free(text);

    char *a3[] = { "-s", list, "status", NULL };
    text = run_ctl(a3);
    const char *hdr = strstr(text, "shard ");
    ck_assert_msg(hdr == text, "status does not start with its header:\n%s", text);
    char val[64];
    token_of_line(text, "total ", column_of(hdr, "pushes"), val, sizeof val);
    ck_assert_str_eq(val, "5");
    token_of_line(text, "total ", column_of(hdr, "updates"), val, sizeof val);
    ck_assert_str_eq(val, "5");
    token_of_line(text, "1/2 ", column_of(hdr, "pushes"), val, sizeof val);
    ck_assert_str_eq(val, "3");
    token_of_line(text, "0/2 ", column_of(hdr, "endpoint"), val, sizeof val);
    ck_assert_str_eq(val, s0.endpoint);
    free(text);
    stop_server(&s0);
    stop_server(&s1);
}
END_TEST

/* gddr-ctl status labels what it counts: pushes, pulls and updates are
 * per tensor (3 steps of a 2-tensor model are 6 pushes), and tau, GDDR's
 * delay bound, is shown only once a worker held a chunk back; with dense
 * workers it says GDDR is off. Several servers: the tau column is "-". */
START_TEST(test_ctl_status_labels)
{
    enum { N = 8 * 1024 }; /* 8 chunks a tensor */
    gt_server s;
    START_SERVER(s, "tau_dynamic=false", "tau_init=4", "lr=0.01");
    static float w[2][N], g[2][N];
    for (int k = 0; k < N; k++)
        g[0][k] = g[1][k] = 0.5f;
    const float *grads[2] = { g[0], g[1] };
    float *params[2] = { w[0], w[1] };
    gddr_client *c = open_client(s.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "labels.a", w[0], N, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c, "labels.b", w[1], N, &id, NULL), GDDR_OK);
    for (int k = 0; k < 3; k++)
        ck_assert_int_eq(gddr_step(c, grads, params), GDDR_OK);
    gddr_client_close(&c);

    char *a1[] = { "-s", s.endpoint, "status", NULL };
    char *text = run_ctl(a1);
    ck_assert_msg(strstr(text, "\ntensor pushes  6\n"), "3 steps of 2 tensors are 6 tensor pushes:\n%s",
                  text);
    ck_assert_msg(strstr(text, "\ntensor updates 6\n"), "%s", text);
    ck_assert_msg(!strstr(text, "\npushes "), "pushes not labelled per tensor:\n%s", text);
    ck_assert_msg(strstr(text, "\ntau            - (GDDR off"), "dense workers, yet tau shown:\n%s",
                  text);

    /* A GDDR worker: tau appears, with the share of chunks held. */
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1;
    o.delay_fraction = 0.5;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    ck_assert_int_eq(gddr_register(c, "labels.a", w[0], N, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c, "labels.b", w[1], N, &id, NULL), GDDR_OK);
    for (int k = 0; k < 4; k++)
        ck_assert_int_eq(gddr_step(c, grads, params), GDDR_OK);
    free(text);
    text = run_ctl(a1);
    ck_assert_msg(strstr(text, "\ntau            4 (GDDR delay bound; "), "GDDR worker, tau not shown:\n%s",
                  text);
    free(text);

    /* The table of several servers (the same one twice): tau 4 there. */
    char list[600];
    snprintf(list, sizeof list, "%s,%s", s.endpoint, s.endpoint);
    char *a2[] = { "-s", list, "status", NULL };
    text = run_ctl(a2);
    const char *hdr = strstr(text, "shard ");
    char val[64];
    token_of_line(text, "total ", column_of(hdr, "tau"), val, sizeof val);
    ck_assert_str_eq(val, "4");
    ck_assert_msg(strstr(text, "counted per tensor"), "%s", text);
    free(text);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* A fresh server exports every counter with a sample, so a dashboard shows
 * 0, not "No data": gddr_rejected_total has every reason at 0 (and OTHER),
 * and every family has a sample except those labelled by a worker or a
 * tensor, of which a fresh server has none. */
START_TEST(test_metrics_fresh_server)
{
    gt_server s;
    START_SERVER(s, "lr=0.1");
    char *a[] = { "-s", s.endpoint, "metrics", NULL };
    char *text = run_ctl(a);
    assert_prometheus_syntax(text);
    char want[128];
#define GDDR__WANT_ZERO(name, num, msg)                                                    \
    if (num != 0) {                                                                       \
        snprintf(want, sizeof want, "\ngddr_rejected_total{reason=\"%s\"} 0\n", #name);    \
        ck_assert_msg(strstr(text, want), "a fresh server's metrics lack %s", want + 1);     \
    }
    GDDR_ERRORS(GDDR__WANT_ZERO)
#undef GDDR__WANT_ZERO
    ck_assert_msg(strstr(text, "\ngddr_rejected_total{reason=\"OTHER\"} 0\n"), "no OTHER reason");
    ck_assert_msg(strstr(text, "\ngddr_auth_rejected_total 0\n"), "no gddr_auth_rejected_total");
    /* Every family: a sample follows its TYPE line. */
    static const char *const per_entity[] = { "gddr_worker_", "gddr_tau", "gddr_tensor_version" };
    int families = 0;
    for (const char *p = strstr(text, "# TYPE "); p; p = strstr(p + 1, "\n# TYPE ")) {
        const char *name = p[0] == '\n' ? p + 8 : p + 7;
        size_t nl = strcspn(name, " ");
        int skip = 0;
        for (size_t k = 0; k < sizeof per_entity / sizeof per_entity[0]; k++)
            skip |= strncmp(name, per_entity[k], strlen(per_entity[k])) == 0;
        families++;
        if (skip)
            continue;
        const char *next = strchr(name, '\n');
        ck_assert_msg(next && strncmp(next + 1, name, nl) == 0,
                      "family %.*s has no sample on a fresh server", (int)nl, name);
    }
    ck_assert_int_gt(families, 30);
    free(text);
    stop_server(&s);
}
END_TEST

/* ---- suite ------------------------------------------------------------------------ */

#define ADD_CASE(s, name, fn) GT_ADD_CASE(s, name, fn, TCASE_TIMEOUT)

Suite *suite_server(void)
{
    Suite *s = suite_create("server");
    ADD_CASE(s, "register_pull_push", test_register_pull_push_exact);
    ADD_CASE(s, "sparse_push", test_sparse_push_exact);
    ADD_CASE(s, "concurrent_pushes", test_concurrent_pushes_exact);
    ADD_CASE(s, "no_torn_reads", test_no_torn_reads);
    ADD_CASE(s, "bad_requests", test_bad_requests);
    ADD_CASE(s, "oversized_message", test_oversized_message);
    ADD_CASE(s, "rejected_stranger", test_rejected_stranger_is_not_a_worker);
    ADD_CASE(s, "no_server", test_no_server_times_out);
    ADD_CASE(s, "bad_large_push_changes_nothing", test_bad_large_push_changes_nothing);
    ADD_CASE(s, "max_grad_norm", test_max_grad_norm);
    ADD_CASE(s, "trainer", test_trainer_softmax);
    ADD_CASE(s, "staleness_histogram", test_staleness_histogram);
    ADD_CASE(s, "metrics", test_metrics_text);
    ADD_CASE(s, "shard_layout", test_shard_layout);
    ADD_CASE(s, "ctl_several_servers", test_ctl_several_servers);
    ADD_CASE(s, "ctl_status_labels", test_ctl_status_labels);
    ADD_CASE(s, "metrics_fresh_server", test_metrics_fresh_server);
    ADD_CASE(s, "sigterm", test_sigterm_exits_zero);
    ADD_CASE(s, "bench_reports", test_bench_reports);
    ADD_CASE(s, "bench_rows_checks", test_bench_rows_checks);
    return s;
}
