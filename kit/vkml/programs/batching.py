"""``vmap``: a Python function run on a batch, with ``in_axes``/``out_axes`` as pytrees."""

from __future__ import annotations

from ..errors import ArgumentError, ShapeError, boundary
from ..ir import Var, format_shape
from ..ops import api
from ..pytree import broadcast_prefix, flatten, unflatten
from ..tensor import Tensor, needs_grad
from ..transforms import vmap_program
from ..transforms.ad import derived
from ..transforms.control import depends_on
from .jitted import apply_program, jit
from .arguments import keyword_caller, leaf_var
from .checks import check_function, is_int


def move_axis(var, src, dst):
    if src == dst:
        return var
    perm = [i for i in range(var.ndim) if i != src]
    perm.insert(dst, src)
    return api.transpose(var, perm)


def vmap(fn, in_axes=0, out_axes=0):
    """``fn`` written for one example, mapped over an axis of its arguments.

    ``in_axes``: one int/None for all arguments or a tuple/list with one
    entry per argument (None = not mapped, broadcast to every example); an
    entry may be a pytree matching its argument (``{"w": None, "b": 0}``),
    and a dict or other container alone stands for the one argument.
    ``out_axes``: where the mapped axis goes in the results, one int for all
    or a pytree matching the result; None for a result that does not depend
    on a mapped argument (it is returned once, not per example).  The program
    for one example is traced once per key and its batched form derived once
    per batch size.

    >>> vkml.vmap(lambda row: vkml.sum(row * row))(np.array([[1.0, 2.0], [3.0, 4.0]]))
    tensor([ 5., 25.], dtype=float64)
    >>> vkml.vmap(lambda x, w: x * w, in_axes=(0, None))(np.array([1.0, 2.0]), 10.0)
    tensor([10., 20.], dtype=float64)
    """
    check_function(fn, "vmap")
    jitted = jit(fn)
    with_keywords = {}          # number of positional arguments -> the map of fn's keyword caller

    @boundary
    def batched(*args, **kwargs):
        if kwargs:              # keyword arguments are mapped over their axis 0, as in JAX
            mapped = with_keywords.get(len(args))
            if mapped is None:
                axes = tuple(in_axes) if isinstance(in_axes, (tuple, list)) else \
                    (in_axes,) * len(args) if _is_axis(in_axes) or len(args) != 1 else (in_axes,)
                mapped = with_keywords[len(args)] = vmap(keyword_caller(fn), axes + (0,), out_axes)
            return mapped(*args, kwargs)
        flags, example, in_vars, sizes = [], [], [], set()
        for a, leaf_axes in zip(args, _in_axes_per_leaf(in_axes, args)):
            leaves, tree = flatten(a)
            ex = []
            for x, ax in zip(leaves, leaf_axes):
                v = leaf_var(x, "vmap")
                if ax is None:
                    flags.append(False)
                    in_vars.append(v)
                    ex.append(x)
                    continue
                if not -v.ndim <= ax < max(v.ndim, 1) or v.ndim == 0:
                    raise ShapeError(f"vmap: in_axes {ax} is out of range for an argument of shape "
                                     f"{format_shape(v.shape)}")
                ax2 = ax % v.ndim
                sizes.add(v.shape[ax2])
                flags.append(True)
                moved = move_axis(v, ax2, 0)
                in_vars.append(moved)
                ex.append(Tensor(Var(moved.shape[1:], v.dtype, v.device)))
            example.append(unflatten(tree, ex))
        if len(sizes) != 1:
            raise ShapeError(f"vmap: mapped axes must all have one size, got {sorted(sizes) or 'none'}")
        size = sizes.pop()
        entry, _, _ = jitted._lookup(tuple(example))
        in_vars += entry.captures                     # values of enclosing traces: not mapped
        flags += [False] * len(entry.captures)
        prog = entry.program
        bprog = jitted._derive(entry, ("vmap", tuple(flags), size), lambda: derived(
            "vmap", prog, flags + [size], lambda: vmap_program(prog, flags, size)))
        rg = needs_grad(flatten(args)[0])
        outs = apply_program(jitted, entry, ("vmap", size), bprog, in_vars, rg)
        axes_out = _out_axes(out_axes, entry.out_tree, outs)
        outs = _unbatched_where_asked(outs, axes_out, depends_on(prog, flags))
        outs = [o if ax in (0, None) else wrap_like(o, move_axis(o.ir_var, 0, ax))
                for o, ax in zip(outs, axes_out)]
        return unflatten(entry.out_tree, outs)

    return batched


