#!/usr/bin/env bash
# tests/tools/test_train_flags.sh — fsdp-train's wrap flags on a tiny GPT-2:
# --wrap-min-params alone groups blocks by size (it used to be ignored unless
# --wrap '' was given too), and with an explicit --wrap it is refused;
# --checkpoint auto chooses the fewest leading blocks to recompute for
# --memory-budget.
# usage: test_train_flags.sh FSDP_TRAIN
set -euo pipefail
train=$1
# Text of its own: the default data, the fortunes, is the demo's (setup.sh --data), not the tests'.
data=$(mktemp)
trap 'rm -f "$data"' EXIT
seq 1 3000 >"$data"
tiny=(--model gpt2 --layers 4 --heads 2 --embd 32 --context 16 --vocab 256 --steps 1
      --global-batch 4 --data "$data")
out=$("$train" "${tiny[@]}" --wrap-min-params 20000 2>&1)
echo "$out" | head -5
# Blocks of 12704 parameters: two per unit reach 20000.
grep -Eq '^  h\.0-1 +GPT2Block +25408' <<<"$out" || { echo "FAIL: h.0-1 not one unit"; exit 1; }
grep -Eq '^  h\.2-3 +GPT2Block +25408' <<<"$out" || { echo "FAIL: h.2-3 not one unit"; exit 1; }
if grep -Eq '^  h\.0 ' <<<"$out"; then echo "FAIL: blocks wrapped one per unit"; exit 1; fi
set +e
err=$("$train" "${tiny[@]}" --wrap GPT2Block --wrap-min-params 20000 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "FAIL: both wrap policies: exit $rc, want 2"; exit 1; }
grep -q -- "--wrap GPT2Block and --wrap-min-params 20000 are two wrap policies" <<<"$err" ||
  { echo "FAIL: message: $err"; exit 1; }
echo "ok: --wrap-min-params groups blocks by size; with --wrap it is refused"

# --checkpoint auto: on the CPU without a budget nothing is checkpointed (and
# said so); at a budget between the plans the fewest leading blocks that fit
# (1.4 MiB: the model state as the engine reserves it and kernel memory,
# 0.91 MiB on one rank, which has no gradient buffers, + 3 blocks of 4
# checkpointed; 1.3 MiB needs all 4); --json
# carries the choice; a budget nothing fits is refused naming the numbers.
out=$("$train" "${tiny[@]}" --checkpoint auto 2>&1)
grep -q "checkpoint auto: 0 of 4 blocks, activations .* (no --memory-budget on the CPU: nothing checkpointed)" <<<"$out" ||
  { echo "FAIL: auto without a budget: $out"; exit 1; }
out=$("$train" "${tiny[@]}" --checkpoint auto --memory-budget 0.0014 2>&1)
grep -q "checkpoint auto: 3 of 4 blocks (h.0-h.2), activations 0.43 MiB, budget 1.43 MiB" <<<"$out" ||
  { echo "FAIL: auto at 1.4 MiB: $out"; exit 1; }
out=$("$train" "${tiny[@]}" --checkpoint auto --memory-budget 0.0013 --json 2>&1)
grep -q '"checkpoint_auto":{"checkpointed":4,"layers":4,"first":0,"last":3,' <<<"$out" ||
  { echo "FAIL: auto --json: $out"; exit 1; }
# A huge budget is a budget (not "none" by a cast past SIZE_MAX), and a tiny
# one is refused (not rounded to 0 bytes, "none").
out=$("$train" "${tiny[@]}" --checkpoint auto --memory-budget 1e20 2>&1)
grep -q "checkpoint auto: 0 of 4 blocks, activations .* MiB, budget " <<<"$out" ||
  { echo "FAIL: auto at 1e20 GiB: $out"; exit 1; }
set +e
err=$("$train" "${tiny[@]}" --checkpoint auto --memory-budget 1e-12 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "a budget of 0.00 MiB (1 bytes) holds no plan" <<<"$err" ||
  { echo "FAIL: a budget of 1e-12 GiB: $err"; exit 1; }
set +e
err=$("$train" "${tiny[@]}" --checkpoint auto --memory-budget 0.001 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "FAIL: a budget nothing fits ran"; exit 1; }
grep -q "checkpoint auto: a budget of 1.02 MiB (1073741 bytes) holds no plan: .* all 4 layers checkpointed" <<<"$err" ||
  { echo "FAIL: refusal: $err"; exit 1; }
echo "ok: --checkpoint auto checkpoints the fewest leading blocks the budget needs"
