/* table_wire.c -- sparse embedding tables on the wire: InitTable, PullRows
 * and PushRows (proto/gddr.proto, docs/protocol.md "Tables"). The rows
 * themselves live in table.c; this file adds what makes them part of a
 * parameter server: registration by key, exactly-once pushes per (rank,
 * table, step), AdaDelay's staleness scaling, sync steps summed in rank
 * order (so a step does not depend on which push arrived first, and a
 * table spread over several servers by key computes every row as one
 * server would), and parked pulls until a sync step's version exists
 * (the metrics: table_metrics.c).
 *
 * Everything runs on the front thread: a table step is a hash lookup and a
 * few floats per key, and the apply threads stay with the dense tensors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "ps.h"
#include "syncstep.h"
#include "pushlog.h"
#include "table.h"
#include "table_wire.h"
#include "table_wire_int.h"

static struct ps_tables *tables_of(gddr_ps *ps)
{
    if (!ps->tables)
        ps->tables = calloc(1, sizeof *ps->tables);
    return ps->tables;
}

static ps_stable *table_by_id(gddr_ps *ps, uint32_t id)
{
    struct ps_tables *ts = ps->tables;
    return ts && id < ts->n ? ts->t[id] : NULL;
}

/* The keys of frame i as uint64 (little-endian on the wire; copied when
 * the frame is not 8-aligned). NULL when out of memory. */
static const uint64_t *frame_keys(gddr_ps *ps, gddr__frames *f, int i, size_t n)
{
    const void *d = gddr__frame_data(f, i);
    if (((uintptr_t)d & 7) == 0 || n == 0)
        return d;
    struct ps_tables *ts = ps->tables;
    if (ts->kcap < n) {
        uint64_t *nb = realloc(ts->kbuf, n * sizeof *nb);
        if (!nb)
            return NULL;
        ts->kbuf = nb;
        ts->kcap = n;
    }
    memcpy(ts->kbuf, d, n * sizeof(uint64_t));
    return ts->kbuf;
}

/* On one of several servers, a key whose row lives elsewhere is a client's
 * routing bug: refused (E_INVAL, naming the key) rather than quietly kept
 * twice. Returns GDDR_OK when every key is this server's. */
static int refuse_misrouted(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, const uint64_t *keys,
                            size_t n)
{
    uint32_t S = (uint32_t)ps->cfg.shard_count, me = (uint32_t)ps->cfg.shard_index;
    for (size_t i = 0; S > 1 && i < n; i++)
        if (gddr_row_shard(keys[i], S) != me)
            return ps_reject(ps, ident, req_id, GDDR_EINVAL,
                             "key %llu belongs to shard %u, not to this server (shard %u of %u)",
                             (unsigned long long)keys[i], gddr_row_shard(keys[i], S), me, S);
    return GDDR_OK;
}

static void fill_optimizer(const ps_stable *s, const gddr_ps *ps, Gddr__Optimizer *o)
{
    gddr__optimizer__init(o);
    o->kind = s->o.kind;
    o->lr = s->o.lr > 0 ? s->o.lr : ps->cfg.lr;
    o->beta1 = s->o.beta1;
    o->beta2 = s->o.beta2;
    o->eps = s->o.eps;
}

/* ---- registration ------------------------------------------------------------ */

/* max_table_bytes, or half the machine's memory when it is 0. */
static uint64_t table_bytes_bound(const gddr_ps *ps)
{
    if (ps->cfg.max_table_bytes > 0)
        return (uint64_t)ps->cfg.max_table_bytes;
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 2 : 0;
}

