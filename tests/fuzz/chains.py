"""Random programs: chains of elementwise, reduction and movement ops over random arrays.

A *case* is plain JSON, so it crosses the worker's pipe and prints as a
reproducer: the inputs (an encoded array each, and the view taken of it:
reversed, transposed or strided), then a list of ops, each naming the values
it reads by their place in the list of values made so far (inputs first).

:func:`run_case` (called in the worker) runs one case three ways -- lazily on
the NumPy backend (the reference), lazily on the compiled cpu tier, and as a
``vkml.jit`` function on the cpu tier, called three times (the tier runs a
program's first call on NumPy and its later calls compiled) -- and returns
what each gave.  :func:`compare` says whether they agree.

How closely they must agree (see the cpu tier's floating-point contract):
bit for bit while every op of the chain is exact (+ - * / sqrt, integer ops,
comparisons, casts, movement); within a few ulps after a transcendental
function, within a rounding bound after a floating-point reduction or matmul
(NumPy sums pairwise, the C tier in index order).  Ops that come after an
inexact op and are not plain movement could turn a last-bit difference into
any difference (a comparison, a cast to int), so such a result is compared by
shape, dtype and error class only.
"""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .codec import decode, describe, encode

#: every NumPy dtype a user may hand in (vkml keeps five of them: bool, int32, int64, float32, float64)
DTYPES = ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64", "bool"]

VIEWS = ["none", "rev", "T", "step"]


# -- the ops -----------------------------------------------------------------------------------

def _axis(x, seed):
    """An axis of ``x`` picked by ``seed`` (0..7); seed 7 picks one past the end (refused)."""
    n = x.ndim
    if seed == 7:
        return n
    return seed % n if n else 0


def _vk():
    import vkml
    return vkml


def _unary(name):
    return lambda x: getattr(_vk(), name)(x)


def _binary(name):
    return lambda x, y: getattr(_vk(), name)(x, y)


def _reduce(name):
    return lambda x, axis=0: getattr(_vk(), name)(x, _axis(x, axis) if x.ndim else None)


def _cast(dtype):
    return lambda x: _vk().cast(x, dtype)


def _take(x, axis=0):
    a = _axis(x, axis) if x.ndim else 0
    return _vk().take(x, [0, -1], axis=a)


def _concat(x, axis=0):
    return _vk().concatenate([x, x], axis=_axis(x, axis) if x.ndim else 0)


def _gather_by(x, y):
    """``x`` flattened, picked at the positions ``y`` holds (data-dependent indices: out-of-range
    ones are refused as the program runs, negative ones count from the end)."""
    vk = _vk()
    return vk.take(vk.reshape(x, (-1,)), vk.reshape(vk.cast(y, "int64"), (-1,)))


def _scan(x):
    """Running sums and products over the rows of ``x`` (a loop compiled whole by the cpu tier)."""
    vk = _vk()
    carry, ys = vk.scan(lambda c, row: (c + row, c * row), vk.zeros_like(x[0]), x)
    return ys + vk.expand_dims(carry, 0)


def _while(x):
    """``x`` doubled three times by a while loop with a counter in its carry."""
    vk = _vk()
    out = vk.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] + c[1]), (vk.tensor(0), x))
    return out[1]


def _cond(x):
    """``-x`` or ``x``, by the parity of the number of non-zero elements (an exact predicate)."""
    vk = _vk()
    count = vk.sum(vk.not_equal(x, 0))
    odd = vk.equal(vk.sub(count, vk.mul(vk.floor_divide(count, 2), 2)), 1)
    return vk.cond(odd, lambda v: vk.neg(v), lambda v: v, x)


def _pad(x):
    return _vk().pad(x, (1,) * x.ndim, (0,) * x.ndim)


