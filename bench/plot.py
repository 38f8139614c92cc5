#!/usr/bin/env python3
"""bench/plot.py — PNG charts (matplotlib) from fsdp-bench results.

    plot.py SWEEP.json OUTDIR        sweep.sh output ->
        OUTDIR/tokens_per_s.png   tokens/s by strategy and prefetch depth, one panel per
                                  world size, bars at the median, whiskers min-max
        OUTDIR/step_split.png     step time split into compute and exposed communication
                                  (medians), with the communication time beside it
        OUTDIR/memory.png         memory per rank against N: ZeRO-3 as the engine accounts
                                  it and as the formula predicts, NO_SHARD, and 16P/N
    plot.py --trace TRACE.json OUT.png [--steps K]
                                  the first K (default 2) timed steps of a --trace file:
                                  compute, gather and reduce tracks of every rank
"""
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("plot.py: needs matplotlib (pip install matplotlib, or apt-get install "
          "python3-matplotlib)", file=sys.stderr)
    sys.exit(77)

MIB = 1 / 1048576
COLORS = {0: "#9ecae1", 1: "#3182bd", 2: "#08519c"}


def label(run):
    r = run["results"][0]
    return (f"{r['model']} {r['preset']}, micro-batch {r['micro_batch']}/rank, {r['dtype']}, "
            f"{run['iters']} timed steps x {run.get('rounds', 1)} rounds")


def configs(run):
    """(strategy, prefetch) per row; HSDP rows say R x S after the strategy."""
    return [(r["strategy"] + (f" {r['replicas']}x{r['shard_size']}"
                              if r.get("replicas", 1) > 1 and r["strategy"] != "noshard" else ""),
             r["prefetch"]) for r in run["results"]]


