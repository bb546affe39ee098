"""Pictures of Programs: ``program_dot`` (equations, fused nodes, nested steps folded, big
programs drawn by the user's code structure) and ``derived_dot`` (a jitted function's derived
programs, one panel each)."""

from __future__ import annotations

import os
import re

import numpy as np

from .errors import ArgumentError
from .validate import check_bool
from .ir import Program, dtype_name
from .printer import fused_view, literal, pp_program, root_of, site_title
from .viz_dot import FILL, PALETTE, Dot, html_label, params_text, short, type_text
from .viz_groups import (BUDGET_PT, calls_summary, common_levels, draw_groups, equation_path, fits,
                         flattened, groups_at, max_depth)
from .viz_render import (Diagram, FOLD_BOXES, LEGEND, LEGEND_BOXES, SVG_STYLE, detail_html,
    dot_available, legend_html, names_of, parameter_names, tabs_html)
from .viz_residuals import Residuals, residual_rows


def _scan_roles(eqn):
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    return ["capture"] * nc + ["init"] * nk + ["xs"] * (len(eqn.inputs) - nc - nk)


class Marks:
    """How one picture marks its boxes and values beyond their kind.

    ``colour_of(eqn)``: the border colour matching a derived equation to the user's equation it
    comes from (None: plain); ``value_fill``: Var -> a fill naming its role (``"saved"`` for a
    residual); ``box_fill``: id(eqn) -> a fill (``"added"``, ``"removed"``, ``"changed"`` in a
    diff); ``unfold``: draw every nested program whole; ``fused=False``: one box per equation
    (nothing fused into a Map); ``box_class(eqn)``: an SVG class for a box (None: none).
    """

    def __init__(self, colour_of=None, value_fill=None, box_fill=None, value_note=None,
                 unfold=False, fused=True, box_class=None):
        self.colour_of = colour_of or (lambda e: None)
        self.value_fill = value_fill or {}
        self.value_note = value_note or {}
        self.box_fill = box_fill or {}
        self.unfold = unfold
        self.fused = fused
        self.box_class = box_class or (lambda e: None)


def _folded_text(prog, kind, eqn) -> str:
    """What a folded nested program says: its size, and a scan's step count."""
    count = _count_eqns(prog)
    steps = f"{eqn.params['length']} steps of " if kind == "scan" else ""
    made = calls_summary(prog.eqns)
    return (f"{steps}{count} equation{'s' * (count != 1)} (folded: "
            "vkml.viz.program_dot(prog, unfold=True) shows them)" + (f"\n{made}" if made else ""))


def _count_eqns(prog) -> int:
    return sum(1 + sum(_count_eqns(p) for p in e.params.values() if isinstance(p, Program))
               for e in prog.eqns)


def draw_program(d: Dot, prog: Program, names: dict, scope: str, marks=None):
    """Draw ``prog``'s values and boxes with node names under ``scope``; returns its first node."""
    return _ProgramDrawing(d, prog, names, scope, marks or Marks()).draw()


