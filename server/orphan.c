/* orphan.c -- residual snapshots and orphan hand-off (DESIGN section 7).
 *
 * A GDDR worker holds part of its gradients back in a residual; if it dies
 * that mass would be lost and the model would drift (the seed's "residual
 * avalanche"). So every residual_checkpoint_steps a worker's push carries
 * the chunks it holds. For each (worker, tensor) the server keeps:
 *   snap   the held values at the last snapshot (dense, n floats)
 *   held   which chunks the snapshot holds
 *   sent   which chunks the worker pushed since the snapshot
 * A chunk pushed after the snapshot carried its held value out with it
 * (u = r + g), so when the worker dies the orphan is held & ~sent. The
 * orphan goes to the next live worker that pushes, which replays it into
 * its own residual in installments. What is lost is only what the dead
 * worker accumulated after its last snapshot.
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
    size_t n, nbytes;       /* floats, bitmap bytes */
    float *snap;
    uint8_t *held, *sent;
    /* Set at a death that left an orphan here: the worker's clock then and
     * the chunks of snap that went out as the orphan. */
    int dead;
    uint64_t dead_clock;
    uint8_t *orphan_bm;
    struct snap_rec *next;
} snap_rec;

typedef struct orphan {
    uint32_t from_rank, id, to_rank;
    size_t nvals;
    uint8_t *bitmap;
    float *vals;            /* packed held & ~sent chunks */
    int64_t declared_ms;
    int delivered;
    int withdraw;           /* the negated orphan of a worker that was only
                             * slow, for that worker itself (to_rank) */
    struct orphan *next;
} orphan;

struct ps_orphans {
    snap_rec *snaps;
    orphan *orphans;
    uint64_t handed, recovered;
    double last_recovery_s;
};

static struct ps_orphans *state(gddr_ps *ps)
{
    if (!ps->orphans)
        ps->orphans = calloc(1, sizeof *ps->orphans);
    return ps->orphans;
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
    r->n = t->n;
    r->nbytes = gddr_bitmap_bytes(t->nchunks);
    r->snap = calloc(t->n, sizeof(float));
    r->held = calloc(r->nbytes, 1);
    r->sent = calloc(r->nbytes, 1);
    if (!r->snap || !r->held || !r->sent) {
        free(r->snap), free(r->held), free(r->sent), free(r);
        return NULL;
    }
    r->next = o->snaps;
    o->snaps = r;
    return r;
}

int gddr_ps_snapshot_check(gddr_ps *ps, ps_tensor *t, const Gddr__Push *p, gddr__frames *f,
                           char *msg, size_t mlen)
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
    if (!ps_all_finite(gddr__frame_data(f, 3), nvals)) {
        snprintf(msg, mlen, "values hold NaN or Inf");
        return GDDR_ENONFINITE;
    }
    return GDDR_OK;
}

static void orphan_free(orphan *x)
{
    free(x->bitmap), free(x->vals), free(x);
}

/* The first push of tensor t by a rank declared dead with an orphan in it. */
static void came_back(gddr_ps *ps, ps_tensor *t, snap_rec *r, uint32_t rank, uint64_t step)
{
    r->dead = 0;
    /* A restarted process counts its steps from 0 again: its residual
     * started empty, so the orphan rightly stays where it went. */
    if (r->dead_clock < 2 || step + 1 < r->dead_clock)
        return;
    struct ps_orphans *o = state(ps);
    for (orphan **pp = &o->orphans; *pp; pp = &(*pp)->next) {
        orphan *x = *pp;
        if (!x->withdraw && !x->delivered && x->from_rank == rank && x->id == t->id) {
            *pp = x->next;
            gddr_log(GDDR_LOG_INFO,
                     "worker %u was slow, not dead: its orphan residual in tensor '%s' (%zu values) is withdrawn",
                     rank, t->key, x->nvals);
            orphan_free(x);
            return;
        }
    }
    /* Handed out already: the worker gives the same mass back. */
    orphan *x = calloc(1, sizeof *x);
    if (x) {
        x->bitmap = malloc(r->nbytes);
        x->vals = malloc(r->n * sizeof(float));
    }
    if (!x || !x->bitmap || !x->vals) {
        if (x)
            orphan_free(x);
        gddr_log(GDDR_LOG_ERROR, "out of memory: the orphan of worker %u in tensor '%s' counts twice",
                 rank, t->key);
        return;
    }
    memcpy(x->bitmap, r->orphan_bm, r->nbytes);
    gddr_pack_cpu(r->snap, r->n, t->chunk, x->bitmap, x->vals, &x->nvals);
    for (size_t i = 0; i < x->nvals; i++)
        x->vals[i] = -x->vals[i];
    x->from_rank = rank;
    x->to_rank = rank;
    x->id = t->id;
    x->withdraw = 1;
    x->declared_ms = gddr__now_ms();
    x->next = o->orphans;
    o->orphans = x;
    gddr_log(GDDR_LOG_INFO,
             "worker %u was slow, not dead: the %zu values of its residual in tensor '%s' handed over at "
             "its death are taken back from it",
             rank, x->nvals, t->key);
}

