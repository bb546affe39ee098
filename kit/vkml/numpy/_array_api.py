"""The Python array API standard's names for ``vkml.numpy`` (version 2023.12).

The standard is the common spelling NumPy 2, JAX, CuPy, Dask and PyTorch (through
array-api-compat) share, and what SciPy and scikit-learn accept through
``array_namespace(x)``: with it, ``x.__array_namespace__()`` of a Tensor is
``vkml.numpy`` and such code runs on vkml's lazy, differentiable tensors.
Most of its names are NumPy's, already in ``vkml.numpy``; this module adds
the ones it spells differently (``acos``, ``concat``, ``permute_dims``,
``pow``, ``unique_values`` ...), its keyword arguments (``correction=``,
``descending=``, ``device=``), the dtype functions and DLPack.

Devices: a Tensor's ``device`` is the backend it lives on ("CPU", or a GPU's
name with the CUDA backend); ``device=`` arguments accept it (or None).
"""

from __future__ import annotations

import builtins
import collections

import numpy as _np

from ..errors import ArgumentError, DTypeError, ShapeError
from ..ir import DTYPES
from ..ops import api as _api
from ..ops import bitwise as _bitwise
from ..ops import complex_parts as _cplx
from ..ops import numeric as _num
from ..ops import sorting as _sorting
from ..tensor import Tensor, tensor as _tensor
from .. import validate as _valid

API_VERSION = "2023.12"

_KINDS = {
    "bool": ("b",),
    "signed integer": ("i",),
    "unsigned integer": ("u",),
    "integral": ("i", "u"),
    "real floating": ("f",),
    "complex floating": ("c",),
    "numeric": ("i", "u", "f", "c"),
}


def _dtype_of(x):
    if isinstance(x, Tensor):
        return x.dtype
    return _valid.check_dtype(x, "dtype functions", exact=True)


def isdtype(dtype, kind):
    """Whether ``dtype`` is of ``kind``: a dtype, a kind name ("bool", "signed integer",
    "unsigned integer", "integral", "real floating", "complex floating", "numeric") or a tuple.

    >>> import vkml.numpy as vnp
    >>> vnp.isdtype(vnp.float32, ("real floating", "complex floating"))
    True
    """
    dtype = _valid.check_dtype(dtype, "isdtype", exact=True)
    if isinstance(kind, tuple):
        return builtins.any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ArgumentError(f"isdtype: kind {kind!r} is not one of {', '.join(_KINDS)}")
        return dtype.kind in _KINDS[kind]
    return dtype == _valid.check_dtype(kind, "isdtype", "kind", exact=True)


def result_type(*arrays_and_dtypes):
    """The dtype NumPy's promotion gives these tensors and dtypes (Python numbers are weak).

    >>> import vkml.numpy as vnp
    >>> vnp.result_type(vnp.int8, vnp.uint8) == vnp.int16
    True
    """
    if not arrays_and_dtypes:
        raise ArgumentError("result_type: needs at least one array or dtype")
    parts = []
    for a in arrays_and_dtypes:
        if isinstance(a, (builtins.bool, int, float, complex)):
            parts.append(a)
        else:
            parts.append(_dtype_of(a))
    if not builtins.any(isinstance(p, _np.dtype) for p in parts):
        raise ArgumentError("result_type: needs at least one array or dtype besides Python numbers")
    return _valid.canonical_dtype(_np.result_type(*parts))


def can_cast(from_, to):
    """Whether NumPy's "safe" casting allows ``from_`` (a dtype or tensor) to ``to``.

    >>> import vkml.numpy as vnp
    >>> vnp.can_cast(vnp.int8, vnp.float32)
    True
    """
    return builtins.bool(_np.can_cast(_dtype_of(from_), _valid.check_dtype(to, "can_cast", exact=True)))


def finfo(type):
    """The limits of a floating dtype (or a tensor's), as NumPy's ``finfo``.

    >>> import vkml.numpy as vnp
    >>> float(vnp.finfo(vnp.float32).eps)
    1.1920928955078125e-07
    """
    dtype = _dtype_of(type)
    if dtype.kind not in "fc":
        raise DTypeError(f"finfo: needs a floating dtype, got {dtype}; use iinfo for integers")
    info = _np.finfo(dtype)
    return FloatInfo(info.bits, float(info.eps), float(info.max), float(info.min),
                     float(info.smallest_normal), info.dtype)


#: what ``finfo`` gives: the limits as Python floats (the array API's), the real part's dtype
FloatInfo = collections.namedtuple("FloatInfo", ["bits", "eps", "max", "min", "smallest_normal",
                                                 "dtype"])


def iinfo(type):
    """The limits of an integer dtype (or a tensor's), as NumPy's ``iinfo``.

    >>> import vkml.numpy as vnp
    >>> vnp.iinfo(vnp.uint8).max
    255
    """
    dtype = _dtype_of(type)
    if dtype.kind not in "iu":
        raise DTypeError(f"iinfo: needs an integer dtype, got {dtype}; use finfo for floats")
    return _np.iinfo(dtype)


