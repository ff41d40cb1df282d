/* table_persist.c -- sparse tables in checkpoints (meta format 4;
 * docs/checkpoint-format.md "Sparse tables"). Two sections per table, id i:
 *
 *   "table/<i>"  a ttab_head (the registration, the engine's state and
 *                counters, the wire's counters), the key, the per-rank
 *                exactly-once records (ttab_rec), the pending keys of
 *                count/prob admission, and the open sync step's pushes
 *   "trows/<i>"  the rows, as the engine's arrays: rows x (key, last
 *                touch), rows x step count (padded to 8), rows x dim
 *                values, rows x dim x nstate optimizer state
 *
 * or, in an incremental checkpoint, "tdelta/<i>" instead of "trows/<i>":
 * every row's key, touch and step count, the dirty bits and only the rows
 * changed since the last full copy, the base, whose seq "tbase" holds.
 *
 * The copy is taken on the front thread (a full one: one memcpy per
 * array), like the dense tensors' in persist.c, and written by the
 * checkpoint writer thread. A restore puts the rows back in slot order
 * (from the delta and its base where there is one), then the pending keys
 * in order, then the counters and draw counters, so the table goes on bit
 * for bit as the saved one would have. docs/checkpoint-format.md,
 * "Incremental checkpoints", says when a copy is full.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "log.h"
#include "ps.h"
#include "snapshot.h"
#include "table.h"
#include "table_wire_int.h"

/* 2: each open-step push carries its lr (a double after its ttab_step);
 * format 1 (no lr: the table's) still loads. */
#define TTAB_FORMAT 2
/* A full copy at least every this many checkpoints. */
#define DELTAS_MAX 8

typedef struct ttab_head {
    uint32_t format, keylen;
    /* the registration: ps_table_conf, then the optimizer InitTable gave */
    uint32_t dim, init, admit, admit_count, opt, opt_given, kind, pad0;
    float init_scale, admit_prob, lr, beta1, beta2, eps, adagrad_init, pad1;
    uint64_t init_seed, max_rows, row_ttl;
    double o_lr, o_beta1, o_beta2, o_eps;
    /* the engine (ps_table_state) */
    uint64_t version, sweep, rng, pend_rng;
    uint64_t created, evicted_ttl, evicted_cap, dropped;
    /* the wire's counters */
    uint64_t pushes, pulls, rows_pulled, rows_pushed, duplicates;
    /* what follows, and the rows of "trows/<i>" */
    uint64_t rows, npend;
    uint32_t nrec, nstep, nstate, pad2;
} ttab_head;

typedef struct ttab_rec {
    uint32_t rank;
    uint8_t applied, mode, pad[2];
    uint64_t session, step, version, sync_target, staleness;
} ttab_rec;

typedef struct ttab_step {
    uint32_t rank, flags; /* flags: TTAB_STEP_MASS (before 2026-12: 0) */
    uint64_t n;
} ttab_step;
/* Only late pushes of the rank, not its push of the step (tw_push.mass). */
#define TTAB_STEP_MASS 1u

_Static_assert(sizeof(ttab_head) == 264 && sizeof(ttab_rec) == 48 && sizeof(ttab_step) == 16,
               "checkpoint records without padding surprises");

static uint64_t a8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

size_t ps_tables_count(gddr_ps *ps)
{
    return ps->tables ? ps->tables->n : 0;
}

/* ---- writing --------------------------------------------------------------- */

static char *put(char *p, const void *src, size_t n)
{
    if (n)
        memcpy(p, src, n);
    return p + n;
}

static char *pad8(char *base, char *p)
{
    size_t off = (size_t)(p - base), k = (size_t)a8(off) - off;
    memset(p, 0, k);
    return p + k;
}

