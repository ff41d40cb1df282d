/* check_conf.c -- tests of the config engine (common/conf.c) through the
 * gddr-ps key table (server/config.c), plus the shipped example file and
 * the daemon's --check-config.
 *
 * Every assertion is on a computed value: what a key holds after a load,
 * and the exact file name, line number and key an error names. Files are
 * written with mkstemps under /tmp and removed afterwards. The binary test
 * runs build/bin/gddr-ps (or $GDDR_PS_BIN) from the repository root and
 * skips with a reason where it has not been built.
 */
#include "gddr/gddr.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conf.h"
#include "config.h"

#define TAB gddr_ps_conf_table
#define EXAMPLE_INI "config/gddr-ps.ini"
#define PS_BIN_DEFAULT "build/bin/gddr-ps"

/* ---- helpers -------------------------------------------------------------- */

/* Writes text to a fresh /tmp file and returns its path (static storage per
 * slot, so a test can hold two at once). */
static const char *tmp_ini(int slot, const char *text)
{
    static char paths[2][64];
    char *p = paths[slot];
    snprintf(p, sizeof paths[0], "/tmp/gddr-check-conf-XXXXXX.ini");
    int fd = mkstemps(p, 4);
    ck_assert_msg(fd >= 0, "mkstemps: %s", strerror(errno));
    size_t n = strlen(text);
    ck_assert_int_eq(write(fd, text, n), (ssize_t)n);
    ck_assert_int_eq(close(fd), 0);
    return p;
}

static void fmt_key(const gddr__conf_key *k, const void *cfg, char *buf, size_t len)
{
    gddr__conf_format(k, cfg, buf, len);
}

/* Asserts that every key of a and b formats to the same text. */
static void assert_same_config(const gddr_ps_config *a, const gddr_ps_config *b)
{
    for (const gddr__conf_key *k = TAB; k->name; k++) {
        char va[GDDR_CONF_STRMAX + 32], vb[GDDR_CONF_STRMAX + 32];
        fmt_key(k, a, va, sizeof va);
        fmt_key(k, b, vb, sizeof vb);
        ck_assert_msg(strcmp(va, vb) == 0, "[%s] %s: '%s' != '%s'", k->section, k->name, va, vb);
    }
}

/* Loads text as a file through gddr_ps_config_load and expects failure with
 * "path:line:" and each of the needles in the message. */
static void expect_file_error(const char *text, int line, const char *needle1,
                              const char *needle2)
{
    const char *path = tmp_ini(0, text);
    gddr_ps_config cfg;
    char err[1024] = "";
    int rc = gddr_ps_config_load(&cfg, path, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc == -1, "loading %s succeeded:\n%s", path, text);
    char where[128];
    if (line > 0)
        snprintf(where, sizeof where, "%s:%d: ", path, line);
    else
        snprintf(where, sizeof where, "%s: ", path);
    ck_assert_msg(strncmp(err, where, strlen(where)) == 0, "error '%s' does not start with '%s'",
                  err, where);
    if (needle1)
        ck_assert_msg(strstr(err, needle1), "error '%s' lacks '%s'", err, needle1);
    if (needle2)
        ck_assert_msg(strstr(err, needle2), "error '%s' lacks '%s'", err, needle2);
}

/* Finds the line "name = value" (or "name =" for an empty value) in text. */
static const char *find_key_line(const char *text, const char *name)
{
    char needle[128];
    snprintf(needle, sizeof needle, "\n%s =", name);
    for (const char *at = strstr(text, needle); at; at = strstr(at + 1, needle)) {
        char next = at[strlen(needle)];
        if (next == ' ' || next == '\n')
            return at;
    }
    return NULL;
}

/* ---- defaults --------------------------------------------------------------- */

/* Each key, after a load without a file, formats exactly like its table
 * default parsed on its own. */
