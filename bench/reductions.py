"""The cost of one summation order (issue "same bits on every call, thread and tier").

Every float sum of vkml adds in the canonical tree order (``vkml.ops.treesum``) so that NumPy, the
compiled CPU tier and CUDA give the same bits.  What that costs against NumPy's own (pairwise,
layout-dependent) ``np.sum`` and BLAS:

1. The canonical sum on NumPy (``tree_reduce``, what the NumPy backend runs) against ``np.sum``,
   10^3..10^7 elements, and over each axis of a 2-d array; the compiled C tier's jitted sum
   (a binary-counter stack, blocks of 8 as one subtree) beside them.
2. The deterministic matrix product (``vkml.matmul(a, b, deterministic=True)``: the tree over k)
   against ``np.matmul`` (BLAS), 64x784x256 and 256x256x256, on NumPy and on the cpu tier.

One thread, the process pinned to one CPU; the sides interleaved in rounds (``_timing.py``).
Ratios are side / ``np.sum`` or side / ``np.matmul``.

    python bench/reductions.py [--quick]     (--quick: up to 10^6 elements, fewer rounds)
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleave, pin, print_table, sampler  # noqa: E402

if __name__ == "__main__":        # before NumPy loads its thread pools
    PINNED = pin()

import numpy as np  # noqa: E402

import vkml  # noqa: E402
from vkml.ops.treesum import tree_matmul, tree_reduce  # noqa: E402

FULL = {"sizes": (10**3, 10**4, 10**5, 10**6, 10**7), "rounds": 7, "matrix": (1000, 1000)}
QUICK = {"sizes": (10**3, 10**5, 10**6), "rounds": 3, "matrix": (500, 500)}


def _cpu_sum(x, axes):
    """A jitted sum on the cpu tier, compiled (and checked against the NumPy tree) before timing."""
    vkml.set_backend("cpu")
    f = vkml.jit(lambda x: vkml.sum(x, axis=axes))
    for _ in range(3):
        got = f(x).numpy()
    assert got.tobytes() == tree_reduce(x, axes).tobytes(), "the cpu tier's sum lost the tree's bits"
    vkml.set_backend("numpy")
    return lambda: f(x)


def _rows(sides, rounds):
    return [(k, v[0]) for k, v in interleave(sides, rounds=rounds).items()]


def sums(cfg):
    rng = np.random.default_rng(0)
    for dtype in (np.float64, np.float32):
        for n in cfg["sizes"]:
            x = rng.standard_normal(n).astype(dtype)
            reps = 20 if n <= 10**5 else 5
            sides = {"np.sum": sampler(lambda: np.sum(x), reps=reps),
                     "tree (numpy)": sampler(lambda: tree_reduce(x, (0,)), reps=reps),
                     "tree (cpu tier)": sampler(_cpu_sum(x, (0,)), reps=reps)}
            print_table(f"sum of {n:,} {np.dtype(dtype).name}", _rows(sides, cfg["rounds"]),
                        baselines=["np.sum"], unit="us")
    m = rng.standard_normal(cfg["matrix"])
    for axes in [(0,), (1,), (0, 1)]:
        sides = {"np.sum": sampler(lambda: np.sum(m, axis=axes), reps=10),
                 "tree (numpy)": sampler(lambda: tree_reduce(m, axes), reps=10),
                 "tree (cpu tier)": sampler(_cpu_sum(m, axes), reps=10)}
        print_table(f"sum of a {m.shape} float64 array over axis {axes}", _rows(sides, cfg["rounds"]),
                    baselines=["np.sum"], unit="us")


def matmuls(cfg):
    rng = np.random.default_rng(1)
    for m, k, n in [(64, 784, 256), (256, 256, 256)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        vkml.set_backend("cpu")
        f = vkml.jit(lambda a, b: vkml.matmul(a, b, deterministic=True))
        for _ in range(2):
            got = f(a, b).numpy()
        vkml.set_backend("numpy")
        assert got.tobytes() == tree_matmul(a, b).tobytes(), "the cpu tier's product lost the tree"
        sides = {"np.matmul (BLAS)": sampler(lambda: np.matmul(a, b), reps=5),
                 "tree (numpy)": sampler(lambda: tree_matmul(a, b), reps=3),
                 "tree (cpu tier)": sampler(lambda: f(a, b), reps=3)}
        print_table(f"deterministic matmul {m}x{k}x{n} float32", _rows(sides, cfg["rounds"]),
                    baselines=["np.matmul (BLAS)"], unit="ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds")
    cfg = QUICK if ap.parse_args().quick else FULL
    print(f"reductions: {PINNED}")
    sums(cfg)
    matmuls(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
