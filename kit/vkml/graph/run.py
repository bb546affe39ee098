"""A launch of a Graph: one fused program for the whole graph where it can be (the default),
node by node otherwise, recording a tape where the graph records, all or nothing."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from .. import backends
from ..errors import ExecutionError
from ..ir import Var, program_from_dag
from ..runtime import submit
from ..transforms import inline
from .versions import PlaneVersions
from .device import run_resident
from ..backends.base import threads
from .execute import all_or_nothing, primitives_of, run_named, user_error
from .kernel import Launch
from .nodes import Opaque, Reduce, RepeatWhile, SkipGuard, Skippable
from .record import LoopEntry, OtherEntry, Record, SkipEntry, Step, planes_read_live


class _Run:
    """One run of a graph: its tape, the plane versions (and the copy rule, ``versions.py``) and
    the Record's copies."""

    def __init__(self, recording):
        self.recording = recording
        #: whether the planes and copies are device planes (a launch on the cuda backend)
        self.on_device = False
        #: id of a bound plane -> the device plane the run works on (node by node on the device)
        self.device = {}
        self.versions = PlaneVersions(recording)
        self.saved = {}
        self.planes = {}
        self.tape = []
        #: whether the tape is plain kernel launches only (a fused launch's): a reverse then
        #: skips looking through it for other kinds of entry
        self.steps_only = False
        #: the planes a reverse reads in place (a fused launch's plan knows them), else None
        self.read_live = None

    def on(self, plane):
        """The plane the run works on for bound plane ``plane`` (its device plane, if any)."""
        return self.device.get(id(plane), plane)

    def cur(self, plane):
        self.planes[id(plane)] = self.on(plane)
        return self.versions.current(id(plane))

    def note_read(self, plane):
        self.planes[id(plane)] = self.on(plane)
        return self.versions.note_read(id(plane))

    def write(self, plane, value, copies=True):
        """Write ``value`` into ``plane``, copying the version it overwrites first where the rule
        says so; ``copies=False``: a loop's later iteration, whose versions the loop rebuilds
        from its own checkpoints."""
        target = self.planes[id(plane)] = self.on(plane)
        key = self.versions.copy_before_write(id(plane)) if copies else None
        if key is not None:
            self.saved[key] = target.copy()           # just before the overwrite
        target[...] = value
        return self.versions.wrote(id(plane))


def _run_launch(run, node, launch, cells, copies=True):
    kern = launch.kernel
    args = [run.on(launch.reads[n]) for n in kern.inputs] + [cells[(node.name, p)] for p in kern.params]
    flags = [True] * len(kern.inputs) + [False] * len(kern.params)
    reads = {n: run.note_read(launch.reads[n]) for n in kern.inputs}
    where = f"node {node.name!r} ({kern.name})"
    outs = run_resident(launch.batched(), launch.n, args, where) if run.on_device else \
        run_named(launch.batched(), launch.n, args, flags, where)
    writes = {}
    for name, value in zip(launch.out_names, outs):
        writes[name] = run.write(launch.writes[name], value, copies)
    step = Step(node, launch, reads, writes, len(run.tape))
    run.tape.append(step)
    return step


@dataclass(frozen=True, eq=False)
class LaunchPlan:
    """The whole launch of a graph of plain kernel launches as ONE program (one submission),
    made by :func:`_fused_plan` once per graph build, recording mode and backend."""

    #: the compiled program and the backend it runs on
    exe: object
    backend: object
    #: its inputs: the planes read before any write (version 0), then these Param cells (keys
    #: of ``graph.cells``)
    in_planes: list
    cells: list
    #: its outputs: the final version of each of these planes, then the Record's copies: the
    #: versions in ``saved`` (the copy rule, ``versions.py``), in that order
    written: list
    saved: list
    #: per written plane, the plane the backend computes it straight into, or None where it
    #: cannot (the plane is read by the launch, or the program can fail part-way): copied in after
    into: list
    #: ids of the planes the program reads, and of every plane it reads or writes (a result that
    #: is one of them is copied, never aliased)
    inputs: frozenset
    held: frozenset
    #: the tape, the same every launch: one Step per node, shared by every Record of this plan
    #: (nothing writes a Record's tape)
    tape: list
    #: the plane versions after the launch, and every plane by id
    version: dict
    planes: dict
    #: the program's equations (to name a failing one)
    eqns: list
    #: the planes a reverse of its Records reads in place (``planes_read_live``)
    read_live: list
    #: whether the planes are device planes: the results stay on the device too
    resident: bool = False


