"""Order along an axis: ``argsort`` and ``cumsum``, the two primitives ``sort`` and the scans need.

- ``argsort`` cannot be composed: no other primitive compares elements with
  each other.  Its result is integer, so it has no derivative of its own;
  ``sort(x)`` is ``take_along_axis(x, argsort(x))``, whose derivative is the
  gather's (the cotangent scattered back to where each element came from).
  It is stable (equal elements keep their order) and puts NaN last, as
  NumPy's ``kind="stable"`` does.
- ``cumsum`` could be composed (a matrix product with a triangular mask, or
  log2(n) shifted adds), but the first costs O(n^2) and the second adds in
  another order than NumPy; as a primitive it is one pass in NumPy's order
  (the same bits on every tier) and, being linear, its transpose is the
  cumulative sum run from the other end.  ``cumprod`` is composed (see
  ``vkml.ops.numeric``).
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir import dtype_name
from . import api as F
from .core import Primitive, bind


def _check_axis(name, x, axis):
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"{name}: axis {axis} is out of range for an operand of shape {x.shape}")


def _argsort_rule(x, *, axis):
    _check_axis("argsort", x, axis)
    return [(x.shape, np.dtype(np.int64))]


argsort_p = Primitive("argsort", doc="Stable ascending order along ``axis`` (NaN last) as int64 "
                                     "indices; no derivative (see the module docstring).")
argsort_p.abstract = _argsort_rule
argsort_p.impl = lambda x, *, axis: np.argsort(x, axis=axis, kind="stable").astype(np.int64)
argsort_p.jvp = lambda p, t, o, *, axis: [None]
argsort_p.batch = lambda v, d, n, *, axis: ([bind(argsort_p, v[0], axis=axis + 1)], [0])


def _cumsum_rule(x, *, axis, reverse):
    _check_axis("cumsum", x, axis)
    if x.dtype.kind == "b":
        raise DTypeError(f"cumsum: needs a numeric operand, got {dtype_name(x.dtype)}; cast it first")
    return [(x.shape, x.dtype)]


def _cumsum_impl(x, *, axis, reverse):
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis=axis, dtype=x.dtype), axis)
    return np.cumsum(x, axis=axis, dtype=x.dtype)


cumsum_p = Primitive("cumsum", doc="Running sum along ``axis`` (from the end when ``reverse``); "
                                   "linear, its transpose is the running sum the other way.")
cumsum_p.abstract = _cumsum_rule
cumsum_p.impl = _cumsum_impl
cumsum_p.jvp = lambda p, t, o, *, axis, reverse: [cumsum(t[0], axis, reverse)]
cumsum_p.transpose = lambda ct, x, *, axis, reverse: [cumsum(ct[0], axis, not reverse)]
cumsum_p.batch = lambda v, d, n, *, axis, reverse: (
    [bind(cumsum_p, v[0], axis=axis + 1, reverse=reverse)], [0])


def argsort(x, axis):
    """Indices that sort ``x`` along ``axis`` (already normalized)."""
    x = F.as_var(x)
    if x.dtype.kind == "b":
        x = F.cast(x, np.int32)
    return bind(argsort_p, x, axis=axis)


def cumsum(x, axis, reverse=False):
    """Running sum along ``axis`` (already normalized), in ``x``'s dtype."""
    return bind(cumsum_p, F.as_var(x), axis=axis, reverse=bool(reverse))
