#!/usr/bin/env python3
"""tests/interop/llama_interop.py — fsdp and Hugging Face transformers on the
same LlamaForCausalLM, both directions (run by test_hf_interop.sh --script
llama_interop.py inside its virtual environment, with fsdp's tools on the
command line). For small random Llamas made by transformers (untied with
grouped-query attention, tied with llama3 RoPE scaling, several dtypes, one
file and sharded with an index, config.json as transformers v5 writes it and
as published v4 checkpoints have it):
  import  -> fsdp-ckpt import at N = 1, reshard to N = 3; the manifest
             records the Llama (config.json's every field);
  export  -> fsdp-ckpt export --hf from both: the two exports are the same
             bytes, every tensor equals the source's bit for bit (upcast to
             f32), LlamaForCausalLM.from_pretrained loads it with no missing
             or unexpected keys and the same configuration (heads, KV heads,
             rope_parameters, eps, tie), names/shapes/dtypes as
             save_pretrained writes them;
  logits  -> fsdp-eval --logits of the imported checkpoint at N = 1 and of the
             resharded one under fsdp-run at N = 3 equal LlamaForCausalLM's
             (the source's weights in f32) to 1e-5 of the largest, and
             transformers' logits of the export equal fsdp's; fsdp-eval's
             loss equals transformers' cross-entropy;
  train   -> (untied GQA and tied llama3) on one batch, llama_train's one SGD
             step with lr 1 at N = 1 and N = 3 moves every weight by
             PyTorch's gradient of the mean loss (to 1e-5 of the largest), and
             its 20 AdamW steps at N = 3 (weight decay 0.1, norms undecayed)
             end where torch.optim.AdamW ends: the loss there equal to 1e-5,
             the weights' RMS difference under 1e-3 of the RMS change (not
             the largest: an element whose gradient is below Adam's eps,
             1e-8, moves by g / (|g| + eps), where fp32 rounding of g alone
             changes the step by a sizeable fraction of lr);
  resume  -> fsdp-train --model llama --preset tiny continues from the import of
             a tiny-shaped Llama, its save records the Llama, exports, and
             transformers' logits of that export equal fsdp-eval's; an import
             of another configuration (same names, llama3 RoPE, tied) is
             refused naming the first difference;
  refused -> what fsdp's Llama cannot compute is refused by name and leaves
             nothing behind.
usage: llama_interop.py WORKDIR FSDP_TRAIN FSDP_CKPT FSDP_EVAL"""
import filecmp
import json
import numpy as np
import os
import subprocess
import sys

import torch
import transformers
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM

work, fsdp_train, fsdp_ckpt, fsdp_eval = sys.argv[1:5]
fsdp_run = os.path.join(os.path.dirname(fsdp_eval), "fsdp-run")
llama_train = os.path.join(os.path.dirname(fsdp_eval), "tests", "llama_train")
B, T, V = 2, 32, 256  # windows of bytes: the vocabulary is 256
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


