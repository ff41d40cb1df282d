/* bench_proc.c -- see bench_proc.h. */
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#include "bench_proc.h"

#include "gddr/gddr.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char bench_self[4096], bench_bin_dir[4096], bench_epfile[256];
int bench_server_cpu = -1;

void bench_proc_init(void)
{
    ssize_t l = readlink("/proc/self/exe", bench_self, sizeof bench_self - 1);
    if (l <= 0)
        bench_die("cannot find myself: %s", strerror(errno));
    bench_self[l] = 0;
    snprintf(bench_bin_dir, sizeof bench_bin_dir, "%s", bench_self);
    *strrchr(bench_bin_dir, '/') = 0;
    snprintf(bench_epfile, sizeof bench_epfile, "/tmp/gddr-bench-%d.ep", (int)getpid());
}

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void bench_die(const char *fmt, const char *arg)
{
    fprintf(stderr, "gddr-bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(1);
}

void bench_spawn(bench_proc *p, char *const argv[])
{
    unlink(bench_epfile);
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        bench_die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (bench_server_cpu >= 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(bench_server_cpu, &set);
            if (sched_setaffinity(0, sizeof set, &set) != 0)
                _exit(126);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    p->pid = pid;
    for (int i = 0; i < 2000; i++) {
        FILE *f = fopen(bench_epfile, "r");
        if (f) {
            char line[256] = "";
            char *ok = fgets(line, sizeof line, f);
            fclose(f);
            line[strcspn(line, "\r\n")] = 0;
            if (ok && line[0]) {
                snprintf(p->endpoint, sizeof p->endpoint, "%s", line);
                unlink(bench_epfile);
                return;
            }
        }
        usleep(5000);
    }
    bench_die("%s did not start", argv[0]);
}

void bench_stop(bench_proc *p)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGTERM);
    for (int i = 0; i < 1000; i++) {
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            return;
        }
        usleep(10000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

void bench_start_shard(bench_proc *p, int threads, int index, int count, const char *extra)
{
    const char *sets[] = { extra, NULL };
    bench_start_sets(p, threads, index, count, sets);
}

void bench_start_sets(bench_proc *p, int threads, int index, int count, const char *const *extra)
{
    char bin[4200], th[64], si[64], sc[64];
    snprintf(bin, sizeof bin, "%s/gddr-ps", bench_bin_dir);
    snprintf(th, sizeof th, "threads=%d", threads);
    snprintf(si, sizeof si, "shard_index=%d", index);
    snprintf(sc, sizeof sc, "shard_count=%d", count);
    char *argv[40] = { bin, "--listen", "tcp://127.0.0.1:*", "--endpoint-file", bench_epfile, "--set",
                       "log_level=error", "--set", th, "--set", "lr=0", "--set", si, "--set", sc };
    int a = 15;
    for (int i = 0; extra && extra[i] && a < 37; i++) {
        argv[a++] = "--set";
        argv[a++] = (char *)extra[i];
    }
    argv[a] = NULL;
    bench_spawn(p, argv);
}

/* Seconds to write `bytes` to a fresh file in dir and fdatasync it: the
 * disk's ceiling for the push log, measured in the same run. */
double bench_disk_write_sync(const char *dir, size_t bytes)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/bench-disk", dir);
    char *b = malloc(bytes);
    if (!b)
        return NAN;
    memset(b, 7, bytes);
    double t0 = bench_now();
    FILE *f = fopen(path, "w");
    if (!f) {
        free(b);
        return NAN;
    }
    fwrite(b, 1, bytes, f);
    fflush(f);
    fdatasync(fileno(f));
    fclose(f);
    double dt = bench_now() - t0;
    unlink(path);
    free(b);
    return dt;
}

int bench_client_log = -1;

/* The clients' log lines, when --log asks for them: one per line on
 * stderr, with the client's rank (user). */
static void client_log(void *user, int level, const char *msg)
{
    static const char *names[] = { "error", "warn", "info", "debug" };
    fprintf(stderr, "gddr-bench: client %d [%s] %s\n", (int)(intptr_t)user, names[level < 0 ? 0 : level > 3 ? 3 : level],
            msg);
}

gddr_client *bench_connect(const char *ep, int rank, int world, double alpha, int qbits, int autos)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    if (bench_client_log >= 0) {
        o.log = client_log;
        o.log_user = (void *)(intptr_t)rank;
        o.log_level = bench_client_log;
    }
    o.pull_delta_bits = qbits;
    o.pull_delta_auto = (autos & BENCH_PULL_AUTO) != 0;
    o.delay_auto = (autos & BENCH_DELAY_AUTO) != 0;
    o.server = ep;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = 120000;
    o.delay_fraction = alpha;
    gddr_client *c = NULL;
    int rc = gddr_client_open(&o, &c);
    if (rc != GDDR_OK)
        bench_die("cannot open a client: %s", gddr_strerror(rc));
    return c;
}

void bench_start_raw(bench_proc *p, int apply)
{
    char *argv[] = { bench_self, apply ? "--raw-apply-server" : "--raw-server", bench_epfile, NULL };
    bench_spawn(p, argv);
}

int bench_thread_counts(int threads[3])
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads[0] = 1;
    threads[1] = 2;
    threads[2] = (int)(cores < 1 ? 1 : cores);
    return threads[2] > 2 ? 3 : 2;
}

const char *bench_human(size_t bytes, char *buf, size_t len)
{
    if (bytes >= (1u << 20))
        snprintf(buf, len, "%zu MiB", bytes >> 20);
    else
        snprintf(buf, len, "%zu KiB", bytes >> 10);
    return buf;
}
