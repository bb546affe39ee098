"""``scan``, ``switch``, ``cond`` and ``while_loop`` on Python functions, with their argument
checks and the loop's bound."""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..errors import ArgumentError, DTypeError, ShapeError, boundary
from ..ir import Var, dtype_name, format_shape, program_from_dag
from ..ops import api, bind
from ..ops.checks import checked
from ..pytree import flatten, unflatten
from ..tensor import Tensor, logical_and, realize, where
from ..transforms.control import cond_p, scan_bind, while_p
from ..validate import check_bool
from .arguments import captures_of, leaf_var, placeholders_like, trace_closed, wrap
from .checks import check_function, check_step, checked_count


@boundary
def scan(step, init, xs, length=None, reverse=False):
    """``carry, ys = scan(step, init, xs)``: ``carry, y = step(carry, x)`` for each row x of xs.

    ONE construct in the program: ``step`` is traced once for all rows, and
    the derivative of the scan is again a scan.  ``init``/``xs``/results are
    pytrees; ``xs`` may be None with ``length`` given.  Tensors the step
    closes over become the scan's captures (they get gradients).

    >>> def step(total, x):
    ...     total = total + x
    ...     return total, total
    ...
    >>> vkml.scan(step, np.float64(0.0), np.array([1.0, 2.0, 3.0]))
    (tensor(6., dtype=float64), tensor([1., 3., 6.], dtype=float64))
    """
    check_step(step, "scan", "the step")
    reverse = check_bool(reverse, "reverse", "scan")
    if length is not None:
        length = checked_count(length, "scan", "length", "the number of steps")
    init_leaves, init_tree = flatten(init)
    xs_leaves, xs_tree = flatten(xs)
    init_vars = [leaf_var(x, "scan init") for x in init_leaves]
    xs_vars = [leaf_var(x, "scan xs") for x in xs_leaves]
    lengths = {v.shape[0] for v in xs_vars if v.ndim}
    if any(v.ndim == 0 for v in xs_vars):
        raise ShapeError("scan: every leaf of xs needs a leading axis of rows; got a 0-d leaf")
    if length is None:
        if not lengths:
            raise ArgumentError("scan: give length= when xs has no leaves")
        if len(lengths) > 1:
            raise ShapeError(f"scan: the leaves of xs have different numbers of rows {sorted(lengths)}")
        length = lengths.pop()
    elif lengths and lengths != {length}:
        raise ShapeError(f"scan: length={length} but xs has {sorted(lengths)} rows")
    length = int(length)
    carry_ph = [Var(v.shape, v.dtype, v.device, weak=v.weak) for v in init_vars]
    x_ph = [Var(v.shape[1:], v.dtype, v.device) for v in xs_vars]
    result = trace_closed(
        step, (unflatten(init_tree, [Tensor(p) for p in carry_ph]),
               unflatten(xs_tree, [Tensor(p) for p in x_ph])), carry_ph + x_ph)
    if not isinstance(result, tuple) or len(result) != 2:
        raise ArgumentError("scan: the step must return a pair (new_carry, y)")
    carry_out, y = result
    c_leaves, c_tree = flatten(carry_out)
    if c_tree != init_tree:
        raise ShapeError(f"scan: the step returned a carry of structure {c_tree}, "
                         f"but init has structure {init_tree}")
    c_vars = [leaf_var(x, "scan carry") for x in c_leaves]
    for i, (a, b) in enumerate(zip(init_vars, c_vars)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise (ShapeError if a.shape != b.shape else DTypeError)(f"scan: carry leaf {i} enters the step as {dtype_name(a.dtype)} "
                             f"{format_shape(a.shape)} and leaves it as {dtype_name(b.dtype)} "
                             f"{format_shape(b.shape)}; a carry must keep its shape and dtype "
                             "(cast or reshape it inside the step)")
    y_leaves, y_tree = flatten(y)
    y_vars = [leaf_var(x, "scan y") for x in y_leaves]
    outs = c_vars + y_vars
    captures = captures_of(outs, carry_ph + x_ph)
    program = program_from_dag(captures + carry_ph + x_ph, outs)
    res = scan_bind(program, captures, init_vars, xs_vars, length, reverse)
    tensors = wrap(res, captures + init_vars + xs_vars)
    return (unflatten(init_tree, tensors[:len(init_vars)]),
            unflatten(y_tree, tensors[len(init_vars):]))


def switch(index, branches, *operands):
    """Run ``branches[index](*operands)``; every branch is traced once, and the choice is a value
    of the program (so it works under jit, grad and vmap, where Python ``if`` cannot).

    >>> branches = [lambda x: x, lambda x: x * 10.0, lambda x: -x]
    >>> vkml.switch(1, branches, 2.0)
    tensor(20., dtype=float64)
    """
    branches = _check_branches(branches)
    op_leaves, op_tree = flatten(operands)
    op_vars = [leaf_var(x, "cond operand") for x in op_leaves]
    traced, all_caps, ref_tree, ref_types = [], [], None, None
    for k, branch in enumerate(branches):
        ph = placeholders_like(op_vars)
        out = trace_closed(branch, unflatten(op_tree, [Tensor(p) for p in ph]), ph)
        out_leaves, out_tree = flatten(out)
        outs = [leaf_var(o, "cond result") for o in out_leaves]
        types = [(v.shape, v.dtype) for v in outs]
        if ref_tree is None:
            ref_tree, ref_types = out_tree, types
        elif out_tree != ref_tree or types != ref_types:
            raise ShapeError(f"cond: branch 0 returns {ref_tree} of "
                             f"{[dtype_name(d) + ' ' + format_shape(s) for s, d in ref_types]} but branch {k} "
                             f"returns {out_tree} of {[dtype_name(d) + ' ' + format_shape(s) for s, d in types]}; "
                             "every branch must return the same types")
        caps = captures_of(outs, ph)
        all_caps += [c for c in caps if c not in all_caps]
        traced.append((ph, outs))
    programs = tuple(program_from_dag(all_caps + ph, outs) for ph, outs in traced)
    idx = _branch_index(index, len(branches))
    res = bind(cond_p, idx, *all_caps, *op_vars, branches=programs)
    return unflatten(ref_tree, wrap(res, all_caps + op_vars))


def cond(pred, true_fn, false_fn, *operands):
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, as one construct.

    >>> vkml.cond(True, lambda x: x + 1.0, lambda x: x - 1.0, 5.0)
    tensor(6., dtype=float64)
    >>> vkml.grad(lambda x: vkml.cond(x > 0.0, lambda x: x * x, lambda x: -x, x))(3.0)
    tensor(6., dtype=float64)
    """
    return switch(_truth(pred), [false_fn, true_fn], *operands)


def while_loop(cond_fn, body_fn, init, max_iters=None, on_max_iters="warn"):
    """Repeat ``carry = body_fn(carry)`` while ``cond_fn(carry)``.

    Without ``max_iters`` it is a loop of the program (forward and forward
    mode).  With ``max_iters`` it is a scan of ``max_iters`` guarded steps,
    so reverse mode works too (the steps after the condition fails keep the
    carry unchanged).  A loop whose condition still holds after ``max_iters``
    steps is cut short: ``on_max_iters`` says what then happens -- "warn" (a
    ``VkmlWarning``), "raise" (ExecutionError) or "ignore".  The check is part
    of the program (``vkml.ops.checks``), so it runs inside jit, grad, vmap
    and scan too, once per run, wherever the loop's result is used; a loop on
    concrete values is run (and checked) at once.

    >>> vkml.while_loop(lambda x: x < 10.0, lambda x: x * 2.0, 1.0)
    tensor(16., dtype=float64)
    """
    check_function(cond_fn, "while_loop", "the condition")
    check_function(body_fn, "while_loop", "the body")
    if max_iters is not None:
        if on_max_iters not in ("warn", "raise", "ignore"):
            raise ArgumentError(f"while_loop: on_max_iters must be 'warn', 'raise' or 'ignore', "
                                f"got {on_max_iters!r}")
        max_iters = checked_count(max_iters, "while_loop", "max_iters", "a bound on the iterations", 1)
        final, cut = _bounded_while(cond_fn, body_fn, init, max_iters)
        return _checked_cut(final, cut, max_iters, on_max_iters)
    leaves, tree = flatten(init)
    init_vars = [leaf_var(x, "while_loop init") for x in leaves]
    cph = placeholders_like(init_vars)
    c_out = trace_closed(cond_fn, (unflatten(tree, [Tensor(p) for p in cph]),), cph)
    c_var = leaf_var(c_out, "while_loop condition")
    if c_var.shape != () or c_var.dtype.kind != "b":
        raise ShapeError(f"while_loop: the condition must return a bool scalar, got {c_var.type_str()}")
    bph = placeholders_like(init_vars)
    b_out = trace_closed(body_fn, (unflatten(tree, [Tensor(p) for p in bph]),), bph)
    b_leaves, b_tree = flatten(b_out)
    if b_tree != tree:
        raise ShapeError(f"while_loop: the body returns {b_tree} but the carry is {tree}")
    b_vars = [leaf_var(x, "while_loop body") for x in b_leaves]
    for i, (a, b) in enumerate(zip(init_vars, b_vars)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise (ShapeError if a.shape != b.shape else DTypeError)(f"while_loop: carry leaf {i} enters as {a.type_str()} and leaves as "
                             f"{b.type_str()}; a carry must keep its shape and dtype")
    ccaps, bcaps = captures_of([c_var], cph), captures_of(b_vars, bph)
    res = bind(while_p, *ccaps, *bcaps, *init_vars, cond=program_from_dag(ccaps + cph, [c_var]),
               body=program_from_dag(bcaps + bph, b_vars), num_cond_consts=len(ccaps),
               num_body_consts=len(bcaps))
    return unflatten(tree, wrap(res, ccaps + bcaps + init_vars))


def _bounded_while(cond_fn, body_fn, init, max_iters):

    def step(carry, _):
        state, active = carry
        go = logical_and(active, cond_fn(state))
        new = body_fn(state)
        n_leaves, n_tree = flatten(new)
        o_leaves, o_tree = flatten(state)
        if n_tree != o_tree:
            raise ShapeError(f"while_loop: the body returns {n_tree} but the carry is {o_tree}")
        kept = [where(go, n, o) for n, o in zip(n_leaves, o_leaves)]
        return (unflatten(o_tree, kept), go), None

    (final, active), _ = scan(step, (init, np.bool_(True)), None, length=max_iters)
    return final, logical_and(active, cond_fn(final))  # cut short: the last step ran and more would


def _check_branches(branches):
    if not isinstance(branches, (tuple, list)) or not branches:
        raise ArgumentError(f"switch: branches must be a non-empty list of functions, got "
                            f"{type(branches).__name__}")
    for k, b in enumerate(branches):
        check_function(b, "switch", f"branch {k}")
    return list(branches)


def _branch_index(index, n):
    """The branch number as an int32 scalar of the program, clamped to [0, n-1] as in JAX (before
    narrowing to int32, so a huge index picks the last branch instead of wrapping around)."""
    idx = leaf_var(index, "switch index")
    if idx.shape != ():
        raise ShapeError(f"switch: the index must be a scalar, got shape {format_shape(idx.shape)}")
    if idx.dtype.kind == "f":
        raise ArgumentError(f"switch: the index must be an integer, got {dtype_name(idx.dtype)}; "
                            "cast it (.astype(np.int32)), or use vkml.cond for a truth value")
    if idx.dtype.kind == "b":
        return api.cast(idx, np.int32)
    clamped = api.minimum(api.maximum(idx, 0), n - 1)
    return api.cast(clamped, np.int32)


def _truth(pred):
    """cond's predicate as a bool scalar: a number counts as true when nonzero (as Python's ``if``)."""
    p = leaf_var(pred, "cond predicate")
    if p.shape != ():
        raise ShapeError(f"cond: the predicate must be a scalar, got shape {format_shape(p.shape)}; "
                         "reduce it (.any(), .all()) or use vkml.where for a choice per element")
    return Tensor(p) if p.dtype.kind == "b" else Tensor(api.not_equal(p, 0))


def _checked_cut(final, cut, max_iters, on_max_iters):
    """The loop's result with each leaf checked against ``cut`` (the condition still held after
    ``max_iters`` steps): it warns or raises where the result is computed -- inside a traced
    program too -- once per run however many leaves are used.  A loop on concrete values is
    realized at once (one submission), so the warning names the line of the while_loop."""
    if on_max_iters == "ignore":
        return final
    message = (f"while_loop: the condition still held after max_iters={max_iters} iterations, so the "
               "result is cut short; raise max_iters, or pass on_max_iters='ignore' if a bounded "
               "result is what you want")
    leaves, tree = flatten(final)
    out = [Tensor(checked(x.ir_var, cut.ir_var, message, on_max_iters), x.requires_grad)
           for x in leaves]
    if not runtime.is_traced(cut.ir_var):
        realize(out)
    return unflatten(tree, out)
