"""NumPy's functions, composed from the primitives, on IR Vars (``vkml.numpy`` wraps them).

Each function here has NumPy's semantics (broadcasting, dtype promotion,
``axis``/``keepdims``) and is written with ``api`` functions and the few
primitives of ``special``, ``sorting`` and ``factorizations``; its derivative
is then the composition's.  Choices where several compositions were possible:

- accuracy within a few ulps of NumPy: ``sinh`` with ``expm1``; ``arcsin``,
  ``arccos``, ``arctan`` with ``atan2``; ``arcsinh``, ``arccosh``,
  ``arctanh`` with ``log1p`` on the operand's magnitude (the sign put back
  afterwards, so no branch ever sees a value it would overflow on);
  ``exp2`` is ``2 ** x`` (the C library's pow, not ``exp(x ln 2)``, whose
  rounding error grows with x); ``log2``/``log10`` divide ``log`` by a
  constant (within 1 ulp; not always exact at powers of 2 or 10).
- ``prod`` multiplies pairs in log2(n) rounds and ``cumprod`` is a doubling
  scan (log2(n) shifted products): both exact in their derivative where an
  element is zero, which ``exp(sum(log x))`` is not, and both O(n log n) at
  worst.  Their products are in another order than NumPy's (a few ulps).
- ``einsum`` and ``tensordot`` become transposes, reshapes and one batched
  matmul per pair of operands; ``diagonal``/``diag`` a reshape and a strided
  slice (so their derivatives are pads); ``triu``/``tril`` a where with a
  constant mask; ``roll`` slices and a concatenate; ``repeat``/``tile``
  broadcasts and reshapes.
"""

from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError
from . import api as F
from . import complex_parts, decompositions, factorizations, sorting
from .special import atan2, expm1, fmod, log1p, round_

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


def _sign_split(x):
    """(s, |x|) with s = -1 where x < 0 and 1 elsewhere (a constant: no derivative), so an odd
    function is ``s * f(s * x)`` and f only ever sees x >= 0 (x = 0 takes the positive side)."""
    s = F.where(F.less(x, 0), F.full((), -1.0, x.dtype), F.full((), 1.0, x.dtype))
    return s, F.mul(s, x)


# -- elementwise ---------------------------------------------------------------------------------

def tan(x):
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("tan", x)
    return F.div(F.sin(x), F.cos(x))


def sinh(x):
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("sinh", x)
    return F.mul(F.sub(expm1(x), expm1(F.neg(x))), 0.5)


def cosh(x):
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("cosh", x)
    return F.mul(F.add(F.exp(x), F.exp(F.neg(x))), 0.5)


def _one_minus_square(x):
    """1 - x*x as (1 - x)(1 + x): exact digits near |x| = 1."""
    return F.mul(F.sub(1.0, x), F.add(1.0, x))


def arcsin(x):
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("arcsin", x)
    return atan2(x, F.sqrt(_one_minus_square(x)))


def arccos(x):
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("arccos", x)
    return atan2(F.sqrt(_one_minus_square(x)), x)


def arctan(x):
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("arctan", x)
    return atan2(x, F.ones_like(x))


def arctan2(y, x):
    return atan2(y, x)


#: beyond this magnitude x*x would overflow and arcsinh(x) = log(2x) to the last bit
_BIG = 2.0 ** 28


def _clamped(x, hi):
    """x, or ``hi`` where x > hi (a where, not a minimum: no tie splitting the derivative)."""
    return F.where(F.greater(x, hi), F.full((), hi, x.dtype), x)


def arcsinh(x):
    """log1p(t + t^2 / (1 + sqrt(1 + t^2))) for t = |x|, log(2t) beyond 2**28; sign put back
    (-0 stays -0)."""
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("arcsinh", x)
    s, t = _sign_split(x)
    small = _clamped(t, _BIG)
    root = F.sqrt(F.add(1.0, F.mul(small, small)))
    near = log1p(F.add(small, F.div(F.mul(small, small), F.add(1.0, root))))
    far = F.add(F.log(F.maximum(t, _BIG)), _LN2)
    out = F.mul(s, F.where(F.greater(t, _BIG), far, near))
    return F.where(F.equal(x, 0.0), x, out)


def arccosh(x):
    """log1p(u + sqrt(u (u + 2))) for u = x - 1 (exact for x in [1, 2]), log(2x) beyond 2**28."""
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("arccosh", x)
    u = F.sub(_clamped(x, _BIG), 1.0)
    near = log1p(F.add(u, F.sqrt(F.mul(u, F.add(u, 2.0)))))
    far = F.add(F.log(F.maximum(x, _BIG)), _LN2)
    out = F.where(F.greater(x, _BIG), far, near)
    return F.where(F.less(x, 1.0), np.nan, out)         # outside the domain: NaN, as NumPy


