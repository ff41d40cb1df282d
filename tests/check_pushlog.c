/* check_pushlog.c -- the push log ([durability] push_log, server/pushlog.c):
 * what a kill -9 keeps.
 *
 * always: every acknowledged push survives a kill -9 with no checkpoint at
 * all, values and versions exact, and a resend of the last push after the
 * restart is answered as a duplicate (the exactly-once records replay
 * too); a torn tail is cut and counted and the rest replays; a checkpoint
 * starts a new segment, the restart replays only what came after it, and
 * the segments no kept checkpoint needs are deleted. batch: what is on disk
 * (no unsynced record left) survives. sync mode replays, with the steps
 * completed and the deaths declared on a clock as they were.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gddr/gddr.h"
#include "files.h"
#include "harness.h"
#include "suites.h"
#include "wirekit.h"

#define WAIT_MS 30000
#define BIG 70000 /* floats: above the apply pool's inline size */

typedef struct plrun {
    char dir[64], log[128], ckpt[160];
    char sets[8][300];
    const char *setv[9];
    gt_server s;
} plrun;

static void pl_start(plrun *p, const char *mode, const char *extra)
{
    int n = 0;
    snprintf(p->sets[n++], sizeof p->sets[0], "checkpoint_dir=%s", p->ckpt);
    snprintf(p->sets[n++], sizeof p->sets[0], "push_log=%s", mode);
    snprintf(p->sets[n++], sizeof p->sets[0], "checkpoint_interval_s=0");
    snprintf(p->sets[n++], sizeof p->sets[0], "mode=async");
    if (p->s.endpoint[0])
        snprintf(p->sets[n++], sizeof p->sets[0], "listen=%s", p->s.endpoint);
    if (extra)
        snprintf(p->sets[n++], sizeof p->sets[0], "%s", extra);
    for (int i = 0; i < n; i++)
        p->setv[i] = p->sets[i];
    p->setv[n] = NULL;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", p->s.endpoint);
    gt_start_logged(&p->s, p->log, p->setv);
    if (ep[0])
        ck_assert_str_eq(p->s.endpoint, ep);
}

static void pl_init(plrun *p, const char *mode, const char *extra)
{
    memset(p, 0, sizeof *p);
    gt_scratch_log(p->dir, sizeof p->dir, p->log, sizeof p->log);
    snprintf(p->ckpt, sizeof p->ckpt, "%s/ckpt", p->dir);
    ck_assert_int_eq(mkdir(p->ckpt, 0700), 0);
    pl_start(p, mode, extra);
}

/* The server stopped, its directory removed. */
static void pl_end(plrun *p)
{
    gt_server_stop(&p->s, WAIT_MS, NULL);
    gt_rm_rf(p->dir);
}

static void pl_kill9(plrun *p)
{
    ck_assert_int_gt(p->s.pid, 0);
    kill(p->s.pid, SIGKILL);
    int st = 0;
    ck_assert_int_eq(gt_wait_pid(p->s.pid, WAIT_MS, &st), 1);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    p->s.pid = 0;
}

static gddr_client *pl_client(const char *ep, int rank, int world)
{
    gddr_client_opts o;
    gddr_client_opts_init(&o);
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = 2000;
    o.reconnect_timeout_ms = WAIT_MS;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    ck_assert_msg(rc == GDDR_OK, "gddr_client_open(%s): %s", ep, gddr_strerror(rc));
    return c;
}

/* Pulls tensor id (reconnecting to a restarted server as needed) and
 * checks every value is `want` and the version is `version`. */
static void expect_counted(gddr_client *c, int id, size_t n, float want, uint64_t version,
                           const char *what)
{
    float *v = malloc(n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    uint64_t ver = 0;
    int rc = gddr_pull(c, id, v, 0, &ver);
    ck_assert_msg(rc == GDDR_OK, "%s: pull: %s (%s)", what, gddr_strerror(rc), gddr_client_errmsg(c));
    ck_assert_msg(ver == version, "%s: version %" PRIu64 ", expected %" PRIu64, what, ver, version);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(v[i] == want, "%s: element %zu is %g, expected %g", what, i, (double)v[i],
                      (double)want);
    free(v);
}

/* n pushes of -1 (lr 1: each adds 1) to tensor id. */
static void push_ones(gddr_client *c, int id, size_t n, int count)
{
    float *g = malloc(n * sizeof *g);
    ck_assert_ptr_nonnull(g);
    for (size_t i = 0; i < n; i++)
        g[i] = -1.0f;
    for (int k = 0; k < count; k++) {
        int rc = gddr_push(c, id, g, NULL);
        ck_assert_msg(rc == GDDR_OK, "push %d: %s (%s)", k, gddr_strerror(rc), gddr_client_errmsg(c));
    }
    free(g);
}

static int register_counter(gddr_client *c, const char *key, size_t n)
{
    float *z = calloc(n, sizeof *z);
    ck_assert_ptr_nonnull(z);
    int id = -1;
    int rc = gddr_register_opt(c, key, z, n, "sgd lr=1", &id, NULL);
    ck_assert_msg(rc == GDDR_OK, "register %s: %s (%s)", key, gddr_strerror(rc), gddr_client_errmsg(c));
    free(z);
    return id;
}

/* A raw push of step `step` (every value val) to tensor id as r's rank;
 * returns its reply (the caller frees it). */
static Gddr__Reply *push_val_reply(raw_conn *r, uint32_t id, size_t n, float val, uint64_t step,
                                   uint64_t base)
{
    float *g = malloc(n * sizeof *g);
    ck_assert_ptr_nonnull(g);
    for (size_t i = 0; i < n; i++)
        g[i] = val;
    uint64_t rid = raw_push_step(r, id, g, n, base, step, fabsf(val) * sqrtf((float)n));
    free(g);
    Gddr__Reply *rep = NULL;
    int64_t end = gt_now_ms() + WAIT_MS;
    while (!rep && gt_now_ms() < end) {
        rep = raw_recv(r, 1000, NULL);
        if (rep && rep->req_id != rid) {
            gddr__reply__free_unpacked(rep, NULL);
            rep = NULL;
        }
    }
    ck_assert_msg(rep != NULL, "raw push of step %" PRIu64 ": no reply", step);
    return rep;
}

/* A raw push of step `step` (values -1). */
static Gddr__Reply *push_step_reply(raw_conn *r, uint32_t id, size_t n, uint64_t step, uint64_t base)
{
    return push_val_reply(r, id, n, -1.0f, step, base);
}

/* Waits (up to WAIT_MS) until metric `name` of c's server satisfies
 * cmp(value, want); returns the last value read. */
static double wait_metric(gddr_client *c, const char *name, int (*cmp)(double, double), double want)
{
    int64_t end = gt_now_ms() + WAIT_MS;
    double v = gt_server_metric(c, name);
    while (!cmp(v, want) && gt_now_ms() < end) {
        gt_sleep_ms(20);
        v = gt_server_metric(c, name);
    }
    return v;
}

static int at_least(double v, double want)
{
    return v >= want;
}

static int equal_to(double v, double want)
{
    return v == want;
}

static size_t count_segments(const char *dir)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "pushlog-", 8) == 0 && strstr(e->d_name, ".log") &&
            !strstr(e->d_name, ".unused"))
            n++;
    closedir(d);
    return n;
}

