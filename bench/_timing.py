"""The timing helper every benchmark here shares: median of repeats, and an aligned table of ratios.

A median, not a mean or a minimum: one garbage collection or a scheduler
hiccup moves a mean a lot, and a minimum rewards a lucky run; the median of
many repeats is what a user sees step after step.  Every benchmark warms up
first, so compiles and caches are filled before anything is timed.
"""

from __future__ import annotations

import os
import statistics
import sys
import time


def pin_threads_from_argv(default: str = "1") -> str:
    """Read ``--threads N`` and set it for every side (OpenMP, vkml, BLAS).

    Call it BEFORE NumPy or a peer's library is imported: libgomp reads
    ``OMP_NUM_THREADS`` when it loads, not later.
    """
    threads = default
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            threads = sys.argv[i + 1]
        elif a.startswith("--threads="):
            threads = a.split("=", 1)[1]
    os.environ["OMP_NUM_THREADS"] = threads
    os.environ["VKML_THREADS"] = threads
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    return threads


def median_seconds(fn, *, repeat: int = 100, warmup: int = 10, number: int = 1) -> float:
    """Median wall time of one ``fn()`` call, in seconds.

    Runs ``fn`` ``warmup`` times untimed, then ``repeat`` samples of
    ``number`` back-to-back calls each (raise ``number`` for calls shorter
    than the clock's resolution).
    """
    for _ in range(warmup):
        fn()
    samples = []
    clock = time.perf_counter
    for _ in range(repeat):
        t0 = clock()
        for _ in range(number):
            fn()
        samples.append((clock() - t0) / number)
    return statistics.median(samples)


def print_table(title: str, rows, *, baselines=(), unit: str = "us", extra=()) -> None:
    """Print ``rows`` of ``(name, seconds)`` as an aligned table.

    For each name in ``baselines`` a column ``/name`` gives every row's time
    divided by that row's time (so ``vkml`` against ``numpy`` reads as
    ``1.07x``).  ``extra`` is a list of ``(column title, {row name: value})``
    for columns such as submissions per step; missing values print as ``-``.
    """
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    times = dict(rows)
    head = ["", f"{unit}/call"] + [f"/{b}" for b in baselines if b in times] + [t for t, _ in extra]
    body = []
    for name, secs in rows:
        line = [name, f"{secs * scale:,.1f}"]
        line += [f"{secs / times[b]:.2f}x" for b in baselines if b in times]
        line += [str(col.get(name, "-")) for _, col in extra]
        body.append(line)
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    print(title)
    for r in [head] + body:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        print("  " + "  ".join(cells))
