"""The rest of NumPy's common names for ``vkml.numpy``: their argument checks and table rows.

``vkml.numpy`` builds these functions from the tables at the end (name,
function on Vars, summary, example, what the example prints), as it builds
its first ones.  Functions whose result length depends on the data
(``nonzero``, ``unique``, ...) are wrapped at the Tensor level: given a
``size=``, they are one program like any other (and trace); without one, the
data must be at hand, and the number of hits is counted first.
"""

from __future__ import annotations

import builtins
import collections
import inspect
import math
import numbers

import numpy as _np

from ..errors import ArgumentError, TracingError
from ..ir import Var
from ..ops import api as _api
from ..ops import complex_parts as _cplx
from ..ops import float_math as _fm
from ..ops import numeric as _num
from ..ops import selection as _sel
from ..ops import shaping as _shp
from ..ops import statistics as _st
from ..runtime import is_grad_enabled, is_traced, user_site_text
from ..tensor import Tensor, apply_api, needs_grad
from . import _array_api as _aa
from .. import validate as _valid
from ._lift import check_flags_and_choices, lifted as _lifted


# -- reductions with NumPy's keywords -----------------------------------------------------------

def _argmax(a, axis=None, keepdims=False):
    return _st.keep_reduced_axis(_api.argmax(a, axis), _api.as_var(a), axis,
                     _valid.check_bool(keepdims, "keepdims", "argmax"))


def _argmin(a, axis=None, keepdims=False):
    return _st.keep_reduced_axis(_api.argmin(a, axis), _api.as_var(a), axis,
                     _valid.check_bool(keepdims, "keepdims", "argmin"))


def _concatenate(arrays, axis=0):
    """NumPy's concatenate: the array API's ``concat`` (dtypes promoted, None flattens)."""
    return _aa.concat_vars("concatenate", arrays, axis)


def _median(a, axis=None, keepdims=False):
    return _st.quantile(a, 0.5, axis, "linear", keepdims, op="median")


def _quantile(a, q, axis=None, method="linear", keepdims=False):
    return _st.quantile(a, _constant_q(q, "quantile"), axis, method, keepdims, op="quantile")


def _percentile(a, q, axis=None, method="linear", keepdims=False):
    return _st.quantile(a, _np.asarray(_constant_q(q, "percentile"), float) / 100.0, axis, method,
                        keepdims, op="percentile")


def _nanmedian(a, axis=None, keepdims=False):
    return _st.quantile(a, 0.5, axis, "linear", keepdims, ignore_nan=True, op="nanmedian")


def _nanquantile(a, q, axis=None, method="linear", keepdims=False):
    return _st.quantile(a, _constant_q(q, "nanquantile"), axis, method, keepdims, ignore_nan=True,
                        op="nanquantile")


def _nanpercentile(a, q, axis=None, method="linear", keepdims=False):
    return _st.quantile(a, _np.asarray(_constant_q(q, "nanpercentile"), float) / 100.0, axis,
                        method, keepdims, ignore_nan=True, op="nanpercentile")


def _constant_q(q, op):
    if isinstance(q, Var):
        raise ArgumentError(f"{op}: q must be a number or a constant array (the positions picked "
                            "decide the program); pass a list or a NumPy array")
    try:
        out = _np.asarray(q, dtype=_np.float64)
    except (TypeError, ValueError):
        raise ArgumentError(f"{op}: q must be a number or an array of numbers, got {q!r}") from None
    return out


def _nanvar(a, axis=None, ddof=0, keepdims=False):
    return _st.nanvar(a, axis, _valid.check_int(ddof, "ddof", "nanvar"), keepdims)


def _nanstd(a, axis=None, ddof=0, keepdims=False):
    return _st.nanstd(a, axis, _valid.check_int(ddof, "ddof", "nanstd"), keepdims)


def _cov(m, y=None, rowvar=True, bias=False, ddof=None):
    ddof = None if ddof is None else _valid.check_int(ddof, "ddof", "cov")
    return _st.cov(m, y, _valid.check_bool(rowvar, "rowvar", "cov"),
                   _valid.check_bool(bias, "bias", "cov"), ddof)


# -- elementwise ---------------------------------------------------------------------------------

def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return _num.all(_fm.isclose(a, b, rtol, atol, equal_nan))


def _array_equal(a1, a2, equal_nan=False):
    a1, a2 = _api.as_var(a1), _api.as_var(a2)
    if a1.shape != a2.shape:
        return _api.constant(False)
    same = _api.equal(a1, a2)
    if equal_nan and a1.dtype.kind == "f":
        same = _api.logical_or(same, _api.logical_and(_num.isnan(a1), _num.isnan(a2)))
    return _num.all(same)


def _real(x):
    return _cplx.real(x)


def _imag(x):
    return _cplx.imag(x)


def _conj(x):
    return _cplx.conj(x)


# -- making arrays --------------------------------------------------------------------------------

