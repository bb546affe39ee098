"""NumPy's protocols on Tensors: ``np.exp(t)``, ``np.sum(t, axis=0)``, ``np.concatenate([t, a])``.

NumPy hands any call that involves a Tensor to ``Tensor.__array_ufunc__``
(ufuncs: ``np.exp``, ``np.add``, ``np.sin``, ...) or to
``Tensor.__array_function__`` (``np.sum``, ``np.mean``, ``np.reshape``, ...).
Both look the function's name up at call time in ``vkml.numpy`` (the
NumPy-shaped namespace, so whatever it provides is used), then in the table
below of vkml's own operations, and run what they find: the result is a lazy
Tensor with a gradient, as if the vkml function had been called.  A name
found in neither raises ArgumentError saying what to call instead, rather
than quietly computing on a copy that autograd cannot see.

Functions that answer a question about the values (``np.allclose``,
``np.shape``, ``np.array_equal``, ...) realize the tensors and run NumPy.
"""

from __future__ import annotations

import sys

import numpy as np

from .errors import ArgumentError, VkmlError
from .tensor import (Tensor, abs, add, argmax, argmin, as_tensor, broadcast_to, clip, concatenate, cos,
                     div, equal, exp, expand_dims, flip, floor_divide, greater, greater_equal,
                     less, less_equal, log, logical_and, logical_not, logical_or, matmul, max,
                     maximum, mean, min, minimum, mod, mul, neg, not_equal, pow, reshape, sign,
                     sin, sqrt, square, squeeze, stack, std, sub, sum, swapaxes, take,
                     take_along_axis, tanh, transpose, var, where)
from .creation import ones, zeros

# -- vkml's own operations under NumPy's names and parameter names ------------------------------------

UFUNCS = {
    "add": add, "subtract": sub, "multiply": mul, "divide": div, "true_divide": div,
    "floor_divide": floor_divide, "power": pow, "remainder": mod, "mod": mod,
    "maximum": maximum, "minimum": minimum, "equal": equal, "not_equal": not_equal,
    "less": less, "less_equal": less_equal, "greater": greater,
    "greater_equal": greater_equal, "logical_and": logical_and, "logical_or": logical_or,
    "logical_not": logical_not, "negative": neg, "positive": lambda x: x,
    "exp": exp, "log": log, "sin": sin, "cos": cos, "tanh": tanh, "sqrt": sqrt,
    "absolute": abs, "sign": sign, "square": square, "matmul": matmul,
}


def _transpose(a, axes=None):
    return transpose(a, axes)


def _clip(a, a_min=None, a_max=None, *, min=None, max=None):  # noqa: A002 -- NumPy's names
    return clip(a, a_min if a_min is not None else min, a_max if a_max is not None else max)


def _take(a, indices, axis=None):
    return take(reshape(a, (-1,)), indices, 0) if axis is None else take(a, indices, axis)


def _flip(m, axis=None):
    return flip(m, axis)


def _reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    if order != "C":
        raise ArgumentError(f"np.reshape on a vkml Tensor: only order='C' is supported, got {order!r}")
    return reshape(a, shape if shape is not None else newshape)


def _ravel(a, order="C"):
    return _reshape(a, (-1,), order)


def _reduction(fn):
    def reduce(a, axis=None, keepdims=False):
        return fn(a, axis, keepdims)
    reduce.__name__ = fn.__name__
    return reduce


def _moments(fn):
    def moment(a, axis=None, ddof=0, keepdims=False):
        return fn(a, axis, ddof, keepdims)
    moment.__name__ = fn.__name__
    return moment


FUNCTIONS = {
    "sum": _reduction(sum), "mean": _reduction(mean), "max": _reduction(max),
    "amax": _reduction(max), "min": _reduction(min), "amin": _reduction(min),
    "var": _moments(var), "std": _moments(std),
    "argmax": lambda a, axis=None: argmax(a, axis), "argmin": lambda a, axis=None: argmin(a, axis),
    "reshape": _reshape, "ravel": _ravel, "transpose": _transpose,
    "swapaxes": lambda a, axis1, axis2: swapaxes(a, axis1, axis2),
    "expand_dims": lambda a, axis: expand_dims(a, axis),
    "squeeze": lambda a, axis=None: squeeze(a, axis),
    "broadcast_to": lambda array, shape: broadcast_to(array, shape),
    "concatenate": lambda arrays, axis=0: concatenate(list(arrays), axis),
    "stack": lambda arrays, axis=0: stack(list(arrays), axis),
    "where": lambda condition, x, y: where(condition, x, y),
    "all": lambda a, axis=None: as_tensor(a).all(axis), "any": lambda a, axis=None: as_tensor(a).any(axis),
    "zeros_like": lambda a, dtype=None: zeros(np.shape(a), dtype or as_tensor(a).dtype),
    "ones_like": lambda a, dtype=None: ones(np.shape(a), dtype or as_tensor(a).dtype),
    "clip": _clip, "dot": lambda a, b: matmul(a, b), "take": _take, "flip": _flip,
    "take_along_axis": lambda arr, indices, axis: take_along_axis(arr, indices, axis),
}