#: name -> (function over Tensors, arity, class).  Classes: "exact" (same bits on every backend),
#: "zero-sign" (same bits but for the sign of a zero: NumPy's maximum(0.0, -0.0) may give either),
#: "float" (exact on integers, inexact on floats: pow, sum, matmul), "approx" (inexact, drawn only
#: as a chain's last computing op), "move" (movement: exact, and keeps an inexact value comparable)
OPS = {
    "neg": (_unary("neg"), 1, "exact"), "abs": (_unary("abs"), 1, "exact"),
    "sign": (_unary("sign"), 1, "exact"), "square": (_unary("square"), 1, "exact"),
    "relu": (_unary("relu"), 1, "exact"), "logical_not": (_unary("logical_not"), 1, "exact"),
    "sqrt": (_unary("sqrt"), 1, "exact"),
    "clip": (lambda x: _vk().clip(x, -2, 3), 1, "zero-sign"),
    "cast_float32": (_cast("float32"), 1, "exact"), "cast_float64": (_cast("float64"), 1, "exact"),
    "cast_int32": (_cast("int32"), 1, "exact"), "cast_int64": (_cast("int64"), 1, "exact"),
    "cast_bool": (_cast("bool"), 1, "exact"),
    "add": (_binary("add"), 2, "exact"), "sub": (_binary("sub"), 2, "exact"),
    "mul": (_binary("mul"), 2, "exact"), "div": (_binary("div"), 2, "exact"),
    "floor_divide": (_binary("floor_divide"), 2, "exact"),
    "maximum": (_binary("maximum"), 2, "zero-sign"), "minimum": (_binary("minimum"), 2, "zero-sign"),
    "equal": (_binary("equal"), 2, "exact"), "not_equal": (_binary("not_equal"), 2, "exact"),
    "less": (_binary("less"), 2, "exact"), "less_equal": (_binary("less_equal"), 2, "exact"),
    "greater": (_binary("greater"), 2, "exact"),
    "greater_equal": (_binary("greater_equal"), 2, "exact"),
    "logical_and": (_binary("logical_and"), 2, "exact"),
    "logical_or": (_binary("logical_or"), 2, "exact"),
    "where": (lambda c, x, y: _vk().where(c, x, y), 3, "exact"),
    "max": (_reduce("max"), 1, "zero-sign"), "min": (_reduce("min"), 1, "zero-sign"),
    "argmax": (_reduce("argmax"), 1, "exact"), "argmin": (_reduce("argmin"), 1, "exact"),
    "pow": (_binary("pow"), 2, "float"), "sum": (_reduce("sum"), 1, "float"),
    "matmul": (lambda x: _vk().matmul(x, _vk().swapaxes(x, -1, -2)) if x.ndim >= 2
               else _vk().matmul(x, x), 1, "float"),
    "exp": (_unary("exp"), 1, "approx"), "log": (_unary("log"), 1, "approx"),
    "sin": (_unary("sin"), 1, "approx"), "cos": (_unary("cos"), 1, "approx"),
    "tanh": (_unary("tanh"), 1, "approx"), "sigmoid": (_unary("sigmoid"), 1, "approx"),
    "mean": (_reduce("mean"), 1, "approx"), "logsumexp": (_reduce("logsumexp"), 1, "approx"),
    "softmax": (_reduce("softmax"), 1, "approx"),
    "reshape": (lambda x: _vk().reshape(x, (-1,)), 1, "move"),
    "transpose": (lambda x: _vk().transpose(x), 1, "move"),
    "flip": (lambda x, axis=0: _vk().flip(x, _axis(x, axis) if x.ndim else None), 1, "move"),
    "reverse0": (lambda x: x[::-1] if x.ndim else x, 1, "move"),
    "stride2": (lambda x: x[..., ::2], 1, "move"),
    "expand_dims": (lambda x: _vk().expand_dims(x, 0), 1, "move"),
    "squeeze": (lambda x: _vk().squeeze(x), 1, "move"),
    "broadcast": (lambda x: _vk().broadcast_to(x, (2,) + tuple(x.shape)), 1, "move"),
    "concatenate": (_concat, 1, "move"), "pad": (_pad, 1, "move"), "take": (_take, 1, "move"),
    "gather_by": (_gather_by, 2, "exact"), "scan": (_scan, 1, "exact"),
    "while_loop": (_while, 1, "exact"), "cond": (_cond, 1, "exact"),
}

