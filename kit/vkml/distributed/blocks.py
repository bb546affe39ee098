"""Where the shards begin and end, and how their Param sums meet: the rule that keeps the bits.

Every sum over samples in vkml is the canonical tree (``vkml.graph.treesum``): the perfect binary
tree over the samples in order, padded with zeros to a power of two.  An aligned block of ``S``
samples (``S`` a power of two, starting at a multiple of ``S``) is exactly one subtree of it.  So
vkml cuts the samples into such blocks -- shard ``i`` holds samples ``[i*S, (i+1)*S)``, the last
one what is left -- whatever chunks the user gave, and:

- each shard's reverse sums its own samples with the same tree (its own size rounded up to a
  power of two ``p``; a last shard shorter than ``S`` gets the ``+ 0.0`` the zero subtrees above
  ``p`` would add, see :func:`as_subtree`);
- the shards' sums are then summed with the canonical tree over the shards (:func:`tree_of`):
  the top levels of the one-process tree.

The result is the one-process bits for every block size, worker count, thread count and
memory budget.  Per-sample values never mix samples, so they are the same bits by construction.
Pure NumPy: no Dask here.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError
from ..graph.treesum import chunk_bounds, combine


#: blocks are not halved below this many samples for balance: below it, a block's fixed cost
#: (a task, building its graph) outweighs what the balance gains
MIN_SPLIT = 1 << 16


def block_size(n: int, threads: int) -> int:
    """The block size for ``n`` samples on ``threads`` worker threads: the smallest power of two
    ``S`` with ``threads * S >= n`` (one block per thread), or, where that leaves threads idle, up
    to three halvings of it (not below ``MIN_SPLIT``): the one that finishes soonest if every
    block costs its size -- ``ceil(blocks / threads) * S`` smallest, the larger ``S`` on a tie.
    Powers of two rarely divide the work evenly (10^8 samples on 64 threads: blocks of 2^21 leave
    16 threads idle, blocks of 2^19 keep 99.3% of them busy)."""
    threads = max(1, threads)
    per = max(1, math.ceil(n / threads))
    size = 1 << (per - 1).bit_length()
    best, best_time = size, None
    for _ in range(4):
        span = math.ceil(math.ceil(n / size) / threads) * size
        if best_time is None or span < best_time:
            best, best_time = size, span
        if size // 2 < MIN_SPLIT:
            break
        size //= 2
    return best


def check_block(block, n: int) -> int:
    """``block`` (samples per shard, a power of two), or the error saying why it cannot be."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1 or \
            block & (block - 1):
        raise ArgumentError(f"vkml.distributed: block must be a power of two (samples per shard, "
                            f"e.g. 1024), got {block!r}; the shards must be subtrees of the "
                            "canonical tree for the Param sums to keep their bits")
    return int(block)


def shard_bounds(n: int, size: int):
    """``[start, stop)`` of each shard: aligned blocks of ``size`` samples covering ``0..n``."""
    return chunk_bounds(n, size)


def as_subtree(partial, rows: int, size: int):
    """A shard's tree sum over its ``rows`` samples as the sum of its whole block of ``size``.

    The shard summed ``rows`` samples padded to ``p``, the next power of two; the one-process
    tree pads the block to ``size`` and adds each zero subtree above ``p`` with ``+ 0.0`` (which
    turns a ``-0.0`` into ``+0.0`` and changes nothing else), so one ``+ 0.0`` does it."""
    p = 1 << max(0, rows - 1).bit_length()
    if p < size:
        return np.add(partial, np.zeros((), np.asarray(partial).dtype))
    return partial


def tree_of(partials, rows, size: int, n: int):
    """The one-process tree sum from the shards' sums (in shard order).  One shard is the whole
    tree already (its block may be larger than the samples: no padding is added then)."""
    partials = list(partials)
    if len(partials) == 1:
        return partials[0]
    return combine([as_subtree(p, r, size) for p, r in zip(partials, rows)], size, n)
