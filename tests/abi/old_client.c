/* old_client.c -- a program built against the first gddr.h (tests/abi/v0/,
 * the public headers of commit ce729db, before gddr_client_opts could
 * grow) and run with today's libgddr-client: it calls the symbols of that
 * header, gddr_client_opts_init, gddr_client_open and gddr_client_open_ini,
 * with a struct of that header's size, and must train as it did.
 *
 *   old_client ENDPOINT INI
 *
 * The server runs sgd with lr 0.5 (tests/abi/run.sh starts it): one push of
 * a gradient of ones takes 0.5 off every value, exactly. INI is a file this
 * program writes: a [client] section naming ENDPOINT, opened as an
 * observer through gddr_client_open_ini, whose pull must see the push. */
#include "gddr.h" /* tests/abi/v0/gddr.h: the old layout, no sized macros */

#include <stdio.h>
#include <string.h>

#define N 8

static int check(int rc, const char *what)
{
    if (rc != GDDR_OK)
        fprintf(stderr, "old_client: %s: %s\n", what, gddr_strerror(rc));
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: old_client ENDPOINT INI\n");
        return 2;
    }
    gddr_client_opts o;
    memset(&o, 0xee, sizeof o);
    gddr_client_opts_init(&o); /* the old symbol fills the old struct, no more */
    if (o.timeout_ms != 5000 || o.rank != -1 || o.seed != 12345 || o.connect_timeout_ms != -1 ||
        o.server || o.log) {
        fprintf(stderr, "old_client: gddr_client_opts_init gave other defaults\n");
        return 1;
    }
    o.server = argv[1];
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 10000;
    o.reconnect_timeout_ms = 10000;
    o.connect_timeout_ms = 10000;
    gddr_client *c = NULL;
    float w[N], back[N], g[N];
    for (int i = 0; i < N; i++)
        w[i] = (float)i, g[i] = 1.0f;
    int id;
    uint64_t v0 = 0, v1 = 0;
    if (check(gddr_client_open(&o, &c), "gddr_client_open") ||
        check(gddr_register(c, "abi.w", w, N, &id, &v0), "gddr_register") ||
        check(gddr_pull(c, id, back, 0, NULL), "gddr_pull") ||
        check(gddr_push(c, id, g, &v1), "gddr_push"))
        return 1;
    for (int i = 0; i < N; i++)
        if (back[i] != w[i]) {
            fprintf(stderr, "old_client: pulled %g at %d, registered %g\n", back[i], i, w[i]);
            return 1;
        }
    /* A second client from an INI file with the old struct as overrides. */
    FILE *f = fopen(argv[2], "w");
    if (!f)
        return 1;
    fprintf(f, "[client]\nserver = %s\ntimeout_ms = 10000\n", argv[1]);
    fclose(f);
    gddr_client_opts ov;
    gddr_client_opts_init(&ov);
    ov.observer = 1;
    ov.rank = 0;
    ov.world_size = 1;
    gddr_client *obs = NULL;
    char err[512] = "";
    int oid;
    if (gddr_client_open_ini(argv[2], &ov, &obs, err, sizeof err) != GDDR_OK) {
        fprintf(stderr, "old_client: gddr_client_open_ini: %s\n", err);
        return 1;
    }
    if (check(gddr_register(obs, "abi.w", w, N, &oid, NULL), "gddr_register (observer)") ||
        check(gddr_pull(obs, oid, back, v1, NULL), "gddr_pull (observer)"))
        return 1;
    for (int i = 0; i < N; i++)
        if (back[i] != w[i] - 0.5f) {
            fprintf(stderr, "old_client: the server computed %g at %d, want %g\n", back[i], i, w[i] - 0.5f);
            return 1;
        }
    gddr_client_close(&obs);
    gddr_client_close(&c);
    printf("old_client: built against the first gddr.h (gddr_client_opts of %zu bytes): opened, "
           "registered, pushed (version %llu -> %llu) and pulled w - 0.5 exactly through an INI "
           "observer; closed\n", sizeof o, (unsigned long long)v0, (unsigned long long)v1);
    return c || obs ? 1 : 0;
}
