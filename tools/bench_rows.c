/* bench_rows.c -- see bench_rows.h.
 *
 * One figure: `clients` threads, each with its own connection, each doing
 * `iters` rounds of (pull n rows, push n rows' gradients) on keys of its
 * own (n random uint64 from a fixed seed; the clients' keys are disjoint,
 * in one table of the server). Before the timed rounds every client pulls
 * its keys once (on gddr-ps that creates the rows: the timed part is the
 * steady state), pushes, pulls again and checks every value: pulled after
 * = pulled before - 0.5 x gradient, exactly (gradients are multiples of
 * 1/8, so SGD at lr 0.5 is exact in float). A wrong value ends the run.
 *
 * The ceiling, bench_kv_server: ps-lite's key-value layout over bare
 * ZeroMQ. A push is [header, keys frame, values frame] and is answered
 * with a 1-byte ack; a pull is [header, keys frame] and is answered with
 * one frame of n x dim floats. The server keeps each table's rows in one
 * float array, found through an open-addressing hash map (key -> row
 * index, linear probing, splitmix64 hash, grown at half full; the slot
 * of the key 8 ahead is prefetched, as gddr-ps's table does); a key not
 * there gets a zero row (on a pull or a push, like ps-lite's
 * KVServerDefaultHandle). A push does row -= 0.5 x gradient per key (the
 * update gddr-ps makes with "sgd lr=0.5"); a pull copies each row into the
 * reply, which ZeroMQ sends without another copy. The client sends keys
 * and values without a copy (zmq_msg_init_data) and copies the pulled
 * values into the caller's buffer. No protobuf, no versions, no exactly
 * once, no validation: the least a key-value server can do.
 *
 * Beside them, a pull's and a push's milliseconds (timed around each call
 * of the timed rounds, the mean over calls and clients), to see which
 * direction costs what, and the CPU milliseconds a round costs the clients
 * (this process: the calls and ZeroMQ's I/O threads) and the server (all
 * its threads, /proc/PID/task/TID/schedstat), which other jobs on the
 * machine move far less than wall time.
 *
 * rows/s = rows pulled and pushed per second (a row counted once per
 * round: n x rounds x clients / time); MB/s = value bytes both ways
 * (2 x n x dim x 4 x rounds x clients / time; keys not counted).
 */
#include "bench_rows.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "bench_proc.h"
#include "gddr/gddr.h"
#include "rowkey.h"

#define MAXR 16
#define LR 0.5f
#define SEED 0x5eedULL

/* ---- the bare key-value server ------------------------------------------------ */

typedef struct kv_slot {
    uint64_t key;
    uint64_t idx; /* row index + 1; 0: empty */
} kv_slot;

typedef struct kv_table {
    uint32_t dim, nrows, rows_cap;
    size_t cap;    /* slots, a power of two */
    kv_slot *slot; /* key and row in one 16-byte slot: one cache miss a probe */
    float *rows;
} kv_table;

static void kv_grow(kv_table *t)
{
    size_t cap = t->cap ? t->cap * 2 : 1u << 16;
    kv_slot *x = calloc(cap, sizeof *x);
    if (!x)
        abort();
    for (size_t i = 0; i < t->cap; i++)
        if (t->slot[i].idx) {
            size_t h = gddr_splitmix64(t->slot[i].key) & (cap - 1);
            while (x[h].idx)
                h = (h + 1) & (cap - 1);
            x[h] = t->slot[i];
        }
    free(t->slot);
    t->slot = x;
    t->cap = cap;
}

/* The row of key, created (zeros) when absent. */
static float *kv_row(kv_table *t, uint64_t key)
{
    if (2 * ((size_t)t->nrows + 1) > t->cap)
        kv_grow(t);
    size_t h = gddr_splitmix64(key) & (t->cap - 1);
    for (;;) {
        const kv_slot *e = &t->slot[h];
        if (!e->idx)
            break;
        if (e->key == key)
            return t->rows + (size_t)(e->idx - 1) * t->dim;
        h = (h + 1) & (t->cap - 1);
    }
    if (t->nrows == t->rows_cap) {
        t->rows_cap = t->rows_cap ? 2 * t->rows_cap : 1u << 16;
        t->rows = realloc(t->rows, (size_t)t->rows_cap * t->dim * sizeof(float));
        if (!t->rows)
            abort();
    }
    float *r = t->rows + (size_t)t->nrows * t->dim;
    memset(r, 0, t->dim * sizeof(float));
    t->slot[h].key = key;
    t->slot[h].idx = ++t->nrows;
    return r;
}

