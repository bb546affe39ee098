"""Every derivative, against HIPS autograd and central finite differences (eager mode).

Each test writes one function twice -- with vkml and with ``autograd.numpy``
(or a direct loop for conv2d and pooling) -- and ``oracle.check_grad``
compares vkml's ``backward`` gradient of ``sum(f(x) * w)`` (``w`` a fixed
random weight, so every output element matters) with autograd's to ~1e-10
and with central differences of vkml's forward to ~1e-5, in float64.
Inputs stay clear of kinks (abs, relu at 0) and ties (max/min), where a
derivative is a convention rather than a fact.
"""

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vkml
from vkml.ops import api

import oracle as O
from oracle import check_grad

pytestmark = pytest.mark.usefixtures("eager")

few = settings(max_examples=10)
fewer = settings(max_examples=5)


def f64(shape=None, lo=-3.0, hi=3.0):
    return O.arrays("float64", shape, lo=lo, hi=hi)


def unique_pool(data, *shapes, spacing=0.1):
    """Arrays of the given shapes whose values are all distinct (no ties anywhere)."""
    sizes = [int(np.prod(s)) for s in shapes]
    flat = data.draw(O.distinct((sum(sizes),), spacing=spacing))
    out, at = [], 0
    for s, n in zip(shapes, sizes):
        out.append(flat[at:at + n].reshape(s))
        at += n
    return out


# -- elementwise, unary ---------------------------------------------------------------------------

def _sigmoid(x):
    return 1.0 / (1.0 + anp.exp(-x))


