"""The compiled CPU tier side by side with JAX and NumPy (issue "A compiled CPU tier").

1. ``value_and_grad`` of the seed's running-sum scan, 10^4 and 10^5 rows: vkml on the ``cpu`` tier
   (and the ``numpy`` backend for reference) against ``jax.value_and_grad`` of a jitted ``lax.scan``.
2. A damped pendulum integrated with RK4 over 10^4 steps inside a scan, gradient of the final angle
   with respect to the length, damping and initial state, at batch 1 and batch 1024, against JAX.
3. A chain of 1000 elementwise ops on a 16-element array: time per op on the cpu tier (one fused
   loop), the numpy backend and plain NumPy, against NumPy's ~0.26 us dispatch floor.

All on one thread; medians after warm-up (compiles excluded).  Ratios are vkml / peer.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_seconds, print_table  # noqa: E402

import vkml  # noqa: E402

try:
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
except ImportError:  # pragma: no cover - optional peer
    jax = None


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


def section_scan():
    for n in (10_000, 100_000):
        xs = np.random.default_rng(0).normal(size=n)
        rows = []
        for backend in ("cpu", "numpy"):
            if backend == "numpy" and n > 10_000:
                continue
            vkml.set_backend(backend)
            vg = vkml.value_and_grad(vkml.jit(running_sum(vkml, vkml.scan)))
            vg(xs)
            rows.append((f"vkml {backend}", median_seconds(lambda: vg(xs)[1].numpy(),
                                                           repeat=20 if backend == "cpu" else 3,
                                                           warmup=2)))
        if jax:
            jvg = jax.jit(jax.value_and_grad(running_sum(jnp, jax.lax.scan)))
            jxs = jnp.asarray(xs)
            jvg(jxs)[1].block_until_ready()
            rows.append(("jax", median_seconds(lambda: jvg(jxs)[1].block_until_ready(), repeat=50,
                                               warmup=3)))
        print_table(f"seed scan value_and_grad, {n:,} rows", rows, baselines=["jax"], unit="ms")
        print("  per row: " + ", ".join(f"{k} {s / n * 1e9:,.1f} ns" for k, s in rows) + "\n")


def section_pendulum():
    steps = 10_000
    for batch in (1, 1024):
        rng = np.random.default_rng(1)
        params = np.array([1.0, 0.1])
        th0, om0 = rng.uniform(0.2, 1.0, batch), np.zeros(batch)
        rows = []
        vkml.set_backend("cpu")
        g = vkml.grad(vkml.jit(pendulum_loss(vkml, vkml.scan, steps)), argnums=(0, 1, 2))
        gv = [t.numpy() for t in g(params, th0, om0)]
        rows.append(("vkml cpu", median_seconds(lambda: [t.numpy() for t in g(params, th0, om0)],
                                                repeat=5, warmup=1)))
        if jax:
            jg = jax.jit(jax.grad(pendulum_loss(jnp, jax.lax.scan, steps), argnums=(0, 1, 2)))
            args = (jnp.asarray(params), jnp.asarray(th0), jnp.asarray(om0))
            jgv = [np.asarray(t) for t in jg(*args)]
            for a, b in zip(gv, jgv):
                np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)
            rows.append(("jax", median_seconds(lambda: [t.block_until_ready() for t in jg(*args)],
                                               repeat=10, warmup=2)))
        print_table(f"damped pendulum RK4, gradient over {steps:,} steps, batch {batch}", rows,
                    baselines=["jax"], unit="ms")
        print("  per step: " + ", ".join(f"{k} {s / steps * 1e6:,.2f} us" for k, s in rows) + "\n")


def section_chain():
    x0 = np.linspace(0.1, 1.0, 16)
    n_ops = 1000

    def chain(lib):
        def f(x):
            for i in range(n_ops // 2):
                x = x * 1.0001
                x = x + 0.0001
            return x
        return f

    rows = []
    for backend in ("cpu", "numpy"):
        vkml.set_backend(backend)
        f = vkml.jit(chain(vkml))
        t = vkml.tensor(x0)
        f(t)
        f(t)
        rows.append((f"vkml {backend} (jit)", median_seconds(lambda: f(t).numpy(), repeat=30, warmup=3)))
    plain = chain(np)
    rows.append(("numpy", median_seconds(lambda: plain(x0), repeat=30, warmup=3)))
    vkml.set_backend("numpy")
    print_table(f"a chain of {n_ops} elementwise ops on a 16-element array", rows,
                baselines=["numpy"], unit="us")
    print("  per op: " + ", ".join(f"{k} {s / n_ops * 1e9:,.1f} ns" for k, s in rows)
          + "  (NumPy's dispatch floor is about 260 ns per call)\n")


def main():
    print(f"vkml {vkml.__version__}; one thread; jax {'present' if jax else 'missing'}\n")
    section_chain()
    section_scan()
    section_pendulum()


if __name__ == "__main__":
    main()
