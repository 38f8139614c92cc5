#!/usr/bin/env bash
# scripts/setup.sh — installs the Debian packages fsdp needs (only the missing
# ones), configures build/ once and builds it. Idempotent; silent when nothing
# changed. Usage: scripts/setup.sh [--data] [extra meson setup options]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(meson ninja-build pkg-config gcc g++ libc6-dev openmpi-bin libopenmpi-dev
          libopenblas-dev check zlib1g-dev libgloo-dev
          libpcre2-dev # PCRE2: the tokenizers' patterns (GPT-2's, tokenizer.json's) need Unicode classes
          libutf8proc-dev # utf8proc: tokenizer.json's NFC normalizer (Qwen2's)
          python3-venv # the Hugging Face tests' virtual environments (Debian splits venv out)
          python3-matplotlib # bench/plot.py's charts (the plot and plot-trace tests)
          libyaml-dev # libyaml: the tools' configuration file (src/tools/config.h)
          clang-14 libclang-rt-14-dev) # libFuzzer + ASan/UBSan: the parsers' fuzz targets (tests/fuzz)
# --data adds the datasets the demo trains on (tests make their own data).
if [ "${1:-}" = "--data" ]; then
  shift
  packages+=(fortunes dataset-fashion-mnist)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The CUDA toolkit's usual home: meson's CUDA language looks for nvcc on PATH, and
# where nvcc exists the kernels must be compiled (CI catches a broken GPU build).
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [ ! -f build/build.ninja ]; then
  echo "setup: configuring build/"
  meson setup build "$@" >/dev/null
fi
# ninja says "no work to do" when up to date; print only what it built or why it failed.
out=$(ninja -C build 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -vE "^ninja: (Entering directory|no work to do)|^\[[0-9]+/[0-9]+\]" || true
