"""The C library's math functions the compiled tiers call: one table that every renderer and check
reads (the declarations of the generated C, the lowering rules, libmvec's vector versions, and
which programs may differ from NumPy in the last bits).

Adding an elementwise libm primitive is one entry here (with ``primitive=True``) beside its
``ops`` definition; the rule table, the C declarations and the checks follow from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LibmFunction:
    """One C function: ``name`` on doubles, ``name + "f"`` on floats."""
    name: str
    arity: int = 1
    #: correctly rounded by IEEE 754 (sqrt, fmod) or exact (fabs, floor, ...): the same bits as
    #: NumPy on every machine; the others are within a few ulps of NumPy's, not bit for bit
    exact: bool = False
    #: glibc's vector math library (libmvec) has vector versions of it on x86-64
    vector: bool = False
    #: a vkml primitive of the same name lowers to a call of it (the others are called by rules
    #: of other primitives: ``abs``, ``pow``'s integer cases, ``round``'s modes)
    primitive: bool = True


LIBM = {f.name: f for f in (
    LibmFunction("exp", vector=True),
    LibmFunction("log", vector=True),
    LibmFunction("sin", vector=True),
    LibmFunction("cos", vector=True),
    LibmFunction("tanh", vector=True),
    LibmFunction("log1p", vector=True),
    LibmFunction("expm1", vector=True),
    LibmFunction("erf", vector=True),
    LibmFunction("erfc"),
    LibmFunction("lgamma"),
    LibmFunction("atan2", 2, vector=True),
    LibmFunction("pow", 2, vector=True, primitive=False),
    LibmFunction("sqrt", exact=True),
    LibmFunction("fmod", 2, exact=True),
    LibmFunction("fabs", exact=True, primitive=False),
    LibmFunction("floor", exact=True, primitive=False),
    LibmFunction("ceil", exact=True, primitive=False),
    LibmFunction("rint", exact=True, primitive=False),
    LibmFunction("trunc", exact=True, primitive=False),
)}

#: primitives lowered to a call of the libm function of the same name
PRIMITIVE_CALLS = tuple(f.name for f in LIBM.values() if f.primitive)

#: primitives whose C lowering calls a libm function that is not exact, where NumPy may use its
#: own (SIMD) implementation: within a few ulps of each other, not bit for bit (``pow`` is a
#: primitive too, lowered by its own rule to ``pow``)
INEXACT_PRIMITIVES = frozenset(f.name for f in LIBM.values() if not f.exact)


def declarations() -> str:
    """The C declarations of every function of the table, double and float (the generated code
    includes no header: parsing system headers is most of a small compile's time)."""
    lines = []
    for suffix, ctype in (("", "double"), ("f", "float")):
        lines.append(" ".join(f"{ctype} {f.name}{suffix}({', '.join([ctype] * f.arity)});"
                              for f in LIBM.values()))
    return "\n".join(lines) + "\n"


def vector_math() -> dict:
    """The C names with libmvec vector versions: name -> (C type, number of arguments)."""
    return {f"{f.name}{suffix}": (ctype, f.arity) for f in LIBM.values() if f.vector
            for suffix, ctype in (("", "double"), ("f", "float"))}
