"""The canonical tree: the one order in which vkml sums over samples.

The sum over samples ``0..n-1`` is the perfect binary tree over the index,
padded with zeros to a power of two, leaves in sample order.  An aligned
chunk of ``2^m`` samples is exactly one of its subtrees, so summing chunks
(threads, memory-budget passes, devices) and then summing the chunk sums
with the same tree gives the same bits as one pass.  NumPy's own ``sum``
is pairwise in blocks whose shape depends on the array, so it is not used.
"""

from __future__ import annotations

import numpy as np

from ..errors import BudgetError

#: the smallest pass a chunked reverse may use (bitwise parameter sums need aligned subtrees)
MIN_PASS = 256


def tree_sum(x: np.ndarray, scratch=None) -> np.ndarray:
    """Sum ``x`` over axis 0 with the canonical tree.

    ``scratch``: an array of at least ``(n + 1) // 2`` rows of ``x``'s row shape and dtype for
    the levels (a caller summing every call reuses one; otherwise one is allocated).

    Level by level, adjacent pairs are added; an odd last element is carried
    up with ``+ 0.0`` -- exactly what the zero padding to a power of two
    would add -- so no padded copy is made, and every level is written into
    one scratch buffer.

    >>> vkml.graph.tree_sum(np.array([1.0, 2.0, 3.0]))
    array(6.)
    >>> vkml.graph.tree_sum(np.array([0.1, 0.2, 0.3])) == (0.1 + 0.2) + (0.3 + 0.0)
    np.True_
    """
    x = np.asarray(x)
    n = x.shape[0]
    if n == 0:
        return np.zeros(x.shape[1:], x.dtype)
    # always an ndarray (0-d for a scalar Param), never a NumPy scalar
    if n == 1:
        return np.array(x[0])
    if n <= SMALL and scratch is None:
        return _padded_tree_sum(x)
    buf = np.empty(((n + 1) // 2,) + x.shape[1:], x.dtype) if scratch is None else scratch
    cur = x
    zero = np.zeros((), x.dtype)
    while n > 1:
        m = n // 2
        np.add(cur[0:2 * m:2], cur[1:2 * m:2], out=buf[:m])
        if n % 2:
            np.add(cur[n - 1:n], zero, out=buf[m:m + 1])
        n = m + n % 2
        cur = buf[:n]
    return np.array(cur[0])


#: up to this many samples the padded tree is faster (one NumPy call per level, no carries)
SMALL = 4096


def _padded_tree_sum(x):
    """The canonical tree literally: zero-padded to a power of two, pairs added level by level.
    The same bits as the carrying version (a carried element gets exactly the ``+ 0.0`` of its
    zero partner); fewer NumPy calls per level, a new array per level (cheap when small)."""
    n = x.shape[0]
    p = 1 << (n - 1).bit_length()
    if p == n:
        cur = x
    else:
        cur = np.zeros((p,) + x.shape[1:], x.dtype)
        cur[:n] = x
    while cur.shape[0] > 1:
        cur = cur[0::2] + cur[1::2]
    return np.array(cur[0])


def chunk_bounds(n: int, size: int):
    """Aligned chunks ``[start, stop)`` of ``size`` (a power of two) samples covering ``0..n``."""
    if size & (size - 1):
        raise ValueError(f"chunk size {size} is not a power of two")
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def combine(partials, size: int, n: int) -> np.ndarray:
    """The one-pass tree sum from the sums of aligned chunks of ``size`` samples.

    Each partial is the tree sum of its chunk padded to ``size``: exactly a
    subtree, so summing the partials with the canonical tree (padded with
    zero subtrees) reproduces the one-pass bits.
    """
    partials = list(partials)
    if len(partials) == 1:
        return partials[0]
    return tree_sum(np.stack(partials))


def chunk_sum(x: np.ndarray, size: int) -> np.ndarray:
    """``tree_sum`` computed chunk by chunk (what a pass or a thread does); same bits."""
    n = x.shape[0]
    parts = []
    for s, e in chunk_bounds(n, size):
        c = x[s:e]
        if e - s < size:
            c = np.concatenate([c, np.zeros((size - (e - s),) + x.shape[1:], x.dtype)])
        parts.append(tree_sum(c))
    return combine(parts, size, n)


def pass_size(n: int, per_sample_bytes: int, budget: int, what: str):
    """The largest pass of ``256 * 2**q`` samples whose state fits ``budget`` bytes.

    Returns the pass size (``n`` itself when everything fits in one pass)."""
    need = n * per_sample_bytes
    if need <= budget:
        return n
    if per_sample_bytes > budget:
        raise BudgetError(f"{what}: one sample needs {per_sample_bytes:,} bytes but memory_budget is "
                          f"{budget:,} bytes; raise memory_budget, lower max_steps, or set window")
    size = MIN_PASS
    if size * per_sample_bytes > budget:
        raise BudgetError(f"{what}: a pass needs at least {MIN_PASS} samples ({MIN_PASS * per_sample_bytes:,} "
                          f"bytes) to keep parameter gradients bitwise, but memory_budget is {budget:,} "
                          "bytes; raise memory_budget, lower max_steps, or set window")
    while size * 2 * per_sample_bytes <= budget and size * 2 < n:
        size *= 2
    return size
