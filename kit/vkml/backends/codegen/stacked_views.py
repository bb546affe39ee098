"""A stack of one view at offsets that follow the operand's number, as one loop nest.

A convolution's columns stack the 25 windows of a 5 x 5 kernel: 25 slices of one image that
differ only in their starts, ``(k / 5, k % 5)`` for tap k; an overlapping pooling stacks its
windows likewise.  Stored operand by operand, that is 25 loop nests -- 25 teams of threads
started and joined, and 25 nests for the compiler to get through.  Where every operand is the
same inlined expression of the same buffers but for the offsets of its views (``View.offsets``
in the rules table) and each offset is a constant, ``a + b k`` or ``a + b (k / m) + c (k % m)``
of the operand's number, the stack is one nest over the whole result: its element at ``idx``
is operand ``idx[axis]``'s, read through stand-in view equations whose offsets are those C
expressions of the loop over the stacked axis.  The same elements are copied (the same bits).
"""

from __future__ import annotations

from ...ir import Eqn


def stacked_value(env, e):
    """``value_at(idx)`` of concatenate ``e`` as one expression, or None: when its operands are
    each one element thick along the axis and are one inlined expression of the same values,
    but for the offsets of the views in it (``View.offsets``), and each offset is a constant,
    ``a + b k`` or ``a + b (k / m) + c (k % m)`` of the operand's number k.  The element at
    ``idx`` is operand ``idx[axis]``'s, read with its offsets computed from that index (the
    views are read through stand-in equations carrying those expressions)."""
    axis, xs = e.params["axis"], e.inputs
    if len(xs) < 2 or any(x.shape != xs[0].shape for x in xs) or xs[0].shape[axis] != 1:
        return None
    views = [[] for _ in xs]
    forms = [_expression_form(env, x, found) for x, found in zip(xs, views)]
    if forms[0] is None or any(f != forms[0] for f in forms[1:]):
        return None
    offsets = []          # per view of operand 0 and offset param: per axis, a function of k
    for j, view in enumerate(views[0]):
        for name in env.lowering.rules[view.prim.name].offsets:
            per_axis = [_following([found[j].params[name][a] for found in views])
                        for a in range(len(view.params[name]))]
            if any(f is None for f in per_axis):
                return None
            offsets.append((view, name, per_axis))

    def value_at(idx):
        k, sub = f"({idx[axis]})", list(idx)
        sub[axis] = "0"
        saved, params = {}, {}
        for view, name, per_axis in offsets:
            v = view.outputs[0]
            saved.setdefault(v, env.producer[v])
            params.setdefault(v, dict(view.params))[name] = tuple(f(k) for f in per_axis)
            env.producer[v] = Eqn(view.prim, view.inputs, view.outputs, params[v])
        try:
            return env.read(xs[0], sub)
        finally:
            env.producer.update(saved)
    return value_at


def _expression_form(env, v, views):
    """What ``v``'s inlined expression is, up to the offsets of its views (appended to
    ``views`` in the order met): nested tuples of each step's primitive, params and shape down
    to the buffers, constants and scalars it reads (by identity); None where ``env`` cannot read
    ``v`` yet."""
    if v in env.scalars or v in env.buffers or v in env.consts:
        return id(v)
    if v not in env.inline:
        return None
    p = env.producer[v]
    names = getattr(env.lowering.rules[p.prim.name], "offsets", ())
    params = p.params
    if names:
        views.append(p)
        params = {k: value for k, value in params.items() if k not in names}
    inputs = tuple(_expression_form(env, x, views) for x in p.inputs)
    if None in inputs:
        return None
    return p.prim.name, params, v.shape, v.dtype, inputs


def _following(values):
    """A function of the C expression of k giving ``values[k]``: a constant, ``a + b k`` or
    ``a + b (k / m) + c (k % m)`` (a kernel's taps in row-major order, m of them a row); None
    when none of these fits."""
    n, a = len(values), values[0]
    if all(v == a for v in values):
        return lambda k: a
    for m in range(2, n + 1):            # m = n: a + c k
        b, c = values[m] - a if m < n else 0, values[1] - a
        if all(v == a + b * (i // m) + c * (i % m) for i, v in enumerate(values)):
            return lambda k, m=m, b=b, c=c: _sum_of_terms(
                a, (b, f"({k} / {m})"), (c, k if m == n else f"({k} % {m})"))
    return None


def _sum_of_terms(a, *terms):
    """``a + b x + ...`` as C, with no zero term and no factor of one."""
    parts = [str(a)] if a else []
    parts += [x if b == 1 else f"{b} * {x}" for b, x in terms if b]
    return f"({' + '.join(parts)})"
