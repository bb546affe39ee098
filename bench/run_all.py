"""Run every bench in bench/, one after another, and say how long each took.

    python bench/run_all.py [--quick] [--compare REV] [other args, passed to every bench]

``--quick`` (small sizes, few rounds) runs them all in about a minute and a half on a 2-core machine:
a before/after check for every change.  ``--compare REV`` runs ``bench/ab.py REV`` instead: vkml
at REV against this working tree, workload by workload.  Each bench runs in its own process with
this tree's ``kit`` and ``extensions`` first on ``PYTHONPATH``, so the vkml measured is this one.
``scripts/dev bench`` runs this script.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: scripts in bench/ that are tools, not benchmarks (files starting with ``_`` are helpers)
TOOLS = ("ab.py", "run_all.py")


def benches():
    """The bench scripts, in name order: every bench/*.py but helpers and tools."""
    return [p for p in sorted(glob.glob(os.path.join(HERE, "*.py")))
            if not os.path.basename(p).startswith("_") and os.path.basename(p) not in TOOLS]


def tree_env():
    paths = [os.path.join(ROOT, "kit"), os.path.join(ROOT, "extensions")]
    old = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths + ([old] if old else [])))


def run(script, args):
    """Run one script with ``args``; return (exit status, seconds)."""
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, script, *args], cwd=ROOT, env=tree_env()).returncode
    return rc, time.perf_counter() - t0


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
    if "--compare" in argv:
        i = argv.index("--compare")
        if i + 1 >= len(argv):
            print("run_all: --compare needs a revision, e.g. --compare main", file=sys.stderr)
            return 2
        rest = argv[:i] + argv[i + 2:]
        return run(os.path.join(HERE, "ab.py"), [argv[i + 1], *rest])[0]
    timings, failed = [], []
    t0 = time.perf_counter()
    for script in benches():
        name = os.path.relpath(script, ROOT)
        print(f"\n=== {name} {' '.join(argv)}", flush=True)
        rc, secs = run(script, argv)
        timings.append(f"{os.path.basename(script)} {secs:.1f} s")
        if rc:
            failed.append(f"{name} (exit {rc})")
    print(f"\nall benches: {time.perf_counter() - t0:.1f} s ({', '.join(timings)}); load average "
          f"{os.getloadavg()[0]:.1f}")
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
