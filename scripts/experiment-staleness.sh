#!/usr/bin/env bash
# Staleness experiment: consistency modes, AdaDelay and DC-ASGD on
# Fashion-MNIST, all through the real gddr-ps and gddr-train processes.
#
#   scripts/experiment-staleness.sh             the full run (a few minutes on 2 cores)
#   scripts/experiment-staleness.sh --quick     tiny synthetic budget: checks the plumbing
#
# Every row starts its own gddr-ps (lr the same for all rows) and WORKERS
# gddr-train processes (MLP 784-128-10, batch 64); each worker trains on its
# shard (examples i with i % WORKERS == rank) for EPOCHS passes, so every
# row spends the same data budget (WORKERS * EPOCHS * shard examples).
# What differs per row is only the server's consistency mode / optimizer
# settings and the workers' DC-ASGD options:
#
#   sync             mode=sync  (one update per step: the mean of 8 pushes)
#   async            mode=async (each push applied on arrival)
#   async+AdaDelay   adadelay=0.5: lr_eff = lr / (1 + 0.5 tau)
#   async+DC         --dc-lambda 0.04 --dc-mode diag (DC-ASGD-c)
#   async+DC-a       --dc-lambda 2 --dc-adaptive --dc-mode diag (DC-ASGD-a, lambda0 2)
#   ssp s=2          mode=ssp staleness_bound=2
#   hybrid           mode=sync async_warmup_steps=W: async for the first half
#                    of the updates (W = WORKERS*steps/2 versions), then sync
#
# and, unless --no-controls, two control rows that say *why* a row above
# wins or loses:
#   async lr=X       plain async with the constant lr that AdaDelay used on
#                    average (X = lr / (1 + 0.5 * mean tau of the async row))
#   async+DC lam~0   the DC-ASGD step order (pull w', push, use w' as the next
#                    parameters) with a compensation too small to matter
#                    (identity, lambda 1e-20)
#
# Columns: server acc (test accuracy on the 10k test set of the model the
# server keeps at the end, pulled by an observer after every worker left:
# gddr-train --evaluate), workers' test accuracy (mean over the workers'
# own final evaluations with the parameters each pulled after its last
# step; range in brackets), train loss (mean of the workers' loss over their shard), mean
# and max staleness tau as gddr-ps measured it (version at apply minus the
# push's base_version: for DC rows that is the staleness *after*
# compensation), train wall time (slowest worker's training loop), and
# bytes moved (gddr-ps received + sent, all messages).
#
# A row whose workers are stopped by a NaN/Inf push (the server refuses
# them) is reported as "diverged". Any other failure stops the script.
#
# Options:
#   --quick            4 workers (unless --workers), synthetic data (2000
#                      examples, dim 64), 20 steps per worker, no control
#                      rows; a few seconds
#   --epochs E         passes over each worker's shard (default 8)
#   --workers N        worker processes (default 8)
#   --lr X             server learning rate for every row (default 0.1)
#   --rows LIST        comma-separated subset of: sync,async,adadelay,dc,dca,ssp,hybrid,lrctl,dc0
#   --no-controls      skip the control rows
#   --keep DIR         keep every log under DIR
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
DATA=${GDDR_DATA:-/usr/share/datasets/fashion-mnist}

quick=0 epochs=8 workers= lr=0.1 rows="" controls=1 keep=""
cmdline="scripts/experiment-staleness.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --epochs) epochs=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --no-controls) controls=0; shift ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "experiment-staleness: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done
for p in gddr-ps gddr-train gddr-ctl; do
  [ -x "$BIN/$p" ] || { echo "experiment-staleness: $BIN/$p is missing (run make)" >&2; exit 1; }
done

if [ "$quick" = 1 ]; then
  workers=${workers:-4}
  controls=0
  datargs=(--synthetic 2000)
  steps=20
  budget="--steps $steps"
else
  if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -f "$DATA/train-images-idx3-ubyte" ]; then
    echo "experiment-staleness: Fashion-MNIST is missing in $DATA (scripts/install-deps.sh installs dataset-fashion-mnist)" >&2
    exit 1
  fi
  workers=${workers:-8}
  datargs=(--data "$DATA")
  # gddr-train's step count for --epochs: ceil(shard / batch) per epoch.
  shard=$(( (60000 + workers - 1) / workers ))
  steps=$(( epochs * ((shard + 63) / 64) ))
  budget="--epochs $epochs"
fi
[ -z "$rows" ] && rows="sync,async,adadelay,dc,dca,ssp,hybrid" && [ "$controls" = 1 ] && rows="$rows,lrctl,dc0"
warmup=$(( workers * steps / 2 ))

