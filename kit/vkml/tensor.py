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

import numbers
from sys import getrefcount

import numpy as np

from . import pytree, runtime
from .errors import ArgumentError, DTypeError, GradError, ShapeError, TracingError, boundary
from .ir import EXACT_REFCOUNTS, Var, dtype_name, format_shape
from .interchange import Interchange
from .ops import api, bitwise, convolution, numeric, recipes
from .validate import check_bool, check_int, check_sequence, describe


class Operators:
    """Python's operators on tensors: each is the function of the same name (``x + y`` is
    ``vkml.add(x, y)``, ``x @ y`` is ``vkml.matmul(x, y)``, ``x == y`` an elementwise comparison),
    with the reflected forms for a NumPy array or a number on the left.

    >>> x = vkml.tensor([1.0, 2.0])
    >>> (2 * x + 1) ** 2, -x == vkml.neg(x)
    (tensor([ 9., 25.], dtype=float64), tensor([ True,  True], dtype=bool))
    """

    __slots__ = ()

    def __neg__(self):
        return neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return abs(self)

    def __invert__(self):
        return logical_not(self) if self.dtype.kind == "b" else _numeric_method(bitwise.invert, self)

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
        return _numeric_method(numeric.floor_divide, self, y)      # floats too, as NumPy's //

    def __rfloordiv__(self, y):
        return _numeric_method(numeric.floor_divide, y, self)

    def __pow__(self, y):
        return pow(self, y)

    def __rpow__(self, y):
        return pow(y, self)

    def __matmul__(self, y):
        return matmul(self, y)

    def __rmatmul__(self, y):
        return matmul(y, self)

    def __and__(self, y):
        return logical_and(self, y) if _logical(self, y) else _numeric_method(bitwise.bitwise_and, self, y)

    def __rand__(self, y):
        return logical_and(y, self) if _logical(self, y) else _numeric_method(bitwise.bitwise_and, y, self)

    def __or__(self, y):
        return logical_or(self, y) if _logical(self, y) else _numeric_method(bitwise.bitwise_or, self, y)

    def __ror__(self, y):
        return logical_or(y, self) if _logical(self, y) else _numeric_method(bitwise.bitwise_or, y, self)

    def __xor__(self, y):
        if _logical(self, y):
            return not_equal(cast(self, bool), cast(y, bool))
        return _numeric_method(bitwise.bitwise_xor, self, y)

    def __rxor__(self, y):
        if _logical(self, y):
            return not_equal(cast(y, bool), cast(self, bool))
        return _numeric_method(bitwise.bitwise_xor, y, self)

    def __lshift__(self, y):
        return _numeric_method(bitwise.left_shift, self, y)

    def __rlshift__(self, y):
        return _numeric_method(bitwise.left_shift, y, self)

    def __rshift__(self, y):
        return _numeric_method(bitwise.right_shift, self, y)

    def __rrshift__(self, y):
        return _numeric_method(bitwise.right_shift, y, self)

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