/* The newest segment's path. */
static void newest_segment(const char *dir, char *out, size_t len)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    char best[256] = "";
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "pushlog-", 8) == 0 && !strstr(e->d_name, ".unused") &&
            strcmp(e->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", e->d_name);
    closedir(d);
    ck_assert_msg(best[0], "no push log segment in %s", dir);
    snprintf(out, len, "%s/%s", dir, best);
}

static off_t file_size(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 ? sb.st_size : -1;
}

START_TEST(test_always_kill9_loses_nothing)
{
    plrun p;
    pl_init(&p, "always", NULL);
    gddr_client *c = pl_client(p.s.endpoint, 0, 2);
    int big = register_counter(c, "big", BIG);
    int small = register_counter(c, "small", 10);
    push_ones(c, big, BIG, 30);
    push_ones(c, small, 10, 45);
    /* A second worker speaking the wire itself, with steps of its own. */
    raw_conn r;
    raw_open(&r, p.s.endpoint);
    r.session = 0x5eed;
    raw_hello(&r, 1, 2);
    Gddr__Reply *rep = push_step_reply(&r, (uint32_t)small, 10, 7, 45);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_PUSH);
    ck_assert(!rep->push->duplicate);
    ck_assert_uint_eq(rep->push->version, 46);
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    /* No checkpoint was ever written: only the log holds this. */
    pl_kill9(&p);
    pl_start(&p, "always", NULL);
    expect_counted(c, big, BIG, 30.0f, 30, "big after kill -9 and restart");
    expect_counted(c, small, 10, 46.0f, 46, "small after kill -9 and restart");
    /* The raw worker's resend of step 7 (same session) is a duplicate:
     * its exactly-once record came back with the log. */
    raw_open(&r, p.s.endpoint);
    r.session = 0x5eed;
    raw_hello(&r, 1, 2);
    rep = push_step_reply(&r, (uint32_t)small, 10, 7, 46);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_PUSH);
    ck_assert_msg(rep->push->duplicate, "the resend of an acknowledged push was applied again");
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&r);
    expect_counted(c, small, 10, 46.0f, 46, "small after the resend");
    double replayed = gt_server_metric(c, "gddr_push_log_replayed_records");
    ck_assert_msg(replayed >= 30 + 45 + 1, "replayed %g records, expected at least 76", replayed);
    /* Training goes on from there. */
    push_ones(c, big, BIG, 1);
    expect_counted(c, big, BIG, 31.0f, 31, "big after one more push");
    gddr_client_close(&c);
    pl_end(&p);
}
END_TEST

START_TEST(test_torn_tail_cut)
{
    plrun p;
    pl_init(&p, "always", NULL);
    gddr_client *c = pl_client(p.s.endpoint, 0, 1);
    int id = register_counter(c, "t", 1000);
    push_ones(c, id, 1000, 12);
    pl_kill9(&p);
    /* A write the crash tore: half a record's header, then junk. */
    char seg[300];
    newest_segment(p.ckpt, seg, sizeof seg);
    off_t was = file_size(seg);
    int fd = open(seg, O_WRONLY | O_APPEND);
    ck_assert_int_ge(fd, 0);
    const char junk[77] = "GLP1 not a record: a write the crash interrupted, padding padding pad";
    ck_assert_int_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    pl_start(&p, "always", NULL);
    expect_counted(c, id, 1000, 12.0f, 12, "after the torn tail was cut");
    ck_assert_double_eq(gt_server_metric(c, "gddr_push_log_torn_bytes"), (double)sizeof junk);
    ck_assert_msg(file_size(seg) == was, "the torn tail was not cut from %s (%lld bytes, was %lld)",
                  seg, (long long)file_size(seg), (long long)was);
    /* And the log goes on: more pushes, another kill, all there. */
    push_ones(c, id, 1000, 5);
    pl_kill9(&p);
    pl_start(&p, "always", NULL);
    expect_counted(c, id, 1000, 17.0f, 17, "after a second kill -9");
    gddr_client_close(&c);
    pl_end(&p);
}
END_TEST

