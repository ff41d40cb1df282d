#!/usr/bin/env bash
# Installs GDDR into a scratch DESTDIR, builds client/examples/minimal.c with
# nothing but pkg-config against it, and trains it through the installed
# gddr-ps. Proves `make install` gives users a library they can link.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$(mktemp -d /tmp/gddr-install.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$stage"; }
trap cleanup EXIT
make --no-print-directory install PREFIX=/usr/local DESTDIR="$stage" > "$stage/install.log"
prefix="$stage/usr/local"
for f in bin/gddr-ps bin/gddr-train bin/gddr-ctl lib/libgddr-client.a lib/libgddr-client.so \
         include/gddr/gddr.h lib/pkgconfig/gddr-client.pc; do
  [ -e "$prefix/$f" ] || { echo "test-install: FAIL: $f was not installed" >&2; exit 1; }
done
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$stage"
cc client/examples/minimal.c $(pkg-config --cflags --libs gddr-client) -lm \
   -Wl,-rpath,"$prefix/lib" -o "$stage/minimal"
"$prefix/bin/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$stage/ep" --set lr=0.5 \
   2> "$stage/ps.log" &
pid=$!
for _ in $(seq 100); do [ -s "$stage/ep" ] && break; sleep 0.1; done
out=$(timeout 60 "$stage/minimal" "$(cat "$stage/ep")")
echo "$out"
grep -q 'max |w - 3| = ' <<< "$out"
echo "test-install: OK (installed, linked with pkg-config, trained through the installed gddr-ps)"
