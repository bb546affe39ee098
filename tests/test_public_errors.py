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

import vkml
from bad_inputs import BAD_VALUES, call_once, leaks, memory_cap, public_callables, signature_arity

pytestmark = pytest.mark.usefixtures("eager")

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


def G():
    """A leaf that requires grad."""
    return vkml.tensor(np.array([1.0, 2.0], dtype=np.float32), requires_grad=True)


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
BINARY = ["add", "div", "dot", "equal", "floor_divide", "greater", "greater_equal", "less",
          "less_equal", "logical_and", "logical_or", "maximum", "minimum", "mul", "not_equal",
          "pow", "sub"]

#: name -> a fresh valid ``(args, kwargs)``; the keyword arguments listed are mutated too.
BASELINES = {
    **{name: _unary(name) for name in UNARY},
    **{name: _binary(name) for name in BINARY},
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

    def linear():
        return nn.Linear(3, 2, rng=0)

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
        # calling built layers: their forward with a bad input
        "Linear()": (lambda: linear()(M()), None),
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
        assert call_once(fn, args, kwargs) is None, name


def _check(namespace, baselines):
    found = []
    with memory_cap():
        for name, make in sorted(baselines.items()):
            if make is None or isinstance(make, tuple):
                continue
            found += leaks(name, getattr(namespace, name), make)
    assert not found, f"{len(found)} calls leaked:\n" + "\n".join(found)


@pytest.mark.parametrize("group", ["elementwise", "other"])
def test_tensor_functions(group, vk_backend):
    chosen = {k: v for k, v in BASELINES.items() if (k in UNARY or k in BINARY) == (group == "elementwise")}
    _check(vkml, chosen)
