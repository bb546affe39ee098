"""Graphs of per-sample kernels, and the Record a recording launch keeps.

A :class:`Graph` runs its nodes in the order they were added; each launch
node reads planes (NumPy arrays, one row per sample) and writes planes.  A
plane may be written more than once (a state updated in place), so every
write makes a new *version* of it.

``build(record=True)`` makes every ``launch()`` keep what its reverse needs:
the values each node read.  Most are still in the planes when the reverse
runs; the exception is a version a later node overwrites, which is copied
once, just before the overwrite.  So a graph that overwrites nothing copies
nothing (``record.nbytes == 0``).  The reverse recomputes each node's
derivative from the values it read (``vkml.diff``).

Parameters (kernel uniforms) live in one-cell planes of the graph's own, read
by the forward kernels and their vjps alike: ``update(k=...)`` copies into
those cells, and neither the forward nor the reverse is rebuilt.

Where the planes live is the backend's choice (``Backend.keeps_planes_on_device``).
On the numpy and cpu backends the planes ARE the arrays you bound: a launch
writes into your ``y``.  On the cuda backend ``build()`` makes each plane a
device plane -- a NumPy array you bound is copied to the GPU once, a device
array (a CuPy array, a PyTorch CUDA tensor: anything with
``__cuda_array_interface__``) is used where it lies -- and launches,
Records, reverses and gradients stay in device memory; your NumPy arrays no
longer follow the launches.  ``graph.planes`` gives every plane by name;
read one on the host with ``.numpy()`` (or ``np.asarray``).  Nodes that run
Python on the values (opaque nodes, reductions, guards that are functions)
need the values on the host: a graph holding one copies its planes there and
back around each launch, explicitly (guards that are cells do not)."""

from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Mapping

import numpy as np

from .. import backends
from ..backends.base import threads
from ..errors import ArgumentError, Busy, DTypeError, RecordError, ShapeError, VkmlError, boundary
from .kernel import Kernel, Launch
from .reversible import Reversible
from ..validate import check_int
from .execute import (GraphCaches, LAYOUT, WRITEABLE, changed_plane_message, plane_signature,
    refuse_other_backend)
from .nodes import Node, Opaque, Reduce, RepeatWhile, Skippable, as_launch
from .run import run_launches
from . import graph_reverse
from .diff import Reverse, check_sweep
from .record import Record
from .graph_reverse import check_graph_reversible, graph_bitwise


#: The most runs one ``launch(n)`` takes (2**31): far more than any run finishes, so a larger n
#: is a mistake, refused rather than left running for ever.
MAX_LAUNCH_RUNS = 2 ** 31


