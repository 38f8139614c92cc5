#!/usr/bin/env bash
# scripts/demo.sh — the main job: sets everything up, then trains the MLP with
# ZeRO-3 on 4 CPU ranks. Extra arguments go to fsdp-train (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh
exec mpirun "${FSDP_MPIRUN_ARGS[@]}" -np "${NP:-4}" build/fsdp-train --strategy zero3 "$@"
