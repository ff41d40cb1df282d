#!/usr/bin/env bash
# experiment-recovery.sh -- what a crash costs, measured (docs/design.md
# section 7, docs/operations.md "What a crash can lose").
#
#   scripts/experiment-recovery.sh [--workers N] [--epochs E] [--synthetic N]
#                                  [--ckpt-interval S] [--no-append]
#
# One gddr-ps and N gddr-train workers (MLP, Fashion-MNIST when it is
# installed, else --synthetic data), async, GDDR delay_fraction 0.5, run
# five times with the same seeds:
#
#   baseline      uninterrupted
#   baseline-2    uninterrupted again: the spread between two identical async
#                 runs is the noise floor of every delta below
#   worker-kill   the last rank is killed with SIGKILL a fifth of the way in;
#                 residual snapshots every 10 steps, so its residual is handed
#                 to a survivor (the recovery timeline is measured here)
#   worker-kill-  the same kill with a residual snapshot on every push
#    every-step
#   worker-kill-  the same kill without residual snapshots: what the dead
#    norecovery   worker held is simply lost
#   server-kill   gddr-ps is killed with SIGKILL a fifth of the way in and
#                 restarted 1 s later on the same endpoint from its
#                 checkpoint_dir (checkpoint_interval_s --ckpt-interval, 5 s)
#
# Every other setting is the default: worker_timeout_s 10, replay_decay 0.5
# (8 installments), reconnect_timeout_ms 30000. The dead worker is not
# restarted, so its remaining steps are never computed: the accuracy delta of
# a worker kill includes that lost compute, not just the lost residual.
#
# Prints a table and appends a "Crash safety" section to docs/results.md
# (re-read and appended to only, never rewritten: other scripts add their
# own sections to that file).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
workers=4 epochs=20 synthetic=0 ckpt_interval=5 append=1
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --synthetic) synthetic=$2; shift 2 ;;
    --ckpt-interval) ckpt_interval=$2; shift 2 ;;
    --no-append) append=0; shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "experiment-recovery: unknown option $1" >&2; exit 2 ;;
  esac
done
for p in gddr-ps gddr-train gddr-ctl; do
  [ -x "$BIN/$p" ] || { echo "experiment-recovery: $BIN/$p is missing (run make)" >&2; exit 1; }
done
data_args=()
data_name="Fashion-MNIST"
if [ "$synthetic" -gt 0 ]; then
  data_args=(--synthetic "$synthetic"); data_name="synthetic data ($synthetic examples)"