UNARY = {
    # name: (vkml op, autograd op, values strategy for a shape)
    "neg": (vkml.neg, anp.negative, lambda s: f64(s)),
    "exp": (vkml.exp, anp.exp, lambda s: f64(s)),
    "log": (vkml.log, anp.log, lambda s: f64(s, 0.2, 5.0)),
    "sin": (vkml.sin, anp.sin, lambda s: f64(s, -5, 5)),
    "cos": (vkml.cos, anp.cos, lambda s: f64(s, -5, 5)),
    "tanh": (vkml.tanh, anp.tanh, lambda s: f64(s)),
    "sqrt": (vkml.sqrt, anp.sqrt, lambda s: f64(s, 0.2, 5.0)),
    "abs": (vkml.abs, anp.abs, lambda s: O.away_from(s, 0.1, 3.0)),
    "relu": (vkml.relu, lambda x: anp.where(x > 0, x, 0.0), lambda s: O.away_from(s, 0.1, 3.0)),
    "sigmoid": (vkml.sigmoid, _sigmoid, lambda s: f64(s, -6, 6)),
    "square": (vkml.square, anp.square, lambda s: f64(s)),
    "sign": (lambda x: vkml.sign(x) * x, lambda x: anp.sign(x) * x,
             lambda s: O.away_from(s, 0.1, 3.0)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@few
@given(data=st.data())
def test_unary(name, data):
    fn, ref, values = UNARY[name]
    x = data.draw(values(data.draw(O.shapes())))
    check_grad(fn, ref, x, key=name)


@few
@given(x=f64())
def test_stop_gradient_blocks_exactly_its_operand(x):
    # d/dx [stop(x) * x + x] = stop(x) + 1 = x + 1
    got, = O.vkml_grads(lambda t: vkml.stop_gradient(t) * t + t, [x], [0], np.ones(x.shape))
    np.testing.assert_allclose(got, x + 1, rtol=1e-12)
    ag = autograd.grad(lambda t: anp.sum(x * t + t))(x)
    np.testing.assert_allclose(got, ag, rtol=1e-12)


# -- elementwise, binary (with broadcasting) -------------------------------------------------------

BINARY = {
    "add": (vkml.add, anp.add, (-3, 3), (-3, 3)),
    "sub": (vkml.sub, anp.subtract, (-3, 3), (-3, 3)),
    "mul": (vkml.mul, anp.multiply, (-3, 3), (-3, 3)),
    "div": (vkml.div, anp.true_divide, (-3, 3), "away"),
    "pow": (vkml.pow, anp.power, (0.3, 3), (-2, 2)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@few
@given(data=st.data())
def test_binary_broadcasting(name, data):
    fn, ref, xr, yr = BINARY[name]
    sx, sy = data.draw(O.broadcastable_pair())
    x = data.draw(f64(sx, *xr))
    y = data.draw(O.away_from(sy, 0.3, 3.0) if yr == "away" else f64(sy, *yr))
    check_grad(fn, ref, x, y, key=name)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
@few
@given(data=st.data())
def test_maximum_minimum_without_ties(name, data):
    sx, sy = data.draw(O.broadcastable_pair())
    x, y = unique_pool(data, sx, sy)
    check_grad(getattr(vkml, name), getattr(anp, name), x, y, key=name)


def test_maximum_minimum_split_a_tie_evenly_like_autograd():
    x = np.array([[1.0, 2.0, -3.0], [0.5, 0.5, 4.0]])
    y = np.array([1.0, 0.0, -3.0])
    w = O.weights_like((2, 3), "ties")
    for name in ("maximum", "minimum"):
        got = O.vkml_grads(getattr(vkml, name), [x, y], [0, 1], w)
        want = O.autograd_grads(getattr(anp, name), [x, y], [0, 1], w)
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-12)


@few
@given(x=f64(lo=0.3, hi=3.0))
def test_python_scalar_operands(x):
    check_grad(lambda t: t * 2.5 - 1.0, lambda t: t * 2.5 - 1.0, x)
    check_grad(lambda t: 2.0 - t / 3.0, lambda t: 2.0 - t / 3.0, x)
    check_grad(lambda t: 1.5 / t, lambda t: 1.5 / t, x)
    check_grad(lambda t: t ** 3, lambda t: t ** 3, x)
    check_grad(lambda t: t ** 0.5, lambda t: t ** 0.5, x)
    check_grad(lambda t: 2.0 ** t, lambda t: 2.0 ** t, x)


def test_maximum_and_clip_against_python_scalars():
    x = np.array([0.2, 0.7, 1.3, 2.6])
    check_grad(lambda t: vkml.maximum(t, 1.0) + vkml.clip(t, 0.5, 2.0) + vkml.minimum(0.9, t),
               lambda t: anp.maximum(t, 1.0) + anp.clip(t, 0.5, 2.0) + anp.minimum(0.9, t), x)


@few
@given(data=st.data())
def test_where(data):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4))
    sc, sx, sy = shapes.input_shapes
    c = data.draw(hnp.arrays(bool, sc))
    x, y = data.draw(f64(sx)), data.draw(f64(sy))
    ones = np.ones(shapes.result_shape)   # autograd's where does not un-broadcast by itself
    check_grad(lambda c, x, y: vkml.where(c, x, y),
               lambda c, x, y: anp.where(c, x * ones, y * ones), c, x, y)
    ones = np.ones(np.broadcast_shapes(sc, sx))
    check_grad(lambda c, x: vkml.where(c, x, 0.0), lambda c, x: anp.where(c, x * ones, 0.0), c, x)


def test_cast_float32_float64_roundtrip_passes_gradients_through():
    x = np.array([[0.1, -1.7, 3.3], [2.0, 0.25, -0.5]])
    w = O.weights_like(x.shape, "cast")
    # float64 leaf -> float32 -> float64: the derivative of a rounding is 1
    t = vkml.tensor(x, requires_grad=True)
    y = vkml.cast(vkml.cast(t, "float32") * 3.0, "float64")
    assert y.dtype == np.float64
    vkml.sum(y * w).backward()
    assert t.grad.dtype == np.float64
    ag = autograd.grad(lambda v: anp.sum(v.astype(np.float32).astype(np.float64) * 3.0 * w))(x)
    np.testing.assert_allclose(t.grad.numpy(), ag, rtol=1e-6)
    np.testing.assert_allclose(t.grad.numpy(), 3.0 * w.astype(np.float32), rtol=1e-6)
    # float32 leaf computed in float64: the gradient comes back as float32
    t32 = vkml.tensor(x.astype(np.float32), requires_grad=True)
    z = vkml.sin(vkml.cast(t32, "float64"))
    vkml.sum(z * w).backward()
    assert t32.grad.dtype == np.float32
    np.testing.assert_allclose(t32.grad.numpy(), np.cos(x.astype(np.float32)) * w, rtol=1e-6)


# -- reductions -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sum", "mean"])
@few
@given(data=st.data(), keepdims=st.booleans())
def test_sum_mean(name, data, keepdims):
    x = data.draw(f64())
    axis = data.draw(O.axes_for(x.ndim))
    if name == "mean" and axis == ():
        axis = None
    check_grad(lambda t: getattr(vkml, name)(t, axis, keepdims),
               lambda t: getattr(anp, name)(t, axis=axis, keepdims=keepdims), x, key=name)


@pytest.mark.parametrize("name", ["max", "min"])
@few
@given(data=st.data(), keepdims=st.booleans())
def test_max_min_without_ties(name, data, keepdims):
    x, = unique_pool(data, data.draw(O.shapes()))
    axis = data.draw(O.axes_for(x.ndim))
    check_grad(lambda t: getattr(vkml, name)(t, axis, keepdims),
               lambda t: getattr(anp, name)(t, axis=axis, keepdims=keepdims), x, key=name)


def test_max_shares_the_gradient_among_ties_like_autograd():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    for axis in (None, 0, 1, (0, 1)):
        got, = O.vkml_grads(lambda t: vkml.max(t, axis), [x], [0], np.ones(np.max(x, axis).shape))
        ag = autograd.grad(lambda t: anp.sum(anp.max(t, axis=axis)))(x)
        np.testing.assert_allclose(got, ag, rtol=1e-12)
        got, = O.vkml_grads(lambda t: vkml.min(t, axis), [x], [0], np.ones(np.min(x, axis).shape))
        ag = autograd.grad(lambda t: anp.sum(anp.min(t, axis=axis)))(x)
        np.testing.assert_allclose(got, ag, rtol=1e-12)


@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax"])
@few
@given(data=st.data())
def test_logsumexp_softmax_log_softmax(name, data):
    x = data.draw(f64(O.shapes(min_dims=1), -5, 5))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    refs = {
        "logsumexp": lambda t: O.ag_logsumexp(t, axis=axis),
        "softmax": lambda t: anp.exp(t - O.ag_logsumexp(t, axis=axis, keepdims=True)),
        "log_softmax": lambda t: t - O.ag_logsumexp(t, axis=axis, keepdims=True),
    }
    check_grad(lambda t: getattr(vkml, name)(t, axis), refs[name], x, key=name)


@few
@given(data=st.data())
def test_logsumexp_over_several_axes(data):
    x = data.draw(f64(O.shapes(min_dims=2), -5, 5))
    axis = tuple(sorted(data.draw(st.lists(st.integers(0, x.ndim - 1), min_size=1, unique=True))))
    for keepdims in (False, True):
        check_grad(lambda t: vkml.logsumexp(t, axis, keepdims),
                   lambda t: O.ag_logsumexp(t, axis=axis, keepdims=keepdims), x)


# -- movement --------------------------------------------------------------------------------------

@few
@given(data=st.data())
def test_reshape_flatten_squeeze_expand_dims(data):
    x = data.draw(f64())
    target = tuple(data.draw(st.permutations(x.shape))) + (1,)
    check_grad(lambda t: vkml.reshape(t, target), lambda t: anp.reshape(t, target), x)
    check_grad(lambda t: vkml.reshape(t, (-1,)), lambda t: anp.reshape(t, (-1,)), x)
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim))
    check_grad(lambda t: vkml.expand_dims(t, axis), lambda t: anp.expand_dims(t, axis), x)
    check_grad(lambda t: vkml.squeeze(t), anp.squeeze, x)
    check_grad(lambda t: vkml.flatten(t), lambda t: anp.reshape(t, (-1,)), x)


