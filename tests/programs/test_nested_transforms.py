"""Transformations nested inside each other, the inner ones closing over the outer ones' values.

``grad(lambda x: grad(lambda y: x * y ** 2)(1.0))`` is how meta-learning,
Hessian-vector products and "gradient descent inside a loop" are written: the
inner function reads ``x``, a traced value of the enclosing transformation.
Every order of grad / jvp / jacfwd / jacrev / linearize / vmap / scan / cond /
checkpoint is checked at depth 2 and 3 (and the outermost result differentiated
once more) against HIPS autograd running the same nesting with Python loops,
and against central finite differences of vkml's own forward pass.
"""

from __future__ import annotations

import itertools

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
from vkml.errors import TracingError

#: where a vmap or scan level evaluates its inner function: the level's point times each of these
ROWS = np.array([0.5, 1.25])
CORE = ("grad", "jvp", "jacfwd", "vmap", "scan")
EXTRA = ("jacrev", "linearize", "checkpoint", "cond")


def body(lib, xs):
    """A smooth function in which every argument interacts with every other one."""
    s, p = 0.0, 1.0
    for i, x in enumerate(xs):
        s = s + (0.5 + 0.25 * i) * x
        p = p * x
    return lib.sin(p) + s * s * s / 3.0 + lib.exp(0.2 * s) * p


def vkml_level(kind, h, point):
    """One level of nesting in vkml: a scalar made from the scalar function ``h`` near ``point``."""
    if kind == "grad":
        return vkml.grad(h)(point)
    if kind == "jvp":
        return vkml.jvp(h, (point,), (1.0,))[1]
    if kind == "jacfwd":
        return vkml.jacfwd(h)(point)
    if kind == "jacrev":
        return vkml.jacrev(h)(point)
    if kind == "linearize":
        return vkml.linearize(h, point)[1](1.0)
    if kind == "vmap":
        return vkml.vmap(h)(point * ROWS).sum()
    if kind == "scan":
        return vkml.scan(lambda c, y: (c + h(y), None), 0.0, point * ROWS)[0]
    if kind == "checkpoint":
        return vkml.checkpoint(h)(point)
    if kind == "cond":
        return vkml.cond(point > 0.9, h, lambda y: 2.0 * h(y), point)
    raise AssertionError(kind)


def autograd_level(kind, h, point):
    """The same level written for autograd: derivatives by autograd, maps and loops in Python."""
    if kind in ("grad", "jvp", "jacfwd", "jacrev", "linearize"):
        return autograd.grad(h)(point)
    if kind in ("vmap", "scan"):
        return sum(h(point * r) for r in ROWS)
    if kind == "checkpoint":
        return h(point)
    if kind == "cond":
        return h(point) if point > 0.9 else 2.0 * h(point)
    raise AssertionError(kind)


def nested(level, lib, kinds):
    """``a0 -> T1[y1 -> T2[y2 -> ... body(a0, y1, y2, ...)](p2)](p1)``: every inner function closes
    over all the outer levels' values, and each level's point depends on the level above."""
    def at(k, args):
        if k == len(kinds):
            return body(lib, args)
        point = 0.4 + 0.3 * k + 0.1 * args[-1]
        return level(kinds[k], lambda y: at(k + 1, args + (y,)), point)
    return lambda a0: at(0, (a0,))


def _check(kinds, a0=0.7, fd=True):
    f_vk = nested(vkml_level, vkml, kinds)
    f_ag = nested(autograd_level, anp, kinds)
    value = float(np.asarray(f_vk(a0)))
    slope = float(np.asarray(vkml.grad(f_vk)(a0)))
    np.testing.assert_allclose(value, f_ag(a0), rtol=1e-10)
    np.testing.assert_allclose(slope, autograd.grad(f_ag)(a0), rtol=1e-9)
    if fd:
        h = 1e-6
        diff = (float(np.asarray(f_vk(a0 + h))) - float(np.asarray(f_vk(a0 - h)))) / (2 * h)
        np.testing.assert_allclose(slope, diff, rtol=1e-6)


@pytest.mark.parametrize("kinds", list(itertools.product(CORE, repeat=2)), ids="-".join)
def test_closures_depth_2_every_order(kinds):
    _check(kinds)


