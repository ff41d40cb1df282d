/* wirekit.h -- a raw DEALER to a real gddr-ps, for tests that build
 * requests by hand (malformed ones included), and a stats helper. Header
 * only; include after check.h and harness.h. */
#ifndef GDDR_TESTS_WIREKIT_H
#define GDDR_TESTS_WIREKIT_H

#include <check.h>
#include <string.h>
#include <zmq.h>

#include "gddr/gddr.h"
#include "wire.h"

typedef struct raw_conn {
    void *ctx, *sock;
    uint64_t next_id;
    uint32_t rank;     /* the rank its requests speak for */
    uint64_t session;  /* Request.session it sends (0: the connection is the session) */
    uint64_t step;     /* the step of its next push (every push a new one) */
} raw_conn;

static inline void raw_open(raw_conn *r, const char *ep)
{
    memset(r, 0, sizeof *r);
    r->ctx = zmq_ctx_new();
    ck_assert_ptr_nonnull(r->ctx);
    r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
    ck_assert_ptr_nonnull(r->sock);
    int zero = 0;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_connect(r->sock, ep), 0);
    r->next_id = 1000; /* ids of their own, far from a client's */
}

static inline void raw_close(raw_conn *r)
{
    if (r->sock)
        zmq_close(r->sock);
    if (r->ctx)
        zmq_ctx_term(r->ctx);
    memset(r, 0, sizeof *r);
}

/* Receives one reply within timeout_ms; NULL when none came. The frames are
 * kept in *f when f is given (the caller closes them). */
static inline Gddr__Reply *raw_recv(raw_conn *r, int timeout_ms, gddr__frames *f)
{
    zmq_pollitem_t it = { r->sock, 0, ZMQ_POLLIN, 0 };
    int64_t deadline = gt_now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - gt_now_ms();
        if (left < 0)
            return NULL;
        int rc = zmq_poll(&it, 1, (long)left);
        if (rc > 0)
            break;
        if (rc < 0 && errno != EINTR)
            return NULL;
    }
    gddr__frames fr;
    if (gddr__frames_recv(r->sock, &fr, ZMQ_DONTWAIT) < 1)
        return NULL;
    Gddr__Reply *rep = gddr__reply__unpack(NULL, gddr__frame_size(&fr, 0), gddr__frame_data(&fr, 0));
    ck_assert_msg(rep != NULL, "the server sent a reply that is not a valid gddr.Reply");
    if (f)
        *f = fr;
    else
        gddr__frames_close(&fr);
    return rep;
}

/* Says hello as worker `rank` of `world` (session 0: the connection is the
 * session) and expects the hello reply; later requests speak for that rank. */
static inline void raw_hello(raw_conn *r, uint32_t rank, uint32_t world)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Hello h = GDDR__HELLO__INIT;
    rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq.req_id = ++r->next_id;
    rq.rank = rank;
    rq.session = r->session;
    h.world_size = world;
    h.client = "raw test connection";
    rq.body_case = GDDR__REQUEST__BODY_HELLO;
    rq.hello = &h;
    ck_assert_msg(gddr__send(r->sock, NULL, &rq.base, NULL, 0) >= 0, "send hello");
    Gddr__Reply *rep = raw_recv(r, 30000, NULL);
    ck_assert_msg(rep != NULL, "hello as rank %u: no reply", rank);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_HELLO, "hello as rank %u refused: %s", rank,
                  rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "?");
    gddr__reply__free_unpacked(rep, NULL);
    r->rank = rank;
}

/* A request of r's rank and session, the next req_id. */
static inline void raw_request(raw_conn *r, Gddr__Request *rq)
{
    rq->protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq->req_id = ++r->next_id;
    rq->rank = r->rank;
    rq->session = r->session;
}

/* A push through the wire from r's rank and session: step and norm given,
 * a chunk bitmap (NULL: dense), Push.held and Push.flush. Returns its
 * req_id (the reply is the caller's to read). */
static inline uint64_t raw_push_send(raw_conn *r, uint32_t id, const float *vals, size_t nvals,
                                     uint64_t version, uint64_t step, float norm, const uint8_t *bm,
                                     size_t bmlen, int held, int flush)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Push p = GDDR__PUSH__INIT;
    raw_request(r, &rq);
    p.id = id;
    p.birth_version = p.base_version = version;
    p.step = step;
    p.grad_norm = norm;
    p.bitmap.data = (uint8_t *)bm;
    p.bitmap.len = bm ? bmlen : 0;
    p.held = held;
    p.flush = flush;
    p.payload_bytes = nvals * 4;
    rq.body_case = GDDR__REQUEST__BODY_PUSH;
    rq.push = &p;
    gddr__raw raw = { vals, nvals * 4, NULL, NULL };
    ck_assert(gddr__send(r->sock, NULL, &rq.base, &raw, 1) >= 0);
    return rq.req_id;
}

/* A dense push through the wire from r's rank and session, step given. */
static inline uint64_t raw_push_step(raw_conn *r, uint32_t id, const float *vals, size_t nvals,
                              uint64_t version, uint64_t step, float norm)
{
    return raw_push_send(r, id, vals, nvals, version, step, norm, NULL, 0, 0, 0);
}

/* An observer client of ep (never counted as a worker), or fails the test. */
static inline gddr_client *open_observer_on(const char *ep, int timeout_ms)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = 0;
    o.world_size = 1;
    o.observer = 1;
    o.timeout_ms = timeout_ms;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    ck_assert_msg(rc == GDDR_OK, "observer on %s: %s", ep, gddr_strerror(rc));
    return c;
}

/* The server's values of key once it has version v (an observer's pull,
 * within wait_ms). */
static inline void server_values_within(const char *ep, const char *key, float *out, size_t n, uint64_t v,
                                        int wait_ms)
{
    gddr_client *obs = open_observer_on(ep, wait_ms);
    float *z = calloc(n, 4);
    int id;
    ck_assert_int_eq(gddr_register(obs, key, z, n, &id, NULL), GDDR_OK);
    uint64_t got = 0;
    int rc = gddr_pull(obs, id, out, v, &got);
    ck_assert_msg(rc == GDDR_OK, "pull of '%s' at version %llu: %s (%s)", key, (unsigned long long)v,
                  gddr_strerror(rc), gddr_client_errmsg(obs));
    ck_assert_uint_ge(got, v);
    gddr_client_close(&obs);
    free(z);
}

static inline gddr_server_stats get_stats(gddr_client *c)
{
    gddr_server_stats st;
    memset(&st, 0xab, sizeof st);
    int rc = gddr_server_stats_get(c, &st);
    ck_assert_msg(rc == GDDR_OK, "gddr_server_stats_get: %s (%s)", gddr_strerror(rc),
                  gddr_client_errmsg(c));
    return st;
}

#endif
