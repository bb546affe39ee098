"""Refused calls change nothing: state snapshots taken before and after each refusal (in the worker).

A *scenario* sets up some state (tensors with values and ``.grad``, a jitted
function with its caches, a Graph with planes and a live Record), snapshots
it, makes one call that must be refused, and snapshots again.  It returns
the error the call raised and every difference between the two snapshots.
Scenarios run on the backend named in their arguments (the cpu tier's
compiled programs fail differently from NumPy's: by an error code).
"""

from __future__ import annotations

import numpy as np

from .codec import decode


# -- snapshots ---------------------------------------------------------------------------------

def tensor_state(t) -> tuple:
    """A tensor's value bytes (or "pending"), dtype, shape, requires_grad, and its .grad's bytes."""
    var = t.ir_var
    value = "pending" if var.value is None else np.asarray(var.value).tobytes()
    grad = None
    if t.grad is not None:
        gv = t.grad.ir_var.value
        grad = "pending" if gv is None else np.asarray(gv).tobytes()
    return (value, str(t.dtype), tuple(t.shape), t.requires_grad, grad)


def jit_state(f) -> tuple:
    return (tuple(sorted(f.cache_info().items())), tuple(id(p) for p in f.programs()))


def graph_state(g) -> tuple:
    """Every plane's bytes, the Param cells, the generation, and the Record's identity and state."""
    planes = []
    for node in g.nodes:
        for which in ("reads", "writes"):
            for arg, plane in node.bindings(which):
                planes.append((node.name, which, arg, plane.tobytes()))
    cells = tuple((k, v.tobytes()) for k, v in sorted(g.cells.items()))
    rec = g.record
    record = None if rec is None else (id(rec), rec.generation, rec.live, rec.kept, rec.reversed)
    return (tuple(planes), cells, g.generation, record)


def differences(before: dict, after: dict) -> list:
    return [f"{name} changed" for name in before if before[name] != after[name]]


def _attempt(call):
    """Run the call that must be refused: (error class name, whether a VkmlError), or (None, _)."""
    import vkml
    try:
        result = call()
        if isinstance(result, vkml.Tensor):
            result.numpy()
    except vkml.VkmlError as err:
        return type(err).__name__, True
    except Exception as err:          # noqa: BLE001 -- a leak is reported, with the state check
        return type(err).__name__, False
    return None, False


def _refusal(snap, call) -> dict:
    before = snap()
    error, is_vkml = _attempt(call)
    after = snap()
    return {"error": error, "vkml": is_vkml, "changed": differences(before, after)}


# -- tensors, autograd and jit -----------------------------------------------------------------

