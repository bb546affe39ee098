"""Backends: where Programs are compiled and run.  ``numpy`` is the reference and the default."""

from . import cpu, numpy_backend  # noqa: F401  (register "cpu" and "numpy")
from .base import (STATS, Backend, ExecutionFailure, Stats, backend_info, current, reset_stats,
                   set_backend, stats)

__all__ = ["STATS", "Backend", "ExecutionFailure", "Stats", "backend_info", "current",
           "reset_stats", "set_backend", "stats"]
