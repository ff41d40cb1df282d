/* check_integrity.c -- a push counts once, a stranger changes nothing, and
 * the server's memory and log stay bounded (issue: exactly-once pushes,
 * honest final models, and the holes an outside client found).
 *
 *   exactly once   the server (or a worker) stopped past the client timeout
 *                  mid-run: every push is a gradient of exactly 1.0 per
 *                  value at lr 1, so the final weights must be minus the
 *                  number of steps, bit for bit; a resend is answered with
 *                  the first outcome; the records survive a kill -9
 *   sync flush     a closing GDDR worker's held residual weighs what it
 *                  weighed in its steps, however many workers are left
 *   membership     a refused hello, a stranger claiming a live rank, a
 *                  tool's request: none of them changes who is a worker
 *   bounds         snapshots, unread replies, parked pulls, checkpoint
 *                  requests, a bogus grad_norm
 *   start and stop a late server, a SIGTERM during start-up, damaged
 *                  checkpoints, a sync step whose peer never pushes
 *   logs           wire strings cannot forge lines; observers are quiet;
 *                  a dead worker's residual is reported against what it held
 *
 * No assertion reads the clock: waits are for events, bounded generously.
 *
 *   build/bin/gddr-tests integrity
 */
#include "harness.h" /* first: it sets _GNU_SOURCE */

#include <check.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "../client/src/client_int.h" /* gddr__residual_get */
#include "checkpoint.h"
#include "files.h"
#include "gddr/gddr.h"
#include "suites.h"
#include "wirekit.h"

#define WAIT_MS 60000
#define TCASE_TIMEOUT 180

/* ---- helpers ------------------------------------------------------------------ */

static gddr_client *open_opts(gddr_client_opts o, const char *ep, int rank, int world)
{
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    ck_assert_msg(rc == GDDR_OK, "gddr_client_open(%s, rank %d of %d): %s", ep, rank, world,
                  gddr_strerror(rc));
    return c;
}

static gddr_client *open_worker(const char *ep, int rank, int world, double alpha)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.timeout_ms = 30000;
    o.delay_fraction = alpha;
    return open_opts(o, ep, rank, world);
}

static gddr_client *open_observer(const char *ep)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.timeout_ms = 30000;
    o.observer = 1;
    return open_opts(o, ep, 0, 1);
}

/* The values of tensor `key` (n floats) as an observer pulls them. */
static uint64_t observe(const char *ep, const char *key, float *out, size_t n)
{
    gddr_client *obs = open_observer(ep);
    int id;
    float *zero = calloc(n, sizeof(float));
    ck_assert_int_eq(gddr_register(obs, key, zero, n, &id, NULL), GDDR_OK);
    free(zero);
    uint64_t v = 0;
    ck_assert_int_eq(gddr_pull(obs, id, out, 0, &v), GDDR_OK);
    gddr_client_close(&obs);
    return v;
}

/* Sends a body-only request (pull, stats, heartbeat, bye, checkpoint) of
 * r's rank; returns its req_id. */
static uint64_t raw_simple(raw_conn *r, Gddr__Request *rq)
{
    rq->protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq->req_id = ++r->next_id;
    rq->rank = r->rank;
    rq->session = r->session;
    ck_assert(gddr__send(r->sock, NULL, &rq->base, NULL, 0) >= 0);
    return rq->req_id;
}

/* The next reply that answers req_id (others, e.g. late ones, are skipped). */
static Gddr__Reply *raw_reply_to(raw_conn *r, uint64_t req_id, gddr__frames *f)
{
    int64_t deadline = gt_now_ms() + WAIT_MS;
    for (;;) {
        int64_t left = deadline - gt_now_ms();
        ck_assert_msg(left > 0, "no reply to request %" PRIu64, req_id);
        gddr__frames fr;
        Gddr__Reply *rep = raw_recv(r, (int)left, &fr);
        ck_assert_msg(rep != NULL, "no reply to request %" PRIu64, req_id);
        if (rep->req_id == req_id) {
            if (f)
                *f = fr;
            else
                gddr__frames_close(&fr);
            return rep;
        }
        gddr__frames_close(&fr);
        gddr__reply__free_unpacked(rep, NULL);
    }
}

static void expect_error(raw_conn *r, uint64_t req_id, int code, const char *what)
{
    Gddr__Reply *rep = raw_reply_to(r, req_id, NULL);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR, "%s: accepted (body %d), expected %s",
                  what, rep->body_case, gddr_strerror(code));
    ck_assert_msg((int)rep->error->code == code, "%s: error %u (%s), expected %d (%s)", what,
                  rep->error->code, rep->error->message, code, gddr_strerror(code));
    gddr__reply__free_unpacked(rep, NULL);
}

/* A scratch directory with a checkpoint directory in it, and the --set
 * that points gddr-ps there. */
static void scratch_ckpt(char *dir, size_t dlen, char *ck, size_t clen, char *set, size_t slen)
{
    gt_mk_tmpdir(dir, dlen);
    snprintf(ck, clen, "%s/ck", dir);
    snprintf(set, slen, "checkpoint_dir=%s", ck);
}

/* The line count of text that contain needle. */
static int count_lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* ---- 1. exactly once -------------------------------------------------------------- */

#define ONES_N 64

/* A worker process: `steps` gddr_steps of a gradient of 1.0 per value on
 * tensor "ones" (ONES_N zeros at start). Forked before the test makes any
 * ZeroMQ context, so the child starts clean. Exits 0 on success. */
static pid_t spawn_ones_worker(const char *ep, int rank, int world, int steps)
{
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid > 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = 500;            /* a pause of a few seconds is a timeout */
    o.reconnect_timeout_ms = 120000;
    o.heartbeat_ms = 200;
    gddr_client *c = NULL;
    if (gddr_client_open(&o, &c) != GDDR_OK)
        _exit(10);
    float w[ONES_N] = { 0 }, g[ONES_N];
    for (int i = 0; i < ONES_N; i++)
        g[i] = 1.0f;
    int id;
    if (gddr_register(c, "ones", w, ONES_N, &id, NULL) != GDDR_OK ||
        gddr_pull(c, id, w, 0, NULL) != GDDR_OK)
        _exit(11);
    const float *gp[1] = { g };
    float *wp[1] = { w };
    for (int s = 0; s < steps; s++) {
        int rc = gddr_step(c, gp, wp);
        if (rc != GDDR_OK) {
            fprintf(stderr, "integrity worker %d: step %d: %s (%s)\n", rank, s, gddr_strerror(rc),
                    gddr_client_errmsg(c));
            _exit(12);
        }
    }
    gddr_client_close(&c);
    _exit(0);
}

static void wait_workers_ok(const pid_t *pid, int n)
{
    for (int i = 0; i < n; i++) {
        int st = 0;
        ck_assert_msg(gt_wait_pid(pid[i], 240000, &st) == 1, "worker %d did not finish", i);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d ended with %s %d", i,
                      WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
}

/* Waits until an observer sees tensor "ones" at version >= v. */
static void wait_version(gddr_client *obs, int *id, uint64_t v)
{
    float w[ONES_N] = { 0 };
    int64_t deadline = gt_now_ms() + WAIT_MS;
    while (*id < 0 && gddr_register(obs, "ones", w, ONES_N, id, NULL) != GDDR_OK) {
        ck_assert_msg(gt_now_ms() < deadline, "tensor 'ones' never registered");
        gt_sleep_ms(20);
    }
    uint64_t have = 0;
    while (gddr_pull(obs, *id, w, 0, &have) == GDDR_OK && have < v) {
        ck_assert_msg(gt_now_ms() < deadline, "version %" PRIu64 " never came (at %" PRIu64 ")", v, have);
        gt_sleep_ms(10);
    }
}

static void assert_ones_result(const char *ep, float want, uint64_t want_version)
{
    float w[ONES_N];
    uint64_t v = observe(ep, "ones", w, ONES_N);
    ck_assert_msg(v == want_version, "version %" PRIu64 ", expected %" PRIu64 " (a push counted twice or lost)",
                  v, want_version);
    for (int i = 0; i < ONES_N; i++)
        ck_assert_msg(w[i] == want, "w[%d] = %.9g, expected exactly %.9g", i, (double)w[i], (double)want);
}

/* The server stopped (SIGSTOP) longer than the workers' timeout mid-run:
 * they reconnect and resend, and the server must take each push once. */
static void server_pause(const char *mode)
{
    enum { W = 3, S = 300 };
    gt_server s;
    char modeset[32];
    snprintf(modeset, sizeof modeset, "mode=%s", mode);
    START_SERVER(s, modeset, "workers=3", "lr=1", "momentum=0", "worker_timeout_s=60");
    pid_t pid[W];
    for (int r = 0; r < W; r++)
        pid[r] = spawn_ones_worker(s.endpoint, r, W, S);
    gddr_client *obs = open_observer(s.endpoint);
    int id = -1;
    wait_version(obs, &id, strcmp(mode, "sync") == 0 ? S / 3 : W * S / 3);
    ck_assert_int_eq(kill(s.pid, SIGSTOP), 0);
    gt_sleep_ms(2000); /* 4x the workers' timeout_ms: every one of them resends */
    ck_assert_int_eq(kill(s.pid, SIGCONT), 0);
    wait_workers_ok(pid, W);
    double dups = gt_server_metric(obs, "gddr_duplicate_pushes_total");
    gddr_client_close(&obs);
    if (strcmp(mode, "sync") == 0)
        assert_ones_result(s.endpoint, -(float)S, S); /* each step: mean of 1.0 */
    else
        assert_ones_result(s.endpoint, -(float)(W * S), W * S);
    ck_assert_msg(dups >= 1, "no resend reached the server: the pause did not test anything");
    fprintf(stderr, "integrity: %s, server stopped 2 s mid-run: %g resent pushes answered, none applied twice\n",
            mode, dups);
    stop_server(&s);
}

START_TEST(test_exactly_once_server_pause_async)
{
    server_pause("async");
}
END_TEST

START_TEST(test_exactly_once_server_pause_sync)
{
    server_pause("sync");
}
END_TEST

/* Workers stopped past their timeout: worker 1 short of worker_timeout_s,
 * worker 2 past it (declared dead, then back as the same session). */
START_TEST(test_exactly_once_worker_pause)
{
    enum { W = 3, S = 1500 };
    gt_server s;
    START_SERVER(s, "lr=1", "momentum=0", "worker_timeout_s=1.5");
    pid_t pid[W];
    for (int r = 0; r < W; r++)
        pid[r] = spawn_ones_worker(s.endpoint, r, W, S);
    gddr_client *obs = open_observer(s.endpoint);
    int id = -1;
    wait_version(obs, &id, W * S / 6);
    kill(pid[1], SIGSTOP);
    kill(pid[2], SIGSTOP);
    gt_sleep_ms(1000); /* past timeout_ms (500), short of worker_timeout_s */
    kill(pid[1], SIGCONT);
    gt_sleep_ms(2000); /* worker 2 silent 3 s: declared dead */
    kill(pid[2], SIGCONT);
    wait_workers_ok(pid, W);
    double deaths = gt_server_metric(obs, "gddr_worker_deaths_total");
    gddr_client_close(&obs);
    assert_ones_result(s.endpoint, -(float)(W * S), W * S);
    ck_assert_msg(deaths >= 1, "worker 2 was not declared dead: the long pause tested nothing");
    stop_server(&s);
}
END_TEST

/* On the wire: a push whose step is not above the last one taken is a
 * resend: the first answer again, nothing applied. A new session for the
 * rank (a new process) starts a fresh history. */
START_TEST(test_duplicate_gets_first_answer)
{
    gt_server s;
    START_SERVER(s, "lr=1", "chunk=4");
    gddr_client *c = open_worker(s.endpoint, 0, 2, 0);
    float w0[4] = { 10, 20, 30, 40 }, g[4] = { 1, 2, 3, 4 }, w[4];
    int id;
    ck_assert_int_eq(gddr_register(c, "d", w0, 4, &id, NULL), GDDR_OK);
    raw_conn r;
    raw_open(&r, s.endpoint);
    r.session = 0x1234567;
    raw_hello(&r, 1, 2);
    uint64_t rid = raw_push_step(&r, (uint32_t)id, g, 4, 0, 5, 1.0f);
    Gddr__Reply *a = raw_reply_to(&r, rid, NULL);
    ck_assert_int_eq(a->body_case, GDDR__REPLY__BODY_PUSH);
    ck_assert(!a->push->duplicate && a->push->applied && a->push->version == 1);
    gddr__reply__free_unpacked(a, NULL);
    /* c pushes too (version 2), then r resends step 5 and sends step 4. */
    ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
    for (uint64_t step = 5; step >= 4; step--) {
        rid = raw_push_step(&r, (uint32_t)id, g, 4, 1, step, 1.0f);
        Gddr__Reply *b = raw_reply_to(&r, rid, NULL);
        ck_assert_int_eq(b->body_case, GDDR__REPLY__BODY_PUSH);
        ck_assert_msg(b->push->duplicate, "step %" PRIu64 " after step 5 was not a duplicate", step);
        ck_assert_msg(b->push->version == 1 && b->push->applied,
                      "the resend was answered with version %" PRIu64 ", not the first answer (1)",
                      b->push->version);
        gddr__reply__free_unpacked(b, NULL);
    }
    ck_assert_uint_eq(observe(s.endpoint, "d", w, 4), 2);
    for (int i = 0; i < 4; i++)
        ck_assert_float_eq(w[i], w0[i] - 2 * g[i]);
    /* Step 6 is new. */
    rid = raw_push_step(&r, (uint32_t)id, g, 4, 2, 6, 1.0f);
    Gddr__Reply *b = raw_reply_to(&r, rid, NULL);
    ck_assert(b->body_case == GDDR__REPLY__BODY_PUSH && !b->push->duplicate && b->push->version == 3);
    gddr__reply__free_unpacked(b, NULL);
    /* A new process takes rank 1 after a bye: its step 0 is taken. */
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Bye bye = GDDR__BYE__INIT;
    rq.body_case = GDDR__REQUEST__BODY_BYE;
    rq.bye = &bye;
    rid = raw_simple(&r, &rq);
    b = raw_reply_to(&r, rid, NULL);
    ck_assert_int_eq(b->body_case, GDDR__REPLY__BODY_ACK);
    gddr__reply__free_unpacked(b, NULL);
    raw_close(&r);
    raw_open(&r, s.endpoint);
    r.session = 0x7654321;
    raw_hello(&r, 1, 2);
    rid = raw_push_step(&r, (uint32_t)id, g, 4, 3, 0, 1.0f);
    b = raw_reply_to(&r, rid, NULL);
    ck_assert(b->body_case == GDDR__REPLY__BODY_PUSH && !b->push->duplicate && b->push->version == 4);
    gddr__reply__free_unpacked(b, NULL);
    ck_assert_double_eq(gt_server_metric(c, "gddr_duplicate_pushes_total"), 2);
    raw_close(&r);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* Asks for a checkpoint and waits until one is in ck. */
static void sr_checkpoint(raw_conn *r, const char *ck)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__CheckpointRequest cr = GDDR__CHECKPOINT_REQUEST__INIT;
    rq.body_case = GDDR__REQUEST__BODY_CHECKPOINT;
    rq.checkpoint = &cr;
    uint64_t rid = raw_simple(r, &rq);
    gddr__reply__free_unpacked(raw_reply_to(r, rid, NULL), NULL);
    int64_t deadline = gt_now_ms() + WAIT_MS;
    uint64_t seqs[2];
    size_t nck = 0;
    while (gddr__ckpt_list(ck, seqs, 2, &nck) == GDDR_OK && nck == 0) {
        ck_assert_msg(gt_now_ms() < deadline, "no checkpoint written");
        gt_sleep_ms(20);
    }
}

/* The records are in the checkpoint: a push taken before it is a resend
 * after a kill -9 and restart, one taken after it (lost with the crash) is
 * applied again, as it must be. */
START_TEST(test_exactly_once_across_restart)
{
    char dir[64], ck[96], log[128], ckset[128];
    scratch_ckpt(dir, sizeof dir, ck, sizeof ck, ckset, sizeof ckset);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    const char *sets[] = { ckset, "checkpoint_interval_s=0", "lr=1", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    raw_conn r;
    raw_open(&r, s.endpoint);
    r.session = 0xfeedbeef;
    raw_hello(&r, 0, 1);
    float w0[2] = { 0, 0 }, g[2] = { 1, 1 };
    Gddr__Reply *rep = NULL;
    {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__InitTensor in = GDDR__INIT_TENSOR__INIT;
        in.key = "r";
        in.n = 2;
        in.payload_bytes = 8;
        rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
        rq.req_id = ++r.next_id;
        rq.rank = 0;
        rq.session = r.session;
        rq.body_case = GDDR__REQUEST__BODY_INIT;
        rq.init = &in;
        gddr__raw raw = { w0, 8, NULL, NULL };
        ck_assert(gddr__send(r.sock, NULL, &rq.base, &raw, 1) >= 0);
        rep = raw_reply_to(&r, rq.req_id, NULL);
        ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_INIT);
        gddr__reply__free_unpacked(rep, NULL);
    }
    uint64_t rid = raw_push_step(&r, 0, g, 2, 0, 1, 1.0f);
    rep = raw_reply_to(&r, rid, NULL);
    ck_assert(rep->body_case == GDDR__REPLY__BODY_PUSH && rep->push->version == 1);
    gddr__reply__free_unpacked(rep, NULL);
    /* A checkpoint with step 1 taken, then step 2 taken and lost. */
    sr_checkpoint(&r, ck);
    rid = raw_push_step(&r, 0, g, 2, 1, 2, 1.0f);
    rep = raw_reply_to(&r, rid, NULL);
    ck_assert(rep->body_case == GDDR__REPLY__BODY_PUSH && rep->push->version == 2);
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    kill(s.pid, SIGKILL);
    ck_assert_int_eq(gt_wait_pid(s.pid, WAIT_MS, NULL), 1);
    s.pid = 0;
    gt_start_logged(&s, log, sets);
    raw_open(&r, s.endpoint);
    r.session = 0xfeedbeef; /* the same process, reconnecting */
    raw_hello(&r, 0, 1);
    rid = raw_push_step(&r, 0, g, 2, 1, 1, 1.0f); /* resend of step 1: in the checkpoint */
    rep = raw_reply_to(&r, rid, NULL);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH && rep->push->duplicate,
                  "step 1, taken before the checkpoint, was taken again after the restart");
    ck_assert_uint_eq(rep->push->version, 1);
    gddr__reply__free_unpacked(rep, NULL);
    rid = raw_push_step(&r, 0, g, 2, 1, 2, 1.0f); /* step 2 was lost with the crash */
    rep = raw_reply_to(&r, rid, NULL);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH && !rep->push->duplicate,
                  "step 2, lost in the crash, was not taken again");
    ck_assert_uint_eq(rep->push->version, 2);
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    float w[2];
    ck_assert_uint_eq(observe(s.endpoint, "r", w, 2), 2);
    ck_assert(w[0] == -2.0f && w[1] == -2.0f);
    stop_server(&s);
    gt_rm_rf(dir);
}
END_TEST

