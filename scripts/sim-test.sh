#!/usr/bin/env bash
# scripts/sim-test.sh — the GPU path on the CPU, for CI (scripts/test.sh runs
# it): the CUDA sources built against the SIMT simulator (tests/cudasim,
# -Dgpu_sim=true) and the cuda suite run there, with 0 skipped and 0 failed
# required:
#   build-sim/   AddressSanitizer + UBSan: the whole cuda suite (every kernel
#                against the CPU, the engine and collectives on "device"
#                buffers under mpirun, GPT-2, coll_bench, the simulator's own
#                tests);
#   build-tsan/  ThreadSanitizer: the engine cuda tests (N = 1, 2, NCCL and
#                the world's backend; the release-ordering test included) and
#                GPT-2 at its small size (gpt2-small-f32/-bf16: checkpointing
#                and prefetch on CUDA against the CPU, losses and every
#                tensor's gradient), with no report (a missing stream wait
#                between the compute, gather and reduce streams is a race).
#                The full-size GPT-2 test outran 900 s under TSan on the
#                shared 2-core machine; `scripts/sim-test.sh tsan-gpt2` runs it.
# Usage: scripts/sim-test.sh [asan|tsan|tsan-gpt2]   (default: asan and tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1

# Configures dir once with the simulator and extra options, then builds targets.
build() {
  local dir=$1 sanitize=$2
  shift 2
  if [ ! -f "$dir/build.ninja" ]; then
    echo "sim-test: configuring $dir ($sanitize)"
    meson setup "$dir" -Dgpu_sim=true -Db_sanitize="$sanitize" -Db_lundef=false >/dev/null
  fi
  local out
  out=$(ninja -C "$dir" -j2 "$@" 2>&1) || { echo "$out"; exit 1; }
}

# Runs meson test and fails on any skip as well as any failure.
run() {
  local dir=$1 log
  shift
  log=$(mktemp)
  local status=0
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 2 --timeout-multiplier 3 "$@" |
    tee "$log" ||
    status=$?
  if ! grep -qE "^Skipped: +0 *$" "$log"; then
    echo "sim-test: $dir: a test was skipped (see above); the simulator must run every one"
    status=1
  fi
  rm -f "$log"
  return "$status"
}

what=${1:-both}
start=$SECONDS
status=0
if [ "$what" != tsan ] && [ "$what" != tsan-gpt2 ]; then
  # LeakSanitizer off: Open MPI keeps its allocations to the end.
  build build-sim address,undefined
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run build-sim --suite cuda || status=1
  echo "sim-test: ASan+UBSan cuda suite done at $((SECONDS - start)) s"
fi
if [ "$what" != asan ]; then
  build build-tsan thread tests/cuda/test_engine_cuda tests/cuda/test_gpt2_cuda \
    tests/cudasim/cublas/libcublas.so.13
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/cudasim/tsan.supp" \
    run build-tsan --suite cuda engine-np1 engine-np2 gpt2-small-f32 gpt2-small-bf16 \
      $([ "$what" = tsan-gpt2 ] && echo gpt2) ||
    status=1
  echo "sim-test: TSan engine and GPT-2 (small) done at $((SECONDS - start)) s"
fi
exit "$status"
