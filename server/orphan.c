/* orphan.c -- residual snapshots and orphan hand-off
 * (docs/design.md section 7).
 *
 * A GDDR worker holds part of its gradients back in a residual; if it dies
 * that mass would be lost and the model would drift (the seed's "residual
 * avalanche"). So every residual_checkpoint_steps a worker's push carries
 * the chunks it holds. For each (worker, tensor) the server keeps:
 *   held   which chunks the snapshot holds
 *   vals   their values at the snapshot, packed (held chunks only)
 *   sent   which chunks the worker pushed since the snapshot
 * A chunk pushed after the snapshot carried its held value out with it
 * (u = r + g), so when the worker dies the orphan is held & ~sent. The
 * orphan goes to the next live worker that pushes, which replays it into
 * its own residual in installments. What is lost is what the dead worker
 * accumulated after its last snapshot; with residual_checkpoint_steps = 0
 * on the workers there is no snapshot and everything held is lost. Every
 * push also says how much residual mass (sum of |r|) the worker holds, so
 * a death is logged and exported with what it held against what the
 * snapshot hands over.
 *
 * Only hello'd workers push, so only they have snapshots, and all
 * snapshots and pending orphans together stay under max_snapshot_bytes.
 *
 * A worker declared dead may only have been slow (a step longer than
 * worker_timeout_s, a network stall): then it comes back still holding the
 * residual that was handed out, and that mass would count twice. The first
 * push of each tensor after the death tells: a worker whose step counter
 * goes on from where it was (step + 1 >= its clock at the death) is the
 * same process; a restarted one counts from 0. For the same process an
 * orphan not yet handed out is withdrawn, and one already handed out is
 * taken back: the worker receives the negated orphan and replays it like
 * any other, so the survivor's +orphan and its -orphan cancel exactly.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "log.h"
#include "residual.h"
#include "snapshot.h"

typedef struct snap_rec {
    uint32_t rank, id;
    size_t nbytes;          /* bitmap bytes */
    uint8_t *held, *sent;
    float *vals;            /* packed held chunks */
    size_t nvals;
    /* Set at a death that left an orphan here: the worker's clock then and
     * what went out as the orphan (to take it back if the worker was slow). */
    int dead;
    uint64_t dead_clock;
    uint8_t *orphan_bm;
    float *orphan_vals;
    size_t orphan_nvals;
    struct snap_rec *next;
} snap_rec;

typedef struct orphan {
    uint32_t from_rank, id, to_rank;
    size_t nvals;
    uint8_t *bitmap;
    float *vals;            /* packed held & ~sent chunks */
    double l1, held_l1;     /* its mass, and what the dead worker last said it held */
    int64_t declared_ms;
    int delivered;
    int withdraw;           /* the negated orphan of a worker that was only
                             * slow, for that worker itself (to_rank) */
    struct orphan *next;
} orphan;

struct ps_orphans {
    snap_rec *snaps;
    orphan *orphans;
    uint64_t bytes;         /* snapshots and pending orphans */
    uint64_t handed, recovered;
    double last_recovery_s;
    double held_l1_total, handed_l1_total, lost_l1_total;
};

static struct ps_orphans *state(gddr_ps *ps)
{
    if (!ps->orphans)
        ps->orphans = calloc(1, sizeof *ps->orphans);
    return ps->orphans;
}

static size_t rec_bytes(const snap_rec *r)
{
    return r->nvals * 4 + 2 * r->nbytes + r->orphan_nvals * 4 + (r->orphan_bm ? r->nbytes : 0);
}

static size_t orphan_bytes(const orphan *x, size_t nbytes)
{
    return x->nvals * 4 + nbytes;
}

static snap_rec *find_rec(gddr_ps *ps, uint32_t rank, uint32_t id)
{
    struct ps_orphans *o = state(ps);
    for (snap_rec *r = o ? o->snaps : NULL; r; r = r->next)
        if (r->rank == rank && r->id == id)
            return r;
    return NULL;
}

