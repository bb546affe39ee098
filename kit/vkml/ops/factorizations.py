"""Dense linear algebra: one primitive per factorization, derivatives written with other ops.

- ``solve(a, b)``: LU with partial pivoting of each square ``a`` (..., n, n)
  applied to the columns of ``b`` (..., n, k).  Linear in ``b`` (its
  transpose is a solve with ``a``'s transpose); in ``a`` its derivative is
  ``dX = solve(A, -dA X)``.  ``inv(a)`` is ``solve(a, I)``.
- ``slogdet(a)``: the same factorization, giving (sign, log|det|); the
  derivative of log|det| is ``trace(solve(A, dA))``, the sign's is zero.
  ``det`` is ``sign * exp(log|det|)``.
- ``cholesky(a)``: the lower factor L of a symmetric positive definite
  ``a``; ``dL = L phi(L^-1 sym(dA) L^-T)`` with ``phi`` keeping the lower
  triangle and half the diagonal (``sym`` makes the derivative the one of a
  symmetric matrix, as JAX and autograd have it).

None of them can be composed: a factorization chooses pivots from the data
(or takes square roots in sequence), which no elementwise or movement
primitive can express.  A singular matrix (or one that is not positive
definite) gives NaN results rather than an error, on every tier: an error
would need the program to stop half-way, and a traced program cannot.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir import dtype_name
from . import api as F
from .core import Primitive, bind


def _square(name, a):
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"{name}: needs square matrices (..., n, n), got shape {a.shape}")
    if a.dtype.kind != "f":
        raise DTypeError(f"{name}: needs a floating matrix, got {dtype_name(a.dtype)}; "
                         "cast with .astype(np.float64)")


def _per_matrix(fn, a, *rest, fill_shapes):
    """``fn`` on every matrix of the batch; a matrix NumPy refuses (singular, not positive
    definite) gives NaN in its place, as the compiled tiers do."""
    try:
        return fn(a, *rest)
    except np.linalg.LinAlgError:
        pass
    batch = a.shape[:-2]
    outs = [np.full(batch + s, np.nan, a.dtype) for s in fill_shapes]
    for i in np.ndindex(*batch):
        try:
            got = fn(a[i], *(r[i] for r in rest))
        except np.linalg.LinAlgError:
            continue
        for o, g in zip(outs, got if isinstance(got, tuple) else (got,)):
            o[i] = g
    return outs[0] if len(outs) == 1 else tuple(outs)


def _swap(x):
    perm = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return F.transpose(x, perm)


def _eye_like(a, values=None):
    """The identity of ``a``'s matrix size, broadcast over its batch (or ``values`` as a mask)."""
    n = a.shape[-1]
    m = np.eye(n, dtype=a.dtype) if values is None else values.astype(a.dtype)
    return F.broadcast_to(F.constant(m), a.shape)


# -- solve -------------------------------------------------------------------------------------

def _solve_rule(a, b):
    _square("solve", a)
    if b.ndim != a.ndim or b.shape[:-1] != a.shape[:-1]:
        raise ShapeError(f"solve: right-hand sides {b.shape} do not fit matrices {a.shape}; "
                         "expected (..., n, k) with the matrices' batch and n")
    if b.dtype != a.dtype:
        raise DTypeError(f"solve: dtypes {dtype_name(a.dtype)} and {dtype_name(b.dtype)} differ")
    return [(b.shape, b.dtype)]


def _solve_impl(a, b):
    return _per_matrix(np.linalg.solve, a, b, fill_shapes=[b.shape[-2:]])


def _solve_jvp(p, t, o):
    a, _ = p
    rhs = t[1]
    if t[0] is not None:
        da_x = F.neg(F.matmul(t[0], o[0]))
        rhs = da_x if rhs is None else F.add(rhs, da_x)
    return [solve(a, rhs)]


def _solve_transpose(ct, a, b):
    # linear in b only: X = A^-1 B, so B's cotangent is A^-T X's
    return [None, solve(_swap(a), ct[0])]


solve_p = Primitive("solve", doc="A^-1 B for square A (..., n, n) and B (..., n, k): LU with "
                                 "partial pivoting; linear in B (see the module docstring).")
solve_p.abstract = _solve_rule
solve_p.impl = _solve_impl
solve_p.jvp = _solve_jvp
solve_p.transpose = _solve_transpose
solve_p.batch = lambda v, d, n: ([bind(solve_p, *F.batch_all(v, d, n))], [0])


# -- slogdet -----------------------------------------------------------------------------------

def _slogdet_rule(a):
    _square("slogdet", a)
    return [(a.shape[:-2], a.dtype), (a.shape[:-2], a.dtype)]


def _slogdet_impl(a):
    sign, logabs = np.linalg.slogdet(a)
    return [np.asarray(sign, a.dtype), np.asarray(logabs, a.dtype)]


def _slogdet_jvp(p, t, o):
    a = p[0]
    inner = solve(a, t[0])
    return [None, F.sum(F.mul(inner, _eye_like(a)), (-2, -1))]


slogdet_p = Primitive("slogdet", multiple_results=True,
                      doc="(sign, log|det|) of square matrices (..., n, n) by LU; the sign's "
                          "derivative is zero, log|det|'s is trace(A^-1 dA).")
slogdet_p.abstract = _slogdet_rule
slogdet_p.impl = _slogdet_impl
slogdet_p.jvp = _slogdet_jvp
slogdet_p.batch = lambda v, d, n: (bind(slogdet_p, v[0]), [0, 0])


# -- cholesky ----------------------------------------------------------------------------------

def _cholesky_rule(a):
    _square("cholesky", a)
    return [(a.shape, a.dtype)]


def _cholesky_impl(a):
    return _per_matrix(np.linalg.cholesky, a, fill_shapes=[a.shape[-2:]])


def _cholesky_jvp(p, t, o):
    a, low = p[0], o[0]
    sym = F.mul(F.add(t[0], _swap(t[0])), 0.5)
    inner = _swap(solve(low, _swap(solve(low, sym))))         # L^-1 dA L^-T
    n = a.shape[-1]
    phi = np.tril(np.ones((n, n))) - 0.5 * np.eye(n)
    return [F.matmul(low, F.mul(inner, _eye_like(a, phi)))]


cholesky_p = Primitive("cholesky", doc="The lower Cholesky factor of symmetric positive definite "
                                       "matrices (..., n, n), reading their lower triangle.")
cholesky_p.abstract = _cholesky_rule
cholesky_p.impl = _cholesky_impl
cholesky_p.jvp = _cholesky_jvp
cholesky_p.batch = lambda v, d, n: ([bind(cholesky_p, v[0])], [0])


# -- the operations ----------------------------------------------------------------------------

def solve(a, b):
    """The primitive on (..., n, n) and (..., n, k) operands of one batch shape and dtype."""
    return bind(solve_p, a, b)


def slogdet(a):
    return bind(slogdet_p, a)


def cholesky(a):
    return bind(cholesky_p, a)

