"""The cpu tier's matrix product (``codegen/gemm.py``: the naive k-order loop's bits, blocked)
against NumPy's ``@`` (BLAS), GFLOPS side by side.

Shapes: the MLP training step's products (a 784-256-10 MLP at batch 64: the forward ``x @ W.T``
with W stored (out, in) row-major, the weight gradient ``d.T @ x`` reading d transposed, and the
10-wide layer's), then bigger squares.  Every product is first checked bit for bit against the
naive loop (NumPy, k in order) so what is timed is the exact routine.  The C routine is timed
through a wrapper that calls it ``number`` times in C (as a compiled program calls it, no Python in
between); NumPy's ``@`` the same number of times in a Python loop.  One thread, the process pinned
to one CPU; the sides interleaved in rounds (``_timing.py``).

    python bench/gemm.py [--quick]     (--quick: the MLP shapes only, fewer rounds)
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleave, pin, sampler  # noqa: E402

if __name__ == "__main__":        # before NumPy loads its thread pools
    PINNED = pin()

import numpy as np  # noqa: E402

from vkml.backends import cpu  # noqa: E402
from vkml.backends.codegen import gemm  # noqa: E402
from vkml.backends.codegen.c_render import prelude  # noqa: E402

WRAPPERS = "".join(f"""
void vk_bench_gemm_{t}(int64_t M, int64_t N, int64_t K, const {t}* A, int64_t sam, int64_t sak,
                       const {t}* B, int64_t sbk, int64_t sbn, {t}* C, int64_t scm, int64_t scn,
                       {t}* pack, int64_t number)
{{ for (int64_t r = 0; r < number; r++)
       vk_gemm_{t}(M, N, K, A, sam, sak, B, sbk, sbn, C, scm, scn, pack); }}
""" for t in ("float", "double"))

#: (label, M, N, K, dtype, A stored transposed, B stored transposed)
MLP = [("x @ W1.T", 64, 256, 784, np.float32, False, True),
       ("d1.T @ x", 256, 784, 64, np.float32, True, False),
       ("h @ W2.T", 64, 10, 256, np.float32, False, True),
       ("d2 @ W2", 64, 256, 10, np.float32, False, False),
       ("d2.T @ h", 10, 256, 64, np.float32, True, False)]
BIG = [("256x1024x1024", 256, 1024, 1024, np.float32, False, False),
       ("1024^3", 1024, 1024, 1024, np.float32, False, False),
       ("256^3 f64", 256, 256, 256, np.float64, False, False)]


def operand(rng, rows, cols, dtype, transposed):
    """A (rows, cols) operand; ``transposed``: the transpose view of a row-major (cols, rows)."""
    if transposed:
        return rng.standard_normal((cols, rows)).astype(dtype).T
    return rng.standard_normal((rows, cols)).astype(dtype)


def naive(a, b):
    acc = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    for k in range(a.shape[1]):
        acc = acc + (a[:, k, None] * b[None, k, :])
    return acc


def c_side(lib, a, b, c, number):
    """A zero-argument callable running the C routine ``number`` times on views a, b -> c."""
    t = "float" if a.dtype == np.float32 else "double"
    raw = np.empty(gemm.PACK_BYTES + 64, np.uint8)
    pack = raw.ctypes.data + (-raw.ctypes.data) % 64
    (m, k), n = a.shape, b.shape[1]
    args = [m, n, k, a.ctypes.data, *(s // a.itemsize for s in a.strides),
            b.ctypes.data, *(s // b.itemsize for s in b.strides),
            c.ctypes.data, *(s // c.itemsize for s in c.strides), pack, number]
    fn = getattr(lib, f"vk_bench_gemm_{t}")
    fn.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] * 3 + \
        [ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None

    def call():
        fn(*args)
        raw.size        # keeps the scratch alive as long as the callable
    return call


def numpy_side(a, b, number):
    def call():
        for _ in range(number):
            np.matmul(a, b)
    return call


def measure(lib, spec, rounds, rng):
    label, m, n, k, dtype, ta, tb = spec
    a, b = operand(rng, m, k, dtype, ta), operand(rng, k, n, dtype, tb)
    c = np.empty((m, n), dtype)
    c_side(lib, a, b, c, 1)()
    assert c.tobytes() == naive(a, b).tobytes(), f"{label}: the routine lost the naive loop's bits"
    flops = 2.0 * m * n * k
    number = max(1, int(2e7 // flops))           # about a millisecond or more per timed call
    sides = {"gemm": sampler(c_side(lib, a, b, c, number), reps=5),
             "numpy": sampler(numpy_side(a, b, number), reps=5)}
    best = interleave(sides, rounds=rounds)
    return {name: flops * number / secs[0] / 1e9 for name, secs in best.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the MLP shapes only, fewer rounds")
    args = parser.parse_args(argv)
    specs, rounds = (MLP, 3) if args.quick else (MLP + BIG, 7)
    print(f"gemm (the naive loop's bits) against np.matmul -- {PINNED}")
    print(f"numpy {np.__version__}; pack scratch {gemm.PACK_BYTES} bytes")
    t0 = time.perf_counter()
    lib, compiled = cpu.library(prelude() + gemm.GEMM_C + WRAPPERS)
    print(f"compiled in {time.perf_counter() - t0:.2f} s" if compiled
          else "compiled library from the cache")
    rng = np.random.default_rng(0)
    head = ("product", "M x N x K", "dtype", "gemm GFLOPS", "numpy GFLOPS", "gemm/numpy")
    rows = []
    for spec in specs:
        g = measure(lib, spec, rounds, rng)
        label, m, n, k, dtype = spec[:5]
        rows.append((label, f"{m}x{n}x{k}", np.dtype(dtype).name, f"{g['gemm']:.1f}",
                     f"{g['numpy']:.1f}", f"{g['gemm'] / g['numpy']:.2f}x"))
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        cells = [r[0].ljust(widths[0])] + [x.rjust(w) for x, w in zip(r[1:], widths[1:])]
        print("  " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
