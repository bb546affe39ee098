"""Pictures of what vkml builds, drawn with graphviz.

Every function here returns a :class:`Diagram`: the graphviz DOT source of
the picture and a text form of the same content.  A Diagram draws itself in
a notebook (``_repr_mimebundle_``: SVG plus the text), renders to SVG bytes
with :meth:`Diagram.pipe`, and falls back to its text with a one-line hint
when graphviz's ``dot`` program (or the ``graphviz`` Python package) is
missing.

- :func:`program_dot`: a Program -- its inputs, constants and values (named
  as the user named them), the fused ``Map``/``Reduce`` nodes the printer
  shows, and each ``scan`` (or ``call``, ``cond``, ``while``) with its nested
  step drawn as a cluster, folded when large; a block the program repeats
  (an unrolled Python loop) is drawn once and folded.
- :func:`tensor_dot`: the pending lazy graph behind tensors, drawn WITHOUT
  realizing anything: ops, shapes, the leaves that require grad and the
  values already realized.
- :func:`derived_dot`: a jitted function's primal and derived programs
  (``jvp``, ``known``, ``linear``, ``transposed``), one panel each, stacked;
  each derived equation is marked with the colour of the user equation it
  comes from, and the residuals the gradient keeps are ringed.
- :func:`saved_residuals`: what a gradient keeps from its forward pass (a
  function's residuals, a pending backward's realized values, a Record's
  copies) as a table with dtype, shape, bytes and source line.
- :func:`diff`: two programs, with added, removed and changed boxes marked.
- :func:`graph_dot` and :func:`record_dot`: a graph of kernels and a
  recorded launch (see their docstrings for the attributes they read).

A program, a lazy graph and each derived program fit a notebook cell at full
size -- at most 1,200 x 2,400 px, no text under 10 px -- by structure, not by
shrinking: a program too big for a box per equation is drawn one box per part
of the user's code (a layer, a helper call, a source line; see
:mod:`vkml.viz_groups`), with every equation one click away under it.  Derived
programs show as tabs.  Shown inline in a notebook, pictures follow
JupyterLab's light or dark theme, carry hover titles naming the user's lines,
and a legend for their colours.

Output is deterministic: the same object gives the same DOT source and the
same SVG bytes (node ids come from the printer's numbering, and the SVG's
element ids are prefixed with a hash of the source), so notebooks that show
diagrams can be checked by nbval.  Nothing here imports Jupyter; the
``graphviz`` package is imported only when a picture is rendered.
"""

from __future__ import annotations

import difflib
import hashlib
import html
import importlib.util
import inspect
import os
import re
import shutil

import numpy as np

from .errors import ArgumentError
from .validate import check_bool
from .ir import Program, Var, collect, dtype_name, format_shape, site_text
from .graph.graph import Graph
from .graph.record import Record
from .install import install_hint
from .printer import (format_param, fused_view, literal, number_values, pp_program, root_of,
                      site_title, source_line, value_names)
from .programs import Jitted, jit
from .programs.derivatives import gradient_residuals
from .pytree import flatten
from .runtime import grad_leaf, is_traced
from .tensor import Tensor
from .viz_dot import (FILL, MAX_WIDTH_IN, PALETTE, Dot, HtmlLabel, dot_attrs,  # noqa: F401
                      html_label, params_text, quote, short, type_text)
from .viz_groups import (BUDGET_PT, calls_summary, common_levels, draw_groups, equation_path, fits,
                         flattened, groups_at, max_depth)
from .viz_schedule import checkpoint_schedule  # noqa: F401  (a checkpoint schedule, drawn)

__all__ = ["Diagram", "DerivedDiagram", "diagram", "program_dot", "tensor_dot", "derived_dot",
           "graph_dot", "record_dot", "dot_available", "install", "is_graph", "is_record",
           "derived_pairs", "saved_residuals", "Residuals", "diff", "parameter_names",
           "checkpoint_schedule"]

#: Pictures with more nodes than this show their text instead (dot would take minutes).
MAX_NODES = 600
#: A nested program (a scan's step, a cond's branch) with more boxes than this is drawn folded:
#: one box saying what it holds (``program_dot(prog, unfold=True)`` draws it all).
FOLD_BOXES = 6
#: CSS put into every SVG: in a dark colour scheme the background, edges and labels drawn on it
#: turn dark/light; boxes keep their light fills and dark text, so every text stays readable.
#: (JupyterLab shows an SVG output as an image, so its theme variables cannot reach inside; the
#: picture carries its own background instead.)
SVG_STYLE = (
    "<style>"
    "@media (prefers-color-scheme: dark) {"
    " g.graph > polygon:first-of-type { fill: #111827; }"
    " g.graph > text, g.cluster > text, g.edge > text { fill: #f3f4f6; }"
    " g.edge > path { stroke: #d1d5db; }"
    " g.edge > polygon { fill: #d1d5db; stroke: #d1d5db; }"
    " g.cluster > polygon, g.cluster > path { fill: #1f2937; stroke: #9ca3af; }"
    " g.node text { fill: #111827; }"
    "}"
    "</style>")


# -- rendering -------------------------------------------------------------------------------

def dot_available() -> str | None:
    """None when diagrams can be rendered, else a one-line hint saying what to install.

    >>> hint = vkml.viz.dot_available()
    >>> hint is None or "graphviz" in hint
    True
    """
    if shutil.which("dot") is None:
        return ("(vkml.viz: graphviz's `dot` program was not found, so this is shown as text; "
                "install graphviz, e.g. `apt-get install graphviz`, to see the diagram)")
    if importlib.util.find_spec("graphviz") is None:
        return ("(vkml.viz: the `graphviz` Python package is missing, so this is shown as text; "
                f"`{install_hint('jupyter')}` to see the diagram)")
    return None