_WITH_AXIS = {"max", "min", "argmax", "argmin", "sum", "mean", "logsumexp", "softmax", "flip",
              "concatenate", "take"}
CHAIN_OPS = sorted(n for n, (_, _, kind) in OPS.items() if kind != "approx")
FINAL_OPS = sorted(n for n, (_, _, kind) in OPS.items() if kind == "approx")


# -- generating cases (hypothesis strategies, used by the tests) -------------------------------

def _elements(dtype):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return st.booleans()
    if dt.kind in "iu":
        info = np.iinfo(dt)
        edges = [info.min, info.max, 0, 1, -1 if dt.kind == "i" else 2, info.min + 1]
        return st.one_of(st.sampled_from(edges), st.integers(-9, 9).filter(
            lambda v: info.min <= v <= info.max), st.integers(int(info.min), int(info.max)))
    width = 32 if dt == np.float32 else 64
    edges = [0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), float("-inf"),
             float(np.finfo(dt).max), float(np.finfo(dt).tiny), 0.5]
    return st.one_of(st.sampled_from(edges), st.floats(-8, 8, width=width),
                     st.floats(width=width, allow_subnormal=True))


@st.composite
def logical_shapes(draw):
    """0-d, empty, size-1 and (sometimes) longer axes: a long one takes the C tier past its
    stack temporaries onto malloc'd ones."""
    ndim = draw(st.integers(0, 3))
    dims = [draw(st.one_of(st.integers(1, 4), st.sampled_from([0, 1]), st.integers(20, 70)))
            for _ in range(ndim)]
    while math.prod(dims) > 2000:
        dims[dims.index(max(dims))] //= 2
    return dims


def _base_shape(shape, view):
    if view == "T":
        return list(reversed(shape))
    if view == "step" and shape:
        return shape[:-1] + [2 * shape[-1]]
    return list(shape)


def take_view(base, view):
    """The array a case's input stands for: a (non-contiguous) view of its stored base array."""
    if view == "rev" and base.ndim:
        return base[::-1]
    if view == "T":
        return base.T
    if view == "step" and base.ndim:
        return base[..., ::2]
    return base


@st.composite
def inputs(draw, shape, dtype):
    view = draw(st.sampled_from(VIEWS))
    base = draw(hnp.arrays(np.dtype(dtype), _base_shape(shape, view), elements=_elements(dtype)))
    return {"array": encode(base), "view": view}


def _broadcastable(draw, shape):
    """A shape that broadcasts against ``shape``: some axes set to 1, some leading ones dropped."""
    out = [1 if draw(st.integers(0, 3)) == 0 else d for d in shape]
    return out[draw(st.integers(0, len(out))):] if out and draw(st.booleans()) else out


@st.composite
def cases(draw, max_ops=5):
    """A random case (see the module docstring)."""
    shape = draw(logical_shapes())
    first = draw(st.sampled_from(DTYPES))
    n_in = draw(st.integers(1, 3))
    ins = [draw(inputs(shape, first))]
    for _ in range(n_in - 1):
        dtype = first if draw(st.integers(0, 2)) else draw(st.sampled_from(DTYPES))
        ins.append(draw(inputs(_broadcastable(draw, shape), dtype)))
    ops = []
    n_values = n_in
    for i in range(draw(st.integers(1, max_ops))):
        ops.append(_draw_op(draw, draw(st.sampled_from(CHAIN_OPS)), n_values))
        n_values += 1
    if draw(st.integers(0, 2)) == 0:
        ops.append(_draw_op(draw, draw(st.sampled_from(FINAL_OPS)), n_values))
        n_values += 1
        if draw(st.booleans()):
            move = sorted(n for n, (_, _, kind) in OPS.items() if kind == "move")
            ops.append(_draw_op(draw, draw(st.sampled_from(move)), n_values))
    return {"inputs": ins, "ops": ops}


