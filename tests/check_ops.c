/* check_ops.c -- what an operator touches, against a real gddr-ps:
 * SIGHUP reloads the reloadable keys from the file (command-line overrides
 * still win, a broken file changes nothing), and the Prometheus endpoint
 * answers an HTTP scrape with the counters.
 */
#include "harness.h" /* first: it sets _GNU_SOURCE */

#include <arpa/inet.h>
#include <check.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gddr/gddr.h"
#include "files.h"
#include "suites.h"

static gddr_client *client_rank(const char *ep, int rank, int world)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = 3000;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    return c;
}

static gddr_client *client(const char *ep)
{
    return client_rank(ep, 0, 1);
}

/* Pushes g (all ones) and returns how far w[0] moved: the lr in force. */
static float step_lr(gddr_client *c, int id, float *w)
{
    float before = w[0], g[4] = { 1, 1, 1, 1 };
    ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull(c, id, w, 0, NULL), GDDR_OK);
    return before - w[0];
}

START_TEST(test_sighup_reload)
{
    char dir[] = "/tmp/gddr-test-ops-XXXXXX", path[128], at[130];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ps.ini", dir);
    snprintf(at, sizeof at, "@%s", path);
    gt_write_file(path, "[optimizer]\nlr = 0.5\nadadelay = 0\n");
    /* momentum comes from the command line and must survive reloads. */
    const char *sets[] = { at, "momentum=0", NULL };
    gt_server s;
    char err[512];
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s", err);
    gddr_client *c = client(s.endpoint);
    float w[4] = { 0 };
    int id;
    ck_assert_int_eq(gddr_register(c, "hup", w, 4, &id, NULL), GDDR_OK);
    ck_assert_float_eq(step_lr(c, id, w), 0.5f);

    /* A new lr in the file takes effect after SIGHUP, without a restart. */
    gt_write_file(path, "[optimizer]\nlr = 0.25\n[server]\nthreads = 3\n");
    ck_assert_int_eq(gt_server_signal(&s, SIGHUP), 0);
    gt_wait_metric(c, "gddr_config_reloads_total", 1, 30000);
    ck_assert_float_eq(step_lr(c, id, w), 0.25f);

    /* A file that no longer parses is refused whole: lr stays 0.25. */
    gt_write_file(path, "[optimizer]\nlr = fast\n");
    ck_assert_int_eq(gt_server_signal(&s, SIGHUP), 0);
    gt_wait_metric(c, "gddr_config_reload_failures_total", 1, 30000);
    ck_assert_float_eq(gt_server_metric(c, "gddr_config_reloads_total"), 1);
    ck_assert_float_eq(step_lr(c, id, w), 0.25f);

    /* A command-line override wins over the file at every reload. */
    gt_write_file(path, "[optimizer]\nlr = 0.125\nmomentum = 0.5\n");
    ck_assert_int_eq(gt_server_signal(&s, SIGHUP), 0);
    gt_wait_metric(c, "gddr_config_reloads_total", 2, 30000);
    ck_assert_float_eq(step_lr(c, id, w), 0.125f);
    ck_assert_float_eq(step_lr(c, id, w), 0.125f); /* momentum 0.5 would make this 0.1875 */

    gddr_client_close(&c);
    stop_server(&s);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* A free loopback port chosen by the OS (bind to port 0, read it back). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = 0 };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* GET /metrics over plain TCP; returns the whole response (malloc'd). */
static char *http_get(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = { 5, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len + 1 >= cap)
            break;
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

START_TEST(test_metrics_http)
{
    int port = free_port();
    char set[80];
    snprintf(set, sizeof set, "metrics_listen=tcp://127.0.0.1:%d", port);
    const char *sets[] = { set, NULL };
    gt_server s;
    char err[512];
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s", err);
    gddr_client *c = client(s.endpoint);
    float w[4] = { 0 };
    int id;
    ck_assert_int_eq(gddr_register(c, "scraped", w, 4, &id, NULL), GDDR_OK);
    step_lr(c, id, w);
    char *page = http_get(port);
    ck_assert_msg(strncmp(page, "HTTP/1.0 200 OK", 15) == 0, "response: %.80s", page);
    ck_assert_msg(strstr(page, "Content-Type: text/plain; version=0.0.4"), "%.200s", page);
    ck_assert_msg(strstr(page, "\ngddr_pushes_total 1\n"), "page: %s", page);
    ck_assert_msg(strstr(page, "\ngddr_pulls_total 1\n"), "page: %s", page);
    ck_assert_msg(strstr(page, "gddr_tensor_version{tensor=\"scraped\"} 1\n"), "page: %s", page);
    ck_assert_msg(strstr(page, "gddr_staleness_bucket{le=\"+Inf\"} 1\n"), "page: %s", page);
    ck_assert_msg(strstr(page, "gddr_worker_pushes_total{rank=\"0\"} 1\n"), "page: %s", page);
    ck_assert_msg(strstr(page, "gddr_worker_staleness_max{rank=\"0\"} 0\n"), "page: %s", page);
    free(page);
    /* A second scrape sees the next push. */
    step_lr(c, id, w);
    page = http_get(port);
    ck_assert_msg(strstr(page, "\ngddr_pushes_total 2\n"), "page: %s", page);
    free(page);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* Worker timeout 1 s; both workers sit idle for 2.5 s. The one with a
 * 200 ms heartbeat stays alive, the one without is declared dead. */
START_TEST(test_heartbeat_keeps_idle_worker_alive)
{
    const char *sets[] = { "worker_timeout_s=1", NULL };
    gt_server s;
    char err[512];
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s", err);
    gddr_client *c[2];
    for (int r = 0; r < 2; r++) {
        gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
        o.server = s.endpoint;
        o.rank = r;
        o.world_size = 2;
        o.heartbeat_ms = r == 0 ? 200 : 0;
        ck_assert_int_eq(gddr_client_open(&o, &c[r]), GDDR_OK);
    }
    gt_sleep_ms(2500);
    char *text = NULL;
    ck_assert_int_eq(gddr_server_metrics_text(c[0], &text), GDDR_OK);
    ck_assert_msg(strstr(text, "\ngddr_worker_deaths_total 1\n"), "metrics: %s", text);
    ck_assert_msg(strstr(text, "\ngddr_live_workers 1\n"), "metrics: %s", text);
    free(text);
    gddr_client_close(&c[0]);
    gddr_client_close(&c[1]);
    stop_server(&s);
}
END_TEST

/* A counter of the server c talks to (-1 when absent). */
static long long server_metric(gddr_client *c, const char *name)
{
    double v = gt_server_metric(c, name);
    return isnan(v) ? -1 : (long long)v;
}

/* Checkpoints every 0.1 s. Once one holds the state, an idle server
 * (a worker connected and heartbeating, nothing pushed) skips the periodic
 * ones: skips grow, written checkpoints and files do not. A push makes the
 * next one due again; a requested one is written even when nothing changed. */
START_TEST(test_idle_checkpoint_skipped)
{
    char dir[] = "/tmp/gddr-test-idle-XXXXXX", set[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(set, sizeof set, "checkpoint_dir=%s", dir);
    const char *sets[] = { set, "checkpoint_interval_s=0.1", "checkpoint_keep=1000", NULL };
    gt_server s;
    char err[512];
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s", err);
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1;
    o.heartbeat_ms = 50;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w[4] = { 0 };
    int id;
    ck_assert_int_eq(gddr_register(c, "idle", w, 4, &id, NULL), GDDR_OK);
    step_lr(c, id, w);
    /* Wait (bounded) until the state is in a checkpoint and skips begin. */
    long long skipped = 0, written = 0;
    for (int i = 0; i < 300 && skipped < 1; i++) {
        gt_sleep_ms(20);
        skipped = server_metric(c, "gddr_checkpoints_skipped_total");
    }
    ck_assert_int_ge(skipped, 1);
    written = server_metric(c, "gddr_checkpoints_total");
    ck_assert_int_ge(written, 1);
    /* Idle through five more skips: nothing is written. */
    long long now = skipped;
    for (int i = 0; i < 500 && now < skipped + 5; i++) {
        gt_sleep_ms(20);
        now = server_metric(c, "gddr_checkpoints_skipped_total");
    }
    ck_assert_int_ge(now, skipped + 5);
    ck_assert_int_eq(server_metric(c, "gddr_checkpoints_total"), written);
    /* A push changes the state: the next periodic checkpoint is written. */
    step_lr(c, id, w);
    long long after = written;
    for (int i = 0; i < 300 && after == written; i++) {
        gt_sleep_ms(20);
        after = server_metric(c, "gddr_checkpoints_total");
    }
    ck_assert_int_eq(after, written + 1);
    /* A request is honoured even with nothing new. */
    ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
    long long req = after;
    for (int i = 0; i < 300 && req == after; i++) {
        gt_sleep_ms(20);
        req = server_metric(c, "gddr_checkpoints_total");
    }
    ck_assert_int_eq(req, after + 1);
    gddr_client_close(&c);
    stop_server(&s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

typedef struct pusher {
    gddr_client *c;
    int id;
    volatile int stop;
    long pushes;
} pusher;

static void *push_loop(void *arg)
{
    pusher *p = arg;
    float g[4] = { 1, 1, 1, 1 }, w[4];
    /* Push, then pull what it made: every push is computed on the newest
     * version, so its staleness is 0. */
    while (!p->stop && gddr_push(p->c, p->id, g, NULL) == GDDR_OK &&
           gddr_pull(p->c, p->id, w, 0, NULL) == GDDR_OK)
        p->pushes++;
    return NULL;
}

/* Runs `gddr-ctl -s EP CMD -i 0.2 -n 3`; returns its stdout (malloc'd). */
static char *run_ctl_loop(const char *ep, const char *cmd)
{
    char bin[512], err[256];
    gt_bin_path(bin, sizeof bin, "gddr-ctl");
    char *argv[] = { bin, "-s", (char *)ep, (char *)cmd, "-i", "0.2", "-n", "3", NULL };
    char *out = NULL;
    int status = 0;
    ck_assert_msg(gt_run_capture(argv, 30000, 0, &out, &status, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gddr-ctl %s failed: %s", cmd, out);
    return out;
}

static char *run_watch(const char *ep)
{
    return run_ctl_loop(ep, "watch");
}

/* gddr-ctl watch: a header and one line per interval. While a worker
 * pushes (each push on the newest version), pushes/s and MB/s in are
 * positive, its staleness 0, one live worker; idle, the push and pull
 * rates are 0, the staleness columns "-", and with no checkpoint_dir the
 * checkpoint age is "-". */
START_TEST(test_ctl_watch)
{
    gt_server s;
    char err[512];
    ck_assert_msg(gt_server_start(&s, NULL, err, sizeof err) == 0, "%s", err);
    pusher p = { client(s.endpoint), 0, 0, 0 };
    float w[4] = { 0 };
    ck_assert_int_eq(gddr_register(p.c, "watched", w, 4, &p.id, NULL), GDDR_OK);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, push_loop, &p), 0);
    char *busy = run_watch(s.endpoint);
    p.stop = 1;
    pthread_join(th, NULL);
    char *idle = run_watch(s.endpoint);
    const char *hdr = "  tpush/s   tpull/s   MB/s in  MB/s out workers stale mean   p95   max   tau  rejected  ckpt age\n";
    ck_assert_msg(strncmp(busy, hdr, strlen(hdr)) == 0, "header: %s", busy);
    ck_assert_msg(strncmp(idle, hdr, strlen(hdr)) == 0, "header: %s", idle);
    int lines = 0, positive = 0;
    for (char *l = strchr(busy, '\n') + 1; *l; l = strchr(l, '\n') + 1, lines++) {
        double pushes, pulls, in, out;
        int workers;
        char mean[16], p95[16], age[16];
        ck_assert_msg(sscanf(l, "%lf %lf %lf %lf %d %15s %15s %*s %*s %*s %15s", &pushes, &pulls,
                             &in, &out, &workers, mean, p95, age) == 8, "line: %s", l);
        ck_assert_int_eq(workers, 1);
        ck_assert_str_eq(age, "-");
        if (pushes > 0) {
            positive++;
            ck_assert_msg(in > 0 && strcmp(p95, "0") == 0 && strcmp(mean, "0.00") == 0, "line: %s", l);
        }
    }
    ck_assert_int_eq(lines, 3);
    ck_assert_msg(positive >= 1 && p.pushes > 0, "no pushes seen while %ld were made:\n%s", p.pushes, busy);
    lines = 0;
    for (char *l = strchr(idle, '\n') + 1; *l; l = strchr(l, '\n') + 1, lines++) {
        /* (MB/s out is not 0: it counts the replies to watch itself.) */
        double pushes, pulls, in;
        int tau;
        char age[16];
        ck_assert_msg(sscanf(l, "%lf %lf %lf %*f 1 - - 0 %d 0 %15s", &pushes, &pulls, &in, &tau,
                             age) == 5, "idle line: %s", l);
        ck_assert_msg(pushes == 0 && pulls == 0 && in < 0.01, "idle line: %s", l);
        ck_assert_str_eq(age, "-");
        ck_assert(tau >= 2 && tau <= 8);
    }
    ck_assert_int_eq(lines, 3);
    free(busy);
    free(idle);
    gddr_client_close(&p.c);
    stop_server(&s);
}
END_TEST


/* gddr-ctl top: a frame per interval, a summary line, a header, a line per
 * worker. Worker 0 keeps pushing (live, pushes/s > 0 in some frame, its
 * pushes and step only grow); worker 1 pushed 3 times at steps 0-2 and
 * closed (left, 3 pushes, step 3, staleness 0: each push on the newest
 * version). */
START_TEST(test_ctl_top)
{
    gt_server s;
    char err[512];
    const char *sets[] = { "max_workers=4", NULL };
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s", err);
    float w[4] = { 0 }, g[4] = { 1, 1, 1, 1 };
    gddr_client *one = client_rank(s.endpoint, 1, 2);
    int id1;
    ck_assert_int_eq(gddr_register(one, "top", w, 4, &id1, NULL), GDDR_OK);
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(gddr_pull(one, id1, w, 0, NULL), GDDR_OK);
        ck_assert_int_eq(gddr_push(one, id1, g, NULL), GDDR_OK);
    }
    gddr_client_close(&one);
    pusher p = { client_rank(s.endpoint, 0, 2), 0, 0, 0 };
    ck_assert_int_eq(gddr_register(p.c, "top", w, 4, &p.id, NULL), GDDR_OK);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, push_loop, &p), 0);
    char *out = run_ctl_loop(s.endpoint, "top");
    p.stop = 1;
    pthread_join(th, NULL);
    int frames = 0, moving = 0;
    double last0 = -1;
    for (char *l = out; l && *l; frames++) {
        int live, dead, left;
        ck_assert_msg(sscanf(l, "workers: %d live, %d dead, %d left;", &live, &dead, &left) == 3,
                      "summary: %s", l);
        ck_assert_msg(live == 1 && dead == 0 && left == 1, "summary: %s", l);
        l = strchr(l, '\n') + 1;
        ck_assert_msg(strncmp(l, "  rank state       step   tpush/s    tpushes   dups stale mean", 62) == 0,
                      "header: %s", l);
        l = strchr(l, '\n') + 1;
        int r0, r1;
        char st0[8], st1[8];
        double step0, rate0, pushes0, step1, rate1, pushes1, dups1, mean1, max1;
        ck_assert_msg(sscanf(l, "%d %7s %lf %lf %lf", &r0, st0, &step0, &rate0, &pushes0) == 5, "row: %s", l);
        l = strchr(l, '\n') + 1;
        ck_assert_msg(sscanf(l, "%d %7s %lf %lf %lf %lf %lf %*f %lf", &r1, st1, &step1, &rate1, &pushes1,
                             &dups1, &mean1, &max1) == 8, "row: %s", l);
        ck_assert_int_eq(r0, 0);
        ck_assert_str_eq(st0, "live");
        ck_assert_msg(pushes0 >= last0 && step0 >= 1, "row 0 went back: %s", out);
        moving += rate0 > 0;
        last0 = pushes0;
        ck_assert_int_eq(r1, 1);
        ck_assert_str_eq(st1, "left");
        ck_assert_msg(step1 == 3 && pushes1 == 3 && rate1 == 0 && dups1 == 0 && mean1 == 0 && max1 == 0,
                      "row 1: %s", out);
        l = strchr(l, '\n');
        if (l)
            l += 1 + (l[1] == '\n'); /* the blank line between frames */
    }
    ck_assert_int_eq(frames, 3);
    ck_assert_msg(moving >= 1 && p.pushes > 0, "no pushes/s while %ld pushes were made:\n%s", p.pushes, out);
    free(out);
    gddr_client_close(&p.c);
    stop_server(&s);
}
END_TEST

Suite *suite_ops(void)
{
    Suite *s = suite_create("ops");
    GT_ADD_CASE(s, "sighup_reload", test_sighup_reload, 30);
    GT_ADD_CASE(s, "metrics_http", test_metrics_http, 30);
    GT_ADD_CASE(s, "heartbeat", test_heartbeat_keeps_idle_worker_alive, 30);
    GT_ADD_CASE(s, "idle_checkpoint", test_idle_checkpoint_skipped, 60);
    GT_ADD_CASE(s, "ctl_watch", test_ctl_watch, 60);
    GT_ADD_CASE(s, "ctl_top", test_ctl_top, 60);
    return s;
}
