"""Every primitive's forward, through the public functions, against NumPy (eager mode).

Shapes and values are drawn by hypothesis (rank 0-3, dims 1-4) for every dtype
an op applies to; results must match NumPy in shape, dtype (NumPy 2 promotion,
Python scalars weak) and value -- bit for bit where vkml runs the same NumPy
function, to a tolerance for composites (mean, softmax, conv2d, ...).
"""

import numpy as np
import pytest
import scipy.special
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vkml
from vkml.ops import PRIMITIVES, Primitive, api

import oracle as O
from oracle import assert_same

pytestmark = pytest.mark.usefixtures("eager")

dtypes = st.sampled_from(O.ALL_DTYPES)
numeric = st.sampled_from(O.NUMERIC)
floats = st.sampled_from(O.FLOATS)


def T(a):
    return vkml.tensor(a)


def prim(fn, *tensors, **params):
    """Apply an ``api`` function (a primitive with its parameters) to tensors, eagerly."""
    out = vkml.Tensor(fn(*[t.ir_var for t in tensors], **params))
    return out.realize()


# -- elementwise, unary --------------------------------------------------------------------

UNARY = {
    "neg": (vkml.neg, np.negative, O.NUMERIC, -10, 10),
    "exp": (vkml.exp, np.exp, O.NUMERIC, -5, 5),
    "log": (vkml.log, np.log, O.NUMERIC, 1, 10),
    "sin": (vkml.sin, np.sin, O.NUMERIC, -10, 10),
    "cos": (vkml.cos, np.cos, O.NUMERIC, -10, 10),
    "tanh": (vkml.tanh, np.tanh, O.NUMERIC, -5, 5),
    "sqrt": (vkml.sqrt, np.sqrt, O.NUMERIC, 0, 10),
    "abs": (vkml.abs, np.abs, O.NUMERIC, -10, 10),
    "sign": (vkml.sign, np.sign, O.NUMERIC, -3, 3),
    "square": (vkml.square, np.square, O.NUMERIC, -10, 10),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary(name, data):
    fn, ref, dts, lo, hi = UNARY[name]
    dtype = data.draw(st.sampled_from(dts), label="dtype")
    x = data.draw(O.arrays(dtype, lo=lo, hi=hi), label="x")
    assert_same(fn(T(x)), ref(x))


@given(x=O.arrays("float64", lo=-10, hi=10))
def test_unary_methods_match_functions(x):
    t = T(x)
    for method, ref in [("exp", np.exp), ("sin", np.sin), ("cos", np.cos), ("tanh", np.tanh),
                        ("abs", np.abs)]:
        assert_same(getattr(t, method)(), ref(x))
    assert_same(-t, -x)
    assert_same(abs(t), np.abs(x))
    assert_same(T(np.abs(x)).sqrt(), np.sqrt(np.abs(x)))
    assert_same(vkml.stop_gradient(t), x)


@given(x=O.arrays("bool"))
def test_logical_not(x):
    assert_same(vkml.logical_not(T(x)), np.logical_not(x))
    assert_same(~T(x), ~x)


@given(dtype=numeric, data=st.data())
def test_logical_not_of_numbers_means_equal_to_zero(dtype, data):
    x = data.draw(O.arrays(dtype, lo=-2, hi=2))
    assert_same(vkml.logical_not(T(x)), np.logical_not(x))


@given(data=st.data(), dtype=floats)
def test_relu_sigmoid_clip(data, dtype):
    x = data.draw(O.arrays(dtype, lo=-20, hi=20))
    assert_same(vkml.relu(T(x)), np.maximum(x, 0).astype(dtype), exact=False)
    sig = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(dtype)
    assert_same(vkml.sigmoid(T(x)), sig, exact=False, rtol=1e-5, atol=1e-7)
    assert_same(vkml.clip(T(x), -1.5, 2.0), np.clip(x, -1.5, 2.0))
    assert_same(vkml.clip(T(x), None, 0.5), np.minimum(x, 0.5))


@given(x=O.arrays("int32", lo=-5, hi=5))
def test_relu_of_integers_stays_integer(x):
    assert_same(vkml.relu(T(x)), np.maximum(x, 0))


# -- elementwise, binary --------------------------------------------------------------------

BINARY = {
    "add": (vkml.add, np.add),
    "sub": (vkml.sub, np.subtract),
    "mul": (vkml.mul, np.multiply),
    "div": (vkml.div, np.true_divide),
    "maximum": (vkml.maximum, np.maximum),
    "minimum": (vkml.minimum, np.minimum),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data(), dx=numeric, dy=numeric)
def test_binary_broadcasts_and_promotes_like_numpy(name, data, dx, dy):
    fn, ref = BINARY[name]
    sx, sy = data.draw(O.broadcastable_pair(), label="shapes")
    x = data.draw(O.arrays(dx, sx), label="x")
    y = data.draw(O.arrays(dy, sy), label="y")
    if name == "div":
        y = np.where(y == 0, 3, y).astype(dy)
    with np.errstate(all="ignore"):
        want = ref(x, y)
    assert_same(fn(T(x), T(y)), want)


def test_binary_operators_match_numpy():
    x = np.array([[1.5, -2.0, 3.0]], dtype=np.float32)
    y = np.array([[2.0], [-0.5]], dtype=np.float32)
    tx, ty = T(x), T(y)
    assert_same(tx + ty, x + y)
    assert_same(tx - ty, x - y)
    assert_same(tx * ty, x * y)
    assert_same(tx / ty, x / y)
    assert_same(2.0 - tx, 2.0 - x)
    assert_same(2.0 / tx, 2.0 / x)
    assert_same(3 * tx, 3 * x)
    assert_same(x + ty, x + y)            # ndarray on the left defers to the Tensor
    assert_same(abs(tx) ** ty, np.abs(x) ** y)
    assert_same(2.0 ** tx, 2.0 ** x)


@given(data=st.data(), dx=numeric, dy=numeric)
def test_pow(data, dx, dy):
    sx, sy = data.draw(O.broadcastable_pair())
    x = data.draw(O.arrays(dx, sx, lo=-4, hi=4))
    y = data.draw(O.arrays(dy, sy, lo=0, hi=3))   # integers to negative powers are refused by NumPy
    with np.errstate(all="ignore"):     # negative ** fraction is nan in both
        want = np.power(x, y)
        got = vkml.pow(T(x), T(y))
    assert_same(got, want)


@given(data=st.data(), dx=st.sampled_from(O.INTS), dy=st.sampled_from(O.INTS))
def test_floor_divide_integers(data, dx, dy):
    sx, sy = data.draw(O.broadcastable_pair())
    x = data.draw(O.arrays(dx, sx, lo=-20, hi=20))
    y = data.draw(O.arrays(dy, sy, lo=-5, hi=5))
    y = np.where(y == 0, 2, y).astype(dy)
    assert_same(vkml.floor_divide(T(x), T(y)), np.floor_divide(x, y))
    assert_same(T(x) // T(y), x // y)


COMPARE = {
    "equal": (vkml.equal, np.equal),
    "not_equal": (vkml.not_equal, np.not_equal),
    "less": (vkml.less, np.less),
    "less_equal": (vkml.less_equal, np.less_equal),
    "greater": (vkml.greater, np.greater),
    "greater_equal": (vkml.greater_equal, np.greater_equal),
    "logical_and": (vkml.logical_and, np.logical_and),
    "logical_or": (vkml.logical_or, np.logical_or),
}


@pytest.mark.parametrize("name", sorted(COMPARE))
@given(data=st.data(), dx=dtypes, dy=dtypes)
def test_comparisons_and_logic(name, data, dx, dy):
    fn, ref = COMPARE[name]
    sx, sy = data.draw(O.broadcastable_pair())
    x = data.draw(O.arrays(dx, sx, lo=-2, hi=2))
    y = data.draw(O.arrays(dy, sy, lo=-2, hi=2))
    assert_same(fn(T(x), T(y)), ref(x, y))


def test_comparison_operators():
    x, y = np.array([1, 2, 3]), np.array([3, 2, 1])
    for op in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
        assert_same(getattr(T(x), op)(T(y)), getattr(x, op)(y))
    b = np.array([True, False, True])
    assert_same(T(b) & T(~b), b & ~b)
    assert_same(T(b) | T(~b), b | ~b)


@given(data=st.data(), dc=dtypes, dx=numeric, dy=numeric)
def test_where_broadcasts_promotes_and_reads_numbers_as_truth(data, dc, dx, dy):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4))
    sc, sx, sy = shapes.input_shapes
    c = data.draw(O.arrays(dc, sc, lo=-1, hi=1))
    x = data.draw(O.arrays(dx, sx))
    y = data.draw(O.arrays(dy, sy))
    assert_same(vkml.where(T(c), T(x), T(y)), np.where(c, x, y))


