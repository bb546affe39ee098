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
back around each launch, explicitly (guards that are cells do not).
"""

from __future__ import annotations

import contextvars
import math
import operator
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import backends
from ..backends import ExecutionFailure
from ..backends.base import threads  # noqa: F401  (the graph modules' name for it)
from ..errors import (ArgumentError, Busy, DTypeError, ExecutionError, RecordError, RefusedError,
    ShapeError, VkmlError, boundary)
from .kernel import Kernel, Launch
from ..threadsafe import Cache
from .reversible import Reversible
from .treesum import MIN_PASS, tree_sum
from ..validate import check_choice, check_int

#: The most runs one ``launch(n)`` takes (2**31): far more than any run finishes, so a larger n
#: is a mistake, refused rather than left running for ever.
MAX_LAUNCH_RUNS = 2 ** 31


def _sibling(name):
    """``vkml.graph.<name>``, a module that imports this one (a cycle), from ``sys.modules``: the
    package imports it before any graph can run, and an import statement in a method called per
    launch or reverse costs about a microsecond each time."""
    return sys.modules[f"{__package__}.{name}"]


# -- all or nothing ---------------------------------------------------------------------------

class all_or_nothing:          # noqa: N801 - used as a ``with`` statement, like a function
    """The one rule every launch, update, reverse and simulation run of the graph layer follows:
    a call that is refused changes nothing.

    A call checks what it can before it writes anything.  What can only fail part-way (an index
    out of range inside a kernel, a user's opaque node or guard raising) runs inside this
    block: it copies ``planes`` (the arrays the call may write) and remembers ``restore``
    (``(object, attribute)`` pairs: generations, Records), and if anything raises -- a
    KeyboardInterrupt too (Ctrl-C stops a long compiled call part-way) -- puts every one of
    them back before the error leaves, so no plane, Record, generation or cache is left
    half-updated.  An error that is not a :class:`vkml.VkmlError` (a user's function raised
    it) leaves as an :class:`vkml.ExecutionError` naming it, with the original as its cause; a
    KeyboardInterrupt (any BaseException that is not an Exception) leaves as it is."""

    __slots__ = ("backups", "attrs")

    def __init__(self, planes=(), restore=()):
        self.backups = [(p, p.copy()) for p in {id(p): p for p in planes}.values()]  # each plane once
        self.attrs = [(obj, name, getattr(obj, name)) for obj, name in restore]

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None:
            return False
        for plane, copy in self.backups:
            plane[...] = copy
        for obj, name, value in self.attrs:
            setattr(obj, name, value)
        if isinstance(err, Exception) and not isinstance(err, VkmlError):
            raise ExecutionError(f"{type(err).__name__}: {err} (nothing was changed)") from err
        return False


def execution_error(failure, eqns, where) -> ExecutionError:
    """The error a failing equation of a graph program raises: the node (``where``), the
    equation and what went wrong (an index out of range, ...)."""
    eqn = eqns[failure.index] if 0 <= failure.index < len(eqns) else None
    what = f"{eqn.describe()} failed" if eqn is not None else "its program failed"
    return ExecutionError(f"{where}: {what}: {failure.error}; nothing was written")


def user_error(err, where) -> ExecutionError:
    """A user's function (an opaque node, its vjp, a guard) raised ``err``: the same error,
    named after the node, as a VkmlError (the original is its cause); a VkmlError as it is."""
    if isinstance(err, VkmlError):
        return err
    new = ExecutionError(f"{where} raised {type(err).__name__}: {err}")
    new.__cause__, new.__suppress_context__ = err, True
    return new


def per_sample_values(value, shape, kinds, where):
    """``value`` (what a user's function returned) as an array of ``shape`` whose dtype kind is
    one of ``kinds`` (``"f"``: floats; ints and bools are accepted for floats, as exact zeros and
    counts are); anything else (a string, None, a wrong shape) is refused naming ``where``."""
    arr = None
    if not isinstance(value, (str, bytes)) and value is not None:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError):
            arr = None
    ok_kinds = kinds + ("biu" if "f" in kinds else "")
    if arr is None or arr.dtype.kind not in ok_kinds:
        got = f"an array of {arr.dtype}" if arr is not None else type(value).__name__
        raise ArgumentError(f"{where} must be an array of {'floats' if kinds == 'f' else 'numbers'} "
                            f"of shape {shape} (one row per sample), got {got}")
    if arr.shape != shape:
        try:
            arr = np.array(np.broadcast_to(arr, shape))
        except ValueError:
            raise ShapeError(f"{where} must be an array of shape {shape} (one row per sample), got "
                             f"shape {arr.shape}") from None
    return arr.astype(np.float64) if kinds == "f" and arr.dtype.kind != "f" else arr


# -- the planes a built graph runs on ---------------------------------------------------------

def plane_signature(plane):
    """What a compiled launch relies on about a plane: its shape and dtype (a program is traced
    and compiled for them: a plane resized in place would be read at its old size) and whether
    it may be written.  Not its strides (every backend reads a plane of any strides correctly,
    and setting them in place is deprecated in NumPy) nor where its memory is (every launch hands
    the arrays themselves to the program, so memory that moved -- resized away and back -- is
    read where it now is); reading the address would cost more than all the rest, every launch."""
    return plane.shape, plane.dtype, plane.flags.writeable


_LAYOUT = operator.attrgetter("shape", "dtype")
_WRITEABLE = operator.attrgetter("flags.writeable")


def changed_plane_message(where, name, before, now, since="build()",
                          fix="rebuild the graph with build()") -> str:
    """Why plane ``name`` no longer is what a compiled program was built for, and the fix."""
    what = ("its shape", "its dtype", "whether it is writeable")
    diffs = [f"{what[i]} was {before[i]}, now {now[i]}" for i in range(len(what)) if before[i] != now[i]]
    return (f"{where}: plane {name!r} changed since {since}: {'; '.join(diffs)}; {fix} after "
            f"replacing/resizing plane {name!r} (or write into the plane in place: plane[...] = values)")


def chunk_size_for(n: int, workers: int) -> int:
    """Aligned chunks of ``256 * 2**q`` samples, about one per worker."""
    size = MIN_PASS
    while size * workers < n:
        size *= 2
    return size


_POOL = {}


def _pool(workers):
    if workers not in _POOL:
        _POOL[workers] = ThreadPoolExecutor(workers, thread_name_prefix="vkml")
    return _POOL[workers]


def run_batched(batch, n, args, batched_flags, into=None):
    """Run a batched per-sample program over ``n`` samples, split over ``VKML_THREADS`` threads.
    ``into``: one destination array (or None) per result, as ``Backend.run`` takes them; each
    thread writes its own rows of them.

    Samples never mix, so the split changes no bit of any per-sample result."""
    workers = threads()
    if workers == 1 or n < 2 * MIN_PASS:
        return batch.run(n, args, into=into)
    size = chunk_size_for(n, workers)
    bounds = [(s, min(s + size, n)) for s in range(0, n, size)]

    def part(b):
        s, e = b
        rows = None if into is None else [None if d is None else d[s:e] for d in into]
        return batch.run(e - s, [a[s:e] if f else a for a, f in zip(args, batched_flags)], into=rows)

    # each part runs with the caller's modes (its backend: one chosen with use_backend too)
    contexts = [contextvars.copy_context() for _ in bounds]
    parts = list(_pool(workers).map(lambda c, b: c.run(part, b), contexts, bounds))
    return [into[i] if into is not None and into[i] is not None else
            np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]


def run_named(batch, n, args, batched_flags, where, into=None):
    """:func:`run_batched`, with a failing equation reported as an :class:`vkml.ExecutionError`
    naming ``where`` (the node or kernel) and the equation."""
    try:
        return run_batched(batch, n, args, batched_flags, into)
    except ExecutionFailure as failure:
        raise execution_error(failure, batch.program(n).eqns, where) from failure.error


# -- guards and node kinds ------------------------------------------------------------------

class SkipGuard:
    """The condition of a ``skippable`` or ``repeat_while``: a one-value cell read at launch.

    >>> @vkml.kernel
    ... def wave(x, k: vkml.Param):
    ...     return {"y": vkml.sin(k * x)}
    ...
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


def _as_launch(member, what):
    """A Launch from a Launch or its bound ``.launch`` method (both spellings are accepted)."""
    if isinstance(member, Launch):
        return member
    owner = getattr(member, "__self__", None)
    if isinstance(owner, Launch):
        return owner
    return member


class Skippable:
    """A member that runs only while its guard holds; its reverse uses the recorded guard.

    >>> @vkml.kernel
    ... def wave(x, k: vkml.Param):
    ...     return {"y": vkml.sin(k * x)}
    ...
    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> maybe = vkml.skippable(wave.bind(x=x, k=2.0, y=y), vkml.SkipGuard.nonzero(np.ones(1)))
    >>> isinstance(maybe, vkml.graph.Skippable)
    True
    """

    kind = "skippable"

    def __init__(self, member, guard):
        self.member = _as_launch(member, "skippable")
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
        self.member = _as_launch(member, "repeat_while")
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

    >>> @vkml.kernel
    ... def wave(x, k: vkml.Param):
    ...     return {"y": vkml.sin(k * x)}
    ...
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


# -- the graph ------------------------------------------------------------------------------

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


class GraphCaches:
    """What a graph derives from its nodes once and reuses every launch and reverse.

    Owned by the graph (``graph._caches``) and made anew whenever its nodes change (``add``)
    or it is built (``build``), so nothing derived from an older structure survives; emptied by
    ``vkml.clear_caches()`` and bounded like every vkml cache: each keeps at most
    ``vkml.cache_limit()`` entries (default 1024), the least recently used going first.

    - ``launch_plans``: the fused launch's program and tape (``record.LaunchPlan``), one per
      recording mode and backend;
    - ``reverse_plans``: the fused reverse's program (``diff.ReversePlan``), one per set of
      seeded outputs, backend and shape of the tape (which members a launch skipped);
    - ``structure``: facts about the nodes found once (the name tables a reverse resolves seeds
      with, whether a launch can fail part-way, which gradients are bitwise): a handful.
    """

    __slots__ = ("launch_plans", "reverse_plans", "structure")

    def __init__(self):
        self.launch_plans = Cache("graph launch plans")
        self.reverse_plans = Cache("graph reverse plans")
        self.structure = Cache("graph structure")


def refuse_other_backend(owner, error, message):
    """Raise ``error(message)`` (``{owner}`` and ``{current}`` filled with the backends' names)
    when the current backend is not ``owner``, the one holding a graph's or a simulation's planes
    in its device memory: another backend would not see their values."""
    current = backends.current()
    if current is not owner:
        raise error(message.format(owner=owner.name, current=current.name))


class Graph(Reversible):
    """Per-sample kernels bound to planes, run in the order added (see the module docstring).

    >>> @vkml.kernel
    ... def wave(x, k: vkml.Param):
    ...     return {"y": vkml.sin(k * x)}
    ...
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
        self._built = False
        self.recording = False
        self.generation = 0
        self.cells = {}
        self._record = None
        #: guards the hand-over between launches and reverses: a launch is claimed, and a reverse
        #: registers as a reader, under this lock, so neither can start inside the other
        self._lock = threading.Lock()
        self._launching = False
        self._caches = GraphCaches()
        #: on a backend that keeps planes in device memory: id of each bound plane -> its device
        #: plane, and the (bound NumPy array, device plane) pairs (``build``); empty otherwise
        self._device = {}
        self._plane_backend = None
        self._mirrors = []

    def add(self, bound, name=None) -> "Graph":
        """Add a launch node (``kernel.bind(...)``), a skippable/repeat_while, an opaque or reduce node.

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave")
        >>> [node.name for node in g.nodes]
        ['wave']
        """
        if isinstance(bound, Kernel):
            raise ArgumentError(f"Graph.add: kernel {bound.name} is not bound; add "
                                f"{bound.name}.bind(...) with its planes and Params")
        op = _as_launch(bound, "add")
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
        self._built = False
        self._caches = GraphCaches()
        return self

    def plane_name(self, plane) -> str:
        """A name that identifies one plane: the argument name it was first bound under, or
        ``"node.name"`` where two different planes were bound under the same name.

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
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

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> flag = np.ones(1)
        >>> g = vkml.Graph().add_node(vkml.skippable(wave.bind(x=x, k=2.0, y=y), vkml.SkipGuard.nonzero(flag)), name="maybe")
        >>> g.nodes[0].kind
        'skippable'
        """
        return self.add(node, name)

    def node(self, name) -> Node:
        """The node added under ``name``.

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
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

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
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

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
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

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
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
                and list(map(_LAYOUT, self._planes)) == self._layouts \
                and all(map(_WRITEABLE, self._written)):
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

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
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
        self._caches = GraphCaches()                            # made anew when built
        self._device = device
        self._plane_backend = backends.current() if device else None
        self._mirrors = [(p, d) for p, d in ((p, device[id(p)]) for p in
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
        self._built = True
        return self

    def check_plane_backend(self, where):
        """Refuse to run a graph whose planes live in one backend's device memory (built on the
        cuda backend) on another backend: they would not see each other's values.

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build()
        >>> g.check_plane_backend("launch")         # planes in host memory: any backend runs it
        """
        if self._device:
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
        old = getattr(self, "_device", None) or {}
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

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build()
        >>> g.launch().planes["y"].round(4)
        array([0.    , 0.8415, 0.9093])
        """
        if not self._built:
            raise ArgumentError("Graph.planes: call build() first")
        return {self.plane_name(p): self._device.get(id(p), p) for p in self._planes}

    # -- running ------------------------------------------------------------------------------
    @property
    def record(self):
        """The Record of the latest recording launch (None before the first).

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
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
        if rec is not None and rec._readers:
            raise Busy(f"{what}: a reverse is reading the Record of generation {rec.generation}; "
                       "wait for it to return (or keep() the Record first)")
        if self._launching:
            raise Busy(f"{what}: the graph is running launch {self.generation + 1}; wait for it to "
                       "return")

    @boundary
    def launch(self, n=1):
        """Run the graph ``n`` times (at most ``MAX_LAUNCH_RUNS``, 2**31); a recording graph runs
        exactly once per launch and records it.
        All or nothing (:func:`all_or_nothing`): a launch refused part-way leaves every plane,
        the generation and the Record as they were.

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> y.round(4)
        array([0.    , 0.8415, 0.9093])
        >>> g.generation
        1
        """
        if not self._built:
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
            if self._device:                   # (a host backend's launch pays no call for it)
                self.check_plane_backend("launch")
            workers = threads()                # a bad VKML_THREADS is refused before anything runs
            self._launching = True
        try:
            _sibling("record").run_launches(self, n, workers)
        finally:
            self._launching = False
        return self

    def update(self, mapping=None, **values):
        """Change Params between launches: ``update(k=0.7)`` sets every node's ``k``,
        ``update({"join.k": 0.7})`` one node's.  A copy into the Param cells: nothing is rebuilt.

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
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
        if not self._built:
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

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.check_reversible({})                      # every node's derivative is derived
        >>> vkml.Graph().add(wave.bind(x=x, k=2.0, y=y)).build().check_reversible({})
        Traceback (most recent call last):
            ...
        vkml.errors.ArgumentError: Reverse: the graph was built without record=True; build it with build(record=True) so launches keep what the reverse needs
        """
        from .diff import check_graph_reversible  # local: diff imports graph (a module-level cycle)
        check_graph_reversible(self, vjps)

    def bitwise(self):
        """Per gradient name (an input, a Param, and each as ``node.name``): True where its
        gradient has the same bits on every backend and thread count, False where a Param
        reaches a gather (a table read by index), whose gradient is a scatter-add across samples.

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> sorted(g.bitwise().items())
        [('k', True), ('wave.k', True), ('wave.x', True), ('x', True)]
        """
        from .diff import graph_bitwise  # local: diff imports graph (a module-level cycle)
        return graph_bitwise(self)

    def reverse(self, record, seeds, wrt=None, vjps=None, strict=False, lock=None):
        """Every gradient of ``record`` (a Record of this graph's) for the cotangents ``seeds``
        on its outputs, in one sweep of the tape, as :class:`vkml.diff.Gradients`: what
        :func:`vkml.diff.reverse` calls for a graph's Record.

        >>> @vkml.kernel
        ... def wave(x, k: vkml.Param):
        ...     return {"y": vkml.sin(k * x)}
        ...
        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> grads = g.reverse(g.record, {"y": np.ones(3)})
        >>> bool(np.isclose(grads["k"], np.sum(np.cos(2.0 * x) * x)))   # d/dk sum(sin(k x))
        True
        """
        return _sibling("diff").reverse_graph(self, record, seeds, wrt=wrt, vjps=vjps,
                                              strict=strict, lock=lock)

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
