"""Simulations stepped from the host keep their planes, Records and adjoints on the GPU too.

A simulation the per-sample GPU loops do not run -- the ``"full"`` and ``"binomial"`` schedules,
a model node before the kernel, a window too large for a GPU thread -- is stepped from the host:
one submission per step.  On the emulated driver (``cuda_emulation.fake_driver``, which counts
every copy it makes), each step's program takes and returns device arrays:

- per forward step, in: the executable's pointer table and its block of small arguments (the
  Param cells); out: its status words and, for a kernel that can terminate, the one word saying
  whether any sample still runs.  Per reversed or recomputed step: the table and the block in
  (now with the step's index), the status words out.  With 1024 samples a plane is 8 KiB, larger
  than the small-argument block (at most 4 KiB per argument), so "no copy as large as a plane"
  is checked byte by byte;
- on the device: the initial state copied once into the Record (later checkpoints are the steps'
  own output arrays, never written again), and the final state and the step's other outputs
  copied into their planes once the run has succeeded;
- a model node runs user Python on host values: its reads go to the host and its writes to the
  device every step (and in the reverse the adjoints its vjp needs and adds to), counted;
- states, step counts and gradients have the NumPy backend's bits (full and binomial schedules,
  a budget forcing passes, a model node, a step the loops do not cover);
- another library's device arrays are planes without a copy; refusals and a failing run change
  nothing; ``.numpy()`` reads a plane or a gradient on the host.
"""

from __future__ import annotations

import numpy as np
import pytest

import vkml
from cuda_emulation import CXX
from test_cuda_loops import _drag, drag
from test_cuda_resident import ForeignArray, moved
from vkml.backends.cuda import SMALL_INPUT_BYTES, DeviceArray

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the emulated kernels")

N = 1024                                    # a float64 plane: 8 KiB, more than a small argument
STATE = ("x", "v", "t")


def drag_planes(n=N, dtype=np.float64, seed=0):
    return _drag(dtype)(n, np.random.default_rng(seed))


def make(planes, max_steps=70, window="binomial", **options):
    return vkml.simulation(drag, max_steps=max_steps, record=True, window=window, **planes,
                           **options)


def seeds_for(planes, state=STATE):
    return {s: np.linspace(1.0, 2.0, planes[s].size).reshape(planes[s].shape).astype(planes[s].dtype)
            for s in state}


def outcome(sim, seeds, vjps=None):
    """(the planes after ``run()``, the per-sample steps, the gradients), on the host."""
    sim.run()
    out = {k: np.asarray(sim.planes[k]) for k in sim.launch.writes}
    grads = vkml.diff.reverse(sim.record, seeds, vjps=vjps)
    return out, sim.record.steps.copy(), {k: np.asarray(v) for k, v in grads.items()}, grads


def on_numpy(build, seeds, vjps=None):
    vkml.set_backend("numpy")
    try:
        return outcome(build(), seeds, vjps)
    finally:
        vkml.set_backend("cuda")


def assert_bits(got, want):
    for g, w in ((got[0], want[0]), (got[2], want[2])):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].dtype == w[k].dtype and g[k].tobytes() == w[k].tobytes(), k
    assert np.array_equal(got[1], want[1])


def copies_during(driver, call):
    """What ``call()`` copied: the counts by kind, and the largest host<->device copy."""
    before, start = dict(driver.copies), len(driver.copy_log)
    call()
    pcie = [nbytes for kind, _, _, nbytes in driver.copy_log[start:] if kind != "dtod"]
    return moved(driver, before), max(pcie, default=0)


# -- what crosses PCIe per step --------------------------------------------------------------------