static void *head_section(gddr_ps *ps, const ps_stable *s, uint64_t *len)
{
    const ps_table_conf *c = ps_table_config(s->tab);
    ps_table_view v;
    ps_table_view_get(s->tab, &v);
    ps_table_state st;
    ps_table_state_get(s->tab, &st);
    int mw = (int)ps->cfg.max_workers;
    uint32_t nrec = 0, nstep = 0;
    uint64_t steplen = 0;
    for (int r = 0; r < mw; r++) {
        nrec += s->rec[r].set != 0;
        if (s->step[r].have || s->step[r].mass) {
            nstep++;
            steplen += sizeof(ttab_step) + 8 + a8(s->step[r].n * 8 + s->step[r].n * c->dim * 4);
        }
    }
    size_t keylen = strlen(s->key);
    uint64_t n = sizeof(ttab_head) + a8(keylen) + nrec * sizeof(ttab_rec) + v.npend * 16 +
                 a8(v.npend * 4) + steplen;
    char *buf = malloc(n), *p = buf;
    if (!buf)
        return NULL;
    ttab_head h;
    memset(&h, 0, sizeof h);
    h.format = TTAB_FORMAT;
    h.keylen = (uint32_t)keylen;
    h.dim = c->dim, h.init = c->init, h.admit = c->admit, h.admit_count = c->admit_count;
    h.opt = c->opt, h.opt_given = (uint32_t)s->o.opt_given, h.kind = (uint32_t)s->o.kind;
    h.init_scale = c->init_scale, h.admit_prob = c->admit_prob, h.lr = c->lr;
    h.beta1 = c->beta1, h.beta2 = c->beta2, h.eps = c->eps, h.adagrad_init = c->adagrad_init;
    h.init_seed = c->init_seed, h.max_rows = c->max_rows, h.row_ttl = c->row_ttl;
    h.o_lr = s->o.lr, h.o_beta1 = s->o.beta1, h.o_beta2 = s->o.beta2, h.o_eps = s->o.eps;
    h.version = st.version, h.sweep = st.sweep, h.rng = st.rng, h.pend_rng = st.pend_rng;
    h.created = st.n.created, h.evicted_ttl = st.n.evicted_ttl;
    h.evicted_cap = st.n.evicted_cap, h.dropped = st.n.dropped;
    h.pushes = s->pushes, h.pulls = s->pulls, h.rows_pulled = s->rows_pulled;
    h.rows_pushed = s->rows_pushed, h.duplicates = s->duplicates;
    h.rows = v.rows, h.npend = v.npend, h.nrec = nrec, h.nstep = nstep, h.nstate = v.nstate;
    p = put(p, &h, sizeof h);
    p = pad8(buf, put(p, s->key, keylen));
    for (int r = 0; r < mw; r++) {
        const tw_rec *o = &s->rec[r];
        if (!o->set)
            continue;
        ttab_rec tr = { (uint32_t)r, o->applied, o->mode, { 0, 0 }, o->session, o->step,
                        o->version, o->sync_target, o->staleness };
        p = put(p, &tr, sizeof tr);
    }
    p = put(p, v.pend, v.npend * 16);
    p = pad8(buf, put(p, v.sightings, v.npend * 4));
    for (int r = 0; r < mw; r++) {
        const tw_push *q = &s->step[r];
        if (!q->have && !q->mass)
            continue;
        ttab_step ts = { (uint32_t)r, q->have ? 0u : TTAB_STEP_MASS, q->n };
        p = put(p, &ts, sizeof ts);
        p = put(p, &q->lr, 8);
        p = put(p, q->keys, q->n * 8);
        p = pad8(buf, put(p, q->vals, q->n * c->dim * 4));
    }
    *len = (uint64_t)(p - buf);
    return buf;
}

static void *rows_section(const ps_stable *s, uint64_t *len)
{
    ps_table_view v;
    ps_table_view_get(s->tab, &v);
    size_t vals = (size_t)v.rows * v.dim * 4;
    uint64_t n = v.rows * 16 + a8(v.rows * 4) + vals * (1 + v.nstate);
    char *buf = malloc(n ? n : 1), *p = buf;
    if (!buf)
        return NULL;
    p = put(p, v.meta, v.rows * 16);
    p = pad8(buf, put(p, v.steps, v.rows * 4));
    p = put(p, v.w, vals);
    p = put(p, v.s, vals * v.nstate);
    *len = (uint64_t)(p - buf);
    return buf;
}

/* The rows changed since the base: for every row in slot order its key,
 * last touch and step count, the dirty bits, then the dirty rows' values
 * and their optimizer state. */
