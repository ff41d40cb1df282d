/* push.c -- a push, from its checked frames to the pool: what the front
 * end (server.c) does with a Push request once dispatch() has seen that a
 * worker owns it.
 *
 * The layout of the payload (dense, or chunks named by a bitmap) is
 * checked against the tensor; a resend is answered with the first answer
 * (exactly once per rank, tensor and step); a push in parts is gathered
 * (parts.c) until it is whole. Then push_take() checks what needs the
 * tensor's state (versions, finiteness, the norm guard, the residual
 * snapshot) and takes it: applied at once (async, ssp; apply.c) or added
 * into the sync step being collected (sync.c), with held chunks credited
 * to fill (fill.c). Its reply, the staleness statistics, the tau
 * controller and orphan hand-outs follow.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ps.h"
#include "syncstep.h"
#include "push.h"
#include "residual.h"
#include "snapshot.h"

/* The per-chunk sums of squares of the push being validated, grown to t's
 * chunks like the offsets below. One read of the payload gives its L2 norm,
 * and with it whether every value is finite (a NaN or Inf makes the sum of
 * squares NaN or Inf). */
static double *sums_for(gddr_ps *ps, const ps_tensor *t)
{
    if (ps->sqcap < t->nchunks) {
        double *nb = realloc(ps->sqbuf, t->nchunks * sizeof *nb);
        if (!nb)
            return NULL;
        ps->sqbuf = nb;
        ps->sqcap = t->nchunks;
    }
    return ps->sqbuf;
}

/* The offset buffer, grown to t's chunks; kept across pushes, so the hot
 * path allocates nothing once the largest tensor has been seen. */
static int64_t *offsets_for(gddr_ps *ps, const ps_tensor *t)
{
    if (ps->offcap < t->nchunks) {
        int64_t *nb = realloc(ps->offbuf, t->nchunks * sizeof *nb);
        if (!nb)
            return NULL;
        ps->offbuf = nb;
        ps->offcap = t->nchunks;
    }
    return ps->offbuf;
}

/* Checks a chunk bitmap against a tensor and the payload frame, and builds
 * the per-chunk offsets into the payload. Returns GDDR_OK or an error code
 * with msg filled. off must hold t->nchunks entries. */
static int check_layout(const ps_tensor *t, const ProtobufCBinaryData *bm, uint64_t payload_bytes,
                        size_t frame_bytes, int64_t *off, size_t *nfloats, char *msg, size_t mlen)
{
    if (payload_bytes != frame_bytes) {
        snprintf(msg, mlen, "header says %llu payload bytes, frame holds %zu",
                 (unsigned long long)payload_bytes, frame_bytes);
        return GDDR_ELENGTH;
    }
    if (bm->len == 0) {
        if (payload_bytes != t->n * 4) {
            snprintf(msg, mlen, "dense push of %llu bytes to tensor '%s' of %zu values",
                     (unsigned long long)payload_bytes, t->key, t->n);
            return GDDR_ELENGTH;
        }
        ps_chunk_offsets(t, NULL, off);
        *nfloats = t->n;
        return GDDR_OK;
    }
    size_t need = gddr_bitmap_bytes(t->nchunks);
    if (bm->len != need) {
        snprintf(msg, mlen, "bitmap of %zu bytes for %zu chunks (needs %zu)", bm->len, t->nchunks,
                 need);
        return GDDR_EBITMAP;
    }
    if (t->nchunks % 8 && (bm->data[need - 1] >> (t->nchunks % 8))) {
        snprintf(msg, mlen, "bitmap sets chunks past the last of %zu", t->nchunks);
        return GDDR_EBITMAP;
    }
    size_t o = 0;
    ps_chunk_offsets(t, bm->data, off);
    for (size_t c = 0; c < t->nchunks; c++)
        if (off[c] >= 0) {
            size_t lo = c * t->chunk;
            o += lo + t->chunk <= t->n ? t->chunk : t->n - lo;
        }
    if (o * 4 != payload_bytes) {
        snprintf(msg, mlen, "bitmap selects %zu values but the payload holds %llu bytes", o,
                 (unsigned long long)payload_bytes);
        return GDDR_EBITMAP;
    }
    *nfloats = o;
    return GDDR_OK;
}

