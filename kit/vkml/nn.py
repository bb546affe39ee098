"""Layers and losses: what a training loop is written with.

Everything here is a thin composition of tensor operations (``vkml.conv2d``,
``vkml.matmul``, ``vkml.log_softmax``, ...), so a layer adds no primitive,
its gradient comes from the tensor layer's autograd, and a model's forward
pass is just more lazy graph: a whole training step (forward, backward,
optimiser update) is a handful of submissions however many layers it has.

A *parameter* is a leaf tensor that requires grad -- ``vkml.tensor(...,
requires_grad=True)``, made by :func:`Parameter`.  A :class:`Module` finds
its parameters by looking at its attributes (in the order they were set, as
PyTorch does), so there is no registration call to forget.  A tensor
attribute that does not require grad is state, not a parameter: it is not
returned by ``parameters()`` and no optimiser touches it.

Initial values follow PyTorch's defaults (``U(-1/sqrt(fan_in),
1/sqrt(fan_in))`` for weights and biases of ``Linear`` and ``Conv2d``) and
come from a NumPy ``Generator``: pass ``rng=`` to a layer, or seed the
generator with :func:`manual_seed`, so a model is reproducible.  ``manual_seed`` seeds the
generator of the calling thread or asyncio task (and the process default other threads fall back
to), so threads that each seed and build a model get the same parameters as a serial run.
"""

from __future__ import annotations

import math
import numbers
import os
import weakref

import numpy as np

from .errors import ArgumentError, DTypeError, IndexOutOfRangeError, ShapeError, VkmlError, \
    hide_vkml_frames
from .ir import Scope
from .ops import activations as _act
from .ops import api
from .ops.core import CURRENT_SCOPE
from .ops.checks import warn_at_user
from .runtime import MODEL_TRACE, user_code, user_line
from .tensor import (Tensor, apply_api, apply_replayable, conv2d, flatten, max_pool2d, mean, relu,
                     reshape, sigmoid, softmax, sqrt, stop_gradient, take, take_along_axis, tanh,
                     tensor, var)
from .tensor import log_softmax as _log_softmax
from .threadsafe import Setting
from .validate import (check_bool, check_choice, check_dtype, check_int, check_real, check_sequence,
                       check_shape, describe, host_memory)

__all__ = ["Module", "Parameter", "Linear", "Conv2d", "MaxPool2d", "ReLU", "Flatten", "Sequential",
           "manual_seed", "cross_entropy", "log_softmax", "mse", "mse_loss"]

#: the generator layers draw from without ``rng=``: the caller's own after its manual_seed, else
#: the process default
_RNG = Setting("init_rng", np.random.default_rng())


def manual_seed(seed: int) -> None:
    """Seed the generator layers draw their initial values from when no ``rng=`` is given.

    ``vkml.nn.manual_seed(0)`` before building a model makes its initial
    parameters the same every run (``torch.manual_seed``'s job here).  The
    seeded generator is the calling thread's (or task's) own, and becomes the
    default of threads that never seed: two threads seeding and building
    models at the same time do not draw from each other's generator.

    >>> vkml.nn.manual_seed(0)
    >>> a = vkml.nn.Linear(2, 2).weight.numpy()
    >>> vkml.nn.manual_seed(0)
    >>> b = vkml.nn.Linear(2, 2).weight.numpy()
    >>> bool((a == b).all())
    True
    """
    _RNG.set_global(np.random.default_rng(check_int(seed, "seed", "manual_seed", low=0)))


def _generator(rng) -> np.random.Generator:
    if rng is None:
        return _RNG.get()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, numbers.Integral) and not isinstance(rng, bool):
        return np.random.default_rng(check_int(rng, "rng", "layer", low=0))
    raise ArgumentError(f"rng must be a numpy.random.Generator or an int seed, got {type(rng).__name__}")


def Parameter(data, dtype=np.float32) -> Tensor:
    """A trainable leaf: ``vkml.tensor(data, dtype, requires_grad=True)``.

    A function, not a Tensor subclass: a parameter is nothing more than a
    leaf that requires grad, and that is all the autograd and the optimisers
    look at.

    >>> w = vkml.nn.Parameter([1.0, 2.0])
    >>> w.requires_grad, w.dtype
    (True, dtype('float32'))
    """
    return tensor(data, dtype=check_dtype(dtype, "Parameter"), requires_grad=True)


def _uniform(rng, bound, shape, dtype, layer):
    """A parameter of ``shape`` drawn uniformly from (-bound, bound), its size checked first."""
    dtype = check_dtype(dtype, layer)
    shape = check_shape(shape, layer, "parameter shape")
    with host_memory(layer, f"a parameter of shape {shape}"):
        return Parameter(rng.uniform(-bound, bound, size=shape), dtype)


def _positive_int(value, what, layer):
    return check_int(value, what, layer, low=1)


