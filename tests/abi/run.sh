#!/usr/bin/env bash
# tests/abi/run.sh -- the ABI test (make check runs it; alone: make abi-check).
# Compiles tests/abi/old_client.c against the public headers of the first
# gddr.h (tests/abi/v0/, as of commit ce729db) and links it with this
# build's libgddr-client; compiles tests/abi/future_client.c against
# today's gddr.h with a struct one field larger than the library's; runs
# both against a gddr-ps on 127.0.0.1 with an OS-chosen port (sgd, lr 0.5),
# each bounded by a timeout; stops the server.
set -euo pipefail
cd "$(dirname "$0")/../.."
me=abi
BIN=${GDDR_BIN:-build/bin}
LIB=$(dirname "$BIN")/lib
fail() { echo "$me: FAIL: $*" >&2; exit 1; }
[ -x "$BIN/gddr-ps" ] && [ -f "$LIB/libgddr-client.so" ] || fail "run make first ($BIN/gddr-ps, $LIB/libgddr-client.so)"
tmp=$(mktemp -d /tmp/gddr-abi.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# The library under its soname, as an installed one would be found.
ln -s "$(realpath "$LIB/libgddr-client.so")" "$tmp/libgddr-client.so.0"
CC=${CC:-cc}
# Only tests/abi/v0 on the include path: the old header, not today's.
$CC -std=gnu11 -O2 -Wall -Wextra -Werror -I tests/abi/v0 tests/abi/old_client.c \
  "$tmp/libgddr-client.so.0" -Wl,-rpath,"$tmp" -o "$tmp/old_client" || fail "cannot build old_client.c"
$CC -std=gnu11 -O2 -Wall -Wextra -Werror -I client/include tests/abi/future_client.c \
  "$tmp/libgddr-client.so.0" -Wl,-rpath,"$tmp" -o "$tmp/future_client" || fail "cannot build future_client.c"
"$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/ep" --set lr=0.5 2> "$tmp/ps.log" &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/ep" ] && break; sleep 0.1; done
[ -s "$tmp/ep" ] || { cat "$tmp/ps.log" >&2; fail "gddr-ps wrote no endpoint within 10 s"; }
ep=$(cat "$tmp/ep")
timeout 60 "$tmp/old_client" "$ep" "$tmp/client.ini" || { cat "$tmp/ps.log" >&2; fail "old_client"; }
timeout 60 "$tmp/future_client" "$ep" || { cat "$tmp/ps.log" >&2; fail "future_client"; }
echo "$me: OK (a program built against the first gddr.h runs on this library; a newer struct is refused)"
