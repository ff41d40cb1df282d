/* check_rows.c -- sparse tables through libgddr-client (client/src/rows.c,
 * shard_rows.c): gddr_table_register, gddr_pull_rows, gddr_push_rows.
 *
 *   rows_values_as_documented  one server, SGD: initial values of the
 *                              documented formula's range, repeated keys
 *                              in a push summed, inference pulls create
 *                              nothing, re-registration by key
 *   rows_sync_three_equal_one  two workers, sync, Adam rows with random
 *                              keys: three servers (rows split by key) end
 *                              with every row bit-identical to one server
 *   rows_opts_size_checked     a gddr_table_opts from a newer header is
 *                              refused; a NULL one takes the defaults
 *   rows_answers_are_not_restarts  an observer's E_NOKEY is final (no
 *                              reconnect loop); a sync pull that timed out
 *                              before the step fails instead of returning
 *                              the rows from before it
 */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gddr/gddr.h"
#include "files.h"
#include "harness.h"
#include "suites.h"

static gddr_client *open_worker(const char *ep, int rank, int world)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = 30000;
    o.heartbeat_ms = 0;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    ck_assert_msg(rc == GDDR_OK, "open %s as rank %d: %s", ep, rank, gddr_strerror(rc));
    return c;
}

START_TEST(test_rows_values)
{
    gt_server s;
    START_SERVER(s, "lr=0.5");
    gddr_client *c = open_worker(s.endpoint, 0, 1);
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    to.init = GDDR_TINIT_UNIFORM;
    to.init_scale = 0.5f;
    to.init_seed = 11;
    int t, t2;
    ck_assert_int_eq(gddr_table_register(c, "emb", 4, &to, &t), GDDR_OK);
    ck_assert_int_eq(gddr_table_register(c, "emb", 4, &to, &t2), GDDR_OK);
    ck_assert_int_eq(t2, t);
    ck_assert_int_eq(gddr_table_register(c, "emb", 5, &to, &t2), GDDR_ELENGTH);

    uint64_t keys[4] = { 7, UINT64_MAX, 7, 0 };
    float w0[16], w1[16], g[16];
    uint64_t v = 99;
    ck_assert_int_eq(gddr_pull_rows(c, t, keys, 4, w0, 0, 0, &v), GDDR_OK);
    ck_assert_uint_eq(v, 0);
    for (int i = 0; i < 16; i++)
        ck_assert_msg(w0[i] >= -0.5f && w0[i] < 0.5f, "initial value %g outside [-0.5, 0.5)", w0[i]);
    ck_assert_int_eq(memcmp(w0, w0 + 8, 16), 0); /* key 7 twice: one row */
    /* ... sent once: the server saw 3 keys of this pull (rows pulled). */
    char *t0 = NULL;
    ck_assert_int_eq(gddr_server_metrics_text(c, &t0), GDDR_OK);
    ck_assert_msg(strstr(t0, "gddr_table_rows_pulled_total{table=\"emb\"} 3\n") != NULL, "%s", t0);
    free(t0);
    ck_assert_msg(memcmp(w0, w0 + 4, 16) != 0, "two keys read the same initial row");
    /* Key 7 twice in a push: its two gradients are summed (one step). */
    for (int i = 0; i < 16; i++)
        g[i] = (float)(i % 4 + 1);
    ck_assert_int_eq(gddr_push_rows(c, t, keys, 4, g, &v), GDDR_OK);
    ck_assert_uint_eq(v, 1);
    ck_assert_int_eq(gddr_pull_rows(c, t, keys, 4, w1, 0, 0, &v), GDDR_OK);
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 4; j++) {
            float sum = keys[r] == 7 ? 2.0f * g[j] : g[r * 4 + j];
            float want = w0[r * 4 + j] - 0.5f * sum;
            ck_assert_msg(w1[r * 4 + j] == want, "row %d value %d: %.9g, expected %.9g", r, j,
                          (double)w1[r * 4 + j], (double)want);
        }
    /* Inference: an unknown key reads as zeros and creates nothing. */
    uint64_t unk[2] = { 7, 123456789 };
    float wi[8];
    ck_assert_int_eq(gddr_pull_rows(c, t, unk, 2, wi, GDDR_ROWS_NOCREATE, 0, NULL), GDDR_OK);
    ck_assert_int_eq(memcmp(wi, w1, 16), 0);
    for (int j = 4; j < 8; j++)
        ck_assert(wi[j] == 0.0f);
    char *text = NULL;
    ck_assert_int_eq(gddr_server_metrics_text(c, &text), GDDR_OK);
    ck_assert_msg(strstr(text, "gddr_table_rows{table=\"emb\"} 3\n") != NULL, "%s", text);
    free(text);
    /* Row traffic is counted like a tensor's: a pull's keys and rows. */
    gddr_client_counters k;
    gddr_client_counters_get(c, &k);
    /* (the push went out with key 7 once: 3 keys, 3 rows) */
    ck_assert_msg(k.bytes_pulled >= 2 * (4 * 8 + 16 * 4) && k.bytes_pushed >= 3 * 8 + 12 * 4,
                  "pulled %llu, pushed %llu bytes", (unsigned long long)k.bytes_pulled,
                  (unsigned long long)k.bytes_pushed);
    /* A bad optimizer text is refused before anything is sent. */
    to.optimizer = "adam momentum=0.9";
    ck_assert_int_eq(gddr_table_register(c, "bad", 4, &to, &t2), GDDR_EINVAL);
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