def _draw_op(draw, name, n_values):
    _, arity, _ = OPS[name]
    latest = n_values - 1
    args = [{"v": latest}]
    for _ in range(arity - 1):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            args.append({"s": draw(st.sampled_from([0, 1, -1, 2, 2.5, -0.0, True, 2 ** 31, -7]))})
        else:
            args.append({"v": draw(st.integers(0, latest))})
    if draw(st.integers(0, 2)) == 0:
        args = args[1:] + args[:1]          # the chained value as a later operand
    params = {"axis": draw(st.integers(0, 7))} if name in _WITH_AXIS else {}
    return {"op": name, "args": args, "params": params}


# -- running cases (in the worker) -------------------------------------------------------------

def _outcome_of_error(err) -> dict:
    import vkml
    return {"error": type(err).__name__, "vkml": isinstance(err, vkml.VkmlError),
            "message": str(err)[:300]}


#: how closely a value must agree, strictest first (see the module docstring)
#: ("ulp-of-one": within a few ulps of 1, as sigmoid = (1 + tanh(x/2)) / 2 is)
TAGS = ["exact", "zero-sign", "ulp", "ulp-of-one", "sum", "none"]


def _run_ops(ops, values):
    """Apply ``ops`` to the starting ``values``: the chain's last value and its tolerance class."""
    tags = ["exact"] * len(values)
    for op in ops:
        fn, _, kind = OPS[op["op"]]
        args = [values[a["v"]] if "v" in a else a["s"] for a in op["args"]]
        arg_tags = [tags[a["v"]] for a in op["args"] if "v" in a]
        out = fn(*args, **op["params"])
        tainted = any(TAGS.index(t) >= TAGS.index("ulp") for t in arg_tags)
        worst = max(arg_tags, key=TAGS.index, default="exact")
        if kind == "move" or (kind == "exact" and not tainted):
            tag = worst
        elif kind == "zero-sign" and not tainted:
            tag = max(worst, "zero-sign", key=TAGS.index)
        elif tainted:
            tag = "none"                     # an op after an inexact one: not compared by value
        elif kind == "float" and out.dtype.kind != "f":
            tag = worst
        else:
            tag = "ulp" if op["op"] in ("exp", "log", "sin", "cos", "tanh", "pow") else \
                "ulp-of-one" if op["op"] == "sigmoid" else "sum"
        values.append(out)
        tags.append(tag)
    return values[-1], tags[-1]


def _arrays(case):
    return [take_view(decode(i["array"]), i["view"]) for i in case["inputs"]]


def _lazy(case):
    """The case on lazy tensors, realized once: its value and tolerance class."""
    import vkml
    out, tag = _run_ops(case["ops"], [vkml.tensor(a) for a in _arrays(case)])
    return [out.numpy()], tag


def _jit(case, calls=3):
    """The case as a jitted function of its inputs, called ``calls`` times: every call's result."""
    import vkml
    f = vkml.jit(lambda *xs: _run_ops(case["ops"], list(xs))[0])
    arrays = _arrays(case)
    return [f(*arrays).numpy() for _ in range(calls)]


def _scale(case):
    """A bound on the magnitude a reduction's rounding error is relative to: the sum of the
    absolute finite input values (of the inputs the chain starts from), times the element count."""
    total, count = 1.0, 1
    for a in _arrays(case):
        a = a.astype(np.float64)
        finite = np.abs(a[np.isfinite(a)])
        total += float(finite.sum()) if finite.size else 0.0
        count = max(count, a.size)
    return total * count


