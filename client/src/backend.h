/* backend.h -- what a client is to the public face (api.c): a table of
 * functions, one per call of gddr.h, that c->be points to.
 *
 *   gddr__single  one server (single.c, over conn*.c, step.c, pipeline.c)
 *   gddr__sharded several servers (shard.c): one gddr__single client per
 *                 server, driven through this same table
 *
 * api.c checks what both backends check alike, then calls c->be->fn();
 * what differs (the id check, its error code and message) is each
 * backend's own. Nothing outside shard*.c asks whether a client is sharded.
 */
#ifndef GDDR_CLIENT_BACKEND_H
#define GDDR_CLIENT_BACKEND_H

#include "client_int.h"

struct gddr__backend {
    /* gddr_register_opt: opt already parsed (no pipeline, no accumulation
     * in progress: the single backend checks) */
    int (*reg)(gddr_client *c, const char *key, const float *init, size_t n,
               const gddr__optim *opt, int *id, uint64_t *version);
    void (*set_lr)(gddr_client *c, double lr); /* lr already checked */
    int (*optimizer)(gddr_client *c, int id, char *buf, size_t len);
    int (*pull)(gddr_client *c, int id, float *out, uint64_t min_version, uint64_t *version);
    int (*pull_async)(gddr_client *c, int id, float *out, uint64_t min_version,
                      gddr_ticket *ticket);
    int (*push)(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                uint64_t *version);
    int (*push_async)(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                      gddr_ticket *ticket);
    int (*wait)(gddr_client *c, gddr_ticket ticket, int timeout_ms, uint64_t *version);
    /* gddr_step_from: refuses with GDDR_ESTATE while the pipeline is busy */
    int (*step)(gddr_client *c, const float *const *grads, const float *const *computed_on,
                const uint64_t *versions, float *const *params);
    int (*submit)(gddr_client *c, const float *const *grads);
    int (*wait_step)(gddr_client *c, float *const *params);
    int (*checkpoint)(gddr_client *c);
    uint64_t (*next_step)(gddr_client *c);
    int (*version)(const gddr_client *c, int id, uint64_t *version);
    void (*counters)(const gddr_client *c, gddr_client_counters *out);
    int (*stats)(gddr_client *c, gddr_server_stats *out);
    int (*metrics)(gddr_client *c, char **text); /* *text is NULL on entry */
    /* Everything the client holds, c included (no bye to wait for when
     * info.epoch is 0). */
    void (*close)(gddr_client *c);
    /* sparse tables (gddr_table_register, gddr_pull_rows, gddr_push_rows;
     * opts complete, optimizer text not parsed yet; api.c hands the row
     * calls each key once, a push's repeats summed) */
    int (*table_register)(gddr_client *c, const char *key, uint32_t dim, const gddr_table_opts *o,
                          int *table);
    int (*pull_rows)(gddr_client *c, int table, const uint64_t *keys, size_t n, float *out,
                     unsigned flags, uint64_t min_version, uint64_t *version);
    int (*push_rows)(gddr_client *c, int table, const uint64_t *keys, size_t n, const float *grads,
                     uint64_t *version);
    uint32_t (*table_dim)(const gddr_client *c, int table); /* 0: no such table */
};

extern const gddr__backend gddr__single;
extern const gddr__backend gddr__sharded;

/* Opening (declared in client_int.h, as options.c calls them too):
 * gddr__server_count() says how many servers a list names; one opens with
 * gddr__client_open_shard(opts, 0, 0, ...) (single.c), several with
 * gddr__shards_open() (shard.c). */

#endif