_GENERATED_BY = re.compile(rb"<!-- Generated by graphviz[^>]*-->\s*")
_SVG_ID = re.compile(rb'\bid="([^"]*)"')
_SVG_OPEN = re.compile(rb"<svg\b[^>]*>")


_SVG_START = re.compile(r"<svg\b")
#: graphviz's own <title> of a graph, node, edge or cluster: its internal DOT name (``p_v0``), which
#: an inline picture would show as the tooltip of every box that has no source line.
_DOT_NAME_TITLE = re.compile(r'(class="(?:graph|node|edge|cluster)"[^>]*>\n)<title>[^<]*</title>\n')
#: A box's tooltip, as graphviz writes it: a link's ``xlink:title``.
_LINK_TOOLTIP = re.compile(r'<a xlink:title="([^"]*)">')


def _scoped_style(scope: str) -> str:
    """SVG_STYLE's dark-theme rules for an SVG inlined in a page.

    Inline, an SVG's ``<style>`` applies to the whole page, so every selector is put under
    ``.vkml-diagram`` (only vkml's pictures are touched), and the rules apply when JupyterLab's
    own theme is dark -- not when the operating system's is (a light notebook on a dark desktop
    keeps light pictures).  An SVG shown as an ``<img>`` cannot see the page's theme: it keeps its
    own rule for the system's colour scheme.
    """
    rules = SVG_STYLE[SVG_STYLE.index("{") + 1:SVG_STYLE.rindex("}")]
    def under(prefix):
        out = []
        for rule in filter(str.strip, rules.split("}")):
            selectors, declarations = rule.split("{")
            out.append(", ".join(f"{prefix} {sel.strip()}" for sel in selectors.split(","))
                       + " {" + declarations + "}")
        return " ".join(out)
    return under(f'body[data-jp-theme-light="false"] {scope}')


def _inline_svg(svg: str) -> str:
    """A graphviz SVG made ready to live inside HTML: no XML prologue, no node-name titles (they
    would pop up instead of the tooltips), each tooltip also a ``<title>`` child (the form every
    browser shows), and no picture-wide style (the page's rules are scoped)."""
    svg = svg[_SVG_START.search(svg).start():]
    svg = _DOT_NAME_TITLE.sub(r"\1", svg)
    svg = _LINK_TOOLTIP.sub(lambda m: m.group(0) + f"<title>{m.group(1)}</title>", svg)
    return svg.replace(SVG_STYLE, "").rstrip()


#: the style every inline picture starts from: the SVG shown and the text hidden where the page is
#: trusted (an untrusted front-end drops the style and keeps ``hidden``), the legend's look, and
#: labels and legends readable in JupyterLab's dark theme
_BASE_STYLE = (".vkml-diagram > div.vkml-svg[hidden] { display: block; } "
               ".vkml-diagram > pre.vkml-text { display: none; } "
               ".vkml-diagram .vkml-legend { font: 12px sans-serif; color: #4b5563; "
               "margin-top: 4px; max-width: 900px; } "
               'body[data-jp-theme-light="false"] .vkml-diagram .vkml-tabs > label '
               "{ color: #e5e7eb; border-color: #6b7280; } "
               'body[data-jp-theme-light="false"] .vkml-diagram .vkml-legend, '
               'body[data-jp-theme-light="false"] .vkml-diagram summary { color: #d1d5db; } ')


def inline_html(svg: str, text: str, legend: str = "") -> str:
    """The picture as HTML that draws the SVG inline, so hovering a box shows its source line.

    JupyterLab shows an ``image/svg+xml`` output as an ``<img>``, and an image shows no tooltips;
    an SVG inlined in HTML does.  Each box's tooltip (graphviz's ``xlink:title``) also becomes a
    ``<title>`` child, the form every browser shows, and graphviz's internal node names are dropped
    so they do not pop up instead.  A front-end that does not trust the output strips the
    ``<style>`` and the SVG but keeps ``hidden``: it then shows the ``<pre>`` text, never a jumble
    of the SVG's labels.

    >>> d = vkml.viz.diagram(vkml.program(lambda x: x + 1.0, np.ones(2)))
    >>> page = vkml.viz.inline_html(d.svg(), d.text)
    >>> page.startswith('<div class="vkml-diagram">'), "<?xml" in page
    (True, False)
    """
    svg = _inline_svg(svg)
    style = _BASE_STYLE + _scoped_style(".vkml-diagram")
    note = _legend_html(legend)
    # (the legend and anything added after it live in the hidden block too: an untrusted
    # front-end shows the text alone)
    return (f'<div class="vkml-diagram"><style>{style}</style>'
            f'<div class="vkml-svg" hidden="hidden">{svg.rstrip()}{note}</div>'
            f'<pre class="vkml-text">{html.escape(text)}</pre></div>')


#: What the marks of a program picture mean (said under each one in a notebook).
LEGEND = ("A box is a part of your code: a layer of your model, a function you called or a line "
          "(hover it for the lines); its colour is that part's, in every tab, so the backward of a "
          "layer has the layer's colour.  Blue: inputs; green: outputs; ringed red: kept from the "
          "forward pass for the backward.  program_dot(prog, unfold=True) draws every equation.")
#: ... of a picture with a box per equation
LEGEND_BOXES = ("A box is one operation (Map: elementwise operations fused into one loop, x0, x1 "
                "its operands; Reduce: a sum or max) -- hover it for the line that made it.  A "
                "coloured border (and the small squares under a fused box) is the user line an "
                "equation comes from, the same colour in every tab.  Blue: inputs; green: outputs; "
                "ringed red: kept from the forward pass for the backward; %n: a value your code "
                "did not name.")
