"""Lowering: a Program to loop nests over statically shaped buffers, in C expression syntax.

One lowering serves every compiled renderer (C for the CPU tier, CUDA C for
the GPU backend): it decides which values live in buffers and which are
computed inline, and turns each equation into a loop nest whose body is one
store of an expression.  Renderers only decide how a loop nest becomes code
(a host loop, a ``#pragma omp`` loop over samples, a CUDA kernel).

What each primitive becomes is its entry in the table of ``rules.py``
(a C expression, or the ``_lower_*`` method below that writes its loops);
the lowering only walks the program and dispatches on that table.  The
statements it produces are the classes of ``statements.py``.

Fusion: a value read once, made by an elementwise primitive or a movement
primitive, is not stored -- its expression is inlined where it is read
(so a chain of 1000 elementwise ops is one loop).  Values read several
times, program outputs, and operands of ops that read an element many times
(a broadcast that repeats, matmul, gather) are stored.

Floating-point contract (see ``cpu.py``): +, -, *, /, sqrt are IEEE
operations in the same order as NumPy, so they give the same bits; the
transcendental functions come from libm and match NumPy within a few ulps.
"""

from __future__ import annotations

import ast
import math
import re

import numpy as np

from ...ir import Program, Var
from .statements import Block, If, Loop, While

CTYPE = {np.dtype(np.float64): "double", np.dtype(np.float32): "float",
         np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t",
         np.dtype(np.bool_): "uint8_t"}


#: a float sum whose innermost reduced extent is a multiple of this adds such blocks as one fixed
#: subtree each (a power of two: an aligned block is a subtree of the canonical tree)
TREE_BLOCK = 8

#: a float sum whose innermost reduced extent has a power-of-two factor of at least
#: ``ROW_CHUNK_MIN`` elements (``Lowering.row_trees``) works through it in aligned chunks of
#: that many, at most ``ROW_CHUNK_MAX``: each chunk's values computed into a buffer by a SIMD
#: loop, the chunk's subtree summed there in vectors (``vk_tree_row``), one push per chunk
ROW_CHUNK_MIN, ROW_CHUNK_MAX = 16, 1024

#: the longest chain of inlined expressions before a value is stored
MAX_INLINE_DEPTH = 32

#: the cheap steps a value read several times may be computed again for in each reader
#: (``Lowering._recomputed``): no libm call, no division
RECOMPUTED = frozenset({"broadcast_in_dim", "add", "sub", "mul", "neg", "max", "min", "where", "cast", "eq", "ne",
                        "lt", "le", "gt", "ge"})
#: ... with at most this many operations in the recomputed expression (a view of a value,
#: a constant broadcast, costs none)
MAX_RECOMPUTE_COST = 3
#: the views that cost nothing to read through
FREE_VIEWS = frozenset({"broadcast_in_dim", "reshape", "transpose"})
#: ... read by at most this many equations
MAX_RECOMPUTE_USES = 3
#: ... of at least this many elements (smaller ones stay in the caches anyway)
RECOMPUTE_MIN_SIZE = 1 << 14
#: the most elements a reduction reads as an expression (``Lowering.inline_reductions``): past
#: it the operand is stored first as before, so an operand too big to allocate is still the
#: allocation's clean error rather than a loop running for hours (a broadcast of 2^44 elements)
REDUCED_INLINE_MAX = 1 << 26
#: a float max over at least this many elements (per output) runs its quick SIMD pass first
VECTOR_MAX_MIN = 16
#: the pragma before a loop whose iterations are independent, vectorised as it stands (an
#: innermost loop marked parallel: ``c_render.emit``'s ``simd``)
SIMD_LOOP = "#pragma omp simd"
#: the pragma of that pass: the largest value and whether any element is NaN, lane by lane
SIMD_MAX = "#pragma omp simd reduction(max:vk_hi) reduction(|:vk_nan)"


#: the most elements a constant is written into the C source as (a static array) where the
#: lowering lifts larger ones (``Lowering.lift_from``): a larger one would make the source, and
#: its compile time, grow with the data (a jitted function closing over a dataset), so it is
#: read from an argument the caller appends
STATIC_MAX = 4096

#: the most elements of a static array where constants are not lifted (past it the program is
#: not compiled)
STATIC_LIMIT = 65536


class Unsupported(Exception):
    """A program this lowering cannot compile; the backend runs it on NumPy instead."""


def _c_literal(value, dtype):
    dtype = np.dtype(dtype)
    v = np.asarray(value, dtype=dtype).item()
    if dtype.kind == "f":
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(float(v))
        return f"{text}f" if dtype == np.float32 else text
    if dtype.kind == "b":
        return "1" if v else "0"
    return f"(({CTYPE[dtype]}){int(v)}LL)"


