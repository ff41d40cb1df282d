/* apply.c -- the apply pool: one large push applied by all threads at once.
 *
 * Thread t of T owns chunks [t*C/T, (t+1)*C/T) of every tensor, so no two
 * threads ever write the same element and no locks are taken inside a job.
 * The front thread posts a job and sleeps until every thread finished it.
 * Tensors smaller than INLINE_MAX elements are applied by the front thread
 * alone: waking T threads costs more than the work (a few microseconds).
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

#define INLINE_MAX (1 << 16)

struct ps_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int remaining;
    int stop;
    const ps_job *job;
};

struct pool_arg {
    ps_pool *p;
    int index;
};

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
        int64_t o = j->off ? j->off[c] : (int64_t)lo;
        if (o < 0) {
            if (j->dst)
                memcpy(out, w, len * sizeof *out);
            return;
        }
        const float *g = j->vals + o;
        if (j->mu > 0 && t->mom)
            momentum_out(out, w, t->mom + lo, g, j->mu, j->scale, len);
        else
            axpy_out(out, w, g, j->scale, len);
        return;
    }
    case PS_JOB_ACC: {
        int64_t o = j->off ? j->off[c] : (int64_t)lo;
        if (o < 0)
            return;
        acc_add(t->acc + lo, j->vals + o, j->scale, len);
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

static void run_part(const ps_job *j, int part, int parts)
{
    size_t nc = j->t->nchunks;
    size_t c0 = nc * (size_t)part / (size_t)parts;
    size_t c1 = nc * (size_t)(part + 1) / (size_t)parts;
    for (size_t c = c0; c < c1; c++)
        apply_chunk(j, c);
}

static void *pool_main(void *arg)
{
    struct pool_arg *a = arg;
    ps_pool *p = a->p;
    int index = a->index;
    free(a);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        const ps_job *job = p->job;
        pthread_mutex_unlock(&p->mu);
        run_part(job, index, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->remaining == 0)
            pthread_cond_signal(&p->done);
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
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < p->n; i++) {
        struct pool_arg *a = malloc(sizeof *a);
        a->p = p;
        a->index = i;
        if (pthread_create(&p->th[i], NULL, pool_main, a) != 0) {
            free(a);
            p->n = i;
            ps_pool_stop(&p);
            return GDDR_ENOMEM;
        }
    }
    *out = p;
    return GDDR_OK;
}

void ps_pool_run(ps_pool *p, const ps_job *job)
{
    if (job->t->n < INLINE_MAX || p->n <= 1) {
        run_part(job, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->job = job;
    p->remaining = p->n;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    while (p->remaining > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
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
