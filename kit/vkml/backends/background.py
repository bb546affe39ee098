"""Compiles that run beside the user's program: a big program's optimised build.

A step of a CNN or a transformer is 80-120 KB of generated C, which takes the compiler about a
second at -O2 and two thirds of that at -O1.  The cpu backend builds such a program at -O1 first
(the first call returns sooner), then at -O2 on a thread of this module while the program runs,
and switches to the faster build when it is ready (``cpu.CompiledProgram.take``).

What this module looks after: the threads (daemons, named ``vkml-optimise``), the compilers they
start, and the end of the process -- a compile still running then is stopped and its thread
waited for briefly, so no compiler outlives the process and no half-written build folder is
left in the cache.  (The compilers run at the normal priority: a lowered one got almost no time
beside a training loop's spinning OpenMP threads, and the switch came ten times later.)  A
second build starts once the program's first call has returned, so it does not slow that call.
"""

from __future__ import annotations

import atexit
import threading
import time

#: per thread: whether it is a background build (its compiles print no progress note)
STATE = threading.local()

_LOCK = threading.Lock()
_THREADS: set = set()
_PROCESSES: set = set()
_STOPPING = threading.Event()

#: seconds the end of the process waits for a stopped build's thread to clean up
_JOIN_SECONDS = 2.0


def active() -> bool:
    """Whether the calling thread is a background build."""
    return getattr(STATE, "active", False)


def started(proc) -> bool:
    """Track compiler ``proc`` of a background build until ``finished``; False (and ``proc``
    killed) if the process is ending."""
    if not active():
        return True
    with _LOCK:
        if not _STOPPING.is_set():
            _PROCESSES.add(proc)
            return True
    proc.kill()
    return False


def finished(proc) -> None:
    with _LOCK:
        _PROCESSES.discard(proc)


def later(work) -> threading.Thread | None:
    """Run ``work()`` on a daemon thread marked as a background build; None once the process
    is ending.  ``work`` handles its own errors (none reaches the thread's top)."""
    def run():
        STATE.active = True
        try:
            if not _STOPPING.is_set():
                work()
        finally:
            with _LOCK:
                _THREADS.discard(thread)
    thread = threading.Thread(target=run, name="vkml-optimise", daemon=True)
    with _LOCK:
        if _STOPPING.is_set():
            return None
        _THREADS.add(thread)
    thread.start()
    return thread


def wait_for(event, limit) -> bool:
    """Wait up to ``limit`` seconds for ``event`` (a program's first call), less if the process
    ends meanwhile; whether it is set."""
    end = time.monotonic() + limit
    while not _STOPPING.is_set():
        if event.wait(min(0.05, max(0.0, end - time.monotonic()))) or time.monotonic() >= end:
            break
    return event.is_set()


def wait(timeout=None) -> bool:
    """Wait for the background builds running now (a benchmark times the optimised programs);
    False if some is still running after ``timeout`` seconds."""
    with _LOCK:
        threads = list(_THREADS)
    end = None if timeout is None else time.monotonic() + timeout
    for thread in threads:
        thread.join(None if end is None else max(0.0, end - time.monotonic()))
    return not any(t.is_alive() for t in threads)


@atexit.register
def stop_all() -> None:
    """At the end of the process: kill the background builds' compilers and give their threads
    a moment to remove their build folders."""
    with _LOCK:
        _STOPPING.set()
        procs, threads = list(_PROCESSES), list(_THREADS)
    for proc in procs:
        try:
            proc.kill()
        except OSError:
            pass
    for thread in threads:
        thread.join(_JOIN_SECONDS)
