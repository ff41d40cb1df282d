/* table.c -- a sparse table's rows: created on first touch (admission
 * permitting), read, stepped, evicted (row_ttl by an incremental sweep,
 * max_rows by sampled LRU), checkpointed. table.h has the contract;
 * table_int.h the layout.
 *
 * Rows are dense in slots 0..rows-1: a removal moves the last row into the
 * hole, so a pull never skips holes, a sample of live rows is a random slot
 * number and a checkpoint is a walk of the arrays.
 */
#include <stdlib.h>
#include <string.h>

#include "table_int.h"

/* Sampled LRU: of this many live rows drawn at random (with repetition),
 * the least recently touched goes. Redis draws 5; with 16 a row goes only
 * when all 16 draws are at least as recent as it, so a hot set that is a
 * tenth of the rows loses a row to an eviction with probability 1e-16. */
#define LRU_SAMPLE 16
/* The ttl sweep checks at least this many slots per advance. */
#define SWEEP_MIN 16
/* Pull prefetch distance: the index entry of the key this far ahead. */
#define PREFETCH 8
#define LRU_SALT 0x6c72752073616d70ull /* "lru samp" */

/* ps_table_view_get hands these out as pairs of uint64. */
_Static_assert(sizeof(ps_tmeta) == 16 && sizeof(ps_tpend_ent) == 16, "meta, pending: two u64");

static uint64_t min_cap(uint64_t a, uint64_t b)
{
    return a == 0 ? b : b == 0 ? a : a < b ? a : b;
}

