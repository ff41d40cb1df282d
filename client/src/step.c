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
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blas.h"
#include "client_int.h"
#include "dc.h"
#include "fused.h"
#include "residual.h"

static void dev_free(ctensor *t);

void gddr__step_free(ctensor *t)
{
    dev_free(t);
    free(t->accum);
    t->accum = NULL;
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

/* ---- the device path ----------------------------------------------------------
 *
 * When the gradients are CUDA device pointers, the residual r and the
 * packed payload live in device memory and the math of steps 1-4 runs on
 * the client's one stream, through the CUDA plugin (kernels/cuda_api.h,
 * loaded by the first device step). Per step and tensor (kernels/fused.h):
 *
 *   pass 1  sum of squares of g; then one kernel turns every tensor's sum
 *           into the clip factor and a "finite" flag on the device;
 *   plan    the host decides which chunks are held (gddr_residual_plan_cpu:
 *           integer hashing over chunks, the ages stay on the host) and
 *           uploads each chunk's rank among the sent ones;
 *   pass 2  g * factor, DC-ASGD, u = r + g, held chunks stay in r, sent
 *           chunks go packed to d_out, the L1 of r is summed -- one kernel;
 *           then d_out (exactly the floats the plan sends) goes to pinned
 *           host memory.
 *
 * Everything of every tensor is queued first and the stream is waited for
 * once, before the push; the finiteness check reads the sums then, and a
 * non-finite gradient fails the step with nothing changed (the fused pass
 * writes nothing when the flag is 0, and the plan's ages are put back).
 * Two cases wait once more, before step 3, to keep the host path's order:
 * DC-ASGD (the gradient is checked before w' is pulled) and an orphan
 * installment (added on the host to the residual copied down). Pulled
 * parameters land in pinned memory and are copied to the caller's buffers,
 * with one more wait. The host mirror res.r is refreshed only when a
 * residual snapshot is due and on close. Without a plugin no pointer is
 * device memory the library can use (gddr_cuda_is_device_ptr()), and a
 * step given one fails with the loader's reason. */

struct gddr__dtensor {
    const float *g;       /* this step's gradient: the caller's device buffer */
    float *d_r;           /* residual, n floats */
    uint32_t *d_rank;     /* per chunk: rank among this step's sent chunks, or GDDR_HELD */
    uint32_t *h_rank;     /* pinned: the host's plan */
    float *d_out;         /* sent chunks packed (GDDR), or the whole gradient (dense) */
    float *h_out;         /* pinned: what crosses to the host and is pushed */
    float *h_params;      /* pinned: pull target before the copy to the caller */
    float *d_wnew, *d_wbak, *d_ms; /* DC-ASGD */
    uint32_t *age_before; /* host: the ages before this step's plan */
    int planned;          /* this step's plan changed the ages */
    size_t npacked, nsent;
};

/* The client's device state (c->cuda). */
typedef struct gddr__dclient {
    gddr_cuda_ctx *ctx;
    int cap;              /* tensors the arrays below hold */
    double *d_sumsq;      /* per tensor: sum of squares of the gradient */
    double *d_l1;         /* per tensor: sum |r| after the step */
    float *d_ctl;         /* clip factor, finite flag (fused.h) */
    double *h_stat;       /* pinned: cap sums of squares, then cap L1 sums */
} dclient;

/* DC-ASGD runs in async and ssp steps (a sync step has w' == w_bak). */
static int dc_on(const gddr_client *c)
{
    return c->o.dc_lambda > 0 && c->info.mode != GDDR_MODE_SYNC;
}

static dclient *dcl(gddr_client *c)
{
    return (dclient *)c->cuda;
}

static void *dev_stream(gddr_client *c)
{
    return c->cuda ? gddr_cuda_ctx_stream(dcl(c)->ctx) : NULL;
}

/* A failed CUDA call, with what CUDA (or the plugin loader) said: the
 * client's error message and an error line in its log. */
static int dev_fail(gddr_client *c, int rc, const char *key, const char *what)
{
    const char *why = gddr_cuda_errmsg();
    gddr__logf(&c->log, GDDR_LOG_ERROR, "device step of '%s': %s failed: %s", key, what, why);
    return gddr__set_err(c, rc, "device step of '%s': %s failed: %s", key, what, why);
}

#define DEV_TRY(call, key, what)                                                              \
    do {                                                                                      \
        int r_ = (call);                                                                      \
        if (r_ != GDDR_OK)                                                                    \
            return dev_fail(c, r_, key, what);                                                \
    } while (0)

static void dev_free(ctensor *t)
{
    struct gddr__dtensor *d = t->dev;
    if (!d)
        return;
    gddr_cuda_free(d->d_r);
    gddr_cuda_free(d->d_rank);
    gddr_cuda_free(d->d_out);
    gddr_cuda_free(d->d_wnew);
    gddr_cuda_free(d->d_wbak);
    gddr_cuda_free(d->d_ms);
    gddr_cuda_host_free(d->h_rank);
    gddr_cuda_host_free(d->h_out);
    gddr_cuda_host_free(d->h_params);
    free(d->age_before);
    free(d);
    t->dev = NULL;
}

static void dclient_arrays_free(dclient *x)
{
    gddr_cuda_free(x->d_sumsq);
    gddr_cuda_free(x->d_l1);
    gddr_cuda_free(x->d_ctl);
    gddr_cuda_host_free(x->h_stat);
    x->d_sumsq = x->d_l1 = NULL;
    x->d_ctl = NULL;
    x->h_stat = NULL;
    x->cap = 0;
}

void gddr__step_dev_close(gddr_client *c)
{
    if (c && c->cuda) {
        /* The host mirror gets the device residual back, so what runs
         * after (the residual flush of gddr_client_close) sees it. */
        void *st = dev_stream(c);
        for (int i = 0; i < c->nt; i++) {
            ctensor *t = &c->t[i];
            if (t->dev && t->res.r &&
                gddr_cuda_memcpy_d2h(t->res.r, t->dev->d_r, t->n * 4, st) != GDDR_OK)
                gddr__logf(&c->log, GDDR_LOG_WARN, "could not copy the residual of '%s' off the GPU: %s",
                           t->key, gddr_cuda_errmsg());
        }
        if (gddr_cuda_sync(st) != GDDR_OK)
            gddr__logf(&c->log, GDDR_LOG_WARN, "the GPU stream failed at close: %s", gddr_cuda_errmsg());
        dclient *x = dcl(c);
        dclient_arrays_free(x);
        gddr_cuda_ctx_destroy(&x->ctx);
        free(x);
        c->cuda = NULL;
    }
}

int gddr__cuda_d2d(void *dst, const void *src, size_t bytes)
{
    int rc = gddr_cuda_memcpy_d2d(dst, src, bytes, NULL);
    return rc == GDDR_OK ? gddr_cuda_sync(NULL) : rc;
}

/* The context and the per-tensor arrays, for as many tensors as are
 * registered now (a tensor registered after the first device step grows
 * them). */
static int dev_client(gddr_client *c)
{
    const char *k = c->t[0].key;
    if (!c->cuda) {
        dclient *x = calloc(1, sizeof *x);
        if (!x)
            return gddr__set_err(c, GDDR_ENOMEM, "no memory");
        int rc = gddr_cuda_ctx_create(&x->ctx);
        if (rc != GDDR_OK) {
            free(x);
            return dev_fail(c, rc, k, "creating a CUDA stream and cuBLAS handle");
        }
        c->cuda = x;
    }
    dclient *x = dcl(c);
    if (x->cap >= c->nt)
        return GDDR_OK;
    DEV_TRY(gddr_cuda_sync(dev_stream(c)), k, "sync");
    dclient_arrays_free(x);
    size_t nt = (size_t)c->nt;
    DEV_TRY(gddr_cuda_malloc((void **)&x->d_sumsq, nt * sizeof(double)), k, "cudaMalloc");
    DEV_TRY(gddr_cuda_malloc((void **)&x->d_l1, nt * sizeof(double)), k, "cudaMalloc");
    DEV_TRY(gddr_cuda_malloc((void **)&x->d_ctl, 2 * sizeof(float)), k, "cudaMalloc");
    DEV_TRY(gddr_cuda_host_alloc((void **)&x->h_stat, 2 * nt * sizeof(double)), k, "cudaMallocHost");
    x->cap = c->nt;
    return GDDR_OK;
}

/* Device buffers of one tensor; the host residual (zero, or what host steps
 * left) is uploaded, so a client may start on the host and move to the GPU. */
static int dev_alloc(gddr_client *c, ctensor *t)
{
    if (t->dev)
        return GDDR_OK;
    int rc = dev_client(c);
    if (rc == GDDR_OK)
        rc = res_alloc(c, t);
    if (rc != GDDR_OK)
        return rc;
    struct gddr__dtensor *d = calloc(1, sizeof *d);
    if (!d)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    t->dev = d;
    size_t n = t->n, nch = t->res.nchunks ? t->res.nchunks : 1;
    if (!(d->age_before = malloc(nch * sizeof *d->age_before))) {
        dev_free(t);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    }
    rc = gddr_cuda_malloc((void **)&d->d_r, n * 4);
    if (rc == GDDR_OK)
        rc = gddr_cuda_malloc((void **)&d->d_rank, nch * sizeof(uint32_t));
    if (rc == GDDR_OK)
        rc = gddr_cuda_malloc((void **)&d->d_out, n * 4);
    if (rc == GDDR_OK)
        rc = gddr_cuda_host_alloc((void **)&d->h_rank, nch * sizeof(uint32_t));
    if (rc == GDDR_OK)
        rc = gddr_cuda_host_alloc((void **)&d->h_out, n * 4);
    if (rc == GDDR_OK)
        rc = gddr_cuda_host_alloc((void **)&d->h_params, n * 4);
    if (rc == GDDR_OK)
        rc = gddr_cuda_memcpy_h2d(d->d_r, t->res.r, n * 4, dev_stream(c));
    if (rc != GDDR_OK) {
        rc = dev_fail(c, rc, t->key, "allocating the device residual");
        dev_free(t);
    }
    return rc;
}

/* An orphan installment is due for some tensor this step. */
static int orphan_due(const gddr_client *c)
{
    for (int i = 0; i < c->nt; i++)
        if (c->t[i].res.orphan)
            return 1;
    return 0;
}

/* Step 1 after the wait: the norms from the sums of squares, refused when
 * not finite. */
static int dev_check_norms(gddr_client *c, payload *pl)
{
    const double *sumsq = dcl(c)->h_stat;
    for (int i = 0; i < c->nt; i++) {
        const double nrm = sqrt(sumsq[i]);
        if (!isfinite(nrm))
            return gddr__set_err(c, GDDR_ENONFINITE, "step: the gradient of '%s' holds NaN or Inf",
                                 c->t[i].key);
        pl[i].norm = (float)nrm;
    }
    return GDDR_OK;
}

/* Steps 1-2 on the device: pass 1 of every tensor and the clip factor,
 * queued. *checked: the norms were waited for and checked already (DC-ASGD
 * or an orphan installment follows, which the host path does only for a
 * finite gradient). */
static int dev_norms(gddr_client *c, const float *const *grads, payload *pl, float **staged,
                     int *checked)
{
    *checked = 0;
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        if (!gddr_cuda_is_device_ptr(grads[i]))
            return gddr__set_err(c, GDDR_EINVAL,
                                 "step: the gradient of '%s' is host memory while the first is on the GPU",
                                 t->key);
        int rc = dev_alloc(c, t);
        if (rc != GDDR_OK)
            return rc;
        t->dev->g = grads[i];
        staged[i] = t->dev->h_params;
        DEV_TRY(gddr_sumsq_cuda(dcl(c)->ctx, grads[i], t->n, &dcl(c)->d_sumsq[i]), t->key,
                "sum of squares");
    }
    dclient *x = dcl(c);
    const char *k = c->t[0].key;
    DEV_TRY(gddr_clip_cuda(x->ctx, x->d_sumsq, c->nt, c->o.clip_norm, x->d_ctl), k, "clip factor");
    DEV_TRY(gddr_cuda_memcpy_d2h(x->h_stat, x->d_sumsq, (size_t)c->nt * sizeof(double),
                                 dev_stream(c)),
            k, "copying the norms down");
    if (dc_on(c) || orphan_due(c)) {
        DEV_TRY(gddr_cuda_sync(dev_stream(c)), k, "sync");
        *checked = 1;
        return dev_check_norms(c, pl);
    }
    return GDDR_OK;
}

