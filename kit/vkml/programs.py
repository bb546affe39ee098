"""Traced programs: ``jit``, ``scan`` and the derivative transformations, on Tensors.

This follows rune's "one call" (the seed ``002``): ``jit(body)`` keeps one
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

import functools
import numbers
import weakref

import numpy as np

from . import backends
from .errors import ArgumentError, GradError, ShapeError, TracingError
from .ir import Program, Var, collect, current_serial, dtype_name, format_shape, program_from_dag
from .ops import api
from .printer import pp_program
from .pytree import flatten, unflatten
from .stats import STATS
from .tensor import Tensor, _GRAD_ENABLED, _submit
from .transforms import jvp_program, partial_eval, transpose_program, vmap_program
from .transforms.ad import derived
from .transforms.control import call, scan_bind

__all__ = ["jit", "scan", "grad", "value_and_grad", "vjp", "jvp", "linearize", "program",
           "pp_program", "Jitted", "vmap", "jacfwd", "jacrev", "hessian", "hvp"]


# -- arguments -------------------------------------------------------------------------------

def _leaf_var(x, where):
    """The IR Var of one argument leaf: a Tensor's own, or a constant for an array/number."""
    if isinstance(x, Tensor):
        return x.var
    if isinstance(x, bool) or isinstance(x, (int, float)) and not isinstance(x, np.generic):
        v = api.constant(x)
        v.weak = True
        return v
    if isinstance(x, (np.ndarray, np.generic, numbers.Number)):
        return api.constant(x)
    raise ArgumentError(f"{where}: argument leaves must be Tensors, NumPy arrays or numbers, got "
                        f"{type(x).__name__}; pass pytrees of tuples, lists and dicts of those")


def _signature(vars_):
    """The key's per-leaf part: type, and which leaves are the same value (aliasing)."""
    first = {}
    sig = []
    for i, v in enumerate(vars_):
        alias = first.setdefault(id(v.value) if v.value is not None else id(v), i)
        sig.append((v.shape, v.dtype, v.device, v.weak, alias))
    return tuple(sig)


class _Entry:
    """One key's program and everything derived from it."""

    __slots__ = ("program", "out_tree", "derived", "executables")

    def __init__(self, program, out_tree):
        self.program = program
        self.out_tree = out_tree
        self.derived = {}
        self.executables = {}


def _trace(fn, in_tree, in_vars, where):
    """Run ``fn`` on placeholder Tensors; return its Program and output treedef."""
    start = current_serial()
    placeholders = [Var(v.shape, v.dtype, v.device, weak=v.weak) for v in in_vars]
    args = unflatten(in_tree, [Tensor(p) for p in placeholders])
    STATS.traces += 1
    with _grad_disabled():
        out = fn(*args)
    out_leaves, out_tree = flatten(out)
    outs = [_leaf_var(o, where + " result") for o in out_leaves]
    _realize_captures(outs, placeholders, start)
    return program_from_dag(placeholders, outs), out_tree


class _grad_disabled:
    """Inside a trace, requires_grad bookkeeping is the derivation's job, not the tape's."""

    def __enter__(self):
        self.old = _GRAD_ENABLED[0]
        _GRAD_ENABLED[0] = False

    def __exit__(self, *exc):
        _GRAD_ENABLED[0] = self.old


def _realize_captures(outs, placeholders, start):
    """Tensors a traced function closes over become constants of its program (as in JAX):
    pending ones are computed now.  Pass a tensor as an argument if it changes or needs a gradient."""
    inputs = set(placeholders)
    leaves, _ = collect(outs, is_leaf=lambda v: v in inputs or v.value is not None or v.serial < start)
    pending = [v for v in leaves if v not in inputs and v.value is None and v.eqn is not None]
    if pending:
        from .tensor import _run, _settle
        for v, value in zip(pending, _run(pending)):
            _settle(v, value, keep_history=True)


# -- jit ----------------------------------------------------------------------------------------

