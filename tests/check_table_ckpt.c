/* check_table_ckpt.c -- sparse tables in checkpoints (server/table_persist.c,
 * docs/checkpoint-format.md "Tables").
 *
 *   build/bin/gddr-tests table_ckpt
 *
 *   tckpt_engine_round_trip   the table engine saved through its view and
 *                             state and put back (rows in slot order, the
 *                             pending keys of count admission, the draw
 *                             counters) goes on bit for bit as the original
 *                             under pulls, pushes, ttl and LRU evictions
 *   tckpt_engine_dirty        a row whose dirty bit stays clear after a clear
 *                             holds what it held then (what incremental
 *                             checkpoints rely on)
 *   tckpt_kill9_sync_adam     two sync workers, Adam rows, count admission;
 *                             checkpoint in the middle of a step (worker 0
 *                             pushed it, worker 1 not yet), kill -9, restart:
 *                             every row bitwise as before the kill, the
 *                             version restored, worker 0's push resent is a
 *                             duplicate (not applied twice), and training on
 *                             gives bitwise the rows of an uninterrupted run
 *   tckpt_format3_loads       a checkpoint written by gddr-ps before tables
 *                             were saved (meta format 3, a fixture under
 *                             tests/fixtures/ckpt-format3) still loads
 *   tckpt_corrupt_falls_back  a damaged newest checkpoint is skipped for the
 *                             previous one, with its tables
 *   tckpt_incremental         deltas (only the rows changed since the last
 *                             full copy) are a fraction of a full checkpoint,
 *                             their base outlives checkpoint_keep, a restart
 *                             from a delta gives every row back, and damage
 *                             to the newest full or to a base falls back as
 *                             documented
 */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../client/src/client_int.h" /* gddr__rows_push_at, the tables' steps */
#include "../server/checkpoint.h"
#include "../server/table.h"
#include "gddr/gddr.h"
#include "files.h"
#include "harness.h"
#include "suites.h"

#define WAIT_MS 60000

static uint64_t next64(uint64_t *x)
{
    *x += 0x9e3779b97f4a7c15ull;
    return gddr_splitmix64(*x);
}

/* ---- the engine ------------------------------------------------------------ */

enum { ED = 4, EKEYS = 400, EB = 24 };

/* One round of a worker on table t: a training pull of EB distinct keys,
 * a push of gradients for them, an advance. Deterministic in (round). */
static void engine_round(ps_table *t, int round)
{
    uint64_t rng = 1000 + (uint64_t)round, keys[EB];
    float out[EB * ED], g[EB * ED];
    for (int i = 0; i < EB; i++) {
        uint64_t k;
        int dup;
        do {
            k = next64(&rng) % EKEYS;
            dup = 0;
            for (int j = 0; j < i; j++)
                dup |= keys[j] == k;
        } while (dup);
        keys[i] = k;
    }
    for (int i = 0; i < EB * ED; i++)
        g[i] = (float)((int)(next64(&rng) % 2001) - 1000) / 500.0f;
    ck_assert_int_eq(ps_table_pull(t, keys, EB, 1, out, NULL), 0);
    ck_assert_int_ge(ps_table_apply(t, keys, EB, g, 0.5f, 0.01f), 0);
    ps_table_advance(t);
}

/* A copy of t made the way a checkpoint does: through its view and state,
 * into a new table. */
static ps_table *engine_copy(const ps_table *t, uint64_t *srows)
{
    ps_table *u = NULL;
    ck_assert_int_eq(ps_table_new(ps_table_config(t), srows, 0, &u), 0);
    ps_table_view v;
    ps_table_view_get(t, &v);
    for (uint64_t s = 0; s < v.rows; s++) {
        const float *st = v.nstate ? v.s + s * v.dim * v.nstate : NULL;
        ck_assert_int_eq(ps_table_put_row(u, v.meta[2 * s], v.w + s * v.dim, st,
                                          v.nstate == 2 ? st + v.dim : NULL, v.steps[s],
                                          v.meta[2 * s + 1]),
                         0);
    }
    for (uint64_t i = 0; i < v.npend; i++)
        ck_assert_int_eq(ps_table_put_pending(u, v.pend[2 * i], v.pend[2 * i + 1], v.sightings[i]), 0);
    ps_table_state st;
    ps_table_state_get(t, &st);
    ps_table_state_set(u, &st);
    return u;
}