@pytest.mark.parametrize("kinds", list(itertools.product(CORE, repeat=3)), ids="-".join)
def test_closures_depth_3_every_order(kinds):
    _check(kinds, fd=False)


@pytest.mark.parametrize("kinds", [("grad", "vmap", "scan", "grad"), ("scan", "jacfwd", "vmap", "jvp"),
                                   ("vmap", "grad", "checkpoint", "scan")], ids="-".join)
def test_closures_depth_4(kinds):
    _check(kinds, fd=False)


@pytest.mark.parametrize("kinds", [p for p in itertools.product(CORE + EXTRA, repeat=2)
                                   if set(p) & set(EXTRA)], ids="-".join)
def test_closures_through_jacrev_linearize_checkpoint_cond(kinds):
    _check(kinds, fd=False)


@pytest.mark.parametrize("kinds", [("grad", "vmap", "scan"), ("vmap", "scan", "grad"),
                                   ("scan", "jacfwd", "grad"), ("checkpoint", "grad", "cond")],
                         ids="-".join)
@pytest.mark.parametrize("vk_backend", ["numpy", "cpu"], indirect=True)
def test_closures_on_each_backend(kinds, vk_backend):
    _check(kinds)


def test_the_reported_case():
    out = vkml.grad(lambda x: vkml.grad(lambda y: x * y ** 2)(1.0))(2.0)
    # d/dx [d/dy x y^2 at y=1] = d/dx 2x = 2
    assert float(out) == 2.0


# -- Hessian-vector products written with closures ------------------------------------------------

A = np.array([[2.0, 0.5, -1.0], [0.5, 1.0, 0.25], [-1.0, 0.25, 3.0]])
X = np.array([0.3, -0.7, 1.1])


def _f(lib, x):
    return lib.sum(lib.sin(x) * x * x) + lib.sum(x * (A @ x)) / 2.0


