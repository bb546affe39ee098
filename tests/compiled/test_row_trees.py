"""A float sum along rows whose length has a power-of-two factor of at least 16 (a layer norm's
mean, a softmax's denominator, a max's tie count) runs on the cpu tier a chunk at a time: the
chunk's values computed into a buffer by a SIMD loop, then its subtree summed there in vectors
(``vk_tree_row``: adjacent pairs by two shuffles and an add, level by level).  Checked bit for
bit against an independent oracle -- the canonical tree written out over Python floats, every
add rounded to the dtype -- with signed zeros, infinities, NaN and magnitudes that make the
order show (a NaN must come out NaN; which of two NaNs an add returns is the compiler's choice
of operand order, as everywhere in the tier); the helper itself with and without the shuffles, and whole programs (chunks of
16 to 1024, rows cut into several chunks, several reduced axes, an inlined operand, threads)
against the oracle and the NumPy backend."""

import ctypes

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen.c_render import prelude
from vkml.backends.codegen.lower import ROW_CHUNK_MAX

from test_column_trees import _oracle_sum, oracle_tree

pytestmark = [pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler"),
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")]    # inf - inf


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))


def _hostile(shape, dtype, seed):
    """Values whose sum depends on the order of the adds, with specials sprinkled in."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(dtype)
    flat = x.reshape(-1)
    flat[::13] = -0.0
    flat[7::101] = np.inf
    flat[60::331] = -np.inf
    flat[90::613] = np.nan
    return x


def same_bits(got, want):
    """Bit for bit, except that any NaN matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    nan = np.isnan(want)
    return np.array_equal(np.isnan(got), nan) and got[~nan].tobytes() == want[~nan].tobytes()


WRAPPER = """
float vk_test_row_float(float* buf, int64_t n) { return vk_tree_row_float(buf, n); }
double vk_test_row_double(double* buf, int64_t n) { return vk_tree_row_double(buf, n); }
"""


@pytest.mark.parametrize("flags", [(), ("-DVK_ROW_NO_SHUFFLE",)], ids=["vectors", "scalar"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_helper_adds_the_canonical_tree(flags, dtype):
    lib, _ = cpu.library(prelude() + WRAPPER, extra_flags=flags)
    t = "float" if dtype == np.float32 else "double"
    fn = getattr(lib, f"vk_test_row_{t}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    fn.restype = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    for n in (16, 32, 64, 128, 256, 1024):
        for seed in range(4):
            values = _hostile(n, dtype, seed * 1000 + n)
            if seed == 3:
                values = np.full(n, -0.0, dtype)              # -0.0 + -0.0 stays -0.0
            raw = np.zeros(n + 64 // values.itemsize, dtype)
            start = (-raw.ctypes.data % 64) // values.itemsize
            buf = raw[start:start + n]
            buf[:] = values
            got = dtype(fn(buf.ctypes.data, n))
            want = oracle_tree(values, dtype)
            assert same_bits(got, want), (n, seed)


# (shape, axes): rows of one chunk (16 .. 1024), rows of several chunks (4096 = 4 x 1024, 3 x 512,
# 784 = 49 x 16, 96 = 3 x 32), several reduced axes with the inner one chunked, a full sum
CASES = [((9, 16), (1,)), ((5, 128), (1,)), ((3, 1024), (1,)), ((2, 4096), (1,)),
         ((3, 1536), (1,)), ((4, 784), (1,)), ((6, 96), (1,)), ((2, 3, 5, 64), (1, 3)),
         ((3, 4, 48), (0, 2)), ((5000 * 16,), (0,))]


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axes", CASES, ids=[f"{s}-{a}" for s, a in CASES])
def test_row_sums_have_the_canonical_trees_bits(shape, axes, dtype, threads, monkeypatch):
    monkeypatch.setenv("VKML_THREADS", threads)
    x = _hostile(shape, dtype, seed=sum(shape))
    x[(0,) * (x.ndim - 1)] = -0.0                      # a row of signed zeros only
    want = _oracle_sum(x, axes)

    def f(v):
        return vkml.sum(v, axis=axes)
    source = cpu.c_source(vkml.program(f, x))[0]
    assert "vk_tree_row_" in source[source.index("static int vk_main_body"):]
    for backend in ("cpu", "numpy"):
        with vkml.use_backend(backend):
            got = np.asarray(vkml.jit(f)(x))
        assert got.dtype == dtype and got.shape == want.shape
        assert same_bits(got, want), backend


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_inlined_operand_is_computed_in_the_chunks_loop(dtype):
    """A softmax's max gradient counts each row's ties with its max (a compare, a cast, a sum
    the reduction reads as its expression) and a layer norm sums squared differences: the
    values computed in the SIMD loop are the ones the oracle sums."""
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 4, (64, 128)).astype(dtype)        # many ties
    m = rng.standard_normal((64, 1)).astype(dtype)

    def ties(v):
        return vkml.sum((v == vkml.max(v, axis=1, keepdims=True)).astype(dtype), axis=1)

    def squares(v, mu):
        return vkml.sum((v - mu) * (v - mu), axis=1)
    for f, args, values in ((ties, (x,), (x == x.max(axis=1, keepdims=True)).astype(dtype)),
                            (squares, (x, m), (x - m) * (x - m))):
        want = _oracle_sum(values.astype(dtype), (1,))
        for backend in ("cpu", "numpy"):
            with vkml.use_backend(backend):
                got = np.asarray(vkml.jit(f)(*args))
            assert got.tobytes() == want.tobytes(), (f.__name__, backend)


def test_short_or_odd_rows_keep_the_streamed_tree():
    """Rows without a power-of-two factor of 16 (10 classes, 24 = 8 x 3) push 8-element blocks
    or elements as before; a row longer than a chunk is cut into chunks of at most
    ``ROW_CHUNK_MAX``."""
    for n, row in ((10, False), (24, False), (32, True)):
        x = np.ones((3, n), np.float32)
        body = cpu.c_source(vkml.program(lambda v: vkml.sum(v, axis=1), x))[0]
        assert ("vk_tree_row_float(buf" in body) == row, n
    x = np.ones((2, 4 * ROW_CHUNK_MAX), np.float32)
    body = cpu.c_source(vkml.program(lambda v: vkml.sum(v, axis=1), x))[0]
    assert f"[{ROW_CHUNK_MAX}] __attribute__((aligned(64)))" in body
