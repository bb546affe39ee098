"""Interrupting long compiled calls: Ctrl-C (Jupyter's "interrupt kernel") stops them within a step.

Why: a compiled call runs C through ctypes with the GIL released, and
Python's SIGINT handler only sets a flag that the interpreter looks at
between bytecodes -- so without help an interrupt takes effect only when
the C loop ends (seconds to minutes for a long simulation or scan).

How: a tiny C library of our own (compiled once, cached on disk like every
library of the cpu tier) exports one flag and ``vk_arm``/``vk_disarm``.
``vk_arm`` installs a SIGINT handler with ``sigaction`` that sets the flag
and then calls the handler that was there before (Python's own C handler,
so Python still raises KeyboardInterrupt once the call returns);
``vk_disarm`` puts the previous action back exactly as it was.  A call
that can be long (a program holding a scan or while loop, a simulation's
per-sample loops) is *armed* around the C call and passes the flag's
address to the generated function, which polls it in its outer loops
(every few scan rows or while iterations -- at most 256, fewer the more an
iteration computes -- and before each step of every sample: every OpenMP
thread polls, so all of them stop) and returns
:data:`~.codegen.c_render.INTERRUPTED` after freeing its temporaries.  The
caller then raises KeyboardInterrupt without committing any output, so
everything is as it was before the call (measured: control is back within
a millisecond of the signal).  A poll costs nothing measurable (a scan of
scalar adds, the fastest loop there is, runs at the same speed); arming is
two ``sigaction`` calls (about a microsecond), which is why loop-free
programs, and scans too short to be worth it, are never armed.

When a call is NOT armed -- it runs as it always did, the interrupt taking
effect when it returns:

* off the main thread (Python handles signals on the main thread only; a
  call from another thread is given a flag that is never set, so an
  interrupt meant for the main thread cannot stop it);
* when the Python-level SIGINT handler is not ``signal.default_int_handler``
  (a handler you installed decides what Ctrl-C means -- it still runs, after
  the call -- and SIG_IGN means "do not stop");
* on Windows, or without a C compiler (no ``sigaction``, no library).

Outside an armed call nothing of this module is installed: a SIGINT then
behaves exactly as it does without vkml.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from threading import get_ident

from ..errors import BackendError

_SOURCE = r"""
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <signal.h>
#include <string.h>

/* the generated code reads the flag as an int */
typedef char vk_flag_is_an_int[sizeof(sig_atomic_t) == sizeof(int) ? 1 : -1];

volatile sig_atomic_t vk_interrupted = 0;
static struct sigaction vk_previous;
static int vk_armed = 0;

static void vk_on_interrupt(int sig, siginfo_t* si, void* context) {
    int saved = errno;
    vk_interrupted = 1;
    if (vk_previous.sa_flags & SA_SIGINFO) {
        if (vk_previous.sa_sigaction) vk_previous.sa_sigaction(sig, si, context);
    } else if (vk_previous.sa_handler != SIG_DFL && vk_previous.sa_handler != SIG_IGN) {
        vk_previous.sa_handler(sig);
    }
    errno = saved;
}

/* 0 when armed.  The previous action is read (and kept) before ours is installed, so the
   handler never runs with a half-written copy of it; ours is never kept as "previous" (a
   handler calling itself), should a disarm have been missed. */
int vk_arm(void) {
    struct sigaction ours, now;
    vk_interrupted = 0;
    if (sigaction(SIGINT, 0, &now) != 0) return -1;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == vk_on_interrupt) {
        vk_armed = 1;
        return 0;
    }
    vk_previous = now;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = vk_on_interrupt;
    ours.sa_mask = now.sa_mask;
    ours.sa_flags = SA_SIGINFO | (now.sa_flags & (SA_ONSTACK | SA_RESTART));
    if (sigaction(SIGINT, &ours, 0) != 0) return -1;
    vk_armed = 1;
    return 0;
}

