"""The operations users and rules write with, built on the primitives.

These functions take IR Vars (or Python/NumPy numbers and arrays) and return
Vars.  They do what the primitives deliberately do not: NumPy dtype
promotion (Python scalars are weak, as in NumPy 2), NumPy broadcasting,
negative axes, ``keepdims``, and composites such as ``mean`` and ``softmax``.  ``vkml.Tensor`` methods and the JVP/transpose rules
both call these, so there is one definition of each operation.

Composed rather than primitive, and why:

- ``mean`` = sum / count; ``min`` = -max(-x); ``softmax``/``log_softmax`` from
  max, exp, sum, log: their derivatives then come for free.

Its lower half, how inputs become Vars (dtype promotion, broadcasting, constants), is
``operands.py``; convolution and pooling, composed the same way, are ``convolution.py``.
"""

from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from ..errors import ArgumentError, DTypeError, IndexOutOfRangeError, ShapeError
from ..ir import Var, dtype_name
from ..validate import (canonical_dtype, check_bool, check_dtype, check_int, check_sequence,
                        check_shape, describe)
from .core import bind
from .elementwise import (abs_p, add_p, cos_p, div_p, equal_p, exp_p, greater_equal_p, greater_p,
                          less_equal_p, less_p, log_p, logical_and_p, logical_not_p, logical_or_p,
                          maximum_p, minimum_p, mul_p, neg_p, not_equal_p, pow_p, sign_p, sin_p,
                          sqrt_p, stop_gradient_p, sub_p, tanh_p, where_p)
from .linalg import matmul_p, matmul_params
from .movement import (concatenate_p, flip_p, gather_p, pad_p, reshape_p, scatter_add_p, slice_p,
                       transpose_p)
from .reductions import argmax_p, reduce_max_p, reduce_sum_p
from . import complex_parts  # (its module imports this one: used inside functions only)
from .operands import (  # noqa: F401  (every name re-exported: rules and tensors find them here)
    SCALARS, as_floating, as_var, batch_all, bind_elementwise, broadcast_batch,
    broadcast_in_dim, broadcast_shapes, broadcast_to, cast, constant, default_device, promote,
    scalar_var)


_INT64_MAX = np.iinfo(np.int64).max


def batch_coordinate(idx):
    """Prepend each row's batch number to a batched index (B, ..., k) -> (B, ..., k + 1)."""
    b = constant(np.arange(idx.shape[0], dtype=idx.dtype))
    b = broadcast_in_dim(b, idx.shape[:-1] + (1,), (0,))
    return concatenate([b, idx], axis=-1)


def add(x, y):
    """``x + y`` elementwise, with NumPy's broadcasting and promotion.

    >>> vkml.add(vkml.tensor([1.0, 2.0]), 10.0)
    tensor([11., 12.], dtype=float64)
    """
    return bind_elementwise(add_p, x, y)


def sub(x, y):
    """``x - y`` elementwise, with NumPy's broadcasting and promotion.

    >>> vkml.sub(vkml.tensor([1.0, 2.0]), 0.5)
    tensor([0.5, 1.5], dtype=float64)
    """
    return bind_elementwise(sub_p, x, y)


def mul(x, y):
    """``x * y`` elementwise, with NumPy's broadcasting and promotion.

    >>> vkml.mul(vkml.tensor([1.0, 2.0]), vkml.tensor([3.0, 4.0]))
    tensor([3., 8.], dtype=float64)
    """
    return bind_elementwise(mul_p, x, y)


def div(x, y):
    """True division: integers divide as floats (NumPy's ``/``).

    >>> vkml.div(vkml.tensor([1.0, 3.0]), 2.0)
    tensor([0.5, 1.5], dtype=float64)
    """
    x, y = promote(x, y)
    if x.dtype.kind not in "fc":
        x, y = cast(x, np.float64), cast(y, np.float64)
    return bind_elementwise(div_p, x, y)


def floor_divide(x, y):
    """``x // y`` elementwise, rounded towards minus infinity as NumPy does (``x // 0`` is 0 for integers).

    >>> vkml.floor_divide(vkml.tensor([7, -7]), 2)
    tensor([ 3, -4], dtype=int64)
    """
    x, y = promote(x, y)
    if x.dtype.kind == "f":
        raise DTypeError("floor_divide: needs integer operands, got "
                         f"{dtype_name(x.dtype)}; cast them with .astype(np.int64) first")
    return bind_elementwise(div_p, x, y)


#: whole-number exponents (Python ints) a float power computes by multiplying: ``x ** 2`` is
#: ``x * x`` (as NumPy computes it), ``x ** 3`` is ``(x * x) * x`` and ``x ** 4`` is ``(x * x) *
#: (x * x)`` -- the same bits on every backend, and no call of libm's ``pow`` (a GELU's cube
#: spent more time in it than the rest of a transformer block's elementwise work)
MULTIPLIED_POWERS = (2, 3, 4)


def pow(x, y):
    """``x ** y`` elementwise.  A float tensor to the power of the Python int 2, 3 or 4 is
    computed by multiplying (``MULTIPLIED_POWERS``): the same bits on every backend, within an
    ulp or two of ``pow``.

    >>> vkml.pow(vkml.tensor([2.0, 3.0]), 2.0)
    tensor([4., 9.], dtype=float64)
    >>> vkml.tensor([1.5, -2.0]) ** 3
    tensor([ 3.375, -8.   ], dtype=float64)
    """
    if type(y) is int and y in MULTIPLIED_POWERS and getattr(x, "dtype", None) is not None and \
            np.dtype(x.dtype).kind == "f" and not isinstance(x, np.generic):
        x = as_var(x)
        square = mul(x, x)
        return square if y == 2 else mul(square, x) if y == 3 else mul(square, square)
    return bind_elementwise(pow_p, x, y)


