"""The cpu tier's matrix product (``codegen/gemm.py``, k in index order) in both of its modes
against NumPy's ``@`` (BLAS), GFLOPS side by side, and as a share of this core's FMA peak.

The modes: *fused* (the default: each step one exactly rounded fused multiply-add) and *plain*
(``VKML_FMA=0``: a rounded product then a rounded sum, the plain loops' bits).  The peak is
measured here, first: a register-only loop of independent 512-bit (or 256-bit) fused
multiply-adds, the most arithmetic this core does per second.

Shapes: the MLP training step's products (a 784-256-10 MLP at batch 64: the forward ``x @ W.T``
with W stored (out, in) row-major, the weight gradient ``d.T @ x`` reading d transposed, and the
10-wide layer's), then bigger squares and the big MLP's (1024-4096-4096-10 at batch 256) products
in the layouts its step reads.  Every product is first checked bit for bit against its mode's
loop written in NumPy, so what is timed is the exact routine.  The C routine is timed through a
wrapper that calls it ``number`` times in C (as a compiled program calls it, no Python in
between); NumPy's ``@`` the same number of times in a Python loop.  The sides are interleaved in
rounds (``_timing.py``).  ``--threads N``: every side on N threads (the C routine splitting rows
over N OpenMP threads, BLAS its own way); without it one thread, pinned to one CPU.

Intel's MKL is a third side where its runtime library (``libmkl_rt``, the ``mkl`` wheel on PyPI)
is in this Python's environment or on the loader's path: ``cblas_sgemm``/``cblas_dgemm`` on the
same operands (its transpose flags for the transposed layouts), on as many threads as the others.
The header names the code branch MKL picked for this CPU where MKL says (its kernels differ
between Intel's and other vendors' cores, and on the latter it names none).

    python bench/gemm.py [--quick] [--threads N] [--training]
      (--quick: the MLP shapes and 1024^3 only; --training: the CNN's and transformer's)
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import blas, cpu_model, interleave, pin_from_argv, print_rows, sampler  # noqa: E402

if __name__ == "__main__":        # before NumPy loads its thread pools
    PINNED = pin_from_argv()

import numpy as np  # noqa: E402

from vkml.backends import cpu  # noqa: E402
from vkml.backends.codegen import gemm  # noqa: E402
from vkml.backends.codegen.c_render import prelude  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "compiled"))
from product_oracles import fused_loop, plain_loop  # noqa: E402

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
SQUARES = [("512^3", 512, 512, 512, np.float32, False, False),
           ("1024^3", 1024, 1024, 1024, np.float32, False, False),
           ("1024^3 A^T", 1024, 1024, 1024, np.float32, True, False),
           ("1024^3 B^T", 1024, 1024, 1024, np.float32, False, True),
           ("2048^3", 2048, 2048, 2048, np.float32, False, False),
           ("512^3 f64", 512, 512, 512, np.float64, False, False)]
#: matrix-vector products (bound by memory, not arithmetic: their "% peak" means little): a
#: vector times a row-major matrix streams the matrix once, a matrix times a vector packs it
VECTORS = [("w @ X", 1, 2048, 2048, np.float32, False, False),
           ("w @ X f64", 1, 512, 512, np.float64, False, False),
           ("X @ w", 2048, 1, 2048, np.float32, False, False)]
#: the 1024-4096-4096-10 MLP at batch 256: forward x @ W.T, input gradient d @ W, weight
#: gradient d.T @ h
BIG_MLP = [("h @ W2.T", 256, 4096, 4096, np.float32, False, True),
           ("d2 @ W2", 256, 4096, 4096, np.float32, False, False),
           ("d2.T @ h1", 4096, 4096, 256, np.float32, True, False)]

#: the CNN's and the transformer's products (``bench/training.py``) in the layouts their steps
#: read: a convolution's weight (out x window) times its columns (window x every pixel of the
#: batch), the columns' gradient, the weight's (over every pixel of the batch); the
#: transformer's Linear layers over its 1024 rows (forward and both gradients) and one attention
#: head's products (forward and backward)
TRAINING = [("conv1 W @ cols", 32, 36864, 25, np.float32, False, False),
            ("conv1 dW = d @ cols.T", 32, 25, 36864, np.float32, False, True),
            ("conv2 W @ cols", 64, 4096, 800, np.float32, False, False),
            ("conv2 dcols = W.T @ d", 800, 4096, 64, np.float32, True, False),
            ("conv2 dW = d @ cols.T", 64, 800, 4096, np.float32, False, True),
            ("qkv x @ W.T", 1024, 384, 128, np.float32, False, True),
            ("mlp up x @ W.T", 1024, 512, 128, np.float32, False, True),
            ("mlp down h @ W.T", 1024, 128, 512, np.float32, False, True),
            ("qkv dW = d.T @ x", 384, 128, 1024, np.float32, True, False),
            ("qkv dx = d @ W", 1024, 128, 384, np.float32, False, False),
            ("mlp up dW = d.T @ x", 512, 128, 1024, np.float32, True, False),
            ("mlp up dx = d @ W", 1024, 128, 512, np.float32, False, False),
            ("mlp down dW = d.T @ h", 128, 512, 1024, np.float32, True, False),
            ("mlp down dh = d @ W", 1024, 512, 128, np.float32, False, False),
            ("attention q @ k.T", 128, 128, 32, np.float32, False, True),
            ("attention p @ v", 128, 32, 128, np.float32, False, False),
            ("attention dp = d @ v.T", 128, 128, 32, np.float32, False, True),
            ("attention dv = p.T @ d", 128, 32, 128, np.float32, True, False),
            ("attention dq = ds @ k", 128, 32, 128, np.float32, False, False),
            ("attention dk = ds.T @ q", 128, 32, 128, np.float32, True, False)]

#: the register-only loop the peak is measured with: 16 independent accumulators (enough to
#: keep two FMA units with a 4-cycle latency busy), ``vk_bench_peak_lanes`` floats per vector
PEAK_C = """
#if defined(__AVX512F__)
typedef float vk_peak_v __attribute__((vector_size(64)));
#define VK_PEAK_FMA(x, m, b) __builtin_ia32_vfmaddps512_mask(x, m, b, (unsigned short)-1, 4)
#elif defined(__FMA__)
typedef float vk_peak_v __attribute__((vector_size(32)));
#define VK_PEAK_FMA(x, m, b) __builtin_ia32_vfmaddps256(x, m, b)
#endif
#ifdef VK_PEAK_FMA
int vk_bench_peak_lanes(void) { return (int)(sizeof(vk_peak_v) / sizeof(float)); }
float vk_bench_peak(int64_t n)
{
    vk_peak_v m, b, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15;
    for (int i = 0; i < vk_bench_peak_lanes(); i++) m[i] = 0.9999999f, b[i] = 1e-7f;
    /* sixteen different starting values: identical chains would be merged into one by -O2 */
    a0 = b; a1 = 2 * b; a2 = 3 * b; a3 = 4 * b; a4 = 5 * b; a5 = 6 * b; a6 = 7 * b; a7 = 8 * b;
    a8 = 9 * b; a9 = 10 * b; a10 = 11 * b; a11 = 12 * b; a12 = 13 * b; a13 = 14 * b;
    a14 = 15 * b; a15 = 16 * b;
#define VK_PEAK_STEP(x) x = VK_PEAK_FMA(x, m, b);
    for (int64_t i = 0; i < n; i++) {
        VK_PEAK_STEP(a0) VK_PEAK_STEP(a1) VK_PEAK_STEP(a2) VK_PEAK_STEP(a3) VK_PEAK_STEP(a4)
        VK_PEAK_STEP(a5) VK_PEAK_STEP(a6) VK_PEAK_STEP(a7) VK_PEAK_STEP(a8) VK_PEAK_STEP(a9)
        VK_PEAK_STEP(a10) VK_PEAK_STEP(a11) VK_PEAK_STEP(a12) VK_PEAK_STEP(a13)
        VK_PEAK_STEP(a14) VK_PEAK_STEP(a15)
    }
    vk_peak_v s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15;
    return s[0];
}
#else
int vk_bench_peak_lanes(void) { return 0; }
float vk_bench_peak(int64_t n) { return (float)n; }
#endif
"""


def operand(rng, rows, cols, dtype, transposed):
    """A (rows, cols) operand; ``transposed``: the transpose view of a row-major (cols, rows)."""
    if transposed:
        return rng.standard_normal((cols, rows)).astype(dtype).T
    return rng.standard_normal((rows, cols)).astype(dtype)


def fma_peak(lib) -> float | None:
    """GFLOPS of this core's fused multiply-adds (one thread), or None without FMA."""
    lanes = lib.vk_bench_peak_lanes()
    if not lanes:
        return None
    lib.vk_bench_peak.argtypes, lib.vk_bench_peak.restype = [ctypes.c_int64], ctypes.c_float
    n, best = 20_000_000, float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        lib.vk_bench_peak(n)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * lanes * 16 * n / best / 1e9


