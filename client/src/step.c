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
 *      the newest, also after a DC step. DESIGN says a DC step returns the
 *      w' it pulled before pushing; measured on Fashion-MNIST that made the
 *      next gradient miss this worker's own push and everything since the
 *      DC pull (true staleness ~10 instead of ~5) and accuracy fell to
 *      0.34; with the fresh pull DC matches plain async (docs/results.md,
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

#ifdef GDDR_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "blas.h"
#include "client_int.h"
#include "dc.h"
#include "replay.h"
#include "residual.h"

static void dev_free(ctensor *t);

void gddr__step_free(ctensor *t)
{
    dev_free(t);
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
    for (int i = 0; i < n; i++) {
        int64_t left = deadline - gddr__now_ms();
        int r = gddr__wait_op(c, tk[i], left > 0 ? (int)left : 0, &res[i]);
        if (r != GDDR_OK && rc == GDDR_OK)
            rc = r;
    }
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
 * When the gradient is a CUDA device pointer (a CUDA build with a GPU), the
 * residual r, the chunk ages and the packed payload live in device memory:
 * norms, clipping, DC-ASGD and the residual step run there on the client's
 * one stream (gddr_cuda_ctx, created by the first device step), and only the
 * packed sent chunks and the bitmap cross to pinned host memory for the
 * push. Pulled parameters land in pinned memory and are copied to the
 * caller's buffers (device or host). The host mirror res.r is refreshed
 * only when a residual snapshot is due or an orphan installment is added.
 * Without CUDA gddr_cuda_is_device_ptr() is always 0, so none of this runs
 * (the kernels' stubs would answer GDDR_ENOTSUP). */

struct gddr__dtensor {
    const float *g;    /* the gradient this step reads: the caller's or d_g */
    float *d_g;        /* work copy when clipping or DC change the gradient */
    float *d_r;        /* residual, n floats */
    uint32_t *d_age;   /* per chunk */
    float *d_packed;   /* sent chunks, contiguous */
    uint8_t *d_bitmap;
    float *h_packed;   /* pinned: what crosses to the host */
    uint8_t *h_bitmap; /* pinned */
    float *h_params;   /* pinned: pull target before the copy to the caller */
    float *d_wnew, *d_wbak, *d_ms; /* DC-ASGD */
};

static void *dev_stream(gddr_client *c)
{
    return gddr_cuda_ctx_stream((gddr_cuda_ctx *)c->cuda);
}

static void dev_free(ctensor *t)
{
    struct gddr__dtensor *d = t->dev;
    if (!d)
        return;
    gddr_cuda_free(d->d_g);
    gddr_cuda_free(d->d_r);
    gddr_cuda_free(d->d_age);
    gddr_cuda_free(d->d_packed);
    gddr_cuda_free(d->d_bitmap);
    gddr_cuda_free(d->d_wnew);
    gddr_cuda_free(d->d_wbak);
    gddr_cuda_free(d->d_ms);
    gddr_cuda_host_free(d->h_packed);
    gddr_cuda_host_free(d->h_bitmap);
    gddr_cuda_host_free(d->h_params);
    free(d);
    t->dev = NULL;
}

void gddr__step_dev_close(gddr_client *c)
{
    if (c && c->cuda) {
        /* The host mirror gets the device residual and ages back, so what
         * runs after (the residual flush of gddr_client_close) sees them. */
        void *st = dev_stream(c);
        for (int i = 0; i < c->nt; i++) {
            ctensor *t = &c->t[i];
            if (!t->dev || !t->res.r)
                continue;
            if (gddr_cuda_memcpy_d2h(t->res.r, t->dev->d_r, t->n * 4, st) != GDDR_OK ||
                gddr_cuda_memcpy_d2h(t->res.age, t->dev->d_age, t->res.nchunks * sizeof(uint32_t),
                                     st) != GDDR_OK)
                gddr__logf(&c->log, GDDR_LOG_WARN, "could not copy the residual of '%s' off the GPU",
                           t->key);
        }
        gddr_cuda_sync(st);
        gddr_cuda_ctx *x = c->cuda;
        gddr_cuda_ctx_destroy(&x);
        c->cuda = NULL;
    }
}

int gddr__cuda_d2d(void *dst, const void *src, size_t bytes)
{
#ifdef GDDR_HAVE_CUDA
    if (bytes && cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess) {
        (void)cudaGetLastError();
        return GDDR_ECUDA;
    }
    return GDDR_OK;
#else
    (void)dst, (void)src, (void)bytes;
    return GDDR_ENOTSUP;
#endif
}

#define DEV_TRY(call, what)                                                                   \
    do {                                                                                      \
        int r_ = (call);                                                                      \
        if (r_ != GDDR_OK)                                                                    \
            return gddr__set_err(c, r_, "device step of '%s': %s failed", t->key, what);      \
    } while (0)

/* Device buffers of one tensor; the host residual (zero, or what host steps
 * left) is uploaded, so a client may start on the host and move to the GPU. */
static int dev_alloc(gddr_client *c, ctensor *t)
{
    if (t->dev)
        return GDDR_OK;
    if (!c->cuda) {
        gddr_cuda_ctx *x = NULL;
        int rc = gddr_cuda_ctx_create(&x);
        if (rc != GDDR_OK)
            return gddr__set_err(c, rc, "cannot create a CUDA stream and cuBLAS handle");
        c->cuda = x;
    }
    int rc = res_alloc(c, t);
    if (rc != GDDR_OK)
        return rc;
    struct gddr__dtensor *d = calloc(1, sizeof *d);
    if (!d)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    t->dev = d;
    size_t n = t->n, nch = t->res.nchunks, bmb = gddr_bitmap_bytes(nch);
    void *st = dev_stream(c);
    if (gddr_cuda_malloc((void **)&d->d_g, n * 4) != GDDR_OK ||
        gddr_cuda_malloc((void **)&d->d_r, n * 4) != GDDR_OK ||
        gddr_cuda_malloc((void **)&d->d_age, nch * sizeof(uint32_t)) != GDDR_OK ||
        gddr_cuda_malloc((void **)&d->d_packed, n * 4) != GDDR_OK ||
        gddr_cuda_malloc((void **)&d->d_bitmap, bmb) != GDDR_OK ||
        gddr_cuda_host_alloc((void **)&d->h_packed, n * 4) != GDDR_OK ||
        gddr_cuda_host_alloc((void **)&d->h_bitmap, bmb) != GDDR_OK ||
        gddr_cuda_host_alloc((void **)&d->h_params, n * 4) != GDDR_OK ||
        gddr_cuda_memcpy_h2d(d->d_r, t->res.r, n * 4, st) != GDDR_OK ||
        gddr_cuda_memcpy_h2d(d->d_age, t->res.age, nch * sizeof(uint32_t), st) != GDDR_OK ||
        gddr_cuda_sync(st) != GDDR_OK) {
        dev_free(t);
        return gddr__set_err(c, GDDR_ECUDA, "no device memory for the residual of '%s'", t->key);
    }
    return GDDR_OK;
}

/* Step 1 on the device: which buffer the step reads, and its norm. */
static int dev_grad_in(gddr_client *c, int i, const float *g, double *nrm)
{
    ctensor *t = &c->t[i];
    if (!gddr_cuda_is_device_ptr(g))
        return gddr__set_err(c, GDDR_EINVAL,
                             "step: the gradient of '%s' is host memory while the first is on the GPU",
                             t->key);
    int rc = dev_alloc(c, t);
    if (rc != GDDR_OK)
        return rc;
    struct gddr__dtensor *d = t->dev;
    /* Clipping and DC-ASGD change the gradient: they work on a copy. */
    if (c->o.clip_norm > 0 || (c->o.dc_lambda > 0 && c->info.mode != GDDR_MODE_SYNC)) {
        DEV_TRY(gddr__cuda_d2d(d->d_g, g, t->n * 4), "copying the gradient");
        d->g = d->d_g;
    } else {
        d->g = g;
    }
    DEV_TRY(gddr_nrm2_cuda((gddr_cuda_ctx *)c->cuda, d->g, t->n, nrm), "nrm2");
    return GDDR_OK;
}

static int dev_scal(gddr_client *c, int i, float a)
{
    ctensor *t = &c->t[i];
    DEV_TRY(gddr_scal_cuda((gddr_cuda_ctx *)c->cuda, t->dev->d_g, t->n, a), "scal");
    return GDDR_OK;
}

/* Step 3 on the device: w' (pulled into t->wnew) and w_bak (the caller's
 * device buffer, or host values) go up, g is compensated in place. */
static int dev_dc(gddr_client *c, int i, const gddr_dc_args *a, const float *w_bak)
{
    ctensor *t = &c->t[i];
    struct gddr__dtensor *d = t->dev;
    void *st = dev_stream(c);
    size_t bytes = t->n * 4;
    if (!d->d_wnew)
        DEV_TRY(gddr_cuda_malloc((void **)&d->d_wnew, bytes), "cudaMalloc");
    DEV_TRY(gddr_cuda_memcpy_h2d(d->d_wnew, t->wnew, bytes, st), "copying w'");
    const float *wb = w_bak;
    if (!gddr_cuda_is_device_ptr(w_bak)) {
        if (!d->d_wbak)
            DEV_TRY(gddr_cuda_malloc((void **)&d->d_wbak, bytes), "cudaMalloc");
        DEV_TRY(gddr_cuda_memcpy_h2d(d->d_wbak, w_bak, bytes, st), "copying w_bak");
        wb = d->d_wbak;
    }
    if (a->adaptive && !d->d_ms) {
        DEV_TRY(gddr_cuda_malloc((void **)&d->d_ms, bytes), "cudaMalloc");
        DEV_TRY(gddr_cuda_memcpy_h2d(d->d_ms, t->ms, bytes, st), "copying the g^2 EMA");
    }
    DEV_TRY(gddr_dc_cuda(a, d->d_g, d->d_wnew, wb, d->d_ms, st), "DC-ASGD");
    return GDDR_OK;
}

/* Step 4 on the device: the residual step, then only the packed sent
 * chunks and the bitmap cross to pinned host memory. */
static int dev_residual_pack(gddr_client *c, int i, payload *p)
{
    ctensor *t = &c->t[i];
    residual *r = &t->res;
    struct gddr__dtensor *d = t->dev;
    void *st = dev_stream(c);
    size_t bmb = gddr_bitmap_bytes(r->nchunks);
    if (r->orphan) {
        /* Rare (a worker died): the installment is added on the host. */
        DEV_TRY(gddr_cuda_memcpy_d2h(r->r, d->d_r, t->n * 4, st), "copying the residual down");
        DEV_TRY(gddr_cuda_sync(st), "sync");
        gddr__orphan_replay(c, i, r->r);
        DEV_TRY(gddr_cuda_memcpy_h2d(d->d_r, r->r, t->n * 4, st), "copying the residual up");
    }
    gddr_residual_args a = { t->n, (uint32_t)c->info.chunk, (float)c->o.delay_fraction,
                             (uint32_t)(t->tau > 0 ? t->tau : 1), c->o.seed,
                             (uint32_t)c->info.rank, t->keyhash, c->step };
    size_t npacked = 0, nsent = 0;
    DEV_TRY(gddr_residual_step_cuda(&a, d->g, d->d_r, d->d_age, d->d_packed, d->d_bitmap, &npacked,
                                    &nsent, st),
            "residual step");
    if (npacked)
        DEV_TRY(gddr_cuda_memcpy_d2h(d->h_packed, d->d_packed, npacked * 4, st), "copying the payload");
    DEV_TRY(gddr_cuda_memcpy_d2h(d->h_bitmap, d->d_bitmap, bmb, st), "copying the bitmap");
    double held = 0;
    DEV_TRY(gddr_asum_cuda((gddr_cuda_ctx *)c->cuda, d->d_r, t->n, &held), "asum");
    p->residual_l1 = (float)held;
    int every = c->o.residual_checkpoint_steps;
    if (every > 0 && (c->step + 1) % (uint64_t)every == 0) /* a snapshot reads the host mirror */
        DEV_TRY(gddr_cuda_memcpy_d2h(r->r, d->d_r, t->n * 4, st), "copying the residual down");
    DEV_TRY(gddr_cuda_sync(st), "sync");
    p->vals = d->h_packed;
    p->nvals = npacked;
    if (nsent == r->nchunks) {
        p->bitmap = NULL;
    } else {
        p->bitmap = d->h_bitmap;
        p->bitmap_len = bmb;
    }
    return gddr__residual_snapshot(c, i, p->bitmap, &p->snap, &p->snap_bm, &p->snap_vals);
}

/* A dense push from the device: the whole gradient comes down. */
static int dev_dense(gddr_client *c, int i, payload *p)
{
    ctensor *t = &c->t[i];
    struct gddr__dtensor *d = t->dev;
    void *st = dev_stream(c);
    DEV_TRY(gddr_cuda_memcpy_d2h(d->h_packed, d->g, t->n * 4, st), "copying the gradient down");
    DEV_TRY(gddr_cuda_sync(st), "sync");
    gddr__orphan_replay(c, i, d->h_packed);
    p->vals = d->h_packed;
    p->nvals = t->n;
    return GDDR_OK;
}

/* After step 5: the pinned pull targets go to the caller's buffers. */
static int dev_params_out(gddr_client *c, float *const *staged, float *const *params)
{
    void *st = dev_stream(c);
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        if (gddr_cuda_is_device_ptr(params[i]))
            DEV_TRY(gddr_cuda_memcpy_h2d(params[i], staged[i], t->n * 4, st), "copying the parameters up");
        else
            memcpy(params[i], staged[i], t->n * 4);
    }
    ctensor *t = &c->t[0];
    DEV_TRY(gddr_cuda_sync(st), "sync");
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

int gddr__residual_age_get(gddr_client *c, int id, uint32_t *out, size_t *nchunks)
{
    if (!c || !out || !nchunks || id < 0 || id >= c->nt)
        return GDDR_EINVAL;
    ctensor *t = &c->t[id];
    size_t nch = gddr_nchunks(t->n, (uint32_t)c->info.chunk);
    *nchunks = nch;
    if (t->dev) {
        void *st = dev_stream(c);
        int rc = gddr_cuda_memcpy_d2h(out, t->dev->d_age, nch * sizeof *out, st);
        return rc == GDDR_OK ? gddr_cuda_sync(st) : rc;
    }
    if (t->res.age)
        memcpy(out, t->res.age, nch * sizeof *out);
    else
        memset(out, 0, nch * sizeof *out);
    return GDDR_OK;
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
    /* The EMA of g^2 starts at 0: correct it as Adam does, or lambda_t is
     * several times too large for the first steps (DC-ASGD-a diverged in
     * some runs before this). */
    c->dc_steps++;
    double corr = 1.0 - pow(c->o.dc_ms_decay, (double)c->dc_steps);
    float ms_scale = corr > 1e-30 ? (float)(1.0 / corr) : 1.0f;
    for (int i = 0; i < c->nt; i++) {
        ctensor *t = &c->t[i];
        gddr_dc_args a = { t->n, (float)c->o.dc_lambda, c->o.dc_mode, c->o.dc_adaptive,
                           (float)c->o.dc_ms_decay, 1e-7f, ms_scale };
        if (c->ptr_kind == 2) {
            int r2 = dev_dc(c, i, &a, w_bak[i]);
            if (r2 != GDDR_OK)
                return r2;
        } else {
            gddr_dc_cpu(&a, t->g, t->wnew, w_bak[i], t->ms);
        }
        base[i] = res[i].version;
    }
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
                             (uint32_t)c->info.rank, t->keyhash, c->step };
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
            if ((rc = gddr__pull_tensor(c, i, params[i], 0, c->step + 1, &ptk[i])) == GDDR_OK)
                gddr__op(c, ptk[i])->track = 1;
    }
    /* One deadline for the pushes and the pipelined pulls together: a
     * server that went silent costs one timeout, not two. */
    int64_t deadline = gddr__now_ms() + c->o.timeout_ms + 1000;
    int rc2 = wait_all(c, tk, res, sent, c->o.timeout_ms + 1000);
    op *pres = res + nt;
    int64_t left = deadline - gddr__now_ms();
    int rc3 = wait_all(c, ptk, pres, npulled, left > 0 ? (int)left : 0);
    if (rc != GDDR_OK || rc2 != GDDR_OK || rc3 != GDDR_OK)
        return rc != GDDR_OK ? rc : rc2 != GDDR_OK ? rc2 : rc3;
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
            rc = gddr__pull_tensor(c, i, params[i], need, c->step + 1, &t1);
            if (rc == GDDR_OK) {
                gddr__op(c, t1)->track = 1;
                rc = gddr__wait_op(c, t1, c->o.timeout_ms + 1000, &pres[i]);
            }
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

/* DC-ASGD runs in async and ssp steps (a sync step has w' == w_bak). */
static int dc_on(const gddr_client *c)
{
    return c->o.dc_lambda > 0 && c->info.mode != GDDR_MODE_SYNC;
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
    const float **gsrc = calloc((size_t)nt, sizeof *gsrc); /* what the step reads */
    uint64_t *base = calloc((size_t)nt, sizeof *base);
    if (dev)
        staged = calloc((size_t)nt, sizeof *staged);
    if (!pl || !res || !tk || !w_bak || !gsrc || !base || (dev && !staged)) {
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
        double nrm;
        if (dev) {
            if ((rc = dev_grad_in(c, i, grads[i], &nrm)) != GDDR_OK)
                goto out;
            staged[i] = t->dev->h_params;
        } else if (c->o.clip_norm > 0 || dc_on(c) || (c->o.delay_fraction <= 0 && t->res.orphan)) {
            /* Clipping, DC-ASGD and an orphan installment change the
             * gradient: they work on the library's copy. */
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
        if (!isfinite(nrm)) {
            rc = gddr__set_err(c, GDDR_ENONFINITE, "step: the gradient of '%s' holds NaN or Inf", t->key);
            goto out;
        }
        pl[i].norm = (float)nrm;
        total += nrm * nrm;
        pl[i].birth = versions ? versions[i] : t->version;
        w_bak[i] = computed_on ? computed_on[i] : gddr__last(t);
        if (!w_bak[i]) {
            rc = gddr__set_err(c, GDDR_ENOMEM, "step: no memory for the last values of '%s'", t->key);
            goto out;
        }
    }
    total = sqrt(total);
    if (c->o.clip_norm > 0 && total > c->o.clip_norm) {
        for (int i = 0; i < nt; i++) {
            if (dev) {
                if ((rc = dev_scal(c, i, (float)(c->o.clip_norm / total))) != GDDR_OK)
                    goto out;
            } else {
                gddr_scal_cpu(c->t[i].g, c->t[i].n, (float)(c->o.clip_norm / total));
            }
        }
    }

    /* 3: DC-ASGD (a sync step has w' == w_bak: nothing to compensate). */
    int dc = dc_on(c);
    for (;;) {
        if (!dc) {
            for (int i = 0; i < nt; i++)
                base[i] = pl[i].birth;
            break;
        }
        rc = dc_pull_and_compensate(c, w_bak, base, res, tk);
        if (rc == GDDR_OK)
            break;
        if (!gddr__needs_reconnect(c, rc) || gddr__now_ms() > give_up || gddr__reconnect(c) != GDDR_OK)
            goto out;
    }

    /* 4: GDDR residuals, or the whole gradient. The step of each push is
     * fixed here, so a resend after a reconnect carries the same one. */
    for (int i = 0; i < nt; i++) {
        pl[i].base = base[i] < pl[i].birth ? pl[i].birth : base[i];
        pl[i].step = gddr__push_step(c, i);
        pl[i].lend = 1; /* sent without a copy; gddr__step_run waits for ZeroMQ */
        if (c->o.delay_fraction > 0) {
            rc = dev ? dev_residual_pack(c, i, &pl[i]) : residual_pack(c, i, gsrc[i], &pl[i]);
            if (rc != GDDR_OK)
                goto out;
        } else {
            /* Dense: an orphan installment simply rides on the gradient. */
            if (dev) {
                if ((rc = dev_dense(c, i, &pl[i])) != GDDR_OK)
                    goto out;
                continue;
            }
            if (gsrc[i] == c->t[i].g)
                gddr__orphan_replay(c, i, c->t[i].g);
            pl[i].vals = gsrc[i];
            pl[i].nvals = c->t[i].n;
        }
    }

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
    if (c && gddr__pipeline_busy(c))
        return GDDR_ESTATE;
    return gddr__step_run(c, grads, computed_on, versions, params);
}

int gddr_step(gddr_client *c, const float *const *grads, float *const *params)
{
    return gddr_step_from(c, grads, NULL, NULL, params);
}
