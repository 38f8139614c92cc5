#!/usr/bin/env bash
# tests/tokenizer/test_tok_train.sh — GPT-2 on BPE tokens, end to end:
#  1. a vocabulary learned from the text (make_vocab.py), the text tokenized
#     into shards (fsdp-tokenize), GPT-2 (small preset) trained on them at
#     N = 2 with the loss falling by more than 1 nat;
#  2. fsdp-eval reproduces the run's final validation loss from its checkpoint
#     at N = 1 and N = 3 (--match-train: the same windows). Tolerance 1e-5
#     relative: the windows are the same, but each rank's micro-batch (so the
#     GEMM shapes) and the order of the sum over ranks change with N, which
#     moves fp32 rounding, never more than that;
#  3. fsdp-eval scoring every position of the split agrees across N (1e-5),
#     writes a .npy of the right shape, samples deterministically per seed;
#  4. the same shards in llm.c's Llama 3 format (uint32 tokens): fsdp-train
#     prints the same losses to the last digit, fsdp-eval the same loss;
#  5. bad input is named: data with tokens past the model's vocabulary, a
#     shard cut short, a malformed vocabulary, an existing output.
# Arguments: mpirun fsdp-tokenize fsdp-train fsdp-eval.
set -euo pipefail
MPIRUN=$1 TOKENIZE=$2 TRAIN=$3 EVAL=$4
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mktemp -d /tmp/fsdp-tok-train-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
export OPENBLAS_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
run() { local np=$1; shift; "$MPIRUN" --oversubscribe --bind-to none -np "$np" "$@"; }
json_field() { grep -o "\"$2\":[0-9.e+-]*" "$1" | tail -1 | cut -d: -f2; }
close() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(b))" "$1" "$2"; }

mkdir "$DIR/text"
if [ -r /usr/share/games/fortunes/fortunes ]; then
  cat /usr/share/games/fortunes/{fortunes,literature,riddles,science,wisdom} 2>/dev/null |
    head -c 300000 > "$DIR/text/fortunes"
else
  for i in $(seq 4000); do printf 'Fortune %d: the cat sat on the mat, and the dog did not.\n%%\n' "$i"; done > "$DIR/text/fortunes"
fi

# 1. vocabulary, shards, training
python3 "$HERE/make_vocab.py" "$DIR/vocab" 150 "$DIR/text"
V=$(python3 -c "import json, sys; print(len(json.load(open(sys.argv[1]))))" "$DIR/vocab/vocab.json")
mkdir "$DIR/shards"
"$TOKENIZE" --vocab "$DIR/vocab" --doc-separator % --shard-tokens 40000 --out "$DIR/shards/fort" "$DIR/text"
ls "$DIR"/shards/fort_00000[01].bin > /dev/null || fail "expected at least two shards"
"$TOKENIZE" --vocab "$DIR/vocab" --doc-separator % --shard-tokens 40000 --out "$DIR/shards/fort" \
  "$DIR/text" > /dev/null 2> "$DIR/err" && fail "fsdp-tokenize wrote over existing shards"
grep -q "shards/fort_000000.bin already exists" "$DIR/err" || fail "existing output: $(cat "$DIR/err")"
run 2 "$TRAIN" --preset small --vocab "$V" --seq-len 64 --data "$DIR/shards" --global-batch 12 \
  --steps 40 --eval-every 0 --save-dir "$DIR/ckpt" --json > "$DIR/train.json"
first=$(json_field "$DIR/train.json" first_loss) last=$(json_field "$DIR/train.json" final_loss)
val=$(json_field "$DIR/train.json" val_loss)
python3 -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]) - 1.0)" "$last" "$first" ||
  fail "loss did not fall by 1 nat: $first -> $last"
grep -q '"val_unit":"token"' "$DIR/train.json" || fail "fsdp-train did not read token data"
echo "trained on $V-token BPE shards at N=2: loss $first -> $last, val loss $val nats/token"

# 2. the final validation loss again, from the checkpoint at other N
for np in 1 3; do
  run "$np" "$EVAL" --checkpoint "$DIR/ckpt" --data "$DIR/shards" --match-train --json > "$DIR/eval$np.json"
  got=$(json_field "$DIR/eval$np.json" loss)
  close "$got" "$val" || fail "fsdp-eval at N=$np: $got, fsdp-train said $val"
  echo "fsdp-eval --match-train at N=$np: $got (fsdp-train at N=2: $val)"
done

# 3. every position; logits; sampling
for np in 1 2; do
  run "$np" "$EVAL" --checkpoint "$DIR/ckpt" --data "$DIR/shards" --tokenizer "$DIR/vocab" \
    --json --logits 70 --logits-out "$DIR/logits$np.npy" --sample 16 --top-k 5 --seed 3 > "$DIR/all$np.json"
