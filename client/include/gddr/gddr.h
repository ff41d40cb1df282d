/* gddr.h -- the public API of libgddr-client.
 *
 * A trainer links libgddr-client to keep its model on a gddr-ps parameter
 * server: it registers named float32 tensors, pulls parameters and pushes
 * gradients. Everything in this folder (client/include/gddr/) is supported
 * API; nothing else is.
 *
 * Conventions (nng/libuv style): every call returns a gddr_err (GDDR_OK = 0)
 * unless it says otherwise; handles are opaque; gddr_client_close() NULLs the
 * caller's pointer. One gddr_client must be used by one thread at a time. The
 * library never calls exit() and prints nothing unless a logger is set.
 */
#ifndef GDDR_GDDR_H
#define GDDR_GDDR_H

#include <stddef.h>
#include <stdint.h>

/* The error codes, log levels, logger callback, consistency modes and DC
 * forms, part of this API: common/gddr_base.h, which the daemon and the
 * kernels use too (this folder holds a link to it; make install copies it
 * next to this file). */
#include "gddr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Client options. Start from GDDR_CLIENT_OPTS_INIT (C) or
 * gddr_client_opts_init() (any language) and change what you need, by
 * field or by name (gddr_opts_set); both name every field, so a field
 * added later gets its default in code written before it. Strings are
 * copied by gddr_client_open(); the caller keeps ownership.
 *
 * ABI: the fields up to connect_timeout_ms are a frozen prefix; new fields
 * are only ever appended, and every call that takes this struct is given
 * its size (the macros below pass sizeof for you), so a program built
 * against an older gddr.h keeps working with a newer library: the fields
 * it does not know get their defaults (docs/client.md, "ABI"). */