void gddr_ps_snapshot_after_push(gddr_ps *ps, ps_tensor *t, uint32_t rank, const Gddr__Push *p,
                                 gddr__frames *f)
{
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
        struct ps_orphans *o = state(ps);
        int64_t now = gddr__now_ms();
        for (orphan **pp = &o->orphans; *pp;) {
            orphan *x = *pp;
            if (x->delivered && x->to_rank == rank && x->id == t->id) {
                if (x->withdraw) {
                    gddr_log(GDDR_LOG_INFO, "worker %u gave back its orphan of tensor %u", rank, x->id);
                } else {
                    o->recovered++;
                    o->last_recovery_s = (double)(now - x->declared_ms) / 1000.0;
                    gddr_log(GDDR_LOG_INFO,
                             "orphan of rank %u (tensor %u) fully re-injected by rank %u %.3f s after the death was declared",
                             x->from_rank, x->id, rank, o->last_recovery_s);
                }
                *pp = x->next;
                orphan_free(x);
            } else {
                pp = &x->next;
            }
        }
    }
    if (!p->residual_snapshot)
        return;
    if (!r && !(r = get_rec(ps, rank, t)))
        return;
    memset(r->snap, 0, r->n * sizeof(float));
    memcpy(r->held, p->residual_bitmap.data, r->nbytes);
    memset(r->sent, 0, r->nbytes);
    gddr_unpack_cpu(gddr__frame_data(f, 3), r->held, r->n, t->chunk, 1.0f, 0, r->snap);
}

/* Turns a dead worker's snapshots into orphans waiting for a live worker. */
void gddr_ps_snapshot_worker_died(gddr_ps *ps, int rank)
{
    struct ps_orphans *o = state(ps);
    if (!o)
        return;
    for (snap_rec *r = o->snaps; r; r = r->next) {
        if (r->rank != (uint32_t)rank)
            continue;
        ps_tensor *t = r->id < ps->ntensors ? ps->tensors[r->id] : NULL;
        if (!t)
            continue;
        orphan *x = calloc(1, sizeof *x);
        if (!x)
            return;
        x->bitmap = calloc(r->nbytes, 1);
        x->vals = malloc(r->n * sizeof(float));
        if (!x->bitmap || !x->vals) {
            free(x->bitmap), free(x->vals), free(x);
            return;
        }
        for (size_t b = 0; b < r->nbytes; b++)
            x->bitmap[b] = r->held[b] & (uint8_t)~r->sent[b];
        gddr_pack_cpu(r->snap, r->n, t->chunk, x->bitmap, x->vals, &x->nvals);
        /* The snapshot is spent: a rejoining worker starts a fresh one. */
        memset(r->held, 0, r->nbytes);
        memset(r->sent, 0, r->nbytes);
        r->dead = 0;
        if (x->nvals == 0) {
            free(x->bitmap), free(x->vals), free(x);
            continue;
        }
        /* Kept until the rank pushes again, in case it was only slow. */
        if (r->orphan_bm || (r->orphan_bm = malloc(r->nbytes))) {
            memcpy(r->orphan_bm, x->bitmap, r->nbytes);
            r->dead = 1;
            r->dead_clock = ps->workers[rank].clock;
        }
        x->from_rank = (uint32_t)rank;
        x->id = r->id;
        x->declared_ms = gddr__now_ms();
        x->next = o->orphans;
        o->orphans = x;
        gddr_log(GDDR_LOG_INFO, "rank %d left an orphan residual of %zu values in tensor '%s'", rank,
                 x->nvals, t->key);
    }
}

void gddr_ps_snapshot_rejoined(gddr_ps *ps, uint32_t rank)
{
    (void)ps;
    (void)rank; /* its orphan, if any, is already waiting for whoever pushes next */
}

/* Hands every undelivered orphan to the live worker that just pushed. */
void gddr_ps_snapshot_offer_orphans(gddr_ps *ps, zmq_msg_t *ident, uint32_t rank)
{
    struct ps_orphans *o = ps->orphans;
    if (!o)
        return;
    for (orphan *x = o->orphans; x; x = x->next) {
        if (x->delivered || (x->withdraw ? x->to_rank != rank : x->from_rank == rank))
            continue;
        ps_tensor *t = x->id < ps->ntensors ? ps->tensors[x->id] : NULL;
        if (!t)
            continue;
        Gddr__Reply r = GDDR__REPLY__INIT;
        Gddr__Orphan m = GDDR__ORPHAN__INIT;
        r.protocol = GDDR__CONST__PROTOCOL_VERSION;
        r.req_id = 0;
        r.epoch = ps->epoch;
        r.tau = (uint32_t)t->tau;
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
        gddr_log(GDDR_LOG_INFO, "orphan of rank %u (tensor '%s', %zu values) handed to rank %u", x->from_rank,
                 t->key, x->nvals, rank);
    }
}

