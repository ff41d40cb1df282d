/* fill.c -- held chunks in sync steps ("fill").
 *
 * A GDDR worker holds a random share of its chunks back in its residual and
 * sends them, with everything they gathered, a few steps later. Applied as
 * they arrive, that held mass is a delayed gradient, and delay is what
 * heavy-ball momentum tolerates worst: with mu = 0.9 a one-step delay on
 * part of the gradient shrinks the largest stable lr*curvature from 3.8 to
 * about 0.2 (docs/design.md works it out), and measured on the
 * Fashion-MNIST MLP the server's model lost 8-14 pp.
 *
 * In a sync step every worker computed its gradient on the same
 * parameters, so the workers that did send a chunk say what the others'
 * share of it most likely was. With fill (fill_held, pushes marked
 * Push.held), a chunk's mean is taken over the pushes that carried it, and
 * that mean is credited to every worker that held it back. When a worker
 * later sends the chunk -- all it gathered -- its credit is subtracted
 * first. So:
 *   - the server applies, every step, the mean of fresh gradients of every
 *     chunk that anyone sent: no delayed signal enters the optimizer, only
 *     each worker's deviation from the mean arrives late;
 *   - nothing is lost or counted twice: over a run, what the server applied
 *     is exactly the workers' gradients, plus the credits still open (which
 *     the workers' flushes on close bring to zero);
 *   - a step where every pusher sent a chunk is the same as without fill.
 *
 * Which mean: for SGD it is the mean over every push that carried the
 * chunk. A release (a worker sending a chunk it held: its own gradients
 * minus its credits) is in that mean, so its deviation is credited again
 * to this step's holders, who send it back later, and so on: the noise
 * bounces between workers. With 4 workers, alpha 0.4 and tau 4 a step's
 * applied gradient then has 4.8 times the variance of the dense mean (1.2
 * against 0.25 for unit-variance gradients, scripts/fillsim.py); it evens
 * out over about 10 steps, which momentum averages over, but Adam and
 * Adagrad divide by the running mean of its square, so every step shrinks
 * and the run falls behind (the transformer of docs/results-lm.md: +2.26 %
 * held-out loss on the mean of 3 seeds, +3.97 % on seed 2). For those optimizers (ps_upd_normalises) the fill is the
 * mean of the fresh pushes only -- from workers with no hold open on the
 * chunk, whose values are just this step's gradient -- and releases count
 * once, at weight 1/N, like any push; a chunk no fresh push carried gets
 * no fill that step (its holders send their share later, in full). That
 * halves the variance (0.60); the transformer's gap, +1.86 % over 11 runs
 * of 3 seeds, still scatters from run to run (docs/results-lm.md). Most of
 * the rest was closed on the workers, in who holds: with the staggered
 * schedule (hold_schedule, kernels/residual.c) every chunk has fresh
 * pushes in every step, so no chunk goes unfilled for want of them.
 * Per worker and tensor this costs one float a value (the credit) and two
 * bytes a chunk, within max_fill_bytes; a worker over the bound is taken
 * without fill (its held chunks then count as zeros of the step, as before).
 * The fresh pushes' sums (those optimizers only) cost a float a value and
 * 4 bytes a chunk per tensor; like the step's sum (acc) they are part of
 * the tensor, not of a worker's fill state, and not in max_fill_bytes.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "log.h"
#include "ps.h"
#include "snapshot.h"

static atomic_llong fill_bytes;

long long ps_fill_bytes(void)
{
    return atomic_load(&fill_bytes);
}

/* A worker's fill state for a tensor of n values in nchunks chunks: the
 * credits, the holds of the open step, the open holds. */
static size_t fw_bytes(size_t n, size_t nchunks)
{
    return n * sizeof(float) + 2 * nchunks;
}

/* What it holds in memory: that and the stamps of the fills it got. */
static size_t fw_mem(size_t n, size_t nchunks)
{
    return fw_bytes(n, nchunks) + nchunks * sizeof(uint32_t);
}

