#!/usr/bin/env python3
"""tests/launch/launch_test.py — the launch suite's end-to-end scenarios.

One scenario per run (meson registers each): training parity between
fsdp-run and mpirun, a rank killed mid-step, a rank that stops calling
collectives, each desync case, bad env:// launches, restarts from a
checkpoint, and signals to the launcher. Every run carries a unique
FSDP_TEST_TAG in its environment; "no orphans" means no live process (zombies
left to a non-reaping init do not count) still carries it once the launcher is
gone. Waits are deadlines on process exit or on the process table, never
sleeps standing in for a condition.

usage: launch_test.py SCENARIO --build DIR [--mpirun PATH]
"""
import argparse
import gzip
import json
import os
import random
import re
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid

TEARDOWN_S = 30.0  # every process must be gone within 30 s of a failure
SKIP = 77


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


# ---- processes --------------------------------------------------------------

def tagged_processes(tag):
    """Live processes whose environment holds FSDP_TEST_TAG=tag."""
    found, needle = [], ("FSDP_TEST_TAG=" + tag).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if state not in (b"Z", b"X") and needle in env.split(b"\0"):
            found.append((int(pid), cmd.strip()))
    return found


def wait_no_orphans(tag, deadline):
    """Polls the process table until nothing carries the tag; the leftovers
    (killed, so that one failure does not leak into the next test) when the
    deadline passes."""
    while True:
        left = tagged_processes(tag)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


class Runner:
    def __init__(self, args):
        self.a = args
        self.tmp = tempfile.mkdtemp(prefix="fsdp-launch-")
        self.base_env = dict(os.environ, OPENBLAS_NUM_THREADS="1", FSDP_LOG_LEVEL="error",
                             OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                             OMPI_MCA_btl="self,vader", OMPI_MCA_mpi_yield_when_idle="1",
                             OMPI_MCA_rmaps_base_oversubscribe="1")
        for k in ("FSDP_FAULT", "FSDP_TIMEOUT_S", "FSDP_DESYNC_CHECK", "MASTER_ADDR",
                  "MASTER_PORT", "RANK", "WORLD_SIZE"):
            self.base_env.pop(k, None)

    def tool(self, name):
        return os.path.join(self.a.build, name)

    def launcher(self, kind, n):
        if kind == "fsdp-run":
            return [self.tool("fsdp-run"), "--nproc-per-node", str(n), "--master-port", "0"]
        if not self.a.mpirun:
            raise SystemExit(SKIP)
        return [self.a.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(n)]

    def run(self, cmd, extra_env=None, timeout=120):
        """Runs cmd to completion; (rc, stdout, stderr, seconds, leftovers)."""
        tag = uuid.uuid4().hex
        env = dict(self.base_env, FSDP_TEST_TAG=tag, **(extra_env or {}))
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=self.tmp)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise Failure(f"{cmd[0]} still running after {timeout} s:\n{err[-3000:]}")
        secs = time.monotonic() - t0
        left = wait_no_orphans(tag, t0 + TEARDOWN_S)
        return p.returncode, out, err, secs, left


# ---- data ---------------------------------------------------------------------

def write_text(path):
    rng = random.Random(7)
    words = ("the quick brown fox jumps over a lazy dog while seven small birds sing of "
             "rivers and stones under an old grey bridge").split()
    with open(path, "w") as f:
        for _ in range(3000):
            f.write(" ".join(rng.choice(words) for _ in range(11)) + ".\n")