def arctanh(x):
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return complex_parts.complex_math("arctanh", x)
    s, t = _sign_split(x)
    return F.mul(s, F.mul(log1p(F.div(F.mul(t, 2.0), F.sub(1.0, t))), 0.5))


def log2(x):
    return F.div(F.log(F.as_floating(x)), _LN2)


def log10(x):
    return F.div(F.log(F.as_floating(x)), _LN10)


def exp2(x):
    x = F.as_floating(x)
    return F.pow(F.full((), 2.0, x.dtype), x)


def floor(x):
    return round_(x, "floor")


def ceil(x):
    return round_(x, "ceil")


def trunc(x):
    return round_(x, "trunc")


def rint(x):
    return round_(x, "rint")


def round(x, decimals=0):
    """NumPy's round: half to even, at ``decimals`` places (x * 10**d rounded, then / 10**d)."""
    x = F.as_var(x)
    if not isinstance(decimals, numbers.Integral):
        raise ArgumentError(f"round: decimals must be an int, got {decimals!r}")
    if x.dtype.kind != "f":
        if decimals >= 0:
            return x
        scale = 10 ** (-decimals)                # whole numbers: halves to even, as NumPy
        q = F.floor_divide(x, scale)
        twice_rest = F.mul(F.sub(x, F.mul(q, scale)), 2)
        up = F.logical_or(F.greater(twice_rest, scale),
                          F.logical_and(F.equal(twice_rest, scale), F.not_equal(mod(q, 2), 0)))
        return F.mul(F.add(q, F.cast(up, q.dtype)), scale)
    if decimals == 0:
        return round_(x, "rint")
    if decimals > 0:
        scale = 10.0 ** decimals
        return F.div(round_(F.mul(x, scale), "rint"), scale)
    scale = 10.0 ** (-decimals)
    return F.mul(round_(F.div(x, scale), "rint"), scale)


def mod(x, y):
    """NumPy's ``%``: the remainder with the divisor's sign (0 for an integer divisor of 0)."""
    x, y = F.promote(x, y)
    if x.dtype.kind == "b":
        x, y = F.cast(x, np.int32), F.cast(y, np.int32)     # NumPy: bool % bool is int8
    if x.dtype.kind != "f":
        zero = F.equal(y, 0)
        safe = F.where(zero, F.ones_like(y), y)        # no division by zero, even a discarded one
        r = F.sub(x, F.mul(F.floor_divide(x, safe), safe))
        return F.where(zero, F.zeros_like(r), r)
    r = fmod(x, y)
    wrong_side = F.logical_and(F.not_equal(r, 0), F.not_equal(F.less(r, 0), F.less(y, 0)))
    return F.where(wrong_side, F.add(r, y), r)


def floor_divide(x, y):
    """NumPy's ``//``: integers as the primitive divides them; floats as NumPy's divmod does
    (the exact remainder first, so ``x // y`` agrees with ``x % y``); derivative zero."""
    x, y = F.promote(x, y)
    if x.dtype.kind != "f":
        return F.floor_divide(x, y)
    r = fmod(x, y)
    q = F.div(F.sub(x, r), y)
    wrong_side = F.logical_and(F.not_equal(r, 0), F.not_equal(F.less(r, 0), F.less(y, 0)))
    q = F.where(wrong_side, F.sub(q, 1.0), q)
    whole = round_(q, "floor")
    whole = F.where(F.greater(F.sub(q, whole), 0.5), F.add(whole, 1.0), whole)
    return F.stop_gradient(F.where(F.equal(y, 0), F.div(x, y), whole))


def logaddexp(x, y):
    """log(exp(x) + exp(y)) without overflow: the larger plus log1p(exp(-|x - y|)).

    Written as a choice between two smooth formulas (x + log1p(exp(y - x)) where x >= y, and
    its mirror) rather than with max and abs, so derivatives of every order are right at a tie.
    """
    x, y = F.promote(F.as_floating(x), F.as_floating(y))
    same_inf = F.logical_and(F.equal(x, y), F.equal(F.abs(x), np.inf))
    d = F.where(same_inf, F.zeros_like(x), F.sub(y, x))         # no inf - inf below
    x_wins = F.greater_equal(x, y)
    out = F.add(F.where(x_wins, x, y), log1p(F.exp(F.where(x_wins, d, F.neg(d)))))
    return F.where(same_inf, x, out)


def _either_part(test, x):
    """``test`` of a complex number: true where it holds for the real or the imaginary part."""
    return F.logical_or(test(complex_parts.real(x)), test(complex_parts.imag(x)))