typedef struct gddr_client_opts {
    const char *server;     /* endpoint, e.g. "tcp://127.0.0.1:5555" (required) */
    int rank;               /* worker rank; -1: GDDR_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, RANK, else 0 */
    int world_size;         /* number of workers; 0: GDDR_WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, WORLD_SIZE, else 1 */
    int timeout_ms;         /* bound on every wait for a reply */
    int reconnect_timeout_ms; /* how long any call keeps retrying a server that is down,
                                 restarting or not up yet before failing */
    double clip_norm;       /* global-norm gradient clipping; 0 = off */
    double dc_lambda;       /* DC-ASGD lambda (lambda0 when adaptive); 0 = off */
    int dc_mode;            /* gddr_dc_mode */
    int dc_adaptive;        /* 1: lambda_t = lambda0 / sqrt(ms_t + eps) */
    double dc_ms_decay;     /* EMA factor of g^2 for adaptive DC */
    double delay_fraction;  /* GDDR alpha; 0 = dense pushes */
    uint64_t seed;          /* seed of the GDDR hold mask (the INI's default too) */
    int residual_checkpoint_steps; /* attach the residual to a push every N steps; 0 = never */
    double replay_decay;    /* gamma of orphan installments */
    int async_pipeline;     /* 1: gddr_step_submit() runs on a library thread */
    gddr_log_fn log;        /* NULL: silent */
    void *log_user;
    int log_level;          /* GDDR_LOG_* */
    int observer;           /* 1: a tool (gddr-ctl), not a worker: never counted in steps */
    const char *curve_server_key; /* the server's Z85 public key; NULL = no CURVE */
    const char *curve_key_file;   /* this client's key file (gddr-keygen NAME -> NAME.key) */
    int heartbeat_ms;       /* a library thread says "alive" this often, also during long
                               computations; 0 = only requests count (keep it well below the
                               server's worker_timeout_s) */
    uint64_t part_bytes;    /* a tensor larger than this is pushed and pulled in parts of at
                               most this many bytes (whole chunks): the server validates and
                               applies as parts arrive and no message is page-fault bound;
                               0 = one message per tensor */
    int accumulate_steps;   /* k > 1: gddr_step adds each gradient into a local buffer and
                               pushes their mean every k-th call, tagged with the version the
                               first of them was computed on; the other calls return at once
                               with the parameters unchanged. 0 or 1 = push every step */
    double pull_delay_fraction; /* GDDR on pulls: gddr_step's pulls bring only the chunks this
                               worker's view lacks, each changed chunk held back with this
                               probability but never more than tau pulls in a row (the view
                               is at most tau pulls stale per chunk; gddr_pull is always
                               whole and exact). 0 = whole pulls */
    int pull_delta_bits;    /* 8 or 16: gddr_step's pulls bring, per chunk that differs from
                               this worker's view, the difference in 8- or 16-bit integers
                               with one scale (the server keeps an exact copy of the view,
                               4 bytes a value, and carries what rounding left out into the
                               next pull: nothing drifts; a value of the view is within
                               max|difference| / 254 (/ 65534) of the server's). Composes
                               with pull_delay_fraction. 0 = float32 values */
    int connect_timeout_ms; /* how long gddr_client_open waits for a server that is not there
                               (yet): nothing listening, or no answer to the hello. The error
                               then says which. -1 = reconnect_timeout_ms (a cluster may start
                               in any order) */
    int pull_delta_auto;    /* 1: with pull_delta_bits or pull_delay_fraction set, gddr_step
                               times its pulls and uses a whole float32 pull instead while
                               that is the cheaper (a fast link: the codec costs more than
                               the bytes it saves), trying the other kind now and then
                               (after 16 pulls, then 32, 64, ... up to 1024). 0 = always
                               the reduced pulls asked for */
    int hold_schedule;      /* gddr_hold_schedule: which chunks GDDR holds. STAGGERED: each
                               chunk is held tau steps of every floor(tau / delay_fraction),
                               the workers' windows spread evenly over the cycle by rank, so
                               every step most chunks reach the server fresh from some
                               workers (sync steps fill the holders' share from them).
                               RANDOM: held with probability alpha, per worker and step.
                               SMALLEST: the delay_fraction share of chunks whose r + g has
                               the least sum of squares (top-k with a residual, by chunk).
                               AUTO (0): staggered in sync mode, smallest in async and ssp */
    int delay_auto;         /* 1: with delay_fraction set, gddr_step times its pushes (from
                               building them to their acknowledgement) and pushes every chunk
                               instead of holding some while that is the cheaper (a fast link:
                               packing costs more than the bytes it saves), trying both kinds
                               in turns now and then (9 steps after 24 steps, then 48, 96, ...
                               up to 1024; two such probes in a row must agree to change kind).
                               The first dense step sends the residual too, so nothing is
                               held while the pushes are dense. 0 = always hold */
} gddr_client_opts;

#define GDDR_CLIENT_OPTS_INIT                                                 \
    { .server = NULL, .rank = -1, .world_size = 0, .timeout_ms = 5000,        \
      .reconnect_timeout_ms = 30000, .clip_norm = 0.0, .dc_lambda = 0.0,      \
      .dc_mode = GDDR_DC_DIAG, .dc_adaptive = 0, .dc_ms_decay = 0.95,         \
      .delay_fraction = 0.0, .seed = 12345,                   \
      .residual_checkpoint_steps = 0, .replay_decay = 0.5, .async_pipeline = 1, \
      .log = NULL, .log_user = NULL, .log_level = GDDR_LOG_WARN, .observer = 0, \
      .curve_server_key = NULL, .curve_key_file = NULL, .heartbeat_ms = 2000, \
      .part_bytes = 4u << 20, .accumulate_steps = 1, .pull_delay_fraction = 0.0,   \
      .pull_delta_bits = 0, .connect_timeout_ms = -1, .pull_delta_auto = 0,    \
      .hold_schedule = GDDR_HOLD_AUTO, .delay_auto = 0 }

/* The end of the frozen prefix: the size of gddr_client_opts in the first
 * gddr.h (its last field's end, without trailing padding). */
