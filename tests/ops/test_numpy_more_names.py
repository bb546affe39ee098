"""The NumPy and SciPy names code ported from NumPy or JAX reaches for, each checked as the
systematic table checks the first ones (``test_numpy_systematic``): its value against NumPy or
SciPy, its gradient against central differences (and autograd where it has the function), jvp
against differences, vmap example by example -- on the NumPy backend and the compiled cpu tier.
Then the functions whose length depends on the data, with and without ``size=``, and traced.
"""

from __future__ import annotations

import autograd.numpy as anp
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

import vkml
import vkml.numpy as vnp
import vkml.scipy.special as vsp
from backends_under_test import BACKENDS
from test_numpy_systematic import (Case, binary, check_gradients, check_jvp, check_value,
                                   check_vmap, distinct_values, f64, fixed_shapes, off_integers, unary,
                                   with_params)

import oracle as O

pytestmark = pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)

FEW = settings(max_examples=2, deadline=None)


def vk(name):
    return getattr(vnp, name)


def distinct_rows(shape, spacing=0.2):
    """Values at least ``spacing`` apart (order statistics have no ties, so a derivative)."""
    def draw(data):
        return [data.draw(O.distinct(shape, spacing=spacing))], {}
    return draw


def sorted_points(n=5):
    def draw(data):
        xp = np.sort(data.draw(O.distinct((n,), spacing=0.3)))
        fp = data.draw(f64((n,)))
        x = data.draw(f64((4,), float(xp[0]) - 0.5, float(xp[-1]) + 0.5))
        # away from the knots (the derivative jumps there)
        x = np.where(np.min(np.abs(x[:, None] - xp[None, :]), 1) < 0.05, x + 0.1, x)
        return [x, xp, fp], {}
    return draw


def with_nans(draw_args):
    def draw(data):
        args, params = draw_args(data)
        x = args[0].copy()
        x.flat[data.draw(st.integers(0, x.size - 1))] = np.nan
        return [x] + args[1:], params
    return draw


def positive(lo=0.2, hi=3.0, shapes=((3,), (2, 3))):
    def draw(data):
        return [data.draw(f64(data.draw(st.sampled_from(shapes)), lo, hi))], {}
    return draw


ELEMENTWISE = [
    Case("copysign", vk("copysign"), None, binary(x=(0.3, 3.0), y=(0.5, 3.0)), ref=np.copysign),
    Case("cbrt", vk("cbrt"), None, positive(0.2, 8.0), ref=np.cbrt),
    Case("sinc", vk("sinc"), anp.sinc, unary(0.1, 3.0), ref=np.sinc),
    Case("fabs", vk("fabs"), None, positive(), ref=np.fabs),
    Case("fmax", vk("fmax"), None, distinct_values(2), ref=np.fmax),
    Case("fmin", vk("fmin"), None, distinct_values(2), ref=np.fmin),
    Case("float_power", vk("float_power"), None, binary(x=(0.3, 3.0)), ref=np.float_power),
    Case("logaddexp2", vk("logaddexp2"), anp.logaddexp2, binary(), ref=np.logaddexp2),
    Case("positive", vk("positive"), None, unary(), ref=np.positive),
    Case("signbit", vk("signbit"), None, unary(), ref=np.signbit, grad=False),
    Case("heaviside", vk("heaviside"), None, binary(), ref=np.heaviside, grad=False),
    Case("isclose", vk("isclose"), None, binary(), ref=np.isclose, grad=False),
    Case("real", vk("real"), anp.real, unary(), ref=np.real),
    Case("conj", vk("conj"), anp.conj, unary(), ref=np.conj),
]

