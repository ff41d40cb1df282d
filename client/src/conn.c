/* conn.c -- the bottom of the connection to one gddr-ps: one DEALER socket
 * (and its monitor), the slots of the requests in flight, sending.
 *
 * Every request gets a ticket (its request id) and a slot here; the replies
 * fill the slots (conn_reply.c), the requests themselves and the reconnect
 * are conn_req.c's. Nothing here calls any other file of the folder.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_int.h"
#include "keys.h"

int gddr__set_err(gddr_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    gddr__logf(&c->log, GDDR_LOG_DEBUG, "%s: %s", gddr_strerror(rc), c->errmsg);
    return rc;
}

/* ---- ops table ------------------------------------------------------------ */

op *gddr__op(gddr_client *c, uint64_t ticket)
{
    for (size_t i = 0; i < c->nops; i++)
        if (c->ops[i].req_id == ticket)
            return &c->ops[i];
    return NULL;
}

op *gddr__op_new(gddr_client *c, op_kind kind, int tensor)
{
    op *o = gddr__op(c, 0);
    if (!o) {
        size_t n = c->nops ? c->nops * 2 : 16;
        op *p = realloc(c->ops, n * sizeof *p);
        if (!p)
            return NULL;
        memset(p + c->nops, 0, (n - c->nops) * sizeof *p);
        c->ops = p;
        o = &c->ops[c->nops];
        c->nops = n;
    }
    memset(o, 0, sizeof *o);
    o->req_id = ++c->next_req;
    o->kind = kind;
    o->tensor = tensor;
    return o;
}

/* Forgets every op in flight (after a reconnect their replies never come). */
void gddr__ops_fail_all(gddr_client *c, int rc)
{
    for (size_t i = 0; i < c->nops; i++)
        if (c->ops[i].req_id && !c->ops[i].done) {
            c->ops[i].done = 1;
            c->ops[i].rc = rc;
        }
}

/* ---- sending ---------------------------------------------------------------- */

/* ZeroMQ let go of a lent buffer (sent, or dropped with its socket). */
static void lent_done(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub((atomic_int *)hint, 1);
}

void gddr__lend(gddr_client *c, gddr__raw *raw)
{
    raw->free_fn = lent_done;
    raw->hint = &c->lent;
    atomic_fetch_add(&c->lent, 1);
}

void gddr__lent_wait(gddr_client *c)
{
    if (atomic_load(&c->lent) == 0)
        return;
    /* Sent and answered, the I/O thread is closing the message right now;
     * give it a moment before taking the socket away. */
    for (int i = 0; i < 200 && atomic_load(&c->lent) > 0; i++)
        usleep(50);
    if (atomic_load(&c->lent) > 0 && c->sock) {
        gddr__close_socket(c); /* LINGER 0: queued messages are dropped */
        c->epoch_changed = 1; /* the next call reconnects */
    }
    for (int i = 0; i < 100000 && atomic_load(&c->lent) > 0; i++)
        usleep(100);
    if (atomic_load(&c->lent) > 0)
        gddr__logf(&c->log, GDDR_LOG_ERROR, "ZeroMQ still holds %d lent buffers after 10 s",
                   atomic_load(&c->lent));
}

int gddr__send_msg(gddr_client *c, op *o, Gddr__Request *rq, const gddr__raw *raws, int nraw)
{
    rq->protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq->req_id = o->req_id;
    rq->rank = (uint32_t)c->info.rank;
    rq->observer = c->o.observer != 0;
    rq->session = c->session;
    if (!c->sock) {
        for (int i = 0; i < nraw; i++) /* nobody sends them: give them back */
            if (raws[i].free_fn)
                raws[i].free_fn((void *)raws[i].data, raws[i].hint);
        return gddr__set_err(c, GDDR_EIO, "no connection to %s (dropped after a failure)", c->server);
    }
    /* Events already waiting first: a connection that broke before this
     * request fails only the requests sent before it (gddr__mon_check). */
    int mrc = c->mon ? gddr__mon_check(c) : GDDR_OK;
    if (mrc != GDDR_OK) {
        for (int i = 0; i < nraw; i++)
            if (raws[i].free_fn)
                raws[i].free_fn((void *)raws[i].data, raws[i].hint);
        return mrc;
    }
    long n = gddr__send(c->sock, NULL, &rq->base, raws, nraw);
    if (n < 0 && errno == EAGAIN) {
        int rc = gddr__mon_check(c);
        if (rc != GDDR_OK)
            return rc;
        return gddr__set_err(c, GDDR_ETIMEDOUT,
                             "could not send to %s within %d ms: no connection (is gddr-ps running "
                             "there, and does it accept this client's security settings?)",
                             c->server, c->o.timeout_ms);
    }
    if (n < 0)
        return gddr__set_err(c, GDDR_EIO, "send to %s failed: %s", c->server, zmq_strerror(errno));
    if (o->kind == OP_PUSH)
        c->k.bytes_pushed += (uint64_t)n;
    else if (o->kind == OP_PULL || o->kind == OP_PULL_ROWS)
        c->k.bytes_pulled += (uint64_t)n;
    return GDDR_OK;
}

