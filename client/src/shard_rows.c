/* shard_rows.c -- sparse tables over several servers. The row of key k
 * lives on server gddr_row_shard(k, S) = splitmix64(k) mod S (common/
 * rowkey.h; the server refuses a key that is not its own). A pull or push
 * is sliced once by server, as ps-lite's KVWorker slices a request: every
 * server's request goes out before any answer is awaited, so a call costs
 * one round trip to the slowest server. A server whose answer failed in a
 * way a reconnect may cure is then retried on its own (the same step: a
 * push stays exactly once).
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "blas.h"
#include "client_int.h"
#include "rowkey.h"
#include "shard.h"

static int sub_fail(gddr_client *c, int s, int rc)
{
    gddr_client *sub = c->shards->sub[s];
    return gddr__set_err(c, rc, "shard %d (%s): %s", s, sub->server, sub->errmsg);
}

int gddr__shards_table_register(gddr_client *c, const char *key, uint32_t dim,
                                const gddr_table_opts *o, int *table)
{
    gddr__shards *h = c->shards;
    int first = -1;
    for (int s = 0; s < h->S; s++) {
        int t;
        int rc = h->sub[s]->be->table_register(h->sub[s], key, dim, o, &t);
        if (rc != GDDR_OK)
            return sub_fail(c, s, rc);
        if (first < 0)
            first = t;
        else if (t != first)
            return gddr__set_err(c, GDDR_ESTATE, "table '%s' has handle %d on shard 0 but %d on shard %d",
                                 key, first, t, s);
    }
    *table = first;
    return GDDR_OK;
}

/* The keys grouped by server: perm[j] is the caller's index of the j-th
 * key in server order; server s has keys [off[s], off[s] + cnt[s]). */
typedef struct split {
    size_t *off, *cnt, *perm;
    uint64_t *keys;
} split;

static void split_free(split *p)
{
    free(p->off), free(p->cnt), free(p->perm), free(p->keys);
}

