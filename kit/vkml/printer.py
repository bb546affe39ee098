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


def _print(prog, numbers, lines, indent):
    def ref(v):
        return f"%{numbers[v]}" if v in numbers else "?"

    def typed(v):
        return f"{ref(v)} : {v.type_str()}"

    lines.append(f"{indent}program ({', '.join(ref(v) for v in prog.inputs)})")
    body = indent + "  "
    uses = {}
    for e in prog.eqns:
        for v in e.inputs:
            uses[v] = uses.get(v, 0) + 1
    for v in prog.outputs:
        uses[v] = uses.get(v, 0) + 1
    producer = {v: e for e in prog.eqns for v in e.outputs}
    const_values = dict(prog.consts)

    def scalar_literal(v):
        """A broadcast scalar constant read once: printed inside the Map as a literal."""
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
                    if scalar_literal(v):
                        absorbed.add(id(p))
    hidden_consts = {p.inputs[0] for p in prog.eqns if id(p) in absorbed
                     and p.prim.name == "broadcast_in_dim"}

    for v, value in prog.consts:
        if v in hidden_consts:
            continue
        shown = literal(value) if np.ndim(value) == 0 else f"const {dtype_name(np.asarray(value).dtype)} {list(np.shape(value))}"
        lines.append(f"{body}{typed(v)} = Map [{shown}] at {v.device}")

    for e in prog.eqns:
        if id(e) in absorbed:
            continue
        lhs = ", ".join(typed(v) for v in e.outputs)
        if e.prim.elementwise:
            leaves = []

            def expr(v):
                p = producer.get(v)
                lit = scalar_literal(v)
                if lit is not None:
                    return lit
                if p is not None and id(p) in absorbed and p.prim.elementwise:
                    return _expr_of(p, expr)
                leaves.append(v)
                return f"x{len(leaves) - 1}"

            text = _expr_of(e, expr)
            kinds = " ".join(f"(x{i}: {v.type_str()})" for i, v in enumerate(leaves))
            lines.append(f"{body}{lhs} = Map [{text}]" + (f" {kinds}" if kinds else ""))
            if leaves:
                lines.append(f"{body}  with " + ", ".join(f"x{i} = {ref(v)}" for i, v in enumerate(leaves)))
        elif e.prim.name in ("reduce_sum", "reduce_max"):
            op = "Sum" if e.prim.name == "reduce_sum" else "Max"
            axes = ", ".join(str(a) for a in e.params["axes"])
            x = e.inputs[0]
            lines.append(f"{body}{lhs} = Reduce [{op} x0] over [{axes}] (x0: {x.type_str()})")
            lines.append(f"{body}  with x0 = {ref(x)}")
        elif e.prim.name == "scan":
            p = e.params
            nc, nk = p["num_consts"], p["num_carry"]
            caps, init, xs = e.inputs[:nc], e.inputs[nc:nc + nk], e.inputs[nc + nk:]
            rev = " reversed" if p["reverse"] else ""
            lines.append(f"{body}{lhs} = scan {p['length']} rows{rev}, init ({_refs(init, ref)}), "
                         f"xs ({_refs(xs, ref)}), captures ({_refs(caps, ref)})")
            lines.append(f"{body}  step")
            _print(p["program"], numbers, lines, body + "    ")
        else:
            params = {k: v for k, v in e.params.items() if not isinstance(v, Program)}
            shown = " [" + ", ".join(f"{k}={_param(v)}" for k, v in params.items()) + "]" if params else ""
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
