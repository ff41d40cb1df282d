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
 * Update forms (the optimizer math is in optim.c):
 *   APPLY  one push is one optimizer step with lr_eff   (async, ssp)
 *   ACC    acc += f*g (f: AdaDelay's factor)           (sync: collect a push)
 *   SYNC   one optimizer step on the step's mean; acc = 0 (sync: end of step)
 *   JOIN   a flush added to the step just applied      (sync: a closing worker)
 * With fill (fill.c) ACC also takes the pushing worker's credit off the
 * chunks it sends and counts the chunks it holds back, and SYNC averages
 * each chunk over the pushes that carried it (adam, adamw, adagrad: over
 * the fresh pushes, t->facc) and credits that mean to the workers that
 * held it. An async APPLY of adam/adamw steps a chunk the
 * pusher holds with an estimate of its gradient (ps_upd_fill): the last
 * fresh push of that chunk, which APPLY keeps in t->facc (async_fill =
 * recent), or Adam's first moment.
 * With job->dst set the new values go there (copy on write: a pull reply
 * still holds t->w), and chunks the job does not change are copied over.
 */
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "blas.h"
#include "ps.h"
#include "vec.h"


/* a += s * g */
GDDR_VEC static void acc_add(float *restrict a, const float *restrict g, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] += s * g[i];
}

/* a += s * g - cr; cr = 0 (a worker's credit taken off what it sends) */
GDDR_VEC static void acc_add_credit(float *restrict a, const float *restrict g, float s,
                                     float *restrict cr, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        a[i] += s * g[i] - cr[i];
        cr[i] = 0;
    }
}

/* cr = s * g - cr: the net mass of what a worker sends now (in its credit
 * buffer, which it frees), for APPLY and JOIN */
GDDR_VEC static void net_of_credit(float *restrict cr, const float *restrict g, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr[i] = s * g[i] - cr[i];
}

/* f = s * g (async_fill = recent: a fresh push's values, kept for holders) */
GDDR_VEC static void keep_fresh(float *restrict f, const float *restrict g, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i] = s * g[i];
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

/* SYNC: the holders of chunk c in this step get sum / n (a mean) as
 * credit, once per hold; returns the holds. */
static uint32_t grant_credit(const ps_job *j, size_t c, size_t lo, size_t len, const float *sum,
                             uint32_t n)
{
    float inv = 1.0f / (float)n;
    uint32_t holds = 0;
    for (uint32_t h = 0; h < j->nholders; h++) {
        ps_fillw *fw = j->holders[h];
        uint8_t k = fw->held[c];
        if (!k)
            continue;
        acc_add(fw->cred + lo, sum, (float)k * inv, len);
        fw->held[c] = 0;
        holds += k;
    }
    return holds;
}

static void drop_holds(const ps_job *j, size_t c)
{
    for (uint32_t h = 0; h < j->nholders; h++)
        j->holders[h]->held[c] = 0;
}

/* SYNC, adam/adamw/adagrad: the fresh pushes' mean is credited to the
 * holders and their share of it added to the step's sum a (fill.c says
 * why); with no fresh push the holders get nothing this step. */
static void grant_fresh(const ps_job *j, size_t c, size_t lo, size_t len, float *a)
{
    uint32_t nf = j->t->fcnt[c];
    if (!nf) {
        drop_holds(j, c);
        return;
    }
    const float *fresh = j->facc + lo;
    uint32_t holds = grant_credit(j, c, lo, len, fresh, nf);
    acc_add(a, fresh, (float)holds / (float)nf, len);
}

/* SYNC: the fresh sums of chunk c back to zero for the next step. */
static void clear_fresh(const ps_job *j, size_t c, size_t lo, size_t len)
{
    if (!j->facc)
        return;
    memset(j->facc + lo, 0, len * sizeof(float));
    j->t->fcnt[c] = 0;
}

/* APPLY, async_fill = recent: the last fresh values of chunk c if another
 * worker pushed them and the pusher was not given them before (marked as
 * given now), else NULL: the held chunk is not stepped
 * (docs/design-decisions.md, "Each fresh push stands in once"). */
static const float *recent_estimate(const ps_job *j, size_t c, size_t lo)
{
    const ps_tensor *t = j->t;
    uint32_t stamp = j->facc ? t->fcnt[c] : 0;
    if (!stamp || t->fsrc[c] == j->rank || stamp == j->fw->seen[c])
        return NULL;
    j->fw->seen[c] = stamp;
    return j->facc + lo;
}

