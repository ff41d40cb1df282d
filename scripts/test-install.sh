#!/usr/bin/env bash
# Installs GDDR (the manual pages too) into a scratch DESTDIR, builds client/examples/minimal.c with
# exactly the command its comment gives (pkg-config against the install) and
# trains it through the installed gddr-ps; compiles every C block of
# README.md and docs/*.md with the `cc ...` command in its first comment;
# then the installed gddr Python package trains too. Proves `make install`
# gives users a library they can link and a package they can import, and
# that what the docs tell them to compile compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$(mktemp -d /tmp/gddr-install.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$stage"; }
trap cleanup EXIT
make --no-print-directory install PREFIX=/usr/local DESTDIR="$stage" > "$stage/install.log"
prefix="$stage/usr/local"
for f in bin/gddr-ps bin/gddr-train bin/gddr-ctl bin/gddr-launch share/gddr/lib.sh lib/libgddr-client.a lib/libgddr-client.so \
         include/gddr/gddr.h include/gddr/gddr_base.h lib/pkgconfig/gddr-client.pc share/man/man1/gddr-ps.1 \
         share/man/man5/gddr-ps.ini.5; do
  [ -e "$prefix/$f" ] || { echo "test-install: FAIL: $f was not installed" >&2; exit 1; }
done
# The shared library exports exactly the functions of the public headers
# (gddr.h and the common/gddr_base.h it includes).
exported=$(nm -D --defined-only "$prefix/lib/libgddr-client.so" | awk '$2 == "T" { print $3 }' |
           sed 's/@.*//' | sort -u)
# (static inline wrappers of the header, e.g. gddr_table_register passing
# its struct's size, are the caller's code: not exported.)
inline=$(cat client/include/gddr/gddr.h common/gddr_base.h | grep -A1 'static inline' |
         grep -oE '\bgddr_[a-z0-9_]+\(' | tr -d '(' | sort -u)
declared=$(cat client/include/gddr/gddr.h common/gddr_base.h | grep -oE '\bgddr_[a-z0-9_]+\(' | tr -d '(' |
           sort -u | comm -23 - <(echo "$inline"))
if [ "$exported" != "$declared" ]; then
  echo "test-install: FAIL: libgddr-client.so exports other functions than gddr.h declares:" >&2
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  exit 1
fi
# No CUDA library is linked by the client library or any program: CUDA
# lives in the plugin libgddr-cuda.so only, which a CUDA build installs next
# to libgddr-client.so and which exports its entry point and nothing else.
for f in lib/libgddr-client.so bin/gddr-ps bin/gddr-train bin/gddr-ctl bin/gddr-keygen bin/gddr-bench; do
  if ldd "$prefix/$f" | grep -Eiq 'libcudart|libcublas|libcuda\.|libnvrtc'; then
    echo "test-install: FAIL: $f links a CUDA library:" >&2
    ldd "$prefix/$f" | grep -Ei 'cuda|cublas|nvrtc' >&2
    exit 1
  fi
done
if grep -q 'libgddr-cuda.so' "$stage/install.log"; then
  plugin="$prefix/lib/libgddr-cuda.so"
  [ -e "$plugin" ] || { echo "test-install: FAIL: the CUDA plugin was not installed" >&2; exit 1; }
  plugin_syms=$(nm -D --defined-only "$plugin" | awk '$2 == "T" { print $3 }' | sed 's/@.*//')
  if [ "$plugin_syms" != "gddr_cuda_plugin_entry" ]; then
    echo "test-install: FAIL: libgddr-cuda.so exports more than its entry point:" >&2
    echo "$plugin_syms" >&2
    exit 1
  fi
  echo "test-install: libgddr-cuda.so installed next to libgddr-client.so; no program links CUDA"
fi
# pkg-config finds the scratch install as it would find PREFIX's.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$stage"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
build() { build_documented test-install "$@"; }
build "$stage/minimal.d" client/examples/minimal.c client/examples/minimal.c
nblocks=0
for doc in README.md docs/*.md; do
  i=0
  while IFS= read -r -d '' block; do
    i=$((i + 1)) nblocks=$((nblocks + 1))
    printf '%s' "$block" > "$stage/block.c"
    build "$stage/doc$nblocks" "$stage/block.c" "$doc C block $i"
  done < <(awk '/^```c$/ { on = 1; next } /^```/ && on { on = 0; printf "%c", 0; next } on' "$doc")
done
[ "$nblocks" -ge 1 ] || { echo "test-install: FAIL: no C block found in README.md" >&2; exit 1; }
"$prefix/bin/gddr-ps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$stage/ep" --set lr=0.5 \
   2> "$stage/ps.log" &
pid=$!
for _ in $(seq 100); do [ -s "$stage/ep" ] && break; sleep 0.1; done
out=$(LD_LIBRARY_PATH="$prefix/lib" timeout 60 "$stage/minimal.d/minimal" "$(cat "$stage/ep")")
echo "$out"
grep -q 'max |w - 3| = ' <<< "$out"
# The Python package: installed where python3 looks under PREFIX, and
# pointing at PREFIX/lib (here under DESTDIR, hence GDDR_LIB).
site=$(find "$prefix/lib" -maxdepth 3 -type d -name dist-packages | head -n 1)
[ -f "$site/gddr/__init__.py" ] || { echo "test-install: FAIL: the gddr package was not installed" >&2; exit 1; }
grep -q "LIBDIR = \"/usr/local/lib\"" "$site/gddr/_install.py" ||
  { echo "test-install: FAIL: gddr/_install.py does not name /usr/local/lib" >&2; exit 1; }
pyout=$(cd "$stage" && PYTHONPATH="$site" GDDR_LIB="$prefix/lib" timeout 60 /usr/bin/python3 - "$(cat "$stage/ep")" <<'PY'
import sys
import numpy as np
import gddr
assert "/dist-packages/gddr/" in gddr.__file__, gddr.__file__  # the installed copy
with gddr.Client(sys.argv[1], rank=0, world_size=1) as c:
    w = np.zeros(1000, np.float32)
    c.register("minimal.py.w", w)
    c.pull("minimal.py.w", w)
    for _ in range(100):
        c.step([w - np.float32(3.0)], [w])
print("minimal.py: %s, max |w - 3| = %.3g" % (gddr.library_path, float(np.abs(w - 3).max())))
assert np.abs(w - 3).max() < 1e-3
PY
)
echo "$pyout"
grep -q "^minimal.py: $prefix/lib/libgddr-client.so" <<< "$pyout"
# The launcher as a command: 2 servers, 2 workers, from outside the
# repository, the installed programs only.
lout=$(cd "$stage" && PATH="$prefix/bin:/usr/bin:/bin" gddr-launch 2 2 --workload softmax \
         --synthetic 600 --steps 8 --quiet 2>&1) || { echo "test-install: FAIL: gddr-launch:" >&2; echo "$lout" >&2; exit 1; }
grep -qE "servers' final model \(version [1-9][0-9]*\): test accuracy (0\.[0-9]+|1\.0+)$" <<< "$lout" || {
  echo "test-install: FAIL: gddr-launch printed no final model:" >&2; echo "$lout" >&2; exit 1; }
echo "gddr-launch: $(grep "servers' final model" <<< "$lout")"
echo "test-install: OK (installed, linked with pkg-config, trained through the installed gddr-ps from C and Python, gddr-launch)"
