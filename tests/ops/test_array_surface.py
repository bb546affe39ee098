"""Tensors that behave like arrays, and the programs API JAX/autograd users expect.

NumPy's protocols (np.exp(t), np.sum(t), ...) run vkml's own ops; lists are arrays to
operations and pytrees to transformations; namedtuples, dataclasses and registered
classes are pytrees; grad passes keyword arguments; vmap takes pytrees of axes and
out_axes=None; Jacobians of pytrees with has_aux; custom_vjp's nondiff_argnums;
fori_loop, associative_scan; while_loop's bound; the new nn layers.  Derivatives are
checked against HIPS autograd and central finite differences, never against vkml.
"""

import collections
import dataclasses
import functools
import warnings

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
from oracle import central_diff


def arr(t):
    return np.asarray(t.numpy() if isinstance(t, vkml.Tensor) else t)


RNG = np.random.default_rng(13)
X = RNG.standard_normal((3, 4))


# -- NumPy's protocols --------------------------------------------------------------------------------

@pytest.mark.parametrize("ufunc", [np.exp, np.sin, np.cos, np.tanh, np.negative, np.square, np.abs])
def test_unary_ufuncs_dispatch_to_vkml_and_stay_lazy(ufunc):
    t = vkml.tensor(X, requires_grad=True)
    out = ufunc(t)
    assert isinstance(out, vkml.Tensor) and out.requires_grad
    np.testing.assert_allclose(out.numpy(), ufunc(X), rtol=1e-12)


@pytest.mark.parametrize("ufunc", [np.add, np.subtract, np.multiply, np.divide, np.maximum,
                                   np.minimum, np.power, np.less, np.equal])
def test_binary_ufuncs_with_arrays_on_either_side(ufunc):
    a = np.abs(X) + 0.5
    t = vkml.tensor(a)
    b = RNG.uniform(0.5, 2.0, a.shape)
    np.testing.assert_allclose(arr(ufunc(t, b)), ufunc(a, b), rtol=1e-12)
    np.testing.assert_allclose(arr(ufunc(b, t)), ufunc(b, a), rtol=1e-12)


def test_ndarray_operator_tensor_is_a_tensor():
    t = vkml.tensor(X)
    out = np.ones(4) * t
    assert isinstance(out, vkml.Tensor)
    np.testing.assert_allclose(out.numpy(), X)


@pytest.mark.parametrize("call, ref", [
    (lambda m, a: m.sum(a), lambda a: np.sum(a)),
    (lambda m, a: m.sum(a, axis=0), lambda a: np.sum(a, axis=0)),
    (lambda m, a: m.mean(a, axis=1, keepdims=True), lambda a: np.mean(a, axis=1, keepdims=True)),
    (lambda m, a: m.max(a, axis=0), lambda a: np.max(a, axis=0)),
    (lambda m, a: m.min(a), lambda a: np.min(a)),
    (lambda m, a: m.var(a, axis=0, ddof=1), lambda a: np.var(a, axis=0, ddof=1)),
    (lambda m, a: m.std(a), lambda a: np.std(a)),
    (lambda m, a: m.reshape(a, (4, 3)), lambda a: np.reshape(a, (4, 3))),
    (lambda m, a: m.transpose(a), lambda a: np.transpose(a)),
    (lambda m, a: m.concatenate([a, np.ones((1, 4))]), lambda a: np.concatenate([a, np.ones((1, 4))])),
    (lambda m, a: m.stack([a, a], axis=1), lambda a: np.stack([a, a], axis=1)),
    (lambda m, a: m.where(a > 0, a, 0.0), lambda a: np.where(a > 0, a, 0.0)),
    (lambda m, a: m.clip(a, -0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5)),
    (lambda m, a: m.expand_dims(a, 0), lambda a: np.expand_dims(a, 0)),
    (lambda m, a: m.argmax(a, axis=1), lambda a: np.argmax(a, axis=1)),
    (lambda m, a: m.take(a, [0, 2]), lambda a: np.take(a, [0, 2])),
    (lambda m, a: m.ravel(a), lambda a: np.ravel(a)),
    (lambda m, a: m.dot(a, a.T), lambda a: np.dot(a, a.T)),
    (lambda m, a: m.all(a > -1), lambda a: np.all(a > -1)),
    (lambda m, a: m.any(a > 1, axis=0), lambda a: np.any(a > 1, axis=0)),
    (lambda m, a: m.zeros_like(a), lambda a: np.zeros_like(a)),
    (lambda m, a: m.ones_like(a, dtype=np.int32), lambda a: np.ones_like(a, dtype=np.int32)),
])
def test_numpy_functions_dispatch_to_vkml(call, ref):
    out = call(np, vkml.tensor(X))
    assert isinstance(out, vkml.Tensor)
    np.testing.assert_allclose(out.numpy(), ref(X), rtol=1e-12)


