/* conn_req.c -- the requests of one connection (hello, register one
 * tensor, pull, push) and the reconnect: after a restart or a lost server,
 * a fresh socket, hello and every tensor registered again, so that every
 * blocking call can be retried within reconnect_timeout_ms
 * (gddr__with_reconnect).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_int.h"

/* Says hello; *retry_ms (may be NULL) gets the server's hint when it
 * refused for now (the rank is still held by a worker it thinks alive). */
int gddr__hello(gddr_client *c, int timeout_ms, uint32_t *retry_ms)
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
int gddr__hello_retryable(int rc, uint32_t retry_ms)
{
    return rc == GDDR_ETIMEDOUT || rc == GDDR_EIO || retry_ms > 0;
}

/* The wire's Optimizer for o (NULL when o is not set: the server's). */
static Gddr__Optimizer *optim_msg(const gddr__optim *o, Gddr__Optimizer *oz)
{
    if (!o->set)
        return NULL;
    gddr__optimizer__init(oz);
    oz->kind = (Gddr__OptimizerKind)o->kind;
    oz->lr = o->lr;
    oz->momentum = o->momentum;
    oz->beta1 = o->beta1;
    oz->beta2 = o->beta2;
    oz->eps = o->eps;
    oz->weight_decay = o->weight_decay;
    return oz;
}

int gddr__register_one(gddr_client *c, int i, const float *vals, int timeout_ms, op *res)
{
    ctensor *t = &c->t[i];
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__InitTensor in = GDDR__INIT_TENSOR__INIT;
    in.key = t->key;
    in.n = t->n;
    in.payload_bytes = t->n * 4;
    Gddr__Optimizer oz;
    in.optimizer = optim_msg(&t->opt, &oz);
    rq.body_case = GDDR__REQUEST__BODY_INIT;
    rq.init = &in;
    gddr__raw raw = { vals, t->n * 4, NULL, NULL };
    uint64_t tk;
    int rc = gddr__send_req(c, &rq, &raw, 1, OP_INIT, i, &tk);
    if (rc == GDDR_OK)
        rc = gddr__wait_op(c, tk, timeout_ms, res);
    return rc;
}