static int conf_from_request(gddr_ps *ps, const Gddr__InitTable *in, ps_table_conf *c,
                             tw_opt *to, char *why, size_t wl)
{
    memset(c, 0, sizeof *c);
    c->dim = in->dim;
    c->init = (ps_tinit)in->init;
    c->init_scale = in->init_scale;
    c->init_seed = in->init_seed;
    c->admit = (ps_tadmit)in->admit;
    c->admit_count = in->admit_count;
    c->admit_prob = in->admit_prob;
    c->max_rows = in->max_rows;
    c->row_ttl = in->row_ttl;
    if (in->init > GDDR__TABLE_INIT__TINIT_NORMAL || in->admit > GDDR__TABLE_ADMIT__TADMIT_PROB) {
        snprintf(why, wl, "unknown init %d or admission %d", (int)in->init, (int)in->admit);
        return -1;
    }
    const Gddr__Optimizer *o = in->optimizer;
    to->opt_given = o != NULL;
    to->kind = o ? o->kind : GDDR__OPTIMIZER_KIND__OPT_SGD;
    to->lr = o ? o->lr : 0;
    to->beta1 = o ? o->beta1 : 0;
    to->beta2 = o ? o->beta2 : 0;
    to->eps = o ? o->eps : 0;
    if (o) {
        /* The checks of a tensor's optimizer, then what rows do not offer. */
        ps_optim po = { (int)o->kind, 1, o->lr, o->momentum, o->beta1, o->beta2, o->eps, o->weight_decay };
        char msg[200];
        if (ps_optim_check(&po, msg, sizeof msg) < 0) {
            snprintf(why, wl, "optimizer: %s", msg);
            return -1;
        }
        if (o->momentum != 0 || o->weight_decay != 0 || o->kind == GDDR__OPTIMIZER_KIND__OPT_ADAMW) {
            snprintf(why, wl, "optimizer: momentum, weight_decay and adamw are not offered for table rows (sgd, adam, adagrad)");
            return -1;
        }
    }
    c->opt = to->kind == GDDR__OPTIMIZER_KIND__OPT_ADAM      ? PS_TOPT_ADAM
             : to->kind == GDDR__OPTIMIZER_KIND__OPT_ADAGRAD ? PS_TOPT_ADAGRAD
                                                             : PS_TOPT_SGD;
    c->lr = (float)(to->lr > 0 ? to->lr : ps->cfg.lr);
    c->beta1 = (float)to->beta1;
    c->beta2 = (float)to->beta2;
    c->eps = (float)to->eps;
    return ps_table_conf_check(c, why, wl);
}

static void send_init_reply(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, ps_stable *s,
                            int created)
{
    Gddr__Reply r;
    Gddr__InitTableReply ir = GDDR__INIT_TABLE_REPLY__INIT;
    Gddr__Optimizer o;
    ps_table_counts k;
    ps_table_counts_get(s->tab, &k);
    ps_reply_init(ps, &r, req_id, NULL);
    ir.id = s->id;
    ir.dim = ps_table_config(s->tab)->dim;
    ir.version = ps_table_version(s->tab);
    ir.created = created;
    ir.rows = k.rows;
    ir.row_bytes = ps_table_row_bytes(ps_table_config(s->tab));
    fill_optimizer(s, ps, &o);
    ir.optimizer = &o;
    r.body_case = GDDR__REPLY__BODY_INIT_TABLE;
    r.init_table = &ir;
    ps_send_reply(ps, ident, &r, NULL, 0);
}

static void stable_free(ps_stable *s, int max_workers)
{
    if (!s)
        return;
    if (s->step)
        for (int r = 0; r < max_workers; r++)
            free(s->step[r].keys), free(s->step[r].vals);
    free(s->step);
    free(s->rec);
    ps_align_free(&s->align);
    ps_rowsum_free(s->sum);
    ps_table_free(s->tab);
    free(s);
}

ps_stable *ps_tables_add(gddr_ps *ps, const char *key, const ps_table_conf *c, const tw_opt *o)
{
    struct ps_tables *ts = tables_of(ps);
    ps_stable *s = ts ? calloc(1, sizeof *s) : NULL;
    if (!s)
        return NULL;
    snprintf(s->key, sizeof s->key, "%s", key);
    s->o = *o;
    int mw = (int)ps->cfg.max_workers;
    ps_stable **nt = realloc(ts->t, (ts->n + 1) * sizeof *nt);
    if (nt)
        ts->t = nt;
    if (!nt || ps_table_new(c, &ts->rows, (uint64_t)ps->cfg.max_table_rows, &s->tab) < 0 ||
        !(s->step = calloc((size_t)mw, sizeof *s->step)) || !(s->rec = calloc((size_t)mw, sizeof *s->rec)) ||
        !(s->sum = ps_rowsum_new(c->dim))) {
        stable_free(s, mw);
        return NULL;
    }
    ps_table_set_server_bytes(s->tab, &ts->bytes, table_bytes_bound(ps));
    s->id = (uint32_t)ts->n;
    ts->t[ts->n++] = s;
    return s;
}

