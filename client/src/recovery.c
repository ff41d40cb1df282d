/* recovery.c -- the worker's half of residual recovery
 * (docs/design.md section 7).
 *
 * Every residual_checkpoint_steps a push carries the chunks the worker
 * holds (a snapshot of its residual), so the server can hand them to a
 * live worker if this one dies. The server answers a dead worker's orphan
 * to a survivor with an Orphan message; the survivor adds it to its own
 * residual in installments (replay_decay gamma, the last one takes the
 * remainder), so the sum re-injected is exactly the orphan.
 *
 * The residual's host buffers are made and freed here too, and the mask's
 * arguments of a step given, below both paths of the step (step.c,
 * step_dev.c).
 */
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "client_int.h"
#include "replay.h"
#include "residual.h"

int gddr__residual_alloc(gddr_client *c, ctensor *t)
{
    residual *r = &t->res;
    if (r->r)
        return GDDR_OK;
    r->nchunks = gddr_nchunks(t->n, (uint32_t)c->info.chunk);
    r->r = calloc(t->n, 4);
    r->age = calloc(r->nchunks, sizeof *r->age);
    r->packed = malloc(t->n * 4);
    r->bitmap = calloc(gddr_bitmap_bytes(r->nchunks), 1);
    if (!r->r || !r->age || !r->packed || !r->bitmap) {
        gddr__residual_free(t);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for the residual of '%s'", t->key);
    }
    return GDDR_OK;
}

void gddr__residual_free(ctensor *t)
{
    free(t->res.r);
    free(t->res.age);
    free(t->res.packed);
    free(t->res.bitmap);
    free(t->res.orphan);
    free(t->res.snap);
    free(t->res.snap_bm);
    free(t->res.score);
    free(t->res.pick);
    free(t->res.order);
    memset(&t->res, 0, sizeof t->res);
}

int gddr__residual_snapshot(gddr_client *c, int i, const uint8_t *sent_bm, const float **snap,
                            const uint8_t **snap_bm, size_t *snap_vals)
{
    *snap = NULL;
    *snap_bm = NULL;
    *snap_vals = 0;
    int every = c->o.residual_checkpoint_steps;
    if (every <= 0 || (c->step + 1) % (uint64_t)every != 0)
        return GDDR_OK;
    /* Every chunk was sent (a dense push, sent_bm == NULL): the worker
     * holds nothing, and the push goes without a chunk bitmap, so a
     * snapshot bitmap could not travel with it (the wire gives the snapshot
     * the push's bitmap length, 0 here, which the server rejects with
     * GDDR_EBITMAP). None is needed: the server marks every chunk of a
     * dense push as sent since the last snapshot, so that snapshot's orphan
     * becomes empty -- exactly what an empty snapshot would say. */
    if (!sent_bm)
        return GDDR_OK;
    ctensor *t = &c->t[i];
    residual *r = &t->res;
    size_t bytes = gddr_bitmap_bytes(r->nchunks);
    if (!r->snap_bm && !(r->snap_bm = calloc(bytes, 1)))
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for a residual snapshot");
    /* Held = not sent. Padding bits past the last chunk stay zero. */
    for (size_t b = 0; b < bytes; b++)
        r->snap_bm[b] = (uint8_t)~sent_bm[b];
    if (r->nchunks % 8)
        r->snap_bm[bytes - 1] &= (uint8_t)((1u << (r->nchunks % 8)) - 1);
    size_t nsel = 0, nvals = 0;
    gddr_bitmap_count(r->snap_bm, t->n, (uint32_t)c->info.chunk, &nsel, &nvals);
    if (!r->snap && !(r->snap = malloc(t->n * 4)))
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for a residual snapshot");
    size_t np = 0;
    gddr_pack_cpu(r->r, t->n, (uint32_t)c->info.chunk, r->snap_bm, r->snap, &np);
    *snap = r->snap;
    *snap_bm = r->snap_bm;
    *snap_vals = np;
    return GDDR_OK;
}

