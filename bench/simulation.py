"""A recorded damped pendulum and its checkpointed reverse, side by side with raptor-eagle (CPU) and a
hand-written NumPy adjoint.

The model (the same on every side): semi-implicit Euler, dt = 0.01,

    omega' = omega + dt * (-(g / length) * sin(theta) - damping * omega)
    theta' = theta + dt * omega'
    t'     = t + dt,      terminated = t' >= t_end

with ``length`` = 1.2 and ``damping`` = 0.3 as Params (uniforms), g = 9.81, theta0 =
linspace(0.1, 1.0, n), omega0 = linspace(-0.5, 0.5, n), n = 10^4 samples, and t_end = (T - 1/2) dt so
that every sample stops at exactly T steps (T = 400 and 4000; the stop rule runs on every step but
does not stagger the samples).  Objective J = sum(theta_T) + 0.5 sum(omega_T): seeds ``theta`` = 1,
``omega`` = 0.5; gradients wrt theta0, omega0 (per sample), length and damping (summed).

- ``vkml``:  ``vkml.simulation(kernel, max_steps=T, record=True)`` (default window,
  clamp(ceil(sqrt(T)), 16, 1024): 20 and 64), ``vkml.diff.Reverse(sim)`` built once;
- ``eagle``: ``eagle.simulation(hawk kernel, max_steps=T, record=True)`` (its default window, the
  same formula), ``eagle.diff.Reverse(sim)`` built once;
- ``numpy``: forward storing every state ((T+1) x n for theta and omega), then the adjoint loop
  written by hand (it does not track ``t``: every sample runs T steps).

Per run, the forward and the reverse are timed separately, as pairs; the sides are interleaved in
rounds (so load from elsewhere hits them alike), each time the minimum over rounds of a round's
median (``_timing.py`` says why), and the state planes are reset between runs, untimed.
Memory, in a separate untimed pass per side, from nothing (see the notes the script prints): what
the Record holds, what the side holds after building and running, the peak one reverse call
allocates, and the total peak through build and two run+reverse cycles -- by
``tracemalloc`` (Python and NumPy allocations; eagle's host planes are NumPy arrays, mallocs inside
its C++ are not seen) and by the resident-set high-water mark (``VmHWM`` reset through
``/proc/self/clear_refs``; counts everything, at page granularity).

Gradients of the three sides are checked to agree (``allclose``) before anything is timed.
Threads: one per side by default, the process pinned to one CPU (``--threads N``: N, unpinned).
``--profile`` also prints where vkml's time goes (a per-step breakdown of forward and reverse,
and cProfile).  ``VKML_BACKEND=cpu`` runs vkml's side on the compiled CPU tier.

Run: ``python bench/simulation.py`` (about a minute on 2 cores; ``--steps 400`` for the small case;
``--quick``: T = 400 only, 5 rounds of 2).  eagle is optional: without it, its rows are left out.

``ab_workloads`` hands vkml's side alone to ``bench/ab.py`` (one revision against another).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_seconds, pin_from_argv, print_table, sampler  # noqa: E402

if __name__ == "__main__":        # before NumPy/eagle load OpenMP (libgomp reads it at load)
    PINNED = pin_from_argv()

import numpy as np  # noqa: E402

import _eagle_peer as peer  # noqa: E402  (after the thread count is set)
from graph_reverse import (_reset_hwm, _rss_kib, describe_vkml, fmt_bytes,  # noqa: E402
                           interleaved_pairs, ratio)

import vkml  # noqa: E402
from _models import DAMPING, DT, GRAVITY, LENGTH, build_sides, pendulum  # noqa: E402

N = 10**4
STEPS = (400, 4000)
SEED_THETA, SEED_OMEGA = 1.0, 0.5


def t_end_for(steps):
    return (steps - 0.5) * DT


# -- the three sides --------------------------------------------------------------------------------

class VkmlPendulum:
    def __init__(self, theta0, omega0, steps, window=None):
        t0 = time.perf_counter()
        self.theta0, self.omega0 = theta0, omega0
        self.theta, self.omega, self.t = theta0.copy(), omega0.copy(), np.zeros_like(theta0)
        self.sim = vkml.simulation(pendulum, max_steps=steps, record=True, window=window,
                                   theta=self.theta, omega=self.omega, t=self.t, length=LENGTH,
                                   damping=DAMPING, t_end=t_end_for(steps))
        self.rev = vkml.diff.Reverse(self.sim)
        self.setup_s = time.perf_counter() - t0

    def reset(self):
        self.theta[...] = self.theta0
        self.omega[...] = self.omega0
        self.t[...] = 0.0

    def run(self):
        self.sim.run()

    def reverse(self, seeds):
        grads = self.rev(self.sim.record, seeds)
        out = {k: grads[k] for k in ("theta", "omega")}
        out.update({k: float(np.ravel(grads[k])[0]) for k in ("length", "damping")})
        out["_report"] = grads.report
        return out

    @property
    def steps(self):
        return int(self.sim.record.steps.max())

    @property
    def record_nbytes(self):
        return int(self.sim.record.nbytes)

    @property
    def window(self):
        return self.sim.window


class NumpyPendulum:
    """Forward keeping every state; the adjoint of each step written by hand, newest first."""

    def __init__(self, theta0, omega0, steps):
        self.theta0, self.omega0, self.T = theta0, omega0, steps
        self.setup_s = 0.0
        self.th = self.om = None

    def reset(self):
        self.th = self.om = None                 # a run allocates its own tape

    def run(self):
        T, n = self.T, self.theta0.shape[0]
        th = np.empty((T + 1, n))
        om = np.empty((T + 1, n))
        th[0], om[0] = self.theta0, self.omega0
        a, b = -DT * GRAVITY / LENGTH, 1.0 - DT * DAMPING
        for i in range(T):
            o = om[i + 1]
            np.sin(th[i], out=o)
            o *= a
            o += b * om[i]
            np.add(th[i], DT * o, out=th[i + 1])
        self.th, self.om = th, om

    def reverse(self, seeds):
        th, om, T = self.th, self.om, self.T
        a_th = np.array(seeds["theta"], dtype=np.float64)
        a_om = np.array(seeds["omega"], dtype=np.float64)
        g_len = np.zeros_like(a_th)
        g_damp = np.zeros_like(a_th)
        c_th = -DT * GRAVITY / LENGTH             # d omega'/d theta = c_th cos(theta)
        c_len = DT * GRAVITY / LENGTH ** 2        # d omega'/d length = c_len sin(theta)
        b = 1.0 - DT * DAMPING
        for i in range(T - 1, -1, -1):
            a_om += DT * a_th                     # theta' = theta + dt omega'
            g_len += a_om * (c_len * np.sin(th[i]))
            g_damp -= a_om * (DT * om[i])
            a_th += a_om * (c_th * np.cos(th[i]))
            a_om *= b
        return {"theta": a_th, "omega": a_om, "length": float(g_len.sum()),
                "damping": float(g_damp.sum())}

    @property
    def steps(self):
        return self.T

    @property
    def record_nbytes(self):
        return 0 if self.th is None else self.th.nbytes + self.om.nbytes


def factories(steps, quiet=False):
    """A constructor per side (eagle left out, with the reason printed, if it is unavailable)."""
    theta0 = np.linspace(0.1, 1.0, N)
    omega0 = np.linspace(-0.5, 0.5, N)
    out = {"vkml": lambda: VkmlPendulum(theta0, omega0, steps)}
    ok, why = peer.available()
    if ok:
        out["eagle"] = lambda: peer.Pendulum(theta0, omega0, length=LENGTH, damping=DAMPING,
                                             t_end=t_end_for(steps), max_steps=steps, dt=DT,
                                             gravity=GRAVITY)
    elif not quiet:
        print(f"  eagle unavailable: {why}")
    out["numpy"] = lambda: NumpyPendulum(theta0, omega0, steps)
    return out


def make_sides(steps):
    return build_sides(factories(steps), "simulation")


def seeds_for():
    return {"theta": np.full(N, SEED_THETA), "omega": np.full(N, SEED_OMEGA)}


def check(sides, steps):
    got, reports = {}, {}
    for name, s in sides.items():
        s.reset()
        s.run()
        if s.steps != steps:
            raise SystemExit(f"{name} ran {s.steps} steps, expected {steps}")
        got[name] = s.reverse(seeds_for())
        reports[name] = got[name].pop("_report", None)
    ref = got["numpy"]
    lines = []
    for name, g in got.items():
        bad = [k for k in ("theta", "omega") if not np.allclose(g[k], ref[k], rtol=1e-9, atol=1e-12)]
        bad += [k for k in ("length", "damping") if not np.isclose(g[k], ref[k], rtol=1e-9)]
        lines.append(f"{name}: {'ok' if not bad else 'MISMATCH ' + ','.join(bad)} "
                     f"(dJ/dlength={g['length']:.10g}, dJ/ddamping={g['damping']:.10g})")
        if bad:
            raise SystemExit(f"gradients disagree at T={steps}: " + "; ".join(lines))
    return lines, reports


def memory(make):
    """Memory of one side from nothing, by tracemalloc (and the RSS high-water mark):

    - ``record``: what the run's Record holds (``record.nbytes``; NumPy: its stored states);
    - ``held``: traced memory after build + run, above the start (Record, checkpoints, anything the
      side allocated and kept -- eagle allocates its checkpoint planes when it is built);
    - ``rev``: the peak one reverse allocates above what was held when it started (second cycle,
      so lazily made buffers that a side keeps are in ``held``);
    - ``total`` / ``rss``: the peak from nothing through build and two run+reverse cycles.
    """
    seeds = seeds_for()
    gc.collect()
    rss_ok = _reset_hwm()
    rss0 = _rss_kib("VmRSS")
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    try:
        side = make()
        side.reset()
        side.run()
        side.reverse(seeds)
        side.reset()
        side.run()
        gc.collect()
        held, total = tracemalloc.get_traced_memory()
        record = side.record_nbytes
        tracemalloc.reset_peak()
        side.reverse(seeds)
        _, peak_rev = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    hwm = _rss_kib("VmHWM")
    del side
    gc.collect()
    return {"record": record, "held": held - base, "rev": peak_rev - held,
            "total": max(total, peak_rev) - base, "rss": (hwm - rss0) * 1024 if rss_ok else None}


def _med_us(fn, repeat, warmup=5):
    return median_seconds(fn, repeat=repeat, warmup=warmup) * 1e6


def breakdown_vkml(steps):
    """Per-step cost of vkml's pieces against the hand-written NumPy step (medians, us)."""
    from vkml.graph.execute import run_batched
    from vkml.graph.simulation.host_steps import HostSteps
    side = make_sides(steps)["vkml"]
    seeds = seeds_for()
    side.reset()
    side.run()
    side.reverse(seeds)
    sim, launch = side.sim, side.sim.launch
    n = N
    theta, omega, t = np.linspace(0.1, 1.0, n), np.linspace(-0.5, 0.5, n), np.zeros(n)
    params = [launch.params[p] for p in launch.kernel.params]
    fwd_exe, _ = launch.batched().executable(n)
    vjp_batch, _ = launch.batched_vjp()
    vjp_exe, _ = vjp_batch.executable(n)
    cts = [np.ones(n), np.ones(n), np.ones(n), np.zeros(n, bool)]
    state, active = {"theta": theta, "omega": omega, "t": t}, np.ones(n, bool)
    r = 300
    rows = {
        "forward program alone (one launch of the batched kernel)":
            _med_us(lambda: fwd_exe([theta, omega, t] + params), r),
        "  + run_batched / backend submission":
            _med_us(lambda: run_batched(launch.batched(), n, [theta, omega, t] + params,
                                        [True] * 3 + [False] * 3), r),
        "  = HostSteps.step (+ np.where per state, stop mask, counters)":
            _med_us(lambda: HostSteps(sim).step(state, {}, active), r),
        "vjp program alone": _med_us(lambda: vjp_exe([theta, omega, t] + params + cts), r),
    }
    # one reverse with its two inner calls timed in place: the rest is back_step's own bookkeeping
    vsim = sys.modules["vkml.graph.simulation.host_steps"]
    spent = {"vjp": [], "advance": [], "total": []}
    inner_vjp, inner_adv = vsim.reverse_launch, vsim.HostSteps.advance

    def timed(key, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key][-1] += time.perf_counter() - t0
        return wrapper

    vsim.reverse_launch = timed("vjp", inner_vjp)
    vsim.HostSteps.advance = timed("advance", inner_adv)
    try:
        for _ in range(7):
            for v in spent.values():
                v.append(0.0)
            t0 = time.perf_counter()
            side.reverse(seeds)
            spent["total"][-1] = time.perf_counter() - t0
    finally:
        vsim.reverse_launch, vsim.HostSteps.advance = inner_vjp, inner_adv
    i = int(np.argsort(spent["total"])[len(spent["total"]) // 2])     # the median run, split
    per = {k: v[i] / steps * 1e6 for k, v in spent.items()}
    rows["reverse, per step (all of it; median of 7)"] = per["total"]
    rows["  recomputing windows (Simulation._advance)"] = per["advance"]
    rows["  the vjp launch (reverse_launch: run_batched of the vjp program)"] = per["vjp"]
    rows["  rest: back_step bookkeeping (np.where on cts/states/params, zeros, accumulation)"] = \
        per["total"] - per["advance"] - per["vjp"]
    hand = NumpyPendulum(theta, omega, steps)
    hand.reset()
    hand.run()
    rows["numpy hand-written: forward step"] = _med_us(hand.run, 3, warmup=1) / steps
    rows["numpy hand-written: backward step"] = _med_us(lambda: hand.reverse(seeds), 3, warmup=1) / steps
    print(f"\nbreakdown: vkml per step, n={N:,}, T={steps} (us, medians; the machine's load moves them)")
    w = max(len(k) for k in rows)
    for k, v in rows.items():
        print(f"  {k.ljust(w)}  {v:8.1f}")


def profile_vkml(steps):
    import cProfile
    import pstats
    side = make_sides(steps)["vkml"]
    seeds = seeds_for()
    side.reset()
    side.run()
    side.reverse(seeds)
    side.reset()
    prof = cProfile.Profile()
    prof.enable()
    side.run()
    prof.disable()
    print(f"\nprofile: vkml forward, n={N:,}, T={steps} (tottime, top 20)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    prof = cProfile.Profile()
    prof.enable()
    side.reverse(seeds)
    prof.disable()
    print(f"\nprofile: vkml reverse, n={N:,}, T={steps} (tottime, top 25)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def ab_workloads(quick):
    """vkml's side of this bench, built and checked: name -> (phase names, sampler of a recorded
    run and its reverse, the state planes reset untimed before each pair)."""
    out = {}
    for steps in (STEPS[0],) if quick else STEPS:
        side = VkmlPendulum(np.linspace(0.1, 1.0, N), np.linspace(-0.5, 0.5, N), steps)
        seeds = seeds_for()
        out[f"recorded pendulum {N:,} x {steps} steps"] = (
            ("run", "reverse"),
            sampler(side.run, lambda side=side: side.reverse(seeds),
                    reps=1 if steps > 400 else 2 if quick else 3,
                    between=lambda side=side: (side.reset(), gc.collect())))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1", help="threads per side (eagle OMP, VKML_THREADS)")
    ap.add_argument("--profile", action="store_true", help="also profile vkml at T=400")
    ap.add_argument("--steps", default=None, help="steps per run, comma-separated (400,4000)")
    ap.add_argument("--quick", action="store_true", help="T = 400 only, 5 rounds of 2 (seconds)")
    args = ap.parse_args()
    steps_list = [int(s) for s in args.steps.split(",")] if args.steps else \
        [STEPS[0]] if args.quick else list(STEPS)
    ok, why = peer.available()
    print(f"recorded damped pendulum, n={N:,} samples: vkml vs "
          f"{'eagle (' + why + ')' if ok else 'eagle UNAVAILABLE: ' + why} vs hand-written NumPy")
    print(f"{PINNED}; NumPy {np.__version__}")
    print(describe_vkml())
    info = vkml.backend_info()
    if "simulation vector math" in info:           # the cpu tier: scalar libm or libmvec
        print(f"cpu tier simulation loops' vector math (VKML_VECTOR_MATH): {info['simulation vector math']}")
    summary = []
    for steps in steps_list:
        rounds, reps = (3, 1) if steps > 400 else (5, 2)
        sides = make_sides(steps)
        print(f"\n== T = {steps} steps  ({rounds} rounds of {reps} run+reverse pair(s) per side after "
              "a warm-up round, sides interleaved, min of the round medians; lower is better)")
        setup = ", ".join(f"{k} {s.setup_s * 1e3:,.0f} ms" for k, s in sides.items() if s.setup_s)
        print(f"  one-time setup (simulation + Reverse; eagle's first includes its g++ compile or disk "
              f"cache): {setup}")
        lines, reports = check(sides, steps)
        print("  gradients agree (rtol 1e-9 against NumPy): " + "; ".join(lines))
        for name, rep in reports.items():
            if rep is not None:
                print(f"  {name} (window {sides[name].window}): {rep!r}")
        seeds = seeds_for()
        fwd, rev = interleaved_pairs(sides, lambda s: s.run(), lambda s: s.reverse(seeds),
                                     rounds=rounds, reps=reps,
                                     between=lambda s: (s.reset(), gc.collect()))
        del sides
        mem = {name: memory(make) for name, make in factories(steps, quiet=True).items()}
        base = [b for b in ("eagle", "numpy") if b in fwd]
        per_step = {k: f"{v / steps * 1e6:,.1f}" for k, v in fwd.items()}
        print_table(f"  forward run (recorded), T={steps}", list(fwd.items()), baselines=base,
                    unit="ms", extra=[("us/step", per_step),
                                      ("record holds", {k: fmt_bytes(m["record"]) for k, m in mem.items()}),
                                      ("held after run", {k: fmt_bytes(m["held"]) for k, m in mem.items()})])
        per_step = {k: f"{v / steps * 1e6:,.1f}" for k, v in rev.items()}
        print_table(f"  reverse, T={steps}", list(rev.items()), baselines=base, unit="ms",
                    extra=[("us/step", per_step),
                           ("reverse call peak", {k: fmt_bytes(m["rev"]) for k, m in mem.items()}),
                           ("total peak", {k: fmt_bytes(m["total"]) for k, m in mem.items()}),
                           ("total peak (RSS)", {k: fmt_bytes(m["rss"]) for k, m in mem.items()})])
        summary.append((steps, fwd, rev, mem))

    print("""
memory (tracemalloc unless marked RSS): 'record holds' = record.nbytes (NumPy: its stored states);
'held after run' = everything a side holds after building it and running once, above nothing
(eagle allocates its checkpoint and window planes when the simulation is built and keeps them);
'reverse call peak' = the most one reverse allocates above what was held when it started;
'total peak' = the peak from nothing through build and two run+reverse cycles.  RSS = resident
high-water mark above the start (VmHWM reset via /proc/self/clear_refs; sees C++ mallocs too).""")
    print("\nsummary: ratios vkml/eagle and vkml/numpy (time; memory = total peak by tracemalloc)")
    print(f"  {'T':>5}  {'fwd/eagle':>9}  {'fwd/numpy':>9}  {'rev/eagle':>9}  {'rev/numpy':>9}  "
          f"{'mem/eagle':>9}  {'mem/numpy':>9}")
    for steps, fwd, rev, mem in summary:
        tot = {k: m["total"] for k, m in mem.items()}
        cells = [ratio(fwd["vkml"], fwd.get("eagle")), ratio(fwd["vkml"], fwd["numpy"]),
                 ratio(rev["vkml"], rev.get("eagle")), ratio(rev["vkml"], rev["numpy"]),
                 ratio(tot["vkml"], tot.get("eagle")), ratio(tot["vkml"], tot["numpy"])]
        print(f"  {steps:>5}  " + "  ".join(c.rjust(9) for c in cells))
    if args.profile:
        breakdown_vkml(400)
        profile_vkml(400)


if __name__ == "__main__":
    main()