@few
@given(data=st.data())
def test_broadcast_to(data):
    x = data.draw(f64())
    target = data.draw(hnp.broadcastable_shapes(x.shape, min_dims=x.ndim, max_dims=x.ndim + 2))
    target = np.broadcast_shapes(x.shape, target)
    check_grad(lambda t: vkml.broadcast_to(t, target), lambda t: t * np.ones(target), x)


def prim(fn, t, **params):
    """An ``api`` function (one primitive and its parameters) applied to a tensor."""
    return vkml.Tensor(fn(t.ir_var, **params), requires_grad=t.requires_grad).realize()


@few
@given(data=st.data())
def test_broadcast_in_dim_primitive(data):
    x = data.draw(f64(O.shapes(max_dims=2)))
    out_ndim = x.ndim + data.draw(st.integers(0, 2))
    dims = tuple(sorted(data.draw(st.lists(st.integers(0, max(out_ndim - 1, 0)), min_size=x.ndim,
                                           max_size=x.ndim, unique=True))))
    shape = [data.draw(st.integers(1, 3)) for _ in range(out_ndim)]
    expanded = [1] * out_ndim
    for i, d in enumerate(dims):
        shape[d] = x.shape[i] if x.shape[i] != 1 else shape[d]
        expanded[d] = x.shape[i]
    shape = tuple(shape)
    check_grad(lambda t: prim(api.broadcast_in_dim, t, shape=shape, dims=dims),
               lambda t: anp.reshape(t, expanded) * np.ones(shape), x)


