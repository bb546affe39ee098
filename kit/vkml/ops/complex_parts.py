"""The parts of complex numbers: ``real``, ``imag``, ``conj`` and the magnitude ``abs``.

Derivatives follow JAX's convention: a derivative program is the same
linear map a real one would be, with no conjugation added by the
transposition, so ``grad`` of a real-valued function of a complex ``z``
gives ``df/dx - i df/dy`` (for ``|z|**2`` that is ``2 conj(z)``; PyTorch
returns the conjugate of this).  Holomorphic functions (``exp``, ``log``,
``sin``, products, sums) need nothing new: their real derivative formulas
hold for complex numbers.  What is not holomorphic is here:

- ``real``: tangent ``real(t)``; its transpose makes the cotangent the real
  part of a complex one, ``complex(ct, 0)``.
- ``imag``: tangent ``imag(t)``; transpose ``-i ct``.
- ``conj``: tangent ``conj(t)``; transpose ``conj(ct)``.
- ``abs`` of a complex number: real, with tangent ``real(conj(z) t) / |z|``
  (0 at 0, as the real ``abs``'s derivative is there).
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError
from ..ir import dtype_name
from . import api as F
from .core import bind
from .elementwise import elementwise_primitive

#: complex dtype -> the dtype of its parts
PART = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}
#: real dtype -> the complex dtype with parts of it
WHOLE = {v: k for k, v in PART.items()}


def _complex_in(name, to_part):
    def rule(x):
        if x.dtype.kind != "c":
            raise DTypeError(f"{name}: needs a complex operand, got {dtype_name(x.dtype)}; "
                             f"vkml.numpy.{name} handles real ones")
        return [(x.shape, PART[x.dtype] if to_part else x.dtype)]
    return rule


real_p = elementwise_primitive(
    "real", _complex_in("real", True), np.real, "The real part of complex numbers.",
    jvp=lambda p, t, o: [real(t[0])],
    transpose=lambda ct, x: [F.cast(ct[0], WHOLE[ct[0].dtype])])

imag_p = elementwise_primitive(
    "imag", _complex_in("imag", True), np.imag, "The imaginary part of complex numbers.",
    jvp=lambda p, t, o: [imag(t[0])],
    transpose=lambda ct, x: [F.mul(F.cast(ct[0], WHOLE[ct[0].dtype]), -1j)])

conj_p = elementwise_primitive(
    "conj", _complex_in("conj", False), np.conj, "The complex conjugate.",
    jvp=lambda p, t, o: [conj(t[0])],
    transpose=lambda ct, x: [conj(ct[0])])


def _abs_jvp(p, t, o):
    z, mag = p[0], o[0]
    zero = F.equal(mag, 0.0)
    unit = F.div(conj(z), F.cast(F.where(zero, 1.0, mag), z.dtype))     # conj(z) / |z|
    return [real(F.mul(unit, t[0]))]


complex_abs_p = elementwise_primitive(
    "complex_abs", _complex_in("abs", True), np.abs,
    "|z| of complex numbers (a real result), computed without overflow as hypot(re, im).",
    jvp=_abs_jvp)


def _derivative(name, z):
    """d/dz of the holomorphic function ``name`` at ``z`` (its real formula, in complex)."""
    one = F.ones_like(z)
    if name == "arcsin":
        return F.div(one, F.sqrt(F.sub(one, F.mul(z, z))))
    if name == "arccos":
        return F.neg(F.div(one, F.sqrt(F.sub(one, F.mul(z, z)))))
    if name == "arctan":
        return F.div(one, F.add(one, F.mul(z, z)))
    if name == "arcsinh":
        return F.div(one, F.sqrt(F.add(F.mul(z, z), one)))
    if name == "arccosh":
        return F.div(one, F.mul(F.sqrt(F.sub(z, one)), F.sqrt(F.add(z, one))))
    if name == "arctanh":
        return F.div(one, F.sub(one, F.mul(z, z)))
    if name == "sinh":
        return complex_math("cosh", z)
    if name == "cosh":
        return complex_math("sinh", z)
    if name == "tan":
        t = complex_math("tan", z)
        return F.add(one, F.mul(t, t))
    raise KeyError(name)


#: the functions of complex numbers taken from NumPy as they are: NumPy follows C99's rules for
#: their branch cuts, infinities and NaNs, which composing them from exp and log would not
COMPLEX_MATH = ("arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "sinh", "cosh",
                "tan")


def _complex_math_rule(x, *, name):
    if x.dtype.kind != "c":
        raise DTypeError(f"{name}: this form is for complex operands, got {dtype_name(x.dtype)}")
    return [(x.shape, x.dtype)]


complex_math_p = elementwise_primitive(
    "complex_math", _complex_math_rule, lambda x, *, name: getattr(np, name)(x),
    "NumPy's function ``name`` of complex numbers (arcsin ... tan); derivative its real formula.",
    jvp=lambda p, t, o, *, name: [F.mul(t[0], _derivative(name, p[0]))])


def complex_math(name, x):
    return bind(complex_math_p, x, name=name)


def _make_complex_rule(re, im):
    if re.dtype != im.dtype or re.dtype not in WHOLE or re.shape != im.shape:
        raise DTypeError(f"complex: needs two float arrays of one shape and dtype, got "
                         f"{re.type_str()} and {im.type_str()}")
    return [(re.shape, WHOLE[re.dtype])]


def _make_complex_impl(re, im):
    out = np.empty(re.shape, WHOLE[re.dtype])
    out.real, out.imag = re, im          # not re + 1j * im: a NaN or inf part stays in its place
    return out


make_complex_p = elementwise_primitive(
    "make_complex", _make_complex_rule, _make_complex_impl,
    "The complex numbers re + i im from their parts; linear in both (transpose: real, -imag).",
    jvp=lambda p, t, o: [make_complex(F.zeros_like(p[0]) if t[0] is None else t[0],
                                      F.zeros_like(p[1]) if t[1] is None else t[1])],
    transpose=lambda ct, re, im: [real(ct[0]), F.neg(imag(ct[0]))])


def make_complex(re, im):
    return bind(make_complex_p, re, im)


def real(x):
    x = F.as_var(x)
    return bind(real_p, x) if x.dtype.kind == "c" else x


def imag(x):
    x = F.as_var(x)
    return bind(imag_p, x) if x.dtype.kind == "c" else F.zeros_like(x)


def conj(x):
    x = F.as_var(x)
    return bind(conj_p, x) if x.dtype.kind == "c" else x


def complex_abs(x):
    return bind(complex_abs_p, x)
