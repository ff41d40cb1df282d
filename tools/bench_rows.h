/* bench_rows.h -- gddr-bench's rows section: gddr_pull_rows +
 * gddr_push_rows of n random keys x dim floats against gddr-ps, beside
 * ps-lite's key-value exchange over bare ZeroMQ (bench_kv_server), with
 * 1 and several clients, and a check of the values every run pulls. */
#ifndef GDDR_TOOLS_BENCH_ROWS_H
#define GDDR_TOOLS_BENCH_ROWS_H

#include <stddef.h>
#include <stdint.h>

typedef struct bench_rows_cfg {
    const size_t *keys;      /* keys per call (n), nkeys of them */
    int nkeys;
    const uint32_t *dims;    /* floats per row, ndims of them */
    int ndims;
    const int *clients;      /* concurrent clients, ncl of them */
    int ncl;
    int reps;                /* repetitions per figure (median) */
    double budget_mb;        /* value bytes moved per figure and repetition */
} bench_rows_cfg;

/* Runs the section: starts gddr-ps and the key-value server (this binary
 * with --kv-server), prints the table and the BENCH lines. Exits (1) when a
 * pulled value is not what the pushes made it. */
void bench_rows_section(const bench_rows_cfg *cfg);

/* The bare key-value server: binds a ROUTER on 127.0.0.1, writes its
 * endpoint to `file`, serves until killed (see bench_rows.c). Returns 1
 * when it cannot start. */
int bench_kv_server(const char *file);

#endif