#define GDDR_CLIENT_OPTS_V0_SIZE (offsetof(gddr_client_opts, connect_timeout_ms) + sizeof(int))

/* Fills *o, of `size` bytes (sizeof(gddr_client_opts) of the caller's
 * gddr.h), with the defaults GDDR_CLIENT_OPTS_INIT gives. GDDR_EINVAL when
 * size is below GDDR_CLIENT_OPTS_V0_SIZE; GDDR_ENOTSUP when it is larger
 * than this library's struct (a program built against a newer gddr.h: the
 * known fields are filled, the rest zeroed). gddr_opts_errmsg() says why. */
int gddr_client_opts_init_sized(gddr_client_opts *o, size_t size);

/* The size of gddr_client_opts this library knows (a caller without a C
 * compiler, e.g. Python, allocates this many bytes). */
size_t gddr_client_opts_size(void);

/* Sets option `name` (the field's name) of *o (size bytes) from text,
 * parsed with the option's type and checked against its bounds: numbers in
 * decimal, booleans true/false/yes/no/on/off/1/0, enums by name (dc_mode
 * "diag" or "identity", log_level "error".."debug") or value. A string
 * option stores the pointer `value` itself (keep it valid until
 * gddr_client_open returns, as for a field set by hand); "" sets NULL.
 * GDDR_EINVAL for an unknown name, a bad value, a pointer option (use
 * gddr_opts_set_ptr) or a field past `size`; gddr_opts_errmsg() says which. */
int gddr_opts_set(gddr_client_opts *o, size_t size, const char *name, const char *value);

/* Sets a pointer option (log, log_user) by name. */
int gddr_opts_set_ptr(gddr_client_opts *o, size_t size, const char *name, void *value);

/* Writes option `name` of *o as text gddr_opts_set takes back into buf
 * (len bytes, always NUL-terminated): enums by name, booleans true/false,
 * a NULL string as "". */
int gddr_opts_get(const gddr_client_opts *o, size_t size, const char *name, char *buf,
                  size_t len);

/* Option i (0, 1, ... until it returns NULL): its name; and through the
 * pointers that are not NULL, its type ("int", "uint64", "double", "bool",
 * "enum", "string", "pointer"), its default as text ("" for none), for an
 * enum its values as "name=value,..." (else ""), and one sentence of help.
 * The strings are static. Lists every field of gddr_client_opts. */
const char *gddr_opts_describe(size_t i, const char **type, const char **def,
                               const char **choices, const char **help);

/* Why the last gddr_opts_* or *_sized call of this thread failed ("" when
 * it did not); static per thread. After a failed gddr_client_open (a
 * *_sized call), the reason: an option refused, or the server's answer
 * ("rank 4 of world_size 4: ..."), or what the connection found
 * ("nothing accepts connections at ..."). */
const char *gddr_opts_errmsg(void);

/* Fills *o with the defaults GDDR_CLIENT_OPTS_INIT gives (the frozen prefix
 * only: binaries built against the first gddr.h call this symbol; the
 * macro below calls gddr_client_opts_init_sized). */
void gddr_client_opts_init(gddr_client_opts *o);

typedef struct gddr_client gddr_client;

/* A handle for a request in flight; pass to gddr_wait(). */
typedef uint64_t gddr_ticket;

/* Opens a client and says hello to the server. A server that does not
 * answer yet (a cluster starting in any order), or that still holds this
 * rank for a previous process not yet declared dead, is waited for, up to
 * reconnect_timeout_ms. The rank must be below world_size (observers
 * excepted). On success *out owns a new client, released by
 * gddr_client_close().
 *
 * Every blocking call (register, pull, push, step) rides out a server
 * restart or pause the same way: it reconnects, registers again and
 * repeats itself within reconnect_timeout_ms. A push repeated so is taken
 * by the server exactly once (it carries the same step; the server answers
 * a resend with the first outcome).
 *
 * `size` is sizeof(gddr_client_opts) of the caller's gddr.h: fields past it
 * get their defaults. GDDR_EINVAL below GDDR_CLIENT_OPTS_V0_SIZE; GDDR_ENOTSUP
 * above this library's struct (built against a newer gddr.h: upgrade the
 * library); gddr_opts_errmsg() says which. */