static void send_push_reply(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, const ps_tensor *t,
                            const ps_wtensor *out, int duplicate, uint64_t behind)
{
    ps_push_answer a = { out->version, out->sync_target, out->staleness, out->applied, out->mode, behind };
    ps_send_push_reply(ps, ident, req_id, t, t->id, &a, duplicate);
}


/* The payload of a push being taken: one frame (vals, laid out by off),
 * or the kept frames of a push in parts (whole.src per chunk). */
typedef struct push_src {
    const float *vals;
    const int64_t *off;     /* NULL: dense */
    zmq_msg_t *frame;       /* the frame vals lives in */
    ps_whole whole;         /* whole.src set: a push in parts */
} push_src;

/* Counts the chunks a push carries and those its worker's GDDR residual
 * held back, and says once when they meet server momentum in sync mode
 * without fill: measured (docs/network.md), momentum 0.9 with a quarter or
 * more of the chunks held and applied late lost 5-10 pp of accuracy. */
static void count_held(gddr_ps *ps, ps_tensor *t, const push_src *src)
{
    size_t held = 0;
    for (size_t c = 0; (src->whole.src || src->off) && c < t->nchunks; c++) /* dense: none held */
        held += src->whole.src ? !src->whole.src[c] : src->off[c] < 0;
    ps->push_chunks_held += held;
    ps->push_chunks_sent += t->nchunks - held;
    uint64_t all = ps->push_chunks_held + ps->push_chunks_sent;
    if (!ps->momentum_warned && !ps->cfg.fill_held && ps->cfg.momentum >= 0.5 && all >= 1000 &&
        ps->push_chunks_held * 4 >= all && ps_tensor_mode(ps, t) == GDDR_PS_MODE_SYNC) {
        ps->momentum_warned = 1;
        gddr_log(GDDR_LOG_WARN, "sync mode with momentum %g and fill_held = false: the workers' GDDR "
                 "residuals hold %.0f%% of the chunks back, and applied late they cost accuracy with "
                 "momentum (measured 8-14 pp). Turn fill_held on (docs/results.md)",
                 ps->cfg.momentum, 100.0 * (double)ps->push_chunks_held / (double)all);
    }
}

static void push_src_free(push_src *ps_)
{
    ps_whole *w = &ps_->whole;
    for (int i = 0; i < w->nmsgs; i++)
        zmq_msg_close(&w->msgs[i]);
    free(w->msgs);
    free(w->src);
    memset(w, 0, sizeof *w);
}

/* Hands an update that reads src to the pool (t settled); the pool takes
 * src's frames. */
static void submit_push(gddr_ps *ps, ps_tensor *t, ps_job *job, ps_vbuf *fresh, push_src *src)
{
    if (src->whole.src) {
        job->src = src->whole.src;
        ps_tensor_submit(ps, t, job, fresh, src->whole.msgs, src->whole.nmsgs, src->whole.src);
        if (t->pending) /* the task took the frames and the chunk table */
            memset(&src->whole, 0, sizeof src->whole);
    } else {
        job->vals = src->vals;
        job->off = src->off;
        ps_tensor_submit(ps, t, job, fresh, src->frame, 1, NULL);
    }
}

/* A whole push (one message, or all its parts) passed the per-message
 * checks and is not a resend: check what needs the tensor's state, take
 * it, answer. f is the message that completed it (its snapshot frame). */
/* Whether a push's absent chunks are held back by its worker (Push.held,
 * fill_held, and some chunk is absent): fill.c, ps_upd_fill. */
static int push_holds(const gddr_ps *ps, const Gddr__Push *p, const push_src *src, const ps_tensor *t)
{
    if (!p->held || !ps->cfg.fill_held)
        return 0;
    if (src->off)
        return 1;
    for (size_t c = 0; src->whole.src && c < t->nchunks; c++)
        if (src->whole.src[c] == NULL)
            return 1;
    return 0;
}

