#!/usr/bin/env bash
# libgddr-client against a lying server: tests/fuzz/client_driver.c (a
# trainer's calls, every error ignored) runs against tests/fuzz/
# lying_server.py (replies a gddr-ps never sends) for each seed. Fails when
# the driver exits non-zero, hangs (a bounded wait), or, with --asan,
# AddressSanitizer reports anything. It found a pull in overlapping parts
# joined past a tensor's end and a changed chunk overrunning the residual
# (python/tests/test_lying_server.py replays both).
#
#   scripts/fuzz-client.sh                     one seed, 20 s, this build (make check)
#   scripts/fuzz-client.sh --asan --seeds "1 2 3 4 5 6" --seconds 40
#   scripts/fuzz-client.sh --asan --shards 2   a sharded client against two liars
#
# --asan builds the library with `make SANITIZER=address` (build/address)
# first (a few minutes the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
me=fuzz-client
seeds=1 seconds=20 asan=0 shards=1
while [ $# -gt 0 ]; do
  case $1 in
    --seeds) seeds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --asan) asan=1; shift ;;
    --shards) shards=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "$me: unknown option $1" >&2; exit 2 ;;
  esac
done
build=${GDDR_BIN:-build/bin}; build=${build%/bin}
san=()
if [ "$asan" = 1 ]; then
  build=build/address san=(-fsanitize=address -fno-omit-frame-pointer)
  (unset MAKEFLAGS MAKELEVEL MFLAGS; make -s SANITIZER=address "$build/lib/libgddr-client-cpu.a")
fi
lib=$build/lib/libgddr-client-cpu.a
[ -f "$lib" ] || { echo "$me: $lib is missing: build first (make)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/gddr-fuzz-client.XXXXXX)
server_pids=()
cleanup() { for p in "${server_pids[@]}"; do stop_pid "$p"; done; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
# shellcheck disable=SC2046
cc -g -O1 "${san[@]}" -Wall -Werror -I client/include tests/fuzz/client_driver.c "$lib" \
  $(pkg-config --libs libzmq libprotobuf-c inih) -lz -lm -pthread -ldl -o "$tmp/driver"
status=0
for seed in $seeds; do
  server_pids=() eps=""
  for ((i = 0; i < shards; i++)); do
    rm -f "$tmp/ep$i"
    /usr/bin/python3 tests/fuzz/lying_server.py "$((seed + 1000 * i))" "$seconds" "$tmp/ep$i" \
      > "$tmp/server$i.log" 2>&1 &
    server_pids+=($!)
    wait_file "$tmp/ep$i" 30 ||
      { echo "$me: the lying server did not start:" >&2; cat "$tmp/server$i.log" >&2; exit 1; }
    eps+="${eps:+,}$(cat "$tmp/ep$i")"
  done
  # The driver stops a few seconds before the servers do.
  rc=0
  ASAN_OPTIONS=detect_leaks=0 timeout $((seconds + 120)) "$tmp/driver" "$eps" \
    $((seconds > 5 ? seconds - 3 : 2)) > "$tmp/driver.log" 2>&1 || rc=$?
  liar=0
  for p in "${server_pids[@]}"; do wait "$p" || liar=1; done
  server_pids=()
  if [ "$liar" = 1 ]; then
    # A liar that died early leaves the driver nobody to talk to: no test.
    echo "$me: FAIL: seed $seed: a lying server failed:" >&2
    tail -n 20 "$tmp"/server*.log >&2
    status=1
    continue
  fi
  if grep -q "ERROR: AddressSanitizer" "$tmp/driver.log"; then
    echo "$me: FAIL: seed $seed: AddressSanitizer:" >&2
    grep -A 20 "ERROR: AddressSanitizer" "$tmp/driver.log" | head -n 30 >&2
    status=1
  elif [ "$rc" -ne 0 ]; then
    echo "$me: FAIL: seed $seed: the driver exited with $rc:" >&2
    tail -n 20 "$tmp/driver.log" >&2
    status=1
  else
    echo "$me: seed $seed: $(tail -n 1 "$tmp/driver.log"); $(tail -n 1 "$tmp/server0.log")"
  fi
done
[ "$status" = 0 ] && echo "$me: OK (seeds $seeds, ${seconds} s each, $shards server(s)$([ "$asan" = 1 ] && echo ', AddressSanitizer'))"
exit "$status"
