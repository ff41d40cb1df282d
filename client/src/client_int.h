/* client_int.h -- libgddr-client internals shared by its files, which
 * call one another downwards only (scripts/check-layers.sh):
 *
 * api.c         the public face: the functions of gddr.h, each a check of its
 *               arguments and a call of c->be (backend.h)
 * options.c     [client] INI section (table: common/client_conf.c), rank
 *               discovery, gddr_client_open_ini
 * shard*.c      the backend of several servers (shard.h), over single.c's
 * single.c      the backend of one server: open, close, the calls of gddr.h
 * pipeline.c    the library thread behind gddr_step_submit/gddr_step_wait
 * heartbeat.c   the thread that tells the server this worker is alive
 * step.c        the step: clipping, DC-ASGD, GDDR residuals, push/pull order
 *               (the host path; step_dev.c the device path)
 * recovery.c    residual allocation, snapshots, orphans, the flush on close
 * conn_req.c    one server's requests: hello, register, pull, push, reconnect
 * conn_reply.c  one server's replies: dispatch, pull views, waiting
 * conn.c        one server's socket and monitor, request slots, sending
 */
#ifndef GDDR_CLIENT_INT_H
#define GDDR_CLIENT_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "gddr/gddr.h"
#include "log.h"
#include "optspec.h"
#include "pullpick.h"
#include "residual.h"
#include "wire.h"

typedef enum { OP_HELLO, OP_INIT, OP_PULL, OP_PUSH, OP_STATS, OP_ACK, OP_INIT_TABLE, OP_PULL_ROWS } op_kind;

/* One request in flight. */
typedef struct op {
    uint64_t req_id;   /* = ticket; 0 marks a free slot */
    op_kind kind;
    int tensor;        /* client tensor index (-1: none, e.g. a table's request) */
    size_t nfloats;    /* OP_PULL_ROWS: the floats out takes (nkeys * dim) */
    float *out;        /* pull destination (n floats) */
    gddr_server_stats *stats;
    int done, rc;
    uint64_t version, sync_target, staleness;
    int applied, mode;
    uint32_t sid;      /* init reply: server id */
    int created;
    gddr__optim opt;   /* init reply: the optimizer the server runs for the tensor */
    int track;         /* pull: also update the tensor's last values and version */
    int answered;      /* the server answered (also with an error) */
    /* pull: the reply becomes the tensor's last values and version (the
     * frame is kept, not copied: ctensor.last points into it) */
    int duplicate;     /* push: the server had taken this push already */
    uint32_t retry_ms; /* error: a passing refusal, try again after this long */
    uint32_t parts, parts_got; /* pull answered in parts: how many, how many in */
    size_t parts_next;  /* pull in parts: the value the next part must start at */
    int pick;          /* pull_delta_auto: 0 not timed, 1 a reduced pull, 2 a whole one */
    int64_t t0_us;     /* pick: when it was sent */
    int64_t t1_us;     /* push: when its answer came (delay_auto's cost) */
} op;

/* One push of one tensor, built once and sent again unchanged after a
 * reconnect, so the server recognises a resend by its step. */
typedef struct gddr__push_args {
    const float *vals;
    const uint8_t *bitmap; /* NULL: dense */
    size_t bitmap_len, nvals;
    uint64_t birth, base;
    uint64_t step;         /* from gddr__push_step() */
    float norm;            /* of the fresh gradient */
    int norm_from_payload; /* norm not measured: the server measures the
                            * (dense, exact) payload instead */
    float residual_l1;     /* what this worker holds of the tensor after the push */
    int flush;             /* the residual a closing worker still held */
    int held;              /* absent chunks are held in the residual (Push.held) */
    const float *snap;     /* residual snapshot (held chunks, packed), or NULL */
    const uint8_t *snap_bm;
    size_t snap_vals;
    int lend;              /* 1: ZeroMQ sends vals and snap from where they are (no
                            * copy); the caller waits with gddr__lent_wait() before
                            * the buffers change */
} gddr__push_args;

