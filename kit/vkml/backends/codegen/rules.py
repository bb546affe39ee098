"""What each primitive becomes in C: one table, :data:`C_RULES`, that the lowering dispatches on.

Every primitive the compiled tiers run has one entry, of one of three kinds:

- :class:`Elementwise` -- a C expression of its operands' expressions at one index
  (``"({0} + {1})"``, or a small function of them and their dtype).  It fuses into the loop of
  whatever reads it.
- :class:`View` -- a movement (transpose, slice, pad...): a C expression reading its operands
  at other indices.  It fuses too.
- :class:`Statement` -- a primitive that needs loops of its own (a reduction, a scan, a
  solve): a function ``(lowering, eqn, env, targets) -> statements``, usually a ``_lower_*``
  method of :class:`~.lower.Lowering`.

Each rule answers the three questions the lowering asks of an equation: may its result be
inlined into its reader (``fusible``), must its operands be in buffers (``stores_operands``),
and which statements compute it (``lower``); expression rules also give the expression
itself at an index (``expression``).

A renderer whose lowering differs takes this table and replaces only the entries that differ
(``cuda_render.CUDA_RULES``: the loops it marks parallel, the scans and matmuls it launches its
own way).  A primitive with no entry (:data:`UNSUPPORTED`, with the reason) makes the lowering
raise :class:`~.lower.Unsupported`: the backend then runs that program on NumPy.

Adding a primitive is one ``Primitive`` in ``vkml.ops`` and one entry here.  For a new
elementwise function of the C library, say ``hypot``, it is one entry in ``libm.py`` instead,
beside its definition in ``vkml.ops``::

    # vkml/ops/special.py: its shape rule, NumPy implementation and derivative
    hypot_p = elementwise_primitive("hypot", binary_float_rule("hypot"), np.hypot,
                                    "sqrt(x*x + y*y).", jvp=_hypot_jvp)
    # codegen/libm.py: hypot(x, y), hypotf for float32 -- its C declaration, its rule here
    # (``libm("hypot")``) and the checks of the bits it may change follow from the entry
    LibmFunction("hypot", 2),
"""

from __future__ import annotations

import numpy as np

from .libm import PRIMITIVE_CALLS
from .padded_sums import padded_store, padded_sum_loops, padded_sum_top
from .stacked_views import stacked_value
from .lower import (CTYPE, Lowering, RunsIndex, axis_groups, linear_index, row_major_strides,
                    tree_expression)
from .products import by_gemm, gemm_operands, lower_gemm

#: the unsigned type of an integer's width: integer arithmetic that may overflow is done in it
_UNSIGNED = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}


# -- the three kinds of rules --------------------------------------------------------------------

class Elementwise:
    """An operation on the elements at one index.

    ``expr`` is a format string over the operands' C expressions (``"({0} < {1})"``) or a
    function ``expr(args, dtype, eqn)`` of them, of the dtype the operation computes in (its
    first operand's) and of the equation (for its params).  ``refuses(eqn)``: whether the
    operation refuses some operands as it runs (an integer power, a negative exponent); it is
    then lowered by the statement rule ``checked`` instead, with its check, and never fused.
    """

    def __init__(self, expr, refuses=None, checked=None, own_loops=None, stored_when=None):
        self.expr, self.refuses, self.checked = expr, refuses, checked
        #: ``own_loops(lowering, eqn, env, targets)``: statements of its own for a stored result
        #: where they beat one expression (``padded_sums``), else None; ``stored_when(lowering,
        #: eqn, env, readers)``: whether to store a result it would otherwise inline, for them
        self.own_loops, self.stored_when = own_loops, stored_when

    def expression(self, env, e, idx):
        args = [env.read(v, idx) for v in e.inputs]
        if isinstance(self.expr, str):
            return self.expr.format(*args)
        dtype = e.inputs[0].dtype if e.inputs else e.outputs[0].dtype
        return self.expr(args, dtype, e)

    def fusible(self, e):
        return self.refuses is None or not self.refuses(e)

    def stores_operands(self, e):
        return False

    def lower(self, low, e, env, targets):
        if not self.fusible(e):
            return self.checked(low, e, env, targets)
        return low.store(e.outputs[0].shape, targets[0], lambda idx: env.expr(e, idx))


