/* client_int.h -- libgddr-client internals shared by its files.
 *
 * client.c   socket, requests in flight, replies, reconnects
 * step.c     gddr_step: clipping, DC-ASGD, GDDR residuals, push/pull order
 *            (the host path; step_dev.c the device path)
 * options.c  [client] INI section (table: common/client_conf.c), rank discovery
 * pipeline.c the library thread behind gddr_step_submit/gddr_step_wait
 */
#ifndef GDDR_CLIENT_INT_H
#define GDDR_CLIENT_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "gddr/gddr.h"
#include "log.h"
#include "optspec.h"
#include "residual.h"
#include "wire.h"

typedef enum { OP_HELLO, OP_INIT, OP_PULL, OP_PUSH, OP_STATS, OP_ACK } op_kind;

/* One request in flight. */
typedef struct op {
    uint64_t req_id;   /* = ticket; 0 marks a free slot */
    op_kind kind;
    int tensor;        /* client tensor index */
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
} residual;

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
} ctensor;

struct gddr_client {
    gddr_client_opts o;
    char server[512];
    char curve_server[64], curve_file[512];
    gddr__logger log;
    void *zctx, *sock;
    void *mon;         /* the main socket's monitor (handshake failures), or NULL */
    unsigned mon_seq;
    int mon_connected; /* a TCP connection was made (since the socket opened) */
    int mon_refused;   /* a connection attempt failed (nothing listening?) */
    int closing;       /* in gddr_client_close: retries end at close_deadline */
    int64_t close_deadline;
    atomic_int lent;       /* messages ZeroMQ still reads from our buffers */
    _Atomic double lr;     /* gddr_set_lr: the lr every push carries (0: the tensors') */
    uint64_t session;      /* random, once per client: ties our rank to us across reconnects */
    uint64_t next_req;
    op *ops;
    size_t nops;
    ctensor *t;
    int nt;
    gddr_server_info info;
    int epoch_changed;     /* a reply carried another epoch */
    uint64_t step;
    gddr_client_counters k;
    char errmsg[512];
    struct pipeline *pipe; /* NULL unless gddr_step_submit was used */
    void *cuda;            /* step_dev.c: the device path's state (CUDA context and per-step
                            * buffers), or NULL */
    int ptr_kind;          /* step.c: 0 no step yet, 1 host, 2 device gradients */
    uint64_t dc_steps;     /* DC compensations done (bias correction of ms) */
    struct heartbeat *hb;  /* NULL unless heartbeat_ms > 0 */
    int acc_calls;         /* accumulate_steps: gradients in the buffers now */
    uint64_t *acc_birth;   /* their birth versions: those of the first one */
    int shard_index, shard_count; /* where this server sits in a sharded client's list
                                   * (said in the hello; count 0: not sharded) */
    struct gddr__shards *shards;  /* shard.c: set when this client is a router over
                                   * one client per server; then nothing above is used
                                   * but o, server, log, errmsg, info and k */
};

/* shard.c: several servers. */
typedef struct gddr__shards gddr__shards;
int gddr__server_count(const char *list);
/* why (may be NULL): the reason when it fails. */
int gddr__shards_open(const gddr_client_opts *opts, gddr_client **out, char *why, size_t whylen);
void gddr__shards_close(gddr_client *c);
/* Opens one server's client of a sharded client (the hello says where it
 * sits). */
int gddr__client_open_shard(const gddr_client_opts *opts, int shard_index, int shard_count,
                            gddr_client **out, char *err, size_t errlen);
/* gddr_register of a piece: keyhash and chunk0 place it in its whole tensor. */
int gddr__register_piece(gddr_client *c, const char *key, const float *init, size_t n,
                         uint32_t keyhash, uint32_t chunk0, const gddr__optim *opt, int *id,
                         uint64_t *version);
/* Where a tensor's pieces live: returns their count; off/len/shard per piece. */
int gddr__shard_placement(const char *key, size_t n, int chunk, int S, size_t *off, size_t *len,
                          int *shard);
int gddr__shards_register(gddr_client *c, const char *key, const float *init, size_t n,
                          const gddr__optim *opt, int *id, uint64_t *version);
void gddr__shards_set_lr(gddr_client *c, double lr);
int gddr__shards_optimizer(gddr_client *c, int id, char *buf, size_t len);
int gddr__shards_pull(gddr_client *c, int id, float *out, uint64_t min_version, uint64_t *version);
int gddr__shards_push(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                      uint64_t *version);
int gddr__shards_async(gddr_client *c, int id, float *out, const float *grad,
                       const gddr_push_tags *tags, uint64_t min_version, gddr_ticket *ticket);
int gddr__shards_wait(gddr_client *c, gddr_ticket ticket, int timeout_ms, uint64_t *version);
int gddr__shards_step(gddr_client *c, const float *const *grads, const float *const *computed_on,
                      const uint64_t *versions, float *const *params);