int gddr_client_open_sized(const gddr_client_opts *opts, size_t size, gddr_client **out);

/* The same for a struct of GDDR_CLIENT_OPTS_V0_SIZE bytes (the symbol that
 * binaries built against the first gddr.h call; the macro below calls
 * gddr_client_open_sized). */
int gddr_client_open(const gddr_client_opts *opts, gddr_client **out);

/* Like gddr_client_open() with options read from the [client] section of an
 * INI file; fields of `overrides` that differ from GDDR_CLIENT_OPTS_INIT win
 * (pass NULL for none). A config error is reported through errbuf as
 * "file:line: key: text". */
int gddr_client_open_ini_sized(const char *path, const gddr_client_opts *overrides, size_t size,
                               gddr_client **out, char *errbuf, size_t errlen);
/* The same with overrides of GDDR_CLIENT_OPTS_V0_SIZE bytes. */
int gddr_client_open_ini(const char *path, const gddr_client_opts *overrides,
                         gddr_client **out, char *errbuf, size_t errlen);

/* Code built against this header passes its struct's size: these three
 * names are macros over the sized calls (define GDDR_NO_SIZED_MACROS to
 * call the frozen-prefix symbols instead). */
#ifndef GDDR_NO_SIZED_MACROS
#define gddr_client_opts_init(o) ((void)gddr_client_opts_init_sized((o), sizeof(gddr_client_opts)))
#define gddr_client_open(opts, out) gddr_client_open_sized((opts), sizeof(gddr_client_opts), (out))
#define gddr_client_open_ini(path, overrides, out, errbuf, errlen)                               \
    gddr_client_open_ini_sized((path), (overrides), sizeof(gddr_client_opts), (out), (errbuf),   \
                               (errlen))
#endif

/* Tells the server this worker is done (so sync steps stop waiting for it),
 * closes the socket, frees everything and sets *c to NULL. NULL-safe. */
void gddr_client_close(gddr_client **c);

/* The last error's detailed message (e.g. the server's text); owned by the
 * client, valid until the next call on it. */
const char *gddr_client_errmsg(const gddr_client *c);

/* What the server said at hello and since. */
typedef struct gddr_server_info {
    uint64_t epoch;         /* changes on every server restart */
    int mode;               /* gddr_mode in force now */
    int tau;                /* current GDDR delay bound the server asks for */
    int chunk;              /* chunk size in elements */
    int workers;            /* workers the server expects */
    int rank;               /* this client's rank */
    int world_size;         /* workers in this client's job: its world_size option, or the
                               launcher's (GDDR_WORLD_SIZE, SLURM_NTASKS, ...) */
} gddr_server_info;
int gddr_client_info(gddr_client *c, gddr_server_info *out);

/* Registers tensor `key` with n initial values. The first registration
 * creates it; later ones with the same n return the existing tensor (values
 * unchanged); another n is GDDR_ELENGTH. *id receives a small integer used by
 * the other calls; *version (may be NULL) the tensor's version. */
int gddr_register(gddr_client *c, const char *key, const float *init, size_t n,
                  int *id, uint64_t *version);

/* gddr_register() with the optimizer the server is to run for this tensor,
 * as text: "KIND [key=value ...]", KIND sgd, adam, adamw or adagrad, keys
 * lr, momentum (sgd), beta1, beta2 (or betas=B1,B2), eps, weight_decay;
 * what is not given takes torch.optim's default, lr 0 (or none) the
 * server's lr. NULL or "": the server's [optimizer] section. The first
 * registration of a key decides; one that names another optimizer later
 * fails with GDDR_ECONFIG (the message says what the tensor runs). */
