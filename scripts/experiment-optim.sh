#!/usr/bin/env bash
# GDDR with the optimizers trainers use: momentum, Adam, AdaDelay, measured
# on the model the server keeps (an observer evaluates it after every worker
# flushed and left). Fashion-MNIST, loopback, several seeds; prints a
# Markdown table per target with the accuracy of each seed, the mean, the
# mean and the worst per-seed difference to the target's reference row,
# and the bytes pushed and pulled relative to that row.
#
#   scripts/experiment-optim.sh                       every target, seeds 1 2 3
#   scripts/experiment-optim.sh --targets momentum --seeds "1 2 3 4"
#   scripts/experiment-optim.sh --quick               generated data, a few steps (a smoke test)
#
# Targets (reference row first; docs/results.md has the figures):
#   momentum  sync, 4 workers, server momentum 0.9, lr 0.1, MLP 784-1280-10,
#             batch 128, 300 steps: dense | GDDR alpha 0.4 + 8-bit delta pulls
#             (fill_held on, the default) | the same with fill_held = false
#   plain     sync, 4 workers, no momentum, lr 0.2, MLP 784-128-10, batch 64,
#             5 epochs, tau 4 fixed: dense | GDDR alpha 0.4 | without fill
#   adam8     8 workers, Adam lr 0.001, MLP 784-128-10, batch 64, 2 epochs:
#             sync dense | async dense + AdaDelay 0.1 | async GDDR alpha 0.4
#             + AdaDelay 0.1 (async fill of the last fresh push and the
#             smallest chunks held, the defaults) | the same with
#             async_fill = moment (m-hat stands in, as before) | the same with
#             hold_schedule = random (the holds drawn, as before 2026-12-05)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
targets="momentum plain adam8" seeds="1 2 3" quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --targets) targets=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "experiment-optim: unknown option $1" >&2; exit 2 ;;
  esac
done
for p in gddr-ps gddr-train; do
  [ -x "$BIN/$p" ] || { echo "experiment-optim: $BIN/$p is missing (run make)" >&2; exit 1; }