/* The hash slot of a key a few keys on, asked for early (what gddr-ps's table
 * does too: server/table.c, prefetch_key). Always inlined: out of line, GCC
 * finds it free of side effects and drops the calls. */
#define KV_AHEAD 8
static inline __attribute__((always_inline)) void kv_prefetch(const kv_table *t, uint64_t key)
{
    if (t->cap) {
        size_t h = gddr_splitmix64(key) & (t->cap - 1);
        __builtin_prefetch(&t->slot[h]);
    }
}

/* Header: kind ('P' push, 'G' pull), uint32 table (< MAXT), uint32 dim. */
#define MAXT 64
typedef struct kv_hdr {
    char kind;
    uint32_t table, dim;
} __attribute__((packed)) kv_hdr;

int bench_kv_server(const char *file)
{
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(s, "tcp://127.0.0.1:*") != 0)
        return 1;
    char ep[256], tmp[300];
    size_t len = sizeof ep;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return 1;
    fprintf(f, "%s\n", ep);
    fclose(f);
    rename(tmp, file);
    static kv_table tabs[MAXT];
    for (;;) {
        zmq_msg_t id, hdr, keys, vals;
        zmq_msg_init(&id);
        zmq_msg_init(&hdr);
        zmq_msg_init(&keys);
        zmq_msg_init(&vals);
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&hdr, s, 0) < 0 || zmq_msg_recv(&keys, s, 0) < 0)
            break;
        kv_hdr h;
        if (zmq_msg_size(&hdr) != sizeof h)
            abort();
        memcpy(&h, zmq_msg_data(&hdr), sizeof h);
        if (h.table >= MAXT)
            abort();
        kv_table *t = &tabs[h.table];
        if (!t->dim)
            t->dim = h.dim;
        size_t n = zmq_msg_size(&keys) / 8;
        const uint64_t *k = zmq_msg_data(&keys);
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        if (h.kind == 'P') {
            zmq_msg_recv(&vals, s, 0);
            const float *g = zmq_msg_data(&vals);
            for (size_t i = 0; i < n; i++) {
                if (i + KV_AHEAD < n)
                    kv_prefetch(t, k[i + KV_AHEAD]);
                float *r = kv_row(t, k[i]);
                for (uint32_t j = 0; j < t->dim; j++)
                    r[j] -= LR * g[i * t->dim + j];
            }
            zmq_send(s, "a", 1, 0);
        } else {
            zmq_msg_t out;
            zmq_msg_init_size(&out, n * t->dim * sizeof(float));
            float *o = zmq_msg_data(&out);
            for (size_t i = 0; i < n; i++) {
                if (i + KV_AHEAD < n)
                    kv_prefetch(t, k[i + KV_AHEAD]);
                memcpy(o + i * t->dim, kv_row(t, k[i]), t->dim * sizeof(float));
            }
            zmq_msg_send(&out, s, 0);
        }
        zmq_msg_close(&hdr);
        zmq_msg_close(&keys);
        zmq_msg_close(&vals);
    }
    return 0;
}

/* ---- clients ------------------------------------------------------------------------ */

typedef struct kv_client {
    void *ctx, *sock;
    uint32_t table, dim;
} kv_client;

static void kv_send_hdr(kv_client *k, char kind)
{
    kv_hdr h = { kind, k->table, k->dim };
    zmq_send(k->sock, &h, sizeof h, ZMQ_SNDMORE);
}

static void kv_send_lent(kv_client *k, const void *p, size_t len, int flags)
{
    zmq_msg_t m;
    zmq_msg_init_data(&m, (void *)p, len, NULL, NULL);
    zmq_msg_send(&m, k->sock, flags);
}

