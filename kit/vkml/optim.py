"""Optimisers: SGD (with momentum) and Adam, each step ONE submission.

A step updates every parameter and its state (momentum buffers, Adam's
moments).  Done one ``assign_`` at a time that is one submission per tensor,
and a submission is the unit of cost (each one costs tens of microseconds
of host time on a GPU, 40-105 us as measured when vkml was designed).  So ``step`` computes every new value in one program and writes
them all with one ``vkml.assign(destinations, sources)``: one submission
whatever the parameter count.

The update program is a ``vkml.jit`` function of (parameters, gradients,
state, hyperparameters), traced once per parameter structure and replayed
after that.  Building the same update op by op every step would be correct
too, but it costs the host ~12 us per operation, ~16 operations per
parameter: measured on the 784-256-10 MLP (4 parameters), 980 us of graph
building per step -- more than the update itself -- against ~60 us to look
up and run the traced program.

Hyperparameters and Adam's bias corrections enter as Python floats.  A
Python scalar becomes a program *input*, not a constant baked into the
program, so the update program is the same every step: it compiles on the
first step and is only replayed after that, even though the bias
corrections change every step and even if ``lr`` is changed by a schedule.
Adam's step count therefore lives on the host, where ``1 - beta1**t`` costs
nothing.
"""

from __future__ import annotations

import abc
import contextlib
import math
import threading
from sys import getrefcount

import numpy as np

from .errors import ArgumentError, DTypeError, ShapeError, VkmlError, boundary, hide_vkml_frames
from .ir import EXACT_REFCOUNTS, Var, dtype_name
from .backends.interrupts import Deferred
from .ops.api import constant, default_device
from .programs import jit, value_and_grad
from .programs.arguments import flatten_known
from .pytree import unflatten
from .runtime import MODEL_TRACE, no_grad, writing
from .creation import zeros_like
from .tensor import Tensor, assign, maximum, sqrt
from .validate import check_bool, check_callable, check_real, check_sequence, describe

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "CompiledStep"]


