"""Primitives that hold programs: ``scan`` (a loop) and ``call`` (a compiled function).

They live here, above ``ops``, because their rules are transformations of
the programs they hold: the derivative of a scan is a scan of its step's
derivative, its transpose is a scan that runs the step's transpose from the
last row to the first, and partial evaluation splits the step so the forward
loop keeps per row only what the linear part reads.  Every derived step is
cached (``ad.derived``), so a second gradient derives nothing.

Calling convention of ``scan``: operands are ``consts + init + xs``; the step
program maps ``consts + carry + x`` to ``carry + y``; results are the final
carry followed by the ys stacked along a new leading axis of ``length`` rows.
"""

from __future__ import annotations

from ..errors import GradError, ShapeError
from ..ir import Program, Var, dtype_name, format_shape, program_from_dag
from ..ops import Linear, Primitive, api, bind
from .ad import derived, jvp_program, partial_eval, transpose_program
from .interpret import inline
from .vmap import vmap_program


def _placeholder(v):
    return Var(v.shape, v.dtype, v.device)


def depends(prog: Program, flags):
    """Which outputs of ``prog`` depend on the inputs flagged (floating values only)."""
    dep = {v for v, f in zip(prog.inputs, flags) if f}
    for e in prog.eqns:
        if any(v in dep for v in e.inputs):
            dep.update(o for o in e.outputs if o.dtype.kind in "fc")
    return [v in dep for v in prog.outputs]


def reorder_inputs(prog: Program, order) -> Program:
    """The same program taking its inputs in another order (``order[i]`` = old position)."""
    return Program([prog.inputs[i] for i in order], prog.eqns, prog.outputs, prog.consts)


def select_outputs(prog: Program, picks) -> Program:
    return Program(prog.inputs, prog.eqns, [prog.outputs[i] for i in picks], prog.consts)


# -- scan ------------------------------------------------------------------------------------

scan_p = Primitive("scan", multiple_results=True,
                   doc="A loop over the rows of xs whose step is one program, traced once.")


def _scan_abstract(*args, program, num_consts, num_carry, length, reverse):
    n_in = len(program.inputs)
    if len(args) != n_in:
        raise ShapeError(f"scan: the step takes {n_in} operands, got {len(args)}")
    for i, (a, p) in enumerate(zip(args, program.inputs)):
        want = p.shape if i < num_consts + num_carry else (length,) + p.shape
        if a.shape != want or a.dtype != p.dtype:
            raise ShapeError(f"scan: operand {i} is {dtype_name(a.dtype)} {format_shape(a.shape)}, "
                             f"the step expects {dtype_name(p.dtype)} {format_shape(want)}")
    outs = program.outputs
    return [(v.shape, v.dtype) for v in outs[:num_carry]] + \
        [((length,) + v.shape, v.dtype) for v in outs[num_carry:]]


scan_p.abstract = _scan_abstract


def scan_bind(program, consts, init, xs, length, reverse):
    return bind(scan_p, *consts, *init, *xs, program=program, num_consts=len(consts),
                num_carry=len(init), length=length, reverse=reverse)


def _scan_jvp(primals, tangents, outs, *, program, num_consts, num_carry, length, reverse):
    nc, nk = num_consts, num_carry
    has = [t is not None for t in tangents]
    floats = [v.dtype.kind in "fc" for v in program.inputs]
    carry_t = has[nc:nc + nk]
    while True:  # a carry has a tangent if its init has one or the step gives it one
        flags = has[:nc] + carry_t + has[nc + nk:]
        out_dep = depends(program, flags)
        new = [(a or b) and f for a, b, f in zip(carry_t, out_dep[:nk], floats[nc:nc + nk])]
        if new == carry_t:
            break
        carry_t = new
    flags = has[:nc] + carry_t + has[nc + nk:]
    y_t = out_dep[nk:]
    step = derived("scan-jvp", program, flags, lambda: _jvp_step(program, flags, nc, nk, carry_t, y_t))
    consts, init, xs = primals[:nc], primals[nc:nc + nk], primals[nc + nk:]
    tconsts = [t for t, f in zip(tangents[:nc], has[:nc]) if f]
    tinit = [tangents[nc + i] if tangents[nc + i] is not None else api.zeros_like(init[i])
             for i in range(nk) if carry_t[i]]
    txs = [t for t, f in zip(tangents[nc + nk:], has[nc + nk:]) if f]
    res = scan_bind(step, consts + tconsts, init + tinit, xs + txs, length, reverse)
    n_tc = sum(carry_t)
    ny = len(program.outputs) - nk
    tcarry = iter(res[nk:nk + n_tc])
    tys = iter(res[nk + n_tc + ny:])
    return [next(tcarry) if f else None for f in carry_t] + [next(tys) if f else None for f in y_t]


