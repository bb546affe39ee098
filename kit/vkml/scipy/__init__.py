"""``vkml.scipy``: the SciPy names NumPy users reach for next (``vkml.scipy.special``)."""

from . import special

__all__ = ["special"]