/* ---- sync steps after a restart (issue 24 item 2) -------------------------------- */

static void sr_register(raw_conn *r)
{
    float w0[2] = { 0, 0 };
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__InitTensor in = GDDR__INIT_TENSOR__INIT;
    in.key = "r";
    in.n = 2;
    in.payload_bytes = 8;
    raw_request(r, &rq);
    rq.body_case = GDDR__REQUEST__BODY_INIT;
    rq.init = &in;
    gddr__raw raw = { w0, 8, NULL, NULL };
    ck_assert(gddr__send(r->sock, NULL, &rq.base, &raw, 1) >= 0);
    Gddr__Reply *rep = raw_reply_to(r, rq.req_id, NULL);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_INIT);
    ck_assert_uint_eq(rep->init->id, 0);
    gddr__reply__free_unpacked(rep, NULL);
}

/* A push of 1.0 per value with step `step` tagged with `version`; returns
 * the push reply (the caller frees it). */
static Gddr__Reply *sr_push(raw_conn *r, uint64_t version, uint64_t step)
{
    float g[2] = { 1, 1 };
    uint64_t rid = raw_push_step(r, 0, g, 2, version, step, 1.0f);
    Gddr__Reply *rep = raw_reply_to(r, rid, NULL);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH, "rank %u step %" PRIu64 ": %s", r->rank,
                  step, rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "?");
    return rep;
}

static void sr_expect(raw_conn *r, uint64_t version, uint64_t step, int applied, uint64_t at)
{
    Gddr__Reply *rep = sr_push(r, version, step);
    ck_assert_msg(!rep->push->duplicate && rep->push->applied == applied &&
                      (applied ? rep->push->version : rep->push->sync_target) == at,
                  "rank %u, push of step %" PRIu64 ": applied %d version %" PRIu64 " sync_target %" PRIu64
                  " duplicate %d; expected %s at %" PRIu64,
                  r->rank, step, rep->push->applied, rep->push->version, rep->push->sync_target,
                  rep->push->duplicate, applied ? "applied" : "collected", at);
    gddr__reply__free_unpacked(rep, NULL);
}

/* Three raw workers of sessions session0 + k say hello and register "r". */
static void sr_join(raw_conn *r, const gt_server *s, uint64_t session0)
{
    for (int k = 0; k < 3; k++) {
        raw_open(&r[k], s->endpoint);
        r[k].session = session0 + (uint64_t)k;
        raw_hello(&r[k], (uint32_t)k, 3);
        sr_register(&r[k]);
    }
}

/* Closes the workers, kill -9s the server and starts it again on its
 * checkpoint. */
static void sr_kill_restart(raw_conn *r, gt_server *s, const char *log, const char *const *sets)
{
    for (int k = 0; k < 3; k++)
        raw_close(&r[k]);
    kill(s->pid, SIGKILL);
    ck_assert_int_eq(gt_wait_pid(s->pid, WAIT_MS, NULL), 1);
    s->pid = 0;
    gt_start_logged(s, log, sets);
}

/* The workers leave; the observer's values of "r" at `version`; the server stops. */
static void sr_finish(raw_conn *r, gt_server *s, const char *dir, uint64_t version, float want)
{
    for (int k = 0; k < 3; k++)
        raw_close(&r[k]);
    float w[2];
    ck_assert_uint_eq(observe(s->endpoint, "r", w, 2), version);
    ck_assert_msg(fabsf(w[0] - want) < 1e-5f, "values %g, expected %g", (double)w[0], (double)want);
    stop_server(s);
    gt_rm_rf(dir);
}

/* The checkpoint holds an open sync step with rank 0's push of step 2; the
 * others' pushes of step 2 complete it after the checkpoint, and they push
 * step 3 before the kill -9. After the restart ranks 1 and 2 resend step 3
 * and rank 0 sends step 3: the restored step (step 2) must close before
 * step 3 collects, so step 3 completes with all three (before, ranks 1
 * and 2 completed the restored step with their step 3, and rank 0's step 3
 * opened a step of its own that the other shards never have: the sharded
 * run's deadlock). */