static void *delta_section(const ps_stable *s, uint64_t *len)
{
    ps_table_view v;
    ps_table_view_get(s->tab, &v);
    uint64_t nd = ps_table_dirty_count(s->tab), words = (v.rows + 63) / 64;
    size_t d = v.dim, ns = v.nstate;
    uint64_t n = 16 + v.rows * 16 + a8(v.rows * 4) + words * 8 + nd * d * 4 * (1 + ns);
    char *buf = malloc(n), *p = buf;
    if (!buf)
        return NULL;
    uint64_t hd[2] = { v.rows, nd };
    p = put(p, hd, sizeof hd);
    p = put(p, v.meta, v.rows * 16);
    p = pad8(buf, put(p, v.steps, v.rows * 4));
    p = put(p, v.dirty, words * 8);
    for (uint64_t r = 0; r < v.rows; r++)
        if (v.dirty[r >> 6] >> (r & 63) & 1)
            p = put(p, v.w + r * d, d * 4);
    for (uint64_t r = 0; ns && r < v.rows; r++)
        if (v.dirty[r >> 6] >> (r & 63) & 1)
            p = put(p, v.s + r * d * ns, d * ns * 4);
    *len = (uint64_t)(p - buf);
    return buf;
}

/* Full or delta: a delta needs a base on disk (the last full copy, known
 * written), fewer than DELTAS_MAX deltas since, and at most half the rows
 * changed (else it saves less than half a full copy). */
static int take_delta(gddr_ps *ps, struct ps_tables *ts)
{
    if (ts->pending_base) {
        int rc = GDDR_EIO;
        uint64_t last = 0;
        gddr__ckpt_writer_wait(ps->ckw, 0, &rc, NULL, &last);
        if (last == ts->pending_base && rc == GDDR_OK) {
            if (ts->base_seq)
                ts->prev_base = ts->base_seq;
            ts->base_seq = ts->pending_base;
        } else {
            ts->base_seq = 0; /* the dirty bits were cleared for a copy not on disk */
        }
        ts->pending_base = 0;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/ckpt-%020llu.gddr", ps->cfg.checkpoint_dir,
             (unsigned long long)ts->base_seq);
    if (ts->base_seq && access(path, F_OK) != 0)
        ts->base_seq = 0; /* removed by hand */
    uint64_t rows = 0, dirty = 0;
    for (size_t i = 0; i < ts->n; i++) {
        ps_table_counts k;
        ps_table_counts_get(ts->t[i]->tab, &k);
        rows += k.rows;
        dirty += ps_table_dirty_count(ts->t[i]->tab);
    }
    return ts->base_seq && ts->ndeltas < DELTAS_MAX && 2 * dirty <= rows;
}

int ps_tables_ckpt_sections(gddr_ps *ps, struct gddr_ckpt_section **sec, size_t *n, size_t *cap,
                            ps_add_section_fn add)
{
    struct ps_tables *ts = ps->tables;
    if (!ts || !ts->n)
        return 0;
    int delta = take_delta(ps, ts);
    /* The seq this copy is written as (persist.c: the next one). */
    uint64_t seq = ps->ckpt_seq + 1;
    gddr__ckpt_writer_pin(ps->ckw, ts->base_seq, ts->prev_base);
    if (delta) {
        ts->ndeltas++;
        uint64_t *b = malloc(8);
        if (!b)
            return -1;
        *b = ts->base_seq;
        if (add(sec, n, cap, "tbase", b, 8) < 0) {
            free(b);
            return -1;
        }
    } else {
        ts->pending_base = seq;
        ts->ndeltas = 0;
    }
    for (size_t i = 0; i < ts->n; i++) {
        char name[64];
        uint64_t len = 0;
        void *d = head_section(ps, ts->t[i], &len);
        snprintf(name, sizeof name, "table/%zu", i);
        if (!d || add(sec, n, cap, name, d, len) < 0) {
            free(d);
            return -1;
        }
        d = delta ? delta_section(ts->t[i], &len) : rows_section(ts->t[i], &len);
        snprintf(name, sizeof name, delta ? "tdelta/%zu" : "trows/%zu", i);
        if (!d || add(sec, n, cap, name, d, len) < 0) {
            free(d);
            return -1;
        }
        if (!delta)
            ps_table_dirty_clear(ts->t[i]->tab);
    }
    return 0;
}

void ps_tables_places_get(gddr_ps *ps, uint64_t *out)
{
    size_t mw = (size_t)ps->cfg.max_workers;
    for (size_t i = 0; ps->tables && i < ps->tables->n; i++)
        for (size_t r = 0; r < mw; r++)
            out[i * mw + r] = ps->tables->t[i]->rec[r].sstep;
}