#: ... and of a lazy graph's inputs
LEGEND_LAZY = ("  Orange: parameters (they get a .grad); green: values already computed; grey: "
               "placeholders of a trace.")


def _legend_html(legend) -> str:
    return f'<div class="vkml-legend">{html.escape(legend)}</div>' if legend else ""


#: A grouped picture offers its every-equation form (in the notebook) up to this many boxes.
DETAIL_BOXES = 300


def _detail_html(detail) -> str:
    """``<details>`` holding ``detail``'s SVG (every equation of a grouped picture): one click in
    the notebook opens it, another closes it; '' when there is none or it is too big to draw."""
    if detail is None:
        return ""
    if detail.nodes > DETAIL_BOXES:
        return (f'<details class="vkml-detail"><summary>every equation: {detail.nodes} boxes, too '
                'many to draw here; program_dot(prog, unfold=True) draws them</summary></details>')
    try:
        svg = detail.svg()
    except Exception:  # noqa: BLE001 - the grouped picture stands on its own
        return ""
    return (f'<details class="vkml-detail"><summary>every equation ({detail.nodes} boxes)'
            f'</summary>{_inline_svg(svg)}</details>')


_TAB_STYLE = (".vkml-diagram .vkml-tabs > input.vkml-tab { position: absolute; opacity: 0; } "
              ".vkml-diagram .vkml-tabs > label { display: inline-block; padding: 2px 10px; "
              "margin: 0 2px 4px 0; border: 1px solid #9ca3af; border-radius: 4px; cursor: pointer; "
              "font: 13px sans-serif; } "
              ".vkml-diagram .vkml-tabs > input.vkml-tab:checked + label { background: #2563eb; "
              "color: #fff; border-color: #2563eb; } "
              ".vkml-diagram .vkml-tabs > .vkml-tab-panel { display: none; } ")


def tabs_html(panels, text, legend="") -> str:
    """Pictures ``[(name, svg)]`` as tabs: one shown at a time, each at full size, chosen by
    clicking its name (radio buttons and CSS: no script, so it works in a notebook, in an HTML
    export and in the docs).  Inline, as :func:`inline_html` draws one picture: tooltips show,
    and an untrusted front-end shows the text instead.

    >>> page = vkml.viz.tabs_html([("primal", "<svg></svg>"), ("transposed", "<svg></svg>")], "text")
    >>> page.count('type="radio"'), 'class="vkml-tab-panel"' in page
    (2, True)
    """
    if not isinstance(panels, (list, tuple)) or not panels or not all(
            isinstance(p, tuple) and 2 <= len(p) <= 3 and all(isinstance(x, str) for x in p) and
            _SVG_START.search(p[1]) for p in panels) or not isinstance(text, str) or \
            not isinstance(legend, str):
        raise ArgumentError("tabs_html: expected a non-empty list of (name, svg) pairs of strings "
                            "(each svg holding an <svg> element), a text and a legend string")
    group = "vkml" + hashlib.sha256("".join(p[1] for p in panels).encode()).hexdigest()[:10]
    heads, bodies, rules = [], [], []
    for i, (name, svg, *detail) in enumerate(panels):
        ident = f"{group}-{i}"
        checked = ' checked="checked"' if i == 0 else ""
        heads.append(f'<input type="radio" name="{group}" id="{ident}" class="vkml-tab"{checked}>'
                     f'<label for="{ident}">{html.escape(name)}</label>')
        bodies.append(f'<div class="vkml-tab-panel" id="{ident}-panel">'
                      f'{_inline_svg(svg)}{"".join(detail)}</div>')
        rules.append(f"#{ident}:checked ~ #{ident}-panel {{ display: block; }}")
    style = (_BASE_STYLE + _TAB_STYLE + " ".join(rules) + " " + _scoped_style(".vkml-diagram"))
    note = _legend_html(legend)
    return (f'<div class="vkml-diagram"><style>{style}</style>'
            f'<div class="vkml-svg vkml-tabs" hidden="hidden">{"".join(heads)}{"".join(bodies)}'
            f'{note}</div><pre class="vkml-text">{html.escape(text)}</pre></div>')


