#!/usr/bin/env bash
# GDDR on a workload where Adam is the right tool: a byte-level transformer
# language model (python/examples/tiny_lm.py) trained on the Python standard
# library's source (/usr/lib/python3.11, Debian's libpython3.11-stdlib) by
# W Python workers through gddr-ps, the server running Adam. For sync and
# async, dense against GDDR alpha 0.4 with 8-bit delta pulls, over several
# seeds; what counts is the model the server keeps, scored by an observer
# (held-out cross-entropy per byte) after every worker flushed and left.
# Prints a Markdown table per mode: the held-out loss of each seed, the
# mean, the relative difference to dense (mean and worst seed, in %), and
# the bytes pushed and pulled relative to dense. docs/results-lm.md has the
# figures.
#
#   scripts/experiment-lm.sh                            sync and async, seeds 1 2 3
#   scripts/experiment-lm.sh --modes async --seeds "1 2 3 4"
#   scripts/experiment-lm.sh --quick                    a tiny model, generated text, a few
#                                                       steps, 2 workers, sync only (unless
#                                                       --modes): asserts the observer ran
#                                                       and the loss is finite (make check)
#
# Options: --workers W (4), --steps N (per worker), --lr X (Adam's, on the
# server), --alpha A (0.4), --pull-bits B (the GDDR row's delta pulls: 8,
# 16, or 0 for float32 pulls; --alpha 0 --pull-bits 8 measures the 8-bit
# pulls alone), --set KEY=VALUE (one more gddr-ps setting, for every row;
# repeatable), --keep DIR (keep the logs there), --lockstep (the W workers
# in one process, stepped in turn: in async every push is exactly W-1
# versions stale and a run repeats to the last digit; tiny_lm.py
# --lockstep); after --, arguments for every tiny_lm.py (workers and
# observer).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
PY=/usr/bin/python3   # Debian's: it has python3-numpy and python3-torch
LM=python/examples/tiny_lm.py
modes="sync async" seeds="1 2 3" quick=0 workers=4 steps="" lr=0.001 alpha=0.4 bits=8 keep="" modes_given=0
lockstep=0
extra=() sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --modes) modes=$2 modes_given=1; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --alpha) alpha=$2; shift 2 ;;
    --pull-bits) bits=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --lockstep) lockstep=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "experiment-lm: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN/gddr-ps" ] || { echo "experiment-lm: $BIN/gddr-ps is missing (run make)" >&2; exit 1; }
if ! "$PY" -c 'import numpy, torch' 2>/dev/null; then
  echo "experiment-lm: $PY cannot import numpy and torch: run scripts/install-deps.sh" >&2
  exit 1