class View:
    """A movement: ``expr(read, eqn, idx)`` is the output's element at index ``idx`` (C
    expressions, one per axis), reading operand ``v`` at index ``sub`` with ``read(v, sub)``.

    ``stores_operands(eqn)``: whether an operand's elements are read more than once (a
    broadcast that repeats them), so they are computed once into a buffer rather than inlined;
    ``fusible``: whether the view itself may be inlined into its reader; ``read_in_place``:
    whether a product computed by the GEMM reads it where its operand is (a transpose: other
    strides), so it is never stored however many such products read it; ``moved(arrays, eqn)``:
    the same movement done by NumPy on arrays of the operands' shapes (on arrays of element
    numbers it tells where each element comes from: ``products.gathered_operands``), None for
    a view that makes elements of its own (a pad's zeros).
    """

    def __init__(self, expr, stores_operands=lambda e: False, fusible=True, read_in_place=False,
                 offsets=(), zero_border=False, moved=None, own_loops=None):
        self.expr, self._stores, self._fusible = expr, stores_operands, fusible
        #: ``own_loops(lowering, eqn, env, targets)``: statements of its own for a stored result
        #: (a pad's border and operand apart: ``padded_sums.padded_store``), or None
        self.own_loops = own_loops
        self.read_in_place = read_in_place
        self.moved = moved
        #: whether it is its operand inside a border of zeros (a pad: ``padded_sums``)
        self.zero_border = zero_border
        #: the params of per-axis integer offsets (a slice's starts and limits) that ``expr``
        #: also takes as C expressions: a stack of such views is then one loop nest
        #: (``Concatenation``)
        self.offsets = tuple(offsets)

    def expression(self, env, e, idx):
        return self.expr(env.read, e, idx)

    def fusible(self, e):
        return self._fusible

    def stores_operands(self, e):
        return self._stores(e)

    def lower(self, low, e, env, targets):
        return low.store(e.outputs[0].shape, targets[0], lambda idx: env.expr(e, idx))


class Statement:
    """A primitive lowered to statements of its own: ``lower(lowering, eqn, env, targets)``
    returns them (see :mod:`.statements`), storing the results into the buffers ``targets``.
    Its operands are always in buffers (it may read them in any order, many times)."""

    def __init__(self, lower):
        self.lower = lower

    def fusible(self, e):
        return False

    def stores_operands(self, e):
        return True


#: the most elements a float sum or max may reduce per output and still be an expression
#: (``SmallReduction``): a pooling window of 2 x 2, a softmax over 8
SMALL_REDUCTION = 8


class SmallReduction(Statement):
    """``reduce_sum`` / ``reduce_max`` (``lower``: the general loop per output).  A float one over
    at most :data:`SMALL_REDUCTION` elements per output -- a pooling window, the tie count of
    its gradient -- is an expression of those elements instead, in the very order the loop
    takes them: the sum the canonical tree padded with zeros (``(x0 + x1) + (x2 + 0)`` for three:
    the +0.0 the loop's fold adds, so -0.0 comes out alike), the max the loop's comparisons one
    after another (``vk_max``: NaN wins, the first of equals stays).  As an expression it is
    computed in the nests around it, which vectorise, rather than in a scalar loop of a few
    iterations per output; its operand is stored (read at several elements per output)."""

    def __init__(self, loops, combine):
        super().__init__(self._lower)
        self.loops, self.combine = loops, combine           # combine: "sum" or "max"

    def _small(self, e):
        x = e.inputs[0]
        total = 1
        for a in e.params["axes"]:
            total *= x.shape[a]
        return x.dtype.kind == "f" and x.dtype in CTYPE and 0 < total <= SMALL_REDUCTION

    def fusible(self, e):
        return self._small(e)

    def reads_inline(self, e):
        """Whether the loops may read the operand as an expression rather than from a buffer
        (``Lowering.inline_reductions``): each element is read once, in the loop's order."""
        return not self._small(e)

    def _lower(self, low, e, env, targets):
        if not self._small(e):
            return self.loops(low, e, env, targets)
        return low.store(e.outputs[0].shape, targets[0], lambda idx: env.expr(e, idx))

    def expression(self, env, e, idx):
        x, axes = e.inputs[0], sorted(e.params["axes"])
        kept = iter(idx)
        full = [None if a in axes else next(kept) for a in range(x.ndim)]
        leaves = []                      # the reduced elements in row-major order
        for at in np.ndindex(*[x.shape[a] for a in axes]):
            sub = list(full)
            for a, k in zip(axes, at):
                sub[a] = str(k)
            leaves.append(env.read(x, sub))
        t = CTYPE[x.dtype]
        if self.combine == "max":
            acc = leaves[0]
            for leaf in leaves[1:]:
                acc = f"vk_max_{t}({acc}, {leaf})"
            return acc
        return tree_expression(leaves, "0.0f" if t == "float" else "0.0")


