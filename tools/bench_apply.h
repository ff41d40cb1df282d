/* bench_apply.h -- gddr-bench's apply section: gddr-ps's validation and
 * apply of one dense SGD push of `bytes`, four ways (the norm on one
 * thread or over the pool, in place, under copy on write, validated while
 * applied), with 1, 2 and all apply threads, against memcpy of the same
 * bytes in the same process (bench_apply.c). */
#ifndef GDDR_TOOLS_BENCH_APPLY_H
#define GDDR_TOOLS_BENCH_APPLY_H

#include <stddef.h>

/* Prints the table and the BENCH lines, each figure the median of reps (at
 * most 16) repetitions. */
void bench_apply_section(size_t bytes, int reps);

#endif
