"""Turning functions on IR Vars into NumPy-style functions on Tensors, named and documented.

``vkml.numpy``, ``vkml.numpy.linalg`` and ``vkml.scipy.special`` all build
their functions this way from one table each: a function of ``ops``, its
name, and a docstring with one example (which the tests run).  A wrong
argument is refused with an ``ArgumentError`` naming the function, before
anything is built.
"""

from __future__ import annotations

import inspect

import numpy as np

from ..errors import ArgumentError
from ..runtime import is_eager, is_grad_enabled
from ..tensor import Tensor, apply_api, needs_grad, realize
from ..validate import describe

NUMPY_HEAD = ">>> import vkml.numpy as vnp\n"


def doc(summary, example, output, head=NUMPY_HEAD):
    """A docstring: the summary, then ``example`` after the import line ``head``, and its output."""
    return f"{summary}\n\n{head}>>> {example}\n{output}\n"


def lifted(fn, name, doc):
    """``fn`` (on IR Vars) as a function on Tensors, arrays and numbers, named and documented."""
    sig = inspect.signature(fn)

    def op(*args, **kwargs):
        bound = _bind(sig, name, args, kwargs)
        return apply_api(fn, *bound.args, **bound.kwargs)

    return named(op, name, doc, sig)


def lifted_many(fn, name, doc, as_tuple=False):
    """Like :func:`lifted` for a function returning several Vars: a list (or tuple) of Tensors."""
    sig = inspect.signature(fn)

    def op(*args, **kwargs):
        bound = _bind(sig, name, args, kwargs)
        outs = []

        def first(*a, **k):
            outs.extend(fn(*a, **k))
            if not outs:
                raise _NoPieces
            return outs[0]

        try:
            head = apply_api(first, *bound.args, **bound.kwargs)
        except _NoPieces:                        # (unstack of an empty axis)
            return () if as_tuple else []
        grad = is_grad_enabled() and needs_grad(bound.args)
        rest = [Tensor(v, grad and v.dtype.kind in "fc") for v in outs[1:]]
        if rest and is_eager() and head.ir_var.value is not None:
            realize(rest)
        return tuple([head] + rest) if as_tuple else [head] + rest

    return named(op, name, doc, sig)


class _NoPieces(Exception):
    """A function of several results gave none (raised through ``apply_api``, caught above)."""


def named(op, name, doc, sig):
    """``op`` under ``name``, with ``doc`` and the signature ``sig`` (what ``help()`` shows)."""
    op.__name__ = op.__qualname__ = name
    op.__signature__ = sig
    op.__doc__ = doc
    op.__module__ = "vkml.numpy"
    return op


#: parameters that are a flag wherever they appear (checked before the function sees them)
FLAGS = frozenset({"keepdims", "equal_nan", "rowvar", "bias", "right", "return_counts",
                   "full_matrices", "compute_uv", "hermitian", "density", "include_initial",
                   "endpoint", "descending", "stable", "lower", "unit_diagonal", "returned"})
#: parameters that are a choice named by a string wherever they appear
CHOICES = frozenset({"mode", "method", "side", "indexing", "kind", "UPLO", "approximate"})


def _bind(sig, name, args, kwargs):
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as err:
        raise ArgumentError(f"{name}: {err}") from None
    check_flags_and_choices(name, bound.arguments)
    return bound


def check_flags_and_choices(name, arguments):
    """Refuse a flag (``FLAGS``) that is not a bool and a choice (``CHOICES``) that is not a
    string, before the function compares them (an array there would be ambiguous)."""
    for key, value in arguments.items():
        if key in FLAGS and not isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"{name}: {key} must be True or False, got {describe(value)}")
        if key in CHOICES and value is not None and not isinstance(value, str):
            raise ArgumentError(f"{name}: {key} must be a string naming a choice, got "
                                f"{describe(value)}")
