"""No internal exception crosses the public API: bad arguments raise a ``VkmlError`` or nothing.

Every public callable of ``vkml`` (the tensor layer and backends), ``vkml.nn``
and ``vkml.optim``, and every public ``Tensor`` method, is called from a valid
baseline with each argument in turn replaced by each value of the battery in
``bad_inputs.BAD_VALUES``; any tensor that comes back is realized, so a bad
value that slips past the checks into a backend is caught too.  Every
exception raised must be a ``vkml.VkmlError``.  The traced-program
transforms (``jit``, ``grad``, ...) and the graph layer have their own suites.

Runs on the NumPy backend and the compiled CPU tier, in eager mode (errors
surface at the op), under a cap on the address space so a huge size that
slipped through fails here instead of taking the machine's memory.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vkml
from conftest import BACKENDS
from bad_inputs import leaks, memory_cap, public_callables, signature_arity, succeeds

pytestmark = [pytest.mark.usefixtures("eager"),
              # bad values that are valid numbers (NaN, inf, 2**63) make NumPy warn while they run
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

#: the leak tests run on every backend (the coverage checks need only one)
on_every_backend = pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)

#: names of ``vkml`` another suite covers: the traced-program transforms, the graph layer, the IR
#: classes, and modules/exceptions (not calls).
NOT_HERE = {
    # programs.py
    "GradCheckError", "Jitted", "check_grads", "checkpoint", "cond", "custom_jvp", "custom_vjp",
    "grad", "hessian", "hvp", "jacfwd", "jacrev", "jit", "jvp", "linearize", "program", "scan",
    "switch", "value_and_grad", "vjp", "vmap", "while_loop",
    # graph layer
    "Graph", "Param", "SkipGuard", "diff", "kernel", "repeat_while", "simulation", "skippable",
    "until_done", "graph",
    # IR and printing
    "Program", "Var", "pp_program",
    # exceptions, the Jupyter hook and the lazy widgets module
    "ArgumentError", "BackendError", "Busy", "BudgetError", "DTypeError", "ExecutionError",
    "GradError", "RecordError", "RefusedError", "ShapeError", "TracingError", "VkmlError",
    "load_ipython_extension",
}


def M():
    return vkml.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3))


def V():
    return vkml.tensor(np.array([1.0, -2.0, 3.0], dtype=np.float32))


_LIVE = []


def G():
    """A leaf that requires grad, kept alive for a while (gradients go to live leaves only)."""
    p = vkml.tensor(np.array([1.0, 2.0], dtype=np.float32), requires_grad=True)
    _LIVE[:] = _LIVE[-50:] + [p]
    return p


def IMG():
    return vkml.tensor(np.ones((1, 1, 4, 4), dtype=np.float32))


def K():
    return vkml.tensor(np.ones((1, 1, 2, 2), dtype=np.float32))


def IDX():
    return vkml.tensor(np.array([[0, 1], [1, 2]], dtype=np.int64))


def _unary(fn):
    return lambda: ((M(),), {})


def _binary(fn):
    return lambda: ((M(), V()), {})


UNARY = ["abs", "cos", "exp", "log", "neg", "relu", "sigmoid", "sign", "sin", "sqrt", "square",
         "stop_gradient", "tanh", "logical_not"]
BINARY = ["add", "div", "dot", "equal", "greater", "greater_equal", "less",
          "less_equal", "logical_and", "logical_or", "maximum", "minimum", "mul", "not_equal",
          "pow", "sub"]

#: name -> a fresh valid ``(args, kwargs)``; the keyword arguments listed are mutated too.
BASELINES = {
    **{name: _unary(name) for name in UNARY},
    **{name: _binary(name) for name in BINARY},
    "floor_divide": lambda: ((IDX(), vkml.tensor(np.array([2, 3]))), {}),
    "tensor": lambda: (([1.0, 2.0],), {"dtype": "float32", "requires_grad": False}),
    "zeros": lambda: (((2, 3),), {"dtype": "float32", "requires_grad": False}),
    "ones": lambda: (((2, 3),), {"dtype": "float32", "requires_grad": False}),
    "full": lambda: (((2, 3), 1.5), {"dtype": "float32", "requires_grad": False}),
    "arange": lambda: ((0, 5, 2), {"dtype": "int64"}),
    "zeros_like": lambda: ((M(),), {"requires_grad": False}),
    "ones_like": lambda: ((M(),), {"requires_grad": False}),
    "where": lambda: ((vkml.tensor(np.array([True, False, True])), V(), 0.0), {}),
    "cast": lambda: ((M(), "int32"), {}),
    "clip": lambda: ((M(), 0.5, 4.0), {}),
    "sum": lambda: ((M(),), {"axis": 1, "keepdims": False}),
    "mean": lambda: ((M(),), {"axis": 1, "keepdims": False}),
    "max": lambda: ((M(),), {"axis": 1, "keepdims": False}),
    "min": lambda: ((M(),), {"axis": 1, "keepdims": False}),
    "argmax": lambda: ((M(),), {"axis": 1}),
    "argmin": lambda: ((M(),), {"axis": 1}),
    "logsumexp": lambda: ((M(),), {"axis": 1, "keepdims": False}),
    "log_softmax": lambda: ((M(),), {"axis": 1}),
    "softmax": lambda: ((M(),), {"axis": 1}),
    "reshape": lambda: ((M(), (3, 2)), {}),
    "broadcast_to": lambda: ((V(), (2, 3)), {}),
    "transpose": lambda: ((M(), (1, 0)), {}),
    "permute": lambda: ((M(), (1, 0)), {}),
    "swapaxes": lambda: ((M(), 0, 1), {}),
    "expand_dims": lambda: ((M(), 1), {}),
    "squeeze": lambda: ((vkml.tensor(np.ones((1, 3))),), {"axis": 0}),
    "flatten": lambda: ((M(),), {"start_dim": 0, "end_dim": -1}),
    "pad": lambda: ((M(), (1, 0), (0, 2)), {"interior": (0, 1)}),
    "concatenate": lambda: (([M(), M()],), {"axis": 0}),
    "stack": lambda: (([V(), V()],), {"axis": 0}),
    "flip": lambda: ((M(),), {"axes": 1}),
    "gather": lambda: ((M(), IDX()), {}),
    "scatter_add": lambda: ((M(), IDX(), vkml.tensor(np.ones(2, np.float32))), {}),
    "take": lambda: ((V(), [0, 2]), {"axis": 0}),
    "take_along_axis": lambda: ((M(), np.array([[0], [2]])), {"axis": 1}),
    "matmul": lambda: ((M(), vkml.tensor(np.ones((3, 2), np.float32))), {}),
    "conv2d": lambda: ((IMG(), K()), {"bias": vkml.tensor(np.ones(1, np.float32)), "stride": 1,
                                      "padding": 0}),
    "max_pool2d": lambda: ((IMG(), 2), {"stride": None}),
    "avg_pool2d": lambda: ((IMG(), 2), {"stride": 1}),
    "realize": lambda: (([M(), V()],), {}),
    "assign": lambda: (([M()], [np.ones((2, 3), np.float32)]), {}),
    "backward": lambda: (((G() * G()).sum(),), {}),
    "set_eager": lambda: ((True,), {}),
    "is_eager": lambda: ((), {}),
    "eager": lambda: ((True,), {}),
    "no_grad": lambda: ((), {}),
    "set_backend": lambda: ((vkml.backend_info()["backend"],), {}),
    "backend_info": lambda: ((), {}),
    "stats": lambda: ((), {}),
    "reset_stats": lambda: ((), {}),
    "Tensor": lambda: ((M().ir_var,), {}),
}


def _nn_baselines():
    nn = vkml.nn
    return {
        "Linear": lambda: ((3, 2), {"bias": True, "rng": 0, "dtype": "float32"}),
        "Conv2d": lambda: ((1, 2, 2), {"stride": 1, "padding": 0, "bias": True, "rng": 0,
                                       "dtype": "float32"}),
        "MaxPool2d": lambda: ((2,), {"stride": None}),
        "ReLU": lambda: ((), {}),
        "Flatten": lambda: ((), {"start_dim": 1, "end_dim": -1}),
        "Sequential": lambda: ((nn.ReLU(), nn.Flatten()), {}),
        "Module": lambda: ((), {}),
        "Parameter": lambda: (([1.0, 2.0],), {"dtype": "float32"}),
        "manual_seed": lambda: ((0,), {}),
        "cross_entropy": lambda: ((M(), np.array([0, 2])), {}),
        "log_softmax": lambda: ((M(),), {"axis": -1}),
        "mse": lambda: ((M(), M()), {}),
        "mse_loss": lambda: ((M(), M()), {}),
    }


def _optim_baselines():
    optim = vkml.optim
    return {
        "SGD": lambda: (([G()],), {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}),
        "Adam": lambda: (([G()],), {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                                    "weight_decay": 0.0}),
        "Optimizer": None,   # abstract: its checks run through SGD and Adam
        "CompiledStep": lambda: ((optim.SGD([G()], lr=0.1), lambda x: x.sum()), {}),
    }


#: Tensor method -> a fresh valid ``(args, kwargs)`` for it, called on a fresh (2, 3) float tensor.
METHODS = {
    **{f"__{op}__": lambda: ((V(),), {}) for op in
       ["add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "pow", "rpow", "and", "or", "eq", "ne", "lt", "le", "gt", "ge"]},
    "__floordiv__": lambda: ((3,), {}),
    "__rfloordiv__": lambda: ((3,), {}),
    "__matmul__": lambda: ((np.ones((3, 1), np.float32),), {}),
    "__rmatmul__": lambda: ((np.ones((1, 2), np.float32),), {}),
    "__getitem__": lambda: (((0, slice(1, None)),), {}),
    "__setitem__": lambda: ((0, 1.0), {}),
    **{name: lambda: ((), {"axis": 1}) for name in ["all", "any", "argmax", "argmin"]},
    **{name: lambda: ((), {"axis": 1, "keepdims": True}) for name in ["max", "mean", "min", "sum"]},
    **{name: lambda: ((), {"axis": -1}) for name in ["log_softmax", "softmax"]},
    **{name: lambda: ((), {}) for name in
       ["abs", "backward", "cos", "detach", "double", "exp", "float", "int", "item", "log", "long",
        "numpy", "realize", "relu", "sigmoid", "sin", "sqrt", "tanh", "tolist", "zero_grad"]},
    "assign_": lambda: ((np.zeros((2, 3), np.float32),), {}),
    "astype": lambda: (("int64",), {}),
    "broadcast_to": lambda: (((4, 2, 3),), {}),
    "clip": lambda: ((0.0, 1.0), {}),
    "expand_dims": lambda: ((0,), {}),
    "unsqueeze": lambda: ((0,), {}),
    "flatten": lambda: ((), {"start_dim": 0, "end_dim": 1}),
    "matmul": lambda: ((np.ones((3, 1), np.float32),), {}),
    "pow": lambda: ((2.0,), {}),
    "permute": lambda: ((1, 0), {}),
    "transpose": lambda: ((1, 0), {}),
    "reshape": lambda: ((3, 2), {}),
    "view": lambda: (((6,),), {}),
    "requires_grad_": lambda: ((True,), {}),
    "squeeze": lambda: ((), {"axis": None}),
    "swapaxes": lambda: ((0, 1), {}),
}

METHODS["var"] = lambda: ((), {"axis": 1})     # the variance, where this vkml has it


def _methods():
    return {name: make for name, make in METHODS.items() if hasattr(vkml.Tensor, name)}


def test_every_public_name_has_a_baseline():
    """A new public name must get a baseline here (or a reason in NOT_HERE)."""
    missing = sorted(set(public_callables(vkml, skip=NOT_HERE)) - set(BASELINES))
    assert not missing, f"give these a baseline call in BASELINES: {missing}"
    nn_missing = sorted(set(public_callables(vkml.nn)) - set(_nn_baselines()))
    assert not nn_missing, nn_missing
    optim_missing = sorted(set(public_callables(vkml.optim)) - set(_optim_baselines()))
    assert not optim_missing, optim_missing


def test_baselines_are_valid():
    """Each baseline call succeeds (else its mutations would test nothing)."""
    for name, make in BASELINES.items():
        fn = getattr(vkml, name)
        args, kwargs = make()
        assert len(args) >= signature_arity(fn), name
        assert succeeds(fn, args, kwargs), name


def _check(namespace, baselines):
    found = []
    with memory_cap():
        for name, make in sorted(baselines.items()):
            if make is None or isinstance(make, tuple):
                continue
            found += leaks(name, getattr(namespace, name), make)
    assert not found, f"{len(found)} calls leaked:\n" + "\n".join(found)


@on_every_backend
@pytest.mark.parametrize("group", ["elementwise", "other"])
def test_tensor_functions(group, vk_backend):
    chosen = {k: v for k, v in BASELINES.items() if (k in UNARY or k in BINARY) == (group == "elementwise")}
    _check(vkml, chosen)


#: the tensor a method is called on, where a (2, 3) float tensor will not do
SELF = {"backward": lambda: (G() * G()).sum(), "item": lambda: V().sum(),
        "__floordiv__": lambda: M().long(), "__rfloordiv__": lambda: M().long()}


def _tensor_method(name):
    """Call ``name`` on a fresh tensor: a (2, 3) float one unless ``SELF`` says otherwise."""
    def call(*args, **kwargs):
        t = SELF.get(name, M)()
        return getattr(t, name)(*args, **kwargs)
    return call


def test_tensor_methods_have_baselines():
    names = {n for n in public_callables(vkml.Tensor)} | {
        n for n in dir(vkml.Tensor) if n.startswith("__") and n in METHODS}
    missing = sorted(names - set(METHODS))
    assert not missing, f"give these Tensor methods a baseline in METHODS: {missing}"
    for name, make in _methods().items():
        if name != "__setitem__":     # always refused: values are not written in place
            assert succeeds(_tensor_method(name), *make()), name


@on_every_backend
def test_tensor_methods(vk_backend):
    found = []
    with memory_cap():
        for name, make in sorted(_methods().items()):
            found += leaks(f"Tensor.{name}", _tensor_method(name), make)
    assert not found, f"{len(found)} calls leaked:\n" + "\n".join(found)


def _on_fresh(factory, method):
    """``method`` of a fresh ``factory()`` object, so no call sees another's changes."""
    def call(*args, **kwargs):
        return getattr(factory(), method)(*args, **kwargs)
    return call


