"""NumPy's and SciPy's further elementwise functions, composed from the primitives.

Each is written with ``where`` around the operations that would be wrong at
a special point (``sinc`` at 0, ``xlogy`` at x = 0), so values and
derivatives are NumPy's and SciPy's there too.  The special functions with
no closed form use the forms numerical libraries use, with a fixed number
of terms (no data-dependent loop, so they trace, vmap and compile):

- ``gammaln`` is the C library's ``lgamma`` (a primitive); ``gamma``,
  ``beta`` and ``betaln`` are built on it; ``digamma`` and ``polygamma``
  raise the argument by the recurrence and sum the asymptotic series.
- ``erfcinv``/``erfinv``/``ndtri`` start from a rational guess and take
  Halley steps on ``erfc``/``erf`` (each step triples the correct digits).
- ``i0``/``i1`` sum the power series below 30 and the asymptotic series above.
- ``gammainc`` sums the series below ``a + 1`` and the continued fraction
  above (100 terms each: full float64 accuracy for a up to about 50).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError
from . import api as F
from . import numeric as N
from . import special as S
from .core import quiet_function

_LN2 = math.log(2.0)
_SQRT2 = math.sqrt(2.0)
_SQRT_PI = math.sqrt(math.pi)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _fl(x):
    return F.as_floating(x)


def _below(x, edge):
    """``x`` where it is at most ``edge``, else ``edge``: the input of a branch used only there
    (a ``where``, not ``minimum``, so at ``x == edge`` the whole derivative reaches the branch)."""
    return F.where(F.greater(x, edge), edge, x)


def _above(x, edge):
    return F.where(F.less(x, edge), edge, x)


# -- NumPy's elementwise functions --------------------------------------------------------------

def signbit(x):
    """Whether the sign bit is set (True for -0.0, as 1 / -0.0 is -inf)."""
    x = F.as_var(x)
    if x.dtype.kind != "f":
        return F.less(x, 0)
    zero = F.equal(x, 0.0)
    return F.where(zero, F.less(F.div(1.0, F.where(zero, x, 1.0)), 0.0), F.less(x, 0.0))


def copysign(x, y):
    x, y = F.promote(_fl(x), _fl(y))
    return F.where(signbit(y), F.neg(F.abs(x)), F.abs(x))


def cbrt(x):
    """The real cube root (negative for negative x)."""
    x = _fl(x)
    a = F.abs(x)
    root = F.pow(a, 1.0 / 3.0)
    # one Newton step r - (r^3 - a) / 3r^2 makes perfect cubes exact where pow is a few ulps off
    safe = F.where(F.equal(root, 0.0), 1.0, root)
    root = F.where(F.logical_and(F.greater(root, 0.0), N.isfinite(root)),
                   F.sub(safe, F.div(F.sub(F.mul(F.mul(safe, safe), safe), a),
                                     F.mul(3.0, F.mul(safe, safe)))), root)
    return F.where(signbit(x), F.neg(root), root)


def sinc(x):
    """sin(pi x) / (pi x), 1 at 0."""
    x = _fl(x)
    zero = F.equal(x, 0.0)
    px = F.mul(F.where(zero, 1.0, x), math.pi)
    return F.where(zero, 1.0, F.div(F.sin(px), px))


def fabs(x):
    return F.abs(_fl(x))


def heaviside(x1, x2):
    """0 below zero, ``x2`` at zero, 1 above (NaN stays NaN)."""
    x1, x2 = F.promote(_fl(x1), _fl(x2))
    out = F.where(F.less(x1, 0.0), 0.0, F.where(F.greater(x1, 0.0), 1.0, x2))
    return F.where(N.isnan(x1), np.nan, out)


def _nan_ignoring(pick, x, y):
    x, y = F.promote(x, y)
    if x.dtype.kind != "f":
        return pick(x, y)
    out = pick(x, y)
    out = F.where(N.isnan(x), y, out)
    return F.where(N.isnan(y), x, out)


def fmax(x, y):
    """The larger element, ignoring NaN (NaN only where both are)."""
    return _nan_ignoring(F.maximum, x, y)


def fmin(x, y):
    """The smaller element, ignoring NaN (NaN only where both are)."""
    return _nan_ignoring(F.minimum, x, y)


def float_power(x, y):
    """x ** y in float64 (integers too)."""
    return F.pow(F.cast(F.as_var(x), np.float64), F.cast(F.as_var(y), np.float64))


def logaddexp2(x, y):
    """log2(2**x + 2**y) without overflow."""
    x, y = F.promote(_fl(x), _fl(y))
    return F.div(N.logaddexp(F.mul(x, _LN2), F.mul(y, _LN2)), _LN2)


def positive(x):
    return F.as_var(x)


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    a, b = F.promote(a, b)
    if a.dtype.kind not in "f":
        return F.equal(a, b)
    gap = F.abs(F.sub(a, b))
    close = F.less_equal(gap, F.add(atol, F.mul(rtol, F.abs(b))))
    same_inf = F.logical_and(F.equal(a, b), F.logical_not(N.isfinite(b)))
    close = F.logical_or(F.logical_and(close, N.isfinite(b)), same_inf)
    if equal_nan:
        close = F.logical_or(close, F.logical_and(N.isnan(a), N.isnan(b)))
    return close


# -- scipy.special --------------------------------------------------------------------------------

def gammaln(x):
    return S.lgamma(x)


@quiet_function
def gamma(x):
    """Gamma(x): exp(lgamma(x)) with the sign of Gamma (negative on (-1, 0), (-3, -2), ...)."""
    x = _fl(x)
    odd = F.equal(N.mod(N.floor(x), 2.0), 1.0)
    sign = F.where(F.logical_and(F.less(x, 0.0), odd), -1.0, 1.0)
    pole = F.logical_and(F.less_equal(x, 0.0), F.equal(x, N.floor(x)))
    return F.where(pole, np.nan, F.mul(sign, F.exp(S.lgamma(x))))


@quiet_function
def betaln(a, b):
    a, b = F.promote(_fl(a), _fl(b))
    return F.sub(F.add(S.lgamma(a), S.lgamma(b)), S.lgamma(F.add(a, b)))


@quiet_function
def beta(a, b):
    a, b = F.promote(_fl(a), _fl(b))
    return F.div(F.mul(gamma(a), gamma(b)), gamma(F.add(a, b)))


@quiet_function
def polygamma(n, x):
    """The n-th derivative of digamma (n a whole number >= 0, constant)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= 100:
        raise ArgumentError(f"polygamma: n must be a whole number from 0 to 100 given as a Python "
                            f"int, got {n!r}")
    n = int(n)
    if n == 0:
        return S.digamma(x)
    x = _fl(x)
    sign = (-1.0) ** (n + 1)
    fact = math.factorial(n)
    shift = F.zeros_like(x)
    steps = 8
    for k in range(steps):
        shift = F.add(shift, F.pow(F.add(x, float(k)), -(n + 1.0)))
    z = F.add(x, float(steps))
    # psi^(n)(z) ~ (-1)^(n+1) [ (n-1)!/z^n + n!/(2 z^(n+1)) + sum_k B_2k (2k+n-1)!/((2k)! z^(2k+n)) ]
    bern = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)
    series = F.add(F.div(float(math.factorial(n - 1)), F.pow(z, float(n))),
                   F.div(fact / 2.0, F.pow(z, n + 1.0)))
    for k, b in enumerate(bern, start=1):
        c = b * math.factorial(2 * k + n - 1) / math.factorial(2 * k)
        series = F.add(series, F.div(c, F.pow(z, float(2 * k + n))))
    return F.mul(sign, F.add(series, F.mul(fact, shift)))