@pytest.mark.parametrize("window", ["full", "binomial"])
def test_a_run_moves_no_plane_only_two_control_copies_in_and_two_words_out_per_step(
        emulated_cuda, window):
    backend, driver = emulated_cuda
    plane_bytes = N * 8
    for max_steps in (5, 10):           # the samples run longer than 10 steps: all take each step
        planes = drag_planes()
        before = dict(driver.copies)
        sim = make(planes, max_steps=max_steps, window=window)
        # x, v, c, t, t_end and the kernel's 'terminated' plane: one copy each, once
        assert moved(driver, before) == {"htod": 6, "dtoh": 0, "dtod": 0}
        assert sim.on_device and not sim.loops_on_device
        assert all(isinstance(p, DeviceArray) for p in sim.planes.values())
        counts, largest = copies_during(driver, sim.run)
        # per step: the pointer table and the small-argument block in; the status words and the
        # "any sample running" word out.  On the device: the initial state (3 planes) into the
        # Record, then the final state and 'terminated' into their planes
        assert counts == {"htod": 2 * max_steps, "dtoh": 2 * max_steps, "dtod": 3 + 4}
        assert largest <= SMALL_INPUT_BYTES < plane_bytes
        assert (sim.record.steps == max_steps).all()


def test_a_kernel_that_never_terminates_reads_no_running_word(emulated_cuda):
    backend, driver = emulated_cuda

    @vkml.kernel
    def decay(x, k: vkml.Param):
        return {"x": x - 0.1 * k * x}

    sim = vkml.simulation(decay, max_steps=6, record=True, window="full", x=np.linspace(0, 1, N),
                          k=0.5)
    sim.run()
    counts, largest = copies_during(driver, sim.run)
    # status words only; on the device the initial state into the Record, the final into 'x'
    assert counts == {"htod": 2 * 6, "dtoh": 6, "dtod": 2} and largest < N * 8


def test_a_reverse_moves_no_plane_counted_per_reversed_and_recomputed_step(emulated_cuda):
    backend, driver = emulated_cuda
    max_steps = 12
    sim = make(drag_planes(), max_steps=max_steps, window="binomial", snapshots=1)
    sim.run()
    seeds = {s: backend.to_plane(v) for s, v in seeds_for(drag_planes()).items()}
    rec = sim.record
    counts, _ = copies_during(driver, lambda: rec.steps)
    assert counts == {"htod": 0, "dtoh": 1, "dtod": 0}          # read once per Record, explicitly
    vkml.diff.reverse(rec, seeds)                                 # compiles the programs
    sim.run()
    rec = sim.record                      # (a fresh Record: its counts not read on the host)
    got = []
    counts, largest = copies_during(driver, lambda: got.append(vkml.diff.reverse(rec, seeds)))
    recomputed = got[0].report.recomputed_steps
    assert recomputed > 0                                         # binomial with one snapshot
    # first the longest and fewest steps, found on the device: its table in, its status words
    # and the two counts out; per reversed and per recomputed step: the table and the block in,
    # the status words out; then the Param 'k': its sum over samples, computed on the device,
    # one number out
    submissions = max_steps + recomputed
    assert counts == {"htod": 1 + 2 * submissions, "dtoh": 3 + submissions + 1, "dtod": 0}
    assert largest <= SMALL_INPUT_BYTES < N * 8
    grads = got[0]
    assert {k: type(g) for k, g in grads.items()} == {
        "x": DeviceArray, "v": DeviceArray, "t": DeviceArray, "c": DeviceArray,
        "t_end": DeviceArray, "k": np.ndarray}
    before = dict(driver.copies)
    assert grads["x"].numpy().shape == (N,)                       # read on the host: explicit
    assert moved(driver, before) == {"htod": 0, "dtoh": 1, "dtod": 0}


def test_a_model_node_copies_its_reads_and_writes_explicitly_per_step(emulated_cuda):
    backend, driver = emulated_cuda
    sim = until_done_sim(np.linspace(0.5, 1.0, N), np.zeros(N), max_steps=5)
    assert sim.on_device and not sim.loops_on_device and isinstance(sim.planes["corr"], DeviceArray)
    sim.run()
    for max_steps in (5, 10):
        sim = until_done_sim(np.linspace(0.5, 1.0, N), np.zeros(N), max_steps=max_steps)
        counts, _ = copies_during(driver, sim.run)
        # per step: the node reads x (one copy out) and its 'corr' goes in (one copy); the step:
        # table and block in, status words out (the kernel never terminates: no running word).
        # On the device: the initial x into the Record, the final x into its plane
        assert counts == {"htod": 3 * max_steps, "dtoh": 2 * max_steps, "dtod": 2}


