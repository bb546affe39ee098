"""A float sum of zero-padded windows, lowered as one accumulation pass per window; and a
stored zero-padded array, lowered as its border and its values apart (``padded_store``).

A convolution's input gradient is such a sum: its columns' gradient holds one window of the
image per kernel tap, and each is padded back to the image's size and added, 25 terms
``((p0 + p1) + p2) + ...`` for a 5 x 5 kernel.  As one expression every element tests 25
windows' bounds and adds 25 terms, most of them the padding's zeros, in a loop the compiler
leaves scalar (2.8 ms of a LeNet step on one core).

The same bits come from passes: an accumulator starts at -0.0 (the identity of +: -0.0 + v
is v for every v, +0.0 included), each window is added where it lies, in the sum's order --
a vectorised loop over the window alone -- and an element some window misses gets the + 0.0
that window's padding would have added.  That is exact because adding +0.0 changes nothing but
-0.0 (to +0.0): the skipped zeros could only have turned a -0.0 accumulator into +0.0, and an
accumulator of -0.0 at the end means every term added was -0.0, so the sum with the zeros
is +0.0 exactly where some window was missed.  NaN and infinities pass through either way.

The passes over one image sit inside the loops over the axes no window pads (the batch and
channels), so an image's accumulator stays in the L1 cache between passes, and those loops
are the ones spread over threads.

A strided convolution's windows take every second (third ...) pixel: padded back, each has
interior padding, its elements a step apart, and a pass adds it at those places.  Then an
element some window misses is the rule, not the edge: where every element is missed by some
window (different phases of the stride), each gets the + 0.0 after the passes; where some
elements are covered by every window and others are not, no box says which, and the sum stays
one expression.  An image's local accumulator is then kept split by phase -- the elements whose
positions leave one remainder modulo the steps side by side -- so each window, all of one phase,
is added with unit stride, and the result is put back in order phase by phase.

Windows that do not overlap (the gradient of a split: an attention's q, k and v padded back
into the 3d columns they came from) need no accumulator: each element is one window's term
plus the others' zeros, ``v + 0.0`` whatever the order, so the sum is one copy per window.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .lower import CTYPE, Unsupported, linear_index, mark_parallel
from .statements import Block, Loop

#: fewer windows than this stay one expression (two or three pads: a split's gradient),
#: unless they are disjoint and at least :data:`MIN_DISJOINT` (a copy each)
MIN_WINDOWS = 4
MIN_DISJOINT = 3
#: the most elements of one image's sum kept in a local array (16 KB of floats)
LOCAL_ELEMENTS = 4096


def padded_sum_loops(low, e, env, targets):
    """Statements storing add ``e``'s result into ``targets[0]`` by passes (a copy per window
    where they are disjoint), or None where ``e`` is not the top of a float sum of enough
    zero-padded windows (or the lowering does not ask for passes: ``Lowering.padded_sums``)."""
    out = e.outputs[0]
    if not float_sums(low, out):
        return None
    pads = _windows(env, e)
    if pads is None or len(pads) < min(MIN_WINDOWS, MIN_DISJOINT):
        return None
    blocking = low.blocked.get(id(e))
    if blocking is not None and [id(p) for p in pads] != [id(p) for p in blocking.pads]:
        raise Unsupported(f"a blocked product's windows changed: {e.prim.name}")
    if disjoint(pads):
        return _copies(low, out, pads, env, targets[0])
    plan = passes_plan(pads, out.shape) if len(pads) >= MIN_WINDOWS else None
    if plan is None:
        if blocking is not None:
            raise Unsupported(f"a blocked product's sum takes no passes: {e.prim.name}")
        return None
    common, missing, inside = plan
    shape = out.shape
    ctype, target = CTYPE[out.dtype], targets[0]
    outer = [low.fresh("i") for _ in range(common)]
    rest = shape[common:]
    # one image's sum in an array of its own (cached, and apart from every buffer: no run-time
    # overlap check per pass) where the loops around the passes leave a small one
    local = low.fresh("vk_acc") if common and 0 < math.prod(rest) <= LOCAL_ELEMENTS else None
    # windows a step apart (the same steps for all) keep a local accumulator split by phase:
    # the elements at positions of one remainder modulo the steps side by side, so a window
    # (all of one phase) is added with unit stride, in vectors; the result is put back in order
    steps = [d + 1 for d in pads[0].params["interior"][common:]]
    quotients = [-(-n // t) for n, t in zip(rest, steps)]
    block = math.prod(quotients)
    phased = local is not None and max(steps) > 1 and \
        math.prod(steps) * block <= 2 * LOCAL_ELEMENTS and \
        all([d + 1 for d in p.params["interior"][common:]] == steps for p in pads)
    phases = list(itertools.product(*map(range, steps))) if phased else []

    def phase_element(phase, at):
        """The phased accumulator's element of ``phase`` (remainders) at quotients ``at``."""
        first = phases.index(tuple(phase)) * block
        return f"{local}[{f'{first} + ' if first else ''}{linear_index(at, quotients)}]"

    def element(inner, pad=None):
        """The accumulator's element at ``inner``, or where ``pad`` puts its operand's element
        ``inner`` (its low edge plus the index times the step its interior padding makes)."""
        at = list(inner)
        if pad is not None and phased:
            lo = pad.params["lo"][common:]
            return phase_element([a % t for a, t in zip(lo, steps)],
                                 [f"({i} + {a // t})" if a // t else i
                                  for i, a, t in zip(inner, lo, steps)])
        if pad is not None:
            lo, step = pad.params["lo"][common:], [d + 1 for d in pad.params["interior"][common:]]
            at = [f"({i}{f' * {t}' if t > 1 else ''}{f' + {s}' if s else ''})" if s or t > 1 else i
                  for i, s, t in zip(inner, lo, step)]
        if local is not None:
            return f"{local}[{linear_index(at, rest)}]"
        return f"{target}[{linear_index(outer + at, shape)}]"

    def nest(extents, line):
        idx = [low.fresh("i") for _ in extents]
        body = [line(idx)]
        for var, n in reversed(list(zip(idx, extents))):
            body = [Loop(var, n, body)]
        return body if common else mark_parallel(body, len(extents))

    zero = "0.0f" if ctype == "float" else "0.0"

    def window(k, x, r):
        """Window ``k`` (pad operand ``x``) at the element of indices ``outer + r``."""
        return blocking.read(k, outer[1:] + r) if blocking is not None else env.read(x, outer + r)

    if phased:
        passes = nest((len(phases) * block,), lambda r: f"{local}[{r[0]}] = -{zero};")
    else:
        passes = nest(rest, lambda r: f"{element(r)} = -{zero};")
    for k, p in enumerate(pads):
        x = p.inputs[0]
        passes += nest(x.shape[common:], lambda r, k=k, x=x, p=p: (
            f"{element(r, p)} = {element(r, p)} + {window(k, x, r)};"))

    def result(r):
        store = f"{target}[{linear_index(outer + r, shape)}] = "
        if not missing:
            return store + f"{element(r)};"
        if inside is None:
            return store + f"{element(r)} + {zero};"
        test = " && ".join(f"{i} >= {first} && {i} < {end}" for i, (first, end) in zip(r, inside))
        return store + f"({test}) ? {element(r)} : {element(r)} + {zero};"

    def phase_result(phase, q):
        """The result at quotients ``q`` of ``phase``: position ``q * step + remainder``."""
        at = [f"({i} * {t} + {f})" if f else f"({i} * {t})" if t > 1 else i
              for i, t, f in zip(q, steps, phase)]
        plus = f" + {zero}" if missing else ""
        return f"{target}[{linear_index(outer + at, shape)}] = {phase_element(phase, q)}{plus};"

    if phased:                  # each phase's elements back to their places
        for phase in phases:
            extents = [-(-(n - f) // t) for n, f, t in zip(rest, phase, steps)]
            if min(extents) > 0:
                passes += nest(extents, lambda q, phase=phase: phase_result(phase, q))
    elif missing or local is not None:
        passes += nest(rest, result)
    if local is not None:
        size = len(phases) * block if phased else math.prod(rest)
        passes = [Block([f"{ctype} {local}[{size}];"] + passes)]
    if not common:
        return passes
    for var, n in reversed(list(zip(outer, shape[:common]))[1 if blocking else 0:]):
        passes = [Loop(var, n, passes)]
    if blocking is not None:         # each image's block of the product, then its passes
        stmts = []
        loops = blocking.images(low, env, outer[0], passes, stmts)
        return stmts + loops
    return mark_parallel(passes, common)


def passes_plan(pads, shape):
    """How the passes add windows ``pads`` into a result of ``shape``: ``(common, missing,
    inside)`` -- the leading axes no window pads or spreads (the loops around the passes),
    whether some element is missed by some window (it then gets that window's + 0.0), and the
    box ``[(first, end), ...]`` over the other axes of the elements every window covers (None:
    there is none, every element missed) -- or None where passes do not apply: every axis is
    a common one, or windows with interior padding (a strided convolution's gradient: a
    window's elements a step apart) cover some elements all and others not (no box says which)."""
    nd = len(shape)
    common = 0
    while common < nd and all(p.params["lo"][common] == 0 and p.params["hi"][common] == 0 and
                              p.params["interior"][common] == 0 for p in pads):
        common += 1
    if common == nd:
        return None
    if not any(any(p.params["interior"]) for p in pads):
        inside = [(max(p.params["lo"][a] for p in pads),
                   min(p.params["lo"][a] + p.inputs[0].shape[a] for p in pads))
                  for a in range(common, nd)]
        missing = any(first > 0 or end < n for (first, end), n in zip(inside, shape[common:]))
        return common, missing, inside if all(first < end for first, end in inside) else None
    # along each axis, the positions each window covers; every window misses some element
    # unless each covers every position of every axis, and every window covers some element
    # when the positions all windows cover meet on every axis
    every, whole = [], True
    for a in range(common, nd):
        on = []
        for p in pads:
            hit = np.zeros(shape[a], bool)
            lo, step, n = p.params["lo"][a], p.params["interior"][a] + 1, p.inputs[0].shape[a]
            hit[lo:lo + (n - 1) * step + 1:step] = True
            on.append(hit)
        whole = whole and all(hit.all() for hit in on)
        every.append(np.logical_and.reduce(on).any())
    if whole:
        return common, False, None
    return (common, True, None) if not all(every) else None


def padded_store(low, e, env, targets):
    """A stored pad (zeros around its operand, no interior padding, no cropping: a convolution's
    padded input) as its border of zeros and its operand's copy -- one loop nest per side of
    each padded axis (the axes before it inside, the ones after whole: the border exactly once)
    and one over the operand, with no bounds test per element (the test of the expression form
    kept a padded ReLU's nest scalar); None where it is no such pad or the lowering does not ask
    for passes (``Lowering.padded_sums``)."""
    x, out, p = e.inputs[0], e.outputs[0], e.params
    if not low.padded_sums or out.dtype not in CTYPE or any(p["interior"]) or \
            min(p["lo"] + p["hi"], default=0) < 0 or x.size == 0 or x.size == out.size:
        return None
    target, zero = targets[0], f"({CTYPE[out.dtype]})0"

    def at(offsets):
        return lambda idx: linear_index([f"({i} + {o})" if o else i for i, o in zip(idx, offsets)],
                                        out.shape)
    stmts = []
    for a, (lo, n, size) in enumerate(zip(p["lo"], x.shape, out.shape)):
        for first, end in ((0, lo), (lo + n, size)):
            if end > first:
                extents = list(x.shape[:a]) + [end - first] + list(out.shape[a + 1:])
                offsets = list(p["lo"][:a]) + [first] + [0] * (out.ndim - a - 1)
                stmts += low.store(extents, target, lambda idx: zero, at=at(offsets))
    return stmts + low.store(x.shape, target, lambda idx: env.read(x, idx), at=at(p["lo"]))


def padded_sum_top(low, e, env, readers) -> bool:
    """Whether add ``e`` is the last of a float sum of zero-padded windows that
    ``padded_sum_loops`` takes (no add reading it continues the sum): such a result is stored,
    by passes or copies, rather than inlined into its readers (``readers``: each value's
    reading equations)."""
    out = e.outputs[0]
    if not float_sums(low, out):
        return False
    if any(r.prim is e.prim and r.inputs[0] is out for r in readers.get(out, ())):
        return False
    pads = _windows(env, e)
    return pads is not None and (len(pads) >= MIN_WINDOWS or
                                 len(pads) >= MIN_DISJOINT and disjoint(pads))


def float_sums(low, out) -> bool:
    """Whether the lowering asks for passes (``Lowering.padded_sums``) and ``out`` is a float."""
    return low.padded_sums and out.dtype.kind == "f" and out.dtype in CTYPE


def disjoint(pads) -> bool:
    """Whether no two of the windows overlap (a split's gradient: its pieces padded back); never
    said of windows with interior padding (they take the passes)."""
    if any(any(p.params["interior"]) for p in pads):
        return False
    boxes = [[(lo, lo + n) for lo, n in zip(p.params["lo"], p.inputs[0].shape)] for p in pads]
    return all(any(a_end <= b_first or b_end <= a_first
                   for (a_first, a_end), (b_first, b_end) in zip(a, b))
               for k, a in enumerate(boxes) for b in boxes[k + 1:])


def _copies(low, out, pads, env, target):
    """Disjoint windows (two at least): each element is one window's term plus the zeros of the
    others, ``v + 0.0`` in any order of the sum, and +0.0 where no window lies -- a copy per
    window (after +0.0 everywhere, if the windows leave gaps)."""
    zero = "0.0f" if CTYPE[out.dtype] == "float" else "0.0"
    stmts = []
    if sum(p.inputs[0].size for p in pads) < out.size:
        stmts += low.store(out.shape, target, lambda idx: zero)
    for p in pads:
        x, lo = p.inputs[0], p.params["lo"]
        stmts += low.store(x.shape, target, lambda idx, x=x: f"{env.read(x, idx)} + {zero}",
                           at=lambda idx, lo=lo: linear_index(
                               [f"({i} + {s})" if s else i for i, s in zip(idx, lo)], out.shape))
    return stmts


def _windows(env, e):
    """:func:`windows_of` the sum ``e`` tops as it is being lowered."""
    return windows_of(e, env.lowering.rules, env.producer, env.inline.__contains__)


def windows_of(e, rules, producer, inline):
    """The pads of the sum ``e`` tops, in its order of additions (``((p0 + p1) + p2) + ...``,
    each add inlined into the next), or None: where a term is not a pad of zeros, with no
    interior padding and no cropping, inlined into the sum (``inline(value)``: whether it is)."""
    own = rules[e.prim.name]
    terms, node = [], e
    while True:
        a, b = node.inputs
        terms.append(b)
        if inline(a) and a in producer and rules.get(producer[a].prim.name) is own:
            node = producer[a]
            continue
        terms.append(a)
        break
    pads = []
    for t in reversed(terms):
        p = producer.get(t) if inline(t) else None
        if p is None or not getattr(rules.get(p.prim.name), "zero_border", False) or \
                min(p.params["lo"] + p.params["hi"], default=0) < 0:
            return None
        pads.append(p)
    return pads
