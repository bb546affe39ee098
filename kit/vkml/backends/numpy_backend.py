"""The NumPy backend: the reference semantics, always present.

A Program is compiled into one generated Python function that calls each
primitive's NumPy implementation in order, with its parameters bound ahead
of time and each intermediate deleted after its last use.  Running a cached
program therefore costs one Python call per equation and nothing else: no
graph walk, no dispatch on primitive names.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter

import numpy as np

from ..ops.checks import collecting_warnings, holds_checks
from . import numpy_warnings
from .base import Backend, DeviceValue, ExecutionFailure, register


def _callable(eqn, compile_nested):
    lower = _LOWERINGS.get(eqn.prim.name)
    if lower is not None:
        return lower(compile_nested, **eqn.params)
    impl = eqn.prim.impl
    return functools.partial(impl, **eqn.params) if eqn.params else impl


def _lower_call(compile_nested, *, program):
    run = compile_nested(program)
    return lambda *args: run(list(args))


def _lower_scan(compile_nested, *, program, num_consts, num_carry, length, reverse):
    """A Python loop over the rows, calling the step's compiled function once per row."""
    run = compile_nested(program)
    nc, nk = num_consts, num_carry
    y_types = [(v.shape, v.dtype) for v in program.outputs[nk:]]
    rows = range(length - 1, -1, -1) if reverse else range(length)

    def scan(*args):
        consts, carry, xs = list(args[:nc]), list(args[nc:nc + nk]), args[nc + nk:]
        ys = [np.empty((length,) + shape, dtype) for shape, dtype in y_types]
        for i in rows:
            out = run(consts + carry + [x[i] for x in xs])
            carry = out[:nk]
            for y, v in zip(ys, out[nk:]):
                y[i] = v
        return carry + ys
    return scan


def _lower_cond(compile_nested, *, branches):
    runs = [compile_nested(b) for b in branches]
    last = len(runs) - 1

    def cond(index, *args):
        return runs[min(max(int(index), 0), last)](list(args))
    return cond


def _lower_while(compile_nested, *, cond, body, num_cond_consts, num_body_consts):
    test, step = compile_nested(cond), compile_nested(body)
    ncc, nbc = num_cond_consts, num_body_consts

    def loop(*args):
        cc, bc, carry = list(args[:ncc]), list(args[ncc:ncc + nbc]), list(args[ncc + nbc:])
        while bool(test(cc + carry)[0]):
            carry = step(bc + carry)
        return carry
    return loop


def _lower_program_call(compile_nested, *, program, **_):
    """custom_jvp/custom_vjp/checkpoint calls run their primal program."""
    return _lower_call(compile_nested, program=program)


_LOWERINGS = {"call": _lower_call, "scan": _lower_scan, "cond": _lower_cond, "while": _lower_while,
              "custom_jvp_call": _lower_program_call, "custom_vjp_call": _lower_program_call,
              "checkpoint": _lower_program_call}


# Elementwise primitives that are NumPy ufuncs: they can write into a dead operand's buffer.
_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
           "min": np.minimum, "neg": np.negative, "exp": np.exp, "log": np.log, "sin": np.sin,
           "cos": np.cos, "tanh": np.tanh, "sqrt": np.sqrt, "abs": np.absolute}
# Primitives whose result is a fresh array the program owns (never a view of another value).
_FRESH = FRESH = set(_UFUNCS) | {"div", "matmul", "reduce_sum", "reduce_max", "pad", "concatenate"}


def _matmul_swapped(a, b, out=None):
    """(a @ b).T computed as b.T @ a.T, so the result comes out contiguous, not a transposed view
    (into ``out`` when given: a caller's destination, BLAS writing it directly)."""
    return np.matmul(np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2), out=out)


def _is_last_two_swap(perm):
    n = len(perm)
    return n >= 2 and perm == tuple(range(n - 2)) + (n - 1, n - 2)


