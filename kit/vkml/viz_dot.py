"""The DOT writer every vkml picture is drawn with, and the look they share.

Small and deterministic: statements are kept in order, so the same picture gives the same DOT
source and (through ``viz.Diagram``) the same SVG bytes.  The fills, palette and fonts are shared
by the program, lazy-graph, Graph and Record pictures, so one colour means one thing in all of
them (each picture's legend says which).
"""

from __future__ import annotations

import html

from .ir import Program, Var, dtype_name, format_shape
from .printer import format_param

#: A program picture is scaled down to this width in inches (graphviz ``size``): 10.4 in is
#: 749 pt, just under 1,000 px, so it fits a notebook's output area without a scroll bar.
MAX_WIDTH_IN = 10.4
#: Colours marking which user equation each derived equation comes from (cycled).
PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2",
           "#65a30d", "#9333ea", "#ea580c")

FONT = "Helvetica,Arial,sans-serif"
FILL = {  # one colour per kind of box, shared by every picture
    "input": "#dbeafe", "const": "#f3f4f6", "value": "#ffffff", "output": "#dcfce7",
    "grad": "#fed7aa", "realized": "#bbf7d0", "placeholder": "#e5e7eb",
    "Map": "#fef9c3", "Reduce": "#fde68a", "scan": "#e9d5ff", "op": "#e5e7eb",
    "launch": "#e0f2fe", "skippable": "#fef3c7", "repeat_while": "#ede9fe", "opaque": "#d1d5db",
    "reduce": "#fde68a", "plane": "#ffffff", "copy": "#fee2e2", "current": "#fecaca",
    "folded": "#f5f3ff", "saved": "#fecdd3", "added": "#bbf7d0", "removed": "#fecaca",
    "changed": "#fef08a",
}

class Dot:
    """A small DOT writer: statements are kept in order, so the source is deterministic."""

    def __init__(self, **graph_attrs):
        self.lines = []
        self.nodes = 0
        self.last_node = None
        self._depth = 1
        attrs = dict(fontname=FONT, fontsize="10", nodesep="0.25", ranksep="0.3", compound="true",
                     size=f"{MAX_WIDTH_IN},1000")   # scaled down to the output width, never up
        attrs.update(graph_attrs)
        attrs = {k: v for k, v in attrs.items() if v is not None}   # (size=None: never scaled)
        self.lines.append(f"  graph [{dot_attrs(attrs)}]")
        node = dict(fontname=FONT, fontsize="10", style="filled", fillcolor="#ffffff")
        self.lines.append(f"  node [{dot_attrs(node)}]")
        self.lines.append(f"  edge [{dot_attrs(dict(fontname=FONT, fontsize='9', color='#4b5563'))}]")

    def _put(self, text):
        self.lines.append("  " * self._depth + text)

    def node(self, name, label, **attrs):
        self.nodes += 1
        self.last_node = name
        self._put(f"{quote(name)} [{dot_attrs(dict(label=label, **attrs))}]")

    def edge(self, a, b, **attrs):
        self._put(f"{quote(a)} -> {quote(b)}" + (f" [{dot_attrs(attrs)}]" if attrs else ""))

    def open(self, name, label, **attrs):
        """Start a cluster (a box around a nested program)."""
        self._put(f"subgraph {quote('cluster_' + name)} {{")
        self._depth += 1
        attrs = dict(label=label, style="rounded,dashed", color="#6b7280", **attrs)
        self._put(f"graph [{dot_attrs(attrs)}]")

    def close(self):
        self._depth -= 1
        self._put("}")

    def source(self) -> str:
        return "digraph vkml {\n" + "\n".join(self.lines) + "\n}\n"


def quote(text) -> str:
    text = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def dot_attrs(attrs) -> str:
    return ", ".join(f"{k}=<{v}>" if isinstance(v, HtmlLabel) else f"{k}={quote(v)}"
                     for k, v in attrs.items())


def type_text(v: Var) -> str:
    where = "" if v.device == "CPU" else f" at {v.device}"
    return f"{dtype_name(v.dtype)} {format_shape(v.shape)}{where}"


def short(text, limit=48) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def params_text(params) -> str:
    shown = [f"{k}={format_param(v)}" for k, v in params.items() if not isinstance(v, Program)]
    return short(", ".join(shown)) if shown else ""


class HtmlLabel(str):
    """A graphviz HTML-like label: written as ``<...>``, not quoted."""


def html_label(text, colours) -> HtmlLabel:
    """``text``'s lines and one coloured square per user equation fused into the box."""
    lines = "<BR/>".join(html.escape(line) for line in text.split("\n"))
    dots = " ".join(f'<FONT COLOR="{c}">&#9632;</FONT>' for c in colours)
    return HtmlLabel(f"{lines}<BR/>{dots}")
