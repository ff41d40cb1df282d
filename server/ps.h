/* ps.h -- the state of one gddr-ps instance, shared by its files.
 *
 * Names: every function and variable of the daemon is ps_* (its types
 * gddr_ps and gddr_ps_config, which tools and tests see, keep the
 * project's prefix).
 *
 * Threads: one front thread owns the ROUTER socket and every field below;
 * it validates each request, then either answers it (pull, stats) or
 * hands its update to the apply pool (apply.c) and answers at once: the
 * version a push makes is decided when it is handed over, and the update
 * runs while the front thread receives the next message. A tensor has at
 * most one update in flight (ps_tensor.pending); whatever reads or writes
 * its values -- a pull reply, the next update, a checkpoint -- first waits
 * for it (ps_tensor_settle). So a pull never sees half a push, and never
 * an older version than its header says. Besides the pool's jobs, the only
 * state other threads touch is a connection's queued-byte count and the
 * reference counts of connections and version buffers, which ZeroMQ's I/O
 * thread drops (atomically) when it is done sending a reply (conn.c).
 *
 * Files, each calling only those listed after it (no file calls back
 * into one that calls it):
 *   main.c      the daemon: command line, config, signals
 *   server.c    the front thread: loop, dispatch, registrations
 *   push.c      the Push request: checks, exactly-once, apply or collect
 *   ops.c       SIGHUP reload, the HTTP metrics endpoint
 *   stats.c     staleness statistics, the Prometheus text
 *   persist.c   what goes in a checkpoint and when (snapshot.h)
 *   table_persist.c  sparse tables in checkpoints (snapshot.h)
 *   workers.c   who is a worker: hello, sessions, exactly-once records,
 *               byes and deaths
 *   sync.c      sync steps, the flushes waiting for them, what a change
 *               of membership unblocks
 *   conn.c      per-peer accounting, zero-copy pull replies, parked pulls
 *   orphan.c    residual snapshots and orphans (snapshot.h)
 *   parts.c     pushes in parts
 *   auth.c      CURVE: the allowlist, ZAP, the handshake monitor
 *   members.c   who counts now: expected and live workers, slowest clock
 *   tensor.c    tensors and their version buffers, settling updates
 *   apply.c     the apply pool
 *   reply.c     reply headers, sending, refusals
 *   fill.c      held chunks in sync steps: per-worker credits (fill_held)
 *   optim.c     the optimizers' update loops (sgd, adam, adamw, adagrad)
 *   tau.c       the dynamic tau controller
 *   checkpoint_{format,read,write}.c  the checkpoint files (checkpoint.h)
 *   config.c    the config table and file (config.h)
 */
#ifndef GDDR_SERVER_PS_H
#define GDDR_SERVER_PS_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <zmq.h>

#include "config.h"
#include "gddr_base.h"
#include "keys.h"
#include "wire.h"

#define PS_HIST 17 /* staleness buckets 0..15 and >= 16 */

/* Running staleness statistics (global, per worker). */
typedef struct ps_stale {
    uint64_t count, max, sum;
    double ema;
    uint64_t hist[PS_HIST];
} ps_stale;

/* A tensor's values. The tensor holds one reference to its current buffer;
 * every pull reply in flight holds another, released by ZeroMQ's I/O thread
 * once the bytes are sent. A buffer some reply still holds is never written:
 * the next update goes into a fresh (or recycled) buffer instead (copy on
 * write), so replies need no copy and are never torn. */
typedef struct ps_vbuf {
    atomic_int refs;
    size_t bytes;
    float *data;
} ps_vbuf;

/* A flush push (a closing GDDR worker's held residual) that arrived while a
 * sync step was being collected; applied right after that step. */
typedef struct ps_flush {
    float *vals;
    uint8_t *bitmap;      /* NULL: dense */
    float vscale;         /* the payload's scale (AdaDelay's factor); applied with
                           * 1/(the workers of the step it follows) */
    double lr;            /* the flush push's lr (0: the tensor's) */
    uint32_t rank;        /* whose (its fill credits are taken off) */
    struct ps_flush *next;
} ps_flush;

/* A tensor's optimizer (optim.c). explicit_ = 0: the server's [optimizer]
 * section decides, and follows its SIGHUP reloads; 1: the registration
 * named it and the tensor keeps it. */
enum { PS_OPT_SGD = 0, PS_OPT_ADAM = 1, PS_OPT_ADAMW = 2, PS_OPT_ADAGRAD = 3, PS_OPT_KINDS = 4 };
/* async_fill: what an async held chunk is stepped with (apply.c). */
enum { PS_AFILL_RECENT = 0, PS_AFILL_MOMENT = 1 };
typedef struct ps_optim {
    int kind, explicit_;
    double lr, momentum, beta1, beta2, eps, weight_decay;
} ps_optim;