static snap_rec *get_rec(gddr_ps *ps, uint32_t rank, const ps_tensor *t)
{
    snap_rec *r = find_rec(ps, rank, t->id);
    if (r)
        return r;
    struct ps_orphans *o = state(ps);
    if (!o || !(r = calloc(1, sizeof *r)))
        return NULL;
    r->rank = rank;
    r->id = t->id;
    r->nbytes = gddr_bitmap_bytes(t->nchunks);
    r->held = calloc(r->nbytes, 1);
    r->sent = calloc(r->nbytes, 1);
    if (!r->held || !r->sent) {
        free(r->held), free(r->sent), free(r);
        return NULL;
    }
    r->next = o->snaps;
    o->snaps = r;
    o->bytes += rec_bytes(r);
    return r;
}

static double l1(const float *v, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += fabs((double)v[i]);
    return s;
}

/* The snapshot bound in bytes (max_snapshot_bytes, 0 = expected workers
 * times the model). */
static uint64_t snapshot_limit(gddr_ps *ps)
{
    if (ps->cfg.max_snapshot_bytes > 0)
        return (uint64_t)ps->cfg.max_snapshot_bytes;
    return ps_per_worker_bound(ps, 4, 0, 2);
}

int ps_snapshot_check(gddr_ps *ps, ps_tensor *t, uint32_t rank, const Gddr__Push *p,
                           gddr__frames *f, char *msg, size_t mlen)
{
    size_t need = gddr_bitmap_bytes(t->nchunks);
    const ProtobufCBinaryData *bm = &p->residual_bitmap;
    if (bm->len != need) {
        snprintf(msg, mlen, "bitmap of %zu bytes for %zu chunks (needs %zu)", bm->len, t->nchunks, need);
        return GDDR_EBITMAP;
    }
    if (t->nchunks % 8 && (bm->data[need - 1] >> (t->nchunks % 8))) {
        snprintf(msg, mlen, "bitmap sets chunks past the last of %zu", t->nchunks);
        return GDDR_EBITMAP;
    }
    size_t nsel = 0, nvals = 0;
    gddr_bitmap_count(bm->data, t->n, t->chunk, &nsel, &nvals);
    if (p->residual_payload_bytes != nvals * 4 || gddr__frame_size(f, 3) != nvals * 4) {
        snprintf(msg, mlen, "bitmap selects %zu values; header says %llu bytes, frame holds %zu",
                 nvals, (unsigned long long)p->residual_payload_bytes, gddr__frame_size(f, 3));
        return GDDR_EBITMAP;
    }
    if (!isfinite(l1(gddr__frame_data(f, 3), nvals))) {
        snprintf(msg, mlen, "values hold NaN or Inf");
        return GDDR_ENONFINITE;
    }
    struct ps_orphans *o = state(ps);
    snap_rec *r = find_rec(ps, rank, t->id);
    uint64_t now = o ? o->bytes : 0, old = r ? r->nvals * 4 : 0, add = nvals * 4 + (r ? 0 : 2 * need);
    uint64_t limit = snapshot_limit(ps);
    if (now - old + add > limit) {
        snprintf(msg, mlen, "residual snapshots would hold %llu bytes, above max_snapshot_bytes = %llu",
                 (unsigned long long)(now - old + add), (unsigned long long)limit);
        return GDDR_ETOOBIG;
    }
    return GDDR_OK;
}

static void orphan_free(orphan *x)
{
    free(x->bitmap), free(x->vals), free(x);
}

static void orphan_push(struct ps_orphans *o, orphan *x, size_t nbytes)
{
    x->next = o->orphans;
    o->orphans = x;
    o->bytes += orphan_bytes(x, nbytes);
}

/* Unlinks *pp and frees it. */
static void orphan_drop(struct ps_orphans *o, orphan **pp, size_t nbytes)
{
    orphan *x = *pp;
    *pp = x->next;
    o->bytes -= orphan_bytes(x, nbytes);
    orphan_free(x);
}

