"""``check_grads``: derivatives against finite differences, in forward and reverse mode, to any order."""

from __future__ import annotations

import inspect
import numbers

import numpy as np

from ..errors import ArgumentError, VkmlError
from ..pytree import flatten
from ..tensor import Tensor
from ..validate import check_int, check_real, check_sequence
from .derivatives import jvp, vjp
from .checks import check_step


#: The highest derivative order check_grads checks: each order nests one more forward-mode
#: derivative inside the last (and divides finite differences once more), so beyond a few the
#: check is slow and the finite differences are noise.
MAX_CHECK_ORDER = 8


class GradCheckError(VkmlError, AssertionError):
    """A derivative that disagrees with finite differences.

    >>> @vkml.custom_jvp
    ... def f(x):
    ...     return vkml.sin(x)
    ...
    >>> @f.defjvp
    ... def f_jvp(primals, tangents):
    ...     return vkml.sin(primals[0]), 2.0 * tangents[0]
    ...
    >>> try:
    ...     vkml.check_grads(f, (np.array([0.3]),), modes=("fwd",))
    ... except vkml.GradCheckError:
    ...     print("the hand-written rule disagrees with finite differences")
    ...
    the hand-written rule disagrees with finite differences
    """


def check_grads(fn, args, order=1, modes=("fwd", "rev"), eps=None, rtol=1e-4, atol=1e-6, seed=0):
    """Check ``fn``'s derivatives at ``args`` against central finite differences.

    Along a random direction: forward mode (jvp) must match the difference
    quotient, and reverse mode must satisfy <u, J v> = <J^T u, v>.  With
    ``order=2`` the derivative is checked too (``order`` is at most
    ``MAX_CHECK_ORDER``, 8).  Raises GradCheckError with both numbers on a
    mismatch; returns None when all agree.

    >>> vkml.check_grads(lambda x: vkml.sum(vkml.sin(x)), (np.array([0.5, 1.0]),), order=2)
    """
    rtol, atol = _check_grads_arguments(fn, args, order, modes, eps, rtol, atol, seed)
    rng = np.random.default_rng(seed)
    xs = [np.asarray(a.numpy() if isinstance(a, Tensor) else a, dtype=np.float64) for a in args]
    f = lambda *a: fn(*a)  # noqa: E731
    base = np.asarray(_values(f(*xs)))
    vs = [rng.standard_normal(x.shape) for x in xs]
    h = eps if eps is not None else 1e-6 * max(1.0, max(float(np.abs(x).max(initial=0)) for x in xs))
    plus = np.asarray(_values(f(*[x + h * v for x, v in zip(xs, vs)])))
    minus = np.asarray(_values(f(*[x - h * v for x, v in zip(xs, vs)])))
    fd = (plus - minus) / (2 * h)
    if "fwd" in modes:
        _, t = jvp(f, tuple(xs), tuple(vs))
        _compare("jvp", np.asarray(_values(t)), fd, rtol, atol)
    if "rev" in modes:
        u = rng.standard_normal(base.shape)
        _, pb = vjp(f, *xs)
        cts = pb(u)
        lhs = float(np.sum(u * fd))
        rhs = float(sum(np.sum(np.asarray(c.numpy()) * v) for c, v in zip(cts, vs)))
        _compare("vjp", np.array(rhs), np.array(lhs), rtol, atol)
    if order > 1:
        def directional(*a):
            _, t = jvp(f, tuple(a), tuple(vs))
            return t
        check_grads(directional, xs, order - 1, modes, eps, rtol, atol, seed + 1)


def _values(out):
    leaves, _ = flatten(out)
    if len(leaves) != 1:
        raise ArgumentError("check_grads: the function must return one array")
    x = leaves[0]
    return x.numpy() if isinstance(x, Tensor) else x


def _compare(what, got, want, rtol, atol):
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        err = float(np.max(np.abs(got - want)))
        raise GradCheckError(f"check_grads: {what} gives {np.array2string(got, precision=8)} but "
                             f"finite differences give {np.array2string(want, precision=8)} "
                             f"(max abs error {err:.3g}, rtol={rtol}, atol={atol})")


def _check_grads_arguments(fn, args, order, modes, eps, rtol, atol, seed):
    check_step(fn, "check_grads")
    if not isinstance(args, (tuple, list)):
        raise ArgumentError(f"check_grads: args must be a tuple of the function's arguments, got "
                            f"{type(args).__name__}; write check_grads(f, (x,))")
    try:
        inspect.signature(fn).bind(*args)
    except TypeError as err:
        raise ArgumentError(f"check_grads: the function cannot take the {len(args)} argument(s) in "
                            f"args ({err}); pass one entry of args per parameter") from None
    except ValueError:          # no signature to read (a builtin): the call will tell
        pass
    for i, a in enumerate(args):
        value = a.numpy() if isinstance(a, Tensor) else np.asarray(a) if not isinstance(a, str) else None
        if value is None or value.dtype.kind not in "biuf":
            raise ArgumentError(f"check_grads: argument {i} must be an array or a number, got "
                                f"{type(a).__name__}")
    check_int(order, "order", "check_grads", low=1, high=MAX_CHECK_ORDER)
    kinds = None if isinstance(modes, str) else check_sequence(modes, "modes", "check_grads")
    if not kinds or not all(isinstance(m, str) and m in ("fwd", "rev") for m in kinds):
        raise ArgumentError(f"check_grads: modes must be a tuple of 'fwd' and/or 'rev', got {modes!r}")
    if eps is not None and (not isinstance(eps, numbers.Real) or not 0 < eps < np.inf):
        raise ArgumentError(f"check_grads: eps must be a positive finite step, got {eps!r}")
    check_int(seed, "seed", "check_grads", low=0)
    return check_real(rtol, "rtol", "check_grads", low=0), check_real(atol, "atol", "check_grads", low=0)
