/* shard_step.c -- the sharded client's steps (shard.h): every server's
 * client steps its own pieces, all at once (shard_fan.c).
 *
 * Clipping is by the global norm over all tensors: the router measures it
 * and, when it clips, hands the shards a scaled copy (their own clipping is
 * off); the norm a shard reports for the dynamic tau is then the clipped
 * one. Everything else is elementwise or per tensor and so per piece.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "blas.h"
#include "shard.h"

/* Per-shard views of a step's arrays (pieces in each shard's order). */
struct step_arg {
    const float *const *grads;
    const float *const *on;
    const uint64_t *versions;
    float *const *params;
    int submit, wait;
};

static int step_one(gddr_client *c, int s, void *arg)
{
    struct step_arg *a = arg;
    gddr__shards *h = c->shards;
    gddr_client *sub = h->sub[s];
    if (sub->nt == 0)
        return GDDR_OK; /* holds nothing */
    const float **g = calloc((size_t)sub->nt, sizeof *g), **on = calloc((size_t)sub->nt, sizeof *on);
    float **p = calloc((size_t)sub->nt, sizeof *p);
    uint64_t *v = calloc((size_t)sub->nt, sizeof *v);
    int rc = g && on && p && v ? GDDR_OK : gddr__set_err(sub, GDDR_ENOMEM, "no memory");
    for (int i = 0; rc == GDDR_OK && i < h->nt; i++)
        for (int k = 0; k < h->t[i].np; k++) {
            spiece *q = &h->t[i].p[k];
            if (q->shard != s)
                continue;
            if (a->grads)
                g[q->id] = a->grads[i] + q->off;
            if (a->on)
                on[q->id] = a->on[i] ? a->on[i] + q->off : NULL;
            if (a->versions)
                v[q->id] = a->versions[i];
            if (a->params)
                p[q->id] = a->params[i] + q->off;
        }
    if (rc == GDDR_OK) {
        if (a->submit)
            rc = sub->be->submit(sub, g);
        else if (a->wait)
            rc = sub->be->wait_step(sub, p);
        else
            rc = sub->be->step(sub, g, a->on ? on : NULL, a->versions ? v : NULL, p);
    }
    free(g), free(on), free(p), free(v);
    return rc;
}

/* Clipping by the global norm: the gradients the shards get (the caller's,
 * or scaled copies when the norm is above clip_norm). Without clipping the
 * gradients are still checked here, in float (blas.h): each server's
 * client would refuse a NaN only in its own pieces, and the others would
 * push theirs. */
static int clip_global(gddr_client *c, const float *const *grads, const float **use)
{
    gddr__shards *h = c->shards;
    for (int i = 0; i < h->nt; i++)
        use[i] = grads[i];
    if (c->o.clip_norm <= 0) {
        for (int i = 0; i < h->nt; i++)
            if (!gddr_finite_cpu(grads[i], h->t[i].n))
                return gddr__set_err(c, GDDR_ENONFINITE, "step: the gradient of '%s' holds NaN or Inf",
                                     h->t[i].key);
        return GDDR_OK;
    }
    double total = 0;
    for (int i = 0; i < h->nt; i++) {
        double nrm = gddr_nrm2_cpu(grads[i], h->t[i].n);
        total += nrm * nrm;
    }
    total = sqrt(total);
    if (!isfinite(total))
        return gddr__set_err(c, GDDR_ENONFINITE, "step: a gradient holds NaN or Inf");
    if (total <= c->o.clip_norm)
        return GDDR_OK;
    for (int i = 0; i < h->nt; i++) {
        if (!h->scaled[i] && !(h->scaled[i] = malloc(h->t[i].n * 4)))
            return gddr__set_err(c, GDDR_ENOMEM, "no memory");
        memcpy(h->scaled[i], grads[i], h->t[i].n * 4);
        gddr_scal_cpu(h->scaled[i], h->t[i].n, (float)(c->o.clip_norm / total));
        use[i] = h->scaled[i];
    }
    return GDDR_OK;
}

static int check_steps(gddr_client *c, const float *const *grads, float *const *params)
{
    gddr__shards *h = c->shards;
    if (h->nt == 0)
        return gddr__set_err(c, GDDR_ESTATE, "step: no tensor registered");
    for (int i = 0; i < h->nt; i++) {
        if (grads && !grads[i])
            return gddr__set_err(c, GDDR_EINVAL, "step: NULL gradient for '%s'", h->t[i].key);
        if (params && !params[i])
            return gddr__set_err(c, GDDR_EINVAL, "step: NULL parameters for '%s'", h->t[i].key);
        if (grads && gddr_cuda_is_device_ptr(grads[i]))
            return gddr__set_err(c, GDDR_ENOTSUP, "step: device gradients with several servers");
    }
    return GDDR_OK;
}

int gddr__shards_step(gddr_client *c, const float *const *grads, const float *const *computed_on,
                      const uint64_t *versions, float *const *params)
{
    int rc = check_steps(c, grads, params);
    if (rc != GDDR_OK)
        return rc;
    const float **use = calloc((size_t)c->shards->nt, sizeof *use);
    if (!use)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    int64_t t0 = gddr__now_ms();
    rc = clip_global(c, grads, use);
    if (rc == GDDR_OK) {
        struct step_arg a = { use, computed_on, versions, params, 0, 0 };
        rc = gddr__fan(c, step_one, &a);
    }
    free(use);
    if (rc == GDDR_OK) {
        c->k.steps++;
        c->k.step_ns += (uint64_t)(gddr__now_ms() - t0) * 1000000u;
    }
    return rc;
}

int gddr__shards_submit(gddr_client *c, const float *const *grads)
{
    int rc = check_steps(c, grads, NULL);
    if (rc != GDDR_OK)
        return rc;
    const float **use = calloc((size_t)c->shards->nt, sizeof *use);
    if (!use)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    rc = clip_global(c, grads, use);
    if (rc == GDDR_OK) {
        struct step_arg a = { use, NULL, NULL, NULL, 1, 0 };
        rc = gddr__fan(c, step_one, &a); /* each shard copies into its own ring */
    }
    free(use);
    return rc;
}

int gddr__shards_wait_step(gddr_client *c, float *const *params)
{
    int rc = check_steps(c, NULL, params);
    if (rc != GDDR_OK)
        return rc;
    struct step_arg a = { NULL, NULL, NULL, params, 0, 1 };
    rc = gddr__fan(c, step_one, &a);
    if (rc == GDDR_OK)
        c->k.steps++;
    return rc;
}
