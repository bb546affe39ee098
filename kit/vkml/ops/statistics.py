"""Order statistics, weighted and NaN-ignoring reductions, counting and interpolation, composed.

- ``quantile`` sorts along the axis and interpolates between the two order
  statistics around each quantile; the ``nan`` forms count the non-NaN
  elements per row (a sort puts NaN last), so the positions are values of the
  program, not constants, and the same code serves both.  The derivative goes
  to the (one or two) elements picked, as NumPy's definition implies.
- the ``nan`` reductions replace NaN by the operation's identity.
- ``searchsorted`` counts, for each value, the sorted elements below it (a
  comparison and a sum: O(n m) work, no data-dependent control flow, so it
  runs inside traces and on every backend); ``digitize``, ``interp`` and
  ``histogram`` are built on it; ``bincount`` is a scatter-add of fixed length.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import ArgumentError, ShapeError
from . import api as F
from . import numeric as N
from . import sorting

QUANTILE_METHODS = ("linear", "lower", "higher", "nearest", "midpoint")


def _last(x, axis):
    """``x`` with ``axis`` (int, tuple or None) moved last as one axis, and the kept shape."""
    x = F.as_var(x)
    axes = F.normalize_axes("quantile", x.ndim, axis)
    rest = tuple(i for i in range(x.ndim) if i not in axes)
    moved = F.transpose(x, rest + axes)
    kept = tuple(x.shape[i] for i in rest)
    return F.reshape(moved, kept + (int(np.prod([x.shape[i] for i in axes], dtype=np.int64)),)), axes


def _keepdims_shape(shape, axes):
    out = list(shape)
    for a in sorted(axes):
        out.insert(a, 1)
    return tuple(out)


def quantile(a, q, axis=None, method="linear", keepdims=False, ignore_nan=False, op="quantile"):
    """NumPy's ``quantile`` (``q`` in [0, 1], a number or a constant array) over ``axis``."""
    if method not in QUANTILE_METHODS:
        raise ArgumentError(f"{op}: method {method!r} is not supported; use one of "
                            f"{', '.join(QUANTILE_METHODS)}")
    qs = np.asarray(q, dtype=np.float64)
    if qs.size and (np.any(np.isnan(qs)) or qs.min() < 0 or qs.max() > 1):
        scale = "100" if op.endswith("percentile") else "1"
        raise ArgumentError(f"{op}: q must be in [0, {scale}], got {q!r}")
    a = F.as_floating(a)
    x, axes = _last(a, axis)
    n = x.shape[-1]
    if n == 0:
        raise ShapeError(f"{op}: of an empty axis; there is no value to pick")
    xs = F.take_along_axis(x, sorting.argsort(x, x.ndim - 1), -1)
    nans = F.sum(F.cast(N.isnan(xs), np.int64), -1, keepdims=True)
    count = F.sub(n, nans) if ignore_nan else F.full(nans.shape, n, np.int64)
    top = F.cast(F.maximum(F.sub(count, 1), 0), np.float64)         # the last valid position
    outs = []
    for qv in qs.ravel():
        pos = F.mul(top, float(qv))
        lo = N.floor(pos)
        frac = F.sub(pos, lo)
        lo_i = F.cast(lo, np.int64)
        hi_i = F.cast(F.minimum(F.add(lo, 1.0), top), np.int64)
        below, above = F.take_along_axis(xs, lo_i, -1), F.take_along_axis(xs, hi_i, -1)
        if method == "linear":
            v = F.add(below, F.mul(F.sub(above, below), F.cast(frac, xs.dtype)))
        elif method == "lower":
            v = below
        elif method == "higher":
            v = F.where(F.greater(frac, 0.0), above, below)
        elif method == "nearest":      # halves to the even position, as NumPy
            even = F.equal(N.mod(lo, 2.0), 0.0)
            up = F.logical_or(F.greater(frac, 0.5), F.logical_and(F.equal(frac, 0.5),
                                                                  F.logical_not(even)))
            v = F.where(up, above, below)
        else:
            v = F.mul(F.add(below, above), 0.5)
        if ignore_nan:       # a row of NaN only gives NaN
            v = F.where(F.equal(count, 0), np.nan, v)
        else:                # any NaN gives NaN, as NumPy
            v = F.where(F.greater(nans, 0), np.nan, v)
        outs.append(F.reshape(v, v.shape[:-1]))
    out = F.stack(outs, 0) if outs else F.zeros((0,) + x.shape[:-1], xs.dtype)
    out = F.reshape(out, qs.shape + x.shape[:-1])
    if keepdims:
        out = F.reshape(out, qs.shape + _keepdims_shape(x.shape[:-1], axes))
    return out