class _ProgramDrawing:
    """One program drawn into a picture: its values (ellipses), constants (notes), equation boxes
    (a nested program as a cluster, or folded), and repeated runs of boxes folded into one."""

    def __init__(self, d: Dot, prog: Program, names: dict, scope: str, marks: Marks):
        self.d, self.prog, self.names, self.scope, self.marks = d, prog, names, scope, marks
        self.drawn = {}              # Var -> the node that shows it
        self.first = []              # nodes in drawing order (the first anchors a cluster edge)
        self.members = {}            # id(fused box) -> the equations fused into it
        self.fold_edges = set()
        self.out_roles = {}
        for i, v in enumerate(prog.outputs):
            self.out_roles[v] = self.out_roles.get(v, " out") + ("," if v in self.out_roles else "") \
                + f" {i}"

    def draw(self):
        for i, v in enumerate(self.prog.inputs):
            self.value_node(v, "input", f" in {i}")
        view = fused_view(self.prog, members=self.members) if self.marks.fused \
            else _plain_view(self.prog)
        consts, boxes = view
        self.constants(consts)
        folds = {} if self.marks.unfold else _repeats(boxes)
        folded = {}                  # box index -> the fold node standing for it
        for i, (e, kind, text, reads) in enumerate(boxes):
            if i in folds:
                period, times = folds[i]
                name = self.fold_node(i, period, times)
                folded.update((k, name) for k in range(i, i + period * times))
            if i in folded:
                self.into_fold(folded[i], e, reads)
            else:
                self.box(i, e, kind, text, reads)
        self.returned(consts)
        return self.first[0] if self.first else None

    def value_node(self, v, fill, role=""):
        marks = self.marks
        name = f"{self.scope}v{self.names[v].lstrip('%')}"
        self.drawn[v] = name
        note = marks.value_note.get(v)
        attrs = {"peripheries": "2", "color": "#be123c"} if v in marks.value_fill else {}
        title = site_title(v.eqn) if v.eqn is not None else None
        if title:
            attrs["tooltip"] = title
        self.d.node(name, f"{self.names[v]}{role}\n{type_text(v)}" + (f"\n{note}" if note else ""),
                    shape="ellipse", fillcolor=FILL[marks.value_fill.get(v, fill)], **attrs)
        self.first.append(name)
        return name

    def ref(self, v):
        if v not in self.drawn:  # a value from an enclosing program (a capture)
            self.value_node(v, "input", " (outer)")
        return self.drawn[v]

    def constants(self, consts):
        for v, value in consts:
            a = np.asarray(value)
            shown = literal(a) if a.ndim == 0 else f"const {dtype_name(a.dtype)} {list(a.shape)}"
            name = f"{self.scope}v{self.names[v].lstrip('%')}"
            self.drawn[v] = name
            self.d.node(name, f"{self.names[v]} = {shown}", shape="note", fillcolor=FILL["const"])
            self.first.append(name)

    def fold_node(self, i, period, times):
        """The box standing for ``times`` more repetitions of the ``period`` boxes above."""
        name = f"{self.scope}fold{i}"
        self.d.node(name, f"the {period} box{'es' * (period != 1)} above, {times} more "
                    f"time{'s' * (times != 1)}\n(folded: program_dot(prog, unfold=True))",
                    shape="box3d", fillcolor=FILL["folded"])
        self.first.append(name)
        return name

    def into_fold(self, name, e, reads):
        """An equation inside a folded repetition: its reads point at the fold, once each."""
        for v in reads:
            src = self.ref(v)
            if src != name and (src, name) not in self.fold_edges:
                self.fold_edges.add((src, name))
                self.d.edge(src, name, style="dashed")
        for o in e.outputs:
            self.drawn[o] = name

    def box(self, i, e, kind, text, reads):
        d, marks = self.d, self.marks
        box = f"{self.scope}e{i}"
        label = kind + (f"\n{short(text, 60)}" if text else "")
        attrs = {}
        title = site_title(e)
        if title:
            attrs["tooltip"] = title
        css_class = marks.box_class(e)
        if css_class:
            attrs["class"] = css_class
        colour = marks.colour_of(e)
        if colour:
            attrs.update(color=colour, penwidth="2.5")
            inner_colours = []
            for m in self.members.get(id(e), [e]):
                c = marks.colour_of(m)
                if c and c not in inner_colours:
                    inner_colours.append(c)
            if len(inner_colours) > 1:   # a fused box made of several user equations
                label = html_label(label, inner_colours)
        fill = marks.box_fill.get(id(e)) or kind
        d.node(box, label, shape="box", style="rounded,filled",
               fillcolor=FILL.get(fill, FILL["op"]), **attrs)
        self.first.append(box)
        if kind == "scan":
            roles = _scan_roles(e)
        else:
            roles = [f"x{j}" if kind == "Map" else "" for j in range(len(reads))]
        for j, v in enumerate(reads):
            attrs = {"label": roles[j]} if roles[j] and (kind == "scan" or len(reads) > 1) else {}
            d.edge(self.ref(v), box, **attrs)
        for o in e.outputs:
            fill = "output" if o in self.out_roles else "value"
            d.edge(box, self.value_node(o, fill, self.out_roles.get(o, "")))
        for k, p in e.params.items():
            if isinstance(p, Program):
                self.nested(box, i, e, kind, k, p)

    def nested(self, box, i, e, kind, k, p):
        """A program inside equation ``e`` (a scan's step, a cond's branch): a cluster, or one
        folded box when it is long."""
        d = self.d
        sub = f"{self.scope}e{i}{k}_"
        title = "step" if kind == "scan" else f"{e.prim.name} {k}"
        heading = f"{title} of {kind} {self.names[e.outputs[0]]}" if e.outputs else title
        if not self.marks.unfold and len(fused_view(p)[1]) > FOLD_BOXES:
            d.node(sub + "folded", f"{heading}\n{_folded_text(p, kind, e)}", shape="box3d",
                   fillcolor=FILL["folded"])
            d.edge(box, sub + "folded", style="dashed", label=title)
            return
        d.open(sub, heading, bgcolor="#faf5ff" if kind == "scan" else "#f9fafb")
        anchor = draw_program(d, p, self.names, sub, self.marks)
        d.close()
        if anchor is not None:
            d.edge(box, anchor, lhead="cluster_" + sub, style="dashed", label=title)

    def returned(self, consts):
        """An input or constant returned as it is gets its own ``out i`` marker."""
        prog = self.prog
        for i, v in enumerate(prog.outputs):
            if v not in self.drawn:
                continue
            if v in prog.inputs or any(v is c for c, _ in consts):
                self.d.node(f"{self.scope}out{i}", f"out {i}", shape="plaintext", style="")
                self.d.edge(self.drawn[v], f"{self.scope}out{i}")