class Tensor(Operators, Interchange):
    """A lazy n-dimensional array that can carry gradients (see the module docstring).

    >>> x = vkml.tensor([[1.0, 2.0, 3.0]])
    >>> x.shape, x.ndim, x.size, x.dtype, x.device
    ((1, 3), 2, 3, dtype('float64'), 'CPU')
    >>> x.is_leaf, (x + 1).is_leaf
    (True, False)
    >>> (x * 2).sum()
    tensor(12., dtype=float64)
    """

    __slots__ = ("ir_var", "requires_grad", "grad", "__weakref__")
    __array_priority__ = 1000  # so ndarray * Tensor calls Tensor.__rmul__

    def __init__(self, var: Var, requires_grad: bool = False):
        if not isinstance(var, Var):
            raise ArgumentError(f"Tensor: wraps an IR Var, got {describe(var)}; make tensors with "
                                "vkml.tensor(data)")
        self.ir_var = var
        self.requires_grad = requires_grad
        self.grad = None

    def __del__(self):
        """Free the graph behind this tensor now, when this was the last handle on it.

        A pending Var and its equation refer to each other, so a graph no one can reach any more
        waits for Python's cycle collector; until then it holds every array it reads (last
        step's parameters, a realized loss) and the collector's passes over such graphs cost a
        training loop tens of microseconds a step.  See :func:`_release`."""
        if not EXACT_REFCOUNTS:
            return
        try:
            var = self.ir_var
            if var.eqn is None or getrefcount(var) > _HELD_BY_DYING_TENSOR:
                return      # a leaf, or still read: by a later equation, a tensor, the tape
            stack = [var]
            del var
            self.ir_var = None
            _release(stack)
        except Exception:  # noqa: BLE001 (never set; the interpreter shutting down)
            pass

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
        """Run the pending work behind this tensor (one submission) and return it.

        >>> y = vkml.tensor([1.0]) + 1
        >>> y.realize() is y
        True
        """
        realize(self)
        return self

    def numpy(self) -> np.ndarray:
        """The value as a read-only NumPy array (realizes if pending).

        >>> vkml.tensor([1.0, 2.0]).numpy()
        array([1., 2.])
        """
        try:
            realize(self)
        except TracingError:
            raise self._untraced(".numpy()") from None
        var = self.ir_var
        out = np.asarray(var.value).view()
        if runtime.WRITING and runtime.settled(var):     # a step in another thread wrote it
            return self.numpy()
        out.flags.writeable = False
        return out

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr.astype(dtype) if dtype is not None else np.array(arr)

    def item(self):
        """The one element as a Python number (realizes if pending).

        >>> vkml.tensor([[2.5]]).item()
        2.5
        """
        if self.size != 1:
            raise ShapeError(f"item: needs a tensor with one element, got shape {self.shape}; "
                             "reduce it first (e.g. .sum())")
        if runtime.is_traced(self.ir_var):
            raise self._untraced(".item()")
        return self.numpy().reshape(()).item()

    def tolist(self):
        """The values as nested Python lists (realizes if pending).

        >>> vkml.tensor([[1, 2], [3, 4]]).tolist()
        [[1, 2], [3, 4]]
        """
        return self.numpy().tolist()

    def _concrete(self, what):
        if runtime.is_traced(self.ir_var):
            raise self._untraced(what)
        return self.item()

    def _untraced(self, what) -> TracingError:
        """The error for ``what`` (``.numpy()``, ``float()``, ``bool()``...) of a value that is
        being traced (inside ``jit``, ``grad``, ``vmap``, ``scan``...): it names the call, the
        value and the user's line, and says what to do instead."""
        site = runtime.user_site_text()
        where = f" at {site}" if site else ""
        if what in ("bool()", "an index"):
            fix = ("use vkml.where for a choice made per element, or vkml.cond / vkml.while_loop "
                   "for control flow")
        else:
            fix = ("return it from the traced function to look at it, or compute it outside "
                   "the trace")
        return TracingError(f"{what} of a traced value ({self.ir_var.type_str()}){where}: inside "
                            "vkml.jit, grad, vmap or scan a value has no data until the traced "
                            f"function returns; {fix}")

    def __bool__(self):
        if self.size != 1:
            raise ShapeError(f"the truth value of a tensor of shape {self.shape} is ambiguous; "
                             "use .any() or .all()")
        return bool(self._concrete("bool()"))

    def __float__(self):
        return float(self._concrete("float()"))

    def __complex__(self):
        return complex(self._concrete("complex()"))

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
    @boundary
    def backward(self):
        """Accumulate the gradient of this scalar into the ``.grad`` of every leaf that requires it (:func:`vkml.backward`).

        >>> x = vkml.tensor(2.0, requires_grad=True)
        >>> (x * x).backward()
        >>> x.grad
        tensor(4., dtype=float64)
        """
        backward(self)

    def detach(self) -> "Tensor":
        """The same values, cut from the gradient graph.

        >>> x = vkml.tensor([1.0], requires_grad=True)
        >>> x.detach().requires_grad
        False
        """
        if self.ir_var.value is not None:
            return Tensor(Var(*self.ir_var.aval, value=self.ir_var.value))
        return Tensor(api.stop_gradient(self.ir_var))

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        """Mark this leaf as needing a gradient (or not, with ``False``); returns it.

        >>> w = vkml.zeros(2).requires_grad_()
        >>> w.requires_grad
        True
        """
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
        """Drop ``.grad`` (backward accumulates into it).

        >>> x = vkml.tensor(1.0, requires_grad=True)
        >>> (x * 3).backward()
        >>> x.zero_grad()
        >>> x.grad is None
        True
        """
        self.grad = None

    # -- in place ----------------------------------------------------------------------------
    def assign_(self, src) -> "Tensor":
        """Give this tensor ``src``'s values in place (see :func:`vkml.assign` for many at once); returns it.

        >>> t = vkml.zeros(2)
        >>> t.assign_([1.0, 2.0])
        tensor([1., 2.], dtype=float32)
        >>> t
        tensor([1., 2.], dtype=float32)
        """
        assign([self], [src])
        return self

    # -- methods delegate to the functional forms -----------------------------------------------
    def __getitem__(self, index):
        index = _unwrap_index(index)
        return _apply(api.getitem, (self, index), {}, _is_basic_index(index))

    def __setitem__(self, index, value):
        raise ArgumentError("Tensor: values are not written in place (a pending graph may still read "
                            "them); build the new value with vkml.where or vkml.scatter_add and "
                            "store it with t.assign_(new)")

    def reshape(self, *shape):
        """The same elements in a new shape (:func:`vkml.reshape`); the shape may be given as separate ints.

        >>> vkml.arange(6).reshape(2, 3).shape
        (2, 3)
        """
        return reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], numbers.Integral)
                       else shape)

    view = reshape

    def transpose(self, *axes):
        """The axes reordered (reversed when none are given; :func:`vkml.transpose`).

        >>> vkml.zeros((2, 3)).transpose().shape
        (3, 2)
        """
        return transpose(self, axes[0] if len(axes) == 1 and not isinstance(axes[0], numbers.Integral)
                         else (axes or None))

    def permute(self, *axes):
        """The axes in the order given, as PyTorch's ``permute``.

        >>> vkml.zeros((2, 3, 4)).permute(2, 0, 1).shape
        (4, 2, 3)
        """
        return self.transpose(*axes)

    @property
    def T(self):
        """The axes reversed (the transpose of a matrix).

        >>> vkml.zeros((2, 3)).T.shape
        (3, 2)
        """
        return transpose(self)

    def astype(self, dtype):
        """The values converted to ``dtype`` (:func:`vkml.cast`).

        >>> vkml.tensor([1.5, 2.5]).astype('int64')
        tensor([1, 2], dtype=int64)
        """
        return cast(self, dtype)

    def float(self):
        """The values as float32.

        >>> vkml.tensor([1, 2]).float().dtype
        dtype('float32')
        """
        return cast(self, np.float32)

    def double(self):
        """The values as float64.

        >>> vkml.tensor([1, 2]).double().dtype
        dtype('float64')
        """
        return cast(self, np.float64)

    def long(self):
        """The values as int64 (floats truncate towards zero).

        >>> vkml.tensor([1.9, -1.9]).long()
        tensor([ 1, -1], dtype=int64)
        """
        return cast(self, np.int64)

    def int(self):
        """The values as int32 (floats truncate towards zero).

        >>> vkml.tensor([1.9, -1.9]).int()
        tensor([ 1, -1], dtype=int32)
        """
        return cast(self, np.int32)

    def sum(self, axis=None, keepdims=False):
        """The sum over ``axis`` (:func:`vkml.sum`).

        >>> vkml.tensor([[1, 2], [3, 4]]).sum(axis=1)
        tensor([3, 7], dtype=int64)
        """
        return sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        """The mean over ``axis`` (:func:`vkml.mean`).

        >>> vkml.tensor([1.0, 2.0, 6.0]).mean()
        tensor(3., dtype=float64)
        """
        return mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        """The largest element over ``axis`` (:func:`vkml.max`).

        >>> vkml.tensor([1.0, 4.0, 2.0]).max()
        tensor(4., dtype=float64)
        """
        return max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        """The smallest element over ``axis`` (:func:`vkml.min`).

        >>> vkml.tensor([1.0, 4.0, 2.0]).min()
        tensor(1., dtype=float64)
        """
        return min(self, axis, keepdims)

    def argmax(self, axis=None):
        """The index of the largest element (:func:`vkml.argmax`).

        >>> vkml.tensor([1.0, 4.0, 2.0]).argmax()
        tensor(1, dtype=int64)
        """
        return argmax(self, axis)

    def argmin(self, axis=None):
        """The index of the smallest element (:func:`vkml.argmin`).

        >>> vkml.tensor([1.0, 4.0, 2.0]).argmin()
        tensor(0, dtype=int64)
        """
        return argmin(self, axis)

    def flatten(self, start_dim=0, end_dim=-1):
        """Axes ``start_dim..end_dim`` merged into one (:func:`vkml.flatten`).

        >>> vkml.zeros((2, 3)).flatten().shape
        (6,)
        """
        return flatten(self, start_dim, end_dim)

    def squeeze(self, axis=None):
        """Axes of size 1 removed (:func:`vkml.squeeze`).

        >>> vkml.zeros((1, 3)).squeeze().shape
        (3,)
        """
        return squeeze(self, axis)

    def unsqueeze(self, axis):
        """A new axis of size 1 at ``axis`` (PyTorch's name for :meth:`expand_dims`).

        >>> vkml.zeros(3).unsqueeze(0).shape
        (1, 3)
        """
        return expand_dims(self, axis)

    def expand_dims(self, axis):
        """A new axis of size 1 at ``axis`` (:func:`vkml.expand_dims`).

        >>> vkml.zeros(3).expand_dims(1).shape
        (3, 1)
        """
        return expand_dims(self, axis)

    def broadcast_to(self, shape):
        """Repeated along new or size-1 axes to ``shape`` (:func:`vkml.broadcast_to`).

        >>> vkml.tensor([1.0, 2.0]).broadcast_to((2, 2))
        tensor([[1., 2.],
                [1., 2.]], dtype=float64)
        """
        return broadcast_to(self, shape)

    def swapaxes(self, a, b):
        """Axes ``a`` and ``b`` exchanged (:func:`vkml.swapaxes`).

        >>> vkml.zeros((2, 3)).swapaxes(0, 1).shape
        (3, 2)
        """
        return swapaxes(self, a, b)

    def clip(self, lo=None, hi=None):
        """Each element limited to ``[lo, hi]`` (:func:`vkml.clip`).

        >>> vkml.tensor([-1.0, 0.5, 2.0]).clip(0.0, 1.0)
        tensor([0. , 0.5, 1. ], dtype=float64)
        """
        return clip(self, lo, hi)

    def exp(self):
        """``e ** x`` elementwise (:func:`vkml.exp`).

        >>> vkml.tensor([0.0]).exp()
        tensor([1.], dtype=float64)
        """
        return exp(self)

    def log(self):
        """The natural logarithm, elementwise (:func:`vkml.log`).

        >>> vkml.tensor([1.0]).log()
        tensor([0.], dtype=float64)
        """
        return log(self)

    def sin(self):
        """The sine, elementwise (:func:`vkml.sin`).

        >>> vkml.tensor([0.0]).sin()
        tensor([0.], dtype=float64)
        """
        return sin(self)

    def cos(self):
        """The cosine, elementwise (:func:`vkml.cos`).

        >>> vkml.tensor([0.0]).cos()
        tensor([1.], dtype=float64)
        """
        return cos(self)

    def tanh(self):
        """The hyperbolic tangent, elementwise (:func:`vkml.tanh`).

        >>> vkml.tensor([0.0]).tanh()
        tensor([0.], dtype=float64)
        """
        return tanh(self)

    def sqrt(self):
        """The square root, elementwise (:func:`vkml.sqrt`).

        >>> vkml.tensor([4.0]).sqrt()
        tensor([2.], dtype=float64)
        """
        return sqrt(self)

    def abs(self):
        """``|x|`` elementwise (:func:`vkml.abs`; also ``abs(t)``).

        >>> vkml.tensor([-2.0]).abs()
        tensor([2.], dtype=float64)
        """
        return abs(self)

    def relu(self):
        """``max(x, 0)`` elementwise (:func:`vkml.relu`).

        >>> vkml.tensor([-1.0, 1.0]).relu()
        tensor([0., 1.], dtype=float64)
        """
        return relu(self)

    def sigmoid(self):
        """``1 / (1 + exp(-x))`` elementwise (:func:`vkml.sigmoid`).

        >>> vkml.tensor([0.0]).sigmoid()
        tensor([0.5], dtype=float64)
        """
        return sigmoid(self)

    def softmax(self, axis=-1):
        """``exp(x) / sum(exp(x))`` along ``axis`` (:func:`vkml.softmax`).

        >>> vkml.tensor([0.0, 0.0]).softmax()
        tensor([0.5, 0.5], dtype=float64)
        """
        return softmax(self, axis)

    def log_softmax(self, axis=-1):
        """``x - logsumexp(x)`` along ``axis`` (:func:`vkml.log_softmax`).

        >>> vkml.tensor([0.0, 0.0]).log_softmax()
        tensor([-0.69314718, -0.69314718], dtype=float64)
        """
        return log_softmax(self, axis)

    def pow(self, y):
        """``x ** y`` elementwise (:func:`vkml.pow`).

        >>> vkml.tensor([2.0, 3.0]).pow(2)
        tensor([4., 9.], dtype=float64)
        """
        return pow(self, y)

    def matmul(self, y):
        """The matrix product ``x @ y`` (:func:`vkml.matmul`).

        >>> vkml.tensor([[1.0, 2.0]]).matmul(vkml.tensor([[1.0], [1.0]]))
        tensor([[3.]], dtype=float64)
        """
        return matmul(self, y)

    @property
    def mT(self):
        """The last two axes swapped (the transpose of each matrix in a stack).

        >>> vkml.zeros((4, 2, 3)).mT.shape
        (4, 3, 2)
        """
        return _numeric_method(api.swapaxes, self, -1, -2)

    def cumsum(self, axis=None):
        """The running sum along ``axis`` (flattened when None), as NumPy's.

        >>> vkml.tensor([1, 2, 3]).cumsum()
        tensor([1, 3, 6], dtype=int64)
        """
        return _numeric_method(numeric.cumsum, self, axis)

    def cumprod(self, axis=None):
        """The running product along ``axis`` (flattened when None).

        >>> vkml.tensor([1.0, 2.0, 3.0]).cumprod()
        tensor([1., 2., 6.], dtype=float64)
        """
        return _numeric_method(numeric.cumprod, self, axis)

    def prod(self, axis=None, keepdims=False):
        """The product over ``axis``.

        >>> vkml.tensor([[1.0, 2.0], [3.0, 4.0]]).prod(axis=1)
        tensor([ 2., 12.], dtype=float64)
        """
        return _numeric_method(numeric.prod, self, axis, check_bool(keepdims, "keepdims", "prod"))

    def ravel(self):
        """The elements as one axis.

        >>> vkml.tensor([[1, 2], [3, 4]]).ravel()
        tensor([1, 2, 3, 4], dtype=int64)
        """
        return _numeric_method(numeric.ravel, self)

    def round(self, decimals=0):
        """Rounded half to even at ``decimals`` places; derivative zero.

        >>> vkml.tensor([0.5, 1.5, 2.25]).round(1)
        tensor([0.5, 1.5, 2.2], dtype=float64)
        """
        return _numeric_method(numeric.round, self, check_int(decimals, "decimals", "round", -308, 308))

    def dot(self, y):
        """NumPy's ``dot`` (the matrix product up to 2-D).

        >>> vkml.tensor([1.0, 2.0]).dot(vkml.tensor([3.0, 4.0]))
        tensor(11., dtype=float64)
        """
        return _numeric_method(numeric.dot, self, y)

    def copy(self):
        """The same values (a Tensor never changes, so no data is copied); the gradient flows
        through it, as through NumPy's ``copy``.

        >>> vkml.tensor([1.0]).copy()
        tensor([1.], dtype=float64)
        """
        return _numeric_method(api.reshape, self, self.shape)

    def any(self, axis=None):
        """Whether any element is non-zero (over ``axis``).

        >>> vkml.tensor([0, 0, 3]).any()
        tensor(True, dtype=bool)
        """
        return greater(sum(cast(self, bool), axis), 0)

    def all(self, axis=None):
        """Whether every element is non-zero (over ``axis``).

        >>> vkml.tensor([1, 0, 3]).all()
        tensor(False, dtype=bool)
        """
        return equal(sum(logical_not(cast(self, bool)), axis), 0)

    # operators
    def var(self, axis=None, ddof=0, keepdims=False):
        """The variance over ``axis`` (:func:`vkml.var`).

        >>> vkml.tensor([1.0, 3.0]).var()
        tensor(1., dtype=float64)
        """
        return var(self, axis, ddof, keepdims)

    def std(self, axis=None, ddof=0, keepdims=False):
        """The standard deviation over ``axis`` (:func:`vkml.std`).

        >>> vkml.tensor([1.0, 3.0]).std()
        tensor(1., dtype=float64)
        """
        return std(self, axis, ddof, keepdims)

    # NumPy's protocols: np.exp(t), np.sum(t, axis=0), ... run vkml's own (lazy, differentiable) ops
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from .array_protocol import array_ufunc  # local: cycle (it imports this module)
        return array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from .array_protocol import array_function  # local: cycle (it imports this module)
        return array_function(func, types, args, kwargs)

    __hash__ = object.__hash__