def test_gradient_flows_through_numpy_calls():
    t = vkml.tensor(X, requires_grad=True)
    np.sum(np.sin(t) * np.mean(t, axis=0)).backward()
    grad = autograd.grad(lambda a: anp.sum(anp.sin(a) * anp.mean(a, axis=0)))(X)
    np.testing.assert_allclose(t.grad.numpy(), grad, rtol=1e-10)


def test_facts_about_values_run_numpy():
    t = vkml.tensor(X)
    close = np.allclose(t, X)
    assert isinstance(close, (bool, np.bool_)) and close
    assert not np.allclose(t, X + 1)
    assert np.array_equal(t, X)
    assert np.shape(t) == (3, 4) and np.ndim(t) == 2
    np.testing.assert_allclose(t, X)


@pytest.mark.parametrize("call", [lambda t: np.linalg.eig(t), lambda t: np.fft.fft2(t),
                                  lambda t: np.add.reduce(t), lambda t: np.exp(t, out=np.empty((3, 4)))])
def test_unsupported_numpy_calls_say_what_to_call_instead(call):
    with pytest.raises(vkml.ArgumentError, match=r"np\.|out="):
        call(vkml.tensor(X))


def test_unsupported_message_names_vkml_numpy_and_numpy_copy():
    with pytest.raises(vkml.VkmlError, match=r"np\.linalg\.eig is not supported.*vkml\.numpy\.linalg\.eig.*t\.numpy\(\)"):
        np.linalg.eig(vkml.tensor(X))


def test_vkml_numpy_namespace_is_looked_up_at_call_time(monkeypatch):
    """A function ``vkml.numpy`` provides is what np.<name> on a Tensor runs."""
    import sys
    import types
    fake = types.ModuleType("vkml.numpy")
    fake.cumsum = lambda a, axis=None: vkml.tensor([42.0])
    monkeypatch.setitem(sys.modules, "vkml.numpy", fake)
    assert np.cumsum(vkml.tensor(X)).numpy().tolist() == [42.0]


# -- var, std, mod ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1), -1])
@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_var_and_std_match_numpy(axis, ddof, keepdims):
    t = vkml.tensor(X)
    np.testing.assert_allclose(t.var(axis=axis, ddof=ddof, keepdims=keepdims).numpy(),
                               np.var(X, axis=axis, ddof=ddof, keepdims=keepdims), rtol=1e-12)
    np.testing.assert_allclose(t.std(axis=axis, ddof=ddof, keepdims=keepdims).numpy(),
                               np.std(X, axis=axis, ddof=ddof, keepdims=keepdims), rtol=1e-12)


def test_var_of_integers_is_float64_and_has_a_gradient():
    assert vkml.tensor(np.arange(6)).var().dtype == np.float64
    np.testing.assert_allclose(vkml.tensor(np.arange(6)).var().item(), np.var(np.arange(6)))
    t = vkml.tensor(X, requires_grad=True)
    t.std(axis=0, ddof=1).sum().backward()
    want = autograd.grad(lambda a: anp.sum(anp.std(a, axis=0, ddof=1)))(X)
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-10)


def test_var_refuses_a_non_number_ddof():
    with pytest.raises(vkml.ArgumentError, match="var: ddof"):
        vkml.tensor(X).var(ddof="1")


@pytest.mark.parametrize("a, b", [(np.array([-7.5, 7.5, -0.25, 3.0]), 2.0),
                                  (np.array([5.0, -5.0, 5.5]), np.array([-3.0, 3.0, -2.0])),
                                  (np.array([-7, 7, -8, 9]), 3)])
