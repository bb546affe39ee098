"""A/B: vkml at one git revision against vkml at another (or the working tree), workload by workload.

    python bench/ab.py OLD [NEW] [--quick] [--bench compiled,simulation] [--rounds N]
                       [--only mlp-1024,cnn]

OLD (and NEW, when given) is anything ``git rev-parse`` takes; it is checked out with
``git worktree add`` into a temporary folder that is removed at the end.  Without NEW the new side
is this working tree, uncommitted edits included.  Each side runs in its own worker process that
imports vkml from its tree (``PYTHONPATH=<tree>/kit:<tree>/extensions``, checked) and the bench
code from THIS tree, so only vkml differs.  Both workers are pinned to the same CPU, one thread,
each with its own empty compiled-library cache (so the old side never runs the new side's
libraries) and the same fixed glibc allocator thresholds (``STEADY_MALLOC``).  Every workload is
timed in rounds that alternate between the two workers
(``_timing.interleave``: the minimum over rounds of each round's median), and the table gives
new/old per workload and phase: above 1 means the new side is slower.

The workloads are the vkml sides of each bench (its ``ab_workloads(quick)``): the peers are left out,
they do not change between revisions.  ``scripts/dev bench --quick --compare OLD`` runs this.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _timing import interleave  # noqa: E402

#: the benches with an ``ab_workloads``: the ones whose vkml side a change to vkml moves
BENCHES = ("compiled", "simulation", "graph_reverse", "mlp_step", "training")

#: glibc's allocator held still in both workers: by default it raises its mmap threshold after a
#: big block is freed, so whether a worker's large buffers (a 100,000-sample plane is 800 KB) come
#: from fresh, page-faulting mmaps depends on that process's history -- enough to make identical
#: code 1.25x slower on one side.  With a fixed threshold both sides allocate alike.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


# -- the worker: one revision's vkml, answering "time this workload for one round" ----------------

def worker(bench, quick, tree):
    """Build ``bench``'s workloads on the vkml of ``tree``, then answer requests on stdin, one JSON
    line each: a workload's name in, its round medians out (on the saved stdout: anything the
    workloads print goes to stderr)."""
    from _timing import pin
    pin()
    answer = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import vkml
    where = os.path.realpath(vkml.__file__)
    if not where.startswith(os.path.realpath(tree) + os.sep):
        raise SystemExit(f"ab worker: imported vkml from {where}, not from {tree}: an installed vkml "
                         "shadows PYTHONPATH here")
    work = importlib.import_module(bench).ab_workloads(quick)
    answer.write(json.dumps({"vkml": where, "workloads": {k: list(p) for k, (p, _) in work.items()}})
                 + "\n")
    for line in sys.stdin:
        answer.write(json.dumps(work[json.loads(line)][1]()) + "\n")


class Side:
    """A worker process for one tree; ``round(name)`` times one round of a workload there."""

    def __init__(self, label, tree, bench, quick, cache):
        self.label, self.tree = label, tree
        self.log = tempfile.TemporaryFile("w+")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(tree, "kit"),
                                                           os.path.join(tree, "extensions")]),
                   VKML_CACHE_DIR=cache, **{k: os.environ.get(k, v) for k, v in STEADY_MALLOC.items()})
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", bench, "--tree", tree]
        self.proc = subprocess.Popen(cmd + (["--quick"] if quick else []), env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        hello = self._read()
        self.workloads = hello["workloads"]

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            raise SystemExit(f"ab: the {self.label} worker ({self.tree}) stopped:\n"
                             + self.log.read()[-3000:])
        return json.loads(line)

    def round(self, name):
        self.proc.stdin.write(json.dumps(name) + "\n")
        self.proc.stdin.flush()
        return tuple(self._read())

    def close(self):
        with contextlib.suppress(OSError):
            self.proc.stdin.close()       # the worker's loop ends at end of input
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# -- the trees ---------------------------------------------------------------------------------------

def git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@contextlib.contextmanager
def checkout(rev):
    """A temporary worktree of ``rev`` (removed on exit); yields (path, description)."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    path = tempfile.mkdtemp(prefix=f"vkml-ab-{commit[:8]}-")
    os.rmdir(path)
    git("worktree", "add", "--detach", "--quiet", path, commit)
    try:
        yield path, f"{rev} ({commit[:8]})"
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", path], cwd=ROOT, capture_output=True)


