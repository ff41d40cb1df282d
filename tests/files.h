/* files.h -- scratch directories, server logs in files, and the metrics a
 * server exports, for the Check tests. Header only (static inline); include
 * after check.h and harness.h.
 *
 *   char dir[64], log[160];
 *   gt_mk_tmpdir(dir, sizeof dir);
 *   snprintf(log, sizeof log, "%s/ps.log", dir);
 *   gt_start_logged(&s, log, sets);          // gddr-ps at log level info
 *   ck_assert(gt_wait_for_text(log, "worker 0 joined", 30000) >= 0);
 *   double v = gt_server_metric(client, "gddr_pushes_total");
 *   gt_wait_metric(client, "gddr_config_reloads_total", 1, 30000);
 *   gt_rm_rf(dir);
 */
#ifndef GDDR_TESTS_FILES_H
#define GDDR_TESTS_FILES_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gddr/gddr.h"
#include "harness.h"
#include "prom.h"

static inline void gt_mk_tmpdir(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/gddr-test-XXXXXX");
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp: %s", strerror(errno));
}

/* A scratch directory and the path of a server log in it. */
static inline void gt_scratch_log(char *dir, size_t dlen, char *log, size_t llen)
{
    gt_mk_tmpdir(dir, dlen);
    snprintf(log, llen, "%s/ps.log", dir);
}

static inline int gt__rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(p);
    return 0;
}

static inline void gt_rm_rf(const char *p)
{
    nftw(p, gt__rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The whole file, NUL-terminated (malloc'd; "" when missing). */
static inline char *gt_slurp_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (f) {
        for (;;) {
            if (len + 4096 + 1 > cap) {
                cap = cap ? cap * 2 : 16384;
                buf = realloc(buf, cap);
                ck_assert_ptr_nonnull(buf);
            }
            size_t n = fread(buf + len, 1, cap - len - 1, f);
            len += n;
            if (n == 0)
                break;
        }
        fclose(f);
    }
    if (!buf)
        buf = calloc(1, 1);
    ck_assert_ptr_nonnull(buf);
    buf[len] = 0;
    return buf;
}

static inline int gt_file_has(const char *path, const char *needle)
{
    char *t = gt_slurp_text(path);
    int yes = strstr(t, needle) != NULL;
    free(t);
    return yes;
}

/* Waits up to timeout_ms for needle to appear in the file; returns the ms
 * waited, or -1. */
static inline int64_t gt_wait_for_text(const char *path, const char *needle, int timeout_ms)
{
    int64_t t0 = gt_now_ms();
    for (;;) {
        if (gt_file_has(path, needle))
            return gt_now_ms() - t0;
        if (gt_now_ms() - t0 > timeout_ms)
            return -1;
        gt_sleep_ms(20);
    }
}

/* The line of the file that contains needle (copied into out), or -1. */
static inline int gt_find_line(const char *path, const char *needle, char *out, size_t outlen)
{
    char *t = gt_slurp_text(path);
    char *p = strstr(t, needle);
    if (!p) {
        free(t);
        return -1;
    }
    while (p > t && p[-1] != '\n')
        p--;
    size_t n = strcspn(p, "\n");
    if (n >= outlen)
        n = outlen - 1;
    memcpy(out, p, n);
    out[n] = 0;
    free(t);
    return 0;
}

/* Starts gddr-ps at log level info with sets (NULL-terminated), its stderr
 * appended to logpath: the parent's fd 2 points at the file just while the
 * server is forked. Fails the test (with the log) when it does not start. */
static inline void gt_start_logged(gt_server *s, const char *logpath, const char *const *sets)
{
    const char *all[GT_MAX_SETS + 1];
    int n = 0;
    all[n++] = "log_level=info";
    for (int i = 0; sets && sets[i] && n < GT_MAX_SETS; i++)
        all[n++] = sets[i];
    all[n] = NULL;
    fflush(NULL);
    int saved = fcntl(2, F_DUPFD_CLOEXEC, 3);
    int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ck_assert_msg(saved >= 0 && fd >= 0, "cannot redirect the server log to %s: %s", logpath,
                  strerror(errno));
    dup2(fd, 2);
    close(fd);
    char err[512] = "";
    int rc = gt_server_start(s, all, err, sizeof err);
    dup2(saved, 2);
    close(saved);
    if (rc != 0) {
        char *log = gt_slurp_text(logpath);
        ck_abort_msg("cannot start gddr-ps: %s\n--- %s ---\n%s", err, logpath, log);
    }
}

/* The value of the unlabelled Prometheus sample `name` in text; NaN when
 * absent. */
static inline double gt_metric_of(const char *text, const char *name)
{
    return gddr__prom_sample(text, name, NAN);
}

/* One metric of the server c talks to (a fresh metrics request). */
static inline double gt_server_metric(gddr_client *c, const char *name)
{
    char *text = NULL;
    int rc = gddr_server_metrics_text(c, &text);
    ck_assert_msg(rc == GDDR_OK, "metrics: %s (%s)", gddr_strerror(rc), gddr_client_errmsg(c));
    double v = gt_metric_of(text, name);
    free(text);
    return v;
}

/* Waits until the metric reaches at least `atleast` (an event the server
 * counts, such as a SIGHUP it has handled), asking every 20 ms for up to
 * timeout_ms; returns the value it reached. */
static inline double gt_wait_metric(gddr_client *c, const char *name, double atleast, int timeout_ms)
{
    int64_t deadline = gt_now_ms() + timeout_ms;
    double v = gt_server_metric(c, name);
    while (!(v >= atleast) && gt_now_ms() < deadline) {
        gt_sleep_ms(20);
        v = gt_server_metric(c, name);
    }
    ck_assert_msg(v >= atleast, "%s is %g after %d ms, expected at least %g", name, v, timeout_ms, atleast);
    return v;
}

/* path replaced by text. */
static inline void gt_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s: %s", path, strerror(errno));
    ck_assert_int_ge(fputs(text, f), 0);
    ck_assert_int_eq(fclose(f), 0);
}

#endif
