/* sync.c -- sync steps: collecting a step's pushes until enough workers
 * took part, applying it, and the flushes (a closing GDDR worker's held
 * residual) that wait for an open step. A change of membership may
 * complete a step or free a parked pull: ps_membership_changed. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ps.h"
#include "syncstep.h"
#include "pushlog.h"
#include "table_wire.h"

/* The lr a push or step asked for (0: the tensor's). */
static double lr_or_tensor(const gddr_ps *ps, const ps_tensor *t, double lr)
{
    ps_optim tmp;
    return lr > 0 ? lr : ps_optim_of(ps, t, &tmp)->lr;
}

/* Adds a flush (a closing worker's held residual) to the step just
 * applied (PS_JOB_JOIN, optim.c): with momentum, a step of its own would
 * let every flushed chunk coast once more. payload: the message vals lives
 * in (the pool takes it), or NULL when the caller frees vals right after:
 * then the update is waited for. */
void ps_flush_apply(gddr_ps *ps, ps_tensor *t, const float *vals, const uint8_t *bitmap,
                    float vscale, float scale, double lr, uint32_t rank, zmq_msg_t *payload)
{
    ps_tensor_settle(ps, t);
    ps_chunk_offsets(t, bitmap, t->off);
    if (ps_optim_state(ps, t) < 0)
        gddr_log(GDDR_LOG_ERROR, "no memory for the optimizer state of '%s'", t->key);
    ps_vbuf *fresh;
    if (ps_tensor_begin_write(t, &fresh) < 0)
        gddr_log(GDDR_LOG_ERROR, "no memory for a copy of '%s': a pull in flight may see this update",
                 t->key);
    ps_job job = { .kind = PS_JOB_JOIN, .t = t, .vals = vals, .off = t->off, .vscale = vscale,
                   .scale = scale, .fw = ps_fill_find(ps, rank, t->id) };
    ps_upd_for(ps, t, lr_or_tensor(ps, t, lr), &job.upd);
    ps_tensor_submit(ps, t, &job, fresh, payload, payload ? 1 : 0, NULL);
    if (!payload)
        ps_tensor_settle(ps, t);
    t->version++;
    ps->versions_total++;
}

/* Applies the step being collected when enough workers pushed. The divisor
 * is the number of live workers, so a step is the mean over the workers,
 * and a late push folded into a later step counts with the same weight:
 * over a run, N * (sum of applied gradients) = sum of pushed gradients
 * (fill credits included: fill.c). */
int ps_sync_try_complete(gddr_ps *ps, ps_tensor *t, int force)
{
    if (t->npushes == 0)
        return 0;
    int live;
    if (!ps_sync_may_complete(ps, ps_sync_tensor_pushed, t, force, &live))
        return 0;
    if (ps->log_event)
        ps->log_event(ps, PS_PLOG_EV_SYNC, t->id, (uint64_t)live);
    ps_tensor_settle(ps, t); /* the step's last push is folded in */
    if (ps_optim_state(ps, t) < 0)
        gddr_log(GDDR_LOG_ERROR, "no memory for the optimizer state of '%s'", t->key);
    /* A step whose workers left before it completed still divides by those
     * who took part, not by who is left. */
    int divisor = (int)t->ncontrib > live ? (int)t->ncontrib : live;
    ps_vbuf *fresh;
    if (ps_tensor_begin_write(t, &fresh) < 0)
        gddr_log(GDDR_LOG_ERROR, "no memory for a copy of '%s': a pull in flight may see this step",
                 t->key);
    ps_job job = { .kind = PS_JOB_SYNC, .t = t, .scale = 1.0f / (float)divisor,
                   .npushes = t->npushes, .holders = t->holders, .nholders = t->nholders,
                   .facc = t->facc };
    ps_upd_for(ps, t, lr_or_tensor(ps, t, t->step_lr), &job.upd);
    /* The job reads this step's holders; the next step collects into the
     * other array. */
    ps_fillw **h = t->holders;
    t->holders = t->holders_alt;
    t->holders_alt = h;
    t->nholders = 0;
    ps_tensor_submit(ps, t, &job, fresh, NULL, 0, NULL);
    /* From the next step on (this one's pushes did not sum into it). */
    ps_fill_fresh_alloc(ps, t);
    t->version++;
    ps->versions_total++;
    t->sync_divisor = (uint32_t)divisor;
    ps_tau_step_close(&ps->cfg, t); /* the step's norms, in rank order */
    memset(t->contrib, 0, (size_t)ps->cfg.max_workers);
    t->ncontrib = 0;
    t->npushes = 0;
    t->step_opened_ms = 0;
    t->step_lr = 0;
    t->align.open_j++; /* (counts only while it is on: ps_align_push) */
    /* Flushes that came in while the step was open go right after it. */
    while (t->flushes) {
        ps_flush *f = t->flushes;
        t->flushes = f->next;
        ps_flush_apply(ps, t, f->vals, f->bitmap, f->vscale, 1.0f / (float)divisor, f->lr, f->rank,
                       NULL);
        free(f->vals), free(f->bitmap), free(f);
        t->nflushes--;
    }
    return 1;
}

/* After a restore, a tensor's (or a table's) sync steps may sit behind the
 * workers' (the checkpoint was taken mid-step, and the steps since were
 * lost). The step restored open wanted one push of each worker: the one it
 * holds (the rank's exactly-once record), or the rank's next (record + 1):
 * its step `wanted`. That lines up each worker's own step numbers with the
 * steps here: its push of step wanted + j belongs j steps after the
 * restored one (open_j counts the steps here since). Until every live
 * worker pushed again, a push of a worker process the checkpoint knew
 * (same session) that belongs to a later step than the open one closes the
 * open step as it is (so it does not join a step other shards closed
 * without it), and one that belongs to an earlier step is answered without
 * joining a later one. Each worker is measured by its own numbers, never
 * by another's: those differ once a worker was declared dead and came
 * back, or a new process took a rank (scripts/soaksync.py found it:
 * compared across workers, one worker's higher numbers dropped every other
 * worker's pushes and the run stopped). docs/protocol.md "Sync steps after
 * a restart". */