@few
@given(data=st.data())
def test_transpose_permute_swapaxes(data):
    x = data.draw(f64())
    perm = tuple(data.draw(st.permutations(range(x.ndim))))
    check_grad(lambda t: vkml.transpose(t, perm), lambda t: anp.transpose(t, perm), x)
    check_grad(lambda t: t.permute(*perm) if perm else t.T, lambda t: anp.transpose(t, perm), x)
    if x.ndim >= 2:
        check_grad(lambda t: vkml.swapaxes(t, 0, -1), lambda t: anp.swapaxes(t, 0, -1), x)


@few
@given(data=st.data())
def test_slicing_with_steps_including_negative(data):
    x = data.draw(f64(O.shapes(min_dims=1)))
    index = []
    for d in x.shape:
        step = data.draw(st.sampled_from([1, 2, 3, -1, -2, -3]))
        start = data.draw(st.none() | st.integers(-d, d - 1))
        stop = data.draw(st.none() | st.integers(-d - 1, d))
        index.append(slice(start, stop, step))
    index = tuple(index)
    if 0 in x[index].shape:
        index = tuple(slice(None, None, s.step) for s in index)
    check_grad(lambda t: t[index], lambda t: t[index], x)


@few
@given(data=st.data())
def test_slice_primitive_with_strides(data):
    x = data.draw(f64(O.shapes(min_dims=1)))
    starts, limits, strides = [], [], []
    for d in x.shape:
        s = data.draw(st.integers(0, d - 1))
        starts.append(s)
        limits.append(data.draw(st.integers(s + 1, d)))
        strides.append(data.draw(st.integers(1, 3)))
    kw = dict(starts=tuple(starts), limits=tuple(limits), strides=tuple(strides))
    check_grad(lambda t: prim(api.slice, t, **kw),
               lambda t: O.lax_slice(t, starts, limits, strides), x)


@few
@given(data=st.data())
def test_pad_lo_hi_interior_and_crop(data):
    x = data.draw(f64(O.shapes(min_dims=1)))
    n = x.ndim
    lo = tuple(data.draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n)))
    hi = tuple(data.draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n)))
    interior = tuple(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    lo = tuple(max(a, -(d - 1)) if b >= 0 else max(a, 0) for a, b, d in zip(lo, hi, x.shape))
    check_grad(lambda t: vkml.pad(t, lo, hi, interior),
               lambda t: O.lax_pad(t, lo, hi, interior), x)


@few
@given(data=st.data())
def test_concatenate_stack(data):
    shape = data.draw(O.shapes(min_dims=1))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    other = list(shape)
    other[axis] = data.draw(st.integers(1, 3))
    x, y = data.draw(f64(shape)), data.draw(f64(tuple(other)))
    check_grad(lambda a, b: vkml.concatenate([a, b, a], axis),
               lambda a, b: anp.concatenate([a, b, a], axis), x, y)
    z = data.draw(f64(shape))
    sax = data.draw(st.integers(-len(shape) - 1, len(shape)))
    check_grad(lambda a, b: vkml.stack([a, b, a], sax), lambda a, b: anp.stack([a, b, a], sax),
               x, z)


@few
@given(data=st.data())
def test_flip(data):
    x = data.draw(f64())
    axis = data.draw(O.axes_for(x.ndim))
    axes = range(x.ndim) if axis is None else [a % x.ndim for a in np.atleast_1d(axis)]
    index = tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(x.ndim))
    check_grad(lambda t: vkml.flip(t, axis), lambda t: t[index], x)