int ps_table_new(const ps_table_conf *c, uint64_t *server_rows, uint64_t server_max_rows,
                 ps_table **out)
{
    ps_table *t = calloc(1, sizeof *t);
    if (!t)
        return -1;
    t->c = *c;
    t->nstate = ps_trow_nstate(c);
    t->server_rows = server_rows;
    t->server_max = server_max_rows;
    t->hard = min_cap(min_cap(c->max_rows, server_max_rows), PS_TABLE_MAX_SLOTS);
    t->cap = t->hard < 16 ? t->hard : 16;
    t->pend.bound = c->max_rows > (1u << 20) ? c->max_rows : (1u << 20);
    t->pend.rng = gddr_splitmix64(c->init_seed ^ LRU_SALT ^ 1);
    size_t d = c->dim;
    t->w = malloc(t->cap * d * sizeof *t->w);
    t->s = t->nstate ? malloc(t->cap * d * t->nstate * sizeof *t->s) : NULL;
    t->meta = malloc(t->cap * sizeof *t->meta);
    t->steps = malloc(t->cap * sizeof *t->steps);
    t->dirty = calloc((t->cap + 63) / 64, 8);
    t->scratch = calloc(1, sizeof *t->scratch);
    if (!t->w || (t->nstate && !t->s) || !t->meta || !t->steps || !t->dirty || !t->scratch ||
        ps_tix_init(&t->ix, ps_tix_entries_for(t->cap)) < 0) {
        ps_table_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void ps_table_set_server_bytes(ps_table *t, uint64_t *server_bytes, uint64_t max_bytes)
{
    t->row_bytes = ps_table_row_bytes(&t->c);
    if (server_bytes)
        *server_bytes += t->rows * t->row_bytes;
    t->server_bytes = server_bytes;
    t->server_max_bytes = max_bytes;
}

void ps_table_free(ps_table *t)
{
    if (!t)
        return;
    if (t->server_rows)
        *t->server_rows -= t->rows;
    if (t->server_bytes)
        *t->server_bytes -= t->rows * t->row_bytes;
    free(t->w);
    free(t->s);
    free(t->meta);
    free(t->steps);
    free(t->dirty);
    ps_tix_free(&t->ix);
    ps_tpend_free(&t->pend);
    if (t->scratch)
        ps_tix_free(t->scratch);
    free(t->scratch);
    free(t);
}

const ps_table_conf *ps_table_config(const ps_table *t)
{
    return &t->c;
}

size_t ps_table_bytes(const ps_table *t)
{
    size_t d = t->c.dim;
    size_t slots = t->cap * (d * sizeof(float) * (1 + t->nstate) + sizeof(ps_tmeta) +
                             sizeof(uint32_t));
    size_t scratch = sizeof *t->scratch + (t->scratch->ent ? (t->scratch->mask + 1) * 8 : 0);
    return sizeof *t + slots + (t->cap + 63) / 64 * 8 + (t->ix.mask + 1) * sizeof *t->ix.ent +
           ps_tpend_bytes(&t->pend) + scratch;
}

uint64_t ps_table_version(const ps_table *t)
{
    return t->version;
}

void ps_table_set_version(ps_table *t, uint64_t v)
{
    t->version = v;
}

void ps_table_counts_get(const ps_table *t, ps_table_counts *out)
{
    *out = t->n;
    out->rows = t->rows;
    out->pending = t->pend.n;
}

/* ---- slots ------------------------------------------------------------------- */

static float *row_w(const ps_table *t, uint64_t s)
{
    return t->w + s * t->c.dim;
}

static float *row_s(const ps_table *t, uint64_t s)
{
    return t->nstate ? t->s + s * t->c.dim * t->nstate : NULL;
}

/* Doubles the slot arrays (up to hard) and rebuilds the index for them. An
 * array that grew before another failed keeps its size until the next
 * growth (its bytes are not counted meanwhile). */
static int grow(ps_table *t)
{
    uint64_t cap = 2 * t->cap < t->hard ? 2 * t->cap : t->hard;
    size_t d = t->c.dim;
    float *w = realloc(t->w, cap * d * sizeof *w);
    if (!w)
        return -1;
    t->w = w;
    if (t->nstate) {
        float *s = realloc(t->s, cap * d * t->nstate * sizeof *s);
        if (!s)
            return -1;
        t->s = s;
    }
    ps_tmeta *m = realloc(t->meta, cap * sizeof *m);
    if (!m)
        return -1;
    t->meta = m;
    uint32_t *st = realloc(t->steps, cap * sizeof *st);
    if (!st)
        return -1;
    t->steps = st;
    uint64_t *db = realloc(t->dirty, (cap + 63) / 64 * 8);
    if (!db)
        return -1;
    memset(db + (t->cap + 63) / 64, 0, ((cap + 63) / 64 - (t->cap + 63) / 64) * 8);
    t->dirty = db;
    uint64_t e = ps_tix_entries_for(cap);
    if (e != t->ix.mask + 1 && ps_tix_rebuild(&t->ix, e, &t->meta[0].key, 2, t->rows) < 0)
        return -1;
    t->cap = cap;
    return 0;
}

static int expired(const ps_table *t, uint64_t s)
{
    uint64_t touched = t->meta[s].touched;
    return t->c.row_ttl && touched < t->version && t->version - touched > t->c.row_ttl;
}

/* Removes the row of slot s; the last row moves into s. */
static void remove_slot(ps_table *t, uint64_t s)
{
    uint64_t last = t->rows - 1;
    size_t d = t->c.dim;
    ps_tix_erase(&t->ix, &t->meta[0].key, 2, t->meta[s].key);
    if (s != last) {
        ps_tix_reslot(&t->ix, t->meta[last].key, (uint32_t)last, (uint32_t)s);
        memcpy(row_w(t, s), row_w(t, last), d * sizeof(float));
        if (t->nstate)
            memcpy(row_s(t, s), row_s(t, last), d * t->nstate * sizeof(float));
        t->meta[s] = t->meta[last];
        t->steps[s] = t->steps[last];
        if (ps_tbit(t->dirty, last))
            ps_tbit_set(t->dirty, s);
        else
            ps_tbit_clr(t->dirty, s);
    }
    ps_tbit_clr(t->dirty, last);
    t->rows--;
    if (t->server_rows)
        (*t->server_rows)--;
    if (t->server_bytes)
        *t->server_bytes -= t->row_bytes;
}

/* After a removal from slot s: a row moved into s behind the ttl sweep's
 * cursor would miss this pass, so it is checked here instead (what keeps
 * the bound of table.h: every row present throughout a pass is checked in
 * it). */
static void check_moved(ps_table *t, uint64_t s)
{
    while (s < t->sweep && s < t->rows && expired(t, s)) {
        t->n.evicted_ttl++;
        remove_slot(t, s);
    }
}

static void evict(ps_table *t, uint64_t s, int ttl)
{
    if (ttl)
        t->n.evicted_ttl++;
    else
        t->n.evicted_cap++;
    remove_slot(t, s);
    check_moved(t, s);
}

static uint64_t lru_victim(ps_table *t)
{
    uint64_t victim = 0, oldest = UINT64_MAX;
    for (int k = 0; k < LRU_SAMPLE; k++) {
        uint64_t r = gddr_splitmix64(t->c.init_seed ^ LRU_SALT ^ (t->rng++ << 1));
        uint64_t s = (r >> 32) * t->rows >> 32;
        if (t->meta[s].touched < oldest) {
            oldest = t->meta[s].touched;
            victim = s;
        }
    }
    return victim;
}

/* Room for one more row: evictions while over a cap, then growth.
 * 0, 1 (refused: the server is full and this table has no row to give
 * back) or -1 (no memory). */
static int make_room(ps_table *t)
{
    for (;;) {
        int over = (t->c.max_rows && t->rows >= t->c.max_rows) ||
                   (t->server_rows && t->server_max && *t->server_rows >= t->server_max) ||
                   (t->server_bytes && t->server_max_bytes &&
                    *t->server_bytes + t->row_bytes > t->server_max_bytes);
        if (!over)
            break;
        if (t->rows == 0)
            return 1;
        evict(t, lru_victim(t), 0);
    }
    if (t->rows == t->cap)
        return t->cap < t->hard ? grow(t) : 1;
    return 0;
}

/* A new row for key (absent): values w or the initial ones, state s1, s2
 * or the initial one. The slot, or -1 (no memory), or -2 (refused). */
static int64_t create(ps_table *t, uint64_t key, const float *w, const float *s1,
                      const float *s2)
{
    int r = make_room(t);
    if (r)
        return r < 0 ? -1 : -2;
    uint64_t s = t->rows++;
    size_t d = t->c.dim;
    t->meta[s].key = key;
    t->meta[s].touched = t->version;
    t->steps[s] = 0;
    ps_tbit_set(t->dirty, s);
    if (w)
        memcpy(row_w(t, s), w, d * sizeof(float));
    else
        ps_table_init_row(&t->c, key, row_w(t, s));
    float *st = row_s(t, s);
    if (st) {
        ps_trow_init_state(&t->c, st);
        if (s1)
            memcpy(st, s1, d * sizeof(float));
        if (s2 && t->nstate == 2)
            memcpy(st + d, s2, d * sizeof(float));
    }
    ps_tix_insert(&t->ix, key, (uint32_t)s);
    t->n.created++;
    if (t->server_rows)
        (*t->server_rows)++;
    if (t->server_bytes)
        *t->server_bytes += t->row_bytes;
    return (int64_t)s;
}

static int64_t find(const ps_table *t, uint64_t key)
{
    return ps_tix_find(&t->ix, &t->meta[0].key, 2, key);
}

/* ---- admission ------------------------------------------------------------- */

/* A training pull's sighting of key (no row): 1 admitted, 0 not yet, -1
 * no memory. The pending entry goes once the row exists (admitted). */
static int sighting(ps_table *t, uint64_t key, int64_t *pend)
{
    *pend = -1;
    if (t->c.admit == PS_TADMIT_ALWAYS)
        return 1;
    int64_t i = ps_tpend_find(&t->pend, key);
    if (i < 0 && (i = ps_tpend_add(&t->pend, key, t->version)) < 0)
        return -1;
    *pend = i;
    uint32_t *n = &t->pend.sightings[i];
    if (*n < UINT32_MAX)
        (*n)++;
    t->pend.e[i].seen = t->version;
    if (t->c.admit == PS_TADMIT_COUNT)
        return *n >= t->c.admit_count;
    return ps_trow_admit_prob(t->c.init_seed, key, *n, t->c.admit_prob);
}

/* ---- pull, apply --------------------------------------------------------- */

/* Always inlined: as a function of its own GCC finds it free of side
 * effects and drops every call (the prefetch with it). */
static inline __attribute__((always_inline)) void prefetch_key(const ps_table *t,
                                                               uint64_t key)
{
    __builtin_prefetch(&t->ix.ent[(uint32_t)ps_tix_hash(key) & t->ix.mask]);
}

/* A training pull of key without a row: the slot of its new row, or -2
 * (not admitted, or refused), or -1 (no memory). */
static int64_t pull_new(ps_table *t, uint64_t key)
{
    int64_t pend;
    int a = sighting(t, key, &pend);
    if (a <= 0)
        return a < 0 ? -1 : -2;
    int64_t s = create(t, key, NULL, NULL, NULL);
    if (s >= 0 && pend >= 0) /* create leaves the pending keys alone */
        ps_tpend_remove(&t->pend, (uint64_t)pend);
    return s;
}

int ps_table_pull(ps_table *t, const uint64_t *keys, size_t n, int create_, float *out,
                  size_t *created)
{
    size_t d = t->c.dim, made = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + PREFETCH < n)
            prefetch_key(t, keys[i + PREFETCH]);
        float *o = out + i * d;
        int64_t s = find(t, keys[i]);
        if (s < 0 && create_) {
            s = pull_new(t, keys[i]);
            if (s == -1)
                rc = -1;
            else if (s >= 0)
                made++;
        }
        if (s >= 0) {
            memcpy(o, row_w(t, (uint64_t)s), d * sizeof(float));
            t->meta[s].touched = t->version;
        } else if (create_) {
            ps_table_init_row(&t->c, keys[i], o);
        } else {
            memset(o, 0, d * sizeof(float));
        }
        if (rc)
            break;
    }
    if (created)
        *created = made;
    return rc;
}

