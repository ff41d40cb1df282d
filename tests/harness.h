/* harness.h -- run real gddr-ps (and other) processes from Check tests.
 *
 * Header-only (every function is static inline) so any tests/check_*.c may
 * include it; the Makefile only compiles tests/check_*.c and run_checks.c.
 *
 *   gt_server s;
 *   const char *sets[] = { "lr=0.5", "chunk=64", NULL };
 *   ck_assert_int_eq(gt_server_start(&s, sets, errbuf, sizeof errbuf), 0);
 *   ... connect to s.endpoint ...
 *   int status;
 *   gt_server_stop(&s, 5000, &status);
 *
 * The server is $GDDR_BIN/gddr-ps (GDDR_BIN defaults to "build/bin", so
 * tests run from the repository root) started with
 *   --listen 'tcp://127.0.0.1:*' --endpoint-file DIR/endpoint --set log_level=warn
 * followed by one --set per string the test gives (later ones win, so a test
 * may pass "log_level=debug"). GDDR_TEST_SERVER_LOG=LEVEL changes the default
 * level. The endpoint file lives in a mkdtemp() directory that is removed as
 * soon as the endpoint has been read.
 *
 * Cleanup when a test fails: Check runs each test in a forked child and a
 * failed assertion _exit()s it, so nothing in the test runs afterwards. Every
 * process started here therefore gets PR_SET_PDEATHSIG = SIGKILL: when the
 * test process dies (failure, Check's timeout) the server dies with it. Call
 * the gt_* functions from the thread that will live longest (the test's main
 * thread): the death signal follows the thread that forked.
 *
 * Every wait is bounded; nothing here calls exit() or Check's assertions.
 */
#ifndef GDDR_TESTS_HARNESS_H
#define GDDR_TESTS_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GT_MAX_SETS 48
#define GT_START_TIMEOUT_MS 10000

typedef struct gt_server {
    pid_t pid;          /* 0 when not running */
    char endpoint[256]; /* e.g. tcp://127.0.0.1:41234 */
    char dir[64];       /* the mkdtemp() dir; empty once removed */
} gt_server;

static inline int64_t gt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void gt_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static inline void gt_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void gt_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The folder of the built programs: $GDDR_BIN, else build/bin. */
static inline const char *gt_bin_dir(void)
{
    const char *b = getenv("GDDR_BIN");
    return b && b[0] ? b : "build/bin";
}

/* Path of a built program into buf. */
static inline const char *gt_bin_path(char *buf, size_t len, const char *prog)
{
    snprintf(buf, len, "%s/%s", gt_bin_dir(), prog);
    return buf;
}

/* Waits up to timeout_ms for pid to exit. Returns 1 and fills *status when
 * it did, 0 when it is still running, -1 on a waitpid error. */
static inline int gt_wait_pid(pid_t pid, int timeout_ms, int *status)
{
    int64_t deadline = gt_now_ms() + timeout_ms;
    int delay = 1;
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            if (status)
                *status = st;
            return 1;
        }
        if (r < 0 && errno != EINTR)
            return -1;
        if (gt_now_ms() >= deadline)
            return 0;
        gt_sleep_ms(delay);
        if (delay < 20)
            delay *= 2;
    }
}

/* In the child between fork and exec: only async-signal-safe calls. */
static inline void gt_child_setup(pid_t parent, int stdout_fd, int quiet_stderr)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) /* the parent died before prctl took effect */
        _exit(127);
    /* Check may run tests with signals blocked or ignored; give the child
     * default dispositions so SIGTERM/SIGINT behave as in production. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0)
        dup2(devnull, 0);
    if (stdout_fd >= 0)
        dup2(stdout_fd, 1);
    if (quiet_stderr && devnull >= 0)
        dup2(devnull, 2);
}

/* Starts gddr-ps. sets: NULL-terminated list of "key=value" (or NULL);
 * an entry "@PATH" passes the config file PATH.
 * Returns 0 with s filled, -1 with err explaining. Waits (bounded) until the
 * server wrote its endpoint file, i.e. until it listens. */
