"""New tensors filled with a value or a range: ``zeros``, ``ones``, ``full``, ``arange``,
``zeros_like``, ``ones_like`` (``tensor`` itself, from data, is in ``tensor.py``)."""

from __future__ import annotations

import numbers

import numpy as np

from .errors import ArgumentError, ShapeError
from .validate import (MAX_ELEMENTS, check_bool, check_dtype, check_real, check_shape, describe,
                       host_memory)
from .tensor import as_tensor, tensor


def zeros(shape, dtype=np.float32, requires_grad=False):
    """A tensor of zeros (float32 unless ``dtype`` says otherwise).

    >>> vkml.zeros((2, 2))
    tensor([[0., 0.],
            [0., 0.]], dtype=float32)
    """
    return _filled("zeros", shape, 0, dtype, requires_grad)


def ones(shape, dtype=np.float32, requires_grad=False):
    """A tensor of ones (float32 unless ``dtype`` says otherwise).

    >>> vkml.ones(3, dtype='float64')
    tensor([1., 1., 1.], dtype=float64)
    """
    return _filled("ones", shape, 1, dtype, requires_grad)


def full(shape, value, dtype=None, requires_grad=False):
    """A tensor of ``shape`` filled with ``value`` (its dtype by default).

    >>> vkml.full((2,), 7.0)
    tensor([7., 7.], dtype=float64)
    """
    return _filled("full", shape, value, dtype, requires_grad)


def _filled(op, shape, value, dtype, requires_grad):
    """A new leaf of ``shape`` holding ``value`` everywhere, its arguments checked first."""
    shape = check_shape(shape, op)
    if not isinstance(value, (bool, np.bool_, numbers.Real)):
        raise ArgumentError(f"{op}: the fill value must be a real number, got {describe(value)}")
    dtype = check_dtype(dtype, op) if dtype is not None else None
    requires_grad = check_bool(requires_grad, "requires_grad", op)
    with host_memory(op, f"shape {shape}"):
        return tensor(np.full(shape, value, dtype=dtype), requires_grad=requires_grad)


def arange(*args, dtype=None):
    """NumPy's ``arange(stop)``, ``arange(start, stop)`` or ``arange(start, stop, step)``.

    >>> vkml.arange(4)
    tensor([0, 1, 2, 3], dtype=int64)
    >>> vkml.arange(1.0, 2.0, 0.25)
    tensor([1.  , 1.25, 1.5 , 1.75], dtype=float64)
    """
    if not 1 <= len(args) <= 3:
        raise ArgumentError(f"arange: takes stop, (start, stop) or (start, stop, step), got "
                            f"{len(args)} arguments")
    names = {1: ["stop"], 2: ["start", "stop"], 3: ["start", "stop", "step"]}[len(args)]
    bounds = [check_real(a, name, "arange") for a, name in zip(args, names)]
    if len(bounds) == 3 and bounds[2] == 0:
        raise ArgumentError("arange: step must not be 0")
    start, stop, step = ([0.0] * (len(bounds) == 1) + bounds + [1.0])[:3]
    span = (stop - start) / step
    if span > MAX_ELEMENTS:
        raise ShapeError(f"arange: [{start}, {stop}) in steps of {step} has more elements than an "
                         "array can hold; use a smaller range or a larger step")
    dtype = check_dtype(dtype, "arange") if dtype is not None else None
    with host_memory("arange", f"{span:.0f} elements"):
        try:
            values = np.arange(*args, dtype=dtype)
        except (TypeError, ValueError) as err:      # bounds past int64, a bool dtype, ...
            raise ArgumentError(f"arange: cannot make the range {args} ({err})") from None
    return tensor(values)


def zeros_like(t, requires_grad=False):
    """Zeros of ``t``'s shape and dtype.

    >>> vkml.zeros_like(vkml.tensor([1.0, 2.0]))
    tensor([0., 0.], dtype=float64)
    """
    t = as_tensor(t)
    return zeros(t.shape, t.dtype, requires_grad)


def ones_like(t, requires_grad=False):
    """Ones of ``t``'s shape and dtype.

    >>> vkml.ones_like(vkml.tensor([1, 2]))
    tensor([1, 1], dtype=int64)
    """
    t = as_tensor(t)
    return ones(t.shape, t.dtype, requires_grad)
