"""Pictures of real-sized programs: one box per part of what the user wrote, at the level that fits.

Why: a box per equation is the clearest picture of a function of ten equations, and unreadable
at the size of a training step (an MLP's gradient is 13,000 points tall, its text scaled to 8 px).
People read programs by what they wrote: the layers of their model, the functions they called,
the lines they typed.  Every equation carries that (its ``scope``: the module being called; its
``where``: the user's function and line), and a derived equation (jvp, linear, transposed)
carries the primal equation it comes from (``origin``), so the backward pass of a layer groups
exactly as its forward does.

The levels, outermost first, of an equation's *path*:

1. the modules it was made in (``0: Linear(64 -> 32)``), outermost first;
2. the user function it was made in, when that is not the traced function itself
   (``pendulum()``: a helper called from the step);
3. its source line (``line 3: h = vkml.tanh(x @ p['W1'] + p['b1'])``).

A picture at depth ``d`` draws one box per run of consecutive equations whose paths agree on
their first ``d`` levels (after the levels every equation shares): four calls of one helper are
four boxes, as they are four calls.  Each box says what it is, how many equations it holds (a
``scan`` with its step count), and what it hands on; edges carry the named values between boxes.
:func:`fitting` picks the deepest picture whose drawing fits :data:`BUDGET_PT` at full size --
by structure, never by shrinking the text -- and ``depth=``/``unfold=True`` choose by hand.
"""

from __future__ import annotations

import numpy as np

from .ir import Eqn, Program, site_text
from .printer import root_of, source_line
from .viz_dot import FILL, type_text

#: The most a default picture may measure, in points (1,200 x 2,400 px at 96 px an inch): a
#: notebook cell's width, two screens tall.  At full size graphviz's 10 pt labels are 13 px.
BUDGET_PT = (900.0, 1800.0)

#: Box fills by the kind of group (the same family of colours the equation pictures use).
GROUP_FILL = {"scope": "#e0f2fe", "fn": "#ede9fe", "line": "#fef9c3", "none": "#f3f4f6"}


def _short(text, limit=56) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def equation_path(e, top_code) -> list:
    """The levels of equation ``e`` (see the module docstring) as ``(key, kind, label)``; the
    levels of the primal equation a derived one comes from.  ``top_code``: the traced function's
    code (its lines are not a helper's)."""
    root, _ = root_of(e)
    out = []
    scope = getattr(root, "scope", None)
    if scope is not None:
        for s in scope.chain():
            label = s.label if s.parent is None else f"{s.path()}: {s.label}"
            out.append((("scope", id(s)), "scope", label))
    where = root.where
    if isinstance(where, tuple):
        code, line = where
        if code is not top_code and code.co_name not in ("<module>", "<lambda>") and \
                top_code is not None:
            out.append((("fn", id(code)), "fn", f"{code.co_name}()"))
        text = source_line(where)
        out.append((("line", id(code), line), "line",
                    f"line {line}" + (f": {_short(text)}" if text else "")))
    return out


def common_levels(paths) -> int:
    """How many leading levels every (non-empty) path shares: those draw no box of their own."""
    paths = [p for p in paths if p]
    if not paths:
        return 0
    n = min(len(p) for p in paths)
    k = 0
    while k < n and all(p[k][0] == paths[0][k][0] for p in paths):
        k += 1
    return k


def max_depth(paths, shared) -> int:
    return max((len(p) - shared for p in paths if p), default=0)


class Group:
    """A run of equations drawn as one box: their shared levels (``levels``, ``(key, kind,
    label)``), the equations, and the roles of the derived ones among them."""

    __slots__ = ("levels", "eqns", "roles")

    def __init__(self, levels):
        self.levels, self.eqns, self.roles = levels, [], set()

    @property
    def key(self):
        return tuple(k for k, _, _ in self.levels)

    @property
    def kind(self) -> str:
        return self.levels[-1][1] if self.levels else "none"

    def title(self) -> str:
        label = self.levels[-1][2] if self.levels else "(no source line)"
        roles = self.roles - {"primal"}
        if roles and "primal" not in self.roles:
            word = "backward" if roles & {"cotangent", "transposed"} else "tangent"
            return f"{word} of {label}"
        if roles:
            return f"{label} (and its tangent)"
        return label


