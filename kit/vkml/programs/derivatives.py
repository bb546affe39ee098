"""``grad``, ``value_and_grad``, ``vjp``, ``jvp`` and ``linearize``.

Each derives from the key's program its derivative (``jvp``), splits off the part linear in the
tangents and transposes it; every derived program is cached per derivation."""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, GradError, ShapeError, boundary
from ..ir import Var, dtype_name, format_shape, program_from_dag
from ..ops import api
from ..pytree import flatten, unflatten
from ..tensor import Tensor, needs_grad
from ..transforms import jvp_program, partial_eval, transpose_program
from ..transforms.ad import derived
from ..transforms.interpret import inline
from ..validate import check_bool, check_sequence
from .jitted import apply_program, jit
from .arguments import fast_key, grad_disabled, keyword_caller, leaf_var, placeholders_like
from .checks import check_argnums, check_function, checked_argnums, is_int


def normalized_argnums(argnums, nargs):
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in nums:
        if not isinstance(a, int) or not -nargs <= a < nargs:
            raise ArgumentError(f"argnums {argnums} is out of range for {nargs} arguments")
    return tuple(a % nargs for a in nums)


def wrt_flags(args, nums):
    """Which flattened leaves of ``args`` are differentiated (those of the argnums arguments)."""
    flags = []
    for i, a in enumerate(args):
        n = len(flatten(a)[0])
        flags += [i in nums] * n
    return flags


def jvp_of(jitted, entry, flags):
    """``entry``'s forward-mode program for the tangents ``flags`` marks, derived once."""
    prog = entry.program
    return jitted._derive(entry, ("jvp", tuple(flags)),
                          lambda: derived("jvp", prog, flags, lambda: jvp_program(prog, flags)))


def vjp_parts(jitted, entry, flags):
    """jvp -> (known, linear) -> transposed, each derived once per derivation."""
    prog = entry.program
    name = tuple(flags)
    jp = jvp_of(jitted, entry, flags)
    n_in, n_t = len(prog.inputs), sum(flags)

    def split():
        return partial_eval(jp, [False] * n_in + [True] * n_t)

    known, linear, out_u = jitted._derive(entry, ("split", name), split)
    n_res = len(known.outputs) - sum(1 for u in out_u if not u)
    transposed = jitted._derive(entry, ("transposed", name), lambda: transpose_program(
        linear, [False] * n_res + [True] * n_t))
    entry.derived.setdefault("jvp", jp)
    entry.derived.setdefault("known", known)
    entry.derived.setdefault("linear", linear)
    entry.derived.setdefault("transposed", transposed)
    return known, linear, transposed, out_u, n_res


def gradient_residuals(fn, args):
    """``(known, saved)`` for ``fn``'s gradient with respect to every floating argument of
    ``args``: the known part of its derivative and the values that part hands to the backward,
    derived (and cached) without running anything; None when no argument is floating.
    ``vkml.viz.saved_residuals`` lists them."""
    entry, _, in_vars = fn._lookup(args)
    n_args = len(in_vars) - len(entry.captures)
    flags = [v.dtype.kind in "fc" for v in in_vars[:n_args]] + [False] * len(entry.captures)
    if not any(flags):
        return None
    known, _, _, _, n_res = vjp_parts(fn, entry, flags)
    return known, list(known.outputs[len(known.outputs) - n_res:]) if n_res else []


def float_check(v, where, i):
    if v.dtype.kind not in "fc":
        raise GradError(f"{where}: argument leaf {i} is {dtype_name(v.dtype)}; only floating "
                        "arguments can be differentiated (cast with .astype(np.float64))")


