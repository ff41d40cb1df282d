/* client.c -- the libgddr-client connection: one DEALER socket to one
 * gddr-ps, requests tagged with ids, replies matched to them.
 *
 * Every request gets a ticket (its request id). gddr_wait() reads replies
 * off the socket, completing whichever op each answers, until the one it
 * waits for is done or its time is up; an unanswered wait returns
 * GDDR_ETIMEDOUT and never hangs. A reply carrying a new server epoch (a
 * restart) or a wait that times out marks the connection for a reconnect,
 * which gddr_step() performs by itself (re-hello, re-register, retry).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "blas.h"
#include "client_int.h"
#include "gddr_hash.h"
#include "keys.h"
#include "view.h"

int gddr__set_err(gddr_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    gddr__logf(&c->log, GDDR_LOG_DEBUG, "%s: %s", gddr_strerror(rc), c->errmsg);
    return rc;
}

const char *gddr_client_errmsg(const gddr_client *c)
{
    return c ? c->errmsg : "no client";
}

/* ---- ops table ------------------------------------------------------------ */

op *gddr__op(gddr_client *c, uint64_t ticket)
{
    for (size_t i = 0; i < c->nops; i++)
        if (c->ops[i].req_id == ticket)
            return &c->ops[i];
    return NULL;
}

static op *op_new(gddr_client *c, op_kind kind, int tensor)
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
static void ops_fail_all(gddr_client *c, int rc)
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

void gddr__lent_wait(gddr_client *c)
{
    if (atomic_load(&c->lent) == 0)
        return;
    /* Sent and answered, the I/O thread is closing the message right now;
     * give it a moment before taking the socket away. */
    for (int i = 0; i < 200 && atomic_load(&c->lent) > 0; i++)
        usleep(50);
    if (atomic_load(&c->lent) > 0 && c->sock) {
        zmq_close(c->sock); /* LINGER 0: queued messages are dropped */
        c->sock = NULL;
        c->epoch_changed = 1; /* the next call reconnects */
    }
    for (int i = 0; i < 100000 && atomic_load(&c->lent) > 0; i++)
        usleep(100);
    if (atomic_load(&c->lent) > 0)
        gddr__logf(&c->log, GDDR_LOG_ERROR, "ZeroMQ still holds %d lent buffers after 10 s",
                   atomic_load(&c->lent));
}

/* Sends one message of op o (a push in parts sends several under one op). */
static int send_msg(gddr_client *c, op *o, Gddr__Request *rq, const gddr__raw *raws, int nraw)
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
    else if (o->kind == OP_PULL)
        c->k.bytes_pulled += (uint64_t)n;
    return GDDR_OK;
}

int gddr__send_req(gddr_client *c, Gddr__Request *rq, const gddr__raw *raws, int nraw,
                   op_kind kind, int tensor, uint64_t *ticket)
{
    op *o = op_new(c, kind, tensor);
    if (!o) {
        for (int i = 0; i < nraw; i++)
            if (raws[i].free_fn)
                raws[i].free_fn((void *)raws[i].data, raws[i].hint);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for a request");
    }
    int rc = send_msg(c, o, rq, raws, nraw);
    if (rc != GDDR_OK) {
        o->req_id = 0;
        return rc;
    }
    *ticket = o->req_id;
    return GDDR_OK;
}

/* ---- receiving -------------------------------------------------------------- */

static void msgs_close(zmq_msg_t *m, uint32_t *n)
{
    for (uint32_t k = 0; k < *n; k++)
        zmq_msg_close(&m[k]);
    *n = 0;
}

/* Keeps a reply frame in a growing array (moved: f's part becomes empty). */
static int msgs_keep(zmq_msg_t **m, uint32_t *n, uint32_t *cap, zmq_msg_t *frame)
{
    if (*n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 1;
        zmq_msg_t *nm = realloc(*m, nc * sizeof *nm);
        if (!nm)
            return -1;
        *m = nm;
        *cap = nc;
    }
    zmq_msg_init(&(*m)[*n]);
    zmq_msg_move(&(*m)[*n], frame);
    (*n)++;
    return 0;
}

const float *gddr__last(ctensor *t)
{
    if (t->last)
        return t->last;
    float *v = malloc(t->n * 4);
    if (!v)
        return NULL;
    size_t o = 0;
    for (uint32_t k = 0; k < t->nlast; k++) {
        size_t b = zmq_msg_size(&t->last_msgs[k]);
        memcpy((char *)v + o, zmq_msg_data(&t->last_msgs[k]), b);
        o += b;
    }
    msgs_close(t->last_msgs, &t->nlast);
    free(t->last_own);
    t->last_own = v;
    t->last = v;
    return v;
}

/* A pull reply (whole, or one part): copies the values into the caller's
 * buffer and, for a tracked pull, keeps the frames as the tensor's last
 * values. Returns 0 while parts are still to come. */
/* The tensor's last values in a buffer of the library's (the view lazy
 * replies update); NULL when out of memory. */
static float *view_own(ctensor *t)
{
    if (t->last && t->last == t->last_own)
        return t->last_own;
    const float *from = gddr__last(t); /* joins parts into last_own */
    if (!from)
        return NULL;
    if (from != t->last_own) {
        float *v = malloc(t->n * 4);
        if (!v)
            return NULL;
        memcpy(v, from, t->n * 4);
        free(t->last_own);
        t->last_own = v;
    }
    msgs_close(t->last_msgs, &t->nlast);
    t->last = t->last_own;
    return t->last_own;
}

/* A lazy or delta pull reply (bitmap set): the chunks sent go into the view
 * (as values, or as differences with a scale each), the whole view into the
 * caller's buffer; the view's version is its oldest chunk's. */
static void lazy_reply(gddr_client *c, op *o, const Gddr__PullReply *pr, gddr__frames *f)
{
    ctensor *t = &c->t[o->tensor];
    size_t chunk = c->info.chunk > 0 ? (size_t)c->info.chunk : 0;
    size_t bytes = f->n == 2 ? gddr__frame_size(f, 1) : 0;
    const int bits = (int)pr->delta_bits;
    int ok = f->n == 2 && pr->payload_bytes == bytes &&
             gddr__view_check(t->n, chunk, pr->bitmap.data, pr->bitmap.len, bits, bytes) == 0;
    float *view = ok && o->track ? view_own(t) : NULL;
    if (!view) {
        o->rc = gddr__set_err(c, GDDR_ELENGTH,
                              "%s pull reply for '%s': %zu bytes for its bitmap of %zu bytes",
                              bits ? "delta" : "lazy", t->key, bytes, pr->bitmap.len);
        t->view_dirty = 1;
        return;
    }
    /* The decoder of server/conn.c's encoder (common/view.c). */
    gddr__view_apply(view, t->n, chunk, pr->bitmap.data, bits, gddr__frame_data(f, 1));
    memcpy(o->out, view, t->n * 4);
    o->version = pr->version;   /* the server's, for the step's wait */
    t->version = pr->view_version; /* what gradients computed on the view are tagged with */
    t->view_dirty = 0;
    t->view_seq = pr->view_seq;
    c->k.pulls++;
    c->k.bytes_pulled += f->bytes;
}