done
a=$(json_field "$DIR/all1.json" loss) b=$(json_field "$DIR/all2.json" loss)
close "$b" "$a" || fail "full-split loss differs between N=1 ($a) and N=2 ($b)"
bpb=$(json_field "$DIR/all1.json" bits_per_byte)
[ -n "$bpb" ] || fail "no bits per byte with a tokenizer"
python3 - "$DIR/logits1.npy" "$V" <<'PY' || fail "the logits file is not a (70, V) float32 .npy"
import ast, struct, sys
raw = open(sys.argv[1], "rb").read()
assert raw[:8] == b"\x93NUMPY\x01\x00"
n = struct.unpack("<H", raw[8:10])[0]
h = ast.literal_eval(raw[10:10 + n].decode())
assert (10 + n) % 64 == 0 and h["descr"] == "<f4" and h["shape"] == (70, int(sys.argv[2]))
assert len(raw) == 10 + n + 70 * int(sys.argv[2]) * 4
PY
cmp -s <(tail -c 16000 "$DIR/logits1.npy") <(tail -c 16000 "$DIR/logits2.npy") ||
  python3 - "$DIR/logits1.npy" "$DIR/logits2.npy" <<'PY' || fail "logits differ between N=1 and N=2"
import struct, sys
a, b = (open(p, "rb").read()[128:] for p in sys.argv[1:])
x, y = (struct.unpack(f"<{len(a) // 4}f", s) for s in (a, b))
assert max(abs(p - q) for p, q in zip(x, y)) < 1e-4
PY
s1=$(grep -o '"tokens":\[[0-9,]*\]' "$DIR/all1.json") s2=$(grep -o '"tokens":\[[0-9,]*\]' "$DIR/all2.json")
[ -n "$s1" ] && [ "$s1" = "$s2" ] || fail "samples differ for one seed: $s1 vs $s2"
echo "full val split: loss $a (N=1), $b (N=2), $bpb bits/byte; logits (70, $V); sample $s1"

# 4. the same tokens as uint32 (llm.c's Llama 3 header: 20240801, version 7): the same run
mkdir "$DIR/shards32"
python3 - "$DIR/shards" "$DIR/shards32" <<'PY'
import os, struct, sys
for name in sorted(os.listdir(sys.argv[1])):
    raw = open(os.path.join(sys.argv[1], name), "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1) and len(raw) == 1024 + 2 * n
    ids = struct.unpack(f"<{n}H", raw[1024:])
    head = struct.pack("<3i", 20240801, 7, n) + bytes(1012)
    open(os.path.join(sys.argv[2], name), "wb").write(head + struct.pack(f"<{n}I", *ids))
PY
run 2 "$TRAIN" --preset small --vocab "$V" --seq-len 64 --data "$DIR/shards32" --global-batch 12 \
  --steps 40 --eval-every 0 --json > "$DIR/train32.json"
for f in first_loss final_loss val_loss; do
  [ "$(json_field "$DIR/train32.json" $f)" = "$(json_field "$DIR/train.json" $f)" ] ||
    fail "$f on uint32 shards $(json_field "$DIR/train32.json" $f), on uint16 $(json_field "$DIR/train.json" $f)"
done
run 1 "$EVAL" --checkpoint "$DIR/ckpt" --data "$DIR/shards32" --match-train --json > "$DIR/eval32.json"
[ "$(json_field "$DIR/eval32.json" loss)" = "$(json_field "$DIR/eval1.json" loss)" ] ||
  fail "fsdp-eval on uint32 shards $(json_field "$DIR/eval32.json" loss), on uint16 $(json_field "$DIR/eval1.json" loss)"
echo "uint32 (Llama 3 format) shards: the same losses ($(json_field "$DIR/train32.json" final_loss)) and eval"

# 5. named errors
run 1 "$TRAIN" --preset small --vocab 100 --data "$DIR/shards" --steps 1 > /dev/null 2> "$DIR/err" && fail "vocab 100 trained"
grep -q "fort_000000.bin: token [0-9]* is [0-9]*, outside the model's vocabulary of 100" "$DIR/err" ||
  fail "no named error for tokens past the vocabulary: $(cat "$DIR/err")"
cp "$DIR/shards/fort_000001.bin" "$DIR/cut.bin"
truncate -s -3 "$DIR/cut.bin"
run 1 "$TRAIN" --preset small --vocab "$V" --data "$DIR/cut.bin" --steps 1 > /dev/null 2> "$DIR/err" && fail "a cut shard trained"
grep -q "cut.bin: the header says [0-9]* uint16 tokens .* truncated" "$DIR/err" || fail "cut shard: $(cat "$DIR/err")"
mkdir "$DIR/badvocab"
cp "$DIR/vocab/vocab.json" "$DIR/badvocab/"
printf '#version: 0.2\nĠ t\nq zz\n' > "$DIR/badvocab/merges.txt"
"$TOKENIZE" --vocab "$DIR/badvocab" --ids "$DIR/text" > /dev/null 2> "$DIR/err" && fail "a bad vocabulary loaded"
grep -q "badvocab/merges.txt: line 3: token \"zz\" is not in the vocabulary" "$DIR/err" || fail "bad merges: $(cat "$DIR/err")"
echo "named errors: vocabulary, truncated shard, bad merges, existing output"
