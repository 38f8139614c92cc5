#!/usr/bin/env bash
# tests/tools/test_config_torchprime.sh — torchprime's sharding YAML in
# fsdp-train's configuration file (src/tools/config.h): a file of partition
# specs in torchprime's FSDP shape (tests/tools/torchprime/: GPT-2's, and
# torchprime's own llama-fsdp.yaml on the tiny Llama) gives the same losses as
# the command line it amounts to, on one rank and under mpirun -np 2; our own
# rules read the same way over Hugging Face's names (model.layers.*);
# a module spec makes units as a wrap rule does; --print-config carries the
# specs; every spec fsdp cannot follow (2-D sharding among them) is refused
# naming the file and the line, and hostile files stay fast.
# usage: test_config_torchprime.sh FSDP_TRAIN SOURCE_ROOT
set -euo pipefail
train=$1
src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
for i in $(seq 200); do echo "line $i of a small text the tiny model reads, again and again."; done > text.txt
fail() { echo "FAIL: $*"; exit 1; }
losses() { "$train" "$@" --json | grep -o '"loss":[0-9.]*' | tr '\n' ' '; }
mpi_losses() {
  mpirun --allow-run-as-root --oversubscribe -np 2 -x OPENBLAS_NUM_THREADS=1 "$train" "$@" --json |
    grep -o '"loss":[0-9.]*' | tr '\n' ' '
}

run=(--preset tiny --layers 3 --data text.txt --steps 3 --global-batch 4 --eval-every 0 --seed 5)
# GPT-2's every tensor and its blocks' outputs, as torchprime's llama-fsdp.yaml
# says Llama's: the plan the command line's default (a unit per GPT2Block) makes.
cp "$src/tests/tools/torchprime/gpt2-fsdp.yaml" .
out=$("$train" --config gpt2-fsdp.yaml "${run[@]}" 2>&1) || fail "gpt2-fsdp.yaml refused: $out"
grep -Eq '^  h\.2 +GPT2Block ' <<<"$out" || fail "h.2 is no unit: $out"
grep -qF "  h.*: [[fsdp, data], null, null] (gpt2-fsdp.yaml:22) -> 3 modules (h.0 .. h.2): batch over fsdp and data: data parallelism, a unit each" <<<"$out" ||
  fail "the blocks' spec not reported: $out"
grep -qF "  h.*.attn.c_proj.weight: [null, fsdp] (gpt2-fsdp.yaml:10) -> 3 tensors (h.0.attn.c_proj.weight .. h.2.attn.c_proj.weight): sharded over fsdp (flat shards)" <<<"$out" ||
  fail "a tensor spec not reported: $out"
grep -qF '  "": [fsdp, null, null] (gpt2-fsdp.yaml:23) -> 1 module (the model): batch over fsdp: data parallelism' <<<"$out" ||
  fail "the model's spec not reported: $out"
if grep -q "no spec names" <<<"$out"; then fail "a tensor of gpt2-fsdp.yaml's unnamed: $out"; fi
cli=$(losses "${run[@]}")
file=$(losses --config gpt2-fsdp.yaml "${run[@]}")
echo "command line: $cli"
echo "torchprime:   $file"
[ -n "$cli" ] && [ "$cli" = "$file" ] || fail "the specs' run differs from the command line's"
"$train" --config gpt2-fsdp.yaml "${run[@]}" --print-config > printed.yaml || fail "--print-config refused"
grep -qxF 'h.*: [[fsdp, data], null, null]' printed.yaml || fail "--print-config lacks h.*'s spec"
grep -qxF '"": [fsdp, null, null]' printed.yaml || fail "--print-config lacks the model's spec"
[ "$(losses --config printed.yaml)" = "$cli" ] || fail "--print-config fed back: other losses"

# Specs choose units only: --checkpoint still recomputes them.
out=$("$train" --config gpt2-fsdp.yaml "${run[@]}" --steps 1 --checkpoint GPT2Block 2>&1) ||
  fail "specs with --checkpoint refused: $out"
read -r kept full < <(grep -oE 'activations [0-9.]+ MiB/rank \([0-9.]+' <<<"$out" | tr -d '(' |
  awk '{ print $2, $4 }')
awk -v k="$kept" -v f="$full" 'BEGIN { exit !(k < f) }' ||
  fail "--checkpoint beside specs: activations $kept MiB of $full"