REDUCTIONS = [
    Case("median", vk("median"), None, with_params(distinct_rows((2, 5)), axis=[None, 0, 1]), ref=np.median),
    Case("quantile", lambda x, **k: vnp.quantile(x, [0.1, 0.5, 0.8], **k), None,
         with_params(distinct_rows((3, 4)), axis=[None, 1],
                     method=["linear", "midpoint", "lower", "higher", "nearest"]),
         ref=lambda x, **k: np.quantile(x, [0.1, 0.5, 0.8], **k)),
    Case("percentile", lambda x, **k: vnp.percentile(x, 30.0, **k), None,
         with_params(distinct_rows((3, 4)), axis=[None, 0], keepdims=[False, True]),
         ref=lambda x, **k: np.percentile(x, 30.0, **k)),
    Case("average", vk("average"), None,
         lambda d: ([d.draw(f64((2, 3)))], {"axis": 1, "weights": d.draw(f64((3,), 0.5, 2.0))}),
         ref=np.average),
    Case("cov", vk("cov"), None, with_params(fixed_shapes((3, 5)), rowvar=[True, False], bias=[False, True]), ref=np.cov),
    Case("corrcoef", vk("corrcoef"), None, distinct_rows((3, 5)), ref=np.corrcoef),
    Case("nansum", vk("nansum"), None, with_nans(with_params(fixed_shapes((2, 3)), axis=[None, 1])), ref=np.nansum),
    Case("nanmean", vk("nanmean"), None, with_nans(with_params(fixed_shapes((2, 3)), axis=[None, 0])), ref=np.nanmean),
    Case("nanvar", vk("nanvar"), None, with_nans(with_params(fixed_shapes((2, 4)), axis=[None, 1], ddof=[0, 1])), ref=np.nanvar),
    Case("nanstd", vk("nanstd"), None, with_nans(distinct_rows((2, 4))), ref=np.nanstd),
    Case("nanprod", vk("nanprod"), None, with_nans(fixed_shapes((2, 3), lo=0.5, hi=2.0)), ref=np.nanprod),
    Case("nanmax", vk("nanmax"), None, with_nans(distinct_rows((2, 4))), ref=np.nanmax),
    Case("nanmin", vk("nanmin"), None, with_nans(with_params(distinct_rows((2, 4)), axis=[1])), ref=np.nanmin),
    Case("nanargmax", vk("nanargmax"), None, with_nans(with_params(distinct_rows((2, 4)), axis=[None, 1])), ref=np.nanargmax, grad=False),
    Case("nanargmin", vk("nanargmin"), None, with_nans(distinct_rows((2, 4))), ref=np.nanargmin, grad=False),
    Case("nancumsum", vk("nancumsum"), None, with_nans(fixed_shapes((2, 3))), ref=np.nancumsum),
    Case("nancumprod", vk("nancumprod"), None, with_nans(fixed_shapes((4,), lo=0.5, hi=2.0)), ref=np.nancumprod),
    Case("nanmedian", vk("nanmedian"), None, with_nans(with_params(distinct_rows((2, 5)), axis=[None, 1])), ref=np.nanmedian),
    Case("nanquantile", lambda x, **k: vnp.nanquantile(x, [0.25, 0.6], **k), None,
         with_nans(with_params(distinct_rows((2, 5)), axis=[None, 1])),
         ref=lambda x, **k: np.nanquantile(x, [0.25, 0.6], **k)),
    Case("argmax(keepdims)", lambda x: vnp.argmax(x, axis=1, keepdims=True), None, distinct_rows((2, 4)),
         ref=lambda x: np.argmax(x, axis=1, keepdims=True), grad=False),
    Case("cumulative_sum", lambda x: vnp.cumulative_sum(x, axis=1, include_initial=True), None,
         fixed_shapes((2, 3)), ref=lambda x: np.concatenate([np.zeros((2, 1)), np.cumsum(x, 1)], 1)),
    Case("trapezoid", vk("trapezoid"), None, with_params(fixed_shapes((2, 5)), dx=[0.5, 1.0]), ref=np.trapezoid),
    Case("trapezoid(x)", vk("trapezoid"), None,
         lambda d: ([d.draw(f64((2, 4))), np.array([0.0, 0.5, 1.5, 2.0])], {}), ref=np.trapezoid),
]

