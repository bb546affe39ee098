"""Every public entry point, called with a battery of bad arguments.

An entry is a name and a function ``make(good) -> callable``: ``good`` holds
valid values (a float tensor, a function of it, a built graph with a live
Record, ...), made fresh for each call so that one call cannot spoil the
next.  Each bad value goes into each argument position the entry takes (the
others filled with good values) and into each keyword parameter; the call
must then either work or raise a ``vkml.VkmlError``.  A Tensor result is
realized, a callable result (``jit(fn)``) is called on good and bad
arguments, a context manager is entered: the error may come at any of those.

Calls Python itself refuses (a wrong number of arguments: ``inspect``'s
binding fails) are not tried: they never reach vkml's validation.  An error
raised inside one of the user functions defined here (``x * x`` of the None a
transform handed on, as JAX would too) is the user's, not a leak.
:func:`run_entry` runs in the worker, so a call that kills the process is
reported as that entry's crash; it writes each call to stderr first, so the
crash report names the call.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys

import numpy as np


def bad_values():
    """What a user may pass by mistake: wrong Python types, ragged and exotic arrays, extremes."""
    import vkml
    return [
        ("None", None), ("str", "abc"), ("bytes", b"x"), ("object", object()), ("dict", {"a": 1}),
        ("set", {1, 2}), ("ragged list", [[1.0], [1.0, 2.0]]), ("mixed list", [1, "a"]),
        ("complex", 1j), ("str array", np.array(["a", "b"])), ("complex array", np.array([1 + 2j])),
        ("object array", np.array([object()], dtype=object)), ("nan", float("nan")),
        ("huge int", 2 ** 70), ("negative int", -3), ("huge negative int", -(2 ** 70)),
        ("empty tuple", ()), ("list of None", [None]), ("lambda", lambda *a: 0),
        ("datetime array", np.array(["2020-01-01"], dtype="datetime64[D]")),
        ("float16 array", np.ones(3, np.float16)), ("bool tensor", vkml.tensor([True, False])),
        ("int tensor", vkml.tensor([1, 2, 3])), ("0-d tensor", vkml.tensor(1.5)),
        ("empty tensor", vkml.tensor(np.zeros((0, 3), np.float32))),
        ("uint64 max", np.array([np.iinfo(np.uint64).max], np.uint64)),
        ("graph", vkml.Graph()), ("type", float),
    ]


# -- the good values each call starts from ----------------------------------------------------

class Good:
    """Valid arguments, made fresh for every call."""

    def __init__(self):
        import vkml
        self.vkml = vkml
        self.t = vkml.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
        self.ti = vkml.tensor(np.arange(1, 7).reshape(2, 3))
        self.fn = lambda x: (x * x).sum()

    def graph(self, record=True, launched=True):
        vkml = self.vkml
        x = np.linspace(0.1, 0.9, 8)
        u, y = np.zeros(8), np.zeros(8)
        g = (vkml.Graph().add(_square().bind(x=x, u=u), name="square")
             .add(_wave().bind(u=u, k=1.5, y=y), name="wave").build(record=record))
        if launched:
            g.launch()
        return g


_KERNELS = {}


def _square():
    import vkml
    if "square" not in _KERNELS:
        @vkml.kernel
        def square(x):
            return {"u": x * x}
        _KERNELS["square"] = square
    return _KERNELS["square"]


def _forced():
    import vkml
    if "forced" not in _KERNELS:
        @vkml.kernel
        def forced(x, k: vkml.Param):
            return {"x": x * k + 0.5}
        _KERNELS["forced"] = forced
    return _KERNELS["forced"]


def _wave():
    import vkml
    if "wave" not in _KERNELS:
        @vkml.kernel
        def wave(u, k: vkml.Param):
            return {"y": vkml.sin(k * u)}
        _KERNELS["wave"] = wave
    return _KERNELS["wave"]


# -- the entries -------------------------------------------------------------------------------

#: public names that are not entries a user calls with data (each with why)
NOT_ENTRIES = {
    "Tensor": "made by vkml from an IR Var, never by users", "Var": "IR internals",
    "Program": "IR internals", "Jitted": "made by jit()", "load_ipython_extension":
    "called by IPython with its shell", "pp_program": "prints a Program (IR internals)",
}

#: entries whose first argument is a function the entry transforms
TRANSFORMS = ["jit", "grad", "value_and_grad", "jacfwd", "jacrev", "hessian", "checkpoint",
              "vmap", "custom_jvp", "custom_vjp"]
#: the transforms whose result is called at once (custom_jvp/custom_vjp need their rule first)
CALLED_TRANSFORMS = [t for t in TRANSFORMS if t not in ("custom_jvp", "custom_vjp")]


def _module_entries():
    import vkml
    out = {}
    for name in dir(vkml):
        obj = getattr(vkml, name)
        if name.startswith("_") or name in NOT_ENTRIES or not callable(obj) or \
                (isinstance(obj, type) and issubclass(obj, BaseException)):
            continue
        out[name] = (lambda good, obj=obj: obj)
    return out


def _extra_entries():
    """Methods and sub-module callables that take user data."""
    def method(name):
        return lambda good: getattr(good.ti if name == "__floordiv__" else good.t, name)

    out = {f"Tensor.{m}": method(m) for m in (
        "reshape", "__getitem__", "astype", "sum", "max", "transpose", "assign_",
        "requires_grad_", "__add__", "__matmul__", "__pow__", "__floordiv__", "clip", "softmax",
        "expand_dims", "squeeze", "flatten", "broadcast_to", "var", "std", "__mod__")}
    out.update({f"{t}(fn)": (lambda good, t=t: _transformed(good, t)) for t in TRANSFORMS
                if t not in ("custom_jvp", "custom_vjp")})
    # the same transforms called with a keyword argument (traced; mapped over axis 0 by vmap)
    out.update({f"{t}(fn, keyword)": (lambda good, t=t: _transformed_with_keyword(good, t))
                for t in CALLED_TRANSFORMS})
    out.update({
        "Graph.add": lambda good: good.vkml.Graph().add,
        "Graph.launch": lambda good: good.graph(record=False).launch,
        "Graph.update": lambda good: good.graph(record=False).update,
        "Graph.build": lambda good: good.vkml.Graph().add(
            _square().bind(x=np.ones(4), u=np.zeros(4))).build,
        "diff.reverse": lambda good: good.vkml.diff.reverse,
        "diff.Reverse": lambda good: good.vkml.diff.Reverse,
        "Reverse(graph)": _reverse_of_a_graph,
        "Graph.reverse": _reverse_method_of_a_graph,
        # the reverse protocol a Reverse drives (graph/reversible.py), driven by hand
        "Graph.prepare_reverse": lambda good: _launched(good).prepare_reverse,
        "Graph.reading": lambda good: _launched(good).reading,
        "Graph.sweep": lambda good: _launched(good).sweep,
        "Simulation.reverse": lambda good: _simulated(good).reverse,
        "Simulation.prepare_reverse": lambda good: _simulated(good).prepare_reverse,
        "Simulation.reading": lambda good: _simulated(good).reading,
        "Simulation.sweep": lambda good: _simulated(good).sweep,
        "widgets.explore_schedule": lambda good: good.vkml.widgets.explore_schedule,
        "kernel.bind": lambda good: _square().bind,
        "optim.SGD": lambda good: good.vkml.optim.SGD,
        "optim.Adam": lambda good: good.vkml.optim.Adam,
        "Optimizer.compile_step": lambda good: good.vkml.optim.Adam(
            [good.vkml.nn.Parameter(np.ones(3))]).compile_step,
        "CompiledStep(batch)": _compiled_step,
        "nn.Linear": lambda good: good.vkml.nn.Linear,
        "nn.Conv2d": lambda good: good.vkml.nn.Conv2d,
        "nn.cross_entropy": lambda good: good.vkml.nn.cross_entropy,
        "nn.mse_loss": lambda good: good.vkml.nn.mse_loss,
        "graph.opaque": lambda good: good.vkml.graph.opaque,
        "pytree.register": lambda good: good.vkml.pytree.register,
        "viz.diff": lambda good: good.vkml.viz.diff,
        "viz.saved_residuals": lambda good: good.vkml.viz.saved_residuals,
        "viz.checkpoint_schedule": lambda good: good.vkml.viz.checkpoint_schedule,
        "widgets.explore_program": lambda good: good.vkml.widgets.explore_program,
        "viz.program_dot": lambda good: good.vkml.viz.program_dot,
        "viz.derived_dot": lambda good: good.vkml.viz.derived_dot,
        "viz.tensor_dot": lambda good: good.vkml.viz.tensor_dot,
        "viz.tabs_html": lambda good: good.vkml.viz.tabs_html,
        "pytree.leaf_paths": lambda good: good.vkml.pytree.leaf_paths,
        "install.install_hint": lambda good: __import__("vkml.install").install.install_hint,
        "Record.check_unchanged": lambda good: good.graph().record.check_unchanged,
        "Record.keep": lambda good: good.graph().record.keep,
    })
    out.update({f"nn.{name}": (lambda good, name=name: getattr(good.vkml.nn, name))
                for name in ("Tanh", "Sigmoid", "GELU", "Softmax", "Dropout", "LayerNorm",
                             "Embedding")})
    return out


def _reverse_of_a_graph(good):
    """A Reverse built for a graph (kept as ``good.g``) that has launched since."""
    good.g = good.graph(launched=False)
    rev = good.vkml.diff.Reverse(good.g)
    good.g.launch()
    return rev


def _reverse_method_of_a_graph(good):
    """``Graph.reverse`` of a recorded, launched graph (kept as ``good.g``)."""
    good.g = good.graph()
    return good.g.reverse


def _launched(good):
    """A recorded, launched graph (kept as ``good.g``)."""
    good.g = good.graph()
    return good.g


def _simulated(good):
    """A recorded simulation, run once (kept as ``good.sim``)."""
    good.sim = _recorded_simulation(good)
    return good.sim


def _compiled_step(good):
    """A compiled Adam step, run twice so the next call may update its arrays in place (a bad
    batch must leave them as they are)."""
    vkml = good.vkml
    w = vkml.nn.Parameter(np.linspace(-1.0, 1.0, 6).reshape(2, 3))
    step = vkml.optim.Adam([w], lr=0.1).compile_step(lambda x: ((w * x) ** 2).sum())
    step(np.ones((2, 3)))
    step(np.ones((2, 3)))
    return step


def _differentiated(good):
    """A jitted function whose gradient was taken: what ``viz.derived_dot`` draws."""
    f = good.vkml.jit(good.fn)
    good.vkml.grad(f)(good.t)
    return f


def _recorded_simulation(good):
    """A small recorded simulation, run once (what the schedule explorer is given)."""
    vkml = good.vkml
    x, v = np.linspace(0.1, 0.9, 8), np.zeros(8)
    sim = vkml.simulation(_drift(), max_steps=6, record=True, window=2, x=x, v=v, k=0.5)
    sim.run()
    return sim


def _drift():
    if "drift" not in _KERNELS:
        import vkml

        @vkml.kernel
        def drift(x, v, k: vkml.Param):
            return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
        _KERNELS["drift"] = drift
    return _KERNELS["drift"]


def _bound():
    return _square().bind(x=np.ones(4), u=np.zeros(4))


def _transformed(good, name):
    import vkml
    fn = good.fn
    if name == "vmap":
        fn = lambda x: x * 2.0      # noqa: E731 -- a per-row function
    if name == "checkpoint":
        return vkml.checkpoint(lambda x: x * 2.0)
    return getattr(vkml, name)(fn)


def _transformed_with_keyword(good, name):
    """Transform ``name`` of a function taking a keyword argument ``scale``."""
    import vkml
    if name in ("vmap", "checkpoint"):
        return getattr(vkml, name)(lambda x, scale=2.0: x * scale)
    return getattr(vkml, name)(lambda x, scale=2.0: (x * x * scale).sum())


def _namespace_entries():
    """The NumPy-shaped namespaces: ``vkml.numpy``, ``vkml.numpy.linalg``, ``vkml.scipy.special``."""
    import vkml.numpy
    import vkml.scipy.special
    out = {}
    for prefix, module in (("numpy", vkml.numpy), ("numpy.linalg", vkml.numpy.linalg),
                           ("scipy.special", vkml.scipy.special)):
        for name in dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or not callable(obj) or isinstance(obj, type) or \
                    getattr(obj, "__module__", "") == "__future__":
                continue
            out[f"{prefix}.{name}"] = (lambda good, obj=obj: obj)
    return out


def entries():
    out = _module_entries()
    out.update(_extra_entries())
    out.update(_namespace_entries())
    return out


def entry_names():
    return sorted(entries())


def computing_entries():
    """The entries that build or run programs (tensor operations and methods, transformed
    functions): they are also tried on the cpu tier, whose programs fail in their own way."""
    import vkml
    out = []
    for name in entry_names():
        obj = getattr(vkml, name, None)
        if name.startswith("Tensor.") or name.endswith("(fn)") or \
                getattr(obj, "__module__", "") in ("vkml.tensor", "vkml.creation"):
            out.append(name)
    return out


# -- calling -----------------------------------------------------------------------------------

def _signature(entry, fn):
    """``fn``'s signature; for the Tensor functions (``*args`` wrappers), the operation's own."""
    from vkml.ops import api
    sig = inspect.signature(fn)
    inner = getattr(api, entry, None)
    if any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()) and callable(inner) and \
            getattr(fn, "__module__", "") == "vkml.tensor":
        return inspect.signature(inner)
    return sig


def _arity(entry, fn):
    """(positional parameter count to fill, keyword parameter names), or None if unknown."""
    try:
        sig = _signature(entry, fn)
    except (TypeError, ValueError):
        return None
    pos = [p for p in sig.parameters.values()
           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    kws = [p.name for p in sig.parameters.values()
           if p.default is not p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    return max(len(pos), 1 if varargs else 0), kws


def _binds(entry, fn, args, kwargs) -> bool:
    try:
        _signature(entry, fn).bind(*args, **kwargs)
        return True
    except TypeError:
        return False
    except ValueError:
        return True            # no signature to check: let the call decide


def _good_args(good, entry):
    """Valid positional arguments of ``entry`` (a float tensor for each, unless listed here)."""
    vkml, t = good.vkml, good.t
    x4 = vkml.tensor(np.ones((1, 1, 4, 4), np.float32))
    idx = vkml.tensor(np.array([[0], [1]]))
    table = {
        "check_grads": lambda: [good.fn, (t,)],
        "scan": lambda: [lambda c, x: (c + x, c * 2.0), vkml.zeros(3), t],
        "while_loop": lambda: [lambda c: vkml.max(c) < 10.0, lambda c: c + 1.0, vkml.zeros(3)],
        "cond": lambda: [vkml.tensor(True), lambda x: x, lambda x: -x, t],
        "switch": lambda: [vkml.tensor(0), [lambda x: x, lambda x: -x], t],
        "jvp": lambda: [good.fn, (t,), (t,)], "hvp": lambda: [good.fn, (t,), (t,)],
        "vjp": lambda: [good.fn, t], "linearize": lambda: [good.fn, t],
        "program": lambda: [good.fn, t], "kernel": lambda: [lambda x: {"y": x * 2.0}],
        "simulation": lambda: [_forced()], "until_done": lambda: [_forced()],
        "where": lambda: [t > 1.0, t, t], "gather": lambda: [t, idx],
        "scatter_add": lambda: [t, idx, vkml.ones((2, 3))], "take": lambda: [t, [0]],
        "take_along_axis": lambda: [t, vkml.tensor(np.zeros((2, 1), np.int64)), 1],
        "conv2d": lambda: [x4, vkml.ones((2, 1, 3, 3))], "max_pool2d": lambda: [x4, 2],
        "avg_pool2d": lambda: [x4, 2], "pad": lambda: [t, (1, 0), (0, 1)],
        "reshape": lambda: [t, (3, 2)], "broadcast_to": lambda: [t, (2, 2, 3)],
        "swapaxes": lambda: [t, 0, 1], "expand_dims": lambda: [t, 0], "cast": lambda: [t, "float64"],
        "concatenate": lambda: [[t, t]], "stack": lambda: [[t, t]], "assign": lambda: [[t], [t * 2.0]],
        "full": lambda: [(2, 3), 1.0], "arange": lambda: [5], "zeros": lambda: [(2, 3)],
        "ones": lambda: [(2, 3)], "set_backend": lambda: ["numpy"], "tensor": lambda: [[1.0, 2.0]],
        "diff.reverse": lambda: [good.graph().record, {"wave.y": np.ones(8)}],
        "diff.Reverse": lambda: [good.graph(launched=False)],
        "Reverse(graph)": lambda: [good.g.record, {"wave.y": np.ones(8)}],
        "Graph.reverse": lambda: [good.g.record, {"wave.y": np.ones(8)}],
        "Graph.prepare_reverse": lambda: [good.g.record, {"wave.y": np.ones(8)}, None, False],
        "Graph.reading": lambda: [good.g.record],
        "Graph.sweep": lambda: [good.g.record, good.g.prepare_reverse(
            good.g.record, {"wave.y": np.ones(8)}, None, False), {}, vkml.diff.Workspace()],
        "Simulation.reverse": lambda: [good.sim.record, {"x": np.ones(8)}],
        "Simulation.prepare_reverse": lambda: [good.sim.record, {"x": np.ones(8)}, None, False],
        "Simulation.reading": lambda: [good.sim.record],
        "Simulation.sweep": lambda: [good.sim.record, good.sim.prepare_reverse(
            good.sim.record, {"x": np.ones(8)}, None, False), {}, vkml.diff.Workspace()],
        "widgets.explore_schedule": lambda: [_recorded_simulation(good)],
        "Graph.add": lambda: [_bound()], "SkipGuard": lambda: [np.array([1], np.uint32)],
        "skippable": lambda: [_bound(), vkml.SkipGuard.nonzero(np.array([1], np.uint32))],
        "repeat_while": lambda: [_bound(), vkml.SkipGuard.nonzero(np.array([0], np.uint32))],
        "Tensor.__matmul__": lambda: [t.T], "Tensor.transpose": lambda: [(1, 0)],
        "Tensor.__floordiv__": lambda: [good.ti], "backward": lambda: [good.fn(t)],
        "matmul": lambda: [t, t.T], "dot": lambda: [t, t.T], "floor_divide": lambda: [good.ti, good.ti],
        "set_eager": lambda: [False], "mod": lambda: [good.ti, good.ti],
        "set_cache_limit": lambda: [vkml.cache_limit()], "use_backend": lambda: ["numpy"],
        "associative_scan": lambda: [lambda a, b: a + b, t],
        "fori_loop": lambda: [0, 3, lambda i, c: c + 1.0, t],
        "numpy.arange": lambda: [5], "numpy.array_split": lambda: [t, 2],
        "numpy.broadcast_to": lambda: [t, (2, 2, 3)], "numpy.concatenate": lambda: [[t, t]],
        "numpy.einsum": lambda: ["ij,jk->ik", t, t.T], "numpy.expand_dims": lambda: [t, 0],
        "numpy.eye": lambda: [3], "numpy.full": lambda: [(2, 3), 1.0], "numpy.hstack": lambda: [[t, t]],
        "numpy.identity": lambda: [3], "numpy.linspace": lambda: [0.0, 1.0],
        "numpy.moveaxis": lambda: [t, 0, 1], "numpy.ones": lambda: [(2, 3)],
        "numpy.repeat": lambda: [t, 2], "numpy.reshape": lambda: [t, (3, 2)],
        "numpy.roll": lambda: [t, 1], "numpy.split": lambda: [t, 2], "numpy.stack": lambda: [[t, t]],
        "numpy.swapaxes": lambda: [t, 0, 1], "numpy.take": lambda: [t, [0]],
        "numpy.take_along_axis": lambda: [t, vkml.tensor(np.zeros((2, 1), np.int64)), 1],
        "numpy.tile": lambda: [t, 2], "numpy.vstack": lambda: [[t, t]], "numpy.zeros": lambda: [(2, 3)],
        "numpy.bincount": lambda: [vkml.tensor([0, 1, 1])], "numpy.column_stack": lambda: [[t, t]],
        "numpy.concat": lambda: [[t, t]], "numpy.dsplit": lambda: [vkml.zeros((1, 1, 4)), 2],
        "numpy.dstack": lambda: [[t, t]], "numpy.empty": lambda: [(2, 3)],
        "numpy.hsplit": lambda: [t, 3], "numpy.vsplit": lambda: [t, 2],
        "numpy.indices": lambda: [(2, 3)], "numpy.linalg.matrix_power": lambda: [vkml.tensor(np.eye(3)), 2],
        "numpy.linalg.multi_dot": lambda: [[t, t.T]], "numpy.logspace": lambda: [0.0, 1.0],
        "numpy.nanpercentile": lambda: [t, 50], "numpy.nanquantile": lambda: [t, 0.5],
        "numpy.percentile": lambda: [t, 50], "numpy.quantile": lambda: [t, 0.5],
        "numpy.pad": lambda: [t, 1], "numpy.permute_dims": lambda: [t, (1, 0)],
        "numpy.select": lambda: [[t > 0], [t]], "numpy.tri": lambda: [3],
        "numpy.tril_indices": lambda: [3], "numpy.triu_indices": lambda: [3],
        "numpy.unravel_index": lambda: [[1, 2], (2, 3)], "scipy.special.polygamma": lambda: [1, t],
        "optim.SGD": lambda: [[t], 0.1], "optim.Adam": lambda: [[t]],
        "viz.program_dot": lambda: [vkml.program(good.fn, t)],
        "viz.derived_dot": lambda: [_differentiated(good)], "viz.tensor_dot": lambda: [good.fn(t)],
        "viz.tabs_html": lambda: [[("primal", "<svg></svg>")], "text"],
        "pytree.leaf_paths": lambda: [vkml.pytree.flatten({"w": 1.0})[1], "p"],
        "install.install_hint": lambda: ["cuda"],
        "Optimizer.compile_step": lambda: [lambda: vkml.tensor(1.0)],
        "CompiledStep(batch)": lambda: [np.ones((2, 3))],
        "nn.Linear": lambda: [3, 2], "nn.Conv2d": lambda: [1, 2, 3],
        "nn.cross_entropy": lambda: [t, vkml.tensor([0, 1])], "nn.mse_loss": lambda: [t, t],
        "graph.opaque": lambda: [lambda **kw: {"y": kw["x"]}, {"x": np.ones(4)}, {"y": np.zeros(4)}],
        "nn.Tanh": lambda: [], "nn.Sigmoid": lambda: [], "nn.GELU": lambda: [],
        "nn.Softmax": lambda: [-1], "nn.Dropout": lambda: [0.5], "nn.LayerNorm": lambda: [3],
        "nn.Embedding": lambda: [4, 2],
        "pytree.register": lambda: [type("Pair", (), {}), lambda p: ((), None),
                                    lambda aux, children: None],
        "viz.diff": lambda: [vkml.program(good.fn, t), vkml.program(lambda x: good.fn(x) * 2.0, t)],
        "viz.saved_residuals": lambda: [good.fn, t],
        "viz.checkpoint_schedule": lambda: [vkml.graph.schedules.Binomial(2), 10],
        "widgets.explore_program": lambda: [good.fn, t],
        "Tensor.var": lambda: [1], "Tensor.std": lambda: [0], "Tensor.__mod__": lambda: [2.0],
        "Tensor.reshape": lambda: [(3, 2)], "Tensor.__getitem__": lambda: [0],
        "Tensor.astype": lambda: ["float64"], "Tensor.assign_": lambda: [t * 2.0],
        "Tensor.broadcast_to": lambda: [(2, 2, 3)], "Tensor.expand_dims": lambda: [0],
    }
    if entry in table:
        return table[entry]()
    if entry in TRANSFORMS:
        return [good.fn]
    if entry.startswith(("numpy.", "scipy.")):
        return _namespace_good_args(good, entry)
    return None


def _namespace_good_args(good, entry):
    """The first of a few argument lists (a float matrix, a square one, an int one) that the
    namespace function takes without complaint."""
    vkml = good.vkml
    fn = entries()[entry](good)
    shape = _arity(entry, fn)
    n = shape[0] if shape else 1
    square = vkml.tensor(np.array([[2.0, 0.5, 0.0], [0.5, 3.0, 0.1], [0.0, 0.1, 1.5]]))
    for arg in (good.t, square, good.ti, vkml.tensor([0.5, 0.25, 0.75])):
        args = [arg] * n
        try:
            _finish(fn(*args))
            return args
        except Exception:         # noqa: BLE001 -- try the next kind of argument
            continue
    return [good.t] * n


def _finish(result):
    """Realize what a call returned, so an error kept for later surfaces now."""
    import vkml
    if isinstance(result, vkml.Tensor):
        result.numpy()
    elif isinstance(result, (list, tuple)):
        for r in result:
            _finish(r)
    elif isinstance(result, dict):
        for r in result.values():
            _finish(r)
    elif hasattr(result, "__enter__") and hasattr(result, "__exit__"):
        with result:
            pass
    elif type(result).__name__ == "Simulation":
        result.run()


def _good_kwargs(good, entry):
    """Valid keyword arguments an entry needs (keyword-only ones, and what ``**kwargs`` binds)."""
    if entry in ("simulation", "until_done"):
        return {"max_steps": 5, "x": np.linspace(0.1, 0.9, 4), "k": 0.8}
    if entry == "kernel.bind":
        return {"x": np.ones(4), "u": np.zeros(4)}
    if entry.endswith("(fn, keyword)"):
        # vmap maps a keyword argument over axis 0, as the positional one
        return {"scale": np.full(good.t.shape[0], 2.0) if entry.startswith("vmap") else 2.0}
    return {}


def _calls(entry, fn, good, bad):
    """(description, args, kwargs) of every call of ``fn`` with ``bad`` somewhere."""
    good_args = _good_args(good, entry)
    good_kwargs = _good_kwargs(good, entry)
    shape = _arity(entry, fn)
    n_pos, kws = shape if shape is not None else (2, [])
    if good_args is None:
        good_args = [good.t] * n_pos
    out = []
    for i in range(len(good_args)):
        out.append((f"argument {i}", good_args[:i] + [bad] + good_args[i + 1:], dict(good_kwargs)))
    for kw in list(dict.fromkeys(kws + list(good_kwargs))):
        out.append((f"{kw}=", list(good_args), {**good_kwargs, kw: bad}))
    return out


#: CPU seconds one call may spend before it counts as a hang (CPU time, not wall time: a loaded
#: machine or a C compiler running in a child process does not make a call look hung)
CALL_TIMEOUT = 3


class Hung(BaseException):
    """Raised in a call that spent ``CALL_TIMEOUT`` CPU seconds (a BaseException: no library code
    catches it)."""


def _alarm(signum, frame):
    raise Hung()


def _raised_by_user_code(err) -> bool:
    """Whether ``err`` came from a user function this module passed in (``x * x`` of a None a
    transform handed on): the user's own error, which vkml rightly lets through."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(__file__)