def maximum(x, y):
    """The larger of ``x`` and ``y``, elementwise.

    >>> vkml.maximum(vkml.tensor([1.0, 5.0]), 3.0)
    tensor([3., 5.], dtype=float64)
    """
    return bind_elementwise(maximum_p, x, y)


def minimum(x, y):
    """The smaller of ``x`` and ``y``, elementwise.

    >>> vkml.minimum(vkml.tensor([1.0, 5.0]), 3.0)
    tensor([1., 3.], dtype=float64)
    """
    return bind_elementwise(minimum_p, x, y)


def equal(x, y):
    """``x == y`` elementwise, as a bool tensor.

    >>> vkml.equal(vkml.tensor([1, 2]), 2)
    tensor([False,  True], dtype=bool)
    """
    return bind_elementwise(equal_p, x, y)


def not_equal(x, y):
    """``x != y`` elementwise, as a bool tensor.

    >>> vkml.not_equal(vkml.tensor([1, 2]), 2)
    tensor([ True, False], dtype=bool)
    """
    return bind_elementwise(not_equal_p, x, y)


def less(x, y):
    """``x < y`` elementwise, as a bool tensor.

    >>> vkml.less(vkml.tensor([1, 2]), 2)
    tensor([ True, False], dtype=bool)
    """
    return bind_elementwise(less_p, x, y)


def less_equal(x, y):
    """``x <= y`` elementwise, as a bool tensor.

    >>> vkml.less_equal(vkml.tensor([1, 2]), 2)
    tensor([ True,  True], dtype=bool)
    """
    return bind_elementwise(less_equal_p, x, y)


def greater(x, y):
    """``x > y`` elementwise, as a bool tensor.

    >>> vkml.greater(vkml.tensor([1, 2]), 1)
    tensor([False,  True], dtype=bool)
    """
    return bind_elementwise(greater_p, x, y)


def greater_equal(x, y):
    """``x >= y`` elementwise, as a bool tensor.

    >>> vkml.greater_equal(vkml.tensor([1, 2]), 2)
    tensor([False,  True], dtype=bool)
    """
    return bind_elementwise(greater_equal_p, x, y)


def logical_and(x, y):
    """``x and y`` elementwise, on bool tensors.

    >>> vkml.logical_and(vkml.tensor([True, True]), vkml.tensor([True, False]))
    tensor([ True, False], dtype=bool)
    """
    return bind_elementwise(logical_and_p, cast(as_var(x), bool), cast(as_var(y), bool))


def logical_or(x, y):
    """``x or y`` elementwise, on bool tensors.

    >>> vkml.logical_or(vkml.tensor([True, False]), vkml.tensor([False, False]))
    tensor([ True, False], dtype=bool)
    """
    return bind_elementwise(logical_or_p, cast(as_var(x), bool), cast(as_var(y), bool))


def logical_not(x):
    """``not x`` elementwise, on a bool tensor.

    >>> vkml.logical_not(vkml.tensor([True, False]))
    tensor([False,  True], dtype=bool)
    """
    return bind(logical_not_p, cast(as_var(x), bool))


def neg(x):
    """``-x`` elementwise.

    >>> vkml.neg(vkml.tensor([1.0, -2.0]))
    tensor([-1.,  2.], dtype=float64)
    """
    return bind(neg_p, as_var(x))


def exp(x):
    """``e ** x`` elementwise; integers compute in float64.

    >>> vkml.exp(vkml.tensor([0.0, 1.0]))
    tensor([1.        , 2.71828183], dtype=float64)
    """
    return bind(exp_p, as_floating(x))


def log(x):
    """The natural logarithm, elementwise (``-inf`` at 0, NaN below).

    >>> vkml.log(vkml.tensor([1.0, np.e]))
    tensor([0., 1.], dtype=float64)
    """
    return bind(log_p, as_floating(x))


def sin(x):
    """The sine, elementwise (radians).

    >>> vkml.sin(vkml.tensor([0.0, np.pi / 2]))
    tensor([0., 1.], dtype=float64)
    """
    return bind(sin_p, as_floating(x))


def cos(x):
    """The cosine, elementwise (radians).

    >>> vkml.cos(vkml.tensor([0.0, np.pi]))
    tensor([ 1., -1.], dtype=float64)
    """
    return bind(cos_p, as_floating(x))


def tanh(x):
    """The hyperbolic tangent, elementwise.

    >>> vkml.tanh(vkml.tensor([0.0, 1.0]))
    tensor([0.        , 0.76159416], dtype=float64)
    """
    return bind(tanh_p, as_floating(x))


def sqrt(x):
    """The square root, elementwise (NaN below 0).

    >>> vkml.sqrt(vkml.tensor([4.0, 9.0]))
    tensor([2., 3.], dtype=float64)
    """
    return bind(sqrt_p, as_floating(x))


def abs(x):
    """``|x|`` elementwise; its derivative is ``sign(x)``.

    >>> vkml.abs(vkml.tensor([-1.5, 2.0]))
    tensor([1.5, 2. ], dtype=float64)
    """
    x = as_var(x)
    if x.dtype.kind == "c":           # the magnitude: a real result
        return complex_parts.complex_abs(x)
    return bind(abs_p, x)


