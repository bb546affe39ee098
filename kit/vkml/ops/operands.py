"""How inputs become Vars for the operations of ``api``: constants, NumPy dtype promotion
(Python scalars are weak, as in NumPy 2), broadcasting, casts, and the helpers the vmap rules
batch with.  The lowest part of ``ops.api`` (which re-exports every name here)."""

from __future__ import annotations

import builtins

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError
from ..ir import Var, dtype_name
from ..threadsafe import Setting
from ..validate import DTYPES, canonical_dtype, check_dtype, check_shape, host_memory
from .core import Linear, bind
from .elementwise import cast_p
from .movement import broadcast_in_dim_p


#: The device new constants are placed on: the current backend's, per thread and asyncio task
#: (``vkml.runtime`` sets it with the backend; read it with ``default_device()``).
DEFAULT_DEVICE = Setting("device", "CPU")


def default_device() -> str:
    """Where new constants are placed in this thread or task (the current backend's device)."""
    return DEFAULT_DEVICE.get()

SCALARS = (bool, int, float, complex, np.bool_, np.number)


def constant(value, dtype=None, device=None) -> Var:
    """A leaf Var holding ``value`` (copied, so later changes to it are not seen)."""
    if dtype is None and type(value) is np.ndarray and value.dtype in DTYPES:
        # the common call (an array argument of one of vkml's dtypes): nothing to check or cast
        try:
            arr = value.copy()
        except MemoryError:
            raise ShapeError(f"tensor: a copy of an array of shape {value.shape} needs more memory "
                             "than this process can allocate; use a smaller shape") from None
        arr.flags.writeable = False
        return Var(arr.shape, arr.dtype, device or default_device(), value=arr)
    if dtype is not None:
        dtype = check_dtype(dtype, "tensor")
    if isinstance(value, (str, bytes, dict, set)) or value is None:
        raise ArgumentError(f"cannot make a tensor from {type(value).__name__}; pass a number, "
                            "a (nested) list of numbers or a NumPy array")
    if type(value) is int and dtype is None and not -2 ** 63 <= value < 2 ** 64:
        raise DTypeError(f"cannot make a tensor from {value}: it does not fit int64 or uint64, "
                         "vkml's widest integers; pass it as a float (dtype=float64)")
    with host_memory("tensor", f"data of {type(value).__name__}"):
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError, OverflowError) as err:
            raise ArgumentError(f"cannot make a tensor from {type(value).__name__} ({err}); pass "
                                "numbers, nested lists of equal length or an array") from None
        # checked before any cast, so text or object data is refused rather than converted
        if arr.dtype.kind not in "biufc":
            raise ArgumentError(f"cannot make a tensor from {type(value).__name__} data of dtype "
                                f"{arr.dtype}; pass numbers, lists of numbers or a NumPy array")
        if dtype is not None and arr.dtype.kind == "c" and dtype.kind != "c":
            raise DTypeError(f"tensor: complex data cannot become {dtype_name(dtype)} (the "
                             "imaginary parts would be lost); take vnp.real or vnp.abs of it first")
        arr = arr.astype(dtype if dtype is not None else canonical_dtype(arr.dtype))  # a copy
    arr.flags.writeable = False
    return Var(arr.shape, arr.dtype, device or default_device(), value=arr)


def as_var(x) -> Var:
    if isinstance(x, Var):
        return x
    if isinstance(x, Linear):
        raise ArgumentError("a Linear marker cannot be computed with")
    if isinstance(x, (np.ndarray, *SCALARS)) or isinstance(x, (list, tuple)):
        return constant(x)
    raise ArgumentError(f"expected a tensor, an array or a number, got {type(x).__name__}")


def _is_weak(x):
    return isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic)


def _same_kind_scalar(x, dtype) -> bool:
    """A Python number that takes ``dtype`` as it is (NumPy 2's weak scalars): a float or int
    with a floating dtype, an int with an integer dtype."""
    t = type(x)
    if dtype.kind == "f":
        return t is float or t is int
    if dtype.kind == "c":
        return t is complex or t is float or t is int
    return t is int and dtype.kind in "iu"


def _weak_example(x):
    """What a weak operand counts as in promotion: a Python number of its kind."""
    if isinstance(x, Var):
        return {"b": False, "i": 0, "u": 0, "c": 0j}.get(x.dtype.kind, 0.0)
    return x


def scalar_var(value, dtype, device):
    if isinstance(value, complex) and np.dtype(dtype).kind != "c":
        raise DTypeError(f"the complex number {value} cannot be a {dtype_name(np.dtype(dtype))} "
                         "value; make the array complex first (.astype(vkml.numpy.complex128))")
    try:
        arr = np.array(value, dtype=dtype)
    except OverflowError:
        raise DTypeError(f"the number {value} does not fit {dtype_name(np.dtype(dtype))}; use a "
                         "smaller one, or cast the tensor to float64 first") from None
    arr.flags.writeable = False
    return Var((), arr.dtype, device, value=arr)


