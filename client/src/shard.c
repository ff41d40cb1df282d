/* shard.c -- one model over several gddr-ps (docs/design.md section 10,
 * issue 10).
 *
 * A client whose `server` option lists several endpoints ("tcp://a:5555,
 * tcp://b:5555") is a router over one ordinary single-server client per
 * endpoint, its shards. Everything a single-server client does -- socket,
 * hello and reconnect, exactly-once steps, heartbeat, residuals, DC-ASGD,
 * orphans, the pipeline thread -- each shard does on its own, for its
 * pieces, exactly as it does today; the router only decides where each
 * tensor lives and fans every call out to the shards that hold a piece of
 * it, one thread per shard, so a step talks to all servers at once.
 *
 * Placement (stable, no coordinator): a tensor of at most SPLIT_BYTES lives
 * whole on one server, the one with the highest hash of (key, server index)
 * (rendezvous hashing: adding a server moves only the keys it wins). A
 * larger tensor is split into one run of whole chunks per server, in order.
 * A piece keeps the tensor's key on its server; its GDDR hold mask hashes
 * the tensor's key and the chunk's index in the whole tensor (ctensor
 * chunk0), so which chunks are held does not change with sharding.
 *
 * Versions: each piece has its own (its server counts its updates). For a
 * split tensor the router reports the lowest of its pieces' versions, and a
 * version tag given for it is used for every piece (a lower bound: a piece
 * that was newer only looks staler). In sync mode all pieces move together.
 *
 * Clipping is by the global norm over all tensors: the router measures it
 * and, when it clips, hands the shards a scaled copy (their own clipping is
 * off); the norm a shard reports for the dynamic tau is then the clipped
 * one. Everything else is elementwise or per tensor and so per piece.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "client_int.h"
#include "gddr_hash.h"

#define SPLIT_BYTES (1u << 20)
#define MAX_SHARDS 256

typedef struct spiece {
    int shard, id;     /* the shard's client, its tensor id there */
    size_t off, n;     /* values [off, off + n) of the tensor */
} spiece;

typedef struct stensor {
    char key[128];
    size_t n;
    int np;
    spiece *p;
} stensor;

typedef struct sgroup {    /* a ticket of the router: one per piece */
    uint64_t ticket;
    int n;
    int *shard;
    gddr_ticket *sub;
} sgroup;

struct gddr__shards {
    int S;
    gddr_client **sub;
    char (*ep)[512];       /* the endpoints, in shard order */
    char (*why)[512];      /* why a shard could not be opened */
    stensor *t;
    int nt;
    sgroup *groups;
    int ngroups;
    uint64_t next_ticket;
    float **scaled;        /* per tensor: a clipped copy of the gradient (or NULL) */
    /* fan-out: shard s > 0 runs on thread s-1, shard 0 on the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int busy, stop;
    int (*fn)(gddr_client *, int, void *);
    void *arg;
    int *rc;
};

/* ---- fan-out ------------------------------------------------------------------- */

struct shard_thread {
    gddr_client *c;
    int s;
};

static void *shard_main(void *arg)
{
    struct shard_thread *a = arg;
    gddr_client *c = a->c;
    int s = a->s;
    free(a);
    gddr__shards *h = c->shards;
    uint64_t seen = 0;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->gen == seen && !h->stop)
            pthread_cond_wait(&h->go, &h->mu);
        if (h->stop)
            break;
        seen = h->gen;
        pthread_mutex_unlock(&h->mu);
        int rc = h->fn(c, s, h->arg);
        pthread_mutex_lock(&h->mu);
        h->rc[s] = rc;
        if (--h->busy == 0)
            pthread_cond_signal(&h->done);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Runs fn(c, s, arg) for every shard at once; returns the first error (the
 * router's message then names the shard). */
static int fan(gddr_client *c, int (*fn)(gddr_client *, int, void *), void *arg)
{
    gddr__shards *h = c->shards;
    pthread_mutex_lock(&h->mu);
    h->fn = fn;
    h->arg = arg;
    h->busy = h->S - 1;
    h->gen++;
    pthread_cond_broadcast(&h->go);
    pthread_mutex_unlock(&h->mu);
    h->rc[0] = fn(c, 0, arg);
    pthread_mutex_lock(&h->mu);
    while (h->busy > 0)
        pthread_cond_wait(&h->done, &h->mu);
    pthread_mutex_unlock(&h->mu);
    for (int s = 0; s < h->S; s++)
        if (h->rc[s] != GDDR_OK)
            return gddr__set_err(c, h->rc[s], "shard %d (%s): %s", s, h->ep[s],
                                 h->sub[s] ? gddr_client_errmsg(h->sub[s])
                                 : h->why[s][0] ? h->why[s] : gddr_strerror(h->rc[s]));
    return GDDR_OK;
}

/* ---- open and close ------------------------------------------------------------ */

/* Splits "a, b,c" into trimmed endpoints; returns how many (0: none or too many). */
static int split_list(const char *list, char (*ep)[512], int max)
{
    int n = 0;
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *end = e;
        while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if (n == max || (size_t)(end - p) >= sizeof ep[0])
            return 0;
        memcpy(ep[n], p, (size_t)(end - p));
        ep[n][end - p] = 0;
        n++;
        p = e;
    }
    return n;
}

int gddr__server_count(const char *list)
{
    int n = 0, in = 0;
    for (const char *p = list; p && *p; p++) {
        if (*p == ',')
            in = 0;
        else if (*p != ' ' && *p != '\t' && !in)
            in = 1, n++;
    }
    return n;
}

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
    if (h->th) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->go);
        pthread_mutex_unlock(&h->mu);
        for (int s = 1; s < h->S; s++)
            pthread_join(h->th[s - 1], NULL);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->go);
    pthread_cond_destroy(&h->done);
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

