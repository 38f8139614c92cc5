#!/usr/bin/env python3
"""bench/check_bench.py — runs a bench under mpirun and checks what it printed:
the JSON parses, every configuration and row reports 0 wrong elements, the
memory the engine accounted stays within the ZeRO formula, and a --trace file
is well-formed Chrome trace JSON with properly nested spans on every track.
No timings are asserted: only structure and exact quantities.

    check_bench.py fsdp  MPIRUN NP FSDP_BENCH
    check_bench.py llama MPIRUN NP FSDP_BENCH [FSDP_BENCH ARGS...]
    check_bench.py hsdp  MPIRUN NP FSDP_BENCH
    check_bench.py replica MPIRUN NP FSDP_BENCH
    check_bench.py bytes MPIRUN NP FSDP_BENCH [FSDP_BENCH ARGS...]
    check_bench.py exposed MPIRUN NP FSDP_BENCH [FSDP_BENCH ARGS...]
    check_bench.py trace MPIRUN NP FSDP_BENCH OUT.json
    check_bench.py coll  MPIRUN NP COLL_BENCH [COLL_BENCH ARGS...]
    check_bench.py kernels MPIRUN NP FSDP_BENCH GPU_BUDGET_PY OUT.json [FSDP_BENCH ARGS...]

A run that asked for CUDA exits 77 (skipped) when the bench finds no GPU.
"""
import json
import os
import subprocess
import sys

STATS = ("median", "min", "max", "p10", "p90")


NO_GPU = "no usable CUDA device"


def launch(mpirun, np, argv, timeout=100):
    """Runs under mpirun; stderr is captured (to spot a missing GPU) and always
    passed on, also when the run outlives `timeout` seconds (below meson's limit)."""
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(np)] + argv
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        sys.stderr.write(err or "")
        sys.exit(f"FAIL: {' '.join(cmd)} still running after {timeout} s")
    sys.stderr.write(p.stderr)
    if p.returncode != 0 and NO_GPU in p.stderr:  # said only when cuda was asked for
        if os.environ.get("FSDP_REQUIRE_GPU", "0") not in ("", "0"):
            sys.exit("FAIL: no usable CUDA device, and FSDP_REQUIRE_GPU is set")
        print("SKIP: no usable CUDA device")
        sys.exit(77)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}")
    return p.stdout


def expect(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)