def _clamped_offset(k, rows, cols):
    """A diagonal offset beyond the matrix clamped just past its corner (every such offset
    selects the same elements), so a huge one cannot overflow NumPy's C long."""
    return builtins.max(-rows - 1, builtins.min(k, cols + 1))


def _tri(N, M=None, k=0, dtype=_np.float64):
    n = _valid.check_int(N, "N", "tri", low=0)
    m = n if M is None else _valid.check_int(M, "M", "tri", low=0)
    _valid.check_shape((n, m), "tri")
    k = _clamped_offset(_valid.check_int(k, "k", "tri"), n, m)
    return _api.constant(_np.tri(n, m, k, dtype=_valid.check_dtype(dtype, "tri")))


def _logspace(start, stop, num=50, endpoint=True, base=10.0, dtype=None):
    num = _valid.check_int(num, "num", "logspace", low=0, high=_valid.MAX_ELEMENTS)
    exps = _num.linspace(_valid.check_real(start, "start", "logspace"),
                         _valid.check_real(stop, "stop", "logspace"), num,
                         _valid.check_bool(endpoint, "endpoint", "logspace"), None)
    out = _api.pow(_valid.check_real(base, "base", "logspace"), exps)
    return out if dtype is None else _api.cast(out, _valid.check_dtype(dtype, "logspace"))


def _copy(a):
    return _api.as_var(a)


def _empty(shape, dtype=_np.float64, *, device=None):
    """Zeros: a Tensor is never uninitialised memory."""
    return _api.zeros(_valid.check_shape(shape, "empty"),
                      _np.float64 if dtype is None else _valid.check_dtype(dtype, "empty"))


def _empty_like(prototype, dtype=None, *, device=None):
    a = _api.as_var(prototype)
    return _api.zeros(a.shape, a.dtype if dtype is None else _valid.check_dtype(dtype, "empty_like"))


def _pad(array, pad_width, mode="constant", constant_values=0):
    return _shp.pad(array, pad_width, mode, constant_values)


def _diff(a, n=1, axis=-1, prepend=None, append=None):
    return _shp.diff(a, _valid.check_int(n, "n", "diff", low=0), axis, prepend, append)


def _rot90(m, k=1, axes=(0, 1)):
    return _shp.rot90(m, _valid.check_int(k, "k", "rot90"), tuple(_valid.check_sequence(axes, "axes", "rot90")))


def _atleast(nd):
    one = _lifted(lambda a: _shp.atleast_nd(a, nd), f"atleast_{nd}d", "")

    def fn(*arys):
        outs = [one(a) for a in arys]
        return outs[0] if len(outs) == 1 else outs
    return fn


def _split_along(op, axis):
    def fn(ary, indices_or_sections):
        a = _api.as_var(ary)
        ax = 0 if (axis == 1 and a.ndim == 1) else axis
        if a.ndim <= ax:
            raise ArgumentError(f"{op}: needs at least {ax + 1} dimensions, got shape {a.shape}")
        cuts = indices_or_sections
        if isinstance(cuts, (list, tuple)) or isinstance(cuts, _np.ndarray) and cuts.ndim:
            cuts = [_valid.check_int(c, f"indices_or_sections[{i}]", op)
                    for i, c in enumerate(_valid.check_sequence(cuts, "indices_or_sections", op))]
        else:
            cuts = _valid.check_int(cuts, "indices_or_sections (the number of pieces)", op, 1,
                                    builtins.max(a.shape[ax], 1))
        return _num.split(a, cuts, ax)
    return fn


def _indices_of(op, n, k, upper, m=None):
    n = _valid.check_int(n, "n", op, low=0)
    m = n if m is None else _valid.check_int(m, "m", op, low=0)
    _valid.check_shape((n, m), op)
    rows, cols = (_np.triu_indices if upper else _np.tril_indices)(
        n, _clamped_offset(_valid.check_int(k, "k", op), n, m), m)
    return [_api.constant(rows.astype(_np.int64)), _api.constant(cols.astype(_np.int64))]


def _triu_indices(n, k=0, m=None):
    return _indices_of("triu_indices", n, k, True, m)


def _tril_indices(n, k=0, m=None):
    return _indices_of("tril_indices", n, k, False, m)


def _indices(dimensions, dtype=_np.int64):
    dims = tuple(_valid.check_int(d, "dimensions", "indices", low=0)
                 for d in _valid.check_sequence(dimensions, "dimensions", "indices"))
    _valid.check_shape((len(dims),) + dims, "indices")
    dtype = _valid.check_dtype(dtype, "indices")
    if dtype.kind not in "iu":
        raise ArgumentError(f"indices: dtype must be an integer dtype, got {dtype}")
    return _api.constant(_np.indices(dims, dtype=dtype))


def _unravel_index(indices, shape):
    shape = tuple(_valid.check_int(d, "shape", "unravel_index", low=0)
                  for d in _valid.check_sequence(shape, "shape", "unravel_index"))
    idx = _api.as_var(indices)
    if idx.value is not None:
        flat = _np.asarray(idx.value)
        total = math.prod(shape)
        if flat.size and (flat.min() < 0 or flat.max() >= total):
            raise ArgumentError(f"unravel_index: an index is outside an array of shape {shape} "
                                f"(0 to {total - 1}); got {flat.min()} to {flat.max()}")
    return list(_shp.unravel_index(idx, shape))