def _plain_view(prog):
    """``fused_view``'s ``(consts, boxes)`` with nothing fused: one box per equation."""
    boxes = []
    for e in prog.eqns:
        scan = e.prim.name == "scan"
        text = f"{e.params['length']} rows" if scan else params_text(e.params)
        boxes.append((e, e.prim.name, text, list(e.inputs)))
    return list(prog.consts), boxes


#: A run of boxes repeated at least this many times in a row is drawn once and then folded.
FOLD_REPEATS = 3


def _repeats(boxes, longest=8):
    """``{start: (period, times)}``: where a block of ``period`` boxes computing the same thing
    (an unrolled Python loop) repeats; the first block is drawn, the next ``times`` folded."""
    sig = [(kind, text, tuple(v.type_str() for v in reads)) for _, kind, text, reads in boxes]
    out, i = {}, 0
    while i < len(sig):
        best = None
        for p in range(1, longest + 1):
            r = 1
            while sig[i + r * p:i + (r + 1) * p] == sig[i:i + p] and i + (r + 1) * p <= len(sig):
                r += 1
            if r >= FOLD_REPEATS and (best is None or p * r > best[0] * best[1]):
                best = (p, r)
        if best is None:
            i += 1
            continue
        p, r = best
        out[i + p] = (p, r - 1)
        i += p * r
    return out


def program_dot(prog: Program, unfold: bool = False, arg_names=None, *, depth=None) -> Diagram:
    """A Program as a picture that fits a notebook cell at full size.

    A small program draws every box: inputs (blue), constants (notes), values, fused Map/Reduce
    boxes, outputs (green), and each scan's step (or call's program) as a cluster beside its
    box.  A program too big for that draws one box per part of the user's code -- the layers of
    a model, the helper functions called, the source lines -- at the deepest level that fits
    (:mod:`vkml.viz_groups`); hovering a box shows the lines it stands for.  ``depth=k`` picks
    the level by hand (1: the outermost parts); ``unfold=True`` draws every equation, nested
    programs whole, scaled to the output width.

    Values are named as ``print(prog)`` names them (the user's variable; a traced function's
    inputs by their path, ``p['W1']``; else ``%n``), so the picture and the text can be read
    side by side.  ``arg_names`` names the inputs by hand.

    >>> prog = vkml.program(lambda x: vkml.sum(x * x), np.ones(3))
    >>> vkml.viz.program_dot(prog, arg_names=["x"]).nodes
    5
    """
    if not isinstance(prog, Program):
        raise ArgumentError(f"program_dot: expected a vkml Program, got {type(prog).__name__}; "
                            "get one with vkml.program(f, *args) or f.programs()")
    _check_picture_args("program_dot", unfold, arg_names, depth)
    text = pp_program(prog, arg_names=arg_names)
    if not unfold and not _users_code(getattr(prog, "fn_code", None)):
        prog = flattened(prog)          # (a grad(f) program: the calls of f's, drawn as f's)
    arg_names = arg_names if arg_names is not None else getattr(prog, "arg_names", None)
    marks = Marks(unfold=unfold)
    names = names_of(prog, arg_names)
    top_code = getattr(prog, "fn_code", None)
    paths = [equation_path(e, top_code) for e in prog.eqns]
    colour = group_colours(paths, common_levels(paths))

    def draw(level, d):
        if level == "all":
            return draw_program(d, prog, names, "p_", marks)
        groups = groups_at(prog.eqns, paths, common_levels(paths), level)
        return draw_groups(d, prog, names, "p_", groups, colour)

    level, d = fitted(prog, paths, draw, depth, marks.unfold)
    picture = Diagram("program", d.source(), text, d.nodes,
                      LEGEND if level != "all" else LEGEND_BOXES)
    picture.detail = every_equation(level, draw, text)
    return picture


