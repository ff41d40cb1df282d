/* pipeline.c -- gddr_step_submit / gddr_step_wait: steps on a library thread.
 *
 * docs/design.md section 6, "Threads": the trainer hands a gradient over and
 * goes on computing while a library thread clips, compensates, runs the
 * residual engine, pushes and pulls. The hand-over is a lock-free
 * single-producer / single-consumer ring of PIPE_SLOTS slots and two C11
 * atomic counters:
 *
 *   submitted  written by the trainer (release) after it filled a slot
 *   completed  written by the library thread (release) after it finished one
 *   collected  the trainer's own count of slots it has waited for
 *
 * Slot k % PIPE_SLOTS belongs to the trainer while k >= submitted or
 * k < collected, and to the library thread while collected <= k < completed
 * is false and k < submitted, i.e. while it is submitted and not completed;
 * a completed slot is the trainer's again (it reads the result at wait).
 * Nobody takes a lock to pass data. When a side has nothing to do it sleeps
 * on the other side's counter with a futex (bounded by a timeout, so a lost
 * wake-up costs at most that long), and each counter update wakes it.
 *
 * Ownership: from the first submit until every submitted step has been
 * waited for, the library thread owns the client (socket, tensors, errmsg);
 * the trainer only touches its slots and the counters. gddr_step() and
 * gddr_step_from() check gddr__pipeline_busy() and answer GDDR_ESTATE
 * (single.c).
 *
 * Versions: a gradient is tagged with the versions of the parameters the
 * trainer last received (from the previous wait, or from before the first
 * submit), so one-step-stale gradients are reported as such to the server.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "client_int.h"

#define PIPE_SLOTS 2

typedef struct pslot {
    float **g;          /* per tensor: the gradient (host, or device memory) */
    float **p;          /* per tensor: the resulting parameters (host) */
    uint64_t *birth;    /* versions the gradient was computed on */
    uint64_t *ver;      /* versions of the resulting parameters */
    int rc;
    char errmsg[512];
} pslot;

struct pipeline {
    pthread_t th;
    int started;
    int device;         /* slots hold device gradients */
    int cuda_dev;       /* the trainer's current device */
    int nt;
    pslot slot[PIPE_SLOTS];
    _Atomic uint32_t submitted;
    _Atomic uint32_t completed;
    _Atomic uint32_t stop;
    uint32_t collected;  /* trainer only */
    uint64_t *cur_ver;   /* trainer only: versions of the parameters it holds */
    gddr_client *c;
};

/* ---- futex sleep / wake on a 32-bit atomic ---------------------------------- */

