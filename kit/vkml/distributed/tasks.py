"""What runs on the workers: one shard's launch and one shard's reverse, as pure tasks.

A shard's state -- its Graph (or simulation) built over its own copy of its samples, after the
launch, with the Record a recording launch keeps -- is the *result* of a task
(``launch_shard``), so it lives on the worker that ran it and Dask knows how it was made.  If the
worker dies, Dask runs the task again from its inputs (the shard's samples, the Params, the
previous launch's state) and gets the same bits: everything here is deterministic.  A state
that Dask moves to another worker travels as that same recipe (:meth:`ShardState.__reduce__`)
and is launched again on arrival, never as a pickled Graph.  A shard runs on the client's
backend (named in the task), whatever the worker's own default is: its bits are the client's.

Tasks never write their inputs: a launch copies the planes it is given first (Dask may hand
the same input to a second run).  A ``VkmlError`` raised in a shard leaves with the shard's
sample range in its message; any other error (from the user's ``make``) as an
``ExecutionError`` naming it -- ``SystemExit`` and ``KeyboardInterrupt`` raised by ``make``
too, which would otherwise end the worker.  No Dask import here: these functions run inside a worker.
"""

from __future__ import annotations

import inspect
import resource
import sys
import time

import numpy as np

from ..errors import ExecutionError, RefusedError, VkmlError
from ..runtime import use_backend
from ..graph import Graph, Simulation, diff
from ..graph.simulation import available_memory


def where(start, stop) -> str:
    return f"shard of samples [{start}, {stop})"


def relabel(err, start, stop):
    """``err`` raised in shard ``[start, stop)`` as the error the client sees."""
    if isinstance(err, VkmlError):
        try:
            new = type(err)(f"{where(start, stop)}: {err}")
        except TypeError:                 # an error class with another constructor
            new = ExecutionError(f"{where(start, stop)}: {type(err).__name__}: {err}")
    else:
        new = ExecutionError(f"{where(start, stop)}: {type(err).__name__}: {err}")
    return new


class ShardState:
    """One shard after a launch: the forward (Graph or simulation), its planes by name, and the
    recipe that made it (what a move to another worker carries instead of the objects)."""

    def __init__(self, recipe, forward, planes, start, stop, seconds, backend):
        self.recipe = recipe
        self.backend = backend
        self.forward = forward
        self.planes = planes
        self.start, self.stop = start, stop
        self.seconds = seconds

    def __reduce__(self):
        return (launch_shard, self.recipe)

    @property
    def record(self):
        return self.forward.record


def named_planes(forward, given):
    """Every plane the forward binds, by the name the graph gives it, then the planes the user
    gave (``make`` may have bound copies of them) under the names not bound."""
    out = {}
    if isinstance(forward, Graph):
        for node in forward.nodes:
            for which in ("reads", "writes"):
                for _, plane in node.bindings(which):
                    out.setdefault(forward.plane_name(plane), plane)
    else:
        for op in [forward.launch] + list(forward.nodes):
            for name, plane in list(op.reads.items()) + list(op.writes.items()):
                out.setdefault(name, plane)
    for name, plane in given.items():
        out.setdefault(name, plane)
    return out


def worker_budget():
    """The default memory budget of one shard: half this worker's memory limit, shared by the
    shards its threads run at once (without a Dask worker: vkml's own default)."""
    try:
        from distributed import get_worker  # local: optional dependency, only inside a worker
        worker = get_worker()
    except (ImportError, ValueError):
        return available_memory()
    limit = getattr(worker, "memory_limit", None) or getattr(
        getattr(worker, "memory_manager", None), "memory_limit", None)
    if not limit:
        return available_memory()
    return int(limit) // (2 * max(1, worker.state.nthreads if hasattr(worker, "state") else 1))


def takes_budget(make) -> bool:
    try:
        params = inspect.signature(make).parameters
    except (TypeError, ValueError):
        return False
    return "memory_budget" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def build(make, planes, record, budget, start, stop):
    """``make(planes)`` -> a Graph built to ``record``, or a simulation; refuse what cannot be
    sharded (a reduce node sums over every sample: a shard would see only its own)."""
    if budget is None and takes_budget(make):
        budget = worker_budget()
    forward = make(planes, memory_budget=budget) if takes_budget(make) else make(planes)
    if isinstance(forward, (Graph, Simulation)):
        n = forward.n if isinstance(forward, Graph) and forward.nodes or \
            isinstance(forward, Simulation) else None
        if n is not None and n != stop - start:
            raise RefusedError(f"make(planes) returned a {type(forward).__name__.lower()} of {n} "
                               f"samples for a block of {stop - start}; build it over the planes "
                               "it is given (their first axis is the block's samples)")
    if isinstance(forward, Graph):
        reduces = [node.name for node in forward.nodes if node.kind == "reduce"]
        if reduces:
            raise RefusedError(f"node {reduces[0]!r} is a reduce over all samples, which one shard "
                               "cannot compute alone; reduce the gathered output instead (e.g. "
                               "outputs[...].sum() with Dask) or run this graph in one process")
        forward.build(record=record)
    elif not isinstance(forward, Simulation):
        raise RefusedError(f"make(planes) must return a vkml.Graph or a vkml.simulation(...), got "
                           f"{type(forward).__name__}")
    return forward


