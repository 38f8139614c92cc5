#!/usr/bin/env bash
# tests/docs/check_help.sh BUILD_DIR — every program lives in BUILD_DIR, and its --help
# exits 0 with text that names the program and carries no printf escape such as a literal %%.
set -euo pipefail
build=$1
fail=0
for p in fsdp-train fsdp-bench fsdp-eval fsdp-ckpt fsdp-run fsdp-tokenize coll_bench; do
  [ -x "$build/$p" ] || { echo "FAIL: $build/$p is missing: every program belongs in the build directory"; fail=1; continue; }
  out=$("$build/$p" --help 2>&1) || { echo "FAIL: $p --help exits $?"; fail=1; continue; }
  bad=0
  grep -q "$p" <<<"$out" || { echo "FAIL: $p --help does not name the program"; bad=1; }
  if grep -n '%%' <<<"$out"; then echo "FAIL: $p --help prints a literal %% (above)"; bad=1; fi
  [ $bad -ne 0 ] || echo "ok: $p --help ($(wc -l <<<"$out") lines)"
  fail=$((fail | bad))
done
exit $fail
