"""The program explorer: a function's program and its derivative programs, equation by equation.

:func:`explore_program` traces ``f`` at ``args`` and draws its primal
program above the programs a derivation makes from it (one box per
equation, the stacked view of :func:`vkml.viz.derived_dot`).  Clicking an
equation of the primal program -- in the browser, or ``explorer.select(i)``
from Python -- highlights the equations each derived program made from it
(its tangent in ``jvp``, its part of ``known`` and ``linear``, its cotangent
in ``transposed``) and shows the source line it came from.  A control
switches between derivations:

- ``grad``: the jvp of the program with respect to the first argument, split
  into the known part (run forward, saving residuals) and the linear part, and
  the linear part transposed -- what ``vkml.grad`` derives;
- ``jvp``: the forward-mode program with a tangent for every floating
  argument -- what ``vkml.jvp`` derives;
- ``vjp``: as ``grad`` but with respect to every floating argument and for
  any output -- what ``vkml.vjp`` derives;
- ``hessian``: the gradient as one program, and its jvp (forward over
  reverse: what ``vkml.hessian`` maps over a basis of tangents).

The programs are made by the same transforms the derivation runs
(``vkml.transforms``), from this explorer's own trace, so every derived
equation's ``origin`` points at an equation of the primal drawn above it.
The derivation itself is also run once at ``args`` through the public entry
(``vkml.grad(f)(*args)``, ...), and what it cost (``vkml.stats()``:
submissions, compiles, traces, derivations) is shown with the programs'
sizes (equations, values, bytes) and what the gradient keeps.

The browser side is an anywidget (an ES module string): the SVG's equation
boxes carry ``data-panel``, ``data-index`` (the equation's place in its
program, nested programs in order), ``data-root`` (the primal equation it
comes from, -1 for none) and ``data-role``; a click sets the synced
``selected`` and the module toggles the ``vkml-selected`` and
``vkml-counterpart`` classes and fills the readout.  Colours come from
JupyterLab's CSS variables, so the picture follows its dark theme.
"""

from __future__ import annotations

import html
import inspect
import re

import anywidget
import ipywidgets as widgets
import numpy as np
import traitlets

import vkml
from vkml import viz
from vkml.errors import ArgumentError, IndexOutOfRangeError, TracingError, VkmlError
from vkml.ir import Program, dtype_name, format_shape
from vkml.printer import root_of, site_title
from vkml.pytree import flatten, unflatten
from vkml.transforms import jvp_program, partial_eval, transpose_program, vjp_program

from .static import StaticPicture

__all__ = ["explore_program", "ProgramExplorer", "ProgramPicture", "DerivationView",
           "DERIVATIONS"]

#: The derivations the explorer can show, in the control's order.
DERIVATIONS = ("grad", "jvp", "vjp", "hessian")


def explore_program(f, *args, derivation=None):
    """An interactive picture of ``f``'s program at ``args`` and of its derivative programs.

    ``derivation`` is one of :data:`DERIVATIONS` (by default ``grad`` when
    ``f`` returns a floating scalar, else ``vjp``).  Returns a
    :class:`ProgramExplorer` (an ipywidgets ``VBox``): display it and click
    an equation of the primal program, or drive it from Python with
    ``explorer.select(i)`` and ``explorer.derivation.value = "jvp"``.

    >>> from vkml_jupyter.widgets import explore_program
    >>> def f(x):
    ...     return vkml.sum(vkml.sin(x) * x)
    ...
    >>> ex = explore_program(f, np.ones(3))     # a widget; nothing is drawn until displayed
    >>> ex
    ProgramExplorer(f at float64 [3]: grad, 3 primal equations, nothing selected)
    >>> ex.select(0)                            # as clicking the sin box does
    >>> ex.highlighted                          # the equations made from it, per program
    {'jvp': [0, 3, 4], 'known': [0, 3], 'linear': [0], 'transposed': [3, 4]}
    """
    return ProgramExplorer(f, *args, derivation=derivation)


