"""Gradients through a graph of per-sample kernels.

The modules, lowest first (each imports only the ones before it):

- ``treesum``, ``versions``: the canonical tree every sum over samples uses; plane versions
- ``reversible``: the interface a forward offers ``vkml.diff.Reverse``
- ``execute``: all-or-nothing runs, batched runs over threads, run errors, a graph's caches
- ``kernel``: per-sample functions, ``Param`` uniforms, ``bind`` -> launch nodes
- ``nodes``: ``skippable``, ``repeat_while``, ``opaque``, ``reduce``, ``SkipGuard``
- ``device``: programs on device-resident planes
- ``record``: the ``Record`` a recording launch keeps
- ``run``: a launch of a graph (fused into one program, or node by node)
- ``diff``: ``reverse``, ``Reverse``, ``Gradients`` (``vkml.diff``): the reverse protocol
- ``graph_reverse``: the sweep of a Graph's tape
- ``graph``: ``Graph``
- ``simulation`` (a package): ``simulation``/``until_done`` with checkpointed reverses under a
  memory budget, one stepper per way of running, and the checkpoint ``schedules`` (also
  ``vkml.graph.schedules``)
- ``examples``: the ``wave`` and ``drift`` kernels the docstring examples use (import them from
  here to run an example yourself)
"""

from . import diff
from .graph import Graph
from .nodes import Opaque, Reduce, RepeatWhile, SkipGuard, Skippable, opaque, reduce, repeat_while, skippable
from .kernel import Kernel, Launch, Param, kernel
from .record import Record
from .simulation import Simulation, SimulationRecord, schedules, simulation, until_done
from .treesum import tree_sum

__all__ = ["Graph", "Kernel", "Launch", "Opaque", "Param", "Record", "Reduce", "RepeatWhile",
           "SkipGuard", "Skippable", "diff", "kernel", "opaque", "reduce", "repeat_while", "skippable",
           "tree_sum", "Simulation", "SimulationRecord", "simulation", "until_done", "schedules"]