static int pull_reply(gddr_client *c, op *o, const Gddr__PullReply *pr, gddr__frames *f)
{
    ctensor *t = &c->t[o->tensor];
    if (pr->bitmap.len) {
        lazy_reply(c, o, pr, f);
        return 1;
    }
    size_t bytes = f->n == 2 ? gddr__frame_size(f, 1) : 0;
    uint32_t parts = pr->parts > 1 ? pr->parts : 1;
    size_t lo = parts > 1 ? pr->offset : 0;
    int first = o->parts_got == 0;
    if (f->n != 2 || pr->payload_bytes != bytes || bytes % 4 || lo > t->n || bytes / 4 > t->n - lo ||
        (parts == 1 && bytes != t->n * 4) || pr->part != o->parts_got ||
        (!first && (parts != o->parts || pr->version != o->version)) ||
        (pr->part + 1 == parts && lo + bytes / 4 != t->n)) {
        o->rc = gddr__set_err(c, GDDR_ELENGTH,
                              "pull reply for '%s': part %u of %u holds %zu bytes at value %zu "
                              "(the tensor has %zu values)",
                              t->key, pr->part, parts, bytes, lo, t->n);
        msgs_close(t->pend_msgs, &t->npend);
        return 1;
    }
    o->parts = parts;
    o->version = pr->version;
    memcpy(o->out + lo, gddr__frame_data(f, 1), bytes); /* the one copy */
    c->k.bytes_pulled += f->bytes;
    if (o->track && msgs_keep(&t->pend_msgs, &t->npend, &t->cap_pend, &f->part[1]) < 0) {
        o->rc = gddr__set_err(c, GDDR_ENOMEM, "no memory to keep a pull reply");
        msgs_close(t->pend_msgs, &t->npend);
        return 1;
    }
    if (++o->parts_got < parts)
        return 0;
    if (o->track) {
        /* The frames themselves become the tensor's last values. */
        msgs_close(t->last_msgs, &t->nlast);
        zmq_msg_t *m = t->last_msgs;
        uint32_t cap = t->cap_last;
        t->last_msgs = t->pend_msgs, t->nlast = t->npend, t->cap_last = t->cap_pend;
        t->pend_msgs = m, t->npend = 0, t->cap_pend = cap;
        t->last = t->nlast == 1 ? zmq_msg_data(&t->last_msgs[0]) : NULL;
        free(t->last_own);
        t->last_own = NULL;
        t->version = o->version;
        /* The server's copy of a delta view does not know of this whole
         * reply: the next delta pull must be full (exact), or the two
         * would differ from here on. */
        t->view_dirty = c->o.pull_delta_bits != 0;
        t->view_seq = 0;
    }
    c->k.pulls++;
    return 1;
}

static void complete(gddr_client *c, gddr__frames *f)
{
    Gddr__Reply *r = gddr__reply__unpack(NULL, gddr__frame_size(f, 0), gddr__frame_data(f, 0));
    if (!r) {
        gddr__logf(&c->log, GDDR_LOG_WARN, "dropped a reply that is not a gddr.Reply");
        return;
    }
    if (c->info.epoch && r->epoch != c->info.epoch) {
        if (!c->epoch_changed)
            gddr__logf(&c->log, GDDR_LOG_WARN, "server epoch changed (%016llx -> %016llx): it restarted",
                       (unsigned long long)c->info.epoch, (unsigned long long)r->epoch);
        c->epoch_changed = 1;
    }
    if (r->body_case == GDDR__REPLY__BODY_ORPHAN) {
        gddr__orphan_received(c, r->orphan, f);
        gddr__reply__free_unpacked(r, NULL);
        return;
    }
    op *o = r->req_id ? gddr__op(c, r->req_id) : NULL;
    if (!o || o->done) {
        /* A late reply to a request we gave up on, or an error the server
         * could not tie to a request: nothing waits for it. */
        if (r->body_case == GDDR__REPLY__BODY_ERROR)
            gddr__logf(&c->log, GDDR_LOG_WARN, "server error without a waiting request: %s",
                       r->error->message);
        gddr__reply__free_unpacked(r, NULL);
        return;
    }
    o->done = 1;
    o->answered = 1;
    o->rc = GDDR_OK;
    /* Only a tensor's own reply says its tau (an error reply carries the
     * server default, which is not this tensor's). */
    if (o->tensor >= 0 && o->tensor < c->nt &&
        (r->body_case == GDDR__REPLY__BODY_PUSH || r->body_case == GDDR__REPLY__BODY_PULL))
        c->t[o->tensor].tau = (int)r->tau;
    switch (r->body_case) {
    case GDDR__REPLY__BODY_ERROR:
        o->rc = r->error->code ? (int)r->error->code : GDDR_EPROTO;
        o->retry_ms = r->error->retry_ms;
        gddr__set_err(c, o->rc, "server: %s", r->error->message);
        break;
    case GDDR__REPLY__BODY_HELLO:
        if (o->kind != OP_HELLO)
            goto unexpected;
        c->info.epoch = r->epoch;
        c->info.mode = r->hello->mode;
        c->info.chunk = (int)r->hello->chunk;
        c->info.tau = (int)r->hello->tau;
        c->info.workers = (int)r->hello->workers;
        break;
    case GDDR__REPLY__BODY_INIT:
        if (o->kind != OP_INIT)
            goto unexpected;
        o->sid = r->init->id;
        o->version = r->init->version;
        o->created = r->init->created;
        memset(&o->opt, 0, sizeof o->opt);
        if (r->init->optimizer) {
            const Gddr__Optimizer *so = r->init->optimizer;
            o->opt = (gddr__optim){ 1, (int)so->kind, so->lr, so->momentum, so->beta1, so->beta2,
                                    so->eps, so->weight_decay };
        }
        break;
    case GDDR__REPLY__BODY_PULL:
        if (o->kind != OP_PULL)
            goto unexpected;
        if (!pull_reply(c, o, r->pull, f))
            o->done = o->answered = 0; /* more parts to come */
        break;
    case GDDR__REPLY__BODY_PUSH:
        if (o->kind != OP_PUSH)
            goto unexpected;
        o->version = r->push->version;
        o->applied = r->push->applied;
        o->sync_target = r->push->sync_target;
        o->staleness = r->push->staleness;
        o->mode = r->push->mode;
        o->duplicate = r->push->duplicate;
        c->info.mode = r->push->mode;
        c->k.pushes++;
        break;
    case GDDR__REPLY__BODY_STATS:
        if (o->kind != OP_STATS)
            goto unexpected;
        if (o->stats) {
            gddr_server_stats *s = o->stats;
            memset(s, 0, sizeof *s);
            s->pushes = r->stats->pushes;
            s->pulls = r->stats->pulls;
            s->rejected = r->stats->rejected;
            s->versions_total = r->stats->versions_total;
            s->staleness_mean = r->stats->staleness_mean;
            s->staleness_ema = r->stats->staleness_ema;
            s->staleness_max = r->stats->staleness_max;
            for (size_t i = 0; i < r->stats->n_staleness_hist && i < 17; i++)
                s->staleness_hist[i] = r->stats->staleness_hist[i];
            s->worker_staleness_mean = r->stats->worker_staleness_mean;
            s->worker_pushes = r->stats->worker_pushes;
            s->tau = (int)r->tau;
            s->live_workers = (int)r->stats->live_workers;
            s->mode = c->info.mode;
            s->epoch = r->epoch;
        }
        break;
    case GDDR__REPLY__BODY_ACK:
        break;
    default:
    unexpected:
        o->rc = gddr__set_err(c, GDDR_EPROTO, "unexpected reply type %d", r->body_case);
    }
    gddr__reply__free_unpacked(r, NULL);
}