def _out_axes(out_axes, out_tree, outs):
    """One output axis per result leaf: ``out_axes`` is one int for all, or one per entry of the
    function's tuple result (each entry's leaves alike)."""
    if isinstance(out_axes, (tuple, list)):
        top = unflatten(out_tree, outs)
        if not isinstance(top, (tuple, list)) or len(top) != len(out_axes):
            n = len(top) if isinstance(top, (tuple, list)) else "a single result"
            raise ArgumentError(f"vmap: out_axes has {len(out_axes)} entries but the function "
                                f"returns {n}; give one int for all, or one per result")
        per_leaf = [leaf for sub, ax in zip(top, out_axes)
                    for leaf in broadcast_prefix(ax, sub, _is_axis, "vmap out_axes")]
    else:
        per_leaf = broadcast_prefix(out_axes, unflatten(out_tree, outs), _is_axis, "vmap out_axes")
    axes = []
    for o, ax in zip(outs, per_leaf):
        if ax is None:
            axes.append(None)
            continue
        if not isinstance(ax, int) or isinstance(ax, bool) or not -o.ndim <= ax < o.ndim:
            raise ShapeError(f"vmap: out_axes {ax!r} is out of range for a result of shape "
                             f"{format_shape(o.shape)} (batch axis included): give an axis in "
                             f"[{-o.ndim}, {o.ndim}), e.g. 0 to put the batch first, or None "
                             "for a result that does not depend on the batch")
        axes.append(ax % o.ndim)
    return axes


def wrap_like(t, var):
    return Tensor(var, t.requires_grad)


def single_leaf(arg, where):
    leaves, _ = flatten(arg)
    if len(leaves) != 1:
        raise ArgumentError(f"{where}: the differentiated argument must be one array, "
                            f"got a pytree of {len(leaves)} leaves")


def _is_axis(x) -> bool:
    """A leaf of an ``in_axes``/``out_axes`` tree: None, or anything that is not a container."""
    return x is None or not isinstance(x, (tuple, list, dict)) and flatten(x)[1].kind == "leaf"


def _in_axes_per_leaf(in_axes, args):
    """For each argument, the mapped axis (or None) of each of its leaves."""
    if isinstance(in_axes, (tuple, list)):
        if len(in_axes) != len(args):
            raise ArgumentError(f"vmap: in_axes has {len(in_axes)} entries for {len(args)} arguments; "
                                "give one entry per positional argument, or one int/None for all")
        per_arg = list(in_axes)
    elif _is_axis(in_axes):
        per_arg = [in_axes] * len(args)
    elif len(args) == 1:
        per_arg = [in_axes]
    else:
        raise ArgumentError(f"vmap: in_axes {in_axes!r} is one argument's tree but the call has "
                            f"{len(args)} arguments; give a tuple with one entry per argument")
    out = []
    for a, ax in zip(args, per_arg):
        axes = broadcast_prefix(ax, a, _is_axis, "vmap in_axes")
        for x in axes:
            if x is not None and not is_int(x):
                raise ArgumentError(f"vmap: in_axes entries must be ints (the mapped axis) or None "
                                    f"(not mapped), got {x!r}")
        out.append(axes)
    return out


def _unbatched_where_asked(outs, axes, batched):
    """Results with out_axes None: one copy (row 0 of the broadcast), refused if they vary per example."""
    result = []
    for i, (o, ax, b) in enumerate(zip(outs, axes, batched)):
        if ax is None:
            if b:
                raise ArgumentError(f"vmap: out_axes None for result leaf {i}, but it depends on a "
                                    "mapped argument, so it differs per example; give it an int "
                                    "out_axes (0 puts the examples first)")
            o = wrap_like(o, api.getitem(o.ir_var, 0))
        result.append(o)
    return result
