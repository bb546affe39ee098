"""A simulation stepped from the host on a backend that keeps planes in device memory (cuda).

The per-sample GPU loops cover one kernel under the window schedule.  Everything else -- model
nodes, the ``"full"`` and ``"binomial"`` schedules, a step the loops do not lower -- is stepped
from the host: one submission per step.  Here each such submission is one program on device
arrays in and device arrays out, so no plane crosses PCIe:

- a forward step (:meth:`DeviceSteps.forward`) takes the state, the inputs the step reads, the
  Param cells, the per-sample ``stopped`` flags and step counts, and returns the new state (a
  stopped sample keeps its own), the step's other outputs, the new flags and counts, and -- for a
  kernel that can terminate -- one word saying whether any sample still runs;
- a reverse step (:meth:`DeviceSteps.backward`) takes a state, the adjoints carried so far, the
  per-sample Param and input accumulators, the step counts and the step's index, and returns
  them all updated: the masking (a sample that had stopped at that step keeps its adjoint) and
  the additions are the NumPy path's, in the same order, so the bits are the same.

Per step the host sends the executable's pointer table and its block of small arguments (the
Param cells, the step's index) and reads back its status words, plus, forward, the
"any sample still running" word.  A stored checkpoint is the step's own output array (never
written again), so storing one copies nothing; only the initial state is copied, on the device.

Model nodes run user Python on host values: their reads are copied to the host and their writes
to the device on every step (and, in the reverse, the adjoints their vjp adds to), explicitly.
"""

from __future__ import annotations

import numpy as np

from ...backends.cuda_loops import rows
from ...errors import ExecutionError
from ...ir import Var, program_from_dag
from ...ops import api
from ...runtime import submit
from ...transforms import inline


def device_rows(plane, sl):
    """Samples ``sl`` of a plane: a NumPy slice, or a view of a device plane (no copy)."""
    if isinstance(plane, np.ndarray):
        return plane[sl]
    if sl.start == 0 and sl.stop == plane.shape[0]:
        return plane
    return rows(plane, sl.start, sl.stop)


def _column(mask, shape):
    """A per-sample flag broadcast over the rest of a value of ``shape``."""
    return api.broadcast_in_dim(mask, shape, (0,))


def _select(mask, value, other):
    return api.where(_column(mask, value.shape), value, other)


def _zeros_as(var):
    return api.zeros(var.shape, var.dtype)


