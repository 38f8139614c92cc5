#!/usr/bin/env python3
"""bench/gpu_gaps.py — where a GPU sat idle: reads Nsight Systems' GPU trace (every
kernel, copy and memset with its start and duration, any stream) as CSV, merges the
intervals of all streams, and prints the busy time, the idle time between the first
and the last activity, the idle time by gap size, and the longest gaps with the
activity on each side (what the GPU waited after, what it waited for). On a
training step, short gaps are launch latency; long ones are host work or a host
wait (a synchronisation, an allocation, a collective's setup).

The trace comes from (on the GPU machine; scripts/gpu-lease.sh's nsys phase):
  nsys profile -o step -t cuda PROGRAM...
  nsys stats -r cuda_gpu_trace -f csv -o step step.nsys-rep   # writes step_cuda_gpu_trace.csv

Usage: bench/gpu_gaps.py TRACE.csv [--last-ms MS] [--top N]
  --last-ms: only the last MS milliseconds before the last activity (a bench's timed
  steps come last; its set-up and warm-up before them are left out).
Columns are found by their names ("Start", "Duration", "Name"), so the report's other
columns and their order do not matter."""
import argparse
import csv
import sys


def read_trace(path):
    """[(start_ns, end_ns, name)], sorted by start, from the CSV's rows."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        sys.exit(f"gpu_gaps: {path}: {e.strerror} (did nsys stats write it?)")
    for i, row in enumerate(rows):  # nsys may print lines before the header
        names = [c.strip() for c in row]
        col = {}
        for j, c in enumerate(names):
            key = c.split(" (")[0]
            col.setdefault(key, j)
        if "Start" in col and "Duration" in col and "Name" in col:
            break
    else:
        sys.exit(f"gpu_gaps: {path}: no header with Start, Duration and Name columns "
                 f"(expected nsys stats -r cuda_gpu_trace -f csv)")
    out = []
    for n, row in enumerate(rows[i + 1:], start=i + 2):
        if not any(c.strip() for c in row):
            continue
        if len(row) <= max(col["Start"], col["Duration"], col["Name"]):
            sys.exit(f"gpu_gaps: {path}:{n}: {len(row)} columns, fewer than the header's")
        try:
            start, dur = int(float(row[col["Start"]])), int(float(row[col["Duration"]]))
        except ValueError:
            sys.exit(f"gpu_gaps: {path}:{n}: Start {row[col['Start']]!r} or Duration "
                     f"{row[col['Duration']]!r} is not a number of nanoseconds")
        if dur < 0:
            sys.exit(f"gpu_gaps: {path}:{n}: negative Duration {dur}")
        out.append((start, start + dur, row[col["Name"]]))
    if not out:
        sys.exit(f"gpu_gaps: {path}: no activity in the trace")
    return sorted(out)


def gaps(intervals):
    """The union of the intervals as busy time, and the gaps between its pieces:
    (busy_ns, [(gap_ns, name_before, name_after)])."""
    busy, found = 0, []
    cur_start, cur_end, last_name = intervals[0][0], intervals[0][1], intervals[0][2]
    for start, end, name in intervals[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            found.append((start - cur_end, last_name, name))
            cur_start, cur_end = start, end
        if end >= cur_end:
            cur_end, last_name = end, name
    busy += cur_end - cur_start
    return busy, found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--last-ms", type=float, default=0.0, help="0: the whole trace")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    if a.last_ms < 0 or a.top < 0:
        ap.error("--last-ms and --top take numbers >= 0")
    trace = read_trace(a.trace)
    if a.last_ms:
        t0 = max(e for _, e, _ in trace) - int(a.last_ms * 1e6)
        trace = [(max(s, t0), e, n) for s, e, n in trace if e > t0]
    busy, found = gaps(trace)
    span = max(e for _, e, _ in trace) - trace[0][0]
    if span <= 0:
        sys.exit(f"gpu_gaps: {a.trace}: the activity in the window lasts no time")
    idle = span - busy
    print(f"window {span / 1e6:.4f} ms{f' (the last {a.last_ms:g} ms)' if a.last_ms else ''}: "
          f"busy {busy / 1e6:.4f} ms, idle {idle / 1e6:.4f} ms ({idle / span:.1%}) in "
          f"{len(found)} gaps")
    for lo, hi in ((0, 5e3), (5e3, 50e3), (50e3, float("inf"))):
        sel = [g for g, _, _ in found if lo <= g < hi]
        label = f"{lo / 1e3:g}-{hi / 1e3:g} us" if hi != float("inf") else f">= {lo / 1e3:g} us"
        print(f"  gaps {label:>12}: {len(sel):6d}, {sum(sel) / 1e6:9.4f} ms")
    for g, before, after in sorted(found, reverse=True)[:a.top]:
        print(f"  {g / 1e3:9.1f} us after {before[:70]!r} before {after[:70]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
