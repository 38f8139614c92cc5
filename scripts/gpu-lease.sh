#!/usr/bin/env bash
# scripts/gpu-lease.sh — everything a lent GPU machine is asked to measure, in one device
# call, run ON that machine from the checkout's root. Here first: ../shared/gpu-kit/make_bundle.sh
# (builds build/ with CUDA and packs .gpu/bundle.tar.xz); then the device tool's run with
# carry [".gpu"] and, e.g. (not yet run on a GPU: the phases' own limits add up past 480 s,
# so put first what matters most; a phase that would start with under 15 s left is skipped):
#   BUDGET=540 bash scripts/gpu-lease.sh env bench kprof compare-big tests cudnn big compare ncu nsys
# It unpacks the bundle as the kit's device_run.sh does (these lines follow that script's,
# kept in step by hand; a bundle that changed since the last unpack replaces it) and runs each phase under one
# deadline (BUDGET seconds, default 480); what a phase prints goes to $OUT/log.txt, and
# at most 8 files come back:
#   env          GPU, driver, libraries, tools          -> log.txt
#   cudnn        cudnn_attention_check: cuDNN against the in-house flash kernel at GPT-2
#                124M's layer and a Llama-3.2-1B layer (grouped-query)   -> log.txt
#   tests        the cuda suite (the kit's run_tests.py) -> tests.txt, cuda-kernels.txt
#   bench        GPT-2 124M, 16 x 1024, bf16, NCCL      -> bench.json; then again with
#                FSDP_CUBLASLT_WORKSPACE_KIB=0 (no cuBLASLt workspace)   -> log.txt
#   kprof        the same with --kernel-profile         -> kprof.txt
#   big          GPT-2 1558M: every block checkpointed, then --checkpoint auto -> log.txt
#   compare      bench/compare_pytorch.py, 124M: FSDP2 and torch.compile  -> compare.txt
#   compare-big  the same at 1558M with --checkpoint auto (FSDP2 on the same blocks and on
#                every block; no torch.compile row)    -> compare-big.txt
#   ncu          Nsight Compute on the in-house flash kernels (FSDP_ATTENTION=flash)
#   nsys         Nsight Systems over the 124M bench, its idle gaps (bench/gpu_gaps.py)
#                                                       -> profile.txt (ncu and nsys)
set -u
S=$(pwd); R=/tmp/fsdpgpu; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .gpu/bundle.tar.xz ] || { echo "gpu-lease: no .gpu/bundle.tar.xz: run ../shared/gpu-kit/make_bundle.sh here and carry .gpu"; exit 1; }
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-480})); L=$OUT/log.txt; P=$OUT/profile.txt
say() { echo "== $(date +%T) +$(( $(date +%s) - T0 ))s $*" | tee -a "$L"; }
left() { echo $(( DEADLINE - $(date +%s) )); }
# a phase's command, bounded by its own limit and by what is left of the deadline
fl() {
  local t=$1; shift
  [ "$t" -lt "$(left)" ] || t=$(( $(left) - 5 ))
  [ "$t" -ge 1 ] || { say "deadline: skip $*"; return 124; }
  LD_LIBRARY_PATH=$FSDP_LD timeout "$t" "$@"
}
stamp=$(cksum < .gpu/bundle.tar.xz)
[ "$(cat $R/stamp 2>/dev/null)" = "$stamp" ] ||
  { rm -rf $R; mkdir -p $R && tar -C $R -xJf .gpu/bundle.tar.xz && echo "$stamp" > $R/stamp; }
O=$(cat $R/origin); [ -e "$O" ] || { mkdir -p "$(dirname "$O")" && ln -s $R/main "$O"; }
[ "$(readlink -f "$O")" = "$(readlink -f $R/main)" ] || [ -x "$O/build/fsdp-bench" ] ||
  { echo "gpu-lease: $O exists there and is not this bundle"; exit 1; }
