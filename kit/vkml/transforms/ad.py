"""Automatic differentiation as three interpreters over Programs.

Reverse mode is derived, not hand-written (as in JAX):

1. :func:`jvp_program` -- forward mode: every equation is replayed and its
   primitive's JVP rule emits the tangent equations beside it.
2. :func:`partial_eval` -- split that derivative into the part that reads no
   tangent (it runs at the call and returns the values the rest needs, the
   *residuals*) and the part that is linear in the tangents.
3. :func:`transpose_program` -- run the linear part backwards with each linear
   primitive's transpose rule: cotangents in, cotangents out.

``vjp_program`` = 1 + 2 + 3.  Cotangents that meet at one Var are added in a
fixed order (reverse program order), so a gradient is the same bits every
run.
"""

from __future__ import annotations

from ..errors import GradError
from ..ir import Program, Var, current_serial, program_from_dag
from ..stats import STATS
from ..threadsafe import Cache
from ..ops import Linear, api, rebind
from .interpret import inline


def _placeholder(v):
    return Var(v.shape, v.dtype, v.device)


def _as_list(outs, prim):
    return outs if prim.multiple_results else [outs]


def _origin(eqn, role=None):
    """``(primal equation, role)`` for what a transform makes from ``eqn`` (see ``Eqn.origin``)."""
    root, was = eqn.origin if eqn.origin is not None else (eqn, "primal")
    return root, role or was


def _tag(vars_, since, origin):
    """Mark the equations made since serial ``since`` under ``vars_`` as coming from ``origin``.

    Only new equations are walked (the walk stops at older Vars), so this costs what the
    transform itself made; it is what pictures use to match derived equations to the user's.
    """
    stack = [v for v in vars_ if isinstance(v, Var)]
    while stack:
        v = stack.pop()
        e = v.eqn
        if e is None or v.serial < since or e.origin is not None:
            continue
        e.origin = origin
        stack.extend(e.inputs)
        for p in e.params.values():          # a derived scan's step: what no rule tagged
            if isinstance(p, Program):
                _tag_nested(p, since, origin)


def _tag_nested(prog, since, origin):
    """Tag the equations of a nested program made since ``since`` (a user's step, or a step
    derived earlier and cached, is left as it is)."""
    for e in prog.eqns:
        if e.origin is None and e.outputs and e.outputs[0].serial >= since:
            e.origin = origin
        for p in e.params.values():
            if isinstance(p, Program):
                _tag_nested(p, since, origin)


def jvp_program(prog: Program, has_tangent) -> Program:
    """Forward-mode derivative of ``prog``.

    Inputs: ``prog``'s inputs, then one tangent per input flagged in
    ``has_tangent``.  Outputs: ``prog``'s outputs, then one tangent per output
    (zeros where an output does not depend on a tangent).
    """
    primals = [_placeholder(v) for v in prog.inputs]
    tangents = [_placeholder(v) for v, h in zip(prog.inputs, has_tangent) if h]
    env = dict(zip(prog.inputs, primals))
    tenv = {}
    it = iter(tangents)
    for v, h in zip(prog.inputs, has_tangent):
        if h:
            tenv[v] = next(it)
    for eqn in prog.eqns:
        since = current_serial()
        ins = [env.get(v, v) for v in eqn.inputs]
        outs = _as_list(rebind(eqn, ins), eqn.prim)
        _tag(outs, since, _origin(eqn))
        env.update(zip(eqn.outputs, outs))
        tins = [tenv.get(v) for v in eqn.inputs]
        if any(t is not None for t in tins):
            if eqn.prim.jvp is None:
                raise GradError(f"{eqn.prim.name} has no derivative (op {eqn.describe()}); "
                                "wrap it in vkml.stop_gradient if its value is all you need")
            touts = eqn.prim.jvp(ins, tins, outs, **eqn.params)
            _tag(touts, since, _origin(eqn, "tangent"))
            for o, t in zip(eqn.outputs, touts):
                if t is not None:
                    tenv[o] = t
    outs = [env.get(v, v) for v in prog.outputs]
    touts = [tenv.get(v) if tenv.get(v) is not None else api.zeros_like(o)
             for v, o in zip(prog.outputs, outs)]
    return program_from_dag(primals + tangents, outs + touts)


#: primitives cheap enough to recompute in the unknown part rather than keep as residuals
_RECOMPUTE = {"broadcast_in_dim", "reshape", "cast", "neg", "add", "sub", "mul", "div"}


