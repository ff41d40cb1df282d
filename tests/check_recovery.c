/* check_recovery.c -- crash safety (docs/design.md section 7), with real
 * processes killed for real.
 *
 *   build/bin/gddr-tests recovery
 *
 * Server side: gddr-ps is killed with SIGKILL while four gddr-train workers
 * train and restarted on the same endpoint with the same checkpoint_dir; a
 * corrupt or truncated newest checkpoint is skipped for the previous one;
 * SIGTERM and `gddr-ctl checkpoint` write checkpoints. Worker side: a sync
 * worker is killed, the others go on once it is declared dead and it
 * rejoins with its rank; and, with in-process clients and integer-valued
 * gradients (so that every float sum is exact), the gradient mass is
 * accounted for to the last bit across a worker's death:
 *
 *   (w0 - w) + r_live0 + r_live1 == produced - (r_dead - orphan)
 *
 * where r_dead - orphan is what the dead worker accumulated after its last
 * residual snapshot (the only mass the design allows to be lost). The same
 * books must balance when a survivor closes in the middle of replaying an
 * orphan, and when a worker declared dead was only slow and comes back; the
 * installments a survivor replays must add up to the orphan exactly.
 *
 * dead_server_costs_one_timeout checks that a worker in a step when the
 * server dies gives its push and pull replies one deadline together, not
 * one each (client/src/step.c, exchange()), by adding up the time budgets
 * of the waits that timed out (the client logs each one at debug level).
 *
 * No test here asserts that something happened faster than a wall-clock
 * bound (a loaded machine or a sanitizer build makes everything slower):
 * they wait for events (log lines, versions, checkpoints, exits) under
 * generous deadlines (WAIT_MS, TRAIN_WAIT_MS) that only catch a hang.
 * Every wait is bounded; every process started here dies with the test
 * (harness.h, PR_SET_PDEATHSIG). Server logs go to files in a mkdtemp()
 * directory that is removed when a test passes (kept when one fails, for
 * reading). The measured recovery times are printed on stderr, prefixed
 * "recovery:".
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../client/src/client_int.h" /* gddr__residual_get and friends */
#include "../server/checkpoint.h"
#include "data.h"
#include "gddr/gddr.h"
#include "harness.h"
#include "files.h"
#include "model.h"
#include "replay.h"
#include "suites.h"

#define TCASE_TIMEOUT 120
/* Tests that run gddr-train workers (two training runs, a kill, a restart). */
#define TCASE_TIMEOUT_TRAIN 300
/* Deadline for an event that should come at once (a log line, a checkpoint
 * file, some progress, a process exit): it only catches a hang. */
#define WAIT_MS 60000
/* Deadline for a gddr-train run to finish (seconds of work normally). */
#define TRAIN_WAIT_MS 120000

#define CN 18 /* 5 chunks of 4, the last one short */

typedef struct mass {
    double produced[CN];
} mass;

/* Integer-valued gradient in [-8, 8]. */
static void int_grad(uint64_t *rng, float *g, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
        g[i] = (float)((int)(*rng % 17) - 8);
    }
}

/* ---- checkpoint files ---------------------------------------------------- */

/* The highest checkpoint seq in dir, 0 when none. */
static uint64_t newest_seq(const char *dir)
{
    uint64_t seqs[4];
    size_t count = 0;
    if (gddr__ckpt_list(dir, seqs, 4, &count) != GDDR_OK || count == 0)
        return 0;
    return seqs[0];
}

static size_t count_ckpts(const char *dir)
{
    uint64_t seqs[64];
    size_t count = 0;
    if (gddr__ckpt_list(dir, seqs, 64, &count) != GDDR_OK)
        return 0;
    return count;
}

/* Waits until dir holds at least `want` checkpoints; returns the ms waited
 * or -1. */
static int64_t wait_ckpts(const char *dir, size_t want, int timeout_ms)
{
    int64_t t0 = gt_now_ms();
    while (count_ckpts(dir) < want) {
        if (gt_now_ms() - t0 > timeout_ms)
            return -1;
        gt_sleep_ms(10);
    }
    return gt_now_ms() - t0;
}

/* ---- gddr-ps with its log in a file (files.h starts it) --------------------- */

