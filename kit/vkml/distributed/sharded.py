"""A Graph or a simulation sharded over samples on a Dask cluster (the client's side).

``Sharded(make, planes)`` cuts the samples into aligned blocks (see ``blocks.py``), and on each
``launch()`` runs one task per block: ``make(block_planes)`` builds the block's Graph (or
simulation) on a worker, which launches it and keeps it -- with its Record -- as the task's
result (see ``tasks.py``).  Outputs come back as Dask arrays (nothing is gathered unless you
compute them); ``reverse(seeds)`` runs one reverse task per block where its state lives and
returns per-sample gradients as Dask arrays and Param gradients combined from the blocks' tree
sums: the same bits as one process.

One call is all or nothing, as in one process: if a block refuses (its ``VkmlError`` names the
block's samples), the call raises that error, every task of the call is released (no block
keeps a Record of a launch that failed) and the previous launch stays the current one.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid

import numpy as np

from ..errors import ArgumentError, Busy, RecordError, RefusedError, ShapeError
from ..graph.diff import Reverse
from ..graph.reversible import Reversible
from ..runtime import current_backend
from .blocks import block_size, check_block, shard_bounds
from .engine import da, dask, distributed
from .gradients import ShardedGradients, ShardedReport, param_gradients
from .tasks import ShardState, forward_bitwise, launch_shard, layout, plane_of, reverse_shard, \
    sample_gradient, summary

_COUNTER = itertools.count()


@dask.sizeof.sizeof.register(ShardState)
def state_nbytes(state) -> int:
    """What a block's state holds, for Dask's memory accounting (spilling, the dashboard): its
    planes and what its Record copied."""
    planes = sum(p.nbytes for p in {id(p): p for p in state.planes.values()}.values())
    record = state.forward.record
    return planes + (int(record.nbytes) if record is not None else 0)


def current_client(client):
    """``client``, else the default ``dask.distributed`` Client, else the error saying how to get one."""
    if client is not None:
        if not isinstance(client, distributed.Client):
            raise ArgumentError(f"vkml.distributed: client must be a dask.distributed.Client, got "
                                f"{type(client).__name__}")
        return client
    try:
        return distributed.default_client()
    except ValueError:
        raise ArgumentError("vkml.distributed: no Dask client is running; start one with "
                            "client = vkml.distributed.local() (or distributed.Client(address)) "
                            "and pass client=client") from None


def sample_count(planes) -> int:
    """The number of samples: the rows every plane shares."""
    if not isinstance(planes, dict) or not planes or not all(isinstance(k, str) for k in planes):
        raise ArgumentError("vkml.distributed: planes must be a dict of name -> NumPy or Dask array "
                            f"(one row per sample), got {type(planes).__name__}")
    rows = {}
    for name, plane in planes.items():
        if not isinstance(plane, (np.ndarray, da.Array)) or plane.ndim == 0:
            raise ShapeError(f"vkml.distributed: plane {name!r} must be a NumPy or Dask array with one "
                             f"row per sample, got {type(plane).__name__}")
        rows.setdefault(plane.shape[0], []).append(name)
    if len(rows) > 1:
        raise ShapeError("vkml.distributed: planes have different numbers of rows: " +
                         "; ".join(f"{k} rows: {v}" for k, v in rows.items()))
    n = next(iter(rows))
    if not isinstance(n, int) or n < 1:
        raise ShapeError(f"vkml.distributed: the planes need a known, positive number of rows, got {n}")
    return n


class ShardedRecord:
    """The Records of one recording launch, one per block, each kept on its worker.

    ``live`` (neither reversed nor kept) as in one process: a live Record makes the next launch
    and ``update`` refuse; ``keep()`` lets it be reversed after later launches."""

    def __init__(self, owner, generation, states):
        self.owner = owner
        #: the Sharded that reverses it (``vkml.diff.reverse(record, seeds)`` finds it here)
        self.forward = owner
        self.generation = generation
        self.states = states
        self.reversed = False
        self.kept = False

    @property
    def live(self) -> bool:
        return not self.kept and not self.reversed

    @property
    def stale(self) -> bool:
        return not self.kept and self.generation != self.owner.generation

    def keep(self) -> "ShardedRecord":
        """Keep this launch's blocks (their tasks stay held) to reverse it after later launches."""
        if self.stale:
            raise RecordError(f"keep: this Record is of generation {self.generation} but the sharded "
                              f"graph is at generation {self.owner.generation}; keep() right after "
                              "launch()")
        self.kept = True
        return self

    def __repr__(self):
        state = "kept" if self.kept else "reversed" if self.reversed else "live"
        return f"<vkml ShardedRecord generation {self.generation} ({state}): {len(self.states)} shards>"


