"""Sums that keep the last axis (a bias's gradient: each column summed over a batch's rows) run
their canonical trees side by side on the cpu tier (``Lowering._column_trees``): checked bit for
bit against an independent oracle -- the tree written out over Python floats, zero-padded to a
power of two, every add rounded to the dtype -- and the NumPy backend, with signed zeros,
infinities and NaN, row counts around the 8-element blocks, and several kept axes."""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))


def oracle_tree(values, dtype):
    """The canonical tree over ``values`` (row-major order), every add rounded to ``dtype``."""
    dtype = np.dtype(dtype).type
    leaves = [float(v) for v in values]
    if not leaves:
        return dtype(0.0)
    width = 1 << (len(leaves) - 1).bit_length()
    leaves += [0.0] * (width - len(leaves))

    def total(lo, hi):
        if hi - lo == 1:
            return dtype(leaves[lo])
        mid = (lo + hi) // 2
        with np.errstate(over="ignore", invalid="ignore"):
            return dtype(float(total(lo, mid)) + float(total(mid, hi)))
    return total(0, width)


def _oracle_sum(x, axes):
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, kept + list(axes))
    flat = moved.reshape(moved.shape[:len(kept)] + (-1,))
    out = np.empty(flat.shape[:-1], x.dtype)
    for index in np.ndindex(out.shape):
        out[index] = oracle_tree(flat[index], x.dtype)
    return out


CASES = [((37, 5), (0,)), ((64, 24), (0,)), ((9, 3, 16), (0, 1)), ((4, 6, 7, 10), (0, 2)),
         ((2, 17, 3), (1,)), ((3, 2, 8, 5), (1, 2))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axes", CASES, ids=[f"{s}-{a}" for s, a in CASES])
def test_column_sums_have_the_canonical_trees_bits(shape, axes, dtype):
    rng = np.random.default_rng(len(shape) * 7 + sum(shape))
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(dtype)
    flat = x.reshape(-1)
    flat[::11] = -0.0
    flat[5::97] = np.inf
    flat[50::211] = np.nan
    x[..., -1] = -0.0                       # a column of signed zeros only
    want = _oracle_sum(x, axes)
    program = vkml.program(lambda v: vkml.sum(v, axis=axes), x)
    assert "vk_tree_cols_push" in cpu.c_source(program)[0]
    for backend in ("cpu", "numpy"):
        with vkml.use_backend(backend):
            got = np.asarray(vkml.jit(lambda v: vkml.sum(v, axis=axes))(x))
        assert got.dtype == dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), backend


def test_a_bias_gradient_in_a_training_step_keeps_the_bits():
    """``sum(dy, axis=0)`` of a Linear layer's backward: the step's gradient equals the
    oracle's column sums of the same upstream gradient."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 6)).astype(np.float32)
    w = rng.standard_normal((5, 6)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)

    def loss(b):
        return vkml.sum(vkml.tanh(x @ w.T + b) * 0.5)
    with vkml.use_backend("cpu"):
        g = np.asarray(vkml.jit(vkml.grad(loss))(b))
    dy = (np.float32(0.5) * (np.float32(1) - np.tanh(x @ w.T + b) ** 2)).astype(np.float32)
    np.testing.assert_allclose(g, _oracle_sum(dy, (0,)), rtol=1e-5)
