/* syncstep.h -- who a sync step waits for, where a worker's push goes
 * (members.c), and the stall net (sync.c): the rules in docs/protocol.md,
 * "Sync and ssp modes" and "Late pushes". */
#ifndef GDDR_SYNCSTEP_H
#define GDDR_SYNCSTEP_H

#include "ps.h"

/* Whether a step waits for rank r (ps_sync_pushed_fn answers): 1 it pushed
 * to the step, 0 it is still to push, -1 it is excused -- a new process
 * that took the rank mid-run and has not pushed to this tensor or table
 * since (seen: ps->joins at its last push there). A new process starts its
 * loop at the top, whatever phase the others are in: waited for in a
 * table's step before it pushed there, it would wait for them in the
 * tensors' step while they wait for it (docs/protocol.md, "A new process
 * mid-run"). */
typedef int (*ps_sync_pushed_fn)(const gddr_ps *ps, const void *arg, int r);
int ps_sync_excused(const gddr_ps *ps, int r, uint64_t seen);
/* Which step of a tensor or table a worker's sync push belongs to: the one
 * after the step its last push here belonged to (*sstep; step numbers are
 * the worker's own, step and last), counted by the worker's own steps --
 * or the open one (open: the step being collected) when that is not known
 * (first push, a new process, after a restore). Returns how many of the
 * worker's steps completed here without it before this one (0: the push
 * joins the open step): such a push is late, its values join the open
 * step as mass, not as the worker's push of it, and it is answered at
 * once (docs/protocol.md, "Late pushes"). Sets *sstep: jump (one phase
 * here: ps_sync_one_phase) places the worker's next push in the open step
 * -- it skips the steps it missed; otherwise each of its later pushes is
 * late until its own numbers reach the open step, which keeps its place
 * in every tensor and table alike. */
uint64_t ps_sync_place(uint64_t *sstep, int known, uint64_t last, uint64_t step, uint64_t open, int jump);
/* A push the restore aligner found `behind` steps before the open one:
 * its place (*sstep) is there. Returns behind. */
uint64_t ps_sync_place_late(uint64_t *sstep, uint64_t behind, uint64_t open);
/* The restore aligner's want for a rank (ps_align_begin's wanted(), + 1):
 * the step of the rank (last: its recorded push's) that the restored open
 * step wants -- by its place (sstep, from the checkpoint's "syncplace")
 * when known, else as if its last push was on time (in_open: that push is
 * in the open step). */
uint64_t ps_align_wanted(uint64_t last, uint64_t sstep, uint64_t open, int in_open);
/* Whether sync steps here have one phase (tensors only, stepped together,
 * or one table only): then a late worker skips the steps it missed. */
int ps_sync_one_phase(const gddr_ps *ps, size_t ntables);
/* For the metrics (gddr_sync_step_rank): pushed()'s answer for rank r
 * when it counts as live, -2 when it does not count. */
int ps_sync_rank(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, int r);
/* pushed() of a tensor's open sync step. */
int ps_sync_tensor_pushed(const gddr_ps *ps, const void *arg, int r);
/* Whether a sync step may complete: every live worker not excused has
 * pushed to it, or sync_quorum of them when that is fewer -- not a count
 * of pushes equal to the live workers, which a worker that pushed and then
 * left would satisfy without the ones still to push. *live gets the live
 * workers (at least 1; the excused among them). */
int ps_sync_ready(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, int *live);
/* ps_sync_ready, or force; while the push log replays, only where the log
 * says a step completed (ps->replay_live, the live workers it divided by). */
int ps_sync_may_complete(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, int force, int *live);
/* The stall net (sync.c): closes, as it is, a sync step that has waited
 * about sync_stall_s for live workers, and forgets the workers' places on
 * it (the tensors together, or one table); called every 200 ms. */
void ps_sync_stalls(gddr_ps *ps);
/* Logs why a step of `kind` `key` closes after waiting `waited_s`, with the
 * ranks pushed() says it waited for, and counts it (members.c). */
void ps_sync_stall_log(gddr_ps *ps, ps_sync_pushed_fn pushed, const void *arg, const char *kind,
                       const char *key, double waited_s);

/* The "syncplace" checkpoint section (syncplace.c): a malloc'd copy of
 * the ranks' places (NULL outside sync mode or without memory), and its
 * restore, for ranks whose exactly-once records came back. */
struct gddr_ckpt_section;
void *ps_places_section(gddr_ps *ps, uint64_t *len);
void ps_places_restore(gddr_ps *ps, const struct gddr_ckpt_section *sec);

#endif
