"""Matrix product: the one contraction primitive (conv2d is built on it).

Two summation orders, recorded in the program as the ``order`` parameter:

- the default (no parameter): as fast as the backend can -- BLAS GEMM on NumPy, whose blocking
  and vector width pick the order of the additions, so its bits depend on the BLAS library and
  can differ from the compiled tiers' (which add over ``k`` in index order);
- ``order="tree"`` (the deterministic product: ``vkml.matmul(a, b, deterministic=True)`` or any
  ``@`` inside ``with vkml.deterministic_matmul():``): every output is the canonical tree over
  ``k`` of the products (``treesum``), the same bits on every backend, at the cost of not using
  BLAS.  Its derivatives (JVP, transpose, batching) are deterministic products too.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError
from ..ir import dtype_name
from . import api as F  # api imports this module too: F is used only inside the rules
from ..threadsafe import Setting
from .core import Linear, Primitive, bind
from .treesum import tree_matmul

#: whether matrix products bound in this thread or task are deterministic (``order="tree"``)
DETERMINISTIC_MATMUL = Setting("deterministic_matmul", False)

ORDERS = ("tree",)


def matmul_params(deterministic=None) -> dict:
    """The params of a new matmul: ``{"order": "tree"}`` when ``deterministic`` (None: this
    thread's mode, ``vkml.deterministic_matmul``), else none (the default, fastest order)."""
    if deterministic is None:
        deterministic = DETERMINISTIC_MATMUL.get()
    if not isinstance(deterministic, (bool, np.bool_)):
        raise ArgumentError(f"matmul: deterministic must be True, False or None, got {deterministic!r}")
    return {"order": "tree"} if deterministic else {}


def _matmul_rule(a, b, *, order=None):
    if order is not None and order not in ORDERS:
        raise ArgumentError(f"matmul: unknown order {order!r}; use order='tree' or leave it out")
    if a.ndim < 2 or b.ndim != a.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: cannot multiply {a.shape} by {b.shape}; the inner "
                         "dimensions must agree (..., m, k) @ (..., k, n)")
    if a.dtype != b.dtype or a.dtype.kind == "b":
        raise DTypeError(f"matmul: operands must share a numeric dtype, got "
                         f"{dtype_name(a.dtype)} and {dtype_name(b.dtype)}")
    return [(a.shape[:-1] + b.shape[-1:], a.dtype)]


def _matmul_impl(a, b, *, order=None):
    return tree_matmul(a, b) if order == "tree" else np.matmul(a, b)


def _swap(x):
    """Transpose of the last two axes: what a matmul transposes through."""
    perm = tuple(range(len(x.shape) - 2)) + (len(x.shape) - 1, len(x.shape) - 2)
    return F.transpose(x, perm)


def _matmul_jvp(p, t, o, **params):
    a, b = p
    ta = None if t[0] is None else bind(matmul_p, t[0], b, **params)
    tb = None if t[1] is None else bind(matmul_p, a, t[1], **params)
    if ta is None or tb is None:
        return [ta if tb is None else tb]
    return [F.add(ta, tb)]


def _matmul_transpose(ct, a, b, **params):
    if isinstance(a, Linear):
        return [bind(matmul_p, ct[0], _swap(b), **params), None]
    return [None, bind(matmul_p, _swap(a), ct[0], **params)]


matmul_p = Primitive("matmul", doc="(..., m, k) @ (..., k, n) with equal batch dims; linear in each operand. "
                                   "``order='tree'``: each output the canonical tree over k.")
matmul_p.abstract = _matmul_rule
matmul_p.impl = _matmul_impl
matmul_p.jvp = _matmul_jvp
matmul_p.transpose = _matmul_transpose
matmul_p.batch = lambda v, d, n, **params: ([bind(matmul_p, *F.batch_all(v, d, n), **params)], [0])