def test_where_with_python_scalars():
    c = np.array([True, False, True])
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert_same(vkml.where(T(c), T(x), 0.0), np.where(c, x, np.float32(0)))
    assert_same(vkml.where(T(c), 1, T(x)), np.where(c, np.float32(1), x))


@given(data=st.data(), src=dtypes, dst=dtypes)
def test_cast_between_every_pair(data, src, dst):
    x = data.draw(O.arrays(src, lo=-100, hi=100))
    assert_same(vkml.cast(T(x), dst), x.astype(dst))
    assert_same(T(x).astype(dst), x.astype(dst))


def test_cast_methods():
    x = np.array([1.7, -2.2])
    assert_same(T(x).float(), x.astype(np.float32))
    assert_same(T(x).double(), x)
    assert_same(T(x).int(), x.astype(np.int32))
    assert_same(T(x).long(), x.astype(np.int64))
    assert_same(vkml.cast(T(x), vkml.float32), x.astype(np.float32))
    assert_same(vkml.cast(T(x), np.dtype("int32")), x.astype(np.int32))


# -- dtype promotion through the public functions -------------------------------------------------

@pytest.mark.parametrize("x_dtype,y_dtype,want", [
    ("int32", "float32", "float64"),
    ("int64", "float32", "float64"),
    ("int32", "int64", "int64"),
    ("float32", "float64", "float64"),
    ("bool", "int32", "int32"),
    ("bool", "float32", "float32"),
])
def test_array_array_promotion(x_dtype, y_dtype, want):
    x, y = np.ones(2, x_dtype), np.ones(2, y_dtype)
    for fn, ref in [(vkml.add, np.add), (vkml.mul, np.multiply), (vkml.maximum, np.maximum)]:
        got = fn(T(x), T(y))
        assert got.dtype == np.dtype(want) == ref(x, y).dtype
        assert fn(T(y), T(x)).dtype == np.dtype(want)


