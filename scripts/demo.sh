#!/usr/bin/env bash
# The main job: gddr-ps and 4 gddr-train workers train softmax regression on
# Fashion-MNIST in async mode, then a summary table (scripts/launch-local.sh
# runs them). With --servers S the model is sharded over S servers.
#
#   scripts/demo.sh [--servers S] [--workers N] [--workload softmax|mlp] [--epochs E]
#                   [--mode async|sync|ssp] [--lr LR]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
servers=1 workers=4 workload=softmax epochs=10 mode=async lr=0.1
while [ $# -gt 0 ]; do
  case "$1" in
    --servers) servers=$2; shift 2 ;;
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
result=$(mktemp /tmp/gddr-demo.XXXXXX)
trap 'rm -f "$result"' EXIT
echo "== mode $mode, lr $lr, $workload, $epochs epochs per worker"
scripts/launch-local.sh --set mode="$mode" --set lr="$lr" --result "$result" \
  "$servers" "$workers" --workload "$workload" --epochs "$epochs"
final=$(cat "$result")
server_acc=$(field test_accuracy "$final")
if awk -v m="$server_acc" 'BEGIN { exit !(m + 0 >= 0.80) }'; then
  echo "demo: OK, the model gddr-ps keeps scores $server_acc on the 10,000 test images (>= 0.80)"
else
  echo "demo: FAILED, the server's final model scores $server_acc < 0.80" >&2
  exit 1
fi
