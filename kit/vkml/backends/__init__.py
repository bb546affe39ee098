"""Backends: where Programs are compiled and run.  ``numpy`` is the reference and the default."""

from . import cpu, numpy_backend  # noqa: F401  (register "cpu" and "numpy")
from .base import (STATS, Backend, ExecutionFailure, Stats, current, register, reset_stats,
                   set_backend, stats, use_backend)
from .base import backend_info as _backend_info


def _cuda():
    # imported on first use: `import vkml` never imports the CUDA backend or PyCUDA
    from .cuda import CudaBackend
    return CudaBackend()


register("cuda", _cuda)


def backend_info() -> dict:
    """What the current backend is, which backends this machine has, and what the cuda backend
    found (``info["cuda"]``: the GPU, or what is missing)."""
    from . import cuda
    info = _backend_info()
    info["cuda"] = cuda.describe()
    return info


__all__ = ["STATS", "Backend", "ExecutionFailure", "Stats", "backend_info", "current",
           "reset_stats", "set_backend", "stats", "use_backend"]
