/* step.c -- gddr_step: one training step over every registered tensor, in
 * the order of docs/design.md section 6:
 *
 *   1. copy the gradient into the library's buffer, measure its norm
 *   2. clip to clip_norm (global norm over all tensors)
 *   3. DC-ASGD: pull the newest w', compensate against w_bak, base = v'
 *   4. GDDR: u = r + g, hold a random subset of chunks (age < tau), pack
 *      the rest; replay orphan installments into r; attach a residual
 *      snapshot every residual_checkpoint_steps
 *   5. push; sync: pull min_version = the step's target; async/ssp: pull
 *      the newest, also after a DC step. The original design had a DC step
 *      return the w' it pulled before pushing; measured on Fashion-MNIST that
 *      made the next gradient miss this worker's own push and everything
 *      since the DC pull (true staleness ~10 instead of ~5) and accuracy fell
 *      to 0.34; with the fresh pull DC matches plain async (docs/results.md,
 *      docs/design-decisions.md). It costs one more pull per step.
 *
 * Steps 1-4 change local state once; step 5 is retried after a reconnect
 * with the same payload, so a server restart neither loses nor doubles
 * what the residual engine released.
 *
 * This file is the host path and the order of the steps; when the
 * gradients are CUDA device pointers, steps 1-4 and the copy of the
 * parameters out run in step_dev.c instead.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blas.h"
#include "client_int.h"
#include "dc.h"
#include "residual.h"

void gddr__step_free(ctensor *t)
{
    gddr__dev_free(t);
    free(t->accum);
    t->accum = NULL;
    gddr__residual_free(t);
}

/* What one tensor sends this step. */
typedef gddr__push_args payload;

/* Waits for every ticket under one deadline (not one per ticket: a dead
 * server must cost one timeout, not one per tensor); the first error wins,
 * every op is collected. */
static int wait_all(gddr_client *c, uint64_t *tk, op *res, int n, int timeout_ms)
{
    int rc = GDDR_OK;
    if (timeout_ms < 0)
        timeout_ms = c->o.timeout_ms;
    int64_t deadline = gddr__now_ms() + timeout_ms;
    int late = 0;
    for (int i = 0; i < n; i++) {
        int64_t left = deadline - gddr__now_ms();
        int r = gddr__wait_op(c, tk[i], left > 0 ? (int)left : 0, &res[i]);
        late += r == GDDR_ETIMEDOUT;
        if (r != GDDR_OK && rc == GDDR_OK)
            rc = r;
    }
    if (rc == GDDR_ETIMEDOUT)
        /* The message names the step's bound, not what was left of it when
         * the first late reply was waited for ("within 0 ms"). */
        gddr__set_err(c, rc, "no reply from %s to %d of the step's %d requests in its %d ms", c->server,
                      late, n, timeout_ms);
    return rc;
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

/* DC-ASGD step 3, first half: the newest w' of every tensor into t->wnew,
 * their versions into base[], and the arguments of the compensation (the
 * bias-corrected EMA scale) into *a. */
static int dc_pull(gddr_client *c, uint64_t *base, op *res, uint64_t *tk, gddr_dc_args *a)
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
    /* The EMA of g^2 starts at 0: correct it as Adam does, or lambda_t is
     * several times too large for the first steps (DC-ASGD-a diverged in
     * some runs before this). */
    c->dc_steps++;
    double corr = 1.0 - pow(c->o.dc_ms_decay, (double)c->dc_steps);
    float ms_scale = corr > 1e-30 ? (float)(1.0 / corr) : 1.0f;
    gddr_dc_args d = { 0, (float)c->o.dc_lambda, c->o.dc_mode, c->o.dc_adaptive,
                       (float)c->o.dc_ms_decay, 1e-7f, ms_scale };
    *a = d;
    for (int i = 0; i < c->nt; i++)
        base[i] = res[i].version;
    return GDDR_OK;
}