def test_mod_matches_numpy_both_ways(a, b):
    np.testing.assert_allclose((vkml.tensor(a) % b).numpy(), np.mod(a, b))
    np.testing.assert_allclose(arr(b % vkml.tensor(np.abs(a) + 1)), np.mod(b, np.abs(a) + 1))
    np.testing.assert_allclose(np.mod(vkml.tensor(a), b).numpy(), np.mod(a, b))


def test_mod_gradient_is_one_in_x():
    t = vkml.tensor(np.array([0.3, 2.7, -1.2]), requires_grad=True)
    (t % 1.0).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), np.ones(3))


# -- lists -------------------------------------------------------------------------------------------------

def test_operations_read_lists_as_arrays():
    x = vkml.tensor([1.0, 2.0, 3.0])
    np.testing.assert_allclose(vkml.add([1, 2, 3], x).numpy(), [2, 4, 6])
    np.testing.assert_allclose((x * [2.0, 0.0, 1.0]).numpy(), [2, 0, 3])
    assert vkml.sum([1, 2, 3]).item() == 6
    np.testing.assert_allclose(vkml.tensor([[1, 2], [3, 4]]).numpy(), [[1, 2], [3, 4]])


def test_transformations_read_lists_as_pytrees():
    """As in JAX: a list argument of jit/grad is a container of leaves, not one array."""
    seen = []

    def f(xs):
        seen.append(type(xs))
        return xs[0] * xs[1]

    assert vkml.jit(f)([3.0, 2.0]).item() == 6.0
    assert seen == [list]
    g = vkml.grad(f)([3.0, 2.0])
    assert isinstance(g, list) and [x.item() for x in g] == [2.0, 3.0]
    np.testing.assert_allclose(vkml.jit(lambda a: a * 2)(np.array([1.0, 2.0])).numpy(), [2, 4])


# -- pytrees -------------------------------------------------------------------------------------------------

Params = collections.namedtuple("Params", "w b")


@dataclasses.dataclass
class Layer:
    w: object
    b: object
    name: str = dataclasses.field(default="layer", metadata={"static": True})


class Pair:
    def __init__(self, first, second):
        self.first, self.second = first, second


vkml.pytree.register(Pair, lambda p: ((p.first, p.second), None), lambda aux, ch: Pair(*ch))


def _loss_ag(w, b, x):
    return anp.sum(anp.tanh(anp.dot(x, w) + b) ** 2)


@pytest.mark.parametrize("wrap", [lambda w, b: Params(w, b), lambda w, b: Layer(w, b),
                                  lambda w, b: Pair(w, b)], ids=["namedtuple", "dataclass", "registered"])
def test_registered_pytrees_flatten_trace_and_differentiate(wrap):
    w, b, x = RNG.standard_normal((4, 2)), RNG.standard_normal(2), RNG.standard_normal((5, 4))
    params = wrap(w, b)
    parts = (lambda p: (p.first, p.second)) if isinstance(params, Pair) else (lambda p: (p.w, p.b))

    def loss(p, x):
        pw, pb = parts(p)
        return vkml.sum(vkml.tanh(x @ pw + pb) ** 2)

    g = vkml.grad(loss)(params, x)
    assert type(g) is type(params)
    gw, gb = parts(g)
    np.testing.assert_allclose(gw.numpy(), autograd.grad(_loss_ag, 0)(w, b, x), rtol=1e-10)
    np.testing.assert_allclose(gb.numpy(), autograd.grad(_loss_ag, 1)(w, b, x), rtol=1e-10)
    leaves, tree = vkml.pytree.flatten(params)
    assert len(leaves) == 2
    assert type(vkml.pytree.unflatten(tree, leaves)) is type(params)


def test_dataclass_static_field_is_part_of_the_key():
    f = vkml.jit(lambda layer: layer.w * 2)
    f(Layer(np.ones(2), np.ones(2), "a"))
    f(Layer(np.ones(2), np.ones(2), "a"))
    f(Layer(np.ones(2), np.ones(2), "b"))
    assert f.cache_info()["traces"] == 2


def test_register_refuses_bad_arguments():
    with pytest.raises(vkml.ArgumentError, match="pytree.register"):
        vkml.pytree.register("Pair", lambda p: p, lambda a, c: c)
    with pytest.raises(vkml.ArgumentError, match="pytree.register"):
        vkml.pytree.register(Pair, None, None)


# -- grad with keyword arguments ---------------------------------------------------------------------------