@quiet_function
def xlogy(x, y):
    """x * log(y), 0 where x is 0 (whatever y is, NaN aside).  Only a y whose log is not finite
    is replaced where x is 0, so the derivative in x there is log(y), as JAX has it."""
    x, y = F.promote(_fl(x), _fl(y))
    bad = F.logical_and(F.equal(x, 0.0), F.logical_or(F.less_equal(y, 0.0), N.isinf(y)))
    return F.mul(x, F.log(F.where(bad, 1.0, y)))


@quiet_function
def xlog1py(x, y):
    """x * log1p(y), 0 where x is 0 (the derivative in x there is log1p(y))."""
    x, y = F.promote(_fl(x), _fl(y))
    bad = F.logical_and(F.equal(x, 0.0), F.logical_or(F.less_equal(y, -1.0), N.isinf(y)))
    return F.mul(x, S.log1p(F.where(bad, 0.0, y)))


@quiet_function
def entr(x):
    """-x log x, 0 at 0, -inf below 0."""
    x = _fl(x)
    pos = F.greater(x, 0.0)
    out = F.neg(F.mul(x, F.log(F.where(pos, x, 1.0))))
    out = F.where(F.equal(x, 0.0), 0.0, out)
    return F.where(F.less(x, 0.0), -np.inf, out)


@quiet_function
def log_expit(x):
    """log(expit(x)) = -log(1 + exp(-x)), without overflow either way."""
    x = _fl(x)
    return F.neg(N.logaddexp(F.zeros_like(x), F.neg(x)))