def _bincount(x, weights=None, minlength=0, length=None):
    return _st.bincount(x, weights, _valid.check_int(minlength, "minlength", "bincount", low=0),
                        0 if length is None else _valid.check_int(length, "length", "bincount", low=0))


_bincount_lifted = _lifted(_bincount, "bincount", "")


def _histogram(a, bins=10, range=None, weights=None, density=False):
    if isinstance(bins, (numbers.Integral, _np.integer)) and not isinstance(bins, bool):
        bins = _valid.check_int(bins, "bins", "histogram", low=1, high=_valid.MAX_ELEMENTS)
    else:
        edges = _as_array("histogram", bins) if not isinstance(bins, Var) else None
        if edges is not None and (edges.ndim != 1 or edges.size < 2 or edges.dtype.kind == "c"):
            raise ArgumentError(f"histogram: bins must be a number of bins or 1-D increasing edges "
                                f"(at least two), got {_valid.describe(bins)}")
        if isinstance(bins, Var) and bins.ndim != 1:
            raise ArgumentError(f"histogram: bin edges must be 1-D, got {_valid.describe(bins)}")
    if range is not None:
        pair = _valid.check_sequence(range, "range", "histogram")
        if len(pair) != 2:
            raise ArgumentError(f"histogram: range must be a (lower, upper) pair, got {_valid.describe(range)}")
        lo, hi = (_valid.check_real(v, n, "histogram") for v, n in zip(pair, ("range[0]", "range[1]")))
        if lo > hi:
            raise ArgumentError(f"histogram: range {range!r} has its lower end above the upper one")
        range = (lo, hi)
    return list(_st.histogram(a, bins, range, weights, _valid.check_bool(density, "density", "histogram")))


def _searchsorted(a, v, side="left", sorter=None):
    return _st.searchsorted(a, v, _valid.check_choice(side, ("left", "right"), "side", "searchsorted"),
                            sorter)


def _cumulative_sum(x, axis=None, dtype=None, include_initial=False):
    return _st.cumulative_sum(x, axis, None if dtype is None else _valid.check_dtype(dtype, "cumulative_sum"),
                              _valid.check_bool(include_initial, "include_initial", "cumulative_sum"))


# -- data-dependent lengths ---------------------------------------------------------------------

def _as_array(op, x):
    """``x`` (not a Tensor) as a NumPy array of numbers, refused with the op's name otherwise."""
    try:
        arr = _np.asarray(x)
    except (TypeError, ValueError, OverflowError) as err:
        raise ArgumentError(f"{op}: cannot read {type(x).__name__} as an array ({err}); pass "
                            "numbers, nested lists of equal length or an array") from None
    if arr.dtype.kind not in "biufc":
        raise ArgumentError(f"{op}: needs numbers, got an array of {arr.dtype}")
    return arr


def _value_for_length(op, x, keyword, meaning):
    """``x``'s value, to count a result's length from; refused inside a trace, where the
    length must be given as ``keyword``."""
    if isinstance(x, Tensor) and is_traced(x.ir_var):
        site = user_site_text()
        where = f" at {site}" if site else ""
        raise TracingError(
            f"{op} of a traced value{where}: its length depends on the data, which a traced "
            f"program does not have; pass {keyword}= ({meaning}), as in "
            f"vnp.{op}(x, {keyword}=10)")
    return x.numpy() if isinstance(x, Tensor) else _as_array(op, x)


def _bincount_tensors(x, weights=None, minlength=0, *, length=None):
    if length is None:
        value = _value_for_length("bincount", x, "length", "the number of bins")
        if value.size and value.dtype.kind in "iu" and value.min() < 0:
            raise ArgumentError(f"bincount: values must be >= 0, got {value.min()}")
        length = int(value.max()) + 1 if value.size and value.dtype.kind in "iu" else 0
    return _bincount_lifted(x, weights, minlength, length)


def _counted(op, count_of, fn, many=False):
    """``fn(x, size, ...)`` as NumPy's ``op``: ``size`` given, one traceable program; without
    it, ``x`` must have a value, and ``count_of(value)`` gives the size."""
    def call(x, *rest, size=None, fill_value=None, **kw):
        check_flags_and_choices(op, kw)
        if size is None:
            size = int(count_of(_value_for_length(op, x, "size", "the number of results to keep, "
                                                  "padded with fill_value"), *rest, **kw))
        kwargs = dict(kw)
        if fill_value is not None:
            kwargs["fill_value"] = fill_value
        outs, many = [], []

        def first(x_, *a, **k):
            got = fn(x_, *a, size=size, **k)
            if isinstance(got, (tuple, list)):
                many.append(True)
                outs.extend(got)
                return outs[0]
            return got
        head = apply_api(first, x, *rest, **kwargs)
        if not many:
            return head
        grad = is_grad_enabled() and needs_grad((x,))
        return tuple([head] + [Tensor(v, grad and v.dtype.kind == "f") for v in outs[1:]])
    return call


