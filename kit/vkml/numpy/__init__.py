"""``import vkml.numpy as vnp``: NumPy's names, on lazy differentiable Tensors.

Every function takes Tensors, NumPy arrays, lists/tuples and Python numbers
where NumPy takes arrays, returns Tensors, and is differentiable (``grad``,
``jvp``, ``vmap``, ``backward``) wherever it has a derivative.  The math
lives in ``vkml.ops.numeric``; this module only names it as NumPy does.

Semantics follow NumPy 2:

- broadcasting as NumPy's; ``axis`` may be an int, a tuple or None,
  negative counting from the end; ``keepdims`` where NumPy has it.
- dtypes: bool, int8/16/32/64, uint8/16/32/64, float32/64 and
  complex64/128, promoted by NumPy 2's rules: Python numbers are weak
  (``float32 * 2.0`` is float32); float16 and longdouble arrays become
  float32 and float64; integer and bool operands of a transcendental
  function compute in float64; ``sum``/``prod``/``cumsum``/``cumprod``
  accumulate bool and narrower integers in 64 bits (uint64 for unsigned).
  New arrays (``array``, ``zeros``, ``eye``, ...) are float64 by default.
- complex numbers differentiate with JAX's convention: the gradient of a
  real-valued function of complex ``z`` is ``df/dx - i df/dy`` (for
  ``|z|**2``, ``2 conj(z)``; PyTorch returns its conjugate).  Programs with
  complex values run on NumPy (the compiled tiers have no complex type).
- the Python array API standard (2023.12): ``x.__array_namespace__()`` of
  a Tensor is this module, with the standard's names (``acos``, ``concat``,
  ``permute_dims``, ``unique_values``, ...), keywords (``correction=``,
  ``descending=``), ``isdtype``/``result_type``/``can_cast``/``finfo``/
  ``iinfo``, ``__array_namespace_info__()`` and DLPack (``from_dlpack``,
  ``Tensor.__dlpack__``).
- functions whose result length depends on the data (``nonzero``,
  ``unique``, ``argwhere``, ``flatnonzero``, ``bincount``) take a static
  ``size=`` (``length=`` for ``bincount``) inside a trace, as JAX's do: the
  first ``size`` results, padded with ``fill_value``.

Deliberately not NumPy's:

- ``sort``/``argsort`` are always stable (NumPy's default quicksort may
  order equal elements differently); NaN sorts last, as in NumPy.
- ``linalg.solve``/``inv``/``cholesky`` of a singular (or not positive
  definite) matrix give NaN instead of raising ``LinAlgError``: the failure
  is data, known only when the program runs, on every backend alike.
- ``prod``/``cumprod`` multiply in another order than NumPy (a few ulps);
  ``log2``/``log10`` are within 1 ulp (not always exact at powers of 2/10);
  ``hypot`` is sqrt(x*x + y*y), which overflows beyond 1e154 where NumPy's
  does not; ``sinh``/``cosh`` overflow from ``|x| > 709.78`` (NumPy's at 710.48).
- ``einsum`` has no ``...``; ``where`` needs three arguments; ``pad`` has
  the modes constant, edge, reflect, symmetric and wrap; ``linalg.svd`` and
  ``qr`` of a non-square matrix give the reduced factors only
  (``full_matrices=False``, ``mode="reduced"``); functions take no
  ``out=``/``where=`` arguments; ``empty`` gives zeros.
- ``array``/``asarray`` of a Tensor return it (Tensors are immutable, so a
  copy would only cut the gradient); a list holding Tensors is stacked.
"""

from __future__ import annotations

import builtins
import inspect
import math

import numbers

import numpy as _np

from ..errors import ArgumentError
from ..ir import Var
from ..ops import api as _api
from ..ops import numeric as _num
from ..ops import special as _special
from ..tensor import Tensor
from .. import validate as _valid    # (a module: its names are not vkml.numpy's)
from . import fft, linalg  # noqa: F401  (vkml.numpy.fft, vkml.numpy.linalg)
from . import _array_api, _more
from ._lift import doc as _doc, lifted as _lifted, lifted_many as _lifted_many, named as _named

(bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, complex64,
 complex128) = (_np.dtype(t) for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                        "uint32", "uint64", "float32", "float64", "complex64",
                                        "complex128"))
bool = bool_            # the array API's name (Python's bool stays builtins.bool in this module)
pi, e, inf, nan, newaxis = math.pi, math.e, math.inf, math.nan, None

# -- making arrays (on IR Vars; lifted below) ---------------------------------------------------

def _holds_var(obj):
    return isinstance(obj, Var) or isinstance(obj, (list, tuple)) and builtins.any(_holds_var(o) for o in obj)


def _array(obj, dtype=None, *, device=None, copy=None):
    _check_device(device, "asarray")
    if isinstance(obj, Var):
        return obj if dtype is None else _api.cast(obj, dtype)
    if isinstance(obj, (list, tuple)) and _holds_var(obj):
        out = _api.stack([_array(o) for o in obj])
        return out if dtype is None else _api.cast(out, dtype)
    if obj is None or isinstance(obj, (str, bytes, dict, set)):
        raise ArgumentError(f"array: cannot make an array from {type(obj).__name__}; pass numbers, "
                            "(nested) lists of numbers, a NumPy array or a Tensor")
    try:
        return _api.constant(obj, dtype)
    except (TypeError, ValueError) as err:
        if isinstance(err, ArgumentError):
            raise
        raise ArgumentError(f"array: cannot make an array from {type(obj).__name__} ({err}); pass "
                            "numbers or nested lists of equal length") from None


def _check_device(device, op):
    """The array API's ``device=``: None or the device tensors are made on now."""
    if device is not None and (not isinstance(device, str) or device != _api.default_device()):
        raise ArgumentError(f"{op}: device {device!r} is not where vkml makes tensors now "
                            f"({_api.default_device()!r}); pass device=None (choose the backend "
                            "with vkml.set_backend)")