NCCL_DIR=$(dirname "$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -1)")
CUBLAS_DIR=$(dirname "$(find /usr/local /opt -name 'libcublas.so.13' 2>/dev/null | head -1)")
# The machine's Open MPI serves the binaries built against Debian's (same ABI): drop the bundle's.
mkdir -p $R/lib2
for f in $R/lib/*; do case $(basename "$f") in libmpi*|libopen-pal*|libopen-rte*|libpmix*|libhwloc*|libevent*|libfabric*|libuc[pstm]*|libpsm*|libibverbs*|librdmacm*|libnl-*|libefa*|libmunge*|liboshmem*|libmca_common*|libnuma*|libudev*|libinfinipath*) ;; *) ln -sf "$f" $R/lib2/;; esac; done
export FSDP_LD=$R/lib2:$NCCL_DIR:$CUBLAS_DIR
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_rmaps_base_oversubscribe=1
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
B=$O/build; BENCH="$B/fsdp-bench --device cuda --comm nccl --dtype bf16"
G124="--preset 124M --seq-len 1024 --micro-batch 16"; G1558="--preset 1558M --seq-len 1024 --micro-batch 16"
for phase in "$@"; do
  [ "$(left)" -gt 15 ] || { say "deadline: skip $phase"; continue; }
  say "phase $phase (left $(left) s)"
  case $phase in
  env)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$L"
    echo "nccl=$NCCL_DIR cublas=$CUBLAS_DIR $(mpirun --version 2>&1 | head -1)" | tee -a "$L"
    echo "cudnn: $(ldconfig -p | grep -o '/[^ ]*libcudnn.so.9$' | head -1) ncu: $(command -v ncu) nsys: $(command -v nsys)" | tee -a "$L"
    for f in $B/fsdp-bench $B/tests/cuda/test_kernels $B/libfsdp.so.0; do
      LD_LIBRARY_PATH=$FSDP_LD ldd "$f" | grep "not found" | sed "s|^|$f: |" | tee -a "$L"; done ;;
  cudnn)
    fl 90 $B/tests/cuda/cudnn_attention_check 2>&1 | tee -a "$L" ;;
  tests)
    TEST_LOG=$OUT/tests.txt FSDP_CUDA_REPORT=$OUT/cuda-kernels.txt python3 $S/.gpu/kit/run_tests.py $B $DEADLINE \
      ${TESTS:-kernels gpt2 gpt2-small-f32 gpt2-small-bf16 gpt2-124m-layer kernels-big llama-cuda engine-np1 engine-np2 engine-np4 comm-np1 comm-np2 coll-cuda-nccl-np1 coll-cuda-mpi-np2 kernel-profile-cuda} 2>&1 | tee -a "$L" ;;
  bench)
    fl 150 $BENCH $G124 -w 3 -n 10 --json-file $OUT/bench.json 2>&1 | tail -8 | tee -a "$L"
    say "bench: the same without a cuBLASLt workspace (as on 27 Nov), 5 timed steps, for comparison"
    FSDP_CUBLASLT_WORKSPACE_KIB=0 fl 90 $BENCH $G124 -w 3 -n 5 2>&1 | grep -E "^(strategy|zero3|block products)" | tee -a "$L" ;;
  kprof)
    fl 120 $BENCH $G124 -w 2 -n 5 --kernel-profile > $OUT/kprof.txt 2>&1; tail -28 $OUT/kprof.txt | tee -a "$L" ;;
  big)
    fl 150 $BENCH $G1558 --checkpoint GPT2Block -w 1 -n 3 2>&1 | tail -5 | tee -a "$L"
    fl 150 $BENCH $G1558 --checkpoint auto -w 1 -n 3 2>&1 | grep -E "checkpoint auto|^zero|device memory" | tee -a "$L" ;;
  compare)
    (cd $O && fl 240 python3 bench/compare_pytorch.py --device cuda --np 1 $G124 --dtype bf16 \
      > $OUT/compare.txt 2>&1); tail -14 $OUT/compare.txt | tee -a "$L" ;;
  compare-big)
    (cd $O && fl 300 python3 bench/compare_pytorch.py --device cuda --np 1 $G1558 --dtype bf16 \
      --checkpoint auto --no-compile --warmup 1 --iters 3 --repeat 1 > $OUT/compare-big.txt 2>&1)
    tail -14 $OUT/compare-big.txt | tee -a "$L" ;;
  ncu)
    if command -v ncu >/dev/null; then
      # a forward, then the first backward's three kernels (the last layer's: D, dk/dv, dq)
      for k in "-k regex:^flash_forward -c 1" "-k regex:^flash_(dot|backward) -c 3"; do
        # shellcheck disable=SC2086 # k holds three options
        FSDP_ATTENTION=flash fl 75 ncu --clock-control none $k --section SpeedOfLight --section Occupancy \
          --section LaunchStats $BENCH $G124 -w 0 -n 1 --peak-size 0 --check 0 >> "$P" 2>&1
      done
      grep -E "flash_|Duration|Registers Per|Achieved Occupancy|Throughput" "$P" | head -40 | tee -a "$L"
    else say "ncu: not on this machine"; fi ;;
  nsys)
    if command -v nsys >/dev/null; then
      fl 120 nsys profile --force-overwrite true --output /tmp/fsdp-step --trace cuda \
        $BENCH $G124 -w 2 -n 3 --peak-size 0 --check 0 >> "$P" 2>&1
      fl 60 nsys stats --force-overwrite true --force-export true --report cuda_gpu_trace --format csv \
        --output /tmp/fsdp-step /tmp/fsdp-step.nsys-rep >> "$P" 2>&1
      # the 3 timed steps come last (about 35 ms each on an H200): the set-up before is left out
      python3 $O/bench/gpu_gaps.py /tmp/fsdp-step_cuda_gpu_trace.csv --last-ms 100 2>&1 | tee -a "$P" "$L"
    else say "nsys: not on this machine"; fi ;;
  *) say "unknown phase $phase" ;;
  esac
done
say "done"