class Product(Statement):
    """The ``matmul`` rule: one GEMM call (``products``) for a big float product where the
    lowering allows it (``Lowering.gemm``: the C tier's programs), else the plain loops.  Only
    the GEMM reads a transposed operand in place, so only it has the transpose's source stored
    rather than the transpose."""

    def __init__(self, loops):
        super().__init__(self._lower)
        self.loops = loops

    @staticmethod
    def _gemm(low, e):
        return low.gemm and by_gemm(e)

    def stored_operands(self, low, e, producer, uses):
        return gemm_operands(e, producer, uses, low.free_transposes, low.gathered.get(id(e))) \
            if self._gemm(low, e) else e.inputs

    def reads_in_place(self, low, e):
        """Whether product ``e`` reads a transposed operand in place (the GEMM does)."""
        return self._gemm(low, e)

    def _lower(self, low, e, env, targets):
        return (lower_gemm if self._gemm(low, e) else self.loops)(low, e, env, targets)


# -- elementwise expressions ---------------------------------------------------------------------

def libm(name):
    """The C library's function ``name`` (``namef`` for float32), as CUDA's libdevice spells it
    too."""
    def expr(a, dt, e):
        return f"{name}{'f' if dt == np.float32 else ''}({', '.join(a)})"
    return expr


def _wrapping(op):
    """``+``, ``-`` or ``*``: integers wrap around as NumPy's do, without C's signed-overflow
    undefined behaviour (done in the unsigned type of their width)."""
    def expr(a, dt, e):
        if dt.kind in "iu":
            u = "uint64_t" if dt.itemsize == 8 else "uint32_t"
            return f"({CTYPE[dt]})(({u}){a[0]} {op} ({u}){a[1]})"
        return f"({a[0]} {op} {a[1]})"
    return expr


def _div(a, dt, e):
    if dt.kind == "f":
        return f"({a[0]} / {a[1]})"
    return f"vk_floordiv_{CTYPE[dt]}({a[0]}, {a[1]})"


def _neg(a, dt, e):
    if dt.kind in "iu":   # -INT_MIN wraps as NumPy's does (device code has no -fwrapv)
        return f"({CTYPE[dt]})(0 - ({_UNSIGNED[dt.itemsize]}){a[0]})"
    return f"(-{a[0]})"


def _abs(a, dt, e):
    if dt.kind != "f":
        return f"({a[0]} < 0 ? ({CTYPE[dt]})(0 - ({_UNSIGNED[dt.itemsize]}){a[0]}) : {a[0]})"
    return libm("fabs")(a, dt, e)


def _pow(a, dt, e):
    if dt.kind == "f":
        return libm("pow")(a, dt, e)
    return f"vk_ipow_{CTYPE[dt]}({a[0]}, {a[1]})"


def _int_exponent(e):
    """An integer power refuses a negative exponent, as NumPy does."""
    return e.inputs[0].dtype.kind in "iu"


def _extremum(helper, op):
    """``max``/``min``: floats through the helper that keeps NumPy's NaN rule, others compared."""
    def expr(a, dt, e):
        if dt.kind == "f":
            return f"vk_{helper}_{CTYPE[dt]}({a[0]}, {a[1]})"
        return f"({a[0]} {op} {a[1]} ? {a[0]} : {a[1]})"
    return expr


def _sign(a, dt, e):
    if dt.kind == "f":
        return f"vk_sign_{CTYPE[dt]}({a[0]})"
    return f"(({a[0]} > 0) - ({a[0]} < 0))"