static void stop_ps_clean(gt_server *s, const char *what)
{
    int st = 0;
    int rc = gt_server_stop(s, WAIT_MS, &st);
    ck_assert_msg(rc == 0, "%s: gddr-ps did not exit within %d s of SIGTERM", what, WAIT_MS / 1000);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "%s: gddr-ps ended with %s %d after SIGTERM, expected exit status 0", what,
                  WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* kill -9 and reap. */
static void kill9_ps(gt_server *s)
{
    ck_assert_int_gt(s->pid, 0);
    kill(s->pid, SIGKILL);
    int st = 0;
    ck_assert_int_eq(gt_wait_pid(s->pid, WAIT_MS, &st), 1);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    s->pid = 0;
}

/* ---- gddr-train workers ------------------------------------------------------ */

typedef struct worker {
    pid_t pid;
    int rank, exited, status;
    char out[160], err[160];
} worker;

/* Starts build/bin/gddr-train on the MLP and synthetic data with stdout in
 * DIR/NAME.out and stderr in DIR/NAME.err; extra: NULL-terminated. */
static void spawn_trainer(worker *w, const char *dir, const char *name, const char *ep, int rank,
                          int world, const char *const *extra)
{
    memset(w, 0, sizeof *w);
    w->rank = rank;
    snprintf(w->out, sizeof w->out, "%s/%s.out", dir, name);
    snprintf(w->err, sizeof w->err, "%s/%s.err", dir, name);
    static char bin[512];
    gt_bin_path(bin, sizeof bin, "gddr-train");
    char rs[16], ws[16];
    snprintf(rs, sizeof rs, "%d", rank);
    snprintf(ws, sizeof ws, "%d", world);
    char *argv[64];
    int a = 0;
    const char *base[] = { bin, "--server", ep, "--rank", rs, "--world", ws, "--workload", "mlp",
                           "--synthetic", "4000", "--seed", "1", "--timeout-ms", "1000", NULL };
    for (int i = 0; base[i]; i++)
        argv[a++] = (char *)base[i];
    for (int i = 0; extra && extra[i] && a < 62; i++)
        argv[a++] = (char *)extra[i];
    argv[a] = NULL;
    int fo = open(w->out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int fe = open(w->err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ck_assert(fo >= 0 && fe >= 0);
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        gt_child_setup(parent, fo, 0);
        dup2(fe, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fo);
    close(fe);
    w->pid = pid;
}

static int worker_running(worker *w)
{
    if (w->exited)
        return 0;
    int st;
    if (gt_wait_pid(w->pid, 0, &st) == 1) {
        w->exited = 1;
        w->status = st;
        return 0;
    }
    return 1;
}

/* Waits for every worker (one deadline for all) and insists each exited 0. */
static void wait_workers(worker *w, int n, int timeout_ms, const char *what)
{
    int64_t deadline = gt_now_ms() + timeout_ms;
    for (int i = 0; i < n; i++) {
        if (!w[i].exited) {
            int64_t left = deadline - gt_now_ms();
            int st = 0;
            int r = gt_wait_pid(w[i].pid, left > 0 ? (int)left : 0, &st);
            if (r != 1) {
                char *e = gt_slurp_text(w[i].err);
                ck_abort_msg("%s: rank %d did not finish within %d ms\n--- stderr ---\n%.3000s", what,
                             w[i].rank, timeout_ms, e);
            }
            w[i].exited = 1;
            w[i].status = st;
        }
        if (!WIFEXITED(w[i].status) || WEXITSTATUS(w[i].status) != 0) {
            char *e = gt_slurp_text(w[i].err);
            ck_abort_msg("%s: rank %d ended with %s %d\n--- stderr ---\n%.3000s", what, w[i].rank,
                         WIFEXITED(w[i].status) ? "status" : "signal",
                         WIFEXITED(w[i].status) ? WEXITSTATUS(w[i].status) : WTERMSIG(w[i].status), e);
        }
    }
}

static double result_of(const worker *w, const char *key)
{
    char *t = gt_slurp_text(w->out);
    double v = NAN;
    int rc = gt_result_double(t, key, &v);
    ck_assert_msg(rc == 0, "rank %d printed no RESULT %s:\n%.2000s", w->rank, key, t);
    free(t);
    return v;
}

/* ---- clients ------------------------------------------------------------------ */

static gddr_client *open_client(const char *ep, int rank, int world, int observer,
                                double delay_fraction, int ckpt_steps)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = 30000; /* a reply bound that only catches a hang */
    o.reconnect_timeout_ms = 2000;
    o.observer = observer;
    o.delay_fraction = delay_fraction;
    o.residual_checkpoint_steps = ckpt_steps;
    /* These tests make a worker "die" by falling silent: no heartbeat. */
    o.heartbeat_ms = 0;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    ck_assert_msg(rc == GDDR_OK, "gddr_client_open(%s, rank %d): %s", ep, rank, gddr_strerror(rc));
    return c;
}
static uint64_t server_versions(gddr_client *c)
{
    gddr_server_stats st;
    int rc = gddr_server_stats_get(c, &st);
    ck_assert_msg(rc == GDDR_OK, "stats: %s (%s)", gddr_strerror(rc), gddr_client_errmsg(c));
    return st.versions_total;
}

/* ---- reading a checkpoint written by gddr-ps -------------------------------- */

/* The layout of a "tensor/<i>" section (server/persist.c, tensor_head):
 * the head, the key bytes, then n float values. */
typedef struct ck_tensor_head {
    uint64_t version, n;
    uint32_t chunk, flags;
    int32_t tau, calm;
    double norm_ema, rate_ema;
    uint32_t ncontrib, npushes;
    uint32_t keylen, pad;
} ck_tensor_head;

typedef struct ck_tensor {
    char key[128];
    uint64_t version;
    size_t n;
    const float *vals; /* points into the loaded checkpoint */
} ck_tensor;

static uint64_t ckpt_ntensors(const gddr_ckpt *c)
{
    const gddr_ckpt_section *m = gddr__ckpt_find(c, "meta");
    ck_assert_msg(m && m->len >= 24, "%s has no meta section", c->path);
    uint64_t meta[3];
    memcpy(meta, m->data, sizeof meta);
    ck_assert_uint_eq(meta[0], 4); /* format 4: sparse tables ("table/", "trows/"; 3: optimizers, fill) */
    return meta[2];
}

static ck_tensor ckpt_tensor(const gddr_ckpt *c, uint64_t i)
{
    char name[64];
    snprintf(name, sizeof name, "tensor/%" PRIu64, i);
    const gddr_ckpt_section *s = gddr__ckpt_find(c, name);
    ck_assert_msg(s != NULL, "%s has no section %s", c->path, name);
    ck_tensor_head h;
    ck_assert_uint_ge(s->len, sizeof h);
    memcpy(&h, s->data, sizeof h);
    ck_assert_msg(h.keylen > 0 && h.keylen < 128 && s->len >= sizeof h + h.keylen + h.n * 4,
                  "%s: section %s does not look like a tensor", c->path, name);
    ck_tensor t;
    memset(&t, 0, sizeof t);
    memcpy(t.key, (const char *)s->data + sizeof h, h.keylen);
    t.version = h.version;
    t.n = (size_t)h.n;
    t.vals = (const float *)((const char *)s->data + sizeof h + h.keylen);
    return t;
}

/* Loads the newest valid checkpoint of dir (must exist). */
static void load_newest(const char *dir, gddr_ckpt *c)
{
    memset(c, 0, sizeof *c);
    char err[512] = "";
    int rc = gddr__ckpt_load_newest(dir, c, err, sizeof err);
    ck_assert_msg(rc == GDDR_OK, "gddr__ckpt_load_newest(%s): %d %s", dir, rc, err);
}

/* Registers every tensor of the checkpoint through c (an observer) and
 * insists the server holds exactly the checkpoint's values and versions. */
static void assert_server_matches(gddr_client *c, const gddr_ckpt *ck, const char *what)
{
    uint64_t nt = ckpt_ntensors(ck);
    ck_assert_uint_gt(nt, 0);
    for (uint64_t i = 0; i < nt; i++) {
        ck_tensor t = ckpt_tensor(ck, i);
        float *got = calloc(t.n, sizeof(float));
        ck_assert_ptr_nonnull(got);
        int id;
        uint64_t v = 0, pv = 0;
        int rc = gddr_register(c, t.key, got, t.n, &id, &v);
        ck_assert_msg(rc == GDDR_OK, "%s: register '%s': %s", what, t.key, gddr_strerror(rc));
        ck_assert_msg(v == t.version, "%s: '%s' is at version %" PRIu64 ", the checkpoint has %" PRIu64,
                      what, t.key, v, t.version);
        rc = gddr_pull(c, id, got, 0, &pv);
        ck_assert_msg(rc == GDDR_OK, "%s: pull '%s': %s", what, t.key, gddr_strerror(rc));
        ck_assert_uint_eq(pv, t.version);
        char w[256];
        snprintf(w, sizeof w, "%s: tensor '%s' after the restart", what, t.key);
        assert_same_floats(got, t.vals, t.n, w);
        free(got);
    }
}

/* The final model on the server, evaluated on the synthetic training set
 * gddr-train --synthetic 4000 draws (mean loss and accuracy). */
static void evaluate_server_model(const char *ep, double *loss, double *acc)
{
    gddr_dataset ds = { 0 };
    gddr_dataset_synthetic(&ds, 4000, 64, 10, 7);
    gddr_model *m = NULL;
    ck_assert_int_eq(gddr_model_create(GDDR_MODEL_MLP, ds.dim, 128, ds.classes, &m), GDDR_OK);
    gddr_model_init(m, 1);
    gddr_client *c = open_client(ep, 0, 1, 1, 0, 0);
    for (int i = 0; i < gddr_model_ntensors(m); i++) {
        int id;
        size_t n = gddr_model_tensor_len(m, i);
        float *p = gddr_model_params(m, i);
        ck_assert_int_eq(gddr_register(c, gddr_model_tensor_name(m, i), p, n, &id, NULL), GDDR_OK);
        ck_assert_int_eq(gddr_pull(c, id, p, 0, NULL), GDDR_OK);
    }
    gddr_client_close(&c);
    *acc = gddr_model_evaluate(m, &ds, loss);
    gddr_model_free(&m);
    gddr_dataset_free(&ds);
}

/* ---- 1. kill -9 of gddr-ps during training, restart, workers go on ------------ */

#define CRASH_STEPS "3000"

typedef struct run_result {
    double acc[4], loss[4], reconnects[4];
    double model_loss, model_acc;
} run_result;

START_TEST(test_server_kill9_restart)
{
    char dir[64], ckdir[128], log1[160], log2[160], logb[160], listen[300];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(log1, sizeof log1, "%s/ps-crash.log", dir);
    snprintf(log2, sizeof log2, "%s/ps-restart.log", dir);
    snprintf(logb, sizeof logb, "%s/ps-base.log", dir);
    /* --timeout-ms 5000 (instead of spawn_trainer's 1000): the uninterrupted
     * run must not reconnect, and a reply that a loaded machine delays past
     * a short timeout would make it reconnect. */
    const char *extra[] = { "--steps", CRASH_STEPS, "--progress", "0", "--verbose",
                            "--timeout-ms", "5000", NULL };
    run_result base, crash;
    int64_t t0 = gt_now_ms();

    /* The uninterrupted run: same seeds, same steps. */
    {
        gt_server s;
        const char *sets[] = { "mode=async", "workers=4", NULL };
        gt_start_logged(&s, logb, sets);
        worker w[4];
        for (int r = 0; r < 4; r++) {
            char name[32];
            snprintf(name, sizeof name, "base%d", r);
            spawn_trainer(&w[r], dir, name, s.endpoint, r, 4, extra);
        }
        wait_workers(w, 4, TRAIN_WAIT_MS, "uninterrupted run");
        for (int r = 0; r < 4; r++) {
            base.acc[r] = result_of(&w[r], "test_accuracy");
            base.loss[r] = result_of(&w[r], "train_loss");
            base.reconnects[r] = result_of(&w[r], "reconnects");
        }
        evaluate_server_model(s.endpoint, &base.model_loss, &base.model_acc);
        stop_ps_clean(&s, "uninterrupted run");
    }
    int64_t t_base = gt_now_ms() - t0;

    /* The same run, with gddr-ps killed once it has written two checkpoints. */
    gt_server s;
    const char *sets[] = { "mode=async", "workers=4", "checkpoint_interval_s=0.5", NULL };
    char ckset[200];
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *sets1[] = { sets[0], sets[1], sets[2], ckset, NULL };
    gt_start_logged(&s, log1, sets1);
    snprintf(listen, sizeof listen, "listen=%s", s.endpoint);
    worker w[4];
    for (int r = 0; r < 4; r++) {
        char name[32];
        snprintf(name, sizeof name, "crash%d", r);
        spawn_trainer(&w[r], dir, name, s.endpoint, r, 4, extra);
    }
    /* Kill it once the workers have trained a while and a checkpoint was
     * written since. */
    for (int r = 0; r < 4; r++) {
        char joined[64];
        snprintf(joined, sizeof joined, "worker %d joined", r);
        ck_assert_msg(gt_wait_for_text(log1, joined, WAIT_MS) >= 0, "rank %d did not join within %d s", r,
                      WAIT_MS / 1000);
    }
    int64_t deadline = gt_now_ms() + WAIT_MS;
    gddr_client *obs0 = open_client(s.endpoint, 0, 1, 1, 0, 0);
    uint64_t v_joined = server_versions(obs0);
    while (server_versions(obs0) < v_joined + 2000) {
        ck_assert_msg(gt_now_ms() < deadline, "the workers made no progress within %d s",
                      WAIT_MS / 1000);
        gt_sleep_ms(10);
    }
    gddr_client_close(&obs0);
    deadline = gt_now_ms() + WAIT_MS;
    uint64_t seq0 = newest_seq(ckdir);
    while (newest_seq(ckdir) < seq0 + 1) {
        ck_assert_msg(gt_now_ms() < deadline, "no checkpoint written within %d s", WAIT_MS / 1000);
        gt_sleep_ms(10);
    }
    for (int r = 0; r < 4; r++)
        ck_assert_msg(worker_running(&w[r]),
                      "rank %d finished before the crash: raise CRASH_STEPS", r);
    kill9_ps(&s);
    int64_t t_crash = gt_now_ms();

    /* Freeze the workers so nothing reaches the restarted server before we
     * have compared it with the checkpoint. */
    for (int r = 0; r < 4; r++)
        kill(w[r].pid, SIGSTOP);
    gddr_ckpt ck;
    load_newest(ckdir, &ck);
    uint64_t nt = ckpt_ntensors(&ck);
    ck_assert_uint_eq(nt, 4);
    ck_tensor t0k = ckpt_tensor(&ck, 0);
    ck_assert_msg(t0k.version > 0, "the checkpoint holds no update yet");

    const char *sets2[] = { sets[0], sets[1], sets[2], ckset, listen, NULL };
    gt_start_logged(&s, log2, sets2);
    ck_assert_str_eq(s.endpoint, listen + 7);
    char want[4200];
    /* (how many workers it names depends on how many had said hello when
     * it was written, which a loaded machine decides) */
    snprintf(want, sizeof want, "restored checkpoint %s: 4 tensors, ", ck.path);
    ck_assert_msg(gt_wait_for_text(log2, want, WAIT_MS) >= 0, "the restarted server did not log '%s'", want);
    gddr_client *obs = open_client(s.endpoint, 0, 1, 1, 0, 0);
    assert_server_matches(obs, &ck, "kill -9 restart");
    gddr_client_close(&obs);
    int64_t t_restart = gt_now_ms();
    for (int r = 0; r < 4; r++)
        kill(w[r].pid, SIGCONT);

    wait_workers(w, 4, TRAIN_WAIT_MS, "interrupted run");
    for (int r = 0; r < 4; r++) {
        crash.acc[r] = result_of(&w[r], "test_accuracy");
        crash.loss[r] = result_of(&w[r], "train_loss");
        crash.reconnects[r] = result_of(&w[r], "reconnects");
        ck_assert_msg(crash.reconnects[r] >= 1, "rank %d did not reconnect (reconnects=%g)", r,
                      crash.reconnects[r]);
        ck_assert_msg(base.reconnects[r] == 0, "rank %d reconnected in the uninterrupted run", r);
    }
    evaluate_server_model(s.endpoint, &crash.model_loss, &crash.model_acc);
    stop_ps_clean(&s, "restarted server");

    double ab = 0, ac = 0, lb = 0, lc = 0;
    for (int r = 0; r < 4; r++) {
        ab += base.acc[r] / 4, ac += crash.acc[r] / 4;
        lb += base.loss[r] / 4, lc += crash.loss[r] / 4;
        ck_assert_msg(fabs(crash.acc[r] - base.acc[r]) <= 0.01,
                      "rank %d: accuracy %.4f after the crash, %.4f without", r, crash.acc[r],
                      base.acc[r]);
    }
    ck_assert_msg(fabs(lc - lb) <= 0.05, "mean train_loss %.4f after the crash, %.4f without", lc, lb);
    ck_assert_msg(fabs(crash.model_acc - base.model_acc) <= 0.01,
                  "final model accuracy %.4f after the crash, %.4f without", crash.model_acc,
                  base.model_acc);
    ck_assert_msg(fabs(crash.model_loss - base.model_loss) <= 0.05,
                  "final model loss %.4f after the crash, %.4f without", crash.model_loss,
                  base.model_loss);
    fprintf(stderr,
            "recovery: kill -9 of gddr-ps: restored %s (%s at version %" PRIu64 "), down %lld ms; "
            "accuracy %.4f vs %.4f uninterrupted (delta %+.4f), train_loss %.4f vs %.4f, "
            "final model loss %.4f vs %.4f; runs took %lld + %lld ms\n",
            strrchr(ck.path, '/') + 1, t0k.key, t0k.version, (long long)(t_restart - t_crash), ac, ab,
            ac - ab, lc, lb, crash.model_loss, base.model_loss, (long long)t_base,
            (long long)(gt_now_ms() - t0 - t_base));
    gddr__ckpt_free(&ck);
    gt_rm_rf(dir);
}
END_TEST

/* ---- 1b. how long a step waits for a dead server ------------------------------------------ */

/* The client's debug log, as far as the waits that timed out go: every
 * "no reply from SERVER within N ms" line (client/src/conn_reply.c,
 * gddr__wait_op) is one wait that ran out, N being the budget it had. */
typedef struct timeout_log {
    pthread_mutex_t mu;
    int waits;        /* timed-out waits */
    long budget_ms;   /* their budgets added up */
    char budgets[256]; /* "2000 0 ..." for the failure message */
} timeout_log;

static void timeout_log_fn(void *user, int level, const char *msg)
{
    (void)level;
    timeout_log *tl = user;
    const char *p = strstr(msg, "no reply from ");
    const char *w = p ? strstr(p, " within ") : NULL;
    int ms;
    if (!w || sscanf(w, " within %d ms", &ms) != 1)
        return;
    pthread_mutex_lock(&tl->mu);
    tl->waits++;
    tl->budget_ms += ms;
    size_t len = strlen(tl->budgets);
    snprintf(tl->budgets + len, sizeof tl->budgets - len, "%s%d", len ? " + " : "", ms);
    pthread_mutex_unlock(&tl->mu);
}

/* A step whose server stopped answering should give up after one timeout:
 * its push and pull requests go out together, so their replies should share
 * one deadline (client/src/step.c: "a dead server must cost one timeout").
 * The longest single wait a step allows is timeout_ms + 1 s (a pull may be
 * parked for timeout_ms). The server is frozen with SIGSTOP, so nothing
 * answers and nothing disconnects; reconnect_timeout_ms is shorter than one
 * wait, so the step returns GDDR_ETIMEDOUT instead of reconnecting.
 *
 * Not with the clock (a loaded machine stretches every wait): the client
 * logs each wait that timed out with the budget it was given, and those
 * budgets must add up to one step deadline (timeout_ms + 1 s), plus at most
 * one reconnect try (reconnect_timeout_ms). Waiting timeout_ms for the push
 * replies and then timeout_ms + 1 s more for the pull replies adds up to
 * 3 s here, over the 2.2 s allowed. The elapsed time is only printed, and
 * checked against a loose hang-catcher. */
START_TEST(test_dead_server_costs_one_timeout)
{
    char dir[64], log[160];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    gt_server s;
    gt_start_logged(&s, log, NULL);
    static timeout_log tl; /* static: the client may log from its threads */
    memset(&tl, 0, sizeof tl);
    pthread_mutex_init(&tl.mu, NULL);
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 1000;
    o.reconnect_timeout_ms = 200;
    o.log = timeout_log_fn;
    o.log_user = &tl;
    o.log_level = GDDR_LOG_DEBUG;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w[CN] = { 0 }, g[CN], p[CN];
    int id;
    ck_assert_int_eq(gddr_register(c, "w", w, CN, &id, NULL), GDDR_OK);
    uint64_t rng = 5;
    int_grad(&rng, g, CN);
    const float *gp[1] = { g };
    float *pp[1] = { p };
    ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
    pthread_mutex_lock(&tl.mu); /* count only the step against the frozen server */
    tl.waits = 0;
    tl.budget_ms = 0;
    tl.budgets[0] = 0;
    pthread_mutex_unlock(&tl.mu);
    kill(s.pid, SIGSTOP);
    int64_t t0 = gt_now_ms();
    int rc = gddr_step(c, gp, pp);
    double took = (double)(gt_now_ms() - t0) / 1000.0;
    kill(s.pid, SIGCONT);
    ck_assert_int_eq(rc, GDDR_ETIMEDOUT);
    c->info.epoch = 0; /* no Bye to wait for */
    gddr_client_close(&c);
    stop_ps_clean(&s, "frozen server");
    gt_rm_rf(dir);
    pthread_mutex_lock(&tl.mu);
    int waits = tl.waits;
    long budget = tl.budget_ms;
    char budgets[256];
    snprintf(budgets, sizeof budgets, "%s", tl.budgets);
    pthread_mutex_unlock(&tl.mu);
    fprintf(stderr,
            "recovery: a step against a frozen server (timeout_ms 1000) gave up after %.2f s; "
            "%d waits timed out, budgets %s ms\n",
            took, waits, budgets);
    ck_assert_msg(waits >= 1,
                  "the step returned GDDR_ETIMEDOUT but the client logged no wait that timed out "
                  "(no \"no reply from ... within N ms\" debug line)");
    const long one_deadline = o.timeout_ms + 1000, allowed = one_deadline + o.reconnect_timeout_ms;
    ck_assert_msg(budget <= allowed,
                  "a step against a silent server waited with budgets %s ms (%ld ms in all) with "
                  "timeout_ms 1 s: more than one step deadline (%ld ms) plus one reconnect try "
                  "(%d ms). It waits timeout_ms for its push replies, then timeout_ms + 1 s more for "
                  "its pull replies (client/src/step.c exchange()), instead of one deadline for both",
                  budgets, budget, one_deadline, o.reconnect_timeout_ms);
    /* It did wait (a lower bound load cannot break), and it did not hang. */
    ck_assert_msg(took >= o.timeout_ms / 1000.0, "the step gave up after %.2f s, before timeout_ms",
                  took);
    ck_assert_msg(took < 10.0 * allowed / 1000.0, "the step against a frozen server hung for %.2f s",
                  took);
}
END_TEST

/* ---- 2. a damaged newest checkpoint is skipped for the previous one --------------- */

typedef struct ck_state {
    float vals[300];
    uint64_t version;
} ck_state;

/* One server run that leaves checkpoints 1, 2 (requested) and 3 (SIGTERM)
 * in ckdir, with the state each holds. */
static void make_three_checkpoints(const char *dir, const char *ckdir, ck_state st[3])
{
    char log[160], ckset[200];
    snprintf(log, sizeof log, "%s/ps-make.log", dir);
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *sets[] = { "checkpoint_interval_s=0", "lr=0.5", "chunk=64", ckset, NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c = open_client(s.endpoint, 0, 1, 0, 0, 0);
    float init[300], g[300];
    for (int i = 0; i < 300; i++)
        init[i] = (float)i * 0.25f - 3.0f;
    int id;
    ck_assert_int_eq(gddr_register(c, "w", init, 300, &id, NULL), GDDR_OK);
    for (int k = 0; k < 3; k++) {
        for (int rep = 0; rep <= k; rep++) {
            for (int i = 0; i < 300; i++)
                g[i] = (float)((i * 7 + k * 13 + rep) % 11) - 5.0f;
            ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
        }
        ck_assert_int_eq(gddr_pull(c, id, st[k].vals, 0, &st[k].version), GDDR_OK);
        if (k < 2) {
            ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
            ck_assert_msg(wait_ckpts(ckdir, (size_t)k + 1, WAIT_MS) >= 0, "checkpoint %d did not appear",
                          k + 1);
        }
    }
    gddr_client_close(&c);
    stop_ps_clean(&s, "making checkpoints");
    ck_assert_uint_eq(count_ckpts(ckdir), 3);
}

static void damaged_newest(int truncate_it)
{
    char dir[64], ckdir[128], log[160], path3[300], path2[300], ckset[200];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(log, sizeof log, "%s/ps-restart.log", dir);
    ck_state st[3];
    make_three_checkpoints(dir, ckdir, st);
    ck_assert_uint_ne(st[1].version, st[2].version);
    snprintf(path3, sizeof path3, "%s/ckpt-%020d.gddr", ckdir, 3);
    snprintf(path2, sizeof path2, "%s/ckpt-%020d.gddr", ckdir, 2);
    struct stat sb;
    ck_assert_int_eq(stat(path3, &sb), 0);
    if (truncate_it) {
        ck_assert_int_eq(truncate(path3, sb.st_size / 2), 0);
    } else {
        /* One bit of one value in the middle of the file. */
        int fd = open(path3, O_RDWR);
        ck_assert_int_ge(fd, 0);
        unsigned char b;
        off_t at = sb.st_size / 2;
        ck_assert_int_eq(pread(fd, &b, 1, at), 1);
        b ^= 0x10;
        ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
        close(fd);
    }
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *sets[] = { "checkpoint_interval_s=0", "lr=0.5", "chunk=64", ckset, NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    char want[700], line[1024];
    snprintf(want, sizeof want, "checkpoint %s skipped: ", path3);
    ck_assert_msg(gt_wait_for_text(log, want, WAIT_MS) >= 0, "no '%s' line in the log", want);
    gt_find_line(log, want, line, sizeof line);
    ck_assert_msg(strstr(line, truncate_it ? "bad trailer magic" : "CRC mismatch") != NULL,
                  "unexpected reason: %s", line);
    snprintf(want, sizeof want, "restored checkpoint %s: 1 tensors", path2);
    ck_assert_msg(gt_wait_for_text(log, want, WAIT_MS) >= 0, "no '%s' line in the log", want);
    gddr_client *c = open_client(s.endpoint, 0, 1, 1, 0, 0);
    float got[300];
    int id;
    uint64_t v = 0;
    ck_assert_int_eq(gddr_register(c, "w", got, 300, &id, &v), GDDR_OK);
    ck_assert_uint_eq(v, st[1].version);
    ck_assert_int_eq(gddr_pull(c, id, got, 0, &v), GDDR_OK);
    ck_assert_uint_eq(v, st[1].version);
    assert_same_floats(got, st[1].vals, 300, "values restored from checkpoint 2");
    gddr_client_close(&c);
    stop_ps_clean(&s, "restarted server");
    /* The damaged file is moved aside for the operator, never deleted. */
    char aside[sizeof path3 + 16];
    snprintf(aside, sizeof aside, "%s.damaged", path3);
    ck_assert_msg(access(aside, F_OK) == 0, "%s is missing", aside);
    ck_assert_int_ne(access(path3, F_OK), 0);
    snprintf(want, sizeof want, "unreadable checkpoint moved aside to %s", aside);
    ck_assert_msg(gt_file_has(log, want), "no '%s' line in the log", want);
    fprintf(stderr, "recovery: %s newest checkpoint skipped (%s); restored checkpoint 2 (version %" PRIu64 ")\n",
            truncate_it ? "truncated" : "bit-flipped", strstr(line, "skipped: ") + 9, st[1].version);
    gt_rm_rf(dir);
}

START_TEST(test_corrupt_newest_checkpoint)
{
    damaged_newest(0);
}
END_TEST

START_TEST(test_truncated_newest_checkpoint)
{
    damaged_newest(1);
}
END_TEST

/* ---- 3. a sync worker killed, the others go on, it rejoins ---------------------- */

START_TEST(test_sync_worker_kill9_rejoin)
{
    char dir[64], log[160];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const double timeout_s = 2.0;
    const char *sets[] = { "mode=sync", "workers=4", "worker_timeout_s=2", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    const char *extra[] = { "--steps", "2500", "--progress", "0", "--delay-fraction", "0.5",
                            "--residual-checkpoint-steps", "2", "--verbose", NULL };
    worker w[4];
    for (int r = 0; r < 4; r++) {
        char name[32];
        snprintf(name, sizeof name, "rank%d", r);
        spawn_trainer(&w[r], dir, name, s.endpoint, r, 4, extra);
    }
    gddr_client *obs = open_client(s.endpoint, 0, 1, 1, 0, 0);
    /* Let them train a little: 50 sync steps of the 4 tensors. */
    int64_t deadline = gt_now_ms() + WAIT_MS;
    while (server_versions(obs) < 200) {
        ck_assert_msg(gt_now_ms() < deadline, "the workers made no progress");
        gt_sleep_ms(20);
    }
    kill(w[3].pid, SIGKILL);
    int st;
    ck_assert_int_eq(gt_wait_pid(w[3].pid, WAIT_MS, &st), 1);
    w[3].exited = 1;
    int64_t t_kill = gt_now_ms();
    uint64_t v_kill = server_versions(obs);
    /* The survivors are blocked in the step the dead worker never joins
     * until it is declared dead; then they go on. Progress = two more sync
     * steps (8 versions) past the step in flight. How long that took is
     * printed, not asserted (a loaded machine stretches it): the deadline
     * only catches survivors that never go on. */
    int64_t t_resume = -1;
    deadline = t_kill + (int64_t)(timeout_s * 1000) + WAIT_MS;
    while (gt_now_ms() < deadline) {
        if (server_versions(obs) >= v_kill + 12) {
            t_resume = gt_now_ms();
            break;
        }
        gt_sleep_ms(20);
    }
    ck_assert_msg(t_resume > 0, "the survivors made no progress within %g s of the kill",
                  timeout_s + WAIT_MS / 1000);
    double stall = (double)(t_resume - t_kill) / 1000.0;
    /* They went on because rank 3 was declared dead. */
    ck_assert_msg(gt_wait_for_text(log, "worker 3 declared dead", WAIT_MS) >= 0,
                  "the survivors went on but the server never declared worker 3 dead");
    for (int r = 0; r < 3; r++)
        ck_assert_msg(worker_running(&w[r]), "rank %d finished before the restart: raise --steps", r);

    /* The same rank comes back (a fresh process with an empty residual). */
    const char *extra2[] = { "--steps", "200", "--progress", "0", "--verbose", NULL };
    worker back;
    spawn_trainer(&back, dir, "rank3-again", s.endpoint, 3, 4, extra2);
    ck_assert_msg(gt_wait_for_text(log, "worker 3 rejoined", WAIT_MS) >= 0, "no 'worker 3 rejoined' line");
    wait_workers(&back, 1, TRAIN_WAIT_MS, "restarted rank 3");
    ck_assert_double_eq(result_of(&back, "steps"), 200);
    ck_assert_msg(result_of(&back, "test_accuracy") > 0.5, "the rejoined worker did not train");
    wait_workers(w, 3, TRAIN_WAIT_MS, "survivors");
    for (int r = 0; r < 3; r++)
        ck_assert_double_eq(result_of(&w[r], "steps"), 2500);

    /* The dead worker's residual went to a survivor: how long it took. */
    char line[1024];
    double rec = -1;
    if (gt_wait_for_text(log, "orphan of rank 3", WAIT_MS) >= 0 &&
        gt_find_line(log, " re-injected by rank", line, sizeof line) == 0) {
        const char *p = strstr(line, "re-injected by rank");
        unsigned by;
        if (sscanf(p, "re-injected by rank %u %lf s after", &by, &rec) != 2)
            rec = -1;
    }
    ck_assert_msg(rec >= 0, "no orphan of rank 3 was re-injected (server log %s)", log);
    double recovered = gt_server_metric(obs, "gddr_orphans_recovered_total");
    ck_assert_msg(recovered >= 1, "gddr_orphans_recovered_total is %g", recovered);
    gddr_client_close(&obs);
    stop_ps_clean(&s, "sync server");
    fprintf(stderr,
            "recovery: sync worker kill -9: survivors resumed %.2f s after the kill "
            "(worker_timeout_s %g); orphan re-injected %.3f s after the death was declared; rank 3 "
            "rejoined and trained\n",
            stall, timeout_s, rec);
    gt_rm_rf(dir);
}
END_TEST

/* ---- 4. gradient mass across a worker's death, to the last bit ------------------- */

static void step_one(gddr_client *c, uint64_t *rng, double *produced, float *params)
{
    float g[CN];
    int_grad(rng, g, CN);
    for (int i = 0; i < CN; i++)
        produced[i] += g[i];
    const float *gp[1] = { g };
    float *pp[1] = { params };
    int rc = gddr_step(c, gp, pp);
    ck_assert_msg(rc == GDDR_OK, "gddr_step: %s (%s)", gddr_strerror(rc), gddr_client_errmsg(c));
}

/* What the server keeps of a worker's residual (server/orphan.c), tracked
 * independently from the outside: after each step a chunk with age 0 was
 * sent, one with age > 0 is held. Every residual_checkpoint_steps a push
 * carries the held chunks (unless it is dense: then nothing is held). */
typedef struct snap_model {
    float snap[CN];
    int held[8], sent[8];
    int every;
} snap_model;

static void snap_after_step(snap_model *m, gddr_client *c, uint64_t step_index)
{
    float r[CN];
    uint32_t age[8];
    size_t nch = 0;
    ck_assert_int_eq(gddr__residual_get(c, 0, r), GDDR_OK);
    ck_assert_int_eq(gddr__residual_age_get(c, 0, age, &nch), GDDR_OK);
    ck_assert_uint_eq(nch, (CN + 3) / 4);
    int dense = 1;
    for (size_t ch = 0; ch < nch; ch++)
        if (age[ch] > 0)
            dense = 0;
    for (size_t ch = 0; ch < nch; ch++)
        if (age[ch] == 0)
            m->sent[ch] = 1;
    if ((step_index + 1) % (uint64_t)m->every == 0 && !dense) {
        memcpy(m->snap, r, sizeof m->snap);
        for (size_t ch = 0; ch < nch; ch++) {
            m->held[ch] = age[ch] > 0;
            m->sent[ch] = 0;
        }
    }
}

START_TEST(test_conservation_across_death)
{
    char dir[64], log[160];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "mode=async", "lr=1", "chunk=4", "worker_timeout_s=1", "tau_dynamic=false",
                           "workers=3", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c[3];
    for (int j = 0; j < 3; j++)
        c[j] = open_client(s.endpoint, j, 3, 0, 0.5, 2);
    float w0[CN], params[3][CN];
    for (int i = 0; i < CN; i++)
        w0[i] = (float)(i % 7) - 3.0f;
    for (int j = 0; j < 3; j++) {
        int id;
        ck_assert_int_eq(gddr_register(c[j], "w", w0, CN, &id, NULL), GDDR_OK);
        ck_assert_int_eq(id, 0);
    }
    mass m;
    memset(&m, 0, sizeof m);
    uint64_t rng[3] = { 0x1234567u, 0x89abcdefu, 0x5555aaaau };
    snap_model sm;
    memset(&sm, 0, sizeof sm);
    sm.every = 2;

    /* Five steps each. Worker 2 snapshots its residual at its steps 1 and 3
     * (holding chunks 1-4 at step 3); its step 4 sends chunk 3 again, so the
     * orphan is chunks 1, 2 and 4 as they were at step 3, and what they got
     * at step 4 is lost. (The hold masks depend on rank, tensor and step
     * only, not on the values.) */
    for (uint64_t k = 0; k < 5; k++)
        for (int j = 0; j < 3; j++) {
            step_one(c[j], &rng[j], m.produced, params[j]);
            if (j == 2)
                snap_after_step(&sm, c[2], k);
        }
    /* Worker 2 goes silent (no Bye, socket left open). */
    float r_dead[CN], orphan[CN];
    ck_assert_int_eq(gddr__residual_get(c[2], 0, r_dead), GDDR_OK);
    size_t orphan_vals = 0;
    double lost_l1 = 0;
    for (int i = 0; i < CN; i++) {
        int ch = i / 4;
        orphan[i] = sm.held[ch] && !sm.sent[ch] ? sm.snap[i] : 0.0f;
        orphan_vals += sm.held[ch] && !sm.sent[ch];
        lost_l1 += fabs((double)r_dead[i] - orphan[i]);
    }
    int excluded = 0;
    for (int ch = 0; ch < (CN + 3) / 4; ch++)
        excluded += sm.held[ch] && sm.sent[ch];
    ck_assert_msg(orphan_vals > 0, "worker 2 held nothing at its last snapshot: change the seeds");
    ck_assert_msg(excluded > 0, "no chunk of the snapshot was sent since: change the seeds");
    ck_assert_msg(lost_l1 > 0, "worker 2 accumulated nothing after its last snapshot: change the seeds");

    /* The survivors go on until one of them took the orphan over, replayed
     * its 8 installments and reported it (one more push). */
    int64_t t_silent = gt_now_ms(), deadline = t_silent + WAIT_MS;
    int taker = -1, after = 0;
    for (;;) {
        ck_assert_msg(gt_now_ms() < deadline, "the orphan was not re-injected within %d s",
                      WAIT_MS / 1000);
        for (int j = 0; j < 2; j++)
            step_one(c[j], &rng[j], m.produced, params[j]);
        gddr_client_counters k0, k1;
        gddr_client_counters_get(c[0], &k0);
        gddr_client_counters_get(c[1], &k1);
        if (taker < 0 && (k0.orphans_received || k1.orphans_received))
            taker = k0.orphans_received ? 0 : 1;
        if (taker >= 0 && ++after >= 10)
            break;
        gt_sleep_ms(taker < 0 ? 20 : 0);
    }
    ck_assert_ptr_null(c[taker]->t[0].res.orphan); /* every installment replayed */
    gddr_client_counters kt;
    gddr_client_counters_get(c[taker], &kt);
    ck_assert_uint_eq(kt.orphans_received, 1);
    double recovered = gt_server_metric(c[0], "gddr_orphans_recovered_total");
    double handed = gt_server_metric(c[0], "gddr_orphans_handed_total");
    double rec_s = gt_server_metric(c[0], "gddr_recovery_seconds");
    ck_assert_msg(handed == 1 && recovered == 1, "orphans handed %g, recovered %g", handed, recovered);
    char want[200];
    snprintf(want, sizeof want, "(%zu values)", orphan_vals);
    ck_assert_msg(gt_file_has(log, "worker 2 held residual") && gt_file_has(log, want),
                  "no 'worker 2 held residual ... (%zu values)' line in the server log", orphan_vals);
    snprintf(want, sizeof want, "orphan of rank 2 in tensor 'w' re-injected by rank %d", taker);
    ck_assert_msg(gt_file_has(log, want), "no '%s' line in the server log", want);
    /* What the dead worker held (its last push said so) against what its
     * snapshot handed over, as the server exports them. */
    double held_l1 = 0, orphan_l1 = 0;
    for (int i = 0; i < CN; i++) {
        held_l1 += fabs((double)r_dead[i]);
        orphan_l1 += fabs((double)orphan[i]);
    }
    double m_held = gt_server_metric(c[0], "gddr_dead_residual_l1_total");
    double m_handed = gt_server_metric(c[0], "gddr_dead_residual_handed_l1_total");
    double m_lost = gt_server_metric(c[0], "gddr_dead_residual_lost_l1_total");
    ck_assert_msg(fabs(m_held - held_l1) <= 1e-5 * held_l1, "held |.|_1 %g, expected %g", m_held, held_l1);
    ck_assert_msg(fabs(m_handed - orphan_l1) <= 1e-5 * orphan_l1, "handed |.|_1 %g, expected %g",
                  m_handed, orphan_l1);
    ck_assert_msg(fabs(m_lost - (held_l1 - orphan_l1)) <= 1e-5 * held_l1, "lost |.|_1 %g, expected %g",
                  m_lost, held_l1 - orphan_l1);

    /* The books. */
    float w[CN], r0[CN], r1[CN];
    ck_assert_int_eq(gddr_pull(c[0], 0, w, 0, NULL), GDDR_OK);
    ck_assert_int_eq(gddr__residual_get(c[0], 0, r0), GDDR_OK);
    ck_assert_int_eq(gddr__residual_get(c[1], 0, r1), GDDR_OK);
    for (int i = 0; i < CN; i++) {
        double lhs = ((double)w0[i] - w[i]) + r0[i] + r1[i];
        double rhs = m.produced[i] - ((double)r_dead[i] - orphan[i]);
        ck_assert_msg(lhs == rhs,
                      "element %d: applied %.9g + live residuals %.9g + %.9g = %.9g, but produced %.9g "
                      "- lost (%.9g - orphan %.9g) = %.9g",
                      i, (double)w0[i] - w[i], (double)r0[i], (double)r1[i], lhs, m.produced[i],
                      (double)r_dead[i], (double)orphan[i], rhs);
    }
    /* Closing the survivors flushes what they hold: then the server has
     * applied everything but the lost part. */
    gddr_client_close(&c[0]);
    gddr_client_close(&c[1]);
    gddr_client *obs = open_client(s.endpoint, 0, 1, 1, 0, 0);
    int id;
    ck_assert_int_eq(gddr_register(obs, "w", w0, CN, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull(obs, id, w, 0, NULL), GDDR_OK);
    for (int i = 0; i < CN; i++) {
        double lhs = (double)w0[i] - w[i];
        double rhs = m.produced[i] - ((double)r_dead[i] - orphan[i]);
        ck_assert_msg(lhs == rhs, "after close, element %d: applied %.9g, expected %.9g", i, lhs, rhs);
    }
    gddr_client_close(&obs);
    /* The dead one vanishes without a word (no flush, no Bye). */
    c[2]->info.epoch = 0;
    gddr_client_close(&c[2]);
    stop_ps_clean(&s, "conservation");
    fprintf(stderr,
            "recovery: conservation exact over %d values; orphan of %zu values re-injected by rank %d "
            "%.3f s after the death was declared (%.2f s after worker 2 fell silent, worker_timeout_s 1); "
            "lost (accumulated after the last snapshot) |.|_1 = %g\n",
            CN, orphan_vals, taker, rec_s, (double)(gt_now_ms() - t_silent) / 1000.0, lost_l1);
    gt_rm_rf(dir);
}
END_TEST

/* ---- 5. the installments a survivor replays add up to the orphan exactly ------------ */

#define IN 24 /* 6 chunks of 4 */

static void installments(double gamma, int integer_values)
{
    char dir[64], log[160];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "mode=async", "lr=1", "chunk=4", "worker_timeout_s=1", "tau_dynamic=false",
                           NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    /* The survivor pushes dense zero gradients: each of its pushes is
     * exactly the installment it adds (docs/design.md section 7, dense
     * path). */
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 2;
    o.timeout_ms = 30000;
    o.replay_decay = gamma;
    gddr_client *sv = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &sv), GDDR_OK);
    /* The one that dies snapshots its residual at every step. */
    gddr_client *dead = open_client(s.endpoint, 1, 2, 0, 0.5, 1);
    float w0[IN], g[IN], zero[IN], params[IN], pd[IN];
    memset(w0, 0, sizeof w0);
    memset(zero, 0, sizeof zero);
    int id;
    ck_assert_int_eq(gddr_register(sv, "w", w0, IN, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_register(dead, "w", w0, IN, &id, NULL), GDDR_OK);
    uint64_t rng = 0xfeedbeefu;
    const float *gp[1] = { g };
    float *pp[1] = { pd };
    for (int k = 0; k < 3; k++) {
        if (integer_values) {
            int_grad(&rng, g, IN);
        } else {
            for (int i = 0; i < IN; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                g[i] = (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
            }
        }
        ck_assert_int_eq(gddr_step(dead, gp, pp), GDDR_OK);
    }
    /* With a snapshot at its last step, the orphan is its whole residual. */
    float orphan[IN];
    ck_assert_int_eq(gddr__residual_get(dead, 0, orphan), GDDR_OK);
    int nonzero = 0;
    for (int i = 0; i < IN; i++)
        nonzero += orphan[i] != 0.0f;
    ck_assert_msg(nonzero > 0, "the dying worker holds nothing: change the seed");

    /* The survivor steps (zero gradients) until the orphan arrives. */
    const float *zp[1] = { zero };
    float *sp[1] = { params };
    int64_t deadline = gt_now_ms() + WAIT_MS;
    gddr_client_counters k;
    for (;;) {
        ck_assert_msg(gt_now_ms() < deadline, "no orphan reached the survivor within %d s",
                      WAIT_MS / 1000);
        ck_assert_int_eq(gddr_step(sv, zp, sp), GDDR_OK);
        gddr_client_counters_get(sv, &k);
        if (k.orphans_received)
            break;
        gt_sleep_ms(20);
    }
    /* Nine more steps: eight installments, then nothing. The expected
     * installments come from gddr_replay_cpu on the orphan; the expected
     * server values apply them the way the server does (w -= 1 * g). */
    float rem[IN], inst[IN], wexp[IN], prev[IN];
    memcpy(rem, orphan, sizeof rem);
    memcpy(wexp, params, sizeof wexp);
    double sum[IN] = { 0 };
    for (int step = 1; step <= 9; step++) {
        memcpy(prev, params, sizeof prev);
        ck_assert_int_eq(gddr_step(sv, zp, sp), GDDR_OK);
        memset(inst, 0, sizeof inst);
        if (step <= 8)
            ck_assert_int_eq(gddr_replay_cpu(inst, rem, IN, (float)gamma, step == 8), GDDR_OK);
        for (int i = 0; i < IN; i++) {
            sum[i] += inst[i];
            wexp[i] -= 1.0f * inst[i];
        }
        char what[96];
        snprintf(what, sizeof what, "server values after installment %d (gamma %g)", step, gamma);
        assert_same_floats(params, wexp, IN, what);
        if (integer_values) {
            /* Exact arithmetic: each push is visible as it was. */
            float seen[IN];
            for (int i = 0; i < IN; i++)
                seen[i] = prev[i] - params[i];
            snprintf(what, sizeof what, "installment %d (gamma %g)", step, gamma);
            assert_same_floats(seen, inst, IN, what);
        }
    }
    for (int i = 0; i < IN; i++) {
        ck_assert_msg(sum[i] == (double)orphan[i], "element %d: installments add up to %.9g, orphan %.9g",
                      i, sum[i], (double)orphan[i]);
        ck_assert(rem[i] == 0.0f);
    }
    ck_assert_ptr_null(sv->t[0].res.orphan);
    dead->info.epoch = 0; /* vanish: no flush, no Bye */
    gddr_client_close(&dead);
    gddr_client_close(&sv);
    stop_ps_clean(&s, "installments");
    fprintf(stderr, "recovery: 8 installments (gamma %g, %s values) add up to the orphan exactly\n", gamma,
            integer_values ? "integer" : "random");
    gt_rm_rf(dir);
}

START_TEST(test_installments_sum_to_orphan)
{
    installments(0.5, 1);
}
END_TEST

START_TEST(test_installments_random_floats)
{
    installments(0.3, 0);
}
END_TEST

/* ---- 4b. a survivor that closes in the middle of a replay ------------------------------- */

/* Steps every client in cs[0..n) once with fresh integer gradients. */
static void step_all(gddr_client **cs, int n, uint64_t *rng, double *produced, float params[][CN])
{
    for (int j = 0; j < n; j++)
        step_one(cs[j], &rng[j], produced, params[j]);
}

/* w0 - w on the server, through an observer, == expected, exactly. */
static void assert_applied(const char *ep, const float *w0, const double *expected, const char *what)
{
    gddr_client *obs = open_client(ep, 0, 1, 1, 0, 0);
    float w[CN];
    int id;
    ck_assert_int_eq(gddr_register(obs, "w", w0, CN, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull(obs, id, w, 0, NULL), GDDR_OK);
    gddr_client_close(&obs);
    for (int i = 0; i < CN; i++)
        ck_assert_msg((double)w0[i] - w[i] == expected[i], "%s: element %d: applied %.9g, expected %.9g",
                      what, i, (double)w0[i] - w[i], expected[i]);
}

/* With a snapshot at every step, the dead worker's orphan is its whole
 * residual, so nothing at all is lost: once the survivor has closed (and
 * flushed), the server has applied every gradient ever produced, even
 * though the survivor closed after only 2 of the 8 installments. */
START_TEST(test_close_during_replay)
{
    char dir[64], log[160];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "mode=async", "lr=1", "chunk=4", "worker_timeout_s=1", "tau_dynamic=false",
                           NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c[2] = { open_client(s.endpoint, 0, 2, 0, 0.5, 2),
                          open_client(s.endpoint, 1, 2, 0, 0.5, 1) };
    float w0[CN], params[2][CN];
    for (int i = 0; i < CN; i++)
        w0[i] = (float)(i % 5);
    int id;
    for (int j = 0; j < 2; j++)
        ck_assert_int_eq(gddr_register(c[j], "w", w0, CN, &id, NULL), GDDR_OK);
    double produced[CN] = { 0 };
    uint64_t rng[2] = { 77, 99 };
    for (int k = 0; k < 4; k++)
        step_all(c, 2, rng, produced, params);
    float r_dead[CN];
    ck_assert_int_eq(gddr__residual_get(c[1], 0, r_dead), GDDR_OK);
    double held = 0;
    for (int i = 0; i < CN; i++)
        held += fabs(r_dead[i]);
    ck_assert_msg(held > 0, "worker 1 holds nothing: change the seeds");
    /* Worker 1 falls silent; worker 0 goes on until it has the orphan, then
     * two more steps, then closes. */
    int64_t deadline = gt_now_ms() + WAIT_MS;
    gddr_client_counters k;
    do {
        ck_assert_msg(gt_now_ms() < deadline, "no orphan within %d s", WAIT_MS / 1000);
        step_all(c, 1, rng, produced, params);
        gddr_client_counters_get(c[0], &k);
        gt_sleep_ms(20);
    } while (!k.orphans_received);
    step_all(c, 1, rng, produced, params);
    step_all(c, 1, rng, produced, params);
    ck_assert_ptr_nonnull(c[0]->t[0].res.orphan); /* still replaying */
    gddr_client_close(&c[0]);
    assert_applied(s.endpoint, w0, produced, "after the survivor closed mid-replay");
    ck_assert_msg(gt_wait_for_text(log, "orphan of rank 1 in tensor 'w' re-injected by rank 0", WAIT_MS) >= 0,
                  "the flush did not report the orphan as re-injected");
    c[1]->info.epoch = 0;
    gddr_client_close(&c[1]);
    stop_ps_clean(&s, "close during replay");
    gt_rm_rf(dir);
}
END_TEST

/* ---- 4c. a worker declared dead that was only slow --------------------------------------- */

/* A worker silent for worker_timeout_s is declared dead and its residual
 * snapshot handed to a survivor, but a slow worker (a long step, a network
 * stall) still holds that residual when it comes back. Nothing may be
 * counted twice: once everyone has closed (and flushed), the server must
 * have applied exactly what was produced. delivered: the comeback happens
 * after the survivor took the orphan over (else before anyone pushed). */
static void slow_not_dead(int delivered)
{
    char dir[64], log[160];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "mode=async", "lr=1", "chunk=4", "worker_timeout_s=1", "tau_dynamic=false",
                           NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c[2] = { open_client(s.endpoint, 0, 2, 0, 0.5, 2),
                          open_client(s.endpoint, 1, 2, 0, 0.5, 1) };
    float w0[CN], params[2][CN];
    for (int i = 0; i < CN; i++)
        w0[i] = (float)(i % 3);
    int id;
    for (int j = 0; j < 2; j++)
        ck_assert_int_eq(gddr_register(c[j], "w", w0, CN, &id, NULL), GDDR_OK);
    double produced[CN] = { 0 };
    uint64_t rng[2] = { 1234, 5678 };
    for (int k = 0; k < 4; k++)
        step_all(c, 2, rng, produced, params);
    /* Worker 1 pauses past worker_timeout_s; worker 0 keeps talking (steps,
     * or only stats requests when the orphan must stay undelivered). */
    int64_t deadline = gt_now_ms() + WAIT_MS;
    for (;;) {
        ck_assert_msg(gt_now_ms() < deadline, "worker 1 was not declared dead within %d s",
                      WAIT_MS / 1000);
        if (delivered) {
            step_all(c, 1, rng, produced, params);
        } else {
            gddr_server_stats st;
            ck_assert_int_eq(gddr_server_stats_get(c[0], &st), GDDR_OK);
        }
        if (gt_file_has(log, "worker 1 declared dead") &&
            (!delivered || gt_file_has(log, "orphan of rank 1 (tensor 'w'")))
            break;
        gt_sleep_ms(20);
    }
    if (delivered) {
        gddr_client_counters k;
        gddr_client_counters_get(c[0], &k);
        for (int n = 0; n < 3 && !k.orphans_received; n++) {
            step_all(c, 1, rng, produced, params);
            gddr_client_counters_get(c[0], &k);
        }
        ck_assert_uint_eq(k.orphans_received, 1);
    }
    /* Worker 1 comes back (pushing before worker 0 does); both go on for a
     * while, then close. */
    step_one(c[1], &rng[1], produced, params[1]);
    for (int k = 0; k < 12; k++)
        step_all(c, 2, rng, produced, params);
    ck_assert(gt_file_has(log, "worker 1 rejoined"));
    const char *want = delivered ? "worker 1 was slow, not dead: the " : "worker 1 was slow, not dead: its orphan";
    ck_assert_msg(gt_file_has(log, want), "no '%s' line in the server log", want);
    gddr_client_close(&c[0]);
    gddr_client_close(&c[1]);
    assert_applied(s.endpoint, w0, produced,
                   delivered ? "slow worker back after its orphan was handed over"
                             : "slow worker back before its orphan was handed over");
    stop_ps_clean(&s, "slow worker");
    gt_rm_rf(dir);
}

START_TEST(test_slow_worker_orphan_delivered)
{
    slow_not_dead(1);
}
END_TEST

START_TEST(test_slow_worker_orphan_pending)
{
    slow_not_dead(0);
}
END_TEST

/* ---- 5b. a snapshot step whose push is dense ------------------------------------------ */

/* A one-chunk tensor is often sent whole (a dense push, no chunk bitmap).
 * When that happens on a snapshot step there is nothing held to snapshot;
 * the push must still be accepted (it was rejected with GDDR_EBITMAP, which
 * made gddr-train --residual-checkpoint-steps fail on bias tensors). */
START_TEST(test_snapshot_on_dense_push)
{
    char dir[64], log[160];
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "mode=async", "lr=1", "chunk=4", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c = open_client(s.endpoint, 0, 1, 0, 0.5, 1);
    float w0[3] = { 1, 2, 3 }, g[3], p[3];
    int id;
    ck_assert_int_eq(gddr_register(c, "bias", w0, 3, &id, NULL), GDDR_OK);
    uint64_t rng = 42;
    const float *gp[1] = { g };
    float *pp[1] = { p };
    int dense = 0, held = 0;
    for (int k = 0; k < 40; k++) {
        int_grad(&rng, g, 3);
        int rc = gddr_step(c, gp, pp);
        ck_assert_msg(rc == GDDR_OK, "step %d: %s (%s)", k, gddr_strerror(rc), gddr_client_errmsg(c));
        uint32_t age[1];
        size_t nch;
        ck_assert_int_eq(gddr__residual_age_get(c, 0, age, &nch), GDDR_OK);
        dense += age[0] == 0;
        held += age[0] > 0;
    }
    ck_assert(dense > 0 && held > 0);
    gddr_server_stats st;
    ck_assert_int_eq(gddr_server_stats_get(c, &st), GDDR_OK);
    ck_assert_uint_eq(st.rejected, 0);
    ck_assert_uint_eq(st.pushes, 40);
    gddr_client_close(&c);
    stop_ps_clean(&s, "dense snapshot");
    gt_rm_rf(dir);
}
END_TEST

/* ---- 6. SIGTERM writes a final checkpoint and exits 0 ------------------------------ */

START_TEST(test_sigterm_final_checkpoint)
{
    char dir[64], ckdir[128], log[160], ckset[200];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *sets[] = { "checkpoint_interval_s=0", "lr=0.25", ckset, NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c = open_client(s.endpoint, 0, 1, 0, 0, 0);
    enum { N = 5000 };
    float *v = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    ck_assert(v && g);
    for (int i = 0; i < N; i++)
        v[i] = sinf((float)i);
    int id;
    ck_assert_int_eq(gddr_register(c, "layer.weight", v, N, &id, NULL), GDDR_OK);
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < N; i++)
            g[i] = cosf((float)(i * (k + 1)));
        ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
    }
    uint64_t ver = 0;
    ck_assert_int_eq(gddr_pull(c, id, v, 0, &ver), GDDR_OK);
    ck_assert_uint_eq(ver, 5);
    gddr_client_close(&c);
    gt_sleep_ms(300);
    ck_assert_uint_eq(count_ckpts(ckdir), 0); /* interval 0: none before SIGTERM */
    stop_ps_clean(&s, "SIGTERM");
    ck_assert_uint_eq(count_ckpts(ckdir), 1);
    ck_assert(gt_file_has(log, "final checkpoint 1 written"));
    gddr_ckpt ck;
    load_newest(ckdir, &ck);
    ck_assert_uint_eq(ck.seq, 1);
    ck_assert_uint_eq(ckpt_ntensors(&ck), 1);
    ck_tensor t = ckpt_tensor(&ck, 0);
    ck_assert_str_eq(t.key, "layer.weight");
    ck_assert_uint_eq(t.n, N);
    ck_assert_uint_eq(t.version, ver);
    assert_same_floats(t.vals, v, N, "final checkpoint");
    gddr__ckpt_free(&ck);
    free(v);
    free(g);
    gt_rm_rf(dir);
}
END_TEST

/* ---- 7. gddr-ctl checkpoint ------------------------------------------------------------ */

START_TEST(test_ctl_checkpoint)
{
    char dir[64], ckdir[128], log[160], ckset[200];
    gt_mk_tmpdir(dir, sizeof dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(log, sizeof log, "%s/ps.log", dir);
    snprintf(ckset, sizeof ckset, "checkpoint_dir=%s", ckdir);
    const char *sets[] = { "checkpoint_interval_s=0", ckset, NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client *c = open_client(s.endpoint, 0, 1, 0, 0, 0);
    float v[100], g[100];
    for (int i = 0; i < 100; i++)
        v[i] = (float)i, g[i] = 1.0f;
    int id;
    ck_assert_int_eq(gddr_register(c, "t", v, 100, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
    ck_assert_uint_eq(count_ckpts(ckdir), 0);

    char bin[512], *out = NULL, err[256] = "";
    gt_bin_path(bin, sizeof bin, "gddr-ctl");
    char *argv[] = { bin, "-s", s.endpoint, "checkpoint", NULL };
    int st = 0;
    int rc = gt_run_capture(argv, WAIT_MS, 0, &out, &st, err, sizeof err);
    ck_assert_msg(rc == 0, "gddr-ctl: %s", err);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gddr-ctl checkpoint failed: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "checkpoint requested"));
    free(out);
    int64_t ms = wait_ckpts(ckdir, 1, WAIT_MS);
    ck_assert_msg(ms >= 0, "no checkpoint file within %d s of gddr-ctl checkpoint", WAIT_MS / 1000);
    gddr_ckpt ck;
    load_newest(ckdir, &ck);
    ck_assert_uint_eq(ck.seq, 1);
    ck_assert_uint_eq(ckpt_tensor(&ck, 0).version, 1);
    gddr__ckpt_free(&ck);

    /* The library call does the same. */
    ck_assert_int_eq(gddr_push(c, id, g, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_request_checkpoint(c), GDDR_OK);
    ck_assert_msg(wait_ckpts(ckdir, 2, WAIT_MS) >= 0, "no second checkpoint within %d s", WAIT_MS / 1000);
    load_newest(ckdir, &ck);
    ck_assert_uint_eq(ck.seq, 2);
    ck_assert_uint_eq(ckpt_tensor(&ck, 0).version, 2);
    gddr__ckpt_free(&ck);
    gddr_client_close(&c);
    stop_ps_clean(&s, "gddr-ctl");
    fprintf(stderr, "recovery: gddr-ctl checkpoint: file written %lld ms after the request\n",
            (long long)ms);
    gt_rm_rf(dir);
}
END_TEST

/* ---- the suite ---------------------------------------------------------------------------- */

/* Closing a GDDR client whose server died is bounded by timeout_ms (its
 * flush gets one more try), not by reconnect_timeout_ms -- ten minutes
 * here, which the Check case's timeout would catch. */
START_TEST(test_close_dead_server_bounded)
{
    gt_server s;
    START_SERVER(s, "mode=async", "lr=0.1", "chunk=4");
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 1000;
    o.reconnect_timeout_ms = 600000;
    o.heartbeat_ms = 0;
    o.delay_fraction = 0.5;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w[CN] = { 0 }, g[CN], p[CN];
    int id;
    ck_assert_int_eq(gddr_register(c, "w", w, CN, &id, NULL), GDDR_OK);
    uint64_t rng = 7;
    const float *gp[1] = { g };
    float *pp[1] = { p };
    for (int k = 0; k < 6; k++) {
        int_grad(&rng, g, CN);
        ck_assert_int_eq(gddr_step(c, gp, pp), GDDR_OK);
    }
    gt_server_signal(&s, SIGKILL);
    int st;
    ck_assert_int_eq(gt_wait_pid(s.pid, 10000, &st), 1); /* reaped: nothing left to stop */
    s.pid = 0;
    int64_t t0 = gt_now_ms();
    gddr_client_close(&c);
    fprintf(stderr, "recovery: closing a GDDR client whose server died took %lld ms (timeout_ms 1000)\n",
            (long long)(gt_now_ms() - t0));
    ck_assert_ptr_null(c);
}
END_TEST

/* Rank mistakes are named: a second process for a live rank (workers
 * started without --rank: each says world 1) is refused with a hint, in
 * its error and in the server's log; an expected worker that never comes
 * is logged when sync steps go on without it. */
static void keep_last_error(void *user, int level, const char *msg)
{
    if (level == GDDR_LOG_ERROR)
        snprintf(user, 600, "%s", msg);
}

START_TEST(test_rank_mistakes_named)
{
    char dir[64], log[160], msg[600] = "";
    gt_scratch_log(dir, sizeof dir, log, sizeof log);
    const char *sets[] = { "mode=sync", "workers=2", "worker_timeout_s=1", "lr=1", NULL };
    gt_server s;
    gt_start_logged(&s, log, sets);
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = s.endpoint;
    o.rank = 0;
    o.world_size = 1; /* as a worker started without --rank / --world */
    o.timeout_ms = 30000;
    o.heartbeat_ms = 200;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    gddr_client_opts o2 = o;
    o2.heartbeat_ms = 0;
    o2.timeout_ms = 1000;
    o2.connect_timeout_ms = 1500;
    o2.log = keep_last_error;
    o2.log_user = msg;
    gddr_client *c2 = NULL;
    ck_assert_int_eq(gddr_client_open(&o2, &c2), GDDR_EWORKER);
    ck_assert_msg(strstr(msg, "without --rank"), "the second worker's error: %s", msg);
    ck_assert_msg(gt_wait_for_text(log, "a second process asks for rank 0", 20000) >= 0, "no such line in %s", log);
    /* Worker 1 never comes: the step goes on alone after worker_timeout_s,
     * and the log says why. */
    float w = 0, g = 1;
    int id;
    ck_assert_int_eq(gddr_register(c, "r", &w, 1, &id, NULL), GDDR_OK);
    uint64_t v = 0;
    ck_assert_int_eq(gddr_push(c, id, &g, &v), GDDR_OK);
    ck_assert_int_eq(gddr_pull(c, id, &w, 1, &v), GDDR_OK);
    ck_assert_uint_ge(v, 1);
    ck_assert_msg(gt_wait_for_text(log, "worker 1 of the 2 expected never said hello", 20000) >= 0,
                  "no such line in %s", log);
    gddr_client_close(&c);
    stop_server(&s);
    gt_rm_rf(dir);
}
END_TEST

#define ADD_CASE(s, name, fn) GT_ADD_CASE(s, name, fn, TCASE_TIMEOUT)
#define ADD_TRAIN_CASE(s, name, fn) GT_ADD_CASE(s, name, fn, TCASE_TIMEOUT_TRAIN)

Suite *suite_recovery(void)
{
    Suite *s = suite_create("recovery");
    ADD_TRAIN_CASE(s, "server_kill9_restart", test_server_kill9_restart);
    ADD_CASE(s, "dead_server_costs_one_timeout", test_dead_server_costs_one_timeout);
    ADD_CASE(s, "corrupt_newest_checkpoint", test_corrupt_newest_checkpoint);
    ADD_CASE(s, "truncated_newest_checkpoint", test_truncated_newest_checkpoint);
    ADD_TRAIN_CASE(s, "sync_worker_kill9_rejoin", test_sync_worker_kill9_rejoin);
    ADD_CASE(s, "conservation_across_death", test_conservation_across_death);
    ADD_CASE(s, "close_during_replay", test_close_during_replay);
    ADD_CASE(s, "slow_worker_orphan_delivered", test_slow_worker_orphan_delivered);
    ADD_CASE(s, "slow_worker_orphan_pending", test_slow_worker_orphan_pending);
    ADD_CASE(s, "installments_sum_to_orphan", test_installments_sum_to_orphan);
    ADD_CASE(s, "installments_random_floats", test_installments_random_floats);
    ADD_CASE(s, "snapshot_on_dense_push", test_snapshot_on_dense_push);
    ADD_CASE(s, "sigterm_final_checkpoint", test_sigterm_final_checkpoint);
    ADD_CASE(s, "ctl_checkpoint", test_ctl_checkpoint);
    ADD_CASE(s, "rank_mistakes_named", test_rank_mistakes_named);
    ADD_CASE(s, "close_dead_server_bounded", test_close_dead_server_bounded);
    return s;
}
