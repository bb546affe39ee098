"""A host emulation of the CUDA the generator emits, and of the driver calls the backend makes.

Used by ``test_cuda_codegen.py`` (no GPU needed):

- :func:`host_library` compiles generated CUDA source for the host with an
  emulation header: ``__global__``/``__device__`` vanish, ``__shared__``
  becomes ``static``, a block's threads run as POSIX threads with a barrier
  for ``__syncthreads`` (or one after another, for kernels without one),
  blocks run one after another.  :func:`emulate` runs a plan's kernels in
  order on NumPy buffers.
- :func:`fake_driver` installs stand-ins for ``pycuda.driver``,
  ``pycuda.compiler`` and ``cuda.bindings.driver`` in ``sys.modules``, so
  ``vkml.set_backend("cuda")`` runs the real backend code -- buffers,
  staging, stream capture, graph instantiation and replay, status words,
  the disk cache, a simulation's per-sample loops (``vk_fwd``/``vk_rev``,
  launched with device pointer tables) -- on emulated kernels.  Stream capture records the
  operations and refuses what the driver refuses while capturing
  (allocations, synchronous copies).  As a pytest plugin
  (``VKML_EMULATED_CUDA=1 PYTHONPATH=tests pytest -p cuda_emulation
  tests/test_cuda.py``) it runs the GPU tests on the emulation.

What this cannot show: a real GPU's scheduling, memory model, libdevice
math, or the driver's own checks beyond the ones imitated here.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import types

import numpy as np

CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")


EMULATION = r"""
// Host emulation of the CUDA subset generated code uses: blocks run one after another; the threads
// of a block run as POSIX threads (or in turn, for kernels without __syncthreads).
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct vk_dim3 { unsigned x, y, z; };
extern thread_local vk_dim3 threadIdx;
extern thread_local vk_dim3 blockIdx;
extern vk_dim3 blockDim, gridDim;
extern pthread_barrier_t vk_barrier;
inline void __syncthreads() { pthread_barrier_wait(&vk_barrier); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp,
                                    unsigned long long val) {
    return __sync_val_compare_and_swap(p, cmp, val);
}
extern unsigned char vk_dynamic_shared[1 << 16];
"""

LAUNCHER = r"""
#include <vector>
thread_local vk_dim3 threadIdx;
thread_local vk_dim3 blockIdx;
vk_dim3 blockDim, gridDim;
pthread_barrier_t vk_barrier;
unsigned char vk_dynamic_shared[1 << 16];
typedef void (*vk_kernel)(void* const*, unsigned long long*);
typedef void (*vk_tree_kernel)(const void*, void*, long long, long long, long long, int);
typedef void (*vk_loop_kernel)(void* const*, void* const*, long long, long long);
struct vk_job { int kind; void* fn; void* const* bufs; unsigned long long* status;
                const void* x; void* out; void* const* outs; long long n, m, chunks; int chunk;
                vk_dim3 block, thread; };
