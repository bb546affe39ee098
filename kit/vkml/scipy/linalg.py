"""``vkml.scipy.linalg``: the matrix exponential and the triangular and Cholesky solves, differentiable.

``expm`` scales and squares a Taylor sum; ``solve_triangular`` and
``cho_solve`` solve with the triangle(s) of the factor, as SciPy's do, by
the same LU solve as ``vkml.numpy.linalg.solve``; ``cho_factor`` gives
``(L, True)`` for them (the whole lower factor, upper triangle zero).
"""

from __future__ import annotations

import inspect

from ..numpy._lift import doc as _doc, lifted as _lifted, named as _named
from ..ops import api as _api
from ..ops import factorizations as _fac
from ..ops import linalg_more as _more
from .. import validate as _valid

_HEAD = ">>> import vkml.scipy.linalg\n"


def _expm(A):
    return _more.expm(A)


def _solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False):
    return _more.solve_triangular(a, b, _valid.check_bool(lower, "lower", "solve_triangular"), trans,
                                  _valid.check_bool(unit_diagonal, "unit_diagonal", "solve_triangular"))


_TABLE = [
    ("expm", _expm, "The matrix exponential (scaling and squaring).", "vkml.scipy.linalg.expm([[0.0, 1.0], [0.0, 0.0]])", 'tensor([[1., 1.],\n        [0., 1.]], dtype=float64)'),
    ("solve_triangular", _solve_triangular, "x with a x = b (a^T x = b for trans=1) for triangular a.", "vkml.scipy.linalg.solve_triangular([[2.0, 0.0], [1.0, 1.0]], [2.0, 3.0], lower=True)", "tensor([1., 2.], dtype=float64)"),
]

for _name, _fn, _summary, _example, _output in _TABLE:
    globals()[_name] = _lifted(_fn, _name, _doc(_summary, _example, _output, head=_HEAD))

_cho_solve_lifted = _lifted(lambda c, b, lower: _more.cho_solve((c, lower), b), "cho_solve", "")
_cholesky_lifted = _lifted(lambda a: _fac.cholesky(_api.as_floating(a)), "cho_factor", "")


def _cho_factor(a, lower=True):
    lower = _valid.check_bool(lower, "lower", "cho_factor")
    low = _cholesky_lifted(a)
    return (low, True) if lower else (low.T, False)


def _cho_solve(c_and_lower, b):
    c, lower = c_and_lower
    return _cho_solve_lifted(c, b, _valid.check_bool(lower, "lower", "cho_solve"))


cho_factor = _named(_cho_factor, "cho_factor", _doc(
    "(c, lower): the Cholesky factor of a symmetric positive definite matrix, for cho_solve.",
    "vkml.scipy.linalg.cho_factor([[4.0, 2.0], [2.0, 5.0]])[0]", 'tensor([[2., 0.],\n        [1., 2.]], dtype=float64)',
    head=_HEAD), inspect.signature(_cho_factor))
cho_solve = _named(_cho_solve, "cho_solve", _doc(
    "x with A x = b from A's Cholesky factor (c, lower).",
    "vkml.scipy.linalg.cho_solve(vkml.scipy.linalg.cho_factor([[4.0, 2.0], [2.0, 5.0]]), [6.0, 7.0])", "tensor([1., 1.], dtype=float64)",
    head=_HEAD), inspect.signature(_cho_solve))

for _f in [v for k, v in globals().items() if callable(v) and not k.startswith("_")
           and getattr(v, "__module__", None) == "vkml.numpy"]:
    _f.__module__ = __name__        # (Sphinx documents a module's own members)
