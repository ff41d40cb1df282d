/* ps.h -- the state of one gddr-ps instance, shared by its files.
 *
 * Threads: one front thread owns the ROUTER socket and every field below;
 * it validates each request, then either answers it (pull, stats) or
 * applies it. Applying a large push is split across the apply pool
 * (apply.c), each thread owning a chunk range, and the front thread waits
 * for all of them before it reads the next message. So a pull, served by
 * the front thread between applies, never sees half a push.
 */
#ifndef GDDR_SERVER_PS_H
#define GDDR_SERVER_PS_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <zmq.h>

#include "config.h"
#include "gddr/gddr.h"
#include "wire.h"

#define PS_HIST 17 /* staleness buckets 0..15 and >= 16 */

/* Running staleness statistics (global, per worker). */
typedef struct ps_stale {
    uint64_t count, max, sum;
    double ema;
    uint64_t hist[PS_HIST];
} ps_stale;

typedef struct ps_tensor {
    char key[128];
    uint32_t id;
    size_t n;
    size_t nchunks;
    uint32_t chunk;    /* elements per chunk; the last may be short */
    float *w;          /* values */
    float *mom;        /* momentum buffer, NULL until momentum is used */
    uint64_t version;  /* updates applied */
    /* sync: the step being collected */
    float *acc;        /* sum of lr_eff * g of this step's pushes */
    uint8_t *touched;  /* per chunk: some push of this step carried it */
    uint8_t *contrib;  /* per rank: pushed in this step */
    uint32_t ncontrib; /* distinct ranks in this step */
    uint32_t npushes;  /* pushes folded into this step */
    /* dynamic tau */
    int tau;
    double norm_ema, rate_ema;
    int calm;
} ps_tensor;

typedef struct ps_worker {
    int known;          /* said hello at least once */
    int alive;
    int64_t last_seen_ms;
    uint64_t clock;     /* steps pushed: highest step + 1 */
    uint64_t pushes;
    ps_stale stale;
} ps_worker;

typedef struct ps_pull {
    zmq_msg_t ident;
    uint64_t req_id;
    uint32_t rank, id;
    uint64_t min_version, step;
    int64_t deadline_ms;
} ps_pull;

/* Counters of rejected requests, by reason (gddr_err code). */
#define PS_NERR 32

typedef struct ps_pool ps_pool;

typedef struct gddr_ps {
    gddr_ps_config cfg;
    char cfg_path[4096];
    void *zctx, *router, *metrics;
    char endpoint[256];
    uint64_t epoch;
    int64_t start_ms, first_hello_ms;

    ps_tensor **tensors;
    size_t ntensors;

    ps_worker *workers;   /* cfg.max_workers entries */
    int announced_world;  /* largest world_size in a hello */

    ps_pull *pulls;
    size_t npulls, cap_pulls;

    ps_pool *pool;
    int64_t *offbuf;      /* per-chunk offsets of the push being applied */
    size_t offcap;

    /* metrics */
    uint64_t pushes, pulls_served, inits, bytes_in, bytes_out, versions_total;
    uint64_t rejected[PS_NERR];
    uint64_t deaths, rejoins;
    ps_stale stale;
    int alarm_on;

    /* checkpoints */
    struct gddr_ckpt_writer *ckw;
    uint64_t ckpt_seq;
    int64_t last_ckpt_ms;
    uint64_t ckpt_count;
    double ckpt_last_ms, ckpt_copy_ms;
    int ckpt_pending, final_ckpt_rc;

    /* residual snapshots and orphans (orphan.c) */
    struct ps_orphans *orphans;

    /* CURVE allowlist (auth.c) */
    void *zap;
    unsigned char (*allow)[32];
    int nallow;
    uint64_t auth_rejected;

    /* command-line overrides ("key=value" or "section.key=value"), applied
     * again on top of the file at every SIGHUP */
    char **overrides;
    int noverrides;

    void (*tick)(struct gddr_ps *); /* called every loop turn (watchdog) */
    volatile sig_atomic_t stop, reload, ckpt_now;
} gddr_ps;

/* server.c */
int gddr_ps_open(gddr_ps **out, const gddr_ps_config *cfg, const char *cfg_path, char *err,
                 size_t errlen);
/* Runs until stop is set; `ready` is called once after the socket is bound. */
int gddr_ps_run(gddr_ps *ps, void (*ready)(gddr_ps *));
void gddr_ps_close(gddr_ps **ps);
int gddr_ps_live_workers(gddr_ps *ps);
/* Allocates and registers an empty tensor (used by init and restore). */
ps_tensor *gddr_ps_tensor_create(gddr_ps *ps, const char *key, size_t n);
int gddr_ps_expected_workers(const gddr_ps *ps);

/* apply.c: the apply pool. */
typedef enum { PS_JOB_APPLY, PS_JOB_ACC, PS_JOB_SYNC } ps_job_kind;
typedef struct ps_job {
    ps_job_kind kind;
    ps_tensor *t;
    const float *vals;      /* payload (APPLY, ACC) */
    const int64_t *off;     /* per chunk: offset into vals, -1 absent; NULL = dense */
    float scale;            /* APPLY, ACC: lr_eff; SYNC: 1/N */
    float mu;               /* momentum */
} ps_job;
int ps_pool_start(ps_pool **out, int threads);
void ps_pool_run(ps_pool *p, const ps_job *job);
void ps_pool_stop(ps_pool **p);

/* auth.c: CURVE on the ROUTER and a ZAP handler checking client keys. */
int gddr_ps_auth_setup(gddr_ps *ps, char *err, size_t errlen);
void gddr_ps_auth_poll(gddr_ps *ps);
int gddr_ps_auth_reload(gddr_ps *ps);
void gddr_ps_auth_close(gddr_ps *ps);

/* server.c: 1 when no element is NaN or Inf. */
int ps_all_finite(const float *v, size_t n);

/* stats.c */
void ps_stale_add(ps_stale *s, uint64_t tau, double decay);
double ps_stale_mean(const ps_stale *s);
/* Prometheus text into a malloc'd string. */
char *ps_metrics_text(gddr_ps *ps);

/* tau.c: dynamic tau controller. Returns 1 when tau changed. */
int ps_tau_update(const gddr_ps_config *cfg, ps_tensor *t, double grad_norm);

#endif
