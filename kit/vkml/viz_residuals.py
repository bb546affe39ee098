"""What a gradient keeps from its forward pass, as a table (``saved_residuals``): a function's
residuals, a pending backward's realized values, a Record's copies."""

from __future__ import annotations

import html

import numpy as np

from .errors import ArgumentError
from .ir import collect, dtype_name, format_shape
from .printer import site_title
from .programs import Jitted, jit
from .programs.derivatives import gradient_residuals
from .tensor import Tensor
from .viz_render import is_record, names_of, parameter_names


def nbytes(v) -> int:
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


def residual_rows(vars_, prog=None, arg_names=None):
    names = names_of(prog, arg_names) if prog is not None else {}
    return [{"value": names.get(v, "?"), "dtype": dtype_name(v.dtype),
             "shape": format_shape(v.shape), "bytes": nbytes(v), "made by": _made_by(v, prog)}
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
    rows = residual_rows(saved, known, parameter_names(fn))
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
                             "shape": format_shape(v.shape), "bytes": nbytes(v),
                             "made by": _made_by(v)})
    return Residuals("pending backward of a tensor", rows)


def record_saved_rows(record):
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
    rows = record_saved_rows(record)
    extra = int(getattr(record, "nbytes", 0)) - sum(r["bytes"] for r in rows)
    if extra > 0:
        rows.append({"value": "checkpoints and kept planes", "dtype": "-", "shape": "-",
                     "bytes": extra, "made by": "repeat_while checkpoints / keep()"})
    return Residuals(f"Record of generation {record.generation}", rows)