def _plan(program):
    """Per equation: (eqn index, callable kind, operands, output Vars, buffer to reuse).

    Two rewrites that matter for training steps on NumPy:
    - ``transpose(matmul(a, b))`` of the last two axes (a weight gradient of
      ``x @ W.T``) becomes ``b.T @ a.T``: a contiguous result, so the optimiser's
      elementwise ops on it do not run at strided speed (BLAS products only: a
      deterministic product keeps its own implementation);
    - an elementwise ufunc whose operand is a fresh temporary read only here
      writes its result into that operand's buffer (``out=``), as hand-written
      NumPy would, instead of allocating;
    - a ``broadcast_in_dim`` read only by n-ary elementwise ops becomes a
      reshape (or nothing): NumPy broadcasts there by itself, and a Python
      scalar then costs nothing where ``np.broadcast_to`` costs microseconds.
    """
    uses = {}
    for e in program.eqns:
        for v in e.inputs:
            uses[v] = uses.get(v, 0) + 1
    outputs = set(program.outputs)
    producer = {v: e for e in program.eqns for v in e.outputs}
    absorbed = set()
    swapped = {}
    for e in program.eqns:
        if e.prim.name == "transpose" and _is_last_two_swap(e.params["perm"]):
            m = producer.get(e.inputs[0])
            if m is not None and m.prim.name == "matmul" and not m.params and \
                    uses[e.inputs[0]] == 1 and e.inputs[0] not in outputs:
                absorbed.add(id(m))
                swapped[id(e)] = m.inputs
    consumers = {}
    for e in program.eqns:
        for v in e.inputs:
            consumers.setdefault(v, []).append(e)
    implicit = {}
    narrowed = {}            # broadcast outputs left to NumPy, and the shape they are read at
    for e in program.eqns:
        if e.prim.name == "broadcast_in_dim":
            b = e.outputs[0]
            expanded = [1] * len(b.shape)
            for i, d in enumerate(e.params["dims"]):
                expanded[d] = e.inputs[0].shape[i]
            trial = {**narrowed, b: tuple(expanded)}
            if b not in outputs and all(_broadcasts_natively(c, trial)
                                        for c in consumers.get(b, [])):
                implicit[id(e)] = tuple(expanded)
                narrowed[b] = tuple(expanded)
    plan = []
    for i, e in enumerate(program.eqns):
        if id(e) in absorbed:
            continue
        if id(e) in swapped:
            plan.append((i, "matmul_swapped", swapped[id(e)], e.outputs, None))
            continue
        if id(e) in implicit:
            x = e.inputs[0]
            kind = "alias" if implicit[id(e)] == x.shape else "reshape"
            plan.append((i, kind, e.inputs, e.outputs, implicit[id(e)]))
            continue
        reuse = None
        if e.prim.name in _UFUNCS:
            out = e.outputs[0]
            for v in e.inputs:
                p = producer.get(v)
                if p is not None and p.prim.name in _FRESH and id(p) not in absorbed and \
                        uses[v] == 1 and v not in outputs and v.shape == out.shape and \
                        v.dtype == out.dtype and out.shape != ():
                    reuse = v
                    break
        plan.append((i, "ufunc" if reuse is not None else "call", e.inputs, e.outputs, reuse))
    return plan


_NATIVE_BROADCAST = set(_UFUNCS) | {"div", "pow", "eq", "ne", "lt", "le", "gt", "ge", "where",
                                    "logical_and", "logical_or"}


def _broadcasts_natively(consumer, narrowed):
    """Whether ``consumer`` gives the same result when the operands in ``narrowed`` are read at
    their narrow shapes and NumPy broadcasts them."""
    if consumer.prim.name not in _NATIVE_BROADCAST or len(consumer.inputs) < 2:
        return False
    shapes = [narrowed.get(v, v.shape) for v in consumer.inputs]
    try:
        return np.broadcast_shapes(*shapes) == consumer.outputs[0].shape
    except ValueError:
        return False