/* Whether a push's payload can be validated in the read that applies it
 * (ps_tensor_apply_aside): an async or ssp step of one message whose
 * update must write a fresh buffer anyway -- a pull reply still holds the
 * tensor's (copy on write), and no update is in flight that could change
 * that -- and writes nothing else in place: SGD without momentum, no
 * fill credits. A bad push then leaves the fresh buffer unused.
 *
 * Elsewhere the payload is read once to validate it (over the pool's
 * threads) and once to apply it, in place. Writing every update into a
 * second buffer just to validate in the same read was measured and does
 * not pay: the second buffer's write-allocate reads as many bytes as the
 * validation read it saves (1 MiB, 2 threads: 50 us against 30 us of
 * validation + 31 us of apply in place; docs/performance.md), and it
 * needs the tensor's memory twice. Momentum, Adam and Adagrad move their
 * state in place, so a bad push could not be undone without a copy of
 * that state. */
static int fusable(gddr_ps *ps, ps_tensor *t, const Gddr__Request *rq, const push_src *src)
{
    ps_optim otmp;
    const ps_optim *o = ps_optim_of(ps, t, &otmp);
    return !src->whole.src && !t->pending && atomic_load(&t->cur->refs) > 1 &&
           ps_tensor_mode(ps, t) != GDDR_PS_MODE_SYNC && o->kind == PS_OPT_SGD && o->momentum == 0 &&
           !ps_fill_find(ps, rq->rank, t->id);
}

/* The checks of the payload's norm: NaN or Inf anywhere, max_grad_norm. */
static int norm_refused(gddr_ps *ps, zmq_msg_t *ident, uint64_t id, const ps_tensor *t,
                        const Gddr__Push *p, double measured)
{
    if (!isfinite(measured))
        return ps_reject(ps, ident, id, GDDR_ENONFINITE, "push to tensor '%s' holds NaN or Inf", t->key);
    /* The guard judges what would be applied. The reported norm is the
     * fresh gradient's, before any client-side clipping (it feeds the tau
     * controller), so it must not veto a clipped push. */
    if (ps->cfg.max_grad_norm > 0 && measured > ps->cfg.max_grad_norm) {
        return ps_reject(ps, ident, id, GDDR_EGRADNORM,
               "push to tensor '%s': gradient norm %.6g (reported %.6g) exceeds max_grad_norm %g",
               t->key, measured, (double)p->grad_norm, ps->cfg.max_grad_norm);
    }
    return GDDR_OK;
}

/* The norm of the push's fresh gradient, for the tau controller: the
 * client's, or the payload's where the client left it to the server. */
static double fresh_norm(const Gddr__Push *p, double measured)
{
    return p->norm_from_payload ? measured : (double)p->grad_norm;
}

/* measured: the payload's norm, or NAN when it is still to be taken (a
 * push of one message: here, over the pool, or while it is applied). */