static int close_one(gddr_client *c, int s, void *arg)
{
    (void)arg;
    gddr_client_close(&c->shards->sub[s]);
    return GDDR_OK;
}

void gddr__shards_close(gddr_client *c)
{
    gddr__shards *h = c->shards;
    if (h->th)
        fan(c, close_one, NULL); /* each flushes its residual: all at once */
    for (int s = 0; s < h->S; s++)
        gddr_client_close(&h->sub[s]); /* those the threads never got (open failed) */
    shards_free(c);
}

int gddr__shards_open(const gddr_client_opts *opts, gddr_client **out, char *why, size_t whylen)
{
    char (*ep)[512] = calloc(MAX_SHARDS, sizeof *ep);
    gddr_client *c = calloc(1, sizeof *c);
    gddr__shards *h = calloc(1, sizeof *h);
    int S = ep ? split_list(opts->server, ep, MAX_SHARDS) : 0;
    if (!ep || !c || !h || S < 2) {
        free(ep), free(c), free(h);
        return S < 2 && ep && c && h ? GDDR_EINVAL : GDDR_ENOMEM;
    }
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
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->go, NULL);
    pthread_cond_init(&h->done, NULL);
    int rc = h->sub && h->rc && h->why && h->th ? GDDR_OK : GDDR_ENOMEM;
    for (int s = 1; rc == GDDR_OK && s < S; s++) {
        struct shard_thread *a = malloc(sizeof *a);
        if (a) {
            a->c = c;
            a->s = s;
        }
        if (!a || pthread_create(&h->th[s - 1], NULL, shard_main, a) != 0) {
            free(a);
            /* the threads started so far are joined by shards_free */
            h->S = s;
            rc = GDDR_ENOMEM;
            break;
        }
    }
    if (rc != GDDR_OK) {
        shards_free(c);
        free(c);
        return rc;
    }
    rc = fan(c, open_one, (void *)opts);
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
        gddr__shards_close(c);
        free(c);
        return rc;
    }
    c->info = h->sub[0]->info;
    c->o.world_size = h->sub[0]->o.world_size; /* as the shards resolved it */
    gddr__logf(&c->log, GDDR_LOG_INFO, "rank %d connected to %d servers", c->info.rank, S);
    *out = c;
    return GDDR_OK;
}

/* ---- placement and registration ------------------------------------------------ */

