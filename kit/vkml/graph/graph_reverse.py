"""The reverse of a Graph's Record: its seeds resolved by name, its refusals, and one sweep
of the tape -- fused into one program where every node is a plain launch, step by step otherwise
(hand-written vjps, guards, loops, opaque nodes) -- with adjoints added in a fixed order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..backends import ExecutionFailure
from ..errors import ArgumentError, RefusedError, VkmlError
from ..ir import Var, program_from_dag
from .. import backends
from ..ops import api
from ..runtime import submit
from ..transforms import inline
from ..backends.base import threads
from .execute import run_named, user_error, uses_table
from .nodes import Opaque, Reduce, RepeatWhile
from . import device
from .kernel import Kernel, Launch
from .record import LoopEntry, OtherEntry, Record, SkipEntry, Step
from .treesum import tree_sum
from .diff import (Gradients, Report, central_vjp, device_seed, reverse_launch, reverse_options,
                   run_user_vjp, seed_array, user_vjp_gradients, zeros)


def _outputs_by_name(tape):
    """(node, output name) -> the plane version it wrote last, over the whole tape."""
    out = {}
    for e in tape:
        if isinstance(e, Step):
            for name, key in e.writes.items():
                out[(e.node.name, name)] = key
        elif isinstance(e, SkipEntry):
            if e.step is not None:
                for name, key in e.step.writes.items():
                    out[(e.node.name, name)] = key
        elif isinstance(e, LoopEntry):
            for name, key in e.end_writes.items():
                out[(e.node.name, name)] = key
        elif isinstance(e, OtherEntry):
            for name, key in e.writes.items():
                out[(e.node.name, name)] = key
    return out


def _per_graph(fn):
    """``fn(graph)`` computed once per build of the graph (its nodes and planes are fixed then)."""
    def cached(graph):
        return graph.caches.structure.get_or_make(fn.__name__, lambda: fn(graph))[0]
    cached.__doc__ = fn.__doc__
    return cached


@_per_graph
def _inputs_by_name(graph):
    """(node, input name) -> plane id, for every node (ran or not)."""
    out = {}
    for node in graph.nodes:
        for launch in node.launches():
            for name, plane in launch.reads.items():
                out[(node.name, name)] = id(plane)
        if isinstance(node.op, (Opaque, Reduce)):
            for name, plane in node.op.reads.items():
                out[(node.name, name)] = id(plane)
    return out


@_per_graph
def _all_writes(graph):
    """(node, output name) -> the plane, for every node (ran or not)."""
    out = {}
    for node in graph.nodes:
        for launch in node.launches():
            for name, plane in launch.writes.items():
                out[(node.name, name)] = plane
        if isinstance(node.op, (Opaque, Reduce)):
            for name, plane in node.op.writes.items():
                out[(node.name, name)] = plane
    return out


def resolve_seeds(record, seeds, copy=True, device=False):
    """Seeds by plane version, checked before anything runs (the two mistakes everyone makes once).
    ``copy=False``: a seed of the plane's dtype is used as it is (the caller makes sure no
    gradient handed back aliases it and nothing writes into it).  ``device``: the reverse runs
    on the device (a fused reverse on the cuda backend), so a device array seed stays there."""
    if type(seeds) is not dict and not isinstance(seeds, Mapping):
        raise ArgumentError(f"seeds must be a dict of output plane name -> per-sample seed, got "
                            f"{type(seeds).__name__}")
    cache_key = _seed_targets_key(record, seeds)
    known = record.graph.caches.structure.get(cache_key) if cache_key is not None else None
    if known is not None:               # the names resolved before: only the arrays to check
        resolved = {}
        for (name, key, plane), seed in zip(known, seeds.values()):
            _add_seed(resolved, key, name, seed, plane, copy, device)
        return resolved
    targets = []
    graph = record.graph
    written = _outputs_by_name(record.tape)
    writes = _all_writes(graph)
    resolved = {}
    for name, seed in seeds.items():
        if not isinstance(name, str):
            raise ArgumentError(f"seed names must be strings like 'wave.y' or 'y', got {name!r}")
        if "." in name:
            node, plane = name.split(".", 1)
            cands = [(node, plane)] if (node, plane) in writes else []
        else:
            cands = [k for k in writes if k[1] == name]
        if not cands:
            as_input = [k for k in _inputs_by_name(graph) if (k[1] == name if "." not in name else f"{k[0]}.{k[1]}" == name)]
            if as_input:
                raise ArgumentError(f"seed {name!r}: that is an input of the graph, not an output; its "
                                    f"gradient is grads[{name!r}] -- seed the outputs your objective "
                                    "depends on instead")
            raise ArgumentError(f"seed {name!r}: no node writes a plane of that name; outputs: "
                                f"{sorted({f'{n}.{p}' for n, p in writes})}")
        planes = {id(writes[c]) for c in cands}
        if len(planes) > 1:
            raise ArgumentError(f"seed {name!r} is ambiguous: "
                                f"{', '.join(f'{n}.{p}' for n, p in cands)} are different planes; "
                                "name it as 'node.plane'")
        cand = cands[-1]
        plane = writes[cand]
        key = written.get(cand)
        if key is None:                    # the writer did not run (a skipped member)
            key = (id(plane), record.final.get(id(plane), 0))
        targets.append((name, key, plane))
        _add_seed(resolved, key, name, seed, plane, copy, device)
    if cache_key is not None:
        graph.caches.structure.put(cache_key, targets)
    return resolved


def _add_seed(resolved, key, name, seed, plane, copy, device):
    """Check ``seed`` against ``plane`` and add it into ``resolved[key]`` (two names of one plane
    version add up).  A device array seed of a reverse on the device stays there."""
    if device and key not in resolved and hasattr(seed, "__cuda_array_interface__"):
        resolved[key] = device_seed(name, seed, plane)
        return
    arr = seed_array(name, seed, plane)
    # a copy: a gradient that passes straight through a kernel must not alias the caller's seed
    resolved[key] = np.asarray(resolved[key]) + arr.astype(plane.dtype, copy=False) \
        if key in resolved else arr.astype(plane.dtype, copy=copy)


def _seed_targets_key(record, seeds):
    """The key under which the graph keeps where ``seeds``' names resolve to, for a tape of
    plain steps (every launch runs the same steps, so it writes the same plane versions) and
    names that are all strings; None for any other (resolved afresh every time)."""
    tape = record.tape
    if not record.steps_only:
        for e in tape:
            if type(e) is not Step:
                return None
    names = tuple(seeds)
    for name in names:
        if type(name) is not str:
            return None
    return ("seed targets", names, len(tape))


def check_graph_reversible(graph, vjps):
    """``Graph.check_reversible``: built to record, every node's derivative known (derived, or
    given in ``vjps`` and checked)."""
    if not graph.built:
        raise ArgumentError("Reverse: build the graph first (graph.build(record=True))")
    if not graph.recording:
        raise ArgumentError("Reverse: the graph was built without record=True; build it with "
                            "build(record=True) so launches keep what the reverse needs")
    for name, fn in vjps.items():
        try:
            node = graph.node(name)
        except ArgumentError:
            raise ArgumentError(f"Reverse: vjps names {name!r}, but the graph has no such node; "
                                f"nodes: {[n.name for n in graph.nodes]}") from None
        if isinstance(fn, (Launch,)) or hasattr(fn, "kind") and not isinstance(fn, Kernel):
            raise RefusedError(f"Reverse: the vjp of node {name!r} is a graph node; pass a function "
                               "or a vjp kernel (vkml.kernel(vjp_of=...)), not a Node")
        if isinstance(fn, Kernel):
            launches = node.launches()
            if not launches or fn.vjp_of is not launches[0].kernel:
                want = launches[0].kernel.name if launches else node.kind
                raise RefusedError(f"Reverse: {fn.name} is not the vjp of node {name!r}'s kernel "
                                   f"{want} (it is marked vjp_of="
                                   f"{fn.vjp_of.name if fn.vjp_of else None}); pass the vjp of {want}")
            _check_vjp_kernel(fn, launches[0], name)
    for node in graph.nodes:
        op = node.op
        if isinstance(op, Opaque) and node.name not in vjps:
            raise RefusedError(f"reverse: node {node.name!r} is an opaque node; vkml cannot know "
                               "its derivative -- pass its vjp: vjps={" + repr(node.name) + ": fn}")
        if isinstance(op, Reduce) and op.op != "sum":
            raise RefusedError(f"reverse: node {node.name!r} is a {op.op!r} reduction; a tie has no "
                               "single derivative -- use a 'sum' reduction, or take the node out "
                               "of what you differentiate")
        if isinstance(op, RepeatWhile) and not isinstance(op.member, Launch):
            raise RefusedError(f"reverse: the member of repeat_while {node.name!r} is not a kernel "
                               "launch; make it one kernel.bind(...) launch")
        for launch in node.launches():
            if node.name in vjps:
                continue
            try:
                batch, _ = launch.batched_vjp()
                batch.executable(launch.n)
            except VkmlError as err:      # whatever stops the derivation (a GradError, or an
                # op's transpose refusing its operands) is a kernel without a vjp
                raise RefusedError(f"reverse: node {node.name!r} ({launch.kernel.name}) has no vjp "
                                   f"({err}); pass one with vjps={{{node.name!r}: vjp_kernel}}") from err


def graph_bitwise(graph):
    """``Graph.bitwise``: found once per build of the graph."""
    return graph.caches.structure.get_or_make("bitwise", lambda: _scan_bitwise(graph))[0]


def _scan_bitwise(graph):
    flags = {}
    for node in graph.nodes:
        for launch in node.launches():
            prog = launch.program
            k = len(launch.kernel.inputs)
            for j, p in enumerate(launch.kernel.params):
                ok = not uses_table(prog, k + j)
                flags[f"{node.name}.{p}"] = ok
                flags[p] = flags.get(p, True) and ok
            for name in launch.kernel.inputs:
                flags.setdefault(name, True)
                flags.setdefault(f"{node.name}.{name}", True)
    return flags


class GraphReverseCall:
    """One reverse call of a Graph's Record, checked (``prepare``): the seeds by tape key, whether
    they are only read, the bitwise flags and the names asked for."""

    __slots__ = ("seeds", "plain", "flags", "wrt")

    def __init__(self, seeds, plain, flags, wrt):
        self.seeds, self.plain, self.flags, self.wrt = seeds, plain, flags, wrt


def prepare(graph, record, seeds, wrt, strict) -> GraphReverseCall:
    """``Graph.prepare_reverse``: the Record is this graph's and current, its planes unchanged,
    the seeds resolved, ``wrt`` known and, with ``strict``, bitwise."""
    wrt = reverse_options(wrt, strict)
    if not isinstance(record, Record):
        raise ArgumentError(f"reverse: expected a Record (graph.record), got {type(record).__name__}")
    if record.graph is not graph:
        raise ArgumentError("reverse: this Record belongs to another graph than this Reverse's")
    record.check_current(planes=False)      # (the planes are checked under the graph's lock)
    if not record.kept:                     # the reverse reads the planes themselves
        graph.check_planes("reverse")
    if graph.device_planes:
        graph.check_plane_backend("reverse")
    # the seeds are only read (never written in place) unless an opaque node's vjp gets them
    plain = record.steps_only or not any(isinstance(e, OtherEntry) for e in record.tape)
    key_seeds = resolve_seeds(record, seeds, copy=not plain, device=record.on_device)
    flags = graph_bitwise(graph)
    if wrt is not None:
        unknown = [w for w in wrt if w not in flags]
        if unknown:
            raise ArgumentError(f"reverse: wrt names {unknown} are not inputs or Params; "
                                f"choose from {sorted(flags)}")
    if strict:
        bad = [k for k, ok in flags.items() if not ok and "." in k and (wrt is None or k in wrt
                                                                      or k.split(".")[1] in wrt)]
        if bad:
            raise RefusedError(f"reverse(strict=True): the gradients of {bad} are scatter-adds "
                               "across samples (a table read by index), which are not bitwise; "
                               "pass strict=False, or leave them out by naming only the other inputs in wrt")
    return GraphReverseCall(key_seeds, plain, flags, wrt)


def sweep(record, call, vjps, workspace) -> Gradients:
    """``Graph.sweep``: every gradient of ``record`` in one sweep of its tape."""
    values, parts = _sweep(record, call.seeds, vjps, workspace)
    _detach(values, list(call.seeds.values()) if call.plain else [], workspace)
    wrt = call.wrt
    if wrt is not None:
        values = {k: v for k, v in values.items() if k in wrt or k.split(".")[-1] in wrt
                  and "." in k}
    return Gradients(values, Report(record.generation,
                                    {k: v for k, v in call.flags.items() if k in values}), parts)


def _check_vjp_kernel(vjp_kernel, launch, node_name):
    """A hand-written vjp kernel must agree, on random samples, with the derived vjp -- or, for a
    kernel vkml cannot derive one for, with central differences of the kernel itself."""
    rng = np.random.default_rng(0)
    n = 4
    kern = launch.kernel
    prog = launch.program
    ins = [rng.uniform(0.2, 0.9, (n,) + v.shape).astype(v.dtype) for v in prog.inputs[:len(kern.inputs)]]
    params = [launch.params[p] for p in kern.params]
    cts = [rng.uniform(0.2, 0.9, (n,) + v.shape).astype(v.dtype) for v in prog.outputs]
    got = run_user_vjp(vjp_kernel, launch, ins, params, cts, n)
    try:
        batch, wrt = launch.batched_vjp()
        want = batch.run(n, ins + params + cts)
        against = "the derived vjp"
    except (VkmlError, ExecutionFailure):
        try:
            wrt, want = central_vjp(launch, ins, params, cts, n)
        except ExecutionFailure as failure:
            raise RefusedError(f"Reverse: cannot check {vjp_kernel.name} against central differences "
                               f"of {kern.name} on sample inputs ({failure.error}); pass a vjp kernel "
                               "for a kernel vkml derives a vjp for") from failure.error
        against = f"central differences of {kern.name}"
    names = [kern.inputs[i] if i < len(kern.inputs) else kern.params[i - len(kern.inputs)] for i in wrt]
    tol = (1e-5, 1e-8) if against == "the derived vjp" else (1e-4, 1e-6)
    for name, w in zip(names, want):
        g = got.get(name)
        if g is None or np.shape(g) != np.shape(w) or not np.allclose(g, w, rtol=tol[0], atol=tol[1]):
            raise RefusedError(f"Reverse: {vjp_kernel.name} is not the vjp of node {node_name!r}'s kernel "
                               f"{kern.name}: its {name}_bar disagrees with {against}")


class _Adjoints:
    """Adjoints per plane version, added in the fixed order: seed first, then readers as they ran
    (``plus``: how two are added -- on the device for a Record there)."""

    def __init__(self, seeds, plus=None):
        self.seed = dict(seeds)
        self.parts = {}
        self.plus = plus

    def add(self, key, order, value):
        self.parts.setdefault(key, []).append((order, value))

    def take(self, key):
        parts = sorted(self.parts.pop(key, []), key=lambda p: p[0])
        total = self.seed.pop(key, None)
        for _, v in parts:                                 # never in place: nothing is copied
            total = v if total is None else total + v if self.plus is None else self.plus(total, v)
        return total


def adjoint_buffers(launch, handed_back, tag, workspace, n):
    """Destinations for the results of ``launch``'s derived vjp over ``n`` samples: buffers of
    ``workspace`` (under ``(tag, position)``) for the values that live only inside the reverse
    call -- per-sample Param cotangents (tree-summed at once) and the adjoints of inputs for
    which ``handed_back(name)`` is false (read by an earlier launch's vjp) -- and None (a fresh
    array) for the adjoints the caller gets."""
    batch, wrt = launch.batched_vjp()
    _, program = batch.executable(n)
    n_in = len(launch.kernel.inputs)
    return [None if pos < n_in and handed_back(launch.kernel.inputs[pos]) else
            workspace.buffer((tag, pos), var.shape, var.dtype)
            for pos, var in zip(wrt, program.outputs)]


def summed(ct, workspace):
    """The canonical-tree sum of per-sample cotangents, its levels in a workspace buffer."""
    n = ct.shape[0]
    return tree_sum(ct, scratch=workspace.buffer("tree", ((n + 1) // 2,) + ct.shape[1:], ct.dtype)
                    if n > 1 else None)


def _detach(values, seeds, workspace):
    """Copy any gradient that may share memory with one of the caller's ``seeds`` or a buffer of
    ``workspace``, so what is handed back is the caller's own."""
    own = {}                # id -> what to hand back: each array is looked at once
    for name, v in values.items():
        if isinstance(v, np.ndarray) and v.ndim:
            got = own.get(id(v))
            if got is None:
                got = own[id(v)] = v.copy() if _shares_memory(v, seeds) or workspace.holds(v) \
                    else v
            values[name] = got


