/* conn_reply.c -- the replies of one connection: each reply read off the
 * socket completes the op it answers (conn.c's slots); a pull reply's
 * values go to the caller's buffer and, for a tracked pull, become the
 * tensor's last values (its frames kept, not copied); a lazy or delta reply
 * updates that view (the decoder of common/view.c).
 *
 * gddr__wait_op() reads replies, completing whichever op each answers,
 * until the one it waits for is done or its time is up; an unanswered wait
 * returns GDDR_ETIMEDOUT and never hangs. A reply carrying a new server
 * epoch (a restart) marks the connection for a reconnect (conn_req.c). An
 * Orphan message goes to c->on_orphan (recovery.c's, set by the layer
 * above): this file calls nothing above conn.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "view.h"

/* ---- the tensors' last values ------------------------------------------------ */

void gddr__msgs_close(zmq_msg_t *m, uint32_t *n)
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
        size_t b = zmq_msg_size(&t->last_msgs[k]); /* pull_reply keeps parts that tile it once */
        memcpy((char *)v + o, zmq_msg_data(&t->last_msgs[k]), b);
        o += b;
    }
    gddr__msgs_close(t->last_msgs, &t->nlast);
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
    gddr__msgs_close(t->last_msgs, &t->nlast);
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
    /* The decoder of server/conn.c's encoder (common/view.c), writing the
     * caller's parameters in the same pass. */
    gddr__view_apply(view, o->out, t->n, chunk, pr->bitmap.data, bits, gddr__frame_data(f, 1));
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
    /* Parts come in order and each starts where the one before ended, so
     * together they are the tensor once: a server that sent two parts over
     * the same values would otherwise have them kept (and joined by
     * gddr__last) past the tensor's end. */
    if (f->n != 2 || pr->payload_bytes != bytes || bytes % 4 || lo > t->n || bytes / 4 > t->n - lo ||
        lo != (first ? 0 : o->parts_next) ||
        (parts == 1 && bytes != t->n * 4) || pr->part != o->parts_got ||
        (!first && (parts != o->parts || pr->version != o->version)) ||
        (pr->part + 1 == parts && lo + bytes / 4 != t->n)) {
        o->rc = gddr__set_err(c, GDDR_ELENGTH,
                              "pull reply for '%s': part %u of %u holds %zu bytes at value %zu "
                              "(the tensor has %zu values)",
                              t->key, pr->part, parts, bytes, lo, t->n);
        gddr__msgs_close(t->pend_msgs, &t->npend);
        return 1;
    }
    o->parts = parts;
    o->parts_next = lo + bytes / 4;
    o->version = pr->version;
    memcpy(o->out + lo, gddr__frame_data(f, 1), bytes); /* the one copy */
    c->k.bytes_pulled += f->bytes;
    if (o->track && msgs_keep(&t->pend_msgs, &t->npend, &t->cap_pend, &f->part[1]) < 0) {
        o->rc = gddr__set_err(c, GDDR_ENOMEM, "no memory to keep a pull reply");
        gddr__msgs_close(t->pend_msgs, &t->npend);
        return 1;
    }
    if (++o->parts_got < parts)
        return 0;
    if (o->track) {
        /* The frames themselves become the tensor's last values. */
        gddr__msgs_close(t->last_msgs, &t->nlast);
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

/* pull_delta_auto: what a finished pull cost, for the tensor's choice of
 * the next pull's kind (pullpick.c): its request to its values in the
 * caller's buffer, less what the server kept it parked. */
static void pull_timed(gddr_client *c, const op *o, uint64_t parked_us)
{
    if (o->tensor < 0 || o->tensor >= c->nt)
        return;
    double cost = o->rc == GDDR_OK ? (double)(gddr__now_us() - o->t0_us) - (double)parked_us : -1;
    gddr__pullpick *p = &c->t[o->tensor].pick;
    uint64_t flips = p->flips;
    int probing = p->probing;
    gddr__pullpick_done(p, o->pick == 2, cost);
    if (probing && !p->probing && p->flips == flips)
        gddr__logf(&c->log, GDDR_LOG_DEBUG,
                   "pull_delta_auto: '%s' still pulls %s (%.0f us a pull at least, against %.0f for the other "
                   "kind)", c->t[o->tensor].key, p->whole ? "whole float32 values" : "reduced",
                   p->last_cost[p->whole], p->last_cost[!p->whole]);
    if (p->flips != flips)
        gddr__logf(&c->log, GDDR_LOG_INFO,
                   "pull_delta_auto: '%s' now pulls %s (%.0f us a pull at least, against %.0f); the other kind "
                   "is tried again in %u pulls", c->t[o->tensor].key, p->whole ? "whole float32 values" :
                   "reduced", p->last_cost[p->whole], p->last_cost[!p->whole], p->every);
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
        if (c->on_orphan)
            c->on_orphan(c, r->orphan, f);
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
    if (o->kind == OP_PUSH && c->o.delay_auto)
        o->t1_us = gddr__now_us();
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
        if (o->kind == OP_PULL && o->pick)
            pull_timed(c, o, 0);
        break;
    case GDDR__REPLY__BODY_HELLO:
        if (o->kind != OP_HELLO)
            goto unexpected;
        /* The chunk lays out every residual, age and bitmap this client
         * holds: a server (restarted, or not a gddr-ps) that names another
         * one, or none, is refused rather than believed. */
        if (c->info.chunk > 0 && r->hello->chunk != (uint32_t)c->info.chunk) {
            o->rc = gddr__set_err(c, GDDR_ECONFIG,
                                  "the server's chunk is %u values, where this client started with "
                                  "%d: its residuals are laid out in that one (restart the workers "
                                  "after changing chunk)", r->hello->chunk, c->info.chunk);
            break;
        }
        if (r->hello->chunk == 0 || r->hello->chunk > (1u << 24)) {
            o->rc = gddr__set_err(c, GDDR_ECONFIG,
                                  "the server's chunk is %u values, where this client accepts 1 to "
                                  "16777216", r->hello->chunk);
            break;
        }
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
    case GDDR__REPLY__BODY_INIT_TABLE:
        if (o->kind != OP_INIT_TABLE)
            goto unexpected;
        o->sid = r->init_table->id;
        o->version = r->init_table->version;
        o->created = r->init_table->created;
        break;
    case GDDR__REPLY__BODY_PULL_ROWS:
        if (o->kind != OP_PULL_ROWS)
            goto unexpected;
        if (f->n != 2 || r->pull_rows->payload_bytes != o->nfloats * 4 ||
            gddr__frame_size(f, 1) != o->nfloats * 4) {
            o->rc = gddr__set_err(c, GDDR_ELENGTH, "row pull answered with %zu bytes for %zu values",
                                  f->n == 2 ? gddr__frame_size(f, 1) : (size_t)0, o->nfloats);
            break;
        }
        if (o->nfloats)
            memcpy(o->out, gddr__frame_data(f, 1), o->nfloats * 4);
        c->k.bytes_pulled += f->bytes;
        o->version = r->pull_rows->version;
        c->k.pulls++;
        break;
    case GDDR__REPLY__BODY_PULL:
        if (o->kind != OP_PULL)
            goto unexpected;
        if (!pull_reply(c, o, r->pull, f))
            o->done = o->answered = 0; /* more parts to come */
        else if (o->pick)
            pull_timed(c, o, r->pull->parked_us);
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

/* ---- waiting ------------------------------------------------------------------ */

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
        if (rc <= 0)
            continue;
        /* Replies first: one that came before a broken connection's
         * event is an answer, not a loss (gddr__mon_check). */
        gddr__frames f;
        while (gddr__frames_recv(c->sock, &f, ZMQ_DONTWAIT) >= 0) {
            if (f.n >= 1)
                complete(c, &f);
            gddr__frames_close(&f);
        }
        if (c->mon && (it[1].revents & ZMQ_POLLIN) && gddr__mon_check(c) != GDDR_OK)
            return GDDR_EAUTH;
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

int gddr__metrics_request(gddr_client *c, char **text)
{
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