class Optimizer(abc.ABC):
    """Holds the parameters and their state; ``step`` writes all new values in one ``assign``.

    A subclass splits its update in two: ``_host(active)`` does the host's
    part (creates missing state, computes this step's numbers) and returns
    ``(order, destinations, states, hyper)``; ``_math(params, grads, states,
    hyper)`` is the pure tensor arithmetic that returns the new values in
    ``destinations`` order, with params and grads in ``order``.  ``step``
    runs ``_math`` as one jitted program; :meth:`compile_step` traces it
    into the whole training step.  Python floats in ``hyper`` are program
    inputs, so changing them (a schedule, Adam's bias corrections) never
    recompiles; ``None`` and list lengths are structure.

    >>> w = vkml.nn.Parameter([1.0, -2.0])
    >>> opt = vkml.optim.SGD([w], lr=0.1)
    >>> isinstance(opt, vkml.optim.Optimizer), len(opt.params)
    (True, 1)
    """

    def __init__(self, params, lr):
        owner = type(self).__name__
        if isinstance(params, Tensor) or not hasattr(params, "__iter__"):
            raise ArgumentError(f"{owner}: params must be an iterable of tensors (e.g. "
                                f"model.parameters()), got {type(params).__name__}")
        if hasattr(params, "parameters") and callable(params.parameters):
            raise ArgumentError(f"{owner}: got a module; pass model.parameters()")
        params = check_sequence(params, "params", owner)
        if not params:
            raise ArgumentError(f"{owner}: got an empty parameter list, so there is nothing to "
                                "optimise; pass model.parameters() of a model that has "
                                "parameters (a list of tensors with requires_grad=True)")
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
        #: taken by every step (``step``, a compiled step's call): two threads stepping one
        #: optimiser take turns, so no update is lost (each step reads the last one's values)
        self._turn = threading.RLock()

    @property
    def lr(self) -> float:
        """The learning rate; changing it between steps does not recompile (it is a program input).

        >>> w = vkml.nn.Parameter([1.0, -2.0])
        >>> opt = vkml.optim.SGD([w], lr=0.1)
        >>> opt.lr = 0.01
        >>> opt.lr
        0.01
        """
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = check_real(value, "lr", type(self).__name__, low=0.0, low_open=True)

    def zero_grad(self) -> None:
        """Set every parameter's ``.grad`` to None (backward accumulates into it).

        >>> w = vkml.nn.Parameter([1.0, -2.0])
        >>> opt = vkml.optim.SGD([w], lr=0.1)
        >>> (w * w).sum().backward()
        >>> opt.zero_grad()
        >>> w.grad is None
        True
        """
        for p in self.params:
            p.grad = None

    @boundary
    def step(self) -> None:
        """Update every parameter that has a ``.grad`` (the rest are skipped): ONE submission.

        >>> w = vkml.nn.Parameter([1.0, -2.0])
        >>> opt = vkml.optim.SGD([w], lr=0.1)
        >>> (w * w).sum().backward()
        >>> opt.step()
        >>> w
        tensor([ 0.8, -1.6], dtype=float32, requires_grad=True)
        """
        with self._turn:
            self._step()

    def _step(self):
        active = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not active:
            return
        self._check_grads(active)
        order, dsts, states, hyper = self._host(active)
        params = [self.params[i] for i in order]
        with no_grad():
            srcs = _update_program(type(self))(_plain_values(params), [p.grad for p in params],
                                               states, hyper)
        # Ctrl-C after the whole step, never inside it; a forward in another thread sees the
        # parameters before the step or after it, never some of each (``MODEL_TRACE``)
        with Deferred(), MODEL_TRACE.writing():
            _store(dsts, srcs)
            self._stepped(active)

    def compile_step(self, loss_fn) -> "CompiledStep":
        """The whole training step as ONE program: ``step = opt.compile_step(loss_fn)``, then
        ``loss = step(*batch)`` each step.

        ``step(*batch)`` does what ``zero_grad(); loss = loss_fn(*batch);
        loss.backward(); opt.step()`` does, but the forward, its derivative
        and the update are traced once into one jitted program and replayed:
        one submission per step and none of the per-operation graph building
        on the host.  See :class:`CompiledStep` for what is traced.

        >>> w = vkml.nn.Parameter([1.0, -2.0])
        >>> opt = vkml.optim.SGD([w], lr=0.1)
        >>> step = opt.compile_step(lambda target: ((w - target) ** 2).sum())
        >>> for _ in range(3):
        ...     loss = step(np.zeros(2, dtype=np.float32))
        ...
        >>> w
        tensor([ 0.51199996, -1.0239999 ], dtype=float32, requires_grad=True)
        >>> step.cache_info()["traces"]
        1
        """
        return CompiledStep(self, loss_fn)

    def _check_grads(self, active):
        """Refuse a ``.grad`` that cannot belong to its parameter, before anything is computed."""
        owner = type(self).__name__
        for i in active:
            p, g = self.params[i], self.params[i].grad
            if not isinstance(g, Tensor):
                raise ArgumentError(f"{owner}.step: parameter {i}'s .grad is a {type(g).__name__}, "
                                    "not a Tensor")
            if g.shape != p.shape:
                raise ShapeError(f"{owner}.step: parameter {i} has shape {p.shape} but its .grad has "
                                 f"shape {g.shape}")
            if g.dtype != p.dtype:
                raise DTypeError(f"{owner}.step: parameter {i} is {dtype_name(p.dtype)} but its .grad "
                                 f"is {dtype_name(g.dtype)}")

    @abc.abstractmethod
    def _host(self, active):
        """``(order, destinations, states, hyper)`` for a step of the parameters in ``active``."""

    @staticmethod
    @abc.abstractmethod
    def _math(params, grads, states, hyper):
        """The new values, in the destinations' order (the update's arithmetic)."""

    def _stepped(self, active) -> None:
        """Called after the values were written: advance host-side state (step counts)."""


def _plain_values(tensors):
    """The parameters as the update program's arguments: a parameter's NumPy array itself where
    it holds one (no Tensor or Var made per step; the program needs no gradient of its own),
    else the value cut from the gradient graph (``detach``)."""
    return [t.ir_var.value if type(t.ir_var.value) is np.ndarray else t.detach() for t in tensors]


def _array_of(arg):
    """The array a step's argument (an array, or a Tensor holding one) gives the program."""
    return arg if type(arg) is np.ndarray else arg.ir_var.value


def _store(dsts, srcs):
    """``assign(dsts, srcs)`` for the Vars ``srcs`` of values the update program just computed:
    each destination takes its source's Var as it is (a new value, held by nothing else), so a
    step makes no Var per destination.  A source that is still pending or of another type than
    its destination (a subclass's ``_math`` gone wrong) goes through :func:`assign`, which
    checks every pair before writing any."""
    for d, w in zip(dsts, srcs):
        v = d.ir_var
        if w.value is None or w.shape != v.shape or w.dtype is not v.dtype and \
                w.dtype != v.dtype or w.device != v.device:
            assign(dsts, [Tensor(s) for s in srcs])
            return
    for d, w in zip(dsts, srcs):
        d.ir_var = w
        if d.requires_grad:
            d._register_leaf()


