"""Functions whose result length depends on the data, in the form a traced program can hold.

``nonzero``, ``flatnonzero``, ``argwhere`` and ``unique`` return as many
elements as the data has hits; a traced program's shapes are fixed before
any data exists, so (as in JAX) they take a static ``size=``: the first
``size`` hits, padded with ``fill_value``.  The trick that keeps this one
program for every input: give each position a sort key, hits first in
their own order (key = position) and misses after (key = n + position);
the first ``size`` entries of the stable argsort are the hits' positions.
Called on a concrete value without ``size``, ``vkml.numpy`` first counts
the hits and passes that count as ``size``.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, ShapeError
from . import api as F
from . import numeric as N
from . import sorting
from .shaping import unravel_index


def _first_hits(hit, size, fill):
    """The flat positions of the first ``size`` True elements of the 1-D bool ``hit``, then
    ``fill``; and whether each slot holds a hit."""
    n = hit.shape[0]
    pos = F.constant(np.arange(n, dtype=np.int64))
    key = F.where(hit, pos, F.add(pos, n))
    order = sorting.argsort(key, 0)
    if size > n:
        order = F.concatenate([order, F.full((size - n,), 0, np.int64)], 0)
    first = F.slice(order, (0,), (size,))
    count = F.sum(F.cast(hit, np.int64))
    valid = F.less(F.constant(np.arange(size, dtype=np.int64)), count)
    return F.where(valid, first, fill), valid


def _check_size(op, size):
    if size is None or isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ArgumentError(f"{op}: size must be a whole number >= 0 (the number of results to "
                            f"keep), got {size!r}")
    return int(size)


def flatnonzero(x, size, fill_value=0):
    x = N.ravel(F.as_var(x))
    return _first_hits(F.not_equal(x, 0), _check_size("flatnonzero", size), fill_value)[0]


def nonzero(x, size, fill_value=0):
    """A tuple of index arrays, one per axis, of the first ``size`` nonzero elements."""
    x = F.as_var(x)
    if x.ndim == 0:
        raise ShapeError("nonzero: of a 0-d array; use atleast_1d(x) first, as NumPy asks")
    size = _check_size("nonzero", size)
    flat, valid = _first_hits(F.not_equal(N.ravel(x), 0), size, 0)
    coords = unravel_index(flat, x.shape)
    fills = fill_value if isinstance(fill_value, tuple) else (fill_value,) * x.ndim
    return tuple(F.where(valid, c, f) for c, f in zip(coords, fills))


def argwhere(x, size, fill_value=0):
    x = F.as_var(x)
    coords = nonzero(F.reshape(x, (1,)) if x.ndim == 0 else x, size, fill_value)
    if x.ndim == 0:
        return F.reshape(coords[0], (-1, 0))
    return F.stack(coords, 1)


def unique(x, size, fill_value=None, return_counts=False, equal_nan=True):
    """The sorted distinct values of the flattened ``x``, the first ``size`` of them, padded
    with ``fill_value`` (default: the smallest value); with their counts when asked.
    ``equal_nan``: every NaN counts as one value (NumPy's ``unique``); else each NaN is its
    own (the array API's ``unique_*``)."""
    x = N.ravel(F.as_var(x))
    size = _check_size("unique", size)
    n = x.shape[0]
    if n == 0:
        vals = F.zeros((size,), x.dtype)
        return (vals, F.zeros((size,), np.int64)) if return_counts else vals
    xs = F.take_along_axis(x, sorting.argsort(x, 0), 0)
    prev = F.slice(xs, (0,), (n - 1,))
    later = F.slice(xs, (1,), (n,))
    differs = F.not_equal(later, prev)
    if x.dtype.kind == "f" and equal_nan:     # every NaN equals every other here
        differs = F.logical_and(differs, F.logical_not(F.logical_and(N.isnan(later), N.isnan(prev))))
    starts = F.concatenate([F.full((1,), True, np.bool_), differs], 0)
    where, valid = _first_hits(starts, size, 0)
    fill = F.take(xs, 0, 0) if fill_value is None else fill_value
    vals = F.where(valid, F.take(xs, where, 0), fill)
    if not return_counts:
        return vals
    nxt = F.concatenate([F.slice(where, (1,), (size,)), F.full((1,), n, np.int64)], 0)
    nxt = F.where(F.concatenate([F.slice(valid, (1,), (size,)), F.full((1,), False, np.bool_)], 0),
                  nxt, n)
    counts = F.where(valid, F.sub(nxt, where), 0)
    return vals, counts
