"""``jacfwd``, ``jacrev``, ``hessian`` and ``hvp``: one function builds both Jacobians
(forward columns or reverse rows), of arrays and of pytrees."""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, GradError, boundary
from ..ir import dtype_name
from ..ops import api
from ..pytree import flatten, unflatten
from ..tensor import Tensor, cast, concatenate, needs_grad, reshape
from ..transforms import vmap_program
from ..transforms.ad import derived
from ..validate import check_bool, check_sequence
from .jitted import apply_program, jit
from .arguments import keyword_caller, leaf_var
from .derivatives import float_check, grad, jvp, jvp_of, normalized_argnums, vjp_parts, wrt_flags
from .batching import single_leaf
from .checks import check_argnums, check_function, checked_argnums, is_int


def _jacobian_call(jitted, args, argnums, where):
    """The checks and lookups a Jacobian needs: one array argument, one array result."""
    nums = normalized_argnums(argnums, len(args))
    if len(nums) != 1:
        raise ArgumentError(f"{where}: give one argnum")
    single_leaf(args[nums[0]], where)
    entry, leaves, in_vars = jitted._lookup(args)
    flags = wrt_flags(args, nums) + [False] * len(entry.captures)
    i = flags.index(True)
    float_check(in_vars[i], where, i)
    if len(entry.program.outputs) != 1:
        raise ArgumentError(f"{where}: the function must return one array")
    return entry, leaves, in_vars, flags, i


def _array_jacobian(fn, argnums, mode):
    """The Jacobian of one array result by one array argument, shaped output + input (``mode`` is
    ``"jacfwd"`` or ``"jacrev"``, also the name errors give): the
    derivative program mapped over a basis -- of tangents for ``jacfwd`` (a column per input
    element, forward mode) or of cotangents for ``jacrev`` (a row per output element, reverse)."""
    jitted = jit(fn)
    sweep = _forward_columns if mode == "jacfwd" else _reverse_rows

    def jac(*args):
        entry, leaves, in_vars, flags, i = _jacobian_call(jitted, args, argnums, mode)
        rg = needs_grad(leaves)
        j, rg = sweep(jitted, entry, in_vars, flags, in_vars[i], rg)
        return Tensor(j, rg)

    return jac


def _over_basis(jitted, entry, flags, mode, prog, n_fixed, like, operands, rg):
    """``prog`` mapped over the rows of an identity basis shaped like ``like`` (its last input
    batched, the ``n_fixed`` before it not), derived once per key and flags."""
    n = like.size
    bflags = [False] * n_fixed + [True]
    batched = jitted._derive(entry, (mode, tuple(flags)), lambda: derived(
        "vmap", prog, bflags + [n], lambda: vmap_program(prog, bflags, n)))
    basis = api.constant(np.eye(n, dtype=like.dtype).reshape((n,) + like.shape))
    return apply_program(jitted, entry, (mode,), batched, operands + [basis], rg)


def _forward_columns(jitted, entry, in_vars, flags, x, rg):
    jp = jvp_of(jitted, entry, flags)
    outs = _over_basis(jitted, entry, flags, "jacfwd", jp, len(entry.program.inputs), x, in_vars, rg)
    t = outs[1].ir_var                                  # (n, *out)
    out_shape = t.shape[1:]
    m = int(np.prod(out_shape, dtype=np.int64))
    return api.reshape(api.transpose(api.reshape(t, (x.size, m))), out_shape + x.shape), rg


def _reverse_rows(jitted, entry, in_vars, flags, x, rg):
    known, _, transposed, out_u, n_res = vjp_parts(jitted, entry, flags)
    known_out = apply_program(jitted, entry, ("known",), known, in_vars, rg)
    residuals = [r.ir_var for r in known_out[len(known.outputs) - n_res:]]
    out = entry.program.outputs[0]
    if not out_u[1]:                                     # the output does not depend on x
        return api.zeros(out.shape + x.shape, x.dtype), False
    res = _over_basis(jitted, entry, flags, "jacrev", transposed, n_res, out, residuals, rg)
    return api.reshape(res[0].ir_var, out.shape + x.shape), rg


def hessian(fn, argnums=0, has_aux=False):
    """Second derivatives of a scalar function: ``jacfwd(jacrev(f))``, pytrees and ``has_aux`` as
    in ``jacfwd``.

    >>> vkml.hessian(lambda x: vkml.sum(x ** 3))(np.array([1.0, 2.0]))
    tensor([[ 6.,  0.],
            [ 0., 12.]], dtype=float64)
    """
    check_function(fn, "hessian")
    check_argnums(argnums, "hessian")
    has_aux = check_bool(has_aux, "has_aux", "hessian")
    return jacfwd(jacrev(fn, argnums, has_aux), argnums, has_aux)


def hvp(fn, primals, tangents):
    """Hessian-vector product by forward-over-reverse: ``jvp(grad(f), primals, tangents)``.

    >>> vkml.hvp(lambda x: vkml.sum(x ** 3), (np.array([1.0, 2.0]),), (np.array([1.0, 0.0]),))
    tensor([6., 0.], dtype=float64)
    """
    check_function(fn, "hvp")
    primals = check_sequence(primals, "primals", "hvp")
    tangents = check_sequence(tangents, "tangents", "hvp")
    return jvp(grad(fn), primals, tangents)[1]


def jacfwd(fn, argnums=0, has_aux=False):
    """The Jacobian by forward mode: the derivative program mapped over a basis of tangents.

    Arguments and results may be pytrees: the result has the output's
    structure with, at each leaf, the structure of the differentiated
    argument (a tuple of them when ``argnums`` is a tuple), each block of
    shape output-leaf shape + input-leaf shape.  ``has_aux``: ``fn`` returns
    ``(out, aux)`` and the call returns ``(jacobian, aux)``.

    >>> vkml.jacfwd(lambda x: x * x)(np.array([1.0, 2.0]))
    tensor([[2., 0.],
            [0., 4.]], dtype=float64)
    """
    return _pytree_jacobian(fn, argnums, has_aux, "jacfwd")


