"""The runtime: modes, the current backend, submission, realize, the grad-leaf registry, caches.

Everything that decides *how* work runs lives here; ``Tensor`` (in
``tensor.py``) only builds nodes and calls these functions, and the other
layers (programs, graphs, optimizers, pictures) use the public names below,
never another module's private state.

Modes belong to their thread
----------------------------
Each thread and each asyncio task has its own modes, so an optimizer step
under ``no_grad`` in one thread never stops another thread's model from
recording gradients, and a thread on the NumPy backend never runs on another
thread's ``cpu`` backend.  There are two kinds of calls:

- **Blocks, local to the thread or task**: ``with vkml.no_grad():``,
  ``with vkml.eager():``, ``with vkml.use_backend("cpu"):``.  They change
  only the current thread or task, for the block, and restore on exit (also
  on an error).  An asyncio task starts with a copy of its creator's modes.
- **Global calls**: ``vkml.set_backend(name)`` and ``vkml.set_eager(flag)``
  set the *process default* -- what every thread and task follows that has
  not chosen its own, including threads started later -- and the caller's
  own setting (so another thread's later global call does not change it
  under the caller).  Call them at the top of a script or notebook.

A new thread starts from the process defaults: the backend named by
``VKML_BACKEND`` (``numpy`` if unset) or the last ``set_backend``; eager mode
from ``VKML_EAGER`` (off if unset) or the last ``set_eager``; gradients
recorded; the device is the backend's.  Gradient recording has no global
switch: ``no_grad`` is always a block.

Caches have a lifetime
----------------------
Programs are cached per key, executables per variant, derived programs per
derivation.  Every one of these caches keeps at most ``cache_limit()``
entries (1024 unless ``VKML_CACHE_LIMIT`` or :func:`set_cache_limit` says
otherwise), dropping the least recently used; :func:`clear_caches` empties
them all (the next call traces and compiles again), and
``vkml.stats().caches`` shows their sizes.  A jitted function and its
programs per key are freed with the function; what was derived and compiled
from them is shared by program structure (another function with the same
program reuses it), so it stays in those bounded caches until pushed out or
cleared.  Caches are shared by all threads: threads that need the same
executable at once wait for one compile.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from . import threadsafe
from .backends import ExecutionFailure, current, set_backend, use_backend  # noqa: F401 (public)
from .backends.base import instances
from .errors import ArgumentError, ExecutionError, GradError, TracingError
from .ir import Program, collect, collect_keyed, site_text
from .ops.operands import DEFAULT_DEVICE as _DEVICE_SETTING
from .ops.api import default_device
from .ops.linalg import DETERMINISTIC_MATMUL
from .ops import recipes
from .ops.core import CURRENT_SITE, user_site
from .stats import STATS
from .threadsafe import Cache, Setting, cache_limit, cache_sizes  # noqa: F401 (public)
from .transforms import vjp_program
from .validate import check_bool, check_int

__all__ = ["set_eager", "is_eager", "eager", "no_grad", "enable_grad", "is_grad_enabled",
           "set_backend", "use_backend", "current_backend", "current_device", "user_line", "user_code",
           "submit", "compute", "realize", "is_traced", "register_grad_leaf", "grad_leaf",
           "is_grad_leaf", "backward", "set_cache_limit", "cache_limit", "cache_sizes",
           "clear_caches", "deterministic_matmul", "is_deterministic_matmul"]


# -- modes ------------------------------------------------------------------------------------------

_EAGER = Setting("eager", os.environ.get("VKML_EAGER", "0") not in ("", "0", "false", "False"))
_GRAD_ENABLED = Setting("grad_enabled", True)      # no global call changes it: blocks only


def set_eager(enabled: bool) -> None:
    """Run every operation at once (debugging: an error names the line that caused it).

    A global call: the process default and this thread's own (see the module docstring);
    ``with vkml.eager():`` changes only this thread or task.

    >>> vkml.set_eager(True)
    >>> vkml.is_eager()
    True
    >>> vkml.set_eager(False)
    """
    _EAGER.set_global(check_bool(enabled, "enabled", "set_eager"))


def is_eager() -> bool:
    """Whether operations of this thread or task run at once.

    >>> vkml.is_eager()
    False
    >>> with vkml.eager():
    ...     print(vkml.is_eager())
    ...
    True
    """
    return _EAGER.get()


class _Mode:
    """A ``with`` block that sets a mode of this thread or task and restores it on exit (a class
    rather than a generator, so it costs little: tracing enters one per traced function)."""

    __slots__ = ("_var", "_value", "_tokens")

    def __init__(self, var, value):
        self._var, self._value, self._tokens = var, value, []

    def __enter__(self):
        self._tokens.append(self._var.set_local(self._value))
        return self

    def __exit__(self, *exc):
        self._var.reset(self._tokens.pop())


def eager(enabled: bool = True) -> _Mode:
    """``with vkml.eager():`` -- eager mode in this thread or task for the block, restored after.

    >>> with vkml.eager():
    ...     y = vkml.tensor([1.0]) + 1
    ...     print(y.ir_var.value is not None)
    ...
    True
    """
    return _Mode(_EAGER, check_bool(enabled, "enabled", "eager"))


def no_grad() -> _Mode:
    """``with vkml.no_grad():`` -- operations of this thread or task in the block record no
    gradients (optimizer updates, evaluation); other threads keep recording theirs.

    >>> w = vkml.tensor([1.0], requires_grad=True)
    >>> with vkml.no_grad():
    ...     print(vkml.is_grad_enabled(), (w * 2).requires_grad)
    ...
    False False
    """
    return _Mode(_GRAD_ENABLED, False)


def enable_grad() -> _Mode:
    """``with vkml.enable_grad():`` -- record gradients again inside a ``no_grad`` block.

    >>> with vkml.no_grad():
    ...     with vkml.enable_grad():
    ...         print(vkml.is_grad_enabled())
    ...
    True
    """
    return _Mode(_GRAD_ENABLED, True)


def is_grad_enabled() -> bool:
    """Whether new operations of this thread or task record gradients.

    >>> vkml.is_grad_enabled()
    True
    """
    return _GRAD_ENABLED.get()


def deterministic_matmul(enabled: bool = True) -> _Mode:
    """``with vkml.deterministic_matmul():`` -- matrix products bound in this thread or task in
    the block (``@``, ``vkml.matmul``, ``nn.Linear``, ``conv2d``) sum over the contraction index in
    the canonical tree order: the same bits on every backend, slower than BLAS.  Read when an op
    is built, so a jitted function traced inside the block keeps it (the mode is part of its
    cache key), and derivatives of such a product are deterministic too.

    >>> a, b = vkml.tensor(np.arange(6.0).reshape(2, 3)), vkml.tensor(np.ones((3, 2)))
    >>> with vkml.deterministic_matmul():
    ...     c = a @ b                   # bound here: summed in the tree order when it runs
    ...
    >>> c
    tensor([[ 3.,  3.],
            [12., 12.]], dtype=float64)
    """
    return _Mode(DETERMINISTIC_MATMUL, check_bool(enabled, "enabled", "deterministic_matmul"))


def is_deterministic_matmul() -> bool:
    """Whether matrix products bound now in this thread or task are deterministic.

    >>> vkml.is_deterministic_matmul()
    False
    >>> with vkml.deterministic_matmul():
    ...     vkml.is_deterministic_matmul()
    ...
    True
    """
    return DETERMINISTIC_MATMUL.get()


def call_context() -> tuple:
    """``(backend, device, deterministic matmul)`` of this thread or task, read at once: what a
    jitted call with plain arguments depends on besides their types (its fast key)."""
    return current(), _DEVICE_SETTING.get(), DETERMINISTIC_MATMUL.get()


def current_backend():
    """The backend this thread's or task's work runs on (``set_backend`` / ``use_backend``)."""
    return current()


def current_device() -> str:
    """Where this thread's or task's new constants are placed: the current backend's device."""
    current()               # the first use picks the backend (and so the device)
    return default_device()


