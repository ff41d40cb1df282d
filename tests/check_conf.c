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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client_conf.h"
#include "conf.h"
#include "config.h"
#include "numparse.h"

/* client/src/options.c */
int gddr__opts_from_ini(const char *path, gddr_client_opts *o, gddr__client_slot *slots, char *err,
                        size_t errlen);

#define TAB ps_conf_table
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

/* Loads text as a file through ps_config_load and expects failure with
 * "path:line:" and each of the needles in the message. */
static void expect_file_error(const char *text, int line, const char *needle1,
                              const char *needle2)
{
    const char *path = tmp_ini(0, text);
    gddr_ps_config cfg;
    char err[1024] = "";
    int rc = ps_config_load(&cfg, path, err, sizeof err);
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
    ck_assert_msg(ps_config_load(&cfg, NULL, err, sizeof err) == 0, "%s", err);
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
    ck_assert_msg(ps_config_load(&cfg, NULL, err, sizeof err) == 0, "%s", err);
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
    int rc = ps_config_load(&cfg, path, err, sizeof err);
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
        ck_assert_int_eq(ps_config_load(&cfg, NULL, err, sizeof err), 0);
        cfg.tau_dynamic = !cases[i].want;
        snprintf(text, sizeof text, "[tau]\ntau_dynamic = %s\n", cases[i].v);
        ck_assert_msg(gddr__conf_load_string(TAB, &cfg, text, "s.ini", err, sizeof err) == 0,
                      "%s", err);
        ck_assert_msg(cfg.tau_dynamic == cases[i].want, "'%s' read as %d", cases[i].v,
                      cfg.tau_dynamic);
    }
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(ps_config_load(&cfg, NULL, err, sizeof err), 0);
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
    /* ... and says where the key lives. */
    expect_file_error("[server]\nchunk = 8\n[optimizer]\nthreads = 3\n", 4,
                      "unknown key 'threads' in section [optimizer]: it is in [server]", NULL);
}
END_TEST

/* A key set twice is refused with both lines (the second would silently
 * win otherwise), even with the same value, and in the client's table too. */
START_TEST(test_duplicate_key)
{
    expect_file_error("[optimizer]\nlr = 0.1\nmomentum = 0.5\n\nlr = 0.2\n", 5,
                      "key 'lr' is set twice in [optimizer], first on line 2", NULL);
    expect_file_error("[server]\nthreads = 2\n[tau]\ntau_min = 2\n[server]\nthreads = 2\n", 6,
                      "'threads' is set twice", "first on line 2");
    const char *path = tmp_ini(0, "[client]\nserver = tcp://127.0.0.1:1\nseed = 1\nseed = 2\n");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    static gddr__client_slot sbuf[GDDR_CONF_MAXKEYS];
    char err[512] = "", want[160];
    int rc = gddr__opts_from_ini(path, &o, sbuf, err, sizeof err);
    unlink(path);
    ck_assert_int_eq(rc, GDDR_ECONFIG);
    snprintf(want, sizeof want, "%s:4: key 'seed' is set twice in [client], first on line 3", path);
    ck_assert_msg(strstr(err, want), "err: %s", err);
}
END_TEST

START_TEST(test_syntax_error)
{
    expect_file_error("[server]\nthreads = 2\nthis line has no equals sign\n", 3, "syntax", NULL);
    expect_file_error("[server\nthreads = 2\n", 1, "syntax", NULL);
}
END_TEST

/* Cross-key validation names the key, the file and the line that set it
 * (and where the other key came from). */
