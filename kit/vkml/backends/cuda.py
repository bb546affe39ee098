"""The CUDA backend: generated kernels compiled with PyCUDA, each submission one CUDA-graph launch.

``vkml.set_backend("cuda")`` (or ``VKML_BACKEND=cuda``) needs the ``cuda``
extra -- PyCUDA (built from its sdist with nvcc, linked to the NVIDIA
driver) and NVIDIA's ``cuda-bindings`` for the stream-capture calls PyCUDA
lacks -- and a GPU.  Without them selecting it raises
:class:`vkml.BackendError` saying what is missing, and
``vkml.backend_info()["cuda"]`` says what was found.  PyCUDA is imported
only when the backend is made, never by ``import vkml``.

How a Program runs:

1. **Code**: the shared lowering rendered as CUDA C
   (``codegen/cuda_render.py``: grid kernels for independent loop nests,
   one-block kernels for scans/while/cond, a tiled matmul) and compiled
   once per source by nvcc through PyCUDA (``pycuda.compiler.compile``,
   then ``module_from_buffer``).  PyCUDA's own cache is switched off: the
   cubins go to a per-user cache (``$VKML_CACHE_DIR/cuda`` or
   ``~/.cache/vkml/cuda``, mode 0700, which must belong to the user, else a
   private temporary one is used with a warning) under a hash of source,
   flags, target and nvcc version, written to a temporary file and renamed,
   with a hash of their name and content beside them.  A cubin is read once
   through a file opened without following symlinks, checked, and those same
   bytes go to the driver; one that does not check out, or fails to load,
   is rebuilt, never loaded (the rules are in ``disk_cache``).
   ``vkml.stats().compiles`` counts nvcc runs; a cubin loaded from the disk
   cache counts as a cache hit.
2. **Buffers**: every kernel finds its buffers through the executable's
   device *pointer table* (``vk_bufs``).  The executable owns its
   temporaries, the table (and a page-locked host copy of it), the status
   words and the small-input block; a buffer with page-locked staging for an
   input or a result only once a run passes that input as a NumPy array or
   returns that result to the host -- runs on DeviceArrays use them where
   they lie and allocate nothing for them.  An executable nobody holds any
   more (evicted from the bounded cache, or dropped by ``clear_cache`` while
   no memo of the graph layer still runs it) gives its device memory back at
   the backend's next call.
3. **Values stay on the GPU**: a realize, a backward or a jitted call keeps
   its results as :class:`DeviceArray` values (memory from a per-size pool
   of the backend), so a training loop's parameters and gradients never
   travel through the host; ``tensor.numpy()`` copies one to the host once.
   A run points the table's input entries at the DeviceArrays it is given
   and its output entries at fresh ones: no copies on the device.  NumPy
   arguments are staged and copied into the executable's own buffers; those
   of at most ``SMALL_INPUT_BYTES`` (Python scalars, short vectors) share one
   page-locked block that the captured graph copies itself.  A run may be
   given destinations (``into``): device planes its results are computed
   straight into (their addresses go in the table) where they overlap no
   argument, else copied into on the device after it.
   DeviceArrays speak ``__cuda_array_interface__`` (version 3), so CuPy,
   PyTorch and Numba take them without a copy, and
   ``CudaBackend.to_plane`` takes theirs the same way (the wrapper keeps
   their owner alive and never frees their memory); ``.numpy()`` is the
   explicit copy to the host.
4. **One submission = one CUDA graph launch**: the first run of an
   executable goes launch by launch and is checked (cuBLAS sets itself up on
   its first product -- allocations a capture refuses); then the
   submission's device work is captured on the backend's PyCUDA stream
   (non-blocking: another library's work on the legacy default stream
   neither waits for it nor invalidates its capture) with the driver's
   stream capture (``cuStreamBeginCapture`` / ``cuStreamEndCapture``
   through ``cuda-bindings``, given ``stream.handle``): the copies of the
   host pointer table and of the small-input block to the device, every
   kernel launch (or cuBLAS call) and the copy back of the status words.  The graph is instantiated once and cached
   with the executable; every later run writes the table, copies NumPy
   arguments in, launches the graph (``vkml.stats().graph_launches``) and
   waits for it.  Nothing is allocated, and no synchronous copy is made,
   while capturing.
5. **Matrix products** of float32/float64 buffers with at least
   ``VKML_CUDA_CUBLAS_MIN`` (default 2^18) multiply-adds go through cuBLAS
   (loaded with ctypes from ``VKML_CUDA_CUBLAS_LIBRARY``, the toolkit or the
   ``nvidia-cublas`` wheel, with a fixed workspace so it can be captured;
   every status it returns is checked, a failure is a BackendError naming
   the call) when it is found; otherwise the tiled kernel (same bits as the
   loops).  cuBLAS accumulates with fused multiply-adds, so its products
   are close to the loops', not bitwise equal.  ``VKML_CUDA_CUBLAS=0`` turns
   it off.  cuBLAS takes its pointers by value when captured, so the buffers a
   cuBLAS call touches keep their addresses: a DeviceArray argument for one
   is copied into it on the device, and a result is copied out of it.
6. **Errors**: a gather index out of range stops the submission (later
   kernels return at once) and is raised as on the CPU tier, naming the
   index, the axis and its size.
7. **Threads**: the context is pushed around every call and popped after
   it (``_Gpu.active``), on whichever thread makes it, so every allocation,
   copy, launch and free has it current and no thread ever ends with it
   pushed (PyCUDA aborts the process then).  An imported array's
   ``__cuda_array_interface__`` ``stream`` is waited for before its memory
   is used.
8. **Casts**: a float converted to an integer gives NumPy's x86 results
   (the type's minimum for NaN and out-of-range values, where a GPU's own
   conversion saturates), through the helper both tiers share.
9. **Ctrl-C**: a submission is one graph launch, which the host cannot stop;
   the KeyboardInterrupt comes once it has finished (the run always waits
   for the device, interrupted or not, before its buffers are used again).
   Loops of submissions (the graph layer's steps) stop between two of them.

What was verified without a GPU (``tests/cuda/test_cuda_codegen.py``, ``tests/cuda/test_cuda_driver.py``): the
generated CUDA compiles with ``nvcc --ptx``; the launch plans compute the
NumPy backend's results under a host emulation of the kernels; this module
runs end to end on an emulated driver (``tests/cuda_emulation.py``: stand-ins
for ``pycuda.driver``, ``cuda.bindings.driver`` and cuBLAS with per-thread
context stacks, asynchronous streams, captures that refuse allocations and
synchronous copies and are invalidated by legacy-stream work, garbage
shared memory and GPU float-to-int conversion, as the driver does), and so
does ``tests/cuda/test_cuda.py``; the no-GPU paths.  The
real driver calls (PyCUDA's allocation, copies and launches, stream capture,
graph instantiation and launch through cuda-bindings, cuBLAS) have NOT run
on a GPU yet: ``tests/test_cuda.py`` and ``bench/gpu.py`` check them on the
first machine with one (``scripts/device-check``).

The graph layer on this backend (``keeps_planes_on_device``): ``Graph.build()``
makes every plane a device plane (``to_plane``: a NumPy array copied once, a
device array taken as it is); a launch of plain kernel launches and its
reverse are one submission each, so one CUDA-graph replay each, on device
planes in and out: no plane crosses PCIe, only the pointer table, the
small-argument block (the Param cells) and the status words, and the Param gradients (one value each) come back to the host.  The
Record's copies of overwritten versions, ``keep()`` and a refused call's
backups are copies on the device (``copy_plane``); per-sample gradients are
DeviceArrays.  A graph with skippables and repeat_whiles guarded by cells runs
node by node on its device planes (each node one submission; the guard cell
is read on the host), and its reverse too.  A graph with nodes that run
Python on the values (opaque nodes, reductions, guards that are functions)
copies its planes to the host and the written ones back, explicitly, around
each launch (``graph/run.py``).
A simulation keeps its planes, checkpoints, step counts and gradients in
device memory too: one the per-sample loops cover runs as two kernels
(``cuda_loops.py``), any other is stepped from the host with one program per
step on device arrays (``graph/simulation/device_steps.py``; a model node's values
are copied to the host and back around it, explicitly); its default
``memory_budget`` is half the free device memory.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import gc
import hashlib
import importlib.util
import os
import shutil
import struct
import threading
import weakref

import numpy as np

from ..errors import ArgumentError, BackendError, DTypeError, ExecutionError, ShapeError
from ..install import install_hint
from ..ops.checks import warn_at_user
from ..stats import STATS
from . import disk_cache
from .base import (Backend, DeviceValue, ExecutionFailure, check_sizes, copy_into, failure_error,
                   host_values)
from .codegen.cuda_render import (NVCC_FLAGS, STATUS_WORDS, cuda_plan, template,
                                  tree_sum_levels)
from .codegen.lower import Unsupported
from .codegen.sample_loops import LoopSpec
from .cuda_loops import CudaSampleLoops
from .numpy_backend import compile_program as compile_numpy
from .nvrtc import Nvrtc, NvrtcError, toolkit_libraries

#: ``CU_STREAM_NON_BLOCKING``: the backend's stream does not synchronise with the legacy default
#: stream
STREAM_NON_BLOCKING = 1
#: what the last attempt to make the backend found (shown by vkml.backend_info()["cuda"])
_FOUND = [None]
#: what this machine has for it, probed once without importing PyCUDA
_PROBE = [None]


def describe() -> str:
    """What this machine offers the cuda backend, without importing PyCUDA."""
    if _FOUND[0] is not None:
        return _FOUND[0]
    return probe()


def probe() -> str:
    """What this machine has for the cuda backend (PyCUDA, cuda-bindings, nvcc, the driver),
    found once without importing PyCUDA; ``vkml.backends.cuda_unavailable`` reads it too."""
    if _PROBE[0] is None:
        _PROBE[0] = _probe()
    return _PROBE[0]


def _probe() -> str:
    parts = []
    parts.append("pycuda: " + ("installed" if importlib.util.find_spec("pycuda") else "not installed"))
    try:
        bindings = importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError):
        bindings = False
    parts.append("cuda-bindings: " + ("installed" if bindings else "not installed"))
    parts.append("nvcc: " + (shutil.which("nvcc") or "not found"))
    parts.append("libcuda (NVIDIA driver): " + (ctypes.util.find_library("cuda") or "not found"))
    return "not started; " + "; ".join(parts)


def cache_dir() -> str:
    """The per-user cubin cache (``$VKML_CACHE_DIR/cuda`` or ``~/.cache/vkml/cuda``), mode 0700."""
    return disk_cache.cache_dir("cuda")


def _driver_modules():
    """``(pycuda.driver, cuda-bindings' driver module)``, or BackendError saying what is missing."""
    try:
        import pycuda.driver as drv  # local: optional dependency
    except (ImportError, OSError) as e:
        raise BackendError(
            f"the cuda backend needs PyCUDA and an NVIDIA driver: importing pycuda.driver failed "
            f"({e}). Install the extra on a machine with a GPU, nvcc and the driver "
            f"({install_hint('cuda')}), or use set_backend('numpy') or set_backend('cpu')") from e
    try:
        from cuda.bindings import driver as cu  # local: optional dependency
    except ImportError:
        try:
            from cuda import cuda as cu  # local: optional dependency (cuda-python before 12.6)
        except ImportError as e:
            raise BackendError(
                "the cuda backend needs NVIDIA's cuda-bindings for CUDA graphs (stream capture): "
                f"{e}. pip install cuda-bindings") from e
    return drv, cu


class _Gpu:
    """The device, its primary context, one stream, the compiled-module cache and cuBLAS.

    The context is current only inside :meth:`active` (pushed on entry, popped on exit, on
    whichever thread): PyCUDA keeps a stack of contexts per thread and aborts the process when a
    thread ends with one still pushed, so no thread -- the graph layer's workers, a user's own --
    may leave one behind.  Every allocation, copy, launch and free happens inside it.
    """

    def __init__(self):
        drv, cu = _driver_modules()
        self.drv, self.cu = drv, cu
        try:
            drv.init()
            count = drv.Device.count()
        except Exception as e:                      # pycuda's LogicError/RuntimeError: no driver
            raise BackendError(f"the cuda backend found no usable GPU: CUDA driver error {e}") from e
        if count == 0:
            raise BackendError("the cuda backend found no GPU (the CUDA driver reports 0 devices); "
                               "use set_backend('numpy') or set_backend('cpu')")
        index = int(os.environ.get("VKML_CUDA_DEVICE", "0"))
        if not 0 <= index < count:
            raise BackendError(f"VKML_CUDA_DEVICE={index}, but this machine has {count} GPU(s)")
        _check(cu, cu.cuInit(0), "cuInit")
        self.device = drv.Device(index)
        self.context = self.device.retain_primary_context()
        self._tls = threading.local()
        self.lock = threading.RLock()
        #: device memory of executables nobody holds any more, freed at the next safe point
        self.graveyard = []
        self.executables = weakref.WeakSet()
        self.modules = {}
        self.cublas = None
        #: NVRTC when found (in-process, faster than nvcc), else None; why it is not used, if so
        self.nvrtc = Nvrtc.load()
        self.nvrtc_note = None if self.nvrtc else "not found (VKML_CUDA_NVRTC=0, or no libnvrtc)"
        with self.active():                  # popped again even when a step below fails
            # non-blocking: another library's work on the legacy default stream neither waits
            # for this stream nor invalidates a capture on it
            self.stream = drv.Stream(flags=STREAM_NON_BLOCKING)
            self.cu_stream = cu.CUstream(self.stream.handle)
            major, minor = self.device.compute_capability()
            self.arch = f"sm_{major}{minor}"
            self.sm_count = self.device.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
            self.name = self.device.name()
            self.total_memory = self.device.total_memory()
            if os.environ.get("VKML_CUDA_CUBLAS", "1") != "0":
                self.cublas = _Cublas.load(self)
            self.pool = _Pool(self)

    @contextlib.contextmanager
    def active(self):
        """The context made current on this thread for the block, and popped after it (nested
        blocks push once).  A driver call that fails inside (PyCUDA raises its own errors, named
        after the call: "cuMemAlloc failed: out of memory") comes out as a BackendError."""
        depth = getattr(self._tls, "depth", 0)
        if depth == 0:
            self.context.push()
        self._tls.depth = depth + 1
        try:
            yield self
        except self.drv.Error as e:
            raise BackendError(f"a CUDA driver call failed: {e}; free device memory "
                               "(backend.empty_cache(), drop large arrays) if it ran out, else "
                               "report it with vkml.backend_info()") from e
        finally:
            self._tls.depth = depth
            if depth == 0:
                self.drv.Context.pop()

    def bury(self, allocations):
        """Device memory of an executable that nobody holds: freed by :meth:`drain` at the next
        safe point (a garbage collection may run this in the middle of a capture, where a free
        is not allowed, or on a thread without the context)."""
        self.graveyard.append(allocations)

    def drain(self):
        """Free what :meth:`bury` collected (under the lock, with the context current)."""
        while self.graveyard:
            for alloc in self.graveyard.pop():
                try:
                    alloc.free()
                except Exception:                   # already freed, or the context is gone
                    pass

    def close(self):
        """Free what the backend holds (at exit); the context is popped again after it."""
        with self.lock, self.active():
            try:
                self.stream.synchronize()
            except Exception:
                pass
            for exe in list(self.executables):
                exe.release()
            self.executables.clear()
            self.drain()
            if self.cublas is not None:
                self.cublas.release()
                self.cublas = None
            self.pool.close()
            self.modules.clear()

    def compiler_version(self) -> str:
        """The compiler that makes this machine's cubins (part of their cache key)."""
        if self.nvrtc is not None:
            return self.nvrtc.version
        from pycuda.compiler import get_nvcc_version  # local: optional dependency
        return get_nvcc_version("nvcc")

    def module(self, source: str):
        """The loaded module of ``source``: from memory, from the disk cache, or compiled (counted)."""
        flags = NVCC_FLAGS + ["-arch", self.arch]
        key = hashlib.sha256("\0".join([source, self.compiler_version()] + flags).encode()
                             ).hexdigest()[:32]
        mod = self.modules.get(key)
        if mod is not None:
            return mod, False
        mod, compiled = disk_cache.cached("cuda", key, ".cubin", lambda folder: self._nvcc(source),
                                          lambda cubin, folder: self.drv.module_from_buffer(cubin))
        self.modules[key] = mod
        return mod, compiled

    def _nvcc(self, source: str) -> bytes:
        """The cubin NVRTC (when found) or nvcc makes of ``source`` (counted as a compile).  If
        NVRTC fails on a module, nvcc compiles it and every later one (the reason is kept)."""
        if self.nvrtc is not None:
            try:
                cubin = self.nvrtc.cubin(source, self.arch, NVCC_FLAGS)
                STATS.compiles += 1
                return cubin
            except NvrtcError as e:
                self.nvrtc_note = f"nvcc instead: NVRTC failed on a module ({str(e)[:300]})"
                self.nvrtc = None
        from pycuda.compiler import compile as nvcc_compile  # local: optional dependency
        try:
            cubin = nvcc_compile(source, options=list(NVCC_FLAGS), no_extern_c=True,
                                 arch=self.arch, cache_dir=False)
        except self.drv.CompileError as e:
            raise BackendError(f"nvcc failed on generated CUDA code: {e}") from e
        STATS.compiles += 1
        return cubin

    def wait_for(self, stream: int):
        """Wait until the work queued so far on another library's ``stream`` (a handle; 1 the
        legacy default stream, 2 the per-thread one) has finished."""
        with self.lock, self.active():
            _check(self.cu, self.cu.cuStreamSynchronize(self.cu.CUstream(stream)),
                   "cuStreamSynchronize (of an imported array's stream)")

    def free_memory(self) -> int:
        with self.lock, self.active():
            return self.drv.mem_get_info()[0]


def _check(cu, result, what):
    """Unpack a cuda-bindings result tuple, raising BackendError on an error code."""
    if not isinstance(result, tuple):
        result = (result,)
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        try:
            name = cu.cuGetErrorName(err)[1].decode()
        except Exception:
            name = str(err)
        raise BackendError(f"{what} failed: {name}")
    return result[1] if len(result) == 2 else result[1:]


#: cuBLAS's status codes, for the messages of calls that fail
_CUBLAS_STATUS = {1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
                  7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH",
                  11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
                  14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
                  16: "CUBLAS_STATUS_LICENSE_ERROR"}


def _blas_check(status, call):
    """BackendError naming ``call`` when cuBLAS returned a status other than success."""
    if status != 0:
        raise BackendError(f"{call} failed: {_CUBLAS_STATUS.get(status, 'status')} ({status}); "
                           "VKML_CUDA_CUBLAS=0 runs products on vkml's own kernel instead")


class _Cublas:
    """cuBLAS through ctypes: a handle bound to the backend's stream, with a fixed workspace so
    that its calls can be captured into a CUDA graph.  Every call's status is checked.  cuBLAS
    sets itself up (allocations, loading its kernels) on its first product, which a capture
    refuses: an executable's first run is never captured (see ``CudaExecutable``).
    ``VKML_CUDA_CUBLAS_LIBRARY`` names the library to load first."""

    WORKSPACE = 32 << 20

    def __init__(self, gpu, lib):
        self.gpu, self.lib = gpu, lib
        self.handle = ctypes.c_void_p()
        if lib.cublasCreate_v2(ctypes.byref(self.handle)) != 0:
            raise OSError("cublasCreate failed")
        self.workspace = None
        try:
            _blas_check(lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(gpu.stream.handle)),
                        "cublasSetStream_v2")
            self.workspace = gpu.drv.mem_alloc(self.WORKSPACE)
            if hasattr(lib, "cublasSetWorkspace_v2"):
                _blas_check(lib.cublasSetWorkspace_v2(
                    self.handle, ctypes.c_void_p(int(self.workspace)),
                    ctypes.c_size_t(self.WORKSPACE)), "cublasSetWorkspace_v2")
        except BaseException:
            self.release()
            raise
        self.min_work = int(os.environ.get("VKML_CUDA_CUBLAS_MIN", str(1 << 18)))
        self.path = getattr(lib, "_name", str(lib))
        ll, i, p = ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p
        for name in ("cublasSgemmStridedBatched", "cublasDgemmStridedBatched"):
            fn = getattr(lib, name)
            fn.argtypes = [p, i, i, i, i, i, p, p, i, ll, p, i, ll, p, p, i, ll, i]
            fn.restype = i

    @staticmethod
    def candidates():
        names = [os.environ["VKML_CUDA_CUBLAS_LIBRARY"]] \
            if os.environ.get("VKML_CUDA_CUBLAS_LIBRARY") else []
        return names + ["libcublas.so", "libcublas.so.13", "libcublas.so.12"] + \
            toolkit_libraries("libcublas")

    @classmethod
    def load(cls, gpu):
        for name in cls.candidates():
            try:
                return cls(gpu, ctypes.CDLL(name))
            except (OSError, AttributeError):
                continue
        return None

    def wants(self, spec) -> bool:
        if spec.gemm is None:
            return False
        *_, batch, m, n, k, dtype = spec.gemm
        return dtype in (np.float32, np.float64) and batch * m * n * k >= self.min_work and \
            max(m, n, k) < 2 ** 31

    def gemm(self, bufs, spec):
        """Row-major ``c = a @ b`` per batch, as the column-major ``c^T = b^T a^T``."""
        a, b, c, batch, m, n, k, dtype = spec.gemm
        one, zero = (ctypes.c_float(1), ctypes.c_float(0)) if dtype == np.float32 else \
            (ctypes.c_double(1), ctypes.c_double(0))
        fn = self.lib.cublasSgemmStridedBatched if dtype == np.float32 else \
            self.lib.cublasDgemmStridedBatched
        status = fn(self.handle, 0, 0, n, m, k, ctypes.byref(one), int(bufs[b]), n, k * n,
                    int(bufs[a]), k, m * k, ctypes.byref(zero), int(bufs[c]), n, m * n, batch)
        _blas_check(status, "cublasSgemmStridedBatched" if dtype == np.float32 else
                    "cublasDgemmStridedBatched")

    def release(self):
        try:
            self.lib.cublasDestroy_v2(self.handle)
        except Exception:
            pass
        if self.workspace is not None:
            try:
                self.workspace.free()
            except Exception:
                pass
        self.workspace = None