def _dtype_or(dtype, default, op):
    """``dtype`` checked, or ``default`` when it is None (as NumPy reads a missing dtype)."""
    return default if dtype is None else _valid.check_dtype(dtype, op)


def _filled(op, shape, fill_value, dtype):
    shape = _valid.check_shape(shape, op)
    if isinstance(fill_value, Var):
        v = fill_value if dtype is None else _api.cast(fill_value, dtype)
        return _api.broadcast_to(v, shape)
    return _api.full(shape, fill_value, dtype)


def _full(shape, fill_value, dtype=None, *, device=None):
    _check_device(device, "full")
    return _filled("full", shape, fill_value, _dtype_or(dtype, None, "full"))


def _zeros(shape, dtype=float64, *, device=None):
    _check_device(device, "zeros")
    return _filled("zeros", shape, 0, _dtype_or(dtype, float64, "zeros"))


def _ones(shape, dtype=float64, *, device=None):
    _check_device(device, "ones")
    return _filled("ones", shape, 1, _dtype_or(dtype, float64, "ones"))


def _like(op, a, fill_value, dtype):
    a = _api.as_var(a)
    return _filled(op, a.shape, fill_value, _dtype_or(dtype, a.dtype, op))


def _full_like(a, fill_value, dtype=None, *, device=None):
    _check_device(device, "full_like")
    return _like("full_like", a, fill_value, dtype)


def _zeros_like(a, dtype=None, *, device=None):
    _check_device(device, "zeros_like")
    return _like("zeros_like", a, 0, dtype)


def _ones_like(a, dtype=None, *, device=None):
    _check_device(device, "ones_like")
    return _like("ones_like", a, 1, dtype)


_INT64 = _np.iinfo(_np.int64)


def _scalar(value, name, op):
    """A real number; an int stays an int (``arange(3)`` is integer) and must fit an int64."""
    real = _valid.check_real(value, name, op)
    if isinstance(value, numbers.Integral):
        return _valid.check_int(value, name, op, int(_INT64.min), int(_INT64.max))
    return real


def _arange(start, stop=None, step=None, dtype=None, *, device=None):
    _check_device(device, "arange")
    if stop is None:
        if start is None:
            raise ArgumentError("arange: give stop (arange(stop) or arange(start, stop))")
        start, stop = 0, start
    lo, hi = _scalar(start, "start", "arange"), _scalar(stop, "stop", "arange")
    by = 1 if step is None else _scalar(step, "step", "arange")
    if by == 0:
        raise ArgumentError("arange: step must not be 0; give a positive or negative step")
    dtype = _dtype_or(dtype, None, "arange")
    if dtype == bool_:
        raise ArgumentError("arange: dtype bool makes no range; use int32, int64 or a float dtype")
    count = (hi - lo) / by
    count = math.ceil(count) if math.isfinite(count) else _valid.MAX_ELEMENTS + 1    # 1e308 - -1e308
    _valid.check_shape(builtins.max(0, count), "arange", "the number of values")
    with _valid.host_memory("arange", "the values"):
        return _api.constant(_np.arange(lo, hi, by, dtype=dtype))


def _real_operand(value, name, op):
    """A real number, or an array (list) of them: what NumPy computes ``linspace`` from."""
    if isinstance(value, numbers.Real) and not isinstance(value, (builtins.bool, _np.bool_)):
        return _valid.check_real(value, name, op, finite=False)
    try:
        out = _np.asarray(value) if not isinstance(value, (Var, str, bytes)) else None
    except (TypeError, ValueError):
        out = None
    if out is None or out.dtype.kind not in "biuf":
        raise ArgumentError(f"{op}: {name} must be a real number or an array of them, got "
                            f"{type(value).__name__}")
    return out


def _linspace(start, stop, num=50, endpoint=True, dtype=None, *, device=None):
    _check_device(device, "linspace")
    start, stop = _real_operand(start, "start", "linspace"), _real_operand(stop, "stop", "linspace")
    num = _valid.check_int(num, "num", "linspace", low=0, high=_valid.MAX_ELEMENTS)
    endpoint = _valid.check_bool(endpoint, "endpoint", "linspace")
    with _valid.host_memory("linspace", f"{num} values"):
        return _num.linspace(start, stop, num, endpoint, _dtype_or(dtype, None, "linspace"))


def _diagonal_offset(k, rows, cols, name, op):
    """A diagonal's offset as an int; one beyond the matrix is clamped just past its corner
    (every such offset selects the same nothing), so a huge one cannot overflow NumPy's C long."""
    k = _valid.check_int(k, name, op)
    return builtins.max(-rows - 1, builtins.min(k, cols + 1))


def _eye(N, M=None, k=0, dtype=float64, *, device=None):
    _check_device(device, "eye")
    n = _valid.check_int(N, "N", "eye", low=0)
    m = n if M is None else _valid.check_int(M, "M", "eye", low=0)
    _valid.check_shape((n, m), "eye")
    k = _diagonal_offset(k, n, m, "k", "eye")
    with _valid.host_memory("eye", f"a {n} x {m} matrix"):
        return _num.eye(n, m, k, dtype=_dtype_or(dtype, float64, "eye"))


def _identity(n, dtype=float64, *, device=None):
    _check_device(device, "identity")
    n = _valid.check_int(n, "n", "identity", low=0)
    _valid.check_shape((n, n), "identity")
    with _valid.host_memory("identity", f"a {n} x {n} matrix"):
        return _num.eye(n, dtype=_dtype_or(dtype, float64, "identity"))


# -- functions whose non-array arguments are checked here before the math sees them ----------------

#: |decimals| at most this: 10.0 ** 308 is the largest power of ten a float64 holds
_MAX_DECIMALS = 308

#: ``split``/``array_split`` make at most this many pieces more than the axis has elements (each
#: piece is a Tensor; a million empty ones is a mistake, not a split)
_MAX_EMPTY_PIECES = 2 ** 16


