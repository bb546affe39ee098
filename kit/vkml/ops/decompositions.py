"""Eigen-, singular-value and QR decompositions: one primitive each, derivatives composed.

- ``eigh(a)``: eigenvalues (ascending) and eigenvectors of symmetric matrices,
  reading the lower triangle.  With ``M = V^T sym(dA) V``: ``dw = diag(M)``,
  ``dV = V (F o M)``, ``F_ij = 1 / (w_j - w_i)`` off the diagonal (infinite
  for equal eigenvalues, where the eigenvectors are not unique: the
  derivative is then NaN or inf, as in JAX).
- ``svd(a)``: the reduced decomposition ``a = U diag(s) Vt``.  With
  ``P = U^T dA V``: ``ds = diag(P)``, and ``dU``, ``dV`` from the symmetric
  and antisymmetric parts of ``P diag(s)`` and ``diag(s) P`` scaled by
  ``1 / (s_j^2 - s_i^2)``, plus the parts of ``dA`` outside the spans of U
  (tall) or V (wide).
- ``qr(a)``: the reduced ``a = Q R`` (rows >= columns for the derivative).
  With ``C = Q^T dA R^-1`` and ``W`` its strictly lower part minus its
  transpose: ``dQ = Q (W - C) + dA R^-1`` and ``dR = (C - W) R``.

Every derivative is linear in the tangent (the primal values appear only as
constants), so reverse mode transposes it like any other linear map.  The
decompositions run on NumPy (LAPACK) on every backend: a program holding one
is run by the NumPy backend where the C tier would otherwise compile it.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir import dtype_name
from . import api as F
from .core import Primitive, bind
from .factorizations import solve


def _matrix(name, a, square=False):
    if a.ndim < 2 or (square and a.shape[-1] != a.shape[-2]):
        need = "square matrices (..., n, n)" if square else "matrices (..., m, n)"
        raise ShapeError(f"{name}: needs {need}, got shape {a.shape}")
    if a.dtype.kind != "f":
        raise DTypeError(f"{name}: needs a floating matrix, got {dtype_name(a.dtype)}; "
                         "cast with .astype(np.float64)")


def _swap(x):
    return F.swapaxes(x, -1, -2)


def _diag_of(m):
    """The diagonal of each matrix (..., n, n) as (..., n)."""
    n = m.shape[-1]
    return F.sum(F.mul(m, F.constant(np.eye(n, dtype=m.dtype))), -1)


def _as_diag(v):
    """Vectors (..., n) as diagonal matrices (..., n, n)."""
    n = v.shape[-1]
    return F.mul(F.expand_dims(v, -1), F.constant(np.eye(n, dtype=v.dtype)))


def _inverse_gaps(values):
    """``1 / (values_j - values_i)`` off the diagonal, 0 on it: (..., n) -> (..., n, n)."""
    n = values.shape[-1]
    gaps = F.sub(F.expand_dims(values, -2), F.expand_dims(values, -1))
    eye = F.constant(np.eye(n, dtype=values.dtype))
    return F.sub(F.div(1.0, F.add(gaps, eye)), eye)


# -- eigh ----------------------------------------------------------------------------------------

def _eigh_rule(a):
    _matrix("eigh", a, square=True)
    return [(a.shape[:-1], a.dtype), (a.shape, a.dtype)]


def _eigh_impl(a):
    w, v = np.linalg.eigh(a)
    return [w.astype(a.dtype, copy=False), v.astype(a.dtype, copy=False)]


def _eigh_jvp(p, t, o):
    w, v = o
    da = t[0]
    da = F.mul(F.add(da, _swap(da)), 0.5)
    m = F.matmul(_swap(v), F.matmul(da, v))
    dv = F.matmul(v, F.mul(_inverse_gaps(w), m))
    return [_diag_of(m), dv]


eigh_p = Primitive("eigh", multiple_results=True,
                   doc="Eigenvalues (ascending) and eigenvectors of symmetric matrices (..., n, n), "
                       "from the lower triangle.")
eigh_p.abstract = _eigh_rule
eigh_p.impl = _eigh_impl
eigh_p.jvp = _eigh_jvp
eigh_p.batch = lambda v, d, n: (bind(eigh_p, F.batch_all(v, d, n)[0]), [0, 0])


# -- svd -----------------------------------------------------------------------------------------

def _svd_rule(a):
    _matrix("svd", a)
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    return [(batch + (m, k), a.dtype), (batch + (k,), a.dtype), (batch + (k, n), a.dtype)]


def _svd_impl(a):
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    return [x.astype(a.dtype, copy=False) for x in (u, s, vt)]


def _svd_jvp(p, t, o):
    a, da = p[0], t[0]
    u, s, vt = o
    v = _swap(vt)
    m, n = a.shape[-2:]
    k = s.shape[-1]
    dp = F.matmul(_swap(u), F.matmul(da, v))                 # U^T dA V, (..., k, k)
    ds = _diag_of(dp)
    s_row = F.expand_dims(s, -2)                             # s_j along columns
    s_col = F.expand_dims(s, -1)                             # s_i along rows
    gaps = _inverse_gaps(F.mul(s, s))                        # 1 / (s_j^2 - s_i^2)
    dp_s = F.mul(dp, s_row)                                  # P diag(s)
    s_dp = F.mul(s_col, dp)                                  # diag(s) P
    du = F.matmul(u, F.mul(gaps, F.add(dp_s, _swap(dp_s))))
    dv = F.matmul(v, F.mul(gaps, F.add(s_dp, _swap(s_dp))))
    zero = F.equal(s, 0.0)
    inv_s = F.expand_dims(F.where(zero, 0.0, F.div(1.0, F.where(zero, 1.0, s))), -2)
    if m > k:                                                # the part of dA V outside U's span
        dav = F.matmul(da, v)
        du = F.add(du, F.mul(F.sub(dav, F.matmul(u, F.matmul(_swap(u), dav))), inv_s))
    if n > k:                                                # the part of dA^T U outside V's span
        dau = F.matmul(_swap(da), u)
        dv = F.add(dv, F.mul(F.sub(dau, F.matmul(v, F.matmul(vt, dau))), inv_s))
    return [du, ds, _swap(dv)]


svd_p = Primitive("svd", multiple_results=True,
                  doc="The reduced singular value decomposition (U, s, Vt) of matrices (..., m, n), "
                      "s descending.")
svd_p.abstract = _svd_rule
svd_p.impl = _svd_impl
svd_p.jvp = _svd_jvp
svd_p.batch = lambda v, d, n: (bind(svd_p, F.batch_all(v, d, n)[0]), [0, 0, 0])


# -- qr ------------------------------------------------------------------------------------------

def _qr_rule(a):
    _matrix("qr", a)
    m, n = a.shape[-2:]
    k = min(m, n)
    return [(a.shape[:-2] + (m, k), a.dtype), (a.shape[:-2] + (k, n), a.dtype)]


def _qr_impl(a):
    q, r = np.linalg.qr(a, mode="reduced")
    return [q.astype(a.dtype, copy=False), r.astype(a.dtype, copy=False)]


def _qr_jvp(p, t, o):
    a, da = p[0], t[0]
    q, r = o
    m, n = a.shape[-2:]
    if m < n:
        raise ShapeError(f"qr: the derivative needs at least as many rows as columns, got a "
                         f"{m} x {n} matrix; differentiate the qr of its transpose")
    da_rinv = _swap(solve(_swap(r), _swap(da)))              # dA R^-1
    c = F.matmul(_swap(q), da_rinv)
    lower = F.mul(c, F.constant(np.tri(n, n, -1, dtype=a.dtype)))
    w = F.sub(lower, _swap(lower))
    dq = F.add(F.matmul(q, F.sub(w, c)), da_rinv)
    dr = F.matmul(F.sub(c, w), r)
    return [dq, dr]


qr_p = Primitive("qr", multiple_results=True,
                 doc="The reduced QR decomposition (Q, R) of matrices (..., m, n).")
qr_p.abstract = _qr_rule
qr_p.impl = _qr_impl
qr_p.jvp = _qr_jvp
qr_p.batch = lambda v, d, n: (bind(qr_p, F.batch_all(v, d, n)[0]), [0, 0])


# -- the operations ------------------------------------------------------------------------------

def eigh(a):
    return bind(eigh_p, F.as_floating(a))


def svd(a):
    return bind(svd_p, F.as_floating(a))


def qr(a):
    return bind(qr_p, F.as_floating(a))


def singular_values(a):
    return svd(a)[1]


def pinv(a, rtol=None):
    """The Moore-Penrose pseudo-inverse: singular values below ``rtol * max(s)`` count as 0
    (``rtol`` default ``max(m, n) * eps``, the array API's)."""
    a = F.as_floating(a)
    u, s, vt = svd(a)
    if rtol is None:
        rtol = max(a.shape[-2:]) * float(np.finfo(a.dtype).eps)
    cutoff = F.mul(F.max(s, -1, keepdims=True), rtol)
    keep = F.greater(s, cutoff)
    inv_s = F.where(keep, F.div(1.0, F.where(keep, s, 1.0)), 0.0)
    return F.matmul(_swap(vt), F.mul(F.expand_dims(inv_s, -1), _swap(u)))


def matrix_rank(a, rtol=None):
    a = F.as_floating(a)
    s = singular_values(a)
    if rtol is None:
        rtol = max(a.shape[-2:]) * float(np.finfo(a.dtype).eps)
    cutoff = F.mul(F.max(s, -1, keepdims=True), rtol)
    return F.sum(F.cast(F.greater(s, cutoff), np.int64), -1)