def working_tree():
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "kit", "extensions")
    return ROOT, f"working tree ({head}{' + uncommitted edits' if dirty else ''})"


# -- the comparison ----------------------------------------------------------------------------------

def compare(bench, trees, quick, rounds, only=()):
    """Rows (bench, workload, phase, old s, new s, least and most new/old of one round) of one bench,
    the two sides interleaved; with ``only``, of the workloads whose names contain one of its
    words."""
    with tempfile.TemporaryDirectory(prefix="vkml-ab-cache-") as caches:
        sides = {}
        try:
            for label, (tree, _) in trees.items():
                sides[label] = Side(label, tree, bench, quick, os.path.join(caches, label))
            names = sides["old"].workloads
            chosen = [name for name in names if not only or any(word in name for word in only)]
            if not chosen:
                print(f"  {bench}: no workload's name holds {', '.join(only)}; its workloads: "
                      + "; ".join(names))
            rows = []
            for name in chosen:
                phases = names[name]
                if name not in sides["new"].workloads:
                    print(f"  {bench}: {name!r} only exists on the old side: skipped")
                    continue
                seen = {label: [] for label in sides}

                def one_round(label, n=name):
                    seen[label].append(sides[label].round(n))
                    return seen[label][-1]

                best = interleave({label: (lambda k=label: one_round(k)) for label in sides},
                                  rounds=rounds)
                for i, phase in enumerate(phases):
                    # new/old of each round after the warm-up: how far one round can be off
                    spread = [n[i] / o[i] for o, n in zip(seen["old"][1:], seen["new"][1:])]
                    rows.append((bench, name, phase, best["old"][i], best["new"][i],
                                 min(spread), max(spread)))
            return rows
        finally:
            for s in sides.values():
                s.close()


def report(rows, trees, rounds):
    print(f"\nA/B  new = {trees['new'][1]}\n     old = {trees['old'][1]}")
    print(f"one thread, both sides pinned to the same CPU, {rounds} rounds alternating old/new, "
          f"min of the round medians; new/old above 1 = the new side is slower (the range of one "
          f"round's new/old shows the noise); load average {os.getloadavg()[0]:.1f} now")
    head = ("bench", "workload", "phase", "old us", "new us", "new/old", "one round's new/old")
    body = [(b, w, p, f"{o * 1e6:,.1f}", f"{n * 1e6:,.1f}", f"{n / o:.2f}x", f"{lo:.2f}-{hi:.2f}x")
            for b, w, p, o, n, lo, hi in rows]
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    for r in [head] + body:
        print("  " + "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
    for bench in dict.fromkeys(r[0] for r in rows):
        ratios = [row[4] / row[3] for row in rows if row[0] == bench]
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"  {bench}: geometric mean of new/old {geomean:.3f} over {len(ratios)} timings")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("old", nargs="?", help="the old revision (a commit, branch or tag)")
    ap.add_argument("new", nargs="?", help="the new revision (default: this working tree)")
    ap.add_argument("--quick", action="store_true", help="small sizes, 5 rounds (under a minute)")
    ap.add_argument("--bench", default=",".join(BENCHES),
                    help=f"benches to compare, comma-separated (default {','.join(BENCHES)})")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per workload (7; 5 with --quick)")
    ap.add_argument("--only", default="",
                    help="time only the workloads whose names contain one of these comma-separated "
                         "words (every workload is still built)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.quick, args.tree)
    if not args.old:
        ap.error("give the old revision, e.g. `python bench/ab.py main --quick`")
    benches = [b for b in args.bench.split(",") if b]
    unknown = [b for b in benches if b not in BENCHES]
    if unknown:
        ap.error(f"no A/B workloads in {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    rounds = args.rounds or (5 if args.quick else 7)
    try:
        with contextlib.ExitStack() as stack:
            trees = {"old": stack.enter_context(checkout(args.old))}
            trees["new"] = stack.enter_context(checkout(args.new)) if args.new else working_tree()
            rows = []
            for bench in benches:
                print(f"ab: {bench} ...", flush=True)
                rows += compare(bench, trees, args.quick, rounds,
                                [w for w in args.only.split(",") if w])
            if not rows:
                raise SystemExit("ab: no workload was timed (--only matched none, see above)")
            report(rows, trees, rounds)
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"ab: {' '.join(err.cmd)} failed: {err.stderr.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