def _decimals(decimals, op):
    return _valid.check_int(decimals, "decimals", op, -_MAX_DECIMALS, _MAX_DECIMALS)


def _round(x, decimals=0):
    return _num.round(x, _decimals(decimals, "round"))


def _around(x, decimals=0):
    return _num.round(x, _decimals(decimals, "around"))


def _ddof(ddof, correction, op):
    """NumPy's ``ddof`` or the array API's ``correction`` (which wins when given)."""
    if correction is not None:
        return _valid.check_real(correction, "correction", op, low=0)
    return _valid.check_int(ddof, "ddof", op)


def _var(x, axis=None, ddof=0, keepdims=False, *, correction=None):
    return _num.var(x, axis, _ddof(ddof, correction, "var"),
                    _valid.check_bool(keepdims, "keepdims", "var"))


def _std(x, axis=None, ddof=0, keepdims=False, *, correction=None):
    return _num.std(x, axis, _ddof(ddof, correction, "std"),
                    _valid.check_bool(keepdims, "keepdims", "std"))


def _sort(a, axis=-1, kind=None, order=None, *, descending=False, stable=True):
    if order is not None:
        raise ArgumentError("sort: order= sorts structured arrays, which vkml does not have")
    return _array_api.sort(a, axis, _valid.check_bool(descending, "descending", "sort"))


def _argsort(a, axis=-1, kind=None, order=None, *, descending=False, stable=True):
    if order is not None:
        raise ArgumentError("argsort: order= sorts structured arrays, which vkml does not have")
    return _array_api.argsort(a, axis, _valid.check_bool(descending, "descending", "argsort"))


def _prod(x, axis=None, dtype=None, keepdims=False):
    return _num.prod(x, axis, _valid.check_bool(keepdims, "keepdims", "prod"),
                     None if dtype is None else _valid.check_dtype(dtype, "prod"))


def _sum(x, axis=None, dtype=None, keepdims=False):
    return _api.sum(x, axis, keepdims, None if dtype is None else _valid.check_dtype(dtype, "sum"))


def _reshape(a, shape, *, copy=None):
    if copy is False:
        raise ArgumentError("reshape: copy=False cannot be promised (whether a reshape copies is "
                            "the backend's business); pass copy=None")
    return _api.reshape(a, shape)


def _matrix_sides(x):
    """The last two sizes of ``x`` (zeros below 2-D, which the operation itself refuses)."""
    return _sides(x, -2, -1)


def _sides(x, axis1, axis2):
    """The sizes of axes (axis1, axis2) of ``x``; zeros for axes it lacks (refused later)."""
    def size(axis):
        ok = isinstance(axis, numbers.Integral) and -x.ndim <= axis < x.ndim
        return x.shape[axis] if ok else 0
    return size(axis1), size(axis2)


def _diagonal(a, offset=0, axis1=0, axis2=1):
    a = _api.as_var(a)
    offset = _diagonal_offset(offset, *_sides(a, axis1, axis2), "offset", "diagonal")
    return _num.diagonal(a, offset, axis1, axis2)


def _trace(a, offset=0, axis1=0, axis2=1):
    a = _api.as_var(a)
    return _num.trace(a, _diagonal_offset(offset, *_sides(a, axis1, axis2), "offset", "trace"),
                      axis1, axis2)


def _diag(v, k=0):
    v = _api.as_var(v)
    if v.ndim == 2:
        return _num.diag(v, _diagonal_offset(k, *_matrix_sides(v), "k", "diag"))
    k = _valid.check_int(k, "k", "diag")
    if v.ndim == 1:          # the matrix made grows with |k|
        _valid.check_shape((v.shape[0] + builtins.abs(k),) * 2, "diag", "the matrix")
    return _num.diag(v, k)


def _triu(m, k=0):
    m = _api.as_var(m)
    return _num.triu(m, _diagonal_offset(k, *_matrix_sides(m), "k", "triu"))


def _tril(m, k=0):
    m = _api.as_var(m)
    return _num.tril(m, _diagonal_offset(k, *_matrix_sides(m), "k", "tril"))


def _ints(value, name, op, low=None, high=None):
    """An int, or a list of ints (``roll``'s shifts, ``repeat``'s counts, ``split``'s cuts)."""
    if isinstance(value, Var) and value.value is not None and value.dtype.kind in "iu":
        value = _np.asarray(value.value)        # a tensor of known counts: read as a list
    if isinstance(value, (list, tuple)) or isinstance(value, _np.ndarray) and value.ndim:
        return [_valid.check_int(v, f"{name}[{i}]", op, low, high)
                for i, v in enumerate(_valid.check_sequence(value, name, op))]
    return _valid.check_int(value, name, op, low, high)


def _roll(a, shift, axis=None):
    return _num.roll(a, _ints(shift, "shift", "roll"), axis)


def _repeat(a, repeats, axis=None):
    return _num.repeat(a, _ints(repeats, "repeats", "repeat", 0, _valid.MAX_ELEMENTS), axis)


def _tile(A, reps):
    return _num.tile(A, _ints(reps, "reps", "tile", 0, _valid.MAX_ELEMENTS))


def _pieces(op, ary, indices_or_sections, axis):
    """``indices_or_sections`` as cut points (a list) or a number of pieces, bounded."""
    if isinstance(indices_or_sections, (list, tuple)) or \
            isinstance(indices_or_sections, _np.ndarray) and indices_or_sections.ndim:
        return _ints(indices_or_sections, "indices_or_sections", op)
    a = _api.as_var(ary)
    length = a.shape[_api.normalize_axis(op, a.ndim, axis)] if a.ndim else 0
    return _valid.check_int(indices_or_sections, "indices_or_sections (the number of pieces)", op,
                            1, builtins.max(length, _MAX_EMPTY_PIECES))


def _split_(ary, indices_or_sections, axis=0):
    return _num.split(ary, _pieces("split", ary, indices_or_sections, axis), axis)