/* One update's optimizer arguments, computed on the front thread. */
typedef struct ps_upd {
    int kind;
    float lr;             /* the step size: lr_eff */
    float mu, b1, b2, eps, wd;
    float bc1, bc2;       /* Adam's bias corrections 1/(1-b^k) for the version k it makes */
    float mh;             /* 1/(1-b1^(k-1)): m's bias correction before it (0 at k = 1) */
} ps_upd;

/* What fill (fill.c) keeps per worker and tensor: the credit, in gradient
 * units, of every value the server filled in for this worker while it held
 * the chunk, and how often it held each chunk in the sync step being
 * collected (granted as credit when the step completes). */
typedef struct ps_fillw {
    size_t n, nchunks;    /* the tensor's */
    float *cred;          /* n floats */
    uint8_t *held;        /* per chunk: holds in the open step */
    uint8_t *open;        /* per chunk: held since it last sent it (its next push of it
                           * is a release: its own gradients minus the credits) */
    uint32_t *seen;       /* per chunk (async_fill = recent): the stamp (t->fcnt) of the
                           * fresh values it was last filled with; not in checkpoints */
} ps_fillw;

/* Sync steps after a restore (members.c ps_align_*, explained in sync.c),
 * for a tensor or a table, from the restore until every live worker pushed
 * it again (`on`): want[r] - 1 is the Push.step of rank r (0: unknown)
 * that the step restored open wanted, and open_j how many steps after that
 * one the open step is (the owner counts each step it completes); seen:
 * per rank, pushed since the restore (nseen of them). The arrays live only
 * while `on`. */
typedef struct ps_align {
    uint64_t *want;
    uint8_t *seen;
    uint32_t nseen;
    uint64_t open_j;
    uint8_t on;
} ps_align;

typedef struct ps_tensor {
    char key[128];
    uint32_t id;
    size_t n;
    size_t nchunks;
    uint32_t chunk;    /* elements per chunk; the last may be short */
    ps_vbuf *cur;      /* the values of `version` */
    float *w;          /* = cur->data; changes only when an update is settled */
    ps_optim opt;      /* its optimizer (explicit_ 0: the server's section) */
    float *s1, *s2;    /* optimizer state, NULL until used: sgd momentum v;
                        * adam/adamw m and v; adagrad's sum of squares G */
    uint64_t version;  /* updates applied or in flight (the values are this
                        * version's once the tensor is settled) */
    struct ps_task *pending; /* the update in flight, NULL when settled */
    struct ps_vbuf *pending_fresh; /* where it writes, when not in place */
    int64_t *off;      /* per chunk: payload offset of the update in flight */
    uint64_t *mod;     /* per chunk: the version that last changed it (lazy pulls) */
    uint32_t keyhash;  /* gddr_key_hash(key): names it in the lazy-pull hold mask */
    /* sync: the step being collected */
    float *acc;        /* sum of f * g of this step's pushes (f: AdaDelay's factor
                        * 1/(1+adadelay*tau), minus fill credits) */
    uint8_t *touched;  /* per chunk: some push of this step carried it */
    uint32_t *cnt;     /* per chunk: pushes of this step that count in its mean
                        * (all but those holding it back under fill) */
    float *facc;       /* fill for adam, adamw, adagrad (fill.c): per value, the sum of
                        * this step's fresh pushes (from workers holding nothing of the
                        * chunk back since they last sent it); in async and ssp mode
                        * (adam, adamw, async_fill = recent) the last fresh push's
                        * values instead. NULL until a worker first held a chunk of it */
    uint32_t *fcnt;    /* per chunk: how many fresh pushes facc holds (async: 0 none, else
                        * a stamp of the push that wrote it, the tensor's version after it) */
    uint32_t *fsrc;    /* per chunk (async): the rank whose push wrote facc */
    double step_lr;    /* the lr of the step's last push (0: the tensor's) */
    ps_fillw **holders; /* fill states of the workers holding chunks in this step
                         * (max_workers entries; fill.c) */
    uint32_t nholders;
    ps_fillw **holders_alt; /* the completed step's, read by its update in flight */
    uint8_t *contrib;  /* per rank: pushed in this step */
    uint64_t *seen;    /* per rank: ps->joins at its last push here (ps_sync_excused) */
    uint64_t *sstep;   /* per rank: the step here its last push belonged to (0: not known; ps_sync_place) */
    int64_t step_opened_ms; /* when the open sync step got its first push (sync_stall_s) */
    uint32_t ncontrib; /* distinct ranks in this step */
    uint32_t npushes;  /* pushes folded into this step */
    uint32_t sync_divisor; /* workers the last completed step averaged over */
    ps_align align; /* sync steps after a restore (sync.c) */
    ps_flush *flushes; /* flushes waiting for the step to complete */
    uint32_t nflushes;
    /* dynamic tau */
    int tau;
    double norm_ema, rate_ema;
    int calm;
    double *tau_pend; /* sync: per rank, the norm of its push to the open step, fed to the
                       * controller at the step's close in rank order (0 = none; tau.c) */
    uint32_t tau_pend_n; /* ranks below this may have one */
} ps_tensor;