/* Step 3's inputs on the device: w' (pulled into t->wnew) and w_bak (the
 * caller's device buffer, or host values) go up, and the g^2 EMA the first
 * time. */
static int dev_dc_inputs(gddr_client *c, ctensor *t, const float *w_bak, gddr_fused_bufs *b)
{
    struct gddr__dtensor *d = t->dev;
    void *st = dev_stream(c);
    size_t bytes = t->n * 4;
    if (!d->d_wnew)
        DEV_TRY(gddr_cuda_malloc((void **)&d->d_wnew, bytes), t->key, "cudaMalloc");
    DEV_TRY(gddr_cuda_memcpy_h2d(d->d_wnew, t->wnew, bytes, st), t->key, "copying w'");
    b->w_new = d->d_wnew;
    b->w_bak = w_bak;
    if (!gddr_cuda_is_device_ptr(w_bak)) {
        if (!d->d_wbak)
            DEV_TRY(gddr_cuda_malloc((void **)&d->d_wbak, bytes), t->key, "cudaMalloc");
        DEV_TRY(gddr_cuda_memcpy_h2d(d->d_wbak, w_bak, bytes, st), t->key, "copying w_bak");
        b->w_bak = d->d_wbak;
    }
    if (c->o.dc_adaptive && !d->d_ms) {
        DEV_TRY(gddr_cuda_malloc((void **)&d->d_ms, bytes), t->key, "cudaMalloc");
        DEV_TRY(gddr_cuda_memcpy_h2d(d->d_ms, t->ms, bytes, st), t->key, "copying the g^2 EMA");
    }
    b->ms = d->d_ms;
    return GDDR_OK;
}