def _array_split(ary, indices_or_sections, axis=0):
    return _num.array_split(ary, _pieces("array_split", ary, indices_or_sections, axis), axis)


def _hstack(tup):
    return _num.hstack(_valid.check_sequence(tup, "tup", "hstack"))


def _vstack(tup):
    return _num.vstack(_valid.check_sequence(tup, "tup", "vstack"))


def _meshgrid(*xi, indexing="xy"):
    indexing = _valid.check_choice(indexing, ("xy", "ij"), "indexing", "meshgrid")
    return _num.meshgrid(*xi, indexing=indexing)


def _take(a, indices, axis=None):
    if axis is None:
        return _api.take(_api.reshape(a, (-1,)), indices, 0)
    return _api.take(a, indices, axis)


def _transpose(a, axes=None):
    return _api.transpose(a, axes)


def _clip(a, min=None, max=None, *, a_min=None, a_max=None):
    """The array API's ``min``/``max`` (also positional) or NumPy's ``a_min``/``a_max``."""
    return _api.clip(a, a_min if min is None else min, a_max if max is None else max)


def _flip(m, axis=None):
    return _api.flip(m, axis)


def _swapaxes(a, axis1, axis2):
    return _api.swapaxes(a, axis1, axis2)


def _astype(x, dtype, *, copy=True, device=None):
    return _api.cast(x, dtype)


def _floor_divide(x, y):
    return _num.floor_divide(x, y)


# -- the namespace: name, function on Vars, what it does, an example and what it prints ------------

