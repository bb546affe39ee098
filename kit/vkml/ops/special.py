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
- ``erf``, ``erfc`` and ``lgamma``: not expressible with the others at all
  (``1 - erf(x)`` loses every digit of ``erfc`` beyond x = 6; ``lgamma`` is
  ``vkml.scipy.special.gammaln``, the base of the gamma family).
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
from . import complex_parts
from .core import bind, quiet_function
from .elementwise import binary_float_rule, elementwise_primitive, sum_tangents, unary_float_rule


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

log1p_p = elementwise_primitive(
    "log1p", unary_float_rule("log1p", True), np.log1p, "log(1 + x), accurate for tiny x.",
    jvp=lambda p, t, o: [F.div(t[0], F.add(p[0], 1.0))])

expm1_p = elementwise_primitive(
    "expm1", unary_float_rule("expm1", True), np.expm1, "exp(x) - 1, accurate for tiny x.",
    jvp=lambda p, t, o: [F.mul(t[0], F.add(o[0], 1.0))])


def _per_element(fn):
    """A C-library function NumPy lacks, applied per element in float64 (the NumPy backend's)."""
    def impl(x):
        x = np.asarray(x)
        flat = np.fromiter((fn(v) for v in x.astype(np.float64).ravel()), np.float64, x.size)
        return flat.reshape(x.shape).astype(x.dtype, copy=False)
    return impl


erf_p = elementwise_primitive(
    "erf", unary_float_rule("erf"), _per_element(math.erf), "The error function (2/sqrt(pi)) int_0^x exp(-t^2) dt.",
    jvp=lambda p, t, o: [F.mul(t[0], F.mul(_TWO_OVER_SQRT_PI, F.exp(F.neg(F.mul(p[0], p[0])))))])


def _lgamma(v):
    try:
        return math.lgamma(v)
    except (ValueError, OverflowError):      # the poles: C's lgamma gives +inf there
        return math.inf if not math.isnan(v) else v


def _erfc_jvp(p, t, o):
    return [F.mul(t[0], F.mul(-_TWO_OVER_SQRT_PI, F.exp(F.neg(F.mul(p[0], p[0])))))]


erfc_p = elementwise_primitive(
    "erfc", unary_float_rule("erfc"), _per_element(math.erfc),
    "The complementary error function 1 - erf(x), accurate where erf(x) is near 1.",
    jvp=_erfc_jvp)


def _lgamma_jvp(p, t, o):
    return [F.mul(t[0], digamma(p[0]))]


lgamma_p = elementwise_primitive(
    "lgamma", unary_float_rule("lgamma"), _per_element(_lgamma),
    "log|Gamma(x)|, the C library's lgamma; derivative digamma(x).", jvp=_lgamma_jvp)


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
    x = F.as_floating(x)
    if x.dtype.kind == "c":
        return _complex_expm1(x)
    return bind(expm1_p, x)


def _complex_expm1(z):
    """exp(z) - 1 of complex numbers from the parts, accurate near 0 (NumPy's loses the digits
    there): ``expm1(x) cos(y) - 2 sin(y/2)**2 + i exp(x) sin(y)``, with C99's infinities and
    NaNs (an infinite x with an infinite or NaN y gives inf + NaN i or -1 + 0i)."""
    x, y = complex_parts.real(z), complex_parts.imag(z)
    half = F.sin(F.mul(y, 0.5))
    re = F.sub(F.mul(bind(expm1_p, x), F.cos(y)), F.mul(F.mul(half, half), 2.0))
    re = F.add(re, 0.0)                                        # -0 + 0i gives +0, as C99's
    im = F.where(F.equal(y, 0.0), y, F.mul(F.exp(x), F.sin(y)))
    wild = F.logical_not(F.less(F.abs(y), np.inf))            # y infinite or NaN
    up = F.logical_and(F.equal(x, np.inf), wild)
    down = F.logical_and(F.equal(x, -np.inf), wild)
    re = F.where(up, np.inf, F.where(down, -1.0, re))
    im = F.where(up, np.nan, F.where(down, 0.0, im))
    return complex_parts.make_complex(re, im)


def erf(x):
    return bind(erf_p, F.as_floating(x))


def erfc(x):
    return bind(erfc_p, F.as_floating(x))


def lgamma(x):
    return bind(lgamma_p, F.as_floating(x))


#: Bernoulli numbers B_2k / 2k, the asymptotic series of digamma: ln y - 1/2y - sum B_2k/(2k y^2k)
_DIGAMMA_SERIES = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)

#: digamma's argument is raised by this many steps of psi(x) = psi(x + 1) - 1/x before the series
_DIGAMMA_SHIFT = 6


@quiet_function
def digamma(x):
    """psi(x) = d/dx log Gamma(x), composed: the recurrence up to x + 6, the asymptotic series
    there (error below 1e-15), and the reflection psi(x) = psi(1 - x) - pi / tan(pi x) for
    x < 0.5; NaN at the poles 0, -1, -2 ... as SciPy's is -inf at 0 and NaN below."""
    x = F.as_floating(x)
    reflect = F.less(x, 0.5)
    y = F.where(reflect, F.sub(1.0, x), x)
    shift = F.zeros_like(y)
    for k in range(_DIGAMMA_SHIFT):
        shift = F.add(shift, F.div(1.0, F.add(y, float(k))))
    z = F.add(y, float(_DIGAMMA_SHIFT))
    inv2 = F.div(1.0, F.mul(z, z))
    series = F.zeros_like(z)
    for c in reversed(_DIGAMMA_SERIES):
        series = F.mul(F.add(series, c), inv2)
    psi = F.sub(F.sub(F.sub(F.log(z), F.div(0.5, z)), series), shift)
    pole = F.equal(x, round_(x, "floor"))
    cot = F.div(math.pi, F.div(F.sin(F.mul(x, math.pi)), F.cos(F.mul(x, math.pi))))
    out = F.where(reflect, F.sub(psi, cot), psi)
    return F.where(F.logical_and(reflect, pole), np.nan, out)


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