@pytest.mark.parametrize("scalar", [2, -3, 2.0, 0.5, True])
@pytest.mark.parametrize("dtype", O.NUMERIC + ("bool",))
def test_python_scalars_are_weak(dtype, scalar):
    x = np.array([1, 3, 2], dtype=dtype)
    cases = [(vkml.add, np.add), (vkml.mul, np.multiply), (vkml.maximum, np.maximum),
             (vkml.sub, np.subtract), (vkml.div, np.true_divide)]
    for fn, ref in cases:
        if dtype == "bool" and isinstance(scalar, bool) and fn in (vkml.add, vkml.sub, vkml.mul,
                                                                    vkml.maximum):
            continue    # bool (op) bool: NumPy's logical reading; vkml refuses (test_ops_errors)
        want = ref(x, scalar)
        assert_same(fn(T(x), scalar), want)
        assert_same(fn(scalar, T(x)), ref(scalar, x))


def test_promotion_examples_from_the_issue():
    i32 = np.array([1, 2], dtype=np.int32)
    f32 = np.array([1.5, 2.5], dtype=np.float32)
    assert vkml.add(T(i32), T(f32)).dtype == np.float64
    assert (T(f32) * 2.0).dtype == np.float32
    assert (T(f32) * 2).dtype == np.float32
    assert (T(i32) + 1).dtype == np.int32
    assert (T(i32) + 1.5).dtype == np.float64
    assert (T(f32) + np.float64(1.0)).dtype == np.float64    # a NumPy scalar is not weak
    assert vkml.sum(T(i32)).dtype == np.int64 == np.sum(i32).dtype
    assert vkml.sum(T(np.array([True, True]))).item() == 2
    assert_same(vkml.add(T(np.ones((3, 1))), T(np.arange(4.0))), np.ones((3, 1)) + np.arange(4.0))
    assert vkml.add(T(np.ones((2, 1, 3))), T(np.ones((4, 1)))).shape == (2, 4, 3)