/* GDDR residual state of one tensor (host or device memory). */
typedef struct residual {
    float *r;          /* residual, n floats */
    uint32_t *age;     /* per chunk */
    float *packed;     /* sent chunks, contiguous (host) */
    uint8_t *bitmap;   /* host */
    size_t nchunks;
    uint32_t tau;      /* what the server last asked for */
    float *orphan;     /* installments still to replay (NULL when none) */
    int orphan_left;   /* installments to go */
    float *snap;       /* residual snapshot being sent (held chunks, packed) */
    uint8_t *snap_bm;  /* its chunk bitmap */
    double *score;     /* hold_schedule = smallest: per chunk, sum of (r + g)^2 */
    uint8_t *pick;     /* ... the chunks it holds this step */
    uint32_t *order;   /* ... scratch of gddr_hold_smallest */
} residual;

/* A sparse table (rows.c): what registering it again needs, and the
 * versions that order this client's pulls after its pushes. */
typedef struct ctable {
    char key[128];
    uint32_t dim;
    uint32_t sid;          /* id on the server */
    gddr_table_opts o;     /* as registered (o.optimizer NULL: see opt) */
    gddr__optim opt;
    uint64_t pulled;       /* table version of the last pull (a push's base) */
    uint64_t need;         /* a pull waits for this (the sync step of the last push) */
    uint64_t step;         /* steps of row pushes (exactly once) */
} ctable;

typedef struct ctensor {
    char key[128];
    uint32_t keyhash;  /* names the tensor in the GDDR mask hash */
    uint32_t chunk0;   /* this tensor's first chunk in the whole tensor (a piece of a
                        * tensor split over servers, shard.c; else 0) */
    gddr__optim opt;   /* asked for at registration (set 0: the server's) */
    gddr__optim srv_opt; /* what the server said it runs for this tensor */
    size_t n;
    uint32_t sid;      /* id on the server */
    uint64_t version;  /* of the last pull */
    uint64_t last_step;/* step of the last push of this tensor (valid when pushed) */
    int pushed;
    const float *last; /* values of the last pull (w_bak for DC, re-register): the
                        * pull reply's own frame, or last_own; NULL while they are
                        * kept in parts (read them with gddr__last()) */
    float *last_own;   /* the values given at registration, or parts made whole */
    zmq_msg_t *last_msgs; /* the reply frames holding the last values, in order */
    uint32_t nlast, cap_last;
    zmq_msg_t *pend_msgs; /* parts of a tracked pull still arriving */
    uint32_t npend, cap_pend;
    float *g;          /* work buffer: the gradient being pushed */
    float *wnew;       /* DC: the freshly pulled parameters */
    float *ms;         /* DC adaptive: EMA of g^2 */
    residual res;
    int tau;
    int orphan_done;   /* an orphan of this tensor was fully replayed; not yet reported */
    int view_dirty;    /* lazy pulls: a reply may have been lost; the next pull is full */
    uint64_t view_seq; /* PullReply.view_seq of the last lazy/delta reply applied */
    float *accum;      /* accumulate_steps: the sum of the gradients so far (NULL until used) */
    struct gddr__dtensor *dev; /* step_dev.c: device-side GDDR state (NULL until a
                                * step is given CUDA device pointers) */
    gddr__pullpick pick; /* pull_delta_auto: reduced or whole pulls (pullpick.c) */
} ctensor;

typedef struct gddr__backend gddr__backend;

/* A client. The first block is what the public face and both backends use;
 * the rest is the single-server backend's (a sharded client's router leaves
 * it zero and keeps its own state behind `shards`). */
struct gddr_client {
    const gddr__backend *be; /* single.c's gddr__single or shard.c's gddr__sharded */
    gddr_client_opts o;
    char server[512];
    gddr__logger log;
    char errmsg[512];
    gddr_server_info info;
    gddr_client_counters k;
    _Atomic double lr;     /* gddr_set_lr: the lr every push carries (0: the tensors') */
    struct gddr__shards *shards; /* shard*.c only: the router's state (NULL: one server) */