void gddr_ps_snapshot_free(gddr_ps *ps)
{
    struct ps_orphans *o = ps->orphans;
    if (!o)
        return;
    while (o->snaps) {
        snap_rec *r = o->snaps;
        o->snaps = r->next;
        free(r->snap), free(r->held), free(r->sent), free(r->orphan_bm), free(r);
    }
    while (o->orphans) {
        orphan *x = o->orphans;
        o->orphans = x->next;
        free(x->bitmap), free(x->vals), free(x);
    }
    free(o);
    ps->orphans = NULL;
}

void gddr_ps_orphan_stats(gddr_ps *ps, uint64_t *handed, uint64_t *recovered, double *last_s)
{
    struct ps_orphans *o = ps->orphans;
    *handed = o ? o->handed : 0;
    *recovered = o ? o->recovered : 0;
    *last_s = o ? o->last_recovery_s : 0;
}

/* Checkpoint sections: "snap/<rank>/<id>": u32 rank, id; u64 n, nbytes;
 * snap values; held; sent. "orphan/<k>": u32 from_rank, id; u64 nvals,
 * nbytes; bitmap; packed values -- an orphan not yet handed out (one that
 * was handed out lives in the survivor's residual). */
typedef struct snap_head {
    uint32_t rank, id;
    uint64_t n, nbytes;
} snap_head;

int gddr_ps_orphan_sections(gddr_ps *ps, struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                            gddr_ps_add_section_fn add)
{
    struct ps_orphans *o = ps->orphans;
    for (snap_rec *r = o ? o->snaps : NULL; r; r = r->next) {
        size_t len = sizeof(snap_head) + r->n * 4 + 2 * r->nbytes;
        char *buf = malloc(len), *p = buf;
        if (!buf)
            return -1;
        snap_head h = { r->rank, r->id, r->n, r->nbytes };
        memcpy(p, &h, sizeof h), p += sizeof h;
        memcpy(p, r->snap, r->n * 4), p += r->n * 4;
        memcpy(p, r->held, r->nbytes), p += r->nbytes;
        memcpy(p, r->sent, r->nbytes);
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

void gddr_ps_orphan_restore(gddr_ps *ps, const struct gddr_ckpt *c)
{
    for (size_t i = 0; i < c->n; i++) {
        const gddr_ckpt_section *sec = &c->s[i];
        if (strncmp(sec->name, "orphan/", 7) == 0 && sec->len >= sizeof(snap_head)) {
            snap_head h;
            memcpy(&h, sec->data, sizeof h);
            ps_tensor *t = h.id < ps->ntensors ? ps->tensors[h.id] : NULL;
            struct ps_orphans *o = state(ps);
            orphan *x = t && o ? calloc(1, sizeof *x) : NULL;
            if (!x || h.nbytes != gddr_bitmap_bytes(t->nchunks) ||
                sec->len != sizeof h + h.nbytes + h.n * 4) {
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
                free(x->bitmap), free(x->vals), free(x);
                continue;
            }
            memcpy(x->bitmap, (const char *)sec->data + sizeof h, h.nbytes);
            memcpy(x->vals, (const char *)sec->data + sizeof h + h.nbytes, h.n * 4);
            x->declared_ms = gddr__now_ms();
            x->next = o->orphans;
            o->orphans = x;
            continue;
        }
        if (strncmp(sec->name, "snap/", 5) != 0 || sec->len < sizeof(snap_head))
            continue;
        snap_head h;
        memcpy(&h, sec->data, sizeof h);
        ps_tensor *t = h.id < ps->ntensors ? ps->tensors[h.id] : NULL;
        if (!t || h.n != t->n || h.nbytes != gddr_bitmap_bytes(t->nchunks) ||
            sec->len != sizeof h + h.n * 4 + 2 * h.nbytes || h.rank >= (uint32_t)ps->cfg.max_workers) {
            gddr_log(GDDR_LOG_WARN, "checkpoint section %s does not fit the tensors: ignored", sec->name);
            continue;
        }
        snap_rec *r = get_rec(ps, h.rank, t);
        if (!r)
            return;
        const char *p = (const char *)sec->data + sizeof h;
        memcpy(r->snap, p, h.n * 4), p += h.n * 4;
        memcpy(r->held, p, h.nbytes), p += h.nbytes;
        memcpy(r->sent, p, h.nbytes);
    }
}