def groups_at(eqns, paths, shared, depth) -> list:
    """The runs of equations at ``depth`` levels below the ``shared`` ones (see the module
    docstring).  An equation without a path (a constant's broadcast) joins its neighbour's run."""
    out = []
    cut = shared + depth
    last = None
    for e, path in zip(eqns, paths):
        levels = path[:cut] if path else last
        if levels is None:                      # (nothing before it has a path: the next one's)
            levels = next((p[:cut] for p in paths if p), [])
        last = levels
        key = tuple(k for k, _, _ in levels)
        if not out or out[-1].key != key:
            out.append(Group(levels))
        out[-1].eqns.append(e)
        out[-1].roles.add(root_of(e)[1])
    return out


def count_equations(eqns) -> int:
    """Equations, nested programs' counted too (what a box of them says it holds)."""
    return sum(1 + sum(count_equations(p.eqns) for p in e.params.values()
                       if isinstance(p, Program)) for e in eqns)


def fits(size) -> bool:
    return size is not None and size[0] <= BUDGET_PT[0] and size[1] <= BUDGET_PT[1]


def draw_groups(d, prog, names, scope, groups, colour_of_group, value_fill=None, title_of=None,
                input_note=None, hide=()):
    """Draw ``prog`` as ``groups`` (from :func:`groups_at`) into ``d`` (a ``viz_dot.Dot``) under
    node names prefixed by ``scope``: its inputs (ellipses named by ``names``), one box per group,
    its outputs, and the values between them (an edge per pair of boxes, labelled with the named
    values it carries).  Inputs in ``hide`` (a lazy graph's scalar constants) are not drawn.
    Returns the first node drawn."""
    value_fill = value_fill or {}
    made_by = {}
    first = None
    for role, title in (("saved", "kept from the forward pass"), ("tangent", "tangents in")):
        kept = [v for v in prog.inputs if value_fill.get(v) == role]
        if kept:    # the values kept from the forward pass, the tangents: one node, not one each
            node = f"{scope}{role}"
            d.node(node, f"{title}\n{len(kept)} value{'s' * (len(kept) != 1)}, "
                   f"{_total_bytes(kept):,} B",
                   shape="ellipse", fillcolor=FILL["saved" if role == "saved" else "input"],
                   **({"peripheries": "2", "color": "#be123c"} if role == "saved" else {}))
            made_by.update((v, node) for v in kept)
            first = first or node
    for i, v in enumerate(prog.inputs):
        if v in made_by or v in hide:
            continue
        node = f"{scope}in{i}"
        note = (input_note or {}).get(v)
        d.node(node, f"{names.get(v, f'in {i}')}\n{type_text(v)}" + (f"\n{note}" if note else ""),
               shape="ellipse", fillcolor=FILL[value_fill.get(v, "input")])
        made_by[v] = node
        first = first or node
    consts = {v for v, _ in prog.consts}
    edges = {}
    for g_index, g in enumerate(groups):
        node = f"{scope}g{g_index}"
        inside = {o for e in g.eqns for o in e.outputs}
        reads = [v for e in g.eqns for v in e.inputs if v not in inside and v not in consts]
        count = count_equations(g.eqns)
        loops = [e for e in g.eqns if e.prim.name in ("scan", "while")]
        what = f"{count} equation{'s' * (count != 1)}"
        if loops:
            e = loops[0]
            what += f", a scan of {e.params['length']} steps" if e.prim.name == "scan" else \
                ", a while loop"
        outs = [o for e in g.eqns for o in e.outputs if _read_outside(o, prog, inside)]
        shown = ", ".join(type_text(o) for o in outs[:2]) + (f" +{len(outs) - 2}" if len(outs) > 2 else "")
        label = f"{(title_of or Group.title)(g)}\n{what}" + (f"\n→ {shown}" if shown else "")
        tip = _tooltip(g)
        colour = colour_of_group(g)
        attrs = {"tooltip": tip} if tip else {}
        if colour:
            attrs.update(color=colour, penwidth="2.5")
        d.node(node, label, shape="box", style="rounded,filled", fillcolor=GROUP_FILL[g.kind],
               **attrs)
        first = first or node
        for v in reads:
            src = made_by.get(v)
            if src is None:
                continue
            edges.setdefault((src, node), []).append(v)
        for o in inside:
            made_by[o] = node
    for (src, dst), carried in edges.items():
        named = []
        for v in carried:
            n = names.get(v)
            if n and not n.startswith("%") and n not in named and not src.startswith(f"{scope}in"):
                named.append(n)
        d.edge(src, dst, **({"label": _short(", ".join(named), 24)} if named else {}))
    saved_out = [v for v in prog.outputs if value_fill.get(v) == "saved"]
    if saved_out:           # what the forward keeps for the backward: one node, not one each
        node = f"{scope}saved"
        d.node(node, f"kept for the backward\n{len(saved_out)} value"
               f"{'s' * (len(saved_out) != 1)}, {_total_bytes(saved_out):,} B", shape="ellipse",
               fillcolor=FILL["saved"], peripheries="2", color="#be123c")
        for src in dict.fromkeys(made_by[v] for v in saved_out if v in made_by):
            d.edge(src, node)
    for i, v in enumerate(prog.outputs):
        if v in saved_out:
            continue
        node = f"{scope}out{i}"
        d.node(node, f"{_out_name(names, v, i)}\n{type_text(v)}", shape="ellipse",
               fillcolor=FILL["output"])
        if v in made_by:
            d.edge(made_by[v], node)
    return first


