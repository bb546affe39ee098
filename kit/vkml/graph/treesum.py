"""The canonical tree over samples: aligned chunks, memory-budget passes, their combination.

The sum over samples ``0..n-1`` is the perfect binary tree over the index,
padded with zeros to a power of two, leaves in sample order: the one order
in which every sum of vkml adds (``vkml.ops.treesum`` computes it; this
module adds what the graph layer builds on it).  An aligned
chunk of ``2^m`` samples is exactly one of its subtrees, so summing chunks
(threads, memory-budget passes, devices) and then summing the chunk sums
with the same tree gives the same bits as one pass.  NumPy's own ``sum``
is pairwise in blocks whose shape depends on the array, so it is not used.
"""

from __future__ import annotations

import numpy as np

from ..errors import BudgetError
from ..ops.treesum import tree_sum  # noqa: F401 (the graph layer's sum over samples)

#: the smallest pass a chunked reverse may use (bitwise parameter sums need aligned subtrees)
MIN_PASS = 256


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
