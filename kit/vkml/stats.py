"""The counters every test reads: submissions, compiles, cache hits, traces, derivations.

Tests assert these counts; they never assert seconds.  They live at the
bottom of the package so every layer can count what it does.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


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
    """

    submissions: int = 0
    compiles: int = 0
    cache_hits: int = 0
    traces: int = 0
    derivations: int = 0
    graph_launches: int = 0

    def snapshot(self) -> "Stats":
        return Stats(**{f.name: getattr(self, f.name) for f in fields(self)})

    def __sub__(self, other: "Stats") -> "Stats":
        return Stats(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def __getitem__(self, name):
        return getattr(self, name)


STATS = Stats()


def stats() -> Stats:
    """A snapshot of the counters (subtract two snapshots to count what happened between)."""
    return STATS.snapshot()


def reset_stats() -> None:
    for f in fields(STATS):
        setattr(STATS, f.name, 0)
