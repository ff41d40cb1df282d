/* bench_gap.h -- gddr-bench's gap section: one push's cost by what its
 * connection did just before (another push, 1 ms of idle, a pull), gddr-ps
 * against bare ZeroMQ in the same run (bench_gap.c). */
#ifndef GDDR_TOOLS_BENCH_GAP_H
#define GDDR_TOOLS_BENCH_GAP_H

#include <stddef.h>

/* Starts gddr-ps and the raw server, prints the table and the BENCH lines:
 * `reps` repetitions of `iters` pushes of `bytes` per case. */
void bench_gap_section(size_t bytes, int reps, int iters);

#endif