static uint64_t tensor_wanted(gddr_ps *ps, const void *arg, int r)
{
    const ps_tensor *t = arg;
    const ps_worker *w = &ps->workers[r];
    if (!w->ckpt_session || t->id >= w->nwt || !w->wt[t->id].set)
        return 0;
    return ps_align_wanted(w->wt[t->id].step, t->sstep[r], t->version + 1, t->contrib[r]);
}

void ps_sync_restored(gddr_ps *ps)
{
    for (size_t i = 0; i < ps->ntensors; i++)
        ps_align_begin(ps, &ps->tensors[i]->align, tensor_wanted, ps->tensors[i]);
    ps_tables_sync_restored(ps);
}

static void tensor_close(gddr_ps *ps, void *arg)
{
    ps_sync_try_complete(ps, arg, 1);
}

uint64_t ps_sync_realign(gddr_ps *ps, ps_tensor *t, uint32_t rank, uint64_t step)
{
    const ps_worker *w = &ps->workers[rank];
    int same = w->ckpt_session && w->session == w->ckpt_session;
    return ps_align_push(ps, &t->align, rank, same, step, t->npushes > 0, tensor_close, t, "tensor", t->key);
}

void ps_membership_changed(gddr_ps *ps)
{
    for (size_t i = 0; i < ps->ntensors; i++)
        if (ps_tensor_mode(ps, ps->tensors[i]) == GDDR_PS_MODE_SYNC)
            ps_sync_try_complete(ps, ps->tensors[i], 0);
    ps_tables_membership_changed(ps);
    ps_release_pulls(ps);
}

/* The stall net. A step that waits for live workers who will not come
 * (they wait for the others in another phase: one worker a step further
 * along on a table than on the tensors) is closed as it is, and every
 * worker's place on it is forgotten (ps_sync_place: its next push joins
 * the open step), which puts the workers back in line there. Late pushes
 * alone cannot: they keep each worker's place. One phase at a time -- the
 * tensors together, or one table -- and the oldest first, at most one
 * close per sync_stall_s; each server waits its own share longer (from
 * its epoch) so that two servers do not move two phases at once. */
static int64_t stall_limit(const gddr_ps *ps)
{
    double lim = ps->cfg.sync_stall_s * 1000.0;
    return (int64_t)(lim * (1.0 + (double)(ps->epoch % 1024) / 1024.0));
}

void ps_sync_stalls(gddr_ps *ps)
{
    if (ps->cfg.sync_stall_s <= 0 || ps->replaying)
        return;
    int64_t now = gddr__now_ms(), lim = stall_limit(ps), oldest = now;
    for (size_t i = 0; i < ps->ntensors; i++) {
        ps_tensor *t = ps->tensors[i];
        if (!t->npushes || ps_tensor_mode(ps, t) != GDDR_PS_MODE_SYNC)
            continue;
        if (!t->step_opened_ms)
            t->step_opened_ms = now; /* restored open */
        if (t->step_opened_ms < oldest)
            oldest = t->step_opened_ms;
    }
    int64_t table_oldest = ps_tables_sync_oldest(ps, now);
    if (now < ps->stall_quiet_ms || (now - oldest <= lim && now - table_oldest <= lim))
        return;
    ps->stall_quiet_ms = now + (int64_t)(ps->cfg.sync_stall_s * 1000.0);
    if (table_oldest < oldest) {
        ps_tables_sync_stall(ps, now, lim);
        return;
    }
    for (size_t i = 0; i < ps->ntensors; i++) {
        ps_tensor *t = ps->tensors[i];
        if (!t->npushes || ps_tensor_mode(ps, t) != GDDR_PS_MODE_SYNC || now - t->step_opened_ms <= lim)
            continue;
        ps_sync_stall_log(ps, ps_sync_tensor_pushed, t, "tensor", t->key,
                          (double)(now - t->step_opened_ms) / 1000.0);
        ps_sync_try_complete(ps, t, 1);
        memset(t->sstep, 0, (size_t)ps->cfg.max_workers * sizeof *t->sstep);
    }
}

/* Keeps a flush that arrived while a sync step is open, for after it. */
int ps_flush_defer(gddr_ps *ps, ps_tensor *t, const Gddr__Push *p, const float *vals,
                   size_t nfloats, float vscale, uint32_t rank)
{
    if (t->nflushes >= (uint32_t)ps->cfg.max_workers)
        return GDDR_EBUSY;
    ps_flush *f = calloc(1, sizeof *f);
    if (f && (f->vals = malloc(nfloats * 4 + 4)) &&
        (!p->bitmap.len || (f->bitmap = malloc(p->bitmap.len)))) {
        memcpy(f->vals, vals, nfloats * 4);
        if (p->bitmap.len)
            memcpy(f->bitmap, p->bitmap.data, p->bitmap.len);
        f->vscale = vscale;
        f->lr = p->lr;
        f->rank = rank;
        ps_flush **pp = &t->flushes;
        while (*pp)
            pp = &(*pp)->next;
        *pp = f;
        t->nflushes++;
        return GDDR_OK;
    }
    if (f)
        free(f->vals), free(f);
    return GDDR_ENOMEM;
}
