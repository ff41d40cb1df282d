/* server.c -- the gddr-ps front end: one ROUTER socket, one thread.
 *
 * Every request is checked field by field before anything changes (DESIGN
 * section 8): a bad request gets an error reply with a gddr_err code, bumps
 * a counter, and leaves tensors, versions and worker state untouched. Then
 * it is served: registrations and pulls are answered at once, pushes are
 * applied (async, ssp) or collected into the current sync step, and pulls
 * that must wait (sync min_version, ssp bound) are parked with a deadline
 * and answered when their condition holds or their time is up.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "blas.h"
#include "log.h"
#include "ps.h"
#include "snapshot.h"

/* ---- replies ------------------------------------------------------------- */

static void reply_init(gddr_ps *ps, Gddr__Reply *r, uint64_t req_id, const ps_tensor *t)
{
    gddr__reply__init(r);
    r->protocol = GDDR__CONST__PROTOCOL_VERSION;
    r->req_id = req_id;
    r->epoch = ps->epoch;
    r->tau = t ? (uint32_t)t->tau : (uint32_t)ps->cfg.tau_init;
}

static void send_reply(gddr_ps *ps, zmq_msg_t *ident, Gddr__Reply *r, const gddr__raw *raws,
                       int nraw)
{
    long n = gddr__send(ps->router, ident, &r->base, raws, nraw);
    if (n > 0)
        ps->bytes_out += (uint64_t)n;
}

/* Counts a rejection and answers it. */
static int reject(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int reject(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ps->rejected[code < PS_NERR ? code : 0]++;
    gddr_log(GDDR_LOG_DEBUG, "rejected request %llu: %s: %s", (unsigned long long)req_id,
             gddr_strerror(code), msg);
    Gddr__Reply r;
    Gddr__Error e = GDDR__ERROR__INIT;
    reply_init(ps, &r, req_id, NULL);
    e.code = (uint32_t)code;
    e.message = msg;
    r.body_case = GDDR__REPLY__BODY_ERROR;
    r.error = &e;
    if (ident)
        send_reply(ps, ident, &r, NULL, 0);
    return code;
}

/* ---- workers ------------------------------------------------------------- */

int gddr_ps_expected_workers(const gddr_ps *ps)
{
    int n = ps->cfg.workers ? (int)ps->cfg.workers : ps->announced_world;
    return n < 1 ? 1 : n;
}

/* A rank counts as live when it is alive, or when it was never seen but the
 * run is young: a sync step must not complete with one worker just because
 * the others are still loading their data. */
static int rank_live(gddr_ps *ps, int r, int64_t now)
{
    ps_worker *w = &ps->workers[r];
    if (w->known)
        return w->alive;
    int64_t since = ps->first_hello_ms ? ps->first_hello_ms : now;
    return now - since < (int64_t)(ps->cfg.worker_timeout_s * 1000);
}

int gddr_ps_live_workers(gddr_ps *ps)
{
    int64_t now = gddr__now_ms();
    int exp = gddr_ps_expected_workers(ps), live = 0;
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if ((r < exp && rank_live(ps, r, now)) || (r >= exp && ps->workers[r].alive))
            live++;
    return live;
}

/* The slowest live worker's clock (steps pushed), for ssp. */
static uint64_t min_live_clock(gddr_ps *ps)
{
    uint64_t m = UINT64_MAX;
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].known && ps->workers[r].alive && ps->workers[r].clock < m)
            m = ps->workers[r].clock;
    return m;
}

static void touch_worker(gddr_ps *ps, uint32_t rank)
{
    ps_worker *w = &ps->workers[rank];
    int64_t now = gddr__now_ms();
    if (!w->known) {
        w->known = 1;
        w->alive = 1;
        if (!ps->first_hello_ms)
            ps->first_hello_ms = now;
        gddr_log(GDDR_LOG_INFO, "worker %u joined", rank);
    } else if (!w->alive) {
        w->alive = 1;
        ps->rejoins++;
        gddr_log(GDDR_LOG_INFO, "worker %u rejoined", rank);
        gddr_ps_snapshot_rejoined(ps, rank);
    }
    w->last_seen_ms = now;
}

/* ---- tensors -------------------------------------------------------------- */

static ps_tensor *tensor_by_id(gddr_ps *ps, uint32_t id)
{
    return id < ps->ntensors ? ps->tensors[id] : NULL;
}

