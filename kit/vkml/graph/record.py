"""The Record of a recording run.

The run keeps a *tape*: one entry per node executed, naming the plane
versions each launch read and wrote.  A version that some launch read is
copied just before it is overwritten; nothing else is copied (the rule, and
every path that follows it: ``versions.py``).  The Record
is the tape, those copies, references to the live planes, and a one-value
copy of each Param cell as the launch used it: a reverse reads it and never
writes it.

Rules: one recorded run per ``launch()``; while a Record is live
(neither reversed nor kept) the next recording launch and ``update`` are
refused; a Record whose launch is no longer the newest is refused with both
generations named; ``keep()`` copies everything the reverse reads and
stays valid however often the graph runs again."""

from __future__ import annotations


from ..backends.fingerprint import fingerprints
from ..errors import RecordError


class Step:
    """One executed launch: which versions it read and wrote."""

    __slots__ = ("node", "launch", "reads", "writes", "index")

    def __init__(self, node, launch, reads, writes, index):
        self.node, self.launch, self.reads, self.writes, self.index = node, launch, reads, writes, index


def planes_read_live(tape, saved, final, planes) -> list:
    """The planes whose values a reverse reads from the plane itself, not from a copy: those a
    step read at the version the launch left (``saved``: the versions copied; ``final``: each
    plane's last version).  Every plane, where the tape holds an entry that does not say what
    it read version by version."""
    live = set()
    for entry in tape:
        reads = entry.reads if isinstance(entry, Step) else None
        if not isinstance(reads, dict):
            return list(planes.values())
        for key in reads.values():
            pid, version = key
            if key not in saved and version == final.get(pid, 0):
                live.add(pid)
    return [plane for pid, plane in planes.items() if pid in live]


class LoopEntry:
    """A repeat_while's record: its iteration count and checkpoints every ``window`` iterations."""

    __slots__ = ("node", "iterations", "checkpoints", "window", "state", "start_reads", "end_writes",
                 "index", "launch")

    def __init__(self, node, launch, window, index):
        self.node, self.launch, self.window, self.index = node, launch, window, index
        self.iterations = 0
        self.checkpoints = {}
        self.state = []
        self.start_reads = {}
        self.end_writes = {}


class SkipEntry:
    __slots__ = ("node", "guard", "step", "index")

    def __init__(self, node, guard, step, index):
        self.node, self.guard, self.step, self.index = node, guard, step, index


class OtherEntry:
    """An opaque or reduce node's run."""

    __slots__ = ("node", "reads", "writes", "index")

    def __init__(self, node, reads, writes, index):
        self.node, self.reads, self.writes, self.index = node, reads, writes, index