START_TEST(test_sync_restore_steps_line_up)
{
    char dir[64], ck[96], log[128], ckset[128];
    scratch_ckpt(dir, sizeof dir, ck, sizeof ck, ckset, sizeof ckset);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    const char *sets[] = { ckset, "checkpoint_interval_s=0", "lr=1", "mode=sync", "workers=3", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    raw_conn r[3];
    sr_join(r, &s, 0xabc0);
    sr_expect(&r[0], 0, 1, 0, 1);
    sr_expect(&r[1], 0, 1, 0, 1);
    sr_expect(&r[2], 0, 1, 1, 1);
    sr_expect(&r[0], 1, 2, 0, 2);
    sr_checkpoint(&r[0], ck);
    sr_expect(&r[1], 1, 2, 0, 2);
    sr_expect(&r[2], 1, 2, 1, 2);
    sr_expect(&r[1], 2, 3, 0, 3);
    sr_expect(&r[2], 2, 3, 0, 3);
    sr_kill_restart(r, &s, log, sets);
    sr_join(r, &s, 0xabc0);
    /* Restored at version 1, step 2 open with rank 0's push. */
    sr_expect(&r[1], 1, 3, 0, 3); /* closes step 2 (version 2), collects step 3 */
    sr_expect(&r[2], 1, 3, 0, 3);
    sr_expect(&r[0], 2, 3, 1, 3); /* step 3 complete: nobody waits on a step of its own */
    /* And on: step 4 lines up as ever. */
    sr_expect(&r[0], 3, 4, 0, 4);
    sr_expect(&r[1], 3, 4, 0, 4);
    sr_expect(&r[2], 3, 4, 1, 4);
    /* Step 1, step 2 with rank 0's push alone (the others' went with the
     * crash: 1/3), steps 3 and 4 whole. */
    sr_finish(r, &s, dir, 4, -3.0f - 1.0f / 3.0f);
}
END_TEST

/* The same checkpoint (step 2 open with rank 0's push), but the workers
 * restart too: new sessions number their steps from 1 again, their first
 * pushes join the open step (none is taken for an old step's), and the
 * steps do not wait for a new process until it has pushed. */
START_TEST(test_sync_restore_new_sessions)
{
    char dir[64], ck[96], log[128], ckset[128];
    scratch_ckpt(dir, sizeof dir, ck, sizeof ck, ckset, sizeof ckset);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    const char *sets[] = { ckset, "checkpoint_interval_s=0", "lr=1", "mode=sync", "workers=3", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    raw_conn r[3];
    sr_join(r, &s, 0xabc0);
    for (int k = 0; k < 3; k++)
        sr_expect(&r[k], 0, 1, k == 2, 1);
    sr_expect(&r[0], 1, 2, 0, 2);
    sr_checkpoint(&r[0], ck);
    sr_kill_restart(r, &s, log, sets);
    sr_join(r, &s, 0xdef0); /* new processes */
    /* A new process in place of one that took part is not waited for
     * until it pushes (it starts its loop at the top, whatever phase the
     * others are in): rank 1's push completes the restored step with rank
     * 0's restored push; ranks 0 and 2 are excused. */
    sr_expect(&r[1], 1, 1, 1, 2);
    sr_expect(&r[2], 1, 1, 0, 3); /* its first push: the open step */
    sr_expect(&r[0], 2, 1, 0, 3);
    sr_expect(&r[1], 2, 2, 1, 3);
    sr_expect(&r[2], 3, 2, 0, 4);
    sr_expect(&r[0], 3, 2, 0, 4);
    sr_expect(&r[1], 3, 3, 1, 4);
    /* Nothing lost: 11 pushes of 1 over 3 workers. */
    sr_finish(r, &s, dir, 4, -11.0f / 3.0f);
}
END_TEST

/* A worker that said bye is forgotten: the next checkpoint carries only the
 * workers still live (or dead, which may come back). */
START_TEST(test_checkpoint_forgets_departed)
{
    char dir[64], ck[96], log[128], ckset[128];
    scratch_ckpt(dir, sizeof dir, ck, sizeof ck, ckset, sizeof ckset);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    const char *sets[] = { ckset, "checkpoint_interval_s=0", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *a = open_worker(s.endpoint, 0, 3, 0), *b = open_worker(s.endpoint, 1, 3, 0);
    float w0[2] = { 1, 2 };
    int id;
    ck_assert_int_eq(gddr_register(a, "f", w0, 2, &id, NULL), GDDR_OK);
    gddr_client_close(&a); /* bye */
    ck_assert(gt_wait_for_text(log, "worker 0 left", WAIT_MS) >= 0);
    stop_server(&s); /* the final checkpoint: rank 1 live, rank 0 gone */
    gt_start_logged(&s, log, sets);
    ck_assert_msg(gt_wait_for_text(log, "1 tensors, 1 workers", WAIT_MS) >= 0,
                  "the checkpoint did not carry exactly the one live worker");
    b->info.epoch = 0; /* its server is gone: no bye to send */
    gddr_client_close(&b);
    stop_server(&s);
    gt_rm_rf(dir);
}
END_TEST

/* ---- 2. the GDDR flush at close in sync mode ---------------------------------------- */

typedef struct flush_worker {
    const char *ep;
    int rank, steps;
    double alpha;
    gddr_client *c;
    int rc;
    pthread_barrier_t *done;
} flush_worker;

/* Steps with a gradient of -5 (the quadratic's at w = 0, held constant). */
static void *flush_main(void *arg)
{
    flush_worker *a = arg;
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = a->ep;
    o.rank = a->rank;
    o.world_size = 4;
    o.timeout_ms = 30000;
    o.delay_fraction = a->alpha;
    a->rc = gddr_client_open(&o, &a->c);
    float w = 0, g = -5;
    int id;
    if (a->rc == GDDR_OK)
        a->rc = gddr_register(a->c, "q", &w, 1, &id, NULL);
    const float *gp[1] = { &g };
    float *wp[1] = { &w };
    for (int s = 0; s < a->steps && a->rc == GDDR_OK; s++) {
        if (s == a->steps - 1 && a->done) /* the extra step: after the others are done */
            pthread_barrier_wait(a->done);
        a->rc = gddr_step(a->c, gp, wp);
    }
    return NULL;
}

/* lr 0.4, 4 workers, alpha 0.9: everything the workers computed is
 * 4 * S gradients of -5, so the server must end at 0.4 * 5 * S exactly. The
 * workers leave one by one; their flushes weigh 1/4 each. */
START_TEST(test_sync_flush_weight)
{
    enum { W = 4, S = 3 };
    gt_server s;
    START_SERVER(s, "mode=sync", "lr=0.4", "workers=4", "tau_dynamic=false", "tau_init=4");
    flush_worker a[W];
    pthread_t th[W];
    for (int r = 0; r < W; r++) {
        a[r] = (flush_worker){ s.endpoint, r, S, 0.9, NULL, 0, NULL };
        ck_assert_int_eq(pthread_create(&th[r], NULL, flush_main, &a[r]), 0);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < W; r++)
        ck_assert_msg(a[r].rc == GDDR_OK, "worker %d: %s", r, gddr_strerror(a[r].rc));
    float held = 0;
    for (int r = 0; r < W; r++) { /* one by one, the others still connected */
        float rr;
        ck_assert_int_eq(gddr__residual_get(a[r].c, 0, &rr), GDDR_OK);
        held += rr;
        gddr_client_close(&a[r].c);
    }
    float w;
    observe(s.endpoint, "q", &w, 1);
    ck_assert_msg(held != 0, "no worker held anything at the end: the flush was not tested");
    ck_assert_msg(fabsf(w - 0.4f * 5 * S) <= 1e-5f, "server's w = %.9g, expected %.9g", (double)w,
                  (double)(0.4f * 5 * S));
    fprintf(stderr, "integrity: sync flush of %g held by 4 GDDR workers: server w = %.7g (exact %g)\n",
            (double)held, (double)w, 0.4 * 5 * S);
    stop_server(&s);
}
END_TEST

/* The same with a flush that arrives while a sync step is open: worker 3
 * (dense) takes one step more than the GDDR workers 0-2, which close while
 * that step waits for them. Their flushes wait for the step (divided by the
 * one worker left) and then weigh 1/4 each, as in their steps. */
START_TEST(test_sync_flush_during_open_step)
{
    enum { W = 4, S = 3 };
    gt_server s;
    START_SERVER(s, "mode=sync", "lr=0.4", "workers=4", "tau_dynamic=false", "tau_init=4");
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    flush_worker a[W];
    pthread_t th[W];
    for (int r = 0; r < W; r++) {
        a[r] = (flush_worker){ s.endpoint, r, r == 3 ? S + 1 : S, r == 3 ? 0.0 : 0.9, NULL, 0,
                               r == 3 ? &go : NULL };
        ck_assert_int_eq(pthread_create(&th[r], NULL, flush_main, &a[r]), 0);
    }
    for (int r = 0; r < 3; r++) {
        pthread_join(th[r], NULL);
        ck_assert_msg(a[r].rc == GDDR_OK, "worker %d: %s", r, gddr_strerror(a[r].rc));
    }
    pthread_barrier_wait(&go); /* worker 3 pushes its extra step */
    gddr_client *obs = open_observer(s.endpoint);
    int64_t deadline = gt_now_ms() + WAIT_MS;
    while (get_stats(obs).pushes < 4 * S + 1) {
        ck_assert_msg(gt_now_ms() < deadline, "worker 3's extra push never came");
        gt_sleep_ms(10);
    }
    float held = 0;
    for (int r = 0; r < 3; r++) {
        float rr;
        ck_assert_int_eq(gddr__residual_get(a[r].c, 0, &rr), GDDR_OK);
        held += rr;
        gddr_client_close(&a[r].c);
    }
    pthread_join(th[3], NULL);
    ck_assert_msg(a[3].rc == GDDR_OK, "worker 3: %s", gddr_strerror(a[3].rc));
    gddr_client_close(&a[3].c);
    gddr_client_close(&obs);
    pthread_barrier_destroy(&go);
    float w;
    observe(s.endpoint, "q", &w, 1);
    ck_assert_msg(held != 0, "no worker held anything at the end: the flush was not tested");
    float want = 0.4f * 5 * S + 0.4f * 5; /* the extra step alone, divided by 1 */
    ck_assert_msg(fabsf(w - want) <= 1e-5f, "server's w = %.9g, expected %.9g", (double)w, (double)want);
    stop_server(&s);
}
END_TEST

/* ---- 3. membership: refused requests change nothing ------------------------------- */

/* A hello that is refused does not make a worker; a second session cannot
 * take over a live rank, nor say bye or heartbeat for it. In sync mode with
 * two workers, rank 0's push must still wait for rank 1. */
START_TEST(test_membership_cannot_be_forged)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "lr=1", "worker_timeout_s=3600");
    gddr_client *c0 = open_worker(s.endpoint, 0, 2, 0), *c1 = open_worker(s.endpoint, 1, 2, 0);
    float w0[2] = { 0, 0 }, g[2] = { 2, 4 };
    int id;
    ck_assert_int_eq(gddr_register(c0, "m", w0, 2, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c1, "m", w0, 2, &id, NULL), GDDR_OK);
    ck_assert_int_eq(get_stats(c0).live_workers, 2);

    raw_conn r;
    raw_open(&r, s.endpoint);
    /* Refused hellos: rank 77 of 5000 (above max_workers), rank 5 of 2. */
    struct { uint32_t rank, world; } bad[] = { { 77, 5000 }, { 5, 2 }, { 2, 3 } };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Hello h = GDDR__HELLO__INIT;
        h.world_size = bad[k].world;
        rq.body_case = GDDR__REQUEST__BODY_HELLO;
        rq.hello = &h;
        r.rank = bad[k].rank;
        uint64_t rid = raw_simple(&r, &rq);
        expect_error(&r, rid, GDDR_EWORKER, "a hello outside the world");
    }
    ck_assert_msg(get_stats(c0).live_workers == 2, "a refused hello made a worker");
    /* Rank 0 is held by c0's session: another connection is refused... */
    r.rank = 0;
    {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Hello h = GDDR__HELLO__INIT;
        h.world_size = 2;
        rq.body_case = GDDR__REQUEST__BODY_HELLO;
        rq.hello = &h;
        uint64_t rid = raw_simple(&r, &rq);
        Gddr__Reply *rep = raw_reply_to(&r, rid, NULL);
        ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_ERROR && rep->error->code == GDDR_EWORKER,
                      "a second session took over live rank 0");
        ck_assert_msg(rep->error->retry_ms > 0, "the refusal of a held rank does not say it passes");
        gddr__reply__free_unpacked(rep, NULL);
    }
    /* ... and cannot say bye, heartbeat or push for it. */
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Bye bye = GDDR__BYE__INIT;
    rq.body_case = GDDR__REQUEST__BODY_BYE;
    rq.bye = &bye;
    expect_error(&r, raw_simple(&r, &rq), GDDR_EWORKER, "a bye for rank 0 from another session");
    Gddr__Request hq = GDDR__REQUEST__INIT;
    Gddr__Heartbeat hb = GDDR__HEARTBEAT__INIT;
    hq.body_case = GDDR__REQUEST__BODY_HEARTBEAT;
    hq.heartbeat = &hb;
    expect_error(&r, raw_simple(&r, &hq), GDDR_EWORKER, "a heartbeat for rank 0 from another session");
    expect_error(&r, raw_push_step(&r, (uint32_t)id, g, 2, 0, 1, 1.0f), GDDR_EWORKER,
                 "a push for rank 0 from another session");
    raw_close(&r);
    ck_assert_int_eq(get_stats(c0).live_workers, 2);
    /* Rank 0 pushes: the step waits for rank 1 (nothing applied yet). */
    gddr_ticket tk;
    ck_assert_int_eq(gddr_push_async(c0, id, g, NULL, &tk), GDDR_OK);
    uint64_t v = 99;
    ck_assert_int_eq(gddr_wait(c0, tk, WAIT_MS, &v), GDDR_OK);
    ck_assert_msg(get_stats(c1).versions_total == 0, "rank 0's push was applied alone as a full step");
    ck_assert_int_eq(gddr_push(c1, id, g, &v), GDDR_OK);
    ck_assert_uint_eq(v, 1);
    float w[2];
    ck_assert_uint_eq(observe(s.endpoint, "m", w, 2), 1);
    ck_assert(w[0] == -2.0f && w[1] == -4.0f); /* the mean of two pushes of g */
    gddr_client_close(&c0);
    gddr_client_close(&c1);
    stop_server(&s);
}
END_TEST

/* A tool's request (no rank, observer) and a stranger's never revive a
 * worker that said bye, nor make workers of made-up ranks; strangers
 * cannot register or push. */