int gddr_register_opt(gddr_client *c, const char *key, const float *init, size_t n,
                      const char *optimizer, int *id, uint64_t *version);

/* What the server runs for tensor id, as text in the form
 * gddr_register_opt() takes (e.g. "adam lr=0.001 beta1=0.9 ..."), into buf
 * (len bytes, always NUL-terminated). */
int gddr_tensor_optimizer(gddr_client *c, int id, char *buf, size_t len);

/* Sets the learning rate every later push carries (a schedule on the
 * worker: warm-up, step, cosine); the server uses it instead of the
 * tensor's lr, still divided by AdaDelay's 1 + adadelay * staleness. 0:
 * the tensor's lr. Thread-safe; a pipelined step in flight may go out with
 * the value before. lr must be in [0, 1e6]. */
int gddr_set_lr(gddr_client *c, double lr);

/* Blocking pull: copies the tensor into out (n floats) once its version is
 * at least min_version (0: now). *version (may be NULL) receives the version
 * returned, which the next push of this tensor is tagged with. */
int gddr_pull(gddr_client *c, int id, float *out, uint64_t min_version, uint64_t *version);

/* Tags a push explicitly; zero-initialise and set what you know. */
typedef struct gddr_push_tags {
    uint64_t birth_version; /* version the gradient was computed on */
    uint64_t base_version;  /* version it was compensated to (= birth without DC) */
    int has_birth;          /* 0: use the version of the last pull of this tensor */
} gddr_push_tags;

/* Blocking push of a dense gradient of n floats, tagged with the version of
 * the last pull of this tensor, this client's step counter and the gradient
 * norm. *version (may be NULL) receives the version after the server took it.
 * Every push of a tensor carries a larger step than the one before (a second
 * push of a tensor in the same step takes the next step number): the server
 * takes each (rank, tensor, step) once. */
int gddr_push(gddr_client *c, int id, const float *grad, uint64_t *version);
int gddr_push_ex(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                 uint64_t *version);

/* Non-blocking forms: the request is sent and *ticket identifies it; `out`
 * must stay valid until gddr_wait() returns for that ticket. These do not
 * reconnect: a GDDR_ETIMEDOUT from gddr_wait() leaves it to the caller (a
 * push sent again with gddr_push_async is a new push, with a new step). */
int gddr_pull_async(gddr_client *c, int id, float *out, uint64_t min_version,
                    gddr_ticket *ticket);
int gddr_push_async(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                    gddr_ticket *ticket);

/* Waits up to timeout_ms (<0: the client's timeout) for a ticket; returns its
 * result. *version (may be NULL) receives the version the reply carried. */
int gddr_wait(gddr_client *c, gddr_ticket ticket, int timeout_ms, uint64_t *version);

/* One training step over every registered tensor, in the order the server's
 * mode needs (docs/design.md section 6): clip, DC-ASGD, GDDR residual, push,
 * pull. grads[i] and params[i] point at tensor i's n floats (ids in
 * registration order); params receives the parameters for the next step. */
int gddr_step(gddr_client *c, const float *const *grads, float *const *params);

/* Like gddr_step() for a gradient computed on other parameters than the
 * last ones pulled: computed_on[i] (NULL: the last pulled) at versions[i]
 * (NULL: the last pulled). This is how gddr-train --simulate-staleness
 * replays old parameters; DC-ASGD compensates against computed_on. */
int gddr_step_from(gddr_client *c, const float *const *grads, const float *const *computed_on,
                   const uint64_t *versions, float *const *params);