def carry_over(named, previous):
    """Every plane of the new forward takes the values the ``previous`` launch left in the plane
    of the same name: in one process a second launch runs on the planes as the first left them
    (a simulation's clock, a state the graph updates in place)."""
    for name, plane in named.items():
        old = previous.planes.get(name)
        if old is not None and old is not plane and old.shape == plane.shape and \
                plane.flags.writeable:
            plane[...] = old


def launch_shard(make, inputs, previous, params, record, budget, runs, start, stop, backend):
    """Build the shard's forward over copies of its planes (``inputs``; after a first launch,
    the names of the planes to take from the ``previous`` launch's state), set ``params``,
    launch it ``runs`` times (a simulation: run it) on ``backend``: the new :class:`ShardState`."""
    recipe = (make, inputs, previous, params, record, budget, runs, start, stop, backend)
    t0 = time.perf_counter()
    try:
        with use_backend(backend):
            forward, named = _launch(make, inputs, previous, params, record, budget, runs, start,
                                     stop)
    except (Exception, SystemExit, KeyboardInterrupt) as err:   # noqa: BLE001 - named after its
        raise relabel(err, start, stop) from None     # shard; the user's exit never ends a worker
    return ShardState(recipe, forward, named, start, stop, time.perf_counter() - t0, backend)


def _launch(make, inputs, previous, params, record, budget, runs, start, stop):
    """The launch itself: the shard's forward and its planes by name."""
    source = inputs if previous is None else {name: previous.planes[name] for name in inputs}
    planes = {name: np.array(plane, copy=True) for name, plane in source.items()}
    forward = build(make, planes, record, budget, start, stop)
    named = named_planes(forward, planes)
    if previous is not None:
        carry_over(named, previous)
    if isinstance(forward, Graph):
        if params:
            forward.update(params)
        forward.launch(runs)
    else:
        forward.run()
    return forward, named


def peak_memory() -> int:
    """This process's peak resident memory in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def reverse_shard(state, seeds, wrt, vjps, strict):
    """The shard's reverse: per-sample gradients (left on the worker), each Param's parts (its
    per-launch tree sums over this shard) and what the report needs."""
    start, stop = state.start, state.stop
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        with use_backend(state.backend):
            grads = diff.reverse(state.record, seeds, wrt=wrt, vjps=vjps, strict=strict)
    except Exception as err:     # noqa: BLE001 - every error leaves named after its shard
        raise relabel(err, start, stop) from None
    forward = state.forward
    if isinstance(forward, Graph):
        parts = grads.parts
        params = {f"{node}.{p}" for node, p in parts} | {p for _, p in parts}
        cells = {k: np.array(v) for k, v in state.record.cells.items()}
    else:
        names = forward.launch.kernel.params
        parts = {(None, p): [((0, 0), grads[p])] for p in names if p in grads}
        params = set(names)
        cells = {(None, p): np.array(state.record.cells[p]) for p in names}
    report = grads.report
    try:
        from distributed import get_worker  # local: optional dependency, only inside a worker
        address = get_worker().address
    except (ImportError, ValueError):
        address = "local"
    return {
        "samples": {k: v for k, v in grads.items() if k not in params},
        "parts": parts, "cells": cells, "params": sorted(params & set(grads)),
        "kind": "graph" if isinstance(forward, Graph) else "simulation",
        "report": {"generation": report.generation, "bitwise": dict(report.bitwise),
                   "chunks": report.chunks, "recomputed_steps": report.recomputed_steps,
                   "peak_states": report.peak_states, "worker": address,
                   "peak_memory": peak_memory(), "seconds": time.perf_counter() - t0,
                   "cpu_seconds": time.thread_time() - c0,
                   "start": start, "stop": stop},
    }


def summary(result):
    """What the client gathers of a shard's reverse: all but the per-sample gradients (of
    which only the names, per-sample shapes and dtypes)."""
    out = {k: v for k, v in result.items() if k != "samples"}
    out["samples_names"] = sorted(result["samples"])
    out["samples_layout"] = {k: (v.shape[1:], v.dtype) for k, v in result["samples"].items()}
    return out


def sample_gradient(result, name):
    return result["samples"][name]


def forward_bitwise(state):
    return dict(state.forward.bitwise())


def plane_of(state, name):
    return state.planes[name]


def layout(state):
    """Each plane's per-sample shape and dtype (what a Dask array of it needs to know)."""
    return {name: (plane.shape[1:], plane.dtype) for name, plane in state.planes.items()
            if plane.ndim >= 1 and plane.shape[0] == state.stop - state.start}
