#!/usr/bin/env bash
# tests/ckpt/test_ckpt_train.sh — fsdp-train's checkpoints under mpirun:
#  1. exact resume: 20 uninterrupted steps vs 10 (--stop-after, as if preempted)
#     + new processes + --resume auto + 10 (N = 2 ZeRO-3, N = 3 ZeRO-2, N = 2
#     with bf16 parameters, N = 2 with fp16 parameters and a loss scale that
#     overflows and backs off every few steps): the same losses, skipped steps
#     and loss scales, and bit-identical final weights and optimizer state;
#  2. crash safety: rank 1 killed (SIGKILL, FSDP_CKPT_FAULT) in the middle of
#     writing step 10 leaves `latest` at step-5, which loads; --resume auto
#     continues from it, finishes, and the leftover temporary directory is gone;
#  3. the trainer's bad input: resuming a model of another shape, or from a
#     directory without `latest`, fails with the file and the problem named.
# Arguments: mpirun fsdp-train fsdp-ckpt.
set -euo pipefail
MPIRUN=$1 TRAIN=$2 CKPT=$3
DIR=$(mktemp -d /tmp/fsdp-ckpt-train-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
export OPENBLAS_NUM_THREADS=1
head -c 60000 /usr/share/games/fortunes/fortunes > "$DIR/text" 2>/dev/null ||
  for i in $(seq 2000); do echo "line $i of a small corpus for the resume test"; done > "$DIR/text"

fail() { echo "FAIL: $*"; exit 1; }
train() { # np, then fsdp-train flags
  local np=$1; shift
  "$MPIRUN" --oversubscribe --bind-to none -np "$np" "$TRAIN" --preset tiny --data "$DIR/text" \
    --global-batch 12 --steps 20 --eval-every 0 --json "$@"
}
losses() { grep -o '"event":"step","step":[0-9]*,"loss":[0-9.e+-]*' "$@"; }

# Runs named <N><strategy>[-bf16|-f16]; the first (N = 2, ZeRO-3) is the reference
# below. f16: a loss scale of 3e38 doubles past fp32's range every 3 good steps,
# overflows, is skipped and backs off: the resume must restore the scale and
# its good-step count for the same steps to be skipped with the same scales.
scaler_flags=(--loss-scale 3e38 --loss-scale-interval 3)
for run in 2:zero3 3:zero2 2:zero3:bf16 2:zero3:f16; do
  IFS=: read -r np strategy dtype <<< "$run"
  name=$np$strategy${dtype:+-$dtype}
  flags=(--strategy "$strategy" --dtype "${dtype:-f32}" --save-every 10)
  [ "$dtype" = f16 ] && flags+=("${scaler_flags[@]}")
  train "$np" "${flags[@]}" --save-dir "$DIR/a$name" > "$DIR/a$name.json"
  train "$np" "${flags[@]}" --save-dir "$DIR/b$name" --stop-after 10 > "$DIR/b$name-1.json"
  [ "$(cat "$DIR/b$name/latest")" = "step-10" ] || fail "$name: --stop-after 10 did not leave step-10"
  [ ! -e "$DIR/b$name/step-20" ] || fail "$name: the stopped run went past step 10"
  train "$np" "${flags[@]}" --save-dir "$DIR/b$name" --resume auto > "$DIR/b$name-2.json"
  grep -q '"event":"resume","step":10' "$DIR/b$name-2.json" || fail "$name: no resume event"
  [ "$(losses "$DIR/a$name.json" | wc -l)" -eq 20 ] || fail "$name: expected 20 step lines"
  diff <(losses "$DIR/a$name.json") \
       <(losses "$DIR/b$name-1.json" "$DIR/b$name-2.json" | sed 's/^[^:]*json://') \
    || fail "$name: losses of the resumed run differ"
  scales() { grep -o '"event":"skip","step":[0-9]*\|"loss_scale":[0-9.e+-]*' "$@" | sed 's/^[^:]*json://'; }
  diff <(scales "$DIR/a$name.json") <(scales "$DIR/b$name-1.json" "$DIR/b$name-2.json") \
    || fail "$name: skipped steps or loss scales of the resumed run differ"
  if [ "$dtype" = f16 ]; then
    [ "$(grep -c '"event":"skip"' "$DIR/a$name.json")" -ge 4 ] || fail "$name: the scale never overflowed"
    grep -q '"loss_scaler": {"scale": 3' "$DIR/b$name/step-10/manifest.json" || fail "$name: no scale saved"
    "$CKPT" reshard "$DIR/b$name/step-10" --world 3 "$DIR/r$name" > /dev/null
    [ "$(grep loss_scaler "$DIR/r$name/step-10/manifest.json")" = \
      "$(grep loss_scaler "$DIR/b$name/step-10/manifest.json")" ] || fail "$name: reshard lost the loss scale"
  fi
  "$CKPT" consolidate "$DIR/a$name" "$DIR/a$name.safetensors"
  "$CKPT" consolidate "$DIR/b$name" "$DIR/b$name.safetensors"
  cmp "$DIR/a$name.safetensors" "$DIR/b$name.safetensors" || fail "$name: final weights differ"
  echo "exact resume, N=$np $strategy ${dtype:-f32}: 20 losses and $(stat -c %s "$DIR/a$name.safetensors") bytes of weights and state identical"
done
ref=2zero3

# 2. crash safety
train 2 --save-dir "$DIR/c" --save-every 5 --stop-after 5 > /dev/null
FSDP_CKPT_FAULT=kill:rank=1:step=10:after_bytes=2000 train 2 --save-dir "$DIR/c" --save-every 5 \
  --resume auto > "$DIR/c-crash.json" 2>&1 && fail "the run with a killed rank succeeded"
[ "$(cat "$DIR/c/latest")" = "step-5" ] || fail "latest moved to $(cat "$DIR/c/latest") after the crash"
[ ! -e "$DIR/c/step-10" ] || fail "a half-written step-10 was committed"
ls -d "$DIR"/c/step-10.tmp-* > /dev/null || fail "the crash left no temporary directory (was it mid-save?)"
"$CKPT" verify "$DIR/c" > /dev/null || fail "step-5 does not verify after the crash"
train 2 --save-dir "$DIR/c" --save-every 5 --resume auto > "$DIR/c-resume.json"
grep -q '"event":"resume","step":5' "$DIR/c-resume.json" || fail "did not resume from step-5"
! ls -d "$DIR"/c/*.tmp-* > /dev/null 2>&1 || fail "the temporary directory was not cleaned up"
[ "$(cat "$DIR/c/latest")" = "step-20" ] || fail "latest is not step-20 at the end"
diff <(losses "$DIR/a$ref.json" | sed -n '6,20p') <(losses "$DIR/c-resume.json") \
  || fail "the run resumed after the crash does not match the uninterrupted one"
echo "crash safety: latest stayed at step-5 after rank 1 died mid-save; the resumed run matches"

# 3. bad input through the trainer
if train 2 --save-dir "$DIR/a$ref" --resume auto --embd 32 > /dev/null 2> "$DIR/shape.err"; then
  fail "a model of another shape resumed"
fi
grep -q "a$ref/step-20: tensor 'wte' is (256, 64) in the checkpoint but (256, 32) in the model" \
  "$DIR/shape.err" || fail "shape mismatch message: $(cat "$DIR/shape.err")"
mkdir -p "$DIR/empty/step-3"
if train 2 --resume "$DIR/empty" > /dev/null 2> "$DIR/latest.err"; then fail "resumed from nothing"; fi
grep -q "empty/latest: missing" "$DIR/latest.err" || fail "missing latest message: $(cat "$DIR/latest.err")"
cp -r "$DIR/b$ref" "$DIR/flip"
flip_bit() { # file offset
  local b; b=$(od -An -tu1 -j "$2" -N1 "$1")
  printf "$(printf '\\%03o' $((b ^ 1)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
flip_bit "$DIR/flip/step-20/rank-1-of-2.bin" 5000
cmp -s "$DIR/flip/step-20/rank-1-of-2.bin" "$DIR/b$ref/step-20/rank-1-of-2.bin" && fail "no bit flipped"
if train 3 --resume "$DIR/flip" > /dev/null 2> "$DIR/flip.err"; then fail "resumed from a corrupt shard"; fi
[ "$(grep -c "flip/step-20/rank-1-of-2.bin: CRC-32 is .*: the file is corrupt" "$DIR/flip.err")" -eq 3 ] ||
  fail "not every rank named the corrupt shard: $(cat "$DIR/flip.err")"
if train 2 --save-dir "$DIR/a$ref" > /dev/null 2> "$DIR/fresh.err"; then fail "a fresh run reused a save dir"; fi
grep -q "already holds checkpoints" "$DIR/fresh.err" || fail "fresh run into a used dir: $(cat "$DIR/fresh.err")"
echo "bad input: shape mismatch, missing latest, a corrupt shard (seen by rank 1 of 3, named by all), a used save dir"

# 4. divergence (issue 14, case 2): --lr 1e8 --clip 0 drives the loss to NaN within
#    a few steps. That step is skipped on both ranks and retried; after --max-skips
#    3 in a row the run stops with the reason on every rank and a non-zero status,
#    and every committed step verifies (no NaN or Inf), `latest` included.
if train 2 --save-dir "$DIR/nan" --save-every 1 --lr 1e8 --clip 0 --max-skips 3 \
  > "$DIR/nan.json" 2> "$DIR/nan.err"; then fail "the diverged run exited 0"; fi
[ "$(grep -c "3 steps in a row skipped for non-finite values" "$DIR/nan.err")" -eq 2 ] ||
  fail "not every rank gave the reason: $(cat "$DIR/nan.err")"
[ "$(grep -c '"event":"skip"' "$DIR/nan.json")" -eq 3 ] || fail "expected 3 skip events"
last=$(grep -o '"event":"step","step":[0-9]*' "$DIR/nan.json" | tail -1 | grep -o '[0-9]*$')
[ "$(cat "$DIR/nan/latest")" = "step-$last" ] || fail "latest is $(cat "$DIR/nan/latest"), not step-$last"
for d in "$DIR"/nan/step-*; do "$CKPT" verify "$d" > /dev/null || fail "$d does not verify"; done
"$CKPT" export "$DIR/nan" "$DIR/nan.safetensors" > /dev/null || fail "the last good step does not export"
echo "divergence: skipped 3 times after step $last, stopped with the reason on both ranks; step-1..$last verify"
