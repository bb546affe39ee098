"""Two building blocks the layers share across threads: settings and bounded caches.

They sit at the bottom of the package (like ``stats``) because the layers
that read them are below the runtime that changes them: ``ops`` reads the
current device, ``backends`` the current backend and its executable cache,
``transforms`` its derived-program cache.  Only :mod:`vkml.runtime` (and the
backends' own ``set_backend``) changes a setting; see its docstring for what
the user sees.

- :class:`Setting` -- a value per thread and per asyncio task (a
  ``contextvars.ContextVar``) that falls back to a process-wide default.
  ``set_global`` changes the default (what threads and tasks that did not
  choose their own follow) and the caller's own value; ``local`` changes the
  caller's own value for a ``with`` block and nobody else's.
- :class:`Cache` -- a least-recently-used map, bounded by one limit shared by
  every cache (:func:`set_cache_limit`, ``VKML_CACHE_LIMIT``), that makes each
  key once even when threads ask for it at the same time (the others wait
  for the one making it), so a program is never compiled twice.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import threading
import weakref
from collections import OrderedDict

_UNSET = object()


class Setting:
    """A value per thread and asyncio task, falling back to a process-wide default."""

    def __init__(self, name: str, default):
        self.name = name
        self._own = contextvars.ContextVar(f"vkml_{name}")
        self._use_default(default)

    def _use_default(self, value):
        """``get()``: the caller's own value, else ``value`` -- one C call (``ContextVar.get``
        with the default as its argument, no Python frame: hot paths read settings per call)."""
        self._default = value
        self.get = functools.partial(self._own.get, value)

    def get(self):          # (replaced per instance by ``_use_default``; here for the reader)
        return self._own.get(self._default)

    def set_global(self, value) -> None:
        """The process default, and the caller's own value (so another thread's later global
        call does not change it under the caller)."""
        self._use_default(value)
        self._own.set(value)

    def set_local(self, value) -> contextvars.Token:
        """The caller's own value only; undo with :meth:`reset`."""
        return self._own.set(value)

    def reset(self, token) -> None:
        self._own.reset(token)

    @contextlib.contextmanager
    def local(self, value):
        """``with setting.local(v):`` -- ``v`` in this thread or task for the block, restored after."""
        token = self._own.set(value)
        try:
            yield value
        finally:
            self._own.reset(token)


# -- bounded caches ---------------------------------------------------------------------------------

def _limit_from_env() -> int:
    text = os.environ.get("VKML_CACHE_LIMIT", "")
    try:
        value = int(text)
    except ValueError:
        return DEFAULT_CACHE_LIMIT
    return value if value > 0 else DEFAULT_CACHE_LIMIT


#: entries per cache unless ``VKML_CACHE_LIMIT`` or ``vkml.set_cache_limit`` says otherwise: a
#: training loop uses a handful of keys; a sweep over thousands of shapes stays within this many
DEFAULT_CACHE_LIMIT = 1024
_LIMIT = [_limit_from_env()]

#: every live cache, so one call can clear or measure them all
_CACHES: "weakref.WeakSet[Cache]" = weakref.WeakSet()
_CACHES_LOCK = threading.Lock()


class Cache:
    """A least-recently-used map that makes each key once (see the module docstring).

    ``name`` groups caches in :func:`cache_sizes` (every jitted function has its own
    ``"jit programs"`` cache).  Values are never None.
    """

    def __init__(self, name: str):
        self.name = name
        self._data = OrderedDict()
        self._lock = threading.Lock()
        self._making = {}           # key -> the lock its maker holds while making it
        with _CACHES_LOCK:
            _CACHES.add(self)

    def __len__(self):
        return len(self._data)

    def get(self, key, default=None):
        with self._lock:
            value = self._data.get(key, _UNSET)
            if value is _UNSET:
                return default
            self._data.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            self._trim()

    def put_first(self, key, value):
        """Store ``value`` unless another thread stored one for ``key`` first; return the stored one."""
        with self._lock:
            stored = self._data.setdefault(key, value)
            self._data.move_to_end(key)
            self._trim()
            return stored

    def get_or_make(self, key, make):
        """``(value, made)``: the value for ``key``, made by ``make()`` once even under
        concurrency; ``made`` says whether this call made it."""
        while True:
            with self._lock:
                value = self._data.get(key, _UNSET)
                if value is not _UNSET:
                    self._data.move_to_end(key)
                    return value, False
                gate = self._making.get(key)
                mine = gate is None
                if mine:
                    gate = self._making[key] = threading.Lock()
                    gate.acquire()
            if mine:
                break
            with gate:              # another thread is making it: wait, then look again
                pass
        try:
            value = make()
            self.put(key, value)
        finally:
            with self._lock:
                del self._making[key]
            gate.release()
        return value, True

    def values(self) -> list:
        with self._lock:
            return list(self._data.values())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def _trim(self):
        while len(self._data) > _LIMIT[0]:
            self._data.popitem(last=False)

    def trim(self) -> None:
        with self._lock:
            self._trim()


def cache_limit() -> int:
    """How many entries each cache keeps (the least recently used go first).

    >>> vkml.cache_limit() > 0
    True
    """
    return _LIMIT[0]


def set_cache_limit(n: int) -> None:
    """Keep at most ``n`` entries in every cache (``n`` checked by the caller); trims them now."""
    _LIMIT[0] = n
    for cache in _all():
        cache.trim()


def clear_caches() -> None:
    for cache in _all():
        cache.clear()


def cache_sizes() -> dict:
    """Entries held, summed per cache name."""
    sizes = {}
    for cache in _all():
        sizes[cache.name] = sizes.get(cache.name, 0) + len(cache)
    return dict(sorted(sizes.items()))


def _all():
    with _CACHES_LOCK:
        return list(_CACHES)


class ReadersWriter:
    """Many readers at once, or one writer alone; a thread inside may enter again either way.

    Why: a compiled step's first call traces the model by pointing its parameters at the
    trace's placeholders for a moment (the writer); a forward running in another thread
    meanwhile (a reader) would read placeholders.  Forwards do not exclude each other; a trace
    waits for the forwards under way and holds new ones back until it has put the parameters
    back.  Reentrant, because a trace runs the model's forward itself, and a forward runs its
    sub-modules' forwards."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = None
        self._writes = 0
        self._local = threading.local()

    def enter_read(self) -> None:
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if depth or self._writer == threading.get_ident():
            local.counted = getattr(local, "counted", False) if depth else False
            return
        with self._cond:
            while self._writer is not None:
                self._cond.wait()
            self._readers += 1
        local.counted = True

    def exit_read(self) -> None:
        local = self._local
        local.depth -= 1
        if local.depth == 0 and local.counted:
            local.counted = False
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    def enter_write(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._writes += 1
                return
            while self._writer is not None:
                self._cond.wait()
            self._writer, self._writes = me, 1          # (holds new readers back)
            mine = 1 if getattr(self._local, "counted", False) else 0
            while self._readers > mine:
                self._cond.wait()

    def exit_write(self) -> None:
        with self._cond:
            self._writes -= 1
            if not self._writes:
                self._writer = None
                self._cond.notify_all()

    def writing(self):
        """``with rw.writing():`` -- the block is the writer."""
        return _Writing(self)


class _Writing:
    __slots__ = ("rw",)

    def __init__(self, rw):
        self.rw = rw

    def __enter__(self):
        self.rw.enter_write()
        return self

    def __exit__(self, *exc):
        self.rw.exit_write()
        return False
