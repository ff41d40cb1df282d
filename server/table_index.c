/* table_index.c -- the hash index of a sparse table (table_int.h says how
 * it is laid out), the pending keys of count and prob admission, and the
 * row sums of a sync step (ps_rowsum), all three keyed through it.
 */
#include <stdlib.h>
#include <string.h>

#include "table_int.h"

/* ---- the index --------------------------------------------------------------- */

uint64_t ps_tix_entries_for(uint64_t slots)
{
    uint64_t e = 2;
    while (e < 2 * slots)
        e <<= 1;
    return e;
}

int ps_tix_init(ps_tindex *x, uint64_t entries)
{
    x->ent = malloc(entries * sizeof *x->ent);
    if (!x->ent)
        return -1;
    x->mask = entries - 1;
    ps_tix_clear(x);
    return 0;
}

void ps_tix_free(ps_tindex *x)
{
    free(x->ent);
    x->ent = NULL;
    x->mask = 0;
}

void ps_tix_clear(ps_tindex *x)
{
    memset(x->ent, 0xff, (x->mask + 1) * sizeof *x->ent);
}

void ps_tix_insert(ps_tindex *x, uint64_t key, uint32_t slot)
{
    uint32_t tag = (uint32_t)ps_tix_hash(key);
    uint64_t i = tag & x->mask;
    while (x->ent[i] != PS_TIX_EMPTY)
        i = (i + 1) & x->mask;
    x->ent[i] = (uint64_t)tag << 32 | slot;
}

/* The position of key's entry (key present). */
static uint64_t tix_pos(const ps_tindex *x, const uint64_t *keys, size_t stride, uint64_t key)
{
    uint32_t tag = (uint32_t)ps_tix_hash(key);
    uint64_t i = tag & x->mask;
    for (;; i = (i + 1) & x->mask) {
        uint64_t e = x->ent[i];
        if ((uint32_t)(e >> 32) == tag && keys[(size_t)(uint32_t)e * stride] == key)
            return i;
    }
}

/* Backward-shift deletion: the entries after the hole that may live in it
 * (their home is not between the hole and them) move back one by one, so
 * a probe never meets a hole inside its run and no tombstone is needed. */
void ps_tix_erase(ps_tindex *x, const uint64_t *keys, size_t stride, uint64_t key)
{
    uint64_t m = x->mask, i = tix_pos(x, keys, stride, key);
    for (uint64_t j = (i + 1) & m;; j = (j + 1) & m) {
        uint64_t e = x->ent[j];
        if (e == PS_TIX_EMPTY)
            break;
        uint64_t home = (uint32_t)(e >> 32) & m;
        if (((j - home) & m) >= ((j - i) & m)) {
            x->ent[i] = e;
            i = j;
        }
    }
    x->ent[i] = PS_TIX_EMPTY;
}

void ps_tix_reslot(ps_tindex *x, uint64_t key, uint32_t from, uint32_t to)
{
    uint32_t tag = (uint32_t)ps_tix_hash(key);
    uint64_t want = (uint64_t)tag << 32 | from;
    for (uint64_t i = tag & x->mask;; i = (i + 1) & x->mask)
        if (x->ent[i] == want) {
            x->ent[i] = (uint64_t)tag << 32 | to;
            return;
        }
}

int ps_tix_rebuild(ps_tindex *x, uint64_t entries, const uint64_t *keys, size_t stride,
                   uint64_t n)
{
    ps_tindex y;
    if (ps_tix_init(&y, entries) < 0)
        return -1;
    for (uint64_t s = 0; s < n; s++)
        ps_tix_insert(&y, keys[s * stride], (uint32_t)s);
    ps_tix_free(x);
    *x = y;
    return 0;
}

/* ---- pending keys -------------------------------------------------------- */

void ps_tpend_free(ps_tpend *p)
{
    free(p->e);
    free(p->sightings);
    ps_tix_free(&p->ix);
    p->e = NULL;
    p->sightings = NULL;
    p->n = p->cap = 0;
}

int64_t ps_tpend_find(const ps_tpend *p, uint64_t key)
{
    return p->n ? ps_tix_find(&p->ix, &p->e[0].key, 2, key) : -1;
}

void ps_tpend_remove(ps_tpend *p, uint64_t i)
{
    uint64_t last = p->n - 1;
    ps_tix_erase(&p->ix, &p->e[0].key, 2, p->e[i].key);
    if (i != last) {
        ps_tix_reslot(&p->ix, p->e[last].key, (uint32_t)last, (uint32_t)i);
        p->e[i] = p->e[last];
        p->sightings[i] = p->sightings[last];
    }
    p->n--;
}

