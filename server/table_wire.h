/* table_wire.h -- sparse embedding tables on the wire (table_wire.c). */
#ifndef GDDR_PS_TABLE_WIRE_H
#define GDDR_PS_TABLE_WIRE_H

#include "gddr.pb-c.h"
#include "wire.h"

struct gddr_ps;

/* Request handlers (dispatch() in server.c); worker: a worker that holds
 * its rank asks (else an observer or a stranger: it may look up a table
 * and pull without creating rows). */
int ps_on_init_table(struct gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, int worker);
int ps_on_pull_rows(struct gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f,
                    int worker);
int ps_on_push_rows(struct gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f);

/* A worker came or went: sync steps of tables may complete. */
void ps_tables_membership_changed(struct gddr_ps *ps);
/* After a restore: the tables' open sync steps lined up with each rank's
 * own step numbers (members.c ps_align_push; why: sync.c). */
void ps_tables_sync_restored(struct gddr_ps *ps);
/* Answers parked row pulls whose version exists or whose time is up. */
void ps_tables_release_pulls(struct gddr_ps *ps);
/* Milliseconds until the next parked row pull's deadline (at most cap). */
int ps_tables_next_timeout(struct gddr_ps *ps, int cap);
/* The tables' Prometheus families (malloc'd; NULL: no memory). */
char *ps_tables_metrics_text(struct gddr_ps *ps);
/* The tables' part of ps_sync_stalls (sync.c): when the oldest open sync
 * step of a table got its first push (now: none); closing the oldest one
 * open longer than lim ms as it is, forgetting every rank's place on it. */
int64_t ps_tables_sync_oldest(struct gddr_ps *ps, int64_t now);
void ps_tables_sync_stall(struct gddr_ps *ps, int64_t now, int64_t lim);
void ps_tables_free(struct gddr_ps *ps);

/* The push log's replay: completes table id's open sync step as it was
 * completed then, dividing by live (pushlog.c). */
void ps_table_sync_replay(struct gddr_ps *ps, uint32_t id, int live);

#endif