# -- the browser side ----------------------------------------------------------------------------

_ESM = """
function render({ model, el }) {
  el.classList.add("vkml-explorer");
  const readout = document.createElement("div");
  readout.className = "vkml-explorer-readout";
  const picture = document.createElement("div");
  picture.className = "vkml-explorer-picture";
  el.append(readout, picture);

  function paint() {
    const sel = model.get("selected");
    const eqns = model.get("equations");
    const chosen = sel >= 0 && sel < eqns.length;
    el.classList.toggle("vkml-has-selection", chosen);
    for (const g of picture.querySelectorAll("g.vkml-eqn")) {
      const mine = chosen && g.dataset.root === String(sel);
      g.classList.toggle("vkml-selected", mine && g.dataset.panel === "primal");
      g.classList.toggle("vkml-counterpart", mine && g.dataset.panel !== "primal");
    }
    readout.innerHTML = chosen ? eqns[sel].readout : model.get("hint");
  }

  function pick(event) {
    const root = Number(event.currentTarget.dataset.root);
    if (root < 0) return;
    model.set("selected", root);
    model.save_changes();
    paint();
  }

  function draw() {
    picture.innerHTML = model.get("svg");
    for (const g of picture.querySelectorAll("g.vkml-eqn")) {
      g.addEventListener("click", pick);
    }
    paint();
  }

  model.on("change:svg", draw);
  model.on("change:selected", paint);
  model.on("change:equations", paint);
  draw();
  return () => {
    model.off("change:svg", draw);
    model.off("change:selected", paint);
    model.off("change:equations", paint);
  };
}
export default { render };
"""

# JupyterLab's variables (with light fallbacks elsewhere): the page's background and text
# colours reach inside an inline SVG, so the picture follows the theme; boxes keep their light
# fills and dark text.  A box's shapes sit inside the link graphviz makes for its tooltip, hence
# descendant (not child) selectors for the highlight.
_CSS = """
.vkml-explorer { color: var(--jp-ui-font-color1, #111827);
  font-family: var(--jp-ui-font-family, Helvetica, Arial, sans-serif); }
.vkml-explorer-readout { margin: 4px 0 6px; padding: 6px 10px; min-height: 1.4em;
  border-left: 4px solid #f59e0b; background: var(--jp-layout-color2, #f3f4f6);
  color: var(--jp-ui-font-color1, #111827); font-size: var(--jp-ui-font-size1, 13px); }
.vkml-explorer-readout code { font-family: var(--jp-code-font-family, monospace);
  color: var(--jp-content-font-color1, #111827); }
.vkml-explorer-picture { max-height: 720px; overflow: auto;
  background: var(--jp-layout-color0, #ffffff); border: 1px solid var(--jp-border-color2, #e5e7eb); }
.vkml-explorer-picture > svg { max-width: 100%; height: auto; display: block; }
.vkml-explorer g.graph > polygon:first-of-type { fill: var(--jp-layout-color0, #ffffff); }
.vkml-explorer g.graph > text, .vkml-explorer g.edge > text {
  fill: var(--jp-ui-font-color1, #111827); }
.vkml-explorer g.edge > path { stroke: var(--jp-ui-font-color2, #4b5563); }
.vkml-explorer g.edge > polygon { fill: var(--jp-ui-font-color2, #4b5563);
  stroke: var(--jp-ui-font-color2, #4b5563); }
.vkml-explorer g.node text { fill: #111827; }
.vkml-explorer g.vkml-eqn { cursor: pointer; }
.vkml-explorer g.vkml-selected path, .vkml-explorer g.vkml-selected polygon {
  stroke: #f59e0b; stroke-width: 6px; }
.vkml-explorer g.vkml-counterpart path, .vkml-explorer g.vkml-counterpart polygon {
  stroke: #f59e0b; stroke-width: 5px; stroke-dasharray: 8 3; }
.vkml-explorer.vkml-has-selection g.vkml-eqn:not(.vkml-selected):not(.vkml-counterpart) {
  opacity: 0.35; }
"""


