"""A float max over a long axis runs a SIMD pass first (the largest value, and whether any is NaN)
and the scalar NaN-aware loop only where that pass cannot answer: the result is the first NaN
where there is one, else the largest value, the first of equals (-0.0 before +0.0 or after) --
checked against a plain Python loop over each row, on rows of NaNs of several payloads, signed
zeros, infinities and ties, over one axis and over several, on one and two threads."""

import re

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen import lower
from vkml.backends.codegen.lower import VECTOR_MAX_MIN

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def _first_nan_else_first_largest(row):
    """The max as the scalar loop defines it, element by element in order (the oracle)."""
    best = row[0]
    for v in row[1:]:
        if np.isnan(best):
            break
        if np.isnan(v) or v > best:
            best = v
    return best


def _oracle(x, axes):
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, kept + list(axes))
    rows = moved.reshape(int(np.prod([x.shape[a] for a in kept])), -1)
    out = np.array([_first_nan_else_first_largest(r) for r in rows], x.dtype)
    return out.reshape([x.shape[a] for a in kept])


def _rows(dtype, shape, rng):
    """Random rows, some with a NaN (payloads 1, 5, 77; either sign), some all zeros of mixed
    signs, some with the largest value twice, some with +-inf."""
    uint = np.uint32 if dtype == np.float32 else np.uint64
    quiet = uint(0x7FC00000) if dtype == np.float32 else uint(0x7FF8000000000000)
    nans = [(quiet | uint(p)).view(dtype) for p in (1, 5, 77)]
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1, shape[-1])
    for r in range(flat.shape[0]):
        kind = r % 6
        if kind == 1:
            flat[r, rng.integers(shape[-1], size=2)] = [nans[r % 3], -nans[(r + 1) % 3]]
        elif kind == 2:
            flat[r] = np.where(rng.random(shape[-1]) < 0.5, -0.0, 0.0)
            flat[r, 0] = -0.0 if r % 12 == 2 else 0.0
        elif kind == 3:
            flat[r] = -np.abs(flat[r])
            flat[r, rng.integers(shape[-1], size=3)] = np.where(rng.random(3) < 0.5, -0.0, 0.0)
        elif kind == 4:
            flat[r, rng.integers(shape[-1], size=2)] = flat[r].max() + 1
        elif kind == 5:
            flat[r, rng.integers(shape[-1])] = np.inf if r % 4 else -np.inf
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axes", [((12, 128), (1,)), ((12, 17), (1,)), ((6, 300), (1,)),
                                         ((40, 9), (0,)), ((4, 6, 20), (1, 2)), ((3, 16, 5), (0, 1))])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_max_is_the_first_nan_else_the_first_largest(dtype, shape, axes, threads, monkeypatch):
    monkeypatch.setenv("VKML_THREADS", threads)
    kept = [a for a in range(len(shape)) if a not in axes]
    rows = _rows(dtype, (int(np.prod([shape[a] for a in kept])), int(np.prod([shape[a] for a in axes]))),
                 np.random.default_rng(sum(shape) + len(axes)))
    x = np.ascontiguousarray(np.transpose(rows.reshape([shape[a] for a in kept + list(axes)]),
                                          np.argsort(kept + list(axes))))

    def f(v):
        return vkml.max(v, axis=axes)
    source, _ = cpu.c_source(vkml.program(f, x))
    quick = np.prod([shape[a] for a in axes]) >= VECTOR_MAX_MIN
    assert bool(re.search(r"reduction\(max:", source)) == quick
    want = _oracle(x, axes)
    assert np.isnan(want).any() and (want == 0).any() and np.signbit(want[want == 0]).any()
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(f)(x))
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    with vkml.use_backend("numpy"):        # (NumPy's own max: the same values, where its
        #                                        order among signed zeros and NaNs is its own)
        assert np.array_equal(np.asarray(vkml.jit(f)(x)), want, equal_nan=True)


def test_a_softmax_gradient_through_the_max_matches_a_finite_difference(monkeypatch):
    """The max inside a softmax (subtracted for range): the gradient against a central difference
    in float64, and bit for bit the gradient of the program without the SIMD pass."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 40))
    w = rng.standard_normal((5, 40))

    def loss(v):
        z = v - vkml.max(v, axis=-1, keepdims=True)
        e = vkml.exp(z)
        return vkml.sum(e / vkml.sum(e, axis=-1, keepdims=True) * w)
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(vkml.grad(loss))(x))
        monkeypatch.setattr(lower, "VECTOR_MAX_MIN", 10 ** 9)
        vkml.clear_caches()                     # (built again, without the pass)
        source, _ = cpu.c_source(vkml.program(vkml.grad(loss), x))
        assert "reduction(max:" not in source
        scalar = np.asarray(vkml.jit(vkml.grad(loss))(x))
    assert got.tobytes() == scalar.tobytes()
    h = 1e-6
    with vkml.use_backend("numpy"):
        for i, j in [(0, 0), (2, 17), (4, 39)]:
            d = np.zeros_like(x)
            d[i, j] = h
            fd = (float(loss(vkml.tensor(x + d)).numpy()) -
                  float(loss(vkml.tensor(x - d)).numpy())) / (2 * h)
            assert abs(fd - got[i, j]) < 1e-6