START_TEST(test_strangers_leave_no_trace)
{
    char dir[64], log[128];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "lr=1", "worker_timeout_s=3600", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c = open_worker(s.endpoint, 0, 1, 0);
    float w0[2] = { 1, 2 };
    int id;
    ck_assert_int_eq(gddr_register(c, "t", w0, 2, &id, NULL), GDDR_OK);
    gddr_client_close(&c); /* bye */
    ck_assert(gt_wait_for_text(log, "worker 0 left", WAIT_MS) >= 0);
    /* gddr-ctl status: an observer request with rank 0. */
    char bin[512], *out = NULL, err[256];
    gt_bin_path(bin, sizeof bin, "gddr-ctl");
    char *argv[] = { bin, "-s", s.endpoint, "status", NULL };
    int st = 0;
    ck_assert_int_eq(gt_run_capture(argv, WAIT_MS, 1, &out, &st, err, sizeof err), 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gddr-ctl status failed");
    ck_assert_msg(strstr(out, "live workers   0"), "gddr-ctl sees live workers:\n%s", out);
    free(out);
    /* Strangers: requests from made-up ranks without a hello. */
    raw_conn r;
    raw_open(&r, s.endpoint);
    float g[2] = { 1, 1 };
    for (uint32_t rank = 1; rank < 40; rank++) {
        r.rank = rank;
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__StatsRequest sr = GDDR__STATS_REQUEST__INIT;
        rq.body_case = GDDR__REQUEST__BODY_STATS;
        rq.stats = &sr;
        gddr__reply__free_unpacked(raw_reply_to(&r, raw_simple(&r, &rq), NULL), NULL);
        expect_error(&r, raw_push_step(&r, (uint32_t)id, g, 2, 0, 1, 1.0f), GDDR_EWORKER,
                     "a stranger's push");
        Gddr__Request iq = GDDR__REQUEST__INIT;
        Gddr__InitTensor in = GDDR__INIT_TENSOR__INIT;
        char key[32];
        snprintf(key, sizeof key, "junk%u", rank);
        in.key = key;
        in.n = 2;
        in.payload_bytes = 8;
        iq.protocol = GDDR__CONST__PROTOCOL_VERSION;
        iq.req_id = ++r.next_id;
        iq.rank = rank;
        iq.body_case = GDDR__REQUEST__BODY_INIT;
        iq.init = &in;
        gddr__raw raw = { g, 8, NULL, NULL };
        ck_assert(gddr__send(r.sock, NULL, &iq.base, &raw, 1) >= 0);
        expect_error(&r, iq.req_id, GDDR_EWORKER, "a stranger's registration");
    }
    raw_close(&r);
    gddr_client *obs = open_observer(s.endpoint);
    char *text = NULL;
    ck_assert_int_eq(gddr_server_metrics_text(obs, &text), GDDR_OK);
    ck_assert_double_eq(gt_metric_of(text, "gddr_live_workers"), 0);
    ck_assert_double_eq(gt_metric_of(text, "gddr_pushes_total"), 0);
    ck_assert_msg(count_lines_with(text, "gddr_tensor_version{") == 1,
                  "a stranger registered a tensor:\n%s", text);
    ck_assert_msg(count_lines_with(text, "gddr_worker_pushes_total{") == 1,
                  "strangers are listed as workers:\n%s", text);
    free(text);
    gddr_client_close(&obs);
    ck_assert_msg(!gt_file_has(log, "rejoined"), "a tool or a stranger revived worker 0");
    ck_assert_msg(!gt_file_has(log, "worker 1 joined"), "a stranger became a worker");
    stop_server(&s);
    gt_rm_rf(dir);
}
END_TEST

/* allow_register = false freezes the tensor set. */
START_TEST(test_registration_can_be_closed)
{
    gt_server s;
    START_SERVER(s, "allow_register=false");
    gddr_client *c = open_worker(s.endpoint, 0, 1, 0);
    float w0[2] = { 1, 2 };
    int id;
    ck_assert_int_eq(gddr_register(c, "t", w0, 2, &id, NULL), GDDR_ESTATE);
    ck_assert_msg(strstr(gddr_client_errmsg(c), "allow_register"), "%s", gddr_client_errmsg(c));
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 4. bounds ------------------------------------------------------------------ */

/* Checkpoint requests coalesce: a flood costs at most one checkpoint in
 * flight, and at most one started a second. */
START_TEST(test_checkpoint_requests_coalesce)
{
    char dir[64], ck[96], set[128];
    scratch_ckpt(dir, sizeof dir, ck, sizeof ck, set, sizeof set);
    gt_server s;
    START_SERVER(s, set, "checkpoint_interval_s=0", "checkpoint_keep=1000");
    gddr_client *c = open_worker(s.endpoint, 0, 1, 0);
    float *big = calloc(1 << 20, sizeof(float)); /* 4 MiB: a write takes a moment */
    int id;
    ck_assert_int_eq(gddr_register(c, "big", big, 1 << 20, &id, NULL), GDDR_OK);
    free(big);
    gddr_client *obs = open_observer(s.endpoint);
    enum { N = 300 };
    int64_t t0 = gt_now_ms();
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(gddr_request_checkpoint(obs), GDDR_OK);
    double secs = (double)(gt_now_ms() - t0) / 1000.0;
    double req = gt_server_metric(obs, "gddr_checkpoint_requests_total");
    double joined = gt_server_metric(obs, "gddr_checkpoint_requests_joined_total");
    ck_assert_double_eq(req, N);
    /* Started ones: the requests that did not join. */
    double started = req - joined;
    ck_assert_msg(started <= secs + 2, "%g checkpoints started for %d requests in %.1f s", started, N,
                  secs);
    ck_assert_msg(started >= 1, "no request started a checkpoint");
    fprintf(stderr, "integrity: %d checkpoint requests in %.2f s started %g checkpoints\n", N, secs,
            started);
    gddr_client_close(&obs);
    gddr_client_close(&c);
    stop_server(&s);
    gt_rm_rf(dir);
}
END_TEST

/* Residual snapshots: only a worker's are kept, an empty one costs
 * nothing, and all of them stay under max_snapshot_bytes. */
START_TEST(test_snapshots_bounded)
{
    gt_server s;
    START_SERVER(s, "chunk=4", "max_snapshot_bytes=1024");
    gddr_client *c = open_worker(s.endpoint, 0, 2, 0);
    enum { N = 400 }; /* 100 chunks */
    float *w0 = calloc(N, sizeof(float));
    int id;
    ck_assert_int_eq(gddr_register(c, "s", w0, N, &id, NULL), GDDR_OK);
    raw_conn r;
    raw_open(&r, s.endpoint);
    uint8_t none[13] = { 0 }, all[13];
    memset(all, 0xff, sizeof all);
    all[12] = 0x0f; /* chunks 96-99 */
    float g[N];
    for (int i = 0; i < N; i++)
        g[i] = 0.0f;
    /* A push with a snapshot: stranger (refused), worker with an empty one,
     * worker with one too big for the bound. */
    for (int k = 0; k < 3; k++) {
        if (k == 1)
            raw_hello(&r, 1, 2);
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Push p = GDDR__PUSH__INIT;
        rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
        rq.req_id = ++r.next_id;
        rq.rank = k == 0 ? 77 : 1;
        p.id = (uint32_t)id;
        p.step = (uint64_t)k;
        p.payload_bytes = N * 4;
        p.residual_snapshot = 1;
        p.residual_bitmap.data = k == 2 ? all : none;
        p.residual_bitmap.len = sizeof none;
        p.residual_payload_bytes = k == 2 ? N * 4 : 0;
        rq.body_case = GDDR__REQUEST__BODY_PUSH;
        rq.push = &p;
        gddr__raw raws[2] = { { g, N * 4, NULL, NULL }, { g, k == 2 ? N * 4 : 0, NULL, NULL } };
        ck_assert(gddr__send(r.sock, NULL, &rq.base, raws, 2) >= 0);
        if (k == 0) {
            expect_error(&r, rq.req_id, GDDR_EWORKER, "a stranger's push with a snapshot");
        } else if (k == 1) {
            Gddr__Reply *rep = raw_reply_to(&r, rq.req_id, NULL);
            ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_PUSH);
            gddr__reply__free_unpacked(rep, NULL);
            ck_assert_msg(gt_server_metric(c, "gddr_snapshot_bytes") == 0,
                          "an empty snapshot cost memory");
        } else {
            expect_error(&r, rq.req_id, GDDR_ETOOBIG, "a snapshot above max_snapshot_bytes");
        }
    }
    ck_assert_double_eq(gt_server_metric(c, "gddr_snapshot_bytes"), 0);
    raw_close(&r);
    free(w0);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

/* A peer that pulls and never reads: after max_queued_reply_bytes its
 * pulls get E_BUSY, and the server's memory does not grow with them. */
START_TEST(test_unread_replies_bounded)
{
    gt_server s;
    START_SERVER(s, "max_queued_reply_bytes=8388608", "lr=1");
    enum { N = 1 << 18 }; /* 1 MiB */
    float *w = calloc(N, sizeof(float)), *g = calloc(N, sizeof(float));
    for (int i = 0; i < N; i++)
        g[i] = 1.0f;
    gddr_client *c = open_worker(s.endpoint, 0, 1, 0);
    int id;
    ck_assert_int_eq(gddr_register(c, "big", w, N, &id, NULL), GDDR_OK);
    raw_conn r;
    raw_open(&r, s.endpoint);
    int one = 1;
    zmq_setsockopt(r.sock, ZMQ_RCVHWM, &one, sizeof one); /* it reads nothing */
    int small = 65536;
    zmq_setsockopt(r.sock, ZMQ_RCVBUF, &small, sizeof small);
    long before = rss_kb(s.pid);
    enum { PULLS = 200 };
    uint64_t last = 0;
    for (int k = 0; k < PULLS; k++) {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Pull p = GDDR__PULL__INIT;
        p.id = (uint32_t)id;
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        last = raw_simple(&r, &rq);
        /* A new version between pulls: replies cannot share a buffer. */
        ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
    }
    long after = rss_kb(s.pid);
    /* What the server holds for them, by its own books: the unread replies'
     * bytes stay at the bound, and so do the versions they keep alive. */
    gddr_client *obs = open_observer(s.endpoint);
    double queued = gt_server_metric(obs, "gddr_queued_reply_bytes");
    double buffers = gt_server_metric(obs, "gddr_pull_buffer_bytes");
    gddr_client_close(&obs);
    /* Now read everything: some pulls were answered, the rest refused. */
    int served = 0, busy = 0;
    for (uint64_t rid = last - PULLS + 1; rid <= last; rid++) {
        gddr__frames f;
        Gddr__Reply *rep = raw_reply_to(&r, rid, &f);
        if (rep->body_case == GDDR__REPLY__BODY_PULL)
            served++;
        else if (rep->body_case == GDDR__REPLY__BODY_ERROR && rep->error->code == GDDR_EBUSY)
            busy++;
        gddr__frames_close(&f);
        gddr__reply__free_unpacked(rep, NULL);
    }
    fprintf(stderr, "integrity: %d pulls of 1 MiB never read: %d answered, %d refused E_BUSY; "
            "%.0f bytes queued, %.0f bytes of versions kept; server RSS %ld -> %ld kB\n", PULLS,
            served, busy, queued, buffers, before, after);
    ck_assert_int_eq(served + busy, PULLS);
    ck_assert_msg(busy > 0, "no pull was refused: the bound did not act");
    ck_assert_msg(served >= 1, "not even one reply went out");
    /* At most the bound plus the one reply that may always go, and the
     * tensor's current version on top for the versions. */
    ck_assert_msg(queued <= 8388608.0 + N * 4, "%.0f reply bytes queued for one peer", queued);
    ck_assert_msg(buffers <= 8388608.0 + 2.0 * N * 4, "%.0f bytes of versions kept for unread replies",
                  buffers);
    raw_close(&r);
    free(w);
    free(g);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* A reader that reads slowly gets, for every pull, the values of the
 * version its reply names, however many pushes land while its replies wait
 * in the queue: an update never writes into a buffer a reply still holds
 * (copy on write). */
START_TEST(test_slow_reader_sees_its_version)
{
    gt_server s;
    START_SERVER(s, "lr=1");
    enum { N = 1 << 20 }; /* 4 MiB: two replies do not fit the socket buffers */
    float *w = malloc(N * 4), *g = malloc(N * 4);
    for (int i = 0; i < N; i++) {
        w[i] = 1000.0f;
        g[i] = 1.0f;
    }
    gddr_client *c = open_worker(s.endpoint, 0, 1, 0);
    int id;
    ck_assert_int_eq(gddr_register(c, "slow", w, N, &id, NULL), GDDR_OK);
    raw_conn r;
    raw_open(&r, s.endpoint);
    int one = 1, small = 65536;
    zmq_setsockopt(r.sock, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(r.sock, ZMQ_RCVBUF, &small, sizeof small);
    enum { PULLS = 4 };
    uint64_t rid[PULLS];
    for (int k = 0; k < PULLS; k++) {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Pull p = GDDR__PULL__INIT;
        p.id = (uint32_t)id;
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        rid[k] = raw_simple(&r, &rq);
        for (int j = 0; j < 3; j++) /* updates while the replies wait */
            ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
    }
    for (int k = 0; k < PULLS; k++) {
        gddr__frames f;
        Gddr__Reply *rep = raw_reply_to(&r, rid[k], &f);
        ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_PULL);
        ck_assert_int_eq(f.n, 2);
        const float *v = gddr__frame_data(&f, 1);
        float want = 1000.0f - (float)rep->pull->version;
        for (int i = 0; i < N; i += 4099)
            ck_assert_msg(v[i] == want, "reply %d says version %" PRIu64 " but element %d is %g, not %g",
                          k, rep->pull->version, i, (double)v[i], (double)want);
        ck_assert_msg(v[N - 1] == want, "reply %d: the last element is %g, not %g", k,
                      (double)v[N - 1], (double)want);
        gddr__frames_close(&f);
        gddr__reply__free_unpacked(rep, NULL);
    }
    raw_close(&r);
    free(w);
    free(g);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* Updates run beside the front thread (server/apply.c): several workers
 * push to one shared tensor and to their own, with pushes in flight while
 * they pull. lr 1, gradients of 1, values 0 at first: a pull that says
 * version v must hold -v in every element (no torn or early reply), and the
 * end state counts every push once. */
enum { OV_N = 1 << 17, OV_WORKERS = 4, OV_ITERS = 40 };

typedef struct ov_arg {
    const char *ep;
    int rank;
    char err[256];
} ov_arg;

static int ov_uniform(const float *v, float want, uint64_t version, const char *what, char *err,
                      size_t elen)
{
    for (int i = 0; i < OV_N; i++)
        if (v[i] != want) {
            snprintf(err, elen, "%s says version %" PRIu64 " but element %d is %g, not %g", what,
                     version, i, (double)v[i], (double)want);
            return 0;
        }
    return 1;
}

static void *ov_main(void *arg)
{
    ov_arg *a = arg;
    float *g = malloc(OV_N * 4), *ps = calloc(OV_N, 4), *po = calloc(OV_N, 4);
    for (int i = 0; i < OV_N; i++)
        g[i] = 1.0f;
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = a->ep;
    o.rank = a->rank;
    o.world_size = OV_WORKERS;
    o.timeout_ms = 30000;
    gddr_client *c = NULL;
    char key[32];
    int shared, own;
    snprintf(key, sizeof key, "own.%d", a->rank);
    if (gddr_client_open(&o, &c) != GDDR_OK || gddr_register(c, "shared", ps, OV_N, &shared, NULL) ||
        gddr_register(c, key, po, OV_N, &own, NULL)) {
        snprintf(a->err, sizeof a->err, "rank %d: cannot open or register", a->rank);
        goto out;
    }
    for (int it = 0; it < OV_ITERS; it++) {
        gddr_ticket t1, t2;
        uint64_t vs = 0, vo = 0;
        if (gddr_push_async(c, own, g, NULL, &t1) || gddr_push_async(c, shared, g, NULL, &t2) ||
            gddr_pull(c, shared, ps, 0, &vs) || gddr_wait(c, t1, WAIT_MS, NULL) ||
            gddr_wait(c, t2, WAIT_MS, NULL) || gddr_pull(c, own, po, 0, &vo)) {
            snprintf(a->err, sizeof a->err, "rank %d, round %d: %s", a->rank, it, gddr_client_errmsg(c));
            goto out;
        }
        if (!ov_uniform(ps, -(float)vs, vs, "a pull of the shared tensor", a->err, sizeof a->err) ||
            !ov_uniform(po, -(float)vo, vo, "a pull of its own tensor", a->err, sizeof a->err))
            goto out;
        if (vo != (uint64_t)it + 1) {
            snprintf(a->err, sizeof a->err, "rank %d: own tensor at version %" PRIu64 " after %d pushes",
                     a->rank, vo, it + 1);
            goto out;
        }
    }
out:
    gddr_client_close(&c);
    free(g), free(ps), free(po);
    return NULL;
}

START_TEST(test_overlapped_applies_exact)
{
    gt_server s;
    START_SERVER(s, "lr=1", "threads=3", "workers=4");
    pthread_t th[OV_WORKERS];
    ov_arg args[OV_WORKERS];
    for (int r = 0; r < OV_WORKERS; r++) {
        args[r] = (ov_arg){ s.endpoint, r, "" };
        ck_assert_int_eq(pthread_create(&th[r], NULL, ov_main, &args[r]), 0);
    }
    for (int r = 0; r < OV_WORKERS; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < OV_WORKERS; r++)
        ck_assert_msg(args[r].err[0] == 0, "%s", args[r].err);
    float *v = malloc(OV_N * 4);
    char err[256] = "";
    uint64_t ver = observe(s.endpoint, "shared", v, OV_N);
    ck_assert_uint_eq(ver, OV_WORKERS * OV_ITERS);
    ck_assert_msg(ov_uniform(v, -(float)ver, ver, "the final shared tensor", err, sizeof err), "%s", err);
    free(v);
    printf("integrity: %d workers x %d rounds of overlapped pushes and pulls: every reply whole, "
           "shared tensor at version %" PRIu64 " = -%" PRIu64 " everywhere\n",
           OV_WORKERS, OV_ITERS, ver, ver);
    stop_server(&s);
}
END_TEST

/* Large tensors travel in parts (client option part_bytes): the same steps
 * -- dense, then GDDR alpha 0.5 with sparse pushes -- against a server that
 * takes each push whole and one that takes it in parts give bit-identical
 * parameters on the worker and on the server, and the parts really were
 * parts (the server's counters). Tensors of 70000 values, chunks of 256
 * (the last chunk short), parts of 3 chunks: 92 parts a push. */
enum { PT_N = 70000, PT_STEPS = 12 };

static void parts_run(const char *ep, uint64_t part_bytes, float *params, double alpha)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.timeout_ms = 30000;
    o.part_bytes = part_bytes;
    o.delay_fraction = alpha;
    gddr_client *c = open_opts(o, ep, 0, 1);
    float *w = malloc(PT_N * 4), *g = malloc(PT_N * 4);
    for (int i = 0; i < PT_N; i++)
        w[i] = (float)(i % 101) * 0.25f;
    int id;
    ck_assert_int_eq(gddr_register(c, alpha > 0 ? "pg" : "pd", w, PT_N, &id, NULL), GDDR_OK);
    for (int s = 0; s < PT_STEPS; s++) {
        for (int i = 0; i < PT_N; i++)
            g[i] = (float)((i * 7 + s * 13) % 17) * 0.125f - 1.0f;
        const float *gp[1] = { g };
        float *pp[1] = { w };
        ck_assert_msg(gddr_step(c, gp, pp) == GDDR_OK, "step %d: %s", s, gddr_client_errmsg(c));
    }
    memcpy(params, w, PT_N * 4);
    gddr_client_close(&c);
    free(w), free(g);
}

START_TEST(test_parts_bit_exact)
{
    gt_server whole, parted;
    START_SERVER(whole, "lr=0.5", "chunk=256");
    START_SERVER(parted, "lr=0.5", "chunk=256");
    float *a = malloc(PT_N * 4), *b = malloc(PT_N * 4), *sa = malloc(PT_N * 4), *sb = malloc(PT_N * 4);
    for (int k = 0; k < 2; k++) {
        double alpha = k ? 0.5 : 0.0;
        const char *key = k ? "pg" : "pd";
        parts_run(whole.endpoint, 0, a, alpha);
        parts_run(parted.endpoint, 3 * 256 * 4, b, alpha);
        ck_assert_msg(memcmp(a, b, PT_N * 4) == 0, "alpha %.1f: the worker's parameters differ", alpha);
        uint64_t va = observe(whole.endpoint, key, sa, PT_N), vb = observe(parted.endpoint, key, sb, PT_N);
        /* A GDDR worker's close flushes what it held: one version more. */
        ck_assert_uint_eq(va, PT_STEPS + (uint64_t)k);
        ck_assert_uint_eq(vb, PT_STEPS + (uint64_t)k);
        ck_assert_msg(memcmp(sa, sb, PT_N * 4) == 0, "alpha %.1f: the server's values differ", alpha);
        ck_assert_msg(memcmp(sa, a, PT_N * 4) != 0 || alpha == 0,
                      "a GDDR worker's view equals the server's exactly: nothing was held back?");
    }
    gddr_client *oa = open_observer(whole.endpoint), *ob = open_observer(parted.endpoint);
    double pa = gt_server_metric(oa, "gddr_push_parts_total"), pb = gt_server_metric(ob, "gddr_push_parts_total");
    double qa = gt_server_metric(oa, "gddr_pull_parts_total"), qb = gt_server_metric(ob, "gddr_pull_parts_total");
    ck_assert_msg(pa == 0 && qa == 0, "the whole server saw parts (%g, %g)", pa, qa);
    /* 274 chunks in parts of 3: 92 a push; 2 x 12 pushes. Every pull of the
     * worker (not the observers' larger parts) came in 92 parts too. */
    ck_assert_msg(pb == 92.0 * 2 * PT_STEPS, "push parts: %g", pb);
    ck_assert_msg(qb >= 92.0 * 2 * PT_STEPS, "pull parts: %g", qb);
    printf("integrity: %d dense and %d GDDR steps of %d values in parts of 3 chunks (%g push parts, "
           "%g pull parts): bit-identical to whole messages\n", PT_STEPS, PT_STEPS, PT_N, pb, qb);
    gddr_client_close(&oa);
    gddr_client_close(&ob);
    free(a), free(b), free(sa), free(sb);
    stop_server(&whole);
    stop_server(&parted);
}
END_TEST

/* Gradient accumulation (accumulate_steps = k): k calls of gddr_step are
 * one push of their mean, tagged with the version the first was computed
 * on; the calls before the k-th send nothing and leave the parameters. */
START_TEST(test_accumulate_steps)
{
    gt_server s;
    START_SERVER(s, "lr=1", "workers=2");
    enum { N = 8 };
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.timeout_ms = 30000;
    o.accumulate_steps = 4;
    gddr_client *a = open_opts(o, s.endpoint, 0, 2);
    gddr_client *b = open_worker(s.endpoint, 1, 2, 0);
    float w[N] = { 0 }, g[N], one[N];
    int ida, idb;
    ck_assert_int_eq(gddr_register(a, "acc", w, N, &ida, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(b, "acc", w, N, &idb, NULL), GDDR_OK);
    for (int i = 0; i < N; i++)
        one[i] = 0.5f;
    const float gs[4] = { 1, 2, 3, 6 }; /* mean 3, exact */
    const float *gp[1] = { g };
    float *wp[1] = { w };
    float seen[N];
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < N; i++)
            g[i] = gs[k], w[i] = 7.0f; /* a sentinel: the first three calls leave it */
        ck_assert_int_eq(gddr_step(a, gp, wp), GDDR_OK);
        if (k < 3) {
            for (int i = 0; i < N; i++)
                ck_assert_msg(w[i] == 7.0f, "call %d changed the parameters", k + 1);
            ck_assert_uint_eq(observe(s.endpoint, "acc", seen, N), k == 0 ? 0u : 2u);
            /* Meanwhile the other worker moves the tensor on (2 versions
             * after the first call): the accumulated push is that stale. */
            if (k == 0) {
                ck_assert_int_eq(gddr_push(b, idb, one, NULL), GDDR_OK);
                ck_assert_int_eq(gddr_push(b, idb, one, NULL), GDDR_OK);
            }
        }
    }
    /* -0.5 -0.5 (b) - 3 (a's mean) */
    for (int i = 0; i < N; i++)
        ck_assert_msg(w[i] == -4.0f, "after the 4th call w[%d] = %g, expected -4", i, (double)w[i]);
    ck_assert_uint_eq(observe(s.endpoint, "acc", seen, N), 3);
    gddr_server_stats st;
    ck_assert_int_eq(gddr_server_stats_get(a, &st), GDDR_OK);
    ck_assert_uint_eq(st.worker_pushes, 1);
    ck_assert_msg(st.worker_staleness_mean == 2.0, "the accumulated push's staleness: %g, expected 2",
                  st.worker_staleness_mean);
    gddr_client_counters kc;
    gddr_client_counters_get(a, &kc);
    ck_assert_uint_eq(kc.pushes, 1);
    gddr_client_close(&a);
    gddr_client_close(&b);

    /* With GDDR (alpha 0.5, k 2): mass is conserved. 12 calls of ones are 6
     * pushes of ones; with the flush at close the server has all of it. */
    gddr_client_opts og = GDDR_CLIENT_OPTS_INIT;
    og.timeout_ms = 30000;
    og.accumulate_steps = 2;
    og.delay_fraction = 0.5;
    enum { NG = 4096 };
    float *wg = calloc(NG, 4), *gg = malloc(NG * 4), *sv = malloc(NG * 4);
    for (int i = 0; i < NG; i++)
        gg[i] = 1.0f;
    gt_server s2;
    START_SERVER(s2, "lr=1", "chunk=64");
    gddr_client *c = open_opts(og, s2.endpoint, 0, 1);
    int id;
    ck_assert_int_eq(gddr_register(c, "accg", wg, NG, &id, NULL), GDDR_OK);
    const float *ggp[1] = { gg };
    float *wgp[1] = { wg };
    for (int k = 0; k < 12; k++)
        ck_assert_int_eq(gddr_step(c, ggp, wgp), GDDR_OK);
    gddr_client_close(&c);
    observe(s2.endpoint, "accg", sv, NG);
    for (int i = 0; i < NG; i++)
        ck_assert_msg(sv[i] == -6.0f, "GDDR + accumulation: w[%d] = %g, expected -6", i, (double)sv[i]);
    printf("integrity: accumulate_steps 4 = one push of the mean (staleness 2, as tagged at the first "
           "call); with GDDR 0.5 and k 2, 12 calls left -6 everywhere\n");
    free(wg), free(gg), free(sv);
    stop_server(&s);
    stop_server(&s2);
}
END_TEST

/* A worker's options for delta pulls of `bits` (30 s waits). */
static gddr_client_opts delta_opts(int bits)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.timeout_ms = 30000;
    o.pull_delta_bits = bits;
    return o;
}

/* The bound of a delta pull, per chunk of ch values: after a step from
 * prev, the worker's values w are within max|sv - prev| / (2 qmax) of the
 * server's sv (half a step s = max / qmax of rounding) and the float32
 * roundings of the quotient, the product and the sum. Returns how many
 * chunks were inexact; *worst (may be NULL) takes the largest error /
 * bound. */
static int delta_bound(const float *sv, const float *prev, const float *w, int nc, int ch, double qmax,
                       int step, double *worst)
{
    int inexact = 0;
    for (int c = 0; c < nc; c++) {
        double amax = 0;
        int off = 0;
        for (int i = c * ch; i < (c + 1) * ch; i++)
            amax = fmax(amax, fabs((double)sv[i] - prev[i]));
        for (int i = c * ch; i < (c + 1) * ch; i++) {
            double err = fabs((double)sv[i] - w[i]);
            double bound = amax / qmax / 2 + 4 * FLT_EPSILON * (amax + fabs((double)sv[i])) + 1e-37;
            ck_assert_msg(err <= bound, "step %d value %d: view off by %g, bound %g (max change %g)", step, i,
                          err, bound, amax);
            if (worst)
                *worst = fmax(*worst, err / bound);
            off |= err > 0;
        }
        inexact += off;
    }
    return inexact;
}

/* Pulls in reduced precision (pull_delta_bits): after every gddr_step the
 * worker's view is within max|server - previous view| / (2 * 127) of the
 * server's values per chunk (/ (2 * 32767) with 16 bits), the bytes pulled
 * are a quarter (a half) of dense plus a scale a chunk, the server keeps
 * 10 bytes a chunk + 4 a value + 1 a chunk for the view, and a whole pull
 * is exact. One worker, dense pushes of values that change every chunk. */
static void delta_pull_case(int bits)
{
    gt_server s;
    START_SERVER(s, "lr=0.37", "chunk=64", "momentum=0.5");
    enum { CH = 64, NC = 50, N = CH * NC, STEPS = 30 };
    gddr_client_opts o = delta_opts(bits);
    gddr_client *c = open_opts(o, s.endpoint, 0, 1);
    float *w = malloc(N * 4), *g = malloc(N * 4), *sv = malloc(N * 4), *prev = malloc(N * 4);
    for (int i = 0; i < N; i++)
        w[i] = (float)(i % 13) * 0.01f;
    int id;
    ck_assert_int_eq(gddr_register(c, "delta", w, N, &id, NULL), GDDR_OK);
    const float *gp[1] = { g };
    float *wp[1] = { w };
    const double qmax = bits == 8 ? 127.0 : 32767.0;
    double worst = 0; /* largest error / bound seen */
    int inexact = 0;
    for (int k = 0; k < STEPS; k++) {
        memcpy(prev, w, N * 4);
        for (int i = 0; i < N; i++) /* every chunk changes, by amounts that differ */
            g[i] = sinf((float)(i * 7 + k * 13)) * (1.0f + (float)(i % 5));
        ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
        observe(s.endpoint, "delta", sv, N);
        inexact += delta_bound(sv, prev, w, NC, CH, qmax, k, &worst);
    }
    ck_assert_msg(inexact > 0, "the view was always exact: were the pulls reduced at all?");
    gddr_client_counters kc;
    gddr_client_counters_get(c, &kc);
    /* The first pull is whole (the server does not know the view yet). */
    uint64_t per = (uint64_t)N * (uint64_t)(bits / 8) + NC * 4;
    ck_assert_msg(kc.bytes_pulled <= (uint64_t)N * 4 + (STEPS - 1) * per + STEPS * 256,
                  "pulled %" PRIu64 " bytes; %d-bit deltas are %" PRIu64 " a pull", kc.bytes_pulled, bits, per);
    ck_assert_msg(kc.bytes_pulled >= (uint64_t)(STEPS - 1) * per, "pulled only %" PRIu64 " bytes", kc.bytes_pulled);
    double view = gt_server_metric(c, "gddr_pull_view_bytes");
    ck_assert_msg(view == NC * 10.0 + N * 4.0 + NC, "the server keeps %g bytes for the view", view);
    /* A whole pull: the worker's values are the server's, bit for bit. */
    uint64_t v = 0;
    ck_assert_int_eq(gddr_pull(c, id, w, 0, &v), GDDR_OK);
    ck_assert_uint_eq(observe(s.endpoint, "delta", sv, N), v);
    ck_assert_msg(memcmp(w, sv, N * 4) == 0, "after a whole pull the view differs");
    /* The server's copy of the view did not see that pull: the next step's
     * pull is full (exact), and the ones after are deltas from it again. */
    for (int k = 0; k < 3; k++) {
        memcpy(prev, w, N * 4);
        ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
        observe(s.endpoint, "delta", sv, N);
        if (k == 0)
            ck_assert_msg(memcmp(w, sv, N * 4) == 0, "the pull after a whole pull is not exact");
        delta_bound(sv, prev, w, NC, CH, qmax, 100 + k, NULL); /* (steps after the whole pull: 100+) */
    }
    printf("integrity: %d-bit delta pulls: %d steps, %" PRIu64 " of %d dense bytes pulled, worst error %.2f of "
           "its bound, %d chunk-views inexact, server keeps %.0f bytes for the view\n",
           bits, STEPS, kc.bytes_pulled, STEPS * N * 4, worst, inexact, view);
    gddr_client_close(&c);
    free(w), free(g), free(sv), free(prev);
    stop_server(&s);
}

START_TEST(test_delta_pull_bound)
{
    delta_pull_case(8);
    delta_pull_case(16);
}
END_TEST

/* pull_delta_auto's schedule (client/src/pullpick.c) driven with made-up
 * costs per pull of each kind; the first `settle` pulls (1 when 0) after a
 * change of kind cost `after_switch` (a reduced pull after a whole one
 * carries every value; the server's buffer pool refills after the first
 * whole ones). */
typedef struct pick_costs {
    double reduced, whole, after_switch;
    int settle;
} pick_costs;

static int pick_drive(gddr__pullpick *p, int pulls, pick_costs k, int *prev)
{
    static int since; /* pulls since the last change of kind (one driver at a time) */
    int whole = 0;
    for (int i = 0; i < pulls; i++) {
        int w = gddr__pullpick_next_whole(p);
        since = *prev >= 0 && w != *prev ? 0 : since + 1;
        double cost = w ? k.whole : k.reduced;
        if (*prev >= 0 && since < (k.settle ? k.settle : 1))
            cost = k.after_switch;
        gddr__pullpick_done(p, w, cost);
        whole += w;
        *prev = w;
    }
    return whole;
}

START_TEST(test_pull_auto_schedule)
{
    gddr__pullpick p;
    int prev = -1;
    /* A fast link (loopback): whole pulls cheaper. A zeroed state is a new
     * one: 16 reduced pulls, a probe of 3 whole ones (the first not
     * counted, the next two the same: settled), then whole. */
    memset(&p, 0, sizeof p);
    pick_costs fast = { 124, 100, 1e6, 1 };
    ck_assert_int_eq(pick_drive(&p, 16, fast, &prev), 0);
    ck_assert_int_eq(pick_drive(&p, PICK_PROBE_MIN, fast, &prev), PICK_PROBE_MIN);
    ck_assert_msg(p.whole && p.flips == 1, "whole pulls were cheaper and not taken (flips %" PRIu64 ")",
                  p.flips);
    ck_assert(p.last_cost[1] == 100 && p.last_cost[0] == 124);
    /* It stays there; the reduced pulls it tries cost 3 per probe
     * (their first one, a full resync, is not counted against them), the
     * probes further and further apart. */
    int reduced = 3000 - pick_drive(&p, 3000, fast, &prev);
    ck_assert_msg(p.whole && p.flips == 1 && p.every == PICK_MAX, "whole %d flips %" PRIu64 " every %u",
                  p.whole, p.flips, p.every);
    ck_assert_msg(reduced == PICK_PROBE_MIN * (int)(p.probes - 1) && p.probes - 1 <= 8, "%d reduced pulls in %" PRIu64
                  " probes", reduced, p.probes - 1);
    /* The link becomes slow: within one interval it is back to reduced. */
    pick_costs slow = { 100, 400, 1e6, 1 };
    pick_drive(&p, PICK_MAX + PICK_PROBE_MAX + 1, slow, &prev);
    ck_assert_msg(!p.whole && p.flips == 2, "whole %d flips %" PRIu64, p.whole, p.flips);

    /* A slow link from the start: never whole but for the probes, which
     * add 3 whole pulls (plus a full one back) per probe. */
    gddr__pullpick_init(&p);
    prev = -1;
    int whole = pick_drive(&p, 1000, (pick_costs){ 25, 100, 100, 1 }, &prev);
    ck_assert_msg(!p.whole && p.flips == 0 && whole == PICK_PROBE_MIN * (int)p.probes && p.probes <= 6,
                  "whole %d flips %" PRIu64 ": %d whole pulls in %" PRIu64 " probes", p.whole, p.flips, whole,
                  p.probes);
    printf("integrity: pull_delta_auto on a slow link: %d whole pulls in 1000 (%" PRIu64 " probes)\n", whole,
           p.probes);

    /* What gddr-bench saw on loopback: the first two whole pulls after
     * reduced ones cost 5 ms, the next 0.6-0.8 against 0.9-1.0 reduced.
     * The first probe lasts until they stop falling and takes them. */
    gddr__pullpick_init(&p);
    prev = -1;
    pick_drive(&p, PICK_FIRST + PICK_PROBE_MAX, (pick_costs){ 950, 700, 4900, 2 }, &prev);
    ck_assert_msg(p.whole && p.flips == 1, "a two-pull transient hid the cheaper whole pulls (%.0f vs %.0f)",
                  p.last_cost[1], p.last_cost[0]);

    /* The first whole pulls of a process as gddr-bench traced them at 1
     * MiB: two at ~4.7 ms, then falling a few percent a pull to ~590 us,
     * against 765 for the reduced ones. The probe goes on while each pull
     * is a new low and takes them; stopping where the fall slowed under
     * 5 % (754 after 791) compared 754 with 765 and kept the reduced. */
    gddr__pullpick_init(&p);
    while (!p.probing)
        gddr__pullpick_done(&p, 0, 765.0);
    static const double first_whole[PICK_PROBE_MAX] = { 4649, 4818, 874, 791, 754, 640, 600, 590 };
    for (int i = 0; i < PICK_PROBE_MAX && p.probing; i++)
        gddr__pullpick_done(&p, 1, first_whole[i]);
    ck_assert_msg(!p.probing && p.whole && p.flips == 1 && p.last_cost[1] == 590,
                  "a slow fall ended the probe: whole %d, %.0f against %.0f", p.whole, p.last_cost[1],
                  p.last_cost[0]);
    /* Under noise a probe ends at its first pull that is no new low. */
    gddr__pullpick_init(&p);
    while (!p.probing)
        gddr__pullpick_done(&p, 0, 765.0);
    static const double noisy_whole[] = { 4000, 620, 580, 600 };
    for (int i = 0; i < 4; i++)
        gddr__pullpick_done(&p, 1, noisy_whole[i]);
    ck_assert_msg(!p.probing && p.whole && p.last_cost[1] == 580 && p.n[1] == 3,
                  "probe of %u counted pulls, least %.0f", p.n[1], p.last_cost[1]);

    /* Within the margin: no change; failed pulls (cost < 0) count for
     * nothing but move the schedule on. */
    gddr__pullpick_init(&p);
    prev = -1;
    pick_drive(&p, 500, (pick_costs){ 100, 97, 100, 1 }, &prev);
    ck_assert_msg(!p.whole && p.flips == 0, "a 3%% difference changed the kind");
    gddr__pullpick_init(&p);
    prev = -1;
    pick_drive(&p, 500, (pick_costs){ -1, -1, -1, 1 }, &prev);
    ck_assert_msg(!p.whole && p.flips == 0 && p.probes >= 4, "failed pulls: flips %" PRIu64 " probes %" PRIu64,
                  p.flips, p.probes);
    /* Costs that keep falling: the probe ends at PICK_PROBE_MAX pulls. */
    gddr__pullpick_init(&p);
    prev = -1;
    pick_drive(&p, PICK_FIRST, (pick_costs){ 100, 50, 100, 1 }, &prev);
    for (int i = 0; i < PICK_PROBE_MAX; i++) {
        ck_assert_msg(gddr__pullpick_next_whole(&p), "the probe ended after %d pulls while costs fell", i);
        gddr__pullpick_done(&p, 1, 1000.0 - 100 * i);
    }
    ck_assert_msg(!p.probing && !p.whole && p.last_cost[1] == 300,
                  "a probe of falling costs did not end at PICK_PROBE_MAX (whole %d, least %.0f)", p.whole,
                  p.last_cost[1]);
    /* delay_auto's rule (paired, confirm; pullpick.c). A probe runs both
     * kinds in turns of three from the kind in use: a change to whole (a
     * flush, for pushes) not counted, one whole counted, one reduced
     * counted; it compares them on its own steps alone, so a burst that
     * slowed (or sped) the steps before the probe counts for nothing; and
     * the other kind is taken only at its second probe won in a row. */
    gddr__pullpick_init(&p);
    p.paired = 1;
    p.confirm = 2;
    for (int round = 0; round < 2; round++) {
        while (!p.probing)
            gddr__pullpick_done(&p, p.whole, 1.0); /* the kind in use looks cheapest of all */
        int use = p.whole;
        char seq[PICK_PAIRED_STEPS + 1] = { 0 };
        for (int i = 0; p.probing; i++) {
            ck_assert_msg(i < PICK_PAIRED_STEPS, "a paired probe of more than %d steps", PICK_PAIRED_STEPS);
            int w = gddr__pullpick_next_whole(&p);
            seq[i] = (char)('0' + w);
            /* a whole step after a reduced one costs 1e6: not counted */
            double cost = w && i % 3 == (use ? 1 : 0) ? 1e6 : w ? 100.0 : 125.0;
            gddr__pullpick_done(&p, w, cost);
        }
        ck_assert_msg(strcmp(seq, use ? "011011011" : "110110110") == 0, "probe %d from %s: kinds %s", round,
                      use ? "whole" : "reduced", seq);
        /* (a change of kind clears the old kind's count) */
        ck_assert_msg(p.last_cost[0] == 125 && p.last_cost[1] == 100 && p.n[1] == 3 && p.n[0] == (round ? 0 : 3) &&
                          p.whole == round && p.wins == 1 - round,
                      "probe %d: whole %d wins %d, %.0f (%u) against %.0f (%u)", round, p.whole, p.wins,
                      p.last_cost[0], p.n[0], p.last_cost[1], p.n[1]);
    }
    /* From whole in use the turns start with the reduced kind, and the
     * reduced kind must win twice to come back. */
    while (!p.probing)
        gddr__pullpick_done(&p, 1, 100.0);
    for (int i = 0; p.probing; i++) {
        int w = gddr__pullpick_next_whole(&p);
        gddr__pullpick_done(&p, w, w ? (i % 3 == 1 ? 1e6 : 100.0) : 80.0);
    }
    ck_assert_msg(p.whole && p.wins == 1 && p.last_cost[0] == 80 && p.last_cost[1] == 100,
                  "back to reduced at one probe (whole %d wins %d, %.0f against %.0f)", p.whole, p.wins,
                  p.last_cost[0], p.last_cost[1]);
    /* One probe that a burst made look cheaper does not change the kind,
     * and a lost probe clears the count: a link where every other probe
     * found dense pushes cheaper keeps the holds. */
    gddr__pullpick_init(&p);
    p.paired = 1;
    p.confirm = 2;
    for (int k = 0; k < 8; k++) {
        while (!p.probing)
            gddr__pullpick_done(&p, 0, 100.0);
        double cost = k % 2 ? 400.0 : 60.0; /* every other probe's whole steps look cheaper */
        while (p.probing) {
            int w = gddr__pullpick_next_whole(&p);
            gddr__pullpick_done(&p, w, w ? cost : 100.0);
        }
        ck_assert_msg(!p.whole && p.flips == 0 && p.wins == (k % 2 ? 0 : 1), "probe %d: whole %d flips %" PRIu64
                      " wins %d", k, p.whole, p.flips, p.wins);
    }
    /* A pull of a kind the schedule did not ask for is not counted. */
    gddr__pullpick_init(&p);
    for (int i = 0; i < 100; i++)
        gddr__pullpick_done(&p, 1, 1.0); /* whole pulls, asked for only in probes */
    ck_assert(p.probes == 0 && p.n[1] == 0 && p.left == PICK_FIRST);
}
END_TEST

/* pull_delta_auto against a server: every step's pull is of the kind the
 * schedule asked for, a whole one leaves the worker's values equal to the
 * server's bit for bit, a reduced one within the 8-bit bound, and both
 * kinds ran (the probes see to that whatever the timings were). */
START_TEST(test_pull_auto_values)
{
    gt_server s;
    START_SERVER(s, "lr=0.37", "chunk=64", "mode=async");
    enum { CH = 64, NC = 40, N = CH * NC, STEPS = 60 };
    gddr_client_opts o = delta_opts(8);
    o.pull_delta_auto = 1;
    gddr_client *c = open_opts(o, s.endpoint, 0, 1);
    float *w = malloc(N * 4), *g = malloc(N * 4), *sv = malloc(N * 4), *prev = malloc(N * 4);
    for (int i = 0; i < N; i++)
        w[i] = (float)(i % 11) * 0.02f;
    int id;
    ck_assert_int_eq(gddr_register(c, "auto", w, N, &id, NULL), GDDR_OK);
    const float *gp[1] = { g };
    float *wp[1] = { w };
    int kinds[2] = { 0, 0 }, inexact = 0, last = -1;
    for (int k = 0; k < STEPS; k++) {
        int whole = gddr__pullpick_next_whole(&c->t[0].pick);
        int resync = last == 1 && !whole; /* a reduced pull after a whole one: full */
        memcpy(prev, w, N * 4);
        for (int i = 0; i < N; i++)
            g[i] = sinf((float)(i * 5 + k * 17)) * (1.0f + (float)(i % 3));
        ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
        observe(s.endpoint, "auto", sv, N);
        if (whole || resync || k == 0) {
            ck_assert_msg(memcmp(w, sv, N * 4) == 0, "step %d: a %s pull left the values off the server's", k,
                          whole ? "whole" : "full");
        } else {
            inexact += delta_bound(sv, prev, w, NC, CH, 127.0, k, NULL);
        }
        kinds[whole]++;
        last = whole;
    }
    ck_assert_msg(kinds[0] >= PICK_FIRST && kinds[1] >= PICK_PROBE_MIN && inexact > 0,
                  "%d reduced and %d whole pulls (%d inexact chunks)", kinds[0], kinds[1], inexact);
    ck_assert_msg(gt_server_metric(c, "gddr_delta_pulls_total") >= PICK_FIRST - 1, "the reduced pulls were not deltas");
    printf("integrity: pull_delta_auto, %d steps on loopback: %d reduced and %d whole pulls, %" PRIu64
           " probes, %" PRIu64 " changes of kind\n", STEPS, kinds[0], kinds[1], c->t[0].pick.probes,
           c->t[0].pick.flips);
    gddr_client_close(&c);
    free(w), free(g), free(sv), free(prev);
    stop_server(&s);
}
END_TEST

/* A late delta pull on an abandoned connection (here: another connection
 * of the worker's session, whose reply nobody reads) must not leave the
 * server's record of the view differing from the view: the next real pull
 * carries the view_seq of the last reply the worker applied, which is not
 * the record's latest, so it is answered in full. Before view_seq the
 * worker stayed off by the update it never received, for good. */
START_TEST(test_late_delta_pull_resyncs)
{
    enum { LN = 4096 };
    gt_server s;
    START_SERVER(s, "mode=async", "lr=0.1", "chunk=256", "workers=2");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.world_size = 2;
    o.timeout_ms = 30000;
    o.heartbeat_ms = 0;
    o.rank = 1;
    gddr_client *c1 = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c1), GDDR_OK);
    o.rank = 0;
    o.pull_delta_bits = 8;
    gddr_client *c0 = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c0), GDDR_OK);
    static float w[LN], g[LN], p[LN], exact[LN];
    int id0, id1;
    ck_assert_int_eq(gddr_register(c0, "v", w, LN, &id0, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(c1, "v", w, LN, &id1, NULL), GDDR_OK);
    const float *gp[1] = { g };
    float *pp[1] = { p };
    for (int i = 0; i < LN; i++)
        g[i] = 1.0f;
    for (int k = 0; k < 3; k++)
        ck_assert_int_eq(gddr_step(c0, gp, pp), GDDR_OK);
    /* Another worker moves the values; then a delta pull of worker 0's
     * session arrives on a connection whose reply nobody reads. */
    uint64_t v;
    ck_assert_int_eq(gddr_push(c1, id1, g, &v), GDDR_OK);
    raw_conn r;
    raw_open(&r, s.endpoint);
    r.session = c0->session;
    raw_hello(&r, 0, 2);
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Pull pl = GDDR__PULL__INIT;
    rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
    rq.req_id = ++r.next_id;
    rq.rank = 0;
    rq.session = r.session;
    pl.id = c0->t[id0].sid;
    pl.delta_bits = 8;
    pl.view_seq = c0->t[id0].view_seq; /* what worker 0 would send: it cannot tell */
    rq.body_case = GDDR__REQUEST__BODY_PULL;
    rq.pull = &pl;
    ck_assert(gddr__send(r.sock, NULL, &rq.base, NULL, 0) >= 0);
    Gddr__Reply *rep = raw_recv(&r, 30000, NULL);
    ck_assert_msg(rep && rep->body_case == GDDR__REPLY__BODY_PULL, "the late pull got no reply");
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    /* Quiet steps: worker 0's view must become the server's values. */
    for (int i = 0; i < LN; i++)
        g[i] = 0.0f;
    for (int k = 0; k < 20; k++)
        ck_assert_int_eq(gddr_step(c0, gp, pp), GDDR_OK);
    ck_assert_int_eq(gddr_pull(c1, id1, exact, 0, &v), GDDR_OK);
    float worst = 0;
    for (int i = 0; i < LN; i++)
        worst = fmaxf(worst, fabsf(p[i] - exact[i]));
    ck_assert_msg(worst == 0.0f, "worker 0's view is off the server's values by up to %g after 20 quiet steps",
                  (double)worst);
    ck_assert_msg(gt_server_metric(c1, "gddr_pull_view_resyncs_total") >= 1, "no resync counted");
    gddr_client_close(&c0);
    gddr_client_close(&c1);
    stop_server(&s);
}
END_TEST