int gddr__send_req(gddr_client *c, Gddr__Request *rq, const gddr__raw *raws, int nraw,
                   op_kind kind, int tensor, uint64_t *ticket)
{
    op *o = gddr__op_new(c, kind, tensor);
    if (!o) {
        for (int i = 0; i < nraw; i++)
            if (raws[i].free_fn)
                raws[i].free_fn((void *)raws[i].data, raws[i].hint);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for a request");
    }
    int rc = gddr__send_msg(c, o, rq, raws, nraw);
    if (rc != GDDR_OK) {
        o->req_id = 0;
        return rc;
    }
    *ticket = o->req_id;
    return GDDR_OK;
}

/* ---- connection --------------------------------------------------------- */

/* Stops a socket's monitor before either is closed. libzmq's I/O thread
 * sends every event to the monitor's pair socket and blocks for good when
 * nobody is there to take it (libzmq issue 3575): a socket closed after
 * its monitor's reader -- or closed while it still sends events while it
 * tears down -- stalled the whole context, and every socket made later in
 * it never connected. That is how a worker saw "server ... did not come
 * back within 30000 ms" with its server back for seconds: the sharded
 * restart test (gddr-tests shard) hit it once in three runs when the
 * reconnect began the moment the connection broke. */
static void close_monitored(void *sock, void *mon)
{
    if (sock && mon)
        zmq_socket_monitor(sock, NULL, 0);
    if (sock)
        zmq_close(sock);
    if (mon)
        zmq_close(mon);
}

/* A DEALER connected to the server with this client's settings (CURVE keys
 * included); the main socket and the heartbeat socket are both made here. */
int gddr__socket_new(gddr_client *c, void **out, void **mon)
{
    void *sock = zmq_socket(c->zctx, ZMQ_DEALER);
    if (!sock)
        return gddr__set_err(c, GDDR_EIO, "zmq_socket: %s", zmq_strerror(errno));
    int zero = 0, ivl = 100, ivl_max = 2000, sndtimeo = c->o.timeout_ms;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    /* No send waits longer than a reply would (with no connection -- a
     * server down, or one refusing the handshake -- a DEALER's send blocks). */
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    zmq_setsockopt(sock, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(sock, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
    int rc = GDDR_OK;
    if (c->curve_server[0]) {
        char pub[GDDR_Z85_KEY], sec[GDDR_Z85_KEY], err[512];
        if (gddr__keyfile_read(c->curve_file, pub, sec, err, sizeof err) < 0) {
            rc = gddr__set_err(c, GDDR_ECONFIG, "curve_key_file: %s", err);
        } else if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->curve_server, 40) != 0 ||
                   zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, 40) != 0 ||
                   zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, 40) != 0) {
            rc = gddr__set_err(c, GDDR_ECONFIG, "CURVE keys refused by libzmq: %s", zmq_strerror(errno));
        }
        memset(sec, 0, sizeof sec);
    }
    void *m = NULL;
    if (rc == GDDR_OK && mon) {
        /* Watched before it connects, so that no handshake event is missed. */
        char addr[96];
        snprintf(addr, sizeof addr, "inproc://gddr-mon-%p-%u", (void *)c, ++c->mon_seq);
        int ev = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                 ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED;
        if (zmq_socket_monitor(sock, addr, ev) == 0 && (m = zmq_socket(c->zctx, ZMQ_PAIR)) != NULL) {
            zmq_setsockopt(m, ZMQ_LINGER, &zero, sizeof zero);
            if (zmq_connect(m, addr) != 0) {
                zmq_close(m);
                m = NULL;
            }
        }
    }
    if (rc == GDDR_OK && zmq_connect(sock, c->server) != 0)
        rc = gddr__set_err(c, GDDR_EINVAL, "cannot connect to '%s': %s", c->server,
                           zmq_strerror(errno));
    if (rc != GDDR_OK) {
        close_monitored(sock, m);
        return rc;
    }
    *out = sock;
    if (mon)
        *mon = m;
    return GDDR_OK;
}

