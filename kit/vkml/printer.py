"""Programs as text: one line per equation, each value with its type, nested programs indented.

::

    program (%0)
      %1 : float64 [] at CPU = Map [0.0] at CPU
      %2 : float64 [] at CPU, sums : float64 [3] at CPU = scan 3 rows, init (%1), xs (%0), captures ()
        step
          program (%6, %7)
            nxt : float64 [] at CPU = Map [add(x0, x1)] (x0: float64 [] at CPU) (x1: float64 [] at CPU)
              with x0 = %6, x1 = %7
            return nxt, nxt
      ...
      return %5

Every value is numbered (%n) with its type and placement; a value that
leaves the user's source line that made it (``sums = ...``) is shown under
the name it was given there (``h``, or ``h_1`` if that name is taken), and
values of a derived program under the name of the user's line they come
from (``dh`` for a tangent, ``ct_h`` for a cotangent).  Constants print in
the shortest decimal form that reads back to the same number (the dtype is
added when it is not float64, int64 or bool); ``bits=True`` prints them as
exact bit patterns instead.  Chains of elementwise equations print as ONE
fused ``Map`` with its expression, which is how a backend runs them; a
reduction prints as ``Reduce``; a scan prints its nested step program.
Numbers are given to a program's own values first, then to nested
programs, so a step's numbers follow its parent's.
"""

from __future__ import annotations

import linecache
import re

import numpy as np

from .errors import ArgumentError
from .ir import Program, dtype_name, site_text


def pp_program(prog: Program, bits: bool = False, names: bool = True, arg_names=None) -> str:
    """``prog`` as text.  ``bits=True``: constants as exact bit patterns (``float64:0x3fb9...``);
    ``names=False``: every value as its number ``%n``; ``arg_names``: names for the inputs (by
    default a traced function's own: each leaf by its path, ``p['W1']``).

    >>> prog = vkml.program(lambda x: x * 0.1, np.ones(2))
    >>> print(vkml.pp_program(prog, bits=True))
    program (x)
      prog : float64 [2] at CPU = Map [mul(x0, float64:0x3fb999999999999a)] (x0: float64 [2] at CPU)
        with x0 = x
      return prog
    """
    if not isinstance(prog, Program):
        raise ArgumentError(f"pp_program: expected a vkml Program, got {type(prog).__name__}; make "
                            "one with vkml.program(fn, *args) (or print a jitted function's "
                            "f.programs())")
    numbers = number_values(prog)
    if arg_names is None:
        arg_names = getattr(prog, "arg_names", None)     # (a traced function's, by pytree path)
    shown = value_names(prog, numbers, arg_names) if names else \
        {v: f"%{n}" for v, n in numbers.items()}
    lines = []
    _print(prog, shown, lines, indent="", bits=bits)
    return "\n".join(lines)


def number_values(prog: Program) -> dict:
    """Each value of ``prog`` and its nested programs -> its number (the ``n`` of ``%n``), in
    printing order; the pictures number values the same way, so text and picture agree."""
    numbers = {}
    _number(prog, numbers)
    return numbers


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


# -- names from the user's source ------------------------------------------------------------

_TARGETS = re.compile(r"\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*,?\s*"
                      r"(?::[^=]*)?(?:[-+*/@%&|^]|//|\*\*|>>|<<)?=(?!=)")
#: the prefix a derived equation's value gets from the role it plays
ROLE_PREFIX = {"tangent": "d", "cotangent": "ct_"}


def root_of(eqn):
    """``(primal equation, role)`` an equation comes from: itself as "primal" unless a transform
    (jvp, partial evaluation, transpose) recorded where it made it (``eqn.origin``)."""
    origin = getattr(eqn, "origin", None)
    return origin if origin is not None else (eqn, "primal")


def source_line(where) -> str | None:
    """The user's source text at a site kept as (code, line), stripped; None when unknown."""
    if where is None or isinstance(where, str):
        return None
    code, line = where
    text = linecache.getline(code.co_filename, line).strip()
    return text or None


def site_title(eqn) -> str | None:
    """``file.py:12: h = vkml.tanh(w)`` for the line an equation (or its primal) comes from."""
    root, role = root_of(eqn)
    if root.where is None:
        return None
    line = source_line(root.where)
    head = site_text(root.where) + (f": {line}" if line else "")
    return head if role == "primal" else f"{role} of {head}"


def _targets(where):
    line = source_line(where)
    if line is None:
        return None
    m = _TARGETS.match(line)
    return [t.strip() for t in m.group(1).split(",")] if m else None