static inline int gt_server_start(gt_server *s, const char *const *sets, char *err,
                                  size_t errlen)
{
    memset(s, 0, sizeof *s);
    char bin[512], epfile[128], loglevel[64];
    gt_bin_path(bin, sizeof bin, "gddr-ps");
    if (access(bin, X_OK) != 0) {
        gt_errf(err, errlen, "%s is not an executable (run make, or set GDDR_BIN)", bin);
        return -1;
    }
    snprintf(s->dir, sizeof s->dir, "/tmp/gddr-test-ps-XXXXXX");
    if (!mkdtemp(s->dir)) {
        gt_errf(err, errlen, "mkdtemp: %s", strerror(errno));
        s->dir[0] = 0;
        return -1;
    }
    snprintf(epfile, sizeof epfile, "%s/endpoint", s->dir);
    const char *lvl = getenv("GDDR_TEST_SERVER_LOG");
    snprintf(loglevel, sizeof loglevel, "log_level=%s", lvl && lvl[0] ? lvl : "warn");

    /* argv is built before fork: the child only execs. */
    char *argv[8 + 2 * GT_MAX_SETS];
    int a = 0;
    argv[a++] = bin;
    argv[a++] = "--listen";
    argv[a++] = "tcp://127.0.0.1:*";
    argv[a++] = "--endpoint-file";
    argv[a++] = epfile;
    argv[a++] = "--set";
    argv[a++] = loglevel;
    for (int i = 0; sets && sets[i]; i++) {
        if (i >= GT_MAX_SETS) {
            gt_errf(err, errlen, "more than %d --set arguments", GT_MAX_SETS);
            rmdir(s->dir);
            s->dir[0] = 0;
            return -1;
        }
        /* "@FILE" passes a config file (-c FILE) instead of a --set. */
        argv[a++] = sets[i][0] == '@' ? "-c" : "--set";
        argv[a++] = (char *)(sets[i][0] == '@' ? sets[i] + 1 : sets[i]);
    }
    argv[a] = NULL;

    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        gt_errf(err, errlen, "fork: %s", strerror(errno));
        rmdir(s->dir);
        s->dir[0] = 0;
        return -1;
    }
    if (pid == 0) {
        gt_child_setup(parent, -1, 0);
        execv(bin, argv);
        _exit(127);
    }
    s->pid = pid;

    int64_t deadline = gt_now_ms() + GT_START_TIMEOUT_MS;
    for (;;) {
        FILE *f = fopen(epfile, "r");
        if (f) {
            char line[256] = "";
            char *ok = fgets(line, sizeof line, f);
            fclose(f);
            line[strcspn(line, "\r\n")] = 0;
            /* The server writes FILE.tmp and renames it, so a present file
             * is complete. */
            if (ok && line[0]) {
                snprintf(s->endpoint, sizeof s->endpoint, "%s", line);
                break;
            }
        }
        int st;
        if (gt_wait_pid(pid, 0, &st) == 1) {
            s->pid = 0;
            gt_errf(err, errlen, "gddr-ps exited before listening (%s %d)",
                    WIFEXITED(st) ? "status" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            unlink(epfile);
            rmdir(s->dir);
            s->dir[0] = 0;
            return -1;
        }
        if (gt_now_ms() >= deadline) {
            kill(pid, SIGKILL);
            gt_wait_pid(pid, 5000, NULL);
            s->pid = 0;
            gt_errf(err, errlen, "gddr-ps wrote no endpoint file within %d ms",
                    GT_START_TIMEOUT_MS);
            unlink(epfile);
            rmdir(s->dir);
            s->dir[0] = 0;
            return -1;
        }
        gt_sleep_ms(5);
    }
    /* Nothing else lives there: remove it now, so a failing test (which
     * never reaches its cleanup) leaves no litter behind. */
    unlink(epfile);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", epfile);
    unlink(tmp);
    rmdir(s->dir);
    s->dir[0] = 0;
    return 0;
}

/* Sends sig to a running server (e.g. SIGHUP, or SIGTERM without waiting). */
static inline int gt_server_signal(gt_server *s, int sig)
{
    return s->pid > 0 ? kill(s->pid, sig) : -1;
}

/* Stops a server: SIGTERM, then waits up to timeout_ms; SIGKILL (and a
 * further bounded wait) when it did not exit. *status (may be NULL)
 * receives the waitpid status. Returns 0 when it exited after SIGTERM, 1
 * when it had to be killed, -1 when there was nothing to stop or it could
 * not be reaped. NULL-safe and idempotent. */
static inline int gt_server_stop(gt_server *s, int timeout_ms, int *status)
{
    if (!s || s->pid <= 0)
        return -1;
    int st = 0, rc;
    kill(s->pid, SIGTERM);
    int w = gt_wait_pid(s->pid, timeout_ms, &st);
    if (w == 1) {
        rc = 0;
    } else {
        kill(s->pid, SIGKILL);
        rc = gt_wait_pid(s->pid, 5000, &st) == 1 ? 1 : -1;
    }
    if (status)
        *status = st;
    s->pid = 0;
    return rc;
}

/* Runs argv[0] (a path) with argv, stdout captured into *out (malloc'd,
 * NUL-terminated; the caller frees it), stderr inherited (or discarded when
 * quiet_stderr). Waits up to timeout_ms, then SIGKILLs it. Returns 0 when
 * the program exited within the time (*status holds the waitpid status),
 * 1 when it was killed for the timeout, -1 on a setup error (err says). */