def _fused_plan(graph, recording) -> LaunchPlan:
    """The plan of the fused launch (see :class:`LaunchPlan`).

    Each launch is inlined into one program on the values it reads; a write asks the copy rule
    (``versions.py``) first, and a version it says to copy becomes an output of the program.
    """
    cur = {}
    versions = PlaneVersions(recording)
    inputs, in_planes, saved, template = [], [], [], []
    cell_vars = {k: Var(c.shape, c.dtype) for k, c in graph.cells.items()}
    for node in graph.nodes:
        launch = node.op
        kern = launch.kernel
        args, reads = [], {}
        for nm in kern.inputs:
            plane = launch.reads[nm]
            pid = id(plane)
            if pid not in cur:
                cur[pid] = Var(plane.shape, plane.dtype)
                inputs.append(cur[pid])
                in_planes.append(plane)
            args.append(cur[pid])
            reads[nm] = versions.note_read(pid)
        args += [cell_vars[(node.name, p)] for p in kern.params]
        _, program = launch.batched().executable(launch.n)
        outs = inline(program, args)
        writes = {}
        for nm, var in zip(launch.out_names, outs):
            pid = id(launch.writes[nm])
            before = versions.copy_before_write(pid)
            if before is not None:
                saved.append((before, cur[pid]))
            cur[pid] = var
            writes[nm] = versions.wrote(pid)
        template.append(Step(node, launch, reads, writes, len(template)))
    version = versions.version
    written = [pid for pid in version if version[pid] > 0]
    planes = {id(p): p for node in graph.nodes for p in
              list(node.op.reads.values()) + list(node.op.writes.values())}
    program = program_from_dag(inputs + list(cell_vars.values()),
                               [cur[pid] for pid in written] + [v for _, v in saved])
    backend = backends.current()
    exe = backend.executable(("graph-launch", program), lambda: program)
    # written planes the launch does not read are the results' destinations: computed straight
    # into them where the backend can (Backend.run checks overlaps), copied in otherwise; a plane
    # it reads is written last, after the Record has copied the version it read
    read_ids = frozenset(id(a) for a in in_planes)
    written = [planes[pid] for pid in written]
    # a program that can fail part-way (an index out of range) computes into buffers of its own,
    # copied into the planes once it has succeeded: a refused launch writes nothing
    private = _may_fail(program)
    into = [None if id(p) in read_ids or private else p for p in written] + [None] * len(saved)
    device = graph.device_planes if backend.keeps_planes_on_device else {}
    if device:
        # the same plan on the graph's device planes: the results (and the Record's copies) stay
        # on the device, written planes are computed straight into their device planes
        def on(p):
            return None if p is None else device.get(id(p), p)
        in_planes, written, into = [on(p) for p in in_planes], [on(p) for p in written], \
            [on(p) for p in into]
        planes = {pid: on(p) for pid, p in planes.items()}
        read_ids = frozenset(id(a) for a in in_planes)
    return LaunchPlan(exe=exe, backend=backend, in_planes=in_planes, cells=list(cell_vars),
                      written=written, saved=[k for k, _ in saved], into=into, inputs=read_ids,
                      held=read_ids | {id(p) for p in written}, tape=template,
                      version=dict(version), planes=planes, eqns=program.eqns,
                      read_live=planes_read_live(template, {k for k, _ in saved}, version, planes),
                      resident=bool(device))


def _run_fused(graph, recording):
    key = (recording, id(backends.current()))
    plan, _ = graph.caches.launch_plans.get_or_make(key, lambda: _fused_plan(graph, recording))
    args = plan.in_planes + [graph.cells[k] for k in plan.cells]
    values = submit(plan.backend, plan.exe, args, plan.eqns, resident=plan.resident, into=plan.into)
    run = _Run(recording)
    run.on_device = plan.resident
    for key_, value in zip(plan.saved, values[len(plan.written):]):
        run.saved[key_] = value.copy() if id(value) in plan.held else value
    for plane, dest, value in zip(plan.written, plan.into, values):
        if dest is None:
            plane[...] = value.copy() if id(value) in plan.inputs else value
    # the plan's own versions, planes and tape: the same every launch, and never written (the
    # Record reads them), so shared rather than copied per launch
    run.versions.version = plan.version
    run.planes = plan.planes
    run.tape = plan.tape
    run.read_live = plan.read_live
    run.steps_only = True
    return run


