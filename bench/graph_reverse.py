"""The two-node graph of the tutorial "Gradients through a graph" and its reverse, side by side
with raptor-eagle (CPU) and hand-written NumPy.

    u = x * x;   y = sin(k * u);   k = 1.5,  x = linspace(0.1, 0.9, n),  seed dJ/dy = 1

at n = 10^3, 10^5, 10^6 samples.  Three sides:

- ``vkml``:  ``vkml.Graph`` of two ``@vkml.kernel`` launches built with ``record=True``,
  ``vkml.diff.Reverse(g)`` built once and called once per launch;
- ``eagle``: the same graph as an ``eagle.Graph`` of two hawk kernels (g++-compiled at first use),
  ``eagle.diff.Reverse(g)`` built once;
- ``numpy``: the forward and the analytic backward written by hand in NumPy
  (``gx = 2 x k cos(k u)``, ``gk = sum(u cos(k u))``).

Per launch, the forward (a recording launch) and the reverse are timed separately, in pairs (a
recorded graph refuses a second recording launch until its Record is reversed); the sides are
interleaved in rounds, each time the minimum over rounds of a round's median (``_timing.py`` says
why), so load from elsewhere hits them alike.  Memory, in separate
untimed passes: the peak one reverse call allocates above what was held when it started, and the
footprint -- the peak from nothing through building the side and two launch+reverse cycles, which
also counts buffers a side keeps between calls.  Both by ``tracemalloc`` (Python and NumPy
allocations; eagle allocates its host planes with NumPy, but mallocs inside its compiled C++ are
invisible to it) and by the resident-set high-water mark (``VmHWM`` reset through
``/proc/self/clear_refs``: counts everything, C++ included, at page granularity; memory reused
from a free list shows as 0, so it only means something for the big cases).

The gradients of all three are checked to agree (``allclose``) before anything is timed.

Threads: one per side by default (``OMP_NUM_THREADS=1`` for eagle's host team, ``VKML_THREADS=1``
for vkml's NumPy backend), the process pinned to one CPU; ``--threads N`` sets both (unpinned).
``--profile`` also prints where vkml's time goes (graph-layer overhead per node against the bare
programs, and cProfile).  ``VKML_BACKEND=cpu`` runs vkml's
side on the compiled CPU tier.

Run: ``python bench/graph_reverse.py`` (10-20 s on 2 cores; ``--sizes 1000,100000`` for fewer;
``--quick``: 10^3 and 10^5 samples, 5 rounds).  eagle is optional: without it, its rows are left out.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleave, pin_from_argv, print_table, sampler, time_sides  # noqa: E402

if __name__ == "__main__":        # before NumPy/eagle load OpenMP (libgomp reads it at load)
    PINNED = pin_from_argv()

import numpy as np  # noqa: E402

import _eagle_peer as peer  # noqa: E402  (after the thread count is set)

import vkml  # noqa: E402
from _models import build_sides  # noqa: E402

K = 1.5
SIZES = (10**3, 10**5, 10**6)


# -- measuring --------------------------------------------------------------------------------------

def interleaved_pairs(sides, first, second, *, rounds, reps, between=None):
    """Seconds of ``first(side)`` and of ``second(side)`` per side, run as pairs (a launch, then its
    reverse), the sides interleaved in rounds (``_timing.interleave``: the minimum over rounds of
    each round's median).  ``between(side)`` runs untimed before every pair."""
    samplers = {name: sampler(lambda s=s: first(s), lambda s=s: second(s), reps=reps,
                              between=None if between is None else lambda s=s: between(s))
                for name, s in sides.items()}
    best = interleave(samplers, rounds=rounds)
    return {k: v[0] for k, v in best.items()}, {k: v[1] for k, v in best.items()}


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory(before, fn):
    """Run ``before()`` untraced, then ``fn()``; return ``(tracemalloc peak bytes, RSS high-water
    delta bytes or None)``, both above what was held when ``fn`` started."""
    before()
    gc.collect()
    rss_ok = _reset_hwm()
    rss0 = _rss_kib("VmRSS")
    tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    hwm = _rss_kib("VmHWM")
    return peak - base, ((hwm - rss0) * 1024 if rss_ok else None)


def footprint(factory, cycle, *, cycles=2):
    """Peak memory of a side from nothing: ``factory()`` (its planes, graph and Reverse), then
    ``cycles`` x ``cycle(side)`` (a launch and its reverse).  Counts what a peer preallocates or keeps
    between calls (adjoint planes, Records) as well as what a call allocates.  Returns
    ``(tracemalloc peak bytes, RSS high-water delta bytes or None)`` above the start."""
    gc.collect()
    rss_ok = _reset_hwm()
    rss0 = _rss_kib("VmRSS")
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    try:
        side = factory()
        for _ in range(cycles):
            cycle(side)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    hwm = _rss_kib("VmHWM")
    del side
    gc.collect()
    return peak - base, ((hwm - rss0) * 1024 if rss_ok else None)


def describe_vkml():
    """Which vkml ran: backend (``VKML_BACKEND``), commit, and whether the graph layer had
    uncommitted edits (results move with them)."""
    import subprocess
    from vkml import backends
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kit/vkml/graph",
                                "kit/vkml/backends"], cwd=root, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        where = f"commit {head or '?'}" + (" + uncommitted edits in kit/vkml/{graph,backends}"
                                           if dirty else "")
    except (OSError, subprocess.SubprocessError):
        where = "commit unknown"
    return f"vkml backend {backends.current().name!r} (VKML_BACKEND), {where}"


