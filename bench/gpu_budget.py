#!/usr/bin/env python3
"""bench/gpu_budget.py — the per-kernel-class budget of one GPT-2 step on an
H100 (bf16, B x T tokens), computed, not hand-typed: FLOPs and HBM bytes of
every kernel class for the CUDA path before issue 15 and as issue 15 built it, the
roofline time of each (datasheet peaks), an estimate (the roofline divided by
the efficiencies stated below), the sums, and the MFU each implies against a
measured bf16 cuBLAS peak (fsdp-bench's "peak:" line; --measured-tflops).

Usage: bench/gpu_budget.py                 # markdown tables on stdout
       bench/gpu_budget.py --kernel-classes  # per kernel class (fsdp/profile.h), JSON
       bench/gpu_budget.py --compare J       # fsdp-bench --kernel-profile's JSON J beside it
       bench/gpu_budget.py --update FILE   # rewrite FILE's generated block
       bench/gpu_budget.py --check FILE    # exit 1 when FILE's block is stale
       bench/gpu_budget.py --json          # the same numbers as JSON
       bench/gpu_budget.py --summary       # one line per design (gpu-check.sh)
"""
import argparse
import json
import sys

# ---- the device: H100 SXM5 datasheet (dense, no sparsity) -----------------
PEAK_BF16_TC = 989.4e12  # bf16 tensor cores, FLOP/s
PEAK_FP32 = 66.9e12      # fp32 FMA on CUDA cores, FLOP/s
HBM_BW = 3.35e12         # HBM3, bytes/s
SMS = 132

# ---- efficiencies behind the estimate (assumptions, to be replaced by
# gpu-check.sh's per-class measurements) ---------------------------------
EFF = {
    "tc": 0.75,        # large aligned bf16 products: cuBLAS reaches ~75 % of datasheet
    "tc_odd": 0.35,    # V = 50257: odd leading dims keep cuBLAS off aligned tensor-core kernels
    # flash.cu: WMMA (mma.sync class, not Hopper's wgmma), 4-warp blocks of 64 x 32
    # tiles loaded with plain 16-byte copies and a barrier (no cp.async
    # pipelining), S and P staged through shared memory, every fragment reloaded
    # from shared memory: about half of FlashAttention-2's ~30-35 % of the H100's
    # dense bf16 peak (FA2 is register-resident, pipelined and tuned per arch).
    "flash": 0.15,
    "fp32": 0.75,      # cuBLAS sgemm on CUDA cores
    "mem": 0.80,       # 16-byte vector loads and stores, grid over all SMs
    "mem2": 0.50,      # bf16 loaded 2 bytes at a time
    "colsum24": 0.80 * 24 / SMS,  # column sums on 24 blocks of a 132-SM chip
}
LAUNCH_S = 10e-6  # per optimizer launch before issue 15: launch gap plus host wait


PRESETS = {"124M": (12, 12, 768, 50257, 1024), "1558M": (48, 25, 1600, 50257, 1024)}


