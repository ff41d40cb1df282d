/* single.c -- the single-server backend (backend.h): a client of one
 * gddr-ps, built on the connection (conn.c, conn_reply.c, conn_req.c), the
 * step engine (step.c, step_dev.c), the pipeline thread (pipeline.c), the
 * heartbeat (heartbeat.c) and recovery (recovery.c). It owns the life
 * cycle: open starts the heartbeat and hands orphans to recovery.c; close
 * stops the pipeline and the heartbeat, flushes the residual, says bye and
 * frees what the step keeps. Each server of a sharded client is one of
 * these (shard.c drives them through gddr__single).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "backend.h"
#include "client_conf.h"
#include "client_int.h"
#include "gddr_hash.h"

static void single_close(gddr_client *c);

/* ---- open and close ---------------------------------------------------------- */

/* rc, with why in err (gddr_opts_errmsg() for the caller of the open). */
__attribute__((format(printf, 4, 5))) static int open_refused(int rc, char *err, size_t errlen,
                                                              const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

int gddr__client_open_shard(const gddr_client_opts *opts, int shard_index, int shard_count,
                            gddr_client **out, char *err, size_t errlen)
{
    if (!opts || !out || !opts->server || !opts->server[0])
        return open_refused(GDDR_EINVAL, err, errlen, "no server given");
    if (opts->timeout_ms <= 0 || opts->delay_fraction < 0 || opts->delay_fraction >= 1 ||
        !(opts->pull_delay_fraction >= 0 && opts->pull_delay_fraction < 1) ||
        (opts->pull_delta_bits != 0 && opts->pull_delta_bits != 8 && opts->pull_delta_bits != 16) ||
        opts->dc_lambda < 0 || opts->clip_norm < 0 || opts->replay_decay <= 0 ||
        opts->replay_decay > 1 || opts->dc_ms_decay < 0 || opts->dc_ms_decay >= 1)
        return open_refused(GDDR_EINVAL, err, errlen,
                            "an option out of range: timeout_ms > 0, delay_fraction and "
                            "pull_delay_fraction in [0, 1), pull_delta_bits 0, 8 or 16, dc_lambda and "
                            "clip_norm >= 0, replay_decay in (0, 1], dc_ms_decay in [0, 1)");
    *out = NULL;
    gddr_client *c = calloc(1, sizeof *c);
    if (!c)
        return GDDR_ENOMEM;
    c->o = *opts;
    snprintf(c->server, sizeof c->server, "%s", opts->server);
    c->o.server = c->server;
    c->shard_index = shard_index;
    c->shard_count = shard_count;
    if (opts->curve_server_key && opts->curve_server_key[0]) {
        if (strlen(opts->curve_server_key) != 40 || !opts->curve_key_file) {
            free(c);
            return open_refused(GDDR_ECONFIG, err, errlen,
                                "curve_server_key must be the server's 40-character public key "
                                "(gddr-keygen), with curve_key_file set");
        }
        snprintf(c->curve_server, sizeof c->curve_server, "%s", opts->curve_server_key);
        snprintf(c->curve_file, sizeof c->curve_file, "%s", opts->curve_key_file);
    }
    c->o.curve_server_key = c->curve_server;
    c->o.curve_key_file = c->curve_file;
    c->log.fn = opts->log;
    c->log.user = opts->log_user;
    c->log.level = opts->log_level;
    c->info.rank = opts->rank >= 0 ? opts->rank : gddr__env_rank();
    if (c->o.world_size <= 0)
        c->o.world_size = gddr__env_world();
    if (c->info.rank < 0 || c->info.rank >= 65536 || c->o.world_size < 1 ||
        (!c->o.observer && c->info.rank >= c->o.world_size)) {
        int rank = c->info.rank, world = c->o.world_size;
        free(c);
        return open_refused(GDDR_EWORKER, err, errlen,
                            "rank %d of world_size %d: a worker's rank is 0 to world_size - 1 (rank "
                            "-1, world_size 0: from GDDR_RANK, SLURM_PROCID, ... and "
                            "GDDR_WORLD_SIZE, SLURM_NTASKS, ...)", rank, world);
    }
    /* The session: random, never 0, top bit clear (the server's stand-ins
     * for session-less connections have it set). */
    while (!c->session) {
        if (getrandom(&c->session, sizeof c->session, 0) != (ssize_t)sizeof c->session)
            c->session = (uint64_t)gddr__now_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
        c->session &= ~(1ull << 63);
    }
    c->be = &gddr__single;
    c->on_orphan = gddr__orphan_received;
    c->zctx = zmq_ctx_new();
    int rc = gddr__open_socket(c);
    /* A cluster starts in any order: a server not up yet (or a rank still
     * held by this worker's previous, dying process) is waited for, up to
     * connect_timeout_ms (by default reconnect_timeout_ms, as a running
     * step would). */
    int wait_ms = c->o.connect_timeout_ms >= 0 ? c->o.connect_timeout_ms : c->o.reconnect_timeout_ms;
    int64_t deadline = gddr__now_ms() + wait_ms;
    int backoff = 100, said = 0;
    while (rc == GDDR_OK) {
        int64_t left = deadline - gddr__now_ms();
        uint32_t retry_ms = 0;
        rc = gddr__hello(c, left > 0 && left < c->o.timeout_ms ? (int)left : c->o.timeout_ms, &retry_ms);
        if (rc == GDDR_OK || !gddr__hello_retryable(rc, retry_ms) || gddr__now_ms() >= deadline)
            break;
        if (!said++)
            gddr__logf(&c->log, GDDR_LOG_WARN, "%s: %s; retrying for up to %d ms", c->server,
                       c->errmsg, wait_ms);
        int nap = retry_ms > (uint32_t)backoff ? (int)retry_ms : backoff;
        left = deadline - gddr__now_ms();
        usleep((useconds_t)(nap < left ? nap : left > 0 ? left : 0) * 1000);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
        rc = GDDR_OK;
    }
    if (rc == GDDR_ETIMEDOUT) {
        /* Say which: nothing there, nothing reachable, or no answer. */
        gddr__mon_check(c);
        if (!c->mon_connected && c->mon_refused)
            gddr__set_err(c, rc, "nothing accepts connections at %s (refused for %d ms): is gddr-ps "
                          "running there, on that port?", c->server, wait_ms);
        else if (!c->mon_connected)
            gddr__set_err(c, rc, "could not reach %s within %d ms (no connection made: host down, "
                          "or a firewall?)", c->server, wait_ms);
        else
            gddr__set_err(c, rc, "%s accepted the connection but did not answer a hello within %d ms "
                          "(timeout_ms %d): is it a gddr-ps, and is it stopped or overloaded?",
                          c->server, wait_ms, c->o.timeout_ms);
    }
    if (rc != GDDR_OK) {
        gddr__logf(&c->log, GDDR_LOG_ERROR, "cannot open a session with %s: %s", c->server,
                   c->errmsg);
        if (err && errlen)
            snprintf(err, errlen, "%s", c->errmsg);
        single_close(c);
        return rc;
    }
    gddr__logf(&c->log, GDDR_LOG_INFO, "rank %d connected to %s (mode %d, chunk %d)",
               c->info.rank, c->server, c->info.mode, c->info.chunk);
    if (!c->o.observer && c->o.heartbeat_ms > 0 && (rc = gddr__heartbeat_start(c)) != GDDR_OK) {
        single_close(c);
        return rc;
    }
    *out = c;
    return GDDR_OK;
}

static void single_close(gddr_client *c)
{
    gddr__pipeline_stop(c);
    /* Then the device path's CUDA context (its tensor buffers go with
     * gddr__step_free below). */
    gddr__step_dev_close(c);
    /* Before the bye: a heartbeat after it would bring the worker back. */
    gddr__heartbeat_stop(c);
    /* The whole close is bounded by timeout_ms: the flush gets one more
     * try, not the wait for a restart. */
    c->closing = 1;
    c->close_deadline = gddr__now_ms() + c->o.timeout_ms;
    /* (No socket: one was dropped after a failure; the flush reconnects.) */
    int gone = 0;
    if (c->info.epoch && !c->o.observer) {
        int rc = c->o.delay_fraction > 0 ? gddr__residual_flush(c) : GDDR_OK;
        if (rc != GDDR_OK)
            gddr__logf(&c->log, GDDR_LOG_WARN, "could not flush the residual on close: %s", c->errmsg);
        gone = rc == GDDR_ETIMEDOUT || rc == GDDR_EIO; /* no bye to wait for then */
    }
    if (c->info.epoch && !c->o.observer && !gone) {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Bye bye = GDDR__BYE__INIT;
        rq.body_case = GDDR__REQUEST__BODY_BYE;
        rq.bye = &bye;
        uint64_t tk;
        if (gddr__send_req(c, &rq, NULL, 0, OP_ACK, -1, &tk) == GDDR_OK)
            gddr__wait_op(c, tk, c->o.timeout_ms < 1000 ? c->o.timeout_ms : 1000, NULL);
    }
    gddr__close_socket(c);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    for (int i = 0; i < c->nt; i++) {
        free(c->t[i].last_own);
        gddr__msgs_close(c->t[i].last_msgs, &c->t[i].nlast);
        gddr__msgs_close(c->t[i].pend_msgs, &c->t[i].npend);
        free(c->t[i].last_msgs);
        free(c->t[i].pend_msgs);
        free(c->t[i].g);
        free(c->t[i].wnew);
        free(c->t[i].ms);
        gddr__step_free(&c->t[i]);
    }
    free(c->t);
    free(c->tb);
    free(c->ops);
    free(c->acc_birth);
    free(c);
}

/* ---- tensors ------------------------------------------------------------------ */

struct register_call {
    int index;
    const float *init;
    op res;
};

static int register_call(gddr_client *c, void *arg)
{
    struct register_call *a = arg;
    return gddr__register_one(c, a->index, a->init, c->o.timeout_ms, &a->res);
}

int gddr__register_piece(gddr_client *c, const char *key, const float *init, size_t n,
                         uint32_t keyhash, uint32_t chunk0, const gddr__optim *opt, int *id,
                         uint64_t *version)
{
    if (c->pipe)
        return gddr__set_err(c, GDDR_ESTATE, "register: the step pipeline is running");
    if (c->acc_calls)
        return gddr__set_err(c, GDDR_ESTATE, "register: %d accumulated gradients are not pushed yet",
                             c->acc_calls);
    free(c->acc_birth); /* sized by the tensor count: made again at the next step */
    c->acc_birth = NULL;
    for (int i = 0; i < c->nt; i++)
        if (strcmp(c->t[i].key, key) == 0)
            return gddr__set_err(c, GDDR_EINVAL, "tensor '%s' is already registered as id %d", key, i);
    ctensor *arr = realloc(c->t, (size_t)(c->nt + 1) * sizeof *arr);
    if (!arr)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory");
    c->t = arr;
    ctensor *t = &c->t[c->nt];
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "%s", key);
    t->keyhash = keyhash;
    t->chunk0 = chunk0;
    if (opt)
        t->opt = *opt;
    t->n = n;
    t->last_own = malloc(n * 4);
    t->g = malloc(n * 4);
    t->tau = c->info.tau;
    if (!t->last_own || !t->g) {
        free(t->last_own), free(t->g);
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for tensor '%s'", key);
    }
    memcpy(t->last_own, init, n * 4);
    t->last = t->last_own;
    c->nt++;
    /* A reconnect meanwhile registers this tensor too (it is in c->t), from
     * t->last, which holds init until the first pull. */
    struct register_call a = { c->nt - 1, init, { 0 } };
    int rc = gddr__with_reconnect(c, register_call, &a);
    if (rc != GDDR_OK) {
        c->nt--;
        free(t->last_own), free(t->g);
        gddr__msgs_close(t->last_msgs, &t->nlast);
        gddr__msgs_close(t->pend_msgs, &t->npend);
        free(t->last_msgs), free(t->pend_msgs);
        return rc;
    }
    t->sid = a.res.sid;
    t->version = a.res.version;
    t->srv_opt = a.res.opt;
    *id = c->nt - 1;
    if (version)
        *version = a.res.version;
    return GDDR_OK;
}