def check_fsdp(mpirun, np, exe):
    out = launch(mpirun, np, [exe, "--json", "--preset", "tiny", "--micro-batch", "2",
                              "-w", "1", "-n", "3", "--rounds", "2", "--peak-size", "128", "--sweep",
                              "--sweep-strategies", "zero3,zero2,noshard", "--sweep-prefetch", "0,1"],
                 timeout=280)
    doc = json.loads(out)
    expect(doc["bench"] == "fsdp-bench" and doc["world_size"] == np and doc["rounds"] == 2,
           "header fields")
    expect(doc["wrong"] == 0, f"{doc['wrong']} wrong elements")
    res = doc["results"]
    expect([(r["strategy"], r["prefetch"]) for r in res] ==
           [("zero3", 0), ("zero3", 1), ("zero2", 0), ("zero2", 1), ("noshard", 0)],
           "one result per strategy x depth (noshard once)")
    for r in res:
        name = f"{r['strategy']}/{r['prefetch']}"
        for key in ("tokens_per_s", "tokens_per_s_per_rank", "step_ms", "compute_ms", "comm_ms",
                    "gather_ms", "reduce_ms", "exposed_comm_ms", "mfu"):
            s = r[key]
            expect(all(k in s for k in STATS), f"{name}: {key} has median and spread")
            expect(s["min"] <= s["p10"] <= s["median"] <= s["p90"] <= s["max"],
                   f"{name}: {key} statistics are ordered")
            expect(s["min"] >= 0, f"{name}: {key} is not negative")
        expect(r["tokens_per_s"]["median"] > 0 and r["step_ms"]["min"] > 0, f"{name}: throughput")
        expect(r["tokens_per_step"] == np * 2 * 64, f"{name}: tokens per step")
        tps = r["tokens_per_s"]["median"] / np
        expect(abs(r["tokens_per_s_per_rank"]["median"] - tps) <= 1e-5 * tps, f"{name}: per rank")
        if r["strategy"] == "noshard" or np == 1:
            expect(r["gather_ms"]["max"] == 0, f"{name}: nothing gathered")
        m = r["memory"]
        shards = 1 if r["strategy"] == "noshard" else np
        ideal = 16 * r["params"] / shards
        pad = 16 * r["units"] * 16 * np / shards  # align 16 elements x N per unit
        expect(ideal <= m["persistent"] <= ideal + pad, f"{name}: persistent {m['persistent']} "
               f"is 16P/N = {ideal} up to padding")
        expect(m["model_peak"] == m["persistent"] + m["gathered_peak"] + m["grads_peak"],
               f"{name}: model peak is the sum of its parts")
        expect(m["model_peak"] <= m["predicted"] + pad, f"{name}: model peak {m['model_peak']} "
               f"within the ZeRO prediction {m['predicted']}")
        expect(m["rss_peak"] >= m["model_peak"], f"{name}: resident memory holds the model")
        expect(r["loss_first"] > 0 and r["wrong"] == 0, f"{name}: loss and check")
        expect(r["other_load"] == -1 or 0 <= r["other_load"] <= 1, f"{name}: other load")
    print(f"fsdp-bench --json at N={np}: {len(res)} configurations, 0 wrong")


def llama_costs(L, NH, NKV, C, F, V, B, T, params, act):
    """Each kernel class's FLOPs and bytes for one step of a Llama (one
    micro-batch), counted from what its kernels read and write, as
    gpu_budget.py counts GPT-2's: the second side of fsdp_llama_kernel_costs."""
    from gpu_budget import causal_tile_area
    N, D = B * T, C // NH
    QKV = (NH + 2 * NKV) * D
    k = {}

    def add(name, flops, nbytes):
        f, b = k.get(name, (0, 0))
        k[name] = (f + flops, b + nbytes)

    for K, M in ((C, QKV), (C, C), (C, 2 * F), (F, C)):  # q|k|v, o, gate|up, down: no bias
        add("block products, forward", L * 2 * N * K * M, L * (N * K + K * M + N * M) * act)
        # dout, weight and input in; d(input) out, d(weight) out in fp32
        add("block products, backward", L * 4 * N * K * M,
            L * ((2 * N * M + K * M + 2 * N * K) * act + 4 * K * M))
    q_area, kv_area = causal_tile_area(T, 64 if D <= 64 else 32, 32)
    score = 2 * D * B * NH * L  # FLOPs per score of one product, every query head
    lse = 4 * B * NH * T
    add("attention forward", 2 * q_area * score, L * (N * (QKV + C) * act + lse))
    # two kernels, each reading q|k|v, dout and out; d(q|k|v) written once
    add("attention backward", (3 * q_area + 4 * kv_area) * score,
        L * ((2 * N * (QKV + 2 * C) + N * QKV) * act + 2 * lse))
    norms = 2 * L + 1
    add("residual + RMSNorm forward", 0, norms * (4 * N * C * act + 4 * N))
    add("RMSNorm backward", 0, norms * (6 * N * C * act + 4 * N))
    add("RoPE forward + backward", 0, L * 4 * N * (NH + NKV) * D * act)
    add("SwiGLU forward + backward", 0, L * 8 * N * F * act)
    add("LM head forward", 2 * N * C * V, (N * C + V * C + N * V) * act)
    add("LM head backward", 4 * N * C * V, (2 * N * V + V * C + 2 * N * C) * act + 4 * V * C)
    add("cross-entropy", 0, 2 * N * V * act + 8 * N)
    add("embedding", 0, 3 * N * C * act + 8 * N * C)  # no position table
    add("AdamW", 0, params * (28 + (2 if act == 2 else 0)))
    add("gradient norm + zeroing", 0, params * (4 + 4))
    return k