tmp=$(mktemp -d /tmp/gddr-staleness.XXXXXX)
server_pid=
worker_pids=()
cleanup() {
  local p
  for p in "${worker_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  stop_server
  if [ -n "$keep" ]; then mkdir -p "$keep" && cp -r "$tmp"/. "$keep"/; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

metric() { sed -n "s/^$1 \([^ ]*\)$/\1/p" "$2" | head -n 1; }

# run_row KEY LABEL "SERVER SETTINGS" TRAINER FLAGS...
# Appends one tab-separated line to $tmp/table.
run_row() {
  local key=$1 label=$2 sets=$3
  shift 3
  local dir="$tmp/$key" s r t0=$SECONDS
  mkdir -p "$dir"
  local sargs=()
  for s in $sets; do sargs+=(--set "$s"); done
  "$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$dir/endpoint" \
    --set log_level=warn --set lr="$lr" --set workers="$workers" "${sargs[@]}" \
    2> "$dir/server.log" &
  server_pid=$!
  for _ in $(seq 200); do [ -s "$dir/endpoint" ] && break; sleep 0.05; done
  [ -s "$dir/endpoint" ] || { echo "experiment-staleness: gddr-ps did not start for $label:" >&2; cat "$dir/server.log" >&2; exit 1; }
  local ep
  ep=$(cat "$dir/endpoint")
  echo "  $label: gddr-ps ${sets:+($sets) }+ $workers x gddr-train $*" >&2
  worker_pids=()
  for ((r = 0; r < workers; r++)); do
    "$BIN/gddr-train" --server "$ep" --rank "$r" --world "$workers" --workload mlp \
      "${datargs[@]}" $budget --batch 64 --hidden 128 --progress 0 --timeout-ms 20000 "$@" \
      > "$dir/worker$r.log" 2>&1 &
    worker_pids+=($!)
  done
  local failed=0 diverged=0
  for ((r = 0; r < workers; r++)); do
    if ! wait "${worker_pids[$r]}"; then
      if grep -q "NaN or Inf" "$dir/worker$r.log"; then diverged=1; else failed=1; fi
    fi
  done
  worker_pids=()
  "$BIN/gddr-ctl" -s "$ep" metrics > "$dir/metrics" 2> "$dir/ctl.err" || true
  local sacc
  sacc=$(field test_accuracy "$(server_eval "$ep" mlp "${datargs[@]}" --hidden 128)")
  stop_server
  if [ "$failed" = 1 ]; then
    echo "experiment-staleness: a worker of row '$label' failed:" >&2
    for ((r = 0; r < workers; r++)); do tail -n 3 "$dir/worker$r.log" >&2; done
    exit 1
  fi
  local ssum scnt smax bin bout
  ssum=$(metric gddr_staleness_sum "$dir/metrics")
  scnt=$(metric gddr_staleness_count "$dir/metrics")
  smax=$(metric gddr_staleness_max "$dir/metrics")
  bin=$(metric gddr_bytes_received_total "$dir/metrics")
  bout=$(metric gddr_bytes_sent_total "$dir/metrics")
  [ -n "$scnt" ] || { echo "experiment-staleness: no metrics from gddr-ps for '$label':" >&2; cat "$dir/ctl.err" >&2; exit 1; }
  { grep -h '^RESULT' "$dir"/worker*.log || true; } | awk -v label="$label" -v key="$key" -v div="$diverged" \
      -v ssum="$ssum" -v scnt="$scnt" -v smax="$smax" -v bytes="$((bin + bout))" -v sacc="$sacc" '
    { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      n++; acc += f["test_accuracy"]; loss += f["train_loss"]
      if (n == 1 || f["test_accuracy"] < amin) amin = f["test_accuracy"]
      if (n == 1 || f["test_accuracy"] > amax) amax = f["test_accuracy"]
      if (f["train_seconds"] > wall) wall = f["train_seconds"] }
    END {
      st = scnt > 0 ? ssum / scnt : 0
      if (div || n == 0)
        printf "%s\t%s\tdiverged\tdiverged (NaN/Inf pushes refused; %d of its workers finished)\t-\t%.2f\t%d\t%.1f\t%.1f\n",
               key, label, n, st, smax, wall, bytes / 1e6
      else
        printf "%s\t%s\t%s\t%.4f [%.4f-%.4f]\t%.4f\t%.2f\t%d\t%.1f\t%.1f\n",
               key, label, sacc, acc / n, amin, amax, loss / n, st, smax, wall, bytes / 1e6
    }' >> "$tmp/table"
  tail -n 1 "$tmp/table" | cut -f 2- | tr '\t' '|' | sed "s/^/    -> /; s/\$/  ($((SECONDS - t0)) s)/" >&2
}

has_row() { case ",$rows," in *",$1,"*) return 0 ;; esac; return 1; }

echo "# $cmdline" >&2
echo "# $workers workers, MLP $([ "$quick" = 1 ] && echo 64 || echo 784)-128-10, batch 64, lr $lr," \
     "$steps steps per worker ($budget), hybrid warm-up $warmup versions" >&2
t_start=$(date +%s)
: > "$tmp/table"
has_row sync     && run_row sync     "sync"                   "mode=sync"
has_row async    && run_row async    "async"                  "mode=async"
has_row adadelay && run_row adadelay "async+AdaDelay 0.5"     "mode=async adadelay=0.5"
has_row dc       && run_row dc       "async+DC-ASGD lam=0.04" "mode=async" --dc-lambda 0.04 --dc-mode diag
has_row dca      && run_row dca      "async+DC-ASGD-a lam0=2" "mode=async" --dc-lambda 2 --dc-adaptive --dc-mode diag
has_row ssp      && run_row ssp      "ssp s=2"                "mode=ssp staleness_bound=2"
has_row hybrid   && run_row hybrid   "hybrid (async->sync)"   "mode=sync async_warmup_steps=$warmup"
if has_row lrctl; then
  # The constant lr AdaDelay averaged to, from the async row's mean tau.
  tau=$(awk -F'\t' '$1 == "async" { print $6 }' "$tmp/table")
  ctl_lr=$(awk -v lr="$lr" -v t="${tau:-0}" 'BEGIN { printf "%.4g", lr / (1 + 0.5 * t) }')
  lr_saved=$lr
  lr=$ctl_lr
  run_row lrctl "control: async lr=$ctl_lr" "mode=async"
  lr=$lr_saved
fi
has_row dc0      && run_row dc0      "control: DC order, lam~0" "mode=async" --dc-lambda 1e-20 --dc-mode identity

echo
echo "Command: \`$cmdline\` ($(( $(date +%s) - t_start )) s on $(nproc) cores)"
echo
echo "| run | server acc | workers' test accuracy [min-max] | train loss | mean tau | max tau | train wall s | MB moved |"
echo "|---|---|---|---|---|---|---|---|"
cut -f 2- "$tmp/table" | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