static void vk_call(vk_job* j) {
    blockIdx = j->block;
    threadIdx = j->thread;
    if (j->kind == 0) ((vk_kernel)j->fn)(j->bufs, j->status);
    else if (j->kind == 1) ((vk_tree_kernel)j->fn)(j->x, j->out, j->n, j->m, j->chunks, j->chunk);
    else ((vk_loop_kernel)j->fn)(j->bufs, j->outs, j->n, j->m);
}
static void* vk_thread(void* p) { vk_call((vk_job*)p); return 0; }
static void vk_run(vk_job proto, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   int threaded) {
    gridDim = {gx, gy, 1}; blockDim = {bx, by, 1};
    unsigned nt = bx * by;
    for (unsigned z = 0; z < gz; z++) for (unsigned y = 0; y < gy; y++) for (unsigned x = 0; x < gx; x++) {
        gridDim.z = gz;
        std::vector<vk_job> jobs(nt, proto);
        for (unsigned t = 0; t < nt; t++) {
            jobs[t].block = {x, y, z};
            jobs[t].thread = {t % bx, t / bx, 0};
        }
        if (!threaded) { for (unsigned t = 0; t < nt; t++) vk_call(&jobs[t]); continue; }
        pthread_barrier_init(&vk_barrier, 0, nt);
        std::vector<pthread_t> ids(nt);
        for (unsigned t = 0; t < nt; t++) pthread_create(&ids[t], 0, vk_thread, &jobs[t]);
        for (unsigned t = 0; t < nt; t++) pthread_join(ids[t], 0);
        pthread_barrier_destroy(&vk_barrier);
    }
}
extern "C" void vk_launch(void* fn, void* const* bufs, unsigned long long* status, unsigned gx,
                          unsigned gy, unsigned gz, unsigned bx, unsigned by, int threaded) {
    vk_job j = {}; j.kind = 0; j.fn = fn; j.bufs = bufs; j.status = status;
    vk_run(j, gx, gy, gz, bx, by, threaded);
}
extern "C" void vk_launch_tree(void* fn, const void* x, void* out, long long n, long long m,
                               long long chunks, int chunk, unsigned gx, unsigned bx) {
    vk_job j = {}; j.kind = 1; j.fn = fn; j.x = x; j.out = out; j.n = n; j.m = m;
    j.chunks = chunks; j.chunk = chunk;
    vk_run(j, gx, 1, 1, bx, 1, 1);
}
// the per-sample simulation loops (codegen/sample_loops.py): no barrier, so threads run in turn
extern "C" void vk_launch_loops(void* fn, void* const* in, void* const* out, long long n,
                                long long max_steps, unsigned gx, unsigned bx) {
    vk_job j = {}; j.kind = 2; j.fn = fn; j.bufs = in; j.outs = out; j.n = n; j.m = max_steps;
    vk_run(j, gx, 1, 1, bx, 1, 0);
}
"""


def host_library(source, workdir, name):
    """Compile CUDA ``source`` for the host and load it."""
    return ctypes.CDLL(build_host(source, workdir, name))


_CT = {"double": np.float64, "float": np.float32, "int32_t": np.int32, "int64_t": np.int64,
       "uint8_t": np.uint8}


def emulate(lib, plan, args, out_avals):
    """Run ``plan`` in the emulator: every kernel in order, as the backend would launch it (grid
    kernels with a small grid, so each thread strides over several elements)."""
    bufs = []
    for i, (name, ctype, count) in enumerate(plan.buffers):
        a = np.empty(count, _CT[ctype])
        if i < plan.n_in:
            a[:max(1, args[i].size)] = np.ascontiguousarray(args[i]).reshape(-1).view(_CT[ctype]) \
                if args[i].size else 0
        else:
            a.view(np.uint8)[:] = 0xFF            # garbage: reading before writing shows
        bufs.append(a)
    table = (ctypes.c_void_p * len(bufs))(*[b.ctypes.data for b in bufs])
    status = np.zeros(plan.status_words, np.uint64)
    for k in plan.kernels:
        fn = ctypes.cast(getattr(lib, k.name), ctypes.c_void_p)
        if k.kind == "grid":
            grid, block, threaded = (3, 1, 1), (5, 1, 1), 0
        elif k.kind == "block":
            grid, block, threaded = (1, 1, 1), (min(k.threads, 7), 1, 1), 1
        else:
            (grid, block), threaded = k.launch(), 1
        lib.vk_launch(fn, table, status.ctypes.data_as(ctypes.c_void_p), *grid, block[0],
                      block[1], threaded)
    outs = []
    for i, (shape, dtype) in enumerate(out_avals):
        b = bufs[plan.n_in + i]
        outs.append(b[:int(np.prod(shape))].view(dtype).reshape(shape))
    return outs, status




# -- a stand-in for the driver ----------------------------------------------------------------------

class _DriverError(Exception):
    pass


class _CompileError(_DriverError):
    pass


class _Emulated:
    """The state of one emulated device: allocations, streams, capture, compiled modules."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.memory = {}                  # address -> numpy byte buffer (kept alive)
        self.capturing = {}               # stream handle -> list of recorded operations, or absent
        self.streams = itertools.count(1)
        self.libs = itertools.count()
        self.compiles = 0
        self.barriers = {}                # compiled module -> kernels that use __syncthreads
        self.launches = []                # (kernel name, grid, block) of every launch run
        self.copies = {"htod": 0, "dtoh": 0, "dtod": 0}   # copies done (not merely recorded)
        self.copy_log = []                # (kind, destination, source, bytes) of every copy done
        self.allocations = 0

    def copy(self, kind, dst, src, nbytes):
        self.copies[kind] += 1
        self.copy_log.append((kind, dst, src, nbytes))
        ctypes.memmove(dst, src, nbytes)

    def check_not_capturing(self, what):
        if self.capturing:
            raise _DriverError(f"{what}: operation not permitted when stream is capturing")

    def alloc(self, nbytes):
        self.check_not_capturing("cuMemAlloc")
        buf = np.empty(max(1, nbytes) + 64, np.uint8)
        buf.view(np.uint8)[:] = 0xA5                      # garbage, as real device memory
        addr = buf.ctypes.data
        self.memory[addr] = buf
        self.allocations += 1
        return addr

    def run(self, stream, op):
        """Run ``op`` now, or record it if ``stream`` is capturing."""
        handle = getattr(stream, "handle", stream)
        if handle in self.capturing:
            self.capturing[handle].append(op)
        else:
            op()


