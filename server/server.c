/* server.c -- the gddr-ps front end: one ROUTER socket, one thread.
 *
 * Every request is checked field by field before anything changes
 * (docs/design.md section 8): a bad request gets an error reply with a
 * gddr_err code, bumps a counter, and leaves tensors, versions and worker
 * state untouched. Then it is served: registrations and pulls are answered at
 * once, pushes are applied (async, ssp) or collected into the current sync
 * step (push.c), and pulls that must wait (sync min_version, ssp bound)
 * are parked with a deadline and answered when their condition holds or
 * their time is up (conn.c).
 *
 * Who may do what: anyone may pull and ask for stats; registering and
 * pushing need a worker (an accepted hello, workers.c) speaking for its
 * own rank; a CURVE key may be limited to some ranks or to observing.
 * A push is taken at most once per (rank, tensor, step): a resend is
 * answered with the first answer and not applied again (push.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "checkpoint.h"
#include "log.h"
#include "ps.h"
#include "syncstep.h"
#include "pushlog.h"
#include "push.h"
#include "snapshot.h"
#include "table_wire.h"

/* ---- requests ------------------------------------------------------------- */

static void send_hello_reply(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id)
{
    Gddr__Reply r;
    Gddr__HelloReply hr = GDDR__HELLO_REPLY__INIT;
    ps_reply_init(ps, &r, req_id, NULL);
    hr.mode = (Gddr__Mode)ps_tensor_mode(ps, NULL); /* hybrid: the phase now */
    hr.chunk = (uint32_t)ps->cfg.chunk;
    hr.workers = (uint32_t)ps_expected_workers(ps);
    hr.tau = (uint32_t)ps->cfg.tau_init;
    hr.max_message_bytes = (uint64_t)ps->cfg.max_message_bytes;
    hr.async_warmup_steps = (uint32_t)ps->cfg.async_warmup_steps;
    hr.shard_index = (uint32_t)ps->cfg.shard_index;
    hr.shard_count = (uint32_t)ps->cfg.shard_count;
    r.body_case = GDDR__REPLY__BODY_HELLO;
    r.hello = &hr;
    ps_send_reply(ps, ident, &r, NULL, 0);
}

/* Registration; `worker` says whether a worker asks (observers may only
 * look up a tensor that exists). */