/* Packs the chunks of `want` (a subset of `have`) out of vals, which holds
 * the chunks of `have` packed; returns the floats written. */
static size_t select_chunks(const ps_tensor *t, const uint8_t *have, const float *vals,
                            const uint8_t *want, float *out)
{
    size_t in = 0, o = 0;
    for (size_t c = 0; c < t->nchunks; c++) {
        size_t lo = c * t->chunk, len = lo + t->chunk <= t->n ? t->chunk : t->n - lo;
        if (!(have[c / 8] >> (c % 8) & 1))
            continue;
        if (want[c / 8] >> (c % 8) & 1) {
            memcpy(out + o, vals + in, len * 4);
            o += len;
        }
        in += len;
    }
    return o;
}

/* The first push of tensor t by a rank declared dead with an orphan in it. */
static void came_back(gddr_ps *ps, ps_tensor *t, snap_rec *r, uint32_t rank, uint64_t step)
{
    struct ps_orphans *o = state(ps);
    r->dead = 0;
    /* A restarted process counts its steps from 0 again: its residual
     * started empty, so the orphan rightly stays where it went. */
    if (r->dead_clock >= 2 && step + 1 >= r->dead_clock) {
        int withdrawn = 0;
        for (orphan **pp = &o->orphans; *pp; pp = &(*pp)->next) {
            orphan *x = *pp;
            if (!x->withdraw && !x->delivered && x->from_rank == rank && x->id == t->id) {
                gddr_log(GDDR_LOG_INFO,
                         "worker %u was slow, not dead: its orphan residual in tensor '%s' (%zu values) is withdrawn",
                         rank, t->key, x->nvals);
                orphan_drop(o, pp, r->nbytes);
                withdrawn = 1;
                break;
            }
        }
        /* Handed out already: the worker gives the same mass back. */
        orphan *x = withdrawn ? NULL : calloc(1, sizeof *x);
        if (x) {
            x->bitmap = malloc(r->nbytes);
            x->vals = malloc(r->orphan_nvals * 4 + 4);
        }
        if (x && x->bitmap && x->vals) {
            memcpy(x->bitmap, r->orphan_bm, r->nbytes);
            for (size_t i = 0; i < r->orphan_nvals; i++)
                x->vals[i] = -r->orphan_vals[i];
            x->nvals = r->orphan_nvals;
            x->from_rank = rank;
            x->to_rank = rank;
            x->id = t->id;
            x->withdraw = 1;
            x->declared_ms = gddr__now_ms();
            orphan_push(o, x, r->nbytes);
            gddr_log(GDDR_LOG_INFO,
                     "worker %u was slow, not dead: the %zu values of its residual in tensor '%s' handed over at "
                     "its death are taken back from it",
                     rank, x->nvals, t->key);
        } else if (!withdrawn) {
            if (x)
                orphan_free(x);
            gddr_log(GDDR_LOG_ERROR, "out of memory: the orphan of worker %u in tensor '%s' counts twice",
                     rank, t->key);
        }
    }
    o->bytes -= rec_bytes(r);
    free(r->orphan_bm), free(r->orphan_vals);
    r->orphan_bm = NULL;
    r->orphan_vals = NULL;
    r->orphan_nvals = 0;
    o->bytes += rec_bytes(r);
}

/* What a taken push tells about its worker's residual: it came back after
 * a death, it sent chunks its snapshot held, it replayed orphans it was
 * handed, it carries a new snapshot. */