def _address(x):
    if isinstance(x, np.ndarray):
        return x.ctypes.data, x.nbytes
    return int(x), None


def _make_pycuda(state):
    drv = types.ModuleType("pycuda.driver")
    drv.Error = _DriverError
    drv.CompileError = _CompileError

    class device_attribute:
        MULTIPROCESSOR_COUNT = "MULTIPROCESSOR_COUNT"

    drv.device_attribute = device_attribute

    class Context:
        def push(self):
            pass

        def pop(self):
            pass

    class Device:
        def __init__(self, index):
            self.index = index

        @staticmethod
        def count():
            return 1

        def compute_capability(self):
            return (9, 0)

        def get_attribute(self, attr):
            return 4 if attr == "MULTIPROCESSOR_COUNT" else 0

        def name(self):
            return "Emulated GPU (host threads)"

        def total_memory(self):
            return 1 << 34

        def retain_primary_context(self):
            return Context()

    class Stream:
        def __init__(self, flags=0):
            self.handle = next(state.streams)

        def synchronize(self):
            state.check_not_capturing("cuStreamSynchronize")

    class DeviceAllocation:
        def __init__(self, nbytes):
            self.ptr = state.alloc(nbytes)
            self.nbytes = nbytes

        def __int__(self):
            return self.ptr

        __index__ = __int__

        def free(self):
            state.check_not_capturing("cuMemFree")
            state.memory.pop(self.ptr, None)

    class Function:
        def __init__(self, lib, name, barrier):
            self.lib, self.name, self.barrier = lib, name, barrier
            self.ptr = ctypes.cast(getattr(lib, name), ctypes.c_void_p)

        def _launch_kernel(self, grid, block, args, shared, stream):
            lib, ptr, name = self.lib, self.ptr, self.name
            grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))

            def op():
                state.launches.append((name, grid, block))
                # per-sample loops (and the forward's summary of steps): device pointer tables
                if name in ("vk_fwd", "vk_rev", "vk_steps_longest"):
                    ins, outs, n, max_steps = struct.unpack("QQqq", args)
                    lib.vk_launch_loops(ptr, ctypes.c_void_p(ins), ctypes.c_void_p(outs),
                                        ctypes.c_longlong(n), ctypes.c_longlong(max_steps), grid[0],
                                        block[0])
                elif name.startswith("vk_tree_sum"):
                    x, out, n, m, chunks, chunk = struct.unpack("QQqqqi", args)
                    lib.vk_launch_tree(ptr, ctypes.c_void_p(x), ctypes.c_void_p(out),
                                       ctypes.c_longlong(n), ctypes.c_longlong(m),
                                       ctypes.c_longlong(chunks), chunk, grid[0], block[0])
                else:
                    table, status = struct.unpack("QQ", args)
                    # kernels without a barrier (grid kernels) run their threads one by one
                    threaded = 1 if self.barrier else 0
                    lib.vk_launch(ptr, ctypes.c_void_p(table), ctypes.c_void_p(status), grid[0],
                                  grid[1], grid[2], block[0], block[1], threaded)
            state.run(stream, op)

    class Module:
        def __init__(self, lib, barriers):
            self.lib, self.barriers = lib, barriers

        def get_function(self, name):
            return Function(self.lib, name, name in self.barriers)

    def module_from_buffer(data):
        path = os.path.join(state.workdir, f"module{next(state.libs)}.so")
        with open(path, "wb") as f:
            f.write(data)
        return Module(ctypes.CDLL(path), state.barriers.get(hash(bytes(data)), set()))

    def memcpy_htod(dst, src):
        state.check_not_capturing("cuMemcpyHtoD")
        src = np.ascontiguousarray(src)
        state.copy("htod", int(dst), src.ctypes.data, src.nbytes)

    def memcpy_dtoh(dst, src):
        state.check_not_capturing("cuMemcpyDtoH")
        state.copy("dtoh", dst.ctypes.data, int(src), dst.nbytes)

    def memcpy_htod_async(dst, src, stream=None):
        d, (s, n) = int(dst), _address(src)
        state.run(stream, lambda: state.copy("htod", d, s, n))

    def memcpy_dtoh_async(dst, src, stream=None):
        (d, n), s = _address(dst), int(src)
        state.run(stream, lambda: state.copy("dtoh", d, s, n))

    def memset_d32(dst, value, count):
        state.check_not_capturing("cuMemsetD32")
        np.frombuffer((ctypes.c_uint32 * count).from_address(int(dst)), np.uint32)[:] = value

    def memset_d32_async(dst, value, count, stream=None):
        d = int(dst)

        def op():
            np.frombuffer((ctypes.c_uint32 * count).from_address(d), np.uint32)[:] = value
        state.run(stream, op)

    def memcpy_dtod_async(dst, src, nbytes, stream=None):
        d, s_ = int(dst), int(src)
        state.run(stream, lambda: state.copy("dtod", d, s_, nbytes))

    class Event:
        def record(self, stream=None):
            import time
            state.run(stream, lambda: setattr(self, "at", time.perf_counter()))

        def synchronize(self):
            pass

        def time_since(self, other):
            return (self.at - other.at) * 1e3

    def to_device(a):
        a = np.ascontiguousarray(a)
        buf = DeviceAllocation(a.nbytes)
        memcpy_htod(buf, a)
        return buf

    def pagelocked_empty(shape, dtype, order="C", mem_flags=0):
        return np.empty(shape, dtype)

    def pagelocked_zeros(shape, dtype, order="C", mem_flags=0):
        return np.zeros(shape, dtype)

    drv.init = lambda flags=0: None
    drv.Device, drv.Stream, drv.Context = Device, Stream, Context
    drv.mem_alloc = DeviceAllocation
    drv.module_from_buffer = module_from_buffer
    drv.memcpy_htod, drv.memcpy_dtoh = memcpy_htod, memcpy_dtoh
    drv.memcpy_htod_async, drv.memcpy_dtoh_async = memcpy_htod_async, memcpy_dtoh_async
    drv.memset_d32, drv.memset_d32_async = memset_d32, memset_d32_async
    drv.to_device = to_device
    drv.memcpy_dtod_async, drv.Event = memcpy_dtod_async, Event
    drv.pagelocked_empty, drv.pagelocked_zeros = pagelocked_empty, pagelocked_zeros
    drv.mem_get_info = lambda: (1 << 33, 1 << 34)

    compiler = types.ModuleType("pycuda.compiler")

    def compile(source, nvcc="nvcc", options=None, keep=False, no_extern_c=False, arch=None,
                code=None, cache_dir=None, include_dirs=None, target="cubin"):
        assert no_extern_c and cache_dir is False and arch == "sm_90"
        assert "-fmad=false" in options
        state.compiles += 1
        name = f"compiled{state.compiles}"
        lib = build_host(source, state.workdir, name)
        with open(lib, "rb") as f:
            data = f.read()
        barriers = set()
        for text in source.split('extern "C" __global__ void ')[1:]:
            if "__syncthreads" in text.split("\nextern ")[0] or "vk_matmul_tiled<" in text:
                barriers.add(text.split("(", 1)[0])
        state.barriers[hash(data)] = barriers
        return data

    compiler.compile = compile
    compiler.get_nvcc_version = lambda nvcc: "emulated nvcc"
    pkg = types.ModuleType("pycuda")
    pkg.__path__ = []
    pkg.driver, pkg.compiler = drv, compiler
    pkg.VERSION_TEXT = "emulated"
    return pkg, drv, compiler


