"""The simulation stepped from the host on a backend that keeps planes in device memory (cuda):
each step one program on device arrays in and out (``device_programs.DeviceSteps``), no plane
crossing PCIe; model nodes run on host copies of what they read and write, explicitly."""

from __future__ import annotations

import numpy as np

from ..treesum import chunk_bounds, combine
from .device_loops import pass_sum
from .device_programs import DeviceSteps, device_rows
from .host_steps import HostSteps, loop_progress
from .record import param_cells


class DeviceStepped(HostSteps):
    """Stepped from the host on device arrays: the schedule's plan and the model nodes' vjps as
    on the host (``HostSteps.follow_plan``/``node_vjps``), every step one device program."""

    def __init__(self, sim):
        super().__init__(sim)
        #: the compiled forward and reverse step programs, per sample count
        self.programs = DeviceSteps(sim, sim.backend)

    def run(self):
        """The host-stepped run on the device planes (``device_programs.py``): every step one
        submission on device arrays; the planes are written once every step has succeeded."""
        sim = self.sim
        launch, backend, planes = sim.launch, sim.backend, sim.device_planes
        n = sim.n
        state = {s: planes[s] for s in sim.state}
        fixed = {nm: planes[nm] for nm in launch.kernel.inputs if nm not in sim.state}
        for node in sim.nodes:
            for k in node.writes:
                fixed.setdefault(k, planes[k])
        stopped = backend.zeros_plane((n,), np.bool_)
        steps = backend.zeros_plane((n,), np.int64)
        stored, rest = {}, None
        store_at = sim.schedule.stored_steps(sim.max_steps) if sim.record_mode else ()
        store_at = store_at if isinstance(store_at, range) else set(store_at)
        running = n > 0
        with loop_progress(sim.progress, sim.max_steps, "simulation") as bar:
            for t in range(sim.max_steps):
                if not running:
                    break
                if t in store_at:         # a step's output is never written again: kept as it is
                    stored[t] = {s: backend.copy_plane(v) if v is planes[s] else v
                                 for s, v in state.items()}
                extra = self.device_node_values(state, fixed)
                state, rest, stopped, steps, flag = self.programs.step(
                    state, dict(fixed, **extra), stopped, steps)
                running = flag is not False
                bar.update(1)
        for s in sim.state:
            if state[s] is not planes[s]:
                backend.copy_plane_into(planes[s], state[s])
        for name, value in (rest or {}).items():
            backend.copy_plane_into(planes[name], value)
        return dict(steps=steps, stored=stored, initial={s: planes[s] for s in sim.state},
                    fixed=fixed, cells=param_cells(launch))

    def device_node_values(self, cur, fixed):
        """The model nodes' outputs as device arrays: a node runs Python on host values, so its
        reads are copied to the host and its writes to the device (explicit, every step)."""
        sim = self.sim
        extra = {}
        for node in sim.nodes:
            reads = {k: np.asarray(cur[k] if k in cur else fixed.get(k, sim.device_planes[k]))
                     for k in node.reads}
            for k, v in node.run(reads).items():
                extra[k] = sim.backend.to_plane(np.asarray(v, dtype=node.writes[k].dtype))
        return extra

    def reverse(self, record, ct0, vjps, workspace):
        """The host-stepped reverse on device arrays, pass by pass (as ``HostSteps.reverse``):
        per-sample gradients stay device arrays, Param gradients are summed on the device."""
        sim = self.sim
        backend = sim.backend
        n, size = sim.n, sim.pass_size
        bounds = [(0, n)] if size >= n else chunk_bounds(n, size)
        stats = {"chunks": len(bounds), "recomputed": 0, "peak": 0}
        parts, partials = [], {}
        for s0, e0 in bounds:
            sl = slice(s0, e0)
            res = self.reverse_slice(
                record, sl, {k: device_rows(v, sl) for k, v in ct0.items()}, vjps, stats)
            parts.append((sl, res))
            for p, acc in res["params"].items():
                partials.setdefault(p, []).append(
                    pass_sum(backend, acc, size if len(bounds) > 1 else e0 - s0))
        values = {}
        for key in ("state", "fixed"):
            for name in parts[0][1][key]:
                got = [res[key][name] for _, res in parts]
                if len(parts) == 1:      # the caller's own: never a seed handed back as it is
                    seeds = [v for v in ct0.values()]
                    values[name] = backend.copy_plane(got[0]) if any(got[0] is v for v in seeds) \
                        else got[0]
                    continue
                full = backend.empty_plane((n,) + tuple(got[0].shape[1:]), got[0].dtype)
                for (sl, _), g in zip(parts, got):
                    backend.copy_plane_into(device_rows(full, sl), g)
                values[name] = full
        for p in sim.launch.kernel.params:
            values[p] = (partials[p][0] if len(bounds) == 1 else combine(partials[p], size, n)) \
                if p in partials else np.zeros(np.shape(record.cells[p]), np.float64)
        return values, stats

    def reverse_slice(self, record, sl, ct0, vjps, stats, workspace=None):
        """``HostSteps.reverse_slice`` on device arrays: each reversed step one submission
        (``DeviceSteps.back_step``), each recomputed step one (``DeviceSteps.advance``)."""
        sim = self.sim
        backend, stepper = sim.backend, self.programs
        steps = device_rows(record.steps_plane, sl)
        T, fewest = stepper.span(steps)
        # a model node's vjp runs on the samples still running at a step: the counts on the host
        # (its values are copied anyway); else only the longest and fewest steps come back
        host_steps = record.steps[sl] if sim.nodes else _Span(steps.shape[0], fewest)
        fixed = {k: device_rows(v, sl) for k, v in record.fixed.items()}
        ct_state = {s: ct0[s] if s in ct0 else
                    backend.zeros_plane(device_rows(record.initial[s], sl).shape,
                                        record.initial[s].dtype) for s in sim.state}
        acc = [None]
        host_acc = {}                # inputs a model node reads too: summed on the host
        summed_here = stepper.host_summed(sl.stop - sl.start)

        def back_step(t, cur, extra):
            new_ct, acc[0], node_cts = stepper.back_step(cur, dict(fixed, **extra), ct_state,
                                                         steps, t, acc[0])
            ct_state.update(new_ct)
            if node_cts:
                self.device_node_vjps(vjps, cur, fixed, extra, node_cts, ct_state, host_acc,
                                          summed_here, t < host_steps)

        self.follow_plan(
            sim.schedule.plan(sim.max_steps, T), record.stored, sl, T, fixed, host_steps,
            back_step, stats,
            advance=lambda cur, u, everyone: stepper.advance(
                cur, dict(fixed, **self.device_node_values(cur, fixed)), steps, u),
            node_values=lambda cur: self.device_node_values(cur, fixed))
        got = acc[0] or {}
        params = {p: got[("param", p)] if ("param", p) in got else
                  np.zeros((sl.stop - sl.start,) + np.shape(record.cells[p]), np.float64)
                  for p in sim.launch.kernel.params}
        fixed_grads = {nm: g for (kind, nm), g in got.items() if kind == "fixed"}
        fixed_grads.update({nm: backend.to_plane(g) for nm, g in host_acc.items()})
        return {"state": ct_state, "fixed": fixed_grads, "params": params}

    def device_node_vjps(self, vjps, cur, fixed, extra, node_cts, ct_state, host_acc,
                             summed_here, active):
        """The model nodes' vjps (user Python) on host copies: what they read, the adjoints of
        what they wrote and the state adjoints they add to go to the host, and those adjoints
        come back (explicit copies, every reversed step); the inputs they read keep their
        adjoint sums on the host, in the NumPy path's order."""
        sim = self.sim
        for nm in summed_here:
            g = np.asarray(node_cts[nm])
            host_acc[nm] = g if nm not in host_acc else host_acc[nm] + g
        read = {k for node in sim.nodes for k in node.reads}
        host = {k: np.array(v) for k, v in ct_state.items() if k in read}     # its own, writeable
        self.node_vjps(vjps, {k: np.asarray(v) for k, v in cur.items() if k in read},
                        {k: np.asarray(v) for k, v in fixed.items() if k in read}, {},
                        {k: np.asarray(v) for k, v in node_cts.items() if k not in summed_here},
                        host, host_acc, active)
        for k, v in host.items():
            ct_state[k] = sim.backend.to_plane(v)


class _Span:
    """What a schedule's plan reads of the step counts of a pass kept on the device: how many
    samples it has and the fewest steps one took (``Simulation._fewest_steps``)."""

    def __init__(self, size, fewest):
        self.size, self._fewest = size, fewest

    def min(self):
        return self._fewest