ps_tensor *gddr_ps_tensor_create(gddr_ps *ps, const char *key, size_t n)
{
    ps_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    snprintf(t->key, sizeof t->key, "%s", key);
    t->n = n;
    t->chunk = (uint32_t)ps->cfg.chunk;
    t->nchunks = (n + t->chunk - 1) / t->chunk;
    t->w = malloc(n * sizeof(float));
    t->acc = calloc(n, sizeof(float));
    t->touched = calloc(t->nchunks, 1);
    t->contrib = calloc((size_t)ps->cfg.max_workers, 1);
    t->tau = (int)ps->cfg.tau_init;
    if (!t->w || !t->acc || !t->touched || !t->contrib) {
        free(t->w), free(t->acc), free(t->touched), free(t->contrib), free(t);
        return NULL;
    }
    ps_tensor **arr = realloc(ps->tensors, (ps->ntensors + 1) * sizeof *arr);
    if (!arr) {
        free(t->w), free(t->acc), free(t->touched), free(t->contrib), free(t);
        return NULL;
    }
    ps->tensors = arr;
    t->id = (uint32_t)ps->ntensors;
    ps->tensors[ps->ntensors++] = t;
    return t;
}

static void tensor_free(ps_tensor *t)
{
    free(t->w);
    free(t->mom);
    free(t->acc);
    free(t->touched);
    free(t->contrib);
    free(t);
}

/* Hybrid: a sync server runs async until the tensor reaches the warm-up. */
static int tensor_mode(gddr_ps *ps, const ps_tensor *t)
{
    if (ps->cfg.mode == GDDR_PS_MODE_SYNC && t->version < (uint64_t)ps->cfg.async_warmup_steps)
        return GDDR_PS_MODE_ASYNC;
    return ps->cfg.mode;
}

int ps_all_finite(const float *v, size_t n)
{
    /* isfinite on every element vectorises poorly; summing v*0 is NaN iff
     * some element is NaN or Inf, and runs at memory speed. */
    float acc = 0.0f;
    for (size_t i = 0; i < n; i++)
        acc += v[i] * 0.0f;
    return acc == 0.0f;
}

/* ---- pulls ---------------------------------------------------------------- */

static void send_values(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, ps_tensor *t)
{
    size_t bytes = t->n * sizeof(float);
    float *copy = malloc(bytes ? bytes : 1);
    if (!copy) {
        reject(ps, ident, req_id, GDDR_ENOMEM, "no memory for a %zu-byte reply", bytes);
        return;
    }
    memcpy(copy, t->w, bytes);
    Gddr__Reply r;
    Gddr__PullReply pr = GDDR__PULL_REPLY__INIT;
    reply_init(ps, &r, req_id, t);
    pr.id = t->id;
    pr.version = t->version;
    pr.payload_bytes = bytes;
    r.body_case = GDDR__REPLY__BODY_PULL;
    r.pull = &pr;
    gddr__raw raw = { copy, bytes, gddr__zfree, NULL };
    send_reply(ps, ident, &r, &raw, 1);
    ps->pulls_served++;
}

/* Whether a pull can be answered now. */
static int pull_ready(gddr_ps *ps, ps_tensor *t, uint64_t min_version, uint64_t step)
{
    if (t->version < min_version)
        return 0;
    if (ps->cfg.mode == GDDR_PS_MODE_SSP) {
        uint64_t slow = min_live_clock(ps);
        if (slow != UINT64_MAX && step > slow + (uint64_t)ps->cfg.staleness_bound)
            return 0;
    }
    return 1;
}

static void park_pull(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, uint32_t rank,
                      ps_tensor *t, uint64_t min_version, uint64_t step, uint32_t wait_ms)
{
    if (ps->npulls == ps->cap_pulls) {
        size_t cap = ps->cap_pulls ? ps->cap_pulls * 2 : 64;
        ps_pull *p = realloc(ps->pulls, cap * sizeof *p);
        if (!p) {
            reject(ps, ident, req_id, GDDR_ENOMEM, "no memory to park a pull");
            return;
        }
        ps->pulls = p;
        ps->cap_pulls = cap;
    }
    uint64_t wait = wait_ms;
    if (wait > (uint64_t)ps->cfg.pull_wait_max_ms)
        wait = (uint64_t)ps->cfg.pull_wait_max_ms;
    ps_pull *p = &ps->pulls[ps->npulls++];
    zmq_msg_init(&p->ident);
    zmq_msg_copy(&p->ident, ident);
    p->req_id = req_id;
    p->rank = rank;
    p->id = t->id;
    p->min_version = min_version;
    p->step = step;
    p->deadline_ms = gddr__now_ms() + (int64_t)wait;
}