/* max_pull_view_bytes: views beyond it are not made, and the pulls that
 * would need them are answered whole (exact, float32) instead of failing.
 * The cap fits worker 0's view of the tensor (13350 bytes) but not a second
 * one: worker 0's pulls are 8-bit deltas, worker 1's whole. */
START_TEST(test_pull_views_capped)
{
    gt_server s;
    START_SERVER(s, "lr=0.25", "chunk=64", "max_pull_view_bytes=20000");
    enum { CH = 64, NC = 50, N = CH * NC, STEPS = 6 };
    gddr_client_opts o = delta_opts(8);
    gddr_client *c[2] = { open_opts(o, s.endpoint, 0, 2), open_opts(o, s.endpoint, 1, 2) };
    float *w[2] = { malloc(N * 4), malloc(N * 4) }, *g = malloc(N * 4), *sv = malloc(N * 4);
    for (int i = 0; i < N; i++)
        w[0][i] = w[1][i] = (float)(i % 11) * 0.1f;
    int id;
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(gddr_register(c[r], "capped", w[r], N, &id, NULL), GDDR_OK);
    uint64_t pulled[2][STEPS + 1] = { { 0 } };
    int exact1 = 0;
    for (int k = 0; k < STEPS; k++) {
        for (int r = 0; r < 2; r++) {
            for (int i = 0; i < N; i++)
                g[i] = sinf((float)(i * 3 + k * 17 + r));
            const float *gp[1] = { g };
            float *wp[1] = { w[r] };
            ck_assert_int_eq(gddr_step(c[r], gp, wp), GDDR_OK);
            observe(s.endpoint, "capped", sv, N);
            if (r == 1) {
                ck_assert_msg(memcmp(w[1], sv, N * 4) == 0, "step %d: worker 1's whole pull is not exact", k);
                exact1++;
            }
            gddr_client_counters kc;
            gddr_client_counters_get(c[r], &kc);
            pulled[r][k + 1] = kc.bytes_pulled;
        }
    }
    for (int k = 1; k < STEPS; k++) {
        uint64_t d0 = pulled[0][k + 1] - pulled[0][k], d1 = pulled[1][k + 1] - pulled[1][k];
        ck_assert_msg(d0 <= (uint64_t)N + NC * 4 + 256, "step %d: worker 0 pulled %" PRIu64 " bytes, not deltas", k, d0);
        ck_assert_msg(d1 >= (uint64_t)N * 4, "step %d: worker 1 pulled %" PRIu64 " bytes, less than whole", k, d1);
    }
    double view = gt_server_metric(c[0], "gddr_pull_view_bytes");
    double refused = gt_server_metric(c[0], "gddr_pull_views_refused_total");
    ck_assert_msg(view == NC * 10.0 + N * 4.0 + NC, "the server keeps %g bytes for views", view);
    ck_assert_msg(refused >= STEPS, "%g pulls refused a view in %d steps", refused, STEPS);
    printf("integrity: max_pull_view_bytes 20000: worker 0 delta pulls, worker 1 %d whole pulls (exact), "
           "views %.0f bytes, %.0f refused\n", exact1, view, refused);
    for (int r = 0; r < 2; r++) {
        gddr_client_close(&c[r]);
        free(w[r]);
    }
    free(g), free(sv);
    stop_server(&s);
}
END_TEST

