"""Traced programs: ``jit``, ``scan`` and the derivative transformations, on Tensors.

How one call of a jitted function works: ``jit(body)`` keeps one
Program per *key* -- the pytree structure of the arguments with each leaf's
dtype, shape and device (and which leaves are the same array) -- tracing the
body once per key; each program compiles once per *variant* (backend and
argument layout).  ``grad`` derives from the key's program its derivative
(``jvp``), splits it into the part that reads no tangent and the part linear
in the tangents, and transposes the linear part: every derived program is
cached per derivation, so a second gradient with the same key traces,
derives and compiles nothing.

Arguments and results are pytrees of Tensors, NumPy arrays and Python
numbers.  With concrete arguments a call runs at once; with lazy or traced
arguments (inside another trace, or tensors that require grad) it becomes one
``call`` equation of the larger graph, so autograd flows through it and the
whole graph is still one submission.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import numbers
import threading
import types
import weakref

import numpy as np

from . import runtime
from .backends.base import ExecutionFailure
from .backends.cpu import Tiered
from .backends.numpy_backend import FRESH
from .errors import (ArgumentError, DTypeError, GradError, ShapeError, TracingError, VkmlError,
    boundary, hide_vkml_frames)
from .ir import (Program, Var, collect, current_serial, dtype_name, format_shape,
                 program_from_dag)
from .ops import api, bind
from .ops.checks import checked
from .printer import pp_program
from .pytree import broadcast_prefix, flatten, leaf_paths, unflatten
from .runtime import call_context
from .stats import STATS
from .tensor import (Tensor, cast, concatenate, flip, logical_and, needs_grad, realize, reshape,
                     tensor, where)
from .threadsafe import Cache
from .transforms import jvp_program, partial_eval, transpose_program, vmap_program
from .transforms.ad import derived
from .transforms.control import (call, cond_p, custom_jvp_p, custom_vjp_p, depends_on, remat_p,
                                 scan_bind, while_p)
from .transforms.interpret import inline
from .validate import MAX_ELEMENTS, check_bool, check_int, check_real, check_sequence, host_memory

__all__ = ["jit", "scan", "grad", "value_and_grad", "vjp", "jvp", "linearize", "program",
           "pp_program", "Jitted", "vmap", "jacfwd", "jacrev", "hessian", "hvp", "cond", "switch",
           "while_loop", "custom_jvp", "custom_vjp", "checkpoint", "check_grads", "GradCheckError",
           "fori_loop", "associative_scan"]


# -- arguments -------------------------------------------------------------------------------

def _leaf_var(x, where):
    """The IR Var of one argument leaf: a Tensor's own, or a constant for an array/number."""
    if isinstance(x, Tensor):
        return x.ir_var
    if type(x) is float:        # the common number (a step size): what api.constant makes, directly
        arr = np.array(x)
        arr.flags.writeable = False
        return Var((), arr.dtype, api.default_device(), value=arr, weak=True)
    if isinstance(x, bool) or isinstance(x, (int, float)) and not isinstance(x, np.generic):
        v = api.constant(x)
        v.weak = True
        return v
    if isinstance(x, (np.ndarray, np.generic, numbers.Number)):
        return api.constant(x)
    raise ArgumentError(f"{where}: argument leaves must be Tensors, NumPy arrays or numbers, got "
                        f"{type(x).__name__}; pass pytrees of tuples, lists and dicts of those")


def _signature(vars_):
    """The key's per-leaf part: each leaf's type, and which leaves are the same value (aliasing)."""
    sig = tuple([(v.shape, v.dtype, v.device, v.weak) for v in vars_])
    ids = [id(v.value) if v.value is not None else id(v) for v in vars_]
    if len(set(ids)) == len(ids):
        return sig, ()
    return sig, tuple(ids.index(i) for i in ids)


_FLAT_TREES = {}

#: fast-call plans a jitted function keeps at most (see Jitted._remember)
_FAST_PLANS = 8


#: (one global name, not ``np.ndarray``'s two lookups: ``_fast_key`` reads it per argument)
_NDARRAY = np.ndarray


def _fast_key(args):
    """The types of plain concrete arguments (NumPy arrays, Tensors holding a NumPy value and
    not requiring grad) with their strides, and the call's context (backend, default device,
    matmul mode): all a call of such arguments depends on, found without flattening them or
    making Vars; None for any other call (it takes the full path).  Two Tensors sharing one
    value make the full path's aliasing key: refused here.

    The key is one flat tuple (no tuple per argument: less to build, hash and compare); an
    array's part ends with its strides, a Tensor's has its device (a string) there instead,
    so arrays and Tensors never make the same key."""
    key = [*call_context()]
    tensors = 0
    first = None            # the first Tensor's value: with two Tensors, the only one to share
    for a in args:
        if type(a) is _NDARRAY:
            key += (a.shape, a.dtype, a.strides)
        elif type(a) is Tensor:
            v = a.ir_var
            value = v.value
            if a.requires_grad or type(value) is not np.ndarray or value is first:
                return None
            if first is None:
                first = value
            key += (v.shape, v.dtype, v.device, v.weak, value.strides)
            tensors += 1
        else:
            return None
    if tensors > 2 and len({id(a.ir_var.value) for a in args if type(a) is Tensor}) < tensors:
        return None
    return tuple(key)


#: backends whose executables take and return NumPy arrays on the host
_HOST_BACKENDS = ("numpy", "cpu")


class _ProgramCache(Cache):
    """A jitted function's programs by key, counting the times entries may have gone (cleared or
    trimmed), so a fast-call plan checks its entry only after such a time."""

    def __init__(self, name):
        super().__init__(name)
        self.removals = 0

    def clear(self):
        self.removals += 1
        super().clear()

    def _trim(self):
        before = len(self._data)
        super()._trim()
        if len(self._data) != before:
            self.removals += 1


class _FastPlan:
    """A jitted call with plain concrete arguments (``_fast_key``), ready to run: the key and
    entry the full path found (checked still cached after every clear or trim of the programs,
    so such a call then traces again), the executable, and how results become Tensors.

    The arguments' arrays go to the executable as they are: the full path copies a NumPy
    argument into a read-only constant first, which matters only if a result could be a view of
    it -- such a result is copied here instead.  Arguments of the same types and strides as the
    ones the plan was made for are C-contiguous when those were: a compiled executable is then
    called without checking them again (``call_ready``)."""

    __slots__ = ("key", "entry", "tiered", "call", "eqns", "out_vars", "tree", "single", "arrays",
                 "removals", "used", "contiguous", "plain", "exe", "lone")

    def __init__(self, key, entry, program, exe, args, removals, tree):
        """``program``: what the plan runs (the entry's, or one derived from it); ``tree``: the
        results' treedef (None: ``run`` returns the list of result Tensors)."""
        self.key, self.entry, self.removals = key, entry, removals
        self.eqns = program.eqns
        self.out_vars = [(o.shape, o.dtype, o.device) for o in program.outputs]
        self.tree = tree
        self.single = tree is not None and tree.kind == "leaf"
        # the caller's own arrays, when a result could be a view of one (one not made fresh by
        # an arithmetic equation: a reshape, a slice, an argument itself)
        fresh = {o for e in self.eqns if e.prim.name in FRESH for o in e.outputs}
        aliasing = any(o not in fresh for o in program.outputs)
        self.arrays = [i for i, a in enumerate(args) if type(a) is np.ndarray] if aliasing else []
        self.contiguous = all((a if type(a) is np.ndarray else a.ir_var.value).flags.c_contiguous
                              for a in args)
        self.plain = all(type(a) is np.ndarray for a in args)   # no Tensor to take the value of
        self.tiered = exe if type(exe) is Tiered else None     # swapped for its C function when hot
        self.call = self._direct(exe)
        self.exe = exe
        self.used = False

    def _direct(self, exe):
        """What to call: a compiled executable's ``call_ready`` where the arguments are known
        contiguous, else the executable.  A compiled executable's results are arrays of its own,
        never views of the caller's.  Sets ``lone``: the call has one result, handed out as it is
        (``run``'s shortest way)."""
        ready = getattr(exe, "call_ready", None)
        if ready is not None:
            self.arrays = []
        self.lone = self.single and not self.arrays
        if ready is None:
            return exe
        return ready if self.contiguous else exe

    @staticmethod
    def fits(args, entry) -> bool:
        """Whether the arguments go to the executable as they are: every NumPy argument already
        has the dtype its program input has (else the full path casts it)."""
        return all(type(a) is not np.ndarray or a.dtype == v.dtype
                   for a, v in zip(args, entry.program.inputs))

    def valid(self, entries) -> bool:
        """Whether the entry is still the cached one for the key (checked after a removal)."""
        if self.removals == entries.removals:
            return True
        removals = entries.removals
        if entries.get(self.key) is not self.entry:
            return False
        self.removals = removals
        return True

    def overwritable(self) -> dict:
        """Per result, the arguments (by index) the executable may compute it in (see
        ``run``'s ``into``); asked once by a caller that donates buffers."""
        return getattr(self.exe, "overwritable", {})

    def writes_directly(self) -> frozenset:
        """The results the executable computes straight into a destination given for them."""
        return getattr(self.exe, "writes_directly", frozenset())

    def run(self, args, into=None, flat=False):
        """Run on ``args``; ``into`` (None or one array or None per result): destinations the
        executable computes results in where it can -- an argument's own array only where
        ``overwritable`` allows that argument for that result.  ``flat``: return the list of
        result Vars, not a tree of Tensors (a caller that splits them itself skips
        unflattening, and makes Tensors only of the results it hands out)."""
        self.used = True
        STATS.submissions += 1
        if not self.plain:
            args = [a if type(a) is _NDARRAY else a.ir_var.value for a in args]
        try:
            outs = self.call(args) if into is None else self.call(args, into)
        except ExecutionFailure as failure:
            raise runtime.execution_error(failure, self.eqns) from failure.error
        except MemoryError as error:
            raise runtime.execution_error(error, self.eqns) from None
        if self.tiered is not None and self.tiered.compiled:    # hot: its C function from now on
            self.call, self.tiered = self._direct(self.tiered.current), None
        if self.lone and not flat:
            shape, dtype, device = self.out_vars[0]
            return _result_tensor(shape, dtype, device, outs[0])
        results = []
        for j, ((shape, dtype, device), val) in enumerate(zip(self.out_vars, outs)):
            if self.arrays and (into is None or into[j] is not val):     # (a donated argument's)
                val = self._unaliased(val, args)
            var = Var(shape, dtype, device, None, val)
            results.append(var if flat else Tensor(var))
        if self.tree is None or flat:
            return results
        return results[0] if self.single else unflatten(self.tree, results)

    def _unaliased(self, val, args):
        """``val``, copied when it shares memory with one of the caller's arrays."""
        if any(np.may_share_memory(val, args[i]) for i in self.arrays):
            return val.copy()
        return val


_new = object.__new__
_holding = Var.holding


def _result_tensor(shape, dtype, device, value):
    """``Tensor(Var(shape, dtype, device, value=value))``, made field by field: a tiny jitted
    call's result without the two ``__init__`` calls (a twentieth of the call's time).  Every
    field the constructors set is set here, to the same values (tests/test_fast_results.py
    checks it against them, so a new field cannot be missed)."""
    result = _new(Tensor)
    result.ir_var = _holding(shape, dtype, device, value)
    result.requires_grad = False
    result.grad = None
    return result


def _forget_fast_plans():
    for jitted in list(_LIVE):
        jitted._forget_plans()


runtime.ON_CLEAR.append(_forget_fast_plans)


def _flat_args(args):
    """Flatten call arguments, with fast paths for a flat tuple of Tensors (the common call) and
    for tuples and lists of Tensors and floats (an optimiser's update: parameters, gradients,
    state and step sizes)."""
    for a in args:
        if type(a) is not Tensor:
            leaves = []
            tree = _known_tree(_container_signature(args, leaves, 0), args, leaves)
            if tree is None:
                leaves, tree = flatten(args)
            return leaves, tree, [_leaf_var(x, "jit") for x in leaves]
    tree = _FLAT_TREES.get(len(args))
    if tree is None:
        tree = _FLAT_TREES[len(args)] = flatten(args)[1]
    return list(args), tree, [a.ir_var for a in args]


#: argument treedefs by their container signature (see _container_signature), each made once;
#: at most _TREE_SIGNATURES of them (a program's key holds its own treedef, so forgetting is safe)
_TREES_BY_SIGNATURE = {}
_TREE_SIGNATURES = 256


#: the leaves of a container signature: Tensors, arrays and Python numbers
_SIGNATURE_LEAVES = frozenset({Tensor, np.ndarray, float, int, bool})


def _container_signature(tree, leaves, depth):
    """The shape of ``tree`` -- tuples, lists and None over Tensors, arrays and numbers -- as nested tuples
    that hash and compare in C, its leaves appended to ``leaves``; None for anything else.

    Flattening an optimiser's arguments node by node and comparing the treedefs they make cost
    ~20 us a step (a treedef compares in Python); this signature finds the one treedef made for
    its shape the first time, so the key compares it by identity."""
    t = type(tree)
    if t in _SIGNATURE_LEAVES:
        leaves.append(tree)
        return 0
    if tree is None:
        return 1
    if (t is tuple or t is list) and depth < 16:
        children = []
        for child in tree:
            if type(child) in _SIGNATURE_LEAVES:    # most children are leaves: no call for them
                leaves.append(child)
                children.append(0)
                continue
            sig = _container_signature(child, leaves, depth + 1)
            if sig is None:
                return None
            children.append(sig)
        return (t is list, tuple(children))
    return None