/* The server a whole tensor lives on: rendezvous hashing over the indexes. */
static int owner_of(const char *key, int S)
{
    uint32_t k = gddr_key_hash(key);
    int best = 0;
    uint64_t top = 0;
    for (int s = 0; s < S; s++) {
        uint64_t w = gddr__mix64(((uint64_t)k << 32 | (uint32_t)s) ^ 0x5851f42d4c957f2dull);
        if (s == 0 || w > top)
            top = w, best = s;
    }
    return best;
}

int gddr__shard_placement(const char *key, size_t n, int chunk, int S, size_t *off, size_t *len,
                          int *shard)
{
    if (n * 4 <= SPLIT_BYTES || chunk <= 0) {
        off[0] = 0;
        len[0] = n;
        shard[0] = owner_of(key, S);
        return 1;
    }
    size_t nch = (n + (size_t)chunk - 1) / (size_t)chunk;
    int np = 0;
    for (int s = 0; s < S; s++) {
        size_t c0 = nch * (size_t)s / (size_t)S, c1 = nch * (size_t)(s + 1) / (size_t)S;
        if (c1 == c0)
            continue;
        size_t lo = c0 * (size_t)chunk, hi = c1 * (size_t)chunk < n ? c1 * (size_t)chunk : n;
        off[np] = lo;
        len[np] = hi - lo;
        shard[np] = s;
        np++;
    }
    return np;
}

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

int gddr__shards_register(gddr_client *c, const char *key, const float *init, size_t n,
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
    int rc = fan(c, reg_one, &a);
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
        int rc = p->shard == s ? gddr_pull(c->shards->sub[s], p->id, a->out + p->off, a->min_version,
                                           &a->ver[k])
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
        int rc = p->shard == s ? gddr_push_ex(c->shards->sub[s], p->id, a->grad + p->off, a->tags,
                                              &a->ver[k])
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
    rc = fan(c, fn, &a);
    if (rc == GDDR_OK && version)
        *version = min_of(ver, t->np);
    return rc;
}

int gddr__shards_pull(gddr_client *c, int id, float *out, uint64_t min_version, uint64_t *version)
{
    return one_tensor(c, id, pull_one, out, NULL, NULL, min_version, version);
}

int gddr__shards_push(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                      uint64_t *version)
{
    return one_tensor(c, id, push_one, NULL, grad, tags, 0, version);
}

/* An async pull or push of every piece, under one router ticket. */
int gddr__shards_async(gddr_client *c, int id, float *out, const float *grad,
                       const gddr_push_tags *tags, uint64_t min_version, gddr_ticket *ticket)
{
    gddr__shards *h = c->shards;
    int rc = check_tensor(c, id);
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
        rc = out ? gddr_pull_async(s, p->id, out + p->off, min_version, &g->sub[g->n])
                 : gddr_push_async(s, p->id, grad + p->off, tags, &g->sub[g->n]);
        if (rc == GDDR_OK)
            g->shard[g->n++] = p->shard;
        else
            gddr__set_err(c, rc, "shard %d (%s): %s", p->shard, s->server, gddr_client_errmsg(s));
    }
    if (rc != GDDR_OK) {
        /* the pieces sent already: their replies are collected and dropped */
        for (int k = 0; k < g->n; k++)
            gddr_wait(h->sub[g->shard[k]], g->sub[k], 0, NULL);
        free(g->shard), free(g->sub);
        return rc;
    }
    g->ticket = ++h->next_ticket;
    h->ngroups++;
    *ticket = g->ticket;
    return GDDR_OK;
}

int gddr__shards_wait(gddr_client *c, gddr_ticket ticket, int timeout_ms, uint64_t *version)
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
        int r = gddr_wait(s, g.sub[k], left > 0 ? (int)left : 0, &pv);
        if (r != GDDR_OK && rc == GDDR_OK)
            rc = gddr__set_err(c, r, "shard %d (%s): %s", g.shard[k], s->server, gddr_client_errmsg(s));
        if (pv < v)
            v = pv;
    }
    free(g.shard), free(g.sub);
    if (rc == GDDR_OK && version)
        *version = g.n ? v : 0;
    return rc;
}

