"""Derivatives where vkml once disagreed with JAX and autograd; each checked against an
independent oracle (HIPS autograd, or the calculus written out) and finite differences."""

from __future__ import annotations

import functools

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml

# computing both sides of a choice (an untaken sqrt branch at 0, 0 ** -1 under a where) is meant
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

BACKENDS = pytest.mark.parametrize("vk_backend", ["numpy", "cpu"], indirect=True)


def _central(f, x, h=1e-6):
    return (float(f(x + h)) - float(f(x - h))) / (2 * h)


# -- grad with argnums in a chosen order ------------------------------------------------------------

def _three(lib, x, y, z):
    return x * 2.0 + y * 3.0 + lib.sin(z) * 5.0 * x


@BACKENDS
def test_grad_returns_gradients_in_argnums_order(vk_backend):
    args = (1.0, 2.0, 3.0)
    g = vkml.grad(lambda x, y, z: _three(vkml, x, y, z), argnums=(2, 0))(*args)
    want = autograd.grad(lambda x, y, z: _three(anp, x, y, z), argnum=(2, 0))(*args)
    assert len(g) == 2
    np.testing.assert_allclose([float(g[0]), float(g[1])], want, rtol=1e-12)
    # d/dz = 5 x cos z, d/dx = 2 + 5 sin z
    np.testing.assert_allclose([float(g[0]), float(g[1])], [5 * np.cos(3.0), 2 + 5 * np.sin(3.0)])


def test_value_and_grad_keeps_argnums_order_with_pytree_arguments():
    def f(a, b, c):
        return vkml.sum(a["w"] * c) + b * vkml.sum(c * c)

    a, b, c = {"w": np.array([1.0, 2.0])}, 0.5, np.array([3.0, -1.0])
    value, (gc, ga, gb) = vkml.value_and_grad(f, argnums=(2, 0, 1))(a, b, c)
    assert float(value) == pytest.approx(1.0 * 3.0 - 2.0 + 0.5 * 10.0)
    np.testing.assert_allclose(gc.numpy(), a["w"] + 2 * b * c)
    np.testing.assert_allclose(ga["w"].numpy(), c)
    assert float(gb) == pytest.approx(10.0)


def test_grad_with_repeated_argnums_gives_the_gradient_twice():
    g = vkml.grad(lambda x, y: x * y * y, argnums=(1, 0, 1))(2.0, 3.0)
    np.testing.assert_allclose([float(t) for t in g], [12.0, 9.0, 12.0])


# -- custom_vjp whose bwd returns None --------------------------------------------------------------

@vkml.custom_vjp
def clip_gradient(lo, hi, x):
    return x


def _clip_fwd(lo, hi, x):
    return x, (lo, hi)


def _clip_bwd(res, g):
    lo, hi = res
    return None, None, vkml.clip(g, lo, hi)


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


@BACKENDS
def test_custom_vjp_none_is_a_zero_cotangent_for_that_argument(vk_backend):
    # JAX's clip_gradient test: the cotangent 1 of x is clipped to 0.2 (a dropped None put it
    # on the wrong argument and gave 0); a second call runs the cached derivation
    for _ in range(2):
        assert float(vkml.grad(lambda x: clip_gradient(-0.2, 0.2, x))(2.0)) == pytest.approx(0.2)
    # a cotangent inside the bounds passes unchanged: 0.1 cos(x)
    g = vkml.grad(lambda x: clip_gradient(-0.2, 0.2, vkml.sin(x)) * 0.1)(0.3)
    assert float(g) == pytest.approx(0.1 * np.cos(0.3))
    g = vkml.grad(lambda x: clip_gradient(-0.2, 0.2, vkml.sin(x) * 0.1))(0.3)
    assert float(g) == pytest.approx(0.2 * 0.1 * np.cos(0.3))
    lo_hi = vkml.grad(lambda lo, hi, x: clip_gradient(lo, hi, x), argnums=(0, 1, 2))(-0.2, 0.2, 2.0)
    np.testing.assert_allclose([float(t) for t in lo_hi], [0.0, 0.0, 0.2])