enum { RW = 2, RSTEPS = 6, RDIM = 8, RKEYS = 24 };

/* Two workers in one thread (a sync push returns at once; the pull after
 * it waits for the step), Adam rows, keys drawn from [0, 80). Returns
 * the rows of keys 0..79 read back by an observer (zeros where no row). */
static void run_rows(const char *ep, float *rows)
{
    gddr_client *w[RW];
    int t[RW];
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    to.init = GDDR_TINIT_NORMAL;
    to.init_scale = 0.1f;
    to.init_seed = 5;
    to.optimizer = "adam lr=0.05";
    for (int r = 0; r < RW; r++) {
        w[r] = open_worker(ep, r, RW);
        ck_assert_int_eq(gddr_table_register(w[r], "emb", RDIM, &to, &t[r]), GDDR_OK);
    }
    unsigned seed = 3;
    uint64_t keys[RKEYS];
    float vals[RKEYS * RDIM], g[RKEYS * RDIM];
    for (int s = 0; s < RSTEPS; s++)
        for (int r = 0; r < RW; r++) {
            for (int i = 0; i < RKEYS; i++)
                keys[i] = (uint64_t)(rand_r(&seed) % 80); /* repeats included */
            for (int i = 0; i < RKEYS * RDIM; i++)
                g[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
            int rc = gddr_pull_rows(w[r], t[r], keys, RKEYS, vals, 0, 0, NULL);
            ck_assert_msg(rc == GDDR_OK, "pull: %s", gddr_client_errmsg(w[r]));
            rc = gddr_push_rows(w[r], t[r], keys, RKEYS, g, NULL);
            ck_assert_msg(rc == GDDR_OK, "push: %s", gddr_client_errmsg(w[r]));
        }
    uint64_t all[80];
    for (int i = 0; i < 80; i++)
        all[i] = (uint64_t)i;
    uint64_t v = 0;
    ck_assert_int_eq(gddr_pull_rows(w[0], t[0], all, 80, rows, GDDR_ROWS_NOCREATE, RSTEPS, &v), GDDR_OK);
    ck_assert_uint_eq(v, RSTEPS);
    for (int r = 0; r < RW; r++)
        gddr_client_close(&w[r]);
}

START_TEST(test_rows_sync_three_equal_one)
{
    gt_server one, s3[3];
#define RSETS "mode=sync", "workers=2"
    START_SERVER(one, RSETS);
    char list[1600] = "";
    for (int s = 0; s < 3; s++) {
        char idx[32], cnt[32] = "shard_count=3";
        snprintf(idx, sizeof idx, "shard_index=%d", s);
        START_SERVER(s3[s], RSETS, idx, cnt);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", s ? ", " : "", s3[s].endpoint);
    }
    static float a[80 * RDIM], b[80 * RDIM];
    run_rows(one.endpoint, a);
    run_rows(list, b);
    int nonzero = 0;
    for (int i = 0; i < 80 * RDIM; i++)
        nonzero += a[i] != 0;
    ck_assert_msg(nonzero > 40 * RDIM, "only %d values of touched rows", nonzero);
    assert_same_floats(b, a, 80 * RDIM, "rows over 3 servers vs 1");
    /* Every server holds some of the rows. */
    for (int s = 0; s < 3; s++) {
        gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
        o.server = s3[s].endpoint;
        o.observer = 1;
        gddr_client *c = NULL;
        ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
        double rows = gt_server_metric(c, "gddr_table_rows{table=\"emb\"}");
        ck_assert_msg(rows > 5 && rows < 60, "server %d holds %g rows", s, rows);
        gddr_client_close(&c);
    }
    printf("rows: %d sync steps of 2 workers, Adam rows over 3 servers: bit-identical to 1 server\n", RSTEPS);
    stop_server(&one);
    for (int s = 0; s < 3; s++)
        stop_server(&s3[s]);
}
END_TEST

/* A push of rows with a NaN in one of them changes no row: on one server
 * (it refuses the whole message) and over two (the client refuses it before
 * either server applies its share of the rows). */
START_TEST(test_rows_nan_changes_nothing)
{
    gt_server one, a, b;
    START_SERVER(one, "mode=async");
    START_SERVER(a, "mode=async", "shard_index=0", "shard_count=2");
    START_SERVER(b, "mode=async", "shard_index=1", "shard_count=2");
    char list[1100];
    snprintf(list, sizeof list, "%s, %s", a.endpoint, b.endpoint);
    enum { NK = 16, D = 4 };
    uint64_t keys[NK];
    for (int i = 0; i < NK; i++)
        keys[i] = (uint64_t)i * 7919u;
    for (int k = 0; k < 2; k++) {
        gddr_client *c = open_worker(k ? list : one.endpoint, 0, 1);
        gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
        to.init = GDDR_TINIT_UNIFORM;
        to.init_seed = 3;
        int t;
        ck_assert_int_eq(gddr_table_register(c, "emb", D, &to, &t), GDDR_OK);
        float w0[NK * D], w1[NK * D], g[NK * D];
        ck_assert_int_eq(gddr_pull_rows(c, t, keys, NK, w0, 0, 0, NULL), GDDR_OK);
        for (int i = 0; i < NK * D; i++)
            g[i] = 0.25f;
        for (int bad = 0; bad < NK; bad += NK - 1) { /* the first row, the last */
            g[bad * D + 1] = NAN;
            int rc = gddr_push_rows(c, t, keys, NK, g, NULL);
            ck_assert_msg(rc == GDDR_ENONFINITE, "%s: a NaN in row %d: %s", k ? "two servers" : "one server",
                          bad, gddr_strerror(rc));
            g[bad * D + 1] = 0.25f;
        }
        ck_assert_int_eq(gddr_pull_rows(c, t, keys, NK, w1, 0, 0, NULL), GDDR_OK);
        assert_same_floats(w1, w0, NK * D, k ? "rows over two servers after refused pushes"
                                             : "rows after refused pushes");
        ck_assert_int_eq(gddr_push_rows(c, t, keys, NK, g, NULL), GDDR_OK); /* a good one moves them */
        ck_assert_int_eq(gddr_pull_rows(c, t, keys, NK, w1, 0, 0, NULL), GDDR_OK);
        ck_assert(w1[0] != w0[0] && w1[NK * D - 1] != w0[NK * D - 1]);
        gddr_client_close(&c);
    }
    stop_server(&one);
    stop_server(&a);
    stop_server(&b);
}
END_TEST

START_TEST(test_rows_opts_size)
{
    gt_server s;
    START_SERVER(s, "lr=0.5");
    gddr_client *c = open_worker(s.endpoint, 0, 1);
    struct { gddr_table_opts o; int later_field; } big = { GDDR_TABLE_OPTS_INIT, 1 };
    int t;
    ck_assert_int_eq(gddr_table_register_sized(c, "emb", 2, &big.o, sizeof big, &t), GDDR_ENOTSUP);
    ck_assert_msg(strstr(gddr_client_errmsg(c), "upgrade") != NULL, "%s", gddr_client_errmsg(c));
    ck_assert_int_eq(gddr_table_register(c, "emb", 2, NULL, &t), GDDR_OK);
    uint64_t k = 3;
    float w[2] = { 1, 1 };
    ck_assert_int_eq(gddr_pull_rows(c, t, &k, 1, w, 0, 0, NULL), GDDR_OK);
    ck_assert(w[0] == 0.0f && w[1] == 0.0f); /* zeros: the default init */
    gddr_client_close(&c);
    stop_server(&s);
}
END_TEST

/* An observer's lookup of a table that does not exist is an answer, not a
 * sign that the server restarted: E_NOKEY at once, no reconnect. And a
 * sync pull that timed out while the other worker had not pushed yet does
 * not come back with the rows from before the step. */
START_TEST(test_rows_answers_not_restarts)
{
    gt_server s;
    START_SERVER(s, "mode=sync", "workers=2", "lr=1");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.observer = 1;
    gddr_client *obs = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &obs), GDDR_OK);
    int t;
    ck_assert_int_eq(gddr_table_register(obs, "nope", 4, NULL, &t), GDDR_ENOKEY);
    gddr_client_counters k;
    gddr_client_counters_get(obs, &k);
    ck_assert_uint_eq(k.reconnects, 0);

    gddr_client_opts wo = GDDR_CLIENT_OPTS_INIT;
    wo.server = s.endpoint;
    wo.world_size = 2;
    wo.heartbeat_ms = 0;
    wo.timeout_ms = 500;
    wo.reconnect_timeout_ms = 1500;
    gddr_client *w[2];
    for (int r = 0; r < 2; r++) {
        wo.rank = r;
        ck_assert_int_eq(gddr_client_open(&wo, &w[r]), GDDR_OK);
        ck_assert_int_eq(gddr_table_register(w[r], "s", 1, NULL, &t), GDDR_OK);
    }
    uint64_t key = 9;
    float g = 2.0f, v = 123.0f;
    ck_assert_int_eq(gddr_push_rows(w[0], t, &key, 1, &g, NULL), GDDR_OK);
    int rc = gddr_pull_rows(w[0], t, &key, 1, &v, 0, 0, NULL);
    ck_assert_msg(rc == GDDR_ETIMEDOUT, "a pull before the step completed gave %s with %g",
                  gddr_strerror(rc), (double)v);
    ck_assert_int_eq(gddr_push_rows(w[1], t, &key, 1, &g, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull_rows(w[0], t, &key, 1, &v, 0, 0, NULL), GDDR_OK);
    ck_assert_msg(v == -2.0f, "after the step: %g, expected -2", (double)v);
    for (int r = 0; r < 2; r++)
        gddr_client_close(&w[r]);
    gddr_client_close(&obs);
    stop_server(&s);
}
END_TEST

Suite *suite_rows(void)
{
    Suite *s = suite_create("rows");
    GT_ADD_CASE(s, "rows_values_as_documented", test_rows_values, 60);
    GT_ADD_CASE(s, "rows_sync_three_equal_one", test_rows_sync_three_equal_one, 120);
    GT_ADD_CASE(s, "rows_nan_changes_nothing", test_rows_nan_changes_nothing, 60);
    GT_ADD_CASE(s, "rows_opts_size_checked", test_rows_opts_size, 60);
    GT_ADD_CASE(s, "rows_answers_are_not_restarts", test_rows_answers_not_restarts, 60);
    return s;
}