def _nonzero_fn(x, size, fill_value=0):
    x = _api.as_var(x)
    if isinstance(fill_value, tuple) and len(fill_value) != x.ndim:
        raise ArgumentError(f"nonzero: fill_value has {len(fill_value)} entries for an array of "
                            f"{x.ndim} dimensions; give one number, or one per dimension")
    return list(_sel.nonzero(x, size, fill_value))


def _unique_fn(x, size, fill_value=None, return_counts=False):
    out = _sel.unique(x, size, fill_value, return_counts)
    return list(out) if return_counts else out


def _count_unique(v, return_counts=False):
    return len(_np.unique(v))


def _count_nonzero(v, *a, **k):
    return int(_np.count_nonzero(v))


def _unique_values_fn(x, size, fill_value=None):
    return _sel.unique(x, size, fill_value, False, equal_nan=False)


def _unique_counts_fn(x, size, fill_value=None):
    return list(_sel.unique(x, size, fill_value, True, equal_nan=False))


def _count_unique_nan_distinct(v):
    return len(_np.unique_values(v)) if hasattr(_np, "unique_values") else len(_np.unique(v, equal_nan=False))


UniqueCountsResult = collections.namedtuple("UniqueCountsResult", ["values", "counts"])
UniqueInverseResult = collections.namedtuple("UniqueInverseResult", ["values", "inverse_indices"])
UniqueAllResult = collections.namedtuple("UniqueAllResult",
                                         ["values", "indices", "inverse_indices", "counts"])


def _unique_all_parts(op, x):
    """(values, first indices, inverse indices, counts) of a tensor whose value is known: the
    values are taken from ``x`` (so they carry its gradient), the rest are constants."""
    t = x if isinstance(x, Tensor) else Tensor(_api.as_var(x))
    value = _value_for_length(op, t, "size", "not available for this function: compute it "
                              "outside the trace")
    flat = value.reshape(-1)
    vals, first, inverse, counts = _np.unique(flat, return_index=True, return_inverse=True,
                                              return_counts=True, equal_nan=False)
    picked = apply_api(lambda v, i: _api.take(_api.reshape(v, (-1,)), i, 0), t,
                       first.astype(_np.int64))
    inverse = inverse.reshape(value.shape).astype(_np.int64)
    return picked, Tensor(_api.constant(first.astype(_np.int64))), \
        Tensor(_api.constant(inverse)), Tensor(_api.constant(counts.astype(_np.int64)))


def _unique_inverse(x, /):
    """The sorted distinct values and, for each element, the index of its value among them
    (the data must be at hand: not inside a trace)."""
    values, _, inverse, _ = _unique_all_parts("unique_inverse", x)
    return UniqueInverseResult(values, inverse)


def _unique_all(x, /):
    """The sorted distinct values, the index of each one's first occurrence, each element's
    index among the values, and the counts (not inside a trace)."""
    return UniqueAllResult(*_unique_all_parts("unique_all", x))


_unique_values = _counted("unique_values", lambda v: _count_unique_nan_distinct(v), _unique_values_fn)
_unique_counts_tuple = _counted("unique_counts", lambda v: _count_unique_nan_distinct(v),
                                _unique_counts_fn)


def _unique_counts(x, /, *, size=None, fill_value=None):
    return UniqueCountsResult(*_unique_counts_tuple(x, size=size, fill_value=fill_value))


_nonzero = _counted("nonzero", _count_nonzero, _nonzero_fn)
_flatnonzero = _counted("flatnonzero", _count_nonzero, _sel.flatnonzero)
_argwhere = _counted("argwhere", _count_nonzero, _sel.argwhere)
_unique = _counted("unique", _count_unique, _unique_fn)


def _signature(params):
    return inspect.Signature([inspect.Parameter(n, k, default=d) for n, k, d in params])


_P, _KW = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
_EMPTY = inspect.Parameter.empty