/* Pipelined steps (docs/design.md section 6, "Threads"). gddr_step_submit()
 * copies grads[i] (host or CUDA device memory; a device gradient must be
 * complete, i.e. its stream synchronised) into a free slot of a two-slot lock-free
 * single-producer/single-consumer ring and returns at once; a library
 * thread, started by the first submit, runs gddr_step() on the slots in
 * order while the caller goes on computing. Two steps may be in flight; a
 * third submit returns GDDR_ESTATE. The gradient is tagged with the
 * versions of the parameters the caller last received from
 * gddr_step_wait() (or pulled before the first submit): a trainer that
 * computes the next gradient while a step is in flight trains on
 * one-step-stale parameters, the price of hiding the communication.
 * With opts.async_pipeline = 0 the step runs inside submit instead.
 * Register every tensor before the first submit (gddr_register() answers
 * GDDR_ESTATE afterwards).
 * Ownership and threads: call submit and wait from one thread. From the
 * first submit until every submitted step has been waited for, the library
 * thread owns the client (its socket included): call no other function on
 * it meanwhile (gddr_step() and gddr_step_from() answer GDDR_ESTATE). */
int gddr_step_submit(gddr_client *c, const float *const *grads);

/* Waits for the oldest submitted step and returns its result; on success
 * copies its new parameters into params[i] (host or device memory, n floats
 * each). The wait is bounded by 3 * timeout_ms + reconnect_timeout_ms + 2 s:
 * GDDR_ETIMEDOUT then means the step is still in flight (wait again, or
 * close the client, which joins the library thread). GDDR_ESTATE: nothing
 * is in flight. Same thread as gddr_step_submit(). */
int gddr_step_wait(gddr_client *c, float *const *params);

/* Asks the server for its Prometheus text; *text is malloc'd, the caller
 * frees it. */
int gddr_server_metrics_text(gddr_client *c, char **text);

/* Asks the server to write a checkpoint now (it acknowledges at once and
 * writes in the background). */
int gddr_request_checkpoint(gddr_client *c);

/* Bumps this client's step counter (gddr_step does it; call it yourself when
 * you drive push/pull by hand). Returns the new step. */
uint64_t gddr_next_step(gddr_client *c);

/* The version of tensor id the client last pulled (what a push is tagged
 * with by default). */
int gddr_tensor_version(const gddr_client *c, int id, uint64_t *version);

/* Counters the client kept. */
typedef struct gddr_client_counters {
    uint64_t steps, pushes, pulls;
    uint64_t bytes_pushed, bytes_pulled; /* wire bytes, all frames */
    uint64_t values_pushed;              /* floats sent in push payloads */
    uint64_t reconnects;
    uint64_t staleness_sum;              /* server-measured tau summed over pushes */
    uint64_t orphans_received;           /* orphaned residuals handed to us */
    uint64_t tau_sum, tau_count;         /* GDDR delay bound in force, summed over
                                            tensor pushes of gddr_step (mean = sum/count) */
    uint64_t step_ns;                    /* time spent inside gddr_step calls (on the
                                            library thread when pipelined) */
} gddr_client_counters;
int gddr_client_counters_get(const gddr_client *c, gddr_client_counters *out);

/* Server-side statistics (one request). */
typedef struct gddr_server_stats {
    uint64_t pushes, pulls, rejected, versions_total;
    double staleness_mean, staleness_ema;
    uint64_t staleness_max;
    uint64_t staleness_hist[17]; /* tau = 0..15, last bucket >= 16 */
    double worker_staleness_mean;  /* this worker's mean */
    uint64_t worker_pushes;        /* this worker's pushes */
    int tau, live_workers, mode;
    uint64_t epoch;
} gddr_server_stats;
int gddr_server_stats_get(gddr_client *c, gddr_server_stats *out);

/* 1 when this library can take CUDA device memory (built with CUDA, its
 * plugin libgddr-cuda.so and the NVIDIA driver found, a device present);
 * else 0 and, in why (len bytes, may be NULL), the reason. Loads the
 * plugin on first call. */
int gddr_cuda_status(char *why, size_t len);

/* ---- Sparse embedding tables (docs/protocol.md, "Tables") -----------------
 *
 * Rows of `dim` floats named by 64-bit keys (hashes of IDs: any value),
 * created on the server on first touch, stepped there by the table's
 * optimizer with the gradients pushed for them. On a sharded client the
 * row of key k lives on server splitmix64(k) mod S, and every call sends
 * one request to each server concerned, all in flight at once. */

