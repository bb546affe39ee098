"""Turning functions on IR Vars into NumPy-style functions on Tensors, named and documented.

``vkml.numpy``, ``vkml.numpy.linalg`` and ``vkml.scipy.special`` all build
their functions this way from one table each: a function of ``ops``, its
name, and a docstring with one example (which the tests run).  A wrong
argument is refused with an ``ArgumentError`` naming the function, before
anything is built.
"""

from __future__ import annotations

import inspect

from ..errors import ArgumentError
from ..runtime import is_eager, is_grad_enabled
from ..tensor import Tensor, apply_api, needs_grad, realize

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
            return outs[0]

        head = apply_api(first, *bound.args, **bound.kwargs)
        grad = is_grad_enabled() and needs_grad(bound.args)
        rest = [Tensor(v, grad and v.dtype.kind == "f") for v in outs[1:]]
        if rest and is_eager() and head.ir_var.value is not None:
            realize(rest)
        return tuple([head] + rest) if as_tuple else [head] + rest

    return named(op, name, doc, sig)


def named(op, name, doc, sig):
    """``op`` under ``name``, with ``doc`` and the signature ``sig`` (what ``help()`` shows)."""
    op.__name__ = op.__qualname__ = name
    op.__signature__ = sig
    op.__doc__ = doc
    op.__module__ = "vkml.numpy"
    return op


def _bind(sig, name, args, kwargs):
    try:
        return sig.bind(*args, **kwargs)
    except TypeError as err:
        raise ArgumentError(f"{name}: {err}") from None
