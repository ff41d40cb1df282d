/* tensor.c -- a tensor's life: created (by a registration or a restore),
 * its values in reference-counted version buffers, updates handed to the
 * apply pool and settled, freed; and the mode the tensors are in.
 *
 * Version buffers. Every pull reply in flight holds a reference to the
 * buffer it points ZeroMQ at (conn.c); an update writes in place when no
 * reply holds the tensor's buffer, and into a fresh (recycled) one when
 * some does (copy on write), so a reply is never torn and never shows a
 * newer version than its header says.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gddr_hash.h"
#include "log.h"
#include "ps.h"

/* ---- version buffers ------------------------------------------------------- */

static void vbuf_release(ps_vbuf *b);

/* Bytes of version buffers alive (the tensors' current ones and those
 * unsent replies still hold): process-wide, as ZeroMQ's thread frees them. */
static atomic_llong vbuf_bytes;

long long ps_vbuf_bytes(void)
{
    return atomic_load(&vbuf_bytes);
}

void ps_vbuf_unref(ps_vbuf *b)
{
    if (b && atomic_fetch_sub(&b->refs, 1) == 1)
        vbuf_release(b);
}

/* Spare buffers for copy on write: a buffer freed by the last reply that
 * held it is kept for the next update of that size instead of going back to
 * the allocator (a fresh large buffer costs page faults on first write).
 * Filled from ZeroMQ's I/O thread, taken by the front thread. */
#define SPARES 8
#define SPARE_MIN_BYTES 65536
static pthread_mutex_t spare_mu = PTHREAD_MUTEX_INITIALIZER;
static ps_vbuf *spare[SPARES];

static void vbuf_release(ps_vbuf *b)
{
    if (b->bytes >= SPARE_MIN_BYTES) {
        pthread_mutex_lock(&spare_mu);
        for (int i = 0; i < SPARES; i++)
            if (!spare[i]) {
                spare[i] = b;
                b = NULL;
                break;
            }
        pthread_mutex_unlock(&spare_mu);
        if (!b)
            return;
    }
    atomic_fetch_sub(&vbuf_bytes, (long long)b->bytes);
    free(b->data);
    free(b);
}

ps_vbuf *ps_vbuf_new(size_t n)
{
    size_t bytes = n * sizeof(float);
    ps_vbuf *b = NULL;
    pthread_mutex_lock(&spare_mu);
    for (int i = 0; i < SPARES; i++)
        if (spare[i] && spare[i]->bytes == bytes) {
            b = spare[i];
            spare[i] = NULL;
            break;
        }
    pthread_mutex_unlock(&spare_mu);
    if (!b) {
        b = malloc(sizeof *b);
        if (!b || posix_memalign((void **)&b->data, 64, bytes ? bytes : 64) != 0) {
            free(b);
            return NULL;
        }
        b->bytes = bytes;
        atomic_fetch_add(&vbuf_bytes, (long long)bytes);
    }
    atomic_init(&b->refs, 1);
    return b;
}

int ps_tensor_begin_write(ps_tensor *t, ps_vbuf **fresh)
{
    /* Only the front thread adds references, and the I/O thread only
     * drops them: a count of 1 stays 1 while we write. */
    *fresh = NULL;
    if (atomic_load(&t->cur->refs) == 1)
        return 0;
    *fresh = ps_vbuf_new(t->n);
    return *fresh ? 0 : -1;
}

void ps_tensor_commit(ps_tensor *t, ps_vbuf *fresh)
{
    if (!fresh)
        return;
    ps_vbuf *old = t->cur;
    t->cur = fresh;
    t->w = fresh->data;
    ps_vbuf_unref(old);
}

/* ---- tensors -------------------------------------------------------------- */

ps_tensor *ps_tensor_by_id(gddr_ps *ps, uint32_t id)
{
    return id < ps->ntensors ? ps->tensors[id] : NULL;
}