enum { GDDR_TINIT_ZEROS = 0, GDDR_TINIT_UNIFORM = 1, GDDR_TINIT_NORMAL = 2 };
enum { GDDR_TADMIT_ALWAYS = 0, GDDR_TADMIT_COUNT = 1, GDDR_TADMIT_PROB = 2 };

/* A table's registration. Start from GDDR_TABLE_OPTS_INIT. Fields are only
 * ever appended (gddr_table_register passes the size it was built with). */
typedef struct gddr_table_opts {
    int init;               /* GDDR_TINIT_*: zeros, U(-init_scale, init_scale), N(0, init_scale^2) */
    float init_scale;
    uint64_t init_seed;     /* a row's initial value depends on (init_seed, key) only */
    int admit;              /* GDDR_TADMIT_*: a row at first touch, after admit_count training
                               pulls saw the key, or with probability admit_prob a sighting */
    unsigned admit_count;
    float admit_prob;
    const char *optimizer;  /* "sgd lr=0.1", "adam lr=0.001", "adagrad lr=0.05 eps=1e-8"
                               (gddr_register_opt's form; no momentum or weight decay);
                               NULL: SGD at the server's lr */
    uint64_t max_rows;      /* rows the table may hold (per server); 0: the server's bound only */
    uint64_t row_ttl;       /* evict rows untouched for this many table versions; 0: never */
} gddr_table_opts;

#define GDDR_TABLE_OPTS_INIT                                                     \
    { .init = GDDR_TINIT_ZEROS, .init_scale = 0.0f, .init_seed = 0,              \
      .admit = GDDR_TADMIT_ALWAYS, .admit_count = 1, .admit_prob = 1.0f,         \
      .optimizer = NULL, .max_rows = 0, .row_ttl = 0 }

/* Registers a table (on every server of a sharded client), or looks up the
 * one of that key (same dim: answered; another: GDDR_ELENGTH); *table gets
 * its handle. opts NULL: GDDR_TABLE_OPTS_INIT. Re-registered after a
 * reconnect like tensors. Call gddr_table_register(); the _sized form is
 * its ABI. */
int gddr_table_register_sized(gddr_client *c, const char *key, uint32_t dim,
                              const gddr_table_opts *opts, size_t opts_size, int *table);
static inline int gddr_table_register(gddr_client *c, const char *key, uint32_t dim,
                                      const gddr_table_opts *opts, int *table)
{
    return gddr_table_register_sized(c, key, dim, opts, sizeof(gddr_table_opts), table);
}

/* gddr_pull_rows flags */
#define GDDR_ROWS_NOCREATE 1u /* inference: keys without a row read as zeros, nothing is created */

/* Reads n rows into out (n * dim floats, in the order of keys; keys may
 * repeat: each is sent once and its row copied). A training pull (flags 0) creates rows as the table's admission
 * says; keys not admitted yet read as their initial value. Waits until the
 * table has at least min_version and what this client's last push of the
 * table needs (a sync step completed); *version (may be NULL) gets the
 * table's version (the smallest over servers). */
int gddr_pull_rows(gddr_client *c, int table, const uint64_t *keys, size_t n, float *out,
                   unsigned flags, uint64_t min_version, uint64_t *version);

/* Pushes the gradients of n rows (grads: n * dim floats, in the order of
 * keys). A key may repeat: its gradients are summed before sending. The
 * push carries the version of this client's last pull of the table (its
 * staleness) and a step of its own (exactly once, retried across
 * reconnects like every push). In sync mode it joins the step; a server
 * that holds none of the keys gets an empty push, as the step needs one of
 * every worker. *version (may be NULL): the table's version after it. */
int gddr_push_rows(gddr_client *c, int table, const uint64_t *keys, size_t n, const float *grads,
                   uint64_t *version);

#ifdef __cplusplus
}
#endif
#endif /* GDDR_GDDR_H */
