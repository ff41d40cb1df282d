#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU (e.g. through the
# device tool), in one go, within about 10 minutes on an H200:
#
#   1. builds with nvcc (the plugin build/lib/libgddr-cuda.so included);
#   2. checks that libgddr-client.so and the programs link no CUDA library
#      (CUDA comes only through the plugin) and that the plugin exports its
#      entry point alone;
#   3. runs the kernel suite: every CUDA kernel against its CPU twin (the
#      fused passes, the sum of squares and the clip kernel included), and
#      the plugin loader (the real plugin loaded by path and reporting);
#   4. runs the residual suite: the device step found through the plugin
#      search (next to the programs: build/bin/../lib) against the host
#      step, bit for bit, and the device path on the stand-in plugin;
#   5. runs the Python package's device path (raw device pointers through
#      gddr.Client.step_ptrs, and a CUDA torch model when a CUDA torch is
#      installed; Debian's is a CPU build, so that case says it skipped);
#   6. runs bench_kernels: GB/s of every kernel and of the fused passes
#      against device-to-device copies of the same bytes.
#
#   scripts/gpu-check.sh            # output also in $OUT/ (default /tmp/gddr-gpu-check)
#   GPU_CHECK_PREBUILT=1 scripts/gpu-check.sh   # build/ carried from a machine with nvcc
#                                   # (same CUDA major), steps 1 skipped; GPU_CHECK_PY=python3
#                                   # picks the Python with numpy and pytest
#
# Exit status 0 only when every step passed. A step that hangs is cut by
# its own timeout, so the script always ends and says which step failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/gddr-gpu-check}
mkdir -p "$out"
: > "$out/summary.txt"
say() { echo "gpu-check: $*" | tee -a "$out/summary.txt"; }
status=0
step() { # step NAME SECONDS COMMAND...: runs it, logs to $out/NAME.log
  local name=$1 secs=$2
  shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    say "$name: ok ($((SECONDS - t0)) s)"
  else
    status=1
    say "$name: FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ", timed out after $secs s"); $out/$name.log)"
    tail -n 25 "$out/$name.log"
  fi
  return "$rc"
}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || say "nvidia-smi failed (no driver?)"
head -n 12 "$out/nvidia-smi.txt"
export PATH="/usr/local/cuda/bin:$PATH"
if [ -n "${GPU_CHECK_PREBUILT:-}" ]; then
  # A machine that cannot install packages (no registry): build/ was made
  # with nvcc elsewhere and carried here, with the libraries it needs on
  # LD_LIBRARY_PATH (docs/performance.md, "The CUDA kernels").
  if [ -x build/bin/gddr-tests ] && [ -e build/lib/libgddr-cuda.so ]; then
    say "build: carried (GPU_CHECK_PREBUILT), not rebuilt here"
  else
    say "exit 1 (GPU_CHECK_PREBUILT, but build/bin/gddr-tests or build/lib/libgddr-cuda.so is missing)"
    exit 1
  fi
else
  scripts/install-deps.sh > "$out/deps.log" 2>&1 || say "install-deps reported a problem ($out/deps.log)"
  step build 420 make -j"$(nproc)" WITH_CUDA=1 CUDA_ARCH="${CUDA_ARCH:-90}" || {
    say "exit 1 (no build, nothing else runs)"
    exit 1
  }
fi

no_cuda_links() {
  local bad=0
  for f in build/lib/libgddr-client.so build/bin/gddr-ps build/bin/gddr-train build/bin/gddr-tests; do
    if ldd "$f" | grep -Ei 'libcudart|libcublas|libcuda\.|libnvrtc'; then
      echo "$f links CUDA"
      bad=1
    fi
  done
  [ -e build/lib/libgddr-cuda.so ] || { echo "no plugin built"; bad=1; }
  syms=$(nm -D --defined-only build/lib/libgddr-cuda.so | awk '$2 == "T" { print $3 }' | sed 's/@.*//')
  [ "$syms" = gddr_cuda_plugin_entry ] || { echo "plugin exports: $syms"; bad=1; }
  ldd build/lib/libgddr-cuda.so | grep -Ei 'cuda|cublas'
  return "$bad"
}
export -f no_cuda_links # (timeout runs programs, not functions)
step links 60 bash -c no_cuda_links

export GDDR_BIN=build/bin CK_DEFAULT_TIMEOUT=300
step kernels 300 build/bin/gddr-tests kernels
step residual 420 build/bin/gddr-tests residual
# The GPU cases must have run, not been skipped.
if grep -q "SKIP gpu" "$out/kernels.log" || grep -q "device_step skipped\|device_cases skipped" "$out/residual.log"; then
  status=1
  say "the GPU cases were SKIPPED: $(grep -h "SKIP gpu\|device_step skipped" "$out"/kernels.log "$out"/residual.log | head -n 2)"
fi
grep -h "plugin \|device_step" "$out/kernels.log" "$out/residual.log" | head -n 4 | tee -a "$out/summary.txt"
# The Python package's device path: raw device pointers through
# Client.step_ptrs (test_cuda.py, needs python3-numpy) and a CUDA torch
# model through gddr.torch (test_torch.py; Debian's python3-torch is a CPU
# build, so that case says why it skipped unless a CUDA torch is there).
py=${GPU_CHECK_PY:-/usr/bin/python3}
if "$py" -c 'import numpy, pytest' 2>/dev/null; then
  step python 300 "$py" -m pytest -q -rs -p no:cacheprovider python/tests/test_cuda.py \
    python/tests/test_torch.py -k 'cuda or device'
  tail -n 3 "$out/python.log" | sed 's/^/python: /' >> "$out/summary.txt"
else
  say "$py lacks numpy or pytest: the Python device path was not run"
fi
step bench 300 build/bin/bench_kernels 1 16 64
grep -A 16 "^GPU" "$out/bench.log" | tee -a "$out/summary.txt"
if grep -q "FAIL" "$out/bench.log"; then
  status=1
  say "bench_kernels: a GPU kernel disagreed with its CPU twin (FAIL rows above)"
fi
say "exit $status; logs in $out"
exit "$status"