_TABLE = [
    # elementwise, from the existing operations
    ("add", _api.add, "x + y, broadcast.", "vnp.add([1.0, 2.0], 3.0)", "tensor([4., 5.], dtype=float64)"),
    ("subtract", _api.sub, "x - y, broadcast.", "vnp.subtract([1.0, 2.0], [[1.0], [2.0]])", 'tensor([[ 0.,  1.],\n        [-1.,  0.]], dtype=float64)'),
    ("multiply", _api.mul, "x * y, broadcast.", "vnp.multiply([1.0, 2.0], 3.0)", "tensor([3., 6.], dtype=float64)"),
    ("divide", _api.div, "True division x / y (integers divide as floats).", "vnp.divide([1, 2], 4)", "tensor([0.25, 0.5 ], dtype=float64)"),
    ("true_divide", _api.div, "True division x / y (``divide``).", "vnp.true_divide(1.0, [2.0, 4.0])", "tensor([0.5 , 0.25], dtype=float64)"),
    ("floor_divide", _floor_divide, "x // y: rounded toward minus infinity; derivative zero.", "vnp.floor_divide([7.0, -7.0], 2.0)", "tensor([ 3., -4.], dtype=float64)"),
    ("power", _api.pow, "x ** y.", "vnp.power([1.0, 2.0, 3.0], 2.0)", "tensor([1., 4., 9.], dtype=float64)"),
    ("negative", _api.neg, "-x.", "vnp.negative([1.0, -2.0])", "tensor([-1.,  2.], dtype=float64)"),
    ("absolute", _api.abs, "``|x|``; its derivative is sign(x) (0 at 0).", "vnp.absolute([-1.5, 2.0])", "tensor([1.5, 2. ], dtype=float64)"),
    ("abs", _api.abs, "``|x|`` (``absolute``).", "vnp.abs([-1.5, 2.0])", "tensor([1.5, 2. ], dtype=float64)"),
    ("sign", _api.sign, "-1, 0 or 1; derivative zero.", "vnp.sign([-2.0, 0.0, 3.0])", "tensor([-1.,  0.,  1.], dtype=float64)"),
    ("square", _api.square, "x * x.", "vnp.square([1.0, -3.0])", "tensor([1., 9.], dtype=float64)"),
    ("sqrt", _api.sqrt, "Square root.", "vnp.sqrt([4.0, 9.0])", "tensor([2., 3.], dtype=float64)"),
    ("exp", _api.exp, "e ** x.", "vnp.exp([0.0, 1.0])", "tensor([1.        , 2.71828183], dtype=float64)"),
    ("log", _api.log, "Natural logarithm.", "vnp.log([1.0, 2.0])", "tensor([0.        , 0.69314718], dtype=float64)"),
    ("sin", _api.sin, "Sine.", "vnp.sin([0.0, 1.0])", "tensor([0.        , 0.84147098], dtype=float64)"),
    ("cos", _api.cos, "Cosine.", "vnp.cos([0.0, 1.0])", "tensor([1.        , 0.54030231], dtype=float64)"),
    ("tanh", _api.tanh, "Hyperbolic tangent.", "vnp.tanh([0.0, 1.0])", "tensor([0.        , 0.76159416], dtype=float64)"),
    ("maximum", _api.maximum, "Elementwise larger (NaN wins); a tie splits the derivative evenly.", "vnp.maximum([1.0, 5.0], 3.0)", "tensor([3., 5.], dtype=float64)"),
    ("minimum", _api.minimum, "Elementwise smaller (NaN wins); a tie splits the derivative evenly.", "vnp.minimum([1.0, 5.0], 3.0)", "tensor([1., 3.], dtype=float64)"),
    ("equal", _api.equal, "x == y (bool).", "vnp.equal([1, 2], 2)", "tensor([False,  True], dtype=bool)"),
    ("not_equal", _api.not_equal, "x != y (bool).", "vnp.not_equal([1, 2], 2)", "tensor([ True, False], dtype=bool)"),
    ("less", _api.less, "x < y (bool).", "vnp.less([1, 2], 2)", "tensor([ True, False], dtype=bool)"),
    ("less_equal", _api.less_equal, "x <= y (bool).", "vnp.less_equal([1, 2], 2)", "tensor([ True,  True], dtype=bool)"),
    ("greater", _api.greater, "x > y (bool).", "vnp.greater([1, 2], 1)", "tensor([False,  True], dtype=bool)"),
    ("greater_equal", _api.greater_equal, "x >= y (bool).", "vnp.greater_equal([1, 2], 2)", "tensor([False,  True], dtype=bool)"),
    ("logical_and", _api.logical_and, "x and y, elementwise (bool).", "vnp.logical_and([True, False], True)", "tensor([ True, False], dtype=bool)"),
    ("logical_or", _api.logical_or, "x or y, elementwise (bool).", "vnp.logical_or([True, False], False)", "tensor([ True, False], dtype=bool)"),
    ("logical_not", _api.logical_not, "not x, elementwise (bool).", "vnp.logical_not([True, False])", "tensor([False,  True], dtype=bool)"),
    ("where", _api.where, "x where cond holds, else y (three arguments only).", "vnp.where([True, False], [1.0, 2.0], 0.0)", "tensor([1., 0.], dtype=float64)"),
    ("clip", _clip, "x limited to [min, max] (either may be None; NumPy's a_min/a_max too).", "vnp.clip([-1.0, 0.5, 2.0], 0.0, 1.0)", "tensor([0. , 0.5, 1. ], dtype=float64)"),
    # elementwise, new
    ("tan", _num.tan, "Tangent, sin(x) / cos(x).", "vnp.tan([0.0, 1.0])", "tensor([0.        , 1.55740772], dtype=float64)"),
    ("sinh", _num.sinh, "Hyperbolic sine, with expm1 (accurate near 0).", "vnp.sinh([0.0, 1.0])", "tensor([0.        , 1.17520119], dtype=float64)"),
    ("cosh", _num.cosh, "Hyperbolic cosine.", "vnp.cosh([0.0, 1.0])", "tensor([1.        , 1.54308063], dtype=float64)"),
    ("arcsin", _num.arcsin, "Inverse sine, in [-pi/2, pi/2].", "vnp.arcsin([0.0, 0.5])", "tensor([0.        , 0.52359878], dtype=float64)"),
    ("arccos", _num.arccos, "Inverse cosine, in [0, pi].", "vnp.arccos([1.0, 0.5])", "tensor([0.        , 1.04719755], dtype=float64)"),
    ("arctan", _num.arctan, "Inverse tangent.", "vnp.arctan([0.0, 1.0])", "tensor([0.        , 0.78539816], dtype=float64)"),
    ("arctan2", _num.arctan2, "The angle of the point (x, y): arctan2(y, x) in [-pi, pi].", "vnp.arctan2([1.0, -1.0], [1.0, -1.0])", "tensor([ 0.78539816, -2.35619449], dtype=float64)"),
    ("arcsinh", _num.arcsinh, "Inverse hyperbolic sine.", "vnp.arcsinh([0.0, 1.0])", "tensor([0.        , 0.88137359], dtype=float64)"),
    ("arccosh", _num.arccosh, "Inverse hyperbolic cosine (x >= 1).", "vnp.arccosh([1.0, 2.0])", "tensor([0.       , 1.3169579], dtype=float64)"),
    ("arctanh", _num.arctanh, "Inverse hyperbolic tangent (``|x| < 1``).", "vnp.arctanh([0.0, 0.5])", "tensor([0.        , 0.54930614], dtype=float64)"),
    ("log1p", _special.log1p, "log(1 + x), accurate for tiny x.", "vnp.log1p([0.0, 1e-20])", "tensor([0.e+00, 1.e-20], dtype=float64)"),
    ("expm1", _special.expm1, "exp(x) - 1, accurate for tiny x.", "vnp.expm1([0.0, 1e-20])", "tensor([0.e+00, 1.e-20], dtype=float64)"),
    ("log2", _num.log2, "Base-2 logarithm.", "vnp.log2([1.0, 8.0])", "tensor([0., 3.], dtype=float64)"),
    ("log10", _num.log10, "Base-10 logarithm.", "vnp.log10([1.0, 100.0])", "tensor([0., 2.], dtype=float64)"),
    ("exp2", _num.exp2, "2 ** x.", "vnp.exp2([0.0, 3.0])", "tensor([1., 8.], dtype=float64)"),
    ("floor", _num.floor, "Largest whole number <= x; derivative zero.", "vnp.floor([-1.5, 1.5])", "tensor([-2.,  1.], dtype=float64)"),
    ("ceil", _num.ceil, "Smallest whole number >= x; derivative zero.", "vnp.ceil([-1.5, 1.5])", "tensor([-1.,  2.], dtype=float64)"),
    ("trunc", _num.trunc, "x rounded toward zero; derivative zero.", "vnp.trunc([-1.5, 1.5])", "tensor([-1.,  1.], dtype=float64)"),
    ("rint", _num.rint, "x rounded to the nearest whole number, halves to even; derivative zero.", "vnp.rint([0.5, 1.5, 2.5])", "tensor([0., 2., 2.], dtype=float64)"),
    ("round", _round, "Round half to even at ``decimals`` places; derivative zero.", "vnp.round([0.125, 2.5], 1)", "tensor([0.1, 2.5], dtype=float64)"),
    ("around", _around, "``round``.", "vnp.around([0.5, 1.5])", "tensor([0., 2.], dtype=float64)"),
    ("mod", _num.mod, "x % y with the divisor's sign; d/dx = 1, d/dy = -floor(x / y).", "vnp.mod([5.0, -5.0], 3.0)", "tensor([2., 1.], dtype=float64)"),
    ("remainder", _num.mod, "``mod``.", "vnp.remainder([5, -5], 3)", "tensor([2, 1], dtype=int64)"),
    ("fmod", _special.fmod, "The C remainder, with the dividend's sign.", "vnp.fmod([5.0, -5.0], 3.0)", "tensor([ 2., -2.], dtype=float64)"),
    ("logaddexp", _num.logaddexp, "log(exp(x) + exp(y)) without overflow.", "vnp.logaddexp([0.0, 1000.0], [0.0, 1000.0])", "tensor([6.93147181e-01, 1.00069315e+03], dtype=float64)"),
    ("isnan", _num.isnan, "Whether x is NaN (bool).", "vnp.isnan([1.0, vnp.nan])", "tensor([False,  True], dtype=bool)"),
    ("isinf", _num.isinf, "Whether x is +-inf (bool).", "vnp.isinf([1.0, -vnp.inf])", "tensor([False,  True], dtype=bool)"),
    ("isfinite", _num.isfinite, "Whether x is neither NaN nor infinite (bool).", "vnp.isfinite([1.0, vnp.inf, vnp.nan])", "tensor([ True, False, False], dtype=bool)"),
    ("nan_to_num", _num.nan_to_num, "NaN to ``nan``, infinities to ``posinf``/``neginf`` (the dtype's extremes by default).", "vnp.nan_to_num([vnp.nan, vnp.inf, 1.0], posinf=9.0)", "tensor([0., 9., 1.], dtype=float64)"),
    ("reciprocal", _num.reciprocal, "1 / x.", "vnp.reciprocal([2.0, 4.0])", "tensor([0.5 , 0.25], dtype=float64)"),
    ("deg2rad", _num.deg2rad, "Degrees to radians.", "vnp.deg2rad([180.0])", "tensor([3.14159265], dtype=float64)"),
    ("rad2deg", _num.rad2deg, "Radians to degrees.", "vnp.rad2deg([vnp.pi])", "tensor([180.], dtype=float64)"),
    ("hypot", _num.hypot, "sqrt(x**2 + y**2).", "vnp.hypot(3.0, [4.0])", "tensor([5.], dtype=float64)"),
    # reductions
    ("sum", _sum, "Sum over ``axis`` (bool and int32 sum as int64).", "vnp.sum([[1.0, 2.0], [3.0, 4.0]], axis=0)", "tensor([4., 6.], dtype=float64)"),
    ("mean", _api.mean, "Mean over ``axis``.", "vnp.mean([[1.0, 2.0], [3.0, 4.0]], axis=1)", "tensor([1.5, 3.5], dtype=float64)"),
    ("max", _api.max, "Maximum over ``axis``; ties share the derivative.", "vnp.max([[1.0, 5.0], [3.0, 4.0]], axis=1)", "tensor([5., 4.], dtype=float64)"),
    ("amax", _api.max, "``max``.", "vnp.amax([1.0, 5.0])", "tensor(5., dtype=float64)"),
    ("min", _api.min, "Minimum over ``axis``; ties share the derivative.", "vnp.min([[1.0, 5.0], [3.0, 4.0]], axis=0)", "tensor([1., 4.], dtype=float64)"),
    ("amin", _api.min, "``min``.", "vnp.amin([1.0, 5.0])", "tensor(1., dtype=float64)"),
    ("prod", _prod, "Product over ``axis``; exact derivative where elements are zero.", "vnp.prod([[1.0, 2.0], [3.0, 4.0]], axis=1)", "tensor([ 2., 12.], dtype=float64)"),
    ("cumsum", _num.cumsum, "Running sum along ``axis`` (flat when None).", "vnp.cumsum([1.0, 2.0, 3.0])", "tensor([1., 3., 6.], dtype=float64)"),
    ("cumprod", _num.cumprod, "Running product along ``axis`` (flat when None).", "vnp.cumprod([1.0, 2.0, 3.0])", "tensor([1., 2., 6.], dtype=float64)"),
    ("var", _var, "Variance over ``axis``, divided by n - ddof.", "vnp.var([1.0, 2.0, 3.0, 4.0])", "tensor(1.25, dtype=float64)"),
    ("std", _std, "Standard deviation, sqrt(var).", "vnp.std([1.0, 2.0, 3.0, 4.0], ddof=1)", "tensor(1.29099445, dtype=float64)"),
    ("any", _num.any, "Whether any element is nonzero (bool).", "vnp.any([[0, 1], [0, 0]], axis=1)", "tensor([ True, False], dtype=bool)"),
    ("all", _num.all, "Whether every element is nonzero (bool).", "vnp.all([[1, 1], [0, 1]], axis=1)", "tensor([ True, False], dtype=bool)"),
    ("ptp", _num.ptp, "max - min over ``axis``.", "vnp.ptp([1.0, 5.0, 3.0])", "tensor(4., dtype=float64)"),
    ("count_nonzero", _num.count_nonzero, "How many elements are nonzero (int64).", "vnp.count_nonzero([0.0, 1.0, 2.0])", "tensor(2, dtype=int64)"),
    # sorting
    ("sort", _sort, "Sorted along ``axis`` (stable, NaN last; ``descending`` keeps equal elements in their order); derivative: back to where each came from.", "vnp.sort([3.0, 1.0, 2.0])", "tensor([1., 2., 3.], dtype=float64)"),
    ("argsort", _argsort, "Indices that sort along ``axis`` (stable, NaN last; ``descending`` too).", "vnp.argsort([3.0, 1.0, 2.0])", "tensor([1, 2, 0], dtype=int64)"),
    # shapes and movement
    ("reshape", _reshape, "Same elements, new shape (one -1 allowed).", "vnp.reshape([1.0, 2.0, 3.0, 4.0], (2, -1))", 'tensor([[1., 2.],\n        [3., 4.]], dtype=float64)'),
    ("ravel", _num.ravel, "Flattened to 1-D.", "vnp.ravel([[1, 2], [3, 4]])", "tensor([1, 2, 3, 4], dtype=int64)"),
    ("transpose", _transpose, "Axes permuted (reversed by default).", "vnp.transpose([[1, 2, 3]])", 'tensor([[1],\n        [2],\n        [3]], dtype=int64)'),
    ("swapaxes", _swapaxes, "Two axes exchanged.", "vnp.swapaxes([[1, 2, 3]], 0, 1)", 'tensor([[1],\n        [2],\n        [3]], dtype=int64)'),
    ("moveaxis", _num.moveaxis, "Axes moved to new places, the others keeping their order.", "vnp.moveaxis(vnp.zeros((2, 3, 4)), 0, -1).shape", "(3, 4, 2)"),
    ("expand_dims", _api.expand_dims, "A new axis of length 1 at ``axis``.", "vnp.expand_dims([1, 2], 0)", "tensor([[1, 2]], dtype=int64)"),
    ("squeeze", _api.squeeze, "Axes of length 1 removed.", "vnp.squeeze([[1, 2]])", "tensor([1, 2], dtype=int64)"),
    ("broadcast_to", _api.broadcast_to, "Repeated to ``shape`` as broadcasting would.", "vnp.broadcast_to([1, 2], (2, 2))", 'tensor([[1, 2],\n        [1, 2]], dtype=int64)'),
    ("stack", _api.stack, "Joined along a new ``axis``.", "vnp.stack([[1, 2], [3, 4]], axis=1)", 'tensor([[1, 3],\n        [2, 4]], dtype=int64)'),
    ("hstack", _hstack, "Joined along axis 1 (axis 0 for 1-D).", "vnp.hstack([[1, 2], [3]])", "tensor([1, 2, 3], dtype=int64)"),
    ("vstack", _vstack, "Joined as rows (1-D operands become rows).", "vnp.vstack([[1, 2], [3, 4]])", 'tensor([[1, 2],\n        [3, 4]], dtype=int64)'),
    ("flip", _flip, "Order reversed along ``axis`` (all axes when None).", "vnp.flip([1, 2, 3])", "tensor([3, 2, 1], dtype=int64)"),
    ("roll", _roll, "Elements shifted along ``axis``, wrapping around (flat when None).", "vnp.roll([1, 2, 3, 4], 1)", "tensor([4, 1, 2, 3], dtype=int64)"),
    ("repeat", _repeat, "Each element repeated (``repeats``: an int or one per element).", "vnp.repeat([1, 2], 2)", "tensor([1, 1, 2, 2], dtype=int64)"),
    ("tile", _tile, "The whole array repeated ``reps`` times per axis.", "vnp.tile([1, 2], 2)", "tensor([1, 2, 1, 2], dtype=int64)"),
    ("take", _take, "Elements at ``indices`` along ``axis`` (flat when None).", "vnp.take([10.0, 20.0, 30.0], [2, 0])", "tensor([30., 10.], dtype=float64)"),
    ("take_along_axis", _api.take_along_axis, "out[i, j] = a[i, indices[i, j]] along ``axis``.", "vnp.take_along_axis([[10.0, 20.0]], [[1, 0]], axis=1)", "tensor([[20., 10.]], dtype=float64)"),
    ("diagonal", _diagonal, "The ``offset`` diagonal of axes (axis1, axis2), as a last axis.", "vnp.diagonal([[1, 2], [3, 4]])", "tensor([1, 4], dtype=int64)"),
    ("diag", _diag, "A matrix's k-th diagonal, or the matrix with a vector on it.", "vnp.diag([1.0, 2.0])", 'tensor([[1., 0.],\n        [0., 2.]], dtype=float64)'),
    ("trace", _trace, "Sum of the ``offset`` diagonal.", "vnp.trace([[1.0, 2.0], [3.0, 4.0]])", "tensor(5., dtype=float64)"),
    ("triu", _triu, "Zero below the k-th diagonal.", "vnp.triu([[1, 2], [3, 4]])", 'tensor([[1, 2],\n        [0, 4]], dtype=int64)'),
    ("tril", _tril, "Zero above the k-th diagonal.", "vnp.tril([[1, 2], [3, 4]])", 'tensor([[1, 0],\n        [3, 4]], dtype=int64)'),
    # products
    ("matmul", _api.matmul, "Matrix product ``a @ b`` (1-D operands and batch broadcasting).", "vnp.matmul([[1.0, 2.0]], [[3.0], [4.0]])", "tensor([[11.]], dtype=float64)"),
    ("dot", _num.dot, "NumPy's dot: a product for scalars, matmul to 2-D, last axis of a with the second-to-last of b beyond.", "vnp.dot([1.0, 2.0], [3.0, 4.0])", "tensor(11., dtype=float64)"),
    ("inner", _num.inner, "Sum over the last axes of a and b.", "vnp.inner([1.0, 2.0], [3.0, 4.0])", "tensor(11., dtype=float64)"),
    ("vdot", _num.vdot, "Sum of the elementwise product of the flattened operands.", "vnp.vdot([[1.0, 2.0]], [[3.0, 4.0]])", "tensor(11., dtype=float64)"),
    ("outer", _num.outer, "out[i, j] = a[i] * b[j] (operands flattened).", "vnp.outer([1.0, 2.0], [1.0, 10.0])", 'tensor([[ 1., 10.],\n        [ 2., 20.]], dtype=float64)'),
    ("tensordot", _num.tensordot, "Sum over ``axes`` (an int: the last of a with the first of b; or two lists).", "vnp.tensordot(vnp.ones((2, 3)), vnp.ones((3, 4)), 1).shape", "(2, 4)"),
    ("einsum", _num.einsum, "Einstein summation over lettered axes (no '...').", "vnp.einsum('ij,j->i', [[1.0, 2.0], [3.0, 4.0]], [1.0, 1.0])", "tensor([3., 7.], dtype=float64)"),
    # making arrays
    ("array", _array, "A Tensor from data; a Tensor is returned as is (cast to ``dtype`` if given), a list holding Tensors is stacked.", "vnp.array([[1, 2], [3, 4]])", 'tensor([[1, 2],\n        [3, 4]], dtype=int64)'),
    ("asarray", _array, "``array``.", "vnp.asarray(2.5)", "tensor(2.5, dtype=float64)"),
    ("zeros", _zeros, "Zeros of ``shape`` (float64 by default).", "vnp.zeros((2,))", "tensor([0., 0.], dtype=float64)"),
    ("ones", _ones, "Ones of ``shape`` (float64 by default).", "vnp.ones(2, dtype=vnp.int32)", "tensor([1, 1], dtype=int32)"),
    ("full", _full, "``fill_value`` everywhere in ``shape``.", "vnp.full((2,), 7.0)", "tensor([7., 7.], dtype=float64)"),
    ("zeros_like", _zeros_like, "Zeros of ``a``'s shape and dtype.", "vnp.zeros_like([1.0, 2.0])", "tensor([0., 0.], dtype=float64)"),
    ("ones_like", _ones_like, "Ones of ``a``'s shape and dtype.", "vnp.ones_like([1, 2])", "tensor([1, 1], dtype=int64)"),
    ("full_like", _full_like, "``fill_value`` in ``a``'s shape and dtype.", "vnp.full_like([1.0, 2.0], 3.0)", "tensor([3., 3.], dtype=float64)"),
    ("arange", _arange, "Evenly spaced values in [start, stop).", "vnp.arange(3)", "tensor([0, 1, 2], dtype=int64)"),
    ("linspace", _linspace, "``num`` evenly spaced values from start to stop.", "vnp.linspace(0.0, 1.0, 3)", "tensor([0. , 0.5, 1. ], dtype=float64)"),
    ("eye", _eye, "Ones on the k-th diagonal of an n x m matrix.", "vnp.eye(2)", 'tensor([[1., 0.],\n        [0., 1.]], dtype=float64)'),
    ("identity", _identity, "The n x n identity.", "vnp.identity(2)", 'tensor([[1., 0.],\n        [0., 1.]], dtype=float64)'),
    ("astype", _astype, "``x`` converted to ``dtype``.", "vnp.astype([1.5, 2.5], vnp.int32)", "tensor([1, 2], dtype=int32)"),
]