def fmt_bytes(b):
    if b is None:
        return "n/a"
    if b < 10 * 1024:
        return f"{b} B"
    if b < 10 * 1024**2:
        return f"{b / 1024:,.0f} KiB"
    return f"{b / 1024**2:,.1f} MiB"


def ratio(a, b):
    return "-" if a is None or b is None or not b else f"{a / b:.2f}x"


# -- the three sides --------------------------------------------------------------------------------

@vkml.kernel
def square(x):
    return {"u": x * x}


@vkml.kernel
def wave(u, k: vkml.Param):
    return {"y": vkml.sin(k * u)}


class VkmlGraph:
    def __init__(self, x, k):
        t0 = time.perf_counter()
        n = x.shape[0]
        self.u = np.zeros(n)
        self.y = np.zeros(n)
        self.g = (vkml.Graph()
                  .add(square.bind(x=x, u=self.u), name="square")
                  .add(wave.bind(u=self.u, k=k, y=self.y), name="wave")
                  .build(record=True))
        self.rev = vkml.diff.Reverse(self.g)
        self.setup_s = time.perf_counter() - t0

    def launch(self):
        self.g.launch()

    def reverse(self, seed):
        grads = self.rev(self.g.record, {"y": seed})
        return {"x": grads["x"], "k": float(np.ravel(grads["k"])[0])}


class NumpyGraph:
    """Forward into preallocated planes; the analytic adjoint by hand."""

    def __init__(self, x, k):
        self.x, self.k = x, k
        self.u = np.empty_like(x)
        self.y = np.empty_like(x)
        self.setup_s = 0.0

    def launch(self):
        np.multiply(self.x, self.x, out=self.u)
        np.sin(self.k * self.u, out=self.y)

    def reverse(self, seed):
        c = np.cos(self.k * self.u)          # dy/du = k cos(k u), dy/dk = u cos(k u)
        c *= seed
        gk = float(np.dot(c, self.u))
        c *= self.k
        c *= 2.0
        c *= self.x                           # du/dx = 2 x
        return {"x": c, "k": gk}


def factories(x, quiet=False):
    """A constructor per side (eagle left out, with the reason printed, if it cannot build)."""
    out = {"vkml": lambda: VkmlGraph(x, K)}
    ok, why = peer.available()
    if ok:
        out["eagle"] = lambda: peer.TwoNodeGraph(x, K)
    elif not quiet:
        print(f"  eagle unavailable: {why}")
    out["numpy"] = lambda: NumpyGraph(x, K)
    return out


def make_sides(x):
    return build_sides(factories(x), "graph")


def check(x, sides):
    """All sides agree on grads['x'] and grads['k'] (and with the closed form)."""
    seed = np.ones_like(x)
    got = {}
    for name, s in sides.items():
        s.launch()
        got[name] = s.reverse(seed)
    want_x = 2 * x * K * np.cos(K * x * x)
    want_k = float(np.sum(x * x * np.cos(K * x * x)))
    lines = []
    for name, g in got.items():
        ok_x = np.allclose(g["x"], want_x, rtol=1e-12, atol=1e-14)
        ok_k = np.isclose(g["k"], want_k, rtol=1e-10)
        lines.append(f"{name}: x {'ok' if ok_x else 'MISMATCH'}, k={g['k']:.12g} "
                     f"{'ok' if ok_k else 'MISMATCH'}")
        if not (ok_x and ok_k):
            raise SystemExit(f"gradients disagree at n={x.shape[0]}: " + "; ".join(lines))
    return "; ".join(lines)


