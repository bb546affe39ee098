"""Long runs: a step kernel iterated per sample, and its checkpointed reverse.

``simulation(step, max_steps=..., record=True, window=..., memory_budget=..., **planes)``
runs ``step`` (a kernel updating its state planes in place, e.g. ``theta``
bound as input and output) until every sample has returned
``terminated=True`` or ``max_steps`` steps (at most ``MAX_STEPS``, 2**40)
have run; each sample stops at its own step (``record.steps``).
``until_done([node, step], ...)`` also runs
a user model node (``vkml.graph.opaque``) before the kernel on every step.

A recorded run keeps the state at the start of every ``window`` steps.  The
reverse works one window at a time from the last: it recomputes the
window's states from its checkpoint and steps the adjoint back through
them, so a sample holds about ``ceil(max_steps / window) + window`` states
(default window ``clamp(ceil(sqrt(max_steps)), 16, 1024)``; ``"full"`` keeps
every state and recomputes nothing; ``"binomial"`` keeps the initial state, the
state before the last step and ``snapshots`` checkpoints placed by Griewank's
binomial rule (Revolve), recomputing the fewest steps any schedule holding
those states can).  Each choice is a schedule object (``sim.schedule``, see
``graph/schedules.py``) that says which states the run stores, how the reverse
rebuilds the others, and predicts the reverse's ``recomputed_steps`` and
``peak_states``.

``memory_budget`` (bytes) caps what the reverse holds: when the batch does
not fit, it runs in passes of ``256 * 2**q`` aligned samples, the largest
that fits, and combines the passes' Param sums with the canonical tree --
they are subtrees of the one-pass tree, so the bits do not depend on the
budget.  Its default is half the free memory where the Record lives: the
GPU's on the cuda backend (see below), else half the available host RAM.

On the cuda backend a simulation the per-sample loops cover (one kernel, the
window schedule) lives in device memory: its planes are copied to the GPU
once, when the simulation is made (a NumPy array; a device array --
anything with ``__cuda_array_interface__``, such as a CuPy array -- is used
as it is, without a copy), and ``sim.planes[name]`` is the device plane (read
it on the host explicitly: ``.numpy()`` or ``np.asarray``; the NumPy array
passed in is not updated).  ``run()`` and the reverse are one kernel each
(``backends/cuda_loops.py``); the Record's checkpoints, step counts and the
gradients are device arrays (Param gradients are summed on the GPU with the
canonical tree and come back as NumPy values); no plane crosses PCIe.  A
budget's passes read their samples of every plane through views (pointer
offsets, no copy) and of the checkpoints through one device-to-device copy
per window.

A simulation stepped from the host (model nodes, the ``"full"`` and
``"binomial"`` schedules, a step the loops do not cover) lives in device
memory as well (``graph/simulation_device.py``): each step is one program on
device arrays in and out -- the state, the per-sample step counts and
"stopped" flags, the checkpoints (a stored state is the step's own output,
never written again: only the initial state is copied, on the device) and,
in the reverse, the adjoints and the per-sample Param sums.  A step sends its
pointer table and its small arguments (Param values, the step's index) and
reads back its status words and, forward, one word saying whether any sample
still runs; the reverse first finds the longest and fewest steps on the
device (two words).  A model node runs user Python on host values: the planes
it reads are copied to the host and those it writes to the device on every
step, and in the reverse the adjoints its vjp reads and adds to, explicitly.
Device arrays are taken as planes here too, and a failing run writes no
plane.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from ..backends import ExecutionFailure
from ..backends.cuda_loops import rows, window as checkpoint_window
from ..errors import (ArgumentError, BackendError, Busy, ExecutionError, RecordError,
    RefusedError, ShapeError, boundary)
from .diff import Gradients, Report, Reverse, reverse_launch, user_vjp_gradients
from .execute import uses_table
from .. import backends
from ..ir import program_from_dag
from ..progress import progress as progress_bar
from ..transforms import vjp_program
from ..transforms.ad import derived
from ..transforms.control import reorder_inputs
from ..backends.base import threads
from .execute import (changed_plane_message, execution_error, plane_signature, refuse_other_backend,
                      run_named, user_error)
from .nodes import Opaque
from .kernel import Launch
from .reversible import Reversible
# (the schedules, binomial_cost, default_window and MAX_STEPS are re-exported from here)
from .schedules import Binomial, Full, Window, binomial_cost, default_window, schedule_for  # noqa: F401
from .simulation_device import DeviceSteps, device_rows
from .simulation_checks import MAX_STEPS, check_arguments, check_seeds, check_wrt, \
    seed_cotangents  # noqa: F401
from .treesum import MIN_PASS, chunk_bounds, combine, pass_size, tree_sum


def available_memory(on_device=False) -> int:
    """The default memory budget: half the free memory where the Record lives -- the device's,
    ``on_device`` (a simulation that keeps its planes and Record in GPU memory) -- else half the
    available host RAM, and on a GPU backend at most half its free device memory (where each
    step computes)."""
    device = getattr(backends.current(), "free_memory", None)
    if on_device:
        return device() // 2
    host = 8 << 30
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return min(host, device()) // 2 if device is not None else host // 2


# -- the simulation ---------------------------------------------------------------------------

class SimulationRecord:
    """What a recorded simulation run keeps: the states its schedule stores, per-sample
    ``steps``, Param cells.

    >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
    >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
    >>> _ = sim.run()
    >>> rec = sim.record
    >>> rec.steps, rec.live
    (array([10, 10]), False)
    """

    def __init__(self, sim, generation, steps, stored, initial, fixed, cells):
        self.simulation = sim
        self.graph = None
        self.generation = generation
        #: the steps each sample took: a NumPy array, or a device array on the GPU (see ``steps``)
        self.steps_plane = steps
        self._host_steps = steps if isinstance(steps, np.ndarray) else None
        #: on the GPU: the most steps a sample of each aligned block of MIN_PASS samples took
        #: (what the loops read back instead of every count)
        self.block_longest = None
        #: step -> {state plane name: the state at the start of that step}, for the steps the
        #: schedule stores (``schedule.stored_steps``)
        self.stored = stored
        self.initial = initial
        self.fixed = fixed
        self.cells = cells
        #: the compiled tier's checkpoints, one [windows, n, ...] array per state plane
        self.checkpoint_arrays = None
        self.reversed = False
        # the checkpoints and Param values are the Record's own copies, but ``fixed`` (the
        # per-sample inputs the step reads and never updates) are the caller's planes: only
        # keep() copies them, and only a kept Record may be reversed after a later run
        self.kept = False
        #: how many reverses read it right now (counted under its simulation's lock)
        self.readers = 0

    @property
    def steps(self):
        """The steps each sample took, a NumPy array (on the GPU: copied to the host on the first
        read, once -- a Record's counts never change).

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> sim.run().record.steps
        array([10, 10])
        """
        if self._host_steps is None:
            self._host_steps = np.asarray(self.steps_plane)
        return self._host_steps

    def longest(self, start=0, stop=None) -> int:
        """The most steps a sample of ``[start, stop)`` took (on the GPU, from the per-block
        counts: ``start`` and ``stop`` are then whole blocks of MIN_PASS samples, or the end).

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0).run().record.longest()
        10
        """
        if self.block_longest is None:
            return int(self.steps[start:stop].max(initial=0))
        stop = self.steps_plane.shape[0] if stop is None else stop
        return int(self.block_longest[start // MIN_PASS:-(-stop // MIN_PASS)].max(initial=0))

    @property
    def live(self):
        """Always False: a simulation's Record never holds up its next run (it owns its checkpoints); the name is here so a simulation's Record reads like a Graph's.

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> sim.record.live
        False
        """
        return False

    @property
    def checkpoints(self):
        """The stored states by step, where the schedule recomputes the others (else empty).

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, window=4, x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> sorted(sim.record.checkpoints)         # a checkpoint every 4 steps
        [0, 4, 8]
        >>> sim.record.checkpoints[0]["x"]         # the state at the start of step 0
        array([1. , 0.5])
        """
        return {} if self.simulation.schedule.keeps_every_state else self.stored

    @property
    def states_all(self):
        """Every state by step, where the schedule stores them all (else empty).

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=3, record=True, window="full", x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> sorted(sim.record.states_all), sim.record.checkpoints
        ([0, 1, 2], {})
        >>> sim.record.states_all[1]["v"]          # the state at the start of step 1
        array([-0.1 , -0.05])
        """
        return self.stored if self.simulation.schedule.keeps_every_state else {}

    @property
    def nbytes(self) -> int:
        """Bytes of the checkpoints and copies this Record holds.

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> sim.record.nbytes > 0
        True
        """
        return sum(a.nbytes for c in self.stored.values() for a in c.values()) + \
            self.steps_plane.nbytes

    def keep(self):
        """Copy the per-sample input planes the reverse reads (the rest already is the Record's
        own); the Record then stays valid however often the simulation runs again.

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> rec = sim.record.keep()
        >>> _ = sim.run()
        >>> vkml.diff.reverse(rec, {"x": np.ones(2)})["k"].round(4)
        np.float64(-0.6129)
        """
        if not self.kept:
            if self.generation != self.simulation.generation:
                raise RecordError(f"keep: this Record is of generation {self.generation} but the "
                                  f"simulation is at generation {self.simulation.generation}; keep() "
                                  "right after run()")
            sim = self.simulation
            sim.check_planes("keep", [nm for nm in self.fixed if nm in sim._planes])
            self.fixed = {k: v.copy() for k, v in self.fixed.items()}   # on the GPU: on the device
            self.kept = True
        return self

    def __repr__(self):
        return (f"<vkml simulation Record generation {self.generation}: {self.longest()} "
                f"steps at most, {len(self.stored)} stored states, {self.nbytes:,} bytes>")


class Simulation(Reversible):
    """A step kernel run per sample until it terminates (see the module docstring).

    >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
    >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
    >>> isinstance(sim, vkml.graph.Simulation), sim.max_steps
    (True, 10)
    """

    def __init__(self, step, *, max_steps, record=False, window=None, memory_budget=None,
                 snapshots=None, steps_per_launch=1, events=None, progress=None, **bindings):
        backend = backends.current()
        launch, nodes, state, window = check_arguments(
            step, max_steps=max_steps, record=record, window=window, memory_budget=memory_budget,
            snapshots=snapshots, steps_per_launch=steps_per_launch, events=events, progress=progress,
            bindings=bindings)
        self.launch, self.nodes, self.state, self.window = launch, nodes, state, window
        self.terminates = "terminated" in launch.out_names
        self.max_steps = max_steps
        self.record_mode = bool(record)
        self.n = launch.n
        self.state_bytes = sum(_row_bytes(launch.reads[s]) for s in self.state) + \
            sum(_row_bytes(p) for node in nodes for p in node.writes.values())
        #: which states the run stores and how the reverse rebuilds the others
        self.schedule = schedule_for(window, max_steps, snapshots)
        #: whether the planes, the Record and the gradients live in device memory (see the module
        #: docstring): on a backend that keeps planes there
        self.on_device = backend.keeps_planes_on_device
        #: on the device: whether the per-sample loops run it (else it is stepped from the host,
        #: one program on device arrays per step: graph/simulation_device.py)
        self.loops_on_device = self.on_device and self._compiled_loops() is not None
        self._device = self._device_planes(backend) if self.on_device else None
        self._stepper = DeviceSteps(self, backend) if self.on_device else None
        self._backend = backend
        # what the memory budget plans for per sample: the stored states and the reverse's
        self.per_sample_bytes = self.schedule.budget_states(max_steps) * self.state_bytes
        self.memory_budget = memory_budget if memory_budget is not None else \
            available_memory(self.on_device)
        if record:
            self.pass_size = pass_size(self.n, self.per_sample_bytes, self.memory_budget, "simulation")
        #: what every run and reverse checks the planes against (see check_planes)
        self._planes = {name: plane for op in [launch] + nodes
                        for name, plane in list(op.reads.items()) + list(op.writes.items())}
        self._signatures = {name: plane_signature(p) for name, p in self._planes.items()}
        self.generation = 0
        self._record = None
        self.progress = progress
        self._lock = threading.Lock()

    def _device_planes(self, backend):
        """Every plane of the step in device memory, by name: the device arrays bound as they are,
        each NumPy plane copied once (one copy for a plane bound to several names).  A plane the
        step writes must be writeable: refused before anything is copied."""
        launch = self.launch
        for name, plane in launch.writes.items():
            if getattr(plane, "readonly", False) or not plane.flags.writeable:
                raise ArgumentError(f"simulation: plane {name!r} is read-only, but the step writes "
                                    "it; bind a writeable array")
        bound = [item for op in [launch] + self.nodes
                 for item in list(op.reads.items()) + list(op.writes.items())]
        copies = {}
        for _, plane in bound:
            if id(plane) not in copies:
                copies[id(plane)] = backend.to_plane(plane)
        return {name: copies[id(plane)] for name, plane in bound}

    @property
    def planes(self) -> dict:
        """The step's planes by name: the arrays given (updated in place by ``run()``), or on the
        cuda backend the device planes the simulation keeps (see the module docstring).

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, x=x, v=v, k=1.0)
        >>> sim.run().planes["x"] is x, np.asarray(sim.planes["x"]).round(4)
        (True, array([0.5708, 0.2854]))
        """
        return dict(self._device) if self.on_device else dict(self._planes)

    # -- forward ----------------------------------------------------------------------------
    @property
    def record(self):
        """The :class:`SimulationRecord` of the latest recorded run (None before it).

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> sim.record is None
        True
        >>> _ = sim.run()
        >>> sim.record.steps
        array([10, 10])
        """
        return self._record

    def reset(self):
        """Forget the last run's record (the planes are yours to reset).

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> _ = sim.reset()
        >>> sim.record is None
        True
        """
        self._record = None
        return self

    def check_planes(self, where, names=None):
        """Refuse to run on planes resized, reshaped or made read-only since the simulation was
        made: its programs were traced (and compiled) for the planes as they were then.

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> sim.check_planes("run")
        >>> v.resize(3, refcheck=False)
        >>> _ = sim.run()
        Traceback (most recent call last):
            ...
        vkml.errors.ShapeError: simulation.run: plane 'v' changed since the simulation was made: its shape was (2,), now (3,); make the simulation again (vkml.simulation(...)) after replacing/resizing plane 'v' (or write into the plane in place: plane[...] = values)

        On the GPU the simulation runs on its own device planes: only the backend is checked.
        """
        if self.on_device:
            refuse_other_backend(self._backend, BackendError,
                                 f"{where}: this simulation keeps its planes on the {{owner}} "
                                 "backend, but the current backend is {current}; "
                                 "vkml.set_backend('{owner}') first (or make it again here)")
            return
        for name in names if names is not None else self._planes:
            plane = self._planes[name]
            now = plane_signature(plane)
            if now != self._signatures[name]:
                raise ShapeError(changed_plane_message(where, name, self._signatures[name], now,
                                                       "the simulation was made",
                                                       "make the simulation again (vkml.simulation(...))"))

    def _cells(self):
        return [self.launch.params[p] for p in self.launch.kernel.params]

    def _step(self, state, fixed, active, node_reads=None, everyone=False):
        """One step for all samples; inactive samples keep their state.  ``everyone``: every
        sample is active (nothing to mask: the new state is the step's output as it is)."""
        launch = self.launch
        kern = launch.kernel
        extra = {}
        for node in self.nodes:
            reads = {k: (state[k] if k in state else v) for k, v in node.reads.items()}
            for k, v in node.run(reads).items():
                extra[k] = np.asarray(v)
        ins = [state[n] if n in state else extra.get(n, fixed[n]) for n in kern.inputs]
        flags = [True] * len(kern.inputs) + [False] * len(kern.params)
        outs = dict(zip(launch.out_names, run_named(launch.batched(), len(active), ins + self._cells(),
                                                    flags, f"simulation step {kern.name}")))
        new = {}
        for s in self.state:
            mask = active.reshape((-1,) + (1,) * (outs[s].ndim - 1))
            new[s] = outs[s] if everyone else np.where(mask, outs[s], state[s])
        done = outs["terminated"] & active if self.terminates else np.zeros_like(active)
        return new, done, outs, extra

    @boundary
    def run(self):
        """Run until every sample has terminated or ``max_steps`` steps; record if record=True.

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> sim.record.steps
        array([10, 10])
        """
        if self._readers_busy():
            raise Busy("simulation.run: a reverse is reading the last Record; wait for it to return")
        self.check_planes("simulation.run")
        threads()                              # a bad VKML_THREADS is refused before anything runs
        if self.on_device:
            loops = self._compiled_loops()
            return self._run_on_device(loops) if loops is not None else self._run_stepped_on_device()
        # all or nothing: the steps run on private copies of the state, written into the planes
        # (and the generation and Record changed) only once every step has succeeded
        launch = self.launch
        n = self.n
        state = {s: launch.reads[s].copy() for s in self.state}
        fixed = {nm: launch.reads[nm] for nm in launch.kernel.inputs if nm not in self.state}
        for node in self.nodes:
            for k, p in node.writes.items():
                fixed.setdefault(k, p)
        loops = self._compiled_loops()
        if loops is not None:
            return self._run_compiled(loops, fixed)
        active = np.ones(n, dtype=bool)
        steps = np.zeros(n, dtype=np.int64)
        stored = {}
        store_at = self.schedule.stored_steps(self.max_steps) if self.record_mode else ()
        store_at = store_at if isinstance(store_at, range) else set(store_at)      # O(1) membership
        last_outs = None
        everyone = True                        # every sample still running (none masked yet)
        # closed however the loop ends (a Ctrl-C between two steps too): nothing has been written
        with _progress(self.progress, self.max_steps, "simulation") as bar:
            for t in range(self.max_steps):
                if not active.any():
                    break
                if t in store_at:
                    stored[t] = {s: v.copy() for s, v in state.items()}
                state, done, last_outs, extra = self._step(state, fixed, active, everyone=everyone)
                steps += active
                active = active & ~done
                everyone = everyone and not done.any()
                bar.update(1)
        for s in self.state:
            launch.writes[s][...] = state[s]
        if last_outs is not None:
            for name in launch.out_names:
                if name not in self.state:
                    launch.writes[name][...] = last_outs[name]
        self.generation += 1
        if self.record_mode:
            self._record = SimulationRecord(
                self, self.generation, steps, stored,
                {s: launch.reads[s] for s in self.state}, fixed,
                {p: np.array(launch.params[p], copy=True) for p in launch.kernel.params})
        return self

    # -- the compiled path: every step of every sample in one call --------------------------------
    def _loop_window(self):
        return self.schedule.loop_window if self.record_mode else self.max_steps

    def _compiled_loops(self):
        """The backend's compiled per-sample loops for this kernel, when it has them (the cpu tier)
        and the run needs nothing they lack (model nodes, 'full'/'binomial' schedules)."""
        backend = backends.current()
        window = self._loop_window()
        if self.nodes or window is None or not hasattr(backend, "sample_loops"):
            return None
        launch = self.launch
        kern = launch.kernel
        fixed = [nm for nm in kern.inputs if nm not in self.state]
        order = [kern.inputs.index(nm) for nm in self.state + fixed] + \
            [len(kern.inputs) + j for j in range(len(kern.params))]
        step = reorder_inputs(launch.program, order)
        wrt = [i for i, v in enumerate(step.inputs) if v.dtype.kind == "f"]

        def make_vjp():
            vp = vjp_program(step, wrt)
            return program_from_dag(list(vp.inputs), list(vp.outputs[len(step.outputs):]))

        vjp = derived("simulation-vjp", step, wrt, make_vjp)
        spec = (("n_state", len(self.state)), ("n_fixed", len(fixed)),
                ("n_params", len(kern.params)), ("out_names", tuple(launch.out_names)),
                ("state_names", tuple(self.state)),
                ("term_index", launch.out_names.index("terminated") if self.terminates else None),
                ("wrt", tuple(wrt)), ("window", window))
        loops = backend.sample_loops(step, vjp, spec)
        if loops is not None:
            self._fixed_names = fixed
        return loops

    def _run_compiled(self, loops, fixed):
        launch = self.launch
        kern = launch.kernel
        planes = [launch.writes[nm] for nm in launch.out_names if nm not in self.state]
        others = [p.copy() for p in planes]       # written by the loops; committed on success
        try:
            finals, steps, cks = loops.forward(
                [launch.reads[s] for s in self.state], [fixed[nm] for nm in self._fixed_names], others,
                [launch.params[p] for p in kern.params], self.max_steps, threads())
        except ExecutionFailure as failure:
            raise execution_error(failure, _eqns(loops), f"simulation step {kern.name}") \
                from failure.error
        except ExecutionError as error:            # the compiled loops name the sample, not the node
            raise ExecutionError(f"simulation step {kern.name}: {error}") from None
        for plane, value in zip(planes, others):
            plane[...] = value
        for s, value in zip(self.state, finals):
            launch.writes[s][...] = value
        self.generation += 1
        if self.record_mode:
            window = self.schedule.loop_window
            last = int(steps.max(initial=0))
            checkpoints = {c * window: {s: ck[c] for s, ck in zip(self.state, cks)}
                           for c in range(cks[0].shape[0]) if c * window < max(last, 1)}
            self._record = SimulationRecord(
                self, self.generation, steps, checkpoints,
                {s: launch.reads[s] for s in self.state},
                {nm: fixed[nm] for nm in fixed},
                {p: np.array(launch.params[p], copy=True) for p in kern.params})
            self._record.checkpoint_arrays = dict(zip(self.state, cks))
        return self

    def _reverse_compiled(self, loops, record, sl, ct0, stats):
        kern = self.launch.kernel
        m = sl.stop - sl.start
        steps = record.steps[sl]
        cks = [record.checkpoint_arrays[s][:, sl] for s in self.state]
        fixed = [record.fixed[nm][sl] for nm in self._fixed_names]
        params = [record.cells[p] for p in kern.params]
        seeds = [ct0.get(s, np.zeros_like(record.initial[s][sl])) for s in self.state]
        try:
            outs = loops.reverse(cks, steps, fixed, params, seeds, threads())
        except ExecutionFailure as failure:
            raise execution_error(failure, _eqns(loops), f"the vjp of simulation step {kern.name}") \
                from failure.error
        except ExecutionError as error:
            raise ExecutionError(f"the vjp of simulation step {kern.name}: {error}") from None
        names = self.state + self._fixed_names + list(kern.params)
        res = {"state": {}, "fixed": {}, "params": {}}
        for pos, g in zip(loops.wrt, outs):
            name = names[pos]
            key = "state" if pos < len(self.state) else \
                "fixed" if pos < len(self.state) + len(self._fixed_names) else "params"
            res[key][name] = g
        for s in self.state:
            res["state"].setdefault(s, np.zeros_like(record.initial[s][sl]))
        for p in kern.params:
            res["params"].setdefault(p, np.zeros((m,) + np.shape(record.cells[p]), np.float64))
        # the compiled loops follow the window schedule for the steps the samples took
        T = int(steps.max(initial=0))
        stats["recomputed"] += self.schedule.predicted_recomputed_steps(T)
        stats["peak"] = max(stats["peak"], self.schedule.predicted_peak_states(T))
        return res

    # -- on the GPU: device planes in, device arrays out (see the module docstring) -------------------
    def _run_on_device(self, loops):
        """One forward kernel over the device planes; the Record keeps its outputs where they are."""
        launch, kern, planes = self.launch, self.launch.kernel, self._device
        try:
            steps, cks, block_longest = loops.forward(
                [planes[s] for s in self.state], [planes[nm] for nm in self._fixed_names],
                [planes[nm] for nm in launch.out_names if nm not in self.state],
                [launch.params[p] for p in kern.params], self.max_steps, MIN_PASS)
        except ExecutionError as error:            # the compiled loops name the sample, not the node
            raise ExecutionError(f"simulation step {kern.name}: {error}") from None
        self.generation += 1
        if self.record_mode:
            window = self.schedule.loop_window
            last = int(block_longest.max(initial=0))
            stored = {c * window: {s: checkpoint_window(ck, c) for s, ck in zip(self.state, cks)}
                      for c in range(cks[0].shape[0]) if c * window < max(last, 1)}
            record = SimulationRecord(
                self, self.generation, steps, stored, {s: planes[s] for s in self.state},
                {nm: planes[nm] for nm in self._fixed_names},
                {p: np.array(launch.params[p], copy=True) for p in kern.params})
            record.checkpoint_arrays = dict(zip(self.state, cks))
            record.block_longest = block_longest
            self._record = record
        return self

    def _reverse_on_device(self, record, ct0):
        """The reverse kernel once per pass, on views of the pass's samples; per-sample gradients
        written into device planes, Param gradients summed on the device (canonical tree)."""
        loops = self._compiled_loops()
        backend = backends.current()
        kern = self.launch.kernel
        n, size = self.n, self.pass_size
        bounds = [(0, n)] if size >= n else chunk_bounds(n, size)
        names = self.state + self._fixed_names + list(kern.params)
        ins = loops.step.inputs
        grads = [backend.empty_plane((n,) + ins[pos].shape, ins[pos].dtype) for pos in loops.wrt]
        seeds = [ct0[s] if s in ct0 else
                 backend.zeros_plane(record.initial[s].shape, record.initial[s].dtype)
                 for s in self.state]
        cks = [record.checkpoint_arrays[s] for s in self.state]
        first_param = len(self.state) + len(self._fixed_names)
        partials = {}
        stats = {"chunks": len(bounds), "recomputed": 0, "peak": 0}
        for s0, e0 in bounds:
            loops.reverse(loops.checkpoint_rows(cks, s0, e0), rows(record.steps_plane, s0, e0),
                          [rows(record.fixed[nm], s0, e0) for nm in self._fixed_names],
                          [record.cells[p] for p in kern.params], [rows(sd, s0, e0) for sd in seeds],
                          [rows(g, s0, e0) for g in grads])
            for pos, g in zip(loops.wrt, grads):
                if pos >= first_param:
                    partials.setdefault(names[pos], []).append(
                        _pass_sum(backend, rows(g, s0, e0), size if len(bounds) > 1 else e0 - s0))
            # the loops follow the window schedule for the steps the pass's samples took
            last = record.longest(s0, e0)
            stats["recomputed"] += self.schedule.predicted_recomputed_steps(last)
            stats["peak"] = max(stats["peak"], self.schedule.predicted_peak_states(last))
        values = {names[pos]: g for pos, g in zip(loops.wrt, grads) if pos < first_param}
        for s in self.state:
            if s not in values:
                values[s] = backend.zeros_plane(record.initial[s].shape, record.initial[s].dtype)
        for p in kern.params:
            values[p] = combine(partials[p], size, n) if p in partials else \
                np.zeros(np.shape(record.cells[p]), np.float64)
        return values, stats

    # -- on the GPU, stepped from the host: one program on device arrays per step ----------------
    def _run_stepped_on_device(self):
        """The host-stepped run on the device planes (``simulation_device.py``): every step one
        submission on device arrays; the planes are written once every step has succeeded."""
        launch, backend, planes = self.launch, self._backend, self._device
        n = self.n
        state = {s: planes[s] for s in self.state}
        fixed = {nm: planes[nm] for nm in launch.kernel.inputs if nm not in self.state}
        for node in self.nodes:
            for k in node.writes:
                fixed.setdefault(k, planes[k])
        stopped = backend.zeros_plane((n,), np.bool_)
        steps = backend.zeros_plane((n,), np.int64)
        stored, rest = {}, None
        store_at = self.schedule.stored_steps(self.max_steps) if self.record_mode else ()
        store_at = store_at if isinstance(store_at, range) else set(store_at)
        running = n > 0
        with _progress(self.progress, self.max_steps, "simulation") as bar:
            for t in range(self.max_steps):
                if not running:
                    break
                if t in store_at:         # a step's output is never written again: kept as it is
                    stored[t] = {s: backend.copy_plane(v) if v is planes[s] else v
                                 for s, v in state.items()}
                extra = self._node_values_on_device(state, fixed)
                state, rest, stopped, steps, flag = self._stepper.step(
                    state, dict(fixed, **extra), stopped, steps)
                running = flag is not False
                bar.update(1)
        for s in self.state:
            if state[s] is not planes[s]:
                backend.copy_plane_into(planes[s], state[s])
        for name, value in (rest or {}).items():
            backend.copy_plane_into(planes[name], value)
        self.generation += 1
        if self.record_mode:
            self._record = SimulationRecord(
                self, self.generation, steps, stored, {s: planes[s] for s in self.state}, fixed,
                {p: np.array(launch.params[p], copy=True) for p in launch.kernel.params})
        return self

    def _node_values_on_device(self, cur, fixed):
        """The model nodes' outputs as device arrays: a node runs Python on host values, so its
        reads are copied to the host and its writes to the device (explicit, every step)."""
        extra = {}
        for node in self.nodes:
            reads = {k: np.asarray(cur[k] if k in cur else fixed.get(k, self._device[k]))
                     for k in node.reads}
            for k, v in node.run(reads).items():
                extra[k] = self._backend.to_plane(np.asarray(v, dtype=node.writes[k].dtype))
        return extra

    def _reverse_stepped_on_device(self, record, ct0, vjps):
        """The host-stepped reverse on device arrays, pass by pass (as ``_reverse_passes``):
        per-sample gradients stay device arrays, Param gradients are summed on the device."""
        backend = self._backend
        n, size = self.n, self.pass_size
        bounds = [(0, n)] if size >= n else chunk_bounds(n, size)
        stats = {"chunks": len(bounds), "recomputed": 0, "peak": 0}
        parts, partials = [], {}
        for s0, e0 in bounds:
            sl = slice(s0, e0)
            res = self._reverse_slice_on_device(
                record, sl, {k: device_rows(v, sl) for k, v in ct0.items()}, vjps, stats)
            parts.append((sl, res))
            for p, acc in res["params"].items():
                partials.setdefault(p, []).append(
                    _pass_sum(backend, acc, size if len(bounds) > 1 else e0 - s0))
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
        for p in self.launch.kernel.params:
            values[p] = (partials[p][0] if len(bounds) == 1 else combine(partials[p], size, n)) \
                if p in partials else np.zeros(np.shape(record.cells[p]), np.float64)
        return values, stats

    def _reverse_slice_on_device(self, record, sl, ct0, vjps, stats):
        """``_reverse_slice`` on device arrays: each reversed step one submission
        (``DeviceSteps.back_step``), each recomputed step one (``DeviceSteps.advance``)."""
        backend, stepper = self._backend, self._stepper
        steps = device_rows(record.steps_plane, sl)
        T, fewest = stepper.span(steps)
        # a model node's vjp runs on the samples still running at a step: the counts on the host
        # (its values are copied anyway); else only the longest and fewest steps come back
        host_steps = record.steps[sl] if self.nodes else _Span(steps.shape[0], fewest)
        fixed = {k: device_rows(v, sl) for k, v in record.fixed.items()}
        ct_state = {s: ct0[s] if s in ct0 else
                    backend.zeros_plane(device_rows(record.initial[s], sl).shape,
                                        record.initial[s].dtype) for s in self.state}
        acc = [None]
        host_acc = {}                # inputs a model node reads too: summed on the host
        summed_here = stepper.host_summed(sl.stop - sl.start)

        def back_step(t, cur, extra):
            new_ct, acc[0], node_cts = stepper.back_step(cur, dict(fixed, **extra), ct_state,
                                                         steps, t, acc[0])
            ct_state.update(new_ct)
            if node_cts:
                self._node_vjps_on_device(vjps, cur, fixed, extra, node_cts, ct_state, host_acc,
                                          summed_here, t < host_steps)

        self._follow_plan(
            self.schedule.plan(self.max_steps, T), record.stored, sl, T, fixed, host_steps,
            back_step, stats,
            advance=lambda cur, u, everyone: stepper.advance(
                cur, dict(fixed, **self._node_values_on_device(cur, fixed)), steps, u),
            node_values=lambda cur: self._node_values_on_device(cur, fixed))
        got = acc[0] or {}
        params = {p: got[("param", p)] if ("param", p) in got else
                  np.zeros((sl.stop - sl.start,) + np.shape(record.cells[p]), np.float64)
                  for p in self.launch.kernel.params}
        fixed_grads = {nm: g for (kind, nm), g in got.items() if kind == "fixed"}
        fixed_grads.update({nm: backend.to_plane(g) for nm, g in host_acc.items()})
        return {"state": ct_state, "fixed": fixed_grads, "params": params}

    def _node_vjps_on_device(self, vjps, cur, fixed, extra, node_cts, ct_state, host_acc,
                             summed_here, active):
        """The model nodes' vjps (user Python) on host copies: what they read, the adjoints of
        what they wrote and the state adjoints they add to go to the host, and those adjoints
        come back (explicit copies, every reversed step); the inputs they read keep their
        adjoint sums on the host, in the NumPy path's order."""
        for nm in summed_here:
            g = np.asarray(node_cts[nm])
            host_acc[nm] = g if nm not in host_acc else host_acc[nm] + g
        read = {k for node in self.nodes for k in node.reads}
        host = {k: np.array(v) for k, v in ct_state.items() if k in read}     # its own, writeable
        self._node_vjps(vjps, {k: np.asarray(v) for k, v in cur.items() if k in read},
                        {k: np.asarray(v) for k, v in fixed.items() if k in read}, {},
                        {k: np.asarray(v) for k, v in node_cts.items() if k not in summed_here},
                        host, host_acc, active)
        for k, v in host.items():
            ct_state[k] = self._backend.to_plane(v)

    def _readers_busy(self):
        rec = self._record
        return rec is not None and rec.readers > 0

    # -- reverse ------------------------------------------------------------------------------
    def check_reversible(self, vjps):
        """Refuse a reverse this simulation cannot take (a model node without its vjp in ``vjps``), before anything runs.

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> sim.check_reversible(None)
        """
        if not self.record_mode:
            raise ArgumentError("Reverse: the simulation was made without record=True, so it kept "
                                "nothing to reverse; make it with vkml.simulation(..., "
                                "record=True) and run it again")
        for node in self.nodes:
            fn = vjps.get(node.name)
            if fn is None:
                raise RefusedError(f"reverse: node {node.name!r} is an opaque node; vkml cannot know its "
                                   "derivative -- pass vjps={" + repr(node.name) + ": fn} with "
                                   "fn(primals, cotangents) -> {name: gradient}")
            if isinstance(fn, (Opaque, Launch)):
                raise RefusedError(f"reverse: the vjp of node {node.name!r} is a Node; pass a function "
                                   "fn(primals, cotangents) -> {name: gradient}")
        try:
            batch, _ = self.launch.batched_vjp()
        except Exception as err:  # noqa: BLE001 - reported as a refusal naming the kernel
            raise RefusedError(f"reverse: {self.launch.kernel.name} has no vjp ({err})") from err

    def prepare_reverse(self, record, seeds, wrt, strict):
        """Check one reverse call of ``record`` (see ``reversible.py``): it is this simulation's,
        of its latest run or kept, its input planes unchanged, the seeds and ``wrt`` known; the
        cotangents of the final state, made from the seeds.

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> cotangents, wrt = sim.prepare_reverse(sim.record, {"x": np.ones(2)}, ["k"], strict=False)
        >>> sorted(cotangents), wrt
        (['x'], ['k'])
        """
        if not isinstance(record, SimulationRecord) or record.simulation is not self:
            raise ArgumentError("reverse: this Record belongs to another simulation")
        check_seeds(seeds)
        if record.generation != self.generation and not record.kept:
            raise RecordError(f"reverse: this Record is of generation {record.generation}, but the "
                              f"simulation has run since and is at generation {self.generation}; "
                              "reverse right after run(), or keep() the Record to reverse it later")
        if not record.kept or self.on_device:   # the reverse reads the input planes themselves
            self.check_planes("reverse", [nm for nm in record.fixed if nm in self._planes])
        check_wrt(self, wrt, self.bitwise(), strict)
        return seed_cotangents(self, seeds), wrt

    @contextlib.contextmanager
    def reading(self, record):
        """``record`` counts one more reader inside the block (``run`` is refused meanwhile).

        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=np.ones(2), v=np.zeros(2), k=1.0)
        >>> _ = sim.run()
        >>> with sim.reading(sim.record) as record:
        ...     sim.run()
        Traceback (most recent call last):
            ...
        vkml.errors.Busy: simulation.run: a reverse is reading the last Record; wait for it to return
        """
        with self._lock:
            record.readers += 1
        try:
            yield record
        finally:
            with self._lock:
                record.readers -= 1

    def sweep(self, record, prepared, vjps, workspace):
        """The checkpointed reverse of ``record``: windows recomputed from its checkpoints and
        reversed, last first (see ``reversible.py``).

        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=np.array([1.0, 0.5]),
        ...                       v=np.zeros(2), k=1.0)
        >>> _ = sim.run()
        >>> call = sim.prepare_reverse(sim.record, {"x": np.ones(2)}, None, strict=False)
        >>> with sim.reading(sim.record):
        ...     grads = sim.sweep(sim.record, call, {}, vkml.diff.Workspace())
        >>> grads["k"].round(4)
        np.float64(-0.6129)
        """
        ct0, wrt = prepared
        values, stats = self._reverse_passes(record, ct0, vjps, workspace)
        bitwise = self.bitwise()
        bitwise = {k: bitwise.get(k, True) for k in values}
        if wrt is not None:
            values = {k: v for k, v in values.items() if k in wrt}
        return Gradients(values, Report(record.generation, bitwise, stats["chunks"],
                                        stats["recomputed"], stats["peak"]))

    def reverse(self, record, seeds, wrt=None, vjps=None, strict=False):
        """The checkpointed reverse of a recorded run (what :func:`vkml.diff.reverse` calls for a
        simulation's Record): ``vkml.diff.Reverse(sim, vjps=vjps, strict=strict)(record, seeds,
        wrt=wrt)``.

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> _ = sim.run()
        >>> sim.reverse(sim.record, {"x": np.ones(2)})["k"].round(4)
        np.float64(-0.6129)
        """
        return Reverse(self, vjps=vjps, strict=strict)(record, seeds, wrt=wrt)

    def bitwise(self):
        """Per Param: False where it reaches a gather (a table read by index), whose gradient is
        a scatter-add across samples (the same rule as a Graph's reverse).

        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
        >>> sim.bitwise()
        {'x': True, 'v': True, 'k': True}
        """
        kern = self.launch.kernel
        k = len(kern.inputs)
        flags = {nm: True for nm in kern.inputs}
        for j, p in enumerate(kern.params):
            flags[p] = not uses_table(self.launch.program, k + j)
        return flags

    def _reverse_passes(self, record, ct0, vjps, workspace):
        if self.on_device:
            if record.checkpoint_arrays is not None:
                return self._reverse_on_device(record, ct0)
            return self._reverse_stepped_on_device(record, ct0, vjps)
        n = self.n
        size = self.pass_size
        bounds = [(0, n)] if size >= n else chunk_bounds(n, size)
        state_grads = {s: np.zeros_like(self.launch.reads[s]) for s in self.state}
        fixed_grads = {}
        param_partials = {p: [] for p in self.launch.kernel.params}
        stats = {"chunks": len(bounds), "recomputed": 0, "peak": 0}
        for s0, e0 in bounds:
            sl = slice(s0, e0)
            res = self._reverse_slice(record, sl, {k: v[sl] for k, v in ct0.items()}, vjps, stats,
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

    def _reverse_slice(self, record, sl, ct0, vjps, stats, workspace):
        """The reverse for the samples in ``sl``: windows from the last, adjoints stepped back.
        While every sample of the slice is still running (``t`` below the fewest steps) no mask
        is applied (selecting every row changes no value); missing cotangents are read-only
        zeros and the per-sample Param cotangents are summed into ``workspace`` buffers, so a
        step allocates only what its vjp program returns."""
        if getattr(record, "checkpoint_arrays", None) is not None:
            loops = self._compiled_loops()
            if loops is not None:
                return self._reverse_compiled(loops, record, sl, ct0, stats)
        launch = self.launch
        kern = launch.kernel
        m = sl.stop - sl.start
        steps = record.steps[sl]
        T = int(steps.max(initial=0))
        fixed = {k: v[sl] for k, v in record.fixed.items()}
        cells = {(None, p): record.cells[p] for p in kern.params}
        node = _FakeNode()
        ct_state = {s: ct0.get(s, np.zeros_like(record.initial[s][sl])) for s in self.state}
        prm_acc = {p: None for p in kern.params}
        fixed_acc = {}
        float_fixed = [nm for nm in kern.inputs if nm not in self.state and fixed[nm].dtype.kind == "f"]

        fewest = self._fewest_steps(steps)
        keep = _Keep()

        def back_step(t, cur, extra):
            active = keep if t < fewest else _Mask(t < steps)
            ins = [cur[nm] if nm in self.state else extra.get(nm, fixed.get(nm)) for nm in kern.inputs]
            cts = []
            for name, var in zip(launch.out_names, launch.program.outputs):
                if name in self.state:
                    cts.append(active.where(ct_state[name], 0))
                else:
                    cts.append(np.zeros((m,) + var.shape, var.dtype) if self.nodes else
                               workspace.zeros((m,) + var.shape, var.dtype))
            ins_ct, prm = reverse_launch(launch, node, ins, cells, cts, m)
            for s in self.state:
                g = ins_ct.get(s)
                if g is not None:
                    ct_state[s] = active.where(g, ct_state[s])
            node_cts = {}
            for nm in kern.inputs:
                if nm in self.state or nm not in ins_ct:
                    continue
                g = active.where(ins_ct[nm], 0)
                if nm in extra:
                    node_cts[nm] = g
                elif nm in float_fixed:
                    fixed_acc[nm] = g if nm not in fixed_acc else fixed_acc[nm] + g
            if node_cts:
                self._node_vjps(vjps, cur, fixed, extra, node_cts, ct_state, fixed_acc,
                                active.mask(m))
            for p, g in prm.items():
                if prm_acc[p] is None:          # the sum starts as the first cotangent, masked
                    prm_acc[p] = workspace.buffer(("param", p), g.shape, g.dtype)
                    active.where(g, 0, out=prm_acc[p])
                else:                           # acc + g, in place: the same additions
                    active.add(prm_acc[p], g)

        self._follow_plan(self.schedule.plan(self.max_steps, T), record.stored, sl, T, fixed, steps,
                          back_step, stats)
        params = {p: (prm_acc[p] if prm_acc[p] is not None else
                      np.zeros((m,) + np.shape(record.cells[p]), np.float64))
                  for p in kern.params}
        return {"state": ct_state, "fixed": fixed_acc, "params": params}

    def _follow_plan(self, plan, stored, sl, last, fixed, steps, back_step, stats, advance=None,
                     node_values=None):
        """Carry out a schedule's reverse plan (see graph/schedules.py): recompute states from the
        Record's ``stored`` ones or from recomputed ones, reverse each step on its state, and free
        a recomputed state once its step is reversed.  Counts the states it needs at once the way
        the schedule predicts them: a stored state until its step is reversed.  ``advance`` and
        ``node_values``: how a step is recomputed and the model nodes run (on the device: see
        ``_reverse_stepped_on_device``), else on the host."""
        advance = advance or (lambda cur, u, everyone: self._advance(cur, fixed, steps, u, everyone))
        node_values = node_values or (lambda cur: self._node_values(cur, fixed))
        made = {}
        fewest = self._fewest_steps(steps)
        alive = sum(1 for t in stored if t < last)

        def state(t):
            return made[t] if t in made else {s: device_rows(stored[t][s], sl) for s in self.state}

        peak = alive
        with _progress(self.progress, last, "reverse steps") as bar:      # closed by a Ctrl-C too
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

    def _advance(self, cur, fixed, steps, t, everyone=False):
        active = t < steps
        new, _, _, _ = self._step(cur, fixed, active, everyone=everyone)
        return new

    def _fewest_steps(self, steps):
        """The steps below which every sample of ``steps`` is running, so nothing is masked (0
        with a model node: its vjp adds into the state cotangents in place, which must then be
        fresh arrays)."""
        return 0 if self.nodes or not steps.size else int(steps.min())

    def _node_values(self, cur, fixed):
        extra = {}
        for node in self.nodes:
            reads = {k: (cur[k] if k in cur else fixed.get(k, v)) for k, v in node.reads.items()}
            for k, v in node.run(reads).items():
                extra[k] = np.asarray(v)
        return extra

    def _node_vjps(self, vjps, cur, fixed, extra, node_cts, ct_state, fixed_acc, active):
        """Call each model node's vjp on the samples still running at this step."""
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            return
        for node in self.nodes:
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


class _Span:
    """What a schedule's plan reads of the step counts of a pass kept on the device: how many
    samples it has and the fewest steps one took (``Simulation._fewest_steps``)."""

    def __init__(self, size, fewest):
        self.size, self._fewest = size, fewest

    def min(self):
        return self._fewest


def _pass_sum(backend, cotangents, size):
    """The canonical-tree sum of one pass's per-sample Param cotangents (a device array), on the
    device, as the host sums them: a short last pass is padded with zeros to ``size`` there,
    whose zero subtrees add +0.0 (the same bits, except that a -0.0 sum becomes +0.0)."""
    part = backend.tree_sum(cotangents)
    return part + np.zeros_like(part) if cotangents.shape[0] < size else part


def _row_bytes(plane) -> int:
    """The bytes of one sample of a plane (a NumPy array or a device plane)."""
    return int(np.prod(plane.shape[1:], dtype=np.int64)) * plane.dtype.itemsize


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


def _progress(flag, total, desc):
    """A progress bar for a long loop: shown in a notebook (or when ``progress=True``), silent
    elsewhere and when ``progress=False``."""
    return progress_bar(total=total, desc=desc, enabled=flag)


def _eqns(loops):
    """The equations of the step program compiled loops run (to name a failing one)."""
    return getattr(getattr(loops, "step", None), "eqns", [])


def simulation(step, *, max_steps, record=False, window=None, memory_budget=None, **kwargs):
    """A step kernel run per sample until it terminates (see the module docstring).

    >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
    >>> sim = vkml.simulation(drift, max_steps=10, record=True, x=x, v=v, k=1.0)
    >>> _ = sim.run()
    >>> x.round(4)
    array([0.5708, 0.2854])
    >>> grads = vkml.diff.reverse(sim.record, {"x": np.ones(2)})
    >>> grads["k"].round(4)
    np.float64(-0.6129)
    """
    return Simulation(step, max_steps=max_steps, record=record, window=window,
                      memory_budget=memory_budget, **kwargs)


def until_done(step, *, max_steps, record=False, window=None, memory_budget=None, **kwargs):
    """Like :func:`simulation`; ``step`` may be ``[opaque_node, kernel]`` (the node runs first).

    >>> @vkml.kernel
    ... def pushed(x, corr):
    ...     return {"x": x + 0.1 * corr}
    ...
    >>> x, corr = np.array([1.0, 0.5]), np.zeros(2)
    >>> model = vkml.graph.opaque(lambda r: {"corr": -r["x"]}, reads={"x": x}, writes={"corr": corr}, name="model")
    >>> sim = vkml.until_done([model, pushed], max_steps=5, x=x, corr=corr)
    >>> _ = sim.run()
    >>> x.round(4)
    array([0.5905, 0.2952])
    """
    return Simulation(step, max_steps=max_steps, record=record, window=window,
                      memory_budget=memory_budget, **kwargs)
