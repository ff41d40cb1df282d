/* parts.c -- pushes that arrive in parts (Push.parts > 1).
 *
 * A client sends a large tensor's push as several messages, each a run of
 * whole chunks (proto/gddr.proto, Push.part). The server checks each part
 * as it arrives -- layout, finiteness, its share of the norm -- while the
 * next one is still on the wire, and keeps its frame (no copy). When the
 * last part is in, the push is taken as one update, exactly as if it had
 * come in one message: one version, one staleness, one exactly-once step.
 * Its apply then reads the values from the kept frames (ps_job.src) and
 * runs on the pool like any other.
 *
 * Why not apply each part as it comes: the version a push lands on and its
 * staleness (so AdaDelay's step) are only known when it is taken, and a
 * pull in between must never see half a push. What overlaps is what can:
 * receiving part k+1 with checking part k, and receiving the next push
 * with applying this one.
 *
 * State: one partial push per (rank, tensor) at most, in a short list (as
 * many entries as workers pushing large tensors at once). A newer step
 * replaces an unfinished older one; a new process for the rank drops its
 * partials (ps_parts_drop_rank).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gddr_base.h"
#include "blas.h"
#include "log.h"
#include "ps.h"
#include "residual.h"

struct ps_partial {
    uint32_t rank, id;
    uint64_t step;
    uint32_t parts, got;     /* parts announced, parts held (in order) */
    uint64_t next_chunk;     /* where the next part must start */
    int failed;              /* refused once: the rest of this step is dropped */
    /* what every part must repeat */
    uint64_t birth, base;
    float grad_norm, residual_l1;
    int norm_from_payload, held;
    double lr;
    double sumsq;            /* of the values held so far */
    const float **src;       /* per chunk: its values in a kept frame, NULL absent */
    zmq_msg_t *msgs;
    struct ps_partial *next;
};

static void partial_release(ps_partial *q)
{
    for (uint32_t k = 0; k < q->got && q->msgs; k++)
        zmq_msg_close(&q->msgs[k]);
    free(q->msgs);
    free(q->src);
    q->msgs = NULL;
    q->src = NULL;
    q->got = 0;
}

static void partial_unlink(gddr_ps *ps, ps_partial *q)
{
    for (ps_partial **pp = &ps->partials; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    partial_release(q);
    free(q);
}

void ps_parts_drop_rank(gddr_ps *ps, uint32_t rank)
{
    ps_partial **pp = &ps->partials;
    while (*pp) {
        ps_partial *q = *pp;
        if (q->rank == rank) {
            *pp = q->next;
            partial_release(q);
            free(q);
        } else {
            pp = &q->next;
        }
    }
}

void ps_parts_free(gddr_ps *ps)
{
    while (ps->partials) {
        ps_partial *q = ps->partials;
        ps->partials = q->next;
        partial_release(q);
        free(q);
    }
}

static ps_partial *partial_find(gddr_ps *ps, uint32_t rank, uint32_t id)
{
    for (ps_partial *q = ps->partials; q; q = q->next)
        if (q->rank == rank && q->id == id)
            return q;
    return NULL;
}

/* Starts (or restarts) the partial push of rq's rank to t. */
static ps_partial *partial_begin(gddr_ps *ps, ps_partial *q, const Gddr__Request *rq,
                                 const ps_tensor *t)
{
    const Gddr__Push *p = rq->push;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q)
            return NULL;
        q->rank = rq->rank;
        q->id = t->id;
        q->next = ps->partials;
        ps->partials = q;
    }
    partial_release(q);
    q->step = p->step;
    q->parts = p->parts;
    q->next_chunk = 0;
    q->failed = 0;
    q->birth = p->birth_version;
    q->base = p->base_version;
    q->grad_norm = p->grad_norm;
    q->residual_l1 = p->residual_l1;
    q->norm_from_payload = p->norm_from_payload;
    q->held = p->held;
    q->lr = p->lr;
    q->sumsq = 0;
    q->src = calloc(t->nchunks, sizeof *q->src);
    q->msgs = calloc(p->parts, sizeof *q->msgs);
    if (!q->src || !q->msgs) {
        partial_unlink(ps, q);
        return NULL;
    }
    return q;
}

/* Refuses the push this part belongs to; later parts of it are dropped. */
static int part_refuse(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, ps_partial *q, int code,
                       const char *what, const ps_tensor *t)
{
    if (q) {
        partial_release(q);
        q->failed = 1;
    }
    ps_reject(ps, ident, req_id, code, "push to tensor '%s' in parts: %s", t->key, what);
    return PS_PART_REFUSED;
}