static int on_init(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f,
                   int worker)
{
    const Gddr__InitTensor *in = rq->init;
    if (!ps_valid_key(in->key)) {
        return ps_reject(ps, ident, rq->req_id, GDDR_EINVAL,
               "tensor key must be 1-127 printable characters without spaces");
    }
    if (in->n == 0 || in->n > (uint64_t)ps->cfg.max_message_bytes / 4) {
        return ps_reject(ps, ident, rq->req_id, GDDR_ELENGTH, "tensor '%s': length %llu is out of range",
               in->key, (unsigned long long)in->n);
    }
    if (in->payload_bytes != in->n * 4 || f->n != 3 || gddr__frame_size(f, 2) != in->payload_bytes) {
        return ps_reject(ps, ident, rq->req_id, GDDR_ELENGTH,
               "tensor '%s': header says %llu values (%llu bytes) but the frame holds %zu bytes",
               in->key, (unsigned long long)in->n, (unsigned long long)in->payload_bytes,
               f->n == 3 ? gddr__frame_size(f, 2) : 0);
    }
    const float *vals = gddr__frame_data(f, 2);
    ps_optim want;
    char msg[256];
    if (in->optimizer) {
        const Gddr__Optimizer *o = in->optimizer;
        want = (ps_optim){ (int)o->kind, 1, o->lr, o->momentum, o->beta1, o->beta2, o->eps,
                           o->weight_decay };
        if (ps_optim_check(&want, msg, sizeof msg) < 0)
            return ps_reject(ps, ident, rq->req_id, GDDR_EINVAL, "tensor '%s': optimizer: %s",
                             in->key, msg);
        if (want.lr == 0)
            want.lr = ps->cfg.lr;
    }
    ps_tensor *t = NULL;
    for (size_t i = 0; i < ps->ntensors; i++)
        if (strcmp(ps->tensors[i]->key, in->key) == 0)
            t = ps->tensors[i];
    int created = 0;
    if (t) {
        if (t->n != in->n) {
            return ps_reject(ps, ident, rq->req_id, GDDR_ELENGTH,
                   "tensor '%s' exists with length %zu, not %llu", in->key, t->n,
                   (unsigned long long)in->n);
        }
        ps_optim tmp;
        const ps_optim *have = ps_optim_of(ps, t, &tmp);
        if (in->optimizer && !ps_optim_equal(have, &want)) {
            char a[160], b[160];
            ps_optim_describe(have, a, sizeof a);
            ps_optim_describe(&want, b, sizeof b);
            return ps_reject(ps, ident, rq->req_id, GDDR_ECONFIG,
                             "tensor '%s' runs %s%s; this registration asks for %s", in->key, a,
                             t->opt.explicit_ ? "" : " (the server's [optimizer] section)", b);
        }
    } else {
        if (!worker)
            return ps_reject(ps, ident, rq->req_id, GDDR_ENOKEY,
                             "no tensor '%s' (only a worker may register one)", in->key);
        if (!ps->cfg.allow_register)
            return ps_reject(ps, ident, rq->req_id, GDDR_ESTATE,
                             "no tensor '%s', and registration is closed (allow_register = false)", in->key);
        if (ps->ntensors >= (size_t)ps->cfg.max_tensors) {
            return ps_reject(ps, ident, rq->req_id, GDDR_EINVAL, "server holds max_tensors = %lld already",
                   ps->cfg.max_tensors);
        }
        if (!gddr_finite_cpu(vals, in->n)) {
            return ps_reject(ps, ident, rq->req_id, GDDR_ENONFINITE, "tensor '%s': initial values hold NaN or Inf",
                   in->key);
        }
        t = ps_tensor_create(ps, in->key, in->n);
        if (!t) {
            return ps_reject(ps, ident, rq->req_id, GDDR_ENOMEM, "no memory for tensor '%s'", in->key);
        }
        memcpy(t->w, vals, in->n * sizeof(float));
        if (in->optimizer)
            t->opt = want;
        created = 1;
        ps->inits++;
        ps_optim tmp;
        ps_optim_describe(ps_optim_of(ps, t, &tmp), msg, sizeof msg);
        gddr_log(GDDR_LOG_INFO, "tensor '%s' registered by worker %u: id %u, %zu values, %zu chunks, %s",
                 t->key, rq->rank, t->id, t->n, t->nchunks, msg);
    }
    Gddr__Reply r;
    Gddr__InitReply ir = GDDR__INIT_REPLY__INIT;
    Gddr__Optimizer ro = GDDR__OPTIMIZER__INIT;
    ps_optim tmp;
    const ps_optim *eff = ps_optim_of(ps, t, &tmp);
    ro.kind = (Gddr__OptimizerKind)eff->kind;
    ro.lr = eff->lr;
    ro.momentum = eff->momentum;
    ro.beta1 = eff->beta1;
    ro.beta2 = eff->beta2;
    ro.eps = eff->eps;
    ro.weight_decay = eff->weight_decay;
    ps_reply_init(ps, &r, rq->req_id, t);
    ir.id = t->id;
    ir.version = t->version;
    ir.n = t->n;
    ir.created = created;
    ir.optimizer = &ro;
    r.body_case = GDDR__REPLY__BODY_INIT;
    r.init = &ir;
    ps_send_reply(ps, ident, &r, NULL, 0);
    return GDDR_OK;
}