static void assert_same_tables(const ps_table *a, const ps_table *b, const char *what)
{
    ps_table_view x, y;
    ps_table_view_get(a, &x);
    ps_table_view_get(b, &y);
    ck_assert_msg(x.rows == y.rows && x.npend == y.npend, "%s: %llu rows, %llu pending vs %llu, %llu",
                  what, (unsigned long long)x.rows, (unsigned long long)x.npend,
                  (unsigned long long)y.rows, (unsigned long long)y.npend);
    size_t vals = (size_t)x.rows * x.dim * 4;
    ck_assert_msg(memcmp(x.meta, y.meta, x.rows * 16) == 0, "%s: keys or last touches differ", what);
    ck_assert_msg(memcmp(x.steps, y.steps, x.rows * 4) == 0, "%s: step counts differ", what);
    ck_assert_msg(memcmp(x.w, y.w, vals) == 0, "%s: values differ", what);
    ck_assert_msg(memcmp(x.s, y.s, vals * x.nstate) == 0, "%s: optimizer state differs", what);
    ck_assert_msg(x.npend == 0 || memcmp(x.pend, y.pend, x.npend * 16) == 0, "%s: pending keys differ", what);
    ck_assert_msg(x.npend == 0 || memcmp(x.sightings, y.sightings, x.npend * 4) == 0,
                  "%s: sightings differ", what);
    ps_table_state s, t;
    ps_table_state_get(a, &s);
    ps_table_state_get(b, &t);
    ck_assert_msg(memcmp(&s, &t, sizeof s) == 0, "%s: versions, cursors or counters differ", what);
}

/* An Adam table of ED floats a row (lr 0.01) for the engine cases. */
static ps_table_conf adam_conf(ps_tinit init, float scale, uint64_t seed, ps_tadmit admit,
                               uint32_t admit_count, uint64_t max_rows, uint64_t row_ttl)
{
    ps_table_conf c;
    memset(&c, 0, sizeof c);
    c.dim = ED;
    c.init = init;
    c.init_scale = scale;
    c.init_seed = seed;
    c.admit = admit;
    c.admit_count = admit_count;
    c.admit_prob = 1.0f;
    c.opt = PS_TOPT_ADAM;
    c.lr = 0.01f;
    c.beta1 = 0.9f;
    c.beta2 = 0.999f;
    c.eps = 1e-8f;
    c.max_rows = max_rows;
    c.row_ttl = row_ttl;
    return c;
}

START_TEST(test_engine_round_trip)
{
    /* LRU evictions (max_rows 150) and ttl ones (12) */
    ps_table_conf c = adam_conf(PS_TINIT_NORMAL, 0.1f, 77, PS_TADMIT_COUNT, 2, 150, 12);
    char why[256];
    ck_assert_msg(ps_table_conf_check(&c, why, sizeof why) == 0, "%s", why);
    uint64_t ra = 0, rb = 0;
    ps_table *a = NULL;
    ck_assert_int_eq(ps_table_new(&c, &ra, 0, &a), 0);
    for (int r = 0; r < 120; r++)
        engine_round(a, r);
    ps_table_counts k;
    ps_table_counts_get(a, &k);
    ck_assert_msg(k.evicted_cap > 0 && k.pending > 0 && k.rows > 30,
                  "the run exercises too little: %llu cap evictions, %llu pending, %llu rows",
                  (unsigned long long)k.evicted_cap, (unsigned long long)k.pending,
                  (unsigned long long)k.rows);
    ps_table *b = engine_copy(a, &rb);
    assert_same_tables(a, b, "right after the copy");
    ck_assert_uint_eq(ra, rb);
    for (int r = 120; r < 400; r++) {
        engine_round(a, r);
        engine_round(b, r);
    }
    ps_table_counts_get(a, &k);
    ck_assert_msg(k.evicted_ttl > 0, "no ttl eviction after the copy");
    assert_same_tables(a, b, "280 rounds after the copy");
    ps_table_free(a);
    ps_table_free(b);
}
END_TEST

/* The dirty bits an incremental checkpoint relies on: after a clear, a row
 * whose bit stays clear holds what it held then (same key: values, state,
 * step count), through pulls, steps, evictions (which move rows between
 * slots) and new rows. */
