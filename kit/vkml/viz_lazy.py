"""``tensor_dot``: the pending lazy graph behind tensors, drawn without realizing anything."""

from __future__ import annotations

from .errors import ArgumentError
from .ir import Program, collect
from .pytree import flatten
from .runtime import grad_leaf
from .tensor import Tensor
from .viz_dot import params_text, type_text
from .viz_groups import common_levels, draw_groups, equation_path, groups_at
from .viz_render import Diagram, LEGEND, LEGEND_BOXES, LEGEND_LAZY, names_of
from .viz_programs import Marks, draw_program, every_equation, fitted, group_colours
from .viz_residuals import nbytes


def _tensor_vars(tensors):
    leaves, _ = flatten(tensors)
    out = []
    for t in leaves:
        if not isinstance(t, Tensor):
            raise ArgumentError(f"tensor_dot: expected Tensors (or a list/tuple/dict of them), got "
                                f"{type(t).__name__}")
        if t.ir_var not in out:
            out.append(t.ir_var)
    if not out:
        raise ArgumentError("tensor_dot: no tensors given")
    return out


def _requires_grad(var) -> bool:
    t = grad_leaf(var)
    return t is not None and t.requires_grad and t.ir_var is var


def _lazy_graph(tensors):
    """The lazy graph behind ``tensors``: roots, leaves, equations and a number for each Var.

    The walk stops at values that already hold an array (what ``realize``
    would read); nothing is computed.
    """
    roots = _tensor_vars(tensors)
    leaves, eqns = collect(roots)
    numbers = {}
    for v in leaves:
        numbers.setdefault(v, len(numbers))
    for e in eqns:
        for v in e.outputs:
            numbers.setdefault(v, len(numbers))
    return roots, leaves, eqns, numbers


def _leaf_note(v) -> str:
    notes = ["realized" if v.value is not None else "traced placeholder"]
    if _requires_grad(v):
        notes.append("requires grad")
    if v.value is not None and v.eqn is not None:   # a realized value a backward will read
        notes.append(f"kept for backward, {nbytes(v):,} B")
    return ", ".join(notes)


def tensor_dot(tensors) -> Diagram:
    """The pending lazy graph behind a Tensor (or a list/tuple/dict of them), without realizing it.

    Leaves are ellipses: green when their value is already realized, orange
    when they require grad (their ``.grad`` receives a gradient), grey for a
    traced placeholder.  Each pending op is a box with its output's dtype and
    shape; the tensors asked for have a double border.  A realized tensor is
    a single green leaf.

    >>> x = vkml.tensor([1.0, 2.0], requires_grad=True)
    >>> print(vkml.viz.tensor_dot(vkml.exp(x) + 1).text)
    lazy graph of 1 tensor: 3 ops pending, not realized
      %0 : float64 [2] leaf (realized, requires grad)
      %1 : float64 [] leaf (realized)
      %2 : float64 [2] = exp(%0)
      %3 : float64 [2] = broadcast_in_dim[shape=(2,), dims=()](%1)
      %4 : float64 [2] = add(%2, %3)
      result %4
    """
    roots, leaves, eqns, numbers = _lazy_graph(tensors)
    text = _lazy_text(roots, leaves, eqns, numbers)
    prog = Program(leaves, eqns, roots)
    names = names_of(prog)
    names.update((v, name) for v, name in _parameter_names(leaves, eqns).items())
    fill = {v: "grad" if _requires_grad(v) else "realized" if v.value is not None
            else "placeholder" for v in leaves}
    paths = [equation_path(e, None) for e in eqns]
    shared = common_levels(paths)
    colour = group_colours(paths, shared)
    constants = {v for v in leaves if v.shape == () and fill[v] == "realized"}

    def draw(level, d):
        if level == "all":
            marks = Marks(value_fill={v: f for v, f in fill.items() if f != "realized"})
            return draw_program(d, prog, names, "t_", marks)
        return draw_groups(d, prog, names, "t_", groups_at(eqns, paths, shared, level), colour,
                           fill, hide=constants)

    level, d = fitted(prog, paths, draw, None, False)
    picture = Diagram("lazy graph", d.source(), text, d.nodes,
                      (LEGEND if level != "all" else LEGEND_BOXES) + LEGEND_LAZY)
    picture.detail = every_equation(level, draw, text)
    return picture


def _parameter_names(leaves, eqns) -> dict:
    """Leaf -> ``0.weight``: a model's parameter named by its module's path and attribute, found
    from the module each equation reading it was made in (``Eqn.scope``)."""
    out = {}
    for e in eqns:
        owner = getattr(e.scope, "owner", None)       # (a weak reference to the module)
        owner = owner() if owner is not None else None
        if owner is None:
            continue
        for v in e.inputs:
            if v in out or v.eqn is not None:
                continue
            t = grad_leaf(v)
            for attr, value in vars(owner).items():
                if value is t and t is not None:
                    path = e.scope.path() if e.scope.parent is not None else ""
                    out[v] = f"{path}.{attr}" if path else attr
    return out


def _lazy_text(roots, leaves, eqns, numbers) -> str:
    def ref(v):
        return f"%{numbers[v]}"

    head = (f"lazy graph of {len(roots)} tensor{'s' * (len(roots) != 1)}: "
            f"{len(eqns)} op{'s' * (len(eqns) != 1)} pending")
    lines = [head + (" (nothing to compute)" if not eqns else ", not realized")]
    for v in leaves:
        lines.append(f"  {ref(v)} : {type_text(v)} leaf ({_leaf_note(v)})")
    for e in eqns:
        params = params_text(e.params)
        lhs = ", ".join(f"{ref(o)} : {type_text(o)}" for o in e.outputs)
        lines.append(f"  {lhs} = {e.prim.name}" + (f"[{params}]" if params else "")
                     + f"({', '.join(ref(v) for v in e.inputs)})")
    lines.append("  result " + ", ".join(ref(v) for v in roots))
    return "\n".join(lines)