def test_grad_passes_keyword_arguments_without_differentiating_them():
    x = RNG.standard_normal(3)

    def f(a, scale=1.0, shift=None):
        return vkml.sum(scale * a * a) + (0.0 if shift is None else vkml.sum(shift * a))

    np.testing.assert_allclose(vkml.grad(f)(x, scale=3.0).numpy(), 6 * x)
    shift = RNG.standard_normal(3)
    np.testing.assert_allclose(vkml.grad(f)(x, scale=2.0, shift=shift).numpy(), 4 * x + shift)
    v, g = vkml.value_and_grad(f)(x, scale=2.0)
    np.testing.assert_allclose(v.item(), 2 * np.sum(x * x))
    np.testing.assert_allclose(g.numpy(), 4 * x)


def test_grad_keyword_values_do_not_retrace():
    calls = []

    def f(a, scale):
        calls.append(1)
        return vkml.sum(scale * a)

    g = vkml.grad(f)
    for s in (1.0, 2.0, 3.0):
        np.testing.assert_allclose(g(np.ones(2), scale=s).numpy(), [s, s])
    assert len(calls) == 1


# -- vmap: pytrees of axes, out_axes=None --------------------------------------------------------------------

def test_vmap_in_axes_pytree_maps_some_leaves_and_broadcasts_others():
    w, xs = RNG.standard_normal((4, 3)), RNG.standard_normal((5, 4))
    params = {"w": w, "b": np.arange(3.0)}
    f = vkml.vmap(lambda p, x: x @ p["w"] + p["b"], in_axes=({"w": None, "b": None}, 0))
    np.testing.assert_allclose(f(params, xs).numpy(), xs @ w + np.arange(3.0), rtol=1e-12)
    g = vkml.vmap(lambda p: p["w"] * p["b"], in_axes={"w": 1, "b": None})
    np.testing.assert_allclose(g({"w": w.T, "b": 2.0}).numpy(), 2 * w, rtol=1e-12)


def test_vmap_in_axes_list_and_none():
    a, b = RNG.standard_normal((3, 2)), RNG.standard_normal(2)
    out = vkml.vmap(lambda x, y: x * y, in_axes=[1, None])(a.T, b)
    np.testing.assert_allclose(out.numpy(), a * b)


def test_vmap_out_axes_none_returns_an_unbatched_result_once():
    a, b = RNG.standard_normal((4, 3)), RNG.standard_normal(3)
    ys, z = vkml.vmap(lambda x, y: (x * y, vkml.sum(y)), in_axes=(0, None), out_axes=(0, None))(a, b)
    np.testing.assert_allclose(ys.numpy(), a * b)
    assert z.shape == () and np.isclose(z.item(), b.sum())


def test_vmap_out_axes_none_refuses_a_batched_result():
    with pytest.raises(vkml.ArgumentError, match="out_axes None.*depends on a mapped argument"):
        vkml.vmap(lambda x: x * 2, out_axes=None)(np.ones((4, 3)))


def test_vmap_in_axes_structure_mismatch_is_refused():
    with pytest.raises(vkml.ArgumentError, match="vmap in_axes"):
        vkml.vmap(lambda p: p["w"], in_axes=({"v": 0},))({"w": np.ones((2, 2))})


# -- Jacobians of pytrees, has_aux ----------------------------------------------------------------------------

def _f_tree(d):
    return {"y": d["a"] * vkml.sum(d["b"] ** 2), "z": vkml.sum(vkml.sin(d["a"]))}


def _f_tree_ag(a, b):
    return anp.concatenate([a * anp.sum(b ** 2), anp.reshape(anp.sum(anp.sin(a)), (1,))])


@pytest.mark.parametrize("jac", [vkml.jacfwd, vkml.jacrev])
def test_jacobian_of_a_pytree_function_matches_autograd(jac):
    a, b = RNG.standard_normal(3), RNG.standard_normal(2)
    j = jac(_f_tree)({"a": a, "b": b})
    ja = autograd.jacobian(_f_tree_ag, 0)(a, b)
    jb = autograd.jacobian(_f_tree_ag, 1)(a, b)
    np.testing.assert_allclose(j["y"]["a"].numpy(), ja[:3], rtol=1e-10)
    np.testing.assert_allclose(j["y"]["b"].numpy(), jb[:3], rtol=1e-10)
    np.testing.assert_allclose(j["z"]["a"].numpy(), ja[3], rtol=1e-10)
    np.testing.assert_allclose(j["z"]["b"].numpy(), jb[3], rtol=1e-10)