static int push_take(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f,
                     ps_tensor *t, ps_wtensor *wt, push_src *src, size_t nfloats, double measured)
{
    const Gddr__Push *p = rq->push;
    uint64_t id = rq->req_id;
    char msg[256];
    int rc;
    ps_worker *w = &ps->workers[rq->rank];
    if (p->base_version > t->version || p->birth_version > p->base_version) {
        return ps_reject(ps, ident, id, GDDR_EVERSION,
               "push to tensor '%s' at version %llu claims birth %llu, base %llu", t->key,
               (unsigned long long)t->version, (unsigned long long)p->birth_version,
               (unsigned long long)p->base_version);
    }
    if (!isfinite(p->grad_norm) || p->grad_norm < 0 || !isfinite(p->residual_l1) || p->residual_l1 < 0)
        return ps_reject(ps, ident, id, GDDR_ENONFINITE, "push to tensor '%s' holds NaN or Inf", t->key);
    if (!isfinite(p->lr) || p->lr < 0 || p->lr > 1e6)
        return ps_reject(ps, ident, id, GDDR_EINVAL, "push to tensor '%s': lr %g is not in [0, 1e6]",
                         t->key, p->lr);
    if (p->norm_from_payload && (p->bitmap.len || p->flush)) {
        return ps_reject(ps, ident, id, GDDR_EINVAL,
                         "push to tensor '%s': norm_from_payload needs a dense push that is not a flush",
                         t->key);
    }
    double *sq = src->whole.src ? NULL : sums_for(ps, t);
    if (!src->whole.src && !sq)
        return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory");
    int fuse = isnan(measured) && fusable(ps, t, rq, src);
    if (isnan(measured) && !fuse) {
        /* Validated before anything changes, the chunks spread over the
         * pool's threads (which may still be applying t's last push: this
         * reads only the payload). */
        ps_job nj = { .t = t, .vals = src->vals, .off = src->off };
        measured = ps_payload_norm(ps->pool, &nj, sq);
    }
    if (!fuse && (rc = norm_refused(ps, ident, id, t, p, measured)) != GDDR_OK)
        return rc;
    if (p->residual_snapshot) {
        rc = ps_snapshot_check(ps, t, rq->rank, p, f, msg, sizeof msg);
        if (rc != GDDR_OK)
            return ps_reject(ps, ident, id, rc, "push to tensor '%s': residual snapshot: %s", t->key, msg);
    }
    /* From here on t's values are used: its previous update must be done
     * (its apply ran while this payload was received and validated). */
    ps_tensor_settle(ps, t);
    if (src->off) {
        memcpy(t->off, src->off, t->nchunks * sizeof *t->off);
        src->off = t->off;
    }
    uint64_t tau = t->version - p->base_version;
    /* AdaDelay: the step of a push computed tau versions ago shrinks by
     * 1 + adadelay*tau (async: in lr_eff; sync: as the push's weight f). */
    double fac = 1.0 / (1.0 + ps->cfg.adadelay * (double)tau);
    ps_optim otmp;
    double lr = p->lr > 0 ? p->lr : ps_optim_of(ps, t, &otmp)->lr;
    int mode = ps_tensor_mode(ps, t);
    ps_wtensor out = { p->step, 0, 0, tau, 0, 0, (uint8_t)mode, p->residual_l1 };
    uint64_t behind = 0; /* sync: a late push (ps_sync_place) */
    if (ps_optim_state(ps, t) < 0)
        return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory for the optimizer state of '%s'", t->key);
    if (mode == GDDR_PS_MODE_SYNC && p->flush) {
        /* Mass of the worker's earlier steps: joined to the last step with
         * the weight one worker's share of it had, however many workers
         * are left. (A flush always comes in one message.) */
        uint32_t d = t->sync_divisor ? t->sync_divisor : (uint32_t)ps_expected_workers(ps);
        if (t->npushes == 0) {
            ps_flush_apply(ps, t, src->vals, p->bitmap.len ? p->bitmap.data : NULL, (float)fac,
                           1.0f / (float)d, p->lr, rq->rank, src->frame);
            out.applied = 1;
        } else if ((rc = ps_flush_defer(ps, t, p, src->vals, nfloats, (float)fac, rq->rank)) != GDDR_OK) {
            return ps_reject(ps, ident, id, rc, "push to tensor '%s': cannot keep a flush for after the step",
                             t->key);
        }
        out.sync_target = t->version + (out.applied ? 0 : 1);
    } else if (mode == GDDR_PS_MODE_SYNC) {
        /* Late (its step here completed without it: its worker was declared
         * dead, or sync_quorum went on; or, after a restart, its step was
         * lost or closed here: sync.c ps_sync_realign): its values join the
         * open step as mass, not as the worker's push of it, and it is
         * answered at once, so the worker neither waits for a step the
         * others may not make first (tensors and a table stepped in turn)
         * nor lands its later pushes a step early (docs/protocol.md, "Late
         * pushes"). */
        uint64_t stale = ps_sync_realign(ps, t, rq->rank, p->step); /* may close the open step */
        uint64_t open = t->version + 1;
        behind = stale ? ps_sync_place_late(&t->sstep[rq->rank], stale, open)
                       : ps_sync_place(&t->sstep[rq->rank], wt->set, wt->step, p->step, open,
                                       ps_sync_one_phase(ps, ps_tables_count(ps)));
        /* Fill (fill.c): a push whose absent chunks are held gets credits. */
        int held = push_holds(ps, p, src, t);
        ps_fillw *fw = held ? ps_fill_get(ps, rq->rank, t) : ps_fill_find(ps, rq->rank, t->id);
        ps_job job = { .kind = PS_JOB_ACC, .t = t, .vscale = (float)fac, .fw = fw,
                       .held = held && fw };
        if (job.held)
            ps_fill_holding(t, fw);
        submit_push(ps, t, &job, NULL, src);
        if (!behind && !t->contrib[rq->rank]) {
            t->contrib[rq->rank] = 1;
            t->ncontrib++;
        }
        if (t->npushes++ == 0)
            t->step_opened_ms = gddr__now_ms();
        if (p->lr > 0)
            t->step_lr = p->lr;
        if (!p->flush) /* tau moves at the step's close, in rank order (tau.c) */
            ps_tau_defer(&ps->cfg, t, rq->rank, fresh_norm(p, measured));
        out.sync_target = t->version + (behind ? 0 : 1);
        out.applied = (uint8_t)ps_sync_try_complete(ps, t, 0);
        if (out.applied)
            out.sync_target = t->version;
    } else if (fuse) {
        /* Validate while applying: into a fresh buffer, made current only
         * if the norm read on the way says the push is good. */
        ps_job job = { .kind = PS_JOB_APPLY, .t = t, .vscale = 1.0f, .scale = 1.0f,
                       .vals = src->vals, .off = src->off, .sq = sq };
        ps_upd_for(ps, t, lr * fac, &job.upd);
        ps_vbuf *fresh = ps_tensor_apply_aside(ps, t, &job, &measured);
        if (!fresh)
            return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory for a copy of tensor '%s'", t->key);
        ps->validated_in_apply++;
        if ((rc = norm_refused(ps, ident, id, t, p, measured)) != GDDR_OK) {
            ps_vbuf_unref(fresh);
            return rc;
        }
        ps_tensor_commit_aside(t, &job, fresh);
        t->version++;
        ps->versions_total++;
        out.applied = 1;
    } else {
        ps_vbuf *fresh;
        if (ps_tensor_begin_write(t, &fresh) < 0)
            return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory for a copy of tensor '%s'", t->key);
        ps_job job = { .kind = PS_JOB_APPLY, .t = t, .vscale = 1.0f, .scale = 1.0f };
        ps_upd_for(ps, t, lr * fac, &job.upd);
        /* Async fill (optim.c): adam steps held chunks with its first moment. */
        int held = ps_upd_fills(&job.upd) && push_holds(ps, p, src, t);
        job.fw = held ? ps_fill_get(ps, rq->rank, t) : ps_fill_find(ps, rq->rank, t->id);
        job.held = held && job.fw;
        if (ps->cfg.async_fill == PS_AFILL_RECENT && ps_upd_fills(&job.upd))
            job.facc = t->facc; /* NULL until the tensor's first holder (fill.c) */
        job.rank = rq->rank;
        job.stamp = (uint32_t)(t->version + 1) ? (uint32_t)(t->version + 1) : 1;
        submit_push(ps, t, &job, fresh, src);
        t->version++;
        ps->versions_total++;
        out.applied = 1;
    }
    out.version = t->version;
    t->seen[rq->rank] = ps->joins;
    out.mode = (uint8_t)ps_tensor_mode(ps, t); /* may end the warm-up */
    out.set = 1;
    *wt = out;
    ps->pushes++;
    w->pushes++;
    if (p->step + 1 > w->clock)
        w->clock = p->step + 1;
    ps_stale_add(&ps->stale, tau, ps->cfg.staleness_ema_decay);
    ps_stale_add(&w->stale, tau, ps->cfg.staleness_ema_decay);
    if (ps->cfg.staleness_alarm > 0) {
        int over = ps->stale.ema > ps->cfg.staleness_alarm;
        if (over && !ps->alarm_on)
            gddr_log(GDDR_LOG_WARN, "staleness EMA %.2f crossed staleness_alarm %g (worker %u, tensor '%s')",
                     ps->stale.ema, ps->cfg.staleness_alarm, rq->rank, t->key);
        else if (!over && ps->alarm_on)
            gddr_log(GDDR_LOG_INFO, "staleness EMA %.2f back under staleness_alarm %g",
                     ps->stale.ema, ps->cfg.staleness_alarm);
        ps->alarm_on = over;
    }
    if (!p->flush && mode != GDDR_PS_MODE_SYNC) /* sync: at the step's close (ps_tau_defer) */
        ps_tau_feed(&ps->cfg, t, fresh_norm(p, measured));
    send_push_reply(ps, ident, id, t, wt, 0, behind);
    ps_orphans_pushed(ps, ident, t, rq->rank, p, f);
    ps_release_pulls(ps);
    return GDDR_OK;
}