def run_case(case) -> dict:
    """Run ``case`` on NumPy (lazy), on the cpu tier (lazy) and as a jitted function on the cpu
    tier; return what each gave, encoded."""
    import vkml
    results = {}
    runs = [("numpy", "numpy", _lazy), ("cpu", "cpu", _lazy), ("cpu-jit", "cpu", None)]
    for label, backend, how in runs:
        vkml.set_backend(backend)
        os.environ["VKML_CPU_HOT"] = "0" if how is _lazy else "1"
        fallbacks = vkml.backends.current().__dict__.get("fallbacks", 0)
        try:
            if how is _lazy:
                outs, tag = _lazy(case)
                results[label] = {"values": [encode(o) for o in outs], "tag": tag}
                if backend == "cpu":      # whether generated C ran (or NumPy, for what C lacks)
                    results["ran C"] = vkml.backends.current().fallbacks == fallbacks
            else:
                outs = _jit(case)
                results[label] = {"values": [encode(o) for o in outs[1:]]}   # the compiled calls
        except Exception as err:     # noqa: BLE001 -- every error is a result to compare
            results[label] = _outcome_of_error(err)
    vkml.set_backend("numpy")
    results["scale"] = _scale(case)
    return results


# -- comparing ---------------------------------------------------------------------------------

