"""A simulation's per-sample loops on the GPU: one thread per sample runs every step of it.

The CUDA backend's counterpart of ``cpu.SampleLoops``, used by
``graph/simulation/`` whenever the backend has ``sample_loops``.  The two
kernels come from the generator the cpu tier uses
(``codegen/sample_loops.py``, ``target="cuda"``): ``vk_fwd`` steps each
sample to its own ``terminated`` (or ``max_steps``), writing a checkpoint
every ``window`` steps; ``vk_rev`` recomputes each window from its
checkpoint into a per-thread buffer and steps the adjoint back through it.
A thread's state and window live in registers and local memory; samples
never mix, so the grid-stride split (blocks of :data:`THREADS`) changes no
bit.  Compiled with the backend's nvcc flags (no FMA contraction, IEEE
division and square root), +, -, *, / and sqrt give the cpu tier's bits;
sin/exp/... come from libdevice (within a few ulps of libm).

Everything a simulation holds stays in device memory: the loops take their
planes as device arrays (``DeviceArray``, made by ``CudaBackend.to_plane``)
and give device arrays back -- the final states (written into the state
planes), the per-sample step counts, the checkpoints (one ``[windows, n, ...]``
array per state plane: the Record's stored states) and the gradients.
Device memory comes from the backend's pool: once an earlier run's Record
is dropped, the next run of the same size allocates nothing.  What crosses
PCIe per call is small and fixed, never a plane:

- one host-to-device copy of the call's *control block*: the two device
  pointer tables the kernel reads (``in[]``, ``out[]``) and the Param values
  (a few numbers, shared by every sample);
- one device-to-host copy of the *status block*: four status words (a
  failure inside a step -- a gather index out of range -- stops that sample
  and writes its code there, the first failure wins; the call then raises an
  ExecutionError, as the cpu tier's loops do) and, after a forward, the
  longest run of each aligned block of :data:`~vkml.graph.treesum.MIN_PASS`
  samples (``vk_steps_longest``, launched after ``vk_fwd``: what the graph
  layer needs to know how many steps a pass reverses, without reading every
  sample's count on the host).

A forward runs all or nothing: ``vk_fwd`` writes the final states and the last
step's other outputs into scratch device arrays, copied (on the device) into
their planes only once the status block says every sample succeeded.

Ctrl-C: a running kernel cannot be stopped from the host (it has no flag to
poll, unlike the cpu tier's loops), so the KeyboardInterrupt comes when the
kernel ends; nothing is committed then (the planes are written only after the
launch succeeded).
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import ArgumentError, ExecutionError
from ..stats import STATS
from .base import failure_error
from .codegen.sample_loops import forward_source, reverse_source

#: threads per block of a sample-loop kernel
THREADS = 128
#: at most this many blocks per multiprocessor; beyond that each thread strides over samples
BLOCKS_PER_SM = 32
#: status words of a call: the failure's code and its three detail words
STATUS_WORDS = 4

#: the longest run of each aligned block of ``block`` samples, one thread per block: what a
#: memory-budget pass (a whole number of blocks) needs to know of its samples' step counts
STEPS_LONGEST = r"""
extern "C" __global__ void vk_steps_longest(void* const* in, void* const* out, long long n,
                                            long long block) {
    const long long* steps = (const long long*)in[0];
    long long* longest = (long long*)out[0];
    long long blocks = (n + block - 1) / block;
    for (long long b = blockIdx.x * (long long)blockDim.x + threadIdx.x; b < blocks;
         b += (long long)blockDim.x * gridDim.x) {
        long long end = (b + 1) * block < n ? (b + 1) * block : n, most = 0;
        for (long long s = b * block; s < end; s++) most = steps[s] > most ? steps[s] : most;
        longest[b] = most;
    }
}
"""


def view(plane, offset, shape):
    """``shape`` at byte ``offset`` of a device plane: a view (no copy) that keeps ``plane`` alive
    and never frees its memory."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * plane.dtype.itemsize
    return type(plane)(plane._pool, plane.ptr + offset, nbytes, tuple(shape), plane.dtype,
                       owner=plane, mutable=True, readonly=plane.readonly)


def rows(plane, start, stop):
    """Samples ``[start, stop)`` of a device plane, a view (see :func:`view`)."""
    row = plane.nbytes // plane.shape[0] if plane.shape[0] else 0
    return view(plane, start * row, (stop - start,) + tuple(plane.shape[1:]))


def window(checkpoints, c):
    """Window ``c`` of a ``[windows, n, ...]`` checkpoint array: every sample's state at the start
    of step ``c * window``, a view (see :func:`view`)."""
    per = checkpoints.nbytes // checkpoints.shape[0] if checkpoints.shape[0] else 0
    return view(checkpoints, c * per, checkpoints.shape[1:])


