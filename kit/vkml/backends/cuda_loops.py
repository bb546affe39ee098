"""A simulation's per-sample loops on the GPU: one thread per sample runs every step of it.

The CUDA backend's counterpart of ``cpu.SampleLoops``, with the same
``forward``/``reverse`` calls (NumPy arrays in and out), used by
``graph/simulation.py`` whenever the backend has ``sample_loops``.  The two
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

Each call copies its inputs to fresh device buffers, launches one kernel on
the backend's stream (one submission), copies the outputs back and frees
the buffers.  A failure inside a step (a gather index out of range) stops
that sample and is written to four status words after the outputs (the
first failure wins); the call then raises an ExecutionError, as the cpu
tier's loops do.

Ctrl-C: a running kernel cannot be stopped from the host (it has no flag to
poll, unlike the cpu tier's loops), so the KeyboardInterrupt comes when the
kernel ends; the device buffers are freed on the way out and nothing is
committed (``forward`` writes its planes only after the launch succeeded).
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import ExecutionError
from ..stats import STATS
from .base import failure_error
from .codegen.sample_loops import forward_source, reverse_source

#: threads per block of a sample-loop kernel
THREADS = 128
#: at most this many blocks per multiprocessor; beyond that each thread strides over samples
BLOCKS_PER_SM = 32


class CudaSampleLoops:
    """A simulation's forward and reverse as two kernels over every sample."""

    def __init__(self, gpu, step, vjp, *, n_state, n_fixed, n_params, out_names, state_names,
                 term_index, wrt, window):
        self.gpu, self.step, self.n_state, self.window, self.wrt = gpu, step, n_state, window, wrt
        self.errors = {"forward": [], "reverse": []}
        self.sources = (
            forward_source(step, n_state, n_fixed, n_params, out_names, state_names, term_index,
                           window, target="cuda", errors=self.errors["forward"]),
            reverse_source(step, vjp, n_state, n_fixed, n_params, out_names, state_names, wrt,
                           window, target="cuda", errors=self.errors["reverse"]))
        with gpu.lock:
            gpu.enter()
            fwd, _ = gpu.module(self.sources[0])
            rev, _ = gpu.module(self.sources[1])
            self._fwd, self._rev = fwd.get_function("vk_fwd"), rev.get_function("vk_rev")
        self.launches = 0

    def _launch(self, direction, fn, ins, outs, upload, n, max_steps):
        """Copy ``ins`` (and the outputs numbered in ``upload``) to fresh device buffers, run
        ``fn`` over ``n`` samples, copy the outputs back into ``outs`` (contiguous NumPy arrays)
        and free the buffers.  Every copy and the launch go on the backend's stream.  A failed
        sample (the status words after the outputs) is raised as an ExecutionError."""
        status = np.zeros(4, np.uint64)
        outs = list(outs) + [status]
        upload = set(upload) | {len(outs) - 1}
        self._run(fn, ins, outs, upload, n, max_steps)
        code = int(status[0])
        if code:
            name = self.errors[direction][code - 1]
            raise ExecutionError(f"the compiled simulation {direction}: a step failed in {name}: "
                                 f"{failure_error(name, status[1:].view(np.int64))}")

    def _run(self, fn, ins, outs, upload, n, max_steps):
        gpu = self.gpu
        drv, stream = gpu.drv, gpu.stream
        held, staged = [], []

        def device(a, copy):
            buf = drv.mem_alloc(max(1, a.nbytes))
            held.append(buf)
            if copy and a.nbytes:
                staged.append(a)                   # alive until the stream is done with it
                drv.memcpy_htod_async(buf, a, stream)
            return buf

        with gpu.lock:
            gpu.enter()
            STATS.submissions += 1
            try:
                d_in = [device(a, True) for a in ins]
                d_out = [device(o, i in upload) for i, o in enumerate(outs)]
                tables = [device(np.array([int(b) for b in bufs] or [0], np.uint64), True)
                          for bufs in (d_in, d_out)]
                if n > 0:
                    blocks = max(1, min(-(-n // THREADS), gpu.sm_count * BLOCKS_PER_SM))
                    fn._launch_kernel((blocks, 1, 1), (THREADS, 1, 1),
                                      struct.pack("QQqq", int(tables[0]), int(tables[1]), n,
                                                  max_steps), 0, stream)
                    self.launches += 1
                    gpu.loop_launches += 1
                for o, buf in zip(outs, d_out):
                    if o.nbytes:
                        drv.memcpy_dtoh_async(o, buf, stream)
            finally:
                stream.synchronize()               # even after a Ctrl-C: the device is done
                for buf in held:                   # PyCUDA frees on .free(); stand-ins may not
                    free = getattr(buf, "free", None)
                    if free is not None:
                        free()

    def forward(self, states, fixed, others, params, max_steps, threads=None):
        """Final states, per-sample steps, the checkpoints every ``window`` steps; the last step's
        other outputs are written into ``others`` (their planes).  ``threads`` is ignored."""
        ins = [np.ascontiguousarray(a, dtype=v.dtype) for a, v in
               zip(list(states) + list(fixed) + list(params), self.step.inputs)]
        n = ins[0].shape[0]
        n_ck = -(-max_steps // self.window)
        finals = [np.empty_like(s) for s in ins[:self.n_state]]
        steps = np.zeros(n, np.int64)
        cks = [np.empty((n_ck,) + s.shape, s.dtype) for s in ins[:self.n_state]]
        extra = [np.ascontiguousarray(o).copy() for o in others]
        first = len(finals) + 1 + len(cks)
        self._launch("forward", self._fwd, ins, finals + [steps] + cks + extra,
                     set(range(first, first + len(extra))), n, max_steps)
        for plane, value in zip(others, extra):
            plane[...] = value
        return finals, steps, cks

    def reverse(self, checkpoints, steps, fixed, params, seeds, threads=None):
        """Per-sample cotangents of the wrt inputs (states, floating fixed planes, Params)."""
        n = steps.shape[0]
        ins = self.step.inputs
        k = self.n_state
        types = [v.dtype for v in ins[:k]] + [np.int64] + [v.dtype for v in ins[k:]] + \
            [v.dtype for v in ins[:k]]
        args = list(checkpoints) + [steps] + list(fixed) + list(params) + list(seeds)
        arrays = [np.ascontiguousarray(a, dtype=t) for a, t in zip(args, types)]
        outs = [np.empty((n,) + ins[w].shape, ins[w].dtype) for w in self.wrt]
        self._launch("reverse", self._rev, arrays, outs, set(), n, 0)
        return outs