def _same_bits(a, b) -> bool:
    """Equal values bit for bit (signed zeros told apart), NaN equal to NaN of any payload."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return np.array_equal(a, b)
    a, b = a.reshape(-1), b.reshape(-1)
    na, nb = np.isnan(a), np.isnan(b)
    bits = f"u{a.itemsize}"
    return np.array_equal(na, nb) and np.array_equal(a[~na].view(bits), b[~nb].view(bits))


def _close(a, b, tag, scale) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if tag == "none" or a.dtype.kind != "f":
        return tag == "none" or np.array_equal(a, b)
    eps = float(np.finfo(a.dtype).eps)
    na, nb = np.isnan(a), np.isnan(b)
    if not np.array_equal(na, nb):
        return False
    fa, fb = a[~na].astype(np.float64), b[~nb].astype(np.float64)
    if not np.array_equal(np.isinf(fa), np.isinf(fb)) or \
            not np.array_equal(fa[np.isinf(fa)], fb[np.isinf(fb)]):
        return False
    fa, fb = fa[np.isfinite(fa)], fb[np.isfinite(fb)]
    if tag in ("ulp", "ulp-of-one"):
        floor = 1.0 if tag == "ulp-of-one" else float(np.finfo(a.dtype).tiny)
        tol = 8 * eps * np.maximum(np.abs(fa), floor)
    else:
        tol = 4 * eps * scale
    return bool(np.all(np.abs(fa - fb) <= tol))


def compare(case, results, labels=("cpu", "cpu-jit")) -> list:
    """The disagreements between the NumPy reference and the runs ``labels`` name (the cpu tier's,
    by default), and any error that is not a ``vkml.VkmlError`` (empty: all is well)."""
    ref = results["numpy"]
    problems = [f"{label} raised {r['error']}, not a vkml.VkmlError: {r['message'][:200]}"
                for label, r in ((k, results[k]) for k in ("numpy",) + tuple(labels))
                if "error" in r and not r["vkml"]]
    for label in labels:
        got = results[label]
        if "error" in ref or "error" in got:
            if ref.get("error") != got.get("error"):
                problems.append(f"{label}: NumPy gave {_short(ref)} but {label} gave {_short(got)}")
            continue
        want = decode(ref["values"][0])
        for k, blob in enumerate(got["values"]):
            have = decode(blob)
            if ref["tag"] == "zero-sign" and want.dtype.kind == "f":
                want, have = want + want.dtype.type(0), have + have.dtype.type(0)   # -0.0 -> 0.0
            ok = _same_bits(want, have) if ref["tag"] in ("exact", "zero-sign") else \
                _close(want, have, ref["tag"], results["scale"])
            if not ok:
                problems.append(f"{label} (result {k}, compared {ref['tag']}): NumPy gave "
                                f"{describe(ref['values'][0])}, {label} gave {describe(blob)}")
    return problems


def _short(r) -> str:
    if "error" in r:
        return f"{r['error']} ({r['message'][:120]})"
    return describe(r["values"][0])


def reproducer(case) -> str:
    """Python a person can paste to see the case: its inputs and its ops, in order."""
    lines = ["import numpy as np, vkml"]
    for k, i in enumerate(case["inputs"]):
        view = {"none": "", "rev": "[::-1]", "T": ".T", "step": "[..., ::2]"}[i["view"]]
        lines.append(f"v{k} = vkml.tensor(({describe(i['array'], limit=64)}){view})")
    n = len(case["inputs"])
    for op in case["ops"]:
        args = ", ".join(f"v{a['v']}" if "v" in a else repr(a["s"]) for a in op["args"])
        params = ", ".join(f"{k}={v}" for k, v in op["params"].items())
        lines.append(f"v{n} = {op['op']}({args}{', ' + params if params else ''})")
        n += 1
    lines.append(f"print(v{n - 1}.numpy())")
    return "\n".join(lines)


# -- gradients -----------------------------------------------------------------------------------

#: ops with a derivative almost everywhere, for gradient cases
GRAD_OPS = ["neg", "abs", "square", "relu", "clip", "add", "sub", "mul", "maximum", "minimum",
            "sum", "matmul", "sin", "cos", "tanh", "sigmoid", "mean", "logsumexp", "softmax",
            "reshape", "transpose", "flip", "reverse0", "stride2", "expand_dims", "squeeze",
            "broadcast", "concatenate", "pad", "take", "scan"]


@st.composite
def grad_cases(draw, max_ops=5):
    """A chain of differentiable ops over finite float64 inputs (see ``run_grad_case``)."""
    shape = draw(logical_shapes())
    elements = st.floats(-3, 3)
    ins = []
    for k in range(draw(st.integers(1, 2))):
        s = shape if k == 0 else _broadcastable(draw, shape)
        view = draw(st.sampled_from(VIEWS))
        base = draw(hnp.arrays(np.float64, _base_shape(s, view), elements=elements))
        ins.append({"array": encode(base), "view": view})
    ops, n_values = [], len(ins)
    for _ in range(draw(st.integers(1, max_ops))):
        ops.append(_draw_op(draw, draw(st.sampled_from(GRAD_OPS)), n_values))
        n_values += 1
    return {"inputs": ins, "ops": ops}


def run_grad_case(case) -> dict:
    """d sum(chain) / d input for every input, by ``backward`` on NumPy and on the cpu tier."""
    import vkml
    results = {}
    os.environ["VKML_CPU_HOT"] = "0"
    for backend in ("numpy", "cpu"):
        vkml.set_backend(backend)
        try:
            xs = [vkml.tensor(a, requires_grad=True) for a in _arrays(case)]
            out, _ = _run_ops(case["ops"], list(xs))
            vkml.backward(vkml.sum(out))
            results[backend] = {"values": [encode(x.grad.numpy() if x.grad is not None
                                                  else np.zeros(x.shape)) for x in xs]}
        except Exception as err:     # noqa: BLE001 -- every error is a result to compare
            results[backend] = _outcome_of_error(err)
        finally:
            vkml.set_backend("numpy")
    return results


def compare_grads(results) -> list:
    """Gradients agree within rounding (the backward sums broadcasts in a backend's own order)."""
    a, b = results["numpy"], results["cpu"]
    problems = [f"{label} raised {r['error']}, not a vkml.VkmlError: {r['message'][:200]}"
                for label, r in (("numpy", a), ("cpu", b)) if "error" in r and not r["vkml"]]
    if "error" in a or "error" in b:
        if a.get("error") != b.get("error"):
            problems.append(f"NumPy gave {_short(a)} but cpu gave {_short(b)}")
        return problems
    for k, (wa, wb) in enumerate(zip(a["values"], b["values"])):
        want, got = decode(wa), decode(wb)
        scale = 1.0 + (float(np.max(np.abs(want[np.isfinite(want)]))) if np.isfinite(want).any() else 0.0)
        close = np.isclose(want, got, rtol=0, atol=1e-9 * scale, equal_nan=True) | (want == got)
        if want.shape != got.shape or not close.all():
            problems.append(f"gradient of input {k}: NumPy gave {describe(wa)}, cpu gave {describe(wb)}")
    return problems