void gddr__close_socket(gddr_client *c)
{
    close_monitored(c->sock, c->mon);
    c->sock = c->mon = NULL;
}

int gddr__open_socket(gddr_client *c)
{
    gddr__close_socket(c);
    c->mon_connected = c->mon_refused = c->mon_broken = 0;
    return gddr__socket_new(c, &c->sock, &c->mon);
}

/* Handshakes broken off in a row, with no reason given, taken as a refusal. */
#define HANDSHAKE_BREAKS 4

int gddr__mon_check(gddr_client *c)
{
    for (;;) {
        zmq_msg_t a, b;
        zmq_msg_init(&a);
        zmq_msg_init(&b);
        if (!c->mon || zmq_msg_recv(&a, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&a);
            zmq_msg_close(&b);
            return GDDR_OK;
        }
        zmq_msg_recv(&b, c->mon, ZMQ_DONTWAIT); /* the endpoint */
        uint16_t ev = 0;
        uint32_t val = 0;
        if (zmq_msg_size(&a) >= 6) {
            memcpy(&ev, zmq_msg_data(&a), 2);
            memcpy(&val, (const char *)zmq_msg_data(&a) + 2, 4);
        }
        zmq_msg_close(&a);
        zmq_msg_close(&b);
        if (ev == ZMQ_EVENT_CONNECTED)
            c->mon_connected = 1;
        if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            c->mon_broken = 0;
        if (ev == ZMQ_EVENT_DISCONNECTED && c->mon_connected) {
            /* The server went away (killed: the connection reset). The
             * requests it had are lost with the connection; failing them
             * now lets the caller reconnect and resend (exactly once)
             * as soon as a server is back, not timeout_ms later. The
             * replies that came before the break were read first (pump). */
            c->mon_connected = 0;
            size_t inflight = 0;
            for (size_t i = 0; i < c->nops; i++)
                inflight += c->ops[i].req_id && !c->ops[i].done;
            if (inflight) {
                /* As if they had timed out (no reply will come): the same
                 * code a caller gets for a server gone, only sooner. */
                gddr__ops_fail_all(c, GDDR_ETIMEDOUT);
                gddr__set_err(c, GDDR_ETIMEDOUT, "the connection to %s broke with %zu request(s) in "
                              "flight (the server went away?)", c->server, inflight);
            }
            gddr__logf(&c->log, GDDR_LOG_INFO, "the connection to %s broke", c->server);
        }
        if (ev == ZMQ_EVENT_CONNECT_RETRIED)
            c->mon_refused = 1;
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            return gddr__set_err(c, GDDR_EAUTH,
                                 "%s refused this client's CURVE key (ZAP status %u): add the public "
                                 "key of curve_key_file to the server's authorized_keys",
                                 c->server, val);
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            return gddr__set_err(c, GDDR_EAUTH,
                                 "%s speaks another security mechanism: %s", c->server,
                                 c->curve_server[0]
                                     ? "the server runs without CURVE; unset curve_server_key"
                                     : "CURVE is off here, and the server requires CURVE: set curve_server_key and curve_key_file");
        /* A handshake broken off without a reason (the connection reset
         * or timed out) is also what a server killed or stopped in the
         * middle of it looks like: ZeroMQ reconnects by itself, and the
         * next one goes through once the server is back. A wrong
         * curve_server_key breaks every one, so only a few in a row,
         * with no handshake succeeding between, are a refusal (measured
         * in the soak: a worker opening while a server was killed gave up
         * at once with "is curve_server_key the server's public key?"). */
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && ++c->mon_broken < HANDSHAKE_BREAKS) {
            gddr__logf(&c->log, GDDR_LOG_INFO,
                       "the security handshake with %s broke off (errno %u); trying again", c->server,
                       val);
            continue;
        }
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            return gddr__set_err(c, GDDR_EAUTH, "the security handshake with %s failed (%s 0x%x): %s",
                                 c->server,
                                 ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "protocol error" : "errno", val,
                                 c->curve_server[0]
                                     ? "is curve_server_key the server's public key?"
                                     : "CURVE is off here, and the server likely requires CURVE: set "
                                       "curve_server_key and curve_key_file");
    }
}