def partial_eval(prog: Program, unknown_inputs, instantiate=None, invariant=None):
    """Split ``prog`` into the part that reads no unknown input and the rest.

    Returns ``(known, unknown, out_unknown)``: ``known`` maps the known
    inputs to the known outputs followed by the *residuals* (known values the
    unknown part reads); ``unknown`` maps residuals + unknown inputs to the
    unknown outputs; ``out_unknown[i]`` says which part gives output i.
    ``instantiate[i]`` forces output i into the unknown part even if known.
    Equations with mixed operands are split by their primitive's
    ``partial_eval`` rule when it has one (a scan splits its step), and go to
    the unknown part whole otherwise.

    A known value made by a few cheap ops from constants (or from inputs
    flagged ``invariant``: a scan step's constants) is recomputed in the
    unknown part instead of becoming a residual: in a loop a residual is
    stored once per row, and ``2.0 * t`` should not store ``2.0`` per row.
    """
    instantiate = instantiate or [False] * len(prog.outputs)
    kenv, uenv = {}, {}
    known_in, unknown_in = [], []
    for v, u in zip(prog.inputs, unknown_inputs):
        p = _placeholder(v)
        (unknown_in if u else known_in).append(p)
        (uenv if u else kenv)[v] = p
    residual_of, residual_sources = {}, []
    invariant_in = {kenv[v] for v, u, inv in zip(prog.inputs, unknown_inputs,
                                                  invariant or [False] * len(prog.inputs))
                    if inv and not u}
    made_from = {}                   # known Var -> the equation (in the known world) that made it
    recomputed = {}

    def cheap(kv, depth=0):
        if kv.value is not None and kv.eqn is None or kv in invariant_in:
            return True
        e = made_from.get(kv)
        return e is not None and depth < 6 and e.prim.name in _RECOMPUTE and \
            all(cheap(v, depth + 1) for v in e.inputs)

    def to_unknown(kv):
        """A known Var as the unknown part sees it: shared if a constant, recomputed if cheap
        from constants and invariant inputs, else a residual."""
        if kv.value is not None and kv.eqn is None:
            return kv
        if kv in recomputed:
            return recomputed[kv]
        if kv not in invariant_in and kv in made_from and cheap(kv):
            e = made_from[kv]
            outs = _as_list(rebind(e, [to_unknown(v) for v in e.inputs]), e.prim)
            recomputed.update(zip(e.outputs, outs))
            return recomputed[kv]
        r = residual_of.get(kv)
        if r is None:
            r = residual_of[kv] = _placeholder(kv)
            residual_sources.append(kv)
        return r

    for eqn in prog.eqns:
        since = current_serial()
        flags = [v in uenv for v in eqn.inputs]
        if not any(flags):
            outs = _as_list(rebind(eqn, [kenv.get(v, v) for v in eqn.inputs]), eqn.prim)
            kenv.update(zip(eqn.outputs, outs))
            e_known = outs[0].eqn
            for o in outs:
                made_from[o] = e_known
        elif eqn.prim.partial_eval is not None:
            args = [uenv[v] if f else kenv.get(v, v) for v, f in zip(eqn.inputs, flags)]
            kouts, uouts = eqn.prim.partial_eval(eqn, args, flags, to_unknown)
            for o, k, u in zip(eqn.outputs, kouts, uouts):
                if u is not None:
                    uenv[o] = u
                else:
                    kenv[o] = k
        else:
            ins = [uenv[v] if f else to_unknown(kenv.get(v, v)) for v, f in zip(eqn.inputs, flags)]
            outs = _as_list(rebind(eqn, ins), eqn.prim)
            uenv.update(zip(eqn.outputs, outs))
        _tag([kenv.get(o) for o in eqn.outputs] + [uenv.get(o) for o in eqn.outputs], since,
             _origin(eqn))
    out_unknown = [v in uenv or inst for v, inst in zip(prog.outputs, instantiate)]
    known_outs = [kenv.get(v, v) for v, u in zip(prog.outputs, out_unknown) if not u]
    unknown_outs = [uenv[v] if v in uenv else to_unknown(kenv.get(v, v))
                    for v, u in zip(prog.outputs, out_unknown) if u]
    known = program_from_dag(known_in, known_outs + residual_sources)
    unknown = program_from_dag([residual_of[s] for s in residual_sources] + unknown_in, unknown_outs)
    return known, unknown, out_unknown