/* The server counts the chunks GDDR pushes carry and hold back, and in sync
 * mode with momentum and fill_held off says once, in its log, when a
 * quarter or more are held (measured to cost accuracy, docs/network.md);
 * holding a tenth, or with fill on (the default), it is silent. One
 * worker, 32 chunks, 40 steps: 1280 chunk-pushes. */
static void held_case(double alpha, int fill, int expect_warning)
{
    char dir[64], log[160];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "mode=sync", "workers=1", "momentum=0.9", "lr=0.01", "chunk=16",
                           "tau_dynamic=false", "tau_init=4",
                           fill ? "fill_held=true" : "fill_held=false", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    enum { N = 512, NC = 32, STEPS = 40 };
    gddr_client *c = open_worker(s.endpoint, 0, 1, alpha);
    float w[N], g[N];
    for (int i = 0; i < N; i++)
        w[i] = 0.0f, g[i] = 0.01f * (float)(i % 7);
    int id;
    ck_assert_int_eq(gddr_register(c, "held", w, N, &id, NULL), GDDR_OK);
    const float *gp[1] = { g };
    float *wp[1] = { w };
    for (int k = 0; k < STEPS; k++)
        ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
    double sent = gt_server_metric(c, "gddr_push_chunks_total{outcome=\"sent\"}");
    double held = gt_server_metric(c, "gddr_push_chunks_total{outcome=\"held\"}");
    ck_assert_msg(sent + held == (double)NC * STEPS, "%g sent + %g held chunks for %d pushes of %d", sent, held,
                  STEPS, NC);
    /* The worker's own count of what it held agrees with the server's. */
    gddr_client_counters kc;
    gddr_client_counters_get(c, &kc);
    ck_assert_msg((double)kc.values_pushed == sent * (N / NC), "the worker sent %" PRIu64 " values, the server "
                  "counts %g chunks of %d", kc.values_pushed, sent, N / NC);
    double frac = held / (sent + held);
    ck_assert_msg(alpha > 0.3 ? frac > 0.25 && frac < alpha + 0.08 : frac < 0.16,
                  "alpha %.1f: %.3f of the chunks held", alpha, frac);
    gddr_client_close(&c);
    stop_server(&s);
    char *text = gt_slurp_text(log);
    const char *hit = strstr(text, "the workers' GDDR residuals hold");
    ck_assert_msg(expect_warning ? hit && !strstr(hit + 1, "the workers' GDDR residuals hold") : !hit,
                  "alpha %.1f: warning %s expected; log:\n%s", alpha, expect_warning ? "once" : "not", text);
    printf("integrity: sync, momentum 0.9, alpha %.1f: %.0f chunks sent, %.0f held (%.2f), warning %s\n", alpha,
           sent, held, frac, hit ? "given" : "not given");
    free(text);
    gt_rm_rf(dir);
}

