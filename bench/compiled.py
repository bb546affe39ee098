"""The compiled CPU tier side by side with JAX and NumPy (issue "A compiled CPU tier").

1. ``value_and_grad`` of the tutorial's running-sum scan, 10^3 to 10^6 rows (the cost per row should
   be flat): vkml on the ``cpu`` tier (and the ``numpy`` backend for reference, up to 10^4 rows)
   against ``jax.value_and_grad`` of a jitted ``lax.scan``.
2. A damped pendulum integrated with RK4 over 10^4 steps inside a scan, gradient of the final angle
   with respect to the length, damping and initial state, at batch 1 and batch 1024, against JAX.
3. A chain of 1000 elementwise ops on a 16-element array: time per op on the cpu tier (one fused
   loop), the numpy backend and plain NumPy, against NumPy's ~0.26 us dispatch floor.

One thread, the process pinned to one CPU; the sides interleaved in rounds, each side's time the
minimum over rounds of its per-round median (``_timing.py`` says why); compiles happen before
anything is timed.  Ratios are vkml / peer.  JAX is optional: without it its rows are left out.

    python bench/compiled.py [--quick]     (--quick: 10^4 rows, 10^3 pendulum steps, fewer rounds)

``ab_workloads`` hands vkml's sides alone to ``bench/ab.py`` (one revision against another).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleave, pin, print_table, sampler  # noqa: E402

if __name__ == "__main__":        # before NumPy and JAX load their thread pools
    PINNED = pin()

import numpy as np  # noqa: E402

import vkml  # noqa: E402

try:
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
except ImportError:  # optional peer
    jax = None

#: sizes, rounds of the interleaving and repetitions per round; --quick takes the second
FULL = {"rows": (1_000, 10_000, 100_000, 1_000_000), "steps": 10_000, "rounds": 7}
QUICK = {"rows": (10_000,), "steps": 1_000, "rounds": 5}


def running_sum(lib, scan):
    def body(xs):
        def step(acc, row):
            nxt = acc + row
            return nxt, nxt
        _, sums = scan(step, np.float64(0.0), xs)
        return lib.sum(sums * sums)
    return body


DT = 0.001


def pendulum_loss(lib, scan, steps):
    """Final angle summed over the batch after ``steps`` RK4 steps; params = (length, damping)."""
    def f(params, theta0, omega0):
        length, damping = params[0], params[1]

        def deriv(th, om):
            return om, -9.81 / length * lib.sin(th) - damping * om

        def step(carry, _):
            th, om = carry
            k1t, k1o = deriv(th, om)
            k2t, k2o = deriv(th + 0.5 * DT * k1t, om + 0.5 * DT * k1o)
            k3t, k3o = deriv(th + 0.5 * DT * k2t, om + 0.5 * DT * k2o)
            k4t, k4o = deriv(th + DT * k3t, om + DT * k3o)
            th = th + DT / 6.0 * (k1t + 2.0 * k2t + 2.0 * k3t + k4t)
            om = om + DT / 6.0 * (k1o + 2.0 * k2o + 2.0 * k3o + k4o)
            return (th, om), None
        (th, om), _ = scan(step, (theta0, omega0), None, length=steps)
        return lib.sum(th)
    return f


def on(backend, fn, reps):
    """A sampler of a vkml side: its backend selected (untimed) before every repetition."""
    return sampler(fn, reps=reps, between=lambda: vkml.set_backend(backend))


def vkml_scan(backend, xs):
    vkml.set_backend(backend)
    vg = vkml.value_and_grad(vkml.jit(running_sum(vkml, vkml.scan)))
    return lambda: vg(xs)[1].numpy()


def vkml_pendulum(steps, params, th0, om0):
    vkml.set_backend("cpu")
    g = vkml.grad(vkml.jit(pendulum_loss(vkml, vkml.scan, steps)), argnums=(0, 1, 2))
    return lambda: [t.numpy() for t in g(params, th0, om0)]


N_OPS = 1000


def chain(lib):
    def f(x):
        for _ in range(N_OPS // 2):
            x = x * 1.0001
            x = x + 0.0001
        return x
    return f


def vkml_chain(backend, x0):
    vkml.set_backend(backend)
    f = vkml.jit(chain(vkml))
    t = vkml.tensor(x0)
    return lambda: f(t).numpy()


def pendulum_inputs(batch):
    rng = np.random.default_rng(1)
    return np.array([1.0, 0.1]), rng.uniform(0.2, 1.0, batch), np.zeros(batch)


def section_scan(cfg):
    for n in cfg["rows"]:
        xs = np.random.default_rng(0).normal(size=n)
        sides = {"vkml cpu": on("cpu", vkml_scan("cpu", xs), reps=10)}
        if n <= 10_000:
            sides["vkml numpy"] = on("numpy", vkml_scan("numpy", xs), reps=2)
        if jax:
            jvg = jax.jit(jax.value_and_grad(running_sum(jnp, jax.lax.scan)))
            jxs = jnp.asarray(xs)
            sides["jax"] = sampler(lambda: jvg(jxs)[1].block_until_ready(), reps=10)
        rows = [(k, v[0]) for k, v in interleave(sides, rounds=cfg["rounds"]).items()]
        print_table(f"running-sum scan value_and_grad, {n:,} rows", rows, baselines=["jax"], unit="ms")
        print("  per row: " + ", ".join(f"{k} {s / n * 1e9:,.1f} ns" for k, s in rows) + "\n")


def section_pendulum(cfg):
    steps = cfg["steps"]
    for batch in (1, 1024):
        params, th0, om0 = pendulum_inputs(batch)
        vk = vkml_pendulum(steps, params, th0, om0)
        reps = 20 if batch == 1 else 1         # a call at batch 1024 takes seconds
        sides = {"vkml cpu": on("cpu", vk, reps=reps)}
        if jax:
            jg = jax.jit(jax.grad(pendulum_loss(jnp, jax.lax.scan, steps), argnums=(0, 1, 2)))
            args = (jnp.asarray(params), jnp.asarray(th0), jnp.asarray(om0))
            for a, b in zip(vk(), (np.asarray(t) for t in jg(*args))):
                np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)
            sides["jax"] = sampler(lambda: [t.block_until_ready() for t in jg(*args)], reps=reps)
        rows = [(k, v[0]) for k, v in interleave(sides, rounds=cfg["rounds"]).items()]
        print_table(f"damped pendulum RK4, gradient over {steps:,} steps, batch {batch}", rows,
                    baselines=["jax"], unit="ms")
        print("  per step: " + ", ".join(f"{k} {s / steps * 1e6:,.2f} us" for k, s in rows) + "\n")


def section_chain(cfg):
    x0 = np.linspace(0.1, 1.0, 16)
    plain = chain(np)
    sides = {f"vkml {b} (jit)": on(b, vkml_chain(b, x0), reps=20) for b in ("cpu", "numpy")}
    sides["numpy"] = sampler(lambda: plain(x0), reps=20)
    rows = [(k, v[0]) for k, v in interleave(sides, rounds=cfg["rounds"]).items()]
    vkml.set_backend("numpy")
    print_table(f"a chain of {N_OPS} elementwise ops on a 16-element array", rows,
                baselines=["numpy"], unit="us")
    print("  per op: " + ", ".join(f"{k} {s / N_OPS * 1e9:,.1f} ns" for k, s in rows)
          + "  (NumPy's dispatch floor is about 260 ns per call)\n")


def ab_workloads(quick):
    """vkml's sides of this bench, built and warmed: name -> (phase names, sampler)."""
    cfg = QUICK if quick else FULL
    x0 = np.linspace(0.1, 1.0, 16)
    out = {f"chain {N_OPS} ops, {b}": (("jit call",), on(b, vkml_chain(b, x0), reps=20))
           for b in ("cpu", "numpy")}
    n = cfg["rows"][-1]
    xs = np.random.default_rng(0).normal(size=n)
    out[f"scan grad {n:,} rows, cpu"] = (("value_and_grad",), on("cpu", vkml_scan("cpu", xs), reps=10))
    for batch in (1, 1024):
        fn = vkml_pendulum(cfg["steps"], *pendulum_inputs(batch))
        out[f"RK4 pendulum {cfg['steps']:,} steps, batch {batch}, cpu"] = (
            ("grad",), on("cpu", fn, reps=20 if batch == 1 else 1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and fewer rounds (seconds)")
    cfg = QUICK if ap.parse_args().quick else FULL
    print(f"vkml {vkml.__version__}; {PINNED}; jax {jax.__version__ if jax else 'missing (skipped)'}; "
          f"{cfg['rounds']} rounds\n")
    section_chain(cfg)
    section_scan(cfg)
    section_pendulum(cfg)


if __name__ == "__main__":
    main()