class Jitted:
    """A function traced once per key into a Program and compiled once per variant."""

    def __init__(self, fn):
        if not callable(fn):
            raise ArgumentError(f"jit: expected a function, got {type(fn).__name__}")
        self.fn = fn
        self._entries = {}
        self.traces = self.compiles = self.derivations = self.hits = 0
        functools.update_wrapper(self, fn)

    def _lookup(self, args):
        leaves, in_tree = flatten(args)
        in_vars = [_leaf_var(x, self.__name__) for x in leaves]
        key = (in_tree, _signature(in_vars))
        entry = self._entries.get(key)
        if entry is None:
            program, out_tree = _trace(self.fn, in_tree, in_vars, self.__name__)
            entry = self._entries[key] = _Entry(program, out_tree)
            self.traces += 1
        else:
            self.hits += 1
        return entry, leaves, in_vars

    def __call__(self, *args):
        entry, leaves, in_vars = self._lookup(args)
        outs = _apply_program(self, entry, ("primal",), entry.program, in_vars,
                              any(isinstance(x, Tensor) and x.requires_grad for x in leaves))
        return unflatten(entry.out_tree, outs)

    def _derive(self, entry, name, make):
        """A derived program of ``entry``, made once per derivation ``name``."""
        prog = entry.derived.get(name)
        if prog is None:
            before = STATS.derivations
            prog = entry.derived[name] = make()
            self.derivations += max(1, STATS.derivations - before)
        return prog

    def cache_info(self) -> dict:
        """Traces, compiles, derived programs and hits of this function so far."""
        return {"traces": self.traces, "compiles": self.compiles,
                "derived": self.derivations, "hits": self.hits, "keys": len(self._entries)}

    def programs(self):
        """Every key's Program (what ``vkml.program`` shows)."""
        return [e.program for e in self._entries.values()]

    def derived_programs(self):
        """Every derived program, by name (``jvp``, ``known``, ``linear``, ``transposed``), per key."""
        return [dict(e.derived) for e in self._entries.values()]

    def __repr__(self):
        return f"<vkml.jit of {getattr(self.fn, '__qualname__', self.fn)!r}>"


_JITTED = weakref.WeakKeyDictionary()


def jit(fn=None):
    """Trace ``fn`` once per key into a Program; compile it once per variant; run it.

    Values never cause a retrace; a new shape, dtype, pytree structure or
    aliasing pattern does.  Tensors the function closes over are constants
    of its program: pass what changes (or needs a gradient) as an argument.
    ``jit`` of the same function object returns the same cached function.
    """
    if fn is None:
        return jit
    if isinstance(fn, Jitted):
        return fn
    try:
        jitted = _JITTED.get(fn)
    except TypeError:
        return Jitted(fn)
    if jitted is None:
        jitted = _JITTED[fn] = Jitted(fn)
    return jitted


def _apply_program(owner, entry, variant_tag, prog, in_vars, requires_grad):
    """Run ``prog`` on ``in_vars``: at once if all are concrete, else as one lazy ``call``."""
    concrete = all(v.value is not None for v in in_vars) and not requires_grad
    if concrete:
        backend = backends.current()
        variant = (backend.name, variant_tag, tuple(np.asarray(v.value).flags.c_contiguous
                                                    for v in in_vars))
        exe = entry.executables.get((prog, variant)) if entry is not None else None
        if exe is None:
            before = STATS.compiles
            exe = backend.executable(("jit", prog, variant), lambda: prog)
            owner.compiles += STATS.compiles - before
            if entry is not None:
                entry.executables[(prog, variant)] = exe
        values = _submit(backend, exe, [v.value for v in in_vars], prog.eqns)
        return [Tensor(Var(o.shape, o.dtype, o.device, value=val))
                for o, val in zip(prog.outputs, values)]
    outs = call(prog, *in_vars) if prog.eqns or prog.outputs else []
    grad = requires_grad and _GRAD_ENABLED[0]
    return [Tensor(o, grad and o.dtype.kind == "f") for o in outs]


# -- scan -----------------------------------------------------------------------------------------

def scan(step, init, xs, length=None, reverse=False):
    """``carry, ys = scan(step, init, xs)``: ``carry, y = step(carry, x)`` for each row x of xs.

    ONE construct in the program: ``step`` is traced once for all rows, and
    the derivative of the scan is again a scan.  ``init``/``xs``/results are
    pytrees; ``xs`` may be None with ``length`` given.  Tensors the step
    closes over become the scan's captures (they get gradients).
    """
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
    start = current_serial() - len(carry_ph) - len(x_ph)
    STATS.traces += 1
    with _grad_disabled():
        result = step(unflatten(init_tree, [Tensor(p) for p in carry_ph]),
                      unflatten(xs_tree, [Tensor(p) for p in x_ph]))
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
            raise ShapeError(f"scan: carry leaf {i} enters the step as {dtype_name(a.dtype)} "
                             f"{format_shape(a.shape)} and leaves it as {dtype_name(b.dtype)} "
                             f"{format_shape(b.shape)}; a carry must keep its shape and dtype "
                             "(cast or reshape it inside the step)")
    y_leaves, y_tree = flatten(y)
    y_vars = [_leaf_var(x, "scan y") for x in y_leaves]
    outs = c_vars + y_vars
    inputs = set(carry_ph + x_ph)
    leaves, _ = collect(outs, is_leaf=lambda v: v in inputs or v.serial < start)
    captures = [v for v in leaves if v not in inputs and v.serial < start]
    program = program_from_dag(captures + carry_ph + x_ph, outs)
    res = scan_bind(program, captures, init_vars, xs_vars, length, reverse)
    requires = _GRAD_ENABLED[0] and any(
        isinstance(x, Tensor) and x.requires_grad for x in init_leaves + xs_leaves) or \
        _GRAD_ENABLED[0] and _captures_need_grad(captures)
    tensors = [Tensor(v, requires and v.dtype.kind == "f") for v in res]
    from .tensor import _EAGER, _is_traced, realize
    if _EAGER[0] and tensors and not _is_traced(tensors[0].var):
        realize(tensors)
    return (unflatten(init_tree, tensors[:len(init_vars)]),
            unflatten(y_tree, tensors[len(init_vars):]))