static int check_id(gddr_client *c, int id)
{
    if (!c)
        return GDDR_EINVAL;
    if (id < 0 || id >= c->nt)
        return gddr__set_err(c, GDDR_ENOKEY, "no tensor with id %d (%d registered)", id, c->nt);
    return GDDR_OK;
}

static int single_register(gddr_client *c, const char *key, const float *init, size_t n,
                           const gddr__optim *opt, int *id, uint64_t *version)
{
    return gddr__register_piece(c, key, init, n, gddr_key_hash(key), 0, opt, id, version);
}

static void single_set_lr(gddr_client *c, double lr)
{
    atomic_store(&c->lr, lr);
}

static int single_optimizer(gddr_client *c, int id, char *buf, size_t len)
{
    if (id < 0 || id >= c->nt)
        return gddr__set_err(c, GDDR_EINVAL, "no tensor id %d", id);
    gddr__optim_format(&c->t[id].srv_opt, buf, len);
    return GDDR_OK;
}

static int single_version(const gddr_client *c, int id, uint64_t *version)
{
    if (id < 0 || id >= c->nt)
        return GDDR_EINVAL;
    *version = c->t[id].version;
    return GDDR_OK;
}

/* ---- pull and push -------------------------------------------------------------- */

static int pull_tracked(gddr_client *c, int id, float *out, uint64_t min_version,
                        gddr_ticket *ticket)
{
    int rc = gddr__pull_tensor(c, id, out, min_version, c->step, ticket);
    if (rc == GDDR_OK)
        gddr__op(c, *ticket)->track = 1;
    return rc;
}