/* Reads replies until `ticket` is done or the deadline passes. */
static int pump(gddr_client *c, uint64_t ticket, int64_t deadline)
{
    for (;;) {
        op *o = gddr__op(c, ticket);
        if (!o)
            return GDDR_ENOTICKET;
        if (o->done)
            return GDDR_OK;
        int64_t left = deadline - gddr__now_ms();
        if (left < 0)
            return GDDR_ETIMEDOUT;
        zmq_pollitem_t it[2] = { { c->sock, 0, ZMQ_POLLIN, 0 }, { c->mon, 0, ZMQ_POLLIN, 0 } };
        int rc = zmq_poll(it, c->mon ? 2 : 1, (long)left);
        if (rc < 0 && errno != EINTR)
            return gddr__set_err(c, GDDR_EIO, "poll: %s", zmq_strerror(errno));
        if (rc > 0 && c->mon && (it[1].revents & ZMQ_POLLIN) && gddr__mon_check(c) != GDDR_OK)
            return GDDR_EAUTH;
        if (rc <= 0 || !(it[0].revents & ZMQ_POLLIN))
            continue;
        gddr__frames f;
        while (gddr__frames_recv(c->sock, &f, ZMQ_DONTWAIT) >= 0) {
            if (f.n >= 1)
                complete(c, &f);
            gddr__frames_close(&f);
        }
    }
}

int gddr__wait_op(gddr_client *c, uint64_t ticket, int timeout_ms, op *result)
{
    if (timeout_ms < 0)
        timeout_ms = c->o.timeout_ms;
    int rc = pump(c, ticket, gddr__now_ms() + timeout_ms);
    op *o = gddr__op(c, ticket);
    if (rc == GDDR_ENOTICKET)
        return gddr__set_err(c, rc, "ticket %llu is unknown or already collected",
                             (unsigned long long)ticket);
    if (rc == GDDR_ETIMEDOUT) {
        o->req_id = 0; /* a late reply will be dropped */
        return gddr__set_err(c, GDDR_ETIMEDOUT, "no reply from %s within %d ms", c->server,
                             timeout_ms);
    }
    if (rc != GDDR_OK) {
        o->req_id = 0;
        return rc;
    }
    if (result)
        *result = *o;
    rc = o->rc;
    o->req_id = 0;
    return rc;
}

int gddr_wait(gddr_client *c, gddr_ticket ticket, int timeout_ms, uint64_t *version)
{
    if (!c)
        return GDDR_EINVAL;
    if (c->shards)
        return gddr__shards_wait(c, ticket, timeout_ms, version);
    op r;
    int rc = gddr__wait_op(c, ticket, timeout_ms, &r);
    if (rc == GDDR_OK && version)
        *version = r.version;
    return rc;
}

/* ---- connection --------------------------------------------------------- */

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
                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED;
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
        if (m)
            zmq_close(m);
        zmq_close(sock);
        return rc;
    }
    *out = sock;
    if (mon)
        *mon = m;
    return GDDR_OK;
}

static int open_socket(gddr_client *c)
{
    if (c->sock)
        zmq_close(c->sock);
    if (c->mon)
        zmq_close(c->mon);
    c->sock = c->mon = NULL;
    c->mon_connected = c->mon_refused = 0;
    return gddr__socket_new(c, &c->sock, &c->mon);
}

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

/* Says hello; *retry_ms (may be NULL) gets the server's hint when it
 * refused for now (the rank is still held by a worker it thinks alive). */
static int hello(gddr_client *c, int timeout_ms, uint32_t *retry_ms)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Hello h = GDDR__HELLO__INIT;
    h.world_size = (uint32_t)c->o.world_size;
    h.client = "libgddr-client/" GDDR_VERSION;
    /* One server of a sharded client's list says where it sits (the
     * server refuses a list in another order with E_CONFIG); a plain
     * client says nothing (count 0). */
    h.shard_index = (uint32_t)c->shard_index;
    h.shard_count = (uint32_t)c->shard_count;
    rq.body_case = GDDR__REQUEST__BODY_HELLO;
    rq.hello = &h;
    uint64_t tk;
    op res;
    memset(&res, 0, sizeof res);
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_HELLO, -1, &tk);
    if (rc == GDDR_OK)
        rc = gddr__wait_op(c, tk, timeout_ms, &res);
    if (retry_ms)
        *retry_ms = rc == GDDR_OK ? 0 : res.retry_ms;
    return rc;
}

/* Whether a refused or unanswered hello may succeed later. */
static int hello_retryable(int rc, uint32_t retry_ms)
{
    return rc == GDDR_ETIMEDOUT || rc == GDDR_EIO || retry_ms > 0;
}

static int register_one(gddr_client *c, int i, const float *vals, int timeout_ms, op *res)
{
    ctensor *t = &c->t[i];
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__InitTensor in = GDDR__INIT_TENSOR__INIT;
    in.key = t->key;
    in.n = t->n;
    in.payload_bytes = t->n * 4;
    Gddr__Optimizer oz = GDDR__OPTIMIZER__INIT;
    if (t->opt.set) {
        oz.kind = (Gddr__OptimizerKind)t->opt.kind;
        oz.lr = t->opt.lr;
        oz.momentum = t->opt.momentum;
        oz.beta1 = t->opt.beta1;
        oz.beta2 = t->opt.beta2;
        oz.eps = t->opt.eps;
        oz.weight_decay = t->opt.weight_decay;
        in.optimizer = &oz;
    }
    rq.body_case = GDDR__REQUEST__BODY_INIT;
    rq.init = &in;
    gddr__raw raw = { vals, t->n * 4, NULL, NULL };
    uint64_t tk;
    int rc = gddr__send_req(c, &rq, &raw, 1, OP_INIT, i, &tk);
    if (rc == GDDR_OK)
        rc = gddr__wait_op(c, tk, timeout_ms, res);
    return rc;
}

/* How long a lost server is retried: reconnect_timeout_ms, but while
 * closing only until the close's deadline, timeout_ms from its start (the
 * flush is worth one more try, not the wait for a restart: a close must
 * not hang on a dead server). */