int ps_on_init_table(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, int worker)
{
    const Gddr__InitTable *in = rq->init_table;
    uint64_t id = rq->req_id;
    struct ps_tables *ts = tables_of(ps);
    if (!ts)
        return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory");
    if (!ps_valid_key(in->key))
        return ps_reject(ps, ident, id, GDDR_EINVAL, "table key must be 1-127 printable characters without spaces");
    for (size_t i = 0; i < ts->n; i++) {
        ps_stable *s = ts->t[i];
        if (strcmp(s->key, in->key) != 0)
            continue;
        uint32_t dim = ps_table_config(s->tab)->dim;
        if (in->dim != dim)
            return ps_reject(ps, ident, id, GDDR_ELENGTH, "table '%s' has rows of %u values, not %u",
                             s->key, dim, in->dim);
        send_init_reply(ps, ident, id, s, 0);
        return GDDR_OK;
    }
    if (!worker)
        return ps_reject(ps, ident, id, GDDR_ENOKEY, "no table '%s' (only a worker may create one)", in->key);
    if (!ps->cfg.allow_register)
        return ps_reject(ps, ident, id, GDDR_ESTATE, "registration is closed (allow_register = false)");
    if (ts->n >= (size_t)ps->cfg.max_tables)
        return ps_reject(ps, ident, id, GDDR_EINVAL, "server holds max_tables = %lld already",
                         ps->cfg.max_tables);
    char why[256];
    ps_table_conf c;
    tw_opt o;
    if (conf_from_request(ps, in, &c, &o, why, sizeof why) < 0)
        return ps_reject(ps, ident, id, GDDR_EINVAL, "table '%s': %s", in->key, why);
    ps_stable *s = ps_tables_add(ps, in->key, &c, &o);
    if (!s)
        return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory for table '%s'", in->key);
    gddr_log(GDDR_LOG_INFO, "table '%s' registered: id %u, %u values a row, %zu bytes a row", s->key,
             s->id, c.dim, ps_table_row_bytes(&c));
    send_init_reply(ps, ident, id, s, 1);
    return GDDR_OK;
}

/* ---- pulls ------------------------------------------------------------------- */

static int serve_pull(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, ps_stable *s,
                      const uint64_t *keys, size_t n, int create)
{
    uint32_t dim = ps_table_config(s->tab)->dim;
    size_t bytes = n * dim * sizeof(float);
    float *out = malloc(bytes ? bytes : 1);
    size_t created = 0;
    if (!out || ps_table_pull(s->tab, keys, n, create, out, &created) < 0) {
        free(out);
        return ps_reject(ps, ident, req_id, GDDR_ENOMEM, "no memory for a pull of %zu rows", n);
    }
    Gddr__Reply r;
    Gddr__PullRowsReply pr = GDDR__PULL_ROWS_REPLY__INIT;
    ps_reply_init(ps, &r, req_id, NULL);
    pr.table = s->id;
    pr.version = ps_table_version(s->tab);
    pr.nkeys = n;
    pr.payload_bytes = bytes;
    pr.created = created;
    r.body_case = GDDR__REPLY__BODY_PULL_ROWS;
    r.pull_rows = &pr;
    gddr__raw raw = { out, bytes, gddr__zfree, NULL };
    ps_send_reply(ps, ident, &r, &raw, 1);
    s->pulls++;
    s->rows_pulled += n;
    ps->pulls_served++;
    return GDDR_OK;
}