static inline int gt_run_capture(char *const argv[], int timeout_ms, int quiet_stderr, char **out,
                                 int *status, char *err, size_t errlen)
{
    *out = NULL;
    if (status)
        *status = 0;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        gt_errf(err, errlen, "pipe: %s", strerror(errno));
        return -1;
    }
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        gt_errf(err, errlen, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        gt_child_setup(parent, fds[1], quiet_stderr);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    int64_t deadline = gt_now_ms() + timeout_ms;
    int timed_out = 0, eof = 0;
    while (!eof) {
        int64_t left = deadline - gt_now_ms();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = { fds[0], POLLIN, 0 };
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        if (buf && len + 1024 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                break; /* out of memory: keep what we have */
            }
            buf = nb;
            cap *= 2;
        }
        if (!buf)
            break;
        ssize_t n = read(fds[0], buf + len, 1023);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            eof = 1;
            break;
        }
        len += (size_t)n;
    }
    close(fds[0]);
    int st = 0, rc;
    int left = (int)(deadline - gt_now_ms());
    if (!timed_out && gt_wait_pid(pid, left > 0 ? left : 0, &st) == 1) {
        rc = 0;
    } else {
        kill(pid, SIGKILL);
        gt_wait_pid(pid, 5000, &st);
        rc = 1;
        gt_errf(err, errlen, "%s did not finish within %d ms", argv[0], timeout_ms);
    }
    if (buf)
        buf[len] = 0;
    *out = buf;
    if (status)
        *status = st;
    return rc;
}

/* Finds the last line of text that starts with "RESULT " and copies the
 * value of field `key` (in "key=value" tokens, space separated) into val.
 * Returns 0 when found, -1 otherwise. */
static inline int gt_result_field(const char *text, const char *key, char *val, size_t vlen)
{
    if (!text || !key)
        return -1;
    const char *line = NULL;
    for (const char *p = text; p && *p;) {
        if (strncmp(p, "RESULT ", 7) == 0)
            line = p;
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    if (!line)
        return -1;
    size_t klen = strlen(key);
    const char *end = strchr(line, '\n');
    if (!end)
        end = line + strlen(line);
    const char *p = line + 7;
    while (p < end) {
        while (p < end && *p == ' ')
            p++;
        const char *tok = p;
        while (p < end && *p != ' ')
            p++;
        if ((size_t)(p - tok) > klen && strncmp(tok, key, klen) == 0 && tok[klen] == '=') {
            size_t n = (size_t)(p - tok) - klen - 1;
            if (n >= vlen)
                n = vlen - 1;
            memcpy(val, tok + klen + 1, n);
            val[n] = 0;
            return 0;
        }
    }
    return -1;
}

/* gt_result_field() parsed as a double; -1 when absent or not a number. */
static inline int gt_result_double(const char *text, const char *key, double *v)
{
    char buf[64], *end;
    if (gt_result_field(text, key, buf, sizeof buf) < 0)
        return -1;
    errno = 0;
    double d = strtod(buf, &end);
    if (end == buf || *end || errno)
        return -1;
    *v = d;
    return 0;
}

/* Adds test fn as its own test case with a timeout in seconds, so one slow
 * or hung case cannot eat another's time. */
#define GT_ADD_CASE(s, name, fn, secs)                                        \
    do {                                                                      \
        TCase *tc_ = tcase_create(name);                                      \
        tcase_set_timeout(tc_, (secs));                                       \
        tcase_add_test(tc_, fn);                                              \
        suite_add_tcase((s), tc_);                                            \
    } while (0)

/* Starts gddr-ps with the given "key=value" settings or fails the test. */
#define START_SERVER(s, ...)                                                  \
    do {                                                                      \
        const char *sets_[] = { __VA_ARGS__, NULL };                          \
        char e_[512] = "";                                                    \
        int rc_ = gt_server_start(&(s), sets_, e_, sizeof e_);                \
        ck_assert_msg(rc_ == 0, "cannot start gddr-ps: %s", e_);              \
    } while (0)

/* SIGTERM, and the server must exit 0 within 5 s. */
static inline void stop_server(gt_server *s)
{
    int st = 0;
    int rc = gt_server_stop(s, 5000, &st);
    ck_assert_msg(rc == 0, "gddr-ps did not exit within 5 s of SIGTERM (rc %d)", rc);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gddr-ps ended with %s %d",
                  WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* Bitwise comparison of two float vectors, naming the first difference. */
static inline void assert_same_floats(const float *got, const float *want, size_t n,
                                      const char *what)
{
    if (memcmp(got, want, n * sizeof(float)) == 0)
        return;
    size_t i = 0;
    while (i < n && memcmp(&got[i], &want[i], sizeof(float)) == 0)
        i++;
    ck_abort_msg("%s: element %zu of %zu is %.9g, expected %.9g (bitwise)", what, i, n,
                 (double)got[i], (double)want[i]);
}

#endif