START_TEST(test_checkpoint_starts_segment)
{
    plrun p;
    pl_init(&p, "always", "checkpoint_keep=1");
    gddr_client *c = pl_client(p.s.endpoint, 0, 1);
    int id = register_counter(c, "t", BIG);
    push_ones(c, id, BIG, 10);
    ck_assert_int_eq(count_segments(p.ckpt), 1);
    /* A checkpoint: the records so far are in it; a new segment starts
     * and, once it is written, the old one goes (checkpoint_keep = 1). */
    double n0 = gt_server_metric(c, "gddr_checkpoints_total");
    ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
    ck_assert_msg(wait_metric(c, "gddr_checkpoints_total", at_least, n0 + 1) >= n0 + 1,
                  "no checkpoint written");
    push_ones(c, id, BIG, 4); /* these only in the new segment */
    int64_t end = gt_now_ms() + WAIT_MS;
    while (count_segments(p.ckpt) != 1 && gt_now_ms() < end)
        gt_sleep_ms(20);
    ck_assert_msg(count_segments(p.ckpt) == 1, "%zu segments after a checkpoint with checkpoint_keep = 1",
                  count_segments(p.ckpt));
    pl_kill9(&p);
    pl_start(&p, "always", "checkpoint_keep=1");
    expect_counted(c, id, BIG, 14.0f, 14, "checkpoint + replay after kill -9");
    double replayed = gt_server_metric(c, "gddr_push_log_replayed_records");
    ck_assert_msg(replayed == 4, "replayed %g records after the checkpoint, expected the 4 pushes", replayed);
    gddr_client_close(&c);
    pl_end(&p);
}
END_TEST

START_TEST(test_batch_synced_survives)
{
    plrun p;
    pl_init(&p, "batch", "push_log_window_ms=5");
    gddr_client *c = pl_client(p.s.endpoint, 0, 1);
    int id = register_counter(c, "t", BIG);
    push_ones(c, id, BIG, 20);
    /* batch answers at once; once nothing is left unsynced, a kill keeps it all */
    ck_assert_double_eq(wait_metric(c, "gddr_push_log_unsynced_records", equal_to, 0), 0);
    ck_assert_msg(gt_server_metric(c, "gddr_push_log_syncs_total") >= 1, "nothing was synced");
    pl_kill9(&p);
    pl_start(&p, "batch", "push_log_window_ms=5");
    expect_counted(c, id, BIG, 20.0f, 20, "batch: synced pushes after kill -9");
    gddr_client_close(&c);
    gt_server_stop(&p.s, WAIT_MS, NULL);
    /* Started again with the log off, the segments are moved aside: a later
     * start with it on must not replay pushes older than its checkpoints. */
    pl_start(&p, "off", NULL);
    ck_assert_int_eq(count_segments(p.ckpt), 0);
    pl_end(&p);
}
END_TEST

/* push_log needs checkpoint_dir: refused with the reason. */
START_TEST(test_needs_checkpoint_dir)
{
    char bin[512], cmd[1200];
    gt_bin_path(bin, sizeof bin, "gddr-ps");
    snprintf(cmd, sizeof cmd, "'%s' --check-config --set push_log=batch 2>&1", bin);
    char *sh[] = { "/bin/sh", "-c", cmd, NULL };
    char *out = NULL, err[256];
    int st = 0;
    ck_assert_int_eq(gt_run_capture(sh, WAIT_MS, 0, &out, &st, err, sizeof err), 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0 && strstr(out, "checkpoint_dir"),
                  "push_log without checkpoint_dir was accepted:\n%s", out);
    free(out);
}
END_TEST

/* Keeps a raw worker's rank alive: heartbeats of its session every 200 ms
 * on a connection of their own, until stop. */
typedef struct beater {
    raw_conn c;
    atomic_int stop;
} beater;

/* A scratch directory, its log, and the --set for a checkpoint_dir in it. */
static void scratch_with_ckpt(char dir[64], char log[128], char ck[200])
{
    char ckd[160];
    gt_scratch_log(dir, 64, log, 128);
    snprintf(ckd, sizeof ckd, "%s/ckpt", dir);
    ck_assert_int_eq(mkdir(ckd, 0700), 0);
    snprintf(ck, 200, "checkpoint_dir=%s", ckd);
}

/* kill -9 of s, and s started again on its endpoint with sets (whose
 * slot `at` gets the listen= in lst). */
static void kill9_restart(gt_server *s, const char *log, const char **sets, int at, char lst[300])
{
    kill(s->pid, SIGKILL);
    ck_assert_int_eq(gt_wait_pid(s->pid, WAIT_MS, NULL), 1);
    s->pid = 0;
    snprintf(lst, 300, "listen=%s", s->endpoint);
    sets[at] = lst;
    gt_start_logged(s, log, sets);
}

static void *beat_main(void *arg)
{
    beater *bt = arg;
    while (!atomic_load(&bt->stop)) {
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Heartbeat hb = GDDR__HEARTBEAT__INIT;
        rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
        rq.req_id = ++bt->c.next_id;
        rq.rank = bt->c.rank;
        rq.session = bt->c.session;
        rq.body_case = GDDR__REQUEST__BODY_HEARTBEAT;
        rq.heartbeat = &hb;
        gddr__send(bt->c.sock, NULL, &rq.base, NULL, 0);
        gddr__frames f;
        while (gddr__frames_recv(bt->c.sock, &f, ZMQ_DONTWAIT) >= 0)
            gddr__frames_close(&f);
        gt_sleep_ms(200);
    }
    return NULL;
}