def _vkml_reset(backend):
    """The worker's global state back as the entry's run started (a call may change it)."""
    import vkml
    vkml.set_eager(False)
    vkml.set_backend(backend)


def run_entry(args) -> dict:
    """Call entry ``args["entry"]`` with every bad value on ``args["backend"]``; return the calls
    that leaked a non-vkml exception, and how many calls were made."""
    import vkml
    name, backend = args["entry"], args.get("backend", "numpy")
    make = entries()[name]
    _vkml_reset(backend)
    baseline = _baseline(name, make)
    leaks, tried = [], 0
    labels = [label for label, _ in bad_values()]
    for b, label in enumerate(labels):
        counting = Good()
        count = len(_calls(name, make(counting), counting, bad_values()[b][1]))
        for k in range(count):
            good, bad = Good(), bad_values()[b][1]          # fresh: a call may change them
            fn = make(good)
            where, call_args, kwargs = _calls(name, fn, good, bad)[k]
            if not _binds(name, fn, call_args, kwargs):
                continue
            tried += 1
            what = f"{name} with {label} as {where}"
            print(f"fuzz: calling {what}", file=sys.stderr, flush=True)
            signal.signal(signal.SIGPROF, _alarm)
            signal.setitimer(signal.ITIMER_PROF, CALL_TIMEOUT)
            try:
                result = fn(*call_args, **kwargs)
                _finish(result)
                if name in CALLED_TRANSFORMS and callable(result):
                    _finish(result(good.t))                 # a transform of a bad function
            except vkml.VkmlError:
                pass
            except Hung:
                leaks.append(f"{what}: HANG (no return within {CALL_TIMEOUT} CPU seconds)")
            except Exception as err:       # noqa: BLE001 -- a leak is what this looks for
                if not _raised_by_user_code(err):
                    leaks.append(f"{what}: {type(err).__name__}: {str(err)[:160]}")
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
                _vkml_reset(backend)
    _vkml_reset("numpy")
    return {"tried": tried, "leaks": leaks, "baseline": baseline}


def _baseline(name, make):
    """The entry called with good arguments only: None when it works (else the bad-argument
    calls would test nothing), or the error it raised."""
    good = Good()
    fn = make(good)
    args = _good_args(good, name)
    if args is None:
        shape = _arity(name, fn)
        args = [good.t] * (shape[0] if shape else 0)
    kwargs = _good_kwargs(good, name)
    if not _binds(name, fn, args, kwargs):
        return "the good arguments do not bind"
    try:
        result = fn(*args, **kwargs)
        _finish(result)
        if name in CALLED_TRANSFORMS and callable(result):
            _finish(result(good.t))
    except Exception as err:         # noqa: BLE001 -- reported: a broken baseline is a suite bug
        return f"{type(err).__name__}: {err}"[:300]
    return None