START_TEST(test_defaults_match_table)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_msg(gddr_ps_config_load(&cfg, NULL, err, sizeof err) == 0, "%s", err);
    int n = 0;
    for (const gddr__conf_key *k = TAB; k->name; k++, n++) {
        gddr_ps_config one;
        memset(&one, 0x5a, sizeof one);
        ck_assert_msg(gddr__conf_set(TAB, &one, k->section, k->name, k->def, err, sizeof err) == 0,
                      "default of %s does not parse: %s", k->name, err);
        char got[GDDR_CONF_STRMAX + 32], want[GDDR_CONF_STRMAX + 32];
        fmt_key(k, &cfg, got, sizeof got);
        fmt_key(k, &one, want, sizeof want);
        ck_assert_msg(strcmp(got, want) == 0, "[%s] %s = '%s', default is '%s'", k->section,
                      k->name, got, want);
    }
    ck_assert_int_ge(n, 30);
}
END_TEST

START_TEST(test_defaults_literal)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_msg(gddr_ps_config_load(&cfg, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(cfg.listen, "tcp://127.0.0.1:5555");
    ck_assert_str_eq(cfg.endpoint_file, "");
    ck_assert_str_eq(cfg.checkpoint_dir, "");
    ck_assert_int_eq(cfg.threads, 2);
    ck_assert_int_eq(cfg.chunk, 1024);
    ck_assert_int_eq(cfg.mode, GDDR_PS_MODE_ASYNC);
    ck_assert_int_eq(cfg.mode, 0);
    ck_assert_double_eq(cfg.lr, 0.1);
    ck_assert_int_eq(cfg.tau_init, 4);
    ck_assert_int_eq(cfg.tau_min, 2);
    ck_assert_int_eq(cfg.tau_max, 8);
    ck_assert_int_eq(cfg.tau_dynamic, 1);
    ck_assert_int_eq(cfg.checkpoint_keep, 3);
    ck_assert_int_eq(cfg.max_message_bytes, 1073741824LL);
}
END_TEST

/* Names are unique across sections (so a NULL section is unambiguous),
 * every row has help and a section, and find agrees with the table. */
START_TEST(test_table_shape)
{
    for (const gddr__conf_key *k = TAB; k->name; k++) {
        ck_assert_msg(k->section && k->section[0], "%s has no section", k->name);
        ck_assert_msg(k->help && k->help[0], "%s has no help", k->name);
        ck_assert_msg(k->def != NULL, "%s has no default", k->name);
        ck_assert_ptr_eq(gddr__conf_find(TAB, NULL, k->name), k);
        ck_assert_ptr_eq(gddr__conf_find(TAB, k->section, k->name), k);
        for (const gddr__conf_key *j = k + 1; j->name; j++)
            ck_assert_msg(strcmp(k->name, j->name) != 0, "key '%s' appears twice", k->name);
    }
    ck_assert_ptr_null(gddr__conf_find(TAB, NULL, "no_such_key"));
    ck_assert_ptr_null(gddr__conf_find(TAB, "optimizer", "threads"));
}
END_TEST

/* ---- reading files ------------------------------------------------------- */

START_TEST(test_file_read_back)
{
    const char *text =
        "; a comment\n"
        "# another comment\n"
        "\n"
        "[server]\n"
        "listen = tcp://127.0.0.1:*\n"
        "threads = 6\n"
        "chunk=4096\n"
        "endpoint_file = /tmp/gddr-endpoint\n"
        "log_level = DEBUG\n"
        "\n"
        "[consistency]\n"
        "mode = ssp\n"
        "staleness_bound = 5\n"
        "worker_timeout_s = 2.5\n"
        "\n"
        "[optimizer]\n"
        "lr = 0.025 ; inline comment\n"
        "momentum = 0.9\n"
        "\n"
        "[tau]\n"
        "tau_dynamic = off\n"
        "tau_min = 1\n"
        "tau_init = 3\n"
        "tau_max = 16\n"
        "\n"
        "[checkpoint]\n"
        "checkpoint_dir = /var/lib/gddr\n"
        "checkpoint_keep = 7\n";
    const char *path = tmp_ini(0, text);
    gddr_ps_config cfg;
    char err[1024] = "";
    int rc = gddr_ps_config_load(&cfg, path, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_str_eq(cfg.listen, "tcp://127.0.0.1:*");
    ck_assert_int_eq(cfg.threads, 6);
    ck_assert_int_eq(cfg.chunk, 4096);
    ck_assert_str_eq(cfg.endpoint_file, "/tmp/gddr-endpoint");
    ck_assert_int_eq(cfg.log_level, 3);
    ck_assert_int_eq(cfg.mode, GDDR_PS_MODE_SSP);
    ck_assert_int_eq(cfg.staleness_bound, 5);
    ck_assert_double_eq(cfg.worker_timeout_s, 2.5);
    ck_assert_double_eq(cfg.lr, 0.025);
    ck_assert_double_eq(cfg.momentum, 0.9);
    ck_assert_int_eq(cfg.tau_dynamic, 0);
    ck_assert_int_eq(cfg.tau_min, 1);
    ck_assert_int_eq(cfg.tau_init, 3);
    ck_assert_int_eq(cfg.tau_max, 16);
    ck_assert_str_eq(cfg.checkpoint_dir, "/var/lib/gddr");
    ck_assert_int_eq(cfg.checkpoint_keep, 7);
    /* Keys the file does not name keep their defaults. */
    ck_assert_int_eq(cfg.max_tensors, 4096);
    ck_assert_double_eq(cfg.staleness_ema_decay, 0.99);
}
END_TEST

/* Each boolean spelling, and the same text through load_string. */
START_TEST(test_bools_and_string_loader)
{
    static const struct { const char *v; int want; } cases[] = {
        { "true", 1 }, { "yes", 1 }, { "on", 1 }, { "1", 1 }, { "TRUE", 1 },
        { "false", 0 }, { "no", 0 }, { "off", 0 }, { "0", 0 }, { "Off", 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gddr_ps_config cfg;
        char err[512] = "", text[128];
        ck_assert_int_eq(gddr_ps_config_load(&cfg, NULL, err, sizeof err), 0);
        cfg.tau_dynamic = !cases[i].want;
        snprintf(text, sizeof text, "[tau]\ntau_dynamic = %s\n", cases[i].v);
        ck_assert_msg(gddr__conf_load_string(TAB, &cfg, text, "s.ini", err, sizeof err) == 0,
                      "%s", err);
        ck_assert_msg(cfg.tau_dynamic == cases[i].want, "'%s' read as %d", cases[i].v,
                      cfg.tau_dynamic);
    }
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(gddr_ps_config_load(&cfg, NULL, err, sizeof err), 0);
    ck_assert_int_eq(gddr__conf_load_string(TAB, &cfg, "[tau]\n\ntau_dynamic = maybe\n",
                                            "s.ini", err, sizeof err), -1);
    ck_assert_msg(strncmp(err, "s.ini:3: ", 9) == 0 && strstr(err, "'tau_dynamic'"), "%s", err);
}
END_TEST

/* ---- errors name file, line and key ---------------------------------------- */

START_TEST(test_bad_values)
{
    expect_file_error("[server]\nthreads = many\n", 2, "'threads'", "many");
    expect_file_error("; comment\n\n[server]\nlisten = tcp://127.0.0.1:1\nthreads = 0\n", 5,
                      "'threads'", "out of range");
    expect_file_error("[server]\nthreads = 257\n", 2, "'threads'", "out of range");
    expect_file_error("[server]\nthreads = 4x\n", 2, "'threads'", NULL);
    expect_file_error("[server]\nthreads =\n", 2, "'threads'", NULL);
    expect_file_error("[server]\nthreads = 2\n[optimizer]\nlr = -1\n", 4, "'lr'", "out of range");
    expect_file_error("[optimizer]\nlr = nan\n", 2, "'lr'", NULL);
    expect_file_error("[optimizer]\nlr = inf\n", 2, "'lr'", NULL);
    expect_file_error("[optimizer]\nlr = 0.1.2\n", 2, "'lr'", NULL);
    expect_file_error("[consistency]\n\n\nmode = fast\n", 4, "'mode'", "async");
    expect_file_error("[server]\nlog_level = loud\n", 2, "'log_level'", "debug");
    expect_file_error("[tau]\ntau_dynamic = maybe\n", 2, "'tau_dynamic'", NULL);
    expect_file_error("[checkpoint]\ncheckpoint_keep = 0\n", 2, "'checkpoint_keep'", NULL);
}
END_TEST

/* Only the first error is reported, whichever kind it is. */
START_TEST(test_first_error_wins)
{
    expect_file_error("[server]\nthreads = many\nchunk = lots\n", 2, "'threads'", NULL);
    expect_file_error("[server]\nthreads = many\nnot a key value line\n", 2, "'threads'", NULL);
    expect_file_error("[server]\nnot a key value line\nthreads = many\n", 2, "syntax", NULL);
}
END_TEST

START_TEST(test_unknown_key_and_section)
{
    expect_file_error("[server]\nthreads = 2\nthreadz = 3\n", 3, "'threadz'", "[server]");
    expect_file_error("[server]\nthreads = 2\n[nosuch]\nthreads = 3\n", 4, "'threads'",
                      "[nosuch]");
    /* A real key in the wrong (but existing) section is unknown there. */
    expect_file_error("[optimizer]\nthreads = 3\n", 2, "'threads'", "[optimizer]");
    /* A key before any section header. */
    expect_file_error("threads = 3\n", 1, "'threads'", NULL);
}
END_TEST

START_TEST(test_syntax_error)
{
    expect_file_error("[server]\nthreads = 2\nthis line has no equals sign\n", 3, "syntax", NULL);
    expect_file_error("[server\nthreads = 2\n", 1, "syntax", NULL);
}
END_TEST

/* Cross-key validation names the key (and the file, without a line). */
START_TEST(test_cross_key)
{
    expect_file_error("[tau]\ntau_min = 6\ntau_max = 4\ntau_init = 5\n", 0, "'tau_min'", NULL);
    expect_file_error("[tau]\ntau_init = 9\n", 0, "'tau_init'", NULL);
    expect_file_error("[tau]\ntau_init = 1\n", 0, "'tau_init'", NULL);
    expect_file_error("[tau]\ntau_rate_low = 0.9\ntau_rate_high = 0.5\n", 0, "'tau_rate_low'",
                      NULL);
    expect_file_error("[consistency]\nworkers = 2\nsync_quorum = 3\n", 0, "'sync_quorum'", NULL);
    expect_file_error("[server]\nlisten = udp://127.0.0.1:5555\n", 0, "'listen'", NULL);
    expect_file_error("[server]\nshard_index = 2\nshard_count = 2\n", 0, "'shard_index'", "shard_count 2");
    expect_file_error("[server]\nshard_index = 1\n", 0, "'shard_index'", NULL);
    /* The boundaries themselves are valid. */
    gddr_ps_config cfg;
    char err[512] = "";
    const char *path = tmp_ini(0, "[tau]\ntau_min = 3\ntau_init = 3\ntau_max = 3\n");
    int rc = gddr_ps_config_load(&cfg, path, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_int_eq(cfg.tau_init, 3);
    /* validate() on its own, without a path, still names the key. */
    cfg.tau_init = 99;
    ck_assert_int_eq(gddr_ps_config_validate(&cfg, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "'tau_init'"), "%s", err);
}
END_TEST

START_TEST(test_set)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(gddr_ps_config_load(&cfg, NULL, err, sizeof err), 0);
    ck_assert_msg(gddr__conf_set(TAB, &cfg, NULL, "threads", "7", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(cfg.threads, 7);
    ck_assert_msg(gddr__conf_set(TAB, &cfg, NULL, "lr", "0.003", err, sizeof err) == 0, "%s", err);
    ck_assert_double_eq(cfg.lr, 0.003);
    ck_assert_msg(gddr__conf_set(TAB, &cfg, NULL, "mode", "sync", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(cfg.mode, GDDR_PS_MODE_SYNC);
    ck_assert_msg(gddr__conf_set(TAB, &cfg, NULL, "checkpoint_dir", "/srv/ck", err, sizeof err) == 0,
                  "%s", err);
    ck_assert_str_eq(cfg.checkpoint_dir, "/srv/ck");
    ck_assert_msg(gddr__conf_set(TAB, &cfg, "server", "chunk", "64", err, sizeof err) == 0, "%s",
                  err);
    ck_assert_int_eq(cfg.chunk, 64);

    /* Failures leave the field alone and name the key. */
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "threads", "many", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "'threads'"), "%s", err);
    ck_assert_int_eq(cfg.threads, 7);
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "nope", "1", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "'nope'"), "%s", err);
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, "optimizer", "chunk", "8", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "'chunk'"), "%s", err);
    ck_assert_int_eq(cfg.chunk, 64);
    char longv[GDDR_CONF_STRMAX + 10];
    memset(longv, 'x', sizeof longv - 1);
    longv[sizeof longv - 1] = 0;
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "endpoint_file", longv, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "'endpoint_file'"), "%s", err);
}
END_TEST

