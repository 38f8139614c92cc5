#!/usr/bin/env bash
# tests/tokenizer/test_hf.sh — fsdp's tokenizer against Hugging Face
# `tokenizers`, token for token (compare_hf.py, or the script named third:
# compare_hf_json.py), in a virtual environment this script makes and fills
# from PyPI. Skips (exit 77) only when PyPI cannot be reached. Arguments:
# fsdp-tokenize, the build directory for the venv, [the comparison script].
set -euo pipefail
TOKENIZE=$1 BUILD=$2 SCRIPT=${3:-compare_hf.py}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=$BUILD/venv-tokenizers
WORK=$(mktemp -d /tmp/fsdp-tok-hf-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import tokenizers' 2>/dev/null; then
  python3 -m venv "$VENV"
  if ! "$VENV/bin/pip" install -q --disable-pip-version-check tokenizers > "$WORK/pip.log" 2>&1; then
    if ! python3 -c 'import urllib.request as u; u.urlopen("https://pypi.org/simple/tokenizers/", timeout=10)' 2>/dev/null; then
      echo "SKIP: PyPI cannot be reached: cannot install the tokenizers package to compare against"
      exit 77
    fi
    cat "$WORK/pip.log"
    echo "FAIL: pip could not install tokenizers although PyPI answers"
    exit 1
  fi
fi
echo "tokenizers $("$VENV/bin/python" -c 'import tokenizers; print(tokenizers.__version__)')"
exec "$VENV/bin/python" "$HERE/$SCRIPT" "$TOKENIZE" "$WORK"