def _captures_need_grad(captures):
    from .tensor import _GRAD_LEAVES
    if not captures:
        return False
    leaves, _ = collect(captures, is_leaf=lambda v: False)
    return any(v in _GRAD_LEAVES for v in leaves)


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


def _vjp_parts(jitted, entry, flags, n_out_ct):
    """jvp -> (known, linear) -> transposed, each derived once per derivation."""
    prog = entry.program
    name = tuple(flags)
    jp = jitted._derive(entry, ("jvp", name), lambda: derived("jvp", prog, flags,
                                                               lambda: jvp_program(prog, flags)))
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


def _float_check(v, where, i):
    if v.dtype.kind != "f":
        raise GradError(f"{where}: argument leaf {i} is {dtype_name(v.dtype)}; only floating "
                        "arguments can be differentiated (cast with .astype(np.float64))")


def _vjp_call(jitted, args, nums, where):
    """Run the known part; return (outputs, pullback over the linear part)."""
    entry, leaves, in_vars = jitted._lookup(args)
    flags = _wrt_flags(args, nums)
    for i, (v, f) in enumerate(zip(in_vars, flags)):
        if f:
            _float_check(v, where, i)
    prog = entry.program
    known, linear, transposed, out_u, n_res = _vjp_parts(jitted, entry, flags, len(prog.outputs))
    n_out = len(prog.outputs)
    rg = any(isinstance(x, Tensor) and x.requires_grad for x in leaves)
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
        ins = [r.var for r in residuals] + live
        need = rg or any(isinstance(c, Tensor) and c.requires_grad for c in cts)
        return _apply_program(jitted, entry, ("transposed",), transposed, ins, need)

    return entry, values, pullback, flags


def _grad_fn(fn, argnums, has_aux, with_value):
    jitted = jit(fn)
    where = "grad"

    def g(*args):
        nums = _argnums(argnums, len(args))
        entry, values, pullback, flags = _vjp_call(jitted, args, nums, where)
        outs = unflatten(entry.out_tree, values)
        main, aux = (outs[0], outs[1]) if has_aux else (outs, None)
        if has_aux and (not isinstance(outs, tuple) or len(outs) != 2):
            raise GradError("grad(has_aux=True): the function must return (value, aux)")
        if not isinstance(main, Tensor) or main.shape != () or main.dtype.kind != "f":
            shape = getattr(main, "shape", None)
            raise GradError(f"{where}: the function must return a floating scalar (0-d) value, "
                            f"got shape {format_shape(shape) if shape is not None else type(main).__name__}; "
                            "use vkml.vjp or vkml.jacrev for non-scalar outputs")
        cts = [np.ones((), dtype=values[0].dtype)] + [np.zeros(v.shape, v.dtype) for v in values[1:]]
        grads = pullback(cts)
        per_arg = _regroup(args, nums, grads)
        result = per_arg[0] if isinstance(argnums, int) else tuple(per_arg)
        if with_value:
            return ((main, aux), result) if has_aux else (main, result)
        return (result, aux) if has_aux else result

    g.__name__ = f"grad_of_{getattr(fn, '__name__', 'f')}"
    g.cache_info = jitted.cache_info
    g.jitted = jitted
    return g


def _regroup(args, nums, grads):
    """Cotangents of the flattened differentiated leaves, back in the arguments' pytree shapes."""
    it = iter(grads)
    out = []
    for i in nums:
        leaves, tree = flatten(args[i])
        out.append(unflatten(tree, [next(it) for _ in leaves]))
    return out