/* The buffers are lent to ZeroMQ: the server's answer says it has them. */
static void kv_pull(kv_client *k, const uint64_t *keys, size_t n, float *out)
{
    kv_send_hdr(k, 'G');
    kv_send_lent(k, keys, n * 8, 0);
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, k->sock, 0);
    size_t want = n * k->dim * sizeof(float);
    if (zmq_msg_size(&m) != want)
        bench_die("%s", "kv server: short pull reply");
    memcpy(out, zmq_msg_data(&m), want);
    zmq_msg_close(&m);
}

static void kv_push(kv_client *k, const uint64_t *keys, size_t n, const float *g)
{
    kv_send_hdr(k, 'P');
    kv_send_lent(k, keys, n * 8, ZMQ_SNDMORE);
    kv_send_lent(k, g, n * k->dim * sizeof(float), 0);
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, k->sock, 0);
    zmq_msg_close(&m);
}

/* CPU seconds of the timed rounds: this process (the clients and their
 * ZeroMQ I/O threads) and the server's, from the first client's start to
 * the last client's end. Unlike wall time, barely moved by other jobs on
 * the machine. */
typedef struct cpu_span {
    pid_t server;
    atomic_int left;       /* clients still in their timed rounds */
    double c0, c1, s0, s1; /* client and server CPU seconds at start and end */
} cpu_span;

static double self_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The CPU seconds of every thread of pid (/proc/PID/task/TID/schedstat:
 * nanoseconds on a CPU first). */
static double proc_cpu(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    double sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char f[300];
        snprintf(f, sizeof f, "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
        FILE *fp = fopen(f, "r");
        unsigned long long ns = 0;
        if (fp) {
            if (fscanf(fp, "%llu", &ns) != 1)
                ns = 0;
            fclose(fp);
        }
        sum += 1e-9 * (double)ns;
    }
    closedir(d);
    return sum;
}

typedef struct worker {
    int gddr; /* 1: gddr-ps, 0: the key-value server */
    const char *ep;
    int rank, world, iters, table;
    size_t n;
    uint32_t dim;
    pthread_barrier_t *start;
    cpu_span *cpu;
    double seconds, pull_s, push_s; /* the timed rounds; their pulls; their pushes */
    size_t checked;
} worker;

static void check(const worker *w, const uint64_t *keys, const float *before, const float *after,
                  const float *g)
{
    size_t m = w->n * w->dim;
    for (size_t i = 0; i < m; i++)
        if (after[i] != before[i] - LR * g[i]) {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "%s, rank %d, n %zu, dim %u: key %016llx value %u is %.9g after a push, not "
                     "%.9g - %g x %.9g",
                     w->gddr ? "gddr-ps" : "kv server", w->rank, w->n, w->dim,
                     (unsigned long long)keys[i / w->dim], (unsigned)(i % w->dim), after[i],
                     before[i], LR, g[i]);
            bench_die("%s", msg);
        }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    size_t m = w->n * w->dim;
    uint64_t *keys = malloc(w->n * 8);
    float *g = malloc(m * 4), *a = malloc(m * 4), *b = malloc(m * 4);
    if (!keys || !g || !a || !b)
        bench_die("%s", "out of memory");
    /* splitmix64 is a bijection: distinct inputs, distinct keys. */
    for (size_t i = 0; i < w->n; i++)
        keys[i] = gddr_splitmix64(SEED + ((uint64_t)w->rank << 32) + i);
    for (size_t i = 0; i < m; i++)
        g[i] = 0.125f * (float)((i * 7 + (size_t)w->rank) % 4 + 1);
    gddr_client *c = NULL;
    kv_client k = { 0 };
    int t = -1;
    if (w->gddr) {
        c = bench_connect(w->ep, w->rank, w->world, 0, 0, 0);
        gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
        to.optimizer = "sgd lr=0.5";
        char key[64];
        snprintf(key, sizeof key, "bench.rows.%d", w->table);
        if (gddr_table_register(c, key, w->dim, &to, &t) != GDDR_OK)
            bench_die("table register: %s", gddr_client_errmsg(c));
    } else {
        k.ctx = zmq_ctx_new();
        k.sock = zmq_socket(k.ctx, ZMQ_DEALER);
        int zero = 0;
        zmq_setsockopt(k.sock, ZMQ_LINGER, &zero, sizeof zero);
        zmq_connect(k.sock, w->ep);
        k.table = (uint32_t)w->table;
        k.dim = w->dim;
    }