done
tmp=$(mktemp -d /tmp/gddr-optim.XXXXXX)
server_pid=
cleanup() { stop_server; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

# run WORKERS "SERVER SETTINGS" TRAINER FLAGS... -> "server_acc push_bytes pull_bytes" in $tmp/row
run() {
  local workers=$1 sets=$2
  shift 2
  local args=() s pids=() r
  for s in $sets; do args+=(--set "$s"); done
  rm -f "$tmp/endpoint"
  "$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/endpoint" \
    --set log_level=warn --set workers="$workers" "${args[@]}" 2> "$tmp/server.log" &
  server_pid=$!
  wait_file "$tmp/endpoint" 10 || { echo "experiment-optim: gddr-ps did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }
  local ep
  ep=$(cat "$tmp/endpoint")
  for ((r = 0; r < workers; r++)); do
    "$BIN/gddr-train" --server "$ep" --rank "$r" --world "$workers" --quiet "$@" > "$tmp/w$r.log" 2>&1 &
    pids+=($!)
  done
  local fail=0
  for ((r = 0; r < workers; r++)); do
    wait "${pids[$r]}" || { echo "experiment-optim: worker $r failed ($sets, $*):" >&2; tail -n 20 "$tmp/w$r.log" >&2; fail=1; }
  done
  local sacc
  local ev
  mapfile -t ev < <(eval_args "$@")
  sacc=$(field test_accuracy "$(server_eval "$ep" mlp "${ev[@]}")")
  stop_server
  [ "$fail" = 0 ] || exit 1
  local bp=0 bl=0 res
  for ((r = 0; r < workers; r++)); do
    res=$(grep '^RESULT' "$tmp/w$r.log")
    bp=$((bp + $(field bytes_pushed "$res"))) bl=$((bl + $(field bytes_pulled "$res")))
  done
  echo "$sacc $bp $bl" > "$tmp/row"
}

# target NAME WORKERS "COMMON TRAINER FLAGS" then rows from stdin:
#   LABEL|WORKERS (or -)|SERVER SETTINGS|TRAINER FLAGS
target() {
  local name=$1 common=$2 label w sets flags seed
  local -a labels=()
  declare -A acc=() bp=() bl=()
  while IFS='|' read -r label w sets flags; do
    [ -n "$label" ] || continue
    labels+=("$label")
    for seed in $seeds; do
      # shellcheck disable=SC2086
      run "$w" "$sets" $common $flags --seed "$seed"
      read -r acc["$label/$seed"] bp["$label/$seed"] bl["$label/$seed"] < "$tmp/row"
      echo "experiment-optim: $name / $label / seed $seed: server acc ${acc["$label/$seed"]}" >&2
    done
  done
  echo
  echo "### $name"
  echo
  echo "| row | server acc per seed | mean | mean vs ${labels[0]} (pp) | worst seed (pp) | push bytes vs ${labels[0]} | pull bytes vs ${labels[0]} |"
  echo "|---|---|---|---|---|---|---|"
  local ref=${labels[0]}
  for label in "${labels[@]}"; do
    local list="" sum=0 dsum=0 worst="" n=0 pb=0 pl=0 rpb=0 rpl=0
    for seed in $seeds; do
      local a=${acc["$label/$seed"]} r=${acc["$ref/$seed"]}
      list+="$a "
      read -r sum dsum worst < <(awk -v s="$sum" -v d="$dsum" -v w="$worst" -v a="$a" -v r="$r" \
        'BEGIN { x = 100 * (a - r); if (w == "" || x < w) w = x; printf "%.6f %.6f %.4f\n", s + a, d + x, w }')
      n=$((n + 1))
      pb=$((pb + ${bp["$label/$seed"]})) pl=$((pl + ${bl["$label/$seed"]}))
      rpb=$((rpb + ${bp["$ref/$seed"]})) rpl=$((rpl + ${bl["$ref/$seed"]}))
    done
    awk -v l="$label" -v list="$list" -v s="$sum" -v d="$dsum" -v w="$worst" -v n="$n" -v pb="$pb" \
        -v pl="$pl" -v rpb="$rpb" -v rpl="$rpl" \
      'BEGIN { printf "| %s | %s| %.4f | %+.2f | %+.2f | %.3f | %.3f |\n", l, list, s / n, d / n, w, pb / rpb, pl / rpl }'
  done
}

if [ "$quick" = 1 ]; then
  data="--synthetic 2000 --steps 20"
  seeds=${seeds%% *}
  m_common="--workload mlp --hidden 32 --batch 32 $data"
  p_common="--workload mlp --hidden 32 --batch 32 $data"
  a_common="--workload mlp --hidden 32 --batch 32 $data"
else
  data=/usr/share/datasets/fashion-mnist
  [ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "experiment-optim: Fashion-MNIST is missing (package dataset-fashion-mnist)" >&2; exit 1; }
  m_common="--workload mlp --hidden 1280 --batch 128 --steps 300"
  p_common="--workload mlp --hidden 128 --batch 64 --epochs 5"
  a_common="--workload mlp --hidden 128 --batch 64 --epochs 2"
fi
echo "experiment-optim: seeds $seeds; the server's final model, scored by an observer"
for t in $targets; do
  case "$t" in
    momentum) target momentum "$m_common" <<'ROWS'
dense|4|mode=sync momentum=0.9 lr=0.1|
GDDR a=0.4 + q8|4|mode=sync momentum=0.9 lr=0.1|--delay-fraction 0.4 --pull-delta-bits 8
GDDR a=0.4 + q8, no fill|4|mode=sync momentum=0.9 lr=0.1 fill_held=false|--delay-fraction 0.4 --pull-delta-bits 8
ROWS
    ;;
    plain) target plain "$p_common" <<'ROWS'
dense|4|mode=sync lr=0.2|
GDDR a=0.4 tau=4|4|mode=sync lr=0.2 tau_dynamic=false tau_init=4|--delay-fraction 0.4
GDDR a=0.4 tau=4, no fill|4|mode=sync lr=0.2 tau_dynamic=false tau_init=4 fill_held=false|--delay-fraction 0.4
ROWS
    ;;
    adam8) target adam8 "$a_common" <<'ROWS'
sync dense Adam|8|mode=sync kind=adam lr=0.001|
async dense Adam + AdaDelay|8|mode=async kind=adam lr=0.001 adadelay=0.1|
async GDDR a=0.4 Adam + AdaDelay|8|mode=async kind=adam lr=0.001 adadelay=0.1|--delay-fraction 0.4
async GDDR a=0.4 Adam + AdaDelay, m-hat fill|8|mode=async kind=adam lr=0.001 adadelay=0.1 async_fill=moment|--delay-fraction 0.4
async GDDR a=0.4 Adam + AdaDelay, random holds|8|mode=async kind=adam lr=0.001 adadelay=0.1|--delay-fraction 0.4 --opt hold_schedule=random
ROWS
    ;;
    *) echo "experiment-optim: unknown target $t (momentum, plain, adam8)" >&2; exit 2 ;;
  esac
done