/* Hands t's next update to the pool (after t was settled): the front thread
 * goes on while it runs. msgs are the messages the payload lives in and
 * owned what else the job reads: the pool takes both unless the update was
 * small and is done already (t->pending stays NULL; they stay the caller's). */
/* Which chunks an update changes, at the version it makes (lazy pulls
 * send a worker only what changed since it last got a chunk). */
static void mark_modified(ps_tensor *t, const ps_job *job)
{
    for (size_t c = 0; job->kind != PS_JOB_ACC && c < t->nchunks; c++) {
        int hit = job->kind == PS_JOB_SYNC ? t->touched[c]
                  : job->src               ? job->src[c] != NULL
                  : job->off               ? job->off[c] >= 0
                                           : 1;
        if (hit)
            t->mod[c] = t->version + 1;
    }
}

void ps_tensor_submit(gddr_ps *ps, ps_tensor *t, ps_job *job, ps_vbuf *fresh, zmq_msg_t *msgs,
                      int nmsgs, void *owned)
{
    mark_modified(t, job);
    job->dst = fresh ? fresh->data : NULL;
    ps_task *k = ps_pool_submit(ps->pool, job, msgs, nmsgs, owned);
    if (!k) {
        ps_tensor_commit(t, fresh); /* done already */
        return;
    }
    t->pending = k;
    t->pending_fresh = fresh;
}

void ps_tensor_settle(gddr_ps *ps, ps_tensor *t)
{
    if (!t->pending)
        return;
    ps_pool_wait(ps->pool, t->pending);
    t->pending = NULL;
    ps_tensor_commit(t, t->pending_fresh);
    t->pending_fresh = NULL;
}

ps_vbuf *ps_tensor_apply_aside(gddr_ps *ps, ps_tensor *t, ps_job *job, double *norm)
{
    ps_vbuf *fresh = ps_vbuf_new(t->n);
    if (!fresh)
        return NULL;
    job->dst = fresh->data;
    ps_pool_run(ps->pool, job);
    *norm = ps_job_norm(job);
    return fresh;
}

void ps_tensor_commit_aside(ps_tensor *t, const ps_job *job, ps_vbuf *fresh)
{
    mark_modified(t, job);
    ps_tensor_commit(t, fresh);
}

void ps_settle_all(gddr_ps *ps)
{
    for (size_t i = 0; i < ps->ntensors; i++)
        ps_tensor_settle(ps, ps->tensors[i]);
}

void ps_tensor_free(ps_tensor *t)
{
    ps_vbuf_unref(t->cur);
    free(t->off);
    free(t->mod);
    free(t->s1);
    free(t->s2);
    free(t->acc);
    free(t->touched);
    free(t->cnt);
    free(t->facc);
    free(t->fcnt);
    free(t->fsrc);
    free(t->holders);
    free(t->holders_alt);
    free(t->contrib);
    free(t->seen);
    free(t->sstep);
    free(t->tau_pend);
    ps_align_free(&t->align);
    while (t->flushes) {
        ps_flush *f = t->flushes;
        t->flushes = f->next;
        free(f->vals), free(f->bitmap), free(f);
    }
    free(t);
}

