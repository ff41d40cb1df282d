/* apply.c -- the apply pool: updates run beside the front thread.
 *
 * The front thread submits a job (one push, one sync step) and goes on
 * receiving and replying; a large job is cut into one part per thread, each
 * part a chunk range, and whoever is free takes the next part -- a pool
 * thread, or the front thread when it must wait for that job (it helps
 * instead of sleeping). Jobs on different tensors run at the same time on
 * different threads; the front thread keeps jobs on one tensor in order by
 * waiting for the previous one first (ps_tensor_settle, tensor.c), so no
 * two threads ever write the same element and no locks are taken inside a
 * job. A job owns the message its payload lives in until it is done.
 * Tensors smaller than INLINE_MAX elements are applied by the front thread
 * at once: handing them over costs more than the work (a few microseconds).
 *
 * Update forms (DESIGN section 5, lr folded into the accumulated value so
 * that sync steps mixing pushes of different staleness stay exact):
 *   APPLY  v = mu*v + lr_eff*g ; w -= v      (async, ssp: one push)
 *   ACC    acc += lr_eff*g                     (sync: collect one push)
 *   SYNC   v = mu*v + acc/N   ; w -= v ; acc = 0   (sync: end of step)
 * With mu = 0 the momentum buffer is not touched and w -= lr_eff*g exactly.
 * With job->dst set the new values go there (copy on write: a pull reply
 * still holds t->w), and chunks the job does not change are copied over.
 */
#include <stdlib.h>
#include <string.h>

#include "ps.h"

/* The update loops, with restrict so the compiler vectorises them, built
 * for AVX-512, AVX2 and plain x86-64 and picked at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define PS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PS_CLONES
#endif

/* out = w - s * g (out may be w) */
PS_CLONES static void axpy_out(float *out, const float *w, const float *restrict g, float s, size_t n)
{
    if (out == w) {
        float *restrict o = out;
        for (size_t i = 0; i < n; i++)
            o[i] -= s * g[i];
    } else {
        float *restrict o = out;
        const float *restrict wi = w;
        for (size_t i = 0; i < n; i++)
            o[i] = wi[i] - s * g[i];
    }
}

/* v = mu v + s g; out = w - v (out may be w) */
PS_CLONES static void momentum_out(float *out, const float *w, float *restrict v,
                                   const float *restrict g, float mu, float s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        v[i] = mu * v[i] + s * g[i];
        out[i] = w[i] - v[i];
    }
}

/* a += s * g */
PS_CLONES static void acc_add(float *restrict a, const float *restrict g, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] += s * g[i];
}

/* Chunk c's values in the payload (it starts at element lo), NULL absent. */
static const float *job_values(const ps_job *j, size_t c, size_t lo)
{
    if (j->src)
        return j->src[c];
    if (!j->off)
        return j->vals + lo;
    return j->off[c] < 0 ? NULL : j->vals + j->off[c];
}

static void apply_chunk(const ps_job *j, size_t c)
{
    ps_tensor *t = j->t;
    size_t lo = c * t->chunk;
    size_t hi = lo + t->chunk < t->n ? lo + t->chunk : t->n;
    size_t len = hi - lo;
    const float *w = t->w + lo;
    float *out = j->dst ? j->dst + lo : t->w + lo;
    switch (j->kind) {
    case PS_JOB_APPLY: {
        const float *g = job_values(j, c, lo);
        if (!g) {
            if (j->dst)
                memcpy(out, w, len * sizeof *out);
            return;
        }
        if (j->mu > 0 && t->mom)
            momentum_out(out, w, t->mom + lo, g, j->mu, j->scale, len);
        else
            axpy_out(out, w, g, j->scale, len);
        return;
    }
    case PS_JOB_ACC: {
        const float *g = job_values(j, c, lo);
        if (!g)
            return;
        acc_add(t->acc + lo, g, j->scale, len);
        t->touched[c] = 1;
        return;
    }
    case PS_JOB_SYNC: {
        if (!t->touched[c]) {
            if (j->dst)
                memcpy(out, w, len * sizeof *out);
            return;
        }
        float *a = t->acc + lo;
        if (j->mu > 0 && t->mom)
            momentum_out(out, w, t->mom + lo, a, j->mu, j->scale, len);
        else
            axpy_out(out, w, a, j->scale, len);
        memset(a, 0, len * sizeof *a);
        t->touched[c] = 0;
        return;
    }
    }
}

#define INLINE_MAX (1 << 16)

/* A job in flight: its parts are claimed by whoever is free (a pool thread,
 * or the front thread waiting for it), each part a chunk range. */
