/* The CPU one gddr_step costs the client and the server, for
 * scripts/scalesim.py's constants (docs/scale.md). Built and run by
 * scripts/scale-measure.sh; not part of the build.
 *
 *   scale-measure ENDPOINT SERVER_PID N_FLOATS STEPS ALPHA DELTA_BITS
 *
 * One client, one tensor of N floats, STEPS timed gddr_step calls after 3
 * untimed ones. Prints one line: wall us per step, the calling thread's CPU
 * us per step (GDDR selection and packing, delta decode, copies), the whole
 * client process's CPU (with ZeroMQ's I/O thread) and the server process's
 * CPU (/proc/PID/stat: every thread), each the total over the timed steps
 * divided by STEPS.
 */
#define _GNU_SOURCE
#include <gddr/gddr.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double proc_cpu(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* fields after ")": state(3) ... utime(14) stime(15) */
    if (p)
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
    return (double)(ut + st) / sysconf(_SC_CLK_TCK);
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s ENDPOINT SERVER_PID N STEPS ALPHA DELTA_BITS\n", argv[0]);
        return 2;
    }
    int spid = atoi(argv[2]), steps = atoi(argv[4]);
    size_t n = strtoull(argv[3], NULL, 10);
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = argv[1];
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 120000;
    o.delay_fraction = atof(argv[5]);
    o.pull_delta_bits = atoi(argv[6]);
    gddr_client *c = NULL;
    if (gddr_client_open(&o, &c) != GDDR_OK)
        return 1;
    float *p = calloc(n, 4), *g0 = malloc(n * 4), *g1 = malloc(n * 4);
    srand(1);
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)rand() / RAND_MAX;
        g0[i] = ((float)rand() / RAND_MAX - 0.5f) * 1e-2f;
        g1[i] = ((float)rand() / RAND_MAX - 0.5f) * 1e-2f;
    }
    int id, rc;
    char key[64];
    snprintf(key, sizeof key, "w%zu-%s-%s", n, argv[5], argv[6]); /* one tensor per setting */
    if ((rc = gddr_register(c, key, p, n, &id, NULL)) != GDDR_OK) {
        fprintf(stderr, "register: %s\n", gddr_strerror(rc));
        return 1;
    }
    float *params[1] = { p };
    for (int s = 0; s < 3; s++) {
        const float *g[1] = { s & 1 ? g1 : g0 };
        if (gddr_step(c, g, params) != GDDR_OK)
            return 1;
    }
    double w0 = now(CLOCK_MONOTONIC), t0 = now(CLOCK_THREAD_CPUTIME_ID),
           c0 = now(CLOCK_PROCESS_CPUTIME_ID), s0 = proc_cpu(spid);
    for (int s = 0; s < steps; s++) {
        const float *g[1] = { s & 1 ? g1 : g0 };
        if (gddr_step(c, g, params) != GDDR_OK)
            return 1;
    }
    double w = now(CLOCK_MONOTONIC) - w0, t = now(CLOCK_THREAD_CPUTIME_ID) - t0,
           cp = now(CLOCK_PROCESS_CPUTIME_ID) - c0, sv = proc_cpu(spid) - s0;
    printf("SCALE n=%zu alpha=%s bits=%s wall_us=%.1f thread_cpu_us=%.1f client_cpu_us=%.1f "
           "server_cpu_us=%.1f\n",
           n, argv[5], argv[6], w / steps * 1e6, t / steps * 1e6, cp / steps * 1e6,
           sv / steps * 1e6);
    gddr_client_close(&c);
    return 0;
}
