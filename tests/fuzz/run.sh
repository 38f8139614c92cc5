#!/usr/bin/env bash
# tests/fuzz/run.sh — a libFuzzer target per parser we own (the configuration
# file, safetensors headers, the tokenizer's vocab/merges and tokenizer.json,
# token-file headers, checkpoint manifests, a Llama's config.json), built with
# clang under ASan and UBSan and run for a bounded time each on its seed corpus
# (tests/fuzz/corpus/<target>/). The parser's own sources are compiled into
# the target, instrumented; the rest comes from BUILD_DIR's libfsdp.a (a
# plain build: scripts/setup.sh). New inputs go to a scratch corpus, never
# into the tree; a crash leaves its input as BUILD_DIR/fuzz/crash-<target>-*
# and fails the run (add it to the corpus once fixed).
# FUZZ_JOBS (1 unless set) targets run at once, each for its full time on a
# core of its own where the machine has one free (scripts/test.sh sets it to
# the core count), so the bound is per target, not for the run.
# usage: tests/fuzz/run.sh BUILD_DIR [SECONDS_EACH (20)] [TARGET...]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
secs=${2:-20}
shift $(($# > 1 ? 2 : 1))
declare -A parser=(
  [config]="src/tools/config.c src/tools/flags.c"
  [safetensors]="src/ckpt/import.c src/core/json.c"
  [tokenizer]="src/data/bpe_load.c src/data/bpe_json.c src/data/bpe.c src/core/json.c"
  [tokens]="src/data/tokens.c"
  [manifest]="src/ckpt/manifest.c src/core/json.c"
  [llama_config]="src/ckpt/llama_hf.c src/ckpt/import.c src/core/json.c")
targets=("$@")
((${#targets[@]})) || targets=(config safetensors tokenizer tokens manifest llama_config)
cc=$(command -v clang || command -v clang-14) || { echo "run.sh: needs clang"; exit 1; }
[ -f "$build/libfsdp.a" ] || { echo "run.sh: no $build/libfsdp.a (run scripts/setup.sh)"; exit 1; }
out=$build/fuzz
mkdir -p "$out"
flags=(-g -O1 -std=c11 -D_GNU_SOURCE -DFSDP_BUILDING -I"$src/src" -I"$src/include"
       -I"$src/tests/fuzz" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
# libfsdp.a's own dependencies (meson.build's fsdp_deps) and the tools' libyaml
libs=("$build/libfsdp.a" $(pkg-config --libs yaml-0.1 zlib libpcre2-8 libutf8proc ompi-c openblas)
      -lgloo -lmvec -lstdc++ -lm -lpthread)
# a CUDA build's libfsdp.a also needs cudart (and NCCL where built): the
# toolkit's libraries, found beside nvcc as meson found them.
if grep -q "FSDP_HAVE_CUDA 1" "$build/fsdp_config.h" 2>/dev/null; then
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  cuda_lib=$(dirname "$(dirname "$(readlink -f "$nvcc")")")/lib64
  libs+=(-L"$cuda_lib" -Wl,-rpath,"$cuda_lib" -lcudart -ldl -lrt)
  grep -q "FSDP_HAVE_NCCL 1" "$build/fsdp_config.h" && libs+=(-lnccl)
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
# Builds target $1 and fuzzes it; prints one line (and the log's tail on a
# failure); status 1 when it failed.
fuzz() {
  local t=$1 srcs=() f scratch status=0
  for f in ${parser[$t]}; do srcs+=("$src/$f"); done
  "$cc" "${flags[@]}" "$src/tests/fuzz/fuzz_$t.c" "${srcs[@]}" "${libs[@]}" -o "$out/fuzz_$t" ||
    { echo "fuzz $t: FAILED to build"; return 1; }
  scratch=$(mktemp -d)
  # -close_fd_mask=2: the parsers' own error messages are noise here; libFuzzer
  # and the sanitizers still report on their copy of stderr.
  if "$out/fuzz_$t" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
       -close_fd_mask=2 -artifact_prefix="$out/crash-$t-" "$scratch" \
       "$src/tests/fuzz/corpus/$t" > "$out/$t.log" 2>&1; then
    echo "fuzz $t: $(grep -Eo '#[0-9]+[[:space:]]+DONE .*' "$out/$t.log" | head -1)"
  else
    # one block of output, so that targets running at once do not interleave
    printf 'fuzz %s: FAILED (log: %s)\n%s\n' "$t" "$out/$t.log" "$(tail -40 "$out/$t.log")"
    status=1
  fi
  rm -rf "$scratch"
  return $status
}
for t in "${targets[@]}"; do
  [ -n "${parser[$t]:-}" ] || { echo "run.sh: no target '$t'"; exit 1; }
done
jobs=${FUZZ_JOBS:-1}
# 0 (or a word, which bash's arithmetic reads as 0) would wait for no target
# before the first and lose the last one's status
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: FUZZ_JOBS=$jobs: targets at once, 1 or more"; exit 1; }
failed=0 running=0
for t in "${targets[@]}"; do
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz "$t" &
  running=$((running + 1))
done
for ((; running > 0; running--)); do wait -n || failed=1; done
exit $failed