def _shares_memory(v, arrays) -> bool:
    for a in arrays:
        if np.may_share_memory(v, a):
            return True
    return False


#: Up to this many samples a plain-launch reverse runs as one fused program over all of them.
#: Above it, the same program runs over aligned chunks of this many samples: its temporaries
#: (every intermediate adjoint, every per-sample Param cotangent) then stay in the processor's
#: caches instead of streaming through memory, so the reverse reads the inputs and seeds and
#: writes the gradients about once -- and each chunk's Param sum is a subtree of the canonical
#: tree, so the chunk sums combine to the one-pass bits.
FUSE_SAMPLES = 1 << 15


def _fusable(record, vjps):
    """A tape of plain launches whose vjps vkml derives: its reverse can be ONE program (over
    chunks of samples, one thread)."""
    if vjps or not record.steps_only:
        for e in record.tape:
            if type(e) is not Step or e.node.name in vjps:
                return False
    return threads() == 1 or record.on_device


@dataclass(frozen=True, eq=False)
class ReversePlan:
    """The whole reverse sweep of a plain-launch tape as ONE program, for one set of seeded plane
    versions (made by :func:`_fused_reverse_plan`, cached in the graph's ``reverse_plans``)."""

    #: the compiled program and the backend it runs on
    exe: object
    backend: object
    #: its inputs: these plane versions (``record.value``), the Param cells under these keys,
    #: then the seeds (sorted by plane version)
    in_keys: list
    cell_keys: list
    #: its outputs: the adjoints of these version-0 reads (graph inputs), then one Param
    #: cotangent per ``((node, Param), order)`` in ``params``, summed over the samples with the
    #: canonical tree inside the program
    grad_keys: list
    params: list
    #: what the Gradients hold, by structure (``_gradient_layout``)
    layout: tuple
    #: the program's equations (to name a failing one)
    eqns: list
    #: the program's output Vars (their shapes and dtypes)
    exe_outputs: list
    #: how the Gradients are put together from the outputs (``_FusedAssembly``)
    assembly: object = None