def _pair(value, what, layer, minimum=1):
    """An int or a pair of ints (each at least ``minimum``) as a pair."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, tuple, list)):
        raise ArgumentError(f"{layer}: {what} must be an int >= {minimum} or a pair of them, "
                            f"got {describe(value)}")
    items = [value, value] if isinstance(value, numbers.Integral) else check_sequence(value, what, layer)
    if len(items) != 2:
        raise ArgumentError(f"{layer}: {what} must be an int >= {minimum} or a pair of them, "
                            f"got {describe(value)}")
    return tuple(check_int(v, what, layer, low=minimum) for v in items)


# -- Module ----------------------------------------------------------------------------------------

class Module:
    """Base class of layers and models: holds parameters and sub-modules as attributes.

    Subclasses set their parameters and sub-modules as attributes in
    ``__init__`` (call ``super().__init__()`` first) and define ``forward``;
    calling the module calls ``forward``.  ``parameters()`` walks the
    attributes in the order they were set, depth first, so the order is the
    same every run -- optimiser state lines up with it, and two models built
    the same way list their parameters the same way.

    >>> class TwoLayer(vkml.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.hidden = vkml.nn.Linear(3, 4, rng=0)
    ...         self.out = vkml.nn.Linear(4, 1, rng=1)
    ...     def forward(self, x):
    ...         return self.out(vkml.relu(self.hidden(x)))
    ...
    >>> model = TwoLayer()
    >>> model(vkml.ones((2, 3))).shape
    (2, 1)
    >>> [name for name, _ in model.named_parameters()]
    ['hidden.weight', 'hidden.bias', 'out.weight', 'out.bias']
    """

    #: read by layers that act differently in training and evaluation (class default: training).
    training = True

    def __init__(self):
        self.training = True

    def forward(self, *args, **kwargs):
        """What calling the module computes; every layer defines it (``module(x)`` calls ``module.forward(x)``).

        >>> layer = vkml.nn.Tanh()
        >>> layer.forward(vkml.tensor([0.0])), layer(vkml.tensor([0.0]))
        (tensor([0.], dtype=float64), tensor([0.], dtype=float64))
        """
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args, **kwargs):
        """``forward``, its operations naming the user's line in errors.  A forward of vkml's own
        finds that line once for all its operations (``user_line``), not once per operation (a
        walk up the stack each); a user's own forward is its operations' line, so inside it each
        operation finds its line again, as outside any module.  A forward in one thread and a
        compiled step tracing in another take turns (``runtime.MODEL_TRACE``)."""
        MODEL_TRACE.enter_read()        # (waits while a compiled step traces a model)
        scope = CURRENT_SCOPE.set(_scope_of(self, CURRENT_SCOPE.get()))
        try:
            with user_line() if _own_forward(type(self)) else user_code():
                return self.forward(*args, **kwargs)
        except VkmlError as error:      # (the user's frames only: see hide_vkml_frames)
            hide_vkml_frames(error)
            raise
        finally:
            CURRENT_SCOPE.reset(scope)
            MODEL_TRACE.exit_read()

    def scope_label(self) -> str:
        """What a picture calls this module's box: the class and its shape, short.

        >>> vkml.nn.Linear(64, 32, rng=0).scope_label(), vkml.nn.ReLU().scope_label()
        ('Linear(64 -> 32)', 'ReLU')
        """
        return type(self).__name__

    # -- what it holds -------------------------------------------------------------------------
    def named_children(self):
        """``(name, module)`` for each direct sub-module; lists/tuples of modules count too.

        >>> model = vkml.nn.Sequential(vkml.nn.Linear(2, 2, rng=0), vkml.nn.ReLU())
        >>> [(name, type(child).__name__) for name, child in model.named_children()]
        [('0', 'Linear'), ('1', 'ReLU')]
        """
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def children(self):
        """Each direct sub-module (:meth:`named_children` without the names).

        >>> model = vkml.nn.Sequential(vkml.nn.Linear(2, 2, rng=0), vkml.nn.ReLU())
        >>> [type(child).__name__ for child in model.children()]
        ['Linear', 'ReLU']
        """
        return [m for _, m in self.named_children()]

    def modules(self):
        """This module and every sub-module, depth first.

        >>> model = vkml.nn.Sequential(vkml.nn.Linear(2, 2, rng=0), vkml.nn.ReLU())
        >>> [type(m).__name__ for m in model.modules()]
        ['Sequential', 'Linear', 'ReLU']
        """
        out = [self]
        for child in self.children():
            out.extend(child.modules())
        return out

    def _own_parameters(self):
        for name, value in vars(self).items():
            if isinstance(value, Tensor) and value.requires_grad:
                yield name, value

    def named_parameters(self, prefix: str = ""):
        """``[(dotted name, tensor), ...]`` for every parameter, each once, in a fixed order.

        >>> model = vkml.nn.Sequential(vkml.nn.Linear(2, 3, rng=0))
        >>> [(name, p.shape) for name, p in model.named_parameters()]
        [('0.weight', (3, 2)), ('0.bias', (3,))]
        """
        if not isinstance(prefix, str):
            raise ArgumentError(f"named_parameters: prefix must be a string, got {type(prefix).__name__}")
        out, seen = [], set()
        self._collect(prefix, out, seen)
        return out

    def _collect(self, prefix, out, seen):
        for name, p in self._own_parameters():
            if id(p) not in seen:   # a shared (tied) parameter is listed once
                seen.add(id(p))
                out.append((prefix + name, p))
        for name, child in self.named_children():
            child._collect(f"{prefix}{name}.", out, seen)

    def parameters(self):
        """Every parameter (leaf tensor that requires grad), in ``named_parameters`` order.

        >>> sum(p.size for p in vkml.nn.Linear(2, 3, rng=0).parameters())
        9
        """
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        """How many numbers the parameters hold together.

        >>> vkml.nn.Linear(2, 3, rng=0).num_parameters()
        9
        """
        return int(sum(p.size for p in self.parameters()))

    # -- modes and gradients ---------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Set training mode here and in every sub-module (layers like dropout read ``training``).

        >>> drop = vkml.nn.Dropout(0.5)
        >>> drop.eval().training, drop.train().training
        (False, True)
        """
        mode = check_bool(mode, "mode", "train")
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        """Set evaluation mode (``train(False)``): dropout passes its input through; returns the module.

        >>> drop = vkml.nn.Dropout(0.5).eval()
        >>> drop(vkml.ones(4))
        tensor([1., 1., 1., 1.], dtype=float32)
        """
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop every parameter's ``.grad`` (backward accumulates, so call this between steps).

        >>> layer = vkml.nn.Linear(2, 1, rng=0)
        >>> layer(vkml.ones((1, 2))).sum().backward()
        >>> layer.zero_grad()
        >>> layer.weight.grad is None
        True
        """
        for p in self.parameters():
            p.grad = None

    def extra_repr(self) -> str:
        """The layer's settings as its ``repr`` shows them inside the parentheses.

        >>> vkml.nn.Linear(2, 3, rng=0).extra_repr()
        'in_features=2, out_features=3, bias=True'
        >>> vkml.nn.Sequential(vkml.nn.Linear(2, 3, rng=0), vkml.nn.ReLU())
        Sequential(
          (0): Linear(in_features=2, out_features=3, bias=True)
          (1): ReLU()
        )
        """
        return ""

    def __repr__(self):
        children = list(self.named_children())
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{type(self).__name__}("]
        for name, child in children:
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"


class _ModuleScope(Scope):
    """The scope of a module's calls (``ir.Scope``), knowing its module to name the children."""

    __slots__ = ("owner", "names")

    def __init__(self, parent, name, label, owner):
        super().__init__(parent, name, label)
        self.owner, self.names = weakref.ref(owner), None

    def child_name(self, child) -> str:
        names = self.names
        if names is None or id(child) not in names:
            owner = self.owner()
            names = self.names = {id(m): n for n, m in owner.named_children()} if owner else {}
        return names.get(id(child), type(child).__name__)


#: module -> (the scope it was last called in, its scope there): made once per place in a model
_SCOPES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _scope_of(module, parent):
    """The Scope of ``module`` called inside ``parent`` (a scope, or None at the top)."""
    known = _SCOPES.get(module)
    if known is not None and known[0] is parent:
        return known[1]
    name = parent.child_name(module) if isinstance(parent, _ModuleScope) else type(module).__name__
    scope = _ModuleScope(parent, name, module.scope_label(), module)
    _SCOPES[module] = (parent, scope)
    return scope


# -- layers ------------------------------------------------------------------------------------------

class Linear(Module):
    """``y = x @ weight.T + bias``, weight of shape (out_features, in_features) as in PyTorch.

    Initialised like ``torch.nn.Linear``: weight and bias uniform in
    ``(-1/sqrt(in_features), 1/sqrt(in_features))``, so models ported from
    PyTorch train the same way.

    >>> layer = vkml.nn.Linear(3, 2, rng=0)
    >>> layer.weight.shape, layer.bias.shape
    ((2, 3), (2,))
    >>> layer(vkml.ones((5, 3))).shape
    (5, 2)
    """

    def __init__(self, in_features, out_features, bias=True, *, rng=None, dtype=np.float32):
        super().__init__()
        self.in_features = _positive_int(in_features, "in_features", "Linear")
        self.out_features = _positive_int(out_features, "out_features", "Linear")
        bias = check_bool(bias, "bias", "Linear")
        gen = _generator(rng)
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = _uniform(gen, bound, (self.out_features, self.in_features), dtype, "Linear")
        self.bias = _uniform(gen, bound, (self.out_features,), dtype, "Linear") if bias else None

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = tensor(x)
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ShapeError(f"Linear({self.in_features}, {self.out_features}): the input's last "
                             f"dimension must be {self.in_features}, got shape {x.shape}")
        if x.dtype is not self.weight.dtype:
            _wider_input(self, x, f"Linear({self.in_features}, {self.out_features})")
        return apply_replayable(_affine, x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")

    def scope_label(self):
        return f"Linear({self.in_features} -> {self.out_features})"


#: (layer class, parameter dtype, input dtype) already warned about by ``_wider_input``
_WARNED_WIDER = set()


def _wider_input(layer, x, name):
    """Warn once (per kind of layer and pair of dtypes) when a layer's input is a wider float
    than its parameters: NumPy's promotion then computes the layer, its gradient and everything
    after it in the wider type -- a float64 batch fed to a float32 model runs in float64, about
    twice the time and memory, which is rarely what was meant.  The result is what NumPy's
    rules give; the warning names the cast that keeps the model's precision."""
    have, got = layer.weight.dtype, x.dtype
    if got.kind != "f" or have.kind != "f" or got.itemsize <= have.itemsize:
        return
    key = (type(layer), have, got)
    if key in _WARNED_WIDER:
        return
    _WARNED_WIDER.add(key)
    warn_at_user(f"{name}: its parameters are {have.name} but its input is {got.name}, so it "
                 f"computes in {got.name} (slower, twice the memory); cast the input first, e.g. "
                 f"x.astype(np.{have.name}) for a NumPy batch or x.astype(vkml.{have.name}) for a "
                 f"tensor, or make the model in {got.name} (this is said once)")


def _affine(x, weight, bias):
    """``x @ weight.T + bias`` (no bias: None) on Vars: Linear's forward as one replayed call,
    binding the equations ``matmul(x, transpose(weight)) + bias`` binds op by op."""
    y = api.matmul(x, api.transpose(weight))
    return y if bias is None else api.add(y, bias)


class Conv2d(Module):
    """2-D convolution (cross-correlation) over NCHW input, as ``torch.nn.Conv2d``.

    Weight (out_channels, in_channels, kh, kw), initialised like PyTorch:
    uniform in ``(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with ``fan_in =
    in_channels * kh * kw``.  Runs ``vkml.conv2d`` (im2col + one matmul).

    >>> conv = vkml.nn.Conv2d(1, 4, kernel_size=3, padding=1, rng=0)
    >>> conv(vkml.ones((2, 1, 8, 8))).shape
    (2, 4, 8, 8)
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, rng=None, dtype=np.float32):
        super().__init__()
        self.in_channels = _positive_int(in_channels, "in_channels", "Conv2d")
        self.out_channels = _positive_int(out_channels, "out_channels", "Conv2d")
        self.kernel_size = _pair(kernel_size, "kernel_size", "Conv2d")
        self.stride = _pair(stride, "stride", "Conv2d")
        self.padding = _pair(padding, "padding", "Conv2d", minimum=0)
        self.dilation = _pair(dilation, "dilation", "Conv2d")
        self.groups = _positive_int(groups, "groups", "Conv2d")
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ShapeError(f"Conv2d: groups={self.groups} must divide in_channels "
                             f"({self.in_channels}) and out_channels ({self.out_channels})")
        bias = check_bool(bias, "bias", "Conv2d")
        gen = _generator(rng)
        per_group = self.in_channels // self.groups
        fan_in = per_group * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = _uniform(gen, bound, (self.out_channels, per_group) + self.kernel_size,
                               dtype, "Conv2d")
        self.bias = _uniform(gen, bound, (self.out_channels,), dtype, "Conv2d") if bias else None

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = tensor(x)
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ShapeError(f"Conv2d({self.in_channels}, {self.out_channels}): needs input of shape "
                             f"(N, {self.in_channels}, H, W), got {x.shape}")
        if x.dtype is not self.weight.dtype:
            _wider_input(self, x, f"Conv2d({self.in_channels}, {self.out_channels})")
        return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                      self.groups)

    def scope_label(self):
        return f"Conv2d({self.in_channels} -> {self.out_channels}, {self.kernel_size[0]}x{self.kernel_size[1]})"

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, bias={self.bias is not None}"
                + (f", dilation={self.dilation}" if self.dilation != (1, 1) else "")
                + (f", groups={self.groups}" if self.groups != 1 else ""))


class MaxPool2d(Module):
    """Max over (kh, kw) windows of NCHW input; ``stride`` defaults to the window (no overlap).

    >>> pool = vkml.nn.MaxPool2d(2)
    >>> pool(vkml.reshape(vkml.arange(16.0), (1, 1, 4, 4)))[0, 0]
    tensor([[ 5.,  7.],
            [13., 15.]], dtype=float64)
    """

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size", "MaxPool2d")
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride", "MaxPool2d")
        self.padding = _pair(padding, "padding", "MaxPool2d", minimum=0)

    def forward(self, x):
        return max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        pad = f", padding={self.padding}" if self.padding != (0, 0) else ""
        return f"kernel_size={self.kernel_size}, stride={self.stride}{pad}"


class ReLU(Module):
    """``max(x, 0)`` elementwise.

    >>> vkml.nn.ReLU()(vkml.tensor([-1.0, 2.0]))
    tensor([0., 2.], dtype=float64)
    """

    def forward(self, x):
        return relu(x)


class Flatten(Module):
    """Flatten dimensions ``start_dim..end_dim`` into one (default: all but the batch dimension).

    >>> vkml.nn.Flatten()(vkml.zeros((2, 3, 4))).shape
    (2, 12)
    """

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim = check_int(start_dim, "start_dim", "Flatten")
        self.end_dim = check_int(end_dim, "end_dim", "Flatten")

    def forward(self, x):
        return flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Sequential(Module):
    """Layers applied one after another; parameters are named ``"0.weight"``, ``"1.bias"``, ....

    >>> model = vkml.nn.Sequential(vkml.nn.Linear(4, 8, rng=0), vkml.nn.ReLU(), vkml.nn.Linear(8, 2, rng=1))
    >>> model(vkml.ones((3, 4))).shape
    (3, 2)
    >>> [name for name, _ in model.named_parameters()]
    ['0.weight', '0.bias', '2.weight', '2.bias']
    """

    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise ArgumentError(f"Sequential: layer {i} is a {type(layer).__name__}, not a "
                                    "vkml.nn.Module; wrap functions in a Module subclass")
        self.layers = list(layers)

    def named_children(self):
        for i, layer in enumerate(self.layers):
            yield str(i), layer

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(*self.layers[i])
        n = len(self.layers)
        i = check_int(i, "index", "Sequential", low=-n, high=n - 1, error=IndexOutOfRangeError)
        return self.layers[i]

    def __iter__(self):
        return iter(self.layers)


# -- losses --------------------------------------------------------------------------------------------

def log_softmax(x, axis=-1) -> Tensor:
    """``x - logsumexp(x)`` along ``axis``, computed stably (the max is subtracted first).

    >>> vkml.nn.log_softmax(vkml.tensor([0.0, 0.0]))
    tensor([-0.69314718, -0.69314718], dtype=float64)
    """
    return _log_softmax(x, axis)


#: labels Var -> ((rows, classes), its (row, label) coordinates): a Var's value never changes,
#: so a loss over the same labels tensor every step checks them and makes them once (~10 us)
_COORDINATES = weakref.WeakKeyDictionary()


def _labels(labels, n, classes):
    """Class indices, checked against ``classes`` when known.

    Known labels (an array, or a tensor holding its value) become (row, label)
    coordinates made on the host, so picking each row's log-probability is
    one ``gather`` (no index arithmetic in the graph, every step).  Pending
    labels come back as an (n, 1) column for ``take_along_axis``.
    """
    if isinstance(labels, Tensor):
        made = _COORDINATES.get(labels.ir_var)
        if made is not None and made[0] == (n, classes):
            return made[1]
        if labels.dtype.kind not in "iu":
            raise DTypeError(f"cross_entropy: labels must be integer class indices, got "
                             f"{labels.dtype.name}; cast them with .astype(np.int64)")
        known = None if labels.ir_var.value is None else np.asarray(labels.ir_var.value)
        shape = labels.shape
    else:
        known = np.asarray(tensor(labels).ir_var.value)
        if known.dtype.kind not in "iu":
            raise DTypeError(f"cross_entropy: labels must be integer class indices, got an array of "
                             f"{known.dtype}; pass e.g. np.asarray(labels, dtype=np.int64)")
        shape = known.shape
    if shape != (n,):
        raise ShapeError(f"cross_entropy: labels must have shape ({n},) to match the logits' batch, "
                         f"got {shape}")
    if known is None:   # a pending tensor: its values are not known until it runs
        return reshape(labels, (n, 1))
    if known.size and (known.min() < 0 or known.max() >= classes):
        bad = int(known.min() if known.min() < 0 else known.max())
        raise ArgumentError(f"cross_entropy: label {bad} is not a class index in [0, {classes}); "
                            f"the logits have {classes} columns, so either a label is wrong or "
                            f"the last layer needs {int(known.max()) + 1} outputs")
    # (row, label) coordinates made on the host: the pick is then ONE gather equation
    coords = tensor(np.stack([np.arange(n, dtype=np.int64), known.astype(np.int64)], axis=1))
    if isinstance(labels, Tensor):
        _COORDINATES[labels.ir_var] = ((n, classes), coords)
    return coords


#: Module class -> whether its ``forward`` is vkml's own code (see ``Module.__call__``)
_OWN_FORWARD: dict = {}
#: where vkml's own code lives
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _own_forward(cls) -> bool:
    own = _OWN_FORWARD.get(cls)
    if own is None:
        code = getattr(cls.forward, "__code__", None)
        own = _OWN_FORWARD[cls] = code is not None and code.co_filename.startswith(_PACKAGE_DIR)
    return own


def cross_entropy(logits, labels, *, label_smoothing=0.0, reduction="mean") -> Tensor:
    """Mean negative log-likelihood of ``labels`` under ``softmax(logits)`` (``F.cross_entropy``).

    ``label_smoothing`` mixes the one-hot target with the uniform distribution (PyTorch's
    ``(1 - s) * nll + s * mean(-log_softmax)``); ``reduction`` is "mean", "sum" or "none"
    (one loss per row).

    ``logits`` is (N, C); ``labels`` are N class indices (int array or
    tensor).  Written as ``-mean(take_along_axis(log_softmax(logits),
    labels))``: picking the one log-probability per row needs no one-hot
    matrix, and the gradient (``softmax - onehot``, divided by N) comes
    from the tensor layer's rules for the pieces.

    >>> logits = vkml.tensor([[0.0, 0.0], [0.0, 0.0]])
    >>> vkml.nn.cross_entropy(logits, np.array([0, 1]))
    tensor(0.69314718, dtype=float64)
    """
    smoothing = check_real(label_smoothing, "label_smoothing", "cross_entropy", low=0, high=1)
    reduction = check_choice(reduction, ("mean", "sum", "none"), "reduction", "cross_entropy")
    with user_line():          # one walk up the stack for the user's line, not one per operation
        if smoothing == 0.0 and reduction == "mean":
            return _cross_entropy(logits, labels)
        return _cross_entropy_rows(logits, labels, smoothing, reduction)


def _logits_and_labels(logits, labels):
    """(logits as a Tensor, labels as ``_labels`` makes them), the shapes checked."""
    if not isinstance(logits, Tensor):
        logits = tensor(logits)
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must be (batch, classes), got shape {logits.shape}")
    n, classes = logits.shape
    return logits, _labels(labels, n, classes)


def _cross_entropy_rows(logits, labels, smoothing, reduction) -> Tensor:
    """The loss of each row (smoothed), then reduced as asked."""
    logits, idx = _logits_and_labels(logits, labels)
    n = logits.shape[0]
    logp = _log_softmax(logits, -1)
    if idx.ir_var.value is not None and idx.shape == (n, 2):        # (row, label) coordinates
        picked = reshape(apply_replayable(api.gather, logp, idx), (n,))
    else:
        picked = reshape(take_along_axis(logp, idx, 1), (n,))
    rows = -picked
    if smoothing:
        rows = rows * (1.0 - smoothing) - mean(logp, 1) * smoothing
    if reduction == "none":
        return rows
    return rows.sum() if reduction == "sum" else mean(rows)


def _cross_entropy(logits, labels) -> Tensor:
    logits, idx = _logits_and_labels(logits, labels)
    # known labels come as (row, label) coordinates, pending ones as an (n, 1) column
    if idx.ir_var.value is not None:
        return apply_replayable(_picked_nll, logits, idx)
    return -mean(take_along_axis(_log_softmax(logits, -1), idx, 1))


def _picked_nll(logits, coords):
    """``-mean(gather(log_softmax(logits), coords))`` on Vars: the loss over known labels as one
    replayed call, binding the equations the four operations bind one by one."""
    return api.neg(api.mean(api.gather(api.log_softmax(logits, -1), coords)))


def mse(pred, target) -> Tensor:
    """Mean of ``(pred - target)**2`` over every element (``F.mse_loss``).

    The shapes must match exactly: a silently broadcast target (say (N,)
    against (N, 1)) gives an N-by-N loss that still trains, just wrongly.

    >>> vkml.nn.mse(vkml.tensor([1.0, 2.0]), vkml.tensor([1.0, 4.0]))
    tensor(2., dtype=float64)
    """
    if not isinstance(pred, Tensor):
        pred = tensor(pred)
    if not isinstance(target, Tensor):
        target = tensor(target, dtype=pred.dtype)
    if pred.shape != target.shape:
        raise ShapeError(f"mse: prediction has shape {pred.shape} but target has {target.shape}; "
                         "reshape one of them (they are not broadcast)")
    d = pred - target
    return mean(d * d)


mse_loss = mse


# -- more layers PyTorch users reach for ------------------------------------------------------------------

def _as_input(x, layer):
    if isinstance(x, Tensor):
        return x
    try:
        return tensor(x)
    except ArgumentError as err:
        raise ArgumentError(f"{layer}: expected a tensor or an array, got {type(x).__name__}") from err


class Tanh(Module):
    """``tanh(x)`` elementwise.

    >>> vkml.nn.Tanh()(vkml.tensor([0.0, 1.0]))
    tensor([0.        , 0.76159416], dtype=float64)
    """

    def forward(self, x):
        return tanh(_as_input(x, "Tanh"))


class Sigmoid(Module):
    """``1 / (1 + exp(-x))`` elementwise.

    >>> vkml.nn.Sigmoid()(vkml.tensor([0.0]))
    tensor([0.5], dtype=float64)
    """

    def forward(self, x):
        return sigmoid(_as_input(x, "Sigmoid"))


class GELU(Module):
    """The Gaussian error linear unit ``x Phi(x)``, exact through erf by default (PyTorch's
    default), or its tanh form with ``approximate="tanh"``
    (``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``; within 1e-3 of the exact one).

    >>> vkml.nn.GELU()(vkml.tensor([-1.0, 0.0, 1.0]))
    tensor([-0.15865525,  0.        ,  0.84134475], dtype=float64)
    >>> vkml.nn.GELU(approximate="tanh")(vkml.tensor([1.0]))
    tensor([0.84119199], dtype=float64)
    """

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = check_choice(approximate, ("none", "tanh"), "approximate", "GELU")

    def forward(self, x):
        return gelu(_as_input(x, "GELU"), self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    """``exp(x) / sum(exp(x))`` along ``axis`` (``dim`` as PyTorch spells it; default the last).

    >>> vkml.nn.Softmax(dim=0)(vkml.tensor([0.0, np.log(3.0)]))
    tensor([0.25, 0.75], dtype=float64)
    """

    def __init__(self, axis=-1, *, dim=None):
        super().__init__()
        self.axis = check_int(axis if dim is None else dim, "axis", "Softmax")

    def forward(self, x):
        return softmax(_as_input(x, "Softmax"), self.axis)

    def extra_repr(self):
        return f"axis={self.axis}"


class Dropout(Module):
    """Zero each element with probability ``p`` in training, scaling the rest by ``1/(1-p)``;
    the identity in ``eval()`` mode.

    Deterministic: the masks come from a NumPy Generator seeded with
    ``seed`` (so the same model built with the same seed drops the same
    elements every run), or from ``key`` given to one call, ``drop(x,
    key=7)``, for a mask that depends on nothing else.

    >>> drop = vkml.nn.Dropout(0.5, seed=0)
    >>> drop(vkml.ones(6))
    tensor([2., 0., 0., 0., 2., 2.], dtype=float32)
    >>> drop.eval()(vkml.ones(6))
    tensor([1., 1., 1., 1., 1., 1.], dtype=float32)
    """

    def __init__(self, p=0.5, *, seed=0):
        super().__init__()
        self.p = check_real(p, "p (the probability of dropping)", "Dropout", low=0, high=1,
                            high_open=True)
        self.seed = seed
        self._rng = _generator(seed)

    def forward(self, x, key=None):
        x = _as_input(x, "Dropout")
        if not self.training or self.p == 0:
            return x
        gen = self._rng if key is None else _generator(key)
        keep = gen.random(x.shape) >= self.p
        return x * tensor((keep / (1.0 - self.p)).astype(x.dtype if x.dtype.kind == "f" else np.float32))

    def extra_repr(self):
        return f"p={self.p}"


class LayerNorm(Module):
    """Normalize over the last dimensions (``normalized_shape``): ``(x - mean) / sqrt(var + eps)``,
    then ``* weight + bias`` (ones and zeros at first) when ``elementwise_affine``, as PyTorch.

    >>> norm = vkml.nn.LayerNorm(2)
    >>> norm(vkml.tensor([[1.0, 3.0]], dtype="float32"))
    tensor([[-0.999995,  0.999995]], dtype=float32, requires_grad=True)
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, *, dtype=np.float32):
        super().__init__()
        shape = check_shape(normalized_shape, "LayerNorm", "normalized_shape")
        if not shape or 0 in shape:
            raise ShapeError(f"LayerNorm: normalized_shape must be a positive int or a tuple of "
                             f"them, got {normalized_shape!r}")
        self.normalized_shape = shape
        self.eps = check_real(eps, "eps", "LayerNorm", low=0, low_open=True)
        affine = check_bool(elementwise_affine, "elementwise_affine", "LayerNorm")
        dtype = check_dtype(dtype, "LayerNorm")
        with host_memory("LayerNorm", f"parameters of shape {shape}"):
            self.weight = Parameter(np.ones(shape), dtype) if affine else None
            self.bias = Parameter(np.zeros(shape), dtype) if affine else None

    def forward(self, x):
        x = _as_input(x, "LayerNorm")
        k = len(self.normalized_shape)
        if x.ndim < k or x.shape[x.ndim - k:] != self.normalized_shape:
            raise ShapeError(f"LayerNorm{self.normalized_shape}: the input's last dimensions must be "
                             f"{self.normalized_shape}, got shape {x.shape}")
        axes = tuple(range(x.ndim - k, x.ndim))
        centered = x - mean(x, axes, keepdims=True)
        y = centered / sqrt(var(x, axes, keepdims=True) + self.eps)
        return y * self.weight + self.bias if self.weight is not None else y

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``; ``emb(ids)`` looks rows up
    (shape ids.shape + (embedding_dim,)).  Initialised N(0, 1), as ``torch.nn.Embedding``.

    >>> emb = vkml.nn.Embedding(10, 3, rng=0)
    >>> emb(np.array([[1, 2], [3, 4]])).shape
    (2, 2, 3)
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, *, rng=None,
                 dtype=np.float32):
        super().__init__()
        self.num_embeddings = _positive_int(num_embeddings, "num_embeddings", "Embedding")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim", "Embedding")
        if padding_idx is not None:
            n = self.num_embeddings
            padding_idx = check_int(padding_idx, "padding_idx", "Embedding", -n, n - 1)
            padding_idx %= n
        self.padding_idx = padding_idx
        shape = check_shape((self.num_embeddings, self.embedding_dim), "Embedding", "table shape")
        dtype = check_dtype(dtype, "Embedding")
        with host_memory("Embedding", f"a table of shape {shape}"):
            table = _generator(rng).standard_normal(shape)
            if padding_idx is not None:         # the padding row starts at zero, as in PyTorch
                table[padding_idx] = 0.0
            self.weight = Parameter(table, dtype)

    def forward(self, ids):
        ids = _as_input(ids, "Embedding")
        if ids.dtype.kind not in "iu":
            raise ArgumentError(f"Embedding: ids must be integers, got {ids.dtype}; cast them with "
                                ".astype(np.int64)")
        if self.padding_idx is None:
            return take(self.weight, ids, 0)
        # the padding row is looked up but never trained: its gradient is cut
        rows = np.zeros((self.num_embeddings, 1), self.weight.dtype)
        rows[self.padding_idx] = 1.0
        frozen = tensor(rows)
        table = self.weight * (1.0 - frozen) + stop_gradient(self.weight) * frozen
        return take(table, ids, 0)

    def extra_repr(self):
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"

