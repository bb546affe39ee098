"""Elementwise primitives: one block each, with its NumPy implementation and rules.

All operands of an elementwise primitive have the same shape and dtype:
broadcasting and dtype promotion are done before binding, by the functions in
``vkml.ops.api`` (``add`` broadcasts and promotes, ``add_p`` does not).  That
keeps every rule here a one-liner and every transpose free of "un-broadcast"
special cases.

Rules call the functions of ``api`` (imported as ``F``), so a rule is
written with the same operations a user writes.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir import dtype_name
from . import api as F  # api imports this module too: F is used only inside the rules
from .core import Linear, Primitive, bind


# -- shape/dtype rules ------------------------------------------------------

def _same_type(name, *xs):
    x0 = xs[0]
    for x in xs[1:]:
        if x.shape != x0.shape:
            raise ShapeError(f"{name}: operand shapes {x0.shape} and {x.shape} differ; "
                             f"use vkml.{name} (which broadcasts) or broadcast_to first")
        if x.dtype != x0.dtype:
            raise DTypeError(f"{name}: operand dtypes {dtype_name(x0.dtype)} and "
                             f"{dtype_name(x.dtype)} differ; cast one with .astype()")
    return x0


def unary_float_rule(name, complex_ok=False):
    """The shape/dtype rule of a one-operand float function (``ops.special`` uses it too);
    ``complex_ok``: defined on complex numbers too (a holomorphic function: its derivative
    formula is the real one's)."""
    kinds = "fc" if complex_ok else "f"

    def rule(x):
        if x.dtype.kind not in kinds:
            raise DTypeError(f"{name}: needs a floating operand, got {dtype_name(x.dtype)}; "
                             "cast with .astype(np.float32) or use vkml." + name)
        return [(x.shape, x.dtype)]
    return rule


def _unary_numeric(name):
    def rule(x):
        if x.dtype.kind == "b":
            raise DTypeError(f"{name}: needs a numeric operand, got bool; cast it first")
        return [(x.shape, x.dtype)]
    return rule


def _binary_numeric(name):
    def rule(x, y):
        _same_type(name, x, y)
        if x.dtype.kind == "b":
            raise DTypeError(f"{name}: needs numeric operands, got bool; cast them first")
        return [(x.shape, x.dtype)]
    return rule


def binary_float_rule(name):
    """The shape/dtype rule of a two-operand float function (``ops.special`` uses it too)."""
    def rule(x, y):
        _same_type(name, x, y)
        if x.dtype.kind != "f":
            raise DTypeError(f"{name}: needs floating operands, got {dtype_name(x.dtype)}; "
                             "cast with .astype(np.float32)")
        return [(x.shape, x.dtype)]
    return rule


def _compare(name):
    def rule(x, y):
        _same_type(name, x, y)
        return [(x.shape, np.dtype(bool))]
    return rule


def elementwise_primitive(name, abstract, impl, doc, jvp=None, transpose=None):
    """A primitive applied element by element, batched by vmap on its leading axis.

    Shared with ``ops.special``, whose NumPy-only functions are elementwise primitives too.
    """
    p = Primitive(name, elementwise=True, doc=doc)
    p.abstract = abstract
    p.impl = impl
    p.jvp = jvp
    p.transpose = transpose
    p.batch = _batch_elementwise(p)
    return p


def _batch_elementwise(prim):
    """vmap rule of every elementwise primitive: batch all operands, apply, batched at 0."""
    def rule(vals, dims, size, **params):
        return [bind(prim, *F.batch_all(vals, dims, size), **params)], [0]
    return rule


def zero_jvp(primals, tangents, outs, **params):
    return [None]


def sum_tangents(*ts):
    """Add the tangents that are not symbolic zeros (None); ``ops.special``'s rules use it too."""
    live = [t for t in ts if t is not None]
    if not live:
        return None
    out = live[0]
    for t in live[1:]:
        out = F.add(out, t)
    return out


# -- unary -------------------------------------------------------------------

neg_p = elementwise_primitive(
    "neg", _unary_numeric("neg"), np.negative, "-x; linear.",
    jvp=lambda p, t, o: [F.neg(t[0])],
    transpose=lambda ct, x: [F.neg(ct[0])])

exp_p = elementwise_primitive(
    "exp", unary_float_rule("exp", True), np.exp, "e**x.",
    jvp=lambda p, t, o: [F.mul(t[0], o[0])])

log_p = elementwise_primitive(
    "log", unary_float_rule("log", True), np.log, "Natural logarithm.",
    jvp=lambda p, t, o: [F.div(t[0], p[0])])

sin_p = elementwise_primitive(
    "sin", unary_float_rule("sin", True), np.sin, "Sine.",
    jvp=lambda p, t, o: [F.mul(t[0], F.cos(p[0]))])

cos_p = elementwise_primitive(
    "cos", unary_float_rule("cos", True), np.cos, "Cosine.",
    jvp=lambda p, t, o: [F.neg(F.mul(t[0], F.sin(p[0])))])

tanh_p = elementwise_primitive(
    "tanh", unary_float_rule("tanh", True), np.tanh, "Hyperbolic tangent; also gives sigmoid without overflow.",
    jvp=lambda p, t, o: [F.mul(t[0], F.sub(1.0, F.mul(o[0], o[0])))])

sqrt_p = elementwise_primitive(
    "sqrt", unary_float_rule("sqrt", True), np.sqrt, "Square root.",
    jvp=lambda p, t, o: [F.div(t[0], F.mul(2.0, o[0]))])

abs_p = elementwise_primitive(
    "abs", _unary_numeric("abs"), np.abs, "|x|; its derivative is sign(x) (0 at 0, as autograd).",
    jvp=lambda p, t, o: [F.mul(t[0], F.sign(p[0]))])

sign_p = elementwise_primitive(
    "sign", _unary_numeric("sign"), np.sign,
    "-1, 0 or 1. A primitive because abs's derivative needs it; its own derivative is zero.",
    jvp=zero_jvp)


def _stop_gradient_impl(x):
    return x


stop_gradient_p = elementwise_primitive(
    "stop_gradient", lambda x: [(x.shape, x.dtype)], _stop_gradient_impl,
    "Identity whose derivative is zero: what ``detach`` means inside a traced program.",
    jvp=zero_jvp)


def _logical_not_rule(x):
    if x.dtype.kind != "b":
        raise DTypeError(f"logical_not: needs a bool operand, got {dtype_name(x.dtype)}; "
                         "compare first (x != 0)")
    return [(x.shape, x.dtype)]


logical_not_p = elementwise_primitive("logical_not", _logical_not_rule, np.logical_not, "~x for bool.",
                        jvp=zero_jvp)


# -- binary ------------------------------------------------------------------

def _add_transpose(ct, x, y):
    return [ct[0], ct[0]]


add_p = elementwise_primitive(
    "add", _binary_numeric("add"), np.add, "x + y; linear in both.",
    jvp=lambda p, t, o: [sum_tangents(t[0], t[1])],
    transpose=_add_transpose)

sub_p = elementwise_primitive(
    "sub", _binary_numeric("sub"), np.subtract, "x - y; linear in both.",
    jvp=lambda p, t, o: [sum_tangents(t[0], None if t[1] is None else F.neg(t[1]))],
    transpose=lambda ct, x, y: [ct[0], F.neg(ct[0])])


def _mul_transpose(ct, x, y):
    # Linear in exactly one operand: the other is a constant factor.
    if isinstance(x, Linear):
        return [F.mul(ct[0], y), None]
    return [None, F.mul(x, ct[0])]


mul_p = elementwise_primitive(
    "mul", _binary_numeric("mul"), np.multiply, "x * y; linear in each operand separately.",
    jvp=lambda p, t, o: [sum_tangents(None if t[0] is None else F.mul(t[0], p[1]),
                                       None if t[1] is None else F.mul(p[0], t[1]))],
    transpose=_mul_transpose)


def _div_jvp(p, t, o):
    # d(x/y) = (dx - (x/y) dy) / y
    num = sum_tangents(t[0], None if t[1] is None else F.neg(F.mul(o[0], t[1])))
    return [F.div(num, p[1])]


def _div_impl(x, y):
    if x.dtype.kind in "iu":
        return np.floor_divide(x, y)
    return np.divide(x, y)


div_p = elementwise_primitive(
    "div", _binary_numeric("div"), _div_impl,
    "x / y (floor division for integers, as NumPy's //); linear in x.",
    jvp=_div_jvp,
    transpose=lambda ct, x, y: [F.div(ct[0], y), None])


def _pow_jvp(p, t, o):
    """d/dx = y x^(y-1) (0 where y == 0, as x^0 is constant); d/dy = log(x) x^y with log(0) read
    as log(1): at x == 0 the power is 0 (y > 0) or does not move, so the slope in y is 0, not NaN."""
    x, y = p
    tx = ty = None
    if t[0] is not None:
        slope = F.where(F.equal(y, 0), F.zeros_like(x), F.mul(y, F.pow(x, F.sub(y, 1))))
        tx = F.mul(t[0], slope)
    if t[1] is not None:
        safe_x = F.where(F.equal(x, 0), F.ones_like(x), x)
        ty = F.mul(t[1], F.mul(F.log(safe_x), o[0]))
    return [sum_tangents(tx, ty)]


pow_p = elementwise_primitive("pow", _binary_numeric("pow"), np.power, "x ** y.", jvp=_pow_jvp)


def _balanced_select(x, y, tx, ty, x_wins):
    """Tangent of max/min: the winner's tangent, half of each on a tie (as autograd does)."""
    tx = F.zeros_like(x) if tx is None else tx
    ty = F.zeros_like(y) if ty is None else ty
    win = F.cast(x_wins, x.dtype)
    tie = F.cast(F.equal(x, y), x.dtype)
    wx = F.add(win, F.mul(0.5, tie))
    wy = F.sub(1.0, F.add(win, F.mul(0.5, tie)))
    return F.add(F.mul(tx, wx), F.mul(ty, wy))


maximum_p = elementwise_primitive(
    "max", _binary_numeric("max"), np.maximum, "Elementwise larger of x and y.",
    jvp=lambda p, t, o: [_balanced_select(p[0], p[1], t[0], t[1], F.greater(p[0], p[1]))])

minimum_p = elementwise_primitive(
    "min", _binary_numeric("min"), np.minimum, "Elementwise smaller of x and y.",
    jvp=lambda p, t, o: [_balanced_select(p[0], p[1], t[0], t[1], F.less(p[0], p[1]))])

equal_p = elementwise_primitive("eq", _compare("eq"), np.equal, "x == y.", jvp=zero_jvp)
not_equal_p = elementwise_primitive("ne", _compare("ne"), np.not_equal, "x != y.", jvp=zero_jvp)
less_p = elementwise_primitive("lt", _compare("lt"), np.less, "x < y.", jvp=zero_jvp)
less_equal_p = elementwise_primitive("le", _compare("le"), np.less_equal, "x <= y.", jvp=zero_jvp)
greater_p = elementwise_primitive("gt", _compare("gt"), np.greater, "x > y.", jvp=zero_jvp)
greater_equal_p = elementwise_primitive("ge", _compare("ge"), np.greater_equal, "x >= y.", jvp=zero_jvp)


def _logical_rule(name):
    def rule(x, y):
        _same_type(name, x, y)
        if x.dtype.kind != "b":
            raise DTypeError(f"{name}: needs bool operands, got {dtype_name(x.dtype)}")
        return [(x.shape, x.dtype)]
    return rule


logical_and_p = elementwise_primitive("logical_and", _logical_rule("logical_and"), np.logical_and,
                        "x & y for bool.", jvp=zero_jvp)
logical_or_p = elementwise_primitive("logical_or", _logical_rule("logical_or"), np.logical_or,
                       "x | y for bool.", jvp=zero_jvp)


# -- select and cast -----------------------------------------------------------

def _where_rule(c, x, y):
    _same_type("where", x, y)
    if c.dtype.kind != "b":
        raise DTypeError(f"where: the condition must be bool, got {dtype_name(c.dtype)}; "
                         "compare first (c != 0)")
    if c.shape != x.shape:
        raise ShapeError(f"where: condition shape {c.shape} differs from operand shape {x.shape}")
    return [(x.shape, x.dtype)]


def _where_jvp(p, t, o):
    c, x, y = p
    if t[1] is None and t[2] is None:
        return [None]
    tx = F.zeros_like(x) if t[1] is None else t[1]
    ty = F.zeros_like(y) if t[2] is None else t[2]
    return [F.where(c, tx, ty)]


def _where_transpose(ct, c, x, y):
    zero = F.zeros_like(ct[0])
    return [None,
            F.where(c, ct[0], zero) if isinstance(x, Linear) else None,
            F.where(c, zero, ct[0]) if isinstance(y, Linear) else None]


def _where_impl(c, x, y):
    """``np.where``, but branch-free for 4-byte dtypes on large arrays.

    ``np.where`` branches per element, so on a random mask (a ReLU's) it runs
    at misprediction speed: 58 us for 16K float32, against 13 us for this
    bit blend ``(x & m) | (y & ~m)`` with ``m`` all ones where ``c`` holds --
    the same bits, NaN and infinities included.  (For 8-byte dtypes the blend
    measured slower, so they keep ``np.where``.)
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.itemsize != 4 or x.dtype != y.dtype or np.size(c) < 4096:
        return np.where(c, x, y)
    m = np.asarray(c).astype(np.uint32)
    np.negative(m, out=m)
    out = np.bitwise_and(x.view(np.uint32), m)
    out |= np.bitwise_and(y.view(np.uint32), np.invert(m, out=m))
    return out.view(x.dtype)


where_p = elementwise_primitive("where", _where_rule, _where_impl,
                  "c ? x : y elementwise; linear in x and y.", jvp=_where_jvp,
                  transpose=_where_transpose)


def _cast_rule(x, *, dtype):
    return [(x.shape, dtype)]


def _cast_impl(x, *, dtype):
    x = np.asarray(x)
    if x.dtype.kind == "c" and dtype.kind != "c":       # the real part (NumPy's, without its warning)
        x = x.real
    return x.astype(dtype, copy=False)


def _cast_jvp(p, t, o, *, dtype):
    if t[0] is None or dtype.kind not in "fc":
        return [None]
    return [F.cast(t[0], dtype)]


cast_p = elementwise_primitive("cast", _cast_rule, _cast_impl,
                 "Convert to another dtype; linear between floating dtypes.",
                 jvp=_cast_jvp,
                 transpose=lambda ct, x, *, dtype: [F.cast(ct[0], x.dtype)])