def dims(model, B, T, act=2):
    """model: a preset's name, or (L, NH, C, V, context); act: bytes of an
    activation element (2: bf16, the GPU's; 4: fp32)."""
    L, NH, C, V, ctx = PRESETS[model] if isinstance(model, str) else model
    Vp = (V + 127) // 128 * 128
    params = V * C + ctx * C + L * (12 * C * C + 13 * C) + 2 * C
    return dict(L=L, NH=NH, C=C, V=V, Vp=Vp, B=B, T=T, N=B * T, hs=C // NH, P=params, a=act)


def linears(d):
    """(K, M) of the four products of a block: qkv, attn proj, fc, fc proj."""
    C = d["C"]
    return [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]


def klass(name, flops, nbytes, unit, eff, launches, note, kc=None):
    """A row; kc: the kernel class (fsdp/profile.h) whose scopes time it,
    default its own name (fsdp-bench --kernel-profile measures per class)."""
    return dict(name=name, flops=flops, bytes=nbytes, unit=unit, eff=eff, launches=launches,
                note=note, kc=kc or name)


def causal_tile_area(T, rows, inner):
    """Scores flash.cu computes per (batch row, head), tile by tile: a warp owns
    16 rows of a block's `rows`-row outer tile and skips each 32-wide inner tile
    wholly past its diagonal. Returns (query-major area: forward and dq; key-major
    area: dk/dv); the exact causal half is T (T + 1) / 2. gpt2_cost.c's
    flash_areas is the same loop."""
    q_area = sum(16 * inner * ((r0 + 15) // inner + 1) for r0 in range(0, T, 16))
    kv_area = sum(16 * inner * len([i0 for i0 in range(k0 // rows * rows, T, inner)
                                    if i0 + inner - 1 >= k0])
                  for k0 in range(0, T, 16))
    return q_area, kv_area


def flash_attention(d):
    """What is built (flash.cu): scores stay on chip; forward two products
    (S = Q K^T, O = P V), backward seven (dk/dv kernel: S^T, dP^T, dV, dK; dq
    kernel: S, dP, dQ) over the tiles a warp does not skip. Bytes: each tensor
    once per kernel (K/V re-reads of a head's blocks in L2); backward reads q,
    k, v, dout and out (for D = rowsum(dout out)) in each of its two kernels and
    writes dq, dk, dv once."""
    L, N, C, NH, T, hs, B = (d[k] for k in ("L", "N", "C", "NH", "T", "hs", "B"))
    bf, lse = d["a"], B * NH * T * 4
    qa, ka = causal_tile_area(T, 64 if hs <= 64 else 32, 32)
    prod = 2 * hs * B * NH * L  # FLOPs per score of one product, all heads and layers
    return [
        klass("attention forward", 2 * qa * prod, L * ((N * 3 * C + N * C) * bf + lse), "tc",
              EFF["flash"], L, "flash (mma.sync), bf16, causal tiles only, fp32 statistics, LSE kept"),
        klass("attention backward", (3 * qa + 4 * ka) * prod, L * (13 * N * C * bf + 2 * lse),
              "tc", EFF["flash"], 2 * L,
              "two kernels (dk/dv, dq), scores recomputed from the LSE, no atomics"),
    ]


def ln_backward(d):
    """One LayerNorm backward (layernorm.cu), d(input) added into: (bytes,
    launches, note). Up to C = 1024 one kernel reads x and dout once, reads
    and writes d(input), reads mean, rstd and the weight, and writes 2 C fp32
    partials a block (16 rows each, at most 128 blocks), which a second kernel
    reads back and adds onto dweight and dbias (read and written). Wider rows
    take two passes: d(input) (dout, x, d(input) read and written), then the
    column sums (dout and x again). gpt2_cost.c's ln_backward_bytes is the
    same count."""
    N, C, bf = d["N"], d["C"], d["a"]
    if C > 1024:
        return (6 * N * C * bf + 8 * N, 3,
                "two passes (C > 1024): d(residual), then weight/bias sums over all SMs")
    blocks = min(128, -(-N // 16))
    return (4 * N * C * bf + 8 * N + C * bf + 16 * C * blocks + 16 * C, 2,
            "one read of x and dout: d(residual) and per-block weight/bias partials")


def built(d):
    L, N, C, V, Vp, NH, T, hs, B = (d[k] for k in ("L", "N", "C", "V", "Vp", "NH", "T", "hs", "B"))
    bf, f4 = d["a"], 4
    lin = linears(d)
    mm_f = L * sum(2 * N * K * M for K, M in lin)
    mm_fb = L * sum((N * K + K * M + N * M) * bf for K, M in lin)
    mm_b = L * sum(4 * N * K * M for K, M in lin)
    mm_bb = L * sum((N * M + K * M + N * K) * bf + (N * K + N * M) * bf + K * M * f4
                    for K, M in lin)
    ln = 2 * L + 1
    ln_bwd = ln_backward(d)
    P = d["P"]
    return [
        klass("block products, forward", mm_f, mm_fb, "tc", EFF["tc"], 4 * L,
              "bf16 cuBLASLt, beta = 0"),
        # blas.cu: the bias, and fc's GELU keeping its input, as the products'
        # cuBLASLt epilogues (BIAS, GELU_AUX_BIAS): the bias read, fc's
        # pre-activation written beside its output, no pass over the output
        klass("bias + GELU epilogue", 0, L * sum(M * bf for _, M in lin) + L * N * 4 * C * bf,
              "mem", EFF["mem"], 0, "cuBLASLt epilogue: + bias, GELU for fc (pre kept)",
              kc="block products, forward"),
        klass("block products, backward", mm_b, mm_bb, "tc", EFF["tc"], 8 * L,
              "d(input) and d(weight), beta = 0: no zeroing pass"),
        # the bias gradient in dweight's product (BGRADA, fp32, into scratch),
        # then one kernel adds it onto dbias: M floats written, read, and
        # dbias read and written
        klass("bias gradients", 0, L * sum(4 * M * 4 for _, M in lin), "mem", EFF["mem"], 4 * L,
              "BGRADA epilogue of dweight, added onto dbias", kc="block products, backward"),
        klass("GELU backward", 0, L * N * 4 * C * bf, "mem", EFF["mem"], 0,
              "DGELU epilogue of fc-proj's d(input): pre read", kc="block products, backward"),
    ] + flash_attention(d) + [
        klass("residual + LayerNorm forward", 0, ln * (4 * N * C * bf + 8 * N), "mem", EFF["mem"],
              ln, "fused: reads x and the branch, writes x' and ln(x')"),
        klass("LayerNorm backward", 0, ln * ln_bwd[0], "mem", EFF["mem"], ln * ln_bwd[1],
              ln_bwd[2]),
        klass("LM head forward", 2 * N * C * V, (N * C + V * C + N * V) * bf, "tc", EFF["tc"],
              2, f"V = {V} columns, rows {Vp} apart, split at {V // 128 * 128} (blas.cu)"),
        klass("LM head backward", 4 * N * C * V,
              (2 * N * V + V * C + 2 * N * C) * bf + V * C * f4, "tc", EFF["tc"], 4,
              "dinp and dwte, each split likewise"),
        klass("cross-entropy (fused)", 0, 2 * N * V * bf + 8 * N, "mem", EFF["mem"], 1,
              "one read, the gradient written over the logits", kc="cross-entropy"),
        klass("embedding", 0, (2 * N * C + T * C) * bf + N * C * bf + 2 * N * C * f4, "mem",
              EFF["mem"], 2, "forward gather, backward scatter-add (fp32)"),
        klass("AdamW", 0, P * (28 + (2 if bf == 2 else 0)), "mem", EFF["mem"], L + 1,
              "multi-tensor, one launch per unit, the bf16 copy written; 30 B/param"),
        klass("gradient norm + zeroing", 0, P * (4 + 4), "mem", EFF["mem"], 2 * (L + 1),
              "the engine's step: fp32 gradient read (sum of squares), then zeroed"),
    ]


def before(d):
    L, N, C, V, NH, T, hs, B = (d[k] for k in ("L", "N", "C", "V", "NH", "T", "hs", "B"))
    bf, f4 = d["a"], 4
    lin = linears(d)
    tt = B * NH * T * T * f4  # one fp32 (B,NH,T,T) pass
    ln = 2 * L + 1
    P = d["P"]
    mm_f = L * sum(2 * N * K * M for K, M in lin)
    mm_fb = L * sum((N * K + K * M + N * M) * bf + 2 * N * M * bf for K, M in lin)  # fill, beta=1
    mm_b = L * sum(4 * N * K * M for K, M in lin)
    mm_bb = L * sum((N * M + K * M + 3 * N * K) * bf + (N * K + N * M) * bf + 3 * K * M * f4
                    for K, M in lin)  # zeroed outputs read back (beta = 1)
    return [
        klass("block products, forward", mm_f, mm_fb, "tc", EFF["tc"], 8 * L,
              "bias filled first, product added with beta = 1"),
        klass("block products, backward", mm_b, mm_bb, "tc", EFF["tc"], 12 * L,
              "zero-then-accumulate outputs"),
        klass("bias gradients", 0, L * sum(N * M * bf for _, M in lin), "mem", EFF["colsum24"],
              4 * L, "column sums on 24 blocks"),
        klass("GELU forward + backward", 0, L * 5 * N * 4 * C * bf, "mem", EFF["mem2"], 2 * L,
              "separate kernels, 2-byte loads"),
        klass("residual forward", 0, 2 * L * 3 * N * C * bf, "mem", EFF["mem2"], 2 * L, ""),
        klass("attention products", L * 12 * B * NH * T * T * hs, L * 5 * tt, "fp32", EFF["fp32"],
              6 * B * L, "fp32 on CUDA cores, full T x T, one call per batch row"),
        klass("attention softmax fwd + bwd", 0, L * 5 * tt, "mem", EFF["mem"], 2 * L,
              "materialised fp32 probabilities"),
        klass("bf16 <-> fp32 attention copies", 0, L * 14 * N * C * (bf + f4), "mem", EFF["mem2"],
              6 * L, "4 BTC elements forward, 10 backward"),
        klass("LayerNorm forward + backward", 0, ln * (2 * N * C * bf + 4 * N * C * bf + 16 * N),
              "mem", EFF["mem2"], 2 * ln, ""),
        klass("LM head forward", 2 * N * C * V, (N * C + V * C + N * V) * bf, "tc", EFF["tc_odd"], 1,
              f"V = {V}: odd leading dims"),
        klass("LM head backward", 4 * N * C * V,
              (2 * N * V + V * C + 2 * N * C) * bf + V * C * f4, "tc", EFF["tc_odd"], 2, ""),
        klass("cross-entropy", 0, 4 * N * V * bf + 8 * N, "mem", EFF["mem2"], 1,
              "logits read three times, a second (BT, V) buffer written"),
        klass("embedding", 0, (2 * N * C + T * C) * bf + N * C * bf + 2 * N * C * f4, "mem",
              EFF["mem2"], 2, ""),
        klass("AdamW", 0, P * 30, "mem", EFF["mem2"], 300, "one launch per tensor piece"),
        klass("gradient norm + zeroing", 0, P * (4 + 4), "mem", EFF["mem2"], 2 * (L + 1),
              "fp32 gradient read (sum of squares), then zeroed"),
    ]


def peak_of(unit):
    return {"tc": PEAK_BF16_TC, "fp32": PEAK_FP32}.get(unit, PEAK_BF16_TC)


def timed(k, launch_cost):
    t_c = k["flops"] / peak_of(k["unit"])
    t_m = k["bytes"] / HBM_BW
    roof = max(t_c, t_m)
    bound = "compute" if t_c >= t_m else "memory"
    est = roof / k["eff"] + launch_cost * k["launches"]
    return dict(k, roof_s=roof, est_s=est, bound=bound)


def model_flops(d):
    """fsdp-bench's MFU numerator: (6 (P - wpe) + 12 L T C) x tokens."""
    return (6 * (d["P"] - d["T"] * d["C"]) + 12 * d["L"] * d["T"] * d["C"]) * d["N"]


def budget(model, B, T, measured, act=2):
    d = dims(model, B, T, act)
    out = {"dims": d, "model_flops": model_flops(d), "measured_peak": measured}
    designs = (("before", before, LAUNCH_S), ("built", built, 0.0))
    for name, fn, launch in designs:
        ks = [timed(k, launch if k["name"] == "AdamW" else 0.0) for k in fn(d)]
        roof = sum(k["roof_s"] for k in ks)
        est = sum(k["est_s"] for k in ks)
        out[name] = dict(kernels=ks, roof_s=roof, est_s=est,
                         mfu=out["model_flops"] / est / measured)
    return out


def fmt_table(b, name):
    r = b[name]
    lines = ["| kernel class | GFLOP | GB moved | bound | roofline ms | eff. | estimate ms | note |",
             "|---|---:|---:|---|---:|---:|---:|---|"]
    for k in r["kernels"]:
        lines.append(f"| {k['name']} | {k['flops'] / 1e9:.0f} | {k['bytes'] / 1e9:.2f} | "
                     f"{k['bound']} | {k['roof_s'] * 1e3:.2f} | {k['eff']:.2f} | "
                     f"{k['est_s'] * 1e3:.2f} | {k['note']} |")
    lines.append(f"| **sum** | {sum(k['flops'] for k in r['kernels']) / 1e9:.0f} | "
                 f"{sum(k['bytes'] for k in r['kernels']) / 1e9:.2f} | | "
                 f"**{r['roof_s'] * 1e3:.1f}** | | **{r['est_s'] * 1e3:.1f}** | "
                 f"MFU {r['mfu'] * 100:.0f} % of {b['measured_peak'] / 1e12:.0f} TF/s |")
    return "\n".join(lines)


def markdown(b):
    d = b["dims"]
    mf = b["model_flops"]
    target_s = 0.040
    meas = b["measured_peak"]
    return "\n".join([
        f"GPT-2 124M: L = {d['L']}, C = {d['C']}, NH = {d['NH']}, V = {d['V']} (padded "
        f"{d['Vp']}), P = {d['P'] / 1e6:.1f} M; one step = {d['B']} x {d['T']} = {d['N']} "
        f"tokens, bf16, one GPU.",
        "",
        f"Peaks (H100 SXM5 datasheet, dense): bf16 tensor cores {PEAK_BF16_TC / 1e12:.1f} TF/s, "
        f"fp32 CUDA cores {PEAK_FP32 / 1e12:.1f} TF/s, HBM3 {HBM_BW / 1e12:.2f} TB/s. "
        f"Roofline of a class = max(FLOPs / peak, bytes / bandwidth); estimate = roofline / "
        f"efficiency (+ {LAUNCH_S * 1e6:.0f} us per launch for the optimizer before issue 15).",
        "",
        f"Model FLOPs per step (fsdp-bench's MFU numerator, (6 (P - wpe) + 12 L T C) x tokens): "
        f"{mf / 1e12:.2f} TFLOP. MFU below is against a measured bf16 cuBLAS peak of "
        f"{meas / 1e12:.0f} TF/s (a placeholder until gpu-check.sh's fsdp-bench prints the "
        f"real one; rerun with --measured-tflops).",
        "",
        f"**Target: <= {target_s * 1e3:.0f} ms per step**, i.e. >= {mf / target_s / 1e12:.0f} "
        f"TF/s of model FLOPs = {mf / target_s / meas * 100:.0f} % MFU of {meas / 1e12:.0f} "
        f"TF/s; 40 % MFU of the measured peak is {mf / (0.4 * meas) * 1e3:.1f} ms. The gate "
        f"is the stricter of the two.",
        "",
        "### Before issue 15 (the CUDA path the review costed)",
        "",
        fmt_table(b, "before"),
        "",
        "### Issue 15 as built (attention: the fused flash kernel, flash.cu)",
        "",
        fmt_table(b, "built"),
    ])


def kernel_classes(b, name="built"):
    """Per kernel class (fsdp/profile.h): the rows it times, summed; what
    fsdp_gpt2_kernel_costs must equal (the kernel-profile test)."""
    out = {}
    for k in b[name]["kernels"]:
        c = out.setdefault(k["kc"], dict(flops=0, bytes=0, roof_s=0.0, est_s=0.0, rows=[]))
        for f in ("flops", "bytes", "roof_s", "est_s"):
            c[f] += k[f]
        c["rows"].append(k["name"])
    return out


def compare(b, path):
    """fsdp-bench --kernel-profile --json's measured classes next to the
    budget's estimate of each (design "built")."""
    doc = json.load(open(path))
    r = doc.get("results", [doc])[0]
    ks = r.get("kernels")
    if not ks:
        print(f"gpu_budget: {path} has no kernel table (run fsdp-bench with --kernel-profile)",
              file=sys.stderr)
        return 1
    new = kernel_classes(b, "built")
    print(f"{'kernel class':<30} {'measured ms':>11} {'budget ms':>9} "
          f"{'roofline ms':>11} {'of roofline':>11}")
    for k in ks:
        n = new.get(k["class"])
        ms = k["ms_per_step"]
        roof = n["roof_s"] * 1e3 if n else 0.0
        print(f"{k['class']:<30} {ms:11.2f} {n['est_s'] * 1e3 if n else float('nan'):9.2f} "
              f"{roof:11.2f} {(roof / ms * 100 if ms > 0 else 0):10.0f}%")
    step = r["step_ms"]["median"] if isinstance(r.get("step_ms"), dict) else r.get("step_ms", 0)
    print(f"{'step (measured)':<30} {step:11.2f} {b['built']['est_s'] * 1e3:9.2f} "
          f"{b['built']['roof_s'] * 1e3:11.2f}")
    return 0


BEGIN, END = "<!-- gpu_budget.py: begin -->", "<!-- gpu_budget.py: end -->"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured-tflops", type=float, default=750.0,
                    help="fsdp-bench's measured bf16 cuBLAS peak (default 750, a placeholder)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--model", default="124M",
                    help="124M, 1558M, or L,NH,C,V,context (e.g. a test's tiny GPT-2)")
    ap.add_argument("--act-bytes", type=int, default=2, choices=(2, 4),
                    help="bytes of an activation element: 2 (bf16, default) or 4 (fp32)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--kernel-classes", action="store_true",
                   help="per kernel class of fsdp/profile.h: FLOPs, bytes, estimate (JSON)")
    g.add_argument("--compare", metavar="BENCH_JSON",
                   help="fsdp-bench --kernel-profile --json-file's classes next to the budget")
    g.add_argument("--update", metavar="FILE")
    g.add_argument("--check", metavar="FILE")
    g.add_argument("--json", action="store_true")
    g.add_argument("--summary", action="store_true")
    a = ap.parse_args()
    if a.measured_tflops <= 0:
        ap.error(f"--measured-tflops {a.measured_tflops}: a peak must be positive")
    model = a.model if a.model in PRESETS else tuple(int(x) for x in a.model.split(","))
    b = budget(model, a.batch, a.seq_len, a.measured_tflops * 1e12, a.act_bytes)
    if a.kernel_classes:
        json.dump(kernel_classes(b), sys.stdout, indent=1)
        return 0
    if a.compare:
        return compare(b, a.compare)
    if a.json:
        json.dump(b, sys.stdout, indent=1)
        return 0
    if a.summary:
        for name in ("before", "built"):
            r = b[name]
            print(f"budget ({name}): estimate {r['est_s'] * 1e3:.1f} ms per step, roofline "
                  f"{r['roof_s'] * 1e3:.1f} ms, MFU {r['mfu'] * 100:.0f} % of "
                  f"{a.measured_tflops:.0f} TF/s; target <= 40 ms (bench/gpu-budget.md)")
        return 0
    block = f"{BEGIN}\n{markdown(b)}\n{END}"
    path = a.update or a.check
    if not path:
        print(markdown(b))
        return 0
    text = open(path).read()
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < 0:
        print(f"gpu_budget: {path} has no '{BEGIN}' ... '{END}' block", file=sys.stderr)
        return 1
    new = text[:i] + block + text[j + len(END):]
    if a.check:
        if new != text:
            print(f"gpu_budget: {path} is stale: run bench/gpu_budget.py --update {path}",
                  file=sys.stderr)
            return 1
        print(f"gpu_budget: {path} matches")
        return 0
    open(path, "w").write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
