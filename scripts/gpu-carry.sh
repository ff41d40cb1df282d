#!/usr/bin/env bash
# Gathers what a GPU machine that can install no packages needs to run
# scripts/gpu-check.sh on the build made here (nvcc of the same CUDA major
# version as that machine's driver and libraries): the shared libraries the
# build links, other than glibc's own, the C++ runtime and CUDA's (that
# machine has its own), copied into .gpu/lib, which git ignores.
#
#   scripts/gpu-carry.sh             # after `make` with nvcc found
#
# Then, on the GPU machine, with build/bin, build/lib, build/tests and .gpu
# carried beside the working tree:
#
#   LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 GPU_CHECK_PREBUILT=1 \
#     GPU_CHECK_PY=python3 scripts/gpu-check.sh
#
# (docs/performance.md, "The CUDA kernels", has the first run done so.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -e build/lib/libgddr-cuda.so ] || { echo "gpu-carry: no build/lib/libgddr-cuda.so (make with nvcc first)" >&2; exit 1; }
gd=$(git rev-parse --git-dir)
mkdir -p "$gd/info"
grep -qx '/.gpu/' "$gd/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$gd/info/exclude"
rm -rf .gpu
mkdir -p .gpu/lib
for f in build/bin/* build/lib/*.so build/tests/*.so; do
  if [ -f "$f" ]; then ldd "$f" 2>/dev/null || true; fi
done | awk '/=> \// { print $3 }' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so|/cuda' |
  while read -r lib; do cp -L "$lib" .gpu/lib/; done
echo "gpu-carry: $(find .gpu/lib -type f | wc -l) libraries in .gpu/lib ($(du -sh .gpu | cut -f1)); carry .gpu build/bin build/lib build/tests"