SHAPES_AND_MAKING = [
    Case("pad", vk("pad"), None,
         with_params(fixed_shapes((3, 4)), pad_width=[1, (1, 2), ((0, 1), (2, 0))],
                     mode=["constant", "edge", "reflect", "symmetric", "wrap"]),
         ref=np.pad),
    Case("pad(constant_values)", lambda x: vnp.pad(x, (2, 1), constant_values=(-1.0, 5.0)), None,
         fixed_shapes((4,)), ref=lambda x: np.pad(x, (2, 1), constant_values=(-1.0, 5.0))),
    Case("diff", vk("diff"), None, with_params(fixed_shapes((3, 5)), n=[1, 2], axis=[0, -1]), ref=np.diff),
    Case("diff(prepend)", lambda x: vnp.diff(x, prepend=0.0, append=[[1.0], [2.0]]), None,
         fixed_shapes((2, 3)), ref=lambda x: np.diff(x, prepend=0.0, append=[[1.0], [2.0]])),
    Case("kron", vk("kron"), None, fixed_shapes((2, 3), (3, 2)), ref=np.kron),
    Case("cross", vk("cross"), None, fixed_shapes((2, 3), (2, 3)), ref=np.cross),
    Case("cross(2d)", vk("cross"), None, fixed_shapes((4, 2), (4, 2)),
         ref=lambda a, b: a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]),
    Case("convolve", vk("convolve"), None, with_params(fixed_shapes((6,), (3,)), mode=["full", "same", "valid"]), ref=np.convolve),
    Case("correlate", vk("correlate"), None, with_params(fixed_shapes((5,), (3,)), mode=["full", "same", "valid"]), ref=np.correlate),
    Case("polyval", vk("polyval"), None, fixed_shapes((4,), (5,)), ref=np.polyval),
    Case("interp", vk("interp"), None, sorted_points(), ref=np.interp),
    Case("rot90", vk("rot90"), None, with_params(fixed_shapes((2, 3)), k=[1, 2, 3, -1]), ref=np.rot90),
    Case("column_stack", lambda a, b: vnp.column_stack([a, b]), None, fixed_shapes((3,), (3, 2)),
         ref=lambda a, b: np.column_stack([a, b])),
    Case("dstack", lambda a, b: vnp.dstack([a, b]), None, fixed_shapes((2, 3), (2, 3)),
         ref=lambda a, b: np.dstack([a, b])),
    Case("atleast_3d", vk("atleast_3d"), None, fixed_shapes((3,)), ref=np.atleast_3d),
    Case("select", lambda x, y: vnp.select([x > 1.05, y < 0.55], [x, y], default=-5.0), None,
         binary(), ref=lambda x, y: np.select([x > 1.05, y < 0.55], [x, y], default=-5.0)),
    Case("concatenate(axis=None)", lambda a, b: vnp.concatenate([a, b], axis=None), None,
         fixed_shapes((2, 2), (3,)), ref=lambda a, b: np.concatenate([a, b], axis=None)),
    Case("searchsorted", lambda x: vnp.searchsorted(np.array([-1.0, 0.0, 1.0]), x, side="right"),
         None, unary(), ref=lambda x: np.searchsorted(np.array([-1.0, 0.0, 1.0]), x, side="right"),
         grad=False),
    Case("digitize", lambda x: vnp.digitize(x, np.array([2.0, 0.5, -1.0])), None, unary(),
         ref=lambda x: np.digitize(x, np.array([2.0, 0.5, -1.0])), grad=False),
]


def draw_special(lo, hi):
    return positive(lo, hi)