/* What the server remembers of one worker's pushes to one tensor: the last
 * step it took (exactly once) and that push's answer, and the residual mass
 * the worker last said it holds there. */
typedef struct ps_wtensor {
    uint64_t step;
    uint64_t version, sync_target, staleness;
    uint8_t set, applied, mode;
    float residual_l1;
} ps_wtensor;

enum { PS_W_NONE = 0, PS_W_LIVE, PS_W_DEAD, PS_W_LEFT };

typedef struct ps_worker {
    int state;          /* PS_W_* */
    int restored;       /* live from a checkpoint, no hello since: any session may claim it */
    int absent_said;    /* logged that this expected rank never came */
    int held_said;      /* logged that a second process asked for this rank */
    uint64_t session;   /* the owner's session (kept after a death, to recognise it) */
    uint64_t ckpt_session; /* its session in the restored checkpoint (0: none): sync.c */
    uint64_t joined;    /* ps->joins when a new process took this rank mid-run (0: from the start) */
    int64_t last_seen_ms;
    uint64_t clock;     /* steps pushed: highest step + 1 */
    uint64_t pushes, duplicates;
    ps_stale stale;
    ps_wtensor *wt;     /* per tensor id, grown on demand */
    size_t nwt;
    struct ps_pview **pv; /* per tensor id: this worker's view for lazy pulls (conn.c) */
    size_t npv;
    ps_fillw **fw;        /* per tensor id: fill credits (fill.c), NULL until it held a chunk */
    size_t nfw;
    char client[64];    /* what its hello said it is (escaped), for logs */
} ps_worker;

/* One peer connection of the ROUTER, by routing id (conn.c). */
typedef struct ps_conn {
    atomic_int refs;              /* the table's, and one per reply in flight */
    atomic_llong queued;          /* reply bytes handed to ZeroMQ, not yet sent */
    uint32_t parked;              /* pulls of this peer parked */
    int64_t last_ms;              /* last message from it */
    uint64_t session;             /* stands for Request.session when that is 0 */
    uint8_t idlen;
    uint8_t id[255];
    struct ps_conn *next;         /* hash chain */
} ps_conn;

typedef struct ps_pull {
    zmq_msg_t ident;
    ps_conn *conn;               /* holds a reference */
    uint64_t req_id;
    uint32_t rank, id;
    uint64_t min_version, step;
    uint64_t part_bytes;         /* answer in parts of this size (0: whole) */
    float lazy;                  /* > 0: a lazy reply (Pull.delay_fraction), the owner's */
    int full;                    /* lazy: Pull.full */
    uint64_t view_seq;           /* lazy, delta: Pull.view_seq */
    int bits;                    /* 8 or 16: a delta reply (Pull.delta_bits), the owner's */
    int64_t deadline_ms;
    int64_t parked_us;           /* when it was parked (PullReply.parked_us) */
} ps_pull;

/* Counters of rejected requests, by reason (gddr_err code). */
#define PS_NERR 32

typedef struct ps_pool ps_pool;
struct ps_conns;

/* CURVE allowlist entry (auth.c, common/keys.h). */
typedef gddr__authkey ps_key;

