"""Custom derivative rules (``custom_jvp``, ``custom_vjp``) and ``checkpoint``."""

from __future__ import annotations

import contextlib
import functools
import threading

from ..errors import ArgumentError, ShapeError, TracingError
from ..ir import Program, Var, format_shape
from ..ops import api, bind
from ..pytree import flatten, unflatten
from ..tensor import Tensor
from ..transforms.control import custom_jvp_p, custom_vjp_p, remat_p
from .jitted import hashable, jit, with_statics
from .arguments import keyword_caller, leaf_var, wrap
from .checks import check_function, is_int


def _refuse_captures(entry, kind, name):
    """A custom rule sees only the function's arguments, so it cannot close over traced values."""
    if entry.captures:
        raise TracingError(f"{kind} {name}: the function closes over {len(entry.captures)} traced "
                           "value(s) of an enclosing transformation (grad, vmap, scan, ...); its "
                           "rule only sees the arguments, so pass those values as arguments")


def _example(vars_):
    return [Tensor(Var(v.shape, v.dtype, v.device)) for v in vars_]


#: Per thread, the custom-rule functions whose rules are being traced right now.
_RULES_BEING_TRACED = threading.local()


def _rules_being_traced() -> set:
    active = getattr(_RULES_BEING_TRACED, "ids", None)
    if active is None:
        active = _RULES_BEING_TRACED.ids = set()
    return active


@contextlib.contextmanager
def _tracing_rules_of(f):
    """While ``f``'s rules are traced, a call of ``f`` inside them is a primal computation (as in
    JAX: ``out = f(x)`` in its own jvp rule, ``f(x)`` in its fwd), so it evaluates the function
    itself rather than tracing the rules again, forever."""
    active = _rules_being_traced()
    active.add(id(f))
    try:
        yield
    finally:
        active.discard(id(f))


def _inside_own_rule(f) -> bool:
    return id(f) in _rules_being_traced()


class custom_jvp:
    """A function with a hand-written forward-mode rule: ``f.defjvp(rule)`` where
    ``rule(primals, tangents) -> (out, tangent_out)``; the tangent must be linear
    in the tangents (reverse mode transposes it).  The rule may call the function
    itself for ``out`` (as in JAX); there it is the plain function.

    >>> @vkml.custom_jvp
    ... def softplus(x):
    ...     return vkml.log(1.0 + vkml.exp(x))
    ...
    >>> @softplus.defjvp
    ... def softplus_jvp(primals, tangents):
    ...     (x,), (t,) = primals, tangents
    ...     return vkml.log(1.0 + vkml.exp(x)), t * vkml.sigmoid(x)
    ...
    >>> vkml.grad(softplus)(0.0)
    tensor(0.5, dtype=float64)
    """

    def __init__(self, fun):
        self.fun = fun
        self.rule = None
        self._flat = {}  # number of inputs -> the rule as a jitted flat function, traced once
        functools.update_wrapper(self, fun)

    def defjvp(self, rule):
        """Set the forward-mode rule ``rule(primals, tangents) -> (out, tangent_out)``; returns it, so it works as a decorator.

        >>> f = vkml.custom_jvp(lambda x: x * x)
        >>> _ = f.defjvp(lambda primals, tangents: (primals[0] ** 2, 2.0 * primals[0] * tangents[0]))
        >>> vkml.grad(f)(3.0)
        tensor(6., dtype=float64)
        """
        self.rule = rule
        self._flat.clear()  # the flat wrappers call the old rule
        return rule

    def __call__(self, *args):
        if self.rule is None:
            raise ArgumentError(f"custom_jvp {self.__name__}: define its rule with @f.defjvp first")
        if _inside_own_rule(self):
            return self.fun(*args)
        entry, leaves, in_vars = jit(self.fun)._lookup(args)
        _refuse_captures(entry, "custom_jvp", self.__name__)
        ex = _example(in_vars)
        rule = self._flat.get(len(in_vars))
        if rule is None:
            rule = self._flat[len(in_vars)] = jit(_rule_as_function(self.rule, len(in_vars)))
        with _tracing_rules_of(self):
            rentry, _, _ = rule._lookup(tuple(ex) + tuple(_example(in_vars)))
        _check_rule_outputs(self.__name__, entry.program, rentry.program)
        res = bind(custom_jvp_p, *in_vars, program=entry.program, jvp=rentry.program)
        return unflatten(entry.out_tree, wrap(res, in_vars))


def _check_rule_outputs(name, program, rule_program):
    """A custom_jvp rule gives one output and one tangent of the same shape and dtype for each
    of the function's outputs; anything else is refused before it is used (JAX's check too)."""
    outs, got = program.outputs, rule_program.outputs
    if len(got) != 2 * len(outs):
        raise ArgumentError(f"custom_jvp {name}: its rule returned {len(got)} values (outputs and "
                            f"tangents) for a function of {len(outs)} output(s); return "
                            "(out, tangent_out) shaped like the function's result")
    for i, (o, r, t) in enumerate(zip(outs, got[:len(outs)], got[len(outs):])):
        for what, v in (("output", r), ("tangent", t)):
            if (v.shape, v.dtype) != (o.shape, o.dtype):
                raise ShapeError(f"custom_jvp {name}: its rule's {what} {i} is {v.type_str()} but "
                                 f"the function's output {i} is {o.type_str()}; the rule must "
                                 "return values and tangents shaped like the function's result")