def test_hessian_vector_products_by_closure_build_the_hessian():
    want = autograd.hessian(lambda x: _f(anp, x))(X)

    def fwd_over_rev(v):          # the direction v is a value of the enclosing vmap
        return vkml.jvp(lambda t: vkml.grad(lambda x: _f(vkml, x))(X + t * v), (0.0,), (1.0,))[1]

    def rev_over_rev(v):
        return vkml.grad(lambda x: vkml.sum(vkml.grad(lambda y: _f(vkml, y))(x) * v))(X)

    eye = np.eye(3)
    np.testing.assert_allclose(vkml.vmap(fwd_over_rev)(eye).numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(vkml.vmap(rev_over_rev)(eye).numpy(), want, rtol=1e-10)


def test_jitted_hvp_closing_over_its_arguments_traces_once():
    hvp = vkml.jit(lambda x, v: vkml.jvp(lambda t: vkml.grad(lambda y: _f(vkml, y))(x + t * v),
                                          (0.0,), (1.0,))[1])
    rng = np.random.default_rng(1)
    for _ in range(3):
        x, v = rng.standard_normal(3), rng.standard_normal(3)
        want = autograd.hessian(lambda y: _f(anp, y))(x) @ v
        np.testing.assert_allclose(hvp(x, v).numpy(), want, rtol=1e-10)
    info = hvp.cache_info()
    assert info["traces"] == 1 and info["hits"] == 2 and info["keys"] == 1


# -- gradient descent inside a scan; meta-learning -------------------------------------------------

XS = np.array([[1.0, 0.5], [-0.3, 2.0], [0.7, -1.2], [1.5, 0.1]])
YS = np.array([0.8, -0.4, 1.1, 0.3])


def _fit_vkml(w0, lr):
    """One SGD step per data row; the gradient is taken inside the scan step, closing over the
    carry (the weights), the row and the learning rate."""
    def step(w, row):
        x, y = row
        g = vkml.grad(lambda d: (vkml.sum((w + d) * x) - y) ** 2)(np.zeros(2))
        return w - lr * g, vkml.sum(w * x)

    w, _ = vkml.scan(step, w0, (XS, YS))
    return vkml.sum((XS @ w - YS) ** 2)


def _fit_autograd(w0, lr):
    w = w0
    for x, y in zip(XS, YS):
        g = autograd.grad(lambda d: (anp.sum((w + d) * x) - y) ** 2)(np.zeros(2))
        w = w - lr * g
    return anp.sum((anp.dot(XS, w) - YS) ** 2)


def test_gradient_descent_inside_a_scan_step():
    w0, lr = np.array([0.2, -0.1]), 0.05
    np.testing.assert_allclose(float(_fit_vkml(w0, lr)), _fit_autograd(w0, lr), rtol=1e-12)
    g_w, g_lr = vkml.grad(_fit_vkml, argnums=(0, 1))(w0, lr)
    want_w, want_lr = autograd.grad(_fit_autograd, argnum=(0, 1))(w0, lr)
    np.testing.assert_allclose(g_w.numpy(), want_w, rtol=1e-9)
    np.testing.assert_allclose(float(g_lr), want_lr, rtol=1e-9)
    h = 1e-6
    fd = (float(_fit_vkml(w0, lr + h)) - float(_fit_vkml(w0, lr - h))) / (2 * h)
    np.testing.assert_allclose(float(g_lr), fd, rtol=1e-6)


TRAIN, VAL = (XS[:2], YS[:2]), (XS[2:], YS[2:])


def _inner_loss(lib, p, lam, data):
    x, y = data
    return lib.sum((x @ p - y) ** 2) + lam * lib.sum(p * p)


def _meta_vkml(theta, lam):
    """Two inner SGD steps on the training rows (their loss closes over the regularization
    ``lam``, a value of the outer gradient), then the validation loss of the adapted weights."""
    p = theta
    for _ in range(2):
        p = p - 0.1 * vkml.grad(lambda q: _inner_loss(vkml, q, lam, TRAIN))(p)
    return _inner_loss(vkml, p, 0.0, VAL)


def _meta_autograd(theta, lam):
    p = theta
    for _ in range(2):
        p = p - 0.1 * autograd.grad(lambda q: _inner_loss(anp, q, lam, TRAIN))(p)
    return _inner_loss(anp, p, 0.0, VAL)


def test_meta_learning_outer_gradient_through_inner_sgd_steps():
    theta, lam = np.array([0.3, -0.2]), 0.4
    g_lam, g_theta = vkml.grad(_meta_vkml, argnums=(1, 0))(theta, lam)
    want_theta, want_lam = autograd.grad(_meta_autograd, argnum=(0, 1))(theta, lam)
    np.testing.assert_allclose(g_theta.numpy(), want_theta, rtol=1e-9)
    np.testing.assert_allclose(float(g_lam), want_lam, rtol=1e-9)
    h = 1e-6
    fd = (float(_meta_vkml(theta, lam + h)) - float(_meta_vkml(theta, lam - h))) / (2 * h)
    np.testing.assert_allclose(float(g_lam), fd, rtol=1e-6)


def test_meta_gradient_batched_over_tasks():
    """vmap over tasks of the meta-gradient: the inner grad closes over a vmapped value."""
    thetas = np.array([[0.3, -0.2], [0.0, 0.5], [-0.4, 0.1]])
    got = vkml.vmap(lambda th: vkml.grad(_meta_vkml)(th, 0.4))(thetas).numpy()
    want = np.stack([autograd.grad(_meta_autograd)(th, 0.4) for th in thetas])
    np.testing.assert_allclose(got, want, rtol=1e-9)


# -- jit caches with closures ------------------------------------------------------------------------

def test_jitted_inner_function_closing_over_traced_values_is_traced_per_call():
    state = {}

    @vkml.jit
    def inner(y):
        return state["s"] * y ** 2

    def outer(x):
        state["s"] = x
        return inner(x) + inner(2.0 * x)          # 5 x^3

    g = vkml.grad(outer)
    assert float(g(1.0)) == pytest.approx(15.0)
    info = inner.cache_info()
    # two calls, each closing over the outer placeholder: traced each time, not kept as constants
    assert info["traces"] == 2 and info["keys"] == 0 and info["hits"] == 0
    assert float(g(2.0)) == pytest.approx(60.0)   # outer's program is cached; it holds both calls
    assert inner.cache_info()["traces"] == 2
    assert float(vkml.grad(lambda x: outer(x))(3.0)) == pytest.approx(135.0)
    assert inner.cache_info()["traces"] == 4
    # a closure over a concrete value is an ordinary, cached constant
    state["s"] = 3.0
    assert float(inner(2.0)) == pytest.approx(12.0)
    assert float(inner(2.0)) == pytest.approx(12.0)
    info = inner.cache_info()
    assert info["traces"] == 5 and info["keys"] == 1 and info["hits"] == 1


def test_jit_of_a_function_with_an_inner_closure_caches_its_program():
    f = vkml.jit(lambda x: vkml.grad(lambda y: x * vkml.sin(x * y))(0.5))
    for x in (0.3, 1.7, -0.8):
        want = autograd.grad(lambda y: x * anp.sin(x * y))(0.5)
        assert float(f(x)) == pytest.approx(want, rel=1e-12)
    assert f.cache_info()["traces"] == 1 and f.cache_info()["hits"] == 2


def test_ordinary_derivatives_are_still_cached():
    g = vkml.grad(lambda x: vkml.sin(x) * x)
    g(0.3)
    before = g.cache_info()
    assert float(g(0.9)) == pytest.approx(np.cos(0.9) * 0.9 + np.sin(0.9))
    after = g.cache_info()
    assert after["traces"] == before["traces"] == 1
    assert after["derived"] == before["derived"] and after["hits"] == before["hits"] + 1


def test_custom_rules_refuse_closures_over_traced_values():
    def outer(x):
        @vkml.custom_jvp
        def f(y):
            return x * y

        f.defjvp(lambda p, t: (x * p[0], x * t[0]))
        return f(2.0)

    with pytest.raises(TracingError, match="pass those values as arguments"):
        vkml.grad(outer)(1.0)


# -- what a closure may capture ----------------------------------------------------------------------

def test_closure_over_an_intermediate_value_and_over_an_argument_it_also_receives():
    # z = sin(x) is made by the outer trace; the inner grad closes over it
    g = vkml.grad(lambda x: (lambda z: vkml.grad(lambda y: z * y ** 2)(1.0))(vkml.sin(x)))(0.5)
    assert float(g) == pytest.approx(2 * np.cos(0.5), rel=1e-12)
    # x is both the inner argument and a captured value: d/dx [d/dy x y]_(y=x) = 1
    assert float(vkml.grad(lambda x: vkml.grad(lambda y: x * y)(x))(2.0)) == 1.0
    # the inner function returns the captured value itself
    assert float(vkml.grad(lambda x: vkml.sum(vkml.vmap(lambda y: x)(np.ones(3))))(2.0)) == 3.0


def test_backward_through_a_jitted_function_holding_an_inner_closure():
    x = vkml.tensor(np.array([0.4, 1.3]), requires_grad=True)
    f = vkml.jit(lambda x: vkml.sum(vkml.vmap(lambda xi: vkml.grad(lambda y: xi * vkml.sin(y))(xi))(x)))
    f(x).backward()
    # d/dx_i [x_i cos(x_i)] = cos(x_i) - x_i sin(x_i)
    want = autograd.grad(lambda x: anp.sum(x * anp.cos(x)))(np.array([0.4, 1.3]))
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12)


