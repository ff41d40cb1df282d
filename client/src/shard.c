/* shard.c -- one model over several gddr-ps (docs/design.md section 10,
 * issue 10): the sharded backend (backend.h), gddr__sharded.
 *
 * A client whose `server` option lists several endpoints ("tcp://a:5555,
 * tcp://b:5555") is a router over one ordinary single-server client per
 * endpoint, its shards (gddr__single clients, single.c, driven through
 * their backend table). Everything a single-server client does -- socket,
 * hello and reconnect, exactly-once steps, heartbeat, residuals, DC-ASGD,
 * orphans, the pipeline thread -- each shard does on its own, for its
 * pieces, exactly as it does alone; the router only decides where each
 * tensor lives (shard_place.c) and slices every call once per shard that
 * holds a piece of it, one thread per shard (shard_fan.c), so a step talks
 * to all servers at once (shard_step.c).
 *
 * A piece keeps the tensor's key on its server; its GDDR hold mask hashes
 * the tensor's key and the chunk's index in the whole tensor (ctensor
 * chunk0), so which chunks are held does not change with sharding.
 *
 * Versions: each piece has its own (its server counts its updates). For a
 * split tensor the router reports the lowest of its pieces' versions, and a
 * version tag given for it is used for every piece (a lower bound: a piece
 * that was newer only looks staler). In sync mode all pieces move together.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "blas.h"
#include "gddr_hash.h"
#include "shard.h"

/* ---- open and close ------------------------------------------------------------ */

static int open_one(gddr_client *c, int s, void *arg)
{
    gddr__shards *h = c->shards;
    gddr_client_opts o = *(const gddr_client_opts *)arg;
    o.server = h->ep[s];
    o.clip_norm = 0; /* the router clips by the global norm */
    return gddr__client_open_shard(&o, s, h->S, &h->sub[s], h->why[s], sizeof h->why[s]);
}

static void shards_free(gddr_client *c)
{
    gddr__shards *h = c->shards;
    if (!h)
        return;
    gddr__fan_stop(h);
    for (int i = 0; i < h->nt; i++) {
        free(h->t[i].p);
        if (h->scaled)
            free(h->scaled[i]);
    }
    for (int g = 0; g < h->ngroups; g++)
        free(h->groups[g].shard), free(h->groups[g].sub);
    free(h->groups);
    free(h->scaled);
    free(h->t);
    free(h->th);
    free(h->rc);
    free(h->sub);
    free(h->ep);
    free(h->why);
    free(h);
    c->shards = NULL;
}

/* Closes shard s's client (NULL-safe). */
static void sub_close(gddr__shards *h, int s)
{
    if (h->sub[s]) {
        h->sub[s]->be->close(h->sub[s]);
        h->sub[s] = NULL;
    }
}

static int close_one(gddr_client *c, int s, void *arg)
{
    (void)arg;
    sub_close(c->shards, s);
    return GDDR_OK;
}

/* Closes the shards, frees the router's state (c stays). */
static void shards_close(gddr_client *c)
{
    gddr__shards *h = c->shards;
    if (h->th)
        gddr__fan(c, close_one, NULL); /* each flushes its residual: all at once */
    for (int s = 0; s < h->S; s++)
        sub_close(h, s); /* those the threads never got (open failed) */
    shards_free(c);
}

static void sharded_close(gddr_client *c)
{
    shards_close(c);
    free(c);
}