class Diagram:
    """A picture: deterministic graphviz DOT ``source`` plus the same content as ``text``.

    Like ``graphviz.Digraph`` it has ``source`` and ``pipe(format=...)``;
    :meth:`to_graphviz` gives a real ``graphviz.Source`` for everything else
    (``render``, ``view``).  ``kind`` names what is drawn ("program",
    "lazy graph", ...) and ``nodes`` how many boxes it has.

    >>> d = vkml.viz.diagram(vkml.program(lambda x: vkml.sin(x), np.ones(2)))
    >>> d.kind, d.nodes, d.source.startswith("digraph")
    ('program', 3, True)
    """

    def __init__(self, kind: str, source: str, text: str, nodes: int, legend: str = ""):
        self.kind = kind
        self.source = source
        self.text = text
        self.nodes = nodes
        #: what the picture's colours and marks mean, said under it in a notebook
        self.legend = legend
        #: for a grouped picture, the same program with every equation (a Diagram, or None):
        #: a notebook shows it when the reader opens "every equation" under the picture
        self.detail = None

    def to_graphviz(self):
        """The picture as a ``graphviz.Source`` (needs the graphviz package).

        >>> d = vkml.viz.diagram(vkml.program(lambda x: x + 1.0, np.ones(2)))
        >>> type(d.to_graphviz()).__name__
        'Source'
        """
        import graphviz  # local: optional dependency
        return graphviz.Source(self.source)

    def pipe(self, format: str = "svg") -> bytes:
        """Render with ``dot``; SVG output is normalised so the same source gives the same bytes.

        The SVG loses graphviz's "Generated by" comment (it names the version)
        and its element ids get a prefix made from a hash of the source, so
        two diagrams on one page never share an id.

        >>> d = vkml.viz.diagram(vkml.program(lambda x: x + 1.0, np.ones(2)))
        >>> d.pipe("svg").startswith(b"<?xml")
        True
        """
        hint = dot_available()
        if hint is not None:
            raise RuntimeError(hint)
        out = self.to_graphviz().pipe(format=format)
        if format != "svg":
            return out
        out = _GENERATED_BY.sub(b"", out)
        prefix = b"vk" + hashlib.sha256(self.source.encode()).hexdigest()[:10].encode() + b"_"
        out = _SVG_ID.sub(lambda m: b'id="' + prefix + m.group(1) + b'"', out)
        return _SVG_OPEN.sub(lambda m: m.group(0) + SVG_STYLE.encode(), out, count=1)

    def svg(self) -> str:
        """The picture as SVG text.

        >>> d = vkml.viz.diagram(vkml.program(lambda x: x + 1.0, np.ones(2)))
        >>> "<svg" in d.svg()
        True
        """
        return self.pipe("svg").decode("utf-8")

    def _repr_mimebundle_(self, include=None, exclude=None):
        if self.nodes > MAX_NODES:
            return {"text/plain": f"{self.text}\n(vkml.viz: {self.nodes} boxes are too many to "
                                  "draw; shown as text)"}
        hint = dot_available()
        if hint is not None:
            return {"text/plain": f"{self.text}\n{hint}"}
        try:
            svg = self.svg()
        except Exception as err:  # a broken dot install must not break the notebook's output
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            return {"text/plain": f"{self.text}\n(vkml.viz: dot failed: {first})"}
        page = inline_html(svg, self.text, self.legend)
        more = _detail_html(self.detail)
        if more:        # (inside the hidden block, after the legend)
            cut = page.index('</div><pre class="vkml-text">')
            page = page[:cut] + more + page[cut:]
        return {"text/html": page, "image/svg+xml": svg,
                "text/plain": self.text}

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"<vkml.viz.Diagram of a {self.kind}, {self.nodes} nodes>"


# -- programs --------------------------------------------------------------------------------

def _scan_roles(eqn):
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    return ["capture"] * nc + ["init"] * nk + ["xs"] * (len(eqn.inputs) - nc - nk)


class _Marks:
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


def _draw_program(d: Dot, prog: Program, names: dict, scope: str, marks=None):
    """Draw ``prog``'s values and boxes with node names under ``scope``; returns its first node."""
    return _ProgramDrawing(d, prog, names, scope, marks or _Marks()).draw()


class _ProgramDrawing:
    """One program drawn into a picture: its values (ellipses), constants (notes), equation boxes
    (a nested program as a cluster, or folded), and repeated runs of boxes folded into one."""

    def __init__(self, d: Dot, prog: Program, names: dict, scope: str, marks: _Marks):
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
        anchor = _draw_program(d, p, self.names, sub, self.marks)
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


def _names_of(prog, arg_names=None):
    return value_names(prog, number_values(prog), arg_names)


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
    marks = _Marks(unfold=unfold)
    names = _names_of(prog, arg_names)
    top_code = getattr(prog, "fn_code", None)
    paths = [equation_path(e, top_code) for e in prog.eqns]
    colour = _group_colours(paths, common_levels(paths))

    def draw(level, d):
        if level == "all":
            return _draw_program(d, prog, names, "p_", marks)
        groups = groups_at(prog.eqns, paths, common_levels(paths), level)
        return draw_groups(d, prog, names, "p_", groups, colour)

    level, d = _fitted(prog, paths, draw, depth, marks.unfold)
    picture = Diagram("program", d.source(), text, d.nodes,
                      LEGEND if level != "all" else LEGEND_BOXES)
    picture.detail = _every_equation(level, draw, text)
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


def _every_equation(level, draw, text):
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


def _fitted(prog, paths, draw, depth, unfold, **graph_attrs):
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


