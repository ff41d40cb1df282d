/* sync.c -- sync steps: collecting a step's pushes until enough workers
 * took part, applying it, and the flushes (a closing GDDR worker's held
 * residual) that wait for an open step. A change of membership may
 * complete a step or free a parked pull: ps_membership_changed. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ps.h"

/* Applies a flush (a closing worker's held residual) as its own update.
 * payload: the message vals lives in (the pool takes it), or NULL when the
 * caller frees vals right after: then the update is waited for. */
void ps_flush_apply(gddr_ps *ps, ps_tensor *t, const float *vals, const uint8_t *bitmap,
                    float scale, zmq_msg_t *payload)
{
    ps_tensor_settle(ps, t);
    ps_chunk_offsets(t, bitmap, t->off);
    if (ps->cfg.momentum > 0 && !t->mom)
        t->mom = calloc(t->n, sizeof(float));
    ps_vbuf *fresh;
    if (ps_tensor_begin_write(t, &fresh) < 0)
        gddr_log(GDDR_LOG_ERROR, "no memory for a copy of '%s': a pull in flight may see this update",
                 t->key);
    ps_job job = { PS_JOB_APPLY, t, NULL, vals, t->off, NULL, scale, (float)ps->cfg.momentum };
    ps_tensor_submit(ps, t, &job, fresh, payload, payload ? 1 : 0, NULL);
    if (!payload)
        ps_tensor_settle(ps, t);
    t->version++;
    ps->versions_total++;
}

/* Applies the step being collected when enough workers pushed. The divisor
 * is the number of live workers, so a step is the mean over the workers,
 * and a late push folded into a later step counts with the same weight:
 * over a run, N * (sum of applied updates) = lr * (sum of pushed grads). */
int ps_sync_try_complete(gddr_ps *ps, ps_tensor *t, int force)
{
    if (t->npushes == 0)
        return 0;
    int live = gddr_ps_live_workers(ps);
    if (live < 1)
        live = 1;
    int need = ps->cfg.sync_quorum > 0 && ps->cfg.sync_quorum < live ? (int)ps->cfg.sync_quorum
                                                                      : live;
    if (!force && (int)t->ncontrib < need)
        return 0;
    ps_tensor_settle(ps, t); /* the step's last push is folded in */
    if (ps->cfg.momentum > 0 && !t->mom)
        t->mom = calloc(t->n, sizeof(float));
    /* A step whose workers left before it completed still divides by those
     * who took part, not by who is left. */
    int divisor = (int)t->ncontrib > live ? (int)t->ncontrib : live;
    ps_vbuf *fresh;
    if (ps_tensor_begin_write(t, &fresh) < 0)
        gddr_log(GDDR_LOG_ERROR, "no memory for a copy of '%s': a pull in flight may see this step",
                 t->key);
    ps_job job = { PS_JOB_SYNC, t, NULL, NULL, NULL, NULL, 1.0f / (float)divisor,
                   (float)ps->cfg.momentum };
    ps_tensor_submit(ps, t, &job, fresh, NULL, 0, NULL);
    t->version++;
    ps->versions_total++;
    t->sync_divisor = (uint32_t)divisor;
    memset(t->contrib, 0, (size_t)ps->cfg.max_workers);
    t->ncontrib = 0;
    t->npushes = 0;
    /* Flushes that came in while the step was open go right after it. */
    while (t->flushes) {
        ps_flush *f = t->flushes;
        t->flushes = f->next;
        ps_flush_apply(ps, t, f->vals, f->bitmap, f->scale, NULL);
        free(f->vals), free(f->bitmap), free(f);
        t->nflushes--;
    }
    return 1;
}

void ps_membership_changed(gddr_ps *ps)
{
    for (size_t i = 0; i < ps->ntensors; i++)
        if (ps_tensor_mode(ps, ps->tensors[i]) == GDDR_PS_MODE_SYNC)
            ps_sync_try_complete(ps, ps->tensors[i], 0);
    ps_release_pulls(ps);
}

/* Keeps a flush that arrived while a sync step is open, for after it. */
int ps_flush_defer(gddr_ps *ps, ps_tensor *t, const Gddr__Push *p, const float *vals,
                   size_t nfloats, float scale)
{
    if (t->nflushes >= (uint32_t)ps->cfg.max_workers)
        return GDDR_EBUSY;
    ps_flush *f = calloc(1, sizeof *f);
    if (f && (f->vals = malloc(nfloats * 4 + 4)) &&
        (!p->bitmap.len || (f->bitmap = malloc(p->bitmap.len)))) {
        memcpy(f->vals, vals, nfloats * 4);
        if (p->bitmap.len)
            memcpy(f->bitmap, p->bitmap.data, p->bitmap.len);
        f->scale = scale;
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