def value_names(prog: Program, numbers: dict, arg_names=None) -> dict:
    """Var -> what to call it: the user's name where the trace knows it, else ``%n``.

    A value is named after its source line's assignment target when it leaves that line (it is
    read by an equation from another line, or returned): ``h = vkml.tanh(w) * w`` names the
    product ``h``, not the tanh inside it.  A line assigning several targets names an equation
    with as many outputs by position (``_`` names nothing).  Names are unique: ``h``, ``h_1``.
    """
    shown, taken, targets = {}, set(), {}

    def give(v, base):
        name, i = base, 0
        while name in taken:
            i += 1
            name = f"{base}_{i}"
        taken.add(name)
        shown[v] = name

    def visit(p, arg_names):
        if arg_names is not None and len(arg_names) == len(p.inputs):
            for v, a in zip(p.inputs, arg_names):
                if v not in shown and a:
                    give(v, a)
        read_by = {}
        for e in p.eqns:
            for v in e.inputs:
                read_by.setdefault(v, []).append(e)
        outs = set(p.outputs)
        shown_eqns = {id(e) for e, _, _, _ in fused_view(p)[1]}   # a fused Map's inner values
        for e in p.eqns:                                           # are never shown: no name
            if id(e) not in shown_eqns:
                continue
            root, role = root_of(e)
            if root.where is None:
                continue
            key = root.where
            if key not in targets:
                targets[key] = _targets(key)
            names = targets[key]
            if not names or (len(names) > 1 and len(names) != len(e.outputs)):
                continue
            for k, v in enumerate(e.outputs):
                base = names[k] if len(names) > 1 else (names[0] if len(e.outputs) == 1 else None)
                if not base or base == "_" or v in shown:
                    continue
                leaves = v in outs or any(root_of(r)[0].where != key or root_of(r)[1] != role
                                          for r in read_by.get(v, ()))
                if leaves:
                    give(v, ROLE_PREFIX.get(role, "") + base)
        for e in p.eqns:
            for q in _nested(e):
                visit(q, None)

    visit(prog, arg_names)
    for v, n in numbers.items():
        if v not in shown:
            shown[v] = f"%{n}"
    return shown


def _nested(eqn):
    return [v for v in eqn.params.values() if isinstance(v, Program)]


def literal(value, bits: bool = False) -> str:
    """A constant as text: the shortest decimal that reads back to the same number (``0.1``;
    ``float32:0.1`` when the dtype is not float64, int64 or bool), or with ``bits=True`` its
    dtype and exact bit pattern (``float64:0x3fb999999999999a``)."""
    a = np.asarray(value)
    name = dtype_name(a.dtype)
    if a.dtype.kind == "b":
        return ("true" if bool(a) else "false") if bits else repr(bool(a))
    if a.dtype.kind == "f":
        if bits:
            raw = a.view(np.uint64 if a.dtype.itemsize == 8 else np.uint32)
            return f"{name}:0x{int(raw):0{a.dtype.itemsize * 2}x}"
        text = str(a[()])                    # NumPy's shortest round-trip form for this dtype
        return text if name == "float64" else f"{name}:{text}"
    return f"{name}:{int(a)}" if bits or name != "int64" else str(int(a))


def fused_view(prog, bits: bool = False, members=None):
    """What a reader sees of ``prog``: the constants shown, and its boxes.

    Chains of elementwise equations whose intermediate values are read once
    become ONE ``Map`` with its expression (a broadcast scalar constant read
    once appears inside as a literal), as a backend runs them.  Returns
    ``(consts, boxes)`` where a box is ``(eqn, kind, text, reads)``; the
    printer and ``vkml.viz`` both draw from it.  ``members``, a dict, receives
    for each Map box (by ``id`` of its eqn) the equations fused into it.
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
                return literal(const_values[src], bits)
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
            inside = [e]

            def expr(v):
                lit = scalar_literal(v)
                if lit is not None:
                    return lit
                p = producer.get(v)
                if p is not None and id(p) in absorbed and p.prim.elementwise:
                    inside.append(p)
                    return _expr_of(p, expr)
                reads.append(v)
                return f"x{len(reads) - 1}"

            boxes.append((e, "Map", _expr_of(e, expr), reads))
            if members is not None:
                members[id(e)] = inside[::-1]
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
            text = ", ".join(f"{k}={format_param(v)}" for k, v in params.items())
            boxes.append((e, e.prim.name, text, list(e.inputs)))
    return consts, boxes


def _print(prog, names, lines, indent, bits=False):
    def ref(v):
        return names.get(v, "?")

    def typed(v):
        return f"{ref(v)} : {v.type_str()}"

    lines.append(f"{indent}program ({', '.join(ref(v) for v in prog.inputs)})")
    body = indent + "  "
    consts, boxes = fused_view(prog, bits)
    for v, value in consts:
        text = literal(value, bits) if np.ndim(value) == 0 else \
            f"const {dtype_name(np.asarray(value).dtype)} {list(np.shape(value))}"
        lines.append(f"{body}{typed(v)} = Map [{text}] at {v.device}")
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
            _print(p["program"], names, lines, body + "    ", bits)
        else:
            shown = f" [{text}]" if text else ""
            lines.append(f"{body}{lhs} = {e.prim.name}{shown} ({_refs(e.inputs, ref)})")
            for p in _nested(e):
                lines.append(f"{body}  program")
                _print(p, names, lines, body + "    ", bits)
    lines.append(f"{body}return {_refs(prog.outputs, ref)}")


def _expr_of(eqn, expr):
    args = ", ".join(expr(v) for v in eqn.inputs)
    if eqn.prim.name == "cast":
        return f"cast<{dtype_name(eqn.params['dtype'])}>({args})"
    return f"{eqn.prim.name}({args})"


def _refs(vs, ref):
    return ", ".join(ref(v) for v in vs)


def format_param(v):
    """A primitive's parameter as the text shows it (the pictures' boxes show it alike)."""
    if isinstance(v, np.dtype):
        return v.name
    if isinstance(v, tuple):
        return "(" + ", ".join(str(x) for x in v) + ")" if len(v) != 1 else f"({v[0]},)"
    return str(v)