def flatten_known(tree):
    """``pytree.flatten(tree)``, its treedef found by signature (``_container_signature``) where
    ``tree`` is tuples, lists and None over Tensors, arrays and numbers -- a compiled training
    step's or an optimiser update's arguments, flattened every step -- and so the same object
    each time."""
    leaves = []
    found = _known_tree(_container_signature(tree, leaves, 0), tree, leaves)
    return (leaves, found) if found is not None else flatten(tree)


def _known_tree(signature, args, leaves):
    """The treedef of ``args`` by its signature (None: there is none); the first time, made by
    ``flatten`` and kept only if ``flatten`` finds the same leaves."""
    if signature is None:
        return None
    tree = _TREES_BY_SIGNATURE.get(signature)
    if tree is None:
        found, tree = flatten(args)
        if len(found) != len(leaves) or any(a is not b for a, b in zip(found, leaves)):
            return None
        if len(_TREES_BY_SIGNATURE) >= _TREE_SIGNATURES:
            _TREES_BY_SIGNATURE.clear()
        _TREES_BY_SIGNATURE[signature] = tree
    return tree


class _Entry:
    """One key's program and everything derived from it."""

    __slots__ = ("program", "out_tree", "derived", "executables", "captures")

    def __init__(self, program, out_tree, captures=()):
        self.program = program
        self.out_tree = out_tree
        # values of enclosing traces the function closes over: the program's last inputs
        self.captures = tuple(captures)
        self.derived = {}
        self.executables = {}


def _trace(fn, in_tree, in_vars, where):
    """Run ``fn`` on placeholder Tensors; return its Program, output treedef and captures.

    Captures are the values of enclosing traces ``fn`` closes over (``x`` in
    ``grad(lambda x: grad(lambda y: x * y)(1.0))``): they have no value yet,
    so they become the program's last inputs, and every transformation passes
    them along undifferentiated -- the enclosing transformation then
    differentiates (or batches) through the call of the inner program.
    """
    start = current_serial()
    placeholders = [Var(v.shape, v.dtype, v.device, weak=v.weak) for v in in_vars]
    args = unflatten(in_tree, [Tensor(p) for p in placeholders])
    STATS.traces += 1
    with _grad_disabled(), _open_trace(placeholders):
        out = fn(*args)
    out_leaves, out_tree = flatten(out)
    outs = [_leaf_var(o, where + " result") for o in out_leaves]
    captures = _realize_captures(outs, placeholders, start)
    if not captures:
        return program_from_dag(placeholders, outs), out_tree, ()
    inner = program_from_dag(placeholders + captures, outs)
    fresh = _placeholders_like(inner.inputs)     # the program does not hold the outer graph
    return program_from_dag(fresh, inline(inner, fresh)), out_tree, captures


