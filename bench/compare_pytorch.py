#!/usr/bin/env python3
"""bench/compare_pytorch.py — the same GPT-2 or Llama trained by fsdp (fsdp-bench
under mpirun) and by PyTorch FSDP2 (fully_shard, one process per rank), one after
the other in one invocation, with the same configuration, batch, dtype, optimizer
(AdamW), world size and threads (one BLAS / intra-op thread per rank).

--model llama --preset NAME: fsdp-bench --model llama against transformers'
LlamaForCausalLM (sdpa attention) built from the same preset (fsdp_llama_preset's
shape: hidden, layers, heads, KV heads, FFN, vocabulary, RoPE theta and llama3
scaling, tied or not), one FSDP2 unit per decoder layer as fsdp's default; the
loss is the cross-entropy of the logits against fsdp-bench's kind of targets
(random, unshifted), as for GPT-2. Needs transformers beside torch.

Prints both tokens/s (median over the timed steps; per step the slowest rank),
both peak memories per rank and the ratios.

CPU (the default, --device cpu): fp32 on both sides; PyTorch on gloo, fsdp on
the backend its world runs (MPI). Memory is the resident high-water mark (Linux
VmHWM, reset just before the model is built) and its growth over the resident
size at that point, since PyTorch has no allocator statistics on the CPU.

GPU (--device cuda): like for like on the GPUs, one GPU per rank on both sides:
fsdp-bench --device cuda --comm nccl, PyTorch FSDP2 on NCCL with rank r on
cuda:r (fsdp-bench takes local rank % visible GPUs, the same GPU). Both use
NCCL, which needs one GPU per rank: with more ranks than visible GPUs the
script refuses (it does not fall back to fsdp's mpi backend, since PyTorch's
side could not run either and the two would no longer compare like with like).
  --dtype f32   fp32 everything; TF32 off on both (fsdp's cuBLAS computes in
                CUBLAS_COMPUTE_32F; PyTorch: set_float32_matmul_precision
                ("highest")).
  --dtype bf16  parameters gathered and computed in bf16, fp32 master weights,
                optimizer state and gradient reduction: fsdp-bench --dtype bf16
                --reduce-dtype f32; PyTorch fully_shard(mp_policy=
                MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                reduce_dtype=torch.float32)) on every block and the root, its
                sharded parameters and AdamW in fp32. bf16 is GPU only (fsdp's
                CPU kernels compute in fp32, PyTorch's would in bf16).
With --device cuda a third row runs PyTorch the way single-node training
scripts do (nanoGPT's habit): torch.compile(model), the step under bf16
autocast (--dtype bf16; fp32 without TF32 for --dtype f32), AdamW(fused=True),
and no FSDP (DDP over NCCL when --np > 1, every rank holding the whole model);
it is printed as its own row with fsdp's ratio to it. The CPU comparison has
no such row.
Memory is device memory: the headline is the GPU memory in use after the timed
steps (cudaMemGetInfo: total - free, CUDA context and NCCL buffers included) on
both sides — fsdp-bench's device_peak_bytes and torch.cuda.mem_get_info() at
the same point — the largest rank's; PyTorch's allocator peak
(torch.cuda.max_memory_allocated) and reserved peak are printed beside it
(fsdp allocates its pools once, so in use after the steps is its peak; the
allocator peak leaves out the context, so it is no like-for-like ratio). Host
RSS is still recorded in the JSON. MFU: the model FLOPs per token fsdp-bench
reports x each side's tokens/s / the cuBLAS peak fsdp-bench measured on the
same GPUs (--dtype's matmul), so both sides use one peak.

Activation checkpointing (--checkpoint), on the same blocks on both sides:
  none      nothing recomputed (the default).
  all       every block: fsdp-bench --checkpoint GPT2Block (LlamaDecoderLayer),
            PyTorch checkpoint_wrapper (non-reentrant torch.utils.checkpoint)
            on every block before fully_shard.
  N         the first N blocks: fsdp-bench --config with a `checkpoint: true`
            rule per block (h.0 .. h.<N-1>), PyTorch checkpoint_wrapper on
            model.h[0:N] (model.layers[0:N]).
  auto      fsdp-bench --checkpoint auto [--memory-budget GIB]: the fewest
            leading blocks its memory budget needs; the script reads the k it
            chose from its JSON and runs PyTorch twice: FSDP2 with the same
            first k blocks checkpointed (the headline ratio) and FSDP2 with all
            (a row of its own). The torch.compile row never checkpoints.

Without torch it says how to install it and exits 0.
    python3 bench/compare_pytorch.py --np 2              # the small preset on CPU
    python3 bench/compare_pytorch.py --device cuda --np 1 --preset 124M \\
        --seq-len 1024 --micro-batch 16 --dtype bf16      # one GPU, GPT-2 124M
    python3 bench/compare_pytorch.py --model llama --preset SmolLM-135M --seq-len 64 \\
        --micro-batch 2                                   # Llama on the CPU
    python3 bench/compare_pytorch.py --device cuda --np 1 --preset 1558M --seq-len 1024 \\
        --micro-batch 16 --dtype bf16 --checkpoint auto   # issue 22: 1558M, checkpointed
"""
import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The byte-level CPU presets and the published sizes, as fsdp_gpt2_preset has them.
PRESETS = {
    "tiny": dict(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=256),
    "small": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=256),
    "124M": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
    "350M": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, vocab_size=50257),
    "774M": dict(n_layer=36, n_head=20, n_embd=1280, block_size=1024, vocab_size=50257),
    "1558M": dict(n_layer=48, n_head=25, n_embd=1600, block_size=1024, vocab_size=50257),
}
# The Llama presets as fsdp_llama_preset has them (src/ckpt/llama_layout.c);
# block_size is the T fsdp-bench runs by default: the context, at most 1024.
LLAMA_PRESETS = {name: dict(zip(
    ("n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "vocab_size", "max_seq_len",
     "rope_theta", "tied", "rope_scaling"), v), block_size=min(v[6], 1024)) for name, v in {
    "tiny": (2, 4, 2, 64, 160, 256, 64, 10000.0, False, None),
    "SmolLM-135M": (30, 9, 3, 576, 1536, 49152, 2048, 10000.0, True, None),
    "TinyLlama-1.1B": (22, 32, 4, 2048, 5632, 32000, 2048, 10000.0, False, None),
    "Llama-3.2-1B": (16, 32, 8, 2048, 8192, 128256, 131072, 500000.0, True,
                     dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)),
}.items()}
MODELS = {"gpt2": PRESETS, "llama": LLAMA_PRESETS}