SPECIAL = [
    Case("erfc", vsp.erfc, None, unary(-3.0, 6.0), ref=scipy.special.erfc),
    Case("erfinv", vsp.erfinv, None, unary(-0.95, 0.95), ref=scipy.special.erfinv),
    Case("gammaln", vsp.gammaln, None, positive(0.1, 8.0), ref=scipy.special.gammaln),
    Case("digamma", vsp.digamma, None, positive(0.1, 8.0), ref=scipy.special.digamma),
    Case("gamma", vsp.gamma, None, off_integers(), ref=scipy.special.gamma, rtol=1e-10),
    Case("polygamma", lambda x: vsp.polygamma(2, x), None, positive(0.3, 6.0),
         ref=lambda x: scipy.special.polygamma(2, x)),
    Case("beta", vsp.beta, None, binary(x=(0.3, 4.0), y=(0.3, 4.0)), ref=scipy.special.beta, rtol=1e-10),
    Case("betaln", vsp.betaln, None, binary(x=(0.3, 4.0), y=(0.3, 4.0)), ref=scipy.special.betaln),
    Case("gammainc", vsp.gammainc, None, binary(x=(0.5, 6.0), y=(0.1, 9.0)), ref=scipy.special.gammainc, rtol=1e-10),
    Case("xlogy", vsp.xlogy, None, binary(y=(0.2, 3.0)), ref=scipy.special.xlogy),
    Case("xlog1py", vsp.xlog1py, None, binary(y=(-0.5, 3.0)), ref=scipy.special.xlog1py),
    Case("ndtr", vsp.ndtr, None, unary(-6.0, 6.0), ref=scipy.special.ndtr),
    Case("ndtri", vsp.ndtri, None, unary(0.02, 0.98), ref=scipy.special.ndtri),
    Case("log_ndtr", vsp.log_ndtr, None, unary(-30.0, 6.0), ref=scipy.special.log_ndtr, rtol=1e-11),
    Case("i0", vsp.i0, None, unary(-40.0, 40.0), ref=scipy.special.i0),
    Case("i1", vsp.i1, None, unary(-40.0, 40.0), ref=scipy.special.i1),
    Case("erfcx", vsp.erfcx, None, unary(-3.0, 40.0), ref=scipy.special.erfcx, rtol=1e-11),
    Case("entr", vsp.entr, None, positive(0.1, 3.0), ref=scipy.special.entr),
    Case("log_expit", vsp.log_expit, None, unary(-30.0, 30.0), ref=scipy.special.log_expit),
    Case("logsumexp(b)", lambda x, b: vsp.logsumexp(x, b=b), None, binary(y=(0.5, 2.0)),
         ref=lambda x, b: scipy.special.logsumexp(x, b=np.broadcast_to(b, np.broadcast_shapes(np.shape(x), np.shape(b))))),
]

CASES = ELEMENTWISE + REDUCTIONS + SHAPES_AND_MAKING + SPECIAL


@pytest.mark.parametrize("case", CASES, ids=repr)
@FEW
@given(data=st.data())
def test_function(case, data):
    args, params = case.draw(data)
    check_value(case, args, params)
    grads = check_gradients(case, args, params) if case.grad else None
    if case.grad:
        check_jvp(case, args, params, grads)
    check_vmap(case, args, params)


# -- lengths that depend on the data ----------------------------------------------------------------

def test_nonzero_unique_and_friends_match_numpy_on_values():
    x = np.array([[0.0, 2.0, 0.0], [3.0, 0.0, 2.0]])
    for got, want in zip(vnp.nonzero(x), np.nonzero(x)):
        np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(vnp.flatnonzero(x).numpy(), np.flatnonzero(x))
    np.testing.assert_array_equal(vnp.argwhere(x).numpy(), np.argwhere(x))
    np.testing.assert_array_equal(vnp.unique(x).numpy(), np.unique(x))
    vals, counts = vnp.unique(x, return_counts=True)
    want_vals, want_counts = np.unique(x, return_counts=True)
    np.testing.assert_array_equal(vals.numpy(), want_vals)
    np.testing.assert_array_equal(counts.numpy(), want_counts)


def test_inside_a_trace_size_is_needed_and_named():
    with pytest.raises(vkml.TracingError, match=r"size="):
        vkml.jit(lambda x: vnp.nonzero(x))(np.array([1.0, 0.0]))


