#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU (e.g. through the
# device tool): builds with nvcc, runs every kernel and the client's device
# path against their CPU twins, then the kernel benchmarks (GB/s and the
# ratio to device-to-device memcpy). Output also goes to $OUT/ when set.
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
timeout 600 build/bin/bench_kernels 2>&1 | tee "$out/bench.log" || status=1
grep -E "^[0-9]+%|SKIP|:F:|:E:" "$out/tests.log" | tee -a "$out/summary.txt"
echo "gpu-check: exit $status; logs in $out" | tee -a "$out/summary.txt"
exit "$status"
