/* table_persist.c -- sparse tables in checkpoints (meta format 4;
 * docs/checkpoint-format.md "Tables"). Two sections per table, id i:
 *
 *   "table/<i>"  a ttab_head (the registration, the engine's state and
 *                counters, the wire's counters), the key, the per-rank
 *                exactly-once records (ttab_rec), the pending keys of
 *                count/prob admission, and the open sync step's pushes
 *   "trows/<i>"  the rows, as the engine's arrays: rows x (key, last
 *                touch), rows x step count (padded to 8), rows x dim
 *                values, rows x dim x nstate optimizer state
 *
 * The copy is taken on the front thread (one memcpy per array: no row is
 * visited), like the dense tensors' in persist.c, and written by the
 * checkpoint writer thread. A restore puts the rows back in slot order,
 * then the pending keys in order, then the counters and draw counters, so
 * the table goes on bit for bit as the saved one would have.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "log.h"
#include "ps.h"
#include "snapshot.h"
#include "table.h"
#include "table_wire_int.h"

#define TTAB_FORMAT 1

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
    uint32_t rank, pad;
    uint64_t n;
} ttab_step;

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
        if (s->step[r].have) {
            nstep++;
            steplen += sizeof(ttab_step) + a8(s->step[r].n * 8 + s->step[r].n * c->dim * 4);
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
        if (!q->have)
            continue;
        ttab_step ts = { (uint32_t)r, 0, q->n };
        p = put(p, &ts, sizeof ts);
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

int ps_tables_ckpt_sections(gddr_ps *ps, struct gddr_ckpt_section **sec, size_t *n, size_t *cap,
                            gddr_ps_add_section_fn add)
{
    struct ps_tables *ts = ps->tables;
    for (size_t i = 0; ts && i < ts->n; i++) {
        char name[64];
        uint64_t len = 0;
        void *d = head_section(ps, ts->t[i], &len);
        snprintf(name, sizeof name, "table/%zu", i);
        if (!d || add(sec, n, cap, name, d, len) < 0) {
            free(d);
            return -1;
        }
        d = rows_section(ts->t[i], &len);
        snprintf(name, sizeof name, "trows/%zu", i);
        if (!d || add(sec, n, cap, name, d, len) < 0) {
            free(d);
            return -1;
        }
    }
    return 0;
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

/* Restores table i from its two sections: -1 with why filled when they do
 * not hold one. */
static int restore_one(gddr_ps *ps, const gddr_ckpt_section *hs, const gddr_ckpt_section *rs,
                       char *why, size_t wl)
{
    rd r = { hs->data, (const char *)hs->data + hs->len };
    ttab_head h;
    const void *hp = take(&r, sizeof h);
    if (!hp) {
        snprintf(why, wl, "too short");
        return -1;
    }
    memcpy(&h, hp, sizeof h);
    if (h.format != TTAB_FORMAT) {
        snprintf(why, wl, "unknown table record format %u", h.format);
        return -1;
    }
    const char *kp = take8(&r, h.keylen);
    char key[128];
    if (!kp || h.keylen == 0 || h.keylen >= sizeof key) {
        snprintf(why, wl, "bad key length %u", h.keylen);
        return -1;
    }
    memcpy(key, kp, h.keylen);
    key[h.keylen] = 0;
    ps_table_conf c;
    tw_opt o;
    if (conf_of(&h, &c, &o, why, wl) < 0)
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
    size_t d = c.dim, ns = h.nstate;
    uint64_t vals = h.rows * d * 4;
    if (h.rows > (1ull << 31) ||
        rs->len != h.rows * 16 + a8(h.rows * 4) + vals * (1 + ns)) {
        snprintf(why, wl, "%s holds %llu bytes, not %llu rows of %zu values", rs->name,
                 (unsigned long long)rs->len, (unsigned long long)h.rows, d);
        return -1;
    }
    ps_stable *s = ps_tables_add(ps, key, &c, &o);
    if (!s) {
        snprintf(why, wl, "out of memory");
        return -1;
    }
    /* Unaligned reads are avoided: every array starts at a multiple of 8
     * of a malloc'd section. */
    const uint64_t *meta = rs->data;
    const uint32_t *steps = (const uint32_t *)(meta + 2 * h.rows);
    const float *w = (const float *)((const char *)steps + a8(h.rows * 4));
    const float *st = w + h.rows * d;
    uint64_t refused = 0;
    for (uint64_t i = 0; i < h.rows; i++) {
        const float *s1 = ns ? st + i * d * ns : NULL, *s2 = ns == 2 ? s1 + d : NULL;
        if (ps_table_put_row(s->tab, meta[2 * i], w + i * d, s1, s2, steps[i], meta[2 * i + 1]) < 0)
            refused++;
    }
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
                                    1, tr.applied, tr.mode };
    }
    int sync = ps->cfg.mode == GDDR_PS_MODE_SYNC;
    for (uint32_t i = 0; i < h.nstep; i++) {
        const ttab_step *tsp = take(&r, sizeof(ttab_step));
        ttab_step ts;
        if (tsp)
            memcpy(&ts, tsp, sizeof ts);
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
        q->have = 1;
        s->ncontrib++;
    }
    if (r.p != r.end) {
        snprintf(why, wl, "%zu stray bytes", (size_t)(r.end - r.p));
        return -1;
    }
    return 0;
}

int ps_tables_ckpt_restore(gddr_ps *ps, const struct gddr_ckpt *c, uint64_t ntables, char *err,
                           size_t errlen)
{
    for (uint64_t i = 0; i < ntables; i++) {
        char hn[64], rn[64], why[256] = "";
        snprintf(hn, sizeof hn, "table/%llu", (unsigned long long)i);
        snprintf(rn, sizeof rn, "trows/%llu", (unsigned long long)i);
        const gddr_ckpt_section *hs = gddr__ckpt_find(c, hn), *rs = gddr__ckpt_find(c, rn);
        if (!hs || !rs) {
            snprintf(err, errlen, "section %s is missing", hs ? rn : hn);
            return -1;
        }
        if (restore_one(ps, hs, rs, why, sizeof why) < 0) {
            snprintf(err, errlen, "section %s: %s", hn, why);
            return -1;
        }
    }
    if (ntables)
        gddr_log(GDDR_LOG_INFO, "restored %llu tables, %llu rows", (unsigned long long)ntables,
                 (unsigned long long)ps->tables->rows);
    return 0;
}