/* GDDR step 4 for one tensor: fills the payload from the residual engine,
 * reading the gradient from g (the caller's, or the library's copy). */
static int residual_pack(gddr_client *c, int i, const float *g, payload *p)
{
    ctensor *t = &c->t[i];
    int rc = gddr__residual_alloc(c, t);
    if (rc != GDDR_OK)
        return rc;
    residual *r = &t->res;
    /* Orphan installments join the residual, so they leave through the
     * normal mask and nothing of them is sent twice. */
    gddr__orphan_replay(c, i, r->r);
    gddr_residual_args a = gddr__residual_args(c, i);
    if (a.alpha > 0 && gddr__holds_smallest(c)) {
        rc = gddr__residual_pick(c, i, 1, g, &a);
        if (rc != GDDR_OK)
            return rc;
    }
    size_t npacked = 0, nsent = 0;
    double l1 = 0;
    rc = gddr_residual_step_l1_cpu(&a, g, r->r, r->age, r->packed, r->bitmap, &npacked, &nsent, &l1);
    if (rc != GDDR_OK)
        return gddr__set_err(c, rc, "residual step of '%s' failed", t->key);
    p->residual_l1 = (float)l1; /* what a crash now would lose (taken in the step's pass) */
    p->vals = r->packed;
    p->nvals = npacked;
    if (nsent == r->nchunks) {
        p->bitmap = NULL; /* everything goes: a dense push needs no bitmap */
    } else {
        p->bitmap = r->bitmap;
        p->bitmap_len = gddr_bitmap_bytes(r->nchunks);
        p->held = 1; /* the absent chunks are in the residual */
    }
    return gddr__residual_snapshot(c, i, p->bitmap ? r->bitmap : NULL, &p->snap, &p->snap_bm,
                                   &p->snap_vals);
}

/* Step 5: push every tensor and fetch the next parameters. */
static int exchange(gddr_client *c, payload *pl, float *const *params, op *res, uint64_t *tk,
                    uint64_t *ptk, int64_t give_up)
{
    int nt = c->nt, rc = GDDR_OK, sent = 0;
    /* async and ssp: the pull can follow the push at once, the server
     * serves them in order; sync needs the step's target version first. */
    int pipelined = c->info.mode != GDDR_MODE_SYNC;
    for (int i = 0; i < nt && rc == GDDR_OK; i++, sent++) {
        payload *p = &pl[i];
        rc = gddr__push_tensor(c, i, p, &tk[i]);
    }
    int npulled = 0;
    if (rc == GDDR_OK && pipelined) {
        for (int i = 0; i < nt && rc == GDDR_OK; i++, npulled++)
            rc = gddr__pull_view(c, i, params[i], 0, c->step + 1, &ptk[i]);
    }
    /* One deadline for the pushes and the pipelined pulls together: a
     * server that went silent costs one timeout, not two. */
    int64_t deadline = gddr__now_ms() + c->o.timeout_ms + 1000;
    int rc2 = wait_all(c, tk, res, sent, c->o.timeout_ms + 1000);
    op *pres = res + nt;
    int64_t left = deadline - gddr__now_ms();
    int rc3 = wait_all(c, ptk, pres, npulled, left > 0 ? (int)left : 0);
    if (rc != GDDR_OK || rc2 != GDDR_OK || rc3 != GDDR_OK) {
        for (int i = 0; i < nt; i++)
            c->t[i].view_dirty = 1; /* a lazy reply may be lost: the next pull is full */
        return rc != GDDR_OK ? rc : rc2 != GDDR_OK ? rc2 : rc3;
    }
    /* Which tensors still need a pull: sync steps (also the first sync step
     * after an async warm-up), or everything when nothing was pipelined. */
    for (int i = 0; i < nt; i++) {
        uint64_t need = res[i].applied ? res[i].version : res[i].sync_target;
        int have = pipelined && pres[i].version >= need;
        if (have)
            continue;
        for (;;) {
            uint64_t t1;
            memset(&pres[i], 0, sizeof pres[i]); /* answered: this pull's answer only */
            rc = gddr__pull_view(c, i, params[i], need, c->step + 1, &t1);
            if (rc == GDDR_OK)
                rc = gddr__wait_op(c, t1, c->o.timeout_ms + 1000, &pres[i]);
            /* The server parks a sync pull for timeout_ms; when a slow or
             * dead worker keeps the step open longer, ask again -- but not
             * forever: a peer that is alive (it heartbeats) yet never
             * pushes would hold this step open for good. */
            if (rc == GDDR_ETIMEDOUT && !c->epoch_changed && pres[i].answered) {
                if (gddr__now_ms() < give_up)
                    continue;
                return gddr__set_err(c, GDDR_ETIMEDOUT,
                                     "step %llu: version %llu of '%s' did not come within "
                                     "reconnect_timeout_ms = %d ms (a worker is alive but not pushing?)",
                                     (unsigned long long)c->step, (unsigned long long)need,
                                     c->t[i].key, c->o.reconnect_timeout_ms);
            }
            break;
        }
        if (rc != GDDR_OK)
            return rc;
    }
    /* The tracked pulls made their frames the tensors' last values and
     * versions (conn_reply.c complete()): no copy here. */
    return GDDR_OK;
}

