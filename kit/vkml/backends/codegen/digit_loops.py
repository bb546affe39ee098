"""A loop whose index is read only in digits (``(i / 128)``, ``((i / 32) % 4)``, ``(i % 32)``) as
nested loops over those digits.

Why: a reshape that splits an axis reads its operand at the digits of the merged index -- an
attention's gradient gathered back into its q, k, v columns reads ``t[(i / 128) * 131072 + ... +
((i / 32) % 4) * 4096 + ... + (i % 32)]`` for each ``i`` of a row of 384.  Each element then
divides its index, and the compiler reads them one at a time (a gather).  Over nested loops of
3, 4 and 32 the same reads are at linear indices, 32 side by side: a vector load.

The rewrite is of the loop's text only: the same elements, stored in the same order, each from
the same read (the digits of ``i`` in the order of the loop are ``i`` itself), so every value
and every bit is the same.  It applies to an innermost loop (one-line statements) whose
variable appears only in such digits and in plain sums (the store's index), where the places
of the digits (1, 32, 128 and the loop's extent here) each divide the next and the innermost
digit has at least :data:`MIN_INNER` values.
"""

from __future__ import annotations

import re

from .statements import Block, If, Loop, While, rebuilt

#: the fewest iterations of the innermost digit loop: a split pays where that loop fills a vector
MIN_INNER = 8


def split_digit_loops(stmts):
    """``stmts`` with every such innermost loop (module docstring) made nested digit loops."""
    out = []
    for s in stmts:
        if isinstance(s, Loop) and s.body and all(isinstance(line, str) for line in s.body):
            out += _split(s) or [s]
        elif isinstance(s, (Loop, Block, If, While)):
            out.append(rebuilt(s, split_digit_loops(s.body)))
        else:
            out.append(s)
    return out


def _forms(v):
    """The digit forms of variable ``v``: ``(pattern, low place, high place or None for the
    extent)`` -- a remainder of a quotient, a quotient, a remainder."""
    q = re.escape(v)
    return [(re.compile(rf"\(\(\({q}\) / (\d+)\) % (\d+)\)"), "divmod"),
            (re.compile(rf"\(\({q}\) / (\d+)\)"), "div"),
            (re.compile(rf"\(\({q}\) % (\d+)\)"), "mod")]


def _split(loop):
    """``loop`` as nested digit loops, or None where it is not one to split."""
    v, extent = loop.var, loop.extent
    if not isinstance(extent, int) or extent < 2:
        return None
    places, text = {1, extent}, "\n".join(loop.body)
    found = False
    for pattern, kind in _forms(v):
        for m in pattern.finditer(text):
            a = [int(g) for g in m.groups()]
            if 0 in a:
                return None
            places.update([a[0], a[0] * a[1]] if kind == "divmod" else [a[0]])
            found = True
        text = pattern.sub("", text)
    if not found or "?" in text:
        return None
    ordered = sorted(p for p in places if p <= extent)
    if ordered[-1] != extent or any(b % a for a, b in zip(ordered, ordered[1:])):
        return None
    digits = [(f"{v}_d{k}", place, nxt // place)
              for k, (place, nxt) in enumerate(zip(ordered, ordered[1:]))]
    if digits[0][2] < MIN_INNER:
        return None             # (a pooling's g[x / 2]: loops of 2 would vectorise worse)

    def value(low, high):
        """The C of ``(v % high) / low`` from the digits."""
        terms = [name if place == low else f"{name} * {place // low}"
                 for name, place, _ in digits if low <= place < high]
        if not terms:
            return "0"                      # (a quotient by at least the extent)
        return "(" + " + ".join(terms) + ")" if len(terms) > 1 else terms[0]

    def rewrite(line):
        for pattern, kind in _forms(v):
            if kind == "divmod":
                line = pattern.sub(lambda m: value(int(m.group(1)), int(m.group(1)) * int(m.group(2))),
                                   line)
            elif kind == "div":
                line = pattern.sub(lambda m: value(int(m.group(1)), extent), line)
            else:
                line = pattern.sub(lambda m: value(1, int(m.group(1))), line)
        return re.sub(rf"(?<![\w]){re.escape(v)}(?![\w])", value(1, extent), line)
    body = [rewrite(line) for line in loop.body]
    for name, _, count in digits:                   # (the least significant digit innermost)
        body = [Loop(name, count, body, loop.parallel)]
    return body
