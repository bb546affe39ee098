"""``vkml.scipy.special``: SciPy's common special functions, differentiable.

``erf``, ``erfc`` and ``gammaln`` are primitives (the C library's; nothing
else composes them); the gamma family, the inverse error functions, the
normal distribution's functions, the Bessel functions i0/i1 and gammainc are
composed from them (``vkml.ops.float_math`` says how); the rest are composed: ``expit`` with tanh (no overflow), ``logit`` as
``log(p) - log1p(-p)``, ``logsumexp``/``softmax``/``log_softmax`` shifted by
the maximum.
"""

from __future__ import annotations

from ..numpy._lift import doc as _doc, lifted as _lifted
from ..ops import api as _api
from ..ops import float_math as _fm
from ..ops import special as _special


def _logit(p):
    p = _api.as_floating(p)
    return _api.sub(_api.log(p), _special.log1p(_api.neg(p)))


def _logsumexp(a, axis=None, b=None, keepdims=False):
    if b is None:
        return _api.logsumexp(a, axis, keepdims)
    # log(sum(b exp(a))) = logsumexp(a + log b); b = 0 drops its term
    a, b = _api.promote(_api.as_floating(a), _api.as_floating(b))
    shape = _api.broadcast_shapes("logsumexp", a.shape, b.shape)
    a, b = _api.broadcast_to(a, shape), _api.broadcast_to(b, shape)
    return _api.logsumexp(_api.add(a, _api.log(b)), axis, keepdims)


def _softmax(x, axis=None):
    x = _api.as_var(x)
    return _api.exp(_api.sub(x, _api.logsumexp(x, axis, keepdims=True)))


def _log_softmax(x, axis=None):
    x = _api.as_var(x)
    return _api.sub(x, _api.logsumexp(x, axis, keepdims=True))