/* Steps 1-2 on the host: norms, the finiteness check, global clipping.
 * Clipping, DC-ASGD and an orphan installment of a dense push change the
 * gradient: they work on the library's copy t->g; otherwise the step reads
 * (and a dense push sends) the caller's buffer where it is. */
static int host_norms(gddr_client *c, const float *const *grads, payload *pl, const float **gsrc)
{
    double total = 0;
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        double nrm;
        if (c->o.clip_norm > 0 || gddr__dc_on(c) || (c->push_dense == 1 && t->res.orphan)) {
            memcpy(t->g, grads[i], t->n * 4);
            gsrc[i] = t->g;
            nrm = gddr_nrm2_cpu(t->g, t->n);
        } else if (c->push_dense == 1 && c->nt == 1) {
            /* Dense and unchanged: the payload is the gradient, so the
             * server's validation pass measures its norm (and refuses a
             * NaN or Inf with E_NONFINITE); no pass of our own. Not with
             * more tensors: a NaN in one must stop the others' pushes
             * too (they go out together, and the server would apply
             * them). */
            gsrc[i] = grads[i];
            pl[i].norm_from_payload = 1;
            nrm = 0;
        } else {
            gsrc[i] = grads[i]; /* read (and sent) from where it is */
            /* Only checked and reported (nothing is scaled by it here):
             * float precision, three times faster (blas.h). */
            nrm = sqrt(gddr_sumsq_fp32_cpu(grads[i], t->n));
        }
        if (!isfinite(nrm))
            return gddr__set_err(c, GDDR_ENONFINITE, "step: the gradient of '%s' holds NaN or Inf",
                                 t->key);
        pl[i].norm = (float)nrm;
        total += nrm * nrm;
    }
    total = sqrt(total);
    if (c->o.clip_norm > 0 && total > c->o.clip_norm)
        for (int i = 0; i < c->nt; i++)
            gddr_scal_cpu(c->t[i].g, c->t[i].n, (float)(c->o.clip_norm / total));
    return GDDR_OK;
}

/* Steps 3 (compensation) and 4 on the host. dca: DC-ASGD arguments, or
 * NULL. */
static int host_payloads(gddr_client *c, payload *pl, const float **gsrc, const float *const *w_bak,
                         const gddr_dc_args *dca)
{
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        if (dca) {
            gddr_dc_args a = *dca;
            a.n = t->n;
            gddr_dc_cpu(&a, t->g, t->wnew, w_bak[i], t->ms);
        }
        if (c->push_dense != 1) {
            int rc = residual_pack(c, i, gsrc[i], &pl[i]);
            if (rc != GDDR_OK)
                return rc;
        } else {
            /* Dense: an orphan installment simply rides on the gradient. */
            if (gsrc[i] == t->g)
                gddr__orphan_replay(c, i, t->g);
            pl[i].vals = gsrc[i];
            pl[i].nvals = t->n;
        }
    }
    return GDDR_OK;
}