class Graph(Reversible):
    """Per-sample kernels bound to planes, run in the order added (see the module docstring).

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
    >>> g.launch()
    <vkml.Graph: wave>
    >>> grads = vkml.diff.reverse(g.record, {"wave.y": np.ones(3)})
    >>> grads["x"].round(4), grads["k"].round(4)
    (array([ 2.    ,  1.0806, -0.8323]), np.float64(-0.146))
    """

    def __init__(self):
        self.nodes = []
        self.built = False
        self.recording = False
        self.generation = 0
        self.cells = {}
        self._record = None
        #: guards the hand-over between launches and reverses: a launch is claimed, and a reverse
        #: registers as a reader, under this lock, so neither can start inside the other
        self._lock = threading.Lock()
        self.launching = False
        self.caches = GraphCaches()
        #: on a backend that keeps planes in device memory: id of each bound plane -> its device
        #: plane, and the (bound NumPy array, device plane) pairs (``build``); empty otherwise
        self.device_planes = {}
        self._plane_backend = None
        self.mirrors = []

    def add(self, bound, name=None) -> "Graph":
        """Add a launch node (``kernel.bind(...)``), a skippable/repeat_while, an opaque or reduce node.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave")
        >>> [node.name for node in g.nodes]
        ['wave']
        """
        if isinstance(bound, Kernel):
            raise ArgumentError(f"Graph.add: kernel {bound.name} is not bound; add "
                                f"{bound.name}.bind(...) with its planes and Params")
        op = as_launch(bound, "add")
        if isinstance(op, Launch) and op.kernel.vjp_of is not None:
            raise ArgumentError(f"Graph.add: {op.kernel.name} is the vjp of {op.kernel.vjp_of.name}; "
                                "a vjp is a kernel of the reverse, never a step of a forward graph "
                                "(pass it as Reverse(graph, vjps={...}))")
        if not isinstance(op, (Launch, Skippable, RepeatWhile, Opaque, Reduce)):
            raise ArgumentError(f"Graph.add: cannot add a {type(bound).__name__}; add kernel.bind(...), "
                                "vkml.skippable(...), vkml.repeat_while(...), vkml.graph.opaque(...) "
                                "or vkml.graph.reduce(...)")
        if name is None:
            name = op.member.kernel.name if isinstance(op, (Skippable, RepeatWhile)) else \
                op.kernel.name if isinstance(op, Launch) else getattr(op, "name", op.kind)
        if not isinstance(name, str) or not name or "." in name:
            raise ArgumentError(f"Graph.add: node name {name!r} must be a non-empty string without '.'")
        if any(n.name == name for n in self.nodes):
            raise ArgumentError(f"Graph.add: there is already a node named {name!r}; pass name=...")
        self.nodes.append(Node(name, op, len(self.nodes), self))
        self.built = False
        self.caches = GraphCaches()
        return self

    def plane_name(self, plane) -> str:
        """A name that identifies one plane: the argument name it was first bound under, or
        ``"node.name"`` where two different planes were bound under the same name.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave")
        >>> g.plane_name(y)
        'y'
        """
        labels = {}
        taken = {}
        for node in self.nodes:
            for which in ("reads", "writes"):
                for arg, p in node.bindings(which):
                    if id(p) in labels:
                        continue
                    label = arg if arg not in taken else f"{node.name}.{arg}"
                    labels[id(p)] = label
                    taken[label] = id(p)
        return labels.get(id(plane), "?")

    def add_node(self, node, name=None) -> "Graph":
        """Add a skippable, repeat_while, opaque or reduce node (``add`` takes them too).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> flag = np.ones(1)
        >>> g = vkml.Graph().add_node(vkml.skippable(wave.bind(x=x, k=2.0, y=y), vkml.SkipGuard.nonzero(flag)), name="maybe")
        >>> g.nodes[0].kind
        'skippable'
        """
        return self.add(node, name)

    def node(self, name) -> Node:
        """The node added under ``name``.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave")
        >>> g.node("wave").kind
        'launch'
        """
        for n in self.nodes:
            if n.name == name:
                return n
        raise ArgumentError(f"no node named {name!r}; nodes: {[n.name for n in self.nodes]}")

    @property
    def n(self) -> int:
        """The number of samples (the length of every per-sample plane).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").n
        3
        """
        if not self.nodes:
            raise ArgumentError("Graph.n: the graph has no nodes yet; add kernel.bind(...) first")
        return self.nodes[0].op.n if not self.nodes[0].launches() else self.nodes[0].launches()[0].n

    def _bound_planes(self):
        """Every (node name, binding dict, name, plane) of every node: what build() compiles
        against."""
        out = []
        for node in self.nodes:
            ops = node.launches() or [node.op]
            for op in ops:
                for which in (op.reads, op.writes):
                    out.extend((node.name, which, name, plane) for name, plane in which.items())
        return out

    def written_planes(self):
        """The planes a launch may write (what a refused launch puts back).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build()
        >>> [plane is y for plane in g.written_planes()]
        [True]
        """
        return [plane for node in self.nodes for op in (node.launches() or [node.op])
                for plane in op.writes.values()]

    def check_planes(self, where):
        """Refuse to run on planes that are not what build() saw (resized, reshaped, replaced,
        made read-only): a compiled program would read them at their old size.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build()
        >>> g.check_planes("launch")
        >>> y.resize(4, refcheck=False)
        >>> g.launch()
        Traceback (most recent call last):
            ...
        vkml.errors.ShapeError: launch: plane 'y' changed since build(): its shape was (3,), now (4,); rebuild the graph with build() after replacing/resizing plane 'y' (or write into the plane in place: plane[...] = values)
        """
        # every launch and reverse: the arrays still bound, then plane_signature of each, inlined
        if all(map(operator.is_, map(dict.get, self._bound_dicts, self._bound_names), self._bound_arrays)) \
                and list(map(LAYOUT, self._planes)) == self._layouts \
                and all(map(WRITEABLE, self._written)):
            return
        for node, which, name, plane in self._bound:
            if which.get(name) is not plane:
                raise ShapeError(f"{where}: plane {name!r} of node {node!r} was replaced by another "
                                 f"array since build(); rebuild the graph with build() after "
                                 f"replacing/resizing plane {name!r}")
        for plane, before in zip(self._planes, self._signatures):
            now = plane_signature(plane)
            if now != before:
                raise ShapeError(changed_plane_message(where, self.plane_name(plane), before, now))

    def build(self, record=False) -> "Graph":
        """Check the graph and give every kernel Param a one-cell plane of its own.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.recording
        True
        """
        if not isinstance(record, (bool, np.bool_)):
            raise ArgumentError(f"Graph.build: record must be True or False, got {record!r}")
        if not self.nodes:
            raise ArgumentError("Graph.build: the graph has no nodes; add kernel.bind(...) first")
        frozen = [(node.name, name) for node in self.nodes for op in (node.launches() or [node.op])
                  for name, plane in op.writes.items() if not plane.flags.writeable]
        if frozen:
            raise ArgumentError(f"Graph.build: node {frozen[0][0]!r} writes plane {frozen[0][1]!r}, "
                                "which is read-only; bind a writeable plane")
        ns = {}
        for node in self.nodes:
            size = node.launches()[0].n if node.launches() else node.op.n
            ns.setdefault(size, []).append(node.name)
        if len(ns) > 1:
            raise ShapeError("Graph.build: nodes run over different numbers of samples: " +
                             "; ".join(f"{k} samples: {v}" for k, v in ns.items()))
        cells = {}
        for node in self.nodes:
            for launch in node.launches():
                for p, value in launch.params.items():
                    cells[(node.name, p)] = np.array(value, copy=True).reshape(value.shape)
        bound = self._bound_planes()
        device = self._device_planes(bound)                     # refused before anything changes
        self.cells = cells
        self.caches = GraphCaches()                            # made anew when built
        self.device_planes = device
        self._plane_backend = backends.current() if device else None
        self.mirrors = [(p, d) for p, d in ((p, device[id(p)]) for p in
                                            {id(p): p for *_, p in bound}.values()) if d is not p] \
            if device else []
        self._bound = bound
        _, self._bound_dicts, self._bound_names, self._bound_arrays = \
            (list(column) for column in zip(*self._bound)) if self._bound else ([],) * 4
        self._planes = list({id(p): p for p in self._bound_arrays}.values())
        self._signatures = [plane_signature(p) for p in self._planes]
        self._layouts = [s[:2] for s in self._signatures]
        self._written = list({id(p): p for p in self.written_planes()}.values())
        self.recording = bool(record)
        self.built = True
        return self

    def check_plane_backend(self, where):
        """Refuse to run a graph whose planes live in one backend's device memory (built on the
        cuda backend) on another backend: they would not see each other's values.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build()
        >>> g.check_plane_backend("launch")         # planes in host memory: any backend runs it
        """
        if self.device_planes:
            refuse_other_backend(self._plane_backend, ArgumentError,
                                 f"{where}: this graph was built on the {{owner}} backend, which "
                                 "holds its planes in device memory, but the current backend is "
                                 "{current}; switch back, or read the planes "
                                 "(graph.planes[name].numpy()) and build a graph on this one")

    def _device_planes(self, bound):
        """``{id(bound plane): its device plane}`` when the current backend keeps planes in device
        memory (cuda), else empty.  A NumPy plane is copied to the device once (a plane this
        graph already holds on the device keeps its device plane, so building again loses
        nothing); a device array is taken as it is."""
        backend = backends.current()
        if not backend.keeps_planes_on_device:
            return {}
        old = self.device_planes
        device = {}
        for node, _, name, plane in bound:
            if id(plane) in device:
                continue
            kept = old.get(id(plane))
            if kept is not None and kept.shape == plane.shape and kept.dtype == plane.dtype:
                device[id(plane)] = kept
                continue
            try:
                device[id(plane)] = backend.to_plane(plane)
            except VkmlError as err:
                raise type(err)(f"Graph.build: plane {name!r} of node {node!r}: {err}") from None
        return device

    @property
    def planes(self) -> dict:
        """Every plane of the built graph by name (:meth:`plane_name`).

        On the numpy and cpu backends these are the arrays you bound.  On the cuda backend they
        are the graph's device planes (``DeviceArray``): ``build()`` copied each NumPy array you
        bound to the device once (a device array you bound is used as it is), and launches and
        reverses work on them there, so your NumPy arrays no longer follow the launches.  Read
        a plane on the host with ``graph.planes["y"].numpy()`` (or ``np.asarray``), write one
        with ``graph.planes["x"][...] = values``, or hand it to CuPy or PyTorch without a copy
        (``__cuda_array_interface__``).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build()
        >>> g.launch().planes["y"].round(4)
        array([0.    , 0.8415, 0.9093])
        """
        if not self.built:
            raise ArgumentError("Graph.planes: call build() first")
        return {self.plane_name(p): self.device_planes.get(id(p), p) for p in self._planes}

    # -- running ------------------------------------------------------------------------------
    @property
    def record(self):
        """The Record of the latest recording launch (None before the first).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> g.record.generation, g.record.live
        (1, True)
        """
        return self._record

    def _check_free(self, what):
        rec = self._record
        if rec is not None and rec.readers:
            raise Busy(f"{what}: a reverse is reading the Record of generation {rec.generation}; "
                       "wait for it to return (or keep() the Record first)")
        if self.launching:
            raise Busy(f"{what}: the graph is running launch {self.generation + 1}; wait for it to "
                       "return")

    @boundary
    def launch(self, n=1):
        """Run the graph ``n`` times (at most ``MAX_LAUNCH_RUNS``, 2**31); a recording graph runs
        exactly once per launch and records it.
        All or nothing (:func:`all_or_nothing`): a launch refused part-way leaves every plane,
        the generation and the Record as they were.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> y.round(4)
        array([0.    , 0.8415, 0.9093])
        >>> g.generation
        1
        """
        if not self.built:
            raise ArgumentError("Graph.launch: call build() (or build(record=True)) first")
        if (type(n) is not int and (not isinstance(n, np.integer) or isinstance(n, np.bool_))) or n < 1:
            raise ArgumentError(f"Graph.launch: n (runs) must be a positive int, got {n!r}")
        check_int(n, "n (runs)", "Graph.launch", high=MAX_LAUNCH_RUNS)
        with self._lock:
            self._check_free("launch")
            if self.recording:
                if n != 1:
                    raise RecordError("launch: a record=True graph records one run per launch(); call "
                                      "launch() once per run (launch(n) would mix runs in one Record)")
                rec = self._record
                if rec is not None and rec.live:
                    raise RecordError(f"launch: the Record of generation {rec.generation} is still "
                                      "live; reverse it first, or keep a copy with record.keep()")
            self.check_planes("launch")
            if self.device_planes:                   # (a host backend's launch pays no call for it)
                self.check_plane_backend("launch")
            workers = threads()                # a bad VKML_THREADS is refused before anything runs
            self.launching = True
        try:
            record = run_launches(self, n, workers)
        finally:
            self.launching = False
        if self.recording:
            self._record = record
        return self

    def update(self, mapping=None, **values):
        """Change Params between launches: ``update(k=0.7)`` sets every node's ``k``,
        ``update({"join.k": 0.7})`` one node's.  A copy into the Param cells: nothing is rebuilt.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> g.record.keep()
        <vkml Record generation 1 (kept): 1 steps, 56 bytes copied>
        >>> g.update(k=1.0)
        <vkml.Graph: wave>
        >>> g.launch()
        <vkml.Graph: wave>
        >>> y.round(4)
        array([0.    , 0.4794, 0.8415])
        """
        if not self.built:
            raise ArgumentError("Graph.update: call build() first")
        with self._lock:
            return self._update(mapping, values)

    def _update(self, mapping, values):
        self._check_free("update")
        rec = self._record
        if rec is not None and rec.live:
            raise RecordError(f"update: the Record of generation {rec.generation} is still live; "
                              "reverse it (or keep() it) first, so a reverse sees the Params its "
                              "launch used")
        if mapping is not None and not isinstance(mapping, Mapping):
            raise ArgumentError(f"update: pass Params as update(k=0.7) or update({{'node.k': 0.7}}), "
                                f"got {type(mapping).__name__}")
        items = dict(mapping or {})
        items.update(values)
        plan = []
        for key, value in items.items():
            if not isinstance(key, str):
                raise ArgumentError(f"update: Param names are strings like 'k' or 'node.k', got {key!r}")
            if "." in key:
                node, p = key.split(".", 1)
                targets = [(node, p)] if (node, p) in self.cells else []
            else:
                targets = [k for k in self.cells if k[1] == key]
            if not targets:
                raise ArgumentError(f"update: no Param {key!r}; Params: "
                                    f"{sorted({p for _, p in self.cells} | {f'{n}.{p}' for n, p in self.cells})}")
            arr = _param_value(key, value)
            for t in targets:
                cell = self.cells[t]
                if arr.shape != cell.shape and arr.size != cell.size:
                    raise ShapeError(f"update: Param {t[0]}.{t[1]} holds shape {cell.shape}, got {arr.shape}")
                if cell.dtype.kind in "biu" and arr.dtype.kind == "f":
                    raise DTypeError(f"update: Param {t[0]}.{t[1]} holds {cell.dtype} values, got "
                                     f"{arr.dtype}; pass whole numbers")
                plan.append((cell, arr))
        for cell, arr in plan:                      # every value checked before any is written
            cell[...] = arr.reshape(cell.shape)
        return self

    # -- reversing (what vkml.diff.Reverse calls; see reversible.py) ----------------------------
    def check_reversible(self, vjps):
        """Refuse, before anything runs, a reverse this graph cannot take: a graph not built with
        ``record=True``, or a node whose derivative vkml cannot know and ``vjps`` (node name ->
        vjp) does not give.  :class:`vkml.diff.Reverse` calls it once, when it is made.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.check_reversible({})                      # every node's derivative is derived
        >>> vkml.Graph().add(wave.bind(x=x, k=2.0, y=y)).build().check_reversible({})
        Traceback (most recent call last):
            ...
        vkml.errors.ArgumentError: Reverse: the graph was built without record=True; build it with build(record=True) so launches keep what the reverse needs
        """
        check_graph_reversible(self, vjps)

    def bitwise(self):
        """Per gradient name (an input, a Param, and each as ``node.name``): True where its
        gradient has the same bits on every backend and thread count, False where a Param
        reaches a gather (a table read by index), whose gradient is a scatter-add across samples.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> sorted(g.bitwise().items())
        [('k', True), ('wave.k', True), ('wave.x', True), ('x', True)]
        """
        return graph_bitwise(self)

    def prepare_reverse(self, record, seeds, wrt, strict):
        """Check one reverse call of ``record`` (see ``reversible.py``): it is this graph's and
        current, its planes unchanged since the launch, the seeds name outputs, ``wrt`` names
        inputs and Params (bitwise ones with ``strict``).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> g.prepare_reverse(g.record, {"y": np.ones(3)}, ["k"], strict=True).wrt
        ['k']
        >>> g.prepare_reverse(g.record, {"y": np.ones(3)}, ["q"], strict=False)
        Traceback (most recent call last):
            ...
        vkml.errors.ArgumentError: reverse: wrt names ['q'] are not inputs or Params; choose from ['k', 'wave.k', 'wave.x', 'x']
        """
        return graph_reverse.prepare(self, record, seeds, wrt, strict)

    def reading(self, record):
        """``record`` counts one more reader inside the block; no launch can start (or be under
        way) meanwhile, unless the Record was kept (it then reads its own copies).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> with g.reading(g.record) as record:
        ...     print(record.readers)
        1
        >>> g.record.readers
        0
        """
        check_sweep("Graph.reading", self._owns(record), None, None, None, None)
        return self._reading(record)

    @contextlib.contextmanager
    def _reading(self, record):
        with self._lock:
            if self.launching and not record.kept:
                raise Busy(f"reverse: the graph is running launch {self.generation + 1}, which "
                           "overwrites the planes this Record reads; reverse after launch() "
                           "returns (or keep() the Record first)")
            record.check_current()
            record.readers += 1
        try:
            yield record
        finally:
            with self._lock:
                record.readers -= 1

    def sweep(self, record, prepared, vjps, workspace):
        """Every gradient of ``record`` in one sweep of its tape (see ``reversible.py``).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> call = g.prepare_reverse(g.record, {"y": np.ones(3)}, None, strict=False)
        >>> with g.reading(g.record):
        ...     grads = g.sweep(g.record, call, {}, vkml.diff.Workspace())
        >>> grads["x"].round(4)
        array([ 2.    ,  1.0806, -0.8323])
        """
        vjps = check_sweep("Graph.sweep", self._owns(record), prepared,
                           graph_reverse.GraphReverseCall, vjps, workspace)
        return graph_reverse.sweep(record, prepared, vjps, workspace)

    def _owns(self, record) -> bool:
        return isinstance(record, Record) and record.graph is self

    def reverse(self, record, seeds, wrt=None, vjps=None, strict=False):
        """Every gradient of ``record`` (a Record of this graph's) for the cotangents ``seeds``
        on its outputs, in one sweep of the tape, as :class:`vkml.diff.Gradients`: the same call
        as ``vkml.diff.Reverse(graph, vjps=vjps, strict=strict)(record, seeds, wrt=wrt)``.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> grads = g.reverse(g.record, {"y": np.ones(3)})
        >>> bool(np.isclose(grads["k"], np.sum(np.cos(2.0 * x) * x)))   # d/dk sum(sin(k x))
        True
        """
        return Reverse(self, vjps=vjps, strict=strict)(record, seeds, wrt=wrt)

    def __repr__(self):
        return f"<vkml.Graph: {' -> '.join(n.name for n in self.nodes) or 'empty'}>"


def _param_value(key, value):
    """A Param's new value as an array of real numbers; None, strings and objects are refused
    (None would become NaN in a float cell)."""
    if value is None or isinstance(value, (str, bytes)):
        raise ArgumentError(f"update: Param {key!r} must be a number or an array of numbers, got "
                            f"{type(value).__name__}")
    try:
        arr = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.dtype.kind not in "biuf":
        raise ArgumentError(f"update: Param {key!r} must be a number or an array of numbers, got "
                            f"{type(value).__name__}")
    return arr
