"""NumPy's floating-point warnings, said at the user's line and naming the op.

Why: the NumPy backend runs a program as one generated function, so NumPy's own warning
("invalid value encountered in log") names that function's line (``<vkml program>:6``) or an
op's implementation inside vkml -- neither is anything the user wrote.  A program that holds
an op that can warn (``WARNS``: a log of a negative number, 0/0, an overflowing exp...) runs
with NumPy's error handling set to call :func:`_warned` where it would warn; that finds the
equation from the generated function's line, and warns at the line of the user's code that
made it::

    cell.py:4: RuntimeWarning: log: invalid value encountered (in a program vkml ran; the op
    was made at cell In[3], line 4)

Only where the user's NumPy error state says "warn": "ignore", "raise", "print", "log" and a
handler of the user's own are left as they are, and warning filters apply as usual (a filter
that makes the warning an error stops the program there, as NumPy's own warning would).
Setting the error state costs about 0.2 us a run (through NumPy's context variable, where
NumPy has one; ``np.errstate`` otherwise, about 0.9 us), so programs that cannot warn skip it.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from ..ir import site_text

#: primitives whose NumPy implementation can warn about a floating-point exception
WARNS = frozenset({"div", "log", "log1p", "sqrt", "pow", "exp", "expm1", "fmod", "cast"})

#: the file name of every generated program (``numpy_backend``)
PROGRAM_FILE = "<vkml program>"

try:        # NumPy 2: the error state is a context variable holding an opaque object
    from numpy._core._ufunc_config import _extobj_contextvar as _STATE
    from numpy._core._ufunc_config import _make_extobj
except ImportError:                                    # pragma: no cover (NumPy 1.x)
    _STATE = _make_extobj = None

#: the user's error state (by identity) -> the same state with "warn" turned into "call"
_DERIVED: dict = {}


def can_warn(program) -> bool:
    """Whether any equation of ``program`` is one of :data:`WARNS`."""
    return any(e.prim.name in WARNS for e in program.eqns)


def enter():
    """Start a run: NumPy calls :func:`_warned` where it would have warned.  Returns what
    :func:`leave` needs."""
    if _STATE is None:
        state = np.errstate(**_calling(np.geterr()))
        state.__enter__()
        return state
    now = _STATE.get()
    derived = _DERIVED.get(id(now))
    if derived is None or derived[0] is not now:
        modes = np.geterr()
        derived = _DERIVED[id(now)] = (now, _make_extobj(**_calling(modes)) if "warn" in
                                       modes.values() and "call" not in modes.values() else now)
        if len(_DERIVED) > 64:
            _DERIVED.clear()
    return _STATE.set(derived[1])


def leave(token) -> None:
    if _STATE is None:
        token.__exit__(None, None, None)
    else:
        _STATE.reset(token)


def _calling(modes):
    """NumPy error modes with every "warn" made "call" (to :func:`_warned`)."""
    out = {k: ("call" if v == "warn" else v) for k, v in modes.items()}
    if "call" in out.values():
        out["call"] = _warned
    return out


def _quiet(scope) -> bool:
    """Whether ``scope`` is inside a quiet library function (``ops.core.quiet_function``)."""
    while scope is not None:
        if scope.quiet:
            return True
        scope = scope.parent
    return False


def _warned(kind, flag):
    """NumPy's callback for a floating-point exception in a generated program: warn at the
    user's line of the equation that raised it."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != PROGRAM_FILE:
        frame = frame.f_back
    eqn = None
    if frame is not None:
        at = frame.f_globals.get("_equation_at")
        eqn = at(frame.f_lineno) if at is not None else None
    if eqn is not None and _quiet(eqn.scope):
        return
    if eqn is None or not isinstance(eqn.where, tuple):
        warnings.warn(f"{kind} encountered in a program vkml ran", RuntimeWarning, stacklevel=2)
        return
    code, line = eqn.where
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(f"{eqn.prim.name}: {kind} encountered (in a program vkml ran; the op "
                           f"was made at {site_text(eqn.where)})", RuntimeWarning,
                           code.co_filename, line, registry=registry)