def _sgd():
    return vkml.optim.SGD([G()], lr=0.1, momentum=0.9)


def _adam_after_backward():
    p = G()
    (p * p).sum().backward()
    return vkml.optim.Adam([p], lr=0.1)


def _compiled_step():
    p = G()
    return vkml.optim.SGD([p], lr=0.1).compile_step(lambda x: (p * x).sum())


class _LrSetter:
    """``opt.lr = value`` as a call."""

    def __init__(self, opt):
        self.opt = opt

    def set(self, value):
        self.opt.lr = value


#: what a layer, a model or an optimiser is called with after it is built:
#: label -> (factory, method, make_args)
OBJECT_CALLS = {
    "Linear()": (lambda: vkml.nn.Linear(3, 2, rng=0), "__call__", lambda: ((M(),), {})),
    "Conv2d()": (lambda: vkml.nn.Conv2d(1, 1, 2, rng=0), "__call__", lambda: ((IMG(),), {})),
    "MaxPool2d()": (lambda: vkml.nn.MaxPool2d(2), "__call__", lambda: ((IMG(),), {})),
    "ReLU()": (vkml.nn.ReLU, "__call__", lambda: ((M(),), {})),
    "Flatten()": (vkml.nn.Flatten, "__call__", lambda: ((M(),), {})),
    "Sequential()": (lambda: vkml.nn.Sequential(vkml.nn.Linear(3, 2, rng=0), vkml.nn.ReLU()),
                     "__call__", lambda: ((M(),), {})),
    "Sequential[i]": (lambda: vkml.nn.Sequential(vkml.nn.ReLU()), "__getitem__", lambda: ((0,), {})),
    "Module.train": (lambda: vkml.nn.Linear(3, 2, rng=0), "train", lambda: ((True,), {})),
    "Module.named_parameters": (lambda: vkml.nn.Linear(3, 2, rng=0), "named_parameters",
                                lambda: (("model.",), {})),
    "SGD.lr=": (lambda: _LrSetter(_sgd()), "set", lambda: ((0.01,), {})),
    "SGD.compile_step": (_sgd, "compile_step", lambda: ((lambda x: x.sum(),), {})),
    "Adam.step": (_adam_after_backward, "step", lambda: ((), {})),
    "CompiledStep()": (_compiled_step, "__call__", lambda: ((V()[:2],), {})),
}


