#!/usr/bin/env bash
# GDDR: delayed reconvergence, measured. One gddr-ps and 4 gddr-train
# workers per row, Fashion-MNIST, softmax and MLP, the same steps and data
# order in every row; prints a Markdown table per workload.
#
#   scripts/experiment-gddr.sh                 full run (both workloads)
#   scripts/experiment-gddr.sh --quick         generated data, 60 steps, softmax only (a test)
#   scripts/experiment-gddr.sh --epochs 5 --workloads "softmax"
#   GDDR_BIN=DIR scripts/experiment-gddr.sh
#
# Rows (server settings / trainer flags):
#   dense sync              mode=sync                                   -
#   GDDR a=0.2 tau=4 sync   mode=sync tau_dynamic=false tau_init=4      --delay-fraction 0.2
#   GDDR a=0.4 tau=4 sync   mode=sync tau_dynamic=false tau_init=4      --delay-fraction 0.4
#   GDDR a=0.6 tau=4 sync   mode=sync tau_dynamic=false tau_init=4      --delay-fraction 0.6
#   GDDR a=0.4 dyn-tau sync mode=sync (tau 2..8, start 4)               --delay-fraction 0.4
#   dense async             mode=async                                  -   (reference for the next row)
#   GDDR a=0.4 dyn-tau async mode=async                                 --delay-fraction 0.4
#   dense sync pipelined    mode=sync                                   --pipeline
#   GDDR a=0.4 tau=4 sync pipelined  as row 3                           --delay-fraction 0.4 --pipeline
#
# Columns: server acc = test accuracy of the model the server keeps at the
# end (pulled by an observer after every worker flushed its residual and
# left: gddr-train --evaluate), dacc = that minus dense sync in percentage
# points, workers' acc and train loss (means over the 4 workers of what
# each saw after its last step, before its flush), values pushed per step relative to dense, the
# fixed-tau prediction of that fraction, (1-a)/(1-a^(tau+1)), push bytes on
# the wire relative to dense (protobuf headers, bitmaps and payload frames:
# the client's bytes_pushed counter), all bytes (pushes and pulls) relative
# to dense, the mean tau the workers obeyed, the mean training time of a
# worker, and for the pipelined rows the share of communication time hidden
# behind compute (1 - time blocked in gddr_step_wait / time the library
# thread spent in steps).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
quick=0 epochs=10 workloads="softmax mlp" workers=4 lr=0.1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --epochs) epochs=$2; shift 2 ;;
    --workloads) workloads=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "experiment-gddr: unknown option $1" >&2; exit 2 ;;
  esac
done
for p in gddr-ps gddr-train; do
  [ -x "$BIN/$p" ] || { echo "experiment-gddr: $BIN/$p is missing (run make)" >&2; exit 1; }
done
if [ "$quick" = 1 ]; then
  data_args=(--synthetic 4000 --steps 60)
  workloads="softmax"
  what="generated data (--synthetic 4000), 60 steps"
else
  data=/usr/share/datasets/fashion-mnist
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "experiment-gddr: Fashion-MNIST is missing (package dataset-fashion-mnist), or use --quick" >&2
    exit 1
  fi
  data_args=(--epochs "$epochs")
  what="Fashion-MNIST, $epochs epochs per worker"
fi

