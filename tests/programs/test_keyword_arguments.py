"""Keyword arguments through every function transformation, as JAX takes them: traced (never baked
into a program), not differentiated by grad and the Jacobians, mapped over axis 0 by vmap."""

from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml

X = np.array([0.1, -0.7, 1.3])


def f(x, scale=2.0):
    return vkml.sum(vkml.sin(x) * scale + x * x)


def g(x, scale=2.0):
    return vkml.sin(x) * scale + x * x


def f_ref(x, scale):
    return anp.sum(anp.sin(x) * scale + x * x)


def test_jit_traces_keyword_arguments_once_and_never_bakes_their_values():
    jf = vkml.jit(lambda x, scale=2.0: f(x, scale))
    first = jf(X, scale=np.float64(3.0))
    second = jf(X, scale=np.float64(-1.5))
    assert first.numpy() == pytest.approx(f_ref(X, 3.0), rel=1e-15)
    assert second.numpy() == pytest.approx(f_ref(X, -1.5), rel=1e-15)
    info = jf.cache_info()
    assert info["traces"] == 1 and info["hits"] == 1 and info["keys"] == 1
    assert len(jf.programs()) == 1
    # the same values passed positionally: another key (the names are part of a keyword key)
    assert jf(X, np.float64(3.0)).numpy() == first.numpy()
    assert jf.cache_info()["traces"] == 2


def test_grad_and_the_jacobians_take_keyword_arguments_undifferentiated():
    want = autograd.grad(f_ref)(X, 3.0)
    s = np.float64(3.0)
    np.testing.assert_allclose(vkml.grad(vkml.jit(f))(X, scale=s).numpy(), want, rtol=1e-14)
    np.testing.assert_allclose(vkml.value_and_grad(f)(X, scale=s)[1].numpy(), want, rtol=1e-14)
    jac = autograd.jacobian(lambda x: anp.sin(x) * 3.0 + x * x)(X)
    np.testing.assert_allclose(vkml.jacrev(g)(X, scale=s).numpy(), jac, rtol=1e-14)
    np.testing.assert_allclose(vkml.jacfwd(g)(X, scale=s).numpy(), jac, rtol=1e-14)
    hess = autograd.hessian(lambda x: f_ref(x, 3.0))(X)
    np.testing.assert_allclose(vkml.hessian(f)(X, scale=s).numpy(), hess, rtol=1e-13, atol=1e-15)
    with pytest.raises(vkml.ArgumentError, match="argnums 2 is out of range"):
        vkml.jacrev(g, argnums=2)(X, scale=s)


def test_checkpoint_takes_keyword_arguments_and_its_gradient_recomputes_with_them():
    remat = vkml.checkpoint(g)
    np.testing.assert_allclose(remat(X, scale=np.float64(3.0)).numpy(), np.sin(X) * 3.0 + X * X,
                               rtol=1e-15)
    got = vkml.grad(lambda x: vkml.sum(remat(x, scale=np.float64(3.0))))(X).numpy()
    np.testing.assert_allclose(got, autograd.grad(f_ref)(X, 3.0), rtol=1e-14)


def test_vmap_maps_keyword_arguments_over_their_first_axis():
    scales = np.array([1.0, 2.0, 3.0])
    want = np.sin(X) * scales + X * X
    np.testing.assert_allclose(vkml.vmap(g)(X, scale=scales).numpy(), want, rtol=1e-15)
    np.testing.assert_allclose(vkml.vmap(g, in_axes=(0,))(X, scale=scales).numpy(), want, rtol=1e-15)
    rows = np.stack([X, 2 * X])                     # in_axes for the positional argument only
    got = vkml.vmap(g, in_axes=1)(rows, scale=scales).numpy()
    np.testing.assert_allclose(got, (np.sin(rows) * scales + rows * rows).T, rtol=1e-15)
    with pytest.raises(vkml.ShapeError, match="mapped axes must all have one size"):
        vkml.vmap(g)(X, scale=np.ones(4))