@few
@given(data=st.data())
def test_gather_with_repeated_rows(data):
    x = data.draw(f64(O.shapes(min_dims=1)))
    k = data.draw(st.integers(1, x.ndim))
    batch = data.draw(O.shapes(min_dims=1, max_dims=2))
    cols = [data.draw(hnp.arrays(np.int64, batch, elements=st.integers(0, x.shape[j] - 1)))
            for j in range(k)]
    idx = np.stack(cols, axis=-1)
    check_grad(lambda t, i: vkml.gather(t, i), O.gather_nd, x, idx)


@few
@given(data=st.data())
def test_take(data):
    x = data.draw(f64(O.shapes(min_dims=1)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    n = x.shape[axis]
    idx = data.draw(hnp.arrays(np.int64, O.shapes(max_dims=2), elements=st.integers(-n, n - 1)))
    pick = (slice(None),) * (axis % x.ndim)
    check_grad(lambda t, i: vkml.take(t, i, axis), lambda t, i: t[pick + (i,)], x, idx)


@few
@given(data=st.data())
def test_take_along_axis(data):
    x = data.draw(f64(O.shapes(min_dims=1)))
    axis = data.draw(st.integers(0, x.ndim - 1))
    ishape = list(x.shape)
    ishape[axis] = data.draw(st.integers(1, 4))
    n = x.shape[axis]
    idx = data.draw(hnp.arrays(np.int64, tuple(ishape), elements=st.integers(-n, n - 1)))
    grids = np.indices(idx.shape, sparse=True)

    def ref(t, i):
        return t[tuple(i if d == axis else grids[d] for d in range(t.ndim))]
    check_grad(lambda t, i: vkml.take_along_axis(t, i, axis), ref, x, idx)


@few
@given(data=st.data())
def test_scatter_add_in_base_and_updates(data):
    base = data.draw(f64(O.shapes(min_dims=1)))
    k = data.draw(st.integers(1, base.ndim))
    batch = data.draw(O.shapes(min_dims=1, max_dims=2))
    cols = [data.draw(hnp.arrays(np.int64, batch, elements=st.integers(0, base.shape[j] - 1)))
            for j in range(k)]
    idx = np.stack(cols, axis=-1)
    upd = data.draw(f64(batch + base.shape[k:]))
    check_grad(lambda b, i, u: vkml.scatter_add(b, i, u), O.scatter_add_nd, base, idx, upd)


# -- matmul --------------------------------------------------------------------------------------

@st.composite
def matmul_shapes(draw):
    m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3))
    ba, bb = batch.input_shapes
    a = ba + (m, k) if draw(st.integers(0, 3)) else (k,)
    b = bb + (k, n) if draw(st.integers(0, 3)) else (k,)
    return a, b


@few
@given(data=st.data())
def test_matmul_batched_broadcast_and_1d(data):
    sa, sb = data.draw(matmul_shapes())
    a, b = data.draw(f64(sa)), data.draw(f64(sb))
    check_grad(vkml.matmul, anp.matmul, a, b)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 2)), ((4,), (4,)), ((4,), (4, 2)), ((3, 4), (4,)),
                                   ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                   ((4,), (3, 4, 2))])
def test_matmul_shapes(sa, sb):
    rng = np.random.default_rng(len(sa) * 10 + len(sb))
    check_grad(lambda a, b: a @ b, anp.matmul, rng.normal(size=sa), rng.normal(size=sb))


# -- convolution and pooling -----------------------------------------------------------------------

@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1), ((1, 2), (2, 0)), (3, 2)])
def test_conv2d_against_a_direct_loop(stride, padding):
    rng = np.random.default_rng(7)
    x, w, b = rng.normal(size=(2, 3, 5, 6)), rng.normal(size=(4, 3, 3, 2)), rng.normal(size=4)
    check_grad(lambda x, w, b: vkml.conv2d(x, w, b, stride=stride, padding=padding),
               lambda x, w, b: O.conv2d_loop(x, w, b, stride, padding), x, w, b)
    check_grad(lambda x, w: vkml.conv2d(x, w, stride=stride, padding=padding),
               lambda x, w: O.conv2d_loop(x, w, None, stride, padding), x, w)