#: Functions whose answer is a fact about the values, not an array to differentiate: NumPy runs them.
FACTS = {"allclose", "array_equal", "array_equiv", "isclose", "shape", "ndim", "size",
         "result_type", "can_cast", "iscomplexobj", "isrealobj", "isscalar", "array2string",
         "array_repr", "array_str", "save", "savez", "savez_compressed", "savetxt", "copyto"}

_ALIASES = {"absolute": "abs", "remainder": "mod", "true_divide": "divide", "amax": "max",
            "amin": "min", "concat": "concatenate", "permute_dims": "transpose"}


def _from_vkml_numpy(path):
    """``vkml.numpy.<path>`` if that namespace has it, else None.  Looked up, not imported: the
    namespace is built on Tensors, a layer above this one, and ``import vkml`` loads it."""
    obj = sys.modules.get("vkml.numpy")
    for part in path:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _numpy_name(func):
    """``np.linalg.svd`` -> ("linalg", "svd"): the NumPy submodule path and the name."""
    module = getattr(func, "__module__", None) or "numpy"
    parts = [p for p in module.split(".")[1:] if not p.startswith("_")]
    return tuple(parts) + (func.__name__,)


def _implementation(path, table):
    """vkml.numpy's function of this name (or its alias), else the table's."""
    names = [path[-1]] + ([_ALIASES[path[-1]]] if len(path) == 1 and path[0] in _ALIASES else [])
    for name in names:
        found = _from_vkml_numpy(path[:-1] + (name,))
        if found is not None:
            return found
    if len(path) == 1:
        return next((table[n] for n in names if n in table), None)
    return None


def _unsupported(path, why=""):
    dotted = ".".join(path)
    return ArgumentError(f"np.{dotted} is not supported on vkml Tensors{why}; call vkml.numpy.{dotted} "
                         f"if vkml provides it, or t.numpy() first to work on a NumPy copy (which "
                         "autograd does not see)")


def _run(path, fn, args, kwargs):
    if kwargs.get("out") is not None:
        raise ArgumentError(f"np.{'.'.join(path)}(..., out=...): vkml Tensors are never written in "
                            "place; drop out= and use the result")
    kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    try:
        return fn(*args, **kwargs)
    except VkmlError:
        raise
    except TypeError as err:
        raise _unsupported(path, f" with these arguments ({err})") from None


def array_ufunc(ufunc, method, inputs, kwargs):
    """``Tensor.__array_ufunc__``: a NumPy ufunc called on a Tensor runs vkml's operation."""
    path = (ufunc.__name__,)
    if method != "__call__":
        raise _unsupported((f"{ufunc.__name__}.{method}",))
    fn = _implementation(path, UFUNCS)
    if fn is None:
        raise _unsupported(path)
    return _run(path, fn, inputs, kwargs)


def _realized(x):
    """``x`` with every Tensor (also inside lists, tuples and dicts) replaced by its NumPy value."""
    if isinstance(x, Tensor):
        return x.numpy()
    if isinstance(x, (list, tuple)):
        return type(x)(_realized(v) for v in x)
    if isinstance(x, dict):
        return {k: _realized(v) for k, v in x.items()}
    return x


def array_function(func, types, args, kwargs):
    """``Tensor.__array_function__``: a NumPy function called on a Tensor runs vkml's operation."""
    if not all(issubclass(t, (Tensor, np.ndarray)) for t in types):
        return NotImplemented
    path = _numpy_name(func)
    if len(path) == 1 and path[0] in FACTS:
        return func(*_realized(args), **_realized(kwargs))
    fn = _implementation(path, FUNCTIONS)
    if fn is None:
        raise _unsupported(path)
    return _run(path, fn, args, kwargs)
