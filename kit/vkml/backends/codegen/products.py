"""Matrix products in the cpu tier's C: one call of a blocked, vectorised GEMM each.

Why: a default ``matmul`` in generated C adds each output's products over k in index order.
Written as three loops that order is slow (a scalar dependency chain per output), so programs
with big products used to stay on NumPy, whose BLAS picks its own order -- and then every
equation around the product paid NumPy's dispatch too.  ``gemm.gemm_c`` computes the very same
sums (each output's accumulator starts at 0 and adds its products for k = 0, 1, ... in turn,
each step a fused multiply-add in the fused mode, a rounded product and sum in the plain one:
``Lowering.fused``, as the plain loops do) blocked for the caches and in SIMD registers across
outputs, so a product has one set of bits on this tier whatever its size, the machine's vector
width, the blocking or the threads.

Two things make the call cheap to feed:

- an operand that is a transpose (of a transpose ...) of a buffer is read in place, the
  GEMM taking any element strides: a product's operands are never copied to be transposed;
- a transposed product ``transpose(a @ b)`` whose product nothing else reads is computed as
  ``transpose(b) @ transpose(a)`` (``transposed_products``): the same products added in the
  same order (IEEE products commute exactly), written straight in the layout wanted -- a
  weight's gradient ``(dy^T x)`` is never transposed in a second pass.

Small products (fewer than ``GEMM_MIN`` multiply-adds) keep the plain loops: the bits are
the same, and packing would cost more than it saves.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...ir import Eqn, Program, Var
from .gemm import PACK_BYTES, SPLIT_WORK, pack_bytes
from .lower import CTYPE, reshaped_strides, row_major_strides
from .statements import Block, HelperCall, Loop
from .threaded_nests import parallel_for

#: the fewest multiply-adds of a product computed by the GEMM (the plain loops below it)
GEMM_MIN = 1 << 12

#: the dtypes the GEMM computes in (integer products keep the plain loops)
GEMM_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def _last_two_swapped(ndim):
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def _is_swap(e) -> bool:
    """Whether ``e`` transposes the last two axes of its operand and no other."""
    return e.prim.name == "transpose" and e.params["perm"] == _last_two_swapped(e.inputs[0].ndim)


def by_gemm(e) -> bool:
    """Whether matrix product ``e`` is computed by the GEMM: a default-order float product with
    at least ``GEMM_MIN`` multiply-adds."""
    return e.prim.name == "matmul" and "order" not in e.params and \
        e.outputs[0].dtype in GEMM_DTYPES and e.inputs[0].size * e.inputs[1].shape[-1] >= GEMM_MIN


def transposed_products(program, sites=None):
    """``(program', sites')``: ``program`` with each ``transpose(a @ b)`` (the last two axes
    swapped) whose product only that transpose reads computed as ``transpose(b) @ transpose(a)``
    (``program`` itself when there is none), and per equation of it what the equation it comes
    from is named by in an error: ``sites[k]`` for equation ``k`` of ``program`` (its index
    without ``sites``)."""
    sites = list(range(len(program.eqns))) if sites is None else list(sites)
    producer = {o: e for e in program.eqns for o in e.outputs}
    readers = Counter(v for e in program.eqns for v in e.inputs)
    readers.update(program.outputs)
    swapped = {}                   # id(transpose) -> the product it transposes
    for e in program.eqns:
        p = producer.get(e.inputs[0]) if e.inputs else None
        if _is_swap(e) and p is not None and by_gemm(p) and readers[e.inputs[0]] == 1:
            swapped[id(e)] = p
    dropped = {id(p) for p in swapped.values()}
    eqns, named = [], []
    for k, e in enumerate(program.eqns):
        if id(e) in dropped:
            continue
        p = swapped.get(id(e))
        if p is None:
            eqns.append(e)
            named.append(sites[k])
            continue
        a, b = p.inputs
        bt, at = (Var(v.shape[:-2] + v.shape[:-3:-1], v.dtype, v.device) for v in (b, a))
        perm = _last_two_swapped(a.ndim)
        eqns += [Eqn(e.prim, [b], [bt], {"perm": perm}, e.where),
                 Eqn(e.prim, [a], [at], {"perm": perm}, e.where),
                 Eqn(p.prim, [bt, at], list(e.outputs), p.params, p.where)]
        named += [sites[k]] * 3
    if not swapped:
        return program, named
    return Program(program.inputs, eqns, program.outputs, program.consts), named


#: the views a GEMM reads where their operand is, with other strides
IN_PLACE_VIEWS = ("transpose", "reshape")


def _view_strides(e, strides):
    """The element strides of view ``e``'s result, its operand's being ``strides`` (None where
    no strides describe it: a reshape merging axes a transpose has parted)."""
    if e.prim.name == "transpose":
        return [strides[q] for q in e.params["perm"]]
    return reshaped_strides(e.inputs[0].shape, strides, e.outputs[0].shape)


def _in_place(env, v):
    """``(buffer, element strides)`` where ``v`` can be read without a copy: a buffer, or a
    transpose or reshape (of a transpose ...) of one; None otherwise."""
    if v in env.scalars:
        return None
    if v in env.buffers or v in env.consts:
        return env.pointer(v), row_major_strides(v.shape)
    if v in env.inline and env.producer[v].prim.name in IN_PLACE_VIEWS:
        t = env.producer[v]
        inner = _in_place(env, t.inputs[0])
        if inner is not None:
            strides = _view_strides(t, inner[1])
            if strides is not None:
                return inner[0], strides
    return None


def _operand(low, env, v, stmts):
    """``(buffer, strides)`` of operand ``v``: read in place where it can be, else first stored
    into a temporary of its own (statements appended to ``stmts``)."""
    found = _in_place(env, v)
    if found is not None:
        return found
    buffer = low.temp(v)
    stmts += low.store(v.shape, buffer, lambda idx: env.read(v, idx))
    return buffer, row_major_strides(v.shape)


def pack_scratch(low, dtype):
    """The GEMM's packing scratch for ``dtype`` (one temporary per program and dtype, 64-byte
    aligned), as a C expression."""
    packs = low.gemm_packs
    if dtype not in packs:
        name = low.temp(Var(((pack_bytes(low.gemm_threads) + 64) // dtype.itemsize,), dtype))
        packs[dtype] = aligned_pointer(name, dtype)
    return packs[dtype]


def aligned_pointer(name, dtype):
    """Temporary ``name`` (64 bytes longer than its use) as a 64-byte aligned pointer, in C."""
    return f"({CTYPE[dtype]}*)((char*){name} + ((64 - ((unsigned long long){name} & 63)) & 63))"


#: the most multiply-adds of each matrix of a batch whose matrices run side by side on threads
#: (bigger ones are split by rows, the threads sharing the packed panels of B)
BATCH_SPLIT_WORK = 8 * SPLIT_WORK


def _batch_pack(low, dtype):
    """The scratch of products whose matrices run on threads at once (a packing slot of one
    thread's size, :data:`~.gemm.PACK_BYTES`, 64-byte aligned, for each of the program's
    threads -- the most any such product uses): ``(C expression of the first slot, elements
    between slots)``."""
    stride = -(-PACK_BYTES // 64) * 64 // dtype.itemsize
    packs = low.gemm_batch_packs
    if dtype not in packs:
        name = low.temp(Var((low.gemm_threads * stride + 64 // dtype.itemsize,), dtype))
        packs[dtype] = aligned_pointer(name, dtype)
    return packs[dtype], stride


def thread_slot(first, stride) -> str:
    """The calling OpenMP thread's slot of a buffer of slots ``stride`` elements apart from
    ``first`` (C expressions)."""
    return f"{first} + (int64_t)omp_get_thread_num() * {stride}LL"


def thread_pack(low, dtype) -> str:
    """The calling thread's packing slot (``_batch_pack``), in C, for a product run on one of
    the threads of an OpenMP loop (which never splits it again)."""
    return thread_slot(*_batch_pack(low, dtype))


def batch_team(low, batch) -> int:
    """Threads that run ``batch`` independent products side by side: the program's, as long as
    each gets two or more (0 or 1: one thread runs them all)."""
    return min(low.gemm_threads, batch // 2)


def _batch_threads(low, e) -> int:
    """Threads the matrices of product ``e`` run on side by side (1: one after another, each
    split over the threads itself if big enough): a top-level batch of at least two matrices
    per thread, each of fewer than ``BATCH_SPLIT_WORK`` multiply-adds (an attention's heads, a
    convolution's images: too small to split well by rows, and each thread's own packed
    operands stay in its own caches)."""
    a, b = e.inputs
    out = e.outputs[0]
    batch = int(np.prod(out.shape[:-2], dtype=np.int64))
    work = a.shape[-2] * a.shape[-1] * b.shape[-1]
    threads = batch_team(low, batch)
    return threads if threads > 1 and low.depth == 1 and work < BATCH_SPLIT_WORK else 1


def _offset(idx, strides):
    terms = [f"{i} * {s}LL" for i, s in zip(idx, strides) if s]
    return " + ".join(terms) if terms else "0"


def gemm_operands(e, producer, uses, free=frozenset(), gathered=None) -> list:
    """The values a GEMM-computed product ``e`` has stored: each operand, or for one that is a
    transpose or reshape read only here or only by GEMMs (``free``; of a transpose ...), that
    view's source, read in place (a reshape only where strides describe the chain of views
    from a stored source); for the operand it gathers (``gathered``: ``(k, source, ...)``, see
    ``gathered_operands``), the source."""
    stored = []
    for n, v in enumerate(e.inputs):
        if gathered is not None and gathered[0] == n:
            stored.append(gathered[1])
            continue
        chain = []
        while (uses.get(v) == 1 or v in free) and v in producer and \
                producer[v].prim.name in IN_PLACE_VIEWS:
            chain.append(producer[v])
            v = producer[v].inputs[0]
        # the longest chain from the operand back whose views strides describe
        while chain and not _strides_describe(chain):
            v = chain.pop().outputs[0]
        stored.append(v)
    return stored


#: the most elements of an operand whose gathering is worked out (an array of each element's
#: offset in its source, in NumPy, when the program is lowered)
GATHER_MAX = 1 << 24


def gathered_operands(low, prog, outputs, uses, readers, producer):
    """``({id(product): (k, source, rk, cj)}, skipped)``: the 2-D products whose operand ``k``
    the GEMM packs from where its elements are instead of from a stored copy
    (``vk_gemm_gathered``), and the movements it then never computes.

    An operand qualifies when the GEMM would otherwise store a movement of a buffer -- a
    convolution's columns, 25 strided windows of an image batch stacked, 25 times the images'
    size written and read back each step -- and the movements (every ``View`` rule's ``moved``)
    take all its elements from one stored value ``source``, element ``(k, j)`` at offset
    ``rk[k] + cj[j]`` there: one part from the row, one from the column (the columns' row is a
    channel and a tap, the column a pixel).  NumPy works the offsets out from an array of
    element numbers moved as the program moves the values.  B is gathered (A of a product
    whose B does not qualify: the product is then computed transposed).  A movement is skipped
    when every reader of it is a skipped movement or a product gathering it."""
    rules = low.rules
    movement = movements(rules, producer)
    found, by_product, chains = {}, {}, []
    moved = {}          # each value's element offsets, shared by the operands moving it further
    for e in prog.eqns:
        if not (low.gemm and by_gemm(e)) or e.outputs[0].ndim != 2:
            continue
        stored = gemm_operands(e, producer, uses, low.free_transposes)
        for k in (1, 0):
            v = e.inputs[k]
            if v in outputs or v.size > GATHER_MAX or movement(stored[k]) is None:
                continue
            if v not in found:
                found[v] = _gathering(v, movement, rules, moved)
            if found[v] is not None:
                by_product[id(e)] = (k, *found[v][0])
                chains.append(found[v][1])
                break
    skipped = set().union(*chains)
    eqn_of = {id(e): e for e in prog.eqns}
    gathering = {(key, eqn_of[key].inputs[k]) for key, (k, *_) in by_product.items()}
    changed = True
    while changed:                 # a movement something else reads is computed after all
        changed = False
        for v in list(skipped):
            if v in outputs or any((id(r), v) not in gathering and not any(o in skipped for o in r.outputs)
                                   for r in readers.get(v, ())):
                skipped.discard(v)
                changed = True
    gathered = {key: g for key, g in by_product.items() if eqn_of[key].inputs[g[0]] in skipped}
    return gathered, skipped


def movements(rules, producer):
    """``movement(v)``: the equation making ``v`` where its rule is a movement NumPy can replay
    on offsets (a ``View`` with ``moved``), else None."""
    def movement(v):
        e = producer.get(v)
        return e if e is not None and getattr(rules.get(e.prim.name), "moved", None) is not None \
            else None
    return movement


def moved_offsets(v, movement, rules, moved):
    """``(source, offsets, chain)`` for ``v`` made by movements (``movement(u)``: the movement
    equation making ``u``, or None; ``chain``: their results) of one value ``source``, where
    ``offsets`` holds each element's flat offset in it; None where the movements read more than
    one value.  ``moved``: the offsets worked out so far, by value, shared between the operands
    moving a value further (int32 where they fit: half the memory to move)."""
    chain, sources, stack = set(), set(), [v]
    while stack:
        u = stack.pop()
        e = movement(u)
        if e is None:
            sources.add(u)
        elif u not in chain:
            chain.add(u)
            stack += e.inputs
    if len(sources) != 1:
        return None
    source, = sources
    if source not in moved:
        kind = np.int32 if source.size < 2 ** 31 else np.int64
        moved[source] = np.arange(source.size, dtype=kind).reshape(source.shape)

    def offsets_of(u):
        if u not in moved:
            e = movement(u)
            moved[u] = np.asarray(rules[e.prim.name].moved([offsets_of(x) for x in e.inputs], e))
        return moved[u]

    return source, offsets_of(v), chain


def _gathering(v, movement, rules, moved):
    """``((source, rk, cj), chain)`` for 2-D ``v`` made by movements (``chain``: their results)
    of one value, each element at ``rk[k] + cj[j]`` in it; None otherwise (``moved``: see
    :func:`moved_offsets`)."""
    found = moved_offsets(v, movement, rules, moved)
    if found is None:
        return None
    source, offsets, chain = found
    first_row, first_col = offsets[:, 0].astype(np.int64), offsets[0, :].astype(np.int64)
    cj = first_col - first_col.min()
    rk = first_row - first_row[0] + first_col.min()
    # every element checked, a block of rows at a time (no array of the operand's size made)
    step = max(1, (1 << 16) // max(1, offsets.shape[1]))
    for k0 in range(0, offsets.shape[0], step):
        block = offsets[k0:k0 + step] - first_col
        if not (block == (first_row[k0:k0 + step] - first_row[0])[:, None]).all():
            return None
    return (source, rk, cj), chain


def _strides_describe(chain) -> bool:
    """Whether views ``chain`` (from a product's operand back to a stored source) read the
    source in place."""
    strides = row_major_strides(chain[-1].inputs[0].shape)
    for t in reversed(chain):
        strides = _view_strides(t, strides)
        if strides is None:
            return False
    return True


def _gather_tables(low, rk, cj):
    """The gathered operand's tables of row and column offsets, as static arrays (C names)."""
    return [low.static(Var(t.shape, np.dtype(np.int64)), t) for t in (rk, cj)]


def _lower_gathered(low, e, env, targets) -> list:
    """A 2-D product with a gathered operand (``gathered_operands``) as one
    ``vk_gemm_gathered_<type>`` call: B gathered, or A (then ``C^T = B^T A^T``, the same
    products added in the same order)."""
    a, b = e.inputs
    out = e.outputs[0]
    so = row_major_strides(out.shape)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    stmts = []
    which, source, rk, cj = low.gathered[id(e)]
    if which == 1:
        other, sa = _operand(low, env, a, stmts)
        sc = so
    else:
        other, sb = _operand(low, env, b, stmts)
        rk, cj, sa = cj, rk, sb[::-1]
        m, n, sc = n, m, so[::-1]
    tables = _gather_tables(low, rk, cj)
    pointer = env.pointer(source)
    call = HelperCall(
        f"vk_gemm_gathered_{CTYPE[out.dtype]}({m}LL, {n}LL, {k}LL, {other}, {sa[-2]}LL, "
        f"{sa[-1]}LL, {pointer}, {tables[0]}, {tables[1]}, {targets[0]}, {sc[-2]}LL, {sc[-1]}LL, "
        f"{pack_scratch(low, out.dtype)});", reads=(other, pointer))
    low.gemm_types.add(CTYPE[out.dtype])
    return stmts + [call]


def lower_gemm(low, e, env, targets) -> list:
    """Product ``e`` as one ``vk_gemm_<type>`` call per matrix of its batch (a loop over them)."""
    a, b = e.inputs
    out = e.outputs[0]
    if id(e) in low.gathered:
        return _lower_gathered(low, e, env, targets)
    stmts = []
    pa, sa = _operand(low, env, a, stmts)
    pb, sb = _operand(low, env, b, stmts)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    idx = [low.fresh("i") for _ in out.shape[:-2]]
    so = row_major_strides(out.shape)
    threads = _batch_threads(low, e)
    pack = thread_pack(low, out.dtype) if threads > 1 else pack_scratch(low, out.dtype)
    call = HelperCall(
        f"vk_gemm_{CTYPE[out.dtype]}({m}LL, {n}LL, {k}LL, "
        f"{pa} + {_offset(idx, sa)}, {sa[-2]}LL, {sa[-1]}LL, "
        f"{pb} + {_offset(idx, sb)}, {sb[-2]}LL, {sb[-1]}LL, "
        f"{targets[0]} + {_offset(idx, so)}, {so[-2]}LL, {so[-1]}LL, {pack});",
        reads=(pa, pb))
    body = [call]
    for v, extent in reversed(list(zip(idx, out.shape))):
        body = [Loop(v, extent, body)]
    if threads > 1:
        # the matrices side by side, each one thread's (its outputs' sums in index order, so
        # the bits of one thread), each thread with its own packing slot
        body = [Block(["int omp_get_thread_num(void);", parallel_for(len(idx), threads)] + body)]
    low.gemm_types.add(CTYPE[out.dtype])
    return stmts + body


def column_block(low, e, env, stmts, first, width, target, pack) -> HelperCall:
    """The GEMM call computing columns ``first`` (a C expression) to ``first + width - 1`` of
    2-D product ``e`` into ``target``, its rows ``width`` elements apart (each output the same
    sum in the same order as in the whole product); statements storing an operand the GEMM
    cannot read in place are appended to ``stmts``.  A gathered B (``gathered_operands``) is
    read from where it is; a gathered A is not taken (its product is computed transposed)."""
    a, b = e.inputs
    (m, k), ctype = a.shape, CTYPE[e.outputs[0].dtype]
    pa, sa = _operand(low, env, a, stmts)
    gathered = low.gathered.get(id(e))
    if gathered is None:
        pb, sb = _operand(low, env, b, stmts)
        routine, reads = f"vk_gemm_{ctype}", (pa, pb)
        operand = f"{pb} + ({first}) * {sb[1]}LL, {sb[0]}LL, {sb[1]}LL"
    else:
        which, source, rk, cj = gathered
        assert which == 1, "a product gathering A is computed transposed: not by column blocks"
        rows, columns = _gather_tables(low, rk, cj)
        routine, reads = f"vk_gemm_gathered_{ctype}", (pa, env.pointer(source))
        operand = f"{env.pointer(source)}, {rows}, {columns} + ({first})"
    low.gemm_types.add(ctype)
    return HelperCall(f"{routine}({m}LL, {width}LL, {k}LL, {pa}, {sa[0]}LL, {sa[1]}LL, {operand}, "
                      f"{target}, {width}LL, 1LL, {pack});", reads=reads)
