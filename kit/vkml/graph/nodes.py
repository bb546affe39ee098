"""The kinds of node a Graph holds besides kernel launches -- skippable and repeated members with
their guards, opaque Python nodes and reductions -- and ``Node``, a named entry of the graph."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..errors import ArgumentError, RefusedError, ShapeError
from .kernel import Launch
from .treesum import tree_sum
from ..validate import check_choice
from .execute import per_sample_values, user_error


class SkipGuard:
    """The condition of a ``skippable`` or ``repeat_while``: a one-value cell read at launch.

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> flag = np.zeros(1)
    >>> maybe = vkml.skippable(wave.bind(x=x, k=2.0, y=y), vkml.SkipGuard.nonzero(flag))
    >>> g = vkml.Graph().add(maybe, name="maybe").build()
    >>> g.launch()
    <vkml.Graph: maybe>
    >>> y
    array([0., 0., 0.])
    """

    def __init__(self, cell, how="nonzero"):
        if not isinstance(cell, np.ndarray) or cell.size < 1 or cell.dtype.kind not in "biuf":
            got = f"an array of {cell.dtype} {cell.shape}" if isinstance(cell, np.ndarray) else \
                type(cell).__name__
            raise ArgumentError("SkipGuard: the guard must be a NumPy array cell of numbers, e.g. "
                                f"np.array([1], dtype='uint32'); got {got}")
        how = check_choice(how, ("nonzero",), "how", "SkipGuard")
        self.cell = cell
        self.how = how

    @classmethod
    def nonzero(cls, cell):
        """True while ``cell`` (any element) is non-zero.

        >>> flag = np.array([1.0])
        >>> vkml.SkipGuard.nonzero(flag).how
        'nonzero'
        """
        return cls(cell, "nonzero")

    def __call__(self) -> bool:
        return bool(np.any(self.cell != 0))

    def __repr__(self):
        return f"SkipGuard.nonzero(cell of {self.cell.shape})"


def as_launch(member, what):
    """A Launch from a Launch or its bound ``.launch`` method (both spellings are accepted)."""
    if isinstance(member, Launch):
        return member
    owner = getattr(member, "__self__", None)
    if isinstance(owner, Launch):
        return owner
    return member


class Skippable:
    """A member that runs only while its guard holds; its reverse uses the recorded guard.

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> maybe = vkml.skippable(wave.bind(x=x, k=2.0, y=y), vkml.SkipGuard.nonzero(np.ones(1)))
    >>> isinstance(maybe, vkml.graph.Skippable)
    True
    """

    kind = "skippable"

    def __init__(self, member, guard):
        self.member = as_launch(member, "skippable")
        if not isinstance(self.member, Launch):
            raise ArgumentError("skippable: the member must be a kernel launch (kernel.bind(...))")
        if not isinstance(guard, (SkipGuard, np.ndarray)):
            raise ArgumentError(f"skippable: the guard must be vkml.SkipGuard.nonzero(cell) or a NumPy "
                                f"cell, got {type(guard).__name__}")
        self.guard = guard if isinstance(guard, SkipGuard) else SkipGuard.nonzero(guard)


class RepeatWhile:
    """A member repeated while its guard holds, up to ``max_iters`` (the most a reverse unrolls).

    >>> @vkml.kernel
    ... def halve(s, k: vkml.Param):
    ...     return {"s": s * k}
    ...
    >>> loop = vkml.repeat_while(halve.bind(s=np.ones(2), k=0.5), vkml.SkipGuard.nonzero(np.ones(1)), max_iters=4)
    >>> isinstance(loop, vkml.graph.RepeatWhile), loop.max_iters
    (True, 4)
    """

    kind = "repeat_while"

    def __init__(self, member, guard, max_iters):
        self.member = as_launch(member, "repeat_while")
        if not isinstance(self.member, Launch):
            # refused here, not at the reverse: the loop's record (checkpoints of the state a
            # launch updates in place) and its reverse (that launch's vjp) need a kernel launch
            what = f"opaque node {self.member.name!r}" if isinstance(self.member, Opaque) else \
                type(self.member).__name__
            raise RefusedError(f"repeat_while: the member ({what}) is not a kernel launch, so the "
                               "loop cannot be recorded or reversed; make the body one "
                               "kernel.bind(...) launch that updates its state in place")
        if callable(guard) and not isinstance(guard, SkipGuard):
            self.guard = guard
        elif isinstance(guard, (SkipGuard, np.ndarray)):
            self.guard = guard if isinstance(guard, SkipGuard) else SkipGuard.nonzero(guard)
        else:
            raise ArgumentError(f"repeat_while: the guard must be vkml.SkipGuard.nonzero(cell), a NumPy "
                                f"cell or a function returning a bool, got {type(guard).__name__}")
        if not isinstance(max_iters, int) or isinstance(max_iters, bool) or max_iters < 1:
            raise ArgumentError(f"repeat_while: max_iters must be a positive int, got {max_iters!r}")
        self.max_iters = max_iters
        self.window = max(1, math.isqrt(max_iters - 1) + 1)


class Opaque:
    """A user model node: ``fn(reads) -> {name: array}`` written into ``writes``.

    vkml cannot see inside it, so a reverse needs its vjp (``vjps={name: vjp}``).

    >>> x, u = np.array([1.0, 2.0]), np.zeros(2)
    >>> node = vkml.graph.opaque(lambda r: {"u": r["x"] ** 3}, reads={"x": x}, writes={"u": u}, name="cube")
    >>> g = vkml.Graph().add(node).build(record=True)
    >>> g.launch()
    <vkml.Graph: cube>
    >>> cube_vjp = lambda primals, cts: {"x": 3 * primals["x"] ** 2 * cts["u"]}
    >>> vkml.diff.reverse(g.record, {"u": np.ones(2)}, vjps={"cube": cube_vjp})["x"]
    array([ 3., 12.])
    """

    kind = "opaque"

    def __init__(self, fn, reads, writes, name=None):
        if not callable(fn):
            raise ArgumentError(f"opaque: fn must be callable, got {type(fn).__name__}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ArgumentError(f"opaque: name must be a non-empty string, got {name!r}")
        label = name or getattr(fn, "__name__", "opaque")
        for what, d in (("reads", reads), ("writes", writes)):
            if not isinstance(d, Mapping) or not all(isinstance(k, str) for k in d) or \
                    not all(isinstance(v, np.ndarray) for v in d.values()):
                raise ArgumentError(f"opaque node {label!r}: {what} must be a dict of name (str) -> "
                                    f"NumPy plane, got {type(d).__name__}")
        if not writes:
            raise ArgumentError(f"opaque node {label!r}: writes is empty; name the planes it writes: "
                                "writes={'f': plane}")
        planes = list(reads.items()) + list(writes.items())
        bad = [k for k, v in planes if v.ndim == 0 or v.dtype.kind not in "biuf"]
        if bad:
            raise ShapeError(f"opaque node {label!r}: plane {bad[0]!r} must be an array of numbers with "
                             "one row per sample (shape (n,) or (n, d))")
        rows = {v.shape[0] for _, v in planes}
        if len(rows) > 1:
            raise ShapeError(f"opaque node {label!r}: planes have different numbers of rows "
                             + ", ".join(f"{k}: {v.shape[0]}" for k, v in planes))
        frozen = [k for k, v in writes.items() if not v.flags.writeable]
        if frozen:
            raise ArgumentError(f"opaque node {label!r}: write plane {frozen[0]!r} is read-only")
        self.fn, self.reads, self.writes = fn, dict(reads), dict(writes)
        self.name = label
        self.n = rows.pop()

    def run(self, reads=None):
        """``fn`` on the planes (or on ``reads``): its outputs, checked against the write planes
        before any is written.

        >>> x, u = np.array([1.0, 2.0]), np.zeros(2)
        >>> node = vkml.graph.opaque(lambda r: {"u": r["x"] ** 3}, reads={"x": x}, writes={"u": u})
        >>> node.run()
        {'u': array([1., 8.])}
        """
        try:
            out = self.fn(dict(reads if reads is not None else self.reads))
        except Exception as err:     # noqa: BLE001 - the user's model: named, and nothing written
            raise user_error(err, f"opaque node {self.name!r}")
        if not isinstance(out, Mapping) or set(out) != set(self.writes):
            raise ArgumentError(f"opaque node {self.name!r} must return a dict with exactly "
                                f"{sorted(self.writes)}, got "
                                f"{sorted(out) if isinstance(out, Mapping) else type(out).__name__}")
        rows = next(iter(reads.values())).shape[0] if reads else self.n
        return {k: per_sample_values(v, (rows,) + self.writes[k].shape[1:], "biuf",
                                     f"opaque node {self.name!r}: output {k!r}")
                for k, v in out.items()}


class Reduce:
    """``dst[...] = op(src)`` over samples; ``"sum"`` uses the canonical tree and reverses,
    ``"max"``/``"min"``/``"all"``/``"any"`` do not (a tie has no single derivative).

    >>> node = vkml.graph.reduce(np.array([1.0, 5.0]), np.zeros(1), "max")
    >>> node.op
    'max'
    """

    kind = "reduce"
    OPS = ("sum", "max", "min", "all", "any")

    def __init__(self, src, dst, op="sum"):
        if not isinstance(op, str) or op not in self.OPS:
            raise ArgumentError(f"reduce: op must be one of {self.OPS}, got {op!r}")
        if not isinstance(src, np.ndarray) or not isinstance(dst, np.ndarray):
            raise ArgumentError("reduce: src and dst must be NumPy planes")
        if src.ndim == 0 or src.dtype.kind not in "biuf" or dst.dtype.kind not in "biuf":
            raise ShapeError(f"reduce: src must be a plane of numbers with one row per sample and dst "
                             f"a cell of numbers; got src {src.dtype} {src.shape}, dst {dst.dtype}")
        if not dst.flags.writeable:
            raise ArgumentError("reduce: dst is read-only")
        if dst.shape != src.shape[1:] and dst.shape != (1,) + src.shape[1:]:
            raise ShapeError(f"reduce: dst {dst.shape} must hold one sample's value {src.shape[1:]}")
        self.src, self.dst, self.op = src, dst, op
        self.reads, self.writes = {"src": src}, {"dst": dst}
        self.n = src.shape[0]

    def compute(self, src):
        """``op`` of ``src`` over samples (axis 0), as the node writes it into ``dst``.

        >>> vkml.graph.reduce(np.ones(3), np.zeros(1)).compute(np.array([1.0, 2.0, 3.0]))
        array(6.)
        """
        if self.op == "sum":
            return tree_sum(src)
        return {"max": np.max, "min": np.min, "all": np.all, "any": np.any}[self.op](src, axis=0)


def skippable(member, guard) -> Skippable:
    """``member`` runs only while ``guard`` (``SkipGuard.nonzero(cell)``) holds at launch.

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> flag = np.ones(1)
    >>> maybe = vkml.skippable(wave.bind(x=x, k=2.0, y=y), vkml.SkipGuard.nonzero(flag))
    >>> vkml.Graph().add(maybe, name="maybe").build().launch()
    <vkml.Graph: maybe>
    >>> y.round(4)
    array([0.    , 0.8415, 0.9093])
    """
    return Skippable(member, guard)


def repeat_while(member, guard, max_iters=100) -> RepeatWhile:
    """``member`` runs again while ``guard`` holds, at most ``max_iters`` times.

    >>> @vkml.kernel
    ... def halve(s, k: vkml.Param):
    ...     return {"s": s * k}
    ...
    >>> s, big = np.array([8.0, 4.0]), np.ones(1)
    >>> loop = vkml.repeat_while(halve.bind(s=s, k=0.5), vkml.SkipGuard.nonzero(big), max_iters=3)
    >>> g = vkml.Graph().add(loop, name="loop").build(record=True)
    >>> g.launch()
    <vkml.Graph: loop>
    >>> s, g.record.iterations
    (array([1. , 0.5]), {'loop': 3})
    """
    return RepeatWhile(member, guard, max_iters)


def opaque(fn, reads, writes, name=None) -> Opaque:
    """A user model node (see :class:`Opaque`).

    >>> x, u = np.array([1.0, 2.0]), np.zeros(2)
    >>> node = vkml.graph.opaque(lambda r: {"u": r["x"] ** 3}, reads={"x": x}, writes={"u": u}, name="cube")
    >>> vkml.Graph().add(node).build().launch()
    <vkml.Graph: cube>
    >>> u
    array([1., 8.])
    """
    return Opaque(fn, reads, writes, name)


def reduce(src, dst, op="sum") -> Reduce:
    """A node summing (or taking the max/min/all/any of) a plane over samples into a cell.

    >>> y, total = np.array([1.0, 2.0, 3.0]), np.zeros(1)
    >>> vkml.Graph().add(vkml.graph.reduce(y, total), name="total").build().launch()
    <vkml.Graph: total>
    >>> total
    array([6.])
    """
    return Reduce(src, dst, op)


class Node:
    """A named entry of a Graph."""

    __slots__ = ("name", "op", "index", "graph")

    def __init__(self, name, op, index, graph=None):
        self.name, self.op, self.index, self.graph = name, op, index, graph

    @property
    def kind(self):
        return self.op.kind

    def launches(self):
        """The kernel launches this node may run (its member for conditionals)."""
        if isinstance(self.op, Launch):
            return [self.op]
        if isinstance(self.op, (Skippable, RepeatWhile)):
            return [self.op.member]
        return []

    def bindings(self, which):
        """(argument name, plane) pairs this node reads (``"reads"``) or writes."""
        ops = self.launches()
        return list(getattr(ops[0] if ops else self.op, which).items())

    @property
    def reads(self):
        """Names of the planes this node reads (as the graph names them: see ``Graph.plane_name``)."""
        return [self.graph.plane_name(p) if self.graph else n for n, p in self.bindings("reads")]

    @property
    def writes(self):
        return [self.graph.plane_name(p) if self.graph else n for n, p in self.bindings("writes")]

    @property
    def params(self):
        ops = self.launches()
        return dict(ops[0].params) if ops else {}

    def __repr__(self):
        return f"<node {self.name} ({self.kind})>"
