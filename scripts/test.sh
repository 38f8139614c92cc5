#!/usr/bin/env bash
# scripts/test.sh — sets everything up, then runs every test suite: unit (no MPI)
# and mpi (each program under mpirun -np 1, 2, 3, 4), then the GPU path on the
# CPU (scripts/sim-test.sh: the cuda suite against the SIMT simulator under
# ASan+UBSan, and the engine and GPT-2 under TSan). Extra arguments go to the
# first `meson test`, e.g. scripts/test.sh --suite unit (which skips the
# simulator runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
meson test -C build --no-rebuild --print-errorlogs --num-processes 2 "$@"
if [ $# -eq 0 ]; then
  scripts/sim-test.sh
fi