#define PULL(out)                                                                           \
    do {                                                                                    \
        if (!w->gddr)                                                                       \
            kv_pull(&k, keys, w->n, out);                                                   \
        else if (gddr_pull_rows(c, t, keys, w->n, out, 0, 0, NULL) != GDDR_OK)              \
            bench_die("pull_rows: %s", gddr_client_errmsg(c));                              \
    } while (0)
#define PUSH()                                                                              \
    do {                                                                                    \
        if (!w->gddr)                                                                       \
            kv_push(&k, keys, w->n, g);                                                     \
        else if (gddr_push_rows(c, t, keys, w->n, g, NULL) != GDDR_OK)                      \
            bench_die("push_rows: %s", gddr_client_errmsg(c));                              \
    } while (0)
    /* warm-up (rows created), then the check */
    PULL(a);
    PUSH();
    PULL(b);
    check(w, keys, a, b, g);
    w->checked = m;
    pthread_barrier_wait(w->start);
    if (w->rank == 0) {
        w->cpu->c0 = self_cpu();
        w->cpu->s0 = proc_cpu(w->cpu->server);
    }
    double t0 = bench_now();
    for (int i = 0; i < w->iters; i++) {
        double t1 = bench_now();
        PULL(a);
        double t2 = bench_now();
        PUSH();
        w->pull_s += t2 - t1;
        w->push_s += bench_now() - t2;
    }
    w->seconds = bench_now() - t0;
    if (atomic_fetch_sub(&w->cpu->left, 1) == 1) {
        w->cpu->c1 = self_cpu();
        w->cpu->s1 = proc_cpu(w->cpu->server);
    }
    /* and again after the timed rounds */
    PULL(b);
    check(w, keys, a, b, g);
    w->checked += m;
#undef PULL
#undef PUSH
    if (w->gddr) {
        gddr_client_close(&c);
    } else {
        zmq_close(k.sock);
        zmq_ctx_term(k.ctx);
    }
    free(keys);
    free(g);
    free(a);
    free(b);
    return NULL;
}

/* One figure; *rows_s gets rows/s, returns MB/s (aggregates); ms[0], ms[1]:
 * a pull's and a push's milliseconds (the mean over calls and clients);
 * ms[2], ms[3]: the clients' and the server's CPU milliseconds per round
 * (all clients together: per n rows pulled and pushed). */
static double run(int gddr, const bench_proc *srv, int table, int clients, size_t n, uint32_t dim,
                  int iters, double *rows_s, double ms[4], size_t *checked)
{
    const char *ep = srv->endpoint;
    cpu_span cpu = { .server = srv->pid };
    atomic_init(&cpu.left, clients);
    worker w[64];
    pthread_t th[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)clients);
    for (int i = 0; i < clients; i++) {
        w[i] = (worker){ gddr, ep, i, clients, iters, table, n, dim, &start, &cpu, 0, 0, 0, 0 };
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    double slowest = 0;
    ms[0] = ms[1] = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        if (w[i].seconds > slowest)
            slowest = w[i].seconds;
        *checked += w[i].checked;
        ms[0] += 1e3 * w[i].pull_s / iters / clients;
        ms[1] += 1e3 * w[i].push_s / iters / clients;
    }
    pthread_barrier_destroy(&start);
    double rounds = (double)iters * clients;
    ms[2] = 1e3 * (cpu.c1 - cpu.c0) / rounds;
    ms[3] = 1e3 * (cpu.s1 - cpu.s0) / rounds;
    *rows_s = (double)n * rounds / slowest;
    return 2.0 * (double)n * dim * 4 * rounds / slowest / 1e6;
}

static void start_kv(bench_proc *p)
{
    char *argv[] = { bench_self, "--kv-server", bench_epfile, NULL };
    bench_spawn(p, argv);
}