def _jvp_step(program, flags, nc, nk, carry_t, y_t):
    """The scan step of the derivative: (consts, tconsts), (carry, tcarry), (x, tx) in that order."""
    jp = jvp_program(program, flags)
    n = len(program.inputs)
    prim = list(range(n))
    tan_pos = {}
    for i, f in enumerate(flags):
        if f:
            tan_pos[i] = n + len(tan_pos)
    groups = [range(0, nc), range(nc, nc + nk), range(nc + nk, n)]
    order = []
    for g in groups:
        order += [prim[i] for i in g] + [tan_pos[i] for i in g if i in tan_pos]
    jp = reorder_inputs(jp, order)
    n_out = len(program.outputs)
    picks = list(range(nk)) + [n_out + i for i in range(nk) if carry_t[i]] + \
        list(range(nk, n_out)) + [n_out + nk + i for i, f in enumerate(y_t) if f]
    return select_outputs(jp, picks)


scan_p.jvp = _scan_jvp


def _scan_partial_eval(eqn, args, unknown, to_unknown):
    p = eqn.params
    program, nc, nk = p["program"], p["num_consts"], p["num_carry"]
    n = len(program.inputs)
    carry_u = unknown[nc:nc + nk]
    while True:
        flags = unknown[:nc] + carry_u + unknown[nc + nk:]
        out_dep = depends_on(program, flags)
        new = [a or b for a, b in zip(carry_u, out_dep[:nk])]
        if new == carry_u:
            break
        carry_u = new
    flags = unknown[:nc] + carry_u + unknown[nc + nk:]
    inst = carry_u + [False] * (len(program.outputs) - nk)
    invariant = [True] * nc + [False] * (n - nc)        # a step's consts do not change per row
    known, unk, out_u = derived("scan-pe", program, flags + inst,
                                lambda: partial_eval(program, flags, inst, invariant))
    # Residuals are known_step outputs after the known ones; classify each by origin.
    n_known_out = sum(1 for u in out_u if not u)
    residuals = known.outputs[n_known_out:]
    known_inputs = [i for i in range(n) if not flags[i]]
    origin = {known.inputs[j]: known_inputs[j] for j in range(len(known_inputs))}
    res_const, res_x, res_stacked = [], [], []
    for r_idx, r in enumerate(residuals):
        i = origin.get(r)
        if i is not None and i < nc:
            res_const.append((r_idx, i))
        elif i is not None and i >= nc + nk:
            res_x.append((r_idx, i))
        else:
            res_stacked.append(r_idx)
    # The known scan: known consts, carries and xs; ys gain the stacked residuals.
    k_carry = [i for i in range(nk) if not out_u[i]]
    k_ys = [i for i in range(nk, len(program.outputs)) if not out_u[i]]
    kouts_pos = {i: j for j, i in enumerate([i for i, u in enumerate(out_u) if not u])}
    known_step = select_outputs(known, [kouts_pos[i] for i in k_carry] + [kouts_pos[i] for i in k_ys] +
                                [n_known_out + r for r in res_stacked])
    kargs = [a for a, f in zip(args, flags) if not f]
    knc = sum(1 for i in range(nc) if not flags[i])
    knk = sum(1 for i in range(nc, nc + nk) if not flags[i])
    kres = scan_bind(known_step, kargs[:knc], kargs[knc:knc + knk], kargs[knc + knk:],
                     p["length"], p["reverse"]) if known_step.outputs else []
    k_carry_out = kres[:len(k_carry)]
    k_ys_out = kres[len(k_carry):len(k_carry) + len(k_ys)]
    stacked = kres[len(k_carry) + len(k_ys):]
    # The unknown scan: inputs reordered to consts / carry / xs.
    n_res = len(residuals)
    unk_pos = [i for i in range(n) if flags[i]]          # unknown step inputs, original order
    pos_of = {i: n_res + j for j, i in enumerate(unk_pos)}
    u_consts = [r for r, _ in res_const] + [pos_of[i] for i in unk_pos if i < nc]
    u_carry = [pos_of[i] for i in unk_pos if nc <= i < nc + nk]
    u_xs = res_stacked + [r for r, _ in res_x] + [pos_of[i] for i in unk_pos if i >= nc + nk]
    unknown_step = reorder_inputs(unk, u_consts + u_carry + u_xs)
    uargs_consts = [to_unknown(args[i]) for _, i in res_const] + \
        [args[i] for i in unk_pos if i < nc]
    uargs_carry = [args[i] if unknown[i] else to_unknown(args[i]) for i in unk_pos if nc <= i < nc + nk]
    uargs_xs = [to_unknown(s) for s in stacked] + [to_unknown(args[i]) for _, i in res_x] + \
        [args[i] for i in unk_pos if i >= nc + nk]
    ures = scan_bind(unknown_step, uargs_consts, uargs_carry, uargs_xs, p["length"], p["reverse"])
    n_uc = sum(carry_u)
    kouts, uouts = [], []
    kc, ky = iter(k_carry_out), iter(k_ys_out)
    uc, uy = iter(ures[:n_uc]), iter(ures[n_uc:])
    for i in range(len(program.outputs)):
        if out_u[i]:
            kouts.append(None)
            uouts.append(next(uc) if i < nk else next(uy))
        else:
            kouts.append(next(kc) if i < nk else next(ky))
            uouts.append(None)
    return kouts, uouts