def _group_colours(paths, shared):
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
                panels = [(name, one.svg(), _legend_html(one.legend) + _detail_html(one.detail))
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
    rows = _residual_rows(saved, named["known"], arg_names) if saved else []
    own = getattr(primal, "arg_names", None)         # (a traced function's, by pytree path)
    if own is not None and (arg_names is None or len(arg_names) != len(primal.inputs)):
        arg_names = own
    top_code = getattr(primal, "fn_code", None)
    primal_paths = [equation_path(e, top_code) for e in primal.eqns]
    shared = common_levels(primal_paths)
    group_colour = _group_colours(primal_paths, shared)
    d = Dot()
    texts, panels, anchors, levels = [], [], [], []
    for i, (name, prog) in enumerate([("primal", primal)] + [(k, named[k]) for k in order]):
        names = _names_of(prog, arg_names if name in ("primal", "jvp", "known") else None)
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
        marks = _Marks(colour_of, value_fill, value_note=value_note, unfold=unfold, fused=fused,
                       box_class=classes)
        paths = [equation_path(e, top_code) for e in prog.eqns]

        def draw(level, dot, scope, prog=prog, names=names, marks=marks, paths=paths,
                 value_fill=value_fill, value_note=value_note, name=name,
                 tangents=tangents if name == "jvp" else None):
            if level == "all":
                return _draw_program(dot, prog, names, scope, marks)
            fills = {**value_fill, **tangents} if name == "jvp" else value_fill
            return draw_groups(dot, prog, names, scope, groups_at(prog.eqns, paths, shared, level),
                               group_colour, fills, input_note=value_note)

        # (the program explorer finds every equation's box by its class: it draws them all)
        level, one = _fitted(prog, paths, lambda lv, dot: draw(lv, dot, f"d{i}_"), depth,
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
        panel.detail = _every_equation(level, lambda lv, dot: draw(lv, dot, f"d{i}_"), text)
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


def parameter_names(fn):
    """The parameter names of a jitted function's Python function (None if not plain): what
    its pictures name the program's inputs (the notebook magic names them so too).

    >>> vkml.viz.parameter_names(vkml.jit(lambda x, scale: scale * x))
    ['x', 'scale']
    >>> vkml.viz.parameter_names(vkml.jit(lambda *xs: xs[0])) is None   # no names to give
    True
    """
    target = getattr(fn, "fn", None)
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        return None
    return [p.name for p in params]


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


# -- what the gradient keeps -----------------------------------------------------------------

def _nbytes(v) -> int:
    n = np.dtype(v.dtype).itemsize
    for s in v.shape:
        n *= s
    return n


def _made_by(v, prog=None) -> str:
    """The source line that made a value (``file.py:3: h = vkml.tanh(w)``), or what it is."""
    if prog is not None and v in prog.inputs:
        return f"input {prog.inputs.index(v)} (kept as it is)"
    if v.eqn is None:
        return "a constant"
    return site_title(v.eqn) or f"{v.eqn.prim.name} (no source line)"


def _residual_rows(vars_, prog=None, arg_names=None):
    names = _names_of(prog, arg_names) if prog is not None else {}
    return [{"value": names.get(v, "?"), "dtype": dtype_name(v.dtype),
             "shape": format_shape(v.shape), "bytes": _nbytes(v), "made by": _made_by(v, prog)}
            for v in vars_]


class Residuals:
    """What a gradient keeps from its forward pass: one row per saved value and the total.

    ``rows`` are dicts with ``value``, ``dtype``, ``shape``, ``bytes`` and ``made by`` (the
    source line that made it); ``total`` is the sum of ``bytes``.  Shows as an HTML table in a
    notebook and as aligned text elsewhere.

    >>> res = vkml.viz.saved_residuals(lambda x: vkml.sum(x * x), np.ones(4))
    >>> res.total
    32
    """

    COLUMNS = ("value", "dtype", "shape", "bytes", "made by")

    def __init__(self, what: str, rows):
        self.what = what
        self.rows = list(rows)
        self.total = sum(r["bytes"] for r in self.rows)

    def __len__(self):
        return len(self.rows)

    def text(self) -> str:
        """The table as aligned plain text (what ``print`` shows).

        >>> res = vkml.viz.saved_residuals(lambda x: vkml.sum(x * x), np.ones(4))
        >>> res.text().splitlines()[0]
        'what the gradient keeps (gradient of <lambda>): 1 value, 32 bytes'
        """
        head = (f"what the gradient keeps ({self.what}): {len(self.rows)} value"
                f"{'s' * (len(self.rows) != 1)}, {self.total:,} bytes")
        cells = [list(self.COLUMNS)] + [[f"{r[c]:,}" if c == "bytes" else str(r[c])
                                         for c in self.COLUMNS] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.COLUMNS))]
        lines = [head] + ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                          for row in cells]
        return "\n".join(lines)

    def __repr__(self):
        return self.text()

    def _repr_html_(self):
        head = "".join(f"<th>{c}</th>" for c in self.COLUMNS)
        body = "".join("<tr>" + "".join(
            f"<td>{r[c]:,}</td>" if c == "bytes" else f"<td>{html.escape(str(r[c]))}</td>"
            for c in self.COLUMNS) + "</tr>" for r in self.rows)
        return (f'<table class="vkml-residuals"><caption>what the gradient keeps '
                f"({html.escape(self.what)})</caption><tr>{head}</tr>{body}"
                f"<tr><th>total</th><td></td><td></td><th>{self.total:,}</th><td></td></tr>"
                "</table>")


def saved_residuals(obj, *args) -> Residuals:
    """What a gradient keeps from the forward pass, as a table (dtype, shape, bytes, source line).

    - ``saved_residuals(f, *args)``: ``f`` a function (jitted or not); its gradient with
      respect to every floating argument is derived (nothing runs) and the values the known
      part hands to the backward are listed.
    - ``saved_residuals(loss)``: a Tensor; the realized values its pending backward keeps alive.
    - ``saved_residuals(record)``: a Record; the planes it copied before an overwrite.

    >>> res = vkml.viz.saved_residuals(lambda x: vkml.sum(vkml.sin(x)), np.ones(3))
    >>> [(row["dtype"], row["shape"]) for row in res.rows], res.total
    ([('float64', '[3]')], 24)
    """
    if is_record(obj):
        return _record_residuals(obj)
    if isinstance(obj, Tensor):
        if args:
            raise ArgumentError("saved_residuals: a Tensor takes no arguments")
        return _lazy_residuals(obj)
    if not callable(obj):
        raise ArgumentError(f"saved_residuals: expected a function with its arguments, a Tensor "
                            f"or a Record, got {type(obj).__name__}")
    fn = obj if isinstance(obj, Jitted) else jit(obj)
    parts = gradient_residuals(fn, args)
    if parts is None:
        raise ArgumentError("saved_residuals: no floating argument to differentiate")
    known, saved = parts
    rows = _residual_rows(saved, known, parameter_names(fn))
    return Residuals(f"gradient of {getattr(fn, '__name__', 'f')}", rows)


def _lazy_residuals(t) -> Residuals:
    """The realized values in ``t``'s history: what its backward reads and keeps alive."""
    _, eqns = collect([t.ir_var], is_leaf=lambda v: False)
    seen, rows = set(), []
    for e in eqns:
        for v in e.outputs:
            if v.value is not None and v not in seen:
                seen.add(v)
                rows.append({"value": f"{e.prim.name} result", "dtype": dtype_name(v.dtype),
                             "shape": format_shape(v.shape), "bytes": _nbytes(v),
                             "made by": _made_by(v)})
    return Residuals("pending backward of a tensor", rows)