def grad(fn, argnums=0, has_aux=False):
    """The gradient of a scalar function: ``grad(f)(x)`` has x's structure.

    Its programs are derived once per key and derivation (see the module
    docstring); ``grad(grad(f))`` works for scalar functions.
    """
    return _grad_fn(fn, argnums, has_aux, with_value=False)


def value_and_grad(fn, argnums=0, has_aux=False):
    """Like ``grad`` but returns ``(f(x), grad)`` from the same run."""
    return _grad_fn(fn, argnums, has_aux, with_value=True)


def vjp(fn, *args):
    """``out, pullback = vjp(f, *args)``; ``pullback(ct)`` returns one cotangent per argument."""
    jitted = jit(fn)
    nums = tuple(range(len(args)))
    entry, values, pb, flags = _vjp_call(jitted, args, nums, "vjp")
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


def jvp(fn, primals, tangents):
    """``(f(primals), df(primals)[tangents])`` by forward mode, its program derived once."""
    jitted = jit(fn)
    primals, tangents = tuple(primals), tuple(tangents)
    p_leaves, p_tree = flatten(primals)
    t_leaves, t_tree = flatten(tangents)
    if p_tree != t_tree:
        raise ArgumentError(f"jvp: tangents {t_tree} must have the primals' structure {p_tree}")
    entry, leaves, in_vars = jitted._lookup(primals)
    t_vars = [_leaf_var(t, "tangent") for t in t_leaves]
    for i, (p, t) in enumerate(zip(in_vars, t_vars)):
        if p.shape != t.shape:
            raise ShapeError(f"jvp: tangent {i} has shape {format_shape(t.shape)}, its primal "
                             f"{format_shape(p.shape)}")
    flags = [v.dtype.kind == "f" for v in in_vars]
    prog = entry.program
    jp = jitted._derive(entry, ("jvp", tuple(flags)),
                        lambda: derived("jvp", prog, flags, lambda: jvp_program(prog, flags)))
    entry.derived.setdefault("jvp", jp)
    ins = in_vars + [api.cast(t, p.dtype) for t, p, f in zip(t_vars, in_vars, flags) if f]
    rg = any(isinstance(x, Tensor) and x.requires_grad for x in leaves + t_leaves)
    outs = _apply_program(jitted, entry, ("jvp",), jp, ins, rg)
    n = len(prog.outputs)
    return unflatten(entry.out_tree, outs[:n]), unflatten(entry.out_tree, outs[n:])


def linearize(fn, *primals):
    """``out, f_jvp = linearize(f, *primals)``: the known part runs now, ``f_jvp(*tangents)``
    runs only the part linear in the tangents (the residuals are kept)."""
    jitted = jit(fn)
    entry, leaves, in_vars = jitted._lookup(primals)
    flags = [v.dtype.kind == "f" for v in in_vars]
    known, linear, transposed, out_u, n_res = _vjp_parts(jitted, entry, flags, len(entry.program.outputs))
    rg = any(isinstance(x, Tensor) and x.requires_grad for x in leaves)
    known_out = _apply_program(jitted, entry, ("known",), known, in_vars, rg)
    n_out = len(entry.program.outputs)
    n_known = len(known.outputs) - n_res
    residuals = known_out[n_known:]
    out = unflatten(entry.out_tree, known_out[:n_out])
    live = out_u[n_out:]
    known_tangents = known_out[n_out:n_known]

    def f_jvp(*tangents):
        t_leaves, t_tree = flatten(tuple(tangents))
        if len(t_leaves) != len(in_vars):
            raise ArgumentError(f"linearize: expected {len(in_vars)} tangent leaves, got {len(t_leaves)}")
        t_vars = [api.cast(_leaf_var(t, "tangent"), p.dtype) for t, p in zip(t_leaves, in_vars)]
        ins = [r.var for r in residuals] + [t for t, f in zip(t_vars, flags) if f]
        res = _apply_program(jitted, entry, ("linear",), linear, ins, False)
        it_u, it_k = iter(res), iter(known_tangents)
        return unflatten(entry.out_tree, [next(it_u) if u else next(it_k) for u in live])

    return out, f_jvp


# -- programs as values -----------------------------------------------------------------------------