def _make_bindings(state):
    cu = types.ModuleType("cuda.bindings.driver")

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901

    class CUstreamCaptureMode:
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1

    class CUstream:
        def __init__(self, handle):
            self.handle = int(handle)

    class Graph:
        def __init__(self, ops):
            self.ops = ops

    def begin(stream, mode):
        assert mode == CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        if stream.handle in state.capturing:
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,)
        state.capturing[stream.handle] = []
        state.captures = getattr(state, "captures", 0) + 1
        return (CUresult.CUDA_SUCCESS,)

    def end(stream):
        ops = state.capturing.pop(stream.handle)
        return (CUresult.CUDA_SUCCESS, Graph(ops))

    def instantiate(graph, flags):
        return (CUresult.CUDA_SUCCESS, Graph(list(graph.ops)))

    def launch(exe, stream):
        state.check_not_capturing("cuGraphLaunch")
        for op in exe.ops:
            op()
        return (CUresult.CUDA_SUCCESS,)

    cu.CUresult, cu.CUstreamCaptureMode, cu.CUstream = CUresult, CUstreamCaptureMode, CUstream
    cu.cuInit = lambda flags: (CUresult.CUDA_SUCCESS,)
    cu.cuStreamBeginCapture, cu.cuStreamEndCapture = begin, end
    cu.cuGraphInstantiateWithFlags, cu.cuGraphLaunch = instantiate, launch
    cu.cuGraphDestroy = cu.cuGraphExecDestroy = lambda g: (CUresult.CUDA_SUCCESS,)
    cu.cuGetErrorName = lambda err: (CUresult.CUDA_SUCCESS, f"CUDA error {err}".encode())
    cuda_pkg = types.ModuleType("cuda")
    cuda_pkg.__path__ = []
    bindings = types.ModuleType("cuda.bindings")
    bindings.__path__ = []
    bindings.driver = cu
    cuda_pkg.bindings = bindings
    return cuda_pkg, bindings, cu