def _record_saved_rows(record):
    """One row per plane version a Record copied (read from ``record.saved`` where it has one)."""
    rows = []
    saved = getattr(record, "saved", None)
    if isinstance(saved, dict) and hasattr(record, "graph") and hasattr(record, "planes"):
        for (pid, version), a in saved.items():
            name = record.graph.plane_name(record.planes[pid])
            rows.append({"value": name, "dtype": dtype_name(a.dtype),
                         "shape": format_shape(a.shape), "bytes": int(a.nbytes),
                         "made by": f"copied before overwrite (version {version})"})
    return rows


def _record_residuals(record) -> Residuals:
    rows = _record_saved_rows(record)
    extra = int(getattr(record, "nbytes", 0)) - sum(r["bytes"] for r in rows)
    if extra > 0:
        rows.append({"value": "checkpoints and kept planes", "dtype": "-", "shape": "-",
                     "bytes": extra, "made by": "repeat_while checkpoints / keep()"})
    return Residuals(f"Record of generation {record.generation}", rows)


# -- differences between programs ------------------------------------------------------------

def _as_program(obj, what):
    if isinstance(obj, Program):
        return obj
    if isinstance(obj, Jitted) and obj.programs():
        return obj.programs()[-1]
    raise ArgumentError(f"diff: {what} must be a Program or a jitted function that has been "
                        f"called, got {type(obj).__name__}; get a Program with "
                        "vkml.program(f, *args)")


def _box_signature(box, names):
    """What a box computes, without the names of its values: two versions of a function that
    compute the same thing the same way have equal signatures."""
    e, kind, text, reads = box
    return (kind, text, tuple(v.type_str() for v in reads), tuple(v.type_str() for v in e.outputs))


def diff(a, b, labels=("before", "after")) -> Diagram:
    """Two programs drawn one above the other with what changed marked.

    ``a`` and ``b`` are Programs or jitted functions (their latest program): two versions of a
    function, or a program and one of its derived programs.  Boxes are matched in order by what
    they compute; a box only in ``a`` is red (removed), only in ``b`` green (added), and a box
    in the same place computing something else yellow (changed).  The text form is a unified
    diff of the printed programs.

    >>> a = vkml.program(lambda x: vkml.sin(x) * 2.0, np.ones(2))
    >>> b = vkml.program(lambda x: vkml.cos(x) * 2.0, np.ones(2))
    >>> vkml.viz.diff(a, b).kind
    'program diff'
    """
    if not (isinstance(labels, (tuple, list)) and len(labels) == 2 and
            all(isinstance(x, str) for x in labels)):
        raise ArgumentError(f"diff: labels must be two strings (the names of a and b), got "
                            f"{labels!r:.80}; for example labels=('before', 'after')")
    pa, pb = _as_program(a, "the first program"), _as_program(b, "the second program")
    na, nb = _names_of(pa), _names_of(pb)
    boxes_a, boxes_b = fused_view(pa)[1], fused_view(pb)[1]
    sig_a = [_box_signature(x, na) for x in boxes_a]
    sig_b = [_box_signature(x, nb) for x in boxes_b]
    fill_a, fill_b = {}, {}
    counts = {"removed": 0, "added": 0, "changed": 0}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, sig_a, sig_b,
                                                       autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        paired = min(i2 - i1, j2 - j1) if tag == "replace" else 0
        for k in range(i1, i2):
            mark = "changed" if k - i1 < paired else "removed"
            fill_a[id(boxes_a[k][0])] = mark
            counts[mark] += 1
        for k in range(j1, j2):
            mark = "changed" if k - j1 < paired else "added"
            fill_b[id(boxes_b[k][0])] = mark
            counts[mark] += 0 if mark == "changed" else 1
    summary = (f"{counts['added']} added, {counts['removed']} removed, "
               f"{counts['changed']} changed")
    d = Dot(label=f"diff: {summary}", labelloc="t", fontsize="12")
    anchors = []
    for i, (label, prog, names, fills) in enumerate([(labels[0], pa, na, fill_a),
                                                     (labels[1], pb, nb, fill_b)]):
        d.open(f"diff{i}", label, bgcolor="#ffffff")
        anchors.append((_draw_program(d, prog, names, f"diff{i}_", _Marks(box_fill=fills)),
                        d.last_node))
        d.close()
    if anchors[0][1] is not None and anchors[1][0] is not None:
        d.edge(anchors[0][1], anchors[1][0], style="invis")
    text_a, text_b = pp_program(pa).splitlines(), pp_program(pb).splitlines()
    lines = list(difflib.unified_diff(text_a, text_b, labels[0], labels[1], lineterm="", n=2))
    text = f"diff: {summary}\n" + ("\n".join(lines) if lines else "(the programs print the same)")
    return Diagram("program diff", d.source(), text, d.nodes)


# -- lazy tensor graphs ----------------------------------------------------------------------

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
        notes.append(f"kept for backward, {_nbytes(v):,} B")
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
    names = _names_of(prog)
    names.update((v, name) for v, name in _parameter_names(leaves, eqns).items())
    fill = {v: "grad" if _requires_grad(v) else "realized" if v.value is not None
            else "placeholder" for v in leaves}
    paths = [equation_path(e, None) for e in eqns]
    shared = common_levels(paths)
    colour = _group_colours(paths, shared)
    constants = {v for v in leaves if v.shape == () and fill[v] == "realized"}

    def draw(level, d):
        if level == "all":
            marks = _Marks(value_fill={v: f for v, f in fill.items() if f != "realized"})
            return _draw_program(d, prog, names, "t_", marks)
        return draw_groups(d, prog, names, "t_", groups_at(eqns, paths, shared, level), colour,
                           fill, hide=constants)

    level, d = _fitted(prog, paths, draw, None, False)
    picture = Diagram("lazy graph", d.source(), text, d.nodes,
                      (LEGEND if level != "all" else LEGEND_BOXES) + LEGEND_LAZY)
    picture.detail = _every_equation(level, draw, text)
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


