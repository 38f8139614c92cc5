#!/usr/bin/env bash
# scripts/sim-test.sh — the GPU path on the CPU, for CI (scripts/test.sh runs
# it): the CUDA sources built against the SIMT simulator (tests/cudasim,
# -Dgpu_sim=true) and the cuda suite run there, with 0 skipped and 0 failed
# required. Three builds, each building only the programs its tests run
# (scripts/test-targets.py), and each test in exactly one of them:
#   build-sim/    AddressSanitizer + UBSan: the cuda suite except its
#                 production shapes (every kernel against the CPU at shapes
#                 chosen to cover its code paths, the engine and collectives
#                 on "device" buffers under mpirun and fsdp-run, GPT-2 and
#                 Llama (the models, fsdp-train and fsdp-bench on CUDA),
#                 coll_bench, the NCCL watchdog, the simulator's own tests,
#                 elastic-kill-nccl: a rank lost under fsdp-run --min-nproc
#                 with fsdp-train on CUDA over NCCL, about 60 s);
#   build-simopt/ no sanitizer (-O3 -g): the production shapes, suite `big`
#                 (kernels-big, gpt2-124m-layer, llama-smollm-layer): values
#                 against the CPU at GPT-2's and SmolLM-135M's real sizes. Under ASan they took 573 s of the
#                 suite's 954 s; their logic runs under ASan+UBSan at small
#                 shapes in build-sim/. Here the simulator NaN-fills device
#                 memory and puts guard zones around each allocation
#                 (tests/cudasim/runtime/runtime.cc): reading what no one
#                 wrote or past an end shows as NaN, writing past an end
#                 aborts with a report. (UBSan here cost twice the time, for
#                 overflow checks these shapes, all under 2^31 elements,
#                 cannot trip.)
#   build-tsan/   ThreadSanitizer: the engine cuda tests (N = 1, 2, NCCL and
#                 the world's backend; the release-ordering test included) and
#                 GPT-2 at its small size (gpt2-small-f32/-bf16: checkpointing
#                 and prefetch on CUDA against the CPU, losses and every
#                 tensor's gradient) and Llama's tiny preset alike
#                 (llama-small-f32/-bf16), with no report (a missing stream wait
#                 between the compute, gather and reduce streams is a race).
#                 The full-size GPT-2 test outran 900 s under TSan on the
#                 shared 2-core machine; `scripts/sim-test.sh tsan-gpt2` runs it.
# How they share the machine: the three stages start at once, each building
# its own directory and then running its tests (each stage is mostly one test
# at a time: the cuda suite's tests are is_parallel : false), so a core one
# leaves idle goes to another; the production shapes run at nice 19 (no
# deadline; they take only what the other two leave). On 8 or more cores
# each stage gets half the cores' ninja jobs and test processes. The ASan
# stage prints as it goes; a background stage's output goes to a log printed
# whole when it ends. scripts/test.sh starts this beside build/'s tests. A
# test goes to `big` (suite : big_suite in tests/cuda/meson.build) when its
# shapes, not its logic, are the point and ASan would make it the slowest of
# the suite.
# Usage: scripts/sim-test.sh [all|asan|big|tsan|tsan-gpt2|build]
#   all (the default): the three builds and their tests, as above;
#   asan, big, tsan: one build and its tests; tsan-gpt2: tsan and the
#   full-size GPT-2 test under TSan; build: the three builds, no test.
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1
cores=$(nproc)
# ninja's jobs and meson test's processes (halved when two stages share the
# cores).
jobs=${SIM_TEST_JOBS:-$cores}
# What each build runs (meson test's selection).
asan_tests=(--suite cuda --no-suite big)
big_tests=(--suite big)
tsan_tests=(--suite cuda engine-np1 engine-np2 gpt2-small-f32 gpt2-small-bf16 llama-small-f32
  llama-small-bf16)

