/* gddr-train -- the reference trainer: a worker process that trains a model
 * through gddr-ps using nothing but the public libgddr-client API, as a
 * user's trainer would.
 *
 *   gddr-train --server tcp://127.0.0.1:5555 --rank 0 --world 4 \
 *              --workload softmax --epochs 3
 *
 * Workloads: softmax regression and an MLP (784-128-10, ReLU) on
 * Fashion-MNIST (or a generated dataset with --synthetic N), and the 1-D
 * quadratic f(w) = 0.5 (w - 5)^2 of the seed document. Each worker trains
 * on its shard (examples i with i % world == rank). The last line is
 * machine-readable: RESULT key=value ...
 */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data.h"
#include "gddr/gddr.h"
#include "numparse.h"
#include "model.h"

typedef struct args {
    const char *config, *server, *workload, *data;
    int rank, world, synthetic, epochs, steps, batch, hidden, stale, quiet, verbose, timeout_ms, connect_ms;
    int pipeline, evaluate, step_times;
    double progress, evaluate_every, clip_norm, dc_lambda, delay_fraction;
    int dc_mode, dc_adaptive, residual_ckpt, accumulate;
    double pull_alpha;
    int pull_bits;
    unsigned long long seed;
    const char *opts[64]; /* --opt NAME=VALUE, in order */
    int nopts;
} args;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile sig_atomic_t stop_eval;
static void on_stop(int sig)
{
    (void)sig;
    stop_eval = 1;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static void log_cb(void *user, int level, const char *msg)
{
    static const char *names[] = { "error", "warn", "info", "debug" };
    fprintf(stderr, "[rank %d] gddr %s: %s\n", *(int *)user, names[level & 3], msg);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gddr-train [options]\n"
            "  --config FILE          client INI ([client] section)\n"
            "  --server ENDPOINT      gddr-ps endpoint (overrides the config)\n"
            "  --rank R --world N     this worker's rank and the worker count (default: env)\n"
            "  --workload W           softmax | mlp | quadratic (default softmax)\n"
            "  --data DIR             Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist)\n"
            "  --synthetic N          train on N generated examples instead (fast tests)\n"
            "  --epochs E             passes over this worker's shard (default 1)\n"
            "  --steps S              exact number of steps (overrides --epochs)\n"
            "  --batch B              minibatch size (default 64)\n"
            "  --hidden H             MLP hidden units (default 128)\n"
            "  --seed S               model init and data order seed (default 1)\n"
            "  --simulate-staleness D compute each gradient on the parameters pulled D steps earlier\n"
            "  --clip-norm X --dc-lambda X --dc-mode diag|identity --dc-adaptive\n"
            "  --delay-fraction A     GDDR alpha\n"
            "  --pipeline             overlap: compute the next gradient while the step is in flight\n"
            "                         (gddr_step_submit/gddr_step_wait; one-step-stale parameters)\n"
            "  --residual-checkpoint-steps N\n"
            "  --accumulate-steps K   push the mean of every K gradients (gradient accumulation)\n"
            "  --pull-delay-fraction A  GDDR on pulls: hold a changed chunk back with probability A\n"
            "                         (at most tau pulls); pulls bring only what the view lacks\n"
            "  --pull-delta-bits 8|16 pulls bring 8- or 16-bit differences from the view (error\n"
            "                         kept on the server; 1/4 or 1/2 of the bytes)\n"
            "  --opt NAME=VALUE       any client option by name (gddr_opts_set), e.g. --opt\n"
            "                         heartbeat_ms=500; repeatable; wins over the flags here\n"
            "  --list-options         print every client option (type, default, help) and exit\n"
            "  --timeout-ms MS        bound on every wait (and, unless --connect-timeout-ms is\n"
            "                         given, on the wait for a server that is not there)\n"
            "  --connect-timeout-ms MS  how long to wait for a server not up yet (default 30000)\n"
            "  --progress SEC         seconds between progress lines (default 2; 0 = none)\n"
            "  --quiet                only the RESULT line\n"
            "  --verbose              log the library's info lines (reconnects, orphans)\n"
            "  --evaluate             train nothing: pull the server's current parameters as an\n"
            "                         observer and evaluate them on the test set (the accuracy of\n"
            "                         the model the server keeps; run it after the workers are done)\n"
            "  --evaluate-every SEC   with --evaluate: keep watching; every SEC seconds pull the\n"
            "                         server's model, evaluate it and print a line\n"
            "                         EVAL time=<unix seconds of the pull> test_accuracy=... version=...\n"
            "                         until SIGTERM/SIGINT or the server is gone (then the RESULT line)\n"
            "  --version              print the version and exit\n"
            "  --step-times           time every step (gradient and gddr_step, the whole loop\n"
            "                         iteration) and add step_mean_ms= step_p95_ms= to the RESULT line\n");
}

