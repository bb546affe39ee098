"""``vkml.numpy.linalg``: norms, solves, inverses, determinants and Cholesky, differentiable.

``solve``, ``slogdet`` and ``cholesky`` are one primitive each (a
factorization cannot be composed); ``inv`` is a solve against the identity
and ``det`` is ``sign * exp(log|det|)``; ``norm`` is composed.  A singular
matrix (or one that is not positive definite, for ``cholesky``) gives NaN,
not ``LinAlgError`` (see ``vkml.numpy``).
"""

from __future__ import annotations

from ..errors import ArgumentError
from ..ops import numeric as _num
from .. import validate as _valid    # (a module: its names are not vkml.numpy's)
from ._lift import doc as _doc, lifted as _lifted, lifted_many as _lifted_many

#: the norms named by a string
_NAMED_ORDERS = ("fro", "nuc")


def _norm(x, ord=None, axis=None, keepdims=False):
    if isinstance(ord, str):
        if ord not in _NAMED_ORDERS:
            raise ArgumentError(f"linalg.norm: ord {ord!r} is not a norm; use a number, inf, -inf, "
                                "'fro' or 'nuc'")
    elif ord is not None:
        _valid.check_real(ord, "ord", "linalg.norm", finite=False)
    return _num.norm(x, ord, axis, _valid.check_bool(keepdims, "keepdims", "linalg.norm"))


_TABLE = [
    ("norm", _norm, "Vector norms (ord None/2, p, inf, -inf, 0) and matrix norms ('fro', 1, -1, inf, -inf) over ``axis``.", "vnp.linalg.norm([3.0, 4.0])", "tensor(5., dtype=float64)"),
    ("solve", _num.solve, "x with a @ x = b (``b`` a vector only when 1-D, as in NumPy 2); derivative dx = solve(a, db - da x).", "vnp.linalg.solve([[2.0, 0.0], [0.0, 4.0]], [2.0, 2.0])", "tensor([1. , 0.5], dtype=float64)"),
    ("inv", _num.inv, "The inverse matrix; derivative -inv(a) da inv(a).", "vnp.linalg.inv([[2.0, 0.0], [0.0, 4.0]])", 'tensor([[0.5 , 0.  ],\n        [0.  , 0.25]], dtype=float64)'),
    ("det", _num.det, "The determinant, sign * exp(log|det|); derivative det * trace(inv(a) da).", "vnp.linalg.det([[2.0, 1.0], [1.0, 3.0]])", "tensor(5., dtype=float64)"),
    ("cholesky", _num.cholesky, "The lower factor L of a symmetric positive definite a = L L^T.", "vnp.linalg.cholesky([[4.0, 2.0], [2.0, 5.0]])", 'tensor([[2., 0.],\n        [1., 2.]], dtype=float64)'),
]

for _name, _fn, _summary, _example, _output in _TABLE:
    globals()[_name] = _lifted(_fn, _name, _doc(_summary, _example, _output))

slogdet = _lifted_many(_num.slogdet, "slogdet", _doc(
    "(sign, log|det|) of square matrices; the derivative of log|det| is trace(inv(a) da).",
    "vnp.linalg.slogdet([[2.0, 1.0], [1.0, 3.0]])", "(tensor(1., dtype=float64), tensor(1.60943791, dtype=float64))"), as_tuple=True)
