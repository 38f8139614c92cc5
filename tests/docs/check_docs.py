#!/usr/bin/env python3
"""tests/docs/check_docs.py — runs the commands the README and docs/ print, so they cannot rot.

usage: check_docs.py [-v] SOURCE_DIR BUILD_DIR [FILE.md ...]
       (-v: print what each block printed; default files: README.md, docs/*.md, bench/README.md, tests/README.md)

Every ```sh (or ```bash, ```console) block carries a marker on the line before its fence:
  <!-- runnable -->                   run it, as printed, and it must exit 0
  <!-- not runnable: WHY -->          not run here (a long run, the network, a GPU, ...)
A block without a marker is an error, so no command escapes the choice. Before any block,
  <!-- file: NAME -->                 writes the block (C, YAML, ...) to NAME for later commands.
Each document runs in a fresh copy of the source tree (without .git and build trees) whose
build/ is a link to BUILD_DIR, its blocks in order in one directory (a later block may use
what an earlier one wrote), each under `bash -e -o pipefail` within a time limit. Open MPI's
environment switches for root and oversubscription are removed first, so a printed mpirun
command must carry its own flags to pass as root on a small machine."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SHELLS = ("sh", "bash", "console")
LIMIT_S = 120  # one block; the whole set is meant to stay under about two minutes
MARK = re.compile(r"^<!--\s*(runnable|not runnable:\s*\S.*?|file:\s*(\S+))\s*-->\s*$")
SCRUB = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
         "OMPI_MCA_rmaps_base_oversubscribe", "OMPI_MCA_hwloc_base_binding_policy")


def blocks(path):
    """(line, info, marker, body) for each fenced block of a markdown file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^( *)(```+)\s*([^\s`]*)", lines[i])  # indented too (inside a list)
        if not m:
            i += 1
            continue
        indent, fence, info, start = len(m.group(1)), m.group(2), m.group(3), i
        prev = lines[i - 1].strip() if i > 0 else ""
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if j == len(lines):
            sys.exit(f"{path}:{start + 1}: a fence that never closes")
        body = "\n".join(l[indent:] if l[:indent].isspace() else l.lstrip() for l in lines[i + 1:j])
        out.append((start + 1, info, MARK.match(prev), body + "\n"))
        i = j + 1
    return out


def plan(path):
    """The actions of one document, or the errors that stop it being checked."""
    actions, errors = [], []
    for line, info, mark, body in blocks(path):
        kind = mark.group(1) if mark else ""
        if kind.startswith("file:"):
            actions.append(("file", line, mark.group(2), body))
        elif info in SHELLS:
            if not mark:
                errors.append(f"{path}:{line}: a ```{info} block without <!-- runnable --> or "
                              "<!-- not runnable: WHY --> on the line before it")
            elif kind == "runnable":
                actions.append(("run", line, None, body))
        elif mark:
            errors.append(f"{path}:{line}: <!-- {kind} --> before a ```{info} block: only shell "
                          "blocks run (a <!-- file: NAME --> marker writes any block)")
    return actions, errors


def fresh_copy(src, build):
    """A temporary copy of the source tree, with build/ a link to the build directory."""
    tmp = tempfile.mkdtemp(prefix="fsdp-docs-")
    skip = lambda d, names: [n for n in names if n == ".git" or
                             os.path.exists(os.path.join(d, n, "meson-private")) or
                             os.path.join(d, n) == build]
    root = os.path.join(tmp, "fsdp")
    shutil.copytree(src, root, ignore=skip, symlinks=True)
    os.symlink(build, os.path.join(root, "build"))
    return tmp, root


def run_block(body, cwd, env):
    """(exit status, seconds, output) of one block under bash -e -o pipefail."""
    t0 = time.monotonic()
    p = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", body], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", start_new_session=True)
    try:
        out, _ = p.communicate(timeout=LIMIT_S)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc, out = 124, out + f"\n(killed after the {LIMIT_S} s limit)\n"
    return rc, time.monotonic() - t0, out


def check(doc, src, build, env, verbose):
    actions, errors = plan(os.path.join(src, doc))
    for e in errors:
        print("FAIL", e.replace(src + "/", ""))
    if errors or not any(a[0] == "run" for a in actions):
        return len(errors), 0, 0.0
    tmp, root = fresh_copy(src, build)
    failed = ran = 0
    t0 = time.monotonic()
    try:
        for kind, line, name, body in actions:
            if kind == "file":
                with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                    f.write(body)
                continue
            rc, secs, out = run_block(body, root, env)
            ran += 1
            first = body.strip().split("\n")[0]
            if rc == 0:
                print(f"ok   {doc}:{line} ({secs:.1f} s) {first}")
                if verbose:
                    print(out)
                continue
            failed += 1
            tail = "\n".join(out.rstrip().split("\n")[-25:])
            print(f"FAIL {doc}:{line}: exit {rc} after {secs:.1f} s: the block\n{body}"
                  f"printed (last 25 lines):\n{tail}\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed, ran, time.monotonic() - t0


def main():
    args = sys.argv[1:]
    verbose = bool(args) and args[0] == "-v"
    args = args[1:] if verbose else args
    if len(args) < 2:
        sys.exit(__doc__)
    src, build = os.path.realpath(args[0]), os.path.realpath(args[1])
    docs = args[2:] or (["README.md"] +
                            sorted("docs/" + f for f in os.listdir(os.path.join(src, "docs"))
                                   if f.endswith(".md")) +
                            ["bench/README.md", "tests/README.md"])
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    t0 = time.monotonic()
    failed = ran = 0
    for doc in docs:
        f, r, secs = check(doc, src, build, env, verbose)
        failed, ran = failed + f, ran + r
        if r:
            print(f"--   {doc}: {r} blocks in {secs:.1f} s")
    print(f"docs: {ran} runnable blocks in {len(docs)} files, {failed} failed, "
          f"{time.monotonic() - t0:.1f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