@fewer
@given(data=st.data())
def test_conv2d_hypothesis(data):
    n, c, o = (data.draw(st.integers(1, 2)) for _ in range(3))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    sh, sw = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    ph, pw = data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))
    h, w = data.draw(st.integers(kh, 5)), data.draw(st.integers(kw, 5))
    x, k = data.draw(f64((n, c, h, w))), data.draw(f64((o, c, kh, kw)))
    check_grad(lambda x, k: vkml.conv2d(x, k, stride=(sh, sw), padding=(ph, pw)),
               lambda x, k: O.conv2d_loop(x, k, None, (sh, sw), (ph, pw)), x, k)


@pytest.mark.parametrize("kernel,stride", [(2, None), (2, 1), ((3, 2), (1, 2)), (3, 2), (2, 3)])
def test_pools(kernel, stride):
    x = np.random.default_rng(3).permutation(2 * 2 * 6 * 5).reshape(2, 2, 6, 5) * 0.1
    check_grad(lambda t: vkml.max_pool2d(t, kernel, stride),
               lambda t: O.pool2d_loop(t, kernel, stride, anp.max), x)
    check_grad(lambda t: vkml.avg_pool2d(t, kernel, stride),
               lambda t: O.pool2d_loop(t, kernel, stride, anp.mean), x)


# -- compositions ----------------------------------------------------------------------------------

@few
@given(data=st.data())
def test_mlp_with_broadcast_bias_and_softmax_cross_entropy(data):
    b, i, h, o = (data.draw(st.integers(1, 4)) for _ in range(4))
    x, w1, b1 = data.draw(f64((b, i))), data.draw(f64((i, h))), data.draw(f64((h,)))
    w2 = data.draw(f64((h, o)))
    labels = data.draw(hnp.arrays(np.int64, (b,), elements=st.integers(0, o - 1)))
    onehot = np.eye(o)[labels]

    def vk(x, w1, b1, w2):
        z = vkml.tanh(x @ w1 + b1) @ w2
        return -vkml.mean(vkml.sum(vkml.log_softmax(z, -1) * onehot, -1))

    def ag(x, w1, b1, w2):
        z = anp.matmul(anp.tanh(anp.matmul(x, w1) + b1), w2)
        return -anp.mean(anp.sum((z - O.ag_logsumexp(z, axis=-1, keepdims=True)) * onehot, -1))

    check_grad(vk, ag, x, w1, b1, w2)


def test_batched_matmul_chain_with_broadcasting():
    rng = np.random.default_rng(11)
    a, b, c = rng.normal(size=(2, 1, 3, 4)), rng.normal(size=(5, 4, 2)), rng.normal(size=(2,))
    check_grad(lambda a, b, c: vkml.sigmoid((a @ b) @ c) * vkml.exp(a @ b @ c * 0.1),
               lambda a, b, c: _sigmoid(anp.matmul(anp.matmul(a, b), c))
               * anp.exp(anp.matmul(anp.matmul(a, b), c) * 0.1), a, b, c)


def test_reductions_over_several_axes_composed():
    rng = np.random.default_rng(12)
    x = rng.normal(size=(2, 3, 4))
    check_grad(lambda t: vkml.mean(t * t, axis=(0, 2)) + vkml.sum(vkml.exp(t), axis=(1, -1))[0],
               lambda t: anp.mean(t * t, axis=(0, 2)) + anp.sum(anp.exp(t), axis=(1, 2))[0], x)
    check_grad(lambda t: vkml.sum(t, axis=(0, 1), keepdims=True) * vkml.mean(t, axis=2,
                                                                             keepdims=True),
               lambda t: anp.sum(t, axis=(0, 1), keepdims=True) * anp.mean(t, axis=2,
                                                                           keepdims=True), x)


def test_indexing_composed_with_arithmetic():
    rng = np.random.default_rng(13)
    x = rng.normal(size=(4, 5))
    rows = np.array([3, 0, 3, 1])
    check_grad(lambda t: t[rows][:, ::-2] * t[:, None, 2] + t[..., -1].sum(),
               lambda t: t[rows][:, ::-2] * t[:, None, 2] + anp.sum(t[..., -1]), x)