def sign(x):
    """-1, 0 or 1 by the sign of each element.

    >>> vkml.sign(vkml.tensor([-3.0, 0.0, 2.0]))
    tensor([-1.,  0.,  1.], dtype=float64)
    """
    return bind(sign_p, as_var(x))


def stop_gradient(x):
    """The same values, seen as constants by every derivative (the gradient stops here).

    >>> x = vkml.tensor(3.0)
    >>> vkml.grad(lambda x: x * vkml.stop_gradient(x))(x)
    tensor(3., dtype=float64)
    """
    return bind(stop_gradient_p, as_var(x))


def where(cond, x, y):
    """``x`` where ``cond`` holds, else ``y``, elementwise (a choice per element, differentiable in ``x`` and ``y``).

    >>> vkml.where(vkml.tensor([True, False]), 1.0, -1.0)
    tensor([ 1., -1.], dtype=float64)
    """
    c = as_var(cond)
    if c.dtype.kind != "b":
        c = not_equal(c, 0)
    x, y = promote(x, y)
    shape = broadcast_shapes("where", c.shape, x.shape, y.shape)
    return bind(where_p, broadcast_to(c, shape), broadcast_to(x, shape), broadcast_to(y, shape))


def relu(x):
    """``max(x, 0)`` elementwise.

    >>> vkml.relu(vkml.tensor([-1.0, 2.0]))
    tensor([0., 2.], dtype=float64)
    """
    x = as_var(x)
    return where(greater(x, 0), x, zeros_like(x))


def sigmoid(x):
    """1 / (1 + e**-x), written with tanh so it never overflows.

    >>> vkml.sigmoid(vkml.tensor([0.0]))
    tensor([0.5], dtype=float64)
    """
    x = as_floating(x)
    return mul(0.5, add(tanh(mul(0.5, x)), 1.0))


def square(x):
    """``x * x`` elementwise.

    >>> vkml.square(vkml.tensor([3.0, -2.0]))
    tensor([9., 4.], dtype=float64)
    """
    x = as_var(x)
    return mul(x, x)


def clip(x, lo=None, hi=None):
    """Each element limited to ``[lo, hi]`` (either may be None).

    >>> vkml.clip(vkml.tensor([-2.0, 0.5, 3.0]), 0.0, 1.0)
    tensor([0. , 0.5, 1. ], dtype=float64)
    """
    x = as_var(x)
    if lo is not None:
        x = maximum(x, lo)
    if hi is not None:
        x = minimum(x, hi)
    return x


def full(shape, value, dtype=None, device=None):
    shape = check_shape(shape, "full")
    if isinstance(value, Var) or not isinstance(value, SCALARS):
        raise ArgumentError(f"full: the fill value must be a number, got {describe(value)}")
    dtype = check_dtype(dtype, "full") if dtype is not None else canonical_dtype(np.array(value).dtype)
    return broadcast_in_dim(scalar_var(value, dtype, device or default_device()), shape, ())


def zeros(shape, dtype=np.float32, device=None):
    return full(shape, 0, dtype, device)


def ones(shape, dtype=np.float32, device=None):
    return full(shape, 1, dtype, device)


def zeros_like(x):
    return full(x.shape, 0, x.dtype, x.device)


def ones_like(x):
    return full(x.shape, 1, x.dtype, x.device)


def normalize_axes(op, ndim, axis):
    """``axis`` (None for all, an int, or a sequence of distinct ints; negative ones count from
    the end) as a sorted tuple of indices in [0, ndim)."""
    if axis is None:
        return tuple(range(ndim))
    axes = _axis_items(axis, op)
    out = []
    for a in axes:
        a = check_int(a, "axis", op)
        if not -ndim <= a < ndim:
            fix = f"use an axis in [{-ndim}, {ndim})" if ndim else "a 0-d operand has no axes"
            raise ShapeError(f"{op}: axis {a} is out of range for {ndim} dimensions; {fix}")
        out.append(a % builtins.max(ndim, 1))
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {tuple(axes)}; name each axis once")
    return tuple(sorted(out))


def _axis_items(axis, op) -> list:
    """What ``axis`` names, as a list: itself for an int, its items for a sequence of them."""
    if hasattr(axis, "__index__") and not (isinstance(axis, np.ndarray) and axis.ndim):
        return [axis]
    try:
        return check_sequence(axis, "axis", op)
    except ArgumentError:
        raise ArgumentError(f"{op}: axis must be an int or a tuple of ints, got {describe(axis)}") \
            from None


def normalize_axis(op, ndim, axis):
    """One axis, an int counting from the end when negative, as an index in [0, ndim)."""
    axis = check_int(axis, "axis", op)
    return normalize_axes(op, ndim, axis)[0]


def _keep(x, reduced, axes, keepdims):
    if not keepdims:
        return reduced
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return reshape(reduced, shape)


def reduce_sum(x, axes):
    """Sum over ``axes`` (already normalized): the primitive, skipped when there is nothing to sum."""
    axes = tuple(axes)
    if not axes:
        return x
    return bind(reduce_sum_p, x, axes=axes)


def sum(x, axis=None, keepdims=False, dtype=None):
    """NumPy's sum: bool and signed integers narrower than 64 bits sum as int64, unsigned
    ones as uint64.

    >>> x = vkml.tensor([[1, 2], [3, 4]])
    >>> vkml.sum(x)
    tensor(10, dtype=int64)
    >>> vkml.sum(x, axis=0)
    tensor([4, 6], dtype=int64)
    """
    x = accumulator(as_var(x)) if dtype is None else cast(x, dtype)      # dtype: summed in it
    keepdims = check_bool(keepdims, "keepdims", "sum")
    axes = normalize_axes("sum", x.ndim, axis)
    return _keep(x, reduce_sum(x, axes), axes, keepdims)


