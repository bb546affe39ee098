"""Activation functions PyTorch users reach for, on Vars, composed (``vkml.nn`` lifts them).

Each is written so that it cannot overflow where PyTorch's does not: ``softplus``
above its threshold is x itself, ``elu`` takes ``expm1`` of the negative part only.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError
from . import api as F
from .special import erf, expm1, log1p


def silu(x):
    """x * sigmoid(x) (the swish)."""
    x = F.as_floating(x)
    return F.mul(x, F.sigmoid(x))


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, x itself where beta x > threshold (PyTorch's)."""
    x = F.as_floating(x)
    bx = F.mul(x, beta)
    big = F.greater(bx, threshold)
    safe = F.where(big, 0.0, bx)
    return F.where(big, x, F.div(log1p(F.exp(safe)), beta))


def leaky_relu(x, negative_slope=0.01):
    x = F.as_floating(x)
    return F.where(F.greater(x, 0.0), x, F.mul(x, negative_slope))


def elu(x, alpha=1.0):
    x = F.as_floating(x)
    neg = F.minimum(x, 0.0)
    return F.where(F.greater(x, 0.0), x, F.mul(expm1(neg), alpha))


def gelu(x, approximate="none"):
    """x * Phi(x) with the normal distribution function Phi through erf ("none", PyTorch's
    default), or the tanh form ("tanh")."""
    x = F.as_floating(x)
    if approximate == "none":
        return F.mul(F.mul(x, 0.5), F.add(erf(F.mul(x, 1.0 / math.sqrt(2.0))), 1.0))
    if approximate == "tanh":
        inner = F.mul(F.add(x, F.mul(F.mul(F.mul(x, x), x), 0.044715)), math.sqrt(2.0 / math.pi))
        return F.mul(F.mul(x, 0.5), F.add(F.tanh(inner), 1.0))
    raise ArgumentError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def one_hot(labels, num_classes):
    """(..., num_classes) int64 rows with a 1 at each label (0 everywhere for a label outside
    [0, num_classes))."""
    labels = F.as_var(labels)
    if labels.dtype.kind not in "iu":
        raise ArgumentError(f"one_hot: labels must be integers, got {labels.dtype}; cast them with "
                            ".astype(np.int64)")
    classes = F.constant(np.arange(num_classes, dtype=np.int64))
    return F.cast(F.equal(F.expand_dims(F.cast(labels, np.int64), -1), classes), np.int64)