/* Answers every parked pull whose condition now holds or whose time is up. */
static void release_pulls(gddr_ps *ps)
{
    int64_t now = gddr__now_ms();
    size_t keep = 0;
    for (size_t i = 0; i < ps->npulls; i++) {
        ps_pull *p = &ps->pulls[i];
        ps_tensor *t = tensor_by_id(ps, p->id);
        if (t && pull_ready(ps, t, p->min_version, p->step)) {
            send_values(ps, &p->ident, p->req_id, t);
        } else if (!t || now >= p->deadline_ms || ps->stop) {
            if (ps->stop)
                reject(ps, &p->ident, p->req_id, GDDR_ESHUTDOWN, "server is shutting down");
            else
                reject(ps, &p->ident, p->req_id, GDDR_ETIMEDOUT,
                       "pull of tensor %u waited too long for version %llu (now %llu)%s", p->id,
                       (unsigned long long)p->min_version,
                       (unsigned long long)(t ? t->version : 0),
                       ps->cfg.mode == GDDR_PS_MODE_SSP ? " or for the slowest worker" : "");
        } else {
            if (keep != i)
                ps->pulls[keep] = ps->pulls[i];
            keep++;
            continue;
        }
        zmq_msg_close(&p->ident);
    }
    ps->npulls = keep;
}

/* ---- sync steps ----------------------------------------------------------- */

/* Applies the step being collected when enough workers pushed. The divisor
 * is the number of live workers, so a step is the mean over the workers,
 * and a late push folded into a later step counts with the same weight:
 * over a run, N * (sum of applied updates) = lr * (sum of pushed grads). */
static int sync_try_complete(gddr_ps *ps, ps_tensor *t, int force)
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
    if (ps->cfg.momentum > 0 && !t->mom)
        t->mom = calloc(t->n, sizeof(float));
    /* When workers left with their last pushes still in the step (a final
     * residual flush), divide by those who took part, not by who is left. */
    int divisor = (int)t->ncontrib > live ? (int)t->ncontrib : live;
    ps_job job = { PS_JOB_SYNC, t, NULL, NULL, 1.0f / (float)divisor, (float)ps->cfg.momentum };
    ps_pool_run(ps->pool, &job);
    t->version++;
    ps->versions_total++;
    memset(t->contrib, 0, (size_t)ps->cfg.max_workers);
    t->ncontrib = 0;
    t->npushes = 0;
    return 1;
}

/* ---- requests ------------------------------------------------------------- */

static void worker_left(gddr_ps *ps, uint32_t rank);

static int on_hello(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq)
{
    const Gddr__Hello *h = rq->hello;
    if (h->world_size > (uint32_t)ps->cfg.max_workers) {
        return reject(ps, ident, rq->req_id, GDDR_EWORKER, "world_size %u is above max_workers %lld",
               h->world_size, ps->cfg.max_workers);
    }
    if (!rq->observer && (int)h->world_size > ps->announced_world)
        ps->announced_world = (int)h->world_size;
    gddr_log(GDDR_LOG_INFO, "hello from rank %u (world %u, %s)", rq->rank, h->world_size,
             h->client ? h->client : "?");
    Gddr__Reply r;
    Gddr__HelloReply hr = GDDR__HELLO_REPLY__INIT;
    reply_init(ps, &r, rq->req_id, NULL);
    hr.mode = (Gddr__Mode)ps->cfg.mode;
    if (ps->cfg.mode == GDDR_PS_MODE_SYNC && ps->cfg.async_warmup_steps > 0) {
        /* Hybrid: the phase of the first tensor (all advance together). */
        if (ps->ntensors == 0 || ps->tensors[0]->version < (uint64_t)ps->cfg.async_warmup_steps)
            hr.mode = GDDR__MODE__MODE_ASYNC;
    }
    hr.chunk = (uint32_t)ps->cfg.chunk;
    hr.workers = (uint32_t)gddr_ps_expected_workers(ps);
    hr.tau = (uint32_t)ps->cfg.tau_init;
    hr.max_message_bytes = (uint64_t)ps->cfg.max_message_bytes;
    hr.async_warmup_steps = (uint32_t)ps->cfg.async_warmup_steps;
    r.body_case = GDDR__REPLY__BODY_HELLO;
    r.hello = &hr;
    send_reply(ps, ident, &r, NULL, 0);
    return GDDR_OK;
}

static int valid_key(const char *k)
{
    size_t n = k ? strlen(k) : 0;
    if (n == 0 || n >= 128)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (k[i] <= ' ' || k[i] > '~')
            return 0;
    return 1;
}

