#!/usr/bin/env bash
# make deb (debhelper), then:
#   - the packages are gddr-ps, libgddr-client0, libgddr-client-dev,
#     python3-gddr and, when this build made the CUDA plugin,
#     libgddr-client0-cuda (Depends: libgddr-client0 of this version; its
#     Description names every CUDA library the plugin links);
#   - lintian reports no error and no warning on any of them (overrides only
#     in debian/*.lintian-overrides, each with its reason);
#   - libgddr-client0 has shlibs, symbols and the ldconfig trigger;
#   - they install with dpkg into a scratch root (a dpkg database of its own;
#     maintainer scripts run outside a chroot against stand-ins of
#     deb-systemd-helper, systemctl and py3compile that only log, so the
#     host is not touched): dpkg lists them as installed, the config is a
#     conffile, the unit runs /usr/bin/gddr-ps on /etc/gddr/gddr-ps.ini and
#     is neither enabled nor started, the library is in /usr/lib/<multiarch>/,
#     the manual pages render;
#   - that gddr-ps accepts its packaged config; client/examples/minimal.c
#     builds against the installed library with its documented command
#     (pkg-config) and trains through the installed gddr-ps;
#   - python3-gddr imports from the scratch root with GDDR_LIB unset, finds
#     libgddr-client0's library through the dynamic loader (LD_LIBRARY_PATH
#     standing in for ldconfig's cache) and pushes and pulls one tensor;
#     with the plugin package, the library loads the plugin from
#     /usr/lib/<multiarch>/gddr/ (a stand-in libcuda.so.1 makes it look).
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
aux=$(mktemp -d /tmp/gddr-debaux.XXXXXX)
pidf=$aux/ps.pid
cleanup() { stop_pid "$(cat "$pidf" 2> /dev/null || true)"; rm -rf "$root" "$aux"; }
trap cleanup EXIT
fail() { echo "$me: FAIL: $*" >&2; exit 1; }
unset GDDR_LIB
scripts/make-deb.sh "$BUILD" > "$aux/make-deb.log" 2>&1 || { cat "$aux/make-deb.log" >&2; fail "make-deb.sh"; }
version=$(sed -n 's/^VERSION *:= *//p' Makefile)
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
pkgs=(gddr-ps libgddr-client0 libgddr-client-dev python3-gddr)
# The CUDA plugin this configuration builds, as make-deb.sh asks for it.
plugin=$(make --no-print-directory -s plugin-path BUILD="$BUILD" 2> /dev/null)
[ -n "$plugin" ] && [ -f "$plugin" ] || plugin=
[ -z "$plugin" ] || pkgs+=(libgddr-client0-cuda)
debs=("$BUILD"/deb/*.deb)
[ "${#debs[@]}" = "${#pkgs[@]}" ] || fail "expected ${#pkgs[@]} packages (${pkgs[*]}), got: ${debs[*]}"
deb() { ls "$BUILD"/deb/"$1"_"$version"_*.deb 2> /dev/null || fail "no package $1"; }
for p in "${pkgs[@]}"; do deb "$p" > /dev/null; done

# lintian: no error, no warning (info and overridden tags aside).
if command -v lintian > /dev/null; then
  lintian --fail-on error,warning "${debs[@]}" > "$aux/lintian.log" 2>&1 || {
    cat "$aux/lintian.log" >&2; fail "lintian reports errors or warnings"; }
  if grep -E '^[EW]: ' "$aux/lintian.log" >&2; then fail "lintian reports errors or warnings"; fi
  echo "$me: lintian: no error, no warning on ${#debs[@]} packages"
else
  fail "lintian not found (scripts/install-deps.sh installs it)"
fi
lib0=$(deb libgddr-client0)
dpkg-deb -I "$lib0" triggers | grep -qx 'activate-noawait ldconfig' || fail "libgddr-client0 has no ldconfig trigger"
dpkg-deb -I "$lib0" shlibs | grep -q "^libgddr-client 0 libgddr-client0 (>= $version)$" || fail "libgddr-client0's shlibs"
dpkg-deb -I "$lib0" symbols | grep -q "^ gddr_step@GDDR_0 $version$" || fail "libgddr-client0's symbols"
if [ -n "$plugin" ]; then
  cuda=$(deb libgddr-client0-cuda)
  dpkg-deb -f "$cuda" Depends | grep -q "libgddr-client0 (= $version)" ||
    fail "libgddr-client0-cuda does not depend on libgddr-client0 (= $version): $(dpkg-deb -f "$cuda" Depends)"
  for so in $(objdump -p "$plugin" | awk '$1 == "NEEDED" && $2 ~ /^libcu/ { print $2 }'); do
    dpkg-deb -f "$cuda" Description | grep -qF "$so" || fail "libgddr-client0-cuda's Description does not name $so"
  done
fi

# Into a scratch root. Maintainer scripts run without chroot (the root has
# no shell), with stand-ins first on PATH for the commands they call.
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers" "$aux/stubs"
touch "$root/var/lib/dpkg/status"
for c in deb-systemd-helper deb-systemd-invoke systemctl py3compile py3clean pypy3compile pypy3clean; do
  # debian-installed and was-enabled answer as on a host that never had the unit.
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\ncase "$1" in debian-installed|was-enabled) exit 1 ;; esac\nexit 0\n' \
    "$c" "$aux" > "$aux/stubs/$c"
  chmod +x "$aux/stubs/$c"
done
: > "$aux/calls"
# Its dependencies are this host's packages, not the scratch root's.
PATH="$aux/stubs:$PATH" dpkg --root="$root" --log=/dev/null --force-depends --force-script-chrootless \
  -i "${debs[@]}" > "$aux/dpkg.log" 2>&1 || { cat "$aux/dpkg.log" >&2; fail "dpkg -i into the scratch root"; }
for p in "${pkgs[@]}"; do
  dpkg --root="$root" -s "$p" | grep -qx 'Status: install ok installed' || fail "$p is not installed"
done
dpkg --root="$root" -s gddr-ps | grep -q '^ /etc/gddr/gddr-ps.ini [0-9a-f]\{32\}$' ||
  fail "/etc/gddr/gddr-ps.ini is not a conffile of gddr-ps"
grep -q 'update-state gddr-ps.service' "$aux/calls" || fail "gddr-ps's postinst did not record the unit: $(cat "$aux/calls")"
if grep -Eq '(enable|start|restart)( |$)' "$aux/calls"; then fail "installing enabled or started the unit: $(cat "$aux/calls")"; fi
L=usr/lib/$ma
for f in usr/bin/gddr-ps usr/bin/gddr-ctl usr/bin/gddr-keygen usr/bin/gddr-train usr/bin/gddr-launch \
         "$L/libgddr-client.so.0" "$L/libgddr-client.so" "$L/libgddr-client.a" "$L/pkgconfig/gddr-client.pc" \
         usr/include/gddr/gddr.h usr/lib/python3/dist-packages/gddr/__init__.py \
         usr/share/doc/gddr-ps/copyright usr/share/doc/libgddr-client0/changelog.gz; do
  [ -e "$root/$f" ] || fail "/$f is not installed"
done
for f in usr/lib/libgddr-client.so.0 usr/lib/pkgconfig/gddr-client.pc usr/lib/python3/dist-packages/gddr/_install.py; do
  [ ! -e "$root/$f" ] || fail "/$f is installed (the library belongs in /$L; python3-gddr finds it through the loader)"
done
[ -z "$plugin" ] || [ -f "$root/$L/gddr/libgddr-cuda.so" ] || fail "/$L/gddr/libgddr-cuda.so is not installed"
for p in gddr-ps.1 gddr-ctl.1 gddr-train.1 gddr-keygen.1 gddr-launch.1 gddr-bench.1 gddr-ps.ini.5; do
  page=$root/usr/share/man/man${p##*.}/$p.gz
  [ -f "$page" ] || fail "/usr/share/man/man${p##*.}/$p.gz is not installed"
  LC_ALL=C.UTF-8 MANWIDTH=80 MANPAGER=cat timeout 30 man -l "$page" 2> /dev/null | grep -q "^NAME" ||
    fail "the installed $p does not render"
done
unit=$root/lib/systemd/system/gddr-ps.service
grep -qx 'ExecStart=/usr/bin/gddr-ps -c /etc/gddr/gddr-ps.ini' "$unit" || fail "the unit's ExecStart: $(grep ExecStart= "$unit")"
grep -q '/usr/local' "$unit" && fail "the packaged unit still names /usr/local"
diff <(grep -E '^[A-Z][A-Za-z]*=' config/gddr-ps.service | grep -Ev '^(Documentation|ExecStart|ExecStartPre)=') \
     <(grep -E '^[A-Z][A-Za-z]*=' "$unit" | grep -Ev '^(Documentation|ExecStart|ExecStartPre)=') > /dev/null ||
  fail "the packaged unit's settings differ from config/gddr-ps.service"
pc=$root/$L/pkgconfig/gddr-client.pc
grep -qx 'prefix=/usr' "$pc" && grep -qx "libdir=\${prefix}/lib/$ma" "$pc" || fail "the .pc's prefix or libdir: $(head -n 2 "$pc")"
out=$("$root/usr/bin/gddr-ps" -c "$root/etc/gddr/gddr-ps.ini" --check-config) || fail "the packaged config: $out"
# The example, against the installed library only.
export PKG_CONFIG_PATH="$root/$L/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
build_documented "$me" "$aux/minimal.d" client/examples/minimal.c client/examples/minimal.c
ep=$("$root/usr/bin/gddr-ps" -c "$root/etc/gddr/gddr-ps.ini" --listen 'tcp://127.0.0.1:*' --set lr=0.5 \
       --detach --pid-file "$pidf" 2> "$aux/ps.log") || { cat "$aux/ps.log" >&2; fail "the installed gddr-ps did not start"; }
res=$(LD_LIBRARY_PATH="$root/$L" timeout 60 "$aux/minimal.d/minimal" "$ep") || fail "minimal: $res"
libs=$(LD_LIBRARY_PATH="$root/$L" ldd "$aux/minimal.d/minimal")
grep -q "$root/$L/libgddr-client.so.0" <<< "$libs" || fail "minimal did not load the installed library: $libs"
grep -q 'max |w - 3| = 0$\|max |w - 3| = [0-9.e-]*$' <<< "$res" || fail "minimal said: $res"
# python3-gddr, from outside the repository, GDDR_LIB unset.
site=$root/usr/lib/python3/dist-packages
check=$PWD/scripts/check-python-package.py
py=$(cd "$aux" && PYTHONPATH="$site" LD_LIBRARY_PATH="$root/$L" timeout 60 /usr/bin/python3 "$check" "$ep" "$site" \
       "$root/$L/libgddr-client.so.0" 2>&1) || { echo "$py" >&2; fail "python3-gddr"; }
echo "$py"
if [ -n "$plugin" ]; then
  stand_in_cuda_driver "$aux/drv"
  py=$(cd "$aux" && PYTHONPATH="$site" LD_LIBRARY_PATH="$aux/drv:$root/$L" timeout 60 /usr/bin/python3 "$check" "$ep" \
         "$site" "$root/$L/libgddr-client.so.0" "$root/$L/gddr/libgddr-cuda.so" 2>&1) ||
    { echo "$py" >&2; fail "libgddr-client0-cuda: the plugin was not loaded from /$L/gddr/"; }
  echo "$py"
fi
stop_pid "$(cat "$pidf")"
echo "$me: OK (${#pkgs[@]} packages lintian-clean, installed by dpkg into a scratch root; unit and config in place, unit not enabled; C example and python3-gddr through the installed gddr-ps; $res)"