def test_custom_vjp_none_for_a_pytree_argument_and_a_wrong_structure_is_refused():
    @vkml.custom_vjp
    def scale(params, x):
        return params["a"] * x

    scale.defvjp(lambda params, x: (params["a"] * x, params["a"]), lambda a, g: (None, a * g))
    params = {"a": np.array([2.0, 3.0])}
    g = vkml.grad(lambda x: vkml.sum(scale(params, x)))(np.array([1.0, 1.0]))
    np.testing.assert_allclose(g.numpy(), [2.0, 3.0])
    gp = vkml.grad(lambda p: vkml.sum(scale(p, np.ones(2))))(params)
    np.testing.assert_allclose(gp["a"].numpy(), [0.0, 0.0])

    @vkml.custom_vjp
    def bad(x, y):
        return x * y

    bad.defvjp(lambda x, y: (x * y, (x, y)), lambda r, g: ((g, g), None))
    with pytest.raises(vkml.VkmlError, match="cotangent 0 has structure"):
        vkml.grad(lambda x: bad(x, 2.0))(1.0)


# -- grad of vmap of a cond that guards a singular branch ----------------------------------------------

def _safe_sqrt(x):
    return vkml.cond(x > 0, lambda x: vkml.sqrt(x), lambda x: 0.0 * x, x)


def _safe_sqrt_ag(x):
    return anp.sqrt(x) if x > 0 else 0.0 * x


XS = np.array([0.0, 1.0, 4.0, 0.0, 2.25])
WANT = np.array([autograd.grad(_safe_sqrt_ag)(x) for x in XS])   # 0 at 0, 1/(2 sqrt x) elsewhere


@BACKENDS
def test_grad_of_vmapped_safe_sqrt_is_zero_where_the_guard_holds(vk_backend):
    np.testing.assert_allclose(WANT, [0.0, 0.5, 0.25, 0.0, 1 / 3])
    g = vkml.grad(lambda x: vkml.sum(vkml.vmap(_safe_sqrt)(x)))(XS).numpy()
    np.testing.assert_allclose(g, WANT)
    np.testing.assert_allclose(vkml.vmap(vkml.grad(_safe_sqrt))(XS).numpy(), WANT)
    np.testing.assert_allclose(vkml.vmap(_safe_sqrt)(XS).numpy(), np.sqrt(XS))


@pytest.mark.filterwarnings("ignore:Output seems independent of input")   # autograd, at x == 0
def test_forward_mode_and_second_order_of_vmapped_cond_are_finite():
    _, t = vkml.jvp(vkml.vmap(_safe_sqrt), (XS,), (np.ones_like(XS),))
    np.testing.assert_allclose(t.numpy(), WANT)
    jac = vkml.jacrev(vkml.vmap(_safe_sqrt))(XS).numpy()
    np.testing.assert_allclose(jac, np.diag(WANT))
    # second derivative: -1/4 x^(-3/2) where x > 0, 0 at 0
    h = vkml.grad(lambda x: vkml.sum(vkml.grad(lambda y: vkml.sum(vkml.vmap(_safe_sqrt)(y)))(x)))(XS)
    want = np.array([autograd.grad(autograd.grad(_safe_sqrt_ag))(x) for x in XS])
    np.testing.assert_allclose(h.numpy(), want)