int vk_disarm(void) {
    if (!vk_armed) return 0;
    vk_armed = 0;
    return sigaction(SIGINT, &vk_previous, 0);
}
"""

_lock = threading.Lock()


try:        # CPython's own, below ``signal.getsignal``/``signal.signal`` (which make enums)
    from _signal import getsignal as _getsignal
    from _signal import signal as _setsignal
except ImportError:                                  # pragma: no cover (another Python)
    _getsignal, _setsignal = signal.getsignal, signal.signal


def python_handler():
    """The Python-level SIGINT handler, as ``signal.getsignal`` gives it but without turning it
    into an enum first (for a function handler that raises and catches an error inside: several
    microseconds, where every armed call reads it)."""
    return _getsignal(signal.SIGINT)


_helper = []              # [] before the first try; then [library or None]
#: the flag an unarmed call polls: never set
_NEVER = ctypes.c_int(0)
NEVER = ctypes.addressof(_NEVER)


def _library():
    """The helper library, or None where there is none (Windows, no compiler, a failed build)."""
    if not _helper:
        with _lock:
            if not _helper:
                _helper.append(_build())
    return _helper[0]


def _build():
    if os.name != "posix" or not hasattr(signal, "SIGINT"):
        return None
    from .cpu import compiler, library  # local: cycle (cpu imports this module)
    if compiler() is None:
        return None
    try:
        lib, _ = library(_SOURCE)
    except BackendError:
        return None
    lib.vk_arm.restype = lib.vk_disarm.restype = ctypes.c_int
    lib.vk_arm.argtypes = lib.vk_disarm.argtypes = []
    lib.flag = ctypes.c_int.in_dll(lib, "vk_interrupted")
    lib.flag_address = ctypes.addressof(lib.flag)
    return lib


class Armed:
    """``with Armed() as stop:`` -- ``stop`` is the address of the flag the C call should poll;
    SIGINT sets it while the block runs, when arming applies (see the module docstring), and
    the previous SIGINT action is back when the block ends, however it ends."""

    __slots__ = ("lib",)

    def __init__(self):
        self.lib = None

    def __enter__(self) -> int:
        if get_ident() != threading.main_thread().ident or \
                python_handler() is not signal.default_int_handler:
            return NEVER
        lib = _helper[0] if _helper else _library()
        if lib is None:
            return NEVER
        try:
            if lib.vk_arm() != 0:
                return NEVER
            self.lib = lib
            return lib.flag_address
        except BaseException:          # a Ctrl-C landing right after vk_arm: not left armed
            lib.vk_disarm()
            raise

    def __exit__(self, *exc):
        if self.lib is not None:
            self.lib.vk_disarm()
            self.lib = None
        return False


def interrupted():
    """Raise the KeyboardInterrupt a call that stopped at an interrupt owes its caller.

    Python's own handler saw the signal too (ours chains to it), so its KeyboardInterrupt is
    pending: it is raised here, from Python's own signal check, rather than a second one made
    up; a pending signal that another handler consumed still ends the call as an interrupt."""
    check = getattr(ctypes, "pythonapi", None)
    if check is not None:
        check.PyErr_CheckSignals()      # raises the pending KeyboardInterrupt
    raise KeyboardInterrupt


class Deferred:
    """``with Deferred():`` -- a Ctrl-C landing inside the block takes effect when it ends.

    Why: a training step writes its new values where the old ones were (parameters, gradients,
    moments, then the step count on the host).  An interrupt between two of those writes would
    leave some arrays new and others old, with no way back.  So from the first write to the last
    piece of bookkeeping a step runs under this block: a SIGINT that arrives meanwhile is only
    noted, and the handler that was there before (Python's, which raises KeyboardInterrupt, or
    one of your own) runs with it once the step is whole.  The step is then wholly applied and
    the interrupt still reaches you.

    Only on the main thread (where Python runs signal handlers) and only while the SIGINT handler
    is a Python function (``SIG_IGN``/``SIG_DFL`` are left alone); elsewhere it does nothing.
    Costs two ``signal.signal`` calls (about 6 us here, 1% of a small MLP's compiled step).  Not
    ``pthread_sigmask``, which is cheaper: it blocks the signal in this thread only, and the
    kernel would hand a Ctrl-C to another thread (a BLAS or OpenMP worker), whose handler would
    still make Python raise in this one."""

    __slots__ = ("previous", "caught")

    def __init__(self):
        self.previous = None
        self.caught = None

    def _note(self, signum, frame):
        self.caught = (signum, frame)

    def __enter__(self):
        if get_ident() == _MAIN_THREAD:
            previous = python_handler()
            if callable(previous):
                self.caught = None
                _setsignal(signal.SIGINT, self._note)
                self.previous = previous
        return self

    def __exit__(self, *exc):
        previous = self.previous
        if previous is None:
            return False
        self.previous = None
        _setsignal(signal.SIGINT, previous)
        caught = self.caught
        if caught is not None and exc[0] is None:
            previous(*caught)              # Python's handler raises KeyboardInterrupt here
        return False


_MAIN_THREAD = threading.main_thread().ident
