"""``vkml.diff``: every gradient of a recorded run, in one backward sweep, bitwise reproducible.

``reverse(record, seeds)`` walks the Record's tape from the last step to
the first.  Each launch is reversed by its kernel's vjp (derived once,
cached beside the kernel), recomputed from the values the launch read.
Where several launches read one plane version, their adjoints are added in
a fixed order -- the seed first, then the readers in the order they ran --
and a Param's per-sample gradients are summed with the canonical tree
(``treesum``), so the result is the same bits for every thread count, run
and memory budget.

``Reverse(graph)`` does the preparation once (vjps derived and compiled,
refusals checked) for a loop that launches and reverses many times.

On the cuda backend the reverse of a graph of plain kernel launches is one
program on the device planes: per-sample gradients come back as device
arrays (``.numpy()`` reads one on the host; ``__cuda_array_interface__``
hands it to CuPy or PyTorch without a copy), Param gradients (one value
each) as host values; a seed may be a device array too.  A reverse that
goes launch by launch (a hand-written vjp kernel, guards, loops) of a Record
whose planes are on the device stays there too: each launch's vjp runs on
the device planes and keeps its adjoints on the device, adjoints meeting at
a plane version are added there in the same order, and each Param's sum
over samples is computed there (one value back per launch).  Opaque nodes
run user Python on host values, so a graph holding one runs on host copies
of its planes (see ``run.py``) and its reverse computes from host
arrays."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from ..errors import ArgumentError, Busy, DTypeError, RefusedError, ShapeError, boundary
from .. import backends
from .execute import per_sample_values, run_named
from . import device
from .kernel import Kernel
from .reversible import Reversible
from .record import Record


class Report:
    """How a gradient was computed.

    - ``generation``: the Record's generation;
    - ``bitwise``: per gradient name, whether its bits are reproducible on every
      backend and thread count (False for a table read by index: a scatter-add
      across samples);
    - ``chunks``: passes the reverse took (memory budget);
    - ``recomputed_steps`` / ``peak_states``: the checkpointing cost of loops.

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
    >>> g.launch()
    <vkml.Graph: wave>
    >>> report = vkml.diff.reverse(g.record, {"y": np.ones(3)}).report
    >>> report.generation, report.bitwise, report.chunks
    (1, {'wave.k': True, 'k': True, 'x': True, 'wave.x': True}, 1)
    """

    def __init__(self, generation, bitwise, chunks=1, recomputed_steps=0, peak_states=0):
        self.generation = generation
        self.bitwise = bitwise
        self.chunks = chunks
        self.recomputed_steps = recomputed_steps
        self.peak_states = peak_states

    def __repr__(self):
        return (f"Report(generation={self.generation}, chunks={self.chunks}, "
                f"recomputed_steps={self.recomputed_steps}, peak_states={self.peak_states}, "
                f"bitwise={self.bitwise})")


class GradientMapping(Mapping):
    """A read-only mapping of gradients by name, with the report of how they were computed: the
    lookups one process's gradients and a sharded reverse's share."""

    def __init__(self, values, report):
        self._values = values
        self.report = report

    def __getitem__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"no gradient named {name!r}; gradients: {sorted(self._values)}") from None

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)


class Gradients(GradientMapping):
    """A read-only mapping: per-sample gradients of input planes (one row per sample, in sample
    order) and summed gradients of Params, keyed by their bound names (``"node.name"`` too).

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
    >>> g.launch()
    <vkml.Graph: wave>
    >>> grads = vkml.diff.reverse(g.record, {"y": np.ones(3)})
    >>> sorted(grads), grads["wave.k"].round(4)
    (['k', 'wave.k', 'wave.x', 'x'], np.float64(-0.146))
    """

    def __init__(self, values, report, parts=None):
        super().__init__(values, report)
        #: what each Param gradient was folded from: ``{(node, param): [(order, sum), ...]}``,
        #: oldest first, each ``sum`` the canonical-tree sum over this reverse's samples of one
        #: launch's (or loop iteration's) cotangents.  A reverse of a slice of the samples hands
        #: these on, so that slices can be combined in the tree's order (``vkml.distributed``).
        self.parts = parts if parts is not None else {}

    def __repr__(self):
        return f"<Gradients {sorted(self._values)}; {self.report!r}>"


def device_seed(name, seed, plane):
    """A device array seed (for a Record whose planes live on the device) as a device plane,
    without a copy: of the plane's shape and dtype, else refused (converting it would need the
    host)."""
    value = backends.current().to_plane(seed)
    if value.shape != tuple(plane.shape):
        raise ShapeError(f"seed {name!r} has shape {value.shape}, but plane {name!r} holds one value "
                         f"per sample, {tuple(plane.shape)}; pass one seed per sample")
    if value.dtype != plane.dtype:
        raise DTypeError(f"seed {name!r} is a device array of {value.dtype}, but plane {name!r} "
                         f"holds {plane.dtype}; pass a seed of {plane.dtype}")
    return value


def seed_array(name, seed, plane):
    """A seed as an array of numbers of the plane's shape (NaN and inf are values like any other;
    None, strings and objects are refused, as is a wrong shape)."""
    arr = None
    if seed is not None and not isinstance(seed, (str, bytes)):
        try:
            arr = np.asarray(seed)
        except (TypeError, ValueError):
            arr = None
    if arr is None or arr.dtype.kind not in "biuf":
        got = f"an array of {arr.dtype}" if arr is not None else type(seed).__name__
        raise ArgumentError(f"seed {name!r} must be an array of numbers, one per sample "
                            f"(e.g. np.ones({plane.shape})), got {got}")
    if arr.shape != plane.shape:
        raise ShapeError(f"seed {name!r} has shape {arr.shape}, but plane {name!r} holds one value "
                         f"per sample, {plane.shape}; pass one seed per sample (e.g. "
                         f"np.ones({plane.shape}))")
    return arr


def wrt_names(wrt):
    """``wrt`` as a list of names (one name or an iterable of names); None stays None."""
    if wrt is None:
        return None
    names = [wrt] if isinstance(wrt, str) else None
    if names is None:
        try:
            names = list(wrt)
        except TypeError:
            names = None
    if names is None or not all(isinstance(w, str) for w in names):
        raise ArgumentError(f"reverse: wrt must be a name or a list of names of inputs and Params, "
                            f"got {wrt!r}")
    return names


def check_vjps(vjps, strict):
    """``vjps`` (None or a dict of node name -> function or vjp kernel) and ``strict`` (a bool)."""
    if not isinstance(strict, (bool, np.bool_)):
        raise ArgumentError(f"Reverse: strict must be True or False, got {strict!r}")
    if vjps is None:
        return {}
    if not isinstance(vjps, Mapping):
        raise ArgumentError(f"Reverse: vjps must be a dict of node name -> vjp function or kernel, "
                            f"got {type(vjps).__name__}")
    for name, fn in vjps.items():
        if not isinstance(name, str):
            raise ArgumentError(f"Reverse: vjps keys are node names (strings), got {name!r}")
        if not callable(fn) and not hasattr(fn, "kind"):      # a graph node: refused below
            raise ArgumentError(f"Reverse: the vjp of node {name!r} must be a function "
                                f"fn(primals, cotangents) -> {{name: gradient}} or a vjp kernel, got "
                                f"{type(fn).__name__}")
    return dict(vjps)


def reverse_options(wrt, strict):
    """The options of one reverse call checked: ``wrt`` as a list of names (or None) and
    ``strict`` a bool (what a forward's ``prepare_reverse`` is given, by a Reverse or by hand)."""
    check_vjps(None, strict)
    return wrt_names(wrt)


def check_sweep(where, record_ok, prepared, prepared_type, vjps, workspace):
    """The arguments of a forward's ``reading``/``sweep`` (see ``reversible.py``), for a caller
    that drives the protocol by hand: a Record of this forward, what its ``prepare_reverse``
    returned, the vjps (checked as a Reverse checks them) and a Workspace.  Returns the vjps."""
    if not record_ok:
        raise ArgumentError(f"{where}: expected a Record of this forward (its .record after a "
                            "recorded run)")
    if prepared_type is None:               # ``reading``: the Record is all it takes
        return None
    if not isinstance(prepared, prepared_type):
        raise ArgumentError(f"{where}: prepared must be what prepare_reverse returned for this "
                            f"Record, got {type(prepared).__name__}")
    if not isinstance(workspace, Workspace):
        raise ArgumentError(f"{where}: workspace must be a vkml.diff.Workspace (a Reverse's "
                            f"own: rev.workspace), got {type(workspace).__name__}")
    return check_vjps(vjps, False)


def user_vjp_gradients(node, got, reads, like):
    """What an opaque node's vjp returned, checked: a dict of its read planes' names -> one
    gradient row per sample (floats, the plane's shape); anything else is refused naming the
    node.  ``like``: read name -> an array of the primal's shape (the samples the vjp saw)."""
    where = f"the vjp of opaque node {node.name!r}"
    if got is None:
        return {}
    if not isinstance(got, Mapping):
        raise ArgumentError(f"{where} must return a dict of read plane name -> gradient "
                            f"({sorted(reads)}), got {type(got).__name__}")
    unknown = [k for k in got if k not in reads]
    if unknown:
        raise ArgumentError(f"{where} returned gradients for {unknown}, which the node does not "
                            f"read; it reads {sorted(reads)}")
    return {k: per_sample_values(v, np.shape(like[k]), "f", f"{where}: gradient {k!r}")
            for k, v in got.items()}


class Workspace:
    """Buffers a :class:`Reverse` reuses from call to call for the values that live only inside
    one call: adjoints between two launches, per-sample Param cotangents before their tree sum,
    the tree sum's levels, missing cotangents (zeros).  Steady-state calls then allocate only
    what they hand back (fresh arrays the caller may keep), instead of taking fresh pages for
    every plane-sized temporary.  Used only under the Reverse's lock: one call at a time.

    >>> ws = vkml.diff.Workspace()
    >>> a = ws.buffer("adjoint", (3,), np.float64)
    >>> a is ws.buffer("adjoint", (3,), np.float64), ws.nbytes
    (True, 24)
    """

    def __init__(self):
        self._buffers = {}

    def buffer(self, tag, shape, dtype):
        """An array of ``shape`` and ``dtype`` kept under ``tag`` (its contents are whatever the
        last user left)."""
        key = (tag, shape, dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = np.empty(shape, dtype)
        return buf

    def zeros(self, shape, dtype):
        """Zeros of ``shape``, kept: only ever read (a cotangent nothing seeded)."""
        key = ("zeros", shape, dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = np.zeros(shape, dtype)
        return buf

    def holds(self, value):
        """Whether ``value`` may share memory with a buffer kept here."""
        return bool(self._buffers) and any(np.may_share_memory(value, b)
                                           for b in self._buffers.values())

    @property
    def nbytes(self):
        return sum(b.nbytes for b in self._buffers.values())


class Reverse:
    """A reverse built once from a Graph or a simulation (``rev(record, seeds)`` per launch):
    anything :class:`~vkml.graph.reversible.Reversible`, which checks and reverses its own
    Records.

    ``vjps={"node": fn}`` gives the derivative of a node vkml cannot see
    (an opaque model node: ``fn(primals, cotangents) -> {name: gradient}``)
    or replaces a kernel's derived vjp with a hand-written vjp kernel
    (``vkml.kernel(vjp_of=...)``), which is checked against the derived one.
    ``strict=True`` refuses gradients that are not bitwise.

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
    >>> g.launch()
    <vkml.Graph: wave>
    >>> rev = vkml.diff.Reverse(g)
    >>> rev(g.record, {"y": np.ones(3)})["k"].round(4)
    np.float64(-0.146)
    >>> g.update(k=1.0)
    <vkml.Graph: wave>
    >>> g.launch()
    <vkml.Graph: wave>
    >>> rev(g.record, {"y": np.ones(3)})["k"].round(4)
    np.float64(0.9791)
    """

    def __init__(self, forward, *, vjps=None, strict=False):
        if isinstance(forward, (Reverse, Gradients)):
            raise RefusedError("Reverse: a reverse of a reverse (second order) is not supported; "
                               "differentiate the forward graph once, or use vkml.grad/jacfwd on a "
                               "function for higher orders")
        vjps = check_vjps(vjps, strict)
        if not isinstance(forward, Reversible):
            raise ArgumentError(f"Reverse: expected a Graph or a simulation, got {type(forward).__name__}")
        forward.check_reversible(vjps)
        #: the Graph or simulation whose Records this reverses (see ``reversible.py``)
        self.forward = forward
        self.vjps = vjps
        self.strict = bool(strict)
        self._lock = threading.Lock()            # one call at a time
        self._workspace = Workspace()

    @property
    def workspace(self):
        """The buffers this Reverse reuses from call to call (never what a call hands back).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> rev = vkml.diff.Reverse(g)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> grads = rev(g.record, {"y": np.ones(3)})
        >>> rev.workspace.holds(grads["x"])
        False
        """
        return self._workspace

    def bitwise(self):
        """Per gradient name, whether it is bitwise (computed once per graph structure).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
        >>> g.launch()
        <vkml.Graph: wave>
        >>> vkml.diff.Reverse(g).bitwise()
        {'wave.k': True, 'k': True, 'x': True, 'wave.x': True}
        """
        return self.forward.bitwise()

    @boundary
    def __call__(self, record, seeds, wrt=None):
        """Every gradient of ``record`` for the cotangents ``seeds``: the protocol of
        ``reversible.py`` -- the forward checks the call, this Reverse's lock is taken (another
        thread gets ``Busy``), the Record counts a reader while the forward sweeps it, and is
        marked reversed."""
        forward = self.forward
        prepared = forward.prepare_reverse(record, seeds, wrt_names(wrt), self.strict)
        if not self._lock.acquire(blocking=False):
            raise Busy("Reverse: another thread is running this Reverse; give each thread its own "
                       "Reverse(forward)")
        try:
            with forward.reading(record):
                gradients = forward.sweep(record, prepared, self.vjps, self._workspace)
            record.reversed = True
            return gradients
        finally:
            self._lock.release()


def run_user_vjp(vjp_kernel, launch, inputs, params, cts, n, resident=False):
    """A vjp kernel over ``n`` samples: ``{input or Param name: per-sample cotangent}``."""
    batch, in_names, param_names, out_names = launch.batched_user_vjp(vjp_kernel)
    kern = launch.kernel
    by_name = dict(zip(kern.inputs, inputs))
    by_name.update({f"{o}_bar": c for o, c in zip(launch.out_names, cts)})
    pvals = dict(zip(kern.params, params))
    args = [by_name[nm] for nm in in_names] + [pvals[nm] for nm in param_names]
    flags = [True] * len(in_names) + [False] * len(param_names)
    outs = device.run_resident(batch, n, args, f"vjp kernel {vjp_kernel.name}") if resident else \
        run_named(batch, n, args, flags, f"vjp kernel {vjp_kernel.name}")
    return {nm[:-4]: v for nm, v in zip(out_names, outs) if nm.endswith("_bar")}


def central_vjp(launch, ins, params, cts, n):
    """Per-sample cotangents of the floating inputs and Params by central differences of the
    kernel (samples are independent, so one perturbation serves every sample)."""
    batch = launch.batched()

    def objective(ins_, params_):
        outs = batch.run(n, list(ins_) + list(params_))
        total = np.zeros(n)
        for o, c in zip(outs, cts):
            if o.dtype.kind == "f":
                total += np.sum((np.asarray(o, np.float64) * c).reshape(n, -1), axis=1)
        return total

    wrt, want = [], []
    args = list(ins) + list(params)
    for pos, a in enumerate(args):
        if np.asarray(a).dtype.kind != "f":
            continue
        a = np.asarray(a)
        batched = pos < len(ins)
        h = 1e-6 if a.dtype == np.float64 else 1e-3
        shape = a.shape[1:] if batched else a.shape
        g = np.zeros((n,) + shape)
        for j in np.ndindex(*shape):
            at = (slice(None),) + j if batched else j
            lo, hi = a.copy(), a.copy()
            lo[at] -= h
            hi[at] += h
            pick = lambda v: args[:pos] + [v] + args[pos + 1:]          # noqa: E731
            d = (objective(pick(hi)[:len(ins)], pick(hi)[len(ins):]) -
                 objective(pick(lo)[:len(ins)], pick(lo)[len(ins):])) / (2 * h)
            g[(slice(None),) + j] = d
        wrt.append(pos)
        want.append(g)
    return wrt, want


@boundary
def reverse(record, seeds, *, wrt=None, vjps=None, strict=False):
    """Every gradient of a recorded launch: the eager door (builds a Reverse per call).

    ``seeds`` maps output planes (``"node.plane"`` or a unique plane name) to one
    seed per sample; outputs not named are seeded with zero.  Returns
    :class:`Gradients` keyed by input plane and Param names.

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
    >>> g.launch()
    <vkml.Graph: wave>
    >>> grads = vkml.diff.reverse(g.record, {"wave.y": np.ones(3)})
    >>> grads["x"].round(4), grads["k"].round(4)
    (array([ 2.    ,  1.0806, -0.8323]), np.float64(-0.146))
    """
    if isinstance(record, (Gradients, Reverse)):
        raise RefusedError("reverse: a reverse of a reverse (second order) is not supported; pass "
                           "the Record of a forward launch (graph.record), or use vkml.grad/jacfwd "
                           "on a function for higher orders")
    if getattr(record, "simulation", None) is not None:      # a simulation's Record
        return Reverse(record.simulation, vjps=vjps, strict=strict)(record, seeds, wrt=wrt)
    if isinstance(getattr(record, "forward", None), Reversible):   # one that names its forward
        return Reverse(record.forward, vjps=vjps, strict=strict)(record, seeds, wrt=wrt)
    if record is None:
        raise ArgumentError("reverse: there is no Record (graph.record is None): build the graph "
                            "with graph.build(record=True) and launch() it, then reverse "
                            "graph.record")
    if not isinstance(record, Record):
        raise ArgumentError(f"reverse: expected a Record (graph.record after launch()), got "
                            f"{type(record).__name__}")
    return Reverse(record.graph, vjps=vjps, strict=strict)(record, seeds, wrt=wrt)


def zeros(n, var):
    return np.zeros((n,) + var.shape, var.dtype)


def reverse_launch(launch, node, inputs, cells, cts, n, vjp=None, into=None, resident=False):
    """One launch's vjp over all samples: input cotangents and per-sample Param cotangents.
    ``vjp``: a hand-written vjp kernel passed as ``vjps={node: kernel}``, used instead of the
    derived one (an input or Param it returns no ``_bar`` for gets none).  ``into``: for the
    derived vjp, a destination (or None) per result (:func:`adjoint_buffers`).  Shared with a
    simulation's reverse, which steps back one launch at a time too.  ``resident``: the
    arguments are device planes and the cotangents stay on the device (``device.py``)."""
    kern = launch.kernel
    params = [cells[(node.name, p)] for p in kern.params]
    if isinstance(vjp, Kernel):
        got = run_user_vjp(vjp, launch, inputs, params, cts, n, resident)
        ins = {nm: got[nm] for nm in kern.inputs if nm in got and launch.reads[nm].dtype.kind == "f"}
        prm = {p: got[p] for p in kern.params if p in got and launch.params[p].dtype.kind == "f"}
        return ins, prm
    batch, wrt = launch.batched_vjp()
    flags = [True] * len(kern.inputs) + [False] * len(kern.params) + [True] * len(cts)
    where = f"the vjp of node {node.name!r} ({kern.name})" if node.name else f"the vjp of {kern.name}"
    outs = device.run_resident(batch, n, list(inputs) + params + list(cts), where) if resident \
        else run_named(batch, n, list(inputs) + params + list(cts), flags, where, into)
    ins, prm = {}, {}
    for pos, ct in zip(wrt, outs):
        if pos < len(kern.inputs):
            ins[kern.inputs[pos]] = ct
        else:
            prm[kern.params[pos - len(kern.inputs)]] = ct
    return ins, prm
