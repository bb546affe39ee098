"""Reductions: sum (linear), max, argmax.  ``mean`` and ``min`` are built on these in ``api``.

``reduce_sum`` adds in one fixed order on every backend: the canonical tree over the reduced
elements in row-major order of the reduced axes (``treesum``), so a sum has the same bits on
NumPy, in compiled C and on the GPU, on every call and in every thread.  ``reduce_max`` and
``argmax`` need no order (a maximum is exact).  Derivatives add in the same fixed orders: the
transpose of a broadcast is ``reduce_sum`` (the tree), and the transpose of a gather is
``scatter_add``, which adds duplicate indices one by one in index order on every backend (as
``cumsum`` adds along its axis).
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir import dtype_name
from . import api as F  # api imports this module too: F is used only inside the rules
from .core import Primitive, bind
from .treesum import tree_reduce


def _check_axes(name, x, axes):
    for a in axes:
        if not 0 <= a < x.ndim:
            raise ShapeError(f"{name}: axis {a} is out of range for an operand of shape {x.shape}")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{name}: repeated axis in {axes}")


def _reduced_shape(shape, axes):
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _kept_dims(ndim, axes):
    return tuple(i for i in range(ndim) if i not in axes)


def _reduce_rule(name):
    def rule(x, *, axes):
        _check_axes(name, x, axes)
        if x.dtype.kind == "b":
            raise DTypeError(f"{name}: needs a numeric operand, got bool; cast it first")
        return [(_reduced_shape(x.shape, axes), x.dtype)]
    return rule


reduce_sum_p = Primitive("reduce_sum", doc="Sum over ``axes`` in the canonical tree order; linear. Its "
                         "transpose is a broadcast.")
reduce_sum_p.abstract = _reduce_rule("reduce_sum")
reduce_sum_p.impl = lambda x, *, axes: tree_reduce(x, axes)
reduce_sum_p.jvp = lambda p, t, o, *, axes: [F.reduce_sum(t[0], axes)]
reduce_sum_p.transpose = lambda ct, x, *, axes: [
    F.broadcast_in_dim(ct[0], x.shape, _kept_dims(len(x.shape), axes))]


def _reduce_max_jvp(p, t, o, *, axes):
    """The tangent at the maximum, shared equally among ties (as autograd does)."""
    x, out = p[0], o[0]
    back = F.broadcast_in_dim(out, x.shape, _kept_dims(x.ndim, axes))
    mask = F.cast(F.equal(x, back), x.dtype)
    return [F.div(F.reduce_sum(F.mul(t[0], mask), axes), F.reduce_sum(mask, axes))]


def _reduce_max_impl(x, *, axes):
    if any(x.shape[a] == 0 for a in axes):
        raise ValueError("reduce_max over an empty axis has no value")
    return np.max(x, axis=axes)


reduce_max_p = Primitive("reduce_max", doc="Maximum over ``axes``.")
reduce_max_p.abstract = _reduce_rule("reduce_max")
reduce_max_p.impl = _reduce_max_impl
reduce_max_p.jvp = _reduce_max_jvp


def _argmax_rule(x, *, axis):
    _check_axes("argmax", x, (axis,))
    if x.dtype.kind == "b":
        raise DTypeError(f"argmax: needs a numeric operand, got {dtype_name(x.dtype)}")
    return [(_reduced_shape(x.shape, (axis,)), np.dtype(np.int64))]


argmax_p = Primitive("argmax", doc="Index of the first maximum along ``axis`` (int64); no derivative.")
argmax_p.abstract = _argmax_rule
argmax_p.impl = lambda x, *, axis: np.argmax(x, axis=axis).astype(np.int64, copy=False)
argmax_p.jvp = lambda p, t, o, *, axis: [None]


def _shift(axes):
    return tuple(a + 1 for a in axes)


reduce_sum_p.batch = lambda v, d, n, *, axes: ([bind(reduce_sum_p, v[0], axes=_shift(axes))], [0])
reduce_max_p.batch = lambda v, d, n, *, axes: ([bind(reduce_max_p, v[0], axes=_shift(axes))], [0])
argmax_p.batch = lambda v, d, n, *, axis: ([bind(argmax_p, v[0], axis=axis + 1)], [0])