def depends_on(prog, flags):
    """Which outputs of ``prog`` depend on an input flagged in ``flags`` (unknown in partial
    evaluation, batched under vmap)."""
    dep = {v for v, f in zip(prog.inputs, flags) if f}
    for e in prog.eqns:
        if any(v in dep for v in e.inputs):
            dep.update(e.outputs)
    return [v in dep for v in prog.outputs]


scan_p.partial_eval = _scan_partial_eval


def _scan_transpose(cts, *args, program, num_consts, num_carry, length, reverse):
    nc, nk = num_consts, num_carry
    given = [isinstance(a, Linear) for a in args]
    # Every carry is transposed as linear: an init that is not (the zero tangent
    # of a constant init) only adds a constant, and its cotangent is dropped.
    lin = given[:nc] + [True] * nk + given[nc + nk:]
    step_t = derived("scan-transpose", program, lin, lambda: _transpose_step(program, lin, nc, nk))
    res_consts = [a for a, l in zip(args[:nc], lin[:nc]) if not l]
    res_xs = [a for a, l in zip(args[nc + nk:], lin[nc + nk:]) if not l]
    lin_consts = [a for a, l in zip(args[:nc], lin[:nc]) if l]
    acc0 = [api.zeros(a.shape, a.dtype, a.device) for a in lin_consts]
    ct_carry, ct_ys = list(cts[:nk]), list(cts[nk:])
    out = scan_bind(step_t, res_consts, acc0 + ct_carry, res_xs + ct_ys, length, not reverse)
    ct_lin_consts = iter(out[:len(acc0)])
    ct_init = iter(out[len(acc0):len(acc0) + nk])
    ct_lin_xs = iter(out[len(acc0) + nk:])
    result = []
    for i, l in enumerate(lin):
        if not l:
            result.append(None)
        elif i < nc:
            result.append(next(ct_lin_consts))
        elif i < nc + nk:
            ct = next(ct_init)
            result.append(ct if given[i] else None)
        else:
            result.append(next(ct_lin_xs))
    return result


def _transpose_step(program, lin, nc, nk):
    """Step of the transposed loop: consts = residual consts; carry = (const cts so far, carry ct);
    xs = (residual xs, ys' cts); it adds this row's const cts in and emits the xs' cts."""
    tp = transpose_program(program, lin)
    res_c = [_placeholder(v) for v, l in zip(program.inputs[:nc], lin[:nc]) if not l]
    acc = [_placeholder(v) for v, l in zip(program.inputs[:nc], lin[:nc]) if l]
    ct_c = [_placeholder(v) for v in program.outputs[:nk]]
    res_x = [_placeholder(v) for v, l in zip(program.inputs[nc + nk:], lin[nc + nk:]) if not l]
    ct_y = [_placeholder(v) for v in program.outputs[nk:]]
    outs = inline(tp, res_c + res_x + ct_c + ct_y)
    n_lc = len(acc)
    ct_consts, ct_carry_in, ct_xs = outs[:n_lc], outs[n_lc:n_lc + nk], outs[n_lc + nk:]
    new_acc = [api.add(a, c) for a, c in zip(acc, ct_consts)]
    return program_from_dag(res_c + acc + ct_c + res_x + ct_y, new_acc + ct_carry_in + ct_xs)


