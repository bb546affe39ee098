"""A float sum or max over a few elements per output (a pooling window, its gradient's tie
count) is an expression of those elements on the cpu tier, computed inside the nests around it,
with the bits of the loop it replaces: the sum the zero-padded canonical tree (``+0.0`` where
the loop's fold adds it, so ``-0.0`` survives alike), the max the comparisons in order (NaN
wins).  Checked byte for byte against the NumPy backend, with NaNs, signed zeros and
magnitudes that make the order show, and against float64 NumPy within rounding."""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen.rules import SMALL_REDUCTION

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("VKML_CPU_HOT", "0")


CASES = [((6, 5, 3), (2,)), ((4, 6, 2, 7, 2), (2, 4)), ((3, 8), (1,)), ((3, 7, 5), (1,)),
         ((2, 3, 1), (2,)), ((5, 2, 3), (0,))]
FUNCTIONS = {
    "sum": lambda a, axes: vkml.sum(a, axis=axes),
    "max": lambda a, axes: vkml.max(a, axis=axes),
    "sum of squares + 1": lambda a, axes: vkml.sum(a * a, axis=axes) + 1.0,
    "max pool backward's tie count": lambda a, axes: vkml.sum(
        (a == vkml.max(a, axis=axes, keepdims=True)).astype(a.dtype), axis=axes),
}


def _body(source):
    return source[source.index("static int vk_main_body"):]


def _operand(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, shape)).astype(dtype)
    x.flat[::7] = -0.0
    x.flat[5] = np.nan
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("shape, axes", CASES)
def test_a_small_reduction_is_an_expression_with_the_loops_bits(shape, axes, name, dtype):
    x = _operand(shape, dtype, seed=len(shape))

    def f(a):
        return FUNCTIONS[name](a, axes)

    body = _body(cpu.c_source(vkml.program(f, x))[0])
    assert "acc" not in body and "vk_tree_push" not in body      # no loop per output
    with vkml.use_backend("numpy"):
        want = np.asarray(vkml.jit(f)(x))
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(f)(x))
    assert got.tobytes() == want.tobytes()
    finite = np.where(np.isnan(x), 0, x).astype(np.float64)
    if name == "sum":
        exact = finite.sum(axis=axes)
        bound = 8 * np.finfo(dtype).eps * np.abs(finite).sum(axis=axes)
        nan = np.isnan(x).any(axis=axes)
        assert np.all(np.isnan(got[nan])) and np.all(np.abs(got[~nan] - exact[~nan]) <= bound[~nan])
    if name == "max":
        np.testing.assert_array_equal(got, np.max(x, axis=axes))        # NaN wins, as NumPy's


def test_signed_zeros_come_out_as_the_loops_fold_leaves_them():
    x = np.array([[-0.0, -0.0, -0.0], [-0.0, -0.0, 0.0], [-0.0, -0.0, -0.0]], np.float32)
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(lambda a: vkml.sum(a, axis=1))(x))
        single = np.asarray(vkml.jit(lambda a: vkml.sum(a, axis=1))(x[:, :2]))
    # three elements: (x0 + x1) + (x2 + 0.0) -- the padding's +0.0 turns -0.0 into +0.0
    assert [np.signbit(v) for v in got] == [False, False, False]
    assert [np.signbit(v) for v in single] == [True, True, True]     # two: x0 + x1 only


def test_bigger_reductions_keep_their_loops():
    x = np.ones((4, SMALL_REDUCTION + 1), np.float32)
    body = _body(cpu.c_source(vkml.program(lambda a: vkml.sum(a, axis=1), x))[0])
    assert "vk_tree_push" in body
    ints = np.ones((4, 3), np.int64)
    body = _body(cpu.c_source(vkml.program(lambda a: vkml.max(a, axis=1), ints))[0])
    assert "acc" in body
