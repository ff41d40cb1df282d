#!/usr/bin/env bash
# make bench: the data-path benchmark (gddr-bench: push+pull against bare
# ZeroMQ, concurrent clients, dense vs GDDR steps, apply and validation
# against memcpy, server threads, one server vs two, and the sparse rows
# against a bare ZeroMQ key-value server), then the CUDA kernels against device
# memcpy when a GPU is there. Tables for people on stdout, one
# "BENCH ..." line per row on stderr; docs/performance.md has the figures.
#
#   scripts/bench.sh            the full set (about 2 minutes on 2 cores)
#   scripts/bench.sh --quick    seconds
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GDDR_BIN:-build/bin}
[ -x "$BIN/gddr-bench" ] || { echo "bench: $BIN/gddr-bench is missing (run make)" >&2; exit 1; }
"$BIN/gddr-bench" "$@"
if [ -x "$BIN/bench_kernels" ]; then
  echo
  echo "## CUDA kernels against their CPU twins (bench_kernels)"
  "$BIN/bench_kernels" 1 16 64 || true
fi