static void after_push(gddr_ps *ps, ps_tensor *t, uint32_t rank, const Gddr__Push *p,
                       gddr__frames *f)
{
    struct ps_orphans *o = state(ps);
    if (!o)
        return;
    snap_rec *r = find_rec(ps, rank, t->id);
    if (r && r->dead)
        came_back(ps, t, r, rank, p->step);
    if (r) {
        /* What this push sent carried the snapshot's value for those chunks. */
        if (p->bitmap.len)
            for (size_t b = 0; b < r->nbytes; b++)
                r->sent[b] |= p->bitmap.data[b];
        else
            memset(r->sent, 0xff, r->nbytes);
    }
    if (p->orphans_replayed) {
        int64_t now = gddr__now_ms();
        for (orphan **pp = &o->orphans; *pp;) {
            orphan *x = *pp;
            if (x->delivered && x->to_rank == rank && x->id == t->id) {
                if (x->withdraw) {
                    gddr_log(GDDR_LOG_INFO, "worker %u gave back its orphan of tensor '%s'", rank, t->key);
                } else {
                    o->recovered++;
                    o->last_recovery_s = (double)(now - x->declared_ms) / 1000.0;
                    gddr_log(GDDR_LOG_INFO,
                             "orphan of rank %u in tensor '%s' re-injected by rank %u %.3f s after the death "
                             "was declared: |.|_1 %.6g of the %.6g that rank last reported holding",
                             x->from_rank, t->key, rank, o->last_recovery_s, x->l1, x->held_l1);
                }
                orphan_drop(o, pp, gddr_bitmap_bytes(t->nchunks));
            } else {
                pp = &x->next;
            }
        }
    }
    if (!p->residual_snapshot)
        return;
    size_t nsel = 0, nvals = 0;
    gddr_bitmap_count(p->residual_bitmap.data, t->n, t->chunk, &nsel, &nvals);
    if (!r && nvals == 0)
        return; /* nothing held and no record: nothing to remember */
    if (!r && !(r = get_rec(ps, rank, t)))
        return;
    float *v = nvals ? malloc(nvals * 4) : NULL;
    if (nvals && !v) {
        gddr_log(GDDR_LOG_WARN, "out of memory: residual snapshot of worker %u in '%s' dropped", rank, t->key);
        return;
    }
    o->bytes -= rec_bytes(r);
    if (nvals)
        memcpy(v, gddr__frame_data(f, 3), nvals * 4);
    free(r->vals);
    r->vals = v;
    r->nvals = nvals;
    memcpy(r->held, p->residual_bitmap.data, r->nbytes);
    memset(r->sent, 0, r->nbytes);
    o->bytes += rec_bytes(r);
}

/* Turns a dead worker's snapshots into orphans waiting for a live worker,
 * and says what its death cost. */