    /* The single-server backend's. */
    char curve_server[64], curve_file[512];
    void *zctx, *sock;
    void *mon;         /* the main socket's monitor (handshake failures), or NULL */
    unsigned mon_seq;
    int mon_connected; /* a TCP connection was made (since the socket opened) */
    int mon_refused;   /* a connection attempt failed (nothing listening?) */
    int mon_broken;    /* handshakes broken off in a row without a reason (conn.c) */
    int closing;       /* in gddr_client_close: retries end at close_deadline */
    int64_t close_deadline;
    atomic_int lent;       /* messages ZeroMQ still reads from our buffers */
    uint64_t session;      /* random, once per client: ties our rank to us across reconnects */
    uint64_t next_req;
    op *ops;
    size_t nops;
    ctensor *t;
    int nt;
    ctable *tb;            /* sparse tables (rows.c) */
    int ntb;
    int epoch_changed;     /* a reply carried another epoch */
    uint64_t step;
    struct pipeline *pipe; /* NULL unless gddr_step_submit was used */
    void *cuda;            /* step_dev.c: the device path's state (CUDA context and per-step
                            * buffers), or NULL */
    int ptr_kind;          /* step.c: 0 no step yet, 1 host, 2 device gradients */
    uint64_t dc_steps;     /* DC compensations done (bias correction of ms) */
    struct heartbeat *hb;  /* NULL unless heartbeat_ms > 0 */
    int acc_calls;         /* accumulate_steps: gradients in the buffers now */
    uint64_t *acc_birth;   /* their birth versions: those of the first one */
    /* delay_auto (step.c): GDDR or dense pushes, on pullpick.c's schedule
     * ("whole" = every chunk). push_dense: what this step does -- 0 hold
     * chunks, 1 a dense push (the residuals are zero), 2 every chunk through
     * the residual step (alpha 0: what the residuals held goes too). */
    gddr__pullpick push_pick;
    int push_dense;
    int res_dirty;         /* a GDDR step ran since the residuals were last sent whole */
    int shard_index, shard_count; /* where this server sits in a sharded client's list
                                   * (said in the hello; count 0: not sharded) */
    /* What conn_reply.c does with an Orphan message (recovery.c's
     * gddr__orphan_received, set by single.c): conn*.c call nothing above. */
    void (*on_orphan)(gddr_client *c, const Gddr__Orphan *o, gddr__frames *f);
};