int ps_on_pull_rows(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f,
                    int worker)
{
    const Gddr__PullRows *p = rq->pull_rows;
    uint64_t id = rq->req_id;
    ps_stable *s = table_by_id(ps, p->table);
    if (!s)
        return ps_reject(ps, ident, id, GDDR_ENOKEY, "no table with id %u", p->table);
    if (f->n != 3)
        return ps_reject(ps, ident, id, GDDR_EPROTO, "a row pull carries one frame of keys, not %d frames",
                         f->n - 2);
    if (p->nkeys > SIZE_MAX / 8 || gddr__frame_size(f, 2) != p->nkeys * 8)
        return ps_reject(ps, ident, id, GDDR_ELENGTH, "row pull of %llu keys with a key frame of %zu bytes",
                         (unsigned long long)p->nkeys, gddr__frame_size(f, 2));
    uint32_t dim = ps_table_config(s->tab)->dim;
    if (p->nkeys * dim * 4 > (uint64_t)ps->cfg.max_message_bytes)
        return ps_reject(ps, ident, id, GDDR_ETOOBIG, "row pull of %llu keys x %u values exceeds max_message_bytes",
                         (unsigned long long)p->nkeys, dim);
    const uint64_t *keys = frame_keys(ps, f, 2, p->nkeys);
    if (!keys)
        return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory");
    if (refuse_misrouted(ps, ident, id, keys, p->nkeys) != GDDR_OK)
        return GDDR_EINVAL;
    int create = worker && p->create;
    uint64_t v = ps_table_version(s->tab);
    if (v >= p->min_version)
        return serve_pull(ps, ident, id, s, keys, p->nkeys, create);
    if (p->min_version > v + 1)
        return ps_reject(ps, ident, id, GDDR_EVERSION, "row pull asks for version %llu of table '%s', which is at %llu",
                         (unsigned long long)p->min_version, s->key, (unsigned long long)v);
    struct ps_tables *ts = ps->tables;
    if (ts->npulls >= (size_t)ps->cfg.max_parked_pulls)
        return ps_reject(ps, ident, id, GDDR_EBUSY, "%zu row pulls wait already (max_parked_pulls)", ts->npulls);
    if (ts->npulls == ts->cap_pulls) {
        size_t cap = ts->cap_pulls ? ts->cap_pulls * 2 : 16;
        tw_pull *np = realloc(ts->pulls, cap * sizeof *np);
        if (!np)
            return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory to park a pull");
        ts->pulls = np;
        ts->cap_pulls = cap;
    }
    tw_pull *q = &ts->pulls[ts->npulls];
    memset(q, 0, sizeof *q);
    q->keys = malloc(p->nkeys ? p->nkeys * 8 : 1);
    if (!q->keys)
        return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory to park a pull");
    memcpy(q->keys, keys, p->nkeys * 8);
    ts->npulls++;
    zmq_msg_init(&q->ident);
    zmq_msg_copy(&q->ident, ident);
    q->req_id = id;
    q->min_version = p->min_version;
    q->n = p->nkeys;
    q->table = s->id;
    q->create = create;
    uint64_t wait = p->wait_ms < (uint64_t)ps->cfg.pull_wait_max_ms ? p->wait_ms
                                                                     : (uint64_t)ps->cfg.pull_wait_max_ms;
    q->deadline_ms = gddr__now_ms() + (int64_t)wait;
    return GDDR_OK;
}

void ps_tables_release_pulls(gddr_ps *ps)
{
    struct ps_tables *ts = ps->tables;
    if (!ts || !ts->npulls)
        return;
    int64_t now = gddr__now_ms();
    size_t keep = 0;
    for (size_t i = 0; i < ts->npulls; i++) {
        tw_pull *q = &ts->pulls[i];
        ps_stable *s = table_by_id(ps, q->table);
        if (s && ps_table_version(s->tab) >= q->min_version) {
            serve_pull(ps, &q->ident, q->req_id, s, q->keys, q->n, q->create);
        } else if (ps->stop) {
            ps_reject(ps, &q->ident, q->req_id, GDDR_ESHUTDOWN, "server is shutting down");
        } else if (now >= q->deadline_ms) {
            ps_reject(ps, &q->ident, q->req_id, GDDR_ETIMEDOUT,
                      "row pull of table %u waited too long for version %llu", q->table,
                      (unsigned long long)q->min_version);
        } else {
            ts->pulls[keep++] = *q;
            continue;
        }
        zmq_msg_close(&q->ident);
        free(q->keys);
    }
    ts->npulls = keep;
}

int ps_tables_next_timeout(gddr_ps *ps, int cap)
{
    struct ps_tables *ts = ps->tables;
    int64_t now = gddr__now_ms(), t = cap;
    for (size_t i = 0; ts && i < ts->npulls; i++) {
        int64_t d = ts->pulls[i].deadline_ms - now;
        if (d < t)
            t = d < 0 ? 0 : d;
    }
    return (int)t;
}

/* ---- pushes ------------------------------------------------------------------ */

static void send_push_reply(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, const ps_stable *s,
                            const tw_rec *o, int duplicate, uint64_t behind)
{
    ps_push_answer a = { o->version, o->sync_target, o->staleness, o->applied, o->mode, behind };
    ps_send_push_reply(ps, ident, req_id, NULL, s->id, &a, duplicate);
}

