"""vkml.distributed: graphs and simulations sharded over samples on a Dask LocalCluster of worker
processes (on 127.0.0.1, started and stopped here) give the same bits as one process -- for 1 to 4
workers, any block size and uneven input chunks -- survive a worker killed mid-reverse, and
refuse a bad block cleanly.  ``import vkml`` never needs Dask."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import vkml

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")
da = pytest.importorskip("dask.array")

import vkml.distributed as vd  # noqa: E402
from models import pendulum_step

# the workers cannot import this file: its functions travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(300)

N = 1000                  # not a power of two: the last block is short
DT = 0.05


@vkml.kernel
def wave(u, k: vkml.Param):
    return {"y": vkml.sin(k * u) * u}


@vkml.kernel
def mix(y, x, k: vkml.Param, c: vkml.Param):
    return {"z": vkml.cos(c * y) + k * x * y}


@vkml.kernel
def spin(s, k: vkml.Param):
    return {"s": vkml.sin(k * s) + 0.1 * s}


@vkml.kernel
def look(i, u, table: vkml.Param):
    return {"y": table[i] * u}


pendulum = pendulum_step(DT)


# -- the forwards: each builds one block's graph from the planes it is given ----------------------

def make_plain(planes):
    """Two kernels sharing Param k (two parts per gradient), an input read twice."""
    u, x = planes["u"], planes["x"]
    g = vkml.Graph()
    g.add(wave.bind(u=u, y=np.zeros_like(u), k=1.3), name="wave")
    g.add(mix.bind(y=g.nodes[0].op.writes["y"], x=x, z=np.zeros_like(u), k=0.7, c=0.4), name="mix")
    return g


def make_branchy(planes, iterations=6):
    """A skipped member, one that runs, and a repeat_while looping ``iterations`` times
    (checkpointed every 3): the same steps in every block."""
    u, s = planes["u"], planes["s"]
    left = [iterations]

    def again():
        left[0] -= 1
        return left[0] >= 0

    y, y2 = np.zeros_like(u), np.zeros_like(u)
    g = vkml.Graph()
    g.add_node(vkml.skippable(wave.bind(u=u, y=y, k=0.9), np.array([0], np.uint32)), name="off")
    g.add_node(vkml.skippable(wave.bind(u=u, y=y2, k=1.1), np.array([1], np.uint32)), name="on")
    g.add_node(vkml.repeat_while(spin.bind(s=s, k=0.8), again, max_iters=9), name="loop")
    return g


def make_sim(planes, memory_budget=None, window=5):
    n = planes["theta"].shape[0]
    return vkml.simulation(pendulum, max_steps=60, record=True, window=window,
                           memory_budget=memory_budget, theta=planes["theta"],
                           omega=planes["omega"], t=np.zeros(n), t_end=planes["t_end"],
                           length=1.2, damping=0.3)


def make_look(planes):
    i, u = planes["i"], planes["u"]
    return vkml.Graph().add(look.bind(i=i, u=u, table=np.array([1.0, 2.0, 3.0]),
                                      y=np.zeros_like(u)), name="look")


def slow_square(reads):
    time.sleep(0.4)              # long enough to kill a worker while it runs
    return {"q": reads["x"] ** 2}


def slow_vjp(primals, cts):
    time.sleep(0.4)              # long enough to kill a worker while it runs
    return {"x": 2.0 * primals["x"] * cts["q"]}


def make_slow(planes):
    x = planes["x"]
    q = np.zeros_like(x)
    node = vkml.graph.opaque(slow_square, reads={"x": x}, writes={"q": q}, name="slow")
    return vkml.Graph().add(node, name="slow").add(wave.bind(u=q, y=np.zeros_like(x), k=0.6),
                                                  name="wave")


def data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return {"u": rng.uniform(-1, 1, n), "x": rng.uniform(-1, 1, n), "s": rng.uniform(0.1, 0.9, n)}


def one_process(make, planes, seeds, vjps=None, **kw):
    """The reference: the same forward over all samples in this process."""
    fwd = make({k: v.copy() for k, v in planes.items()}, **kw)
    if isinstance(fwd, vkml.Graph):
        fwd.build(record=True).launch()
    else:
        fwd.run()
    return fwd, vkml.diff.reverse(fwd.record, seeds, vjps=vjps)


def assert_same_bits(sharded_grads, grads):
    assert sorted(sharded_grads) == sorted(grads)
    for name in grads:
        got = sharded_grads[name]
        got = got.compute() if hasattr(got, "compute") else got
        assert got.dtype == grads[name].dtype, name
        assert got.tobytes() == np.asarray(grads[name]).tobytes(), name


# -- the block rule (NumPy only) ------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 5, 256, 1000, 4097])
@pytest.mark.parametrize("fill", ["random", "negative zeros"])
def test_block_sums_combined_in_tree_order_are_the_one_pass_bits(n, fill):
    from vkml.distributed.blocks import shard_bounds, tree_of
    from vkml.graph.treesum import tree_sum
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 3)) * 10.0 ** rng.integers(-8, 8, (n, 1)) if fill == "random" \
        else np.full((n, 3), -0.0)
    want = tree_sum(x)
    for size in (1, 2, 64, 256, 1024, 8192):
        bounds = shard_bounds(n, size)
        got = tree_of([tree_sum(x[s:e]) for s, e in bounds], [e - s for s, e in bounds], size, n)
        assert got.tobytes() == want.tobytes(), size
    if fill == "random" and n > 64:           # a left-to-right sum of the blocks is not the same
        parts = [tree_sum(x[s:e]) for s, e in shard_bounds(n, 64)]
        assert any(sum(parts[k:] + parts[:k]).tobytes() != want.tobytes() for k in range(len(parts)))


def test_default_blocks_keep_the_threads_busy():
    from vkml.distributed.blocks import block_size, check_block
    assert block_size(10 ** 8, 64) == 2 ** 19          # 191 blocks: 99.3% busy (2^21: 48 blocks)
    assert block_size(10 ** 6, 2) == 2 ** 19
    assert block_size(1000, 4) == 256 and block_size(5, 8) == 1
    for bad in (100, 0, True, 2.0):
        with pytest.raises(vkml.ArgumentError, match="power of two"):
            check_block(bad, 1000)


def test_sharding_needs_a_client():
    with pytest.raises(vkml.ArgumentError, match=r"vkml.distributed.local\(\)"):
        vd.Sharded(make_plain, data())


# -- the clusters ---------------------------------------------------------------------------------

class Clusters:
    """One LocalCluster at a time (worker processes on 127.0.0.1, no dashboard)."""

    def __init__(self):
        self.client, self.n = None, None

    def get(self, n_workers, threads=1):
        """A cluster of ``n_workers`` processes running ``threads`` tasks each, every task
        splitting its samples over ``threads`` threads too (``VKML_THREADS``)."""
        if self.n != (n_workers, threads):
            self.close()
            self.client = vd.local(n_workers=n_workers, threads_per_worker=threads, dashboard=False,
                                   memory_limit="1GiB", env={"VKML_THREADS": str(threads)})
            self.n = (n_workers, threads)
        return self.client

    def close(self):
        if self.client is not None:
            self.client.shutdown()
            self.client.close()
            self.client, self.n = None, None


@pytest.fixture(scope="module")
def clusters():
    c = Clusters()
    yield c
    c.close()


# -- same bits -------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_a_plain_graph_gives_the_same_bits_for_any_worker_count_and_blocks(clusters, workers):
    client = clusters.get(workers)
    planes = data()
    seeds = {"z": np.random.default_rng(1).standard_normal(N)}
    fwd, ref = one_process(make_plain, planes, seeds)
    assert len(ref.parts[("wave", "k")]) == 1 and set(ref.parts) >= {("mix", "k"), ("mix", "c")}
    for block in (None, 128, 256, 1024):
        sg = vd.Sharded(make_plain, planes, client=client, record=True, block=block)
        sg.launch()
        assert sg.plane("z").compute().tobytes() == fwd.nodes[1].op.writes["z"].tobytes()
        grads = sg.reverse(seeds)
        assert_same_bits(grads, ref)
        assert len(grads.report.shards) == len(sg.bounds) == -(-N // sg.block)
    # vkml.diff's two doors take a sharded Record too
    sg.launch()
    assert_same_bits(vkml.diff.reverse(sg.record, seeds), ref)
    sg.launch()
    assert_same_bits(vkml.diff.Reverse(sg)(sg.record, seeds), ref)
    assert sg.bitwise()["k"] is True
    # an independent check of one Param gradient: d/dk of sum(seed * z), k shared by both nodes
    u, x, sd = planes["u"], planes["x"], seeds["z"]
    y = np.sin(1.3 * u) * u
    dz_dy = -0.4 * np.sin(0.4 * y) + 0.7 * x
    want = np.sum(sd * (x * y + dz_dy * np.cos(1.3 * u) * u * u))
    np.testing.assert_allclose(ref["k"], want, rtol=1e-12)


def test_dask_array_planes_with_uneven_chunks_are_rechunked_to_blocks(clusters):
    """...on 2 workers running 2 tasks at once, each task on 2 threads (VKML_THREADS=2)."""
    client = clusters.get(2, threads=2)
    assert set(client.run(lambda: os.environ.get("VKML_THREADS")).values()) == {"2"}
    # glibc's own trimming: Dask's MALLOC_TRIM_THRESHOLD_ doubled the CPU time of NumPy steps
    assert set(client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")).values()) == {None}
    planes = data(seed=3)
    seeds = {"z": np.random.default_rng(4).standard_normal(N)}
    _, ref = one_process(make_plain, planes, seeds)
    lazy = {"u": da.from_array(planes["u"], chunks=((97, 400, 3, 500),)),
            "x": da.from_array(planes["x"], chunks=((333, 333, 334),))}
    lazy_seeds = {"z": da.from_array(seeds["z"], chunks=((10, 990),))}
    sg = vd.Sharded(make_plain, lazy, client=client, record=True, block=64)
    sg.launch()
    grads = sg.reverse(lazy_seeds)
    assert_same_bits(grads, ref)
    assert isinstance(grads["u"], da.Array) and grads["u"].chunks[0][0] == 64


def test_skippable_and_repeat_while_members_give_the_same_bits(clusters):
    client = clusters.get(3)
    planes = {"u": data()["u"], "s": data()["s"]}
    seeds = {"on.y": np.ones(N), "loop.s": np.random.default_rng(2).standard_normal(N)}
    fwd, ref = one_process(make_branchy, planes, seeds)
    assert fwd.record.iterations == {"loop": 6} and len(ref.parts[("loop", "k")]) == 6
    for block in (128, 512):
        sg = vd.Sharded(make_branchy, planes, client=client, record=True, block=block)
        sg.launch()
        assert_same_bits(sg.reverse(seeds), ref)


def test_blocks_whose_guards_differ_are_refused(clusters):
    """A guard that reads the block's own samples: blocks loop different numbers of times."""
    client = clusters.get(2)
    planes = {"u": data()["u"], "s": data()["s"]}

    def make(planes):
        return make_branchy(planes, iterations=2 + int(planes["s"].shape[0] < 512))

    sg = vd.Sharded(make, planes, client=client, record=True, block=512)
    sg.launch()
    with pytest.raises(vkml.RefusedError, match=r"\[0, 512\).*\[512, 1000\).*different steps"):
        sg.reverse({"loop.s": np.ones(N)})


