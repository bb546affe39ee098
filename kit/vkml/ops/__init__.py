"""The primitives (``PRIMITIVES``) and the operations built on them (``api``).

Modules, one family each: ``elementwise``, ``reductions``, ``movement``,
``linalg``, and for the NumPy namespace ``special`` (log1p, expm1, erf,
atan2, fmod, round), ``sorting`` (argsort, cumsum) and ``factorizations``
(solve, slogdet, cholesky), and ``checks`` (a run-time check inside programs:
what warns when a bounded ``while_loop`` is cut short); ``numeric`` composes NumPy's functions from all
of them; ``core`` says what a primitive is; ``api`` is what users and
rules call.  Each primitive's rules are written with ``api`` functions, so
the family modules get ``api`` bound as ``F`` once everything is defined.
"""

from . import api, elementwise, linalg, movement, reductions
from . import checks, factorizations, sorting, special
from .core import PRIMITIVES, Linear, Primitive, bind, bind_at, rebind

for _family in (elementwise, reductions, movement, linalg, special, sorting, factorizations,
                checks):
    _family.F = api

from . import numeric  # noqa: E402  (NumPy's functions, composed; after F is bound)

__all__ = ["PRIMITIVES", "Linear", "Primitive", "api", "bind", "bind_at", "rebind"]
