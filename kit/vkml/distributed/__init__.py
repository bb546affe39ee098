"""Graphs and simulations sharded over samples on Dask, with the same bits as one process.

Samples never meet in a graph of per-sample kernels, and every Param gradient is a sum over
samples, so a graph or a recorded simulation splits over samples across machines -- except for
the sums, which vkml promises bit for bit.  This package runs them on ``dask.distributed`` (a
LocalCluster on a laptop, the same Client on a cluster) and keeps that promise::

    import vkml.distributed as vd
    client = vd.local(n_workers=2)                 # or any dask.distributed.Client

    def make(planes):                              # runs on the workers, once per block
        g = vkml.Graph()
        g.add(wave.bind(u=planes["u"], y=np.zeros(len(planes["u"])), k=1.5))
        return g

    sg = vd.Sharded(make, {"u": u}, record=True)   # u: a NumPy or Dask array, one row per sample
    sg.launch()
    sg.plane("y")                                  # a Dask array, left on the workers
    grads = sg.reverse({"y": np.ones(n)})          # grads["u"]: a Dask array; grads["k"]: NumPy

The rules, in plain words:

- **Blocks.**  vkml cuts the samples into aligned blocks of ``block`` samples (a power of two:
  block ``i`` holds samples ``[i*block, (i+1)*block)``), whatever chunks the planes came in; a
  Dask array is rechunked to them.  Each block is one subtree of the canonical tree every sum
  over samples uses, so the blocks' Param sums, summed again with that tree, give the
  one-process bits -- for any block size, worker count, thread count and memory budget.
  Per-sample values never mix samples and are the same bits anyway.
- **State stays where it was made.**  A block's Graph (or simulation) and its Record are the
  result of a pure task (its inputs -> build -> launch) kept on its worker; the reverse is a task
  on that result.  If a worker dies, Dask runs the lost tasks again from the task graph and the
  result is the same bits.  NumPy planes travel inside the tasks (so they can be rebuilt); data
  too large for that should come as Dask arrays the workers load themselves.
- **All or nothing.**  A block that raises a ``VkmlError`` fails the whole call; the error names
  the block's samples, every task of the call is released (no block keeps a Record of a failed
  launch), and the previous launch stays current.  Records follow the one-process rules: a live
  Record refuses the next launch and ``update``; a later launch makes it stale unless kept.
- **Memory.**  ``memory_budget`` is per block; by default a block gets half its worker's memory
  limit shared by the worker's threads.  Checkpointing (``window``, ``"binomial"``) works per
  block, inside each block's simulation.  ``grads.report`` gives chunks, recomputed steps and
  the peak memory of each worker.  ``local()`` starts its workers without Dask's
  ``MALLOC_TRIM_THRESHOLD_`` (it made every NumPy temporary a fresh mapping from the OS: twice
  the CPU time per step); on a cluster you start yourself, set
  ``distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_`` to None (``cluster.TRIM_KEY``).
- **Not sharded.**  A ``reduce`` node sums over all samples inside the graph: refused (reduce
  the output with Dask instead).  A skippable or repeat_while guard must not depend on the
  block's samples: blocks that ran different steps are refused at the reverse.

Modules: ``engine`` (the Dask import), ``blocks`` (the block rule), ``tasks`` (what runs on the
workers), ``sharded`` (the client's side), ``gradients`` (combining the blocks' gradients),
``cluster`` (``local()``).  Install with ``pip install 'vkml-toolkit[distributed]'``; ``import vkml``
never imports Dask.
"""

from .engine import INSTALL
from .cluster import local
from .gradients import ShardedGradients, ShardedReport
from .sharded import Sharded, ShardedRecord

__all__ = ["INSTALL", "Sharded", "ShardedGradients", "ShardedRecord", "ShardedReport", "local"]