START_TEST(test_cross_key)
{
    expect_file_error("[tau]\ntau_min = 6\ntau_max = 4\ntau_init = 5\n", 2, "'tau_min'",
                      "(tau_max on line 3)");
    expect_file_error("[tau]\ntau_init = 9\n", 2, "'tau_init'", NULL);
    expect_file_error("[tau]\ntau_init = 1\n", 2, "'tau_init'", NULL);
    expect_file_error("[tau]\ntau_rate_low = 0.9\ntau_rate_high = 0.5\n", 2, "'tau_rate_low'",
                      "(tau_rate_high on line 3)");
    expect_file_error("[consistency]\nworkers = 2\nsync_quorum = 3\n", 3, "'sync_quorum'",
                      "(workers on line 2)");
    expect_file_error("[server]\nthreads = 2\nlisten = udp://127.0.0.1:5555\n", 3, "'listen'", NULL);
    expect_file_error("[server]\nshard_index = 2\nshard_count = 2\n", 2, "'shard_index'", "shard_count 2 (shard_count on line 3)");
    expect_file_error("[server]\nshard_index = 1\n", 2, "'shard_index'", "(shard_count by default)");
    /* The other key is a default: the error is on the line of the one set. */
    expect_file_error("[consistency]\n\nsync_quorum = 1\n[security]\nauthorized_keys = /x\n", 5,
                      "'authorized_keys'", NULL);
    /* A key from --set is named as such, over the file's line. */
    {
        const char *path = tmp_ini(0, "[tau]\ntau_min = 3\n");
        gddr_ps_config c;
        char e[512] = "";
        ck_assert_int_eq(ps_config_read(&c, path, e, sizeof e), 0);
        unlink(path);
        ck_assert_int_eq(ps_config_apply_override(&c, "tau.tau_max=2", e, sizeof e), 0);
        ck_assert_int_eq(ps_config_validate(&c, path, e, sizeof e), -1);
        char want[160];
        snprintf(want, sizeof want, "%s:2: key 'tau_min': 3 is above tau_max 2 (tau_max from --set)", path);
        ck_assert_str_eq(e, want);
    }
    /* The boundaries themselves are valid. */
    gddr_ps_config cfg;
    char err[512] = "";
    const char *path = tmp_ini(0, "[tau]\ntau_min = 3\ntau_init = 3\ntau_max = 3\n");
    int rc = ps_config_load(&cfg, path, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_int_eq(cfg.tau_init, 3);
    /* validate() on its own, without a path, still names the key. */
    cfg.tau_init = 99;
    ck_assert_int_eq(ps_config_validate(&cfg, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "'tau_init'"), "%s", err);
}
END_TEST

/* --set KEY=VALUE: each type of key is set from text; a bad value, an
 * unknown key or one in another section leaves the field alone and the
 * error names the key. */
START_TEST(test_set_one_key_or_name_it)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(ps_config_load(&cfg, NULL, err, sizeof err), 0);
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
    ck_assert_str_eq(err, "unknown key 'chunk' in section [optimizer]: it is in [server]");
    ck_assert_int_eq(ps_config_apply_override(&cfg, "optimizer.threads=1", err, sizeof err), -1);
    ck_assert_str_eq(err, "--set: unknown key 'threads' in section [optimizer]: it is in [server]");
    ck_assert_int_eq(ps_config_apply_override(&cfg, "optimizer.nope=1", err, sizeof err), -1);
    ck_assert_str_eq(err, "--set: unknown key 'nope' in section [optimizer]");
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
    ck_assert_int_eq(ps_config_validate(&back, "dump", err, sizeof err), 0);
    free(buf);
}

START_TEST(test_dump_round_trip_defaults)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(ps_config_load(&cfg, NULL, err, sizeof err), 0);
    round_trip(&cfg);
}
END_TEST

START_TEST(test_dump_round_trip_changed)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(ps_config_load(&cfg, NULL, err, sizeof err), 0);
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
    ck_assert_int_eq(ps_config_validate(&cfg, NULL, err, sizeof err), 0);
    round_trip(&cfg);
}
END_TEST