START_TEST(test_engine_dirty)
{
    ps_table_conf c = adam_conf(PS_TINIT_UNIFORM, 0.5f, 3, PS_TADMIT_ALWAYS, 1, 300, 30);
    uint64_t ra = 0, rb = 0;
    ps_table *a = NULL;
    ck_assert_int_eq(ps_table_new(&c, &ra, 0, &a), 0);
    for (int r = 0; r < 60; r++)
        engine_round(a, r);
    ps_table *ref = engine_copy(a, &rb);
    ps_table_dirty_clear(a);
    ck_assert_uint_eq(ps_table_dirty_count(a), 0);
    for (int r = 60; r < 64; r++)
        engine_round(a, r);
    ps_table_view v, x;
    ps_table_view_get(a, &v);
    ps_table_view_get(ref, &x);
    uint64_t clean = 0, dirty = 0;
    for (uint64_t s = 0; s < v.rows; s++) {
        if (v.dirty[s >> 6] >> (s & 63) & 1) {
            dirty++;
            continue;
        }
        clean++;
        uint64_t k = v.meta[2 * s], j = 0;
        while (j < x.rows && x.meta[2 * j] != k)
            j++;
        ck_assert_msg(j < x.rows, "clean row of key %llu was not there at the clear", (unsigned long long)k);
        ck_assert_msg(memcmp(v.w + s * ED, x.w + j * ED, ED * 4) == 0 &&
                          memcmp(v.s + s * ED * 2, x.s + j * ED * 2, ED * 8) == 0 && v.steps[s] == x.steps[j],
                      "clean row of key %llu changed", (unsigned long long)k);
    }
    ck_assert_uint_eq(dirty, ps_table_dirty_count(a));
    ps_table_counts k;
    ps_table_counts_get(a, &k);
    ck_assert_msg(clean > 20 && dirty > 20 && k.evicted_cap + k.evicted_ttl > 0,
                  "%llu clean, %llu dirty rows, %llu evictions: exercises too little", (unsigned long long)clean,
                  (unsigned long long)dirty, (unsigned long long)(k.evicted_cap + k.evicted_ttl));
    ps_table_free(a);
    ps_table_free(ref);
}
END_TEST

/* ---- a server ------------------------------------------------------------------ */

enum { W = 2, DIM = 8, NK = 120, BATCH = 20, STEPS1 = 5, STEPS2 = 4 };

static gddr_client *open_client(const char *ep, int rank, int observer)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = observer ? 0 : rank;
    o.world_size = W;
    o.observer = observer;
    o.timeout_ms = 5000; /* a lost request costs this (pull_rows) */
    o.reconnect_timeout_ms = 20000;
    o.heartbeat_ms = 0;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    ck_assert_msg(rc == GDDR_OK, "open %s as %s %d: %s", ep, observer ? "observer" : "rank", rank,
                  gddr_strerror(rc));
    return c;
}

/* gddr_pull_rows, once more when no reply came: a request sent just as the
 * server was killed and restarted can be lost with the old connection (the
 * client reconnects on the next call). */
static int pull_rows(gddr_client *c, int t, const uint64_t *keys, size_t n, float *out, unsigned flags,
                     uint64_t min_version, uint64_t *v)
{
    int rc = gddr_pull_rows(c, t, keys, n, out, flags, min_version, v);
    if (rc == GDDR_ETIMEDOUT)
        rc = gddr_pull_rows(c, t, keys, n, out, flags, min_version, v);
    return rc;
}

static int register_emb(gddr_client *c)
{
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    to.init = GDDR_TINIT_NORMAL;
    to.init_scale = 0.1f;
    to.init_seed = 5;
    to.admit = GDDR_TADMIT_COUNT;
    to.admit_count = 2;
    to.optimizer = "adam lr=0.05";
    int t = -1;
    int rc = gddr_table_register(c, "emb", DIM, &to, &t);
    ck_assert_msg(rc == GDDR_OK, "register: %s", gddr_client_errmsg(c));
    return t;
}

/* The keys (distinct) and gradients of a rank's push at a step. */
static void step_data(int rank, int step, uint64_t *keys, float *g)
{
    uint64_t rng = 0x5eed + (uint64_t)rank * 1000003u + (uint64_t)step * 7919u;
    for (int i = 0; i < BATCH; i++) {
        uint64_t k;
        int dup;
        do {
            k = next64(&rng) % NK;
            dup = 0;
            for (int j = 0; j < i; j++)
                dup |= keys[j] == k;
        } while (dup);
        keys[i] = k;
    }
    for (int i = 0; i < BATCH * DIM; i++)
        g[i] = (float)((int)(next64(&rng) % 2001) - 1000) / 1000.0f;
}

