/* shard.h -- the sharded backend's own (shard*.c): the router's state.
 *
 * shard.c       open, close, registration, pulls, pushes, tickets, the
 *               whole-client calls, the backend table gddr__sharded
 * shard_step.c  steps, submit and wait over every server at once
 * shard_fan.c   the fan-out: one thread per server
 * shard_rows.c  sparse tables: rows split by key over the servers
 * shard_place.c what needs no client: the server list, where a tensor's
 *               pieces live, counters, stats and metrics texts merged
 *
 * Each server's client is a gddr__single client (single.c), driven through
 * its backend table (sub->be), never through the public functions.
 */
#ifndef GDDR_CLIENT_SHARD_H
#define GDDR_CLIENT_SHARD_H

#include <pthread.h>

#include "client_int.h"

#define SPLIT_BYTES (1u << 20)
#define MAX_SHARDS 256

typedef struct spiece {
    int shard, id;     /* the shard's client, its tensor id there */
    size_t off, n;     /* values [off, off + n) of the tensor */
} spiece;

typedef struct stensor {
    char key[128];
    size_t n;
    int np;
    spiece *p;
} stensor;

typedef struct sgroup {    /* a ticket of the router: one per piece */
    uint64_t ticket;
    int n;
    int *shard;
    gddr_ticket *sub;
} sgroup;

typedef struct gddr__shards gddr__shards;

struct gddr__shards {
    int S;
    gddr_client **sub;
    char (*ep)[512];       /* the endpoints, in shard order */
    char (*why)[512];      /* why a shard could not be opened */
    stensor *t;
    int nt;
    sgroup *groups;
    int ngroups;
    uint64_t next_ticket;
    float **scaled;        /* per tensor: a clipped copy of the gradient (or NULL) */
    /* fan-out: shard s > 0 runs on thread s-1, shard 0 on the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int busy, stop;
    int (*fn)(gddr_client *, int, void *);
    void *arg;
    int *rc;
};

/* shard_fan.c: makes the lock and, unless rc is an error already, starts
 * the threads of shards 1..S-1 into h->th (on failure h->S is cut to the
 * threads started, for gddr__fan_stop); returns rc or the failure. */
int gddr__fan_start(gddr_client *c, int rc);
/* Runs fn(c, s, arg) for every shard at once; returns the first error (the
 * router's message then names the shard). */
int gddr__fan(gddr_client *c, int (*fn)(gddr_client *, int, void *), void *arg);
/* Stops and joins the threads (also those of a failed start). */
void gddr__fan_stop(gddr__shards *h);

/* shard_step.c */
int gddr__shards_step(gddr_client *c, const float *const *grads, const float *const *computed_on,
                      const uint64_t *versions, float *const *params);
int gddr__shards_submit(gddr_client *c, const float *const *grads);
int gddr__shards_wait_step(gddr_client *c, float *const *params);

/* shard_rows.c: sparse tables, keys split by gddr_row_shard */
int gddr__shards_table_register(gddr_client *c, const char *key, uint32_t dim,
                                const gddr_table_opts *o, int *table);
int gddr__shards_pull_rows(gddr_client *c, int table, const uint64_t *keys, size_t n, float *out,
                           unsigned flags, uint64_t min_version, uint64_t *version);
uint32_t gddr__shards_table_dim(const gddr_client *c, int table);
int gddr__shards_push_rows(gddr_client *c, int table, const uint64_t *keys, size_t n,
                           const float *grads, uint64_t *version);

/* shard_place.c */
/* Where a tensor's pieces live: returns their count; off/len/shard per piece. */
int gddr__shard_placement(const char *key, size_t n, int chunk, int S, size_t *off, size_t *len,
                          int *shard);
/* Prometheus texts of n servers as one, each sample labelled shard="I"
 * (malloc'd; NULL on no memory). */
char *gddr__metrics_merge(const char *const *texts, int n);
/* Splits "a, b,c" into trimmed endpoints; returns how many (0: none or too many). */
int gddr__split_list(const char *list, char (*ep)[512], int max);
/* Adds one server's counters / stats into a sum (s: the server's index;
 * st, wst: the sums behind the two staleness means, finished by
 * gddr__stats_done). */
void gddr__counters_add(gddr_client_counters *out, const gddr_client_counters *k);
void gddr__stats_add(gddr_server_stats *out, const gddr_server_stats *x, int s, double *st,
                     double *wst);
void gddr__stats_done(gddr_server_stats *out, double st, double wst);

#endif