class Record:
    """What one recording launch kept for its reverse (see the module docstring).

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
    >>> g.launch()
    <vkml.Graph: wave>
    >>> rec = g.record
    >>> rec.generation, rec.live, rec.nbytes
    (1, True, 0)
    """

    def __init__(self, graph, run):
        self.graph = graph
        self.generation = graph.generation
        self.tape = run.tape
        self.saved = run.saved
        #: whether the planes and copies it reads are device planes (see ``Graph.planes``)
        self.on_device = run.on_device
        # (the run's own dicts, or its plan's: nothing writes them after the run)
        self.final = run.versions.version
        self.planes = run.planes
        #: a tape of plain kernel launches only (see ``_Run.steps_only``)
        self.steps_only = run.steps_only
        # the Param values this launch used: a one-value copy per Param, so that an
        # update() after this Record was reversed cannot leak into a later reverse of it
        self.cells = {k: v.copy() for k, v in graph.cells.items()}
        self.kept = False
        self.reversed = False
        self._kept_planes = None
        #: how many reverses read it right now (counted under its graph's lock: ``Graph.reading``)
        self.readers = 0
        #: each plane's fingerprint as the launch left it: a reverse reads the planes without a
        #: copy, so one the user wrote into since is refused (``check_current``)
        self._live = run.read_live if run.read_live is not None else \
            planes_read_live(self.tape, self.saved, self.final, self.planes)
        self._marks = fingerprints(self._live)

    # -- state --------------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        """Neither reversed nor kept: the graph refuses the next recording launch and ``update``.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> g.record.live
        True
        >>> _ = vkml.diff.reverse(g.record, {"y": np.ones(3)})
        >>> g.record.live
        False
        """
        return not self.kept and not self.reversed

    @property
    def stale(self) -> bool:
        """Not kept, and the graph has launched since: the planes no longer hold what this Record needs, so a reverse of it is refused.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> rec = g.record
        >>> _ = vkml.diff.reverse(rec, {"y": np.ones(3)})
        >>> g.launch()
        <vkml.Graph: wave>
        >>> rec.stale, g.record.stale
        (True, False)
        """
        return not self.kept and self.generation != self.graph.generation

    @property
    def nbytes(self) -> int:
        """Bytes of the copies this Record holds (0 for a graph that overwrites nothing).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> g.record.nbytes
        0
        """
        total = sum(a.nbytes for a in self.saved.values())
        for e in self.tape:
            if isinstance(e, LoopEntry):
                total += sum(a.nbytes for c in e.checkpoints.values() for a in c.values())
        if self._kept_planes is not None:
            total += sum(a.nbytes for a in self._kept_planes.values())
            total += sum(a.nbytes for a in self.cells.values())
        return total

    @property
    def copied(self):
        """Names of the planes copied before an overwrite (for pictures and explorers).

        >>> @vkml.kernel
        ... def double(s):
        ...     return {"s": 2.0 * s}
        ...
        >>> s = np.array([1.0, 2.0])
        >>> g = vkml.Graph().add(double.bind(s=s), name="a").add(double.bind(s=s), name="b").build(record=True)
        >>> g.launch()
        <vkml.Graph: a -> b>
        >>> g.record.copied, g.record.nbytes
        (['s'], 32)
        """
        names = []
        for pid, _ in self.saved:
            name = self.graph.plane_name(self.planes[pid])
            if name not in names:
                names.append(name)
        return names

    @property
    def iterations(self):
        """How many times each repeat_while member ran in this launch (what its reverse unrolls).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> g.record.iterations
        {}
        """
        return {e.node.name: e.iterations for e in self.tape if isinstance(e, LoopEntry)}

    @property
    def nodes(self):
        """The names of the nodes in launch order.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> g.record.nodes
        ['wave']
        """
        return [e.node.name for e in self.tape]

    def keep(self) -> "Record":
        """Copy everything the reverse reads; the Record then stays valid whatever the graph does.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> rec = g.record.keep()
        >>> g.launch()
        <vkml.Graph: wave>
        >>> vkml.diff.reverse(rec, {"y": np.ones(3)})["k"].round(4)
        np.float64(-0.146)
        """
        if self.stale:
            raise RecordError(f"keep: this Record is of generation {self.generation} but the graph "
                              f"is at generation {self.graph.generation}; keep() right after launch()")
        if not self.kept:
            self.graph.check_planes("keep")
            self.check_unchanged("keep")
            # every plane the run touched, not only those it wrote: the reverse also reads
            # the graph's inputs (version 0), which the next launch may find changed
            self._kept_planes = {pid: plane.copy() for pid, plane in self.planes.items()}
            self.kept = True
        return self

    def check_current(self, what="reverse", planes=True):
        """Refuse (:class:`vkml.RecordError`, naming both generations) a Record that is stale or already reversed; with ``planes``, also one whose planes were written since its launch (``check_unchanged``).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> old = g.record
        >>> _ = vkml.diff.reverse(old, {"y": np.ones(3)})
        >>> g.launch()
        <vkml.Graph: wave>
        >>> old.check_current()
        Traceback (most recent call last):
            ...
        vkml.errors.RecordError: reverse: this Record is of generation 1, but the graph has launched since and is at generation 2; reverse right after launch(), or keep() the Record to reverse it later
        """
        if self.stale:
            raise RecordError(f"{what}: this Record is of generation {self.generation}, but the graph "
                              f"has launched since and is at generation {self.graph.generation}; "
                              "reverse right after launch(), or keep() the Record to reverse it later")
        if planes and not self.kept:
            self.check_unchanged(what)

    def check_unchanged(self, what="reverse"):
        """Refuse (:class:`vkml.RecordError`, naming the plane) a Record whose planes were written
        since its launch: its reverse would mix the new values with the launch's.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> x[1] = 0.7
        >>> g.record.check_unchanged()
        Traceback (most recent call last):
            ...
        vkml.errors.RecordError: reverse: plane 'x' was written after launch 1 recorded it; launch again after changing a plane (or keep() the Record before changing it) to reverse what the planes hold now
        """
        now = fingerprints(self._live)
        if now == self._marks:
            return
        for plane, seen, mark in zip(self._live, now, self._marks):
            if seen != mark:
                raise RecordError(f"{what}: plane {self.graph.plane_name(plane)!r} was written after "
                                  f"launch {self.generation} recorded it; launch again after changing "
                                  "a plane (or keep() the Record before changing it) to reverse what "
                                  "the planes hold now")

    def value(self, key):
        """The values of plane version ``key = (plane id, version)`` as its readers saw them.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> g.record.value((id(x), 0))
        array([0. , 0.5, 1. ])
        """
        if key in self.saved:
            return self.saved[key]
        pid, version = key
        if version == self.final.get(pid, 0):
            if self._kept_planes is not None:
                return self._kept_planes[pid]
            return self.planes[pid]
        raise RecordError("the Record does not hold this plane version (a bug: it was read "
                          "but not copied before its overwrite)")

    def __repr__(self):
        state = "kept" if self.kept else "reversed" if self.reversed else "live"
        return (f"<vkml Record generation {self.generation} ({state}): {len(self.tape)} steps, "
                f"{self.nbytes:,} bytes copied>")
