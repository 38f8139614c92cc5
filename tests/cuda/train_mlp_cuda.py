#!/usr/bin/env python3
"""tests/cuda/train_mlp_cuda.py — fsdp-train --model mlp --device cuda against
--device cpu: the same seed and data (a small Fashion-MNIST-shaped set), every
step's loss, the test loss within 1e-4 relative (cuBLAS sums in another order
than OpenBLAS) and the test accuracy within one image; and --dtype bf16 on
cuda refused in words naming the dtype (the MLP computes in f32), with no
crash. Exits 77 (skipped) where fsdp-train finds no usable CUDA device, unless
FSDP_REQUIRE_GPU is set (not 0), as scripts/gpu-check.sh sets it.

usage: train_mlp_cuda.py FSDP_TRAIN
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "launch"))
from launch_test import write_idx  # noqa: E402 (the launch suite's data)

TEST_IMAGES = 256


def train(exe, data, *extra):
    args = [exe, "--model", "mlp", "--data", data, "--epochs", "1", "--hidden", "64,32",
            "--global-batch", "64", "--log-every", "1", "--json", *extra]
    p = subprocess.run(args, capture_output=True, text=True, timeout=240)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return p, events


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-3)


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as data:
        write_idx(data, "train", 1024, 1)
        write_idx(data, "t10k", TEST_IMAGES, 2)
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
        steps = [[e["loss"] for e in ev if e["event"] == "step"] for ev in (cpu_events, gpu_events)]
        if not steps[0] or len(steps[0]) != len(steps[1]):
            print(f"FAIL: step losses cpu {steps[0]} vs cuda {steps[1]}")
            return 1
        worst = max(rel(g, c) for c, g in zip(*steps))
        summary = [next(e for e in ev if e["event"] == "summary") for ev in (cpu_events, gpu_events)]
        loss_rel = rel(summary[1]["test_loss"], summary[0]["test_loss"])
        acc_diff = abs(summary[1]["test_accuracy"] - summary[0]["test_accuracy"])
        print(f"mlp fsdp-train cuda vs cpu: {len(steps[0])} steps, loss rel {worst:.3g}, test loss "
              f"rel {loss_rel:.3g}, test accuracy {summary[1]['test_accuracy']} vs "
              f"{summary[0]['test_accuracy']}")
        if worst > 1e-4 or loss_rel > 1e-4 or acc_diff > 1.0 / TEST_IMAGES + 1e-6:
            print("FAIL: the cuda run differs from the cpu run beyond the tolerances")
            return 1
        bf16, _ = train(exe, data, "--device", "cuda", "--dtype", "bf16")
        said = bf16.stderr.strip()
        print(f"mlp fsdp-train cuda bf16: exit {bf16.returncode}: {said}")
        if bf16.returncode != 1 or "computes in f32" not in said or "bf16" not in said:
            print("FAIL: --dtype bf16 on cuda must be refused naming f32 and bf16 (exit 1)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
