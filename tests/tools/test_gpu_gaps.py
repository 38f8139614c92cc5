#!/usr/bin/env python3
"""tests/tools/test_gpu_gaps.py — bench/gpu_gaps.py on a made-up Nsight Systems GPU
trace whose busy time, gaps and neighbours are known: two streams that overlap, a
kernel inside another, a preamble line before the header, columns in nsys's order;
then the refusals (no header, a bad number). Usage: test_gpu_gaps.py GPU_GAPS_PY"""
import os
import subprocess
import sys
import tempfile

tool = sys.argv[1]
HEAD = ('"Start (ns)","Duration (ns)","CorrId","GrdX","Strm","Name"\n')
# stream 7: a [1000,3000), b [2500,4000) on stream 8 overlaps it, c [2600,2700) inside;
# gap 4000 -> 10000 (6 us) before d [10000,11000); gap 11000 -> 111000 (100 us) before
# e [111000,111500); gap 2 us before f [113500,114000).
ROWS = [(1000, 2000, 7, "a"), (2500, 1500, 8, "b"), (2600, 100, 7, "c"),
        (10000, 1000, 7, "d"), (111000, 500, 7, "e"), (113500, 500, 8, "f")]


def run(text, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, tool, f.name, *args], capture_output=True,
                              text=True)
    finally:
        os.unlink(f.name)


def expect(cond, what, out):
    if not cond:
        sys.exit(f"test_gpu_gaps: {what}\n--- output ---\n{out}")


csv_text = "Generating SQLite file step.sqlite\n" + HEAD + "".join(
    f'{s},{d},1,1,{st},"{n}"\n' for s, d, st, n in reversed(ROWS))
p = run(csv_text)
out = p.stdout + p.stderr
expect(p.returncode == 0, f"exit {p.returncode}", out)
# window 1000..114000 = 113 us; busy 3 + 1 + 0.5 + 0.5 = 5 us; idle 108 us in 3 gaps
expect("window 0.1130 ms" in out and "busy 0.0050 ms, idle 0.1080 ms" in out and "in 3 gaps" in out,
       "window, busy or idle wrong", out)
expect("gaps       0-5 us:      1,    0.0020 ms" in out, "the 2 us gap not in 0-5 us", out)
expect("gaps      5-50 us:      1,    0.0060 ms" in out, "the 6 us gap not in 5-50 us", out)
expect("gaps     >= 50 us:      1,    0.1000 ms" in out, "the 100 us gap not in >= 50 us", out)
lines = [l for l in out.splitlines() if " us after " in l]
expect(len(lines) == 3 and "100.0 us after 'd' before 'e'" in lines[0]
       and "6.0 us after 'b' before 'd'" in lines[1], "longest gaps or their neighbours wrong", out)
# --last-ms 0.104: from 10000 ns (d's start) to 114000: d, e, f and their 2 gaps
p = run(csv_text, "--last-ms", "0.104")
out = p.stdout + p.stderr
expect(p.returncode == 0 and "window 0.1040 ms" in out and "in 2 gaps" in out
       and "busy 0.0020 ms" in out, "--last-ms 0.104 should leave d, e, f and 2 gaps", out)
# --last-ms 0.1035, from 10500 ns: half of d is left
p = run(csv_text, "--last-ms", "0.1035")
out = p.stdout + p.stderr
expect(p.returncode == 0 and "window 0.1035 ms" in out and "busy 0.0015 ms" in out and
       "in 2 gaps" in out, "--last-ms 0.1035 should cut d at the window's start", out)
p = run('"Begin","Length","Name"\n1,2,"x"\n')
expect(p.returncode != 0 and "no header with Start, Duration and Name" in p.stderr,
       "a CSV without the columns was not refused by name", p.stdout + p.stderr)
p = run(HEAD + '12x,5,1,1,7,"k"\n')
expect(p.returncode != 0 and ":2: Start '12x'" in p.stderr, "a bad number was not refused with "
       "its line", p.stdout + p.stderr)
p = run(HEAD + '12,5,1\n')
expect(p.returncode != 0 and ":2: 3 columns" in p.stderr, "a short row was not refused with "
       "its line", p.stdout + p.stderr)
p = run(HEAD + '12,0,1,1,7,"k"\n')
expect(p.returncode != 0 and "lasts no time" in p.stderr, "an empty window was not refused",
       p.stdout + p.stderr)
p = subprocess.run([sys.executable, tool, "/nonexistent/step_cuda_gpu_trace.csv"],
                   capture_output=True, text=True)
expect(p.returncode != 0 and "No such file" in p.stderr and "Traceback" not in p.stderr,
       "a missing trace was not refused in words", p.stdout + p.stderr)
print("test_gpu_gaps: OK")