class DeviceSteps:
    """The compiled forward and reverse step programs of one simulation, per sample count."""

    def __init__(self, sim, backend):
        self.sim, self.backend = sim, backend
        launch = sim.launch
        self.kern = launch.kernel
        self.fixed_names = [nm for nm in self.kern.inputs if nm not in sim.state]
        self._forward, self._backward, self._replay = {}, {}, {}

    # -- forward ---------------------------------------------------------------------------------
    def forward(self, m):
        """``(executable, program)`` of one step over ``m`` samples (see the module docstring)."""
        if m not in self._forward:
            self._forward[m] = self._compile("simulation-device-step", self._forward_program(m))
        return self._forward[m]

    def _forward_program(self, m):
        sim, launch, kern = self.sim, self.sim.launch, self.kern
        state, fixed, cells = self._inputs(m)
        stopped, steps = Var((m,), np.dtype(bool)), Var((m,), np.dtype(np.int64))
        by_name = dict(zip(sim.state, state))
        by_name.update(zip(self.fixed_names, fixed))
        outs = dict(zip(launch.out_names, inline(launch.batched().program(m),
                                                 [by_name[nm] for nm in kern.inputs] + cells)))
        active = api.logical_not(stopped)
        new_state = [_select(active, outs[s], v) for s, v in zip(sim.state, state)]
        others = [outs[nm] for nm in launch.out_names if nm not in sim.state]
        if sim.terminates:
            stopped_now = api.logical_or(stopped, api.logical_and(outs["terminated"], active))
        else:
            stopped_now = stopped
        new_steps = api.add(steps, api.cast(active, np.int64))
        results = new_state + others + [stopped_now, new_steps]
        if sim.terminates:
            results.append(api.max(api.cast(api.logical_not(stopped_now), np.int32)))
        return program_from_dag(state + fixed + cells + [stopped, steps], results)

    def replay(self, m):
        """``(executable, program)`` of a step recomputed in the reverse over ``m`` samples: a
        sample runs where ``t < steps`` (the Record's counts), else keeps its state."""
        if m not in self._replay:
            self._replay[m] = self._compile("simulation-device-replay", self._replay_program(m))
        return self._replay[m]

    def _replay_program(self, m):
        sim, launch, kern = self.sim, self.sim.launch, self.kern
        state, fixed, cells = self._inputs(m)
        steps, t = Var((m,), np.dtype(np.int64)), Var((), np.dtype(np.int64))
        by_name = dict(zip(sim.state, state))
        by_name.update(zip(self.fixed_names, fixed))
        outs = dict(zip(launch.out_names, inline(launch.batched().program(m),
                                                 [by_name[nm] for nm in kern.inputs] + cells)))
        active = api.less(api.broadcast_in_dim(t, (m,), ()), steps)
        return program_from_dag(state + fixed + cells + [steps, t],
                                [_select(active, outs[s], v) for s, v in zip(sim.state, state)])

    def advance(self, state, fixed, steps, t):
        """The state after step ``t`` (recomputed in the reverse), on device arrays."""
        exe, program = self.replay(steps.shape[0])
        args = [state[s] for s in self.sim.state] + [fixed[nm] for nm in self.fixed_names] + \
            [self.sim.launch.params[p] for p in self.kern.params] + [steps, np.int64(t)]
        return dict(zip(self.sim.state, self._run_resident(exe, program, args,
                                                     f"simulation step {self.kern.name}")))

    def _inputs(self, m):
        """Placeholders of the state, the other per-sample inputs and the Param cells."""
        launch = self.sim.launch
        state = [Var((m,) + launch.reads[s].shape[1:], launch.reads[s].dtype) for s in self.sim.state]
        fixed = [Var((m,) + self._plane(nm).shape[1:], self._plane(nm).dtype)
                 for nm in self.fixed_names]
        cells = [Var(np.shape(launch.params[p]), launch.params[p].dtype) for p in self.kern.params]
        return state, fixed, cells

    def step(self, state, fixed, stopped, steps, read_flag=True):
        """One forward step over device arrays: ``(new state, other outputs, stopped, steps,
        running)``; ``running`` (whether any sample still runs) is read on the host only where
        ``read_flag`` and the kernel can terminate (one word), else None."""
        sim, launch = self.sim, self.sim.launch
        m = steps.shape[0]
        exe, program = self.forward(m)
        args = [state[s] for s in sim.state] + [fixed[nm] for nm in self.fixed_names] + \
            [launch.params[p] for p in self.kern.params] + [stopped, steps]
        outs = self._run_resident(exe, program, args, f"simulation step {self.kern.name}")
        k = len(sim.state)
        others = [nm for nm in launch.out_names if nm not in sim.state]
        new = dict(zip(sim.state, outs[:k]))
        rest = dict(zip(others, outs[k:k + len(others)]))
        stopped, steps = outs[k + len(others)], outs[k + len(others) + 1]
        running = None
        if sim.terminates and read_flag:
            running = bool(np.asarray(outs[-1]))
        return new, rest, stopped, steps, running

    def span(self, steps):
        """``(most, fewest)`` steps a sample of the device array ``steps`` took: computed on the
        device, two words read back (the reverse needs no more of the Record's counts)."""
        m = steps.shape[0]
        if not m:
            return 0, 0
        if ("span", m) not in self._forward:
            counts = Var((m,), np.dtype(np.int64))
            self._forward["span", m] = self._compile(
                "simulation-device-span", program_from_dag([counts], [api.max(counts), api.min(counts)]))
        exe, program = self._forward["span", m]
        most, fewest = self._run_resident(exe, program, [steps], "simulation reverse")
        return int(np.asarray(most)), int(np.asarray(fewest))

    # -- reverse ---------------------------------------------------------------------------------
    def backward(self, m, first):
        """``(executable, program, layout)`` of one reverse step over ``m`` samples; ``first``:
        the first step reversed, which starts the accumulators with its own cotangents (as the
        NumPy path assigns its first one) instead of adding to them."""
        if (m, first) not in self._backward:
            program, layout = self._backward_program(m, first)
            self._backward[m, first] = self._compile("simulation-device-vjp", program) + (layout,)
        return self._backward[m, first]

    def _backward_program(self, m, first):
        sim, launch, kern = self.sim, self.sim.launch, self.kern
        batch, wrt = launch.batched_vjp()
        vjp = batch.program(m)
        n_in = len(kern.inputs)
        state, fixed, cells = self._inputs(m)
        ct_state = [Var(v.shape, v.dtype) for v in state]
        steps, t = Var((m,), np.dtype(np.int64)), Var((), np.dtype(np.int64))
        by_name = dict(zip(sim.state, state))
        by_name.update(zip(self.fixed_names, fixed))
        ct_by_state = dict(zip(sim.state, ct_state))
        active = api.less(api.broadcast_in_dim(t, (m,), ()), steps)
        cts = []
        for name, var in zip(launch.out_names, launch.program.outputs):
            if name in sim.state:
                ct = ct_by_state[name]
                cts.append(_select(active, ct, api.zeros_like(ct)))
            else:
                cts.append(api.zeros((m,) + var.shape, var.dtype))
        grads = inline(vjp, [by_name[nm] for nm in kern.inputs] + cells + cts)
        g_in, g_prm = {}, {}
        for pos, g in zip(wrt, grads):
            if pos < n_in:
                g_in[kern.inputs[pos]] = g
            else:
                g_prm[kern.params[pos - n_in]] = g
        node_written = {k for node in sim.nodes for k in node.writes}
        node_read = {k for node in sim.nodes for k in node.reads}
        float_fixed = [nm for nm in self.fixed_names if nm in g_in and nm not in node_written
                       and self._plane(nm).dtype.kind == "f"]
        # the accumulators: the per-sample Param cotangents and the float inputs' adjoints; an
        # input a model node reads too is summed on the host, where the node's vjp adds to it
        acc_names = [("param", p) for p in kern.params if p in g_prm] + \
            [("fixed", nm) for nm in float_fixed if nm not in node_read]
        acc = [Var((g_prm if kind == "param" else g_in)[nm].shape,
                   (g_prm if kind == "param" else g_in)[nm].dtype) for kind, nm in acc_names]
        new_ct = [_select(active, g_in[s], ct) if s in g_in else ct
                  for s, ct in zip(sim.state, ct_state)]
        new_acc = []
        for (kind, nm), a in zip(acc_names, acc):
            g = (g_prm if kind == "param" else g_in)[nm]
            masked = _select(active, g, api.zeros_like(g))
            new_acc.append(masked if first else api.add(a, masked))
        node_cts = [nm for nm in self.fixed_names if nm in node_written and nm in g_in] + \
            [nm for nm in float_fixed if nm in node_read]
        node_out = [_select(active, g_in[nm], api.zeros_like(g_in[nm])) for nm in node_cts]
        program = program_from_dag(state + fixed + cells + ct_state + [steps, t] +
                                   ([] if first else acc), new_ct + new_acc + node_out)
        return program, {"acc": acc_names, "node_cts": node_cts}

    def host_summed(self, m):
        """The inputs whose adjoints the host sums (read by a model node too)."""
        node_written = {k for node in self.sim.nodes for k in node.writes}
        return [nm for nm in self.backward(m, True)[2]["node_cts"] if nm not in node_written]

    def back_step(self, cur, fixed, ct_state, steps, t, acc):
        """One reverse step over device arrays: ``(new state adjoints, new accumulators, the
        adjoints of the model nodes' outputs)``; ``acc`` None on the first step reversed."""
        sim, launch = self.sim, self.sim.launch
        m = steps.shape[0]
        exe, program, layout = self.backward(m, acc is None)
        args = [cur[s] for s in sim.state] + [fixed[nm] for nm in self.fixed_names] + \
            [launch.params[p] for p in self.kern.params] + [ct_state[s] for s in sim.state] + \
            [steps, np.int64(t)] + ([] if acc is None else [acc[key] for key in layout["acc"]])
        outs = self._run_resident(exe, program, args, f"the vjp of simulation step {self.kern.name}")
        k, a = len(sim.state), len(layout["acc"])
        return (dict(zip(sim.state, outs[:k])), dict(zip(layout["acc"], outs[k:k + a])),
                dict(zip(layout["node_cts"], outs[k + a:])))

    # -- shared --------------------------------------------------------------------------------------
    def _plane(self, name):
        launch = self.sim.launch
        if name in launch.reads:
            return launch.reads[name]
        for node in self.sim.nodes:
            if name in node.writes:
                return node.writes[name]
        raise KeyError(name)

    def _compile(self, tag, program):
        return self.backend.executable((tag, program), lambda: program), program

    def _run_resident(self, exe, program, args, where):
        try:
            return submit(self.backend, exe, args, program.eqns, resident=True)
        except ExecutionError as error:
            raise ExecutionError(f"{where}: {error}") from None