long ps_table_apply(ps_table *t, const uint64_t *keys, size_t n, const float *g, float scale,
                    float lr)
{
    size_t d = t->c.dim;
    long stepped = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + PREFETCH < n)
            prefetch_key(t, keys[i + PREFETCH]);
        int64_t s = find(t, keys[i]);
        if (s < 0 && t->c.admit == PS_TADMIT_ALWAYS) {
            s = create(t, keys[i], NULL, NULL, NULL);
            if (s == -1)
                return -1;
        }
        if (s < 0) {
            t->n.dropped++;
            continue;
        }
        ps_trow_step(&t->c, row_w(t, (uint64_t)s), row_s(t, (uint64_t)s), &t->steps[s],
                     g + i * d, scale, lr);
        t->meta[s].touched = t->version;
        ps_tbit_set(t->dirty, (uint64_t)s);
        stepped++;
    }
    return stepped;
}

int ps_table_remove(ps_table *t, uint64_t key)
{
    int64_t s = find(t, key);
    if (s < 0)
        return 0;
    remove_slot(t, (uint64_t)s);
    check_moved(t, (uint64_t)s);
    return 1;
}

/* ---- ttl ------------------------------------------------------------------- */

/* Checks slots from the sweep's cursor, evicting the expired, at most
 * max(SWEEP_MIN, ceil(8 * cap / row_ttl)) per advance (an eviction counts),
 * and stops at the end of a pass: passes start with an advance. A pass
 * needs at most 2 * cap checks (cap passes and at most cap evictions), so
 * it ends within ceil(row_ttl / 4) advances; the bound in table.h
 * follows. */
