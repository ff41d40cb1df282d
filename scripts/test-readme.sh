#!/usr/bin/env bash
# Runs the README's "Running it by hand" block the way a reader pastes it:
# one bash, the lines in order, nothing waited for by hand. The only change
# is where its files go: /tmp/ becomes a scratch folder of this run (two
# runs at once must not share a pid file). Then checks what the block says
# it does: an endpoint came out, four workers trained and printed their
# result, the observer printed the accuracy of the server's model, status
# and metrics answered, and the kill stopped the server (pid file gone,
# "stopped:" with the pushes in the log).
set -euo pipefail
cd "$(dirname "$0")/.."
me=test-readme
tmp=$(mktemp -d /tmp/gddr-readme.XXXXXX)
cleanup() {
  # A block that failed half-way may have left its server running.
  if [ -s "$tmp/gddr-ps.pid" ]; then kill "$(cat "$tmp/gddr-ps.pid")" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
block=$(awk '/^## Running it by hand/ { sec = 1; next } /^## / { sec = 0 }
             sec && /^```sh$/ { on = 1; next } on && /^```/ { exit } on' README.md)
[ -n "$block" ] || { echo "$me: FAIL: README.md has no sh block under 'Running it by hand'" >&2; exit 1; }
printf '%s\n' "${block//\/tmp\//$tmp/}" > "$tmp/block.sh"
# The block's `make` is a nested one here: not part of this make's jobs.
if ! (unset MAKEFLAGS MAKELEVEL MFLAGS; timeout 600 bash -e "$tmp/block.sh") > "$tmp/out" 2>&1; then
  echo "$me: FAIL: the README block failed:" >&2
  tail -n 30 "$tmp/out" >&2
  exit 1
fi
fail() { echo "$me: FAIL: $*" >&2; tail -n 30 "$tmp/out" >&2; exit 1; }
results=$(grep -c '^RESULT rank=' "$tmp/out" || true)
[ "$results" = 4 ] || fail "expected 4 workers' RESULT lines, got $results"
server=$(grep '^RESULT server_model=1 ' "$tmp/out" || true)
[ "$(printf '%s' "$server" | grep -c .)" = 1 ] || fail "expected one RESULT of the server's model (gddr-train --evaluate)"
acc=$(printf '%s' "$server" | sed -n 's/.* test_accuracy=\([0-9.]*\).*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.70) }' ||
  fail "the server's model has test accuracy '$acc' after 5 epochs of softmax (want >= 0.70)"
grep -q 'live workers' "$tmp/out" || fail "gddr-ctl status printed no 'live workers'"
grep -qE '^gddr_pushes_total [1-9]' "$tmp/out" || fail "gddr-ctl metrics shows no pushes"
[ "$(grep -cE '^ +[0-3] +left +[1-9]' "$tmp/out")" = 4 ] || fail "gddr-ctl top does not show the 4 workers as left"
for _ in $(seq 100); do [ -e "$tmp/gddr-ps.pid" ] || break; sleep 0.1; done
[ ! -e "$tmp/gddr-ps.pid" ] || fail "the server did not stop after the block's kill"
grep -qE 'stopped: [1-9][0-9]* pushes' "$tmp/gddr-ps.log" || fail "the server log has no 'stopped: N pushes'"
echo "$me: OK (the 'Running it by hand' block ran as pasted: 4 workers, the server's model at $acc, status, metrics, top, a clean stop)"