/* optarg, whole and in range, into an int or a double field; -1 (said)
 * when it is not. */
static int arg_int(const char *flag, long long lo, long long hi, int *field)
{
    long long v;
    if (gddr__arg_int("gddr-train", flag, optarg, lo, hi, &v) < 0)
        return -1;
    *field = (int)v;
    return 0;
}

static int arg_num(const char *flag, double lo, double hi, double *field)
{
    return gddr__arg_num("gddr-train", flag, optarg, lo, hi, field);
}

/* Every client option as the library describes it (common/client_conf.c). */
static void list_options(void)
{
    const char *name, *type, *def, *choices, *help;
    for (size_t i = 0; (name = gddr_opts_describe(i, &type, &def, &choices, &help)); i++)
        printf("%-26s %-7s %-10s %s%s%s\n", name, type, def[0] ? def : "-", help, choices[0] ? "; values " : "",
               choices);
}

/* --opt NAME=VALUE onto o (the library parses and checks it); -1 (said)
 * when it is wrong. */
static int set_opt(gddr_client_opts *o, const char *arg)
{
    const char *eq = strchr(arg, '=');
    char name[64];
    if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof name) {
        fprintf(stderr, "gddr-train: --opt %s: give NAME=VALUE (--list-options lists the names)\n", arg);
        return -1;
    }
    snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
    if (gddr_opts_set(o, sizeof *o, name, eq + 1) != GDDR_OK) {
        fprintf(stderr, "gddr-train: --opt %s: %s\n", arg, gddr_opts_errmsg());
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, args *a)
{
    memset(a, 0, sizeof *a);
    a->rank = -1;
    a->workload = "softmax";
    a->data = "/usr/share/datasets/fashion-mnist";
    a->epochs = 1;
    a->batch = 64;
    a->hidden = 128;
    a->seed = 1;
    a->progress = 2;
    a->dc_mode = -1;
    a->dc_adaptive = -1;
    a->clip_norm = a->dc_lambda = a->delay_fraction = -1;
    a->residual_ckpt = -1;
    a->accumulate = -1;
    a->connect_ms = -1;
    static const struct option o[] = {
        { "config", 1, 0, 'c' },          { "server", 1, 0, 's' },     { "rank", 1, 0, 'r' },
        { "world", 1, 0, 'w' },           { "workload", 1, 0, 'W' },   { "data", 1, 0, 'd' },
        { "synthetic", 1, 0, 'y' },       { "epochs", 1, 0, 'e' },     { "steps", 1, 0, 'S' },
        { "batch", 1, 0, 'b' },           { "hidden", 1, 0, 'H' },     { "seed", 1, 0, 'x' },
        { "simulate-staleness", 1, 0, 'D' }, { "clip-norm", 1, 0, 'C' }, { "dc-lambda", 1, 0, 'L' },
        { "dc-mode", 1, 0, 'M' },         { "dc-adaptive", 0, 0, 'A' }, { "delay-fraction", 1, 0, 'a' },
        { "progress", 1, 0, 'p' },        { "quiet", 0, 0, 'q' },      { "timeout-ms", 1, 0, 'T' },
        { "residual-checkpoint-steps", 1, 0, 'R' }, { "help", 0, 0, 'h' }, { "verbose", 0, 0, 'v' },
        { "pipeline", 0, 0, 'P' },        { "evaluate", 0, 0, 'E' },
        { "accumulate-steps", 1, 0, 'K' }, { "pull-delay-fraction", 1, 0, 'Y' },
        { "pull-delta-bits", 1, 0, 'B' },
        { "evaluate-every", 1, 0, 'V' },  { "step-times", 0, 0, 'Z' },
        { "connect-timeout-ms", 1, 0, 'O' }, { "version", 0, 0, 'U' },
        { "opt", 1, 0, 'o' },             { "list-options", 0, 0, 'l' },
        { 0, 0, 0, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", o, NULL)) != -1) {
        switch (c) {
        case 'c': a->config = optarg; break;
        case 's': a->server = optarg; break;
        case 'r': if (arg_int("--rank", 0, 65535, &a->rank) < 0) return -1; break;
        case 'w': if (arg_int("--world", 1, 65536, &a->world) < 0) return -1; break;
        case 'W': a->workload = optarg; break;
        case 'd': a->data = optarg; break;
        case 'y': if (arg_int("--synthetic", 0, 100000000, &a->synthetic) < 0) return -1; break;
        case 'e': if (arg_int("--epochs", 1, 1000000, &a->epochs) < 0) return -1; break;
        case 'S': if (arg_int("--steps", 0, 2000000000, &a->steps) < 0) return -1; break;
        case 'b': if (arg_int("--batch", 1, 1000000, &a->batch) < 0) return -1; break;
        case 'H': if (arg_int("--hidden", 1, 1000000, &a->hidden) < 0) return -1; break;
        case 'x': {
            long long v;
            if (gddr__arg_int("gddr-train", "--seed", optarg, 0, 9223372036854775807LL, &v) < 0)
                return -1;
            a->seed = (unsigned long long)v;
            break;
        }
        case 'O': if (arg_int("--connect-timeout-ms", 0, 86400000, &a->connect_ms) < 0) return -1; break;
        case 'D': if (arg_int("--simulate-staleness", 0, 1000000, &a->stale) < 0) return -1; break;
        case 'C': if (arg_num("--clip-norm", 0, 1e30, &a->clip_norm) < 0) return -1; break;
        case 'L': if (arg_num("--dc-lambda", 0, 1e6, &a->dc_lambda) < 0) return -1; break;
        case 'M':
            if (strcmp(optarg, "diag") == 0) a->dc_mode = GDDR_DC_DIAG;
            else if (strcmp(optarg, "identity") == 0) a->dc_mode = GDDR_DC_IDENTITY;
            else { fprintf(stderr, "gddr-train: --dc-mode must be diag or identity\n"); return -1; }
            break;
        case 'A': a->dc_adaptive = 1; break;
        case 'a': if (arg_num("--delay-fraction", 0, 0.99, &a->delay_fraction) < 0) return -1; break;
        case 'p': if (arg_num("--progress", 0, 1e6, &a->progress) < 0) return -1; break;
        case 'q': a->quiet = 1; break;
        case 'v': a->verbose = 1; break;
        case 'P': a->pipeline = 1; break;
        case 'E': a->evaluate = 1; break;
        case 'T': if (arg_int("--timeout-ms", 1, 86400000, &a->timeout_ms) < 0) return -1; break;
        case 'R': if (arg_int("--residual-checkpoint-steps", 0, 1000000, &a->residual_ckpt) < 0) return -1; break;
        case 'K': if (arg_int("--accumulate-steps", 1, 1000000, &a->accumulate) < 0) return -1; break;
        case 'Y': if (arg_num("--pull-delay-fraction", 0, 0.99, &a->pull_alpha) < 0) return -1; break;
        case 'B': if (arg_int("--pull-delta-bits", 8, 16, &a->pull_bits) < 0) return -1; break;
        case 'V': if (arg_num("--evaluate-every", 0, 1e9, &a->evaluate_every) < 0) return -1; break;
        case 'Z': a->step_times = 1; break;
        case 'o': {
            gddr_client_opts scratch = GDDR_CLIENT_OPTS_INIT;
            if (a->nopts == (int)(sizeof a->opts / sizeof a->opts[0])) {
                fprintf(stderr, "gddr-train: too many --opt\n");
                return -1;
            }
            if (set_opt(&scratch, optarg) < 0)
                return -1;
            a->opts[a->nopts++] = optarg;
            break;
        }
        case 'l': list_options(); exit(0);
        case 'h': usage(stdout); exit(0);
        case 'U': printf("gddr-train %s\n", GDDR_VERSION); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gddr-train: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (a->rank >= 0 && a->world > 0 && a->rank >= a->world) {
        fprintf(stderr, "gddr-train: --rank %d is not below --world %d (ranks are 0 to %d)\n", a->rank,
                a->world, a->world - 1);
        return -1;
    }
    if (a->pull_bits != 0 && a->pull_bits != 8 && a->pull_bits != 16) {
        fprintf(stderr, "gddr-train: --pull-delta-bits: %d is neither 8 nor 16\n", a->pull_bits);
        return -1;
    }
    if (a->batch < 1 || a->epochs < 1 || a->steps < 0 || a->stale < 0 || a->hidden < 1) {
        fprintf(stderr, "gddr-train: --batch, --epochs and --hidden must be positive, --steps and --simulate-staleness not negative\n");
        return -1;
    }
    if (a->evaluate_every < 0 || (a->evaluate_every > 0 && !a->evaluate)) {
        fprintf(stderr, "gddr-train: --evaluate-every takes a positive SEC and needs --evaluate\n");
        return -1;
    }
    if (a->pipeline && a->stale > 0) {
        fprintf(stderr, "gddr-train: --pipeline and --simulate-staleness do not mix\n");
        return -1;
    }
    if (strcmp(a->workload, "softmax") && strcmp(a->workload, "mlp") && strcmp(a->workload, "quadratic")) {
        fprintf(stderr, "gddr-train: unknown workload '%s' (softmax, mlp or quadratic)\n", a->workload);
        return -1;
    }
    if (!a->config && !a->server) {
        fprintf(stderr, "gddr-train: give --server ENDPOINT or --config FILE\n");
        return -1;
    }
    return 0;
}

static int open_client(const args *a, int *rank_store, gddr_client **c)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    if (a->server)
        o.server = a->server;
    if (a->rank >= 0)
        o.rank = a->rank;
    if (a->world > 0)
        o.world_size = a->world;
    if (a->timeout_ms > 0)
        o.timeout_ms = o.connect_timeout_ms = a->timeout_ms;
    if (a->connect_ms >= 0)
        o.connect_timeout_ms = a->connect_ms;
    if (a->clip_norm >= 0)
        o.clip_norm = a->clip_norm;
    if (a->dc_lambda >= 0)
        o.dc_lambda = a->dc_lambda;
    if (a->dc_mode >= 0)
        o.dc_mode = a->dc_mode;
    if (a->dc_adaptive >= 0)
        o.dc_adaptive = a->dc_adaptive;
    if (a->delay_fraction >= 0)
        o.delay_fraction = a->delay_fraction;
    if (a->residual_ckpt >= 0)
        o.residual_checkpoint_steps = a->residual_ckpt;
    if (a->accumulate >= 1)
        o.accumulate_steps = a->accumulate;
    if (a->pull_alpha > 0)
        o.pull_delay_fraction = a->pull_alpha;
    if (a->pull_bits > 0)
        o.pull_delta_bits = a->pull_bits;
    if (a->evaluate) {
        o.observer = 1; /* reads the model, never counts as a worker */
        o.rank = 0;
        o.world_size = 1;
    }
    o.log = log_cb;
    o.log_user = rank_store;
    o.log_level = a->quiet ? GDDR_LOG_ERROR : a->verbose ? GDDR_LOG_INFO : GDDR_LOG_WARN;
    for (int i = 0; i < a->nopts; i++)
        if (set_opt(&o, a->opts[i]) < 0)
            return GDDR_EINVAL;
    char err[512] = "";
    int rc = a->config ? gddr_client_open_ini(a->config, &o, c, err, sizeof err)
                       : gddr_client_open(&o, c);
    if (rc != GDDR_OK) {
        if (err[0])
            fprintf(stderr, "gddr-train: %s\n", err);
        else
            fprintf(stderr, "gddr-train: cannot open a client to %s: %s (the error above says why)\n",
                    o.server, gddr_strerror(rc));
        return rc;
    }
    gddr_server_info info;
    gddr_client_info(*c, &info);
    *rank_store = info.rank;
    return GDDR_OK;
}

/* The parameter history for --simulate-staleness: slot k % (D+2) holds the
 * parameters after k steps. D+2 slots, because the slot the gradient was
 * computed on must survive while the step writes the next one. */
typedef struct history {
    int slots, nt;
    float **p;        /* [slot * nt + tensor] */
    uint64_t *ver;    /* [slot * nt + tensor] */
} history;

static int history_init(history *h, int depth, int nt, const size_t *len)
{
    h->slots = depth + 2;
    h->nt = nt;
    h->p = calloc((size_t)(h->slots * nt), sizeof *h->p);
    h->ver = calloc((size_t)(h->slots * nt), sizeof *h->ver);
    if (!h->p || !h->ver)
        return -1;
    for (int s = 0; s < h->slots; s++)
        for (int i = 0; i < nt; i++)
            if (!(h->p[s * nt + i] = calloc(len[i], sizeof(float))))
                return -1;
    return 0;
}

static void history_free(history *h)
{
    for (int i = 0; h->p && i < h->slots * h->nt; i++)
        free(h->p[i]);
    free(h->p);
    free(h->ver);
}

/* Closes the client (flush and bye) and frees the rest; returns 0. */
static int finish(gddr_model **m, gddr_client **c, gddr_dataset *shard, gddr_dataset *train,
                  gddr_dataset *test)
{
    gddr_model_free(m);
    gddr_client_close(c);
    gddr_dataset_free(shard);
    gddr_dataset_free(train);
    gddr_dataset_free(test);
    return 0;
}

int main(int argc, char **argv)
{
    args a;
    if (parse_args(argc, argv, &a) < 0)
        return 2;
    int rank = a.rank >= 0 ? a.rank : 0;
    int quad = strcmp(a.workload, "quadratic") == 0;
    gddr_dataset train = { 0 }, test = { 0 }, shard = { 0 };
    char err[512];
    double t0 = now_s();
    if (!quad) {
        if (a.synthetic > 0) {
            gddr_dataset_synthetic(&train, a.synthetic, 64, 10, 7);
            /* Same seed, so the same class centres; the "test" set is a
             * prefix of the training draw, which is fine for smoke tests. */
            gddr_dataset_synthetic(&test, a.synthetic / 4 + 1, 64, 10, 7);
        } else if (gddr_fashion_mnist_load(a.data, &train, &test, err, sizeof err) != GDDR_OK) {
            fprintf(stderr, "gddr-train: %s\n(install the Debian package dataset-fashion-mnist, or pass --data DIR or --synthetic N)\n", err);
            return 1;
        }
    }

    gddr_client *c = NULL;
    if (open_client(&a, &rank, &c) != GDDR_OK)
        return 1;
    gddr_server_info info;
    gddr_client_info(c, &info);
    int world = a.world > 0 ? a.world : 1;
    if (!quad && gddr_dataset_shard(&train, rank % world, world, &shard) != GDDR_OK) {
        fprintf(stderr, "gddr-train: cannot shard the data for rank %d of %d\n", rank, world);
        return 1;
    }

    /* The model: named flat tensors, registered with the same initial
     * values on every worker (the first registration wins). */
    gddr_model *m = NULL;
    int nt;
    size_t len[8];
    float *params[8], *grads[8];
    float qw = 0.0f, qg = 0.0f;
    if (quad) {
        nt = 1;
        len[0] = 1;
        params[0] = &qw;
        grads[0] = &qg;
    } else {
        if (gddr_model_create(strcmp(a.workload, "mlp") == 0 ? GDDR_MODEL_MLP : GDDR_MODEL_SOFTMAX,
                              train.dim, a.hidden, train.classes, &m) != GDDR_OK) {
            fprintf(stderr, "gddr-train: cannot create the model\n");
            return 1;
        }
        gddr_model_init(m, a.seed);
        nt = gddr_model_ntensors(m);
        for (int i = 0; i < nt; i++) {
            len[i] = gddr_model_tensor_len(m, i);
            params[i] = gddr_model_params(m, i);
            grads[i] = gddr_model_grads(m, i);
        }
    }
    for (int i = 0; i < nt; i++) {
        int id;
        const char *name = quad ? "quadratic.w" : gddr_model_tensor_name(m, i);
        int rc = gddr_register(c, name, params[i], len[i], &id, NULL);
        if (rc == GDDR_OK)
            rc = gddr_pull(c, id, params[i], 0, NULL);
        if (rc != GDDR_OK) {
            fprintf(stderr, "gddr-train: tensor '%s': %s: %s\n", name, gddr_strerror(rc),
                    gddr_client_errmsg(c));
            return 1;
        }
    }

    if (a.evaluate) {
        /* The server's parameters, as registered and pulled above. */
        uint64_t version = 0;
        gddr_tensor_version(c, 0, &version);
        if (a.evaluate_every > 0 && !quad) {
            /* A watcher: the time printed is that of the pull (the model's
             * moment), not of the end of the evaluation. */
            signal(SIGTERM, on_stop);
            signal(SIGINT, on_stop);
            double t_pull = wall_s();
            for (;;) {
                double test_loss = 0;
                double acc = gddr_model_evaluate(m, &test, &test_loss);
                printf("EVAL time=%.3f test_accuracy=%.4f test_loss=%.4f version=%llu\n", t_pull, acc,
                       test_loss, (unsigned long long)version);
                fflush(stdout);
                double next = t_pull + a.evaluate_every;
                while (!stop_eval && wall_s() < next) {
                    struct timespec nap = { 0, 20 * 1000 * 1000 };
                    nanosleep(&nap, NULL);
                }
                if (stop_eval)
                    break;
                t_pull = wall_s();
                int rc = GDDR_OK;
                for (int i = 0; i < nt && rc == GDDR_OK; i++)
                    rc = gddr_pull(c, i, params[i], 0, NULL);
                if (rc != GDDR_OK)
                    break; /* the server is gone: the last line stands */
                gddr_tensor_version(c, 0, &version);
            }
        }
        if (quad) {
            printf("RESULT server_model=1 w=%.6f loss=%.6g version=%llu\n", (double)qw,
                   gddr_quadratic_loss(qw), (unsigned long long)version);
        } else {
            double test_loss = 0;
            double acc = gddr_model_evaluate(m, &test, &test_loss);
            printf("RESULT server_model=1 test_accuracy=%.4f test_loss=%.4f version=%llu\n", acc,
                   test_loss, (unsigned long long)version);
        }
        return finish(&m, &c, &shard, &train, &test);
    }
    long steps = a.steps > 0 ? a.steps
                 : quad      ? 200
                             : (long)a.epochs * ((shard.n + a.batch - 1) / a.batch);
    history h = { 0 };
    if (a.stale > 0 && history_init(&h, a.stale, nt, len) < 0) {
        fprintf(stderr, "gddr-train: out of memory\n");
        return 1;
    }
    for (int i = 0; a.stale > 0 && i < nt; i++)
        memcpy(h.p[i], params[i], len[i] * 4); /* slot 0: the initial values */

    int *order = quad ? NULL : malloc((size_t)shard.n * sizeof *order);
    uint64_t rng = a.seed * 0x9E3779B97F4A7C15ull + (uint64_t)rank + 1;
    double loss_ema = NAN, last_print = now_s(), t_train = now_s(), compute_s = 0, wait_s = 0;
    int pos = shard.n;
    double *step_ms = a.step_times && steps > 0 ? malloc((size_t)steps * sizeof *step_ms) : NULL;
    if (!a.quiet)
        printf("[rank %d] %s on %s: %ld steps, batch %d, %d tensors (mode %s, loaded in %.1f s)\n",
               rank, a.workload, quad ? "f(w)=0.5(w-5)^2" : a.synthetic ? "synthetic data" : "Fashion-MNIST",
               steps, a.batch, nt,
               info.mode == GDDR_MODE_SYNC ? "sync" : info.mode == GDDR_MODE_SSP ? "ssp" : "async",
               now_s() - t0);
    for (long s = 0; s < steps; s++) {
        /* Which parameters this gradient is computed on. */
        const float *on[8];
        uint64_t vers[8];
        int use_hist = a.stale > 0;
        if (use_hist) {
            /* Slot k holds what step k-1 returned: the parameters after its
             * push (version k). Pick the slot whose version is s - D. */
            long k = s - a.stale < 0 ? 0 : s - a.stale;
            int slot = (int)(k % h.slots);
            for (int i = 0; i < nt; i++) {
                on[i] = h.p[slot * nt + i];
                vers[i] = h.ver[slot * nt + i];
                memcpy(params[i], on[i], len[i] * 4);
            }
        }
        double tc = now_s(), loss;
        double t_step = tc;
        if (quad) {
            qg = (float)gddr_quadratic_grad(qw);
            loss = gddr_quadratic_loss(qw);
        } else {
            int idx[4096];
            int b = a.batch < 4096 ? a.batch : 4096;
            for (int j = 0; j < b; j++) {
                if (pos >= shard.n) { /* reshuffle every pass (Fisher-Yates) */
                    for (int q = 0; q < shard.n; q++)
                        order[q] = q;
                    for (int q = shard.n - 1; q > 0; q--) {
                        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                        int r = (int)(rng % (uint64_t)(q + 1)), tmp = order[q];
                        order[q] = order[r], order[r] = tmp;
                    }
                    pos = 0;
                }
                idx[j] = order[pos++];
            }
            loss = gddr_model_loss_grad(m, &shard, idx, b);
        }
        compute_s += now_s() - tc;
        loss_ema = isnan(loss_ema) ? loss : 0.98 * loss_ema + 0.02 * loss;
        float *out[8];
        for (int i = 0; i < nt; i++)
            out[i] = use_hist ? h.p[(int)((s + 1) % h.slots) * nt + i] : params[i];
        int rc;
        double tw = now_s();
        if (a.pipeline) {
            /* This gradient was computed while step s-1 was in flight, on
             * the parameters step s-2 returned (which it is tagged with):
             * hand it over, then collect s-1, whose parameters the next
             * gradient is computed on while step s is in flight. */
            rc = gddr_step_submit(c, (const float *const *)grads);
            if (rc == GDDR_OK && s > 0)
                rc = gddr_step_wait(c, params);
            wait_s += now_s() - tw;
        } else {
            rc = gddr_step_from(c, (const float *const *)grads, use_hist ? on : NULL,
                                use_hist ? vers : NULL, out);
            wait_s += now_s() - tw;
        }
        if (rc != GDDR_OK) {
            fprintf(stderr, "[rank %d] step %ld failed: %s: %s\n", rank, s, gddr_strerror(rc),
                    gddr_client_errmsg(c));
            return 1;
        }
        if (step_ms)
            step_ms[s] = (now_s() - t_step) * 1e3;
        if (use_hist) {
            int slot = (int)((s + 1) % h.slots);
            for (int i = 0; i < nt; i++) {
                memcpy(params[i], out[i], len[i] * 4);
                gddr_tensor_version(c, i, &h.ver[slot * nt + i]);
            }
        }
        if (!a.quiet && a.progress > 0 && now_s() - last_print >= a.progress) {
            double el = now_s() - t_train;
            printf("[rank %d] step %ld/%ld loss %.4f  %.0f steps/s\n", rank, s + 1, steps, loss_ema,
                   (double)(s + 1) / el);
            fflush(stdout);
            last_print = now_s();
        }
    }
    if (a.pipeline && steps > 0) {
        double tw = now_s();
        int rc = gddr_step_wait(c, params);
        wait_s += now_s() - tw;
        if (rc != GDDR_OK) {
            fprintf(stderr, "[rank %d] last step failed: %s: %s\n", rank, gddr_strerror(rc),
                    gddr_client_errmsg(c));
            return 1;
        }
    }
    double train_s = now_s() - t_train;

    /* Final parameters: the newest the server has. */
    for (int i = 0; i < nt; i++)
        if (gddr_pull(c, i, params[i], 0, NULL) != GDDR_OK) {
            fprintf(stderr, "[rank %d] final pull failed: %s\n", rank, gddr_client_errmsg(c));
            return 1;
        }
    gddr_client_counters k;
    gddr_client_counters_get(c, &k);
    gddr_server_stats st;
    memset(&st, 0, sizeof st);
    int have_stats = gddr_server_stats_get(c, &st) == GDDR_OK;
    /* Communication: time inside the library's steps (on its thread when
     * pipelined). Hidden: the part the trainer did not spend blocked. */
    double comm_s = (double)k.step_ns * 1e-9;
    double overlap = a.pipeline && comm_s > 0 ? 1.0 - wait_s / comm_s : 0.0;
    if (overlap < 0)
        overlap = 0;
    double mean_tau = k.tau_count ? (double)k.tau_sum / (double)k.tau_count : 0.0;
    if (quad) {
        printf("RESULT rank=%d w=%.6f loss=%.6g steps=%ld bytes_pushed=%llu bytes_pulled=%llu mean_staleness=%.3f",
               rank, (double)qw, gddr_quadratic_loss(qw), steps, (unsigned long long)k.bytes_pushed,
               (unsigned long long)k.bytes_pulled, have_stats ? st.worker_staleness_mean : -1.0);
    } else {
        double test_loss = 0, train_loss = 0;
        double acc = gddr_model_evaluate(m, &test, &test_loss);
        gddr_model_evaluate(m, &shard, &train_loss);
        printf("RESULT rank=%d test_accuracy=%.4f test_loss=%.4f train_loss=%.4f steps=%ld "
               "bytes_pushed=%llu bytes_pulled=%llu values_pushed=%llu mean_staleness=%.3f "
               "max_staleness=%llu train_seconds=%.2f compute_seconds=%.2f reconnects=%llu "
               "comm_seconds=%.3f wait_seconds=%.3f overlap=%.3f mean_tau=%.3f",
               rank, acc, test_loss, train_loss, steps, (unsigned long long)k.bytes_pushed,
               (unsigned long long)k.bytes_pulled, (unsigned long long)k.values_pushed,
               have_stats ? st.worker_staleness_mean : -1.0,
               (unsigned long long)(have_stats ? st.staleness_max : 0), train_s, compute_s,
               (unsigned long long)k.reconnects, comm_s, wait_s, overlap, mean_tau);
    }
    if (step_ms) {
        /* Appended to the RESULT line; p95 by nearest rank. */
        double sum = 0;
        for (long i = 0; i < steps; i++)
            sum += step_ms[i];
        qsort(step_ms, (size_t)steps, sizeof *step_ms, cmp_double);
        long i95 = (long)ceil(0.95 * (double)steps) - 1;
        printf(" step_mean_ms=%.2f step_p95_ms=%.2f", sum / (double)steps, step_ms[i95 < 0 ? 0 : i95]);
        free(step_ms);
    }
    printf("\n");
    fflush(stdout);
    history_free(&h);
    free(order);
    return finish(&m, &c, &shard, &train, &test);
}
