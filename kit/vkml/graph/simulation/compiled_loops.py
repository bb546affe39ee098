"""The simulation on a backend's compiled per-sample loops (the cpu tier): every step of every
sample in one call, and the reverse of a pass in one call, following the window schedule."""

from __future__ import annotations

import numpy as np

from ...backends import ExecutionFailure
from ...backends.base import threads
from ...errors import ExecutionError
from ...ir import program_from_dag
from ...transforms import vjp_program
from ...transforms.ad import derived
from ...transforms.control import reorder_inputs
from ..execute import execution_error
from .host_steps import HostSteps, host_fixed
from .record import param_cells


def compiled_loops(sim, backend):
    """``backend``'s compiled per-sample loops for the simulation's kernel, and the names of the
    inputs the step reads and never updates, in the loops' order; None where the backend has no
    loops (the NumPy backend) or the run needs what they lack (model nodes, the ``"full"`` and
    ``"binomial"`` schedules).  Asked of the backend on every run: it caches the loops, and
    ``vkml.clear_caches()`` frees them."""
    window = sim.schedule.loop_window if sim.record_mode else sim.max_steps
    if sim.nodes or window is None or not hasattr(backend, "sample_loops"):
        return None
    launch = sim.launch
    kern = launch.kernel
    fixed = [nm for nm in kern.inputs if nm not in sim.state]
    order = [kern.inputs.index(nm) for nm in sim.state + fixed] + \
        [len(kern.inputs) + j for j in range(len(kern.params))]
    step = reorder_inputs(launch.program, order)
    wrt = [i for i, v in enumerate(step.inputs) if v.dtype.kind == "f"]

    def make_vjp():
        vp = vjp_program(step, wrt)
        return program_from_dag(list(vp.inputs), list(vp.outputs[len(step.outputs):]))

    vjp = derived("simulation-vjp", step, wrt, make_vjp)
    spec = (("n_state", len(sim.state)), ("n_fixed", len(fixed)),
            ("n_params", len(kern.params)), ("out_names", tuple(launch.out_names)),
            ("state_names", tuple(sim.state)),
            ("term_index", launch.out_names.index("terminated") if sim.terminates else None),
            ("wrt", tuple(wrt)), ("window", window))
    loops = backend.sample_loops(step, vjp, spec)
    return None if loops is None else (loops, fixed)


class CompiledLoops(HostSteps):
    """On the compiled loops; the passes of a memory budget as on the host (``HostSteps.reverse``),
    each pass one call."""

    def run(self):
        """Every step of every sample in one call of the compiled loops, on copies of the planes
        they write, committed once the call has succeeded."""
        sim = self.sim
        loops, fixed_names = compiled_loops(sim, sim.backend)
        fixed = host_fixed(sim)
        launch = sim.launch
        kern = launch.kernel
        planes = [launch.writes[nm] for nm in launch.out_names if nm not in sim.state]
        others = [p.copy() for p in planes]       # written by the loops; committed on success
        try:
            finals, steps, cks = loops.forward(
                [launch.reads[s] for s in sim.state], [fixed[nm] for nm in fixed_names], others,
                [launch.params[p] for p in kern.params], sim.max_steps, threads())
        except ExecutionFailure as failure:
            raise execution_error(failure, loop_equations(loops), f"simulation step {kern.name}") \
                from failure.error
        except ExecutionError as error:            # the compiled loops name the sample, not the node
            raise ExecutionError(f"simulation step {kern.name}: {error}") from None
        for plane, value in zip(planes, others):
            plane[...] = value
        for s, value in zip(sim.state, finals):
            launch.writes[s][...] = value
        window = sim.schedule.loop_window
        last = int(steps.max(initial=0))
        checkpoints = {c * window: {s: ck[c] for s, ck in zip(sim.state, cks)}
                       for c in range(cks[0].shape[0]) if c * window < max(last, 1)} \
            if sim.record_mode else {}
        return dict(steps=steps, stored=checkpoints, initial={s: launch.reads[s] for s in sim.state},
                    fixed=dict(fixed), cells=param_cells(launch),
                    checkpoint_arrays=dict(zip(sim.state, cks)))

    def reverse_slice(self, record, sl, ct0, vjps, stats, workspace):
        """The reverse of the samples in ``sl`` in one call of the compiled loops, which follow
        the window schedule from the Record's checkpoints."""
        sim = self.sim
        loops, fixed_names = compiled_loops(sim, sim.backend)
        kern = sim.launch.kernel
        m = sl.stop - sl.start
        steps = record.steps[sl]
        cks = [record.checkpoint_arrays[s][:, sl] for s in sim.state]
        fixed = [record.fixed[nm][sl] for nm in fixed_names]
        params = [record.cells[p] for p in kern.params]
        seeds = [ct0.get(s, np.zeros_like(record.initial[s][sl])) for s in sim.state]
        try:
            outs = loops.reverse(cks, steps, fixed, params, seeds, threads())
        except ExecutionFailure as failure:
            raise execution_error(failure, loop_equations(loops), f"the vjp of simulation step {kern.name}") \
                from failure.error
        except ExecutionError as error:
            raise ExecutionError(f"the vjp of simulation step {kern.name}: {error}") from None
        names = sim.state + fixed_names + list(kern.params)
        res = {"state": {}, "fixed": {}, "params": {}}
        for pos, g in zip(loops.wrt, outs):
            name = names[pos]
            key = "state" if pos < len(sim.state) else \
                "fixed" if pos < len(sim.state) + len(fixed_names) else "params"
            res[key][name] = g
        for s in sim.state:
            res["state"].setdefault(s, np.zeros_like(record.initial[s][sl]))
        for p in kern.params:
            res["params"].setdefault(p, np.zeros((m,) + np.shape(record.cells[p]), np.float64))
        # the compiled loops follow the window schedule for the steps the samples took
        T = int(steps.max(initial=0))
        stats["recomputed"] += sim.schedule.predicted_recomputed_steps(T)
        stats["peak"] = max(stats["peak"], sim.schedule.predicted_peak_states(T))
        return res


def loop_equations(loops):
    """The equations of the step program compiled loops run (to name a failing one)."""
    return getattr(getattr(loops, "step", None), "eqns", [])