@pytest.mark.parametrize("max_steps", [4, 8])
def test_a_model_nodes_reverse_copies_are_counted_per_step(emulated_cuda, max_steps):
    backend, driver = emulated_cuda
    sim = until_done_sim(np.linspace(0.5, 1.0, N), np.zeros(N), max_steps=max_steps, window="full")
    sim.run()
    seeds = {"x": backend.to_plane(np.ones(N))}
    counts, _ = copies_during(driver, lambda: vkml.diff.reverse(sim.record, seeds,
                                                                vjps={"model": model_vjp}))
    # once: the longest and fewest steps found on the device (its table in, its status words and
    # the two counts out), the step counts read for the node's vjp (which runs on the samples
    # still running), the Param 'k' summed on the device (one value out).  Per reversed step, in:
    # the node's 'corr' recomputed on the host, the vjp program's table and block, the state
    # adjoint the node's vjp added to; out: the program's status words, the adjoint of 'corr' and
    # the state adjoint for the node's vjp.  The state the node reads is a step's output, whose
    # host copy the run already made (a device value keeps it); only step 0's, the Record's copy
    # of the initial plane, is read again, twice (for the node and for its vjp)
    assert counts == {"htod": 1 + 4 * max_steps, "dtoh": 3 + 1 + 1 + 3 * max_steps + 2, "dtod": 0}


# -- the NumPy backend's bits -------------------------------------------------------------------------

