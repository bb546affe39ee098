"""Argument checks shared by the entry points: functions, steps, counts and ``argnums``."""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import ArgumentError
from ..tensor import Tensor


def check_function(fn, where, what="the function"):
    if not callable(fn):
        raise ArgumentError(f"{where}: {what} must be callable, got {type(fn).__name__}")


def check_step(fn, where, what="the function"):
    """A function a loop calls on its carry: callable, and not a class (``float(c, x)`` is a
    TypeError from deep inside the loop, not a step)."""
    check_function(fn, where, what)
    if isinstance(fn, type):
        raise ArgumentError(f"{where}: {what} must be a function, got the class {fn.__name__}; "
                            "pass a def or lambda that calls it")


def is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


INT64_MAX = np.iinfo(np.int64).max


def checked_count(value, where, name, meaning, minimum=0):
    """A count argument (``length``, ``max_iters``) as a Python int in [minimum, 2**63)."""
    if isinstance(value, Tensor) and value.size == 1 and value.dtype.kind in "iu":
        value = value._concrete(f"{where}({name}=...)")
    if not is_int(value) or not minimum <= value <= INT64_MAX:
        raise ArgumentError(f"{where}: {name} must be an int >= {minimum} ({meaning}), got {value!r}")
    return int(value)


def check_argnums(argnums, where):
    """argnums as JAX takes it: an int, or a tuple/list of ints (checked against the call later)."""
    nums = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    if not all(is_int(a) for a in nums):
        raise ArgumentError(f"{where}: argnums must be an int or a tuple of ints (the positions of "
                            f"the arguments to differentiate), got {argnums!r}")


def checked_argnums(argnums, nargs, where):
    """``argnums`` as non-negative positions of a call with ``nargs`` arguments."""
    nums = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    for a in nums:
        if not -nargs <= a < nargs:
            raise ArgumentError(f"{where}: argnums {argnums!r} is out of range for a call with {nargs} "
                                f"positional argument(s); count from 0 (or -1 for the last)")
    return tuple(int(a) % nargs for a in nums)
