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

The pictures are drawn in modules of their own, lowest first: ``viz_dot`` (DOT building
blocks), ``viz_groups`` (a big program by the structure of the user's code), ``viz_render``
(``Diagram``), ``viz_residuals``, ``viz_programs``, ``viz_diff``, ``viz_lazy``, ``viz_graphs``,
``viz_schedule``; this module gathers their public names and dispatches on what it is given.
"""

from __future__ import annotations

from .errors import ArgumentError
from .ir import Program
from .graph.graph import Graph
from .graph.record import Record
from .programs import Jitted
from .pytree import flatten
from .runtime import is_traced
from .tensor import Tensor
from .viz_diff import diff
from .viz_dot import FILL  # noqa: F401  (the fill of a plain box, for pictures drawn elsewhere)
from .viz_graphs import graph_dot, record_dot
from .viz_lazy import tensor_dot
from .viz_programs import DERIVED_ORDER, DerivedDiagram, derived_dot, derived_pairs, program_dot
from .viz_render import (FOLD_BOXES, MAX_NODES, SVG_STYLE, Diagram, dot_available, inline_html,
                         is_graph, is_record, parameter_names, tabs_html)
from .viz_residuals import Residuals, saved_residuals
from .viz_schedule import checkpoint_schedule

__all__ = ["Diagram", "DerivedDiagram", "diagram", "program_dot", "tensor_dot", "derived_dot",
           "graph_dot", "record_dot", "dot_available", "install", "is_graph", "is_record",
           "derived_pairs", "saved_residuals", "Residuals", "diff", "parameter_names",
           "checkpoint_schedule", "DERIVED_ORDER", "inline_html", "tabs_html", "MAX_NODES",
           "FOLD_BOXES", "SVG_STYLE", "FILL"]


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