@quiet_function
def ndtr(x):
    """The standard normal distribution function, 0.5 erfc(-x / sqrt 2)."""
    return F.mul(0.5, S.erfc(F.div(F.neg(_fl(x)), _SQRT2)))


@quiet_function
def log_ndtr(x):
    """log(ndtr(x)) accurate in both tails (the asymptotic series below -20)."""
    x = _fl(x)
    mid = F.log(ndtr(_above(x, -20.0)))
    upper = S.log1p(F.neg(ndtr(F.neg(_above(x, 0.0)))))
    t = _below(x, -20.0)
    inv2 = F.div(1.0, F.mul(t, t))
    # log(phi(t) / -t) + log(1 - 1/t^2 + 3/t^4 - 15/t^6 + 105/t^8)
    poly = F.add(1.0, F.mul(inv2, F.add(-1.0, F.mul(inv2, F.add(3.0, F.mul(inv2, F.add(
        -15.0, F.mul(inv2, 105.0))))))))
    lower = F.add(F.sub(F.sub(F.mul(F.mul(t, t), -0.5), F.log(F.neg(t))), _HALF_LOG_2PI), F.log(poly))
    return F.where(F.less(x, -20.0), lower, F.where(F.greater(x, 0.0), upper, mid))


@quiet_function
def erfcx(x):
    """exp(x^2) erfc(x), without overflow for large x (the asymptotic series from 25)."""
    x = _fl(x)
    small = _below(x, 25.0)
    direct = F.mul(F.exp(F.mul(small, small)), S.erfc(small))
    t = _above(x, 25.0)
    inv2 = F.div(1.0, F.mul(F.mul(t, t), 2.0))
    poly = F.add(1.0, F.mul(inv2, F.add(-1.0, F.mul(inv2, F.add(3.0, F.mul(inv2, F.add(
        -15.0, F.mul(inv2, 105.0))))))))
    tail = F.div(poly, F.mul(t, _SQRT_PI))
    return F.where(F.greater(x, 25.0), tail, direct)


def _halley(fn, sign, target, x):
    """Three Halley steps solving fn(x) = target from the guess ``x``, for fn erf (sign 1) or
    erfc (sign -1): fn' = sign 2/sqrt(pi) exp(-x^2), and fn''/fn' = -2x."""
    for _ in range(3):
        step = F.div(F.sub(fn(x), target), F.mul(sign * 2.0 / _SQRT_PI, F.exp(F.neg(F.mul(x, x)))))
        x = F.sub(x, F.div(step, F.add(1.0, F.mul(x, step))))
    return x


def _erfinv_guess(y, one_minus):
    """A rational first guess of erfinv(y) (about 7 digits), from w = -log((1 - y)(1 + y))."""
    w = F.neg(F.log(F.mul(one_minus, F.sub(2.0, one_minus))))
    small = F.sub(F.minimum(w, 5.0), 2.5)               # (used only below w = 5)
    p = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p = F.add(c, F.mul(p, small))
    big = F.sub(F.sqrt(F.maximum(w, 5.0)), 3.0)        # (used only from w = 5)
    q = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        q = F.add(c, F.mul(q, big))
    return F.mul(F.where(F.less(w, 5.0), p, q), y)


@quiet_function
def erfcinv(z):
    """x with erfc(x) = z, z in [0, 2]."""
    z = _fl(z)
    upper = F.greater(z, 1.0)               # erfcinv(2 - z) = -erfcinv(z)
    zz = F.where(upper, F.sub(2.0, z), z)   # in (0, 1]
    inside = F.logical_and(F.greater(zz, 0.0), F.less_equal(zz, 1.0))
    safe = F.where(inside, zz, 0.5)
    # the rational guess is good to w = 36 (z ~ 1e-16); below, x^2 = -log z - log(sqrt(pi) x)
    # (erfc's leading asymptotic term) iterated from sqrt(-log z)
    minus_log = F.neg(F.log(F.minimum(safe, 1e-12)))       # (used only below 1e-12)
    tail = F.sqrt(minus_log)
    for _ in range(4):
        tail = F.sqrt(F.maximum(F.sub(minus_log, F.log(F.mul(_SQRT_PI, tail))), 1e-3))
    guess = F.where(F.less(safe, 1e-12), tail, _erfinv_guess(F.sub(1.0, safe), safe))
    x = _halley(S.erfc, -1.0, safe, guess)
    x = F.where(F.equal(zz, 0.0), np.inf, x)
    x = F.where(upper, F.neg(x), x)
    return F.where(F.logical_or(F.less(z, 0.0), F.greater(z, 2.0)), np.nan, x)


