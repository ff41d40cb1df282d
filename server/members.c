/* members.c -- who counts as a worker now: the expected world, the live
 * ranks, the slowest live clock. Read by whatever waits for the workers
 * (sync steps, ssp pulls, the snapshot bound, the metrics); the changes
 * themselves -- hellos, byes, deaths -- are workers.c's. */
#include <stdint.h>

#include "log.h"
#include "ps.h"
#include "residual.h"

int ps_expected_workers(const gddr_ps *ps)
{
    int n = ps->cfg.workers ? (int)ps->cfg.workers : ps->announced_world;
    return n < 1 ? 1 : n;
}

uint64_t ps_per_worker_bound(const gddr_ps *ps, uint64_t per_value, uint64_t per_chunk,
                             uint64_t per_bitmap)
{
    uint64_t model = 0;
    for (size_t i = 0; i < ps->ntensors; i++) {
        const ps_tensor *t = ps->tensors[i];
        model += t->n * per_value + t->nchunks * per_chunk + gddr_bitmap_bytes(t->nchunks) * per_bitmap;
    }
    return model * (uint64_t)ps_expected_workers(ps) + (1u << 20);
}

/* A rank counts as live when it is alive, or when it was never seen but the
 * run is young: a sync step must not complete with one worker just because
 * the others are still loading their data. */
static int rank_live(gddr_ps *ps, int r, int64_t now)
{
    ps_worker *w = &ps->workers[r];
    if (w->state != PS_W_NONE)
        return w->state == PS_W_LIVE;
    int64_t since = ps->first_hello_ms ? ps->first_hello_ms : now;
    if (now - since < (int64_t)(ps->cfg.worker_timeout_s * 1000))
        return 1;
    if (!w->absent_said && ps->first_hello_ms) {
        /* Said once: a worker that was never started (or started without
         * its --rank) is why sync steps now go on with fewer workers. */
        w->absent_said = 1;
        gddr_log(GDDR_LOG_WARN, "worker %d of the %d expected never said hello within worker_timeout_s "
                 "= %g s of the first: steps go on without it (started? with the right --rank and "
                 "--world?)", r, ps_expected_workers(ps), ps->cfg.worker_timeout_s);
    }
    return 0;
}

/* The live workers, and how many of them pushed() says nothing for yet
 * (pushed NULL: none counted). */
static int count_live(gddr_ps *ps, int (*pushed)(const void *arg, int r), const void *arg,
                      int *missing)
{
    int64_t now = gddr__now_ms();
    int exp = ps_expected_workers(ps), live = 0;
    *missing = 0;
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if ((r < exp && rank_live(ps, r, now)) || (r >= exp && ps->workers[r].state == PS_W_LIVE)) {
            live++;
            *missing += pushed && !pushed(arg, r);
        }
    return live;
}

int ps_live_workers(gddr_ps *ps)
{
    int missing;
    return count_live(ps, NULL, NULL, &missing);
}

int ps_sync_may_complete(gddr_ps *ps, int (*pushed)(const void *arg, int r), const void *arg, int force,
                         int *live)
{
    if (ps->replaying) {
        /* The push log's replay: a step completes where the log says it
         * did, dividing as it did then (pushlog.c), never on the clock. */
        *live = ps->replay_live;
        return ps->replay_live != 0;
    }
    return ps_sync_ready(ps, pushed, arg, live) || force;
}

int ps_sync_ready(gddr_ps *ps, int (*pushed)(const void *arg, int r), const void *arg, int *live)
{
    int missing, n = count_live(ps, pushed, arg, &missing);
    *live = n < 1 ? 1 : n;
    if (ps->cfg.sync_quorum > 0 && ps->cfg.sync_quorum < n)
        return n - missing >= ps->cfg.sync_quorum;
    return missing == 0;
}

uint64_t ps_min_live_clock(gddr_ps *ps)
{
    uint64_t m = UINT64_MAX;
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if (ps->workers[r].state == PS_W_LIVE && ps->workers[r].clock < m)
            m = ps->workers[r].clock;
    return m;
}