typedef struct gddr_ps {
    gddr_ps_config cfg;
    char cfg_path[4096];
    void *zctx, *router, *metrics;
    char endpoint[256];
    uint64_t epoch;
    int64_t start_ms, first_hello_ms;
    uint64_t joins;     /* new processes that took a rank mid-run (ps_worker.joined) */

    ps_tensor **tensors;
    size_t ntensors;

    int warmup_over;      /* hybrid: the async warm-up has ended (for every tensor) */
    ps_worker *workers;   /* cfg.max_workers entries */
    int announced_world;  /* largest world_size in an accepted hello */

    struct ps_conns *conns; /* conn.c */
    ps_pull *pulls;
    size_t npulls, cap_pulls;

    ps_pool *pool;
    struct ps_plog *plog;   /* the push log (pushlog.c), NULL when off */
    uint64_t plog_lsn0;     /* push log off: the LSN the restored checkpoint held */
    int hold_replies;       /* push_log = always, handling a logged request: its replies wait */
    int replaying;          /* the push log is being replayed: no replies go out */
    /* push_log = always (pushlog.c ps_plog_hold): takes a reply that must
     * wait for what was logged to be on disk; 0 when it may go now. NULL
     * when the log is not on. */
    int (*hold_reply)(struct gddr_ps *ps, zmq_msg_t *ident, void *hdr, size_t hlen, const gddr__raw *raws,
                      int nraw);
    /* The push log's events (pushlog.h PS_PLOG_EV_*): a sync step completed,
     * a worker declared dead; NULL when the log is not on. */
    void (*log_event)(struct gddr_ps *ps, uint32_t type, uint32_t id, uint64_t arg);
    int replay_live;        /* replaying a completed sync step: the live workers it divided by */
    struct ps_partial *partials; /* pushes in parts still arriving (parts.c) */
    int64_t *offbuf;      /* per-chunk offsets of the push being applied */
    size_t offcap;
    double *sqbuf;        /* per-chunk sums of squares of the push being validated */
    size_t sqcap;

    /* metrics */
    uint64_t pushes, pulls_served, inits, bytes_in, bytes_out, versions_total;
    uint64_t sync_stalls; /* sync steps closed as they were after sync_stall_s (sync.c) */
    int64_t stall_quiet_ms; /* no stall close before this (sync.c ps_sync_stalls) */
    uint64_t duplicates;
    uint64_t push_chunks_sent, push_chunks_held; /* chunks of taken pushes, by presence */
    uint64_t validated_in_apply; /* pushes whose payload was checked in the read that applied it */
    int momentum_warned;                         /* sync + momentum + GDDR pushes: said once */
    uint64_t push_parts, pull_parts; /* messages of pushes and pulls in parts */
    uint64_t lazy_pulls, lazy_chunks_held, lazy_chunks_sent, lazy_chunks_same; /* lazy pulls */
    uint64_t delta_pulls, delta_chunks;  /* delta replies, and the chunks they encoded */
    uint64_t pview_refused;              /* lazy or delta pulls answered whole: max_pull_view_bytes */
    uint64_t pview_resyncs;              /* lazy or delta pulls answered whole: a reply was lost */
    uint64_t rejected[PS_NERR];
    uint64_t deaths, rejoins;
    uint64_t reloads, reload_failures; /* SIGHUPs handled: applied / refused (ops.c) */
    ps_stale stale;
    int alarm_on;
    int64_t last_refusal_log_ms;  /* refusals are logged at most once a second */
    uint64_t refusals_unlogged;

    /* checkpoints */
    struct gddr_ckpt_writer *ckw;
    uint64_t ckpt_seq;
    int64_t last_ckpt_ms;       /* the interval counts from here */
    int64_t ckpt_started_ms;    /* the last checkpoint started (0: none yet) */
    uint64_t ckpt_count, ckpt_requests, ckpt_joined;
    double ckpt_last_ms, ckpt_copy_ms;
    int ckpt_pending, final_ckpt_rc;
    /* CRC32C of the state the last written checkpoint holds, and of the one
     * being written: a periodic checkpoint of the same state is skipped. */
    uint32_t ckpt_state_crc, ckpt_pending_crc;
    uint64_t ckpt_pending_pushes, ckpt_pending_tensors; /* ps->pushes, ntensors + tables at its copy */
    int ckpt_state_known;
    uint64_t ckpt_skipped;
    int64_t ckpt_done_ms;       /* the state on disk was last confirmed current (0: never) */

    /* residual snapshots and orphans (orphan.c) */
    struct ps_orphans *orphans;

    /* sparse embedding tables (table_wire.c) */
    struct ps_tables *tables;

    /* CURVE allowlist and handshake monitor (auth.c) */
    void *zap, *monitor;
    ps_key *allow;
    int nallow;
    uint64_t auth_rejected, handshake_failed;

    /* command-line overrides ("key=value" or "section.key=value"), applied
     * again on top of the file at every SIGHUP */
    char **overrides;
    int noverrides;

    void (*tick)(struct gddr_ps *); /* called every loop turn (watchdog) */
    volatile sig_atomic_t stop, reload, ckpt_now;
} gddr_ps;

/* server.c: the front thread (loop, dispatch, registrations, pushes). */
int ps_open(gddr_ps **out, const gddr_ps_config *cfg, const char *cfg_path, char *err,
                 size_t errlen);
/* Runs until stop is set; `ready` is called once after the socket is bound. */
int ps_run(gddr_ps *ps, void (*ready)(gddr_ps *));
void ps_close(gddr_ps **ps);

/* reply.c */
void ps_send_reply(gddr_ps *ps, zmq_msg_t *ident, Gddr__Reply *r, const gddr__raw *raws, int nraw);
void ps_reply_init(gddr_ps *ps, Gddr__Reply *r, uint64_t req_id, const ps_tensor *t);
/* What a push's reply says (a tensor's or a table's exactly-once record). */
typedef struct ps_push_answer {
    uint64_t version, sync_target, staleness;
    uint8_t applied, mode;
    uint64_t behind;    /* sync: the worker's steps that completed without it (sync.c ps_sync_place) */
} ps_push_answer;
/* The reply to a push of tensor or table `id` (t: the tensor, NULL for a
 * table); duplicate: answered from the record, nothing applied. */