def row_major_strides(shape):
    """The element strides of a C-contiguous array of ``shape`` (what the lowering and the rules
    table index buffers with)."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def axis_groups(out_shape, in_shape):
    """The axes of a reshape from ``in_shape`` to ``out_shape`` (the same number of elements)
    matched in the smallest groups of equal size, axes of one element left out: ``[(out_axes,
    in_axes), ...]`` in order -- (n, c, h, w) -> (n, c, h * w) is ([0], [0]), ([1], [1]),
    ([2], [2, 3]).  Each group maps on its own (``rules.reshaped_index``)."""
    outs = [k for k, d in enumerate(out_shape) if d != 1]
    ins = [k for k, d in enumerate(in_shape) if d != 1]
    groups, o, i = [], 0, 0
    while o < len(outs) and i < len(ins):
        group_out, group_in = [outs[o]], [ins[i]]
        size_out, size_in = out_shape[outs[o]], in_shape[ins[i]]
        while size_out != size_in:
            if size_out < size_in:
                o += 1
                group_out.append(outs[o])
                size_out *= out_shape[outs[o]]
            else:
                i += 1
                group_in.append(ins[i])
                size_in *= in_shape[ins[i]]
        groups.append((group_out, group_in))
        o, i = o + 1, i + 1
    return groups


def reshaped_strides(in_shape, in_strides, out_shape):
    """The element strides of a reshape to ``out_shape`` of a view of ``in_shape`` with
    ``in_strides``, or None where the reshape needs a copy (a group of merged axes that are not
    laid out one after the other, as a transpose's may not be)."""
    out = [0] * len(out_shape)
    for group_out, group_in in axis_groups(out_shape, in_shape):
        for a, b in zip(group_in, group_in[1:]):
            if in_strides[a] != in_strides[b] * in_shape[b]:
                return None
        stride = in_strides[group_in[-1]]
        for k in reversed(group_out):
            out[k] = stride
            stride *= out_shape[k]
    return out


#: a C identifier
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def calls_pattern(names):
    """A regular expression finding a call of one of the C functions ``names`` (its group 1:
    the name), or None when there are none."""
    return re.compile(r"(?<![\w])(" + "|".join(sorted(map(re.escape, names))) + r")\(") \
        if names else None


def _step_cost(e) -> int:
    """The operations equation ``e`` adds to an inlined expression: a free view none, a cheap
    step one, anything else (a division, a libm call) more than a recomputed value may hold."""
    return 0 if e.prim.name in FREE_VIEWS else 1 if e.prim.name in RECOMPUTED else \
        MAX_RECOMPUTE_COST + 1


def tree_expression(leaves, zero="0"):
    """The canonical tree over the C expressions ``leaves`` as one expression: pairs added
    left to right, level by level, the leaves padded with zeros to a power of two (a leaf
    whose partner is padding gets ``+ zero`` -- the +0.0 the streamed tree's fold adds, which
    turns -0.0 into +0.0 -- and a pair of padding stays padding)."""
    level = list(leaves) + [None] * ((1 << (len(leaves) - 1).bit_length()) - len(leaves))
    while len(level) > 1:
        level = [None if a is None else f"({a} + {zero})" if b is None else f"({a} + {b})"
                 for a, b in zip(level[::2], level[1::2])]
    return level[0]


def _block_tree(env, x, full, last, r):
    """The tree over ``TREE_BLOCK`` consecutive elements of ``x`` along axis ``last`` (block
    ``r`` of it), at the other axes' indices ``full``: one item of a streamed tree's level
    log2(TREE_BLOCK)."""
    return tree_expression([env.read(x, [f"({r} * {TREE_BLOCK} + {j})" if i == last else v
                                         for i, v in enumerate(full)])
                            for j in range(TREE_BLOCK)])


def mark_parallel(stmts, depth):
    """Mark the outer ``depth`` loops of each loop nest in ``stmts`` as parallel (every iteration
    independent of the others: each stores its own elements and reads none another stores), what
    a renderer may spread over threads -- CUDA's grids, the cpu tier's OpenMP threads
    (``threaded_nests``)."""
    for s in stmts:
        loop, d = s, 0
        while isinstance(loop, Loop) and d < depth:
            loop.parallel = True
            d += 1
            loop = loop.body[0] if len(loop.body) == 1 else None
    return stmts


def linear_index(idx, shape):
    """The C expression of the flat offset of index expressions ``idx`` in a C-contiguous buffer
    of ``shape`` (shared by the C and CUDA lowerings and the rules table)."""
    if not shape:
        return "0"
    terms = []
    for i, s in zip(idx, row_major_strides(shape)):
        if s == 0:
            continue
        terms.append(i if s == 1 else f"({i})*{s}")
    return " + ".join(terms) if terms else "0"


def index_form(index, names, fixed=frozenset()):
    """The C index expression ``index`` as a linear form in the variables ``names``: ``(constant,
    ((name, coefficient), ...))`` with the zero coefficients left out, or None where it is not
    one (a division, a remainder, a product of two variables, another name).  The variables
    ``fixed`` are 0 (a loop of one iteration)."""
    try:
        tree = ast.parse(index, mode="eval").body
    except SyntaxError:
        return None
    names = set(names)

    def form(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value, {}
        if isinstance(node, ast.Name) and node.id in names:
            return 0, {node.id: 1}
        if isinstance(node, ast.Name) and node.id in fixed:
            return 0, {}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = form(node.operand)
            return None if inner is None else (-inner[0], {v: -c for v, c in inner[1].items()})
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = form(node.left), form(node.right)
            if a is None or b is None:
                return None
            if isinstance(node.op, ast.Mult):
                if a[1] and b[1]:
                    return None
                (k, _), (c, terms) = (a, b) if not a[1] else (b, a)
                return k * c, {v: k * x for v, x in terms.items()}
            sign = 1 if isinstance(node.op, ast.Add) else -1
            terms = dict(a[1])
            for v, x in b[1].items():
                terms[v] = terms.get(v, 0) + sign * x
            return a[0] + sign * b[0], terms
        return None
    got = form(tree)
    return None if got is None else (got[0], tuple(sorted((v, c) for v, c in got[1].items() if c)))


class Lowering:
    """Lower one Program (and the programs nested in it) to statements.

    ``rules``: what each primitive becomes, by name (``rules.C_RULES``; a renderer whose
    lowering differs sets its own table).
    """

    def __init__(self):
        from .rules import C_RULES  # local: cycle (rules imports this module: its table names our methods)
        self.rules = C_RULES
        self.temps = []          # (name, ctype, count)
        #: where the C renderer put the heap temporaries in a caller's scratch block:
        #: ``(offsets, total bytes)`` (``c_render.scratch_layout``)
        self.scratch = None
        self.temp_vars = []      # the Var each temporary holds (named in an allocation failure)
        self.statics = []        # static const arrays (constants the program holds)
        self.errors = []         # primitive names, by error code - 1
        self.error_sites = []    # the top-level equation each error code belongs to
        self.messages = {}       # error code -> the message of a failed check (``checked``)
        self.warnings = []       # the messages of warning checks, by warning slot
        self.checks = False      # whether the renderer reports checks (else they run on NumPy)
        self.fuse_loops = False  # whether sibling elementwise loops share one nest (``_LoopGroup``)
        #: whether the 0-d arguments are read into locals before the loops (``_program``)
        self.scalars_in_locals = False
        self.counter = 0
        self.depth = 0           # programs being lowered (1: the top-level one)
        #: per equation of the top-level program, the index it is named by in errors (None: its
        #: own; a rewritten program's ``sites``, see ``products.transposed_products``)
        self.sites = None
        #: whether big float products are one GEMM call each (``products``; the C tier's
        #: programs), and the C types of those that are (the renderer includes their GEMMs)
        self.gemm = False
        self.gemm_types = set()
        self.gemm_packs = {}     # dtype -> the GEMM's packing scratch (``products._pack``)
        self.gemm_batch_packs = {}   # dtype -> the packing slots of products run side by side
        #: the transposes of the program being lowered that only GEMMs read (never stored)
        self.free_transposes = set()
        #: the threads the GEMM splits a product's rows over (its scratch holds a block of A each)
        self.gemm_threads = 1
        #: whether a default-order float product adds each of its terms with one fused
        #: multiply-add (the cpu tier's fused mode: the GEMM and the plain loops alike)
        self.fused = False
        #: whether a float sum that keeps its operand's last axis runs its canonical trees
        #: side by side along that axis (``_column_trees``; the C tier's programs)
        self.column_trees = False
        #: whether a float sum along its operand's rows computes them a chunk at a time in
        #: vectors (``_row_chunks``; the C tier's programs)
        self.row_trees = False
        #: whether a float sum of zero-padded windows is stored by one pass per window
        #: (``padded_sums``; the C tier's programs)
        self.padded_sums = False
        #: whether a float max over a long axis first runs an OpenMP SIMD pass (``_vector_max``;
        #: the C tier's programs)
        self.vector_max = False
        #: whether a reduction's loops read a cheap elementwise operand read by nothing else
        #: as its expression instead of storing it first (``_program``; the C tier's programs)
        self.inline_reductions = False
        #: where set, the number of the program's own arguments: a constant of more than
        #: ``STATIC_MAX`` elements becomes the argument after them (``lifted``: their values,
        #: which every call hands in after its own arguments)
        self.lift_from = None
        self.lifted = []
        #: where set (the C tier), ``products.gathered_operands``: which products' operands the
        #: GEMM gathers from where they are (``gathered``, by ``id`` of the product) and the
        #: movements then never computed (``skipped``)
        self.gather_operands = None
        self.gathered, self.skipped = {}, set()
        #: where set (the C tier), ``blocked_products.blocked_products``: which products are
        #: computed an image at a time by the padded sums reading them (``blocked``, by ``id``
        #: of the sum's last add; the products and their movements join ``skipped``)
        self.block_products = None
        self.blocked = {}
        self.site = 0            # the top-level equation being lowered

    def fresh(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def static(self, var, value):
        """A constant as a static C array (programs capture small constants), or a large one
        as an argument (see ``lift_from``)."""
        value = np.asarray(value, dtype=var.dtype).reshape(-1)
        if value.size > STATIC_MAX and self.lift_from is not None:
            self.lifted.append(value)
            return f"a{self.lift_from + len(self.lifted) - 1}"
        if value.size > STATIC_LIMIT:
            raise Unsupported("a large array constant")
        name = self.fresh("k")
        items = ", ".join(_c_literal(x, var.dtype) for x in value) or "0"
        self.statics.append(f"static const {CTYPE[var.dtype]} {name}[{max(1, value.size)}] = {{{items}}};")
        return f"(({CTYPE[var.dtype]}*){name})"

    def temp(self, var):
        name = self.fresh("t")
        self.temps.append((name, CTYPE[var.dtype], max(1, var.size)))
        self.temp_vars.append(var)
        return name

    # -- a whole program ----------------------------------------------------------------------
    def _free_transposes(self, prog, outputs) -> set:
        """The transposes every reader of which reads them in place -- GEMM-computed products
        and other such transposes -- so they are never stored however many read them (a
        weight's transpose read by the forward product and by the input gradient's)."""
        readers = {}
        for e in prog.eqns:
            for v in e.inputs:
                readers.setdefault(v, []).append(e)
        def reads_in_place(r):
            method = getattr(self.rules.get(r.prim.name), "reads_in_place", None)
            return method is not None and method(self, r)
        free = set()
        for e in reversed(prog.eqns):
            out = e.outputs[0]
            if not getattr(self.rules.get(e.prim.name), "read_in_place", False) or out in outputs:
                continue
            if readers.get(out) and all(reads_in_place(r) or r.outputs[0] in free
                                        for r in readers[out]):
                free.add(out)
        return free

    def _recomputed(self, e, uses, ops) -> bool:
        """Whether ``e``'s value, read by several equations, is computed again in each reader
        instead of stored: a cheap arithmetic step (:data:`RECOMPUTED`, at most
        :data:`MAX_RECOMPUTE_COST` operations -- ``ops`` -- with the values inlined into it)
        read by at most :data:`MAX_RECOMPUTE_USES`, an array of at least
        :data:`RECOMPUTE_MIN_SIZE` elements at the program's top level (a scan's step, or a
        small array, is bound by its arithmetic, not by memory).  A training step's elementwise
        work is bound by memory --
        an intermediate stored and read back costs more than its multiply computed again in
        each nest that reads it -- and the value computed again is the same value, bit for
        bit."""
        return self.fuse_loops and self.depth == 1 and e.prim.name in RECOMPUTED and \
            e.outputs[0].size >= RECOMPUTE_MIN_SIZE and \
            uses.get(e.outputs[0], 0) <= MAX_RECOMPUTE_USES and ops <= MAX_RECOMPUTE_COST

    def program(self, prog: Program, in_ptrs, out_ptrs):
        """Statements computing ``prog`` from buffers ``in_ptrs`` into buffers ``out_ptrs``."""
        self.depth += 1
        try:
            return self._program(prog, in_ptrs, out_ptrs)
        finally:
            self.depth -= 1

    def _program(self, prog, in_ptrs, out_ptrs):
        for v in list(prog.inputs) + [o for o in prog.outputs]:
            if v.dtype not in CTYPE:
                raise Unsupported(f"dtype {v.dtype}")
        uses, readers = {}, {}
        for e in prog.eqns:
            for v in e.inputs:
                uses[v] = uses.get(v, 0) + 1
                readers.setdefault(v, []).append(e)
        producer = {o: e for e in prog.eqns for o in e.outputs}
        outputs = {}
        for v, p in zip(prog.outputs, out_ptrs):
            outputs.setdefault(v, p)
        self.free_transposes = self._free_transposes(prog, outputs)
        if self.gather_operands is not None and self.depth == 1:
            self.gathered, self.skipped = self.gather_operands(self, prog, outputs, uses, readers,
                                                               producer)
        if self.block_products is not None and self.depth == 1:
            self.blocked, skipped = self.block_products(self, prog, outputs, uses, readers,
                                                        producer)
            self.skipped = self.skipped | skipped
        stored = set()
        # operands a reduction may read as their expressions: a mask, a difference squared, a
        # product -- each element read once, so storing it first only writes and reads it again
        reduced = set()
        for e in prog.eqns:
            rule = self.rules.get(e.prim.name)
            if rule is None:
                stored.update(e.inputs)
            elif hasattr(rule, "stored_operands"):      # (a rule choosing which to store)
                stored.update(rule.stored_operands(self, e, producer, uses))
            elif self.inline_reductions and self.depth == 1 and \
                    getattr(rule, "reads_inline", lambda e: False)(e):
                reduced.update(e.inputs)
            elif rule.stores_operands(e):
                stored.update(e.inputs)
        buffers = {}
        consts = {}
        for v, p in zip(prog.inputs, in_ptrs):
            buffers[v] = p
        for v, value in prog.consts:
            consts[v] = value
        stmts = []
        env = _Env(self, buffers, consts, producer)
        if self.scalars_in_locals and self.depth == 1:
            # a 0-d argument is read once, into a local, before the loops: read in a loop, it
            # must be loaded again after every store (which may be to its buffer), and a nest
            # storing a bool (a ReLU's mask) beside it then stays scalar
            for v, p in zip(prog.inputs, in_ptrs):
                if v.shape == () and uses.get(v):
                    stmts.append(f"const {CTYPE[v.dtype]} {p}_s = {p}[0];")
                    env.scalars[v] = f"{p}_s"
        depth = {}
        cost = {}                # the operations an inlined value's expression holds
        group = None             # the loop nest elementwise results join (``fuse_loops``)
        for k, e in enumerate(prog.eqns):
            if self.depth == 1:
                self.site = k if self.sites is None else self.sites[k]
            rule = self.rules.get(e.prim.name)
            if e.outputs[0:1] and e.outputs[0] in self.skipped:
                continue            # (a movement a product gathers, a blocked product)
            ops = _step_cost(e) + sum(cost.get(v, 0) for v in e.inputs)
            inline = all(o not in outputs for o in e.outputs) and len(e.outputs) == 1 and \
                rule is not None and rule.fusible(e) and e.outputs[0] not in stored and \
                (uses.get(e.outputs[0], 0) == 1 or e.outputs[0] in self.free_transposes or
                 self._recomputed(e, uses, ops))
            if inline and e.outputs[0] in reduced and (ops > MAX_RECOMPUTE_COST or
                                                       e.outputs[0].size > REDUCED_INLINE_MAX):
                inline = False     # (a libm call or a division: computed in a vector nest first)
            if inline:
                # a long chain is cut into stored pieces, so one expression stays of modest size
                d = 1 + max((depth.get(v, 0) for v in e.inputs), default=0)
                stored_when = getattr(rule, "stored_when", None)
                inline = d <= MAX_INLINE_DEPTH and not (
                    stored_when is not None and stored_when(self, e, env, readers))
            if inline:
                depth[e.outputs[0]] = d
                cost[e.outputs[0]] = ops
                env.inline.add(e.outputs[0])
                continue
            if self._aliased_reshape(e, buffers, outputs):
                group = None        # (a nest reading it joins no nest writing its operand)
                continue
            targets = []
            for o in e.outputs:
                if o in outputs and o not in buffers:
                    buffers[o] = outputs[o]
                elif o not in buffers:
                    buffers[o] = self.temp(o)
                targets.append(buffers[o])
            own = getattr(rule, "own_loops", None)
            alone = own(self, e, env, targets) if own is not None and len(targets) == 1 else None
            if alone is not None:
                group = None
                stmts += alone
                continue
            if self.fuse_loops and rule is not None and rule.fusible(e) and len(targets) == 1:
                if group is not None and group.take(e, env, targets[0], stmts):
                    continue
                group = _LoopGroup(self, e, env, targets[0], stmts)
                continue
            group = None
            stmts += self.eqn(e, env, targets)
        # outputs that are inputs, constants or repeated: copy them in
        done = set()
        for v, p in zip(prog.outputs, out_ptrs):
            if buffers.get(v) == p and v not in done and v not in prog.inputs:
                done.add(v)
                continue
            stmts += self.store(v.shape, p, lambda idx, v=v: env.read(v, idx))
        return stmts

    def _aliased_reshape(self, e, buffers, outputs) -> bool:
        """Whether ``e``, a reshape (its rule's ``same_bytes``) to be stored, is its operand's
        temporary itself: a stored array is row-major, so its reshape is the same bytes (a
        convolution's column gradient (C*kh*kw, N*Ho*Wo) read back as (C, taps, N, Ho*Wo) was
        copied, 3 MB a step).  The reshape's buffer is named as its operand's: everything that
        tracks buffers by name (fused nests, in-place reuse) sees its reads as the operand's."""
        if not getattr(self.rules.get(e.prim.name), "same_bytes", False) or e.outputs[0] in outputs:
            return False
        x = e.inputs[0]
        if x not in buffers or buffers[x] not in {name for name, _, _ in self.temps}:
            return False
        buffers[e.outputs[0]] = buffers[x]
        return True

    def store(self, shape, target, value_at, checks=None, at=None):
        """A loop nest over ``shape`` storing ``value_at(idx)`` into ``target``; ``checks(idx)``:
        lines run before each store (that refuse an element's operands); ``at(idx)``: where in
        ``target`` (by default its row-major element ``idx`` of ``shape``)."""
        idx = [self.fresh("i") for _ in shape]
        where = at(idx) if at is not None else linear_index(idx, shape)
        body = [f"{target}[{where}] = {value_at(idx)};"]
        if checks is not None:
            body = [Block(checks(idx) + body)]
        for var, extent in reversed(list(zip(idx, shape))):
            body = [Loop(var, extent, body)]
        return mark_parallel(body, len(shape))

    # -- one equation ---------------------------------------------------------------------------
    def eqn(self, e, env, targets):
        """Statements storing ``e``'s results into ``targets``: its rule's."""
        rule = self.rules.get(e.prim.name)
        if rule is None:
            raise Unsupported(e.prim.name)
        return rule.lower(self, e, env, targets)

    def _lower_int_pow(self, e, env, targets):
        """An integer power, refusing a negative exponent as NumPy does (the exponent is read once
        into a local, checked, then used)."""
        x, y = e.inputs
        code = self.error_code(e)
        t = CTYPE[x.dtype]
        b = self.fresh("b")
        checks = lambda idx: [  # noqa: E731
            f"const {t} {b} = {env.read(y, idx)};",
            f"if ({b} < 0) {{ *err = {code}; info[0] = {b}; info[1] = 0; info[2] = 0; goto done; }}"]
        return self.store(e.outputs[0].shape, targets[0],
                          lambda idx: f"vk_ipow_{t}({env.read(x, idx)}, {b})", checks)

    def _lower_reduce_sum(self, e, env, targets):
        if e.outputs[0].dtype.kind != "f":      # wrapping integer sums: every order, same bits
            return self._reduce(e, env, targets[0], "acc += {x};", "0")
        return self._tree_reduce(e, env, targets[0])

    def _reduce_indices(self, x, axes):
        """Loop variables of a reduction: per kept axis, per reduced axis, and the full index of
        ``x`` they address."""
        kept = [i for i in range(x.ndim) if i not in axes]
        oidx = [self.fresh("i") for _ in kept]
        ridx = [self.fresh("r") for _ in axes]
        full = [None] * x.ndim
        for i, v in zip(kept, oidx):
            full[i] = v
        for i, v in zip(axes, ridx):
            full[i] = v
        return oidx, ridx, full

    def tree_stack(self, dtype, count):
        """Declarations of a streamed canonical tree over ``count`` elements (``kernels_cu/helpers.h``):
        ``(lines, stack name)``; the stack holds one partial per bit of ``count``."""
        st = self.fresh("st")
        return [f"{CTYPE[dtype]} {st}[{max(1, int(count).bit_length() + 1)}];"], st

    @staticmethod
    def tree_fold(dtype, st, count):
        """The expression finishing a streamed tree of ``count`` elements (padded to a power of two)."""
        levels = (int(count) - 1).bit_length() if count else 0
        return f"vk_tree_fold_{CTYPE[dtype]}({st}, {count}, {levels})"

    def _tree_reduce(self, e, env, target):
        """A float sum: per output, the canonical tree over the reduced elements in row-major order
        of the reduced axes (as ``vkml.ops.treesum.tree_reduce``: the NumPy backend's bits), each
        element pushed onto a binary-counter stack and the stack folded at the end."""
        x, out = e.inputs[0], e.outputs[0]
        axes = sorted(e.params["axes"])
        if self.column_trees and axes and x.ndim - 1 not in axes and x.shape[-1] > 1 and \
                math.prod(x.shape[a] for a in axes) > 1:
            return self._column_trees(e, env, target)
        total = math.prod(x.shape[a] for a in axes)
        oidx, ridx, full = self._reduce_indices(x, axes)
        t = CTYPE[out.dtype]
        decl, st = self.tree_stack(out.dtype, total)
        cnt = self.fresh("n")
        extents = [x.shape[a] for a in axes]
        chunk = min(extents[-1] & -extents[-1], ROW_CHUNK_MAX) if extents else 0
        if self.row_trees and chunk >= ROW_CHUNK_MIN:
            inner = self._row_chunks(env, x, full, axes[-1], ridx[-1], chunk, st, cnt)
            extents[-1] //= chunk
        elif extents and extents[-1] % TREE_BLOCK == 0:
            # full aligned blocks along the innermost reduced axis: a fixed tree of TREE_BLOCK
            # elements (independent adds), pushed as one item of level log2(TREE_BLOCK)
            level = TREE_BLOCK.bit_length() - 1
            block = _block_tree(env, x, full, axes[-1], ridx[-1])
            inner = [f"vk_tree_push_{t}({st}, {cnt}, {level}, {block}); {cnt} += {TREE_BLOCK};"]
            extents[-1] //= TREE_BLOCK
        else:
            inner = [f"vk_tree_push_{t}({st}, {cnt}, 0, {env.read(x, full)}); {cnt}++;"]
        for v, extent in reversed(list(zip(ridx, extents))):
            inner = [Loop(v, extent, inner)]
        body = [Block(decl + [f"int64_t {cnt} = 0; (void){cnt};"] + inner +
                       [f"{target}[{linear_index(oidx, out.shape)}] = {self.tree_fold(out.dtype, st, total)};"])]
        for v, extent in reversed(list(zip(oidx, out.shape))):
            body = [Loop(v, extent, body)]
        return mark_parallel(body, out.ndim)

    def _row_chunks(self, env, x, full, last, r, chunk, st, cnt):
        """The statements pushing chunk ``r`` of ``chunk`` consecutive elements of ``x`` along
        axis ``last`` (a power of two, aligned: a subtree of the canonical tree) as one item:
        its values computed into a buffer by a SIMD loop -- the operand's expression in vectors,
        where the streamed tree would compute it an element at a time between its adds -- then
        summed there level by level with the same additions (``vk_tree_row``)."""
        t = CTYPE[x.dtype]
        buf, j = self.fresh("buf"), self.fresh("j")
        at = [f"({r} * {chunk} + {j})" if i == last else v for i, v in enumerate(full)]
        return [Block([f"{t} {buf}[{chunk}] __attribute__((aligned(64)));",
                       SIMD_LOOP, Loop(j, chunk, [f"{buf}[{j}] = {env.read(x, at)};"]),
                       f"vk_tree_push_{t}({st}, {cnt}, {chunk.bit_length() - 1}, "
                       f"vk_tree_row_{t}({buf}, {chunk})); {cnt} += {chunk};"])]

    def _column_trees(self, e, env, target):
        """A float sum keeping its operand's last axis (a bias's gradient: the sum over a
        batch's rows of each column), its trees run side by side along that axis: every
        column's tree pushes its items at the same counts, so the carries of the binary-counter
        stacks (``vk_tree_cols_push``) and the fold are one control flow for all columns and
        each step is a loop over the columns the compiler vectorises -- the same additions,
        in the same order, as one tree per column read down a column's stride."""
        x, out = e.inputs[0], e.outputs[0]
        axes = sorted(e.params["axes"])
        total = math.prod(x.shape[a] for a in axes)
        oidx, ridx, full = self._reduce_indices(x, axes)
        t = CTYPE[out.dtype]
        width = x.shape[-1]
        levels = int(total).bit_length() + 1
        stack = self.temp(Var((levels * width,), out.dtype))
        items = self.temp(Var((width,), out.dtype))
        cnt, col = self.fresh("n"), oidx[-1]
        extents = [x.shape[a] for a in axes]
        if extents[-1] % TREE_BLOCK == 0:
            item = _block_tree(env, x, full, axes[-1], ridx[-1])
            level, step = TREE_BLOCK.bit_length() - 1, TREE_BLOCK
            extents[-1] //= TREE_BLOCK
        else:
            item, level, step = env.read(x, full), 0, 1
        inner = [Loop(col, width, [f"{items}[{col}] = {item};"]),
                 f"vk_tree_cols_push_{t}({stack}, {cnt}, {level}, {items}, {width}); {cnt} += {step};"]
        for v, extent in reversed(list(zip(ridx, extents))):
            inner = [Loop(v, extent, inner)]
        row = linear_index(oidx[:-1] + ["0"], out.shape)
        body = [Block([f"int64_t {cnt} = 0; (void){cnt};"] + inner +
                      [f"vk_tree_cols_fold_{t}({stack}, {total}, {(int(total) - 1).bit_length()}, "
                       f"{items}, {width}, {target} + {row});"])]
        for v, extent in reversed(list(zip(oidx[:-1], out.shape[:-1]))):
            body = [Loop(v, extent, body)]
        return body

    def _lower_reduce_max(self, e, env, targets):
        x = e.inputs[0]
        first = "acc = {x};"
        step = "if (!(acc >= {x}) && !(acc != acc)) acc = {x};" if x.dtype.kind == "f" else \
            "if ({x} > acc) acc = {x};"
        if self.vector_max and x.dtype.kind == "f" and \
                math.prod(x.shape[a] for a in e.params["axes"]) >= VECTOR_MAX_MIN:
            return self._reduce(e, env, targets[0], step, None, first, quick=self._vector_max)
        return self._reduce(e, env, targets[0], step, None, first)

    def _vector_max(self, x, ridx, axes, val, scalar_loops):
        """A float max's loops with a quick pass before them: the NaN-aware scalar loop (the
        first NaN, else the largest value, the first of equals) branches on every element
        and stays scalar.  An OpenMP SIMD pass finds the largest value and whether any is
        NaN in vector registers; when none is NaN and the largest is not zero, that value is
        the answer whatever order the lanes compared in (equal floats other than zeros have
        the same bits), and the scalar loop runs only otherwise (a NaN, or a -0.0 beside a
        +0.0 where the first one counts)."""
        t = CTYPE[x.dtype]
        start = val
        for r in ridx:
            start = re.sub(rf"(?<![\w]){r}(?![\w])", "0", start)
        inner = [f"vk_hi = {val} > vk_hi ? {val} : vk_hi; vk_nan |= {val} != {val};"]
        for k, (v, a) in enumerate(reversed(list(zip(ridx, axes)))):
            inner = ([SIMD_MAX] if k == 0 else []) + [Loop(v, x.shape[a], inner)]
        return [f"{t} vk_hi = {start}; int vk_nan = 0;"] + inner + \
            [If("!vk_nan && vk_hi != 0", ["acc = vk_hi;"], True), If("else", scalar_loops, False)]

    def _reduce(self, e, env, target, step, init, first=None, quick=None):
        x, out = e.inputs[0], e.outputs[0]
        axes = e.params["axes"]
        oidx, ridx, full = self._reduce_indices(x, axes)
        acc_t = CTYPE[out.dtype]
        val = env.read(x, full)
        inner = [step.format(x=val)]
        if first is not None:
            cond = " && ".join(f"{r} == 0" for r in ridx) or "1"
            inner = [f"if ({cond}) {{ {first.format(x=val)} }} else {{ {step.format(x=val)} }}"]
        for v, a in reversed(list(zip(ridx, axes))):
            inner = [Loop(v, x.shape[a], inner)]
        if quick is not None:       # (``quick(x, ridx, axes, val, loops)``: loops with a pass first)
            inner = quick(x, ridx, axes, val, inner)
        body = [f"{acc_t} acc = {init if init is not None else 0};"] + inner + \
            [f"{target}[{linear_index(oidx, out.shape)}] = acc;"]
        body = [Block(body)]
        for v, extent in reversed(list(zip(oidx, out.shape))):
            body = [Loop(v, extent, body)]
        return mark_parallel(body, out.ndim)

    def _lower_argmax(self, e, env, targets):
        x, out = e.inputs[0], e.outputs[0]
        axis = e.params["axis"]
        if x.shape[axis] == 0:
            # NumPy refuses an empty axis (even into an empty result); the backend runs the
            # program there, for its error
            raise Unsupported("argmax over an empty axis")
        oidx = [self.fresh("i") for _ in out.shape]
        r = self.fresh("r")
        full = list(oidx[:axis]) + [r] + list(oidx[axis:])
        val = env.read(x, full)
        t = CTYPE[x.dtype]
        nan_check = f" || ({val} != {val})" if x.dtype.kind == "f" else ""
        body = [Block([f"{t} best = 0; int64_t arg = -1;",
                       Loop(r, x.shape[axis], [f"if (arg < 0 || {val} > best{nan_check}) "
                                               f"{{ if (arg < 0 || !(best != best)) {{ best = {val}; arg = {r}; }} }}"]),
                       f"{targets[0]}[{linear_index(oidx, out.shape)}] = arg;"])]
        for v, extent in reversed(list(zip(oidx, out.shape))):
            body = [Loop(v, extent, body)]
        return body

    def _lower_matmul(self, e, env, targets):
        a, b = e.inputs
        out = e.outputs[0]
        if e.params.get("order") == "tree" and out.dtype.kind == "f":
            return self._tree_matmul(e, env, targets)
        idx = [self.fresh("i") for _ in out.shape]
        k = self.fresh("k")
        batch = idx[:-2]
        ai = batch + [idx[-2], k]
        bi = batch + [k, idx[-1]]
        t = CTYPE[out.dtype]
        # the default product: k in index order (BLAS on NumPy picks its own order), each term
        # a rounded product then a rounded sum, or one fused multiply-add in the fused mode
        x, y = env.read(a, ai), env.read(b, bi)
        if self.fused and out.dtype.kind == "f":
            step = f"acc = __builtin_fma{'f' if out.dtype == np.float32 else ''}({x}, {y}, acc);"
        else:
            step = f"acc += {x} * {y};"
        body = [Block([f"{t} acc = 0;", Loop(k, a.shape[-1], [step]),
                       f"{targets[0]}[{linear_index(idx, out.shape)}] = acc;"])]
        for v, extent in reversed(list(zip(idx, out.shape))):
            body = [Loop(v, extent, body)]
        return body

    def _tree_matmul(self, e, env, targets):
        """The deterministic product: each output the canonical tree over k of its products (the
        NumPy backend's bits).  ``b`` is first copied transposed, so both operands are read along
        k contiguously; aligned blocks of TREE_BLOCK values of k are one fixed subtree each."""
        a, b = e.inputs
        out = e.outputs[0]
        n_k = a.shape[-1]
        t = CTYPE[out.dtype]
        bt_var = Var(b.shape[:-2] + (b.shape[-1], n_k), b.dtype, b.device)
        bt = self.temp(bt_var)
        stmts = self.store(bt_var.shape, bt, lambda i: env.read(b, i[:-2] + [i[-1], i[-2]]))
        idx = [self.fresh("i") for _ in out.shape]
        k = self.fresh("k")

        def product(at):
            return f"({env.read(a, idx[:-1] + [at])} * {bt}[{linear_index(idx[:-2] + [idx[-1], at], bt_var.shape)}])"
        decl, st = self.tree_stack(out.dtype, n_k)
        if n_k % TREE_BLOCK == 0:
            block = tree_expression([product(f"({k} * {TREE_BLOCK} + {j})")
                                     for j in range(TREE_BLOCK)])
            level = TREE_BLOCK.bit_length() - 1
            loop = Loop(k, n_k // TREE_BLOCK,
                        [f"vk_tree_push_{t}({st}, {k} * {TREE_BLOCK}, {level}, {block});"])
        else:
            loop = Loop(k, n_k, [f"vk_tree_push_{t}({st}, {k}, 0, {product(k)});"])
        result = f"{targets[0]}[{linear_index(idx, out.shape)}] = {self.tree_fold(out.dtype, st, n_k)};"
        body = [Block(decl + [loop, result])]
        for v, extent in reversed(list(zip(idx, out.shape))):
            body = [Loop(v, extent, body)]
        return stmts + body

    def _coords(self, env, x_shape, idx_var, prefix, e):
        """Index coordinates as C variables, each checked against its axis (the error names the
        index, the axis and its size, as the NumPy backend's does)."""
        k = idx_var.shape[-1]
        coords, lines = [], []
        code = self.error_code(e)
        for j in range(k):
            c = self.fresh("g")
            lines.append(f"int64_t {c} = (int64_t){env.read(idx_var, list(prefix) + [str(j)])};")
            lines.append(f"if ({c} < 0 || {c} >= {x_shape[j]}) {{ *err = {code}; info[0] = {c}; "
                         f"info[1] = {j}; info[2] = {x_shape[j]}; goto done; }}")
            coords.append(c)
        return coords, lines

    def _indexed_nest(self, env, x_shape, idx, shape, e, store, hoist=True):
        """The loop nest of a gather or scatter over ``shape`` (index rows, then the picked
        slice), each index row checked against ``x_shape``.  ``hoist``: the checks run once per
        index row, outside the slice's loops (so an index into an empty slice is checked too, as
        NumPy checks it); else in the innermost loop, every loop independent per element.
        ``store(idx_vars, coords)`` is the line storing one element."""
        n_prefix = idx.ndim - 1
        ivars = [self.fresh("i") for _ in shape]
        coords, checks = self._coords(env, x_shape, idx, ivars[:n_prefix], e)
        body = [store(ivars, coords + ivars[n_prefix:])]
        inner = list(zip(ivars[n_prefix:], shape[n_prefix:]))
        outer = list(zip(ivars[:n_prefix], shape[:n_prefix]))
        if not hoist:
            body, inner, outer = checks + body, [], outer + inner
        for v, extent in reversed(inner):
            body = [Loop(v, extent, body)]
        if hoist:
            body = checks + body
        for v, extent in reversed(outer):
            body = [Loop(v, extent, body)]
        return body

    def _lower_gather(self, e, env, targets, hoist=True):
        x, idx = e.inputs
        out = e.outputs[0]
        return self._indexed_nest(
            env, x.shape, idx, out.shape, e,
            lambda o, full: f"{targets[0]}[{linear_index(o, out.shape)}] = {env.read(x, full)};", hoist)

    def _lower_scatter_add(self, e, env, targets):
        base, idx, upd = e.inputs
        copy = self.store(base.shape, targets[0], lambda i: env.read(base, i))
        return copy + self._indexed_nest(
            env, base.shape, idx, upd.shape, e,
            lambda u, full: f"{targets[0]}[{linear_index(full, base.shape)}] += {env.read(upd, u)};")

    def error_code(self, e):
        """Errors report the failing primitive back to Python as a code: 1 + its place in ``errors``."""
        self.errors.append(e.prim.name)
        self.error_sites.append(self.site)
        return len(self.errors)

    def _lower_checked(self, e, env, targets):
        """``x`` copied through, after its flag is tested once: a "raise" check fails the run
        (its error code carries the message), a "warn" check sets its warning slot (see
        :meth:`warning_flag`), which the backend turns into one warning after the call.  A
        renderer that has no such channel (``checks`` unset) leaves the program to NumPy."""
        if not self.checks:
            raise Unsupported("a run-time check")
        x, flag = e.inputs
        message = e.params["check"].message
        if e.params["check"].mode == "raise":
            code = self.error_code(e)
            self.messages[code] = message
            report = f"*err = {code}; info[0] = 0; info[1] = 0; info[2] = 0; goto done;"
        else:
            if message not in self.warnings:
                self.warnings.append(message)
            report = self.warning_flag(self.warnings.index(message))
        test = [f"if ({env.read(flag, [])}) {{ {report} }}"]
        return test + self.store(x.shape, targets[0], lambda idx: env.read(x, idx))

    def warning_flag(self, slot):
        """The statement that records warning ``slot`` (the CPU tier: a word of ``info`` after
        the three of an error's details)."""
        return f"info[{3 + slot}] = 1;"

    def _lower_call(self, e, env, targets):
        return self.program(e.params["program"], [env.pointer(v) for v in e.inputs], targets)

    #: the statement a renderer wants before every few scan rows or while iterations (the C
    #: renderers: a poll of the interrupt flag, ``c_render.POLL``); None: nothing
    interrupt_poll = None

    def _poll_every(self, *programs) -> int:
        """Iterations between two interrupt polls: 256 for a scalar step, fewer the more
        elements an iteration computes (one poll per iteration from 4096 on): polls come every
        few microseconds of work and cost nothing measurable.  (One iteration is never cut:
        a step that itself takes seconds answers Ctrl-C after it.)"""
        work = sum(max(1, v.size) for prog in programs for e in prog.eqns for v in e.outputs)
        every = 256
        while every > 1 and every * work > 4096:
            every //= 2
        return every

    def _polled_rows(self, r, length, body, every):
        """``for r in range(length): body``, polling the interrupt flag (where the renderer asks
        for it) before every ``every`` rows.  The poll sits in an outer loop over chunks of
        rows, not in the loop of rows itself: a flag read inside it (even every 256th row)
        made gcc keep a scalar carry in memory, and a scan of scalar adds 2.4 times slower."""
        if not self.interrupt_poll:
            return [Loop(r, length, body)]
        chunk, i = self.fresh("row_chunk"), self.fresh("i")
        rest = f"{length} - {chunk} * {every}"
        rows = Loop(i, f"({rest} < {every} ? {rest} : {every})",
                    [f"int64_t {r} = {chunk} * {every} + {i};"] + body)
        return [Loop(chunk, -(-length // every), [self.interrupt_poll, rows])]

    def _lower_scan(self, e, env, targets):
        p = e.params
        step, nc, nk, length, reverse = p["program"], p["num_consts"], p["num_carry"], p["length"], \
            p["reverse"]
        ins = [env.pointer(v) for v in e.inputs]
        consts, init, xs = ins[:nc], ins[nc:nc + nk], ins[nc + nk:]
        carry_vars = e.outputs[:nk]
        ys_vars = e.outputs[nk:]
        stmts = []
        carry = targets[:nk]
        for v, src, dst in zip(carry_vars, init, carry):
            stmts += self.copy(v, src, dst)
        new = [self.temp(v) for v in carry_vars]
        r = self.fresh("row")
        row = f"({length - 1} - {r})" if reverse else r
        x_rows = [f"({x} + ({row})*{max(1, v.size)})" for x, v in
                  zip(xs, step.inputs[nc + nk:])]
        y_rows = [f"({y} + ({row})*{max(1, v.size)})" for y, v in zip(targets[nk:], step.outputs[nk:])]
        body = self.program(step, consts + carry + x_rows, new + y_rows)
        for v, src, dst in zip(carry_vars, new, carry):
            body += self.copy(v, src, dst)
        stmts += self._polled_rows(r, length, body, self._poll_every(step))
        del ys_vars
        return stmts

    def _lower_cond(self, e, env, targets):
        branches = e.params["branches"]
        index = env.read(e.inputs[0], [])
        args = [env.pointer(v) for v in e.inputs[1:]]
        stmts = []
        for k, b in enumerate(branches):
            test = f"({index}) <= {k}" if k < len(branches) - 1 else "1"
            stmts.append(If(test if k == 0 else f"else if ({test})" if k < len(branches) - 1 else "else",
                            self.program(b, args, targets), first=(k == 0)))
        return stmts

    def _lower_while(self, e, env, targets):
        p = e.params
        ncc, nbc = p["num_cond_consts"], p["num_body_consts"]
        args = [env.pointer(v) for v in e.inputs]
        cc, bc, init = args[:ncc], args[ncc:ncc + nbc], args[ncc + nbc:]
        stmts = []
        for v, src, dst in zip(e.outputs, init, targets):
            stmts += self.copy(v, src, dst)
        flag = self.fresh("go")
        self.temps.append((flag, "uint8_t", 1))
        new = [self.temp(v) for v in e.outputs]
        body = self.program(p["body"], bc + targets, new)
        for v, src, dst in zip(e.outputs, new, targets):
            body += self.copy(v, src, dst)
        test = self.program(p["cond"], cc + targets, [flag])
        stmts += test
        if self.interrupt_poll:          # polled before every few iterations (see _polled_rows)
            turns = Loop(self.fresh("i"), self._poll_every(p["body"], p["cond"]),
                         body + test + [f"if (!{flag}[0]) break;"])
            stmts.append(While(f"{flag}[0]", [self.interrupt_poll, turns]))
        else:
            stmts.append(While(f"{flag}[0]", body + test))
        return stmts

    def copy(self, var, src, dst):
        n = max(1, var.size)
        i = self.fresh("c")
        return [Loop(i, n, [f"{dst}[{i}] = {src}[{i}];"])]

    # -- the NumPy namespace's primitives (vkml.ops.sorting and vkml.ops.factorizations) ------------
    # Each is a loop over the rows (or matrices) of its operand with the row's work written out in
    # C; the elementwise ones (vkml.ops.special) are C library calls (``rules.libm``).

    def _rows(self, shape, axis, body_at):
        """Loops over every index of ``shape`` but ``axis``; ``body_at(idx)`` is the row's work,
        ``idx`` holding ``None`` at ``axis``."""
        idx = [None if i == axis else self.fresh("i") for i in range(len(shape))]
        body = [Block(body_at(idx))]
        for var, extent in reversed([(v, d) for v, d in zip(idx, shape) if v is not None]):
            body = [Loop(var, extent, body)]
        return body

    def _lower_cumsum(self, e, env, targets):
        """One pass per row in order, as NumPy adds (the same bits); integers wrap around."""
        x, out = e.inputs[0], e.outputs[0]
        axis, n = e.params["axis"], x.shape[e.params["axis"]]
        t = CTYPE[out.dtype]
        add = "acc += {v};" if out.dtype.kind == "f" else \
            f"acc = ({t})((uint64_t)acc + (uint64_t)({{v}}));"

        def row(idx):
            k = self.fresh("k")
            at = f"({n - 1} - {k})" if e.params["reverse"] else k
            full = [at if v is None else v for v in idx]
            return [f"{t} acc = 0;",
                    Loop(k, n, [add.format(v=env.read(x, full)),
                                f"{targets[0]}[{linear_index(full, out.shape)}] = acc;"])]
        return self._rows(x.shape, axis, row)

    def _lower_argsort(self, e, env, targets):
        """A stable bottom-up merge sort of each row's indices by value, NaN last (NumPy's
        ``kind="stable"``), in a scratch buffer of 2n indices."""
        x, out = e.inputs[0], e.outputs[0]
        axis, n = e.params["axis"], x.shape[e.params["axis"]]
        scratch = self.fresh("t")
        self.temps.append((scratch, "int64_t", max(1, 2 * n)))

        def row(idx):
            def key(j):
                return env.read(x, [f"({j})" if v is None else v for v in idx])
            before = f"({key('A[q]')} < {key('A[p]')})"
            if x.dtype.kind == "f":     # q strictly before p: smaller, or p is NaN and q is not
                before = f"({before} || ({key('A[p]')} != {key('A[p]')} && {key('A[q]')} == {key('A[q]')}))"
            k = self.fresh("k")
            store = [f"{targets[0]}[{linear_index([k if v is None else v for v in idx], out.shape)}] = A[{k}];"]
            return [
                f"int64_t* A = {scratch}; int64_t* B = {scratch} + {n};",
                f"for (int64_t i = 0; i < {n}; i++) A[i] = i;",
                f"for (int64_t w = 1; w < {n}; w *= 2) {{",
                f"    for (int64_t lo = 0; lo < {n}; lo += 2 * w) {{",
                f"        int64_t mid = lo + w < {n} ? lo + w : {n};",
                f"        int64_t hi = lo + 2 * w < {n} ? lo + 2 * w : {n};",
                "        int64_t p = lo, q = mid, o = lo;",
                f"        while (o < hi) {{ if (p < mid && (q >= hi || !{before})) B[o++] = A[p++]; "
                "else B[o++] = A[q++]; }",
                "    }",
                "    int64_t* swap = A; A = B; B = swap;",
                "}",
                Loop(k, n, store)]
        return self._rows(x.shape, axis, row)

    def _matrices(self, e, env):
        """Pointers to each operand's and output's buffer, and a batch loop variable."""
        ins = [env.pointer(v) for v in e.inputs]
        a = e.inputs[0]
        n = a.shape[-1]
        batch = math.prod(a.shape[:-2])
        return ins, n, batch, self.fresh("b")

    def _lu(self, lu, n, t, fabs, swaps):
        """In-place LU with partial pivoting of the n x n matrix at ``lu``; ``swaps(r, c)`` is C
        exchanging rows r and c of whatever else rides along.  Sets ``singular`` on a zero pivot."""
        return [
            "int singular = 0;",
            f"for (int64_t c = 0; c < {n}; c++) {{",
            f"    int64_t piv = c; {t} best = {fabs}({lu}[c * {n} + c]);",
            f"    for (int64_t r = c + 1; r < {n}; r++) if ({fabs}({lu}[r * {n} + c]) > best) "
            f"{{ best = {fabs}({lu}[r * {n} + c]); piv = r; }}",
            "    if (!(best > 0)) { singular = 1; break; }",
            f"    if (piv != c) {{ for (int64_t j = 0; j < {n}; j++) {{ {t} s = {lu}[c * {n} + j]; "
            f"{lu}[c * {n} + j] = {lu}[piv * {n} + j]; {lu}[piv * {n} + j] = s; }} {swaps('piv', 'c')} }}",
            f"    for (int64_t r = c + 1; r < {n}; r++) {{",
            f"        {t} f = {lu}[r * {n} + c] / {lu}[c * {n} + c];",
            f"        {lu}[r * {n} + c] = f;",
            f"        for (int64_t j = c + 1; j < {n}; j++) {lu}[r * {n} + j] -= f * {lu}[c * {n} + j];",
            "    }",
            "}"]

    def _lu_scratch(self, e, n):
        lu = self.fresh("t")
        self.temps.append((lu, CTYPE[e.inputs[0].dtype], max(1, n * n)))
        return lu

    def _lower_solve(self, e, env, targets):
        """Gaussian elimination with partial pivoting, then back substitution; NaN if singular."""
        (a, b), n, batch, bi = self._matrices(e, env)
        k = e.inputs[1].shape[-1]
        t = CTYPE[e.inputs[0].dtype]
        fabs = "fabsf" if t == "float" else "fabs"
        lu, x = self._lu_scratch(e, n), targets[0]
        xm = f"({x} + {bi} * {n * k})"
        swaps = (lambda r, c: f"for (int64_t j = 0; j < {k}; j++) {{ {t} s = {xm}[{c} * {k} + j]; "
                 f"{xm}[{c} * {k} + j] = {xm}[{r} * {k} + j]; {xm}[{r} * {k} + j] = s; }}")
        body = [f"for (int64_t j = 0; j < {n * n}; j++) {lu}[j] = {a}[{bi} * {n * n} + j];",
                f"for (int64_t j = 0; j < {n * k}; j++) {xm}[j] = {b}[{bi} * {n * k} + j];"]
        body += self._lu(lu, n, t, fabs, swaps)
        body += [
            "if (singular) {",
            f"    for (int64_t j = 0; j < {n * k}; j++) {xm}[j] = NAN;",
            "} else {",
            f"    for (int64_t c = 0; c < {n}; c++) for (int64_t r = c + 1; r < {n}; r++) "
            f"for (int64_t j = 0; j < {k}; j++) {xm}[r * {k} + j] -= {lu}[r * {n} + c] * {xm}[c * {k} + j];",
            f"    for (int64_t c = {n - 1}; c >= 0; c--) for (int64_t j = 0; j < {k}; j++) {{",
            f"        {t} s = {xm}[c * {k} + j];",
            f"        for (int64_t m = c + 1; m < {n}; m++) s -= {lu}[c * {n} + m] * {xm}[m * {k} + j];",
            f"        {xm}[c * {k} + j] = s / {lu}[c * {n} + c];",
            "    }",
            "}"]
        return [Loop(bi, batch, [Block(body)])]

    def _lower_slogdet(self, e, env, targets):
        """The LU's pivots: sign from the row swaps and the pivots' signs, log|det| their logs'
        sum; (0, -inf) for a singular matrix, as NumPy gives."""
        (a,), n, batch, bi = self._matrices(e, env)
        t = CTYPE[e.inputs[0].dtype]
        f32 = t == "float"
        fabs, log = ("fabsf", "logf") if f32 else ("fabs", "log")
        lu = self._lu_scratch(e, n)
        sign, logabs = targets
        body = [f"for (int64_t j = 0; j < {n * n}; j++) {lu}[j] = {a}[{bi} * {n * n} + j];",
                f"{t} sgn = 1;"]
        body += self._lu(lu, n, t, fabs, lambda r, c: "sgn = -sgn;")
        body += [
            f"if (singular) {{ {sign}[{bi}] = 0; {logabs}[{bi}] = (-INFINITY); }} else {{",
            f"    {t} acc = 0;",
            f"    for (int64_t c = 0; c < {n}; c++) {{ {t} d = {lu}[c * {n} + c]; "
            f"if (d < 0) sgn = -sgn; acc += {log}({fabs}(d)); }}",
            f"    {sign}[{bi}] = sgn; {logabs}[{bi}] = acc;",
            "}"]
        return [Loop(bi, batch, [Block(body)])]

    def _lower_cholesky(self, e, env, targets):
        """Cholesky-Banachiewicz on the lower triangle; NaN if not positive definite."""
        (a,), n, batch, bi = self._matrices(e, env)
        t = CTYPE[e.inputs[0].dtype]
        sqrt = "sqrtf" if t == "float" else "sqrt"
        am, lm = f"({a} + {bi} * {n * n})", f"({targets[0]} + {bi} * {n * n})"
        body = [
            f"for (int64_t j = 0; j < {n * n}; j++) {lm}[j] = 0;",
            "int bad = 0;",
            f"for (int64_t i = 0; i < {n} && !bad; i++) for (int64_t j = 0; j <= i; j++) {{",
            f"    {t} s = {am}[i * {n} + j];",
            f"    for (int64_t m = 0; m < j; m++) s -= {lm}[i * {n} + m] * {lm}[j * {n} + m];",
            f"    if (i == j) {{ if (!(s > 0)) {{ bad = 1; break; }} {lm}[i * {n} + i] = {sqrt}(s); }}",
            f"    else {lm}[i * {n} + j] = s / {lm}[j * {n} + j];",
            "}",
            f"if (bad) for (int64_t j = 0; j < {n * n}; j++) {lm}[j] = NAN;"]
        return [Loop(bi, batch, [Block(body)])]


class _LoopGroup:
    """One loop nest that computes several elementwise results of one shape: their stores share
    the loops, so each element's operands are loaded once while in registers (an Adam update's
    new moment is stored and read back for the parameter in the same iteration, not in a second
    pass over memory).  A result joins when it reads what the nest writes only at the element
    being computed; a scalar result that reads nothing the nest writes (a hyperparameter's cast)
    is computed before the nest.  Anything else starts a nest of its own, and so does a result
    that would make the nest touch more than :attr:`MAX_BUFFERS` buffers: the compiler proves
    a nest's buffers apart with a run-time check per pair before it vectorises it (an Adam
    update touches seven: parameter, gradient and moments, old and new).  Several parameters
    of one shape therefore get a nest each, not one nest that would stay scalar."""

    MAX_BUFFERS = 8

    def __init__(self, low, e, env, target, stmts):
        self.low, self.shape = low, e.outputs[0].shape
        self.idx = [low.fresh("i") for _ in self.shape]
        self.at = len(stmts)             # where the nest sits: scalars are computed before it
        self.body = [self._store(e, env, target, self.idx)]
        self.buffers = self._streamed(self.body[0])
        nest = self.body
        for var, extent in reversed(list(zip(self.idx, self.shape))):
            nest = [Loop(var, extent, nest)]
        stmts += mark_parallel(nest, len(self.shape))   # (what joins reads only its own element)
        self.writes = [target]

    def _store(self, e, env, target, idx):
        return f"{target}[{linear_index(idx, e.outputs[0].shape)}] = {env.expr(e, idx)};"

    def take(self, e, env, target, stmts) -> bool:
        """Add ``e`` (an expression rule with one result) to this nest, or before it; False if
        it may do neither."""
        shape = e.outputs[0].shape
        if shape == () and self.shape != ():
            line = self._store(e, env, target, [])
            if self._reads(line, None):
                return False
            stmts.insert(self.at, line)
            self.at += 1
            return True
        if shape != self.shape or not shape:
            return False
        line = self._store(e, env, target, self.idx)
        buffers = self.buffers | self._streamed(line)
        if len(buffers) > self.MAX_BUFFERS or self._reads(line, linear_index(self.idx, self.shape)):
            return False
        self.buffers = buffers
        self.body.append(line)
        self.writes.append(target)
        return True

    def _streamed(self, line) -> set:
        """The buffers ``line`` reads or writes along the nest (at the element being computed;
        a scalar read once, ``t3[0]``, costs the vectoriser no check)."""
        at = f"[{linear_index(self.idx, self.shape)}]"
        return {m.group(1) for m in _BUFFER.finditer(line) if line.startswith(at, m.end() - 1)}

    def _reads(self, line, at) -> bool:
        """Whether C ``line`` reads a buffer of this nest anywhere but at flat index ``at``
        (None: anywhere at all)."""
        for w in self.writes:
            for m in re.finditer(rf"(?<![A-Za-z0-9_]){re.escape(w)}\[", line):
                if at is None or not line.startswith(f"{at}]", m.end()):
                    return True
        return False


#: a buffer read or written in a line of C (its name, then ``[``)
_BUFFER = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_]\w*)\[")


class RunsIndex(list):
    """An index into an array of ``shape`` (a reshape's operand: ``rules.Reshape``), one C
    expression per axis, that also carries ``runs``: index expressions naming the same element
    of a *row-major buffer* of that shape by flat offset, with no division (a split group's
    offset on its last axis).  Elementwise steps pass an index on unchanged, so a buffer of
    ``shape`` they read is read at ``runs``; a view builds an index of its own, per axis."""

    def __init__(self, index, shape, runs):
        super().__init__(index)
        self.shape, self.runs = tuple(shape), runs


class _Env:
    """Reading values: from buffers, constants, or inlined expressions at an index."""

    def __init__(self, lowering, buffers, consts, producer):
        self.lowering = lowering
        self.buffers = buffers
        self.consts = consts
        self.producer = producer
        self.inline = set()
        #: 0-d arguments read from a local (see ``Lowering._program``)
        self.scalars = {}

    def pointer(self, v):
        """A buffer holding ``v`` (a constant gets a static array of its own)."""
        if v in self.buffers:
            return self.buffers[v]
        if v in self.consts:
            self.buffers[v] = self.lowering.static(v, self.consts[v])
            return self.buffers[v]
        raise Unsupported("operand without a buffer")

    def read(self, v, idx):
        if v in self.scalars:
            return self.scalars[v]
        if isinstance(idx, RunsIndex) and idx.shape == v.shape and \
                (v in self.buffers or v in self.consts):
            idx = idx.runs
        if v in self.buffers:
            return f"{self.buffers[v]}[{linear_index(idx, v.shape)}]"
        if v in self.consts:
            value = np.asarray(self.consts[v])
            if value.size == 1:
                return _c_literal(value.reshape(()), v.dtype)
            return f"{self.pointer(v)}[{linear_index(idx, v.shape)}]"
        if v in self.inline:
            return f"({self.expr(self.producer[v], idx)})"
        raise Unsupported("a value read before it is computed")

    def expr(self, e, idx):
        """The expression of elementwise/movement equation ``e`` at output index ``idx``: its
        rule's."""
        return self.lowering.rules[e.prim.name].expression(self, e, idx)


# -- which results may be written over which arguments ----------------------------------------------

def overwritable(stmts, in_ptrs, out_ptrs, program, vector_calls=()) -> dict:
    """Per result ``j`` of ``program`` lowered to ``stmts``, the arguments ``k`` whose buffer the
    result may be computed in (``{j: frozenset(k, ...)}``, only results that have one): what
    lets an optimiser's step update a parameter and its moments where they are.

    The statements run in order, so result ``o`` may share argument ``a``'s buffer when every
    line reading ``a`` runs before the lines storing ``o`` have changed an element it reads:
    each such line comes no later than each store (a line after a store would read a new
    value), and a line sharing a loop with a store lies in the same innermost nest over the
    result's shape and reads ``a`` only at the element the store writes (the nest's flat
    index, one element per iteration; an elementwise update reads ``p[i]``, ``m[i]`` and
    ``v[i]`` and then writes them).  A buffer named without an index (handed to a helper)
    is never shared, nor is one stored before a check that may stop the function (an index
    out of range): a call that fails leaves the caller's arrays as they were.  Nor is one stored
    in a nest calling one of ``vector_calls`` (libm functions run in vector blocks, whose last
    block is moved back over elements already computed: ``vector_nests``)."""
    lines = []
    _flat_lines(stmts, (), lines)
    # the lines naming each identifier: each question below reads only those (a transformer
    # step's thousands of lines asked about every buffer took a second)
    naming = {}
    for n, (text, _) in enumerate(lines):
        for name in set(IDENTIFIER.findall(text)) | _whole_reads(text):
            naming.setdefault(name, []).append(n)
    checks = [n for n, (text, _) in enumerate(lines) if "goto " in text]
    calling = calls_pattern(vector_calls)
    vector_lines = [n for n, (text, _) in enumerate(lines) if calling and calling.search(text)]
    found = {}
    for j, (o, ov) in enumerate(zip(out_ptrs, program.outputs)):
        if ov.shape == () or program.outputs.count(ov) > 1 or \
                not _indexed_only(o, lines, naming.get(o, ())):
            continue
        stores = [(n, index) for n in naming.get(o, ())
                  for index in _indices(o, lines[n][0], stores=True)]
        if any(_may_run_after(c, at, lines) for c in checks for at, _ in stores):
            continue
        if any(_shares_a_loop(v, at, lines) for v in vector_lines for at, _ in stores):
            continue
        ks = frozenset(k for k, (a, av) in enumerate(zip(in_ptrs, program.inputs))
                       if (av.shape, av.dtype) == (ov.shape, ov.dtype) and stores and
                       _indexed_only(a, lines, naming.get(a, ())) and
                       _reads_before(a, ov.shape, stores, lines, naming.get(a, ())))
        if ks:
            found[j] = ks
    return found


def may_fail(stmts) -> bool:
    """Whether the lowered statements hold a check that may stop the function with an error."""
    lines = []
    _flat_lines(stmts, (), lines)
    return any("goto " in text for text, _ in lines)


def _shares_a_loop(n, m, lines) -> bool:
    loops, others = lines[n][1], lines[m][1]
    return bool(loops and others and loops[0] is others[0])


def _may_run_after(n, m, lines) -> bool:
    """Whether line ``n`` may run after line ``m`` has: it comes later, or a loop holds both."""
    return n > m or _shares_a_loop(n, m, lines)


def _flat_lines(stmts, loops, out):
    """Every line of ``stmts`` (loop, branch and while tests included) in the order it is
    written, with the loops around it (a ``While`` counts as a loop without an index)."""
    for s in stmts:
        if isinstance(s, str):
            out.append((s, loops))
        elif isinstance(s, Loop):
            _flat_lines(s.body, loops + (s,), out)
        elif isinstance(s, While):
            out.append((s.test, loops + (s,)))
            _flat_lines(s.body, loops + (s,), out)
        elif isinstance(s, If):
            out.append((s.test, loops))
            _flat_lines(s.body, loops, out)
        else:                                   # a Block
            _flat_lines(s.body, loops, out)


def _indices(name, text, stores=False) -> list:
    """The index expressions of every ``name[...]`` in a line of C (``stores``: of those that are
    assigned to, ``name[i] = ...`` or ``name[i] += ...``)."""
    found = []
    for m in re.finditer(rf"(?<![A-Za-z0-9_]){re.escape(name)}\[", text):
        depth, start = 1, m.end()
        for end in range(start, len(text)):
            depth += {"[": 1, "]": -1}.get(text[end], 0)
            if depth == 0:
                if not stores or _ASSIGNED.match(text, end + 1):
                    found.append(text[start:end])
                break
    return found


#: an assignment after an element (``= ``, ``+= ``, ..., not ``==``)
_ASSIGNED = re.compile(r"\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)")


def _indexed_only(name, lines, naming) -> bool:
    """Whether every use of buffer ``name`` in ``lines`` (on the lines ``naming`` it) is an
    element (``name[...]``) or a whole read by a helper (``HelperCall.reads``)."""
    bare = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_\[])")
    return not any(bare.search(lines[n][0]) and name not in _whole_reads(lines[n][0])
                   for n in naming)


def _whole_reads(text) -> frozenset:
    """The buffers a line reads as a whole (a helper's call, ``HelperCall``)."""
    return getattr(text, "reads", frozenset())


def _reads_before(a, shape, stores, lines, naming) -> bool:
    """Whether every line reading buffer ``a`` (of the lines ``naming`` it) is done with each
    element before a store of ``stores`` (line number, index) writes it (see
    ``overwritable``)."""
    for n in naming:
        text, loops = lines[n]
        reads = _indices(a, text)
        whole = a in _whole_reads(text)
        if not reads and not whole:
            continue
        for at, index in stores:
            if n > at:
                return False
            store_loops = lines[at][1]
            if not _shares_a_loop(n, at, lines):
                continue                        # separate nests: this one ends before the store's
            if whole or loops != store_loops or not all(isinstance(lp, Loop) for lp in loops) or \
                    tuple(lp.extent for lp in loops) != tuple(shape) or \
                    index != linear_index([lp.var for lp in loops], shape) or \
                    any(r != index for r in reads):
                return False
    return True