void ps_fill_fresh_alloc(gddr_ps *ps, ps_tensor *t)
{
    ps_optim tmp;
    if (t->facc || !ps->cfg.fill_held || !ps_upd_normalises(ps_optim_of(ps, t, &tmp)->kind))
        return;
    t->facc = calloc(t->n, sizeof(float));
    t->fcnt = calloc(t->nchunks, sizeof *t->fcnt);
    t->fsrc = calloc(t->nchunks, sizeof *t->fsrc);
    if (!t->facc || !t->fcnt || !t->fsrc) {
        /* The carriers' mean stays the fill: slower, not wrong. */
        free(t->facc), free(t->fcnt), free(t->fsrc);
        t->facc = NULL, t->fcnt = NULL, t->fsrc = NULL;
        return;
    }
}

/* The default: every expected worker's fill state (fw_mem) for the whole
 * model. */
static uint64_t fill_limit(gddr_ps *ps)
{
    if (ps->cfg.max_fill_bytes > 0)
        return (uint64_t)ps->cfg.max_fill_bytes;
    return ps_per_worker_bound(ps, 4, 6, 0);
}

ps_fillw *ps_fill_find(gddr_ps *ps, uint32_t rank, uint32_t id)
{
    if (rank >= (uint32_t)ps->cfg.max_workers)
        return NULL;
    ps_worker *w = &ps->workers[rank];
    return id < w->nfw ? w->fw[id] : NULL;
}

static ps_fillw *fill_get(gddr_ps *ps, uint32_t rank, ps_tensor *t, int bounded)
{
    ps_fillw *fw = ps_fill_find(ps, rank, t->id);
    if (fw)
        return fw;
    if (bounded && (uint64_t)ps_fill_bytes() + fw_mem(t->n, t->nchunks) > fill_limit(ps)) {
        static int said;
        if (!said++)
            gddr_log(GDDR_LOG_WARN, "max_fill_bytes reached: worker %u's held chunks of '%s' count as "
                     "zeros of their steps (no fill)", rank, t->key);
        return NULL;
    }
    ps_worker *w = &ps->workers[rank];
    if (t->id >= w->nfw) {
        size_t nn = ps->ntensors > t->id + 1 ? ps->ntensors : t->id + 1;
        ps_fillw **a = realloc(w->fw, nn * sizeof *a);
        if (!a)
            return NULL;
        memset(a + w->nfw, 0, (nn - w->nfw) * sizeof *a);
        w->fw = a;
        w->nfw = nn;
    }
    fw = calloc(1, sizeof *fw);
    if (fw) {
        fw->n = t->n;
        fw->nchunks = t->nchunks;
        fw->cred = calloc(t->n, sizeof(float));
        fw->held = calloc(t->nchunks, 1);
        fw->open = calloc(t->nchunks, 1);
        fw->seen = calloc(t->nchunks, sizeof *fw->seen);
    }
    if (!fw || !fw->cred || !fw->held || !fw->open || !fw->seen) {
        if (fw)
            free(fw->cred), free(fw->held), free(fw->open), free(fw->seen), free(fw);
        return NULL;
    }
    atomic_fetch_add(&fill_bytes, (long long)fw_mem(t->n, t->nchunks));
    w->fw[t->id] = fw;
    /* The first holder of t: the fresh-push sums, from this push on (after
     * the update in flight, which must not see them appear). */
    if (!t->facc) {
        ps_tensor_settle(ps, t);
        ps_fill_fresh_alloc(ps, t);
    }
    return fw;
}

ps_fillw *ps_fill_get(gddr_ps *ps, uint32_t rank, ps_tensor *t)
{
    return ps->cfg.fill_held ? fill_get(ps, rank, t, 1) : ps_fill_find(ps, rank, t->id);
}

void ps_fill_holding(ps_tensor *t, ps_fillw *fw)
{
    for (uint32_t i = 0; i < t->nholders; i++)
        if (t->holders[i] == fw)
            return;
    t->holders[t->nholders++] = fw;
}