void ps_send_push_reply(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, const ps_tensor *t, uint32_t id,
                        const ps_push_answer *a, int duplicate);
/* Counts a rejection and answers it (ident NULL: only counted). Returns code. */
int ps_reject(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Same with Error.retry_ms set: the refusal is transient. */
int ps_reject_retry(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, int code, uint32_t retry_ms,
                    const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A warning about a refused request, at most one a second (the rest are
 * counted and summed up in the next line), so hostile traffic cannot flood
 * the log. */
void ps_log_refusal(gddr_ps *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* tensor.c */
/* Allocates and registers an empty tensor (used by init and restore). */
ps_tensor *ps_tensor_create(gddr_ps *ps, const char *key, size_t n);
void ps_tensor_free(ps_tensor *t);
/* A tensor's or table's key: 1-127 printable characters, no spaces. */
int ps_valid_key(const char *k);
ps_tensor *ps_tensor_by_id(gddr_ps *ps, uint32_t id);
/* Waits for t's update in flight, if any, and makes its values current.
 * Call before reading or writing t's values (w, mom, acc, touched). */
void ps_tensor_settle(gddr_ps *ps, ps_tensor *t);
void ps_settle_all(gddr_ps *ps);
/* The mode in force now (hybrid: async during the warm-up); t, when given,
 * may end the warm-up (its version reached async_warmup_steps). */
int ps_tensor_mode(gddr_ps *ps, const ps_tensor *t);
/* Every tensor's last fresh values (async_fill = recent) forgotten: the
 * warm-up ended, or async_fill was reloaded (they were not kept meanwhile). */
void ps_tensor_fresh_reset(gddr_ps *ps);
/* Per-chunk offsets of a payload laid out by bitmap bm (NULL: dense). */
void ps_chunk_offsets(const ps_tensor *t, const uint8_t *bm, int64_t *off);
struct ps_job;
/* Hands t's next update to the pool (t settled); see tensor.c. */
void ps_tensor_submit(gddr_ps *ps, ps_tensor *t, struct ps_job *job, ps_vbuf *fresh,
                      zmq_msg_t *msgs, int nmsgs, void *owned);
/* Validate while applying (push.c): runs an update of t (settled; an
 * APPLY job whose state, if any, is not written in place) into a fresh
 * buffer, taking the payload's norm in the same read (*norm, from the
 * per-chunk sums job->sq, t->nchunks of them). Returns the buffer, to be made current by
 * ps_tensor_commit_aside() or dropped with ps_vbuf_unref() if the norm
 * says the push is bad (t is then as it was); NULL: no memory. */
ps_vbuf *ps_tensor_apply_aside(gddr_ps *ps, ps_tensor *t, struct ps_job *job, double *norm);
void ps_tensor_commit_aside(ps_tensor *t, const struct ps_job *job, ps_vbuf *fresh);
void ps_vbuf_unref(ps_vbuf *b);
/* A buffer of n floats (recycled when one of that size is spare); refs 1. */
ps_vbuf *ps_vbuf_new(size_t n);
/* Where the next update of t may write: *fresh = NULL when no reply holds
 * t's buffer (write in place), else a fresh buffer that ps_tensor_commit()
 * then makes current. -1 when that buffer cannot be had (no memory). */
int ps_tensor_begin_write(ps_tensor *t, ps_vbuf **fresh);
void ps_tensor_commit(ps_tensor *t, ps_vbuf *fresh);
/* Bytes of pull-reply buffers alive. */
long long ps_vbuf_bytes(void);

/* sync.c */
/* Applies the step being collected when enough workers pushed (or force);
 * returns 1 when it did. */
int ps_sync_try_complete(gddr_ps *ps, ps_tensor *t, int force);
/* After a restore: which sync step a push of `step` belongs to (sync.c). */
void ps_sync_restored(gddr_ps *ps);
/* Before a sync push joins the open step after a restore: closes the open
 * step when the push is past it; > 0 when the push names an earlier step:
 * how many steps before the open one (it is late: ps_sync_place). sync.c. */
uint64_t ps_sync_realign(gddr_ps *ps, ps_tensor *t, uint32_t rank, uint64_t step);
/* The aligner under it, for tables too (members.c; what it is for:
 * sync.c). begin at a restore, with wanted(ps, arg, r) = the step of rank r
 * the restored open step wants, + 1 (0: unknown). push for each sync push
 * while it is on: same says whether the push's session is the one the
 * restore knew, has_open whether the open step holds a push, close(ps, arg)
 * closes it as it is; > 0: the push belongs to that many steps before the
 * open one (it is late). kind and key name the tensor or table in the log. */
void ps_align_begin(gddr_ps *ps, ps_align *a, uint64_t (*wanted)(gddr_ps *ps, const void *arg, int r),
                    const void *arg);
uint64_t ps_align_push(gddr_ps *ps, ps_align *a, uint32_t rank, int same, uint64_t step, int has_open,
                       void (*close)(gddr_ps *ps, void *arg), void *arg, const char *kind, const char *key);
void ps_align_free(ps_align *a);
/* Applies a flush (a closing worker's held residual) as its own update.
 * payload: the message vals lives in (the pool takes it), or NULL when the
 * caller frees vals right after: then the update is waited for. */
void ps_flush_apply(gddr_ps *ps, ps_tensor *t, const float *vals, const uint8_t *bitmap,
                    float vscale, float scale, double lr, uint32_t rank, zmq_msg_t *payload);
/* Keeps a flush that arrived while a sync step is open, for after it. */
int ps_flush_defer(gddr_ps *ps, ps_tensor *t, const Gddr__Push *p, const float *vals,
                   size_t nfloats, float vscale, uint32_t rank);
/* Re-checks what a change of membership may unblock (sync steps, ssp pulls). */
void ps_membership_changed(gddr_ps *ps);

/* members.c */
/* The workers a step waits for: cfg.workers, else the largest world a
 * hello announced (at least 1). */
int ps_expected_workers(const gddr_ps *ps);
/* The default of a memory bound that gives every expected worker one copy
 * of what it costs per tensor (per_value bytes a value, per_chunk a chunk,
 * per_bitmap a chunk bitmap's bytes), plus 1 MiB of slack. */
uint64_t ps_per_worker_bound(const gddr_ps *ps, uint64_t per_value, uint64_t per_chunk,
                             uint64_t per_bitmap);
int ps_live_workers(gddr_ps *ps);
/* The slowest live worker's clock (steps pushed), UINT64_MAX when none. */
uint64_t ps_min_live_clock(gddr_ps *ps);

/* workers.c */
/* The session a request speaks for: Request.session, or the connection's. */
uint64_t ps_request_session(const Gddr__Request *rq, const ps_conn *c);
/* A worker's hello: checks and binds the rank to the session, or refuses.
 * Returns GDDR_OK (the caller answers) or the code it answered with. */
int ps_worker_hello(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, uint64_t session,
                    const ps_key *key);
/* Whether rq comes from the live owner of its rank (reviving a worker that
 * was declared dead but is the same session); refreshes its last_seen.
 * 0: not the owner (nothing changed). */
int ps_worker_owns(gddr_ps *ps, const Gddr__Request *rq, uint64_t session);
/* A worker said bye: gone at once. */
void ps_worker_left(gddr_ps *ps, uint32_t rank);

/* Declares silent workers dead; returns 1 when membership changed. */
int ps_workers_check(gddr_ps *ps);
/* Declares worker rank dead (ps_workers_check's clock, or a replayed event). */
void ps_worker_declare_dead(gddr_ps *ps, int rank);
/* The per-tensor record of a worker (grown on demand; NULL on no memory). */
ps_wtensor *ps_worker_tensor(gddr_ps *ps, uint32_t rank, uint32_t id);
void ps_workers_free(gddr_ps *ps);

/* conn.c */
int ps_conns_open(gddr_ps *ps);
void ps_conns_close(gddr_ps *ps);
/* The connection a message came from (created on first sight); NULL only
 * when out of memory. The table keeps it; no reference is taken. */
ps_conn *ps_conn_get(gddr_ps *ps, zmq_msg_t *ident);
/* Forgets idle connections with nothing in flight. */
void ps_conns_sweep(gddr_ps *ps);
size_t ps_conns_count(gddr_ps *ps);
/* Serves a pull now, or parks it, or refuses it. */
/* owner: rq comes from the live owner of its rank (lazy replies only for it). */
int ps_pull_request(gddr_ps *ps, zmq_msg_t *ident, ps_conn *c, const Gddr__Request *rq, int owner);
/* Drops a worker's lazy-pull views (a new process for the rank). */
void ps_pviews_free(ps_worker *w);
/* Bytes held by every worker's lazy-pull views. */
long long ps_pview_bytes(void);
/* Answers every parked pull whose condition holds or whose time is up. */
void ps_release_pulls(gddr_ps *ps);
/* Milliseconds until the next parked pull's deadline (at most cap). */
int ps_pulls_next_timeout(gddr_ps *ps, int cap);
void ps_pulls_free(gddr_ps *ps);
/* Reply bytes queued to peers. */
long long ps_conns_queued_bytes(gddr_ps *ps);

/* apply.c: the apply pool. */
/* APPLY: one push is an optimizer step (async, ssp). ACC: a push joins
 * the sync step being collected. SYNC: the collected step is applied.
 * JOIN: a flush is added to the step just applied (optim.c). NORM: the
 * payload's sum of squares per chunk, nothing written (validation). */
typedef enum { PS_JOB_APPLY, PS_JOB_ACC, PS_JOB_SYNC, PS_JOB_JOIN, PS_JOB_NORM } ps_job_kind;
typedef struct ps_job {
    ps_job_kind kind;
    ps_tensor *t;
    float *dst;             /* APPLY, SYNC, JOIN: write here, not into t->w (copy on write);
                             * NULL = in place */
    const float *vals;      /* payload (APPLY, ACC, JOIN) */
    const int64_t *off;     /* per chunk: offset into vals, -1 absent; NULL = dense */
    const float *const *src; /* or, when set, per chunk: its values, NULL absent (a push in parts) */
    float vscale;           /* APPLY, ACC, JOIN: the payload's scale (sync: AdaDelay's factor;
                             * async: 1, the factor is in lr_eff) */
    float scale;            /* APPLY 1; SYNC, JOIN: 1/(the step's workers) */
    ps_upd upd;             /* APPLY, SYNC, JOIN: the optimizer step */
    ps_fillw *fw;           /* APPLY, ACC, JOIN: the pushing worker's fill credits, or NULL */
    int held;               /* ACC, APPLY: its absent chunks are held (fill), not zeros
                             * (APPLY: adam/adamw only, see ps_upd_fill) */
    uint32_t npushes;       /* SYNC: pushes in the step (the fill mean's weight) */
    uint32_t rank;          /* APPLY: the pusher's rank */
    uint32_t stamp;         /* APPLY: the push's stamp for the fresh values it leaves (never 0) */
    float *facc;            /* SYNC: t->facc as the step's pushes found it (NULL: the
                             * carriers' mean is the fill, see fill.c); APPLY: t->facc as
                             * the recent fresh values (async_fill = recent; NULL: m-hat) */
    ps_fillw **holders;     /* SYNC: the workers that held chunks in the step */
    uint32_t nholders;
    double *sq;             /* NORM, APPLY (when set): per chunk, the sum of squares of the
                             * payload's values (0 absent), taken as each chunk is read */
} ps_job;
typedef struct ps_task ps_task;
int ps_pool_start(ps_pool **out, int threads);
/* Starts a job beside the caller. The task takes the nmsgs messages the
 * payload lives in (one: moved in; several: the malloc'd array itself;
 * closed and freed when done) and `owned` (freed when done, may be NULL).
 * Returns NULL when the job was small and is done already (then nothing
 * was taken). */
ps_task *ps_pool_submit(ps_pool *p, const ps_job *job, zmq_msg_t *msgs, int nmsgs, void *owned);
/* Waits for a task (helping with its parts) and frees it; NULL is done. */
void ps_pool_wait(ps_pool *p, ps_task *k);
void ps_pool_run(ps_pool *p, const ps_job *job); /* submit + wait */
/* The payload's L2 norm from a job's per-chunk sums (j->sq), added in chunk
 * order: the same figure however the chunks were spread over threads. NaN
 * or Inf when a value is not finite. */
double ps_job_norm(const ps_job *j);
/* The L2 norm of a push's payload (job: t, vals and off, or src), its
 * chunks read by the pool's threads and the caller together; sq holds
 * t->nchunks sums. */
double ps_payload_norm(ps_pool *p, ps_job *job, double *sq);
void ps_pool_stop(ps_pool **p);

/* parts.c: pushes in parts. */
typedef struct ps_partial ps_partial;
/* A push whose parts are all in: its values per chunk, in the kept frames. */
typedef struct ps_whole {
    const float **src;   /* per chunk (t->nchunks), NULL absent; malloc'd */
    zmq_msg_t *msgs;     /* the frames (malloc'd array) */
    int nmsgs;
    double norm;         /* L2 norm of all the values */
} ps_whole;
enum { PS_PART_REFUSED = -1, PS_PART_HELD = 0, PS_PART_DONE = 1 };
/* Takes one part: PS_PART_HELD (kept or dropped; nothing to answer yet),
 * PS_PART_REFUSED (answered with an error) or PS_PART_DONE (*out is the
 * whole push, owned by the caller). The caller checked exactly-once. */
int ps_part_take(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f,
                 ps_tensor *t, ps_whole *out);
void ps_parts_drop_rank(gddr_ps *ps, uint32_t rank);
void ps_parts_free(gddr_ps *ps);

/* auth.c: CURVE on the ROUTER, a ZAP handler checking client keys, and a
 * monitor counting failed handshakes. */
int ps_auth_setup(gddr_ps *ps, char *err, size_t errlen);
void ps_auth_poll(gddr_ps *ps);
void ps_monitor_poll(gddr_ps *ps);
int ps_auth_reload(gddr_ps *ps);
void ps_auth_close(gddr_ps *ps);
/* The allowlist entry of the key a message came in with (its frames'
 * User-Id); NULL without CURVE (or when the key was removed from the list
 * since it connected). */
const ps_key *ps_auth_key(gddr_ps *ps, const char *user_id);

/* stats.c */
void ps_stale_add(ps_stale *s, uint64_t tau, double decay);
double ps_stale_mean(const ps_stale *s);
/* Prometheus text into a malloc'd string. */
char *ps_metrics_text(gddr_ps *ps);
/* ops.c: the whole Prometheus page: ps_metrics_text and the tables' families. */
char *ps_metrics_page(gddr_ps *ps);

/* optim.c */
const char *ps_optim_name(int kind);
/* The server's [optimizer] section as a tensor optimizer (explicit_ 0). */
void ps_optim_from_config(const gddr_ps_config *cfg, ps_optim *o);
/* t's optimizer in force: its own, or the section's (written to *tmp). */
const ps_optim *ps_optim_of(const gddr_ps *ps, const ps_tensor *t, ps_optim *tmp);
/* 0, or -1 with a sentence in msg: a registration's optimizer is refused. */
int ps_optim_check(const ps_optim *o, char *msg, size_t len);
int ps_optim_equal(const ps_optim *a, const ps_optim *b);
/* "adam lr=0.001 beta1=0.9 ..." for logs and errors. */
int ps_optim_describe(const ps_optim *o, char *buf, size_t len);
/* State buffers the optimizer needs per element: 0, 1 (s1) or 2 (s1, s2). */
int ps_optim_nstate(const ps_optim *o);
/* Allocates what t's optimizer needs (zeros); -1 when out of memory. */
int ps_optim_state(const gddr_ps *ps, ps_tensor *t);
/* The arguments of t's next update with step size lr (bias corrections for
 * the version it makes). */
void ps_upd_for(const gddr_ps *ps, const ps_tensor *t, double lr, ps_upd *u);
/* out = w updated by gradient gs*g (out may be w), s1/s2 the state. */
void ps_upd_run(const ps_upd *u, float *out, const float *w, float *s1, float *s2, const float *g,
                float gs, size_t n);
/* The same gradient added to the update just applied (a flush; optim.c). */
void ps_upd_join(const ps_upd *u, float *out, const float *w, float *s1, const float *s2,
                 const float *g, float gs, size_t n);
/* Whether an async push's held chunks can be filled for this optimizer
 * (adam, adamw: their first moment is the estimate). */
int ps_upd_fills(const ps_upd *u);
/* Whether the optimizer divides by a running mean of squared gradients
 * (adam, adamw, adagrad): sync fill then uses the fresh pushes' mean. */
int ps_upd_normalises(int kind);
/* An async step of a chunk the pushing worker holds (adam, adamw): est
 * (the chunk's last fresh push, async_fill = recent) or, when est is NULL,
 * the bias-corrected first moment stands in for its gradient and is added
 * to the worker's credit cred (taken off when it sends the chunk). */
void ps_upd_fill(const ps_upd *u, float *out, const float *w, float *s1, float *s2, float *cred,
                 const float *est, size_t n);

/* fill.c: held chunks in sync steps. */
/* rank's fill state for t, created on first use within max_fill_bytes;
 * NULL when fill is off or over the bound (the push is then taken as one
 * whose absent chunks are zero). */
ps_fillw *ps_fill_get(gddr_ps *ps, uint32_t rank, ps_tensor *t);
/* rank's fill state for t if it has one. */
ps_fillw *ps_fill_find(gddr_ps *ps, uint32_t rank, uint32_t id);
/* Notes that fw held chunks in t's open step (t->holders). */
void ps_fill_holding(ps_tensor *t, ps_fillw *fw);
/* Drops a worker's credits (a new process for the rank). */
void ps_fill_free_worker(gddr_ps *ps, ps_worker *w);
/* Bytes held by every worker's fill state. */
long long ps_fill_bytes(void);
/* After a sync step of t closed: the fresh-push sums its next steps collect
 * into, when fill is on and t's optimizer normalises (no-op otherwise). */
void ps_fill_fresh_alloc(gddr_ps *ps, ps_tensor *t);


/* tau.c: the dynamic tau controller. Returns 1 when tau changed. */
int ps_tau_update(const gddr_ps_config *cfg, ps_tensor *t, double grad_norm);
/* ps_tau_update, and a debug line when tau changed (async and ssp pushes,
 * and a sync step's norms at its close). */
void ps_tau_feed(const gddr_ps_config *cfg, ps_tensor *t, double grad_norm);
/* Sync mode: keeps rank's norm for the open step (a second one of the same
 * rank feeds the first at once); ps_tau_step_close feeds them in rank order
 * when the step completes, so tau moves only between steps and does not
 * depend on the order pushes arrive in. */
void ps_tau_defer(const gddr_ps_config *cfg, ps_tensor *t, uint32_t rank, double grad_norm);
void ps_tau_step_close(const gddr_ps_config *cfg, ps_tensor *t);

#endif