def _input_names(fn, in_tree, count):
    """What to call a traced function's inputs in its printed program and pictures: each leaf
    by its path from the parameter it came in (``x``, ``p['W1']``, ``params[1][0]``), captured
    values of an enclosing trace as ``outer0``...; None where the function's parameters cannot
    be read."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    if in_tree.kind != "tuple":
        return None
    names = []
    for i, child in enumerate(in_tree.children):
        names += leaf_paths(child, params[i].name if i < len(params) else f"args[{i}]")
    names += [f"outer{k}" for k in range(count - len(names))]
    return names if len(names) == count else None


def _grad_disabled():
    """Inside a trace, requires_grad bookkeeping is the derivation's job, not the tape's."""
    return runtime.no_grad()


#: placeholders of traces that have finished: a value made from one can never be computed
_FINISHED = weakref.WeakSet()


class _open_trace:
    """While a function is traced, values made from its placeholders may be closed over by the
    functions that nested transformations trace (they become those programs' captures); once it
    returns, its placeholders are finished."""

    def __init__(self, placeholders):
        self.placeholders = placeholders

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _FINISHED.update(self.placeholders)


def _of_open_trace(var) -> bool:
    """Whether ``var`` is a value of a trace still running (False: it can be computed).  A value
    of a finished trace (one kept after its function returned) is refused: it has no value and
    never will."""
    if var.value is not None:
        return False
    leaves, _ = collect([var])
    unknown = [v for v in leaves if v.value is None]
    for v in unknown:
        if v in _FINISHED:
            raise TracingError(
                f"a traced value ({v.type_str()}) from another trace was used here, and that trace "
                "has finished (was the value kept after its function returned?); pass it as an "
                "argument of the function instead of capturing it")
    return bool(unknown)


def _realize_captures(outs, placeholders, start):
    """Tensors a traced function closes over become constants of its program (as in JAX):
    pending ones are computed now.  Pass a tensor as an argument if it changes or needs a gradient.
    Returns the captured values of enclosing traces (they have no value to compute)."""
    inputs = set(placeholders)
    leaves, _ = collect(outs, is_leaf=lambda v: v in inputs or v.value is not None or v.serial < start)
    outer = [v for v in leaves if v not in inputs and _of_open_trace(v)]
    traced = set(outer)
    pending = [v for v in leaves if v not in inputs and v.value is None and v.eqn is not None
               and v not in traced]
    runtime.realize(pending, keep_history=True)
    return outer


# -- jit ----------------------------------------------------------------------------------------

def _wrap_function(jitted, fn):
    """``functools.update_wrapper(jitted, fn)`` (name, docstring, ``fn``'s own attributes,
    ``__wrapped__``), attribute by attribute: reading an object's ``__dict__`` makes CPython
    keep its attributes in a dict of their own from then on, and every attribute
    ``Jitted.__call__`` reads or counts would cost ~10 ns more.  An attribute of ``fn`` named
    as one of the Jitted's own (a callable object's ``fn`` or ``hits``, a method's name) or as
    vkml's marks is not copied: it would break the Jitted."""
    for name in functools.WRAPPER_ASSIGNMENTS:
        try:
            value = getattr(fn, name)
        except AttributeError:
            continue
        setattr(jitted, name, value)
    for name, value in getattr(fn, "__dict__", {}).items():
        if name not in (_OWN_JIT, _OWN_CALLER) and not hasattr(jitted, name):
            setattr(jitted, name, value)
    jitted.__wrapped__ = fn


class Jitted:
    """A function traced once per key into a Program and compiled once per variant.

    >>> f = vkml.jit(lambda x: x + 1)
    >>> isinstance(f, vkml.Jitted), f(np.float64(1.0))
    (True, tensor(2., dtype=float64))
    """

    def __init__(self, fn):
        if not callable(fn):
            raise ArgumentError(f"jit: expected a function, got {type(fn).__name__}")
        self.fn = fn
        # one program per key, the least recently used dropped past vkml.set_cache_limit
        self._entries = _ProgramCache("jit programs")
        self.traces = self.compiles = self.derivations = self.hits = 0
        # fast-call plans (see _FastPlan), by the arguments' types and the backend, and the
        # (key, plan) of the last call that found one: the next call of the same types then
        # compares its key, without hashing it (one tuple: read and replaced at once)
        self._fast = {}
        self._last = (None, None)
        _wrap_function(self, fn)
        if not hasattr(self, "__name__"):       # a callable object: named by its class
            self.__name__ = type(fn).__name__
        _LIVE.add(self)

    @staticmethod
    def _key(in_tree, in_vars):
        """The key a call's program is cached by (see the module docstring); the matmul mode is
        read when ops are bound, so a trace depends on it."""
        return (in_tree, _signature(in_vars), runtime.is_deterministic_matmul())

    def _lookup(self, args):
        leaves, in_tree, in_vars = _flat_args(args)
        key = self._key(in_tree, in_vars)
        entry = self._entries.get(key)
        if entry is None:
            self._touch_fast_plans()
            program, out_tree, captures = _trace(self.fn, in_tree, in_vars, self.__name__)
            program.arg_names = _input_names(self.fn, in_tree, len(program.inputs))
            program.fn_code = getattr(self.fn, "__code__", None)
            entry = _Entry(program, out_tree, captures)
            if not captures:
                # a closure over an enclosing trace's values is traced again on the next call,
                # which closes over other values; its derivations are still cached by structure.
                # Two threads tracing one key at once both use the program stored first.
                entry = self._entries.put_first(key, entry)
            self.traces += 1
        else:
            self.hits += 1
            STATS.cache_hits += 1   # a call that found its program traced (and compiled) already
        return entry, leaves, in_vars + list(entry.captures)

    def __call__(self, *args, **kwargs):
        try:
            if kwargs:
                return self._keyword_call(args, kwargs)
            fast = _fast_key(args)
            last, plan = self._last
            if fast != last:
                plan = self._fast.get(fast)         # (None for a key of None: never stored)
                if plan is not None:
                    self._last = (fast, plan)
            if plan is not None and (plan.removals == self._entries.removals or
                                     plan.valid(self._entries)):
                self.hits += 1
                STATS.cache_hits += 1
                return plan.run(args)
            entry, leaves, in_vars = self._lookup(args)
            requires = False
            for x in leaves:
                if type(x) is Tensor and x.requires_grad:
                    requires = True
                    break
            outs = _apply_program(self, entry, "primal", entry.program, in_vars, requires)
            if fast is not None and not entry.captures:
                self._remember(fast, args, entry, in_vars)
            return unflatten(entry.out_tree, outs)
        except VkmlError as error:          # (the user's frames only: see hide_vkml_frames)
            hide_vkml_frames(error)
            raise

    def _call_overwriting(self, args, destinations):
        """``self(*args)``'s results as one flat list, with results computed over arguments the
        caller owns: on the fast path, ``destinations(plan)`` gives ``into`` for
        ``_FastPlan.run`` (None: none) and the list holds the results' Vars; a call without a
        plan takes the full path, overwrites nothing (the next one has a plan) and gives its
        result Tensors.  An optimiser's compiled step updates parameters and moments in place
        with it, and splits the flat results itself."""
        plan = self._plan(_fast_key(args))
        if plan is None:
            return flatten(self(*args))[0]
        return plan.run(args, destinations(plan), flat=True)

    #: the jitted function keyword calls go to (made on the first one)
    _keywords = None

    def _keyword_call(self, args, kwargs):
        """Keyword arguments are traced arguments, as positional ones are (as in JAX): the call
        goes to a jitted function taking them as one last positional dict, so their names are
        part of its key and their values never bake into a program."""
        inner = self._keywords
        if inner is None:
            inner = self._keywords = Jitted(_with_keywords(self.fn))
        return inner(*args, kwargs)

    def _plan(self, fast):
        """The plan kept for ``fast`` while its entry is still cached (counted as a hit), or None."""
        plan = self._fast.get(fast)
        if plan is None or not (plan.removals == self._entries.removals or
                                plan.valid(self._entries)):
            return None
        self.hits += 1
        STATS.cache_hits += 1
        return plan

    def _remember(self, fast, args, entry, in_vars, derived=None):
        """Keep the plan of a call with plain arguments, so the next call with arguments of the
        same types skips flattening, the key and its Vars (a few plans: a sweep over many shapes
        replaces them).  ``derived``: ``(name, make)``, a program derived from the entry that
        the plan runs instead (its results a list), made once."""
        backend = runtime.current_backend()
        if backend.name not in _HOST_BACKENDS or entry.captures:
            return
        if len(self._fast) >= _FAST_PLANS:
            self._forget_plans()
        key = self._key(flatten(args)[1], in_vars)
        removals = self._entries.removals
        if self._entries.get(key) is not entry or not _FastPlan.fits(args, entry):
            return
        tag, program, tree = "primal", entry.program, entry.out_tree
        if derived is not None:
            tag, program, tree = derived[0], self._derive(entry, derived[0], derived[1]), None
        exe = _executable(self, entry, tag, program, backend, [v.value for v in in_vars])
        self._fast[fast] = _FastPlan(key, entry, program, exe, args, removals, tree)

    def _forget_plans(self):
        """Drop every fast-call plan (the last call's too)."""
        self._fast.clear()
        self._last = (None, None)

    def _touch_fast_plans(self):
        """Calls through fast-call plans skip the programs' cache: before that cache may drop
        its least recently used entry, mark the entries those calls used as recently used."""
        for plan in list(self._fast.values()):
            if plan.used:
                plan.used = False
                self._entries.get(plan.key)

    def _derive(self, entry, name, make):
        """A derived program of ``entry``, made once per derivation ``name``."""
        prog = entry.derived.get(name)
        if prog is None:
            before, counted = STATS.derivations, self.derivations
            prog = entry.derived[name] = make()
            # at least this one; derivations ``make`` made through _derive are counted already
            nested = self.derivations - counted
            self.derivations += max(1, STATS.derivations - before - nested)
        return prog

    def cache_info(self) -> dict:
        """Traces, compiles (executables made for its programs' variants), derived programs and
        hits (calls that found their key's program) of this function so far.

        >>> f = vkml.jit(lambda x: 2 * x)
        >>> _ = f(np.ones(2))
        >>> _ = f(np.zeros(2))
        >>> info = f.cache_info()
        >>> info["traces"], info["hits"]
        (1, 1)
        """
        info = {"traces": self.traces, "compiles": self.compiles,
                "derived": self.derivations, "hits": self.hits, "keys": len(self._entries)}
        if self._keywords is not None:          # keyword calls count as calls of this function
            for k, v in self._keywords.cache_info().items():
                info[k] += v
        return info

    def programs(self):
        """Every key's Program (what ``vkml.program`` shows).

        >>> f = vkml.jit(lambda x: 2 * x)
        >>> _ = f(np.ones(2))
        >>> _ = f(np.ones(3))
        >>> len(f.programs())
        2
        """
        keyword = self._keywords.programs() if self._keywords is not None else []
        return [e.program for e in self._entries.values()] + keyword

    def derived_programs(self):
        """Every derived program, by name (``jvp``, ``known``, ``linear``, ``transposed``, ...), per key.

        >>> f = vkml.jit(lambda x: vkml.sum(vkml.sin(x)))
        >>> _ = vkml.grad(f)(np.ones(2))
        >>> sorted(f.derived_programs()[0])
        ['jvp', 'known', 'linear', 'transposed']
        """
        keyword = self._keywords.derived_programs() if self._keywords is not None else []
        return [{k: v for k, v in e.derived.items() if isinstance(k, str)}
                for e in self._entries.values()] + keyword

    def __repr__(self):
        return f"<vkml.jit of {getattr(self.fn, '__qualname__', self.fn)!r}>"


#: jitted functions of callables that cannot hold their own (see _cached_jit)
_JITTED = weakref.WeakKeyDictionary()
#: every jitted function alive (weakly: it goes with its function)
_LIVE = weakref.WeakSet()


def live_jitted() -> list:
    """Every jitted function alive now (what the ``%%vkml`` magic watches to see which ran)."""
    return list(_LIVE)


def jit(fn=None, static_argnums=None):
    """Trace ``fn`` once per key into a Program; compile it once per variant; run it.

    Values never cause a retrace; a new shape, dtype, pytree structure or
    aliasing pattern does.  Tensors the function closes over are constants
    of its program: pass what changes (or needs a gradient) as an argument.
    Traced values of an enclosing transformation it closes over (``x`` in
    ``grad(lambda x: grad(lambda y: x * y)(1.0))``) are extra inputs of its
    program instead, differentiated and batched by the enclosing
    transformation; such a call is traced each time (the next one closes over
    other values).  ``jit`` of the same function object returns the same
    cached function.
    ``static_argnums``: positional arguments that are Python values baked
    into the program (hashable; one program per value), as in JAX.  A list
    argument is a pytree (a container of leaves), as in JAX, not one array.

    >>> f = vkml.jit(lambda x: vkml.sum(x * x))
    >>> f(np.array([1.0, 2.0]))
    tensor(5., dtype=float64)
    >>> f(np.array([3.0, 4.0]))
    tensor(25., dtype=float64)
    >>> f.cache_info()["traces"]
    1
    """
    if fn is None:
        return jit if static_argnums is None else functools.partial(jit, static_argnums=static_argnums)
    if static_argnums is not None:
        return _StaticJitted(fn, static_argnums)
    if isinstance(fn, Jitted):
        return fn
    return _cached_jit(fn)


def _cached_jit(fn) -> Jitted:
    """The one Jitted of ``fn`` while either lives, freed with them.

    A plain function keeps its Jitted in its own ``__dict__`` (a cycle the
    collector frees once the user drops both); a registry holding the Jitted
    would keep the function alive through it forever.  Other callables
    (bound methods, callable objects) are found through a weak registry that
    holds a weak reference to their Jitted, so the Jitted lives as long as the
    caller keeps it."""
    if isinstance(fn, types.FunctionType):
        jitted = fn.__dict__.get(_OWN_JIT)
        if not isinstance(jitted, Jitted) or jitted.fn is not fn:
            jitted = fn.__dict__[_OWN_JIT] = Jitted(fn)
        return jitted
    try:
        ref = _JITTED.get(fn)
    except TypeError:
        return Jitted(fn)
    jitted = ref() if ref is not None else None
    if jitted is None:
        jitted = Jitted(fn)
        _JITTED[fn] = weakref.ref(jitted)
    return jitted


_OWN_JIT = "__vkml_jitted__"


def _apply_program(owner, entry, variant_tag, prog, in_vars, requires_grad):
    """Run ``prog`` on ``in_vars``: at once if all are concrete, else as one lazy ``call``."""
    values = [v.value for v in in_vars]
    if not requires_grad and all([x is not None for x in values]):
        backend = runtime.current_backend()
        exe = _executable(owner, entry, variant_tag, prog, backend, values)
        outs = runtime.submit(backend, exe, values, prog.eqns, resident=True)
        return [Tensor(Var(o.shape, o.dtype, o.device, value=val))
                for o, val in zip(prog.outputs, outs)]
    outs = call(prog, *in_vars) if prog.eqns or prog.outputs else []
    grad = requires_grad and runtime.is_grad_enabled()
    return [Tensor(o, grad and o.dtype.kind in "fc") for o in outs]


def _executable(owner, entry, variant_tag, prog, backend, values):
    """The executable of ``prog``'s variant for ``values`` on ``backend``, compiled once."""
    # the variant: backend and the argument layout it compiles for; compiled once each
    variant = (id(prog), variant_tag, backend.name, backend.layout(values))
    exe = entry.executables.get(variant) if entry is not None else None
    if exe is None:
        made = []
        exe = backend.executable(("jit", prog, variant[1:]), lambda: made.append(1) or prog)
        # this function's compiles: executables made for its variants (a compiled tier may
        # load one from its disk cache instead of running the compiler: see vkml.stats())
        owner.compiles += len(made)
        if entry is not None:
            entry.executables[variant] = exe
    return exe


# -- scan -----------------------------------------------------------------------------------------

@boundary
def scan(step, init, xs, length=None, reverse=False):
    """``carry, ys = scan(step, init, xs)``: ``carry, y = step(carry, x)`` for each row x of xs.

    ONE construct in the program: ``step`` is traced once for all rows, and
    the derivative of the scan is again a scan.  ``init``/``xs``/results are
    pytrees; ``xs`` may be None with ``length`` given.  Tensors the step
    closes over become the scan's captures (they get gradients).

    >>> def step(total, x):
    ...     total = total + x
    ...     return total, total
    ...
    >>> vkml.scan(step, np.float64(0.0), np.array([1.0, 2.0, 3.0]))
    (tensor(6., dtype=float64), tensor([1., 3., 6.], dtype=float64))
    """
    _check_step(step, "scan", "the step")
    reverse = check_bool(reverse, "reverse", "scan")
    if length is not None:
        length = _count(length, "scan", "length", "the number of steps")
    init_leaves, init_tree = flatten(init)
    xs_leaves, xs_tree = flatten(xs)
    init_vars = [_leaf_var(x, "scan init") for x in init_leaves]
    xs_vars = [_leaf_var(x, "scan xs") for x in xs_leaves]
    lengths = {v.shape[0] for v in xs_vars if v.ndim}
    if any(v.ndim == 0 for v in xs_vars):
        raise ShapeError("scan: every leaf of xs needs a leading axis of rows; got a 0-d leaf")
    if length is None:
        if not lengths:
            raise ArgumentError("scan: give length= when xs has no leaves")
        if len(lengths) > 1:
            raise ShapeError(f"scan: the leaves of xs have different numbers of rows {sorted(lengths)}")
        length = lengths.pop()
    elif lengths and lengths != {length}:
        raise ShapeError(f"scan: length={length} but xs has {sorted(lengths)} rows")
    length = int(length)
    carry_ph = [Var(v.shape, v.dtype, v.device, weak=v.weak) for v in init_vars]
    x_ph = [Var(v.shape[1:], v.dtype, v.device) for v in xs_vars]
    result = _trace_closed(
        step, (unflatten(init_tree, [Tensor(p) for p in carry_ph]),
               unflatten(xs_tree, [Tensor(p) for p in x_ph])), carry_ph + x_ph)
    if not isinstance(result, tuple) or len(result) != 2:
        raise ArgumentError("scan: the step must return a pair (new_carry, y)")
    carry_out, y = result
    c_leaves, c_tree = flatten(carry_out)
    if c_tree != init_tree:
        raise ShapeError(f"scan: the step returned a carry of structure {c_tree}, "
                         f"but init has structure {init_tree}")
    c_vars = [_leaf_var(x, "scan carry") for x in c_leaves]
    for i, (a, b) in enumerate(zip(init_vars, c_vars)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise (ShapeError if a.shape != b.shape else DTypeError)(f"scan: carry leaf {i} enters the step as {dtype_name(a.dtype)} "
                             f"{format_shape(a.shape)} and leaves it as {dtype_name(b.dtype)} "
                             f"{format_shape(b.shape)}; a carry must keep its shape and dtype "
                             "(cast or reshape it inside the step)")
    y_leaves, y_tree = flatten(y)
    y_vars = [_leaf_var(x, "scan y") for x in y_leaves]
    outs = c_vars + y_vars
    captures = _captures_of(outs, carry_ph + x_ph)
    program = program_from_dag(captures + carry_ph + x_ph, outs)
    res = scan_bind(program, captures, init_vars, xs_vars, length, reverse)
    tensors = _wrap(res, captures + init_vars + xs_vars)
    return (unflatten(init_tree, tensors[:len(init_vars)]),
            unflatten(y_tree, tensors[len(init_vars):]))


def _trace_closed(fn, args, placeholders):
    """Call ``fn(*args)`` on placeholder tensors (a step, a branch, a loop body)."""
    STATS.traces += 1
    with _grad_disabled(), _open_trace(placeholders):
        return fn(*args)


def _captures_of(outs, placeholders):
    """Vars made before the placeholders that ``outs`` read: the closure's captures.

    They become explicit operands of the construct (a scan's ``captures``),
    so gradients reach tensors a step closes over."""
    start = min(p.serial for p in placeholders) if placeholders else current_serial()
    inputs = set(placeholders)
    leaves, _ = collect(outs, is_leaf=lambda v: v in inputs or v.serial < start)
    captures = [v for v in leaves if v not in inputs and v.serial < start]
    for v in captures:
        _of_open_trace(v)                   # refuses a value of a trace that is not running
    return captures


def _wrap(vars_, operands):
    """Tensors for a construct's results; they require grad if an operand's graph does."""
    requires = runtime.is_grad_enabled() and _needs_grad_vars(operands)
    tensors = [Tensor(v, requires and v.dtype.kind in "fc") for v in vars_]
    if runtime.is_eager() and tensors and not runtime.is_traced(tensors[0].ir_var):
        realize(tensors)
    return tensors


def _needs_grad_vars(vars_):
    if not vars_:
        return False
    leaves, _ = collect(list(vars_), is_leaf=lambda v: False)
    return any(runtime.is_grad_leaf(v) for v in leaves)


# -- derivatives ------------------------------------------------------------------------------------

def _argnums(argnums, nargs):
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in nums:
        if not isinstance(a, int) or not -nargs <= a < nargs:
            raise ArgumentError(f"argnums {argnums} is out of range for {nargs} arguments")
    return tuple(a % nargs for a in nums)


def _wrt_flags(args, nums):
    """Which flattened leaves of ``args`` are differentiated (those of the argnums arguments)."""
    flags = []
    for i, a in enumerate(args):
        n = len(flatten(a)[0])
        flags += [i in nums] * n
    return flags


def _jvp_of(jitted, entry, flags):
    """``entry``'s forward-mode program for the tangents ``flags`` marks, derived once."""
    prog = entry.program
    return jitted._derive(entry, ("jvp", tuple(flags)),
                          lambda: derived("jvp", prog, flags, lambda: jvp_program(prog, flags)))


def _vjp_parts(jitted, entry, flags):
    """jvp -> (known, linear) -> transposed, each derived once per derivation."""
    prog = entry.program
    name = tuple(flags)
    jp = _jvp_of(jitted, entry, flags)
    n_in, n_t = len(prog.inputs), sum(flags)

    def split():
        return partial_eval(jp, [False] * n_in + [True] * n_t)

    known, linear, out_u = jitted._derive(entry, ("split", name), split)
    n_res = len(known.outputs) - sum(1 for u in out_u if not u)
    transposed = jitted._derive(entry, ("transposed", name), lambda: transpose_program(
        linear, [False] * n_res + [True] * n_t))
    entry.derived.setdefault("jvp", jp)
    entry.derived.setdefault("known", known)
    entry.derived.setdefault("linear", linear)
    entry.derived.setdefault("transposed", transposed)
    return known, linear, transposed, out_u, n_res


def gradient_residuals(fn, args):
    """``(known, saved)`` for ``fn``'s gradient with respect to every floating argument of
    ``args``: the known part of its derivative and the values that part hands to the backward,
    derived (and cached) without running anything; None when no argument is floating.
    ``vkml.viz.saved_residuals`` lists them."""
    entry, _, in_vars = fn._lookup(args)
    n_args = len(in_vars) - len(entry.captures)
    flags = [v.dtype.kind in "fc" for v in in_vars[:n_args]] + [False] * len(entry.captures)
    if not any(flags):
        return None
    known, _, _, _, n_res = _vjp_parts(fn, entry, flags)
    return known, list(known.outputs[len(known.outputs) - n_res:]) if n_res else []


def _float_check(v, where, i):
    if v.dtype.kind not in "fc":
        raise GradError(f"{where}: argument leaf {i} is {dtype_name(v.dtype)}; only floating "
                        "arguments can be differentiated (cast with .astype(np.float64))")


def _vjp_call(jitted, args, nums, where):
    """Run the known part; return (outputs, pullback over the linear part)."""
    entry, leaves, in_vars = jitted._lookup(args)
    flags = _wrt_flags(args, nums) + [False] * len(entry.captures)
    for i, (v, f) in enumerate(zip(in_vars, flags)):
        if f:
            _float_check(v, where, i)
    prog = entry.program
    known, linear, transposed, out_u, n_res = _vjp_parts(jitted, entry, flags)
    n_out = len(prog.outputs)
    rg = needs_grad(leaves)
    known_out = _apply_program(jitted, entry, ("known",), known, in_vars, rg)
    n_known = len(known.outputs) - n_res
    values = known_out[:n_out]
    residuals = known_out[n_known:]
    tangent_live = out_u[n_out:]

    def pullback(cts):
        ct_vars = [_leaf_var(c, "cotangent") for c in cts]
        live = [c for c, u in zip(ct_vars, tangent_live) if u]
        if not live:
            return [Tensor(api.constant(np.zeros(v.shape, v.dtype))) for v, f in zip(in_vars, flags) if f]
        ins = [r.ir_var for r in residuals] + live
        need = rg or any(isinstance(c, Tensor) and c.requires_grad for c in cts)
        return _apply_program(jitted, entry, ("transposed",), transposed, ins, need)

    return entry, values, pullback, flags, in_vars


def _grad_fn(fn, argnums, has_aux, with_value):
    jitted = jit(fn)
    where = "grad"

    positions = {}          # the argnums as positions, by the number of arguments

    def g(*args):
        nums = positions.get(len(args))
        if nums is None:
            nums = positions[len(args)] = _argnums(argnums, len(args))
        fast = _fast_key(args)
        plan = jitted._plan(("grad", nums, fast)) if fast is not None else None
        if plan is not None:            # plain arguments seen before: one fused submission
            results = plan.run(args)
            n_values = len(plan.entry.program.outputs)
            outs = unflatten(plan.entry.out_tree, results[:n_values])
            grads = results[n_values:]
            main, aux = (outs[0], outs[1]) if has_aux else (outs, None)
        else:
            # the first call runs the part that reads no tangent, then the transposed part,
            # and keeps the plan of one program doing both for the next calls (compiled now, so
            # a second call with these arguments' types compiles nothing)
            entry, values, pullback, flags, in_vars = _vjp_call(jitted, args, nums, where)
            main, aux = _scalar_main(unflatten(entry.out_tree, values), has_aux, where)
            cts = [np.ones((), dtype=values[0].dtype)] + [np.zeros(v.shape, v.dtype) for v in values[1:]]
            grads = pullback(cts)
            if fast is not None:
                jitted._remember(("grad", nums, fast), args, entry, in_vars,
                                 _value_and_grad_program(jitted, entry, flags))
        per_arg = _regroup(args, nums, grads)
        result = per_arg[0] if isinstance(argnums, int) else tuple(per_arg)
        if with_value:
            return ((main, aux), result) if has_aux else (main, result)
        return (result, aux) if has_aux else result

    g.__name__ = f"grad_of_{getattr(fn, '__name__', 'f')}"
    g.cache_info = jitted.cache_info
    g.jitted = jitted
    return g


def _scalar_main(outs, has_aux, where):
    """``(main, aux)`` of a function's results (Tensors, or the Vars of its program), checked:
    ``main`` a floating scalar, and with ``has_aux`` the results a pair."""
    if has_aux and (not isinstance(outs, tuple) or len(outs) != 2):
        raise GradError("grad(has_aux=True): the function must return (value, aux)")
    main, aux = (outs[0], outs[1]) if has_aux else (outs, None)
    if not isinstance(main, (Tensor, Var)) or main.shape != () or main.dtype.kind != "f":
        shape = getattr(main, "shape", None)
        raise GradError(f"{where}: the function must return a floating scalar (0-d) value, "
                        f"got shape {format_shape(shape) if shape is not None else type(main).__name__}; "
                        "use vkml.vjp or vkml.jacrev for non-scalar outputs")
    return main, aux


def _value_and_grad_program(jitted, entry, flags):
    """``(name, make)`` of the program that computes the function's outputs and the gradient of
    its first (a scalar) in ONE submission, where ``grad`` runs the known part and then the
    transposed part: the known part's equations followed by the transposed part's, fed the
    cotangents ``grad`` feeds it (1 for the scalar, 0 for the rest)."""
    prog = entry.program

    def make():
        known, _, transposed, out_u, n_res = _vjp_parts(jitted, entry, flags)
        n_out, n_known = len(prog.outputs), len(known.outputs) - n_res
        placeholders = _placeholders_like(prog.inputs)
        with _grad_disabled():
            computed = inline(known, placeholders)
            values, residuals = computed[:n_out], computed[n_known:]
            cts = [api.constant(np.ones((), values[0].dtype))] + \
                [api.constant(np.zeros(v.shape, v.dtype)) for v in values[1:]]
            live = [c for c, u in zip(cts, out_u[n_out:]) if u]
            grads = inline(transposed, residuals + live) if live else \
                [api.constant(np.zeros(v.shape, v.dtype)) for v, f in zip(prog.inputs, flags) if f]
        return program_from_dag(placeholders, values + grads)

    return ("value_and_grad", tuple(flags)), make


def _regroup(args, nums, grads):
    """Cotangents of the flattened differentiated leaves, back in the arguments' pytree shapes,
    in the order of ``nums`` (the leaves come in argument order, as they were flattened)."""
    it = iter(grads)
    per_arg = {}
    for i in sorted(set(nums)):
        if type(args[i]) in _LEAF_TYPES:
            per_arg[i] = next(it)
            continue
        leaves, tree = flatten(args[i])
        per_arg[i] = unflatten(tree, [next(it) for _ in leaves])
    return [per_arg[i] for i in nums]


#: argument types that are one leaf each (a plain call's)
_LEAF_TYPES = (np.ndarray, Tensor)


def grad(fn, argnums=0, has_aux=False):
    """The gradient of a scalar function: ``grad(f)(x)`` has x's structure.

    Its programs are derived once per key and derivation (see the module
    docstring); ``grad(grad(f))`` works for scalar functions.

    >>> vkml.grad(lambda x: vkml.sum(x ** 3))(np.array([1.0, 2.0]))
    tensor([ 3., 12.], dtype=float64)
    >>> vkml.grad(lambda x, y: x * y, argnums=(0, 1))(2.0, 5.0)
    (tensor(5., dtype=float64), tensor(2., dtype=float64))
    """
    return _passing_keywords(fn, argnums, has_aux, False, "grad")


def value_and_grad(fn, argnums=0, has_aux=False):
    """Like ``grad`` but returns ``(f(x), grad)`` from the same run.

    >>> vkml.value_and_grad(lambda x: x * x)(3.0)
    (tensor(9., dtype=float64), tensor(6., dtype=float64))
    """
    return _passing_keywords(fn, argnums, has_aux, True, "value_and_grad")


@boundary
def vjp(fn, *args):
    """``out, pullback = vjp(f, *args)``; ``pullback(ct)`` returns one cotangent per argument.

    >>> out, pullback = vkml.vjp(lambda x: vkml.sin(x), np.array([0.0, np.pi]))
    >>> pullback(np.ones(2))
    (tensor([ 1., -1.], dtype=float64),)
    """
    _check_function(fn, "vjp")
    jitted = jit(fn)
    nums = tuple(range(len(args)))
    entry, values, pb, flags, _ = _vjp_call(jitted, args, nums, "vjp")
    out = unflatten(entry.out_tree, values)

    def pullback(ct):
        ct_leaves, ct_tree = flatten(ct)
        if ct_tree != entry.out_tree:
            raise ArgumentError(f"vjp pullback: cotangent structure {ct_tree} differs from the "
                                f"output's {entry.out_tree}")
        for i, (c, v) in enumerate(zip(ct_leaves, values)):
            cv = _leaf_var(c, "cotangent")
            if cv.shape != v.shape:
                raise ShapeError(f"vjp pullback: cotangent {i} has shape {format_shape(cv.shape)}, "
                                 f"the output has {format_shape(v.shape)}")
        grads = pb(ct_leaves)
        return tuple(_regroup(args, nums, grads))

    return out, pullback


@boundary
def jvp(fn, primals, tangents):
    """``(f(primals), df(primals)[tangents])`` by forward mode, its program derived once.

    >>> vkml.jvp(lambda x: x * x, (3.0,), (1.0,))
    (tensor(9., dtype=float64), tensor(6., dtype=float64))
    """
    _check_function(fn, "jvp")
    primals = tuple(check_sequence(primals, "primals", "jvp"))
    tangents = tuple(check_sequence(tangents, "tangents", "jvp"))
    jitted = jit(fn)
    _, p_tree = flatten(primals)
    t_leaves, t_tree = flatten(tangents)
    if p_tree != t_tree:
        raise ArgumentError(f"jvp: tangents {t_tree} must have the primals' structure {p_tree}")
    entry, leaves, in_vars = jitted._lookup(primals)
    t_vars = [_leaf_var(t, "tangent") for t in t_leaves]
    for i, (p, t) in enumerate(zip(in_vars, t_vars)):
        if p.shape != t.shape:
            raise ShapeError(f"jvp: tangent {i} has shape {format_shape(t.shape)}, its primal "
                             f"{format_shape(p.shape)}")
    flags = [v.dtype.kind in "fc" for v in in_vars[:len(t_vars)]] + [False] * len(entry.captures)
    jp = _jvp_of(jitted, entry, flags)
    entry.derived.setdefault("jvp", jp)
    ins = in_vars + [api.cast(t, p.dtype) for t, p, f in zip(t_vars, in_vars, flags) if f]
    rg = needs_grad(leaves + t_leaves)
    outs = _apply_program(jitted, entry, ("jvp",), jp, ins, rg)
    n = len(entry.program.outputs)
    return unflatten(entry.out_tree, outs[:n]), unflatten(entry.out_tree, outs[n:])


@boundary
def linearize(fn, *primals):
    """``out, f_jvp = linearize(f, *primals)``: the known part runs now, ``f_jvp(*tangents)``
    runs only the part linear in the tangents (the residuals are kept).

    >>> out, f_jvp = vkml.linearize(lambda x: x ** 3, 2.0)
    >>> out, f_jvp(1.0)
    (tensor(8., dtype=float64), tensor(12., dtype=float64))
    """
    _check_function(fn, "linearize")
    jitted = jit(fn)
    entry, leaves, in_vars = jitted._lookup(primals)
    n_args = len(in_vars) - len(entry.captures)
    flags = [v.dtype.kind in "fc" for v in in_vars[:n_args]] + [False] * len(entry.captures)
    known, linear, transposed, out_u, n_res = _vjp_parts(jitted, entry, flags)
    rg = needs_grad(leaves)
    known_out = _apply_program(jitted, entry, ("known",), known, in_vars, rg)
    n_out = len(entry.program.outputs)
    n_known = len(known.outputs) - n_res
    residuals = known_out[n_known:]
    out = unflatten(entry.out_tree, known_out[:n_out])
    live = out_u[n_out:]
    known_tangents = known_out[n_out:n_known]

    def f_jvp(*tangents):
        t_leaves, t_tree = flatten(tuple(tangents))
        if len(t_leaves) != n_args:
            raise ArgumentError(f"linearize: expected {n_args} tangent leaves, got {len(t_leaves)}")
        t_vars = [api.cast(_leaf_var(t, "tangent"), p.dtype) for t, p in zip(t_leaves, in_vars)]
        ins = [r.ir_var for r in residuals] + [t for t, f in zip(t_vars, flags) if f]
        res = _apply_program(jitted, entry, ("linear",), linear, ins, False)
        it_u, it_k = iter(res), iter(known_tangents)
        return unflatten(entry.out_tree, [next(it_u) if u else next(it_k) for u in live])

    return out, f_jvp


# -- programs as values -----------------------------------------------------------------------------

@boundary
def program(fn, *args) -> Program:
    """The Program ``fn`` traces to for these arguments (``print`` it to read it).

    >>> print(vkml.program(lambda x: vkml.sin(x) * 2.0, np.ones(3)))
    program (x)
      %4 : float64 [3] at CPU = Map [mul(sin(x0), 2.0)] (x0: float64 [3] at CPU)
        with x0 = x
      return %4
    """
    _check_function(fn, "program")
    jitted = jit(fn)
    entry, _, _ = jitted._lookup(args)
    return entry.program


# -- vmap and Jacobians -------------------------------------------------------------------------------

def _move_axis(var, src, dst):
    if src == dst:
        return var
    perm = [i for i in range(var.ndim) if i != src]
    perm.insert(dst, src)
    return api.transpose(var, perm)


def vmap(fn, in_axes=0, out_axes=0):
    """``fn`` written for one example, mapped over an axis of its arguments.

    ``in_axes``: one int/None for all arguments or a tuple/list with one
    entry per argument (None = not mapped, broadcast to every example); an
    entry may be a pytree matching its argument (``{"w": None, "b": 0}``),
    and a dict or other container alone stands for the one argument.
    ``out_axes``: where the mapped axis goes in the results, one int for all
    or a pytree matching the result; None for a result that does not depend
    on a mapped argument (it is returned once, not per example).  The program
    for one example is traced once per key and its batched form derived once
    per batch size.

    >>> vkml.vmap(lambda row: vkml.sum(row * row))(np.array([[1.0, 2.0], [3.0, 4.0]]))
    tensor([ 5., 25.], dtype=float64)
    >>> vkml.vmap(lambda x, w: x * w, in_axes=(0, None))(np.array([1.0, 2.0]), 10.0)
    tensor([10., 20.], dtype=float64)
    """
    _check_function(fn, "vmap")
    jitted = jit(fn)
    with_keywords = {}          # number of positional arguments -> the map of fn's keyword caller

    @boundary
    def batched(*args, **kwargs):
        if kwargs:              # keyword arguments are mapped over their axis 0, as in JAX
            mapped = with_keywords.get(len(args))
            if mapped is None:
                axes = tuple(in_axes) if isinstance(in_axes, (tuple, list)) else \
                    (in_axes,) * len(args) if _is_axis(in_axes) or len(args) != 1 else (in_axes,)
                mapped = with_keywords[len(args)] = vmap(_with_keywords(fn), axes + (0,), out_axes)
            return mapped(*args, kwargs)
        flags, example, in_vars, sizes = [], [], [], set()
        for a, leaf_axes in zip(args, _in_axes_per_leaf(in_axes, args)):
            leaves, tree = flatten(a)
            ex = []
            for x, ax in zip(leaves, leaf_axes):
                v = _leaf_var(x, "vmap")
                if ax is None:
                    flags.append(False)
                    in_vars.append(v)
                    ex.append(x)
                    continue
                if not -v.ndim <= ax < max(v.ndim, 1) or v.ndim == 0:
                    raise ShapeError(f"vmap: in_axes {ax} is out of range for an argument of shape "
                                     f"{format_shape(v.shape)}")
                ax2 = ax % v.ndim
                sizes.add(v.shape[ax2])
                flags.append(True)
                moved = _move_axis(v, ax2, 0)
                in_vars.append(moved)
                ex.append(Tensor(Var(moved.shape[1:], v.dtype, v.device)))
            example.append(unflatten(tree, ex))
        if len(sizes) != 1:
            raise ShapeError(f"vmap: mapped axes must all have one size, got {sorted(sizes) or 'none'}")
        size = sizes.pop()
        entry, _, _ = jitted._lookup(tuple(example))
        in_vars += entry.captures                     # values of enclosing traces: not mapped
        flags += [False] * len(entry.captures)
        prog = entry.program
        bprog = jitted._derive(entry, ("vmap", tuple(flags), size), lambda: derived(
            "vmap", prog, flags + [size], lambda: vmap_program(prog, flags, size)))
        rg = needs_grad(flatten(args)[0])
        outs = _apply_program(jitted, entry, ("vmap", size), bprog, in_vars, rg)
        axes_out = _out_axes(out_axes, entry.out_tree, outs)
        outs = _unbatched_where_asked(outs, axes_out, depends_on(prog, flags))
        outs = [o if ax in (0, None) else _wrap_like(o, _move_axis(o.ir_var, 0, ax))
                for o, ax in zip(outs, axes_out)]
        return unflatten(entry.out_tree, outs)

    return batched


def _out_axes(out_axes, out_tree, outs):
    """One output axis per result leaf: ``out_axes`` is one int for all, or one per entry of the
    function's tuple result (each entry's leaves alike)."""
    if isinstance(out_axes, (tuple, list)):
        top = unflatten(out_tree, outs)
        if not isinstance(top, (tuple, list)) or len(top) != len(out_axes):
            n = len(top) if isinstance(top, (tuple, list)) else "a single result"
            raise ArgumentError(f"vmap: out_axes has {len(out_axes)} entries but the function "
                                f"returns {n}; give one int for all, or one per result")
        per_leaf = [leaf for sub, ax in zip(top, out_axes)
                    for leaf in broadcast_prefix(ax, sub, _is_axis, "vmap out_axes")]
    else:
        per_leaf = broadcast_prefix(out_axes, unflatten(out_tree, outs), _is_axis, "vmap out_axes")
    axes = []
    for o, ax in zip(outs, per_leaf):
        if ax is None:
            axes.append(None)
            continue
        if not isinstance(ax, int) or isinstance(ax, bool) or not -o.ndim <= ax < o.ndim:
            raise ShapeError(f"vmap: out_axes {ax!r} is out of range for a result of shape "
                             f"{format_shape(o.shape)} (batch axis included): give an axis in "
                             f"[{-o.ndim}, {o.ndim}), e.g. 0 to put the batch first, or None "
                             "for a result that does not depend on the batch")
        axes.append(ax % o.ndim)
    return axes


def _wrap_like(t, var):
    return Tensor(var, t.requires_grad)


def _single_leaf(arg, where):
    leaves, _ = flatten(arg)
    if len(leaves) != 1:
        raise ArgumentError(f"{where}: the differentiated argument must be one array, "
                            f"got a pytree of {len(leaves)} leaves")


def _jacobian_call(jitted, args, argnums, where):
    """The checks and lookups a Jacobian needs: one array argument, one array result."""
    nums = _argnums(argnums, len(args))
    if len(nums) != 1:
        raise ArgumentError(f"{where}: give one argnum")
    _single_leaf(args[nums[0]], where)
    entry, leaves, in_vars = jitted._lookup(args)
    flags = _wrt_flags(args, nums) + [False] * len(entry.captures)
    i = flags.index(True)
    _float_check(in_vars[i], where, i)
    if len(entry.program.outputs) != 1:
        raise ArgumentError(f"{where}: the function must return one array")
    return entry, leaves, in_vars, flags, i


def _jacfwd_array(fn, argnums=0):
    """The Jacobian by forward mode: the derivative program mapped over a basis of tangents.
    Shape: output shape + input shape."""
    jitted = jit(fn)

    def jac(*args):
        entry, leaves, in_vars, flags, i = _jacobian_call(jitted, args, argnums, "jacfwd")
        prog = entry.program
        jp = _jvp_of(jitted, entry, flags)
        x = in_vars[i]
        n = x.size
        bflags = [False] * len(prog.inputs) + [True]
        bj = jitted._derive(entry, ("jacfwd", tuple(flags)), lambda: derived(
            "vmap", jp, bflags + [n], lambda: vmap_program(jp, bflags, n)))
        basis = api.constant(np.eye(n, dtype=x.dtype).reshape((n,) + x.shape))
        rg = needs_grad(leaves)
        outs = _apply_program(jitted, entry, ("jacfwd",), bj, in_vars + [basis], rg)
        t = outs[1].ir_var                                  # (n, *out)
        out_shape = t.shape[1:]
        m = int(np.prod(out_shape, dtype=np.int64))
        j = api.reshape(api.transpose(api.reshape(t, (n, m))), out_shape + x.shape)
        return Tensor(j, rg)

    return jac


def _jacrev_array(fn, argnums=0):
    """The Jacobian by reverse mode: the transposed program mapped over a basis of cotangents.
    Shape: output shape + input shape."""
    jitted = jit(fn)

    def jac(*args):
        entry, leaves, in_vars, flags, i = _jacobian_call(jitted, args, argnums, "jacrev")
        prog = entry.program
        known, linear, transposed, out_u, n_res = _vjp_parts(jitted, entry, flags)
        rg = needs_grad(leaves)
        known_out = _apply_program(jitted, entry, ("known",), known, in_vars, rg)
        n_known = len(known.outputs) - n_res
        residuals = [r.ir_var for r in known_out[n_known:]]
        out = prog.outputs[0]
        x = in_vars[i]
        m = out.size
        if not out_u[1]:                                 # the output does not depend on x
            return Tensor(api.zeros(out.shape + x.shape, x.dtype), False)
        bflags = [False] * n_res + [True]
        bt = jitted._derive(entry, ("jacrev", tuple(flags)), lambda: derived(
            "vmap", transposed, bflags + [m], lambda: vmap_program(transposed, bflags, m)))
        basis = api.constant(np.eye(m, dtype=out.dtype).reshape((m,) + out.shape))
        res = _apply_program(jitted, entry, ("jacrev",), bt, residuals + [basis], rg)
        return Tensor(api.reshape(res[0].ir_var, out.shape + x.shape), rg)

    return jac


def hessian(fn, argnums=0, has_aux=False):
    """Second derivatives of a scalar function: ``jacfwd(jacrev(f))``, pytrees and ``has_aux`` as
    in ``jacfwd``.

    >>> vkml.hessian(lambda x: vkml.sum(x ** 3))(np.array([1.0, 2.0]))
    tensor([[ 6.,  0.],
            [ 0., 12.]], dtype=float64)
    """
    _check_function(fn, "hessian")
    _check_argnums(argnums, "hessian")
    has_aux = check_bool(has_aux, "has_aux", "hessian")
    return jacfwd(jacrev(fn, argnums, has_aux), argnums, has_aux)


def hvp(fn, primals, tangents):
    """Hessian-vector product by forward-over-reverse: ``jvp(grad(f), primals, tangents)``.

    >>> vkml.hvp(lambda x: vkml.sum(x ** 3), (np.array([1.0, 2.0]),), (np.array([1.0, 0.0]),))
    tensor([6., 0.], dtype=float64)
    """
    _check_function(fn, "hvp")
    primals = check_sequence(primals, "primals", "hvp")
    tangents = check_sequence(tangents, "tangents", "hvp")
    return jvp(grad(fn), primals, tangents)[1]


# -- control flow ---------------------------------------------------------------------------------

def _placeholders_like(vars_):
    return [Var(v.shape, v.dtype, v.device, weak=v.weak) for v in vars_]


def switch(index, branches, *operands):
    """Run ``branches[index](*operands)``; every branch is traced once, and the choice is a value
    of the program (so it works under jit, grad and vmap, where Python ``if`` cannot).

    >>> branches = [lambda x: x, lambda x: x * 10.0, lambda x: -x]
    >>> vkml.switch(1, branches, 2.0)
    tensor(20., dtype=float64)
    """
    branches = _check_branches(branches)
    op_leaves, op_tree = flatten(operands)
    op_vars = [_leaf_var(x, "cond operand") for x in op_leaves]
    traced, all_caps, ref_tree, ref_types = [], [], None, None
    for k, branch in enumerate(branches):
        ph = _placeholders_like(op_vars)
        out = _trace_closed(branch, unflatten(op_tree, [Tensor(p) for p in ph]), ph)
        out_leaves, out_tree = flatten(out)
        outs = [_leaf_var(o, "cond result") for o in out_leaves]
        types = [(v.shape, v.dtype) for v in outs]
        if ref_tree is None:
            ref_tree, ref_types = out_tree, types
        elif out_tree != ref_tree or types != ref_types:
            raise ShapeError(f"cond: branch 0 returns {ref_tree} of "
                             f"{[dtype_name(d) + ' ' + format_shape(s) for s, d in ref_types]} but branch {k} "
                             f"returns {out_tree} of {[dtype_name(d) + ' ' + format_shape(s) for s, d in types]}; "
                             "every branch must return the same types")
        caps = _captures_of(outs, ph)
        all_caps += [c for c in caps if c not in all_caps]
        traced.append((ph, outs))
    programs = tuple(program_from_dag(all_caps + ph, outs) for ph, outs in traced)
    idx = _branch_index(index, len(branches))
    res = bind(cond_p, idx, *all_caps, *op_vars, branches=programs)
    return unflatten(ref_tree, _wrap(res, all_caps + op_vars))


def cond(pred, true_fn, false_fn, *operands):
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, as one construct.

    >>> vkml.cond(True, lambda x: x + 1.0, lambda x: x - 1.0, 5.0)
    tensor(6., dtype=float64)
    >>> vkml.grad(lambda x: vkml.cond(x > 0.0, lambda x: x * x, lambda x: -x, x))(3.0)
    tensor(6., dtype=float64)
    """
    return switch(_truth(pred), [false_fn, true_fn], *operands)


def while_loop(cond_fn, body_fn, init, max_iters=None, on_max_iters="warn"):
    """Repeat ``carry = body_fn(carry)`` while ``cond_fn(carry)``.

    Without ``max_iters`` it is a loop of the program (forward and forward
    mode).  With ``max_iters`` it is a scan of ``max_iters`` guarded steps,
    so reverse mode works too (the steps after the condition fails keep the
    carry unchanged).  A loop whose condition still holds after ``max_iters``
    steps is cut short: ``on_max_iters`` says what then happens -- "warn" (a
    ``VkmlWarning``), "raise" (ExecutionError) or "ignore".  The check is part
    of the program (``vkml.ops.checks``), so it runs inside jit, grad, vmap
    and scan too, once per run, wherever the loop's result is used; a loop on
    concrete values is run (and checked) at once.

    >>> vkml.while_loop(lambda x: x < 10.0, lambda x: x * 2.0, 1.0)
    tensor(16., dtype=float64)
    """
    _check_function(cond_fn, "while_loop", "the condition")
    _check_function(body_fn, "while_loop", "the body")
    if max_iters is not None:
        if on_max_iters not in ("warn", "raise", "ignore"):
            raise ArgumentError(f"while_loop: on_max_iters must be 'warn', 'raise' or 'ignore', "
                                f"got {on_max_iters!r}")
        max_iters = _count(max_iters, "while_loop", "max_iters", "a bound on the iterations", 1)
        final, cut = _bounded_while(cond_fn, body_fn, init, max_iters)
        return _checked_cut(final, cut, max_iters, on_max_iters)
    leaves, tree = flatten(init)
    init_vars = [_leaf_var(x, "while_loop init") for x in leaves]
    cph = _placeholders_like(init_vars)
    c_out = _trace_closed(cond_fn, (unflatten(tree, [Tensor(p) for p in cph]),), cph)
    c_var = _leaf_var(c_out, "while_loop condition")
    if c_var.shape != () or c_var.dtype.kind != "b":
        raise ShapeError(f"while_loop: the condition must return a bool scalar, got {c_var.type_str()}")
    bph = _placeholders_like(init_vars)
    b_out = _trace_closed(body_fn, (unflatten(tree, [Tensor(p) for p in bph]),), bph)
    b_leaves, b_tree = flatten(b_out)
    if b_tree != tree:
        raise ShapeError(f"while_loop: the body returns {b_tree} but the carry is {tree}")
    b_vars = [_leaf_var(x, "while_loop body") for x in b_leaves]
    for i, (a, b) in enumerate(zip(init_vars, b_vars)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise (ShapeError if a.shape != b.shape else DTypeError)(f"while_loop: carry leaf {i} enters as {a.type_str()} and leaves as "
                             f"{b.type_str()}; a carry must keep its shape and dtype")
    ccaps, bcaps = _captures_of([c_var], cph), _captures_of(b_vars, bph)
    res = bind(while_p, *ccaps, *bcaps, *init_vars, cond=program_from_dag(ccaps + cph, [c_var]),
               body=program_from_dag(bcaps + bph, b_vars), num_cond_consts=len(ccaps),
               num_body_consts=len(bcaps))
    return unflatten(tree, _wrap(res, ccaps + bcaps + init_vars))


def _bounded_while(cond_fn, body_fn, init, max_iters):

    def step(carry, _):
        state, active = carry
        go = logical_and(active, cond_fn(state))
        new = body_fn(state)
        n_leaves, n_tree = flatten(new)
        o_leaves, o_tree = flatten(state)
        if n_tree != o_tree:
            raise ShapeError(f"while_loop: the body returns {n_tree} but the carry is {o_tree}")
        kept = [where(go, n, o) for n, o in zip(n_leaves, o_leaves)]
        return (unflatten(o_tree, kept), go), None

    (final, active), _ = scan(step, (init, np.bool_(True)), None, length=max_iters)
    return final, logical_and(active, cond_fn(final))  # cut short: the last step ran and more would


# -- custom derivatives, checkpointing, gradient checks ------------------------------------------------

def _refuse_captures(entry, kind, name):
    """A custom rule sees only the function's arguments, so it cannot close over traced values."""
    if entry.captures:
        raise TracingError(f"{kind} {name}: the function closes over {len(entry.captures)} traced "
                           "value(s) of an enclosing transformation (grad, vmap, scan, ...); its "
                           "rule only sees the arguments, so pass those values as arguments")


def _example(vars_):
    return [Tensor(Var(v.shape, v.dtype, v.device)) for v in vars_]


#: Per thread, the custom-rule functions whose rules are being traced right now.
_RULES_BEING_TRACED = threading.local()


def _rules_being_traced() -> set:
    active = getattr(_RULES_BEING_TRACED, "ids", None)
    if active is None:
        active = _RULES_BEING_TRACED.ids = set()
    return active


@contextlib.contextmanager
def _tracing_rules_of(f):
    """While ``f``'s rules are traced, a call of ``f`` inside them is a primal computation (as in
    JAX: ``out = f(x)`` in its own jvp rule, ``f(x)`` in its fwd), so it evaluates the function
    itself rather than tracing the rules again, forever."""
    active = _rules_being_traced()
    active.add(id(f))
    try:
        yield
    finally:
        active.discard(id(f))


def _inside_own_rule(f) -> bool:
    return id(f) in _rules_being_traced()


class custom_jvp:
    """A function with a hand-written forward-mode rule: ``f.defjvp(rule)`` where
    ``rule(primals, tangents) -> (out, tangent_out)``; the tangent must be linear
    in the tangents (reverse mode transposes it).  The rule may call the function
    itself for ``out`` (as in JAX); there it is the plain function.

    >>> @vkml.custom_jvp
    ... def softplus(x):
    ...     return vkml.log(1.0 + vkml.exp(x))
    ...
    >>> @softplus.defjvp
    ... def softplus_jvp(primals, tangents):
    ...     (x,), (t,) = primals, tangents
    ...     return vkml.log(1.0 + vkml.exp(x)), t * vkml.sigmoid(x)
    ...
    >>> vkml.grad(softplus)(0.0)
    tensor(0.5, dtype=float64)
    """

    def __init__(self, fun):
        self.fun = fun
        self.rule = None
        self._flat = {}  # number of inputs -> the rule as a jitted flat function, traced once
        functools.update_wrapper(self, fun)

    def defjvp(self, rule):
        """Set the forward-mode rule ``rule(primals, tangents) -> (out, tangent_out)``; returns it, so it works as a decorator.

        >>> f = vkml.custom_jvp(lambda x: x * x)
        >>> _ = f.defjvp(lambda primals, tangents: (primals[0] ** 2, 2.0 * primals[0] * tangents[0]))
        >>> vkml.grad(f)(3.0)
        tensor(6., dtype=float64)
        """
        self.rule = rule
        self._flat.clear()  # the flat wrappers call the old rule
        return rule

    def __call__(self, *args):
        if self.rule is None:
            raise ArgumentError(f"custom_jvp {self.__name__}: define its rule with @f.defjvp first")
        if _inside_own_rule(self):
            return self.fun(*args)
        entry, leaves, in_vars = jit(self.fun)._lookup(args)
        _refuse_captures(entry, "custom_jvp", self.__name__)
        ex = _example(in_vars)
        rule = self._flat.get(len(in_vars))
        if rule is None:
            rule = self._flat[len(in_vars)] = jit(_rule_as_function(self.rule, len(in_vars)))
        with _tracing_rules_of(self):
            rentry, _, _ = rule._lookup(tuple(ex) + tuple(_example(in_vars)))
        _check_rule_outputs(self.__name__, entry.program, rentry.program)
        res = bind(custom_jvp_p, *in_vars, program=entry.program, jvp=rentry.program)
        return unflatten(entry.out_tree, _wrap(res, in_vars))


def _check_rule_outputs(name, program, rule_program):
    """A custom_jvp rule gives one output and one tangent of the same shape and dtype for each
    of the function's outputs; anything else is refused before it is used (JAX's check too)."""
    outs, got = program.outputs, rule_program.outputs
    if len(got) != 2 * len(outs):
        raise ArgumentError(f"custom_jvp {name}: its rule returned {len(got)} values (outputs and "
                            f"tangents) for a function of {len(outs)} output(s); return "
                            "(out, tangent_out) shaped like the function's result")
    for i, (o, r, t) in enumerate(zip(outs, got[:len(outs)], got[len(outs):])):
        for what, v in (("output", r), ("tangent", t)):
            if (v.shape, v.dtype) != (o.shape, o.dtype):
                raise ShapeError(f"custom_jvp {name}: its rule's {what} {i} is {v.type_str()} but "
                                 f"the function's output {i} is {o.type_str()}; the rule must "
                                 "return values and tangents shaped like the function's result")


def _rule_as_function(rule, n):
    """rule(primals, tangents) as a function of 2n flat arguments, returning flat out + tangents."""
    def flat(*xs):
        out, tout = rule(tuple(xs[:n]), tuple(xs[n:]))
        return tuple(flatten(out)[0]) + tuple(flatten(tout)[0])
    flat.__name__ = getattr(rule, "__name__", "jvp_rule")
    return flat


class custom_vjp:
    """A function with a hand-written reverse-mode rule: ``f.defvjp(fwd, bwd)`` where
    ``fwd(*args) -> (out, residuals)`` and ``bwd(residuals, ct) -> one cotangent per argument``
    (None for a zero one).  ``nondiff_argnums``: positional arguments that are not differentiated
    (Python values such as functions or sizes, hashable); as in JAX, ``bwd`` gets them first,
    ``bwd(*nondiff, residuals, ct)``, and returns cotangents for the other arguments only.
    ``fwd`` and ``bwd`` may call the function itself; there it is the plain function.

    >>> @vkml.custom_vjp
    ... def clip_gradient(x):
    ...     return x
    ...
    >>> def fwd(x):
    ...     return x, None
    ...
    >>> def bwd(residuals, ct):
    ...     return (vkml.clip(ct, -1.0, 1.0),)
    ...
    >>> clip_gradient.defvjp(fwd, bwd)
    >>> vkml.grad(lambda x: vkml.sum(clip_gradient(x) * 5.0))(np.ones(2))
    tensor([1., 1.], dtype=float64)
    """

    def __init__(self, fun, nondiff_argnums=()):
        _check_function(fun, "custom_vjp")
        self.fun = fun
        self.fwd = self.bwd = None
        self._flat = {}
        self.nondiff_argnums = _nondiff_argnums(nondiff_argnums)
        self._static = {}
        functools.update_wrapper(self, fun)

    def defvjp(self, fwd, bwd):
        """Set the reverse-mode rule: ``fwd(*args) -> (out, residuals)`` and ``bwd(residuals, ct) -> cotangents``.

        >>> f = vkml.custom_vjp(lambda x: x * x)
        >>> f.defvjp(lambda x: (x * x, x), lambda x, ct: (2.0 * x * ct,))
        >>> vkml.grad(f)(3.0)
        tensor(6., dtype=float64)
        """
        _check_function(fwd, f"custom_vjp {self.__name__}.defvjp", "fwd")
        _check_function(bwd, f"custom_vjp {self.__name__}.defvjp", "bwd")
        self.fwd, self.bwd = fwd, bwd
        self._static.clear()
        self._flat.clear()  # the flat bwd wrappers close over the old bwd

    def __call__(self, *args):
        if self.fwd is None:
            raise ArgumentError(f"custom_vjp {self.__name__}: define its rule with f.defvjp(fwd, bwd)")
        if _inside_own_rule(self):
            return self.fun(*args)
        if self.nondiff_argnums:
            return _call_with_nondiff(self, args)
        entry, leaves, in_vars = jit(self.fun)._lookup(args)
        _refuse_captures(entry, "custom_vjp", self.__name__)
        fwd = jit(self.fwd)
        with _tracing_rules_of(self):
            fentry, _, _ = fwd._lookup(args)
        out_res = fentry.out_tree
        if out_res.kind != "tuple" or len(out_res.children) != 2:
            raise ArgumentError("custom_vjp: fwd must return (out, residuals)")
        _check_fwd_out(self.__name__, entry, fentry)
        n_out = out_res.children[0].num_leaves
        res_vars = fentry.program.outputs[n_out:]
        fwd_flat = Program(fentry.program.inputs, fentry.program.eqns, fentry.program.outputs,
                           fentry.program.consts)
        res_tree, out_tree = out_res.children[1], out_res.children[0]
        bwd = self.bwd
        def bwd_flat(*xs):
            res = unflatten(res_tree, xs[:len(res_vars)])
            ct = unflatten(out_tree, xs[len(res_vars):])
            cts = bwd(res, ct)
            if not isinstance(cts, tuple) or len(cts) != len(args):
                raise ArgumentError(f"custom_vjp: bwd must return a tuple of {len(args)} cotangents, "
                                    "one per argument")
            return tuple(_cotangent_leaves(name, cts, args, in_vars))

        name = self.__name__

        key = (res_tree, out_tree, flatten(args)[1], tuple((v.shape, v.dtype) for v in in_vars))
        if key not in self._flat:
            self._flat[key] = jit(bwd_flat)
        with _tracing_rules_of(self):
            bentry, _, _ = self._flat[key]._lookup(
                tuple(_example(res_vars)) + tuple(_example(entry.program.outputs)))
        res = bind(custom_vjp_p, *in_vars, program=entry.program, fwd=fwd_flat, bwd=bentry.program,
                   num_res=len(res_vars))
        return unflatten(entry.out_tree, _wrap(res, in_vars))


def checkpoint(fn):
    """``fn`` whose intermediates are recomputed in the backward pass instead of kept
    (memory for time: only its inputs are saved).

    >>> f = vkml.checkpoint(lambda x: vkml.sin(vkml.sin(x)))
    >>> vkml.grad(lambda x: vkml.sum(f(x)))(np.zeros(2))
    tensor([1., 1.], dtype=float64)
    """
    _check_function(fn, "checkpoint")
    jitted = jit(fn)

    def remat(*args, **kwargs):
        if kwargs:              # traced arguments too, passed as one last positional dict
            return checkpoint(_with_keywords(fn))(*args, kwargs)
        entry, leaves, in_vars = jitted._lookup(args)
        res = bind(remat_p, *in_vars, program=entry.program)
        return unflatten(entry.out_tree, _wrap(res, in_vars))

    remat.__name__ = f"checkpoint_of_{getattr(fn, '__name__', 'f')}"
    return remat


#: The highest derivative order check_grads checks: each order nests one more forward-mode
#: derivative inside the last (and divides finite differences once more), so beyond a few the
#: check is slow and the finite differences are noise.
MAX_CHECK_ORDER = 8


class GradCheckError(VkmlError, AssertionError):
    """A derivative that disagrees with finite differences.

    >>> @vkml.custom_jvp
    ... def f(x):
    ...     return vkml.sin(x)
    ...
    >>> @f.defjvp
    ... def f_jvp(primals, tangents):
    ...     return vkml.sin(primals[0]), 2.0 * tangents[0]
    ...
    >>> try:
    ...     vkml.check_grads(f, (np.array([0.3]),), modes=("fwd",))
    ... except vkml.GradCheckError:
    ...     print("the hand-written rule disagrees with finite differences")
    ...
    the hand-written rule disagrees with finite differences
    """


def check_grads(fn, args, order=1, modes=("fwd", "rev"), eps=None, rtol=1e-4, atol=1e-6, seed=0):
    """Check ``fn``'s derivatives at ``args`` against central finite differences.

    Along a random direction: forward mode (jvp) must match the difference
    quotient, and reverse mode must satisfy <u, J v> = <J^T u, v>.  With
    ``order=2`` the derivative is checked too (``order`` is at most
    ``MAX_CHECK_ORDER``, 8).  Raises GradCheckError with both numbers on a
    mismatch; returns None when all agree.

    >>> vkml.check_grads(lambda x: vkml.sum(vkml.sin(x)), (np.array([0.5, 1.0]),), order=2)
    """
    rtol, atol = _check_grads_arguments(fn, args, order, modes, eps, rtol, atol, seed)
    rng = np.random.default_rng(seed)
    xs = [np.asarray(a.numpy() if isinstance(a, Tensor) else a, dtype=np.float64) for a in args]
    f = lambda *a: fn(*a)  # noqa: E731
    base = np.asarray(_values(f(*xs)))
    vs = [rng.standard_normal(x.shape) for x in xs]
    h = eps if eps is not None else 1e-6 * max(1.0, max(float(np.abs(x).max(initial=0)) for x in xs))
    plus = np.asarray(_values(f(*[x + h * v for x, v in zip(xs, vs)])))
    minus = np.asarray(_values(f(*[x - h * v for x, v in zip(xs, vs)])))
    fd = (plus - minus) / (2 * h)
    if "fwd" in modes:
        _, t = jvp(f, tuple(xs), tuple(vs))
        _compare("jvp", np.asarray(_values(t)), fd, rtol, atol)
    if "rev" in modes:
        u = rng.standard_normal(base.shape)
        _, pb = vjp(f, *xs)
        cts = pb(u)
        lhs = float(np.sum(u * fd))
        rhs = float(sum(np.sum(np.asarray(c.numpy()) * v) for c, v in zip(cts, vs)))
        _compare("vjp", np.array(rhs), np.array(lhs), rtol, atol)
    if order > 1:
        def directional(*a):
            _, t = jvp(f, tuple(a), tuple(vs))
            return t
        check_grads(directional, xs, order - 1, modes, eps, rtol, atol, seed + 1)


def _values(out):
    leaves, _ = flatten(out)
    if len(leaves) != 1:
        raise ArgumentError("check_grads: the function must return one array")
    x = leaves[0]
    return x.numpy() if isinstance(x, Tensor) else x


def _compare(what, got, want, rtol, atol):
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        err = float(np.max(np.abs(got - want)))
        raise GradCheckError(f"check_grads: {what} gives {np.array2string(got, precision=8)} but "
                             f"finite differences give {np.array2string(want, precision=8)} "
                             f"(max abs error {err:.3g}, rtol={rtol}, atol={atol})")


# -- argument checks shared by the entry points --------------------------------------------------------

def _check_function(fn, where, what="the function"):
    if not callable(fn):
        raise ArgumentError(f"{where}: {what} must be callable, got {type(fn).__name__}")


def _check_step(fn, where, what="the function"):
    """A function a loop calls on its carry: callable, and not a class (``float(c, x)`` is a
    TypeError from deep inside the loop, not a step)."""
    _check_function(fn, where, what)
    if isinstance(fn, type):
        raise ArgumentError(f"{where}: {what} must be a function, got the class {fn.__name__}; "
                            "pass a def or lambda that calls it")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


_INT64_MAX = np.iinfo(np.int64).max


def _count(value, where, name, meaning, minimum=0):
    """A count argument (``length``, ``max_iters``) as a Python int in [minimum, 2**63)."""
    if isinstance(value, Tensor) and value.size == 1 and value.dtype.kind in "iu":
        value = value._concrete(f"{where}({name}=...)")
    if not _is_int(value) or not minimum <= value <= _INT64_MAX:
        raise ArgumentError(f"{where}: {name} must be an int >= {minimum} ({meaning}), got {value!r}")
    return int(value)


def _check_argnums(argnums, where):
    """argnums as JAX takes it: an int, or a tuple/list of ints (checked against the call later)."""
    nums = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    if not all(_is_int(a) for a in nums):
        raise ArgumentError(f"{where}: argnums must be an int or a tuple of ints (the positions of "
                            f"the arguments to differentiate), got {argnums!r}")


def _checked_argnums(argnums, nargs, where):
    """``argnums`` as non-negative positions of a call with ``nargs`` arguments."""
    nums = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    for a in nums:
        if not -nargs <= a < nargs:
            raise ArgumentError(f"{where}: argnums {argnums!r} is out of range for a call with {nargs} "
                                f"positional argument(s); count from 0 (or -1 for the last)")
    return tuple(int(a) % nargs for a in nums)


# -- grad with keyword arguments ------------------------------------------------------------------------

_KEYWORD_CALLERS = weakref.WeakKeyDictionary()


def _with_keywords(fn):
    """``fn`` taking its keyword arguments as one last positional dict, so they are traced arguments
    (not differentiated), not constants baked into the program.  One per ``fn``, so jit's cache hits."""
    own = fn.__dict__ if isinstance(fn, types.FunctionType) else None
    try:
        caller = own.get(_OWN_CALLER) if own is not None else _KEYWORD_CALLERS.get(fn)
    except TypeError:
        caller = None
    if caller is None:
        def caller(*args):
            return fn(*args[:-1], **args[-1])
        caller.__name__ = getattr(fn, "__name__", "f")
        if own is not None:             # lives and dies with fn (a registry would keep fn alive)
            own[_OWN_CALLER] = caller
        else:
            try:
                _KEYWORD_CALLERS[fn] = caller
            except TypeError:
                pass
    return caller


_OWN_CALLER = "__vkml_keyword_caller__"


def _passing_keywords(fn, argnums, has_aux, with_value, where):
    """``grad``/``value_and_grad`` of ``fn``: keyword arguments go to ``fn`` undifferentiated, as in JAX."""
    _check_function(fn, where)
    _check_argnums(argnums, where)
    has_aux = check_bool(has_aux, "has_aux", where)
    positional = _grad_fn(fn, argnums, has_aux, with_value)

    checked = {}            # the argnums as positions, by the number of arguments

    @boundary
    def g(*args, **kwargs):
        nums = checked.get(len(args))
        if nums is None:
            nums = checked[len(args)] = _checked_argnums(argnums, len(args), where)
        if not kwargs:
            return positional(*args)
        fixed = nums[0] if _is_int(argnums) else nums
        return _grad_fn(_with_keywords(fn), fixed, has_aux, with_value)(*args, kwargs)

    g.__name__ = positional.__name__
    g.cache_info = positional.cache_info
    g.jitted = positional.jitted
    return g


# -- jit with static arguments ----------------------------------------------------------------------------

class _StaticJitted:
    """``jit(fn, static_argnums=...)``: the static arguments are Python values of the program (one
    program per value, so they must be hashable); the others are traced as usual."""

    def __init__(self, fn, static_argnums):
        _check_function(fn, "jit")
        nums = tuple(static_argnums) if isinstance(static_argnums, (tuple, list)) else (static_argnums,)
        if not all(_is_int(a) for a in nums):
            raise ArgumentError(f"jit: static_argnums must be an int or a tuple of ints (positions of "
                                f"arguments baked into the program), got {static_argnums!r}")
        self.fn, self.static_argnums = fn, nums
        self._jitted = Cache("jit static values")      # bounded, like every per-key cache
        functools.update_wrapper(self, fn)

    def __call__(self, *args):
        name = getattr(self.fn, "__name__", "f")
        nums = _checked_argnums(self.static_argnums, len(args), f"jit({name}) static_argnums")
        statics = tuple((i, args[i]) for i in sorted(set(nums)))
        try:
            hash(statics)
        except TypeError:
            bad = next(i for i, a in statics if not _hashable(a))
            raise ArgumentError(f"jit({name}): static argument {bad} is a {type(args[bad]).__name__}, "
                                "which is unhashable; a static argument is part of the program's key: "
                                "pass a tuple instead of a list, or make it an ordinary (traced) "
                                "argument") from None
        jitted = self._jitted.get(statics)
        if jitted is None:
            made = Jitted(_with_statics(self.fn, dict(statics), len(args)))
            jitted = self._jitted.put_first(statics, made)
        return jitted(*[a for i, a in enumerate(args) if i not in dict(statics)])

    def cache_info(self) -> dict:
        """The counters of ``Jitted.cache_info``, summed over the static values seen."""
        infos = [j.cache_info() for j in self._jitted.values()]
        return {k: sum(i[k] for i in infos) for k in ("traces", "compiles", "derived", "hits", "keys")}


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def _with_statics(fn, statics, nargs):
    def call(*dynamic):
        it = iter(dynamic)
        return fn(*[statics[i] if i in statics else next(it) for i in range(nargs)])
    call.__name__ = getattr(fn, "__name__", "f")
    return call


# -- vmap's axes as pytrees --------------------------------------------------------------------------------

def _is_axis(x) -> bool:
    """A leaf of an ``in_axes``/``out_axes`` tree: None, or anything that is not a container."""
    return x is None or not isinstance(x, (tuple, list, dict)) and flatten(x)[1].kind == "leaf"


def _in_axes_per_leaf(in_axes, args):
    """For each argument, the mapped axis (or None) of each of its leaves."""
    if isinstance(in_axes, (tuple, list)):
        if len(in_axes) != len(args):
            raise ArgumentError(f"vmap: in_axes has {len(in_axes)} entries for {len(args)} arguments; "
                                "give one entry per positional argument, or one int/None for all")
        per_arg = list(in_axes)
    elif _is_axis(in_axes):
        per_arg = [in_axes] * len(args)
    elif len(args) == 1:
        per_arg = [in_axes]
    else:
        raise ArgumentError(f"vmap: in_axes {in_axes!r} is one argument's tree but the call has "
                            f"{len(args)} arguments; give a tuple with one entry per argument")
    out = []
    for a, ax in zip(args, per_arg):
        axes = broadcast_prefix(ax, a, _is_axis, "vmap in_axes")
        for x in axes:
            if x is not None and not _is_int(x):
                raise ArgumentError(f"vmap: in_axes entries must be ints (the mapped axis) or None "
                                    f"(not mapped), got {x!r}")
        out.append(axes)
    return out


def _unbatched_where_asked(outs, axes, batched):
    """Results with out_axes None: one copy (row 0 of the broadcast), refused if they vary per example."""
    result = []
    for i, (o, ax, b) in enumerate(zip(outs, axes, batched)):
        if ax is None:
            if b:
                raise ArgumentError(f"vmap: out_axes None for result leaf {i}, but it depends on a "
                                    "mapped argument, so it differs per example; give it an int "
                                    "out_axes (0 puts the examples first)")
            o = _wrap_like(o, api.getitem(o.ir_var, 0))
        result.append(o)
    return result


# -- Jacobians of pytrees ------------------------------------------------------------------------------

def jacfwd(fn, argnums=0, has_aux=False):
    """The Jacobian by forward mode: the derivative program mapped over a basis of tangents.

    Arguments and results may be pytrees: the result has the output's
    structure with, at each leaf, the structure of the differentiated
    argument (a tuple of them when ``argnums`` is a tuple), each block of
    shape output-leaf shape + input-leaf shape.  ``has_aux``: ``fn`` returns
    ``(out, aux)`` and the call returns ``(jacobian, aux)``.

    >>> vkml.jacfwd(lambda x: x * x)(np.array([1.0, 2.0]))
    tensor([[2., 0.],
            [0., 4.]], dtype=float64)
    """
    return _pytree_jacobian(fn, argnums, has_aux, "jacfwd", _jacfwd_array)


def jacrev(fn, argnums=0, has_aux=False):
    """The Jacobian by reverse mode: the transposed program mapped over a basis of cotangents.
    Pytrees, shapes and ``has_aux`` as in :func:`jacfwd`.

    >>> vkml.jacrev(lambda x: vkml.stack([x[0] * x[1], x[0]]))(np.array([2.0, 3.0]))
    tensor([[3., 2.],
            [1., 0.]], dtype=float64)
    """
    return _pytree_jacobian(fn, argnums, has_aux, "jacrev", _jacrev_array)


def _pytree_jacobian(fn, argnums, has_aux, where, one_array):
    """A Jacobian of pytrees through the one-array form: the differentiated leaves are raveled into
    one vector and the output leaves into another, and the matrix between them is cut into blocks."""
    _check_function(fn, where)
    _check_argnums(argnums, where)
    has_aux = check_bool(has_aux, "has_aux", where)
    jitted = jit(fn)
    flat_fns = {}
    with_keywords = []          # the Jacobian of fn's keyword caller, made on the first keyword call

    @boundary
    def jac(*args, **kwargs):
        if kwargs:              # keyword arguments go to fn undifferentiated, as in JAX
            if not with_keywords:
                fixed = argnums if _is_int(argnums) else tuple(argnums)
                with_keywords.append(_pytree_jacobian(_with_keywords(fn), fixed, has_aux, where,
                                                      one_array))
            _checked_argnums(argnums, len(args), where)
            return with_keywords[0](*args, kwargs)
        nums = _checked_argnums(argnums, len(args), where)
        wrt = tuple(args[i] for i in nums)
        in_leaves, in_tree = flatten(wrt)
        in_vars = [_leaf_var(x, where) for x in in_leaves]
        for i, v in enumerate(in_vars):
            _float_check(v, where, i)
        entry, _, _ = jitted._lookup(args)
        main_tree, aux = _main_and_aux(jitted, entry, args, has_aux, where)
        main_vars = entry.program.outputs[:main_tree.num_leaves]
        for i, v in enumerate(main_vars):
            if v.dtype.kind != "f":
                raise GradError(f"{where}: result leaf {i} is {dtype_name(v.dtype)}; only floating "
                                "results have a Jacobian (cast it inside the function)")
        if not has_aux and _is_int(argnums) and in_tree.children[0].kind == "leaf" and \
                main_tree.kind == "leaf":
            return one_array(fn, argnums)(*args)
        dtype = np.result_type(*[v.dtype for v in in_vars + list(main_vars)])
        key = (nums, len(args), in_tree, tuple((v.shape, v.dtype) for v in in_vars), dtype)
        flat_fn = flat_fns.get(key)
        if flat_fn is None:
            flat_fn = flat_fns[key] = _raveled(fn, nums, len(args), in_tree, in_vars, has_aux, dtype)
        flat_x = _ravel([x if isinstance(x, Tensor) else Tensor(v) for x, v in zip(in_leaves, in_vars)],
                        dtype)
        rest = [a for i, a in enumerate(args) if i not in nums]
        matrix = one_array(flat_fn, 0)(flat_x, *rest)
        blocks = _blocks(matrix, main_vars, in_vars, in_tree, _is_int(argnums))
        result = unflatten(main_tree, blocks)
        return (result, aux) if has_aux else result

    jac.__name__ = f"{where}_of_{getattr(fn, '__name__', 'f')}"
    return jac


def _main_and_aux(jitted, entry, args, has_aux, where):
    """The treedef of the differentiated result, and the aux value when ``has_aux``."""
    if not has_aux:
        return entry.out_tree, None
    tree = entry.out_tree
    if tree.kind != "tuple" or len(tree.children) != 2:
        raise ArgumentError(f"{where}(has_aux=True): the function must return a pair (out, aux), "
                            f"got {tree}")
    return tree.children[0], jitted(*args)[1]


def _ravel(leaves, dtype):
    return concatenate([reshape(cast(x, dtype), (-1,)) for x in leaves])


def _raveled(fn, nums, nargs, in_tree, in_vars, has_aux, dtype):
    """``fn`` as a function of one vector (the differentiated leaves, raveled) and the other
    arguments, returning its (main) result leaves raveled into one vector."""
    specs = [(v.shape, v.dtype, v.size) for v in in_vars]

    def flat_fn(flat, *rest):
        pieces, start = [], 0
        for shape, leaf_dtype, size in specs:
            pieces.append(cast(reshape(flat[start:start + size], shape), leaf_dtype))
            start += size
        full, others = [None] * nargs, iter(rest)
        for i, w in zip(nums, unflatten(in_tree, pieces)):
            full[i] = w
        full = [next(others) if i not in nums else full[i] for i in range(nargs)]
        out = fn(*full)
        return _ravel(flatten(out[0] if has_aux else out)[0], dtype)

    flat_fn.__name__ = getattr(fn, "__name__", "f")
    return flat_fn


def _blocks(matrix, out_vars, in_vars, in_tree, one_argnum):
    """Cut the (outputs x inputs) matrix into one block per (output leaf, input leaf)."""
    blocks, row = [], 0
    for o in out_vars:
        col, per_input = 0, []
        for x in in_vars:
            block = matrix[row:row + o.size, col:col + x.size]
            per_input.append(cast(reshape(block, o.shape + x.shape), o.dtype))
            col += x.size
        wrt = unflatten(in_tree, per_input)
        blocks.append(wrt[0] if one_argnum else wrt)
        row += o.size
    return blocks


# -- switch, cond and while_loop: their arguments and the loop's bound ---------------------------------------

def _check_branches(branches):
    if not isinstance(branches, (tuple, list)) or not branches:
        raise ArgumentError(f"switch: branches must be a non-empty list of functions, got "
                            f"{type(branches).__name__}")
    for k, b in enumerate(branches):
        _check_function(b, "switch", f"branch {k}")
    return list(branches)


def _branch_index(index, n):
    """The branch number as an int32 scalar of the program, clamped to [0, n-1] as in JAX (before
    narrowing to int32, so a huge index picks the last branch instead of wrapping around)."""
    idx = _leaf_var(index, "switch index")
    if idx.shape != ():
        raise ShapeError(f"switch: the index must be a scalar, got shape {format_shape(idx.shape)}")
    if idx.dtype.kind == "f":
        raise ArgumentError(f"switch: the index must be an integer, got {dtype_name(idx.dtype)}; "
                            "cast it (.astype(np.int32)), or use vkml.cond for a truth value")
    if idx.dtype.kind == "b":
        return api.cast(idx, np.int32)
    clamped = api.minimum(api.maximum(idx, 0), n - 1)
    return api.cast(clamped, np.int32)


def _truth(pred):
    """cond's predicate as a bool scalar: a number counts as true when nonzero (as Python's ``if``)."""
    p = _leaf_var(pred, "cond predicate")
    if p.shape != ():
        raise ShapeError(f"cond: the predicate must be a scalar, got shape {format_shape(p.shape)}; "
                         "reduce it (.any(), .all()) or use vkml.where for a choice per element")
    return Tensor(p) if p.dtype.kind == "b" else Tensor(api.not_equal(p, 0))


def _checked_cut(final, cut, max_iters, on_max_iters):
    """The loop's result with each leaf checked against ``cut`` (the condition still held after
    ``max_iters`` steps): it warns or raises where the result is computed -- inside a traced
    program too -- once per run however many leaves are used.  A loop on concrete values is
    realized at once (one submission), so the warning names the line of the while_loop."""
    if on_max_iters == "ignore":
        return final
    message = (f"while_loop: the condition still held after max_iters={max_iters} iterations, so the "
               "result is cut short; raise max_iters, or pass on_max_iters='ignore' if a bounded "
               "result is what you want")
    leaves, tree = flatten(final)
    out = [Tensor(checked(x.ir_var, cut.ir_var, message, on_max_iters), x.requires_grad)
           for x in leaves]
    if not runtime.is_traced(cut.ir_var):
        realize(out)
    return unflatten(tree, out)


# -- custom_vjp: nondiff_argnums and the shapes of fwd's and bwd's results -----------------------------------

def _nondiff_argnums(nums):
    nums = tuple(nums) if isinstance(nums, (tuple, list)) else (nums,)
    if not all(_is_int(a) and a >= 0 for a in nums):
        raise ArgumentError(f"custom_vjp: nondiff_argnums must be a tuple of non-negative ints, got {nums!r}")
    return tuple(sorted(set(nums)))


def _call_with_nondiff(f, args):
    """A custom_vjp with nondiff_argnums: one plain custom_vjp per value of those arguments, over the
    others; its bwd gets the non-differentiated values first, as in JAX."""
    nondiff = f.nondiff_argnums
    if nondiff[-1] >= len(args):
        raise ArgumentError(f"custom_vjp {f.__name__}: nondiff_argnums {nondiff} is out of range for a "
                            f"call with {len(args)} arguments")
    static = tuple(args[i] for i in nondiff)
    if not _hashable(static):
        raise ArgumentError(f"custom_vjp {f.__name__}: the nondiff_argnums arguments must be hashable "
                            "Python values (functions, numbers, tuples); pass arrays as ordinary "
                            "arguments and return a zero (or None) cotangent for them")
    inner = f._static.get((len(args), static))
    if inner is None:
        values = dict(zip(nondiff, static))
        fun, fwd, bwd = (_with_statics(g, values, len(args)) for g in (f.fun, f.fwd, f.bwd))
        inner = custom_vjp(fun)
        inner.__name__ = f.__name__
        inner.defvjp(fwd, lambda res, ct: f.bwd(*static, res, ct))
        f._static[(len(args), static)] = inner
    return inner(*[a for i, a in enumerate(args) if i not in nondiff])


def _check_fwd_out(name, entry, fentry):
    """fwd's ``out`` must be what the function itself returns (structure, shapes and dtypes)."""
    out_tree = fentry.out_tree.children[0]
    got = fentry.program.outputs[:out_tree.num_leaves]
    want = entry.program.outputs
    if out_tree != entry.out_tree or [(v.shape, v.dtype) for v in got] != [(v.shape, v.dtype) for v in want]:
        raise ShapeError(f"custom_vjp {name}: fwd returns (out, residuals) with out {out_tree} of "
                         f"{[v.type_str() for v in got]}, but the function returns {entry.out_tree} of "
                         f"{[v.type_str() for v in want]}; fwd's out must be the function's result")


def _cotangent_leaves(name, cts, args, in_vars):
    """bwd's cotangents as leaves, checked against the arguments (None = zero)."""
    leaves, start = [], 0
    for i, (ct, a) in enumerate(zip(cts, args)):
        a_leaves, a_tree = flatten(a)
        want = in_vars[start:start + len(a_leaves)]
        start += len(a_leaves)
        if ct is None:
            leaves += [Tensor(api.zeros(v.shape, v.dtype, v.device)) for v in want]
            continue
        c_leaves, c_tree = flatten(ct)
        if c_tree != a_tree:
            raise ShapeError(f"custom_vjp {name}: bwd's cotangent {i} has structure {c_tree}, but "
                             f"argument {i} is {a_tree}; return one cotangent per argument, shaped "
                             "like it (or None for zero)")
        for c, v in zip(c_leaves, want):
            cv = _leaf_var(c, f"custom_vjp {name} cotangent")
            if cv.shape != v.shape:
                raise ShapeError(f"custom_vjp {name}: bwd's cotangent {i} has shape "
                                 f"{format_shape(cv.shape)}, but argument {i} has shape "
                                 f"{format_shape(v.shape)}; a cotangent is shaped like its argument")
        leaves += c_leaves
    return leaves


# -- check_grads' arguments ------------------------------------------------------------------------------

def _check_grads_arguments(fn, args, order, modes, eps, rtol, atol, seed):
    _check_step(fn, "check_grads")
    if not isinstance(args, (tuple, list)):
        raise ArgumentError(f"check_grads: args must be a tuple of the function's arguments, got "
                            f"{type(args).__name__}; write check_grads(f, (x,))")
    try:
        inspect.signature(fn).bind(*args)
    except TypeError as err:
        raise ArgumentError(f"check_grads: the function cannot take the {len(args)} argument(s) in "
                            f"args ({err}); pass one entry of args per parameter") from None
    except ValueError:          # no signature to read (a builtin): the call will tell
        pass
    for i, a in enumerate(args):
        value = a.numpy() if isinstance(a, Tensor) else np.asarray(a) if not isinstance(a, str) else None
        if value is None or value.dtype.kind not in "biuf":
            raise ArgumentError(f"check_grads: argument {i} must be an array or a number, got "
                                f"{type(a).__name__}")
    check_int(order, "order", "check_grads", low=1, high=MAX_CHECK_ORDER)
    kinds = None if isinstance(modes, str) else check_sequence(modes, "modes", "check_grads")
    if not kinds or not all(isinstance(m, str) and m in ("fwd", "rev") for m in kinds):
        raise ArgumentError(f"check_grads: modes must be a tuple of 'fwd' and/or 'rev', got {modes!r}")
    if eps is not None and (not isinstance(eps, numbers.Real) or not 0 < eps < np.inf):
        raise ArgumentError(f"check_grads: eps must be a positive finite step, got {eps!r}")
    check_int(seed, "seed", "check_grads", low=0)
    return check_real(rtol, "rtol", "check_grads", low=0), check_real(atol, "atol", "check_grads", low=0)


# -- loops JAX users expect -------------------------------------------------------------------------------

def fori_loop(lower, upper, body_fun, init_val):
    """``carry = body_fun(i, carry)`` for ``i`` in ``range(lower, upper)``; returns the carry.

    With concrete int bounds it is a ``scan`` over the indices (every mode
    of differentiation, reverse too); with traced bounds a ``while_loop``
    (forward and forward mode).  ``upper <= lower`` returns ``init_val``.

    >>> vkml.fori_loop(0, 4, lambda i, acc: acc * 2.0, 1.0)
    tensor(16., dtype=float64)
    """
    _check_step(body_fun, "fori_loop", "the body")
    lo, hi = _loop_bound(lower, "lower"), _loop_bound(upper, "upper")
    if lo is not None and hi is not None:
        if hi <= lo:
            return init_val
        dtype = np.int32 if -2**31 <= lo and hi <= 2**31 else np.int64
        check_int(hi - lo, "upper - lower (the number of iterations)", "fori_loop", high=MAX_ELEMENTS)
        with host_memory("fori_loop", f"an index for each of {hi - lo} iterations"):
            indices = np.arange(lo, hi, dtype=dtype)
        carry, _ = scan(lambda c, i: (body_fun(i, c), None), init_val, indices)
        return carry
    _, carry = while_loop(lambda s: s[0] < upper, lambda s: (s[0] + 1, body_fun(s[0], s[1])),
                          (lower, init_val))
    return carry


def _loop_bound(bound, name):
    """A concrete int bound as a Python int, None for a traced one; anything else is refused."""
    if isinstance(bound, Tensor):
        if bound.shape != () or bound.dtype.kind not in "iu":
            raise ArgumentError(f"fori_loop: {name} must be an integer scalar, got {bound.ir_var.type_str()}")
        return None if runtime.is_traced(bound.ir_var) else int(bound.item())
    return check_int(bound, name, "fori_loop", low=-_INT64_MAX - 1, high=_INT64_MAX)


def associative_scan(fn, elems, reverse=False, axis=0):
    """All prefix combinations: ``out[i] = fn(... fn(fn(e[0], e[1]), e[2]) ..., e[i])`` along ``axis``.

    ``fn`` must be associative and work on whole slices at once (it is
    called on stacks of elements, as JAX requires); ``elems`` is a pytree of
    arrays of one length along ``axis``.  ``reverse=True`` combines suffixes
    in the original order: ``out[i] = e[i] (+) e[i+1] (+) ... (+) e[n-1]``.
    It takes ceil(log2 n) rounds, each one call of ``fn`` on shifted slices
    (Hillis and Steele's scan), built from ordinary operations, so it is
    lazy and differentiable like them.

    >>> vkml.associative_scan(vkml.add, np.array([1.0, 2.0, 3.0, 4.0]))
    tensor([ 1.,  3.,  6., 10.], dtype=float64)
    """
    _check_step(fn, "associative_scan")
    reverse = check_bool(reverse, "reverse", "associative_scan")
    leaves, tree = flatten(elems)
    if not leaves:
        raise ArgumentError("associative_scan: elems has no arrays")
    xs = [x if isinstance(x, Tensor) else tensor(x) for x in leaves]
    if not _is_int(axis):
        raise ArgumentError(f"associative_scan: axis must be an int, got {axis!r}")
    axes = [api.normalize_axis("associative_scan", x.ndim, axis) if x.ndim else None for x in xs]
    if None in axes:
        raise ShapeError("associative_scan: every leaf of elems needs the scanned axis; got a 0-d leaf")
    xs = [_wrap_like(x, _move_axis(x.ir_var, a, 0)) for x, a in zip(xs, axes)]
    lengths = {x.shape[0] for x in xs}
    if len(lengths) != 1:
        raise ShapeError(f"associative_scan: the leaves of elems have lengths {sorted(lengths)} along "
                         f"axis {axis}; they must all be equal")
    n = lengths.pop()
    if reverse:
        xs = [flip(x, 0) for x in xs]

    def combine(a, b):
        out = fn(unflatten(tree, b), unflatten(tree, a)) if reverse else \
            fn(unflatten(tree, a), unflatten(tree, b))
        out_leaves, out_tree = flatten(out)
        if out_tree != tree:
            raise ShapeError(f"associative_scan: fn returns {out_tree} but elems is {tree}")
        return out_leaves

    offset = 1
    while offset < n:
        combined = combine([x[:n - offset] for x in xs], [x[offset:] for x in xs])
        xs = [concatenate([x[:offset], c]) for x, c in zip(xs, combined)]
        offset *= 2
    if reverse:
        xs = [flip(x, 0) for x in xs]
    xs = [_wrap_like(x, _move_axis(x.ir_var, 0, a)) for x, a in zip(xs, axes)]
    return unflatten(tree, xs)