class _Info:
    """What ``__array_namespace_info__()`` returns: the namespace's capabilities and defaults."""

    def capabilities(self):
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self):
        return _api.default_device()

    def devices(self):
        return [_api.default_device()]

    def default_dtypes(self, *, device=None):
        return {"real floating": _np.dtype(_np.float64), "complex floating": _np.dtype(_np.complex128),
                "integral": _np.dtype(_np.int64), "indexing": _np.dtype(_np.int64)}

    def dtypes(self, *, device=None, kind=None):
        out = {d.name: d for d in DTYPES}
        if kind is None:
            return out
        return {n: d for n, d in out.items() if isdtype(d, kind)}


def array_namespace_info():
    """The namespace's capabilities, devices and default dtypes (the array API's inspection).

    >>> import vkml.numpy as vnp
    >>> vnp.__array_namespace_info__().default_dtypes()["real floating"]
    dtype('float64')
    """
    return _Info()


def from_dlpack(x, /, *, device=None, copy=None):
    """A Tensor with the values of ``x``, any object that speaks DLPack (a NumPy array, a
    PyTorch or JAX CPU tensor): read through NumPy's ``from_dlpack``, then copied (a Tensor
    never changes, so it cannot share memory another library writes).

    >>> import vkml.numpy as vnp
    >>> vnp.from_dlpack(vnp.arange(3.0))
    tensor([0., 1., 2.], dtype=float64)
    """
    if copy is not None and not isinstance(copy, (builtins.bool, _np.bool_)):
        raise ArgumentError(f"from_dlpack: copy must be None, True or False, got {_valid.describe(copy)}")
    if isinstance(x, Tensor) and not copy:
        return x                   # a Tensor never changes: sharing it is the same as copying
    if copy is False:
        raise ArgumentError("from_dlpack: copy=False cannot be honoured; a Tensor owns its "
                            "values (pass copy=None or True)")
    try:
        arr = _np.from_dlpack(x)
    except (TypeError, AttributeError, BufferError, RuntimeError) as err:
        raise ArgumentError(f"from_dlpack: {type(x).__name__} does not give its data through "
                            f"DLPack on the CPU ({err}); pass a NumPy array or a CPU tensor") from None
    return _tensor(arr)


# -- the standard's spellings of what vkml.numpy has ---------------------------------------------

def _permute_dims(x, /, axes):
    return _api.transpose(x, tuple(_valid.check_sequence(axes, "axes", "permute_dims")))


def _concat(arrays, /, *, axis=0):
    return concat_vars("concat", arrays, axis)


def concat_vars(op, arrays, axis):
    """The arrays joined along ``axis`` (flattened first when None), dtypes promoted."""
    arrays = _valid.check_sequence(arrays, "arrays", op)
    if not arrays:
        raise ArgumentError(f"{op}: needs at least one array; pass e.g. [a, b]")
    if axis is None:
        arrays = [_api.reshape(a, (-1,)) for a in arrays]
        axis = 0
    return _api.concatenate(_api.promote(*arrays), axis)


def sort(x, axis=-1, descending=False):
    x = _api.as_var(x)
    if axis is None:                 # NumPy's: the flattened array
        x, axis = _api.reshape(x, (-1,)), 0
    axis = _api.normalize_axis("sort", x.ndim, axis)
    if descending:           # stable and descending: sort the reversed array, reverse back
        return _api.flip(_num.sort(_api.flip(x, (axis,)), axis), (axis,))
    return _num.sort(x, axis)


def argsort(x, axis=-1, descending=False):
    x = _api.as_var(x)
    if axis is None:
        x, axis = _api.reshape(x, (-1,)), 0
    axis = _api.normalize_axis("argsort", x.ndim, axis)
    if not descending:
        return _sorting.argsort(x, axis)
    n = x.shape[axis]
    # descending and stable: the ascending stable order of the reversed array, mapped back
    order = _sorting.argsort(_api.flip(x, (axis,)), axis)
    return _api.flip(_api.sub(n - 1, order), (axis,))


def _unstack(x, /, *, axis=0):
    x = _api.as_var(x)
    axis = _api.normalize_axis("unstack", x.ndim, axis)
    return [_api.take(x, i, axis) for i in range(x.shape[axis])]


def _broadcast_arrays(*arrays):
    vs = [_api.as_var(a) for a in arrays]
    shape = _api.broadcast_shapes("broadcast_arrays", *[v.shape for v in vs])
    return [_api.broadcast_to(v, shape) for v in vs]


def _logical_xor(x1, x2, /):
    return _api.not_equal(_api.cast(x1, _np.bool_), _api.cast(x2, _np.bool_))