/* Sync mode replays too, with what completed its steps on a clock. Three
 * workers expected, two come: the first step completes once worker 2 has
 * not said hello within worker_timeout_s; then two workers' steps (the
 * mean of 1 and 3 at lr 0.5: -1 a step); then worker 1 falls silent and is
 * declared dead, so step 4 completes with worker 0 alone (-0.5) and step 5
 * at once. kill -9 with no checkpoint; the restart replays the pushes, the
 * completions with the divisor they had, and the death. A replay that
 * decided by its own clock would count the absent worker 2 as still to
 * come (the run looks young again) and complete nothing. Worker 1's resend
 * of its last step is a duplicate. */
START_TEST(test_sync_replay)
{
    char dir[64], log[128], ck[200], lst[300];
    scratch_with_ckpt(dir, log, ck);
    gt_server s;
    const char *sets[] = { "mode=sync", "workers=3", "worker_timeout_s=1.5", "lr=0.5", "push_log=always",
                           "checkpoint_interval_s=0", ck, NULL, NULL };
    gt_start_logged(&s, log, sets);
    gddr_client_opts o;
    gddr_client_opts_init(&o);
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 3;
    o.timeout_ms = 5000;
    o.reconnect_timeout_ms = WAIT_MS;
    o.heartbeat_ms = 300; /* alive while worker 1 falls silent */
    gddr_client *a = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &a), GDDR_OK);
    float w0[4] = { 10, 10, 10, 10 }, got[4];
    int id;
    ck_assert_int_eq(gddr_register(a, "s", w0, 4, &id, NULL), GDDR_OK);
    raw_conn b;
    raw_open(&b, s.endpoint);
    b.session = 0xb0b;
    raw_hello(&b, 1, 3);
    beater bt;
    raw_open(&bt.c, s.endpoint);
    bt.c.rank = 1;
    bt.c.session = 0xb0b;
    atomic_init(&bt.stop, 0);
    pthread_t bth;
    ck_assert_int_eq(pthread_create(&bth, NULL, beat_main, &bt), 0);
    float ga[4] = { 1, 1, 1, 1 }, gb[4] = { 3, 3, 3, 3 };
    uint64_t v = 0;
    for (uint64_t step = 1; step <= 3; step++) {
        ck_assert_int_eq(gddr_push(a, id, ga, NULL), GDDR_OK);
        raw_push_step(&b, (uint32_t)id, gb, 4, step - 1, step, 6.0f);
        ck_assert_int_eq(gddr_pull(a, id, got, step, &v), GDDR_OK);
        ck_assert_uint_eq(v, step);
    }
    ck_assert_float_eq(got[0], 7.0f);
    /* step 4: worker 1 falls silent until it is declared dead */
    atomic_store(&bt.stop, 1);
    pthread_join(bth, NULL);
    raw_close(&bt.c);
    ck_assert_int_eq(gddr_push(a, id, ga, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull(a, id, got, 4, &v), GDDR_OK); /* waits for the death */
    ck_assert_float_eq(got[0], 6.5f);
    ck_assert_int_eq(gddr_push(a, id, ga, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull(a, id, got, 5, &v), GDDR_OK);
    ck_assert_float_eq(got[0], 6.0f);
    raw_close(&b);
    kill9_restart(&s, log, sets, 7, lst);
    ck_assert_int_eq(gddr_pull(a, id, got, 0, &v), GDDR_OK);
    ck_assert_msg(v == 5 && got[0] == 6.0f, "after the replay: version %" PRIu64 ", value %g (expected 5, 6)",
                  v, (double)got[0]);
    raw_open(&b, s.endpoint);
    b.session = 0xb0b;
    raw_hello(&b, 1, 3);
    uint64_t rid = raw_push_step(&b, (uint32_t)id, gb, 4, 2, 3, 6.0f);
    Gddr__Reply *rep = raw_recv(&b, WAIT_MS, NULL);
    ck_assert_ptr_nonnull(rep);
    ck_assert_uint_eq(rep->req_id, rid);
    ck_assert_int_eq(rep->body_case, GDDR__REPLY__BODY_PUSH);
    ck_assert_msg(rep->push->duplicate, "worker 1's resend of step 3 after the replay was taken again");
    gddr__reply__free_unpacked(rep, NULL);
    raw_close(&b);
    ck_assert_int_eq(gddr_pull(a, id, got, 0, &v), GDDR_OK);
    ck_assert_msg(v == 5 && got[0] == 6.0f, "after the resend: version %" PRIu64 ", value %g", v,
                  (double)got[0]);
    gddr_client_close(&a);
    gt_server_stop(&s, WAIT_MS, NULL);
    gt_rm_rf(dir);
}
END_TEST

/* A sync server for two workers with a checkpoint_dir, in a scratch
 * directory (sets: its settings, slot 4 free for a listen=), and its rank 0
 * as a library client (to register with, then close). */
static gddr_client *sync_pair(gt_server *s, char dir[64], char log[128], char ck[200], const char *sets[6])
{
    scratch_with_ckpt(dir, log, ck);
    sets[0] = "mode=sync";
    sets[1] = "workers=2";
    sets[2] = "checkpoint_interval_s=0";
    sets[3] = ck;
    sets[4] = sets[5] = NULL;
    gt_start_logged(s, log, sets);
    return pl_client(s->endpoint, 0, 2);
}

/* A checkpoint of the server at ep, asked for by an observer and waited for. */
static void checkpoint_now(const char *ep)
{
    gddr_client *obs = open_observer_on(ep, WAIT_MS);
    double n0 = gt_server_metric(obs, "gddr_checkpoints_total");
    ck_assert_int_eq(gddr_request_checkpoint(obs), GDDR_OK);
    ck_assert_msg(wait_metric(obs, "gddr_checkpoints_total", at_least, n0 + 1) >= n0 + 1, "no checkpoint");
    gddr_client_close(&obs);
}

/* A raw push of val that must be taken (a push reply, not an error). */
static void push_taken(raw_conn *r, uint32_t id, size_t n, float val, uint64_t step, uint64_t base)
{
    Gddr__Reply *rep = push_val_reply(r, id, n, val, step, base);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH, "rank %u's push of step %" PRIu64 " refused: %s",
                  r->rank, step, rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "?");
    gddr__reply__free_unpacked(rep, NULL);
}