_MANY = [
    ("split", _split_, "Pieces along ``axis``: n equal sections, or cut at the given indices.", "vnp.split([1, 2, 3, 4], 2)", "[tensor([1, 2], dtype=int64), tensor([3, 4], dtype=int64)]"),
    ("array_split", _array_split, "``split``, allowing sections of unequal length.", "vnp.array_split([1, 2, 3], 2)", "[tensor([1, 2], dtype=int64), tensor([3], dtype=int64)]"),
    ("meshgrid", _meshgrid, "Coordinate grids from 1-D coordinates (``indexing`` 'xy' or 'ij').", "vnp.meshgrid([1, 2], [3, 4, 5])[0].shape", "(3, 2)"),
]

def _same_tensor(lifted):
    """``array``/``asarray`` of a Tensor with no new dtype: that Tensor itself."""
    def op(obj, dtype=None, *, device=None, copy=None):
        if isinstance(obj, Tensor) and dtype is None:
            return obj
        if copy is False and not isinstance(obj, Tensor):
            raise ArgumentError("asarray: copy=False cannot be honoured for data that is not a "
                                "Tensor (a Tensor owns its values); pass copy=None")
        return lifted(obj, dtype, device=device)
    return _named(op, lifted.__name__, lifted.__doc__, inspect.signature(lifted))