def breakdown_vkml(n):
    """vkml's launch and reverse against the same batched programs called directly: what the
    graph layer adds per launch and per node (medians, us)."""
    from vkml.graph.treesum import tree_sum
    x = np.linspace(0.1, 0.9, n)
    side = VkmlGraph(x, K)
    seed = np.ones(n)
    side.launch()
    side.reverse(seed)
    sq, wv = (node.op for node in side.g.nodes)
    k = side.g.cells[("wave", "k")]
    f_sq, f_wv = sq.batched().executable(n)[0], wv.batched().executable(n)[0]
    v_sq, v_wv = sq.batched_vjp()[0].executable(n)[0], wv.batched_vjp()[0].executable(n)[0]
    reps = 300 if n <= 10**3 else 30 if n <= 10**5 else 6

    def launch_only():
        side.g.launch()
        side.g.record.reversed = True          # let the next recording launch through, untimed

    fns = {
        "launch (2 nodes, recording)": launch_only,
        "  the 2 forward programs called directly": lambda: (f_sq([x]), f_wv([side.u, k])),
        "reverse (2 nodes)": lambda: side.reverse(seed),
        "  the 2 vjp programs called directly + tree_sum of k's cotangent":
            lambda: (v_wv([side.u, k, seed]), v_sq([x, seed]), tree_sum(seed)),
        "  tree_sum alone (canonical tree over n)": lambda: tree_sum(seed),
        "  np.sum alone (for scale)": lambda: np.sum(seed),
        "  one plane copy (for scale)": lambda: seed.copy(),
    }
    rows = {key: secs * 1e6 for key, secs in time_sides(fns, rounds=7, reps=reps).items()}
    print(f"\nbreakdown: vkml graph layer, n={n:,} (us, medians; the machine's load moves them)")
    w = max(len(key) for key in rows)
    for key, v in rows.items():
        print(f"  {key.ljust(w)}  {v:10.1f}")
    over_f = rows["launch (2 nodes, recording)"] - rows["  the 2 forward programs called directly"]
    over_r = rows["reverse (2 nodes)"] - \
        rows["  the 2 vjp programs called directly + tree_sum of k's cotangent"]
    print(f"  => graph-layer overhead: {over_f / 2:.1f} us per node per launch, "
          f"{over_r / 2:.1f} us per node per reverse")