def test_closures_in_eager_mode(eager):
    _check(("grad", "vmap"), fd=False)
    _check(("scan", "jvp"), fd=False)


def test_a_per_sample_kernel_may_close_over_its_inputs_in_an_inner_grad():
    @vkml.kernel
    def slope(x, k: vkml.Param):
        # d/dy sin(k x y) at y = 1: the inner function reads the sample's x and the uniform k
        return {"y": vkml.grad(lambda y: vkml.sin(k * x * y))(1.0)}

    x, y = np.linspace(0.1, 0.9, 4), np.zeros(4)
    vkml.Graph().add(slope.bind(x=x, k=1.5, y=y), name="slope").build().launch()
    want = [autograd.grad(lambda t: anp.sin(1.5 * xi * t))(1.0) for xi in x]
    np.testing.assert_allclose(y, want, rtol=1e-12)


def test_a_value_kept_after_its_trace_finished_is_refused_when_captured():
    kept = []
    vkml.jit(lambda x: kept.append(x) or x * 2.0)(1.0)
    for use in (lambda: vkml.jit(lambda y: y + kept[0])(2.0),
                lambda: vkml.grad(lambda y: y * kept[0])(2.0),
                lambda: vkml.scan(lambda c, r: (c + kept[0], None), 0.0, np.ones(3))):
        with pytest.raises(TracingError, match="has finished"):
            use()