int gddr__shards_open(const gddr_client_opts *opts, gddr_client **out, char *why, size_t whylen)
{
    char (*ep)[512] = calloc(MAX_SHARDS, sizeof *ep);
    gddr_client *c = calloc(1, sizeof *c);
    gddr__shards *h = calloc(1, sizeof *h);
    int S = ep ? gddr__split_list(opts->server, ep, MAX_SHARDS) : 0;
    if (!ep || !c || !h || S < 2) {
        free(ep), free(c), free(h);
        return S < 2 && ep && c && h ? GDDR_EINVAL : GDDR_ENOMEM;
    }
    c->be = &gddr__sharded;
    c->shards = h;
    h->ep = ep;
    c->o = *opts;
    snprintf(c->server, sizeof c->server, "%s", opts->server);
    c->o.server = c->server;
    c->o.curve_server_key = c->o.curve_key_file = NULL; /* the shards keep theirs */
    c->log.fn = opts->log;
    c->log.user = opts->log_user;
    c->log.level = opts->log_level;
    h->S = S;
    h->sub = calloc((size_t)S, sizeof *h->sub);
    h->rc = calloc((size_t)S, sizeof *h->rc);
    h->why = calloc((size_t)S, sizeof *h->why);
    h->th = calloc((size_t)S, sizeof *h->th);
    int rc = gddr__fan_start(c, h->sub && h->rc && h->why && h->th ? GDDR_OK : GDDR_ENOMEM);
    if (rc != GDDR_OK) {
        shards_free(c);
        free(c);
        return rc;
    }
    rc = gddr__fan(c, open_one, (void *)opts);
    /* Every server must agree on what a chunk and a step are. */
    for (int s = 1; rc == GDDR_OK && s < S; s++) {
        gddr_server_info a = h->sub[0]->info, b = h->sub[s]->info;
        if (a.chunk != b.chunk || a.mode != b.mode)
            rc = gddr__set_err(c, GDDR_ECONFIG,
                               "servers disagree: %s has chunk %d and mode %d, %s chunk %d and mode %d",
                               h->sub[0]->server, a.chunk, a.mode, h->sub[s]->server, b.chunk, b.mode);
    }
    if (rc != GDDR_OK) {
        gddr__logf(&c->log, GDDR_LOG_ERROR, "cannot open the sharded client: %s", c->errmsg);
        if (why && whylen)
            snprintf(why, whylen, "%s", c->errmsg);
        sharded_close(c);
        return rc;
    }
    c->info = h->sub[0]->info;
    c->o.world_size = h->sub[0]->o.world_size; /* as the shards resolved it */
    gddr__logf(&c->log, GDDR_LOG_INFO, "rank %d connected to %d servers", c->info.rank, S);
    *out = c;
    return GDDR_OK;
}

/* ---- registration ------------------------------------------------------------- */

struct reg_arg {
    stensor *t;
    const float *init;
    const gddr__optim *opt;
    uint64_t *ver;     /* per piece */
};

static int reg_one(gddr_client *c, int s, void *arg)
{
    struct reg_arg *a = arg;
    gddr__shards *h = c->shards;
    uint32_t keyhash = gddr_key_hash(a->t->key);
    int chunk = h->sub[s]->info.chunk;
    for (int k = 0; k < a->t->np; k++) {
        spiece *p = &a->t->p[k];
        if (p->shard != s)
            continue;
        int rc = gddr__register_piece(h->sub[s], a->t->key, a->init + p->off, p->n, keyhash,
                                      (uint32_t)(p->off / (size_t)chunk), a->opt, &p->id,
                                      &a->ver[k]);
        if (rc != GDDR_OK)
            return rc;
    }
    return GDDR_OK;
}

static int sharded_register(gddr_client *c, const char *key, const float *init, size_t n,
                            const gddr__optim *opt, int *id, uint64_t *version)
{
    gddr__shards *h = c->shards;
    for (int i = 0; i < h->nt; i++)
        if (strcmp(h->t[i].key, key) == 0)
            return gddr__set_err(c, GDDR_EINVAL, "tensor '%s' is already registered as id %d", key, i);
    stensor *arr = realloc(h->t, (size_t)(h->nt + 1) * sizeof *arr);
    float **sc = realloc(h->scaled, (size_t)(h->nt + 1) * sizeof *sc);
    if (arr)
        h->t = arr;
    if (sc)
        h->scaled = sc;
    if (!arr || !sc)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    h->scaled[h->nt] = NULL;
    stensor *t = &h->t[h->nt];
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "%s", key);
    t->n = n;
    size_t off[MAX_SHARDS], len[MAX_SHARDS];
    int sh[MAX_SHARDS];
    t->np = gddr__shard_placement(key, n, c->info.chunk, h->S, off, len, sh);
    t->p = calloc((size_t)t->np, sizeof *t->p);
    uint64_t *ver = calloc((size_t)t->np, sizeof *ver);
    if (!t->p || !ver) {
        free(t->p), free(ver);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    }
    for (int k = 0; k < t->np; k++)
        t->p[k] = (spiece){ sh[k], -1, off[k], len[k] };
    struct reg_arg a = { t, init, opt, ver };
    int rc = gddr__fan(c, reg_one, &a);
    uint64_t v = UINT64_MAX;
    for (int k = 0; k < t->np; k++)
        if (ver[k] < v)
            v = ver[k];
    free(ver);
    if (rc != GDDR_OK) {
        free(t->p);
        return rc;
    }
    *id = h->nt++;
    if (version)
        *version = v;
    return GDDR_OK;
}

