/* c_peer.c -- the C side of the Python tests, built by conftest.py against
 * gddr.h and the same libgddr-client the Python package loads.
 *
 *   c_peer layout
 *       sizeof and offsetof of every field of the public result structs, one
 *       "struct field offset size" line each, to hold the ctypes mirror of
 *       python/gddr/_lib.py against what the compiler made of gddr.h;
 *       sizeof(gddr_client_opts) and its defaults; gddr_table_opts (mirrored
 *       as _lib.TableOpts) and GDDR_TABLE_OPTS_INIT
 *   c_peer train ENDPOINT KEY N STEPS DELAY_FRACTION DC_LAMBDA CLIP_NORM
 *       rank 0 of 1 trains w (N floats, registered as zeros) towards
 *       target[i] = (float)((i % 7) * 0.37 - 1.0) with g = w - target and
 *       gddr_step, STEPS times, then closes (residual flush and bye) and
 *       prints "w HEX..." (the params the last step returned, as float bits)
 *       and "k bytes_pushed values_pushed". test_values.py does the same
 *       through the Python package and compares bit for bit.
 */
#include <gddr/gddr.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F(s, f) printf("%s %s %zu %zu\n", #s, #f, offsetof(s, f), sizeof(((s *)0)->f))

static int layout(void)
{
    /* gddr_client_opts is not mirrored: Python allocates the size the
     * library reports and sets options by name. */
    printf("opts_size %zu\n", sizeof(gddr_client_opts));
    printf("gddr_server_info - %zu %zu\n", (size_t)0, sizeof(gddr_server_info));
    F(gddr_server_info, epoch); F(gddr_server_info, mode); F(gddr_server_info, tau);
    F(gddr_server_info, chunk); F(gddr_server_info, workers); F(gddr_server_info, rank);
    F(gddr_server_info, world_size);
    printf("gddr_push_tags - %zu %zu\n", (size_t)0, sizeof(gddr_push_tags));
    F(gddr_push_tags, birth_version); F(gddr_push_tags, base_version); F(gddr_push_tags, has_birth);
    printf("gddr_client_counters - %zu %zu\n", (size_t)0, sizeof(gddr_client_counters));
    F(gddr_client_counters, steps); F(gddr_client_counters, pushes); F(gddr_client_counters, pulls);
    F(gddr_client_counters, bytes_pushed); F(gddr_client_counters, bytes_pulled);
    F(gddr_client_counters, values_pushed); F(gddr_client_counters, reconnects);
    F(gddr_client_counters, staleness_sum); F(gddr_client_counters, orphans_received);
    F(gddr_client_counters, tau_sum); F(gddr_client_counters, tau_count);
    F(gddr_client_counters, step_ns);
    printf("gddr_server_stats - %zu %zu\n", (size_t)0, sizeof(gddr_server_stats));
    F(gddr_server_stats, pushes); F(gddr_server_stats, pulls); F(gddr_server_stats, rejected);
    F(gddr_server_stats, versions_total); F(gddr_server_stats, staleness_mean);
    F(gddr_server_stats, staleness_ema); F(gddr_server_stats, staleness_max);
    F(gddr_server_stats, staleness_hist); F(gddr_server_stats, worker_staleness_mean);
    F(gddr_server_stats, worker_pushes); F(gddr_server_stats, tau);
    F(gddr_server_stats, live_workers); F(gddr_server_stats, mode); F(gddr_server_stats, epoch);
    printf("gddr_table_opts - %zu %zu\n", (size_t)0, sizeof(gddr_table_opts));
    F(gddr_table_opts, init); F(gddr_table_opts, init_scale); F(gddr_table_opts, init_seed);
    F(gddr_table_opts, admit); F(gddr_table_opts, admit_count); F(gddr_table_opts, admit_prob);
    F(gddr_table_opts, optimizer); F(gddr_table_opts, max_rows); F(gddr_table_opts, row_ttl);
    /* GDDR_TABLE_OPTS_INIT, which Python's TableOpts() must equal. */
    gddr_table_opts to = GDDR_TABLE_OPTS_INIT;
    printf("default table.init %d\ndefault table.init_scale %.9g\ndefault table.init_seed %" PRIu64
           "\ndefault table.admit %d\ndefault table.admit_count %u\ndefault table.admit_prob %.9g\n"
           "default table.optimizer %s\ndefault table.max_rows %" PRIu64 "\ndefault table.row_ttl %"
           PRIu64 "\n", to.init, (double)to.init_scale, to.init_seed, to.admit, to.admit_count,
           (double)to.admit_prob, to.optimizer ? to.optimizer : "NULL", to.max_rows, to.row_ttl);
    /* The defaults, through the function other languages call. */
    gddr_client_opts o;
    memset(&o, 0xff, sizeof o);
    gddr_client_opts_init(&o);
    printf("default timeout_ms %d\ndefault seed %" PRIu64 "\ndefault heartbeat_ms %d\n"
           "default dc_ms_decay %.17g\n", o.timeout_ms, o.seed, o.heartbeat_ms, o.dc_ms_decay);
    return 0;
}

static int train(char **argv)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = argv[0];
    o.rank = 0;
    o.world_size = 1;
    o.delay_fraction = atof(argv[4]);
    o.dc_lambda = atof(argv[5]);
    o.clip_norm = atof(argv[6]);
    o.pull_delta_bits = atoi(argv[7]);
    size_t n = (size_t)atol(argv[2]);
    int steps = atoi(argv[3]);
    float *w = calloc(n, 4), *g = calloc(n, 4), *target = calloc(n, 4);
    for (size_t i = 0; i < n; i++)
        target[i] = (float)((double)(i % 7) * 0.37 - 1.0);
    gddr_client *c;
    int rc = gddr_client_open(&o, &c), id;
    if (rc != GDDR_OK) {
        fprintf(stderr, "c_peer: open: %s\n", gddr_strerror(rc));
        return 1;
    }
    if ((rc = gddr_register(c, argv[1], w, n, &id, NULL)) != GDDR_OK ||
        (rc = gddr_pull(c, id, w, 0, NULL)) != GDDR_OK) {
        fprintf(stderr, "c_peer: register: %s\n", gddr_client_errmsg(c));
        return 1;
    }
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = w[i] - target[i];
        const float *gs[] = { g };
        float *ws[] = { w };
        if ((rc = gddr_step(c, gs, ws)) != GDDR_OK) {
            fprintf(stderr, "c_peer: step %d: %s\n", s, gddr_client_errmsg(c));
            return 1;
        }
    }
    gddr_client_counters k;
    gddr_client_counters_get(c, &k);
    gddr_client_close(&c);
    printf("w");
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &w[i], 4);
        printf(" %08x", bits);
    }
    printf("\nk %" PRIu64 " %" PRIu64 "\n", k.bytes_pushed, k.values_pushed);
    free(w), free(g), free(target);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "layout") == 0)
        return layout();
    if (argc == 10 && strcmp(argv[1], "train") == 0)
        return train(argv + 2);
    fprintf(stderr, "usage: c_peer layout | c_peer train EP KEY N STEPS ALPHA DC_LAMBDA CLIP PULL_BITS\n");
    return 2;
}
