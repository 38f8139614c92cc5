#!/usr/bin/env bash
# tests/tools/test_config.sh — fsdp-train's configuration file (src/tools/config.h)
# on a tiny GPT-2, one rank: a file with a command line's flags as keys gives
# the same losses; --print-config fed back gives them again (with sharding
# rules too); the command line overrides the file; the rules take effect and
# the plan prints what each matched; every bad file is refused with a message
# naming the file, the line and the rule. With a launcher (e.g. "fsdp-run
# --nproc-per-node 2 --master-port 0"), the runs go through it: the same
# reproductions over several ranks, the bad files left to the one-rank run.
# usage: test_config.sh FSDP_TRAIN [LAUNCHER...]
set -euo pipefail
train=$1
shift
launch=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
for i in $(seq 200); do echo "line $i of a small text the tiny model reads, again and again."; done > text.txt
fail() { echo "FAIL: $*"; exit 1; }
losses() { "${launch[@]}" "$train" "$@" --json | grep -o '"loss":[0-9.]*' | tr '\n' ' '; }

flags=(--preset tiny --layers 3 --data text.txt --steps 3 --global-batch 4 --eval-every 0
       --lr 0.003 --wd 0.1 --strategy zero2 --seed 7)
cat > same.yaml <<'EOF'
# the flags above, as keys
preset: tiny
layers: 3
data: text.txt
steps: 3
global-batch: 4
eval-every: 0
lr: 0.003
wd: 0.1
strategy: zero2
seed: 7
EOF
cli=$(losses "${flags[@]}")
file=$(losses --config same.yaml)
echo "command line: $cli"
echo "file:         $file"
[ -n "$cli" ] && [ "$cli" = "$file" ] || fail "the file's run differs from the command line's"
"$train" --config same.yaml --print-config > printed.yaml
again=$(losses --config printed.yaml)
[ "$again" = "$cli" ] || fail "--print-config fed back: $again"
grep -q '^strategy: zero2$' printed.yaml || fail "printed config lacks strategy: zero2"
over=$(losses --config same.yaml --steps 2 | wc -w)
[ "$over" -eq 3 ] || fail "--steps 2 over the file's 3: $over losses (2 steps + eval)"

# Every flag --help lists is a key: a file giving it a value of the wrong kind
# gets that value refused, never "unknown key".
for flag in $("$train" --help | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u); do
  case $flag in --config|--print-config) continue ;; esac
  printf '%s: "@"\n' "${flag#--}" > key.yaml
  err=$("$train" --config key.yaml --print-config 2>&1 >/dev/null || true)
  if grep -q "unknown key" <<<"$err"; then fail "$flag has no key: $err"; fi
done

# Sharding rules: they shape the plan, the plan says what each matched, and a
# printed configuration carries them.
cat > rules.yaml <<'EOF'
preset: tiny
layers: 3
data: text.txt
steps: 3
global-batch: 4
eval-every: 0
wd: 0.1
sharding:
  - match: "h.[01]"
    wrap_min_params: 60000
    checkpoint: true
  - match: "h.2"
    wrap: true
    reshard_after_forward: false
  - match: "h.*.attn.*"
    lr_mult: 0.5
  - match: "*.bias"
    wd_mult: 0
EOF
out=$("${launch[@]}" "$train" --config rules.yaml)
echo "$out" | head -9
grep -Eq '^  h\.0-1 +GPT2Block +99968 .* yes ' <<<"$out" || fail "h.0-1 not one unit"
grep -Eq '^  h\.2 +GPT2Block +49984 .* no ' <<<"$out" || fail "h.2 not ZeRO-2"
grep -q "rule 3 (rules.yaml:15, match 'h.\*.attn.\*'): lr_mult 0.5 -> 12 tensors" <<<"$out" ||
  fail "rule 3's matches not printed"