int gddr__register_table_one(gddr_client *c, int i, int timeout_ms, op *res)
{
    const ctable *tb = &c->tb[i];
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__InitTable in = GDDR__INIT_TABLE__INIT;
    Gddr__Optimizer oz;
    in.key = (char *)tb->key;
    in.dim = tb->dim;
    in.init = (Gddr__TableInit)tb->o.init;
    in.init_scale = tb->o.init_scale;
    in.init_seed = tb->o.init_seed;
    in.admit = (Gddr__TableAdmit)tb->o.admit;
    in.admit_count = tb->o.admit_count;
    in.admit_prob = tb->o.admit_prob;
    in.max_rows = tb->o.max_rows;
    in.row_ttl = tb->o.row_ttl;
    in.optimizer = optim_msg(&tb->opt, &oz);
    rq.body_case = GDDR__REQUEST__BODY_INIT_TABLE;
    rq.init_table = &in;
    uint64_t tk;
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_INIT_TABLE, -1, &tk);
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
    uint64_t prev_epoch = c->info.epoch; /* 0: already unknown */
    gddr__ops_fail_all(c, GDDR_ETIMEDOUT);
    c->k.reconnects++;
    for (int i = 0; i < c->nt; i++)
        c->t[i].view_dirty = 1; /* a lazy reply may be lost: the next pull is full */
    gddr__logf(&c->log, GDDR_LOG_WARN, "reconnecting to %s", c->server);
    while (gddr__now_ms() < deadline) {
        int left = (int)(deadline - gddr__now_ms());
        int try_ms = c->o.timeout_ms < left ? c->o.timeout_ms : left;
        if ((rc = gddr__open_socket(c)) != GDDR_OK)
            return rc;
        c->info.epoch = 0;
        c->epoch_changed = 0;
        uint32_t retry_ms = 0;
        rc = gddr__hello(c, try_ms, &retry_ms);
        for (int i = 0; rc == GDDR_OK && i < c->nt; i++) {
            op res;
            const float *last = gddr__last(&c->t[i]);
            rc = last ? gddr__register_one(c, i, last, try_ms, &res)
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
        for (int i = 0; rc == GDDR_OK && i < c->ntb; i++) {
            op res;
            ctable *tb = &c->tb[i];
            if ((rc = gddr__register_table_one(c, i, try_ms, &res)) != GDDR_OK)
                break;
            tb->sid = res.sid;
            if (res.version < tb->pulled) {
                /* A server restored from a checkpoint answers with the
                 * version saved (an empty one with 0): the steps after it
                 * are gone. */
                gddr__logf(&c->log, GDDR_LOG_WARN,
                           "table '%s' is back at version %llu (we had %llu): updates after the server's last checkpoint were lost",
                           tb->key, (unsigned long long)res.version, (unsigned long long)tb->pulled);
                tb->need = tb->pulled = res.version;
            } else if (res.version < tb->need && c->info.epoch != prev_epoch) {
                /* A restarted server: our last push made (or joined a
                 * sync step toward) a version it does not have: lost with
                 * the server, or waiting in an open sync step the
                 * checkpoint kept. Pulls stop waiting for it (else a lost
                 * one would block them). The same server (a pull that
                 * timed out while the other workers were slow) keeps the
                 * wait: its step is still to come. */
                gddr__logf(&c->log, GDDR_LOG_INFO,
                           "table '%s' is at version %llu, before the %llu our last push waits for: pulls no longer wait for it",
                           tb->key, (unsigned long long)res.version, (unsigned long long)tb->need);
                tb->need = res.version;
            }
        }
        if (rc == GDDR_OK) {
            gddr__logf(&c->log, GDDR_LOG_INFO, "reconnected to %s (epoch %016llx)", c->server,
                       (unsigned long long)c->info.epoch);
            return GDDR_OK;
        }
        if (!gddr__hello_retryable(rc, retry_ms) && rc != GDDR_ETIMEDOUT && rc != GDDR_EIO)
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

int gddr__needs_reconnect(gddr_client *c, int rc)
{
    /* E_NOKEY from the server we registered with is an answer (no such
     * table or tensor: an observer's lookup), not a sign of a restart;
     * a restarted server's reply carries another epoch (epoch_changed). */
    return c->epoch_changed || rc == GDDR_ETIMEDOUT || rc == GDDR_EIO ||
           (rc == GDDR_ENOKEY && !c->info.epoch) || rc == GDDR_EVERSION || rc == GDDR_ENOTICKET;
}

int gddr__with_reconnect(gddr_client *c, int (*call)(gddr_client *, void *), void *arg)
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
    int reduced = (c->o.pull_delay_fraction > 0 || c->o.pull_delta_bits) && !c->o.observer;
    int pick = reduced && c->o.pull_delta_auto ? 1 + gddr__pullpick_next_whole(&t->pick) : 0;
    if (reduced && pick != 2) {
        p.delay_fraction = (float)c->o.pull_delay_fraction;
        p.delta_bits = (uint32_t)c->o.pull_delta_bits;
        p.full = t->view_dirty != 0;
        p.view_seq = t->view_seq;
    } else if (c->o.part_bytes && t->n * 4 > c->o.part_bytes) {
        p.part_bytes = c->o.part_bytes;
    }
    rq.body_case = GDDR__REQUEST__BODY_PULL;
    rq.pull = &p;
    int64_t t0 = pick ? gddr__now_us() : 0;
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_PULL, i, ticket);
    if (rc == GDDR_OK) {
        op *o = gddr__op(c, *ticket);
        o->out = out;
        o->track = 1;
        o->pick = pick;
        o->t0_us = t0;
    }
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
    op *o = gddr__op_new(c, OP_PUSH, i);
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
        if (a->lend)
            gddr__lend(c, &raw);
        int rc = gddr__send_msg(c, o, rq, &raw, 1);
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
            for (int k = 0; k < nraw; k++)
                gddr__lend(c, &raws[k]);
        rc = gddr__send_req(c, &rq, raws, nraw, OP_PUSH, i, ticket);
    }
    if (rc == GDDR_OK) {
        c->k.values_pushed += a->nvals;
        t->orphan_done = 0;
    }
    return rc;
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
    int rc = gddr__with_reconnect(c, push_call, &p);
    gddr__lent_wait(c); /* a->vals may change once we return */
    if (rc == GDDR_OK && version)
        *version = p.version;
    return rc;
}