ps_tensor *ps_tensor_create(gddr_ps *ps, const char *key, size_t n)
{
    ps_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    snprintf(t->key, sizeof t->key, "%s", key);
    t->n = n;
    t->chunk = (uint32_t)ps->cfg.chunk;
    t->nchunks = (n + t->chunk - 1) / t->chunk;
    t->cur = ps_vbuf_new(n);
    t->w = t->cur ? t->cur->data : NULL;
    t->acc = calloc(n, sizeof(float));
    t->touched = calloc(t->nchunks, 1);
    t->cnt = calloc(t->nchunks, sizeof *t->cnt);
    t->holders = calloc((size_t)ps->cfg.max_workers, sizeof *t->holders);
    t->holders_alt = calloc((size_t)ps->cfg.max_workers, sizeof *t->holders_alt);
    ps_optim_from_config(&ps->cfg, &t->opt);
    t->off = malloc(t->nchunks * sizeof *t->off);
    t->mod = calloc(t->nchunks, sizeof *t->mod);
    t->keyhash = gddr_key_hash(t->key);
    t->contrib = calloc((size_t)ps->cfg.max_workers, 1);
    t->seen = calloc((size_t)ps->cfg.max_workers, sizeof *t->seen);
    t->sstep = calloc((size_t)ps->cfg.max_workers, sizeof *t->sstep);
    t->tau_pend = calloc((size_t)ps->cfg.max_workers, sizeof *t->tau_pend);
    t->tau = (int)ps->cfg.tau_init;
    ps_tensor **arr = t->w && t->acc && t->touched && t->cnt && t->holders && t->holders_alt &&
                              t->off && t->mod && t->contrib && t->seen && t->sstep && t->tau_pend
                          ? realloc(ps->tensors, (ps->ntensors + 1) * sizeof *arr)
                          : NULL;
    if (!arr) {
        ps_tensor_free(t);
        return NULL;
    }
    ps->tensors = arr;
    t->id = (uint32_t)ps->ntensors;
    ps->tensors[ps->ntensors++] = t;
    return t;
}

/* Hybrid: a sync server runs async until the warm-up is over, and then
 * every tensor is sync at once. (Switching each tensor at its own version
 * deadlocked: pushes of different workers interleave, so a worker could
 * push one tensor as the last async update and the next as the first sync
 * one, while another worker did the opposite, and each step then waited
 * for a push the other would only send after its own step completed.) */
/* The async warm-up is over: every tensor's last fresh values (async_fill,
 * apply.c) cleared, for the sync steps to sum fresh pushes into. Also when a
 * reload switches async_fill (ops.c): moment does not keep them, so what
 * recent found again would be values from before the switch. */
void ps_tensor_fresh_reset(gddr_ps *ps)
{
    for (size_t i = 0; i < ps->ntensors; i++) {
        ps_tensor *t = ps->tensors[i];
        if (!t || !t->facc)
            continue;
        ps_tensor_settle(ps, t);
        memset(t->facc, 0, t->n * sizeof(float));
        memset(t->fcnt, 0, t->nchunks * sizeof *t->fcnt);
    }
}

int ps_tensor_mode(gddr_ps *ps, const ps_tensor *t)
{
    if (ps->cfg.mode != GDDR_PS_MODE_SYNC || ps->cfg.async_warmup_steps <= 0 || ps->warmup_over)
        return ps->cfg.mode;
    if (t && t->version >= (uint64_t)ps->cfg.async_warmup_steps) {
        ps->warmup_over = 1;
        ps_tensor_fresh_reset(ps);
        gddr_log(GDDR_LOG_INFO, "async warm-up over: tensor '%s' reached version %llu, sync from now on",
                 t->key, (unsigned long long)t->version);
        return GDDR_PS_MODE_SYNC;
    }
    return GDDR_PS_MODE_ASYNC;
}

/* Per-chunk offsets of a payload laid out by bitmap (NULL: dense). */
void ps_chunk_offsets(const ps_tensor *t, const uint8_t *bm, int64_t *off)
{
    size_t o = 0;
    for (size_t c = 0; c < t->nchunks; c++) {
        size_t lo = c * t->chunk;
        if (!bm || (bm[c / 8] >> (c % 8) & 1)) {
            off[c] = (int64_t)o;
            o += lo + t->chunk <= t->n ? t->chunk : t->n - lo;
        } else {
            off[c] = -1;
        }
    }
}

int ps_valid_key(const char *k)
{
    size_t n = k ? strlen(k) : 0;
    if (n == 0 || n >= 128)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (k[i] <= ' ' || k[i] > '~')
            return 0;
    return 1;
}