void ps_fill_free_worker(gddr_ps *ps, ps_worker *w)
{
    for (size_t i = 0; i < w->nfw; i++) {
        ps_fillw *fw = w->fw[i];
        if (!fw)
            continue;
        if (i < ps->ntensors) {
            /* Out of the open step's holders (after its update in flight). */
            ps_tensor *t = ps->tensors[i];
            ps_tensor_settle(ps, t);
            for (uint32_t k = 0; k < t->nholders; k++)
                if (t->holders[k] == fw) {
                    t->holders[k] = t->holders[--t->nholders];
                    break;
                }
        }
        atomic_fetch_sub(&fill_bytes, (long long)fw_mem(fw->n, fw->nchunks));
        free(fw->cred);
        free(fw->held);
        free(fw->open);
        free(fw->seen);
        free(fw);
    }
    free(w->fw);
    w->fw = NULL;
    w->nfw = 0;
}

/* "fill/<rank>/<id>": u64 n, u64 nchunks, the credits, the holds of the
 * open step, the open holds (a byte a chunk; absent in checkpoints before
 * them, read as none open: a release then counts as fresh once). */
int ps_fill_sections(gddr_ps *ps, struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                     ps_add_section_fn add)
{
    for (int r = 0; r < ps->cfg.max_workers; r++) {
        ps_worker *w = &ps->workers[r];
        for (size_t i = 0; i < w->nfw && i < ps->ntensors; i++) {
            const ps_fillw *fw = w->fw[i];
            if (!fw)
                continue;
            uint64_t head[2] = { fw->n, fw->nchunks };
            size_t len = sizeof head + fw_bytes(fw->n, fw->nchunks);
            char *buf = malloc(len), *p = buf;
            if (!buf)
                return -1;
            memcpy(p, head, sizeof head), p += sizeof head;
            memcpy(p, fw->cred, fw->n * 4), p += fw->n * 4;
            memcpy(p, fw->held, fw->nchunks), p += fw->nchunks;
            memcpy(p, fw->open, fw->nchunks);
            char name[64];
            snprintf(name, sizeof name, "fill/%d/%zu", r, i);
            if (add(s, n, cap, name, buf, len) < 0) {
                free(buf);
                return -1;
            }
        }
    }
    return 0;
}

void ps_fill_restore(gddr_ps *ps, const struct gddr_ckpt *c)
{
    for (size_t i = 0; i < c->n; i++) {
        const gddr_ckpt_section *sec = &c->s[i];
        unsigned rank, id;
        uint64_t head[2];
        if (sscanf(sec->name, "fill/%u/%u", &rank, &id) != 2)
            continue;
        ps_tensor *t = id < ps->ntensors ? ps->tensors[id] : NULL;
        if (sec->len >= sizeof head)
            memcpy(head, sec->data, sizeof head);
        size_t base = sizeof head + (t ? t->n * 4 + t->nchunks : 0);
        if (!t || rank >= (uint32_t)ps->cfg.max_workers || sec->len < sizeof head ||
            head[0] != t->n || head[1] != t->nchunks ||
            (sec->len != base && sec->len != base + t->nchunks)) {
            gddr_log(GDDR_LOG_WARN, "checkpoint section %s does not fit the tensors: ignored", sec->name);
            continue;
        }
        /* Open credits are owed whatever fill_held and the bound say now. */
        ps_fillw *fw = fill_get(ps, rank, t, 0);
        if (!fw) {
            gddr_log(GDDR_LOG_ERROR, "checkpoint section %s: no room for worker %u's credits in '%s'",
                     sec->name, rank, t->key);
            continue;
        }
        const char *p = (const char *)sec->data + sizeof head;
        memcpy(fw->cred, p, t->n * 4), p += t->n * 4;
        memcpy(fw->held, p, t->nchunks), p += t->nchunks;
        if (sec->len == base + t->nchunks)
            memcpy(fw->open, p, t->nchunks);
        for (size_t k = 0; k < t->nchunks; k++)
            if (fw->held[k]) {
                ps_fill_holding(t, fw);
                break;
            }
    }
}
