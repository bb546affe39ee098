"""Programs as text, in the style of rune's ``pp_program``.

::

    program (%0)
      %1 : float64 [] at CPU = Map [float64:0x0000000000000000] at CPU
      %2 : float64 [] at CPU, %3 : float64 [3] at CPU = scan 3 rows, init (%1), xs (%0), captures ()
        step
          program (%6, %7)
            %8 : float64 [] at CPU = Map [add(x0, x1)] (x0: float64 [] at CPU) (x1: float64 [] at CPU)
              with x0 = %6, x1 = %7
            return %8, %8
      ...
      return %5

Every value is numbered (%n) with its type and placement.  Chains of
elementwise equations print as ONE fused ``Map`` with its expression, which
is how a backend runs them; a reduction prints as ``Reduce``; a scan prints
its nested step program.  Numbers are given to a program's own values
first, then to nested programs, so a step's numbers follow its parent's.
"""

from __future__ import annotations

import numpy as np

from .ir import Program, dtype_name


def pp_program(prog: Program) -> str:
    numbers = {}
    _number(prog, numbers)
    lines = []
    _print(prog, numbers, lines, indent="")
    return "\n".join(lines)


def _number(prog, numbers):
    for v in prog.inputs:
        numbers.setdefault(v, len(numbers))
    for v, _ in prog.consts:
        numbers.setdefault(v, len(numbers))
    for e in prog.eqns:
        for v in e.outputs:
            numbers.setdefault(v, len(numbers))
    for e in prog.eqns:
        for p in _nested(e):
            _number(p, numbers)


def _nested(eqn):
    return [v for v in eqn.params.values() if isinstance(v, Program)]


def literal(value) -> str:
    """A constant as its dtype and bit pattern: exact, and the same on every machine."""
    a = np.asarray(value)
    name = dtype_name(a.dtype)
    if a.dtype.kind == "b":
        return f"{name}:{'true' if bool(a) else 'false'}"
    if a.dtype.kind == "f":
        bits = a.view(np.uint64 if a.dtype.itemsize == 8 else np.uint32)
        return f"{name}:0x{int(bits):0{a.dtype.itemsize * 2}x}"
    return f"{name}:{int(a)}"


def fused_view(prog):
    """What a reader sees of ``prog``: the constants shown, and its boxes.

    Chains of elementwise equations whose intermediate values are read once
    become ONE ``Map`` with its expression (a broadcast scalar constant read
    once appears inside as a literal), as a backend runs them.  Returns
    ``(consts, boxes)`` where a box is ``(eqn, kind, text, reads)``; the
    printer and ``vkml.viz`` both draw from it.
    """
    uses = {}
    for e in prog.eqns:
        for v in e.inputs:
            uses[v] = uses.get(v, 0) + 1
    for v in prog.outputs:
        uses[v] = uses.get(v, 0) + 1
    producer = {v: e for e in prog.eqns for v in e.outputs}
    const_values = dict(prog.consts)

    def scalar_literal(v):
        e = producer.get(v)
        if e is not None and e.prim.name == "broadcast_in_dim" and uses.get(v) == 1:
            src = e.inputs[0]
            if src.shape == () and src in const_values and uses.get(src) == 1:
                return literal(const_values[src])
        return None

    absorbed = set()
    for e in prog.eqns:
        if e.prim.elementwise:
            for v in e.inputs:
                p = producer.get(v)
                if p is not None and uses.get(v) == 1 and (p.prim.elementwise or scalar_literal(v)):
                    absorbed.add(id(p))
    hidden = {p.inputs[0] for p in prog.eqns
              if id(p) in absorbed and p.prim.name == "broadcast_in_dim"}
    consts = [(v, value) for v, value in prog.consts if v not in hidden]
    boxes = []
    for e in prog.eqns:
        if id(e) in absorbed:
            continue
        if e.prim.elementwise:
            reads = []

            def expr(v):
                lit = scalar_literal(v)
                if lit is not None:
                    return lit
                p = producer.get(v)
                if p is not None and id(p) in absorbed and p.prim.elementwise:
                    return _expr_of(p, expr)
                reads.append(v)
                return f"x{len(reads) - 1}"

            boxes.append((e, "Map", _expr_of(e, expr), reads))
        elif e.prim.name in ("reduce_sum", "reduce_max"):
            op = "Sum" if e.prim.name == "reduce_sum" else "Max"
            axes = ", ".join(str(a) for a in e.params["axes"])
            boxes.append((e, "Reduce", f"{op} over [{axes}]", list(e.inputs)))
        elif e.prim.name == "scan":
            p = e.params
            text = f"{p['length']} rows" + (" reversed" if p["reverse"] else "")
            boxes.append((e, "scan", text, list(e.inputs)))
        else:
            params = {k: v for k, v in e.params.items() if not isinstance(v, Program)}
            text = ", ".join(f"{k}={_param(v)}" for k, v in params.items())
            boxes.append((e, e.prim.name, text, list(e.inputs)))
    return consts, boxes