@pytest.mark.parametrize("jac", [vkml.jacfwd, vkml.jacrev])
def test_jacobian_with_tuple_argnums_and_has_aux(jac):
    a, b = RNG.standard_normal(3), RNG.standard_normal(3)
    (ja, jb), aux = jac(lambda x, y: (x * y, {"n": vkml.sum(x)}), argnums=(0, 1), has_aux=True)(a, b)
    np.testing.assert_allclose(ja.numpy(), np.diag(b))
    np.testing.assert_allclose(jb.numpy(), np.diag(a))
    assert np.isclose(aux["n"].item(), a.sum())


def test_hessian_of_pytree_input_matches_finite_differences_of_autograd_gradient():
    a, b = RNG.standard_normal(3), RNG.standard_normal(2)

    def f(d):
        return vkml.sum(d["a"] ** 3) * vkml.sum(vkml.exp(d["b"]))

    h = vkml.hessian(f)({"a": a, "b": b})
    ag = lambda a, b: anp.sum(a ** 3) * anp.sum(anp.exp(b))  # noqa: E731
    np.testing.assert_allclose(h["a"]["a"].numpy(), autograd.hessian(ag, 0)(a, b), rtol=1e-9)
    np.testing.assert_allclose(h["b"]["b"].numpy(), autograd.hessian(ag, 1)(a, b), rtol=1e-9)
    cross = autograd.jacobian(autograd.grad(ag, 0), 1)(a, b)
    np.testing.assert_allclose(h["a"]["b"].numpy(), cross, rtol=1e-9)
    fd = np.stack([central_diff(lambda bb: autograd.grad(ag, 0)(a, bb)[i], b) for i in range(3)])
    np.testing.assert_allclose(h["a"]["b"].numpy(), fd, rtol=1e-5)


def test_hessian_has_aux():
    x = RNG.standard_normal(3)
    h, aux = vkml.hessian(lambda a: (vkml.sum(a ** 3), a * 2), has_aux=True)(x)
    np.testing.assert_allclose(h.numpy(), np.diag(6 * x), rtol=1e-10)
    np.testing.assert_allclose(aux.numpy(), 2 * x)


def test_jacobian_has_aux_needs_a_pair():
    with pytest.raises(vkml.ArgumentError, match=r"has_aux=True.*pair"):
        vkml.jacfwd(lambda a: a * 2, has_aux=True)(np.ones(2))


# -- custom_vjp nondiff_argnums ------------------------------------------------------------------------------

def test_custom_vjp_nondiff_argnums_passes_them_to_bwd_first():
    @functools.partial(vkml.custom_vjp, nondiff_argnums=(0,))
    def clip_gradient(limit, x):
        return x * 1.0

    def fwd(limit, x):
        return x * 1.0, None

    def bwd(limit, res, g):
        return (vkml.clip(g, -limit, limit),)

    clip_gradient.defvjp(fwd, bwd)
    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(clip_gradient(0.5, x).numpy(), x)
    g = vkml.grad(lambda a: vkml.sum(clip_gradient(0.5, a) * np.array([0.1, 3.0, -4.0])))(x)
    np.testing.assert_allclose(g.numpy(), [0.1, 0.5, -0.5])
    g2 = vkml.grad(lambda a: vkml.sum(clip_gradient(10.0, a) * np.array([0.1, 3.0, -4.0])))(x)
    np.testing.assert_allclose(g2.numpy(), [0.1, 3.0, -4.0])


def test_custom_vjp_nondiff_argnums_refuses_unhashable_values():
    f = vkml.custom_vjp(lambda k, x: x * 2, nondiff_argnums=(0,))
    f.defvjp(lambda k, x: (x * 2, None), lambda k, r, g: (g * 2,))
    with pytest.raises(vkml.ArgumentError, match="nondiff_argnums.*hashable"):
        f(np.ones(2), np.ones(2))