def _fused_reverse_plan(record, seed_keys, n, tree) -> ReversePlan:
    """The whole reverse sweep of a plain-launch tape as one Program over ``n`` samples (all of
    them, or a chunk), for one set of seeded keys.

    Inputs: the plane versions the launches read, the Param cells, the seeds.  Outputs: the
    adjoint of every version-0 read (a graph input), then each launch's Param cotangents summed
    over the ``n`` samples with the canonical tree of ``tree`` leaves (zero-padded).  Adjoints
    meet in the same fixed order as the step-by-step sweep (seed first, then the readers in the
    order they ran), so the bits are the same.
    """
    placeholders, in_keys = {}, []

    def value_var(key):
        if key not in placeholders:
            value = record.value(key)
            placeholders[key] = Var((n,) + value.shape[1:], value.dtype)
            in_keys.append(key)
        return placeholders[key]

    cell_keys = list(record.cells)
    cell_vars = [Var(c.shape, c.dtype) for c in record.cells.values()]
    cell_of = dict(zip(cell_keys, cell_vars))
    seed_vars = {}
    for key in seed_keys:
        pid, _ = key
        plane = record.planes[pid]
        seed_vars[key] = Var((n,) + plane.shape[1:], plane.dtype)
    parts = {}

    def take(key):
        total = seed_vars.get(key)
        for _, v in sorted(parts.pop(key, []), key=lambda p: p[0]):
            total = v if total is None else api.add(total, v)
        return total

    param_outs = []
    for step in reversed(record.tape):
        launch = step.launch
        kern = launch.kernel
        cts, live = [], False
        for name, var in zip(launch.out_names, launch.program.outputs):
            ct = take(step.writes[name])
            live = live or ct is not None
            cts.append(api.zeros((n,) + var.shape, var.dtype) if ct is None else ct)
        if not live:
            continue
        batch, wrt = launch.batched_vjp()
        ins = [value_var(step.reads[nm]) for nm in kern.inputs]
        outs = inline(batch.program(n), ins + [cell_of[(step.node.name, p)] for p in kern.params] + cts)
        order = (step.index, 0)
        for pos, ct in zip(wrt, outs):
            if pos < len(kern.inputs):
                parts.setdefault(step.reads[kern.inputs[pos]], []).append((order, ct))
            else:
                param_outs.append(((step.node.name, kern.params[pos - len(kern.inputs)]), order, ct))
    grad_keys = [k for k in list(parts) + list(seed_vars) if k[1] == 0]
    grad_keys = list(dict.fromkeys(grad_keys))
    grads = [take(k) for k in grad_keys]
    outputs = grads + [canonical_sum(ct, tree) for _, _, ct in param_outs]
    inputs = [placeholders[k] for k in in_keys] + cell_vars + [seed_vars[k] for k in seed_keys]
    program = program_from_dag(inputs, outputs)
    backend = backends.current()
    exe = backend.executable(("graph-reverse", program), lambda: program)
    plan = ReversePlan(exe=exe, backend=backend, in_keys=in_keys, cell_keys=cell_keys,
                       grad_keys=grad_keys, params=[(k, order) for k, order, _ in param_outs],
                       layout=_gradient_layout(record), eqns=program.eqns,
                       exe_outputs=list(program.outputs))
    return replace(plan, assembly=_FusedAssembly(plan, record.cells))