def program(fn, *args) -> Program:
    """The Program ``fn`` traces to for these arguments (``print`` it to read it)."""
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

    ``in_axes``: one int/None for all arguments or one per argument (None =
    not mapped).  The program for one example is traced once per key and
    its batched form derived once per batch size.
    """
    jitted = jit(fn)

    def batched(*args):
        axes = tuple(in_axes) if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
        if len(axes) != len(args):
            raise ArgumentError(f"vmap: in_axes has {len(axes)} entries for {len(args)} arguments")
        flags, example, in_vars, sizes = [], [], [], set()
        for a, ax in zip(args, axes):
            leaves, tree = flatten(a)
            ex = []
            for x in leaves:
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
        prog = entry.program
        bprog = jitted._derive(entry, ("vmap", tuple(flags), size), lambda: derived(
            "vmap", prog, flags + [size], lambda: vmap_program(prog, flags, size)))
        rg = any(isinstance(x, Tensor) and x.requires_grad for a in args for x in flatten(a)[0])
        outs = _apply_program(jitted, entry, ("vmap", size), bprog, in_vars, rg)
        if out_axes != 0:
            outs = [_wrap_like(o, _move_axis(o.var, 0, out_axes % o.ndim)) for o in outs]
        return unflatten(entry.out_tree, outs)

    return batched


def _wrap_like(t, var):
    return Tensor(var, t.requires_grad)


def _single_leaf(arg, where):
    leaves, _ = flatten(arg)
    if len(leaves) != 1:
        raise ArgumentError(f"{where}: the differentiated argument must be one array, "
                            f"got a pytree of {len(leaves)} leaves")


def jacfwd(fn, argnums=0):
    """The Jacobian by forward mode: the derivative program mapped over a basis of tangents.
    Shape: output shape + input shape."""
    jitted = jit(fn)

    def jac(*args):
        nums = _argnums(argnums, len(args))
        if len(nums) != 1:
            raise ArgumentError("jacfwd: give one argnum")
        _single_leaf(args[nums[0]], "jacfwd")
        entry, leaves, in_vars = jitted._lookup(args)
        flags = _wrt_flags(args, nums)
        i = flags.index(True)
        _float_check(in_vars[i], "jacfwd", i)
        prog = entry.program
        if len(prog.outputs) != 1:
            raise ArgumentError("jacfwd: the function must return one array")
        jp = jitted._derive(entry, ("jvp", tuple(flags)),
                            lambda: derived("jvp", prog, flags, lambda: jvp_program(prog, flags)))
        x = in_vars[i]
        n = x.size
        bflags = [False] * len(prog.inputs) + [True]
        bj = jitted._derive(entry, ("jacfwd", tuple(flags)), lambda: derived(
            "vmap", jp, bflags + [n], lambda: vmap_program(jp, bflags, n)))
        basis = api.constant(np.eye(n, dtype=x.dtype).reshape((n,) + x.shape))
        rg = any(isinstance(t, Tensor) and t.requires_grad for t in leaves)
        outs = _apply_program(jitted, entry, ("jacfwd",), bj, in_vars + [basis], rg)
        t = outs[1].var                                  # (n, *out)
        out_shape = t.shape[1:]
        m = int(np.prod(out_shape, dtype=np.int64))
        j = api.reshape(api.transpose(api.reshape(t, (n, m))), out_shape + x.shape)
        return Tensor(j, rg)

    return jac


def jacrev(fn, argnums=0):
    """The Jacobian by reverse mode: the transposed program mapped over a basis of cotangents.
    Shape: output shape + input shape."""
    jitted = jit(fn)

    def jac(*args):
        nums = _argnums(argnums, len(args))
        if len(nums) != 1:
            raise ArgumentError("jacrev: give one argnum")
        _single_leaf(args[nums[0]], "jacrev")
        entry, leaves, in_vars = jitted._lookup(args)
        flags = _wrt_flags(args, nums)
        i = flags.index(True)
        _float_check(in_vars[i], "jacrev", i)
        prog = entry.program
        if len(prog.outputs) != 1:
            raise ArgumentError("jacrev: the function must return one array")
        known, linear, transposed, out_u, n_res = _vjp_parts(jitted, entry, flags, 1)
        rg = any(isinstance(t, Tensor) and t.requires_grad for t in leaves)
        known_out = _apply_program(jitted, entry, ("known",), known, in_vars, rg)
        n_known = len(known.outputs) - n_res
        residuals = [r.var for r in known_out[n_known:]]
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
        return Tensor(api.reshape(res[0].var, out.shape + x.shape), rg)

    return jac


def hessian(fn, argnums=0):
    """Second derivatives of a scalar function: ``jacfwd(jacrev(f))``."""
    return jacfwd(jacrev(fn, argnums), argnums)


def hvp(fn, primals, tangents):
    """Hessian-vector product by forward-over-reverse: ``jvp(grad(f), primals, tangents)``."""
    return jvp(grad(fn), primals, tangents)[1]