/* ---- dump and round trip ------------------------------------------------- */

/* Dumps cfg to a file, then loads that file into a zeroed struct: every key
 * must come back from the dump alone, identical. */
static void round_trip(const gddr_ps_config *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *ms = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(ms);
    gddr__conf_dump(TAB, cfg, ms);
    ck_assert_int_eq(fclose(ms), 0);
    for (const gddr__conf_key *k = TAB; k->name; k++)
        ck_assert_msg(find_key_line(buf, k->name), "dump lacks key %s", k->name);
    const char *path = tmp_ini(1, buf);
    gddr_ps_config back;
    memset(&back, 0, sizeof back);
    char err[1024] = "";
    int rc = gddr__conf_load(TAB, &back, path, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc == 0, "dump does not re-parse: %s\n%s", err, buf);
    assert_same_config(cfg, &back);
    ck_assert_int_eq(gddr_ps_config_validate(&back, "dump", err, sizeof err), 0);
    free(buf);
}

START_TEST(test_dump_round_trip_defaults)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(gddr_ps_config_load(&cfg, NULL, err, sizeof err), 0);
    round_trip(&cfg);
}
END_TEST

START_TEST(test_dump_round_trip_changed)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(gddr_ps_config_load(&cfg, NULL, err, sizeof err), 0);
    static const char *const sets[][2] = {
        { "listen", "ipc:///tmp/gddr.sock" }, { "endpoint_file", "/run/gddr/endpoint" },
        { "threads", "13" }, { "max_message_bytes", "9000000000" }, { "log_level", "warn" },
        { "metrics_listen", "tcp://127.0.0.1:9464" }, { "mode", "sync" },
        { "workers", "8" }, { "sync_quorum", "6" }, { "worker_timeout_s", "0.30000000000000004" },
        { "lr", "1e-7" }, { "adadelay", "0.3333333333333333" }, { "momentum", "0.9" },
        { "max_grad_norm", "1e30" }, { "staleness_ema_decay", "0.999999" },
        { "tau_dynamic", "no" }, { "tau_min", "1" }, { "tau_max", "1000" },
        { "tau_init", "17" }, { "tau_ema", "0.123456789012345678" },
        { "checkpoint_dir", "/var/lib/gddr/ckpt dir" }, { "checkpoint_interval_s", "2.5e6" },
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        ck_assert_msg(gddr__conf_set(TAB, &cfg, NULL, sets[i][0], sets[i][1], err, sizeof err) == 0,
                      "%s", err);
    ck_assert_int_eq(gddr_ps_config_validate(&cfg, NULL, err, sizeof err), 0);
    round_trip(&cfg);
}
END_TEST

