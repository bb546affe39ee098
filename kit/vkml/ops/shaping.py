"""NumPy's array-building and rearranging functions beyond the basic movement ops, composed.

Every function here is built from existing operations (slices, takes, reshapes,
concatenations, products), so each is differentiable wherever its pieces are and
runs on every backend.  Index patterns that depend only on shapes (``pad``'s
reflections, ``convolve``'s windows) are computed once with NumPy and taken with
one ``take``: the derivative of a take is a scatter-add, so a padded element's
gradient flows back to every element it copies.
"""

from __future__ import annotations

import builtins
import numbers

import numpy as np

from ..errors import ArgumentError, ShapeError
from . import api as F
from . import numeric as N

#: ``pad`` modes made by picking elements of the array itself (the rest: ``constant``)
_INDEX_PAD_MODES = ("edge", "reflect", "symmetric", "wrap")
PAD_MODES = ("constant",) + _INDEX_PAD_MODES


def _pairs(op, value, ndim, what):
    """NumPy's per-axis (before, after) pairs from an int, a pair, or one pair per axis."""
    arr = np.asarray(value, dtype=object)
    try:
        pairs = np.broadcast_to(arr, (ndim, 2)) if arr.size else np.zeros((ndim, 2), object)
    except ValueError:
        raise ShapeError(f"{op}: {what} {value!r} does not fit {ndim} axes; give one number, "
                         "one (before, after) pair, or one pair per axis") from None
    return [tuple(p) for p in pairs.tolist()]


def pad(x, pad_width, mode="constant", constant_values=0):
    """NumPy's ``pad`` with the modes constant, edge, reflect, symmetric and wrap."""
    x = F.as_var(x)
    if mode not in PAD_MODES:
        raise ArgumentError(f"pad: mode {mode!r} is not supported; use one of {', '.join(PAD_MODES)}")
    widths = _pairs("pad", pad_width, x.ndim, "pad_width")
    for lo, hi in widths:
        if not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= 0
                   for w in (lo, hi)):
            raise ArgumentError(f"pad: pad_width must be whole numbers >= 0, got {pad_width!r}")
    widths = [(int(lo), int(hi)) for lo, hi in widths]
    if mode == "constant":
        return _pad_constant(x, widths, constant_values)
    for axis, (lo, hi) in enumerate(widths):
        if lo or hi:
            n = x.shape[axis]
            if n == 0:
                raise ShapeError(f"pad: mode {mode!r} cannot pad axis {axis} of length 0; use "
                                 "mode 'constant'")
            index = np.pad(np.arange(n), (lo, hi), mode=mode)
            x = F.take(x, index, axis)
    return x


def _pad_constant(x, widths, constant_values):
    values = _pairs("pad", constant_values, x.ndim, "constant_values")
    out = x
    for axis, ((lo, hi), (c_lo, c_hi)) in enumerate(zip(widths, values)):
        if not (lo or hi):
            continue
        parts = []
        if lo:
            parts.append(F.full(out.shape[:axis] + (lo,) + out.shape[axis + 1:], c_lo, out.dtype))
        parts.append(out)
        if hi:
            parts.append(F.full(out.shape[:axis] + (hi,) + out.shape[axis + 1:], c_hi, out.dtype))
        out = F.concatenate(parts, axis)
    return out


def diff(x, n=1, axis=-1, prepend=None, append=None):
    """The n-th forward difference along ``axis``."""
    x = F.as_var(x)
    if x.ndim == 0:
        raise ShapeError("diff: needs at least one dimension; got a 0-d array")
    axis = F.normalize_axis("diff", x.ndim, axis)
    if not isinstance(n, numbers.Integral) or n < 0:
        raise ArgumentError(f"diff: order n must be a whole number >= 0, got {n!r}")
    def edge(extra):                 # a number is repeated along the axis's other dimensions
        e = F.as_var(extra)
        return F.broadcast_to(e, x.shape[:axis] + (1,) + x.shape[axis + 1:]) if e.ndim == 0 else e
    pieces = ([edge(prepend)] if prepend is not None else []) + [x] + \
        ([edge(append)] if append is not None else [])
    out = F.concatenate(F.promote(*pieces), axis) if len(pieces) > 1 else x
    for _ in range(int(n)):
        m = out.shape[axis]
        if m == 0:
            break
        hi = F.slice(out, _at(out, axis, 1), out.shape)
        lo = F.slice(out, (0,) * out.ndim, _at(out, axis, m - 1, out.shape))
        out = F.sub(hi, lo) if out.dtype != np.bool_ else F.not_equal(hi, lo)
    return out