def _box_class(box_class, panel, eqn):
    """``box_class(panel, eqn)``, which must give an SVG class (a string) or None."""
    try:
        out = box_class(panel, eqn)
    except Exception as err:  # noqa: BLE001 - the callback is the caller's: said as theirs
        raise ArgumentError(f"derived_dot: box_class(panel, equation) raised "
                            f"{type(err).__name__}: {err}; it must return an SVG class or None") \
            from err
    if out is not None and not isinstance(out, str):
        raise ArgumentError(f"derived_dot: box_class(panel, equation) must return an SVG class (a "
                            f"string) or None, got {type(out).__name__}")
    return out


def _check_picture_args(where, unfold, arg_names, depth, fused=True, box_class=None):
    """Refuse what a picture function cannot use, naming the argument and what it takes."""
    check_bool(unfold, "unfold", where)
    check_bool(fused, "fused", where)
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
        raise ArgumentError(f"{where}: depth must be a positive int (1: the outermost parts of "
                            f"the program) or None (the deepest that fits), got {depth!r:.60}")
    if arg_names is not None and (not isinstance(arg_names, (list, tuple)) or
                                  not all(isinstance(a, str) for a in arg_names)):
        raise ArgumentError(f"{where}: arg_names must be a list of strings (one name per input), "
                            f"got {type(arg_names).__name__}")
    if box_class is not None and not callable(box_class):
        raise ArgumentError(f"{where}: box_class must be a function (panel, equation) -> an SVG "
                            f"class or None, got {type(box_class).__name__}")


def every_equation(level, draw, text):
    """The every-equation picture behind a grouped one (None when the picture is that already)."""
    if level == "all":
        return None
    d = Dot(size=None)
    draw("all", d)
    return Diagram("program", d.source(), text, d.nodes, LEGEND_BOXES)


def _users_code(code) -> bool:
    """Whether ``code`` is a function of the user's (not a wrapper vkml made, as ``grad`` does)."""
    return code is not None and not code.co_filename.startswith(_PACKAGE_DIR)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

#: Programs of more boxes than this are drawn grouped without trying every box first.
ALL_BOXES_LIMIT = 80


def fitted(prog, paths, draw, depth, unfold, **graph_attrs):
    """``(level, Dot)``: the picture ``draw(level, Dot)`` at the level chosen -- every box
    (``"all"``) when asked (``unfold``) or when it fits the budget at full size, else the
    deepest grouping that fits (``viz_groups``), else the coarsest one, scaled to fit."""
    if unfold:
        d = Dot(**graph_attrs)
        draw("all", d)
        return "all", d
    shared = common_levels(paths)
    deepest = max_depth(paths, shared)
    if depth is not None:
        levels = [min(depth, deepest)] if deepest else ["all"]
    else:
        levels = (["all"] if len(fused_view(prog)[1]) <= ALL_BOXES_LIMIT else []) + \
            list(range(deepest, 0, -1))
    levels = levels or ["all"]
    measure = dot_available() is None
    for i, level in enumerate(levels):
        for rankdir in ("TB", "LR"):             # top to bottom, else left to right
            d = Dot(size=None, rankdir=rankdir, **graph_attrs)   # full size: text never shrunk
            draw(level, d)
            if depth is not None or (not measure and (level != "all" or d.nodes <= 40)):
                return level, d
            if fits(_measured(d)):
                return level, d
    scaled = Dot(size=f"{BUDGET_PT[0] / 72:.2f},{BUDGET_PT[1] / 72:.2f}", **graph_attrs)
    draw(levels[-1], scaled)
    return levels[-1], scaled