/* delay_auto: what this step pushes (c->push_dense; client_int.h). Without
 * delay_fraction every push is dense and there is no residual. */
static void push_kind(gddr_client *c)
{
    /* The first probe after 24 steps, not pullpick.c's 16: with
     * pull_delta_auto too, the two kinds of probe (9 steps here, 3-8 for
     * pulls) start apart (about 24, 81, 186, ... against 16, 51, 119,
     * ...), so they seldom time each other's change. Paired probes, and
     * two won in a row to change kind (pullpick.c says why). */
    if (!c->push_pick.every) {
        c->push_pick.every = c->push_pick.left = PICK_FIRST + PICK_FIRST / 2;
        c->push_pick.paired = 1;
        c->push_pick.confirm = 2;
    }
    c->push_dense = c->o.delay_fraction <= 0;
    if (!c->push_dense && c->o.delay_auto && gddr__pullpick_next_whole(&c->push_pick))
        c->push_dense = c->res_dirty ? 2 : 1;
}

/* delay_auto: what this step's pushes cost (us), for the choice of the
 * next step's kind: the norms (norms_us; the held kind's pass before the
 * residual is touched) and the time from building the payloads (t_build)
 * to the last push's answer; -1 (not counted) after a reconnect. The pulls
 * are left out, DC-ASGD's too: they are the same for both kinds and, over
 * a shared link, the noisier part of a step (timing the whole step was
 * measured: docs/performance.md, "Holds that step aside"). */
static void push_timed(gddr_client *c, const op *res, int64_t norms_us, int64_t t_build, int reconnected)
{
    int64_t last = 0;
    for (int i = 0; i < c->nt; i++)
        last = res[i].t1_us > last ? res[i].t1_us : last;
    double cost = reconnected || last < t_build ? -1 : (double)(norms_us + last - t_build);
    gddr__pullpick *p = &c->push_pick;
    uint64_t flips = p->flips;
    int probing = p->probing;
    gddr__pullpick_done(p, c->push_dense != 0, cost);
    if (probing && !p->probing && p->flips == flips)
        gddr__logf(&c->log, GDDR_LOG_DEBUG,
                   "delay_auto: pushes still %s (%.0f us a step's pushes at least, against %.0f for the "
                   "other kind)", p->whole ? "send every chunk" : "hold chunks", p->last_cost[p->whole],
                   p->last_cost[!p->whole]);
    if (p->flips != flips)
        gddr__logf(&c->log, GDDR_LOG_INFO,
                   "delay_auto: pushes now %s (%.0f us a step's pushes at least, against %.0f); the "
                   "other kind is tried again in %u steps", p->whole ? "send every chunk" : "hold chunks",
                   p->last_cost[p->whole], p->last_cost[!p->whole], p->every);
}