@pytest.mark.parametrize("window", [5, "binomial"])
def test_a_checkpointed_simulation_gives_the_same_bits_in_budgeted_blocks(clusters, window):
    client = clusters.get(2)
    rng = np.random.default_rng(5)
    planes = {"theta": rng.uniform(0.1, 1.0, N), "omega": rng.uniform(-0.5, 0.5, N),
              "t_end": rng.uniform(0.5, 3.0, N)}            # samples stop at different steps
    seeds = {"theta": rng.standard_normal(N), "omega": np.ones(N)}
    make = functools.partial(make_sim, window=window)
    fwd, ref = one_process(make, planes, seeds)
    steps = fwd.record.steps
    assert steps.min() < steps.max() <= 60
    budget = 256 * fwd.per_sample_bytes                        # passes of 256 samples per block
    sg = vd.Sharded(make, planes, client=client, record=True, block=512, memory_budget=budget)
    sg.launch()
    assert sg.plane("theta").compute().tobytes() == fwd.launch.writes["theta"].tobytes()
    grads = sg.reverse(seeds)
    assert_same_bits(grads, ref)
    rep = grads.report
    assert rep.chunks == 4 and ref.report.chunks == 1          # two passes in each of two blocks
    assert rep.recomputed_steps > 0 and len(rep.workers) >= 1
    assert all(w["peak_memory"] > 0 for w in rep.workers.values())
    if window == 5:             # a second run continues from where the first left every plane
        planes_after = {k: fwd.launch.writes[k].copy() for k in ("theta", "omega", "t")}
        fwd.run()
        sg.launch()
        for k, before in planes_after.items():
            assert sg.plane(k).compute().tobytes() == fwd.launch.writes[k].tobytes(), k
        assert not np.array_equal(planes_after["t"], fwd.launch.writes["t"])    # it ran on


