"""The two index-order matrix products, written in NumPy independently of the C they check.

``plain_loop(a, b)``: ``acc = 0; acc = acc + a[..., k] * b[k, ...]`` for k in order, each product and
each sum rounded to the element type (NumPy's float operations round exactly as C's do).

``fused_loop(a, b)``: ``acc = fma(a[..., k], b[k, ...], acc)`` for k in order, each step rounded once.
NumPy has no fused multiply-add, so each step is computed exactly and rounded once:

- float32: the product of two float32 values is exact in float64, and their exact sum with the
  accumulator is ``s + t`` (Knuth's two-sum); ``s`` rounded to odd (moved one unit towards ``t``
  when ``t`` is not zero and ``s`` is even) and then to float32 is the correctly rounded sum,
  because float64 has more than two bits beyond float32's (Boldo and Melquiond's rounding to odd);
- float64: Dekker's exact product ``p + e``, the two-sum ``c + p = s + t``, then ``t + e`` rounded
  to odd and added to ``s`` (the same authors' emulated FMA).  Where that needs values the exact
  transformations do not cover (infinities, NaN, products that under- or overflow) the step is
  done in Python's exact fractions, whose ``float()`` rounds correctly.

Signed zeros follow IEEE: an exact zero sum is -0.0 only when the product and the accumulator are
both -0.0.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


def plain_loop(a, b):
    """``a @ b`` (batched over leading axes) with each term a rounded product then a rounded sum."""
    acc = np.zeros(a.shape[:-1] + b.shape[-1:], a.dtype)
    with np.errstate(all="ignore"):              # inf - inf and overflow are expected inputs
        for k in range(a.shape[-1]):
            acc = acc + a[..., :, k, None] * b[..., None, k, :]
    return acc


def fused_loop(a, b):
    """``a @ b`` (batched over leading axes) with each term one fused multiply-add."""
    acc = np.zeros(a.shape[:-1] + b.shape[-1:], a.dtype)
    with np.errstate(all="ignore"):
        for k in range(a.shape[-1]):
            x, y = np.broadcast_arrays(a[..., :, k, None], b[..., None, k, :])
            acc = fma_step(x, y, acc)
    return acc


def fma_step(x, y, c):
    """``fma(x, y, c)`` elementwise (arrays of one shape and float dtype), rounded once."""
    return (_fma32 if x.dtype == np.float32 else _fma64)(x, y, c)


def _two_sum(x, y):
    s = x + y
    v = s - x
    return s, (x - (s - v)) + (y - v)


def _to_odd(s, t):
    """``s + t`` (``s`` its rounding to nearest) rounded to odd instead."""
    inexact = (t != 0) & np.isfinite(t)
    even = (s.view(np.int64) & 1) == 0
    move = inexact & even
    return np.where(move, np.nextafter(s, np.where(t > 0, np.inf, -np.inf)), s)


def _fma32(x, y, c):
    p = x.astype(np.float64) * y.astype(np.float64)          # exact
    c64 = c.astype(np.float64)
    s, t = _two_sum(p, c64)
    exact = np.where(np.isfinite(s), _to_odd(s, t), p + c64)
    return exact.astype(np.float32)


def _split(x):
    big = 134217729.0 * x                                     # 2^27 + 1 (Veltkamp)
    hi = big - (big - x)
    return hi, x - hi


def _fma64(x, y, c):
    p = x * y
    xh, xl = _split(x)
    yh, yl = _split(y)
    e = ((xh * yh - p) + xh * yl + xl * yh) + xl * yl        # p + e == x * y exactly
    s, t = _two_sum(c, p)
    v, w = _two_sum(t, e)
    v = _to_odd(v, w)
    out = np.where(v == 0, s, s + v)
    ok = lambda z: np.isfinite(z) & ((z == 0) | (np.abs(z) > 2.0 ** -900)) & (np.abs(z) < 2.0 ** 900)
    safe = ok(x) & ok(y) & ok(c) & ok(p) & ((x == 0) | (y == 0) | (np.abs(p) > 2.0 ** -900))
    for i in zip(*np.nonzero(~safe)):
        out[i] = _exact_fma(float(x[i]), float(y[i]), float(c[i]))
    return out


def _exact_fma(x, y, c):
    """One fused multiply-add of Python floats, by exact arithmetic."""
    if not (np.isfinite(x) and np.isfinite(y)):
        return x * y + c                                     # inf/NaN products are exact
    if not np.isfinite(c):
        return c
    exact = Fraction(x) * Fraction(y) + Fraction(c)
    if exact == 0:
        product_negative = (x == 0 or y == 0) and (np.signbit(x) != np.signbit(y))
        both_negative = x * y == 0 and product_negative and np.signbit(c)
        return -0.0 if both_negative else 0.0
    try:
        return float(exact)
    except OverflowError:
        return float("inf") if exact > 0 else float("-inf")
