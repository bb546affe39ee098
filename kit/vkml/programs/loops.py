"""The loops JAX users reach for, built on ``scan`` and ``while_loop``: ``fori_loop`` and ``associative_scan``."""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..errors import ArgumentError, ShapeError
from ..ops import api
from ..pytree import flatten, unflatten
from ..tensor import Tensor, concatenate, flip, tensor
from ..validate import MAX_ELEMENTS, check_bool, check_int
from .control_flow import scan, while_loop
from .batching import move_axis, wrap_like
from .checks import INT64_MAX, check_step, is_int


def fori_loop(lower, upper, body_fun, init_val):
    """``carry = body_fun(i, carry)`` for ``i`` in ``range(lower, upper)``; returns the carry.

    With concrete int bounds it is a ``scan`` over the indices (every mode
    of differentiation, reverse too); with traced bounds a ``while_loop``
    (forward and forward mode).  ``upper <= lower`` returns ``init_val``.

    >>> vkml.fori_loop(0, 4, lambda i, acc: acc * 2.0, 1.0)
    tensor(16., dtype=float64)
    """
    check_step(body_fun, "fori_loop", "the body")
    lo, hi = _loop_bound(lower, "lower"), _loop_bound(upper, "upper")
    if lo is not None and hi is not None:
        if hi <= lo:
            return init_val
        dtype = np.int32 if -2**31 <= lo and hi < 2**31 else np.int64
        check_int(hi - lo, "upper - lower (the number of iterations)", "fori_loop", high=MAX_ELEMENTS)
        # the index is carried (one scalar), not scanned over: an array of every index would be
        # a constant of the program as long as the loop, which a compiled program cannot hold
        # past a size (and would be memory for nothing)
        def step(c, _):
            i, value = c
            return (i + np.asarray(1, dtype), body_fun(i, value)), None

        (_, carry), _ = scan(step, (tensor(np.asarray(lo, dtype)), init_val), None, length=hi - lo)
        return carry
    _, carry = while_loop(lambda s: s[0] < upper, lambda s: (s[0] + 1, body_fun(s[0], s[1])),
                          (lower, init_val))
    return carry


def _loop_bound(bound, name):
    """A concrete int bound as a Python int, None for a traced one; anything else is refused."""
    if isinstance(bound, Tensor):
        if bound.shape != () or bound.dtype.kind not in "iu":
            raise ArgumentError(f"fori_loop: {name} must be an integer scalar, got {bound.ir_var.type_str()}")
        return None if runtime.is_traced(bound.ir_var) else int(bound.item())
    return check_int(bound, name, "fori_loop", low=-INT64_MAX - 1, high=INT64_MAX)


def associative_scan(fn, elems, reverse=False, axis=0):
    """All prefix combinations: ``out[i] = fn(... fn(fn(e[0], e[1]), e[2]) ..., e[i])`` along ``axis``.

    ``fn`` must be associative and work on whole slices at once (it is
    called on stacks of elements, as JAX requires); ``elems`` is a pytree of
    arrays of one length along ``axis``.  ``reverse=True`` combines suffixes
    in the original order: ``out[i] = e[i] (+) e[i+1] (+) ... (+) e[n-1]``.
    It takes ceil(log2 n) rounds, each one call of ``fn`` on shifted slices
    (Hillis and Steele's scan), built from ordinary operations, so it is
    lazy and differentiable like them.

    >>> vkml.associative_scan(vkml.add, np.array([1.0, 2.0, 3.0, 4.0]))
    tensor([ 1.,  3.,  6., 10.], dtype=float64)
    """
    check_step(fn, "associative_scan")
    reverse = check_bool(reverse, "reverse", "associative_scan")
    leaves, tree = flatten(elems)
    if not leaves:
        raise ArgumentError("associative_scan: elems has no arrays")
    xs = [x if isinstance(x, Tensor) else tensor(x) for x in leaves]
    if not is_int(axis):
        raise ArgumentError(f"associative_scan: axis must be an int, got {axis!r}")
    axes = [api.normalize_axis("associative_scan", x.ndim, axis) if x.ndim else None for x in xs]
    if None in axes:
        raise ShapeError("associative_scan: every leaf of elems needs the scanned axis; got a 0-d leaf")
    xs = [wrap_like(x, move_axis(x.ir_var, a, 0)) for x, a in zip(xs, axes)]
    lengths = {x.shape[0] for x in xs}
    if len(lengths) != 1:
        raise ShapeError(f"associative_scan: the leaves of elems have lengths {sorted(lengths)} along "
                         f"axis {axis}; they must all be equal")
    n = lengths.pop()
    if reverse:
        xs = [flip(x, 0) for x in xs]

    def combine(a, b):
        out = fn(unflatten(tree, b), unflatten(tree, a)) if reverse else \
            fn(unflatten(tree, a), unflatten(tree, b))
        out_leaves, out_tree = flatten(out)
        if out_tree != tree:
            raise ShapeError(f"associative_scan: fn returns {out_tree} but elems is {tree}")
        return out_leaves

    offset = 1
    while offset < n:
        combined = combine([x[:n - offset] for x in xs], [x[offset:] for x in xs])
        xs = [concatenate([x[:offset], c]) for x, c in zip(xs, combined)]
        offset *= 2
    if reverse:
        xs = [flip(x, 0) for x in xs]
    xs = [wrap_like(x, move_axis(x.ir_var, 0, a)) for x, a in zip(xs, axes)]
    return unflatten(tree, xs)