def accumulator(x):
    """``x`` in the dtype NumPy's sum and prod accumulate it in: bool and signed integers
    narrower than 64 bits in int64, unsigned ones in uint64; the rest as they are."""
    k = x.dtype.kind
    if k == "b" or (k == "i" and x.dtype.itemsize < 8):
        return cast(x, np.int64)
    if k == "u" and x.dtype.itemsize < 8:
        return cast(x, np.uint64)
    return x


def mean(x, axis=None, keepdims=False):
    """The mean over ``axis`` (all axes when None); integers give float64.

    >>> vkml.mean(vkml.tensor([[1.0, 2.0], [3.0, 5.0]]), axis=1)
    tensor([1.5, 4. ], dtype=float64)
    """
    x = as_floating(x)
    keepdims = check_bool(keepdims, "keepdims", "mean")
    axes = normalize_axes("mean", x.ndim, axis)
    count = math.prod(x.shape[a] for a in axes)
    if count == 0:
        raise ShapeError(f"mean: no elements to average over axis {axis} of shape {x.shape}")
    return _keep(x, div(reduce_sum(x, axes), float(count)), axes, keepdims)


def max(x, axis=None, keepdims=False):
    """The largest element over ``axis`` (all axes when None).

    >>> vkml.max(vkml.tensor([[1.0, 7.0], [3.0, 5.0]]), axis=0)
    tensor([3., 7.], dtype=float64)
    """
    x = as_var(x)
    keepdims = check_bool(keepdims, "keepdims", "max")
    if x.dtype.kind == "b":     # NumPy's max of bools is any()
        return cast(max(cast(x, np.int32), axis, keepdims), bool)
    axes = normalize_axes("max", x.ndim, axis)
    if any(x.shape[a] == 0 for a in axes):
        raise ShapeError(f"max: cannot take the maximum over an empty axis of shape {x.shape}: "
                         "there is no element to pick; check the input's size first, or use "
                         "vnp.nanmax/where with an initial value you choose")
    out = bind(reduce_max_p, x, axes=axes) if axes else x
    return _keep(x, out, axes, keepdims)


def _order_reversed(x):
    """An order-reversing map: -x for floats, -1 - x for signed integers (-x overflows at the
    minimum), max - x for unsigned ones."""
    if x.dtype.kind == "f":
        return neg(x)
    if x.dtype.kind == "u":
        return sub(int(np.iinfo(x.dtype).max), x)
    return sub(-1, x)


def min(x, axis=None, keepdims=False):
    """The smallest element over ``axis`` (all axes when None).

    >>> vkml.min(vkml.tensor([[1.0, 7.0], [3.0, 5.0]]), axis=0)
    tensor([1., 5.], dtype=float64)
    """
    x = as_var(x)
    if x.dtype.kind == "b":
        return cast(min(cast(x, np.int32), axis, keepdims), bool)
    return _order_reversed(max(_order_reversed(x), axis, keepdims))


def argmax(x, axis=None):
    """The index of the largest element along ``axis`` (of the flattened tensor when None).

    >>> vkml.argmax(vkml.tensor([1.0, 7.0, 3.0]))
    tensor(1, dtype=int64)
    """
    x = as_var(x)
    if x.dtype.kind == "b":
        x = cast(x, np.int32)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    axis = normalize_axis("argmax", x.ndim, axis)
    if x.shape[axis] == 0:
        raise ShapeError(f"argmax: of an empty axis (shape {x.shape}): there is no element to "
                         "point at; check the input's size first")
    return bind(argmax_p, x, axis=axis)


def argmin(x, axis=None):
    """The index of the smallest element along ``axis`` (of the flattened tensor when None).

    >>> vkml.argmin(vkml.tensor([1.0, 7.0, 0.5]))
    tensor(2, dtype=int64)
    """
    x = as_var(x)
    return argmax(_order_reversed(cast(x, np.int32) if x.dtype.kind == "b" else x), axis)