class _FlatUpdate:
    """An optimiser class's ``_math`` as jitted programs called with one flat tuple of arrays.

    ``step`` hands the update (parameters, gradients, state, hyperparameters) over as the leaves
    of that pytree, one jitted program per tree structure (as :class:`CompiledStep` does), so a
    step after the first takes the jitted function's fast path: no flattening into Vars, no key
    and no signature per call, only the executable's run.  The programs are the ones
    ``jit(cls._math)`` traces (Python floats enter as weak scalars either way), so the values
    are the same bits."""

    def __init__(self, math):
        self.math = math
        #: one jitted update per tree structure of its arguments
        self._programs = {}

    def __call__(self, params, grads, states, hyper):
        """The Vars of the new values, in the destinations' order.  Taken from the jitted call
        as one flat list (``_call_overwriting``, overwriting nothing): on its fast path no
        Tensor is made per new value only to be unwrapped again."""
        leaves, tree = flatten_known((params, grads, states, hyper))
        program = self._programs.get(tree)
        if program is None:
            program = self._programs[tree] = jit(_Unflattened(self.math, tree))
        outs = program._call_overwriting(_update_arguments(leaves), _overwrite_nothing)
        return [o if type(o) is Var else o.ir_var for o in outs]

    def cache_info(self):
        """Traces, compiles and hits of the update's programs, summed over their structures."""
        return _summed_cache_info(self._programs.values())


def _overwrite_nothing(plan):
    """No destinations for a jitted call's results: each new value gets an array of its own."""
    return None


def _update_arguments(leaves):
    """The leaves of the update's arguments as its jitted program takes them: a Python number as
    a weak scalar, a gradient or a state tensor holding a NumPy array as that array (as the
    parameters are passed: ``_plain_values``; the program's key is then found from the array's
    type alone, a few microseconds a step less than from a tensor's), anything else as it is."""
    args = []
    for x in leaves:
        t = type(x)
        if t is Tensor:
            v = x.ir_var
            value = v.value
            args.append(value if type(value) is np.ndarray and not v.weak and not x.requires_grad
                        else x)
        elif t is float or t is int or t is bool:
            args.append(_weak_scalar(x))
        else:
            args.append(x)
    return args


def _summed_cache_info(programs) -> dict:
    """The ``cache_info`` counts of jitted ``programs`` (one per argument structure), summed."""
    total = {"traces": 0, "compiles": 0, "derived": 0, "hits": 0, "keys": 0}
    for program in programs:
        for name, count in program.cache_info().items():
            total[name] += count
    return total


_UPDATE_PROGRAMS = {}


def _update_program(cls):
    """``cls._math`` jitted (one per optimiser class, so its programs are shared by instances)."""
    program = _UPDATE_PROGRAMS.get(cls)
    if program is None:
        program = _UPDATE_PROGRAMS[cls] = _FlatUpdate(cls._math)
    return program