def profile_vkml(n, launches=200):
    """cProfile of ``launches`` launch+reverse pairs of the vkml graph: where the time goes."""
    import cProfile
    import pstats
    x = np.linspace(0.1, 0.9, n)
    side = VkmlGraph(x, K)
    seed = np.ones(n)
    side.launch()
    side.reverse(seed)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(launches):
        side.launch()
        side.reverse(seed)
    prof.disable()
    print(f"\nprofile: vkml, n={n:,}, {launches} launch+reverse pairs (tottime, top 25)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def floor_line(n, rev):
    """The bytes a reverse must move at least -- read x, u and the seed, write the x gradient:
    4 planes of n float64 -- and the rate each side moved them at.  (At 10^6 samples these 32 MB
    fit a large last-level cache, and the reverse is bound by its n cosines, not by memory.)"""
    need = 4 * 8 * n
    parts = ", ".join(f"{k} {need / t / 1e9:.1f} GB/s" for k, t in rev.items())
    print(f"  floor: a reverse moves at least {need / 1e6:,.1f} MB (x, u, seed read; x gradient "
          f"written): {parts}")


def ab_workloads(quick):
    """vkml's side of this bench for ``bench/ab.py`` (one revision against another): name ->
    (phase names, sampler of a recording launch and its reverse).  Graph and Reverse are built
    once per size, as a training loop would."""
    out = {}
    for n in (10**3, 10**5) if quick else SIZES:
        side = VkmlGraph(np.linspace(0.1, 0.9, n), K)
        seed = np.ones(n)
        cycle(side, seed)                                  # programs compiled, buffers made
        out[f"two-node graph, {n:,} samples"] = (
            ("launch", "reverse"),
            sampler(side.launch, lambda side=side, seed=seed: side.reverse(seed),
                    reps=30 if n <= 10**3 else 5 if n <= 10**5 else 3))
    return out


def cycle(side, seed):
    side.launch()
    side.reverse(seed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1", help="threads per side (eagle OMP, VKML_THREADS)")
    ap.add_argument("--profile", action="store_true", help="also profile vkml at n=10^3 and 10^6")
    ap.add_argument("--sizes", default=None, help="sample counts, comma-separated (10^3,10^5,10^6)")
    ap.add_argument("--quick", action="store_true", help="10^3 and 10^5 samples, 5 rounds (seconds)")
    args = ap.parse_args()
    default = (10**3, 10**5) if args.quick else SIZES
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(default)
    rounds = 5 if args.quick else 7

    ok, why = peer.available()
    print(f"vkml graph reverse vs {'eagle (' + why + ')' if ok else 'eagle UNAVAILABLE: ' + why} "
          f"vs hand-written NumPy")
    print(f"{PINNED}; NumPy {np.__version__}")
    print(describe_vkml())
    summary = []
    for n in sizes:
        reps = (30 if args.quick else 200) if n <= 10**3 else (5 if args.quick else 30) \
            if n <= 10**5 else 6
        x = np.linspace(0.1, 0.9, n)
        sides = make_sides(x)
        print(f"\n== n = {n:,} samples  ({rounds} rounds of {reps} launch+reverse pairs per side after "
              f"a warm-up round, sides interleaved, min of the round medians; lower is better)")
        setup = ", ".join(f"{k} {s.setup_s * 1e3:,.0f} ms" for k, s in sides.items() if s.setup_s)
        print(f"  one-time setup (graph + Reverse; eagle's first includes its g++ compile or disk "
              f"cache): {setup}")
        print("  gradients: " + check(x, sides))
        seed = np.ones(n)
        fwd, rev = interleaved_pairs(sides, lambda s: s.launch(), lambda s: s.reverse(seed),
                                     rounds=rounds, reps=reps)
        mem_t, mem_r, foot_t, foot_r = {}, {}, {}, {}
        for name, s in sides.items():
            mem_t[name], mem_r[name] = peak_memory(s.launch, lambda s=s: s.reverse(seed))
        del sides
        for name, make in factories(x, quiet=True).items():
            foot_t[name], foot_r[name] = footprint(make, lambda s: cycle(s, seed))
        unit = "us" if n <= 10**5 else "ms"
        base = [b for b in ("eagle", "numpy") if b in fwd]
        print_table(f"  forward (recording launch), n={n:,}", list(fwd.items()), baselines=base,
                    unit=unit)
        print_table(f"  reverse (Reverse called on the launch's Record), n={n:,}", list(rev.items()),
                    baselines=base, unit=unit,
                    extra=[("call peak (tracemalloc)", {k: fmt_bytes(v) for k, v in mem_t.items()}),
                           ("call peak (RSS)", {k: fmt_bytes(v) for k, v in mem_r.items()}),
                           ("footprint (tracemalloc)", {k: fmt_bytes(v) for k, v in foot_t.items()}),
                           ("footprint (RSS)", {k: fmt_bytes(v) for k, v in foot_r.items()})])
        summary.append((n, fwd, rev, mem_t, foot_t))
        floor_line(n, rev)

    print("""
memory columns: 'call peak' = the most one reverse call allocates above what was held when it
started (a warmed side); 'footprint' = the peak from nothing through building the side (its u and
y planes, graph, Reverse) and two launch+reverse cycles -- it also counts what a side keeps between
calls (eagle's Reverse keeps its adjoint planes).  tracemalloc sees Python and NumPy allocations
(eagle's host planes are NumPy arrays); RSS is the resident high-water mark above the start
(VmHWM reset via /proc/self/clear_refs): it sees C++ mallocs too, but reads 0 when freed memory
is reused, so it is only meaningful for the big cases.""")
    print("\nsummary: ratios vkml/eagle and vkml/numpy (time, and memory by tracemalloc)")
    print(f"  {'n':>9}  {'fwd/eagle':>9}  {'fwd/numpy':>9}  {'rev/eagle':>9}  {'rev/numpy':>9}  "
          f"{'call-mem/eagle':>14}  {'footprint/eagle':>15}  {'footprint/numpy':>15}")
    for n, fwd, rev, mem_t, foot_t in summary:
        cells = [ratio(fwd["vkml"], fwd.get("eagle")), ratio(fwd["vkml"], fwd["numpy"]),
                 ratio(rev["vkml"], rev.get("eagle")), ratio(rev["vkml"], rev["numpy"]),
                 ratio(mem_t["vkml"], mem_t.get("eagle")), ratio(foot_t["vkml"], foot_t.get("eagle")),
                 ratio(foot_t["vkml"], foot_t["numpy"])]
        widths = [9, 9, 9, 9, 14, 15, 15]
        print(f"  {n:>9,}  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    if args.profile:
        for n in (10**3, 10**6):
            breakdown_vkml(n)
        profile_vkml(10**3)
        profile_vkml(10**6, launches=10)


if __name__ == "__main__":
    main()
