"""Bitwise operations on integers and bools: and, or, xor, invert and the shifts.

Each is an elementwise primitive with NumPy's semantics (a shift by as many
bits as the type has or more gives 0, or -1 for a negative number shifted
right); none has a derivative.  The compiled tiers hand a program holding one
to NumPy (``backends/codegen/rules.py`` says so).
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..ir import dtype_name
from . import api as F
from .core import bind
from .elementwise import elementwise_primitive, zero_jvp


def _integer_rule(name, shift=False):
    def rule(*xs):
        x0 = xs[0]
        for x in xs:
            if x.dtype.kind not in ("iu" if shift else "biu"):
                raise DTypeError(f"{name}: needs integer{'' if shift else ' or bool'} operands, "
                                 f"got {dtype_name(x.dtype)}; cast with .astype(np.int64)")
        return [(x0.shape, x0.dtype)]
    return rule


def _shift(np_fn):
    def impl(x, y):
        bits = x.dtype.itemsize * 8
        big = (y < 0) | (y >= bits)
        out = np_fn(x, np.where(big, 0, y).astype(x.dtype))
        if np_fn is np.left_shift:
            return np.where(big, np.zeros_like(x), out)
        return np.where(big, np.where(x < 0, -1, 0).astype(x.dtype), out)
    return impl


bitwise_and_p = elementwise_primitive("bitwise_and", _integer_rule("bitwise_and"), np.bitwise_and,
                                      "x & y, bit by bit.", jvp=zero_jvp)
bitwise_or_p = elementwise_primitive("bitwise_or", _integer_rule("bitwise_or"), np.bitwise_or,
                                     "x | y, bit by bit.", jvp=zero_jvp)
bitwise_xor_p = elementwise_primitive("bitwise_xor", _integer_rule("bitwise_xor"), np.bitwise_xor,
                                      "x ^ y, bit by bit.", jvp=zero_jvp)
invert_p = elementwise_primitive("invert", _integer_rule("invert"), np.invert,
                                 "~x, every bit flipped (not, for bools).", jvp=zero_jvp)
left_shift_p = elementwise_primitive("left_shift", _integer_rule("left_shift", True),
                                     _shift(np.left_shift), "x << y.", jvp=zero_jvp)
right_shift_p = elementwise_primitive("right_shift", _integer_rule("right_shift", True),
                                      _shift(np.right_shift), "x >> y (arithmetic for signed).",
                                      jvp=zero_jvp)

PRIMITIVES = ("bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift")


def bitwise_and(x, y):
    return F.bind_elementwise(bitwise_and_p, x, y)


def bitwise_or(x, y):
    return F.bind_elementwise(bitwise_or_p, x, y)


def bitwise_xor(x, y):
    return F.bind_elementwise(bitwise_xor_p, x, y)


def invert(x):
    return bind(invert_p, F.as_var(x))


def left_shift(x, y):
    return F.bind_elementwise(left_shift_p, x, y)


def right_shift(x, y):
    return F.bind_elementwise(right_shift_p, x, y)
