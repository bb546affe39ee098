"""Checks for the arguments of public calls, made before anything is built, run or written.

Every public function turns what a user typed into the plain values it
works with through these helpers, so a wrong argument is refused at the door
with a :class:`~vkml.errors.VkmlError` that names the op and says what to pass
instead -- never a ``TypeError`` from deep inside NumPy, an ``OverflowError``
from ``int()``, or a ``MemoryError`` from an allocation -- and nothing is left
half done.  Each helper returns the normalised value (``int``, ``float``,
``bool``, a shape tuple, a NumPy dtype), so a caller checks and converts in one
line.  Axis arguments are checked by ``ops.api.normalize_axis(es)``, which
use :func:`check_int`.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
import reprlib
import warnings

import numpy as np

from .errors import ArgumentError, DTypeError, ShapeError
from .ir import DTYPES, Var  # DTYPES: the dtypes a tensor can have

#: The usual ways to name them, looked up without asking NumPy.
_SPELLINGS = {spelling: np.dtype(spelling) for spelling in
              [*DTYPES, bool, int, float, complex, np.bool_, np.int8, np.int16, np.int32, np.int64,
               np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64, np.complex64,
               np.complex128, *(d.name for d in DTYPES)]}

#: the dtypes named in messages
DTYPE_NAMES = ", ".join(d.name for d in DTYPES)

#: The most elements one array may have: its bytes at 8 per element must fit an int64.
MAX_ELEMENTS = np.iinfo(np.int64).max // 8


def describe(value) -> str:
    """A short description of a wrong value for a message: its type, and its repr if short."""
    if isinstance(value, Var):      # what a Tensor argument is once the tensor layer unwraps it
        return f"a tensor {value.type_str()}"
    text = reprlib.repr(value)     # bounded: a list nested thousands deep is described too
    kind = type(value).__name__
    return f"{kind} {text}" if len(text) <= 40 and not text.startswith(kind) else kind


def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def check_int(value, name: str, op: str, low=None, high=None, error=ArgumentError) -> int:
    """``value`` as an int (anything with ``__index__`` but a bool), in ``[low, high]`` when given.

    A value of the wrong kind is an ArgumentError; one out of range raises ``error``.
    """
    if _is_bool(value):
        raise ArgumentError(f"{op}: {name} must be an int, got the bool {value}; pass a number")
    try:
        out = operator.index(value)
    except TypeError:
        fix = "floats are not rounded for you: pass int(...) of it" if isinstance(value, numbers.Real) \
            else "pass a whole number"
        raise ArgumentError(f"{op}: {name} must be an int, got {describe(value)}; {fix}") from None
    if low is not None and out < low:
        raise error(f"{op}: {name} must be at least {low}, got {out}")
    if high is not None and out > high:
        raise error(f"{op}: {name} must be at most {high}, got {out}")
    return out


def check_bool(value, name: str, op: str) -> bool:
    """``value`` as a bool: True/False (NumPy's too) or the ints 0 and 1."""
    if _is_bool(value):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise ArgumentError(f"{op}: {name} must be True or False, got {describe(value)}")


def check_real(value, name: str, op: str, low=None, high=None, low_open=False, high_open=False,
               finite=True) -> float:
    """``value`` as a float, finite unless ``finite=False``, within the bounds given (open or
    closed); an ArgumentError otherwise."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ArgumentError(f"{op}: {name} must be a {'finite' if finite else 'real'} number, got "
                            f"{describe(value)}")
    try:
        out = float(value)
    except OverflowError:
        out = math.copysign(math.inf, value)
    if finite and not math.isfinite(out):
        raise ArgumentError(f"{op}: {name} must be a finite number, got {value!r}")
    if low is not None and (out <= low if low_open else out < low):
        raise ArgumentError(f"{op}: {name} must be {'>' if low_open else '>='} {low}, got {out}")
    if high is not None and (out >= high if high_open else out > high):
        raise ArgumentError(f"{op}: {name} must be {'<' if high_open else '<='} {high}, got {out}")
    return out


def check_choice(value, choices, name: str, op: str):
    """``value`` if it is one of ``choices`` (strings, usually); an ArgumentError naming them
    otherwise -- also for an unhashable or array value, which ``in`` could not compare."""
    if isinstance(value, (str, int, float, type(None))) and value in choices:
        return value
    listed = repr(choices[0]) if len(choices) == 1 else "one of " + ", ".join(repr(c) for c in choices)
    raise ArgumentError(f"{op}: {name} must be {listed}, got {describe(value)}")


def check_sequence(value, name: str, op: str) -> list:
    """``value`` (a list, tuple or other iterable, not a string or mapping) as a list."""
    if isinstance(value, (str, bytes, dict, set, frozenset)) or value is None:
        raise ArgumentError(f"{op}: {name} must be a list or tuple, got {describe(value)}")
    try:
        return list(value)
    except TypeError:
        raise ArgumentError(f"{op}: {name} must be a list or tuple, got {describe(value)}") from None


def check_shape(shape, op: str, name: str = "shape", wildcard: bool = False) -> tuple:
    """``shape`` (an int or a sequence of ints) as a tuple of non-negative ints.

    ``wildcard``: one -1 may stand for "whatever size fits" (``reshape``).  A
    shape with more elements than an array can hold is refused here, before
    an allocation or an overflowing product could fail somewhere deeper.
    """
    if _is_bool(shape):
        raise ArgumentError(f"{op}: {name} must be an int or a tuple of ints, got the bool {shape}")
    if hasattr(shape, "__index__") and not isinstance(shape, np.ndarray):
        dims = [shape]
    elif isinstance(shape, np.ndarray) and shape.ndim == 0:
        dims = [shape]
    else:
        dims = check_sequence(shape, name, op)
    out = tuple(check_int(d, f"{name}[{i}]" if len(dims) > 1 else name, op) for i, d in enumerate(dims))
    negative = [d for d in out if d < 0]
    if wildcard and negative == [-1]:
        negative = []
    if negative:
        fix = "; use -1 at most once for the size that fits" if wildcard else ""
        raise ShapeError(f"{op}: {name} {out} has a negative size {negative[0]}; sizes must be "
                         f">= 0{fix}")
    count = math.prod(d for d in out if d >= 0)
    if count > MAX_ELEMENTS:
        raise ShapeError(f"{op}: {name} {out} has {count} elements, more than an array can hold "
                         f"({MAX_ELEMENTS}); use a smaller shape")
    return out


def check_dtype(dtype, op: str, name: str = "dtype", exact: bool = False) -> np.dtype:
    """``dtype`` (a NumPy dtype, a type such as ``float`` or a name such as ``"float32"``) as one
    of vkml's (``ir.DTYPES``: bool, the integers, float32/64, complex64/128).

    ``exact=False`` maps NumPy's other numeric dtypes onto them as ``vkml.tensor`` does
    (float16 -> float32, longdouble -> float64); ``exact=True`` refuses them (``cast``).
    """
    try:
        dt = _SPELLINGS.get(dtype)
    except TypeError:       # unhashable: a list, a dict, an array, ...
        dt = None
    # NumPy reads None as float64; here it is a missing dtype, which callers with a default handle
    if dt is None and not (dtype is None or _is_bool(dtype) or
                           isinstance(dtype, (numbers.Number, tuple, list))):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # NumPy's retired aliases
                dt = np.dtype(dtype)
        except (TypeError, ValueError, KeyError, OverflowError, AttributeError):
            dt = None
    if dt is None:
        raise DTypeError(f"{op}: {name} {describe(dtype)} is not a dtype; use one of "
                         f"{DTYPE_NAMES}")
    if dt not in DTYPES:
        if exact or dt.kind not in "fc":
            raise DTypeError(f"{op}: vkml has the dtypes {DTYPE_NAMES}, not {dt}")
        dt = canonical_dtype(dt)
    return dt


def canonical_dtype(dtype) -> np.dtype:
    """``dtype`` itself where vkml has it; NumPy's other floating dtypes mapped onto vkml's
    (float16 -> float32, longdouble -> float64, clongdouble -> complex128)."""
    if dtype in DTYPES:
        return dtype
    k = dtype.kind
    if k == "c":
        return np.dtype(np.complex128) if dtype.itemsize >= 16 else np.dtype(np.complex64)
    if k == "f":
        return np.dtype(np.float64) if dtype.itemsize >= 8 else np.dtype(np.float32)
    return dtype


def check_callable(fn, name: str, op: str):
    if not callable(fn):
        raise ArgumentError(f"{op}: {name} must be callable, got {describe(fn)}")
    return fn


@contextlib.contextmanager
def host_memory(op: str, what: str):
    """Turn a failed host allocation inside the block into a ShapeError naming ``op``: a shape
    can be valid and still too large for this machine."""
    try:
        yield
    except MemoryError:
        raise ShapeError(f"{op}: {what} needs more memory than this process can allocate; use a "
                         "smaller shape") from None
