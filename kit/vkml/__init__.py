"""vkml: differentiable programs -- lazy tensors with autograd, traced programs, graphs of kernels.

The public API:

- tensors: ``tensor``, ``realize``, ``assign``, ``backward``, ``set_eager``/``is_eager``,
  ``stats``/``reset_stats``, and the operations (``add``, ``mul``, ``sum``, ``matmul``, ...);
  NumPy's own functions on a Tensor (``np.exp(t)``, ``np.sum(t, axis=0)``) run these too
- programs: ``jit``, ``grad``, ``vmap``, ``jacfwd``/``jacrev``/``hessian``, ``scan``,
  ``fori_loop``, ``while_loop``, ``associative_scan``, ``cond``/``switch``, ``custom_vjp``, over
  pytrees (tuples, lists, dicts, namedtuples, dataclasses, ``pytree.register``-ed classes)
- ``nn`` and ``optim``: layers, losses, SGD and Adam
- backends and modes: ``set_backend``/``use_backend``, ``backend_info``, ``no_grad``/``eager``
  (per thread and asyncio task; see ``vkml.runtime``)
- caches: ``clear_caches``, ``set_cache_limit``/``cache_limit``; sizes in ``stats().caches``
- ``vkml.numpy`` (``import vkml.numpy as vnp``) and ``vkml.scipy.special``: NumPy's and
  SciPy's names on lazy, differentiable tensors
- ``viz``: graphviz pictures of Programs, lazy graphs, derived programs, Graphs and Records
- ``progress``: progress bars for long work (``tqdm.auto``, quiet outside notebooks)
- in Jupyter: ``%load_ext vkml`` (the ``%%vkml`` magic) and ``vkml.widgets`` (explorers), both
  from the separate ``vkml_jupyter`` package, imported only when asked for
"""

from . import errors, ir, ops, pytree, runtime
from .backends import backend_info, reset_stats, stats
from .runtime import (cache_limit, clear_caches, deterministic_matmul, eager, enable_grad, is_eager,
                      is_deterministic_matmul, is_grad_enabled, no_grad, set_backend, set_cache_limit,
                      set_eager, use_backend)
from .errors import (ArgumentError, BackendError, DTypeError, ExecutionError, GradError, ShapeError,
                     TracingError, VkmlError, VkmlWarning)
from .ir import Program, Var
from .printer import pp_program
from .programs import (GradCheckError, Jitted, associative_scan, check_grads, checkpoint, cond,
                       custom_jvp, custom_vjp, fori_loop, grad, hessian, hvp, jacfwd, jacrev, jit, jvp,
                       linearize, program, scan, switch, value_and_grad, vjp, vmap, while_loop)
from .tensor import (Tensor, abs, add, argmax, argmin, assign, avg_pool2d, backward, broadcast_to,
                     cast, clip, concatenate, conv2d, cos, div, dot, equal, exp, expand_dims,
                     flatten, flip, floor_divide, gather, greater, greater_equal, less, less_equal,
                     log, log_softmax, logical_and, logical_not, logical_or, logsumexp, matmul, max,
                     max_pool2d, maximum, mean, min, minimum, mod, mul, neg, not_equal, pad,
                     permute, pow, realize, relu, reshape, scatter_add, sigmoid, sign, sin, softmax,
                     sqrt, square, squeeze, stack, std, stop_gradient, sub, sum, swapaxes, take,
                     take_along_axis, tanh, tensor, transpose, var, where)
from .creation import arange, full, ones, ones_like, zeros, zeros_like

from . import nn, optim, progress, viz
from . import numpy, scipy  # vkml.numpy (NumPy's names, differentiable) and vkml.scipy.special
from . import graph
from .errors import Busy, BudgetError, RecordError, RefusedError
from .graph import (Graph, Param, SkipGuard, diff, kernel, repeat_while, simulation, skippable,
                    until_done)

viz.install()  # Programs and pending Tensors draw themselves as a notebook cell's last expression

float32, float64, int32, int64 = "float32", "float64", "int32", "int64"
bool_ = "bool"

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext vkml``: register the ``%%vkml`` and ``%vkml`` magics (see ``vkml_jupyter``).

    The Jupyter layer lives in its own package and is imported only here, so
    ``import vkml`` never imports IPython.

    >>> from IPython.core.interactiveshell import InteractiveShell
    >>> ip = InteractiveShell()    # a shell of its own (a notebook has one already)
    >>> _ = ip.extension_manager.load_extension("vkml")
    >>> "vkml" in ip.magics_manager.magics["line"]
    True
    """
    import vkml_jupyter  # local: the Jupyter layer (and IPython), only when asked for
    vkml_jupyter.load_ipython_extension(ipython)


def __getattr__(name):
    # ``vkml.widgets`` is the Jupyter layer's widgets module, imported on first use.
    if name == "widgets":
        from vkml_jupyter import widgets  # local: the Jupyter layer (and ipywidgets), on first use
        return widgets
    raise AttributeError(f"module 'vkml' has no attribute {name!r}")
