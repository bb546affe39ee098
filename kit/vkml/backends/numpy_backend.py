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
import sys

import numpy as np

from .base import Backend, ExecutionFailure, register

_COUNTER = itertools.count()


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


def compile_program(program, compile_nested=None):
    """Generate, compile and return ``run(args) -> list of arrays`` for ``program``.

    ``compile_nested(program)`` compiles the programs that scan and call
    equations hold (the backend passes its cached compile).
    """
    compile_nested = compile_nested or compile_program
    names = {}
    for i, v in enumerate(program.inputs):
        names[v] = f"a{i}"
    namespace = {"_asarray": np.asarray}
    lines = []
    for i, (v, value) in enumerate(program.consts):
        names[v] = f"c{i}"
        namespace[f"c{i}"] = value
    last_use = {}
    for i, eqn in enumerate(program.eqns):
        for v in eqn.inputs:
            last_use[v] = i
    outputs = set(program.outputs)
    tmp = itertools.count()
    for i, eqn in enumerate(program.eqns):
        fn = f"f{i}"
        namespace[fn] = _callable(eqn, compile_nested)
        outs = []
        for v in eqn.outputs:
            names[v] = f"v{next(tmp)}"
            outs.append(names[v])
        target = ", ".join(outs) + ("," if eqn.prim.multiple_results and len(outs) == 1 else "")
        args = ", ".join(names[v] for v in eqn.inputs)
        dead = sorted({names[v] for v in eqn.inputs
                       if last_use.get(v) == i and v not in outputs and names[v][0] == "v"})
        lines.append(f"    {target} = {fn}({args})" + (f"; del {', '.join(dead)}" if dead else ""))
    header = [f"def _run(args):", f"    {', '.join(names[v] for v in program.inputs)}{',' if program.inputs else ''} = args"
              if program.inputs else "    pass"]
    ret = "    return [" + ", ".join(f"_asarray({names[v]})" for v in program.outputs) + "]"
    source = "\n".join(header + lines + [ret]) + "\n"
    filename = f"<vkml program {next(_COUNTER)}>"
    exec(compile(source, filename, "exec"), namespace)
    fn = namespace["_run"]
    first_line = len(header) + 1

    def run(args):
        try:
            return fn(args)
        except Exception as error:  # find which equation raised
            tb = sys.exc_info()[2]
            while tb is not None and tb.tb_frame.f_code.co_filename != filename:
                tb = tb.tb_next
            if tb is None:
                raise
            raise ExecutionFailure(tb.tb_lineno - first_line, error) from error

    run.source = source
    return run


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
