"""The canonical tree: the one order in which vkml adds floating-point numbers.

A sum of ``x[0..n-1]`` is the perfect binary tree over the index, padded
with zeros to a power of two, leaves in index order: level by level,
``y[j] = x[2j] + x[2j+1]``.  Every summing reduction of vkml uses it, on
every backend: ``reduce_sum`` over any set of axes is this tree over the
reduced elements taken in row-major order of the reduced axes (so ``mean``,
``var``, ``logsumexp``, ``norm`` and the gradients built on them follow), the
graph layer sums over samples with it, and the deterministic matrix product
sums over the contraction index with it.  The NumPy backend computes it
here; the compiled C tier and the CUDA renderer emit the same tree
(``backends/codegen/lower.py``, ``kernels_cu/helpers.h``).

Why one fixed tree: NumPy's own ``sum`` is pairwise in blocks whose shape
depends on the array's layout, and a compiled loop adds sequentially, so the
same program gave different bits on different tiers (and a training run
drifted).  A fixed tree gives the same bits everywhere.  It is also
divisible: an aligned chunk of ``2^m`` elements is exactly one of its
subtrees, so summing chunks (threads, memory-budget passes, GPU blocks) and
then summing the chunk sums with the same tree gives the one-pass bits.

Edge cases follow from the definition: the sum of no elements is +0.0; the
tree of one element is that element itself (``-0.0`` stays ``-0.0``); an
element whose partner is padding gets ``+ 0.0`` (so ``-0.0`` becomes
``+0.0`` there); NaN and infinities propagate as IEEE addition says.

Integers are added with NumPy's ``sum`` (wrapping integer addition is
associative: every order gives the same bits).
"""

from __future__ import annotations

import numpy as np


def tree_sum(x, axis: int = 0, *, scratch=None) -> np.ndarray:
    """Sum ``x`` over one ``axis`` with the canonical tree; an ndarray (0-d for a vector).

    ``scratch`` (axis 0 only): an array of at least ``(n + 1) // 2`` rows of ``x``'s row shape
    and dtype that the levels are written into -- a caller summing on every call (a reverse's
    buffer pool) reuses one instead of allocating each level.

    Level by level, adjacent pairs are added into a new array half the size; an
    odd last element is carried up with ``+ 0.0`` -- exactly what the zero padding
    to a power of two would add -- so no padded copy is made (arrays of at most
    ``SMALL`` elements are padded once instead: fewer NumPy calls per level).  On a
    contiguous last axis the pairs are read with stride 2: about 2x ``np.sum`` at
    10^6 elements, measured faster than transposing into contiguous rows first
    (that copy alone cost 10-20x ``np.sum``).

    >>> x = np.array([1e16, 1.0, -1e16, 1.0])
    >>> vkml.graph.tree_sum(x) == (x[0] + x[1]) + (x[2] + x[3])    # the tree's order, always
    np.True_
    >>> vkml.graph.tree_sum(np.arange(6.0).reshape(3, 2))             # over axis 0
    array([6., 9.])
    """
    x = np.asarray(x)
    axis = axis % x.ndim if x.ndim else 0
    if x.dtype.kind not in "fc":
        return np.asarray(np.sum(x, axis=axis, dtype=x.dtype))
    n = x.shape[axis]
    if n == 0:
        return np.zeros(x.shape[:axis] + x.shape[axis + 1:], x.dtype)
    lead = (slice(None),) * axis
    if n == 1:
        return np.array(x[lead + (0,)])
    if x.size <= SMALL and scratch is None:
        return _padded_tree_sum(x, axis, lead)
    if scratch is not None and axis != 0:
        raise ValueError("tree_sum: scratch is for sums over axis 0")
    cur = x
    while n > 1:
        m, odd = n // 2, n % 2
        shape = cur.shape[:axis] + (m + odd,) + cur.shape[axis + 1:]
        nxt = np.empty(shape, x.dtype) if scratch is None else scratch[:m + odd]
        np.add(cur[lead + (slice(0, 2 * m, 2),)], cur[lead + (slice(1, 2 * m, 2),)],
               out=nxt[lead + (slice(0, m),)])
        if odd:
            np.add(cur[lead + (slice(n - 1, n),)], x.dtype.type(0), out=nxt[lead + (slice(m, m + 1),)])
        cur, n = nxt, m + odd
    # always a fresh ndarray (0-d for a scalar), never a NumPy scalar or a view of x
    return np.array(cur[lead + (0,)])