def _where(a, dt, e):
    """``where`` as a call of ``vk_where_T``: both operands are computed for every element, then
    one is chosen.  A C ``?:`` computes only the chosen one, so a libm call inside it (the pow in
    ``where(b == 0, 0, b * pow(a, b - 1))``, pow's derivative) is a conditional call, which the
    compiler cannot vectorise -- unless the condition is a constant it folds away, which depends
    on what the program knows, e.g. its number of samples.  The vector and scalar versions of a
    libm function may differ in the last bit, so a sample's bits would depend on n."""
    return f"vk_where_{CTYPE[e.outputs[0].dtype]}({a[0]}, {a[1]}, {a[2]})"


def _cast(a, dt, e):
    """A C cast, except float to integer: ``vk_to_<type>`` (``helpers.h``) gives NumPy's x86
    results for NaN and out-of-range values, which a plain cast leaves undefined (and a GPU
    saturates)."""
    to = e.params["dtype"]
    if to.kind == "b":
        return f"({a[0]} != 0)"
    if e.inputs[0].dtype.kind == "f" and to.kind in "iu":
        return f"vk_to_{CTYPE[to]}((double){a[0]})"
    return f"(({CTYPE[to]}){a[0]})"


def _round(a, dt, e):
    """floor, ceil, rint or trunc (the ``mode``), each a C library function."""
    return libm(e.params["mode"])(a, dt, e)


# -- movement expressions ------------------------------------------------------------------------

def _broadcast_in_dim(read, e, idx):
    x, p = e.inputs[0], e.params
    return read(x, [("0" if x.shape[i] == 1 and p["shape"][d] != 1 else idx[d])
                    for i, d in enumerate(p["dims"])])


def _broadcast_repeats(e):
    """A broadcast that reads its operand's elements several times stores the operand."""
    return e.inputs[0].size != e.outputs[0].size


def _broadcast_moved(xs, e):
    x, p = xs[0], e.params
    shape = [1] * len(p["shape"])
    for i, d in enumerate(p["dims"]):
        shape[d] = x.shape[i]
    return np.broadcast_to(x.reshape(shape), p["shape"])


def _slice_moved(xs, e):
    p = e.params
    return xs[0][tuple(slice(s, lim, st) for s, lim, st in zip(p["starts"], p["limits"], p["strides"]))]


def _transpose(read, e, idx):
    sub = [None] * len(idx)
    for i, q in enumerate(e.params["perm"]):
        sub[q] = idx[i]
    return read(e.inputs[0], sub)


def _slice(read, e, idx):
    p = e.params
    return read(e.inputs[0], [f"({s} + ({i})*{st})" if st != 1 else (f"({s} + {i})" if s else i)
                              for i, s, st in zip(idx, p["starts"], p["strides"])])


def _flip(read, e, idx):
    out = e.outputs[0]
    return read(e.inputs[0], [f"({out.shape[a] - 1} - {i})" if a in e.params["axes"] else i
                              for a, i in enumerate(idx)])


def _reshape(read, e, idx):
    x = e.inputs[0]
    if x.size == 0:         # never read (no loop runs); no index divided by an empty axis's 0
        return read(x, ["0"] * x.ndim)
    return read(x, reshaped_index(idx, e.outputs[0].shape, x.shape))


class Reshape(View):
    """A reshape (read in place by a GEMM where strides describe it).  Its operand is read at
    a :class:`~.lower.RunsIndex`: the per-axis index ``reshaped_index`` gives, which views
    below read axis by axis, and its ``runs`` form, which a stored buffer of the operand's
    shape reached through elementwise steps is read at instead -- row-major, each group of
    axes is one run of it, so a split group's element is its offset within the group times the
    group's last stride: no division or remainder, and a loop over the reshape reads the buffer
    at unit stride (a pooling window's gradient read back in the image's layout vectorises).
    ``same_bytes``: stored, it is its stored operand's bytes (row-major both), so the lowering
    names the operand's buffer instead of copying it."""

    same_bytes = True

    def __init__(self):
        super().__init__(_reshape, read_in_place=True,
                         moved=lambda xs, e: xs[0].reshape(e.outputs[0].shape))

    def expression(self, env, e, idx):
        x, out = e.inputs[0], e.outputs[0]
        if not x.size:
            return self.expr(env.read, e, idx)
        return env.read(x, RunsIndex(reshaped_index(idx, out.shape, x.shape), x.shape,
                                     reshaped_index(idx, out.shape, x.shape, runs=True)))