scan_p.transpose = _scan_transpose


# -- call ---------------------------------------------------------------------------------------

call_p = Primitive("call", multiple_results=True,
                   doc="Run a whole program as one equation: a jitted function inside a larger graph.")


def _call_abstract(*args, program):
    if len(args) != len(program.inputs):
        raise ShapeError(f"call: the program takes {len(program.inputs)} operands, got {len(args)}")
    for i, (a, p) in enumerate(zip(args, program.inputs)):
        if a.shape != p.shape or a.dtype != p.dtype:
            raise ShapeError(f"call: operand {i} is {a.type_str()}, the program expects {p.type_str()}")
    return [(v.shape, v.dtype) for v in program.outputs]


def _program_jvp(prim, primals, tangents, program):
    """The JVP of a primitive that runs one ``program`` on its operands (call, remat): the same
    primitive running the program's derivative, fed the live floating tangents."""
    flags = [t is not None and v.dtype.kind in "fc" for t, v in zip(tangents, program.inputs)]
    jp = derived("jvp", program, flags, lambda: jvp_program(program, flags))
    res = bind(prim, *primals, *[t for t, f in zip(tangents, flags) if f], program=jp)
    return res[len(program.outputs):]


def _call_jvp(primals, tangents, outs, *, program):
    return _program_jvp(call_p, primals, tangents, program)


def _call_partial_eval(eqn, args, unknown, to_unknown):
    program = eqn.params["program"]
    known, unk, out_u = derived("pe", program, unknown, lambda: partial_eval(program, unknown))
    kres = bind(call_p, *[a for a, u in zip(args, unknown) if not u], program=known)
    n_known = sum(1 for u in out_u if not u)
    residuals = [to_unknown(r) for r in kres[n_known:]]
    ures = bind(call_p, *residuals, *[a for a, u in zip(args, unknown) if u], program=unk)
    kit, uit = iter(kres[:n_known]), iter(ures)
    kouts = [None if u else next(kit) for u in out_u]
    uouts = [next(uit) if u else None for u in out_u]
    return kouts, uouts


def _call_transpose(cts, *args, program):
    lin = [isinstance(a, Linear) for a in args]
    tp = derived("transpose", program, lin, lambda: transpose_program(program, lin))
    res = bind(call_p, *[a for a, l in zip(args, lin) if not l], *cts, program=tp)
    it = iter(res)
    return [next(it) if l else None for l in lin]


call_p.abstract = _call_abstract
call_p.jvp = _call_jvp
call_p.partial_eval = _call_partial_eval
call_p.transpose = _call_transpose


def call(program, *args):
    return bind(call_p, *args, program=program)


# -- vmap rules ---------------------------------------------------------------------------------

def _scan_batch(vals, dims, size, *, program, num_consts, num_carry, length, reverse):
    """A batched scan is a scan of the batched step; every carry is batched, xs rows stay axis 0."""
    nc, nk = num_consts, num_carry
    flags = [d == 0 for d in dims[:nc]] + [True] * nk + [d == 0 for d in dims[nc + nk:]]
    step = derived("vmap", program, flags + [size], lambda: vmap_program(program, flags, size))
    consts = list(vals[:nc])
    init = api.batch_all(vals[nc:nc + nk], dims[nc:nc + nk], size)
    xs = [_rows_first(x) if d == 0 else x for x, d in zip(vals[nc + nk:], dims[nc + nk:])]
    res = scan_bind(step, consts, init, xs, length, reverse)
    return res[:nk] + [_rows_first(y) for y in res[nk:]], [0] * len(res)


def _rows_first(x):
    """Swap the two leading axes: (B, L, ...) <-> (L, B, ...)."""
    return api.transpose(x, (1, 0) + tuple(range(2, x.ndim)))


def _call_batch(vals, dims, size, *, program):
    flags = [d == 0 for d in dims]
    bp = derived("vmap", program, flags + [size], lambda: vmap_program(program, flags, size))
    res = bind(call_p, *vals, program=bp)
    return res, [0] * len(res)


scan_p.batch = _scan_batch
call_p.batch = _call_batch


# -- cond ---------------------------------------------------------------------------------------