tmp=$(mktemp -d /tmp/gddr-exp.XXXXXX)
server_pid=
cleanup() { stop_server; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM


# run WORKLOAD "SERVER SETTINGS" TRAINER FLAGS... -> one line of totals in $tmp/row
run() {
  local workload=$1 sets=$2
  shift 2
  local args=() s pids=() r
  for s in $sets; do args+=(--set "$s"); done
  rm -f "$tmp/endpoint"
  "$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/endpoint" \
    --set log_level=warn --set lr="$lr" --set workers="$workers" "${args[@]}" 2> "$tmp/server.log" &
  server_pid=$!
  for _ in $(seq 200); do [ -s "$tmp/endpoint" ] && break; sleep 0.05; done
  [ -s "$tmp/endpoint" ] || { echo "experiment-gddr: gddr-ps did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }
  local ep
  ep=$(cat "$tmp/endpoint")
  for ((r = 0; r < workers; r++)); do
    "$BIN/gddr-train" --server "$ep" --rank "$r" --world "$workers" --workload "$workload" \
      --quiet "${data_args[@]}" "$@" > "$tmp/w$r.log" 2>&1 &
    pids+=($!)
  done
  local fail=0
  for ((r = 0; r < workers; r++)); do
    wait "${pids[$r]}" || { echo "experiment-gddr: worker $r failed ($workload, $sets, $*):" >&2; tail -n 20 "$tmp/w$r.log" >&2; fail=1; }
  done
  local sacc
  sacc=$(field test_accuracy "$(server_eval "$ep" "$workload" "${data_args[@]}")")
  stop_server
  [ "$fail" = 0 ] || exit 1
  # Sums over the workers: acc loss values bytes_pushed bytes_all tau overlap seconds
  local acc=0 loss=0 vals=0 bp=0 ball=0 tau=0 ov=0 sec=0 res
  for ((r = 0; r < workers; r++)); do
    res=$(grep '^RESULT' "$tmp/w$r.log" || true)
    [ -n "$res" ] || { echo "experiment-gddr: no RESULT from worker $r" >&2; cat "$tmp/w$r.log" >&2; exit 1; }
    read -r acc loss vals bp ball tau ov sec < <(awk -v a="$acc" -v l="$loss" -v v="$vals" -v b="$bp" -v ba="$ball" -v t="$tau" -v o="$ov" -v se="$sec" \
      -v ra="$(field test_accuracy "$res")" -v rl="$(field train_loss "$res")" -v rv="$(field values_pushed "$res")" \
      -v rb="$(field bytes_pushed "$res")" -v rp="$(field bytes_pulled "$res")" -v rt="$(field mean_tau "$res")" \
      -v ro="$(field overlap "$res")" -v rs="$(field train_seconds "$res")" \
      'BEGIN { printf "%.6f %.6f %.0f %.0f %.0f %.6f %.6f %.4f\n", a+ra, l+rl, v+rv, b+rb, ba+rb+rp, t+rt, o+ro, se+rs }')
  done
  echo "$acc $loss $vals $bp $ball $tau $ov $sec $sacc" > "$tmp/row"
}

# row LABEL ALPHA TAU_FIXED(or -) PIPELINED(0/1) WORKLOAD "SETS" FLAGS...
row() {
  local label=$1 alpha=$2 taufix=$3 piped=$4 workload=$5 sets=$6
  shift 6
  run "$workload" "$sets" "$@"
  local acc loss vals bp ball tau ov sec sacc
  read -r acc loss vals bp ball tau ov sec sacc < "$tmp/row"
  if [ -z "${dense_vals:-}" ]; then
    dense_sacc=$sacc dense_vals=$vals dense_bp=$bp dense_ball=$ball
  fi
  awk -v n="$label" -v w="$workers" -v acc="$acc" -v loss="$loss" -v vals="$vals" -v bp="$bp" \
      -v ball="$ball" -v tau="$tau" -v ov="$ov" -v sacc="$sacc" -v ds="$dense_sacc" -v dv="$dense_vals" \
      -v db="$dense_bp" -v dball="$dense_ball" -v al="$alpha" -v tf="$taufix" -v pp="$piped" -v sec="$sec" '
    BEGIN {
      theory = "-"
      if (tf != "-" && al > 0) theory = sprintf("%.3f", (1 - al) / (1 - al ^ (tf + 1)))
      else if (al == 0) theory = "1.000"
      mt = (al > 0) ? sprintf("%.2f", tau / w) : "-"
      o = pp ? sprintf("%.0f%%", 100 * ov / w) : "-"
      printf "| %-26s | %.4f | %+.2f | %.4f | %.4f | %.3f | %s | %.3f (%+.1f%%) | %.3f | %s | %.1f | %s |\n", n,
        sacc, 100 * (sacc - ds), acc / w, loss / w, vals / dv, theory, bp / db, 100 * (bp / db - 1),
        ball / dball, mt, sec / w, o
    }'
}

fixed="tau_dynamic=false tau_init=4"
echo "GDDR experiment: $workers workers, $what, lr $lr, batch 64"
for wl in $workloads; do
  unset dense_vals
  echo
  echo "### $wl"
  echo
  echo "| row | server acc | dacc (pp) | workers' acc | train loss | values/step vs dense | fixed-tau theory | push bytes vs dense | all bytes vs dense | mean tau | train s | overlap |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  row "dense sync"                 0   -  0 "$wl" "mode=sync"
  row "GDDR a=0.2 tau=4 sync"      0.2 4  0 "$wl" "mode=sync $fixed"  --delay-fraction 0.2
  row "GDDR a=0.4 tau=4 sync"      0.4 4  0 "$wl" "mode=sync $fixed"  --delay-fraction 0.4
  row "GDDR a=0.6 tau=4 sync"      0.6 4  0 "$wl" "mode=sync $fixed"  --delay-fraction 0.6
  row "GDDR a=0.4 dyn-tau sync"    0.4 -  0 "$wl" "mode=sync"         --delay-fraction 0.4
  row "dense async"                0   -  0 "$wl" "mode=async"
  row "GDDR a=0.4 dyn-tau async"   0.4 -  0 "$wl" "mode=async"        --delay-fraction 0.4
  row "dense sync pipe"            0   -  1 "$wl" "mode=sync"         --pipeline
  row "GDDR a=0.4 tau=4 sync pipe" 0.4 4  1 "$wl" "mode=sync $fixed"  --delay-fraction 0.4 --pipeline
done
