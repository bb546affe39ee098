"""Elementwise primitives for the NumPy namespace: the ones a composition would make inaccurate.

Each is a primitive only because the C library has the function and writing
it with the existing primitives would lose accuracy (or could not be written
at all); everything else in ``vkml.numpy`` is composed:

- ``log1p`` / ``expm1``: ``log(1 + x)`` and ``exp(x) - 1`` lose every digit
  for |x| below the float epsilon; ``arcsinh``, ``arctanh``, ``sinh`` and
  ``logaddexp`` are written with them and stay within a few ulps of NumPy.
- ``atan2``: the one inverse-trigonometric primitive; ``arcsin(x)`` is
  ``atan2(x, sqrt((1 - x)(1 + x)))``, ``arccos`` and ``arctan`` likewise,
  each within a few ulps (the product ``(1 - x)(1 + x)`` keeps the digits
  that ``1 - x*x`` would lose near |x| = 1).
- ``erf``: not expressible with the others at all.
- ``fmod``: the exact remainder (``x - trunc(x / y) * y`` rounds ``x / y``
  and can be wrong by a whole ``y``); NumPy's ``mod`` is built on it.
- ``round``: floor, ceil, rint (half to even, NumPy's ``round``) and trunc
  in one primitive with a ``mode``; a cast to an integer and back would be
  wrong beyond 2**63 and for NaN and infinities.  Its derivative is zero.

Every one is elementwise, so it fuses into the compiled tiers' loops like
``sin`` does; their C and CUDA spellings are the C library's names.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError, DTypeError
from ..ir import dtype_name
from . import api as F
from .core import bind
from .elementwise import binary_float_rule, elementwise_primitive, sum_tangents, unary_float_rule


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

log1p_p = elementwise_primitive(
    "log1p", unary_float_rule("log1p"), np.log1p, "log(1 + x), accurate for tiny x.",
    jvp=lambda p, t, o: [F.div(t[0], F.add(p[0], 1.0))])

expm1_p = elementwise_primitive(
    "expm1", unary_float_rule("expm1"), np.expm1, "exp(x) - 1, accurate for tiny x.",
    jvp=lambda p, t, o: [F.mul(t[0], F.add(o[0], 1.0))])


def _erf_impl(x):
    """NumPy has no erf: Python's ``math.erf`` (the C library's) per element, in float64."""
    x = np.asarray(x)
    flat = np.fromiter((math.erf(v) for v in x.astype(np.float64).ravel()), np.float64, x.size)
    return flat.reshape(x.shape).astype(x.dtype, copy=False)


erf_p = elementwise_primitive(
    "erf", unary_float_rule("erf"), _erf_impl, "The error function (2/sqrt(pi)) int_0^x exp(-t^2) dt.",
    jvp=lambda p, t, o: [F.mul(t[0], F.mul(_TWO_OVER_SQRT_PI, F.exp(F.neg(F.mul(p[0], p[0])))))])


def _atan2_jvp(p, t, o):
    # d atan2(y, x) = (x dy - y dx) / (x^2 + y^2)
    y, x = p
    r2 = F.add(F.mul(x, x), F.mul(y, y))
    ty = None if t[0] is None else F.mul(t[0], F.div(x, r2))
    tx = None if t[1] is None else F.mul(t[1], F.div(F.neg(y), r2))
    return [sum_tangents(ty, tx)]


atan2_p = elementwise_primitive(
    "atan2", binary_float_rule("atan2"), np.arctan2,
    "The angle of the point (x, y): atan2(y, x) in [-pi, pi].", jvp=_atan2_jvp)


def _fmod_jvp(p, t, o):
    # fmod(x, y) = x - trunc(x / y) * y, the trunc piecewise constant
    x, y = p
    tx = t[0]
    ty = None if t[1] is None else F.mul(F.neg(t[1]), round_(F.div(x, y), "trunc"))
    return [sum_tangents(tx, ty)]


fmod_p = elementwise_primitive(
    "fmod", binary_float_rule("fmod"), np.fmod,
    "The C remainder x - trunc(x / y) * y, computed exactly; NaN for y = 0.", jvp=_fmod_jvp)


ROUNDING = {"floor": np.floor, "ceil": np.ceil, "rint": np.rint, "trunc": np.trunc}


def _round_rule(x, *, mode):
    if x.dtype.kind != "f":
        raise DTypeError(f"round: needs a floating operand, got {dtype_name(x.dtype)}; "
                         "integers are already whole")
    return [(x.shape, x.dtype)]


round_p = elementwise_primitive(
    "round", _round_rule, lambda x, *, mode: ROUNDING[mode](x),
    "x rounded to a whole number: mode floor, ceil, rint (half to even) or trunc; derivative zero.",
    jvp=lambda p, t, o, *, mode: [None])


# -- the operations, as ``api`` writes them (floating results for integer operands) ------------

def log1p(x):
    return bind(log1p_p, F.as_floating(x))


def expm1(x):
    return bind(expm1_p, F.as_floating(x))


def erf(x):
    return bind(erf_p, F.as_floating(x))


def _binary_floating(prim, x, y):
    """NumPy promotion, then integers as float64 (as ``np.arctan2(1, 2)`` does)."""
    x, y = F.promote(x, y)
    if x.dtype.kind != "f":
        x, y = F.cast(x, np.float64), F.cast(y, np.float64)
    return F.bind_elementwise(prim, x, y)


def atan2(y, x):
    return _binary_floating(atan2_p, y, x)


def fmod(x, y):
    return _binary_floating(fmod_p, x, y)


def round_(x, mode="rint"):
    """Round to a whole number (``mode``: floor, ceil, rint, trunc); integers come back as they are."""
    if mode not in ROUNDING:
        raise ArgumentError(f"round: mode must be one of {sorted(ROUNDING)}, got {mode!r}")
    x = F.as_var(x)
    if x.dtype.kind != "f":
        return x
    return bind(round_p, x, mode=mode)