int ps_part_take(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f,
                 ps_tensor *t, ps_whole *out)
{
    const Gddr__Push *p = rq->push;
    uint64_t id = rq->req_id;
    char msg[200];
    ps_partial *q = partial_find(ps, rq->rank, t->id);
    if (p->residual_snapshot || p->flush)
        return part_refuse(ps, ident, id, q && q->step == p->step ? q : NULL, GDDR_EPROTO,
                           "a flush or a residual snapshot travels in one message", t);
    if (p->part >= p->parts || p->parts > t->nchunks) {
        /* (a part holds at least one chunk: more parts than chunks is a
         * lie, and would have the server allocate for it) */
        snprintf(msg, sizeof msg, "part %u of %u (the tensor has %zu chunks)", p->part, p->parts,
                 t->nchunks);
        return part_refuse(ps, ident, id, NULL, GDDR_EPROTO, msg, t);
    }
    if (q && q->step == p->step && q->failed)
        return PS_PART_HELD; /* answered already */
    if (p->part == 0) {
        /* A first part: a new push, or a resend of this one from the top
         * (after a reconnect): start over either way. */
        q = partial_begin(ps, q, rq, t);
        if (!q)
            return part_refuse(ps, ident, id, NULL, GDDR_ENOMEM, "no memory", t);
    } else if (!q || q->step != p->step || q->parts != p->parts) {
        /* Its first part never reached this server (it restarted, or the
         * connection broke): the client sends the whole push again. */
        gddr_log(GDDR_LOG_DEBUG, "worker %u: part %u of step %llu to '%s' without its first; dropped",
                 rq->rank, p->part, (unsigned long long)p->step, t->key);
        return PS_PART_HELD;
    } else if (p->part < q->got) {
        return PS_PART_HELD; /* a part held already (a resend overlapping) */
    } else if (p->part > q->got) {
        snprintf(msg, sizeof msg, "part %u arrived after part %u", p->part, q->got ? q->got - 1 : 0);
        return part_refuse(ps, ident, id, q, GDDR_EPROTO, msg, t);
    }
    if (p->birth_version != q->birth || p->base_version != q->base ||
        p->grad_norm != q->grad_norm || p->residual_l1 != q->residual_l1 ||
        p->norm_from_payload != q->norm_from_payload || p->held != q->held || p->lr != q->lr)
        return part_refuse(ps, ident, id, q, GDDR_EPROTO,
                           "parts of one push disagree on versions, norm, residual, lr or held", t);
    /* The part's chunks: the next run, whole, the last one ending the tensor. */
    uint64_t c0 = p->first_chunk, nc = p->part_chunks;
    if (c0 != q->next_chunk || nc == 0 || nc > t->nchunks - c0 ||
        (p->part + 1 == p->parts) != (c0 + nc == t->nchunks)) {
        snprintf(msg, sizeof msg, "part %u covers chunks [%llu, %llu), expected to start at %llu of %zu",
                 p->part, (unsigned long long)c0, (unsigned long long)(c0 + nc),
                 (unsigned long long)q->next_chunk, t->nchunks);
        return part_refuse(ps, ident, id, q, GDDR_EPROTO, msg, t);
    }
    size_t bmlen = p->bitmap.len;
    if (bmlen && (bmlen != gddr_bitmap_bytes(nc) || (nc % 8 && (p->bitmap.data[bmlen - 1] >> (nc % 8))))) {
        snprintf(msg, sizeof msg, "bitmap of %zu bytes for a part of %llu chunks", bmlen,
                 (unsigned long long)nc);
        return part_refuse(ps, ident, id, q, GDDR_EBITMAP, msg, t);
    }
    size_t frame = gddr__frame_size(f, 2);
    if (p->payload_bytes != frame) {
        snprintf(msg, sizeof msg, "header says %llu payload bytes, frame holds %zu",
                 (unsigned long long)p->payload_bytes, frame);
        return part_refuse(ps, ident, id, q, GDDR_ELENGTH, msg, t);
    }
    /* Kept first, then pointed into: a very small message lives inside its
     * zmq_msg_t, so its data moves with it. */
    zmq_msg_t *m = &q->msgs[q->got];
    zmq_msg_init(m);
    zmq_msg_move(m, &f->part[2]);
    const float *vals = zmq_msg_data(m);
    size_t o = 0;
    for (uint64_t k = 0; k < nc; k++) {
        size_t c = (size_t)(c0 + k);
        size_t lo = c * t->chunk;
        size_t len = lo + t->chunk <= t->n ? t->chunk : t->n - lo;
        if (bmlen && !(p->bitmap.data[k / 8] >> (k % 8) & 1))
            continue;
        if ((o + len) * 4 <= frame)
            q->src[c] = vals + o;
        o += len;
    }
    q->got++; /* held (released with the partial, whatever happens next) */
    if (o * 4 != frame) {
        snprintf(msg, sizeof msg, "the part's chunks hold %zu values but the payload %zu bytes", o, frame);
        return part_refuse(ps, ident, id, q, bmlen ? GDDR_EBITMAP : GDDR_ELENGTH, msg, t);
    }
    double sq = gddr_sumsq_fp32_cpu(vals, o); /* NaN or Inf anywhere makes it so */
    if (!isfinite(sq))
        return part_refuse(ps, ident, id, q, GDDR_ENONFINITE, "NaN or Inf in the values", t);
    q->sumsq += sq;
    ps->push_parts++;
    q->next_chunk = c0 + nc;
    if (q->got < q->parts)
        return PS_PART_HELD;
    /* Whole: the frames and the chunk table go to the caller (then the pool). */
    out->src = q->src;
    out->msgs = q->msgs;
    out->nmsgs = (int)q->got;
    out->norm = sqrt(q->sumsq);
    q->src = NULL;
    q->msgs = NULL;
    q->got = 0;
    partial_unlink(ps, q);
    return PS_PART_DONE;
}