def test_vmapped_switch_with_an_unbatched_capture_masks_each_branch():
    """Three branches, closing over a scale shared by every example: only the examples that take
    a branch get its derivative (sqrt at 0 is not taken), and the scale gets the sum of the
    taken ones."""
    idx = np.array([0, 1, 2, 1])
    xs = np.array([0.0, 2.0, 3.0, 0.5])

    def f(scale, xs):
        def one(i, x):
            return vkml.switch(i, [lambda x: 0.0 * x, lambda x: vkml.sqrt(x) * scale,
                                   lambda x: x / scale], x)
        return vkml.sum(vkml.vmap(one)(idx, xs))

    def f_ag(scale, xs):
        branches = [lambda x: 0.0 * x, lambda x: anp.sqrt(x) * scale, lambda x: x / scale]
        return sum(branches[i](x) for i, x in zip(idx, xs))

    g_scale, g_x = vkml.grad(f, argnums=(0, 1))(1.5, xs)
    want_scale, want_x = autograd.grad(f_ag, argnum=(0, 1))(1.5, xs)
    assert float(g_scale) == pytest.approx(want_scale)
    np.testing.assert_allclose(g_x.numpy(), want_x)
    assert np.isfinite(g_x.numpy()).all()


# -- pow's derivative in the exponent at a zero base ---------------------------------------------------

@BACKENDS
def test_pow_slope_in_the_exponent_at_zero_base_is_zero(vk_backend):
    for y in (2.0, 0.5, 3.0):
        assert float(vkml.grad(lambda y: 0.0 ** y)(y)) == 0.0
        assert float(vkml.grad(lambda y: vkml.pow(0.0, y))(y)) == autograd.grad(lambda y: 0.0 ** y)(y)
    # elsewhere it is still log(x) x^y, and in the base y x^(y-1)
    gx, gy = vkml.grad(lambda x, y: x ** y, argnums=(0, 1))(1.7, 2.3)
    assert float(gx) == pytest.approx(2.3 * 1.7 ** 1.3)
    assert float(gy) == pytest.approx(np.log(1.7) * 1.7 ** 2.3)
    assert float(gy) == pytest.approx(_central(lambda y: 1.7 ** y, 2.3), rel=1e-7)


def test_pow_slopes_at_zero_base_and_exponent_are_finite():
    # x ** 0 is constant in x: slope 0 (y * x^(y-1) would be 0 * inf)
    assert float(vkml.grad(lambda x: x ** 0.0)(0.0)) == 0.0
    xs = np.array([0.0, 0.5, 2.0])
    g = vkml.grad(lambda y: vkml.sum(vkml.pow(xs, y)))(2.0)
    assert float(g) == pytest.approx(autograd.grad(lambda y: anp.sum(xs[1:] ** y))(2.0))
    # second derivative in the exponent at a zero base: also 0
    assert float(vkml.grad(vkml.grad(lambda y: 0.0 ** y))(2.0)) == 0.0


# -- a custom rule that calls its own function (JAX's ``ans = f(x)`` in the rule) -------------------

def _log1pexp_ag(x):
    return anp.log(1.0 + anp.exp(x))


@vkml.custom_jvp
def log1pexp(x):
    return vkml.log(1.0 + vkml.exp(x))


@log1pexp.defjvp
def _log1pexp_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    ans = log1pexp(x)                                   # the function itself, inside its rule
    return ans, (1.0 - 1.0 / (1.0 + vkml.exp(x))) * t   # stays finite where exp(x) overflows


POINTS = [-3.0, -0.5, 0.0, 0.7, 4.0]


@BACKENDS
def test_custom_jvp_rule_calling_its_own_function_evaluates_the_function(vk_backend):
    for x in POINTS:
        g = float(vkml.grad(log1pexp)(x))
        assert g == pytest.approx(float(autograd.grad(_log1pexp_ag)(x)), rel=1e-12)
        assert g == pytest.approx(_central(lambda v: np.log1p(np.exp(v)), x), rel=1e-7)
    # the rule, not the function's own derivative, is what ran: exp(1000) overflows, and
    # differentiating log(1 + exp(x)) there gives inf / inf
    with np.errstate(over="ignore", invalid="ignore"):
        assert float(vkml.grad(log1pexp)(1000.0)) == 1.0
    # the primal value is the function's, and so is the value the rule computes for it
    value, tangent = vkml.jvp(log1pexp, (0.5,), (2.0,))
    assert float(value) == pytest.approx(np.log1p(np.exp(0.5)), rel=1e-14)
    assert float(tangent) == pytest.approx(2.0 / (1.0 + np.exp(-0.5)), rel=1e-14)