/* A whole number is dumped as one: "worker_timeout_s = 10", not 1e+01. */
START_TEST(test_dump_whole_numbers)
{
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(ps_config_load(&cfg, NULL, err, sizeof err), 0);
    ck_assert_int_eq(ps_config_apply_override(&cfg, "lr=1e6", err, sizeof err), 0);
    ck_assert_int_eq(ps_config_apply_override(&cfg, "checkpoint_interval_s=2.5e6", err, sizeof err), 0);
    ck_assert_int_eq(ps_config_apply_override(&cfg, "max_grad_norm=1e30", err, sizeof err), 0);
    ck_assert_int_eq(ps_config_apply_override(&cfg, "adadelay=0.00001", err, sizeof err), 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *ms = open_memstream(&buf, &len);
    gddr__conf_dump(TAB, &cfg, ms);
    fclose(ms);
    static const char *const want[] = { "\nworker_timeout_s = 10\n", "\nlr = 1000000\n",
                                        "\ncheckpoint_interval_s = 2500000\n", "\nmax_grad_norm = 1e+30\n",
                                        "\nadadelay = 1e-05\n", "\ntau_ema = 0.9\n" };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(buf, want[i]), "dump lacks '%s'", want[i] + 1);
    free(buf);
    round_trip(&cfg);
}
END_TEST

/* What --check-config checks on disk: checkpoint_dir a writable directory
 * or one the daemon can make (its parent exists), endpoint_file's directory,
 * the key files readable; the error names the file, line and key. */
