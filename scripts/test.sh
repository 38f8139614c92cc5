#!/usr/bin/env bash
# scripts/test.sh — sets everything up, then runs every test suite: unit (no MPI)
# and mpi (each program under mpirun -np 1, 2, 3, 4). Extra arguments go to
# `meson test`, e.g. scripts/test.sh --suite unit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec meson test -C build --no-rebuild --print-errorlogs --num-processes 2 "$@"