def _print(prog, numbers, lines, indent):
    def ref(v):
        return f"%{numbers[v]}" if v in numbers else "?"

    def typed(v):
        return f"{ref(v)} : {v.type_str()}"

    lines.append(f"{indent}program ({', '.join(ref(v) for v in prog.inputs)})")
    body = indent + "  "
    consts, boxes = fused_view(prog)
    for v, value in consts:
        shown = literal(value) if np.ndim(value) == 0 else \
            f"const {dtype_name(np.asarray(value).dtype)} {list(np.shape(value))}"
        lines.append(f"{body}{typed(v)} = Map [{shown}] at {v.device}")
    for e, kind, text, reads in boxes:
        lhs = ", ".join(typed(v) for v in e.outputs)
        if kind == "Map":
            kinds = " ".join(f"(x{i}: {v.type_str()})" for i, v in enumerate(reads))
            lines.append(f"{body}{lhs} = Map [{text}]" + (f" {kinds}" if kinds else ""))
            if reads:
                lines.append(f"{body}  with " + ", ".join(f"x{i} = {ref(v)}" for i, v in enumerate(reads)))
        elif kind == "Reduce":
            op, over = text.split(" over ")
            x = e.inputs[0]
            lines.append(f"{body}{lhs} = Reduce [{op} x0] over {over} (x0: {x.type_str()})")
            lines.append(f"{body}  with x0 = {ref(x)}")
        elif kind == "scan":
            p = e.params
            nc, nk = p["num_consts"], p["num_carry"]
            caps, init, xs = e.inputs[:nc], e.inputs[nc:nc + nk], e.inputs[nc + nk:]
            lines.append(f"{body}{lhs} = scan {text}, init ({_refs(init, ref)}), "
                         f"xs ({_refs(xs, ref)}), captures ({_refs(caps, ref)})")
            lines.append(f"{body}  step")
            _print(p["program"], numbers, lines, body + "    ")
        else:
            shown = f" [{text}]" if text else ""
            lines.append(f"{body}{lhs} = {e.prim.name}{shown} ({_refs(e.inputs, ref)})")
            for p in _nested(e):
                lines.append(f"{body}  program")
                _print(p, numbers, lines, body + "    ")
    lines.append(f"{body}return {_refs(prog.outputs, ref)}")


def _expr_of(eqn, expr):
    args = ", ".join(expr(v) for v in eqn.inputs)
    if eqn.prim.name == "cast":
        return f"cast<{dtype_name(eqn.params['dtype'])}>({args})"
    return f"{eqn.prim.name}({args})"


def _refs(vs, ref):
    return ", ".join(ref(v) for v in vs)


def _param(v):
    if isinstance(v, np.dtype):
        return v.name
    if isinstance(v, tuple):
        return "(" + ", ".join(str(x) for x in v) + ")" if len(v) != 1 else f"({v[0]},)"
    return str(v)
