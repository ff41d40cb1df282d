/* client_driver.c -- libgddr-client against a lying server
 * (tests/fuzz/lying_server.py): opens a client again and again for SECONDS and runs what a
 * trainer runs (register, GDDR and dense steps with 8-bit delta pulls,
 * delay_auto and pull_delta_auto timing their steps,
 * pipelined steps, pushes and pulls in parts, a table's row pulls and
 * pushes, heartbeats, close with its flush), ignoring every error. What
 * counts is that it neither crashes nor hangs nor, in a SANITIZER=address
 * build, touches memory it does not own; scripts/fuzz-client.sh runs it.
 *
 *   client_driver ENDPOINT SECONDS
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gddr/gddr.h"

static void tensors(gddr_client *c, int k)
{
    size_t n = k % 4 == 0 ? 10 : 3000;
    float *p = calloc(n, 4), *g = malloc(n * 4);
    if (!p || !g)
        abort();
    for (size_t i = 0; i < n; i++)
        g[i] = 0.01f * (float)(i % 7);
    int id = -1;
    if (gddr_register(c, "t", p, n, &id, NULL) == GDDR_OK) {
        const float *gs[1] = { g };
        float *ps[1] = { p };
        for (int s = 0; s < 4; s++)
            gddr_step(c, gs, ps);
        for (int s = 0; s < 3 && k % 5 == 3; s++)
            if (gddr_step_submit(c, gs) == GDDR_OK)
                gddr_step_wait(c, ps);
        gddr_push(c, id, g, NULL);
        gddr_pull(c, id, p, 0, NULL);
    }
    free(p);
    free(g);
}

static void table(gddr_client *c)
{
    int tb = -1;
    if (gddr_table_register(c, "e", 4, NULL, &tb) != GDDR_OK)
        return;
    uint64_t keys[6] = { 1, 2, 2, 99, 1ull << 63, 7 };
    float rows[24], grads[24];
    for (int i = 0; i < 24; i++)
        grads[i] = 0.1f * (float)i;
    for (int s = 0; s < 3; s++) {
        gddr_pull_rows(c, tb, keys, 6, rows, (unsigned)(s & 1), 0, NULL);
        gddr_push_rows(c, tb, keys, 6, grads, NULL);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: client_driver ENDPOINT SECONDS\n");
        return 2;
    }
    time_t end = time(NULL) + atoi(argv[2]);
    int k = 0;
    for (; time(NULL) < end; k++) {
        gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
        o.server = argv[1];
        o.rank = 0;
        o.world_size = 1;
        o.timeout_ms = 100; /* the liar may not answer at all */
        o.reconnect_timeout_ms = 200;
        o.connect_timeout_ms = 200;
        o.delay_fraction = k % 3 == 1 ? 0.4 : 0;
        o.pull_delta_bits = k % 2 ? 8 : 0;
        o.delay_auto = k % 4 == 1;      /* with delay_fraction in k = 1, 13, 25, ... */
        o.pull_delta_auto = k % 4 == 3; /* with 8-bit pulls */
        o.heartbeat_ms = k % 5 == 2 ? 50 : 0;
        o.async_pipeline = k % 5 == 3;
        o.part_bytes = k % 3 == 2 ? 4096 : 4194304;
        o.log_level = GDDR_LOG_ERROR;
        gddr_client *c = NULL;
        if (gddr_client_open(&o, &c) != GDDR_OK)
            continue;
        tensors(c, k);
        table(c);
        gddr_client_close(&c);
    }
    printf("client_driver: %d rounds\n", k);
    return 0;
}