def _measured(d):
    """The size in points ``d`` lays out to (None if dot cannot say)."""
    try:
        found = _SVG_SIZE.search(Diagram("program", d.source(), "", d.nodes).pipe("svg"))
        return tuple(float(x) for x in found.groups()) if found else None
    except Exception:  # noqa: BLE001 - a picture that cannot be measured is drawn grouped
        return None


def group_colours(paths, shared):
    """``colour(group)``: one palette colour per part of the user's code, in the order the
    primal program's ``paths`` meet them, so a derived equation's box has its primal's colour
    (a box is coloured by the innermost part it stands for)."""
    order = {}
    for p in paths:
        for key, _, _ in p[shared:]:
            order.setdefault(key, len(order))

    def colour(group):
        if len(group.levels) <= shared:
            return None
        i = order.get(group.levels[-1][0])
        return None if i is None else PALETTE[i % len(PALETTE)]
    return colour


#: The order derived programs are drawn in, after the primal (other names follow, sorted).
DERIVED_ORDER = ("jvp", "known", "linear", "transposed")


class DerivedDiagram(Diagram):
    """A primal Program and its derived programs: one panel each.

    In a notebook it shows as tabs, one panel at a time at full size (:func:`tabs_html`); as an
    image (``image/svg+xml``, :meth:`pipe`) the panels are stacked top to bottom.  ``panels`` is
    the list of ``(name, Diagram)``, and :meth:`panel` picks one by name.
    Each user equation has a colour; the jvp, linear and transposed equations made from it have
    a border of the same colour, and the values the gradient saves (residuals) are ringed red.

    >>> f = vkml.jit(lambda x: vkml.sum(x * x))
    >>> _ = vkml.grad(f)(np.ones(2))
    >>> d = vkml.viz.derived_dot(f)
    >>> d.kind, len(d.panels)
    ('derived programs', 5)
    """

    def __init__(self, source, text, nodes, panels, residuals=None, legend=""):
        super().__init__("derived programs", source, text, nodes, legend)
        self.panels = panels
        self.residuals = residuals

    def pipe(self, format: str = "svg") -> bytes:
        """SVG: the panels' own pictures stacked top to bottom in one SVG (each within the
        output width); other formats render the panels as clusters of one graph.

        >>> f = vkml.jit(lambda x: vkml.sum(x * x))
        >>> _ = vkml.grad(f)(np.ones(2))
        >>> vkml.viz.derived_dot(f).pipe("svg").startswith(b"<?xml")
        True
        """
        if format != "svg":
            return super().pipe(format)
        parts = [diagram_.pipe("svg") for _, diagram_ in self.panels]
        return _stack_svgs(parts)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = super()._repr_mimebundle_(include, exclude)
        if "text/html" in bundle:
            try:
                # (each tab says what its own marks mean: a tab drawn box per equation or grouped)
                panels = [(name, one.svg(), legend_html(one.legend) + detail_html(one.detail))
                          for name, one in self.panels]
            except Exception:  # noqa: BLE001 - the stacked picture is drawn; keep it
                return bundle
            bundle["text/html"] = tabs_html(panels, self.text)
        return bundle

    def panel(self, name) -> Diagram:
        """The panel named ``name`` (``"primal"``, ``"jvp"``, ``"transposed"``, ...) as a Diagram of its own.

        >>> f = vkml.jit(lambda x: vkml.sum(x * x))
        >>> _ = vkml.grad(f)(np.ones(2))
        >>> vkml.viz.derived_dot(f).panel("transposed").kind
        'transposed program'
        """
        for n, diagram_ in self.panels:
            if n == name:
                return diagram_
        raise ArgumentError(f"DerivedDiagram.panel: no panel {name!r}; the panels are "
                            f"{', '.join(n for n, _ in self.panels)}")


_SVG_SIZE = re.compile(rb'<svg width="([\d.]+)pt" height="([\d.]+)pt"')
_SVG_BODY = re.compile(rb"<svg\b[^>]*>(.*)</svg>\s*$", re.S)
_VIEWBOX = re.compile(rb'viewBox="([^"]*)"')


