"""Traced programs: ``jit``, ``scan`` and the derivative transformations, on Tensors.

How one call of a jitted function works: ``jit(body)`` keeps one
Program per *key* -- the pytree structure of the arguments with each leaf's
dtype, shape and device (and which leaves are the same array) -- tracing the
body once per key; each program compiles once per *variant* (backend and
argument layout).  ``grad`` derives from the key's program its derivative
(``jvp``), splits it into the part that reads no tangent and the part linear
in the tangents, and transposes the linear part: every derived program is
cached per derivation, so a second gradient with the same key traces,
derives and compiles nothing.

Arguments and results are pytrees of Tensors, NumPy arrays and Python
numbers.  With concrete arguments a call runs at once; with lazy or traced
arguments (inside another trace, or tensors that require grad) it becomes one
``call`` equation of the larger graph, so autograd flows through it and the
whole graph is still one submission.

The package's modules, lowest first: ``checks`` (argument checks), ``arguments`` (pytrees,
signatures, the program cache, tracing), ``jitted`` (``jit``), ``derivatives``, ``batching``
(``vmap``), ``jacobians``, ``control_flow`` (``scan``, ``switch``, ``cond``, ``while_loop``),
``loops`` (``fori_loop``, ``associative_scan``), ``custom_rules`` and ``grad_checks``.
"""

from __future__ import annotations

from .jitted import Jitted, jit, program
from .derivatives import grad, jvp, linearize, value_and_grad, vjp
from .batching import vmap
from .jacobians import hessian, hvp, jacfwd, jacrev
from .control_flow import cond, scan, switch, while_loop
from .loops import associative_scan, fori_loop
from .custom_rules import checkpoint, custom_jvp, custom_vjp
from .grad_checks import GradCheckError, check_grads
from ..printer import pp_program

__all__ = ["jit", "scan", "grad", "value_and_grad", "vjp", "jvp", "linearize", "program", "pp_program",
           "Jitted", "vmap", "jacfwd", "jacrev", "hessian", "hvp", "cond", "switch",
           "while_loop", "custom_jvp", "custom_vjp", "checkpoint", "check_grads",
           "GradCheckError", "fori_loop", "associative_scan"]
