/* orphan.c -- worker residual snapshots and orphan hand-off (DESIGN 7).
 * Filled in by the crash-safety work; until then a push that carries a
 * snapshot is refused with a clear reason rather than silently ignored. */
#include <stdio.h>

#include "snapshot.h"

int gddr_ps_snapshot_check(gddr_ps *ps, ps_tensor *t, const Gddr__Push *p, gddr__frames *f,
                           char *msg, size_t mlen)
{
    snprintf(msg, mlen, "this server does not keep residual snapshots yet");
    return GDDR_ENOTSUP;
}
void gddr_ps_snapshot_after_push(gddr_ps *ps, ps_tensor *t, uint32_t rank, const Gddr__Push *p,
                                 gddr__frames *f) {}
void gddr_ps_snapshot_worker_died(gddr_ps *ps, int rank) {}
void gddr_ps_snapshot_rejoined(gddr_ps *ps, uint32_t rank) {}
void gddr_ps_snapshot_offer_orphans(gddr_ps *ps, zmq_msg_t *ident, uint32_t rank) {}
void gddr_ps_snapshot_free(gddr_ps *ps) {}
int gddr_ps_orphan_sections(gddr_ps *ps, struct gddr_ckpt_section **s, size_t *n, size_t *cap,
                            gddr_ps_add_section_fn add) { return 0; }
void gddr_ps_orphan_restore(gddr_ps *ps, const struct gddr_ckpt *c) {}