/* Step 4 of one tensor, queued: the plan, pass 2, the payload down. */
static int dev_queue_tensor(gddr_client *c, int i, const float *w_bak, const gddr_dc_args *dca)
{
    ctensor *t = &c->t[i];
    residual *r = &t->res;
    struct gddr__dtensor *d = t->dev;
    dclient *x = dcl(c);
    void *st = dev_stream(c);
    gddr_fused_args a = { t->n, (uint32_t)c->info.chunk, c->o.delay_fraction > 0, dca != NULL,
                          GDDR_DC_ARGS_INIT };
    gddr_fused_bufs b = { .g = d->g, .ctl = x->d_ctl };
    if (dca) {
        a.dca = *dca;
        int rc = dev_dc_inputs(c, t, w_bak, &b);
        if (rc != GDDR_OK)
            return rc;
    }
    if (!a.residual) {
        /* Dense: the whole (clipped, compensated) gradient comes down. */
        const float *src = d->g;
        if (c->o.clip_norm > 0 || dca) {
            b.out = d->d_out;
            DEV_TRY(gddr_fused_cuda(x->ctx, &a, &b), t->key, "the fused pass");
            src = d->d_out;
        }
        DEV_TRY(gddr_cuda_memcpy_d2h(d->h_out, src, t->n * 4, st), t->key, "copying the gradient down");
        return GDDR_OK;
    }
    if (r->orphan) {
        /* Rare (a worker died): the installment is added on the host, after
         * the norms were checked (dev_norms waited for them). */
        DEV_TRY(gddr_cuda_memcpy_d2h(r->r, d->d_r, t->n * 4, st), t->key, "copying the residual down");
        DEV_TRY(gddr_cuda_sync(st), t->key, "sync");
        gddr__orphan_replay(c, i, r->r);
        DEV_TRY(gddr_cuda_memcpy_h2d(d->d_r, r->r, t->n * 4, st), t->key, "copying the residual up");
    }
    gddr_residual_args ra = { t->n, (uint32_t)c->info.chunk, (float)c->o.delay_fraction,
                              (uint32_t)(t->tau > 0 ? t->tau : 1), c->o.seed,
                              (uint32_t)c->info.rank, t->keyhash, c->step, t->chunk0 };
    memcpy(d->age_before, r->age, r->nchunks * sizeof *r->age);
    d->planned = 1;
    int rc = gddr_residual_plan_cpu(&ra, r->age, r->bitmap, d->h_rank, &d->npacked, &d->nsent);
    if (rc != GDDR_OK)
        return gddr__set_err(c, rc, "residual step of '%s' failed", t->key);
    b.r = d->d_r;
    b.rank = d->d_rank;
    b.out = d->d_out;
    b.l1 = &x->d_l1[i];
    DEV_TRY(gddr_cuda_memcpy_h2d(d->d_rank, d->h_rank, r->nchunks * sizeof(uint32_t), st), t->key,
            "copying the plan up");
    DEV_TRY(gddr_fused_cuda(x->ctx, &a, &b), t->key, "the fused pass");
    if (d->npacked)
        DEV_TRY(gddr_cuda_memcpy_d2h(d->h_out, d->d_out, d->npacked * 4, st), t->key,
                "copying the payload down");
    DEV_TRY(gddr_cuda_memcpy_d2h(&x->h_stat[x->cap + i], &x->d_l1[i], sizeof(double), st), t->key,
            "copying the residual's L1 down");
    int every = c->o.residual_checkpoint_steps;
    if (every > 0 && (c->step + 1) % (uint64_t)every == 0) /* a snapshot reads the host mirror */
        DEV_TRY(gddr_cuda_memcpy_d2h(r->r, d->d_r, t->n * 4, st), t->key, "copying the residual down");
    return GDDR_OK;
}

