#!/usr/bin/env bash
# tests/tools/test_train_llama.sh — fsdp-train --model llama: the tiny preset
# learns text (loss down over 40 steps) and its --sample is mostly the text's
# digits and newlines, a unit per decoder layer, checkpointing
# holding fewer activations; it trains on an llm.c token file, refuses a
# token beyond the preset's vocabulary, and the flags that mix up GPT-2 and
# Llama shapes are refused by name.
# fsdp-eval samples from the saved Llama as fsdp-train does.
# usage: test_train_llama.sh FSDP_TRAIN [FSDP_EVAL]
set -euo pipefail
train=$1 eval=${2:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
seq 1 3000 >"$dir/text.txt"
fail() { echo "FAIL: $*"; exit 1; }
run=(--model llama --preset tiny --global-batch 8 --seq-len 32 --eval-every 0 --lr 3e-3)

out=$("$train" "${run[@]}" --steps 40 --data "$dir/text.txt" --json --sample 40 \
  --save-dir "$dir/ckpt" 2>&1) ||
  fail "training: $out"
summary=$(grep '"event":"summary"' <<<"$out") || fail "no summary: $out"
sample=$(grep '"event":"sample"' <<<"$out") || fail "no sample: $out"
echo "$summary"
echo "$sample"
python3 - "$summary" "$sample" <<'PY' || exit 1
import json, sys
s = json.loads(sys.argv[1])
assert s["model"] == "llama", s
assert s["final_loss"] < 0.6 * s["first_loss"], f"loss {s['first_loss']} -> {s['final_loss']}"
text = json.loads(sys.argv[2])["text"]  # untrained: 11 of 256 bytes are digits or newlines
assert len(text) == 40 and sum(ch in "0123456789\n" for ch in text) >= 32, repr(text)
PY

# the same draw from the saved checkpoint through fsdp-eval (same prompt, seed,
# temperature and top-k defaults as fsdp-train's --sample)
if [ -n "$eval" ]; then
  ev=$("$eval" --checkpoint "$dir/ckpt" --no-score --sample 40 --json 2>&1) ||
    fail "fsdp-eval --sample: $ev"
  esample=$(grep '"event":"sample"' <<<"$ev") || fail "no fsdp-eval sample: $ev"
  python3 - "$sample" "$esample" <<'PY' || exit 1
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:])
drawn = [ord(ch) for ch in a["text"]]  # a byte model: each character one byte's id
assert drawn == b["tokens"], f"fsdp-train drew {drawn}, fsdp-eval {b['tokens']}"
PY
fi

out=$("$train" "${run[@]}" --steps 2 --data "$dir/text.txt" --checkpoint LlamaDecoderLayer 2>&1) ||
  fail "checkpointing: $out"
grep -Eq '^  model\.layers\.1 +LlamaDecoderLayer +43136 ' <<<"$out" || fail "units: $out"
grep -Eq '^  root +LlamaForCausalLM +32832 ' <<<"$out" || fail "root: $out"
act=$(grep -Eo 'activations [0-9.]+ MiB/rank \([0-9.]+ MiB' <<<"$out") || fail "activations: $out"
read -r _ kept _ full _ <<<"${act//(/}"
python3 -c "import sys; sys.exit(not float('$kept') < float('$full'))" ||
  fail "checkpointing kept $kept MiB of $full"

# an llm.c token file (uint16 ids after a 256-int32 header), then one whose
# token 300 is beyond tiny's 256
tokens() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
ids = [(i * 37) % 251 for i in range(4000)]
ids[1000] = int(sys.argv[2])
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<3i", 20240520, 1, len(ids)) + bytes(4 * 253))
    f.write(struct.pack(f"<{len(ids)}H", *ids))
PY
}
tokens "$dir/ok.bin" 7
out=$("$train" "${run[@]}" --steps 3 --data "$dir/ok.bin" 2>&1) || fail "token file: $out"
grep -q 'val loss [0-9.]* nats/token' <<<"$out" || fail "token file: $out"
tokens "$dir/big.bin" 300
set +e
err=$("$train" "${run[@]}" --steps 1 --data "$dir/big.bin" 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "token 300" <<<"$err" && grep -q "SmolLM-135M" <<<"$err" ||
  fail "token 300 in tiny: exit $rc: $err"

refused() { # exit 2 and the message
  set +e
  err=$("$train" "${@:2}" --steps 1 --data "$dir/text.txt" 2>&1)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] && grep -qF -- "$1" <<<"$err" || fail "$*: exit $rc: $err"
}
refused "--preset small is a gpt2 shape" --model llama --preset small
refused "--preset SmolLM-135M is a llama shape: add --model llama" --preset SmolLM-135M
refused "a llama's shape is its --preset's" --model llama --layers 3
refused "--seq-len 5000 exceeds 4096" --model llama --preset Llama-3.2-1B --seq-len 5000
echo "ok: llama trains on text and tokens; mixed-up flags are refused"