static int retry_window_ms(const gddr_client *c)
{
    if (!c->closing)
        return c->o.reconnect_timeout_ms;
    int64_t left = c->close_deadline - gddr__now_ms();
    return left > 0 ? (int)left : 0;
}

/* After a restart or a lost server: a fresh socket, hello and every tensor
 * registered again (a server restored from a checkpoint answers with the
 * saved version; an empty one takes our last pulled values), retried with
 * exponential backoff for up to reconnect_timeout_ms. */
int gddr__reconnect(gddr_client *c)
{
    int64_t deadline = gddr__now_ms() + retry_window_ms(c);
    int backoff = 100, rc = GDDR_ETIMEDOUT;
    ops_fail_all(c, GDDR_ETIMEDOUT);
    c->k.reconnects++;
    for (int i = 0; i < c->nt; i++)
        c->t[i].view_dirty = 1; /* a lazy reply may be lost: the next pull is full */
    gddr__logf(&c->log, GDDR_LOG_WARN, "reconnecting to %s", c->server);
    while (gddr__now_ms() < deadline) {
        int left = (int)(deadline - gddr__now_ms());
        int try_ms = c->o.timeout_ms < left ? c->o.timeout_ms : left;
        if ((rc = open_socket(c)) != GDDR_OK)
            return rc;
        c->info.epoch = 0;
        c->epoch_changed = 0;
        uint32_t retry_ms = 0;
        rc = hello(c, try_ms, &retry_ms);
        for (int i = 0; rc == GDDR_OK && i < c->nt; i++) {
            op res;
            const float *last = gddr__last(&c->t[i]);
            rc = last ? register_one(c, i, last, try_ms, &res)
                      : gddr__set_err(c, GDDR_ENOMEM, "no memory to register '%s' again", c->t[i].key);
            if (rc == GDDR_OK) {
                c->t[i].sid = res.sid;
                c->t[i].srv_opt = res.opt;
                if (res.version < c->t[i].version)
                    gddr__logf(&c->log, GDDR_LOG_WARN,
                               "tensor '%s' is back at version %llu (we had %llu): updates after the server's last checkpoint were lost",
                               c->t[i].key, (unsigned long long)res.version,
                               (unsigned long long)c->t[i].version);
                c->t[i].version = res.version;
            }
        }
        if (rc == GDDR_OK) {
            gddr__logf(&c->log, GDDR_LOG_INFO, "reconnected to %s (epoch %016llx)", c->server,
                       (unsigned long long)c->info.epoch);
            return GDDR_OK;
        }
        if (!hello_retryable(rc, retry_ms) && rc != GDDR_ETIMEDOUT && rc != GDDR_EIO)
            return rc; /* the server answered and refused: retrying won't help */
        if (retry_ms > (uint32_t)backoff)
            backoff = retry_ms > 5000 ? 5000 : (int)retry_ms;
        int nap = backoff < (int)(deadline - gddr__now_ms()) ? backoff : 0;
        if (nap > 0)
            usleep((useconds_t)nap * 1000);
        backoff = backoff * 2 > 5000 ? 5000 : backoff * 2;
    }
    return gddr__set_err(c, GDDR_ETIMEDOUT, "server %s did not come back within %d ms", c->server,
                         retry_window_ms(c));
}

int gddr_client_open(const gddr_client_opts *opts, gddr_client **out)
{
    if (!opts || !out || !opts->server || !opts->server[0])
        return GDDR_EINVAL;
    if (gddr__server_count(opts->server) > 1)
        return gddr__shards_open(opts, out, NULL, 0);
    return gddr__client_open_shard(opts, 0, 0, out, NULL, 0);
}

int gddr__client_open_shard(const gddr_client_opts *opts, int shard_index, int shard_count,
                            gddr_client **out, char *err, size_t errlen)
{
    if (!opts || !out || !opts->server || !opts->server[0])
        return GDDR_EINVAL;
    if (opts->timeout_ms <= 0 || opts->delay_fraction < 0 || opts->delay_fraction >= 1 ||
        !(opts->pull_delay_fraction >= 0 && opts->pull_delay_fraction < 1) ||
        (opts->pull_delta_bits != 0 && opts->pull_delta_bits != 8 && opts->pull_delta_bits != 16) ||
        opts->dc_lambda < 0 || opts->clip_norm < 0 || opts->replay_decay <= 0 ||
        opts->replay_decay > 1 || opts->dc_ms_decay < 0 || opts->dc_ms_decay >= 1)
        return GDDR_EINVAL;
    *out = NULL;
    gddr_client *c = calloc(1, sizeof *c);
    if (!c)
        return GDDR_ENOMEM;
    c->o = *opts;
    snprintf(c->server, sizeof c->server, "%s", opts->server);
    c->o.server = c->server;
    c->shard_index = shard_index;
    c->shard_count = shard_count;
    if (opts->curve_server_key && opts->curve_server_key[0]) {
        if (strlen(opts->curve_server_key) != 40 || !opts->curve_key_file) {
            free(c);
            return GDDR_ECONFIG;
        }
        snprintf(c->curve_server, sizeof c->curve_server, "%s", opts->curve_server_key);
        snprintf(c->curve_file, sizeof c->curve_file, "%s", opts->curve_key_file);
    }
    c->o.curve_server_key = c->curve_server;
    c->o.curve_key_file = c->curve_file;
    c->log.fn = opts->log;
    c->log.user = opts->log_user;
    c->log.level = opts->log_level;
    c->info.rank = opts->rank >= 0 ? opts->rank : gddr__env_rank();
    if (c->o.world_size <= 0)
        c->o.world_size = gddr__env_world();
    if (c->info.rank < 0 || c->info.rank >= 65536 || c->o.world_size < 1 ||
        (!c->o.observer && c->info.rank >= c->o.world_size)) {
        free(c);
        return GDDR_EWORKER;
    }
    /* The session: random, never 0, top bit clear (the server's stand-ins
     * for session-less connections have it set). */
    while (!c->session) {
        if (getrandom(&c->session, sizeof c->session, 0) != (ssize_t)sizeof c->session)
            c->session = (uint64_t)gddr__now_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
        c->session &= ~(1ull << 63);
    }
    c->zctx = zmq_ctx_new();
    int rc = open_socket(c);
    /* A cluster starts in any order: a server not up yet (or a rank still
     * held by this worker's previous, dying process) is waited for, up to
     * connect_timeout_ms (by default reconnect_timeout_ms, as a running
     * step would). */
    int wait_ms = c->o.connect_timeout_ms >= 0 ? c->o.connect_timeout_ms : c->o.reconnect_timeout_ms;
    int64_t deadline = gddr__now_ms() + wait_ms;
    int backoff = 100, said = 0;
    while (rc == GDDR_OK) {
        int64_t left = deadline - gddr__now_ms();
        uint32_t retry_ms = 0;
        rc = hello(c, left > 0 && left < c->o.timeout_ms ? (int)left : c->o.timeout_ms, &retry_ms);
        if (rc == GDDR_OK || !hello_retryable(rc, retry_ms) || gddr__now_ms() >= deadline)
            break;
        if (!said++)
            gddr__logf(&c->log, GDDR_LOG_WARN, "%s: %s; retrying for up to %d ms", c->server,
                       c->errmsg, wait_ms);
        int nap = retry_ms > (uint32_t)backoff ? (int)retry_ms : backoff;
        left = deadline - gddr__now_ms();
        usleep((useconds_t)(nap < left ? nap : left > 0 ? left : 0) * 1000);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
        rc = GDDR_OK;
    }
    if (rc == GDDR_ETIMEDOUT) {
        /* Say which: nothing there, nothing reachable, or no answer. */
        gddr__mon_check(c);
        if (!c->mon_connected && c->mon_refused)
            gddr__set_err(c, rc, "nothing accepts connections at %s (refused for %d ms): is gddr-ps "
                          "running there, on that port?", c->server, wait_ms);
        else if (!c->mon_connected)
            gddr__set_err(c, rc, "could not reach %s within %d ms (no connection made: host down, "
                          "or a firewall?)", c->server, wait_ms);
        else
            gddr__set_err(c, rc, "%s accepted the connection but did not answer a hello within %d ms "
                          "(timeout_ms %d): is it a gddr-ps, and is it stopped or overloaded?",
                          c->server, wait_ms, c->o.timeout_ms);
    }
    if (rc != GDDR_OK) {
        gddr__logf(&c->log, GDDR_LOG_ERROR, "cannot open a session with %s: %s", c->server,
                   c->errmsg);
        if (err && errlen)
            snprintf(err, errlen, "%s", c->errmsg);
        gddr_client_close(&c);
        return rc;
    }
    gddr__logf(&c->log, GDDR_LOG_INFO, "rank %d connected to %s (mode %d, chunk %d)",
               c->info.rank, c->server, c->info.mode, c->info.chunk);
    if (!c->o.observer && c->o.heartbeat_ms > 0 && (rc = gddr__heartbeat_start(c)) != GDDR_OK) {
        gddr_client_close(&c);
        return rc;
    }
    *out = c;
    return GDDR_OK;
}

