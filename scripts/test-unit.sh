#!/usr/bin/env bash
# Checks config/gddr-ps.service:
#  1. `systemd-analyze security --offline=yes` rates it 2.0 or lower (OK);
#  2. `systemd-analyze verify` finds nothing wrong (ExecStart pointed at this
#     build's gddr-ps, the only change);
#  3. gddr-ps does what the unit runs it for under the unit's own system-call
#     filter (scripts/unit-sandbox.py: SystemCallFilter=,
#     SystemCallArchitectures=, MemoryDenyWriteExecute=): --check-config,
#     training pushes, a requested checkpoint, SIGHUP, the final checkpoint
#     on SIGTERM (io_uring), and a restart that restores it; and, as the
#     control, that the same filter without io_uring_setup kills it.
# Skips with a reason where systemd-analyze or python3-seccomp is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
me=test-unit
unit=config/gddr-ps.service
BIN=${GDDR_BIN:-build/bin}
bar=2.0
if ! command -v systemd-analyze > /dev/null; then
  echo "$me: SKIP: systemd-analyze not found (package systemd): the unit's rating is not checked"
  exit 0
fi
rating=$(systemd-analyze security --offline=yes "$unit" 2>&1 | grep 'Overall exposure level' || true)
echo "$me: $rating"
level=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' <<< "$rating")
[ -n "$level" ] || { echo "$me: FAIL: systemd-analyze security gave no rating" >&2; exit 1; }
if ! awk -v l="$level" -v b="$bar" 'BEGIN { exit !(l + 0 <= b + 0) }'; then
  echo "$me: FAIL: $unit is rated $level, above $bar:" >&2
  systemd-analyze security --offline=yes "$unit" 2>&1 | grep '✗' >&2
  exit 1
fi

tmp=$(mktemp -d /tmp/gddr-unit.XXXXXX)
pid=
cleanup() { [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
sed "s#/usr/local/bin/gddr-ps#$PWD/$BIN/gddr-ps#g" "$unit" > "$tmp/gddr-ps.service"
if ! systemd-analyze verify "$tmp/gddr-ps.service" > "$tmp/verify" 2>&1; then
  echo "$me: FAIL: systemd-analyze verify $unit:" >&2
  cat "$tmp/verify" >&2
  exit 1
fi

if ! /usr/bin/python3 -c 'import seccomp' 2> /dev/null; then
  echo "$me: SKIP: python3-seccomp missing: gddr-ps is not run under the unit's filter"
  exit 0
fi
sandbox() { /usr/bin/python3 scripts/unit-sandbox.py "$unit" "$@"; }
ck=$tmp/ck
ps_args=(--listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/ep" --set checkpoint_dir="$ck"
         --set checkpoint_interval_s=0 --set lr=1 --set log_level=info)
fail() { echo "$me: FAIL: $*" >&2; for f in "$tmp"/ps*.log; do [ -e "$f" ] && sed "s|^|  $(basename "$f"): |" "$f" >&2; done; exit 1; }

# ExecStartPre.
out=$(sandbox -- "$BIN/gddr-ps" --check-config "${ps_args[@]}" 2>&1) || fail "--check-config under the filter: $out"
grep -q 'is valid' <<< "$out" || fail "--check-config said: $out"

# start: run gddr-ps under the filter in the background, wait for its endpoint.
start() {
  rm -f "$tmp/ep"
  # A simple command, not the function: $! is then the process that
  # becomes gddr-ps (the sandbox execs it), and the signals reach it.
  /usr/bin/python3 scripts/unit-sandbox.py "$unit" "$@" -- "$BIN/gddr-ps" "${ps_args[@]}" \
    2> "$tmp/ps$n.log" &
  pid=$!
  for _ in $(seq 100); do [ -s "$tmp/ep" ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  [ -s "$tmp/ep" ] || fail "gddr-ps $n did not start under the filter"
}
# stop: SIGTERM, the final checkpoint, exit 0.
stop() {
  kill -TERM "$pid"
  for _ in $(seq 300); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  local rc=0
  kill -0 "$pid" 2> /dev/null && fail "gddr-ps $n did not stop within 30 s of SIGTERM"
  wait "$pid" || rc=$?
  pid=
  [ "$rc" = 0 ] || fail "gddr-ps $n exited with $rc on SIGTERM (159 = killed by the filter)"
  grep -q 'final checkpoint [0-9]* written' "$tmp/ps$n.log" || fail "gddr-ps $n wrote no final checkpoint"
}
# client PUSHES: one worker registers unit.w (8 zeros), pushes a gradient of
# 0.5 that many times (lr 1), and prints the version and values it pulls.
client() {
  PYTHONPATH=python GDDR_BIN="$BIN" timeout 60 /usr/bin/python3 - "$(cat "$tmp/ep")" "$1" <<'PY'
import sys
import numpy as np
import gddr
with gddr.Client(sys.argv[1], rank=0, world_size=1) as c:
    w = np.zeros(8, np.float32)
    c.register("unit.w", w)
    for _ in range(int(sys.argv[2])):
        c.push("unit.w", np.full(8, 0.5, np.float32))
    c.pull("unit.w", w)
    print("version=%d values=%s" % (c.version("unit.w"), ",".join("%g" % v for v in w)))
PY
}

n=1
start
got=$(client 3) || fail "the client failed against the filtered server"
[ "$got" = "version=3 values=-1.5,-1.5,-1.5,-1.5,-1.5,-1.5,-1.5,-1.5" ] || fail "first run: $got"
"$BIN/gddr-ctl" -s "$(cat "$tmp/ep")" checkpoint > /dev/null || fail "gddr-ctl checkpoint"
for _ in $(seq 100); do grep -q 'ckpt-.*written' "$tmp/ps1.log" && break; sleep 0.1; done
grep -q 'ckpt-.*written' "$tmp/ps1.log" || fail "the requested checkpoint was not written"
kill -HUP "$pid"
for _ in $(seq 100); do grep -q 'SIGHUP: reloaded\|SIGHUP: no config' "$tmp/ps1.log" && break; sleep 0.1; done
kill -0 "$pid" 2> /dev/null || fail "gddr-ps died on SIGHUP"
stop

n=2
start
got=$(client 0) || fail "the client failed against the restarted server"
[ "$got" = "version=3 values=-1.5,-1.5,-1.5,-1.5,-1.5,-1.5,-1.5,-1.5" ] ||
  fail "after the restart the server holds $got, not what it checkpointed"
grep -q 'restored checkpoint' "$tmp/ps2.log" || fail "the restart restored no checkpoint"
stop

# The control: without io_uring_setup the filter kills the daemon when it
# writes a checkpoint, so the runs above did exercise io_uring.
n=3
start --deny io_uring_setup
# (The daemon may be killed before its answer leaves: the request is taken,
# then the checkpoint starts in the same loop turn. Only its death counts.)
"$BIN/gddr-ctl" -s "$(cat "$tmp/ep")" checkpoint > /dev/null 2>&1 || true
for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2> /dev/null; then fail "without io_uring_setup gddr-ps still runs after a checkpoint: is the filter applied?"; fi
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 159 ] || fail "without io_uring_setup gddr-ps exited $rc, not 159 (SIGSYS)"
echo "$me: OK ($unit rated $level <= $bar; verify clean; under its filter gddr-ps checks its config," \
     "trains, checkpoints through io_uring, reloads, stops and restores; without io_uring it is killed)"
