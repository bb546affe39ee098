"""The simulation stepped from the host, one step of every sample at a time (the NumPy backend,
and any run the compiled loops do not cover: model nodes, the ``"full"`` and ``"binomial"``
schedules), and the base of every stepper.

A stepper is one way of running a simulation, chosen once when the simulation is made
(``steppers.stepper_for``): ``run()`` runs every step, writes the planes only once all succeeded
and returns the parts of the Record; ``reverse(record, cotangents, vjps, workspace)`` returns
every gradient and the reverse's counts.
"""

from __future__ import annotations

import numpy as np

from ...progress import progress as progress_bar
from ..diff import reverse_launch, user_vjp_gradients
from ..execute import run_named, user_error
from ..treesum import chunk_bounds, combine, tree_sum
from .device_programs import device_rows
from .record import param_cells


def host_fixed(sim):
    """The per-sample inputs a step reads and never updates, by name (the model nodes' outputs
    included: each step writes them anew)."""
    launch = sim.launch
    fixed = {nm: launch.reads[nm] for nm in launch.kernel.inputs if nm not in sim.state}
    for node in sim.nodes:
        for k, p in node.writes.items():
            fixed.setdefault(k, p)
    return fixed


class HostSteps:
    """Stepped from the host on NumPy arrays: each step one batched run of the kernel (after the
    model nodes), each reversed step one run of its vjp."""

    def __init__(self, sim):
        self.sim = sim

    def cells(self):
        sim = self.sim
        return [sim.launch.params[p] for p in sim.launch.kernel.params]

    def step(self, state, fixed, active, node_reads=None, everyone=False):
        """One step for all samples; inactive samples keep their state.  ``everyone``: every
        sample is active (nothing to mask: the new state is the step's output as it is)."""
        sim = self.sim
        launch = sim.launch
        kern = launch.kernel
        extra = {}
        for node in sim.nodes:
            reads = {k: (state[k] if k in state else v) for k, v in node.reads.items()}
            for k, v in node.run(reads).items():
                extra[k] = np.asarray(v)
        ins = [state[n] if n in state else extra.get(n, fixed[n]) for n in kern.inputs]
        flags = [True] * len(kern.inputs) + [False] * len(kern.params)
        outs = dict(zip(launch.out_names, run_named(launch.batched(), len(active), ins + self.cells(),
                                                    flags, f"simulation step {kern.name}")))
        new = {}
        for s in sim.state:
            mask = active.reshape((-1,) + (1,) * (outs[s].ndim - 1))
            new[s] = outs[s] if everyone else np.where(mask, outs[s], state[s])
        done = outs["terminated"] & active if sim.terminates else np.zeros_like(active)
        return new, done, outs, extra

    def run(self):
        """Every step of every sample, one step of all samples at a time, on private copies of
        the state, written into the planes only once every step has succeeded (all or nothing);
        the parts of the Record (see the module docstring)."""
        sim = self.sim
        launch = sim.launch
        n = sim.n
        state = {s: launch.reads[s].copy() for s in sim.state}
        fixed = host_fixed(sim)
        active = np.ones(n, dtype=bool)
        steps = np.zeros(n, dtype=np.int64)
        stored = {}
        store_at = sim.schedule.stored_steps(sim.max_steps) if sim.record_mode else ()
        store_at = store_at if isinstance(store_at, range) else set(store_at)      # O(1) membership
        last_outs = None
        everyone = True                        # every sample still running (none masked yet)
        # closed however the loop ends (a Ctrl-C between two steps too): nothing has been written
        with loop_progress(sim.progress, sim.max_steps, "simulation") as bar:
            for t in range(sim.max_steps):
                if not active.any():
                    break
                if t in store_at:
                    stored[t] = {s: v.copy() for s, v in state.items()}
                state, done, last_outs, extra = self.step(state, fixed, active, everyone=everyone)
                steps += active
                active = active & ~done
                everyone = everyone and not done.any()
                bar.update(1)
        for s in sim.state:
            launch.writes[s][...] = state[s]
        if last_outs is not None:
            for name in launch.out_names:
                if name not in sim.state:
                    launch.writes[name][...] = last_outs[name]
        return dict(steps=steps, stored=stored, initial={s: launch.reads[s] for s in sim.state},
                    fixed=fixed, cells=param_cells(launch))

    def reverse(self, record, ct0, vjps, workspace):
        """Every gradient of ``record``, pass by pass of ``sim.pass_size`` samples (the memory
        budget's), the Param sums of the passes combined with the canonical tree."""
        sim = self.sim
        n = sim.n
        size = sim.pass_size
        bounds = [(0, n)] if size >= n else chunk_bounds(n, size)
        state_grads = {s: np.zeros_like(sim.launch.reads[s]) for s in sim.state}
        fixed_grads = {}
        param_partials = {p: [] for p in sim.launch.kernel.params}
        stats = {"chunks": len(bounds), "recomputed": 0, "peak": 0}
        for s0, e0 in bounds:
            sl = slice(s0, e0)
            res = self.reverse_slice(record, sl, {k: v[sl] for k, v in ct0.items()}, vjps, stats,
                                      workspace)
            for s, g in res["state"].items():
                state_grads[s][sl] = g
            for k, g in res["fixed"].items():
                fixed_grads.setdefault(k, np.zeros((n,) + g.shape[1:], g.dtype))[sl] = g
            for p, acc in res["params"].items():
                if len(bounds) == 1:
                    param_partials[p].append(tree_sum(acc))
                else:
                    pad = size - acc.shape[0]
                    if pad:
                        acc = np.concatenate([acc, np.zeros((pad,) + acc.shape[1:], acc.dtype)])
                    param_partials[p].append(tree_sum(acc))
        values = {}
        for s, g in state_grads.items():
            values[s] = g
        for k, g in fixed_grads.items():
            values[k] = g
        for p, parts in param_partials.items():
            values[p] = parts[0] if len(parts) == 1 else combine(parts, size, n)
        return values, stats

    def reverse_slice(self, record, sl, ct0, vjps, stats, workspace):
        """The reverse for the samples in ``sl``: windows from the last, adjoints stepped back.
        While every sample of the slice is still running (``t`` below the fewest steps) no mask
        is applied (selecting every row changes no value); missing cotangents are read-only
        zeros and the per-sample Param cotangents are summed into ``workspace`` buffers, so a
        step allocates only what its vjp program returns."""
        sim = self.sim
        launch = sim.launch
        kern = launch.kernel
        m = sl.stop - sl.start
        steps = record.steps[sl]
        T = int(steps.max(initial=0))
        fixed = {k: v[sl] for k, v in record.fixed.items()}
        cells = {(None, p): record.cells[p] for p in kern.params}
        node = _FakeNode()
        ct_state = {s: ct0.get(s, np.zeros_like(record.initial[s][sl])) for s in sim.state}
        prm_acc = {p: None for p in kern.params}
        fixed_acc = {}
        float_fixed = [nm for nm in kern.inputs if nm not in sim.state and fixed[nm].dtype.kind == "f"]

        fewest = self.fewest_steps(steps)
        keep = _Keep()

        def back_step(t, cur, extra):
            active = keep if t < fewest else _Mask(t < steps)
            ins = [cur[nm] if nm in sim.state else extra.get(nm, fixed.get(nm)) for nm in kern.inputs]
            cts = []
            for name, var in zip(launch.out_names, launch.program.outputs):
                if name in sim.state:
                    cts.append(active.where(ct_state[name], 0))
                else:
                    cts.append(np.zeros((m,) + var.shape, var.dtype) if sim.nodes else
                               workspace.zeros((m,) + var.shape, var.dtype))
            ins_ct, prm = reverse_launch(launch, node, ins, cells, cts, m)
            for s in sim.state:
                g = ins_ct.get(s)
                if g is not None:
                    ct_state[s] = active.where(g, ct_state[s])
            node_cts = {}
            for nm in kern.inputs:
                if nm in sim.state or nm not in ins_ct:
                    continue
                g = active.where(ins_ct[nm], 0)
                if nm in extra:
                    node_cts[nm] = g
                elif nm in float_fixed:
                    fixed_acc[nm] = g if nm not in fixed_acc else fixed_acc[nm] + g
            if node_cts:
                self.node_vjps(vjps, cur, fixed, extra, node_cts, ct_state, fixed_acc,
                                active.mask(m))
            for p, g in prm.items():
                if prm_acc[p] is None:          # the sum starts as the first cotangent, masked
                    prm_acc[p] = workspace.buffer(("param", p), g.shape, g.dtype)
                    active.where(g, 0, out=prm_acc[p])
                else:                           # acc + g, in place: the same additions
                    active.add(prm_acc[p], g)

        self.follow_plan(sim.schedule.plan(sim.max_steps, T), record.stored, sl, T, fixed, steps,
                          back_step, stats)
        params = {p: (prm_acc[p] if prm_acc[p] is not None else
                      np.zeros((m,) + np.shape(record.cells[p]), np.float64))
                  for p in kern.params}
        return {"state": ct_state, "fixed": fixed_acc, "params": params}

    def follow_plan(self, plan, stored, sl, last, fixed, steps, back_step, stats, advance=None,
                     node_values=None):
        """Carry out a schedule's reverse plan (see schedules.py): recompute states from the
        Record's ``stored`` ones or from recomputed ones, reverse each step on its state, and free
        a recomputed state once its step is reversed.  Counts the states it needs at once the way
        the schedule predicts them: a stored state until its step is reversed.  ``advance`` and
        ``node_values``: how a step is recomputed and the model nodes run (on the device: see
        ``_reverse_stepped_on_device``), else on the host."""
        sim = self.sim
        advance = advance or (lambda cur, u, everyone: self.advance(cur, fixed, steps, u, everyone))
        node_values = node_values or (lambda cur: self.node_values(cur, fixed))
        made = {}
        fewest = self.fewest_steps(steps)
        alive = sum(1 for t in stored if t < last)

        def state(t):
            return made[t] if t in made else {s: device_rows(stored[t][s], sl) for s in sim.state}

        peak = alive
        with loop_progress(sim.progress, last, "reverse steps") as bar:      # closed by a Ctrl-C too
            for action in plan:
                if action[0] == "recompute":
                    _, c, t = action
                    peak = max(peak, alive + len(made) + 1)
                    cur = state(c)
                    for u in range(c, t):
                        cur = advance(cur, u, u < fewest)
                        stats["recomputed"] += 1
                    made[t] = cur
                else:
                    t = action[1]
                    if t in made:
                        cur = made.pop(t)
                    else:
                        cur = state(t)
                        alive -= t in stored
                    back_step(t, cur, node_values(cur))
                    bar.update(1)
        stats["peak"] = max(stats["peak"], peak)

    def advance(self, cur, fixed, steps, t, everyone=False):
        active = t < steps
        new, _, _, _ = self.step(cur, fixed, active, everyone=everyone)
        return new

    def fewest_steps(self, steps):
        """The steps below which every sample of ``steps`` is running, so nothing is masked (0
        with a model node: its vjp adds into the state cotangents in place, which must then be
        fresh arrays)."""
        sim = self.sim
        return 0 if sim.nodes or not steps.size else int(steps.min())

    def node_values(self, cur, fixed):
        sim = self.sim
        extra = {}
        for node in sim.nodes:
            reads = {k: (cur[k] if k in cur else fixed.get(k, v)) for k, v in node.reads.items()}
            for k, v in node.run(reads).items():
                extra[k] = np.asarray(v)
        return extra

    def node_vjps(self, vjps, cur, fixed, extra, node_cts, ct_state, fixed_acc, active):
        """Call each model node's vjp on the samples still running at this step."""
        sim = self.sim
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            return
        for node in sim.nodes:
            cts = {k: node_cts[k][idx] for k in node.writes if k in node_cts}
            if not cts:
                continue
            primals = {k: (cur[k] if k in cur else fixed.get(k, v))[idx] for k, v in node.reads.items()}
            try:
                got = vjps[node.name](primals, cts)
            except Exception as err:     # noqa: BLE001 - the user's vjp: named
                raise user_error(err, f"the vjp of opaque node {node.name!r}")
            for k, g in user_vjp_gradients(node, got, node.reads, primals).items():
                if k in ct_state:
                    ct_state[k][idx] += g
                elif k in fixed and fixed[k].dtype.kind == "f":
                    full = np.zeros_like(fixed[k])
                    full[idx] = g
                    fixed_acc[k] = full if k not in fixed_acc else fixed_acc[k] + full


class _FakeNode:
    name = None


def _col(mask, like):
    return mask.reshape((-1,) + (1,) * (np.ndim(like) - 1))


class _Keep:
    """The mask of a reverse step at which every sample is running: selects every row, so
    nothing is masked (the same values, without a pass over them)."""

    @staticmethod
    def where(value, other, out=None):
        if out is None:
            return value
        np.copyto(out, value)
        return out

    @staticmethod
    def add(acc, value):
        np.add(acc, value, out=acc)

    @staticmethod
    def mask(m):
        return np.ones(m, dtype=bool)


class _Mask:
    """The samples still running at a reverse step (``t < steps``): the others' cotangents are
    held (state) or zero (everything else)."""

    def __init__(self, active):
        self.active = active

    def where(self, value, other, out=None):
        got = np.where(_col(self.active, value), value, other)
        if out is None:
            return got
        np.copyto(out, got)
        return out

    def add(self, acc, value):
        np.add(acc, self.where(value, 0), out=acc)

    def mask(self, m):
        return self.active


def loop_progress(flag, total, desc):
    """A progress bar for a long loop: shown in a notebook (or when ``progress=True``), silent
    elsewhere and when ``progress=False``."""
    return progress_bar(total=total, desc=desc, enabled=flag)


