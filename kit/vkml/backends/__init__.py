"""Backends: where Programs are compiled and run.  ``numpy`` is the reference; the compiled
``cpu`` tier is the default where a C compiler is found (``base.default_backend``)."""

from . import cpu, numpy_backend  # noqa: F401  (register "cpu" and "numpy")
from .base import (STATS, Backend, ExecutionFailure, Stats, current, register, reset_stats,
                   set_backend, started, stats, use_backend)
from .base import backend_info as _backend_info
from ..install import install_hint


def _cuda():
    from .cuda import CudaBackend  # local: `import vkml` never imports the CUDA backend or PyCUDA
    return CudaBackend()


register("cuda", _cuda)


def backend_info() -> dict:
    """What the current backend is and why (``info["default"]``: ``"cpu: a C compiler was found
    (...)"``, ``"numpy: VKML_BACKEND=numpy"``, ... or ``"set by set_backend"``), which backends
    this machine has, and what the cuda backend found (``info["cuda"]``: the GPU, or what is
    missing).

    >>> info = vkml.backend_info()
    >>> info["backend"], "numpy" in info["available"]
    ('numpy', True)
    >>> print(info["default"])   # how the backend was chosen (here: set in code)
    set by set_backend
    """
    from . import cuda  # local: loaded only when asked about (see _cuda)
    info = _backend_info()
    info["cuda"] = cuda.describe()
    reason = cuda_unavailable()
    if reason is not None:  # listed only where it can run; "cuda" above says what is missing
        info["available"] = [n for n in info["available"] if n != "cuda"]
        info["unavailable"] = {"cuda": reason}
    return info


def cuda_unavailable():
    """Why the cuda backend cannot run here (None when it may): PyCUDA, cuda-bindings or the
    NVIDIA driver missing.  Found without importing PyCUDA, so ``vkml.backend_info()`` stays
    cheap; a backend already started is available."""
    from . import cuda  # local: loaded only when asked about (see _cuda)
    if started("cuda"):
        return None
    found = cuda.probe()
    missing = [part.split(":")[0] for part in found.split("; ")
               if part.endswith("not installed") or part.endswith("not found")]
    missing = [m for m in missing if m != "nvcc"]   # a cubin cache can run without the compiler
    if not missing:
        return None
    return f"missing {', '.join(missing)} ({install_hint('cuda')} on a machine with an NVIDIA GPU)"


__all__ = ["STATS", "Backend", "ExecutionFailure", "Stats", "backend_info", "current",
           "reset_stats", "set_backend", "stats", "use_backend"]