def average(a, axis=None, weights=None, keepdims=False):
    """The (weighted) mean over ``axis``; ``weights`` of ``a``'s shape or 1-D along one axis."""
    a = F.as_floating(a)
    if weights is None:
        return F.mean(a, axis, keepdims)
    w = F.as_floating(weights)
    if w.shape != a.shape:
        if axis is None or not isinstance(axis, numbers.Integral) or w.ndim != 1:
            raise ShapeError(f"average: weights of shape {w.shape} do not fit a of shape {a.shape}; "
                             "give weights of a's shape, or 1-D weights along one axis")
        ax = F.normalize_axis("average", a.ndim, axis)
        if w.shape[0] != a.shape[ax]:
            raise ShapeError(f"average: {w.shape[0]} weights for an axis of length {a.shape[ax]}")
        w = F.reshape(w, tuple(w.shape[0] if i == ax else 1 for i in range(a.ndim)))
        w = F.broadcast_to(w, a.shape)
    a, w = F.promote(a, w)
    return F.div(F.sum(F.mul(a, w), axis, keepdims), F.sum(w, axis, keepdims))


def cov(m, y=None, rowvar=True, bias=False, ddof=None):
    """The covariance matrix of the variables (rows, or columns when ``rowvar`` is False)."""
    x = F.as_floating(m)
    if x.ndim > 2:
        raise ShapeError(f"cov: needs 1-D or 2-D data, got shape {x.shape}")
    x = N.ravel(x) if x.ndim == 0 else x
    x = F.reshape(x, (1, -1)) if x.ndim == 1 else (x if rowvar else F.transpose(x, (1, 0)))
    if y is not None:
        yv = F.as_floating(y)
        yv = F.reshape(yv, (1, -1)) if yv.ndim == 1 else (yv if rowvar else F.transpose(yv, (1, 0)))
        x, yv = F.promote(x, yv)
        x = F.concatenate([x, yv], 0)
    n = x.shape[1]
    d = (0 if bias else 1) if ddof is None else int(ddof)
    centred = F.sub(x, F.mean(x, 1, keepdims=True))
    out = F.div(F.matmul(centred, F.transpose(centred, (1, 0))), float(n - d))
    return F.reshape(out, ()) if out.shape == (1, 1) else out


def corrcoef(x, y=None, rowvar=True):
    """Pearson correlation coefficients: the covariance scaled by the standard deviations."""
    c = cov(x, y, rowvar)
    if c.ndim == 0:
        return F.div(c, c)
    d = F.sqrt(N.diagonal(c))
    out = F.div(F.div(c, F.reshape(d, (-1, 1))), F.reshape(d, (1, -1)))
    return F.clip(out, -1.0, 1.0)


# -- NaN-ignoring reductions ---------------------------------------------------------------------

def _nan_filled(x, value):
    x = F.as_var(x)
    if x.dtype.kind != "f":
        return x
    return F.where(N.isnan(x), value, x)


def nansum(x, axis=None, keepdims=False):
    return F.sum(_nan_filled(x, 0.0), axis, keepdims)


def nanprod(x, axis=None, keepdims=False):
    return N.prod(_nan_filled(x, 1.0), axis, keepdims)


def _valid_count(x, axis, keepdims):
    x = F.as_var(x)
    if x.dtype.kind != "f":
        return F.sum(F.ones(x.shape, np.int64), axis, keepdims)
    return F.sum(F.logical_not(N.isnan(x)), axis, keepdims)


def nanmean(x, axis=None, keepdims=False):
    x = F.as_floating(x)
    return F.div(nansum(x, axis, keepdims), F.cast(_valid_count(x, axis, keepdims), x.dtype))


def nanvar(x, axis=None, ddof=0, keepdims=False):
    x = F.as_floating(x)
    mean = nanmean(x, axis, keepdims=True)
    # deviations 0 at NaN before squaring: a NaN inside the unused branch of a where would
    # make the derivative NaN (0 * NaN)
    dev = F.where(N.isnan(x), 0.0, F.sub(_nan_filled(x, 0.0), mean))
    count = F.cast(_valid_count(x, axis, keepdims), x.dtype)
    return F.div(F.sum(F.square(dev), axis, keepdims), F.sub(count, float(ddof)))


def nanstd(x, axis=None, ddof=0, keepdims=False):
    return F.sqrt(nanvar(x, axis, ddof, keepdims))


