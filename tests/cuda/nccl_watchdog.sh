#!/bin/sh
# tests/cuda/nccl_watchdog.sh LAUNCHER PROGRAM [enqueue] — the NCCL watchdog
# ends a job whose rank stalls in a collective queued on a CUDA stream, or
# (enqueue) inside the NCCL call that queues it. Runs PROGRAM
# (nccl_stall.c) as 2 ranks under LAUNCHER (mpirun, or fsdp-run: an env://
# world, where the watchdog's abort makes the waiting rank fail with
# FSDP_ERR_TIMEOUT and fsdp-run stops the job) on the simulated NCCL with rank 1
# never arriving at the 3rd all-reduce (FSDP_SIM_NCCL_STALL=1:3) and a 2 s
# collective timeout; the simulator's own deadline (FSDP_SIM_NCCL_TIMEOUT_S,
# 120 s) is what would end the job without the watchdog. Checks that:
#  - the job fails, within BOUND_S (the timeout, a tick of 0.2 s, MPI_Abort's
#    teardown, and slack for a loaded machine);
#  - a watchdog report names the operation, its number, its unit and the rank
#    it fired on, in the host watchdog's words. Both ranks wait in all-reduce
#    #3 from about the same moment, so either one's watchdog may fire first
#    and end the job (a peer cannot tell a rank stuck inside NCCL from one
#    that is merely waiting there too); the simulator's line names rank 1 as
#    the stalled one;
#  - under fsdp-run, the rank whose watchdog fired fails with the report
#    as FSDP_ERR_TIMEOUT and fsdp-run's root cause names the collective;
#  - no rank process is left, and no shared-memory name of a rank's in
#    /dev/shm.
# enqueue: rank 1's ncclAllReduce #3 blocks in the call itself
# (FSDP_SIM_NCCL_STALL=1:3:0:enqueue), and only rank 1 has the 2 s timeout
# (rank 0 has 60 s, past the bound): rank 1's own watchdog must time out the
# collective whose enqueue never returned and abort the communicator, which
# ends the call; the report must come from rank 1.
set -u
launcher=$1
prog=$2
mode=${3:-stream}
BOUND_S=30
out=$(mktemp)
wrap=$(mktemp)
trap 'rm -f "$out" "$wrap"' EXIT
stall=1:3
fired_on="[01]"
if [ "$mode" = enqueue ]; then
  stall=1:3:0:enqueue
  fired_on=1
fi
# Each rank runs PROGRAM through this wrapper; in enqueue mode every rank but
# rank 1 (OMPI_COMM_WORLD_RANK under mpirun, RANK under fsdp-run) gets 60 s.
printf '#!/bin/sh\nr=${OMPI_COMM_WORLD_RANK:-${RANK:-0}}\n' >"$wrap"
[ "$mode" = enqueue ] && echo '[ "$r" = 1 ] || export FSDP_TIMEOUT_S=60' >>"$wrap"
echo "exec \"$prog\"" >>"$wrap"
chmod +x "$wrap"
start=$(date +%s)
FSDP_SIM_DEVICES=2 FSDP_SIM_NCCL_STALL=$stall FSDP_TIMEOUT_S=2 FSDP_LOG_LEVEL=error \
  sh -c 'case "$0" in
           *fsdp-run) exec "$0" --nproc-per-node 2 --master-port 0 "$1" ;;
           *) exec "$0" --oversubscribe --bind-to none -np 2 "$1" ;;
         esac' "$launcher" "$wrap" >"$out" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$out"
fail() { echo "nccl_watchdog: FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the job succeeded although rank 1 stalled"
[ "$rc" -ne 77 ] || exit 77
echo "nccl_watchdog: the job ended with status $rc after ${elapsed} s (bound ${BOUND_S} s)"
[ "$elapsed" -le "$BOUND_S" ] || fail "the job took ${elapsed} s, more than ${BOUND_S} s"
report="watchdog: all_reduce #3 for 'h.3'"
grep -F "$report" "$out" | grep -E "on rank $fired_on; " |
  grep -q "did not complete within the 2 s timeout (FSDP_TIMEOUT_S)" ||
  fail "no watchdog report naming all_reduce #3, unit h.3 and rank $fired_on"
if [ "$mode" = enqueue ]; then
  grep -q "simnccl: rank 1 blocks inside the call ncclAllReduce #3" "$out" ||
    fail "rank 1 did not block in the call"
else
  grep -q "simnccl: rank 1 stalls at ncclAllReduce.*#3" "$out" || fail "rank 1 did not stall"
fi
case "$launcher" in
*fsdp-run) # the rank whose watchdog fired fails with its report as FSDP_ERR_TIMEOUT;
           # the other may exit first (its wait ended by that abort, as
           # FSDP_ERR_COMM): the root cause fsdp-run names is either, naming #3
  grep "^\[rank [01]\] nccl-stall: rank [01]: $report" "$out" | grep -q "(timeout: " ||
    fail "no rank failed with the watchdog's report as FSDP_ERR_TIMEOUT"
  grep "root cause" -A1 "$out" | grep -qF "all_reduce #3 for 'h.3'" ||
    fail "fsdp-run's root cause does not name all_reduce #3 for 'h.3'" ;;
esac
pids=$(sed -n 's/^nccl-stall: rank [0-9]* pid \([0-9]*\)$/\1/p' "$out")
[ "$(echo "$pids" | wc -w)" -eq 2 ] || fail "the ranks did not both start"
# A rank's process: running (not a zombie awaiting its reaper) after the
# launcher returned, it is given 5 s to finish dying from MPI_Abort's signal.
alive() { [ -r /proc/$1/stat ] && ! awk '{exit $3 == "Z" ? 0 : 1}' /proc/$1/stat 2>/dev/null; }
for p in $pids; do
  waited=0
  while alive "$p" && [ "$waited" -lt 50 ]; do sleep 0.1; waited=$((waited + 1)); done
  if alive "$p"; then fail "rank process $p is still running: $(cat /proc/$p/stat)"; fi
  if ls /dev/shm | grep -q -- "-$p-"; then fail "/dev/shm keeps a name of process $p"; fi
done
echo "nccl_watchdog: ok"