static int on_init(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f)
{
    const Gddr__InitTensor *in = rq->init;
    if (!valid_key(in->key)) {
        return reject(ps, ident, rq->req_id, GDDR_EINVAL,
               "tensor key must be 1-127 printable characters without spaces");
    }
    if (in->n == 0 || in->n > (uint64_t)ps->cfg.max_message_bytes / 4) {
        return reject(ps, ident, rq->req_id, GDDR_ELENGTH, "tensor '%s': length %llu is out of range",
               in->key, (unsigned long long)in->n);
    }
    if (in->payload_bytes != in->n * 4 || f->n != 3 || gddr__frame_size(f, 2) != in->payload_bytes) {
        return reject(ps, ident, rq->req_id, GDDR_ELENGTH,
               "tensor '%s': header says %llu values (%llu bytes) but the frame holds %zu bytes",
               in->key, (unsigned long long)in->n, (unsigned long long)in->payload_bytes,
               f->n == 3 ? gddr__frame_size(f, 2) : 0);
    }
    const float *vals = gddr__frame_data(f, 2);
    ps_tensor *t = NULL;
    for (size_t i = 0; i < ps->ntensors; i++)
        if (strcmp(ps->tensors[i]->key, in->key) == 0)
            t = ps->tensors[i];
    int created = 0;
    if (t) {
        if (t->n != in->n) {
            return reject(ps, ident, rq->req_id, GDDR_ELENGTH,
                   "tensor '%s' exists with length %zu, not %llu", in->key, t->n,
                   (unsigned long long)in->n);
        }
    } else {
        if (ps->ntensors >= (size_t)ps->cfg.max_tensors) {
            return reject(ps, ident, rq->req_id, GDDR_EINVAL, "server holds max_tensors = %lld already",
                   ps->cfg.max_tensors);
        }
        if (!ps_all_finite(vals, in->n)) {
            return reject(ps, ident, rq->req_id, GDDR_ENONFINITE, "tensor '%s': initial values hold NaN or Inf",
                   in->key);
        }
        t = gddr_ps_tensor_create(ps, in->key, in->n);
        if (!t) {
            return reject(ps, ident, rq->req_id, GDDR_ENOMEM, "no memory for tensor '%s'", in->key);
        }
        memcpy(t->w, vals, in->n * sizeof(float));
        created = 1;
        ps->inits++;
        gddr_log(GDDR_LOG_INFO, "tensor '%s' registered: id %u, %zu values, %zu chunks", t->key,
                 t->id, t->n, t->nchunks);
    }
    Gddr__Reply r;
    Gddr__InitReply ir = GDDR__INIT_REPLY__INIT;
    reply_init(ps, &r, rq->req_id, t);
    ir.id = t->id;
    ir.version = t->version;
    ir.n = t->n;
    ir.created = created;
    r.body_case = GDDR__REPLY__BODY_INIT;
    r.init = &ir;
    send_reply(ps, ident, &r, NULL, 0);
    return GDDR_OK;
}

static int on_pull(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq)
{
    const Gddr__Pull *p = rq->pull;
    ps_tensor *t = tensor_by_id(ps, p->id);
    if (!t) {
        return reject(ps, ident, rq->req_id, GDDR_ENOKEY, "no tensor with id %u (%zu registered)", p->id,
               ps->ntensors);
    }
    if (pull_ready(ps, t, p->min_version, p->step)) {
        send_values(ps, ident, rq->req_id, t);
        return GDDR_OK;
    }
    /* A sync step or the ssp bound will release it. A min_version far ahead
     * of anything a step can produce is a client bug, not a wait. */
    if (p->min_version > t->version + 1 + (uint64_t)gddr_ps_expected_workers(ps)) {
        return reject(ps, ident, rq->req_id, GDDR_EVERSION,
               "pull asks for version %llu of tensor '%s', which is at %llu",
               (unsigned long long)p->min_version, t->key, (unsigned long long)t->version);
    }
    park_pull(ps, ident, rq->req_id, rq->rank, t, p->min_version, p->step, p->wait_ms);
    return GDDR_OK;
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
        for (size_t c = 0; c < t->nchunks; c++)
            off[c] = (int64_t)(c * t->chunk);
        *nfloats = t->n;
        return GDDR_OK;
    }
    size_t need = (t->nchunks + 7) / 8;
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
    for (size_t c = 0; c < t->nchunks; c++) {
        if (bm->data[c / 8] >> (c % 8) & 1) {
            off[c] = (int64_t)o;
            size_t lo = c * t->chunk;
            o += (lo + t->chunk <= t->n ? t->chunk : t->n - lo);
        } else {
            off[c] = -1;
        }
    }
    if (o * 4 != payload_bytes) {
        snprintf(msg, mlen, "bitmap selects %zu values but the payload holds %llu bytes", o,
                 (unsigned long long)payload_bytes);
        return GDDR_EBITMAP;
    }
    *nfloats = o;
    return GDDR_OK;
}

