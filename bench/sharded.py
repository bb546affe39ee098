"""The recorded pendulum sharded over samples on a Dask LocalCluster, against one process.

The model is bench/simulation.py's damped pendulum (``_models.pendulum``: semi-implicit Euler,
dt = 0.01, ``length`` = 1.2 and ``damping`` = 0.3 as Params), theta0 = linspace(0.1, 1.0, n),
omega0 = linspace(-0.5, 0.5, n), every sample stopping at exactly T steps, recorded with the
default checkpoint window; seeds ``theta`` = 1, ``omega`` = 0.5.  n = 10^6 samples, T = 400
(``--quick``: 10^5 x 100).

- ``one process``: ``vkml.simulation(...).run()`` then ``vkml.diff.reverse`` -- one thread;
- ``dask, 2 workers``: ``vkml.distributed.Sharded(make, planes, record=True)`` on a LocalCluster
  of 2 single-threaded worker processes (127.0.0.1): ``launch()`` (the NumPy planes travel inside
  the tasks), then ``reverse`` with seeds made on the workers (``dask.array.full``).

Before anything is timed, both sides' gradients are checked to be the same bits (Param sums and
every per-sample gradient).  Rounds alternate the sides (``_timing.interleave``); each phase's time
is the minimum over rounds.  Thread variables are set to 1, but the process is not pinned: the
workers inherit the client's CPU binding, and they must have both cores.  The overhead per task is
measured on a graph too small to cost anything: 64 blocks of 8 samples, launch + reverse, divided
by the tasks it ran.  The closing note works out, from these numbers, a model on paper of 64
workers x 10^8 samples.

What it found: in a worker started with Dask's defaults a block's simulation took twice the CPU
time it takes in a plain process -- Dask sets ``MALLOC_TRIM_THRESHOLD_``, which makes every large
NumPy temporary a fresh mapping from the OS; ``vkml.distributed.local()`` now leaves glibc's
default (``cluster.TRIM_KEY``).  On a shared machine the speed-up follows the CPU the workers get,
which the bench prints next to it.

Run: ``python bench/sharded.py`` (about 3 minutes on 2 idle cores) or ``--quick`` (20 s).
Needs ``pip install 'vkml-toolkit[distributed]'``; without Dask it says so and exits 0.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import THREAD_VARS, interleave, print_table, sampler  # noqa: E402

for _var in THREAD_VARS:
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

import vkml  # noqa: E402
import _models  # noqa: E402
from _models import DAMPING, DT, LENGTH, pendulum  # noqa: E402

SEED_THETA, SEED_OMEGA = 1.0, 0.5

# this file is named like Dask's ``distributed`` package: with bench/ on the path, ``import
# distributed`` (here and in the worker processes, which inherit the path) would find it instead
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != BENCH]


def make(planes, memory_budget=None, steps=400):
    """One block's recorded pendulum (the same function builds the one-process side)."""
    n = planes["theta"].shape[0]
    return vkml.simulation(pendulum, max_steps=steps, record=True, memory_budget=memory_budget,
                           theta=planes["theta"], omega=planes["omega"], t=np.zeros(n),
                           length=LENGTH, damping=DAMPING, t_end=(steps - 0.5) * DT)


@vkml.kernel
def tiny(x, k: vkml.Param):
    return {"y": k * x}


def make_tiny(planes):
    return vkml.Graph().add(tiny.bind(x=planes["x"], y=np.zeros_like(planes["x"]), k=2.0))


class OneProcess:
    def __init__(self, planes, steps):
        self.planes, self.steps = planes, steps
        self.sim = None

    def reset(self):
        self.sim = make({k: v.copy() for k, v in self.planes.items()}, steps=self.steps)

    def launch(self):
        self.sim.run()

    def reverse(self):
        n = len(self.planes["theta"])
        self.grads = vkml.diff.reverse(self.sim.record, {"theta": np.full(n, SEED_THETA),
                                                         "omega": np.full(n, SEED_OMEGA)})


