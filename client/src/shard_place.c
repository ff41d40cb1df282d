/* shard_place.c -- the sharded client's pure parts (shard.h): the server
 * list, where a tensor's pieces live, and the counters, stats and metrics
 * texts of several servers merged into one. No client, no socket.
 *
 * Placement (stable, no coordinator): a tensor of at most SPLIT_BYTES lives
 * whole on one server, the one with the highest hash of (key, server index)
 * (rendezvous hashing: adding a server moves only the keys it wins). A
 * larger tensor is split into one run of whole chunks per server, in order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gddr_hash.h"
#include "shard.h"

int gddr__split_list(const char *list, char (*ep)[512], int max)
{
    int n = 0;
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *end = e;
        while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if (n == max || (size_t)(end - p) >= sizeof ep[0])
            return 0;
        memcpy(ep[n], p, (size_t)(end - p));
        ep[n][end - p] = 0;
        n++;
        p = e;
    }
    return n;
}

int gddr__server_count(const char *list)
{
    int n = 0, in = 0;
    for (const char *p = list; p && *p; p++) {
        if (*p == ',')
            in = 0;
        else if (*p != ' ' && *p != '\t' && !in)
            in = 1, n++;
    }
    return n;
}

/* The server a whole tensor lives on: rendezvous hashing over the indexes. */
static int owner_of(const char *key, int S)
{
    uint32_t k = gddr_key_hash(key);
    int best = 0;
    uint64_t top = 0;
    for (int s = 0; s < S; s++) {
        uint64_t w = gddr__mix64(((uint64_t)k << 32 | (uint32_t)s) ^ 0x5851f42d4c957f2dull);
        if (s == 0 || w > top)
            top = w, best = s;
    }
    return best;
}

int gddr__shard_placement(const char *key, size_t n, int chunk, int S, size_t *off, size_t *len,
                          int *shard)
{
    if (n * 4 <= SPLIT_BYTES || chunk <= 0) {
        off[0] = 0;
        len[0] = n;
        shard[0] = owner_of(key, S);
        return 1;
    }
    size_t nch = (n + (size_t)chunk - 1) / (size_t)chunk;
    int np = 0;
    for (int s = 0; s < S; s++) {
        size_t c0 = nch * (size_t)s / (size_t)S, c1 = nch * (size_t)(s + 1) / (size_t)S;
        if (c1 == c0)
            continue;
        size_t lo = c0 * (size_t)chunk, hi = c1 * (size_t)chunk < n ? c1 * (size_t)chunk : n;
        off[np] = lo;
        len[np] = hi - lo;
        shard[np] = s;
        np++;
    }
    return np;
}

void gddr__counters_add(gddr_client_counters *out, const gddr_client_counters *k)
{
    out->pushes += k->pushes;
    out->pulls += k->pulls;
    out->bytes_pushed += k->bytes_pushed;
    out->bytes_pulled += k->bytes_pulled;
    out->values_pushed += k->values_pushed;
    out->reconnects += k->reconnects;
    out->staleness_sum += k->staleness_sum;
    out->orphans_received += k->orphans_received;
    out->tau_sum += k->tau_sum;
    out->tau_count += k->tau_count;
}

void gddr__stats_add(gddr_server_stats *out, const gddr_server_stats *x, int s, double *st,
                     double *wst)
{
    out->pushes += x->pushes;
    out->pulls += x->pulls;
    out->rejected += x->rejected;
    out->versions_total += x->versions_total;
    *st += x->staleness_mean * (double)x->pushes;
    *wst += x->worker_staleness_mean * (double)x->worker_pushes;
    out->staleness_ema = x->staleness_ema > out->staleness_ema ? x->staleness_ema : out->staleness_ema;
    if (x->staleness_max > out->staleness_max)
        out->staleness_max = x->staleness_max;
    for (int b = 0; b < 17; b++)
        out->staleness_hist[b] += x->staleness_hist[b];
    out->worker_pushes += x->worker_pushes;
    if (s == 0 || x->live_workers < out->live_workers)
        out->live_workers = x->live_workers;
    if (s == 0 || x->tau < out->tau)
        out->tau = x->tau;
    out->mode = x->mode;
    out->epoch ^= x->epoch;
}

void gddr__stats_done(gddr_server_stats *out, double st, double wst)
{
    out->staleness_mean = out->pushes ? st / (double)out->pushes : 0;
    out->worker_staleness_mean = out->worker_pushes ? wst / (double)out->worker_pushes : 0;
}

/* Prometheus texts of several servers as one: each sample line gets a
 * shard="I" label; a HELP or TYPE line is kept once (the first server's).
 * Series of different shards then differ by that label, so the text stays
 * valid exposition. */
char *gddr__metrics_merge(const char *const *texts, int n)
{
    size_t cap = 64;
    for (int s = 0; s < n; s++)
        cap += strlen(texts[s]) * 2 + 4096;
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    for (int s = 0; s < n; s++) {
        const char *p = texts[s];
        while (*p) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (p[0] == '#') {
                if (s == 0)
                    o += sprintf(o, "%.*s\n", (int)len, p);
            } else if (len) {
                size_t name = strcspn(p, "{ ");
                if (name > len)
                    name = len;
                if (p[name] == '{')
                    o += sprintf(o, "%.*s{shard=\"%d\",%.*s\n", (int)name, p, s,
                                 (int)(len - name - 1), p + name + 1);
                else
                    o += sprintf(o, "%.*s{shard=\"%d\"}%.*s\n", (int)name, p, s, (int)(len - name),
                                 p + name);
            }
            p += len + (e ? 1 : 0);
        }
    }
    *o = 0;
    return out;
}