def tensors(d):
    """Every tensor of a HF directory (one file or an index's shards), as f32."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    out = {}
    for name in files:
        with safe_open(os.path.join(d, name), "pt") as f:
            out.update({k: f.get_tensor(k).float() for k in f.keys()})
    return out


def layout(d):
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}


def as_v4(d):
    """config.json rewritten with the keys published checkpoints (v4) use."""
    path = os.path.join(d, "config.json")
    c = json.load(open(path))
    rope = c.pop("rope_parameters")
    c["rope_theta"] = rope.pop("rope_theta")
    c["rope_scaling"] = None if rope["rope_type"] == "default" else rope
    c["torch_dtype"] = c.pop("dtype", "float32")
    json.dump(c, open(path, "w"), indent=2)


CONFIG_KEYS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
               "tie_word_embeddings", "rope_parameters", "head_dim", "attention_bias", "mlp_bias"]

BASE = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-5)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 500000.0}
CASES = [  # name, config, dtype, shard size, v4 config.json
    ("untied-gqa-f32", dict(tie_word_embeddings=False), torch.float32, None, False),
    ("tied-llama3-bf16", dict(tie_word_embeddings=True, rope_parameters=LLAMA3), torch.bfloat16,
     None, False),
    ("untied-mqa-f16-sharded-v4", dict(tie_word_embeddings=False, num_key_value_heads=1,
                                       rope_parameters={"rope_type": "default",
                                                        "rope_theta": 50000.0}),
     torch.float16, "40KB", True),
    ("tied-llama3-f32-sharded-v4", dict(tie_word_embeddings=True, rope_parameters=LLAMA3),
     torch.float32, "30KB", True),
]


def make(name, cfg, dtype, shard, v4):
    torch.manual_seed(len(name))
    model = LlamaForCausalLM(LlamaConfig(**{**BASE, **cfg})).eval()
    src = os.path.join(work, f"hf-{name}")
    model.to(dtype).save_pretrained(src, **({"max_shard_size": shard} if shard else {}))
    if v4:
        as_v4(src)
    return model, src


def round_trip(name, cfg, dtype, shard, v4):
    model, src = make(name, cfg, dtype, shard, v4)
    sharded = os.path.exists(os.path.join(src, "model.safetensors.index.json"))
    check(f"{name}: source", sharded == bool(shard), f"sharded {sharded}, "
          f"{len(os.listdir(src))} files")
    ck1, ck3 = os.path.join(work, f"ck1-{name}"), os.path.join(work, f"ck3-{name}")
    print(run(fsdp_ckpt, "import", src, ck1).stdout.strip())
    run(fsdp_ckpt, "reshard", ck1, "--world", "3", ck3)
    manifest = json.load(open(os.path.join(ck3, "step-0", "manifest.json")))
    rec = manifest.get("model", {})
    want = model.config
    rope = want.rope_parameters
    same = (rec.get("family") == "llama" and manifest["world_size"] == 3 and
            [rec.get(k) for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden",
                                  "vocab_size", "max_seq_len", "tie_embeddings", "rope_type")] ==
            [want.num_hidden_layers, want.num_attention_heads, want.num_key_value_heads,
             want.hidden_size, want.intermediate_size, want.vocab_size,
             want.max_position_embeddings, want.tie_word_embeddings, rope["rope_type"]] and
            rec["rope_theta"] == rope["rope_theta"] and
            abs(rec["rms_eps"] - want.rms_norm_eps) <= 1e-12)
    check(f"{name}: manifest", same, f"records {rec}")
    outs = []
    for ck in (ck1, ck3):
        out = ck.replace("ck", "hf-out", 1)
        print(run(fsdp_ckpt, "export", ck, "--hf", out).stdout.strip())
        outs.append(out)
    check(f"{name}: N=1 and N=3 exports", filecmp.cmp(*(os.path.join(o, "model.safetensors")
                                                        for o in outs), shallow=False) and
          filecmp.cmp(*(os.path.join(o, "config.json") for o in outs), shallow=False),
          "model.safetensors and config.json byte-identical")
    theirs, ours = tensors(src), tensors(outs[1])
    if want.tie_word_embeddings:
        theirs.pop("lm_head.weight", None)  # save_pretrained leaves the tied head out too
    diff = [k for k in theirs if k not in ours or not torch.equal(theirs[k], ours[k])]
    check(f"{name}: tensors", not diff and set(ours) == set(theirs),
          f"{len(ours)} tensors equal the source's bit for bit (as f32)" if not diff else
          f"differ or missing: {diff[:4]}, extra {sorted(set(ours) - set(theirs))[:4]}")
    try:
        back, info = LlamaForCausalLM.from_pretrained(outs[1], output_loading_info=True)
    except Exception as e:  # a config that disagrees with the tensors' shapes
        check(f"{name}: from_pretrained", False, f"{type(e).__name__}: {str(e)[:300]}")
        return model, src, ck1
    keys = {k: sorted(v) for k, v in info.items() if v}
    check(f"{name}: from_pretrained keys", not keys, keys or "no missing or unexpected keys")
    got, exp = back.config.to_dict(), want.to_dict()
    bad = {k: (got.get(k), exp.get(k)) for k in CONFIG_KEYS if got.get(k) != exp.get(k)}
    check(f"{name}: config", not bad, bad or "from_pretrained reads the source's configuration")
    if want.tie_word_embeddings:
        check(f"{name}: tied", back.lm_head.weight.data_ptr() ==
              back.model.embed_tokens.weight.data_ptr(), "lm_head shares embed_tokens' storage")
    resaved = os.path.join(work, f"hf-resaved-{name}")
    back.save_pretrained(resaved)
    diff = sorted(set(layout(outs[1]).items()) ^ set(layout(resaved).items()))
    check(f"{name}: safetensors layout", not diff, f"differs from save_pretrained's: {diff[:4]}"
          if diff else "names, shapes and dtypes as save_pretrained writes them")
    return model, src, ck1


def fsdp_eval_on(ckpt, ranks, *args):
    launch = [fsdp_run, "--nproc-per-node", str(ranks)] if ranks > 1 else []
    return run(*launch, fsdp_eval, "--checkpoint", ckpt, "--data", data, "--split", "all",
               "--seq-len", str(T), *args)


def fsdp_logits(ckpt, ranks):
    out = os.path.join(work, "logits.npy")
    fsdp_eval_on(ckpt, ranks, "--no-score", "--logits", str(B * T), "--logits-out", out)
    return np.load(out).reshape(B, T, V)


def fsdp_loss(ckpt, ranks):
    p = fsdp_eval_on(ckpt, ranks, "--json")
    return [json.loads(l) for l in p.stdout.splitlines() if '"loss"' in l][0]["loss"]


def hf_logits(model):
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.float().numpy()


def rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def logits(name, src, ck1):
    """fsdp's logits (N = 1 and 3) against transformers' on the same weights."""
    ref = LlamaForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    want = hf_logits(ref)
    ck3, out3 = os.path.join(work, f"ck3-{name}"), os.path.join(work, f"hf-out3-{name}")
    for ranks, ck in ((1, ck1), (3, ck3)):
        got = fsdp_logits(ck, ranks)
        r = rel(got, want)
        check(f"{name}: logits N={ranks}", r <= TOL, f"max |fsdp - HF| / max |HF| = {r:.3g} over "
              f"{got.size} logits")
    exported = hf_logits(LlamaForCausalLM.from_pretrained(out3).eval())
    r = rel(exported, got)
    check(f"{name}: export logits", r <= TOL, f"transformers on the export vs fsdp at N=3: {r:.3g}")
    x = torch.from_numpy(want.astype(np.float64)).reshape(-1, V)
    lh = torch.nn.functional.cross_entropy(x, torch.from_numpy(targets.reshape(-1))).item()
    lf = fsdp_loss(ck3, 3)
    check(f"{name}: loss", abs(lf - lh) <= TOL * abs(lh), f"fsdp-eval {lf:.6f} at N=3, HF "
          f"{lh:.8f}, relative difference {abs(lf - lh) / abs(lh):.3g}")


TB, TT, STEPS, LR, WD = 6, 16, 20, 1e-3, 0.1  # the training batch (6 rows: N = 1, 2, 3)
GRAD_TOL, LOSS_TOL, ADAM_RMS_TOL = 1e-5, 1e-5, 1e-3


def fsdp_trained(name, ck1, ranks, steps, optim, lr, wd):
    """The weights after llama_train's steps, through export --hf."""
    out = os.path.join(work, f"train-{name}-{optim}-{ranks}")
    launch = [fsdp_run, "--nproc-per-node", str(ranks)] if ranks > 1 else []
    run(*launch, llama_train, ck1, train_data, str(TB), str(TT), str(steps), optim, str(lr),
        str(wd), out)
    run(fsdp_ckpt, "export", out, "--hf", out + "-hf")
    return tensors(out + "-hf")