START_TEST(test_held_chunks_counted)
{
    held_case(0.4, 0, 1);
    held_case(0.1, 0, 0);
    held_case(0.4, 1, 0);
}
END_TEST

/* GDDR on pulls (pull_delay_fraction): the worker's view of every chunk
 * is at most tau pulls stale, the staleness its pushes report counts the
 * oldest chunk of its view, a whole pull makes the view exact, and the
 * server keeps 10 bytes a chunk for the view. One worker, dense pushes (so
 * every chunk changes every step), tau fixed at 3. */
START_TEST(test_lazy_pull_bound)
{
    gt_server s;
    START_SERVER(s, "lr=0.5", "chunk=64", "tau_init=3", "tau_dynamic=false");
    enum { CH = 64, NC = 50, N = CH * NC, STEPS = 40, TAU = 3 };
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.timeout_ms = 30000;
    o.pull_delay_fraction = 0.5;
    gddr_client *c = open_opts(o, s.endpoint, 0, 1);
    float *w = malloc(N * 4), *g = malloc(N * 4), *sv = malloc(N * 4);
    for (int i = 0; i < N; i++)
        w[i] = (float)(i % 13);
    int id;
    ck_assert_int_eq(gddr_register(c, "lazy", w, N, &id, NULL), GDDR_OK);
    int stale_run[NC] = { 0 }, worst = 0, held = 0;
    const float *gp[1] = { g };
    float *wp[1] = { w };
    for (int k = 0; k < STEPS; k++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)((i + k) % 7) - 3.0f; /* every chunk changes */
        ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
        observe(s.endpoint, "lazy", sv, N);
        for (int ch = 0; ch < NC; ch++) {
            if (memcmp(w + ch * CH, sv + ch * CH, CH * 4) == 0) {
                stale_run[ch] = 0;
            } else {
                held++;
                if (++stale_run[ch] > worst)
                    worst = stale_run[ch];
            }
        }
    }
    ck_assert_msg(worst <= TAU, "a chunk stayed stale %d pulls in a row (tau %d)", worst, TAU);
    ck_assert_msg(held > NC, "only %d chunk-pulls were held back: nothing was saved", held);
    gddr_server_stats st;
    ck_assert_int_eq(gddr_server_stats_get(c, &st), GDDR_OK);
    ck_assert_msg(st.staleness_max >= 1 && st.staleness_max <= TAU,
                  "staleness reported %" PRIu64 ": a held chunk must count, at most tau", st.staleness_max);
    gddr_client_counters k;
    gddr_client_counters_get(c, &k);
    ck_assert_msg(k.bytes_pulled < (uint64_t)STEPS * N * 4 * 3 / 4, "pulled %" PRIu64 " bytes", k.bytes_pulled);
    double view = gt_server_metric(c, "gddr_pull_view_bytes");
    ck_assert_msg(view == NC * 10.0, "the server keeps %g bytes for the view", view);
    /* A whole pull: the view is the server's, bit for bit. */
    uint64_t v = 0;
    ck_assert_int_eq(gddr_pull(c, id, w, 0, &v), GDDR_OK);
    ck_assert_uint_eq(observe(s.endpoint, "lazy", sv, N), v);
    ck_assert_msg(memcmp(w, sv, N * 4) == 0, "after a whole pull the view differs");
    printf("integrity: lazy pulls (alpha 0.5, tau %d): %d chunk-pulls held, longest %d in a row, "
           "staleness max %" PRIu64 ", %" PRIu64 " of %d dense bytes pulled\n",
           TAU, held, worst, st.staleness_max, k.bytes_pulled, STEPS * N * 4);
    gddr_client_close(&c);
    free(w), free(g), free(sv);
    stop_server(&s);
}
END_TEST

/* Parked pulls are capped per connection. */
START_TEST(test_parked_pulls_capped)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "max_parked_pulls=50");
    gddr_client *c = open_worker(s.endpoint, 0, 2, 0);
    float w0[2] = { 0, 0 };
    int id;
    ck_assert_int_eq(gddr_register(c, "p", w0, 2, &id, NULL), GDDR_OK);
    raw_conn r;
    raw_open(&r, s.endpoint);
    enum { PULLS = 60 };
    uint64_t first = 0;
    for (int k = 0; k < PULLS; k++) {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Pull p = GDDR__PULL__INIT;
        p.id = (uint32_t)id;
        p.min_version = 1; /* waits for a step that does not come */
        p.wait_ms = 600000;
        rq.body_case = GDDR__REQUEST__BODY_PULL;
        rq.pull = &p;
        uint64_t rid = raw_simple(&r, &rq);
        if (!first)
            first = rid;
    }
    /* The ten over the cap are refused at once; the fifty wait. */
    for (uint64_t rid = first + 50; rid < first + PULLS; rid++)
        expect_error(&r, rid, GDDR_EBUSY, "a pull over max_parked_pulls");
    raw_close(&r);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* One push claiming a grad_norm of 3e38 moves dynamic tau once; it does not
 * hold it at tau_min for hundreds of pushes. */
START_TEST(test_bogus_grad_norm_tau_recovers)
{
    gt_server s;
    START_SERVER(s, "tau_dynamic=true", "tau_init=4", "tau_min=2", "tau_max=8", "tau_patience=5",
                 "lr=0");
    gddr_client *c = open_worker(s.endpoint, 0, 2, 0);
    float w0[4] = { 0 }, g[4] = { 1, 1, 1, 1 };
    int id;
    ck_assert_int_eq(gddr_register(c, "t", w0, 4, &id, NULL), GDDR_OK);
    raw_conn r;
    raw_open(&r, s.endpoint);
    raw_hello(&r, 1, 2);
    uint64_t step = 0;
#define NPUSH(norm)                                                                              \
    do {                                                                                         \
        Gddr__Reply *rep_ = raw_reply_to(&r, raw_push_step(&r, (uint32_t)id, g, 4, 0, step++, (norm)), NULL); \
        ck_assert_int_eq(rep_->body_case, GDDR__REPLY__BODY_PUSH);                               \
        gddr__reply__free_unpacked(rep_, NULL);                                                  \
    } while (0)
    for (int k = 0; k < 40; k++)
        NPUSH(2.0f);
    int calm = get_stats(c).tau;
    ck_assert_int_eq(calm, 8); /* calm pushes grew it to tau_max */
    NPUSH(3e38f);
    int hit = get_stats(c).tau;
    ck_assert_msg(hit < calm, "the spike did not shorten tau (%d)", hit);
    for (int k = 0; k < 100; k++)
        NPUSH(2.0f);
#undef NPUSH
    int back = get_stats(c).tau;
    ck_assert_msg(back >= 6, "100 calm pushes after one bogus grad_norm left tau at %d", back);
    raw_close(&r);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- 5. start-up, shutdown, damaged state ------------------------------------------ */

/* A free loopback port: bound, read back, released. */
static void free_endpoint(char *ep, size_t len)
{
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_bind(sock, "tcp://127.0.0.1:*"), 0);
    ck_assert_int_eq(zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    zmq_close(sock);
    zmq_ctx_term(ctx);
}

typedef struct late_call {
    const char *ep;
    gddr_client *c;
    int rc, id, phase;
    uint64_t version;
} late_call;

/* phase 0: open, register, pull. phase 1: pull and push on an open client. */
static void *late_main(void *arg)
{
    late_call *a = arg;
    float w[3] = { 1, 2, 3 }, g[3] = { 1, 1, 1 };
    if (a->phase == 0) {
        gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
        o.server = a->ep;
        o.rank = 0;
        o.world_size = 1;
        o.timeout_ms = 1000;
        o.reconnect_timeout_ms = 120000;
        a->rc = gddr_client_open(&o, &a->c);
        if (a->rc == GDDR_OK)
            a->rc = gddr_register(a->c, "late", w, 3, &a->id, NULL);
    }
    if (a->rc == GDDR_OK)
        a->rc = gddr_pull(a->c, a->id, w, 0, &a->version);
    if (a->rc == GDDR_OK && a->phase == 1)
        a->rc = gddr_push(a->c, a->id, g, &a->version);
    return NULL;
}

/* A worker started before its server waits for it (reconnect_timeout_ms),
 * and so do register, pull and push outside a step when the server
 * restarts between them. */
START_TEST(test_server_starts_late)
{
    char ep[256], listen[300];
    free_endpoint(ep, sizeof ep);
    snprintf(listen, sizeof listen, "listen=%s", ep);
    late_call a = { ep, NULL, 0, -1, 0, 0 };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, late_main, &a), 0);
    gt_sleep_ms(2500); /* the first hellos time out (timeout_ms 1000) */
    gt_server s;
    START_SERVER(s, listen, "lr=1");
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == GDDR_OK, "a worker started 2.5 s before its server: %s (%s)",
                  gddr_strerror(a.rc), a.c ? gddr_client_errmsg(a.c) : "");
    ck_assert_uint_eq(a.version, 0);
    /* The server dies and comes back empty 2.5 s later: a pull and a push
     * outside any step ride it out (re-registering the tensor). */
    kill(s.pid, SIGKILL);
    ck_assert_int_eq(gt_wait_pid(s.pid, WAIT_MS, NULL), 1);
    s.pid = 0;
    a.phase = 1;
    ck_assert_int_eq(pthread_create(&th, NULL, late_main, &a), 0);
    gt_sleep_ms(2500);
    START_SERVER(s, listen, "lr=1");
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == GDDR_OK, "pull and push across a server restart: %s (%s)", gddr_strerror(a.rc),
                  gddr_client_errmsg(a.c));
    ck_assert_uint_eq(a.version, 1);
    float w[3];
    ck_assert_uint_eq(observe(ep, "late", w, 3), 1);
    ck_assert(w[0] == 0.0f && w[1] == 1.0f && w[2] == 2.0f);
    gddr_client_close(&a.c);
    stop_server(&s);
}
END_TEST