def _check_grad_dtype(var, what):
    if var.dtype.kind not in "fc":
        raise GradError(f"{what}: only floating tensors can require grad, got "
                        f"{dtype_name(var.dtype)}; cast it with .astype(np.float32) first")


def tensor(data, dtype=None, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` (array, list or number).

    >>> vkml.tensor([1.0, 2.0])
    tensor([1., 2.], dtype=float64)
    >>> vkml.tensor([1, 2], dtype='float32', requires_grad=True)
    tensor([1., 2.], dtype=float32, requires_grad=True)
    """
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


#: references to a pending Var in ``Tensor.__del__`` when only its own equation holds it besides
#: the dying tensor: the tensor's slot, the equation's outputs, the local name and
#: ``getrefcount``'s argument.  Any more and ``_release`` would leave it (an intermediate
#: result that a later equation reads), so the tensor does not ask it
_HELD_BY_DYING_TENSOR = 4
#: references to a Var that nothing else can reach while ``_release`` looks at it: its
#: equation's outputs, the local name, and ``getrefcount``'s own argument (the same for the
#: equation: the Var's ``eqn``, the local name, the argument)
_UNREACHED = 3


def _release(stack) -> None:
    """Cut the Var/equation cycles of ``stack``'s Vars (and, in turn, of their operands) that
    nothing else refers to, so reference counting frees them at once.

    A Var is cut (its ``eqn`` set to None, which frees the equation) only when the only
    references to it and to its single-output equation are each other's: then no one can
    reach either, and cutting changes nothing anyone can see.  A Var that a live tensor, a
    later equation, a Program or a walk in progress still holds is left as it is, and so is
    everything behind it."""
    pop, push = stack.pop, stack.extend
    while stack:
        var = pop()
        eqn = var.eqn
        if eqn is None or len(eqn.outputs) != 1 or getrefcount(var) > _UNREACHED or \
                getrefcount(eqn) > _UNREACHED:
            continue
        inputs = eqn.inputs
        var.eqn = None
        del eqn, var
        push(inputs)
        del inputs


def as_tensor(x) -> Tensor:
    """``x`` itself if it is a Tensor, else a new one holding it (NumPy's protocols use it too)."""
    return x if isinstance(x, Tensor) else tensor(x)


#: How deep in nested lists tensors are looked for.  They sit a level or two down (concatenate's
#: operands); deeper lists are plain data for NumPy, and one nested thousands deep must not
#: exhaust Python's recursion here.
_MAX_NESTING = 32


def _unwrap(x, depth=0):
    if isinstance(x, Tensor):
        return x.ir_var
    if isinstance(x, (list, tuple)) and depth < _MAX_NESTING:
        items = [_unwrap(v, depth + 1) for v in x]
        if type(x) is list:
            return items
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)   # a namedtuple too
    return x


def _unwrap_index(index):
    if isinstance(index, tuple):
        return tuple(_unwrap(i) for i in index)
    return _unwrap(index)


def _is_basic_index(index) -> bool:
    """Whether ``index`` holds only ints, slices, None and Ellipsis: then ``getitem``'s equations
    depend on nothing else and may be replayed; an array or tensor index is looked at (negative
    entries of a known one are wrapped on the host), so such a call is bound afresh."""
    for item in index if type(index) is tuple else (index,):
        if not (type(item) is int or item is None or item is Ellipsis or type(item) is slice
                and all(type(b) is int or b is None for b in (item.start, item.stop, item.step))):
            return False
    return True


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
    return _apply(fn, args, kwargs, False)


def apply_replayable(fn, *args, **kwargs):
    """:func:`apply_api` for a function on Vars whose equations depend only on its operands'
    types and its other arguments, never on a tensor's values: they are recorded once and
    replayed for operands of the same types (``vkml.ops.recipes``).  A layer that builds its
    forward as one such function pays one operation's host work per call, not one per
    operation inside it (the bench MLP's Linear: three), and binds the same equations."""
    return _apply(fn, args, kwargs, True)


def _apply(fn, args, kwargs, replayable):
    """:func:`apply_api`; ``replayable``: ``fn``'s equations depend only on its operands' types
    and its other arguments (never on a tensor's values), so they are recorded once and replayed
    for operands of the same types (``vkml.ops.recipes``)."""
    # one loop, not a comprehension and a second pass for needs_grad: this runs for every op
    vargs, wants_grad, other = [], False, bool(kwargs)
    for a in args:
        if type(a) is Tensor:
            vargs.append(a.ir_var)
            wants_grad = wants_grad or a.requires_grad
        else:
            vargs.append(_unwrap(a))
            other = True
    vkwargs = {k: _unwrap(v) for k, v in kwargs.items()} if kwargs else kwargs
    if replayable:
        out = recipes.call(fn, vargs, vkwargs, runtime.user_line)
    else:
        with runtime.user_line():
            out = fn(*vargs, **vkwargs)
    requires = runtime.is_grad_enabled() and out.dtype.kind in "fc" and (wants_grad or other and \
        needs_grad(args + tuple(kwargs.values()) if kwargs else args))
    t = Tensor(out, requires)
    if runtime.is_eager() and not runtime.is_traced(out):
        realize(t)
    return t


def _logical(x, y) -> bool:
    """Whether ``x & y`` is logical rather than bitwise: unless both are integers (a Python int
    being one), the operands are read as truth values, as vkml always has."""
    def is_int(v):
        kind = getattr(getattr(v, "dtype", None), "kind", None)
        return kind in ("i", "u") or (type(v) is int)
    return not (is_int(x) and is_int(y))


def _numeric_method(fn, *args):
    """A Tensor method that calls ``fn`` (on Vars) with the tensor and the method's arguments."""
    return _apply(fn, args, {}, False)


def _lift(fn, name=None, replayable=True):
    """The Tensor form of ``api`` function ``fn``; ``replayable=False`` for one that looks at
    a tensor's values while it binds (so recording its equations once would be wrong)."""
    def op(*args, **kwargs):
        return _apply(fn, args, kwargs, replayable)
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
_stop_gradient_leaf = _lift(api.stop_gradient, "stop_gradient")


def stop_gradient(x):
    """The same values, seen as constants by every derivative (the gradient stops here); a
    pytree (dict, list, tuple, registered class) has it applied to each leaf, as in JAX.

    >>> x = vkml.tensor(3.0)
    >>> vkml.grad(lambda x: x * vkml.stop_gradient(x))(x)
    tensor(3., dtype=float64)
    >>> vkml.stop_gradient({"w": vkml.tensor([1.0])})["w"]
    tensor([1.], dtype=float64)
    """
    leaves, tree = pytree.flatten(x)
    if len(leaves) == 1 and leaves[0] is x:
        return _stop_gradient_leaf(x)
    return pytree.unflatten(tree, [_stop_gradient_leaf(leaf) for leaf in leaves])
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
take = _lift(api.take, replayable=False)              # skips wrapping a known index's negatives
take_along_axis = _lift(api.take_along_axis, replayable=False)
matmul = _lift(api.matmul)
dot = matmul
conv2d = _lift(convolution.conv2d)
max_pool2d = _lift(convolution.max_pool2d)
avg_pool2d = _lift(convolution.avg_pool2d)


var = _lift(numeric.var)
var.__doc__ = """The variance, as ``np.var``: the summed squared deviation from the mean over ``axis``,
divided by ``n - ddof`` (``ddof=1`` for the unbiased estimate).  Built from mean, sub, mul and
sum, so it is lazy and has a gradient; integer input gives float64, as in NumPy.

>>> vkml.var(vkml.tensor([1.0, 2.0, 3.0, 4.0]))
tensor(1.25, dtype=float64)
>>> vkml.var(vkml.tensor([1.0, 2.0, 3.0, 4.0]), ddof=1)
tensor(1.66666667, dtype=float64)
"""
std = _lift(numeric.std)
std.__doc__ = """The standard deviation, as ``np.std``: ``sqrt(var(x, axis, ddof, keepdims))``.

>>> vkml.std(vkml.tensor([1.0, 3.0]))
tensor(1., dtype=float64)
"""
mod = _lift(numeric.mod)
mod.__doc__ = """The remainder with the divisor's sign, as Python's ``%`` and ``np.mod`` (an integer
divisor of 0 gives 0, as NumPy does); d(x % y)/dx = 1.

>>> vkml.mod(vkml.tensor([7, -7]), 3)
tensor([1, 2], dtype=int64)
"""


def realize(tensors) -> None:
    """Compute every pending tensor in ``tensors`` (one or a list) in ONE submission.

    Idempotent: tensors that already hold values cost nothing.

    >>> x = vkml.tensor([1.0, 2.0])
    >>> y, z = x + 1, x * 2
    >>> before = vkml.stats().submissions
    >>> vkml.realize([y, z])
    >>> vkml.stats().submissions - before
    1
    """
    ts = [tensors] if isinstance(tensors, Tensor) else check_sequence(tensors, "tensors", "realize")
    for t in ts:
        if not isinstance(t, Tensor):
            raise ArgumentError(f"realize: expected Tensors, got {type(t).__name__}")
    # a tensor that requires grad keeps the graph behind it (a backward will go through it)
    runtime.realize([t.ir_var for t in ts], [t.requires_grad for t in ts])


def assign(destinations, sources) -> None:
    """Write ``sources[i]`` into ``destinations[i]`` for every i, as ONE submission.

    The batched ``dst.assign_(src)``: an optimiser step is one assignment per
    parameter, and a loop would pay one submission each.  Every pair is
    checked before anything is written, so a bad pair changes nothing.
    Because values are never written in place, sources that read
    destinations (a swap, ``p.assign_(p - lr * g)``) see the old values and
    never need a per-pair fallback.

    >>> a, b = vkml.zeros(2), vkml.zeros(2)
    >>> vkml.assign([a, b], [vkml.ones(2), vkml.full((2,), 5.0, dtype='float32')])
    >>> a, b
    (tensor([1., 1.], dtype=float32), tensor([5., 5.], dtype=float32))
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


@boundary
def backward(root) -> None:
    """Accumulate d(root)/d(leaf) into ``leaf.grad`` for every leaf that requires grad.

    ``root`` must be a 0-d floating tensor (the seed is 1).  Gradients ADD to
    ``.grad`` (call ``zero_grad`` between steps).  The backward program is
    derived from the forward one by linearize + transpose, cached by the
    forward graph's structure, and run in ONE submission with the root's value.

    >>> x = vkml.tensor([3.0], requires_grad=True)
    >>> vkml.backward(vkml.sum(x * x))
    >>> x.grad
    tensor([6.], dtype=float64)
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