static int single_pull_async(gddr_client *c, int id, float *out, uint64_t min_version,
                             gddr_ticket *ticket)
{
    int rc = check_id(c, id);
    if (rc != GDDR_OK)
        return rc;
    if (!out || !ticket)
        return gddr__set_err(c, GDDR_EINVAL, "pull: NULL buffer or ticket");
    return pull_tracked(c, id, out, min_version, ticket);
}

struct pull_call {
    int id;
    float *out;
    uint64_t min_version;
    int64_t give_up;
    uint64_t version;
};

static int pull_call(gddr_client *c, void *arg)
{
    struct pull_call *a = arg;
    for (;;) {
        gddr_ticket tk;
        op res;
        memset(&res, 0, sizeof res);
        int rc = pull_tracked(c, a->id, a->out, a->min_version, &tk);
        /* The server may park the pull for up to timeout_ms; allow for the trip. */
        if (rc == GDDR_OK)
            rc = gddr__wait_op(c, tk, c->o.timeout_ms + 1000, &res);
        if (rc == GDDR_OK)
            a->version = res.version;
        /* The server answered that the version did not come in time (a
         * slow sync peer): ask again, within the call's bound. */
        if (rc == GDDR_ETIMEDOUT && res.answered && !c->epoch_changed && gddr__now_ms() < a->give_up)
            continue;
        return rc;
    }
}