void ps_snapshot_worker_died(gddr_ps *ps, int rank)
{
    struct ps_orphans *o = state(ps);
    if (!o)
        return;
    ps_worker *w = &ps->workers[rank];
    for (size_t id = 0; id < ps->ntensors; id++) {
        ps_tensor *t = ps->tensors[id];
        double held = id < w->nwt ? (double)w->wt[id].residual_l1 : 0.0;
        snap_rec *r = find_rec(ps, (uint32_t)rank, (uint32_t)id);
        orphan *x = NULL;
        if (r) {
            x = calloc(1, sizeof *x);
            if (x) {
                x->bitmap = calloc(r->nbytes, 1);
                x->vals = malloc(r->nvals * 4 + 4);
            }
            if (!x || !x->bitmap || !x->vals) {
                if (x)
                    orphan_free(x);
                gddr_log(GDDR_LOG_ERROR, "out of memory: the residual of worker %d in '%s' is lost", rank,
                         t->key);
                continue;
            }
            for (size_t b = 0; b < r->nbytes; b++)
                x->bitmap[b] = r->held[b] & (uint8_t)~r->sent[b];
            x->nvals = select_chunks(t, r->held, r->vals, x->bitmap, x->vals);
            x->l1 = l1(x->vals, x->nvals);
            x->held_l1 = held;
            /* The snapshot is spent: a rejoining worker starts a fresh one. */
            o->bytes -= rec_bytes(r);
            memset(r->held, 0, r->nbytes);
            memset(r->sent, 0, r->nbytes);
            free(r->vals);
            r->vals = NULL;
            r->nvals = 0;
            r->dead = 0;
            free(r->orphan_bm), free(r->orphan_vals);
            r->orphan_bm = NULL;
            r->orphan_vals = NULL;
            r->orphan_nvals = 0;
            if (x->nvals) {
                /* Kept until the rank pushes again, in case it was only slow. */
                r->orphan_bm = malloc(r->nbytes);
                r->orphan_vals = malloc(x->nvals * 4);
                if (r->orphan_bm && r->orphan_vals) {
                    memcpy(r->orphan_bm, x->bitmap, r->nbytes);
                    memcpy(r->orphan_vals, x->vals, x->nvals * 4);
                    r->orphan_nvals = x->nvals;
                    r->dead = 1;
                    r->dead_clock = w->clock;
                } else {
                    free(r->orphan_bm), free(r->orphan_vals);
                    r->orphan_bm = NULL;
                    r->orphan_vals = NULL;
                }
            }
            o->bytes += rec_bytes(r);
        }
        double handed = x ? x->l1 : 0.0;
        if (held > 0 || handed > 0) {
            o->held_l1_total += held;
            o->handed_l1_total += handed;
            double lost = held > handed ? held - handed : 0.0;
            o->lost_l1_total += lost;
            if (!r)
                gddr_log(GDDR_LOG_WARN,
                         "worker %d held residual |.|_1 %.6g in '%s' and sent no snapshot "
                         "(residual_checkpoint_steps = 0 on the worker): all of it is lost",
                         rank, held, t->key);
            else
                gddr_log(GDDR_LOG_INFO,
                         "worker %d held residual |.|_1 %.6g in '%s'; its snapshot hands over %.6g "
                         "(%zu values), %.6g is lost",
                         rank, held, t->key, handed, x ? x->nvals : 0, lost);
        }
        if (!x)
            continue;
        if (x->nvals == 0) {
            orphan_free(x);
            continue;
        }
        x->from_rank = (uint32_t)rank;
        x->id = (uint32_t)id;
        x->declared_ms = gddr__now_ms();
        orphan_push(o, x, gddr_bitmap_bytes(t->nchunks));
    }
}

/* Hands every undelivered orphan to the live worker that just pushed. */
static void offer_orphans(gddr_ps *ps, zmq_msg_t *ident, uint32_t rank)
{
    struct ps_orphans *o = ps->orphans;
    if (!o || ps->replaying) /* the push log's replay answers nobody (pushlog.c) */
        return;
    for (orphan *x = o->orphans; x; x = x->next) {
        if (x->delivered || (x->withdraw ? x->to_rank != rank : x->from_rank == rank))
            continue;
        ps_tensor *t = x->id < ps->ntensors ? ps->tensors[x->id] : NULL;
        if (!t)
            continue;
        Gddr__Reply r;
        Gddr__Orphan m = GDDR__ORPHAN__INIT;
        ps_reply_init(ps, &r, 0, t);
        m.id = x->id;
        m.from_rank = x->from_rank;
        m.bitmap.data = x->bitmap;
        m.bitmap.len = gddr_bitmap_bytes(t->nchunks);
        m.payload_bytes = x->nvals * 4;
        r.body_case = GDDR__REPLY__BODY_ORPHAN;
        r.orphan = &m;
        gddr__raw raw = { x->vals, x->nvals * 4, NULL, NULL };
        long n = gddr__send(ps->router, ident, &r.base, &raw, 1);
        if (n < 0)
            continue;
        ps->bytes_out += (uint64_t)n;
        x->delivered = 1;
        x->to_rank = rank;
        if (x->withdraw) {
            gddr_log(GDDR_LOG_INFO, "negated orphan (tensor '%s', %zu values) handed back to rank %u",
                     t->key, x->nvals, rank);
            continue;
        }
        o->handed++;
        gddr_log(GDDR_LOG_INFO, "orphan of rank %u (tensor '%s', %zu values, |.|_1 %.6g) handed to rank %u",
                 x->from_rank, t->key, x->nvals, x->l1, rank);
    }
}