def c_side(lib, a, b, c, number, threads):
    """A zero-argument callable running the C routine ``number`` times on views a, b -> c."""
    t = "float" if a.dtype == np.float32 else "double"
    raw = np.empty(gemm.pack_bytes(threads) + 64, np.uint8)
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


#: mkl_cbwr_get_auto_branch()'s answers (MKL's ``MKL_CBWR_*`` constants): the code branch it runs
MKL_BRANCHES = {2: "auto (MKL names none for this processor)", 3: "compatible", 4: "SSE2",
                8: "SSE4.2", 10: "AVX2", 12: "AVX-512", 14: "AVX-512 E1", 15: "AVX10"}


def mkl_library(threads):
    """Intel MKL's runtime library set to ``threads`` threads, with a line naming its version and
    code branch; (None, reason) where it is not installed."""
    names = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    name = names[0] if names else ctypes.util.find_library("mkl_rt")
    if not name:
        return None, "MKL: not installed (pip install mkl adds it as a side)"
    lib = ctypes.CDLL(name)
    lib.MKL_Set_Num_Threads(ctypes.c_int(threads))
    text = ctypes.create_string_buffer(256)
    lib.mkl_get_version_string(text, ctypes.c_int(256))
    branch = lib.mkl_cbwr_get_auto_branch()
    return lib, (f"MKL: {text.value.decode().strip()}; code branch "
                 f"{MKL_BRANCHES.get(branch, branch)}; {threads} thread(s)")


