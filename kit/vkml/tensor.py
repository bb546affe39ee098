"""The lazy Tensor handle, and realize, assign and backward on Tensors.

A Tensor is a thin handle on an IR Var: its methods build equations through
``vkml.ops.api`` and no math lives here.  Nothing runs until a value is
observed (``.numpy()``, ``.item()``, ``realize``, printing, the end of
``backward``); then :mod:`vkml.runtime` turns the pending DAG into a
Program, looks it up in the backend's cache by structure, and runs it as ONE
submission.  A training step that builds the same graph every time therefore
compiles once.  Modes (eager, no_grad), the backend and the grad-leaf
registry are the runtime's too.

Values are never written in place: ``assign_`` points the tensor at a new
buffer.  A graph still pending on the old value keeps reading the old value,
and no two assignments can overlap, so ``assign`` of N pairs is always one
submission.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import runtime
from .errors import ArgumentError, DTypeError, GradError, ShapeError, TracingError
from .ir import Var, dtype_name, format_shape
from .ops import api, numeric
from .validate import (MAX_ELEMENTS, check_bool, check_dtype, check_real, check_sequence,
                       check_shape, describe, host_memory)


class Tensor:
    """A lazy n-dimensional array that can carry gradients (see the module docstring)."""

    __slots__ = ("ir_var", "requires_grad", "grad", "__weakref__")
    __array_priority__ = 1000  # so ndarray * Tensor calls Tensor.__rmul__

    def __init__(self, var: Var, requires_grad: bool = False):
        if not isinstance(var, Var):
            raise ArgumentError(f"Tensor: wraps an IR Var, got {describe(var)}; make tensors with "
                                "vkml.tensor(data)")
        self.ir_var = var
        self.requires_grad = requires_grad
        self.grad = None

    def _register_leaf(self):
        """Make this tensor the one whose ``.grad`` receives its leaf Var's gradient."""
        if self.requires_grad:
            runtime.register_grad_leaf(self.ir_var, self)

    # -- what it is -------------------------------------------------------------------
    shape = property(lambda self: self.ir_var.shape)
    dtype = property(lambda self: self.ir_var.dtype)
    device = property(lambda self: self.ir_var.device)
    ndim = property(lambda self: len(self.ir_var.shape))
    size = property(lambda self: self.ir_var.size)
    is_leaf = property(lambda self: self.ir_var.eqn is None)

    def __len__(self):
        if not self.shape:
            raise ShapeError("len() of a 0-d tensor")
        return self.shape[0]

    # -- observing values --------------------------------------------------------------
    def realize(self) -> "Tensor":
        realize(self)
        return self

    def numpy(self) -> np.ndarray:
        """The value as a read-only NumPy array (realizes if pending)."""
        realize(self)
        out = np.asarray(self.ir_var.value).view()
        out.flags.writeable = False
        return out

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr.astype(dtype) if dtype is not None else np.array(arr)

    def item(self):
        if self.size != 1:
            raise ShapeError(f"item: needs a tensor with one element, got shape {self.shape}; "
                             "reduce it first (e.g. .sum())")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def _concrete(self, what):
        if runtime.is_traced(self.ir_var):
            raise TracingError(
                f"{what} of a traced value ({self.ir_var.type_str()}) has no value while tracing; "
                "use vkml.where for a choice made per element, or vkml.scan / vkml.cond for "
                "control flow")
        return self.item()

    def __bool__(self):
        if self.size != 1:
            raise ShapeError(f"the truth value of a tensor of shape {self.shape} is ambiguous; "
                             "use .any() or .all()")
        return bool(self._concrete("bool()"))

    def __float__(self):
        return float(self._concrete("float()"))

    def __int__(self):
        return int(self._concrete("int()"))

    def __index__(self):
        if self.dtype.kind not in "iu":
            raise DTypeError("only integer tensors can be used as an index")
        return int(self._concrete("an index"))

    def __repr__(self):
        if runtime.is_traced(self.ir_var):
            return f"Tensor({self.ir_var.type_str()}, traced)"
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}, dtype={dtype_name(self.dtype)}{grad})"

    # -- autograd ------------------------------------------------------------------------
    def backward(self):
        backward(self)

    def detach(self) -> "Tensor":
        """The same values, cut from the gradient graph."""
        if self.ir_var.value is not None:
            return Tensor(Var(*self.ir_var.aval, value=self.ir_var.value))
        return Tensor(api.stop_gradient(self.ir_var))

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        flag = check_bool(flag, "flag", "requires_grad_")
        if flag:
            _check_grad_dtype(self.ir_var, "requires_grad_")
            if self.ir_var.eqn is not None:
                raise GradError("requires_grad_: only leaf tensors can be made to require grad; "
                                "call .detach().requires_grad_() to start a new leaf")
        self.requires_grad = bool(flag)
        self._register_leaf()
        return self

    def zero_grad(self):
        self.grad = None

    # -- in place ----------------------------------------------------------------------------
    def assign_(self, src) -> "Tensor":
        assign([self], [src])
        return self

    # -- methods delegate to the functional forms -----------------------------------------------
    def __getitem__(self, index):
        return apply_api(api.getitem, self, _unwrap_index(index))

    def __setitem__(self, index, value):
        raise ArgumentError("Tensor: values are not written in place (a pending graph may still read "
                            "them); build the new value with vkml.where or vkml.scatter_add and "
                            "store it with t.assign_(new)")

    def reshape(self, *shape):
        return reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], numbers.Integral)
                       else shape)

    view = reshape

    def transpose(self, *axes):
        return transpose(self, axes[0] if len(axes) == 1 and not isinstance(axes[0], numbers.Integral)
                         else (axes or None))

    def permute(self, *axes):
        return self.transpose(*axes)

    @property
    def T(self):
        return transpose(self)

    def astype(self, dtype):
        return cast(self, dtype)

    def float(self):
        return cast(self, np.float32)

    def double(self):
        return cast(self, np.float64)

    def long(self):
        return cast(self, np.int64)

    def int(self):
        return cast(self, np.int32)

    def sum(self, axis=None, keepdims=False):
        return sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return min(self, axis, keepdims)

    def argmax(self, axis=None):
        return argmax(self, axis)

    def argmin(self, axis=None):
        return argmin(self, axis)

    def flatten(self, start_dim=0, end_dim=-1):
        return flatten(self, start_dim, end_dim)

    def squeeze(self, axis=None):
        return squeeze(self, axis)

    def unsqueeze(self, axis):
        return expand_dims(self, axis)

    def expand_dims(self, axis):
        return expand_dims(self, axis)

    def broadcast_to(self, shape):
        return broadcast_to(self, shape)

    def swapaxes(self, a, b):
        return swapaxes(self, a, b)

    def clip(self, lo=None, hi=None):
        return clip(self, lo, hi)

    def exp(self):
        return exp(self)

    def log(self):
        return log(self)

    def sin(self):
        return sin(self)

    def cos(self):
        return cos(self)

    def tanh(self):
        return tanh(self)

    def sqrt(self):
        return sqrt(self)

    def abs(self):
        return abs(self)

    def relu(self):
        return relu(self)

    def sigmoid(self):
        return sigmoid(self)

    def softmax(self, axis=-1):
        return softmax(self, axis)

    def log_softmax(self, axis=-1):
        return log_softmax(self, axis)

    def pow(self, y):
        return pow(self, y)

    def matmul(self, y):
        return matmul(self, y)

    def any(self, axis=None):
        return greater(sum(cast(self, bool), axis), 0)

    def all(self, axis=None):
        return equal(sum(logical_not(cast(self, bool)), axis), 0)

    # operators
    def __neg__(self):
        return neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return abs(self)

    def __invert__(self):
        return logical_not(self)

    def __add__(self, y):
        return add(self, y)

    def __radd__(self, y):
        return add(y, self)

    def __sub__(self, y):
        return sub(self, y)

    def __rsub__(self, y):
        return sub(y, self)

    def __mul__(self, y):
        return mul(self, y)

    def __rmul__(self, y):
        return mul(y, self)

    def __truediv__(self, y):
        return div(self, y)

    def __rtruediv__(self, y):
        return div(y, self)

    def __floordiv__(self, y):
        return floor_divide(self, y)

    def __rfloordiv__(self, y):
        return floor_divide(y, self)

    def __pow__(self, y):
        return pow(self, y)

    def __rpow__(self, y):
        return pow(y, self)

    def __matmul__(self, y):
        return matmul(self, y)

    def __rmatmul__(self, y):
        return matmul(y, self)

    def __and__(self, y):
        return logical_and(self, y)

    def __or__(self, y):
        return logical_or(self, y)

    def __eq__(self, y):
        return equal(self, y)

    def __ne__(self, y):
        return not_equal(self, y)

    def __lt__(self, y):
        return less(self, y)

    def __le__(self, y):
        return less_equal(self, y)

    def __gt__(self, y):
        return greater(self, y)

    def __ge__(self, y):
        return greater_equal(self, y)

    def __mod__(self, y):
        return mod(self, y)

    def __rmod__(self, y):
        return mod(y, self)

    def var(self, axis=None, ddof=0, keepdims=False):
        return var(self, axis, ddof, keepdims)

    def std(self, axis=None, ddof=0, keepdims=False):
        return std(self, axis, ddof, keepdims)

    # NumPy's protocols: np.exp(t), np.sum(t, axis=0), ... run vkml's own (lazy, differentiable) ops
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from .array_protocol import array_ufunc  # local: cycle (it imports this module)
        return array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from .array_protocol import array_function  # local: cycle (it imports this module)
        return array_function(func, types, args, kwargs)

    __hash__ = object.__hash__