class ProgramPicture(anywidget.AnyWidget):
    """The clickable picture: ``svg`` (the stacked programs), ``equations`` (one entry per
    primal equation, with its ``readout`` HTML), ``hint`` (the readout while nothing is
    selected) and ``selected`` (the primal equation's index, -1 for none), all synced."""

    _esm = _ESM
    _css = _CSS
    svg = traitlets.Unicode("").tag(sync=True)
    equations = traitlets.List([]).tag(sync=True)
    hint = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)


# -- the programs of one derivation --------------------------------------------------------------

def _walk(prog):
    """``prog``'s equations, each followed by those of the programs nested in it (the order the
    pictures and ``data-index`` number them)."""
    for e in prog.eqns:
        yield e
        for p in e.params.values():
            if isinstance(p, Program):
                yield from _walk(p)


def _nbytes(v) -> int:
    return int(np.dtype(v.dtype).itemsize * np.prod(v.shape, dtype=np.int64))


def _type(v) -> str:
    return f"{dtype_name(v.dtype)} {format_shape(v.shape)}"


def _vjp_panels(prog, flags):
    """What ``vkml.grad``/``vkml.vjp`` derive: jvp, its known and linear parts, the transpose."""
    n_in, n_t = len(prog.inputs), sum(flags)
    jvp = jvp_program(prog, flags)
    known, linear, out_unknown = partial_eval(jvp, [False] * n_in + [True] * n_t)
    n_res = len(known.outputs) - sum(1 for u in out_unknown if not u)
    transposed = transpose_program(linear, [False] * n_res + [True] * n_t)
    return {"jvp": jvp, "known": known, "linear": linear, "transposed": transposed}


def _hessian_panels(prog, flags):
    """The gradient as one program, and its jvp with respect to the same inputs."""
    wrt = [i for i, f in enumerate(flags) if f]
    gradient = vjp_program(prog, wrt)
    n_extra = len(gradient.inputs) - len(prog.inputs)
    return {"gradient": gradient, "hessian": jvp_program(gradient, list(flags) + [False] * n_extra)}


def _ones_like(tree):
    leaves, structure = flatten(tree)
    return unflatten(structure, [np.ones(np.shape(x), dtype=np.float64) for x in leaves])


def _run(derivation, f, args):
    """Run the derivation once at ``args`` through vkml's public entry; returns its result."""
    if derivation == "grad":
        return vkml.grad(f)(*args)
    if derivation == "jvp":
        return vkml.jvp(f, args, _ones_like(args))
    if derivation == "vjp":
        out, pullback = vkml.vjp(f, *args)
        return out, pullback(_ones_like(out))
    return vkml.hessian(f)(*args)


def _realized(result):
    """Every leaf of ``result`` computed as an array (so its submissions are counted)."""
    leaves, structure = flatten(result)
    return unflatten(structure, [np.asarray(t.numpy() if hasattr(t, "numpy") else t)
                                 for t in leaves])


_BOX_CLASS = re.compile(r'class="node vkml_eqn p_(\w+) i_(\d+) r_(-?\d+) o_(\w+)"')


def _data_attributes(svg: str) -> str:
    """The explorer's class tokens on equation boxes, rewritten as data attributes."""
    return _BOX_CLASS.sub(lambda m: f'class="node vkml-eqn" data-panel="{m[1]}" '
                          f'data-index="{m[2]}" data-root="{m[3]}" data-role="{m[4]}"', svg)