static float table_lr(const gddr_ps *ps, const ps_stable *s, double push_lr)
{
    return (float)(push_lr > 0 ? push_lr : s->o.lr > 0 ? s->o.lr : ps->cfg.lr);
}

/* Completes the sync step being collected when every live worker pushed
 * (or force: membership changed and fewer are left). The pushes are
 * summed in rank order and applied as their mean. Returns 1 if applied. */
int ps_table_step_pushed(const gddr_ps *ps, const void *arg, int r)
{
    const ps_stable *s = arg;
    return s->step[r].have ? 1 : ps_sync_excused(ps, r, s->rec[r].seen) ? -1 : 0;
}

static int sync_try_complete(gddr_ps *ps, ps_stable *s, int force)
{
    if (s->ncontrib == 0)
        return 0;
    int live;
    if (!ps_sync_may_complete(ps, ps_table_step_pushed, s, force, &live))
        return 0;
    if (ps->log_event)
        ps->log_event(ps, PS_PLOG_EV_TABLE_SYNC, (uint32_t)s->id, (uint64_t)live);
    int divisor = (int)s->ncontrib > live ? (int)s->ncontrib : live;
    ps_rowsum_clear(s->sum);
    int oom = 0;
    double lr = 0; /* the first push (in rank order) that brought its own lr, as for tensors */
    for (int r = 0; r < (int)ps->cfg.max_workers; r++) {
        tw_push *p = &s->step[r];
        if (!p->have && !p->mass)
            continue;
        if (lr == 0)
            lr = p->lr;
        if (ps_rowsum_add(s->sum, p->keys, p->n, p->vals) < 0)
            oom = 1;
        free(p->keys), free(p->vals);
        memset(p, 0, sizeof *p);
    }
    s->ncontrib = 0;
    s->step_opened_ms = 0;
    s->align.open_j++; /* (counts only while it is on: ps_align_push) */
    const uint64_t *keys;
    const float *sums;
    size_t n = ps_rowsum_get(s->sum, &keys, &sums);
    if (oom || ps_table_apply(s->tab, keys, n, sums, 1.0f / (float)divisor, table_lr(ps, s, lr)) < 0)
        gddr_log(GDDR_LOG_ERROR, "table '%s': out of memory in a sync step: some rows were not stepped", s->key);
    s->rows_pushed += n;
    ps_table_advance(s->tab);
    ps->versions_total++;
    return 1;
}

/* A restored open step a push is past closes as it is (ps_align_push). */
static void table_close(gddr_ps *ps, void *arg)
{
    sync_try_complete(ps, arg, 1);
}