void gddr__orphan_received(gddr_client *c, const Gddr__Orphan *o, gddr__frames *f)
{
    ctensor *t = NULL;
    for (int i = 0; i < c->nt; i++)
        if (c->t[i].sid == o->id)
            t = &c->t[i];
    if (!t || f->n != 2 || gddr__frame_size(f, 1) != o->payload_bytes) {
        gddr__logf(&c->log, GDDR_LOG_WARN, "dropped a malformed orphan for tensor id %u", o->id);
        return;
    }
    size_t nchunks = gddr_nchunks(t->n, (uint32_t)c->info.chunk);
    size_t nsel = 0, nvals = 0;
    if (o->bitmap.len != gddr_bitmap_bytes(nchunks)) {
        gddr__logf(&c->log, GDDR_LOG_WARN, "dropped an orphan with a bad bitmap for '%s'", t->key);
        return;
    }
    gddr_bitmap_count(o->bitmap.data, t->n, (uint32_t)c->info.chunk, &nsel, &nvals);
    if (nvals * 4 != o->payload_bytes) {
        gddr__logf(&c->log, GDDR_LOG_WARN, "dropped an orphan whose payload does not match its bitmap");
        return;
    }
    residual *r = &t->res;
    if (!r->orphan && !(r->orphan = calloc(t->n, 4)))
        return;
    /* Orphans of several dead workers simply add up. */
    gddr_unpack_cpu(gddr__frame_data(f, 1), o->bitmap.data, t->n, (uint32_t)c->info.chunk, 1.0f, 1,
                    r->orphan);
    r->orphan_left = 8; /* gamma = 0.5: 1/2, 1/4, ... then the remainder */
    c->k.orphans_received++;
    gddr__logf(&c->log, GDDR_LOG_INFO, "took over an orphan residual of rank %u for '%s' (%zu values)",
               o->from_rank, t->key, nvals);
}

void gddr__orphan_replay(gddr_client *c, int i, float *target)
{
    ctensor *t = &c->t[i];
    residual *r = &t->res;
    if (!r->orphan)
        return;
    /* gamma, gamma(1-gamma), ... and the last installment takes the
     * remainder, so the installments add up to the orphan exactly. */
    int last = r->orphan_left <= 1;
    gddr_replay_cpu(target, r->orphan, t->n, (float)c->o.replay_decay, last);
    if (!last) {
        r->orphan_left--;
        return;
    }
    free(r->orphan);
    r->orphan = NULL;
    r->orphan_left = 0;
    t->orphan_done = 1;
    gddr__logf(&c->log, GDDR_LOG_INFO, "orphan residual of '%s' fully re-injected", t->key);
}

/* On close, a GDDR worker still holds part of its gradients; push them so
 * that a finished run has lost nothing (Σ sent = Σ g exactly). Held chunks
 * are those whose age is above zero. An orphan still being replayed joins
 * the residual first, whole (its remainder is the last installment), so a
 * survivor that closes in the middle of a replay loses none of it either;
 * the chunks it touches go out with the held ones. */
int gddr__residual_flush(gddr_client *c)
{
    int rc = GDDR_OK;
    uint32_t chunk = (uint32_t)c->info.chunk;
    for (int i = 0; i < c->nt && rc == GDDR_OK; i++) {
        ctensor *t = &c->t[i];
        residual *r = &t->res;
        if (!r->r || !r->age || !r->bitmap)
            continue;
        if (r->orphan) {
            r->orphan_left = 1;
            gddr__orphan_replay(c, i, r->r);
        }
        size_t bytes = gddr_bitmap_bytes(r->nchunks), any = 0;
        memset(r->bitmap, 0, bytes);
        for (size_t ch = 0; ch < r->nchunks; ch++) {
            int held = r->age[ch] > 0;
            for (size_t k = ch * chunk; !held && k < t->n && k < (ch + 1) * chunk; k++)
                held = r->r[k] != 0.0f;
            if (held) {
                r->bitmap[ch / 8] |= (uint8_t)(1u << (ch % 8));
                any++;
            }
        }
        if (!any)
            continue;
        size_t np = 0;
        gddr_pack_cpu(r->r, t->n, (uint32_t)c->info.chunk, r->bitmap, r->packed, &np);
        /* Marked as a flush: in sync mode the server weighs it as a share
         * of the steps it came from, not as a step of its own. */
        gddr__push_args a = { .vals = r->packed, .bitmap = r->bitmap, .bitmap_len = bytes,
                              .nvals = np, .birth = t->version, .base = t->version,
                              .step = gddr__push_step(c, i), .flush = 1, .lend = 1 };
        double mass = gddr_asum_cpu(r->packed, np);
        rc = gddr__push_wait(c, i, &a, NULL);
        if (rc == GDDR_OK) {
            memset(r->r, 0, t->n * 4);
            memset(r->age, 0, r->nchunks * sizeof *r->age);
            gddr__logf(&c->log, GDDR_LOG_INFO, "flushed %zu held chunks of '%s' on close (|r|_1 %.6g)",
                       any, t->key, mass);
        }
    }
    return rc;
}

