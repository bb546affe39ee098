"""``vkml.scipy``: the SciPy names NumPy users reach for next (``special`` and ``linalg``)."""

from . import linalg, special

__all__ = ["linalg", "special"]