START_TEST(test_missing_file)
{
    const char *path = "/tmp/gddr-check-conf-does-not-exist/x.ini";
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(gddr_ps_config_load(&cfg, path, err, sizeof err), -1);
    ck_assert_msg(strstr(err, path) && strstr(err, "cannot open"), "%s", err);
}
END_TEST

/* ---- the shipped example ------------------------------------------------- */

/* config/gddr-ps.ini loads cleanly, sets every key of the table (loading it
 * into a zeroed struct yields exactly the defaults), and names each key on a
 * "key = value" line of its own. */
START_TEST(test_example_ini)
{
    gddr_ps_config cfg, defaults, only_file;
    char err[1024] = "";
    ck_assert_msg(gddr_ps_config_load(&cfg, EXAMPLE_INI, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(gddr_ps_config_load(&defaults, NULL, err, sizeof err), 0);
    assert_same_config(&cfg, &defaults);

    memset(&only_file, 0, sizeof only_file);
    ck_assert_msg(gddr__conf_load(TAB, &only_file, EXAMPLE_INI, err, sizeof err) == 0, "%s", err);
    assert_same_config(&only_file, &defaults);

    FILE *f = fopen(EXAMPLE_INI, "r");
    ck_assert_ptr_nonnull(f);
    char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    for (const gddr__conf_key *k = TAB; k->name; k++) {
        const char *at = find_key_line(text, k->name);
        ck_assert_msg(at, "%s does not set %s", EXAMPLE_INI, k->name);
        /* The nearest section header above the key is the key's own. */
        const char *hdr = NULL;
        for (const char *p = strstr(text, "\n["); p && p < at; p = strstr(p + 1, "\n["))
            hdr = p + 2;
        size_t sl = strlen(k->section);
        ck_assert_msg(hdr && strncmp(hdr, k->section, sl) == 0 && hdr[sl] == ']',
                      "%s: %s is not under [%s]", EXAMPLE_INI, k->name, k->section);
    }
}
END_TEST

/* ---- the daemon's --check-config ------------------------------------------- */

/* Runs argv with stdout and stderr captured (up to cap bytes each), waiting
 * at most timeout_s. Returns the exit status, or -1 if killed by a signal or
 * the timeout. */
static int run_capture(char *const argv[], char *out, char *errb, size_t cap, int timeout_s)
{
    int po[2], pe[2];
    ck_assert_int_eq(pipe(po), 0);
    ck_assert_int_eq(pipe(pe), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]); close(po[1]); close(pe[0]); close(pe[1]);
        int dn = open("/dev/null", O_RDONLY);
        if (dn >= 0)
            dup2(dn, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    size_t no = 0, ne = 0;
    struct pollfd fds[2] = { { po[0], POLLIN, 0 }, { pe[0], POLLIN, 0 } };
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int open_fds = 2, timed_out = 0;
    while (open_fds > 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = timeout_s * 1000L - ((now.tv_sec - t0.tv_sec) * 1000L +
                                         (now.tv_nsec - t0.tv_nsec) / 1000000L);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        int r = poll(fds, 2, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        ck_assert_int_ge(r, 0);
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char *dst = i ? errb : out;
            size_t *used = i ? &ne : &no;
            char tmp[4096];
            ssize_t got = read(fds[i].fd, tmp, sizeof tmp);
            if (got <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
                continue;
            }
            size_t take = (size_t)got;
            if (take > cap - 1 - *used)
                take = cap - 1 - *used;
            memcpy(dst + *used, tmp, take);
            *used += take;
        }
    }
    out[no] = 0;
    errb[ne] = 0;
    if (timed_out)
        kill(pid, SIGKILL);
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0)
            close(fds[i].fd);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (timed_out || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

START_TEST(test_binary_check_config)
{
    const char *bin = getenv("GDDR_PS_BIN");
    if (!bin || !*bin)
        bin = PS_BIN_DEFAULT;
    if (access(bin, X_OK) != 0) {
        printf("SKIP gddr-ps binary not built (%s)\n", bin);
        return;
    }
    char out[8192], errb[8192], want[256];

    /* A bad value on line 3: exit 1, one FATAL line naming file:line:key. */
    const char *bad = tmp_ini(0, "[server]\nthreads = 4\nchunk = huge\n");
    char *argv_bad[] = { (char *)bin, "--check-config", "-c", (char *)bad, NULL };
    int rc = run_capture(argv_bad, out, errb, sizeof out, 20);
    unlink(bad);
    ck_assert_msg(rc == 1, "exit %d for a bad file; stderr: %s", rc, errb);
    snprintf(want, sizeof want, "gddr-ps: FATAL CONFIG ERROR: %s:3: ", bad);
    ck_assert_msg(strstr(errb, want), "stderr lacks '%s': %s", want, errb);
    ck_assert_msg(strstr(errb, "'chunk'"), "stderr lacks the key: %s", errb);

    /* A syntax error is fatal the same way. */
    bad = tmp_ini(0, "[server]\nthreads 4\n");
    char *argv_syn[] = { (char *)bin, "--check-config", "-c", (char *)bad, NULL };
    rc = run_capture(argv_syn, out, errb, sizeof out, 20);
    unlink(bad);
    ck_assert_msg(rc == 1, "exit %d for a syntax error; stderr: %s", rc, errb);
    snprintf(want, sizeof want, "FATAL CONFIG ERROR: %s:2: ", bad);
    ck_assert_msg(strstr(errb, want), "stderr lacks '%s': %s", want, errb);

    /* A good file: exit 0 and nothing fatal. */
    const char *good = tmp_ini(0, "[server]\nthreads = 4\n[tau]\ntau_init = 5\n");
    char *argv_good[] = { (char *)bin, "--check-config", "-c", (char *)good, NULL };
    rc = run_capture(argv_good, out, errb, sizeof out, 20);
    unlink(good);
    ck_assert_msg(rc == 0, "exit %d for a good file; stderr: %s", rc, errb);
    ck_assert_msg(!strstr(errb, "FATAL"), "%s", errb);

    /* The shipped example is valid too. */
    char *argv_ex[] = { (char *)bin, "--check-config", "-c", EXAMPLE_INI, NULL };
    rc = run_capture(argv_ex, out, errb, sizeof out, 20);
    ck_assert_msg(rc == 0, "exit %d for %s; stderr: %s", rc, EXAMPLE_INI, errb);
}
END_TEST

/* ---- long lines and leading zeros ---- */
#if 1
/* inih reads at most INI_MAX_LINE (200) bytes a line. A value that could
 * not be read back from a file is refused when set, a file line that long
 * is refused with its line number, and anything shorter round-trips. */
START_TEST(test_long_value_round_trip)
{
    gddr_ps_config cfg;
    char err[1024] = "", v[240];
    ck_assert_int_eq(gddr_ps_config_load(&cfg, NULL, err, sizeof err), 0);
    snprintf(v, sizeof v, "/var/lib/gddr/");
    memset(v + strlen(v), 'd', sizeof v - 1 - strlen(v));
    v[sizeof v - 1] = 0;
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "checkpoint_dir", v, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "checkpoint_dir") && strstr(err, "longer"), "err: %s", err);
    v[170] = 0;
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "checkpoint_dir", v, err, sizeof err), 0);
    round_trip(&cfg);

    char text[600];
    memset(v, 'x', sizeof v - 1);
    v[sizeof v - 1] = 0;
    snprintf(text, sizeof text, "[server]\nthreads = 3\nlisten = tcp://%s\nchunk = 64\n", v);
    ck_assert_int_eq(gddr__conf_load_string(TAB, &cfg, text, "long.ini", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "long.ini:3:") && strstr(err, "longer"), "err: %s", err);
}
END_TEST