cond_p = Primitive("cond", multiple_results=True,
                   doc="Run one of several programs, chosen by an integer index operand.")


def _cond_abstract(index, *args, branches):
    if index.shape != () or index.dtype.kind not in "iub":
        raise ShapeError(f"cond: the index must be an integer or bool scalar, got {index.type_str()}")
    outs0 = branches[0].outputs
    for b in branches:
        if len(b.inputs) != len(args):
            raise ShapeError(f"cond: a branch takes {len(b.inputs)} operands, got {len(args)}")
        for a, p in zip(args, b.inputs):
            if a.shape != p.shape or a.dtype != p.dtype:
                raise ShapeError(f"cond: operand {a.type_str()} does not match a branch's {p.type_str()}")
        if [(v.shape, v.dtype) for v in b.outputs] != [(v.shape, v.dtype) for v in outs0]:
            raise ShapeError("cond: the branches return different types: "
                             f"{[v.type_str() for v in outs0]} and {[v.type_str() for v in b.outputs]}")
    return [(v.shape, v.dtype) for v in outs0]


def _cond_jvp(primals, tangents, outs, *, branches):
    flags = [t is not None and p.dtype.kind in "fc" for t, p in zip(tangents[1:], primals[1:])]
    out_t = [any(col) for col in zip(*[depends(b, flags) for b in branches])]
    n = len(branches[0].outputs)
    picks = list(range(n)) + [n + i for i, f in enumerate(out_t) if f]
    jbs = tuple(derived("cond-jvp", b, flags + out_t,
                        lambda b=b: select_outputs(jvp_program(b, flags), picks)) for b in branches)
    res = bind(cond_p, primals[0], *primals[1:], *[t for t, f in zip(tangents[1:], flags) if f],
               branches=jbs)
    it = iter(res[n:])
    return [next(it) if f else None for f in out_t]


def _cond_partial_eval(eqn, args, unknown, to_unknown):
    branches = eqn.params["branches"]
    if unknown[0]:
        res = bind(cond_p, *[a if u else to_unknown(a) for a, u in zip(args, unknown)],
                   branches=branches)
        return [None] * len(res), res
    flags = list(unknown[1:])
    out_u = [any(col) for col in zip(*[depends_on(b, flags) for b in branches])]
    splits = [derived("pe", b, flags + out_u, lambda b=b: partial_eval(b, flags, out_u))
              for b in branches]
    n_known = sum(1 for u in out_u if not u)
    res_avals = [[v for v in k.outputs[n_known:]] for k, _, _ in splits]
    known_bs, unknown_bs = [], []
    for i, (k, u, _) in enumerate(splits):
        # known branch i: its own residuals in its slot, zeros in the others'
        ins = [_placeholder(v) for v in k.inputs]
        outs = inline(k, ins)
        slots = []
        for j, avals in enumerate(res_avals):
            slots += outs[n_known:] if j == i else [api.zeros(v.shape, v.dtype, v.device) for v in avals]
        known_bs.append(program_from_dag(ins, outs[:n_known] + slots))
        # unknown branch i: takes every slot, reads its own
        n_own = len(res_avals[i])
        own = list(u.inputs[:n_own])
        slot_inputs = []
        for j, avals in enumerate(res_avals):
            slot_inputs += own if j == i else [_placeholder(v) for v in avals]
        unknown_bs.append(Program(slot_inputs + list(u.inputs[n_own:]), u.eqns, u.outputs, u.consts))
    kres = bind(cond_p, args[0], *[a for a, f in zip(args[1:], flags) if not f],
                branches=tuple(known_bs))
    residuals = [to_unknown(r) for r in kres[n_known:]]
    ures = bind(cond_p, to_unknown(args[0]), *residuals,
                *[a for a, f in zip(args[1:], flags) if f], branches=tuple(unknown_bs))
    kit, uit = iter(kres[:n_known]), iter(ures)
    return [None if u else next(kit) for u in out_u], [next(uit) if u else None for u in out_u]


def _cond_transpose(cts, index, *args, branches):
    lin = [isinstance(a, Linear) for a in args]
    tbs = tuple(derived("transpose", b, lin, lambda b=b: transpose_program(b, lin)) for b in branches)
    res = bind(cond_p, index, *[a for a, l in zip(args, lin) if not l], *cts, branches=tbs)
    it = iter(res)
    return [None] + [next(it) if l else None for l in lin]


