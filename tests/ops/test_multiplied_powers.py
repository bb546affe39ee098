"""``x ** 2``, ``x ** 3`` and ``x ** 4`` of a float tensor and a Python int are products of ``x``
(no libm ``pow``): the same bits on every backend, within two ulps of NumPy's ``power``, and a
gradient checked against HIPS autograd and central differences.  Any other exponent -- a float
3.0, a NumPy integer, a tensor, an int outside 2..4 -- still goes through ``pow``."""

import numpy as np
import pytest

import vkml
from backends_under_test import BACKENDS
from oracle import check_grad

SPECIALS = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 1e30, -7e12, 0.5]


def _operands(dtype):
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(500) * 10, SPECIALS]).astype(dtype)
    if dtype == np.float64:
        x = np.concatenate([x, [1e-310, 1e200, -1e103]])
    return x


def _products(x, n):
    with np.errstate(all="ignore"):
        square = x * x
        return {2: square, 3: square * x, 4: square * square}[n]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_small_whole_power_is_the_product_bit_for_bit_on_every_backend(backend, dtype, n):
    x = _operands(dtype)
    with vkml.use_backend(backend), np.errstate(all="ignore"):
        lazy = (vkml.tensor(x) ** n).numpy()
        jitted = np.asarray(vkml.jit(lambda v: v ** n)(x))
        power = np.asarray(vkml.numpy.power(x, n))
    want = _products(x, n)
    for got in (lazy, jitted, power):
        assert got.dtype == dtype
        assert got.tobytes() == want.tobytes()
    with np.errstate(all="ignore"):
        reference = np.power(x.astype(np.float64), n)
    finite = np.isfinite(reference) & (np.abs(reference) < np.finfo(dtype).max) & \
        (np.abs(reference) > np.finfo(dtype).tiny)
    np.testing.assert_allclose(want[finite], reference[finite], rtol=3 * np.finfo(dtype).eps)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_gradient_of_a_multiplied_power(n):
    import autograd.numpy as anp
    x = np.random.default_rng(n).uniform(-3, 3, (3, 4))
    check_grad(lambda v: v ** n, lambda v: anp.power(v, n), x, key=f"pow{n}")


@pytest.mark.parametrize("exponent", [3.0, np.int64(3), 5, 1, 0, -2])
def test_other_exponents_still_call_pow(exponent):
    x = np.linspace(0.5, 2.0, 7)
    program = vkml.program(lambda v: v ** exponent, x)
    assert "pow" in [e.prim.name for e in program.eqns]
    tensor_exponent = vkml.program(lambda v, e: v ** e, x, np.full(7, 3.0))
    assert "pow" in [e.prim.name for e in tensor_exponent.eqns]
    assert "pow" not in [e.prim.name for e in vkml.program(lambda v: v ** 3, x).eqns]