static void on_stats(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, int owner)
{
    Gddr__Reply r;
    Gddr__StatsReply sr = GDDR__STATS_REPLY__INIT;
    ps_reply_init(ps, &r, rq->req_id, ps->ntensors ? ps->tensors[0] : NULL);
    sr.pushes = ps->pushes;
    sr.pulls = ps->pulls_served;
    for (int i = 0; i < PS_NERR; i++)
        sr.rejected += ps->rejected[i];
    sr.versions_total = ps->versions_total;
    sr.staleness_mean = ps_stale_mean(&ps->stale);
    sr.staleness_ema = ps->stale.ema;
    sr.staleness_max = ps->stale.max;
    sr.n_staleness_hist = PS_HIST;
    sr.staleness_hist = ps->stale.hist;
    if (owner) {
        ps_worker *w = &ps->workers[rq->rank];
        sr.worker_staleness_mean = ps_stale_mean(&w->stale);
        sr.worker_pushes = w->pushes;
    }
    sr.live_workers = (uint32_t)ps_live_workers(ps);
    sr.duplicates = ps->duplicates;
    char *text = NULL;
    if (rq->stats->prometheus)
        sr.prometheus = text = ps_metrics_page(ps);
    r.body_case = GDDR__REPLY__BODY_STATS;
    r.stats = &sr;
    ps_send_reply(ps, ident, &r, NULL, 0);
    free(text);
}

static void send_ack(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, const char *text)
{
    Gddr__Reply r;
    Gddr__Ack a = GDDR__ACK__INIT;
    ps_reply_init(ps, &r, req_id, NULL);
    a.text = (char *)text;
    r.body_case = GDDR__REPLY__BODY_ACK;
    r.ack = &a;
    ps_send_reply(ps, ident, &r, NULL, 0);
}

static const char *body_name(int body)
{
    switch (body) {
    case GDDR__REQUEST__BODY_HELLO: return "hello";
    case GDDR__REQUEST__BODY_INIT: return "a registration";
    case GDDR__REQUEST__BODY_PULL: return "a pull";
    case GDDR__REQUEST__BODY_PUSH: return "a push";
    case GDDR__REQUEST__BODY_STATS: return "a stats request";
    case GDDR__REQUEST__BODY_HEARTBEAT: return "a heartbeat";
    case GDDR__REQUEST__BODY_CHECKPOINT: return "a checkpoint request";
    case GDDR__REQUEST__BODY_BYE: return "a bye";
    case GDDR__REQUEST__BODY_INIT_TABLE: return "a table registration";
    case GDDR__REQUEST__BODY_PULL_ROWS: return "a row pull";
    case GDDR__REQUEST__BODY_PUSH_ROWS: return "a row push";
    }
    return "a request";
}

/* A hello whose server list puts this server at another place than its
 * shard_index of shard_count would mix parts of different models (or of
 * one model cut differently): refuse it for good (no retry hint). A hello
 * without a layout (shard_count 0: one endpoint, or an older client) is
 * "0 of 1", except that an observer may read any single shard. */
static int shard_layout_ok(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq)
{
    const Gddr__Hello *h = rq->hello;
    long long idx = ps->cfg.shard_index, cnt = ps->cfg.shard_count;
    if (h->shard_count == 0) {
        if (cnt == 1 || rq->observer)
            return 1;
        ps_reject(ps, ident, rq->req_id, GDDR_ECONFIG,
                  "this server is shard %lld of %lld: the model is sharded over %lld servers; "
                  "list all %lld endpoints, in shard order",
                  idx, cnt, cnt, cnt);
        return 0;
    }
    if (h->shard_index == idx && h->shard_count == cnt)
        return 1;
    ps_reject(ps, ident, rq->req_id, GDDR_ECONFIG,
              "this server is shard %lld of %lld (its shard_index and shard_count), the client's list "
              "puts it at %u of %u: list the servers in the client's server = (or --server) in the "
              "order of their shard_index, 0 first", idx, cnt, h->shard_index, h->shard_count);
    return 0;
}

/* push_log = always: the replies to a request that was logged (lsn not 0)
 * wait for its record to be on disk (reply.c, pushlog.c). */
static void hold_for(gddr_ps *ps, uint64_t lsn)
{
    ps->hold_replies = ps->cfg.push_log == PS_PLOG_ALWAYS && lsn != 0;
}

/* A request from the push log (pushlog.c), handled as when it came (the
 * worker's ownership was checked then); its replies go nowhere. */
