"""Optimisers: SGD (with momentum) and Adam, each step ONE submission.

A step updates every parameter and its state (momentum buffers, Adam's
moments).  Done one ``assign_`` at a time that is one submission per tensor,
and a submission is the unit of cost (the seed measured 40-105 us of host
time each).  So ``step`` builds every new value lazily under ``no_grad`` and
writes them all with one ``vkml.assign(destinations, sources)``: one
submission whatever the parameter count.

Hyperparameters and Adam's bias corrections enter the update as Python
floats.  A Python scalar becomes a program *input*, not a constant baked
into the program, so the update program has the same structure every step:
it compiles on the first step and is a cache hit after that, even though
the bias corrections change each step and even if ``lr`` is changed by a
schedule.  Adam's step count therefore lives on the host, where computing
``1 - beta1**t`` costs nothing.
"""

from __future__ import annotations

import math
import numbers

from .errors import ArgumentError
from .tensor import Tensor, assign, no_grad, sqrt, zeros_like

__all__ = ["Optimizer", "SGD", "Adam"]


def _number(value, what, owner, low=None, high=None, low_open=False, high_open=True):
    """``value`` as a float, checked against [low, high) (or other bounds); ArgumentError otherwise."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        raise ArgumentError(f"{owner}: {what} must be a finite number, got {value!r}")
    value = float(value)
    if low is not None and (value <= low if low_open else value < low):
        raise ArgumentError(f"{owner}: {what} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value >= high if high_open else value > high):
        raise ArgumentError(f"{owner}: {what} must be {'<' if high_open else '<='} {high}, got {value}")
    return value


class Optimizer:
    """Holds the parameters and their state; ``step`` writes all new values in one ``assign``.

    Subclasses implement ``_update(i, p, g) -> [(destination, new value), ...]``,
    building new values with tensor operations (they are lazy here), and may
    keep per-parameter state in lists indexed like ``self.params``.
    """

    def __init__(self, params, lr):
        owner = type(self).__name__
        if isinstance(params, Tensor) or not hasattr(params, "__iter__"):
            raise ArgumentError(f"{owner}: params must be an iterable of tensors (e.g. "
                                f"model.parameters()), got {type(params).__name__}")
        if hasattr(params, "parameters") and callable(params.parameters):
            raise ArgumentError(f"{owner}: got a module; pass model.parameters()")
        params = list(params)
        if not params:
            raise ArgumentError(f"{owner}: got an empty parameter list; nothing to optimise")
        seen = set()
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise ArgumentError(f"{owner}: parameter {i} is a {type(p).__name__}, not a vkml "
                                    "Tensor; make parameters with vkml.tensor(..., requires_grad=True)")
            if not p.requires_grad:
                raise ArgumentError(f"{owner}: parameter {i} (shape {p.shape}) does not require grad, "
                                    "so it would never change; create it with requires_grad=True or "
                                    "leave it out")
            if not p.is_leaf:
                raise ArgumentError(f"{owner}: parameter {i} (shape {p.shape}) is computed from other "
                                    "tensors, not a leaf; backward gives gradients to leaves only")
            if id(p) in seen:
                raise ArgumentError(f"{owner}: parameter {i} appears more than once in params")
            seen.add(id(p))
        self.params = params
        self.lr = lr

    @property
    def lr(self) -> float:
        """The learning rate; changing it between steps does not recompile (it is a program input)."""
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = _number(value, "lr", type(self).__name__, low=0.0, low_open=True)

    def zero_grad(self) -> None:
        """Set every parameter's ``.grad`` to None (backward accumulates into it)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Update every parameter that has a ``.grad`` (the rest are skipped): ONE submission."""
        active = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        if not active:
            return
        dsts, srcs = [], []
        with no_grad():
            for i, p in active:
                for dst, src in self._update(i, p, p.grad):
                    dsts.append(dst)
                    srcs.append(src)
        assign(dsts, srcs)
        self._stepped([i for i, _ in active])

    def _update(self, i, p, g):
        raise NotImplementedError

    def _stepped(self, indices) -> None:
        """Called after the values were written: advance host-side state (step counts)."""


class SGD(Optimizer):
    """Stochastic gradient descent, with optional momentum, as ``torch.optim.SGD``.

    ``buf = momentum * buf + g`` (the buffer starts at zero, which makes the
    first step ``buf = g`` exactly, as in PyTorch, with the same program every
    step), then ``p -= lr * buf``.  ``weight_decay`` adds ``weight_decay * p``
    to the gradient first (L2).
    """

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(params, lr)
        self.momentum = _number(momentum, "momentum", "SGD", low=0.0)
        self.weight_decay = _number(weight_decay, "weight_decay", "SGD", low=0.0)
        self.momentum_buffers = [None] * len(self.params)

    def _update(self, i, p, g):
        if self.weight_decay:
            g = g + self.weight_decay * p
        if not self.momentum:
            return [(p, p - self.lr * g)]
        buf = self.momentum_buffers[i]
        if buf is None:
            buf = self.momentum_buffers[i] = zeros_like(p)
        new_buf = self.momentum * buf + g
        return [(buf, new_buf), (p, p - self.lr * new_buf)]


class Adam(Optimizer):
    """Adam (Kingma & Ba), as ``torch.optim.Adam``.

    ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g*g``, then
    ``p -= lr/(1-b1**t) * m / (sqrt(v)/sqrt(1-b2**t) + eps)``.  The step
    count ``t`` is kept per parameter on the host (a parameter that had no
    gradient in some step is not advanced, as in PyTorch), and the two bias
    corrections enter as Python floats: program inputs, so the update
    program is compiled once and reused every step.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ArgumentError(f"Adam: betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = (_number(betas[0], "beta1", "Adam", low=0.0),
                      _number(betas[1], "beta2", "Adam", low=0.0))
        if self.betas[0] >= 1.0 or self.betas[1] >= 1.0:
            raise ArgumentError(f"Adam: betas must be in [0, 1), got {tuple(betas)}")
        self.eps = _number(eps, "eps", "Adam", low=0.0)
        self.weight_decay = _number(weight_decay, "weight_decay", "Adam", low=0.0)
        self.exp_avg = [None] * len(self.params)
        self.exp_avg_sq = [None] * len(self.params)
        #: steps taken per parameter (host ints: the bias corrections are computed from them here).
        self.steps = [0] * len(self.params)

    def _update(self, i, p, g):
        b1, b2 = self.betas
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.exp_avg[i] is None:
            self.exp_avg[i], self.exp_avg_sq[i] = zeros_like(p), zeros_like(p)
        m, v = self.exp_avg[i], self.exp_avg_sq[i]
        t = self.steps[i] + 1
        step_size = self.lr / (1.0 - b1 ** t)
        inv_sqrt_bc2 = 1.0 / math.sqrt(1.0 - b2 ** t)
        new_m = b1 * m + (1.0 - b1) * g
        new_v = b2 * v + (1.0 - b2) * (g * g)
        new_p = p - step_size * new_m / (sqrt(new_v) * inv_sqrt_bc2 + self.eps)
        return [(m, new_m), (v, new_v), (p, new_p)]

    def _stepped(self, indices):
        for i in indices:
            self.steps[i] += 1