def test_size_pads_with_fill_value_inside_jit_and_vmap():
    f = vkml.jit(lambda x: vnp.flatnonzero(x, size=4, fill_value=-1))
    np.testing.assert_array_equal(f(np.array([0.0, 5.0, 0.0, 7.0, 1.0, 2.0])).numpy(), [1, 3, 4, 5])
    np.testing.assert_array_equal(f(np.array([0.0, 5.0, 0.0, 0.0, 0.0, 0.0])).numpy(), [1, -1, -1, -1])
    u = vkml.vmap(lambda x: vnp.unique(x, size=3, fill_value=9.0))(np.array([[2.0, 1.0, 2.0],
                                                                             [5.0, 5.0, 5.0]]))
    np.testing.assert_array_equal(u.numpy(), [[1.0, 2.0, 9.0], [5.0, 9.0, 9.0]])


def test_unique_values_carry_a_gradient_to_the_elements_picked():
    x = vkml.tensor(np.array([3.0, 1.0, 3.0, 2.0]), requires_grad=True)
    vnp.sum(vnp.unique(x) * np.array([1.0, 10.0, 100.0])).backward()
    # each distinct value's weight goes to the first of its elements in sorted order
    np.testing.assert_array_equal(x.grad.numpy(), [100.0, 1.0, 0.0, 10.0])


def test_bincount_histogram_and_their_weights_gradient():
    x = np.array([0, 1, 1, 3, 5])
    np.testing.assert_array_equal(vnp.bincount(x).numpy(), np.bincount(x))
    np.testing.assert_array_equal(vnp.bincount(x, minlength=8).numpy(), np.bincount(x, minlength=8))
    w = vkml.tensor(np.arange(5.0), requires_grad=True)
    got = vnp.bincount(x, weights=w, length=6)
    np.testing.assert_allclose(got.numpy(), np.bincount(x, weights=np.arange(5.0), minlength=6))
    vnp.sum(got * np.arange(6.0)).backward()
    np.testing.assert_array_equal(w.grad.numpy(), x.astype(float))     # d/dw_i = position of x_i
    data = np.random.default_rng(0).normal(size=50)
    for kw in ({}, {"bins": 7}, {"bins": 4, "range": (-1.0, 1.0)}, {"bins": [-2.0, 0.0, 0.5, 3.0]},
               {"bins": 5, "density": True}):
        counts, edges = vnp.histogram(data, **kw)
        want_counts, want_edges = np.histogram(data, **kw)
        np.testing.assert_allclose(counts.numpy(), want_counts, rtol=1e-12)
        np.testing.assert_allclose(edges.numpy(), want_edges, rtol=1e-12)


def test_making_functions_match_numpy():
    for got, want in [(vnp.tri(3, 4, 1), np.tri(3, 4, 1)), (vnp.logspace(0, 3, 4, base=2.0), np.logspace(0, 3, 4, base=2.0)),
                      (vnp.indices((2, 3)), np.indices((2, 3))), (vnp.empty_like(np.ones((2, 2))), np.zeros((2, 2))),
                      (vnp.kron(np.eye(2), np.ones((2, 2))), np.kron(np.eye(2), np.ones((2, 2))))]:
        np.testing.assert_allclose(got.numpy(), want)
    for got, want in zip(vnp.triu_indices(4, 1), np.triu_indices(4, 1)):
        np.testing.assert_array_equal(got.numpy(), want)
    for got, want in zip(vnp.tril_indices(3, 0, 5), np.tril_indices(3, 0, 5)):
        np.testing.assert_array_equal(got.numpy(), want)
    for got, want in zip(vnp.unravel_index([22, 41, 37], (7, 6)), np.unravel_index([22, 41, 37], (7, 6))):
        np.testing.assert_array_equal(got.numpy(), want)
    for got, want in zip(vnp.hsplit(np.arange(12.0).reshape(3, 4), 2), np.hsplit(np.arange(12.0).reshape(3, 4), 2)):
        np.testing.assert_array_equal(got.numpy(), want)
    assert [a.shape for a in vnp.atleast_2d(1.0, [1.0, 2.0])] == [(1, 1), (1, 2)]
    assert vnp.array_equal([1, 2], [1, 2, 3]).item() is False
    assert vnp.allclose([1.0, np.nan], [1.0, np.nan], equal_nan=True).item() is True