def jacrev(fn, argnums=0, has_aux=False):
    """The Jacobian by reverse mode: the transposed program mapped over a basis of cotangents.
    Pytrees, shapes and ``has_aux`` as in :func:`jacfwd`.

    >>> vkml.jacrev(lambda x: vkml.stack([x[0] * x[1], x[0]]))(np.array([2.0, 3.0]))
    tensor([[3., 2.],
            [1., 0.]], dtype=float64)
    """
    return _pytree_jacobian(fn, argnums, has_aux, "jacrev")


def _pytree_jacobian(fn, argnums, has_aux, where):
    """A Jacobian of pytrees through the one-array form: the differentiated leaves are raveled into
    one vector and the output leaves into another, and the matrix between them is cut into blocks."""
    check_function(fn, where)
    check_argnums(argnums, where)
    has_aux = check_bool(has_aux, "has_aux", where)
    jitted = jit(fn)
    flat_fns = {}
    with_keywords = []          # the Jacobian of fn's keyword caller, made on the first keyword call

    @boundary
    def jac(*args, **kwargs):
        if kwargs:              # keyword arguments go to fn undifferentiated, as in JAX
            if not with_keywords:
                fixed = argnums if is_int(argnums) else tuple(argnums)
                with_keywords.append(_pytree_jacobian(keyword_caller(fn), fixed, has_aux, where))
            checked_argnums(argnums, len(args), where)
            return with_keywords[0](*args, kwargs)
        nums = checked_argnums(argnums, len(args), where)
        wrt = tuple(args[i] for i in nums)
        in_leaves, in_tree = flatten(wrt)
        in_vars = [leaf_var(x, where) for x in in_leaves]
        for i, v in enumerate(in_vars):
            float_check(v, where, i)
        entry, _, _ = jitted._lookup(args)
        main_tree, aux = _main_and_aux(jitted, entry, args, has_aux, where)
        main_vars = entry.program.outputs[:main_tree.num_leaves]
        for i, v in enumerate(main_vars):
            if v.dtype.kind != "f":
                raise GradError(f"{where}: result leaf {i} is {dtype_name(v.dtype)}; only floating "
                                "results have a Jacobian (cast it inside the function)")
        if not has_aux and is_int(argnums) and in_tree.children[0].kind == "leaf" and \
                main_tree.kind == "leaf":
            return _array_jacobian(fn, argnums, where)(*args)
        dtype = np.result_type(*[v.dtype for v in in_vars + list(main_vars)])
        key = (nums, len(args), in_tree, tuple((v.shape, v.dtype) for v in in_vars), dtype)
        flat_fn = flat_fns.get(key)
        if flat_fn is None:
            flat_fn = flat_fns[key] = _raveled(fn, nums, len(args), in_tree, in_vars, has_aux, dtype)
        flat_x = _ravel([x if isinstance(x, Tensor) else Tensor(v) for x, v in zip(in_leaves, in_vars)],
                        dtype)
        rest = [a for i, a in enumerate(args) if i not in nums]
        matrix = _array_jacobian(flat_fn, 0, where)(flat_x, *rest)
        blocks = _blocks(matrix, main_vars, in_vars, in_tree, is_int(argnums))
        result = unflatten(main_tree, blocks)
        return (result, aux) if has_aux else result

    jac.__name__ = f"{where}_of_{getattr(fn, '__name__', 'f')}"
    return jac


def _main_and_aux(jitted, entry, args, has_aux, where):
    """The treedef of the differentiated result, and the aux value when ``has_aux``."""
    if not has_aux:
        return entry.out_tree, None
    tree = entry.out_tree
    if tree.kind != "tuple" or len(tree.children) != 2:
        raise ArgumentError(f"{where}(has_aux=True): the function must return a pair (out, aux), "
                            f"got {tree}")
    return tree.children[0], jitted(*args)[1]


def _ravel(leaves, dtype):
    return concatenate([reshape(cast(x, dtype), (-1,)) for x in leaves])


def _raveled(fn, nums, nargs, in_tree, in_vars, has_aux, dtype):
    """``fn`` as a function of one vector (the differentiated leaves, raveled) and the other
    arguments, returning its (main) result leaves raveled into one vector."""
    specs = [(v.shape, v.dtype, v.size) for v in in_vars]

    def flat_fn(flat, *rest):
        pieces, start = [], 0
        for shape, leaf_dtype, size in specs:
            pieces.append(cast(reshape(flat[start:start + size], shape), leaf_dtype))
            start += size
        full, others = [None] * nargs, iter(rest)
        for i, w in zip(nums, unflatten(in_tree, pieces)):
            full[i] = w
        full = [next(others) if i not in nums else full[i] for i in range(nargs)]
        out = fn(*full)
        return _ravel(flatten(out[0] if has_aux else out)[0], dtype)

    flat_fn.__name__ = getattr(fn, "__name__", "f")
    return flat_fn


def _blocks(matrix, out_vars, in_vars, in_tree, one_argnum):
    """Cut the (outputs x inputs) matrix into one block per (output leaf, input leaf)."""
    blocks, row = [], 0
    for o in out_vars:
        col, per_input = 0, []
        for x in in_vars:
            block = matrix[row:row + o.size, col:col + x.size]
            per_input.append(cast(reshape(block, o.shape + x.shape), o.dtype))
            col += x.size
        wrt = unflatten(in_tree, per_input)
        blocks.append(wrt[0] if one_argnum else wrt)
        row += o.size
    return blocks
