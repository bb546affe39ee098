"""A host emulation of the CUDA the generator emits, and of the driver calls the backend makes.

Used by ``test_cuda_codegen.py`` (no GPU needed):

- :func:`host_library` compiles generated CUDA source for the host with an
  emulation header: ``__global__``/``__device__`` vanish, ``__shared__``
  becomes ``static`` (filled with garbage at the start of each block), a
  block's threads run as fibers on one OS thread that switch at each
  ``__syncthreads`` (or one after another, for kernels without one), blocks
  run one after another.  :func:`emulate` runs a plan's kernels in
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
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import types

import numpy as np

CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")


EMULATION = r"""
// Host emulation of the CUDA subset generated code uses: blocks run one after another; the threads
// of a block run as fibers switching at __syncthreads (or in turn, for kernels without one).
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
void vk_sync();
inline void __syncthreads() { vk_sync(); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp,
                                    unsigned long long val) {
    return __sync_val_compare_and_swap(p, cmp, val);
}
extern unsigned char vk_dynamic_shared[1 << 16];
// shared memory starts as garbage in every block: the first thread of a block to reach a
// __shared__ declaration fills it (vk_block_generation changes with every block)
extern unsigned long long vk_block_generation;
extern pthread_mutex_t vk_shared_mutex;
inline void vk_shared_garbage(void* p, unsigned long n, unsigned long long* seen) {
    pthread_mutex_lock(&vk_shared_mutex);
    if (*seen != vk_block_generation) {
        *seen = vk_block_generation;
        unsigned char* b = (unsigned char*)p;
        for (unsigned long i = 0; i < n; i++) b[i] = (unsigned char)(0xC3 ^ (i * 37));
    }
    pthread_mutex_unlock(&vk_shared_mutex);
}
// a float-to-integer conversion as a GPU does it (cvt.rzi: saturating, NaN to 0); from an
// integer, the C conversion (the same on both)
#include <type_traits>
#include <limits>
template <typename T, typename X> inline T vk_gpu_cast(X x) {
    if constexpr (std::is_floating_point<X>::value && std::is_integral<T>::value) {
        double d = (double)x;
        if (d != d) return (T)0;
        if (d <= (double)std::numeric_limits<T>::min()) return std::numeric_limits<T>::min();
        if (d >= (double)std::numeric_limits<T>::max()) return std::numeric_limits<T>::max();
        return (T)d;
    } else {
        return (T)x;
    }
}
"""

LAUNCHER = r"""
#include <vector>
thread_local vk_dim3 threadIdx;
thread_local vk_dim3 blockIdx;
vk_dim3 blockDim, gridDim;
unsigned char vk_dynamic_shared[1 << 16];
unsigned long long vk_block_generation = 1;
pthread_mutex_t vk_shared_mutex = PTHREAD_MUTEX_INITIALIZER;
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
// A block's threads as fibers on one OS thread: each runs until its __syncthreads (a switch back
// to the scheduler) or its end; the scheduler resumes them in turn, so all reach a barrier before
// any passes it -- a barrier costs a context switch, not a round of futex wake-ups.  (A thread
// that has returned counts as arrived, as on Volta and later.)
#include <ucontext.h>
struct vk_fiber { ucontext_t ctx; vk_job* job; int done; };
static ucontext_t vk_scheduler;
static vk_fiber* vk_fibers;
static unsigned vk_current;
static std::vector<char> vk_stacks;
static const size_t VK_STACK = 128 * 1024;
void vk_sync() { swapcontext(&vk_fibers[vk_current].ctx, &vk_scheduler); }
static void vk_fiber_main(int t) { vk_call(vk_fibers[t].job); vk_fibers[t].done = 1; }
static void vk_run_fibers(std::vector<vk_job>& jobs, unsigned nt) {
    if (vk_stacks.size() < nt * VK_STACK) vk_stacks.resize(nt * VK_STACK);
    std::vector<vk_fiber> fibers(nt);
    vk_fibers = fibers.data();
    for (unsigned t = 0; t < nt; t++) {
        getcontext(&fibers[t].ctx);
        fibers[t].ctx.uc_stack.ss_sp = &vk_stacks[t * VK_STACK];
        fibers[t].ctx.uc_stack.ss_size = VK_STACK;
        fibers[t].ctx.uc_link = &vk_scheduler;
        fibers[t].job = &jobs[t];
        fibers[t].done = 0;
        makecontext(&fibers[t].ctx, (void (*)())vk_fiber_main, 1, (int)t);
    }
    for (unsigned left = nt; left;) {
        for (unsigned t = 0; t < nt; t++) {
            if (fibers[t].done) continue;
            vk_current = t;
            blockIdx = jobs[t].block;
            threadIdx = jobs[t].thread;
            swapcontext(&vk_scheduler, &fibers[t].ctx);
            if (fibers[t].done) left--;
        }
    }
}
static void vk_run(vk_job proto, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   int threaded) {
    gridDim = {gx, gy, 1}; blockDim = {bx, by, 1};
    unsigned nt = bx * by;
    for (unsigned z = 0; z < gz; z++) for (unsigned y = 0; y < gy; y++) for (unsigned x = 0; x < gx; x++) {
        gridDim.z = gz;
        vk_block_generation++;                      // a new block: its shared memory is garbage
        for (unsigned i = 0; i < sizeof(vk_dynamic_shared); i++)
            vk_dynamic_shared[i] = (unsigned char)(0x5A ^ (i * 13));
        std::vector<vk_job> jobs(nt, proto);
        for (unsigned t = 0; t < nt; t++) {
            jobs[t].block = {x, y, z};
            jobs[t].thread = {t % bx, t / bx, 0};
        }
        if (!threaded) { for (unsigned t = 0; t < nt; t++) vk_call(&jobs[t]); continue; }
        vk_run_fibers(jobs, nt);
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
            (grid, block), threaded = k.launch(sm_count=1), 1
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
    """The state of one emulated device: allocations, contexts, streams, capture, modules.

    What it imitates of a real driver, beyond running the kernels:

    - **contexts per thread**: each thread has its own context stack (push/pop); allocating,
      copying or launching without a current context fails ("invalid device context"), a free
      without one leaks (PyCUDA warns and keeps the memory), and a thread other than the main one
      that ends with a context still pushed aborts the process, as PyCUDA does;
    - **asynchronous streams**: work queued on a stream runs only when something waits for it
      (the stream's synchronize, a synchronous copy on the legacy default stream, which waits for
      every *blocking* stream first -- not for non-blocking ones);
    - **capture per thread**: while a thread captures a stream it may not allocate or make a
      synchronous call; legacy-default-stream work from any thread while a blocking stream is
      being captured invalidates that capture (its end reports
      ``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED``);
    - **device memory** that starts as garbage, counted while it lives (``live_bytes``);
    - a **cuBLAS** (:func:`fake_cublas`) that sets itself up on its first product (refused
      inside a capture) and accumulates with fused multiply-adds, so its bits differ from the
      loops' as the real one's do.
    """

    def __init__(self, workdir):
        self.workdir = workdir
        self.memory = {}                  # address -> numpy byte buffer (kept alive)
        self.sizes = {}                   # address -> bytes asked for
        self.capturing = {}               # stream handle -> (capturing thread, recorded operations)
        self.invalidated = set()          # stream handles whose capture was invalidated
        self.pending = {}                 # stream handle -> operations queued, not yet run
        self.blocking = {}                # stream handle -> whether it syncs with the legacy stream
        self.streams = itertools.count(16)
        self.libs = itertools.count()
        self.compiles = 0
        self.barriers = {}                # compiled module -> kernels that use __syncthreads
        self.chunk_kernels = {}           # compiled module -> large sums' first stages
        self.launches = []                # (kernel name, grid, block) of every launch run
        self.copies = {"htod": 0, "dtoh": 0, "dtod": 0}   # copies done (not merely recorded)
        self.copy_log = []                # (kind, destination, source, bytes) of every copy done
        self.allocations = 0
        self.leaked = 0                   # bytes whose free was attempted without a context
        self.contexts = threading.local()
        self.on_capture = None            # a test's hook: called when a capture begins
        self.lock = threading.RLock()
        self.pinned = []                  # page-locked host arrays

    # -- contexts ----------------------------------------------------------------------------------
    def stack(self):
        stack = getattr(self.contexts, "stack", None)
        if stack is None:
            stack = self.contexts.stack = []
            if threading.current_thread() is not threading.main_thread():
                self.contexts.guard = _ThreadExitGuard(stack)
        return stack

    def current(self) -> bool:
        return bool(self.stack())

    def need_context(self, what):
        if not self.current():
            raise _DriverError(f"{what} failed: invalid device context (no context is current "
                               "on this thread)")

    def pin(self, array):
        """A page-locked host array (kept alive with the state)."""
        self.pinned.append(array)
        return array

    def is_pinned(self, address) -> bool:
        return any(a.ctypes.data <= address < a.ctypes.data + max(1, a.nbytes)
                   for a in self.pinned)

    @property
    def live_bytes(self) -> int:
        return sum(self.sizes.values())

    # -- memory and copies ---------------------------------------------------------------------------
    def copy(self, kind, dst, src, nbytes):
        self.copies[kind] += 1
        self.copy_log.append((kind, dst, src, nbytes))
        ctypes.memmove(dst, src, nbytes)

    def capturing_here(self):
        me = threading.get_ident()
        return [h for h, (owner, _) in self.capturing.items() if owner == me]

    def check_not_capturing(self, what):
        if self.capturing_here():
            raise _DriverError(f"{what}: operation not permitted when stream is capturing")

    def alloc(self, nbytes):
        self.need_context("cuMemAlloc")
        self.check_not_capturing("cuMemAlloc")
        buf = np.empty(max(1, nbytes) + 64, np.uint8)
        buf.view(np.uint8)[:] = 0xA5                      # garbage, as real device memory
        addr = buf.ctypes.data
        self.memory[addr] = buf
        self.sizes[addr] = max(1, nbytes)
        self.allocations += 1
        return addr

    def alloc_as_another_library(self, nbytes):
        """Device memory another library (CuPy, PyTorch) allocates with its own context current."""
        stack = self.stack()
        stack.append("another library's context")
        try:
            return self.alloc(nbytes)
        finally:
            stack.pop()

    def free(self, addr):
        if not self.current():
            # PyCUDA: "cannot free: the context is not current on this thread" -> leaked
            self.leaked += self.sizes.get(addr, 0)
            return False
        self.check_not_capturing("cuMemFree")
        self.memory.pop(addr, None)
        self.sizes.pop(addr, None)
        return True

    # -- streams ---------------------------------------------------------------------------------------
    def run(self, stream, op):
        """Queue ``op`` on ``stream`` (None: the legacy default stream), or record it if this
        thread is capturing that stream."""
        self.need_context("a launch or copy")
        handle = getattr(stream, "handle", stream) or 0
        with self.lock:
            captured = self.capturing.get(handle)
            if captured is not None and captured[0] == threading.get_ident():
                captured[1].append(op)
                return
            if captured is not None:
                raise _DriverError("work queued from another thread onto a stream being captured")
            if handle == 0:
                self.legacy(op)
            else:
                self.pending.setdefault(handle, []).append(op)

    def legacy(self, op):
        """Work on the legacy default stream: first every blocking stream's queued work (and a
        blocking stream being captured has its capture invalidated)."""
        with self.lock:
            for handle, (owner, _) in list(self.capturing.items()):
                if self.blocking.get(handle, True):
                    self.invalidated.add(handle)
                    raise _DriverError("cudaErrorStreamCaptureImplicit: the legacy default stream "
                                       "would wait for a blocking stream being captured")
            for handle in list(self.pending):
                if self.blocking.get(handle, True):
                    self.sync(handle)
            op()

    def sync(self, handle):
        """Run what ``handle`` (1, 2: the legacy/per-thread default stream) has queued."""
        with self.lock:
            if handle in (0, 1, 2):
                self.legacy(lambda: None)
                return
            ops = self.pending.pop(handle, [])
            for op in ops:
                op()

    def sync_all(self):
        with self.lock:
            for handle in list(self.pending):
                self.sync(handle)


class _ThreadExitGuard:
    """Lives in a thread's locals: when the thread ends with a context still pushed, aborts the
    process as PyCUDA does ("a thread ended with a context still on its stack")."""

    def __init__(self, stack):
        self.stack = stack

    def __del__(self):
        if self.stack:
            os.write(2, b"emulated PyCUDA: a thread ended with a CUDA context still pushed; "
                        b"aborting (as PyCUDA does)\n")
            os.abort()


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
            state.stack().append(self)

        @staticmethod
        def pop():
            stack = state.stack()
            if not stack:
                raise _DriverError("cuCtxPopCurrent failed: no context on this thread's stack")
            stack.pop()

        @staticmethod
        def synchronize():
            state.need_context("cuCtxSynchronize")
            state.check_not_capturing("cuCtxSynchronize")
            state.sync_all()

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
            state.need_context("cuStreamCreate")
            self.handle = next(state.streams)
            state.blocking[self.handle] = not (flags & 1)

        def synchronize(self):
            state.need_context("cuStreamSynchronize")
            state.check_not_capturing("cuStreamSynchronize")
            state.sync(self.handle)

    class DeviceAllocation:
        def __init__(self, nbytes):
            self.ptr = state.alloc(nbytes)
            self.nbytes = nbytes

        def __int__(self):
            return self.ptr

        __index__ = __int__

        def free(self):
            if self.ptr is not None and state.free(self.ptr):
                self.ptr = None

        # (no __del__: PyCUDA frees an allocation when it is deallocated, which never happens
        # while anything holds it; a Python finalizer here would also run on an allocation a
        # DeviceArray in a reference cycle hands back to the pool as the cycle is collected.
        # The backend frees explicitly; what it drops stays counted in live_bytes.)

    class Function:
        def __init__(self, lib, name, barrier, chunks=False):
            self.lib, self.name, self.barrier, self.chunks = lib, name, barrier, chunks
            self.ptr = ctypes.cast(getattr(lib, name), ctypes.c_void_p)

        def _launch_kernel(self, grid, block, args, shared, stream):
            lib, ptr, name = self.lib, self.ptr, self.name
            grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
            if self.chunks:                   # compiled for fewer threads
                block = (EMULATED_CHUNK_THREADS, 1, 1)

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
        def __init__(self, lib, barriers, chunks=()):
            self.lib, self.barriers, self.chunks = lib, barriers, chunks

        def get_function(self, name):
            return Function(self.lib, name, name in self.barriers, name in self.chunks)

    def module_from_buffer(data):
        path = os.path.join(state.workdir, f"module{next(state.libs)}.so")
        with open(path, "wb") as f:
            f.write(data)
        key = hash(bytes(data))
        return Module(ctypes.CDLL(path), state.barriers.get(key, set()),
                      state.chunk_kernels.get(key, set()))

    def memcpy_htod(dst, src):
        state.need_context("cuMemcpyHtoD")
        state.check_not_capturing("cuMemcpyHtoD")
        src = np.ascontiguousarray(src)
        state.legacy(lambda: state.copy("htod", int(dst), src.ctypes.data, src.nbytes))

    def memcpy_dtoh(dst, src):
        state.need_context("cuMemcpyDtoH")
        state.check_not_capturing("cuMemcpyDtoH")
        state.legacy(lambda: state.copy("dtoh", dst.ctypes.data, int(src), dst.nbytes))

    def memcpy_htod_async(dst, src, stream=None):
        d, (s, n) = int(dst), _address(src)
        if not state.is_pinned(s):
            # from pageable memory the driver stages the bytes before it returns (the caller may
            # drop the array at once); from page-locked memory it reads them when the copy runs
            staged = np.frombuffer(ctypes.string_at(s, n), np.uint8).copy()
            s = staged.ctypes.data
            state.run(stream, lambda: (staged, state.copy("htod", d, s, n)))
            return
        state.run(stream, lambda: state.copy("htod", d, s, n))

    def memcpy_dtoh_async(dst, src, stream=None):
        (d, n), s = _address(dst), int(src)
        state.run(stream, lambda: state.copy("dtoh", d, s, n))

    def memset_d32(dst, value, count):
        state.need_context("cuMemsetD32")
        state.check_not_capturing("cuMemsetD32")
        d = int(dst)
        state.legacy(lambda: np.frombuffer((ctypes.c_uint32 * count).from_address(d),
                                           np.uint32).__setitem__(slice(None), value))

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
            state.sync_all()

        def time_since(self, other):
            return (self.at - other.at) * 1e3

    def to_device(a):
        a = np.ascontiguousarray(a)
        buf = DeviceAllocation(a.nbytes)
        memcpy_htod(buf, a)
        return buf

    def pagelocked_empty(shape, dtype, order="C", mem_flags=0):
        state.need_context("cuMemHostAlloc")
        return state.pin(np.empty(shape, dtype))

    def pagelocked_zeros(shape, dtype, order="C", mem_flags=0):
        state.need_context("cuMemHostAlloc")
        return state.pin(np.zeros(shape, dtype))

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
    drv.mem_get_info = lambda: ((1 << 34) - state.live_bytes, 1 << 34)

    compiler = types.ModuleType("pycuda.compiler")

    def compile(source, nvcc="nvcc", options=None, keep=False, no_extern_c=False, arch=None,
                code=None, cache_dir=None, include_dirs=None, target="cubin"):
        assert no_extern_c and cache_dir is False and arch == "sm_90"
        assert "-fmad=false" in options
        state.compiles += 1
        name = f"compiled{state.compiles}"
        lib = build_host(source, state.workdir, name, chunk_threads=EMULATED_CHUNK_THREADS)
        with open(lib, "rb") as f:
            data = f.read()
        barriers, chunks = set(), set()
        for text in source.split('extern "C" __global__ void ')[1:]:
            head = text.split("\nextern ")[0]
            if "__syncthreads" in head or "vk_matmul_tiled<" in head or "vk_tree_chunks<" in head:
                barriers.add(text.split("(", 1)[0])
            if "vk_tree_chunks<" in head:
                chunks.add(text.split("(", 1)[0])
        state.barriers[hash(data)] = barriers
        state.chunk_kernels[hash(data)] = chunks
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
        CUDA_ERROR_ILLEGAL_STATE = 401

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
        state.need_context("cuStreamBeginCapture")
        if stream.handle in state.capturing:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        state.capturing[stream.handle] = (threading.get_ident(), [])
        state.captures = getattr(state, "captures", 0) + 1
        if state.on_capture is not None:
            state.on_capture()
        return (CUresult.CUDA_SUCCESS,)

    def end(stream):
        _, ops = state.capturing.pop(stream.handle)
        if stream.handle in state.invalidated:
            state.invalidated.discard(stream.handle)
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
        return (CUresult.CUDA_SUCCESS, Graph(ops))

    def instantiate(graph, flags):
        return (CUresult.CUDA_SUCCESS, Graph(list(graph.ops)))

    def launch(exe, stream):
        state.check_not_capturing("cuGraphLaunch")
        ops = list(exe.ops)

        def replay():
            for op in ops:
                op()
        state.run(stream.handle, replay)
        return (CUresult.CUDA_SUCCESS,)

    def synchronize(stream):
        state.need_context("cuStreamSynchronize")
        state.check_not_capturing("cuStreamSynchronize")
        state.sync(stream.handle)
        return (CUresult.CUDA_SUCCESS,)

    cu.CUresult, cu.CUstreamCaptureMode, cu.CUstream = CUresult, CUstreamCaptureMode, CUstream
    cu.cuInit = lambda flags: (CUresult.CUDA_SUCCESS,)
    cu.cuStreamBeginCapture, cu.cuStreamEndCapture = begin, end
    cu.cuGraphInstantiateWithFlags, cu.cuGraphLaunch = instantiate, launch
    cu.cuStreamSynchronize = synchronize
    cu.cuGraphDestroy = cu.cuGraphExecDestroy = lambda g: (CUresult.CUDA_SUCCESS,)
    names = {901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", 401: "CUDA_ERROR_ILLEGAL_STATE"}
    cu.cuGetErrorName = lambda err: (CUresult.CUDA_SUCCESS,
                                     names.get(err, f"CUDA error {err}").encode())
    cuda_pkg = types.ModuleType("cuda")
    cuda_pkg.__path__ = []
    bindings = types.ModuleType("cuda.bindings")
    bindings.__path__ = []
    bindings.driver = cu
    cuda_pkg.bindings = bindings
    return cuda_pkg, bindings, cu


_SHARED = re.compile(r"__shared__\s+([A-Za-z_][\w:<>]*)\s+([A-Za-z_]\w*)((?:\[[^\]]+\])+)\s*;")
_CAST = re.compile(r"\(\((int32_t|int64_t|uint8_t)\)")


def gpu_source(source):
    """``source`` as the emulator compiles it: each ``__shared__`` array filled with garbage by
    the first thread of each block to declare it, and every cast written ``((T)x)`` to an
    integer type converting as a GPU does (:func:`vk_gpu_cast`)."""
    source = _SHARED.sub(lambda m: (f"static {m[1]} {m[2]}{m[3]}; static unsigned long long "
                                    f"{m[2]}_seen; vk_shared_garbage(&{m[2]}, sizeof({m[2]}), "
                                    f"&{m[2]}_seen);"), source)
    out, at = [], 0
    for m in _CAST.finditer(source):
        if m.start() < at:
            continue
        depth, end = 0, m.start()
        while True:                      # the parenthesis that closes the outer one
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
            end += 1
        inner = source[m.end():end]
        out.append(source[at:m.start()] + f"(vk_gpu_cast<{m[1]}>({gpu_source(inner)}))")
        at = end + 1
    return "".join(out) + source[at:]


#: threads of a block of the large sums' first stage in the emulated driver (a GPU runs 256, and
#: so does :func:`emulate`): a barrier costs a switch per thread, and the partials' bits are the
#: same for any power of two (each span is a subtree of its chunk)
EMULATED_CHUNK_THREADS = 8


def build_host(source, workdir, name, chunk_threads=None):
    """Compile CUDA ``source`` for the host (see the module docstring); the library's path.
    ``chunk_threads``: the block size the large sums' first stage is compiled for (default the
    GPU's)."""
    if chunk_threads is not None:
        source = (f"#define VK_CHUNK_THREADS {chunk_threads}\n"
                  f"#define VK_CHUNK_LEVEL {(2 * chunk_threads).bit_length() - 1}\n") + source
    src = os.path.join(workdir, name + ".cpp")
    source = source.replace("extern __shared__ unsigned char vk_smem[];",
                            "unsigned char* vk_smem = vk_dynamic_shared;")
    with open(src, "w") as f:
        f.write(EMULATION + gpu_source(source) + LAUNCHER)
    lib = os.path.join(workdir, name + ".so")
    proc = subprocess.run([CXX, "-std=c++17", "-O1", "-fPIC", "-shared", "-pthread",
                           "-ffp-contract=off", "-fno-fast-math", "-w", "-o", lib, src],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise _CompileError(proc.stderr[-4000:])
    return lib


FAKE_CUBLAS = r"""
// An emulated cuBLAS: the five calls the backend makes, with cuBLAS's status codes.  Products are
// queued on the handle's stream through the emulator (vk_cb), accumulate with fused multiply-adds
// (so their bits differ from vkml's loops, as real cuBLAS's do), and the first product of a handle
// sets the library up -- an allocation, which fails (and invalidates the capture) when the stream
// is being captured.  VKML_FAKE_CUBLAS_FAIL=<call> makes that call fail with INVALID_VALUE.
#include <math.h>
#include <stdlib.h>
#include <string.h>
typedef int (*vk_cb_t)(int what, unsigned long long stream, void* job);
static vk_cb_t vk_cb;
extern "C" void vk_fake_cublas_init(vk_cb_t cb) { vk_cb = cb; }
struct vk_handle { unsigned long long stream; void* ws; size_t wsn; int ready; };
struct vk_job { int dbl, m, n, k; const void* a; int lda; long long sa; const void* b; int ldb;
                long long sb; void* c; int ldc; long long sc; int batch; };
static int vk_failing(const char* call) {
    const char* f = getenv("VKML_FAKE_CUBLAS_FAIL"); return f && strcmp(f, call) == 0; }
extern "C" int cublasCreate_v2(vk_handle** h) {
    if (vk_failing("cublasCreate_v2") || !vk_cb(0, 0, 0)) return 1;   // NOT_INITIALIZED
    *h = new vk_handle(); return 0; }
extern "C" int cublasDestroy_v2(vk_handle* h) { delete h; return 0; }
extern "C" int cublasSetStream_v2(vk_handle* h, void* s) {
    if (vk_failing("cublasSetStream_v2")) return 7;
    h->stream = (unsigned long long)s; return 0; }
extern "C" int cublasSetWorkspace_v2(vk_handle* h, void* w, size_t n) {
    if (vk_failing("cublasSetWorkspace_v2")) return 7;
    h->ws = w; h->wsn = n; return 0; }
template <typename T> static void vk_gemm(const vk_job* j) {
    for (int q = 0; q < j->batch; q++) {
        const T* a = (const T*)j->a + q * j->sa; const T* b = (const T*)j->b + q * j->sb;
        T* c = (T*)j->c + q * j->sc;
        for (int col = 0; col < j->n; col++) for (int row = 0; row < j->m; row++) {
            T acc = 0;
            for (int p = 0; p < j->k; p++)
                acc = sizeof(T) == 4 ? (T)fmaf((float)a[row + (long long)p * j->lda],
                                               (float)b[p + (long long)col * j->ldb], (float)acc)
                                     : (T)fma((double)a[row + (long long)p * j->lda],
                                              (double)b[p + (long long)col * j->ldb], (double)acc);
            c[row + (long long)col * j->ldc] = acc;
        }
    }
}
extern "C" void vk_fake_cublas_run(const vk_job* j) {
    if (j->dbl) vk_gemm<double>(j); else vk_gemm<float>(j); }
static int vk_enqueue(vk_handle* h, vk_job job) {
    if (!h->ready) {                      // the first product sets cuBLAS up: it allocates
        if (vk_cb(2, h->stream, 0)) return 14;                         // INTERNAL_ERROR
        h->ready = 1;
    }
    vk_job* j = new vk_job(job);          // kept: a captured graph replays it
    return vk_cb(1, h->stream, j) ? 13 : 0;                           // EXECUTION_FAILED
}
#define VK_GEMM(NAME, T, DBL) \
extern "C" int NAME(vk_handle* h, int ta, int tb, int m, int n, int k, const T* alpha, \
                    const T* a, int lda, long long sa, const T* b, int ldb, long long sb, \
                    const T* beta, T* c, int ldc, long long sc, int batch) { \
    if (ta || tb || *alpha != 1 || *beta != 0) return 15;             /* NOT_SUPPORTED here */ \
    return vk_enqueue(h, vk_job{DBL, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch}); }
VK_GEMM(cublasSgemmStridedBatched, float, 0)
VK_GEMM(cublasDgemmStridedBatched, double, 1)
"""

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_void_p)


def fake_cublas(state):
    """Build the emulated cuBLAS (:data:`FAKE_CUBLAS`) and connect it to ``state``; its path
    (what ``VKML_CUDA_CUBLAS_LIBRARY`` names under :func:`fake_driver`)."""
    src = os.path.join(state.workdir, "libcublas_emulated.cpp")
    with open(src, "w") as f:
        f.write(FAKE_CUBLAS)
    path = os.path.join(state.workdir, "libcublas_emulated.so")
    proc = subprocess.run([CXX, "-std=c++17", "-O1", "-fPIC", "-shared", "-ffp-contract=off",
                           "-o", path, src], capture_output=True, text=True)
    if proc.returncode != 0:
        raise _CompileError(proc.stderr[-4000:])
    lib = ctypes.CDLL(path)
    lib.vk_fake_cublas_run.argtypes = [ctypes.c_void_p]

    def callback(what, stream, job):
        try:
            if what == 0:                       # is a context current on this thread?
                return int(state.current())
            with state.lock:
                captured = state.capturing.get(stream)
                if what == 2:                   # the setup's allocation: refused while capturing
                    if captured is not None:
                        state.invalidated.add(stream)
                        return 1
                    state.alloc(1 << 20)
                    state.cublas_setups = getattr(state, "cublas_setups", 0) + 1
                    return 0
            state.run(stream, lambda: (lib.vk_fake_cublas_run(job),
                                       state.launches.append(("cublas gemm", (1, 1, 1),
                                                              (1, 1, 1)))))
            return 0
        except Exception:                        # a driver error: the call fails
            return 1

    state.cublas_callback = _CALLBACK(callback)     # kept alive as long as the state
    lib.vk_fake_cublas_init(state.cublas_callback)
    state.cublas = lib
    return path


_NAMES = ("pycuda", "pycuda.driver", "pycuda.compiler", "cuda", "cuda.bindings",
          "cuda.bindings.driver")


@contextlib.contextmanager
def fake_driver():
    """The emulated driver in ``sys.modules`` (and a private kernel cache) for the duration."""
    from vkml.backends import base
    workdir = tempfile.mkdtemp(prefix="vkml-emulated-cuda-")
    state = _Emulated(workdir)
    saved = {n: sys.modules.get(n) for n in _NAMES}
    env = {k: os.environ.get(k) for k in ("VKML_CACHE_DIR", "VKML_CUDA_CUBLAS_LIBRARY",
                                           "VKML_CUDA_NVRTC")}
    pkg, drv, compiler = _make_pycuda(state)
    cuda_pkg, bindings, cu = _make_bindings(state)
    sys.modules.update({"pycuda": pkg, "pycuda.driver": drv, "pycuda.compiler": compiler,
                        "cuda": cuda_pkg, "cuda.bindings": bindings, "cuda.bindings.driver": cu})
    os.environ["VKML_CACHE_DIR"] = os.path.join(workdir, "cache")
    os.environ["VKML_CUDA_CUBLAS_LIBRARY"] = fake_cublas(state)
    os.environ["VKML_CUDA_NVRTC"] = "0"        # the emulated "cubins" are host libraries
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
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
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