def _activation(fn, name, doc):
    """``fn`` (on Vars) on a tensor; its other arguments must be numbers or choices (checked)."""
    def op(x, *args, **kwargs):
        for value in (*args, *kwargs.values()):
            if not isinstance(value, (numbers.Real, str)) or isinstance(value, bool):
                raise ArgumentError(f"{name}: its parameters must be numbers (or a choice like "
                                    f"approximate='tanh'), got {describe(value)}")
        return apply_api(fn, _as_input(x, name), *args, **kwargs)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


silu = _activation(_act.silu, "silu", """``x * sigmoid(x)`` (``F.silu``).

    >>> vkml.nn.silu(vkml.tensor([0.0, 1.0]))
    tensor([0.        , 0.73105858], dtype=float64)
    """)
softplus = _activation(_act.softplus, "softplus", """``log(1 + exp(beta x)) / beta``, x itself above ``threshold`` (``F.softplus``).

    >>> vkml.nn.softplus(vkml.tensor([0.0, 30.0]))
    tensor([ 0.69314718, 30.        ], dtype=float64)
    """)
leaky_relu = _activation(_act.leaky_relu, "leaky_relu", """x above 0, ``negative_slope * x`` below (``F.leaky_relu``).

    >>> vkml.nn.leaky_relu(vkml.tensor([-1.0, 2.0]), 0.1)
    tensor([-0.1,  2. ], dtype=float64)
    """)