def _nan_extreme(reduce, fill, x, axis, keepdims):
    x = F.as_var(x)
    if x.dtype.kind != "f":
        return reduce(x, axis, keepdims)
    out = reduce(_nan_filled(x, fill), axis, keepdims)
    all_nan = F.equal(_valid_count(x, axis, keepdims), 0)
    return F.where(all_nan, np.nan, out)


def nanmax(x, axis=None, keepdims=False):
    return _nan_extreme(F.max, -np.inf, x, axis, keepdims)


def nanmin(x, axis=None, keepdims=False):
    return _nan_extreme(F.min, np.inf, x, axis, keepdims)


def nanargmax(x, axis=None, keepdims=False):
    return keep_reduced_axis(F.argmax(_nan_filled(x, -np.inf), axis), F.as_var(x), axis, keepdims)


def nanargmin(x, axis=None, keepdims=False):
    return keep_reduced_axis(F.argmin(_nan_filled(x, np.inf), axis), F.as_var(x), axis, keepdims)


def keep_reduced_axis(out, x, axis, keepdims):
    """An ``argmax``-style result with the reduced axis kept as length 1 when ``keepdims``."""
    if not keepdims:
        return out
    if axis is None:
        return F.reshape(out, (1,) * x.ndim)
    return F.expand_dims(out, F.normalize_axis("argmax", x.ndim, axis))


def nancumsum(x, axis=None):
    return N.cumsum(_nan_filled(x, 0.0), axis)


def nancumprod(x, axis=None):
    return N.cumprod(_nan_filled(x, 1.0), axis)


def cumulative_sum(x, axis=None, dtype=None, include_initial=False):
    """The array API's ``cumulative_sum``: ``axis`` needed above 1-D; an initial 0 on request."""
    x = F.as_var(x)
    if axis is None:
        if x.ndim > 1:
            raise ArgumentError(f"cumulative_sum: give axis for a {x.ndim}-D array (shape "
                                f"{x.shape}); it does not flatten")
        axis = 0
    if x.ndim == 0:
        raise ShapeError("cumulative_sum: needs at least one dimension; got a 0-d array")
    if dtype is not None:
        x = F.cast(x, dtype)
    axis = F.normalize_axis("cumulative_sum", x.ndim, axis)
    out = N.cumsum(x, axis)
    if include_initial:
        zero = F.zeros(x.shape[:axis] + (1,) + x.shape[axis + 1:], out.dtype)
        out = F.concatenate([zero, out], axis)
    return out


# -- counting and searching --------------------------------------------------------------------

def searchsorted(a, v, side="left", sorter=None):
    """Where ``v``'s elements would go in the sorted 1-D ``a`` to keep it sorted."""
    a = F.as_var(a)
    if a.ndim != 1:
        raise ShapeError(f"searchsorted: a must be 1-D, got shape {a.shape}")
    if side not in ("left", "right"):
        raise ArgumentError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if sorter is not None:
        a = F.take(a, sorter, 0)
    a, v = F.promote(a, F.as_var(v))
    col = F.reshape(v, v.shape + (1,))
    before = F.less(a, col) if side == "left" else F.less_equal(a, col)
    if a.dtype.kind == "f":          # NaN sorts last: every number is before it
        before = F.logical_or(before, F.logical_and(N.isnan(col), F.logical_not(N.isnan(a))))
        if side == "right":
            before = F.logical_or(before, F.logical_and(N.isnan(col), N.isnan(a)))
    return F.sum(F.cast(before, np.int64), -1)


def digitize(x, bins, right=False):
    """The index of the bin each ``x`` falls in (``bins`` increasing or decreasing, constant)."""
    b = None
    if not hasattr(bins, "dtype") or isinstance(bins, np.ndarray):
        try:
            b = np.asarray(bins)
        except (TypeError, ValueError):
            raise ArgumentError(f"digitize: bins must be a 1-D array of numbers, got "
                                f"{type(bins).__name__}") from None
        if b.dtype.kind not in "biuf" or b.ndim != 1:
            raise ArgumentError(f"digitize: bins must be a 1-D array of real numbers, got "
                                f"{b.dtype} of shape {b.shape}")
    if b is not None and b.size > 1 and np.all(np.diff(b) <= 0):
        rev = searchsorted(F.as_var(b[::-1].copy()), x, "left" if not right else "right")
        return F.sub(b.size, rev)
    return searchsorted(bins, x, "left" if right else "right")