class CompiledStep:
    """A training step traced once: forward, gradient and update in ONE submission per call.

    Made by :meth:`Optimizer.compile_step`.  The first call traces
    ``loss_fn(*batch)`` with the optimiser's parameters as program inputs
    (their Tensor objects are pointed at the trace's placeholders while it
    runs, so a model that reads its own parameters needs no change), takes
    its gradient with :func:`vkml.value_and_grad` and applies the
    optimiser's update, all in one program; later calls with batches of the
    same shapes and dtypes only replay it.  After a call every parameter,
    its ``.grad`` and the optimiser's state hold their new values, as after
    ``opt.zero_grad(); loss.backward(); opt.step()``.

    A steady step updates the parameters and the optimiser's state where
    they are: the program computes each new value in the array of the old
    one, when it reads that array only before writing it (an update reads
    ``p[i]``, ``m[i]``, ``v[i]`` and then writes them) and nothing but the
    optimiser reaches the array; each gradient goes into the array of the
    last one the same way.  A value you hold never changes: after
    ``old = p.detach()``, ``a = p.numpy()``, ``g = p.grad`` or a pending
    expression of ``p``, that step writes new arrays and ``old``, ``a``, ``g``
    keep their values.  The bits are those of a step that writes new arrays.
    (A ``weakref`` holds nothing: one to a parameter's array follows the array and sees the
    values a step writes into it.)

    A step is applied whole or not at all: Ctrl-C during a step takes effect once its
    parameters, gradients, state and step count are all written; a step that fails writes
    nothing.  Steps of one optimiser called from two threads take turns, and a thread reading
    a parameter (``p.numpy()``) while another steps gets the values before or after the step,
    never a mix, and never an array that changes afterwards.

    As with :func:`vkml.jit`: tensors ``loss_fn`` reads that are neither
    the parameters nor the batch are constants of the program (pass
    anything that changes in ``batch``), and Python control flow runs once,
    at the trace.  Every parameter is stepped every call: one the loss does
    not use gets a zero gradient (``opt.step()`` after ``backward`` skips it).

    >>> w = vkml.nn.Parameter([1.0, -2.0])
    >>> step = vkml.optim.Adam([w], lr=0.1).compile_step(lambda: (w * w).sum())
    >>> step()
    tensor(5., dtype=float32)
    >>> isinstance(step, vkml.optim.CompiledStep)
    True
    """

    def __init__(self, opt, loss_fn):
        check_callable(loss_fn, "loss_fn", "compile_step")
        self.opt, self.loss_fn = opt, loss_fn
        self._order = None
        #: one jitted step per structure of its arguments (see ``__call__``)
        self._programs = {}
        #: the arrays of parameters and state this step made and still holds, by ``id``: the
        #: only ones it ever overwrites (see ``_destinations``)
        self._owned = {}
        #: the last fast-call plan of its programs and the destinations it may overwrite there
        #: (``_donatable``)
        self._slots = (None, [])
        #: the last step's Python numbers as weak scalars, by ``(type, value)`` (``_arguments``)
        self._scalars = {}

    def _whole(self, params, states, batch, hyper):
        """The traced step: the loss and its gradient in the parameters, then the update."""
        model = [self.opt.params[i] for i in self._order]

        def loss_of(ps, batch):
            MODEL_TRACE.enter_write()   # (forwards in other threads wait: parameters swapped)
            saved = [p.ir_var for p in model]
            try:
                for p, t in zip(model, ps):
                    p.ir_var = t.ir_var
                loss = self.loss_fn(*batch)
            finally:
                for p, v in zip(model, saved):
                    p.ir_var = v
                MODEL_TRACE.exit_write()
            if not isinstance(loss, Tensor) or loss.shape != () or loss.dtype.kind != "f":
                got = getattr(loss, "shape", type(loss).__name__)
                raise ArgumentError(f"compile_step: loss_fn must return a floating 0-d Tensor "
                                    f"(reduce it, e.g. .mean()), got {got}")
            return loss

        loss, grads = value_and_grad(loss_of)(params, batch)
        return loss, grads, type(self.opt)._math(params, grads, states, hyper)

    def __call__(self, *batch):
        """One step.  The step's arguments go to its jitted program as one flat tuple of
        Tensors and arrays (the pytree of parameters, state, batch and hyperparameters selects
        a jitted program of its own, ``_programs``), so a call after the first takes the jitted
        function's fast path: no key, Vars or second flattening per call, only the
        executable's run (the Python around the MLP bench's step went from ~75 to ~50 us).

        Steps of one optimiser called from several threads take turns (one lock per optimiser):
        each reads the values the last one wrote, so none is lost."""
        try:
            with self.opt._turn:
                return self._step(batch)
        except VkmlError as error:          # (the user's frames only: see hide_vkml_frames)
            hide_vkml_frames(error)
            raise

    def _step(self, batch):
        opt = self.opt
        active = list(range(len(opt.params)))
        order, dsts, states, hyper = opt._host(active)
        self._order = order
        params = [opt.params[i] for i in order]
        # (one list of the leaves alive at a time: ``_exclusive`` counts the references to them)
        args, tree = flatten_known((_plain_values(params), states, batch, hyper))
        program = self._programs.get(tree)
        first = program is None
        if first:
            program = self._programs[tree] = jit(_Unflattened(self._whole, tree))
        args = self._arguments(args)
        into = []

        def destinations(plan):
            into[:] = self._destinations(plan, dsts, args, 1 + len(params))
            self._gradients_into(plan, params, into)
            return into

        if first:           # traces and compiles: writes nothing in place
            outs = program._call_overwriting(args, destinations)
            with Deferred(), MODEL_TRACE.writing():
                return self._commit(active, params, dsts, outs, into)
        # From the call that may write in place to the last piece of bookkeeping, Ctrl-C waits
        # (the step is applied whole or not at all), a reader in another thread of an array being
        # written waits too (``writing``: ids, so the counts of references stay exact), and so
        # does a model's forward (``MODEL_TRACE``: it sees all old parameters or all new ones).
        if threading.active_count() == 1:   # (no other thread to read or forward meanwhile)
            readers = forwards = _NO_OTHER_THREAD
        else:
            marked = [id(d.ir_var) for d in dsts]
            marked += [id(p.grad.ir_var) for p in params if type(p.grad) is Tensor]
            readers, forwards = writing(marked), MODEL_TRACE.writing()
        with Deferred(), readers, forwards:
            outs = program._call_overwriting(args, destinations)
            return self._commit(active, params, dsts, outs, into)

    def _commit(self, active, params, dsts, outs, into):
        """Hand the step's results out: gradients, new values, step count; the loss."""
        loss, grads, new = _split_results(outs, len(params))
        for p, g in zip(params, grads):
            p.grad = g
        _store(dsts, new)
        # (``into`` is empty where the full path ran: it overwrote nothing)
        self._owned = {id(a): a for a, v in zip(into[1:], outs[1:]) if a is not None and v.value is a}
        self.opt._stepped(active)
        return loss

    def _arguments(self, leaves):
        """The program's arguments: ``leaves``, each Python number as a weak scalar Tensor
        (``_weak_scalar``) -- the last step's where the number is the same, so a hyperparameter
        that does not change (``lr``, Adam's ``1 - beta``) makes no Tensor per step.  Zero is
        made anew (``0.0 == -0.0``: for other numbers equal means the same bits); a weak scalar
        is never written, so sharing one between steps changes no value."""
        last, scalars, args = self._scalars, {}, []
        for x in leaves:
            t = type(x)
            if t is float or t is int or t is bool:
                key = (t, x)
                scalar = last.get(key) if x else None
                if scalar is None:
                    scalar = _weak_scalar(x)
                scalars[key] = scalar
                x = scalar
            args.append(x)
        self._scalars = scalars
        return args

    def _destinations(self, plan, dsts, args, first):
        """Where the step's program computes the new value of each destination ``dsts[d]``
        (result ``first + d``; None elsewhere): in the destination's own array where the
        executable may compute that result over that argument (``_FastPlan.overwritable``) and
        nothing but the optimiser reaches the array (``_exclusive``): the update reads
        ``p[i]``, ``m[i]`` and ``v[i]`` and writes them, no fresh parameter-sized buffer, no
        cold cache lines.  Where someone else holds the array (``old = p.detach()``,
        ``p.numpy()``, a pending expression of ``p``), in an array of the step's own instead,
        so the holder keeps the old values and the next step may write in place again."""
        into = [None] * len(plan.out_vars)
        if self._slots[0] is not plan:
            self._slots = (plan, self._donatable(plan, dsts, args, first))
        for d, k in self._slots[1]:
            dst = dsts[d]
            value = dst.ir_var.value
            if _array_of(args[k]) is not value:
                continue                        # (the destination is not this argument)
            if self._exclusive(dst, args[k] is not dst):
                into[first + d] = value
            else:
                into[first + d] = np.empty(dst.shape, dst.dtype)
        return into

    def _gradients_into(self, plan, params, into):
        """Each parameter's new gradient (result ``1 + i``) into the array of its last one where
        the step made it and nothing else holds it (``g = p.grad`` keeps its values), else into
        one of the step's own: no gradient-sized allocation in a steady step."""
        written = plan.writes_directly()
        for i, p in enumerate(params):
            if 1 + i in written:
                old = self._own_gradient(p)
                into[1 + i] = old if old is not None else np.empty(p.shape, p.dtype)

    def _own_gradient(self, param):
        """The array of ``param.grad`` when the step made it and alone reaches it (its Tensor,
        Var and array referenced only from the parameter and here: ``_HOLDERS``), else None."""
        grad = param.grad
        if type(grad) is not Tensor:
            return None
        var = grad.ir_var
        value = var.value
        if not EXACT_REFCOUNTS or self._owned.get(id(value)) is not value:
            return None
        if getrefcount(grad) == _HOLDERS["grad"] and getrefcount(var) == _HOLDERS["var"] and \
                getrefcount(value) == _HOLDERS["grad array"]:
            return value
        return None

    @staticmethod
    def _donatable(plan, dsts, args, first):
        """``(d, k)`` for each destination ``dsts[d]`` whose array is argument ``k``, which its new
        value (result ``first + d``) may be computed over (``_FastPlan.overwritable``): found once
        per plan (the leaves of one structure come in one order)."""
        allowed = plan.overwritable()
        position = {}
        for k, a in enumerate(args):            # (the first argument holding an array)
            if type(a) is Tensor or type(a) is np.ndarray:
                position.setdefault(id(_array_of(a)), k)
        slots = []
        for d, dst in enumerate(dsts):
            k = position.get(id(dst.ir_var.value))
            if k is not None and k in allowed.get(first + d, ()):
                slots.append((d, k))
        return slots

    def _exclusive(self, dst, in_args) -> bool:
        """Whether the optimiser alone reaches ``dst``'s array: the step made it (``_owned``),
        and the only references to it and to its Var are the step's own (``sys.getrefcount``:
        exact in CPython; ``_HOLDERS`` counts them) -- no Tensor, view, list or pending
        expression of anyone else's, which would see its values change.  (A reader in
        another thread between this count and the write waits for it: ``writing``.)  ``in_args``: the
        step's arguments hold the array itself (a parameter's), not ``dst``."""
        var = dst.ir_var
        value = var.value
        if not EXACT_REFCOUNTS or self._owned.get(id(value)) is not value:   # (made by the step)
            return False
        array_holders = _HOLDERS["array"] + in_args     # (the argument list's reference)
        return getrefcount(value) == array_holders and getrefcount(var) == _HOLDERS["var"]

    def cache_info(self):
        """Traces, compiles and hits of the step's programs (see ``vkml.jit``), summed over the
        structures it was called with.

        >>> w = vkml.nn.Parameter([1.0, -2.0])
        >>> step = vkml.optim.SGD([w], lr=0.1).compile_step(lambda: (w * w).sum())
        >>> _ = step()
        >>> _ = step()
        >>> info = step.cache_info()
        >>> info["traces"], info["hits"]
        (1, 1)
        """
        return _summed_cache_info(self._programs.values())

    def programs(self):
        """The step's traced programs, one per structure it was called with (what
        ``vkml.program`` would show of each): forward, gradient and update in one.

        >>> w = vkml.nn.Parameter([1.0, -2.0])
        >>> step = vkml.optim.SGD([w], lr=0.1).compile_step(lambda: (w * w).sum())
        >>> _ = step()
        >>> len(step.programs())
        1
        """
        return [p for program in self._programs.values() for p in program.programs()]