static int on_push(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f)
{
    const Gddr__Push *p = rq->push;
    uint64_t id = rq->req_id;
    ps_tensor *t = tensor_by_id(ps, p->id);
    if (!t) {
        return reject(ps, ident, id, GDDR_ENOKEY, "no tensor with id %u (%zu registered)", p->id,
               ps->ntensors);
    }
    int want_frames = 3 + (p->residual_snapshot ? 1 : 0);
    if (f->n != want_frames) {
        return reject(ps, ident, id, GDDR_EPROTO, "push carries %d frames, expected %d", f->n - 1,
               want_frames - 1);
    }
    char msg[256];
    /* Per-chunk payload offsets, in a buffer kept across pushes: no
     * allocation on the hot path once the largest tensor has been seen. */
    if (ps->offcap < t->nchunks) {
        int64_t *nb = realloc(ps->offbuf, t->nchunks * sizeof *nb);
        if (nb) {
            ps->offbuf = nb;
            ps->offcap = t->nchunks;
        }
    }
    int64_t *off = ps->offcap >= t->nchunks ? ps->offbuf : NULL;
    if (!off) {
        return reject(ps, ident, id, GDDR_ENOMEM, "no memory");
    }
    size_t nfloats = 0;
    int rc = check_layout(t, &p->bitmap, p->payload_bytes, gddr__frame_size(f, 2), off, &nfloats,
                          msg, sizeof msg);
    if (rc != GDDR_OK) {
        return reject(ps, ident, id, rc, "push to tensor '%s': %s", t->key, msg);
    }
    if (p->base_version > t->version || p->birth_version > p->base_version) {
        return reject(ps, ident, id, GDDR_EVERSION,
               "push to tensor '%s' at version %llu claims birth %llu, base %llu", t->key,
               (unsigned long long)t->version, (unsigned long long)p->birth_version,
               (unsigned long long)p->base_version);
    }
    const float *vals = gddr__frame_data(f, 2);
    if (!ps_all_finite(vals, nfloats) || !isfinite(p->grad_norm) || p->grad_norm < 0) {
        return reject(ps, ident, id, GDDR_ENONFINITE, "push to tensor '%s' holds NaN or Inf", t->key);
    }
    if (ps->cfg.max_grad_norm > 0) {
        double measured = gddr_nrm2_cpu(vals, nfloats);
        /* The guard judges what would be applied. The reported norm is the
         * fresh gradient's, before any client-side clipping (it feeds the
         * tau controller), so it must not veto a clipped push. */
        if (measured > ps->cfg.max_grad_norm) {
                return reject(ps, ident, id, GDDR_EGRADNORM,
                   "push to tensor '%s': gradient norm %.6g (reported %.6g) exceeds max_grad_norm %g",
                   t->key, measured, (double)p->grad_norm, ps->cfg.max_grad_norm);
        }
    }
    if (p->residual_snapshot) {
        rc = gddr_ps_snapshot_check(ps, t, p, f, msg, sizeof msg);
        if (rc != GDDR_OK) {
                return reject(ps, ident, id, rc, "push to tensor '%s': residual snapshot: %s", t->key, msg);
        }
    }

    /* Accepted: from here on, state changes. */
    ps_worker *w = &ps->workers[rq->rank];
    uint64_t tau = t->version - p->base_version;
    double lr_eff = ps->cfg.lr / (1.0 + ps->cfg.adadelay * (double)tau);
    int mode = tensor_mode(ps, t);
    if (ps->cfg.momentum > 0 && !t->mom)
        t->mom = calloc(t->n, sizeof(float));
    Gddr__Reply r;
    Gddr__PushReply pr = GDDR__PUSH_REPLY__INIT;
    if (mode == GDDR_PS_MODE_SYNC) {
        ps_job job = { PS_JOB_ACC, t, vals, p->bitmap.len ? off : NULL, (float)lr_eff, 0 };
        ps_pool_run(ps->pool, &job);
        if (!t->contrib[rq->rank]) {
            t->contrib[rq->rank] = 1;
            t->ncontrib++;
        }
        t->npushes++;
        pr.sync_target = t->version + 1;
        pr.applied = sync_try_complete(ps, t, 0);
    } else {
        ps_job job = { PS_JOB_APPLY, t, vals, p->bitmap.len ? off : NULL, (float)lr_eff,
                       (float)ps->cfg.momentum };
        ps_pool_run(ps->pool, &job);
        t->version++;
        ps->versions_total++;
        pr.applied = 1;
    }
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
    if (ps_tau_update(&ps->cfg, t, p->grad_norm))
        gddr_log(GDDR_LOG_DEBUG, "tensor '%s': tau now %d (norm EMA %.4g, change rate %.3f)",
                 t->key, t->tau, t->norm_ema, t->rate_ema);
    gddr_ps_snapshot_after_push(ps, t, rq->rank, p, f);

    reply_init(ps, &r, id, t);
    pr.id = t->id;
    pr.version = t->version;
    pr.staleness = tau;
    pr.mode = (Gddr__Mode)tensor_mode(ps, t);
    r.body_case = GDDR__REPLY__BODY_PUSH;
    r.push = &pr;
    send_reply(ps, ident, &r, NULL, 0);
    gddr_ps_snapshot_offer_orphans(ps, ident, rq->rank);
    release_pulls(ps);
    return GDDR_OK;
}