def bincount(x, weights=None, minlength=0, length=None):
    """How often each value 0..length-1 occurs in the 1-D int ``x`` (or the sum of its weights)."""
    x = F.as_var(x)
    if x.ndim != 1 or x.dtype.kind not in "iu":
        raise ArgumentError(f"bincount: needs a 1-D integer array, got {x.dtype} of shape {x.shape}")
    size = max(int(length), int(minlength))
    if weights is None:
        upd = F.ones(x.shape, np.int64)
    else:
        upd = F.as_var(weights)
        if upd.shape != x.shape:
            raise ShapeError(f"bincount: weights of shape {upd.shape} for values of shape {x.shape}")
        upd = F.cast(upd, np.float64) if upd.dtype.kind != "f" else upd
    inside = F.logical_and(F.greater_equal(x, 0), F.less(x, size))
    upd = F.where(inside, upd, F.zeros((), upd.dtype))
    idx = F.reshape(F.where(inside, x, 0), x.shape + (1,))
    return F.scatter_add(F.zeros((size,), upd.dtype), F.cast(idx, np.int64), upd)


def histogram(a, bins=10, range=None, weights=None, density=False):
    """(counts, edges): ``bins`` equal bins over ``range`` (default: the data's) or given edges."""
    a = N.ravel(F.as_floating(a))
    if isinstance(bins, numbers.Integral):
        if bins < 1:
            raise ArgumentError(f"histogram: bins must be at least 1, got {bins}")
        if range is None:
            lo, hi = F.min(a), F.max(a)
            widen = F.cast(F.equal(lo, hi), a.dtype)      # one value: NumPy widens by 0.5 each way
            lo, hi = F.sub(lo, F.mul(widen, 0.5)), F.add(hi, F.mul(widen, 0.5))
        else:
            lo, hi = (F.cast(F.as_var(r), a.dtype) for r in range)
        steps = F.constant(np.linspace(0.0, 1.0, int(bins) + 1))
        edges = F.add(lo, F.mul(F.sub(hi, lo), F.cast(steps, a.dtype)))
        edges = F.where(F.equal(F.constant(np.arange(int(bins) + 1)), int(bins)), hi, edges)
    else:
        edges = F.as_floating(bins)
    nbins = edges.shape[0] - 1
    idx = F.sub(searchsorted(edges, a, "right"), 1)
    idx = F.where(F.equal(a, F.take(edges, nbins, 0)), nbins - 1, idx)   # the last edge is inside
    w = None if weights is None else N.ravel(F.as_floating(weights))
    counts = bincount(F.where(F.less(idx, nbins), idx, -1), w, length=nbins)
    if density:
        counts = F.cast(counts, edges.dtype)
        widths = F.sub(F.slice(edges, (1,), (nbins + 1,)), F.slice(edges, (0,), (nbins,)))
        counts = F.div(F.div(counts, F.sum(counts)), widths)
    return counts, edges


def interp(x, xp, fp, left=None, right=None):
    """Piecewise-linear interpolation of the points (xp, fp) (xp increasing) at ``x``."""
    xp, fp = F.as_floating(xp), F.as_floating(fp)
    if xp.ndim != 1 or fp.ndim != 1 or xp.shape != fp.shape or xp.shape[0] == 0:
        raise ShapeError(f"interp: xp and fp must be 1-D of one nonzero length, got {xp.shape} "
                         f"and {fp.shape}")
    x = F.as_floating(x)
    x, xp, fp = F.promote(x, xp, fp)
    n = xp.shape[0]
    if n == 1:
        out = F.broadcast_to(F.take(fp, 0, 0), x.shape)
    else:
        i = F.clip(searchsorted(xp, x, "right"), 1, n - 1)
        x0, x1 = F.take(xp, F.sub(i, 1), 0), F.take(xp, i, 0)
        f0, f1 = F.take(fp, F.sub(i, 1), 0), F.take(fp, i, 0)
        slope = F.div(F.sub(f1, f0), F.sub(x1, x0))
        out = F.add(f0, F.mul(slope, F.sub(x, x0)))
        out = F.where(F.equal(x, x1), f1, out)
    lo_v = F.take(fp, 0, 0) if left is None else left
    hi_v = F.take(fp, n - 1, 0) if right is None else right
    out = F.where(F.less(x, F.take(xp, 0, 0)), lo_v, out)
    out = F.where(F.greater(x, F.take(xp, n - 1, 0)), hi_v, out)
    return F.where(N.isnan(x), np.nan, out)
