/* bench_proc.h -- what the sections of gddr-bench share: the clock, the
 * median, and the servers they start (gddr-ps from the folder of the
 * binary, or the binary itself in a server role), each a separate process
 * that writes its endpoint into a file once it listens. */
#ifndef GDDR_TOOLS_BENCH_PROC_H
#define GDDR_TOOLS_BENCH_PROC_H

#include <sys/types.h>

/* The binary's own path and folder, and the endpoint file the servers
 * write (bench_proc_init fills them). */
extern char bench_self[4096], bench_bin_dir[4096], bench_epfile[256];
/* The CPU every server bench_spawn starts is bound to (--server-cpu), or -1. */
extern int bench_server_cpu;

void bench_proc_init(void);
double bench_now(void);
/* Sorts v and returns its median. */
double bench_median(double *v, int n);
/* Prints "gddr-bench: " + fmt(arg) and exits 1. */
void bench_die(const char *fmt, const char *arg) __attribute__((noreturn));

typedef struct bench_proc {
    pid_t pid;
    char endpoint[256];
} bench_proc;

/* Runs argv (argv[0] a path), waits for it to write its endpoint into
 * bench_epfile; the child dies with this process. */
void bench_spawn(bench_proc *p, char *const argv[]);
/* SIGTERM, then SIGKILL after 10 s; no-op when not started. */
void bench_stop(bench_proc *p);
/* A gddr-ps with `threads` apply threads, shard `index` of `count`, lr 0,
 * plus `extra` (one more "--set KEY=VALUE", or NULL). */
void bench_start_shard(bench_proc *p, int threads, int index, int count, const char *extra);
/* Seconds to write `bytes` to a fresh file in dir and fdatasync it (the
 * disk's ceiling for the push log); NaN when it cannot. */
double bench_disk_write_sync(const char *dir, size_t bytes);
/* The same with any number of KEY=VALUE settings (NULL-terminated, may be NULL). */
void bench_start_sets(bench_proc *p, int threads, int index, int count, const char *const *extra);

/* The raw ZeroMQ server (bench_raw.c): this binary run with --raw-server,
 * or with --raw-apply-server when apply is set (it also validates and
 * applies each push: raw_server). */
void bench_start_raw(bench_proc *p, int apply);

/* A libgddr-client connection to ep as rank of world (GDDR alpha, delta
 * pulls of qbits, 0 for none, pull_delta_auto on with BENCH_PULL_AUTO and
 * delay_auto with BENCH_DELAY_AUTO in autos; waits of 120 s); exits when
 * it cannot. */
typedef struct gddr_client gddr_client;
enum { BENCH_PULL_AUTO = 1, BENCH_DELAY_AUTO = 2 };
gddr_client *bench_connect(const char *ep, int rank, int world, double alpha, int qbits, int autos);
/* The level (GDDR_LOG_*) at which bench_connect's clients log to stderr
 * (gddr-bench --log); -1, the default: silent. */
extern int bench_client_log;

/* Apply-thread counts to try: 1, 2 and all cores (when more than 2);
 * returns how many. */
int bench_thread_counts(int threads[3]);
/* "64 KiB", "1 MiB": bytes for people, written into buf. */
const char *bench_human(size_t bytes, char *buf, size_t len);

#endif