void ps_orphans_pushed(gddr_ps *ps, zmq_msg_t *ident, ps_tensor *t, uint32_t rank,
                            const Gddr__Push *p, gddr__frames *f)
{
    after_push(ps, t, rank, p, f);
    offer_orphans(ps, ident, rank);
}

void ps_snapshot_free(gddr_ps *ps)
{
    struct ps_orphans *o = ps->orphans;
    if (!o)
        return;
    while (o->snaps) {
        snap_rec *r = o->snaps;
        o->snaps = r->next;
        free(r->vals), free(r->held), free(r->sent), free(r->orphan_bm), free(r->orphan_vals), free(r);
    }
    while (o->orphans) {
        orphan *x = o->orphans;
        o->orphans = x->next;
        orphan_free(x);
    }
    free(o);
    ps->orphans = NULL;
}

void ps_orphan_stats(gddr_ps *ps, ps_orphan_counts *out)
{
    struct ps_orphans *o = ps->orphans;
    memset(out, 0, sizeof *out);
    if (!o)
        return;
    out->handed = o->handed;
    out->recovered = o->recovered;
    out->last_recovery_s = o->last_recovery_s;
    out->held_l1 = o->held_l1_total;
    out->handed_l1 = o->handed_l1_total;
    out->lost_l1 = o->lost_l1_total;
    out->bytes = o->bytes;
}

/* Checkpoint sections (format 2): "snap/<rank>/<id>": a snap_head (n = the
 * packed values), held bitmap, sent bitmap, packed values. "orphan/<k>":
 * a snap_head (rank = from_rank, n = values), bitmap, packed values -- an
 * orphan not yet handed out (one that was handed out lives in the
 * survivor's residual). Format 1 stored snapshots dense (n = tensor
 * length, values first); such files still load. */
typedef struct snap_head {
    uint32_t rank, id;
    uint64_t n, nbytes;
} snap_head;

int ps_orphan_sections(gddr_ps *ps, struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                            ps_add_section_fn add)
{
    struct ps_orphans *o = ps->orphans;
    for (snap_rec *r = o ? o->snaps : NULL; r; r = r->next) {
        if (!r->nvals)
            continue;
        size_t len = sizeof(snap_head) + 2 * r->nbytes + r->nvals * 4;
        char *buf = malloc(len), *p = buf;
        if (!buf)
            return -1;
        snap_head h = { r->rank, r->id, r->nvals, r->nbytes };
        memcpy(p, &h, sizeof h), p += sizeof h;
        memcpy(p, r->held, r->nbytes), p += r->nbytes;
        memcpy(p, r->sent, r->nbytes), p += r->nbytes;
        memcpy(p, r->vals, r->nvals * 4);
        char name[64];
        snprintf(name, sizeof name, "snap/%u/%u", r->rank, r->id);
        if (add(s, n, cap, name, buf, len) < 0) {
            free(buf);
            return -1;
        }
    }
    int k = 0;
    for (orphan *x = o ? o->orphans : NULL; x; x = x->next) {
        ps_tensor *t = x->id < ps->ntensors ? ps->tensors[x->id] : NULL;
        if (x->delivered || x->withdraw || !t)
            continue;
        size_t nb = gddr_bitmap_bytes(t->nchunks);
        size_t len = sizeof(snap_head) + nb + x->nvals * 4;
        char *buf = malloc(len), *p = buf;
        if (!buf)
            return -1;
        snap_head h = { x->from_rank, x->id, x->nvals, nb };
        memcpy(p, &h, sizeof h), p += sizeof h;
        memcpy(p, x->bitmap, nb), p += nb;
        memcpy(p, x->vals, x->nvals * 4);
        char name[64];
        snprintf(name, sizeof name, "orphan/%d", k++);
        if (add(s, n, cap, name, buf, len) < 0) {
            free(buf);
            return -1;
        }
    }
    return 0;
}