static int check_tensor(gddr_client *c, int id)
{
    if (id < 0 || id >= c->shards->nt)
        return gddr__set_err(c, GDDR_EINVAL, "no tensor with id %d", id);
    return GDDR_OK;
}

/* ---- one tensor: pull, push, tickets --------------------------------------------- */

struct one_arg {
    stensor *t;
    float *out;
    const float *grad;
    const gddr_push_tags *tags;
    uint64_t min_version;
    uint64_t *ver;     /* per piece */
};

static int pull_one(gddr_client *c, int s, void *arg)
{
    struct one_arg *a = arg;
    for (int k = 0; k < a->t->np; k++) {
        spiece *p = &a->t->p[k];
        gddr_client *sub = c->shards->sub[s];
        int rc = p->shard == s ? sub->be->pull(sub, p->id, a->out + p->off, a->min_version, &a->ver[k])
                               : GDDR_OK;
        if (rc != GDDR_OK)
            return rc;
    }
    return GDDR_OK;
}

static int push_one(gddr_client *c, int s, void *arg)
{
    struct one_arg *a = arg;
    for (int k = 0; k < a->t->np; k++) {
        spiece *p = &a->t->p[k];
        gddr_client *sub = c->shards->sub[s];
        int rc = p->shard == s ? sub->be->push(sub, p->id, a->grad + p->off, a->tags, &a->ver[k])
                               : GDDR_OK;
        if (rc != GDDR_OK)
            return rc;
    }
    return GDDR_OK;
}

static uint64_t min_of(const uint64_t *v, int n)
{
    uint64_t m = UINT64_MAX;
    for (int k = 0; k < n; k++)
        if (v[k] < m)
            m = v[k];
    return n ? m : 0;
}

static int one_tensor(gddr_client *c, int id, int (*fn)(gddr_client *, int, void *), float *out,
                      const float *grad, const gddr_push_tags *tags, uint64_t min_version,
                      uint64_t *version)
{
    int rc = check_tensor(c, id);
    if (rc != GDDR_OK)
        return rc;
    stensor *t = &c->shards->t[id];
    uint64_t ver[MAX_SHARDS] = { 0 };
    struct one_arg a = { t, out, grad, tags, min_version, ver };
    rc = gddr__fan(c, fn, &a);
    if (rc == GDDR_OK && version)
        *version = min_of(ver, t->np);
    return rc;
}

static int sharded_pull(gddr_client *c, int id, float *out, uint64_t min_version, uint64_t *version)
{
    if (!out)
        return gddr__set_err(c, GDDR_EINVAL, "pull: NULL buffer");
    return one_tensor(c, id, pull_one, out, NULL, NULL, min_version, version);
}

/* A push of a tensor split over several servers is refused here when it
 * holds NaN or Inf: each server would refuse only its own piece and apply
 * the others'. */
static int split_finite(gddr_client *c, int id, const float *grad)
{
    const stensor *t = &c->shards->t[id];
    if (t->np > 1 && !gddr_finite_cpu(grad, t->n))
        return gddr__set_err(c, GDDR_ENONFINITE, "push: the gradient of '%s' holds NaN or Inf", t->key);
    return GDDR_OK;
}

static int sharded_push(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                        uint64_t *version)
{
    if (!grad)
        return gddr__set_err(c, GDDR_EINVAL, "push: NULL gradient");
    int rc = check_tensor(c, id);
    if (rc == GDDR_OK)
        rc = split_finite(c, id, grad);
    if (rc != GDDR_OK)
        return rc;
    return one_tensor(c, id, push_one, NULL, grad, tags, 0, version);
}

