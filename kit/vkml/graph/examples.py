"""The two kernels the graph wing's docstring examples use, defined once.

Every example in ``vkml.graph``'s docstrings runs with these names already defined (the docs test
puts them in each example's namespace); to run one yourself, import them first::

    >>> from vkml.graph.examples import drift, wave
    >>> wave.inputs, wave.params, drift.inputs
    (['x'], ['k'], ['x', 'v'])

``wave`` maps each sample's ``x`` to ``y = sin(k x)``; ``drift`` is one explicit Euler step of a
spring (position ``x``, velocity ``v``, stiffness ``k``), the step the simulation examples repeat.
"""

from __future__ import annotations

from ..tensor import sin
from .kernel import Param, kernel

__all__ = ["wave", "drift"]


@kernel
def wave(x, k: Param):
    """``y = sin(k x)`` per sample."""
    return {"y": sin(k * x)}


@kernel
def drift(x, v, k: Param):
    """One Euler step of a spring: ``x += 0.1 v``, ``v -= 0.1 k x``."""
    return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
