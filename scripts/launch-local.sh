#!/usr/bin/env bash
# launch-local.sh -- one model sharded over S gddr-ps, trained by W gddr-train
# workers, all on this host.
#
#   scripts/launch-local.sh [options] S W [gddr-train args...]
#   gddr-launch [options] S W [gddr-train args...]      (after make install)
#
#   --set KEY=VALUE   a gddr-ps setting for every server (repeatable); the
#                     default is workers=W
#   --result FILE     write the RESULT line of the servers' final model there
#   --keep            keep the scratch folder (logs, endpoint files, checkpoints)
#
# Server i runs with shard_index=i, shard_count=S on an OS-chosen loopback
# port (written to an endpoint file), checkpoints in the scratch folder. The
# workers get the endpoints joined by commas, in shard order, as --server.
# Then: progress, a summary per worker, `gddr-ctl status` over all servers,
# and the model the servers keep, evaluated by an observer. Everything
# started here is stopped on exit, Ctrl-C included.
set -euo pipefail
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
if [ -f "$here/lib.sh" ]; then
  # In the repository (scripts/launch-local.sh): the build's programs.
  cd "$here/.."
  # shellcheck source=scripts/lib.sh
  . scripts/lib.sh
  BIN=${GDDR_BIN:-build/bin}
  me=launch-local
else
  # Installed by `make install` as PREFIX/bin/gddr-launch, its helpers in
  # PREFIX/share/gddr/lib.sh: the programs next to it.
  # shellcheck source=scripts/lib.sh
  . "$here/../share/gddr/lib.sh"
  BIN=$here # (not GDDR_BIN: that names a build tree's programs, relative to it)
  me=gddr-launch
fi
export BIN
sets=() result='' keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --set) sets+=(--set "$2"); shift 2 ;;
    --result) result=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ && $2 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $me [--set KEY=VALUE]... [--result FILE] [--keep] SERVERS WORKERS [gddr-train args...]" >&2
  exit 2
fi
servers=$1 workers=$2
shift 2
train_args=("$@")
mapfile -t ev < <(eval_args "$@")

tmp=$(mktemp -d /tmp/gddr-launch.XXXXXX)
ps_pids=() pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do stop_pid "$p"; done
  for p in "${ps_pids[@]}"; do stop_pid "$p"; done
  if [ "$keep" = 1 ]; then echo "$me: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$(date +%s.%N)
for ((i = 0; i < servers; i++)); do
  mkdir -p "$tmp/ckpt$i"
  "$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/endpoint$i" \
    --set shard_index="$i" --set shard_count="$servers" --set checkpoint_dir="$tmp/ckpt$i" \
    --set workers="$workers" ${sets[@]+"${sets[@]}"} 2> "$tmp/server$i.log" &
  ps_pids+=($!)
done
eps=()
for ((i = 0; i < servers; i++)); do
  if ! wait_file "$tmp/endpoint$i" 10; then
    echo "$me: gddr-ps $i did not start:" >&2
    cat "$tmp/server$i.log" >&2
    exit 1
  fi
  eps+=("$(cat "$tmp/endpoint$i")")
done
EPS=$(IFS=,; echo "${eps[*]}")
echo "== $servers gddr-ps ($EPS); $workers workers: gddr-train ${train_args[*]}"

for ((r = 0; r < workers; r++)); do
  "$BIN/gddr-train" --server "$EPS" --rank "$r" --world "$workers" --progress 1 \
    ${train_args[@]+"${train_args[@]}"} > "$tmp/worker$r.log" 2>&1 &
  pids+=($!)
done
# Progress: the newest line of every worker, once a second.
fail=0
wait_workers "$me" "$tmp" 1 "${pids[@]}" || fail=1
pids=()
[ "$fail" = 0 ] || exit 1
elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")
"$BIN/gddr-ctl" -s "$EPS" status > "$tmp/status" 2>&1 || true
# What counts: the model the servers keep, after every worker flushed and left.
final=$(server_eval "$EPS" softmax ${ev[@]+"${ev[@]}"})
[ -z "$result" ] || echo "$final" > "$result"

echo
echo "== summary (per worker: the parameters it pulled after its last step)"
printf '%-6s %-10s %-7s %-14s %-14s %-10s\n' rank test_acc steps bytes_pushed bytes_pulled staleness
for ((r = 0; r < workers; r++)); do
  res=$(grep '^RESULT' "$tmp/worker$r.log" | tail -n 1)
  printf '%-6s %-10s %-7s %-14s %-14s %-10s\n' "$r" "$(field test_accuracy "$res")" \
    "$(field steps "$res")" "$(field bytes_pushed "$res")" "$(field bytes_pulled "$res")" \
    "$(field mean_staleness "$res")"
done
echo
sed 's/^/  servers: /' "$tmp/status"
echo "  wall time: ${elapsed} s"
echo
echo "== the servers' final model (version $(field version "$final")): test accuracy $(field test_accuracy "$final")"