# A module spec is a unit boundary: with --no-wrap, "h.1" alone is a unit,
# as a wrap rule makes it, to the bit.
printf 'h.1: [fsdp, null, null]\n' > one.yaml
printf 'sharding:\n  - match: "h.1"\n    wrap: true\n' > rule.yaml
out=$("$train" --config one.yaml "${run[@]}" --no-wrap 2>&1) || fail "one.yaml refused: $out"
grep -Eq '^  h\.1 +GPT2Block +49984 ' <<<"$out" || fail "h.1 is no unit: $out"
if grep -Eq '^  h\.[02] ' <<<"$out"; then fail "h.0 or h.2 made a unit: $out"; fi
grep -qF "  40 tensors no spec names (wte .. h.1.mlp.c_proj.bias): sharded over fsdp all the same" <<<"$out" ||
  fail "the tensors no spec names not reported: $out"
spec=$(losses --config one.yaml "${run[@]}" --no-wrap)
[ "$spec" = "$(losses --config rule.yaml "${run[@]}" --no-wrap)" ] ||
  fail "the spec's unit differs from the rule's"

# The head is tied to wte, so "lm_head.weight" (Hugging Face's name for it)
# is wte, and "lm_head" a module the specs may name.
printf 'lm_head.weight: [fsdp, null]\nlm_head: [[fsdp, data], null, null]\n' > tied.yaml
out=$("$train" --config tied.yaml "${run[@]}" --steps 1 2>&1) || fail "tied.yaml refused: $out"
grep -qF "  lm_head.weight: [fsdp, null] (tied.yaml:1) -> 1 tensor (lm_head.weight): sharded" <<<"$out" ||
  fail "the tied head's spec not reported: $out"
grep -qF "  lm_head: [[fsdp, data], null, null] (tied.yaml:2) -> 1 module (lm_head): batch over fsdp and data: data parallelism" <<<"$out" ||
  fail "the head's output spec not reported: $out"

if command -v mpirun >/dev/null; then
  two_cli=$(mpi_losses "${run[@]}")
  two_file=$(mpi_losses --config gpt2-fsdp.yaml "${run[@]}")
  echo "mpirun -np 2: command line: $two_cli"
  echo "mpirun -np 2: torchprime:   $two_file"
  [ -n "$two_cli" ] && [ "$two_cli" = "$two_file" ] || fail "2 ranks: the specs' run differs"
fi

# Llama: torchprime's llama-fsdp.yaml as it ships, with --no-wrap so that its
# module specs alone make the units, against the command line's default (a
# unit per LlamaDecoderLayer): the same plan and the same losses to the bit,
# on one rank and two.
lrun=(--model llama --preset tiny --data text.txt --steps 3 --global-batch 4 --eval-every 0 --seed 5)
cp "$src/tests/tools/torchprime/llama-fsdp.yaml" .
out=$("$train" --config llama-fsdp.yaml "${lrun[@]}" --no-wrap 2>&1) ||
  fail "llama-fsdp.yaml refused: $out"
grep -Eq '^  model\.layers\.1 +LlamaDecoderLayer +43136 ' <<<"$out" || fail "no unit per layer: $out"
grep -qF "  model.layers.*: [[fsdp, data], null, null] (llama-fsdp.yaml:20) -> 2 modules (model.layers.0 .. model.layers.1): batch over fsdp and data: data parallelism, a unit each" <<<"$out" ||
  fail "the layers' spec not reported: $out"
grep -qF "  lm_head.weight: [fsdp, null] (llama-fsdp.yaml:17) -> 1 tensor (lm_head.weight): sharded over fsdp (flat shards)" <<<"$out" ||
  fail "the head's spec not reported: $out"
if grep -q "no spec names" <<<"$out"; then fail "a Llama tensor llama-fsdp.yaml names unnamed: $out"; fi
# Bit for bit: the weights and optimizer state saved after the last step,
# every shard file's payload (past its 64-byte header, which carries the
# run's own id).
same_state() { # DIR_A DIR_B
  local f n=0
  for f in "$1"/step-3/rank-*.bin; do
    [ -f "$f" ] && cmp -s <(tail -c +65 "$f") <(tail -c +65 "$2/step-3/${f##*/}") || return 1
    n=$((n + 1))
  done
  [ "$n" -gt 0 ]
}
lcli=$(losses "${lrun[@]}" --save-dir cli1 --save-every 3)
lfile=$(losses --config llama-fsdp.yaml "${lrun[@]}" --no-wrap --save-dir file1 --save-every 3)
echo "llama command line: $lcli"
echo "llama torchprime:   $lfile"
[ -n "$lcli" ] && [ "$lcli" = "$lfile" ] || fail "llama: the specs' run differs from the command line's"
same_state cli1 file1 || fail "llama: the specs' weights or optimizer state differ"
if command -v mpirun >/dev/null; then
  two_cli=$(mpi_losses "${lrun[@]}" --save-dir cli2 --save-every 3)
  two_file=$(mpi_losses --config llama-fsdp.yaml "${lrun[@]}" --no-wrap --save-dir file2 --save-every 3)
  echo "llama mpirun -np 2: command line: $two_cli"
  echo "llama mpirun -np 2: torchprime:   $two_file"
  [ -n "$two_cli" ] && [ "$two_cli" = "$two_file" ] || fail "llama, 2 ranks: the specs' run differs"
  same_state cli2 file2 || fail "llama, 2 ranks: the specs' weights or optimizer state differ"