def _views(program, nested) -> dict:
    """Per value of ``program``, the program arguments (by index) whose memory it may share: an
    argument its own, a fresh result (``FRESH``) none, a nested call's result what that call's
    executable says (``nested[id(eqn)].views``), anything else all of its operands' (a
    reshape, a broadcast, a transpose are views)."""
    views = {v: frozenset([k]) for k, v in enumerate(program.inputs)}
    for e in program.eqns:
        operands = [views.get(v, frozenset()) for v in e.inputs]
        every = frozenset().union(*operands)
        inner = getattr(nested.get(id(e)), "views", None)
        for j, o in enumerate(e.outputs):
            if e.prim.name in FRESH:
                views[o] = frozenset()
            elif inner is not None:
                views[o] = frozenset().union(*[operands[k] for k in inner[j]])
            else:
                views[o] = every
    return views


#: primitives whose NumPy run cannot stop with an error on operands of the program's shapes
#: (arithmetic, comparisons, selections, views, products, sums; NumPy's default error handling)
_CANNOT_FAIL = set(_UFUNCS) | {"div", "cast", "where", "eq", "ne", "lt", "le", "gt", "ge",
                               "logical_and", "logical_or", "logical_not", "stop_gradient",
                               "broadcast_in_dim", "reshape", "transpose", "slice", "flip",
                               "pad", "concatenate", "matmul", "reduce_sum"}


def _may_fail(eqn, nested) -> bool:
    """Whether equation ``eqn`` may stop the run with an error (a nested call: if its
    executable says so)."""
    if id(eqn) in nested:
        return getattr(nested[id(eqn)], "may_fail", True)
    return eqn.prim.name not in _CANNOT_FAIL


def _overwritable(program, plan, views, nested) -> dict:
    """Per result ``j``, the arguments ``k`` the run may compute it in (``Backend.run``'s
    ``into[j]`` may be ``args[k]``): the result is made by an elementwise ufunc (NumPy copies an
    operand that overlaps ``out`` where it must) or by a nested call that allows it for that
    argument, and nothing reads the argument, or a view of it, after that line -- no later
    equation and no other result -- nor may stop the run with an error (a failed run leaves
    the caller's arrays as they were)."""
    line_of = {i: n for n, (i, *_rest) in enumerate(plan)}
    producer = {o: i for i, e in enumerate(program.eqns) for o in e.outputs}
    last_read = {}
    for n, (_, _, ins, _, _) in enumerate(plan):
        for v in ins:
            for k in views.get(v, ()):
                last_read[k] = n
    # per argument, the results that may be views of it; per value, how often it is a result
    held = Counter(k for v in program.outputs for k in views.get(v, ()))
    times = Counter(program.outputs)
    last_failing = max((n for n, (i, *_rest) in enumerate(plan)
                        if _may_fail(program.eqns[i], nested)), default=-1)
    found = {}
    for j, v in enumerate(program.outputs):
        n = line_of.get(producer.get(v))
        if n is None or v.shape == () or times[v] > 1 or last_failing > n:
            continue
        e = program.eqns[producer[v]]
        if e.prim.name in _UFUNCS:
            allowed = range(len(program.inputs))
        elif id(e) in nested:
            inner = getattr(nested[id(e)], "overwritable", {}).get(e.outputs.index(v), ())
            allowed = [k for k, a in enumerate(program.inputs)
                       if any(e.inputs[q] is a for q in inner) and
                       all(q in inner and e.inputs[q] is a
                           for q, w in enumerate(e.inputs) if k in views.get(w, ()))]
        else:
            continue
        mine = views.get(v, frozenset())
        ks = frozenset(k for k in allowed
                       if (program.inputs[k].shape, program.inputs[k].dtype) == (v.shape, v.dtype)
                       and last_read.get(k, -1) <= n and held.get(k, 0) == (k in mine))
        if ks:
            found[j] = ks
    return found


