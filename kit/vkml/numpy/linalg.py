"""``vkml.numpy.linalg``: NumPy's linear algebra (and the array API's), differentiable.

``solve``, ``slogdet`` and ``cholesky`` are one primitive each, and so are
``eigh``, ``svd`` and ``qr`` (a factorization cannot be composed); ``inv`` is
a solve against the identity, ``det`` is ``sign * exp(log|det|)``;
``pinv``, ``lstsq``, ``matrix_rank``, ``cond`` and the 2/-2/'nuc' norms come
from the singular values; the rest is composed.  A singular matrix (or one
that is not positive definite, for ``cholesky``) gives NaN, not
``LinAlgError`` (see ``vkml.numpy``).  Results of several parts are the named
tuples NumPy returns (``eigh(a).eigenvalues``, ``svd(a).S``, ...).  Complex
eigenvalues (``eig``/``eigvals`` of a general matrix) are not available.
"""

from __future__ import annotations

import collections

from ..errors import ArgumentError
from ..ops import api as _api
from . import _array_api as _aa
from ..ops import decompositions as _dec
from ..ops import linalg_more as _more
from ..ops import numeric as _num
from ..ops import shaping as _shp
from .. import validate as _valid    # (a module: its names are not vkml.numpy's)
from ._lift import doc as _doc, lifted as _lifted, lifted_many as _lifted_many, named as _named

#: the norms named by a string
_NAMED_ORDERS = ("fro", "nuc")

_EighResult = collections.namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
_SVDResult = collections.namedtuple("SVDResult", ["U", "S", "Vh"])
_QRResult = collections.namedtuple("QRResult", ["Q", "R"])
_SlogdetResult = collections.namedtuple("SlogdetResult", ["sign", "logabsdet"])
_LstsqResult = collections.namedtuple("LstsqResult", ["x", "residuals", "rank", "singular_values"])


def _check_ord(ord, op):
    if isinstance(ord, str):
        if ord not in _NAMED_ORDERS:
            raise ArgumentError(f"{op}: ord {ord!r} is not a norm; use a number, inf, -inf, "
                                "'fro' or 'nuc'")
    elif ord is not None:
        _valid.check_real(ord, "ord", op, finite=False)
    return ord


def _norm(x, ord=None, axis=None, keepdims=False):
    return _num.norm(x, _check_ord(ord, "linalg.norm"), axis,
                     _valid.check_bool(keepdims, "keepdims", "linalg.norm"))


def _matrix_norm(x, keepdims=False, ord="fro"):
    return _num.norm(x, _check_ord(ord, "linalg.matrix_norm"), (-2, -1),
                     _valid.check_bool(keepdims, "keepdims", "linalg.matrix_norm"))