void ps_tables_places_set(gddr_ps *ps, const uint64_t *in, size_t ntables, size_t per)
{
    size_t mw = (size_t)ps->cfg.max_workers;
    for (size_t i = 0; ps->tables && i < ps->tables->n && i < ntables; i++)
        for (size_t r = 0; r < mw && r < per; r++)
            ps->tables->t[i]->rec[r].sstep = ps->tables->t[i]->rec[r].set ? in[i * per + r] : 0;
}

/* ---- reading ------------------------------------------------------------------ */

/* A cursor over a section that refuses to run past its end. */
typedef struct rd {
    const char *p, *end;
} rd;

static const void *take(rd *r, uint64_t n)
{
    if (!r->p || (uint64_t)(r->end - r->p) < n) {
        r->p = NULL;
        return NULL;
    }
    const void *q = r->p;
    r->p += n;
    return q;
}

static const void *take8(rd *r, uint64_t n)
{
    const void *q = take(r, n);
    if (q && !take(r, a8(n) - n))
        return NULL;
    return q;
}

static int conf_of(const ttab_head *h, ps_table_conf *c, tw_opt *o, char *why, size_t wl)
{
    memset(c, 0, sizeof *c);
    c->dim = h->dim;
    c->init = (ps_tinit)h->init;
    c->init_scale = h->init_scale;
    c->init_seed = h->init_seed;
    c->admit = (ps_tadmit)h->admit;
    c->admit_count = h->admit_count;
    c->admit_prob = h->admit_prob;
    c->opt = (ps_topt)h->opt;
    c->lr = h->lr;
    c->beta1 = h->beta1, c->beta2 = h->beta2, c->eps = h->eps;
    c->adagrad_init = h->adagrad_init;
    c->max_rows = h->max_rows;
    c->row_ttl = h->row_ttl;
    memset(o, 0, sizeof *o);
    o->lr = h->o_lr, o->opt_given = (int)h->opt_given, o->kind = (Gddr__OptimizerKind)h->kind;
    o->beta1 = h->o_beta1, o->beta2 = h->o_beta2, o->eps = h->o_eps;
    if (h->init > PS_TINIT_NORMAL || h->admit > PS_TADMIT_PROB || h->opt > PS_TOPT_ADAM) {
        snprintf(why, wl, "unknown init %u, admission %u or optimizer %u", h->init, h->admit, h->opt);
        return -1;
    }
    if (ps_table_conf_check(c, why, wl) < 0)
        return -1;
    uint32_t nstate = c->opt == PS_TOPT_ADAM ? 2 : c->opt == PS_TOPT_ADAGRAD ? 1 : 0;
    if (nstate != h->nstate) {
        snprintf(why, wl, "%u state floats per value for its optimizer", h->nstate);
        return -1;
    }
    return 0;
}

/* The head of a "table/<i>" section and its key (key[128]); r is left
 * after them. -1 with why filled. */
static int parse_head(const gddr_ckpt_section *hs, ttab_head *h, char *key, rd *r, char *why,
                      size_t wl)
{
    *r = (rd){ hs->data, (const char *)hs->data + hs->len };
    const void *hp = take(r, sizeof *h);
    if (!hp) {
        snprintf(why, wl, "too short");
        return -1;
    }
    memcpy(h, hp, sizeof *h);
    if (h->format != 1 && h->format != TTAB_FORMAT) {
        snprintf(why, wl, "unknown table record format %u", h->format);
        return -1;
    }
    const char *kp = take8(r, h->keylen);
    if (!kp || h->keylen == 0 || h->keylen >= 128 || h->rows > (1ull << 31)) {
        snprintf(why, wl, "bad key length %u or row count", h->keylen);
        return -1;
    }
    memcpy(key, kp, h->keylen);
    key[h->keylen] = 0;
    return 0;
}

/* Bytes of a "trows" section of `rows` rows. */
static uint64_t full_len(uint64_t rows, size_t d, size_t ns)
{
    return rows * 16 + a8(rows * 4) + rows * d * 4 * (1 + ns);
}

static int put_row(ps_stable *s, uint64_t key, const float *w, const float *st, size_t d,
                   size_t ns, uint32_t steps, uint64_t touched, uint64_t *refused)
{
    const float *s1 = ns ? st : NULL, *s2 = ns == 2 ? st + d : NULL;
    if (ps_table_put_row(s->tab, key, w, s1, s2, steps, touched) < 0)
        (*refused)++;
    return 0;
}