def check_llama(mpirun, np, exe, extra):
    """--model llama on the tiny preset: its parameters and units, the FLOPs
    per token of the MFU numerator (embed_tokens untied: a lookup), the
    memory within the ZeRO formula, nothing wrong; --kernel-profile lists the
    Llama's classes (RMSNorm, RoPE, SwiGLU; no LayerNorm), each bracketed,
    with llama_costs' FLOPs and bytes, their FLOPs besides attention's the MFU
    numerator's besides its 12 L T C per token, less the norm weights; on the
    device extra asks for (--device cuda: the result says cuda)."""
    out = launch(mpirun, np, [exe, "--json", "--model", "llama", "--preset", "tiny", "--seq-len",
                              "32", "--micro-batch", "2", "-w", "1", "-n", "2",
                              "--peak-size", "128", "--kernel-profile"] + extra, timeout=280)
    doc = json.loads(out)
    expect(doc["wrong"] == 0, f"{doc['wrong']} wrong elements")
    (r,) = doc["results"]
    device = extra[extra.index("--device") + 1] if "--device" in extra else "cpu"
    expect(r.get("device", "cpu") == device, f"device {r.get('device')}, want {device}")
    # what ran attention (4 query heads over 2 KV heads; f32: the in-house fp32 path), GPU only
    att = r.get("attention", "")
    expect(att.startswith("in-house fp32") if device == "cuda" else att == "",
           f"attention on {device}: {att!r}")
    L, T, C, V = 2, 32, 64, 256
    params = 2 * V * C + L * (2 * C + C * C + 2 * 32 * C + C * C + 3 * 160 * C) + C
    expect(r["model"] == "llama" and r["preset"] == "tiny" and r["seq_len"] == T, "model fields")
    expect(r["params"] == params and r["units"] == L + 1, f"{r['params']} parameters in "
           f"{r['units']} units, want {params} in {L + 1}")
    flops = 6 * (params - V * C) + 12 * L * T * C
    expect(abs(r["flops_per_token"] - flops) <= 1e-6 * flops,
           f"FLOPs per token {r['flops_per_token']}, want {flops}")
    expect(r["tokens_per_step"] == np * 2 * T, "tokens per step")
    m = r["memory"]
    pad = 16 * r["units"] * 16 * np / np
    expect(m["model_peak"] <= m["predicted"] + pad, f"model peak {m['model_peak']} within the "
           f"ZeRO prediction {m['predicted']}")
    expect(m["activations"] > 0 and r["loss_first"] > 0 and r["wrong"] == 0, "loss and check")
    want = llama_costs(L, 4, 2, C, 160, V, 2, T, params, 4)
    ks = {k["class"]: k for k in r["kernels"]}
    expect(len(ks) == len(r["kernels"]) and set(ks) == set(want),
           f"classes: fsdp-bench {sorted(ks)}, want {sorted(want)}")
    close = lambda a, b: abs(a - b) <= 1e-9 * max(1.0, abs(b))
    for name, (f, b) in want.items():
        k = ks[name]
        expect(k["calls_per_step"] > 0 and k["ms_per_step"] > 0,
               f"{name}: {k['calls_per_step']} calls a step: its kernels are not bracketed")
        expect(close(k["flops"], f) and close(k["bytes"], b),
               f"{name}: fsdp_llama_kernel_costs says {k['flops']:.0f} FLOPs, {k['bytes']:.0f} "
               f"bytes; llama_costs {f:.0f}, {b:.0f}")
    N = 2 * T
    classes = sum(k["flops"] for n, k in ks.items() if not n.startswith("attention"))
    expect(close(classes, flops * N - 12 * L * T * C * N - 6 * N * (2 * L * C + C)),
           f"classes' FLOPs {classes:.6g} besides attention's, MFU numerator {flops * N:.6g}")
    print(f"fsdp-bench --model llama on {device} at N={np}: {params} parameters, {flops} "
          f"FLOPs/token, {len(ks)} kernel classes as llama_costs, 0 wrong")