def _vector_norm(x, axis=None, keepdims=False, ord=2):
    x = _api.as_floating(x)
    ord = _check_ord(ord, "linalg.vector_norm")
    keepdims = _valid.check_bool(keepdims, "keepdims", "linalg.vector_norm")
    if axis is None:           # all axes, as one vector
        out = _num.norm(_api.reshape(x, (-1,)), ord, 0, False)
        return _api.reshape(out, (1,) * x.ndim) if keepdims else out
    axes = _api.normalize_axes("linalg.vector_norm", x.ndim, axis)
    if len(axes) == 1:
        return _num.norm(x, ord, axes[0], keepdims)
    rest = tuple(i for i in range(x.ndim) if i not in axes)
    flat = _api.reshape(_api.transpose(x, rest + axes), tuple(x.shape[i] for i in rest) + (-1,))
    out = _num.norm(flat, ord, -1, False)
    if keepdims:
        out = _api.reshape(out, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return out


def _cholesky(a, *, upper=False):
    low = _num.cholesky(a)
    return _api.swapaxes(low, -1, -2) if _valid.check_bool(upper, "upper", "linalg.cholesky") else low


def _matrix_transpose(x):
    x = _api.as_var(x)
    if x.ndim < 2:
        raise ArgumentError(f"linalg.matrix_transpose: needs at least 2 dimensions, got shape {x.shape}")
    return _api.swapaxes(x, -1, -2)


def _vecdot(x1, x2, axis=-1):
    return _aa.vecdot_vars(x1, x2, axis=axis)


def _trace(x, offset=0, dtype=None):
    out = _num.trace(x, _valid.check_int(offset, "offset", "linalg.trace"), -2, -1)
    return out if dtype is None else _api.cast(out, _valid.check_dtype(dtype, "linalg.trace"))


def _diagonal(x, offset=0):
    return _num.diagonal(x, _valid.check_int(offset, "offset", "linalg.diagonal"), -2, -1)


def _cross(x1, x2, axis=-1):
    return _shp.cross(x1, x2, axis=axis)


def _svd_parts(a, full_matrices=True, compute_uv=True, hermitian=False):
    a = _api.as_var(a)
    if compute_uv and full_matrices and a.ndim >= 2 and a.shape[-1] != a.shape[-2]:
        raise ArgumentError(f"linalg.svd: full_matrices=True of a non-square {a.shape[-2]} x "
                            f"{a.shape[-1]} matrix needs basis columns no derivative fixes; pass "
                            "full_matrices=False (the reduced U and Vh)")
    out = _dec.svd(a)
    return list(out) if compute_uv else [out[1]]


def _qr_parts(a, mode="reduced"):
    a = _api.as_var(a)
    mode = _valid.check_choice(mode, ("reduced", "complete", "r"), "mode", "linalg.qr")
    if mode == "complete" and a.ndim >= 2 and a.shape[-2] > a.shape[-1]:
        raise ArgumentError(f"linalg.qr: mode 'complete' of a tall {a.shape[-2]} x {a.shape[-1]} "
                            "matrix needs basis columns no derivative fixes; use mode='reduced'")
    q, r = _dec.qr(a)
    return [r] if mode == "r" else [q, r]


def _pinv(a, rcond=None, hermitian=False, *, rtol=None):
    tol = rtol if rtol is not None else rcond
    return _dec.pinv(a, None if tol is None else _valid.check_real(tol, "rtol", "linalg.pinv"))


def _matrix_rank(A, tol=None, hermitian=False, *, rtol=None):
    a = _api.as_floating(A)
    if tol is not None:        # NumPy's absolute tolerance
        s = _dec.singular_values(a)
        return _api.sum(_api.cast(_api.greater(s, tol), "int64"), -1)
    return _dec.matrix_rank(a, None if rtol is None else _valid.check_real(rtol, "rtol", "linalg.matrix_rank"))


def _lstsq(a, b, rcond=None):
    return _more.lstsq(a, b, None if rcond is None else _valid.check_real(rcond, "rcond", "linalg.lstsq"))


def _matrix_power(a, n):
    return _more.matrix_power(a, _valid.check_int(n, "n", "linalg.matrix_power"))


def _multi_dot(arrays):
    return _more.multi_dot(_valid.check_sequence(arrays, "arrays", "linalg.multi_dot"))


def _cond(x, p=None):
    return _more.cond(x, _check_ord(p, "linalg.cond"))


_TABLE = [
    ("norm", _norm, "Vector norms (ord None/2, p, inf, -inf, 0) and matrix norms ('fro', 'nuc', 1, -1, 2, -2, inf, -inf) over ``axis``.", "vnp.linalg.norm([3.0, 4.0])", "tensor(5., dtype=float64)"),
    ("matrix_norm", _matrix_norm, "The norm ``ord`` of the last two axes (the array API's).", "vnp.linalg.matrix_norm([[3.0, 0.0], [0.0, 4.0]], ord=2)", "tensor(4., dtype=float64)"),
    ("vector_norm", _vector_norm, "The vector norm ``ord`` over ``axis`` (all axes as one vector when None).", "vnp.linalg.vector_norm([[3.0], [4.0]])", "tensor(5., dtype=float64)"),
    ("solve", _num.solve, "x with a @ x = b (``b`` a vector only when 1-D, as in NumPy 2); derivative dx = solve(a, db - da x).", "vnp.linalg.solve([[2.0, 0.0], [0.0, 4.0]], [2.0, 2.0])", "tensor([1. , 0.5], dtype=float64)"),
    ("inv", _num.inv, "The inverse matrix; derivative -inv(a) da inv(a).", "vnp.linalg.inv([[2.0, 0.0], [0.0, 4.0]])", 'tensor([[0.5 , 0.  ],\n        [0.  , 0.25]], dtype=float64)'),
    ("det", _num.det, "The determinant, sign * exp(log|det|); derivative det * trace(inv(a) da).", "vnp.linalg.det([[2.0, 1.0], [1.0, 3.0]])", "tensor(5., dtype=float64)"),
    ("cholesky", _cholesky, "The lower factor L of a symmetric positive definite a = L L^T.", "vnp.linalg.cholesky([[4.0, 2.0], [2.0, 5.0]])", 'tensor([[2., 0.],\n        [1., 2.]], dtype=float64)'),
    ("eigvalsh", lambda a, UPLO="L": _dec.eigh(a)[0], "The eigenvalues (ascending) of symmetric matrices.", "vnp.linalg.eigvalsh([[2.0, 1.0], [1.0, 2.0]])", "tensor([1., 3.], dtype=float64)"),
    ("svdvals", _dec.singular_values, "The singular values (descending).", "vnp.linalg.svdvals([[3.0, 0.0], [0.0, 4.0]])", "tensor([4., 3.], dtype=float64)"),
    ("pinv", _pinv, "The Moore-Penrose pseudo-inverse (singular values below rtol * max count as 0).", "vnp.linalg.pinv([[2.0, 0.0], [0.0, 0.0]])", 'tensor([[0.5, 0. ],\n        [0. , 0. ]], dtype=float64)'),
    ("matrix_rank", _matrix_rank, "The number of singular values above the tolerance.", "vnp.linalg.matrix_rank([[1.0, 2.0], [2.0, 4.0]])", "tensor(1, dtype=int64)"),
    ("matrix_power", _matrix_power, "The matrix to the integer power ``n`` (by squaring; inverse for n < 0).", "vnp.linalg.matrix_power([[1.0, 1.0], [0.0, 1.0]], 3)", 'tensor([[1., 3.],\n        [0., 1.]], dtype=float64)'),
    ("multi_dot", _multi_dot, "The product of several matrices.", "vnp.linalg.multi_dot([[[1.0, 2.0]], [[1.0], [1.0]], [[2.0]]])", "tensor([[6.]], dtype=float64)"),
    ("cond", _cond, "The condition number (2-norm by default).", "vnp.linalg.cond([[1.0, 0.0], [0.0, 4.0]])", "tensor(4., dtype=float64)"),
    ("matrix_transpose", _matrix_transpose, "The last two axes swapped.", "vnp.linalg.matrix_transpose([[1.0, 2.0]])", 'tensor([[1.],\n        [2.]], dtype=float64)'),
    ("vecdot", _vecdot, "The dot product along ``axis``.", "vnp.linalg.vecdot([1.0, 2.0], [3.0, 4.0])", "tensor(11., dtype=float64)"),
    ("outer", _num.outer, "The outer product of two vectors.", "vnp.linalg.outer([1.0, 2.0], [1.0, 10.0])", 'tensor([[ 1., 10.],\n        [ 2., 20.]], dtype=float64)'),
    ("trace", _trace, "The sum of the ``offset`` diagonal of the last two axes.", "vnp.linalg.trace([[1.0, 2.0], [3.0, 4.0]])", "tensor(5., dtype=float64)"),
    ("diagonal", _diagonal, "The ``offset`` diagonal of the last two axes.", "vnp.linalg.diagonal([[1.0, 2.0], [3.0, 4.0]])", "tensor([1., 4.], dtype=float64)"),
    ("cross", _cross, "The cross product of 3-vectors along ``axis``.", "vnp.linalg.cross([1.0, 0.0, 0.0], [0.0, 1.0, 0.0])", "tensor([0., 0., 1.], dtype=float64)"),
    ("tensordot", _num.tensordot, "Sum over ``axes``.", "vnp.linalg.tensordot([1.0, 2.0], [3.0, 4.0], 1)", "tensor(11., dtype=float64)"),
    ("matmul", _api.matmul, "The matrix product.", "vnp.linalg.matmul([[1.0, 2.0]], [[3.0], [4.0]])", "tensor([[11.]], dtype=float64)"),
]

for _name, _fn, _summary, _example, _output in _TABLE:
    globals()[_name] = _lifted(_fn, _name, _doc(_summary, _example, _output))


def _as(result_type, fn, name, doc):
    many = _lifted_many(fn, name, doc, as_tuple=True)

    def op(*args, **kwargs):
        out = many(*args, **kwargs)
        return result_type(*out) if len(out) == len(result_type._fields) else out[0]
    return _named(op, name, doc, many.__signature__)


slogdet = _as(_SlogdetResult, _num.slogdet, "slogdet", _doc(
    "(sign, log|det|) of square matrices; the derivative of log|det| is trace(inv(a) da).",
    "vnp.linalg.slogdet([[2.0, 1.0], [1.0, 3.0]])", "SlogdetResult(sign=tensor(1., dtype=float64), logabsdet=tensor(1.60943791, dtype=float64))"))
eigh = _as(_EighResult, lambda a, UPLO="L": list(_dec.eigh(a)), "eigh", _doc(
    "Eigenvalues (ascending) and eigenvectors of symmetric matrices, from the lower triangle; "
    "derivative from the eigenvalue gaps (inf where two are equal).",
    "vnp.linalg.eigh([[2.0, 0.0], [0.0, 1.0]]).eigenvalues", "tensor([1., 2.], dtype=float64)"))
svd = _as(_SVDResult, _svd_parts, "svd", _doc(
    "(U, S, Vh) with a = U diag(S) Vh, S descending; non-square needs full_matrices=False.",
    "vnp.linalg.svd([[3.0, 0.0], [0.0, 4.0]]).S", "tensor([4., 3.], dtype=float64)"))
qr = _as(_QRResult, _qr_parts, "qr", _doc(
    "(Q, R) with a = Q R, Q with orthonormal columns, R upper triangular (mode 'reduced' or 'r').",
    "vnp.linalg.qr([[1.0, 0.0], [0.0, 2.0]]).R", 'tensor([[1., 0.],\n        [0., 2.]], dtype=float64)'))
lstsq = _as(_LstsqResult, _lstsq, "lstsq", _doc(
    "(x, residuals, rank, singular values): the least-squares (minimum-norm) solution of a x = b.",
    "vnp.linalg.lstsq([[1.0], [1.0]], [1.0, 3.0]).x", "tensor([2.], dtype=float64)"))

for _f in [v for k, v in globals().items() if callable(v) and not k.startswith("_")
           and getattr(v, "__module__", None) == "vkml.numpy"]:
    _f.__module__ = __name__        # (Sphinx documents a module's own members)