fi
tmp=$(mktemp -d /tmp/gddr-lm.XXXXXX)
server_pid=
wpids=()
cleanup() {
  for p in "${wpids[@]}"; do stop_pid "$p"; done
  stop_server
  if [ -n "$keep" ]; then mkdir -p "$keep" && cp -r "$tmp"/. "$keep"/; fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

if [ "$quick" = 1 ]; then
  # A smoke test: seconds, not a measurement.
  seeds=${seeds%% *} workers=2
  [ "$modes_given" = 1 ] || modes=sync
  model=(--synthetic 20000 --layers 1 --d-model 32 --heads 2 --context 32 --batch 4
         --eval-windows 16)
  steps=${steps:-8}
else
  model=()
  steps=${steps:-250}
fi
lm_args=(${model[@]+"${model[@]}"} ${extra[@]+"${extra[@]}"})

# run MODE SEED TAG [tiny_lm.py flags...] -> "loss push pull wall version" in $tmp/row
run() {
  local mode=$1 seed=$2 tag=$3 r fail=0 start ep
  shift 3
  local log=$tmp/$mode-$tag-$seed
  mkdir -p "$log"
  rm -f "$tmp/endpoint"
  start=$(date +%s.%N)
  "$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/endpoint" \
    --set log_level=warn --set mode="$mode" --set workers="$workers" \
    --set optimizer.kind=adam --set optimizer.lr="$lr" ${sets[@]+"${sets[@]}"} 2> "$log/server.log" &
  server_pid=$!
  wait_file "$tmp/endpoint" 10 ||
    { echo "experiment-lm: gddr-ps did not start:" >&2; cat "$log/server.log" >&2; exit 1; }
  ep=$(cat "$tmp/endpoint")
  wpids=()
  # One process per worker, or with --lockstep one for all (its log is worker0.log).
  local procs=$workers who
  [ "$lockstep" = 0 ] || procs=1
  for ((r = 0; r < procs; r++)); do
    if [ "$lockstep" = 1 ]; then who=(--lockstep "$workers"); else who=(--rank "$r" --world "$workers"); fi
    "$PY" "$LM" --server "$ep" "${who[@]}" --seed "$seed" --steps "$steps" \
      --progress 30 ${lm_args[@]+"${lm_args[@]}"} "$@" > "$log/worker$r.log" 2>&1 &
    wpids+=($!)
  done
  for ((r = 0; r < procs; r++)); do
    wait "${wpids[$r]}" ||
      { echo "experiment-lm: worker $r failed ($mode $tag seed $seed):" >&2; tail -n 20 "$log/worker$r.log" >&2; fail=1; }
  done
  wpids=()
  local wall
  wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f", e - s }')
  # The model the server keeps, after every worker flushed and left.
  "$PY" "$LM" --server "$ep" --evaluate ${lm_args[@]+"${lm_args[@]}"} > "$log/observer.log" 2>&1 || true
  stop_server
  [ "$fail" = 0 ] || exit 1
  local res loss version bp=0 bl=0
  res=$(grep '^RESULT' "$log/observer.log" | tail -n 1 || true)
  loss=$(field heldout_loss "$res") version=$(field version "$res")
  if [ -z "$loss" ]; then
    echo "experiment-lm: the observer did not report ($mode $tag seed $seed):" >&2
    cat "$log/observer.log" >&2
    exit 1
  fi
  for ((r = 0; r < workers; r++)); do
    if [ "$lockstep" = 1 ]; then
      res=$(grep "^RESULT rank=$r " "$log/worker0.log")
    else
      res=$(grep '^RESULT' "$log/worker$r.log")
    fi
    bp=$((bp + $(field bytes_pushed "$res"))) bl=$((bl + $(field bytes_pulled "$res")))
  done
  echo "$loss $bp $bl $wall $version" > "$tmp/row"
}

[ "$lockstep" = 0 ] || echo "experiment-lm: lockstep: the $workers workers in one process, stepped in turn"
echo "experiment-lm: $workers workers, $steps steps each, server Adam lr $lr${sets[*]+ ${sets[*]}}," \
     "seeds $seeds; the server's final model, scored by an observer"
for mode in $modes; do
  declare -A loss=() bp=() bl=() wall=()
  gddr_label="GDDR a=$alpha" gflags=(--delay-fraction "$alpha")
  if [ "$bits" != 0 ]; then gddr_label+=" + q$bits" gflags+=(--pull-delta-bits "$bits"); fi
  labels=("dense" "$gddr_label")
  for seed in $seeds; do
    for label in "${labels[@]}"; do
      if [ "$label" = dense ]; then flags=(); tag=dense
      else flags=("${gflags[@]}"); tag=gddr; fi
      run "$mode" "$seed" "$tag" ${flags[@]+"${flags[@]}"}
      read -r loss["$label/$seed"] bp["$label/$seed"] bl["$label/$seed"] wall["$label/$seed"] version < "$tmp/row"
      echo "experiment-lm: $mode / $label / seed $seed: held-out loss ${loss["$label/$seed"]} nats/byte" \
           "(server version $version, ${wall["$label/$seed"]} s)" >&2
      if [ "$quick" = 1 ]; then
        awk -v l="${loss["$label/$seed"]}" 'BEGIN { exit !(l + 0 == l && l > 0 && l < 20) }' ||
          { echo "experiment-lm: FAIL: held-out loss ${loss["$label/$seed"]} is not finite" >&2; exit 1; }
        [ "${version:-0}" -gt 0 ] ||
          { echo "experiment-lm: FAIL: the server's model is at version ${version:-?}" >&2; exit 1; }
      fi
    done
  done
  echo
  echo "### $mode, $workers workers, Adam lr $lr, $steps steps per worker"
  echo
  echo "| row | held-out loss per seed (nats/byte) | mean | bits/byte | mean vs dense | worst seed vs dense | push bytes vs dense | pull bytes vs dense | wall s per run |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for label in "${labels[@]}"; do
    list="" sum=0 rsum=0 worst="" n=0 pb=0 pl=0 rpb=0 rpl=0 ws=0
    for seed in $seeds; do
      l=${loss["$label/$seed"]} r=${loss["dense/$seed"]}
      list+="$l "
      read -r sum rsum worst < <(awk -v s="$sum" -v rs="$rsum" -v w="$worst" -v l="$l" -v r="$r" \
        'BEGIN { x = 100 * (l / r - 1); if (w == "" || x > w) w = x; printf "%.6f %.6f %.4f\n", s + l, rs + r, w }')
      n=$((n + 1)) ws=$((ws + ${wall["$label/$seed"]}))
      pb=$((pb + ${bp["$label/$seed"]})) pl=$((pl + ${bl["$label/$seed"]}))
      rpb=$((rpb + ${bp["dense/$seed"]})) rpl=$((rpl + ${bl["dense/$seed"]}))
    done
    awk -v lb="$label" -v list="$list" -v s="$sum" -v rs="$rsum" -v w="$worst" -v n="$n" \
        -v pb="$pb" -v pl="$pl" -v rpb="$rpb" -v rpl="$rpl" -v ws="$ws" \
      'BEGIN { printf "| %s | %s| %.4f | %.3f | %+.2f %% | %+.2f %% | %.3f | %.3f | %.0f |\n",
               lb, list, s / n, s / n / log(2), 100 * (s / rs - 1), w, pb / rpb, pl / rpl, ws / n }'
  done
  unset loss bp bl wall
done
if [ "$quick" = 1 ]; then
  echo "experiment-lm: OK (quick): every observer reported a finite held-out loss"
fi
