/* pushlog.h -- the push log ([durability] push_log): every request that
 * changes the model between two checkpoints, appended to checkpoint_dir
 * and replayed at a restart (pushlog.c says how). */
#ifndef GDDR_PUSHLOG_H
#define GDDR_PUSHLOG_H

#include <stddef.h>
#include <stdint.h>

#include "gddr.pb-c.h"
#include "wire.h"

enum { PS_PLOG_OFF = 0, PS_PLOG_BATCH = 1, PS_PLOG_ALWAYS = 2 };

struct gddr_ps;
typedef struct ps_plog ps_plog;

/* Counters for the metrics. */
typedef struct ps_plog_stats {
    uint64_t records, bytes, syncs;    /* appended, written; fdatasyncs */
    uint64_t appended_lsn, durable_lsn;
    uint64_t replayed, replay_ms;      /* at the start */
    uint64_t torn_records, torn_bytes; /* cut from a torn tail at the start */
    uint64_t gap;                      /* 1: records were missing after the checkpoint */
    uint64_t held_replies;             /* always: replies waiting for their sync now */
    uint64_t waits;                    /* batch: times the front thread waited for the writer */
    int write_error;                   /* an errno the writer met (0: none) */
} ps_plog_stats;

/* At start, after the checkpoint is restored: replays the log's records
 * after ckpt_lsn (the checkpoint's "plog" section) through `replay` (the
 * server's handlers, server.c), cuts a torn tail, and
 * opens the next segment. With push_log = off, moves old segments aside
 * (a later start with the log on must not replay them). */
typedef void (*ps_plog_replay_fn)(struct gddr_ps *ps, gddr__frames *f, const Gddr__Request *rq,
                                  uint64_t session);
/* Events: what changed the state between requests, on a clock -- a sync
 * step completed (of tensor or table id, with arg = the live workers it
 * divided by) and a worker declared dead (id = rank). A replay applies
 * them where they were, and completes no sync step on its own. */
enum { PS_PLOG_EV_SYNC = 1, PS_PLOG_EV_TABLE_SYNC = 2, PS_PLOG_EV_DEAD = 3 };
typedef void (*ps_plog_event_fn)(struct gddr_ps *ps, uint32_t type, uint32_t id, uint64_t arg);
int ps_plog_open(struct gddr_ps *ps, uint64_t ckpt_lsn, ps_plog_replay_fn replay,
                 ps_plog_event_fn event, char *err, size_t errlen);
/* Appends a request just accepted (its frames but the identity, and the
 * session it speaks for); returns its LSN, 0 when the log is off. */
uint64_t ps_plog_append(struct gddr_ps *ps, const gddr__frames *f, uint64_t session);
/* Appends an event (PS_PLOG_EV_*) at this point of the log. */
void ps_plog_event(struct gddr_ps *ps, uint32_t type, uint32_t id, uint64_t arg);
/* always: takes a reply that must wait until everything logged so far is
 * on disk (1; its frames are taken), or 0 when it can go now (the caller
 * sends it). */
int ps_plog_hold(struct gddr_ps *ps, zmq_msg_t *ident, void *hdr, size_t hlen, const gddr__raw *raws,
                 int nraw);
/* Front thread: sends the held replies whose records are on disk. */
void ps_plog_poll(struct gddr_ps *ps);
/* The file descriptor the front thread polls (the writer signals it), -1. */
int ps_plog_fd(struct gddr_ps *ps);
/* The LSN a checkpoint taken now holds; the log goes on in a new segment. */
uint64_t ps_plog_rotate(struct gddr_ps *ps);
/* A checkpoint was written: segments older than the oldest kept one go. */
void ps_plog_prune(struct gddr_ps *ps);
void ps_plog_stats_get(struct gddr_ps *ps, ps_plog_stats *st);
/* Writes and syncs what is buffered, sends what is held, stops the writer. */
void ps_plog_close(struct gddr_ps *ps);

#endif
