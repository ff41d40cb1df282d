/* minimal.c -- the smallest trainer: fits w to 3.0 under the loss
 * 0.5 * |w - 3|^2 through a gddr-ps server. Built by scripts/test-install.sh
 * against an installed libgddr-client with exactly this command:
 *
 *   cc minimal.c $(pkg-config --cflags --libs gddr-client) -o minimal
 *   ./minimal tcp://127.0.0.1:5555
 */
#include <gddr/gddr.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = argc > 1 ? argv[1] : "tcp://127.0.0.1:5555";
    o.rank = 0;
    o.world_size = 1;
    gddr_client *c;
    int rc = gddr_client_open(&o, &c);
    if (rc != GDDR_OK) {
        fprintf(stderr, "open: %s\n", gddr_strerror(rc));
        return 1;
    }
    enum { N = 1000 };
    static float w[N], g[N];
    int id;
    if ((rc = gddr_register(c, "minimal.w", w, N, &id, NULL)) != GDDR_OK ||
        (rc = gddr_pull(c, id, w, 0, NULL)) != GDDR_OK) {
        fprintf(stderr, "register: %s\n", gddr_client_errmsg(c));
        return 1;
    }
    for (int step = 0; step < 100; step++) {
        for (int i = 0; i < N; i++)
            g[i] = w[i] - 3.0f;
        const float *grads[] = { g };
        float *params[] = { w };
        if ((rc = gddr_step(c, grads, params)) != GDDR_OK) {
            fprintf(stderr, "step: %s\n", gddr_client_errmsg(c));
            return 1;
        }
    }
    double err = 0;
    for (int i = 0; i < N; i++) {
        double d = w[i] > 3.0f ? w[i] - 3.0 : 3.0 - w[i];
        if (d > err)
            err = d;
    }
    printf("minimal: w[0] = %.6f, max |w - 3| = %.3g\n", (double)w[0], err);
    gddr_client_close(&c);
    return err < 1e-3 ? 0 : 1;
}
