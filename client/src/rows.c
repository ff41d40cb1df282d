/* rows.c -- sparse tables over one server: registration, row pulls and
 * row pushes (docs/protocol.md, "Tables"). The single backend's table
 * calls; the sharded backend (shard_rows.c) drives the send/wait halves
 * on every server at once.
 *
 * Ordering: a push records the version its effect has (async: the version
 * after it; sync: the step's sync_target), and the next pull of that table
 * waits for it, so a worker always reads its own writes. A push carries
 * the version of this client's last pull as its base (its staleness).
 *
 * Frames: the keys, and a push's values, are lent to ZeroMQ (sent from
 * where they are, no copy: 64k rows x 64 floats are 16 MiB a push); the
 * call that sent them returns only once ZeroMQ let go of them
 * (gddr__lent_wait), as gddr_push does with a tensor. The sharded backend
 * drives the send halves and does the same for every server.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "rowkey.h"

/* ---- registration ---------------------------------------------------------- */

struct treg_call {
    int index;
    op res;
};

static int treg_call(gddr_client *c, void *arg)
{
    struct treg_call *a = arg;
    return gddr__register_table_one(c, a->index, c->o.timeout_ms, &a->res);
}

int gddr__rows_register(gddr_client *c, const char *key, uint32_t dim, const gddr_table_opts *o,
                        int *table)
{
    if (!key || !key[0] || strlen(key) >= sizeof c->tb[0].key || dim == 0)
        return gddr__set_err(c, GDDR_EINVAL, "table key must be 1-127 characters and dim > 0");
    for (int i = 0; i < c->ntb; i++)
        if (strcmp(c->tb[i].key, key) == 0) {
            if (c->tb[i].dim != dim)
                return gddr__set_err(c, GDDR_ELENGTH, "table '%s' has rows of %u values, not %u", key,
                                     c->tb[i].dim, dim);
            *table = i;
            return GDDR_OK;
        }
    ctable tb;
    memset(&tb, 0, sizeof tb);
    snprintf(tb.key, sizeof tb.key, "%s", key);
    tb.dim = dim;
    tb.o = *o;
    char err[256];
    if (gddr__optim_parse(o->optimizer, &tb.opt, err, sizeof err) < 0)
        return gddr__set_err(c, GDDR_EINVAL, "table '%s': %s", key, err);
    tb.o.optimizer = NULL; /* the caller's text: parsed into tb.opt, which is what is sent */
    ctable *nb = realloc(c->tb, (size_t)(c->ntb + 1) * sizeof *nb);
    if (!nb)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for table '%s'", key);
    c->tb = nb;
    c->tb[c->ntb] = tb;
    struct treg_call a = { c->ntb, { 0 } };
    int rc = gddr__with_reconnect(c, treg_call, &a);
    if (rc != GDDR_OK)
        return rc; /* (not counted: c->ntb unchanged) */
    ctable *t = &c->tb[c->ntb];
    t->sid = a.res.sid;
    t->pulled = t->need = a.res.version;
    *table = c->ntb++;
    return GDDR_OK;
}

/* ---- pulls ------------------------------------------------------------------- */

int gddr__rows_pull_send(gddr_client *c, int i, const uint64_t *keys, size_t n, float *out,
                         unsigned flags, uint64_t min_version, uint64_t *ticket)
{
    ctable *tb = &c->tb[i];
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__PullRows p = GDDR__PULL_ROWS__INIT;
    p.table = tb->sid;
    p.nkeys = n;
    p.create = !(flags & GDDR_ROWS_NOCREATE) && !c->o.observer;
    p.min_version = min_version > tb->need ? min_version : tb->need;
    p.wait_ms = (uint32_t)c->o.timeout_ms;
    rq.body_case = GDDR__REQUEST__BODY_PULL_ROWS;
    rq.pull_rows = &p;
    gddr__raw raw = { keys, n * 8, NULL, NULL };
    gddr__lend(c, &raw);
    int rc = gddr__send_req(c, &rq, &raw, 1, OP_PULL_ROWS, -1, ticket);
    if (rc == GDDR_OK) {
        op *o = gddr__op(c, *ticket);
        o->out = out;
        o->nfloats = n * tb->dim;
    }
    return rc;
}

int gddr__rows_pull_wait(gddr_client *c, int i, uint64_t ticket, uint64_t *version)
{
    op res;
    int rc = gddr__wait_op(c, ticket, -1, &res);
    if (rc != GDDR_OK)
        return rc;
    if (res.version > c->tb[i].pulled)
        c->tb[i].pulled = res.version;
    if (version)
        *version = res.version;
    return GDDR_OK;
}

struct pull_call {
    int i;
    const uint64_t *keys;
    size_t n;
    float *out;
    unsigned flags;
    uint64_t min_version, *version;
};

static int pull_call(gddr_client *c, void *arg)
{
    struct pull_call *a = arg;
    uint64_t tk;
    int rc = gddr__rows_pull_send(c, a->i, a->keys, a->n, a->out, a->flags, a->min_version, &tk);
    return rc == GDDR_OK ? gddr__rows_pull_wait(c, a->i, tk, a->version) : rc;
}

uint32_t gddr__rows_dim(const gddr_client *c, int table)
{
    return table >= 0 && table < c->ntb ? c->tb[table].dim : 0;
}