/* conn.c */
int gddr__set_err(gddr_client *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
op *gddr__op(gddr_client *c, uint64_t ticket);
/* A free slot for a new request (its ticket set); NULL when out of memory. */
op *gddr__op_new(gddr_client *c, op_kind kind, int tensor);
/* Ends every op in flight with rc (after a reconnect their replies never come). */
void gddr__ops_fail_all(gddr_client *c, int rc);
/* Closes the connection's socket and its monitor (monitor stopped first). */
void gddr__close_socket(gddr_client *c);
/* Sends one message of op o (a push in parts sends several under one op). */
int gddr__send_msg(gddr_client *c, op *o, Gddr__Request *rq, const gddr__raw *raws, int nraw);
/* A new op and its message; *ticket names it. */
int gddr__send_req(gddr_client *c, Gddr__Request *rq, const gddr__raw *raws, int nraw, op_kind kind,
                   int tensor, uint64_t *ticket);
/* Marks raw as lent: ZeroMQ sends it from where it is (gddr__lent_wait). */
void gddr__lend(gddr_client *c, gddr__raw *raw);
/* Returns when ZeroMQ holds no buffer lent by gddr__push_args.lend any more:
 * at once after a completed exchange (the server answered, so the bytes were
 * sent); otherwise the socket is dropped (and reopened by the next call's
 * reconnect) so that queued messages let go of the buffers. */
void gddr__lent_wait(gddr_client *c);
/* A DEALER connected to the server with this client's settings (CURVE keys
 * included), with a monitor when mon is not NULL: the main socket and the
 * heartbeat socket are both made here. */
int gddr__socket_new(gddr_client *c, void **out, void **mon);
/* A fresh main socket and monitor (the old ones closed). */
int gddr__open_socket(gddr_client *c);
/* Reads the main socket's monitor: GDDR_EAUTH (message set) when the
 * server refused the security handshake, else GDDR_OK. */
int gddr__mon_check(gddr_client *c);

/* conn_reply.c */
/* Waits for one op until timeout_ms (< 0: timeout_ms of the options),
 * completing whatever else is answered meanwhile; frees its slot. */
int gddr__wait_op(gddr_client *c, uint64_t ticket, int timeout_ms, op *result);
/* A tensor's last pulled values, contiguous (parts are joined on first
 * use); NULL only when out of memory. */
const float *gddr__last(ctensor *t);
/* Closes n kept reply frames (n becomes 0). */
void gddr__msgs_close(zmq_msg_t *m, uint32_t *n);
/* The server's Prometheus text (malloc'd into *text). */
int gddr__metrics_request(gddr_client *c, char **text);

/* conn_req.c */
int gddr__hello(gddr_client *c, int timeout_ms, uint32_t *retry_ms);
int gddr__hello_retryable(int rc, uint32_t retry_ms);
/* Registers tensor i (its key, size, optimizer) with values vals. */
int gddr__register_one(gddr_client *c, int i, const float *vals, int timeout_ms, op *res);
int gddr__reconnect(gddr_client *c);
/* Registers table i (c->tb[i]) on this server; res gets the reply. */
int gddr__register_table_one(gddr_client *c, int i, int timeout_ms, op *res);
/* Whether a failed call may succeed after gddr__reconnect(): no answer, or
 * a restarted server that no longer knows our tensors or versions. */
int gddr__needs_reconnect(gddr_client *c, int rc);
/* Runs call(c, arg) again after a reconnect while the server is away,
 * within reconnect_timeout_ms: what a restarting cluster needs from every
 * blocking call, not only from gddr_step. */
int gddr__with_reconnect(gddr_client *c, int (*call)(gddr_client *, void *), void *arg);
/* The step a new push of tensor i carries: this client's step counter, or
 * one above the tensor's last push if that is higher (every push of a
 * tensor must carry a larger step than the one before: exactly once). */
uint64_t gddr__push_step(gddr_client *c, int i);
int gddr__push_tensor(gddr_client *c, int i, const gddr__push_args *a, uint64_t *ticket);
/* Pushes and waits for the answer, again (the same push) after a reconnect
 * while the server is away, within reconnect_timeout_ms. */
int gddr__push_wait(gddr_client *c, int i, const gddr__push_args *a, uint64_t *version);
/* A pull of gddr_step that updates the tensor's view (its last values and
 * version): lazy (Pull.delay_fraction) when pull_delay_fraction > 0. */
int gddr__pull_view(gddr_client *c, int i, float *out, uint64_t min_version, uint64_t step,
                    uint64_t *ticket);
int gddr__pull_tensor(gddr_client *c, int i, float *out, uint64_t min_version, uint64_t step,
                      uint64_t *ticket);

/* single.c: gddr_register of a piece: keyhash and chunk0 place it in its
 * whole tensor (shard.c registers pieces). */
int gddr__register_piece(gddr_client *c, const char *key, const float *init, size_t n,
                         uint32_t keyhash, uint32_t chunk0, const gddr__optim *opt, int *id,
                         uint64_t *version);

/* recovery.c: a tensor's GDDR residual on the host (n floats, its chunk
 * ages, packed and bitmap buffers), made on first use; freed with what
 * replay and snapshots keep. */
int gddr__residual_alloc(gddr_client *c, ctensor *t);
void gddr__residual_free(ctensor *t);
/* Every residual_checkpoint_steps, the held chunks of the
 * residual (sent_bm: the chunks sent this step, NULL = all) ride along. */
int gddr__residual_snapshot(gddr_client *c, int i, const uint8_t *sent_bm, const float **snap,
                            const uint8_t **snap_bm, size_t *snap_vals);
/* An Orphan message from the server: installments to add to tensor i. */
void gddr__orphan_received(gddr_client *c, const Gddr__Orphan *o, gddr__frames *f);
/* Pushes every held residual chunk (on close). */
int gddr__residual_flush(gddr_client *c);
/* Adds tensor i's next orphan installment (if any) into target (n floats). */
void gddr__orphan_replay(gddr_client *c, int i, float *target);

/* step.c: the step itself, without the pipeline check (the library thread
 * of pipeline.c calls it); gddr_step_from() (single.c's step) refuses with
 * GDDR_ESTATE while the pipeline has steps in flight. */
int gddr__step_run(gddr_client *c, const float *const *grads, const float *const *computed_on,
                   const uint64_t *versions, float *const *params);
/* recovery.c: the GDDR mask's arguments for tensor i this step (host and device paths
 * alike): the hold probability that makes delay_fraction the share of the
 * chunks held back under the tensor's tau (gddr_hold_probability), and with
 * the staggered schedule its period and this rank's phase. */
gddr_residual_args gddr__residual_args(const gddr_client *c, int i);
/* hold_schedule = smallest for this client (recovery.c). */
int gddr__holds_smallest(const gddr_client *c);
/* hold_schedule = smallest: picks this step's holds of tensor i from
 * res.score and points a->pick at them. host: the scores are computed
 * here from g (NULL: a zero gradient) and res.r; else the device path
 * copied them into res.score (its buffers from gddr__residual_pick_bufs). */
int gddr__residual_pick(gddr_client *c, int i, int host, const float *g, gddr_residual_args *a);
int gddr__residual_pick_bufs(gddr_client *c, int i);
/* DC-ASGD runs in async and ssp steps (a sync step has w' == w_bak). */
static inline int gddr__dc_on(const gddr_client *c)
{
    return c->o.dc_lambda > 0 && c->info.mode != GDDR_MODE_SYNC;
}

/* step_dev.c: steps 1-4 of gddr_step when the gradients are CUDA device
 * pointers (the order and the rest: step.c). dev_norms: steps 1-2 queued
 * (*checked: the norms were waited for and checked already); dev_payloads:
 * steps 3-4 for every tensor, one wait, then the payloads; dev_params_out:
 * the pinned pull targets to the caller's buffers. */
int gddr__dev_norms(gddr_client *c, const float *const *grads, gddr__push_args *pl,
                    float **staged, int *checked);
struct gddr_dc_args;
int gddr__dev_payloads(gddr_client *c, gddr__push_args *pl, const float *const *w_bak,
                       const struct gddr_dc_args *dca, int checked);
int gddr__dev_params_out(gddr_client *c, float *const *staged, float *const *params);
/* Frees a tensor's device state (NULL-safe). */
void gddr__dev_free(ctensor *t);
/* Device-to-device copy (GDDR_ENOTSUP without CUDA); waits for it. */
int gddr__cuda_d2d(void *dst, const void *src, size_t bytes);
/* Releases the device path's CUDA context (tensor buffers go with
 * gddr__step_free). */
void gddr__step_dev_close(gddr_client *c);
/* Test hooks: copy tensor id's residual (n floats, from the device when
 * it lives there) / chunk ages (nchunks) to host memory. Only while no
 * step is in flight. */
int gddr__residual_get(gddr_client *c, int id, float *out);
int gddr__residual_age_get(gddr_client *c, int id, uint32_t *out, size_t *nchunks);

/* step.c: frees what the step keeps for a tensor (its GDDR residual, the
 * accumulated gradient, the device state); single.c's close calls it. */
void gddr__step_free(ctensor *t);

/* pipeline.c */
/* 1 while gddr_step_submit() has steps the trainer has not waited for
 * (trainer thread only). */
int gddr__pipeline_busy(const gddr_client *c);
/* Joins the library thread and frees the pipeline (single.c's close). */
void gddr__pipeline_stop(gddr_client *c);
/* gddr_step_submit / gddr_step_wait of one server's client. */
int gddr__pipeline_submit(gddr_client *c, const float *const *grads);
int gddr__pipeline_wait(gddr_client *c, float *const *params);

/* heartbeat.c: a thread with its own socket tells the server this worker
 * is alive every heartbeat_ms, also while the trainer computes a long step. */
int gddr__heartbeat_start(gddr_client *c);
void gddr__heartbeat_stop(gddr_client *c);

/* options.c */
/* gddr_client_open_ini opens through backend.h's gddr__server_count,
 * gddr__shards_open and gddr__client_open_shard. */
int gddr__server_count(const char *list);
int gddr__shards_open(const gddr_client_opts *opts, gddr_client **out, char *why, size_t whylen);
int gddr__client_open_shard(const gddr_client_opts *opts, int shard_index, int shard_count,
                            gddr_client **out, char *err, size_t errlen);

/* ---- options (options.c): what the public option calls of api.c do ----
 * (docs/client.md, "ABI": a caller's struct of `size` bytes, fields past
 * it at their defaults; GDDR_CLIENT_OPTS_V0_SIZE for the first gddr.h's
 * symbols). */
const char *gddr__opts_errmsg(void);
size_t gddr__opts_size(void);
int gddr__opts_init_sized(gddr_client_opts *o, size_t size);
/* Opens with a complete struct: one server or several. */
int gddr__opts_open_full(const gddr_client_opts *opts, gddr_client **out);
int gddr__opts_open_sized(const gddr_client_opts *opts, size_t size, gddr_client **out);
int gddr__opts_open_ini_sized(const char *path, const gddr_client_opts *overrides, size_t size,
                              gddr_client **out, char *errbuf, size_t errlen);
int gddr__opts_set(gddr_client_opts *o, size_t size, const char *name, const char *value);
int gddr__opts_set_ptr(gddr_client_opts *o, size_t size, const char *name, void *value);
int gddr__opts_get(const gddr_client_opts *o, size_t size, const char *name, char *buf, size_t len);
const char *gddr__opts_describe(size_t i, const char **type, const char **def, const char **choice,
                                const char **help);
/* The [client] section of an INI file onto *o (a complete struct); string
 * options point into slots (GDDR_CONF_MAXKEYS of them), which must outlive
 * their use. */
union gddr__client_slot;
int gddr__opts_from_ini(const char *path, gddr_client_opts *o, union gddr__client_slot *slots,
                        char *err, size_t errlen);

/* rows.c: sparse tables over one server (the single backend's table
 * calls, and the pieces the sharded backend drives on each server). */
int gddr__rows_register(gddr_client *c, const char *key, uint32_t dim, const gddr_table_opts *o,
                        int *table);
uint32_t gddr__rows_dim(const gddr_client *c, int table);
int gddr__rows_pull(gddr_client *c, int table, const uint64_t *keys, size_t n, float *out,
                    unsigned flags, uint64_t min_version, uint64_t *version);
int gddr__rows_push(gddr_client *c, int table, const uint64_t *keys, size_t n, const float *grads,
                    uint64_t *version);
/* Sends a pull of n rows of table i into out (no retry); the wait fills
 * out and the table's pulled version. */
int gddr__rows_pull_send(gddr_client *c, int i, const uint64_t *keys, size_t n, float *out,
                         unsigned flags, uint64_t min_version, uint64_t *ticket);
int gddr__rows_pull_wait(gddr_client *c, int i, uint64_t ticket, uint64_t *version);
/* Sends a push of n unique keys carrying step (no retry); the wait records
 * the version a later pull needs. */
int gddr__rows_push_send(gddr_client *c, int i, const uint64_t *keys, size_t n, const float *g,
                         uint64_t step, uint64_t *ticket);
int gddr__rows_push_wait(gddr_client *c, int i, uint64_t ticket, uint64_t *version);
/* A blocking push of n unique keys at step, retried across reconnects. */
int gddr__rows_push_at(gddr_client *c, int i, const uint64_t *keys, size_t n, const float *g,
                       uint64_t step, uint64_t *version);
/* The distinct keys (first-seen order) in *uk and, per key, its index
 * among them in *first (both malloc'd), or both NULL when no key repeats.
 * Returns the distinct count, or -1 (no memory). */
long gddr__rows_unique(const uint64_t *keys, size_t n, uint64_t **uk, uint32_t **first);
/* Sums the gradients of repeated keys: *uk and *ug get the unique keys (in
 * first-seen order) and their sums (malloc'd), or NULL when no key repeats
 * (then use keys and g). Returns the unique count, or -1 (no memory). */
long gddr__rows_dedup(const uint64_t *keys, size_t n, const float *g, uint32_t dim, uint64_t **uk,
                      float **ug);

#endif