def plot_tokens(doc, out):
    runs = doc["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 4), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        res = run["results"]
        x = range(len(res))
        med = [r["tokens_per_s"]["median"] for r in res]
        err = [[m - r["tokens_per_s"]["min"] for m, r in zip(med, res)],
               [r["tokens_per_s"]["max"] - m for m, r in zip(med, res)]]
        bars = ax.bar(x, med, yerr=err, capsize=3,
                      color=[COLORS.get(r["prefetch"], "gray") for r in res])
        for bar, r in zip(bars, res):  # disturbed by other jobs: hatched, load printed
            if r.get("other_load", 0) >= 0.10:
                bar.set_hatch("//")
                ax.annotate(f"load {r['other_load']:.0%}", (bar.get_x() + bar.get_width() / 2, 0),
                            textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7,
                            rotation=90)
        ax.set_xticks(list(x), [f"{s}\npf {d}" if s != "noshard" else s for s, d in configs(run)],
                      fontsize=8)
        ax.set_title(f"N = {run['world_size']}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("tokens/s, all ranks (median, min-max)")
    fig.text(0.01, 0.01, "hatched: other processes kept >= 10% of the cores busy meanwhile",
             fontsize=7)
    fig.suptitle(f"fsdp-bench: {label(runs[0])}\n{doc['machine']['cpu']}, "
                 f"{doc['machine']['cores']} cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_split(doc, out):
    runs = [r for r in doc["runs"] if r["world_size"] > 1]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 4), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        res = run["results"]
        x = list(range(len(res)))
        comp = [r["compute_ms"]["median"] for r in res]
        exp = [r["exposed_comm_ms"]["median"] for r in res]
        comm = [r["comm_ms"]["median"] for r in res]
        ax.bar([i - 0.2 for i in x], comp, 0.4, color="#74c476", label="compute")
        ax.bar([i - 0.2 for i in x], exp, 0.4, bottom=comp, color="#de2d26",
               label="exposed communication")
        ax.bar([i + 0.2 for i in x], comm, 0.4, color="#bdbdbd", label="communication in flight")
        ax.set_xticks(x, [f"{s}\npf {d}" if s != "noshard" else s for s, d in configs(run)],
                      fontsize=8)
        ax.set_title(f"N = {run['world_size']}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("ms per step (medians)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=8, loc="lower center", ncol=3)
    fig.suptitle(f"Step time split: {label(runs[0])}", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(out, dpi=110)


def pick(run, strategy, prefetch=None):
    """The plain (not HSDP) row of strategy at prefetch."""
    for r in run["results"]:
        if (r["strategy"] == strategy and (prefetch is None or r["prefetch"] == prefetch) and
                r.get("replicas", 1) == 1):
            return r
    return None


def plot_memory(doc, out):
    runs = sorted(doc["runs"], key=lambda r: r["world_size"])
    ns = [r["world_size"] for r in runs]
    z3 = [pick(r, "zero3", 1) or pick(r, "zero3") for r in runs]
    ns3 = [n for n, r in zip(ns, z3) if r]
    z3 = [r for r in z3 if r]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.plot(ns3, [r["memory"]["predicted"] * MIB for r in z3], "k--", label="ZeRO-3 prediction")
    ax.plot(ns3, [r["memory"]["model_peak"] * MIB for r in z3], "o-", color="#3182bd",
            label=f"ZeRO-3 measured (pf {z3[0]['prefetch']}): persistent + gathered + grads")
    ax.plot(ns3, [16 * r["params"] / n * MIB for r, n in zip(z3, ns3)], ":", color="gray",
            label="16P/N (sharded states alone)")
    ns0 = [n for n, r in zip(ns, runs) if pick(r, "noshard")]
    if ns0:
        ax.plot(ns0, [pick(r, "noshard")["memory"]["model_peak"] * MIB for r in runs
                      if pick(r, "noshard")], "s-", color="#de2d26", label="NO_SHARD measured")
    for n, r in zip(ns3, z3):
        ax.annotate(f"{r['memory']['model_peak'] * MIB:.2f}", (n, r["memory"]["model_peak"] * MIB),
                    textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xticks(ns)
    ax.set_xlabel("ranks N")
    ax.set_ylabel("MiB per rank (largest rank)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Memory per rank: {label(runs[0])}\n(activations {z3[0]['memory']['activations'] * MIB:.1f}"
                 f" MiB/rank and RSS not included)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_trace(path, out, steps):
    ev = json.load(open(path))["traceEvents"]
    spans = [e for e in ev if e["ph"] == "X"]
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["cat"] == "step" and e["pid"] == 0)
    end = windows[min(steps, len(windows)) - 1][1]
    ranks = sorted({e["pid"] for e in spans})
    colors = {"compute": "#74c476", "acquire": "#de2d26", "release": "#fd8d3c", "gather": "#3182bd",
              "reduce": "#756bb1", "optimizer": "#636363"}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.9 * len(ranks)))
    rows = []
    for r in ranks:
        for tid, name in ((0, "compute"), (1, "gather"), (2, "reduce")):
            y = len(rows)
            rows.append(f"rank {r} {name}")
            for e in spans:
                if e["pid"] != r or e["tid"] != tid or e["cat"] == "step" or e["ts"] > end:
                    continue
                # A root unit encloses the blocks: drawn first and lighter, so
                # its own work (embedding, head, loss) shows at the edges.
                root = e["cat"] == "compute" and "root" in e["name"]
                ax.broken_barh([(e["ts"] / 1e3, max(e["dur"], 1) / 1e3)], (y - 0.4, 0.8),
                               color="#c7e9c0" if root else colors.get(e["cat"], "gray"),
                               zorder=1 if root else 2)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first timed step")
    colors["compute (root unit)"] = "#c7e9c0"
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), ncol=7, fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.25))
    ax.set_title(f"{path}: first {steps} timed steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "--trace":
        steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 2
        plot_trace(args[1], args[2], steps)
        print(f"plot.py: {args[2]}")
        return 0
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    doc = json.load(open(args[0]))
    outs = [f"{args[1]}/{n}.png" for n in ("tokens_per_s", "step_split", "memory")]
    plot_tokens(doc, outs[0])
    plot_split(doc, outs[1])
    plot_memory(doc, outs[2])
    print("plot.py: " + " ".join(outs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