def _may_fail(program) -> bool:
    """Whether a program can fail part-way through: it reads or writes by index, or it loops
    (Ctrl-C stops a long scan or while loop part-way, compiled or not)."""
    return any(prim.name in ("gather", "scatter_add", "scan", "while") for prim in primitives_of(program))


#: a launch with nothing to put back: one fused run changes no plane, generation or Record
#: before it has succeeded
_NOTHING_TO_UNDO = contextlib.nullcontext()


def run_launches(graph, runs, workers):
    """``runs`` runs of a built graph on ``workers`` threads, all or nothing (see
    ``all_or_nothing``); the Record of the last run where the graph records (it runs once)."""
    fused = fused_launch(graph, workers)
    backup = launch_backup(graph, runs, fused)
    undo = all_or_nothing(backup, [(graph, "generation")]) \
        if backup or runs > 1 or not fused else _NOTHING_TO_UNDO
    with undo:
        for _ in range(runs):
            rec = run_graph(graph, graph.recording, fused)
    return rec


def launch_backup(graph, runs, fused):
    """What a launch of ``runs`` runs must copy first to put back if it fails part-way (see
    ``all_or_nothing``): nothing for one fused run (it computes into private buffers where it
    can fail) nor for one run of plain kernel launches that cannot fail (no index read or
    written, no loop); otherwise -- several runs can always be stopped between two of them by
    Ctrl-C -- every plane the graph writes (one copy for all the runs)."""
    can_fail, _ = graph.caches.structure.get_or_make("can fail", lambda: not all(
        type(node.op) is Launch for node in graph.nodes) or any(_may_fail(node.op.program)
                                                                for node in graph.nodes))
    if not (runs > 1 or can_fail and not fused):
        return []
    planes = graph.written_planes()
    # on the cuda backend the device planes are the graph's: several runs, or one run node by
    # node on the device, back them up on the device (one run on host copies writes them only
    # once it has succeeded: ``_steps``)
    on_device = graph.device_planes and (runs > 1 or steps_on_device(graph))
    return [graph.device_planes.get(id(p), p) for p in planes] if on_device else planes


def fused_launch(graph, workers=None) -> bool:
    """Whether a launch of ``graph`` runs as one fused program: plain kernel launches, on one
    thread (or on the device, where samples do not split over host threads)."""
    return ((threads() if workers is None else workers) == 1 or bool(graph.device_planes)) and \
        all(type(n.op) is Launch for n in graph.nodes)


def run_graph(graph, recording, fused=None):
    if fused_launch(graph) if fused is None else fused:
        try:
            run = _run_fused(graph, recording)
        except ExecutionError as err:
            # one program for the whole graph names no node: run node by node (on the planes,
            # put back after) to name the one that fails, then refuse with that error
            with all_or_nothing(graph.written_planes(), [(graph, "generation")]):
                _steps(graph, recording, keep=False)
            raise err
        graph.generation += 1
        return Record(graph, run) if recording else None
    run = _steps(graph, recording)
    graph.generation += 1
    if not recording:
        return None
    return Record(graph, run)


def steps_on_device(graph) -> bool:
    """Whether a node-by-node run of ``graph`` works on its device planes (cuda): its nodes are
    kernel launches, skippables and repeat_whiles whose guards are ``SkipGuard`` cells the
    graph does not hold as planes (a guard reads only its cell, on the host; every kernel runs
    on the device planes).  Opaque nodes, reductions and guards that are functions run Python
    that may read any plane, so such a graph runs on host copies (:func:`_steps`)."""
    if not graph.device_planes:
        return False

    def on_device(node):
        op = node.op
        if type(op) is Launch:
            return True
        if isinstance(op, (Skippable, RepeatWhile)):
            return isinstance(op.guard, SkipGuard) and id(op.guard.cell) not in graph.device_planes
        return False
    return all(on_device(node) for node in graph.nodes)