/* The step; dev: the gradients are CUDA device pointers (gddr__step_run). */
static int step_body(gddr_client *c, const float *const *grads, const float *const *computed_on,
                     const uint64_t *versions, float *const *params)
{
    int nt = c->nt, rc = GDDR_OK;
    const int dev = c->ptr_kind == 2;
    float **staged = NULL; /* dev: pinned pull targets */
    payload *pl = calloc((size_t)nt, sizeof *pl);
    op *res = calloc((size_t)nt * 2, sizeof *res);
    uint64_t *tk = calloc((size_t)nt * 2, sizeof *tk);
    const float **w_bak = calloc((size_t)nt, sizeof *w_bak);
    const float **gsrc = calloc((size_t)nt, sizeof *gsrc); /* host: what the step reads */
    uint64_t *base = calloc((size_t)nt, sizeof *base);
    if (dev)
        staged = calloc((size_t)nt, sizeof *staged);
    if (!pl || !res || !tk || !w_bak || !gsrc || !base || (dev && !staged)) {
        rc = gddr__set_err(c, GDDR_ENOMEM, "no memory");
        goto out;
    }
    int64_t give_up = gddr__now_ms() + c->o.reconnect_timeout_ms;
    for (int i = 0; i < nt; i++) {
        ctensor *t = &c->t[i];
        if (!grads[i] || !params[i]) {
            rc = gddr__set_err(c, GDDR_EINVAL, "step: NULL gradient or parameters for '%s'", t->key);
            goto out;
        }
        pl[i].birth = versions ? versions[i] : t->version;
        w_bak[i] = computed_on ? computed_on[i] : gddr__last(t);
        if (!w_bak[i]) {
            rc = gddr__set_err(c, GDDR_ENOMEM, "step: no memory for the last values of '%s'", t->key);
            goto out;
        }
    }

    /* 1-2: norms, global clipping. */
    int64_t t0 = gddr__now_us();
    push_kind(c);
    int checked = 0;
    rc = dev ? gddr__dev_norms(c, grads, pl, staged, &checked) : host_norms(c, grads, pl, gsrc);
    if (rc != GDDR_OK)
        goto out;
    int64_t norms_us = gddr__now_us() - t0;

    /* 3: DC-ASGD pulls w' (a sync step has w' == w_bak: nothing to
     * compensate). */
    int dc = gddr__dc_on(c);
    gddr_dc_args dca;
    for (;;) {
        if (!dc) {
            for (int i = 0; i < nt; i++)
                base[i] = pl[i].birth;
            break;
        }
        rc = dc_pull(c, base, res, tk, &dca);
        if (rc == GDDR_OK)
            break;
        if (!gddr__needs_reconnect(c, rc) || gddr__now_ms() > give_up || (rc = gddr__reconnect(c)) != GDDR_OK)
            goto out; /* (a failed reconnect says why: the server did not come back) */
    }

    /* 3-4: compensation, then GDDR residuals or the whole gradient. The step
     * of each push is fixed here, so a resend after a reconnect carries the
     * same one. */
    for (int i = 0; i < nt; i++) {
        pl[i].base = base[i] < pl[i].birth ? pl[i].birth : base[i];
        pl[i].step = gddr__push_step(c, i);
        pl[i].lend = 1; /* sent without a copy; gddr__step_run waits for ZeroMQ */
    }
    int64_t t_build = gddr__now_us();
    rc = dev ? gddr__dev_payloads(c, pl, w_bak, dc ? &dca : NULL, checked)
             : host_payloads(c, pl, gsrc, w_bak, dc ? &dca : NULL);
    if (rc != GDDR_OK)
        goto out;
    if (c->push_dense != 1)
        c->res_dirty = c->push_dense == 0; /* a flush left every residual zero */

    /* 5: push and pull, again after a reconnect if the server went away. */
    int reconnected = 0;
    for (;;) {
        rc = exchange(c, pl, dev ? staged : params, res, tk, tk + nt, give_up);
        if (rc == GDDR_OK)
            break;
        reconnected = 1;
        if (!gddr__needs_reconnect(c, rc) || gddr__now_ms() > give_up || (rc = gddr__reconnect(c)) != GDDR_OK)
            goto out;
        /* The restarted server may be behind the versions we tagged. */
        for (int i = 0; i < nt; i++) {
            if (pl[i].base > c->t[i].version)
                pl[i].base = c->t[i].version;
            if (pl[i].birth > pl[i].base)
                pl[i].birth = pl[i].base;
        }
    }
    if (dev && (rc = gddr__dev_params_out(c, staged, params)) != GDDR_OK)
        goto out;
    /* A restarted server answered this step: register again now, so its
     * tensor ids and versions are the ones we use from here on. */
    if (c->epoch_changed && gddr__reconnect(c) != GDDR_OK) {
        rc = GDDR_ETIMEDOUT;
        goto out;
    }
    if (c->o.delay_auto && c->o.delay_fraction > 0)
        push_timed(c, res, norms_us, t_build, reconnected);
    for (int i = 0; i < nt; i++)
        c->k.staleness_sum += res[i].staleness;
    c->k.steps++;
    c->step++;
out:
    c->push_dense = 0; /* (the residual's args outside a step: alpha as configured) */
    free(pl);
    free(res);
    free(tk);
    free(w_bak);
    free(gsrc);
    free(base);
    free(staged);
    return rc;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int gddr__step_run(gddr_client *c, const float *const *grads, const float *const *computed_on,
                   const uint64_t *versions, float *const *params)
{
    if (!c || !grads || !params)
        return GDDR_EINVAL;
    if (c->nt == 0)
        return gddr__set_err(c, GDDR_ESTATE, "step: no tensor registered");
    int dev = grads[0] && gddr_cuda_is_device_ptr(grads[0]);
    if (c->ptr_kind == 2 && !dev && c->o.delay_fraction > 0)
        return gddr__set_err(c, GDDR_ESTATE,
                             "step: this client's residual lives on the GPU; keep passing device gradients");
    c->ptr_kind = dev ? 2 : 1;
    uint64_t tau_sum = 0;
    for (int i = 0; c->o.delay_fraction > 0 && i < c->nt; i++)
        tau_sum += (uint64_t)(c->t[i].tau > 0 ? c->t[i].tau : 1);
    int64_t t0 = now_ns();
    if (c->o.accumulate_steps > 1) {
        /* Gradient accumulation: k calls make one push of their mean. */
        int k = c->o.accumulate_steps, rc = GDDR_OK;
        if (dev)
            return gddr__set_err(c, GDDR_ENOTSUP, "step: accumulate_steps with device gradients");
        if (!c->acc_birth && !(c->acc_birth = calloc((size_t)c->nt, sizeof *c->acc_birth)))
            return gddr__set_err(c, GDDR_ENOMEM, "no memory");
        for (int i = 0; i < c->nt; i++) {
            ctensor *t = &c->t[i];
            if (!t->accum && !(t->accum = malloc(t->n * 4)))
                return gddr__set_err(c, GDDR_ENOMEM, "no memory for the accumulation of '%s'", t->key);
            if (!grads[i])
                return gddr__set_err(c, GDDR_EINVAL, "step: NULL gradient for '%s'", t->key);
        }
        for (int i = 0; i < c->nt; i++) {
            ctensor *t = &c->t[i];
            if (c->acc_calls == 0) {
                memcpy(t->accum, grads[i], t->n * 4);
                c->acc_birth[i] = versions ? versions[i] : t->version; /* the first one's */
            } else {
                gddr_axpy_cpu(t->accum, grads[i], t->n, 1.0f);
            }
        }
        if (++c->acc_calls < k)
            return GDDR_OK; /* nothing sent; the parameters stay as they are */
        c->acc_calls = 0;
        const float **mean = calloc((size_t)c->nt, sizeof *mean);
        if (!mean)
            return gddr__set_err(c, GDDR_ENOMEM, "no memory");
        for (int i = 0; i < c->nt; i++) {
            gddr_scal_cpu(c->t[i].accum, c->t[i].n, 1.0f / (float)k);
            mean[i] = c->t[i].accum;
        }
        rc = step_body(c, mean, computed_on, c->acc_birth, params);
        gddr__lent_wait(c);
        free(mean);
        c->k.step_ns += (uint64_t)(now_ns() - t0);
        return rc;
    }
    int rc = step_body(c, grads, computed_on, versions, params);
    gddr__lent_wait(c); /* the caller's gradients and our buffers are ours again */
    c->k.step_ns += (uint64_t)(now_ns() - t0);
    if (rc == GDDR_OK && c->o.delay_fraction > 0) {
        c->k.tau_sum += tau_sum;
        c->k.tau_count += (uint64_t)c->nt;
    }
    return rc;
}