/* ---- steps ------------------------------------------------------------------------ */

/* Per-shard views of a step's arrays (pieces in each shard's order). */
struct step_arg {
    const float *const *grads;
    const float *const *on;
    const uint64_t *versions;
    float *const *params;
    int submit, wait;
};

static int step_one(gddr_client *c, int s, void *arg)
{
    struct step_arg *a = arg;
    gddr__shards *h = c->shards;
    gddr_client *sub = h->sub[s];
    if (sub->nt == 0)
        return GDDR_OK; /* holds nothing */
    const float **g = calloc((size_t)sub->nt, sizeof *g), **on = calloc((size_t)sub->nt, sizeof *on);
    float **p = calloc((size_t)sub->nt, sizeof *p);
    uint64_t *v = calloc((size_t)sub->nt, sizeof *v);
    int rc = g && on && p && v ? GDDR_OK : gddr__set_err(sub, GDDR_ENOMEM, "no memory");
    for (int i = 0; rc == GDDR_OK && i < h->nt; i++)
        for (int k = 0; k < h->t[i].np; k++) {
            spiece *q = &h->t[i].p[k];
            if (q->shard != s)
                continue;
            if (a->grads)
                g[q->id] = a->grads[i] + q->off;
            if (a->on)
                on[q->id] = a->on[i] ? a->on[i] + q->off : NULL;
            if (a->versions)
                v[q->id] = a->versions[i];
            if (a->params)
                p[q->id] = a->params[i] + q->off;
        }
    if (rc == GDDR_OK) {
        if (a->submit)
            rc = gddr_step_submit(sub, g);
        else if (a->wait)
            rc = gddr_step_wait(sub, p);
        else
            rc = gddr_step_from(sub, g, a->on ? on : NULL, a->versions ? v : NULL, p);
    }
    free(g), free(on), free(p), free(v);
    return rc;
}

/* Clipping by the global norm: the gradients the shards get (the caller's,
 * or scaled copies when the norm is above clip_norm). */
static int clip_global(gddr_client *c, const float *const *grads, const float **use)
{
    gddr__shards *h = c->shards;
    for (int i = 0; i < h->nt; i++)
        use[i] = grads[i];
    if (c->o.clip_norm <= 0)
        return GDDR_OK;
    double total = 0;
    for (int i = 0; i < h->nt; i++) {
        double nrm = gddr_nrm2_cpu(grads[i], h->t[i].n);
        total += nrm * nrm;
    }
    total = sqrt(total);
    if (!isfinite(total))
        return gddr__set_err(c, GDDR_ENONFINITE, "step: a gradient holds NaN or Inf");
    if (total <= c->o.clip_norm)
        return GDDR_OK;
    for (int i = 0; i < h->nt; i++) {
        if (!h->scaled[i] && !(h->scaled[i] = malloc(h->t[i].n * 4)))
            return gddr__set_err(c, GDDR_ENOMEM, "no memory");
        memcpy(h->scaled[i], grads[i], h->t[i].n * 4);
        gddr_scal_cpu(h->scaled[i], h->t[i].n, (float)(c->o.clip_norm / total));
        use[i] = h->scaled[i];
    }
    return GDDR_OK;
}

static int check_steps(gddr_client *c, const float *const *grads, float *const *params)
{
    gddr__shards *h = c->shards;
    if (h->nt == 0)
        return gddr__set_err(c, GDDR_ESTATE, "step: no tensor registered");
    for (int i = 0; i < h->nt; i++) {
        if (grads && !grads[i])
            return gddr__set_err(c, GDDR_EINVAL, "step: NULL gradient for '%s'", h->t[i].key);
        if (params && !params[i])
            return gddr__set_err(c, GDDR_EINVAL, "step: NULL parameters for '%s'", h->t[i].key);
        if (grads && gddr_cuda_is_device_ptr(grads[i]))
            return gddr__set_err(c, GDDR_ENOTSUP, "step: device gradients with several servers");
    }
    return GDDR_OK;
}

