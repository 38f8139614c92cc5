#!/usr/bin/env bash
# scripts/demo-tokens.sh — GPT-2 the way its users train it: on BPE tokens.
# Learns a byte-level BPE vocabulary from the fortunes (MERGES merges, standard
# library Python: tests/tokenizer/make_vocab.py) unless VOCAB names a directory
# with GPT-2's own vocab.json + merges.txt, tokenizes the fortunes into llm.c
# token shards (fsdp-tokenize), trains the 124M preset with ZeRO-3 on NP CPU
# ranks (fsdp-train), then scores the checkpoint's validation split again at
# another rank count and samples from it (fsdp-eval).
# Environment: NP (4), EVAL_NP (2), STEPS (300), MERGES (1000), VOCAB, WORK
# (build/demo-tokens). Extra arguments go to fsdp-train.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --data
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh
WORK=${WORK:-build/demo-tokens}
mkdir -p "$WORK"
VOCAB=${VOCAB:-$WORK/vocab}
[ -f "$VOCAB/vocab.json" ] ||
  python3 tests/tokenizer/make_vocab.py "$VOCAB" "${MERGES:-1000}" /usr/share/games/fortunes
build/fsdp-tokenize --vocab "$VOCAB" --doc-separator % --overwrite --out "$WORK/fortunes.bin" \
  /usr/share/games/fortunes
mpirun "${FSDP_MPIRUN_ARGS[@]}" -np "${NP:-4}" build/fsdp-train --preset 124M --data "$WORK/fortunes.bin" \
  --seq-len 64 --global-batch 8 --steps "${STEPS:-300}" --lr 6e-4 --log-every 10 \
  --eval-every 100 --save-dir "$WORK/ckpt" --save-overwrite "$@"
mpirun "${FSDP_MPIRUN_ARGS[@]}" -np "${EVAL_NP:-2}" build/fsdp-eval --checkpoint "$WORK/ckpt" \
  --data "$WORK/fortunes.bin" --match-train
mpirun "${FSDP_MPIRUN_ARGS[@]}" -np "${EVAL_NP:-2}" build/fsdp-eval --checkpoint "$WORK/ckpt" \
  --data "$WORK/fortunes.bin" --tokenizer "$VOCAB" --no-score --prompt "The " --sample 60 \
  --top-k 40 --temperature 0.8
