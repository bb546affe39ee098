"""Starting a cluster on this machine for notebooks and tests; any other Client works the same."""

from __future__ import annotations

import os

from ..errors import ArgumentError
from ..validate import check_int
from .engine import dask, distributed

#: Dask starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which also turns off glibc's
#: adaptive mmap threshold: then every large NumPy temporary (a kernel's step over a block of
#: samples makes dozens) is mapped from the OS and faulted in afresh.  Measured here: a block's
#: simulation took twice the CPU time in such a worker as in a plain process.  ``local()`` leaves
#: glibc's default; for another cluster, set this config key to None where it starts.
TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
#: ``local()`` refuses more workers (and worker threads) than this many per core: each worker
#: is a process of its own, so 2**70 of them would grow until the machine stops it
MAX_PER_CORE = 8


def local(n_workers=2, threads_per_worker=1, *, dashboard=True, processes=True, **kwargs):
    """A ``dask.distributed`` LocalCluster of ``n_workers`` worker processes, each running
    ``threads_per_worker`` tasks at once (at most ``MAX_PER_CORE`` tasks per core in all;
    ``processes=False``: threads of this process, which open no socket), listening on 127.0.0.1 only (its dashboard too, on a
    free port; ``dashboard=False`` starts none); returns its Client (``client.dashboard_link``).
    ``client.shutdown()`` stops the workers and the scheduler.  Other keywords go to LocalCluster
    (``memory_limit=`` sets each worker's, which the default memory budget follows; ``env=``
    the workers' environment).  The workers keep glibc's own memory trimming (see ``TRIM_KEY``)."""
    cores = os.cpu_count() or 1
    n_workers = check_int(n_workers, "n_workers", "vkml.distributed.local", low=1,
                          high=MAX_PER_CORE * cores)
    threads_per_worker = check_int(threads_per_worker, "threads_per_worker", "vkml.distributed.local",
                                   low=1, high=MAX_PER_CORE * cores)
    if n_workers * threads_per_worker > MAX_PER_CORE * cores:
        raise ArgumentError(f"vkml.distributed.local: {n_workers} workers x {threads_per_worker} "
                            f"threads is more than {MAX_PER_CORE} tasks per core of this machine "
                            f"({cores} cores); use fewer (a worker per core is the usual choice), "
                            "or start a cluster of other machines and pass its Client")
    # the scheduler serves HTTP (health checks) even without a dashboard: on a free port of
    # 127.0.0.1 either way, never on a fixed one another cluster may hold
    scheduler_kwargs = dict(kwargs.pop("scheduler_kwargs", None) or {})
    scheduler_kwargs.setdefault("dashboard", bool(dashboard))
    # worker processes talk over TCP on 127.0.0.1; workers in this process (processes=False)
    # over Dask's in-process transport, which opens no socket at all
    where = {"host": "127.0.0.1"} if processes else {}
    with dask.config.set({TRIM_KEY: None}):
        cluster = distributed.LocalCluster(
            n_workers=n_workers, threads_per_worker=threads_per_worker, processes=processes,
            dashboard_address="127.0.0.1:0", scheduler_kwargs=scheduler_kwargs, **where, **kwargs)
    return distributed.Client(cluster)