/* Steps 3 (compensation) and 4 on the device for every tensor, one wait,
 * then the payloads. dca: DC-ASGD arguments, or NULL. */
static int dev_payloads(gddr_client *c, payload *pl, const float *const *w_bak,
                        const gddr_dc_args *dca, int checked)
{
    int rc = GDDR_OK;
    for (int i = 0; i < c->nt; i++)
        c->t[i].dev->planned = 0;
    for (int i = 0; i < c->nt && rc == GDDR_OK; i++) {
        gddr_dc_args a;
        if (dca) {
            a = *dca;
            a.n = c->t[i].n;
        }
        rc = dev_queue_tensor(c, i, w_bak[i], dca ? &a : NULL);
    }
    int rc2 = gddr_cuda_sync(dev_stream(c));
    if (rc == GDDR_OK && rc2 != GDDR_OK)
        rc = dev_fail(c, rc2, c->t[0].key, "sync");
    if (rc == GDDR_OK && !checked)
        rc = dev_check_norms(c, pl);
    if (rc != GDDR_OK) {
        /* Nothing of this step may stay: the plans' ages go back (the
         * fused pass wrote nothing for a non-finite gradient). */
        for (int i = 0; i < c->nt; i++)
            if (c->t[i].dev->planned)
                memcpy(c->t[i].res.age, c->t[i].dev->age_before,
                       c->t[i].res.nchunks * sizeof *c->t[i].res.age);
        return rc;
    }
    const dclient *x = dcl(c);
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        residual *r = &t->res;
        struct gddr__dtensor *d = t->dev;
        payload *p = &pl[i];
        p->vals = d->h_out;
        if (c->o.delay_fraction <= 0) {
            gddr__orphan_replay(c, i, d->h_out); /* dense: an installment rides on the gradient */
            p->nvals = t->n;
            continue;
        }
        p->nvals = d->npacked;
        p->residual_l1 = (float)x->h_stat[x->cap + i];
        if (d->nsent == r->nchunks) {
            p->bitmap = NULL;
        } else {
            p->bitmap = r->bitmap;
            p->bitmap_len = gddr_bitmap_bytes(r->nchunks);
            p->held = 1; /* the absent chunks are in the residual */
        }
        rc = gddr__residual_snapshot(c, i, p->bitmap, &p->snap, &p->snap_bm, &p->snap_vals);
        if (rc != GDDR_OK)
            return rc;
    }
    return GDDR_OK;
}

