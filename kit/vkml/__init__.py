"""vkml: differentiable programs -- lazy tensors with autograd, traced programs, graphs of kernels.

The public API (see DESIGN.md):

- tensors: ``tensor``, ``realize``, ``assign``, ``backward``, ``set_eager``/``is_eager``,
  ``stats``/``reset_stats``, and the operations (``add``, ``mul``, ``sum``, ``matmul``, ...)
- ``nn`` and ``optim``: layers, losses, SGD and Adam
- backends: ``set_backend``, ``backend_info``
"""

from . import errors, ir, ops
from .backends import backend_info, reset_stats, set_backend, stats
from .errors import (ArgumentError, BackendError, DTypeError, ExecutionError, GradError, ShapeError,
                     TracingError, VkmlError)
from .ir import Program, Var
from .printer import pp_program
from .programs import (GradCheckError, Jitted, check_grads, checkpoint, cond, custom_jvp, custom_vjp,
                       grad, hessian, hvp, jacfwd, jacrev, jit, jvp, linearize, program, scan, switch,
                       value_and_grad, vjp, vmap, while_loop)
from .tensor import (Tensor, abs, add, arange, argmax, argmin, assign, avg_pool2d, backward,
                     broadcast_to, cast, clip, concatenate, conv2d, cos, div, dot, eager, equal,
                     exp, expand_dims, flatten, flip, floor_divide, full, gather, greater,
                     greater_equal, is_eager, less, less_equal, log, log_softmax, logical_and,
                     logical_not, logical_or, logsumexp, matmul, max, max_pool2d, maximum, mean,
                     min, minimum, mul, neg, no_grad, not_equal, ones, ones_like, pad, permute, pow,
                     realize, relu, reshape, scatter_add, set_eager, sigmoid, sign, sin, softmax,
                     sqrt, square, squeeze, stack, stop_gradient, sub, sum, swapaxes, take,
                     take_along_axis, tanh, tensor, transpose, where, zeros, zeros_like)

from . import nn, optim

float32, float64, int32, int64 = "float32", "float64", "int32", "int64"
bool_ = "bool"

__version__ = "0.1.0"