def user_site_text():
    """The user's current line as an error names it (``file.py:12``, ``cell In[5], line 2``),
    or None where every frame is vkml's."""
    return site_text(user_site())


class user_line:
    """``with user_line():`` -- every bind in the block names the user's line, found once.

    A composite op (``softmax``: several primitives) walks the stack once instead of per bind;
    an op already inside one keeps the outer line.  Per thread and task, like the modes."""

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = CURRENT_SITE.set(user_site()) if CURRENT_SITE.get() is None else None
        return self

    def __exit__(self, *exc):
        if self._token is not None:
            CURRENT_SITE.reset(self._token)


class user_code:
    """``with user_code():`` -- every bind in the block finds the user's line itself: the block
    runs the user's own code (a module's ``forward``) inside a ``user_line`` block of vkml's,
    whose line would otherwise name the call of the whole model instead."""

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = CURRENT_SITE.set(None) if CURRENT_SITE.get() is not None else None
        return self

    def __exit__(self, *exc):
        if self._token is not None:
            CURRENT_SITE.reset(self._token)


# -- values written in place ---------------------------------------------------------------------

#: ``id`` of each Var whose array a step is writing in place right now -> the writing thread.
#: A reader in another thread that finds its Var here waits until the write is done
#: (:func:`settled`); empty almost always, so a reader pays one truthiness test.
WRITING: dict = {}
_WRITES_DONE = threading.Condition(threading.Lock())


