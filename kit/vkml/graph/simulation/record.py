"""What a recorded simulation run keeps (``SimulationRecord``), and the default memory budget."""

from __future__ import annotations

import numpy as np

from ... import backends
from ...errors import RecordError
from ..treesum import MIN_PASS


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

    def __init__(self, sim, generation, steps, stored, initial, fixed, cells, checkpoint_arrays=None,
                 block_longest=None):
        self.simulation = sim
        self.graph = None
        self.generation = generation
        #: the steps each sample took: a NumPy array, or a device array on the GPU (see ``steps``)
        self.steps_plane = steps
        self._host_steps = steps if isinstance(steps, np.ndarray) else None
        #: on the GPU: the most steps a sample of each aligned block of MIN_PASS samples took
        #: (what the loops read back instead of every count)
        self.block_longest = block_longest
        #: step -> {state plane name: the state at the start of that step}, for the steps the
        #: schedule stores (``schedule.stored_steps``)
        self.stored = stored
        self.initial = initial
        self.fixed = fixed
        self.cells = cells
        #: the compiled tier's checkpoints, one [windows, n, ...] array per state plane
        self.checkpoint_arrays = checkpoint_arrays
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
            sim.check_planes("keep", [nm for nm in self.fixed if nm in sim.bound_planes])
            self.fixed = {k: v.copy() for k, v in self.fixed.items()}   # on the GPU: on the device
            self.kept = True
        return self

    def __repr__(self):
        return (f"<vkml simulation Record generation {self.generation}: {self.longest()} "
                f"steps at most, {len(self.stored)} stored states, {self.nbytes:,} bytes>")


def param_cells(launch) -> dict:
    """The Param values a run used, one copy each: what its Record reverses with, whatever
    ``update`` does later."""
    return {p: np.array(launch.params[p], copy=True) for p in launch.kernel.params}