def describe(args, cfg, T):
    """The model's line in the table."""
    if args.model == "llama":
        return (f"Llama {args.preset}: {cfg['n_layer']} layers x {cfg['n_embd']} wide, "
                f"{cfg['n_head']} heads / {cfg['n_kv_head']} KV, FFN {cfg['ffn_hidden']}, T {T}, "
                f"vocab {cfg['vocab_size']}, {'tied' if cfg['tied'] else 'untied'}")
    return (f"GPT-2 {args.preset}: {cfg['n_layer']} layers x {cfg['n_embd']} wide, "
            f"{cfg['n_head']} heads, T {T}, vocab {cfg['vocab_size']}")


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def cpu_seconds_busy():
    """Seconds of CPU the whole machine spent busy (steal included), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    guest = sum(v[8:10]) if len(v) > 9 else 0  # already counted in user and nice
    return (sum(v) - idle - guest) / os.sysconf("SC_CLK_TCK")


def measured(run, args):
    """Runs one side and adds other_load: the share of the machine's cores that
    processes other than this side (other jobs, the hypervisor's steal) kept busy
    meanwhile, from /proc/stat less this side's own CPU time."""
    import resource
    busy0, wall0 = cpu_seconds_busy(), time.perf_counter()
    own0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run(args)
    own1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - wall0
    own = (own1.ru_utime - own0.ru_utime) + (own1.ru_stime - own0.ru_stime)
    other = cpu_seconds_busy() - busy0 - own
    result["other_load"] = max(other, 0.0) / (wall * os.cpu_count())
    return result


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


# ---- PyTorch side -------------------------------------------------------------

def build_gpt(torch, cfg):
    """GPT-2, pre-LN, GELU (tanh), tied embeddings, GPT-2's init."""
    nn = torch.nn
    F = torch.nn.functional
    C, L, NH = cfg["n_embd"], cfg["n_layer"], cfg["n_head"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab_size"], C)
            self.wpe = nn.Embedding(cfg["block_size"], C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif "ln" in name:
                    nn.init.ones_(p)
                else:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def units(self):
            return self.h

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for block in self.h:
                x = block(x)
            # Tied output head. Under bf16 the logits stay bf16, as fsdp's: the
            # cross-entropy kernel accumulates its statistics in fp32 either way.
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def build_llama(torch, cfg):
    """transformers' LlamaForCausalLM of the preset's shape (its own init: N(0, 0.02)
    matrices, unit norms, as fsdp's), returning the loss as build_gpt's model."""
    from transformers import LlamaConfig, LlamaForCausalLM
    F = torch.nn.functional
    rope = dict(rope_type="llama3", **cfg["rope_scaling"]) if cfg["rope_scaling"] \
        else dict(rope_type="default")
    hf = LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["n_embd"],
                     intermediate_size=cfg["ffn_hidden"], num_hidden_layers=cfg["n_layer"],
                     num_attention_heads=cfg["n_head"], num_key_value_heads=cfg["n_kv_head"],
                     max_position_embeddings=cfg["max_seq_len"], rms_norm_eps=1e-5,
                     tie_word_embeddings=cfg["tied"], attention_bias=False, mlp_bias=False,
                     rope_parameters=dict(rope, rope_theta=cfg["rope_theta"]))
    hf._attn_implementation = "sdpa"

    class CausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = LlamaForCausalLM(hf)

        def units(self):
            return self.lm.model.layers

        def forward(self, idx, targets):
            logits = self.lm(input_ids=idx, use_cache=False).logits
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return CausalLM()


def checkpoint_first(model, k):
    """Activation checkpointing on the first k blocks (decoder layers), the ones
    fsdp checkpoints: each wrapped in checkpoint_wrapper (torch.utils.checkpoint,
    non-reentrant), before fully_shard as torchtitan orders them."""
    if k <= 0:
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    units = model.units()
    for i in range(k):
        units[i] = checkpoint_wrapper(units[i])


def wrap_fsdp2(torch, model, args):
    """FSDP2: one unit per block and the root; the AdamW over the shards."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    # bf16: gathers and compute in bf16; the sharded parameters (AdamW's master
    # weights and state) stay fp32 and gradients are reduced in fp32.
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if args.dtype == "bf16" else MixedPrecisionPolicy()
    for block in model.units():  # one unit per block / decoder layer, as fsdp's default wrap
        fully_shard(block, reshard_after_forward=True, mp_policy=mp)
    fully_shard(model, reshard_after_forward=True, mp_policy=mp)  # the root: embeddings, norm, head
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    return model, opt


def wrap_compiled(torch, model, args, device):
    """nanoGPT's habit: torch.compile, fused AdamW, DDP across ranks (no FSDP);
    bf16 comes from autocast in the step (fp32 weights, optimizer and grads)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0, fused=True)
    model = torch.compile(model)
    if args.np > 1:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[device.index])
    return model, opt


