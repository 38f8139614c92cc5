#!/usr/bin/env bash
# scripts/test.sh — sets everything up, then runs every test suite in build/
# (the nvcc build where the toolkit exists: unit, mpi under mpirun -np 1..4,
# launch, tokenizer, bench, docs; the cuda suite skips there without a GPU), a
# libFuzzer target per parser for 20 s each (tests/fuzz/run.sh), then the
# GPU path on the CPU (scripts/sim-test.sh: the cuda suite against the SIMT
# simulator under ASan+UBSan, its production shapes in an optimised build
# without sanitizers (guard zones instead), the engine and GPT-2 under
# TSan). Extra arguments go to the first `meson test`, e.g.
# scripts/test.sh --suite unit (which skips the simulator runs).
#
# What overlaps, and why results do not depend on it: while build/'s tests
# run, the hf-interop test's venv (torch and transformers from PyPI, about
# 5.6 GB: minutes of network and disk, little CPU) fills in the background
# (the test waits on the venv's lock, so it runs the same whichever finishes
# first), and the simulator's three builds run at nice 19 (they take only the
# CPU those tests leave idle; sim-test.sh starts after they end, and builds
# whatever they did not). scripts/sim-test.sh says how it overlaps its own.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ $# -ne 0 ]; then
  exec meson test -C build --no-rebuild --print-errorlogs --num-processes "$(nproc)" "$@"
fi
# each in a process group of its own (setsid), so that an early exit ends it whole
setsid tests/interop/test_hf_interop.sh --venv-only build . >build/interop-venv.log 2>&1 &
venv=$!
setsid nice -n 19 scripts/sim-test.sh build >build/sim-build.log 2>&1 &
sim_build=$!
trap 'kill -- -$venv -$sim_build 2>/dev/null || true' EXIT
t0=$SECONDS
meson test -C build --no-rebuild --print-errorlogs --num-processes "$(nproc)"
echo "test: build/'s tests done in $((SECONDS - t0)) s"
t0=$SECONDS
tests/fuzz/run.sh build 20 # each parser's fuzz target, 20 s each, ASan+UBSan
echo "test: the fuzz targets done in $((SECONDS - t0)) s"
wait $venv || true # its outcome is the hf-interop test's, printed above
wait $sim_build || true # sim-test.sh reports a failed build itself
trap - EXIT
scripts/sim-test.sh