void gddr_client_close(gddr_client **cp)
{
    if (!cp || !*cp)
        return;
    gddr_client *c = *cp;
    if (c->shards) {
        gddr__shards_close(c);
        free(c);
        *cp = NULL;
        return;
    }
    gddr__pipeline_stop(c);
    /* Before the bye: a heartbeat after it would bring the worker back. */
    gddr__heartbeat_stop(c);
    /* The whole close is bounded by timeout_ms: the flush gets one more
     * try, not the wait for a restart. */
    c->closing = 1;
    c->close_deadline = gddr__now_ms() + c->o.timeout_ms;
    /* (No socket: one was dropped after a failure; the flush reconnects.) */
    int gone = 0;
    if (c->info.epoch && !c->o.observer) {
        int rc = c->o.delay_fraction > 0 ? gddr__residual_flush(c) : GDDR_OK;
        if (rc != GDDR_OK)
            gddr__logf(&c->log, GDDR_LOG_WARN, "could not flush the residual on close: %s", c->errmsg);
        gone = rc == GDDR_ETIMEDOUT || rc == GDDR_EIO; /* no bye to wait for then */
    }
    if (c->info.epoch && !c->o.observer && !gone) {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Bye bye = GDDR__BYE__INIT;
        rq.body_case = GDDR__REQUEST__BODY_BYE;
        rq.bye = &bye;
        uint64_t tk;
        if (gddr__send_req(c, &rq, NULL, 0, OP_ACK, -1, &tk) == GDDR_OK)
            gddr__wait_op(c, tk, c->o.timeout_ms < 1000 ? c->o.timeout_ms : 1000, NULL);
    }
    if (c->sock)
        zmq_close(c->sock);
    if (c->mon)
        zmq_close(c->mon);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    for (int i = 0; i < c->nt; i++) {
        free(c->t[i].last_own);
        msgs_close(c->t[i].last_msgs, &c->t[i].nlast);
        msgs_close(c->t[i].pend_msgs, &c->t[i].npend);
        free(c->t[i].last_msgs);
        free(c->t[i].pend_msgs);
        free(c->t[i].g);
        free(c->t[i].wnew);
        free(c->t[i].ms);
        gddr__step_free(&c->t[i]);
    }
    free(c->t);
    free(c->ops);
    free(c->acc_birth);
    free(c);
    *cp = NULL;
}

int gddr_client_info(gddr_client *c, gddr_server_info *out)
{
    if (!c || !out)
        return GDDR_EINVAL;
    *out = c->info;
    out->world_size = c->o.world_size;
    return GDDR_OK;
}

int gddr_client_counters_get(const gddr_client *c, gddr_client_counters *out)
{
    if (!c || !out)
        return GDDR_EINVAL;
    if (c->shards) {
        gddr__shards_counters(c, out);
        return GDDR_OK;
    }
    *out = c->k;
    return GDDR_OK;
}

uint64_t gddr_next_step(gddr_client *c)
{
    if (c->shards)
        return gddr__shards_next_step(c);
    return ++c->step;
}

/* ---- tensors ---------------------------------------------------------------- */

int gddr__needs_reconnect(gddr_client *c, int rc)
{
    return c->epoch_changed || rc == GDDR_ETIMEDOUT || rc == GDDR_EIO || rc == GDDR_ENOKEY ||
           rc == GDDR_EVERSION || rc == GDDR_ENOTICKET;
}

/* Runs call(c, arg) again after a reconnect while the server is away,
 * within reconnect_timeout_ms: what a restarting cluster needs from every
 * blocking call, not only from gddr_step. */
static int with_reconnect(gddr_client *c, int (*call)(gddr_client *, void *), void *arg)
{
    int64_t give_up = gddr__now_ms() + retry_window_ms(c);
    for (;;) {
        int rc = call(c, arg);
        if (rc == GDDR_OK || !gddr__needs_reconnect(c, rc) || gddr__now_ms() > give_up)
            return rc;
        int r2 = gddr__reconnect(c);
        if (r2 != GDDR_OK)
            return r2;
    }
}

struct register_call {
    int index;
    const float *init;
    op res;
};

static int register_call(gddr_client *c, void *arg)
{
    struct register_call *a = arg;
    return register_one(c, a->index, a->init, c->o.timeout_ms, &a->res);
}

int gddr_register_opt(gddr_client *c, const char *key, const float *init, size_t n,
                      const char *optimizer, int *id, uint64_t *version)
{
    if (!c || !key || !init || n == 0 || !id || strlen(key) >= 128)
        return c ? gddr__set_err(c, GDDR_EINVAL, "register: bad arguments") : GDDR_EINVAL;
    gddr__optim opt;
    char err[256];
    if (gddr__optim_parse(optimizer, &opt, err, sizeof err) < 0)
        return gddr__set_err(c, GDDR_EINVAL, "register '%s': %s", key, err);
    if (c->shards)
        return gddr__shards_register(c, key, init, n, &opt, id, version);
    return gddr__register_piece(c, key, init, n, gddr_key_hash(key), 0, &opt, id, version);
}

