/* gddr-ctl -- ask running gddr-ps servers for their status or a checkpoint.
 *
 *   gddr-ctl [-s ENDPOINTS]... status        counters and staleness
 *   gddr-ctl [-s ENDPOINTS]... metrics       the Prometheus text
 *   gddr-ctl [-s ENDPOINTS]... checkpoint    write a checkpoint now
 *   gddr-ctl [-s ENDPOINTS]... watch [-i SECONDS] [-n COUNT]
 *                                            one line a second: rates, workers,
 *                                            staleness, tau, rejections, checkpoint age
 *   gddr-ctl [-s ENDPOINTS]... top [-i SECONDS] [-n COUNT]
 *                                            per worker, every interval: state, step,
 *                                            pushes/s, staleness, seconds since last heard
 *
 * ENDPOINTS is one endpoint or a comma-separated list (the servers of a
 * sharded model, in shard order: the syntax of the client's `server`
 * option); -s may also be given several times, and GDDR_SERVER holds the
 * list when there is no -s. With several servers, `status` prints one row
 * per server and a total (sums; live workers and staleness max are the
 * largest), and `metrics` merges the servers' texts into one valid
 * exposition: each family's HELP and TYPE once, then its samples from every
 * server, each with a label shard="I" (I: the server's shard_index, from
 * its gddr_shard_info gauge).
 *
 * For a server with CURVE, set GDDR_CURVE_SERVER_KEY (its public key) and
 * GDDR_CURVE_KEY_FILE (a key file whose public key is authorized).
 *
 * It talks to each server through libgddr-client, one client (one
 * endpoint) per server, as an observer: it never changes what a sync step
 * waits for, and an observer may talk to any one shard.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gddr/gddr.h"
#include "numparse.h"
#include "prom.h"

#define MAX_SERVERS 256

typedef struct srv {
    char *ep;
    gddr_client *c;
    char *metrics;         /* the Prometheus text (status and metrics) */
    int shard, shards;     /* what its gddr_shard_info says; -1: not said */
    gddr_server_stats st;
    gddr_server_info info;
} srv;

static void usage(FILE *f)
{
    fprintf(f, "usage: gddr-ctl [-s ENDPOINT[,ENDPOINT...]]... [-t MS] status|metrics|checkpoint\n"
               "       gddr-ctl [-s ENDPOINT[,ENDPOINT...]]... [-t MS] watch|top [-i SECONDS] [-n COUNT]\n"
               "       gddr-ctl --help | --version\n"
               "  -s, --server EP     the server(s) (or set GDDR_SERVER=ENDPOINT[,ENDPOINT...])\n"
               "  -t, --timeout-ms MS bound on every wait, the connection included (default 3000)\n"
               "  -i SECONDS          watch/top: seconds between samples (at least 0.05)\n"
               "  -n COUNT            watch/top: stop after COUNT samples\n"
               "  CURVE: GDDR_CURVE_SERVER_KEY (the server's public key), GDDR_CURVE_KEY_FILE\n");
}

/* The library's error lines (why a server could not be reached). */
static void log_err(void *user, int level, const char *msg)
{
    (void)user;
    if (level == GDDR_LOG_ERROR)
        fprintf(stderr, "gddr-ctl: %s\n", msg);
}

/* Splits a comma-separated list into s[*n...]; 0, or -1 on an empty item
 * or too many servers. */
static int add_endpoints(srv *s, int *n, const char *list)
{
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (*p == ' ' || *p == '\t'))
            p++, len--;
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (!len) {
            fprintf(stderr, "gddr-ctl: an empty endpoint in '%s'\n", list);
            return -1;
        }
        if (*n >= MAX_SERVERS) {
            fprintf(stderr, "gddr-ctl: more than %d servers\n", MAX_SERVERS);
            return -1;
        }
        s[*n].ep = strndup(p, len);
        s[*n].shard = s[*n].shards = -1;
        (*n)++;
        if (!end)
            return 0;
        p = end + 1;
    }
}

/* The value of the unlabelled sample `name` in a Prometheus text; 0 when
 * absent. */
static double metric_of(const char *text, const char *name)
{
    return gddr__prom_sample(text, name, 0);
}

