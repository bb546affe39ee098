"""``checked``: a run-time check that travels inside programs.

``checked(x, flag, message=, mode=)`` is ``x`` itself; when the bool scalar
``flag`` is true at run time it warns (``mode="warn"``: a ``VkmlWarning``)
or fails the run (``mode="raise"``: an ``ExecutionError``) with ``message``.
Why a primitive: a check written in Python reads a concrete value, so it
cannot run inside ``jit``, ``grad``, ``vmap`` or ``scan``, where values are
traced -- the very places a ``while_loop(max_iters=)`` is used for reverse
mode.  As an identity on ``x`` the check stays in a program exactly as long
as ``x`` is used, and every transformation keeps it on the primal side:

- JVP: the tangent of ``x`` passes through unchanged (the flag has none), so
  the check itself stays with the primal values, on the known side of a
  linearized program;
- transpose: the identity (for a program that checks a linear value);
- vmap: a batched flag is reduced with any(), so one check (one warning)
  covers every sample.

A warning is issued once per submission: checks run inside
:func:`collecting_warnings` (a backend's run; a scan's steps or several
checked leaves share one) add their message to a set that is warned once
when the outermost run ends.  The compiled tiers report the same through a
status slot of their own (see ``backends/cpu.py``).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass

from ..errors import ArgumentError, DTypeError, ExecutionError, ShapeError, VkmlWarning
from . import api as F
from .core import Linear, Primitive, bind

MODES = ("warn", "raise")


@dataclass(frozen=True)
class Check:
    """What a ``checked`` equation does when its flag is true: ``mode`` ("warn" or "raise") with
    ``message``.  One hashable parameter; it prints as its mode, so a failure names the op
    without repeating the message it fails with."""

    message: str
    mode: str = "warn"

    def __str__(self):
        return self.mode


def _checked_rule(x, flag, *, check):
    if flag.shape != () or flag.dtype.kind != "b":
        raise (ShapeError if flag.shape != () else DTypeError)(
            f"checked: the flag must be a bool scalar, got {flag.type_str()}; reduce it with .any()")
    if not isinstance(check, Check) or check.mode not in MODES:
        raise ArgumentError(f"checked: the check must be a Check whose mode is 'warn' or 'raise', "
                            f"got {check!r}")
    return [(x.shape, x.dtype)]


def _checked_impl(x, flag, *, check):
    if bool(flag):
        if check.mode == "raise":
            raise ExecutionError(check.message)
        report(check.message)
    return x


def _checked_batch(vals, dims, size, *, check):
    """One check for the whole batch: the flag of any sample (an empty batch raises nothing)."""
    x, flag = vals
    if dims[1] is not None:
        flag = F.max(flag) if size else F.constant(False)
    return [bind(checked_p, x, flag, check=check)], [dims[0]]


checked_p = Primitive("checked", doc="``x``; warns or fails the run with a message when the bool "
                                     "scalar flag is true (see ``vkml.ops.checks``).")
checked_p.abstract = _checked_rule
checked_p.impl = _checked_impl
checked_p.jvp = lambda p, t, o, *, check: [t[0]]
checked_p.transpose = lambda ct, x, flag, *, check: [ct[0] if isinstance(x, Linear) else None, None]
checked_p.batch = _checked_batch


def checked(x, flag, message, mode="warn"):
    """``x``, checked at run time: warn (``mode="warn"``) or fail the run (``"raise"``) with
    ``message`` when ``flag`` (a bool scalar) is true."""
    return bind(checked_p, F.as_var(x), F.as_var(flag), check=Check(str(message), mode))


def holds_checks(program, mode=None) -> bool:
    """Whether ``program`` (or a program nested in it) holds a ``checked`` equation (of ``mode``)."""
    for e in program.eqns:
        if e.prim is checked_p and (mode is None or e.params["check"].mode == mode):
            return True
        if any(hasattr(p, "eqns") and holds_checks(p, mode) for p in e.params.values()):
            return True
    return False


# -- warnings: once per submission ------------------------------------------------------------------

_STATE = threading.local()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def report(message):
    """Warn ``message``: at the end of the submission being run, or now outside one."""
    pending = getattr(_STATE, "pending", None)
    if pending is None:
        warn_at_user(message)
    elif message not in pending:
        pending.append(message)


class collecting_warnings:
    """Collect the warnings of the checks run inside; the outermost one warns each once on exit
    (a nested program's run joins the submission's collection).  Warnings are issued even when
    the run fails, so a raise does not swallow what came before it."""

    __slots__ = ("outer",)

    def __enter__(self):
        self.outer = getattr(_STATE, "pending", None) is None
        if self.outer:
            _STATE.pending = []
        return self

    def __exit__(self, *exc):
        if self.outer:
            pending, _STATE.pending = _STATE.pending, None
            for message in pending:
                warn_at_user(message)
        return False


def warn_at_user(message):
    """A ``VkmlWarning`` attributed to the user's line: the first frame outside vkml (and outside
    the programs the NumPy backend generates)."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith((_PACKAGE_DIR, "<vkml")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, VkmlWarning, stacklevel=level if frame is not None else 2)


__all__ = ["Check", "checked", "checked_p", "collecting_warnings", "holds_checks", "report", "warn_at_user"]
