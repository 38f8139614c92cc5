#!/usr/bin/env python3
"""tests/cuda/train_llama_cuda.py — fsdp-train --model llama --preset tiny
--device cuda against --device cpu: the same seed and text, every step's loss
and the eval loss within 1e-4 relative (cuBLAS sums in another order than
OpenBLAS), also with --checkpoint LlamaDecoderLayer on cuda; and --dtype bf16
on cuda: tiny's grouped-query attention (4 heads over 2 KV heads) in bf16, on
cuDNN where it runs the shape and on the in-house flash kernel otherwise (the
simulator), every step's loss and the eval loss within 2e-2 of the cpu's bf16
run.
Exits 77 (skipped) where fsdp-train finds no usable CUDA device, unless
FSDP_REQUIRE_GPU is set (not 0), as scripts/gpu-check.sh sets it.

usage: train_llama_cuda.py FSDP_TRAIN
"""
import json
import os
import subprocess
import sys
import tempfile


def train(exe, data, *extra):
    args = [exe, "--model", "llama", "--preset", "tiny", "--data", data, "--global-batch", "2",
            "--seq-len", "16", "--steps", "3", "--eval-every", "3", "--lr", "3e-3",
            "--log-every", "1", "--json", *extra]
    p = subprocess.run(args, capture_output=True, text=True, timeout=240)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return p, events


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-3)


def losses(events):
    return ([e["loss"] for e in events if e["event"] == "step"],
            [e["loss"] for e in events if e["event"] == "eval"])


def compare(what, ref, run, tol):
    """1 when run's step and eval losses are ref's within tol relative."""
    (a, ea), (b, eb) = losses(ref), losses(run)
    if not a or len(a) != len(b) or not ea or len(ea) != len(eb):
        print(f"FAIL: {what}: step losses {a} vs {b}, eval {ea} vs {eb}")
        return 0
    worst = max(rel(y, x) for x, y in zip(a + ea, b + eb))
    print(f"llama fsdp-train {what}: {len(a)} steps, losses {a[0]:.6f} -> {a[-1]:.6f} vs "
          f"{b[0]:.6f} -> {b[-1]:.6f}, eval {ea[-1]:.6f} vs {eb[-1]:.6f}, max relative "
          f"difference {worst:.3g} (tolerance {tol:g})")
    if worst > tol:
        print(f"FAIL: {what}: the runs differ beyond the tolerance")
        return 0
    return 1


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "text.txt")
        with open(data, "w") as f:
            f.write("".join(f"{i}\n" for i in range(1, 3001)))
        cpu, cpu_events = train(exe, data, "--device", "cpu")
        if cpu.returncode:
            print(f"FAIL: --device cpu exited {cpu.returncode}: {cpu.stderr}")
            return 1
        gpu, gpu_events = train(exe, data, "--device", "cuda")
        if gpu.returncode and "no usable CUDA device" in gpu.stderr:
            if os.environ.get("FSDP_REQUIRE_GPU", "0") != "0":
                print(f"FAIL: FSDP_REQUIRE_GPU is set and {gpu.stderr.strip()}")
                return 1
            print(f"SKIP: {gpu.stderr.strip()}")
            return 77
        if gpu.returncode:
            print(f"FAIL: --device cuda exited {gpu.returncode}: {gpu.stderr}")
            return 1
        ok = compare("cuda vs cpu", cpu_events, gpu_events, 1e-4)
        ckpt, ckpt_events = train(exe, data, "--device", "cuda", "--checkpoint",
                                  "LlamaDecoderLayer")
        if ckpt.returncode:
            print(f"FAIL: --device cuda --checkpoint exited {ckpt.returncode}: {ckpt.stderr}")
            return 1
        ok &= compare("cuda checkpointed vs cpu", cpu_events, ckpt_events, 1e-4)
        bf16, bf16_events = train(exe, data, "--device", "cuda", "--dtype", "bf16")
        if bf16.returncode:
            print(f"FAIL: --device cuda --dtype bf16 exited {bf16.returncode}: {bf16.stderr}")
            return 1
        cpu16, cpu16_events = train(exe, data, "--device", "cpu", "--dtype", "bf16")
        if cpu16.returncode:
            print(f"FAIL: --device cpu --dtype bf16 exited {cpu16.returncode}: {cpu16.stderr}")
            return 1
        ok &= compare("cuda bf16 vs cpu bf16", cpu16_events, bf16_events, 2e-2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
