/* step.c -- gddr_step: one training step over every registered tensor, in
 * the order of DESIGN section 6:
 *
 *   1. copy the gradient into the library's buffer, measure its norm
 *   2. clip to clip_norm (global norm over all tensors)
 *   3. DC-ASGD: pull the newest w', compensate against w_bak, base = v'
 *   4. GDDR: u = r + g, hold a random subset of chunks (age < tau), pack
 *      the rest; replay orphan installments into r; attach a residual
 *      snapshot every residual_checkpoint_steps
 *   5. push; sync: pull min_version = the step's target; async/ssp: pull
 *      the newest (or return w' when DC pulled it already)
 *
 * Steps 1-4 change local state once; step 5 is retried after a reconnect
 * with the same payload, so a server restart neither loses nor doubles
 * what the residual engine released.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "client_int.h"
#include "dc.h"
#include "replay.h"
#include "residual.h"

void gddr__step_free(ctensor *t)
{
    free(t->res.r);
    free(t->res.age);
    free(t->res.packed);
    free(t->res.bitmap);
    free(t->res.orphan);
    free(t->res.snap);
    free(t->res.snap_bm);
    memset(&t->res, 0, sizeof t->res);
}

static int res_alloc(gddr_client *c, ctensor *t)
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
        gddr__step_free(t);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for the residual of '%s'", t->key);
    }
    return GDDR_OK;
}

/* What one tensor sends this step. */
typedef struct payload {
    const float *vals;
    const uint8_t *bitmap; /* NULL: dense */
    size_t bitmap_len, nvals;
    uint64_t birth, base;
    float norm;
    const float *snap;
    const uint8_t *snap_bm;
    size_t snap_vals;
} payload;

/* Waits for every ticket; the first error wins, every op is collected. */
static int wait_all(gddr_client *c, uint64_t *tk, op *res, int n, int timeout_ms)
{
    int rc = GDDR_OK;
    for (int i = 0; i < n; i++) {
        int r = gddr__wait_op(c, tk[i], timeout_ms, &res[i]);
        if (r != GDDR_OK && rc == GDDR_OK)
            rc = r;
    }
    return rc;
}

/* A failure that a reconnect may cure: no answer, or a restarted server
 * that no longer knows our tensors or versions. */
static int needs_reconnect(gddr_client *c, int rc)
{
    return c->epoch_changed || rc == GDDR_ETIMEDOUT || rc == GDDR_EIO ||
           (rc == GDDR_ENOKEY) || (rc == GDDR_EVERSION);
}

/* Pulls every tensor into dst[i] with min_version[i] (NULL: 0). */
static int pull_all(gddr_client *c, float *const *dst, const uint64_t *minv, uint64_t step,
                    op *res, uint64_t *tk)
{
    int rc = GDDR_OK;
    int sent = 0;
    for (int i = 0; i < c->nt && rc == GDDR_OK; i++, sent++)
        rc = gddr__pull_tensor(c, i, dst[i], minv ? minv[i] : 0, step, &tk[i]);
    int rc2 = wait_all(c, tk, res, sent, c->o.timeout_ms + 1000);
    return rc != GDDR_OK ? rc : rc2;
}

/* DC-ASGD step 3 for every tensor. Returns w' versions in base[]. */
static int dc_pull_and_compensate(gddr_client *c, const float *const *w_bak, uint64_t *base,
                                  op *res, uint64_t *tk)
{
    float **dst = malloc((size_t)c->nt * sizeof *dst);
    if (!dst)
        return GDDR_ENOMEM;
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        if (!t->wnew && !(t->wnew = malloc(t->n * 4))) {
            free(dst);
            return gddr__set_err(c, GDDR_ENOMEM, "no memory");
        }
        if (c->o.dc_adaptive && !t->ms && !(t->ms = calloc(t->n, 4))) {
            free(dst);
            return gddr__set_err(c, GDDR_ENOMEM, "no memory");
        }
        dst[i] = t->wnew;
    }
    int rc = pull_all(c, dst, NULL, c->step, res, tk);
    free(dst);
    if (rc != GDDR_OK)
        return rc;
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        gddr_dc_args a = { t->n, (float)c->o.dc_lambda, c->o.dc_mode, c->o.dc_adaptive,
                           (float)c->o.dc_ms_decay, 1e-7f };
        gddr_dc_cpu(&a, t->g, t->wnew, w_bak[i], t->ms);
        base[i] = res[i].version;
    }
    return GDDR_OK;
}