/* strtoll base 0 reads "010" as octal 8. */
START_TEST(test_leading_zero_is_decimal)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(gddr_ps_config_load(&cfg, NULL, err, sizeof err), 0);
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "threads", "010", err, sizeof err), 0);
    ck_assert_int_eq(cfg.threads, 10);
}
END_TEST
#endif

/* The client's [client] table: the example file parses and holds exactly
 * the library's defaults, and a bad value names file, line and key. */
int gddr__opts_from_ini(const char *path, gddr_client_opts *o, char *strbuf, size_t buflen,
                        char *err, size_t errlen);

START_TEST(test_client_ini)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    char sbuf[256], err[512] = "";
    ck_assert_msg(gddr__opts_from_ini("config/gddr-client.ini", &o, sbuf, sizeof sbuf, err,
                                      sizeof err) == GDDR_OK, "err: %s", err);
    const gddr_client_opts d = GDDR_CLIENT_OPTS_INIT;
    ck_assert_str_eq(o.server, "tcp://127.0.0.1:5555");
    ck_assert_int_eq(o.rank, d.rank);
    ck_assert_int_eq(o.timeout_ms, d.timeout_ms);
    ck_assert_int_eq(o.reconnect_timeout_ms, d.reconnect_timeout_ms);
    ck_assert(o.clip_norm == d.clip_norm && o.dc_lambda == d.dc_lambda);
    ck_assert_int_eq(o.dc_mode, d.dc_mode);
    ck_assert_int_eq(o.dc_adaptive, d.dc_adaptive);
    ck_assert(o.dc_ms_decay == d.dc_ms_decay && o.delay_fraction == d.delay_fraction);
    ck_assert(o.replay_decay == d.replay_decay);
    ck_assert_int_eq(o.residual_checkpoint_steps, d.residual_checkpoint_steps);
    ck_assert_int_eq(o.heartbeat_ms, d.heartbeat_ms);
    ck_assert_uint_eq(o.seed, d.seed);
    ck_assert_uint_eq(o.part_bytes, d.part_bytes);
    ck_assert_int_eq(o.accumulate_steps, d.accumulate_steps);
    ck_assert(o.pull_delay_fraction == d.pull_delay_fraction);

    /* A file that sets nothing but the server gives the library's defaults
     * (the table's defaults and GDDR_CLIENT_OPTS_INIT agree). */
    char path0[] = "/tmp/gddr-client-XXXXXX";
    int fd0 = mkstemp(path0);
    ck_assert_int_ge(fd0, 0);
    const char *least = "[client]\nserver = tcp://127.0.0.1:1\n";
    ck_assert_int_eq(write(fd0, least, strlen(least)), (ssize_t)strlen(least));
    close(fd0);
    gddr_client_opts z = GDDR_CLIENT_OPTS_INIT;
    z.seed = 1, z.part_bytes = 1, z.heartbeat_ms = 1, z.delay_fraction = 0.5;
    int rc0 = gddr__opts_from_ini(path0, &z, sbuf, sizeof sbuf, err, sizeof err);
    unlink(path0);
    ck_assert_msg(rc0 == GDDR_OK, "err: %s", err);
    ck_assert_uint_eq(z.seed, d.seed);
    ck_assert_uint_eq(z.part_bytes, d.part_bytes);
    ck_assert_int_eq(z.heartbeat_ms, d.heartbeat_ms);
    ck_assert(z.delay_fraction == d.delay_fraction);

    /* servers (a sharded model) wins over server. */
    char path1[] = "/tmp/gddr-client-XXXXXX";
    int fd1 = mkstemp(path1);
    ck_assert_int_ge(fd1, 0);
    const char *two = "[client]\nserver = tcp://127.0.0.1:3\nservers = tcp://127.0.0.1:1, tcp://127.0.0.1:2\n";
    ck_assert_int_eq(write(fd1, two, strlen(two)), (ssize_t)strlen(two));
    close(fd1);
    int rc1 = gddr__opts_from_ini(path1, &z, sbuf, sizeof sbuf, err, sizeof err);
    unlink(path1);
    ck_assert_msg(rc1 == GDDR_OK, "err: %s", err);
    ck_assert_str_eq(z.server, "tcp://127.0.0.1:1, tcp://127.0.0.1:2");

    char path[] = "/tmp/gddr-client-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *bad = "[client]\nserver = tcp://127.0.0.1:1\ndelay_fraction = 1.5\n";
    ck_assert_int_eq(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
    close(fd);
    int rc = gddr__opts_from_ini(path, &o, sbuf, sizeof sbuf, err, sizeof err);
    unlink(path);
    ck_assert_int_eq(rc, GDDR_ECONFIG);
    ck_assert_msg(strstr(err, ":3:") && strstr(err, "delay_fraction"), "err: %s", err);
}
END_TEST

