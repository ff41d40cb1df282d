/* snapshot.h -- the parts of gddr-ps that outlive a message: checkpoints
 * (persist.c), worker residual snapshots and orphans (orphan.c), and the
 * operator side (ops.c: SIGHUP reload, the Prometheus endpoint). */
#ifndef GDDR_SERVER_SNAPSHOT_H
#define GDDR_SERVER_SNAPSHOT_H

#include "ps.h"

/* persist.c */
int gddr_ps_snapshot_restore(gddr_ps *ps, char *err, size_t errlen);
/* Writes a checkpoint when the interval passed, one was asked for, or
 * `final` is set (then it waits for the write to finish). */
void gddr_ps_checkpoint_tick(gddr_ps *ps, int final);

/* orphan.c */
int gddr_ps_snapshot_check(gddr_ps *ps, ps_tensor *t, const Gddr__Push *p, gddr__frames *f,
                           char *msg, size_t mlen);
void gddr_ps_snapshot_after_push(gddr_ps *ps, ps_tensor *t, uint32_t rank, const Gddr__Push *p,
                                 gddr__frames *f);
void gddr_ps_snapshot_worker_died(gddr_ps *ps, int rank);
void gddr_ps_snapshot_rejoined(gddr_ps *ps, uint32_t rank);
void gddr_ps_snapshot_offer_orphans(gddr_ps *ps, zmq_msg_t *ident, uint32_t rank);
void gddr_ps_snapshot_free(gddr_ps *ps);
struct gddr_ckpt_section;
struct gddr_ckpt;
typedef int (*gddr_ps_add_section_fn)(struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                                      const char *name, void *data, uint64_t len);
/* Adds the residual snapshots to a checkpoint being built; -1 on no memory. */
int gddr_ps_orphan_sections(gddr_ps *ps, struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                            gddr_ps_add_section_fn add);
void gddr_ps_orphan_restore(gddr_ps *ps, const struct gddr_ckpt *c);
void gddr_ps_orphan_stats(gddr_ps *ps, uint64_t *handed, uint64_t *recovered, double *last_s);

/* ops.c */
void gddr_ps_reload(gddr_ps *ps);
int gddr_ps_metrics_open(gddr_ps *ps, char *err, size_t errlen);
void gddr_ps_metrics_poll(gddr_ps *ps);

#endif