static void apply_chunk(const ps_job *j, size_t c)
{
    ps_tensor *t = j->t;
    size_t lo = c * t->chunk;
    size_t hi = lo + t->chunk < t->n ? lo + t->chunk : t->n;
    size_t len = hi - lo;
    const float *w = t->w + lo;
    float *out = j->dst ? j->dst + lo : t->w + lo;
    float *s1 = t->s1 ? t->s1 + lo : NULL, *s2 = t->s2 ? t->s2 + lo : NULL;
    switch (j->kind) {
    case PS_JOB_NORM: {
        const float *g = job_values(j, c, lo);
        j->sq[c] = g ? gddr_sumsq_fp32_cpu(g, len) : 0.0;
        return;
    }
    case PS_JOB_APPLY:
    case PS_JOB_JOIN: {
        const float *g = job_values(j, c, lo);
        if (j->sq) /* validated as it is applied: the chunk is read once (push.c) */
            j->sq[c] = g ? gddr_sumsq_fp32_cpu(g, len) : 0.0;
        if (!g && j->held && j->fw && j->kind == PS_JOB_APPLY) {
            /* Held by the pusher (async fill, adam): the chunk's last fresh
             * push stands in (async_fill = recent), or m-hat (moment). */
            j->fw->open[c] = 1;
            const float *est = recent_estimate(j, c, lo);
            if (!j->facc || est) {
                ps_upd_fill(&j->upd, out, w, s1, s2, j->fw->cred + lo, est, len);
                return;
            } /* else it waits for its release: as a chunk not pushed */
        }
        if (!g) {
            if (j->dst)
                memcpy(out, w, len * sizeof *out);
            return;
        }
        float gs = j->vscale * j->scale;
        if (j->facc && j->kind == PS_JOB_APPLY && !(j->fw && j->fw->open[c])) {
            keep_fresh(j->facc + lo, g, j->vscale, len); /* fresh: the next holders' estimate */
            t->fcnt[c] = j->stamp;
            t->fsrc[c] = j->rank;
        }
        if (j->fw) {
            j->fw->open[c] = 0;
            float *cr = j->fw->cred + lo;
            net_of_credit(cr, g, j->vscale, len);
            g = cr;
            gs = j->scale;
        }
        if (j->kind == PS_JOB_APPLY)
            ps_upd_run(&j->upd, out, w, s1, s2, g, gs, len);
        else
            ps_upd_join(&j->upd, out, w, s1, s2, g, gs, len);
        if (j->fw)
            memset(j->fw->cred + lo, 0, len * sizeof(float));
        return;
    }
    case PS_JOB_ACC: {
        const float *g = job_values(j, c, lo);
        if (!g) {
            if (j->fw && j->held) {
                j->fw->open[c] = 1;
                if (j->fw->held[c] < 255)
                    j->fw->held[c]++;
            } else {
                t->cnt[c]++; /* a zero of this step */
            }
            return;
        }
        if (t->facc && !(j->fw && j->fw->open[c])) {
            acc_add(t->facc + lo, g, j->vscale, len); /* fresh: this step's gradient only */
            t->fcnt[c]++;
        }
        if (j->fw) {
            j->fw->open[c] = 0;
            acc_add_credit(t->acc + lo, g, j->vscale, j->fw->cred + lo, len);
        } else {
            acc_add(t->acc + lo, g, j->vscale, len);
        }
        t->touched[c] = 1;
        t->cnt[c]++;
        return;
    }
    case PS_JOB_SYNC: {
        uint32_t n = t->cnt[c];
        t->cnt[c] = 0;
        if (!t->touched[c] || n == 0) {
            /* No push carried it: it keeps its values and its state (and a
             * chunk every pusher held gives nobody credit). */
            drop_holds(j, c);
            clear_fresh(j, c, lo, len);
            if (j->dst)
                memcpy(out, w, len * sizeof *out);
            return;
        }
        float *a = t->acc + lo;
        float gs = j->scale;
        if (n < j->npushes && j->facc && ps_upd_normalises(j->upd.kind)) {
            /* Fill with the fresh pushes' mean: a becomes the step's sum. */
            grant_fresh(j, c, lo, len, a);
        } else if (n < j->npushes) {
            /* Fill: the mean over the n pushes that carried it stands in
             * for the others'. */
            grant_credit(j, c, lo, len, a, n);
            gs = j->scale * ((float)j->npushes / (float)n);
        } else {
            drop_holds(j, c);
        }
        clear_fresh(j, c, lo, len);
        ps_upd_run(&j->upd, out, w, s1, s2, a, gs, len);
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

/* extra: threads beside the pool's that will take parts (the caller, when
 * it waits for the job at once). */
static ps_task *submit(ps_pool *p, const ps_job *job, zmq_msg_t *msgs, int nmsgs, void *owned, int extra)
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
    k->parts = nc < (size_t)(p->n + extra) ? (int)nc : p->n + extra;
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

ps_task *ps_pool_submit(ps_pool *p, const ps_job *job, zmq_msg_t *msgs, int nmsgs, void *owned)
{
    return submit(p, job, msgs, nmsgs, owned, 0);
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
    ps_pool_wait(p, submit(p, job, NULL, 0, NULL, 1)); /* the caller takes parts too */
}

double ps_job_norm(const ps_job *j)
{
    double s = 0.0;
    for (size_t c = 0; c < j->t->nchunks; c++)
        s += j->sq[c];
    return sqrt(s);
}

double ps_payload_norm(ps_pool *p, ps_job *job, double *sq)
{
    job->kind = PS_JOB_NORM;
    job->sq = sq;
    ps_pool_run(p, job);
    return ps_job_norm(job);
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
