"""``Simulation``: a step kernel iterated per sample until it terminates, with its checkpointed
reverse; how it runs is one stepper, chosen when it is made (see the package docstring)."""

from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

import numpy as np

from ... import backends
from ...backends.base import threads
from ...errors import ArgumentError, BackendError, Busy, RecordError, RefusedError, ShapeError, boundary
from ..diff import Gradients, Report, Reverse, check_sweep, reverse_options
from ..execute import changed_plane_message, plane_signature, refuse_other_backend, uses_table
from ..kernel import Launch
from ..nodes import Opaque
from ..reversible import Reversible
from ..treesum import pass_size
from .checks import check_arguments, check_seeds, check_wrt, seed_cotangents
from .compiled_loops import CompiledLoops, compiled_loops
from .device_loops import DeviceLoops
from .device_steps import DeviceStepped
from .host_steps import HostSteps
from .record import SimulationRecord, available_memory
from .schedules import schedule_for


def stepper_for(sim):
    """The one way ``sim`` runs and reverses, from where its planes live and what the backend's
    compiled per-sample loops cover: on the device, the device's loops or steps from the host on
    device arrays; on the host, the compiled loops (the cpu tier) or steps on NumPy arrays."""
    loops = compiled_loops(sim, sim.backend) is not None
    if sim.on_device:
        return DeviceLoops(sim) if loops else DeviceStepped(sim)
    return CompiledLoops(sim) if loops else HostSteps(sim)


class SimulationReverseCall(NamedTuple):
    """One reverse call of a simulation's Record, checked (``prepare_reverse``): the cotangents
    of the final state and the gradient names asked for."""
    cotangents: dict
    wrt: list | None


def row_bytes(plane) -> int:
    """The bytes of one sample of a plane (a NumPy array or a device plane)."""
    return int(np.prod(plane.shape[1:], dtype=np.int64)) * plane.dtype.itemsize


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
        self.state_bytes = sum(row_bytes(launch.reads[s]) for s in self.state) + \
            sum(row_bytes(p) for node in nodes for p in node.writes.values())
        #: which states the run stores and how the reverse rebuilds the others
        self.schedule = schedule_for(window, max_steps, snapshots)
        #: whether the planes, the Record and the gradients live in device memory (see the module
        #: docstring): on a backend that keeps planes there
        self.on_device = backend.keeps_planes_on_device
        #: the backend it was made on: its steppers run there
        self.backend = backend
        #: on the device: the device plane of each plane name (see ``planes``)
        self.device_planes = self._device_copies(backend) if self.on_device else None
        # what the memory budget plans for per sample: the stored states and the reverse's
        self.per_sample_bytes = self.schedule.budget_states(max_steps) * self.state_bytes
        self.memory_budget = memory_budget if memory_budget is not None else \
            available_memory(self.on_device)
        if record:
            self.pass_size = pass_size(self.n, self.per_sample_bytes, self.memory_budget, "simulation")
        #: what every run and reverse checks the planes against (see check_planes)
        self.bound_planes = {name: plane for op in [launch] + nodes
                             for name, plane in list(op.reads.items()) + list(op.writes.items())}
        self._signatures = {name: plane_signature(p) for name, p in self.bound_planes.items()}
        self.generation = 0
        self._record = None
        self.progress = progress
        self._lock = threading.Lock()
        #: how it runs and reverses, chosen once here (see ``stepper_for``)
        self.stepper = stepper_for(self)
        #: on the device: whether the per-sample loops run it (else it is stepped from the host,
        #: one program on device arrays per step: device_steps.py)
        self.loops_on_device = isinstance(self.stepper, DeviceLoops)

    def _device_copies(self, backend):
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
        return dict(self.device_planes) if self.on_device else dict(self.bound_planes)

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
            refuse_other_backend(self.backend, BackendError,
                                 f"{where}: this simulation keeps its planes on the {{owner}} "
                                 "backend, but the current backend is {current}; "
                                 "vkml.set_backend('{owner}') first (or make it again here)")
            return
        for name in names if names is not None else self.bound_planes:
            plane = self.bound_planes[name]
            now = plane_signature(plane)
            if now != self._signatures[name]:
                raise ShapeError(changed_plane_message(where, name, self._signatures[name], now,
                                                       "the simulation was made",
                                                       "make the simulation again (vkml.simulation(...))"))

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
        parts = self.stepper.run()             # all or nothing: no plane written if it fails
        self.generation += 1
        if self.record_mode:
            self._record = SimulationRecord(self, self.generation, **parts)
        return self

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
        wrt = reverse_options(wrt, strict)
        if not self._owns(record):
            raise ArgumentError("reverse: this Record belongs to another simulation")
        check_seeds(seeds)
        if record.generation != self.generation and not record.kept:
            raise RecordError(f"reverse: this Record is of generation {record.generation}, but the "
                              f"simulation has run since and is at generation {self.generation}; "
                              "reverse right after run(), or keep() the Record to reverse it later")
        if not record.kept or self.on_device:   # the reverse reads the input planes themselves
            self.check_planes("reverse", [nm for nm in record.fixed if nm in self.bound_planes])
        check_wrt(self, wrt, self.bitwise(), strict)
        return SimulationReverseCall(seed_cotangents(self, seeds), wrt)

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
        check_sweep("Simulation.reading", self._owns(record), None, None, None, None)
        return self._reading(record)

    @contextlib.contextmanager
    def _reading(self, record):
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
        vjps = check_sweep("Simulation.sweep", self._owns(record), prepared, SimulationReverseCall,
                           vjps, workspace)
        ct0, wrt = prepared
        values, stats = self.stepper.reverse(record, ct0, vjps, workspace)
        bitwise = self.bitwise()
        bitwise = {k: bitwise.get(k, True) for k in values}
        if wrt is not None:
            values = {k: v for k, v in values.items() if k in wrt}
        return Gradients(values, Report(record.generation, bitwise, stats["chunks"],
                                        stats["recomputed"], stats["peak"]))

    def _owns(self, record) -> bool:
        return isinstance(record, SimulationRecord) and record.simulation is self

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