class OnDask:
    def __init__(self, vd, da, client, planes, steps):
        self.vd, self.da, self.client = vd, da, client
        self.planes, self.make = planes, functools.partial(make, steps=steps)
        self.sg = None

    def reset(self):
        self.sg = self.vd.Sharded(self.make, self.planes, client=self.client, record=True)

    def launch(self):
        self.sg.launch()

    def reverse(self):
        n, chunks = self.sg.n, self.sg.block
        self.grads = self.sg.reverse({"theta": self.da.full(n, SEED_THETA, chunks=chunks),
                                      "omega": self.da.full(n, SEED_OMEGA, chunks=chunks)})


def same_bits(a, b):
    for name in b:
        got = a[name].compute() if hasattr(a[name], "compute") else a[name]
        if np.asarray(got).tobytes() != np.asarray(b[name]).tobytes():
            return False
    return sorted(a) == sorted(b)


def task_overhead(vd, client):
    """Seconds per task of a launch + reverse of 64 blocks of 8 samples (nothing to compute)."""
    n = 64 * 8
    planes = {"x": np.linspace(0, 1, n)}
    sg = vd.Sharded(make_tiny, planes, client=client, record=True, block=8)

    def one():
        sg.launch()
        sg.reverse({"y": np.ones(n)})

    one()
    t0 = time.perf_counter()
    reps = 3
    for _ in range(reps):
        one()
    tasks = 64 * 3 + 1                  # launch, reverse, summary per block; one layout
    return (time.perf_counter() - t0) / reps / tasks


def message_sizes(steps):
    """Bytes of one block's launch task (the pickled make; NumPy planes not counted) and of what
    the client gathers from one block's reverse (its Param sums and report)."""
    import cloudpickle  # local: optional dependency (comes with Dask)
    from vkml.distributed.tasks import launch_shard, reverse_shard, summary  # local: after the Dask check
    n = 512
    planes = {"theta": np.linspace(0.1, 1.0, n), "omega": np.zeros(n)}
    mk = functools.partial(make, steps=steps)
    state = launch_shard(mk, planes, None, {}, True, None, 1, 0, n)
    res = reverse_shard(state, {"theta": np.ones(n), "omega": np.ones(n)}, None, None, False)
    return len(cloudpickle.dumps(mk)), len(pickle.dumps(summary(res)))


