/* members.c -- who counts as a worker now: the expected world, the live
 * ranks, the slowest live clock. Read by whatever waits for the workers
 * (sync steps, ssp pulls, the snapshot bound, the metrics); the changes
 * themselves -- hellos, byes, deaths -- are workers.c's. And the rules of
 * a sync step (syncstep.h): who it waits for (a new process is excused
 * until it pushes), where a worker's push goes by its own step numbers
 * (ps_sync_place: late pushes), and the aligner of sync steps after a
 * restore (ps_align_*), for tensors (sync.c) and tables (table_wire.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ps.h"
#include "syncstep.h"
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

/* The live workers, how many of them pushed() says are still to push, and
 * how many it excuses (pushed NULL: none counted). */
static int count_live(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, int *missing,
                      int *excused)
{
    int64_t now = gddr__now_ms();
    int exp = ps_expected_workers(ps), live = 0;
    *missing = *excused = 0;
    for (int r = 0; r < ps->cfg.max_workers; r++)
        if ((r < exp && rank_live(ps, r, now)) || (r >= exp && ps->workers[r].state == PS_W_LIVE)) {
            live++;
            int s = pushed ? pushed(ps, arg, r) : 1;
            *missing += s == 0;
            *excused += s < 0;
        }
    return live;
}

int ps_sync_rank(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, int r)
{
    int exp = ps_expected_workers(ps);
    int live = r < exp ? rank_live(ps, r, gddr__now_ms()) : ps->workers[r].state == PS_W_LIVE;
    return live ? pushed(ps, arg, r) : -2;
}

uint64_t ps_sync_place(uint64_t *sstep, int known, uint64_t last, uint64_t step, uint64_t open, int jump)
{
    uint64_t belongs = known && *sstep && step > last ? *sstep + (step - last) : open;
    if (belongs >= open) {
        *sstep = open; /* not known, or ahead of the steps here: it joins the open step */
        return 0;
    }
    *sstep = jump ? open - 1 : belongs;
    return open - belongs;
}

uint64_t ps_sync_place_late(uint64_t *sstep, uint64_t behind, uint64_t open)
{
    *sstep = behind < open ? open - behind : 0;
    return behind;
}

uint64_t ps_align_wanted(uint64_t last, uint64_t sstep, uint64_t open, int in_open)
{
    if (sstep && sstep <= open)
        return last + (open - sstep) + 1;
    return last + (in_open ? 0 : 1) + 1;
}

int ps_sync_tensor_pushed(const gddr_ps *ps, const void *arg, int r)
{
    const ps_tensor *t = arg;
    return t->contrib[r] ? 1 : ps_sync_excused(ps, r, t->seen[r]) ? -1 : 0;
}

int ps_sync_one_phase(const gddr_ps *ps, size_t ntables)
{
    return (ps->ntensors > 0) + ntables <= 1;
}

void ps_sync_stall_log(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, const char *kind,
                       const char *key, double waited_s)
{
    char who[256] = "";
    size_t len = 0;
    for (int r = 0; r < ps->cfg.max_workers && len < sizeof who - 16; r++)
        if (ps_sync_rank(ps, pushed, arg, r) == 0)
            len += (size_t)snprintf(who + len, sizeof who - len, " %d", r);
    gddr_log(GDDR_LOG_WARN, "%s '%s': the sync step waited %.1f s for rank(s)%s: closed as it is "
             "(sync_stall_s = %g; their pushes come late, none lost)", kind, key, waited_s, who,
             ps->cfg.sync_stall_s);
    ps->sync_stalls++;
}

int ps_sync_excused(const gddr_ps *ps, int r, uint64_t seen)
{
    uint64_t j = ps->workers[r].joined;
    return j && seen < j;
}

int ps_live_workers(gddr_ps *ps)
{
    int missing, excused;
    return count_live(ps, NULL, NULL, &missing, &excused);
}

int ps_sync_may_complete(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, int force, int *live)
{
    if (ps->replaying) {
        /* The push log's replay: a step completes where the log says it
         * did, dividing as it did then (pushlog.c), never on the clock. */
        *live = ps->replay_live;
        return ps->replay_live != 0;
    }
    return ps_sync_ready(ps, pushed, arg, live) || force;
}

int ps_sync_ready(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, int *live)
{
    int missing, excused, n = count_live(ps, pushed, arg, &missing, &excused);
    *live = n < 1 ? 1 : n;
    int waited = n - excused; /* the live workers this step waits for */
    if (ps->cfg.sync_quorum > 0 && ps->cfg.sync_quorum < waited)
        return waited - missing >= ps->cfg.sync_quorum;
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

/* ---- sync steps after a restore (the aligner: sync.c says what it is for) ---- */

void ps_align_free(ps_align *a)
{
    free(a->want);
    free(a->seen);
    memset(a, 0, sizeof *a);
}

void ps_align_begin(gddr_ps *ps, ps_align *a, uint64_t (*wanted)(gddr_ps *ps, const void *arg, int r),
                    const void *arg)
{
    ps_align_free(a);
    int mw = ps->cfg.max_workers;
    /* Without memory every push joins the open step, as a new session's do. */
    if (!(a->want = calloc((size_t)mw, sizeof *a->want)) || !(a->seen = calloc((size_t)mw, 1))) {
        gddr_log(GDDR_LOG_WARN, "no memory to line a restored sync step up");
        ps_align_free(a);
        return;
    }
    for (int r = 0; r < mw; r++)
        a->want[r] = wanted(ps, arg, r);
    a->on = 1;
}

uint64_t ps_align_push(gddr_ps *ps, ps_align *a, uint32_t rank, int same, uint64_t step, int has_open,
                       void (*close)(gddr_ps *ps, void *arg), void *arg, const char *kind, const char *key)
{
    if (!a->on)
        return 0;
    uint64_t stale = 0;
    if (same && a->want[rank]) {
        uint64_t want = a->want[rank] - 1 + a->open_j;
        if (step < want) {
            gddr_log(GDDR_LOG_INFO, "%s '%s': worker %u pushed step %llu after a restart, when the step "
                     "open here wants its step %llu: its step was lost or closed, it is late (mass in the open step)",
                     kind, key, rank, (unsigned long long)step, (unsigned long long)want);
            stale = want - step;
        } else if (step > want) {
            if (has_open) {
                gddr_log(GDDR_LOG_INFO, "%s '%s': worker %u pushed step %llu, past its step %llu the "
                         "step open here wants: that step closes with the push(es) it has",
                         kind, key, rank, (unsigned long long)step, (unsigned long long)want);
                close(ps, arg);
            }
            a->open_j = step - (a->want[rank] - 1);
        }
    }
    if (!a->seen[rank]) {
        a->seen[rank] = 1;
        a->nseen++;
    }
    if ((int)a->nseen >= ps_live_workers(ps))
        ps_align_free(a); /* every worker's steps line up again */
    return stale;
}