/* GDDR step 4 for one tensor: fills the payload from the residual engine. */
static int residual_pack(gddr_client *c, int i, payload *p)
{
    ctensor *t = &c->t[i];
    int rc = res_alloc(c, t);
    if (rc != GDDR_OK)
        return rc;
    residual *r = &t->res;
    if (r->orphan) {
        /* Orphan installments join the residual, so they leave through the
         * normal mask and nothing of them is sent twice. */
        int last = r->orphan_left <= 1;
        gddr_replay_cpu(r->r, r->orphan, t->n, (float)c->o.replay_decay, last);
        if (last) {
            free(r->orphan);
            r->orphan = NULL;
            r->orphan_left = 0;
            gddr__logf(&c->log, GDDR_LOG_INFO, "orphan residual of '%s' fully re-injected", t->key);
        } else {
            r->orphan_left--;
        }
    }
    gddr_residual_args a = { t->n, (uint32_t)c->info.chunk, (float)c->o.delay_fraction,
                             (uint32_t)(t->tau > 0 ? t->tau : 1), c->o.seed,
                             (uint32_t)c->info.rank, t->keyhash, c->step };
    size_t npacked = 0, nsent = 0;
    rc = gddr_residual_step_cpu(&a, t->g, r->r, r->age, r->packed, r->bitmap, &npacked, &nsent);
    if (rc != GDDR_OK)
        return gddr__set_err(c, rc, "residual step of '%s' failed", t->key);
    p->vals = r->packed;
    p->nvals = npacked;
    if (nsent == r->nchunks) {
        p->bitmap = NULL; /* everything goes: a dense push needs no bitmap */
    } else {
        p->bitmap = r->bitmap;
        p->bitmap_len = gddr_bitmap_bytes(r->nchunks);
    }
    return gddr__residual_snapshot(c, i, p->bitmap ? r->bitmap : NULL, &p->snap, &p->snap_bm,
                                   &p->snap_vals);
}

/* Step 5: push every tensor and fetch the next parameters. */
static int exchange(gddr_client *c, payload *pl, float *const *params, int have_params,
                    op *res, uint64_t *tk, uint64_t *ptk)
{
    int nt = c->nt, rc = GDDR_OK, sent = 0;
    /* async and ssp: the pull can follow the push at once, the server
     * serves them in order; sync needs the step's target version first. */
    int pipelined = !have_params && c->info.mode != GDDR_MODE_SYNC;
    for (int i = 0; i < nt && rc == GDDR_OK; i++, sent++) {
        payload *p = &pl[i];
        rc = gddr__push_tensor(c, i, p->vals, p->bitmap, p->bitmap_len, p->nvals, p->birth,
                               p->base, p->norm, p->snap, p->snap_bm, p->snap_vals, &tk[i]);
    }
    int npulled = 0;
    if (rc == GDDR_OK && pipelined) {
        for (int i = 0; i < nt && rc == GDDR_OK; i++, npulled++)
            rc = gddr__pull_tensor(c, i, params[i], 0, c->step + 1, &ptk[i]);
    }
    int rc2 = wait_all(c, tk, res, sent, -1);
    op *pres = res + nt;
    int rc3 = wait_all(c, ptk, pres, npulled, c->o.timeout_ms + 1000);
    if (rc != GDDR_OK || rc2 != GDDR_OK || rc3 != GDDR_OK)
        return rc != GDDR_OK ? rc : rc2 != GDDR_OK ? rc2 : rc3;
    /* Which tensors still need a pull: sync steps (also the first sync step
     * after an async warm-up), or everything when nothing was pipelined. */
    for (int i = 0; i < nt; i++) {
        uint64_t need = res[i].applied ? res[i].version : res[i].sync_target;
        int have = have_params || (pipelined && pres[i].version >= need);
        if (have)
            continue;
        for (;;) {
            uint64_t t1;
            rc = gddr__pull_tensor(c, i, params[i], need, c->step + 1, &t1);
            if (rc == GDDR_OK)
                rc = gddr__wait_op(c, t1, c->o.timeout_ms + 1000, &pres[i]);
            /* The server parks a sync pull for timeout_ms; when a slow or
             * dead worker keeps the step open longer, ask again. */
            if (rc == GDDR_ETIMEDOUT && !c->epoch_changed && pres[i].req_id == t1 &&
                pres[i].done)
                continue;
            break;
        }
        if (rc != GDDR_OK)
            return rc;
    }
    for (int i = 0; i < nt; i++) {
        ctensor *t = &c->t[i];
        if (!have_params)
            t->version = pres[i].version;
        memcpy(t->last, params[i], t->n * 4);
    }
    return GDDR_OK;
}