static void hello_as(raw_conn *r, const char *ep, uint32_t rank, uint64_t session)
{
    raw_open(r, ep);
    r->session = session;
    raw_hello(r, rank, 2);
}

/* A sync step restored open lines up with each worker's own step numbers,
 * which need not be alike: here worker 0 counts from 100 and worker 1 from
 * 5 (a worker declared dead and back, or a new process for a rank, counts
 * apart from the others). lr 1, two workers, a step adds minus the mean of
 * its pushes. Step 1: 0 by -2 and 1 by -2 (value 2). Worker 0's step 101
 * opens step 2; a checkpoint; steps 2 and 3 complete and are lost with a
 * kill -9. After the restart worker 1 pushes its step 8 (-10): it is past
 * its step 6 the restored step wanted, so that step closes with worker 0's
 * push alone (value 3, version 2), and step 8 opens the step after it.
 * Worker 0 then sends its step 102 again (-4): that step was lost here, so
 * the push is late -- mass in the open step, answered at once (before, it
 * was answered and dropped). Its step 103 belongs to the open step (two
 * after the restored one): value 3 + (10 + 4 + 2) / 2 = 11, version 3.
 * Compared across workers (worker 1's 8 against worker 0's 101), worker
 * 1's push was answered and dropped, and the step it should have joined
 * waited for it. */
START_TEST(test_sync_restore_own_step_numbers)
{
    char dir[64], log[128], ck[200], lst[300];
    gt_server s;
    const char *sets[6];
    gddr_client *c = sync_pair(&s, dir, log, ck, sets);
    uint32_t id = (uint32_t)register_counter(c, "t", 4);
    gddr_client_close(&c);
    raw_conn a, b;
    hello_as(&a, s.endpoint, 0, 0xa);
    hello_as(&b, s.endpoint, 1, 0xb);
    push_taken(&a, id, 4, -2.0f, 100, 0);
    push_taken(&b, id, 4, -2.0f, 5, 0);
    push_taken(&a, id, 4, -2.0f, 101, 1);
    checkpoint_now(s.endpoint);
    push_taken(&b, id, 4, -2.0f, 6, 1); /* step 2 completes: lost below */
    push_taken(&a, id, 4, -2.0f, 102, 2);
    push_taken(&b, id, 4, -2.0f, 7, 2);
    raw_close(&a);
    raw_close(&b);
    kill9_restart(&s, log, sets, 4, lst);
    hello_as(&a, s.endpoint, 0, 0xa);
    hello_as(&b, s.endpoint, 1, 0xb);
    push_taken(&b, id, 4, -10.0f, 8, 1);
    push_taken(&a, id, 4, -4.0f, 102, 1);
    push_taken(&a, id, 4, -2.0f, 103, 1);
    float got[4];
    server_values_within(s.endpoint, "t", got, 4, 3, WAIT_MS);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(got[i] == 11.0f, "value %d is %g after the restart's steps, expected 11", i, (double)got[i]);
    ck_assert_msg(gt_wait_for_text(log, "worker 0 pushed step 102 after a restart", 0) >= 0,
                  "worker 0's step 102 was not taken as late");
    ck_assert_msg(gt_wait_for_text(log, "worker 1 pushed step 8, past its step 6", 0) >= 0,
                  "the restored step did not close at worker 1's step 8");
    raw_close(&a);
    raw_close(&b);
    gt_server_stop(&s, WAIT_MS, NULL);
    gt_rm_rf(dir);
}
END_TEST

/* A rank catching up when the checkpoint was taken is lined up after the
 * restart by where it was (the checkpoint's "syncplace" section), not as if
 * its last push had been on time. Three workers, sync_quorum 2, a table
 * registered too (two phases: a late worker catches up one push a step).
 * Rank 2's step 1 joins step 2; steps 3-5 complete without it; its step 2
 * is then late, 3 behind, and after it, its step 3 belongs to step 4 here
 * (open: 6). A checkpoint, kill -9, restart. Rank 0's step 6 joins the
 * open step; rank 2's step 3 must be late again (2 behind), not rank 2's
 * push of the open step (which, with rank 0's, would make the quorum and
 * put rank 2 two steps ahead of its other tensors and tables). */
