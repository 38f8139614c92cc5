#!/usr/bin/env python3
"""scripts/test-targets.py DIR [meson test selection] — prints the ninja
targets that the tests `meson test -C DIR [selection]` would run need, one per
line, so a build directory used for one suite builds only what that suite runs
(scripts/sim-test.sh: the simulator builds run the cuda suite only, and
building every unit, MPI and tool program under ASan or TSan as well cost
minutes of CI).

What a test needs, from meson's introspection: the targets meson records as
its dependencies (its program, programs among its arguments, `depends :`),
and the shared libraries this build makes in the directories of its
LD_LIBRARY_PATH (the simulated cuBLAS, which the CUDA code dlopens: no link
edge leads ninja to it)."""
import json
import os
import subprocess
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    build = os.path.abspath(sys.argv[1])
    listed = subprocess.run(['meson', 'test', '-C', build, '--list', '--no-rebuild'] + sys.argv[2:],
                            check=True, capture_output=True, text=True).stdout
    # "fsdp:cuda+cudasim / simulator": the project-qualified suites, then the name
    chosen = set()
    for line in listed.splitlines():
        suites, sep, name = line.partition(' / ')
        if sep:
            project, _, names = suites.partition(':')
            chosen.add((name, frozenset(project + ':' + s for s in names.split('+'))))
    info = os.path.join(build, 'meson-info')
    with open(os.path.join(info, 'intro-tests.json')) as f:
        tests = [t for t in json.load(f) if (t['name'], frozenset(t['suite'])) in chosen]
    with open(os.path.join(info, 'intro-targets.json')) as f:
        targets = json.load(f)
    files = {t['id']: t['filename'] for t in targets}
    wanted = set()
    for t in tests:
        for dep in t['depends']:
            wanted.update(files.get(dep, []))
        for d in t['env'].get('LD_LIBRARY_PATH', '').split(':'):
            if d:
                wanted.update(f for t2 in targets if t2['type'] == 'shared library'
                              for f in t2['filename'] if os.path.dirname(f) == os.path.normpath(d))
    for f in sorted(wanted):
        print(os.path.relpath(f, build))
    return 0


if __name__ == '__main__':
    sys.exit(main())