class _Pool:
    """Device memory for the values the backend hands out, reused per size.

    ``cuMemAlloc`` costs tens of microseconds and synchronizes the device;
    a training step makes the same sizes every time, so a DeviceArray's
    memory goes back to a free list when the array is dropped and the next
    result of that size takes it.  Every run waits for its work to finish,
    so memory handed back is never still in use by a kernel.
    """

    GRAIN = 256

    def __init__(self, gpu):
        self.gpu = gpu
        self.free = {}
        #: the DeviceArrays wrapping other libraries' memory, by (pointer, shape, dtype, readonly)
        self.wrapped = weakref.WeakValueDictionary()
        self.allocations = 0
        self.reuses = 0

    def array(self, shape, dtype, mutable=False) -> "DeviceArray":
        """Device memory for a value (or, ``mutable``, a plane) of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        nbytes = max(1, int(np.prod(shape, dtype=np.int64))) * dtype.itemsize
        nbytes = -(-nbytes // self.GRAIN) * self.GRAIN
        with self.gpu.lock:
            spare = self.free.get(nbytes)
            if spare:
                self.reuses += 1
                return DeviceArray(self, spare.pop(), nbytes, shape, dtype, mutable=mutable)
        with self.gpu.lock, self.gpu.active():
            try:
                alloc = self.gpu.drv.mem_alloc(nbytes)
            except self.gpu.drv.Error:
                # values dropped in reference cycles (a Var and its Eqn) come back at a
                # collection; then every spare block goes back to the driver, and one more try
                gc.collect()
                self.release_spare()
                alloc = self.gpu.drv.mem_alloc(nbytes)
        self.allocations += 1
        return DeviceArray(self, alloc, nbytes, shape, dtype, mutable=mutable)

    def give_back(self, alloc, nbytes):
        if self.free is not None:
            self.free.setdefault(nbytes, []).append(alloc)

    @property
    def spare_bytes(self) -> int:
        return sum(n * len(v) for n, v in (self.free or {}).items())

    def release_spare(self) -> int:
        """Free the spare blocks (with the context current); the bytes released."""
        spare = self.spare_bytes
        with self.gpu.lock, self.gpu.active():
            for blocks in (self.free or {}).values():
                while blocks:
                    blocks.pop().free()
        return spare

    def close(self):
        self.release_spare()
        self.free = None


class _PlaneFlags:
    """``DeviceArray.flags``: the two a plane is asked about."""

    __slots__ = ("writeable",)
    c_contiguous = True

    def __init__(self, writeable):
        self.writeable = writeable


def device_copy(gpu, dst, src):
    """Copy ``src`` (a DeviceArray, or a host array of ``dst``'s shape and dtype) into
    DeviceArray ``dst``, refusing (before anything is copied) a mismatch or a read-only
    destination.  Synchronous: enqueued on the backend's stream (after every kernel that wrote
    ``src``) and waited for, so that the host and other libraries, which may use other streams,
    see it done when this returns."""
    if dst.readonly:
        raise ArgumentError("the destination plane is read-only (its owner exported it so); "
                            "bind a writeable array")
    if tuple(src.shape) != dst.shape:
        raise ShapeError(f"copying into a device plane: the source has shape "
                         f"{tuple(src.shape)}, the plane {dst.shape}")
    if src.dtype != dst.dtype:
        raise DTypeError(f"copying into a device plane: the source holds {src.dtype}, the plane "
                         f"{dst.dtype}; convert the source first")
    if not dst.size:
        return
    with gpu.lock, gpu.active():
        if isinstance(src, DeviceArray):
            gpu.drv.memcpy_dtod_async(dst.ptr, src.ptr, dst.nbytes, gpu.stream)
        else:
            gpu.drv.memcpy_htod_async(dst.ptr, np.ascontiguousarray(src), gpu.stream)
        gpu.stream.synchronize()
    dst._host = None


#: the dtypes a device plane may hold: those generated code has a C type for
PLANE_DTYPES = tuple(np.dtype(t) for t in (np.float64, np.float32, np.int64, np.int32, np.bool_))


class DeviceArray(DeviceValue):
    """A value or a plane in GPU memory: what realizes, backwards, jitted calls and the graph
    layer hold on the cuda backend.

    Other GPU libraries take it without a copy through ``__cuda_array_interface__`` (CuPy's
    ``cupy.asarray(a)``, ``torch.as_tensor(a, device="cuda")``, Numba), and
    ``CudaBackend.to_plane`` takes theirs the same way (:meth:`wrap`).  Reading it on the host
    is explicit: ``a.numpy()`` copies it to a new NumPy array; ``np.asarray(a)`` does the same,
    except that a *value* (a tensor's result, never written in place) keeps its host copy
    (read-only) for the next read.  A *plane* (``mutable``: a graph plane, or another library's
    memory) may change on the device at any time, so every read copies it again.  Pool memory
    returns to the backend's pool when the array is dropped; memory wrapped from another library
    stays that library's (the wrapper keeps its owner alive and never frees it).
    """

    __slots__ = ("shape", "dtype", "_pool", "_alloc", "_nbytes", "_host", "_owner", "mutable",
                 "readonly", "__weakref__")

    def __init__(self, pool, alloc, nbytes, shape, dtype, owner=None, mutable=False,
                 readonly=False):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self._pool, self._alloc, self._nbytes, self._host = pool, alloc, nbytes, None
        self._owner, self.mutable, self.readonly = owner, mutable, readonly

    @classmethod
    def wrap(cls, pool, obj) -> "DeviceArray":
        """``obj`` (anything with ``__cuda_array_interface__``: a CuPy array, a PyTorch CUDA
        tensor, a Numba device array) as a DeviceArray over the same memory, without a copy.
        Refused (nothing is kept) unless it is C-contiguous, of a dtype generated code computes
        with, with a device pointer (non-null when it has elements) and no mask."""
        where = f"a {type(obj).__name__} with __cuda_array_interface__"
        try:
            face = obj.__cuda_array_interface__
            shape = tuple(int(d) for d in face["shape"])
            typestr, (ptr, readonly) = face["typestr"], face["data"]
            strides, mask, stream = face.get("strides"), face.get("mask"), face.get("stream")
            dtype = np.dtype(typestr)
            ptr = int(ptr or 0)
            stream = None if stream is None else int(stream)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ArgumentError(f"{where}: its interface is not version-3 shaped "
                                f"(shape, typestr, data=(pointer, readonly)): {e}") from None
        if dtype not in PLANE_DTYPES:
            raise DTypeError(f"{where}: typestr {typestr!r} ({dtype}) is not a dtype the cuda "
                             f"backend computes with ({', '.join(d.name for d in PLANE_DTYPES)}); "
                             "pass a copy converted to one of them")
        if any(d < 0 for d in shape):
            raise ShapeError(f"{where}: shape {shape} has a negative extent")
        size = int(np.prod(shape, dtype=np.int64))
        if strides is not None and size > 1:
            want = [dtype.itemsize] * len(shape)
            for i in range(len(shape) - 2, -1, -1):
                want[i] = want[i + 1] * shape[i + 1]
            if any(s != w for s, w, d in zip(strides, want, shape) if d > 1):
                raise ArgumentError(f"{where}: it is not C-contiguous (strides {tuple(strides)}, "
                                    f"C order would be {tuple(want)}); pass a contiguous copy "
                                    "(cupy.ascontiguousarray(a), tensor.contiguous())")
        if mask is not None:
            raise ArgumentError(f"{where}: it has a mask; pass an array without one")
        if ptr == 0 and size > 0:
            raise ArgumentError(f"{where}: its data pointer is null although it holds {size} "
                                "elements; pass an array whose memory is allocated")
        if stream == 0:
            raise ArgumentError(f"{where}: its stream is 0, which version 3 of the interface "
                                "does not allow (1 is the legacy default stream, 2 the per-thread "
                                "one); export it with its stream handle or None")
        if stream is not None:
            # its owner may still be writing it on that stream: wait for the work queued there
            pool.gpu.wait_for(stream)
        # one wrapper per piece of memory: two objects over the same memory are the same plane
        key = (ptr, shape, dtype, bool(readonly))
        wrapper = pool.wrapped.get(key)
        if wrapper is None:
            wrapper = pool.wrapped[key] = cls(pool, ptr, size * dtype.itemsize, shape, dtype,
                                              owner=obj, mutable=True, readonly=bool(readonly))
        return wrapper

    @property
    def ptr(self) -> int:
        return int(self._alloc)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def flags(self):
        """What the graph layer asks a plane (as of a NumPy array): C-contiguous, and writeable
        unless its owner exported it read-only."""
        return _PlaneFlags(not self.readonly)

    @property
    def __cuda_array_interface__(self) -> dict:
        """Version 3 of the CUDA array interface: C-contiguous (``strides`` None), this array's
        device pointer.  No ``stream``: every vkml call has finished its device work when it
        returns, so the memory is ready for any stream.  Once handed out, the memory may be
        written by another library, so the array keeps no host copy from then on."""
        self.mutable, self._host = True, None
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, self.readonly),
                "strides": None, "version": 3}

    def numpy(self) -> np.ndarray:
        """A new NumPy array with this array's values: one copy from the device (explicit)."""
        host = np.empty(self.shape, self.dtype)
        if host.size:
            gpu = self._pool.gpu
            with gpu.lock, gpu.active():
                gpu.drv.memcpy_dtoh_async(host, self._alloc, gpu.stream)
                gpu.stream.synchronize()
        return host

    def copy(self) -> "DeviceArray":
        """A new device plane with these values (one copy on the device)."""
        copy = self._pool.array(self.shape, self.dtype, mutable=True)
        device_copy(self._pool.gpu, copy, self)
        return copy

    def __setitem__(self, key, value):
        """``plane[...] = values``: the whole plane, from a device array (a copy on the device)
        or from host values (broadcast to the plane, one copy to the device)."""
        if key is not Ellipsis and key != slice(None):
            raise ArgumentError(f"a device plane is written whole (plane[...] = values), got index "
                                f"{key!r}; read it with .numpy(), change that, and write it back")
        if isinstance(value, DeviceArray) or hasattr(value, "__cuda_array_interface__"):
            device_copy(self._pool.gpu, self, value if isinstance(value, DeviceArray) else
                        DeviceArray.wrap(self._pool, value))
            return
        try:
            host = np.ascontiguousarray(np.broadcast_to(np.asarray(value), self.shape))
        except ValueError:
            raise ShapeError(f"cannot write values of shape {np.shape(value)} into a device plane "
                             f"of shape {self.shape}") from None
        if host.dtype != self.dtype:
            if not np.can_cast(host.dtype, self.dtype, "same_kind"):
                raise DTypeError(f"cannot write {host.dtype} values into a device plane of "
                                 f"{self.dtype}; convert them first")
            host = host.astype(self.dtype)
        device_copy(self._pool.gpu, self, host)

    def __array__(self, dtype=None, copy=None):
        if self.mutable:
            host = self.numpy()
            return host if dtype is None or np.dtype(dtype) == self.dtype else host.astype(dtype)
        if self._host is None:
            host = self.numpy()
            host.flags.writeable = False
            self._host = host
        if dtype is not None and np.dtype(dtype) != self.dtype:
            return self._host.astype(dtype)
        return self._host.copy() if copy else self._host

    def __repr__(self):
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype.name}, on the GPU)"

    def __reduce__(self):
        """Pickled or deep-copied as its host value (device memory does not travel)."""
        return np.array, (np.asarray(self),)

    def __del__(self):
        if self._owner is not None:             # another library's memory: never ours to free
            return
        try:
            self._pool.give_back(self._alloc, self._nbytes)
        except Exception:                       # interpreter shutdown
            pass