static void on_stats(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq)
{
    Gddr__Reply r;
    Gddr__StatsReply sr = GDDR__STATS_REPLY__INIT;
    reply_init(ps, &r, rq->req_id, ps->ntensors ? ps->tensors[0] : NULL);
    sr.pushes = ps->pushes;
    sr.pulls = ps->pulls_served;
    for (int i = 0; i < PS_NERR; i++)
        sr.rejected += ps->rejected[i];
    sr.versions_total = ps->versions_total;
    sr.staleness_mean = ps_stale_mean(&ps->stale);
    sr.staleness_ema = ps->stale.ema;
    sr.staleness_max = ps->stale.max;
    sr.n_staleness_hist = PS_HIST;
    sr.staleness_hist = ps->stale.hist;
    ps_worker *w = &ps->workers[rq->rank];
    sr.worker_staleness_mean = ps_stale_mean(&w->stale);
    sr.worker_pushes = w->pushes;
    sr.live_workers = (uint32_t)gddr_ps_live_workers(ps);
    char *text = NULL;
    if (rq->stats->prometheus)
        sr.prometheus = text = ps_metrics_text(ps);
    r.body_case = GDDR__REPLY__BODY_STATS;
    r.stats = &sr;
    send_reply(ps, ident, &r, NULL, 0);
    free(text);
}

static void send_ack(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, const char *text)
{
    Gddr__Reply r;
    Gddr__Ack a = GDDR__ACK__INIT;
    reply_init(ps, &r, req_id, NULL);
    a.text = (char *)text;
    r.body_case = GDDR__REPLY__BODY_ACK;
    r.ack = &a;
    send_reply(ps, ident, &r, NULL, 0);
}

static void handle_message(gddr_ps *ps, gddr__frames *f)
{
    ps->bytes_in += f->bytes;
    if (f->n < 2 || f->truncated) {
        /* Too few or too many frames. With an identity we can still say so. */
        if (f->n >= 1)
            reject(ps, &f->part[0], 0, GDDR_EPROTO, "message with %d frames", f->n);
        else
            ps->rejected[GDDR_EPROTO]++;
        return;
    }
    zmq_msg_t *ident = &f->part[0];
    Gddr__Request *rq =
        gddr__request__unpack(NULL, gddr__frame_size(f, 1), gddr__frame_data(f, 1));
    if (!rq) {
        reject(ps, ident, 0, GDDR_EPROTO, "header is not a valid gddr.Request");
        return;
    }
    if (rq->protocol != GDDR__CONST__PROTOCOL_VERSION) {
        reject(ps, ident, rq->req_id, GDDR_EPROTO, "protocol %u, this server speaks %d",
               rq->protocol, GDDR__CONST__PROTOCOL_VERSION);
    } else if (rq->rank >= (uint32_t)ps->cfg.max_workers) {
        reject(ps, ident, rq->req_id, GDDR_EWORKER, "rank %u is not below max_workers %lld",
               rq->rank, ps->cfg.max_workers);
    } else {
        int needs_values = rq->body_case == GDDR__REQUEST__BODY_INIT;
        if (!needs_values && rq->body_case != GDDR__REQUEST__BODY_PUSH && f->n != 2) {
            reject(ps, ident, rq->req_id, GDDR_EPROTO, "unexpected %d value frames", f->n - 2);
        } else {
            /* A worker becomes known by a hello or an accepted request; a
             * rejected one from a stranger changes nothing (section 8). Any
             * message from a known worker counts as a heartbeat. */
            ps_worker *w = &ps->workers[rq->rank];
            if (!rq->observer && (rq->body_case == GDDR__REQUEST__BODY_HELLO || w->known))
                touch_worker(ps, rq->rank);
            int rc = GDDR_OK;
            switch (rq->body_case) {
            case GDDR__REQUEST__BODY_HELLO: rc = on_hello(ps, ident, rq); break;
            case GDDR__REQUEST__BODY_INIT: rc = on_init(ps, ident, rq, f); break;
            case GDDR__REQUEST__BODY_PULL: rc = on_pull(ps, ident, rq); break;
            case GDDR__REQUEST__BODY_PUSH: rc = on_push(ps, ident, rq, f); break;
            case GDDR__REQUEST__BODY_STATS: on_stats(ps, ident, rq); break;
            case GDDR__REQUEST__BODY_HEARTBEAT: send_ack(ps, ident, rq->req_id, "alive"); break;
            case GDDR__REQUEST__BODY_CHECKPOINT:
                ps->ckpt_now = 1;
                send_ack(ps, ident, rq->req_id, "checkpoint requested");
                break;
            case GDDR__REQUEST__BODY_BYE:
                if (!rq->observer)
                    worker_left(ps, rq->rank);
                send_ack(ps, ident, rq->req_id, "bye");
                break;
            default:
                rc = reject(ps, ident, rq->req_id, GDDR_EPROTO, "request without a body");
            }
            if (!rq->observer && !w->known && rc == GDDR_OK &&
                rq->body_case != GDDR__REQUEST__BODY_BYE &&
                rq->body_case != GDDR__REQUEST__BODY_HEARTBEAT)
                touch_worker(ps, rq->rank);
        }
    }
    gddr__request__free_unpacked(rq, NULL);
}