@given(data=st.data(), dx=numeric, dy=numeric)
def test_concatenate_and_stack_promote(data, dx, dy):
    shape = data.draw(O.shapes(min_dims=1))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    other = list(shape)
    other[axis] = data.draw(st.integers(1, 4))
    x = data.draw(O.arrays(dx, shape))
    y = data.draw(O.arrays(dy, tuple(other)))
    assert_same(vkml.concatenate([T(x), T(y)], axis), np.concatenate([x, y], axis))
    z = data.draw(O.arrays(dy, shape))
    sax = data.draw(st.integers(-len(shape) - 1, len(shape)))
    assert_same(vkml.stack([T(x), T(z), T(x)], sax), np.stack([x, z, x], sax))


# -- reductions ---------------------------------------------------------------------------------

@given(data=st.data(), dtype=dtypes, keepdims=st.booleans())
def test_sum(data, dtype, keepdims):
    x = data.draw(O.arrays(dtype))
    axis = data.draw(O.axes_for(x.ndim))
    got = vkml.sum(T(x), axis, keepdims)
    assert_same(got, np.sum(x, axis=axis, keepdims=keepdims), exact=False, rtol=1e-5, atol=1e-5)
    assert_same(T(x).sum(axis, keepdims), np.sum(x, axis=axis, keepdims=keepdims),
                exact=False, rtol=1e-5, atol=1e-5)


@given(data=st.data(), dtype=dtypes, keepdims=st.booleans())
def test_mean(data, dtype, keepdims):
    x = data.draw(O.arrays(dtype))
    axis = data.draw(O.axes_for(x.ndim))
    assume(axis != ())
    want = np.mean(x, axis=axis, keepdims=keepdims)
    assert_same(vkml.mean(T(x), axis, keepdims), want, exact=False, rtol=1e-5, atol=1e-6)


def extreme_ints(dtype):
    info = np.iinfo(dtype)
    return st.sampled_from([info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max]) | \
        st.integers(-5, 5)


@pytest.mark.parametrize("name", ["max", "min"])
@given(data=st.data(), dtype=dtypes, keepdims=st.booleans())
def test_max_min(name, data, dtype, keepdims):
    if np.dtype(dtype).kind == "i":
        x = data.draw(O.arrays(dtype, elements_=extreme_ints(dtype)))
    else:
        x = data.draw(O.arrays(dtype))
    axis = data.draw(O.axes_for(x.ndim))
    ref = np.max if name == "max" else np.min
    assert_same(getattr(vkml, name)(T(x), axis, keepdims), ref(x, axis=axis, keepdims=keepdims))
    assert_same(getattr(T(x), name)(axis, keepdims), ref(x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@given(data=st.data(), dtype=dtypes)
def test_argmax_argmin(name, data, dtype):
    if np.dtype(dtype).kind == "i":
        x = data.draw(O.arrays(dtype, elements_=extreme_ints(dtype)))
    else:
        x = data.draw(O.arrays(dtype, lo=-2, hi=2))   # small range: many ties, first one wins
    axis = data.draw(O.axes_for(x.ndim, allow_tuple=False))
    want = getattr(np, name)(x, axis=axis)
    assert_same(getattr(vkml, name)(T(x), axis), np.asarray(want, dtype=np.int64))


def test_max_min_of_integer_extremes():
    x = np.array([np.iinfo(np.int32).min, 0, np.iinfo(np.int32).max], dtype=np.int32)
    assert_same(vkml.min(T(x)), x.min())
    assert_same(vkml.max(T(x)), x.max())
    assert vkml.argmin(T(x)).item() == 0
    assert vkml.argmax(T(x)).item() == 2


@given(data=st.data(), dtype=floats)
def test_logsumexp_softmax_log_softmax(data, dtype):
    x = data.draw(O.arrays(dtype, shape=O.shapes(min_dims=1), lo=-30, hi=30))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    x64 = x.astype(np.float64)
    tol = dict(exact=False, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)
    assert_same(vkml.logsumexp(T(x), axis),
                scipy.special.logsumexp(x64, axis=axis).astype(dtype), **tol)
    assert_same(vkml.logsumexp(T(x), axis, keepdims=True),
                scipy.special.logsumexp(x64, axis=axis, keepdims=True).astype(dtype), **tol)
    assert_same(vkml.softmax(T(x), axis), scipy.special.softmax(x64, axis=axis).astype(dtype),
                **tol)
    assert_same(vkml.log_softmax(T(x), axis),
                scipy.special.log_softmax(x64, axis=axis).astype(dtype), **tol)


def test_logsumexp_of_infinite_rows():
    x = np.array([[-np.inf, -np.inf], [-np.inf, 0.0], [np.inf, 1.0], [np.inf, -np.inf]])
    with np.errstate(all="ignore"):
        want = scipy.special.logsumexp(x, axis=1)
        got = vkml.logsumexp(T(x), axis=1).numpy()
    np.testing.assert_array_equal(got, want)     # -inf, 0, inf, inf


def test_logsumexp_over_several_axes_and_large_values():
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]])
    assert_same(vkml.logsumexp(T(x), axis=(0, 1)), scipy.special.logsumexp(x), exact=False)
    assert_same(vkml.logsumexp(T(x), axis=None), scipy.special.logsumexp(x), exact=False)
    assert_same(vkml.softmax(T(x), axis=1), scipy.special.softmax(x, axis=1), exact=False)