class CudaSampleLoops:
    """A simulation's forward and reverse as two kernels over every sample, on device planes."""

    #: the loops take and give device arrays (the graph layer keeps its planes on the device)
    resident = True

    def __init__(self, gpu, step, vjp, spec):
        self.gpu, self.step, self.n_state, self.window = gpu, step, spec.n_state, spec.window
        self.wrt, self.n_fixed = spec.wrt, spec.n_fixed
        self.errors = {"forward": [], "reverse": []}
        self.sources = (
            forward_source(step, spec, target="cuda", errors=self.errors["forward"]),
            reverse_source(step, vjp, spec, target="cuda", errors=self.errors["reverse"]))
        with gpu.lock, gpu.active():
            fwd, _ = gpu.module(self.sources[0])
            rev, _ = gpu.module(self.sources[1])
            longest, _ = gpu.module(STEPS_LONGEST)
            self._fwd, self._rev = fwd.get_function("vk_fwd"), rev.get_function("vk_rev")
            self._longest = longest.get_function("vk_steps_longest")
        self.launches = 0
        self._staging = {}                  # page-locked host blocks by size, reused every call

    # -- one call: a control block in, the kernels, a status block out ------------------------------
    def _host_block(self, kind, nbytes):
        """A page-locked host buffer of ``nbytes`` for ``kind`` ("control" or "status"), made once
        per kind and size: pinning memory is slow."""
        block = self._staging.get((kind, nbytes))
        if block is None:
            block = self._staging[kind, nbytes] = self.gpu.drv.pagelocked_empty(nbytes, np.uint8)
        return block

    @staticmethod
    def _device(a, dtype):
        """``a``, checked to be a device array of ``dtype``: the kernels read its bytes as that."""
        if not hasattr(a, "ptr") or getattr(a, "dtype", None) != dtype:
            raise ArgumentError(f"the GPU's simulation loops take device arrays of {dtype}, got "
                                f"{type(a).__name__} of {getattr(a, 'dtype', '?')}; make the "
                                "planes with backend.to_plane")
        return a

    def _call(self, direction, fn, ins, params, tail, outs, n, max_steps, summary_blocks=0,
              block=1):
        """Run ``fn`` over ``n`` samples: its ``in[]`` is the device arrays ``ins``, the Params (host
        values, staged in the control block) and the device arrays ``tail``; its ``out[]`` the
        device arrays ``outs`` and the status block.  For a forward, ``vk_steps_longest`` after it
        (``summary_blocks`` words after the status words).  The status block, as int64 words;
        a failed sample is raised as an ExecutionError."""
        gpu = self.gpu
        # under the lock throughout: the staging blocks are this object's, shared by every call
        with gpu.lock, gpu.active():
            report = self._enqueue(fn, ins, params, tail, outs, n, max_steps, summary_blocks,
                                   block).copy()
        code = int(report[0])
        if code:
            name = self.errors[direction][code - 1]
            raise ExecutionError(f"the compiled simulation {direction}: a step failed in {name}: "
                                 f"{failure_error(name, report[1:STATUS_WORDS])}")
        return report

    def _enqueue(self, fn, ins, params, tail, outs, n, max_steps, summary_blocks, block):
        """:meth:`_call`'s work, under the lock: stage, enqueue, wait; the status block."""
        gpu = self.gpu
        drv, stream = gpu.drv, gpu.stream
        params = [np.ascontiguousarray(p, dtype=v.dtype) for p, v in
                  zip(params, self.step.inputs[self.n_state + self.n_fixed:])]
        # the pointer table: in[] (the planes, then the Params), out[] (the outputs, then the status
        # block), and last the summary's address (vk_steps_longest's out[0])
        n_ptrs = len(ins) + len(params) + len(tail) + len(outs) + 2
        offsets, size = [], 8 * n_ptrs
        for p in params:
            offsets.append(size)
            size += -(-max(p.nbytes, 1) // 16) * 16
        status_words = STATUS_WORDS + summary_blocks
        control = gpu.pool.array((size + 8 * status_words,), np.uint8)
        base, status = control.ptr, control.ptr + size
        host = self._host_block("control", size)
        table = host[:8 * n_ptrs].view(np.uint64)
        table[:] = [a.ptr for a in ins] + [base + o for o in offsets] + [a.ptr for a in tail] + \
            [a.ptr for a in outs] + \
            [status, status + 8 * STATUS_WORDS]
        for p, o in zip(params, offsets):
            host[o:o + p.nbytes] = p.reshape(-1).view(np.uint8)
        report = self._host_block("status", 8 * status_words).view(np.int64)
        out_table = base + 8 * (len(ins) + len(params) + len(tail))
        STATS.submissions += 1
        try:
            drv.memcpy_htod_async(base, host, stream)
            drv.memset_d32_async(status, 0, 2 * status_words, stream)
            if n > 0:
                fn._launch_kernel(self._grid(n), (THREADS, 1, 1),
                                  struct.pack("QQqq", base, out_table, n, max_steps), 0, stream)
                self.launches += 1
                gpu.loop_launches += 1
            if summary_blocks:
                # its two pointer tables: in[0] = the steps (out[n_state] of vk_fwd), out[0] =
                # the words after the status words
                self._longest._launch_kernel(
                    self._grid(summary_blocks), (THREADS, 1, 1),
                    struct.pack("QQqq", out_table + 8 * self.n_state, base + 8 * (n_ptrs - 1),
                                n, block), 0, stream)
            drv.memcpy_dtoh_async(report, status, stream)
        finally:
            stream.synchronize()               # even after a Ctrl-C: the device is done
        return report

    def _grid(self, n):
        return (max(1, min(-(-n // THREADS), self.gpu.sm_count * BLOCKS_PER_SM)), 1, 1)

    # -- the forward and the reverse ---------------------------------------------------------------
    def forward(self, states, fixed, others, params, max_steps, block):
        """Step every sample from ``states`` (device planes, updated in place) to its end; the last
        step's other outputs are written into ``others`` (their planes).  Returns the per-sample
        steps (an int64 device array), the checkpoints every ``window`` steps (one
        ``[ceil(max_steps / window), n, ...]`` device array per state plane) and the longest run
        of each aligned block of ``block`` samples (a NumPy array: the only numbers read back)."""
        gpu, ins_types = self.gpu, self.step.inputs
        k = self.n_state
        with gpu.lock, gpu.active():
            states = [self._device(a, v.dtype) for a, v in zip(states, ins_types[:k])]
            fixed = [self._device(a, v.dtype) for a, v in zip(fixed, ins_types[k:])]
            n = states[0].shape[0]
            n_ck = -(-max_steps // self.window)
            pool = gpu.pool
            finals = [pool.array(s.shape, s.dtype) for s in states]
            steps = pool.array((n,), np.int64, mutable=True)
            cks = [pool.array((n_ck,) + s.shape, s.dtype, mutable=True) for s in states]
            # the other outputs start as the planes' values (a sample that takes no step keeps them)
            scratch = [self._copy(pool.array(o.shape, o.dtype), o) for o in others]
            blocks = -(-n // block)
            report = self._call("forward", self._fwd, states + fixed, params, [],
                                finals + [steps] + cks + scratch, n, max_steps, blocks, block)
            for plane, value in zip(list(states) + list(others), finals + scratch):
                self._copy(plane, value)           # committed: every sample succeeded
            gpu.stream.synchronize()
        return steps, cks, report[STATUS_WORDS:].copy()

    def reverse(self, checkpoints, steps, fixed, params, seeds, outs):
        """The per-sample cotangents of the wrt inputs (states, floating fixed planes, Params),
        written into ``outs`` (device arrays, one per wrt input, in ``wrt`` order).  Every
        argument is a device array of the pass's samples (``rows`` of a plane: no copy), the
        checkpoints ``[windows, m, ...]`` as :meth:`checkpoint_rows` gives them."""
        gpu, ins = self.gpu, self.step.inputs
        k = self.n_state
        with gpu.lock, gpu.active():
            args = [self._device(a, v.dtype) for a, v in zip(checkpoints, ins[:k])] + \
                [self._device(steps, np.dtype(np.int64))] + \
                [self._device(a, v.dtype) for a, v in zip(fixed, ins[k:])] + \
                [self._device(a, v.dtype) for a, v in zip(seeds, ins[:k])]
            # the Params sit between the fixed planes and the seeds in the kernel's in[]
            n_fixed = k + 1 + self.n_fixed
            self._call("reverse", self._rev, args[:n_fixed], params, args[n_fixed:], list(outs),
                       steps.shape[0], 0)
        return outs

    def checkpoint_rows(self, checkpoints, start, stop):
        """The checkpoints of samples ``[start, stop)`` as the reverse kernel reads them
        (``[windows, stop - start, ...]``, contiguous): the whole arrays for every sample, else a
        copy on the device of each window's rows (one device-to-device copy per window and
        state plane; the kernel indexes a window's rows by the samples it reverses)."""
        if start == 0 and all(stop == ck.shape[1] for ck in checkpoints):
            return list(checkpoints)
        gpu = self.gpu
        out = []
        with gpu.lock, gpu.active():
            for ck in checkpoints:
                part = gpu.pool.array((ck.shape[0], stop - start) + tuple(ck.shape[2:]), ck.dtype,
                                      mutable=True)
                for c in range(ck.shape[0]):
                    self._copy(window(part, c), rows(window(ck, c), start, stop))
                out.append(part)
            gpu.stream.synchronize()
        return out

    def _copy(self, dst, src):
        """Enqueue a device-to-device copy of ``src`` into ``dst`` on the backend's stream."""
        if dst.nbytes:
            self.gpu.drv.memcpy_dtod_async(dst.ptr, src.ptr, dst.nbytes, self.gpu.stream)
        return dst

