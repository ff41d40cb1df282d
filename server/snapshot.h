/* snapshot.h -- the parts of gddr-ps that outlive a message: checkpoints
 * (persist.c), worker residual snapshots and orphans (orphan.c), and the
 * operator side (ops.c: SIGHUP reload, the Prometheus endpoint). */
#ifndef GDDR_SERVER_SNAPSHOT_H
#define GDDR_SERVER_SNAPSHOT_H

#include "ps.h"

/* persist.c */
int ps_snapshot_restore(gddr_ps *ps, char *err, size_t errlen);
/* Writes a checkpoint when the interval passed, one was asked for, or
 * `final` is set (then it waits for the write to finish). */
void ps_checkpoint_tick(gddr_ps *ps, int final);
/* A checkpoint request: starts one, or joins the one in flight or due;
 * text gets the answer for the requester. */
void ps_checkpoint_request(gddr_ps *ps, char *text, size_t len);

/* orphan.c */
/* Checks a push's residual snapshot (layout, values, the memory bound)
 * before the push is taken, so that a bad one refuses the whole push;
 * GDDR_OK or an error code with msg filled. */
int ps_snapshot_check(gddr_ps *ps, ps_tensor *t, uint32_t rank, const Gddr__Push *p,
                           gddr__frames *f, char *msg, size_t mlen);
/* The push path's hook, once a push of rank to t was taken and answered
 * (f: the message that completed it): records what it says about the
 * worker's residual (its snapshot, the chunks it sent, orphans it
 * replayed, a return after a death), then hands the worker any orphan
 * waiting for a live worker, after its push reply. */
void ps_orphans_pushed(gddr_ps *ps, zmq_msg_t *ident, ps_tensor *t, uint32_t rank,
                            const Gddr__Push *p, gddr__frames *f);
void ps_snapshot_worker_died(gddr_ps *ps, int rank);
void ps_snapshot_free(gddr_ps *ps);
struct gddr_ckpt_section;
struct gddr_ckpt;
typedef int (*ps_add_section_fn)(struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                                      const char *name, void *data, uint64_t len);
/* Adds the residual snapshots to a checkpoint being built; -1 on no memory. */
int ps_orphan_sections(gddr_ps *ps, struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                            ps_add_section_fn add);
/* format: the checkpoint's meta format (1 stored snapshots dense). */
void ps_orphan_restore(gddr_ps *ps, const struct gddr_ckpt *c, int format);
typedef struct ps_orphan_counts {
    uint64_t handed, recovered;   /* orphans handed to survivors, and re-injected */
    double last_recovery_s;       /* last time from a death to its orphan re-injected */
    double held_l1, handed_l1, lost_l1; /* residual mass of dead workers: held, handed over, lost */
    uint64_t bytes;               /* snapshots and pending orphans */
} ps_orphan_counts;
void ps_orphan_stats(gddr_ps *ps, ps_orphan_counts *out);

/* fill.c: the fill credits in checkpoints ("fill/<rank>/<id>"). */
int ps_fill_sections(gddr_ps *ps, struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                     ps_add_section_fn add);
void ps_fill_restore(gddr_ps *ps, const struct gddr_ckpt *c);

/* table_persist.c: the sparse tables in checkpoints ("table/<i>" and
 * "trows/<i>", or "tdelta/<i>" and "tbase" in an incremental one; meta
 * format 4). sections: taken for checkpoint ps->ckpt_seq + 1 (pins its
 * base in the writer). load: gddr__ckpt_load_newest, and the base of an
 * incremental checkpoint into *base (base->n = 0: none); one whose base
 * cannot be loaded is skipped for the next older one. restore: ntables
 * from the meta section; -1 with err filled when a table's sections are
 * missing or damaged. */
int ps_tables_ckpt_sections(gddr_ps *ps, struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                            ps_add_section_fn add);
int ps_tables_ckpt_load(const char *dir, struct gddr_ckpt *c, struct gddr_ckpt *base, char *err,
                        size_t errlen);
int ps_tables_ckpt_restore(gddr_ps *ps, const struct gddr_ckpt *c, const struct gddr_ckpt *base,
                           uint64_t ntables, char *err, size_t errlen);
/* Tables the server holds. */
size_t ps_tables_count(gddr_ps *ps);
/* Each table's ranks' places in its sync steps (ps_sync_place's sstep),
 * max_workers values a table, into out / from in (the "syncplace" section
 * of a checkpoint: persist.c). */
void ps_tables_places_get(gddr_ps *ps, uint64_t *out);
void ps_tables_places_set(gddr_ps *ps, const uint64_t *in, size_t ntables, size_t per);

/* ops.c */
void ps_reload(gddr_ps *ps);
int ps_metrics_open(gddr_ps *ps, char *err, size_t errlen);
void ps_metrics_poll(gddr_ps *ps);

#endif