def torch_loss(model):
    x = torch.from_numpy(train_stream[:-1].reshape(TB, TT))
    y = torch.from_numpy(train_stream[1:].reshape(TB, TT))
    return torch.nn.functional.cross_entropy(model(x).logits.reshape(-1, V), y.reshape(-1))


def rms_ratio(a, b, scale):
    """RMS of a - b over every tensor, over the RMS of scale."""
    d = sum(float(((a[k] - b[k]) ** 2).sum()) for k in b)
    return (d / sum(float((scale[k] ** 2).sum()) for k in b)) ** 0.5


def worst(a, b, scale):
    """max |a - b| over every tensor, over max |scale|."""
    d = max(float((a[k] - b[k]).abs().max()) for k in b)
    return d / max(float(scale[k].abs().max()) for k in b)


def training(name, src):
    w0 = {k: v for k, v in tensors(src).items()}
    model = LlamaForCausalLM.from_pretrained(src, dtype=torch.float32).train()
    named = dict(model.named_parameters())
    torch_loss(model).backward()
    grad = {k: named[k].grad.detach().clone() for k in named}
    ck1 = os.path.join(work, f"ck1-{name}")
    for ranks in (1, 3):
        w1 = fsdp_trained(name, ck1, ranks, 1, "sgd", 1.0, 0.0)
        g = {k: w0[k] - w1[k] for k in w1}
        r = worst(g, {k: grad[k] for k in w1}, grad)
        check(f"{name}: gradients N={ranks}", r <= GRAD_TOL and set(w1) == set(grad),
              f"one SGD step of lr 1: max |(w0 - w1) - PyTorch's grad| / max |grad| = {r:.3g} "
              f"over {len(w1)} tensors")
    model.zero_grad()
    decay = [p for k, p in named.items() if "norm" not in k]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": [p for k, p in named.items() if "norm" in k],
                              "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.999), eps=1e-8)
    for _ in range(STEPS):
        opt.zero_grad()
        torch_loss(model).backward()
        opt.step()
    want = {k: p.detach() for k, p in named.items()}
    got = fsdp_trained(name, ck1, 3, STEPS, "adamw", LR, WD)
    moved = {k: want[k] - w0[k] for k in got}
    r, m = rms_ratio(got, want, moved), worst(got, want, moved)
    check(f"{name}: AdamW {STEPS} steps N=3 weights", r <= ADAM_RMS_TOL and set(got) == set(w0),
          f"RMS |fsdp - PyTorch| / RMS PyTorch's change = {r:.3g} (largest difference "
          f"{m:.3g} of the largest change, "
          f"{max(float(v.abs().max()) for v in moved.values()):.3g})")
    with torch.no_grad():
        start = float(torch_loss(LlamaForCausalLM.from_pretrained(src, dtype=torch.float32)))
        lt = float(torch_loss(model.eval()))
        lf = float(torch_loss(LlamaForCausalLM.from_pretrained(
            os.path.join(work, f"train-{name}-adamw-3-hf")).eval()))
    check(f"{name}: AdamW {STEPS} steps N=3 loss", abs(lf - lt) <= LOSS_TOL * lt and lt < start,
          f"{start:.6f} -> fsdp {lf:.7f}, PyTorch {lt:.7f} (relative difference "
          f"{abs(lf - lt) / lt:.3g})")