/* A worker's step: a training pull of its keys, then its push. */
static void worker_step(gddr_client *c, int t, int rank, int step)
{
    uint64_t keys[BATCH];
    float vals[BATCH * DIM], g[BATCH * DIM];
    step_data(rank, step, keys, g);
    int rc = pull_rows(c, t, keys, BATCH, vals, 0, 0, NULL);
    ck_assert_msg(rc == GDDR_OK, "rank %d step %d pull: %s", rank, step, gddr_client_errmsg(c));
    rc = gddr_push_rows(c, t, keys, BATCH, g, NULL);
    ck_assert_msg(rc == GDDR_OK, "rank %d step %d push: %s", rank, step, gddr_client_errmsg(c));
}

/* Every row of keys 0..NK-1 (zeros where none), read without creating
 * any, at version min_version or later; returns the version read. */
static uint64_t read_rows(gddr_client *obs, int t, uint64_t min_version, float *rows)
{
    uint64_t all[NK], v = 0;
    for (int i = 0; i < NK; i++)
        all[i] = (uint64_t)i;
    int rc = pull_rows(obs, t, all, NK, rows, GDDR_ROWS_NOCREATE, min_version, &v);
    ck_assert_msg(rc == GDDR_OK, "read rows: %s", gddr_client_errmsg(obs));
    return v;
}

static size_t count_ckpts(const char *dir)
{
    uint64_t seqs[64];
    size_t n = 0;
    return gddr__ckpt_list(dir, seqs, 64, &n) == GDDR_OK ? n : 0;
}

static void wait_ckpts(const char *dir, size_t want)
{
    int64_t t0 = gt_now_ms();
    while (count_ckpts(dir) < want) {
        ck_assert_msg(gt_now_ms() - t0 < WAIT_MS, "no checkpoint %zu in %s within %d s", want, dir,
                      WAIT_MS / 1000);
        gt_sleep_ms(10);
    }
}

static void kill9(gt_server *s)
{
    ck_assert_int_gt(s->pid, 0);
    kill(s->pid, SIGKILL);
    int st = 0;
    ck_assert_int_eq(gt_wait_pid(s->pid, WAIT_MS, &st), 1);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    s->pid = 0;
}

static int count_nonzero(const float *v, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += v[i] != 0;
    return k;
}

/* Two sync workers train STEPS1 steps, worker 0 pushes step STEPS1, then
 * (crash: checkpoint, kill -9, restart, checks) worker 1 pushes it and both
 * train STEPS2 more. The rows at the end go to final. */