static int single_pull(gddr_client *c, int id, float *out, uint64_t min_version, uint64_t *version)
{
    int rc = check_id(c, id);
    if (rc != GDDR_OK)
        return rc;
    if (!out)
        return gddr__set_err(c, GDDR_EINVAL, "pull: NULL buffer");
    struct pull_call a = { id, out, min_version, gddr__now_ms() + c->o.reconnect_timeout_ms, 0 };
    rc = gddr__with_reconnect(c, pull_call, &a);
    if (rc == GDDR_OK && version)
        *version = a.version;
    return rc;
}

/* A push of the caller's dense gradient, tagged and stepped once. */
static void plain_push_args(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                            gddr__push_args *a)
{
    ctensor *t = &c->t[id];
    memset(a, 0, sizeof *a);
    a->vals = grad;
    a->nvals = t->n;
    a->birth = tags && tags->has_birth ? tags->birth_version : t->version;
    a->base = tags && tags->has_birth && tags->base_version ? tags->base_version : a->birth;
    a->norm_from_payload = 1; /* the payload is the gradient: the server measures it */
    a->step = gddr__push_step(c, id);
}

static int single_push_async(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                             gddr_ticket *ticket)
{
    int rc = check_id(c, id);
    if (rc != GDDR_OK)
        return rc;
    if (!grad || !ticket)
        return gddr__set_err(c, GDDR_EINVAL, "push: NULL gradient or ticket");
    gddr__push_args a;
    plain_push_args(c, id, grad, tags, &a);
    return gddr__push_tensor(c, id, &a, ticket);
}

