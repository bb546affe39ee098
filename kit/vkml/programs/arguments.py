"""How arguments become a program's inputs: flattening pytrees into leaves and
signatures, the per-key program cache and the fast plans that skip it, tracing a function once,
and the helpers that wrap traced values and captured tensors."""

from __future__ import annotations

import inspect
import numbers
import types
import weakref

import numpy as np

from .. import runtime
from ..backends.base import ExecutionFailure
from ..backends.cpu import Tiered
from ..backends.numpy_backend import FRESH
from ..errors import ArgumentError, TracingError
from ..ir import Var, collect, current_serial, program_from_dag
from ..ops import api
from ..pytree import flatten, leaf_paths, unflatten
from ..runtime import call_context
from ..stats import STATS
from ..tensor import Tensor, realize
from ..threadsafe import Cache
from ..transforms.interpret import inline


def leaf_var(x, where):
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


def signature_of_vars(vars_):
    """The key's per-leaf part: each leaf's type, and which leaves are the same value (aliasing)."""
    sig = tuple([(v.shape, v.dtype, v.device, v.weak) for v in vars_])
    ids = [id(v.value) if v.value is not None else id(v) for v in vars_]
    if len(set(ids)) == len(ids):
        return sig, ()
    return sig, tuple(ids.index(i) for i in ids)


_FLAT_TREES = {}

#: fast-call plans a jitted function keeps at most (see Jitted._remember)
FAST_PLANS = 8


#: (one global name, not ``np.ndarray``'s two lookups: ``fast_key`` reads it per argument)
_NDARRAY = np.ndarray


def fast_key(args):
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
HOST_BACKENDS = ("numpy", "cpu")


class ProgramCache(Cache):
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


class FastPlan:
    """A jitted call with plain concrete arguments (``fast_key``), ready to run: the key and
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


def flat_args(args):
    """Flatten call arguments, with fast paths for a flat tuple of Tensors (the common call) and
    for tuples and lists of Tensors and floats (an optimiser's update: parameters, gradients,
    state and step sizes)."""
    for a in args:
        if type(a) is not Tensor:
            leaves = []
            tree = _known_tree(_container_signature(args, leaves, 0), args, leaves)
            if tree is None:
                leaves, tree = flatten(args)
            return leaves, tree, [leaf_var(x, "jit") for x in leaves]
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


class Entry:
    """One key's program and everything derived from it."""

    __slots__ = ("program", "out_tree", "derived", "executables", "captures")

    def __init__(self, program, out_tree, captures=()):
        self.program = program
        self.out_tree = out_tree
        # values of enclosing traces the function closes over: the program's last inputs
        self.captures = tuple(captures)
        self.derived = {}
        self.executables = {}


def trace(fn, in_tree, in_vars, where):
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
    with grad_disabled(), _open_trace(placeholders):
        out = fn(*args)
    out_leaves, out_tree = flatten(out)
    outs = [leaf_var(o, where + " result") for o in out_leaves]
    captures = _realize_captures(outs, placeholders, start)
    if not captures:
        return program_from_dag(placeholders, outs), out_tree, ()
    inner = program_from_dag(placeholders + captures, outs)
    fresh = placeholders_like(inner.inputs)     # the program does not hold the outer graph
    return program_from_dag(fresh, inline(inner, fresh)), out_tree, captures


def input_names(fn, in_tree, count):
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


def grad_disabled():
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


def trace_closed(fn, args, placeholders):
    """Call ``fn(*args)`` on placeholder tensors (a step, a branch, a loop body)."""
    STATS.traces += 1
    with grad_disabled(), _open_trace(placeholders):
        return fn(*args)


def captures_of(outs, placeholders):
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


def wrap(vars_, operands):
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


def placeholders_like(vars_):
    return [Var(v.shape, v.dtype, v.device, weak=v.weak) for v in vars_]


_KEYWORD_CALLERS = weakref.WeakKeyDictionary()


def keyword_caller(fn):
    """``fn`` taking its keyword arguments as one last positional dict, so they are traced arguments
    (not differentiated), not constants baked into the program.  One per ``fn``, so jit's cache hits."""
    own = fn.__dict__ if isinstance(fn, types.FunctionType) else None
    try:
        caller = own.get(OWN_CALLER) if own is not None else _KEYWORD_CALLERS.get(fn)
    except TypeError:
        caller = None
    if caller is None:
        def caller(*args):
            return fn(*args[:-1], **args[-1])
        caller.__name__ = getattr(fn, "__name__", "f")
        if own is not None:             # lives and dies with fn (a registry would keep fn alive)
            own[OWN_CALLER] = caller
        else:
            try:
                _KEYWORD_CALLERS[fn] = caller
            except TypeError:
                pass
    return caller


OWN_CALLER = "__vkml_keyword_caller__"