def build_host(source, workdir, name):
    """Compile CUDA ``source`` for the host (see the module docstring); the library's path."""
    src = os.path.join(workdir, name + ".cpp")
    with open(src, "w") as f:
        f.write(EMULATION + source.replace("extern __shared__ unsigned char vk_smem[];",
                                           "unsigned char* vk_smem = vk_dynamic_shared;")
                + LAUNCHER)
    lib = os.path.join(workdir, name + ".so")
    proc = subprocess.run([CXX, "-std=c++17", "-O1", "-fPIC", "-shared", "-pthread",
                           "-ffp-contract=off", "-fno-fast-math", "-w", "-o", lib, src],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise _CompileError(proc.stderr[-4000:])
    return lib


_NAMES = ("pycuda", "pycuda.driver", "pycuda.compiler", "cuda", "cuda.bindings",
          "cuda.bindings.driver")


@contextlib.contextmanager
def fake_driver():
    """The emulated driver in ``sys.modules`` (and a private kernel cache) for the duration."""
    from vkml.backends import base
    workdir = tempfile.mkdtemp(prefix="vkml-emulated-cuda-")
    state = _Emulated(workdir)
    saved = {n: sys.modules.get(n) for n in _NAMES}
    env = os.environ.get("VKML_CACHE_DIR")
    pkg, drv, compiler = _make_pycuda(state)
    cuda_pkg, bindings, cu = _make_bindings(state)
    sys.modules.update({"pycuda": pkg, "pycuda.driver": drv, "pycuda.compiler": compiler,
                        "cuda": cuda_pkg, "cuda.bindings": bindings, "cuda.bindings.driver": cu})
    os.environ["VKML_CACHE_DIR"] = os.path.join(workdir, "cache")
    base._INSTANCES.pop("cuda", None)
    try:
        yield state
    finally:
        inst = base._INSTANCES.pop("cuda", None)
        if inst is not None:
            inst.close()
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
        if env is None:
            os.environ.pop("VKML_CACHE_DIR", None)
        else:
            os.environ["VKML_CACHE_DIR"] = env
        from vkml.backends import cuda as cuda_backend
        cuda_backend._FOUND[0] = None
        shutil.rmtree(workdir, ignore_errors=True)


# -- as a pytest plugin: the GPU tests on the emulation ---------------------------------------------

_PLUGIN = []


def pytest_configure(config):
    if os.environ.get("VKML_EMULATED_CUDA") == "1":
        cm = fake_driver()
        cm.__enter__()
        _PLUGIN.append(cm)


def pytest_unconfigure(config):
    while _PLUGIN:
        _PLUGIN.pop().__exit__(None, None, None)