def write_idx(directory, split, n, seed):
    """A tiny Fashion-MNIST-shaped set: 28x28 images whose bright column band
    depends on the label, so the MLP has something to learn."""
    rng = random.Random(seed)
    labels = bytes(rng.randrange(10) for _ in range(n))
    pixels = bytearray()
    for y in labels:
        for r in range(28):
            for c in range(28):
                band = 2 + 2 * y <= c < 5 + 2 * y
                pixels.append(min(255, (180 if band else 20) + rng.randrange(60)))
    with gzip.open(os.path.join(directory, f"{split}-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(pixels))
    with gzip.open(os.path.join(directory, f"{split}-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + labels)


def events(stdout, kind):
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            if e.get("event") == kind:
                out.append(e)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- scenarios ----------------------------------------------------------------

# Only the transport differs between the launchers: gloo's ring sums in another
# order than Open MPI, so losses agree to fp32 rounding (measured below 1e-6
# relative). 1e-5 is well above that noise and far below any real divergence.
LOSS_RTOL = 1e-5
# Final weights after the same run: reduction order moves an update by an fp32
# ulp or so; Adam's normalisation can amplify that for weights whose gradient
# is near zero, so the bound is absolute (weights are O(0.1)).
WEIGHT_ATOL = 1e-4


def train_args(r, model):
    if model == "gpt2":
        text = os.path.join(r.tmp, "text.txt")
        write_text(text)
        return ["--model", "gpt2", "--preset", "tiny", "--data", text, "--steps", "10",
                "--global-batch", "8", "--eval-every", "5", "--json"]
    data = os.path.join(r.tmp, "idx")
    os.makedirs(data, exist_ok=True)
    write_idx(data, "train", 1024, 1)
    write_idx(data, "t10k", 256, 2)
    return ["--model", "mlp", "--data", data, "--epochs", "1", "--hidden", "64,32",
            "--global-batch", "64", "--log-every", "1", "--json"]


def safetensors(path):
    """{name: list of floats} of an f32 safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name != "__metadata__" and t["dtype"] == "F32":
            lo, hi = t["data_offsets"]
            out[name] = struct.unpack(f"<{(hi - lo) // 4}f", data[lo:hi])
    return out


def parity(r, model):
    args = [r.tool("fsdp-train")] + train_args(r, model)
    runs, weights = {}, {}
    for kind in ("fsdp-run", "mpirun"):
        save = os.path.join(r.tmp, "final-" + kind)
        rc, out, err, secs, left = r.run(r.launcher(kind, 4) + args + ["--save-dir", save])
        check(rc == 0, f"{kind}: fsdp-train failed ({rc}):\n{err[-3000:]}")
        check(not left, f"{kind}: leftover processes {left}")
        runs[kind] = ([e["loss"] for e in events(out, "step")] +
                      [e["loss"] for e in events(out, "eval")])
        st = save + ".safetensors"
        ck = subprocess.run([r.tool("fsdp-ckpt"), "export" if model == "gpt2" else "consolidate",
                             save, st], capture_output=True, text=True)
        check(ck.returncode == 0, f"fsdp-ckpt {save}: {ck.stderr}")
        weights[kind] = safetensors(st)
        print(f"{model} under {kind}: {len(runs[kind])} losses in {secs:.1f} s")
    a, b = runs["fsdp-run"], runs["mpirun"]
    check(len(a) == len(b) and a, f"different numbers of losses: {len(a)} vs {len(b)}")
    worst = max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))
    print(f"{model}: first loss {a[0]:.6f} vs {b[0]:.6f}, last {a[-1]:.6f} vs {b[-1]:.6f}, "
          f"largest relative difference {worst:.2e} (tolerance {LOSS_RTOL:.0e}; the JSON "
          f"carries 6 decimals)")
    check(worst <= LOSS_RTOL, f"losses differ by {worst:.2e} > {LOSS_RTOL:.0e}: {a} vs {b}")
    wa, wb = weights["fsdp-run"], weights["mpirun"]
    check(wa.keys() == wb.keys() and wa, "the checkpoints hold different tensors")
    n = sum(len(v) for v in wa.values())
    diff = max(abs(x - y) for k in wa for x, y in zip(wa[k], wb[k]))
    scale = max(abs(y) for v in wb.values() for y in v)
    differ = sum(x != y for k in wa for x, y in zip(wa[k], wb[k]))
    print(f"{model}: final weights, {n} values: {differ} differ, largest difference {diff:.2e} "
          f"(largest weight {scale:.2f}; tolerance {WEIGHT_ATOL:.0e})")
    check(diff <= WEIGHT_ATOL, f"final weights differ by {diff:.2e} > {WEIGHT_ATOL:.0e}")


def two_nodes(r, args, timeout=180):
    """fsdp-run twice on this machine, as node 0 and node 1 of --nnodes 2 with
    two ranks each, meeting at one master address and port: (rc0, rc1, out0,
    err0 + err1, seconds, leftovers)."""
    port, tag = free_port(), uuid.uuid4().hex
    env = dict(r.base_env, FSDP_TEST_TAG=tag)
    t0 = time.monotonic()
    procs = [subprocess.Popen([r.tool("fsdp-run"), "--nproc-per-node", "2", "--nnodes", "2",
                               "--node-rank", str(k), "--master-addr", "127.0.0.1",
                               "--master-port", str(port), "--rdzv-id", tag] + args,
                              env=env, cwd=r.tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in (0, 1)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, t0 + timeout - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise Failure(f"fsdp-run --nnodes 2 still running after {timeout} s")
    secs = time.monotonic() - t0
    left = wait_no_orphans(tag, t0 + TEARDOWN_S)
    return (procs[0].returncode, procs[1].returncode, outs[0][0], outs[0][1] + outs[1][1],
            secs, left)


def hsdp_nnodes(r):
    """HSDP over two "nodes": shard within each node's 2 ranks (--shard-size =
    the local world size), replicate across the nodes. The same training under
    mpirun -np 4 --shard-size 2 gives the same losses and weights, and plain
    FSDP over the 4 ranks the same losses up to summation order."""
    args = [r.tool("fsdp-train")] + train_args(r, "gpt2") + ["--shard-size", "2"]
    runs, weights = {}, {}
    for kind in ("fsdp-run", "mpirun"):
        save = os.path.join(r.tmp, "hsdp-" + kind)
        if kind == "fsdp-run":
            rc0, rc1, out, err, secs, left = two_nodes(r, args + ["--save-dir", save])
            check(rc0 == 0 and rc1 == 0, f"fsdp-run --nnodes 2: exit {rc0}, {rc1}:\n{err[-3000:]}")
        else:
            rc, out, err, secs, left = r.run(r.launcher(kind, 4) + args + ["--save-dir", save])
            check(rc == 0, f"mpirun: fsdp-train failed ({rc}):\n{err[-3000:]}")
        check(not left, f"{kind}: leftover processes {left}")
        runs[kind] = ([e["loss"] for e in events(out, "step")] +
                      [e["loss"] for e in events(out, "eval")])
        st = save + ".safetensors"
        ck = subprocess.run([r.tool("fsdp-ckpt"), "export", save, st], capture_output=True,
                            text=True)
        check(ck.returncode == 0, f"fsdp-ckpt {save}: {ck.stderr}")
        weights[kind] = safetensors(st)
        print(f"hsdp 2 x 2 under {kind}{' --nnodes 2' if kind == 'fsdp-run' else ''}: "
              f"{len(runs[kind])} losses in {secs:.1f} s")
    rc, out, err, secs, left = r.run(r.launcher("mpirun", 4) + args[:-2])
    check(rc == 0 and not left, f"mpirun without --shard-size: exit {rc}, leftovers {left}")
    plain = [e["loss"] for e in events(out, "step")] + [e["loss"] for e in events(out, "eval")]
    a, b = runs["fsdp-run"], runs["mpirun"]
    check(len(a) == len(b) == len(plain) and a,
          f"different numbers of losses: {len(a)}, {len(b)}, {len(plain)}")
    flat = max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(b, plain))
    print(f"hsdp 2 x 2 vs plain FSDP over 4 ranks: largest relative loss difference {flat:.2e}")
    check(flat <= LOSS_RTOL, f"HSDP losses differ from plain FSDP's by {flat:.2e}: {b} vs {plain}")
    worst = max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))
    print(f"hsdp: first loss {a[0]:.6f} vs {b[0]:.6f}, last {a[-1]:.6f} vs {b[-1]:.6f}, largest "
          f"relative difference {worst:.2e} (tolerance {LOSS_RTOL:.0e})")
    check(worst <= LOSS_RTOL, f"losses differ by {worst:.2e} > {LOSS_RTOL:.0e}: {a} vs {b}")
    wa, wb = weights["fsdp-run"], weights["mpirun"]
    check(wa.keys() == wb.keys() and wa, "the checkpoints hold different tensors")
    diff = max(abs(x - y) for k in wa for x, y in zip(wa[k], wb[k]))
    print(f"hsdp: final weights differ by at most {diff:.2e} (tolerance {WEIGHT_ATOL:.0e})")
    check(diff <= WEIGHT_ATOL, f"final weights differ by {diff:.2e} > {WEIGHT_ATOL:.0e}")


def killed(r, kind):
    args = [r.tool("fsdp-train")] + train_args(r, "gpt2")
    rc, out, err, secs, left = r.run(r.launcher(kind, 4) + args,
                                     {"FSDP_FAULT": "kill:rank=1:step=3"})
    print(f"{kind}: exit {rc} after {secs:.1f} s; leftovers {left}")
    check(rc != 0, f"{kind} exited 0 although rank 1 was killed")
    check(secs <= TEARDOWN_S, f"{kind} took {secs:.1f} s > {TEARDOWN_S} s to exit")
    check(not left, f"processes left behind: {left}")
    if kind == "fsdp-run":
        check(re.search(r"root cause: rank 1 .*killed by signal 9 \(SIGKILL\)", err),
              f"no root-cause report naming rank 1:\n{err[-3000:]}")
    else:
        check(re.search(r"rank 1 .*signal 9", err), f"mpirun did not name rank 1:\n{err[-3000:]}")
    print(next(l for l in err.splitlines() if "rank 1" in l and "signal 9" in l))


def epipe(r):
    """A write to a peer that died fails with EPIPE in a rank of a gloo world
    instead of killing it by SIGPIPE (Gloo writes with writev; before, such a
    rank died silently and fsdp-run could name it the root cause of a
    kill: CI's kill-fsdp-run blamed rank 0, killed by SIGPIPE, for rank 1's
    SIGKILL)."""
    cmd = r.launcher("fsdp-run", 2) + [r.tool("tests/launch/launch_probe"), "epipe"]
    rc, out, err, secs, left = r.run(cmd, {}, timeout=60)
    print(f"epipe under fsdp-run: exit {rc} after {secs:.1f} s; leftovers {left}")
    check(rc == 0 and not left, f"rc {rc}, leftovers {left}:\n{err[-3000:]}")
    lines = re.findall(r"probe: rank \d: a write to a closed socket failed with EPIPE", err)
    check(len(lines) == 2, f"not every rank saw EPIPE:\n{err[-3000:]}")
    print(lines[0])


def sigpipe_root_cause(r):
    """Rank 0 dies of SIGPIPE first, rank 1 of SIGKILL after: fsdp-run names
    rank 1 (a death by SIGPIPE follows from a peer's; before, the earlier
    death was the root cause)."""
    cmd = r.launcher("fsdp-run", 2) + [r.tool("tests/launch/launch_probe"), "sigpipe", "1"]
    rc, out, err, secs, left = r.run(cmd, {}, timeout=60)
    print(f"sigpipe under fsdp-run: exit {rc} after {secs:.1f} s; leftovers {left}")
    check(rc != 0 and secs <= TEARDOWN_S and not left, f"rc {rc}, {secs:.1f} s, {left}")
    check(re.search(r"root cause: rank 1 .*killed by signal 9 \(SIGKILL\)", err),
          f"the root cause is not rank 1's SIGKILL:\n{err[-3000:]}")
    check(re.search(r"rank 0 .*killed by signal 13 \(SIGPIPE\)", err),
          f"rank 0's SIGPIPE is not reported:\n{err[-3000:]}")
    print(re.search(r"fsdp-run:   root cause: .*", err).group(0))


def stalled(r, kind):
    cmd = r.launcher(kind, 4) + [r.tool("tests/launch/launch_probe"), "stall", "1", "3"]
    rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": "2"})
    print(f"{kind}: exit {rc} after {secs:.1f} s (timeout 2 s); leftovers {left}")
    check(rc != 0 and secs <= TEARDOWN_S and not left, f"rc {rc}, {secs:.1f} s, {left}")
    reports = [l for l in err.splitlines() if "watchdog: all_reduce #4 for 'probe-loop'" in l]
    for line in reports[:1]:
        print(line)
    if kind == "fsdp-run":  # the first report ends the run; later ranks may be stopped first,
        # or fire after the first has gone with the store they ask (saying so)
        check(any("rank 1 never issued it" in l for l in reports) and
              all("rank 1 never issued it" in l or "published no progress" in l for l in reports),
              f"no report naming rank 1 missing:\n{err[-3000:]}")
    else:  # no store under mpirun: the operation and its number, then MPI_Abort
        # Our report must say it aborts; Open MPI's own "MPI_ABORT was invoked"
        # banner is sometimes lost when several ranks abort at once (its
        # show_help unpack error), so it is not required.
        check(reports and all("aborting the job (MPI_Abort)" in l for l in reports),
              f"no timeout report:\n{err[-3000:]}")


def stalled_group(r):
    """Rank 3 stops inside group 1 of a split (ranks 2-3): rank 2's watchdog
    names the group and rank 3 alone, never the other group's ranks."""
    cmd = r.launcher("fsdp-run", 4) + [r.tool("tests/launch/launch_probe"), "stall-group", "3", "3"]
    rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": "2"})
    print(f"fsdp-run: exit {rc} after {secs:.1f} s (timeout 2 s); leftovers {left}")
    check(rc != 0 and secs <= TEARDOWN_S and not left, f"rc {rc}, {secs:.1f} s, {left}")
    reports = [l for l in err.splitlines()
               if l.startswith("[rank") and "watchdog: all_reduce #4 for 'probe-loop'" in l]
    check(reports, f"no timeout report:\n{err[-3000:]}")
    print(reports[0])
    check(all(re.search(r"on communicator \d+ \(group 1 of communicator \d+: world ranks "
                        r"2-3\) did not complete", l) and l.startswith("[rank 2]") and
              "; rank 3 never issued it;" in l and "rank 0" not in l and "rank 1" not in l
              for l in reports), f"a report does not name the group and rank 3 alone:\n"
          f"{err[-3000:]}")


def escalated(r):
    """A worker that ignores SIGTERM gets SIGKILL once --grace has passed."""
    cmd = r.launcher("fsdp-run", 4) + ["--grace", "1", r.tool("tests/launch/launch_probe"),
                                       "stall", "1", "3"]
    rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": "1", "PROBE_IGNORE_SIGTERM": "1"})
    print(f"fsdp-run --grace 1: exit {rc} after {secs:.1f} s; leftovers {left}")
    check(rc != 0 and not left, f"rc {rc}, leftovers {left}")
    line = re.search(r"rank 1 \(local rank 1.*was stopped by fsdp-run with signal 9 \(SIGKILL\)", err)
    check(line, f"rank 1 was not killed after the grace period:\n{err[-3000:]}")
    print(line.group(0))


def missing_program(r):
    """Every worker fails at once (exec fails): one report, exit 1, not 143."""
    rc, out, err, secs, left = r.run(r.launcher("fsdp-run", 4) + ["/nonexistent/fsdp-program"])
    print(f"fsdp-run of a missing program: exit {rc} after {secs:.2f} s")
    check(rc == 1 and not left, f"rc {rc}, leftovers {left}:\n{err[-3000:]}")
    check(re.search(r"root cause: rank \d .*exited with code 127", err) and
          "cannot run '/nonexistent/fsdp-program'" in err, f"no report:\n{err[-3000:]}")


def stalled_trainer(r):
    args = [r.tool("fsdp-train")] + train_args(r, "gpt2")
    rc, out, err, secs, left = r.run(r.launcher("fsdp-run", 4) + args,
                                     {"FSDP_FAULT": "stall:rank=2:step=2", "FSDP_TIMEOUT_S": "2"})
    print(f"fsdp-run: exit {rc} after {secs:.1f} s; leftovers {left}")
    check(rc != 0 and secs <= TEARDOWN_S and not left, f"rc {rc}, {secs:.1f} s, {left}")
    # The first rank whose watchdog fires exits, and fsdp-run then stops the
    # rest: a slower rank may be stopped before its own deadline, or fire after
    # the first has gone with the store it asks (its report then says the peers
    # published no progress). So at least one of the others reports rank 2 by
    # name, and every report names the operation.
    lines = [l for l in err.splitlines() if "watchdog:" in l]
    check(any(l.startswith(f"[rank {rank}]") and "rank 2 never issued it" in l
              for l in lines for rank in (0, 1, 3)),
          f"no rank reported the timeout naming rank 2:\n{err[-3000:]}")
    check(all("for 'grad_norm'" in l and ("rank 2 never issued it" in l or
                                          "published no progress" in l) for l in lines),
          f"a report does not name the operation and rank 2:\n{err[-3000:]}")
    print(lines[0])


DESYNC = {
    "extra": [r"ranks 0, 2-3 issued all_gather #1 \(4 f32 per rank\) but rank 1 issued "
              r"all_reduce #1 \(1 f32, sum\)"],
    "count": [r"ranks 0, 2-3 issued all_gather #1 \(4 f32 per rank\) but rank 1 issued "
              r"all_gather #1 \(5 f32 per rank\)"],
    # Caught before any gather since issue 14: materialize compares the plans.
    "skip-unit": [r"different settings, seen by rank \d: engine\.unit\[1\]\.tensor\[0\]: "
                  r"ranks 0, 2-3 have b\.w 64, rank 1 has c\.w 64"],
}


def desync(r, case, kind, default=False):
    """default: the check as the library has it by default, without
    FSDP_DESYNC_CHECK or world opts (before issue 14 it was off: "count" died
    in gloo::EnforceNotMet or MPI_ERR_TRUNCATE, "extra" hung until the
    watchdog)."""
    cmd = r.launcher(kind, 4) + [r.tool("tests/launch/launch_probe"), case, "1"]
    rc, out, err, secs, left = r.run(cmd, {"PROBE_DEFAULT_CHECK": "1"} if default else {},
                                     timeout=60)
    print(f"{case} under {kind}{' (default check)' if default else ''}: exit {rc} after "
          f"{secs:.1f} s; leftovers {left}")
    check(rc != 0 and not left, f"rc {rc}, leftovers {left}")
    for rank in range(4):
        mine = [l for l in err.splitlines() if f"probe: rank {rank}: error" in l]
        check(mine and all(re.search(p, mine[0]) for p in DESYNC[case]),
              f"rank {rank} did not report the desync:\n{err[-3000:]}")
    print(mine[0])


def desync_group(r, kind):
    """A desync inside one group of a split (ranks r / 2; rank 3 issues an extra
    all_reduce): ranks 2 and 3 report it, naming their group and world ranks;
    the other group finishes."""
    cmd = r.launcher(kind, 4) + [r.tool("tests/launch/launch_probe"), "extra-group", "3"]
    rc, out, err, secs, left = r.run(cmd, timeout=60)
    print(f"extra-group under {kind}: exit {rc} after {secs:.1f} s; leftovers {left}")
    check(rc != 0 and not left, f"rc {rc}, leftovers {left}")
    want = (r"desync on communicator \d+ \(group 1 of communicator \d+: world ranks 2-3\), seen "
            r"by rank [23]: rank 2 issued all_gather #1 \(4 f32 per rank\) but rank 3 issued "
            r"all_reduce #1 \(1 f32, sum\)")
    for rank in (2, 3):
        mine = [l for l in err.splitlines() if f"probe: rank {rank}: error" in l]
        check(mine and re.search(want, mine[0]), f"rank {rank} did not name its group:\n"
              f"{err[-3000:]}")
    for rank in (0, 1):
        check(any(l.endswith(f"probe: rank {rank}: ok") for l in err.splitlines()),
              f"rank {rank} of the other group did not finish:\n{err[-3000:]}")
    print(mine[0])


def bad_launch(r, case):
    """Starts env:// ranks by hand, wrongly; every one must exit within the
    rendezvous timeout (plus start-up slack) and say who did not join."""
    port, timeout = free_port(), 3.0
    specs = {
        "fewer-ranks": {i: {} for i in range(3)},
        "wrong-port": {0: {}, 1: {}, 2: {"MASTER_PORT": str(free_port())}, 3: {}},
        "wrong-address": {0: {}, **{i: {"MASTER_ADDR": "192.0.2.1"} for i in (1, 2, 3)}},
        "exit-before-join": {0: {}, 1: {}, 2: {}, 3: {"MASTER_PORT": "not-a-port"}},
    }[case]
    tag = uuid.uuid4().hex
    procs, t0 = {}, time.monotonic()
    for rank, extra in specs.items():
        env = {**r.base_env, "FSDP_TEST_TAG": tag, "RANK": str(rank), "WORLD_SIZE": "4",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "FSDP_RENDEZVOUS_TIMEOUT_S": str(timeout), **extra}
        procs[rank] = subprocess.Popen([r.tool("tests/launch/launch_probe"), "ok"], env=env,
                                       stderr=subprocess.PIPE, text=True)
    errs = {}
    for rank, p in procs.items():
        try:
            errs[rank] = p.communicate(timeout=timeout + 10)[1]
        except subprocess.TimeoutExpired:
            p.kill()
            raise Failure(f"rank {rank} still running {timeout + 10} s after start")
        check(p.returncode != 0, f"rank {rank} exited 0")
    secs = time.monotonic() - t0
    left = wait_no_orphans(tag, t0 + TEARDOWN_S)
    print(f"{case}: every rank exited non-zero within {secs:.1f} s (rendezvous timeout "
          f"{timeout:g} s); leftovers {left}")
    # Within the timeout, plus what starting four processes takes here.
    check(secs <= timeout + 1.5 and not left, f"{secs:.1f} s, leftovers {left}")
    expect = {"fewer-ranks": {i: "missing: rank 3" for i in range(3)},
              "wrong-port": {0: "missing: rank 2", 1: "missing: rank 2", 3: "missing: rank 2",
                             2: "cannot reach 127.0.0.1"},
              "wrong-address": {0: "missing: ranks 1-3",
                                **{i: "cannot reach 192.0.2.1" for i in (1, 2, 3)}},
              "exit-before-join": {0: "missing: rank 3", 1: "missing: rank 3",
                                   2: "missing: rank 3", 3: "MASTER_PORT='not-a-port'"}}[case]
    for rank, words in expect.items():
        check(words in errs[rank], f"rank {rank} does not say '{words}':\n{errs[rank]}")
        print(f"  rank {rank}: {errs[rank].strip().splitlines()[-1][:220]}")


def restart(r):
    """Killed at step 5 of 8, restarted once: resumes from step 4's checkpoint
    and ends with the very weights (and optimizer state) of a run never hurt."""
    base = [r.tool("fsdp-train")] + train_args(r, "gpt2")
    base[base.index("--steps") + 1] = "8"
    results = {}
    for name, extra in (("clean", {}), ("restarted", {"FSDP_FAULT": "kill:rank=1:step=5"})):
        save = os.path.join(r.tmp, "ckpt-" + name)
        cmd = r.launcher("fsdp-run", 4) + ["--max-restarts", "1"] + base + [
            "--save-dir", save, "--save-every", "2", "--resume", "auto"]
        rc, out, err, secs, left = r.run(cmd, extra)
        check(rc == 0, f"{name}: exit {rc}:\n{err[-3000:]}")
        check(not left, f"{name}: leftovers {left}")
        st = os.path.join(r.tmp, name + ".safetensors")
        ck = subprocess.run([r.tool("fsdp-ckpt"), "consolidate", save, st], capture_output=True,
                            text=True)
        check(ck.returncode == 0, f"fsdp-ckpt consolidate {save}: {ck.stderr}")
        results[name] = (out, err, open(st, "rb").read())
        print(f"{name}: exit 0 after {secs:.1f} s")
    out, err, _ = results["restarted"]
    check("restarting the worker group (restart 1 of 1" in err, f"no restart:\n{err[-3000:]}")
    resumed = events(out, "resume")
    check(resumed and resumed[0]["step"] == 4, f"did not resume at step 4: {resumed}")
    clean = {e["step"]: e["loss"] for e in events(results["clean"][0], "step")}
    again = {e["step"]: e["loss"] for e in events(out, "step")}
    check(clean == again, f"step losses differ:\n{clean}\n{again}")
    same = results["clean"][2] == results["restarted"][2]
    print(f"restarted run resumed at step {resumed[0]['step']}; losses of steps 1-8 equal; "
          f"final checkpoint ({len(results['clean'][2])} bytes, weights and optimizer state) "
          f"{'identical' if same else 'DIFFERENT'}")
    check(same, "final checkpoints differ")


def read_until(p, pattern, deadline):
    text = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([p.stderr], [], [], deadline - time.monotonic())
        if not ready:
            break
        chunk = os.read(p.stderr.fileno(), 65536).decode(errors="replace")
        if not chunk:
            break
        text += chunk
        if re.search(pattern, text):
            return text
    raise Failure(f"never saw {pattern!r}:\n{text[-3000:]}")


def signalled(r, sig):
    """SIGINT to fsdp-run reaches the workers (exit 128+2); SIGKILL of
    fsdp-run takes the workers with it (PR_SET_PDEATHSIG)."""
    tag = uuid.uuid4().hex
    env = dict(r.base_env, FSDP_TEST_TAG=tag, FSDP_TIMEOUT_S="60")
    cmd = r.launcher("fsdp-run", 2) + [r.tool("tests/launch/launch_probe"), "stall", "0", "0"]
    p = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    read_until(p, r"rank 0: stalling", time.monotonic() + 30)
    t0 = time.monotonic()
    p.send_signal(sig)
    rc = p.wait(timeout=TEARDOWN_S)
    left = wait_no_orphans(tag, t0 + TEARDOWN_S)
    secs = time.monotonic() - t0
    print(f"{signal.Signals(sig).name} to fsdp-run: exit {rc}; every worker gone after "
          f"{secs:.2f} s; leftovers {left}")
    check(not left, f"leftovers {left}")
    check(rc == (128 + sig if sig == signal.SIGINT else -sig), f"exit status {rc}")


# ---- issue 14: fail fast, rank consistency, stopped workers, small ----------

# A rank that fails on its own must end the job within this, far below the
# 30 s collective timeout these runs use: the bound is what start-up of a
# 2-rank job costs here under load, not a deadline to wait out.
FAIL_FAST_S = 15.0


def rank_wrapper(r, extra, rank1_dir=None):
    """A script that runs its arguments, adding `extra` on rank 1 only (the
    rank read from mpirun's or fsdp-run's environment), and on rank 1 from
    rank1_dir when given (relative paths then name other files)."""
    path = os.path.join(r.tmp, f"rank1-{uuid.uuid4().hex[:8]}.sh")
    cd = f"cd '{rank1_dir}' && " if rank1_dir else ""
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                f'if [ "${{OMPI_COMM_WORLD_RANK:-$RANK}}" = 1 ]; then {cd}exec "$@" ' +
                " ".join(f"'{a}'" for a in extra) + "\nfi\nexec \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def gpt2_small_args(r):
    args = train_args(r, "gpt2")
    args[args.index("--steps") + 1] = "4"
    return args


def fail_fast(r, case, kind):
    """Rank 1 alone fails: before any collective (its --data does not exist)
    or inside a step while rank 0 waits in a collective (FSDP_FAULT=fail).
    Before the fix mpirun hung in MPI_Finalize / MPI_Comm_dup until killed."""
    extra = ["--data", "/nonexistent"] if case == "data" else []
    env = {"FSDP_TIMEOUT_S": "30"}
    if case == "step":
        env["FSDP_FAULT"] = "fail:rank=1:step=2"
    cmd = r.launcher(kind, 2) + [rank_wrapper(r, extra), r.tool("fsdp-train")] + \
        gpt2_small_args(r)
    rc, out, err, secs, left = r.run(cmd, env, timeout=60)
    print(f"rank 1 fails ({case}) under {kind}: exit {rc} after {secs:.1f} s "
          f"(bound {FAIL_FAST_S:g} s, collective timeout 30 s); leftovers {left}")
    check(rc != 0, f"{kind} exited 0")
    check(secs <= FAIL_FAST_S, f"{kind} took {secs:.1f} s > {FAIL_FAST_S:g} s")
    check(not left, f"processes left behind: {left}")
    why = "/nonexistent: cannot open" if case == "data" else "injected failure at step 2"
    lines = [l for l in err.splitlines() if "rank 1:" in l and why in l]
    check(lines, f"no message naming rank 1 and the cause:\n{err[-3000:]}")
    print(lines[0])


# Flags one rank gets differently, what the others have, and the message part.
MISMATCH = {
    "lr": (["--lr", "0.01"], r"--lr: rank 0 has 0\.002, rank 1 has 0\.01"),
    "seed": (["--seed", "5"], r"--seed: rank 0 has 1, rank 1 has 5"),
    "global-batch": (["--global-batch", "4"], r"--global-batch: rank 0 has 8, rank 1 has 4"),
    "strategy": (["--strategy", "zero2"], r"--strategy: rank 0 has zero3, rank 1 has zero2"),
    "micro-batches": (["--micro-batches", "2"],
                      r"--micro-batches: rank 0 has 1, rank 1 has 2"),
    "layers": (["--layers", "3"], r"--layers: rank 0 has 2, rank 1 has 3"),
    "data": (None, r"data content \(FNV-1a 64\): rank 0 has [0-9a-f]{16}, rank 1 has"),
    # a --config whose sharding rules only rank 1 reads (written below)
    "config": ("config", r"sharding rules: rank 0 has \(none\), rank 1 has 1, FNV-1a 64 "
                         r"[0-9a-f]{16}"),
}


def mismatch(r, case):
    """Ranks started with different settings are named at start-up, under both
    launchers. Before the fix: --lr/--seed/--global-batch exited 0 with a
    different model, --strategy/--micro-batches hung until the watchdog,
    --layers under fsdp-run died of an uncaught gloo::EnforceNotMet."""
    extra, pattern = MISMATCH[case]
    args, rank1_dir = gpt2_small_args(r), None
    if extra is None:  # one relative path, same size, other bytes on rank 1
        i = args.index("--data") + 1
        text = open(args[i]).read()
        rank1_dir = os.path.join(r.tmp, "rank1")
        os.makedirs(rank1_dir, exist_ok=True)
        open(os.path.join(rank1_dir, "text.txt"), "w").write(text[::-1])
        args[i], extra = "text.txt", []
    elif extra == "config":  # every flag equal; one rule, on rank 1 only
        path = os.path.join(r.tmp, "rules.yaml")
        open(path, "w").write('sharding:\n  - match: "h.*.attn.*"\n    lr_mult: 0.5\n')
        extra = ["--config", path]
    for kind in ("fsdp-run", "mpirun"):
        if kind == "mpirun" and not r.a.mpirun:
            continue
        cmd = r.launcher(kind, 2) + [rank_wrapper(r, extra, rank1_dir),
                                     r.tool("fsdp-train")] + args
        rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": "30"}, timeout=60)
        print(f"{case} differs on rank 1 under {kind}: exit {rc} after {secs:.1f} s; "
              f"leftovers {left}")
        check(rc != 0, f"{kind}: exit 0 although rank 1 ran with {extra}")
        check(secs <= FAIL_FAST_S and not left, f"{kind}: {secs:.1f} s, leftovers {left}")
        lines = [l for l in err.splitlines() if "ranks were started with different settings"
                 in l and re.search(pattern, l)]
        check(lines, f"{kind}: no message naming the setting and both ranks' values:\n"
              f"{err[-3000:]}")
        print(lines[0])


def stalled_setup(r, kind):
    """Rank 1 never creates its communicator: the others' creation ends at the
    2 s collective deadline with a message naming it (before: MPI_Comm_dup
    waited for ever under mpirun; gloo's connect waited the 300 s rendezvous
    timeout)."""
    cmd = r.launcher(kind, 2) + [r.tool("tests/launch/launch_probe"), "stall-setup", "1"]
    rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": "2"}, timeout=60)
    print(f"rank 1 stalls before communicator creation under {kind}: exit {rc} after "
          f"{secs:.1f} s (timeout 2 s); leftovers {left}")
    check(rc != 0 and secs <= FAIL_FAST_S and not left, f"rc {rc}, {secs:.1f} s, {left}")
    want = (r"rank 0: communicator creation \(MPI_Comm_dup\) did not complete within the 2 s"
            if kind == "mpirun" else r"probe: rank 0: error .*cannot connect communicator 0")
    line = re.search(want + ".*", err)
    check(line, f"no message naming communicator creation:\n{err[-3000:]}")
    print(line.group(0)[:300])


def mismatch_bench(r):
    """fsdp-bench compares its own flags too (before: each rank timed its own
    micro-batch and the job exited 0)."""
    args = ["--preset", "tiny", "--iters", "2", "--warmup", "1", "--peak-size", "0"]
    for kind in ("fsdp-run", "mpirun"):
        if kind == "mpirun" and not r.a.mpirun:
            continue
        cmd = r.launcher(kind, 2) + [rank_wrapper(r, ["--micro-batch", "4"]),
                                     r.tool("fsdp-bench")] + args
        rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": "30"}, timeout=60)
        print(f"fsdp-bench --micro-batch differs on rank 1 under {kind}: exit {rc} after "
              f"{secs:.1f} s; leftovers {left}")
        check(rc != 0 and secs <= FAIL_FAST_S and not left, f"rc {rc}, {secs:.1f} s, {left}")
        lines = [l for l in err.splitlines()
                 if re.search(r"different settings.*--micro-batch: rank 0 has 8, rank 1 has 4", l)]
        check(lines, f"{kind}: no message naming --micro-batch:\n{err[-3000:]}")
        print(lines[0])


def sigstopped(r):
    """A SIGSTOPped worker: rank 0's watchdog fires at the 2 s timeout, and
    fsdp-run resumes (SIGCONT) and stops rank 1 at once instead of after the
    grace period, naming rank 1 as the root cause (before: timeout + grace,
    and the root cause named rank 0, which reported the timeout)."""
    tag = uuid.uuid4().hex
    env = dict(r.base_env, FSDP_TEST_TAG=tag, FSDP_TIMEOUT_S="2")
    args = train_args(r, "gpt2")
    args[args.index("--steps") + 1] = "100000"
    cmd = r.launcher("fsdp-run", 2) + ["--grace", "20", r.tool("fsdp-train")] + args
    # stderr to a file, not a pipe no one drains before the end; stdout read
    # against a deadline: both waits end, with what was printed, inside meson's
    # 120 s even on a loaded machine
    errf = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=errf, text=True)
    text, deadline = "", time.monotonic() + 50
    while '"event":"step"' not in text and time.monotonic() < deadline:  # every rank trains
        ready, _, _ = select.select([p.stdout], [], [], max(deadline - time.monotonic(), 0))
        chunk = os.read(p.stdout.fileno(), 65536).decode(errors="replace") if ready else ""
        if not chunk:
            break
        text += chunk
    if '"event":"step"' not in text:
        p.kill()
        p.wait()
        errf.seek(0)
        raise Failure(f"no training step within 50 s:\n{text[-1000:]}\n{errf.read()[-3000:]}")
    victims = [pid for pid, _ in tagged_processes(tag)
               if b"RANK=1" in open(f"/proc/{pid}/environ", "rb").read().split(b"\0")]
    check(victims, "rank 1 not found")
    os.kill(victims[0], signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        p.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        errf.seek(0)
        raise Failure(f"fsdp-run still running 40 s after SIGSTOP:\n{errf.read()[-3000:]}")
    secs = time.monotonic() - t0
    errf.seek(0)
    err = errf.read()
    left = wait_no_orphans(tag, t0 + TEARDOWN_S)
    print(f"rank 1 SIGSTOPped: fsdp-run exit {p.returncode} {secs:.1f} s later (timeout 2 s, "
          f"grace 20 s); leftovers {left}")
    check(p.returncode != 0 and not left, f"rc {p.returncode}, leftovers {left}")
    check(secs < 12, f"took {secs:.1f} s: the stopped worker waited out the 20 s grace")
    root = re.search(r"root cause: rank 1 .*paused by SIGSTOP.*", err)
    check(root, f"the root cause does not name the stopped rank 1:\n{err[-3000:]}")
    check(re.search(r"rank 0 was waiting for it: .*watchdog", err), f"no watchdog line:\n{err}")
    print(root.group(0))


def cli_small(r):
    """Small CLI defects (issue 14, case 9), each a one-rank run."""
    tool, args = r.tool("fsdp-train"), gpt2_small_args(r)
    cases = [
        (["--steps", "2", "--bogus"], 2, "unknown option '--bogus'"),
        (["stray"], 2, "unexpected argument 'stray'"),
        (["--steps"], 2, "--steps needs a value"),
        (args + ["--global-batch", "0"], 2, "--global-batch 0: use a positive number"),
        (args + ["--seq-len", "0"], 2, "--seq-len 0: use a positive number"),
    ]
    for argv, want_rc, words in cases:
        rc, out, err, secs, left = r.run([tool] + argv, timeout=60)
        print(f"fsdp-train {' '.join(argv[-2:])}: exit {rc}: {err.strip()[-120:]}")
        check(rc == want_rc and words in err, f"expected exit {want_rc} and '{words}':\n{err}")
    # --stop-after before any evaluation: the done line says so (was: val loss 0.0000)
    plain = [a for a in args if a != "--json"]
    rc, out, err, secs, left = r.run([tool] + plain + ["--stop-after", "2", "--eval-every", "0"])
    done = [l for l in out.splitlines() if l.startswith("done:")]
    check(rc == 0 and done and "no eval ran" in done[0] and "val loss" not in done[0],
          f"done line: {done}\n{err[-2000:]}")
    print(done[0])
    rc, out, err, secs, left = r.run([tool] + args + ["--stop-after", "2", "--eval-every", "0"])
    summary = events(out, "summary")
    check(rc == 0 and summary and summary[0]["val_loss"] is None, f"summary: {summary}")
    print("JSON summary val_loss: null")


# ---- issue 25: early exits, strangers on the port, out of memory -----------

def rank1_script(r, body):
    """A script that runs the sh commands `body` on rank 1 (fsdp-run's RANK),
    then runs its arguments."""
    path = os.path.join(r.tmp, f"rank1-{uuid.uuid4().hex[:8]}.sh")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nif [ "$RANK" = 1 ]; then {body}; fi\nexec "$@"\n')
    os.chmod(path, 0o755)
    return path


def exit0_before_join(r):
    """Rank 1 exits with status 0 before the rendezvous while rank 0 waits in
    it for rank 1: fsdp-run names rank 1 at once and stops rank 0 (before:
    rank 0 waited out its rendezvous timeout, 300 s by default, 20 s here, and
    the report named rank 0)."""
    early = rank1_script(r, "echo 'rank 1 leaves early' >&2; exit 0")
    cmd = r.launcher("fsdp-run", 2) + [early, r.tool("tests/launch/launch_probe"), "ok"]
    rc, out, err, secs, left = r.run(cmd, {"FSDP_RENDEZVOUS_TIMEOUT_S": "20"}, timeout=60)
    print(f"rank 1 exits 0 before the rendezvous: exit {rc} after {secs:.1f} s (rendezvous "
          f"timeout 20 s); leftovers {left}")
    check(rc == 1 and secs <= FAIL_FAST_S and not left, f"rc {rc}, {secs:.1f} s, {left}:\n"
          f"{err[-3000:]}")
    root = re.search(r"root cause: rank 1 .*exited with status 0 before the job finished.*", err)
    check(root and "never joined" in root.group(0),
          f"the root cause is not rank 1's early exit:\n{err[-3000:]}")
    print(root.group(0))


def exit0_mid_job(r):
    """Rank 1 exits with status 0 in the middle of the job (after a collective,
    without fsdp_world_destroy): fsdp-run names rank 1, not rank 0 whose next
    collective fails for want of it (before: "root cause: rank 0", its
    "Connection closed by peer")."""
    cmd = r.launcher("fsdp-run", 2) + [r.tool("tests/launch/launch_probe"), "exit0", "1"]
    rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": "30"}, timeout=60)
    print(f"rank 1 exits 0 mid-job: exit {rc} after {secs:.1f} s; leftovers {left}")
    check(rc == 1 and secs <= FAIL_FAST_S and not left, f"rc {rc}, {secs:.1f} s, {left}:\n"
          f"{err[-3000:]}")
    root = re.search(r"root cause: rank 1 .*exited with status 0 before the job finished.*", err)
    check(root and "fsdp_world_destroy" in root.group(0),
          f"the root cause is not rank 1's early exit:\n{err[-3000:]}")
    print(root.group(0))


def wait_listening(port, deadline):
    """Polls until something accepts connections on port (a store), or fails."""
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise Failure(f"nothing listens on port {port}")


def job_id(r):
    """fsdp-run gives each job an id (--rdzv-id, else a generated one) as
    FSDP_RUN_ID, and a store turns away ranks of another job: job A's rank 0
    serves the store, job B's rank 1 reaches it on the same port and is
    refused, naming both ids; A's own rank 1 then joins and A succeeds
    (before: B's rank 1 took A's RANK=1, so A's rank 1 failed with "RANK=1 was
    given to 2 processes")."""
    ids = []
    for extra in ([], [], ["--rdzv-id", "job-7"]):
        cmd = r.launcher("fsdp-run", 2) + extra + ["sh", "-c", 'echo "$RANK $FSDP_RUN_ID"']
        rc, out, err, secs, left = r.run(cmd, timeout=60)
        seen = {line.split(" ", 1)[1] for line in out.splitlines() if " " in line}
        check(rc == 0 and len(out.splitlines()) == 2 and len(seen) == 1 and "" not in seen,
              f"fsdp-run {' '.join(extra)}: rc {rc}, ids {out!r}:\n{err[-2000:]}")
        ids.append(seen.pop())
    print(f"job ids: generated {ids[0]!r}, {ids[1]!r}; given {ids[2]!r}")
    check(ids[0] != ids[1] and ids[2] == "job-7", f"ids {ids}")
    for extra, words in ((["--nnodes", "2"], "--nnodes > 1 needs --rdzv-id"),
                         (["--rdzv-id", "a b"], "--rdzv-id must be 1-255 characters"),
                         (["--rdzv-timeout", "inf"], "--rdzv-timeout must be above 0")):
        rc, out, err, secs, left = r.run([r.tool("fsdp-run")] + extra + ["true"], timeout=60)
        check(rc == 2 and words in err, f"fsdp-run {' '.join(extra)}: rc {rc}: {err}")

    port, tag = free_port(), uuid.uuid4().hex
    probe = [r.tool("tests/launch/launch_probe"), "ok"]

    started = []

    def start(rank, job):
        env = {**r.base_env, "FSDP_TEST_TAG": tag, "RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "FSDP_RUN_ID": job,
               "FSDP_RENDEZVOUS_TIMEOUT_S": "20"}
        started.append(subprocess.Popen(probe, env=env, stderr=subprocess.PIPE, text=True))
        return started[-1]

    t0 = time.monotonic()
    a0 = start(0, "job-a")
    try:
        wait_listening(port, t0 + 20)
        b1 = start(1, "job-b")
        b_err = b1.communicate(timeout=20)[1]
        print(f"job B's rank 1 on job A's port: exit {b1.returncode} after "
              f"{time.monotonic() - t0:.1f} s: {b_err.strip()[-300:]}")
        check(b1.returncode != 0, f"job B's rank 1 joined job A's world:\n{b_err}")
        check("'job-a'" in b_err and "'job-b'" in b_err,
              f"job B's rank 1 does not name both job ids:\n{b_err}")
        a1 = start(1, "job-a")
        a_errs = [p.communicate(timeout=30)[1] for p in (a0, a1)]
    finally:
        for p in started:
            p.kill()
            p.wait()
    secs = time.monotonic() - t0
    left = wait_no_orphans(tag, time.monotonic() + TEARDOWN_S)
    print(f"job A: exit {a0.returncode}, {a1.returncode} after {secs:.1f} s; leftovers {left}")
    check(a0.returncode == 0 and a1.returncode == 0 and not left,
          f"job A failed or left processes ({left}):\n{''.join(a_errs)[-3000:]}")
    check(secs <= FAIL_FAST_S, f"took {secs:.1f} s")


def oom_report(r):
    """A worker killed by SIGKILL is reported "out of memory" when the
    cgroup's oom_kill counter rose during the attempt, and only then. The
    counter file is a stand-in (FSDP_RUN_MEMORY_EVENTS) that the worker bumps
    as the kernel would before it is killed: this machine's memory cgroup is
    not ours to limit (before: "killed by signal 9 (SIGKILL)" alone)."""
    events_file = os.path.join(r.tmp, "memory.events")
    for oom in (True, False):
        with open(events_file, "w") as f:
            f.write("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
        bump = ("printf 'low 0\\nhigh 0\\nmax 5\\noom 2\\noom_kill 2\\noom_group_kill 0\\n' "
                f"> '{events_file}'; " if oom else "")
        cmd = r.launcher("fsdp-run", 1) + ["sh", "-c", bump + "kill -9 $$"]
        rc, out, err, secs, left = r.run(cmd, {"FSDP_RUN_MEMORY_EVENTS": events_file},
                                         timeout=60)
        root = re.search(r"root cause: rank 0 .*killed by signal 9 \(SIGKILL\).*", err)
        print(f"SIGKILL {'with' if oom else 'without'} an OOM kill counted: exit {rc}: "
              f"{root.group(0) if root else err[-300:]}")
        check(rc == 1 and root and not left, f"rc {rc}, leftovers {left}:\n{err[-3000:]}")
        said = "out of memory" in root.group(0)
        check(said == oom, f"'out of memory' {'missing' if oom else 'said'}:\n{err[-3000:]}")
        if oom:
            check(f"oom_kill 1 -> 2 in {events_file}" in root.group(0),
                  f"the report does not show the counter:\n{err[-3000:]}")


# ---- elastic: going on without a lost rank (--min-nproc, --replica-every) ------

ELASTIC_RECOVERY_S = 30.0  # from the loss to the survivors' first step done


# What the elastic cases train: on the CPU over Gloo (the default), or with
# --device cuda on the GPU over NCCL (the cuda suite, under the simulator):
# there a one-layer GPT-2 for 5 steps, as a simulated step takes seconds.
ELASTIC_TRAIN = {
    "cpu": {"steps": 12, "global_batch": 12, "extra": []},
    "cuda": {"steps": 5, "global_batch": 6,
             "extra": ["--device", "cuda", "--comm", "nccl", "--layers", "1", "--heads", "2",
                       "--embd", "32", "--context", "16", "--seq-len", "16"]},
}


def elastic_train(r):
    return ELASTIC_TRAIN[r.a.device]


def elastic_args(r, save, model="gpt2", extra=()):
    text = os.path.join(r.tmp, "text.txt")
    write_text(text)
    t = elastic_train(r)
    # The batch splits over 4, 3 and 2 ranks; snapshots and saves every 2 updates.
    return [r.tool("fsdp-train"), "--model", model, "--preset", "tiny", "--data", text,
            "--steps", str(t["steps"]),
            "--global-batch", str(t["global_batch"]), "--eval-every", "0", "--json",
            "--replica-every", "2", "--save-dir", save, "--save-every", "2", *extra] + t["extra"]


def elastic_run(r, fault, n=4, extra_env=None, model="gpt2", extra=(), launch=()):
    save = os.path.join(r.tmp, "elastic-" + uuid.uuid4().hex[:8])
    cmd = (r.launcher("fsdp-run", n) + ["--min-nproc", "2", *launch] +
           elastic_args(r, save, model, extra))
    env = {"FSDP_FAULT": fault, "FSDP_TIMEOUT_S": "20", "FSDP_RENDEZVOUS_TIMEOUT_S": "30"}
    env.update(extra_env or {})
    rc, out, err, secs, left = r.run(cmd, env, timeout=240)
    check(not left, f"leftover processes {left}")
    return rc, out, err, secs, save


def consolidated(r, path):
    st = os.path.join(r.tmp, uuid.uuid4().hex[:8] + ".safetensors")
    ck = subprocess.run([r.tool("fsdp-ckpt"), "consolidate", path, st], capture_output=True,
                        text=True)
    check(ck.returncode == 0, f"fsdp-ckpt consolidate {path}: {ck.stderr}")
    with open(st, "rb") as f:
        return f.read()


def matches_reference(r, save, step, n, model="gpt2", extra=()):
    """Whether the elastic run saved in `save` ends bit for bit as the
    reference from its checkpoint `step` ("step-K") at n ranks does."""
    mine = consolidated(r, os.path.join(save, f"step-{elastic_train(r)['steps']}"))
    return mine == reference_from(r, os.path.join(save, step), n, model, extra)


def reference_from(r, step_dir, n, model="gpt2", extra=()):
    """The reference of a shrink: the disk checkpoint of the step the survivors
    rolled back to, resharded for n ranks by fsdp-ckpt, trained to the end by
    n ranks (with extra flags: the survivors' layout); its final checkpoint's
    bytes (every tensor and optimizer state)."""
    resharded = os.path.join(r.tmp, "resharded-" + uuid.uuid4().hex[:8])
    ck = subprocess.run([r.tool("fsdp-ckpt"), "reshard", step_dir, "--world", str(n), resharded],
                        capture_output=True, text=True)
    check(ck.returncode == 0, f"fsdp-ckpt reshard {step_dir}: {ck.stderr}")
    save = os.path.join(r.tmp, "reference-" + uuid.uuid4().hex[:8])
    args = elastic_args(r, save, model, extra)
    args = args[:args.index("--replica-every")] + args[args.index("--save-dir"):]
    rc, out, err, secs, left = r.run(r.launcher("fsdp-run", n) + args + ["--resume", resharded])
    check(rc == 0 and not left, f"reference run at {n} ranks: exit {rc}:\n{err[-3000:]}")
    return consolidated(r, os.path.join(save, f"step-{elastic_train(r)['steps']}"))


def check_shrinks(out, err, expect):
    """Each shrink (old ranks, new ranks) as fsdp-train and fsdp-run report it;
    the steps the survivors resumed from."""
    shrinks = events(out, "shrink")
    check([(e["old_ranks"], e["ranks"]) for e in shrinks] == expect,
          f"shrinks {shrinks}, expected {expect}:\n{err[-3000:]}")
    for old, new in expect:
        check(f"going on with {new} of {old} ranks" in err, f"no {old} -> {new} in fsdp-run's "
              f"log:\n{err[-3000:]}")
    times = [float(x) for x in re.findall(r"first step done ([0-9.]+) s after the loss", err)]
    check(len(times) == len(expect), f"fsdp-run logged {len(times)} resumptions:\n{err[-3000:]}")
    check(max(times) <= ELASTIC_RECOVERY_S, f"recovery took {max(times)} s > {ELASTIC_RECOVERY_S}")
    check("was killed by signal 9 (SIGKILL)" in err, f"the loss is not named:\n{err[-3000:]}")
    return [e["from_step"] for e in shrinks], times


def elastic_kill(r, n=4):
    """n ranks, one SIGKILLed at a random step: the n - 1 others go on from
    their last complete snapshot (in memory), exit 0, and end with the very
    state (weights and optimizer, bit for bit) of an (n - 1)-rank run started
    from the disk checkpoint of that step resharded to n - 1 ranks. With
    --device cuda the survivors' NCCL communicators fail (the dead peer),
    are aborted and made anew over the survivors' world."""
    seed = int(os.environ.get("FSDP_ELASTIC_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    steps = elastic_train(r)["steps"]
    rank, step = rng.randrange(n), rng.randrange(3, steps)  # the first snapshot is after step 2
    print(f"FSDP_ELASTIC_SEED={seed}: rank {rank} of {n} killed at step {step} "
          f"({r.a.device})")
    rc, out, err, secs, save = elastic_run(r, f"kill:rank={rank}:step={step}", n=n)
    check(rc == 0, f"exit {rc}:\n{err[-3000:]}")
    check(f"lost rank {rank} (first launched as rank {rank}," in err, f"rank {rank} not named")
    (resumed,), times = check_shrinks(out, err, [(n, n - 1)])
    # The newest snapshot before the loss, or the one before it when the loss
    # came while the newest was still on its way to the buddy.
    newest = (step - 1) // 2 * 2
    check(resumed in (newest, newest - 2) and resumed >= 2,
          f"resumed from step {resumed} after a loss at step {step}")
    same = matches_reference(r, save, f"step-{resumed}", n - 1)
    print(f"resumed from the snapshot of step {resumed} {times[0]:.2f} s after the loss; final "
          f"state {'identical to' if same else 'DIFFERENT from'} the "
          f"{n - 1}-rank run from step {resumed} resharded on disk ({secs:.1f} s)")
    check(same, "final state differs from the reference")


def elastic_llama(r):
    """elastic-kill's loss (rank 2 of 4 at step 7) with a grouped-query Llama:
    the replicas, the in-memory reshard and the rebuilt model are the
    model's own, and the end equals the 3-rank run from the disk checkpoint."""
    rc, out, err, secs, save = elastic_run(r, "kill:rank=2:step=7", model="llama")
    check(rc == 0, f"exit {rc}:\n{err[-3000:]}")
    (resumed,), times = check_shrinks(out, err, [(4, 3)])
    check(resumed in (6, 4), f"resumed from step {resumed} after a loss at step 7")
    same = matches_reference(r, save, f"step-{resumed}", 3, "llama")
    print(f"llama: resumed from step {resumed} {times[0]:.2f} s after the loss; final state "
          f"{'identical' if same else 'DIFFERENT'}")
    check(same, "final state differs from the reference")


def elastic_twice(r):
    """Two losses one after the other, 4 -> 3 -> 2: the second rolls back to a
    snapshot taken by the 3 survivors; the end equals a 2-rank run from that
    step's disk checkpoint (saved by 3 ranks) resharded to 2."""
    rc, out, err, secs, save = elastic_run(r, "kill:rank=1:step=5,kill:rank=3:step=9")
    check(rc == 0, f"exit {rc}:\n{err[-3000:]}")
    resumed, times = check_shrinks(out, err, [(4, 3), (3, 2)])
    check(resumed == [4, 8], f"resumed from {resumed}, expected [4, 8]")
    same = matches_reference(r, save, "step-8", 2)
    print(f"4 -> 3 -> 2 ranks, resumed from steps {resumed} ({', '.join(f'{t:.2f}' for t in times)}"
          f" s after each loss); final state {'identical' if same else 'DIFFERENT'}")
    check(same, "final state differs from the reference")


def elastic_callback(r):
    """The C API alone (tests/launch/probe.c rejoin): rank 2 of 4 dies; each
    survivor's fsdp_world_rejoin joins the world of 3 and calls the change
    callback once with its old and new rank; an all_reduce over the new world
    checks out. Without --min-nproc the same loss ends the job as before (the
    others are stopped; a rejoin, were it reached, is refused)."""
    probe = r.tool(os.path.join("tests", "launch", "launch_probe"))
    cmd = r.launcher("fsdp-run", 4) + ["--min-nproc", "3", probe, "rejoin", "2"]
    rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": "20"})
    check(rc == 0 and not left, f"exit {rc}, leftovers {left}:\n{err[-3000:]}")
    for old, new in ((0, 0), (1, 1), (3, 2)):
        check(f"probe: rank {old}: change 1: rank {old} of 4 -> rank {new} of 3 (callback)" in err,
              f"no change line for rank {old}:\n{err[-3000:]}")
        check(f"probe: rank {new}: ok" in err, f"rank {new} of 3 not ok:\n{err[-3000:]}")
    check(err.count(": change ") == 3, f"callbacks:\n{err[-3000:]}")
    rc, out, err, secs, left = r.run(r.launcher("fsdp-run", 4) + [probe, "rejoin", "2"],
                                     {"FSDP_TIMEOUT_S": "20"})
    check(rc == 1 and "root cause: rank 2 (local rank 2" in err and ": change " not in err,
          f"without --min-nproc: exit {rc}:\n{err[-3000:]}")
    print(f"3 survivors rejoined with one callback each in {secs:.1f} s; without --min-nproc "
          f"the job ends (exit 1)")


CYCLE_TIMEOUT_S = 120  # the watchdog, set far above what freeing the survivors may take
CYCLE_FREED_S = 10.0


def elastic_cycle(r):
    """A loss must free the survivors at once, not at the watchdog's deadline
    (probe.c rejoin-cycle), with the watchdog at 120 s. Rank 2 of 3 dies
    while ranks 0 and 1 are caught across two communicators of their own, as
    an engine's streams can be: rank 1 waits in one for rank 0, whose stream
    waits in the other for rank 1. First rank 0's shift, which receives from
    rank 2, fails: that failure must cancel its communicators, which frees
    both. Then (`word`) no collective of theirs fails at all: fsdp-run's word
    of the loss on the control pipe must free them. Each wait must end within
    10 s; a communicator exempt from the cancel still works, and the pair
    rejoins as a world of 2."""
    probe = r.tool(os.path.join("tests", "launch", "launch_probe"))
    said = []
    for mode in ([], ["word"]):
        cmd = r.launcher("fsdp-run", 3) + ["--min-nproc", "2", probe, "rejoin-cycle", *mode]
        rc, out, err, secs, left = r.run(cmd, {"FSDP_TIMEOUT_S": str(CYCLE_TIMEOUT_S)},
                                         timeout=CYCLE_TIMEOUT_S // 2)
        check(rc == 0 and not left, f"{mode}: exit {rc}, leftovers {left}:\n{err[-3000:]}")
        freed = {int(k): float(v)
                 for k, v in re.findall(r"probe: rank (\d): freed after ([0-9.]+) s", err)}
        check(sorted(freed) == [0, 1] and max(freed.values()) < CYCLE_FREED_S,
              f"{mode}: survivors freed after {freed} s (the watchdog is at {CYCLE_TIMEOUT_S} "
              f"s):\n{err[-3000:]}")
        check(all(f"probe: rank {k}: the exempt communicator still works" in err for k in (0, 1)),
              f"{mode}: the exempt communicator failed:\n{err[-3000:]}")
        cause = ("fsdp-run announced world 1 of 2 ranks after a loss (this world has 3): this "
                 "world's collectives are cancelled" if mode else
                 "another collective failed here first: ")
        check(f"was cancelled on rank 0 of 2: {cause}" in err,
              f"{mode}: rank 0's cancelled all_reduce does not say why:\n{err[-3000:]}")
        for old in (0, 1):
            check(f"probe: rank {old}: change 1: rank {old} of 3 -> rank {old} of 2" in err and
                  f"probe: rank {old}: ok" in err, f"{mode}: rank {old} did not rejoin:\n"
                  f"{err[-3000:]}")
        said.append(f"{'word' if mode else 'failure'}: freed after {freed[0]:.2f} and "
                    f"{freed[1]:.2f} s")
    print(f"rank 2 of 3 lost, watchdog at {CYCLE_TIMEOUT_S} s; {'; '.join(said)}; both "
          f"rejoined as 2")


def elastic_sigstop(r):
    """A rank SIGSTOPped after step 3: the others' watchdogs name it at the
    3 s timeout, fsdp-run kills it, and the 3 others go on from their last
    complete snapshot to the reference's very state."""
    tag = uuid.uuid4().hex
    save = os.path.join(r.tmp, "elastic-sigstop")
    env = dict(r.base_env, FSDP_TEST_TAG=tag, FSDP_TIMEOUT_S="3")
    cmd = r.launcher("fsdp-run", 4) + ["--min-nproc", "2"] + elastic_args(r, save)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, out = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        out += line
        if not line or '"step":3,' in line:
            break
    victims = [pid for pid, _ in tagged_processes(tag)
               if b"RANK=2" in open(f"/proc/{pid}/environ", "rb").read().split(b"\0")]
    check(victims, "rank 2 not found")
    os.kill(victims[0], signal.SIGSTOP)
    try:
        rest, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        rest, err = p.communicate()
        raise Failure(f"fsdp-run still running 120 s after SIGSTOP:\n{err[-3000:]}")
    out += rest
    left = wait_no_orphans(tag, time.monotonic() + TEARDOWN_S)
    check(p.returncode == 0 and not left, f"exit {p.returncode}, leftovers {left}:\n{err[-3000:]}")
    check(re.search(r"watchdog says rank 2 \(first launched as rank 2, pid \d+\) never arrived",
                    err), f"fsdp-run did not act on the watchdog's report:\n{err[-3000:]}")
    check("hung (a peer's watchdog named it) and was killed by fsdp-run" in err,
          f"the loss is not explained:\n{err[-3000:]}")
    shrinks = events(out, "shrink")
    check([(e["old_ranks"], e["ranks"]) for e in shrinks] == [(4, 3)], f"shrinks {shrinks}")
    resumed = shrinks[0]["from_step"]
    same = matches_reference(r, save, f"step-{resumed}", 3)
    print(f"rank 2 SIGSTOPped after step 3: killed at the watchdog's word, the others resumed "
          f"from step {resumed}; final state {'identical' if same else 'DIFFERENT'}")
    check(same, "final state differs from the reference")


def elastic_grow(r):
    """Grow back, 4 -> 3 -> 4: rank 1 dies at step 5, the 3 others go on;
    fsdp-run --respawn starts a new worker once they resumed, and at their
    next snapshot all 4 move into a world of 4 (the newcomer receives its
    shard from memory). The end equals a 4-rank run from that step's disk
    checkpoint (saved by the 3) resharded to 4."""
    save = os.path.join(r.tmp, "elastic-grow")
    cmd = r.launcher("fsdp-run", 4) + ["--min-nproc", "2", "--respawn", "1"] + elastic_args(r, save)
    rc, out, err, secs, left = r.run(cmd, {"FSDP_FAULT": "kill:rank=1:step=5",
                                           "FSDP_TIMEOUT_S": "20"}, timeout=240)
    check(rc == 0 and not left, f"exit {rc}, leftovers {left}:\n{err[-3000:]}")
    check("started 1 worker to replace the lost" in err, f"no replacement:\n{err[-3000:]}")
    shrinks, grows = events(out, "shrink"), events(out, "grow")
    check([(e["old_ranks"], e["ranks"]) for e in shrinks] == [(4, 3)], f"shrinks {shrinks}")
    check([(e["old_ranks"], e["ranks"]) for e in grows] == [(3, 4)], f"grows {grows}:\n{err[-3000:]}")
    at = grows[0]["step"]
    check(at % 2 == 0 and at > shrinks[0]["from_step"], f"grew at step {at}")
    same = matches_reference(r, save, f"step-{at}", 4)
    print(f"4 -> 3 ranks at step 5 (from step {shrinks[0]['from_step']}), back to 4 at step {at} "
          f"({grows[0]['seconds']:.2f} s); final state {'identical' if same else 'DIFFERENT'}")
    check(same, "final state differs from the reference")


def elastic_snapshot(r):
    """A rank dies as the snapshot after update 6 begins: its buddy never gets
    its copy of step 6, so every survivor rolls back to step 4, the snapshot
    before (double buffering), and ends as a 3-rank run from step 4 does."""
    rc, out, err, secs, save = elastic_run(r, "snapkill:rank=2:step=6")
    check(rc == 0, f"exit {rc}:\n{err[-3000:]}")
    (resumed,), times = check_shrinks(out, err, [(4, 3)])
    check(resumed == 4, f"resumed from step {resumed}, not 4 (the snapshot before the one the "
          f"loss interrupted)")
    same = matches_reference(r, save, "step-4", 3)
    print(f"lost during the snapshot of step 6: resumed from step {resumed}; final state "
          f"{'identical' if same else 'DIFFERENT'}")
    check(same, "final state differs from the reference")


def elastic_pair(r):
    """A rank and its buddy die together: no complete copy of the first is
    left, the job ends saying so, and the disk checkpoint remains usable."""
    rc, out, err, secs, save = elastic_run(r, "kill:rank=1:step=5,kill:rank=2:step=5")
    check(rc == 1, f"exit {rc}, expected 1:\n{err[-3000:]}")
    # Usually both die before fsdp-run decides the next world. Where rank 2 was
    # still inside a collective rank 1's death failed, it rejoins a world of 3
    # and dies at step 5 there, before that world's first snapshot: the job
    # then ends saying that instead. Either way no copy is left and it says so.
    check("rank 1 was lost and so was its buddy, rank 2: no complete copy of rank 1's shard"
          in err or ("took no snapshot before the loss" in err and
                     "resume from the last checkpoint on disk" in err),
          f"no message about the lost copy:\n{err[-3000:]}")
    ck = subprocess.run([r.tool("fsdp-ckpt"), "verify", save], capture_output=True, text=True)
    check(ck.returncode == 0 and "step-4" in ck.stdout + ck.stderr,
          f"fsdp-ckpt verify {save}: {ck.stdout}{ck.stderr}")
    print(f"ended in {secs:.1f} s naming the lost copy; {save}/step-4 verifies")


def elastic_hsdp(r):
    """HSDP (4 ranks, --shard-size 2: 2 replica groups of 2), one rank
    SIGKILLed at a random step: the survivors' world of 3 is not a multiple
    of 2, so every rank shards over all 3 (plain zero3, said in the shrink
    event and the log); the lost rank's shard comes from its replica group
    (the other group holds it) and the end equals, bit for bit, a 3-rank
    plain run from that step's disk checkpoint (written by shard group 0)."""
    seed = int(os.environ.get("FSDP_ELASTIC_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    rank, step = rng.randrange(4), rng.randrange(3, 12)
    print(f"FSDP_ELASTIC_SEED={seed}: rank {rank} of 2 x 2 killed at step {step}")
    rc, out, err, secs, save = elastic_run(r, f"kill:rank={rank}:step={step}",
                                           extra=("--shard-size", "2"))
    check(rc == 0, f"exit {rc}:\n{err[-3000:]}")
    (resumed,), times = check_shrinks(out, err, [(4, 3)])
    newest = (step - 1) // 2 * 2
    check(resumed in (newest, newest - 2) and resumed >= 2,
          f"resumed from step {resumed} after a loss at step {step}")
    (shrink,) = events(out, "shrink")
    check(shrink["shard_size"] == 3, f"the survivors shard over {shrink['shard_size']}, not 3")
    check("--shard-size 2 does not divide the 3 ranks of the new world: sharding over all 3 "
          "(plain zero3)" in err, f"the layout change is not logged:\n{err[-3000:]}")
    same = matches_reference(r, save, f"step-{resumed}", 3)
    print(f"hsdp 2 x 2 -> zero3 over 3: resumed from step {resumed} {times[0]:.2f} s after the "
          f"loss; final state {'identical' if same else 'DIFFERENT'}")
    check(same, "final state differs from the reference")


def elastic_hsdp_pair(r):
    """HSDP 2 x 2: rank 1 and its buddy, rank 2, die together. Without
    HSDP that loses rank 1's shard (elastic-pair); here rank 3 holds the same
    shard, so the 2 survivors (one shard group of 2: --shard-size 2 fits)
    go on and end as a 2-rank run from that step's disk checkpoint."""
    rc, out, err, secs, save = elastic_run(r, "kill:rank=1:step=5,kill:rank=2:step=5",
                                           extra=("--shard-size", "2"))
    check(rc == 0, f"exit {rc}:\n{err[-3000:]}")
    shrinks = events(out, "shrink")
    check([e["ranks"] for e in shrinks][-1:] == [2] and all(e["shard_size"] == e["ranks"] or
                                                          e["ranks"] % 2 for e in shrinks),
          f"shrinks {shrinks}:\n{err[-3000:]}")
    resumed = shrinks[-1]["from_step"]
    check(resumed == 4, f"resumed from step {resumed}, expected 4")
    same = matches_reference(r, save, "step-4", 2)
    print(f"hsdp: ranks 1 and 2 lost together, {len(shrinks)} shrink(s) to 2 ranks from step "
          f"{resumed}; final state {'identical' if same else 'DIFFERENT'}")
    check(same, "final state differs from the reference")


def elastic_hsdp_grow(r):
    """HSDP 2 x 2 -> 3 (plain zero3) -> back to 2 x 2: rank 1 dies at step
    5, fsdp-run --respawn starts a replacement, and at the next snapshot all
    4 return to --shard-size 2 (the newcomer chooses it too); the end equals
    a 4-rank --shard-size 2 run from that step's disk checkpoint (saved by
    the 3)."""
    rc, out, err, secs, save = elastic_run(r, "kill:rank=1:step=5", extra=("--shard-size", "2"),
                                           launch=("--respawn", "1"))
    check(rc == 0, f"exit {rc}:\n{err[-3000:]}")
    shrinks, grows = events(out, "shrink"), events(out, "grow")
    check([(e["old_ranks"], e["ranks"], e["shard_size"]) for e in shrinks] == [(4, 3, 3)],
          f"shrinks {shrinks}:\n{err[-3000:]}")
    check([(e["old_ranks"], e["ranks"], e["shard_size"]) for e in grows] == [(3, 4, 2)],
          f"grows {grows}:\n{err[-3000:]}")
    at = grows[0]["step"]
    check(at % 2 == 0 and at > shrinks[0]["from_step"], f"grew at step {at}")
    same = matches_reference(r, save, f"step-{at}", 4, extra=("--shard-size", "2"))
    print(f"hsdp 2 x 2 -> 3 at step 5 (from step {shrinks[0]['from_step']}) -> 2 x 2 at step "
          f"{at}; final state {'identical' if same else 'DIFFERENT'}")
    check(same, "final state differs from the reference")


# ---- elastic over nodes: two fsdp-run agents as two "hosts" ---------------------

class Hosts:
    """Two "hosts" for two fsdp-run agents: on the loopback, or (netns=True)
    two network namespaces joined by a veth pair, 10.77.N.1 and 10.77.N.2.
    Raises SystemExit(SKIP) naming why when namespaces cannot be made."""

    def __init__(self, r, netns):
        self.names, self.addr = [], "127.0.0.1"
        if not netns:
            return
        n = random.randrange(1, 250)
        ns = [f"fsdp{n}-{uuid.uuid4().hex[:6]}-{k}" for k in (0, 1)]
        veth = [f"vf{uuid.uuid4().hex[:6]}{k}" for k in (0, 1)]
        steps = [["ip", "netns", "add", ns[0]], ["ip", "netns", "add", ns[1]],
                 ["ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1]]]
        for k in (0, 1):
            steps += [["ip", "link", "set", veth[k], "netns", ns[k]],
                      ["ip", "netns", "exec", ns[k], "ip", "addr", "add", f"10.77.{n}.{k + 1}/24",
                       "dev", veth[k]],
                      ["ip", "netns", "exec", ns[k], "ip", "link", "set", veth[k], "up"],
                      ["ip", "netns", "exec", ns[k], "ip", "link", "set", "lo", "up"]]
        for cmd in steps:
            try:
                p = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:
                p = subprocess.CompletedProcess(cmd, 1, "", str(e))
            if cmd[:3] == ["ip", "netns", "add"] and p.returncode == 0:
                self.names.append(cmd[3])
            if p.returncode != 0:
                self.close()
                print(f"SKIP: cannot make two network namespaces here: {' '.join(cmd)}: "
                      f"{p.stderr.strip()} (the loopback form of this case always runs)")
                raise SystemExit(SKIP)
        self.addr = f"10.77.{n}.1"

    def prefix(self, node):
        return ["ip", "netns", "exec", self.names[node]] if self.names else []

    def close(self):
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.names = []


def node_agent(r, hosts, node, nnodes, port, job, extra, args, env, logs):
    cmd = hosts.prefix(node) + [r.tool("fsdp-run"), "--nproc-per-node", "2", "--nnodes", nnodes,
                                "--node-rank", str(node), "--master-addr", hosts.addr,
                                "--master-port", str(port), "--rdzv-id", job] + extra + args
    err = open(os.path.join(r.tmp, f"{job}-node{node}.err"), "w")
    logs.append(err.name)
    return subprocess.Popen(cmd, env=env, cwd=r.tmp, stdout=subprocess.PIPE, stderr=err,
                            text=True)


def read_step(p, step, deadline):
    """Node 0's stdout up to rank 0's event of update `step` (its JSON line)."""
    text = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([p.stdout], [], [], deadline - time.monotonic())
        chunk = os.read(p.stdout.fileno(), 65536).decode(errors="replace") if ready else ""
        if not chunk:
            break
        text += chunk
        if re.search(rf'"event":"step","step":{step}\b', text):
            return text
    raise Failure(f"node 0 never reported step {step}:\n{text[-3000:]}")


def nodes_job(r, netns, nnodes, extra, act, timeout=120, fault=None):
    """An elastic job of two fsdp-run agents (2 ranks each) on two hosts;
    act(procs, deadline, start_node1) drives it (kills, late starts) and
    returns node 0's stdout so far. (rc of each agent, node 0's stdout, both
    agents' stderr, save dir, seconds)."""
    hosts = Hosts(r, netns)
    try:
        port, job = free_port(), "nodes-" + uuid.uuid4().hex[:10]
        save = os.path.join(r.tmp, job)
        env = dict(r.base_env, FSDP_TEST_TAG=job, FSDP_TIMEOUT_S="20",
                   FSDP_RENDEZVOUS_TIMEOUT_S="30", **({"FSDP_FAULT": fault} if fault else {}))
        args, logs, procs = elastic_args(r, save), [], []
        t0 = time.monotonic()
        deadline = t0 + timeout

        def start(node):
            procs.append(node_agent(r, hosts, node, nnodes, port, job, extra, args, env, logs))
            return procs[-1]
        start(0)
        try:
            out = act(procs, deadline, start)
            rcs = []
            for k, p in enumerate(procs):
                o, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                if k == 0:
                    out += o
                rcs.append(p.returncode)
        except subprocess.TimeoutExpired:
            raise Failure(f"the agents still run after {timeout} s:\n" +
                          "".join(open(f).read()[-2000:] for f in logs))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        secs = time.monotonic() - t0
        left = wait_no_orphans(job, t0 + timeout + TEARDOWN_S)
        check(not left, f"leftover processes {left}")
        err = "".join(open(f).read() for f in logs)
        return rcs, out, err, save, secs
    finally:
        hosts.close()


def nodes_kill(r, netns):
    """2 nodes x 2 ranks, elastic (--min-nproc 2): node 1's agent is SIGKILLed
    (its workers die with it) after a random step. Node 0's 2 ranks go on from
    their last complete snapshot (rank r's buddy is r + 2: the lost ranks'
    copies are on node 0), exit 0, and end bit for bit as a 2-rank run from
    that step's disk checkpoint resharded to 2 ranks."""
    seed = int(os.environ.get("FSDP_ELASTIC_SEED", random.randrange(1 << 30)))
    step = random.Random(seed).randrange(4, 10)
    print(f"FSDP_ELASTIC_SEED={seed}: node 1 killed after step {step}")

    def act(procs, deadline, start):
        start(1)
        out = read_step(procs[0], step, deadline)
        procs[1].kill()
        return out
    rcs, out, err, save, secs = nodes_job(r, netns, "2", ["--min-nproc", "2"], act)
    check(rcs[0] == 0, f"node 0's fsdp-run exited {rcs[0]}:\n{err[-3000:]}")
    check("lost node 1: its agent's connection closed" in err, f"the loss is not named:\n"
          f"{err[-3000:]}")
    check("going on with 2 of 4 ranks" in err, f"no 4 -> 2 in fsdp-run's log:\n{err[-3000:]}")
    shrinks = events(out, "shrink")
    check([(e["old_ranks"], e["ranks"]) for e in shrinks] == [(4, 2)], f"shrinks {shrinks}")
    resumed = shrinks[0]["from_step"]
    check(resumed % 2 == 0 and 2 <= resumed <= step + 1, f"resumed from step {resumed} after "
          f"a loss after step {step}")
    times = [float(x) for x in re.findall(r"first step done ([0-9.]+) s after the loss", err)]
    check(len(times) == 1 and times[0] <= ELASTIC_RECOVERY_S, f"recovery times {times}")
    same = matches_reference(r, save, f"step-{resumed}", 2)
    print(f"{'two network namespaces' if netns else 'loopback'}: node 1 lost after step {step}; "
          f"node 0 resumed from step {resumed} {times[0]:.2f} s later; final state "
          f"{'identical to' if same else 'DIFFERENT from'} the 2-rank run from step "
          f"{resumed} ({secs:.1f} s)")
    check(same, "final state differs from the reference")


def nodes_kill_worker(r):
    """2 nodes x 2 ranks; one worker of node 1 (rank 3) dies at step 5: the 3
    left (2 on node 0, 1 on node 1) go on. Their snapshots from then on need
    one buddy distance agreed by ranks whose nodes hold 2 and 1 ranks; the end
    equals a 3-rank run from the step they resumed from."""
    def act(procs, deadline, start):
        start(1)
        return ""
    rcs, out, err, save, secs = nodes_job(r, False, "2", ["--min-nproc", "2"], act,
                                          fault="kill:rank=3:step=5")
    check(rcs == [0, 0], f"exit {rcs}:\n{err[-3000:]}")
    check("lost rank 3 (first launched as rank 3, local rank 1" in err and
          "node 1 lost 1 worker" in err, f"the loss is not named:\n{err[-3000:]}")
    shrinks = events(out, "shrink")
    check([(e["old_ranks"], e["ranks"]) for e in shrinks] == [(4, 3)], f"shrinks {shrinks}")
    resumed = shrinks[0]["from_step"]
    times = [float(x) for x in re.findall(r"first step done ([0-9.]+) s after the loss", err)]
    check(len(times) == 1 and times[0] <= ELASTIC_RECOVERY_S, f"recovery times {times}")
    same = matches_reference(r, save, f"step-{resumed}", 3)
    print(f"rank 3 (node 1) lost at step 5; 3 ranks on 2 nodes resumed from step {resumed} "
          f"{times[0]:.2f} s after the loss; final state {'identical' if same else 'DIFFERENT'} "
          f"({secs:.1f} s)")
    check(same, "final state differs from the reference")


def nodes_grow(r):
    """--nnodes 1:2: node 0 starts alone once --rdzv-timeout passes (2 ranks);
    node 1's agent comes after the first update and is admitted at the next
    snapshot: 2 -> 4 ranks, ending as a 4-rank run from that step does."""
    def act(procs, deadline, start):
        out = read_step(procs[0], 1, deadline)
        start(1)
        return out
    rcs, out, err, save, secs = nodes_job(r, False, "1:2", ["--rdzv-timeout", "1"], act)
    check(rcs == [0, 0], f"exit {rcs}:\n{err[-3000:]}")
    grows = events(out, "grow")
    check([(e["old_ranks"], e["ranks"]) for e in grows] == [(2, 4)], f"grows {grows}:\n"
          f"{err[-3000:]}")
    check("growing to 4 of 2 ranks" in err and "node 1 joined" in err, f"fsdp-run did not log "
          f"the admission:\n{err[-3000:]}")
    at = grows[0]["step"]
    check(at % 2 == 0 and at >= 2, f"grew at step {at}")
    same = matches_reference(r, save, f"step-{at}", 4)
    print(f"started with 1 node (2 ranks), node 1 admitted at step {at} "
          f"({grows[0]['seconds']:.2f} s); final state {'identical' if same else 'DIFFERENT'} "
          f"({secs:.1f} s)")
    check(same, "final state differs from the reference")


def nodes_lose_node0(r):
    """Node 0 serves every world's store: when its agent dies, node 1 ends the
    job (exit 1) saying why, and nothing is left running."""
    def act(procs, deadline, start):
        start(1)
        out = read_step(procs[0], 3, deadline)
        procs[0].kill()
        return out
    rcs, out, err, save, secs = nodes_job(r, False, "2", ["--min-nproc", "2"], act)
    check(rcs[1] == 1, f"node 1's fsdp-run exited {rcs[1]}, expected 1:\n{err[-3000:]}")
    check("node 0's agent (127.0.0.1:" in err and "the job cannot go on without it" in err,
          f"node 1 did not say why it ended:\n{err[-3000:]}")
    print(f"node 0 lost: node 1 ended in {secs:.1f} s naming it")


def fake_agent(port, job, node, deadline):
    """A socket that said hello to node 0's fsdp-run as node `node` of job
    `job` (one worker), retried until node 0 listens (as fsdp-run does)."""
    while True:
        a = socket.socket()
        if a.connect_ex(("127.0.0.1", port)) == 0:
            break
        a.close()
        check(time.monotonic() < deadline, f"node 0's fsdp-run never listened on {port}")
        time.sleep(0.02)
    a.sendall(f"hello {job} {node} 1\n".encode())
    a.settimeout(max(0.1, deadline - time.monotonic()))
    return a


def first_line(a, node):
    try:
        return a.makefile("r").readline()
    except OSError as e:
        raise Failure(f"node {node} got no word from node 0: {e}")


def node0_agent(r, port, job, tag, nnodes):
    """Node 0's fsdp-run of an elastic job of nnodes nodes of one rank each;
    its one worker sleeps (this case tests the agents' link alone)."""
    cmd = [r.tool("fsdp-run"), "--nproc-per-node", "1", "--nnodes", str(nnodes), "--node-rank",
           "0", "--master-port", str(port), "--rdzv-id", job, "--min-nproc", "1",
           "sleep", "60"]
    return subprocess.Popen(cmd, env=dict(r.base_env, FSDP_TEST_TAG=tag), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def stop_agent(p, tag):
    p.send_signal(signal.SIGTERM)
    try:
        p.communicate(timeout=TEARDOWN_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise Failure("fsdp-run still ran 30 s after SIGTERM")
    left = wait_no_orphans(tag, time.monotonic() + TEARDOWN_S)
    check(not left, f"leftover processes {left}")


def nodes_bad_line(r):
    """A line that is not fsdp-run's protocol, either way, gets a clear error:
    an agent that says 'alive 7' with one worker (before: node 0 grew the
    world to 8 ranks for workers that do not exist) or 'ready' is dropped as
    a lost node, named with its line; node 1 given a word it cannot follow by
    node 0 (junk, or a part of 3 ranks for its 1 worker; before: ignored,
    and node 1 waited for ever) ends saying what it got. And --nnodes too
    large for memory is said so (before: a crash closing links never made)."""
    cmd = [r.tool("fsdp-run"), "--nnodes", "2000000000", "--min-nproc", "1", "--rdzv-id", "big",
           "--master-port", str(free_port()), "true"]
    p = subprocess.run(cmd, env=r.base_env, capture_output=True, text=True, timeout=30,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30,) * 2))
    check(p.returncode == 1 and "out of memory for the links of 2000000000 nodes" in p.stderr,
          f"--nnodes 2000000000: exit {p.returncode}: {p.stderr}")
    for bad in ("alive 7", "alive -1", "ready"):
        port, job, tag = free_port(), "bad-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
        p = node0_agent(r, port, job, tag, 2)
        try:
            deadline = time.monotonic() + 20
            a = fake_agent(port, job, 1, deadline)
            first = first_line(a, 1)
            check(first.startswith("start 0 2 ") and first.endswith(" 1 1\n"),
                  f"node 1's first word {first!r}")
            a.sendall((bad + "\n").encode())
            err = read_until(p, r"going on with|growing to", deadline)
            check(f"node 1's agent sent '{bad}', which is not fsdp-run's protocol" in err and
                  "going on with 1 of 2 ranks" in err and "broke the protocol" in err,
                  f"'{bad}' from node 1:\n{err[-2000:]}")
            told = a.makefile("r").read()
            check(told.startswith("end node 0 dropped this node"), f"node 1 was told {told!r}")
            a.close()
        finally:
            stop_agent(p, tag)
        print(f"node 1's agent sent '{bad}': dropped, named, and told so")
    for word in ("hello there", "start 0 4 5000 1 3", "world 1 2 0 0 1"):
        port, tag = free_port(), uuid.uuid4().hex
        with socket.socket() as srv:
            srv.bind(("127.0.0.1", port))
            srv.listen()
            cmd = [r.tool("fsdp-run"), "--nproc-per-node", "1", "--nnodes", "2", "--node-rank",
                   "1", "--master-port", str(port), "--rdzv-id", "bad", "--min-nproc", "1",
                   "sleep", "60"]
            p = subprocess.Popen(cmd, env=dict(r.base_env, FSDP_TEST_TAG=tag),
                                 stderr=subprocess.PIPE, text=True)
            try:
                srv.settimeout(20)
                conn, _ = srv.accept()
                with conn:
                    hello = conn.makefile("r").readline()
                    check(hello == "hello bad 1 1\n", f"node 1 said {hello!r}")
                    if word.startswith("world"):  # a world after a valid start
                        conn.sendall(f"start 0 2 {free_port()} 1 1\n".encode())
                    conn.sendall((word + "\n").encode())
                    _, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                raise Failure(f"node 1's fsdp-run still runs 20 s after node 0 sent '{word}'")
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        left = wait_no_orphans(tag, time.monotonic() + TEARDOWN_S)
        check(p.returncode == 1 and f"node 0's agent sent '{word}', which is not fsdp-run's "
              "protocol for a node of 1 worker" in err and not left,
              f"'{word}' to node 1: exit {p.returncode}, leftovers {left}:\n{err[-2000:]}")
        print(f"node 0 sent '{word}': node 1 ended with exit 1 naming it")


def nodes_join_then_world(r):
    """Node 0 admits a late node ('join') and, a loss coming at once, tells it
    the next world ('world') in the same read: node 1's worker starts as a
    joiner of the first (RANK 2 of 3, FSDP_RUN_JOIN=1) and is then told the
    second (before: the join was dropped for the world, and the worker
    started as an ordinary rank 1 of 2 that nobody was going to meet)."""
    port, tag = free_port(), uuid.uuid4().hex
    ports = (free_port(), free_port())
    worker = 'echo "env $RANK $WORLD_SIZE ${FSDP_RUN_JOIN:-0}"; cat <&"$FSDP_RUN_CONTROL"'
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", port))
        srv.listen()
        cmd = [r.tool("fsdp-run"), "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1",
               "--master-port", str(port), "--rdzv-id", "late", "--min-nproc", "1",
               "sh", "-c", worker]
        p = subprocess.Popen(cmd, env=dict(r.base_env, FSDP_TEST_TAG=tag), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            srv.settimeout(20)
            conn, _ = srv.accept()
            with conn:
                hello = conn.makefile("r").readline()
                check(hello == "hello late 1 1\n", f"node 1 said {hello!r}")
                conn.sendall(f"join 1 3 {ports[0]} 2 1\nworld 2 2 {ports[1]} 1 1\n".encode())
                deadline = time.monotonic() + 20
                out = ""
                while out.count("\n") < 3 and time.monotonic() < deadline:
                    ready, _, _ = select.select([p.stdout], [], [], deadline - time.monotonic())
                    chunk = os.read(p.stdout.fileno(), 4096).decode() if ready else ""
                    if not chunk:
                        break
                    out += chunk
        finally:
            p.kill()
            p.wait()
    left = wait_no_orphans(tag, time.monotonic() + TEARDOWN_S)
    want = ["env 2 3 1", f"world 1 2 3 {ports[0]} 0 1", f"world 2 1 2 {ports[1]} 0 1"]
    check(out.splitlines() == want and not left,
          f"node 1's worker saw {out.splitlines()}, not {want} (leftovers {left})")
    print("join and world in one read: the worker started as a joiner, then was told the world")


def wait_syn_sent(port, deadline):
    """Polls /proc/net/tcp until a connection to 127.0.0.1:port waits for
    its SYN's answer (state SYN_SENT)."""
    want = f"0100007F:{port:04X}"
    while time.monotonic() < deadline:
        with open("/proc/net/tcp") as f:
            if any(line.split()[2] == want and line.split()[3] == "02" for line in f
                   if line.split()[0] != "sl"):
                return
        time.sleep(0.02)
    raise Failure(f"nothing connects to port {port}")


def nodes_unreachable(r):
    """Node 0's port drops node 1's SYN (its listen backlog is full, as a
    firewall's DROP would): node 1 gives up at --rdzv-timeout 2 saying so,
    and a SIGINT meanwhile stops it at once (before: connect(2) blocked for
    the kernel's SYN retries, a minute or two, deaf to both)."""
    with socket.socket() as srv, socket.socket() as filler:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        filler.connect(("127.0.0.1", port))  # the backlog is now full
        cmd = [r.tool("fsdp-run"), "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1",
               "--master-port", str(port), "--rdzv-id", "far", "--min-nproc", "1",
               "--rdzv-timeout", "2", "true"]
        for sig in (None, signal.SIGINT):
            t0 = time.monotonic()
            p = subprocess.Popen(cmd, env=r.base_env, stderr=subprocess.PIPE, text=True)
            try:
                if sig:
                    wait_syn_sent(port, time.monotonic() + 10)
                    p.send_signal(sig)
                _, err = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise Failure(f"node 1's fsdp-run still connects 15 s later "
                              f"({'after SIGINT' if sig else '--rdzv-timeout 2'})")
            secs = time.monotonic() - t0
            if sig:
                check(p.returncode == 128 + sig and "interrupted while node 1 waited" in err,
                      f"SIGINT: exit {p.returncode}: {err}")
            else:
                check(p.returncode == 1 and "cannot reach node 0's agent" in err and
                      "within --rdzv-timeout 2 s" in err and secs < 6,
                      f"exit {p.returncode} after {secs:.1f} s: {err}")
            print(f"{'SIGINT' if sig else '--rdzv-timeout 2'}: node 1 stopped after {secs:.1f} s "
                  f"(exit {p.returncode})")


def nodes_agent_restarted(r):
    """Node 1's agent says hello, dies and is started again while node 0
    still waits for node 2: the new one is welcome and the job starts with
    nodes 0, 1 and 2 (before: node 0 still counted the closed connection and
    turned the new agent away as 'node 1 is in the job already'); one that
    is not started again is not counted."""
    port, job, tag = free_port(), "again-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    p = node0_agent(r, port, job, tag, 3)
    try:
        deadline = time.monotonic() + 20
        fake_agent(port, job, 1, deadline).close()
        again, last = fake_agent(port, job, 1, deadline), fake_agent(port, job, 2, deadline)
        words = [first_line(a, k) for k, a in ((1, again), (2, last))]
        check(words[0].startswith("start 0 3 ") and words[0].endswith(" 1 1\n") and
              words[1].startswith("start 0 3 ") and words[1].endswith(" 2 1\n"),
              f"nodes 1 and 2 were told {words}")
        again.close()
        last.close()
        print("node 1's agent started again before the job began: welcome, and the job began "
              "with 3 nodes")
    finally:
        stop_agent(p, tag)
    # --nnodes 2:3: node 1's agent dies before the start and is not replaced;
    # at --rdzv-timeout the job starts with nodes 0 and 2 (before: node 1's
    # closed connection was counted, making a world of 3 with a rank nobody runs)
    port, job, tag = free_port(), "gone-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    cmd = [r.tool("fsdp-run"), "--nproc-per-node", "1", "--nnodes", "2:3", "--node-rank", "0",
           "--master-port", str(port), "--rdzv-id", job, "--rdzv-timeout", "2", "sleep", "60"]
    p = subprocess.Popen(cmd, env=dict(r.base_env, FSDP_TEST_TAG=tag), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        fake_agent(port, job, 1, deadline).close()
        last = fake_agent(port, job, 2, deadline)
        word = first_line(last, 2)
        check(word.startswith("start 0 2 ") and word.endswith(" 1 1\n"),
              f"node 2 was told {word!r}, not its part of a world of 2")
        last.close()
        print("node 1's agent gone before the start: the job began with nodes 0 and 2")
    finally:
        stop_agent(p, tag)


def nodes_many(r):
    """70 nodes whose agents all connect at once: every one is admitted
    (before: node 0 closed each connection past 16 not yet introduced, and
    those nodes failed), and node 0 polls every agent's link (before: the
    first 63 only, so node 69's loss went unseen until something else woke
    node 0)."""
    port, job, tag = free_port(), "many-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    p = node0_agent(r, port, job, tag, 70)
    agents = []
    try:
        deadline = time.monotonic() + 30
        agents.append(fake_agent(port, job, 1, deadline))  # node 0 listens
        # 39 more connect and say hello while node 0 is stopped: they wait in
        # its backlog, as when every agent retries its connection at once
        p.send_signal(signal.SIGSTOP)
        try:
            for node in range(2, 41):
                agents.append(fake_agent(port, job, node, deadline))
        finally:
            p.send_signal(signal.SIGCONT)
        for node in range(41, 70):
            agents.append(fake_agent(port, job, node, deadline))
        for node, a in enumerate(agents, 1):
            first = first_line(a, node)
            check(first.startswith("start 0 70 "), f"node {node}'s first word {first!r}")
        agents[-1].close()
        err = read_until(p, r"going on with", time.monotonic() + 10)
        check("going on with 69 of 70 ranks" in err and "lost node 69" in err,
              f"node 69's loss:\n{err[-2000:]}")
        print("70 nodes: node 69's loss seen at once")
    finally:
        for a in agents:
            a.close()
        stop_agent(p, tag)


def nodes_silent(r):
    """20 connections to node 0's port that never say hello (a port scan, a
    health check) come before node 1's agent: node 0 closes each after its
    hello deadline (5 s) telling it why, node 1 is admitted and the job ends
    with exit 0 on both nodes (before: the 16 silent ones held every slot
    for a connection not yet introduced for ever, and node 1 was never
    heard)."""
    port, job, tag = free_port(), "silent-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    cmd = [r.tool("fsdp-run"), "--nproc-per-node", "1", "--nnodes", "2", "--min-nproc", "1",
           "--master-port", str(port), "--rdzv-id", job, "--rdzv-timeout", "60", "--node-rank"]
    env = dict(r.base_env, FSDP_TEST_TAG=tag)
    procs, silent = [], []
    try:
        procs.append(subprocess.Popen(cmd + ["0", "true"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
        deadline = time.monotonic() + 30
        while len(silent) < 20:
            a = socket.socket()
            if a.connect_ex(("127.0.0.1", port)) == 0:
                silent.append(a)
                continue
            a.close()
            check(time.monotonic() < deadline, f"node 0's fsdp-run never listened on {port}")
            time.sleep(0.02)
        t0 = time.monotonic()
        procs.append(subprocess.Popen(cmd + ["1", "true"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
        errs = []
        for node, p in enumerate(procs):
            try:
                errs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[1])
            except subprocess.TimeoutExpired:
                raise Failure(f"node {node}'s fsdp-run still runs {time.monotonic() - t0:.0f} s "
                              f"after node 1's agent started, behind 20 silent connections")
        secs = time.monotonic() - t0
        check([p.returncode for p in procs] == [0, 0],
              f"exit {[p.returncode for p in procs]}:\n{errs[0][-2000:]}\n{errs[1][-2000:]}")
        told = []
        for a in silent:
            a.settimeout(5)
            try:
                told.append(a.makefile("r").readline())
            except OSError as e:
                told.append(f"({e})")
        said = sum(t == "end node 0 closed this connection: no hello within 5 s\n" for t in told)
        check(said >= 16 and "said no hello within 5 s" in errs[0],
              f"{said} of 20 silent connections were told why, they read {told}:\n{errs[0]}")
        print(f"20 silent connections ahead of node 1: {said} told why and closed at their "
              f"hello deadline, the job done {secs:.1f} s after node 1's agent started")
    finally:
        for a in silent:
            a.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    left = wait_no_orphans(tag, time.monotonic() + TEARDOWN_S)
    check(not left, f"leftover processes {left}")


def nodes_short_send(r):
    """Every send(2) of both agents takes 3 bytes at most and every other one
    fails with EAGAIN (short_send.c, preloaded): each line still arrives
    whole, and the job of 2 nodes ends with exit 0 on both (before: the rest
    of each line was dropped, and node 0 never read node 1's hello)."""
    port, job, tag = free_port(), "short-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    cmd = [r.tool("fsdp-run"), "--nproc-per-node", "1", "--nnodes", "2", "--min-nproc", "1",
           "--master-port", str(port), "--rdzv-id", job, "--rdzv-timeout", "60", "--node-rank"]
    env = dict(r.base_env, FSDP_TEST_TAG=tag,
               LD_PRELOAD=r.tool(os.path.join("tests", "launch", "libshort_send.so")))
    t0 = time.monotonic()
    procs = [subprocess.Popen(cmd + [str(node), "true"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    try:
        errs = [p.communicate(timeout=max(1, t0 + 20 - time.monotonic()))[1] for p in procs]
    except subprocess.TimeoutExpired:
        raise Failure("the agents still run 20 s later, their lines sent 3 bytes at a time")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    check([p.returncode for p in procs] == [0, 0],
          f"exit {[p.returncode for p in procs]}:\n{errs[0][-2000:]}\n{errs[1][-2000:]}")
    left = wait_no_orphans(tag, time.monotonic() + TEARDOWN_S)
    check(not left, f"leftover processes {left}")
    print(f"lines sent 3 bytes at a time, EAGAIN in between: the job of 2 nodes done in "
          f"{time.monotonic() - t0:.1f} s")


SCENARIOS = {
    "parity-gpt2": lambda r: parity(r, "gpt2"),
    "parity-mlp": lambda r: parity(r, "mlp"),
    "hsdp-nnodes2": hsdp_nnodes,
    "stall-group": stalled_group,
    "desync-group-fsdp-run": lambda r: desync_group(r, "fsdp-run"),
    "desync-group-mpirun": lambda r: desync_group(r, "mpirun"),
    "kill-fsdp-run": lambda r: killed(r, "fsdp-run"),
    "kill-mpirun": lambda r: killed(r, "mpirun"),
    "epipe": epipe,
    "sigpipe-root-cause": sigpipe_root_cause,
    "stall-fsdp-run": lambda r: stalled(r, "fsdp-run"),
    "stall-mpirun": lambda r: stalled(r, "mpirun"),
    "stall-trainer": stalled_trainer,
    "sigkill-after-grace": escalated,
    "missing-program": missing_program,
    "restart": restart,
    "sigint": lambda r: signalled(r, signal.SIGINT),
    "launcher-killed": lambda r: signalled(r, signal.SIGKILL),
    **{f"desync-{c}-{k}": (lambda c, k: lambda r: desync(r, c, k))(c, k)
       for c in DESYNC for k in ("fsdp-run", "mpirun")},
    **{f"desync-{c}-default-{k}": (lambda c, k: lambda r: desync(r, c, k, True))(c, k)
       for c in ("extra", "count") for k in ("fsdp-run", "mpirun")},
    **{f"bad-{c}": (lambda c: lambda r: bad_launch(r, c))(c)
       for c in ("fewer-ranks", "wrong-port", "wrong-address", "exit-before-join")},
    **{f"fail-{c}-{k}": (lambda c, k: lambda r: fail_fast(r, c, k))(c, k)
       for c in ("data", "step") for k in ("fsdp-run", "mpirun")},
    **{f"mismatch-{c}": (lambda c: lambda r: mismatch(r, c))(c) for c in MISMATCH},
    "mismatch-bench": mismatch_bench,
    "stall-setup-fsdp-run": lambda r: stalled_setup(r, "fsdp-run"),
    "stall-setup-mpirun": lambda r: stalled_setup(r, "mpirun"),
    "sigstop": sigstopped,
    "cli-small": cli_small,
    "exit0-before-join": exit0_before_join,
    "exit0-mid-job": exit0_mid_job,
    "job-id": job_id,
    "oom-report": oom_report,
    "elastic-kill": elastic_kill,
    "elastic-cycle": elastic_cycle,
    "elastic-kill-3": lambda r: elastic_kill(r, 3),
    "elastic-llama": elastic_llama,
    "elastic-twice": elastic_twice,
    "elastic-pair": elastic_pair,
    "elastic-callback": elastic_callback,
    "elastic-sigstop": elastic_sigstop,
    "elastic-grow": elastic_grow,
    "elastic-snapshot": elastic_snapshot,
    "elastic-hsdp": elastic_hsdp,
    "elastic-hsdp-pair": elastic_hsdp_pair,
    "elastic-hsdp-grow": elastic_hsdp_grow,
    "nodes-kill": lambda r: nodes_kill(r, False),
    "nodes-kill-netns": lambda r: nodes_kill(r, True),
    "nodes-kill-worker": nodes_kill_worker,
    "nodes-grow": nodes_grow,
    "nodes-lose-node0": nodes_lose_node0,
    "nodes-bad-line": nodes_bad_line,
    "nodes-many": nodes_many,
    "nodes-silent": nodes_silent,
    "nodes-short-send": nodes_short_send,
    "nodes-join-then-world": nodes_join_then_world,
    "nodes-unreachable": nodes_unreachable,
    "nodes-agent-restarted": nodes_agent_restarted,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--build", required=True)
    ap.add_argument("--mpirun")
    # the elastic cases' training device (ELASTIC_TRAIN); cuda trains over NCCL
    ap.add_argument("--device", choices=sorted(ELASTIC_TRAIN), default="cpu")
    args = ap.parse_args()
    try:
        SCENARIOS[args.scenario](Runner(args))
    except Failure as e:
        print(f"FAIL {args.scenario}: {e}", file=sys.stderr)
        return 1
    print(f"ok {args.scenario}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