def logsumexp(x, axis=-1, keepdims=False):
    """``log(sum(exp(x)))`` over ``axis``, computed stably (the max is subtracted first).

    >>> vkml.logsumexp(vkml.tensor([0.0, 0.0]))
    tensor(0.69314718, dtype=float64)
    """
    x = as_floating(x)
    keepdims = check_bool(keepdims, "keepdims", "logsumexp")
    axes = normalize_axes("logsumexp", x.ndim, axis)
    m = max(x, axes, keepdims=True)
    m = stop_gradient(where(less(abs(m), np.inf), m, zeros_like(m)))   # rows of +-inf: shift by 0
    out = add(log(sum(exp(sub(x, m)), axes, keepdims=True)), m)
    return out if keepdims else reshape(out, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def log_softmax(x, axis=-1):
    """``x - logsumexp(x)`` along ``axis`` (default the last).

    >>> vkml.log_softmax(vkml.tensor([0.0, 0.0]))
    tensor([-0.69314718, -0.69314718], dtype=float64)
    """
    x = as_floating(x)
    return sub(x, logsumexp(x, axis, keepdims=True))


def softmax(x, axis=-1):
    """``exp(x) / sum(exp(x))`` along ``axis`` (default the last), computed stably.

    >>> vkml.softmax(vkml.tensor([0.0, np.log(3.0)]))
    tensor([0.25, 0.75], dtype=float64)
    """
    return exp(log_softmax(x, axis))


def reshape(x, shape):
    """The same elements in a new shape (one size may be -1).

    >>> vkml.reshape(vkml.arange(6), (2, 3))
    tensor([[0, 1, 2],
            [3, 4, 5]], dtype=int64)
    """
    x = as_var(x)
    shape = list(check_shape(shape, "reshape", wildcard=True))
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: at most one -1 in {tuple(shape)}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or x.size % known:
            raise ShapeError(f"reshape: cannot reshape {x.shape} into {tuple(shape)}")
        shape[shape.index(-1)] = x.size // known
    shape = tuple(shape)
    if shape == x.shape:
        return x
    return bind(reshape_p, x, shape=shape)


def transpose(x, perm=None):
    """The axes reordered by ``axes`` (reversed when none are given); ``permute`` is the same.

    >>> vkml.transpose(vkml.zeros((2, 3, 4))).shape
    (4, 3, 2)
    >>> vkml.transpose(vkml.zeros((2, 3, 4)), (1, 0, 2)).shape
    (3, 2, 4)
    """
    x = as_var(x)
    perm = tuple(reversed(range(x.ndim))) if perm is None else \
        tuple(normalize_axis("transpose", x.ndim, p) for p in check_sequence(perm, "axes", "transpose"))
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose: axes {perm} are not a permutation of the {x.ndim} axes of "
                         f"shape {x.shape}; name each axis once")
    if perm == tuple(range(x.ndim)):
        return x
    return bind(transpose_p, x, perm=perm)


def swapaxes(x, a, b):
    """Axes ``a`` and ``b`` exchanged.

    >>> vkml.swapaxes(vkml.zeros((2, 3)), 0, 1).shape
    (3, 2)
    """
    x = as_var(x)
    perm = list(range(x.ndim))
    a, b = normalize_axis("swapaxes", x.ndim, a), normalize_axis("swapaxes", x.ndim, b)
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def expand_dims(x, axis):
    """New axes of size 1 at ``axis`` (an int or, as in NumPy, a tuple of them) of the result.

    >>> vkml.expand_dims(vkml.tensor([1.0, 2.0]), 0).shape
    (1, 2)
    """
    x = as_var(x)
    items = _axis_items(axis, "expand_dims")
    count = len(items)
    axes = normalize_axes("expand_dims", x.ndim + count, items)
    sizes = iter(x.shape)
    return reshape(x, tuple(1 if i in axes else next(sizes) for i in range(x.ndim + count)))


def squeeze(x, axis=None):
    """Axes of size 1 removed (all of them, or those named by ``axis``).

    >>> vkml.squeeze(vkml.zeros((1, 3, 1))).shape
    (3,)
    """
    x = as_var(x)
    axes = normalize_axes("squeeze", x.ndim, axis) if axis is not None else \
        tuple(i for i, d in enumerate(x.shape) if d == 1)
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"squeeze: axis {a} of shape {x.shape} has size {x.shape[a]}, not 1")
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def flatten(x, start_dim=0, end_dim=-1):
    """Axes ``start_dim..end_dim`` merged into one (all of them by default).

    >>> vkml.flatten(vkml.zeros((2, 3, 4)), start_dim=1).shape
    (2, 12)
    """
    x = as_var(x)
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = (normalize_axis("flatten", x.ndim, d) for d in (start_dim, end_dim))
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def slice(x, starts, limits, strides=None):
    x = as_var(x)
    strides = tuple(strides) if strides is not None else (1,) * x.ndim
    starts, limits = tuple(starts), tuple(limits)
    if starts == (0,) * x.ndim and limits == x.shape and strides == (1,) * x.ndim:
        return x
    return bind(slice_p, x, starts=starts, limits=limits, strides=strides)


def pad(x, lo, hi, interior=None):
    """Zero padding; negative ``lo``/``hi`` crop, as in lax.pad.

    >>> vkml.pad(vkml.tensor([1.0, 2.0]), [1], [2])
    tensor([0., 1., 2., 0., 0.], dtype=float64)
    >>> vkml.pad(vkml.tensor([1.0, 2.0, 3.0]), [-1], [0])
    tensor([2., 3.], dtype=float64)
    """
    x = as_var(x)
    lo, hi = _pad_widths(lo, "lo", x), _pad_widths(hi, "hi", x)
    interior = _pad_widths(interior, "interior", x, low=0) if interior is not None else (0,) * x.ndim
    padded = tuple(a + n + builtins.max(0, n - 1) * i + b
                   for n, a, b, i in zip(x.shape, lo, hi, interior))
    if builtins.min(padded, default=0) < 0:
        raise ShapeError(f"pad: lo={lo} hi={hi} crop more than the whole of an axis of "
                         f"shape {x.shape}; crop at most the padded length")
    check_shape(padded, "pad", "padded shape")
    if builtins.min(lo + hi, default=0) < 0:
        x = pad(x, tuple(builtins.max(a, 0) for a in lo), tuple(builtins.max(b, 0) for b in hi),
                interior)
        starts = tuple(-a if a < 0 else 0 for a in lo)
        limits = tuple(d + b if b < 0 else d for d, b in zip(x.shape, hi))
        return slice(x, starts, limits)
    if not any(lo) and not any(hi) and not any(interior):
        return x
    return bind(pad_p, x, lo=lo, hi=hi, interior=interior)