def test_a_tensor_used_twice_accumulates_both_paths():
    rng = np.random.default_rng(14)
    x = rng.uniform(0.5, 2.0, size=(3, 3))
    check_grad(lambda t: vkml.log(t) * t @ t.T - vkml.sqrt(t) / t,
               lambda t: anp.matmul(anp.log(t) * t, t.T) - anp.sqrt(t) / t, x)


def test_identity_op_keeps_the_leafs_gradient():
    x = vkml.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    y = x.reshape((3,))                      # the identity: api returns x's own Var
    x.sum(axis=())                           # another one, discarded at once
    (y * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.array([1.0, 2.0, 3.0]))


# -- whole Jacobians -------------------------------------------------------------------------------

def vkml_jacobian(fn, x):
    """Row i of the Jacobian is the gradient of output element i: one backward per element."""
    out_shape = fn(vkml.tensor(x)).shape
    rows = []
    for i in range(int(np.prod(out_shape))):
        seed = np.zeros(out_shape)
        seed.flat[i] = 1.0
        rows.append(O.vkml_grads(fn, [x], [0], seed)[0])
    return np.stack(rows).reshape(tuple(out_shape) + x.shape)


@pytest.mark.parametrize("name,fn,ref", [
    ("softmax", lambda t: vkml.softmax(t, -1),
     lambda t: anp.exp(t - O.ag_logsumexp(t, axis=-1, keepdims=True))),
    ("cumulative-ish", lambda t: vkml.matmul(np.tril(np.ones((4, 4))), t * t),
     lambda t: anp.matmul(np.tril(np.ones((4, 4))), t * t)),
    ("max-pool-1d", lambda t: vkml.max(vkml.stack([t[:-1], t[1:]], -1), -1),
     lambda t: anp.max(anp.stack([t[:-1], t[1:]], -1), -1)),
])
def test_full_jacobian_against_autograd(name, fn, ref):
    x = np.array([0.3, -1.2, 2.0, 0.7])
    np.testing.assert_allclose(vkml_jacobian(fn, x), autograd.jacobian(ref)(x), rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("name", ["exp", "sin", "tanh", "sigmoid", "square"])
def test_elementwise_grad_against_autograd(name):
    fn, ref, _ = UNARY[name]
    x = np.linspace(-2.0, 2.0, 12).reshape(3, 4)
    got, = O.vkml_grads(fn, [x], [0], np.ones(x.shape))
    np.testing.assert_allclose(got, autograd.elementwise_grad(ref)(x), rtol=1e-12)


# -- float32 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,fn,ref", [
    ("tanh-matmul", lambda a, b: vkml.tanh(a @ b), lambda a, b: anp.tanh(anp.matmul(a, b))),
    ("softmax", lambda a, b: vkml.softmax(a * b[0], -1), lambda a, b: anp.exp(
        a * b[0] - O.ag_logsumexp(a * b[0], axis=-1, keepdims=True))),
])
def test_float32_gradients_keep_float32(name, fn, ref):
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(3, 3)).astype(np.float32), rng.normal(size=(3, 3)).astype(np.float32)
    check_grad(fn, ref, a, b, rtol=2e-5, key=name)   # dtype checked inside vkml_grads


# -- every differentiable primitive has a gradient test --------------------------------------------

DIFFERENTIABLE = {
    "neg", "exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "sign", "stop_gradient", "add", "sub",
    "mul", "div", "pow", "max", "min", "where", "cast", "reduce_sum", "reduce_max", "reshape",
    "broadcast_in_dim", "transpose", "slice", "pad", "concatenate", "flip", "gather",
    "scatter_add", "matmul",
}


def test_the_differentiable_primitives_are_the_ones_with_jvps():
    from vkml.ops import elementwise, linalg, movement, reductions
    prims = [p for m in (elementwise, reductions, movement, linalg) for p in vars(m).values()
             if isinstance(p, vkml.ops.Primitive)]
    # the others (comparisons, logic, argmax) are piecewise constant: zero or no derivative
    zero = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
            "argmax"}
    assert {p.name for p in prims} == DIFFERENTIABLE | zero