static void sync_run(int crash, float *final)
{
    char dir[64], ckdir[128], log[160], ckset[200], listen[300];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *sets[] = { "mode=sync", "workers=2", "checkpoint_interval_s=0", ckset, NULL, NULL };
    gt_server s;
    gt_start_logged(&s, log, crash ? sets : (const char *[]){ "mode=sync", "workers=2", NULL });
    gddr_client *w[W], *obs;
    int t[W], to;
    for (int r = 0; r < W; r++) {
        w[r] = open_client(s.endpoint, r, 0);
        t[r] = register_emb(w[r]);
    }
    obs = open_client(s.endpoint, 0, 1);
    to = register_emb(obs);
    for (int k = 0; k < STEPS1; k++)
        for (int r = 0; r < W; r++)
            worker_step(w[r], t[r], r, k);
    /* The open step: worker 0's push only, with an lr of its own (a
     * schedule's), which the step takes when it completes -- after the
     * restart too, so the checkpoint must keep it. */
    ck_assert_int_eq(gddr_set_lr(w[0], 0.0125), GDDR_OK);
    worker_step(w[0], t[0], 0, STEPS1);
    ck_assert_int_eq(gddr_set_lr(w[0], 0), GDDR_OK);
    static float before[NK * DIM], after[NK * DIM];
    uint64_t vb = read_rows(obs, to, STEPS1, before);
    ck_assert_uint_eq(vb, STEPS1);
    ck_assert_msg(count_nonzero(before, NK * DIM) > 20 * DIM, "few rows: count admission kept them out?");
    uint64_t last_step = w[0]->tb[t[0]].step;
    if (crash) {
        ck_assert_int_eq(gddr_request_checkpoint(obs), GDDR_OK);
        wait_ckpts(ckdir, 1);
        kill9(&s);
        snprintf(listen, sizeof listen, "listen=%s", s.endpoint);
        sets[4] = listen;
        gt_start_logged(&s, log, sets);
        ck_assert_msg(gt_wait_for_text(log, "restored checkpoint", WAIT_MS) >= 0, "no restore in %s", log);
        ck_assert(gt_file_has(log, "2 workers, 1 tables"));
        uint64_t va = read_rows(obs, to, 0, after);
        ck_assert_uint_eq(va, vb);
        ck_assert_msg(memcmp(after, before, sizeof before) == 0, "rows after the restart differ from before the kill");
    }
    /* Worker 0 resends its push of the open step: a duplicate either way. */
    uint64_t keys[BATCH], v = 0;
    float g[BATCH * DIM];
    step_data(0, STEPS1, keys, g);
    int rc = gddr__rows_push_at(w[0], t[0], keys, BATCH, g, last_step, &v);
    ck_assert_msg(rc == GDDR_OK, "resend: %s", gddr_client_errmsg(w[0]));
    ck_assert_double_eq(gt_server_metric(obs, "gddr_duplicate_pushes_total"), 1);
    ck_assert_uint_eq(read_rows(obs, to, 0, after), STEPS1);
    ck_assert_msg(memcmp(after, before, sizeof before) == 0, "the resent push changed rows");
    worker_step(w[1], t[1], 1, STEPS1); /* completes the step worker 0 began */
    for (int k = STEPS1 + 1; k < STEPS1 + 1 + STEPS2; k++)
        for (int r = 0; r < W; r++)
            worker_step(w[r], t[r], r, k);
    ck_assert_uint_eq(read_rows(obs, to, STEPS1 + 1 + STEPS2, final), STEPS1 + 1 + STEPS2);
    for (int r = 0; r < W; r++)
        gddr_client_close(&w[r]);
    gddr_client_close(&obs);
    gt_server_stop(&s, WAIT_MS, NULL);
    gt_rm_rf(dir);
}

START_TEST(test_kill9_sync_adam)
{
    static float ref[NK * DIM], got[NK * DIM];
    sync_run(0, ref);
    sync_run(1, got);
    for (int i = 0; i < NK * DIM; i++)
        ck_assert_msg(memcmp(&ref[i], &got[i], 4) == 0, "row %d value %d: %.9g after a restart, %.9g without",
                      i / DIM, i % DIM, (double)got[i], (double)ref[i]);
    printf("table_ckpt: %d sync steps of 2 workers, Adam rows, kill -9 in the middle of step %d: "
           "bit-identical to an uninterrupted run\n", STEPS1 + 1 + STEPS2, STEPS1);
}
END_TEST

/* ---- an old checkpoint ------------------------------------------------------------ */

/* tests/fixtures/ckpt-format3/README.md says how the file was made: a
 * tensor "w" of 16 values i, three pushes of 1 at lr 0.25 (version 3), and
 * a table "emb" that format 3 did not save. */