def test_pad_and_unravel_refuse_what_numpy_refuses():
    with pytest.raises(vkml.ArgumentError, match="mode 'median' is not supported"):
        vnp.pad(np.ones(3), 1, mode="median")
    with pytest.raises(vkml.ArgumentError, match="outside an array of shape"):
        vnp.unravel_index([6], (2, 3))
    with pytest.raises(vkml.ArgumentError, match="q must be in"):
        vnp.quantile(np.ones(3), 1.5)


def test_tensor_methods_numpy_users_reach_for():
    a = np.arange(1.0, 13.0).reshape(3, 4) / 3.0
    t = vkml.tensor(a)
    for got, want in [(t.mT, a.T), (t.cumsum(axis=1), a.cumsum(1)), (t.cumprod(), a.cumprod()),
                      (t.prod(axis=0), a.prod(0)), (t.ravel(), a.ravel()), (t.round(2), a.round(2)),
                      (t.dot(a.T), a.dot(a.T)), (t.copy(), a), (t.std(axis=1, ddof=1), a.std(1, ddof=1)),
                      (vkml.tensor(np.ones((2, 3, 4))).mT, np.ones((2, 4, 3)))]:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-13)
    w = vkml.tensor(a, requires_grad=True)
    (w.cumprod(axis=1) * w.copy()).sum().backward()
    fd = O.central_diff(lambda v: float(np.sum(np.cumprod(v, 1) * v)), a)
    np.testing.assert_allclose(w.grad.numpy(), fd, rtol=1e-6)


COMPLEX_FUNCTIONS = ["exp", "log", "sqrt", "sin", "cos", "tanh", "expm1", "log1p", "tan", "sinh",
                     "cosh", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh"]


@pytest.mark.parametrize("name", COMPLEX_FUNCTIONS)
def test_complex_functions_values_and_gradients_follow_jax(name):
    """Values against NumPy's; the gradient of Re f(z) is f'(z) (JAX's convention), checked
    against central differences in x and y: df/dx - i df/dy."""
    z = np.array([0.3 + 0.4j, -0.7 + 0.2j, 1.3 - 0.6j])
    f_vk, f_np = getattr(vnp, name), getattr(np, name)
    np.testing.assert_allclose(f_vk(z).numpy(), f_np(z), rtol=1e-13)
    got = vkml.grad(lambda w: vnp.sum(vnp.real(f_vk(w))))(z).numpy()
    h = 1e-6
    d_dx = (np.real(f_np(z + h)) - np.real(f_np(z - h))) / (2 * h)
    d_dy = (np.real(f_np(z + 1j * h)) - np.real(f_np(z - 1j * h))) / (2 * h)
    np.testing.assert_allclose(got, d_dx - 1j * d_dy, rtol=1e-6, atol=1e-8)


def test_complex_expm1_is_accurate_near_zero_and_keeps_c99s_special_values():
    tiny = np.array([1e-12 + 1e-13j, -3e-15 + 2e-14j])
    np.testing.assert_allclose(vnp.expm1(tiny).numpy(), tiny + tiny ** 2 / 2, rtol=1e-14)
    inf, nan = np.inf, np.nan
    got = vnp.expm1(np.array([complex(inf, 0.0), complex(-inf, inf), complex(inf, nan),
                              complex(-0.0, 0.0)])).numpy()
    assert got[0] == complex(inf, 0.0) and got[1] == -1 and np.isinf(got[2].real) and \
        np.isnan(got[2].imag) and not np.signbit(got[3].real)


def test_complex_norms_see_magnitudes():
    a = np.array([[1j, 1.0], [0.0, 2 - 1j]])
    for kw in ({}, {"ord": 1}, {"ord": "fro"}, {"ord": np.inf}):
        np.testing.assert_allclose(vnp.linalg.norm(a, **kw).numpy(), np.linalg.norm(a, **kw))
    assert vnp.linalg.vector_norm(a.astype(np.complex64)).dtype == np.float32
    with pytest.raises(vkml.DTypeError, match="complex singular value"):
        vnp.linalg.norm(a, 2)