#: functions whose length depends on the data (name, function, signature, summary, example)
COUNTED = [
    ("nonzero", _nonzero, _signature([("a", _P, _EMPTY), ("size", _KW, None), ("fill_value", _KW, None)]),
     "A tuple of index arrays, one per axis, of the nonzero elements; inside a trace give ``size=`` (the first ``size``, padded with ``fill_value``).", "vnp.nonzero([0, 3, 0, 4])"),
    ("flatnonzero", _flatnonzero, _signature([("a", _P, _EMPTY), ("size", _KW, None), ("fill_value", _KW, None)]),
     "Flat indices of the nonzero elements (``size=`` inside a trace).", "vnp.flatnonzero([[0, 3], [4, 0]])"),
    ("argwhere", _argwhere, _signature([("a", _P, _EMPTY), ("size", _KW, None), ("fill_value", _KW, None)]),
     "The indices of the nonzero elements, one row each (``size=`` inside a trace).", "vnp.argwhere([[0, 3], [4, 0]])"),
    ("unique", _unique, _signature([("ar", _P, _EMPTY), ("return_counts", _KW, False), ("size", _KW, None), ("fill_value", _KW, None)]),
     "The sorted distinct values (with their counts when asked); inside a trace give ``size=`` (padded with ``fill_value``, default the smallest value).", "vnp.unique([3, 1, 3, 2])"),
    ("unique_values", _unique_values, _signature([("x", _P, _EMPTY), ("size", _KW, None), ("fill_value", _KW, None)]),
     "The sorted distinct values, each NaN distinct (the array API's); ``size=`` inside a trace.", "vnp.unique_values([3, 1, 3])"),
    ("unique_counts", _unique_counts, _signature([("x", _P, _EMPTY), ("size", _KW, None), ("fill_value", _KW, None)]),
     "(values, counts) of the distinct values (the array API's); ``size=`` inside a trace.", "vnp.unique_counts([3, 1, 3]).counts"),
    ("unique_inverse", _unique_inverse, _signature([("x", _P, _EMPTY)]),
     "(values, inverse_indices): the distinct values and each element's index among them (outside traces).", "vnp.unique_inverse([3, 1, 3]).inverse_indices"),
    ("unique_all", _unique_all, _signature([("x", _P, _EMPTY)]),
     "(values, indices, inverse_indices, counts) of the distinct values (outside traces).", "vnp.unique_all([3, 1, 3]).indices"),
]