def test_custom_vjp_none_cotangent_is_zero():
    f = vkml.custom_vjp(lambda x, y: x * y)
    f.defvjp(lambda x, y: (x * y, (x, y)), lambda r, g: (g * r[1], None))
    gx, gy = vkml.grad(lambda x, y: vkml.sum(f(x, y)), argnums=(0, 1))(np.ones(2), np.full(2, 3.0))
    np.testing.assert_allclose(gx.numpy(), [3.0, 3.0])
    np.testing.assert_allclose(gy.numpy(), [0.0, 0.0])


# -- fori_loop, associative_scan --------------------------------------------------------------------------

def test_fori_loop_matches_a_python_loop_and_differentiates_in_reverse():
    def f(a):
        return vkml.fori_loop(1, 5, lambda i, c: c * a + i, 0.5)

    def f_np(a):
        c = 0.5
        for i in range(1, 5):
            c = c * a + i
        return c

    a = 1.3
    assert np.isclose(f(np.float64(a)).item(), f_np(a))
    assert np.isclose(vkml.grad(f)(np.float64(a)).item(), central_diff(f_np, a), rtol=1e-6)
    assert np.isclose(vkml.grad(f)(np.float64(a)).item(), autograd.grad(f_np)(a), rtol=1e-12)


def test_fori_loop_empty_range_and_traced_bounds():
    assert vkml.fori_loop(3, 3, lambda i, c: c + 1.0, 2.0) == 2.0
    f = vkml.jit(lambda n: vkml.fori_loop(0, n, lambda i, c: c + i, 0))
    assert f(np.int32(5)).item() == 10
    assert f(np.int32(7)).item() == 21


def test_a_long_fori_loop_is_compiled_on_the_cpu_tier_and_differentiates(on_cpu):
    """Past 65,536 iterations the loop stays in C (its indices were a constant as long as the
    loop, which a compiled program does not hold: the whole loop fell back to NumPy, 250 times
    slower); the index counts right at the int32 edge."""
    n = 70_000

    def f_np(a):
        c = 0.25
        for _ in range(n):
            c = c * a + 1e-5
        return c

    f = vkml.jit(lambda a: vkml.fori_loop(0, n, lambda i, c: c * a + 1e-5, 0.25))
    g = vkml.jit(vkml.grad(lambda a: vkml.fori_loop(0, n, lambda i, c: c * a + 1e-5, 0.25)))
    before = vkml.backend_info()["numpy fallbacks"]
    a = 0.99999
    assert np.isclose(f(np.float64(a)).item(), f_np(a), rtol=1e-10)
    assert np.isclose(g(np.float64(a)).item(), central_diff(f_np, a, 1e-7), rtol=1e-5)
    assert vkml.backend_info()["numpy fallbacks"] == before
    last = 2**31 - 1                  # the final index is int32's largest: no overflow on the way
    top = vkml.fori_loop(last - 3, last + 1, lambda i, c: vkml.maximum(c, i), np.int64(0))
    assert top.item() == last
    low = vkml.fori_loop(-2**31, -2**31 + 2, lambda i, c: c + i, np.int64(0))
    assert low.item() == -2**32 + 1


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reverse", [False, True])
def test_associative_scan_matches_cumsum_and_cumprod(axis, reverse):
    e = RNG.uniform(0.5, 1.5, (5, 7))
    flip = (lambda a: np.flip(a, axis)) if reverse else (lambda a: a)
    got_sum = vkml.associative_scan(lambda a, b: a + b, e, reverse=reverse, axis=axis)
    got_prod = vkml.associative_scan(lambda a, b: a * b, e, reverse=reverse, axis=axis)
    np.testing.assert_allclose(got_sum.numpy(), flip(np.cumsum(flip(e), axis)), rtol=1e-12)
    np.testing.assert_allclose(got_prod.numpy(), flip(np.cumprod(flip(e), axis)), rtol=1e-12)


def test_associative_scan_keeps_the_order_of_a_non_commutative_operator():
    """Composition of affine maps x -> a x + b is associative but not commutative."""
    a, b = RNG.uniform(0.5, 1.5, 6), RNG.standard_normal(6)

    def compose(first, second):  # apply first, then second
        return (first[0] * second[0], first[1] * second[0] + second[1])

    for reverse in (False, True):
        got_a, got_b = vkml.associative_scan(compose, (a, b), reverse=reverse)
        idx = range(6)
        for i in idx:
            chain = list(range(i, 6)) if reverse else list(range(0, i + 1))
            ca, cb = a[chain[0]], b[chain[0]]
            for j in chain[1:]:
                ca, cb = ca * a[j], cb * a[j] + b[j]
            assert np.isclose(got_a.numpy()[i], ca) and np.isclose(got_b.numpy()[i], cb)