def vecdot_vars(x1, x2, /, *, axis=-1):
    """sum(conj(x1) * x2) along ``axis`` (the standard conjugates the first for complex), in
    the operands' dtype; the axis must have one length in both (it is not broadcast)."""
    x1, x2 = _api.promote(x1, x2)
    _check_vecdot_axis(x1, x2, axis)
    return _api.sum(_api.mul(_cplx.conj(x1), x2), axis, dtype=x1.dtype)


def _check_vecdot_axis(x1, x2, axis):
    axis = _valid.check_int(axis, "axis", "vecdot")
    if not (-builtins.min(x1.ndim, x2.ndim) <= axis < 0):
        raise ArgumentError(f"vecdot: axis {axis} must be negative and within both operands' "
                            f"dimensions ({x1.ndim} and {x2.ndim})")
    if x1.shape[axis] != x2.shape[axis]:
        raise ShapeError(f"vecdot: the axis {axis} has lengths {x1.shape[axis]} and "
                         f"{x2.shape[axis]}; the contracted axis must have one length in both")


def _matrix_transpose(x, /):
    return _api.swapaxes(x, -1, -2)


#: the standard's names for functions ``vkml.numpy`` has under NumPy's (the same objects)
ALIASES = {"acos": "arccos", "acosh": "arccosh", "asin": "arcsin", "asinh": "arcsinh",
           "atan": "arctan", "atan2": "arctan2", "atanh": "arctanh", "pow": "power",
           "bitwise_invert": "invert", "bitwise_not": "invert", "bitwise_left_shift": "left_shift",
           "bitwise_right_shift": "right_shift"}

#: (name, function on Vars, summary, example) for the standard's own functions
ONE = [
    ("concat", _concat, "Joined along an existing ``axis`` (flattened first when None), dtypes promoted.", "vnp.concat([vnp.ones(2), vnp.zeros(1)])"),
    ("permute_dims", _permute_dims, "The axes in the order ``axes``.", "vnp.permute_dims(vnp.zeros((2, 3)), (1, 0)).shape"),
    ("logical_xor", _logical_xor, "x xor y, elementwise (bool).", "vnp.logical_xor([True, False], True)"),
    ("matrix_transpose", _matrix_transpose, "The last two axes swapped.", "vnp.matrix_transpose(vnp.zeros((4, 2, 3))).shape"),
    ("vecdot", vecdot_vars, "The dot product along ``axis``.", "vnp.vecdot([1.0, 2.0], [3.0, 4.0])"),
]

BITWISE = [
    ("bitwise_and", _bitwise.bitwise_and, "x & y, bit by bit (integers and bools).", "vnp.bitwise_and([12, 10], 6)"),
    ("bitwise_or", _bitwise.bitwise_or, "x | y, bit by bit.", "vnp.bitwise_or([12, 10], 6)"),
    ("bitwise_xor", _bitwise.bitwise_xor, "x ^ y, bit by bit.", "vnp.bitwise_xor([12, 10], 6)"),
    ("invert", _bitwise.invert, "~x: every bit flipped (logical not for bools).", "vnp.invert([0, 5])"),
    ("left_shift", _bitwise.left_shift, "x << y (0 once every bit is shifted out).", "vnp.left_shift([1, 3], 2)"),
    ("right_shift", _bitwise.right_shift, "x >> y (arithmetic for signed integers).", "vnp.right_shift([-8, 8], 2)"),
]
ONE += BITWISE

#: functions returning a tuple of Tensors
TUPLES = [
    ("unstack", _unstack, "The slices along ``axis``, as a tuple.", "vnp.unstack(vnp.eye(2))"),
]

#: functions returning a list of Tensors
MANY = [

    ("broadcast_arrays", _broadcast_arrays, "The arrays broadcast to one shape.", "[a.shape for a in vnp.broadcast_arrays(vnp.zeros(3), vnp.zeros((2, 1)))]"),
]

#: what each example prints (made by running it; the docstring tests run them again)
OUTPUTS = {
    'bitwise_and': 'tensor([4, 2], dtype=int64)',
    'bitwise_or': 'tensor([14, 14], dtype=int64)',
    'bitwise_xor': 'tensor([10, 12], dtype=int64)',
    'invert': 'tensor([-1, -6], dtype=int64)',
    'left_shift': 'tensor([ 4, 12], dtype=int64)',
    'right_shift': 'tensor([-2,  2], dtype=int64)',
    'concat': 'tensor([1., 1., 0.], dtype=float64)',
    'permute_dims': '(3, 2)',
    'logical_xor': 'tensor([False,  True], dtype=bool)',
    'matrix_transpose': '(4, 3, 2)',
    'vecdot': 'tensor(11., dtype=float64)',
    'unstack': '(tensor([1., 0.], dtype=float64), tensor([0., 1.], dtype=float64))',
    'broadcast_arrays': '[(2, 3), (2, 3)]',
}