def _cond_batch(vals, dims, size, *, branches):
    if dims[0] is None:
        flags = [d == 0 for d in dims[1:]]
        bbs = tuple(derived("vmap", b, flags + [size], lambda b=b: vmap_program(b, flags, size))
                    for b in branches)
        res = bind(cond_p, vals[0], *vals[1:], branches=bbs)
        return res, [0] * len(res)
    # a per-example choice: run every branch, pick per example
    flags = [d == 0 for d in dims[1:]]
    bbs = tuple(derived("vmap", b, flags + [size], lambda b=b: vmap_program(b, flags, size))
                for b in branches)
    index = api.cast(vals[0], "int64")
    picks = [api.equal(index, k) for k in range(len(bbs))]
    results = [bind(call_p, *_only_where_taken(vals[1:], dims[1:], pick), program=b)
               for b, pick in zip(bbs, picks)]
    out = results[-1]
    for k in range(len(bbs) - 2, -1, -1):
        out = [api.where(api.broadcast_in_dim(picks[k], r.shape, (0,)), r, o)
               for r, o in zip(results[k], out)]
    return out, [0] * len(out)


def _only_where_taken(vals, dims, pick):
    """A branch's batched operands, differentiable only in the examples that take the branch.

    Every branch runs on every example; an example that does not take a branch
    must get no derivative through it, not ``0 * inf`` (the slope of ``sqrt`` at
    0 in the untaken branch of a "safe sqrt").  ``where(pick, x, stop_gradient(x))``
    has x's value and passes a tangent (and a cotangent) only where ``pick``
    holds, so the untaken branch's derivative is masked after it is formed.
    Operands shared by all examples (a weight matrix) stay shared and unmasked:
    masking them per example would copy them once per example.
    """
    out = []
    for x, d in zip(vals, dims):
        if d == 0 and x.dtype.kind in "fc":
            keep = api.broadcast_in_dim(pick, x.shape, (0,))
            x = api.where(keep, x, api.stop_gradient(x))
        out.append(x)
    return out


cond_p.abstract = _cond_abstract
cond_p.jvp = _cond_jvp
cond_p.partial_eval = _cond_partial_eval
cond_p.transpose = _cond_transpose
cond_p.batch = _cond_batch


# -- while (forward and forward mode; reverse goes through a bounded scan) ----------------------------

while_p = Primitive("while", multiple_results=True,
                    doc="Repeat a body program while a predicate program holds (no reverse mode: "
                        "use while_loop(max_iters=...) to differentiate in reverse).")


def _while_abstract(*args, cond, body, num_cond_consts, num_body_consts):
    carry = args[num_cond_consts + num_body_consts:]
    if cond.outputs[0].shape != () or cond.outputs[0].dtype.kind != "b":
        raise ShapeError("while_loop: the condition must return a bool scalar")
    for a, v in zip(carry, body.outputs):
        if a.shape != v.shape or a.dtype != v.dtype:
            raise ShapeError(f"while_loop: the body turns a carry {a.type_str()} into {v.type_str()}; "
                             "a carry must keep its shape and dtype")
    return [(a.shape, a.dtype) for a in carry]


def _while_jvp(primals, tangents, outs, *, cond, body, num_cond_consts, num_body_consts):
    ncc, nbc = num_cond_consts, num_body_consts
    nk = len(primals) - ncc - nbc
    has = [t is not None and p.dtype.kind in "fc" for t, p in zip(tangents, primals)]
    bflags_c = has[ncc:ncc + nbc]
    carry_t = has[ncc + nbc:]
    while True:
        dep = depends(body, bflags_c + carry_t)
        new = [a or b for a, b in zip(carry_t, dep)]
        if new == carry_t:
            break
        carry_t = new
    flags = bflags_c + carry_t
    n = len(body.outputs)
    jb = derived("while-jvp", body, flags, lambda: _jvp_body(body, flags, nbc, carry_t))
    jc = derived("while-cond", cond, [ncc, sum(bflags_c), sum(carry_t)],
                 lambda: _cond_ignoring(cond, ncc, nbc, bflags_c, carry_t))
    bconsts = primals[ncc:ncc + nbc]
    tb = [t for t, f in zip(tangents[ncc:ncc + nbc], bflags_c) if f]
    carry = primals[ncc + nbc:]
    tc = [tangents[ncc + nbc + i] if tangents[ncc + nbc + i] is not None else api.zeros_like(carry[i])
          for i in range(nk) if carry_t[i]]
    res = bind(while_p, *primals[:ncc], *bconsts, *tb, *carry, *tc, cond=jc, body=jb,
               num_cond_consts=ncc, num_body_consts=nbc + len(tb))
    it = iter(res[n:])
    return [next(it) if f else None for f in carry_t]