for _name, _fn, _summary, _example, _output in _TABLE:
    _op = _lifted(_fn, _name, _doc(_summary, _example, _output))
    globals()[_name] = _same_tensor(_op) if _fn is _array else _op
for _name, _fn, _summary, _example, _output in _MANY:
    globals()[_name] = _lifted_many(_fn, _name, _doc(_summary, _example, _output))

for _name, _fn, _summary, _example in _more.ONE:
    globals()[_name] = _lifted(_fn, _name, _doc(_summary, _example, _more.OUTPUTS.get(_name)))
for _name, _fn, _summary, _example in _more.MANY:
    globals()[_name] = _lifted_many(_fn, _name, _doc(_summary, _example, _more.OUTPUTS.get(_name)))
for _name, _fn, _summary, _example in _more.TUPLES:
    globals()[_name] = _lifted_many(_fn, _name, _doc(_summary, _example, _more.OUTPUTS.get(_name)),
                                    as_tuple=True)
for _name, _fn, _summary, _example in _more.ON_TENSORS:
    globals()[_name] = _named(_fn, _name, _doc(_summary, _example, _more.OUTPUTS.get(_name)),
                              inspect.signature(_fn))
for _name, _fn, _sig, _summary, _example in _more.COUNTED:
    globals()[_name] = _named(_fn, _name, _doc(_summary, _example, _more.OUTPUTS.get(_name)), _sig)