int ps_on_push(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f)
{
    const Gddr__Push *p = rq->push;
    uint64_t id = rq->req_id;
    ps_tensor *t = ps_tensor_by_id(ps, p->id);
    if (!t) {
        return ps_reject(ps, ident, id, GDDR_ENOKEY, "no tensor with id %u (%zu registered)", p->id,
               ps->ntensors);
    }
    int want_frames = 3 + (p->residual_snapshot ? 1 : 0);
    if (f->n != want_frames) {
        return ps_reject(ps, ident, id, GDDR_EPROTO, "push carries %d frames, expected %d", f->n - 1,
               want_frames - 1);
    }
    char msg[256];
    int64_t *off = offsets_for(ps, t);
    ps_wtensor *wt = off ? ps_worker_tensor(ps, rq->rank, t->id) : NULL;
    if (!wt)
        return ps_reject(ps, ident, id, GDDR_ENOMEM, "no memory");
    ps_worker *w = &ps->workers[rq->rank];
    int parted = p->parts > 1;
    size_t nfloats = 0;
    if (!parted) {
        int rc = check_layout(t, &p->bitmap, p->payload_bytes, gddr__frame_size(f, 2), off, &nfloats,
                              msg, sizeof msg);
        if (rc != GDDR_OK)
            return ps_reject(ps, ident, id, rc, "push to tensor '%s': %s", t->key, msg);
    }
    /* Exactly once: a resend gets the first answer and changes nothing (a
     * push in parts gets it once, at its last part). */
    if (wt->set && p->step <= wt->step) {
        if (parted && p->part + 1 != p->parts)
            return GDDR_OK;
        ps->duplicates++;
        w->duplicates++;
        gddr_log(GDDR_LOG_DEBUG, "worker %u: push of step %llu to '%s' is a resend (last taken %llu)",
                 rq->rank, (unsigned long long)p->step, t->key, (unsigned long long)wt->step);
        send_push_reply(ps, ident, id, t, wt, 1, 0);
        return GDDR_OK;
    }
    push_src src = { 0 };
    double measured;
    if (parted) {
        if (ps_part_take(ps, ident, rq, f, t, &src.whole) != PS_PART_DONE)
            return GDDR_OK; /* held, or answered */
        measured = src.whole.norm;
        nfloats = 0;
    } else {
        src.vals = gddr__frame_data(f, 2);
        src.off = p->bitmap.len ? off : NULL;
        src.frame = &f->part[2];
        measured = NAN; /* taken by push_take */
    }
    count_held(ps, t, &src);
    int rc = push_take(ps, ident, rq, f, t, wt, &src, nfloats, measured);
    push_src_free(&src); /* what the pool did not take (a refusal, a small tensor) */
    return rc;
}