/* Room for one more: double up to the bound, then forget the key seen
 * least recently among PS_TPEND_SAMPLE drawn at random. */
static int tpend_room(ps_tpend *p)
{
    if (p->n < p->cap)
        return 0;
    if (p->cap >= p->bound) {
        uint64_t victim = 0, oldest = UINT64_MAX;
        for (int k = 0; k < PS_TPEND_SAMPLE; k++) {
            uint64_t i = (gddr_splitmix64(p->rng++) >> 32) * p->n >> 32;
            if (p->e[i].seen < oldest) {
                oldest = p->e[i].seen;
                victim = i;
            }
        }
        ps_tpend_remove(p, victim);
        return 0;
    }
    uint64_t cap = p->cap ? 2 * p->cap : 64;
    if (cap > p->bound)
        cap = p->bound;
    ps_tpend_ent *e = realloc(p->e, cap * sizeof *e);
    if (!e)
        return -1;
    p->e = e;
    uint32_t *c = realloc(p->sightings, cap * sizeof *c);
    if (!c)
        return -1;
    p->sightings = c;
    if (ps_tix_rebuild(&p->ix, ps_tix_entries_for(cap), &p->e[0].key, 2, p->n) < 0)
        return -1;
    p->cap = cap;
    return 0;
}

int64_t ps_tpend_add(ps_tpend *p, uint64_t key, uint64_t seen)
{
    if (tpend_room(p) < 0)
        return -1;
    uint64_t i = p->n++;
    p->e[i].key = key;
    p->e[i].seen = seen;
    p->sightings[i] = 0;
    ps_tix_insert(&p->ix, key, (uint32_t)i);
    return (int64_t)i;
}

size_t ps_tpend_bytes(const ps_tpend *p)
{
    return p->cap * (sizeof *p->e + sizeof *p->sightings) +
           (p->ix.ent ? (p->ix.mask + 1) * sizeof *p->ix.ent : 0);
}

/* ---- row sums ---------------------------------------------------------------- */

struct ps_rowsum {
    uint32_t dim;
    uint64_t *keys;
    float *sums;
    uint64_t n, cap;
    ps_tindex ix;
};

ps_rowsum *ps_rowsum_new(uint32_t dim)
{
    ps_rowsum *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->dim = dim;
    if (ps_tix_init(&s->ix, ps_tix_entries_for(0)) < 0) {
        free(s);
        return NULL;
    }
    return s;
}

void ps_rowsum_free(ps_rowsum *s)
{
    if (!s)
        return;
    free(s->keys);
    free(s->sums);
    ps_tix_free(&s->ix);
    free(s);
}

static int rowsum_grow(ps_rowsum *s)
{
    uint64_t cap = s->cap ? 2 * s->cap : 64;
    if (cap > PS_TABLE_MAX_SLOTS)
        return -1;
    uint64_t *k = realloc(s->keys, cap * sizeof *k);
    if (!k)
        return -1;
    s->keys = k;
    float *v = realloc(s->sums, cap * s->dim * sizeof *v);
    if (!v)
        return -1;
    s->sums = v;
    if (ps_tix_rebuild(&s->ix, ps_tix_entries_for(cap), s->keys, 1, s->n) < 0)
        return -1;
    s->cap = cap;
    return 0;
}

int ps_rowsum_add(ps_rowsum *s, const uint64_t *keys, size_t n, const float *g)
{
    size_t dim = s->dim;
    for (size_t i = 0; i < n; i++) {
        const float *gi = g + i * dim;
        int64_t at = ps_tix_find(&s->ix, s->keys, 1, keys[i]);
        if (at >= 0) {
            float *o = s->sums + (size_t)at * dim;
            for (size_t j = 0; j < dim; j++)
                o[j] += gi[j];
            continue;
        }
        if (s->n == s->cap && rowsum_grow(s) < 0)
            return -1;
        s->keys[s->n] = keys[i];
        memcpy(s->sums + s->n * dim, gi, dim * sizeof *gi);
        ps_tix_insert(&s->ix, keys[i], (uint32_t)s->n);
        s->n++;
    }
    return 0;
}

size_t ps_rowsum_get(const ps_rowsum *s, const uint64_t **keys, const float **sums)
{
    *keys = s->keys;
    *sums = s->sums;
    return s->n;
}

void ps_rowsum_clear(ps_rowsum *s)
{
    s->n = 0;
    ps_tix_clear(&s->ix);
}