class writing:
    """``with writing(ids):`` -- the arrays of the Vars of these ``id``s may be written in place
    in the block.

    Why: a step decides to write an array in place when nothing but the optimiser references it
    (``sys.getrefcount``), then writes it.  Another Python thread could take a view of the array
    between the two (``p.numpy()``), and would then see its values change.  So the Vars are marked
    *before* the step counts references, and a reader marks nothing but looks *after* taking its
    reference: either the step sees the reader's reference (and writes a new array) or the reader
    sees the mark (and waits for the step, then reads its new values).  Under the GIL one of the
    two always sees the other."""

    __slots__ = ("vars",)

    def __init__(self, ids):
        self.vars = ids

    def __enter__(self):
        me = threading.get_ident()
        with _WRITES_DONE:
            for v in self.vars:
                WRITING[v] = me
        return self

    def __exit__(self, *exc):
        with _WRITES_DONE:
            for v in self.vars:
                WRITING.pop(v, None)
            _WRITES_DONE.notify_all()
        return False


#: a compiled step's trace points a model's parameters at placeholders, and a step's commit
#: replaces them one by one (the writers); forwards in other threads (readers) wait for either
#: (``nn.Module.__call__``), so a forward sees the parameters of one step, never a mix
MODEL_TRACE = threadsafe.ReadersWriter()


def settled(var) -> bool:
    """Wait while another thread writes ``var``'s array in place; True if it had to wait (the
    caller then reads again: the tensor may hold a new Var by now)."""
    with _WRITES_DONE:
        writer = WRITING.get(id(var))
        if writer is None or writer == threading.get_ident():
            return False
        while id(var) in WRITING:
            _WRITES_DONE.wait()
    return True


# -- the grad-leaf registry -----------------------------------------------------------------------

#: leaf Var -> weakref to the Tensor whose ``.grad`` receives its gradient.
_GRAD_LEAVES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def register_grad_leaf(var, tensor) -> None:
    """Make ``tensor`` the one whose ``.grad`` receives the gradient of leaf ``var``."""
    _GRAD_LEAVES[var] = weakref.ref(tensor)


def grad_leaf(var):
    """The tensor registered for leaf ``var`` (None if none, or if it was dropped)."""
    ref = _GRAD_LEAVES.get(var)
    return ref() if ref is not None else None


def is_grad_leaf(var) -> bool:
    """Whether a tensor that requires grad was made on ``var``."""
    return var in _GRAD_LEAVES


# -- submission and realize -----------------------------------------------------------------------

def is_traced(var) -> bool:
    """Whether ``var`` depends on a placeholder of a trace (so it has no value to compute)."""
    if var.value is not None:
        return False
    if var.eqn is None:
        return True
    leaves, _ = collect([var])
    return any(l.value is None for l in leaves)


def submit(backend, exe, args, eqns, resident=False, into=None):
    """One submission of ``exe`` (compiled from a program whose equations are ``eqns``) on
    ``args``; a failing equation is named.  ``resident``: the values become tensors', so a GPU
    backend may keep them in device memory; ``into``: destinations (see ``Backend.run``)."""
    try:
        return backend.run(exe, args, resident, into)
    except ExecutionFailure as failure:
        raise execution_error(failure, eqns) from failure.error
    except MemoryError as error:
        raise execution_error(error, eqns) from None


