"""The counters every test reads: submissions, compiles, cache hits, traces, derivations.

Tests assert these counts; they never assert seconds.  They live at the
bottom of the package so every layer can count what it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .threadsafe import cache_sizes


@dataclass
class Stats:
    """Counters since the last :func:`reset_stats`.

    - ``submissions``: units of work handed to a backend (one per realize).
    - ``compiles``: programs compiled into executables.
    - ``cache_hits``: realizes that found their executable already compiled, and calls of a
      jitted function that found their program already traced (``f.cache_info()["hits"]``).
    - ``traces``: functions traced into programs (jit, scan steps, kernels).
    - ``derivations``: derived programs made (jvp, vjp, transposes).
    - ``graph_launches``: CUDA graphs launched (the cuda backend: one per submission).
    - ``caches``: not a counter but the entries each cache holds now, by name (each backend's
      executables, derived programs, jit programs, backward programs, kernel batches); each
      cache is bounded by ``vkml.set_cache_limit`` and all are emptied by ``vkml.clear_caches()``.
    """

    submissions: int = 0
    compiles: int = 0
    cache_hits: int = 0
    traces: int = 0
    derivations: int = 0
    graph_launches: int = 0
    caches: dict = field(default_factory=dict, compare=False)

    def snapshot(self) -> "Stats":
        return Stats(**{name: getattr(self, name) for name in _counters()}, caches=cache_sizes())

    def __sub__(self, other: "Stats") -> "Stats":
        return Stats(**{name: getattr(self, name) - getattr(other, name) for name in _counters()},
                     caches=self.caches)

    def __getitem__(self, name):
        return getattr(self, name)


STATS = Stats()


def stats() -> Stats:
    """A snapshot of the counters (subtract two snapshots to count what happened between).

    >>> before = vkml.stats()
    >>> _ = (vkml.tensor([1.0]) * 2).numpy()
    >>> (vkml.stats() - before).submissions
    1
    """
    return STATS.snapshot()


def _counters():
    return [f.name for f in fields(Stats) if f.name != "caches"]


def reset_stats() -> None:
    """Set every counter of :func:`stats` back to zero.

    >>> vkml.reset_stats()
    >>> vkml.stats().submissions
    0
    """
    for name in _counters():
        setattr(STATS, name, 0)