def mkl_side(lib, a, b, c, number):
    """A zero-argument callable running MKL's cblas_?gemm ``number`` times on views a, b -> c."""
    row_major, no_trans, trans = 101, 111, 112
    (m, k), n = a.shape, b.shape[1]

    def layout(x):              # (transpose flag, leading dimension) of a row-major or its .T
        return (no_trans, x.strides[0] // x.itemsize) if x.flags.c_contiguous \
            else (trans, x.strides[1] // x.itemsize)
    (ta, lda), (tb, ldb) = layout(a), layout(b)
    real = ctypes.c_float if a.dtype == np.float32 else ctypes.c_double
    fn = lib.cblas_sgemm if a.dtype == np.float32 else lib.cblas_dgemm
    fn.restype = None
    args = (row_major, ta, tb, m, n, k, real(1.0), ctypes.c_void_p(a.ctypes.data), lda,
            ctypes.c_void_p(b.ctypes.data), ldb, real(0.0), ctypes.c_void_p(c.ctypes.data), n)

    def call():
        for _ in range(number):
            fn(*args)
    return call


def measure(libs, spec, rounds, rng, threads, mkl=None):
    label, m, n, k, dtype, ta, tb = spec
    a, b = operand(rng, m, k, dtype, ta), operand(rng, k, n, dtype, tb)
    outs = {mode: np.empty((m, n), dtype) for mode in libs}
    checked = m * n * k <= 1 << 27          # (the NumPy loops of the bigger ones take minutes)
    for mode, lib in libs.items():
        c_side(lib, a, b, outs[mode], 1, threads)()
        if checked:
            want = (fused_loop if mode == "fused" else plain_loop)(a, b)
            assert outs[mode].tobytes() == want.tobytes(), f"{label}: {mode} lost its loop's bits"
    flops = 2.0 * m * n * k
    number = max(1, int(2e7 // flops))           # about a millisecond or more per timed call
    sides = {mode: sampler(c_side(lib, a, b, outs[mode], number, threads), reps=3)
             for mode, lib in libs.items()}
    sides["numpy"] = sampler(numpy_side(a, b, number), reps=3)
    if mkl is not None:
        c = np.empty((m, n), dtype)
        mkl_side(mkl, a, b, c, 1)()
        np.testing.assert_allclose(c, outs["fused"], rtol=1e-3 if dtype == np.float32 else 1e-9,
                                   atol=1e-3 * np.sqrt(k), err_msg=f"{label}: MKL's product")
        sides["mkl"] = sampler(mkl_side(mkl, a, b, c, number), reps=3)
    best = interleave(sides, rounds=rounds)
    return {name: flops * number / secs[0] / 1e9 for name, secs in best.items()}, checked


def build(fused, threads):
    lib, compiled = cpu.library(prelude() + gemm.gemm_c(fused=fused) + WRAPPERS + PEAK_C,
                                extra_flags=["-fopenmp"] if threads > 1 else [])
    if threads > 1:
        ctypes.c_int.in_dll(lib, "vk_gemm_threads").value = threads
    return lib, compiled


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the MLP shapes and 1024^3 only")
    parser.add_argument("--threads", type=int, default=1, help="threads per side (default 1)")
    parser.add_argument("--training", action="store_true",
                        help="the CNN's and the transformer's products only")
    args = parser.parse_args(argv)
    specs, rounds = (MLP + SQUARES[1:2], 3) if args.quick else (MLP + SQUARES + BIG_MLP + VECTORS, 5)
    if args.training:
        specs = TRAINING
    print(f"gemm (k in index order) in both modes against np.matmul -- {PINNED}")
    print(f"CPU: {cpu_model()}; numpy {np.__version__} with {blas()}")
    t0 = time.perf_counter()
    libs = {}
    for mode in ("fused", "plain"):
        libs[mode], compiled = build(mode == "fused", args.threads)
    print(f"compiled in {time.perf_counter() - t0:.2f} s" if compiled
          else "compiled libraries from the cache")
    mkl, said = mkl_library(args.threads)
    print(said)
    peak = fma_peak(libs["fused"])
    if peak:
        print(f"this core's FMA peak (register-only loop, one thread): {peak:.1f} GFLOPS"
              + (f"; x{args.threads} threads: {peak * args.threads:.1f}" if args.threads > 1 else ""))
    peak = peak * args.threads if peak else None
    rng = np.random.default_rng(0)
    head = ("product", "M x N x K", "dtype", "fused", "plain", "numpy", "fused/numpy",
            "fused % peak") + (("mkl", "fused/mkl") if mkl else ())
    rows = []
    for spec in specs:
        g, checked = measure(libs, spec, rounds, rng, args.threads, mkl)
        label, m, n, k, dtype = spec[:5]
        ceiling = peak / 2 if dtype == np.float64 else peak      # (half the lanes per vector)
        share = f"{100 * g['fused'] / ceiling:.0f}%" if peak else "-"
        rows.append((label + ("" if checked else " *"), f"{m}x{n}x{k}", np.dtype(dtype).name,
                     f"{g['fused']:.1f}", f"{g['plain']:.1f}", f"{g['numpy']:.1f}",
                     f"{g['fused'] / g['numpy']:.2f}x", share)
                    + ((f"{g['mkl']:.1f}", f"{g['fused'] / g['mkl']:.2f}x") if mkl else ()))
    print_rows(head, rows)
    print("  (GFLOPS; fused/numpy, fused/mkl > 1: vkml faster; float64 peak is half the float32 "
          "one; * too big for the NumPy oracle: checked at the smaller sizes only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