static int fetch_metrics(srv *s)
{
    int rc = gddr_server_metrics_text(s->c, &s->metrics);
    if (rc != GDDR_OK)
        return rc;
    const char *p = strstr(s->metrics, "\ngddr_shard_info{shard_index=\"");
    if (p && sscanf(p, "\ngddr_shard_info{shard_index=\"%d\",shard_count=\"%d\"}", &s->shard,
                    &s->shards) != 2)
        s->shard = s->shards = -1;
    return GDDR_OK;
}

static const char *mode_name(int mode)
{
    return mode == GDDR_MODE_SYNC ? "sync" : mode == GDDR_MODE_SSP ? "ssp" : "async";
}

/* The shard label of server i: the index it says, else its place in the
 * list (a server from before sharding says none). */
static int shard_label(const srv *s, int i)
{
    return s[i].shard >= 0 ? s[i].shard : i;
}

/* Whether the list is a whole layout: server i says it is shard i of n. */
static int check_layout(const srv *s, int n)
{
    int ok = 1;
    for (int i = 0; i < n; i++)
        if (s[i].shard >= 0 && (s[i].shard != i || s[i].shards != n)) {
            fprintf(stderr, "gddr-ctl: note: %s is shard %d of %d, but is at %d of the %d listed\n",
                    s[i].ep, s[i].shard, s[i].shards, i, n);
            ok = 0;
        }
    return ok;
}

/* ---- status ---------------------------------------------------------------- */

/* GDDR on a server: tau means something only when some worker holds chunks
 * back (delay_fraction > 0: pushes with held chunks) or pulls lazily
 * (pull_delay_fraction > 0: lazy pulls that held chunks). Nothing else
 * tells: a dense worker is not told tau and sends no sign of its alpha. */
typedef struct gddr_use {
    double held, sent; /* push chunks */
    double lazy_held;  /* lazy-pull chunks held back */
    int tau_lo, tau_hi, ntau;
} gddr_use;

