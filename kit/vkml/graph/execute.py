"""How a graph's work runs, whatever runs it: launches all or nothing, batched runs split
over threads, the errors a failed run becomes, per-sample values, the planes' signatures, and the
caches a graph derives once from its nodes."""

from __future__ import annotations

import contextvars
import operator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import backends
from ..backends import ExecutionFailure
from ..backends.base import threads
from ..errors import ArgumentError, ExecutionError, ShapeError, VkmlError
from ..ir import Program
from ..threadsafe import Cache
from .treesum import MIN_PASS


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


def plane_signature(plane):
    """What a compiled launch relies on about a plane: its shape and dtype (a program is traced
    and compiled for them: a plane resized in place would be read at its old size) and whether
    it may be written.  Not its strides (every backend reads a plane of any strides correctly,
    and setting them in place is deprecated in NumPy) nor where its memory is (every launch hands
    the arrays themselves to the program, so memory that moved -- resized away and back -- is
    read where it now is); reading the address would cost more than all the rest, every launch."""
    return plane.shape, plane.dtype, plane.flags.writeable


LAYOUT = operator.attrgetter("shape", "dtype")
WRITEABLE = operator.attrgetter("flags.writeable")


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


#: the thread pools made so far, by number of workers (one per count, kept for the process)
POOLS = {}


def _pool(workers):
    if workers not in POOLS:
        POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="vkml")
    return POOLS[workers]


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


class GraphCaches:
    """What a graph derives from its nodes once and reuses every launch and reverse.

    Owned by the graph (``graph.caches``) and made anew whenever its nodes change (``add``)
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


def uses_table(prog, param_index):
    """Whether a Param reaches a gather operand: its gradient is a scatter-add across samples.

    Shared with a simulation's reverse, whose gradients follow the same rule."""
    dep = {prog.inputs[param_index]}
    for e in prog.eqns:
        if e.prim.name == "gather" and e.inputs[0] in dep:
            return True
        if any(v in dep for v in e.inputs):
            dep.update(e.outputs)
    for e in prog.eqns:
        for p in e.params.values():
            if isinstance(p, Program) and any(q.name == "gather" for q in primitives_of(p)):
                return True
    return False


def primitives_of(prog):
    """Every primitive ``prog`` binds, its nested programs' too (a Record asks it whether a
    launch can fail part-way)."""
    for e in prog.eqns:
        yield e.prim
        for p in e.params.values():
            if isinstance(p, Program):
                yield from primitives_of(p)