def _total_bytes(vars_) -> int:
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in vars_)


def _out_name(names, v, i) -> str:
    """``out 0``, or ``loss (out 0)`` where the user named the value."""
    name = names.get(v)
    return f"{name} (out {i})" if name and not name.startswith("%") else f"out {i}"


def _read_outside(v, prog, inside) -> bool:
    if v in prog.outputs:
        return True
    return any(v in e.inputs for e in prog.eqns if not any(o in inside for o in e.outputs))


def _tooltip(g) -> str | None:
    """The lines of the user's code a box stands for, where each is (``file.py:12: text``)."""
    seen, lines = set(), []
    for e in g.eqns:
        root, _ = root_of(e)
        where = root.where
        if isinstance(where, tuple) and where not in seen:
            seen.add(where)
            text = source_line(where)
            lines.append(site_text(where) + (f": {text}" if text else ""))
        if len(lines) >= 6:
            lines.append("…")
            break
    return "\n".join(lines) or None


def flattened(prog):
    """``prog`` with every ``call`` replaced by the equations of the program it calls (what a
    ``vkml.grad(f)`` program is: calls of ``f``'s programs), for a picture of what the user
    wrote; the same Vars, equations that keep their lines, scopes and origins.  The traced
    function's names and code come from the first call that has them."""
    if not any(e.prim.name == "call" for e in prog.eqns):
        return prog
    eqns, consts = [], list(prog.consts)
    found = {"arg_names": None, "fn_code": None}

    def emit(p, args):
        env = dict(zip(p.inputs, args))
        for e in p.eqns:
            ins = tuple(env.get(v, v) for v in e.inputs)
            inner = e.params.get("program") if e.prim.name == "call" else None
            if isinstance(inner, Program):
                consts.extend(inner.consts)
                if found["fn_code"] is None and getattr(inner, "fn_code", None) is not None:
                    found["fn_code"] = inner.fn_code
                    found["arg_names"] = getattr(inner, "arg_names", None)
                env.update(zip(e.outputs, emit(inner, list(ins))))
                continue
            copy = Eqn(e.prim, ins, e.outputs, e.params, e.where, e.scope)
            copy.origin = e.origin
            eqns.append(copy)
        return [env.get(v, v) for v in p.outputs]

    outs = emit(prog, list(prog.inputs))
    flat = Program(prog.inputs, eqns, outs, consts)
    flat.fn_code = found["fn_code"]
    # (the called program's names first: a grad(f) wrapper's own are only args[0], args[1]...)
    names = [n for n in (found["arg_names"], getattr(prog, "arg_names", None))
             if n is not None and len(n) == len(prog.inputs)]
    flat.arg_names = names[0] if names else None
    return flat


def calls_summary(eqns, most=4) -> str:
    """``pendulum() x4, rk4() x4``: the user functions ``eqns`` were made in, a call being a run
    of consecutive equations from one function -- what a folded loop step says it holds."""
    calls, last = {}, None
    for e in eqns:
        where = root_of(e)[0].where
        code = where[0] if isinstance(where, tuple) else None
        if code is not None and code is not last and code.co_name not in ("<module>", "<lambda>"):
            calls[code.co_name] = calls.get(code.co_name, 0) + 1
        last = code
    shown = [f"{name}()" + (f" x{n}" if n > 1 else "") for name, n in list(calls.items())[:most]]
    return ", ".join(shown) + (", ..." if len(calls) > most else "")