#: what a step guards against other threads with when there are none
_NO_OTHER_THREAD = contextlib.nullcontext()


def _split_results(outs, count):
    """The loss and the ``count`` gradients as Tensors and the new values' Vars, from a step
    program's flat results: Vars on the fast path (a Tensor only for what the step hands out),
    the full path's Tensors otherwise (as they are: one that requires grad keeps it)."""
    if type(outs[0]) is Var:
        return Tensor(outs[0]), [Tensor(v) for v in outs[1:1 + count]], outs[1 + count:]
    return outs[0], outs[1:1 + count], [t.ir_var for t in outs[1 + count:]]


class _Unflattened:
    """``fn(*tree)`` called with the leaves of ``tree`` as separate arguments (what a compiled
    step hands its jitted program: a flat tuple, which takes ``jit``'s fast path).  Slots, not
    a ``__dict__``: ``jit`` copies a callable's ``__dict__`` onto itself, as ``functools.wraps``."""

    __slots__ = ("fn", "tree", "__name__", "__weakref__")

    def __init__(self, fn, tree):
        self.fn, self.tree = fn, tree
        self.__name__ = fn.__name__         # what the jitted function is called in messages

    def __call__(self, *leaves):
        return self.fn(*unflatten(self.tree, list(leaves)))


def _weak_scalar(x):
    """A Python number as ``jit`` takes one: a weak-typed 0-d constant (float32 tensors it meets
    stay float32), here in a Tensor, so every argument of a compiled step is a plain array."""
    v = Var((), _FLOAT64, default_device(), value=np.array(x)) if type(x) is float else constant(x)
    v.weak = True
    return Tensor(v)