def torch_rank(rank, args, port, queue, compiled=False, ckpt=0):
    """One PyTorch rank. Running out of GPU memory is a result ({"oom": the error}), not a
    crash, so that the rows measured before it are kept (FSDP2 without checkpointing at
    1558M does not fit an 80 GB GPU): main() then compares with FSDP2 checkpointing every
    block where --checkpoint auto ran that too, or leaves out the row that did not fit.
    run_torch ends the other ranks. (torch.compile failing while it compiles raises
    another error: --no-compile leaves that row out.)"""
    import torch
    try:
        torch_rank_run(rank, args, port, queue, compiled, ckpt)
    except torch.cuda.OutOfMemoryError as e:
        first = (str(e).splitlines() or ["CUDA out of memory"])[0]
        queue.put(dict(oom=f"rank {rank}: {first}"))
        queue.close()
        queue.join_thread()  # the message is out before the process goes
        os._exit(0)  # no teardown of a process group whose peers are still in it


def torch_rank_run(rank, args, port, queue, compiled, ckpt):
    import contextlib

    import torch
    import torch.distributed as dist

    # For tests on machines without a GPU: COMPARE_PYTORCH_OOM=ckpt:K makes the FSDP2 run
    # with K blocks checkpointed fail as CUDA's allocator does when the GPU is full.
    if not compiled and os.environ.get("COMPARE_PYTORCH_OOM") == f"ckpt:{ckpt}":
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (COMPARE_PYTORCH_OOM=ckpt:{ckpt})")

    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:  # one GPU per rank (main checked there are enough), before NCCL starts
        torch.cuda.set_device(device)
        torch.set_float32_matmul_precision("highest")  # no TF32: fsdp's fp32 GEMMs have none
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.np)
    cfg = MODELS[args.model][args.preset]
    T = args.seq_len or cfg["block_size"]
    torch.manual_seed(args.seed)
    reset_peak_rss()
    rss_base = status_bytes("VmRSS")
    with torch.device(device):
        model = (build_llama if args.model == "llama" else build_gpt)(torch, cfg)
    params = sum(p.numel() for p in model.parameters())
    if not compiled:
        checkpoint_first(model, ckpt)
    wrapped = sum(type(m).__name__ == "CheckpointWrapper" for m in model.modules())
    model, opt = wrap_compiled(torch, model, args, device) if compiled \
        else wrap_fsdp2(torch, model, args)
    amp = compiled and args.dtype == "bf16"

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext()

    g = torch.Generator().manual_seed(args.seed + 1000 * rank + 1)
    B, V = args.micro_batch, cfg["vocab_size"]
    tok = torch.randint(0, V, (B, T), generator=g).to(device)
    tgt = torch.randint(0, V, (B, T), generator=g).to(device)

    def step():
        with autocast():
            loss = model(tok, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        return loss.item()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    times, first = [], None
    for _ in range(args.iters):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
        first = loss if first is None else first
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if cuda:  # as fsdp-bench's device_peak_bytes: cudaMemGetInfo total - free, now
        free, total = torch.cuda.mem_get_info(device)
        gpu = [torch.cuda.max_memory_allocated(device), total - free,
               torch.cuda.max_memory_reserved(device)]
    else:
        gpu = [0, 0, 0]
    mem = torch.tensor([status_bytes("VmHWM"), rss_base] + gpu, dtype=torch.float64,
                       device=device)
    dist.all_reduce(mem, op=dist.ReduceOp.MAX)
    losses = torch.tensor([first, loss], dtype=torch.float64, device=device)
    dist.all_reduce(losses)
    if rank == 0:
        step_s = median(t.tolist())
        r = dict(tokens_per_s=args.np * B * T / step_s, step_ms=step_s * 1e3,
                 rss_peak=mem[0].item(), rss_base=mem[1].item(),
                 cuda_peak=mem[2].item(), loss_first=losses[0].item() / args.np,
                 loss_last=losses[1].item() / args.np, torch=torch.__version__,
                 params=params, checkpointed=wrapped)  # params: the whole model
        if cuda:  # bytes, the largest rank's
            r.update(device_in_use=mem[3].item(), device_reserved_peak=mem[4].item(),
                     gpu=torch.cuda.get_device_name(device), cuda_runtime=torch.version.cuda,
                     nccl=nccl_version(torch))
        queue.put(r)
    dist.destroy_process_group()


def nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # torch built without NCCL
        return "?"
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def run_torch(args, compiled=False, ckpt=0):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=torch_rank, args=(r, args, port, queue, compiled, ckpt))
             for r in range(args.np)]
    for p in procs:
        p.start()
    result = None
    while result is None:
        try:
            result = queue.get(timeout=1.0)
        except Exception:  # queue.Empty: is every rank still alive?
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                sys.exit("compare_pytorch: a PyTorch rank failed (see above)")
    if "oom" in result:
        for p in procs:
            p.kill()
    for p in procs:
        p.join()
    return result


# ---- fsdp side ----------------------------------------------------------------

