"""The primitives (``PRIMITIVES``) and the operations built on them (``api``).

Modules, one family each: ``elementwise``, ``reductions``, ``movement``,
``linalg``, and for the NumPy namespace ``special`` (log1p, expm1, erf,
atan2, fmod, round), ``sorting`` (argsort, cumsum) and ``factorizations``
(solve, slogdet, cholesky), ``decompositions`` (eigh, svd, qr) and ``checks`` (a run-time check inside programs:
what warns when a bounded ``while_loop`` is cut short); ``numeric`` composes NumPy's functions from all
of them; ``core`` says what a primitive is; ``api`` is what users and
rules call.  Each primitive's rules are written with ``api`` functions (each
family module imports it as ``F``), and ``api`` is built on the primitives:
so ``api`` is imported first here, and the families it imports find it, still
loading, in ``sys.modules`` -- they call it only inside their rules.
"""

from . import api  # first: see above
from . import checks, elementwise, factorizations, linalg, movement, reductions, sorting, special
from . import bitwise, complex_parts, convolution, decompositions, fft
from . import numeric  # NumPy's functions, composed
from .core import PRIMITIVES, Linear, Primitive, bind, bind_at, rebind

__all__ = ["PRIMITIVES", "Linear", "Primitive", "api", "bind", "bind_at", "rebind"]
