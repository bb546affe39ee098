"""The primitives (``PRIMITIVES``) and the operations built on them (``api``).

Modules, one family each: ``elementwise``, ``reductions``, ``movement``,
``linalg``; ``core`` says what a primitive is; ``api`` is what users and
rules call.  Each primitive's rules are written with ``api`` functions, so
the family modules get ``api`` bound as ``F`` once everything is defined.
"""

from . import api, elementwise, linalg, movement, reductions
from .core import PRIMITIVES, Linear, Primitive, bind, bind_at, rebind

for _family in (elementwise, reductions, movement, linalg):
    _family.F = api

__all__ = ["PRIMITIVES", "Linear", "Primitive", "api", "bind", "bind_at", "rebind"]
