"""``jit``: one Program per argument key, compiled once per variant and replayed.

A call with concrete arguments runs at once; with lazy or traced arguments it becomes one ``call``
equation of the larger graph.  Static arguments get a Jitted per value."""

from __future__ import annotations

import functools
import types
import weakref

from .. import runtime
from ..errors import ArgumentError, VkmlError, boundary, hide_vkml_frames
from ..ir import Program, Var
from ..pytree import flatten, unflatten
from ..stats import STATS
from ..tensor import Tensor
from ..threadsafe import Cache
from ..transforms.control import call
from .arguments import (Entry, FAST_PLANS, FastPlan, HOST_BACKENDS, OWN_CALLER, ProgramCache,
    fast_key, flat_args, input_names, keyword_caller, signature_of_vars, trace)
from .checks import check_function, checked_argnums, is_int


def _forget_fast_plans():
    for jitted in list(_LIVE):
        jitted._forget_plans()


runtime.ON_CLEAR.append(_forget_fast_plans)


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
        if name not in (_OWN_JIT, OWN_CALLER) and not hasattr(jitted, name):
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
        self._entries = ProgramCache("jit programs")
        self.traces = self.compiles = self.derivations = self.hits = 0
        # fast-call plans (see FastPlan), by the arguments' types and the backend, and the
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
        return (in_tree, signature_of_vars(in_vars), runtime.is_deterministic_matmul())

    def _lookup(self, args):
        leaves, in_tree, in_vars = flat_args(args)
        key = self._key(in_tree, in_vars)
        entry = self._entries.get(key)
        if entry is None:
            self._touch_fast_plans()
            program, out_tree, captures = trace(self.fn, in_tree, in_vars, self.__name__)
            program.arg_names = input_names(self.fn, in_tree, len(program.inputs))
            program.fn_code = getattr(self.fn, "__code__", None)
            entry = Entry(program, out_tree, captures)
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
            fast = fast_key(args)
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
            outs = apply_program(self, entry, "primal", entry.program, in_vars, requires)
            if fast is not None and not entry.captures:
                self._remember(fast, args, entry, in_vars)
            return unflatten(entry.out_tree, outs)
        except VkmlError as error:          # (the user's frames only: see hide_vkml_frames)
            hide_vkml_frames(error)
            raise

    def _call_overwriting(self, args, destinations):
        """``self(*args)``'s results as one flat list, with results computed over arguments the
        caller owns: on the fast path, ``destinations(plan)`` gives ``into`` for
        ``FastPlan.run`` (None: none) and the list holds the results' Vars; a call without a
        plan takes the full path, overwrites nothing (the next one has a plan) and gives its
        result Tensors.  An optimiser's compiled step updates parameters and moments in place
        with it, and splits the flat results itself."""
        plan = self._plan(fast_key(args))
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
            inner = self._keywords = Jitted(keyword_caller(self.fn))
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
        if backend.name not in HOST_BACKENDS or entry.captures:
            return
        if len(self._fast) >= FAST_PLANS:
            self._forget_plans()
        key = self._key(flatten(args)[1], in_vars)
        removals = self._entries.removals
        if self._entries.get(key) is not entry or not FastPlan.fits(args, entry):
            return
        tag, program, tree = "primal", entry.program, entry.out_tree
        if derived is not None:
            tag, program, tree = derived[0], self._derive(entry, derived[0], derived[1]), None
        exe = _executable(self, entry, tag, program, backend, [v.value for v in in_vars])
        self._fast[fast] = FastPlan(key, entry, program, exe, args, removals, tree)

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


def apply_program(owner, entry, variant_tag, prog, in_vars, requires_grad):
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


@boundary
def program(fn, *args) -> Program:
    """The Program ``fn`` traces to for these arguments (``print`` it to read it).

    >>> print(vkml.program(lambda x: vkml.sin(x) * 2.0, np.ones(3)))
    program (x)
      %4 : float64 [3] at CPU = Map [mul(sin(x0), 2.0)] (x0: float64 [3] at CPU)
        with x0 = x
      return %4
    """
    check_function(fn, "program")
    jitted = jit(fn)
    entry, _, _ = jitted._lookup(args)
    return entry.program


class _StaticJitted:
    """``jit(fn, static_argnums=...)``: the static arguments are Python values of the program (one
    program per value, so they must be hashable); the others are traced as usual."""

    def __init__(self, fn, static_argnums):
        check_function(fn, "jit")
        nums = tuple(static_argnums) if isinstance(static_argnums, (tuple, list)) else (static_argnums,)
        if not all(is_int(a) for a in nums):
            raise ArgumentError(f"jit: static_argnums must be an int or a tuple of ints (positions of "
                                f"arguments baked into the program), got {static_argnums!r}")
        self.fn, self.static_argnums = fn, nums
        self._jitted = Cache("jit static values")      # bounded, like every per-key cache
        functools.update_wrapper(self, fn)

    def __call__(self, *args):
        name = getattr(self.fn, "__name__", "f")
        nums = checked_argnums(self.static_argnums, len(args), f"jit({name}) static_argnums")
        statics = tuple((i, args[i]) for i in sorted(set(nums)))
        try:
            hash(statics)
        except TypeError:
            bad = next(i for i, a in statics if not hashable(a))
            raise ArgumentError(f"jit({name}): static argument {bad} is a {type(args[bad]).__name__}, "
                                "which is unhashable; a static argument is part of the program's key: "
                                "pass a tuple instead of a list, or make it an ordinary (traced) "
                                "argument") from None
        jitted = self._jitted.get(statics)
        if jitted is None:
            made = Jitted(with_statics(self.fn, dict(statics), len(args)))
            jitted = self._jitted.put_first(statics, made)
        return jitted(*[a for i, a in enumerate(args) if i not in dict(statics)])

    def cache_info(self) -> dict:
        """The counters of ``Jitted.cache_info``, summed over the static values seen."""
        infos = [j.cache_info() for j in self._jitted.values()]
        return {k: sum(i[k] for i in infos) for k in ("traces", "compiles", "derived", "hits", "keys")}


def hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def with_statics(fn, statics, nargs):
    def call(*dynamic):
        it = iter(dynamic)
        return fn(*[statics[i] if i in statics else next(it) for i in range(nargs)])
    call.__name__ = getattr(fn, "__name__", "f")
    return call
