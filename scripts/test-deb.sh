#!/usr/bin/env bash
# make deb, then: the packages install with dpkg into a scratch root (a
# dpkg database of its own; the host is not touched), dpkg lists them as
# installed with the config as a conffile, the unit runs /usr/bin/gddr-ps on
# /etc/gddr/gddr-ps.ini, that gddr-ps accepts its packaged config, and
# client/examples/minimal.c builds against the installed library with its
# documented command (pkg-config) and trains through the installed gddr-ps.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
me=test-deb
BUILD=$(dirname "${GDDR_BIN:-build/bin}")
for t in dpkg dpkg-deb; do
  command -v "$t" > /dev/null || { echo "$me: SKIP: $t not found (not a Debian system)"; exit 0; }
done
root=$(mktemp -d /tmp/gddr-debroot.XXXXXX)
pidf=$root/ps.pid
cleanup() { stop_pidfile "$pidf"; rm -rf "$root"; }
trap cleanup EXIT
fail() { echo "$me: FAIL: $*" >&2; exit 1; }
scripts/make-deb.sh "$BUILD" > "$root/make-deb.log" || { cat "$root/make-deb.log" >&2; fail "make-deb.sh"; }
debs=("$BUILD"/deb/*.deb)
[ "${#debs[@]}" = 3 ] || fail "expected 3 packages, got: ${debs[*]}"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
touch "$root/var/lib/dpkg/status"
# Its dependencies are this host's packages, not the scratch root's.
dpkg --root="$root" --log=/dev/null --force-depends -i "${debs[@]}" > "$root/dpkg.log" 2>&1 ||
  { cat "$root/dpkg.log" >&2; fail "dpkg -i into the scratch root"; }
for p in gddr-ps libgddr-client0 libgddr-client-dev; do
  dpkg --root="$root" -s "$p" | grep -qx 'Status: install ok installed' || fail "$p is not installed"
done
dpkg --root="$root" -s gddr-ps | grep -q '^ /etc/gddr/gddr-ps.ini [0-9a-f]\{32\}$' ||
  fail "/etc/gddr/gddr-ps.ini is not a conffile of gddr-ps"
for f in usr/bin/gddr-ps usr/bin/gddr-ctl usr/bin/gddr-keygen usr/lib/libgddr-client.so.0 \
         usr/lib/libgddr-client.so usr/include/gddr/gddr.h usr/lib/pkgconfig/gddr-client.pc; do
  [ -e "$root/$f" ] || fail "/$f is not installed"
done
unit=$root/lib/systemd/system/gddr-ps.service
grep -qx 'ExecStart=/usr/bin/gddr-ps -c /etc/gddr/gddr-ps.ini' "$unit" || fail "the unit's ExecStart: $(grep ExecStart= "$unit")"
grep -q '/usr/local' "$unit" && fail "the packaged unit still names /usr/local"
grep -qx 'prefix=/usr' "$root/usr/lib/pkgconfig/gddr-client.pc" || fail "the .pc's prefix is not /usr"
out=$("$root/usr/bin/gddr-ps" -c "$root/etc/gddr/gddr-ps.ini" --check-config) || fail "the packaged config: $out"
# The example, against the installed library only.
export PKG_CONFIG_PATH="$root/usr/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
build_documented "$me" "$root/minimal.d" client/examples/minimal.c client/examples/minimal.c
ep=$("$root/usr/bin/gddr-ps" -c "$root/etc/gddr/gddr-ps.ini" --listen 'tcp://127.0.0.1:*' --set lr=0.5 \
       --detach --pid-file "$pidf" 2> "$root/ps.log") || { cat "$root/ps.log" >&2; fail "the installed gddr-ps did not start"; }
res=$(LD_LIBRARY_PATH="$root/usr/lib" timeout 60 "$root/minimal.d/minimal" "$ep") || fail "minimal: $res"
libs=$(LD_LIBRARY_PATH="$root/usr/lib" ldd "$root/minimal.d/minimal")
grep -q "$root/usr/lib/libgddr-client.so.0" <<< "$libs" || fail "minimal did not load the installed library: $libs"
grep -q 'max |w - 3| = 0$\|max |w - 3| = [0-9.e-]*$' <<< "$res" || fail "minimal said: $res"
kill "$(cat "$pidf")"
echo "$me: OK (3 packages installed by dpkg into a scratch root; unit and config in place; $res)"