def test_associative_scan_gradient_matches_autograd():
    e = RNG.standard_normal(6)
    w = RNG.standard_normal(6)
    g = vkml.grad(lambda x: vkml.sum(vkml.associative_scan(lambda a, b: a + b, x) * w))(e)
    np.testing.assert_allclose(g.numpy(), autograd.grad(lambda x: anp.sum(anp.cumsum(x) * w))(e))


# -- while_loop: reverse mode and its bound ------------------------------------------------------------------

def test_while_loop_reverse_refusal_names_max_iters():
    with pytest.raises(vkml.GradError, match="max_iters="):
        vkml.grad(lambda a: vkml.while_loop(lambda c: c < 10.0, lambda c: c * a, a))(np.float64(2.0))


def test_while_loop_bounded_gradient_matches_finite_differences():
    def f_np(a):
        c = a
        for _ in range(10):
            if not c < 10.0:
                break
            c = c * a
        return c

    f = lambda a: vkml.while_loop(lambda c: c < 10.0, lambda c: c * a, a, max_iters=10)  # noqa: E731
    assert np.isclose(vkml.grad(f)(np.float64(1.7)).item(), central_diff(f_np, 1.7), rtol=1e-6)


def test_while_loop_cut_at_max_iters_warns():
    with pytest.warns(vkml.VkmlWarning, match="max_iters=3"):
        out = vkml.while_loop(lambda c: c < 100.0, lambda c: c * 2.0, np.float64(1.0), max_iters=3)
    assert out.item() == 8.0