int gddr_step_from(gddr_client *c, const float *const *grads, const float *const *computed_on,
                   const uint64_t *versions, float *const *params)
{
    if (!c || !grads || !params)
        return GDDR_EINVAL;
    if (c->nt == 0)
        return gddr__set_err(c, GDDR_ESTATE, "step: no tensor registered");
    int nt = c->nt, rc = GDDR_OK;
    payload *pl = calloc((size_t)nt, sizeof *pl);
    op *res = calloc((size_t)nt * 2, sizeof *res);
    uint64_t *tk = calloc((size_t)nt * 2, sizeof *tk);
    const float **w_bak = calloc((size_t)nt, sizeof *w_bak);
    uint64_t *base = calloc((size_t)nt, sizeof *base);
    if (!pl || !res || !tk || !w_bak || !base) {
        rc = gddr__set_err(c, GDDR_ENOMEM, "no memory");
        goto out;
    }
    int64_t give_up = gddr__now_ms() + c->o.reconnect_timeout_ms;

    /* 1-2: copy, norms, global clipping. */
    double total = 0;
    for (int i = 0; i < nt; i++) {
        ctensor *t = &c->t[i];
        if (!grads[i] || !params[i]) {
            rc = gddr__set_err(c, GDDR_EINVAL, "step: NULL gradient or parameters for '%s'", t->key);
            goto out;
        }
        memcpy(t->g, grads[i], t->n * 4);
        double nrm = gddr_nrm2_cpu(t->g, t->n);
        if (!isfinite(nrm)) {
            rc = gddr__set_err(c, GDDR_ENONFINITE, "step: the gradient of '%s' holds NaN or Inf", t->key);
            goto out;
        }
        pl[i].norm = (float)nrm;
        total += nrm * nrm;
        pl[i].birth = versions ? versions[i] : t->version;
        w_bak[i] = computed_on ? computed_on[i] : t->last;
    }
    total = sqrt(total);
    if (c->o.clip_norm > 0 && total > c->o.clip_norm)
        for (int i = 0; i < nt; i++)
            gddr_scal_cpu(c->t[i].g, c->t[i].n, (float)(c->o.clip_norm / total));

    /* 3: DC-ASGD (a sync step has w' == w_bak: nothing to compensate). */
    int dc = c->o.dc_lambda > 0 && c->info.mode != GDDR_MODE_SYNC;
    for (;;) {
        if (!dc) {
            for (int i = 0; i < nt; i++)
                base[i] = pl[i].birth;
            break;
        }
        rc = dc_pull_and_compensate(c, w_bak, base, res, tk);
        if (rc == GDDR_OK)
            break;
        if (!needs_reconnect(c, rc) || gddr__now_ms() > give_up || gddr__reconnect(c) != GDDR_OK)
            goto out;
    }

    /* 4: GDDR residuals, or the whole gradient. */
    for (int i = 0; i < nt; i++) {
        pl[i].base = base[i] < pl[i].birth ? pl[i].birth : base[i];
        if (c->o.delay_fraction > 0) {
            if ((rc = residual_pack(c, i, &pl[i])) != GDDR_OK)
                goto out;
        } else {
            pl[i].vals = c->t[i].g;
            pl[i].nvals = c->t[i].n;
        }
    }

    /* 5: push and pull, again after a reconnect if the server went away. */
    for (;;) {
        if (dc)
            for (int i = 0; i < nt; i++)
                memcpy(params[i], c->t[i].wnew, c->t[i].n * 4);
        rc = exchange(c, pl, params, dc, res, tk, tk + nt);
        if (rc == GDDR_OK)
            break;
        if (!needs_reconnect(c, rc) || gddr__now_ms() > give_up || gddr__reconnect(c) != GDDR_OK)
            goto out;
        /* The restarted server may be behind the versions we tagged. */
        for (int i = 0; i < nt; i++) {
            if (pl[i].base > c->t[i].version)
                pl[i].base = c->t[i].version;
            if (pl[i].birth > pl[i].base)
                pl[i].birth = pl[i].base;
        }
        dc = 0; /* after a reconnect, fetch fresh parameters */
    }
    if (dc)
        for (int i = 0; i < nt; i++)
            c->t[i].version = base[i];
    for (int i = 0; i < nt; i++)
        c->k.staleness_sum += res[i].staleness;
    c->k.steps++;
    c->step++;
out:
    free(pl);
    free(res);
    free(tk);
    free(w_bak);
    free(base);
    return rc;
}

int gddr_step(gddr_client *c, const float *const *grads, float *const *params)
{
    return gddr_step_from(c, grads, NULL, NULL, params);
}
