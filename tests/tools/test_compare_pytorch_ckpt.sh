#!/usr/bin/env bash
# tests/tools/test_compare_pytorch_ckpt.sh BUILD_DIR SOURCE_DIR — bench/compare_pytorch.py's
# --checkpoint on the CPU at a tiny shape (GPT-2 small, 4 blocks, T 32): with auto
# at a budget between the plans fsdp-bench checkpoints 3 blocks and PyTorch wraps the
# same 3 in checkpoint_wrapper (and all 4 in the extra row), the two PyTorch rows
# losing the same (recomputation changes no value); with N = 2 fsdp-bench takes a
# rule per block from a --config file and PyTorch wraps 2. Then FSDP2 out of GPU memory
# (COMPARE_PYTORCH_OOM, as CUDA's allocator fails): with auto's 3 blocks the comparison
# goes on against FSDP2 with every block and says why; with every block it goes on
# without that row; with N = 2 it ends naming the blocks and what may fit. Python with torch:
# BUILD_DIR/interop-venv (the hf-interop test's venv, waited for under its lock);
# skipped (77) without it.
set -euo pipefail
build=$1 src=$2
py=$build/interop-venv/bin/python
# scripts/test.sh fills the venv in the background under this lock: wait for it,
# as the hf-interop test does, or a half-made venv would skip this test in CI.
exec 9>"$build/interop-venv.lock"
flock 9
if [ ! -x "$py" ] || ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIP: no torch in $build/interop-venv (the hf-interop test makes it)"; exit 77
fi
flock -u 9
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--np 1 --preset small --seq-len 32 --micro-batch 2 --warmup 1 --iters 2 --repeat 1
        --fsdp-bench "$build/fsdp-bench")
"$py" "$src/bench/compare_pytorch.py" "${common[@]}" --checkpoint auto --memory-budget 0.0144 \
  --json-file "$work/auto.json" | tail -4
"$py" "$src/bench/compare_pytorch.py" "${common[@]}" --checkpoint 2 --json-file "$work/two.json" |
  tail -2
COMPARE_PYTORCH_OOM=ckpt:3 "$py" "$src/bench/compare_pytorch.py" "${common[@]}" --checkpoint auto \
  --memory-budget 0.0144 --json-file "$work/oom.json" > "$work/oom.txt"
grep "ran out of GPU memory with those" "$work/oom.txt" ||
  { echo "FAIL: the fallback to every block is not said"; cat "$work/oom.txt"; exit 1; }
if COMPARE_PYTORCH_OOM=ckpt:2 "$py" "$src/bench/compare_pytorch.py" "${common[@]}" \
     --checkpoint 2 > "$work/oom2.txt" 2>&1; then
  echo "FAIL: FSDP2 out of memory without an every-block row did not fail"; exit 1
fi
grep "ran out of GPU memory with 2 of 4 blocks checkpointed" "$work/oom2.txt" ||
  { echo "FAIL: the out-of-memory end does not say which blocks"; cat "$work/oom2.txt"; exit 1; }
COMPARE_PYTORCH_OOM=ckpt:4 "$py" "$src/bench/compare_pytorch.py" "${common[@]}" --checkpoint auto \
  --memory-budget 0.0144 --json-file "$work/oom4.json" > "$work/oom4.txt"
grep "with every block checkpointed: out of GPU memory: rank 0: CUDA out of memory" "$work/oom4.txt" ||
  { echo "FAIL: the every-block row's out of memory is not said"; cat "$work/oom4.txt"; exit 1; }
"$py" - "$work/auto.json" "$work/two.json" "$work/oom.json" "$work/oom4.json" <<'PY'
import json, sys
auto, two, oom, oom4 = (json.load(open(p)) for p in sys.argv[1:])
def check(ok, what):
    if not ok:
        sys.exit(f"FAIL: {what}")
check(auto["checkpointed"] == 3 and auto["layers"] == 4, f"auto chose {auto['checkpointed']}")
check("--checkpoint auto --memory-budget 0.0144" in auto["fsdp"]["command"], auto["fsdp"]["command"])
check(auto["pytorch_fsdp2"]["checkpointed"] == 3, "PyTorch did not wrap auto's 3 blocks")
check(auto["pytorch_fsdp2_all"]["checkpointed"] == 4, "the all row did not wrap 4 blocks")
for key in ("loss_first", "loss_last"):
    a, b = auto["pytorch_fsdp2"][key], auto["pytorch_fsdp2_all"][key]
    check(abs(a - b) <= 1e-6 * abs(a), f"PyTorch {key}: 3 blocks {a}, all {b}")
check(two["checkpointed"] == 2 and "--config" in two["fsdp"]["command"], two["fsdp"]["command"])
check(two["pytorch_fsdp2"]["checkpointed"] == 2, "PyTorch did not wrap 2 blocks")
check("pytorch_fsdp2_all" not in two, "an all row without auto")
check(oom["checkpointed"] == 3 and "COMPARE_PYTORCH_OOM=ckpt:3" in oom["pytorch_same_blocks_oom"],
      f"same-blocks out of memory not recorded: {oom.get('pytorch_same_blocks_oom')}")
check(oom["pytorch_fsdp2"]["checkpointed"] == 4 and "pytorch_fsdp2_all" not in oom,
      "after FSDP2 ran out of memory with 3 blocks, its row is not the every-block run")
check(auto["pytorch_same_blocks_oom"] is None, "an out-of-memory recorded without one")
check(oom4["pytorch_fsdp2"]["checkpointed"] == 3 and "pytorch_fsdp2_all" not in oom4
      and "ckpt:4" in oom4["pytorch_all_blocks_oom"], "the every-block row's out of memory "
      "did not leave the same-blocks comparison standing")
print("ok: --checkpoint auto and N checkpoint the same blocks on both sides; FSDP2 out of "
      "memory falls back to every block or ends in words")
PY
