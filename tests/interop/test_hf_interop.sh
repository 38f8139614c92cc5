#!/usr/bin/env bash
# tests/interop/test_hf_interop.sh [--venv-only] [--script NAME] BUILD_DIR SOURCE_DIR —
# fsdp against Hugging Face transformers from PyPI: tests/interop/NAME (default
# hf_interop.py, GPT-2; llama_interop.py for the Llama family) says what is checked.
# The packages go into a virtual environment cached at BUILD_DIR/interop-venv
# (first run: torch from PyPI, which on Linux is the CUDA build with its nvidia
# libraries, about 5.6 GB installed, a few minutes; later runs reuse it).
# Skipped (exit 77) only when PyPI cannot be reached and no venv is cached.
# The venv is made under a lock (BUILD_DIR/interop-venv.lock), so that
# scripts/test.sh can fill it in the background (`--venv-only`: minutes of
# network and disk, little CPU) while the CPU-bound suites run; the test then
# waits on the lock and finds it ready, or makes it itself if that failed.
set -euo pipefail
venv_only=0 script=hf_interop.py
if [ "${1:-}" = --venv-only ]; then venv_only=1; shift; fi
if [ "${1:-}" = --script ]; then script=$2; shift 2; fi
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
venv=$build/interop-venv
exec 9>"$build/interop-venv.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, transformers, safetensors" 2>/dev/null; then
  if ! python3 -c "import urllib.request as u; u.urlopen('https://pypi.org/simple/torch/', timeout=20)" 2>/dev/null; then
    echo "SKIP: PyPI cannot be reached, so torch and transformers cannot be installed"; exit 77
  fi
  rm -rf "$venv"
  t0=$(date +%s)
  python3 -m venv "$venv" || { echo "FAIL: python3 -m venv (Debian: apt-get install python3-venv)"; exit 1; }
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch transformers safetensors numpy
  echo "venv: installed in $(( $(date +%s) - t0 )) s ($(du -sh "$venv" | cut -f1))"
fi
flock -u 9
[ "$venv_only" = 0 ] || exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error \
  HF_HUB_DISABLE_PROGRESS_BARS=1
"$venv/bin/python" "$src/tests/interop/$script" "$work" "$build/fsdp-train" \
  "$build/fsdp-ckpt" "$build/fsdp-eval"