/* Whether this client's holds follow the staggered schedule (hold_schedule,
 * and for auto the server's mode). */
static int hold_staggered(const gddr_client *c)
{
    return c->o.hold_schedule == GDDR_HOLD_STAGGERED ||
           (c->o.hold_schedule == GDDR_HOLD_AUTO && c->info.mode == GDDR_MODE_SYNC);
}

/* Whether this client holds the smallest chunks (hold_schedule, and for
 * auto the server's mode: async and ssp; docs/design.md, "Holding the
 * smallest chunks"). */
int gddr__holds_smallest(const gddr_client *c)
{
    return c->o.hold_schedule == GDDR_HOLD_SMALLEST ||
           (c->o.hold_schedule == GDDR_HOLD_AUTO && c->info.mode != GDDR_MODE_SYNC);
}

int gddr__residual_pick_bufs(gddr_client *c, int i)
{
    residual *r = &c->t[i].res;
    size_t nch = r->nchunks ? r->nchunks : 1;
    if (!r->score)
        r->score = malloc(nch * sizeof *r->score);
    if (!r->pick)
        r->pick = malloc(nch);
    if (!r->order)
        r->order = malloc(nch * sizeof *r->order);
    if (!r->score || !r->pick || !r->order)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for the hold scores of '%s'", c->t[i].key);
    return GDDR_OK;
}

int gddr__residual_pick(gddr_client *c, int i, int host, const float *g, gddr_residual_args *a)
{
    ctensor *t = &c->t[i];
    residual *r = &t->res;
    int rc = gddr__residual_pick_bufs(c, i);
    if (rc != GDDR_OK)
        return rc;
    if (host && gddr_chunk_scores_cpu(g, r->r, t->n, a->chunk, r->score) != GDDR_OK)
        return gddr__set_err(c, GDDR_EINVAL, "hold scores of '%s' failed", t->key);
    if (gddr_hold_smallest(a, c->o.delay_fraction, r->score, r->age, r->pick, r->order) < 0)
        return gddr__set_err(c, GDDR_EINVAL, "picking the holds of '%s' failed", t->key);
    a->pick = r->pick;
    return GDDR_OK;
}

gddr_residual_args gddr__residual_args(const gddr_client *c, int i)
{
    const ctensor *t = &c->t[i];
    uint32_t tau = (uint32_t)(t->tau > 0 ? t->tau : 1);
    /* delay_auto's flush step (push_dense 2) holds nothing. */
    float alpha = c->push_dense ? 0.0f : gddr_hold_probability((float)c->o.delay_fraction, tau);
    gddr_residual_args a = { t->n, (uint32_t)c->info.chunk, alpha, tau, c->o.seed,
                             (uint32_t)c->info.rank, t->keyhash, c->step, t->chunk0, 0, 0, NULL };
    if (a.alpha > 0 && hold_staggered(c)) {
        /* The cycle's clock: in sync mode the version the gradient was
         * computed on, which every worker of a step shares -- also one
         * restarted or joining late, whose own step count starts at 0;
         * otherwise this worker's steps (a version moves with every
         * worker's push there). */
        uint64_t clock = c->info.mode == GDDR_MODE_SYNC ? t->version : c->step;
        a.period = gddr_hold_period(c->o.delay_fraction, tau);
        a.phase = gddr_hold_phase(a.period, a.worker, (uint32_t)c->o.world_size, clock);
    }
    return a;
}