int gddr_register(gddr_client *c, const char *key, const float *init, size_t n, int *id,
                  uint64_t *version)
{
    return gddr_register_opt(c, key, init, n, NULL, id, version);
}

int gddr_set_lr(gddr_client *c, double lr)
{
    if (!c || !isfinite(lr) || lr < 0 || lr > 1e6)
        return c ? gddr__set_err(c, GDDR_EINVAL, "set_lr: %g is not in [0, 1e6]", lr) : GDDR_EINVAL;
    atomic_store(&c->lr, lr);
    if (c->shards)
        gddr__shards_set_lr(c, lr);
    return GDDR_OK;
}

int gddr_tensor_optimizer(gddr_client *c, int id, char *buf, size_t len)
{
    if (!c || !buf || len == 0)
        return GDDR_EINVAL;
    if (c->shards)
        return gddr__shards_optimizer(c, id, buf, len);
    if (id < 0 || id >= c->nt)
        return gddr__set_err(c, GDDR_EINVAL, "no tensor id %d", id);
    gddr__optim_format(&c->t[id].srv_opt, buf, len);
    return GDDR_OK;
}

int gddr__register_piece(gddr_client *c, const char *key, const float *init, size_t n,
                         uint32_t keyhash, uint32_t chunk0, const gddr__optim *opt, int *id,
                         uint64_t *version)
{
    if (c->pipe)
        return gddr__set_err(c, GDDR_ESTATE, "register: the step pipeline is running");
    if (c->acc_calls)
        return gddr__set_err(c, GDDR_ESTATE, "register: %d accumulated gradients are not pushed yet",
                             c->acc_calls);
    free(c->acc_birth); /* sized by the tensor count: made again at the next step */
    c->acc_birth = NULL;
    for (int i = 0; i < c->nt; i++)
        if (strcmp(c->t[i].key, key) == 0)
            return gddr__set_err(c, GDDR_EINVAL, "tensor '%s' is already registered as id %d", key, i);
    ctensor *arr = realloc(c->t, (size_t)(c->nt + 1) * sizeof *arr);
    if (!arr)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    c->t = arr;
    ctensor *t = &c->t[c->nt];
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "%s", key);
    t->keyhash = keyhash;
    t->chunk0 = chunk0;
    if (opt)
        t->opt = *opt;
    t->n = n;
    t->last_own = malloc(n * 4);
    t->g = malloc(n * 4);
    t->tau = c->info.tau;
    if (!t->last_own || !t->g) {
        free(t->last_own), free(t->g);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for tensor '%s'", key);
    }
    memcpy(t->last_own, init, n * 4);
    t->last = t->last_own;
    c->nt++;
    /* A reconnect meanwhile registers this tensor too (it is in c->t), from
     * t->last, which holds init until the first pull. */
    struct register_call a = { c->nt - 1, init, { 0 } };
    int rc = with_reconnect(c, register_call, &a);
    if (rc != GDDR_OK) {
        c->nt--;
        free(t->last_own), free(t->g);
        msgs_close(t->last_msgs, &t->nlast);
        msgs_close(t->pend_msgs, &t->npend);
        free(t->last_msgs), free(t->pend_msgs);
        return rc;
    }
    t->sid = a.res.sid;
    t->version = a.res.version;
    t->srv_opt = a.res.opt;
    *id = c->nt - 1;
    if (version)
        *version = a.res.version;
    return GDDR_OK;
}

static int check_id(gddr_client *c, int id)
{
    if (!c)
        return GDDR_EINVAL;
    if (id < 0 || id >= c->nt)
        return gddr__set_err(c, GDDR_ENOKEY, "no tensor with id %d (%d registered)", id, c->nt);
    return GDDR_OK;
}

int gddr__pull_tensor(gddr_client *c, int i, float *out, uint64_t min_version, uint64_t step,
                      uint64_t *ticket)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Pull p = GDDR__PULL__INIT;
    p.id = c->t[i].sid;
    p.min_version = min_version;
    p.step = step;
    p.wait_ms = (uint32_t)c->o.timeout_ms;
    if (c->o.part_bytes && c->t[i].n * 4 > c->o.part_bytes)
        p.part_bytes = c->o.part_bytes;
    rq.body_case = GDDR__REQUEST__BODY_PULL;
    rq.pull = &p;
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_PULL, i, ticket);
    if (rc == GDDR_OK)
        gddr__op(c, *ticket)->out = out;
    return rc;
}

int gddr__pull_view(gddr_client *c, int i, float *out, uint64_t min_version, uint64_t step,
                    uint64_t *ticket)
{
    ctensor *t = &c->t[i];
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Pull p = GDDR__PULL__INIT;
    p.id = t->sid;
    p.min_version = min_version;
    p.step = step;
    p.wait_ms = (uint32_t)c->o.timeout_ms;
    if ((c->o.pull_delay_fraction > 0 || c->o.pull_delta_bits) && !c->o.observer) {
        p.delay_fraction = (float)c->o.pull_delay_fraction;
        p.delta_bits = (uint32_t)c->o.pull_delta_bits;
        p.full = t->view_dirty != 0;
        p.view_seq = t->view_seq;
    } else if (c->o.part_bytes && t->n * 4 > c->o.part_bytes) {
        p.part_bytes = c->o.part_bytes;
    }
    rq.body_case = GDDR__REQUEST__BODY_PULL;
    rq.pull = &p;
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_PULL, i, ticket);
    if (rc == GDDR_OK) {
        op *o = gddr__op(c, *ticket);
        o->out = out;
        o->track = 1;
    }
    return rc;
}

static int pull_tracked(gddr_client *c, int id, float *out, uint64_t min_version,
                        gddr_ticket *ticket)
{
    int rc = gddr__pull_tensor(c, id, out, min_version, c->step, ticket);
    if (rc == GDDR_OK)
        gddr__op(c, *ticket)->track = 1;
    return rc;
}

int gddr_pull_async(gddr_client *c, int id, float *out, uint64_t min_version, gddr_ticket *ticket)
{
    if (c && c->shards)
        return out && ticket ? gddr__shards_async(c, id, out, NULL, NULL, min_version, ticket)
                             : gddr__set_err(c, GDDR_EINVAL, "pull: NULL buffer or ticket");
    int rc = check_id(c, id);
    if (rc != GDDR_OK)
        return rc;
    if (!out || !ticket)
        return gddr__set_err(c, GDDR_EINVAL, "pull: NULL buffer or ticket");
    return pull_tracked(c, id, out, min_version, ticket);
}

struct pull_call {
    int id;
    float *out;
    uint64_t min_version;
    int64_t give_up;
    uint64_t version;
};

