"""Matrix product: the one contraction primitive (conv2d is built on it)."""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir import dtype_name
from . import api as F  # api imports this module too: F is used only inside the rules
from .core import Linear, Primitive, bind


def _matmul_rule(a, b):
    if a.ndim < 2 or b.ndim != a.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: cannot multiply {a.shape} by {b.shape}; the inner "
                         "dimensions must agree (..., m, k) @ (..., k, n)")
    if a.dtype != b.dtype or a.dtype.kind == "b":
        raise DTypeError(f"matmul: operands must share a numeric dtype, got "
                         f"{dtype_name(a.dtype)} and {dtype_name(b.dtype)}")
    return [(a.shape[:-1] + b.shape[-1:], a.dtype)]


def _swap(x):
    """Transpose of the last two axes: what a matmul transposes through."""
    perm = tuple(range(len(x.shape) - 2)) + (len(x.shape) - 1, len(x.shape) - 2)
    return F.transpose(x, perm)


def _matmul_jvp(p, t, o):
    a, b = p
    ta = None if t[0] is None else F.matmul(t[0], b)
    tb = None if t[1] is None else F.matmul(a, t[1])
    if ta is None or tb is None:
        return [ta if tb is None else tb]
    return [F.add(ta, tb)]


def _matmul_transpose(ct, a, b):
    if isinstance(a, Linear):
        return [F.matmul(ct[0], _swap(b)), None]
    return [None, F.matmul(_swap(a), ct[0])]


matmul_p = Primitive("matmul", doc="(..., m, k) @ (..., k, n) with equal batch dims; linear in each operand.")
matmul_p.abstract = _matmul_rule
matmul_p.impl = np.matmul
matmul_p.jvp = _matmul_jvp
matmul_p.transpose = _matmul_transpose
matmul_p.batch = lambda v, d, n: ([bind(matmul_p, *F.batch_all(v, d, n))], [0])