/* Re-checks what a change of membership may unblock: open sync steps and
 * parked pulls (ssp waits on the slowest live worker). */
static void membership_changed(gddr_ps *ps)
{
    for (size_t i = 0; i < ps->ntensors; i++)
        if (tensor_mode(ps, ps->tensors[i]) == GDDR_PS_MODE_SYNC)
            sync_try_complete(ps, ps->tensors[i], 0);
    release_pulls(ps);
}

/* A worker that said bye is gone at once; its residual snapshot becomes an
 * orphan just as if it had died. */
static void worker_left(gddr_ps *ps, uint32_t rank)
{
    ps_worker *w = &ps->workers[rank];
    if (!w->known || !w->alive)
        return;
    w->alive = 0;
    gddr_log(GDDR_LOG_INFO, "worker %u left after %llu pushes", rank, (unsigned long long)w->pushes);
    gddr_ps_snapshot_worker_died(ps, (int)rank);
    membership_changed(ps);
}

/* ---- timers ---------------------------------------------------------------- */

static void check_workers(gddr_ps *ps)
{
    int64_t now = gddr__now_ms();
    int64_t limit = (int64_t)(ps->cfg.worker_timeout_s * 1000);
    int changed = 0;
    for (int r = 0; r < ps->cfg.max_workers; r++) {
        ps_worker *w = &ps->workers[r];
        if (w->known && w->alive && now - w->last_seen_ms > limit) {
            w->alive = 0;
            ps->deaths++;
            changed = 1;
            gddr_log(GDDR_LOG_WARN, "worker %d declared dead: silent for %.1f s", r,
                     (double)(now - w->last_seen_ms) / 1000.0);
            gddr_ps_snapshot_worker_died(ps, r);
        }
    }
    /* A death (or a never-arrived worker timing out) may complete a sync
     * step or free an ssp wait. */
    if (changed || ps->npulls)
        membership_changed(ps);
}

static int next_timeout(gddr_ps *ps)
{
    int64_t now = gddr__now_ms(), t = 250;
    for (size_t i = 0; i < ps->npulls; i++) {
        int64_t d = ps->pulls[i].deadline_ms - now;
        if (d < t)
            t = d < 0 ? 0 : d;
    }
    return (int)t;
}

/* ---- life cycle ------------------------------------------------------------ */

static uint64_t make_epoch(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* Nanosecond time mixed with the pid: two restarts in one clock tick
     * still differ. */
    return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 48);
}