START_TEST(test_format3_loads)
{
    char dir[64], ckdir[128], log[160], ckset[200], cmd[600];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *src = getenv("GDDR_SRC_DIR");
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/tests/fixtures/ckpt-format3/ckpt-00000000000000000001.gddr %s/",
             ckdir, src && src[0] ? src : ".", ckdir);
    ck_assert_msg(system(cmd) == 0, "%s failed (run from the repository root, or set GDDR_SRC_DIR)", cmd);
    const char *sets[] = { "lr=0.25", "checkpoint_interval_s=0", ckset, NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    ck_assert_msg(gt_wait_for_text(log, "restored checkpoint", WAIT_MS) >= 0, "no restore in %s", log);
    ck_assert(gt_file_has(log, "1 tensors, 0 workers, 0 tables"));
    gddr_client *c = open_client(s.endpoint, 0, 0);
    float v[16] = { 0 };
    int id;
    uint64_t ver = 0;
    ck_assert_int_eq(gddr_register(c, "w", v, 16, &id, &ver), GDDR_OK);
    ck_assert_uint_eq(ver, 3);
    ck_assert_int_eq(gddr_pull(c, id, v, 0, &ver), GDDR_OK);
    for (int i = 0; i < 16; i++)
        ck_assert_msg(v[i] == (float)i - 0.75f, "w[%d] = %g", i, (double)v[i]);
    /* The table was not saved then: it starts over, empty. */
    int t = -1;
    ck_assert_int_eq(gddr_table_register(c, "emb", 4, NULL, &t), GDDR_OK);
    uint64_t keys[2] = { 1, 2 };
    float rows[8];
    ck_assert_int_eq(gddr_pull_rows(c, t, keys, 2, rows, GDDR_ROWS_NOCREATE, 0, &ver), GDDR_OK);
    ck_assert_uint_eq(ver, 0);
    ck_assert_int_eq(count_nonzero(rows, 8), 0);
    /* Its next checkpoint is format 4 and holds the table. */
    ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
    wait_ckpts(ckdir, 2);
    gddr_ckpt ck;
    char err[512] = "";
    ck_assert_int_eq(gddr__ckpt_load_newest(ckdir, &ck, err, sizeof err), GDDR_OK);
    const gddr_ckpt_section *m = gddr__ckpt_find(&ck, "meta");
    ck_assert(m && m->len == 32);
    uint64_t meta[4];
    memcpy(meta, m->data, sizeof meta);
    ck_assert_uint_eq(meta[0], 4);
    ck_assert_uint_eq(meta[3], 1);
    ck_assert_ptr_nonnull(gddr__ckpt_find(&ck, "table/0"));
    ck_assert_ptr_nonnull(gddr__ckpt_find(&ck, "trows/0"));
    gddr__ckpt_free(&ck);
    gddr_client_close(&c);
    gt_server_stop(&s, WAIT_MS, NULL);
    gt_rm_rf(dir);
}
END_TEST

/* ---- a damaged newest checkpoint ----------------------------------------------------- */

START_TEST(test_corrupt_falls_back)
{
    char dir[64], ckdir[128], log[160], ckset[200], listen[300];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *sets[] = { "mode=async", "checkpoint_interval_s=0", ckset, NULL, NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c = open_client(s.endpoint, 0, 0);
    int t = register_emb(c);
    for (int k = 0; k < 4; k++)
        worker_step(c, t, 0, k);
    static float r1[NK * DIM], r2[NK * DIM], got[NK * DIM];
    uint64_t v1 = read_rows(c, t, 0, r1);
    ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
    wait_ckpts(ckdir, 1);
    for (int k = 4; k < 8; k++)
        worker_step(c, t, 0, k);
    uint64_t v2 = read_rows(c, t, 0, r2);
    ck_assert_uint_gt(v2, v1);
    ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
    wait_ckpts(ckdir, 2);
    kill9(&s);
    /* One bit flipped in the middle of the newest file (in the rows). */
    char path[300];
    snprintf(path, sizeof path, "%s/ckpt-00000000000000000002.gddr", ckdir);
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    unsigned char b;
    ck_assert_int_eq(pread(fd, &b, 1, sb.st_size / 2), 1);
    b ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &b, 1, sb.st_size / 2), 1);
    close(fd);
    snprintf(listen, sizeof listen, "listen=%s", s.endpoint);
    sets[3] = listen;
    gt_start_logged(&s, log, sets);
    ck_assert_msg(gt_wait_for_text(log, "restored checkpoint", WAIT_MS) >= 0, "no restore in %s", log);
    ck_assert(gt_file_has(log, "ckpt-00000000000000000002.gddr skipped: "));
    ck_assert(gt_file_has(log, "ckpt-00000000000000000001.gddr: 0 tensors, 1 workers, 1 tables"));
    ck_assert_uint_eq(read_rows(c, t, 0, got), v1);
    ck_assert_msg(memcmp(got, r1, sizeof got) == 0, "rows differ from checkpoint 1's");
    gddr_client_close(&c);
    gt_server_stop(&s, WAIT_MS, NULL);
    gt_rm_rf(dir);
}
END_TEST

/* ---- incremental checkpoints ------------------------------------------------------- */

enum { BIG = 4000, BD = 16 };

static void big_rows(gddr_client *c, int t, uint64_t from, uint64_t n, float scale)
{
    static uint64_t k[BIG];
    static float g[BIG * BD];
    for (uint64_t i = 0; i < n; i++)
        k[i] = from + i;
    for (uint64_t i = 0; i < n * BD; i++)
        g[i] = scale * (float)((int)(i % 13) - 6);
    int rc = gddr_push_rows(c, t, k, n, g, NULL);
    ck_assert_msg(rc == GDDR_OK, "push: %s", gddr_client_errmsg(c));
}