# -- graphs of kernels and their Records -----------------------------------------------------

_KIND_SHAPE = {"launch": "box", "skippable": "box", "repeat_while": "box", "opaque": "box3d",
               "reduce": "invtrapezium"}


def _value_text(value) -> str:
    """A uniform as its number, or an array as its dtype and shape."""
    a = np.asarray(value)
    if a.ndim == 0:
        return repr(a.item())
    return f"{dtype_name(a.dtype)} {format_shape(a.shape)}"


def _defined_at(node) -> str | None:
    """``cell In[3], line 2: def wave(u, k: vkml.Param):`` -- where the user wrote a graph
    node's kernel (or model function): what hovering its box shows."""
    op = getattr(node, "op", node)
    fn = getattr(getattr(op, "kernel", None), "fn", None) or getattr(op, "fn", None)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    where = (code, code.co_firstlineno)
    text = source_line(where)
    return site_text(where) + (f": {text}" if text else "")


def _node_named(record, name):
    """The node ``name`` of the Record's graph, where the Record knows its graph (else None)."""
    for node in getattr(getattr(record, "graph", None), "nodes", ()):
        if getattr(node, "name", None) == name:
            return node
    return None


def graph_dot(graph) -> Diagram:
    """A graph of kernels: its nodes (boxes, in the order added), the planes they read and write
    (ellipses), and each node's uniform parameters.

    Reads only ``graph.nodes``, each with ``name``, ``kind`` (``"launch"``,
    ``"skippable"``, ``"repeat_while"``, ``"opaque"`` or ``"reduce"``),
    ``reads`` and ``writes`` (plane names) and ``params`` (name -> value).
    Skippable nodes are dashed, a repeat_while node has a loop arrow, an
    opaque (user) node is grey.

    >>> @vkml.kernel
    ... def square(x):
    ...     return {"u": x * x}
    ...
    >>> g = vkml.Graph().add(square.bind(x=np.ones(3), u=np.zeros(3)), name="square").build()
    >>> print(vkml.viz.graph_dot(g).text)
    Graph: 1 node, 2 planes
      square [launch] reads x writes u
    """
    nodes = list(getattr(graph, "nodes", None) or [])
    d = Dot()
    planes = []
    for n in nodes:
        for p in list(n.reads) + list(n.writes):
            if p not in planes:
                planes.append(p)
    for p in planes:
        d.node(f"plane {p}", p, shape="ellipse", fillcolor=FILL["plane"])
    lines = [f"Graph: {len(nodes)} node{'s' * (len(nodes) != 1)}, {len(planes)} "
             f"plane{'s' * (len(planes) != 1)}"]
    for n in nodes:
        kind = getattr(n, "kind", "launch")
        params = dict(getattr(n, "params", None) or {})
        uniforms = ", ".join(f"{k} = {_value_text(v)}" for k, v in params.items())
        label = f"{n.name}\n[{kind}]" + (f"\n{uniforms}" if uniforms else "")
        style = "rounded,filled" + (",dashed" if kind == "skippable" else "")
        tip = _defined_at(n)
        d.node(f"node {n.name}", label, shape=_KIND_SHAPE.get(kind, "box"), style=style,
               fillcolor=FILL.get(kind, FILL["launch"]), **({"tooltip": tip} if tip else {}))
        for p in n.reads:
            d.edge(f"plane {p}", f"node {n.name}")
        for p in n.writes:
            d.edge(f"node {n.name}", f"plane {p}")
        if kind == "repeat_while":
            d.edge(f"node {n.name}", f"node {n.name}", label="repeat while", style="dashed")
        lines.append(f"  {n.name} [{kind}] reads {', '.join(n.reads) or '-'} writes "
                     f"{', '.join(n.writes) or '-'}"
                     + (f" uniforms {uniforms}" if uniforms else ""))
    return Diagram("graph of kernels", d.source(), "\n".join(lines), d.nodes)


def _record_state(record) -> str:
    live = "live" if getattr(record, "live", False) else "released"
    kept = ", kept" if getattr(record, "kept", False) else ""
    return f"generation {record.generation}, {live}{kept}, {record.nbytes} bytes"