#: functions returning one Tensor (name, function on Vars, summary, example)
ONE = [
    ("signbit", _fm.signbit, "Whether the sign bit is set (True for -0.0).", "vnp.signbit([-1.0, -0.0, 2.0])"),
    ("copysign", _fm.copysign, "The magnitude of x with the sign of y.", "vnp.copysign([1.0, 2.0], [-1.0, 0.0])"),
    ("cbrt", _fm.cbrt, "The real cube root.", "vnp.cbrt([27.0, -8.0])"),
    ("sinc", _fm.sinc, "sin(pi x) / (pi x), 1 at 0.", "vnp.sinc([0.0, 0.5])"),
    ("fabs", _fm.fabs, "``|x|`` as a float.", "vnp.fabs([-1, 2])"),
    ("heaviside", _fm.heaviside, "0 below zero, ``x2`` at zero, 1 above.", "vnp.heaviside([-1.0, 0.0, 2.0], 0.5)"),
    ("fmax", _fm.fmax, "The larger element, ignoring NaN.", "vnp.fmax([1.0, vnp.nan], [vnp.nan, 2.0])"),
    ("fmin", _fm.fmin, "The smaller element, ignoring NaN.", "vnp.fmin([1.0, vnp.nan], [vnp.nan, 2.0])"),
    ("float_power", _fm.float_power, "x ** y computed in float64.", "vnp.float_power([2, 3], 2)"),
    ("logaddexp2", _fm.logaddexp2, "log2(2**x + 2**y) without overflow.", "vnp.logaddexp2([0.0, 1.0], [0.0, 1.0])"),
    ("positive", _fm.positive, "+x.", "vnp.positive([-1.0, 2.0])"),
    ("isclose", _fm.isclose, "Whether ``|a - b| <= atol + rtol |b|``, elementwise (bool).", "vnp.isclose([1.0, 1.1], [1.0 + 1e-9, 1.0])"),
    ("allclose", _allclose, "Whether ``isclose`` holds everywhere (a bool tensor).", "vnp.allclose([1.0, 2.0], [1.0, 2.0 + 1e-9])"),
    ("array_equal", _array_equal, "Whether the shapes and all elements are equal (a bool tensor).", "vnp.array_equal([1, 2], [1, 2])"),
    ("real", _real, "The real part (the array itself for real dtypes).", "vnp.real([1.0, 2.0])"),
    ("imag", _imag, "The imaginary part (zeros for real dtypes).", "vnp.imag([1.0, 2.0])"),
    ("conj", _conj, "The complex conjugate (the array itself for real dtypes).", "vnp.conj([1.0, 2.0])"),
    ("conjugate", _conj, "``conj``.", "vnp.conjugate([1.0])"),
    ("argmax", _argmax, "Index of the first maximum (flat when ``axis`` is None), the axis kept with ``keepdims``.", "vnp.argmax([[1.0, 5.0], [3.0, 2.0]], axis=1, keepdims=True)"),
    ("argmin", _argmin, "Index of the first minimum (flat when ``axis`` is None), the axis kept with ``keepdims``.", "vnp.argmin([1.0, 5.0, 0.5])"),
    ("median", _median, "The median over ``axis`` (NaN if any element is NaN).", "vnp.median([[1.0, 3.0, 2.0], [4.0, 6.0, 5.0]], axis=1)"),
    ("quantile", _quantile, "The ``q``-quantiles (q in [0, 1], a number or constant array) over ``axis``; ``method`` linear, lower, higher, nearest or midpoint.", "vnp.quantile([1.0, 2.0, 3.0, 4.0], [0.25, 0.5])"),
    ("percentile", _percentile, "``quantile`` with q in percent.", "vnp.percentile([1.0, 2.0, 3.0, 4.0], 50)"),
    ("average", _st.average, "The mean over ``axis``, weighted by ``weights`` if given.", "vnp.average([1.0, 2.0, 3.0], weights=[3.0, 1.0, 0.0])"),
    ("cov", _cov, "The covariance matrix of the rows (columns with ``rowvar=False``).", "vnp.cov([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])"),
    ("corrcoef", _st.corrcoef, "Pearson correlation coefficients of the rows.", "vnp.corrcoef([[0.0, 1.0, 2.0], [2.0, 1.0, 0.5]])"),
    ("nansum", _st.nansum, "Sum ignoring NaN.", "vnp.nansum([1.0, vnp.nan, 2.0])"),
    ("nanprod", _st.nanprod, "Product ignoring NaN.", "vnp.nanprod([2.0, vnp.nan, 3.0])"),
    ("nanmean", _st.nanmean, "Mean of the non-NaN elements.", "vnp.nanmean([1.0, vnp.nan, 2.0])"),
    ("nanvar", _nanvar, "Variance of the non-NaN elements.", "vnp.nanvar([1.0, vnp.nan, 3.0])"),
    ("nanstd", _nanstd, "Standard deviation of the non-NaN elements.", "vnp.nanstd([1.0, vnp.nan, 3.0])"),
    ("nanmax", _st.nanmax, "Maximum ignoring NaN (NaN where all are).", "vnp.nanmax([1.0, vnp.nan, 2.0])"),
    ("nanmin", _st.nanmin, "Minimum ignoring NaN (NaN where all are).", "vnp.nanmin([1.0, vnp.nan, 2.0])"),
    ("nanargmax", _st.nanargmax, "Index of the maximum ignoring NaN.", "vnp.nanargmax([1.0, vnp.nan, 2.0])"),
    ("nanargmin", _st.nanargmin, "Index of the minimum ignoring NaN.", "vnp.nanargmin([1.0, vnp.nan, 2.0])"),
    ("nancumsum", _st.nancumsum, "Running sum, NaN counted as 0.", "vnp.nancumsum([1.0, vnp.nan, 2.0])"),
    ("nancumprod", _st.nancumprod, "Running product, NaN counted as 1.", "vnp.nancumprod([2.0, vnp.nan, 3.0])"),
    ("nanmedian", _nanmedian, "Median of the non-NaN elements.", "vnp.nanmedian([1.0, vnp.nan, 3.0, 2.0])"),
    ("nanquantile", _nanquantile, "``quantile`` of the non-NaN elements.", "vnp.nanquantile([1.0, vnp.nan, 3.0], 0.5)"),
    ("nanpercentile", _nanpercentile, "``percentile`` of the non-NaN elements.", "vnp.nanpercentile([1.0, vnp.nan, 3.0], 50)"),
    ("cumulative_sum", _cumulative_sum, "Running sum along ``axis`` (needed above 1-D), with a leading 0 when ``include_initial``.", "vnp.cumulative_sum([1, 2, 3], include_initial=True)"),
    ("trapezoid", _shp.trapezoid, "The integral by the trapezoidal rule (samples at ``x``, or spacing ``dx``).", "vnp.trapezoid([1.0, 2.0, 3.0], dx=0.5)"),
    ("concatenate", _concatenate, "Joined along an existing ``axis`` (flattened first when ``axis`` is None).", "vnp.concatenate([[1, 2], [3]])"),
    ("pad", _pad, "Padded with ``mode`` constant, edge, reflect, symmetric or wrap.", "vnp.pad([1, 2, 3], (2, 1), mode='reflect')"),
    ("diff", _diff, "The n-th difference along ``axis``.", "vnp.diff([1.0, 4.0, 9.0, 16.0])"),
    ("kron", _shp.kron, "The Kronecker product.", "vnp.kron([1, 10], [1, 2])"),
    ("cross", _shp.cross, "The cross product of 3-vectors (z-component for 2-vectors).", "vnp.cross([1.0, 0.0, 0.0], [0.0, 1.0, 0.0])"),
    ("convolve", _shp.convolve, "The discrete convolution of two 1-D arrays (``mode`` full, same, valid).", "vnp.convolve([1.0, 2.0, 3.0], [0.0, 1.0, 0.5])"),
    ("correlate", _shp.correlate, "The cross-correlation of two 1-D arrays (``mode`` valid by default).", "vnp.correlate([1.0, 2.0, 3.0], [0.0, 1.0, 0.5])"),
    ("polyval", _shp.polyval, "The polynomial with coefficients ``p`` (highest power first) at ``x``.", "vnp.polyval([1.0, 0.0, -1.0], [2.0, 3.0])"),
    ("interp", _st.interp, "Piecewise-linear interpolation of (xp, fp) at ``x``.", "vnp.interp([0.5, 2.5], [0.0, 1.0, 2.0], [0.0, 10.0, 20.0])"),
    ("searchsorted", _searchsorted, "Where each of ``v`` goes in the sorted 1-D ``a`` (``side`` left or right).", "vnp.searchsorted([1.0, 2.0, 3.0], [2.0, 2.5])"),
    ("digitize", _st.digitize, "The bin of each x (``bins`` increasing or decreasing).", "vnp.digitize([0.5, 1.5, 3.0], [0.0, 1.0, 2.0])"),
    ("select", _shp.select, "The choice of the first condition that holds, elementwise.", "vnp.select([vnp.array([True, False]), vnp.array([True, True])], [[1, 2], [3, 4]])"),
    ("rot90", _rot90, "Rotated by 90 degrees ``k`` times in the plane of ``axes``.", "vnp.rot90([[1, 2], [3, 4]])"),
    ("column_stack", _shp.column_stack, "1-D arrays as columns, joined.", "vnp.column_stack([[1, 2], [3, 4]])"),
    ("dstack", _shp.dstack, "Joined along a third axis.", "vnp.dstack([[1, 2], [3, 4]]).shape"),
    ("tri", _tri, "Ones at and below the k-th diagonal.", "vnp.tri(2)"),
    ("indices", _indices, "The grid of indices of ``dimensions``.", "vnp.indices((2, 2))[0]"),
    ("logspace", _logspace, "``base ** linspace(start, stop, num)``.", "vnp.logspace(0.0, 2.0, 3)"),
    ("copy", _copy, "The array (Tensors are immutable, so this is the same values).", "vnp.copy([1, 2])"),
    ("empty", _empty, "Zeros of ``shape`` (a Tensor is never uninitialised).", "vnp.empty((2,))"),
    ("empty_like", _empty_like, "Zeros of ``prototype``'s shape and dtype.", "vnp.empty_like([1.0, 2.0])"),
]