def execution_error(error, eqns):
    """The ExecutionError for an executable's failure (``ExecutionFailure``: naming the equation
    that failed) or for running out of memory."""
    if isinstance(error, ExecutionFailure):
        return ExecutionError(f"{eqns[error.index].describe()} failed: {error.error}")
    return ExecutionError(f"a program of {len(eqns)} operations needs more memory than this "
                          "process can allocate; use smaller shapes")


def compute(out_vars) -> list:
    """The values of ``out_vars`` (none holding one yet), computed in ONE submission on the
    current backend; the pending graph is compiled once per structure."""
    recipes.reset_tape()        # the replays so far made graphs observed now (or not at all)
    leaves, eqns, key = collect_keyed(out_vars)
    for leaf in leaves:
        if leaf.value is None:
            raise TracingError(
                f"cannot compute a value that depends on a traced placeholder ({leaf.type_str()}); "
                "return it from the traced function instead")
    backend = current()
    exe = backend.executable(key, lambda: Program(leaves, eqns, out_vars))
    return submit(backend, exe, [l.value for l in leaves], eqns, resident=True)


def realize(vars_, keep_history=False) -> None:
    """Give every pending Var in ``vars_`` its value, all in ONE submission (nothing to do: no
    submission).  ``keep_history`` (one flag, or one per Var): keep the graph behind a Var (a
    backward will go through it); otherwise it is dropped, freeing what it held."""
    keep = keep_history if isinstance(keep_history, (list, tuple)) else [keep_history] * len(vars_)
    pending, flags, seen = [], [], set()
    for v, k in zip(vars_, keep):
        if v.value is None and v not in seen:
            seen.add(v)
            pending.append(v)
            flags.append(k)
    if not pending:
        return
    for v, value, k in zip(pending, compute(pending), flags):
        v.value = value
        if not k:
            v.eqn = None


# -- backward ---------------------------------------------------------------------------------------

#: (forward graph structure, which leaves get gradients, which accumulate) -> backward Program
_BACKWARD_PROGRAMS = Cache("backward programs")


#: dtype -> the read-only 1 that seeds a backward (made once: it is an input, never written)
_SEEDS = {}


def _seed(dtype):
    seed = _SEEDS.get(dtype)
    if seed is None:
        seed = np.ones((), dtype=dtype)
        seed.flags.writeable = False
        _SEEDS[dtype] = seed
    return seed


#: key of a graph made of recorded replays (``recipes.tape_graph``) -> (where each leaf of the
#: walk is among the tape's leaves, the walk's structural key, the backward programs derived
#: for it: (which leaves get gradients, which accumulate) -> Program)
_TAPE_PLANS = Cache("backward tape plans")
#: backward programs a plan keeps at most (a loop uses one or two: which leaves have a .grad)
_PLAN_PROGRAMS = 8
#: backwards that found their graph from the tape, and those that walked it (tests count them)
TAPE_COUNTS = {"from tape": 0, "walked": 0}


def _backward_graph(root):
    """``(leaves, equations, key, programs)`` of the whole graph behind ``root``, as
    ``collect_keyed`` gives them; equations None when they were not needed to find the rest;
    ``programs``: the backward programs its plan keeps (None when walked without one).

    A training step builds the same graph every step, op by op from recipes, so a graph made of
    this thread's recorded replays alone is found from them (``recipes.tape_graph``: about one
    lookup per op) and, once its key was seen, the walk over every equation -- ~30 us on the
    bench MLP's 33 -- is skipped: the leaves come in the walk's order from where the first walk
    found them, with its structural key.  Anything else is walked, as is the first graph of
    each key (and its plan kept).  The plan also keeps the backward programs found for it:
    the structural key is a tuple as large as the graph, and hashing it again to find the
    program in ``_BACKWARD_PROGRAMS`` cost ~7 us a step."""
    found = recipes.tape_graph(root)
    recipes.reset_tape()
    if found is not None:
        key, tape_leaves = found
        plan = _TAPE_PLANS.get(key)
        if plan is not None:
            order, graph_key, programs = plan
            TAPE_COUNTS["from tape"] += 1
            return [tape_leaves[j] for j in order], None, graph_key, programs
    TAPE_COUNTS["walked"] += 1
    leaves, eqns, graph_key = collect_keyed([root], is_leaf=_never)
    if found is not None:
        where = {v: j for j, v in enumerate(tape_leaves)}
        order = [where.get(v) for v in leaves]
        if None not in order:
            _TAPE_PLANS.put(key, (order, graph_key, {}))
    return leaves, eqns, graph_key, None