static void restore_snap(gddr_ps *ps, const gddr_ckpt_section *sec, int format)
{
    snap_head h;
    memcpy(&h, sec->data, sizeof h);
    ps_tensor *t = h.id < ps->ntensors ? ps->tensors[h.id] : NULL;
    size_t want = !t ? 0 : format == 1 ? sizeof h + t->n * 4 + 2 * h.nbytes
                                       : sizeof h + 2 * h.nbytes + h.n * 4;
    if (!t || (format == 1 && h.n != t->n) || h.nbytes != gddr_bitmap_bytes(t->nchunks) ||
        sec->len != want || h.rank >= (uint32_t)ps->cfg.max_workers) {
        gddr_log(GDDR_LOG_WARN, "checkpoint section %s does not fit the tensors: ignored", sec->name);
        return;
    }
    snap_rec *r = get_rec(ps, h.rank, t);
    if (!r)
        return;
    struct ps_orphans *o = state(ps);
    o->bytes -= rec_bytes(r);
    const char *p = (const char *)sec->data + sizeof h;
    const float *dense = NULL;
    if (format == 1) {
        dense = (const float *)p;
        p += t->n * 4;
    }
    memcpy(r->held, p, h.nbytes), p += h.nbytes;
    memcpy(r->sent, p, h.nbytes), p += h.nbytes;
    size_t nsel = 0, nvals = 0;
    gddr_bitmap_count(r->held, t->n, t->chunk, &nsel, &nvals);
    if (format != 1 && nvals != h.n) {
        memset(r->held, 0, r->nbytes);
        gddr_log(GDDR_LOG_WARN, "checkpoint section %s: bitmap and values disagree: ignored", sec->name);
    } else if ((r->vals = malloc(nvals * 4 + 4))) {
        if (dense)
            gddr_pack_cpu(dense, t->n, t->chunk, r->held, r->vals, &r->nvals);
        else
            memcpy(r->vals, p, nvals * 4), r->nvals = nvals;
    }
    o->bytes += rec_bytes(r);
}

void ps_orphan_restore(gddr_ps *ps, const struct gddr_ckpt *c, int format)
{
    for (size_t i = 0; i < c->n; i++) {
        const gddr_ckpt_section *sec = &c->s[i];
        if (sec->len < sizeof(snap_head))
            continue;
        if (strncmp(sec->name, "snap/", 5) == 0) {
            restore_snap(ps, sec, format);
            continue;
        }
        if (strncmp(sec->name, "orphan/", 7) != 0)
            continue;
        snap_head h;
        memcpy(&h, sec->data, sizeof h);
        ps_tensor *t = h.id < ps->ntensors ? ps->tensors[h.id] : NULL;
        struct ps_orphans *o = state(ps);
        orphan *x = t && o ? calloc(1, sizeof *x) : NULL;
        if (!x || h.nbytes != gddr_bitmap_bytes(t->nchunks) || sec->len != sizeof h + h.nbytes + h.n * 4) {
            free(x);
            gddr_log(GDDR_LOG_WARN, "checkpoint section %s does not fit the tensors: ignored", sec->name);
            continue;
        }
        x->from_rank = h.rank;
        x->id = h.id;
        x->nvals = h.n;
        x->bitmap = malloc(h.nbytes);
        x->vals = malloc(h.n * 4 + 4);
        if (!x->bitmap || !x->vals) {
            orphan_free(x);
            continue;
        }
        memcpy(x->bitmap, (const char *)sec->data + sizeof h, h.nbytes);
        memcpy(x->vals, (const char *)sec->data + sizeof h + h.nbytes, h.n * 4);
        x->l1 = l1(x->vals, x->nvals);
        x->declared_ms = gddr__now_ms();
        orphan_push(o, x, h.nbytes);
    }
}
