#!/usr/bin/env bash
# tests/tools/test_bench_config.sh — fsdp-bench's configuration file (the same
# format as fsdp-train's, src/tools/config.h), one rank: --print-config is a
# fixed point (what it prints, read back, prints the same), every flag --help
# lists is a key, the command line
# overrides the file, a run under sharding rules checks its results (exit 0:
# no wrong element), and a rule that matches nothing is refused by file:line.
# One file serves both tools: the shipped configs/gpt2-small.yaml is read, the
# keys only fsdp-train takes skipped with a note, and every key of either
# tool's --help is taken or skipped by the other, never "unknown". --memory-plan
# prints the k --checkpoint auto chooses at --memory-budget.
# usage: test_bench_config.sh FSDP_BENCH FSDP_TRAIN GPT2_SMALL_YAML
set -euo pipefail
bench=$1 train=$2 shipped=$(realpath "$3")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
fail() { echo "FAIL: $*"; exit 1; }
cat > bench.yaml <<'YAML'
preset: tiny
iters: 2
warmup: 1
peak-size: 0
micro-batch: 2
strategy: zero2
sharding:
  - match: "h.*"
    wrap: true
  - match: "h.0"
    reshard_after_forward: true
  - match: "*.bias"
    wd_mult: 0
YAML
"$bench" --config bench.yaml --iters 3 --print-config > one.yaml
"$bench" --config one.yaml --print-config > two.yaml
cmp one.yaml two.yaml || fail "--print-config is not a fixed point: $(diff one.yaml two.yaml)"
grep -q '^iters: 3$' one.yaml || fail "--iters 3 did not override the file's 2"
grep -q '^strategy: zero2$' one.yaml || fail "strategy lost"
grep -q 'reshard_after_forward: true' one.yaml || fail "rules lost"
"$bench" --config one.yaml > run.txt || fail "the run under rules failed: $(cat run.txt)"
grep -Eq '^zero2 .* 0$' run.txt || fail "no zero2 row with 0 wrong: $(tail -2 run.txt)"
for flag in $("$bench" --help | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u); do
  case $flag in --config|--print-config) continue ;; esac
  printf '%s: "@"\n' "${flag#--}" > key.yaml
  err=$("$bench" --config key.yaml --print-config 2>&1 >/dev/null || true)
  if grep -q "unknown key" <<<"$err"; then fail "$flag has no key: $err"; fi
done
sed 's/match: "h.0"/match: "h.7"/' bench.yaml > bad.yaml
set +e
err=$("$bench" --config bad.yaml 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "a rule matching nothing was accepted"
grep -qF "bad.yaml:10: rule 2 (match 'h.7') matches no unit" <<<"$err" || fail "message: $err"
err=$("$bench" --config "$shipped" --print-config 2>&1 >shipped.yaml) ||
  fail "fsdp-bench refuses $shipped: $err"
grep -q "gpt2-small.yaml:4: skipping 'steps': a key of fsdp-train that fsdp-bench has no use for" \
  <<<"$err" || fail "no note on the skipped key 'steps': $err"
grep -q '^shard-size: 2$' shipped.yaml || fail "the shared key shard-size lost: $(cat shipped.yaml)"
for pair in "$train $bench" "$bench $train"; do
  set -- $pair
  for flag in $("$1" --help | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u); do
    case $flag in --config|--print-config) continue ;; esac
    printf '%s: "@"\n' "${flag#--}" > key.yaml
    err=$("$2" --config key.yaml --print-config 2>&1 >/dev/null || true)
    if grep -q "unknown key" <<<"$err"; then fail "$(basename "$2") does not know $1's $flag: $err"; fi
  done
done
# --memory-plan's checkpoint auto rows: 1558M at 16 x 1024 in bf16 (39.66 GiB of
# activations with none checkpointed, 5.15 with all, 26.11 of model state on
# one rank: nothing gathered, no gradient buffers): a 40 GiB budget needs 37
# of the 48 blocks, 78 GiB none.
plan=$("$bench" --memory-plan --micro-batch 16 --seq-len 1024 --dtype bf16 --preset 1558M \
       --memory-budget 40 2>&1)
grep -Eq '^1558M +48 +39\.66 +31\.58 +22\.77 +13\.96 +5\.15 +26\.11 +37 *$' <<<"$plan" ||
  fail "--memory-plan's checkpoint auto row for 1558M at 40 GiB: $(grep -A4 'Checkpoint auto' <<<"$plan")"
plan=$("$bench" --memory-plan --micro-batch 16 --seq-len 1024 --dtype bf16 --preset 1558M \
       --memory-budget 78 2>&1)
grep -Eq '^1558M +48 .* 26\.11 +0 *$' <<<"$plan" || fail "1558M at 78 GiB: auto checkpoints blocks"
echo "ok: fsdp-bench reads, overrides and prints its configuration; rules apply; bad rules refused"