class DerivationView:
    """One derivation of a primal program: its panels, which equations came from which primal
    equation, the picture, the sizes, what running it cost (``stats``) and gave (``result``:
    the derivation's value as NumPy arrays, e.g. the gradient).

    ``panels`` is ``[(name, Program)]``, the primal first; ``roots[name]`` lists, for each
    equation of that panel (in :func:`_walk` order), the index of the primal equation it comes
    from (-1 for none) and ``roles[name]`` its role (primal, tangent, cotangent).
    """

    def __init__(self, name, primal, derived, arg_names, stats=None, result=None):
        self.name = name
        self.panels = [("primal", primal)] + [(k, derived[k]) for k in self._order(derived)]
        self.eqns = {panel: list(_walk(prog)) for panel, prog in self.panels}
        self._index = {id(e): i for i, e in enumerate(self.eqns["primal"])}
        self.roots, self.roles, where = {}, {}, {}
        for panel, eqns in self.eqns.items():
            origins = [root_of(e) for e in eqns]
            self.roots[panel] = [self._index.get(id(root), -1) for root, _ in origins]
            self.roles[panel] = [role for _, role in origins]
            where.update({(panel, id(e)): i for i, e in enumerate(eqns)})

        def box_class(panel, e):
            i = where[panel, id(e)]
            return f"vkml_eqn p_{panel} i_{i} r_{self.roots[panel][i]} o_{self.roles[panel][i]}"

        self.diagram = viz.derived_dot(primal, derived, unfold=True, arg_names=arg_names,
                                       fused=False, box_class=box_class)
        self.stats = stats
        self.result = result
        self.result_types = [f"{dtype_name(a.dtype)} {format_shape(a.shape)}"
                             for a in flatten(result)[0]]
        self._svg = None

    @staticmethod
    def _order(derived):
        order = [k for k in viz.DERIVED_ORDER if k in derived]
        return order + sorted(k for k in derived if k not in viz.DERIVED_ORDER)

    @property
    def svg(self) -> str:
        """The stacked picture with data attributes on its equation boxes (rendered once); its
        text in a ``<pre>`` when graphviz is missing or the picture is too large to draw."""
        if self._svg is None:
            bundle = self.diagram._repr_mimebundle_()
            if "image/svg+xml" in bundle:
                self._svg = _data_attributes(bundle["image/svg+xml"])
            else:
                self._svg = f"<pre>{html.escape(bundle['text/plain'])}</pre>"
        return self._svg

    def counterparts(self, i):
        """``{panel: [equation index]}``: the derived equations made from primal equation ``i``."""
        return {panel: [k for k, r in enumerate(self.roots[panel]) if r == i]
                for panel, _ in self.panels[1:]}

    def saved_by(self, i):
        """The residuals (values the known part keeps for the backward) primal equation ``i``
        made, as ``(count, bytes)``."""
        known = dict(self.panels).get("known")
        residuals = self.diagram.residuals
        if known is None or residuals is None or not len(residuals):
            return 0, 0
        saved = [v for v in known.outputs[len(known.outputs) - len(residuals):]
                 if v.eqn is not None and self._index.get(id(root_of(v.eqn)[0])) == i]
        return len(saved), sum(_nbytes(v) for v in saved)

    def readout(self, i) -> str:
        """The readout HTML of primal equation ``i``: its op, source line and counterparts."""
        e = self.eqns["primal"][i]
        title = site_title(e) or "(no source line recorded)"
        outs = ", ".join(_type(v) for v in e.outputs)
        rows = [f"<b>equation {i}</b> of {len(self.eqns['primal'])}: "
                f"<code>{html.escape(e.prim.name)}</code> &rarr; {html.escape(outs)}",
                f"<span class='vkml-source'>{html.escape(title)}</span>"]
        parts = []
        for panel, ks in self.counterparts(i).items():
            ops = ", ".join(self.eqns[panel][k].prim.name for k in ks)
            roles = sorted({self.roles[panel][k] for k in ks})
            parts.append(f"{panel}: {len(ks)}" + (f" ({html.escape(ops)}; "
                                                  f"{'/'.join(roles)})" if ks else ""))
        rows.append("made from it: " + "; ".join(parts))
        count, nbytes = self.saved_by(i)
        if count:
            rows.append(f"kept for the backward: {count} value{'s' * (count != 1)}, "
                        f"{nbytes:,} bytes")
        return "<br>".join(rows)

    def sizes(self):
        """One row per panel: its inputs, equations, values made and their bytes."""
        rows = []
        for panel, prog in self.panels:
            made = [v for e in self.eqns[panel] for v in e.outputs]
            rows.append({"program": panel, "inputs": len(prog.inputs),
                         "equations": len(self.eqns[panel]), "values": len(made),
                         "bytes": sum(_nbytes(v) for v in made)})
        return rows