static int put_rows_full(ps_stable *s, const ttab_head *h, const gddr_ckpt_section *rs,
                         uint64_t *refused, char *why, size_t wl)
{
    size_t d = h->dim, ns = h->nstate;
    if (rs->len != full_len(h->rows, d, ns)) {
        snprintf(why, wl, "%s holds %llu bytes, not %llu rows of %zu values", rs->name,
                 (unsigned long long)rs->len, (unsigned long long)h->rows, d);
        return -1;
    }
    /* Every array starts at a multiple of 8 of a malloc'd section. */
    const uint64_t *meta = rs->data;
    const uint32_t *steps = (const uint32_t *)(meta + 2 * h->rows);
    const float *w = (const float *)((const char *)steps + a8(h->rows * 4));
    const float *st = w + h->rows * d;
    for (uint64_t i = 0; i < h->rows; i++)
        put_row(s, meta[2 * i], w + i * d, st + i * d * ns, d, ns, steps[i], meta[2 * i + 1], refused);
    return 0;
}

static int cmp_pair(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The rows of a delta ("tdelta/<id>"): in its slot order, the dirty ones
 * from it, the others from the base's full copy of table id (by key). */
static int put_rows_delta(ps_stable *s, const ttab_head *h, const char *key, uint32_t id,
                          const gddr_ckpt_section *ds, const gddr_ckpt *base, uint64_t *refused,
                          char *why, size_t wl)
{
    size_t d = h->dim, ns = h->nstate;
    rd r = { ds->data, (const char *)ds->data + ds->len };
    const uint64_t *hd = take(&r, 16);
    if (!hd || hd[0] != h->rows || hd[1] > hd[0]) {
        snprintf(why, wl, "%s: bad row counts", ds->name);
        return -1;
    }
    uint64_t R = hd[0], D = hd[1], words = (R + 63) / 64, clean = R - D;
    const uint64_t *meta = take(&r, R * 16);
    const uint32_t *steps = take8(&r, R * 4);
    const uint64_t *bits = take(&r, words * 8);
    const float *w = take(&r, D * d * 4), *st = take(&r, D * d * ns * 4);
    uint64_t nd = 0;
    for (uint64_t i = 0; bits && i < words; i++)
        nd += (uint64_t)__builtin_popcountll(bits[i]);
    if (!st || r.p != r.end || nd != D || (R & 63 && bits[words - 1] >> (R & 63))) {
        snprintf(why, wl, "%s does not hold %llu rows, %llu of them changed", ds->name,
                 (unsigned long long)R, (unsigned long long)D);
        return -1;
    }
    const uint64_t *bm = NULL;
    const float *bw = NULL, *bst = NULL;
    uint64_t *ix = NULL, brows = 0;
    if (clean) {
        char hn[64], rn[64], bkey[128];
        snprintf(hn, sizeof hn, "table/%u", id);
        snprintf(rn, sizeof rn, "trows/%u", id);
        const gddr_ckpt_section *bh = gddr__ckpt_find(base, hn), *br = gddr__ckpt_find(base, rn);
        ttab_head b;
        rd brd;
        if (!bh || !br || parse_head(bh, &b, bkey, &brd, why, wl) < 0 || strcmp(bkey, key) != 0 ||
            b.dim != h->dim || b.nstate != h->nstate || br->len != full_len(b.rows, d, ns)) {
            snprintf(why, wl, "%s: base checkpoint %llu has no full copy of table '%s'", ds->name,
                     (unsigned long long)base->seq, key);
            return -1;
        }
        brows = b.rows;
        bm = br->data;
        bw = (const float *)((const char *)(bm + 2 * brows) + a8(brows * 4));
        bst = bw + brows * d;
        ix = malloc(brows * 16 + 16);
        if (!ix) {
            snprintf(why, wl, "out of memory");
            return -1;
        }
        for (uint64_t i = 0; i < brows; i++)
            ix[2 * i] = bm[2 * i], ix[2 * i + 1] = i;
        qsort(ix, brows, 16, cmp_pair);
    }
    uint64_t j = 0;
    for (uint64_t i = 0; i < R; i++) {
        uint64_t k = meta[2 * i];
        if (bits[i >> 6] >> (i & 63) & 1) {
            put_row(s, k, w + j * d, st + j * d * ns, d, ns, steps[i], meta[2 * i + 1], refused);
            j++;
            continue;
        }
        const uint64_t *f = bsearch(&k, ix, brows, 16, cmp_pair);
        if (!f) {
            snprintf(why, wl, "%s: row of key %llu unchanged since base checkpoint %llu, which lacks it",
                     ds->name, (unsigned long long)k, (unsigned long long)base->seq);
            free(ix);
            return -1;
        }
        put_row(s, k, bw + f[1] * d, bst + f[1] * d * ns, d, ns, steps[i], meta[2 * i + 1], refused);
    }
    free(ix);
    return 0;
}

/* Restores table id from checkpoint c (and its base when c is a delta):
 * -1 with why filled when they do not hold it. */
static int restore_one(gddr_ps *ps, const gddr_ckpt *c, const gddr_ckpt *base, uint32_t id,
                       char *why, size_t wl)
{
    char hn[64], rn[64], dn[64], key[128];
    snprintf(hn, sizeof hn, "table/%u", id);
    snprintf(rn, sizeof rn, "trows/%u", id);
    snprintf(dn, sizeof dn, "tdelta/%u", id);
    const gddr_ckpt_section *hs = gddr__ckpt_find(c, hn), *rs = gddr__ckpt_find(c, rn);
    const gddr_ckpt_section *ds = gddr__ckpt_find(c, dn);
    if (!hs || (!rs && !(ds && base->n))) {
        snprintf(why, wl, "section %s or %s is missing", hn, rn);
        return -1;
    }
    rd r;
    ttab_head h;
    if (parse_head(hs, &h, key, &r, why, wl) < 0)
        return -1;
    ps_table_conf c0;
    tw_opt o;
    if (conf_of(&h, &c0, &o, why, wl) < 0)
        return -1;
    for (size_t i = 0; i < ps_tables_count(ps); i++)
        if (strcmp(ps->tables->t[i]->key, key) == 0) {
            snprintf(why, wl, "table '%s' twice", key);
            return -1;
        }
    const ttab_rec *recs = take(&r, (uint64_t)h.nrec * sizeof(ttab_rec));
    const uint64_t *pend = take(&r, h.npend > UINT64_MAX / 16 ? UINT64_MAX : h.npend * 16);
    const uint32_t *sightings = take8(&r, h.npend * 4);
    if (!recs || !pend || !sightings) {
        snprintf(why, wl, "records or pending keys cut short");
        return -1;
    }
    size_t d = c0.dim;
    ps_stable *s = ps_tables_add(ps, key, &c0, &o);
    if (!s) {
        snprintf(why, wl, "out of memory");
        return -1;
    }
    uint64_t refused = 0;
    if (rs ? put_rows_full(s, &h, rs, &refused, why, wl) < 0
           : put_rows_delta(s, &h, key, id, ds, base, &refused, why, wl) < 0)
        return -1;
    if (refused)
        gddr_log(GDDR_LOG_WARN, "table '%s': %llu rows of the checkpoint did not fit (max_table_rows, "
                 "or no memory): dropped", key, (unsigned long long)refused);
    for (uint64_t i = 0; i < h.npend; i++)
        if (ps_table_put_pending(s->tab, pend[2 * i], pend[2 * i + 1], sightings[i]) < 0) {
            snprintf(why, wl, "out of memory");
            return -1;
        }
    ps_table_state st0 = { h.version, h.sweep, h.rng, h.pend_rng,
                           { 0, h.created, h.evicted_ttl, h.evicted_cap, h.dropped, 0 } };
    ps_table_state_set(s->tab, &st0);
    s->pushes = h.pushes, s->pulls = h.pulls, s->rows_pulled = h.rows_pulled;
    s->rows_pushed = h.rows_pushed, s->duplicates = h.duplicates;
    uint32_t mw = (uint32_t)ps->cfg.max_workers;
    for (uint32_t i = 0; i < h.nrec; i++) {
        ttab_rec tr;
        memcpy(&tr, &recs[i], sizeof tr);
        if (tr.rank >= mw)
            continue; /* max_workers was lowered: that rank cannot push any more */
        s->rec[tr.rank] = (tw_rec){ tr.session, tr.step, tr.version, tr.sync_target, tr.staleness,
                                    1, tr.applied, tr.mode, 0, 0 };
    }
    int sync = ps->cfg.mode == GDDR_PS_MODE_SYNC;
    for (uint32_t i = 0; i < h.nstep; i++) {
        const ttab_step *tsp = take(&r, sizeof(ttab_step));
        ttab_step ts;
        if (tsp)
            memcpy(&ts, tsp, sizeof ts);
        double lr = 0; /* format 1: the table's */
        const void *lp = tsp && h.format >= 2 ? take(&r, 8) : NULL;
        if (lp)
            memcpy(&lr, lp, 8);
        if (h.format >= 2 && !lp)
            tsp = NULL;
        const uint64_t *k = tsp && ts.n <= (1ull << 40) ? take(&r, ts.n * 8) : NULL;
        const float *g = k ? take8(&r, ts.n * d * 4) : NULL;
        if (!g) {
            snprintf(why, wl, "open sync step cut short");
            return -1;
        }
        tw_push *q = ts.rank < mw ? &s->step[ts.rank] : NULL;
        if (!sync || !q || q->have) {
            gddr_log(GDDR_LOG_WARN, "table '%s': the push of rank %u to the open sync step is dropped "
                     "(%s)", key, ts.rank, !sync ? "mode is not sync now" : "rank out of range");
            continue;
        }
        q->keys = malloc(ts.n ? ts.n * 8 : 1);
        q->vals = malloc(ts.n ? ts.n * d * 4 : 1);
        if (!q->keys || !q->vals) {
            snprintf(why, wl, "out of memory");
            return -1;
        }
        memcpy(q->keys, k, ts.n * 8);
        memcpy(q->vals, g, ts.n * d * 4);
        q->n = ts.n;
        q->lr = isfinite(lr) && lr >= 0 && lr <= 1e6 ? lr : 0;
        if (ts.flags & TTAB_STEP_MASS) {
            q->mass = 1;
        } else {
            q->have = 1;
            s->ncontrib++;
        }
    }
    if (r.p != r.end) {
        snprintf(why, wl, "%zu stray bytes", (size_t)(r.end - r.p));
        return -1;
    }
    return 0;
}

int ps_tables_ckpt_restore(gddr_ps *ps, const struct gddr_ckpt *c, const struct gddr_ckpt *base,
                           uint64_t ntables, char *err, size_t errlen)
{
    for (uint64_t i = 0; i < ntables; i++) {
        char why[256] = "";
        if (i >= UINT32_MAX || restore_one(ps, c, base, (uint32_t)i, why, sizeof why) < 0) {
            snprintf(err, errlen, "table %llu: %s", (unsigned long long)i, why);
            return -1;
        }
    }
    if (!ntables)
        return 0;
    /* The next copy is full (the dirty bits are not relative to anything
     * on disk); until it is written, what was restored stays. */
    ps->tables->base_seq = 0;
    ps->tables->prev_base = base->n ? base->seq : c->seq;
    gddr_log(GDDR_LOG_INFO, "restored %llu tables, %llu rows%s", (unsigned long long)ntables,
             (unsigned long long)ps->tables->rows, base->n ? " (from a delta and its base)" : "");
    return 0;
}

int ps_tables_ckpt_load(const char *dir, struct gddr_ckpt *c, struct gddr_ckpt *base, char *err,
                        size_t errlen)
{
    uint64_t upto = UINT64_MAX;
    for (;;) {
        memset(base, 0, sizeof *base);
        int rc = gddr__ckpt_load_upto(dir, upto, 0, c, err, errlen);
        if (rc != GDDR_OK)
            return rc;
        const gddr_ckpt_section *b = gddr__ckpt_find(c, "tbase");
        if (!b)
            return GDDR_OK;
        uint64_t bs = 0;
        if (b->len == 8)
            memcpy(&bs, b->data, 8);
        rc = bs && bs < c->seq ? gddr__ckpt_load_upto(dir, bs, 1, base, err, errlen) : 1;
        if (rc == GDDR_OK && !gddr__ckpt_find(base, "tbase"))
            return GDDR_OK;
        if (rc != GDDR_OK && rc != 1) {
            gddr__ckpt_free(c);
            return rc;
        }
        gddr_log(GDDR_LOG_WARN, "checkpoint %s skipped: its base, checkpoint %llu, cannot be loaded",
                 c->path, (unsigned long long)bs);
        gddr__ckpt_free(base);
        upto = c->seq - 1;
        int first = c->seq == 0;
        gddr__ckpt_free(c);
        if (first)
            return 1;
    }
}