/* An async pull or push of every piece, under one router ticket. */
static int shards_async(gddr_client *c, int id, float *out, const float *grad,
                        const gddr_push_tags *tags, uint64_t min_version, gddr_ticket *ticket)
{
    gddr__shards *h = c->shards;
    int rc = check_tensor(c, id);
    if (rc == GDDR_OK && !out)
        rc = split_finite(c, id, grad);
    if (rc != GDDR_OK)
        return rc;
    stensor *t = &h->t[id];
    sgroup *arr = realloc(h->groups, (size_t)(h->ngroups + 1) * sizeof *arr);
    if (!arr)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    h->groups = arr;
    sgroup *g = &h->groups[h->ngroups];
    g->n = 0;
    g->shard = calloc((size_t)t->np, sizeof *g->shard);
    g->sub = calloc((size_t)t->np, sizeof *g->sub);
    if (!g->shard || !g->sub) {
        free(g->shard), free(g->sub);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    }
    for (int k = 0; k < t->np && rc == GDDR_OK; k++) {
        spiece *p = &t->p[k];
        gddr_client *s = h->sub[p->shard];
        rc = out ? s->be->pull_async(s, p->id, out + p->off, min_version, &g->sub[g->n])
                 : s->be->push_async(s, p->id, grad + p->off, tags, &g->sub[g->n]);
        if (rc == GDDR_OK)
            g->shard[g->n++] = p->shard;
        else
            gddr__set_err(c, rc, "shard %d (%s): %s", p->shard, s->server, s->errmsg);
    }
    if (rc != GDDR_OK) {
        /* the pieces sent already: their replies are collected and dropped */
        for (int k = 0; k < g->n; k++) {
            gddr_client *s = h->sub[g->shard[k]];
            s->be->wait(s, g->sub[k], 0, NULL);
        }
        free(g->shard), free(g->sub);
        return rc;
    }
    g->ticket = ++h->next_ticket;
    h->ngroups++;
    *ticket = g->ticket;
    return GDDR_OK;
}

static int sharded_wait(gddr_client *c, gddr_ticket ticket, int timeout_ms, uint64_t *version)
{
    gddr__shards *h = c->shards;
    int gi = -1;
    for (int g = 0; g < h->ngroups; g++)
        if (h->groups[g].ticket == ticket)
            gi = g;
    if (gi < 0)
        return gddr__set_err(c, GDDR_ENOTICKET, "ticket %llu is unknown or already collected",
                             (unsigned long long)ticket);
    sgroup g = h->groups[gi];
    h->groups[gi] = h->groups[--h->ngroups];
    int rc = GDDR_OK;
    uint64_t v = UINT64_MAX;
    int64_t deadline = gddr__now_ms() + (timeout_ms < 0 ? c->o.timeout_ms : timeout_ms);
    for (int k = 0; k < g.n; k++) {
        gddr_client *s = h->sub[g.shard[k]];
        int64_t left = deadline - gddr__now_ms();
        uint64_t pv = 0;
        int r = s->be->wait(s, g.sub[k], left > 0 ? (int)left : 0, &pv);
        if (r != GDDR_OK && rc == GDDR_OK)
            rc = gddr__set_err(c, r, "shard %d (%s): %s", g.shard[k], s->server, s->errmsg);
        if (pv < v)
            v = pv;
    }
    free(g.shard), free(g.sub);
    if (rc == GDDR_OK && version)
        *version = g.n ? v : 0;
    return rc;
}

static int sharded_pull_async(gddr_client *c, int id, float *out, uint64_t min_version,
                              gddr_ticket *ticket)
{
    return out && ticket ? shards_async(c, id, out, NULL, NULL, min_version, ticket)
                         : gddr__set_err(c, GDDR_EINVAL, "pull: NULL buffer or ticket");
}

static int sharded_push_async(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                              gddr_ticket *ticket)
{
    return grad && ticket ? shards_async(c, id, NULL, grad, tags, 0, ticket)
                          : gddr__set_err(c, GDDR_EINVAL, "push: NULL gradient or ticket");
}

/* ---- whole-client calls ------------------------------------------------------------ */

static int ckpt_one(gddr_client *c, int s, void *arg)
{
    (void)arg;
    gddr_client *sub = c->shards->sub[s];
    return sub->be->checkpoint(sub);
}

static int sharded_checkpoint(gddr_client *c)
{
    return gddr__fan(c, ckpt_one, NULL);
}

static uint64_t sharded_next_step(gddr_client *c)
{
    uint64_t v = 0;
    for (int s = 0; s < c->shards->S; s++) {
        gddr_client *sub = c->shards->sub[s];
        uint64_t x = sub->be->next_step(sub);
        if (s == 0)
            v = x;
    }
    return v;
}