# -- records, faults, refusals ---------------------------------------------------------------------

def test_record_rules_hold_across_the_cluster(clusters):
    client = clusters.get(2)
    planes = data(seed=6)
    seeds = {"z": np.ones(N)}
    sg = vd.Sharded(make_plain, planes, client=client, record=True)
    sg.launch()
    first = sg.record
    with pytest.raises(vkml.RecordError, match="generation 1 is still live"):
        sg.launch()
    with pytest.raises(vkml.RecordError, match="still live"):
        sg.update(k=0.5)
    first.keep()
    sg.update(nope=1.0)                            # checked by the blocks at the next launch
    with pytest.raises(vkml.ArgumentError, match=r"shard of samples \[0, .*no Param 'nope'"):
        sg.launch()
    assert sg.generation == 1 and sg.params == {}  # the refused Params were dropped
    sg.update(k=0.5).launch()                      # the next launch runs on the updated planes
    assert sg.generation == 2 and first.stale is False and sg.record.live
    kept = sg.reverse(seeds, record=first)
    g = make_plain({k: v.copy() for k, v in planes.items()}).build(record=True)
    g.launch()
    assert_same_bits(kept, vkml.diff.reverse(g.record, seeds))
    g.update(k=0.5)
    g.launch()
    assert sg.plane("z").compute().tobytes() == g.nodes[1].op.writes["z"].tobytes()
    assert_same_bits(sg.reverse(seeds), vkml.diff.reverse(g.record, seeds))
    second = sg.record                             # reversed, not kept
    sg.launch()
    assert second.stale and not first.stale
    with pytest.raises(vkml.RecordError, match="generation 2.*generation 3"):
        sg.reverse(seeds, record=second)