START_TEST(test_check_paths)
{
    char dir[] = "/tmp/gddr-check-paths-XXXXXX", text[512], want[512], err[1024];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    gddr_ps_config cfg;
    struct { const char *body; int line; const char *key, *needle; } bad[] = {
        { "[checkpoint]\n\ncheckpoint_dir = %s/no/such\n", 3, "checkpoint_dir", "/no: No such file or directory" },
        { "[checkpoint]\ncheckpoint_dir = %s/file\n", 2, "checkpoint_dir", "/file is not a directory" },
        { "[server]\nthreads = 2\nendpoint_file = %s/no/ep\n", 3, "endpoint_file", "/no: No such file" },
        { "[server]\nlisten = ipc://%s/no/sock\n", 2, "listen", "/no: No such file" },
        { "[security]\ncurve_secret_key_file = %s/none.key\nauthorized_keys = %s/file\n", 2,
          "curve_secret_key_file", "cannot read" },
    };
    char file[128];
    snprintf(file, sizeof file, "%s/file", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, bad[i].body, dir, dir);
        const char *path = tmp_ini(0, text);
        ck_assert_msg(ps_config_load(&cfg, path, err, sizeof err) == 0, "%s", err);
        int rc = ps_config_check_paths(&cfg, path, err, sizeof err);
        unlink(path);
        ck_assert_msg(rc == -1, "accepted:\n%s", text);
        snprintf(want, sizeof want, "%s:%d: key '%s': ", path, bad[i].line, bad[i].key);
        ck_assert_msg(strncmp(err, want, strlen(want)) == 0 && strstr(err, bad[i].needle),
                      "error '%s' is not '%s...%s'", err, want, bad[i].needle);
    }
    /* Good: an existing directory, one the daemon will make, the files. */
    snprintf(text, sizeof text,
             "[server]\nendpoint_file = %s/ep\n[checkpoint]\ncheckpoint_dir = %s/new\n"
             "[security]\ncurve_secret_key_file = %s/file\nauthorized_keys = %s/file\n",
             dir, dir, dir, dir);
    const char *path = tmp_ini(0, text);
    ck_assert_msg(ps_config_load(&cfg, path, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(ps_config_check_paths(&cfg, path, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(ps_config_apply_override(&cfg, "checkpoint_dir=/", err, sizeof err), 0);
    ck_assert_msg(ps_config_check_paths(&cfg, path, err, sizeof err) == 0, "%s", err);
    unlink(path);
    unlink(file);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* Under systemd, LoadCredential=curve_secret_key_file:PATH: the daemon takes
 * $CREDENTIALS_DIRECTORY/curve_secret_key_file over the file's path, and
 * --set still wins over both. */
START_TEST(test_curve_credential)
{
    char dir[] = "/tmp/gddr-check-cred-XXXXXX", cred[128], err[1024], w[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cred, sizeof cred, "%s/%s", dir, GDDR_PS_CURVE_CREDENTIAL);
    const char *path = tmp_ini(0, "[security]\ncurve_secret_key_file = /etc/gddr/server.key\n"
                                  "authorized_keys = /etc/gddr/authorized_keys\n");
    gddr_ps_config cfg;
    setenv("CREDENTIALS_DIRECTORY", dir, 1);
    /* No such credential: the file's path stands. */
    ck_assert_msg(ps_config_load(&cfg, path, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(cfg.curve_secret_key_file, "/etc/gddr/server.key");
    FILE *f = fopen(cred, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_msg(ps_config_load(&cfg, path, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(cfg.curve_secret_key_file, cred);
    ck_assert_str_eq(ps_config_where(&cfg, path, "curve_secret_key_file", w, sizeof w),
                     "credential curve_secret_key_file");
    ck_assert_int_eq(ps_config_apply_override(&cfg, "curve_secret_key_file=/k", err, sizeof err), 0);
    ck_assert_str_eq(cfg.curve_secret_key_file, "/k");
    ck_assert_str_eq(ps_config_where(&cfg, path, "curve_secret_key_file", w, sizeof w), "--set");
    unsetenv("CREDENTIALS_DIRECTORY");
    ck_assert_msg(ps_config_load(&cfg, path, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(cfg.curve_secret_key_file, "/etc/gddr/server.key");
    unlink(path);
    unlink(cred);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(test_missing_file)
{
    const char *path = "/tmp/gddr-check-conf-does-not-exist/x.ini";
    gddr_ps_config cfg;
    char err[512] = "";
    ck_assert_int_eq(ps_config_load(&cfg, path, err, sizeof err), -1);
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
    ck_assert_msg(ps_config_load(&cfg, EXAMPLE_INI, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(ps_config_load(&defaults, NULL, err, sizeof err), 0);
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
/* When set, the child's JOURNAL_STREAM names its stderr pipe, as systemd
 * does for a service whose stderr is the journal. */
static int capture_as_journal;

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
        struct stat sb;
        char js[64];
        if (capture_as_journal && fstat(2, &sb) == 0) {
            snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)sb.st_dev,
                     (unsigned long long)sb.st_ino);
            setenv("JOURNAL_STREAM", js, 1);
        } else {
            unsetenv("JOURNAL_STREAM");
        }
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

/* The gddr-ps to run ($GDDR_PS_BIN or the build's); NULL, after saying
 * SKIP, when it has not been built. */
static const char *ps_bin(void)
{
    const char *bin = getenv("GDDR_PS_BIN");
    bin = bin && *bin ? bin : PS_BIN_DEFAULT;
    if (access(bin, X_OK) == 0)
        return bin;
    printf("SKIP gddr-ps binary not built (%s)\n", bin);
    return NULL;
}

/* Numbers are read whole and decimal: hexadecimal, trailing text, a comma
 * for a point are refused (strtod read 0x10 as 16; atoi read "two" as 0). */
START_TEST(test_numbers_whole)
{
    expect_file_error("[optimizer]\nlr = 0x10\n", 2, "'lr'", "decimal");
    expect_file_error("[optimizer]\nlr = 0,1\n", 2, "'lr'", "decimal");
    expect_file_error("[optimizer]\nlr = 1e-1x\n", 2, "'lr'", NULL);
    long long i;
    double d;
    char why[160];
    ck_assert_int_eq(gddr__parse_int("42", 0, 100, &i, why, sizeof why), 0);
    ck_assert_int_eq(i, 42);
    ck_assert_int_eq(gddr__parse_int("two", 0, 100, &i, why, sizeof why), -1);
    ck_assert_int_eq(gddr__parse_int("1e4", 0, 100000, &i, why, sizeof why), -1);
    ck_assert_int_eq(gddr__parse_int("5s", 0, 100, &i, why, sizeof why), -1);
    ck_assert_int_eq(gddr__parse_int("", 0, 100, &i, why, sizeof why), -1);
    ck_assert_int_eq(gddr__parse_int("101", 0, 100, &i, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "out of range"), "%s", why);
    ck_assert_int_eq(gddr__parse_num("0.4", 0, 1, &d, why, sizeof why), 0);
    ck_assert(d == 0.4);
    ck_assert_int_eq(gddr__parse_num("1e-3", 0, 1, &d, why, sizeof why), 0);
    ck_assert(d == 1e-3);
    ck_assert_int_eq(gddr__parse_num("0,4", 0, 1, &d, why, sizeof why), -1);
    ck_assert_int_eq(gddr__parse_num("0x10", 0, 100, &d, why, sizeof why), -1);
    ck_assert_int_eq(gddr__parse_num("inf", -HUGE_VAL, HUGE_VAL, &d, why, sizeof why), -1);
    ck_assert_int_eq(gddr__parse_num("nan", -HUGE_VAL, HUGE_VAL, &d, why, sizeof why), -1);
}
END_TEST

/* The tools refuse a malformed number naming the flag (exit 2), and say
 * who they are. */
START_TEST(test_tool_flags)
{
    const char *ps = ps_bin();
    if (!ps)
        return;
    char dir[512], train[600], ctl[600], out[8192], errb[8192];
    snprintf(dir, sizeof dir, "%s", ps);
    *strrchr(dir, '/') = 0;
    snprintf(train, sizeof train, "%s/gddr-train", dir);
    snprintf(ctl, sizeof ctl, "%s/gddr-ctl", dir);
    static const char *bad[][2] = { { "--rank", "two" }, { "--steps", "1e4" }, { "--delay-fraction", "0,4" },
                                    { "--timeout-ms", "5s" }, { "--world", "-1" }, { "--lr-typo", "1" },
                                    { "--pull-delta-bits", "12" }, { "--rank", "4" } };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        /* (--world 4 too: --rank 4 is then refused before any data is read) */
        char *argv[] = { train, "--server", "tcp://127.0.0.1:1", "--world", "4", (char *)bad[k][0],
                         (char *)bad[k][1], NULL };
        int rc = run_capture(argv, out, errb, sizeof out, 20);
        ck_assert_msg(rc == 2, "gddr-train %s %s: exit %d; stderr: %s", bad[k][0], bad[k][1], rc, errb);
        if (strcmp(bad[k][0], "--lr-typo") != 0)
            ck_assert_msg(strstr(errb, bad[k][0]), "gddr-train %s %s: stderr does not name the flag: %s",
                          bad[k][0], bad[k][1], errb);
    }
    char *ctl_bad[] = { ctl, "-s", "tcp://127.0.0.1:1", "-t", "5s", "status", NULL };
    ck_assert_int_eq(run_capture(ctl_bad, out, errb, sizeof out, 20), 2);
    ck_assert_msg(strstr(errb, "-t"), "%s", errb);
    char *ctl_i[] = { ctl, "-s", "tcp://127.0.0.1:1", "watch", "-i", "1,5", NULL };
    ck_assert_int_eq(run_capture(ctl_i, out, errb, sizeof out, 20), 2);
    char *ctl_help[] = { ctl, "--help", NULL };
    ck_assert_int_eq(run_capture(ctl_help, out, errb, sizeof out, 20), 0);
    ck_assert_msg(strstr(out, "--timeout-ms"), "%s", out);
    char *ctl_ver[] = { ctl, "--version", NULL };
    ck_assert_int_eq(run_capture(ctl_ver, out, errb, sizeof out, 20), 0);
    ck_assert_msg(strncmp(out, "gddr-ctl ", 9) == 0, "%s", out);
    char *train_ver[] = { train, "--version", NULL };
    ck_assert_int_eq(run_capture(train_ver, out, errb, sizeof out, 20), 0);
    ck_assert_msg(strncmp(out, "gddr-train ", 11) == 0, "%s", out);
}
END_TEST

START_TEST(test_binary_check_config)
{
    const char *bin = ps_bin();
    if (!bin)
        return;
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

/* README's configuration reference is exactly what the tables print
 * (`make config-table` rewrites it). */
START_TEST(test_readme_table)
{
    const char *bin = ps_bin();
    if (!bin)
        return;
    static char out[65536], errb[8192], readme[262144];
    char *argv[] = { (char *)bin, "--dump-config", "--markdown", NULL };
    ck_assert_int_eq(run_capture(argv, out, errb, sizeof out, 20), 0);
    /* Every key of both tables has its row. */
    const gddr__conf_key *tabs[] = { TAB, gddr__client_conf_keys() };
    for (int t = 0; t < 2; t++)
        for (const gddr__conf_key *k = tabs[t]; k->name; k++) {
            char row[128];
            snprintf(row, sizeof row, "\n| `%s` | `", k->name);
            ck_assert_msg(strstr(out, row), "the table lacks %s", k->name);
        }
    FILE *f = fopen("README.md", "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(readme, 1, sizeof readme - 1, f);
    fclose(f);
    readme[n] = 0;
    char *begin = strstr(readme, "\n<!-- config-table begin");
    char *end = begin ? strstr(begin, "\n<!-- config-table end -->") : NULL;
    ck_assert_msg(begin && end, "README.md has no config-table markers");
    begin = strchr(begin + 1, '\n') + 1;
    end[1] = 0;
    ck_assert_msg(strcmp(begin, out) == 0,
                  "README.md's configuration table differs from the key tables: run `make config-table`");
}
END_TEST

/* --detach prints the endpoint once the server listens and leaves it
 * running (pid file, endpoint file the same); a stale endpoint file is
 * removed at start; a server that cannot start makes --detach fail. */
START_TEST(test_detach)
{
    const char *bin = ps_bin();
    if (!bin)
        return;
    char dir[] = "/tmp/gddr-check-detach-XXXXXX", pidf[96], epf[96], out[4096], errb[8192];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(pidf, sizeof pidf, "%s/ps.pid", dir);
    snprintf(epf, sizeof epf, "%s/ep", dir);
    FILE *f = fopen(epf, "w");
    fputs("tcp://127.0.0.1:1\n", f); /* an old run's */
    fclose(f);
    /* Cannot bind: exit 1, nothing on stdout, and the stale file is gone.
     * (stderr goes to a file: the detached server keeps it open, and a
     * pipe would not end while it runs.) */
    char cmd[1024], logf[96];
    snprintf(logf, sizeof logf, "%s/log", dir);
    snprintf(cmd, sizeof cmd, "exec '%s' --listen tcp://192.0.2.1:5 --endpoint-file '%s' --detach "
             "--pid-file '%s' 2> '%s'", bin, epf, pidf, logf);
    char *argv_bad[] = { "/bin/sh", "-c", cmd, NULL };
    int rc = run_capture(argv_bad, out, errb, sizeof out, 30);
    f = fopen(logf, "r");
    ck_assert_ptr_nonnull(f);
    errb[fread(errb, 1, sizeof errb - 1, f)] = 0;
    fclose(f);
    ck_assert_msg(rc == 1, "exit %d; stderr: %s", rc, errb);
    ck_assert_str_eq(out, "");
    ck_assert_msg(strstr(errb, "cannot start: --set: key 'listen': cannot bind tcp://192.0.2.1:5") &&
                  strstr(errb, "gddr-ps: the server did not start (exit status 1)"), "%s", errb);
    ck_assert_int_eq(access(epf, F_OK), -1);
    ck_assert_int_eq(access(pidf, F_OK), -1);

    snprintf(cmd, sizeof cmd, "exec '%s' --listen 'tcp://127.0.0.1:*' --endpoint-file '%s' --detach "
             "--pid-file '%s' --set log_level=warn 2> '%s'", bin, epf, pidf, logf);
    char *argv[] = { "/bin/sh", "-c", cmd, NULL };
    rc = run_capture(argv, out, errb, sizeof out, 30);
    ck_assert_msg(rc == 0, "exit %d; stderr: %s", rc, errb);
    ck_assert_msg(strncmp(out, "tcp://127.0.0.1:", 16) == 0 && atoi(out + 16) > 0 &&
                  strchr(out, '\n') == out + strlen(out) - 1, "stdout: '%s'", out);
    char ep[256], line[256] = "";
    snprintf(ep, sizeof ep, "%.*s", (int)strlen(out) - 1, out);
    f = fopen(epf, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    fclose(f);
    ck_assert_str_eq(line, out);
    f = fopen(pidf, "r");
    ck_assert_ptr_nonnull(f);
    long pid = 0;
    ck_assert_int_eq(fscanf(f, "%ld", &pid), 1);
    fclose(f);
    ck_assert_int_eq(kill((pid_t)pid, 0), 0);
    /* It serves on that endpoint. */
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 10000;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w[4] = { 1, 2, 3, 4 }, back[4];
    int id;
    ck_assert_int_eq(gddr_register(c, "detach.w", w, 4, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull(c, id, back, 0, NULL), GDDR_OK);
    ck_assert(memcmp(w, back, sizeof w) == 0);
    gddr_client_close(&c);
    /* SIGTERM stops it; it removes its pid file on the way out. */
    ck_assert_int_eq(kill((pid_t)pid, SIGTERM), 0);
    int gone = 0;
    for (int i = 0; i < 300 && !gone; i++) {
        gone = access(pidf, F_OK) != 0;
        if (!gone)
            usleep(50 * 1000);
    }
    ck_assert_msg(gone, "the detached server (pid %ld) did not stop within 15 s", pid);
    unlink(epf);
    unlink(logf);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* Under systemd (JOURNAL_STREAM names stderr) each line starts with its
 * syslog priority and has no time of its own; elsewhere it has a time. */
START_TEST(test_journal_lines)
{
    const char *bin = ps_bin();
    if (!bin)
        return;
    char out[4096], errb[8192];
    char *argv[] = { (char *)bin, "--listen", "tcp://192.0.2.1:5", NULL };
    capture_as_journal = 1;
    int rc = run_capture(argv, out, errb, sizeof out, 30);
    capture_as_journal = 0;
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strncmp(errb, "<3>gddr-ps[error] cannot start: --set: key 'listen': cannot bind", 64) == 0,
                  "stderr: %s", errb);
    rc = run_capture(argv, out, errb, sizeof out, 30);
    ck_assert_int_eq(rc, 1);
    int hh, mm, ss, ms;
    char rest[64];
    ck_assert_msg(sscanf(errb, "%2d:%2d:%2d.%3d %63[^ ]", &hh, &mm, &ss, &ms, rest) == 5 &&
                  strcmp(rest, "gddr-ps[error]") == 0, "stderr: %s", errb);
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
    ck_assert_int_eq(ps_config_load(&cfg, NULL, err, sizeof err), 0);
    snprintf(v, sizeof v, "/var/lib/gddr/");
    memset(v + strlen(v), 'd', sizeof v - 1 - strlen(v));
    v[sizeof v - 1] = 0;
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "checkpoint_dir", v, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "checkpoint_dir") && strstr(err, "longer"), "err: %s", err);
    /* The limit the message names is the real one: "checkpoint_dir = "
     * plus the value plus a newline is the longest line inih reads (199). */
    const gddr__conf_key *ck = gddr__conf_find(TAB, NULL, "checkpoint_dir");
    ck_assert_uint_eq(gddr__conf_strmax(ck), 199 - strlen("checkpoint_dir = ") - 1);
    v[gddr__conf_strmax(ck) + 1] = 0;
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "checkpoint_dir", v, err, sizeof err), -1);
    char want[128];
    snprintf(want, sizeof want, "key 'checkpoint_dir': value is %zu characters, longer than the %zu this key takes",
             strlen(v), gddr__conf_strmax(ck));
    ck_assert_str_eq(err, want);
    v[gddr__conf_strmax(ck)] = 0; /* exactly the limit: taken, and read back from a file */
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "checkpoint_dir", v, err, sizeof err), 0);
    round_trip(&cfg);
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
    ck_assert_int_eq(ps_config_load(&cfg, NULL, err, sizeof err), 0);
    ck_assert_int_eq(gddr__conf_set(TAB, &cfg, NULL, "threads", "010", err, sizeof err), 0);
    ck_assert_int_eq(cfg.threads, 10);
}
END_TEST
#endif

/* The client's [client] table: the example file parses and holds exactly
 * the library's defaults, and a bad value names file, line and key. */
START_TEST(test_client_ini)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    static gddr__client_slot sbuf[GDDR_CONF_MAXKEYS];
    char err[512] = "";
    ck_assert_msg(gddr__opts_from_ini("config/gddr-client.ini", &o, sbuf, err, sizeof err) == GDDR_OK,
                  "err: %s", err);
    const gddr_client_opts d = GDDR_CLIENT_OPTS_INIT;
    ck_assert_str_eq(o.server, "tcp://127.0.0.1:5555");
    /* Every other field the file sets is the library's default (the rows
     * of common/client_conf.c drive both). */
    for (const gddr__client_opt *r = gddr__client_opts_table; r->name; r++)
        if (r->offset != GDDR_OPT_NOFIELD && strcmp(r->name, "server") != 0)
            ck_assert_msg(!gddr__client_opt_differs(r, &o, &d), "config/gddr-client.ini: %s is not the "
                          "library's default", r->name);

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
    int rc0 = gddr__opts_from_ini(path0, &z, sbuf, err, sizeof err);
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
    int rc1 = gddr__opts_from_ini(path1, &z, sbuf, err, sizeof err);
    unlink(path1);
    ck_assert_msg(rc1 == GDDR_OK, "err: %s", err);
    ck_assert_str_eq(z.server, "tcp://127.0.0.1:1, tcp://127.0.0.1:2");

    char path[] = "/tmp/gddr-client-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *bad = "[client]\nserver = tcp://127.0.0.1:1\ndelay_fraction = 1.5\n";
    ck_assert_int_eq(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
    close(fd);
    int rc = gddr__opts_from_ini(path, &o, sbuf, err, sizeof err);
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
    tcase_add_test(tc, test_set_one_key_or_name_it);
    tcase_add_test(tc, test_dump_round_trip_defaults);
    tcase_add_test(tc, test_dump_round_trip_changed);
    tcase_add_test(tc, test_dump_whole_numbers);
    tcase_add_test(tc, test_duplicate_key);
    tcase_add_test(tc, test_check_paths);
    tcase_add_test(tc, test_curve_credential);
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_example_ini);
    tcase_add_test(tc, test_client_ini);
    tcase_add_test(tc, test_numbers_whole);
#if 1 /* these were known bugs; fixed in conf.c */
    tcase_add_test(tc, test_long_value_round_trip);
    tcase_add_test(tc, test_leading_zero_is_decimal);
#endif
    suite_add_tcase(s, tc);

    TCase *bin = tcase_create("binary");
    tcase_set_timeout(bin, 90);
    tcase_add_test(bin, test_binary_check_config);
    tcase_add_test(bin, test_tool_flags);
    tcase_add_test(bin, test_readme_table);
    tcase_add_test(bin, test_detach);
    tcase_add_test(bin, test_journal_lines);
    suite_add_tcase(s, bin);
    return s;
}