static int sharded_version(const gddr_client *c, int id, uint64_t *version)
{
    const gddr__shards *h = c->shards;
    if (id < 0 || id >= h->nt || !version)
        return GDDR_EINVAL;
    uint64_t v = UINT64_MAX;
    for (int k = 0; k < h->t[id].np; k++) {
        uint64_t pv = 0;
        const gddr_client *sub = h->sub[h->t[id].p[k].shard];
        int rc = sub->be->version(sub, h->t[id].p[k].id, &pv);
        if (rc != GDDR_OK)
            return rc;
        if (pv < v)
            v = pv;
    }
    *version = v;
    return GDDR_OK;
}

static void sharded_counters(const gddr_client *c, gddr_client_counters *out)
{
    const gddr__shards *h = c->shards;
    memset(out, 0, sizeof *out);
    for (int s = 0; s < h->S; s++) {
        gddr_client_counters k;
        h->sub[s]->be->counters(h->sub[s], &k);
        gddr__counters_add(out, &k);
    }
    out->steps = c->k.steps;     /* steps of the whole model */
    out->step_ns = c->k.step_ns;
}

static int sharded_stats(gddr_client *c, gddr_server_stats *out)
{
    gddr__shards *h = c->shards;
    memset(out, 0, sizeof *out);
    double st = 0, wst = 0;
    for (int s = 0; s < h->S; s++) {
        gddr_server_stats x;
        gddr_client *sub = h->sub[s];
        int rc = sub->be->stats(sub, &x);
        if (rc != GDDR_OK)
            return gddr__set_err(c, rc, "shard %d (%s): %s", s, sub->server, sub->errmsg);
        gddr__stats_add(out, &x, s, &st, &wst);
    }
    gddr__stats_done(out, st, wst);
    return GDDR_OK;
}

static int sharded_metrics(gddr_client *c, char **text)
{
    gddr__shards *h = c->shards;
    char **parts = calloc((size_t)h->S, sizeof *parts); /* NULL each, as the backends want */
    if (!parts)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    int rc = GDDR_OK;
    for (int s = 0; s < h->S && rc == GDDR_OK; s++) {
        gddr_client *sub = h->sub[s];
        if ((rc = sub->be->metrics(sub, &parts[s])) != GDDR_OK)
            gddr__set_err(c, rc, "shard %d (%s): %s", s, sub->server, sub->errmsg);
    }
    if (rc == GDDR_OK && !(*text = gddr__metrics_merge((const char *const *)parts, h->S)))
        rc = gddr__set_err(c, GDDR_ENOMEM, "no memory");
    for (int s = 0; s < h->S; s++)
        free(parts[s]);
    free(parts);
    return rc;
}

static void sharded_set_lr(gddr_client *c, double lr)
{
    gddr__shards *h = c->shards;
    atomic_store(&c->lr, lr);
    for (int s = 0; s < h->S; s++)
        h->sub[s]->be->set_lr(h->sub[s], lr);
}

static int sharded_optimizer(gddr_client *c, int id, char *buf, size_t len)
{
    gddr__shards *h = c->shards;
    if (id < 0 || id >= h->nt)
        return gddr__set_err(c, GDDR_EINVAL, "no tensor id %d", id);
    const spiece *p = &h->t[id].p[0]; /* every piece runs the same: one answer */
    gddr_client *sub = h->sub[p->shard];
    return sub->be->optimizer(sub, p->id, buf, len);
}

static int sharded_step(gddr_client *c, const float *const *grads, const float *const *computed_on,
                        const uint64_t *versions, float *const *params)
{
    return grads && params ? gddr__shards_step(c, grads, computed_on, versions, params)
                           : GDDR_EINVAL;
}

const gddr__backend gddr__sharded = {
    .reg = sharded_register,
    .set_lr = sharded_set_lr,
    .optimizer = sharded_optimizer,
    .pull = sharded_pull,
    .pull_async = sharded_pull_async,
    .push = sharded_push,
    .push_async = sharded_push_async,
    .wait = sharded_wait,
    .step = sharded_step,
    .submit = gddr__shards_submit,
    .wait_step = gddr__shards_wait_step,
    .checkpoint = sharded_checkpoint,
    .next_step = sharded_next_step,
    .version = sharded_version,
    .counters = sharded_counters,
    .stats = sharded_stats,
    .metrics = sharded_metrics,
    .close = sharded_close,
    .table_register = gddr__shards_table_register,
    .pull_rows = gddr__shards_pull_rows,
    .push_rows = gddr__shards_push_rows,
    .table_dim = gddr__shards_table_dim,
};
