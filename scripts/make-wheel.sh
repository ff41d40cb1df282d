#!/usr/bin/env bash
# make wheel: the gddr Python package as a wheel that carries its library,
# into $BUILD/wheel/gddr-VERSION-py3-none-PLATFORM.whl:
#
#   gddr/*.py                  python/gddr
#   gddr/libgddr-client.so.0   $BUILD/lib/libgddr-client.so, stripped
#   gddr/libgddr-cuda.so       the CUDA plugin, when this build made one
#                              (libgddr-client looks for it next to itself)
#
# gddr/_lib.py loads the library inside the package first (after GDDR_LIB),
# so `pip install --no-index build/wheel/gddr-*.whl` is all a user runs.
# The tag: py3 (ctypes, no extension module), none (no Python ABI), and
# this machine's platform (linux_x86_64): the library links the system's
# libzmq, libprotobuf-c and libinih (Debian: libzmq5, libprotobuf-c1,
# libinih1), so the wheel is for hosts that have them, not a manylinux one.
# Built offline by Debian's pip, setuptools and wheel (--no-build-isolation
# --no-index), from a copy under $BUILD/wheel-src.
#
#   scripts/make-wheel.sh [BUILD]      (BUILD: the build folder, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
me=make-wheel
PY=/usr/bin/python3
fail() { echo "$me: $*" >&2; exit 1; }
version=$(sed -n 's/^VERSION *:= *//p' Makefile)
pyversion=$(sed -n 's/^version = "\(.*\)"$/\1/p' python/pyproject.toml)
[ "$version" = "$pyversion" ] || fail "python/pyproject.toml says version $pyversion, the Makefile $version"
lib=$BUILD/lib/libgddr-client.so
[ -f "$lib" ] || fail "$lib not built (make)"
for m in pip setuptools wheel; do
  "$PY" -c "import $m" 2> /dev/null || fail "$PY lacks $m (scripts/install-deps.sh installs python3-$m)"
done
src=$BUILD/wheel-src
out=$BUILD/wheel
rm -rf "$src"
mkdir -p "$src/gddr" "$out"
cp python/pyproject.toml python/README.md "$src/"
cp python/gddr/*.py "$src/gddr/"
rm -f "$src/gddr/_install.py" # (make install's record, never in a wheel)
install -m 755 "$lib" "$src/gddr/libgddr-client.so.0"
strip --strip-unneeded "$src/gddr/libgddr-client.so.0"
plugin=
so=$(make --no-print-directory -s plugin-path BUILD="$BUILD" 2> /dev/null) # (empty: none built)
if [ -n "$so" ] && [ -f "$so" ]; then
  install -m 755 "$so" "$src/gddr/libgddr-cuda.so"
  strip --strip-unneeded "$src/gddr/libgddr-cuda.so"
  plugin=" and libgddr-cuda.so"
fi
plat=$("$PY" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
printf '[bdist_wheel]\npython_tag = py3\nplat_name = %s\n' "$plat" > "$src/setup.cfg"
whl=$out/gddr-$version-py3-none-$plat.whl
rm -f "$out"/gddr-*.whl
PIP_CONFIG_FILE=/dev/null "$PY" -m pip wheel --no-deps --no-build-isolation --no-index \
  --disable-pip-version-check -q -w "$out" "$src" > "$src/pip.log" 2>&1 ||
  { cat "$src/pip.log" >&2; fail "pip wheel failed"; }
[ -f "$whl" ] || fail "pip made $(ls "$out"), not $whl"
echo "$me: $whl (libgddr-client.so.0$plugin inside)"