# Configures dir once with the simulator and sanitizer, then builds the
# programs that `meson test` with the given selection runs.
build() {
  local dir=$1 sanitize=$2
  shift 2
  if [ ! -f "$dir/build.ninja" ]; then
    echo "sim-test: configuring $dir (${sanitize/none/no sanitizer})"
    meson setup "$dir" -Dgpu_sim=true -Db_sanitize="$sanitize" -Db_lundef=false >/dev/null
  fi
  local targets out
  # regenerates the build files first when a meson.build changed (the
  # selection reads meson's introspection of them)
  out=$(ninja -C "$dir" build.ninja 2>&1) || { echo "$out"; return 1; }
  targets=$(scripts/test-targets.py "$dir" "$@")
  [ -n "$targets" ] || { echo "sim-test: $dir: no test selected by $*"; return 1; }
  # shellcheck disable=SC2086 # one target per line
  out=$(ninja -C "$dir" -j"$jobs" $targets 2>&1) || { echo "$out"; return 1; }
}

# Runs meson test and fails on any skip as well as any failure.
run() {
  local dir=$1 log
  shift
  log=$(mktemp)
  local status=0
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$jobs" \
    --timeout-multiplier 3 "$@" | tee "$log" || status=$?
  if ! grep -qE "^Skipped: +0 *$" "$log"; then
    echo "sim-test: $dir: a test was skipped (see above); the simulator must run every one"
    status=1
  fi
  rm -f "$log"
  return "$status"
}

# LeakSanitizer off: Open MPI keeps its allocations to the end.
asan() {
  build build-sim address,undefined "${asan_tests[@]}" &&
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      run build-sim "${asan_tests[@]}"
}

big() {
  build build-simopt none "${big_tests[@]}" && run build-simopt "${big_tests[@]}"
}

tsan() {
  local sel=("${tsan_tests[@]}")
  [ "${1:-}" = gpt2 ] && sel+=(gpt2)
  build build-tsan thread "${sel[@]}" &&
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=7 suppressions=$PWD/tests/cudasim/tsan.supp" \
      run build-tsan "${sel[@]}"
}

# Runs one stage and says how long it took; status 1 if it failed.
stage() {
  local name=$1 t0=$SECONDS
  shift
  local status=0
  "$@" || status=1
  echo "sim-test: $name $([ $status = 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
  return "$status"
}

# Runs a stage in the background (nice 19 when given), its output to a log;
# waited for by finish.
declare -A bg_pid bg_log
background() {
  local key=$1 nice=$2
  shift 2
  bg_log[$key]=$(mktemp)
  local niceness=0
  [ "$nice" = nice ] && niceness=19
  SIM_TEST_JOBS=$jobs nice -n "$niceness" "$self" "$key" >"${bg_log[$key]}" 2>&1 &
  bg_pid[$key]=$!
}
finish() {
  local key=$1 status=0
  wait "${bg_pid[$key]}" || status=1
  cat "${bg_log[$key]}"
  rm -f "${bg_log[$key]}"
  return "$status"
}

built() {
  build build-sim address,undefined "${asan_tests[@]}" &&
    build build-simopt none "${big_tests[@]}" &&
    build build-tsan thread "${tsan_tests[@]}"
}

what=${1:-all}
status=0
case $what in
  asan) stage "ASan+UBSan cuda suite" asan || status=1 ;;
  big) stage "production shapes (no sanitizer)" big || status=1 ;;
  tsan) stage "TSan engine, GPT-2 and Llama (small)" tsan || status=1 ;;
  tsan-gpt2) stage "TSan engine, GPT-2 (small and full) and Llama (small)" tsan gpt2 || status=1 ;;
  build) stage "builds" built || status=1 ;;
  all)
    t0=$SECONDS
    ((cores >= 8)) && jobs=$((cores / 2))
    background big nice
    background tsan plain
    stage "ASan+UBSan cuda suite" asan || status=1
    finish tsan || status=1
    finish big || status=1
    echo "sim-test: all done in $((SECONDS - t0)) s"
    ;;
  *) echo "usage: scripts/sim-test.sh [all|asan|big|tsan|tsan-gpt2|build]" >&2; exit 2 ;;
esac
exit "$status"
