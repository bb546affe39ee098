"""Movement primitives: they move or copy elements and never compute new ones.

Every one of them is linear, so each has a transpose rule, and the transposes
pair up: broadcast <-> reduce_sum, slice <-> pad, gather <-> scatter_add,
concatenate -> slices, reshape/transpose/flip -> themselves.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir import dtype_name
from . import api as F  # api imports this module too: F is used only inside the rules
from .core import Linear, Primitive, bind


def _define(name, doc, abstract, impl, jvp, transpose):
    p = Primitive(name, doc=doc)
    p.abstract, p.impl, p.jvp, p.transpose = abstract, impl, jvp, transpose
    return p


def _size(shape):
    return math.prod(shape)


# -- reshape -------------------------------------------------------------------

def _reshape_rule(x, *, shape):
    if _size(shape) != _size(x.shape) or any(d < 0 for d in shape):
        raise ShapeError(f"reshape: cannot reshape {x.shape} ({_size(x.shape)} elements) "
                         f"into {shape}; the element counts must match")
    return [(shape, x.dtype)]


reshape_p = _define(
    "reshape", "Same elements, row-major, new shape.", _reshape_rule,
    lambda x, *, shape: np.reshape(x, shape),
    lambda p, t, o, *, shape: [F.reshape(t[0], shape)],
    lambda ct, x, *, shape: [F.reshape(ct[0], x.shape)])


# -- broadcast_in_dim ----------------------------------------------------------

def _broadcast_rule(x, *, shape, dims):
    ok = len(dims) == x.ndim and all(0 <= d < len(shape) for d in dims) and \
        all(a < b for a, b in zip(dims, dims[1:]))
    if ok:
        ok = all(x.shape[i] in (1, shape[d]) for i, d in enumerate(dims))
    if not ok:
        raise ShapeError(f"broadcast: cannot broadcast shape {x.shape} to {shape}; "
                         "each dimension must match or be 1")
    return [(shape, x.dtype)]


def _broadcast_impl(x, *, shape, dims):
    expanded = [1] * len(shape)
    for i, d in enumerate(dims):
        expanded[d] = x.shape[i]
    return np.broadcast_to(np.reshape(x, expanded), shape)


def _broadcast_transpose(ct, x, *, shape, dims):
    summed = tuple(d for d in range(len(shape)) if d not in dims) + tuple(
        d for i, d in enumerate(dims) if x.shape[i] == 1 and shape[d] != 1)
    out = F.reduce_sum(ct[0], tuple(sorted(summed))) if summed else ct[0]
    return [F.reshape(out, x.shape)]


broadcast_in_dim_p = _define(
    "broadcast_in_dim",
    "Place operand dim i at output dim dims[i] and repeat it along the rest (and where it is 1).",
    _broadcast_rule, _broadcast_impl,
    lambda p, t, o, *, shape, dims: [F.broadcast_in_dim(t[0], shape, dims)],
    _broadcast_transpose)


# -- transpose -----------------------------------------------------------------

def _transpose_rule(x, *, perm):
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose: {perm} is not a permutation of the {x.ndim} axes "
                         f"of shape {x.shape}")
    return [(tuple(x.shape[p] for p in perm), x.dtype)]


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


transpose_p = _define(
    "transpose", "Permute the axes.", _transpose_rule,
    lambda x, *, perm: np.transpose(x, perm),
    lambda p, t, o, *, perm: [F.transpose(t[0], perm)],
    lambda ct, x, *, perm: [F.transpose(ct[0], _inverse(perm))])


# -- slice and pad -------------------------------------------------------------

def _slice_len(start, limit, stride):
    return max(0, -(-(limit - start) // stride))


def _slice_rule(x, *, starts, limits, strides):
    if not (len(starts) == len(limits) == len(strides) == x.ndim):
        raise ShapeError(f"slice: needs one start/limit/stride per axis of shape {x.shape}")
    for d, s, l, st in zip(x.shape, starts, limits, strides):
        if not (0 <= s <= l <= d) or st < 1:
            raise ShapeError(f"slice: [{s}:{l}:{st}] is out of range for an axis of size {d}")
    return [(tuple(_slice_len(s, l, st) for s, l, st in zip(starts, limits, strides)), x.dtype)]


def _slice_impl(x, *, starts, limits, strides):
    return x[tuple(slice(s, l, st) for s, l, st in zip(starts, limits, strides))]


def _slice_transpose(ct, x, *, starts, limits, strides):
    lo, hi, interior = [], [], []
    for d, s, n, st in zip(x.shape, starts, ct[0].shape, strides):
        lo.append(s)
        hi.append(d - (s + (n - 1) * st + 1) if n else d - s)
        interior.append(st - 1)
    return [F.pad(ct[0], tuple(lo), tuple(hi), tuple(interior))]


slice_p = _define(
    "slice", "x[start:limit:stride] on every axis (strides >= 1; flip gives negative ones).",
    _slice_rule, _slice_impl,
    lambda p, t, o, **kw: [F.slice(t[0], **kw)],
    _slice_transpose)


def _padded_len(n, lo, hi, interior):
    return lo + n + max(0, n - 1) * interior + hi


def _pad_rule(x, *, lo, hi, interior):
    if not (len(lo) == len(hi) == len(interior) == x.ndim) or \
            min(lo + hi + interior, default=0) < 0:
        raise ShapeError(f"pad: needs non-negative lo/hi/interior per axis of shape {x.shape}, "
                         f"got lo={lo} hi={hi} interior={interior}; use slice to crop")
    return [(tuple(_padded_len(n, a, b, i) for n, a, b, i in zip(x.shape, lo, hi, interior)),
             x.dtype)]


def _pad_impl(x, *, lo, hi, interior):
    shape = tuple(_padded_len(n, a, b, i) for n, a, b, i in zip(x.shape, lo, hi, interior))
    out = np.zeros(shape, dtype=x.dtype)
    out[tuple(slice(a, a + max(0, (n - 1) * (i + 1) + 1), i + 1)
              for n, a, i in zip(x.shape, lo, interior))] = x
    return out


def _pad_transpose(ct, x, *, lo, hi, interior):
    starts = tuple(lo)
    limits = tuple(a + max(0, (n - 1) * (i + 1) + 1) for n, a, i in zip(x.shape, lo, interior))
    return [F.slice(ct[0], starts, limits, tuple(i + 1 for i in interior))]


pad_p = _define(
    "pad", "Zeros before (lo), after (hi) and between (interior) the elements of every axis.",
    _pad_rule, _pad_impl,
    lambda p, t, o, **kw: [F.pad(t[0], **kw)],
    _pad_transpose)


# -- concatenate and flip --------------------------------------------------------

def _concatenate_rule(*xs, axis):
    x0 = xs[0]
    if not 0 <= axis < x0.ndim:
        raise ShapeError(f"concatenate: axis {axis} is out of range for shape {x0.shape}")
    for x in xs[1:]:
        if x.ndim != x0.ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, x0.shape))
                                     if i != axis):
            raise ShapeError(f"concatenate: shapes {x0.shape} and {x.shape} differ off axis {axis}; "
                             f"every axis but the joined one ({axis}) must match: reshape or slice "
                             "the operands, or join along the axis where they differ")
        if x.dtype != x0.dtype:
            raise DTypeError(f"concatenate: dtypes {dtype_name(x0.dtype)} and "
                             f"{dtype_name(x.dtype)} differ; cast first")
    shape = list(x0.shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return [(tuple(shape), x0.dtype)]


def _concatenate_jvp(p, t, o, *, axis):
    if all(ti is None for ti in t):
        return [None]
    return [F.concatenate([F.zeros_like(x) if ti is None else ti for x, ti in zip(p, t)], axis)]


def _concatenate_transpose(ct, *xs, axis):
    cts, offset = [], 0
    for x in xs:
        n = x.shape[axis]
        if isinstance(x, Linear):
            starts = tuple(offset if i == axis else 0 for i in range(len(x.shape)))
            limits = tuple(offset + n if i == axis else d for i, d in enumerate(ct[0].shape))
            cts.append(F.slice(ct[0], starts, limits, (1,) * len(x.shape)))
        else:
            cts.append(None)
        offset += n
    return cts


concatenate_p = _define(
    "concatenate", "Join operands along ``axis``.", _concatenate_rule,
    lambda *xs, axis: np.concatenate(xs, axis=axis),
    _concatenate_jvp, _concatenate_transpose)

flip_p = _define(
    "flip", "Reverse the order along ``axes``.",
    lambda x, *, axes: [(x.shape, x.dtype)],
    lambda x, *, axes: np.flip(x, axes),
    lambda p, t, o, *, axes: [F.flip(t[0], axes)],
    lambda ct, x, *, axes: [F.flip(ct[0], axes)])


# -- gather and scatter_add ------------------------------------------------------

def _check_index(name, x, idx):
    if idx.dtype.kind not in "iu":
        raise DTypeError(f"{name}: indices must be integers, got {dtype_name(idx.dtype)}")
    if idx.ndim < 1 or not 1 <= idx.shape[-1] <= x.ndim:
        raise ShapeError(f"{name}: index shape {idx.shape} must end in k, 1 <= k <= {x.ndim} "
                         f"(one coordinate per indexed axis of {x.shape})")
    return idx.shape[:-1] + x.shape[idx.shape[-1]:]


def _coords(x_shape, idx):
    """The index columns as a tuple for NumPy, after checking every one is in range."""
    k = idx.shape[-1]
    cols = tuple(idx[..., j] for j in range(k))
    for j, c in enumerate(cols):
        if c.size and (c.min() < 0 or c.max() >= x_shape[j]):
            bad = int(c.max()) if c.max() >= x_shape[j] else int(c.min())
            raise IndexError(f"index {bad} is out of range for axis {j} of size {x_shape[j]}; "
                             f"indices must lie in [0, {x_shape[j]})")
    return cols


def _gather_rule(x, idx):
    return [(_check_index("gather", x, idx), x.dtype)]


gather_p = _define(
    "gather",
    "x[idx[..., 0], idx[..., 1], ...]: rows picked by index (tf.gather_nd); linear in x.",
    _gather_rule,
    lambda x, idx: x[_coords(x.shape, idx)],
    lambda p, t, o: [None if t[0] is None else F.gather(t[0], p[1])],
    lambda ct, x, idx: [F.scatter_add(F.zeros(x.shape, x.dtype), idx, ct[0]), None])


def _scatter_add_rule(base, idx, upd):
    want = _check_index("scatter_add", base, idx)
    if upd.shape != want:
        raise ShapeError(f"scatter_add: updates of shape {upd.shape} do not match indices "
                         f"{idx.shape} into {base.shape} (expected {want})")
    if upd.dtype != base.dtype:
        raise DTypeError(f"scatter_add: update dtype {dtype_name(upd.dtype)} differs from "
                         f"{dtype_name(base.dtype)}")
    return [(base.shape, base.dtype)]


def _scatter_add_impl(base, idx, upd):
    out = np.array(base, copy=True)
    np.add.at(out, _coords(base.shape, idx), upd)
    return out


def _scatter_add_jvp(p, t, o):
    if t[0] is None and t[2] is None:
        return [None]
    tb = F.zeros_like(p[0]) if t[0] is None else t[0]
    tu = F.zeros_like(p[2]) if t[2] is None else t[2]
    return [F.scatter_add(tb, p[1], tu)]


def _scatter_add_transpose(ct, base, idx, upd):
    return [ct[0] if isinstance(base, Linear) else None, None,
            F.gather(ct[0], idx) if isinstance(upd, Linear) else None]


scatter_add_p = _define(
    "scatter_add",
    "base with upd added at the rows idx picks, in index order; the transpose of gather.",
    _scatter_add_rule, _scatter_add_impl, _scatter_add_jvp, _scatter_add_transpose)


# -- vmap rules: the batch axis is axis 0 of every batched operand ---------------------------

def _plus1(axes):
    return tuple(a + 1 for a in axes)


reshape_p.batch = lambda v, d, n, *, shape: ([bind(reshape_p, v[0], shape=(n,) + shape)], [0])
broadcast_in_dim_p.batch = lambda v, d, n, *, shape, dims: (
    [bind(broadcast_in_dim_p, v[0], shape=(n,) + shape, dims=(0,) + _plus1(dims))], [0])
transpose_p.batch = lambda v, d, n, *, perm: ([bind(transpose_p, v[0], perm=(0,) + _plus1(perm))], [0])
slice_p.batch = lambda v, d, n, *, starts, limits, strides: (
    [bind(slice_p, v[0], starts=(0,) + starts, limits=(n,) + limits, strides=(1,) + strides)], [0])
pad_p.batch = lambda v, d, n, *, lo, hi, interior: (
    [bind(pad_p, v[0], lo=(0,) + lo, hi=(0,) + hi, interior=(0,) + interior)], [0])
concatenate_p.batch = lambda v, d, n, *, axis: (
    [bind(concatenate_p, *F.batch_all(v, d, n), axis=axis + 1)], [0])
flip_p.batch = lambda v, d, n, *, axes: ([bind(flip_p, v[0], axes=_plus1(axes))], [0])


def _gather_batch(vals, dims, size):
    x, idx = vals
    if dims[0] is None:               # one table, per-sample indices: gather as is
        return [bind(gather_p, x, idx)], [0]
    x, idx = F.batch_all(vals, dims, size)
    return [bind(gather_p, x, F.batch_coordinate(idx))], [0]


def _scatter_add_batch(vals, dims, size):
    base, idx, upd = F.batch_all(vals, dims, size)
    return [bind(scatter_add_p, base, F.batch_coordinate(idx), upd)], [0]


gather_p.batch = _gather_batch
scatter_add_p.batch = _scatter_add_batch