#: functions on Tensors already (name, function, summary, example)
ON_TENSORS = [
    ("bincount", _bincount_tensors, "How often each of 0 .. length-1 occurs (or the sum of ``weights``); ``length=`` fixes the length inside a trace.", "vnp.bincount([0, 1, 1, 3])"),
    ("atleast_1d", _atleast(1), "At least 1-D (a list for several arrays).", "vnp.atleast_1d(1.0)"),
    ("atleast_2d", _atleast(2), "At least 2-D, new axes in front.", "vnp.atleast_2d([1.0, 2.0])"),
    ("atleast_3d", _atleast(3), "At least 3-D, as NumPy places the new axes.", "vnp.atleast_3d([1.0, 2.0]).shape"),
]

#: functions returning a list of Tensors
MANY = [
    ("hsplit", _split_along("hsplit", 1), "``split`` along axis 1 (axis 0 for 1-D).", "vnp.hsplit([[1, 2], [3, 4]], 2)"),
    ("vsplit", _split_along("vsplit", 0), "``split`` along axis 0.", "vnp.vsplit([[1, 2], [3, 4]], 2)"),
    ("dsplit", _split_along("dsplit", 2), "``split`` along axis 2.", "len(vnp.dsplit(vnp.zeros((1, 1, 4)), 2))"),
]

#: functions returning a tuple of Tensors
TUPLES = [
    ("triu_indices", _triu_indices, "The indices of the upper triangle (from the k-th diagonal).", "vnp.triu_indices(2)"),
    ("tril_indices", _tril_indices, "The indices of the lower triangle (to the k-th diagonal).", "vnp.tril_indices(2)"),
    ("unravel_index", _unravel_index, "Flat indices as coordinates in ``shape``.", "vnp.unravel_index([5, 1], (2, 3))"),
    ("histogram", _histogram, "(counts, edges) of ``bins`` equal bins over ``range`` (default the data's), or the given edges.", "vnp.histogram([1.0, 2.0, 2.5, 4.0], bins=3)"),
]