#: inputs of at most this many bytes are staged together and copied by the captured graph
SMALL_INPUT_BYTES = 4096

_NP = {"double": np.float64, "float": np.float32, "int32_t": np.int32, "int64_t": np.int64,
       "uint8_t": np.uint8}


class _GraphExec:
    """An instantiated CUDA graph among an executable's allocations: ``free`` destroys it."""

    def __init__(self, cu, graph):
        self.cu, self.graph = cu, graph

    def free(self):
        self.cu.cuGraphExecDestroy(self.graph)


class CudaExecutable:
    """One program on the GPU: its module, buffers, launches and (after the first run) its graph.

    Device memory it owns: the temporaries, the pointer table, the status words, the small-input
    block and the buffers a captured cuBLAS call holds by address -- made with it; and, made the
    first time a run needs one, a buffer (with page-locked staging) for an input given as a NumPy
    array or for a result returned to the host.  Runs on DeviceArrays use those where they lie
    and add nothing.  When nobody holds the executable any more (the bounded cache evicted it,
    ``clear_cache`` dropped it and no graph-layer memo still uses it), its memory goes back to the
    driver at the backend's next call (``_Gpu.bury``).
    """

    def __init__(self, gpu, plan, module, program):
        drv = gpu.drv
        self.gpu, self.plan = gpu, plan
        self.errors = plan.errors
        self.eqn_index = {e.prim.name: i for i, e in enumerate(program.eqns)}
        self.in_types = [v.dtype for v in program.inputs]
        self.out_avals = [(v.shape, v.dtype) for v in program.outputs]
        self.source = plan.source
        self.module = module
        self.launches = []
        for spec in plan.kernels:
            fn = module.get_function(spec.name)
            grid, block = spec.launch(gpu.sm_count)
            use_blas = gpu.cublas is not None and spec.kind == "matmul" and gpu.cublas.wants(spec)
            self.launches.append((spec, fn, grid, block, use_blas))
        # buffers whose address a captured cuBLAS call holds: values are copied in and out of them
        self.fixed = {i for spec, *_, blas in self.launches if blas for i in spec.gemm[:3]}
        n_in, n_io = len(program.inputs), len(program.inputs) + len(program.outputs)
        #: every device allocation of this executable (freed together: release, or bury), and
        #: their bytes (its own buffers, not the values it returned)
        self.memory, self.device_bytes = [], 0
        self.nbytes = [count * np.dtype(_NP[ctype]).itemsize for _, ctype, count in plan.buffers]
        # small inputs (Python scalars, short vectors) share one staging block, copied to the device
        # by the captured graph itself: no driver call per scalar per run
        offsets, size = {}, 0
        for i in range(n_in):
            if self.nbytes[i] <= SMALL_INPUT_BYTES and i not in self.fixed:
                offsets[i] = size
                size += -(-self.nbytes[i] // 16) * 16
        self.small_host = drv.pagelocked_zeros(max(size, 16), np.uint8) if offsets else None
        self.small_dev = self._alloc(max(size, 16)) if offsets else None
        self.small = set(offsets)
        # temporaries and cuBLAS's fixed buffers now; inputs and results when a run needs them
        self.bufs = [self._alloc(b) if i >= n_io or i in self.fixed else None
                     for i, b in enumerate(self.nbytes)]
        self.own = [int(self.small_dev) + offsets[i] if i in offsets else
                    int(b) if b is not None else 0 for i, b in enumerate(self.bufs)] or [0]
        # the pointer table: written on the host before each run, copied to the device by the graph
        self.host_table = drv.pagelocked_empty(len(self.own), np.uint64)
        self.host_table[:] = self.own
        self.table = self._alloc(self.host_table.nbytes)
        self.in_sizes = [v.size for v in program.inputs]
        self.status_words = plan.status_words          # a failure's four, then one per warning
        self.status = self._alloc(8 * self.status_words)
        self.host_status = drv.pagelocked_zeros(self.status_words, np.uint64)
        self.host_in = [self.small_host[offsets[i]:offsets[i] + self.nbytes[i]].view(v.dtype)
                        if i in offsets else None for i, v in enumerate(program.inputs)]
        self.host_out = [None] * len(self.out_avals)
        self.args = struct.pack("QQ", int(self.table), int(self.status))
        self.graph = None
        self.kernel_launches = len(self.launches)
        self._finalizer = weakref.finalize(self, gpu.bury, self.memory)

    def _alloc(self, nbytes):
        alloc = self.gpu.drv.mem_alloc(max(1, nbytes))
        self.memory.append(alloc)
        self.device_bytes += max(1, nbytes)
        return alloc

    def _own_buffer(self, i):
        """The address of the executable's own buffer ``i`` (an input staged from the host, or a
        result copied to the host), allocated with its page-locked staging the first time."""
        if not self.own[i]:
            self.bufs[i] = self._alloc(self.nbytes[i])
            self.own[i] = int(self.bufs[i])
        n_in = len(self.in_types)
        if i < n_in and self.host_in[i] is None:
            self.host_in[i] = self.gpu.drv.pagelocked_empty(max(1, self.in_sizes[i]),
                                                            self.in_types[i])
        elif i >= n_in and self.host_out[i - n_in] is None:
            shape, dtype = self.out_avals[i - n_in]
            self.host_out[i - n_in] = self.gpu.drv.pagelocked_empty(max(1, int(np.prod(shape))),
                                                                    dtype)
        return self.own[i]

    def enqueue(self):
        """The submission's device work (what is captured): the pointer table, kernels, status."""
        drv, stream = self.gpu.drv, self.gpu.stream
        drv.memcpy_htod_async(self.table, self.host_table, stream)
        if self.small_dev is not None:
            drv.memcpy_htod_async(self.small_dev, self.small_host, stream)
        drv.memset_d32_async(self.status, 0, 2 * self.status_words, stream)
        for spec, fn, grid, block, use_blas in self.launches:
            if use_blas:
                self.gpu.cublas.gemm(self.own, spec)
            else:
                fn._launch_kernel(grid, block, self.args, 0, stream)
        drv.memcpy_dtoh_async(self.host_status, self.status, stream)

    def capture(self):
        cu, gpu = self.gpu.cu, self.gpu
        _check(cu, cu.cuStreamBeginCapture(
            gpu.cu_stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "cuStreamBeginCapture")
        try:
            self.enqueue()
        finally:
            graph = _check(cu, cu.cuStreamEndCapture(gpu.cu_stream), "cuStreamEndCapture")
        instantiate = getattr(cu, "cuGraphInstantiateWithFlags", None) or cu.cuGraphInstantiate
        try:
            self.graph = _check(cu, instantiate(graph, 0), "cuGraphInstantiate")
        finally:
            cu.cuGraphDestroy(graph)
        self.memory.append(_GraphExec(cu, self.graph))
        gpu.captures += 1

    def _bind_inputs(self, args):
        """Point the table at each argument: a DeviceArray where it lies, a NumPy array copied into
        the executable's own buffer (through its staging buffer)."""
        drv, stream, pool, table = self.gpu.drv, self.gpu.stream, self.gpu.pool, self.host_table
        for i, (a, t) in enumerate(zip(args, self.in_types)):
            if isinstance(a, DeviceArray) and a._pool is pool and a.dtype == t and \
                    a.size == self.in_sizes[i]:
                if i in self.fixed:
                    table[i] = self.own[i]
                    if a.size:
                        drv.memcpy_dtod_async(self.own[i], a.ptr, a.nbytes, stream)
                else:
                    table[i] = a.ptr
                continue
            a = np.asarray(a)
            table[i] = self._own_buffer(i)
            if a.size:
                host = self.host_in[i]
                host[:a.size] = a.reshape(-1) if a.dtype == t else a.reshape(-1).astype(t)
                if i not in self.small:                # small ones travel in the graph's block copy
                    drv.memcpy_htod_async(self.own[i], host, stream)

    def _direct(self, dest, j, args, into) -> bool:
        """Whether result ``j`` may be computed straight into device plane ``dest``: of its
        size and dtype, not at a fixed (cuBLAS) address, overlapping no argument (read while
        the results are written) and no other destination."""
        shape, dtype = self.out_avals[j]
        if not isinstance(dest, DeviceArray) or dest._pool is not self.gpu.pool or \
                dest.readonly or dest.dtype != dtype or dest.shape != tuple(shape) or \
                len(self.in_types) + j in self.fixed or not dest.size:
            return False
        lo, hi = dest.ptr, dest.ptr + dest.nbytes
        others = [a for a in args if isinstance(a, DeviceArray)] + \
            [d for d in into if isinstance(d, DeviceArray) and d is not dest]
        return not any(a.ptr < hi and lo < a.ptr + max(a.nbytes, 1) for a in others)

    def __call__(self, args, graphs=None, resident=False, into=None):
        """Run once; DeviceArray results when ``resident``, else NumPy arrays.  ``into`` (with
        ``resident``): a device plane (or None) per result: result ``i`` is computed straight
        into ``into[i]`` where it can (:meth:`_direct`), else copied into it on the device
        after the run; either way the result returned IS ``into[i]``.

        The first run is never captured: it runs the launches one by one and is checked (cuBLAS
        sets itself up on its first call, which a capture refuses); the graph is captured after
        it, and every later run replays it."""
        gpu = self.gpu
        drv, stream = gpu.drv, gpu.stream
        n_in = len(self.in_types)
        into = into if resident and into is not None else [None] * len(self.out_avals)
        with gpu.lock, gpu.active():
            gpu.drain()
            self._bind_inputs(args)
            results, copy_to = [], []
            for j, (shape, dtype) in enumerate(self.out_avals):
                k = n_in + j
                direct = self._direct(into[j], j, args, into)
                out = into[j] if direct else gpu.pool.array(shape, dtype) if resident else None
                self.host_table[k] = self._own_buffer(k) if out is None else \
                    self.own[k] if k in self.fixed else out.ptr
                results.append(out)
                copy_to.append(into[j] if isinstance(into[j], DeviceArray) and not direct else None)
            use_graphs = gpu.use_graphs if graphs is None else graphs
            replay = use_graphs and self.graph is not None
            try:
                if replay:
                    _check(gpu.cu, gpu.cu.cuGraphLaunch(self.graph, gpu.cu_stream), "cuGraphLaunch")
                    STATS.graph_launches += 1
                else:
                    self.enqueue()
                    gpu.kernel_launches += self.kernel_launches
                for j, out in enumerate(results):
                    k = n_in + j
                    if out is None:
                        drv.memcpy_dtoh_async(self.host_out[j], self.bufs[k], stream)
                    elif k in self.fixed and out.size:
                        drv.memcpy_dtod_async(out.ptr, self.bufs[k], out.nbytes, stream)
            finally:
                # a Ctrl-C landing between these calls still waits for the device: the next run
                # must not write the staging buffers and the table while the device reads them
                stream.synchronize()
            code = int(self.host_status[0])
            for message, hit in zip(self.plan.warnings, self.host_status[STATUS_WORDS:]):
                if hit:                 # a warning check that fired: once per run
                    warn_at_user(message)
            if code:
                name = self.errors[code - 1] if code - 1 < len(self.errors) else "?"
                message = self.plan.messages.get(code)
                raise ExecutionFailure(self.eqn_index.get(name, 0),
                                       ExecutionError(message) if message is not None else
                                       failure_error(name, self.host_status[1:4].view(np.int64)))
            if use_graphs and not replay:
                self.capture()          # proven uncaptured: the next run replays the graph
            if resident:
                for j, dest in enumerate(copy_to):
                    if dest is not None:
                        device_copy(gpu, dest, results[j])
                        results[j] = dest
                return results
            return [h[:int(np.prod(s))].reshape(s).copy() for h, (s, _) in
                    zip(self.host_out, self.out_avals)]

    def release(self):
        """Free the graph and every device allocation now (at exit; the context is current)."""
        self.graph = None
        self._finalizer.detach()
        self.gpu.bury(list(self.memory))
        self.memory.clear()
        self.gpu.drain()
        self.bufs, self.launches, self.host_in, self.host_out = [], [], [], []
        self.table = self.host_table = self.status = self.host_status = self.module = None
        self.small_dev = self.small_host = None


class CudaBackend(Backend):
    """Programs as CUDA kernels, each submission one CUDA-graph launch (see the module docstring)."""

    name = "cuda"
    device = "GPU"

    def __init__(self):
        try:
            gpu = _Gpu()
        except BackendError as e:
            _FOUND[0] = f"not available: {e}"
            raise
        super().__init__()
        self.gpu = gpu
        gpu.use_graphs = os.environ.get("VKML_CUDA_GRAPHS", "1") != "0"
        gpu.captures = 0
        gpu.kernel_launches = 0
        gpu.loop_launches = 0
        self.fallbacks = 0
        self._tree = None
        _FOUND[0] = self._summary()
        atexit.register(self.close)

    def close(self):
        """Free everything this backend holds on the GPU and release the context (at exit)."""
        self._tree = None
        self._executables.clear()
        self.gpu.close()

    # -- compiling ---------------------------------------------------------------------------------
    def _compile(self, program):
        try:
            plan = cuda_plan(program)
        except Unsupported:
            self.fallbacks += 1
            STATS.compiles += 1
            return compile_numpy(program, self._compile_nested)
        with self.gpu.lock, self.gpu.active():
            self.gpu.drain()
            module, _ = self.gpu.module(plan.source)
            exe = CudaExecutable(self.gpu, plan, module, program)
        self.gpu.executables.add(exe)
        return exe

    def run(self, exe, args, resident=False, into=None):
        """One submission: a CUDA-graph launch (DeviceArray results when ``resident``), or a
        program the lowering cannot compile, on the host.  ``into``: see ``Backend.run`` (here the
        results are copied into the destinations)."""
        STATS.submissions += 1
        if isinstance(exe, CudaExecutable):
            dests = into or ()
            if any(isinstance(d, DeviceArray) for d in dests) or \
                    resident and not any(isinstance(d, np.ndarray) for d in dests):
                # results kept on the device, device planes as destinations (the graph layer's)
                outs = exe(args, resident=True, into=into)
                return outs if into is None else \
                    copy_into(outs, [d if isinstance(d, np.ndarray) else None for d in into])
            outs = exe(args, resident=resident and into is None)
        else:
            outs = exe(host_values(args))
        return outs if into is None else copy_into(outs, into)

    def _compile_nested(self, program):
        return self.executable(("nested", program), lambda: program)

    def executable(self, key, make_program):
        # a miss that ran no nvcc loaded its cubin from the disk cache
        return self._cached(key, lambda: self._compile(check_sizes(make_program())),
                            from_disk=lambda exe: True)

    def clear_cache(self):
        """Forget the compiled executables.  Their device memory goes back to the driver once
        nothing holds them (memos of the graph layer may still run some: those stay usable)."""
        super().clear_cache()
        self._tree = None
        gc.collect()
        with self.gpu.lock, self.gpu.active():
            self.gpu.drain()

    # -- switches and counters ----------------------------------------------------------------------
    @property
    def use_graphs(self) -> bool:
        """Whether a run launches its captured graph (default) or its kernels one by one."""
        return self.gpu.use_graphs

    @use_graphs.setter
    def use_graphs(self, value: bool):
        self.gpu.use_graphs = bool(value)

    @property
    def captures(self) -> int:
        """CUDA graphs captured and instantiated so far (one per executable that has run)."""
        return self.gpu.captures

    @property
    def kernel_launches(self) -> int:
        """Kernels launched one by one (with ``use_graphs`` off) so far."""
        return self.gpu.kernel_launches

    @property
    def loop_launches(self) -> int:
        """Per-sample simulation loops launched so far (a simulation's forward or its reverse)."""
        return self.gpu.loop_launches

    def empty_cache(self) -> int:
        """Give the pool's spare device memory (of values since dropped) back to the driver; the
        bytes released.  The pool also does this by itself when an allocation fails."""
        gc.collect()
        with self.gpu.lock, self.gpu.active():
            self.gpu.drain()
            return self.gpu.pool.release_spare()

    def free_memory(self) -> int:
        """Free device memory in bytes (the graph layer's default memory budget is half of it)."""
        return self.gpu.free_memory()

    # -- planes: the graph layer's arrays, kept in device memory -------------------------------------
    keeps_planes_on_device = True

    def to_plane(self, value) -> DeviceArray:
        """The device plane for ``value``: a DeviceArray of this backend as it is; another
        library's device array (``__cuda_array_interface__``) wrapped without a copy; anything
        else (a NumPy array, a list) converted with ``np.asarray`` and copied to the device once
        (one host-to-device copy)."""
        if isinstance(value, DeviceArray) and value._pool is self.gpu.pool:
            return value
        if hasattr(value, "__cuda_array_interface__"):
            return DeviceArray.wrap(self.gpu.pool, value)
        host = np.ascontiguousarray(value)
        if host.dtype not in PLANE_DTYPES:
            raise DTypeError(f"to_plane: a plane of {host.dtype} values cannot live on the GPU; "
                             f"pass one of {', '.join(d.name for d in PLANE_DTYPES)}")
        plane = self.gpu.pool.array(host.shape, host.dtype, mutable=True)
        # a plane stays as writeable as the array it came from
        plane.readonly = isinstance(value, np.ndarray) and not value.flags.writeable
        if host.size:
            device_copy(self.gpu, plane, host)
        return plane

    def copy_plane(self, plane) -> DeviceArray:
        """A new device plane with ``plane``'s values: one copy on the device."""
        plane = self.to_plane(plane)
        copy = self.empty_plane(plane.shape, plane.dtype)
        self.copy_plane_into(copy, plane)
        return copy

    def copy_plane_into(self, dst, src):
        """Write ``src`` (a device plane, or a host array: one host-to-device copy) into device
        plane ``dst`` in place: synchronous (see :func:`device_copy`, which says why); the graph
        layer makes only a few such copies per launch."""
        if not isinstance(dst, DeviceArray):
            raise ArgumentError(f"copy_plane_into: the destination must be a device plane, got "
                                f"{type(dst).__name__}")
        on_device = isinstance(src, DeviceArray) or hasattr(src, "__cuda_array_interface__")
        device_copy(self.gpu, dst, self.to_plane(src) if on_device else np.asarray(src))

    def empty_plane(self, shape, dtype) -> DeviceArray:
        """A new device plane (from the backend's pool) whose values are whatever it held."""
        return self.gpu.pool.array(tuple(shape), dtype, mutable=True)

    def zeros_plane(self, shape, dtype) -> DeviceArray:
        """A new device plane of zeros (set on the device: nothing crosses PCIe)."""
        plane = self.empty_plane(shape, dtype)
        gpu = self.gpu
        with gpu.lock, gpu.active():
            gpu.drv.memset_d32_async(plane.ptr, 0, plane._nbytes // 4, gpu.stream)
            gpu.stream.synchronize()
        return plane

    # -- a simulation's per-sample loops ----------------------------------------------------------------
    def sample_loops(self, step, vjp, spec):
        """A simulation's loops as two kernels, one thread per sample (see ``cuda_loops``), or None
        when the lowering does not cover its step."""

        def make():
            try:
                return CudaSampleLoops(self.gpu, step, vjp, LoopSpec(**dict(spec)))
            except Unsupported:
                return False              # remembered: the lowering does not cover this step
        return self._cached(("sample-loops", step, vjp, spec), make, from_disk=bool) or None

    # -- the canonical-tree sum on the device ------------------------------------------------------
    def tree_sum(self, x) -> np.ndarray:
        """``vkml.graph.treesum.tree_sum(x)`` computed by ``kernels_cu/tree_sum.cu``: same bits.
        ``x`` a DeviceArray is summed where it lies (only the sum comes back)."""
        on_device = isinstance(x, DeviceArray)
        x = x if on_device else np.ascontiguousarray(x)
        if x.dtype not in (np.float32, np.float64):
            raise BackendError(f"tree_sum on the GPU sums float32 or float64, not {x.dtype}")
        n = x.shape[0]
        if n == 0:
            return np.zeros(x.shape[1:], x.dtype)
        m = int(np.prod(x.shape[1:]))
        gpu = self.gpu
        with gpu.lock, gpu.active():
            if self._tree is None:
                mod, _ = gpu.module(template("tree_sum.cu"))
                self._tree = {np.dtype(np.float32): mod.get_function("vk_tree_sum_float"),
                              np.dtype(np.float64): mod.get_function("vk_tree_sum_double")}
            fn = self._tree[x.dtype]
            cur = x if on_device else self.to_plane(x)
            keep = [cur]                # pool memory: back to the pool when this returns
            for valid, chunks, chunk in tree_sum_levels(n):
                out = gpu.pool.array((max(1, chunks * m),), x.dtype)
                keep.append(out)
                threads = max(1, chunk // 2)
                args = struct.pack("QQqqqi", cur.ptr, out.ptr, valid, m, chunks, chunk)
                blocks = max(1, min(chunks * m, gpu.sm_count * 8))
                fn._launch_kernel((blocks, 1, 1), (threads, 1, 1), args, threads * x.dtype.itemsize,
                                  gpu.stream)
                cur = out
            gpu.stream.synchronize()
            return cur.numpy()[:m].reshape(x.shape[1:])

    # -- information ----------------------------------------------------------------------------------
    def _summary(self) -> str:
        g = self.gpu
        blas = f"cuBLAS {g.cublas.path}" if g.cublas is not None else "no cuBLAS (tiled kernel)"
        return (f"{g.name} ({g.arch}, {g.sm_count} SMs, {g.total_memory / 2**30:.0f} GiB); {blas}; "
                f"CUDA graphs: {'on' if g.use_graphs else 'off'}")

    def info(self):
        info = super().info()
        g = self.gpu
        info.update({"gpu": g.name, "arch": g.arch, "multiprocessors": g.sm_count,
                     "memory": g.total_memory, "cublas": g.cublas.path if g.cublas else None,
                     "cache": cache_dir(), "nvcc flags": " ".join(NVCC_FLAGS),
                     "compiler": f"{g.nvrtc.version} ({g.nvrtc.path})" if g.nvrtc else
                     f"nvcc ({g.nvrtc_note})",
                     "graphs": g.use_graphs, "captures": g.captures, "numpy fallbacks": self.fallbacks,
                     "value memory": {"allocations": g.pool.allocations, "reuses": g.pool.reuses,
                                      "spare bytes": g.pool.spare_bytes}})
        return info