def _stack_svgs(parts, gap=12.0) -> bytes:
    """Several graphviz SVGs as one, top to bottom: each keeps its own size and viewBox."""
    width = height = 0.0
    inner = []
    for svg in parts:
        w, h = (float(x) for x in _SVG_SIZE.search(svg).groups())
        box = _VIEWBOX.search(svg).group(1)
        body = _SVG_BODY.search(svg).group(1)
        # inside the outer picture one user unit is already 1 pt: sizes without units
        inner.append(b'<svg x="0" y="%s" width="%s" height="%s" viewBox="%s">%s</svg>'
                     % (_num(height), _num(w), _num(h), box, body))
        width, height = max(width, w), height + h + gap
    height -= gap if parts else 0
    head = (b'<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
            b'<svg width="%spt" height="%spt" viewBox="0 0 %s %s" '
            b'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">\n'
            % (_num(width), _num(height), _num(width * 1.0), _num(height * 1.0)))
    return head + SVG_STYLE.encode() + b"\n".join(inner) + b"\n</svg>\n"


def _num(x) -> bytes:
    return (b"%d" % x) if float(x).is_integer() else (b"%.2f" % x)


def _colours_for(primal: Program):
    """``colour_of(eqn)``: the colour of the user equation (of ``primal``) an equation comes from.

    A derived program is cached by structure, so its equations may come from an equal program
    traced earlier: a root not found by identity is matched by source line and primitive.
    """
    index, by_site = {}, {}

    def number(prog):
        for e in prog.eqns:
            i = index[id(e)] = len(index)
            by_site.setdefault((e.where, e.prim.name), i)
            for p in e.params.values():
                if isinstance(p, Program):
                    number(p)
    number(primal)

    def colour_of(e):
        root, _ = root_of(e)
        i = index.get(id(root))
        if i is None:
            i = by_site.get((root.where, root.prim.name))
        return None if i is None else PALETTE[i % len(PALETTE)]
    return colour_of


def _residual_split(primal, named):
    """``(residual outputs of known, residual inputs of linear/transposed)`` of derived programs."""
    jvp, known, linear = named.get("jvp"), named.get("known"), named.get("linear")
    if jvp is None or known is None or linear is None:
        return [], []
    n_tangent = len(jvp.inputs) - len(primal.inputs)
    n_res = len(linear.inputs) - n_tangent
    if n_res <= 0:
        return [], []
    return list(known.outputs[-n_res:]), n_res


