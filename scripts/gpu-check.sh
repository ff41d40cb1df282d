#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU (e.g. through the
# device tool): builds with nvcc, runs every kernel and the client's device
# path against their CPU twins, the Python package's device path, then the
# kernel benchmarks (GB/s and the ratio to device-to-device memcpy). Output
# also goes to $OUT/ when set.
#
#   scripts/gpu-check.sh            # a few minutes on an H200
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/gddr-gpu-check}
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "gpu-check: nvidia-smi failed (no driver?)" | tee -a "$out/summary.txt"
export PATH="/usr/local/cuda/bin:$PATH"
scripts/install-deps.sh 2>&1 | tail -n 2
make -j"$(nproc)" WITH_CUDA=1 CUDA_ARCH="${CUDA_ARCH:-90}" > "$out/build.log" 2>&1 \
  || { echo "gpu-check: build failed, see $out/build.log"; tail -n 30 "$out/build.log"; exit 1; }
status=0
# GPU-vs-CPU cases (bit-identical masks, values within tolerance, guard
# elements untouched) and the device-pointer step against the host step.
timeout 600 build/bin/gddr-tests kernels residual 2>&1 | tee "$out/tests.log" || status=1
# The Python package's device path: raw device pointers through
# Client.step_ptrs (test_cuda.py, needs python3-numpy) and a CUDA torch
# model through gddr.torch (test_torch.py; Debian's python3-torch is a
# CPU build, so that case says why it skipped unless a CUDA torch is there).
if /usr/bin/python3 -c 'import numpy, pytest' 2>/dev/null; then
  timeout 300 /usr/bin/python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_cuda.py \
    python/tests/test_torch.py -k 'cuda or device' 2>&1 | tee "$out/python.log" || status=1
  tail -n 3 "$out/python.log" | sed 's/^/python: /' >> "$out/summary.txt"
else
  echo "gpu-check: python3-numpy or python3-pytest missing: the Python device path was not run" |
    tee -a "$out/summary.txt"
fi
timeout 600 build/bin/bench_kernels 2>&1 | tee "$out/bench.log" || status=1
grep -E "^[0-9]+%|SKIP|:F:|:E:" "$out/tests.log" | tee -a "$out/summary.txt"
echo "gpu-check: exit $status; logs in $out" | tee -a "$out/summary.txt"
exit "$status"
