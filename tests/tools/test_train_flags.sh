#!/usr/bin/env bash
# tests/tools/test_train_flags.sh — fsdp-train's wrap flags on a tiny GPT-2:
# --wrap-min-params alone groups blocks by size (it used to be ignored unless
# --wrap '' was given too), and with an explicit --wrap it is refused.
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