def _jvp_body(body, flags, nbc, carry_t):
    jp = jvp_program(body, flags)
    n_in = len(body.inputs)
    tan = {}
    for i, f in enumerate(flags):
        if f:
            tan[i] = n_in + len(tan)
    order = list(range(nbc)) + [tan[i] for i in range(nbc) if i in tan] + \
        list(range(nbc, n_in)) + [tan[i] for i in range(nbc, n_in) if i in tan]
    n_out = len(body.outputs)
    return select_outputs(reorder_inputs(jp, order),
                          list(range(n_out)) + [n_out + i for i, f in enumerate(carry_t) if f])


def _cond_ignoring(cond, ncc, nbc, bflags_c, carry_t):
    """The predicate over the derivative's operands: it reads the primal carry only."""
    ins = [_placeholder(v) for v in cond.inputs]
    extra = [Var(v.shape, v.dtype, v.device) for v, f in zip(cond.inputs[ncc:], carry_t) if f]
    out = inline(cond, ins)
    return program_from_dag(ins + extra, out)


def _while_batch(vals, dims, size, *, cond, body, num_cond_consts, num_body_consts):
    ncc, nbc = num_cond_consts, num_body_consts
    vals = api.batch_all(vals, dims, size)
    flags_c = [True] * len(cond.inputs)
    flags_b = [True] * len(body.inputs)
    bc = derived("vmap", cond, flags_c + [size], lambda: vmap_program(cond, flags_c, size))
    bb = derived("vmap", body, flags_b + [size], lambda: vmap_program(body, flags_b, size))
    # any example still running keeps the loop going; finished ones keep their carry
    gc = derived("while-any", bc, [], lambda: _any_of(bc))
    gb = derived("while-guarded", bb, [ncc], lambda: _guarded_body(bc, bb, ncc, nbc))
    res = bind(while_p, *vals[:ncc], *vals[:ncc], *vals[ncc:], cond=gc, body=gb,
               num_cond_consts=ncc, num_body_consts=ncc + nbc)
    return res, [0] * len(res)


def _any_of(bc):
    ins = [_placeholder(v) for v in bc.inputs]
    out = inline(bc, ins)[0]
    return program_from_dag(ins, [api.greater(api.sum(api.cast(out, "int64")), 0)])


def _guarded_body(bc, bb, ncc, nbc):
    cc = [_placeholder(v) for v in bc.inputs[:ncc]]
    bcs = [_placeholder(v) for v in bb.inputs[:nbc]]
    carry = [_placeholder(v) for v in bb.inputs[nbc:]]
    go = inline(bc, cc + carry)[0]
    new = inline(bb, bcs + carry)
    outs = [api.where(api.broadcast_in_dim(go, n.shape, (0,)), n, o) for n, o in zip(new, carry)]
    return program_from_dag(cc + bcs + carry, outs)


def _while_transpose(cts, *args, **params):
    raise GradError("while_loop: reverse mode (grad, vjp, jacrev) cannot run back through a loop "
                    "whose number of iterations is known only when it runs; give "
                    "while_loop(..., max_iters=N), a bound on its iterations, to make it a scan "
                    "that reverse mode can differentiate")


while_p.abstract = _while_abstract
while_p.jvp = _while_jvp
while_p.transpose = _while_transpose
while_p.batch = _while_batch


# -- custom derivatives and rematerialization ----------------------------------------------------

custom_jvp_p = Primitive("custom_jvp_call", multiple_results=True,
                         doc="A function whose JVP is the user's program instead of its own.")


def _custom_jvp_jvp(primals, tangents, outs, *, program, jvp):
    ts = [api.zeros_like(p) if t is None else t for p, t in zip(primals, tangents)]
    res = bind(call_p, *primals, *ts, program=jvp)
    return res[len(program.outputs):]


custom_jvp_p.abstract = lambda *args, program, jvp: _call_abstract(*args, program=program)
custom_jvp_p.jvp = _custom_jvp_jvp
custom_jvp_p.batch = lambda vals, dims, size, *, program, jvp: _custom_batch(
    custom_jvp_p, vals, dims, size, program=program, jvp=jvp)