def isnan(x):
    x = F.as_var(x)
    if x.dtype.kind == "c":
        return _either_part(isnan, x)
    return F.not_equal(x, x) if x.dtype.kind == "f" else F.full(x.shape, False, bool)


def isinf(x):
    x = F.as_var(x)
    if x.dtype.kind == "c":
        return _either_part(isinf, x)
    return F.equal(F.abs(x), np.inf) if x.dtype.kind == "f" else F.full(x.shape, False, bool)


def isfinite(x):
    x = F.as_var(x)
    if x.dtype.kind == "c":
        return F.logical_and(isfinite(complex_parts.real(x)), isfinite(complex_parts.imag(x)))
    return F.less(F.abs(x), np.inf) if x.dtype.kind == "f" else F.full(x.shape, True, bool)


def nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    x = F.as_var(x)
    if x.dtype.kind != "f":
        return x
    info = np.finfo(x.dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf

    def const(v):
        return F.full(x.shape, v, x.dtype)

    out = F.where(isnan(x), const(nan), x)
    out = F.where(F.equal(x, np.inf), const(hi), out)
    return F.where(F.equal(x, -np.inf), const(lo), out)


def reciprocal(x):
    return F.div(1.0, F.as_floating(x))


def deg2rad(x):
    return F.mul(F.as_floating(x), math.pi / 180.0)


def rad2deg(x):
    return F.mul(F.as_floating(x), 180.0 / math.pi)


def hypot(x, y):
    x, y = F.promote(F.as_floating(x), F.as_floating(y))
    return F.sqrt(F.add(F.mul(x, x), F.mul(y, y)))


# -- reductions ----------------------------------------------------------------------------------

def _axes_last(x, axes):
    """``x`` with ``axes`` moved to the end and merged into one: (kept..., n)."""
    kept = tuple(i for i in range(x.ndim) if i not in axes)
    moved = F.transpose(x, kept + tuple(axes))
    n = math.prod(x.shape[a] for a in axes)
    return F.reshape(moved, tuple(x.shape[i] for i in kept) + (n,)), n


def _int_accumulator(x):
    """NumPy's sum/prod accumulate narrow integers and bool in 64 bits (``api.accumulator``)."""
    return F.accumulator(x)


def prod(x, axis=None, keepdims=False, dtype=None):
    """Product over ``axis``: pairs multiplied in log2(n) rounds (see the module docstring);
    ``dtype``: multiplied in that dtype (else NumPy's accumulator)."""
    x = _int_accumulator(F.as_var(x)) if dtype is None else F.cast(x, dtype)
    axes = F.normalize_axes("prod", x.ndim, axis)
    flat, n = _axes_last(x, axes)
    if n == 0:
        out = F.ones(flat.shape[:-1], x.dtype)
    else:
        while n > 1:
            if n % 2:
                flat = F.concatenate([flat, F.ones(flat.shape[:-1] + (1,), x.dtype)], -1)
                n += 1
            pairs = F.reshape(flat, flat.shape[:-1] + (n // 2, 2))
            flat = F.mul(F.getitem(pairs, (Ellipsis, 0)), F.getitem(pairs, (Ellipsis, 1)))
            n //= 2
        out = F.reshape(flat, flat.shape[:-1])
    if keepdims:
        out = F.reshape(out, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return out


def _scan_input(name, x, axis):
    x = F.as_var(x)
    if axis is None:
        return F.reshape(x, (-1,)), 0
    return x, F.normalize_axis(name, x.ndim, axis)


def cumsum(x, axis=None):
    x, axis = _scan_input("cumsum", x, axis)
    return sorting.cumsum(_int_accumulator(x), axis)


def cumprod(x, axis=None):
    """Running product: a doubling scan, y_i *= y_(i - s) for s = 1, 2, 4, ... (log2(n) rounds)."""
    x, axis = _scan_input("cumprod", x, axis)
    x = _int_accumulator(x)
    n = x.shape[axis]
    s = 1
    while s < n:
        ones_shape = tuple(s if i == axis else d for i, d in enumerate(x.shape))
        head = F.slice(x, (0,) * x.ndim, tuple(n - s if i == axis else d for i, d in enumerate(x.shape)))
        x = F.mul(x, F.concatenate([F.ones(ones_shape, x.dtype), head], axis))
        s *= 2
    return x


def var(x, axis=None, ddof=0, keepdims=False):
    if not isinstance(ddof, numbers.Real) or isinstance(ddof, bool):
        raise ArgumentError(f"var: ddof must be a number (0 for the population variance, 1 for "
                            f"the sample variance), got {type(ddof).__name__}")
    x = F.as_floating(x)
    axes = F.normalize_axes("var", x.ndim, axis)
    n = math.prod(x.shape[a] for a in axes)
    if n - ddof <= 0:
        raise ShapeError(f"var: {n} elements with ddof={ddof} leave no degrees of freedom")
    d = F.sub(x, F.mean(x, axes, keepdims=True))
    return F.div(F.sum(F.mul(d, d), axes, keepdims), float(n - ddof))


def std(x, axis=None, ddof=0, keepdims=False):
    return F.sqrt(var(x, axis, ddof, keepdims))


def any(x, axis=None, keepdims=False):
    return F.greater(F.sum(F.cast(F.as_var(x), bool), axis, keepdims), 0)


def all(x, axis=None, keepdims=False):
    return F.equal(F.sum(F.logical_not(F.as_var(x)), axis, keepdims), 0)


def ptp(x, axis=None, keepdims=False):
    return F.sub(F.max(x, axis, keepdims), F.min(x, axis, keepdims))


def count_nonzero(x, axis=None, keepdims=False):
    """``count_nonzero``: how many elements are not zero (int64)."""
    return F.sum(F.not_equal(F.as_var(x), 0), axis, keepdims)


# -- sorting -------------------------------------------------------------------------------------

def argsort(x, axis=-1):
    x, axis = _scan_input("argsort", x, axis)
    return sorting.argsort(x, axis)


def sort(x, axis=-1):
    """Sorted along ``axis``: the values ``argsort`` picks, so the derivative is a gather's."""
    x, axis = _scan_input("sort", x, axis)
    return F.take_along_axis(x, sorting.argsort(x, axis), axis)


# -- movement ------------------------------------------------------------------------------------

def ravel(x):
    return F.reshape(x, (-1,))


def moveaxis(x, source, destination):
    x = F.as_var(x)
    src = [F.normalize_axis("moveaxis", x.ndim, a) for a in _as_tuple(source)]
    dst = [F.normalize_axis("moveaxis", x.ndim, a) for a in _as_tuple(destination)]
    if len(src) != len(dst):
        raise ArgumentError("moveaxis: source and destination need the same number of axes")
    order = [i for i in range(x.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return F.transpose(x, order)


def _as_tuple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def roll(x, shift, axis=None):
    x = F.as_var(x)
    if axis is None:
        return F.reshape(roll(F.reshape(x, (-1,)), shift, 0), x.shape)
    shifts, axes = _as_tuple(shift), _as_tuple(axis)
    if len(shifts) == 1 and len(axes) > 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ArgumentError(f"roll: {len(shifts)} shifts for {len(axes)} axes")
    for s, a in zip(shifts, axes):
        a = F.normalize_axis("roll", x.ndim, a)
        n = x.shape[a]
        s = int(s) % n if n else 0
        if s:
            x = F.concatenate([_take_range(x, a, n - s, n), _take_range(x, a, 0, n - s)], a)
    return x


def _take_range(x, axis, start, stop):
    starts = tuple(start if i == axis else 0 for i in range(x.ndim))
    limits = tuple(stop if i == axis else d for i, d in enumerate(x.shape))
    return F.slice(x, starts, limits)


def repeat(x, repeats, axis=None):
    x = F.as_var(x)
    if axis is None:
        x, axis = F.reshape(x, (-1,)), 0
    axis = F.normalize_axis("repeat", x.ndim, axis)
    n = x.shape[axis]
    if isinstance(repeats, numbers.Integral):
        if repeats < 0:
            raise ArgumentError(f"repeat: repeats must be >= 0, got {repeats}")
        wide = F.expand_dims(x, axis + 1)
        wide = F.broadcast_to(wide, x.shape[:axis + 1] + (int(repeats),) + x.shape[axis + 1:])
        return F.reshape(wide, x.shape[:axis] + (n * int(repeats),) + x.shape[axis + 1:])
    reps = np.asarray(repeats)
    if reps.size == 0 and n == 0:            # no elements, no counts: nothing to repeat
        reps = reps.astype(np.int64)
    if reps.dtype.kind not in "iu" or reps.shape not in ((n,), (1,)) or (reps < 0).any():
        raise ArgumentError(f"repeat: repeats must be an int or {n} non-negative ints, got {repeats!r}")
    return F.take(x, np.repeat(np.arange(n), np.broadcast_to(reps, (n,))), axis)


def tile(x, reps):
    x = F.as_var(x)
    reps = tuple(int(r) for r in _as_tuple(reps))
    if builtins.any(r < 0 for r in reps):
        raise ArgumentError(f"tile: repetitions must be >= 0, got {reps}")
    ndim = builtins.max(x.ndim, len(reps))
    reps = (1,) * (ndim - len(reps)) + reps
    x = F.reshape(x, (1,) * (ndim - x.ndim) + x.shape)
    spread = tuple(d for pair in zip((1,) * ndim, x.shape) for d in pair)
    wide = tuple(d for pair in zip(reps, x.shape) for d in pair)
    out = F.broadcast_to(F.reshape(x, spread), wide)
    return F.reshape(out, tuple(r * d for r, d in zip(reps, x.shape)))


def split(x, indices_or_sections, axis=0):
    """A list of pieces along ``axis``: n equal sections, or cut at the given indices."""
    return _split("split", x, indices_or_sections, axis, equal=True)


def array_split(x, indices_or_sections, axis=0):
    """``split``, with n sections that may differ in length by one (the first ones longer)."""
    return _split("array_split", x, indices_or_sections, axis, equal=False)


def _split(name, x, indices_or_sections, axis, equal):
    x = F.as_var(x)
    axis = F.normalize_axis(name, x.ndim, axis)
    n = x.shape[axis]
    if isinstance(indices_or_sections, numbers.Integral):
        k = int(indices_or_sections)
        if k <= 0:
            raise ArgumentError(f"{name}: the number of sections must be positive, got {k}")
        if equal and n % k:
            raise ShapeError(f"{name}: {k} sections do not divide an axis of {n}; use array_split "
                             "or give the indices to cut at")
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        cuts = [int(c) for c in np.cumsum(sizes)[:-1]]
    else:
        cuts = [builtins.min(builtins.max(int(c) + (n if c < 0 else 0), 0), n)
                for c in indices_or_sections]
    bounds = [0] + cuts + [n]
    return [_take_range(x, axis, a, builtins.max(a, b)) for a, b in zip(bounds, bounds[1:])]


def hstack(xs):
    xs = [F.as_var(x) for x in xs]
    return F.concatenate(xs, 0 if xs and xs[0].ndim == 1 else 1)


def vstack(xs):
    xs = [F.reshape(v, (1,) + v.shape) if v.ndim < 2 else v
          for v in (F.reshape(F.as_var(x), (1,)) if F.as_var(x).ndim == 0 else F.as_var(x)
                    for x in xs)]
    return F.concatenate(xs, 0)


def diagonal(x, offset=0, axis1=0, axis2=1):
    """The diagonal as a new last axis: a reshape and one strided slice (derivative: a pad)."""
    x = F.as_var(x)
    if x.ndim < 2:
        raise ShapeError(f"diagonal: needs at least 2 dimensions, got shape {x.shape}")
    a1, a2 = F.normalize_axis("diagonal", x.ndim, axis1), F.normalize_axis("diagonal", x.ndim, axis2)
    if a1 == a2:
        raise ShapeError("diagonal: axis1 and axis2 must differ")
    rest = tuple(i for i in range(x.ndim) if i not in (a1, a2))
    m = F.transpose(x, rest + (a1, a2))
    rows, cols = m.shape[-2:]
    lead = m.shape[:-2]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    d = builtins.max(0, builtins.min(rows - r0, cols - c0))
    if d == 0:
        return F.zeros(lead + (0,), x.dtype)
    block = F.slice(m, (0,) * len(lead) + (r0, c0), lead + (r0 + d, cols))
    width = cols - c0
    flat = F.reshape(block, lead + (d * width,))
    return F.slice(flat, (0,) * len(lead) + (0,), lead + ((d - 1) * (width + 1) + 1,),
                   (1,) * len(lead) + (width + 1,))


def trace(x, offset=0, axis1=0, axis2=1):
    return F.sum(diagonal(x, offset, axis1, axis2), -1)


def diag(v, k=0):
    """The k-th diagonal of a matrix, or the square matrix with ``v`` on its k-th diagonal."""
    v = F.as_var(v)
    if v.ndim == 2:
        return diagonal(v, k)
    if v.ndim != 1:
        raise ShapeError(f"diag: needs a 1-D or 2-D operand, got shape {v.shape}")
    n, a = v.shape[0], builtins.abs(int(k))
    if n == 0:
        return F.zeros((a, a), v.dtype)
    # each value followed by n zeros, read back n to a row: the values land on the diagonal
    wide = F.pad(F.reshape(v, (n, 1)), (0, 0), (0, n))
    square = F.reshape(F.slice(F.reshape(wide, (n * (n + 1),)), (0,), (n * n,)), (n, n))
    lo, hi = ((0, a), (a, 0)) if k >= 0 else ((a, 0), (0, a))
    return F.pad(square, lo, hi)


def _triangle(name, x, keep):
    x = F.as_var(x)
    if x.ndim < 2:
        raise ShapeError(f"{name}: needs at least 2 dimensions, got shape {x.shape}")
    mask = F.broadcast_to(F.constant(keep(x.shape[-2], x.shape[-1])), x.shape)
    return F.where(mask, x, F.zeros_like(x))


def triu(x, k=0):
    return _triangle("triu", x, lambda n, m: ~np.tri(n, m, k - 1, dtype=bool))


def tril(x, k=0):
    return _triangle("tril", x, lambda n, m: np.tri(n, m, k, dtype=bool))


def meshgrid(*xs, indexing="xy"):
    if indexing not in ("xy", "ij"):
        raise ArgumentError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    xs = [F.reshape(x, (-1,)) for x in xs]
    shape = [x.shape[0] for x in xs]
    if indexing == "xy" and len(xs) > 1:
        shape[0], shape[1] = shape[1], shape[0]
    out = []
    for i, x in enumerate(xs):
        dim = {0: 1, 1: 0}.get(i, i) if indexing == "xy" and len(xs) > 1 else i
        out.append(F.broadcast_in_dim(x, tuple(shape), (dim,)))
    return out


# -- products ------------------------------------------------------------------------------------

def outer(a, b):
    a, b = F.promote(a, b)
    a, b = F.reshape(a, (-1,)), F.reshape(b, (-1,))
    return F.mul(F.reshape(a, (a.shape[0], 1)), F.reshape(b, (1, b.shape[0])))


def tensordot(a, b, axes=2):
    a, b = F.promote(a, b)
    if isinstance(axes, numbers.Integral):
        if not 0 <= axes <= builtins.min(a.ndim, b.ndim):
            raise ShapeError(f"tensordot: cannot contract {axes} axes of shapes {a.shape} and {b.shape}")
        ax_a, ax_b = list(range(a.ndim - axes, a.ndim)), list(range(axes))
    else:
        try:
            ax_a, ax_b = (list(_as_tuple(t)) for t in axes)
        except (TypeError, ValueError):
            raise ArgumentError(f"tensordot: axes must be an int or a pair of axis lists, got {axes!r}")
        if len(ax_a) != len(ax_b):
            raise ShapeError(f"tensordot: {len(ax_a)} axes of a against {len(ax_b)} of b")
        ax_a = [F.normalize_axis("tensordot", a.ndim, i) for i in ax_a]
        ax_b = [F.normalize_axis("tensordot", b.ndim, i) for i in ax_b]
    for i, j in zip(ax_a, ax_b):
        if a.shape[i] != b.shape[j]:
            raise ShapeError(f"tensordot: axis {i} of {a.shape} (length {a.shape[i]}) and axis {j} "
                             f"of {b.shape} (length {b.shape[j]}) differ; the contracted axes must "
                             "have equal lengths: choose other axes= or transpose an operand")
    free_a = [i for i in range(a.ndim) if i not in ax_a]
    free_b = [i for i in range(b.ndim) if i not in ax_b]
    k = math.prod(a.shape[i] for i in ax_a)
    am = F.reshape(F.transpose(a, free_a + ax_a), (math.prod(a.shape[i] for i in free_a), k))
    bm = F.reshape(F.transpose(b, ax_b + free_b), (k, math.prod(b.shape[i] for i in free_b)))
    return F.reshape(F.matmul(am, bm), tuple(a.shape[i] for i in free_a) + tuple(b.shape[i] for i in free_b))


def dot(a, b):
    """NumPy's dot: a product for scalars, matmul up to 2-D, last axis of a with the second to
    last of b beyond."""
    a, b = F.promote(a, b)
    if a.ndim == 0 or b.ndim == 0:
        return F.mul(a, b)
    if a.ndim <= 2 and b.ndim <= 2:
        return F.matmul(a, b)
    return tensordot(a, b, ([a.ndim - 1], [builtins.max(b.ndim - 2, 0)]))


def inner(a, b):
    a, b = F.promote(a, b)
    if a.ndim == 0 or b.ndim == 0:
        return F.mul(a, b)
    return tensordot(a, b, ([a.ndim - 1], [b.ndim - 1]))


def vdot(a, b):
    return F.sum(F.mul(F.reshape(a, (-1,)), F.reshape(b, (-1,))))


def einsum(subscripts, *operands):
    """Einstein summation: repeated letters in one operand take a diagonal, letters no longer
    needed are summed, and each pair of operands is contracted by one batched matmul."""
    if not isinstance(subscripts, str):
        raise ArgumentError("einsum: the first argument must be the subscripts string, e.g. 'ij,jk->ik'")
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise ArgumentError("einsum: '...' is not supported; name every axis with a letter")
    lhs, arrow, out = spec.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(operands) or not operands:
        raise ArgumentError(f"einsum: {subscripts!r} names {len(ins)} operands but "
                            f"{len(operands)} were given; give one subscript group per operand "
                            "(separated by commas)")
    if not builtins.all(s.isalpha() for s in ins + ([out] if out else [])):
        raise ArgumentError(f"einsum: subscripts must be letters, got {subscripts!r}")
    if not arrow:
        counts = {c: lhs.count(c) for c in set(lhs) if c.isalpha()}
        out = "".join(sorted(c for c, k in counts.items() if k == 1))
    if len(set(out)) != len(out) or builtins.any(c not in lhs for c in out):
        raise ArgumentError(f"einsum: output subscripts {out!r} must be distinct letters of the inputs")
    xs = F.promote(*operands) if len(operands) > 1 else [F.as_var(operands[0])]
    sizes = {}
    terms = []
    for x, s in zip(xs, ins):
        if x.ndim != len(s):
            raise ShapeError(f"einsum: subscripts {s!r} name {len(s)} axes of an operand of shape {x.shape}")
        for c, d in zip(s, x.shape):
            if sizes.setdefault(c, d) != d:
                raise ShapeError(f"einsum: axis {c!r} has lengths {sizes[c]} and {d} in "
                                 f"{subscripts!r}; a letter must name axes of one length (give "
                                 "the axes different letters, or fix the operands' shapes)")
        terms.append(_einsum_diagonals(x, s))
    x, s = _einsum_sum_unneeded(*terms[0], out + "".join(t[1] for t in terms[1:]))
    for i, (y, t) in enumerate(terms[1:], 1):
        later = out + "".join(u for _, u in terms[i + 1:])
        x, s = _einsum_sum_unneeded(x, s, later + t)
        y, t = _einsum_sum_unneeded(y, t, later + s)
        x, s = _einsum_pair(x, s, y, t, later)
    x, s = _einsum_sum_unneeded(x, s, out)
    return F.transpose(x, tuple(s.index(c) for c in out))


def _einsum_diagonals(x, s):
    """Letters repeated within one operand's subscripts: keep only their diagonal."""
    while len(set(s)) != len(s):
        c = next(c for c in s if s.count(c) > 1)
        i = s.index(c)
        j = s.index(c, i + 1)
        x = diagonal(x, 0, i, j)
        s = "".join(ch for k, ch in enumerate(s) if k not in (i, j)) + c
    return x, s


def _einsum_sum_unneeded(x, s, needed):
    axes = tuple(i for i, c in enumerate(s) if c not in needed)
    if not axes:
        return x, s
    return F.sum(x, axes), "".join(c for c in s if c in needed)


def _einsum_pair(x, s, y, t, later):
    batch = [c for c in s if c in t and c in later]
    contract = [c for c in s if c in t and c not in later]
    left = [c for c in s if c not in t]
    right = [c for c in t if c not in s]

    def size(v, sub, letters):
        return math.prod(v.shape[sub.index(c)] for c in letters)

    def arrange(v, sub, order, groups):
        v = F.transpose(v, tuple(sub.index(c) for c in order))
        return F.reshape(v, tuple(size(v, "".join(order), g) for g in groups))

    bx = arrange(x, s, batch + left + contract, [batch, left, contract])
    by = arrange(y, t, batch + contract + right, [batch, contract, right])
    z = F.matmul(bx, by)
    shape = tuple(x.shape[s.index(c)] for c in batch + left) + tuple(y.shape[t.index(c)] for c in right)
    return F.reshape(z, shape), "".join(batch + left + right)


# -- constants -----------------------------------------------------------------------------------

def eye(n, m=None, k=0, dtype=np.float64):
    return F.constant(np.eye(n, m, k, dtype=dtype))


def linspace(start, stop, num=50, endpoint=True, dtype=None):
    return F.constant(np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype))


# -- linear algebra ------------------------------------------------------------------------------

def _matrices(name, a):
    a = F.as_floating(a)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"linalg.{name}: needs square matrices (..., n, n), got shape {a.shape}")
    return a


def solve(a, b):
    """NumPy 2's solve: ``b`` is one vector (..., n) only when it is 1-D; else (..., n, k)."""
    a = _matrices("solve", a)
    a, b = F.promote(a, F.as_floating(b))
    vector = b.ndim == 1
    if vector:
        b = F.reshape(b, b.shape + (1,))
    if b.ndim < 2 or b.shape[-2] != a.shape[-1]:
        raise ShapeError(f"linalg.solve: right-hand side of shape {b.shape} does not fit "
                         f"matrices of shape {a.shape}: it needs {a.shape[-1]} rows (a vector of "
                         f"length {a.shape[-1]}, or an ({a.shape[-1]}, k) matrix of k columns)")
    batch = F.broadcast_shapes("linalg.solve", a.shape[:-2], b.shape[:-2])
    x = factorizations.solve(F.broadcast_to(a, batch + a.shape[-2:]),
                             F.broadcast_to(b, batch + b.shape[-2:]))
    return F.reshape(x, x.shape[:-1]) if vector else x


def inv(a):
    a = _matrices("inv", a)
    return factorizations.solve(a, F.broadcast_to(F.constant(np.eye(a.shape[-1], dtype=a.dtype)), a.shape))


def slogdet(a):
    return factorizations.slogdet(_matrices("slogdet", a))


def det(a):
    sign, logabs = slogdet(a)
    return F.mul(sign, F.exp(logabs))


def cholesky(a):
    return factorizations.cholesky(_matrices("cholesky", a))


def norm(x, ord=None, axis=None, keepdims=False):
    """NumPy's norm: vector norms (2 by default, any p, inf, -inf, 0) and matrix norms
    ('fro', 'nuc', 1, -1, 2, -2, inf, -inf; 2, -2 and 'nuc' from the singular values)."""
    x = F.as_floating(x)
    if axis is None and ord is None:
        x = F.abs(x) if x.dtype.kind == "c" else x            # the magnitudes of complex numbers
        out = F.sqrt(F.sum(F.mul(x, x)))
        return F.reshape(out, (1,) * x.ndim) if keepdims else out
    if axis is None:
        axis = tuple(range(x.ndim))
    axes = F.normalize_axes("linalg.norm", x.ndim, axis)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, tuple(_as_tuple(axis)), keepdims)
    raise ShapeError(f"linalg.norm: axis must name 1 or 2 axes, got {axis!r}")


def _vector_norm(x, ord, axes, keepdims):
    if x.dtype.kind == "c":          # a vector norm sees only the magnitudes
        x = F.abs(x)
    if ord is None or ord == 2:
        return F.sqrt(F.sum(F.mul(x, x), axes, keepdims))
    if ord == np.inf:
        return F.max(F.abs(x), axes, keepdims)
    if ord == -np.inf:
        return F.min(F.abs(x), axes, keepdims)
    if ord == 0:
        return F.cast(F.sum(F.not_equal(x, 0), axes, keepdims), x.dtype)
    if ord == 1:
        return F.sum(F.abs(x), axes, keepdims)
    if isinstance(ord, str):
        raise ArgumentError(f"linalg.norm: ord {ord!r} is for matrices; give two axes")
    p = float(ord)
    return F.pow(F.sum(F.pow(F.abs(x), p), axes, keepdims), 1.0 / p)


def _matrix_norm(x, ord, axis, keepdims):
    if x.dtype.kind == "c":
        if ord in (2, -2, "nuc"):
            raise DTypeError(f"linalg.norm: the {ord!r} norm of a complex matrix needs a complex "
                             "singular value decomposition, which vkml does not have yet; use "
                             "'fro', 1, -1, inf or -inf")
        x = F.abs(x)                 # the others see only the magnitudes
    r, c = (F.normalize_axis("linalg.norm", x.ndim, a) for a in axis)
    if r == c:
        raise ShapeError("linalg.norm: the two axes must differ")
    if ord is None or ord == "fro":
        return F.sqrt(F.sum(F.mul(x, x), (r, c), keepdims))
    if ord in (1, -1, np.inf, -np.inf):
        along, across = (r, c) if ord in (1, -1) else (c, r)
        sums = F.sum(F.abs(x), along, keepdims=True)
        pick = F.max if ord > 0 else F.min
        out = pick(sums, across, keepdims=True)
        return out if keepdims else F.reshape(out, tuple(d for i, d in enumerate(x.shape) if i not in (r, c)))
    if ord in (2, -2, "nuc"):
        rest = tuple(i for i in range(x.ndim) if i not in (r, c))
        s = decompositions.singular_values(F.transpose(x, rest + (r, c)))
        out = F.sum(s, -1) if ord == "nuc" else (F.max if ord == 2 else F.min)(s, -1)
        if keepdims:
            out = F.reshape(out, tuple(1 if i in (r, c) else d for i, d in enumerate(x.shape)))
        return out
    raise ArgumentError(f"linalg.norm: matrix ord {ord!r} is not a norm; use 'fro', 'nuc', 1, -1, "
                        "2, -2, inf or -inf")