# -- the widget ----------------------------------------------------------------------------------

def _arg_names(fn, n):
    """``fn``'s parameter names when it takes exactly ``n`` plain positional ones (else None)."""
    try:
        params = list(inspect.signature(getattr(fn, "fn", fn)).parameters.values())
    except (TypeError, ValueError):
        return None
    plain = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    return [p.name for p in params] if plain and len(params) == n else None


def _float_flags(prog, arg_leaves, only_first):
    """Which program inputs a derivation differentiates: floating argument leaves (only the
    first argument's for grad and hessian); captured values never."""
    flags = [False] * len(prog.inputs)
    for k, leaves in enumerate(arg_leaves):
        if only_first and k:
            break
        for j in leaves:
            flags[j] = prog.inputs[j].dtype.kind == "f"
    return flags


class ProgramExplorer(StaticPicture, widgets.VBox):
    """The widget :func:`explore_program` returns.

    Controls: ``derivation`` (ToggleButtons), ``sizes`` (HTML: the programs' sizes and what the
    derivation's run cost), ``picture`` (the clickable :class:`ProgramPicture`).  From Python:
    :meth:`select`, ``selected``, ``highlighted`` (the selected equation's counterparts),
    ``readout``, ``svg``, ``view`` (the current :class:`DerivationView`) and ``primal``.

    >>> from vkml_jupyter.widgets import ProgramExplorer
    >>> def f(x):
    ...     return vkml.sum(vkml.sin(x) * x)
    ...
    >>> ex = ProgramExplorer(f, np.ones(3), derivation="jvp")
    >>> ex
    ProgramExplorer(f at float64 [3]: jvp, 3 primal equations, nothing selected)
    >>> ex.derivation.value = "grad"            # as the control does
    >>> [panel for panel, _ in ex.view.panels]
    ['primal', 'jvp', 'known', 'linear', 'transposed']
    """

    def __init__(self, f, *args, derivation=None):
        if not callable(f):
            raise ArgumentError(f"explore_program: f must be a function, got {type(f).__name__}")
        if not args:
            raise ArgumentError("explore_program: give the arguments to trace f at, "
                                "e.g. explore_program(f, np.ones(3))")
        self.f, self.args = f, args
        self.name = getattr(f, "__name__", type(f).__name__)
        try:
            self.primal = vkml.program(f, *args)
        except VkmlError:
            raise
        except Exception as err:   # the user's function failed while being traced
            raise TracingError(f"explore_program: tracing {self.name} at the given arguments "
                               f"failed with {type(err).__name__}: {err}") from err
        start = 0
        self._arg_leaves = []
        for a in args:
            n = len(flatten(a)[0])
            self._arg_leaves.append(list(range(start, start + n)))
            start += n
        self._arg_names = _arg_names(f, len(self.primal.inputs))
        out = self.primal.outputs
        scalar = len(out) == 1 and out[0].shape == () and out[0].dtype.kind == "f"
        derivation = derivation if derivation is not None else ("grad" if scalar else "vjp")
        self._check_derivation(derivation)
        self._views = {}
        view = self._derive(derivation)      # refuses bad input before any widget is made
        self.derivation = widgets.ToggleButtons(options=list(DERIVATIONS), value=derivation,
                                                description="derivation")
        self.sizes = widgets.HTML()
        self.picture = ProgramPicture(hint=self._hint())
        super().__init__([self.derivation, self.sizes, self.picture])
        self._show(view)
        self.derivation.observe(self._on_derivation, names="value")

    # -- derivations

    @staticmethod
    def _check_derivation(name):
        if not isinstance(name, str) or name not in DERIVATIONS:
            raise ArgumentError(f"explore_program: derivation must be one of "
                                f"{', '.join(DERIVATIONS)}, got {name!r:.60}")

    def _derive(self, name) -> DerivationView:
        """The view of derivation ``name``: run once at the arguments, its programs derived."""
        view = self._views.get(name)
        if view is not None:
            return view
        flags = _float_flags(self.primal, self._arg_leaves, name in ("grad", "hessian"))
        if not any(flags):
            raise ArgumentError(f"explore_program: {name} of {self.name} has no floating "
                                "argument to differentiate")
        before = vkml.stats()
        result = _realized(_run(name, self.f, self.args))
        cost = vkml.stats() - before
        panels = _hessian_panels if name == "hessian" else (
            (lambda p, fl: {"jvp": jvp_program(p, fl)}) if name == "jvp" else _vjp_panels)
        view = DerivationView(name, self.primal, panels(self.primal, flags), self._arg_names,
                              cost, result)
        self._views[name] = view
        return view

    def _on_derivation(self, change):
        try:
            view = self._derive(change["new"])
        except VkmlError as err:   # e.g. grad of a function with a non-scalar result
            self.derivation.unobserve(self._on_derivation, names="value")
            self.derivation.value = change["old"]
            self.derivation.observe(self._on_derivation, names="value")
            self._show(self.view, problem=f"{change['new']} does not apply here: {err}")
            return
        self._show(view)

    @property
    def view(self) -> DerivationView:
        """The :class:`DerivationView` of the derivation the control shows.

        >>> from vkml_jupyter.widgets import explore_program
        >>> def f(x):
        ...     return vkml.sum(vkml.sin(x) * x)
        ...
        >>> ex = explore_program(f, np.ones(3))
        >>> ex.view.name, [e.prim.name for e in ex.view.eqns["primal"]]
        ('grad', ['sin', 'mul', 'reduce_sum'])
        """
        return self._views[self.derivation.value]

    def _hint(self):
        return (f"Click an equation of the primal program (or call <code>select(i)</code>) to "
                f"see the equations made from it and its source line; "
                f"{len(list(_walk(self.primal)))} primal equations.")

    def _show(self, view, problem=None):
        picture = self.picture
        with picture.hold_sync():
            picture.svg = view.svg
            picture.equations = [{"index": i, "op": e.prim.name, "readout": view.readout(i)}
                                 for i, e in enumerate(view.eqns["primal"])]
        self.sizes.value = self._sizes_html(view, problem)

    def _sizes_html(self, view, problem=None):
        head = "".join(f"<th>{c}</th>" for c in ("program", "inputs", "equations", "values",
                                                   "bytes"))
        body = "".join("<tr>" + "".join(
            f"<td>{r[c]:,}</td>" if c != "program" else f"<td>{r[c]}</td>"
            for c in ("program", "inputs", "equations", "values", "bytes")) + "</tr>"
            for r in view.sizes())
        rows = [f"<table class='vkml-sizes'><tr>{head}</tr>{body}</table>"]
        kept = view.diagram.residuals
        if kept is not None:
            rows.append(f"kept for the backward: {len(kept)} value{'s' * (len(kept) != 1)}, "
                        f"{kept.total:,} bytes")
        s = view.stats
        rows.append(f"running {view.name} once at these arguments: {s.submissions} "
                    f"submission{'s' * (s.submissions != 1)}, {s.compiles} "
                    f"compile{'s' * (s.compiles != 1)}, {s.traces} trace{'s' * (s.traces != 1)}, "
                    f"{s.derivations} derivation{'s' * (s.derivations != 1)}; result "
                    + html.escape(", ".join(view.result_types)))
        if problem:
            rows.append(f"<span class='vkml-problem'>{html.escape(problem)}</span>")
        return "<div class='vkml-readout'>" + "<br>".join(rows) + "</div>"

    # -- selection

    def select(self, i):
        """Select primal equation ``i`` (as clicking it does); ``None`` clears the selection.

        >>> from vkml_jupyter.widgets import explore_program
        >>> def f(x):
        ...     return vkml.sum(vkml.sin(x) * x)
        ...
        >>> ex = explore_program(f, np.ones(3))
        >>> ex.select(1)
        >>> ex.selected
        1
        >>> ex.select(None)
        >>> ex.selected is None
        True
        """
        if i is None:
            self.picture.selected = -1
            return
        n = len(self.view.eqns["primal"])
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ArgumentError(f"ProgramExplorer.select: the equation must be an index, got "
                                f"{type(i).__name__}")
        if not 0 <= i < n:
            raise IndexOutOfRangeError(f"ProgramExplorer.select: equation {i} is out of range; "
                                       f"the primal program of {self.name} has {n} equations "
                                       f"(0 to {n - 1})")
        self.picture.selected = int(i)

    @property
    def selected(self):
        """The selected primal equation's index, or None.

        >>> from vkml_jupyter.widgets import explore_program
        >>> def f(x):
        ...     return vkml.sum(vkml.sin(x) * x)
        ...
        >>> ex = explore_program(f, np.ones(3))
        >>> ex.selected is None
        True
        >>> ex.select(2)
        >>> ex.selected
        2
        """
        return None if self.picture.selected < 0 else self.picture.selected

    @property
    def highlighted(self):
        """``{panel: [equation index]}`` of the selected equation's counterparts ({} if none).

        >>> from vkml_jupyter.widgets import explore_program
        >>> def f(x):
        ...     return vkml.sum(vkml.sin(x) * x)
        ...
        >>> ex = explore_program(f, np.ones(3))
        >>> ex.highlighted
        {}
        >>> ex.select(0)                            # sin: its tangent needs a cos
        >>> ex.highlighted["jvp"], [ex.view.eqns["jvp"][i].prim.name for i in ex.highlighted["jvp"]]
        ([0, 3, 4], ['sin', 'cos', 'mul'])
        """
        return {} if self.selected is None else self.view.counterparts(self.selected)

    @property
    def readout(self) -> str:
        """The readout's HTML: the selected equation's, else the hint.

        >>> from vkml_jupyter.widgets import explore_program
        >>> def f(x):
        ...     return vkml.sum(vkml.sin(x) * x)
        ...
        >>> ex = explore_program(f, np.ones(3))
        >>> ex.readout.startswith("Click an equation")
        True
        >>> ex.select(0)
        >>> ex.readout.startswith("<b>equation 0</b> of 3: <code>sin</code>")
        True
        """
        return self.picture.hint if self.selected is None else self.view.readout(self.selected)

    @property
    def svg(self) -> str:
        """The current picture (SVG text with the equation boxes' data attributes).

        >>> from vkml_jupyter.widgets import explore_program
        >>> def f(x):
        ...     return vkml.sum(vkml.sin(x) * x)
        ...
        >>> ex = explore_program(f, np.ones(3))
        >>> "data-panel" in ex.svg or ex.svg.startswith("<pre>")   # a <pre> without graphviz
        True
        """
        return self.view.svg

    def static_picture(self):
        """The stacked programs as they are now (SVG): what a reader sees without a kernel.

        >>> ex = vkml.widgets.explore_program(lambda x: vkml.sum(vkml.sin(x)), np.ones(2))
        >>> ex.static_picture()[0]
        'image/svg+xml'
        """
        svg = self.picture.svg
        return ("image/svg+xml", svg) if "<svg" in svg[:2000] else None

    def __repr__(self):
        at = ", ".join(_type(v) for v in self.primal.inputs)
        sel = "nothing" if self.selected is None else f"equation {self.selected}"
        n = len(self.view.eqns["primal"])
        return (f"ProgramExplorer({self.name} at {at}: {self.derivation.value}, "
                f"{n} primal equation{'s' * (n != 1)}, {sel} selected)")
