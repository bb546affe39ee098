"""Gradients through a graph of per-sample kernels.

- ``kernel``: per-sample functions, ``Param`` uniforms, ``bind`` -> launch nodes
- ``graph``: ``Graph``, ``skippable``, ``repeat_while``, ``opaque``, ``reduce``, ``SkipGuard``
- ``record``: running a graph and the ``Record`` a recording launch keeps
- ``diff``: ``reverse``, ``Reverse``, ``Gradients`` (``vkml.diff``)
- ``simulation``: ``simulation``/``until_done`` with checkpointed reverses under a memory budget
- ``treesum``: the canonical tree every sum over samples uses
"""

from . import diff
from .graph import Graph
from .nodes import Opaque, Reduce, RepeatWhile, SkipGuard, Skippable, opaque, reduce, repeat_while, skippable
from .kernel import Kernel, Launch, Param, kernel
from .record import Record
from .simulation import Simulation, SimulationRecord, simulation, until_done
from .treesum import tree_sum

__all__ = ["Graph", "Kernel", "Launch", "Opaque", "Param", "Record", "Reduce", "RepeatWhile",
           "SkipGuard", "Skippable", "diff", "kernel", "opaque", "reduce", "repeat_while", "skippable",
           "tree_sum", "Simulation", "SimulationRecord", "simulation", "until_done"]