# -- making tensors -------------------------------------------------------------------------------

def _check_grad_dtype(var, what):
    if var.dtype.kind != "f":
        raise GradError(f"{what}: only floating tensors can require grad, got "
                        f"{dtype_name(var.dtype)}; cast it with .astype(np.float32) first")


def tensor(data, dtype=None, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` (array, list or number)."""
    requires_grad = check_bool(requires_grad, "requires_grad", "tensor")
    if isinstance(data, Tensor):
        data = data.numpy()
    if isinstance(data, (str, bytes, dict, set)) or data is None:
        raise ArgumentError(f"tensor: cannot make a tensor from {type(data).__name__}; "
                            "pass a number, a (nested) list of numbers or a NumPy array")
    var = api.constant(data, dtype)     # refuses what is not numeric data, naming it
    if requires_grad:
        _check_grad_dtype(var, "tensor(requires_grad=True)")
    t = Tensor(var, requires_grad)
    t._register_leaf()
    return t


def as_tensor(x) -> Tensor:
    """``x`` itself if it is a Tensor, else a new one holding it (NumPy's protocols use it too)."""
    return x if isinstance(x, Tensor) else tensor(x)


def zeros(shape, dtype=np.float32, requires_grad=False):
    return _filled("zeros", shape, 0, dtype, requires_grad)


def ones(shape, dtype=np.float32, requires_grad=False):
    return _filled("ones", shape, 1, dtype, requires_grad)


def full(shape, value, dtype=None, requires_grad=False):
    return _filled("full", shape, value, dtype, requires_grad)


def _filled(op, shape, value, dtype, requires_grad):
    """A new leaf of ``shape`` holding ``value`` everywhere, its arguments checked first."""
    shape = check_shape(shape, op)
    if not isinstance(value, (bool, np.bool_, numbers.Real)):
        raise ArgumentError(f"{op}: the fill value must be a real number, got {describe(value)}")
    dtype = check_dtype(dtype, op) if dtype is not None else None
    requires_grad = check_bool(requires_grad, "requires_grad", op)
    with host_memory(op, f"shape {shape}"):
        return tensor(np.full(shape, value, dtype=dtype), requires_grad=requires_grad)


def arange(*args, dtype=None):
    """NumPy's ``arange(stop)``, ``arange(start, stop)`` or ``arange(start, stop, step)``."""
    if not 1 <= len(args) <= 3:
        raise ArgumentError(f"arange: takes stop, (start, stop) or (start, stop, step), got "
                            f"{len(args)} arguments")
    names = {1: ["stop"], 2: ["start", "stop"], 3: ["start", "stop", "step"]}[len(args)]
    bounds = [check_real(a, name, "arange") for a, name in zip(args, names)]
    if len(bounds) == 3 and bounds[2] == 0:
        raise ArgumentError("arange: step must not be 0")
    start, stop, step = ([0.0] * (len(bounds) == 1) + bounds + [1.0])[:3]
    span = (stop - start) / step
    if span > MAX_ELEMENTS:
        raise ShapeError(f"arange: [{start}, {stop}) in steps of {step} has more elements than an "
                         "array can hold; use a smaller range or a larger step")
    dtype = check_dtype(dtype, "arange") if dtype is not None else None
    with host_memory("arange", f"{span:.0f} elements"):
        try:
            values = np.arange(*args, dtype=dtype)
        except (TypeError, ValueError) as err:      # bounds past int64, a bool dtype, ...
            raise ArgumentError(f"arange: cannot make the range {args} ({err})") from None
    return tensor(values)


def zeros_like(t, requires_grad=False):
    t = as_tensor(t)
    return zeros(t.shape, t.dtype, requires_grad)


def ones_like(t, requires_grad=False):
    t = as_tensor(t)
    return ones(t.shape, t.dtype, requires_grad)


# -- applying operations ---------------------------------------------------------------------------

#: How deep in nested lists tensors are looked for.  They sit a level or two down (concatenate's
#: operands); deeper lists are plain data for NumPy, and one nested thousands deep must not
#: exhaust Python's recursion here.
_MAX_NESTING = 32


def _unwrap(x, depth=0):
    if isinstance(x, Tensor):
        return x.ir_var
    if isinstance(x, (list, tuple)) and depth < _MAX_NESTING:
        return type(x)(_unwrap(v, depth + 1) for v in x)
    return x


def _unwrap_index(index):
    if isinstance(index, tuple):
        return tuple(_unwrap(i) for i in index)
    return _unwrap(index)


def needs_grad(args, depth=0):
    """Whether a Tensor among ``args`` (or in lists and tuples among them) requires grad."""
    for a in args:
        if isinstance(a, Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)) and depth < _MAX_NESTING and needs_grad(a, depth + 1):
            return True
    return False


def apply_api(fn, *args, **kwargs):
    """Run an ``api`` function on the Vars of tensor arguments and wrap the result.

    Every function on Tensors is one of these calls: vkml's own and ``vkml.numpy``'s."""
    with runtime.user_line():
        out = fn(*[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()})
    requires = runtime.is_grad_enabled() and out.dtype.kind == "f" and \
        needs_grad(args + tuple(kwargs.values()))
    t = Tensor(out, requires)
    if runtime.is_eager() and not runtime.is_traced(out):
        realize(t)
    return t


def _lift(fn, name=None):
    def op(*args, **kwargs):
        return apply_api(fn, *args, **kwargs)
    op.__name__ = name or fn.__name__
    op.__qualname__ = op.__name__
    op.__doc__ = fn.__doc__
    return op


add = _lift(api.add)
sub = _lift(api.sub)
mul = _lift(api.mul)
div = _lift(api.div)
floor_divide = _lift(api.floor_divide)
pow = _lift(api.pow)
maximum = _lift(api.maximum)
minimum = _lift(api.minimum)
equal = _lift(api.equal)
not_equal = _lift(api.not_equal)
less = _lift(api.less)
less_equal = _lift(api.less_equal)
greater = _lift(api.greater)
greater_equal = _lift(api.greater_equal)
logical_and = _lift(api.logical_and)
logical_or = _lift(api.logical_or)
logical_not = _lift(api.logical_not)
neg = _lift(api.neg)
exp = _lift(api.exp)
log = _lift(api.log)
sin = _lift(api.sin)
cos = _lift(api.cos)
tanh = _lift(api.tanh)
sqrt = _lift(api.sqrt)
abs = _lift(api.abs)
sign = _lift(api.sign)
relu = _lift(api.relu)
sigmoid = _lift(api.sigmoid)
square = _lift(api.square)
clip = _lift(api.clip)
where = _lift(api.where)
cast = _lift(api.cast)
stop_gradient = _lift(api.stop_gradient)
sum = _lift(api.sum)
mean = _lift(api.mean)
max = _lift(api.max)
min = _lift(api.min)
argmax = _lift(api.argmax)
argmin = _lift(api.argmin)
logsumexp = _lift(api.logsumexp)
log_softmax = _lift(api.log_softmax)
softmax = _lift(api.softmax)
reshape = _lift(api.reshape)
broadcast_to = _lift(api.broadcast_to)
transpose = _lift(api.transpose)
permute = transpose
swapaxes = _lift(api.swapaxes)
expand_dims = _lift(api.expand_dims)
squeeze = _lift(api.squeeze)
flatten = _lift(api.flatten)
pad = _lift(api.pad)
concatenate = _lift(api.concatenate)
stack = _lift(api.stack)
flip = _lift(api.flip)
gather = _lift(api.gather)
scatter_add = _lift(api.scatter_add)
take = _lift(api.take)
take_along_axis = _lift(api.take_along_axis)
matmul = _lift(api.matmul)
dot = matmul
conv2d = _lift(api.conv2d)
max_pool2d = _lift(api.max_pool2d)
avg_pool2d = _lift(api.avg_pool2d)


# -- compositions NumPy users expect -------------------------------------------------------------------

def var(x, axis=None, ddof=0, keepdims=False):
    """The variance, as ``np.var``: the summed squared deviation from the mean over ``axis``,
    divided by ``n - ddof`` (``ddof=1`` for the unbiased estimate).  Built from mean, sub, mul and
    sum, so it is lazy and has a gradient; integer input gives float64, as in NumPy."""
    x = as_tensor(x)
    if not isinstance(ddof, numbers.Real) or isinstance(ddof, bool):
        raise ArgumentError(f"var: ddof must be a number (0 for the population variance, 1 for "
                            f"the sample variance), got {type(ddof).__name__}")
    axes = api.normalize_axes("var", x.ndim, axis)
    count = math.prod(x.shape[a] for a in axes)
    if x.dtype.kind != "f":
        x = cast(x, np.float64)
    deviation = x - mean(x, axis, keepdims=True)
    return sum(deviation * deviation, axis, keepdims) / float(count - ddof)


def std(x, axis=None, ddof=0, keepdims=False):
    """The standard deviation, as ``np.std``: ``sqrt(var(x, axis, ddof, keepdims))``."""
    return sqrt(var(x, axis, ddof, keepdims))


mod = _lift(numeric.mod)
mod.__doc__ = """The remainder with the divisor's sign, as Python's ``%`` and ``np.mod`` (an integer
divisor of 0 gives 0, as NumPy does); d(x % y)/dx = 1."""


# -- realize ------------------------------------------------------------------------------------------

def realize(tensors) -> None:
    """Compute every pending tensor in ``tensors`` (one or a list) in ONE submission.

    Idempotent: tensors that already hold values cost nothing.
    """
    ts = [tensors] if isinstance(tensors, Tensor) else check_sequence(tensors, "tensors", "realize")
    for t in ts:
        if not isinstance(t, Tensor):
            raise ArgumentError(f"realize: expected Tensors, got {type(t).__name__}")
    # a tensor that requires grad keeps the graph behind it (a backward will go through it)
    runtime.realize([t.ir_var for t in ts], [t.requires_grad for t in ts])


# -- assign -------------------------------------------------------------------------------------------

def assign(destinations, sources) -> None:
    """Write ``sources[i]`` into ``destinations[i]`` for every i, as ONE submission.

    The batched ``dst.assign_(src)``: an optimiser step is one assignment per
    parameter, and a loop would pay one submission each.  Every pair is
    checked before anything is written, so a bad pair changes nothing.
    Because values are never written in place, sources that read
    destinations (a swap, ``p.assign_(p - lr * g)``) see the old values and
    never need a per-pair fallback.
    """
    dsts = check_sequence(destinations, "destinations", "assign")
    srcs = check_sequence(sources, "sources", "assign")
    if len(dsts) != len(srcs):
        raise ArgumentError(f"assign: {len(dsts)} destinations but {len(srcs)} sources")
    src_vars = []
    for i, (d, s) in enumerate(zip(dsts, srcs)):
        if not isinstance(d, Tensor):
            raise ArgumentError(f"assign: destination {i} is a {type(d).__name__}, not a Tensor")
        v = s.ir_var if isinstance(s, Tensor) else api.constant(s, d.dtype)
        if v.shape != d.shape:
            if v.ndim == 0:
                v = api.broadcast_to(v, d.shape)
            else:
                raise ShapeError(f"assign: source {i} has shape {v.shape} but destination has "
                                 f"{d.shape}; reshape the source first")
        if v.dtype != d.dtype:
            raise DTypeError(f"assign: source {i} is {dtype_name(v.dtype)} but destination is "
                             f"{dtype_name(d.dtype)}; cast the source with .astype()")
        src_vars.append(v)
    runtime.realize(src_vars, keep_history=False)
    for d, v in zip(dsts, src_vars):
        d.ir_var = Var(*v.aval, value=v.value)
        d._register_leaf()


# -- backward -----------------------------------------------------------------------------------------

def backward(root) -> None:
    """Accumulate d(root)/d(leaf) into ``leaf.grad`` for every leaf that requires grad.

    ``root`` must be a 0-d floating tensor (the seed is 1).  Gradients ADD to
    ``.grad`` (call ``zero_grad`` between steps).  The backward program is
    derived from the forward one by linearize + transpose, cached by the
    forward graph's structure, and run in ONE submission with the root's value.
    """
    if not isinstance(root, Tensor):
        raise ArgumentError(f"backward: expected a Tensor, got {type(root).__name__}")
    if root.shape != ():
        raise GradError(f"backward: the root must be a 0-d tensor, got shape {format_shape(root.shape)}; "
                        "reduce it to a scalar first (e.g. loss.sum() or loss.mean())")
    if not root.requires_grad:
        raise GradError("backward: the root does not require grad; create its inputs with "
                        "vkml.tensor(..., requires_grad=True)")
    for t, g in runtime.backward(root.ir_var):
        t.grad = Tensor(Var(*t.ir_var.aval, value=g))