elu = _activation(_act.elu, "elu", """x above 0, ``alpha * (exp(x) - 1)`` below (``F.elu``).

    >>> vkml.nn.elu(vkml.tensor([-1.0, 2.0]))
    tensor([-0.63212056,  2.        ], dtype=float64)
    """)
def _gelu(x, approximate="none"):
    return _act.gelu(x, check_choice(approximate, ("none", "tanh"), "approximate", "gelu"))


gelu = _activation(_gelu, "gelu", """``x Phi(x)`` (``approximate`` "none" or "tanh", as ``F.gelu``).

    >>> vkml.nn.gelu(vkml.tensor([1.0]))
    tensor([0.84134475], dtype=float64)
    """)


def one_hot(labels, num_classes=None):
    """(..., num_classes) int64 rows with a 1 at each label (``F.one_hot``; ``num_classes``
    defaults to the largest label + 1, which needs the labels' values).

    >>> vkml.nn.one_hot(np.array([0, 2]), 3)
    tensor([[1, 0, 0],
            [0, 0, 1]], dtype=int64)
    """
    labels = _as_input(labels, "one_hot")
    if num_classes is None:
        value = labels.numpy()
        num_classes = int(value.max()) + 1 if value.size else 0
    num_classes = check_int(num_classes, "num_classes", "one_hot", low=0)
    check_shape(labels.shape + (num_classes,), "one_hot", "the one-hot rows")
    with host_memory("one_hot", f"{num_classes} classes"):
        return apply_api(_act.one_hot, labels, num_classes)


