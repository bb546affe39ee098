"""What a primitive is, and how it is bound into the IR.

A :class:`Primitive` gathers everything about one operation in one place:
its shape/dtype rule, its NumPy implementation (the reference semantics every
backend must match), its JVP rule written with other primitives, and -- for a
linear primitive -- its transpose rule.  Reverse mode is then "linearize and
transpose", so no primitive needs a hand-written backward kernel.
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys

from ..ir import Eqn, Scope, Var

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Every primitive by name; ``vkml.ops.PRIMITIVES`` is the whole instruction set.
PRIMITIVES: dict[str, "Primitive"] = {}


class Primitive:
    """One operation of the IR.

    Attributes set by each primitive's block (see ``elementwise.py`` etc.):

    - ``abstract(*in_vars, **params) -> [(shape, dtype), ...]``: the shape/dtype
      rule; it raises a ``VkmlError`` naming the op for operands that do not fit.
    - ``impl(*arrays, **params)``: NumPy reference implementation.
    - ``jvp(primals, tangents, outs, **params) -> tangents_out``: tangents are
      Vars or ``None`` (a symbolic zero); written with primitives.
    - ``transpose(cts, *args, **params) -> cts_in``: only for linear
      primitives; ``args`` holds a :class:`Linear` marker for each operand the
      primitive is linear in and the Var itself for the others.
    - ``batch(args, dims, **params) -> (outs, out_dims)``: the vmap rule.
    - ``partial_eval(eqn, args, unknown, to_unknown)``: only for primitives
      holding programs (scan, call), to split an equation whose operands are
      partly known (see ``transforms.ad.partial_eval``).
    """

    multiple_results = False
    #: elementwise primitives fuse into one ``Map`` in printed programs.
    elementwise = False

    def __init__(self, name: str, *, multiple_results=False, elementwise=False, doc=""):
        self.name = name
        self.multiple_results = multiple_results
        self.elementwise = elementwise
        self.__doc__ = doc
        self.abstract = None
        self.impl = None
        self.jvp = None
        self.transpose = None
        self.batch = None
        self.partial_eval = None
        if name in PRIMITIVES:
            raise ValueError(f"primitive {name!r} registered twice")
        PRIMITIVES[name] = self

    def __repr__(self):
        return f"<primitive {self.name}>"

    def __reduce__(self):
        return (_lookup, (self.name,))


def _lookup(name):
    return PRIMITIVES[name]


class Linear:
    """Stands for an operand a linear primitive is transposed in (JAX's UndefinedPrimal)."""

    __slots__ = ("shape", "dtype", "device")

    def __init__(self, var_or_aval):
        self.shape, self.dtype, self.device = (
            var_or_aval.aval if isinstance(var_or_aval, (Var, Linear)) else var_or_aval)

    @property
    def aval(self):
        return (self.shape, self.dtype, self.device)


_INSIDE = {}  # code object -> whether it belongs to the vkml package


def user_site():
    """Where the user's line is: the first frame outside the vkml package, as (code, line).

    Kept as a pair and formatted only when an error names it (``ir.site_text``):
    this runs on every bind, so it must cost next to nothing.
    """
    frame = sys._getframe(2)
    inside = _INSIDE
    while frame is not None:
        code = frame.f_code
        known = inside.get(code)
        if known is None:
            known = inside[code] = code.co_filename.startswith(_PACKAGE_DIR)
        if not known:
            return (code, frame.f_lineno)
        frame = frame.f_back
    return None


_FROM_CONTEXT = object()


def bind_at(where, prim: Primitive, args, params, scope=_FROM_CONTEXT):
    """Apply ``prim`` to Vars ``args``: check shapes, make the Eqn and its output Vars.  The
    Eqn's scope is the module being called now (``CURRENT_SCOPE``) unless ``scope`` says."""
    out_types = prim.abstract(*args, **params)
    device = args[0].device if args else "CPU"
    eqn = Eqn(prim, tuple(args), None, params, where,
              CURRENT_SCOPE.get() if scope is _FROM_CONTEXT else scope)
    outs = [Var(shape, dtype, device, eqn) for shape, dtype in out_types]
    eqn.outputs = tuple(outs)
    return outs if prim.multiple_results else outs[0]


#: the module (an ``ir.Scope``) whose forward is running now in this thread or task, or None:
#: every bind records it (``Eqn.scope``), so a picture can draw a layer as one box
CURRENT_SCOPE = contextvars.ContextVar("vkml_scope", default=None)

#: the user's line for the binds of the op being built (set through ``vkml.runtime.source_site``
#: once per op, so a composite op of many primitives walks the stack once); None: find it per
#: bind.  One per thread and asyncio task: another thread's op never borrows this one's line.
CURRENT_SITE = contextvars.ContextVar("vkml_source_site", default=None)


def quiet_function(fn):
    """``fn`` (on Vars) with its equations made in a quiet :class:`~vkml.ir.Scope` of its name:
    a recipe whose branches are all computed and then chosen between (``where``), so an unused
    branch may overflow or divide by zero; NumPy's warnings about those would be noise."""
    @functools.wraps(fn)
    def in_scope(*args, **kwargs):
        token = CURRENT_SCOPE.set(Scope(CURRENT_SCOPE.get(), fn.__name__, f"{fn.__name__}()",
                                        quiet=True))
        try:
            return fn(*args, **kwargs)
        finally:
            CURRENT_SCOPE.reset(token)
    return in_scope


def current_site():
    """The user's line the binds made now name: the one set for the op being built, else the
    first frame outside vkml."""
    return CURRENT_SITE.get() or user_site()


def bind(prim: Primitive, *args, **params):
    """Bind ``prim`` at the user's current line (the line error messages will name)."""
    return bind_at(CURRENT_SITE.get() or user_site(), prim, args, params)


def rebind(eqn: Eqn, args, **overrides):
    """Apply ``eqn``'s primitive to new operands, keeping its params and source line."""
    params = dict(eqn.params, **overrides) if overrides else eqn.params
    return bind_at(eqn.where, eqn.prim, tuple(args), params, eqn.scope)