static int single_push(gddr_client *c, int id, const float *grad, const gddr_push_tags *tags,
                       uint64_t *version)
{
    int rc = check_id(c, id);
    if (rc != GDDR_OK)
        return rc;
    if (!grad)
        return gddr__set_err(c, GDDR_EINVAL, "push: NULL gradient");
    gddr__push_args a;
    plain_push_args(c, id, grad, tags, &a);
    a.lend = 1; /* sent from the caller's buffer: we wait for the answer */
    return gddr__push_wait(c, id, &a, version);
}

static int single_wait(gddr_client *c, gddr_ticket ticket, int timeout_ms, uint64_t *version)
{
    op r;
    int rc = gddr__wait_op(c, ticket, timeout_ms, &r);
    if (rc == GDDR_OK && version)
        *version = r.version;
    return rc;
}

/* ---- steps ---------------------------------------------------------------------- */

static int single_step(gddr_client *c, const float *const *grads, const float *const *computed_on,
                       const uint64_t *versions, float *const *params)
{
    /* The library thread owns the client while pipelined steps are in
     * flight (no error text: c->errmsg belongs to that thread now). */
    if (gddr__pipeline_busy(c))
        return GDDR_ESTATE;
    return gddr__step_run(c, grads, computed_on, versions, params);
}

static uint64_t single_next_step(gddr_client *c)
{
    return ++c->step;
}

/* ---- whole-client calls ------------------------------------------------------------ */

static int single_stats(gddr_client *c, gddr_server_stats *out)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__StatsRequest s = GDDR__STATS_REQUEST__INIT;
    rq.body_case = GDDR__REQUEST__BODY_STATS;
    rq.stats = &s;
    uint64_t tk;
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_STATS, -1, &tk);
    if (rc != GDDR_OK)
        return rc;
    gddr__op(c, tk)->stats = out;
    return gddr__wait_op(c, tk, -1, NULL);
}

static int single_checkpoint(gddr_client *c)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__CheckpointRequest cr = GDDR__CHECKPOINT_REQUEST__INIT;
    rq.body_case = GDDR__REQUEST__BODY_CHECKPOINT;
    rq.checkpoint = &cr;
    uint64_t tk;
    int rc = gddr__send_req(c, &rq, NULL, 0, OP_ACK, -1, &tk);
    return rc == GDDR_OK ? gddr__wait_op(c, tk, -1, NULL) : rc;
}

static void single_counters(const gddr_client *c, gddr_client_counters *out)
{
    *out = c->k;
}

const gddr__backend gddr__single = {
    .reg = single_register,
    .set_lr = single_set_lr,
    .optimizer = single_optimizer,
    .pull = single_pull,
    .pull_async = single_pull_async,
    .push = single_push,
    .push_async = single_push_async,
    .wait = single_wait,
    .step = single_step,
    .submit = gddr__pipeline_submit,
    .wait_step = gddr__pipeline_wait,
    .checkpoint = single_checkpoint,
    .next_step = single_next_step,
    .version = single_version,
    .counters = single_counters,
    .stats = single_stats,
    .metrics = gddr__metrics_request,
    .close = single_close,
    .table_register = gddr__rows_register,
    .pull_rows = gddr__rows_pull,
    .push_rows = gddr__rows_push,
    .table_dim = gddr__rows_dim,
};
