#!/usr/bin/env bash
# The Python job: one gddr-ps and W workers of python/examples/fashion_mnist.py
# (a PyTorch CNN through the gddr package) train Fashion-MNIST, then the
# server's final model is scored by an observer and a summary table printed.
#
#   scripts/demo-python.sh [--workers N] [--epochs E] [--mode async|sync|ssp]
#                          [--lr X] [--momentum M] [--delay-fraction A] [--min-accuracy X]
#                          [-- extra fashion_mnist.py arguments]
#
# e.g. `-- --seed 2 --pull-delta-bits 8`, or the server running Adam with a
# cosine lr schedule: `-- --optimizer "adam lr=0.001" --lr-schedule cosine`
# (--lr and --momentum then only set the server's default section).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
PY=/usr/bin/python3   # Debian's: it has python3-numpy and python3-torch
workers=4 epochs=3 mode=sync lr=0.05 momentum=0.9 alpha=0 min_acc=0.89
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --momentum) momentum=$2; shift 2 ;;
    --delay-fraction) alpha=$2; shift 2 ;;
    --min-accuracy) min_acc=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "demo-python: unknown option $1" >&2; exit 2 ;;
  esac
done
if ! "$PY" -c 'import numpy, torch' 2>/dev/null; then
  echo "demo-python: $PY cannot import numpy and torch: run scripts/install-deps.sh" >&2
  exit 1
fi
tmp=$(mktemp -d /tmp/gddr-demo-python.XXXXXX)
server_pid=
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  stop_server
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

start=$(date +%s.%N)
"$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/endpoint" \
  --set mode="$mode" --set lr="$lr" --set momentum="$momentum" --set workers="$workers" \
  2> "$tmp/server.log" &
server_pid=$!
for _ in $(seq 100); do [ -s "$tmp/endpoint" ] && break; sleep 0.1; done
[ -s "$tmp/endpoint" ] || { echo "demo-python: gddr-ps did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }
ep=$(cat "$tmp/endpoint")
echo "== gddr-ps on $ep (mode $mode, lr $lr, momentum $momentum); $workers Python workers," \
     "CNN, $epochs epochs each, delay_fraction $alpha"

for ((r = 0; r < workers; r++)); do
  "$PY" python/examples/fashion_mnist.py --server "$ep" --rank "$r" --world "$workers" \
    --epochs "$epochs" --delay-fraction "$alpha" --progress 5 ${extra[@]+"${extra[@]}"} \
    > "$tmp/worker$r.log" 2>&1 &
  pids+=($!)
done
# Progress: the newest line of every worker, every 5 s.
fail=0
wait_workers demo-python "$tmp" 5 "${pids[@]}" || fail=1
pids=()
[ "$fail" = 0 ] || exit 1
elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")
"$BIN/gddr-ctl" -s "$ep" status > "$tmp/status" 2>&1 || true
# What counts: the model the server keeps, after every worker flushed and left.
final=$("$PY" python/examples/fashion_mnist.py --server "$ep" --evaluate ${extra[@]+"${extra[@]}"} 2>&1 |
        grep '^RESULT' | tail -n 1 || true)
if [ -z "$final" ]; then
  final="RESULT server_model=1 test_accuracy=? version=?"
  # Say why: a server that exited (status, signal) or one that hangs, and
  # its log, before cleanup removes it. Kept in $GDDR_DEMO_KEEP if set.
  if kill -0 "$server_pid" 2>/dev/null; then
    echo "demo-python: the evaluation got no answer; gddr-ps (pid $server_pid) is still running" >&2
  else
    st=0; wait "$server_pid" || st=$?
    echo "demo-python: the evaluation got no answer; gddr-ps exited with status $st" \
         "$( [ "$st" -gt 128 ] && echo "(signal $((st - 128)))")" >&2
    server_pid=
  fi
  echo "demo-python: the end of the server's log:" >&2
  tail -n 30 "$tmp/server.log" | sed 's/^/  /' >&2
  [ -z "${GDDR_DEMO_KEEP:-}" ] || cp -r "$tmp" "$GDDR_DEMO_KEEP"
fi

echo
echo "== summary (per worker: the parameters it pulled after its last step)"
printf '%-6s %-10s %-7s %-14s %-14s %-10s %-8s\n' rank test_acc steps bytes_pushed bytes_pulled staleness train_s
sum_push=0 sum_pull=0
for ((r = 0; r < workers; r++)); do
  res=$(grep '^RESULT' "$tmp/worker$r.log")
  printf '%-6s %-10s %-7s %-14s %-14s %-10s %-8s\n' "$r" "$(field test_accuracy "$res")" \
    "$(field steps "$res")" "$(field bytes_pushed "$res")" "$(field bytes_pulled "$res")" \
    "$(field mean_staleness "$res")" "$(field train_seconds "$res")"
  sum_push=$((sum_push + $(field bytes_pushed "$res")))
  sum_pull=$((sum_pull + $(field bytes_pulled "$res")))
done
server_acc=$(field test_accuracy "$final")
echo
sed 's/^/  server: /' "$tmp/status"
echo "  wall time: ${elapsed} s (server start to the last worker's exit)"
echo "  bytes pushed (all workers): $sum_push; bytes pulled: $sum_pull"
echo
echo "== the server's final model (version $(field version "$final")): test accuracy $server_acc"
if awk -v m="$server_acc" -v t="$min_acc" 'BEGIN { exit !(m + 0 >= t + 0) }'; then
  echo "demo-python: OK, the model gddr-ps keeps scores $server_acc on the test images (>= $min_acc)"
else
  echo "demo-python: FAILED, the server's final model scores $server_acc < $min_acc" >&2
  exit 1
fi