#: up to this many elements the literally padded tree is faster (one NumPy call per level)
SMALL = 4096


def _padded_tree_sum(x, axis, lead):
    """The canonical tree literally: zero-padded to a power of two, pairs added level by level
    (the same bits as carrying an odd element up with ``+ 0.0``; fewer calls per level)."""
    n = x.shape[axis]
    width = 1 << (n - 1).bit_length()
    cur = x
    if width != n:
        cur = np.zeros(x.shape[:axis] + (width,) + x.shape[axis + 1:], x.dtype)
        cur[lead + (slice(0, n),)] = x
    even, odd = lead + (slice(0, None, 2),), lead + (slice(1, None, 2),)
    while cur.shape[axis] > 1:
        cur = cur[even] + cur[odd]
    return np.array(cur[lead + (0,)])


def tree_reduce(x, axes) -> np.ndarray:
    """``reduce_sum`` over ``axes`` (any set, in any order) with the canonical tree over the
    reduced elements in row-major order of the reduced axes.

    One reduced axis is summed where it lies.  Several adjacent ones are merged by a
    reshape (a view on a contiguous array); scattered ones are moved to the end first
    (one copy), since the tree over their row-major flattening does not split into
    trees over each axis unless the inner extents are powers of two.
    """
    x = np.asarray(x)
    axes = sorted(int(a) % x.ndim for a in axes) if x.ndim else []
    if x.dtype.kind not in "fc":
        return np.asarray(np.sum(x, axis=tuple(axes), dtype=x.dtype))
    if not axes:
        return np.array(x)
    kept = [i for i in range(x.ndim) if i not in axes]
    reduced = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    if axes != list(range(axes[0], axes[-1] + 1)):
        x = np.transpose(x, kept + axes)
        axes = list(range(len(kept), x.ndim))
    first = axes[0]
    merged = x.reshape(x.shape[:first] + (reduced,) + x.shape[axes[-1] + 1:])
    return tree_sum(merged, first)


def subtree_sum(x, axis: int, size: int) -> np.ndarray:
    """The tree sum of ``x`` along ``axis`` padded with zeros to ``size`` (a power of two at
    least ``x.shape[axis]``): one aligned subtree of a longer canonical tree."""
    x = np.asarray(x)
    n = x.shape[axis % x.ndim]
    s = tree_sum(x, axis)
    if n and (1 << (n - 1).bit_length()) < size:
        s = s + x.dtype.type(0)     # the padded levels above this chunk's own tree add +0.0
    return s


#: elements of the product block the deterministic matrix product forms at once (per batch)
TREE_MATMUL_BLOCK = 1 << 21


def tree_matmul(a, b) -> np.ndarray:
    """``a @ b`` (``(..., m, k) @ (..., k, n)``, equal batch dims) with every output the canonical
    tree over ``k`` of ``a[..., i, k] * b[..., k, j]``.

    Vectorised in blocks: the products of ``2^L`` consecutive values of ``k`` are formed at
    once (``(..., m, 2^L, n)``, rows contiguous), each block is summed with the tree (an
    aligned subtree), then the block sums with the tree.  No operand is padded (``0 * inf``
    would be NaN): a short last block gets the ``+ 0.0`` its padding would add.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind not in "fc":
        return np.matmul(a, b)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = int(np.prod(a.shape[:-2], dtype=np.int64))
    if k == 0:
        return np.zeros(a.shape[:-1] + (n,), a.dtype)
    per_k = max(1, batch * m * n)
    block = 1
    while block < k and block * 2 * per_k <= TREE_MATMUL_BLOCK:
        block *= 2

    def products(lo, hi):
        return a[..., :, lo:hi, None] * b[..., None, lo:hi, :]

    if block >= k:
        return tree_sum(products(0, k), -2)
    sums = [subtree_sum(products(lo, min(lo + block, k)), -2, block) for lo in range(0, k, block)]
    return tree_sum(np.stack(sums), 0)