def _vjp_call(jitted, args, nums, where):
    """Run the known part; return (outputs, pullback over the linear part)."""
    entry, leaves, in_vars = jitted._lookup(args)
    flags = wrt_flags(args, nums) + [False] * len(entry.captures)
    for i, (v, f) in enumerate(zip(in_vars, flags)):
        if f:
            float_check(v, where, i)
    prog = entry.program
    known, linear, transposed, out_u, n_res = vjp_parts(jitted, entry, flags)
    n_out = len(prog.outputs)
    rg = needs_grad(leaves)
    known_out = apply_program(jitted, entry, ("known",), known, in_vars, rg)
    n_known = len(known.outputs) - n_res
    values = known_out[:n_out]
    residuals = known_out[n_known:]
    tangent_live = out_u[n_out:]

    def pullback(cts):
        ct_vars = [leaf_var(c, "cotangent") for c in cts]
        live = [c for c, u in zip(ct_vars, tangent_live) if u]
        if not live:
            return [Tensor(api.constant(np.zeros(v.shape, v.dtype))) for v, f in zip(in_vars, flags) if f]
        ins = [r.ir_var for r in residuals] + live
        need = rg or any(isinstance(c, Tensor) and c.requires_grad for c in cts)
        return apply_program(jitted, entry, ("transposed",), transposed, ins, need)

    return entry, values, pullback, flags, in_vars


def _grad_fn(fn, argnums, has_aux, with_value):
    jitted = jit(fn)
    where = "grad"

    positions = {}          # the argnums as positions, by the number of arguments

    def g(*args):
        nums = positions.get(len(args))
        if nums is None:
            nums = positions[len(args)] = normalized_argnums(argnums, len(args))
        fast = fast_key(args)
        plan = jitted._plan(("grad", nums, fast)) if fast is not None else None
        if plan is not None:            # plain arguments seen before: one fused submission
            results = plan.run(args)
            n_values = len(plan.entry.program.outputs)
            outs = unflatten(plan.entry.out_tree, results[:n_values])
            grads = results[n_values:]
            main, aux = (outs[0], outs[1]) if has_aux else (outs, None)
        else:
            # the first call runs the part that reads no tangent, then the transposed part,
            # and keeps the plan of one program doing both for the next calls (compiled now, so
            # a second call with these arguments' types compiles nothing)
            entry, values, pullback, flags, in_vars = _vjp_call(jitted, args, nums, where)
            main, aux = _scalar_main(unflatten(entry.out_tree, values), has_aux, where)
            cts = [np.ones((), dtype=values[0].dtype)] + [np.zeros(v.shape, v.dtype) for v in values[1:]]
            grads = pullback(cts)
            if fast is not None:
                jitted._remember(("grad", nums, fast), args, entry, in_vars,
                                 _value_and_grad_program(jitted, entry, flags))
        per_arg = _regroup(args, nums, grads)
        result = per_arg[0] if isinstance(argnums, int) else tuple(per_arg)
        if with_value:
            return ((main, aux), result) if has_aux else (main, result)
        return (result, aux) if has_aux else result

    g.__name__ = f"grad_of_{getattr(fn, '__name__', 'f')}"
    g.cache_info = jitted.cache_info
    g.jitted = jitted
    return g


def _scalar_main(outs, has_aux, where):
    """``(main, aux)`` of a function's results (Tensors, or the Vars of its program), checked:
    ``main`` a floating scalar, and with ``has_aux`` the results a pair."""
    if has_aux and (not isinstance(outs, tuple) or len(outs) != 2):
        raise GradError("grad(has_aux=True): the function must return (value, aux)")
    main, aux = (outs[0], outs[1]) if has_aux else (outs, None)
    if not isinstance(main, (Tensor, Var)) or main.shape != () or main.dtype.kind != "f":
        shape = getattr(main, "shape", None)
        raise GradError(f"{where}: the function must return a floating scalar (0-d) value, "
                        f"got shape {format_shape(shape) if shape is not None else type(main).__name__}; "
                        "use vkml.vjp or vkml.jacrev for non-scalar outputs")
    return main, aux


def _value_and_grad_program(jitted, entry, flags):
    """``(name, make)`` of the program that computes the function's outputs and the gradient of
    its first (a scalar) in ONE submission, where ``grad`` runs the known part and then the
    transposed part: the known part's equations followed by the transposed part's, fed the
    cotangents ``grad`` feeds it (1 for the scalar, 0 for the rest)."""
    prog = entry.program

    def make():
        known, _, transposed, out_u, n_res = vjp_parts(jitted, entry, flags)
        n_out, n_known = len(prog.outputs), len(known.outputs) - n_res
        placeholders = placeholders_like(prog.inputs)
        with grad_disabled():
            computed = inline(known, placeholders)
            values, residuals = computed[:n_out], computed[n_known:]
            cts = [api.constant(np.ones((), values[0].dtype))] + \
                [api.constant(np.zeros(v.shape, v.dtype)) for v in values[1:]]
            live = [c for c, u in zip(cts, out_u[n_out:]) if u]
            grads = inline(transposed, residuals + live) if live else \
                [api.constant(np.zeros(v.shape, v.dtype)) for v, f in zip(prog.inputs, flags) if f]
        return program_from_dag(placeholders, values + grads)

    return ("value_and_grad", tuple(flags)), make