def test_objects_baselines_are_valid():
    for label, (factory, method, make) in OBJECT_CALLS.items():
        assert succeeds(_on_fresh(factory, method), *make()), label


@on_every_backend
def test_layers_and_optimisers(vk_backend):
    found = []
    with memory_cap():
        for name, make in sorted(_nn_baselines().items()):
            if not isinstance(make, tuple):
                found += leaks(f"nn.{name}", getattr(vkml.nn, name), make)
        for name, make in sorted(_optim_baselines().items()):
            if make is not None:
                found += leaks(f"optim.{name}", getattr(vkml.optim, name), make)
        for label, (factory, method, make) in sorted(OBJECT_CALLS.items()):
            found += leaks(label, _on_fresh(factory, method), make)
    assert not found, f"{len(found)} calls leaked:\n" + "\n".join(found)


# -- against NumPy: refused exactly when NumPy refuses, otherwise the same answer ----------------
SIZES = st.one_of(st.integers(-3, 4), st.sampled_from([2 ** 31, 2 ** 63, -2 ** 63, 2 ** 100]),
                  st.sampled_from([1.0, 2.5, math.nan, True, None, "2"]))
AXES = st.one_of(st.none(), st.integers(-4, 3), st.tuples(st.integers(-4, 3)),
                 st.tuples(st.integers(-4, 3), st.integers(-4, 3)),
                 st.sampled_from([1.0, "0", (0, 0.5), [1], True, 2 ** 63]))