class SiLU(Module):
    """``x * sigmoid(x)`` elementwise.

    >>> vkml.nn.SiLU()(vkml.tensor([0.0]))
    tensor([0.], dtype=float64)
    """

    def forward(self, x):
        return silu(x)


class Softplus(Module):
    """``log(1 + exp(beta x)) / beta`` elementwise (x above ``threshold``).

    >>> vkml.nn.Softplus()(vkml.tensor([0.0]))
    tensor([0.69314718], dtype=float64)
    """

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta = check_real(beta, "beta", "Softplus", low=0, low_open=True)
        self.threshold = check_real(threshold, "threshold", "Softplus")

    def forward(self, x):
        return softplus(x, self.beta, self.threshold)


class LeakyReLU(Module):
    """x above 0, ``negative_slope * x`` below.

    >>> vkml.nn.LeakyReLU(0.2)(vkml.tensor([-1.0]))
    tensor([-0.2], dtype=float64)
    """

    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = check_real(negative_slope, "negative_slope", "LeakyReLU")

    def forward(self, x):
        return leaky_relu(x, self.negative_slope)


class ELU(Module):
    """x above 0, ``alpha * (exp(x) - 1)`` below.

    >>> vkml.nn.ELU()(vkml.tensor([-1.0]))
    tensor([-0.63212056], dtype=float64)
    """

    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = check_real(alpha, "alpha", "ELU")

    def forward(self, x):
        return elu(x, self.alpha)


__all__ += ["Tanh", "Sigmoid", "GELU", "Softmax", "Dropout", "LayerNorm", "Embedding",
            "SiLU", "Softplus", "LeakyReLU", "ELU", "silu", "softplus", "leaky_relu", "elu", "gelu",
            "one_hot"]


def __dir__():
    """Only the public names: ``dir(vkml.nn)`` lists layers and losses, not this module's imports."""
    return sorted(__all__)