def _at(x, axis, value, base=None):
    """A start (or limit) tuple: zeros (or ``base``) with ``value`` at ``axis``."""
    out = list(base) if base is not None else [0] * x.ndim
    out[axis] = value
    return tuple(out)


def kron(a, b):
    """The Kronecker product: every element of ``a`` times the whole of ``b``."""
    a, b = F.promote(a, b)
    nd = builtins.max(a.ndim, b.ndim)
    a = F.reshape(a, (1,) * (nd - a.ndim) + a.shape)
    b = F.reshape(b, (1,) * (nd - b.ndim) + b.shape)
    a_wide = F.reshape(a, tuple(s for d in a.shape for s in (d, 1)))
    b_wide = F.reshape(b, tuple(s for d in b.shape for s in (1, d)))
    return F.reshape(F.mul(a_wide, b_wide), tuple(p * q for p, q in zip(a.shape, b.shape)))


def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """The cross product of 3-vectors (or the z-component for 2-vectors) along the last axis."""
    a, b = F.promote(a, b)
    if axis is not None:
        axisa = axisb = axisc = axis
    a = N.moveaxis(a, axisa, -1)
    b = N.moveaxis(b, axisb, -1)
    sizes = (a.shape[-1] if a.ndim else 0, b.shape[-1] if b.ndim else 0)
    if any(s not in (2, 3) for s in sizes):
        raise ShapeError(f"cross: vectors must have 2 or 3 components, got {sizes[0]} and "
                         f"{sizes[1]}; move the component axis with axisa/axisb")

    def comp(v, i):
        if i >= v.shape[-1]:
            return F.zeros(v.shape[:-1], v.dtype)
        return F.take(v, i, -1)

    a0, a1, a2 = (comp(a, i) for i in range(3))
    b0, b1, b2 = (comp(b, i) for i in range(3))
    z = F.sub(F.mul(a0, b1), F.mul(a1, b0))
    if sizes == (2, 2):
        return z
    out = F.stack(F.promote(F.sub(F.mul(a1, b2), F.mul(a2, b1)),
                            F.sub(F.mul(a2, b0), F.mul(a0, b2)), z), -1)
    return N.moveaxis(out, -1, axisc)


def atleast_nd(x, nd):
    """``atleast_1d/2d/3d``: NumPy's placement of the new axes."""
    x = F.as_var(x)
    if x.ndim >= nd:
        return x
    if nd == 1 or x.ndim == 0:
        return F.reshape(x, (1,) * nd)
    if nd == 2:
        return F.reshape(x, (1,) + x.shape)
    return F.reshape(x, (1,) + x.shape + (1,) if x.ndim == 1 else x.shape + (1,))


def _arrays(op, xs):
    """The operands of a function that joins several arrays, checked to be a sequence."""
    if not isinstance(xs, (list, tuple)) or not xs:
        raise ArgumentError(f"{op}: takes a non-empty list or tuple of arrays, got "
                            f"{type(xs).__name__}; pass e.g. [a, b]")
    return [F.as_var(x) for x in xs]


def column_stack(xs):
    cols = [F.reshape(v, (-1, 1)) if v.ndim < 2 else v for v in _arrays("column_stack", xs)]
    return F.concatenate(F.promote(*cols), 1)


def dstack(xs):
    return F.concatenate(F.promote(*[atleast_nd(v, 3) for v in _arrays("dstack", xs)]), 2)


def rot90(m, k=1, axes=(0, 1)):
    """Rotated by 90 degrees ``k`` times in the plane of ``axes`` (from the first toward the second)."""
    m = F.as_var(m)
    if len(axes) != 2:
        raise ArgumentError(f"rot90: axes must be two axes, got {axes!r}")
    a0, a1 = (F.normalize_axis("rot90", m.ndim, a) for a in axes)
    if a0 == a1:
        raise ArgumentError("rot90: the two axes must differ")
    k = int(k) % 4
    if k == 0:
        return m
    if k == 2:
        return F.flip(m, (a0, a1))
    perm = list(range(m.ndim))
    perm[a0], perm[a1] = perm[a1], perm[a0]
    if k == 1:
        return F.transpose(F.flip(m, (a1,)), tuple(perm))
    return F.flip(F.transpose(m, tuple(perm)), (a1,))


