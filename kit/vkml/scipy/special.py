"""``vkml.scipy.special``: erf, expit, logit, logsumexp, softmax and log_softmax, differentiable.

``erf`` is a primitive (the C library's; nothing else composes it); the
rest are composed: ``expit`` with tanh (no overflow), ``logit`` as
``log(p) - log1p(-p)``, ``logsumexp``/``softmax``/``log_softmax`` shifted by
the maximum.
"""

from __future__ import annotations

from ..numpy._lift import doc as _doc, lifted as _lifted
from ..ops import api as _api
from ..ops import special as _special


def _logit(p):
    p = _api.as_floating(p)
    return _api.sub(_api.log(p), _special.log1p(_api.neg(p)))


def _logsumexp(a, axis=None, keepdims=False):
    return _api.logsumexp(a, axis, keepdims)


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
    ("log_softmax", _log_softmax, "x - logsumexp(x) over ``axis`` (all when None).", "vkml.scipy.special.log_softmax([0.0, 0.0])", "tensor([-0.69314718, -0.69314718], dtype=float64)"),
]

for _name, _fn, _summary, _example, _output in _TABLE:
    globals()[_name] = _lifted(_fn, _name, _doc(_summary, _example, _output,
                                                head=">>> import vkml.scipy.special\n"))