def _regroup(args, nums, grads):
    """Cotangents of the flattened differentiated leaves, back in the arguments' pytree shapes,
    in the order of ``nums`` (the leaves come in argument order, as they were flattened)."""
    it = iter(grads)
    per_arg = {}
    for i in sorted(set(nums)):
        if type(args[i]) in _LEAF_TYPES:
            per_arg[i] = next(it)
            continue
        leaves, tree = flatten(args[i])
        per_arg[i] = unflatten(tree, [next(it) for _ in leaves])
    return [per_arg[i] for i in nums]


#: argument types that are one leaf each (a plain call's)
_LEAF_TYPES = (np.ndarray, Tensor)


def grad(fn, argnums=0, has_aux=False):
    """The gradient of a scalar function: ``grad(f)(x)`` has x's structure.

    Its programs are derived once per key and derivation (see the module
    docstring); ``grad(grad(f))`` works for scalar functions.

    >>> vkml.grad(lambda x: vkml.sum(x ** 3))(np.array([1.0, 2.0]))
    tensor([ 3., 12.], dtype=float64)
    >>> vkml.grad(lambda x, y: x * y, argnums=(0, 1))(2.0, 5.0)
    (tensor(5., dtype=float64), tensor(2., dtype=float64))
    """
    return _passing_keywords(fn, argnums, has_aux, False, "grad")


def value_and_grad(fn, argnums=0, has_aux=False):
    """Like ``grad`` but returns ``(f(x), grad)`` from the same run.

    >>> vkml.value_and_grad(lambda x: x * x)(3.0)
    (tensor(9., dtype=float64), tensor(6., dtype=float64))
    """
    return _passing_keywords(fn, argnums, has_aux, True, "value_and_grad")


@boundary
def vjp(fn, *args):
    """``out, pullback = vjp(f, *args)``; ``pullback(ct)`` returns one cotangent per argument.

    >>> out, pullback = vkml.vjp(lambda x: vkml.sin(x), np.array([0.0, np.pi]))
    >>> pullback(np.ones(2))
    (tensor([ 1., -1.], dtype=float64),)
    """
    check_function(fn, "vjp")
    jitted = jit(fn)
    nums = tuple(range(len(args)))
    entry, values, pb, flags, _ = _vjp_call(jitted, args, nums, "vjp")
    out = unflatten(entry.out_tree, values)

    def pullback(ct):
        ct_leaves, ct_tree = flatten(ct)
        if ct_tree != entry.out_tree:
            raise ArgumentError(f"vjp pullback: cotangent structure {ct_tree} differs from the "
                                f"output's {entry.out_tree}")
        for i, (c, v) in enumerate(zip(ct_leaves, values)):
            cv = leaf_var(c, "cotangent")
            if cv.shape != v.shape:
                raise ShapeError(f"vjp pullback: cotangent {i} has shape {format_shape(cv.shape)}, "
                                 f"the output has {format_shape(v.shape)}")
        grads = pb(ct_leaves)
        return tuple(_regroup(args, nums, grads))

    return out, pullback