def record_dot(record, current=None) -> Diagram:
    """A Record: its launch order, the reverse sweep's order, and the planes copied before an
    overwrite, under a title with its generation, whether it is live/kept and its size.

    Reads only ``record.generation``, ``record.nodes`` (node names in launch
    order), ``record.copied`` (plane names), ``record.nbytes``,
    ``record.live`` and ``record.kept``, and, if present,
    ``record.bitwise`` (plane name -> bool).  ``current=("forward"|"reverse",
    i)`` marks the i-th step of that sweep (the Record explorer uses it).

    >>> @vkml.kernel
    ... def square(x):
    ...     return {"u": x * x}
    ...
    >>> g = vkml.Graph().add(square.bind(x=np.ones(3), u=np.zeros(3)), name="square").build(record=True)
    >>> g.launch()
    <vkml.Graph: square>
    >>> print(vkml.viz.record_dot(g.record).text)
    Record generation 1, live, 0 bytes
      launch order: square
      reverse order: square
      copied before an overwrite: -
    """
    names = list(record.nodes)
    copied = list(record.copied)
    bitwise = dict(getattr(record, "bitwise", None) or {})
    d = Dot(label=f"Record: {_record_state(record)}", labelloc="t", fontsize="12")
    for phase, order in (("forward", names), ("reverse", names[::-1])):
        d.open(phase, "launch order" if phase == "forward" else "reverse order",
               bgcolor="#f0f9ff" if phase == "forward" else "#fff7ed")
        prev = None
        for i, n in enumerate(order):
            me = f"{phase} {i}"
            here = current == (phase, i)
            label = n if phase == "forward" else f"reverse of {n}"
            fill = "current" if here else ("launch" if phase == "forward" else "op")
            attrs = {"penwidth": "2.5"} if here else {}
            tip = _defined_at(_node_named(record, n))
            if tip:
                attrs["tooltip"] = tip if phase == "forward" else f"reverse of {tip}"
            d.node(me, label, shape="box", style="rounded,filled" + (",bold" if here else ""),
                   fillcolor=FILL[fill], **attrs)
            if prev is not None:
                d.edge(prev, me, **({} if phase == "forward" else {"style": "dashed"}))
            prev = me
        d.close()
    if names:
        d.edge(f"forward {len(names) - 1}", "reverse 0", label="reverse", style="dotted")
    sizes = {}
    for row in _record_saved_rows(record):
        sizes[row["value"]] = sizes.get(row["value"], 0) + row["bytes"]
    if copied:
        d.open("copied", "copied before an overwrite")
        for p in copied:
            flag = "" if p not in bitwise else ("\nbitwise" if bitwise[p] else "\nnot bitwise")
            size = f"\n{sizes[p]:,} B" if p in sizes else ""
            d.node(f"copy {p}", p + flag + size, shape="note", fillcolor=FILL["copy"])
        d.close()
    lines = [f"Record {_record_state(record)}",
             f"  launch order: {', '.join(names) or '-'}",
             f"  reverse order: {', '.join(names[::-1]) or '-'}",
             f"  copied before an overwrite: {', '.join(copied) or '-'}"]
    if bitwise:
        lines.append("  bitwise: "
                     + ", ".join(f"{p} {'yes' if b else 'no'}" for p, b in bitwise.items()))
    return Diagram("record", d.source(), "\n".join(lines), d.nodes)


# -- dispatch and notebook display -----------------------------------------------------------

def is_graph(obj) -> bool:
    """Whether ``obj`` looks like a graph of kernels (what :func:`graph_dot` reads).

    >>> vkml.viz.is_graph(vkml.Graph()), vkml.viz.is_graph(np.ones(2))
    (True, False)
    """
    nodes = getattr(obj, "nodes", None)
    return isinstance(nodes, (list, tuple)) and all(hasattr(n, "kind") and hasattr(n, "reads")
                                                    for n in nodes) and not is_record(obj)


def is_record(obj) -> bool:
    """Whether ``obj`` looks like a Record (what :func:`record_dot` reads).

    >>> vkml.viz.is_record(vkml.Graph())
    False
    """
    return hasattr(obj, "generation") and hasattr(obj, "copied")


def diagram(obj) -> Diagram:
    """The picture of anything vkml draws: a Program, Tensors (their lazy graph), a jitted function
    (its most recent program), a graph of kernels or a Record.

    >>> x = vkml.tensor([1.0, 2.0])
    >>> vkml.viz.diagram(vkml.sin(x) * 2).kind
    'lazy graph'
    >>> print(vkml.viz.diagram(vkml.program(lambda x: x * 2.0, np.ones(2))).text)
    program (x)
      %3 : float64 [2] at CPU = Map [mul(x0, 2.0)] (x0: float64 [2] at CPU)
        with x0 = x
      return %3
    """
    if isinstance(obj, Diagram):
        return obj
    if isinstance(obj, Program):
        return program_dot(obj)
    if isinstance(obj, Jitted):
        progs = obj.programs()
        if not progs:
            raise ArgumentError(f"diagram: {obj!r} has not been traced yet; call it once, or draw "
                                "vkml.program(f, *args)")
        return program_dot(progs[-1], arg_names=parameter_names(obj))
    if is_record(obj):
        return record_dot(obj)
    if is_graph(obj):
        return graph_dot(obj)
    leaves, _ = flatten(obj)
    if leaves and all(isinstance(t, Tensor) for t in leaves):
        return tensor_dot(obj)
    raise ArgumentError(f"diagram: cannot draw a {type(obj).__name__}; expected a Program, "
                        "Tensors, a jitted function, a Graph or a Record")


def _program_mimebundle(self, include=None, exclude=None):
    return program_dot(self)._repr_mimebundle_(include, exclude)


def _tensor_mimebundle(self, include=None, exclude=None):
    if self.ir_var.value is not None or is_traced(self.ir_var):
        return {"text/plain": repr(self)}
    return tensor_dot(self)._repr_mimebundle_(include, exclude)


def _graph_mimebundle(self, include=None, exclude=None):
    return graph_dot(self)._repr_mimebundle_(include, exclude)


def _record_mimebundle(self, include=None, exclude=None):
    return record_dot(self)._repr_mimebundle_(include, exclude)


def install() -> None:
    """Give Program, Tensor, Graph and Record a ``_repr_mimebundle_``, so they draw themselves
    in a notebook (installed from here: the classes live in layers below the pictures).

    A Program shows its picture (and its printed text).  A pending Tensor
    shows its lazy graph and stays pending; a realized one shows its values.
    ``import vkml`` calls this.

    >>> vkml.viz.install()
    >>> hasattr(vkml.Program, "_repr_mimebundle_")
    True
    """
    Program._repr_mimebundle_ = _program_mimebundle
    Tensor._repr_mimebundle_ = _tensor_mimebundle
    Graph._repr_mimebundle_ = _graph_mimebundle
    Record._repr_mimebundle_ = _record_mimebundle
