"""Transformations: interpreters over Programs (jvp, partial evaluation, transpose, ...).

None of them knows about Tensor, widgets or backends: each walks a Program's
equations and emits new ones with the primitives' rules.
"""

from .ad import jvp_program, partial_eval, transpose_program, vjp_program
from .interpret import inline

__all__ = ["inline", "jvp_program", "partial_eval", "transpose_program", "vjp_program"]
from .vmap import vmap_program  # noqa: E402

__all__.append("vmap_program")