class _Slot:
    """An output of a fused reverse program (or a sum of outputs, in order) standing in for its
    array while :class:`_FusedAssembly` works out once what ``_assemble`` makes of them."""

    __slots__ = ("terms",)

    def __init__(self, terms):
        self.terms = terms

    def __add__(self, other):
        return _Slot(self.terms + other.terms)


class _FusedAssembly:
    """What ``_assemble`` and ``fold_params`` make of a fused reverse's outputs, found once per
    plan by running them on stand-ins (``_Slot``), so a reverse only fills it in: the same names
    in the same order, the same arrays shared between names, the same sums in the same order,
    a fresh zero array wherever they make one."""

    def __init__(self, plan, cells):
        n_g = len(plan.grad_keys)
        param_parts = {}
        for j, (name, order) in enumerate(plan.params):
            param_parts.setdefault(name, []).append((order, _Slot((n_g + j,))))
        values = _assemble(None, _Computed({k: _Slot((i,)) for i, k in enumerate(plan.grad_keys)}),
                           param_parts, plan.layout, cells, zeros=_PlaneZeros)
        sources = {}
        #: ``(name, source index)`` in the Gradients' order; a source: output indices to add
        #: in order, or a fresh zero array: ``_PlaneZeros`` (a plane's gradient) or a Param's
        #: ``(shape, dtype)``
        self.values = [(name, sources.setdefault(id(v), len(sources))) for name, v in values.items()]
        self.sources = [None] * len(sources)
        for v in values.values():
            self.sources[sources[id(v)]] = v.terms if isinstance(v, _Slot) else \
                v if isinstance(v, _PlaneZeros) else (v.shape, v.dtype)
        #: ``Gradients.parts``: per (node, Param), ``(order, output index)`` oldest first
        self.parts = [(name, [(order, v.terms[0]) for order, v in parts])
                      for name, parts in param_parts.items()]

    def fill(self, outputs, on_device=False):
        """``(values, parts)`` of one reverse whose program gave ``outputs`` (``on_device``: its
        gradients are device planes, so a plane's zero gradient is made there too)."""
        made = []
        for source in self.sources:
            if isinstance(source, _PlaneZeros):
                total = source.make(on_device)
            elif type(source[0]) is int:
                total = outputs[source[0]]
                for i in source[1:]:
                    total = total + outputs[i]
            else:
                total = np.zeros(*source)
            made.append(total)
        return ({name: made[i] for name, i in self.values},
                {name: [(order, outputs[i]) for order, i in parts] for name, parts in self.parts})