def check_hsdp(mpirun, np, exe):
    """HSDP rows (--sweep-shard-sizes): N/S x S per row, bytes per step by group.
    The replica all-reduce moves what one reduce-scatter moves (1/S of the
    gradient, grad_accum 1), only when there is more than one replica, and the
    shard group's gathers and reductions grow with S (larger shards)."""
    sizes = [s for s in (np, np // 2, 1) if s >= 1 and np % s == 0]
    out = launch(mpirun, np, [exe, "--json", "--preset", "tiny", "--micro-batch", "2",
                              "-w", "1", "-n", "2", "--peak-size", "0", "--sweep",
                              "--sweep-strategies", "zero3", "--sweep-prefetch", "1",
                              "--sweep-shard-sizes", ",".join(map(str, sizes))], timeout=280)
    doc = json.loads(out)
    expect(doc["wrong"] == 0, f"{doc['wrong']} wrong elements")
    res = doc["results"]
    expect([r["shard_size"] for r in res] == sizes, f"one row per shard size {sizes}")
    for r in res:
        s, rep = r["shard_size"], r["replicas"]
        name = f"zero3 {rep}x{s}"
        expect(rep * s == np, f"{name}: replicas x shard size is the world")
        b = r["comm_bytes_per_step"]
        gather, reduce = b["shard_group"]["all_gather"], b["shard_group"]["reduce"]
        replica = b["replica_group"]["all_reduce"]
        if 1 < s < np:
            expect(replica == reduce > 0, f"{name}: replica all-reduce {replica} bytes is the "
                   f"reduce-scatter's {reduce} (1/S of the gradient)")
        else:
            expect(replica == 0, f"{name}: no replica all-reduce")
        if s == 1:
            expect(gather == 0, f"{name}: nothing gathered")
        ideal = 16 * r["params"] / s
        pad = 16 * r["units"] * 16 * s / s
        expect(ideal <= r["memory"]["persistent"] <= ideal + pad,
               f"{name}: persistent {r['memory']['persistent']} is 16P/S = {ideal} + padding")
        print(f"{name}: {r['tokens_per_s']['median']:.0f} tokens/s, shard group "
              f"{gather + reduce:.0f} B/step, replica group {replica:.0f} B/step")
    print(f"fsdp-bench HSDP rows at N={np}: {len(res)} configurations, 0 wrong")


def plan_replica_bytes(exe, model, shard):
    """fsdp-bench --memory-plan's buddy-replica rows for the tiny preset:
    {S: (snapshot bytes, host bytes)}."""
    p = subprocess.run([exe, "--memory-plan", "--model", model, "--preset", "tiny",
                        "--shard-size", str(shard)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    sys.stderr.write(p.stderr)
    expect(p.returncode == 0, f"--memory-plan --model {model} exited {p.returncode}")
    rows = {}
    for line in p.stdout[p.stdout.index("Buddy replicas"):].splitlines():
        f = line.split()
        if len(f) == 5 and f[0] == "tiny":
            rows[int(f[1])] = (int(f[2]), int(f[3]))
    expect(shard in rows, f"--memory-plan lists no replica row for tiny at S={shard}:\n{p.stdout}")
    return rows


def check_replica(mpirun, np, exe):
    """--replica-every: every configuration runs without and then with buddy
    replicas, side by side (the table's rows and the cost line), and the host
    memory the replica allocated on the real run (fsdp_replica_info) is,
    to the byte, what --memory-plan computed for that model and shard size;
    plain FSDP over the world and HSDP with shard groups of 1."""
    for model in ("gpt2", "llama"):
        for shard in sorted({np, 1}):
            plan = plan_replica_bytes(exe, model, shard)
            args = [exe, "--model", model, "--preset", "tiny", "--micro-batch", "1", "-w", "1",
                    "-n", "2", "--peak-size", "0", "--replica-every", "1", "--shard-size",
                    str(shard)]
            doc = json.loads(launch(mpirun, np, args + ["--json"]))
            res = doc["results"]
            expect([r["replica_every"] for r in res] == [0, 1],
                   f"{model} S={shard}: runs without and with replicas, not {res}")
            expect("buddy_replica" not in res[0], "the run without replicas reports none")
            got = res[1]["buddy_replica"]
            want = plan[shard]
            expect((got["snapshot_bytes"], got["host_bytes"]) == want,
                   f"{model} S={shard}: the run's replica holds {got['snapshot_bytes']} B per "
                   f"snapshot, {got['host_bytes']} B in all; --memory-plan said {want}")
            expect(got["host_bytes"] == 4 * got["snapshot_bytes"], "four snapshots")
            print(f"{model} tiny, N={np}, S={shard}: replica host memory {got['host_bytes']} B "
                  f"per rank, as planned; {res[0]['tokens_per_s']['median']:.0f} tokens/s "
                  f"without, {res[1]['tokens_per_s']['median']:.0f} with")
    out = launch(mpirun, np, args)
    rows = [line.split("|")[0].split() for line in out.splitlines() if line.startswith("zero3")]
    expect(rows == [["zero3", "1"], ["zero3", "+r1", "1"]] or
           rows == [["zero3", f"{np}x1", "1"], ["zero3", f"{np}x1", "+r1", "1"]],
           f"the table's rows are not without / with replicas: {rows}\n{out}")
    expect(sum(line.startswith("cost: zero3") and " with, " in line and " without " in line
               for line in out.splitlines()) == 1, f"no cost line:\n{out}")


def check_bytes(mpirun, np, exe, extra):
    """Bytes per step are what the wire carries: the 16-bit runs gather and
    reduce half the f32 run's bytes (the same shards; the f32 copy the CPU
    widens a bf16 gather into is memory, not traffic)."""
    def run(dtype, reduce):
        out = launch(mpirun, np, [exe, "--json", "--preset", "tiny", "--micro-batch", "2",
                                  "-w", "1", "-n", "1", "--peak-size", "0", "--dtype", dtype,
                                  "--reduce-dtype", reduce] + extra, timeout=280)
        doc = json.loads(out)
        expect(doc["wrong"] == 0, f"{dtype}: {doc['wrong']} wrong elements")
        r = doc["results"][0]
        b = r["comm_bytes_per_step"]["shard_group"]
        return r, b["all_gather"], b["reduce"]
    f32, gather32, reduce32 = run("f32", "f32")
    bf16, gather16, reduce16 = run("bf16", "bf16")
    expect(f32["params"] == bf16["params"] and f32["units"] == bf16["units"], "same model")
    if np == 1:
        expect(gather32 == gather16 == reduce32 == reduce16 == 0,
               f"one rank puts nothing on the wire: {gather32, gather16, reduce32, reduce16}")
        print("bytes a step at N=1: none")
        return
    expect(gather32 > 0, f"f32 gathers {gather32} bytes a step")
    expect(2 * gather16 == gather32, f"all-gather bytes a step: bf16 {gather16:.0f}, f32 "
           f"{gather32:.0f}: a bf16 gather carries half the f32 one's bytes")
    expect(reduce32 > 0 and 2 * reduce16 == reduce32, f"reduction bytes a step: bf16 "
           f"{reduce16:.0f}, f32 {reduce32:.0f}: a bf16 reduction carries half")
    print(f"bytes a step at N={np}: all-gather f32 {gather32:.0f}, bf16 {gather16:.0f}; "
          f"reduce f32 {reduce32:.0f}, bf16 {reduce16:.0f}")


def check_exposed(mpirun, np, exe, extra):
    """On CUDA exposed communication is the compute stream's stall in its waits
    for collectives (CUDA events), and a stream stalls on a collective only
    while that collective runs: exposed stays within comm, up to the events'
    jitter (5 % of the step allowed). Timed from the host's waits instead it
    was most of the step (the step's wait for the gradient norm covers the
    whole backward still queued on the GPU): 763 ms of a 1839 ms step against
    2 ms of comm on the simulator, 78 ms against 0.5 ms on an H200."""
    out = launch(mpirun, np, [exe, "--json", "--preset", "tiny", "--micro-batch", "2",
                              "-w", "1", "-n", "3", "--peak-size", "0"] + extra, timeout=280)
    doc = json.loads(out)
    expect(doc["wrong"] == 0, f"{doc['wrong']} wrong elements")
    for r in doc["results"]:
        exposed, comm = r["exposed_comm_ms"]["median"], r["comm_ms"]["median"]
        step = r["step_ms"]["median"]
        expect(0 <= exposed <= comm + 0.05 * step, f"{r['strategy']}: exposed {exposed:.3f} ms "
               f"but comm {comm:.3f} ms of a {step:.3f} ms step: compute cannot wait for "
               "communication longer than it runs")
        print(f"{r['strategy']} at N={np}: step {step:.2f} ms, comm {comm:.2f} ms, exposed "
              f"{exposed:.2f} ms")


def nested(spans):
    """Spans on one track must nest or follow each other (Chrome's rule for X events)."""
    stack = []
    for b, e, name in sorted(spans, key=lambda s: (s[0], -s[1])):
        while stack and stack[-1][1] <= b + 1e-3:
            stack.pop()
        if stack and e > stack[-1][1] + 1e-3:
            return f"{name} [{b}, {e}] overlaps {stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}]"
        stack.append((b, e, name))
    return None


def check_trace(mpirun, np, exe, path):
    launch(mpirun, np, [exe, "--preset", "tiny", "--micro-batch", "2", "-w", "1", "-n", "3",
                        "--peak-size", "0", "--trace", path], timeout=280)
    with open(path) as f:
        doc = json.load(f)  # well-formed JSON or this raises
    ev = doc["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e["ph"] == "M" and e["name"] == "thread_name"}
    for r in range(np):
        expect([names.get((r, t)) for t in range(3)] == ["compute", "gather", "reduce"],
               f"rank {r} names its three tracks")
    tracks = {}
    for e in ev:
        if e["ph"] != "X":
            continue
        expect(0 <= e["pid"] < np and e["tid"] in (0, 1, 2), f"event on a known track: {e}")
        expect(e["ts"] >= 0 and e["dur"] >= 0, f"event times: {e}")
        tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        cat = {0: ("step", "acquire", "release", "compute", "optimizer", "grad_norm"), 1: ("gather",),
               2: ("reduce",)}[e["tid"]]
        expect(e["cat"] in cat, f"{e['cat']} event on track {e['tid']}")
    for r in range(np):
        cats = {e["cat"] for e in ev if e["ph"] == "X" and e["pid"] == r}
        want = {"step", "acquire", "release", "compute", "optimizer", "reduce"}
        want |= {"gather"} if np > 1 else set()
        expect(want <= cats, f"rank {r} has {sorted(want - cats)} missing")
        steps = [e for e in ev if e["ph"] == "X" and e["pid"] == r and e["cat"] == "step"]
        expect(len(steps) == 3, f"rank {r}: one span per timed step")
    for key, spans in tracks.items():
        bad = nested(spans)
        expect(bad is None, f"track {key}: {bad}")
    print(f"trace at N={np}: {sum(len(s) for s in tracks.values())} spans on {len(tracks)} tracks, "
          "well-formed and nested")


def check_coll(mpirun, np, exe, extra):
    out = launch(mpirun, np, [exe, "--json", "-b", "64", "-e", "64K", "-f", "8", "-n", "3",
                              "-w", "1"] + extra)
    doc = json.loads(out)
    expect(doc["bench"] == "coll_bench" and doc["ranks"] == np, "header fields")
    if "--backend" in extra:
        want = extra[extra.index("--backend") + 1]
        expect(doc["backend"] == want, f"backend {doc['backend']}, asked for {want}")
    cuda = "--device" in extra and extra[extra.index("--device") + 1] == "cuda"
    expect(doc["device"].startswith("cuda:") if cuda or doc["backend"] == "nccl"
           else doc["device"] == "cpu", f"buffers on {doc['device']}")
    expect(doc["wrong"] == 0, f"{doc['wrong']} wrong elements")
    rows = doc["rows"]
    for coll in ("all_gather", "reduce_scatter"):
        for inplace in (0, 1):
            sel = [r for r in rows if r["collective"] == coll and r["inplace"] == inplace]
            expect(len(sel) >= 3, f"{coll} inplace={inplace}: a row per size")
            for r in sel:
                expect(r["wrong"] == 0 and r["count"] * 4 == r["size"] and
                       r["size"] % (4 * np) == 0, f"{coll}: size, count, wrong: {r}")
                bus = r["algbw"] * (np - 1) / np
                expect(abs(r["busbw"] - bus) <= 1e-3 + 1e-3 * bus, f"{coll}: busbw formula {r}")
    print(f"coll_bench --json at N={np} over {doc['backend']} on {doc['device']}: "
          f"{len(rows)} rows, 0 wrong")


def check_kernels(mpirun, np, exe, budget, path, extra):
    """--kernel-profile on a tiny GPT-2: the table lists every class of
    fsdp/profile.h once, each timed (calls > 0: its kernels are bracketed),
    with the FLOPs and bytes bench/gpu_budget.py computes for the same shapes
    and dtype; the classes' FLOPs besides attention's (the flash kernel's
    causal tiles) are the MFU numerator's besides its 12 L T C per token of
    attention, minus 6 per token for each bias and LayerNorm parameter (they
    multiply nothing). On CUDA a line after the table says what runs each of
    the four block products (cuBLASLt epilogue or product + pass)."""
    B, T = 2, 32
    out = launch(mpirun, np, [exe, "--preset", "tiny", "--micro-batch", str(B), "--seq-len",
                              str(T), "-w", "1", "-n", "2", "--peak-size", "64",
                              "--kernel-profile", "--json-file", path] + extra, timeout=280)
    doc = json.load(open(path))
    r = doc["results"][0]
    ks, g = r["kernels"], r["gpt2"]
    L, NH, C, V, ctx = g["n_layer"], g["n_head"], g["n_embd"], g["vocab_size"], g["block_size"]
    act = 2 if r.get("device") == "cuda" and r["dtype"] == "bf16" else 4
    p = subprocess.run([sys.executable, budget, "--kernel-classes", "--model",
                        f"{L},{NH},{C},{V},{ctx}", "--batch", str(B * r["grad_accum"]),
                        "--seq-len", str(T), "--act-bytes", str(act)],
                       stdout=subprocess.PIPE, text=True, check=True)
    want = json.loads(p.stdout)
    names = [k["class"] for k in ks]
    expect(len(set(names)) == len(names), f"a class listed twice: {names}")
    expect(set(names) == set(want), f"classes: fsdp-bench {sorted(names)}, gpu_budget.py "
           f"{sorted(want)}")
    close = lambda a, b: abs(a - b) <= 1e-9 * max(1.0, abs(b))
    for k in ks:
        w = want[k["class"]]
        expect(k["calls_per_step"] > 0 and k["ms_per_step"] > 0,
               f"{k['class']}: {k['calls_per_step']} calls, {k['ms_per_step']} ms a step: "
               "its kernels are not bracketed")
        expect(close(k["flops"], w["flops"]) and close(k["bytes"], w["bytes"]),
               f"{k['class']}: fsdp_gpt2_kernel_costs says {k['flops']:.0f} FLOPs, "
               f"{k['bytes']:.0f} bytes; gpu_budget.py ({' + '.join(w['rows'])}) "
               f"{w['flops']:.0f}, {w['bytes']:.0f}")
        expect(k["bound"] in ("compute", "memory"), f"{k['class']}: bound {k['bound']}")
    N = B * T * r["grad_accum"]
    model = r["flops_per_token"] * r["tokens_per_step"] / r["world_size"]
    attn = sum(k["flops"] for k in ks if k["class"].startswith("attention"))
    classes = sum(k["flops"] for k in ks) - attn
    expect(close(classes, model - 12 * L * T * C * N - 6 * N * (13 * L * C + 2 * C)),
           f"classes' FLOPs {classes:.6g} besides attention's (the flash kernel's causal "
           f"tiles, checked above), MFU numerator {model:.6g} besides its 12 L T C per "
           "token: they should differ by the bias and LayerNorm parameters only")
    lines = out.splitlines()
    head = [i for i, l in enumerate(lines) if l.startswith("kernel classes (--kernel-profile")]
    expect(len(head) == 1, "no kernel table (or two) on stdout")
    rows = lines[head[0] + 3:head[0] + 3 + len(ks)]
    for k, line in zip(ks, rows):
        expect(line.startswith(k["class"]) and len(line[30:].split()) == 9,
               f"table row for {k['class']}: {line!r}")
    rest = lines[head[0] + 3 + len(ks):]
    expect(len(rest) >= 3 and rest[0].startswith("all classes") and rest[1].startswith("other")
           and rest[2].startswith("step ") and "MFU" in rest[2], f"table end: {rest[:3]}")
    cuda = r.get("device") == "cuda"
    if cuda:  # what runs each block product, the choice once per shape (bench_products)
        prod = rest[3] if len(rest) > 3 else ""
        expect(prod.startswith("block products: qkv: fwd ")
               and all(f"; {n}: fwd " in prod for n in ("attn proj", "fc", "fc proj"))
               and prod.count(", dinp ") == 4 and prod.count(", dW ") == 4,
               f"no block products line after the table: {prod!r}")
    else:  # the products' choice is the CUDA backend's; the CPU has none to report
        expect(not any(x.startswith("block products:") for x in rest),
               f"a block products line on the CPU: {[x for x in rest if 'products' in x]}")
    print("\n".join(lines[head[0]:head[0] + 6 + len(ks) + cuda]))
    print(f"kernel profile at N={np}: {len(ks)} classes bracketed, FLOPs and bytes as "
          f"gpu_budget.py's, FLOPs against the MFU numerator")


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    what, mpirun, np, exe = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if what == "fsdp":
        check_fsdp(mpirun, np, exe)
    elif what == "llama":
        check_llama(mpirun, np, exe, sys.argv[5:])
    elif what == "hsdp":
        check_hsdp(mpirun, np, exe)
    elif what == "replica":
        check_replica(mpirun, np, exe)
    elif what == "exposed":
        check_exposed(mpirun, np, exe, sys.argv[5:])
    elif what == "bytes":
        check_bytes(mpirun, np, exe, sys.argv[5:])
    elif what == "trace":
        check_trace(mpirun, np, exe, sys.argv[5])
    elif what == "coll":
        check_coll(mpirun, np, exe, sys.argv[5:])
    elif what == "kernels":
        check_kernels(mpirun, np, exe, sys.argv[5], sys.argv[6], sys.argv[7:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