/* Starts gddr-ps with SIGTERM (or sig) already pending: the daemon holds it
 * through start-up, then says so and exits non-zero. */
START_TEST(test_sigterm_during_startup)
{
    char dir[64], log[128], bin[512];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    gt_bin_path(bin, sizeof bin, "gddr-ps");
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        sigset_t term;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        sigprocmask(SIG_BLOCK, &term, NULL);
        signal(SIGTERM, SIG_DFL);
        raise(SIGTERM); /* pending across exec, until the daemon lets it in */
        execl(bin, bin, "--listen", "tcp://127.0.0.1:*", NULL);
        _exit(127);
    }
    int st = 0;
    ck_assert_int_eq(gt_wait_pid(pid, WAIT_MS, &st), 1);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1,
                  "a SIGTERM during start-up ended gddr-ps with %s %d, expected exit status 1",
                  WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    ck_assert_msg(gt_file_has(log, "SIGTERM arrived while starting"), "no log line for it");
    gt_rm_rf(dir);
}
END_TEST

/* Checkpoints that are all unreadable: the daemon refuses to start empty
 * unless told to; told to, it moves them aside and never deletes them. */
START_TEST(test_damaged_checkpoints_refuse_start)
{
    char dir[64], ck[96], set[128], log[128], f1[160], f2[160];
    scratch_ckpt(dir, sizeof dir, ck, sizeof ck, set, sizeof set);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    ck_assert_int_eq(mkdir(ck, 0755), 0);
    snprintf(f1, sizeof f1, "%s/ckpt-%020d.gddr", ck, 1);
    snprintf(f2, sizeof f2, "%s/ckpt-%020d.gddr", ck, 2);
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(k ? f2 : f1, "w");
        ck_assert_ptr_nonnull(f);
        fputs("this is not a checkpoint, but an operator may want it", f);
        fclose(f);
    }
    char bin[512], *out = NULL, err[256];
    gt_bin_path(bin, sizeof bin, "gddr-ps");
    char *argv[] = { bin, "--listen", "tcp://127.0.0.1:*", "--set", set, NULL };
    int st = 0;
    ck_assert_int_eq(gt_run_capture(argv, WAIT_MS, 1, &out, &st, err, sizeof err), 0);
    free(out);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "gddr-ps started on unreadable checkpoints");
    ck_assert_msg(access(f1, F_OK) == 0 && access(f2, F_OK) == 0, "a refused start touched the files");
    /* Told to start empty. */
    const char *sets[] = { set, "checkpoint_allow_empty=true", "checkpoint_keep=1",
                           "checkpoint_interval_s=0", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    ck_assert_msg(gt_file_has(log, "moved aside"), "no line saying where the files went");
    gddr_client *c = open_worker(s.endpoint, 0, 1, 0);
    float w0[2] = { 1, 2 };
    int id;
    ck_assert_int_eq(gddr_register(c, "t", w0, 2, &id, NULL), GDDR_OK);
    for (int k = 0; k < 3; k++) { /* retention keeps 1: older ones go */
        ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
        gt_sleep_ms(1100);
    }
    gddr_client_close(&c);
    stop_server(&s);
    char a1[200], a2[200];
    snprintf(a1, sizeof a1, "%s.damaged", f1);
    snprintf(a2, sizeof a2, "%s.damaged", f2);
    ck_assert_msg(access(a1, F_OK) == 0 && access(a2, F_OK) == 0,
                  "a damaged checkpoint was deleted (retention or start-up)");
    gt_rm_rf(dir);
}
END_TEST

/* A sync step whose peer is alive (it heartbeats) but never pushes ends
 * with GDDR_ETIMEDOUT after reconnect_timeout_ms instead of re-pulling
 * forever. */
START_TEST(test_sync_step_wait_bounded)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "worker_timeout_s=3600");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.timeout_ms = 500;
    o.reconnect_timeout_ms = 2000;
    gddr_client *a = open_opts(o, s.endpoint, 0, 2), *b = open_opts(o, s.endpoint, 1, 2);
    float w = 0, g = 1;
    int id;
    ck_assert_int_eq(gddr_register(a, "x", &w, 1, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(b, "x", &w, 1, &id, NULL), GDDR_OK);
    const float *gp[1] = { &g };
    float *wp[1] = { &w };
    int rc = gddr_step(a, gp, wp);
    ck_assert_msg(rc == GDDR_ETIMEDOUT, "a step whose peer never pushes: %s", gddr_strerror(rc));
    ck_assert_msg(strstr(gddr_client_errmsg(a), "did not come within"), "%s", gddr_client_errmsg(a));
    gddr_client_close(&a);
    gddr_client_close(&b);
    stop_server(&s);
}
END_TEST

/* ---- 6. logs ---------------------------------------------------------------------- */

/* A client string with a newline cannot forge a log line; tools (observers)
 * do not log like workers joining. */
START_TEST(test_log_lines_not_forgeable)
{
    char dir[64], log[128];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    gt_server s;
    gt_start_logged(&s, log, NULL);
    raw_conn r;
    raw_open(&r, s.endpoint);
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__Hello h = GDDR__HELLO__INIT;
    h.world_size = 1;
    h.client = "x\n02:00:00.000 gddr-ps[error] FORGED";
    rq.body_case = GDDR__REQUEST__BODY_HELLO;
    rq.hello = &h;
    Gddr__Reply *rep = raw_reply_to(&r, raw_simple(&r, &rq), NULL);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_HELLO);
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    ck_assert(gt_wait_for_text(log, "worker 0 joined", WAIT_MS) >= 0);
    char bin[512], *out = NULL, err[256];
    gt_bin_path(bin, sizeof bin, "gddr-ctl");
    char *argv[] = { bin, "-s", s.endpoint, "status", NULL };
    int st = 0;
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(gt_run_capture(argv, WAIT_MS, 1, &out, &st, err, sizeof err), 0);
        free(out);
    }
    stop_server(&s);
    char *text = gt_slurp_text(log);
    ck_assert_msg(!strstr(text, "\n02:00:00.000 gddr-ps[error] FORGED"), "a forged line:\n%s", text);
    ck_assert_msg(strstr(text, "\\x0a02:00:00.000"), "the newline was not escaped:\n%s", text);
    ck_assert_msg(count_lines_with(text, "hello") == 0 && count_lines_with(text, "joined") == 1,
                  "tools log like workers:\n%s", text);
    free(text);
    gt_rm_rf(dir);
}
END_TEST

/* A GDDR worker that dies without residual snapshots: the server says what
 * it held and that all of it is lost (no "fully re-injected" story). */
START_TEST(test_lost_residual_reported)
{
    char dir[64], log[128];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "worker_timeout_s=1", "chunk=4", "tau_dynamic=false", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c = open_worker(s.endpoint, 0, 1, 0.5);
    enum { N = 40 };
    float w[N] = { 0 }, g[N];
    for (int i = 0; i < N; i++)
        g[i] = (float)(i % 5) - 2.0f;
    int id;
    ck_assert_int_eq(gddr_register(c, "l", w, N, &id, NULL), GDDR_OK);
    const float *gp[1] = { g };
    float *wp[1] = { w };
    float r[N];
    double held = 0;
    for (int k = 0; k < 6 && held == 0; k++) {
        ck_assert_int_eq(gddr_step(c, gp, wp), GDDR_OK);
        ck_assert_int_eq(gddr__residual_get(c, 0, r), GDDR_OK);
        held = 0;
        for (int i = 0; i < N; i++)
            held += fabs((double)r[i]);
    }
    ck_assert_msg(held > 0, "the worker holds nothing: change the gradient");
    gddr__heartbeat_stop(c); /* it falls silent */
    ck_assert(gt_wait_for_text(log, "declared dead", WAIT_MS) >= 0);
    gddr_client *obs = open_observer(s.endpoint);
    double m_held = gt_server_metric(obs, "gddr_dead_residual_l1_total");
    double m_handed = gt_server_metric(obs, "gddr_dead_residual_handed_l1_total");
    double m_lost = gt_server_metric(obs, "gddr_dead_residual_lost_l1_total");
    gddr_client_close(&obs);
    ck_assert_msg(fabs(m_held - held) <= 1e-5 * held, "held %g, the worker held %g", m_held, held);
    ck_assert_double_eq(m_handed, 0);
    ck_assert_msg(fabs(m_lost - held) <= 1e-5 * held, "lost %g, expected all %g", m_lost, held);
    ck_assert_msg(gt_file_has(log, "sent no snapshot"), "the log does not say the residual is lost");
    c->info.epoch = 0; /* vanish: no flush, no bye */
    gddr_client_close(&c);
    stop_server(&s);
    gt_rm_rf(dir);
}
END_TEST

/* A wall clock that stepped: while realtime_shift_s is set, CLOCK_REALTIME
 * reads that many seconds off in this process (every suite of gddr-tests
 * shares the definition; only the test below sets the shift, in its own
 * forked process). Other clocks are untouched. */
static volatile long realtime_shift_s;

int clock_gettime(clockid_t id, struct timespec *ts)
{
    long r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && id == CLOCK_REALTIME && realtime_shift_s)
        ts->tv_sec += realtime_shift_s;
    return (int)r;
}

/* The heartbeat thread waits on the monotonic clock: when the wall clock
 * jumps (an NTP step), an idle worker still says it is alive and is not
 * declared dead. (Waiting until a CLOCK_REALTIME deadline computed before
 * the clock went back stalled heartbeats for the size of the step.) */
START_TEST(test_heartbeat_survives_clock_step)
{
    gt_server s;
    START_SERVER(s, "worker_timeout_s=1");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.heartbeat_ms = 100;
    o.timeout_ms = 30000;
    gddr_client *c = open_opts(o, s.endpoint, 0, 1);
    gddr_client *obs = open_observer(s.endpoint);
    ck_assert_int_eq(get_stats(obs).live_workers, 1);
    realtime_shift_s = 3600; /* the heartbeat's next deadline is an hour away in real time */
    gt_sleep_ms(3000);       /* idle: only heartbeats keep it alive (worker_timeout_s 1) */
    gddr_server_stats st = get_stats(obs);
    double deaths = gt_server_metric(obs, "gddr_worker_deaths_total");
    realtime_shift_s = 0;
    ck_assert_msg(st.live_workers == 1 && deaths == 0,
                  "an idle worker was declared dead after the wall clock moved (live %d, deaths %g)",
                  st.live_workers, deaths);
    gddr_client_close(&obs);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* ---- the proto file and gddr.h agree on the error codes ------------------------- */

/* "GDDR_EINVAL" and proto's "E_INVAL" (and "GDDR_OK", "E_OK") name one code. */
static int same_code_name(const char *gddr, const char *proto)
{
    const char *a = gddr + strlen("GDDR_"), *b = proto + strlen("E_");
    if (strcmp(a, "OK") != 0)
        a++; /* the E of EINVAL */
    return strncmp(proto, "E_", 2) == 0 && strcmp(a, b) == 0;
}

START_TEST(test_error_codes_match_proto)
{
    int n = 0;
#define GDDR__CHECK_CODE(nm, num, text)                                                         \
    do {                                                                                        \
        const ProtobufCEnumValue *v =                                                           \
            protobuf_c_enum_descriptor_get_value(&gddr__error_code__descriptor, num);           \
        ck_assert_msg(v != NULL, "%s (%d) is not in proto ErrorCode", #nm, num);                \
        ck_assert_msg(same_code_name(#nm, v->name), "proto ErrorCode %d is %s, gddr.h says %s", \
                      num, v->name, #nm);                                                       \
        n++;                                                                                    \
    } while (0);
    GDDR_ERRORS(GDDR__CHECK_CODE)
#undef GDDR__CHECK_CODE
    ck_assert_int_eq((int)gddr__error_code__descriptor.n_values, n);
}
END_TEST

Suite *suite_integrity(void)
{
    Suite *s = suite_create("integrity");
#define ADD(name, fn) GT_ADD_CASE(s, name, fn, TCASE_TIMEOUT)
    ADD("error_codes_match_proto", test_error_codes_match_proto);
    ADD("exactly_once_server_pause_async", test_exactly_once_server_pause_async);
    ADD("exactly_once_server_pause_sync", test_exactly_once_server_pause_sync);
    ADD("exactly_once_worker_pause", test_exactly_once_worker_pause);
    ADD("duplicate_gets_first_answer", test_duplicate_gets_first_answer);
    ADD("exactly_once_across_restart", test_exactly_once_across_restart);
    ADD("sync_restore_steps_line_up", test_sync_restore_steps_line_up);
    ADD("sync_restore_new_sessions", test_sync_restore_new_sessions);
    ADD("checkpoint_forgets_departed", test_checkpoint_forgets_departed);
    ADD("sync_flush_weight", test_sync_flush_weight);
    ADD("sync_flush_during_open_step", test_sync_flush_during_open_step);
    ADD("membership_cannot_be_forged", test_membership_cannot_be_forged);
    ADD("strangers_leave_no_trace", test_strangers_leave_no_trace);
    ADD("registration_can_be_closed", test_registration_can_be_closed);
    ADD("checkpoint_requests_coalesce", test_checkpoint_requests_coalesce);
    ADD("snapshots_bounded", test_snapshots_bounded);
    ADD("unread_replies_bounded", test_unread_replies_bounded);
    ADD("slow_reader_sees_its_version", test_slow_reader_sees_its_version);
    ADD("parked_pulls_capped", test_parked_pulls_capped);
    ADD("overlapped_applies_exact", test_overlapped_applies_exact);
    ADD("parts_bit_exact", test_parts_bit_exact);
    ADD("accumulate_steps", test_accumulate_steps);
    ADD("lazy_pull_bound", test_lazy_pull_bound);
    ADD("delta_pull_bound", test_delta_pull_bound);
    ADD("late_delta_pull_resyncs", test_late_delta_pull_resyncs);
    ADD("pull_auto_schedule", test_pull_auto_schedule);
    ADD("pull_auto_values", test_pull_auto_values);
    ADD("pull_views_capped", test_pull_views_capped);
    ADD("held_chunks_counted", test_held_chunks_counted);
    ADD("bogus_grad_norm_tau_recovers", test_bogus_grad_norm_tau_recovers);
    ADD("server_starts_late", test_server_starts_late);
    ADD("sigterm_during_startup", test_sigterm_during_startup);
    ADD("damaged_checkpoints_refuse_start", test_damaged_checkpoints_refuse_start);
    ADD("sync_step_wait_bounded", test_sync_step_wait_bounded);
    ADD("log_lines_not_forgeable", test_log_lines_not_forgeable);
    ADD("lost_residual_reported", test_lost_residual_reported);
    ADD("heartbeat_survives_clock_step", test_heartbeat_survives_clock_step);
#undef ADD
    return s;
}