fi
echo "llama: the saved weights and optimizer state are the command line's, bit for bit"

# Our own rules over Hugging Face's names: units and checkpointing by
# "model.layers.*" are the command line's --wrap-min-params and --checkpoint,
# and a dtype per unit pattern shows in the plan.
printf 'sharding:\n  - match: "model.layers.*"\n    wrap_min_params: 40000\n    checkpoint: true\n' > hf.yaml
hf_flags=(--wrap-min-params 40000 --checkpoint LlamaDecoderLayer)
plan_of() { "$train" "$@" --steps 1 | grep -E '^  (model|root|activations)'; }
hf_plan=$(plan_of --config hf.yaml "${lrun[@]}")
echo "$hf_plan"
[ "$hf_plan" = "$(plan_of "${lrun[@]}" "${hf_flags[@]}")" ] && grep -q 'activations 2.19 MiB' <<<"$hf_plan" ||
  fail "rules over model.layers.* plan other units or checkpointing than ${hf_flags[*]}"
[ "$(losses --config hf.yaml "${lrun[@]}")" = "$(losses "${lrun[@]}" "${hf_flags[@]}")" ] ||
  fail "rules over model.layers.* give other losses than ${hf_flags[*]}"
printf 'sharding:\n  - match: "model.layers.*"\n    wrap: true\n  - match: "model.layers.1"\n    param_dtype: bf16\n' > hf-dtype.yaml
out=$("$train" --config hf-dtype.yaml "${lrun[@]}" --steps 1 2>&1) || fail "hf-dtype.yaml refused: $out"
grep -Eq '^  model\.layers\.0 .* f32$' <<<"$out" && grep -Eq '^  model\.layers\.1 .* bf16$' <<<"$out" ||
  fail "param_dtype by unit pattern: $out"