void bench_rows_section(const bench_rows_cfg *cfg)
{
    bench_proc gs = { 0 }, ks = { 0 };
    bench_start_shard(&gs, 2, 0, 1, NULL);
    start_kv(&ks);
    int reps = cfg->reps < 1 ? 1 : cfg->reps > MAXR ? MAXR : cfg->reps;
    printf("\n## rows: gddr_pull_rows + gddr_push_rows of n random keys x dim floats, against "
           "ps-lite's key-value exchange over bare ZeroMQ\n"
           "## (rows/s = n x rounds / time, MB/s = values both ways; aggregate over clients; "
           "median of %d)\n\n", reps);
    printf("| n | dim | clients | gddr rows/s | gddr MB/s | bare rows/s | bare MB/s | ratio | "
           "gddr pull / push ms | bare pull / push ms | gddr CPU ms/round client / server | "
           "bare CPU ms/round client / server |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    size_t checked = 0;
    int table = 0;
    double target[2] = { -1, -1 };
    for (int di = 0; di < cfg->ndims; di++, table++)
        for (int ni = 0; ni < cfg->nkeys; ni++)
            for (int ci = 0; ci < cfg->ncl; ci++) {
                size_t n = cfg->keys[ni];
                uint32_t dim = cfg->dims[di];
                int cl = cfg->clients[ci];
                double it = cfg->budget_mb * 1e6 / (2.0 * (double)n * dim * 4 * cl);
                int iters = it < 3 ? 3 : it > 2000 ? 2000 : (int)it;
                double gm[MAXR], gr[MAXR], km[MAXR], kr[MAXR], q[MAXR], ph[8][MAXR], m4[4];
                for (int r = 0; r < reps; r++) {
                    gm[r] = run(1, &gs, table, cl, n, dim, iters, &gr[r], m4, &checked);
                    for (int i = 0; i < 4; i++)
                        ph[2 * i][r] = m4[i]; /* gddr: even, bare: odd */
                    km[r] = run(0, &ks, table, cl, n, dim, iters, &kr[r], m4, &checked);
                    for (int i = 0; i < 4; i++)
                        ph[2 * i + 1][r] = m4[i];
                    q[r] = gm[r] / km[r];
                }
                double pm[8];
                for (int i = 0; i < 8; i++)
                    pm[i] = bench_median(ph[i], reps);
                double g = bench_median(gm, reps), grs = bench_median(gr, reps);
                double kmb = bench_median(km, reps), krs = bench_median(kr, reps);
                double qm = bench_median(q, reps);
                printf("| %zu | %u | %d | %.3g | %.0f | %.3g | %.0f | %.2f | %.3g / %.3g | %.3g / %.3g "
                       "| %.3g / %.3g | %.3g / %.3g |\n",
                       n, dim, cl, grs, g, krs, kmb, qm, pm[0], pm[2], pm[1], pm[3], pm[4], pm[6],
                       pm[5], pm[7]);
                fprintf(stderr,
                        "BENCH section=rows keys=%zu dim=%u clients=%d gddr_rows_per_s=%.0f "
                        "gddr_mbps=%.1f raw_rows_per_s=%.0f raw_mbps=%.1f ratio=%.3f gddr_pull_ms=%.4g "
                        "gddr_push_ms=%.4g raw_pull_ms=%.4g raw_push_ms=%.4g gddr_client_cpu_ms=%.4g "
                        "gddr_server_cpu_ms=%.4g raw_client_cpu_ms=%.4g raw_server_cpu_ms=%.4g\n",
                        n, dim, cl, grs, g, krs, kmb, qm, pm[0], pm[2], pm[1], pm[3], pm[4], pm[6],
                        pm[5], pm[7]);
                fflush(stdout);
                if (n == 65536 && dim == 64 && (cl == 1 || cl == 4))
                    target[cl == 4] = qm;
            }
    printf("\nchecked: %zu pulled values, each equal to the value before a push - 0.5 x its "
           "gradient\n", checked);
    fprintf(stderr, "BENCH section=rows_check values=%zu\n", checked);
    for (int i = 0; i < 2; i++)
        if (target[i] >= 0)
            printf("target (issue 19): 64k keys x 64 floats, %d client%s: gddr/bare %.2f, %s 0.8\n",
                   i ? 4 : 1, i ? "s" : "", target[i], target[i] >= 0.8 ? "met, >=" : "MISSED, <");
    fflush(stdout);
    bench_stop(&gs);
    bench_stop(&ks);
}