# -- movement -------------------------------------------------------------------------------------

@st.composite
def reshape_targets(draw, shape):
    """A shape with the same element count (maybe with one -1)."""
    size = int(np.prod(shape))
    dims = []
    rest = size
    while rest > 1 and len(dims) < 4:
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    if rest > 1:
        dims.append(rest)
    dims += [1] * draw(st.integers(0, 1))
    dims = draw(st.permutations(dims))
    if dims and draw(st.booleans()):
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return tuple(dims)


@given(data=st.data(), dtype=dtypes)
def test_reshape(data, dtype):
    x = data.draw(O.arrays(dtype))
    target = data.draw(reshape_targets(x.shape))
    assert_same(vkml.reshape(T(x), target), x.reshape(target))
    assert_same(T(x).reshape(target), x.reshape(target))
    assert_same(T(x).reshape(*target) if target else T(x).reshape(()), x.reshape(target))
    assert_same(vkml.flatten(T(x)), x.reshape(-1))


@given(data=st.data(), dtype=dtypes)
def test_broadcast_to(data, dtype):
    x = data.draw(O.arrays(dtype))
    target = data.draw(hnp.broadcastable_shapes(x.shape, min_dims=x.ndim, max_dims=x.ndim + 2,
                                                max_side=4))
    target = np.broadcast_shapes(x.shape, target)
    assert_same(vkml.broadcast_to(T(x), target), np.broadcast_to(x, target))


@given(data=st.data(), dtype=dtypes)
def test_broadcast_in_dim_primitive(data, dtype):
    x = data.draw(O.arrays(dtype, shape=O.shapes(max_dims=2)))
    extra = data.draw(st.lists(st.integers(1, 3), max_size=2))
    out_ndim = x.ndim + len(extra)
    dims = tuple(sorted(data.draw(st.lists(st.integers(0, max(out_ndim - 1, 0)), min_size=x.ndim,
                                           max_size=x.ndim, unique=True))))
    shape = [0] * out_ndim
    for i, d in enumerate(dims):
        shape[d] = x.shape[i] if x.shape[i] != 1 or not data.draw(st.booleans()) else 3
    it = iter(extra)
    shape = tuple(s if s else next(it) for s in shape)
    expanded = [1] * out_ndim
    for i, d in enumerate(dims):
        expanded[d] = x.shape[i]
    want = np.broadcast_to(x.reshape(expanded), shape)
    assert_same(prim(api.broadcast_in_dim, T(x), shape=shape, dims=dims), want)


@given(data=st.data(), dtype=dtypes)
def test_transpose_permute_swapaxes(data, dtype):
    x = data.draw(O.arrays(dtype))
    perm = tuple(data.draw(st.permutations(range(x.ndim))))
    assert_same(vkml.transpose(T(x), perm), np.transpose(x, perm))
    assert_same(vkml.permute(T(x), perm), np.transpose(x, perm))
    assert_same(vkml.transpose(T(x)), x.T)
    assert_same(T(x).T, x.T)
    neg = tuple(p - x.ndim for p in perm)
    assert_same(T(x).permute(*neg) if neg else T(x).permute(()), np.transpose(x, perm))
    if x.ndim:
        a, b = data.draw(st.integers(-x.ndim, x.ndim - 1)), data.draw(st.integers(0, x.ndim - 1))
        assert_same(vkml.swapaxes(T(x), a, b), np.swapaxes(x, a, b))


