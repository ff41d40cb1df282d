#!/usr/bin/env bash
# The seed document's 1-D experiment (its "Python 演示") through the real
# stack: f(w) = 0.5 (w - 5)^2, w0 = 0, lr = 0.4, 200 steps, one worker.
# Each row starts its own gddr-ps and runs one
#   gddr-train --workload quadratic [--simulate-staleness 5] [...]
# against it, then prints the seed's table: final w and loss, where the
# seed's loss is (w - 5)^2 (not f(w)). The last column is what the seed's
# Python prints, for comparison.
#
#   scripts/seed-table.sh            the table
#   GDDR_BIN=DIR scripts/seed-table.sh
#
# Rows (server settings / trainer flags):
#   sync (delay 0)       mode=sync                   -
#   async (delay 5)      mode=async                  --simulate-staleness 5
#   async + compensation mode=async                  --simulate-staleness 5 --dc-mode identity --dc-lambda 1
#   async + adaptive lr  mode=async adadelay=0.5     --simulate-staleness 5
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
for p in gddr-ps gddr-train; do
  [ -x "$BIN/$p" ] || { echo "seed-table: $BIN/$p is missing (run make)" >&2; exit 1; }
done

tmp=$(mktemp -d /tmp/gddr-seed.XXXXXX)
server_pid=
cleanup() { stop_server; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

# run NAME SEED_W "SERVER SETTINGS" TRAINER FLAGS...
run() {
  local name=$1 seed_w=$2 sets=$3
  shift 3
  local args=() s
  for s in $sets; do args+=(--set "$s"); done
  rm -f "$tmp/endpoint"
  "$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/endpoint" \
    --set log_level=warn --set lr=0.4 --set workers=1 "${args[@]}" 2> "$tmp/server.log" &
  server_pid=$!
  for _ in $(seq 100); do [ -s "$tmp/endpoint" ] && break; sleep 0.05; done
  [ -s "$tmp/endpoint" ] || { echo "seed-table: gddr-ps did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }
  local ep out w
  ep=$(cat "$tmp/endpoint")
  if ! out=$("$BIN/gddr-train" --server "$ep" --rank 0 --world 1 --workload quadratic \
               --steps 200 --quiet --timeout-ms 5000 "$@" 2> "$tmp/train.log"); then
    echo "seed-table: gddr-train failed for '$name':" >&2
    cat "$tmp/train.log" >&2
    exit 1
  fi
  stop_server
  w=$(sed -n 's/^RESULT.* w=\([^ ]*\).*/\1/p' <<< "$out")
  [ -n "$w" ] || { echo "seed-table: no RESULT w= for '$name': $out" >&2; exit 1; }
  awk -v n="$name" -v w="$w" -v sw="$seed_w" \
    'BEGIN { printf "%-22s %14.3f  %16.4f  %14.3f\n", n, w, (w - 5) * (w - 5), sw }'
}

printf '%-22s %14s  %16s  %14s\n' "config" "final w" "loss (w-5)^2" "seed Python w"
run "sync (delay 0)"        5.000     "mode=sync"
run "async (delay 5)"       -43876.484 "mode=async" --simulate-staleness 5
run "async + compensation"  5.000     "mode=async" --simulate-staleness 5 --dc-mode identity --dc-lambda 1
run "async + adaptive lr"   5.000     "mode=async adadelay=0.5" --simulate-staleness 5