#: name -> (vkml call, NumPy call) on a (2, 3, 4) array and one drawn argument
AGAINST_NUMPY = {
    "reshape": (lambda t, a: vkml.reshape(t, a), lambda x, a: np.reshape(x, a)),
    "sum": (lambda t, a: vkml.sum(t, a), lambda x, a: np.sum(x, a)),
    "max": (lambda t, a: vkml.max(t, a), lambda x, a: np.max(x, a)),
    "transpose": (lambda t, a: vkml.transpose(t, a), lambda x, a: np.transpose(x, a)),
    "expand_dims": (lambda t, a: vkml.expand_dims(t, a), lambda x, a: np.expand_dims(x, a)),
    "squeeze": (lambda t, a: vkml.squeeze(t, a), lambda x, a: np.squeeze(x, a)),
    "flip": (lambda t, a: vkml.flip(t, a), lambda x, a: np.flip(x, a)),
    "broadcast_to": (lambda t, a: vkml.broadcast_to(t, a), lambda x, a: np.broadcast_to(x, a)),
    "zeros": (lambda t, a: vkml.zeros(a), lambda x, a: np.zeros(a, np.float32)),
}


def _numpy_answer(fn, x, arg):
    try:
        return True, np.asarray(fn(x, arg))
    except Exception:      # noqa: BLE001 -- NumPy's refusals come in many kinds
        return False, None