@pytest.mark.parametrize("window", ["full", "binomial"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_schedules_have_the_numpy_backends_bits(emulated_cuda, window, dtype):
    planes = drag_planes(300, dtype)
    seeds = seeds_for(planes)
    want = on_numpy(lambda: make({k: np.copy(v) for k, v in planes.items()}, window=window), seeds)
    sim = make({k: np.copy(v) for k, v in planes.items()}, window=window)
    got = outcome(sim, seeds)
    assert sim.on_device and len(set(got[1].tolist())) > 1         # samples stop apart
    assert_bits(got, want)


def test_a_budget_forcing_passes_keeps_the_bits(emulated_cuda):
    n = 1000                                   # four passes of 256 samples, the last one short
    planes = drag_planes(n)
    seeds = seeds_for(planes)
    budget = 256 * make(drag_planes(4)).per_sample_bytes + 1

    def build(**options):
        return make({k: np.copy(v) for k, v in planes.items()}, **options)

    want = on_numpy(lambda: build(memory_budget=budget), seeds)
    one_pass = on_numpy(build, seeds)
    sim = build(memory_budget=budget)
    assert sim.pass_size == 256
    got = outcome(sim, {s: vkml.backends.current().to_plane(v) for s, v in seeds.items()})
    assert got[3].report.chunks == 4
    assert_bits(got, want)
    assert_bits(got, one_pass)                 # the budget changes no bit


def test_a_window_too_large_for_a_gpu_thread_is_stepped_on_the_device_with_the_same_bits(
        emulated_cuda):
    planes = drag_planes(200)
    seeds = seeds_for(planes)
    want = on_numpy(lambda: make({k: np.copy(v) for k, v in planes.items()}, window=2000,
                                 max_steps=2000), seeds)
    sim = make({k: np.copy(v) for k, v in planes.items()}, window=2000, max_steps=2000)
    assert sim.on_device and not sim.loops_on_device   # 2000 states of 3 float64s per thread
    assert_bits(outcome(sim, seeds), want)


@vkml.kernel
def pushed(x, corr, k: vkml.Param):
    return {"x": x + 0.1 * k * corr * x}


def until_done_sim(x, corr, max_steps=8, **options):
    model = vkml.graph.opaque(lambda r: {"corr": -r["x"] * r["x"]}, reads={"x": x},
                              writes={"corr": corr}, name="model")
    return vkml.until_done([model, pushed], max_steps=max_steps, record=True, x=x, corr=corr,
                           k=1.5, **options)


def model_vjp(primals, cts):
    return {"x": -2.0 * primals["x"] * cts["corr"]}


@pytest.mark.parametrize("window", [3, "full", "binomial"])
def test_a_model_node_has_the_numpy_backends_bits(emulated_cuda, window):
    x = np.linspace(0.2, 1.0, 300)
    seeds = {"x": np.linspace(1.0, 2.0, 300)}
    want = on_numpy(lambda: until_done_sim(x.copy(), np.zeros(300), window=window), seeds,
                    {"model": model_vjp})
    sim = until_done_sim(x.copy(), np.zeros(300), window=window)
    got = outcome(sim, seeds, {"model": model_vjp})
    assert sim.on_device and isinstance(got[3]["x"], DeviceArray)
    assert_bits(got, want)
    assert set(want[2]) == {"x", "k"}


# -- device arrays as planes, refusals, failures ---------------------------------------------------------

def test_a_foreign_device_array_is_a_plane_without_a_copy_and_updated_in_place(emulated_cuda):
    backend, driver = emulated_cuda
    planes = drag_planes(200)
    seeds = seeds_for(planes)
    want = on_numpy(lambda: make({k: np.copy(v) for k, v in planes.items()}, window="full"), seeds)
    foreign = {k: ForeignArray(driver, planes[k]) for k in ("x", "v", "c")}
    before = dict(driver.copies)
    sim = make(dict(planes, **foreign), window="full")
    assert moved(driver, before) == {"htod": 3, "dtoh": 0, "dtod": 0}   # t, t_end, 'terminated'
    assert sim.planes["x"].ptr == foreign["x"].ptr
    got = outcome(sim, {s: ForeignArray(driver, v) for s, v in seeds.items()})
    assert foreign["x"].read().tobytes() == want[0]["x"].tobytes()        # written where it lies
    assert foreign["c"].read().tobytes() == planes["c"].tobytes()
    assert_bits(got, want)


def test_bad_planes_and_seeds_are_refused_and_change_nothing(emulated_cuda):
    backend, driver = emulated_cuda
    planes = drag_planes(64)
    with pytest.raises(vkml.ArgumentError, match="plane 'x' is read-only"):
        make(dict(planes, x=ForeignArray(driver, planes["x"], readonly=True)))
    with pytest.raises(vkml.DTypeError, match="typestr"):
        make(dict(planes, x=ForeignArray(driver, planes["x"].astype(np.float16))))
    with pytest.raises(vkml.RefusedError, match="opaque node"):
        vkml.diff.reverse(until_done_sim(np.ones(4), np.zeros(4)).run().record, {"x": np.ones(4)})
    sim = make(planes)
    sim.run()
    rec = sim.record
    state = {k: np.asarray(v).tobytes() for k, v in sim.planes.items()}
    before = dict(driver.copies)
    with pytest.raises(vkml.ShapeError, match="seed 'x' has shape"):
        vkml.diff.reverse(rec, {"x": np.ones(65)})
    with pytest.raises(vkml.DTypeError, match="seed 'v' is a device array of float32"):
        vkml.diff.reverse(rec, {"v": ForeignArray(driver, np.ones(64, np.float32))})
    assert moved(driver, before) == {"htod": 0, "dtoh": 0, "dtod": 0}
    assert not rec.reversed and sim.record is rec and sim.generation == 1
    assert {k: np.asarray(v).tobytes() for k, v in sim.planes.items()} == state


def test_a_run_that_fails_part_way_commits_nothing(emulated_cuda):
    @vkml.kernel
    def hop(x, table: vkml.Param):
        return {"x": x + 1.0 + 0.0 * vkml.take(table, x.astype(np.int64))}

    # the samples reach index 5 of a table of 5 on their sixth step
    sim = vkml.simulation(hop, max_steps=10, record=True, window="full",
                          x=np.linspace(0.0, 0.5, 8), table=np.arange(5.0))
    assert sim.on_device and not sim.loops_on_device
    before = {k: np.asarray(v).copy() for k, v in sim.planes.items()}
    with pytest.raises(vkml.ExecutionError, match="simulation step hop.*out of range"):
        sim.run()
    assert all(np.asarray(v).tobytes() == before[k].tobytes() for k, v in sim.planes.items())
    assert sim.generation == 0 and sim.record is None


def test_a_kept_record_copies_its_inputs_on_the_device_and_survives_a_later_run(emulated_cuda):
    backend, driver = emulated_cuda
    planes = drag_planes(64)
    sim = make(planes, window="full")
    sim.run()
    rec = sim.record
    seeds = {s: backend.to_plane(v) for s, v in seeds_for(planes).items()}
    first = {k: np.asarray(v) for k, v in vkml.diff.reverse(rec, seeds).items()}
    before = dict(driver.copies)
    rec.keep()
    assert moved(driver, before) == {"htod": 0, "dtoh": 0, "dtod": 2}      # c and t_end
    backend.copy_plane_into(sim.planes["c"], np.zeros(64))                  # the user changes c
    sim.run()
    again = {k: np.asarray(v) for k, v in vkml.diff.reverse(rec, seeds).items()}
    assert {k: v.tobytes() for k, v in again.items()} == {k: v.tobytes() for k, v in first.items()}


# -- graphs reversed launch by launch: guards, loops, a hand-written vjp kernel ---------------------------

@vkml.kernel
def square(x, c: vkml.Param):
    return {"u": x * x + c}


@vkml.kernel
def relax(s, k: vkml.Param):
    return {"s": s * k + vkml.sqrt(s * s + 1.0)}


@vkml.kernel
def halve(s, k: vkml.Param):
    return {"s": s * k}


@vkml.kernel
def bend(u, x, k: vkml.Param):
    return {"y": k * u / (1.0 + x * x) - vkml.sqrt(u + 1.0)}


@vkml.kernel(vjp_of=bend)
def bend_vjp(u, x, k: vkml.Param, y_bar):
    d = 1.0 + x * x
    return {"u_bar": y_bar * (k / d - 0.5 / vkml.sqrt(u + 1.0)),
            "x_bar": y_bar * (-2.0 * k * u * x / (d * d)), "k_bar": y_bar * u / d}


def guarded(x, n=N, iterations=5):
    """square, then relax under a skippable, then halve repeated: guards that are cells."""
    s, u = np.linspace(1.0, 2.0, n), np.zeros(n)
    loop = vkml.repeat_while(halve.bind(s=s, k=0.5), vkml.SkipGuard.nonzero(np.ones(1)),
                             max_iters=iterations)
    return (vkml.Graph().add(square.bind(x=x, c=0.5, u=u), name="sq")
            .add(vkml.skippable(relax.bind(s=s, k=0.5), vkml.SkipGuard.nonzero(np.ones(1))),
                 name="maybe")
            .add(loop, name="loop").build(record=True))


def two_node(n=N):
    x = np.random.default_rng(0).uniform(-1.0, 1.0, n)
    u, y = np.zeros(n), np.zeros(n)
    return (vkml.Graph().add(square.bind(x=x, c=0.5, u=u), name="square")
            .add(bend.bind(u=u, x=x, k=1.5, y=y), name="bend").build(record=True))


def graph_outcome(g, seeds, vjps=None):
    rev = vkml.diff.Reverse(g, vjps=vjps)
    g.launch()
    grads = rev(g.record, seeds)
    return {k: np.asarray(v) for k, v in g.planes.items()}, {k: np.asarray(v) for k, v in grads.items()}


def same_bits(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes(), k


def test_guards_and_loops_launch_and_reverse_on_the_device_counted_per_submission(emulated_cuda):
    backend, driver = emulated_cuda
    x = np.linspace(0.1, 0.9, N)
    seeds = {"s": np.ones(N), "u": np.linspace(1.0, 2.0, N)}
    vkml.set_backend("numpy")
    want = graph_outcome(guarded(x.copy()), seeds)
    vkml.set_backend("cuda")
    g = guarded(x.copy())
    rev = vkml.diff.Reverse(g)
    device_seeds = {k: backend.to_plane(v) for k, v in seeds.items()}
    counts, largest = copies_during(driver, g.launch)
    rec = g.record
    assert rec.on_device and rec.iterations == {"loop": 5}
    (loop,) = [e for e in rec.tape if type(e).__name__ == "LoopEntry"]
    # 7 submissions (sq, maybe, 5 iterations of the loop): each its table and its small block
    # (the Param cell) in, its status words out.  On the device: the backup of the two planes
    # the launch writes (u, s), each result into its plane, the Record's copies of the versions
    # of s read before their overwrite, the loop's checkpoints
    assert counts == {"htod": 2 * 7, "dtoh": 7,
                      "dtod": 2 + 7 + len(rec.saved) + len(loop.checkpoints)}
    assert largest < N * 8
    grads = []
    counts, largest = copies_during(driver, lambda: grads.append(rev(rec, device_seeds)))
    windows = sorted(loop.checkpoints)
    recomputed = sum(min(c + loop.window, 5) - c - 1 for c in windows)
    submissions = 5 + recomputed + 2              # the loop's vjps and recomputed steps, maybe, sq
    # each submission: table and block in, status out; one Param sum per reversed launch out (5 of
    # the loop's 'k', maybe's 'k', sq's 'c'); on the device: the loop's states rebuilt from copies
    # of its checkpoints
    assert counts == {"htod": 2 * submissions, "dtoh": submissions + 7, "dtod": len(windows)}
    assert largest < N * 8
    assert {k for k, v in grads[0].items() if isinstance(v, DeviceArray)} == {"sq.x", "x", "maybe.s", "s"}
    same_bits({k: np.asarray(v) for k, v in g.planes.items()}, want[0])
    same_bits({k: np.asarray(v) for k, v in grads[0].items()}, want[1])


def test_a_hand_written_vjp_kernel_reverses_on_the_device_with_the_numpy_backends_bits(
        emulated_cuda):
    backend, driver = emulated_cuda
    seeds = {"y": np.linspace(1.0, 2.0, N)}
    vjps = {"bend": bend_vjp}
    vkml.set_backend("numpy")
    want = graph_outcome(two_node(), seeds, vjps)
    vkml.set_backend("cuda")
    g = two_node()
    rev = vkml.diff.Reverse(g, vjps=vjps)
    device_seeds = {"y": backend.to_plane(seeds["y"])}
    g.launch()
    assert g.record.on_device
    grads = []
    counts, largest = copies_during(driver, lambda: grads.append(rev(g.record, device_seeds)))
    # bend's vjp kernel and square's derived vjp: table and block (the Param cell) in, status
    # out; x's two adjoints added on the device (table in, status out); 'k' and 'c' summed on
    # the device, one value out each
    assert counts == {"htod": 2 + 2 + 1, "dtoh": 3 + 2, "dtod": 0} and largest < N * 8
    assert isinstance(grads[0]["x"], DeviceArray) and isinstance(grads[0]["k"], np.ndarray)
    same_bits({k: np.asarray(v) for k, v in grads[0].items()}, want[1])


def test_a_guarded_launch_that_fails_on_the_device_changes_nothing(emulated_cuda):
    @vkml.kernel
    def hop(s, table: vkml.Param):
        return {"s": s + 1.0 + 0.0 * vkml.take(table, s.astype(np.int64))}

    s = np.linspace(0.0, 0.5, 8)
    # the third iteration reads index 3 of a table of 3
    loop = vkml.repeat_while(hop.bind(s=s, table=np.arange(3.0)), vkml.SkipGuard.nonzero(np.ones(1)),
                             max_iters=6)
    g = vkml.Graph().add(loop, name="loop").build(record=True)
    before = {k: np.asarray(v).copy() for k, v in g.planes.items()}
    with pytest.raises(vkml.ExecutionError, match="hop"):
        g.launch()
    assert {k: np.asarray(v).tobytes() for k, v in g.planes.items()} == \
        {k: v.tobytes() for k, v in before.items()}
    assert g.generation == 0 and g.record is None


def test_a_guard_that_is_a_function_still_runs_on_host_copies(emulated_cuda):
    backend, driver = emulated_cuda
    s = np.linspace(1.0, 2.0, N)
    loop = vkml.repeat_while(halve.bind(s=s, k=0.5), lambda: s.max() > 0.3, max_iters=8)
    g = vkml.Graph().add(loop, name="loop").build(record=True)
    g.launch()
    # the function reads the NumPy array itself: the planes go through it, explicitly
    assert not g.record.on_device and g.record.iterations == {"loop": 3}