int gddr__shards_submit(gddr_client *c, const float *const *grads);
int gddr__shards_wait_step(gddr_client *c, float *const *params);
int gddr__shards_checkpoint(gddr_client *c);
uint64_t gddr__shards_next_step(gddr_client *c);
int gddr__shards_version(const gddr_client *c, int id, uint64_t *version);
void gddr__shards_counters(const gddr_client *c, gddr_client_counters *out);
int gddr__shards_stats(gddr_client *c, gddr_server_stats *out);
int gddr__shards_metrics(gddr_client *c, char **text);
/* Prometheus texts of n servers as one, each sample labelled shard="I"
 * (malloc'd; NULL on no memory). */
char *gddr__metrics_merge(const char *const *texts, int n);

/* client.c */
int gddr__set_err(gddr_client *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int gddr__send_req(gddr_client *c, Gddr__Request *rq, const gddr__raw *raws, int nraw, op_kind kind,
                   int tensor, uint64_t *ticket);
op *gddr__op(gddr_client *c, uint64_t ticket);
/* Waits for one op until timeout_ms; frees its slot unless keep is set. */
int gddr__wait_op(gddr_client *c, uint64_t ticket, int timeout_ms, op *result);
int gddr__reconnect(gddr_client *c);
/* The step a new push of tensor i carries: this client's step counter, or
 * one above the tensor's last push if that is higher (every push of a
 * tensor must carry a larger step than the one before: exactly once). */
uint64_t gddr__push_step(gddr_client *c, int i);
int gddr__push_tensor(gddr_client *c, int i, const gddr__push_args *a, uint64_t *ticket);
/* Pushes and waits for the answer, again (the same push) after a reconnect
 * while the server is away, within reconnect_timeout_ms. */
int gddr__push_wait(gddr_client *c, int i, const gddr__push_args *a, uint64_t *version);
/* Returns when ZeroMQ holds no buffer lent by gddr__push_args.lend any more:
 * at once after a completed exchange (the server answered, so the bytes were
 * sent); otherwise the socket is dropped (and reopened by the next call's
 * reconnect) so that queued messages let go of the buffers. */
void gddr__lent_wait(gddr_client *c);

/* Whether a failed call may succeed after gddr__reconnect(): no answer, or
 * a restarted server that no longer knows our tensors or versions. */
int gddr__needs_reconnect(gddr_client *c, int rc);
/* A tensor's last pulled values, contiguous (parts are joined on first
 * use); NULL only when out of memory. */
const float *gddr__last(ctensor *t);
/* A pull of gddr_step that updates the tensor's view (its last values and
 * version): lazy (Pull.delay_fraction) when pull_delay_fraction > 0. */
int gddr__pull_view(gddr_client *c, int i, float *out, uint64_t min_version, uint64_t step,
                    uint64_t *ticket);
int gddr__pull_tensor(gddr_client *c, int i, float *out, uint64_t min_version, uint64_t step,
                      uint64_t *ticket);

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
 * of pipeline.c calls it); the public gddr_step_from() refuses with
 * GDDR_ESTATE while the pipeline has steps in flight. */
int gddr__step_run(gddr_client *c, const float *const *grads, const float *const *computed_on,
                   const uint64_t *versions, float *const *params);
/* recovery.c: the GDDR mask's arguments for tensor i this step (host and device paths
 * alike): the hold probability that makes delay_fraction the share of the
 * chunks held back under the tensor's tau (gddr_hold_probability). */
gddr_residual_args gddr__residual_args(const gddr_client *c, int i);
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
 * accumulated gradient, the device state); gddr_client_close calls it. */
void gddr__step_free(ctensor *t);

/* pipeline.c */
/* 1 while gddr_step_submit() has steps the trainer has not waited for
 * (trainer thread only). */
int gddr__pipeline_busy(const gddr_client *c);
/* Joins the library thread and frees the pipeline (gddr_client_close). */
void gddr__pipeline_stop(gddr_client *c);

int gddr__socket_new(gddr_client *c, void **out, void **mon);
/* Reads the main socket's monitor: GDDR_EAUTH (message set) when the
 * server refused the security handshake, else GDDR_OK. */
int gddr__mon_check(gddr_client *c);

/* heartbeat.c: a thread with its own socket tells the server this worker
 * is alive every heartbeat_ms, also while the trainer computes a long step. */
int gddr__heartbeat_start(gddr_client *c);
void gddr__heartbeat_stop(gddr_client *c);

/* options.c */
int gddr__env_rank(void);
int gddr__env_world(void);

/* ---- options ABI (issue 21, "One row per option"; client/src/options.c) ----
 * gddr.h maps gddr_client_open() onto gddr_client_open_sized() for callers.
 * Inside the library the name gddr_client_open means the full-struct open
 * (whatever defines it): options.c exports the symbol gddr_client_open with
 * the frozen prefix's size for binaries built against the first gddr.h, and
 * every sized entry point ends here with a complete gddr_client_opts. */
#undef gddr_client_open
#define gddr_client_open gddr__client_open_full
int gddr__client_open_full(const gddr_client_opts *opts, gddr_client **out);
/* The [client] section of an INI file onto *o (a complete struct); string
 * options point into slots (GDDR_CONF_MAXKEYS of them), which must outlive
 * their use. */
union gddr__client_slot;
int gddr__opts_from_ini(const char *path, gddr_client_opts *o, union gddr__client_slot *slots,
                        char *err, size_t errlen);

#endif