def _stricter_than_numpy(name, arg) -> bool:
    """Arguments NumPy takes and vkml refuses on purpose: a bool used as a number (NumPy reads
    True as 1), and in ``reshape`` a negative size other than -1 (NumPy reads any as -1) or None."""
    items = arg if isinstance(arg, (tuple, list)) else (arg,)
    return any(isinstance(a, bool) for a in items) or name == "reshape" and (
        arg is None or any(isinstance(a, int) and a < -1 for a in items))


@settings(max_examples=150)
@given(name=st.sampled_from(sorted(AGAINST_NUMPY)),
       arg=st.one_of(SIZES, AXES, st.lists(SIZES, max_size=4).map(tuple)))
def test_refused_exactly_when_numpy_refuses(name, arg):
    """Where NumPy computes an answer vkml gives the same one (unless it refuses on purpose, see
    ``_stricter_than_numpy``); every refusal is a VkmlError, never NumPy's own exception.  vkml
    may be more lenient than NumPy (a list of axes where NumPy wants a tuple)."""
    ours, theirs = AGAINST_NUMPY[name]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with memory_cap():
        ok, expected = _numpy_answer(theirs, x, arg)
        try:
            got = ours(vkml.tensor(x), arg).numpy()
        except vkml.VkmlError:
            assert not ok or _stricter_than_numpy(name, arg), f"NumPy computes {name}({arg!r})"
            return
    if ok:
        np.testing.assert_array_equal(got, expected)