#: The widest padding (or window, or stride) taken on one side of an axis: wider would not fit.
MAX_PAD = 2 ** 40


def _pad_widths(widths, name, x, low=None):
    """One int per axis of ``x`` (``low`` and up), for ``pad``'s ``lo``, ``hi`` and ``interior``."""
    out = tuple(check_int(w, name, "pad", low=low, high=MAX_PAD, error=ShapeError)
                for w in check_sequence(widths, name, "pad"))
    if len(out) != x.ndim:
        raise ShapeError(f"pad: {name} has {len(out)} entries but the operand has {x.ndim} axes "
                         f"(shape {x.shape}); give one per axis")
    return out


def concatenate(xs, axis=0):
    """The tensors joined along an existing ``axis``.

    >>> vkml.concatenate([vkml.tensor([1.0]), vkml.tensor([2.0, 3.0])], axis=0)
    tensor([1., 2., 3.], dtype=float64)
    """
    xs = check_sequence(xs, "xs", "concatenate")
    if not xs:
        raise ArgumentError("concatenate: needs at least one operand")
    xs = promote(*xs)
    axis = normalize_axis("concatenate", xs[0].ndim, axis)
    if len(xs) == 1:
        return xs[0]
    return bind(concatenate_p, *xs, axis=axis)


def stack(xs, axis=0):
    """The tensors (of one shape) joined along a new ``axis``.

    >>> vkml.stack([vkml.tensor([1.0, 2.0]), vkml.tensor([3.0, 4.0])])
    tensor([[1., 2.],
            [3., 4.]], dtype=float64)
    """
    xs = [as_var(x) for x in check_sequence(xs, "xs", "stack")]
    if not xs:
        raise ArgumentError("stack: needs at least one operand")
    shapes = {x.shape for x in xs}
    if len(shapes) > 1:
        raise ShapeError(f"stack: all operands must have one shape, got {sorted(shapes)}")
    axis = normalize_axis("stack", xs[0].ndim + 1, axis)
    return concatenate([expand_dims(x, axis) for x in xs], axis)


def flip(x, axes=None):
    """The order of the elements reversed along ``axis``.

    >>> vkml.flip(vkml.tensor([1.0, 2.0, 3.0]), 0)
    tensor([3., 2., 1.], dtype=float64)
    """
    x = as_var(x)
    axes = normalize_axes("flip", x.ndim, axes)
    if not axes:
        return x
    return bind(flip_p, x, axes=axes)


def gather(x, idx):
    """``x[idx[..., 0], idx[..., 1], ...]``: the gather primitive (tf.gather_nd).

    >>> x = vkml.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> vkml.gather(x, vkml.tensor([[1, 0], [0, 1]]))
    tensor([3., 2.], dtype=float64)
    >>> vkml.gather(x, vkml.tensor([[1], [0]]))
    tensor([[3., 4.],
            [1., 2.]], dtype=float64)
    """
    return bind(gather_p, as_var(x), as_var(idx))


def scatter_add(base, idx, upd):
    """A copy of ``base`` with ``upd`` added at ``base[idx[..., 0], ...]`` (repeated indices add up): the transpose of :func:`gather`.

    >>> vkml.scatter_add(vkml.zeros(3, dtype='float64'), vkml.tensor([[0], [2], [0]]), vkml.tensor([1.0, 2.0, 3.0]))
    tensor([4., 0., 2.], dtype=float64)
    """
    return bind(scatter_add_p, as_var(base), as_var(idx), as_var(upd))


def take(x, indices, axis=0):
    """NumPy's take: pick along ``axis`` (negative indices count from the end).

    >>> vkml.take(vkml.tensor([10.0, 20.0, 30.0]), vkml.tensor([2, 0]))
    tensor([30., 10.], dtype=float64)
    """
    x, idx = as_var(x), as_var(indices)
    if idx.dtype.kind not in "iu":
        raise DTypeError(f"take: indices must be integers, got {dtype_name(idx.dtype)}")
    axis = normalize_axis("take", x.ndim, axis)
    _check_constant_indices("take", indices, x.shape[axis], axis)
    idx = _wrap_negative(idx, x.shape[axis])
    moved = transpose(x, (axis,) + tuple(i for i in range(x.ndim) if i != axis))
    picked = gather(moved, reshape(idx, idx.shape + (1,)))
    # picked: idx.shape + rest; move the index dims back to where axis was.
    k = idx.ndim
    rest = x.ndim - 1
    perm = tuple(range(k, k + axis)) + tuple(range(k)) + tuple(range(k + axis, k + rest))
    return transpose(picked, perm)


def take_along_axis(x, indices, axis):
    """NumPy's take_along_axis: ``out[i, j] = x[i, idx[i, j]]`` for axis 1 of a matrix, etc.

    >>> x = vkml.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> vkml.take_along_axis(x, vkml.tensor([[1], [0]]), axis=1)
    tensor([[2.],
            [3.]], dtype=float64)
    """
    x, idx = as_var(x), as_var(indices)
    if idx.dtype.kind not in "iu":
        raise DTypeError(f"take_along_axis: indices must be integers, got {dtype_name(idx.dtype)}; "
                         "cast them with .astype(np.int64) (argsort and argmax give integers)")
    axis = normalize_axis("take_along_axis", x.ndim, axis)
    if idx.ndim != x.ndim:
        raise ShapeError(f"take_along_axis: indices need {x.ndim} dimensions, got {idx.shape}")
    _check_constant_indices("take_along_axis", indices, x.shape[axis], axis)
    idx = _wrap_negative(idx, x.shape[axis])
    shape = broadcast_shapes("take_along_axis",
                             tuple(d for i, d in enumerate(x.shape) if i != axis),
                             tuple(d for i, d in enumerate(idx.shape) if i != axis))
    out_shape = shape[:axis] + (idx.shape[axis],) + shape[axis:]
    idx = broadcast_to(idx, out_shape)
    cols = []
    for i in range(x.ndim):
        if i == axis:
            cols.append(cast(idx, np.int64))
        else:
            ar = constant(np.arange(out_shape[i], dtype=np.int64))
            cols.append(broadcast_in_dim(ar, out_shape, (i,)))
    coords = stack(cols, axis=-1)
    xb = broadcast_to(x, tuple(out_shape[i] if i != axis else x.shape[axis] for i in range(x.ndim)))
    return gather(xb, coords)