static void replay_request(gddr_ps *ps, gddr__frames *f, const Gddr__Request *rq, uint64_t session)
{
    zmq_msg_t *ident = &f->part[0];
    switch (rq->body_case) {
    case GDDR__REQUEST__BODY_HELLO:
        ps_worker_hello(ps, ident, rq, session, NULL);
        return;
    case GDDR__REQUEST__BODY_BYE:
        ps_worker_left(ps, rq->rank);
        return;
    case GDDR__REQUEST__BODY_INIT:
        on_init(ps, ident, rq, f, !rq->observer);
        return;
    case GDDR__REQUEST__BODY_PUSH:
        ps_on_push(ps, ident, rq, f);
        return;
    case GDDR__REQUEST__BODY_PUSH_ROWS:
        ps_on_push_rows(ps, ident, rq, f);
        return;
    case GDDR__REQUEST__BODY_INIT_TABLE:
        ps_on_init_table(ps, ident, rq, !rq->observer);
        return;
    default:
        return;
    }
}

/* An event from the push log (pushlog.h PS_PLOG_EV_*), applied as then. */
static void replay_event(gddr_ps *ps, uint32_t type, uint32_t id, uint64_t arg)
{
    switch (type) {
    case PS_PLOG_EV_SYNC:
        if (id < ps->ntensors) {
            ps->replay_live = arg > 0 ? (int)arg : 1;
            ps_sync_try_complete(ps, ps->tensors[id], 1);
            ps->replay_live = 0;
        }
        return;
    case PS_PLOG_EV_TABLE_SYNC:
        ps_table_sync_replay(ps, id, (int)arg);
        return;
    case PS_PLOG_EV_DEAD:
        if (id < (uint32_t)ps->cfg.max_workers) {
            ps_worker_declare_dead(ps, (int)id);
            ps_membership_changed(ps);
        }
        return;
    default:
        gddr_log(GDDR_LOG_WARN, "push log: an event of unknown type %u is skipped", type);
    }
}