def _steps(graph, recording, keep=True):
    """:func:`_run_steps`, on the device planes where :func:`steps_on_device` says so (every
    kernel's results stay there; the Record's copies and a loop's checkpoints are device copies);
    otherwise on the host where the graph's planes live on the device (cuda): the nodes that
    run Python on the values (opaque nodes, reductions, guards that are functions) need them
    there.  Every device plane made from a NumPy array you bound is copied into that array
    first (one device-to-host copy each), the steps run on those arrays (their kernels still
    run on the GPU, on host arguments), and then -- once every step has succeeded, and only
    with ``keep`` -- each written one is copied back to its device plane (one host-to-device
    copy each).  Planes you bound as device arrays stay on the device throughout.  ``keep=False``
    (a failed fused launch run again to name the failing node): always on host copies, which it
    leaves as they are."""
    if keep and steps_on_device(graph):
        return _run_steps(graph, recording, graph.device_planes)
    if not graph.mirrors:
        return _run_steps(graph, recording)
    for host, device in graph.mirrors:
        if host.flags.writeable:          # a read-only array: its plane holds what it holds
            np.copyto(host, device.numpy())
    run = _run_steps(graph, recording)
    if keep:
        written = {id(p) for p in graph.written_planes()}
        for host, device in graph.mirrors:
            if id(host) in written:
                device[...] = host
    return run


def _guard(node, guard):
    """A conditional's guard, evaluated; one that raises is named after its node."""
    try:
        return bool(guard())
    except Exception as err:     # noqa: BLE001 - the user's guard: named
        raise user_error(err, f"the guard of node {node.name!r}")


def _run_steps(graph, recording, device=None):
    """Run the nodes one by one on the planes (``device``: on these device planes, by id of the
    bound plane); the run's tape and copies."""
    run = _Run(recording)
    if device:
        run.device, run.on_device = device, True
    cells = graph.cells
    for node in graph.nodes:
        op = node.op
        if isinstance(op, Skippable):
            taken = _guard(node, op.guard)
            guard = np.uint32(1 if taken else 0)          # the recorded guard: a one-value copy
            step = _run_launch(run, node, op.member, cells) if taken else None
            if step is not None:
                run.tape.pop()
            run.tape.append(SkipEntry(node, guard, step, len(run.tape)))
        elif isinstance(op, RepeatWhile):
            _run_repeat(run, node, op, cells)
        elif isinstance(op, Opaque):
            reads = {k: run.note_read(p) for k, p in op.reads.items()}
            out = op.run()
            writes = {k: run.write(op.writes[k], out[k]) for k in op.writes}
            run.tape.append(OtherEntry(node, reads, writes, len(run.tape)))
        elif isinstance(op, Reduce):
            reads = {"src": run.note_read(op.src)}
            value = op.compute(op.src)
            writes = {"dst": run.write(op.dst, np.reshape(value, op.dst.shape))}
            run.tape.append(OtherEntry(node, reads, writes, len(run.tape)))
        else:
            _run_launch(run, node, op, cells)
    return run


def _run_repeat(run, node, op, cells):
    """Iterate the member while the guard holds, checkpointing its state every ``window`` iterations
    (on copies of the Record's own: the planes themselves are only ever written by the member)."""
    launch = op.member
    state = [n for n in launch.kernel.inputs if n in launch.writes and
             launch.reads[n] is launch.writes[n]]
    entry = LoopEntry(node, launch, op.window, len(run.tape))
    entry.state = state
    entry.start_reads = {n: (id(p), run.cur(p)) for n, p in launch.reads.items()}
    it = 0
    while it < op.max_iters and _guard(node, op.guard):
        if run.recording and it % op.window == 0:
            entry.checkpoints[it] = {n: run.on(launch.reads[n]).copy() for n in state}
        # the first iteration overwrites versions others may have read: the copy rule applies;
        # the later ones overwrite only the loop's own, rebuilt from its checkpoints
        _run_launch(run, node, launch, cells, copies=it == 0)
        run.tape.pop()
        it += 1
    entry.iterations = it
    entry.end_writes = {n: (id(p), run.cur(p)) for n, p in launch.writes.items()}
    run.tape.append(entry)