void ps_table_advance(ps_table *t)
{
    t->version++;
    uint64_t ttl = t->c.row_ttl;
    if (!ttl)
        return;
    uint64_t budget = (8 * t->cap + ttl - 1) / ttl;
    if (budget < SWEEP_MIN)
        budget = SWEEP_MIN;
    if (t->sweep >= t->rows)
        t->sweep = 0;
    for (uint64_t k = 0; k < budget; k++) {
        if (t->sweep >= t->rows) {
            t->sweep = 0;
            break;
        }
        if (expired(t, t->sweep))
            evict(t, t->sweep, 1);
        else
            t->sweep++;
    }
}

/* ---- checkpoints ------------------------------------------------------------- */

int ps_table_foreach(const ps_table *t, ps_table_row_fn fn, void *user)
{
    size_t d = t->c.dim;
    for (uint64_t s = 0; s < t->rows; s++) {
        const float *st = row_s(t, s);
        int r = fn(user, t->meta[s].key, row_w(t, s), st, t->nstate == 2 ? st + d : NULL,
                   t->steps[s], t->meta[s].touched);
        if (r)
            return r;
    }
    return 0;
}

int ps_table_put_row(ps_table *t, uint64_t key, const float *w, const float *s1, const float *s2,
                     uint32_t steps, uint64_t touched)
{
    int64_t s = find(t, key);
    if (s < 0) {
        s = create(t, key, w, s1, s2);
        if (s < 0)
            return -1;
        int64_t p = ps_tpend_find(&t->pend, key);
        if (p >= 0)
            ps_tpend_remove(&t->pend, (uint64_t)p);
    } else {
        size_t d = t->c.dim;
        memcpy(row_w(t, (uint64_t)s), w, d * sizeof(float));
        float *st = row_s(t, (uint64_t)s);
        if (st) {
            ps_trow_init_state(&t->c, st);
            if (s1)
                memcpy(st, s1, d * sizeof(float));
            if (s2 && t->nstate == 2)
                memcpy(st + d, s2, d * sizeof(float));
        }
    }
    t->steps[s] = steps;
    ps_tbit_set(t->dirty, (uint64_t)s);
    t->meta[s].touched = touched;
    return 0;
}