struct ps_task {
    ps_job job;
    int parts;
    int next;                   /* next part to claim (under the pool lock) */
    atomic_int done;            /* parts finished */
    zmq_msg_t *msgs;            /* the payload's messages, owned (closed when done) */
    int nmsgs;
    zmq_msg_t one;              /* msgs when there is only one */
    void *owned;                /* freed when done */
    struct ps_task *qnext;      /* queue of tasks with parts left to claim */
};

struct ps_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    ps_task *head, *tail;       /* tasks with unclaimed parts, oldest first */
    int stop;
};

static void run_part(const ps_job *j, int part, int parts)
{
    size_t nc = j->t->nchunks;
    size_t c0 = nc * (size_t)part / (size_t)parts;
    size_t c1 = nc * (size_t)(part + 1) / (size_t)parts;
    for (size_t c = c0; c < c1; c++)
        apply_chunk(j, c);
}

/* Claims the next part of k (under the lock); dequeues k when it was the last. */
static int claim(ps_pool *p, ps_task *k)
{
    int part = k->next++;
    if (k->next == k->parts) {
        /* k is at the head: parts are claimed in queue order */
        p->head = k->qnext;
        if (!p->head)
            p->tail = NULL;
    }
    return part;
}

static void finish_part(ps_pool *p, ps_task *k)
{
    if (atomic_fetch_add(&k->done, 1) + 1 == k->parts) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *pool_main(void *arg)
{
    ps_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop && !p->head)
            break;
        ps_task *k = p->head;
        int part = claim(p, k);
        pthread_mutex_unlock(&p->mu);
        run_part(&k->job, part, k->parts);
        finish_part(p, k);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ps_pool_start(ps_pool **out, int threads)
{
    ps_pool *p = calloc(1, sizeof *p);
    if (!p)
        return GDDR_ENOMEM;
    p->n = threads < 1 ? 1 : threads;
    p->th = calloc((size_t)p->n, sizeof *p->th);
    if (!p->th) {
        free(p);
        return GDDR_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < p->n; i++) {
        if (pthread_create(&p->th[i], NULL, pool_main, p) != 0) {
            p->n = i;
            ps_pool_stop(&p);
            return GDDR_ENOMEM;
        }
    }
    *out = p;
    return GDDR_OK;
}

ps_task *ps_pool_submit(ps_pool *p, const ps_job *job, zmq_msg_t *msgs, int nmsgs, void *owned)
{
    ps_task *k = NULL;
    if (job->t->n >= INLINE_MAX && p->n > 0)
        k = malloc(sizeof *k);
    if (!k) {
        /* Small: waking a thread costs more than the work. */
        run_part(job, 0, 1);
        return NULL;
    }
    k->job = *job;
    size_t nc = job->t->nchunks;
    k->parts = nc < (size_t)p->n ? (int)nc : p->n;
    if (k->parts < 1)
        k->parts = 1;
    k->next = 0;
    atomic_init(&k->done, 0);
    k->nmsgs = nmsgs > 0 ? nmsgs : 0;
    if (k->nmsgs == 1) {
        /* One frame is moved in. A very small message lives inside its
         * zmq_msg_t: a pointer to its start follows it. */
        const void *was = zmq_msg_data(&msgs[0]);
        zmq_msg_init(&k->one);
        zmq_msg_move(&k->one, &msgs[0]);
        if (k->job.vals == was)
            k->job.vals = zmq_msg_data(&k->one);
        k->msgs = &k->one;
    } else {
        k->msgs = msgs; /* the array itself is taken: its frames do not move */
    }
    k->owned = owned;
    k->qnext = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->tail)
        p->tail->qnext = k;
    else
        p->head = k;
    p->tail = k;
    if (k->parts == 1)
        pthread_cond_signal(&p->go);
    else
        pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    return k;
}

void ps_pool_wait(ps_pool *p, ps_task *k)
{
    if (!k)
        return;
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&k->done) < k->parts) {
        if (p->head) {
            /* Help rather than sleep (with k's parts, or those of a task
             * queued before it): this thread has nothing else to do. */
            ps_task *h = p->head;
            int part = claim(p, h);
            pthread_mutex_unlock(&p->mu);
            run_part(&h->job, part, h->parts);
            finish_part(p, h);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        pthread_cond_wait(&p->done, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < k->nmsgs; i++)
        zmq_msg_close(&k->msgs[i]);
    if (k->msgs != &k->one)
        free(k->msgs);
    free(k->owned);
    free(k);
}

void ps_pool_run(ps_pool *p, const ps_job *job)
{
    ps_pool_wait(p, ps_pool_submit(p, job, NULL, 0, NULL));
}

void ps_pool_stop(ps_pool **pp)
{
    ps_pool *p = *pp;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++)
        pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
    *pp = NULL;
}
