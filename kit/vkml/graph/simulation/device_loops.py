"""The simulation on the GPU's per-sample loops: device planes in, device arrays out.

``run()`` and each pass of the reverse are one kernel each (``backends/cuda_loops.py``); the
Record's checkpoints, step counts and the gradients are device arrays, Param gradients are
summed on the GPU with the canonical tree and come back as NumPy values; no plane crosses PCIe.
A budget's passes read their samples of every plane through views (pointer offsets, no copy)."""

from __future__ import annotations

import numpy as np

from ...backends.cuda_loops import rows, window as checkpoint_window
from ...errors import ExecutionError
from ..treesum import MIN_PASS, chunk_bounds, combine
from .compiled_loops import compiled_loops
from .record import param_cells


class DeviceLoops:
    """On the device's compiled loops (one kernel, the window schedule)."""

    def __init__(self, sim):
        self.sim = sim

    def run(self):
        """One forward kernel over the device planes; the Record keeps its outputs where they are."""
        sim = self.sim
        loops, fixed_names = compiled_loops(sim, sim.backend)
        launch, kern, planes = sim.launch, sim.launch.kernel, sim.device_planes
        try:
            steps, cks, block_longest = loops.forward(
                [planes[s] for s in sim.state], [planes[nm] for nm in fixed_names],
                [planes[nm] for nm in launch.out_names if nm not in sim.state],
                [launch.params[p] for p in kern.params], sim.max_steps, MIN_PASS)
        except ExecutionError as error:            # the compiled loops name the sample, not the node
            raise ExecutionError(f"simulation step {kern.name}: {error}") from None
        window = sim.schedule.loop_window
        last = int(block_longest.max(initial=0))
        stored = {c * window: {s: checkpoint_window(ck, c) for s, ck in zip(sim.state, cks)}
                  for c in range(cks[0].shape[0]) if c * window < max(last, 1)} \
            if sim.record_mode else {}
        return dict(steps=steps, stored=stored, initial={s: planes[s] for s in sim.state},
                    fixed={nm: planes[nm] for nm in fixed_names}, cells=param_cells(launch),
                    checkpoint_arrays=dict(zip(sim.state, cks)), block_longest=block_longest)

    def reverse(self, record, ct0, vjps, workspace):
        """The reverse kernel once per pass, on views of the pass's samples; per-sample gradients
        written into device planes, Param gradients summed on the device (canonical tree)."""
        sim = self.sim
        loops, fixed_names = compiled_loops(sim, sim.backend)
        backend = sim.backend
        kern = sim.launch.kernel
        n, size = sim.n, sim.pass_size
        bounds = [(0, n)] if size >= n else chunk_bounds(n, size)
        names = sim.state + fixed_names + list(kern.params)
        ins = loops.step.inputs
        grads = [backend.empty_plane((n,) + ins[pos].shape, ins[pos].dtype) for pos in loops.wrt]
        seeds = [ct0[s] if s in ct0 else
                 backend.zeros_plane(record.initial[s].shape, record.initial[s].dtype)
                 for s in sim.state]
        cks = [record.checkpoint_arrays[s] for s in sim.state]
        first_param = len(sim.state) + len(fixed_names)
        partials = {}
        stats = {"chunks": len(bounds), "recomputed": 0, "peak": 0}
        for s0, e0 in bounds:
            loops.reverse(loops.checkpoint_rows(cks, s0, e0), rows(record.steps_plane, s0, e0),
                          [rows(record.fixed[nm], s0, e0) for nm in fixed_names],
                          [record.cells[p] for p in kern.params], [rows(sd, s0, e0) for sd in seeds],
                          [rows(g, s0, e0) for g in grads])
            for pos, g in zip(loops.wrt, grads):
                if pos >= first_param:
                    partials.setdefault(names[pos], []).append(
                        pass_sum(backend, rows(g, s0, e0), size if len(bounds) > 1 else e0 - s0))
            # the loops follow the window schedule for the steps the pass's samples took
            last = record.longest(s0, e0)
            stats["recomputed"] += sim.schedule.predicted_recomputed_steps(last)
            stats["peak"] = max(stats["peak"], sim.schedule.predicted_peak_states(last))
        values = {names[pos]: g for pos, g in zip(loops.wrt, grads) if pos < first_param}
        for s in sim.state:
            if s not in values:
                values[s] = backend.zeros_plane(record.initial[s].shape, record.initial[s].dtype)
        for p in kern.params:
            values[p] = combine(partials[p], size, n) if p in partials else \
                np.zeros(np.shape(record.cells[p]), np.float64)
        return values, stats


def pass_sum(backend, cotangents, size):
    """The canonical-tree sum of one pass's per-sample Param cotangents (a device array), on the
    device, as the host sums them: a short last pass is padded with zeros to ``size`` there,
    whose zero subtrees add +0.0 (the same bits, except that a -0.0 sum becomes +0.0)."""
    part = backend.tree_sum(cotangents)
    return part + np.zeros_like(part) if cotangents.shape[0] < size else part