static int pull_call(gddr_client *c, void *arg)
{
    struct pull_call *a = arg;
    for (;;) {
        gddr_ticket tk;
        op res;
        memset(&res, 0, sizeof res);
        int rc = pull_tracked(c, a->id, a->out, a->min_version, &tk);
        /* The server may park the pull for up to timeout_ms; allow for the trip. */
        if (rc == GDDR_OK)
            rc = gddr__wait_op(c, tk, c->o.timeout_ms + 1000, &res);
        if (rc == GDDR_OK)
            a->version = res.version;
        /* The server answered that the version did not come in time (a
         * slow sync peer): ask again, within the call's bound. */
        if (rc == GDDR_ETIMEDOUT && res.answered && !c->epoch_changed && gddr__now_ms() < a->give_up)
            continue;
        return rc;
    }
}

int gddr_pull(gddr_client *c, int id, float *out, uint64_t min_version, uint64_t *version)
{
    if (c && c->shards)
        return out ? gddr__shards_pull(c, id, out, min_version, version)
                   : gddr__set_err(c, GDDR_EINVAL, "pull: NULL buffer");
    int rc = check_id(c, id);
    if (rc != GDDR_OK)
        return rc;
    if (!out)
        return gddr__set_err(c, GDDR_EINVAL, "pull: NULL buffer");
    struct pull_call a = { id, out, min_version, gddr__now_ms() + c->o.reconnect_timeout_ms, 0 };
    rc = with_reconnect(c, pull_call, &a);
    if (rc == GDDR_OK && version)
        *version = a.version;
    return rc;
}

uint64_t gddr__push_step(gddr_client *c, int i)
{
    ctensor *t = &c->t[i];
    uint64_t step = c->step;
    if (t->pushed && step <= t->last_step)
        step = t->last_step + 1;
    t->pushed = 1;
    t->last_step = step;
    return step;
}

/* A push in parts (proto Push.part): runs of whole chunks of at most
 * part_bytes, sent one after another under one request id; the server
 * answers once, when the last part is in. rq holds the push's header. */
static int push_parts(gddr_client *c, int i, const gddr__push_args *a, Gddr__Request *rq,
                      size_t chunk, uint64_t *ticket)
{
    ctensor *t = &c->t[i];
    Gddr__Push *p = rq->push;
    size_t nchunks = (t->n + chunk - 1) / chunk;
    size_t per = c->o.part_bytes / (chunk * 4);
    if (per < 1)
        per = 1;
    size_t parts = (nchunks + per - 1) / per;
    op *o = op_new(c, OP_PUSH, i);
    uint8_t *bm = a->bitmap ? malloc((per + 7) / 8) : NULL;
    if (!o || (a->bitmap && !bm)) {
        if (o)
            o->req_id = 0;
        free(bm);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for a push in parts");
    }
    size_t voff = 0;
    for (size_t k = 0; k < parts; k++) {
        size_t c0 = k * per, nc = nchunks - c0 < per ? nchunks - c0 : per;
        size_t nv = 0;
        if (bm) {
            memset(bm, 0, (nc + 7) / 8);
            for (size_t j = 0; j < nc; j++) {
                size_t ch = c0 + j, lo = ch * chunk;
                if (a->bitmap[ch / 8] >> (ch % 8) & 1) {
                    bm[j / 8] |= (uint8_t)(1u << (j % 8));
                    nv += lo + chunk <= t->n ? chunk : t->n - lo;
                }
            }
            p->bitmap.data = bm;
            p->bitmap.len = (nc + 7) / 8;
        } else {
            size_t hi = (c0 + nc) * chunk < t->n ? (c0 + nc) * chunk : t->n;
            nv = hi - c0 * chunk;
        }
        p->part = (uint32_t)k;
        p->parts = (uint32_t)parts;
        p->first_chunk = c0;
        p->part_chunks = nc;
        p->payload_bytes = nv * 4;
        gddr__raw raw = { a->vals + voff, nv * 4, NULL, NULL };
        if (a->lend) {
            raw.free_fn = lent_done;
            raw.hint = &c->lent;
            atomic_fetch_add(&c->lent, 1);
        }
        int rc = send_msg(c, o, rq, &raw, 1);
        if (rc != GDDR_OK) {
            o->req_id = 0;
            free(bm);
            return rc;
        }
        voff += nv;
    }
    free(bm);
    *ticket = o->req_id;
    return GDDR_OK;
}

int gddr__push_tensor(gddr_client *c, int i, const gddr__push_args *a, uint64_t *ticket)
{
    ctensor *t = &c->t[i];
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Push p = GDDR__PUSH__INIT;
    p.id = t->sid;
    p.birth_version = a->birth;
    p.base_version = a->base;
    p.step = a->step;
    p.grad_norm = a->norm_from_payload ? 0.0f : a->norm;
    p.norm_from_payload = a->norm_from_payload != 0;
    p.bitmap.data = (uint8_t *)a->bitmap;
    p.bitmap.len = a->bitmap ? a->bitmap_len : 0;
    p.payload_bytes = a->nvals * 4;
    p.flush = a->flush != 0;
    p.held = a->held != 0;
    p.lr = atomic_load(&c->lr);
    p.residual_l1 = a->residual_l1;
    gddr__raw raws[2] = { { a->vals, a->nvals * 4, NULL, NULL },
                          { a->snap, a->snap_vals * 4, NULL, NULL } };
    int nraw = a->snap_bm ? 2 : 1;
    if (a->snap_bm) {
        p.residual_snapshot = 1;
        p.residual_bitmap.data = (uint8_t *)a->snap_bm;
        p.residual_bitmap.len = a->bitmap_len;
        p.residual_payload_bytes = a->snap_vals * 4;
    }
    /* The orphan this tensor finished replaying, reported on its own push so
     * the server credits the right orphan. */
    p.orphans_replayed = t->orphan_done;
    rq.body_case = GDDR__REQUEST__BODY_PUSH;
    rq.push = &p;
    size_t chunk = c->info.chunk > 0 ? (size_t)c->info.chunk : 0;
    int rc;
    if (chunk && c->o.part_bytes && t->n * 4 > c->o.part_bytes && !a->snap_bm && !a->flush &&
        (t->n + chunk - 1) / chunk > c->o.part_bytes / (chunk * 4)) {
        rc = push_parts(c, i, a, &rq, chunk, ticket);
    } else {
        if (a->lend)
            for (int k = 0; k < nraw; k++) {
                raws[k].free_fn = lent_done;
                raws[k].hint = &c->lent;
                atomic_fetch_add(&c->lent, 1);
            }
        rc = gddr__send_req(c, &rq, raws, nraw, OP_PUSH, i, ticket);
    }
    if (rc == GDDR_OK) {
        c->k.values_pushed += a->nvals;
        t->orphan_done = 0;
    }
    return rc;
}

/* A push of the caller's dense gradient, tagged and stepped once. */
static void plain_push_args(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                            gddr__push_args *a)
{
    ctensor *t = &c->t[id];
    memset(a, 0, sizeof *a);
    a->vals = grad;
    a->nvals = t->n;
    a->birth = tags && tags->has_birth ? tags->birth_version : t->version;
    a->base = tags && tags->has_birth && tags->base_version ? tags->base_version : a->birth;
    a->norm_from_payload = 1; /* the payload is the gradient: the server measures it */
    a->step = gddr__push_step(c, id);
}