/* One well-formed request of the right protocol version. */
static void dispatch(gddr_ps *ps, gddr__frames *f, ps_conn *c, const Gddr__Request *rq)
{
    zmq_msg_t *ident = &f->part[0];
    const ps_key *key = ps_auth_key(ps, f->user);
    uint64_t session = ps_request_session(rq, c);
    int body = rq->body_case;
    if (ps->zap && !key) {
        /* Connected under a key that a SIGHUP has since removed. */
        ps_reject(ps, ident, rq->req_id, GDDR_EWORKER, "this connection's key is no longer authorized");
        return;
    }
    /* A rank not below max_workers never gets here: handle_message
     * refuses it for every request, hello included. */
    if (body == GDDR__REQUEST__BODY_HELLO) {
        if (!shard_layout_ok(ps, ident, rq)) {
            ps_log_refusal(ps, "refused a hello %s %u: its server list does not match this "
                               "server's shard layout", rq->observer ? "from an observer, rank" : "as rank",
                           rq->rank);
            return;
        }
        if (!rq->observer && ps_worker_hello(ps, ident, rq, session, key) != GDDR_OK) {
            ps_log_refusal(ps, "refused a hello as rank %u", rq->rank);
            return;
        }
        if (rq->observer)
            gddr_log(GDDR_LOG_DEBUG, "hello from an observer");
        /* An accepted hello decides whose pushes a rank's exactly-once
         * records are: logged (a refusal depends on the clock, so only
         * what was accepted is). */
        hold_for(ps, rq->observer ? 0 : ps_plog_append(ps, f, session));
        send_hello_reply(ps, ident, rq->req_id);
        ps->hold_replies = 0;
        return;
    }
    /* From here on, the worker's own requests keep it alive; nobody else's. */
    int owner = ps_worker_owns(ps, rq, session);
    int observer_key = key && key->observer_only;
    switch (body) {
    case GDDR__REQUEST__BODY_PULL:
        ps_pull_request(ps, ident, c, rq, owner && !rq->observer);
        return;
    case GDDR__REQUEST__BODY_STATS:
        on_stats(ps, ident, rq, owner);
        return;
    case GDDR__REQUEST__BODY_HEARTBEAT:
        if (owner)
            send_ack(ps, ident, rq->req_id, "alive");
        else if (rq->observer)
            send_ack(ps, ident, rq->req_id, "observer");
        else
            ps_reject(ps, ident, rq->req_id, GDDR_EWORKER,
                      "heartbeat for rank %u, which this session does not hold", rq->rank);
        return;
    case GDDR__REQUEST__BODY_CHECKPOINT: {
        if (observer_key) {
            ps_reject(ps, ident, rq->req_id, GDDR_EWORKER, "this key may only observe");
            return;
        }
        char text[128];
        ps_checkpoint_request(ps, text, sizeof text);
        send_ack(ps, ident, rq->req_id, text);
        return;
    }
    case GDDR__REQUEST__BODY_BYE:
        if (owner) {
            hold_for(ps, ps_plog_append(ps, f, session));
            ps_worker_left(ps, rq->rank);
            send_ack(ps, ident, rq->req_id, "bye");
            ps->hold_replies = 0;
        } else if (rq->observer) {
            send_ack(ps, ident, rq->req_id, "bye");
        } else {
            ps_reject(ps, ident, rq->req_id, GDDR_EWORKER,
                      "bye for rank %u, which this session does not hold", rq->rank);
        }
        return;
    case GDDR__REQUEST__BODY_INIT:
        if (rq->observer || owner) {
            hold_for(ps, ps_plog_append(ps, f, session));
            on_init(ps, ident, rq, f, owner && !rq->observer);
            ps->hold_replies = 0;
        } else
            ps_reject(ps, ident, rq->req_id, GDDR_EWORKER,
                      "%s from rank %u, which this session does not hold: say hello first",
                      body_name(body), rq->rank);
        return;
    case GDDR__REQUEST__BODY_PUSH:
    case GDDR__REQUEST__BODY_PUSH_ROWS:
        if (rq->observer)
            ps_reject(ps, ident, rq->req_id, GDDR_EWORKER, "an observer cannot push");
        else if (!owner)
            ps_reject(ps, ident, rq->req_id, GDDR_EWORKER,
                      "%s from rank %u, which this session does not hold: say hello first",
                      body_name(body), rq->rank);
        else {
            hold_for(ps, ps_plog_append(ps, f, session));
            if (body == GDDR__REQUEST__BODY_PUSH)
                ps_on_push(ps, ident, rq, f);
            else
                ps_on_push_rows(ps, ident, rq, f);
            ps->hold_replies = 0;
        }
        return;
    case GDDR__REQUEST__BODY_INIT_TABLE:
        hold_for(ps, ps_plog_append(ps, f, session));
        ps_on_init_table(ps, ident, rq, owner && !rq->observer);
        ps->hold_replies = 0;
        return;
    case GDDR__REQUEST__BODY_PULL_ROWS:
        ps_on_pull_rows(ps, ident, rq, f, owner && !rq->observer);
        return;
    default:
        ps_reject(ps, ident, rq->req_id, GDDR_EPROTO, "request without a body");
    }
}

static void handle_message(gddr_ps *ps, gddr__frames *f)
{
    ps->bytes_in += f->bytes;
    if (f->n < 2 || f->truncated) {
        /* Too few or too many frames. With an identity we can still say so. */
        if (f->n >= 1)
            ps_reject(ps, &f->part[0], 0, GDDR_EPROTO, "message with %d frames", f->n);
        else
            ps->rejected[GDDR_EPROTO]++;
        return;
    }
    zmq_msg_t *ident = &f->part[0];
    ps_conn *c = ps_conn_get(ps, ident);
    Gddr__Request *rq =
        gddr__request__unpack(NULL, gddr__frame_size(f, 1), gddr__frame_data(f, 1));
    if (!rq) {
        ps_reject(ps, ident, 0, GDDR_EPROTO, "header is not a valid gddr.Request");
        return;
    }
    if (rq->protocol != GDDR__CONST__PROTOCOL_VERSION) {
        ps_reject(ps, ident, rq->req_id, GDDR_EPROTO, "protocol %u, this server speaks %d",
                  rq->protocol, GDDR__CONST__PROTOCOL_VERSION);
    } else if (!rq->observer && rq->rank >= (uint32_t)ps->cfg.max_workers) {
        ps_reject(ps, ident, rq->req_id, GDDR_EWORKER, "rank %u is not below max_workers %lld",
                  rq->rank, ps->cfg.max_workers);
    } else if (rq->body_case != GDDR__REQUEST__BODY_INIT &&
               rq->body_case != GDDR__REQUEST__BODY_PUSH &&
               rq->body_case != GDDR__REQUEST__BODY_PULL_ROWS &&
               rq->body_case != GDDR__REQUEST__BODY_PUSH_ROWS && f->n != 2) {
        ps_reject(ps, ident, rq->req_id, GDDR_EPROTO, "unexpected %d value frames", f->n - 2);
    } else {
        dispatch(ps, f, c, rq);
    }
    gddr__request__free_unpacked(rq, NULL);
}