def test_progress_shows_dask_progress_bar(clusters, capsys):
    client = clusters.get(2)
    sg = vd.Sharded(make_plain, data(n=300), client=client, record=True, block=64, progress=True)
    sg.launch()
    sg.reverse({"z": np.ones(300)})
    assert capsys.readouterr().out.count("100% Completed") >= 2      # one bar per call


def vkml_keys(client, tag):
    """Keys of this sharded graph's tasks the scheduler still knows, and those held by workers."""
    sched = client.run_on_scheduler(lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks])
    held = client.run(lambda dask_worker: [str(k) for k in dask_worker.data])
    return [k for k in sched if tag in k], [k for ks in held.values() for k in ks if tag in k]


def test_a_refused_block_fails_the_call_names_its_samples_and_leaves_nothing(clusters):
    client = clusters.get(4)
    rng = np.random.default_rng(8)
    planes = {"i": (np.arange(N) % 3).astype(np.int64), "u": rng.uniform(-1, 1, N)}
    planes["i"][600] = 7                                  # out of the table: block [512, 768)
    sg = vd.Sharded(make_look, planes, client=client, record=True, block=256)
    with pytest.raises(vkml.ExecutionError, match=r"shard of samples \[512, 768\):.*index 7 is out "
                                                  r"of range"):
        sg.launch()
    assert sg.generation == 0 and sg.record is None
    deadline = time.monotonic() + 10
    while any(vkml_keys(client, sg._tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert vkml_keys(client, sg._tag) == ([], [])          # no block keeps a Record of the launch
    # the same data, fixed: it launches, and a bad seed on the reverse is refused before any task
    planes["i"][600] = 1
    sg = vd.Sharded(make_look, planes, client=client, record=True, block=256)
    sg.launch()
    with pytest.raises(vkml.ShapeError, match="seed 'y'"):
        sg.reverse({"y": np.ones(N - 1)})
    assert sg.record.live


def kill_a_worker_running(client, prefix, pids, busy_check=None):
    """Wait until a worker runs a task whose key starts with ``prefix``; check ``busy_check()``
    then (a call made while another is under way); kill that worker's process; its address."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for addr, keys in client.processing().items():
            if any(str(k).startswith(prefix) for k in keys) and addr in pids:
                if busy_check is not None:
                    busy_check()
                os.kill(pids[addr], signal.SIGKILL)
                return addr
        time.sleep(0.02)
    raise AssertionError(f"no {prefix} task was seen running")


@pytest.mark.parametrize("phase", ["launch", "reverse"])
def test_a_worker_killed_during_a_launch_or_a_reverse_changes_no_bit(clusters, phase):
    client = clusters.get(2)
    planes = {"x": data(n=2048, seed=9)["x"]}
    seeds = {"y": np.random.default_rng(10).standard_normal(2048)}
    vjps = {"slow": slow_vjp}
    fwd, ref = one_process(make_slow, planes, seeds, vjps=vjps)
    sg = vd.Sharded(make_slow, planes, client=client, record=True, block=512)
    if phase == "reverse":
        sg.launch()
    pids = client.run(os.getpid)
    out = {}

    def run():
        try:
            if phase == "launch":
                sg.launch()
            out["grads"] = sg.reverse(seeds, vjps=vjps)
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            out["error"] = err

    def one_call_at_a_time():
        with pytest.raises(vkml.Busy, match="under way"):
            sg.launch() if phase == "reverse" else sg.update(k=0.1)

    thread = threading.Thread(target=run)
    thread.start()
    victim = kill_a_worker_running(client, f"vkml-{phase}-", pids, one_call_at_a_time)
    thread.join(120)
    assert "error" not in out, out.get("error")
    assert sg.plane("y").compute().tobytes() == fwd.nodes[1].op.writes["y"].tobytes()
    assert_same_bits(out["grads"], ref)
    assert pids[victim] not in client.run(os.getpid).values()


# -- without Dask ----------------------------------------------------------------------------------

def test_vkml_imports_without_dask_and_says_how_to_install_it():
    code = textwrap.dedent("""
        import sys
        class NoDask:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("dask", "distributed"):
                    raise ImportError(f"No module named {name!r}")
        sys.meta_path.insert(0, NoDask())
        import vkml
        assert not any(m.split(".")[0] in ("dask", "distributed") for m in sys.modules), "dask imported"
        try:
            import vkml.distributed
        except vkml.VkmlError as err:
            print("refused:", err)
        else:
            raise SystemExit("vkml.distributed imported without dask")
    """)
    env = dict(os.environ)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "refused:" in res.stdout and "pip install 'vkml-toolkit[distributed]'" in res.stdout
