#!/usr/bin/env bash
# Checks scripts/lib.sh's wait_workers, the progress loop of launch-local
# (make demo) and demo-python: each worker's newest progress line is shown
# when it is new, and a finished worker's last line is not printed again
# while the others run on; a failed worker is reported with its log tail.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
me=test-lib
tmp=$(mktemp -d /tmp/gddr-lib.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# Worker 0 says one line and ends; worker 1 says three, the last one after
# several rounds of the loop (0.1 s each), then ends.
( echo "[rank 0] epoch 1 done" > "$tmp/worker0.log" ) &
p0=$!
( echo "[rank 1] epoch 1" > "$tmp/worker1.log"; sleep 0.5; echo "[rank 1] epoch 2" >> "$tmp/worker1.log"
  sleep 0.5; echo "[rank 1] epoch 3 done" >> "$tmp/worker1.log"; sleep 0.3 ) &
p1=$!
wait_workers "$me" "$tmp" 0.1 "$p0" "$p1" > "$tmp/out"
for line in "[rank 0] epoch 1 done" "[rank 1] epoch 1" "[rank 1] epoch 2" "[rank 1] epoch 3 done"; do
  n=$(grep -cxF "  $line" "$tmp/out" || true)
  [ "$n" = 1 ] || { echo "$me: FAIL: '$line' printed $n times, not once:" >&2; cat "$tmp/out" >&2; exit 1; }
done
[ "$(wc -l < "$tmp/out")" = 4 ] || { echo "$me: FAIL: extra lines:" >&2; cat "$tmp/out" >&2; exit 1; }
# A failing worker: status 1, its log tail on stderr.
( echo "[rank 0] boom" > "$tmp/worker0.log"; exit 3 ) &
p0=$!
if wait_workers "$me" "$tmp" 0.1 "$p0" > /dev/null 2> "$tmp/err"; then
  echo "$me: FAIL: a worker that exited 3 was not reported" >&2; exit 1
fi
grep -q "worker 0 failed" "$tmp/err" && grep -q "boom" "$tmp/err" ||
  { echo "$me: FAIL: no log tail for the failed worker:" >&2; cat "$tmp/err" >&2; exit 1; }
echo "$me: OK (wait_workers prints each progress line once, and reports a failed worker)"
