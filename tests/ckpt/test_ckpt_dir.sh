#!/usr/bin/env bash
# tests/ckpt/test_ckpt_dir.sh — fsdp-train's save directory is safe to share
# and checked before training (issue 14, cases 4-7), under mpirun and fsdp-run:
#  1. two trainers on one --save-dir: the second is refused at start, naming
#     the first's host, pid and run; the first's checkpoints all verify;
#  2. a full disk while writing `latest` (FSDP_CKPT_FAULT=enospc:latest) leaves
#     step-10 committed, `latest` at step-5 and an empty latest.tmp; the restart
#     (mpirun, and fsdp-run --max-restarts 1 in one command) repairs `latest`,
#     resumes from step-10 and finishes with the uninterrupted run's losses; a
#     restart from step-5 itself re-runs 6-10 and keeps the identical step-10,
#     while another state at step 10 (another --lr) is still refused;
#  3. `latest` missing or dangling: a fresh run is refused (the directory
#     holds checkpoints); --resume auto repairs it; a `latest` that is a
#     symbolic link to a step resumes from it;
#  4. an unwritable save directory (a read-only tmpfs as root, mode 555
#     otherwise) and one without space for a checkpoint (a 1 MiB tmpfs, root
#     only) are refused before the first step, naming the problem.
# Every committed step verifies; no process of the test is left.
# Arguments: mpirun fsdp-train fsdp-ckpt fsdp-run.
set -euo pipefail
MPIRUN=$1 TRAIN=$2 CKPT=$3 RUN=$4
DIR=$(mktemp -d /tmp/fsdp-ckpt-dir-XXXXXX)
MOUNTS=()
cleanup() {
  for m in "${MOUNTS[@]}"; do umount "$m" 2> /dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
export OPENBLAS_NUM_THREADS=1
TAG="ckpt-dir-$$-$RANDOM" # in the environment of every process the test starts, not its own
for i in $(seq 2000); do echo "line $i of a small corpus for the save directory test"; done > "$DIR/text"

fail() { echo "FAIL: $*"; exit 1; }
train() { # np, then fsdp-train flags
  local np=$1; shift
  FSDP_TEST_TAG=$TAG "$MPIRUN" --oversubscribe --bind-to none -np "$np" "$TRAIN" --preset tiny --data "$DIR/text" \
    --global-batch 12 --steps 20 --eval-every 0 --json "$@"
}
losses() { grep -o '"event":"step","step":[0-9]*,"loss":[0-9.e+-]*' "$@" | sed 's/^[^:]*json://'; }
verify_all() { # every committed step of a save directory
  local n=0
  for s in "$1"/step-*; do
    [[ $s == *.tmp-* ]] && continue
    "$CKPT" verify "$s" > /dev/null || fail "$s does not verify"
    n=$((n + 1))
  done
  echo "$n"
}
leftovers() { grep -lsz "FSDP_TEST_TAG=$TAG" /proc/[0-9]*/environ || true; }

train 2 --save-dir "$DIR/ref" --save-every 5 > "$DIR/ref.json"

# 1. two trainers on one directory. The first is held (SIGSTOP of its rank 0,
# whose pid the lock records) while the second starts, so it is surely live.
train 2 --save-dir "$DIR/two" --save-every 5 --steps 40 > "$DIR/two-a.json" 2> "$DIR/two-a.err" &
first=$!
for _ in $(seq 600); do [ -e "$DIR/two/step-5" ] || ! kill -0 $first 2> /dev/null && break; sleep 0.1; done
holder=$(cat "$DIR/two/lock")
pid=$(sed -n 's/^fsdp-train pid \([0-9]*\) on host .*/\1/p' <<< "$holder")
[ -n "$pid" ] && kill -STOP "$pid" || fail "no holder recorded in the lock: '$holder'"
t0=$(date +%s.%N)
if train 2 --save-dir "$DIR/two" --resume auto > "$DIR/two-b.json" 2> "$DIR/two-b.err"; then
  kill -CONT "$pid"; fail "a second trainer ran on a locked save directory"
fi
secs=$(echo "$(date +%s.%N) - $t0" | bc)
kill -CONT "$pid"
grep -q "two/lock: the save directory is in use by another run (${holder%$'\n'})" "$DIR/two-b.err" ||
  fail "the refusal does not name the holder ($holder): $(cat "$DIR/two-b.err")"
! grep -q '"event":"step"' "$DIR/two-b.json" || fail "the refused trainer took steps"
wait $first || fail "the first trainer failed: $(cat "$DIR/two-a.err")"
[ "$(cat "$DIR/two/latest")" = "step-40" ] || fail "the first trainer's latest is $(cat "$DIR/two/latest")"
n=$(verify_all "$DIR/two")
[ "$n" -eq 8 ] || fail "expected 8 committed steps of the first trainer, found $n"
echo "two trainers: the second refused in $secs s, naming '$holder'; the first's $n steps verify"

# 2. a full disk while writing `latest`, then restarts
check_full_disk_state() { # save dir
  [ "$(cat "$1/latest")" = "step-5" ] || fail "latest moved to $(cat "$1/latest")"
  [ -e "$1/latest.tmp" ] && [ ! -s "$1/latest.tmp" ] || fail "no empty latest.tmp"
  "$CKPT" verify "$1/step-10" > /dev/null || fail "step-10 is not committed"
}
FSDP_CKPT_FAULT=enospc:latest:step=10 train 2 --save-dir "$DIR/full" --save-every 5 --resume auto \
  > /dev/null 2> "$DIR/full-1.err" && fail "the run with a full disk succeeded"
grep -q "full/latest.tmp: write failed after 0 bytes: No space left on device" "$DIR/full-1.err" ||
  fail "full disk message: $(cat "$DIR/full-1.err")"
check_full_disk_state "$DIR/full"
cp -r "$DIR/full" "$DIR/again"
cp -r "$DIR/full" "$DIR/other"
train 2 --save-dir "$DIR/full" --save-every 5 --resume auto > "$DIR/full-2.json" 2> "$DIR/full-2.err" ||
  fail "the restart after a full disk failed: $(cat "$DIR/full-2.err")"
grep -q "full/latest repaired (\`latest\` named step-5, older than the newest complete step-10): now step-10" \
  "$DIR/full-2.err" || fail "no repair reported: $(cat "$DIR/full-2.err")"
grep -q '"event":"resume","step":10' "$DIR/full-2.json" || fail "did not resume from step-10"
diff <(losses "$DIR/ref.json" | sed -n '11,20p') <(losses "$DIR/full-2.json") ||
  fail "the restarted run does not match the uninterrupted one"
[ ! -e "$DIR/full/latest.tmp" ] || fail "latest.tmp left behind"
n=$(verify_all "$DIR/full")
echo "full disk at latest (mpirun): state step-10 + latest step-5 + empty latest.tmp; the restart repaired latest, resumed at 10, matched; $n steps verify"

# A restart from step-5 itself (an explicit path: no repair) re-runs steps 6-10
# and finds step-10 committed with exactly its state: kept, not refused.
id10=$("$CKPT" inspect "$DIR/again/step-10" | grep -o 'id [0-9a-f]*')
train 2 --save-dir "$DIR/again" --save-every 5 --resume "$DIR/again/step-5" > "$DIR/again.json" \
  2> "$DIR/again.err" || fail "the restart from step-5 was refused: $(cat "$DIR/again.err")"
[ "$("$CKPT" inspect "$DIR/again/step-10" | grep -o 'id [0-9a-f]*')" = "$id10" ] ||
  fail "step-10 was rewritten"
[ "$(cat "$DIR/again/latest")" = "step-20" ] || fail "latest is $(cat "$DIR/again/latest")"
diff <(losses "$DIR/ref.json" | sed -n '6,20p') <(losses "$DIR/again.json") ||
  fail "the run restarted from step-5 does not match the uninterrupted one"
train 2 --save-dir "$DIR/other" --save-every 5 --resume "$DIR/other/step-5" --lr 0.01 \
  > /dev/null 2> "$DIR/other.err" && fail "another state at step 10 replaced the committed one"
grep -q "other/step-10 already exists and is not this run's state at step 10 (.*rank-0-of-2.bin: byte [0-9]* differs)" \
  "$DIR/other.err" || fail "another state at step 10: $(cat "$DIR/other.err")"
echo "the same steps re-run from step-5: step-10 ($id10) kept and the run finished; another learning rate refused at step 10; $(verify_all "$DIR/again") + $(verify_all "$DIR/other") steps verify"

FSDP_TEST_TAG=$TAG FSDP_CKPT_FAULT=enospc:latest:step=10 "$RUN" --nproc-per-node 2 --master-port 0 --max-restarts 1 \
  "$TRAIN" --preset tiny --data "$DIR/text" --global-batch 12 --steps 20 --eval-every 0 --json \
  --save-dir "$DIR/fullrun" --save-every 5 --resume auto > "$DIR/fullrun.json" 2> "$DIR/fullrun.err" ||
  fail "fsdp-run --max-restarts 1 did not recover: $(cat "$DIR/fullrun.err")"
grep -q "restarting the worker group" "$DIR/fullrun.err" || fail "fsdp-run did not restart"
grep -q '"event":"resume","step":10' "$DIR/fullrun.json" || fail "fsdp-run: did not resume from step-10"
[ "$(cat "$DIR/fullrun/latest")" = "step-20" ] || fail "fsdp-run: latest is $(cat "$DIR/fullrun/latest")"
n=$(verify_all "$DIR/fullrun")
echo "full disk at latest (fsdp-run --max-restarts 1): the second attempt recovered; $n steps verify"

# 3. `latest` missing, dangling, a symbolic link
cp -r "$DIR/ref" "$DIR/gone"
rm "$DIR/gone/latest"
train 2 --save-dir "$DIR/gone" > /dev/null 2> "$DIR/gone.err" && fail "a fresh run mixed into a directory without latest"
grep -q "gone already holds checkpoints" "$DIR/gone.err" || fail "without latest: $(cat "$DIR/gone.err")"
echo "step-99" > "$DIR/gone/latest"
train 2 --save-dir "$DIR/gone" > /dev/null 2> "$DIR/gone.err" && fail "a fresh run mixed into a directory with a dangling latest"
grep -q "gone already holds checkpoints" "$DIR/gone.err" || fail "dangling latest: $(cat "$DIR/gone.err")"
train 2 --save-dir "$DIR/gone" --resume auto --steps 25 --save-every 5 > "$DIR/gone.json" 2> "$DIR/gone.err" ||
  fail "resume with a dangling latest: $(cat "$DIR/gone.err")"
grep -q "gone/latest repaired (.*step-99.*): now step-20" "$DIR/gone.err" || fail "no repair: $(cat "$DIR/gone.err")"
grep -q '"event":"resume","step":20' "$DIR/gone.json" || fail "did not resume from step-20"
cp -r "$DIR/ref" "$DIR/link"
rm "$DIR/link/latest"
ln -s step-20 "$DIR/link/latest"
"$CKPT" verify "$DIR/link" > /dev/null || fail "fsdp-ckpt verify does not follow a latest link"
train 2 --save-dir "$DIR/link" --resume auto --steps 25 --save-every 5 > "$DIR/link.json" 2> "$DIR/link.err" ||
  fail "resume from a latest link: $(cat "$DIR/link.err")"
grep -q '"event":"resume","step":20' "$DIR/link.json" || fail "did not resume through the link"
! grep -q "repaired" "$DIR/link.err" || fail "a valid latest link was repaired"
echo "latest missing or dangling: fresh runs refused, --resume auto repaired it; a latest link resumes; $(verify_all "$DIR/gone") + $(verify_all "$DIR/link") steps verify"

# 4. unwritable, and too small, before the first step
mkdir -p "$DIR/ro" "$DIR/small"
if [ "$(id -u)" -eq 0 ]; then
  mount -t tmpfs -o ro,size=1m tmpfs "$DIR/ro" && MOUNTS+=("$DIR/ro")
else
  chmod 555 "$DIR/ro"
fi
t0=$(date +%s.%N)
train 2 --save-dir "$DIR/ro/run" --steps 300 > "$DIR/ro.json" 2> "$DIR/ro.err" && fail "trained for an unwritable directory"
secs=$(echo "$(date +%s.%N) - $t0" | bc)
grep -q "ro/run: cannot create directory: \(Read-only file system\|Permission denied\)" "$DIR/ro.err" ||
  fail "unwritable: $(cat "$DIR/ro.err")"
! grep -q '"event":"step"' "$DIR/ro.json" || fail "steps were taken before the unwritable directory was found"
echo "unwritable save dir: refused before step 1 after $secs s (300 steps asked): $(grep -m1 -o 'ro/run: .*' "$DIR/ro.err")"
if [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o size=1m tmpfs "$DIR/small"; then
  MOUNTS+=("$DIR/small")
  train 2 --save-dir "$DIR/small" > "$DIR/small.json" 2> "$DIR/small.err" && fail "trained for a full disk"
  msg=$(grep -m1 -o "small: not enough free space for a checkpoint: one needs [0-9]* bytes.*, [0-9]* are free" "$DIR/small.err") ||
    fail "no space: $(cat "$DIR/small.err")"
  ! grep -q '"event":"step"' "$DIR/small.json" || fail "steps were taken before the space check"
  echo "no space: refused before step 1: $msg"
else
  echo "no space: skipped (needs root to mount a small tmpfs)"
fi

left=$(leftovers)
[ -z "$left" ] || fail "processes left: $left"
echo "no process left"
