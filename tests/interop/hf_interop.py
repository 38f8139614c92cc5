#!/usr/bin/env python3
"""tests/interop/hf_interop.py — fsdp and Hugging Face transformers on the same
GPT-2, both directions (run by test_hf_interop.sh inside its virtual
environment, with fsdp's tools on the command line):
  export: fsdp-train a tiny GPT-2 a few steps -> fsdp-ckpt export --hf ->
          GPT2LMHeadModel.from_pretrained (no missing or unexpected keys, the
          file laid out as save_pretrained writes it) -> logits equal
          fsdp-eval's (--logits) on the same tokens to 1e-5 relative;
  import: GPT2LMHeadModel saved with save_pretrained in float32 and bfloat16 ->
          fsdp-ckpt import -> fsdp-eval's loss on the tokens equals HF's (1e-5
          relative); an untied head is refused by name.
The tokens are bytes (the tiny preset's vocabulary): a text of B*T+1 bytes
that fsdp-eval --split all reads as B windows of T inputs and T targets.
usage: hf_interop.py WORKDIR FSDP_TRAIN FSDP_CKPT FSDP_EVAL"""
import json
import copy
import os
import subprocess
import sys

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import GPT2Config, GPT2LMHeadModel

work, fsdp_train, fsdp_ckpt, fsdp_eval = sys.argv[1:5]
B, T, V = 2, 64, 256  # the tiny preset: 2 layers, 4 heads, width 64, context 64, bytes
TOL = 1e-5
failures = []


def run(*cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if ok and p.returncode:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p


def check(name, good, detail):
    print(f"{'ok  ' if good else 'FAIL'} {name}: {detail}")
    if not good:
        failures.append(name)


def fsdp_logits(ckpt, data):
    out = os.path.join(work, "logits.npy")
    run(fsdp_eval, "--checkpoint", ckpt, "--data", data, "--split", "all", "--seq-len", str(T),
        "--no-score", "--logits", str(B * T), "--logits-out", out)
    return np.load(out).reshape(B, T, V)


def fsdp_loss(ckpt, data):
    p = run(fsdp_eval, "--checkpoint", ckpt, "--data", data, "--split", "all", "--seq-len", str(T),
            "--json")
    score = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{") and '"loss"' in l]
    return score[0]["loss"], score[0]


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()


def loss(logits):  # mean cross-entropy of the targets
    x = torch.from_numpy(logits.astype(np.float64)).reshape(-1, V)
    return torch.nn.functional.cross_entropy(x, torch.from_numpy(targets.reshape(-1))).item()


def rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


rng = np.random.default_rng(17)
stream = rng.integers(32, 127, size=B * T + 1)  # printable bytes
tokens, targets = stream[:-1].reshape(B, T), stream[1:].reshape(B, T)
data = os.path.join(work, "tokens.txt")
stream.astype(np.uint8).tofile(data)
print(f"torch {torch.__version__}, transformers {transformers.__version__}")

# ---- export: fsdp -> Hugging Face -------------------------------------------
text = os.path.join(work, "text.txt")
with open(text, "w") as f:
    f.write("".join(chr(c) for c in rng.integers(32, 127, size=40000)))
run(fsdp_train, "--preset", "tiny", "--data", text, "--steps", "5", "--eval-every", "5",
    "--global-batch", "4", "--save-dir", os.path.join(work, "run"))
hf_dir = os.path.join(work, "hf")
print(run(fsdp_ckpt, "export", os.path.join(work, "run"), "--hf", hf_dir)
      .stdout.strip())
model, info = GPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
model.eval()
keys = {k: sorted(v) for k, v in info.items() if v}
check("from_pretrained keys", not keys, keys or "no missing, unexpected or mismatched keys")

def st_layout(d):
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}


# The names as save_pretrained writes them (transformers also maps other
# layouts on load, so from_pretrained alone would not notice "wte.weight").
model.save_pretrained(os.path.join(work, "hf-resaved"))
ours, theirs = st_layout(hf_dir), st_layout(os.path.join(work, "hf-resaved"))
diff = sorted(set(ours.items()) ^ set(theirs.items()))
check("safetensors layout", not diff,
      f"differs from save_pretrained's: {diff[:4]}" if diff else
      f"{len(ours)} tensors, names, shapes and dtypes as save_pretrained writes them")
check("lm_head tied", model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
      "lm_head.weight shares wte's storage")
a, b = fsdp_logits(os.path.join(work, "run"), data), hf_logits(model, tokens)
r = rel(a, b)
check("export logits", r <= TOL, f"max |fsdp - HF| / max |HF| = {r:.3g} over {a.size} logits "
      f"(losses {loss(a):.6f} / {loss(b):.6f})")

# ---- import: Hugging Face -> fsdp --------------------------------------------
torch.manual_seed(17)
cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=V,
                 activation_function="gelu_new")
hf = GPT2LMHeadModel(cfg).eval()
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    name = str(dtype).split(".")[1]
    src, save = os.path.join(work, f"hf-{name}"), os.path.join(work, f"imp-{name}")
    copy.deepcopy(hf).to(dtype).save_pretrained(src)
    out = run(fsdp_ckpt, "import", src, save, "--preset", "tiny").stdout.strip()
    print(out)
    check(f"import {name} said", ("converted to f32" in out) == (dtype != torch.float32), out)
    # HF's loss: its model in f32 with the weights it saved (bf16-rounded for bf16).
    ref = GPT2LMHeadModel.from_pretrained(src, torch_dtype=torch.float32).eval()
    (lf, score), lh = fsdp_loss(save, data), loss(hf_logits(ref, tokens))
    check(f"import {name} loss", abs(lf - lh) <= TOL * abs(lh) and score["targets"] == B * T,
          f"fsdp-eval {lf:.6f} over {score['targets']} targets, HF {lh:.8f}, relative "
          f"difference {abs(lf - lh) / abs(lh):.3g}")

untied = GPT2LMHeadModel(GPT2Config(**{**cfg.to_dict(), "tie_word_embeddings": False})).eval()
src = os.path.join(work, "hf-untied")
untied.save_pretrained(src)
p = run(fsdp_ckpt, "import", src, os.path.join(work, "imp-untied"), ok=False)
check("untied head refused", p.returncode == 1 and "untied output head" in p.stderr,
      p.stderr.strip() or f"exit {p.returncode}")

print(f"{len(failures)} failed" if failures else "all interop checks passed")
sys.exit(1 if failures else 0)