static gddr_use gddr_use_of(const srv *s)
{
    gddr_use u = { 0 };
    const char *m = s->metrics ? s->metrics : "";
    u.held = gddr__prom_sample(m, "gddr_push_chunks_total{outcome=\"held\"}", 0);
    u.sent = gddr__prom_sample(m, "gddr_push_chunks_total{outcome=\"sent\"}", 0);
    u.lazy_held = gddr__prom_sample(m, "gddr_lazy_chunks_total{outcome=\"held\"}", 0);
    /* tau is per tensor (gddr_tau{tensor="..."}); the stats reply has the
     * first tensor's only. */
    for (const char *p = m; p && *p;) {
        if (strncmp(p, "gddr_tau{", 9) == 0) {
            const char *sp = strchr(p, '}');
            sp = sp ? strchr(sp, ' ') : NULL;
            if (sp) {
                int t = atoi(sp + 1);
                if (u.ntau == 0 || t < u.tau_lo)
                    u.tau_lo = t;
                if (u.ntau == 0 || t > u.tau_hi)
                    u.tau_hi = t;
                u.ntau++;
            }
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    if (u.ntau == 0)
        u.tau_lo = u.tau_hi = s->st.tau;
    return u;
}

static int gddr_on(const gddr_use *u)
{
    return u->held > 0 || u->lazy_held > 0;
}

static void tau_text(char *buf, size_t len, int lo, int hi)
{
    if (lo == hi)
        snprintf(buf, len, "%d", lo);
    else
        snprintf(buf, len, "%d-%d", lo, hi);
}

/* Pushes, pulls and updates are counted per tensor: one gddr_step of a
 * model of T tensors is T pushes, T pulls and (async) T updates. */
static void status_one(const srv *s)
{
    const gddr_server_stats *st = &s->st;
    printf("epoch          %016llx\nmode           %s\nlive workers   %d\n"
           "tensor pushes  %llu\ntensor pulls   %llu\nrejected       %llu\n"
           "tensor updates %llu\nstaleness      mean %.3f, ema %.3f, max %llu\n",
           (unsigned long long)st->epoch, mode_name(s->info.mode), st->live_workers,
           (unsigned long long)st->pushes, (unsigned long long)st->pulls,
           (unsigned long long)st->rejected, (unsigned long long)st->versions_total,
           st->staleness_mean, st->staleness_ema, (unsigned long long)st->staleness_max);
    gddr_use u = gddr_use_of(s);
    if (gddr_on(&u)) {
        char tau[32];
        tau_text(tau, sizeof tau, u.tau_lo, u.tau_hi);
        printf("tau            %s (GDDR delay bound%s; %.1f%% of pushed chunks held back)\n", tau,
               u.tau_lo != u.tau_hi ? ", per tensor" : "",
               u.held + u.sent > 0 ? 100.0 * u.held / (u.held + u.sent) : 0.0);
    } else {
        printf("tau            - (GDDR off: no worker has held a chunk back)\n");
    }
    printf("staleness hist");
    for (int b = 0; b < 17; b++)
        printf(" %llu", (unsigned long long)st->staleness_hist[b]);
    printf("\nbytes          received %.0f, sent %.0f\n",
           metric_of(s->metrics, "gddr_bytes_received_total"),
           metric_of(s->metrics, "gddr_bytes_sent_total"));
    if (s->shard >= 0)
        printf("shard          %d of %d\n", s->shard, s->shards);
}

/* One row per server and a total: counters summed, live workers and the
 * staleness max the largest (every worker talks to every shard), the
 * staleness mean weighted by pushes, tau only where GDDR is used. */
static void status_many(const srv *s, int n)
{
    int epw = 8;
    for (int i = 0; i < n; i++)
        if ((int)strlen(s[i].ep) > epw)
            epw = (int)strlen(s[i].ep);
    const char *hdr = "%-7s %-*s %-5s %4s %10s %10s %8s %10s %12s %12s %5s %10s %9s\n";
    printf(hdr, "shard", epw, "endpoint", "mode", "live", "pushes", "pulls", "rejected", "updates",
           "bytes_in", "bytes_out", "tau", "stale_mean", "stale_max");
    const char *row = "%-7s %-*s %-5s %4d %10llu %10llu %8llu %10llu %12.0f %12.0f %5s %10.3f %9llu\n";
    gddr_server_stats t;
    memset(&t, 0, sizeof t);
    double bin = 0, bout = 0, stale_sum = 0;
    int tau_lo = 0, tau_hi = 0, ngddr = 0, mixed = 0;
    for (int i = 0; i < n; i++) {
        const gddr_server_stats *st = &s[i].st;
        char shard[32], tau[32] = "-";
        if (s[i].shard >= 0)
            snprintf(shard, sizeof shard, "%d/%d", s[i].shard, s[i].shards);
        else
            snprintf(shard, sizeof shard, "?");
        gddr_use u = gddr_use_of(&s[i]);
        if (gddr_on(&u)) {
            tau_text(tau, sizeof tau, u.tau_lo, u.tau_hi);
            if (ngddr == 0 || u.tau_lo < tau_lo)
                tau_lo = u.tau_lo;
            if (ngddr == 0 || u.tau_hi > tau_hi)
                tau_hi = u.tau_hi;
            ngddr++;
        }
        double in = metric_of(s[i].metrics, "gddr_bytes_received_total");
        double out = metric_of(s[i].metrics, "gddr_bytes_sent_total");
        printf(row, shard, epw, s[i].ep, mode_name(s[i].info.mode), st->live_workers,
               (unsigned long long)st->pushes, (unsigned long long)st->pulls,
               (unsigned long long)st->rejected, (unsigned long long)st->versions_total, in, out,
               tau, st->staleness_mean, (unsigned long long)st->staleness_max);
        t.pushes += st->pushes;
        t.pulls += st->pulls;
        t.rejected += st->rejected;
        t.versions_total += st->versions_total;
        if (st->live_workers > t.live_workers)
            t.live_workers = st->live_workers;
        if (st->staleness_max > t.staleness_max)
            t.staleness_max = st->staleness_max;
        for (int b = 0; b < 17; b++)
            t.staleness_hist[b] += st->staleness_hist[b];
        stale_sum += st->staleness_mean * (double)st->pushes;
        bin += in;
        bout += out;
        if (s[i].info.mode != s[0].info.mode)
            mixed = 1;
    }
    char tau[32] = "-";
    if (ngddr)
        tau_text(tau, sizeof tau, tau_lo, tau_hi);
    printf(row, "total", epw, "all", mixed ? "mixed" : mode_name(s[0].info.mode), t.live_workers,
           (unsigned long long)t.pushes, (unsigned long long)t.pulls,
           (unsigned long long)t.rejected, (unsigned long long)t.versions_total, bin, bout, tau,
           t.pushes ? stale_sum / (double)t.pushes : 0.0, (unsigned long long)t.staleness_max);
    printf("staleness hist (all servers)");
    for (int b = 0; b < 17; b++)
        printf(" %llu", (unsigned long long)t.staleness_hist[b]);
    printf("\npushes, pulls, updates: counted per tensor (a step of a model of T tensors is T "
           "pushes); tau: the GDDR delay bound, '-' where no worker held a chunk back\n");
}

/* ---- metrics --------------------------------------------------------------- */

static int metrics_many(const srv *s, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (shard_label(s, i) == shard_label(s, j)) {
                fprintf(stderr, "gddr-ctl: %s and %s both are shard %d: their series would clash\n",
                        s[j].ep, s[i].ep, shard_label(s, i));
                return 1;
            }
    const char *texts[MAX_SERVERS];
    int labels[MAX_SERVERS];
    for (int i = 0; i < n; i++) {
        texts[i] = s[i].metrics;
        labels[i] = shard_label(s, i);
    }
    int rc = gddr__prom_merge(texts, labels, n, stdout);
    if (rc == -2)
        fprintf(stderr, "gddr-ctl: more than %d metric families\n", GDDR_PROM_MAX_FAMILIES);
    else if (rc < 0)
        fprintf(stderr, "gddr-ctl: no memory\n");
    return rc < 0;
}

/* ---- watch ---------------------------------------------------------------- */

/* What one look at all servers gives (summed; workers and max the largest). */
typedef struct sample {
    double pushes, pulls, bytes_in, bytes_out, rejected, stale_count, stale_sum;
    double hist[17];
    double stale_max, ckpt_age;
    int live, tau_lo, tau_hi;
} sample;

static int take_sample(srv *s, int n, sample *out)
{
    memset(out, 0, sizeof *out);
    out->ckpt_age = -1;
    for (int k = 0; k < n; k++) {
        free(s[k].metrics);
        s[k].metrics = NULL;
        int rc = fetch_metrics(&s[k]);
        if (rc == GDDR_OK)
            rc = gddr_server_stats_get(s[k].c, &s[k].st);
        if (rc != GDDR_OK) {
            fprintf(stderr, "gddr-ctl: %s: %s: %s\n", s[k].ep, gddr_strerror(rc),
                    gddr_client_errmsg(s[k].c));
            return -1;
        }
        const gddr_server_stats *st = &s[k].st;
        const char *m = s[k].metrics;
        out->pushes += (double)st->pushes;
        out->pulls += (double)st->pulls;
        out->rejected += (double)st->rejected;
        out->bytes_in += metric_of(m, "gddr_bytes_received_total");
        out->bytes_out += metric_of(m, "gddr_bytes_sent_total");
        out->stale_count += metric_of(m, "gddr_staleness_count");
        out->stale_sum += metric_of(m, "gddr_staleness_sum");
        for (int b = 0; b < 17; b++)
            out->hist[b] += (double)st->staleness_hist[b];
        if ((double)st->staleness_max > out->stale_max)
            out->stale_max = (double)st->staleness_max;
        if (st->live_workers > out->live)
            out->live = st->live_workers;
        if (k == 0 || st->tau < out->tau_lo)
            out->tau_lo = st->tau;
        if (k == 0 || st->tau > out->tau_hi)
            out->tau_hi = st->tau;
        /* The oldest shard's checkpoint is the one that matters. */
        double age = gddr__prom_sample(m, "gddr_checkpoint_age_seconds", -1);
        if (age >= 0 && age > out->ckpt_age)
            out->ckpt_age = age;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Like redis-cli --stat: a header, then one line per interval with the
 * rates over that interval, the staleness of the pushes applied in it
 * (mean and p95; "-" without pushes) and the largest since the start. */
static int watch(srv *s, int n, double every, long count)
{
    static const char *hdr = "%9s %9s %9s %9s %7s %10s %5s %5s %5s %9s %9s\n";
    sample a, b;
    if (take_sample(s, n, &a) < 0)
        return 1;
    double t0 = now_s();
    for (long line = 0; count <= 0 || line < count; line++) {
        if (line % 20 == 0)
            printf(hdr, "tpush/s", "tpull/s", "MB/s in", "MB/s out", "workers", "stale mean",
                   "p95", "max", "tau", "rejected", "ckpt age");
        struct timespec nap = { (time_t)every, (long)((every - (double)(time_t)every) * 1e9) };
        nanosleep(&nap, NULL);
        if (take_sample(s, n, &b) < 0)
            return 1;
        double t1 = now_s(), dt = t1 - t0 > 1e-3 ? t1 - t0 : 1e-3;
        double dn = b.stale_count - a.stale_count;
        char mean[16] = "-", p95[16] = "-", tau[16], age[16] = "-";
        if (dn > 0) {
            snprintf(mean, sizeof mean, "%.2f", (b.stale_sum - a.stale_sum) / dn);
            /* Ranked within the histogram (the stats request), not dn
             * (the metrics text, read earlier: pushes in between). */
            double hn = 0, cum = 0;
            for (int k = 0; k < 17; k++)
                hn += b.hist[k] - a.hist[k];
            int q = 0;
            while (q < 16 && (cum += b.hist[q] - a.hist[q]) < 0.95 * hn)
                q++;
            if (hn > 0)
                snprintf(p95, sizeof p95, q == 16 ? ">=%d" : "%d", q);
        }
        if (b.tau_lo == b.tau_hi)
            snprintf(tau, sizeof tau, "%d", b.tau_lo);
        else
            snprintf(tau, sizeof tau, "%d-%d", b.tau_lo, b.tau_hi);
        if (b.ckpt_age >= 0)
            snprintf(age, sizeof age, "%.0fs", b.ckpt_age);
        printf("%9.1f %9.1f %9.2f %9.2f %7d %10s %5s %5.0f %5s %9.0f %9s\n",
               (b.pushes - a.pushes) / dt, (b.pulls - a.pulls) / dt,
               (b.bytes_in - a.bytes_in) / dt / 1e6, (b.bytes_out - a.bytes_out) / dt / 1e6, b.live,
               mean, p95, b.stale_max, tau, b.rejected - a.rejected, age);
        fflush(stdout);
        a = b;
        t0 = t1;
    }
    return 0;
}

/* ---- top ------------------------------------------------------------------ */

/* One worker as all servers see it: pushes and duplicates summed over the
 * shards, its step and staleness the largest, last heard the most recent,
 * and its state the liveliest (live if any shard hears it). */
typedef struct wrow {
    int seen_any, state;
    double step, pushes, dups, mean_x_pushes, ema, max, seen_s;
} wrow;

#define TOP_MAX_RANKS 65536

/* The value of metric{rank="r"} in text; `absent` when there is none. */
static double rank_metric(const char *text, const char *name, int r, double absent)
{
    char full[96];
    snprintf(full, sizeof full, "%s{rank=\"%d\"}", name, r);
    return gddr__prom_sample(text, full, absent);
}

/* Fills rows[0..*nrows) from every server's metrics; -1 when one fails. */
static int take_workers(srv *s, int n, wrow *rows, int *nrows)
{
    static const char key[] = "\ngddr_worker_state{rank=\"";
    memset(rows, 0, TOP_MAX_RANKS * sizeof *rows);
    *nrows = 0;
    for (int k = 0; k < n; k++) {
        free(s[k].metrics);
        s[k].metrics = NULL;
        int rc = fetch_metrics(&s[k]);
        if (rc != GDDR_OK) {
            fprintf(stderr, "gddr-ctl: %s: %s: %s\n", s[k].ep, gddr_strerror(rc),
                    gddr_client_errmsg(s[k].c));
            return -1;
        }
        const char *m = s[k].metrics;
        for (const char *p = strstr(m, key); p; p = strstr(p + 1, key)) {
            int r = atoi(p + sizeof key - 1);
            if (r < 0 || r >= TOP_MAX_RANKS)
                continue;
            wrow *w = &rows[r];
            int state = (int)rank_metric(m, "gddr_worker_state", r, 0);
            double pushes = rank_metric(m, "gddr_worker_pushes_total", r, 0);
            double seen = rank_metric(m, "gddr_worker_last_seen_seconds", r, -1);
            double step = rank_metric(m, "gddr_worker_step", r, 0);
            double ema = rank_metric(m, "gddr_worker_staleness_ema", r, 0);
            double max = rank_metric(m, "gddr_worker_staleness_max", r, 0);
            if (!w->seen_any || state == 1 || (state == 2 && w->state == 3))
                w->state = state;
            if (!w->seen_any || (seen >= 0 && seen < w->seen_s))
                w->seen_s = seen;
            w->seen_any = 1;
            w->pushes += pushes;
            w->dups += rank_metric(m, "gddr_worker_duplicates_total", r, 0);
            w->mean_x_pushes += pushes * rank_metric(m, "gddr_worker_staleness_mean", r, 0);
            if (step > w->step)
                w->step = step;
            if (ema > w->ema)
                w->ema = ema;
            if (max > w->max)
                w->max = max;
            if (r + 1 > *nrows)
                *nrows = r + 1;
        }
    }
    return 0;
}

static const char *state_name(int state)
{
    return state == 1 ? "live" : state == 2 ? "dead" : state == 3 ? "left" : "?";
}

/* Like top: every interval, one line a worker (the pushes/s over that
 * interval). On a terminal each frame replaces the last; otherwise frames
 * follow each other, a blank line between. */
static int top(srv *s, int n, double every, long count)
{
    wrow *a = calloc(TOP_MAX_RANKS, sizeof *a), *b = calloc(TOP_MAX_RANKS, sizeof *b);
    int na = 0, nb = 0, tty = isatty(STDOUT_FILENO), failed = 0;
    if (!a || !b || take_workers(s, n, a, &na) < 0) {
        free(a);
        free(b);
        return 1;
    }
    double t0 = now_s();
    for (long frame = 0; count <= 0 || frame < count; frame++) {
        struct timespec nap = { (time_t)every, (long)((every - (double)(time_t)every) * 1e9) };
        nanosleep(&nap, NULL);
        if (take_workers(s, n, b, &nb) < 0) {
            failed = 1;
            break;
        }
        double t1 = now_s(), dt = t1 - t0 > 1e-3 ? t1 - t0 : 1e-3, rate = 0;
        int live = 0, dead = 0, left = 0;
        for (int r = 0; r < nb; r++) {
            if (!b[r].seen_any)
                continue;
            live += b[r].state == 1, dead += b[r].state == 2, left += b[r].state == 3;
            rate += b[r].pushes - (r < na ? a[r].pushes : 0);
        }
        if (tty)
            fputs("\033[H\033[2J", stdout);
        else if (frame)
            putchar('\n');
        printf("workers: %d live, %d dead, %d left; %.1f tensor pushes/s\n", live, dead, left, rate / dt);
        printf("%6s %5s %10s %9s %10s %6s %10s %6s %5s %8s\n", "rank", "state", "step", "tpush/s",
               "tpushes", "dups", "stale mean", "ema", "max", "seen");
        for (int r = 0; r < nb; r++) {
            const wrow *w = &b[r];
            if (!w->seen_any)
                continue;
            double d = w->pushes - (r < na ? a[r].pushes : 0);
            char seen[24] = "-";
            if (w->seen_s >= 0)
                snprintf(seen, sizeof seen, "%.1fs", w->seen_s);
            printf("%6d %5s %10.0f %9.1f %10.0f %6.0f %10.2f %6.2f %5.0f %8s\n", r, state_name(w->state),
                   w->step, d / dt, w->pushes, w->dups, w->pushes > 0 ? w->mean_x_pushes / w->pushes : 0,
                   w->ema, w->max, seen);
        }
        fflush(stdout);
        wrow *t = a;
        a = b, b = t, na = nb, t0 = t1;
    }
    free(a);
    free(b);
    return failed;
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    srv *s = calloc(MAX_SERVERS, sizeof *s);
    int n = 0, i = 1;
    if (!s)
        return 1;
    long long timeout_ms = 3000;
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("gddr-ctl %s\n", GDDR_VERSION);
        return 0;
    }
    while (i + 1 < argc && argv[i][0] == '-') {
        if (strcmp(argv[i], "-s") == 0 || strcmp(argv[i], "--server") == 0) {
            if (add_endpoints(s, &n, argv[i + 1]) < 0)
                return 2;
        } else if (strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--timeout-ms") == 0) {
            if (gddr__arg_int("gddr-ctl", argv[i], argv[i + 1], 1, 86400000, &timeout_ms) < 0)
                return 2;
        } else {
            break;
        }
        i += 2;
    }
    const char *env = getenv("GDDR_SERVER");
    if (n == 0 && env && env[0] && add_endpoints(s, &n, env) < 0)
        return 2;
    const char *cmd = i < argc ? argv[i] : "";
    double every = 1;
    long count = 0;
    int looping = strcmp(cmd, "watch") == 0 || strcmp(cmd, "top") == 0;
    if (looping) {
        int j = i + 1;
        for (; j + 1 < argc; j += 2) {
            long long cnt;
            if (strcmp(argv[j], "-i") == 0) {
                if (gddr__arg_num("gddr-ctl", "-i", argv[j + 1], 0.05, 1e6, &every) < 0)
                    return 2;
                continue;
            }
            if (strcmp(argv[j], "-n") == 0) {
                if (gddr__arg_int("gddr-ctl", "-n", argv[j + 1], 1, 1000000000, &cnt) < 0)
                    return 2;
                count = (long)cnt;
                continue;
            }
            break;
        }
        if (j != argc) {
            usage(stderr);
            return 2;
        }
        argc = i + 1; /* the options are taken */
    }
    if (i + 1 != argc || n == 0) {
        usage(stderr);
        return 2;
    }
    if (strcmp(cmd, "status") && strcmp(cmd, "metrics") && strcmp(cmd, "checkpoint") && !looping) {
        fprintf(stderr, "gddr-ctl: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    int failed = 0;
    for (int k = 0; k < n; k++) {
        gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
        o.server = s[k].ep;
        o.rank = 0;
        o.world_size = 1;
        /* Every wait bounded by -t: the reply, the connection, a retry. */
        o.timeout_ms = o.connect_timeout_ms = o.reconnect_timeout_ms = (int)timeout_ms;
        o.observer = 1;
        o.log = log_err;
        o.log_level = GDDR_LOG_ERROR;
        /* A server with CURVE: its public key and our key file. */
        o.curve_server_key = getenv("GDDR_CURVE_SERVER_KEY");
        o.curve_key_file = getenv("GDDR_CURVE_KEY_FILE");
        int rc = gddr_client_open(&o, &s[k].c);
        if (rc == GDDR_OK && strcmp(cmd, "checkpoint") == 0) {
            rc = gddr_request_checkpoint(s[k].c);
            if (rc == GDDR_OK && n > 1)
                printf("checkpoint requested: %s\n", s[k].ep);
            else if (rc == GDDR_OK)
                printf("checkpoint requested\n");
        } else if (rc == GDDR_OK && looping) {
            /* watch and top fetch in their loops */
        } else if (rc == GDDR_OK) {
            gddr_client_info(s[k].c, &s[k].info);
            rc = fetch_metrics(&s[k]);
            if (rc == GDDR_OK && strcmp(cmd, "status") == 0)
                rc = gddr_server_stats_get(s[k].c, &s[k].st);
        } else {
            fprintf(stderr, "gddr-ctl: cannot reach %s: %s\n", s[k].ep, gddr_strerror(rc));
            failed = 1;
            continue;
        }
        if (rc != GDDR_OK) {
            fprintf(stderr, "gddr-ctl: %s: %s: %s\n", s[k].ep, gddr_strerror(rc),
                    gddr_client_errmsg(s[k].c));
            failed = 1;
        }
    }
    if (!failed && strcmp(cmd, "watch") == 0) {
        failed = watch(s, n, every, count);
    } else if (!failed && strcmp(cmd, "top") == 0) {
        failed = top(s, n, every, count);
    } else if (!failed && strcmp(cmd, "status") == 0) {
        if (n == 1) {
            status_one(&s[0]);
        } else {
            status_many(s, n);
            check_layout(s, n);
        }
    } else if (!failed && strcmp(cmd, "metrics") == 0) {
        if (n == 1)
            fputs(s[0].metrics, stdout);
        else
            failed = metrics_many(s, n);
    }
    for (int k = 0; k < n; k++) {
        gddr_client_close(&s[k].c);
        free(s[k].metrics);
        free(s[k].ep);
    }
    free(s);
    return failed ? 1 : 0;
}
