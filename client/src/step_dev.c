/* step_dev.c -- the device path of gddr_step (step.c has the host path and
 * the order of the steps).
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
 * installment (added on the host to the residual copied down). Holding the
 * smallest chunks waits once more, for every tensor's chunk scores at once,
 * between the two halves of step 4 (the plan ranks them). Pulled
 * parameters land in pinned memory and are copied to the caller's buffers,
 * with one more wait. The host mirror res.r is refreshed only when a
 * residual snapshot is due and on close. Without a plugin no pointer is
 * device memory the library can use (gddr_cuda_is_device_ptr()), and a
 * step given one fails with the loader's reason. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "client_int.h"
#include "dc.h"
#include "fused.h"
#include "residual.h"

/* What one tensor sends this step. */
typedef gddr__push_args payload;

struct gddr__dtensor {
    const float *g;       /* this step's gradient: the caller's device buffer */
    float *d_r;           /* residual, n floats */
    uint32_t *d_rank;     /* per chunk: rank among this step's sent chunks, or GDDR_HELD */
    uint32_t *h_rank;     /* pinned: the host's plan */
    float *d_out;         /* sent chunks packed (GDDR), or the whole gradient (dense) */
    float *h_out;         /* pinned: what crosses to the host and is pushed */
    float *h_params;      /* pinned: pull target before the copy to the caller */
    float *d_wnew, *d_wbak, *d_ms; /* DC-ASGD */
    double *d_score;      /* hold_schedule = smallest: per chunk, sum of (r + g')^2 */
    float *d_gp;          /* ... with clipping or DC-ASGD: g' (clipped, compensated) */
    uint32_t *age_before; /* host: the ages before this step's plan */
    int planned;          /* this step's plan changed the ages */
    int scored;           /* this step's hold scores are queued */
    gddr_fused_args qa;   /* pass 2 as the first half of step 4 left it */
    gddr_fused_bufs qb;
    size_t npacked, nsent;
};

/* The client's device state (c->cuda). */
typedef struct gddr__dclient {
    gddr_cuda_ctx *ctx;
    int cap;              /* tensors the arrays below hold */
    double *d_sumsq;      /* per tensor: sum of squares of the gradient */
    double *d_l1;         /* per tensor: sum |r| after the step */
    float *d_ctl;         /* clip factor, finite flag (fused.h) */
    float *d_ctl1;        /* hold_schedule = smallest: factor 1, the same flag (for g') */
    int ctl1_set;         /* d_ctl1 is queued for this step */
    double *h_stat;       /* pinned: cap sums of squares, then cap L1 sums */
} dclient;

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