int gddr_push_async(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                    gddr_ticket *ticket)
{
    if (c && c->shards)
        return grad && ticket ? gddr__shards_async(c, id, NULL, grad, tags, 0, ticket)
                              : gddr__set_err(c, GDDR_EINVAL, "push: NULL gradient or ticket");
    int rc = check_id(c, id);
    if (rc != GDDR_OK)
        return rc;
    if (!grad || !ticket)
        return gddr__set_err(c, GDDR_EINVAL, "push: NULL gradient or ticket");
    gddr__push_args a;
    plain_push_args(c, id, grad, tags, &a);
    return gddr__push_tensor(c, id, &a, ticket);
}

struct push_call {
    int id;
    gddr__push_args a;
    uint64_t version;
    int tries;
};

static int push_call(gddr_client *c, void *arg)
{
    struct push_call *p = arg;
    /* After a reconnect the server may be behind the versions we tagged. */
    ctensor *t = &c->t[p->id];
    if (p->tries++ > 0 && p->a.base > t->version)
        p->a.base = t->version;
    if (p->a.birth > p->a.base)
        p->a.birth = p->a.base;
    gddr_ticket tk;
    op res;
    int rc = gddr__push_tensor(c, p->id, &p->a, &tk);
    if (rc == GDDR_OK)
        rc = gddr__wait_op(c, tk, -1, &res);
    if (rc == GDDR_OK)
        p->version = res.version;
    return rc;
}

int gddr__push_wait(gddr_client *c, int i, const gddr__push_args *a, uint64_t *version)
{
    /* Sent again unchanged (same step) after a reconnect: the server takes
     * it once whether or not the first copy arrived. */
    struct push_call p = { i, *a, 0, 0 };
    int rc = with_reconnect(c, push_call, &p);
    gddr__lent_wait(c); /* a->vals may change once we return */
    if (rc == GDDR_OK && version)
        *version = p.version;
    return rc;
}

int gddr_push_ex(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                 uint64_t *version)
{
    if (c && c->shards)
        return grad ? gddr__shards_push(c, id, grad, tags, version)
                    : gddr__set_err(c, GDDR_EINVAL, "push: NULL gradient");
    int rc = check_id(c, id);
    if (rc != GDDR_OK)
        return rc;
    if (!grad)
        return gddr__set_err(c, GDDR_EINVAL, "push: NULL gradient");
    gddr__push_args a;
    plain_push_args(c, id, grad, tags, &a);
    a.lend = 1; /* sent from the caller's buffer: we wait for the answer */
    return gddr__push_wait(c, id, &a, version);
}

int gddr_push(gddr_client *c, int id, const float *grad, uint64_t *version)
{
    return gddr_push_ex(c, id, grad, NULL, version);
}

int gddr_server_stats_get(gddr_client *c, gddr_server_stats *out)
{
    if (!c || !out)
        return GDDR_EINVAL;
    if (c->shards)
        return gddr__shards_stats(c, out);
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__StatsRequest s = GDDR__STATS_REQUEST__INIT;
    rq.body_case = GDDR__REQUEST__BODY_STATS;
    rq.stats = &s;
    uint64_t tk;
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_STATS, -1, &tk);
    if (rc != GDDR_OK)
        return rc;
    gddr__op(c, tk)->stats = out;
    return gddr__wait_op(c, tk, -1, NULL);
}

int gddr_server_metrics_text(gddr_client *c, char **text)
{
    if (!c || !text)
        return GDDR_EINVAL;
    *text = NULL;
    if (c->shards)
        return gddr__shards_metrics(c, text);
    /* Asks for the Prometheus text and reads the reply by hand: it is the
     * only reply that carries a string the caller keeps. */
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__StatsRequest s = GDDR__STATS_REQUEST__INIT;
    s.prometheus = 1;
    rq.body_case = GDDR__REQUEST__BODY_STATS;
    rq.stats = &s;
    rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq.req_id = ++c->next_req;
    rq.rank = (uint32_t)c->info.rank;
    rq.observer = c->o.observer != 0;
    rq.session = c->session;
    if (gddr__send(c->sock, NULL, &rq.base, NULL, 0) < 0)
        return gddr__set_err(c, GDDR_EIO, "send failed: %s", zmq_strerror(errno));
    int64_t deadline = gddr__now_ms() + c->o.timeout_ms;
    while (gddr__now_ms() < deadline) {
        zmq_pollitem_t it = { c->sock, 0, ZMQ_POLLIN, 0 };
        if (zmq_poll(&it, 1, (long)(deadline - gddr__now_ms())) <= 0)
            continue;
        gddr__frames f;
        while (gddr__frames_recv(c->sock, &f, ZMQ_DONTWAIT) >= 0) {
            Gddr__Reply *r = f.n >= 1 ? gddr__reply__unpack(NULL, gddr__frame_size(&f, 0),
                                                            gddr__frame_data(&f, 0))
                                      : NULL;
            if (r && r->req_id == rq.req_id && r->body_case == GDDR__REPLY__BODY_STATS) {
                *text = strdup(r->stats->prometheus ? r->stats->prometheus : "");
                gddr__reply__free_unpacked(r, NULL);
                gddr__frames_close(&f);
                return *text ? GDDR_OK : GDDR_ENOMEM;
            }
            /* Someone else's reply (a pull in flight): complete it as usual. */
            if (r)
                gddr__reply__free_unpacked(r, NULL);
            if (f.n >= 1)
                complete(c, &f);
            gddr__frames_close(&f);
        }
    }
    return gddr__set_err(c, GDDR_ETIMEDOUT, "no metrics reply within %d ms", c->o.timeout_ms);
}

int gddr_request_checkpoint(gddr_client *c)
{
    if (!c)
        return GDDR_EINVAL;
    if (c->shards)
        return gddr__shards_checkpoint(c);
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__CheckpointRequest cr = GDDR__CHECKPOINT_REQUEST__INIT;
    rq.body_case = GDDR__REQUEST__BODY_CHECKPOINT;
    rq.checkpoint = &cr;
    uint64_t tk;
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_ACK, -1, &tk);
    return rc == GDDR_OK ? gddr__wait_op(c, tk, -1, NULL) : rc;
}

int gddr_tensor_version(const gddr_client *c, int id, uint64_t *version)
{
    if (c && c->shards)
        return gddr__shards_version(c, id, version);
    if (!c || !version || id < 0 || id >= c->nt)
        return GDDR_EINVAL;
    *version = c->t[id].version;
    return GDDR_OK;
}

int gddr_cuda_status(char *why, size_t len)
{
    char tmp[512] = "";
    int ok = gddr_cuda_available(tmp, sizeof tmp) == 1;
    if (why && len)
        snprintf(why, len, "%s", ok ? "" : tmp[0] ? tmp : "no CUDA device");
    return ok;
}
