/* gddr-ctl -- ask a running gddr-ps for its status or a checkpoint.
 *
 *   gddr-ctl [-s ENDPOINT] status        counters and staleness
 *   gddr-ctl [-s ENDPOINT] metrics       the Prometheus text
 *   gddr-ctl [-s ENDPOINT] checkpoint    write a checkpoint now
 *
 * For a server with CURVE, set GDDR_CURVE_SERVER_KEY (its public key) and
 * GDDR_CURVE_KEY_FILE (a key file whose public key is authorized).
 *
 * It talks to the server through libgddr-client with rank 0 and a world
 * of 0 workers, so it never changes what a sync step waits for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gddr/gddr.h"

int main(int argc, char **argv)
{
    const char *server = getenv("GDDR_SERVER");
    int i = 1;
    if (i + 1 < argc && (strcmp(argv[i], "-s") == 0 || strcmp(argv[i], "--server") == 0)) {
        server = argv[i + 1];
        i += 2;
    }
    if (i >= argc || !server) {
        fprintf(stderr, "usage: gddr-ctl [-s ENDPOINT] status|metrics|checkpoint\n"
                        "       (or set GDDR_SERVER=ENDPOINT)\n");
        return 2;
    }
    const char *cmd = argv[i];
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = server;
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 3000;
    o.observer = 1;
    /* A server with CURVE: its public key and our key file. */
    o.curve_server_key = getenv("GDDR_CURVE_SERVER_KEY");
    o.curve_key_file = getenv("GDDR_CURVE_KEY_FILE");
    gddr_client *c;
    int rc = gddr_client_open(&o, &c);
    if (rc != GDDR_OK) {
        fprintf(stderr, "gddr-ctl: cannot reach %s: %s\n", server, gddr_strerror(rc));
        return 1;
    }
    if (strcmp(cmd, "status") == 0) {
        gddr_server_stats s;
        gddr_server_info info;
        gddr_client_info(c, &info);
        rc = gddr_server_stats_get(c, &s);
        if (rc == GDDR_OK) {
            printf("epoch          %016llx\nmode           %s\nlive workers   %d\n"
                   "pushes         %llu\npulls          %llu\nrejected       %llu\n"
                   "updates        %llu\nstaleness      mean %.3f, ema %.3f, max %llu\ntau            %d\n",
                   (unsigned long long)s.epoch,
                   info.mode == GDDR_MODE_SYNC ? "sync" : info.mode == GDDR_MODE_SSP ? "ssp" : "async",
                   s.live_workers, (unsigned long long)s.pushes, (unsigned long long)s.pulls,
                   (unsigned long long)s.rejected, (unsigned long long)s.versions_total,
                   s.staleness_mean, s.staleness_ema, (unsigned long long)s.staleness_max, s.tau);
            printf("staleness hist");
            for (int b = 0; b < 17; b++)
                printf(" %llu", (unsigned long long)s.staleness_hist[b]);
            printf("\n");
        }
    } else if (strcmp(cmd, "metrics") == 0) {
        char *text = NULL;
        rc = gddr_server_metrics_text(c, &text);
        if (rc == GDDR_OK)
            fputs(text, stdout);
        free(text);
    } else if (strcmp(cmd, "checkpoint") == 0) {
        rc = gddr_request_checkpoint(c);
        if (rc == GDDR_OK)
            printf("checkpoint requested\n");
    } else {
        fprintf(stderr, "gddr-ctl: unknown command '%s'\n", cmd);
        gddr_client_close(&c);
        return 2;
    }
    if (rc != GDDR_OK)
        fprintf(stderr, "gddr-ctl: %s: %s\n", gddr_strerror(rc), gddr_client_errmsg(c));
    gddr_client_close(&c);
    return rc == GDDR_OK ? 0 : 1;
}