_TABLE = [
    ("erf", _special.erf, "The error function; derivative 2/sqrt(pi) exp(-x**2).", "vkml.scipy.special.erf([0.0, 1.0])", "tensor([0.        , 0.84270079], dtype=float64)"),
    ("expit", _api.sigmoid, "The logistic sigmoid 1 / (1 + exp(-x)), without overflow.", "vkml.scipy.special.expit([0.0, 2.0])", "tensor([0.5       , 0.88079708], dtype=float64)"),
    ("logit", _logit, "log(p / (1 - p)), the inverse of expit.", "vkml.scipy.special.logit([0.5, 0.75])", "tensor([0.        , 1.09861229], dtype=float64)"),
    ("logsumexp", _logsumexp, "log(sum(exp(a))) over ``axis`` (all when None), without overflow.", "vkml.scipy.special.logsumexp([1000.0, 1000.0])", "tensor(1000.69314718, dtype=float64)"),
    ("softmax", _softmax, "exp(x) / sum(exp(x)) over ``axis`` (all when None).", "vkml.scipy.special.softmax([0.0, 0.0])", "tensor([0.5, 0.5], dtype=float64)"),
    ("erfc", _special.erfc, "1 - erf(x), accurate where erf(x) is near 1.", "vkml.scipy.special.erfc([0.0, 5.0])", 'tensor([1.00000000e+00, 1.53745979e-12], dtype=float64)'),
    ("erfcx", _fm.erfcx, "exp(x**2) erfc(x), without overflow.", "vkml.scipy.special.erfcx([0.0, 30.0])", 'tensor([1.        , 0.01879589], dtype=float64)'),
    ("erfinv", _fm.erfinv, "The inverse of erf, on [-1, 1].", "vkml.scipy.special.erfinv([0.0, 0.5])", 'tensor([0.        , 0.47693628], dtype=float64)'),
    ("erfcinv", _fm.erfcinv, "The inverse of erfc, on [0, 2].", "vkml.scipy.special.erfcinv([1.0, 1e-20])", 'tensor([0.        , 6.60158062], dtype=float64)'),
    ("gammaln", _fm.gammaln, "log|Gamma(x)|; derivative digamma(x).", "vkml.scipy.special.gammaln([1.0, 10.0])", 'tensor([ 0.        , 12.80182748], dtype=float64)'),
    ("gamma", _fm.gamma, "Gamma(x) (NaN at the poles 0, -1, -2, ...).", "vkml.scipy.special.gamma([0.5, 5.0])", 'tensor([ 1.77245385, 24.        ], dtype=float64)'),
    ("digamma", _special.digamma, "psi(x), the derivative of gammaln.", "vkml.scipy.special.digamma([1.0, 2.0])", 'tensor([-0.57721566,  0.42278434], dtype=float64)'),
    ("psi", _special.digamma, "``digamma``.", "vkml.scipy.special.psi([1.0])", 'tensor([-0.57721566], dtype=float64)'),
    ("polygamma", _fm.polygamma, "The n-th derivative of digamma (n a Python int).", "vkml.scipy.special.polygamma(1, [1.0])", 'tensor([1.64493407], dtype=float64)'),
    ("beta", _fm.beta, "Gamma(a) Gamma(b) / Gamma(a + b).", "vkml.scipy.special.beta([1.0, 2.0], 3.0)", 'tensor([0.33333333, 0.08333333], dtype=float64)'),
    ("betaln", _fm.betaln, "log|beta(a, b)|.", "vkml.scipy.special.betaln([1.0, 2.0], 3.0)", 'tensor([-1.09861229, -2.48490665], dtype=float64)'),
    ("gammainc", _fm.gammainc, "The regularized lower incomplete gamma function P(a, x).", "vkml.scipy.special.gammainc(2.0, [1.0, 3.0])", 'tensor([0.26424112, 0.80085173], dtype=float64)'),
    ("xlogy", _fm.xlogy, "x log(y), 0 where x = 0.", "vkml.scipy.special.xlogy([0.0, 2.0], [0.0, 3.0])", 'tensor([0.        , 2.19722458], dtype=float64)'),
    ("xlog1py", _fm.xlog1py, "x log1p(y), 0 where x = 0.", "vkml.scipy.special.xlog1py([0.0, 2.0], [-1.0, 1.0])", 'tensor([0.        , 1.38629436], dtype=float64)'),
    ("entr", _fm.entr, "-x log(x) (0 at 0, -inf below).", "vkml.scipy.special.entr([0.0, 0.5])", 'tensor([0.        , 0.34657359], dtype=float64)'),
    ("ndtr", _fm.ndtr, "The standard normal distribution function.", "vkml.scipy.special.ndtr([0.0, 1.0])", 'tensor([0.5       , 0.84134475], dtype=float64)'),
    ("ndtri", _fm.ndtri, "The inverse of ndtr.", "vkml.scipy.special.ndtri([0.5, 0.975])", 'tensor([0.        , 1.95996398], dtype=float64)'),
    ("log_ndtr", _fm.log_ndtr, "log(ndtr(x)), accurate in both tails.", "vkml.scipy.special.log_ndtr([-40.0, 0.0])", 'tensor([-8.04608442e+02, -6.93147181e-01], dtype=float64)'),
    ("i0", _fm.i0, "The modified Bessel function of the first kind, order 0.", "vkml.scipy.special.i0([0.0, 1.0])", 'tensor([1.        , 1.26606588], dtype=float64)'),
    ("i1", _fm.i1, "The modified Bessel function of the first kind, order 1.", "vkml.scipy.special.i1([0.0, 1.0])", 'tensor([0.       , 0.5651591], dtype=float64)'),
    ("log_expit", _fm.log_expit, "log(expit(x)), without overflow.", "vkml.scipy.special.log_expit([-1000.0, 0.0])", 'tensor([-1.00000000e+03, -6.93147181e-01], dtype=float64)'),
    ("log_softmax", _log_softmax, "x - logsumexp(x) over ``axis`` (all when None).", "vkml.scipy.special.log_softmax([0.0, 0.0])", "tensor([-0.69314718, -0.69314718], dtype=float64)"),
]

for _name, _fn, _summary, _example, _output in _TABLE:
    globals()[_name] = _lifted(_fn, _name, _doc(_summary, _example, _output,
                                                head=">>> import vkml.scipy.special\n"))

for _f in [v for k, v in globals().items() if callable(v) and not k.startswith("_")
           and getattr(v, "__module__", None) == "vkml.numpy"]:
    _f.__module__ = __name__        # (Sphinx documents a module's own members)