def test_while_loop_cut_at_max_iters_raises_or_is_ignored_by_flag():
    loop = functools.partial(vkml.while_loop, lambda c: c < 100.0, lambda c: c * 2.0, np.float64(1.0),
                             max_iters=3)
    with pytest.raises(vkml.ExecutionError, match="max_iters=3"):
        loop(on_max_iters="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loop(on_max_iters="ignore").item() == 8.0


def test_while_loop_that_ends_in_time_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = vkml.while_loop(lambda c: c < 100.0, lambda c: c * 2.0, np.float64(1.0), max_iters=7)
    assert out.item() == 128.0


# -- nn layers ---------------------------------------------------------------------------------------------

def _fd_check_module_input_grad(module, x, ref):
    """The module's input gradient of sum(out * w) against central differences of the NumPy ref."""
    w = RNG.standard_normal(np.shape(ref(x)))
    t = vkml.tensor(x, requires_grad=True)
    vkml.sum(module(t) * w).backward()
    fd = central_diff(lambda a: float(np.sum(ref(a) * w)), x)
    np.testing.assert_allclose(t.grad.numpy(), fd, rtol=1e-5, atol=1e-7)


def _gelu_ref(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _gelu_exact_ref(x):
    import scipy.special
    return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


def _softmax_ref(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("module, ref", [
    (vkml.nn.Tanh(), np.tanh),
    (vkml.nn.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
    (vkml.nn.GELU(approximate="tanh"), _gelu_ref),
    (vkml.nn.GELU(), _gelu_exact_ref),
    (vkml.nn.Softmax(), _softmax_ref),
    (vkml.nn.Softmax(dim=0), lambda x: _softmax_ref(x, 0)),
], ids=["tanh", "sigmoid", "gelu-tanh", "gelu", "softmax", "softmax0"])
def test_activation_modules_match_numpy_and_finite_differences(module, ref):
    np.testing.assert_allclose(module(vkml.tensor(X)).numpy(), ref(X), rtol=1e-12)
    _fd_check_module_input_grad(module, X, ref)


def test_gelu_tanh_form_is_close_to_the_exact_form():
    assert np.max(np.abs(vkml.nn.GELU(approximate="tanh")(X).numpy() - _gelu_exact_ref(X))) < 1e-3


def _layer_norm_ref(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = x.var(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def test_layer_norm_matches_numpy_and_its_gradients_match_finite_differences():
    ln = vkml.nn.LayerNorm(4, dtype=np.float64)
    w, b = RNG.standard_normal(4), RNG.standard_normal(4)
    ln.weight.assign_(w)
    ln.bias.assign_(b)
    np.testing.assert_allclose(ln(X).numpy(), _layer_norm_ref(X, w, b, 1e-5), rtol=1e-10)
    _fd_check_module_input_grad(ln, X, lambda x: _layer_norm_ref(x, w, b, 1e-5))
    seed = RNG.standard_normal(X.shape)
    ln.zero_grad()
    vkml.sum(ln(X) * seed).backward()
    fd_w = central_diff(lambda ww: float(np.sum(_layer_norm_ref(X, ww, b, 1e-5) * seed)), w)
    np.testing.assert_allclose(ln.weight.grad.numpy(), fd_w, rtol=1e-6)
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]


def test_layer_norm_over_two_dimensions_and_shape_check():
    x = RNG.standard_normal((2, 3, 4))
    y = vkml.nn.LayerNorm((3, 4), elementwise_affine=False)(x).numpy()
    flat = x.reshape(2, -1)
    want = ((flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(y, want, rtol=1e-10)
    with pytest.raises(vkml.ShapeError, match="LayerNorm"):
        vkml.nn.LayerNorm(5)(x)


def test_embedding_looks_up_rows_and_accumulates_gradients_per_row():
    emb = vkml.nn.Embedding(5, 3, rng=0, dtype=np.float64)
    ids = np.array([[0, 2], [2, 4]])
    table = emb.weight.numpy().copy()
    np.testing.assert_allclose(emb(ids).numpy(), table[ids])
    vkml.sum(emb(ids)).backward()
    counts = np.bincount(ids.ravel(), minlength=5)[:, None] * np.ones(3)
    np.testing.assert_allclose(emb.weight.grad.numpy(), counts)
    with pytest.raises(vkml.ArgumentError, match="Embedding: ids must be integers"):
        emb(np.array([0.5]))


def test_dropout_is_deterministic_by_seed_and_key_and_identity_in_eval():
    x = np.ones((50, 40))
    a, b = vkml.nn.Dropout(0.3, seed=7), vkml.nn.Dropout(0.3, seed=7)
    ya, yb = a(x).numpy(), b(x).numpy()
    np.testing.assert_array_equal(ya, yb)
    assert set(np.unique(ya)) <= {0.0, 1 / 0.7}
    assert 0.2 < np.mean(ya == 0) < 0.4
    np.testing.assert_array_equal(a(x, key=3).numpy(), b(x, key=3).numpy())
    assert not np.array_equal(a(x, key=3).numpy(), a(x, key=4).numpy())
    a.eval()
    np.testing.assert_array_equal(a(x).numpy(), x)
    with pytest.raises(vkml.ArgumentError, match="Dropout: p"):
        vkml.nn.Dropout(1.0)


def test_dropout_gradient_is_the_mask():
    d = vkml.nn.Dropout(0.5, seed=1)
    t = vkml.tensor(np.ones((4, 5)), requires_grad=True)
    y = d(t, key=11)
    vkml.sum(y).backward()
    np.testing.assert_allclose(t.grad.numpy(), y.numpy())


def test_conv2d_module_exists_and_dir_shows_only_public_names():
    assert issubclass(vkml.nn.Conv2d, vkml.nn.Module)
    names = dir(vkml.nn)
    for public in ("Tanh", "Sigmoid", "GELU", "Softmax", "Dropout", "LayerNorm", "Embedding", "Conv2d",
                   "Linear"):
        assert public in names
    assert "np" not in names and "math" not in names and "numbers" not in names
    assert set(names) == set(vkml.nn.__all__)
    assert all(hasattr(vkml.nn, n) for n in vkml.nn.__all__)


@pytest.mark.parametrize("jac", [vkml.jacfwd, vkml.jacrev])
def test_pytree_jacobian_second_call_traces_and_derives_nothing(jac):
    j = jac(_f_tree)
    j({"a": np.ones(3), "b": np.ones(2)})
    before = vkml.stats()
    out = j({"a": np.full(3, 2.0), "b": np.ones(2)})
    spent = vkml.stats() - before
    assert spent.traces == 0 and spent.derivations == 0 and spent.compiles == 0
    np.testing.assert_allclose(out["y"]["a"].numpy(), 2.0 * np.eye(3))