def compile_program(program, compile_nested=None):
    """Generate, compile and return ``run(args) -> list of arrays`` for ``program``.

    ``compile_nested(program)`` compiles the programs that scan and call
    equations hold (the backend passes its cached compile).  The run says, per
    result, the arguments it may be a view of (``views``) and those a caller may
    hand as the result's destination (``overwritable``, see ``_overwritable``);
    a nested call computes the results that are the program's own straight into
    their destinations.
    """
    compile_nested = compile_nested or compile_program
    names = {}
    for i, v in enumerate(program.inputs):
        names[v] = f"a{i}"
    namespace = {"_asarray": np.asarray, "_matmul_swapped": _matmul_swapped}
    for i, (v, value) in enumerate(program.consts):
        names[v] = f"c{i}"
        # a constant captured from a GPU tensor is brought to the host once, here
        namespace[f"c{i}"] = np.asarray(value) if isinstance(value, DeviceValue) else value
    plan = _plan(program)
    # the executables of nested calls, which may compute results straight into ``into``
    nested = {id(e): compile_nested(e.params["program"]) for e in program.eqns
              if e.prim.name == "call"}
    views = _views(program, nested)
    last_use = {}
    for k, (_, _, ins, _, _) in enumerate(plan):
        for v in ins:
            last_use[v] = k
    outputs = set(program.outputs)
    # outputs an elementwise ufunc produces can be computed straight into a caller's destination
    # (Backend.run's ``into``); an output listed twice cannot (both would be the one array)
    direct = {v: j for j, v in enumerate(program.outputs)
              if program.outputs.count(v) == 1 and v.shape != ()}
    tmp = itertools.count()
    written = set()          # results computed straight into a destination given for them
    lines, line_eqn = [], []
    for k, (i, kind, ins, outs_v, reuse) in enumerate(plan):
        eqn = program.eqns[i]
        fn = f"f{i}"
        if kind == "alias":
            outs_name = names[outs_v[0]] = f"v{next(tmp)}"
            lines.append(f"    {outs_name} = {names[ins[0]]}")
            line_eqn.append(i)
            continue
        if kind == "reshape":
            fn = f"f{i}"
            namespace[fn] = lambda x, shape=reuse: np.reshape(x, shape)
            reuse = None
        elif kind == "matmul_swapped":
            fn = "_matmul_swapped"
        elif kind == "ufunc":
            namespace[fn] = _UFUNCS[eqn.prim.name]
        else:
            namespace[fn] = _callable(eqn, compile_nested)
        args = ", ".join(names[v] for v in ins)
        plain = args
        if reuse is not None:
            args += f", out={names[reuse]}"
        outs = []
        for v in outs_v:
            names[v] = f"v{next(tmp)}"
            outs.append(names[v])
        target = ", ".join(outs) + ("," if eqn.prim.multiple_results and len(outs) == 1 else "")
        dead = sorted({names[v] for v in ins
                       if last_use.get(v) == k and v not in outputs and names[v][0] == "v"})
        call = f"{fn}({args})"
        into_call = [direct.get(v) for v in outs_v]
        if id(eqn) in nested and any(d is not None for d in into_call):
            # a nested call computes its results that are ours straight into their destinations
            namespace[f"n{i}"] = nested[id(eqn)]
            dests = ", ".join("None" if d is None else f"into[{d}]" for d in into_call)
            call = f"(n{i}([{plain}], [{dests}]) if into is not None else {call})"
            inner = getattr(nested[id(eqn)], "writes_directly", frozenset())
            written.update(d for q, d in enumerate(into_call) if d is not None and q in inner)
        if kind == "matmul_swapped" and outs_v[0] in direct:     # (a weight's gradient)
            j = direct[outs_v[0]]
            written.add(j)
            call = f"({fn}({plain}, into[{j}]) if into is not None and into[{j}] is not None " \
                   f"else {call})"
        if kind in ("ufunc", "call") and eqn.prim.name in _UFUNCS and outs_v[0] in direct:
            namespace[f"u{i}"] = _UFUNCS[eqn.prim.name]
            j = direct[outs_v[0]]
            written.add(j)
            call = f"(u{i}({plain}, out=into[{j}]) if into is not None and into[{j}] is not None " \
                   f"else {call})"
        lines.append(f"    {target} = {call}" + (f"; del {', '.join(dead)}" if dead else ""))
        line_eqn.append(i)
    # one function, no wrapper: it fits ``into`` to the results (a destination of another shape
    # or dtype is not written directly) and maps an error to its equation (``_failure``)
    header = ["def run(args, into=None):",
              "    if into is not None:",
              "        into = [d if d is not None and (d.shape, d.dtype) == aval else None "
              "for d, aval in zip(into, _avals)]",
              "    try:",
              f"        {', '.join(names[v] for v in program.inputs)}"
              f"{',' if program.inputs else ''} = args" if program.inputs else "        pass"]
    body = ["    " + line for line in lines]
    # a NumPy ufunc's result of at least one axis is an array already; others may be scalars
    arrays = {v for i, kind, _, outs_v, _ in plan if kind in ("ufunc", "call") and
              _UFUNCS.get(program.eqns[i].prim.name) is program.eqns[i].prim.impl and
              not program.eqns[i].params for v in outs_v if v.shape}
    ret = "        return [" + ", ".join(names[v] if v in arrays else f"_asarray({names[v]})"
                                     for v in program.outputs) + "]"
    handler = ["    except Exception as error:", "        raise _failure(error) from error"]
    if numpy_warnings.can_warn(program):     # NumPy's warnings said at the user's line
        header.insert(-2, "    _state = _warn_enter()")
        handler += ["    finally:", "        _warn_leave(_state)"]
        namespace.update(_warn_enter=numpy_warnings.enter, _warn_leave=numpy_warnings.leave)
    source = "\n".join(header + body + [ret] + handler) + "\n"
    first_line = len(header) + 1
    namespace["_avals"] = [(v.shape, v.dtype) for v in program.outputs]
    namespace["_failure"] = functools.partial(_failure, first_line, line_eqn)
    namespace["_equation_at"] = functools.partial(_equation_at, program.eqns, first_line, line_eqn)
    # one file name for all: CPython keeps every distinct code file name for good
    exec(compile(source, numpy_warnings.PROGRAM_FILE, "exec"), namespace)
    run = namespace["run"]

    run.source = source
    run.writes_into = True
    run.views = [views.get(v, frozenset()) for v in program.outputs]
    run.writes_directly = frozenset(written)
    warns = holds_checks(program, "warn")     # issued after the run: a filter may make them errors
    run.may_fail = warns or any(_may_fail(e, nested) for e in program.eqns)
    run.overwritable = {} if warns else _overwritable(program, plan, views, nested)
    if warns:
        run = _collecting(run)
    return run


