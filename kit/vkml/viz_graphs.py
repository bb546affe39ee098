"""``graph_dot`` and ``record_dot``: a graph of kernels, and a recorded launch."""

from __future__ import annotations

import numpy as np

from .ir import dtype_name, format_shape, site_text
from .printer import source_line
from .viz_dot import FILL, Dot
from .viz_render import Diagram
from .viz_residuals import record_saved_rows


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
    for row in record_saved_rows(record):
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
