#!/bin/sh
# tests/check_exports.sh LIB — fails when the shared library exports a defined
# symbol outside the public fsdp_* API (src/libfsdp.map), listing each one.
set -eu
lib=$1
syms=$(nm -D --defined-only "$lib" | awk '{print $3}')
[ -n "$syms" ] || { echo "check_exports: $lib exports nothing (nm failed?)"; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^fsdp_' || true)
if [ -n "$bad" ]; then
  echo "check_exports: $lib exports $(printf '%s\n' "$bad" | wc -l) symbol(s) outside fsdp_*:"
  printf '  %s\n' $bad
  exit 1
fi
echo "check_exports: $(printf '%s\n' "$syms" | wc -l) symbols, all fsdp_*"