def test_custom_jvp_rule_calling_its_own_function_under_jit_vmap_and_second_order():
    xs = np.array(POINTS)
    want = np.array([autograd.grad(_log1pexp_ag)(x) for x in POINTS])
    np.testing.assert_allclose(vkml.jit(vkml.vmap(vkml.grad(log1pexp)))(xs).numpy(), want,
                               rtol=1e-12)
    second = np.array([autograd.grad(autograd.grad(_log1pexp_ag))(x) for x in POINTS])
    got = [float(vkml.grad(vkml.grad(log1pexp))(x)) for x in POINTS]
    np.testing.assert_allclose(got, second, rtol=1e-10)


def _softplus_vjp_rules(f):
    """fwd and bwd of log(1 + exp(x)) that both call ``f`` itself: d/dx = 1 - exp(-f(x))."""
    def fwd(x):
        return f(x), x

    def bwd(x, ct):
        return (ct * (1.0 - vkml.exp(-f(x))),)
    return fwd, bwd


@BACKENDS
def test_custom_vjp_fwd_and_bwd_calling_their_own_function(vk_backend):
    @vkml.custom_vjp
    def softplus(x):
        return vkml.log(1.0 + vkml.exp(x))

    softplus.defvjp(*_softplus_vjp_rules(softplus))
    for x in POINTS:
        g = float(vkml.grad(softplus)(x))
        assert g == pytest.approx(float(autograd.grad(_log1pexp_ag)(x)), rel=1e-10)
        assert g == pytest.approx(_central(lambda v: np.log1p(np.exp(v)), x), rel=1e-7)
    xs = np.array(POINTS)
    np.testing.assert_allclose(vkml.grad(lambda v: vkml.sum(softplus(v) * 3.0))(xs).numpy(),
                               3.0 * np.array([autograd.grad(_log1pexp_ag)(x) for x in POINTS]),
                               rtol=1e-10)


def test_custom_vjp_with_nondiff_argnums_whose_fwd_calls_the_function():
    @functools.partial(vkml.custom_vjp, nondiff_argnums=(0,))
    def scaled(k, x):
        return k * vkml.log(1.0 + vkml.exp(x))

    def fwd(k, x):
        return scaled(k, x), x

    def bwd(k, x, ct):
        return (ct * k * (1.0 - 1.0 / (1.0 + vkml.exp(x))),)

    scaled.defvjp(fwd, bwd)
    for x in POINTS:
        want = autograd.grad(lambda v: 2.5 * _log1pexp_ag(v))(x)
        assert float(vkml.grad(lambda v: scaled(2.5, v))(x)) == pytest.approx(want, rel=1e-12)


def test_custom_jvp_rule_is_traced_once_per_shape_and_again_after_a_new_rule():
    traced = []

    @vkml.custom_jvp
    def f(x):
        return vkml.sin(x)

    @f.defjvp
    def _rule(primals, tangents):
        traced.append(1)
        return f(primals[0]), tangents[0] * vkml.cos(primals[0])

    for x in (0.1, 0.2, 0.3):
        assert float(vkml.grad(f)(x)) == pytest.approx(np.cos(x), rel=1e-14)
    assert len(traced) == 1                        # one scalar shape: one trace of the rule
    vkml.grad(lambda v: vkml.sum(f(v)))(np.ones(3))
    assert len(traced) == 2                        # a new shape traces it again

    @f.defjvp
    def _doubled(primals, tangents):
        return f(primals[0]), 2.0 * tangents[0] * vkml.cos(primals[0])

    assert float(vkml.grad(f)(0.1)) == pytest.approx(2.0 * np.cos(0.1), rel=1e-14)   # the new rule