def _never(var) -> bool:
    """A backward walks the whole graph: a Var is a leaf only where it has no equation."""
    return False


def backward(root) -> list:
    """The gradients of 0-d ``root`` (a Var) for every registered leaf of its graph that still
    requires grad, added to that tensor's current ``.grad``: ``[(tensor, value), ...]``, from ONE
    submission.  The caller (``Tensor.backward``) has checked ``root`` and stores the values.

    The backward program is derived from the forward one by linearize + transpose and cached by
    the forward graph's structure, so a training loop derives and compiles it once."""
    leaves, eqns, graph_key, programs = _backward_graph(root)
    targets = []
    for i, leaf in enumerate(leaves):
        t = grad_leaf(leaf)
        if t is not None and t.requires_grad and t.ir_var is leaf:
            targets.append((i, t))
        if leaf.value is None:
            raise TracingError("backward: the graph depends on a traced placeholder; "
                               "use vkml.grad inside traced functions")
    if not targets:
        raise GradError("backward: no leaf of this graph requires grad")
    wrt, has_old, olds = [], [], []
    for i, t in targets:
        wrt.append(i)
        has_old.append(t.grad is not None)
        if t.grad is not None:
            olds.append(t.grad)
    if olds:
        realize([g.ir_var for g in olds], [g.requires_grad for g in olds])
    wrt, has_old = tuple(wrt), tuple(has_old)
    key = (graph_key, wrt, has_old)

    def derive():
        STATS.derivations += 1
        whole = eqns if eqns is not None else collect_keyed([root], is_leaf=_never)[1]
        return vjp_program(Program(leaves, whole, [root]), wrt, has_old)

    program = programs.get(key[1:]) if programs is not None else None
    if program is None:
        program, _ = _BACKWARD_PROGRAMS.get_or_make(key, derive)
        if programs is not None and len(programs) < _PLAN_PROGRAMS:
            programs[key[1:]] = program
    backend = current()
    # by the program (it hashes and compares by identity once made), not the graph key again
    exe = backend.executable(("backward", program), lambda: program)
    args = [l.value for l in leaves]
    args.append(_seed(root.dtype))
    args += [g.ir_var.value for g in olds]
    outs = submit(backend, exe, args, program.eqns, resident=True)
    root.value = outs[0]
    return [(t, g) for (_, t), g in zip(targets, outs[1:])]


# -- caches -----------------------------------------------------------------------------------------

def set_cache_limit(n: int) -> None:
    """Keep at most ``n`` entries in each cache (programs per key, executables per variant,
    derived programs, backward programs); the least recently used go first, now and later.
    Also ``VKML_CACHE_LIMIT=n`` in the environment.  The default is 1024.

    >>> old = vkml.cache_limit()
    >>> vkml.set_cache_limit(16)
    >>> vkml.cache_limit()
    16
    >>> vkml.set_cache_limit(old)
    """
    n = check_int(n, "n", "set_cache_limit")
    if n < 1:
        raise ArgumentError(f"set_cache_limit: the limit must be at least 1, got {n}; use "
                            "vkml.clear_caches() to empty the caches")
    threadsafe.set_cache_limit(n)


def clear_caches() -> None:
    """Empty every cache: programs of jitted functions, derived programs, backward programs and
    every backend's executables.  The next call traces and compiles again (``vkml.stats()``
    counts it); a compiled tier may load its code from its disk cache instead of compiling.

    >>> f = vkml.jit(lambda x: x + 1)
    >>> _ = f(np.ones(2))
    >>> vkml.clear_caches()
    >>> _ = f(np.ones(2))
    >>> f.cache_info()["traces"]
    2
    """
    for backend in instances():
        backend.clear_cache()         # a device backend frees what its executables hold
    threadsafe.clear_caches()
    recipes.clear()
    for forget in ON_CLEAR:
        forget()


#: what else ``clear_caches`` empties: memos that hold programs or executables (jitted functions'
#: fast-call plans), registered by the modules that keep them
ON_CLEAR = []
