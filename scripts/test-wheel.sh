#!/usr/bin/env bash
# make wheel, then: the wheel is named gddr-VERSION-py3-none-PLATFORM.whl
# and carries gddr/*.py, gddr/libgddr-client.so.0 and, when this build made
# the CUDA plugin, gddr/libgddr-cuda.so; pip installs it offline (--no-index)
# into a fresh venv that sees Debian's numpy; from a folder outside the
# repository, with GDDR_LIB unset, `import gddr` loads the library inside
# the installed package and pushes and pulls one tensor through a gddr-ps
# of this build (scripts/check-python-package.py); with the plugin, the
# library loads the plugin inside the package too (a stand-in libcuda.so.1
# makes it look for one on a host without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
me=test-wheel
BIN=${GDDR_BIN:-build/bin}
BUILD=$(dirname "$BIN")
PY=/usr/bin/python3
tmp=$(mktemp -d /tmp/gddr-wheel.XXXXXX)
pidf=$tmp/ps.pid
cleanup() { stop_pid "$(cat "$pidf" 2> /dev/null || true)"; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "$me: FAIL: $*" >&2; exit 1; }
unset GDDR_LIB
scripts/make-wheel.sh "$BUILD" > "$tmp/make-wheel.log" 2>&1 || { cat "$tmp/make-wheel.log" >&2; fail "make-wheel.sh"; }
version=$(sed -n 's/^VERSION *:= *//p' Makefile)
plat=$("$PY" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
whl=$BUILD/wheel/gddr-$version-py3-none-$plat.whl
[ -f "$whl" ] || fail "no $whl: $(ls "$BUILD/wheel")"
want="gddr/__init__.py gddr/_lib.py gddr/client.py gddr/libgddr-client.so.0"
plugin=0
p=$(make --no-print-directory -s plugin-path BUILD="$BUILD" 2> /dev/null)
[ -n "$p" ] && [ -f "$p" ] && { want+=" gddr/libgddr-cuda.so"; plugin=1; }
list=$("$PY" -m zipfile -l "$whl" | awk 'NR > 1 { print $1 }')
for f in $want; do grep -qx "$f" <<< "$list" || fail "$whl lacks $f"; done
grep -q '_install.py' <<< "$list" && fail "$whl carries make install's _install.py"
if [ "$plugin" = 0 ] && grep -q 'libgddr-cuda' <<< "$list"; then fail "$whl carries a plugin this build did not make"; fi
# A venv that sees Debian's numpy (and pip), the wheel installed offline.
"$PY" -m venv --system-site-packages --without-pip "$tmp/venv"
(cd "$tmp" && PIP_CONFIG_FILE=/dev/null timeout 120 "$tmp/venv/bin/python" -m pip install --no-index \
   --disable-pip-version-check -q "$OLDPWD/$whl") > "$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log" >&2; fail "pip install --no-index $whl"; }
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -f "$site/gddr/libgddr-client.so.0" ] || fail "pip did not install gddr/libgddr-client.so.0 into $site"
ep=$("$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --set lr=0.5 --detach --pid-file "$pidf" 2> "$tmp/ps.log") ||
  { cat "$tmp/ps.log" >&2; fail "gddr-ps did not start"; }
check=$PWD/scripts/check-python-package.py
out=$(cd "$tmp" && timeout 60 "$tmp/venv/bin/python" "$check" "$ep" "$site" "$site/gddr/libgddr-client.so.0" 2>&1) ||
  { echo "$out" >&2; fail "the installed wheel"; }
echo "$out"
if [ "$plugin" = 1 ]; then
  # A stand-in NVIDIA driver: the library then searches for its plugin.
  stand_in_cuda_driver "$tmp/drv"
  out=$(cd "$tmp" && LD_LIBRARY_PATH="$tmp/drv" timeout 60 "$tmp/venv/bin/python" "$check" "$ep" "$site" \
          "$site/gddr/libgddr-client.so.0" "$site/gddr/libgddr-cuda.so" 2>&1) ||
    { echo "$out" >&2; fail "the wheel's CUDA plugin"; }
  echo "$out"
fi
stop_pid "$(cat "$pidf")"
echo "$me: OK ($(basename "$whl") installed by pip --no-index into a venv; import gddr found its own library$([ "$plugin" = 1 ] && echo " and plugin"))"