# -- the array API standard's names (``_array_api``) -------------------------------------------------
__array_api_version__ = _array_api.API_VERSION
__array_namespace_info__ = _array_api.array_namespace_info
isdtype, result_type, can_cast = _array_api.isdtype, _array_api.result_type, _array_api.can_cast
finfo, iinfo, from_dlpack = _array_api.finfo, _array_api.iinfo, _array_api.from_dlpack
for _fn in (isdtype, result_type, can_cast, finfo, iinfo, from_dlpack):
    _fn.__module__ = __name__           # (documented with vkml.numpy's other names)
for _name, _fn, _summary, _example in _array_api.ONE:
    globals()[_name] = _lifted(_fn, _name, _doc(_summary, _example, _array_api.OUTPUTS.get(_name)))
for _name, _fn, _summary, _example in _array_api.MANY:
    globals()[_name] = _lifted_many(_fn, _name, _doc(_summary, _example, _array_api.OUTPUTS.get(_name)))
for _name, _fn, _summary, _example in _array_api.TUPLES:
    globals()[_name] = _lifted_many(_fn, _name, _doc(_summary, _example, _array_api.OUTPUTS.get(_name)),
                                    as_tuple=True)
for _name, _numpy_name in _array_api.ALIASES.items():
    if _numpy_name in globals():
        globals()[_name] = globals()[_numpy_name]
