#!/usr/bin/env bash
# The main job: one gddr-ps and 4 gddr-train workers train softmax
# regression on Fashion-MNIST in async mode, then a summary table.
#
#   scripts/demo.sh [--workers N] [--workload softmax|mlp] [--epochs E] [--mode async|sync|ssp]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
workers=4 workload=softmax epochs=10 mode=async lr=0.1
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --workload) workload=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    *) echo "demo: unknown option $1" >&2; exit 2 ;;
  esac
done
data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
  echo "demo: Fashion-MNIST is missing: run scripts/install-deps.sh (package dataset-fashion-mnist)" >&2
  exit 1
fi
tmp=$(mktemp -d /tmp/gddr-demo.XXXXXX)
server_pid=
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

start=$(date +%s.%N)
"$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/endpoint" \
  --set mode="$mode" --set lr="$lr" --set workers="$workers" 2> "$tmp/server.log" &
server_pid=$!
for _ in $(seq 100); do [ -s "$tmp/endpoint" ] && break; sleep 0.1; done
[ -s "$tmp/endpoint" ] || { echo "demo: gddr-ps did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }
ep=$(cat "$tmp/endpoint")
echo "== gddr-ps on $ep (mode $mode, lr $lr); $workers workers, $workload, $epochs epochs each"

pids=()
for ((r = 0; r < workers; r++)); do
  "$BIN/gddr-train" --server "$ep" --rank "$r" --world "$workers" --workload "$workload" \
    --epochs "$epochs" --progress 1 > "$tmp/worker$r.log" 2>&1 &
  pids+=($!)
done
# Progress: the newest line of every worker, once a second.
while :; do
  running=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=1; done
  [ "$running" = 1 ] || break
  sleep 1
  for ((r = 0; r < workers; r++)); do
    line=$(grep -E '^\[rank' "$tmp/worker$r.log" | tail -n 1 || true)
    [ -n "$line" ] && echo "  $line"
  done
done
fail=0
for ((r = 0; r < workers; r++)); do
  wait "${pids[$r]}" || { echo "demo: worker $r failed:" >&2; tail -n 20 "$tmp/worker$r.log" >&2; fail=1; }
done
[ "$fail" = 0 ] || exit 1
elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")
"$BIN/gddr-ctl" -s "$ep" status > "$tmp/status" 2>&1 || true
# What counts: the model the server keeps, after every worker flushed and left.
final=$(server_eval "$ep" "$workload")

echo
echo "== summary (per worker: the parameters it pulled after its last step)"
printf '%-6s %-10s %-7s %-14s %-14s %-10s\n' rank test_acc steps bytes_pushed bytes_pulled staleness
for ((r = 0; r < workers; r++)); do
  res=$(grep '^RESULT' "$tmp/worker$r.log")
  acc=$(field test_accuracy "$res")
  printf '%-6s %-10s %-7s %-14s %-14s %-10s\n' "$r" "$acc" "$(field steps "$res")" \
    "$(field bytes_pushed "$res")" "$(field bytes_pulled "$res")" "$(field mean_staleness "$res")"
done
server_acc=$(field test_accuracy "$final")
echo
sed 's/^/  server: /' "$tmp/status"
echo "  wall time: ${elapsed} s"
echo
echo "== the server's final model (version $(field version "$final")): test accuracy $server_acc"
if awk -v m="$server_acc" 'BEGIN { exit !(m + 0 >= 0.80) }'; then
  echo "demo: OK, the model gddr-ps keeps scores $server_acc on the 10,000 test images (>= 0.80)"
else
  echo "demo: FAILED, the server's final model scores $server_acc < 0.80" >&2
  exit 1
fi