void gddr__dev_free(ctensor *t)
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
    gddr_cuda_free(d->d_score);
    gddr_cuda_free(d->d_gp);
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
    gddr_cuda_free(x->d_ctl1);
    gddr_cuda_host_free(x->h_stat);
    x->d_sumsq = x->d_l1 = NULL;
    x->d_ctl = x->d_ctl1 = NULL;
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
        rc = gddr__residual_alloc(c, t);
    if (rc != GDDR_OK)
        return rc;
    struct gddr__dtensor *d = calloc(1, sizeof *d);
    if (!d)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    t->dev = d;
    size_t n = t->n, nch = t->res.nchunks ? t->res.nchunks : 1;
    if (!(d->age_before = malloc(nch * sizeof *d->age_before))) {
        gddr__dev_free(t);
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
        gddr__dev_free(t);
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
int gddr__dev_norms(gddr_client *c, const float *const *grads, payload *pl, float **staged,
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
    if (gddr__dc_on(c) || orphan_due(c)) {
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

/* hold_schedule = smallest: the chunks' scores on the device, queued to
 * come down into res.score (the plan needs them: gddr__dev_payloads waits
 * once for every tensor's). They rank u = r + g', so with clipping or
 * DC-ASGD pass 2 runs first as a dense pass into d_gp, and the residual
 * pass then reads g' from there with factor 1 and no DC (the same floats
 * the host path merges: g' * 1 is g'). */
static int dev_scores(gddr_client *c, int i, gddr_fused_args *a, gddr_fused_bufs *b)
{
    static const float one = 1.0f;
    ctensor *t = &c->t[i];
    struct gddr__dtensor *d = t->dev;
    dclient *x = dcl(c);
    void *st = dev_stream(c);
    size_t nch = t->res.nchunks;
    int rc = gddr__residual_pick_bufs(c, i);
    if (rc != GDDR_OK)
        return rc;
    if (!d->d_score)
        DEV_TRY(gddr_cuda_malloc((void **)&d->d_score, nch * sizeof(double)), t->key, "cudaMalloc");
    if (a->dc || c->o.clip_norm > 0) {
        if (!d->d_gp)
            DEV_TRY(gddr_cuda_malloc((void **)&d->d_gp, t->n * 4), t->key, "cudaMalloc");
        if (!x->d_ctl1)
            DEV_TRY(gddr_cuda_malloc((void **)&x->d_ctl1, 2 * sizeof(float)), t->key, "cudaMalloc");
        gddr_fused_args da = *a;
        gddr_fused_bufs db = *b;
        da.residual = 0;
        db.out = d->d_gp;
        DEV_TRY(gddr_fused_cuda(x->ctx, &da, &db), t->key, "the fused pass (g')");
        if (!x->ctl1_set) { /* once a step: the flag is every tensor's */
            DEV_TRY(gddr_cuda_memcpy_d2d(x->d_ctl1, x->d_ctl, 2 * sizeof(float), st), t->key,
                    "copying the clip flag");
            DEV_TRY(gddr_cuda_memcpy_h2d(x->d_ctl1, &one, sizeof one, st), t->key,
                    "setting factor 1");
            x->ctl1_set = 1;
        }
        a->dc = 0;
        b->g = d->d_gp;
        b->ctl = x->d_ctl1;
    }
    DEV_TRY(gddr_chunk_scores_cuda(b->g, d->d_r, t->n, a->chunk, d->d_score, st), t->key,
            "the hold scores");
    DEV_TRY(gddr_cuda_memcpy_d2h(t->res.score, d->d_score, nch * sizeof(double), st), t->key,
            "copying the hold scores down");
    d->scored = 1;
    return GDDR_OK;
}

/* Step 4 of one tensor, first half, queued: DC-ASGD's inputs, all of a
 * dense push, an orphan installment, the hold scores. What the second half
 * runs is kept in d->qa and d->qb. */
static int dev_queue_inputs(gddr_client *c, int i, const float *w_bak, const gddr_dc_args *dca)
{
    ctensor *t = &c->t[i];
    residual *r = &t->res;
    struct gddr__dtensor *d = t->dev;
    dclient *x = dcl(c);
    void *st = dev_stream(c);
    gddr_fused_args a = { t->n, (uint32_t)c->info.chunk, c->push_dense != 1, dca != NULL,
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
    /* (push_dense 0: this step holds; the hold probability is then > 0 --
     * not computed here, dev_queue_plan does that once) */
    if (c->push_dense == 0 && gddr__holds_smallest(c)) {
        int rc = dev_scores(c, i, &a, &b);
        if (rc != GDDR_OK)
            return rc;
    }
    d->qa = a;
    d->qb = b;
    return GDDR_OK;
}

/* Step 4 of one tensor, second half, queued: the plan (from the scores
 * when the smallest chunks are held), pass 2, the payload down. */
static int dev_queue_plan(gddr_client *c, int i)
{
    ctensor *t = &c->t[i];
    residual *r = &t->res;
    struct gddr__dtensor *d = t->dev;
    dclient *x = dcl(c);
    void *st = dev_stream(c);
    if (c->push_dense == 1)
        return GDDR_OK; /* dense: queued whole by dev_queue_inputs */
    gddr_residual_args ra = gddr__residual_args(c, i);
    if (d->scored) {
        int rc = gddr__residual_pick(c, i, 0, NULL, &ra);
        if (rc != GDDR_OK)
            return rc;
    }
    memcpy(d->age_before, r->age, r->nchunks * sizeof *r->age);
    d->planned = 1;
    int rc = gddr_residual_plan_cpu(&ra, r->age, r->bitmap, d->h_rank, &d->npacked, &d->nsent);
    if (rc != GDDR_OK)
        return gddr__set_err(c, rc, "residual step of '%s' failed", t->key);
    gddr_fused_bufs b = d->qb;
    b.r = d->d_r;
    b.rank = d->d_rank;
    b.out = d->d_out;
    b.l1 = &x->d_l1[i];
    DEV_TRY(gddr_cuda_memcpy_h2d(d->d_rank, d->h_rank, r->nchunks * sizeof(uint32_t), st), t->key,
            "copying the plan up");
    DEV_TRY(gddr_fused_cuda(x->ctx, &d->qa, &b), t->key, "the fused pass");
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

/* Both halves for every tensor: the first halves, then (when some tensor's
 * hold scores are queued) one wait and the norms' check -- a non-finite
 * gradient never reaches a pick -- then the second halves. */
static int dev_queue_all(gddr_client *c, payload *pl, const float *const *w_bak,
                         const gddr_dc_args *dca, int *checked)
{
    int scored = 0;
    dcl(c)->ctl1_set = 0;
    for (int i = 0; i < c->nt; i++) {
        c->t[i].dev->planned = c->t[i].dev->scored = 0;
        gddr_dc_args a;
        if (dca) {
            a = *dca;
            a.n = c->t[i].n;
        }
        int rc = dev_queue_inputs(c, i, w_bak[i], dca ? &a : NULL);
        if (rc != GDDR_OK)
            return rc;
        scored |= c->t[i].dev->scored;
    }
    if (scored) {
        DEV_TRY(gddr_cuda_sync(dev_stream(c)), c->t[0].key, "sync");
        if (!*checked) {
            int rc = dev_check_norms(c, pl);
            if (rc != GDDR_OK)
                return rc;
            *checked = 1;
        }
    }
    for (int i = 0; i < c->nt; i++) {
        int rc = dev_queue_plan(c, i);
        if (rc != GDDR_OK)
            return rc;
    }
    return GDDR_OK;
}

/* Steps 3 (compensation) and 4 on the device for every tensor, one wait,
 * then the payloads. dca: DC-ASGD arguments, or NULL. */
int gddr__dev_payloads(gddr_client *c, payload *pl, const float *const *w_bak,
                       const gddr_dc_args *dca, int checked)
{
    int rc = dev_queue_all(c, pl, w_bak, dca, &checked);
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
        if (c->push_dense == 1) {
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
int gddr__dev_params_out(gddr_client *c, float *const *staged, float *const *params)
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