def derived_dot(primal, derived=None, unfold: bool = False, arg_names=None, *, fused=True,
                box_class=None, depth=None) -> DerivedDiagram:
    """A primal Program and its derived programs, one panel each: in a notebook, one tab each.

    ``derived_dot(f)`` takes a jitted function (or anything with
    ``programs()`` and ``derived_programs()``) and draws its most recently
    derived key; ``derived_dot(primal, {"jvp": p1, "transposed": p2, ...})``
    draws the given programs.  Only programs named by strings are drawn.
    Equations are coloured by the user equation they come from; the residuals
    (what the known part saves for the backward) are ringed in red.  Each panel fits a notebook
    cell at full size as :func:`program_dot` fits one: a big program is drawn one box per part
    of the user's code, its backward grouped as its forward is (the backward of a layer is one
    box, of the layer's colour); ``depth=`` and ``unfold=True`` choose by hand.  ``fused=False``
    draws one box per equation; ``box_class(panel, eqn)`` gives a box an SVG class (the
    program explorer finds its boxes by it; a nested step may be the same equation in two
    panels).

    >>> f = vkml.jit(lambda x: vkml.sum(vkml.sin(x)))
    >>> _ = vkml.grad(f)(np.ones(2))
    >>> [name for name, _ in vkml.viz.derived_dot(f).panels]
    ['primal', 'jvp', 'known', 'linear', 'transposed']
    """
    if derived is None:
        pairs = derived_pairs(primal)
        if not pairs:
            raise ArgumentError("derived_dot: this function has no derived programs yet; take a "
                                "derivative first (vkml.grad(f)(x), vkml.jvp, vkml.vjp or "
                                "vkml.linearize)")
        if arg_names is None:
            arg_names = parameter_names(primal)
        primal, derived = pairs[-1]
    _check_picture_args("derived_dot", unfold, arg_names, depth, fused, box_class)
    if not isinstance(primal, Program):
        raise ArgumentError(f"derived_dot: expected a Program or a jitted function, got "
                            f"{type(primal).__name__}")
    named = {k: v for k, v in derived.items() if isinstance(k, str) and isinstance(v, Program)}
    order = [k for k in DERIVED_ORDER if k in named]
    order += sorted(k for k in named if k not in DERIVED_ORDER)
    colour_of = _colours_for(primal)
    saved, n_res = _residual_split(primal, named)
    rows = residual_rows(saved, named["known"], arg_names) if saved else []
    own = getattr(primal, "arg_names", None)         # (a traced function's, by pytree path)
    if own is not None and (arg_names is None or len(arg_names) != len(primal.inputs)):
        arg_names = own
    top_code = getattr(primal, "fn_code", None)
    primal_paths = [equation_path(e, top_code) for e in primal.eqns]
    shared = common_levels(primal_paths)
    group_colour = group_colours(primal_paths, shared)
    d = Dot()
    texts, panels, anchors, levels = [], [], [], []
    for i, (name, prog) in enumerate([("primal", primal)] + [(k, named[k]) for k in order]):
        names = names_of(prog, arg_names if name in ("primal", "jvp", "known") else None)
        value_fill, value_note = {}, {}
        if saved and name == "known":
            for v in saved:
                value_fill[v] = "saved"
            for v, row in zip(saved, rows):
                value_note[v] = f"saved: {row['bytes']:,} B"
        elif saved and name in ("linear", "transposed"):
            for v in prog.inputs[:n_res]:
                value_fill[v] = "saved"
        if name == "jvp":
            tangents = {v: "tangent" for v in prog.inputs[len(primal.inputs):]}
        classes = box_class and (lambda e, name=name: _box_class(box_class, name, e))
        marks = Marks(colour_of, value_fill, value_note=value_note, unfold=unfold, fused=fused,
                       box_class=classes)
        paths = [equation_path(e, top_code) for e in prog.eqns]

        def draw(level, dot, scope, prog=prog, names=names, marks=marks, paths=paths,
                 value_fill=value_fill, value_note=value_note, name=name,
                 tangents=tangents if name == "jvp" else None):
            if level == "all":
                return draw_program(dot, prog, names, scope, marks)
            fills = {**value_fill, **tangents} if name == "jvp" else value_fill
            return draw_groups(dot, prog, names, scope, groups_at(prog.eqns, paths, shared, level),
                               group_colour, fills, input_note=value_note)

        # (the program explorer finds every equation's box by its class: it draws them all)
        level, one = fitted(prog, paths, lambda lv, dot: draw(lv, dot, f"d{i}_"), depth,
                             unfold or box_class is not None, label=name, labelloc="t",
                             fontsize="12")
        levels.append(level)
        d.open(f"d{i}", name, bgcolor="#ffffff" if i else "#f0f9ff", fontsize="12")
        anchors.append((draw(level, d, f"d{i}_"), d.last_node))
        d.close()
        text = pp_program(prog, arg_names=arg_names if name in ("primal", "jvp", "known")
                          else None)
        panel = Diagram(f"{name} program", one.source(), text, one.nodes,
                        LEGEND if level != "all" else LEGEND_BOXES)
        panel.detail = every_equation(level, lambda lv, dot: draw(lv, dot, f"d{i}_"), text)
        panels.append((name, panel))
        texts.append(f"{name}:\n{text}")
    for (_, last), (nxt, _) in zip(anchors, anchors[1:]):
        if last is not None and nxt is not None:   # stack the panels top to bottom
            d.edge(last, nxt, style="invis", weight="10")
    residuals = Residuals("derived program", rows) if saved else None
    if residuals is not None:
        texts.append(residuals.text())
    grouped = any(level != "all" for level in levels)
    return DerivedDiagram(d.source(), "\n\n".join(texts), d.nodes, panels, residuals,
                          LEGEND if grouped else LEGEND_BOXES)


def derived_pairs(fn):
    """``[(primal, derived)]`` of a jitted function, for the keys that have derived programs.

    >>> f = vkml.jit(lambda x: vkml.sum(x * x))
    >>> _ = vkml.grad(f)(np.ones(2))
    >>> primal, derived = vkml.viz.derived_pairs(f)[0]
    >>> sorted(derived)
    ['jvp', 'known', 'linear', 'transposed']
    """
    programs = getattr(fn, "programs", None)
    derived = getattr(fn, "derived_programs", None)
    if not callable(programs) or not callable(derived):
        raise ArgumentError(f"derived_dot: expected a jitted function (vkml.jit) or a Program, got "
                            f"{type(fn).__name__}")
    return [(p, dv) for p, dv in zip(programs(), derived())
            if any(isinstance(k, str) and isinstance(v, Program) for k, v in dv.items())]