def promote(*xs):
    """Vars of one common dtype, NumPy rules, Python scalars weak (``f32 * 2.0`` is f32)."""
    weak_flags = [_is_weak(x) or (isinstance(x, Var) and x.weak) for x in xs]
    strong = [as_var(x) for x, w in zip(xs, weak_flags) if not w]
    weak = [_weak_example(x) for x, w in zip(xs, weak_flags) if w]
    if not strong:
        dtype = canonical_dtype(np.result_type(*[x.dtype if isinstance(x, Var) else x for x in xs]))
        device = next((x.device for x in xs if isinstance(x, Var)), default_device())
    else:
        dtypes = [v.dtype for v in strong]
        dtype = canonical_dtype(np.result_type(*dtypes, *weak) if weak else np.result_type(*dtypes))
        device = strong[0].device
    out, it = [], iter(strong)
    for x, w in zip(xs, weak_flags):
        v = next(it) if not w else (x if isinstance(x, Var) else scalar_var(x, dtype, device))
        out.append(cast(v, dtype))
    return out


def broadcast_shapes(op, *shapes):
    if len(shapes) == 2:                     # the common cases
        a, b = shapes
        if a == b or not b:
            return tuple(a)
        if not a:
            return tuple(b)
    ndim = builtins.max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        dims = {s[i - ndim + len(s)] for s in shapes if i - ndim + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(f"{op}: shapes {' and '.join(str(tuple(s)) for s in shapes)} "
                             "cannot be broadcast together; make the dimensions match "
                             "(or be 1), e.g. with reshape")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_to(x, shape):
    """``x`` repeated along new or size-1 axes to ``shape``, as ``np.broadcast_to``.

    >>> vkml.broadcast_to(vkml.tensor([1.0, 2.0]), (2, 2))
    tensor([[1., 2.],
            [1., 2.]], dtype=float64)
    """
    x = as_var(x)
    shape = check_shape(shape, "broadcast_to")
    if x.shape == shape:
        return x
    if len(shape) < x.ndim:
        raise ShapeError(f"broadcast_to: cannot broadcast {x.shape} to fewer dimensions {shape}")
    lead = len(shape) - x.ndim
    return broadcast_in_dim(x, shape, tuple(range(lead, len(shape))))


def bind_elementwise(prim, *xs):
    """Bind an elementwise primitive after NumPy's promotion and broadcasting of ``xs``.

    The one way every elementwise operation meets its operands (``ops.special``'s too).
    """
    vs = None
    if len(xs) == 2:                        # the common cases, without the general promotion
        x, y = xs
        if type(x) is Var and type(y) is Var and x.dtype == y.dtype and not x.weak and not y.weak:
            if x.shape == y.shape:
                return bind(prim, x, y)
            vs = [x, y]                     # one dtype: only broadcasting to do
        elif type(x) is Var and not x.weak and _same_kind_scalar(y, x.dtype):
            vs = [x, scalar_var(y, x.dtype, x.device)]
        elif type(y) is Var and not y.weak and _same_kind_scalar(x, y.dtype):
            vs = [scalar_var(x, y.dtype, y.device), y]
    if vs is None:
        vs = promote(*xs)
    shapes = [v.shape for v in vs]
    if any(s != shapes[0] for s in shapes):
        shape = broadcast_shapes(prim.name, *shapes)
        vs = [broadcast_to(v, shape) for v in vs]
    return bind(prim, *vs)


def as_floating(x):
    """``x`` as a Var, cast to float64 unless already floating, as NumPy's float functions
    do with integers (``ops.numeric``, ``ops.special`` and ``vkml.scipy`` use it too)."""
    x = as_var(x)
    if x.dtype.kind not in "fc":
        return cast(x, np.float64)
    return x


def broadcast_batch(x, size):
    """An unbatched value repeated along a new leading batch axis of ``size``."""
    return broadcast_in_dim(x, (size,) + x.shape, tuple(range(1, x.ndim + 1)))


def batch_all(vals, dims, size):
    """Every operand batched at axis 0 (``dims[i]`` is 0 or None; unbatched ones broadcast)."""
    return [x if d == 0 else broadcast_batch(x, size) for x, d in zip(vals, dims)]


def cast(x, dtype):
    """The values converted to ``dtype`` (floats to ints truncate towards zero, as NumPy's ``astype``).

    >>> vkml.cast(vkml.tensor([1.7, -1.7]), 'int32')
    tensor([ 1, -1], dtype=int32)
    """
    x = as_var(x)
    dtype = check_dtype(dtype, "cast", exact=True)
    if x.dtype == dtype:
        return x
    return bind(cast_p, x, dtype=dtype)


def broadcast_in_dim(x, shape, dims):
    x = as_var(x)
    shape, dims = tuple(shape), tuple(dims)
    if shape == x.shape and dims == tuple(range(len(shape))):
        return x
    return bind(broadcast_in_dim_p, x, shape=shape, dims=dims)
