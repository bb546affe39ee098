"""The smallest interpreter: replay a Program's equations onto new operands.

``inline(prog, args)`` is how one program is spliced into another being
built (a derived program's known part feeding its transposed part, a
backward pass appended to its forward).  Every other transformation is this
loop with a rule applied per equation.
"""

from __future__ import annotations

from ..errors import ShapeError
from ..ops import rebind


def inline(prog, args):
    """Emit ``prog``'s equations on Vars ``args``; return the Vars of its outputs."""
    if len(args) != len(prog.inputs):
        raise ShapeError(f"program takes {len(prog.inputs)} inputs, got {len(args)}")
    env = dict(zip(prog.inputs, args))
    for eqn in prog.eqns:
        outs = rebind(eqn, [env.get(v, v) for v in eqn.inputs])
        if not eqn.prim.multiple_results:
            outs = [outs]
        if eqn.origin is not None and outs:   # a derived equation stays matched to its primal
            outs[0].eqn.origin = eqn.origin
        env.update(zip(eqn.outputs, outs))
    return [env.get(v, v) for v in prog.outputs]
