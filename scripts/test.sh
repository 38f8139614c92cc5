#!/usr/bin/env bash
# scripts/test.sh — sets everything up, then runs every test suite in build/
# (the nvcc build where the toolkit exists: unit, mpi under mpirun -np 1..4,
# launch, tokenizer, bench, docs; the cuda suite skips there without a GPU), a
# libFuzzer target per parser for 20 s each (tests/fuzz/run.sh, as many at
# once as cores: a target's bound is its own 20 s, so its runs fall where
# other work still takes a core), and the GPU path on the CPU
# (scripts/sim-test.sh: the cuda suite against the SIMT simulator under
# ASan+UBSan, its production shapes in an optimised build without sanitizers
# (guard zones instead), the engine and GPT-2 under TSan). Extra arguments go
# to the first `meson test`, e.g.
# scripts/test.sh --suite unit (which skips the simulator runs).
#
# What overlaps, and why results do not depend on it: build/'s tests are
# mostly one at a time (is_parallel : false), so beside them run, each in the
# background from the start, the hf-interop test's venv (torch and
# transformers from PyPI, about 5.6 GB: minutes of network and disk, little
# CPU; the test waits on the venv's lock, so it runs the same whichever
# finishes first) and all of scripts/sim-test.sh (its own build directories,
# its stages side by side as its header says; its output is printed whole when
# it ends, after the fuzz targets', which follow build/'s tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ $# -ne 0 ]; then
  exec meson test -C build --no-rebuild --print-errorlogs --num-processes "$(nproc)" "$@"
fi
# each in a process group of its own (setsid), so that an early exit ends it whole
setsid tests/interop/test_hf_interop.sh --venv-only build . >build/interop-venv.log 2>&1 &
venv=$!
setsid scripts/sim-test.sh >build/sim-test.log 2>&1 &
sim=$!
trap 'kill -- -$venv -$sim 2>/dev/null || true' EXIT
t0=$SECONDS
meson test -C build --no-rebuild --print-errorlogs --num-processes "$(nproc)"
echo "test: build/'s tests done in $((SECONDS - t0)) s"
t0=$SECONDS
# each parser's fuzz target, 20 s each, ASan+UBSan, as many at once as cores
FUZZ_JOBS=$(nproc) tests/fuzz/run.sh build 20
echo "test: the fuzz targets done in $((SECONDS - t0)) s"
wait $venv || true # its outcome is the hf-interop test's, printed above
status=0
wait $sim || status=$?
trap - EXIT
cat build/sim-test.log
exit $status