static uint64_t read_big(gddr_client *c, int t, float *rows)
{
    static uint64_t k[BIG];
    for (int i = 0; i < BIG; i++)
        k[i] = (uint64_t)i;
    uint64_t v = 0;
    int rc = pull_rows(c, t, k, BIG, rows, GDDR_ROWS_NOCREATE, 0, &v);
    ck_assert_msg(rc == GDDR_OK, "read: %s", gddr_client_errmsg(c));
    return v;
}

static gddr_ckpt load_seq(const char *dir, uint64_t seq)
{
    gddr_ckpt ck;
    char err[512] = "";
    int rc = gddr__ckpt_load_upto(dir, seq, 1, &ck, err, sizeof err);
    ck_assert_msg(rc == GDDR_OK, "checkpoint %llu of %s: %d %s", (unsigned long long)seq, dir, rc, err);
    return ck;
}

static long file_size(const char *dir, uint64_t seq)
{
    char path[300];
    struct stat sb;
    snprintf(path, sizeof path, "%s/ckpt-%020llu.gddr", dir, (unsigned long long)seq);
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static void flip_byte(const char *dir, uint64_t seq)
{
    char path[300];
    snprintf(path, sizeof path, "%s/ckpt-%020llu.gddr", dir, (unsigned long long)seq);
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    unsigned char b;
    ck_assert_int_eq(pread(fd, &b, 1, sb.st_size / 2), 1);
    b ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &b, 1, sb.st_size / 2), 1);
    close(fd);
}

/* Asks for a checkpoint and waits for its file, seq. */
static void request_ckpt(gddr_client *c, const char *dir, uint64_t seq)
{
    ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
    int64_t t0 = gt_now_ms();
    while (file_size(dir, seq) < 0) {
        ck_assert_msg(gt_now_ms() - t0 < WAIT_MS, "no checkpoint %llu in %s within %d s",
                      (unsigned long long)seq, dir, WAIT_MS / 1000);
        gt_sleep_ms(10);
    }
}

/* A table of 4000 Adam rows; checkpoint 1 is full, 2 and 3 are deltas (100
 * and 200 rows changed) a fraction of its size; with checkpoint_keep = 2
 * the base stays; kill -9 and restart give the rows of checkpoint 3 from 3
 * and its base; the next checkpoint is full; when it is damaged, the delta
 * before it and its base are loaded; when the base is damaged too, no
 * delta on it is used and the server refuses to start. */