def resume():
    """fsdp-train from an import whose configuration is the tiny preset's."""
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        f.write("".join(chr(c) for c in rng.integers(32, 127, size=20000)))
    run_dir = os.path.join(work, "train-run")
    run(fsdp_train, "--model", "llama", "--preset", "tiny", "--data", text, "--steps", "2",
        "--global-batch", "4", "--seq-len", "32", "--resume", os.path.join(work, "ck1-untied-gqa-f32"),
        "--save-dir", run_dir)
    rec = json.load(open(os.path.join(run_dir, "step-2", "manifest.json"))).get("model", {})
    check("resume: record", rec.get("family") == "llama" and rec.get("n_kv_head") == 2,
          f"fsdp-train's save records {rec}")
    out = os.path.join(work, "train-run-hf")
    run(fsdp_ckpt, "export", run_dir, "--hf", out)
    r = rel(hf_logits(LlamaForCausalLM.from_pretrained(out).eval()), fsdp_logits(run_dir, 1))
    check("resume: export logits", r <= TOL, f"transformers on the trained export vs fsdp-eval: "
          f"{r:.3g}")
    p = run(fsdp_train, "--model", "llama", "--preset", "tiny", "--data", text, "--steps", "2",
            "--global-batch", "4", "--seq-len", "32", "--resume",
            os.path.join(work, "ck1-tied-llama3-bf16"), ok=False)
    check("resume: other config refused", p.returncode != 0 and
          "is not this model: rope_theta 500000, not 10000" in p.stderr,
          p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")


def refused(name, edit, expect):
    """A copy of a good directory with config.json edited: refused naming
    `expect`, and the output directory never created."""
    src = os.path.join(work, f"hf-{CASES[0][0]}")
    bad = os.path.join(work, f"bad-{name}")
    os.makedirs(bad)
    for f in os.listdir(src):
        os.link(os.path.join(src, f), os.path.join(bad, f)) if f != "config.json" else None
    c = json.load(open(os.path.join(src, "config.json")))
    edit(c)
    json.dump(c, open(os.path.join(bad, "config.json"), "w"))
    out = os.path.join(work, f"imp-{name}")
    p = run(fsdp_ckpt, "import", bad, out, ok=False)
    check(f"refused {name}", p.returncode == 1 and expect in p.stderr and not os.path.exists(out),
          p.stderr.strip() or f"exit {p.returncode}")


print(f"torch {torch.__version__}, transformers {transformers.__version__}")
rng = np.random.default_rng(23)
stream = rng.integers(32, 127, size=B * T + 1)  # printable bytes, read back as tokens
tokens, targets = stream[:-1].reshape(B, T), stream[1:].reshape(B, T)
data = os.path.join(work, "tokens.txt")
stream.astype(np.uint8).tofile(data)
train_stream = rng.integers(32, 127, size=TB * TT + 1)
train_data = os.path.join(work, "train.bin")
train_stream.astype(np.uint8).tofile(train_data)
for case in CASES:
    model, src, ck1 = round_trip(*case)
    logits(case[0], src, ck1)
    if case[0] in ("untied-gqa-f32", "tied-llama3-bf16"):
        training(case[0], src)
resume()

refused("attention_bias", lambda c: c.update(attention_bias=True), '"attention_bias" is true')
refused("mlp_bias", lambda c: c.update(mlp_bias=True), '"mlp_bias" is true')
refused("head_dim", lambda c: c.update(head_dim=32), '"head_dim" 32 is not')
refused("rope_yarn", lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                         "rope_theta": 10000.0}),
        'rope_type "yarn" is not supported')
refused("hidden_act", lambda c: c.update(hidden_act="gelu"), '"hidden_act" "gelu"')
refused("model_type", lambda c: c.update(model_type="mistral"), '"model_type" mistral')
refused("untied_head", lambda c: c.update(tie_word_embeddings=True),
        "an untied output head, which a Llama with tie_word_embeddings")

print(f"{len(failures)} failed" if failures else "all Llama interop checks passed")
sys.exit(1 if failures else 0)