# Refused: exit non-zero, the message naming file:line (and what to do).
bad() { # name, expected text, then the YAML on stdin
  local name=$1 want=$2 err rc
  cat > "$name.yaml"
  set +e
  err=$("$train" --config "$name.yaml" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || fail "$name: accepted"
  grep -qF -- "$want" <<<"$err" || fail "$name: message '$err' lacks '$want'"
  echo "ok $name: $(grep -F -- "$want" <<<"$err" | head -1)"
}
base='preset: tiny
data: text.txt
steps: 1
global-batch: 4'
# torchprime's FSDP + tensor parallel shape: the first tensor axis is named
bad tp "tp.yaml:6: h.*.attn.c_attn.weight: dimension 0 on mesh axis 'tensor': 2-D sharding is not supported" <<<"$base
wte: [fsdp, null]
h.*.attn.c_attn.weight: [tensor, fsdp]
h.*: [fsdp, null, tensor]"
bad expert "expert.yaml:5: h.*: dimension 0 on mesh axis 'expert': 2-D sharding is not supported" <<<"$base
h.*: [[fsdp, expert], null, null]"
bad two-dims "two-dims.yaml:7: wte: dimensions 0 and 1 both sharded: 2-D sharding is not supported" <<<"$base
wte:
  - fsdp
  - data"
bad seq-dim "seq-dim.yaml:5: h.*: shards dimension 1 of module 'h.0''s output, not the batch (dimension 0): 2-D sharding is not supported" <<<"$base
h.*: [null, fsdp, null]"
bad replicated "replicated.yaml:5: wpe: no dimension on a mesh axis replicates it" <<<"$base
wpe: [null, null]"
bad data-tensor "data-tensor.yaml:5: wte: tensor 'wte' on mesh axis data: a parameter is sharded over fsdp alone" <<<"$base
wte: [data, null]"
bad tensor-rank "tensor-rank.yaml:5: h.*.ln_1.weight: 2 entries, but tensor 'h.0.ln_1.weight' has 1 dimensions" <<<"$base
h.*.ln_1.weight: [fsdp, null]"
bad tied-rank "tied-rank.yaml:5: lm_head.weight: 1 entries, but tensor 'lm_head.weight' has 2 dimensions" <<<"$base
lm_head.weight: [fsdp]"
bad output-rank "output-rank.yaml:5: h.*: 2 entries, but the output of module 'h.0' has 3 dimensions" <<<"$base
h.*: [fsdp, null]"
bad output-index "output-index.yaml:5: h.*[1]: module 'h.0' returns one tensor: there is no output [1]" <<<"$base
h.*[1]: [fsdp, null, null]"
bad tensor-index "tensor-index.yaml:5: wte[0]: [0] picks one of a module's outputs, but 'wte' is a tensor" <<<"$base
wte[0]: [fsdp, null]"
bad bad-index "bad-index.yaml:5: 'h.*[x]': an output index is [N]" <<<"$base
h.*[x]: [fsdp, null, null]"
bad no-match "no-match.yaml:5: model.layers.* matches no tensor and no module" <<<"$base
model.layers.*: [fsdp, null, null]"
# '*' stands for a whole number: "*.weight" is not ln_f.weight
bad star-digits "star-digits.yaml:5: *.weight matches no tensor and no module" <<<"$base
\"*.weight\": [fsdp]"
bad axis-name "axis-name.yaml:5: h.*: dimension 0: 'fdsp' where null, a mesh axis (data, fsdp, tensor, expert, context) or a list of axes belongs" <<<"$base
h.*: [fdsp, null, null]"
bad quoted-null "quoted-null.yaml:5: h.*: dimension 1: a quoted 'null' (the text; write null bare)" <<<"$base
h.*: [fsdp, 'null', null]"
bad empty-spec "empty-spec.yaml:5: h.*: a partition spec of 0 entries" <<<"$base
h.*: []"
bad name-chars "name-chars.yaml:5: 'h.(0)' is not a tensor or module name" <<<"$base
h.(0): [fsdp, null, null]"
bad twice "twice.yaml:6: h.* given twice (first at line 5)" <<<"$base
h.*: [fsdp, null, null]
h.*: [fsdp, null, null]"
bad index-twice "index-twice.yaml:6: h.*[0] given twice (first at line 5, as h.*)" <<<"$base
h.*: [fsdp, null, null]
h.*[0]: [fsdp, null, null]"
bad wrap-false "wrap-false.yaml:7: rule 1 (match 'h.1') sets wrap false on module 'h.1', but h.* (line 5) shards its output" <<<"$base
h.*: [fsdp, null, null]
sharding:
  - match: \"h.1\"
    wrap: false"
bad min-params "min-params.yaml:5: the partition specs make a unit of each module whose output they shard, and --wrap-min-params 60000 groups modules by size" <<<"$base
h.*: [fsdp, null, null]
wrap-min-params: 60000"
# a flag's key with a list that is no spec keeps the flag's message
bad flag-list "flag-list.yaml:5: steps: a list where a single value belongs" <<<"preset: tiny
data: text.txt
global-batch: 4
eval-every: 0
steps: [1, 2]"

# Hostile sizes stay fast (2 busy cores) and are refused by name.
hostile() { # name, seconds, expected text; the file is already there
  local name=$1 secs=$2 want=$3 err rc
  set +e
  err=$(timeout "$secs" "$train" --config "$name.yaml" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -ne 124 ] || fail "$name: still running after ${secs}s"
  [ "$rc" -ne 0 ] || fail "$name: accepted"
  grep -qF -- "$want" <<<"$err" || fail "$name: message '${err:0:300}' lacks '$want'"
  [ "${#err}" -lt 400 ] || fail "$name: ${#err} bytes of message (a name echoed whole?)"
  echo "ok $name: $err"
}
awk 'BEGIN { for (i = 0; i < 40000; i++) printf "k%x.weight: [fsdp]\n", i }' > many-specs.yaml
hostile many-specs 6 "many-specs.yaml:1025: more than 1024 partition specs, the limit"
# 1,024 specs, the limit, all one name but the last: the duplicate check sorts
awk 'BEGIN { print "preset: tiny"; for (i = 0; i < 1023; i++) printf "h.%d: [fsdp, null, null]\n", i; print "h.5: [fsdp, null, null]" }' > dup-specs.yaml
hostile dup-specs 6 "dup-specs.yaml:1025: h.5 given twice (first at line 7)"
# (a long key needs YAML's explicit "? KEY": an implicit one stops at 1,024)
{ printf '? h.'; head -c 100000 /dev/zero | tr '\0' 9; printf '\n: [fsdp, null, null]\n'; } > long-name.yaml
hostile long-name 4 "long-name.yaml:1: a name of 100002 bytes ('h.9999"
echo "ok: torchprime's specs reproduce the command line, make units, print back; bad specs are refused by file:line"