START_TEST(test_sync_restore_catching_up)
{
    char dir[64], log[128], ck[200], lst[300];
    gt_server s;
    scratch_with_ckpt(dir, log, ck);
    const char *sets[7] = { "mode=sync", "workers=3", "sync_quorum=2", "checkpoint_interval_s=0", ck, NULL, NULL };
    gt_start_logged(&s, log, sets);
    gddr_client *c = pl_client(s.endpoint, 0, 2);
    uint32_t id = (uint32_t)register_counter(c, "t", 4);
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    int tid = -1;
    ck_assert_int_eq(gddr_table_register(c, "rows", 2, &to, &tid), GDDR_OK);
    gddr_client_close(&c);
    raw_conn w[3];
    for (uint32_t r = 0; r < 3; r++) {
        raw_open(&w[r], s.endpoint);
        w[r].session = 0xc0 + r;
        raw_hello(&w[r], r, 3);
    }
    push_taken(&w[0], id, 4, -1.0f, 1, 0);
    push_taken(&w[1], id, 4, -1.0f, 1, 0); /* quorum: version 1 */
    push_taken(&w[2], id, 4, -1.0f, 1, 1); /* its first: step 2 */
    push_taken(&w[0], id, 4, -1.0f, 2, 1); /* version 2 */
    push_taken(&w[1], id, 4, -1.0f, 2, 1); /* late */
    for (uint64_t k = 3; k <= 5; k++) {
        push_taken(&w[0], id, 4, -1.0f, k, k - 1);
        push_taken(&w[1], id, 4, -1.0f, k, k - 1); /* version k */
    }
    Gddr__Reply *rep = push_val_reply(&w[2], id, 4, -1.0f, 2, 2);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH && rep->push->behind == 3,
                  "rank 2's step 2 before the restart: behind %" PRIu64 ", expected 3",
                  rep->body_case == GDDR__REPLY__BODY_PUSH ? rep->push->behind : 0);
    gddr__reply__free_unpacked(rep, NULL);
    checkpoint_now(s.endpoint);
    for (int r = 0; r < 3; r++)
        raw_close(&w[r]);
    kill9_restart(&s, log, sets, 5, lst);
    for (uint32_t r = 0; r < 3; r++) {
        raw_open(&w[r], s.endpoint);
        w[r].session = 0xc0 + r;
        raw_hello(&w[r], r, 3);
    }
    push_taken(&w[0], id, 4, -1.0f, 6, 5);
    rep = push_val_reply(&w[2], id, 4, -1.0f, 3, 5);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH && !rep->push->applied && rep->push->behind == 2,
                  "rank 2's step 3 after the restart: applied %d behind %" PRIu64 " (expected late, 2 behind)",
                  rep->body_case == GDDR__REPLY__BODY_PUSH ? rep->push->applied : -1,
                  rep->body_case == GDDR__REPLY__BODY_PUSH ? rep->push->behind : 0);
    gddr__reply__free_unpacked(rep, NULL);
    for (int r = 0; r < 3; r++)
        raw_close(&w[r]);
    gt_server_stop(&s, WAIT_MS, NULL);
    gt_rm_rf(dir);
}
END_TEST

/* A raw row push of step `step` (every value val) of key to table sid as
 * r's rank; it must be taken (a push reply, not an error). */
static void rows_taken(raw_conn *r, uint32_t sid, uint64_t key, uint32_t dim, float val, uint64_t step,
                       uint64_t base)
{
    Gddr__Request rq = GDDR__REQUEST__INIT;
    Gddr__PushRows p = GDDR__PUSH_ROWS__INIT;
    raw_request(r, &rq);
    p.table = sid;
    p.nkeys = 1;
    p.step = step;
    p.base_version = base;
    p.payload_bytes = dim * 4;
    rq.body_case = GDDR__REQUEST__BODY_PUSH_ROWS;
    rq.push_rows = &p;
    float g[16];
    for (uint32_t i = 0; i < dim; i++)
        g[i] = val;
    gddr__raw raws[2] = { { &key, 8, NULL, NULL }, { g, dim * 4, NULL, NULL } };
    ck_assert(gddr__send(r->sock, NULL, &rq.base, raws, 2) >= 0);
    Gddr__Reply *rep = NULL;
    int64_t end = gt_now_ms() + WAIT_MS;
    while (!rep && gt_now_ms() < end) {
        rep = raw_recv(r, 1000, NULL);
        if (rep && rep->req_id != rq.req_id) {
            gddr__reply__free_unpacked(rep, NULL);
            rep = NULL;
        }
    }
    ck_assert_msg(rep != NULL, "row push of step %" PRIu64 ": no reply", step);
    ck_assert_msg(rep->body_case == GDDR__REPLY__BODY_PUSH, "rank %u's row push of step %" PRIu64 " refused: %s",
                  r->rank, step, rep->body_case == GDDR__REPLY__BODY_ERROR ? rep->error->message : "?");
    gddr__reply__free_unpacked(rep, NULL);
}

/* The same for a table's sync steps: worker 0 counts from 10, worker 1 from
 * 50; step 1 (value 2); worker 0's step 11 opens step 2; a checkpoint;
 * steps 2 and 3 complete and are lost with a kill -9. After the restart
 * worker 1 pushes its step 53 (-10), past its step 51 the restored step
 * wanted: that step closes with worker 0's push alone (value 3), and 53
 * opens the step two after it. Worker 0 sends its lost step 12 again (-4):
 * late, mass in that step; its step 13 joins it: value 3 + (10 + 4 + 2) / 2
 * = 11 at version 3 (before, the step 12 was answered and dropped: 9).
 * Without the rule, worker 1's step 53 completed the restored step (value
 * 8) and worker 0's step 13 opened a step of its own that waited for
 * worker 1's next push -- here until worker 1, which sends no heartbeats,
 * was declared dead; in a run that steps tensors and the table in turn,
 * for good (docs/soak.md). */