elif [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  data_args=(--synthetic 20000); data_name="synthetic data (20000 examples; Fashion-MNIST is not installed)"
fi
victim=$((workers - 1))

tmp=$(mktemp -d /tmp/gddr-recovery.XXXXXX)
server_pid=
pids=()
stop_all() {
  for p in "${pids[@]}" ${server_pid:+"$server_pid"}; do
    kill -KILL "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
cleanup() { stop_all; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

# Seconds since midnight, from "HH:MM:SS.mmm" (server log) or now.
sod() { awk -F: '{ printf "%.3f", $1 * 3600 + $2 * 60 + $3 }' <<< "$1"; }
now_sod() { sod "$(date +%H:%M:%S.%N)"; }
log_time() { grep -m1 -F "$2" "$1" | cut -d' ' -f1; }

# start_server LOG [--listen EP] [--set K=V]...: sets server_pid, ep
start_server() {
  local log=$1; shift
  rm -f "$tmp/endpoint"
  "$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/endpoint" \
    --set log_level=info --set mode=async --set workers="$workers" "$@" 2>> "$log" &
  server_pid=$!
  for _ in $(seq 100); do [ -s "$tmp/endpoint" ] && break; sleep 0.1; done
  [ -s "$tmp/endpoint" ] || { echo "experiment-recovery: gddr-ps did not start:" >&2; cat "$log" >&2; exit 1; }
  ep=$(cat "$tmp/endpoint")
}

stop_server() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=
}

# start_workers NAME EXTRA_FLAGS...
start_workers() {
  local name=$1; shift
  pids=()
  for ((r = 0; r < workers; r++)); do
    "$BIN/gddr-train" --server "$ep" --rank "$r" --world "$workers" --workload mlp \
      "${data_args[@]}" --epochs "$epochs" --seed 1 --delay-fraction 0.5 --progress 0.5 \
      --verbose "$@" > "$tmp/$name.w$r.out" 2> "$tmp/$name.w$r.err" &
    pids+=($!)
  done
}

# wait_fifth NAME RANK: until that rank printed a progress line a fifth of
# the way through its steps (early enough that the survivors still train
# when the death is declared worker_timeout_s later).
wait_fifth() {
  local name=$1 r=$2 line s total
  for _ in $(seq 1200); do
    line=$(grep -E '^\[rank [0-9]+\] step ' "$tmp/$name.w$r.out" | tail -n 1 || true)
    if [ -n "$line" ]; then
      s=$(sed -n 's/.* step \([0-9]*\)\/\([0-9]*\) .*/\1/p' <<< "$line")
      total=$(sed -n 's/.* step \([0-9]*\)\/\([0-9]*\) .*/\2/p' <<< "$line")
      [ "$s" -ge $((total / 5)) ] && { echo "$s/$total"; return 0; }
    fi
    sleep 0.1
  done
  echo "experiment-recovery: $name rank $r made no progress" >&2
  exit 1
}

# wait_workers NAME [SKIP_RANK]: waits, insists they exited 0 (except SKIP).
wait_workers() {
  local name=$1 skip=${2:--1}
  for ((r = 0; r < workers; r++)); do
    if [ "$r" = "$skip" ]; then wait "${pids[$r]}" 2>/dev/null || true; continue; fi
    wait "${pids[$r]}" || { echo "experiment-recovery: $name rank $r failed:" >&2; tail -n 20 "$tmp/$name.w$r.err" >&2; exit 1; }
  done
  pids=()
}

# mean_acc NAME [SKIP_RANK]: mean test_accuracy and train_loss of the ranks that finished.
mean_of() {
  local name=$1 key=$2 skip=${3:--1} vals=()
  for ((r = 0; r < workers; r++)); do
    [ "$r" = "$skip" ] && continue
    vals+=("$(field "$key" "$(grep '^RESULT' "$tmp/$name.w$r.out")")")
  done
  printf '%s\n' "${vals[@]}" | awk '{ s += $1; n++ } END { printf "%.4f", s / n }'
}

declare -A ACC LOSS NOTE SACC HELD HANDED
# The accuracy of the model the server keeps once the workers are done.
server_acc() { field test_accuracy "$(server_eval "$ep" mlp "${data_args[@]}")"; }
run_plain() { # NAME
  local name=$1 t0
  t0=$(date +%s)
  start_server "$tmp/$name.ps.log"
  start_workers "$name"
  wait_workers "$name"
  SACC[$name]=$(server_acc)
  stop_server
  ACC[$name]=$(mean_of "$name" test_accuracy)
  LOSS[$name]=$(mean_of "$name" train_loss)
  NOTE[$name]="$(( $(date +%s) - t0 )) s"
  echo "  $name: accuracy ${ACC[$name]}, train_loss ${LOSS[$name]} (${NOTE[$name]})"
}

run_worker_kill() { # NAME RESIDUAL_CHECKPOINT_STEPS
  local name=$1 every=$2 at t_kill log
  log="$tmp/$name.ps.log"
  start_server "$log"
  start_workers "$name" --residual-checkpoint-steps "$every"
  at=$(wait_fifth "$name" "$victim")
  t_kill=$(now_sod)
  kill -KILL "${pids[$victim]}"
  wait "${pids[$victim]}" 2> /dev/null || true
  wait_workers "$name" "$victim"
  SACC[$name]=$(server_acc)
  stop_server
  ACC[$name]=$(mean_of "$name" test_accuracy "$victim")
  LOSS[$name]=$(mean_of "$name" train_loss "$victim")
  local t_dead t_handed reinject n_orphan
  if ! grep -qF "worker $victim declared dead" "$log"; then
    echo "experiment-recovery: $name: the survivors finished before rank $victim was declared dead; raise --epochs" >&2
    exit 1
  fi
  t_dead=$(sod "$(log_time "$log" "worker $victim declared dead")")
  detect=$(awk -v a="$t_dead" -v b="$t_kill" 'BEGIN { printf "%.2f", a - b }')
  n_orphan=$(grep -c "orphan of rank $victim (tensor '" "$log" || true)
  # What it held (its last pushes said so) against what its snapshots handed over.
  local held_l1 handed_l1 mass
  held_l1=$({ grep -F "worker $victim held residual" "$log" || true; } | sed -n 's/.*held residual |.|_1 \([0-9.e+-]*\) in.*/\1/p' |
    awk '{ s += $1 } END { printf "%.4g", s }')
  handed_l1=$({ grep -F "worker $victim held residual" "$log" || true; } | sed -n 's/.*hands over \([0-9.e+-]*\) (.*/\1/p' |
    awk '{ s += $1 } END { printf "%.4g", s }')
  mass="residual |.|_1 held ${held_l1:-0}, handed over ${handed_l1:-0}"
  HELD[$name]=${held_l1:-0} HANDED[$name]=${handed_l1:-0}
  if [ "$n_orphan" -gt 0 ]; then
    t_handed=$(sod "$(grep -F "orphan of rank $victim (tensor '" "$log" | tail -n 1 | cut -d' ' -f1)")
    handover=$(awk -v a="$t_handed" -v b="$t_dead" 'BEGIN { printf "%.3f", a - b }')
    reinject=$(grep -F "orphan of rank $victim in tensor" "$log" | grep -F 're-injected by rank' |
      sed -n 's/.* \([0-9.]*\) s after the death was declared.*/\1/p' | sort -g | tail -n 1)
    [ -n "$reinject" ] || reinject="not reported"
    held=$(grep -F "worker $victim held residual" "$log" |
      sed -n 's/.*(\([0-9]*\) values).*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
    NOTE[$name]="killed at step $at; dead after ${detect} s; $mass; orphans in $n_orphan tensor(s), $held values, handed ${handover} s and re-injected ${reinject} s after the death was declared"
    REC_DETECT=$detect REC_HANDOVER=$handover REC_REINJECT=$reinject REC_HELD=$held REC_TENSORS=$n_orphan
  else
    NOTE[$name]="killed at step $at; dead after ${detect} s; $mass (no residual snapshot: all of it lost)"
  fi
  echo "  $name: accuracy ${ACC[$name]}, train_loss ${LOSS[$name]}; ${NOTE[$name]}"
}

run_server_kill() { # NAME
  local name=$1 at log1 log2 t_kill t_up t_back lost ck_ms
  log1="$tmp/$name.ps.log" log2="$tmp/$name.ps-restart.log"
  mkdir -p "$tmp/ckpt"
  start_server "$log1" --set checkpoint_dir="$tmp/ckpt" --set checkpoint_interval_s="$ckpt_interval"
  local endpoint=$ep
  start_workers "$name"
  at=$(wait_fifth "$name" 0)
  # At least one periodic checkpoint must exist before the crash.
  for _ in $(seq 300); do ls "$tmp/ckpt"/ckpt-*.gddr > /dev/null 2>&1 && break; sleep 0.1; done
  t_kill=$(now_sod)
  kill -KILL "$server_pid"; wait "$server_pid" 2>/dev/null || true
  sleep 1
  start_server "$log2" --listen "$endpoint" --set checkpoint_dir="$tmp/ckpt" \
    --set checkpoint_interval_s="$ckpt_interval"
  t_up=$(now_sod)
  wait_workers "$name"
  SACC[$name]=$(server_acc)
  stop_server
  ACC[$name]=$(mean_of "$name" test_accuracy)
  LOSS[$name]=$(mean_of "$name" train_loss)
  restored=$(grep -F 'restored checkpoint' "$log2" | sed -n 's/.*restored checkpoint \([^:]*\):.*/\1/p' | xargs -r basename)
  # Workers say which version they found against which they had.
  lost=$(cat "$tmp/$name".w*.err | grep -F "is back at version" | grep -F "'mlp.W1'" |
    sed -n 's/.*is back at version \([0-9]*\) (we had \([0-9]*\)).*/\1 \2/p' |
    awk '{ d = $2 - $1; if (d > m) m = d } END { print m + 0 }')
  t_back=$(grep -F "reconnected after the server restart" "$log2" | tail -n 1 | cut -d" " -f1)
  reconnect=$(awk -v a="$(sod "$t_back")" -v b="$t_up" 'BEGIN { printf "%.2f", a - b }')
  ck_ms=$({ grep -E 'ckpt-[0-9]+\.gddr written' "$log1" || true; } | sed -n 's/.* in \([0-9.]*\) ms.*/\1/p' |
    sort -g | tail -n 1)
  NOTE[$name]="killed at step $at (rank 0), restarted 1 s later from ${restored:-nothing}; all workers back ${reconnect} s after the restart; updates lost: $lost versions of mlp.W1 (checkpoint_interval_s $ckpt_interval, write ${ck_ms:-?} ms)"
  SRV_LOST=$lost SRV_RECONNECT=$reconnect SRV_CKMS=${ck_ms:-?}
  echo "  $name: accuracy ${ACC[$name]}, train_loss ${LOSS[$name]}; ${NOTE[$name]}"
}

echo "== crash-safety experiment: $workers MLP workers on $data_name, $epochs epochs, async, delay_fraction 0.5"
run_plain baseline
run_plain baseline-2
run_worker_kill worker-kill 10
run_worker_kill worker-kill-every-step 1
run_worker_kill worker-kill-norecovery 0
run_server_kill server-kill

delta() { awk -v a="$1" -v b="${SACC[baseline]}" 'BEGIN { printf "%+.4f", a - b }'; }
noise=$(awk -v a="${SACC[baseline-2]}" -v b="${SACC[baseline]}" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.4f", d }')
table=$(
  printf "| run | server acc | delta | workers' acc | train loss | what happened |\n|---|---|---|---|---|---|\n"
  for n in baseline baseline-2 worker-kill worker-kill-every-step worker-kill-norecovery server-kill; do
    printf '| %s | %s | %s | %s | %s | %s |\n' "$n" "${SACC[$n]}" "$(delta "${SACC[$n]}")" "${ACC[$n]}" "${LOSS[$n]}" "${NOTE[$n]}"
  done
)
echo
echo "$table"
echo
echo "recovery timeline (worker_timeout_s 10, replay_decay 0.5): kill -> declared dead ${REC_DETECT:-?} s;"
echo "  declared dead -> orphan handed ${REC_HANDOVER:-?} s; declared dead -> re-injected ${REC_REINJECT:-?} s"
echo "  residual mass of the dead worker (|.|_1 it last reported holding / handed to a survivor):"
echo "  snapshots every 10 steps ${HELD[worker-kill]} / ${HANDED[worker-kill]};" \
     "every step ${HELD[worker-kill-every-step]} / ${HANDED[worker-kill-every-step]};" \
     "no snapshots ${HELD[worker-kill-norecovery]} / 0"
echo "  (death to re-injection: ${REC_REINJECT:-?} s, target 10 s; kill to re-injection $(awk -v a="${REC_DETECT:-0}" -v b="${REC_REINJECT:-0}" 'BEGIN { printf "%.2f", a + b }') s)"
echo "noise floor (|baseline-2 - baseline|): $noise"

if [ "$append" = 1 ]; then
  section=$(
    echo
    echo "## Crash safety"
    echo
    echo "\`scripts/experiment-recovery.sh\`, $(date -u +%Y-%m-%d) on $(nproc) cores: $workers MLP workers on $data_name,"
    echo "$epochs epochs, async, \`--delay-fraction 0.5\`, every other setting at its default"
    echo "(\`worker_timeout_s\` 10, \`replay_decay\` 0.5). Server acc is the test accuracy of the model"
    echo "the server keeps at the end (pulled after every worker is done); workers' acc is the mean of"
    echo "what the finished workers saw after their last step. The delta is the server's against"
    echo "\`baseline\`. Two identical uninterrupted async runs differ by"
    echo "$noise, which is the noise floor of every delta. A killed worker is not restarted, so its"
    echo "delta also contains the steps it never computed."
    echo
    echo "$table"
    echo
    echo "Recovery of a dead worker's residual (\`worker-kill\`, snapshots every 10 steps): the death"
    echo "was declared ${REC_DETECT:-?} s after the kill (\`worker_timeout_s\` 10 plus up to 0.2 s"
    echo "of the server's check), the orphan (${REC_HELD:-?} values in ${REC_TENSORS:-?} tensor(s)) was"
    echo "handed to a survivor ${REC_HANDOVER:-?} s after the death was declared, and it was"
    echo "re-injected (8 installments, reported on the next push) **${REC_REINJECT:-?} s after the death was"
    echo "declared** (target: 10 s). What is handed over is what the last snapshot held and the"
    echo "worker did not push since: residual mass |.|_1 ${HANDED[worker-kill]} of the ${HELD[worker-kill]} the worker last"
    echo "reported holding with snapshots every 10 steps, ${HANDED[worker-kill-every-step]} of ${HELD[worker-kill-every-step]}"
    echo "with a snapshot on every push; without snapshots all ${HELD[worker-kill-norecovery]} was lost."
    echo "Server crash (\`server-kill\`): the workers were all back"
    echo "${SRV_RECONNECT:-?} s after the restart and the newest checkpoint was ${SRV_LOST:-?} updates of"
    echo "\`mlp.W1\` behind the crashed server (\`checkpoint_interval_s\` $ckpt_interval)."
  )
  # Re-read right before appending, and only append.
  if [ -f docs/results.md ] && [ -n "$(tail -c 1 docs/results.md)" ]; then
    section=$'\n'"$section"
  fi
  printf '%s\n' "$section" >> docs/results.md
  echo "appended the \"Crash safety\" section to docs/results.md"
fi