static void futex_wait_ms(_Atomic uint32_t *word, uint32_t seen, int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    /* Returns at once when *word != seen: no lost wake-ups. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* ---- the library thread ----------------------------------------------------- */

static void *pipe_main(void *arg)
{
    struct pipeline *p = arg;
    gddr_client *c = p->c;
    if (p->device)
        (void)gddr_cuda_set_device(p->cuda_dev); /* a failure shows in the step's own calls */
    uint32_t done = atomic_load_explicit(&p->completed, memory_order_relaxed);
    for (;;) {
        uint32_t sub = atomic_load_explicit(&p->submitted, memory_order_acquire);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break; /* close: steps not yet started are dropped */
        if (sub == done) {
            futex_wait_ms(&p->submitted, sub, 200);
            continue;
        }
        pslot *s = &p->slot[done % PIPE_SLOTS];
        s->rc = gddr__step_run(c, (const float *const *)s->g, NULL, s->birth, s->p);
        if (s->rc == GDDR_OK) {
            for (int i = 0; i < p->nt; i++)
                s->ver[i] = c->t[i].version;
            s->errmsg[0] = 0;
        } else {
            memcpy(s->errmsg, c->errmsg, sizeof s->errmsg);
        }
        done++;
        atomic_store_explicit(&p->completed, done, memory_order_release);
        futex_wake_all(&p->completed);
    }
    return NULL;
}

/* ---- setup and teardown ----------------------------------------------------- */

static void pipe_free(struct pipeline *p)
{
    if (!p)
        return;
    for (int k = 0; k < PIPE_SLOTS; k++) {
        pslot *s = &p->slot[k];
        for (int i = 0; i < p->nt; i++) {
            if (s->g) {
                if (p->device)
                    gddr_cuda_free(s->g[i]);
                else
                    free(s->g[i]);
            }
            if (s->p)
                free(s->p[i]);
        }
        free(s->g);
        free(s->p);
        free(s->birth);
        free(s->ver);
    }
    free(p->cur_ver);
    free(p);
}

static int pipe_create(gddr_client *c, int device, struct pipeline **out)
{
    struct pipeline *p = calloc(1, sizeof *p);
    if (!p)
        return GDDR_ENOMEM;
    p->c = c;
    p->nt = c->nt;
    p->device = device;
    if (device) {
        int rc = gddr_cuda_get_device(&p->cuda_dev);
        if (rc != GDDR_OK) {
            free(p);
            return rc;
        }
    }
    atomic_init(&p->submitted, 0);
    atomic_init(&p->completed, 0);
    atomic_init(&p->stop, 0);
    int rc = GDDR_OK;
    p->cur_ver = calloc((size_t)p->nt, sizeof *p->cur_ver);
    if (!p->cur_ver)
        rc = GDDR_ENOMEM;
    for (int k = 0; k < PIPE_SLOTS && rc == GDDR_OK; k++) {
        pslot *s = &p->slot[k];
        s->g = calloc((size_t)p->nt, sizeof *s->g);
        s->p = calloc((size_t)p->nt, sizeof *s->p);
        s->birth = calloc((size_t)p->nt, sizeof *s->birth);
        s->ver = calloc((size_t)p->nt, sizeof *s->ver);
        if (!s->g || !s->p || !s->birth || !s->ver) {
            rc = GDDR_ENOMEM;
            break;
        }
        for (int i = 0; i < p->nt && rc == GDDR_OK; i++) {
            size_t bytes = c->t[i].n * 4;
            if (device)
                rc = gddr_cuda_malloc((void **)&s->g[i], bytes);
            else if (!(s->g[i] = malloc(bytes)))
                rc = GDDR_ENOMEM;
            if (rc == GDDR_OK && !(s->p[i] = malloc(bytes)))
                rc = GDDR_ENOMEM;
        }
    }
    if (rc != GDDR_OK) {
        pipe_free(p);
        return rc;
    }
    /* The thread is not running yet: reading the client is safe. */
    for (int i = 0; i < p->nt; i++)
        p->cur_ver[i] = c->t[i].version;
    *out = p;
    return GDDR_OK;
}

int gddr__pipeline_busy(const gddr_client *c)
{
    const struct pipeline *p = c->pipe;
    if (!p)
        return 0;
    return atomic_load_explicit(&((struct pipeline *)p)->submitted, memory_order_relaxed) !=
           p->collected;
}

void gddr__pipeline_stop(gddr_client *c)
{
    if (!c)
        return;
    struct pipeline *p = c->pipe;
    if (p) {
        atomic_store_explicit(&p->stop, 1, memory_order_release);
        futex_wake_all(&p->submitted);
        /* A step in progress finishes first; it is bounded by the
         * client's own timeouts. */
        if (p->started)
            pthread_join(p->th, NULL);
        pipe_free(p);
        c->pipe = NULL;
    }
}

/* ---- submit and wait (the single backend's, single.c) ----------------------------- */

int gddr__pipeline_submit(gddr_client *c, const float *const *grads)
{
    struct pipeline *p = c->pipe;
    if (!p) {
        if (c->nt == 0)
            return gddr__set_err(c, GDDR_ESTATE, "submit: no tensor registered");
        for (int i = 0; i < c->nt; i++)
            if (!grads[i])
                return gddr__set_err(c, GDDR_EINVAL, "submit: NULL gradient for '%s'", c->t[i].key);
        int device = gddr_cuda_is_device_ptr(grads[0]);
        int rc = pipe_create(c, device, &p);
        if (rc != GDDR_OK)
            return gddr__set_err(c, rc, "submit: cannot set up the step pipeline%s%s",
                                 device ? ": " : "", device ? gddr_cuda_errmsg() : "");
        c->pipe = p;
    }
    /* From here on the client may belong to the library thread: no
     * gddr__set_err() (c->errmsg is its), plain codes only. */
    uint32_t sub = atomic_load_explicit(&p->submitted, memory_order_relaxed);
    if (sub - p->collected >= PIPE_SLOTS)
        return GDDR_ESTATE; /* both slots in flight: wait first */
    pslot *s = &p->slot[sub % PIPE_SLOTS];
    for (int i = 0; i < p->nt; i++) {
        if (!grads[i])
            return GDDR_EINVAL;
        size_t bytes = c->t[i].n * 4; /* n never changes after registration */
        if (p->device) {
            if (!gddr_cuda_is_device_ptr(grads[i]))
                return GDDR_EINVAL;
            int rc = gddr__cuda_d2d(s->g[i], grads[i], bytes);
            if (rc != GDDR_OK)
                return rc;
        } else {
            memcpy(s->g[i], grads[i], bytes);
        }
        s->birth[i] = p->cur_ver[i];
    }
    if (!c->o.async_pipeline) {
        /* No thread: the step runs here, wait only hands its result over. */
        s->rc = gddr__step_run(c, (const float *const *)s->g, NULL, s->birth, s->p);
        for (int i = 0; s->rc == GDDR_OK && i < p->nt; i++)
            s->ver[i] = c->t[i].version;
        s->errmsg[0] = 0;
        atomic_store_explicit(&p->submitted, sub + 1, memory_order_release);
        atomic_store_explicit(&p->completed, sub + 1, memory_order_release);
        return GDDR_OK;
    }
    if (!p->started) {
        if (pthread_create(&p->th, NULL, pipe_main, p) != 0)
            return GDDR_ENOMEM;
        p->started = 1;
    }
    atomic_store_explicit(&p->submitted, sub + 1, memory_order_release);
    futex_wake_all(&p->submitted);
    return GDDR_OK;
}

int gddr__pipeline_wait(gddr_client *c, float *const *params)
{
    struct pipeline *p = c->pipe;
    if (!p || atomic_load_explicit(&p->submitted, memory_order_relaxed) == p->collected)
        return GDDR_ESTATE;
    for (int i = 0; i < p->nt; i++)
        if (!params[i])
            return GDDR_EINVAL;
    /* The step's own waits are bounded (push, pull, reconnect); this bound
     * is the backstop above their sum, so a wait never hangs. */
    int64_t bound = 3 * (int64_t)c->o.timeout_ms + c->o.reconnect_timeout_ms + 2000;
    int64_t deadline = gddr__now_ms() + bound;
    for (;;) {
        uint32_t done = atomic_load_explicit(&p->completed, memory_order_acquire);
        if (done != p->collected)
            break; /* the oldest step is done (completed runs ahead of collected) */
        int64_t left = deadline - gddr__now_ms();
        if (left <= 0)
            return GDDR_ETIMEDOUT; /* still in flight: wait again later */
        futex_wait_ms(&p->completed, done, left < 200 ? (int)left : 200);
    }
    pslot *s = &p->slot[p->collected % PIPE_SLOTS];
    int rc = s->rc;
    if (rc == GDDR_OK) {
        for (int i = 0; i < p->nt && rc == GDDR_OK; i++) {
            size_t bytes = c->t[i].n * 4;
            if (gddr_cuda_is_device_ptr(params[i])) {
                rc = gddr_cuda_memcpy_h2d(params[i], s->p[i], bytes, NULL);
                if (rc == GDDR_OK)
                    rc = gddr_cuda_sync(NULL);
            } else {
                memcpy(params[i], s->p[i], bytes);
            }
            p->cur_ver[i] = s->ver[i];
        }
    }
    p->collected++;
    /* With nothing else in flight the client is the caller's again: the
     * failed step's message becomes gddr_client_errmsg(). */
    if (rc != GDDR_OK && s->errmsg[0] &&
        atomic_load_explicit(&p->submitted, memory_order_relaxed) == p->collected)
        memcpy(c->errmsg, s->errmsg, sizeof c->errmsg);
    return rc;
}