int ps_on_push_rows(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f)
{
    const Gddr__PushRows *p = rq->push_rows;
    uint64_t id = rq->req_id;
    ps_stable *s = table_by_id(ps, p->table);
    if (!s)
        return ps_reject(ps, ident, id, GDDR_ENOKEY, "no table with id %u", p->table);
    if (f->n != 4)
        return ps_reject(ps, ident, id, GDDR_EPROTO, "a row push carries a key frame and a value frame, not %d frames",
                         f->n - 2);
    uint32_t dim = ps_table_config(s->tab)->dim;
    size_t n = (size_t)p->nkeys;
    if (p->nkeys > SIZE_MAX / 8 / dim || gddr__frame_size(f, 2) != p->nkeys * 8 ||
        p->payload_bytes != p->nkeys * dim * 4 || gddr__frame_size(f, 3) != p->payload_bytes)
        return ps_reject(ps, ident, id, GDDR_ELENGTH,
                         "row push of %llu keys x %u values: frames of %zu and %zu bytes, payload_bytes %llu",
                         (unsigned long long)p->nkeys, dim, gddr__frame_size(f, 2), gddr__frame_size(f, 3),
                         (unsigned long long)p->payload_bytes);
    uint32_t rank = rq->rank;
    uint64_t session = ps->workers[rank].session;
    tw_rec *rec = &s->rec[rank];
    if (rec->set && rec->session != session)
        memset(rec, 0, sizeof *rec); /* a new process for this rank: a fresh history */
    if (rec->set && p->step <= rec->step) {
        s->duplicates++;
        ps->duplicates++;
        send_push_reply(ps, ident, id, s, rec, 1, 0);
        return GDDR_OK;
    }
    uint64_t v = ps_table_version(s->tab);
    if (p->base_version > v)
        return ps_reject(ps, ident, id, GDDR_EVERSION, "row push based on version %llu of table '%s', which is at %llu",
                         (unsigned long long)p->base_version, s->key, (unsigned long long)v);
    if (!isfinite(p->lr) || p->lr < 0 || p->lr > 1e6)
        return ps_reject(ps, ident, id, GDDR_EINVAL, "row push to table '%s': lr %g is not in [0, 1e6]", s->key, p->lr);
    const uint64_t *keys = frame_keys(ps, f, 2, n);
    const float *g = gddr__frame_data(f, 3);
    char why[256];
    if (!keys)
        return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory");
    if (refuse_misrouted(ps, ident, id, keys, n) != GDDR_OK)
        return GDDR_EINVAL;
    int rc = ps_table_push_check(s->tab, keys, n, g, why, sizeof why);
    if (rc < 0)
        return ps_reject(ps, ident, id, rc == PS_TABLE_NONFINITE ? GDDR_ENONFINITE : GDDR_EINVAL,
                         "row push to table '%s': %s", s->key, why);
    uint64_t tau = v - p->base_version;
    double fac = 1.0 / (1.0 + ps->cfg.adadelay * (double)tau);
    int mode = ps_tensor_mode(ps, NULL) /* the server's; async in a warm-up */;
    tw_rec out = { session, p->step, 0, 0, tau, 1, 0, (uint8_t)mode, 0, 0 };
    uint64_t behind = 0; /* sync: a late push (ps_sync_place) */
    /* After a restart the aligner may close the restored step first (v
     * moves), and a push for a step that was lost (or closed) here is late
     * (sync.c ps_sync_realign). */
    uint64_t stale = mode != GDDR_PS_MODE_SYNC ? 0 :
                ps_align_push(ps, &s->align, rank, rec->set, p->step, s->ncontrib > 0, table_close, s, "table",
                              s->key);
    v = ps_table_version(s->tab);
    if (mode == GDDR_PS_MODE_SYNC) {
        /* A late push joins the open step as mass and is answered at once,
         * as for tensors (push.c). */
        out.sstep = rec->sstep;
        behind = stale ? ps_sync_place_late(&out.sstep, stale, v + 1)
                       : ps_sync_place(&out.sstep, rec->set, rec->step, p->step, v + 1,
                                       ps_sync_one_phase(ps, ps->tables->n));
        tw_push *sp = &s->step[rank];
        /* A new process whose predecessor's push of the open step is in:
         * its push joins that one (as a tensor's second push does). */
        int fold = !behind && sp->have && !rec->set;
        if (!behind && sp->have && !fold) {
            /* A second step from this rank before the first completed (a
             * worker ahead of the others): it waits its turn. */
            return ps_reject_retry(ps, ident, id, GDDR_EBUSY, 10,
                                   "row push of step %llu to table '%s': this rank's push of the open step is not applied yet",
                                   (unsigned long long)p->step, s->key);
        }
        /* Appended: the rank's late pushes (mass) and its push of the step
         * sum in it (ps_rowsum adds a key met twice). */
        uint64_t *k2 = realloc(sp->keys, (sp->n + n) * 8 + 8);
        if (k2)
            sp->keys = k2;
        float *v2 = k2 ? realloc(sp->vals, (sp->n + n) * dim * 4 + 4) : NULL;
        if (v2)
            sp->vals = v2;
        if (!k2 || !v2)
            return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory for a row push");
        memcpy(sp->keys + sp->n, keys, n * 8);
        for (size_t i = 0; i < n * dim; i++)
            sp->vals[sp->n * dim + i] = (float)fac * g[i];
        sp->n += n;
        if (!s->step_opened_ms)
            s->step_opened_ms = gddr__now_ms();
        if (sp->lr == 0)
            sp->lr = p->lr;
        if (behind) {
            sp->mass = 1;
        } else if (!fold) {
            sp->have = 1;
            s->ncontrib++;
        }
        out.sync_target = v + (behind ? 0 : 1);
        out.applied = (uint8_t)sync_try_complete(ps, s, 0);
        if (out.applied)
            out.sync_target = ps_table_version(s->tab);
    } else {
        if (ps_table_apply(s->tab, keys, n, g, 1.0f, (float)(table_lr(ps, s, p->lr) * fac)) < 0)
            return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory for rows of table '%s'", s->key);
        s->rows_pushed += n;
        ps_table_advance(s->tab);
        ps->versions_total++;
        out.applied = 1;
    }
    out.version = ps_table_version(s->tab);
    out.seen = ps->joins;
    *rec = out;
    s->pushes++;
    ps->pushes++;
    ps_worker *w = &ps->workers[rank];
    w->pushes++;
    if (p->step + 1 > w->clock)
        w->clock = p->step + 1;
    ps_stale_add(&ps->stale, tau, ps->cfg.staleness_ema_decay);
    ps_stale_add(&w->stale, tau, ps->cfg.staleness_ema_decay);
    send_push_reply(ps, ident, id, s, rec, 0, behind);
    ps_tables_release_pulls(ps);
    return GDDR_OK;
}