def select(condlist, choicelist, default=0):
    """The choice of the first condition that holds, element by element; ``default`` where none does."""
    if not isinstance(condlist, (list, tuple)) or not isinstance(choicelist, (list, tuple)):
        raise ArgumentError("select: condlist and choicelist must be lists (one condition per "
                            "choice), as in vnp.select([x < 0, x > 1], [-x, x])")
    if len(condlist) != len(choicelist):
        raise ArgumentError(f"select: {len(condlist)} conditions but {len(choicelist)} choices; "
                            "give one choice per condition")
    if not condlist:
        raise ArgumentError("select: needs at least one condition and choice")
    choices = F.promote(*choicelist, default)
    out = choices[-1]
    for cond, choice in zip(reversed(condlist), reversed(choices[:-1])):
        cond = F.as_var(cond)
        if cond.dtype != np.bool_:
            raise ArgumentError(f"select: conditions must be bool arrays, got {cond.dtype}; "
                                "compare first (x > 0)")
        out = F.where(cond, choice, out)
    return out


def unravel_index(indices, shape):
    """Flat indices as a tuple of coordinate arrays of ``shape`` (C order)."""
    idx = F.as_var(indices)
    if idx.dtype.kind not in "iu":
        raise ArgumentError(f"unravel_index: indices must be integers, got {idx.dtype}")
    out = []
    for d in reversed(tuple(shape)):
        out.append(N.mod(idx, d) if d else idx)
        idx = F.floor_divide(idx, d) if d else idx
    return tuple(reversed(out))


def convolve(a, v, mode="full"):
    """The discrete linear convolution of two 1-D arrays (``mode`` full, same or valid)."""
    a, v = F.promote(a, v)
    if a.ndim != 1 or v.ndim != 1:
        raise ShapeError(f"convolve: needs two 1-D arrays, got shapes {a.shape} and {v.shape}")
    if a.shape[0] == 0 or v.shape[0] == 0:
        raise ShapeError("convolve: an operand is empty; give at least one element each")
    if mode not in ("full", "same", "valid"):
        raise ArgumentError(f"convolve: mode must be 'full', 'same' or 'valid', got {mode!r}")
    n, m = a.shape[0], v.shape[0]
    if m > n:
        a, v, n, m = v, a, m, n
    padded = F.pad(a, (m - 1,), (m - 1,))
    windows = np.arange(n + m - 1)[:, None] + np.arange(m)[None, :]
    full = F.matmul(F.take(padded, windows, 0), F.flip(v, (0,)))
    if mode == "full":
        return full
    length = n if mode == "same" else n - m + 1
    start = (m - 1) // 2 if mode == "same" else m - 1
    return F.slice(full, (start,), (start + length,))


def correlate(a, v, mode="valid"):
    """The cross-correlation of two 1-D arrays: ``convolve(a, v[::-1])``."""
    v = F.as_var(v)
    if v.ndim != 1:
        raise ShapeError(f"correlate: needs two 1-D arrays, got shape {v.shape} for v")
    a = F.as_var(a)
    if a.ndim == 1 and v.shape[0] > a.shape[0] and mode != "full":
        # NumPy keeps a's side: correlate(a, v) = reverse of correlate(v, a)
        return F.flip(convolve(v, F.flip(a, (0,)), mode), (0,))
    return convolve(a, F.flip(v, (0,)), mode)


def polyval(p, x):
    """The polynomial with coefficients ``p`` (highest power first) at ``x``, by Horner's rule."""
    p = F.as_var(p)
    if p.ndim != 1:
        raise ShapeError(f"polyval: coefficients must be 1-D, got shape {p.shape}")
    p, x = F.promote(p, x)
    out = F.zeros_like(x)
    for i in range(p.shape[0]):
        out = F.add(F.mul(out, x), F.take(p, i, 0))
    return out


def trapezoid(y, x=None, dx=1.0, axis=-1):
    """The integral of ``y`` along ``axis`` by the trapezoidal rule (samples at ``x`` or spacing ``dx``)."""
    y = F.as_floating(y)
    axis = F.normalize_axis("trapezoid", y.ndim, axis)
    n = y.shape[axis]
    if n < 2:
        return F.sum(F.mul(y, 0.0), axis)
    if x is None:
        width = dx
    else:
        x = F.as_floating(x)
        width = diff(x, axis=axis if x.ndim == y.ndim else -1)
        if x.ndim == 1 and y.ndim > 1:
            width = F.reshape(width, (n - 1,) + (1,) * (y.ndim - 1 - axis))
    hi = F.slice(y, _at(y, axis, 1), y.shape)
    lo = F.slice(y, (0,) * y.ndim, _at(y, axis, n - 1, y.shape))
    return F.sum(F.mul(F.mul(F.add(hi, lo), width), 0.5), axis)


def tri_mask(n, m, k):
    """NumPy's ``tri``: True at and below the k-th diagonal of an n x m matrix."""
    return np.tri(n, m, k, dtype=bool)
