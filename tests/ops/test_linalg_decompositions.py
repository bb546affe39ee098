"""The decompositions (eigh, svd, qr) and what is built on them, checked as the systematic table
checks every function: values against NumPy/SciPy, gradients against central differences (and
autograd where it has the function), jvp, vmap -- on the NumPy backend and the cpu tier (where a
program holding a decomposition runs on NumPy).  Eigen- and singular vectors are compared with
their signs fixed (each column's largest entry positive), since either sign is a right answer.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

import vkml
import vkml.numpy as vnp
import vkml.scipy.linalg as vsl
from backends_under_test import BACKENDS
from test_numpy_systematic import (Case, check_gradients, check_jvp, check_value, check_vmap, f64,
                                   with_params)

pytestmark = pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)

FEW = settings(max_examples=2, deadline=None)


def general(shape):
    """Matrices with well separated singular values (no ties: the vectors are unique)."""
    def draw(data):
        # a dense part too: an exactly zero subdiagonal is where LAPACK's Householder signs jump
        seed = data.draw(st.integers(0, 2 ** 16))
        a = data.draw(f64(shape, -1.0, 1.0)) + 0.3 * np.random.default_rng(seed).normal(size=shape)
        k = min(shape[-2:])
        a[..., :k, :k] += np.diag(np.arange(1.0, k + 1.0) * 1.5)
        return [a], {}
    return draw


def symmetric(n=3):
    def draw(data):
        a = data.draw(f64((n, n), -1.0, 1.0))
        return [(a + a.T) / 2 + np.diag(np.arange(n) * 2.0)], {}
    return draw


def _sym(a, xp):
    return (a + xp.swapaxes(a, -1, -2)) / 2


def signed(columns_of, xp):
    """``columns_of(a)`` (a matrix of vectors) times the sign of each column's entry of largest
    magnitude (a constant: the sign is a choice, not a function of the input)."""
    def f(a):
        v = columns_of(a)
        idx = xp.argmax(xp.abs(v), axis=-2)
        pick = xp.take_along_axis(v, xp.expand_dims(idx, -2), -2)
        sign = xp.sign(pick)
        return v * (vkml.stop_gradient(sign) if xp is vnp else sign)
    return f


#: vmap's second example: the inputs scaled (a permutation of a matrix's elements may be singular)
SCALED = lambda args: [0.9 * a for a in args]      # noqa: E731

CASES = [
    Case("eigvalsh", lambda a: vnp.linalg.eigvalsh(_sym(a, vnp)), None, symmetric(),
         ref=lambda a: np.linalg.eigvalsh(_sym(a, np))),
    Case("eigh.eigenvectors", signed(lambda a: vnp.linalg.eigh(_sym(a, vnp)).eigenvectors, vnp), None,
         symmetric(), ref=signed(lambda a: np.linalg.eigh(_sym(a, np)).eigenvectors, np), rtol=1e-10),
    Case("svdvals", vnp.linalg.svdvals, None, general((4, 3)), ref=np.linalg.svdvals),
    Case("svd.U", signed(lambda a: vnp.linalg.svd(a, full_matrices=False).U, vnp), None, general((4, 3)),
         ref=signed(lambda a: np.linalg.svd(a, full_matrices=False).U, np), rtol=1e-10),
    Case("svd.Vh(wide)", signed(lambda a: vnp.linalg.svd(a, full_matrices=False).Vh.T, vnp), None,
         general((2, 4)), ref=signed(lambda a: np.linalg.svd(a, full_matrices=False).Vh.T, np), rtol=1e-10),
    Case("qr.Q", lambda a: vnp.linalg.qr(a).Q, None, general((4, 3)), ref=lambda a: np.linalg.qr(a).Q),
    Case("qr.R", lambda a: vnp.linalg.qr(a).R, None, general((3, 3)), ref=lambda a: np.linalg.qr(a).R),
    Case("pinv", vnp.linalg.pinv, None, general((3, 2)), ref=np.linalg.pinv, batch=SCALED),
    Case("lstsq", lambda a, b: vnp.linalg.lstsq(a, b).x, None,
         lambda d: ([general((4, 2))(d)[0][0], d.draw(f64((4,)))], {}),
         ref=lambda a, b: np.linalg.lstsq(a, b)[0]),
    Case("matrix_power", vnp.linalg.matrix_power, None,
         with_params(general((3, 3)), n=[1, 3, -2]), ref=np.linalg.matrix_power, batch=SCALED),
    Case("multi_dot", lambda a, b, c: vnp.linalg.multi_dot([a, b, c]), None,
         lambda d: ([d.draw(f64((2, 3))), d.draw(f64((3, 3))), d.draw(f64((3,)))], {}),
         ref=lambda a, b, c: np.linalg.multi_dot([a, b, c])),
    Case("cond", vnp.linalg.cond, None, with_params(general((3, 3)), p=[None, -2, "fro", 1]),
         ref=np.linalg.cond, rtol=1e-10),
    Case("norm(2/-2/nuc)", vnp.linalg.norm, None, with_params(general((3, 4)), ord=[2, -2, "nuc"]),
         ref=np.linalg.norm),
    Case("vector_norm", vnp.linalg.vector_norm, None,
         with_params(general((2, 3)), axis=[None, (0, 1), 1], ord=[2, 1, np.inf]),
         ref=lambda x, axis=None, ord=2: np.linalg.vector_norm(x, axis=axis, ord=ord)),
    Case("expm", vsl.expm, None, with_params(general((3, 3))), ref=scipy.linalg.expm, rtol=1e-11),
    Case("solve_triangular", lambda a, b: vsl.solve_triangular(a, b, lower=True), None,
         lambda d: ([general((3, 3))(d)[0][0], d.draw(f64((3, 2)))], {}),
         ref=lambda a, b: scipy.linalg.solve_triangular(a, b, lower=True), batch=SCALED),
    Case("cho_solve", lambda a, b: vsl.cho_solve(vsl.cho_factor(a @ a.T + 3 * np.eye(3)), b), None,
         lambda d: ([d.draw(f64((3, 3), -1.0, 1.0)), d.draw(f64((3,)))], {}),
         ref=lambda a, b: scipy.linalg.cho_solve(scipy.linalg.cho_factor(a @ a.T + 3 * np.eye(3)), b)),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
@FEW
@given(data=st.data())
def test_function(case, data):
    args, params = case.draw(data)
    check_value(case, args, params)
    grads = check_gradients(case, args, params)
    check_jvp(case, args, params, grads)
    check_vmap(case, args, params)


def test_results_are_numpys_named_tuples():
    a = np.array([[2.0, 1.0], [1.0, 3.0]])
    assert set(vnp.linalg.eigh(a)._fields) == {"eigenvalues", "eigenvectors"}
    assert vnp.linalg.svd(a)._fields == ("U", "S", "Vh")
    assert vnp.linalg.qr(a)._fields == ("Q", "R")
    assert vnp.linalg.slogdet(a).logabsdet.item() == pytest.approx(np.log(5.0))
    assert vnp.linalg.matrix_rank(np.ones((3, 3))).item() == 1
    np.testing.assert_array_equal(vnp.linalg.matrix_power(a, 0).numpy(), np.eye(2))
    np.testing.assert_allclose(vnp.linalg.svd(a, compute_uv=False).numpy(), np.linalg.svd(a, compute_uv=False))
    np.testing.assert_allclose(vnp.linalg.qr(np.ones((3, 2)), mode="r").numpy(), np.linalg.qr(np.ones((3, 2)), mode="r"))


def test_what_has_no_derivative_is_refused_with_the_fix():
    with pytest.raises(vkml.ArgumentError, match="full_matrices=False"):
        vnp.linalg.svd(np.ones((3, 2)))
    with pytest.raises(vkml.ArgumentError, match="mode='reduced'"):
        vnp.linalg.qr(np.ones((3, 2)), mode="complete")
    with pytest.raises(vkml.ShapeError, match="rows as columns"):
        vkml.grad(lambda a: vnp.sum(vnp.linalg.qr(a).R))(np.ones((2, 3)))
    with pytest.raises(vkml.ShapeError, match="square"):
        vnp.linalg.eigh(np.ones((2, 3)))


def test_a_decomposition_runs_on_numpy_from_the_cpu_tier(vk_backend):
    f = vkml.jit(lambda a: vnp.sum(vnp.linalg.svdvals(a)))
    got = f(np.eye(3) * 2.0)
    assert got.item() == pytest.approx(6.0)