def _rule_as_function(rule, n):
    """rule(primals, tangents) as a function of 2n flat arguments, returning flat out + tangents."""
    def flat(*xs):
        out, tout = rule(tuple(xs[:n]), tuple(xs[n:]))
        return tuple(flatten(out)[0]) + tuple(flatten(tout)[0])
    flat.__name__ = getattr(rule, "__name__", "jvp_rule")
    return flat


class custom_vjp:
    """A function with a hand-written reverse-mode rule: ``f.defvjp(fwd, bwd)`` where
    ``fwd(*args) -> (out, residuals)`` and ``bwd(residuals, ct) -> one cotangent per argument``
    (None for a zero one).  ``nondiff_argnums``: positional arguments that are not differentiated
    (Python values such as functions or sizes, hashable); as in JAX, ``bwd`` gets them first,
    ``bwd(*nondiff, residuals, ct)``, and returns cotangents for the other arguments only.
    ``fwd`` and ``bwd`` may call the function itself; there it is the plain function.

    >>> @vkml.custom_vjp
    ... def clip_gradient(x):
    ...     return x
    ...
    >>> def fwd(x):
    ...     return x, None
    ...
    >>> def bwd(residuals, ct):
    ...     return (vkml.clip(ct, -1.0, 1.0),)
    ...
    >>> clip_gradient.defvjp(fwd, bwd)
    >>> vkml.grad(lambda x: vkml.sum(clip_gradient(x) * 5.0))(np.ones(2))
    tensor([1., 1.], dtype=float64)
    """

    def __init__(self, fun, nondiff_argnums=()):
        check_function(fun, "custom_vjp")
        self.fun = fun
        self.fwd = self.bwd = None
        self._flat = {}
        self.nondiff_argnums = _nondiff_argnums(nondiff_argnums)
        self._static = {}
        functools.update_wrapper(self, fun)

    def defvjp(self, fwd, bwd):
        """Set the reverse-mode rule: ``fwd(*args) -> (out, residuals)`` and ``bwd(residuals, ct) -> cotangents``.

        >>> f = vkml.custom_vjp(lambda x: x * x)
        >>> f.defvjp(lambda x: (x * x, x), lambda x, ct: (2.0 * x * ct,))
        >>> vkml.grad(f)(3.0)
        tensor(6., dtype=float64)
        """
        check_function(fwd, f"custom_vjp {self.__name__}.defvjp", "fwd")
        check_function(bwd, f"custom_vjp {self.__name__}.defvjp", "bwd")
        self.fwd, self.bwd = fwd, bwd
        self._static.clear()
        self._flat.clear()  # the flat bwd wrappers close over the old bwd

    def __call__(self, *args):
        if self.fwd is None:
            raise ArgumentError(f"custom_vjp {self.__name__}: define its rule with f.defvjp(fwd, bwd)")
        if _inside_own_rule(self):
            return self.fun(*args)
        if self.nondiff_argnums:
            return _call_with_nondiff(self, args)
        entry, leaves, in_vars = jit(self.fun)._lookup(args)
        _refuse_captures(entry, "custom_vjp", self.__name__)
        fwd = jit(self.fwd)
        with _tracing_rules_of(self):
            fentry, _, _ = fwd._lookup(args)
        out_res = fentry.out_tree
        if out_res.kind != "tuple" or len(out_res.children) != 2:
            raise ArgumentError("custom_vjp: fwd must return (out, residuals)")
        _check_fwd_out(self.__name__, entry, fentry)
        n_out = out_res.children[0].num_leaves
        res_vars = fentry.program.outputs[n_out:]
        fwd_flat = Program(fentry.program.inputs, fentry.program.eqns, fentry.program.outputs,
                           fentry.program.consts)
        res_tree, out_tree = out_res.children[1], out_res.children[0]
        bwd = self.bwd
        def bwd_flat(*xs):
            res = unflatten(res_tree, xs[:len(res_vars)])
            ct = unflatten(out_tree, xs[len(res_vars):])
            cts = bwd(res, ct)
            if not isinstance(cts, tuple) or len(cts) != len(args):
                raise ArgumentError(f"custom_vjp: bwd must return a tuple of {len(args)} cotangents, "
                                    "one per argument")
            return tuple(_cotangent_leaves(name, cts, args, in_vars))

        name = self.__name__

        key = (res_tree, out_tree, flatten(args)[1], tuple((v.shape, v.dtype) for v in in_vars))
        if key not in self._flat:
            self._flat[key] = jit(bwd_flat)
        with _tracing_rules_of(self):
            bentry, _, _ = self._flat[key]._lookup(
                tuple(_example(res_vars)) + tuple(_example(entry.program.outputs)))
        res = bind(custom_vjp_p, *in_vars, program=entry.program, fwd=fwd_flat, bwd=bentry.program,
                   num_res=len(res_vars))
        return unflatten(entry.out_tree, wrap(res, in_vars))