ruled=$(losses --config rules.yaml)
"$train" --config rules.yaml --print-config > rules2.yaml
[ "$(losses --config rules2.yaml)" = "$ruled" ] || fail "printed rules give other losses"
sed 's/lr_mult: 0.5/lr_mult: 1/' rules.yaml > nolr.yaml
[ "$(losses --config nolr.yaml)" != "$ruled" ] || fail "lr_mult 0.5 changed nothing"
if ((${#launch[@]})); then
  echo "ok: through ${launch[*]}: the file reproduces the command line, --print-config the file"
  exit 0
fi

# Bad files: exit 2 (file errors) or 1 (rules checked against the model), and
# the message names file:line and the rule.
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
  last=$err
}
base='preset: tiny
data: text.txt
steps: 1
global-batch: 4'
bad unknown-key "fsdp-train: unknown-key.yaml:5: unknown key 'stepz'" <<<"$base
stepz: 3"
bad wrong-type "fsdp-train: wrong-type.yaml:5: --lr 'fast' is not a number" <<<"$base
lr: fast"
bad not-scalar "not-scalar.yaml:5: steps: a list where a single value belongs" <<<"preset: tiny
data: text.txt
global-batch: 4
eval-every: 0
steps: [1, 2]"
bad rule-key "rule-key.yaml:7: rule 1: no such key 'wrapp'" <<<"$base
sharding:
  - match: \"h.*\"
    wrapp: true"
bad rule-list-key "rule-list-key.yaml:7: rule 1: a list where a key belongs" <<<"$base
sharding:
  - match: \"h.*\"
    [wrap]: true"
bad rule-type "rule-type.yaml:7: rule 1: lr_mult: 'half' is not a number from 0 to 3.4e38 (a float)" <<<"$base
sharding:
  - match: \"h.*\"
    lr_mult: half"
bad rule-bool "rule-bool.yaml:7: rule 1: wrap: '1' is not true or false" <<<"$base
sharding:
  - match: \"h.*\"
    wrap: 1"
bad match-list "match-list.yaml:6: rule 1: match: a list where a pattern belongs" <<<"$base
sharding:
  - match: [h.0, h.1]
    wrap: true"
bad no-module "no-module.yaml:6: rule 1 (match 'blocks.*') matches no module" <<<"$base
sharding:
  - match: \"blocks.*\"
    wrap: true"
bad no-tensor "no-tensor.yaml:8: rule 2 (match 'h.*.attention.*') matches no tensor" <<<"$base
sharding:
  - match: \"h.*\"
    wrap: true
  - match: \"h.*.attention.*\"
    lr_mult: 0.5"
bad no-unit "no-unit.yaml:6: rule 1 (match 'lm_head') matches no unit" <<<"$base
sharding:
  - match: \"lm_head\"
    param_dtype: bf16"
bad conflict "conflict.yaml:8: rule 2 (match 'h.*.attn.c_attn.*') sets lr_mult 0.5 on tensor 'h.0.attn.c_attn.weight', but rule 1 (line 6, match 'h.*') sets 1" <<<"$base
sharding:
  - match: \"h.*\"
    lr_mult: 1
  - match: \"h.*.attn.c_attn.*\"
    lr_mult: 0.5"
bad wrap-conflict "wrap-conflict.yaml:8: rule 2 (match 'h.1') sets wrap false on module 'h.1', but rule 1 (line 6, match 'h.*') sets true" <<<"$base
sharding:
  - match: \"h.*\"
    wrap: true
  - match: \"h.1\"
    wrap: false"
bad checkpoint-root "checkpoint-root.yaml:7: rule 1 (match 'h.0') checkpoints module 'h.0', which no rule or --wrap puts in a unit" <<<"$base
no-wrap: true
sharding:
  - match: \"h.0\"
    checkpoint: true"
# checkpoint rules are joined into one comma-separated list of patterns: a
# comma in one would split it, and a list past its buffer was cut silently
# ('h.4' of 'h.47' checkpointed other units).
bad checkpoint-comma "checkpoint-comma.yaml:6: rule 1 (match 'h.0,h.1'): checkpoint: a pattern with ','" <<<"$base
sharding:
  - match: \"h.0,h.1\"
    checkpoint: true"
{ echo "$base"; echo "sharding:"
  for i in $(seq 40); do printf '  - match: "h.%s*"\n    checkpoint: true\n' "$(head -c 20 /dev/zero | tr '\0' 9)$i"; done
} > long-rules.txt
bad checkpoint-long "checkpoint-long.yaml:" < long-rules.txt
grep -q "the checkpoint rules' patterns come to more than" <<<"$last" || fail "checkpoint-long: $last"
bad duplicate "duplicate.yaml:5: steps given twice (first at line 3)" <<<"$base
steps: 2"
bad not-yaml "not-yaml.yaml:8: not YAML: found unexpected end of stream while scanning a quoted scalar at line 6" <<<"$base
sharding:
  - match: \"h.*
    wrap: true"
bad two-docs "two-docs.yaml:5: a second document" <<<"$base
---
steps: 2"
bad empty "empty.yaml:1: no keys: the file is empty" </dev/null
# fsdp-bench's keys are skipped with a note, once each: a second is refused
bad skipped-twice "skipped-twice.yaml:6: iters given twice (first at line 5)" <<<"$base
iters: 3
iters: 4"
bad lr-nan "lr-nan.yaml:5: --lr 'nan' is not a finite number" <<<"$base
lr: nan"
bad no-layers "no-layers.yaml:5: --layers '0' is not an integer from 1 to 2147483647" <<<"$base
layers: 0"
bad huge-batch "huge-batch.yaml:4: --global-batch '9223372036854775807' is not an integer from 0 to 2147483647" <<<"preset: tiny
data: text.txt
steps: 1
global-batch: 9223372036854775807"
bad huge-mult "huge-mult.yaml:7: rule 1: lr_mult: '1e308' is not a number from 0 to 3.4e38" <<<"$base
sharding:
  - match: \"h.*\"
    lr_mult: 1e308"
bad huge-min-params "huge-min-params.yaml:7: rule 1: wrap_min_params: '1e30' is not a whole number from 1 to 2^53" <<<"$base
sharding:
  - match: \"h.*\"
    wrap_min_params: 1e30"
# Wrap rules beside --checkpoint: the message names the flag given, no more,
# and nothing follows it (an empty "fsdp-train: rank 0: " line did).
bad rules-and-flag "rules-and-flag.yaml:7: rule 1 (match 'h.*') chooses the units and their checkpointing, and so does --checkpoint GPT2Block" <<<"$base
checkpoint: GPT2Block
sharding:
  - match: \"h.*\"
    wrap: true"
[ "$(wc -l <<<"$last")" -eq 1 ] || fail "rules-and-flag: more than the one line: $last"
if grep -q -- "--wrap-min-params" <<<"$last"; then fail "rules-and-flag: names an absent flag"; fi

# Hostile sizes, each within a time bound on 2 busy cores, refused by name.
hostile() { # name, seconds, expected text; the file is already there
  local name=$1 secs=$2 want=$3 err rc
  set +e
  err=$(timeout "$secs" "$train" --config "$name.yaml" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -ne 124 ] || fail "$name: still running after ${secs}s"
  [ "$rc" -ne 0 ] || fail "$name: accepted"
  grep -qF -- "$want" <<<"$err" || fail "$name: message '${err:0:300}' lacks '$want'"
  [ "${#err}" -lt 400 ] || fail "$name: ${#err} bytes of message (a value echoed whole?)"
  echo "ok $name: $err"
}
# 100,000 distinct keys (1 MB, under the size limit): refused at the first
# (the duplicate scan compared every key with every earlier one: ~10 s).
awk 'BEGIN { for (i = 0; i < 100000; i++) printf "k%x: 1\n", i }' > many-keys.yaml
hostile many-keys 6 "many-keys.yaml:1: unknown key 'k0'"
# 200,000 nested lists in 400 KB (libyaml alone took a minute).
awk 'BEGIN { s = "sharding: "; for (i = 0; i < 200000; i++) s = s "["; for (i = 0; i < 200000; i++) s = s "]"; print s }' > deep.yaml
hostile deep 6 "deep.yaml:1: nested deeper than 16 levels, the limit"
head -c 10485760 /dev/zero | tr '\0' 'k' > huge.yaml
hostile huge 4 "huge.yaml:1: larger than 1048576 bytes, the limit for a configuration file"
# A bad value of 1 MB (under the file limit) is cut in the message.
{ printf 'preset: tiny\nseed: '; head -c 1000000 /dev/zero | tr '\0' 9; echo; } > long-value.yaml
hostile long-value 4 "long-value.yaml:2: seed: a value of 1000000 bytes ('9999"
{ printf 'preset: tiny\nseed: '; head -c 4000 /dev/zero | tr '\0' 9; echo; } > bad-value.yaml
hostile bad-value 4 "bad-value.yaml:2: --seed '$(head -c 64 /dev/zero | tr '\0' 9)...' is not a non-negative integer"

# --print-config under a launcher prints once (rank 0), so its output reads back.
OMPI_COMM_WORLD_RANK=1 "$train" --config same.yaml --print-config > rank1.yaml
[ ! -s rank1.yaml ] || fail "rank 1 printed the configuration too"
if command -v mpirun >/dev/null; then
  mpirun --allow-run-as-root --oversubscribe -np 2 "$train" --config same.yaml --print-config \
    > mpi.yaml
  "$train" --config mpi.yaml --print-config > /dev/null || fail "mpirun's --print-config refused"
fi
echo "ok: the file reproduces the command line, --print-config reproduces the file, rules apply, bad files are refused"
