/* table_wire_int.h -- the per-server set of tables, shared by table_wire.c
 * (the requests) and table_persist.c (checkpoints); nothing else includes
 * it. */
#ifndef GDDR_PS_TABLE_WIRE_INT_H
#define GDDR_PS_TABLE_WIRE_INT_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "gddr.pb-c.h"
#include "ps.h"
#include "table.h"

struct gddr_ps;

/* A rank's push of the sync step being collected, kept until the step
 * completes (its values already scaled by AdaDelay's factor). */
typedef struct tw_push {
    uint64_t *keys;
    float *vals;
    size_t n;
    double lr;          /* the push's own lr (0: the table's); in checkpoints from table format 2 */
    int have;           /* the rank's push of the step is in */
    int mass;           /* late pushes of the rank are in (not its push of the step: ps_sync_place) */
} tw_push;

/* Exactly once: the last step taken from a rank's session, and its answer. */
typedef struct tw_rec {
    uint64_t session, step, version, sync_target, staleness;
    uint8_t set, applied, mode;
    uint64_t seen;      /* ps->joins at this push (ps_sync_excused); not checkpointed */
    uint64_t sstep;     /* the sync step here it belonged to (ps_sync_place); not checkpointed */
} tw_rec;

/* The registration's optimizer, as InitTable gave it. */
typedef struct tw_opt {
    double lr;          /* the registration's lr; 0: the server's [optimizer] lr */
    int opt_given;      /* InitTable named an optimizer */
    Gddr__OptimizerKind kind;
    double beta1, beta2, eps;
} tw_opt;

typedef struct ps_stable {
    char key[128];
    uint32_t id;
    ps_table *tab;
    tw_opt o;
    tw_push *step;      /* per rank (max_workers) */
    uint32_t ncontrib;
    tw_rec *rec;        /* per rank */
    ps_align align;     /* sync steps after a restore (ps_tables_sync_restored) */
    int64_t step_opened_ms; /* when the open sync step got its first push (sync_stall_s) */
    ps_rowsum *sum;
    uint64_t pushes, pulls, rows_pulled, rows_pushed, duplicates; /* metrics, checkpointed */
} ps_stable;

/* A row pull waiting for a table version. */
typedef struct tw_pull {
    zmq_msg_t ident;
    uint64_t req_id, min_version;
    uint64_t *keys;
    size_t n;
    uint32_t table;
    int create;
    int64_t deadline_ms;
} tw_pull;

struct ps_tables {
    ps_stable **t;
    size_t n;
    uint64_t rows;      /* live rows of every table (the server's cap) */
    uint64_t bytes;     /* and their bytes (row_bytes each: max_table_bytes) */
    tw_pull *pulls;
    size_t npulls, cap_pulls;
    uint64_t *kbuf;     /* keys copied out of a frame that is not 8-aligned */
    size_t kcap;
    /* Incremental checkpoints (table_persist.c): the full copy deltas are
     * taken against (a checkpoint seq on disk; 0: none, the next is full),
     * the one before it or the checkpoint restored (kept for a fallback),
     * a full copy handed to the writer and not known on disk yet, and the
     * deltas taken since the base. */
    uint64_t base_seq, prev_base, pending_base;
    uint32_t ndeltas;
};

/* Adds table `key` (not registered yet) with configuration c and the
 * registration's optimizer o: id ps->tables->n, empty, version 0. NULL
 * when out of memory (ps->tables is created if need be). */
ps_stable *ps_tables_add(struct gddr_ps *ps, const char *key, const ps_table_conf *c,
                         const tw_opt *o);
/* pushed() of a table's open sync step (ps_sync_ready): 1 the rank's push
 * of it is in, 0 waited for, -1 excused. */
int ps_table_step_pushed(const struct gddr_ps *ps, const void *arg, int r);

#endif