int gddr__shards_step(gddr_client *c, const float *const *grads, const float *const *computed_on,
                      const uint64_t *versions, float *const *params)
{
    int rc = check_steps(c, grads, params);
    if (rc != GDDR_OK)
        return rc;
    const float **use = calloc((size_t)c->shards->nt, sizeof *use);
    if (!use)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    int64_t t0 = gddr__now_ms();
    rc = clip_global(c, grads, use);
    if (rc == GDDR_OK) {
        struct step_arg a = { use, computed_on, versions, params, 0, 0 };
        rc = fan(c, step_one, &a);
    }
    free(use);
    if (rc == GDDR_OK) {
        c->k.steps++;
        c->k.step_ns += (uint64_t)(gddr__now_ms() - t0) * 1000000u;
    }
    return rc;
}

int gddr__shards_submit(gddr_client *c, const float *const *grads)
{
    int rc = check_steps(c, grads, NULL);
    if (rc != GDDR_OK)
        return rc;
    const float **use = calloc((size_t)c->shards->nt, sizeof *use);
    if (!use)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    rc = clip_global(c, grads, use);
    if (rc == GDDR_OK) {
        struct step_arg a = { use, NULL, NULL, NULL, 1, 0 };
        rc = fan(c, step_one, &a); /* each shard copies into its own ring */
    }
    free(use);
    return rc;
}

int gddr__shards_wait_step(gddr_client *c, float *const *params)
{
    int rc = check_steps(c, NULL, params);
    if (rc != GDDR_OK)
        return rc;
    struct step_arg a = { NULL, NULL, NULL, params, 0, 1 };
    rc = fan(c, step_one, &a);
    if (rc == GDDR_OK)
        c->k.steps++;
    return rc;
}

/* ---- whole-client calls ------------------------------------------------------------ */

static int ckpt_one(gddr_client *c, int s, void *arg)
{
    (void)arg;
    return gddr_request_checkpoint(c->shards->sub[s]);
}

int gddr__shards_checkpoint(gddr_client *c)
{
    return fan(c, ckpt_one, NULL);
}

uint64_t gddr__shards_next_step(gddr_client *c)
{
    uint64_t v = 0;
    for (int s = 0; s < c->shards->S; s++) {
        uint64_t x = gddr_next_step(c->shards->sub[s]);
        if (s == 0)
            v = x;
    }
    return v;
}

int gddr__shards_version(const gddr_client *c, int id, uint64_t *version)
{
    const gddr__shards *h = c->shards;
    if (id < 0 || id >= h->nt || !version)
        return GDDR_EINVAL;
    uint64_t v = UINT64_MAX;
    for (int k = 0; k < h->t[id].np; k++) {
        uint64_t pv = 0;
        int rc = gddr_tensor_version(h->sub[h->t[id].p[k].shard], h->t[id].p[k].id, &pv);
        if (rc != GDDR_OK)
            return rc;
        if (pv < v)
            v = pv;
    }
    *version = v;
    return GDDR_OK;
}

void gddr__shards_counters(const gddr_client *c, gddr_client_counters *out)
{
    const gddr__shards *h = c->shards;
    memset(out, 0, sizeof *out);
    for (int s = 0; s < h->S; s++) {
        gddr_client_counters k;
        gddr_client_counters_get(h->sub[s], &k);
        out->pushes += k.pushes;
        out->pulls += k.pulls;
        out->bytes_pushed += k.bytes_pushed;
        out->bytes_pulled += k.bytes_pulled;
        out->values_pushed += k.values_pushed;
        out->reconnects += k.reconnects;
        out->staleness_sum += k.staleness_sum;
        out->orphans_received += k.orphans_received;
        out->tau_sum += k.tau_sum;
        out->tau_count += k.tau_count;
    }
    out->steps = c->k.steps;     /* steps of the whole model */
    out->step_ns = c->k.step_ns;
}