START_TEST(test_sync_restore_table_own_step_numbers)
{
    char dir[64], log[128], ck[200], lst[300];
    gt_server s;
    const char *sets[6];
    gddr_client *c = sync_pair(&s, dir, log, ck, sets);
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    to.optimizer = "sgd lr=1";
    int tid = -1;
    ck_assert_int_eq(gddr_table_register(c, "rows", 2, &to, &tid), GDDR_OK);
    gddr_client_close(&c);
    const uint32_t sid = 0; /* the server's id of the first table */
    raw_conn a, b;
    hello_as(&a, s.endpoint, 0, 0xa);
    hello_as(&b, s.endpoint, 1, 0xb);
    rows_taken(&a, sid, 7, 2, -2.0f, 10, 0);
    rows_taken(&b, sid, 7, 2, -2.0f, 50, 0);
    rows_taken(&a, sid, 7, 2, -2.0f, 11, 1);
    checkpoint_now(s.endpoint);
    rows_taken(&b, sid, 7, 2, -2.0f, 51, 1); /* step 2 completes: lost below */
    rows_taken(&a, sid, 7, 2, -2.0f, 12, 2);
    rows_taken(&b, sid, 7, 2, -2.0f, 52, 2);
    raw_close(&a);
    raw_close(&b);
    kill9_restart(&s, log, sets, 4, lst);
    hello_as(&a, s.endpoint, 0, 0xa);
    hello_as(&b, s.endpoint, 1, 0xb);
    rows_taken(&b, sid, 7, 2, -10.0f, 53, 1);
    rows_taken(&a, sid, 7, 2, -4.0f, 12, 1);
    rows_taken(&a, sid, 7, 2, -2.0f, 13, 1);
    gddr_client *obs = open_observer_on(s.endpoint, WAIT_MS);
    int ot = -1;
    ck_assert_int_eq(gddr_table_register(obs, "rows", 2, NULL, &ot), GDDR_OK);
    uint64_t key = 7, v = 0;
    float got[2] = { 0, 0 };
    int rc = gddr_pull_rows(obs, ot, &key, 1, got, GDDR_ROWS_NOCREATE, 3, &v);
    ck_assert_msg(rc == GDDR_OK, "row pull at version 3: %s (%s)", gddr_strerror(rc), gddr_client_errmsg(obs));
    ck_assert_msg(v == 3 && got[0] == 11.0f && got[1] == 11.0f,
                  "after the restart's steps: version %" PRIu64 ", row %g %g (expected 3, 11 11)", v,
                  (double)got[0], (double)got[1]);
    gddr_client_close(&obs);
    raw_close(&a);
    raw_close(&b);
    gt_server_stop(&s, WAIT_MS, NULL);
    gt_rm_rf(dir);
}
END_TEST

/* A worker waiting on a server that is killed notices the broken
 * connection and gets back in as soon as the server is back, not after
 * its timeout_ms: here ten minutes, past this case's own timeout, so a
 * client that waited for it would hang the case. A pull waits for a
 * version still to come; gddr-ps is killed and started again (push log
 * on: the tensor is back at once); another worker pushes; the waiting
 * pull completes with the new version. (The soak measured a kill's
 * recovery at timeout_ms: the client noticed nothing until then.) */
typedef struct waiter {
    gddr_client *c;
    int id, rc;
    uint64_t version;
    float out[16];
} waiter;

static void *wait_main(void *arg)
{
    waiter *w = arg;
    w->rc = gddr_pull(w->c, w->id, w->out, 3, &w->version);
    return NULL;
}

START_TEST(test_kill_noticed_at_once)
{
    plrun p;
    pl_init(&p, "always", NULL);
    gddr_client_opts o;
    gddr_client_opts_init(&o);
    o.server = p.s.endpoint;
    o.rank = 0;
    o.world_size = 2;
    o.timeout_ms = 600000;
    o.reconnect_timeout_ms = WAIT_MS;
    waiter w = { 0 };
    ck_assert_int_eq(gddr_client_open(&o, &w.c), GDDR_OK);
    w.id = register_counter(w.c, "t", 16);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, wait_main, &w), 0);
    gt_sleep_ms(300); /* the pull is parked on the server (if not yet: it is queued, no harm) */
    pl_kill9(&p);
    gt_sleep_ms(200);
    pl_start(&p, "always", NULL);
    gddr_client *c1 = pl_client(p.s.endpoint, 1, 2);
    int id1 = register_counter(c1, "t", 16);
    push_ones(c1, id1, 16, 3);
    /* Its own timeout is 10 minutes: only noticing the kill (the
     * connection's DISCONNECTED, then a resend to the new server) brings it
     * back within WAIT_MS. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_MS / 1000;
    ck_assert_msg(pthread_timedjoin_np(th, NULL, &until) == 0,
                  "the pull parked before the kill did not come back within %d s: the kill was not noticed",
                  WAIT_MS / 1000);
    ck_assert_msg(w.rc == GDDR_OK, "the waiting pull: %s (%s)", gddr_strerror(w.rc),
                  gddr_client_errmsg(w.c));
    ck_assert_uint_eq(w.version, 3);
    for (int i = 0; i < 16; i++)
        ck_assert_float_eq(w.out[i], 3.0f);
    gddr_client_close(&c1);
    gddr_client_close(&w.c);
    pl_end(&p);
}
END_TEST

/* Sparse rows replay too: a table registered, rows created by pulls and
 * moved by pushes, a kill -9 with no checkpoint, and every row reads back
 * as before the kill (a row a pull created and no push moved reads as its
 * initial value again: created again from the same seed). */