static ps_stable *oldest_open(gddr_ps *ps, int64_t now)
{
    struct ps_tables *ts = ps->tables;
    ps_stable *o = NULL;
    for (size_t i = 0; ts && ps_tensor_mode(ps, NULL) == GDDR_PS_MODE_SYNC && i < ts->n; i++) {
        ps_stable *s = ts->t[i];
        if (!s->ncontrib)
            continue;
        if (!s->step_opened_ms)
            s->step_opened_ms = now; /* restored open */
        if (!o || s->step_opened_ms < o->step_opened_ms)
            o = s;
    }
    return o;
}

int64_t ps_tables_sync_oldest(gddr_ps *ps, int64_t now)
{
    ps_stable *s = oldest_open(ps, now);
    return s ? s->step_opened_ms : now;
}

void ps_tables_sync_stall(gddr_ps *ps, int64_t now, int64_t lim)
{
    ps_stable *s = oldest_open(ps, now);
    if (!s || now - s->step_opened_ms <= lim)
        return;
    ps_sync_stall_log(ps, ps_table_step_pushed, s, "table", s->key, (double)(now - s->step_opened_ms) / 1000.0);
    sync_try_complete(ps, s, 1);
    for (uint32_t r = 0; r < (uint32_t)ps->cfg.max_workers; r++)
        s->rec[r].sstep = 0;
}

void ps_table_sync_replay(gddr_ps *ps, uint32_t id, int live)
{
    struct ps_tables *ts = ps->tables;
    if (!ts || id >= ts->n)
        return;
    ps->replay_live = live > 0 ? live : 1;
    sync_try_complete(ps, ts->t[id], 1);
    ps->replay_live = 0;
}

/* A table's sync steps after a restore, lined up as tensors' are (sync.c
 * says why, members.c ps_align_push does it): the step restored open
 * wanted each rank's push it holds (its exactly-once record) or its next. */
static uint64_t table_wanted(gddr_ps *ps, const void *arg, int r)
{
    (void)ps;
    const ps_stable *s = arg;
    const tw_rec *rec = &s->rec[r];
    return rec->set ? ps_align_wanted(rec->step, rec->sstep, ps_table_version(s->tab) + 1, s->step[r].have) : 0;
}

void ps_tables_sync_restored(gddr_ps *ps)
{
    struct ps_tables *ts = ps->tables;
    for (size_t i = 0; ts && i < ts->n; i++)
        ps_align_begin(ps, &ts->t[i]->align, table_wanted, ts->t[i]);
}

void ps_tables_membership_changed(gddr_ps *ps)
{
    struct ps_tables *ts = ps->tables;
    if (!ts || ps_tensor_mode(ps, NULL) != GDDR_PS_MODE_SYNC)
        return;
    for (size_t i = 0; i < ts->n; i++)
        sync_try_complete(ps, ts->t[i], 0);
    ps_tables_release_pulls(ps);
}

/* ---- life cycle (the metrics: table_metrics.c) ------------------------------ */

/* A table's metric values, in the order of the families below. */
void ps_tables_free(gddr_ps *ps)
{
    struct ps_tables *ts = ps->tables;
    if (!ts)
        return;
    for (size_t i = 0; i < ts->npulls; i++) {
        zmq_msg_close(&ts->pulls[i].ident);
        free(ts->pulls[i].keys);
    }
    for (size_t i = 0; i < ts->n; i++)
        stable_free(ts->t[i], (int)ps->cfg.max_workers);
    free(ts->t);
    free(ts->pulls);
    free(ts->kbuf);
    free(ts);
    ps->tables = NULL;
}