def reshaped_index(idx, out_shape, in_shape, runs=False):
    """The index expressions into a C-contiguous ``in_shape`` of the element that index
    expressions ``idx`` name in its reshape to ``out_shape`` (the same number of elements).

    Axes are matched in groups of equal size -- (n, c, h, w) -> (n, c, h * w) is the groups
    n | c | h w -- and each group maps on its own: merged axes become one linear combination,
    a split axis is divided and reduced within its group only, and an axis of one element is
    0.  A loop over a merge or a split of a reshape then reads plain strides instead of
    dividing the whole flat index by every stride (a division the vectoriser cannot do, in
    every copy of an image batch or an attention's heads).  ``runs``: the input is a row-major
    buffer, read at the flat index these make -- a group's offset is then carried whole by its
    last axis (the others 0), which names the same element."""
    sub = ["0"] * len(in_shape)
    for group_out, group_in in axis_groups(out_shape, in_shape):
        lin = linear_index([idx[k] for k in group_out], [out_shape[k] for k in group_out])
        if runs and group_in:
            sub[group_in[-1]] = f"({lin})"
            continue
        shape = [in_shape[k] for k in group_in]
        for n, (k, stride) in enumerate(zip(group_in, row_major_strides(shape))):
            part = f"({lin})" if len(group_in) == 1 else f"(({lin}) / {stride})" if n == 0 else \
                f"(({lin}) % {shape[n]})" if stride == 1 else f"((({lin}) / {stride}) % {shape[n]})"
            sub[k] = part
    return sub


def _pad(read, e, idx):
    x, p = e.inputs[0], e.params
    conds, sub = [], []
    for i, lo, it, n in zip(idx, p["lo"], p["interior"], x.shape):
        step = it + 1
        off = f"(({i}) - {lo})"
        conds.append(f"{off} >= 0 && {off} < {max(0, (n - 1) * step + 1)}"
                     + (f" && {off} % {step} == 0" if step > 1 else ""))
        sub.append(f"({off} / {step})" if step > 1 else off)
    cond = " && ".join(conds) or "1"
    return f"(({cond}) ? {read(x, sub)} : ({CTYPE[e.outputs[0].dtype]})0)"


class Concatenation(View):
    """A concatenate, always stored: one loop nest per operand, each storing the operand's
    elements into its part of the result.  Its operands are read where they are (an im2col's
    25 strided windows of an image batch are read straight from the batch, not each copied out
    first) and no element runs a chain of selects over the operands (the expression form,
    :func:`_concatenate`, a reader of a concatenate never inlines).

    A stack of one expression at offsets that follow the operand's number (the windows of a
    convolution or a pooling: the same slice of the same image, its starts ``(k / kw, k %
    kw)`` for tap k) is one loop nest instead, over the whole result, the offsets computed from
    the loop over the stacked axis (``stacked_views``): one loop nest, and one team of threads,
    where there were 25."""

    def __init__(self):
        super().__init__(_concatenate, fusible=False,
                         moved=lambda xs, e: np.concatenate(xs, e.params["axis"]))

    def lower(self, low, e, env, targets):
        stacked = stacked_value(env, e)
        if stacked is not None:
            return low.store(e.outputs[0].shape, targets[0], stacked)
        axis, out = e.params["axis"], e.outputs[0]
        stmts, offset = [], 0
        for x in e.inputs:
            if x.size:
                stmts += low.store(
                    x.shape, targets[0], lambda idx, x=x: env.read(x, idx),
                    at=lambda idx, offset=offset: linear_index(
                        [f"({i} + {offset})" if a == axis and offset else i
                         for a, i in enumerate(idx)], out.shape))
            offset += x.shape[axis]
        return stmts


def _concatenate(read, e, idx):
    """A chain of selects on the concatenated axis, each operand read at its own offset."""
    axis = e.params["axis"]
    parts, offset = [], 0
    for x in e.inputs:
        n = x.shape[axis]
        sub = [f"({i} - {offset})" if a == axis else i for a, i in enumerate(idx)]
        parts.append((offset + n, read(x, sub)))
        offset += n
    text = parts[-1][1]
    for limit, value in reversed(parts[:-1]):
        text = f"(({idx[axis]}) < {limit} ? {value} : {text})"
    return text


# -- the table -----------------------------------------------------------------------------------

