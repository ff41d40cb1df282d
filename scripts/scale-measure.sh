#!/usr/bin/env bash
# Measures the per-step CPU constants of scripts/scalesim.py on this host
# (docs/scale.md, "Constants"): builds scripts/scale-measure.c against this
# build's libgddr-client, starts one gddr-ps (async or sync, 1 worker, the
# default 2 apply threads) on 127.0.0.1, and prints one SCALE line per
# configuration: dense, GDDR alpha 0.4, 8-bit delta pulls, both; at 4 KiB
# (the fixed cost of a message) and at 16 MiB (the per-byte costs).
#
# Usage: scripts/scale-measure.sh [--reps R] [--mode async|sync]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=3 mode=async
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    *) echo "usage: $0 [--reps R] [--mode async|sync]" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d /tmp/gddr-scale.XXXXXX)
trap 'kill "$(cat "$tmp/ps.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$tmp"' EXIT
# build/lib has the library without its soname link: one in $tmp
ln -s "$PWD/build/lib/libgddr-client.so" "$tmp/libgddr-client.so.0"
cc -O2 -o "$tmp/m" scripts/scale-measure.c -Iclient/include -Lbuild/lib -lgddr-client \
   -Wl,-rpath,"$tmp"
ep=$(build/bin/gddr-ps --listen 'tcp://127.0.0.1:*' --detach --pid-file "$tmp/ps.pid" \
       --set mode="$mode" --set workers=1 --set lr=0.01 2> "$tmp/ps.log")
pid=$(cat "$tmp/ps.pid")
for _ in $(seq "$reps"); do
  for cfg in "0 0" "0.4 0" "0 8" "0.4 8"; do   # alpha, pull delta bits
    read -r alpha bits <<< "$cfg"
    "$tmp/m" "$ep" "$pid" 1024 2000 "$alpha" "$bits"
    "$tmp/m" "$ep" "$pid" 4194304 20 "$alpha" "$bits"
  done
done