def canonical_sum(v, tree=None):
    """:func:`~vkml.graph.treesum.tree_sum` over axis 0 as equations of a program: zero-padded
    to a power of two (``tree`` leaves, when given: a chunk's subtree), adjacent pairs added
    level by level -- the same additions in the same order, so the same bits, and no per-sample
    array leaves the program."""
    n, rest = v.shape[0], v.shape[1:]
    p = tree or 1 << (n - 1).bit_length()
    if p != n:
        v = api.pad(v, (0,) * v.ndim, (p - n,) + (0,) * len(rest))
    zeros = (0,) * len(rest)
    while p > 1:
        v = api.add(api.slice(v, (0,) + zeros, (p,) + rest, (2,) + (1,) * len(rest)),
                    api.slice(v, (1,) + zeros, (p,) + rest, (2,) + (1,) * len(rest)))
        p //= 2
    return api.reshape(v, rest)


class _Computed:
    """Adjoints already computed (by the fused reverse program), taken like ``_Adjoints``."""

    def __init__(self, values):
        self.values = values

    def take(self, key):
        return self.values.pop(key, None)


def _fused_sweep(record, seeds):
    """The fused reverse program over all samples, or over aligned chunks of
    ``FUSE_SAMPLES`` (the gradients written chunk by chunk into arrays for the caller, the Param
    sums combined with the canonical tree): ``(values, parts)`` as ``_sweep`` returns them."""
    n = record.graph.n
    seed_keys = tuple(sorted(seeds))
    key = (seed_keys, id(backends.current()), len(record.tape))    # plain steps: 0, 1, ... in order

    def plan_for(m, tree):
        return record.graph.caches.reverse_plans.get_or_make(
            key + (m, tree), lambda: _fused_reverse_plan(record, seed_keys, m, tree))[0]

    if n <= FUSE_SAMPLES or record.on_device:
        # on the device: one program over all the samples, its gradients left there (device
        # planes); the Param sums, one value each, come to the host
        plan = plan_for(n, None)
        args = [record.value(k) for k in plan.in_keys] + [record.cells[k] for k in plan.cell_keys] + \
            [seeds[k] for k in seed_keys]
        values = submit(plan.backend, plan.exe, args, plan.eqns, resident=record.on_device)
        n_g = len(plan.grad_keys)
        grads, sums = values[:n_g], values[n_g:]
        if record.on_device:
            sums = [np.asarray(v) for v in sums]
    else:
        # the gradients and every chunk's Param sums go straight into arrays made once (no
        # array per chunk); the chunks' sums are subtrees of the canonical tree, so their tree
        # sum has the one-pass bits (``treesum.combine``)
        grads, partials, plan = None, None, None
        for c, s in enumerate(range(0, n, FUSE_SAMPLES)):
            e = min(s + FUSE_SAMPLES, n)
            plan = plan_for(e - s, FUSE_SAMPLES)
            n_g = len(plan.grad_keys)
            if grads is None:
                grads = [np.empty((n,) + v.shape[1:], v.dtype) for v in plan.exe_outputs[:n_g]]
                partials = [np.empty((-(-n // FUSE_SAMPLES),) + v.shape, v.dtype)
                            for v in plan.exe_outputs[n_g:]]
            args = [record.value(k)[s:e] for k in plan.in_keys] + \
                [record.cells[k] for k in plan.cell_keys] + [seeds[k][s:e] for k in seed_keys]
            submit(plan.backend, plan.exe, args, plan.eqns,
                   into=[g[s:e] for g in grads] + [p[c, ...] for p in partials])
        sums = [tree_sum(p) for p in partials]
    return plan.assembly.fill(grads + sums, record.on_device)


def _sweep(record, seeds, vjps, workspace):
    if _fusable(record, vjps):
        return _fused_sweep(record, seeds)
    if record.on_device:
        return _device_sweep(record, seeds, vjps)
    return _sweep_steps(record, seeds, vjps, workspace)


def _device_sweep(record, seeds, vjps):
    """:func:`_sweep_steps` on a Record whose planes live on the device: seeds made device
    arrays (a NumPy seed: one copy in), every adjoint kept there; a gradient that is a seed
    itself (a plane nothing read after it was seeded) handed back as a copy."""
    backend = backends.current()
    on_device = {k: backend.to_plane(v) for k, v in seeds.items()}
    values, parts = _sweep_steps(record, on_device, vjps, None, resident=True)
    given = {id(v) for v in on_device.values()}
    return {k: backend.copy_plane(v) if id(v) in given else v for k, v in values.items()}, parts


def _sweep_steps(record, seeds, vjps, workspace, resident=False):
    """The tape reversed launch by launch (``resident``: on device planes, see the module
    docstring)."""
    cells = record.cells
    n = record.graph.n
    adj = _Adjoints(seeds, device.plus if resident else None)
    param_parts = {}
    zeros = (lambda shape, dtype: device.zeros(shape, dtype)) if resident else workspace.zeros
    param_sum = device.tree_sum if resident else (lambda ct: summed(ct, workspace))

    def reverse_step(step, order):
        launch = step.launch
        cts, live = [], False
        for name, var in zip(launch.out_names, launch.program.outputs):
            ct = adj.take(step.writes[name])
            live = live or ct is not None
            cts.append(zeros((n,) + var.shape, var.dtype) if ct is None else ct)
        if not live:
            return
        inputs = [record.value(step.reads[nm]) for nm in launch.kernel.inputs]
        vjp = vjps.get(step.node.name)
        # the adjoint of a graph input (a version-0 read) is handed back: a fresh array
        into = None if vjp is not None or resident else \
            adjoint_buffers(launch, lambda nm: step.reads[nm][1] == 0, ("step", step.index),
                            workspace, n)
        ins, prm = reverse_launch(launch, step.node, inputs, cells, cts, n, vjp, into, resident)
        for nm, ct in ins.items():
            adj.add(step.reads[nm], order, ct)
        for p, ct in prm.items():
            param_parts.setdefault((step.node.name, p), []).append((order, param_sum(ct)))

    for entry in reversed(record.tape):
        order = (entry.index, 0)
        if isinstance(entry, Step):
            reverse_step(entry, order)
        elif isinstance(entry, SkipEntry):
            if entry.guard and entry.step is not None:   # the recorded guard, never evaluated again
                reverse_step(entry.step, order)
        elif isinstance(entry, LoopEntry):
            _reverse_loop(entry, record, adj, param_parts, n, vjps.get(entry.node.name), resident)
        elif isinstance(entry, OtherEntry):
            op = entry.node.op
            if isinstance(op, Reduce):
                ct = adj.take(entry.writes["dst"])
                if ct is not None:
                    adj.add(entry.reads["src"], order,
                            np.broadcast_to(np.reshape(ct, op.src.shape[1:]), op.src.shape).copy())
            else:
                cts = {k: adj.take(key) for k, key in entry.writes.items()}
                if all(c is None for c in cts.values()):
                    continue
                primals = {k: record.value(key) for k, key in entry.reads.items()}
                cts = {k: (np.zeros_like(op.writes[k]) if c is None else c) for k, c in cts.items()}
                try:
                    got = vjps[entry.node.name](primals, cts)
                except Exception as err:     # noqa: BLE001 - the user's vjp: named
                    raise user_error(err, f"the vjp of opaque node {entry.node.name!r}")
                for k, ct in user_vjp_gradients(entry.node, got, entry.reads, primals).items():
                    adj.add(entry.reads[k], order, ct)
    plane_zeros = (lambda plane: device.zeros(plane.shape, plane.dtype)) if resident else np.zeros_like
    return _assemble(record, adj, param_parts, zeros=plane_zeros), param_parts


def _assemble(record, adj, param_parts, layout=None, cells=None, zeros=np.zeros_like):
    """The Gradients' values: input planes by their bound names, Params summed oldest first.
    ``layout``: :func:`_gradient_layout` of the record, when the caller has it cached (and
    ``cells`` its Param cells: then ``record`` is not read); ``zeros(plane)``: the gradient of a
    plane no cotangent reached."""
    cells = record.cells if cells is None else cells
    bindings, params = layout or _gradient_layout(record)
    values = {}
    plain = {}
    for key, plane, names in bindings:
        g = adj.take(key)
        g = zeros(plane) if g is None else g
        for node_name, nm in names:
            values[f"{node_name}.{nm}"] = g
            plain.setdefault(nm, set()).add(key)
            if len(plain[nm]) == 1:
                values[nm] = g
    for nm, keys in plain.items():
        if len(keys) > 1:              # two different planes bound under one name: only "node.name"
            values.pop(nm, None)
    for key in params:
        param_parts.setdefault(key, [])
    values.update(fold_params(param_parts, cells, taken=set(values)))
    return values


class _PlaneZeros:
    """The gradient of a plane no cotangent reached, as a fused reverse's assembly keeps it: made
    afresh by every reverse, on the device beside the other gradients when they are there."""

    def __init__(self, plane):
        self.shape, self.dtype = plane.shape, plane.dtype

    def make(self, on_device):
        if on_device:
            return backends.current().zeros_plane(self.shape, self.dtype)
        return np.zeros(self.shape, self.dtype)


def fold_params(param_parts, cells, taken=()):
    """Param gradients from their parts (``Gradients.parts``): each launch's canonical-tree sum,
    added oldest first, under ``"node.param"`` and, for a Param name no input plane ``taken``,
    under the plain name (every node's parts, oldest first).  Sorts each list of parts in place."""
    values, by_param, like = {}, {}, {}
    for (node_name, p), parts in param_parts.items():
        parts.sort(key=lambda x: x[0])
        values[f"{node_name}.{p}"] = _fold(parts, cells[(node_name, p)])
        by_param.setdefault(p, []).extend(parts)
        like.setdefault(p, cells[(node_name, p)])
    for p, parts in by_param.items():       # a Param shared by name: every node's, oldest first
        if p not in taken:
            values[p] = _fold(sorted(parts, key=lambda x: x[0]), like[p])
    return values


def _gradient_layout(record):
    """What a reverse of this tape returns, by structure: ``(bindings, params)`` -- each graph
    input (a floating plane version read before anything wrote it) with the node inputs bound to
    it, and every (node, Param).  The same for every reverse of tapes of the same structure."""
    graph = record.graph
    bindings = {}
    read_keys = _read_keys(record.tape)
    written = set()
    for node in graph.nodes:
        reads = [(nm, p) for launch in node.launches() for nm, p in launch.reads.items()]
        writes = [p for launch in node.launches() for p in launch.writes.values()]
        if isinstance(node.op, (Opaque, Reduce)):
            reads += list(node.op.reads.items())
            writes += list(node.op.writes.values())
        for nm, plane in reads:
            key = read_keys.get((node.name, nm))
            if key is None and id(plane) not in written:
                key = (id(plane), 0)               # a node that did not run: its inputs still count
            if key is not None and key[1] == 0 and plane.dtype.kind == "f":
                bindings.setdefault(key, (plane, []))[1].append((node.name, nm))
        written.update(id(p) for p in writes)
    params = [(node.name, p) for node in graph.nodes for launch in node.launches()
              for p in launch.kernel.params]
    return [(key, plane, names) for key, (plane, names) in bindings.items()], params


def _read_keys(tape):
    """(node, input name) -> the plane version it read, for every node that ran."""
    out = {}
    for e in tape:
        if isinstance(e, Step):
            reads = e.reads
        elif isinstance(e, SkipEntry):
            reads = e.step.reads if e.step is not None else {}
        elif isinstance(e, LoopEntry):
            reads = e.start_reads
        else:
            reads = e.reads
        for nm, key in reads.items():
            out.setdefault((e.node.name, nm), key)
    return out


def _fold(parts, like):
    total = None
    for _, v in parts:
        total = v if total is None else total + v
    return np.zeros_like(like, dtype=like.dtype if like.dtype.kind == "f" else np.float64) \
        if total is None else total


def _reverse_loop(entry, record, adj, param_parts, n, vjp=None, resident=False):
    """A repeat_while reversed from its recorded iteration count, newest iteration first; its states
    are rebuilt from the checkpoints on private copies, so the planes are never written
    (``resident``: on the device, see the module docstring)."""
    zeros_of = (lambda n, var: device.zeros((n,) + var.shape, var.dtype)) if resident else zeros
    launch, node = entry.launch, entry.node
    kern = launch.kernel
    state = entry.state
    out_cts = {}
    any_live = False
    for name in launch.out_names:
        ct = adj.take(entry.end_writes[name])
        any_live = any_live or ct is not None
        out_cts[name] = ct
    if entry.iterations == 0 or not any_live:
        for name in state:                        # pass-through: the adjoint stays with the plane
            if out_cts.get(name) is not None:
                adj.add(entry.start_reads[name], (entry.index, 0), out_cts[name])
        return
    prog = launch.program
    var_of = dict(zip(launch.out_names, prog.outputs))
    ct_state = {s: out_cts[s] if out_cts[s] is not None else zeros_of(n, var_of[s]) for s in state}
    fixed = {nm: record.value(entry.start_reads[nm]) for nm in kern.inputs if nm not in state}
    cells = record.cells
    batch = launch.batched()
    flags = [True] * len(kern.inputs) + [False] * len(kern.params)
    params = [cells[(node.name, p)] for p in kern.params]
    starts = sorted(entry.checkpoints)
    for c in reversed(starts):
        end = min(c + entry.window, entry.iterations)
        cur = {s: entry.checkpoints[c][s].copy() for s in state}
        states = []
        for it in range(c, end):
            states.append(dict(cur))
            if it < end - 1:
                args = [cur[nm] if nm in state else fixed[nm] for nm in kern.inputs] + params
                where = f"node {node.name!r} ({kern.name})"
                outs = device.run_resident(batch, n, args, where) if resident else \
                    run_named(batch, n, args, flags, where)
                new = dict(zip(launch.out_names, outs))
                cur = {s: new[s] for s in state}
        for it in reversed(range(c, end)):
            ins = [states[it - c][nm] if nm in state else fixed[nm] for nm in kern.inputs]
            cts = []
            for name in launch.out_names:
                if name in state:
                    cts.append(ct_state[name])
                elif it == entry.iterations - 1 and out_cts[name] is not None:
                    cts.append(out_cts[name])
                else:
                    cts.append(zeros_of(n, var_of[name]))
            ins_ct, prm = reverse_launch(launch, node, ins, cells, cts, n, vjp, resident=resident)
            for s in state:
                ct_state[s] = ins_ct.get(s, zeros_of(n, var_of[s]))
            for nm, ct in ins_ct.items():
                if nm not in state:
                    adj.add(entry.start_reads[nm], (entry.index, it), ct)
            for p, ct in prm.items():
                param_parts.setdefault((node.name, p), []).append(
                    ((entry.index, it), device.tree_sum(ct) if resident else tree_sum(ct)))
    for s in state:
        adj.add(entry.start_reads[s], (entry.index, 0), ct_state[s])