/* ---- life cycle ------------------------------------------------------------ */

static uint64_t make_epoch(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* Nanosecond time mixed with the pid: two restarts in one clock tick
     * still differ. */
    return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 48);
}

int ps_open(gddr_ps **out, const gddr_ps_config *cfg, const char *cfg_path, char *err,
                 size_t errlen)
{
    gddr_ps *ps = calloc(1, sizeof *ps);
    if (!ps) {
        snprintf(err, errlen, "out of memory");
        return GDDR_ENOMEM;
    }
    ps->cfg = *cfg;
    snprintf(ps->cfg_path, sizeof ps->cfg_path, "%s", cfg_path ? cfg_path : "");
    ps->epoch = make_epoch();
    ps->start_ms = gddr__now_ms();
    ps->workers = calloc((size_t)cfg->max_workers, sizeof *ps->workers);
    if (!ps->workers || ps_conns_open(ps) != GDDR_OK ||
        ps_pool_start(&ps->pool, (int)cfg->threads) != GDDR_OK) {
        snprintf(err, errlen, "out of memory");
        ps_close(&ps);
        return GDDR_ENOMEM;
    }
    ps->zctx = zmq_ctx_new();
    ps->router = zmq_socket(ps->zctx, ZMQ_ROUTER);
    int64_t maxmsg = cfg->max_message_bytes;
    int zero = 0, hwm = 10000;
    zmq_setsockopt(ps->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(ps->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(ps->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(ps->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    int arc = ps_auth_setup(ps, err, errlen);
    if (arc != GDDR_OK) {
        ps_close(&ps);
        return arc;
    }
    if (zmq_bind(ps->router, cfg->listen) != 0) {
        snprintf(err, errlen, "cannot bind %s: %s", cfg->listen, zmq_strerror(errno));
        ps_close(&ps);
        return GDDR_EIO;
    }
    size_t len = sizeof ps->endpoint;
    zmq_getsockopt(ps->router, ZMQ_LAST_ENDPOINT, ps->endpoint, &len);
    int rc = ps_metrics_open(ps, err, errlen);
    if (rc == GDDR_OK)
        rc = ps_snapshot_restore(ps, err, errlen);
    if (rc == GDDR_OK)
        rc = ps_plog_open(ps, ps->plog_lsn0, replay_request, replay_event, err, errlen);
    if (rc == GDDR_OK && ps->plog)
        ps_sync_restored(ps); /* the open steps as the replay left them */
    if (rc != GDDR_OK) {
        ps_close(&ps);
        return rc;
    }
    *out = ps;
    return GDDR_OK;
}

int ps_run(gddr_ps *ps, void (*ready)(gddr_ps *))
{
    char shard[64] = "";
    if (ps->cfg.shard_count > 1)
        snprintf(shard, sizeof shard, ", shard %lld of %lld", ps->cfg.shard_index,
                 ps->cfg.shard_count);
    gddr_log(GDDR_LOG_INFO, "listening on %s (mode %s, %lld apply threads%s, epoch %016llx)",
             ps->endpoint, ps->cfg.mode == 0 ? "async" : ps->cfg.mode == 1 ? "sync" : "ssp",
             ps->cfg.threads, shard, (unsigned long long)ps->epoch);
    if (ready)
        ready(ps);
    int64_t last_check = gddr__now_ms(), last_sweep = last_check;
    while (!ps->stop) {
        zmq_pollitem_t items[5] = { { ps->router, 0, ZMQ_POLLIN, 0 } };
        int nitems = 1;
        if (ps_plog_fd(ps) >= 0)
            items[nitems++] = (zmq_pollitem_t){ NULL, ps_plog_fd(ps), ZMQ_POLLIN, 0 };
        if (ps->zap)
            items[nitems++] = (zmq_pollitem_t){ ps->zap, 0, ZMQ_POLLIN, 0 };
        if (ps->monitor)
            items[nitems++] = (zmq_pollitem_t){ ps->monitor, 0, ZMQ_POLLIN, 0 };
        if (ps->metrics)
            items[nitems++] = (zmq_pollitem_t){ ps->metrics, 0, ZMQ_POLLIN, 0 };
        int rc = zmq_poll(items, nitems, ps_tables_next_timeout(ps, ps_pulls_next_timeout(ps, 250)));
        if (rc < 0 && errno != EINTR)
            break;
        /* Drain what is waiting, but not forever: timers must run too. */
        for (int i = 0; i < 1000 && !ps->stop; i++) {
            gddr__frames f;
            if (gddr__frames_recv(ps->router, &f, ZMQ_DONTWAIT) < 0)
                break;
            handle_message(ps, &f);
            gddr__frames_close(&f);
        }
        ps_plog_poll(ps); /* always: replies whose records are now on disk */
        if (ps->zap)
            ps_auth_poll(ps);
        if (ps->monitor)
            ps_monitor_poll(ps);
        if (ps->metrics)
            ps_metrics_poll(ps);
        int64_t now = gddr__now_ms();
        if (now - last_check >= 200) {
            /* A death (or a never-arrived worker timing out) may complete a
             * sync step or free an ssp wait. */
            if (ps_workers_check(ps) || ps->npulls)
                ps_membership_changed(ps);
            ps_sync_stalls(ps);
            last_check = now;
        }
        if (now - last_sweep >= 10000) {
            ps_conns_sweep(ps);
            last_sweep = now;
        }
        if (ps->npulls)
            ps_release_pulls(ps);
        ps_tables_release_pulls(ps);
        if (ps->reload) {
            ps->reload = 0;
            ps_reload(ps);
        }
        ps_checkpoint_tick(ps, 0);
        if (ps->tick)
            ps->tick(ps);
    }
    ps_release_pulls(ps); /* answers parked pulls with ESHUTDOWN */
    ps_tables_release_pulls(ps);
    ps_settle_all(ps);
    ps_checkpoint_tick(ps, 1);
    ps_plog_close(ps); /* syncs what is buffered, sends the held replies */
    return GDDR_OK;
}

void ps_close(gddr_ps **pp)
{
    gddr_ps *ps = *pp;
    if (!ps)
        return;
    if (ps->pool)
        ps_settle_all(ps);
    ps_plog_close(ps);
    ps_parts_free(ps);
    ps_tables_free(ps);
    ps_snapshot_free(ps);
    if (ps->ckw)
        gddr__ckpt_writer_stop(&ps->ckw);
    ps_pulls_free(ps);
    free(ps->offbuf);
    free(ps->sqbuf);
    /* The monitor stops before the socket it watches closes: libzmq's I/O
     * thread blocks for good on an event nobody reads (libzmq issue
     * 3575), and zmq_ctx_term would then wait for it. */
    if (ps->router && ps->monitor)
        zmq_socket_monitor(ps->router, NULL, 0);
    if (ps->router)
        zmq_close(ps->router);
    if (ps->metrics)
        zmq_close(ps->metrics);
    ps_auth_close(ps);
    if (ps->zctx)
        zmq_ctx_term(ps->zctx);
    ps_conns_close(ps);
    ps_workers_free(ps); /* (their fill credits leave the tensors' open steps: before these) */
    if (ps->pool)
        ps_pool_stop(&ps->pool);
    for (size_t i = 0; i < ps->ntensors; i++)
        ps_tensor_free(ps->tensors[i]);
    free(ps->tensors);
    free(ps);
    *pp = NULL;
}
