"""Starting a cluster on this machine for notebooks and tests; any other Client works the same."""

from __future__ import annotations

from ..validate import check_int
from .engine import dask, distributed

#: Dask starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which also turns off glibc's
#: adaptive mmap threshold: then every large NumPy temporary (a kernel's step over a block of
#: samples makes dozens) is mapped from the OS and faulted in afresh.  Measured here: a block's
#: simulation took twice the CPU time in such a worker as in a plain process.  ``local()`` leaves
#: glibc's default; for another cluster, set this config key to None where it starts.
TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"


def local(n_workers=2, threads_per_worker=1, *, dashboard=True, processes=True, **kwargs):
    """A ``dask.distributed`` LocalCluster of ``n_workers`` worker processes, each running
    ``threads_per_worker`` tasks at once, listening on 127.0.0.1 only (its dashboard too, on a
    free port; ``dashboard=False`` starts none); returns its Client (``client.dashboard_link``).
    ``client.shutdown()`` stops the workers and the scheduler.  Other keywords go to LocalCluster
    (``memory_limit=`` sets each worker's, which the default memory budget follows; ``env=``
    the workers' environment).  The workers keep glibc's own memory trimming (see ``TRIM_KEY``)."""
    n_workers = check_int(n_workers, "n_workers", "vkml.distributed.local", low=1)
    threads_per_worker = check_int(threads_per_worker, "threads_per_worker", "vkml.distributed.local",
                                   low=1)
    # the scheduler serves HTTP (health checks) even without a dashboard: on a free port of
    # 127.0.0.1 either way, never on a fixed one another cluster may hold
    scheduler_kwargs = dict(kwargs.pop("scheduler_kwargs", None) or {})
    scheduler_kwargs.setdefault("dashboard", bool(dashboard))
    with dask.config.set({TRIM_KEY: None}):
        cluster = distributed.LocalCluster(
            n_workers=n_workers, threads_per_worker=threads_per_worker, processes=processes,
            host="127.0.0.1", dashboard_address="127.0.0.1:0", scheduler_kwargs=scheduler_kwargs,
            **kwargs)
    return distributed.Client(cluster)