def paper_model(t_sample_step, overhead, make_bytes, summary_bytes, state_bytes, steps):
    """64 workers x 10^8 samples, from this machine's numbers (see the closing note)."""
    from vkml.distributed.blocks import block_size  # local: after the Dask check
    n, workers = 10 ** 8, 64
    size = block_size(n, workers)
    blocks = math.ceil(n / size)
    rounds = math.ceil(blocks / workers)
    busy = n / (rounds * size * workers)
    compute = rounds * size * steps * t_sample_step
    sched = 3 * blocks * overhead                  # the scheduler handles tasks one at a time
    one = n * steps * t_sample_step
    print("\nA model on paper: 64 single-threaded workers x 10^8 samples x", steps, "steps")
    print(f"  blocks of 2^{size.bit_length() - 1} = {size:,} samples: {blocks} blocks, {rounds} per "
          f"worker at most, {busy:.1%} of the workers' time busy")
    print(f"  bytes per reverse: {blocks} reverse tasks x ~{make_bytes + 200:,} B out, {blocks} "
          f"summaries x {summary_bytes:,} B back = {blocks * (make_bytes + 200 + summary_bytes) / 1e6:.1f} MB "
          "(seeds made on the workers; per-sample gradients stay there: gathering them would be "
          f"{2 * 8 * n / 1e9:.1f} GB)")
    print(f"  reduction: {math.ceil(math.log2(size))} levels of the tree inside each block (on its "
          f"worker), {math.ceil(math.log2(blocks))} over the blocks (on the client, {blocks} values "
          f"per Param): {math.ceil(math.log2(n))} levels, as in one process")
    print(f"  launch: the two input planes sent from the client would be {2 * 8 * n / 1e9:.1f} GB "
          "through the scheduler; as Dask arrays made on the workers (da.linspace, from_zarr), nothing")
    print(f"  memory per worker: {rounds} blocks' Records held from launch to reverse, "
          f"{rounds} x {size:,} samples x {state_bytes:,} B = {rounds * size * state_bytes / 1e9:.2f} GB")
    print(f"  time: one process {one / 3600:.1f} h; 64 workers {compute:.0f} s of compute + "
          f"~{sched:.1f} s of task overhead = {one / (compute + sched):.0f}x")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int)
    ap.add_argument("--steps", type=int)
    args, _ = ap.parse_known_args(argv)
    try:
        import dask.array as da
        import distributed  # noqa: F401
        import cloudpickle
        import vkml.distributed as vd
    except (ImportError, vkml.VkmlError) as err:
        print(f"bench/sharded.py: Dask is not installed ({err}); pip install 'vkml-toolkit[distributed]'")
        return 0
    cloudpickle.register_pickle_by_value(_models)          # the workers cannot import bench/
    n = args.n or (10 ** 5 if args.quick else 10 ** 6)
    steps = args.steps or (100 if args.quick else 400)
    rounds, warmup = (2, 1) if args.quick else (2, 0)
    planes = {"theta": np.linspace(0.1, 1.0, n), "omega": np.linspace(-0.5, 0.5, n)}
    print(f"bench/sharded.py: recorded pendulum, {n:,} samples x {steps} steps; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    client = vd.local(n_workers=2, threads_per_worker=1, dashboard=False)
    print(f"LocalCluster of 2 single-threaded workers started in {time.perf_counter() - t0:.1f} s")
    try:
        one, dsk = OneProcess(planes, steps), OnDask(vd, da, client, planes, steps)
        for side in (one, dsk):
            side.reset()
            side.launch()
            side.reverse()
        ok = same_bits(dsk.grads, one.grads)
        print(f"gradients: the same bits on both sides: {ok} (blocks of {dsk.sg.block:,}: "
              f"{len(dsk.sg.bounds)}); Param gradients {float(one.grads['length']):.17g}, "
              f"{float(one.grads['damping']):.17g}")
        if not ok:
            return 1
        report = dsk.grads.report
        best = interleave({"one process": sampler(one.launch, one.reverse, reps=1, between=one.reset),
                           "dask, 2 workers": sampler(dsk.launch, dsk.reverse, reps=1,
                                                      between=dsk.reset)},
                          rounds=rounds, warmup_rounds=warmup)
        rows = []
        for name, (fwd, rev) in best.items():
            rows += [(f"{name}: launch", fwd), (f"{name}: reverse", rev), (f"{name}: both", fwd + rev)]
        print_table("per call (minimum over rounds)", rows, unit="ms")
        t1 = sum(best["one process"])
        t2 = sum(best["dask, 2 workers"])
        print(f"speed-up with 2 workers: {t1 / t2:.2f}x (launch {best['one process'][0] / best['dask, 2 workers'][0]:.2f}x, "
              f"reverse {best['one process'][1] / best['dask, 2 workers'][1]:.2f}x)")
        share = [cpu / wall for *_, wall, cpu in dsk.grads.report.shards if wall > 0]
        c0, w0 = time.process_time(), time.perf_counter()
        one.reset()
        one.launch()
        one.reverse()
        own = (time.process_time() - c0) / (time.perf_counter() - w0)
        print(f"CPU each side got (CPU time / wall time): one process {own:.0%} of a core; "
              f"each block's reverse on its worker {min(share):.0%}-{max(share):.0%} of a core "
              f"(the other helpers on this machine take the rest)")
        peak = ", ".join(f"{w['peak_memory'] / 2**20:,.0f} MiB" for w in report.workers.values())
        print(f"reverse report: {report.chunks} chunks, {report.recomputed_steps:,} recomputed steps "
              f"(summed over blocks), peak memory per worker: {peak}")
        overhead = task_overhead(vd, client)
        print(f"overhead per task (64 blocks of 8 samples, launch + reverse): {overhead * 1e3:.1f} ms")
        make_bytes, summary_bytes = message_sizes(steps)
        state_bytes = one.sim.per_sample_bytes
        paper_model(t1 / (n * steps), overhead, make_bytes, summary_bytes, state_bytes, steps)
    finally:
        client.shutdown()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