int gddr_ps_open(gddr_ps **out, const gddr_ps_config *cfg, const char *cfg_path, char *err,
                 size_t errlen)
{
    gddr_ps *ps = calloc(1, sizeof *ps);
    if (!ps) {
        snprintf(err, errlen, "out of memory");
        return GDDR_ENOMEM;
    }
    ps->cfg = *cfg;
    snprintf(ps->cfg_path, sizeof ps->cfg_path, "%s", cfg_path ? cfg_path : "");
    ps->epoch = make_epoch();
    ps->start_ms = gddr__now_ms();
    ps->workers = calloc((size_t)cfg->max_workers, sizeof *ps->workers);
    if (!ps->workers || ps_pool_start(&ps->pool, (int)cfg->threads) != GDDR_OK) {
        snprintf(err, errlen, "out of memory");
        gddr_ps_close(&ps);
        return GDDR_ENOMEM;
    }
    ps->zctx = zmq_ctx_new();
    ps->router = zmq_socket(ps->zctx, ZMQ_ROUTER);
    int64_t maxmsg = cfg->max_message_bytes;
    int zero = 0, hwm = 10000;
    zmq_setsockopt(ps->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(ps->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(ps->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(ps->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    int arc = gddr_ps_auth_setup(ps, err, errlen);
    if (arc != GDDR_OK) {
        gddr_ps_close(&ps);
        return arc;
    }
    if (zmq_bind(ps->router, cfg->listen) != 0) {
        snprintf(err, errlen, "cannot bind %s: %s", cfg->listen, zmq_strerror(errno));
        gddr_ps_close(&ps);
        return GDDR_EIO;
    }
    size_t len = sizeof ps->endpoint;
    zmq_getsockopt(ps->router, ZMQ_LAST_ENDPOINT, ps->endpoint, &len);
    int rc = gddr_ps_metrics_open(ps, err, errlen);
    if (rc == GDDR_OK)
        rc = gddr_ps_snapshot_restore(ps, err, errlen);
    if (rc != GDDR_OK) {
        gddr_ps_close(&ps);
        return rc;
    }
    *out = ps;
    return GDDR_OK;
}

int gddr_ps_run(gddr_ps *ps, void (*ready)(gddr_ps *))
{
    gddr_log(GDDR_LOG_INFO, "listening on %s (mode %s, %lld apply threads, epoch %016llx)",
             ps->endpoint, ps->cfg.mode == 0 ? "async" : ps->cfg.mode == 1 ? "sync" : "ssp",
             ps->cfg.threads, (unsigned long long)ps->epoch);
    if (ready)
        ready(ps);
    int64_t last_check = gddr__now_ms();
    while (!ps->stop) {
        zmq_pollitem_t items[3] = { { ps->router, 0, ZMQ_POLLIN, 0 } };
        int nitems = 1;
        if (ps->zap)
            items[nitems++] = (zmq_pollitem_t){ ps->zap, 0, ZMQ_POLLIN, 0 };
        if (ps->metrics)
            items[nitems++] = (zmq_pollitem_t){ ps->metrics, 0, ZMQ_POLLIN, 0 };
        int rc = zmq_poll(items, nitems, next_timeout(ps));
        if (rc < 0 && errno != EINTR)
            break;
        /* Drain what is waiting, but not forever: timers must run too. */
        for (int i = 0; i < 1000 && !ps->stop; i++) {
            gddr__frames f;
            if (gddr__frames_recv(ps->router, &f, ZMQ_DONTWAIT) < 0)
                break;
            handle_message(ps, &f);
            gddr__frames_close(&f);
        }
        if (ps->zap)
            gddr_ps_auth_poll(ps);
        if (ps->metrics)
            gddr_ps_metrics_poll(ps);
        int64_t now = gddr__now_ms();
        if (now - last_check >= 200) {
            check_workers(ps);
            last_check = now;
        }
        if (ps->npulls)
            release_pulls(ps);
        if (ps->reload) {
            ps->reload = 0;
            gddr_ps_reload(ps);
        }
        gddr_ps_checkpoint_tick(ps, 0);
        if (ps->tick)
            ps->tick(ps);
    }
    release_pulls(ps); /* answers parked pulls with ESHUTDOWN */
    gddr_ps_checkpoint_tick(ps, 1);
    return GDDR_OK;
}

void gddr_ps_close(gddr_ps **pp)
{
    gddr_ps *ps = *pp;
    if (!ps)
        return;
    gddr_ps_snapshot_free(ps);
    if (ps->ckw)
        gddr__ckpt_writer_stop(&ps->ckw);
    for (size_t i = 0; i < ps->npulls; i++)
        zmq_msg_close(&ps->pulls[i].ident);
    free(ps->pulls);
    free(ps->offbuf);
    if (ps->router)
        zmq_close(ps->router);
    if (ps->metrics)
        zmq_close(ps->metrics);
    gddr_ps_auth_close(ps);
    if (ps->zctx)
        zmq_ctx_term(ps->zctx);
    if (ps->pool)
        ps_pool_stop(&ps->pool);
    for (size_t i = 0; i < ps->ntensors; i++)
        tensor_free(ps->tensors[i]);
    free(ps->tensors);
    free(ps->workers);
    free(ps);
    *pp = NULL;
}
