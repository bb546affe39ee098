"""Progress bars for long work (simulations, checkpointed reverses, training loops).

``progress(iterable)`` wraps an iterable (or counts ``update(n)`` calls
with ``total=``) in a ``tqdm.auto`` bar -- a widget in a notebook, text on
stderr in a terminal -- when bars are on, and in a silent stand-in with the
same methods when they are off.  They are on in a Jupyter kernel and off
elsewhere (scripts and tests stay quiet), unless asked: ``VKML_PROGRESS=1``
or ``set_progress(True)`` turns them on everywhere, ``0``/``False`` off.
``tqdm`` is imported only when a bar is shown; without it bars are silent.
"""

from __future__ import annotations

import os
import sys

__all__ = ["progress", "set_progress", "progress_enabled"]

_FORCED = [None]  # None: decide by where we run


def set_progress(enabled) -> None:
    """``True``/``False``: bars on/off everywhere; ``None``: back to "only in notebooks"."""
    _FORCED[0] = None if enabled is None else bool(enabled)


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")  # never imported here: only looked at if already loaded
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython else None
    return shell is not None and hasattr(shell, "kernel")


def progress_enabled() -> bool:
    """Whether :func:`progress` shows a bar here and now."""
    if _FORCED[0] is not None:
        return _FORCED[0]
    env = os.environ.get("VKML_PROGRESS", "").strip().lower()
    if env in ("1", "true", "yes", "on"):
        return True
    if env in ("0", "false", "no", "off"):
        return False
    return _in_notebook()


class _Silent:
    """What ``progress`` returns when bars are off: iterates and counts, shows nothing."""

    def __init__(self, iterable=None, total=None, desc=None):
        self.iterable, self.total, self.desc, self.n = iterable, total, desc, 0

    def __iter__(self):
        for item in self.iterable if self.iterable is not None else ():
            self.n += 1
            yield item

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, s="", refresh=True):
        pass

    def set_description(self, desc=None, refresh=True):
        self.desc = desc

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress(iterable=None, *, total=None, desc=None, enabled=None, **tqdm_kwargs):
    """A progress bar over ``iterable`` (or one counting ``update(n)`` up to ``total``).

    ``enabled`` overrides :func:`progress_enabled` for this bar.  Extra
    keyword arguments go to ``tqdm``.  Use it as an iterable or as a context
    manager (``with progress(total=n) as bar: ... bar.update()``).
    """
    show = progress_enabled() if enabled is None else bool(enabled)
    if show:
        try:
            from tqdm.auto import tqdm  # local: optional dependency
        except ImportError:
            show = False
    if not show:
        return _Silent(iterable, total, desc)
    return tqdm(iterable, total=total, desc=desc, **tqdm_kwargs)