#: every primitive the compiled tiers lower, by name: what it becomes in C
C_RULES = {
    # arithmetic (+, -, *, / and sqrt are IEEE operations: NumPy's bits)
    "add": Elementwise(_wrapping("+"), own_loops=padded_sum_loops, stored_when=padded_sum_top),
    "sub": Elementwise(_wrapping("-")),
    "mul": Elementwise(_wrapping("*")),
    "div": Elementwise(_div),
    "neg": Elementwise(_neg),
    "abs": Elementwise(_abs),
    "sign": Elementwise(_sign),
    "max": Elementwise(_extremum("max", ">=")),
    "min": Elementwise(_extremum("min", "<=")),
    "pow": Elementwise(_pow, refuses=_int_exponent, checked=Lowering._lower_int_pow),
    "stop_gradient": Elementwise("{0}"),
    "cast": Elementwise(_cast),
    # the C library's functions (vkml.ops.special's among them)
    **{name: Elementwise(libm(name)) for name in PRIMITIVE_CALLS},
    "round": Elementwise(_round),
    # comparisons and logic (booleans are 0 or 1)
    "eq": Elementwise("({0} == {1})"),
    "ne": Elementwise("({0} != {1})"),
    "lt": Elementwise("({0} < {1})"),
    "le": Elementwise("({0} <= {1})"),
    "gt": Elementwise("({0} > {1})"),
    "ge": Elementwise("({0} >= {1})"),
    "logical_not": Elementwise("(!{0})"),
    "logical_and": Elementwise("({0} && {1})"),
    "logical_or": Elementwise("({0} || {1})"),
    "where": Elementwise(_where),
    # movement
    "broadcast_in_dim": View(_broadcast_in_dim, stores_operands=_broadcast_repeats,
                             moved=_broadcast_moved),
    "transpose": View(_transpose, read_in_place=True,
                      moved=lambda xs, e: np.transpose(xs[0], e.params["perm"])),
    "slice": View(_slice, offsets=("starts", "limits"), moved=_slice_moved),
    "flip": View(_flip, moved=lambda xs, e: np.flip(xs[0], e.params["axes"])),
    "reshape": Reshape(),
    "pad": View(_pad, zero_border=True, own_loops=padded_store),
    "concatenate": Concatenation(),
    # loops of their own
    "reduce_sum": SmallReduction(Lowering._lower_reduce_sum, "sum"),
    "reduce_max": SmallReduction(Lowering._lower_reduce_max, "max"),
    "argmax": Statement(Lowering._lower_argmax),
    "matmul": Product(Lowering._lower_matmul),
    "gather": Statement(Lowering._lower_gather),
    "scatter_add": Statement(Lowering._lower_scatter_add),
    "checked": Statement(Lowering._lower_checked),
    "cumsum": Statement(Lowering._lower_cumsum),
    "argsort": Statement(Lowering._lower_argsort),
    "solve": Statement(Lowering._lower_solve),
    "slogdet": Statement(Lowering._lower_slogdet),
    "cholesky": Statement(Lowering._lower_cholesky),
    # programs inside programs
    "call": Statement(Lowering._lower_call),
    "checkpoint": Statement(Lowering._lower_call),
    "custom_jvp_call": Statement(Lowering._lower_call),
    "custom_vjp_call": Statement(Lowering._lower_call),
    "scan": Statement(Lowering._lower_scan),
    "cond": Statement(Lowering._lower_cond),
    "while": Statement(Lowering._lower_while),
}

#: the primitives deliberately left to NumPy, with the reason
UNSUPPORTED = {
    "custom_lin": "the linear part of a custom_vjp function exists only to be transposed into "
                  "the user's backward program; run forward it only raises its error (on NumPy)",
    **{name: "a bitwise operation: NumPy's shifts by the type's width or more are defined (C's "
             "are not), so a program holding one runs on NumPy" for name in
       ("bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift")},
    **{name: "a part or the magnitude of complex numbers: the C tier has no complex type yet, so "
             "a program with complex values runs on NumPy" for name in
       ("real", "imag", "conj", "complex_abs", "complex_math", "make_complex")},
    "fft": "a Fourier transform (NumPy's pocketfft): the C tier has no FFT of its own, so a "
           "program holding one runs on NumPy",
    **{name: "an iterative decomposition (LAPACK's, through NumPy): the C tier has no generated "
             "loop for it, so a program holding one runs on NumPy" for name in ("eigh", "svd", "qr")},
}