@given(data=st.data(), dtype=dtypes)
def test_expand_dims_squeeze(data, dtype):
    x = data.draw(O.arrays(dtype))
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim))
    assert_same(vkml.expand_dims(T(x), axis), np.expand_dims(x, axis))
    assert_same(T(x).unsqueeze(axis), np.expand_dims(x, axis))
    assert_same(vkml.squeeze(T(x)), np.squeeze(x))
    ones = tuple(i for i, d in enumerate(x.shape) if d == 1)
    if ones:
        a = data.draw(st.sampled_from(ones))
        assert_same(vkml.squeeze(T(x), a), np.squeeze(x, a))


@given(data=st.data(), dtype=dtypes)
def test_flatten_ranges(data, dtype):
    x = data.draw(O.arrays(dtype, shape=O.shapes(min_dims=1)))
    s = data.draw(st.integers(0, x.ndim - 1))
    e = data.draw(st.integers(s, x.ndim - 1))
    want = x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:])
    assert_same(vkml.flatten(T(x), s, e), want)
    assert_same(vkml.flatten(T(x), s - x.ndim, e - x.ndim), want)


@given(data=st.data(), dtype=dtypes)
def test_flip(data, dtype):
    x = data.draw(O.arrays(dtype))
    axis = data.draw(O.axes_for(x.ndim))
    assert_same(vkml.flip(T(x), axis), np.flip(x, axis))


@given(data=st.data(), dtype=dtypes)
def test_pad_lo_hi_interior_and_crop(data, dtype):
    x = data.draw(O.arrays(dtype))
    lo = tuple(data.draw(st.lists(st.integers(-1, 2), min_size=x.ndim, max_size=x.ndim)))
    hi = tuple(data.draw(st.lists(st.integers(-1, 2), min_size=x.ndim, max_size=x.ndim)))
    interior = tuple(data.draw(st.lists(st.integers(0, 2), min_size=x.ndim, max_size=x.ndim)))
    assume(all(a + n + (n - 1) * i + b >= 0 for n, a, b, i in zip(x.shape, lo, hi, interior)))
    assert_same(vkml.pad(T(x), lo, hi, interior), O.np_pad(x, lo, hi, interior))
    if x.ndim:
        assert_same(vkml.pad(T(x), [max(a, 0) for a in lo], [max(b, 0) for b in hi]),
                    np.pad(x, [(max(a, 0), max(b, 0)) for a, b in zip(lo, hi)]))


@given(data=st.data(), dtype=dtypes)
def test_slice_primitive(data, dtype):
    x = data.draw(O.arrays(dtype))
    starts, limits, strides = [], [], []
    for d in x.shape:
        s = data.draw(st.integers(0, d))
        starts.append(s)
        limits.append(data.draw(st.integers(s, d)))
        strides.append(data.draw(st.integers(1, 3)))
    want = x[tuple(slice(s, l, k) for s, l, k in zip(starts, limits, strides))]
    got = prim(api.slice, T(x), starts=tuple(starts), limits=tuple(limits), strides=tuple(strides))
    assert_same(got, want)


@st.composite
def gather_case(draw, dtype):
    x = draw(O.arrays(dtype, shape=O.shapes(min_dims=1)))
    k = draw(st.integers(1, x.ndim))
    batch = draw(O.shapes(max_dims=2))
    cols = [draw(hnp.arrays(np.int64, batch, elements=st.integers(0, x.shape[j] - 1)))
            for j in range(k)]
    idx = np.stack(cols, axis=-1).astype(draw(st.sampled_from(O.INTS)))
    return x, idx


@given(data=st.data(), dtype=dtypes)
def test_gather(data, dtype):
    x, idx = data.draw(gather_case(dtype))
    assert_same(vkml.gather(T(x), T(idx)), O.gather_nd(x, idx))


@given(data=st.data(), dtype=numeric)
def test_scatter_add_adds_duplicates(data, dtype):
    base, idx = data.draw(gather_case(dtype))
    upd = data.draw(O.arrays(dtype, shape=idx.shape[:-1] + base.shape[idx.shape[-1]:]))
    want = base.copy()
    np.add.at(want, tuple(idx[..., j] for j in range(idx.shape[-1])), upd)
    assert_same(vkml.scatter_add(T(base), T(idx), T(upd)), want, exact=False, rtol=1e-6)
    assert_same(vkml.scatter_add(T(base), T(idx), T(upd)), O.scatter_add_nd(base, idx, upd)
                .astype(dtype), exact=False, rtol=1e-5, atol=1e-5)