START_TEST(test_rows_replay)
{
    plrun p;
    pl_init(&p, "always", "lr=0.25");
    gddr_client *c = pl_client(p.s.endpoint, 0, 1);
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    to.init = GDDR_TINIT_UNIFORM;
    to.init_scale = 0.5f;
    to.init_seed = 5;
    int t;
    ck_assert_int_eq(gddr_table_register(c, "emb", 8, &to, &t), GDDR_OK);
    enum { K = 40 };
    uint64_t keys[K];
    float before[K * 8], after[K * 8], g[K * 8];
    for (int i = 0; i < K; i++)
        keys[i] = 1000003ull * (uint64_t)(i + 1);
    ck_assert_int_eq(gddr_pull_rows(c, t, keys, K, before, 0, 0, NULL), GDDR_OK);
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < K * 8; i++)
            g[i] = (float)((i + step) % 7) - 3.0f;
        ck_assert_int_eq(gddr_push_rows(c, t, keys, K / 2 + step, g, NULL), GDDR_OK);
    }
    uint64_t v0 = 0, v1 = 0;
    ck_assert_int_eq(gddr_pull_rows(c, t, keys, K, before, 0, 0, &v0), GDDR_OK);
    ck_assert_uint_eq(v0, 3);
    pl_kill9(&p);
    pl_start(&p, "always", "lr=0.25");
    ck_assert_int_eq(gddr_pull_rows(c, t, keys, K, after, 0, 0, &v1), GDDR_OK);
    ck_assert_uint_eq(v1, v0);
    for (int i = 0; i < K * 8; i++)
        ck_assert_msg(after[i] == before[i], "row %d value %d: %.9g after the replay, %.9g before", i / 8,
                      i % 8, (double)after[i], (double)before[i]);
    gddr_client_close(&c);
    pl_end(&p);
}
END_TEST

/* Sync steps of a table replay too (their completion is an event, with
 * its divisor): two workers push rows each step, kill -9 with no
 * checkpoint, and every row and the table's version come back. */
START_TEST(test_sync_rows_replay)
{
    char dir[64], log[128], ck[200], lst[300];
    scratch_with_ckpt(dir, log, ck);
    gt_server s;
    const char *sets[] = { "mode=sync", "workers=2", "lr=0.5", "push_log=always", "checkpoint_interval_s=0",
                           ck, NULL, NULL };
    gt_start_logged(&s, log, sets);
    gddr_client *w[2];
    int t[2];
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    to.init = GDDR_TINIT_UNIFORM;
    to.init_scale = 0.5f;
    to.init_seed = 9;
    for (int r = 0; r < 2; r++) {
        w[r] = pl_client(s.endpoint, r, 2);
        ck_assert_int_eq(gddr_table_register(w[r], "emb", 4, &to, &t[r]), GDDR_OK);
    }
    enum { K = 12 };
    uint64_t keys[K];
    float g[K * 4], before[K * 4], after[K * 4];
    for (int i = 0; i < K; i++)
        keys[i] = 77ull * (uint64_t)(i + 3);
    uint64_t v0 = 0, v1 = 0;
    for (int step = 1; step <= 3; step++)
        for (int r = 0; r < 2; r++) {
            for (int i = 0; i < K * 4; i++)
                g[i] = (float)((i + step + r) % 5) - 2.0f;
            ck_assert_int_eq(gddr_push_rows(w[r], t[r], keys, K - r, g, NULL), GDDR_OK);
        }
    ck_assert_int_eq(gddr_pull_rows(w[0], t[0], keys, K, before, 0, 3, &v0), GDDR_OK);
    ck_assert_uint_eq(v0, 3);
    kill(s.pid, SIGKILL);
    ck_assert_int_eq(gt_wait_pid(s.pid, WAIT_MS, NULL), 1);
    s.pid = 0;
    snprintf(lst, sizeof lst, "listen=%s", s.endpoint);
    sets[6] = lst;
    gt_start_logged(&s, log, sets);
    ck_assert_int_eq(gddr_pull_rows(w[0], t[0], keys, K, after, 0, 0, &v1), GDDR_OK);
    ck_assert_uint_eq(v1, v0);
    for (int i = 0; i < K * 4; i++)
        ck_assert_msg(after[i] == before[i], "row %d value %d: %.9g after the replay, %.9g before", i / 4,
                      i % 4, (double)after[i], (double)before[i]);
    for (int r = 0; r < 2; r++)
        gddr_client_close(&w[r]);
    gt_server_stop(&s, WAIT_MS, NULL);
    gt_rm_rf(dir);
}
END_TEST

Suite *suite_pushlog(void)
{
    Suite *s = suite_create("pushlog");
    GT_ADD_CASE(s, "always_kill9_loses_nothing", test_always_kill9_loses_nothing, 120);
    GT_ADD_CASE(s, "torn_tail_cut", test_torn_tail_cut, 120);
    GT_ADD_CASE(s, "checkpoint_starts_segment", test_checkpoint_starts_segment, 120);
    GT_ADD_CASE(s, "batch_synced_survives", test_batch_synced_survives, 120);
    GT_ADD_CASE(s, "needs_checkpoint_dir", test_needs_checkpoint_dir, 60);
    GT_ADD_CASE(s, "sync_replay", test_sync_replay, 120);
    GT_ADD_CASE(s, "sync_restore_own_step_numbers", test_sync_restore_own_step_numbers, 120);
    GT_ADD_CASE(s, "sync_restore_table_own_step_numbers", test_sync_restore_table_own_step_numbers, 120);
    GT_ADD_CASE(s, "sync_restore_catching_up", test_sync_restore_catching_up, 120);
    GT_ADD_CASE(s, "kill_noticed_at_once", test_kill_noticed_at_once, 90);
    GT_ADD_CASE(s, "rows_replay", test_rows_replay, 90);
    GT_ADD_CASE(s, "sync_rows_replay", test_sync_rows_replay, 90);
    return s;
}