START_TEST(test_incremental)
{
    char dir[64], ckdir[128], log[160], ckset[200], listen[300];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *sets[] = { "mode=async", "checkpoint_interval_s=0", "checkpoint_keep=2", ckset, NULL, NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c = open_client(s.endpoint, 0, 0);
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    to.init = GDDR_TINIT_UNIFORM;
    to.init_scale = 0.1f;
    to.optimizer = "adam lr=0.01";
    int t = -1;
    ck_assert_int_eq(gddr_table_register(c, "big", BD, &to, &t), GDDR_OK);
    for (int i = 0; i < BIG; i += 500)
        big_rows(c, t, (uint64_t)i, 500, 1.0f);
    request_ckpt(c, ckdir, 1);
    big_rows(c, t, 0, 100, 0.5f);
    request_ckpt(c, ckdir, 2);
    big_rows(c, t, 100, 100, 0.25f);
    static float r3[BIG * BD], got[BIG * BD];
    uint64_t v3 = read_big(c, t, r3);
    request_ckpt(c, ckdir, 3);
    /* 1 full, 2 and 3 deltas on it; 1 kept although checkpoint_keep = 2. */
    gddr_ckpt ck = load_seq(ckdir, 1);
    ck_assert_ptr_nonnull(gddr__ckpt_find(&ck, "trows/0"));
    ck_assert_ptr_null(gddr__ckpt_find(&ck, "tbase"));
    gddr__ckpt_free(&ck);
    for (uint64_t q = 2; q <= 3; q++) {
        ck = load_seq(ckdir, q);
        const gddr_ckpt_section *b = gddr__ckpt_find(&ck, "tbase");
        ck_assert_msg(b && b->len == 8 && *(const uint64_t *)b->data == 1, "checkpoint %llu is not a delta on 1",
                      (unsigned long long)q);
        ck_assert_ptr_nonnull(gddr__ckpt_find(&ck, "tdelta/0"));
        ck_assert_ptr_null(gddr__ckpt_find(&ck, "trows/0"));
        gddr__ckpt_free(&ck);
    }
    long s1 = file_size(ckdir, 1), s2 = file_size(ckdir, 2), s3 = file_size(ckdir, 3);
    ck_assert_msg(s2 > 0 && s3 > s2 && s3 * 4 < s1, "sizes: full %ld, deltas %ld and %ld", s1, s2, s3);
    printf("table_ckpt: %d rows of %d floats (adam): full checkpoint %ld bytes, deltas with 100 and 200 rows "
           "changed %ld and %ld bytes\n", BIG, BD, s1, s2, s3);
    kill9(&s);
    snprintf(listen, sizeof listen, "listen=%s", s.endpoint);
    sets[4] = listen;
    gt_start_logged(&s, log, sets);
    ck_assert_msg(gt_wait_for_text(log, "(from a delta and its base)", WAIT_MS) >= 0, "no restore from a delta in %s", log);
    ck_assert_uint_eq(read_big(c, t, got), v3);
    ck_assert_msg(memcmp(got, r3, sizeof got) == 0, "rows restored from a delta differ");
    /* The first checkpoint after a restore is full. */
    big_rows(c, t, 3000, 10, 1.0f);
    request_ckpt(c, ckdir, 4);
    ck = load_seq(ckdir, 4);
    ck_assert_ptr_nonnull(gddr__ckpt_find(&ck, "trows/0"));
    gddr__ckpt_free(&ck);
    ck_assert_int_gt(file_size(ckdir, 3), 0);
    ck_assert_int_gt(file_size(ckdir, 1), 0);
    /* It is damaged: delta 3 and its base 1 are loaded. (A new client:
     * this one's connection may still be on its way to the killed server.) */
    gddr_client_close(&c);
    kill9(&s);
    flip_byte(ckdir, 4);
    gt_start_logged(&s, log, sets);
    c = open_client(s.endpoint, 0, 0);
    ck_assert_int_eq(gddr_table_register(c, "big", BD, &to, &t), GDDR_OK);
    ck_assert_msg(gt_wait_for_text(log, "ckpt-00000000000000000003.gddr: 0 tensors, 1 workers, 1 tables", WAIT_MS) >= 0,
                  "checkpoint 3 not restored (see %s)", log);
    ck_assert_uint_eq(read_big(c, t, got), v3);
    ck_assert_msg(memcmp(got, r3, sizeof got) == 0, "rows restored from delta 3 differ");
    gddr_client_close(&c);
    kill9(&s);
    /* The base is damaged too: no delta on it can be used. */
    flip_byte(ckdir, 1);
    int saved = fcntl(2, F_DUPFD_CLOEXEC, 3), fd = open(log, O_WRONLY | O_APPEND | O_CLOEXEC);
    ck_assert(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    const char *all[] = { "log_level=info", sets[0], sets[1], sets[2], sets[3], sets[4], NULL };
    char err[512];
    int rc = gt_server_start(&s, all, err, sizeof err);
    dup2(saved, 2);
    close(saved);
    ck_assert_msg(rc != 0, "gddr-ps started although every checkpoint is damaged or rests on a damaged base");
    ck_assert(gt_file_has(log, "ckpt-00000000000000000003.gddr skipped: its base, checkpoint 1, cannot be loaded"));
    ck_assert(gt_file_has(log, "refusing to start empty"));
    gt_rm_rf(dir);
}
END_TEST

Suite *suite_table_ckpt(void)
{
    Suite *s = suite_create("table_ckpt");
    GT_ADD_CASE(s, "tckpt_engine_round_trip", test_engine_round_trip, 60);
    GT_ADD_CASE(s, "tckpt_engine_dirty", test_engine_dirty, 60);
    GT_ADD_CASE(s, "tckpt_kill9_sync_adam", test_kill9_sync_adam, 180);
    GT_ADD_CASE(s, "tckpt_format3_loads", test_format3_loads, 60);
    GT_ADD_CASE(s, "tckpt_corrupt_falls_back", test_corrupt_falls_back, 120);
    GT_ADD_CASE(s, "tckpt_incremental", test_incremental, 180);
    return s;
}
