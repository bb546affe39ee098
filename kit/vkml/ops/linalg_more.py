"""The rest of NumPy's and SciPy's linear algebra, composed from the decompositions and solves.

``lstsq`` and ``pinv`` go through the SVD (rank-deficient systems get the
minimum-norm solution, as LAPACK's ``gelsd`` gives); ``matrix_power`` squares
repeatedly; ``expm`` scales the matrix by 2**-s until its 1-norm is below
0.5, sums 18 Taylor terms (below the float64 rounding there) and squares s
times (s from the value's norm when it is known, else a fixed 30 squarings
of which only the needed ones take effect); ``solve_triangular`` solves with
the triangle kept (LU of a triangular matrix needs no pivoting beyond it).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import ArgumentError, ShapeError
from . import api as F
from . import decompositions as D
from . import factorizations as L
from . import numeric as N
from .core import quiet_function


def _swap(x):
    return F.swapaxes(x, -1, -2)


def lstsq(a, b, rcond=None):
    """(x, residuals, rank, s): the least-squares solution of a @ x = b."""
    a, b = F.promote(F.as_floating(a), F.as_floating(b))
    if a.ndim != 2 or b.ndim not in (1, 2) or b.shape[0] != a.shape[0]:
        raise ShapeError(f"lstsq: needs a (m, n) matrix and a right-hand side of m rows, got "
                         f"{a.shape} and {b.shape}")
    m, n = a.shape
    x = F.matmul(D.pinv(a, rcond), b)
    s = D.singular_values(a)
    rank = D.matrix_rank(a, rcond)
    if m > n:
        resid = F.sum(F.square(F.sub(b, F.matmul(a, x))), 0)
        resid = F.reshape(resid, (1,)) if b.ndim == 1 else resid
    else:
        resid = F.zeros((0,), a.dtype)
    return [x, resid, rank, s]


def matrix_power(a, n):
    """``a`` multiplied by itself ``n`` times (inverse first for negative n; identity for 0)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ArgumentError(f"matrix_power: n must be a whole number, got {n!r}")
    a = F.as_var(a)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"matrix_power: needs square matrices (..., n, n), got shape {a.shape}")
    if n < 0:
        a, n = N.inv(a), -n
    out = None
    base = a
    while n:
        if n & 1:
            out = base if out is None else F.matmul(out, base)
        n >>= 1
        if n:
            base = F.matmul(base, base)
    if out is None:
        eye = np.eye(a.shape[-1], dtype=a.dtype)
        out = F.broadcast_to(F.constant(eye), a.shape)
    return out


def multi_dot(arrays):
    """The product of several matrices (a 1-D first or last operand as a row or column)."""
    arrays = [F.as_var(a) for a in arrays]
    if len(arrays) < 2:
        raise ArgumentError(f"multi_dot: needs at least two arrays, got {len(arrays)}")
    out = arrays[0]
    for nxt in arrays[1:]:
        out = F.matmul(out, nxt)
    return out


def cond(x, p=None):
    """The condition number in norm ``p`` (the 2-norm's from the singular values)."""
    x = F.as_floating(x)
    if p is None or p in (2, -2):
        s = D.singular_values(x)
        big, small = F.max(s, -1), F.min(s, -1)
        return F.div(small, big) if p == -2 else F.div(big, small)
    return F.mul(N.norm(x, p, (-2, -1)), N.norm(N.inv(x), p, (-2, -1)))


def solve_triangular(a, b, lower=False, trans=0, unit_diagonal=False):
    """x with op(a) x = b for triangular ``a`` (only its ``lower``/upper triangle is read)."""
    a, b = F.promote(F.as_floating(a), F.as_floating(b))
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ShapeError(f"solve_triangular: needs a square matrix, got shape {a.shape}")
    n = a.shape[0]
    tri = np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))
    t = F.where(F.constant(tri), a, 0.0)
    if unit_diagonal:
        t = F.where(F.constant(np.eye(n, dtype=bool)), 1.0, t)
    if trans in (1, 2, "T", "C"):
        t = _swap(t)
    elif trans not in (0, "N"):
        raise ArgumentError(f"solve_triangular: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}")
    vector = b.ndim == 1
    out = L.solve(t, F.reshape(b, (n, 1)) if vector else b)
    return F.reshape(out, (n,)) if vector else out


def cho_solve(c_and_lower, b):
    """x with A x = b, from A's Cholesky factor ``(c, lower)`` (as ``cho_factor`` gives)."""
    c, lower = c_and_lower
    y = solve_triangular(c, b, lower=lower, trans=0 if lower else 1)
    return solve_triangular(c, y, lower=lower, trans=1 if lower else 0)


_EXPM_TERMS = 18
_EXPM_MAX_SQUARINGS = 30


@quiet_function
def expm(a, squarings=None):
    """The matrix exponential by scaling and squaring of a Taylor sum (see the module)."""
    a = F.as_floating(a)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"expm: needs square matrices (..., n, n), got shape {a.shape}")
    n = a.shape[-1]
    norm1 = F.max(F.sum(F.abs(a), -2), -1, keepdims=True)             # (..., 1)
    if squarings is None and a.value is not None:       # the value is known: just enough squarings
        top = float(np.max(np.sum(np.abs(np.asarray(a.value)), -2), initial=0.0))
        squarings = int(np.clip(math.ceil(math.log2(top)) + 1, 0, _EXPM_MAX_SQUARINGS)) \
            if top > 0 and math.isfinite(top) else 0
    if squarings is not None:
        s = F.full(norm1.shape, float(squarings), a.dtype)
        fixed = int(squarings)
    else:
        s = F.maximum(N.ceil(F.div(F.log(F.maximum(norm1, 1e-300)), math.log(2.0))), -1.0)
        s = F.clip(F.add(s, 1.0), 0.0, float(_EXPM_MAX_SQUARINGS))
        fixed = _EXPM_MAX_SQUARINGS
    scaled = F.div(a, F.expand_dims(F.pow(2.0, s), -1))
    eye = F.broadcast_to(F.constant(np.eye(n, dtype=a.dtype)), a.shape)
    term, total = eye, eye
    for k in range(1, _EXPM_TERMS + 1):
        term = F.div(F.matmul(term, scaled), float(k))
        total = F.add(total, term)
    for i in range(fixed):
        squared = F.matmul(total, total)
        total = F.where(F.expand_dims(F.less(float(i), s), -1), squared, total)
    return total
