"""The gradients of a sharded reverse: per-sample ones as Dask arrays (left on the workers),
Param ones combined from the shards' tree sums in the canonical tree's order, and the report."""

from __future__ import annotations

from ..errors import RefusedError
from ..graph.diff import GradientMapping
from ..graph.graph_reverse import fold_params
from .blocks import tree_of
from .tasks import where


class ShardedReport:
    """How a sharded gradient was computed.

    - ``generation``: the launch whose Record was reversed;
    - ``bitwise``: per gradient name, whether its bits are reproducible (as in one process);
    - ``chunks``: memory-budget passes, all shards together; ``recomputed_steps`` (summed) and
      ``peak_states`` (the largest shard's): the checkpointing cost;
    - ``shards``: per shard, ``(start, stop, worker, chunks, seconds, cpu_seconds)``: its
      reverse's wall time and the CPU time its thread got (less than the wall time when the
      worker shares its core with other work);
    - ``workers``: per worker address, ``{"shards": count, "peak_memory": bytes}`` (the worker
      process's peak resident memory when its last shard finished).
    """

    def __init__(self, reports):
        first = reports[0]
        self.generation = first["generation"]
        self.bitwise = first["bitwise"]
        self.chunks = sum(r["chunks"] for r in reports)
        self.recomputed_steps = sum(r["recomputed_steps"] for r in reports)
        self.peak_states = max(r["peak_states"] for r in reports)
        self.shards = [(r["start"], r["stop"], r["worker"], r["chunks"], r["seconds"], r["cpu_seconds"])
                       for r in reports]
        self.workers = {}
        for r in reports:
            w = self.workers.setdefault(r["worker"], {"shards": 0, "peak_memory": 0})
            w["shards"] += 1
            w["peak_memory"] = max(w["peak_memory"], r["peak_memory"])

    def __repr__(self):
        return (f"ShardedReport(generation={self.generation}, shards={len(self.shards)}, "
                f"workers={len(self.workers)}, chunks={self.chunks}, "
                f"recomputed_steps={self.recomputed_steps}, peak_states={self.peak_states})")


class ShardedGradients(GradientMapping):
    """A read-only mapping like :class:`vkml.diff.Gradients`: per-sample gradients as Dask arrays
    (``.compute()`` them, or keep computing with Dask), Param gradients as NumPy arrays."""

    def __repr__(self):
        return f"<ShardedGradients {sorted(self._values)}; {self.report!r}>"


def check_same_tape(summaries):
    """Every shard must have run the same steps (a skippable member skipped everywhere or nowhere,
    a repeat_while the same number of times): a guard that differs between shards read the
    shard's own samples, and one process would have run one loop over all of them."""
    first = summaries[0]
    shape = {k: [o for o, _ in v] for k, v in first["parts"].items()}
    for s in summaries[1:]:
        other = {k: [o for o, _ in v] for k, v in s["parts"].items()}
        if other != shape:
            a, b = first["report"], s["report"]
            raise RefusedError(
                f"the {where(a['start'], a['stop'])} and the {where(b['start'], b['stop'])} ran "
                "different steps (a skippable or repeat_while guard differs between shards), so "
                "their gradients cannot be combined into the one-process result; make guards "
                "that do not depend on the shard's samples, or run this graph in one process")


def param_gradients(summaries, size, n):
    """Each Param's gradient: per part (launch or loop iteration), the shards' tree sums combined
    in tree order, then the parts folded oldest first, as one process folds them."""
    check_same_tape(summaries)
    rows = [s["report"]["stop"] - s["report"]["start"] for s in summaries]
    first = summaries[0]
    combined = {}
    for key, parts in first["parts"].items():
        combined[key] = [(order, tree_of([s["parts"][key][j][1] for s in summaries], rows, size, n))
                         for j, (order, _) in enumerate(parts)]
    if first["kind"] == "simulation":
        return {p: parts[0][1] for (_, p), parts in combined.items()}
    values = fold_params(combined, first["cells"], taken=set(first["samples_names"]))
    return {k: v for k, v in values.items() if k in first["params"]}
