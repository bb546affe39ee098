"""The gradient of the tutorial's running-sum scan and the per-call overhead of a jitted function, side by side with JAX and PyTorch.

1. ``value_and_grad`` of f(xs) = sum(running_sum(xs)**2) for 10^3, 10^4, 10^5 rows:
   vkml (jit + scan, derived programs cached), JAX (``jax.value_and_grad`` of a jitted
   ``lax.scan``, timed after compilation) and PyTorch CPU eager (a Python loop, autograd).
2. Per-call overhead of a jitted tiny function (add two 4-element arrays), vkml against ``jax.jit``,
   both with their own array types as inputs (and with NumPy inputs).

Run: ``scripts/dev bench`` (or ``python bench/scan_grad.py [--quick] [--parts]``; ``--quick``:
10^3 and 10^4 rows, fewer rounds; full: 10^3 to 10^6 rows; ``--parts``: where a tiny call's time
goes, stage by stage).  One thread, the process pinned to one CPU; the sides interleaved in rounds,
each side's time the minimum over rounds of its per-round median (``_timing.py`` says why).  Ratios
are vkml's time over the peer's (below 1 means vkml is faster).  JAX and PyTorch are optional:
a missing one is skipped with a note.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_seconds, pin, print_table, time_sides  # noqa: E402

if __name__ == "__main__":        # before NumPy, JAX and torch load their thread pools
    PINNED = pin()

import numpy as np  # noqa: E402

import vkml  # noqa: E402


def vkml_scan_grad():
    def body(xs):
        def step(acc, row):
            nxt = acc + row
            return nxt, nxt
        _, sums = vkml.scan(step, np.float64(0.0), xs)
        return vkml.sum(sums * sums)
    vg = vkml.value_and_grad(vkml.jit(body))
    return lambda xs: vg(xs)[1].numpy()


def jax_scan_grad():
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)

    def body(xs):
        def step(acc, row):
            nxt = acc + row
            return nxt, nxt
        _, sums = jax.lax.scan(step, jnp.float64(0.0), xs)
        return jnp.sum(sums * sums)
    vg = jax.jit(jax.value_and_grad(body))
    return lambda xs: vg(xs)[1].block_until_ready(), jnp


def torch_scan_grad():
    import torch
    torch.set_num_threads(1)

    def run(xs_np):
        xs = torch.tensor(xs_np, requires_grad=True)
        acc = torch.zeros((), dtype=torch.float64)
        sums = []
        for row in xs:
            acc = acc + row
            sums.append(acc)
        s = torch.stack(sums)
        (s * s).sum().backward()
        return xs.grad
    return run


def optional(make):
    try:
        return make()
    except ImportError as err:
        print(f"  ({make.__name__}: skipped, {err})")
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10^3 and 10^4 rows, fewer rounds (seconds)")
    ap.add_argument("--parts", action="store_true", help="split a tiny call's time into its stages")
    options = ap.parse_args()
    quick = options.quick
    rounds = 5 if quick else 7
    print(f"vkml {vkml.__version__}, backend {vkml.backend_info()['backend']}; {PINNED}; "
          f"{rounds} rounds\n")
    vk = vkml_scan_grad()
    jx = optional(jax_scan_grad)
    th = optional(torch_scan_grad)
    for n in (1_000, 10_000) if quick else (1_000, 10_000, 100_000, 1_000_000):
        xs = np.random.default_rng(0).normal(size=n)
        want = 2 * np.cumsum(np.cumsum(xs)[::-1])[::-1]
        np.testing.assert_allclose(vk(xs), want, rtol=1e-9)
        sides = {"vkml": lambda: vk(xs)}
        if jx:
            jfun, jnp = jx
            jxs = jnp.asarray(xs)
            np.testing.assert_allclose(np.asarray(jfun(jxs)), want, rtol=1e-9)
            sides["jax"] = lambda: jfun(jxs)
        if th and n <= 10_000:
            sides["torch eager"] = lambda: th(xs)
        rows = list(time_sides(sides, rounds=rounds, reps=max(3, 30_000 // n)).items())
        print_table(f"value_and_grad of the tutorial's running-sum scan, {n:,} rows",
                    rows, baselines=[r[0] for r in rows[1:]], unit="ms")
        per_row = {name: f"{secs / n * 1e9:,.0f} ns" for name, secs in rows}
        print("  per row: " + ", ".join(f"{k} {v}" for k, v in per_row.items()) + "\n")

    # per-call overhead of a jitted tiny function
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, dtype=np.float32)
    f = vkml.jit(lambda x, y: x + y)
    ta, tb = vkml.tensor(a), vkml.tensor(b)
    assert f(ta, tb).numpy().tolist() == [1, 2, 3, 4]
    sides = {"vkml (Tensor args)": lambda: f(ta, tb), "vkml (NumPy args)": lambda: f(a, b)}
    if jx:
        import jax
        g = jax.jit(lambda x, y: x + y)
        ja, jb = jax.numpy.asarray(a), jax.numpy.asarray(b)
        g(ja, jb).block_until_ready()
        sides["jax.jit (jax args)"] = lambda: g(ja, jb).block_until_ready()
        sides["jax.jit (NumPy args)"] = lambda: g(a, b).block_until_ready()
    rows = list(time_sides(sides, rounds=rounds, reps=100 if quick else 300, number=10).items())
    s0 = vkml.stats()
    f(ta, tb)
    d = vkml.stats() - s0
    print_table("per-call overhead of a jitted add of two 4-element float32 arrays", rows,
                baselines=[r[0] for r in rows if r[0].startswith("jax")], unit="us")
    print(f"  vkml per call: {d.submissions} submission, {d.compiles} compiles, {d.traces} traces")
    if options.parts:
        print_parts(f, (a, b))


def print_parts(f, args):
    """Where one tiny call with NumPy arguments spends its time, stage by stage: each stage is
    timed on its own (medians of many calls), and what is left of the whole call is the calls
    between them (frames, the plan's lookup and counters).  Reads vkml internals: a diagnostic."""
    from vkml.programs.arguments import _result_tensor, fast_key as _fast_key
    from vkml.runtime import call_context
    f(*args)
    (plan,) = [p for k, p in f._fast.items() if k == _fast_key(args)]
    out = plan.call(args)[0]
    shape, dtype, device = plan.out_vars[0]
    whole = median_seconds(lambda: f(*args), repeat=300, number=200)
    stages = {
        "context (backend, device, matmul mode)": median_seconds(call_context, repeat=300, number=200),
        "key: context + the arguments' types": median_seconds(lambda: _fast_key(args), repeat=300,
                                                              number=200),
        "the executable (NumPy ops / the C call)": median_seconds(lambda: plan.call(args),
                                                                  repeat=300, number=200),
        "the result Tensor": median_seconds(lambda: _result_tensor(shape, dtype, device, out),
                                            repeat=300, number=200),
    }
    called = getattr(plan.call, "__qualname__", type(plan.call).__name__)
    print(f"\n  where a tiny call's {whole * 1e6:.2f} us go (the executable: {called}):")
    rest = whole - sum(v for k, v in stages.items() if not k.startswith("context"))
    for name, secs in stages.items():
        print(f"    {name:42s} {secs * 1e6:6.2f} us" + ("  (in the key)" if name.startswith("context") else ""))
    print(f"    {'the rest: frames, plan lookup, counters':42s} {rest * 1e6:6.2f} us")


if __name__ == "__main__":
    main()