def _wrap_negative(idx, n):
    if isinstance(idx, Var) and idx.value is not None:
        known = np.asarray(idx.value)
        if known.size and known.min() >= 0:
            return idx
    return where(less(idx, 0), add(idx, n), idx)


def _check_constant_indices(op, indices, n, axis):
    """Refuse a list/array index past an axis at once, naming the user's axis (as ``getitem``
    does); a tensor index is data, checked by gather when the program runs."""
    if isinstance(indices, Var):
        return
    arr = np.asarray(indices)
    if arr.size and arr.dtype.kind in "iu" and (arr.min() < -n or arr.max() >= n):
        bad = int(arr.max() if arr.max() >= n else arr.min())
        raise IndexOutOfRangeError(f"{op}: index {bad} is out of range for axis {axis} of size "
                                   f"{n}; use indices in [{-n}, {n})")


def getitem(x, index):
    """NumPy indexing: ints, slices, None, Ellipsis, and integer/bool arrays."""
    x = as_var(x)
    if not isinstance(index, tuple):
        index = (index,)
    index = tuple(_list_index(i) if isinstance(i, list) else i for i in index)
    n_real = builtins.sum(_axes_taken(i) for i in index)
    if builtins.sum(1 for i in index if i is Ellipsis) > 1:
        raise ShapeError("index: at most one Ellipsis (...)")
    expanded = []
    for i in index:
        if i is Ellipsis:
            expanded.extend([builtins.slice(None)] * (x.ndim - n_real))
        else:
            expanded.append(i)
    if n_real > x.ndim:
        raise ShapeError(f"index: too many indices ({n_real}) for shape {x.shape}")
    if not builtins.any(i is Ellipsis for i in index):
        expanded.extend([builtins.slice(None)] * (x.ndim - n_real))
    expanded = _masks_as_arrays(x.shape, expanded)

    # 1. basic indexing: slices (positive strides), then flips, then int picks, None inserts
    starts, limits, strides, flips = [], [], [], []
    out_shape, advanced = [], []   # advanced: (output position, index Var)
    axis = 0
    for item in expanded:
        if item is None:
            out_shape.append(("new", None))
            continue
        d = x.shape[axis]
        if isinstance(item, builtins.slice):
            if item.step == 0:
                raise ShapeError(f"index: a slice step cannot be zero (axis {axis}); use 1 or -1")
            s, l, st = item.indices(d)
            if st > 0:
                starts.append(s), limits.append(builtins.max(s, l)), strides.append(st)
            else:
                # walk backwards: take the same elements forwards, then flip
                n = len(range(s, l, st))
                first = s + (n - 1) * st if n else 0
                starts.append(first), limits.append(first + (n - 1) * (-st) + 1 if n else 0)
                strides.append(-st)
                flips.append(axis)
            out_shape.append(("keep", axis))
        elif isinstance(item, (numbers.Integral, np.integer)) and not isinstance(item, (bool, np.bool_)):
            i = int(item)
            if not -d <= i < d:
                raise IndexOutOfRangeError(f"index: {i} is out of range for axis {axis} of size "
                                           f"{d}; use an index in [{-d}, {d})")
            i %= d
            starts.append(i), limits.append(i + 1), strides.append(1)
            out_shape.append(("drop", axis))
        else:
            arr = item
            if not isinstance(arr, Var):
                arr = np.asarray(arr)
                if arr.dtype.kind not in "iu":
                    raise ArgumentError(f"index: cannot index with {type(item).__name__} "
                                        "(use ints, slices, None, ... or integer arrays)")
                if arr.size and (arr.max() >= d or arr.min() < -d):
                    bad = int(arr.max() if arr.max() >= d else arr.min())
                    raise IndexOutOfRangeError(f"index: {bad} is out of range for axis {axis} of "
                                               f"size {d}; use indices in [{-d}, {d})")
                arr = constant(np.where(arr < 0, arr + d, arr).astype(np.int64))
            elif arr.dtype.kind == "b":
                raise DTypeError("index: a bool tensor picks a number of elements known only once "
                                 "it runs; index with a NumPy mask (mask.numpy()) or use vkml.where")
            elif arr.dtype.kind not in "iu":
                raise DTypeError(f"index: tensor indices must be integers, got {dtype_name(arr.dtype)}")
            starts.append(0), limits.append(d), strides.append(1)
            advanced.append((axis, arr))
            out_shape.append(("adv", axis))
        axis += 1
    y = slice(x, starts, limits, strides)
    if flips:
        y = flip(y, flips)
    # drop int-indexed axes
    kept_axes = [a for kind, a in out_shape if kind in ("keep", "adv")]
    y = reshape(y, tuple(y.shape[a] for a in kept_axes))
    if advanced:
        if any(kind == "new" for kind, _ in out_shape):
            raise ArgumentError("index: None together with array indices is not supported; "
                                "index with the arrays first, then add the axis with None")
        return _advanced(y, out_shape, advanced)
    # insert new axes
    shape = []
    for kind, a in out_shape:
        if kind == "new":
            shape.append(1)
        elif kind == "keep":
            shape.append(y.shape[kept_axes.index(a)])
    return reshape(y, tuple(shape))