def find_bench(path):
    if path:
        return path
    for d in ("build", "build-bn"):
        p = os.path.join(REPO, d, "fsdp-bench")
        if os.path.exists(p):
            return p
    sys.exit("compare_pytorch: no fsdp-bench found; build it (meson setup build && ninja -C build) "
             "or pass --fsdp-bench PATH")


def checkpoint_flags(args, tmp):
    """fsdp-bench's flags for --checkpoint: none; every block by kind; the first
    N by a configuration file of one rule per block (written into tmp); auto."""
    kind = "LlamaDecoderLayer" if args.model == "llama" else "GPT2Block"
    prefix = "model.layers." if args.model == "llama" else "h."
    if args.checkpoint == "all":
        return ["--checkpoint", kind]
    if args.checkpoint == "auto":
        return ["--checkpoint", "auto"] + (["--memory-budget", str(args.memory_budget)]
                                           if args.memory_budget else [])
    n = 0 if args.checkpoint == "none" else int(args.checkpoint)
    if n == 0:
        return []
    path = os.path.join(tmp, "checkpoint-first.yaml")
    with open(path, "w") as f:
        f.write("sharding:\n" + "".join(f'  - match: "{prefix}{i}"\n    checkpoint: true\n'
                                        for i in range(n)))
    return ["--config", path]