def transpose_program(lin: Program, linear_inputs) -> Program:
    """Transpose a program linear in the inputs flagged ``linear_inputs``.

    The result takes the non-linear inputs, then one cotangent per output,
    and returns one cotangent per linear input.
    """
    consts_in = [_placeholder(v) for v, l in zip(lin.inputs, linear_inputs) if not l]
    cts_in = [_placeholder(v) for v in lin.outputs]
    env = {}
    it = iter(consts_in)
    linear = set()
    for v, l in zip(lin.inputs, linear_inputs):
        if l:
            linear.add(v)
        else:
            env[v] = next(it)
    # Forward: what does not depend on a linear input is computed as it is.
    lin_eqns = []
    for eqn in lin.eqns:
        if any(v in linear for v in eqn.inputs):
            lin_eqns.append(eqn)
            linear.update(eqn.outputs)
        else:
            since = current_serial()
            outs = _as_list(rebind(eqn, [env.get(v, v) for v in eqn.inputs]), eqn.prim)
            _tag(outs, since, _origin(eqn))
            env.update(zip(eqn.outputs, outs))
    # Backward: cotangents flow from the outputs to the linear inputs.
    ct = {}

    def accumulate(v, c):
        ct[v] = c if v not in ct else api.add(ct[v], c)

    for v, c in zip(lin.outputs, cts_in):
        if v in linear:
            accumulate(v, c)
    for eqn in reversed(lin_eqns):
        cts_out = [ct.pop(o, None) for o in eqn.outputs]
        if all(c is None for c in cts_out):
            continue
        if eqn.prim.transpose is None:
            raise GradError(f"{eqn.prim.name} is not linear in its tangent, so it cannot be "
                            f"transposed (op {eqn.describe()}); this is a bug in its JVP rule")
        cts_out = [api.zeros(o.shape, o.dtype, o.device) if c is None else c
                   for o, c in zip(eqn.outputs, cts_out)]
        since = current_serial()
        args = [Linear(v) if v in linear else env.get(v, v) for v in eqn.inputs]
        cts = eqn.prim.transpose(cts_out, *args, **eqn.params)
        for v, c in zip(eqn.inputs, cts):
            if c is not None and v in linear:
                accumulate(v, c)
        _tag(list(cts_out) + [ct[v] for v in eqn.inputs if v in ct], since,
             _origin(eqn, "cotangent"))
    outs = []
    for v, l in zip(lin.inputs, linear_inputs):
        if l:
            outs.append(ct[v] if v in ct else api.zeros(v.shape, v.dtype, v.device))
    return program_from_dag(consts_in + cts_in, outs)


def vjp_program(prog: Program, wrt, accumulate=None) -> Program:
    """One program computing ``prog``'s outputs and the cotangents of inputs ``wrt``.

    Inputs: ``prog``'s inputs, then one cotangent per output, then (for each
    ``wrt`` position flagged in ``accumulate``) a gradient to add to.
    Outputs: ``prog``'s outputs, then one gradient per ``wrt`` position.
    This is linearize + transpose fused into one submission: what
    ``Tensor.backward`` runs.
    """
    pairs = sorted(zip(wrt, accumulate or [False] * len(wrt)))
    wrt = [i for i, _ in pairs]
    accumulate = [a for _, a in pairs]
    has_tangent = [i in wrt for i in range(len(prog.inputs))]
    jvp = jvp_program(prog, has_tangent)
    n_in, n_out = len(prog.inputs), len(prog.outputs)
    known, linear, out_unknown = partial_eval(jvp, [False] * n_in + [True] * len(wrt))
    # The primal outputs never read a tangent; the tangent outputs may be known zeros.
    primals = [_placeholder(v) for v in prog.inputs]
    cts = [_placeholder(v) for v in prog.outputs]
    olds = [_placeholder(prog.inputs[i]) for i, a in zip(wrt, accumulate) if a]
    known_out = inline(known, primals)
    n_known = sum(1 for u in out_unknown if not u)
    by_output = known_out[:n_known]
    residuals = known_out[n_known:]
    values = by_output[:n_out]
    tangent_cts = [c for c, u in zip(cts, out_unknown[n_out:]) if u]
    transposed = transpose_program(linear, [False] * len(residuals) + [True] * len(wrt))
    grads = inline(transposed, residuals + tangent_cts) if tangent_cts else \
        [api.zeros(prog.inputs[i].shape, prog.inputs[i].dtype, prog.inputs[i].device) for i in wrt]
    it = iter(olds)
    grads = [api.add(next(it), g) if a else g for g, a in zip(grads, accumulate)]
    return program_from_dag(primals + cts + olds, values + grads)


#: bounded (vkml.set_cache_limit), shared by threads: one derivation is made once
_DERIVED = Cache("derived programs")


def derived(kind: str, prog: Program, flags, make):
    """The program derived from ``prog`` by ``kind`` with ``flags``, made once and cached.

    A derivation is keyed by what it is derived from (the program's structure),
    what kind it is (jvp, partial evaluation, transpose, vmap) and which inputs
    carry tangents or are linear -- so a second gradient of the same function
    derives nothing.
    """
    def counted():
        STATS.derivations += 1
        return make()

    return _DERIVED.get_or_make((kind, prog, tuple(flags)), counted)[0]
