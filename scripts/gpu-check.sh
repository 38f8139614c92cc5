#!/usr/bin/env bash
# scripts/gpu-check.sh — the GPU checks of issue 4 in one command, for a machine
# with an NVIDIA GPU and the CUDA toolkit: sets up and builds build/ with CUDA,
# runs the CUDA suite (every kernel of src/cuda against the CPU reference on
# fresh random inputs) and prints its table last: kernel, max relative error,
# tolerance, pass. Exits 0 only when every kernel ran and passed. Well inside
# 10 minutes: a fresh build took 43 s on 2 cores without a GPU; the suite is
# bounded at 5 minutes (meson's timeout) and should take well under one.
# Usage: scripts/gpu-check.sh   (FSDP_TEST_SEED=n repeats a run's inputs)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

# Meson's CUDA language looks for nvcc on PATH only.
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if ! command -v nvcc >/dev/null; then
  echo "gpu-check: nvcc not found: install the CUDA toolkit (or put its bin/ on PATH)"
  exit 1
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader |
    sed 's/^/gpu-check: device: /' || true
else
  echo "gpu-check: nvidia-smi not found; the suite will say whether CUDA sees a device"
fi

scripts/setup.sh -Dcuda=enabled
# setup.sh passes options only when it configures; an older build/ may lack CUDA.
if [ ! -x build/tests/cuda/test_kernels ]; then
  echo "gpu-check: enabling CUDA in build/"
  meson configure build -Dcuda=enabled >/dev/null
  out=$(ninja -C build 2>&1) || { echo "$out"; exit 1; }
fi

report="$PWD/build/meson-logs/cuda-kernels.txt"
rm -f "$report"
status=0
FSDP_CUDA_REPORT="$report" timeout 330 \
  meson test -C build --no-rebuild --suite cuda --print-errorlogs || status=$?

echo
echo "gpu-check: NOT CHECKED, because it does not exist yet (the rest of issue 4):"
echo "  - the engine on the GPU: no CUDA device backend, NCCL process group or MPI on"
echo "    device buffers is built, so there is no GPU-vs-CPU loss comparison for a small"
echo "    GPT (NCCL at N = 1, MPI at N = 2 on one GPU) and no engine-vs-device memory check;"
echo "  - the bench: no GPT-2 124M run (16 x 1024 tokens, bf16): no tokens/s, MFU or peak"
echo "    memory on the GPU."
echo "gpu-check: finished in $((SECONDS - start)) s"
if [ ! -s "$report" ]; then
  echo "gpu-check: FAILED: the CUDA suite wrote no table: it was skipped, timed out or crashed"
  grep -h "test_kernels: SKIP" build/meson-logs/testlog.txt 2>/dev/null | head -1 || true
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "gpu-check: FAILED: the CUDA suite failed (exit $status); details above"
else
  echo "gpu-check: the CUDA suite passed"
fi
echo
cat "$report"
exit "$status"