@given(data=st.data(), dtype=dtypes)
def test_take(data, dtype):
    x = data.draw(O.arrays(dtype, shape=O.shapes(min_dims=1)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    n = x.shape[axis]
    idx = data.draw(hnp.arrays(np.int64, O.shapes(max_dims=2), elements=st.integers(-n, n - 1)))
    assert_same(vkml.take(T(x), T(idx), axis), np.take(x, idx, axis))
    assert_same(vkml.take(T(x), idx.tolist(), axis), np.take(x, idx, axis))


@given(data=st.data(), dtype=dtypes)
def test_take_along_axis(data, dtype):
    x = data.draw(O.arrays(dtype, shape=O.shapes(min_dims=1)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    n = x.shape[axis]
    ishape = list(x.shape)
    ishape[axis] = data.draw(st.integers(1, 4))
    for i in range(x.ndim):       # dims of 1 (of the index or of x) broadcast
        if i != axis % x.ndim and data.draw(st.booleans()):
            ishape[i] = 1 if x.shape[i] > 1 else data.draw(st.integers(1, 3))
    idx = data.draw(hnp.arrays(np.int64, tuple(ishape), elements=st.integers(-n, n - 1)))
    want = np.take_along_axis(x, idx, axis)
    assert_same(vkml.take_along_axis(T(x), T(idx), axis), want)


# -- matmul ----------------------------------------------------------------------------------------

@st.composite
def matmul_shapes(draw):
    m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3))
    ba, bb = batch.input_shapes
    a = ba + (m, k) if draw(st.integers(0, 3)) else (k,)
    b = bb + (k, n) if draw(st.integers(0, 3)) else (k,)
    return a, b


@given(data=st.data(), da=numeric, db=numeric)
def test_matmul(data, da, db):
    sa, sb = data.draw(matmul_shapes())
    a = data.draw(O.arrays(da, sa, lo=-5, hi=5))
    b = data.draw(O.arrays(db, sb, lo=-5, hi=5))
    want = np.matmul(a, b)
    assert_same(vkml.matmul(T(a), T(b)), want, exact=False, rtol=1e-5, atol=1e-5)
    assert_same(T(a) @ T(b), want, exact=False, rtol=1e-5, atol=1e-5)
    assert_same(vkml.dot(T(a), b), want, exact=False, rtol=1e-5, atol=1e-5)


# -- convolution and pooling -----------------------------------------------------------------------

@st.composite
def conv_case(draw):
    n, c, o = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h = draw(st.integers(max(1, kh - 2 * ph), 6))
    w = draw(st.integers(max(1, kw - 2 * pw), 6))
    return (n, c, h, w), (o, c, kh, kw), (sh, sw), (ph, pw)


@given(data=st.data(), dtype=floats, with_bias=st.booleans())
def test_conv2d(data, dtype, with_bias):
    xs, ws, stride, padding = data.draw(conv_case())
    x = data.draw(O.arrays(dtype, xs, lo=-3, hi=3))
    w = data.draw(O.arrays(dtype, ws, lo=-3, hi=3))
    b = data.draw(O.arrays(dtype, (ws[0],), lo=-3, hi=3)) if with_bias else None
    want = O.conv2d_loop(x.astype(np.float64), w.astype(np.float64), b, stride, padding)
    got = vkml.conv2d(T(x), T(w), None if b is None else T(b), stride=stride, padding=padding)
    assert_same(got, want.astype(dtype), exact=False, rtol=1e-5, atol=1e-4)
    if stride[0] == stride[1] and padding[0] == padding[1]:
        got = vkml.conv2d(T(x), T(w), None if b is None else T(b), stride[0], padding[0])
        assert_same(got, want.astype(dtype), exact=False, rtol=1e-5, atol=1e-4)


@st.composite
def pool_case(draw):
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = draw(st.sampled_from([None, "same"]) | st.tuples(st.integers(1, 3), st.integers(1, 3)))
    if stride == "same":
        stride = (kh, kw)
    h, w = draw(st.integers(kh, 7)), draw(st.integers(kw, 7))
    return (n, c, h, w), (kh, kw), stride


@pytest.mark.parametrize("kind", ["max", "avg"])
@given(data=st.data(), dtype=numeric)
def test_pool2d_overlapping_or_not(kind, data, dtype):
    shape, k, stride = data.draw(pool_case())
    x = data.draw(O.arrays(dtype, shape, lo=-5, hi=5))
    if kind == "max":
        want = O.pool2d_loop(x, k, stride, np.max)
        assert_same(vkml.max_pool2d(T(x), k, stride), want)
    else:
        want = O.pool2d_loop(x, k, stride, np.mean)
        assert_same(vkml.avg_pool2d(T(x), k, stride), want, exact=False, rtol=1e-5, atol=1e-6)


def test_pool_with_int_kernel_and_stride():
    x = np.arange(2 * 1 * 5 * 5, dtype=np.float64).reshape(2, 1, 5, 5)
    assert_same(vkml.max_pool2d(T(x), 2), O.pool2d_loop(x, 2, None, np.max))
    assert_same(vkml.max_pool2d(T(x), 3, 1), O.pool2d_loop(x, 3, 1, np.max))
    assert_same(vkml.avg_pool2d(T(x), 2, 1), O.pool2d_loop(x, 2, 1, np.mean), exact=False)


# -- every primitive is covered --------------------------------------------------------------------

COVERAGE = {
    "neg": test_unary, "exp": test_unary, "log": test_unary, "sin": test_unary,
    "cos": test_unary, "tanh": test_unary, "sqrt": test_unary, "abs": test_unary,
    "sign": test_unary, "stop_gradient": test_unary_methods_match_functions,
    "logical_not": test_logical_not,
    "add": test_binary_broadcasts_and_promotes_like_numpy,
    "sub": test_binary_broadcasts_and_promotes_like_numpy,
    "mul": test_binary_broadcasts_and_promotes_like_numpy,
    "div": test_binary_broadcasts_and_promotes_like_numpy,
    "pow": test_pow,
    "max": test_binary_broadcasts_and_promotes_like_numpy,
    "min": test_binary_broadcasts_and_promotes_like_numpy,
    "eq": test_comparisons_and_logic, "ne": test_comparisons_and_logic,
    "lt": test_comparisons_and_logic, "le": test_comparisons_and_logic,
    "gt": test_comparisons_and_logic, "ge": test_comparisons_and_logic,
    "logical_and": test_comparisons_and_logic, "logical_or": test_comparisons_and_logic,
    "where": test_where_broadcasts_promotes_and_reads_numbers_as_truth,
    "cast": test_cast_between_every_pair,
    "reduce_sum": test_sum, "reduce_max": test_max_min, "argmax": test_argmax_argmin,
    "reshape": test_reshape, "broadcast_in_dim": test_broadcast_in_dim_primitive,
    "transpose": test_transpose_permute_swapaxes, "slice": test_slice_primitive,
    "pad": test_pad_lo_hi_interior_and_crop, "concatenate": test_concatenate_and_stack_promote,
    "flip": test_flip, "gather": test_gather, "scatter_add": test_scatter_add_adds_duplicates,
    "matmul": test_matmul,
}


def test_every_primitive_has_a_forward_test():
    from vkml.ops import elementwise, linalg, movement, reductions
    ours = {p.name for m in (elementwise, reductions, movement, linalg)
            for p in vars(m).values() if isinstance(p, Primitive)}
    assert len(ours) == 41 and ours <= set(PRIMITIVES)
    assert set(COVERAGE) == ours, sorted(ours ^ set(COVERAGE))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_where_on_large_arrays_matches_numpy_bit_for_bit(dtype):
    """Large 4-byte operands take a branch-free bit blend on the NumPy backend: same bits as
    np.where, NaN and infinities included, also with a broadcast scalar operand."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((96, 128)) * 100).astype(dtype)
    if x.dtype.kind == "f":
        x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    y = (rng.standard_normal((96, 128)) * 100).astype(dtype)
    c = rng.random((96, 128)) > 0.5
    got = vkml.where(vkml.tensor(c), vkml.tensor(x), vkml.tensor(y)).numpy()
    want = np.where(c, x, y)
    assert got.dtype == want.dtype
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    got0 = vkml.where(vkml.tensor(c), vkml.tensor(x), 0).numpy()
    assert np.array_equal(got0.view(np.uint8), np.where(c, x, dtype(0)).view(np.uint8))