#: what each example prints (made by running it; the docstring tests run them again)
OUTPUTS = {
    'unique_values': 'tensor([1, 3], dtype=int64)',
    'unique_counts': 'tensor([1, 2], dtype=int64)',
    'unique_inverse': 'tensor([1, 0, 1], dtype=int64)',
    'unique_all': 'tensor([1, 0], dtype=int64)',
    'bincount': 'tensor([1, 2, 0, 1], dtype=int64)',
    'signbit': 'tensor([ True,  True, False], dtype=bool)',
    'copysign': 'tensor([-1.,  2.], dtype=float64)',
    'cbrt': 'tensor([ 3., -2.], dtype=float64)',
    'sinc': 'tensor([1.        , 0.63661977], dtype=float64)',
    'fabs': 'tensor([1., 2.], dtype=float64)',
    'heaviside': 'tensor([0. , 0.5, 1. ], dtype=float64)',
    'fmax': 'tensor([1., 2.], dtype=float64)',
    'fmin': 'tensor([1., 2.], dtype=float64)',
    'float_power': 'tensor([4., 9.], dtype=float64)',
    'logaddexp2': 'tensor([1., 2.], dtype=float64)',
    'positive': 'tensor([-1.,  2.], dtype=float64)',
    'isclose': 'tensor([ True, False], dtype=bool)',
    'allclose': 'tensor(True, dtype=bool)',
    'array_equal': 'tensor(True, dtype=bool)',
    'real': 'tensor([1., 2.], dtype=float64)',
    'imag': 'tensor([0., 0.], dtype=float64)',
    'conj': 'tensor([1., 2.], dtype=float64)',
    'conjugate': 'tensor([1.], dtype=float64)',
    'argmax': 'tensor([[1],\n        [0]], dtype=int64)',
    'argmin': 'tensor(2, dtype=int64)',
    'median': 'tensor([2., 5.], dtype=float64)',
    'quantile': 'tensor([1.75, 2.5 ], dtype=float64)',
    'percentile': 'tensor(2.5, dtype=float64)',
    'average': 'tensor(1.25, dtype=float64)',
    'cov': 'tensor([[ 1., -1.],\n        [-1.,  1.]], dtype=float64)',
    'corrcoef': 'tensor([[ 1.        , -0.98198051],\n        [-0.98198051,  1.        ]], dtype=float64)',
    'nansum': 'tensor(3., dtype=float64)',
    'nanprod': 'tensor(6., dtype=float64)',
    'nanmean': 'tensor(1.5, dtype=float64)',
    'nanvar': 'tensor(1., dtype=float64)',
    'nanstd': 'tensor(1., dtype=float64)',
    'nanmax': 'tensor(2., dtype=float64)',
    'nanmin': 'tensor(1., dtype=float64)',
    'nanargmax': 'tensor(2, dtype=int64)',
    'nanargmin': 'tensor(0, dtype=int64)',
    'nancumsum': 'tensor([1., 1., 3.], dtype=float64)',
    'nancumprod': 'tensor([2., 2., 6.], dtype=float64)',
    'nanmedian': 'tensor(2., dtype=float64)',
    'nanquantile': 'tensor(2., dtype=float64)',
    'nanpercentile': 'tensor(2., dtype=float64)',
    'cumulative_sum': 'tensor([0, 1, 3, 6], dtype=int64)',
    'trapezoid': 'tensor(2., dtype=float64)',
    'concatenate': 'tensor([1, 2, 3], dtype=int64)',
    'pad': 'tensor([3, 2, 1, 2, 3, 2], dtype=int64)',
    'diff': 'tensor([3., 5., 7.], dtype=float64)',
    'kron': 'tensor([ 1,  2, 10, 20], dtype=int64)',
    'cross': 'tensor([0., 0., 1.], dtype=float64)',
    'convolve': 'tensor([0. , 1. , 2.5, 4. , 1.5], dtype=float64)',
    'correlate': 'tensor([3.5], dtype=float64)',
    'polyval': 'tensor([3., 8.], dtype=float64)',
    'interp': 'tensor([ 5., 20.], dtype=float64)',
    'searchsorted': 'tensor([1, 2], dtype=int64)',
    'digitize': 'tensor([1, 2, 3], dtype=int64)',
    'select': 'tensor([1, 4], dtype=int64)',
    'rot90': 'tensor([[2, 4],\n        [1, 3]], dtype=int64)',
    'column_stack': 'tensor([[1, 3],\n        [2, 4]], dtype=int64)',
    'dstack': '(1, 2, 2)',
    'tri': 'tensor([[1., 0.],\n        [1., 1.]], dtype=float64)',
    'indices': 'tensor([[0, 0],\n        [1, 1]], dtype=int64)',
    'logspace': 'tensor([  1.,  10., 100.], dtype=float64)',
    'copy': 'tensor([1, 2], dtype=int64)',
    'empty': 'tensor([0., 0.], dtype=float64)',
    'empty_like': 'tensor([0., 0.], dtype=float64)',
    'hsplit': '[tensor([[1],\n        [3]], dtype=int64), tensor([[2],\n        [4]], dtype=int64)]',
    'vsplit': '[tensor([[1, 2]], dtype=int64), tensor([[3, 4]], dtype=int64)]',
    'dsplit': '2',
    'triu_indices': '(tensor([0, 0, 1], dtype=int64), tensor([0, 1, 1], dtype=int64))',
    'tril_indices': '(tensor([0, 1, 1], dtype=int64), tensor([0, 0, 1], dtype=int64))',
    'unravel_index': '(tensor([1, 0], dtype=int64), tensor([2, 1], dtype=int64))',
    'histogram': '(tensor([1, 2, 1], dtype=int64), tensor([1., 2., 3., 4.], dtype=float64))',
    'atleast_1d': 'tensor([1.], dtype=float64)',
    'atleast_2d': 'tensor([[1., 2.]], dtype=float64)',
    'atleast_3d': '(1, 2, 1)',
    'nonzero': '(tensor([1, 3], dtype=int64),)',
    'flatnonzero': 'tensor([1, 2], dtype=int64)',
    'argwhere': 'tensor([[0, 1],\n        [1, 0]], dtype=int64)',
    'unique': 'tensor([1, 2, 3], dtype=int64)',
}