_FLOAT64 = np.dtype(np.float64)

#: the references ``CompiledStep._exclusive`` finds to an array and to the Var of a destination
#: only the optimiser reaches: the array's from ``_owned``, its Var, ``value`` there and in
#: ``_destinations``, and ``getrefcount``'s argument (one more for a parameter's array: the
#: step's argument list holds it itself); the Var's from its Tensor, ``var`` and
#: the argument.  ``_own_gradient``'s: a gradient Tensor's from its parameter, ``grad`` and the
#: argument; its array's from ``_owned``, its Var, ``value`` and the argument
_HOLDERS = {"array": 5, "var": 3, "grad": 3, "grad array": 4}


class SGD(Optimizer):
    """Stochastic gradient descent, with optional momentum, as ``torch.optim.SGD``.

    ``buf = momentum * buf + g`` (the buffer starts at zero, which makes the
    first step ``buf = g`` exactly, as in PyTorch, with the same program every
    step), then ``p -= lr * buf``.  ``weight_decay`` adds ``weight_decay * p``
    to the gradient first (L2).

    >>> w = vkml.nn.Parameter([1.0, -2.0])
    >>> opt = vkml.optim.SGD([w], lr=0.1, momentum=0.9)
    >>> for _ in range(2):
    ...     opt.zero_grad()
    ...     (w * w).sum().backward()
    ...     opt.step()
    ...
    >>> w
    tensor([ 0.46, -0.92], dtype=float32, requires_grad=True)
    """

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, dampening=0.0, nesterov=False):
        super().__init__(params, lr)
        self.momentum = check_real(momentum, "momentum", "SGD", low=0.0)
        self.weight_decay = check_real(weight_decay, "weight_decay", "SGD", low=0.0)
        self.dampening = check_real(dampening, "dampening", "SGD", low=0.0, high=1.0)
        self.nesterov = check_bool(nesterov, "nesterov", "SGD")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ArgumentError("SGD: nesterov=True needs momentum > 0 and dampening 0 (as in "
                                f"PyTorch), got momentum={self.momentum}, dampening={self.dampening}")
        self.momentum_buffers = [None] * len(self.params)

    def _host(self, active):
        params = [self.params[i] for i in active]
        bufs, damping = [], None
        if self.momentum:
            fresh = []
            for i in active:
                fresh.append(self.momentum_buffers[i] is None)
                if fresh[-1]:
                    self.momentum_buffers[i] = zeros_like(self.params[i])
            bufs = [self.momentum_buffers[i] for i in active]
            if self.dampening:      # PyTorch's first step takes the gradient undamped
                damping = [1.0 if new else 1.0 - self.dampening for new in fresh]
        # bufs is [] without momentum and weight_decay None without decay: both are structure
        # a flag enters as None or a number: hyper's leaves are program inputs, None is structure
        nesterov = self.momentum if self.nesterov else None
        return active, params + bufs, bufs, (self.lr, self.momentum, self.weight_decay or None,
                                             damping, nesterov)

    @staticmethod
    def _math(params, grads, bufs, hyper):
        """New parameters, then new momentum buffers."""
        lr, momentum, weight_decay, damping, nesterov = hyper
        new_params, new_bufs = [], []
        for k, (p, g) in enumerate(zip(params, grads)):
            if weight_decay is not None:
                g = g + weight_decay * p
            if bufs:
                buf = momentum * bufs[k] + (g if damping is None else damping[k] * g)
                new_bufs.append(buf)
                g = buf if nesterov is None else g + nesterov * buf
            new_params.append(p - lr * g)
        return new_params + new_bufs