int gddr__rows_pull(gddr_client *c, int table, const uint64_t *keys, size_t n, float *out,
                    unsigned flags, uint64_t min_version, uint64_t *version)
{
    if (table < 0 || table >= c->ntb)
        return gddr__set_err(c, GDDR_ENOKEY, "no table %d (%d registered)", table, c->ntb);
    struct pull_call a = { table, keys, n, out, flags, min_version, version };
    int rc = gddr__with_reconnect(c, pull_call, &a);
    gddr__lent_wait(c); /* keys may change once we return */
    return rc;
}

/* ---- pushes ------------------------------------------------------------------ */

long gddr__rows_unique(const uint64_t *keys, size_t n, uint64_t **uk, uint32_t **first_out)
{
    *uk = NULL;
    *first_out = NULL;
    if (n < 2)
        return (long)n;
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    uint32_t *slot = malloc(cap * sizeof *slot); /* index + 1 into keys; 0 empty */
    uint32_t *first = malloc(n * sizeof *first); /* per key: its unique index */
    if (!slot || !first) {
        free(slot), free(first);
        return -1;
    }
    memset(slot, 0, cap * sizeof *slot);
    size_t nu = 0;
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)gddr_splitmix64(keys[i]) & (cap - 1);
        for (;;) {
            uint32_t s = slot[h];
            if (!s) {
                slot[h] = (uint32_t)i + 1; /* points at the key's first position */
                first[i] = (uint32_t)nu++;
                break;
            }
            if (keys[s - 1] == keys[i]) {
                first[i] = first[s - 1];
                break;
            }
            h = (h + 1) & (cap - 1);
        }
    }
    free(slot);
    if (nu == n) {
        free(first);
        return (long)n;
    }
    uint64_t *ukeys = malloc(nu * sizeof *ukeys);
    if (!ukeys) {
        free(first);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        ukeys[first[i]] = keys[i];
    *uk = ukeys;
    *first_out = first;
    return (long)nu;
}

long gddr__rows_dedup(const uint64_t *keys, size_t n, const float *g, uint32_t dim, uint64_t **uk,
                      float **ug)
{
    uint32_t *first;
    *ug = NULL;
    long nu = gddr__rows_unique(keys, n, uk, &first);
    if (nu < 0 || !*uk)
        return nu;
    float *sums = calloc((size_t)nu * dim, sizeof *sums);
    if (!sums) {
        free(first), free(*uk);
        *uk = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        float *d = sums + (size_t)first[i] * dim;
        const float *s = g + i * dim;
        for (uint32_t j = 0; j < dim; j++)
            d[j] += s[j];
    }
    free(first);
    *ug = sums;
    return nu;
}

int gddr__rows_push_send(gddr_client *c, int i, const uint64_t *keys, size_t n, const float *g,
                         uint64_t step, uint64_t *ticket)
{
    ctable *tb = &c->tb[i];
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__PushRows p = GDDR__PUSH_ROWS__INIT;
    p.table = tb->sid;
    p.nkeys = n;
    p.step = step;
    p.base_version = tb->pulled;
    p.lr = c->lr;
    p.payload_bytes = n * tb->dim * 4;
    rq.body_case = GDDR__REQUEST__BODY_PUSH_ROWS;
    rq.push_rows = &p;
    gddr__raw raws[2] = { { keys, n * 8, NULL, NULL }, { g, n * tb->dim * 4, NULL, NULL } };
    gddr__lend(c, &raws[0]);
    gddr__lend(c, &raws[1]);
    return gddr__send_req(c, &rq, raws, 2, OP_PUSH, -1, ticket);
}

int gddr__rows_push_wait(gddr_client *c, int i, uint64_t ticket, uint64_t *version)
{
    op res;
    int rc = gddr__wait_op(c, ticket, -1, &res);
    if (rc != GDDR_OK)
        return rc;
    uint64_t need = res.applied ? res.version : res.sync_target;
    if (need > c->tb[i].need)
        c->tb[i].need = need;
    if (version)
        *version = res.version;
    return GDDR_OK;
}

struct push_call {
    int i;
    const uint64_t *keys;
    size_t n;
    const float *g;
    uint64_t step, *version;
};

static int push_call(gddr_client *c, void *arg)
{
    struct push_call *a = arg;
    uint64_t tk;
    int rc = gddr__rows_push_send(c, a->i, a->keys, a->n, a->g, a->step, &tk);
    return rc == GDDR_OK ? gddr__rows_push_wait(c, a->i, tk, a->version) : rc;
}

int gddr__rows_push_at(gddr_client *c, int i, const uint64_t *keys, size_t n, const float *g,
                       uint64_t step, uint64_t *version)
{
    struct push_call a = { i, keys, n, g, step, version };
    int rc = gddr__with_reconnect(c, push_call, &a);
    gddr__lent_wait(c); /* keys and g may change (or be freed) once we return */
    return rc;
}

int gddr__rows_push(gddr_client *c, int table, const uint64_t *keys, size_t n, const float *grads,
                    uint64_t *version)
{
    if (table < 0 || table >= c->ntb)
        return gddr__set_err(c, GDDR_ENOKEY, "no table %d (%d registered)", table, c->ntb);
    /* One step per push, the same for its resends (exactly once). */
    return gddr__rows_push_at(c, table, keys, n, grads, ++c->tb[table].step, version);
}