def run_fsdp(args):
    bench = find_bench(args.fsdp_bench)
    cmd = [args.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(args.np)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [bench, "--json", "--model", args.model, "--preset", args.preset, "--micro-batch", str(args.micro_batch),
            "--warmup", str(args.warmup), "--iters", str(args.iters), "--strategy", "zero3",
            "--prefetch", str(args.prefetch)]
    if args.device == "cuda":  # NCCL, one GPU per rank; the default --peak-size: cuBLAS peak, MFU
        cmd += ["--device", "cuda", "--comm", "nccl", "--dtype", args.dtype,
                "--reduce-dtype", "f32", "--seed", str(args.seed)]
    else:
        cmd += ["--peak-size", "0", "--seed", str(args.seed)]
    if args.seq_len:
        cmd += ["--seq-len", str(args.seq_len)]
    layers = MODELS[args.model][args.preset]["n_layer"]
    tmp = tempfile.mkdtemp(prefix="compare-pytorch-")
    cmd += checkpoint_flags(args, tmp)
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1", OMPI_MCA_btl="self,vader",
               OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    command = " ".join(cmd[cmd.index(bench):])
    try:
        out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
        doc = json.loads(out)
        r = doc["results"][0]
    except subprocess.CalledProcessError as e:
        sys.exit(f"compare_pytorch: fsdp-bench failed (exit status {e.returncode}; its message is "
                 f"above):\n  {' '.join(cmd)}")
    except (ValueError, KeyError, IndexError):
        sys.exit(f"compare_pytorch: fsdp-bench printed no results JSON:\n  {' '.join(cmd)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # the blocks fsdp recomputed: auto's choice from its JSON, else the flag's
    if args.checkpoint == "auto":
        if "checkpoint_auto" not in r:
            sys.exit(f"compare_pytorch: fsdp-bench reported no checkpoint_auto choice:\n  "
                     f"{' '.join(cmd)}")
        checkpointed = r["checkpoint_auto"]["checkpointed"]
    else:
        checkpointed = (0 if args.checkpoint == "none" else layers if args.checkpoint == "all"
                        else int(args.checkpoint))
    res = dict(backend=doc["backend"], tokens_per_s=r["tokens_per_s"]["median"],
               step_ms=r["step_ms"]["median"],
               rss_peak=r["memory"]["rss_peak"], rss_base=r["memory"]["rss_base"],
               model_peak=r["memory"]["model_peak"], exposed_ms=r["exposed_comm_ms"]["median"],
               compute_ms=r["compute_ms"]["median"], comm_ms=r["comm_ms"]["median"],
               loss_first=r["loss_first"], loss_last=r["loss_last"], wrong=r["wrong"],
               params=r["params"], command=command, checkpointed=checkpointed)
    if args.device == "cuda":
        if "device_peak_bytes" not in r:
            sys.exit("compare_pytorch: fsdp-bench reported no device memory (device_peak_bytes): "
                     f"did it run on cuda?\n  {' '.join(cmd)}")
        # comm: what the collectives ran on (--comm nccl); backend is the world's (mpirun's)
        res.update(comm="nccl", dtype=r["dtype"], device_in_use=r["device_peak_bytes"],
                   mfu=r["mfu"]["median"], peak_flops=r["peak_flops"],
                   flops_per_token=r["flops_per_token"])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    ap.add_argument("--preset", default=None,
                    help="gpt2: %s (default small); llama: %s (default tiny)"
                         % (", ".join(PRESETS), ", ".join(LLAMA_PRESETS)))
    ap.add_argument("--seq-len", type=int, default=0, help="default: the preset's context")
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per rank (default 8)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--prefetch", type=int, default=1, help="fsdp's prefetch depth (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS / torch threads per rank")
    ap.add_argument("--repeat", type=int, default=3,
                    help="alternate the two K times and compare medians (default 3): "
                         "load from elsewhere on the machine then hits both alike")
    ap.add_argument("--max-other-load", type=float, default=0.10,
                    help="repeats in which other processes kept more than this share of the "
                         "cores busy are left out of the headline (default 0.10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cpu (default; gloo and fsdp's MPI world) or cuda: one GPU per rank, "
                         "NCCL on both sides, device memory compared")
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16"),
                    help="f32 (default) or bf16 (cuda only): bf16 gathers and compute, fp32 "
                         "master weights, optimizer and gradient reduction on both sides")
    ap.add_argument("--checkpoint", default="none", metavar="{none,all,auto,N}",
                    help="activation checkpointing on both sides, on the same blocks (above; "
                         "default none)")
    ap.add_argument("--memory-budget", type=float, default=0.0, metavar="GIB",
                    help="--checkpoint auto's budget per rank (fsdp-bench --memory-budget; "
                         "default: the device's free memory less 2 GiB, on the CPU none)")
    ap.add_argument("--no-compile", action="store_true",
                    help="cuda: leave out the torch.compile row (it never checkpoints, so at "
                         "1558M on an 80 GB GPU it may not fit, and its failure would end the "
                         "whole comparison)")
    ap.add_argument("--fsdp-bench", default=None, help="path (default build*/fsdp-bench)")
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    ap.add_argument("--json-file", default=None, help="also write that document here")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if args.np < 1 or args.micro_batch < 1 or args.iters < 1 or args.warmup < 0:
        ap.error("--np, --micro-batch and --iters must be at least 1, --warmup at least 0")
    if args.dtype == "bf16" and not cuda:
        ap.error("--dtype bf16 compares GPUs only (--device cuda): on the CPU fsdp gathers bf16 "
                 "but computes in fp32, and PyTorch would compute in bf16")
    presets = MODELS[args.model]
    args.preset = args.preset or ("tiny" if args.model == "llama" else "small")
    if args.preset not in presets:
        ap.error(f"--preset {args.preset}: --model {args.model}'s presets are "
                 f"{', '.join(presets)}")
    layers = presets[args.preset]["n_layer"]
    if args.checkpoint not in ("none", "all", "auto") and not (
            args.checkpoint.isdigit() and int(args.checkpoint) <= layers):
        ap.error(f"--checkpoint {args.checkpoint}: none, all, auto or a number of blocks "
                 f"0 .. {layers} ({args.preset}'s)")
    if args.memory_budget < 0 or (args.memory_budget and args.checkpoint != "auto"):
        ap.error(f"--memory-budget {args.memory_budget}: a positive number of GiB, for "
                 f"--checkpoint auto")
    if args.no_compile and args.device != "cuda":
        ap.error("--no-compile: only --device cuda has a torch.compile row")
    if not 0 <= args.seq_len <= presets[args.preset]["block_size"]:
        ap.error(f"--seq-len {args.seq_len}: the {args.preset} preset's context is "
                 f"{presets[args.preset]['block_size']} positions")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("compare_pytorch: PyTorch is not installed, so there is nothing to compare with.\n"
              "  install it with:  pip install torch   (PyTorch's CPU-only wheels, from its own\n"
              "                    package index, are smaller)\n"
              "  then run again:   python3 bench/compare_pytorch.py --np 2")
        return 0
    if args.model == "llama":
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("compare_pytorch: --model llama builds transformers' LlamaForCausalLM, and "
                  "transformers is not installed:\n  pip install transformers   then run again")
            return 0
    if cuda:
        # device_count() asks NVML / the driver without creating a CUDA context here,
        # so the spawned ranks start clean.
        n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n_gpu == 0:
            sys.exit(f"compare_pytorch: --device cuda: PyTorch sees no CUDA device (torch "
                     f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none: CPU-only'}"
                     f"; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}), "
                     f"so there is no GPU to compare on; run without --device cuda for the CPU "
                     f"comparison")
        if args.np > n_gpu:
            sys.exit(f"compare_pytorch: --device cuda runs one rank per GPU (NCCL, on both sides, "
                     f"needs a GPU of its own for every rank): --np {args.np} but {n_gpu} GPU(s) "
                     f"visible; use --np {n_gpu} or fewer")

    def torch_row(rows, **kw):  # a run that ran out of memory once is not repeated
        oom = next((r for r in rows if "oom" in r), None)
        rows.append(oom or measured(lambda a: run_torch(a, **kw), args))

    runs, compiled, all_runs = [], [], []
    for _ in range(max(args.repeat, 1)):
        f = measured(run_fsdp, args)  # PyTorch checkpoints the blocks fsdp did
        same = [t for _, t in runs]
        torch_row(same, ckpt=f["checkpointed"])
        runs.append((f, same[-1]))
        if args.checkpoint == "auto":  # and, beside it, every block
            torch_row(all_runs, ckpt=layers)
        if cuda and not args.no_compile:  # torch.compile without FSDP, in the same repeat
            torch_row(compiled, compiled=True)
    # Out of GPU memory: with fsdp's blocks checkpointed, FSDP2 is compared with every block
    # checkpointed where --checkpoint auto ran that too; a row that did not fit otherwise
    # (every block, torch.compile) is left out and said.
    oom_of = lambda rows: next((r["oom"] for r in rows if "oom" in r), None)  # noqa: E731
    same_oom, all_oom, compile_oom = oom_of([t for _, t in runs]), oom_of(all_runs), oom_of(compiled)
    if same_oom:
        k = runs[0][0]["checkpointed"]
        if not all_runs or all_oom:
            fits = ("a smaller --micro-batch or --seq-len may fit" if k == layers else
                    "--checkpoint all (or auto, which also runs FSDP2 with every block) or a "
                    "smaller --micro-batch may fit")
            sys.exit(f"compare_pytorch: PyTorch FSDP2 ran out of GPU memory with {k} of {layers} "
                     f"blocks checkpointed: {same_oom}\n  {fits}")
        runs, all_runs = [(f, a) for (f, _), a in zip(runs, all_runs)], []
    if all_oom:
        all_runs = []
    if compile_oom:
        compiled = []
    # Each repeat's ratio pairs two runs made back to back; the headline is the
    # median over the repeats in which other processes kept less than
    # --max-other-load of the cores busy during both runs (all, if none was).
    quiet = [(f, t) for f, t in runs if max(f["other_load"], t["other_load"]) < args.max_other_load]
    used = quiet or runs
    per_run = [f["tokens_per_s"] / t["tokens_per_s"] for f, t in runs]
    speed = median([f["tokens_per_s"] / t["tokens_per_s"] for f, t in used])
    # The run whose tokens/s is the median of its side's, for each side.
    fsdp = sorted((f for f, _ in used), key=lambda r: r["tokens_per_s"])[len(used) // 2]
    pt = sorted((t for _, t in used), key=lambda r: r["tokens_per_s"])[len(used) // 2]
    mem = fsdp["rss_peak"] / pt["rss_peak"]
    growth = (fsdp["rss_peak"] - fsdp["rss_base"]) / max(pt["rss_peak"] - pt["rss_base"], 1)
    cfg = MODELS[args.model][args.preset]
    if cuda:  # GPU memory in use after the timed steps, both sides measured alike
        dev_mem = fsdp["device_in_use"] / max(pt["device_in_use"], 1)
        for f, t in runs:  # PyTorch's MFU against the peak fsdp-bench measured in that repeat
            t["mfu"] = (f["flops_per_token"] * t["tokens_per_s"] / f["peak_flops"]
                        if f["peak_flops"] > 0 else 0.0)
        for (f, _), c in zip(runs, compiled):
            c["mfu"] = (f["flops_per_token"] * c["tokens_per_s"] / f["peak_flops"]
                        if f["peak_flops"] > 0 else 0.0)
        met = speed >= 1.5 and dev_mem < 1.0
    else:
        met = speed >= 1.5 and mem < 1.0
    doc = dict(model=args.model, preset=args.preset, config=cfg, world_size=args.np, micro_batch=args.micro_batch,
               iters=args.iters, dtype=args.dtype, device=args.device, fsdp=fsdp, pytorch_fsdp2=pt,
               tokens_per_s_ratio=speed, rss_peak_ratio=mem, rss_growth_ratio=growth,
               ratio_per_repeat=per_run, quiet_repeats=len(quiet), goal_met=met,
               repeats=[dict(fsdp=f, pytorch_fsdp2=t) for f, t in runs])
    if compiled:
        # fsdp against torch.compile: the same repeats' medians (quiet ones as above)
        pairs = [(f, c) for (f, t), c in zip(runs, compiled) if (f, t) in used]
        comp = sorted((c for _, c in pairs), key=lambda r: r["tokens_per_s"])[len(pairs) // 2]
        speed_compiled = median([f["tokens_per_s"] / c["tokens_per_s"] for f, c in pairs])
        doc.update(pytorch_compile=comp, tokens_per_s_ratio_compile=speed_compiled,
                   compile_repeats=compiled)
    if cuda:
        doc.update(seq_len=args.seq_len or cfg["block_size"], device_in_use_ratio=dev_mem,
                   comm="nccl", one_gpu_per_rank=True,
                   memory_compared="GPU memory in use after the timed steps (cudaMemGetInfo "
                                   "total - free, context included), largest rank: fsdp-bench "
                                   "device_peak_bytes vs torch.cuda.mem_get_info; goal_met uses "
                                   "it", gpu=pt["gpu"])
    if all_runs:  # --checkpoint auto: fsdp against FSDP2 with every block checkpointed
        pairs = [(f, a) for (f, t), a in zip(runs, all_runs) if (f, t) in used]
        pt_all = sorted((a for _, a in pairs), key=lambda r: r["tokens_per_s"])[len(pairs) // 2]
        speed_all = median([f["tokens_per_s"] / a["tokens_per_s"] for f, a in pairs])
        if cuda:
            for (f, _), a in zip(runs, all_runs):
                a["mfu"] = (f["flops_per_token"] * a["tokens_per_s"] / f["peak_flops"]
                            if f["peak_flops"] > 0 else 0.0)
        doc.update(pytorch_fsdp2_all=pt_all, tokens_per_s_ratio_all=speed_all,
                   all_repeats=all_runs)
    doc.update(checkpoint=args.checkpoint, checkpointed=fsdp["checkpointed"], layers=layers,
               pytorch_same_blocks_oom=same_oom, pytorch_all_blocks_oom=all_oom,
               pytorch_compile_oom=compile_oom)
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(doc, f, indent=1)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    if cuda:
        report_cuda(args, cfg, runs, quiet, fsdp, pt, speed, dev_mem, met, same_oom)
        if all_runs:
            report_all(args, fsdp, pt_all, speed_all, cuda)
        elif all_oom:
            print(f"PyTorch FSDP2 with every block checkpointed: out of GPU memory: {all_oom}")
        if compiled:
            report_compiled(args, fsdp, comp, speed_compiled, compiled)
        elif compile_oom:
            print(f"PyTorch torch.compile (no checkpointing): out of GPU memory: {compile_oom}")
        return 0
    mib = 1 / 1048576
    T = args.seq_len or cfg["block_size"]
    print(f"{describe(args, cfg, T)}, {fsdp['params']} parameters | {args.np} ranks "
          f"x {args.micro_batch} sequences | fp32 | AdamW | {args.threads} thread(s) per rank | "
          f"{args.warmup} warm-up + {args.iters} timed steps | {len(runs)} alternating repeats, "
          f"{len(quiet)} quiet (other load < {args.max_other_load:.0%}): "
          f"{'the quiet' if quiet else 'all (none was quiet)'} repeats' median runs shown")
    print(f"{'':22} {'tokens/s':>10} {'step ms':>9} {'RSS peak MiB':>13} {'RSS growth MiB':>15} "
          f"{'loss first->last':>18}")
    for name, r in (("fsdp (zero3, pf %d)" % args.prefetch, fsdp),
                    ("PyTorch FSDP2 " + pt["torch"].split("+")[0], pt)):
        print(f"{name:22} {r['tokens_per_s']:10.0f} {r['step_ms']:9.2f} {r['rss_peak'] * mib:13.1f} "
              f"{(r['rss_peak'] - r['rss_base']) * mib:15.1f} "
              f"{r['loss_first']:8.4f}->{r['loss_last']:.4f}")
    reps = ", ".join(f"{f['tokens_per_s'] / t['tokens_per_s']:.2f}"
                     f"{'' if (f, t) in quiet else '*'}" for f, t in runs)
    print(f"ratio fsdp / PyTorch: tokens/s {speed:.2f}x (median over {'quiet' if quiet else 'all'} "
          f"repeats; each repeat: {reps}; * = other load >= {args.max_other_load:.0%}) | "
          f"RSS peak {mem:.2f}x | RSS growth {growth:.2f}x")
    print("other load per repeat (fsdp / PyTorch): " +
          ", ".join(f"{f['other_load']:.0%}/{t['other_load']:.0%}" for f, t in runs))
    print(f"fsdp step: compute {fsdp['compute_ms']:.2f} ms, communication {fsdp['comm_ms']:.2f} ms "
          f"of which exposed {fsdp['exposed_ms']:.2f} ms | #wrong {fsdp['wrong']:.0f} | "
          f"fsdp backend {fsdp['backend']}, PyTorch on {args.device}")
    if fsdp["params"] != pt["params"]:
        print(f"warning: parameter counts differ: fsdp {fsdp['params']}, PyTorch {pt['params']}")
    print(checkpoint_line(args, fsdp, layers, same_oom))
    if all_runs:
        report_all(args, fsdp, pt_all, speed_all, cuda)
    elif all_oom:
        print(f"PyTorch FSDP2 with every block checkpointed: out of GPU memory: {all_oom}")
    print("goal (>= 1.5x tokens/s at lower peak memory): %s" % ("met" if met else "NOT met"))
    return 0


def checkpoint_line(args, fsdp, layers, same_oom):
    """Which blocks each side recomputed."""
    k = fsdp["checkpointed"]
    if same_oom:
        return (f"activation checkpointing (fsdp-bench --checkpoint auto): fsdp {k} of {layers} "
                f"blocks; PyTorch FSDP2 ran out of GPU memory with those ({same_oom}), so its "
                f"row checkpoints all {layers} (checkpoint_wrapper before fully_shard)")
    prefix = "model.layers." if args.model == "llama" else "h."
    which = "none" if k == 0 else f"{prefix}0" if k == 1 else f"{prefix}0-{prefix}{k - 1}"
    how = ("fsdp-bench --checkpoint auto" + (f" --memory-budget {args.memory_budget}"
                                             if args.memory_budget else "")
           if args.checkpoint == "auto" else f"--checkpoint {args.checkpoint}")
    return (f"activation checkpointing ({how}): {k} of {layers} blocks on both sides ({which}); "
            f"PyTorch: checkpoint_wrapper on those blocks before fully_shard")


def report_all(args, fsdp, pt_all, speed, cuda):
    """--checkpoint auto: the FSDP2 row with every block checkpointed."""
    mib = 1 / 1048576
    name = "FSDP2 ckpt all " + pt_all["torch"].split("+")[0]
    if cuda:
        mfu = f"{pt_all['mfu']:.1%}" if fsdp["peak_flops"] > 0 else "n/a"
        mem = pt_all["device_in_use"] * mib
        print(f"{name:22} {pt_all['tokens_per_s']:10.0f} {pt_all['step_ms']:9.2f} {mfu:>7} "
              f"{mem:15.1f} {pt_all['loss_first']:8.4f}->{pt_all['loss_last']:.4f}")
    else:
        print(f"{name:22} {pt_all['tokens_per_s']:10.0f} {pt_all['step_ms']:9.2f} "
              f"{pt_all['rss_peak'] * mib:13.1f} "
              f"{(pt_all['rss_peak'] - pt_all['rss_base']) * mib:15.1f} "
              f"{pt_all['loss_first']:8.4f}->{pt_all['loss_last']:.4f}")
    print(f"  (PyTorch FSDP2 with every block checkpointed) | ratio fsdp (auto, "
          f"{fsdp['checkpointed']} blocks) / FSDP2 (all): tokens/s {speed:.2f}x")


def report_cuda(args, cfg, runs, quiet, fsdp, pt, speed, dev_mem, met, same_oom):
    """The table for --device cuda: device memory instead of RSS, MFU, and what ran where."""
    mib = 1 / 1048576
    T = args.seq_len or cfg["block_size"]
    dtype = ("bf16 gathers and compute, fp32 master weights, AdamW state and gradient reduction"
             if args.dtype == "bf16" else "fp32 (no TF32)")
    print(f"{describe(args, cfg, T)}, {fsdp['params']} parameters | {args.np} ranks "
          f"x {args.micro_batch} sequences | {dtype} | AdamW | {args.warmup} warm-up + "
          f"{args.iters} timed steps | {len(runs)} alternating repeats, {len(quiet)} quiet (other "
          f"load < {args.max_other_load:.0%}): "
          f"{'the quiet' if quiet else 'all (none was quiet)'} repeats' median runs shown")
    print(f"device: cuda, one GPU per rank: {args.np} x {pt['gpu']} | fsdp: fsdp-bench --device "
          f"cuda --comm nccl --dtype {args.dtype} --reduce-dtype f32 (mpirun world: "
          f"{fsdp['backend']}) | PyTorch FSDP2 {pt['torch'].split('+')[0]}: NCCL {pt['nccl']}, "
          f"CUDA {pt['cuda_runtime']}, mp_policy "
          f"{'param bf16 / reduce fp32' if args.dtype == 'bf16' else 'none (fp32)'}")
    print(f"{'':22} {'tokens/s':>10} {'step ms':>9} {'MFU':>7} {'GPU in use MiB':>15} "
          f"{'loss first->last':>18}")
    for name, r in (("fsdp (zero3, pf %d)" % args.prefetch, fsdp),
                    ("PyTorch FSDP2 " + pt["torch"].split("+")[0], pt)):
        mfu = f"{r['mfu']:.1%}" if fsdp["peak_flops"] > 0 else "n/a"
        print(f"{name:22} {r['tokens_per_s']:10.0f} {r['step_ms']:9.2f} {mfu:>7} "
              f"{r['device_in_use'] * mib:15.1f} {r['loss_first']:8.4f}->{r['loss_last']:.4f}")
    print("GPU in use = cudaMemGetInfo total - free after the timed steps, the largest rank's, "
          "CUDA context and NCCL buffers included, measured alike on both sides")
    print(f"beside it: PyTorch's allocator peak {pt['cuda_peak'] * mib:.1f} MiB allocated, "
          f"{pt['device_reserved_peak'] * mib:.1f} MiB reserved (no context); fsdp's engine "
          f"accounting {fsdp['model_peak'] * mib:.1f} MiB (shards, gathered parameters, gradient "
          f"buffers; no activations) | host RSS peak fsdp {fsdp['rss_peak'] * mib:.1f} MiB, "
          f"PyTorch {pt['rss_peak'] * mib:.1f} MiB")
    if fsdp["peak_flops"] > 0:
        print(f"MFU = {fsdp['flops_per_token']:.4g} model FLOPs/token x tokens/s / "
              f"{fsdp['peak_flops'] / 1e12:.1f} TFLOP/s, the cuBLAS {args.dtype} peak fsdp-bench "
              f"measured on these GPUs (summed over ranks), for both sides")
    reps = ", ".join(f"{f['tokens_per_s'] / t['tokens_per_s']:.2f}"
                     f"{'' if (f, t) in quiet else '*'}" for f, t in runs)
    print(f"ratio fsdp / PyTorch: tokens/s {speed:.2f}x (median over {'quiet' if quiet else 'all'} "
          f"repeats; each repeat: {reps}; * = other load >= {args.max_other_load:.0%}) | "
          f"GPU memory in use {dev_mem:.2f}x")
    print("other load per repeat (fsdp / PyTorch, host CPU): " +
          ", ".join(f"{f['other_load']:.0%}/{t['other_load']:.0%}" for f, t in runs))
    print(f"fsdp step: compute {fsdp['compute_ms']:.2f} ms, communication {fsdp['comm_ms']:.2f} ms "
          f"of which exposed {fsdp['exposed_ms']:.2f} ms | #wrong {fsdp['wrong']:.0f} | "
          f"collectives: fsdp nccl on cuda, PyTorch nccl on cuda")
    if fsdp["params"] != pt["params"]:
        print(f"warning: parameter counts differ: fsdp {fsdp['params']}, PyTorch {pt['params']}")
    print(checkpoint_line(args, fsdp, MODELS[args.model][args.preset]["n_layer"], same_oom))
    print("goal (>= 1.5x tokens/s at lower peak memory; memory = GPU memory in use): %s"
          % ("met" if met else "NOT met"))


def report_compiled(args, fsdp, comp, speed, compiled):
    """The torch.compile row (--device cuda) under the table."""
    mib = 1 / 1048576
    mfu = f"{comp['mfu']:.1%}" if fsdp["peak_flops"] > 0 else "n/a"
    how = "bf16 autocast" if args.dtype == "bf16" else "fp32, no TF32"
    name = "PyTorch compile " + comp["torch"].split("+")[0]
    print(f"{name:22} {comp['tokens_per_s']:10.0f} {comp['step_ms']:9.2f} {mfu:>7} "
          f"{comp['device_in_use'] * mib:15.1f} {comp['loss_first']:8.4f}->{comp['loss_last']:.4f}")
    print(f"  (torch.compile(model), {how}, AdamW(fused=True), no FSDP"
          f"{', DDP over NCCL' if args.np > 1 else ''}: the nanoGPT habit) | ratio fsdp / "
          f"torch.compile: tokens/s {speed:.2f}x | per repeat: "
          + ", ".join(f"{c['tokens_per_s']:.0f}" for c in compiled) + " tokens/s")


if __name__ == "__main__":
    sys.exit(main())