custom_vjp_p = Primitive("custom_vjp_call", multiple_results=True,
                         doc="A function whose reverse-mode derivative is the user's backward program.")
custom_lin_p = Primitive("custom_lin", multiple_results=True,
                         doc="The linear part of a custom_vjp function: it only exists to be transposed "
                             "into the user's backward program.")


def _custom_vjp_jvp(primals, tangents, outs, *, program, fwd, bwd, num_res):
    res = bind(call_p, *primals, program=fwd)
    n = len(program.outputs)
    residuals = res[n:]
    ts = [api.zeros_like(p) if t is None else t for p, t in zip(primals, tangents)]
    return bind(custom_lin_p, *residuals, *ts, bwd=bwd, num_res=num_res,
                out_types=tuple((v.shape, v.dtype) for v in program.outputs))


def _custom_lin_transpose(cts, *args, bwd, num_res, out_types):
    residuals = args[:num_res]
    res = bind(call_p, *residuals, *cts, program=bwd)
    return [None] * num_res + list(res)


def _custom_lin_impl(*args, **params):
    raise GradError("a vkml.custom_vjp function has no forward-mode derivative; "
                    "differentiate it in reverse mode (grad, vjp, backward) or give it custom_jvp")


custom_vjp_p.abstract = lambda *args, program, fwd, bwd, num_res: _call_abstract(*args, program=program)
custom_vjp_p.jvp = _custom_vjp_jvp
custom_vjp_p.batch = lambda vals, dims, size, **p: _custom_batch(custom_vjp_p, vals, dims, size, **p)
custom_lin_p.abstract = lambda *args, bwd, num_res, out_types: list(out_types)
custom_lin_p.impl = _custom_lin_impl
custom_lin_p.transpose = _custom_lin_transpose


def _custom_batch(prim, vals, dims, size, **params):
    """Batching a custom-derivative function batches each of its programs."""
    vals = api.batch_all(vals, dims, size)
    batched = {}
    for k, v in params.items():
        if isinstance(v, Program):
            flags = [True] * len(v.inputs)
            batched[k] = derived("vmap", v, flags + [size], lambda v=v, f=flags: vmap_program(v, f, size))
        else:
            batched[k] = v
    res = bind(prim, *vals, **batched)
    return res, [0] * len(res)


remat_p = Primitive("checkpoint", multiple_results=True,
                    doc="A call whose intermediates the backward pass recomputes instead of keeping.")


def _remat_jvp(primals, tangents, outs, *, program):
    return _program_jvp(remat_p, primals, tangents, program)


def _remat_partial_eval(eqn, args, unknown, to_unknown):
    """Known part: only the outputs.  Unknown part: recompute from the inputs (the residuals)."""
    program = eqn.params["program"]
    known, _, out_u = derived("pe", program, unknown, lambda: partial_eval(program, unknown))
    n_known = sum(1 for u in out_u if not u)
    kprog = derived("remat-known", known, [n_known], lambda: select_outputs(known, range(n_known)))
    kres = bind(remat_p, *[a for a, u in zip(args, unknown) if not u], program=kprog)
    uprog = derived("remat-unknown", program, unknown, lambda: _recompute_then_linear(program, unknown))
    ures = bind(call_p, *[a if u else to_unknown(a) for a, u in zip(args, unknown)], program=uprog)
    kit, uit = iter(kres), iter(ures)
    return [None if u else next(kit) for u in out_u], [next(uit) if u else None for u in out_u]


def _recompute_then_linear(program, unknown):
    """The unknown part of a checkpoint: recompute the known part from the inputs, then run the
    part that reads the unknown inputs (split, so that a derivative in it is linear and can be
    transposed even when it holds another checkpoint or a loop)."""
    known, unk, out_u = derived("pe", program, unknown, lambda: partial_eval(program, unknown))
    ins = [_placeholder(v) for v in program.inputs]
    kouts = inline(known, [x for x, u in zip(ins, unknown) if not u])
    residuals = kouts[sum(1 for u in out_u if not u):]
    return program_from_dag(ins, inline(unk, residuals + [x for x, u in zip(ins, unknown) if u]))


remat_p.abstract = _call_abstract
remat_p.jvp = _remat_jvp
remat_p.partial_eval = _remat_partial_eval
remat_p.batch = lambda vals, dims, size, *, program: _custom_batch(remat_p, vals, dims, size,
                                                                   program=program)