Suite *suite_conf(void)
{
    Suite *s = suite_create("conf");
    TCase *tc = tcase_create("conf");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_defaults_match_table);
    tcase_add_test(tc, test_defaults_literal);
    tcase_add_test(tc, test_table_shape);
    tcase_add_test(tc, test_file_read_back);
    tcase_add_test(tc, test_bools_and_string_loader);
    tcase_add_test(tc, test_bad_values);
    tcase_add_test(tc, test_first_error_wins);
    tcase_add_test(tc, test_unknown_key_and_section);
    tcase_add_test(tc, test_syntax_error);
    tcase_add_test(tc, test_cross_key);
    tcase_add_test(tc, test_set);
    tcase_add_test(tc, test_dump_round_trip_defaults);
    tcase_add_test(tc, test_dump_round_trip_changed);
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_example_ini);
    tcase_add_test(tc, test_client_ini);
#if 1 /* these were known bugs; fixed in conf.c */
    tcase_add_test(tc, test_long_value_round_trip);
    tcase_add_test(tc, test_leading_zero_is_decimal);
#endif
    suite_add_tcase(s, tc);

    TCase *bin = tcase_create("binary");
    tcase_set_timeout(bin, 90);
    tcase_add_test(bin, test_binary_check_config);
    suite_add_tcase(s, bin);
    return s;
}
