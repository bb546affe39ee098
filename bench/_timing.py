"""The timing helpers every benchmark here shares: one core per run, sides interleaved, and an
aligned table of ratios.

Why interleaved: on a shared machine the load changes from second to second.  Timing one side
after the other lets a busy minute land on one side only (three runs of the MLP step once gave
compile_step/NumPy ratios of 1.47, 1.08 and 1.78).  So every comparison here runs in *rounds*:
in each round every side is timed for a few repetitions, the sides taking turns (the order
rotates from round to round), and a side's result is the *minimum over rounds of its per-round
median*.  The median inside a round shrugs off one garbage collection; the minimum over rounds
keeps the round least disturbed by the rest of the machine -- which, the sides alternating, is
the same stretch of time for all of them.  The first round is a warm-up and is discarded.

Why one core: thread flags alone do not hold every library to one thread (JAX used 1.9 cores at
batch 1024 despite its XLA flags).  ``pin`` binds the whole process to one CPU
(``os.sched_setaffinity``), and every thread a library starts later inherits that binding.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VKML_THREADS")
ONE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def pin(threads: int = 1, cpu: int | None = None) -> str:
    """Hold this process to ``threads`` threads; with one thread, also bind it to one CPU.

    Call it BEFORE NumPy or a peer's library is imported: libgomp and OpenBLAS read their thread
    counts when they load, and threads started before the binding would keep running anywhere.
    The CPU is ``cpu``, else ``$VKML_BENCH_CPU``, else the last one this process may use.  Returns
    a line for the bench's header that says what was set.
    """
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if threads == 1:
        os.environ.setdefault("XLA_FLAGS", ONE_THREAD_XLA)
    if threads != 1 or not hasattr(os, "sched_setaffinity"):
        return f"{threads} thread(s) per side ({'/'.join(THREAD_VARS)}), not pinned"
    allowed = sorted(os.sched_getaffinity(0))
    if cpu is None:
        cpu = int(os.environ.get("VKML_BENCH_CPU", allowed[-1]))
    os.sched_setaffinity(0, {cpu})
    return (f"one thread per side, pinned to CPU {cpu} of {os.cpu_count()} "
            f"(load average {os.getloadavg()[0]:.1f} at start)")


def pin_from_argv(default: int = 1) -> str:
    """``pin`` with the thread count of ``--threads N`` on the command line (``default`` without)."""
    threads = default
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            threads = int(sys.argv[i + 1])
        elif a.startswith("--threads="):
            threads = int(a.split("=", 1)[1])
    return pin(threads)


def sampler(*phases, reps: int = 5, number: int = 1, between=None):
    """A callable that times one round of a side: ``reps`` repetitions, each running ``between()``
    untimed, then every phase in turn (each ``number`` times back to back, for calls shorter than
    the clock's resolution).  It returns the median seconds of one call of each phase, a tuple.

    Phases of one side are timed as a sequence because some must follow each other (a recorded
    launch, then its reverse)."""
    clock = time.perf_counter

    def one_round():
        samples = [[] for _ in phases]
        for _ in range(reps):
            if between is not None:
                between()
            for phase, out in zip(phases, samples):
                t0 = clock()
                for _ in range(number):
                    phase()
                out.append((clock() - t0) / number)
        return tuple(statistics.median(s) for s in samples)

    return one_round


def interleave(samplers: dict, *, rounds: int = 7, warmup_rounds: int = 1) -> dict:
    """Run ``samplers`` (side name -> a callable returning a tuple of medians, as ``sampler``
    makes) in alternating rounds; return side name -> the minimum over rounds of each median.

    The order rotates every round (A B C, B C A, ...), so no side always runs right after
    another.  The first ``warmup_rounds`` rounds fill caches and compiles and are discarded."""
    names = list(samplers)
    best: dict = {}
    for r in range(warmup_rounds + rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            medians = samplers[name]()
            if r >= warmup_rounds:
                best[name] = medians if name not in best else tuple(map(min, best[name], medians))
    return {name: best[name] for name in names}


def time_sides(sides: dict, *, rounds: int = 7, reps: int = 5, number: int = 1,
               warmup_rounds: int = 1) -> dict:
    """Seconds per call of each side (name -> zero-argument callable), interleaved: the common case
    of ``interleave`` with one phase per side."""
    samplers = {name: sampler(fn, reps=reps, number=number) for name, fn in sides.items()}
    return {name: m[0] for name, m in interleave(samplers, rounds=rounds,
                                                 warmup_rounds=warmup_rounds).items()}


def median_seconds(fn, *, repeat: int = 100, warmup: int = 10, number: int = 1) -> float:
    """Median wall time of one ``fn()`` call, in seconds, timed alone (for a measurement with no
    side to compare against; comparisons use ``time_sides``)."""
    for _ in range(warmup):
        fn()
    return sampler(fn, reps=repeat, number=number)()[0]


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
    print(title)
    print_rows(head, body)


def print_rows(head, rows) -> None:
    """Print a header and rows of strings aligned: the first column to the left, the rest to
    the right."""
    widths = [max(len(r[i]) for r in [head] + list(rows)) for i in range(len(head))]
    for r in [head] + list(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        print("  " + "  ".join(cells))


def cpu_model() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it (every table names the machine)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def blas() -> str:
    """NumPy's BLAS library and version (import NumPy only after ``pin``)."""
    import numpy as np
    try:
        config = np.show_config(mode="dicts")
        info = config["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version', '')}".strip()
    except Exception:                       # (older NumPy: no dict form)
        return "NumPy's BLAS"