/* After step 5: the pinned pull targets go to the caller's buffers. */
static int dev_params_out(gddr_client *c, float *const *staged, float *const *params)
{
    void *st = dev_stream(c);
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        if (gddr_cuda_is_device_ptr(params[i]))
            DEV_TRY(gddr_cuda_memcpy_h2d(params[i], staged[i], t->n * 4, st), t->key,
                    "copying the parameters up");
        else
            memcpy(params[i], staged[i], t->n * 4);
    }
    DEV_TRY(gddr_cuda_sync(st), c->t[0].key, "sync");
    return GDDR_OK;
}
#undef DEV_TRY

int gddr__residual_get(gddr_client *c, int id, float *out)
{
    if (!c || !out || id < 0 || id >= c->nt)
        return GDDR_EINVAL;
    ctensor *t = &c->t[id];
    if (t->dev) {
        void *st = dev_stream(c);
        int rc = gddr_cuda_memcpy_d2h(out, t->dev->d_r, t->n * 4, st);
        return rc == GDDR_OK ? gddr_cuda_sync(st) : rc;
    }
    if (t->res.r)
        memcpy(out, t->res.r, t->n * 4);
    else
        memset(out, 0, t->n * 4);
    return GDDR_OK;
}

/* The ages live on the host on both paths. */
int gddr__residual_age_get(gddr_client *c, int id, uint32_t *out, size_t *nchunks)
{
    if (!c || !out || !nchunks || id < 0 || id >= c->nt)
        return GDDR_EINVAL;
    ctensor *t = &c->t[id];
    size_t nch = gddr_nchunks(t->n, (uint32_t)c->info.chunk);
    *nchunks = nch;
    if (t->res.age)
        memcpy(out, t->res.age, nch * sizeof *out);
    else
        memset(out, 0, nch * sizeof *out);
    return GDDR_OK;
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
    int rc = res_alloc(c, t);
    if (rc != GDDR_OK)
        return rc;
    residual *r = &t->res;
    /* Orphan installments join the residual, so they leave through the
     * normal mask and nothing of them is sent twice. */
    gddr__orphan_replay(c, i, r->r);
    gddr_residual_args a = { t->n, (uint32_t)c->info.chunk, (float)c->o.delay_fraction,
                             (uint32_t)(t->tau > 0 ? t->tau : 1), c->o.seed,
                             (uint32_t)c->info.rank, t->keyhash, c->step, t->chunk0 };
    size_t npacked = 0, nsent = 0;
    rc = gddr_residual_step_cpu(&a, g, r->r, r->age, r->packed, r->bitmap, &npacked, &nsent);
    if (rc != GDDR_OK)
        return gddr__set_err(c, rc, "residual step of '%s' failed", t->key);
    p->residual_l1 = (float)gddr_asum_cpu(r->r, t->n); /* what a crash now would lose */
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
     * versions (client.c complete()): no copy here. */
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
        if (c->o.clip_norm > 0 || dc_on(c) || (c->o.delay_fraction <= 0 && t->res.orphan)) {
            memcpy(t->g, grads[i], t->n * 4);
            gsrc[i] = t->g;
            nrm = gddr_nrm2_cpu(t->g, t->n);
        } else if (c->o.delay_fraction <= 0) {
            /* Dense and unchanged: the payload is the gradient, so the
             * server's validation pass measures its norm (and refuses a
             * NaN or Inf with E_NONFINITE); no pass of our own. */
            gsrc[i] = grads[i];
            pl[i].norm_from_payload = 1;
            nrm = 0;
        } else {
            gsrc[i] = grads[i]; /* read (and sent) from where it is */
            nrm = gddr_nrm2_cpu(grads[i], t->n);
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
        if (c->o.delay_fraction > 0) {
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
    int checked = 0;
    rc = dev ? dev_norms(c, grads, pl, staged, &checked) : host_norms(c, grads, pl, gsrc);
    if (rc != GDDR_OK)
        goto out;

    /* 3: DC-ASGD pulls w' (a sync step has w' == w_bak: nothing to
     * compensate). */
    int dc = dc_on(c);
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
        if (!gddr__needs_reconnect(c, rc) || gddr__now_ms() > give_up || gddr__reconnect(c) != GDDR_OK)
            goto out;
    }

    /* 3-4: compensation, then GDDR residuals or the whole gradient. The step
     * of each push is fixed here, so a resend after a reconnect carries the
     * same one. */
    for (int i = 0; i < nt; i++) {
        pl[i].base = base[i] < pl[i].birth ? pl[i].birth : base[i];
        pl[i].step = gddr__push_step(c, i);
        pl[i].lend = 1; /* sent without a copy; gddr__step_run waits for ZeroMQ */
    }
    rc = dev ? dev_payloads(c, pl, w_bak, dc ? &dca : NULL, checked)
             : host_payloads(c, pl, gsrc, w_bak, dc ? &dca : NULL);
    if (rc != GDDR_OK)
        goto out;

    /* 5: push and pull, again after a reconnect if the server went away. */
    for (;;) {
        rc = exchange(c, pl, dev ? staged : params, res, tk, tk + nt, give_up);
        if (rc == GDDR_OK)
            break;
        if (!gddr__needs_reconnect(c, rc) || gddr__now_ms() > give_up || gddr__reconnect(c) != GDDR_OK)
            goto out;
        /* The restarted server may be behind the versions we tagged. */
        for (int i = 0; i < nt; i++) {
            if (pl[i].base > c->t[i].version)
                pl[i].base = c->t[i].version;
            if (pl[i].birth > pl[i].base)
                pl[i].birth = pl[i].base;
        }
    }
    if (dev && (rc = dev_params_out(c, staged, params)) != GDDR_OK)
        goto out;
    /* A restarted server answered this step: register again now, so its
     * tensor ids and versions are the ones we use from here on. */
    if (c->epoch_changed && gddr__reconnect(c) != GDDR_OK) {
        rc = GDDR_ETIMEDOUT;
        goto out;
    }
    for (int i = 0; i < nt; i++)
        c->k.staleness_sum += res[i].staleness;
    c->k.steps++;
    c->step++;
out:
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

int gddr_step_from(gddr_client *c, const float *const *grads, const float *const *computed_on,
                   const uint64_t *versions, float *const *params)
{
    /* The library thread owns the client while pipelined steps are in
     * flight (no error text: c->errmsg belongs to that thread now). */
    if (c && c->shards)
        return grads && params ? gddr__shards_step(c, grads, computed_on, versions, params)
                               : GDDR_EINVAL;
    if (c && gddr__pipeline_busy(c))
        return GDDR_ESTATE;
    return gddr__step_run(c, grads, computed_on, versions, params);
}

int gddr_step(gddr_client *c, const float *const *grads, float *const *params)
{
    return gddr_step_from(c, grads, NULL, NULL, params);
}
