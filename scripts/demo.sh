#!/usr/bin/env bash
# scripts/demo.sh — the main job: sets everything up (with the datasets), then
# trains a small byte-level GPT-2 on the fortunes corpus with ZeRO-3 on 4 CPU
# ranks, printing the loss falling and a sample of generated text.
# Extra arguments go to fsdp-train (see build/fsdp-train --help); NP sets ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --data
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh
exec mpirun "${FSDP_MPIRUN_ARGS[@]}" -np "${NP:-4}" build/fsdp-train --model gpt2 --preset small \
  --strategy zero3 --wrap GPT2Block --steps 1000 --log-every 50 --eval-every 250 --sample 400 "$@"