def _tensors(args):
    import vkml
    arrays = [decode(a) for a in args["arrays"]]
    ts = [vkml.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    for t in ts:                                   # give every float tensor a .grad to protect
        if t.requires_grad:
            vkml.backward((t * t).sum())
    return ts


def tensor_refusal(args) -> dict:
    """One refused tensor-level call (``args["call"]``) over random tensors; see ``CALLS``."""
    import vkml
    vkml.set_backend(args["backend"])
    try:
        ts = _tensors(args)
        f = vkml.jit(lambda x: (x * 2).sum() + vkml.sum(x[:1]))
        f(ts[0])
        f(ts[0])
        pending = ts[0] + 1                          # a lazy value a refused realize must not settle

        def snap():
            out = {"tensors": [tensor_state(t) for t in ts], "pending": tensor_state(pending),
                   "jit": jit_state(f)}
            if args["call"] not in FAILS_WHILE_RUNNING:        # refused before anything ran
                out["submissions"] = vkml.stats().submissions
            return out
        return _refusal(snap, lambda: CALLS[args["call"]](ts, f, pending))
    finally:
        vkml.set_backend("numpy")


def _bad_index(ts):
    import vkml
    return vkml.take(ts[0].reshape(-1), vkml.tensor([0, 10 ** 6]))


#: calls refused by the program as it runs (their submission happened; nothing may be settled)
FAILS_WHILE_RUNNING = {"realize with a failing gather"}

#: refused calls over tensors ``ts`` (at least one), a jitted ``f`` and a ``pending`` tensor
CALLS = {
    "assign with one bad shape": lambda ts, f, p: vkml_().assign(
        ts, [t * 0 for t in ts[:-1]] + [vkml_().zeros((7, 5), ts[-1].dtype)]),
    "assign with one bad dtype": lambda ts, f, p: vkml_().assign(
        ts, [t * 0 for t in ts[:-1]] + [vkml_().zeros(ts[-1].shape, "bool" if ts[-1].dtype.kind != "b"
                                                       else "float32")]),
    "assign with a string source": lambda ts, f, p: vkml_().assign(ts, [t for t in ts[:-1]] + ["abc"]),
    "assign with fewer sources": lambda ts, f, p: vkml_().assign(ts, ts[:-1]),
    "backward of a non-scalar": lambda ts, f, p: vkml_().backward(ts[0] * 2),
    "backward of an int root": lambda ts, f, p: vkml_().backward(vkml_().sum(ts[0]).astype("int64")),
    "jit called with a string": lambda ts, f, p: f("abc"),
    "jit called with an object": lambda ts, f, p: f(object()),
    "jit whose trace fails": lambda ts, f, p: f(vkml_().tensor(1.0)),        # x[:1] of a 0-d
    "realize with a failing gather": lambda ts, f, p: vkml_().realize([p, _bad_index(ts)]),
    "realize with a non-tensor": lambda ts, f, p: vkml_().realize([p, "abc"]),
    "reshape to a wrong size": lambda ts, f, p: vkml_().reshape(ts[0], (ts[0].size + 1,)),
    "requires_grad_ on an int tensor": lambda ts, f, p: vkml_().tensor([1, 2]).requires_grad_(),
}


def vkml_():
    import vkml
    return vkml


# -- graphs and Records ------------------------------------------------------------------------

_KERNELS = {}


def _kernels():
    import vkml
    if not _KERNELS:
        @vkml.kernel
        def square(x):
            return {"u": x * x}

        @vkml.kernel
        def wave(u, k: vkml.Param, m: vkml.Param):
            return {"y": vkml.sin(k * u) + m}

        @vkml.kernel
        def pick(u, i, table: vkml.Param):
            return {"z": u * table[i]}
        _KERNELS.update(square=square, wave=wave, pick=pick)
    return _KERNELS


def _graph(n, with_pick=False, bad_index_at=None):
    import vkml
    k = _kernels()
    x = np.linspace(0.1, 0.9, n)
    u, y, z = np.zeros(n), np.zeros(n), np.zeros(n)
    idx = np.zeros(n, np.int64)
    if bad_index_at is not None:
        idx[bad_index_at] = 99
    g = vkml.Graph().add(k["square"].bind(x=x, u=u), name="square") \
        .add(k["wave"].bind(u=u, k=1.5, m=0.25, y=y), name="wave")
    if with_pick:
        g.add(k["pick"].bind(u=u, i=idx, table=np.array([1.0, 2.0, 3.0]), z=z), name="pick")
    return g.build(record=True)


def _seeds(n):
    return {"wave.y": np.ones(n)}


#: refused graph calls: name -> (set up the graph, the refused call)
GRAPH_CALLS = {
    "launch while the Record is live": (lambda n: _graph(n).launch(), lambda g, n: g.launch()),
    "update while the Record is live": (lambda n: _graph(n).launch(), lambda g, n: g.update(k=0.5)),
    "update with an unknown Param": (
        lambda n: _reversed(_graph(n).launch(), n), lambda g, n: g.update(k=0.5, nope=1.0)),
    "update with a wrong shape": (
        lambda n: _reversed(_graph(n).launch(), n), lambda g, n: g.update(k=0.5, m=np.ones(3))),
    "update with a string value": (
        lambda n: _reversed(_graph(n).launch(), n), lambda g, n: g.update(k=0.5, m="abc")),
    "reverse with an unknown seed": (
        lambda n: _graph(n).launch(), lambda g, n: vkml_().diff.reverse(g.record, {"nope": np.ones(n)})),
    "reverse with a wrong seed shape": (
        lambda n: _graph(n).launch(), lambda g, n: vkml_().diff.reverse(g.record, {"wave.y": np.ones(n + 1)})),
    "reverse with a string seed": (
        lambda n: _graph(n).launch(), lambda g, n: vkml_().diff.reverse(g.record, {"wave.y": "abc"})),
    "reverse of a stale Record": (
        lambda n: _stale(n), lambda g, n: vkml_().diff.reverse(g.stale_record, _seeds(n))),
    "launch whose kernel fails on one sample": (
        lambda n: _graph(n, with_pick=True, bad_index_at=n // 2), lambda g, n: g.launch()),
}


def _reversed(g, n):
    vkml_().diff.reverse(g.record, _seeds(n))
    return g


def _stale(n):
    g = _reversed(_graph(n).launch(), n)
    g.stale_record = g.record
    g.launch()
    return g


def graph_refusal(args) -> dict:
    """One refused graph call (``args["call"]``, see ``GRAPH_CALLS``) over ``args["n"]`` samples."""
    import vkml
    vkml.set_backend(args["backend"])
    try:
        setup, call = GRAPH_CALLS[args["call"]]
        n = args["n"]
        g = setup(n)
        result = _refusal(lambda: {"graph": graph_state(g)}, lambda: call(g, n))
        # a refusal leaves the graph usable: a reverse of its Record (when live) still works
        rec = g.record
        if rec is not None and rec.live:
            try:
                vkml.diff.reverse(rec, _seeds(n))
            except vkml.VkmlError as err:
                result["changed"].append(f"the Record can no longer be reversed: {err}")
        return result
    finally:
        vkml.set_backend("numpy")