int gddr__shards_stats(gddr_client *c, gddr_server_stats *out)
{
    gddr__shards *h = c->shards;
    memset(out, 0, sizeof *out);
    double st = 0, wst = 0;
    for (int s = 0; s < h->S; s++) {
        gddr_server_stats x;
        int rc = gddr_server_stats_get(h->sub[s], &x);
        if (rc != GDDR_OK)
            return gddr__set_err(c, rc, "shard %d (%s): %s", s, h->sub[s]->server,
                                 gddr_client_errmsg(h->sub[s]));
        out->pushes += x.pushes;
        out->pulls += x.pulls;
        out->rejected += x.rejected;
        out->versions_total += x.versions_total;
        st += x.staleness_mean * (double)x.pushes;
        wst += x.worker_staleness_mean * (double)x.worker_pushes;
        out->staleness_ema = x.staleness_ema > out->staleness_ema ? x.staleness_ema : out->staleness_ema;
        if (x.staleness_max > out->staleness_max)
            out->staleness_max = x.staleness_max;
        for (int b = 0; b < 17; b++)
            out->staleness_hist[b] += x.staleness_hist[b];
        out->worker_pushes += x.worker_pushes;
        if (s == 0 || x.live_workers < out->live_workers)
            out->live_workers = x.live_workers;
        if (s == 0 || x.tau < out->tau)
            out->tau = x.tau;
        out->mode = x.mode;
        out->epoch ^= x.epoch;
    }
    out->staleness_mean = out->pushes ? st / (double)out->pushes : 0;
    out->worker_staleness_mean = out->worker_pushes ? wst / (double)out->worker_pushes : 0;
    return GDDR_OK;
}

int gddr__shards_metrics(gddr_client *c, char **text)
{
    gddr__shards *h = c->shards;
    char **parts = calloc((size_t)h->S, sizeof *parts);
    if (!parts)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    int rc = GDDR_OK;
    for (int s = 0; s < h->S && rc == GDDR_OK; s++)
        if ((rc = gddr_server_metrics_text(h->sub[s], &parts[s])) != GDDR_OK)
            gddr__set_err(c, rc, "shard %d (%s): %s", s, h->sub[s]->server,
                          gddr_client_errmsg(h->sub[s]));
    if (rc == GDDR_OK && !(*text = gddr__metrics_merge((const char *const *)parts, h->S)))
        rc = gddr__set_err(c, GDDR_ENOMEM, "no memory");
    for (int s = 0; s < h->S; s++)
        free(parts[s]);
    free(parts);
    return rc;
}

/* Prometheus texts of several servers as one: each sample line gets a
 * shard="I" label; a HELP or TYPE line is kept once (the first server's).
 * Series of different shards then differ by that label, so the text stays
 * valid exposition. */
char *gddr__metrics_merge(const char *const *texts, int n)
{
    size_t cap = 64;
    for (int s = 0; s < n; s++)
        cap += strlen(texts[s]) * 2 + 4096;
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    for (int s = 0; s < n; s++) {
        const char *p = texts[s];
        while (*p) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (p[0] == '#') {
                if (s == 0)
                    o += sprintf(o, "%.*s\n", (int)len, p);
            } else if (len) {
                size_t name = strcspn(p, "{ ");
                if (name > len)
                    name = len;
                if (p[name] == '{')
                    o += sprintf(o, "%.*s{shard=\"%d\",%.*s\n", (int)name, p, s,
                                 (int)(len - name - 1), p + name + 1);
                else
                    o += sprintf(o, "%.*s{shard=\"%d\"}%.*s\n", (int)name, p, s, (int)(len - name),
                                 p + name);
            }
            p += len + (e ? 1 : 0);
        }
    }
    *o = 0;
    return out;
}

void gddr__shards_set_lr(gddr_client *c, double lr)
{
    gddr__shards *h = c->shards;
    for (int s = 0; s < h->S; s++)
        gddr_set_lr(h->sub[s], lr);
}

int gddr__shards_optimizer(gddr_client *c, int id, char *buf, size_t len)
{
    gddr__shards *h = c->shards;
    if (id < 0 || id >= h->nt)
        return gddr__set_err(c, GDDR_EINVAL, "no tensor id %d", id);
    const spiece *p = &h->t[id].p[0]; /* every piece runs the same: one answer */
    return gddr_tensor_optimizer(h->sub[p->shard], p->id, buf, len);
}