void ps_table_view_get(const ps_table *t, ps_table_view *v)
{
    v->rows = t->rows;
    v->npend = t->pend.n;
    v->dim = t->c.dim;
    v->nstate = t->nstate;
    v->w = t->w;
    v->s = t->nstate ? t->s : NULL;
    v->meta = &t->meta[0].key;
    v->steps = t->steps;
    v->pend = t->pend.n ? &t->pend.e[0].key : NULL;
    v->sightings = t->pend.n ? t->pend.sightings : NULL;
    v->dirty = t->dirty;
}

void ps_table_state_get(const ps_table *t, ps_table_state *st)
{
    st->version = t->version;
    st->sweep = t->sweep;
    st->rng = t->rng;
    st->pend_rng = t->pend.rng;
    ps_table_counts_get(t, &st->n);
}

void ps_table_state_set(ps_table *t, const ps_table_state *st)
{
    uint64_t rows = t->rows, pending = t->pend.n;
    t->version = st->version;
    t->sweep = st->sweep;
    t->rng = st->rng;
    t->pend.rng = st->pend_rng;
    t->n = st->n;
    t->n.rows = rows;
    t->n.pending = pending;
}

int ps_table_put_pending(ps_table *t, uint64_t key, uint64_t seen, uint32_t sightings)
{
    if (find(t, key) >= 0 || ps_tpend_find(&t->pend, key) >= 0)
        return 0;
    int64_t i = ps_tpend_add(&t->pend, key, seen);
    if (i < 0)
        return -1;
    t->pend.sightings[i] = sightings;
    return 0;
}

uint64_t ps_table_dirty_count(const ps_table *t)
{
    uint64_t n = 0, words = t->rows / 64;
    for (uint64_t i = 0; i < words; i++)
        n += (uint64_t)__builtin_popcountll(t->dirty[i]);
    if (t->rows & 63)
        n += (uint64_t)__builtin_popcountll(t->dirty[words] & ((1ull << (t->rows & 63)) - 1));
    return n;
}

void ps_table_dirty_clear(ps_table *t)
{
    memset(t->dirty, 0, (t->cap + 63) / 64 * 8);
}