@quiet_function
def erfinv(y):
    """x with erf(x) = y, y in [-1, 1]."""
    y = _fl(y)
    a = F.abs(y)
    near = F.less_equal(a, 0.5)
    safe_near = F.where(near, y, 0.0)
    small = _halley(S.erf, 1.0, safe_near, _erfinv_guess(safe_near, F.sub(1.0, F.abs(safe_near))))
    tail = erfcinv(F.where(near, 0.5, F.sub(1.0, a)))
    out = F.where(near, small, F.where(signbit(y), F.neg(tail), tail))
    return F.where(F.greater(a, 1.0), np.nan, out)


@quiet_function
def ndtri(p):
    """The inverse of ndtr: x with ndtr(x) = p, p in [0, 1]."""
    return F.add(F.mul(-_SQRT2, erfcinv(F.mul(2.0, _fl(p)))), 0.0)      # + 0.0: 0, not -0, at 0.5


def _bessel_i(nu, x):
    """I_nu(x) for nu = 0 or 1 (I_0 even, I_1 odd): the power series below |x| = 30 (in x
    itself, so the derivative at 0 is right), the asymptotic series of |x| above."""
    a = F.abs(x)
    small = _above(_below(x, 30.0), -30.0)
    q = F.mul(F.mul(small, small), 0.25)
    term = F.ones_like(a) if nu == 0 else F.mul(small, 0.5)
    total = term
    for k in range(1, 90):
        term = F.mul(term, F.div(q, float(k * (k + nu))))
        total = F.add(total, term)
    t = _above(a, 30.0)
    mu = 4.0 * nu * nu
    coef, series = 1.0, F.ones_like(a)
    inv = F.div(1.0, F.mul(8.0, t))
    power = F.ones_like(a)
    for k in range(1, 20):
        coef *= -(mu - (2 * k - 1) ** 2) / k
        power = F.mul(power, inv)
        series = F.add(series, F.mul(coef, power))
    big = F.div(F.mul(F.exp(t), series), F.sqrt(F.mul(2.0 * math.pi, t)))
    if nu == 1:
        big = F.where(F.less(x, 0.0), F.neg(big), big)
    return F.where(F.greater(a, 30.0), big, total)


@quiet_function
def i0(x):
    """The modified Bessel function of the first kind, order 0."""
    return _bessel_i(0, _fl(x))


@quiet_function
def i1(x):
    """The modified Bessel function of the first kind, order 1 (odd in x)."""
    return _bessel_i(1, _fl(x))


_GAMMAINC_TERMS = 100


@quiet_function
def gammainc(a, x):
    """The regularized lower incomplete gamma function P(a, x), a > 0, x >= 0."""
    a, x = F.promote(_fl(a), _fl(x))
    shape = F.broadcast_shapes("gammainc", a.shape, x.shape)
    a, x = F.broadcast_to(a, shape), F.broadcast_to(x, shape)
    ok = F.logical_and(F.greater(a, 0.0), F.greater_equal(x, 0.0))
    a = F.where(ok, a, 1.0)
    xs = F.where(ok, x, 0.0)
    pos = F.greater(xs, 0.0)
    xp = F.where(pos, xs, 1.0)
    log_front = F.sub(F.sub(F.mul(a, F.log(xp)), xp), S.lgamma(a))
    # series: P = x^a e^-x / Gamma(a + 1) * sum x^n / ((a+1)...(a+n))
    term = F.ones_like(a)
    total = term
    for n in range(1, _GAMMAINC_TERMS):
        term = F.mul(term, F.div(xp, F.add(a, float(n))))
        total = F.add(total, term)
    lower = F.mul(F.exp(F.sub(log_front, F.log(a))), total)
    # continued fraction (modified Lentz) for Q = 1 - P
    tiny = 1e-300
    b = F.add(F.sub(xp, a), 1.0)
    c = F.full(a.shape, 1.0 / tiny, a.dtype)
    d = F.div(1.0, b)
    h = d
    for i in range(1, _GAMMAINC_TERMS):
        an = F.mul(-float(i), F.sub(float(i), a))
        b = F.add(b, 2.0)
        d = F.add(F.mul(an, d), b)
        d = F.where(F.less(F.abs(d), tiny), tiny, d)
        c = F.add(b, F.div(an, c))
        c = F.where(F.less(F.abs(c), tiny), tiny, c)
        d = F.div(1.0, d)
        h = F.mul(h, F.mul(d, c))
    upper = F.sub(1.0, F.mul(F.exp(log_front), h))
    out = F.where(F.less(xp, F.add(a, 1.0)), lower, upper)
    out = F.where(pos, out, 0.0)
    return F.where(ok, out, np.nan)