def _list_index(item):
    """A list used as an index, as the NumPy array it stands for (refused if it is not one)."""
    try:
        return np.asarray(item)
    except (TypeError, ValueError) as err:
        raise ArgumentError(f"index: {describe(item)} is not an array of indices ({err}); "
                            "index with ints, slices, None, ... or integer arrays") from None


def _axes_taken(item):
    """How many axes of the operand an index item consumes (an N-d bool mask takes N)."""
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, (np.ndarray, list)):
        arr = np.asarray(item)
        if arr.dtype.kind == "b":
            return arr.ndim
    return 1


def _masks_as_arrays(shape, items):
    """Replace each NumPy bool mask by the integer arrays of its True positions (as NumPy does)."""
    out, axis = [], 0
    for item in items:
        if isinstance(item, (np.ndarray, list)) and np.asarray(item).dtype.kind == "b":
            mask = np.asarray(item)
            if mask.ndim == 0:
                raise ArgumentError("index: a 0-d bool index is not supported; use None to add "
                                    "an axis")
            if mask.shape != shape[axis:axis + mask.ndim]:
                raise ShapeError(f"index: a bool mask of shape {mask.shape} does not match the "
                                 f"axes {axis}..{axis + mask.ndim - 1} of shape {shape} it indexes")
            out.extend(np.nonzero(mask))
        else:
            out.append(item)
        axis += _axes_taken(item)
    return out


def _advanced(y, out_shape, advanced):
    """Gather for the integer-array part of an index, with NumPy's placement of the result dims.

    As in NumPy, an int next to the arrays counts as one of them: the picked dims go where the
    first of them was when they are all adjacent, and first otherwise (x[0, :, [1, 2]] is (2, n)).
    """
    kept = [(kind, a) for kind, a in out_shape if kind in ("keep", "adv")]
    adv_pos = [i for i, (kind, _) in enumerate(kept) if kind == "adv"]
    idxs = [_wrap_negative(v, y.shape[p]) for p, (_, v) in zip(adv_pos, advanced)]
    bshape = broadcast_shapes("index", *[v.shape for v in idxs])
    idxs = [broadcast_to(cast(v, np.int64), bshape) for v in idxs]
    others = [i for i in range(y.ndim) if i not in adv_pos]
    moved = transpose(y, tuple(adv_pos) + tuple(others))
    picked = gather(moved, stack(idxs, axis=-1))        # bshape + other dims
    kinds = [kind for kind, _ in out_shape]
    picks = [i for i, kind in enumerate(kinds) if kind != "keep"]
    k = kinds[:picks[0]].count("keep") if picks == list(range(picks[0], picks[-1] + 1)) else 0
    nb = len(bshape)
    if k:
        perm = tuple(range(nb, nb + k)) + tuple(range(nb)) + tuple(range(nb + k, picked.ndim))
        picked = transpose(picked, perm)
    return picked


def matmul(a, b, *, deterministic=None):
    """NumPy's ``a @ b``: 1-D operands, batch broadcasting, dtype promotion.

    ``deterministic=True``: each output is the canonical tree over the contraction index, the
    same bits on every backend (not BLAS); None follows ``vkml.deterministic_matmul``.

    >>> vkml.matmul(vkml.tensor([[1.0, 2.0]]), vkml.tensor([[3.0], [4.0]]))
    tensor([[11.]], dtype=float64)
    """
    params = matmul_params(deterministic)
    a, b = promote(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul: operands must have at least one dimension; use * for scalars")
    a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ShapeError(f"matmul: cannot multiply {a.shape} by {b.shape}; "
                         f"inner dimensions {a2.shape[-1]} and {b2.shape[-2]} differ (the last "
                         "axis of the first must equal the second-to-last of the second): "
                         "transpose an operand (x.T, x.mT) or check the layer sizes")
    batch = broadcast_shapes("matmul", a2.shape[:-2], b2.shape[:-2])
    if b2.ndim == 2 and a2.ndim > 2 and 0 not in a2.shape:
        # a stack of rows times one matrix (a Linear layer on a batch of sequences, a convolution's
        # columns times its weight): one product of all the rows, not one per batch entry over
        # copies of the matrix -- and its gradient one product over every row, not a sum of
        # per-entry products (each output's own sum over k is the same either way)
        rows = reshape(a2, (-1, a2.shape[-1]))
        out = reshape(bind(matmul_p, rows, b2, **params), batch + (a2.shape[-2], b2.shape[-1]))
        return reshape(out, out.shape[:-1]) if b.ndim == 1 else out
    a2 = broadcast_to(a2, batch + a2.shape[-2:])
    b2 = broadcast_to(b2, batch + b2.shape[-2:])
    out = bind(matmul_p, a2, b2, **params)
    if a.ndim == 1:
        out = reshape(out, out.shape[:-2] + out.shape[-1:])
    if b.ndim == 1:
        out = reshape(out, out.shape[:-1])
    return out


def dot(a, b):
    return matmul(a, b)