static int split_keys(int S, const uint64_t *keys, size_t n, split *p)
{
    memset(p, 0, sizeof *p);
    p->off = calloc((size_t)S + 1, sizeof *p->off);
    p->cnt = calloc((size_t)S, sizeof *p->cnt);
    p->perm = malloc((n ? n : 1) * sizeof *p->perm);
    p->keys = malloc((n ? n : 1) * sizeof *p->keys);
    uint32_t *sh = malloc((n ? n : 1) * sizeof *sh);
    if (!p->off || !p->cnt || !p->perm || !p->keys || !sh) {
        free(sh);
        split_free(p);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        p->cnt[sh[i] = gddr_row_shard(keys[i], (uint32_t)S)]++;
    for (int s = 0; s < S; s++)
        p->off[s + 1] = p->off[s] + p->cnt[s];
    size_t *at = p->cnt; /* reused as a cursor, then restored */
    for (int s = 0; s < S; s++)
        at[s] = p->off[s];
    for (size_t i = 0; i < n; i++) {
        size_t j = at[sh[i]]++;
        p->perm[j] = i;
        p->keys[j] = keys[i];
    }
    for (int s = 0; s < S; s++)
        p->cnt[s] = p->off[s + 1] - p->off[s];
    free(sh);
    return 0;
}

uint32_t gddr__shards_table_dim(const gddr_client *c, int table)
{
    return gddr__rows_dim(c->shards->sub[0], table);
}

static int check_table(gddr_client *c, int table)
{
    gddr_client *s0 = c->shards->sub[0];
    if (table < 0 || table >= s0->ntb)
        return gddr__set_err(c, GDDR_ENOKEY, "no table %d (%d registered)", table, s0->ntb);
    return GDDR_OK;
}

int gddr__shards_pull_rows(gddr_client *c, int table, const uint64_t *keys, size_t n, float *out,
                           unsigned flags, uint64_t min_version, uint64_t *version)
{
    gddr__shards *h = c->shards;
    int rc = check_table(c, table);
    if (rc != GDDR_OK)
        return rc;
    uint32_t dim = h->sub[0]->tb[table].dim;
    split p;
    float *buf = malloc((n ? n : 1) * dim * sizeof *buf);
    uint64_t *tk = calloc((size_t)h->S, sizeof *tk);
    int *st = calloc((size_t)h->S, sizeof *st);
    if (!buf || !tk || !st || split_keys(h->S, keys, n, &p) < 0) {
        free(buf), free(tk), free(st);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for a pull of %zu rows", n);
    }
    /* Every server's request first, then the answers. */
    for (int s = 0; s < h->S; s++)
        if (p.cnt[s])
            st[s] = gddr__rows_pull_send(h->sub[s], table, p.keys + p.off[s], p.cnt[s],
                                         buf + p.off[s] * dim, flags, min_version, &tk[s]);
    uint64_t vmin = UINT64_MAX;
    for (int s = 0; s < h->S; s++) { /* (every answer awaited, also after a failure) */
        if (!p.cnt[s])
            continue;
        uint64_t v = 0;
        gddr_client *sub = h->sub[s];
        int r = st[s] == GDDR_OK ? gddr__rows_pull_wait(sub, table, tk[s], &v) : st[s];
        if (r != GDDR_OK && gddr__needs_reconnect(sub, r))
            r = gddr__rows_pull(sub, table, p.keys + p.off[s], p.cnt[s], buf + p.off[s] * dim, flags,
                                min_version, &v);
        if (r != GDDR_OK) {
            if (rc == GDDR_OK)
                rc = sub_fail(c, s, r);
        }
        else if (v < vmin)
            vmin = v;
    }
    if (rc == GDDR_OK) {
        for (size_t j = 0; j < n; j++)
            memcpy(out + p.perm[j] * dim, buf + j * dim, dim * sizeof *out);
        if (version)
            *version = vmin == UINT64_MAX ? 0 : vmin;
    }
    for (int s = 0; s < h->S; s++) /* the keys were lent to ZeroMQ (rows.c) */
        gddr__lent_wait(h->sub[s]);
    split_free(&p);
    free(buf), free(tk), free(st);
    return rc;
}

int gddr__shards_push_rows(gddr_client *c, int table, const uint64_t *keys, size_t n,
                           const float *grads, uint64_t *version)
{
    gddr__shards *h = c->shards;
    int rc = check_table(c, table);
    if (rc != GDDR_OK)
        return rc;
    uint32_t dim = h->sub[0]->tb[table].dim;
    /* Each server would refuse a NaN only in its own rows: refused here. */
    if (n && grads && !gddr_finite_cpu(grads, n * dim))
        return gddr__set_err(c, GDDR_ENONFINITE, "push_rows: a gradient row holds NaN or Inf");
    split p;
    float *gbuf = malloc((n ? n : 1) * dim * sizeof *gbuf);
    uint64_t *tk = calloc((size_t)h->S, sizeof *tk), *step = calloc((size_t)h->S, sizeof *step);
    int *st = calloc((size_t)h->S, sizeof *st), *sent = calloc((size_t)h->S, sizeof *sent);
    if (!gbuf || !tk || !step || !st || !sent || split_keys(h->S, keys, n, &p) < 0) {
        free(gbuf), free(tk), free(step), free(st), free(sent);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for a push of %zu rows", n);
    }
    for (size_t j = 0; j < n; j++)
        memcpy(gbuf + j * dim, grads + p.perm[j] * dim, dim * sizeof *gbuf);
    for (int s = 0; s < h->S; s++) {
        gddr_client *sub = h->sub[s];
        /* A sync step needs a push of every worker on every server, an
         * empty one included; async servers are spared the empty ones. */
        if (!p.cnt[s] && sub->info.mode != GDDR_MODE_SYNC)
            continue;
        sent[s] = 1;
        step[s] = ++sub->tb[table].step;
        st[s] = gddr__rows_push_send(sub, table, p.keys + p.off[s], p.cnt[s], gbuf + p.off[s] * dim,
                                     step[s], &tk[s]);
    }
    uint64_t vmin = UINT64_MAX;
    for (int s = 0; s < h->S; s++) { /* (every answer awaited, also after a failure) */
        if (!sent[s])
            continue;
        uint64_t v = 0;
        gddr_client *sub = h->sub[s];
        int r = st[s] == GDDR_OK ? gddr__rows_push_wait(sub, table, tk[s], &v) : st[s];
        if (r != GDDR_OK && gddr__needs_reconnect(sub, r))
            r = gddr__rows_push_at(sub, table, p.keys + p.off[s], p.cnt[s], gbuf + p.off[s] * dim,
                                   step[s], &v);
        if (r != GDDR_OK) {
            if (rc == GDDR_OK)
                rc = sub_fail(c, s, r);
        }
        else if (v < vmin)
            vmin = v;
    }
    if (rc == GDDR_OK && version)
        *version = vmin == UINT64_MAX ? 0 : vmin;
    for (int s = 0; s < h->S; s++) /* keys and gradients were lent to ZeroMQ (rows.c) */
        gddr__lent_wait(h->sub[s]);
    split_free(&p);
    free(gbuf), free(tk), free(step), free(st), free(sent);
    return rc;
}