@boundary
def jvp(fn, primals, tangents):
    """``(f(primals), df(primals)[tangents])`` by forward mode, its program derived once.

    >>> vkml.jvp(lambda x: x * x, (3.0,), (1.0,))
    (tensor(9., dtype=float64), tensor(6., dtype=float64))
    """
    check_function(fn, "jvp")
    primals = tuple(check_sequence(primals, "primals", "jvp"))
    tangents = tuple(check_sequence(tangents, "tangents", "jvp"))
    jitted = jit(fn)
    _, p_tree = flatten(primals)
    t_leaves, t_tree = flatten(tangents)
    if p_tree != t_tree:
        raise ArgumentError(f"jvp: tangents {t_tree} must have the primals' structure {p_tree}")
    entry, leaves, in_vars = jitted._lookup(primals)
    t_vars = [leaf_var(t, "tangent") for t in t_leaves]
    for i, (p, t) in enumerate(zip(in_vars, t_vars)):
        if p.shape != t.shape:
            raise ShapeError(f"jvp: tangent {i} has shape {format_shape(t.shape)}, its primal "
                             f"{format_shape(p.shape)}")
    flags = [v.dtype.kind in "fc" for v in in_vars[:len(t_vars)]] + [False] * len(entry.captures)
    jp = jvp_of(jitted, entry, flags)
    entry.derived.setdefault("jvp", jp)
    ins = in_vars + [api.cast(t, p.dtype) for t, p, f in zip(t_vars, in_vars, flags) if f]
    rg = needs_grad(leaves + t_leaves)
    outs = apply_program(jitted, entry, ("jvp",), jp, ins, rg)
    n = len(entry.program.outputs)
    return unflatten(entry.out_tree, outs[:n]), unflatten(entry.out_tree, outs[n:])


@boundary
def linearize(fn, *primals):
    """``out, f_jvp = linearize(f, *primals)``: the known part runs now, ``f_jvp(*tangents)``
    runs only the part linear in the tangents (the residuals are kept).

    >>> out, f_jvp = vkml.linearize(lambda x: x ** 3, 2.0)
    >>> out, f_jvp(1.0)
    (tensor(8., dtype=float64), tensor(12., dtype=float64))
    """
    check_function(fn, "linearize")
    jitted = jit(fn)
    entry, leaves, in_vars = jitted._lookup(primals)
    n_args = len(in_vars) - len(entry.captures)
    flags = [v.dtype.kind in "fc" for v in in_vars[:n_args]] + [False] * len(entry.captures)
    known, linear, transposed, out_u, n_res = vjp_parts(jitted, entry, flags)
    rg = needs_grad(leaves)
    known_out = apply_program(jitted, entry, ("known",), known, in_vars, rg)
    n_out = len(entry.program.outputs)
    n_known = len(known.outputs) - n_res
    residuals = known_out[n_known:]
    out = unflatten(entry.out_tree, known_out[:n_out])
    live = out_u[n_out:]
    known_tangents = known_out[n_out:n_known]

    def f_jvp(*tangents):
        t_leaves, t_tree = flatten(tuple(tangents))
        if len(t_leaves) != n_args:
            raise ArgumentError(f"linearize: expected {n_args} tangent leaves, got {len(t_leaves)}")
        t_vars = [api.cast(leaf_var(t, "tangent"), p.dtype) for t, p in zip(t_leaves, in_vars)]
        ins = [r.ir_var for r in residuals] + [t for t, f in zip(t_vars, flags) if f]
        res = apply_program(jitted, entry, ("linear",), linear, ins, False)
        it_u, it_k = iter(res), iter(known_tangents)
        return unflatten(entry.out_tree, [next(it_u) if u else next(it_k) for u in live])

    return out, f_jvp


def _passing_keywords(fn, argnums, has_aux, with_value, where):
    """``grad``/``value_and_grad`` of ``fn``: keyword arguments go to ``fn`` undifferentiated, as in JAX."""
    check_function(fn, where)
    check_argnums(argnums, where)
    has_aux = check_bool(has_aux, "has_aux", where)
    positional = _grad_fn(fn, argnums, has_aux, with_value)

    checked = {}            # the argnums as positions, by the number of arguments

    @boundary
    def g(*args, **kwargs):
        nums = checked.get(len(args))
        if nums is None:
            nums = checked[len(args)] = checked_argnums(argnums, len(args), where)
        if not kwargs:
            return positional(*args)
        fixed = nums[0] if is_int(argnums) else nums
        return _grad_fn(keyword_caller(fn), fixed, has_aux, with_value)(*args, kwargs)

    g.__name__ = positional.__name__
    g.cache_info = positional.cache_info
    g.jitted = positional.jitted
    return g