def checkpoint(fn):
    """``fn`` whose intermediates are recomputed in the backward pass instead of kept
    (memory for time: only its inputs are saved).

    >>> f = vkml.checkpoint(lambda x: vkml.sin(vkml.sin(x)))
    >>> vkml.grad(lambda x: vkml.sum(f(x)))(np.zeros(2))
    tensor([1., 1.], dtype=float64)
    """
    check_function(fn, "checkpoint")
    jitted = jit(fn)

    def remat(*args, **kwargs):
        if kwargs:              # traced arguments too, passed as one last positional dict
            return checkpoint(keyword_caller(fn))(*args, kwargs)
        entry, leaves, in_vars = jitted._lookup(args)
        res = bind(remat_p, *in_vars, program=entry.program)
        return unflatten(entry.out_tree, wrap(res, in_vars))

    remat.__name__ = f"checkpoint_of_{getattr(fn, '__name__', 'f')}"
    return remat


def _nondiff_argnums(nums):
    nums = tuple(nums) if isinstance(nums, (tuple, list)) else (nums,)
    if not all(is_int(a) and a >= 0 for a in nums):
        raise ArgumentError(f"custom_vjp: nondiff_argnums must be a tuple of non-negative ints, got {nums!r}")
    return tuple(sorted(set(nums)))


def _call_with_nondiff(f, args):
    """A custom_vjp with nondiff_argnums: one plain custom_vjp per value of those arguments, over the
    others; its bwd gets the non-differentiated values first, as in JAX."""
    nondiff = f.nondiff_argnums
    if nondiff[-1] >= len(args):
        raise ArgumentError(f"custom_vjp {f.__name__}: nondiff_argnums {nondiff} is out of range for a "
                            f"call with {len(args)} arguments")
    static = tuple(args[i] for i in nondiff)
    if not hashable(static):
        raise ArgumentError(f"custom_vjp {f.__name__}: the nondiff_argnums arguments must be hashable "
                            "Python values (functions, numbers, tuples); pass arrays as ordinary "
                            "arguments and return a zero (or None) cotangent for them")
    inner = f._static.get((len(args), static))
    if inner is None:
        values = dict(zip(nondiff, static))
        fun, fwd, bwd = (with_statics(g, values, len(args)) for g in (f.fun, f.fwd, f.bwd))
        inner = custom_vjp(fun)
        inner.__name__ = f.__name__
        inner.defvjp(fwd, lambda res, ct: f.bwd(*static, res, ct))
        f._static[(len(args), static)] = inner
    return inner(*[a for i, a in enumerate(args) if i not in nondiff])


def _check_fwd_out(name, entry, fentry):
    """fwd's ``out`` must be what the function itself returns (structure, shapes and dtypes)."""
    out_tree = fentry.out_tree.children[0]
    got = fentry.program.outputs[:out_tree.num_leaves]
    want = entry.program.outputs
    if out_tree != entry.out_tree or [(v.shape, v.dtype) for v in got] != [(v.shape, v.dtype) for v in want]:
        raise ShapeError(f"custom_vjp {name}: fwd returns (out, residuals) with out {out_tree} of "
                         f"{[v.type_str() for v in got]}, but the function returns {entry.out_tree} of "
                         f"{[v.type_str() for v in want]}; fwd's out must be the function's result")


def _cotangent_leaves(name, cts, args, in_vars):
    """bwd's cotangents as leaves, checked against the arguments (None = zero)."""
    leaves, start = [], 0
    for i, (ct, a) in enumerate(zip(cts, args)):
        a_leaves, a_tree = flatten(a)
        want = in_vars[start:start + len(a_leaves)]
        start += len(a_leaves)
        if ct is None:
            leaves += [Tensor(api.zeros(v.shape, v.dtype, v.device)) for v in want]
            continue
        c_leaves, c_tree = flatten(ct)
        if c_tree != a_tree:
            raise ShapeError(f"custom_vjp {name}: bwd's cotangent {i} has structure {c_tree}, but "
                             f"argument {i} is {a_tree}; return one cotangent per argument, shaped "
                             "like it (or None for zero)")
        for c, v in zip(c_leaves, want):
            cv = leaf_var(c, f"custom_vjp {name} cotangent")
            if cv.shape != v.shape:
                raise ShapeError(f"custom_vjp {name}: bwd's cotangent {i} has shape "
                                 f"{format_shape(cv.shape)}, but argument {i} has shape "
                                 f"{format_shape(v.shape)}; a cotangent is shaped like its argument")
        leaves += c_leaves
    return leaves