class Sharded(Reversible):
    """``make(planes) -> Graph | simulation`` run over blocks of samples on a Dask cluster.

    Reversible like a Graph: ``sharded.reverse(seeds)``, ``vkml.diff.reverse(sharded.record,
    seeds)`` and ``vkml.diff.Reverse(sharded)(record, seeds)`` are the same call.

    - ``make``: builds the forward for the planes it is given (one block's rows of every plane;
      NumPy arrays it may bind directly).  It runs on the workers, so it must be a function Dask
      can send (defined at module level or in the notebook).  If it takes a ``memory_budget``
      keyword it gets the block's share of its worker's memory (or ``memory_budget=`` given here).
    - ``planes``: name -> NumPy array (sent to the workers inside the tasks, so a lost worker's
      block can be rebuilt) or Dask array (rechunked to the blocks and computed where it lands).
    - ``record``: a Graph is built with ``build(record=record)`` on the workers.
    - ``block``: samples per block, a power of two (default: ``blocks.block_size``, about one
      block per worker thread, or a few where that balances the threads better); the bits never
      depend on it.
    - ``progress``: show Dask's progress bar while a launch or reverse runs (a widget in a
      notebook).
    """

    def __init__(self, make, planes, *, client=None, record=False, block=None, memory_budget=None,
                 progress=False):
        if not callable(make):
            raise ArgumentError(f"vkml.distributed: make must be a function planes -> Graph or "
                                f"simulation, got {type(make).__name__}")
        if not isinstance(record, (bool, np.bool_)):
            raise ArgumentError(f"vkml.distributed: record must be True or False, got {record!r}")
        if memory_budget is not None and (isinstance(memory_budget, bool) or
                                          not isinstance(memory_budget, (int, np.integer)) or
                                          memory_budget < 1):
            raise ArgumentError(f"vkml.distributed: memory_budget must be a positive number of bytes "
                                f"(per block), got {memory_budget!r}")
        self.client = current_client(client)
        self.n = sample_count(planes)
        if block is None:
            threads = sum(self.client.nthreads().values()) or 1
            block = block_size(self.n, threads)
        self.block = check_block(block, self.n)
        self.bounds = shard_bounds(self.n, self.block)
        self.make = make
        self.record_mode = bool(record)
        self.memory_budget = memory_budget
        self.progress = bool(progress)
        self.input_names = list(planes)
        self._inputs = [{} for _ in self.bounds]
        for name, plane in planes.items():
            for i, part in enumerate(self._split(plane)):
                self._inputs[i][name] = part
        self.params = {}
        self._launched_params = {}          # the Params of the last launch that ran
        self.generation = 0
        self._states = None
        self._layout = {}
        self._record = None
        self._lock = threading.Lock()
        self._tag = uuid.uuid4().hex[:8]

    # -- blocks ---------------------------------------------------------------------------------
    def _split(self, array):
        """``array`` cut into the blocks: NumPy slices (they travel inside the tasks), or futures
        of a Dask array rechunked to the blocks."""
        if isinstance(array, np.ndarray):
            return [array[s:e] for s, e in self.bounds]
        chunks = (tuple(e - s for s, e in self.bounds),) + tuple((d,) for d in array.shape[1:])
        blocks = array.rechunk(chunks).to_delayed().reshape(-1)
        return self.client.compute(list(blocks))

    def _key(self, what, i, generation):
        s, e = self.bounds[i]
        return f"vkml-{what}-{self._tag}-g{generation}-{next(_COUNTER)}-[{s},{e})"

    def _claim(self, what):
        if not self._lock.acquire(blocking=False):
            raise Busy(f"{what}: another call on this sharded graph is under way; wait for it to "
                       "return")

    # -- what vkml.diff.Reverse asks of a forward (see graph/reversible.py) ------------------------
    def check_reversible(self, vjps):
        """A sharded forward made with ``record=True`` (each block checks its own nodes' vjps when
        it reverses, and a refusal names the block)."""
        if not self.record_mode:
            raise RefusedError("Reverse: this sharded graph records nothing; make it with "
                               "vd.Sharded(make, planes, record=True)")

    def bitwise(self):
        """Per gradient name, whether its bits are reproducible (asked of the first block)."""
        if self._states is None:
            raise ArgumentError("bitwise: launch() first (the blocks' graphs are built on the workers)")
        return self.client.submit(forward_bitwise, self._states[0],
                                  key=self._key("bitwise", 0, self.generation)).result()

    def _await_all(self, futures):
        """Wait for every task of one call; if any failed, release them all and raise the first
        failure in sample order (its message names its block)."""
        if self.progress:
            distributed.progress(futures)
        distributed.wait(futures)
        for f in futures:
            if f.status in ("error", "cancelled", "lost"):
                err = f.exception() if f.status == "error" else None
                self.client.cancel(futures)
                if err is None:
                    raise RecordError(f"vkml.distributed: task {f.key} was {f.status}")
                raise err
        return futures

    # -- running --------------------------------------------------------------------------------
    @property
    def record(self):
        """The ShardedRecord of the latest recording launch (None before the first)."""
        return self._record

    def update(self, mapping=None, **values):
        """Set Params for the next launches (``update(k=0.7)`` or ``update({"node.k": 0.7})``);
        each block applies them with ``Graph.update`` before it launches (a bad name or value is
        refused there, by the next launch, naming the block; that launch then drops the Params
        set since the last launch that ran, so a bad name cannot stick)."""
        if mapping is not None and not isinstance(mapping, dict):
            raise ArgumentError(f"update: pass Params as update(k=0.7) or update({{'node.k': 0.7}}), "
                                f"got {type(mapping).__name__}")
        self._claim("update")
        try:
            rec = self._record
            if rec is not None and rec.live:
                raise RecordError(f"update: the Record of generation {rec.generation} is still live; "
                                  "reverse it (or keep() it) first, so a reverse sees the Params its "
                                  "launch used")
            items = dict(mapping or {})
            items.update(values)
            if not all(isinstance(k, str) for k in items):
                raise ArgumentError(f"update: Param names are strings like 'k' or 'node.k', got "
                                    f"{list(items)}")
            self.params.update(items)
            return self
        finally:
            self._lock.release()

    def launch(self, runs=1):
        """Launch every block where its data lives (a simulation: run it); returns once all ran."""
        if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < 1:
            raise ArgumentError(f"launch: runs must be a positive int, got {runs!r}")
        self._claim("launch")
        try:
            rec = self._record
            if self.record_mode and rec is not None and rec.live:
                raise RecordError(f"launch: the Record of generation {rec.generation} is still live; "
                                  "reverse it first, or keep a copy with record.keep()")
            states = []
            for i, (s, e) in enumerate(self.bounds):
                previous = self._states[i] if self._states is not None else None
                inputs = self._inputs[i] if previous is None else list(self.input_names)
                states.append(self.client.submit(
                    launch_shard, self.make, inputs, previous, dict(self.params), self.record_mode,
                    self.memory_budget, int(runs), s, e, current_backend().name,
                    key=self._key("launch", i, self.generation + 1)))
            try:
                self._await_all(states)
            except BaseException:
                self.params = dict(self._launched_params)
                raise
            self._launched_params = dict(self.params)
            self._layout = self.client.submit(layout, states[0], key=self._key("layout", 0, self.generation + 1)).result()
            self._states = states
            self.generation += 1
            if self.record_mode:
                self._record = ShardedRecord(self, self.generation, states)
            return self
        finally:
            self._lock.release()

    def _array(self, parts, meta, name):
        """One Dask array from per-block futures of ``name``'s rows."""
        shape, dtype = meta
        return da.concatenate([da.from_delayed(dask.delayed(fn)(f, name), (e - s,) + tuple(shape), dtype)
                               for (fn, f), (s, e) in zip(parts, self.bounds)])

    def plane(self, name):
        """Plane ``name`` after the latest launch, as a Dask array over the blocks."""
        if self._states is None:
            raise ArgumentError("plane: launch() first")
        if name not in self._layout:
            raise ArgumentError(f"plane: no plane named {name!r}; planes: {sorted(self._layout)}")
        return self._array([(plane_of, f) for f in self._states], self._layout[name], name)

    @property
    def planes(self):
        """Every per-sample plane after the latest launch, by name, as Dask arrays."""
        return {name: self.plane(name) for name in self._layout}

    # -- reversing ------------------------------------------------------------------------------
    def _seed_parts(self, name, seed):
        if isinstance(seed, (np.ndarray, da.Array)) and seed.ndim >= 1 and seed.shape[0] == self.n:
            return self._split(seed)
        raise ShapeError(f"reverse: seed {name!r} must be a NumPy or Dask array with one row per "
                         f"sample ({self.n} rows), got "
                         f"{getattr(seed, 'shape', type(seed).__name__)}")

    def prepare_reverse(self, record, seeds, wrt, strict):
        """Check one reverse call (see ``graph/reversible.py``): ``record`` is this sharded graph's
        and current, each seed has one row per sample; the seeds cut into the blocks."""
        if record is None:
            raise ArgumentError("reverse: there is no Record; make the Sharded with record=True "
                                "and launch() it first")
        if not isinstance(record, ShardedRecord) or record.owner is not self:
            raise ArgumentError("reverse: this Record belongs to another sharded graph")
        if record.stale:
            raise RecordError(f"reverse: this Record is of generation {record.generation}, but the "
                              f"sharded graph has launched since and is at generation "
                              f"{self.generation}; reverse right after launch(), or keep() the "
                              "Record to reverse it later")
        if not isinstance(seeds, dict):
            raise ArgumentError(f"reverse: seeds must be a dict of output plane name -> per-sample "
                                f"seed, got {type(seeds).__name__}")
        split = {name: self._seed_parts(name, seed) for name, seed in seeds.items()}
        return split, wrt, strict

    @contextlib.contextmanager
    def reading(self, record):
        """One call on this sharded graph at a time (its blocks' tasks are claimed)."""
        self._claim("reverse")
        try:
            yield record
        finally:
            self._lock.release()

    def sweep(self, record, prepared, vjps, workspace):
        """One reverse task per block, where its state lives; per-sample gradients as Dask arrays,
        Param gradients combined from the blocks' tree sums (the bits of one process)."""
        split, wrt, strict = prepared
        results = [self.client.submit(reverse_shard, state, {k: v[i] for k, v in split.items()},
                                      wrt, vjps, strict, key=self._key("reverse", i, record.generation))
                   for i, state in enumerate(record.states)]
        self._await_all(results)
        small = self.client.gather([self.client.submit(summary, r, key=self._key("summary", i, record.generation))
                                    for i, r in enumerate(results)])
        values = {name: self._array([(sample_gradient, r) for r in results], meta, name)
                  for name, meta in small[0]["samples_layout"].items()}
        values.update(param_gradients(small, self.block, self.n))
        return ShardedGradients(values, ShardedReport([s["report"] for s in small]))

    def reverse(self, *args, record=None, wrt=None, vjps=None, strict=False):
        """``reverse(seeds)`` or ``reverse(record, seeds)``: every gradient of a recorded launch
        (default: the latest), as ``vkml.diff.reverse`` gives them: per-sample gradients as Dask
        arrays, Param gradients the same bits as one process."""
        if len(args) == 2:
            record, seeds = args
        elif len(args) == 1:
            (seeds,) = args
        else:
            raise ArgumentError("reverse: pass the seeds, reverse(seeds), or reverse(record, seeds)")
        record = self._record if record is None else record
        return Reverse(self, vjps=vjps, strict=strict)(record, seeds, wrt=wrt)

    def __repr__(self):
        return (f"<vkml.distributed.Sharded {self.n} samples in {len(self.bounds)} blocks of "
                f"{self.block}, generation {self.generation}>")