def _failure(first_line, line_eqn, error):
    """The ExecutionFailure of ``error``, raised at a line of a generated run (its traceback's
    first frame: the run caught it): the equation of that line, or the first one."""
    line = error.__traceback__.tb_lineno - first_line
    return ExecutionFailure(line_eqn[line] if 0 <= line < len(line_eqn) else 0, error)


def _equation_at(eqns, first_line, line_eqn, lineno):
    """The equation of line ``lineno`` of a generated run (None off its body)."""
    line = lineno - first_line
    return eqns[line_eqn[line]] if 0 <= line < len(line_eqn) else None


def _collecting(run):
    """``run`` issuing the warnings of its checks once per run (a scan's steps, several checked
    results and nested programs share one), after the run -- only for programs holding checks."""
    def checked_run(args, into=None):
        with collecting_warnings():
            return run(args, into)

    checked_run.source = run.source
    checked_run.writes_into = True
    checked_run.views, checked_run.overwritable = run.views, run.overwritable
    checked_run.may_fail, checked_run.writes_directly = run.may_fail, run.writes_directly
    return checked_run


class NumpyBackend(Backend):
    name = "numpy"
    device = "CPU"

    def _compile(self, program):
        return compile_program(program, self._compile_nested)

    def _compile_nested(self, program):
        return self.executable(("nested", program), lambda: program)

    def info(self):
        info = super().info()
        info["numpy"] = np.__version__
        return info


register("numpy", NumpyBackend)