class Adam(Optimizer):
    """Adam (Kingma & Ba), as ``torch.optim.Adam``.

    ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g*g``, then
    ``p -= lr/(1-b1**t) * m / (sqrt(v)/sqrt(1-b2**t) + eps)``.  The step
    count ``t`` is kept per parameter on the host (a parameter that had no
    gradient in some step is not advanced, as in PyTorch), and the bias
    corrections enter as Python floats: program inputs, so the update
    program is compiled once and reused every step.  ``weight_decay`` adds
    ``weight_decay * p`` to the gradient (L2, as ``torch.optim.Adam``).

    >>> w = vkml.nn.Parameter([1.0, -2.0])
    >>> opt = vkml.optim.Adam([w], lr=0.1)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w
    tensor([ 0.9, -1.9], dtype=float32, requires_grad=True)
    """

    #: weight decay taken out of the gradient and applied to the parameter itself (AdamW)
    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False):
        super().__init__(params, lr)
        owner = type(self).__name__
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ArgumentError(f"{owner}: betas must be a pair (beta1, beta2), got {describe(betas)}")
        self.betas = (check_real(betas[0], "beta1", owner, low=0.0),
                      check_real(betas[1], "beta2", owner, low=0.0))
        if self.betas[0] >= 1.0 or self.betas[1] >= 1.0:
            raise ArgumentError(f"{owner}: betas must be in [0, 1), got {tuple(betas)}")
        self.eps = check_real(eps, "eps", owner, low=0.0)
        self.weight_decay = check_real(weight_decay, "weight_decay", owner, low=0.0)
        self.amsgrad = check_bool(amsgrad, "amsgrad", owner)
        self.exp_avg = [None] * len(self.params)
        self.exp_avg_sq = [None] * len(self.params)
        #: the largest second moment so far, per parameter (``amsgrad``)
        self.max_exp_avg_sq = [None] * len(self.params)
        #: steps taken per parameter (host ints: the bias corrections are computed from them here).
        self.steps = [0] * len(self.params)

    def _host(self, active):
        b1, b2 = self.betas
        by_step = {}   # parameters with equal step counts share their bias corrections
        for i in active:
            if self.exp_avg[i] is None:
                self.exp_avg[i] = zeros_like(self.params[i])
                self.exp_avg_sq[i] = zeros_like(self.params[i])
                if self.amsgrad:
                    self.max_exp_avg_sq[i] = zeros_like(self.params[i])
            by_step.setdefault(self.steps[i] + 1, []).append(i)
        order, dsts, states, groups = [], [], [], []
        for t, idx in by_step.items():
            lr_t = self.lr / (1.0 - b1 ** t)
            moments = [(self.exp_avg[i], self.exp_avg_sq[i]) for i in idx]
            if self.amsgrad:
                moments = [pair + (self.max_exp_avg_sq[i],) for pair, i in zip(moments, idx)]
            states.append(moments)
            groups.append((1.0 / (lr_t * math.sqrt(1.0 - b2 ** t)), self.eps / lr_t))
            for i in idx:
                dsts += [self.exp_avg[i], self.exp_avg_sq[i]]
                dsts += [self.max_exp_avg_sq[i]] if self.amsgrad else []
                dsts.append(self.params[i])
            order += idx
        # (L2 added to the gradient, the factor shrinking the parameter): None where not used
        decay = (None, 1.0 - self.lr * self.weight_decay) if self.decoupled else \
            (self.weight_decay, None)
        decay = decay if self.weight_decay else None
        return order, dsts, states, (groups, 1.0 - b1, 1.0 - b2, decay)

    @staticmethod
    def _math(params, grads, states, hyper):
        """New (m, v, parameter) for each parameter, group by group of equal step count.

        A group's bias corrections are folded into ``k1 = 1/(lr_t * sqrt(1 - b2**t))``
        and ``k2 = eps/lr_t``, ``lr_t = lr/(1 - b1**t)``: then ``p - lr_t *
        m/(sqrt(v)/sqrt(1 - b2**t) + eps)`` is ``p - m/(sqrt(v)*k1 + k2)``, two
        operations fewer per parameter.  The moments are updated as
        ``m + (1-b1)*(g - m)``, PyTorch's ``lerp``.
        """
        groups, c1, c2, weight_decay = hyper
        out, pos = [], 0
        for (k1, k2), moments in zip(groups, states):
            for state in moments:
                m, v = state[:2]
                p, g = params[pos], grads[pos]
                pos += 1
                l2, shrink = weight_decay if weight_decay is not None else (None, None)
                if shrink is not None:                     # AdamW: shrink the parameter itself
                    p = p * shrink
                if l2 is not None:
                    g = g + l2 * p
                m = m + c1 * (g - m)
                v = v + c2 * (g * g - v)
                if len(state) == 3:                        # amsgrad: the largest v so far
                    top = maximum(state[2], v)
                    out += [m, v, top, p - m / (sqrt(top) * k1 + k2)]
                else:
                    out += [m, v, p - m / (sqrt(v) * k1 + k2)]
        return out

    def _stepped(self, active):
        for i in active:
            self.steps[i] += 1


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as ``torch.optim.AdamW``: each
    step first shrinks the parameter, ``p *= 1 - lr * weight_decay``, then takes Adam's step
    with the plain gradient.  ``weight_decay`` defaults to 0.01, as in PyTorch.

    >>> w = vkml.nn.Parameter([1.0, -2.0])
    >>> opt = vkml.optim.AdamW([w], lr=0.1, weight_decay=0.5)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w
    tensor([ 0.84999996, -1.8       ], dtype=float32, requires_grad=True)
    """

    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 amsgrad=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)


class RMSprop(Optimizer):
    """RMSprop, as ``torch.optim.RMSprop``: ``sq = alpha sq + (1 - alpha) g^2`` (and with
    ``centered`` the mean ``ga = alpha ga + (1 - alpha) g``, subtracting ``ga^2``), then
    ``p -= lr g / (sqrt(sq) + eps)`` -- through a momentum buffer when ``momentum`` > 0.

    >>> w = vkml.nn.Parameter([1.0, -2.0])
    >>> opt = vkml.optim.RMSprop([w], lr=0.01)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w
    tensor([ 0.90000004, -1.9       ], dtype=float32, requires_grad=True)
    """

    def __init__(self, params, lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False):
        super().__init__(params, lr)
        self.alpha = check_real(alpha, "alpha", "RMSprop", low=0.0, high=1.0)
        self.eps = check_real(eps, "eps", "RMSprop", low=0.0)
        self.weight_decay = check_real(weight_decay, "weight_decay", "RMSprop", low=0.0)
        self.momentum = check_real(momentum, "momentum", "RMSprop", low=0.0)
        self.centered = check_bool(centered, "centered", "RMSprop")
        self.square_avg = [None] * len(self.params)
        self.grad_avg = [None] * len(self.params)
        self.momentum_buffer = [None] * len(self.params)

    def _host(self, active):
        states, dsts = [], []
        for i in active:
            p = self.params[i]
            if self.square_avg[i] is None:
                self.square_avg[i] = zeros_like(p)
                if self.centered:
                    self.grad_avg[i] = zeros_like(p)
                if self.momentum:
                    self.momentum_buffer[i] = zeros_like(p)
            # a dict: its keys say which state there is (structure, not program inputs)
            state = {"square": self.square_avg[i]}
            if self.centered:
                state["mean"] = self.grad_avg[i]
            if self.momentum:
                state["buffer"] = self.momentum_buffer[i]
            states.append(state)
            dsts += [state[k] for k in ("square", "mean", "buffer") if k in state] + [p]
        return active, dsts, states, (self.lr, self.alpha, 1.0 - self.alpha, self.eps,
                                      self.weight_decay or None, self.momentum or None)

    @staticmethod
    def _math(params, grads, states, hyper):
        """For each parameter: its new state (square average, gradient average, buffer), then it."""
        lr, alpha, rest, eps, weight_decay, momentum = hyper      # rest = 1 - alpha
        out = []
        for p, g, state in zip(params, grads, states):
            if weight_decay is not None:
                g = g + weight_decay * p
            sq = alpha * state["square"] + rest * (g * g)
            new = [sq]
            if "mean" in state:
                ga = alpha * state["mean"] + rest * g
                new.append(ga)
                avg = sqrt(sq - ga * ga) + eps
            else:
                avg = sqrt(sq) + eps
            if momentum is not None:
                buf = momentum * state["buffer"] + g / avg
                new.append(buf)
                p = p - lr * buf
            else:
                p = p - lr * (g / avg)
            out += new + [p]
        return out
