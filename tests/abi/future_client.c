/* future_client.c -- a program built against a gddr.h newer than the
 * library: its gddr_client_opts has a field this libgddr-client does not
 * know (a struct that ends in one more). The library must refuse it, and
 * say why, rather than ignore an option the program set (docs/client.md,
 * "ABI"). Built against today's gddr.h. */
#include <gddr/gddr.h>

#include <stdio.h>
#include <string.h>

struct newer_opts {
    gddr_client_opts o;
    int option_of_the_future;
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: future_client ENDPOINT\n");
        return 2;
    }
    struct newer_opts n;
    int rc = gddr_client_opts_init_sized(&n.o, sizeof n);
    if (rc != GDDR_ENOTSUP || n.o.timeout_ms != 5000) {
        fprintf(stderr, "future_client: gddr_client_opts_init_sized of %zu bytes gave %d\n", sizeof n, rc);
        return 1;
    }
    n.o.server = argv[1];
    n.o.rank = 0;
    n.o.world_size = 1;
    n.option_of_the_future = 1;
    gddr_client *c = NULL;
    rc = gddr_client_open_sized(&n.o, sizeof n, &c);
    if (rc != GDDR_ENOTSUP || c || !strstr(gddr_opts_errmsg(), "upgrade")) {
        fprintf(stderr, "future_client: gddr_client_open_sized of %zu bytes gave %d (%s)\n", sizeof n, rc,
                gddr_opts_errmsg());
        return 1;
    }
    printf("future_client: a gddr_client_opts of %zu bytes (library: %zu) is refused with %s: %s\n",
           sizeof n, gddr_client_opts_size(), gddr_strerror(rc), gddr_opts_errmsg());
    /* The same program's own size opens. */
    if (gddr_client_open_sized(&n.o, sizeof n.o, &c) != GDDR_OK)
        return 1;
    gddr_client_close(&c);
    printf("future_client: the same options at sizeof(gddr_client_opts) open\n");
    return 0;
}
