"""vmap: a program for one example turned into a program for a batch.

The interpreter walks the program; each primitive's ``batch`` rule gets its
operands with a batch dimension at axis 0 (``bdim == 0``) or none
(``bdim is None``) and returns its results the same way.  Per-sample kernels
of the graph layer are written for one sample and batched with this.
"""

from __future__ import annotations

from ..errors import ShapeError
from ..ir import Program, Var, program_from_dag
from ..ops import api, rebind


def _as_list(outs, prim):
    return outs if prim.multiple_results else [outs]


def vmap_program(prog: Program, batched, size: int) -> Program:
    """``prog`` mapped over a leading axis of ``size`` on the inputs flagged in ``batched``.

    Every output of the result is batched at axis 0.  The result records
    where it came from as ``vmap_of = (prog, batched, size)``: rows of a
    vmapped program never interact, which a code generator may use (the CUDA
    renderer runs a vmapped scan as one thread per sample).
    """
    ins = [Var((size,) + v.shape if b else v.shape, v.dtype, v.device, weak=v.weak)
           for v, b in zip(prog.inputs, batched)]
    env = {v: (x, 0 if b else None) for v, x, b in zip(prog.inputs, ins, batched)}
    for eqn in prog.eqns:
        args = [env.get(v, (v, None)) for v in eqn.inputs]
        vals = [a for a, _ in args]
        dims = [d for _, d in args]
        if all(d is None for d in dims):
            outs = _as_list(rebind(eqn, vals), eqn.prim)
            out_dims = [None] * len(outs)
        else:
            if eqn.prim.batch is None:
                raise ShapeError(f"vmap: {eqn.prim.name} has no batching rule (op {eqn.describe()})")
            outs, out_dims = eqn.prim.batch(vals, dims, size, **eqn.params)
        for o, x, d in zip(eqn.outputs, outs, out_dims):
            env[o] = (x, d)
    results = []
    for v in prog.outputs:
        x, d = env.get(v, (v, None))
        results.append(x if d == 0 else api.broadcast_batch(x, size))
    batched_prog = program_from_dag(ins, results)
    batched_prog.vmap_of = (prog, tuple(bool(b) for b in batched), size)
    return batched_prog
