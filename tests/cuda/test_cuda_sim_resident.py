"""A recorded simulation on the CUDA backend keeps its planes, checkpoints and gradients on the GPU.

On the emulated driver (``cuda_emulation.fake_driver``, which counts every copy it makes and every
allocation), for the drag model of ``test_cuda_loops`` (+ - * / sqrt only: every backend has the
same bits) and the damped pendulum:

- the planes go to the device once, when the simulation is made (a NumPy array: one copy; another
  library's device array: none), and then ``run()`` and the reverse move no plane across PCIe --
  per call one copy of the control block in (pointer tables and Param values) and one copy of the
  status block out (status words, the forward's longest run per block of samples), and per Param
  one number (its sum over samples, computed on the device);
- the Record's checkpoints and step counts are device memory, counted by its ``nbytes``; a run
  allocates a fixed number of arrays however many steps it takes, and none once the pool holds
  them;
- states, step counts and gradients have the NumPy backend's bits: window schedules, a memory
  budget forcing several passes, and the schedules stepped from the host (binomial, full);
- refusals (a seed of the wrong shape, a device seed or plane of the wrong dtype, a read-only
  device plane the step writes) change nothing;
- the host-stepped paths (model nodes, binomial and full schedules) stay on the device too, a
  model node's values copied explicitly, counted per step (``test_cuda_host_stepped_resident``).
"""

from __future__ import annotations

import gc
import subprocess

import numpy as np
import pytest

import vkml
from cuda_emulation import CXX
from test_cuda_codegen import NVCC
from test_cuda_loops import _drag, _pendulum, drag
from test_cuda_resident import ForeignArray, moved
from test_simulation import pendulum
from vkml.backends import cuda_loops
from vkml.backends.codegen import cuda_render
from vkml.backends.cuda import DeviceArray

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the emulated kernels")

N, MAX_STEPS, WINDOW = 64, 70, 8
STATE = ("x", "v", "t")                      # the drag model's state planes




def drag_planes(n=N, dtype=np.float64, seed=0):
    return _drag(dtype)(n, np.random.default_rng(seed))


def make(planes, kernel=drag, max_steps=MAX_STEPS, **options):
    options.setdefault("window", WINDOW)
    return vkml.simulation(kernel, max_steps=max_steps, record=True, **planes, **options)


def seeds_for(planes, state=STATE):
    return {s: np.linspace(1.0, 2.0, planes[s].size).reshape(planes[s].shape).astype(planes[s].dtype)
            for s in state}


def host(values):
    return {k: np.asarray(v) for k, v in values.items()}


def outcome(sim, seeds):
    """(the planes after ``run()``, the per-sample steps, the reverse's gradients), on the host."""
    sim.run()
    out = {k: np.asarray(sim.planes[k]) for k in sim.launch.writes}
    grads = vkml.diff.reverse(sim.record, seeds)
    return out, sim.record.steps.copy(), host(grads)


def on_numpy(planes, kernel=drag, **options):
    vkml.set_backend("numpy")
    try:
        planes = {k: np.copy(v) for k, v in planes.items()}
        return outcome(make(planes, kernel, **options), seeds_for(planes, _state_of(kernel)))
    finally:
        vkml.set_backend("cuda")


def _state_of(kernel):
    return STATE if kernel is drag else ("theta", "omega", "t")


def assert_bits(got, want):
    for g, w in zip((got[0], got[2]), (want[0], want[2])):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].dtype == w[k].dtype and g[k].tobytes() == w[k].tobytes(), k
    assert np.array_equal(got[1], want[1])


# -- nothing but a control block and a status block crosses PCIe --------------------------------------

def test_the_planes_go_to_the_device_once_and_run_and_reverse_move_none(emulated_cuda):
    backend, driver = emulated_cuda
    planes = drag_planes()
    before = dict(driver.copies)
    sim = make(planes)
    # x, v, c, t, t_end and the kernel's own 'terminated' plane: one copy each, once
    assert moved(driver, before) == {"htod": 6, "dtoh": 0, "dtod": 0}
    assert sim.on_device and all(isinstance(p, DeviceArray) for p in sim.planes.values())
    seeds = {s: backend.to_plane(v) for s, v in seeds_for(planes).items()}
    for _ in range(2):
        before = dict(driver.copies)
        sim.run()
        # in: the control block; out: the status block; on the device: 'terminated' into its
        # scratch array, then the three final states and 'terminated' into their planes
        assert moved(driver, before) == {"htod": 1, "dtoh": 1, "dtod": 5}
        before = dict(driver.copies)
        grads = vkml.diff.reverse(sim.record, seeds)
        # in: the control block; out: the status block and the sum of the one Param, 'k'
        assert moved(driver, before) == {"htod": 1, "dtoh": 2, "dtod": 0}
    assert {k: type(g) for k, g in grads.items()} == {
        "x": DeviceArray, "v": DeviceArray, "t": DeviceArray, "c": DeviceArray, "t_end": DeviceArray,
        "k": np.ndarray}
    assert grads["x"].shape == (N,) and grads["k"].shape == ()


def test_a_numpy_seed_is_one_copy_and_a_missing_one_none(emulated_cuda):
    backend, driver = emulated_cuda
    planes = drag_planes()
    sim = make(planes)
    sim.run()
    before = dict(driver.copies)
    vkml.diff.reverse(sim.record, {"x": np.ones(N)})          # 'v' and 't': zeros on the device
    assert moved(driver, before) == {"htod": 2, "dtoh": 2, "dtod": 0}


def test_the_record_keeps_its_checkpoints_and_steps_on_the_device(emulated_cuda):
    backend, driver = emulated_cuda
    sim = make(drag_planes())
    sim.run()
    rec = sim.record
    ck = rec.checkpoints
    assert sorted(ck) == [c * WINDOW for c in range(-(-rec.longest() // WINDOW))]
    assert all(isinstance(a, DeviceArray) and a.shape == (N,) for c in ck.values() for a in c.values())
    # the views share the Record's [windows, n] arrays: no copy, counted once
    per_state = {s: rec.checkpoint_arrays[s].nbytes // rec.checkpoint_arrays[s].shape[0] * len(ck)
                 for s in STATE}
    assert rec.nbytes == sum(per_state.values()) + N * 8
    assert isinstance(rec.steps_plane, DeviceArray)
    before = dict(driver.copies)
    steps = rec.steps                                     # read on the host: explicit, once
    assert rec.steps is steps and moved(driver, before) == {"htod": 0, "dtoh": 1, "dtod": 0}
    assert rec.longest() == steps.max() and rec.longest(0, N) == steps.max()
    assert np.asarray(ck[0]["x"]).tobytes() == drag_planes()["x"].tobytes()   # the initial state
    vkml.set_backend("numpy")
    try:
        want = make(drag_planes()).run().record.checkpoints         # a Python loop of steps
    finally:
        vkml.set_backend("cuda")
    assert sorted(want) == sorted(ck)
    for t in want:              # a sample that stopped before step t has no checkpoint there
        running = steps > t
        assert all(np.asarray(ck[t][s])[running].tobytes() == want[t][s][running].tobytes()
                   for s in STATE), t


@pytest.mark.parametrize("max_steps", [MAX_STEPS, 4 * MAX_STEPS])
def test_a_run_allocates_a_fixed_number_of_arrays_whatever_its_steps(emulated_cuda, max_steps):
    backend, driver = emulated_cuda
    sim = make(drag_planes(), max_steps=max_steps)
    counts = []
    for _ in range(3):
        before = driver.allocations
        sim.run()
        counts.append(driver.allocations - before)
    # final states, checkpoints (3 each), the steps, the scratch 'terminated', the control block;
    # the third run reuses the first one's memory (its Record was dropped by the second)
    assert counts[0] == 3 + 3 + 1 + 1 + 1 and counts[2] == 0


def test_a_run_that_fails_commits_nothing(emulated_cuda):
    backend, driver = emulated_cuda

    @vkml.kernel
    def hop(x, table: vkml.Param):
        return {"x": x + 1.0 + 0.0 * vkml.take(table, x.astype(np.int64))}

    # the samples reach index 5 of a table of 5 on their sixth step
    sim = vkml.simulation(hop, max_steps=10, record=True, window=4, x=np.linspace(0.0, 0.5, 8),
                          table=np.arange(5.0))
    assert sim.on_device
    before = {k: np.asarray(v).copy() for k, v in sim.planes.items()}
    with pytest.raises(vkml.ExecutionError, match="simulation step hop.*out of range"):
        sim.run()
    assert all(np.asarray(v).tobytes() == before[k].tobytes() for k, v in sim.planes.items())
    assert sim.generation == 0 and sim.record is None


# -- the NumPy backend's bits ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_states_steps_and_gradients_have_the_numpy_backends_bits(emulated_cuda, dtype):
    planes = drag_planes(300, dtype)
    want = on_numpy(planes)
    sim = make({k: np.copy(v) for k, v in planes.items()})
    assert sim.on_device
    got = outcome(sim, seeds_for(planes))
    assert len(set(got[1].tolist())) > 1                      # samples stop apart
    assert_bits(got, want)


def test_the_pendulums_bits_too(emulated_cuda):
    planes = _pendulum(200, np.random.default_rng(1))
    want = on_numpy(planes, pendulum, max_steps=100, window=9)
    got = outcome(make({k: np.copy(v) for k, v in planes.items()}, pendulum, max_steps=100,
                       window=9), seeds_for(planes, _state_of(pendulum)))
    assert_bits(got, want)


def test_a_budget_forcing_passes_keeps_the_bits_and_copies_only_checkpoint_windows(emulated_cuda):
    backend, driver = emulated_cuda
    n = 1000                                   # four passes of 256 samples, the last one short
    planes = drag_planes(n)
    budget = 256 * make(drag_planes(4)).per_sample_bytes + 1
    want = on_numpy(planes, memory_budget=budget)
    one_pass = on_numpy(planes)
    sim = make({k: np.copy(v) for k, v in planes.items()}, memory_budget=budget)
    assert sim.pass_size == 256
    sim.run()
    seeds = {s: backend.to_plane(v) for s, v in seeds_for(planes).items()}
    before = dict(driver.copies)
    grads = vkml.diff.reverse(sim.record, seeds)
    assert grads.report.chunks == 4
    windows = sim.record.checkpoint_arrays["x"].shape[0]
    # each pass: its control block in, its status block and its Param sum out; each pass's
    # checkpoints, one device copy per window and state plane (the other planes: views)
    assert moved(driver, before) == {"htod": 4, "dtoh": 8, "dtod": 4 * windows * 3}
    got = ({k: np.asarray(sim.planes[k]) for k in sim.launch.writes}, sim.record.steps,
           host(grads))
    assert_bits(got, want)
    assert_bits(got, one_pass)                 # the budget changes no bit


@pytest.mark.parametrize("window", ["binomial", "full"])
def test_schedules_stepped_from_the_host_have_the_numpy_backends_bits(emulated_cuda, window):
    planes = drag_planes(100)
    want = on_numpy(planes, window=window)
    sim = make({k: np.copy(v) for k, v in planes.items()}, window=window)
    assert sim.on_device and not sim.loops_on_device and isinstance(sim.planes["x"], DeviceArray)
    assert_bits(outcome(sim, seeds_for(planes)), want)


# -- another library's device arrays -----------------------------------------------------------------

def test_a_foreign_device_array_is_a_plane_without_a_copy_and_updated_in_place(emulated_cuda):
    backend, driver = emulated_cuda
    planes = drag_planes()
    want = on_numpy(planes)
    foreign = {k: ForeignArray(driver, planes[k]) for k in ("x", "v", "c")}
    before = dict(driver.copies)
    sim = make(dict(planes, **foreign))
    assert moved(driver, before) == {"htod": 3, "dtoh": 0, "dtod": 0}   # t, t_end, 'terminated'
    assert sim.planes["x"].ptr == foreign["x"].ptr
    seeds = {s: ForeignArray(driver, v) for s, v in seeds_for(planes).items()}
    sim.run()
    grads = vkml.diff.reverse(sim.record, seeds)
    assert foreign["x"].read().tobytes() == want[0]["x"].tobytes()        # written where it lies
    assert foreign["c"].read().tobytes() == planes["c"].tobytes()
    assert_bits(({k: np.asarray(sim.planes[k]) for k in sim.launch.writes}, sim.record.steps,
                 host(grads)), want)


def test_device_planes_and_seeds_that_do_not_fit_are_refused_and_change_nothing(emulated_cuda):
    backend, driver = emulated_cuda
    planes = drag_planes()
    with pytest.raises(vkml.DTypeError, match="typestr"):
        make(dict(planes, x=ForeignArray(driver, planes["x"].astype(np.float16))))
    with pytest.raises(vkml.ArgumentError, match="plane 'x' is read-only"):
        make(dict(planes, x=ForeignArray(driver, planes["x"], readonly=True)))
    sim = make(planes)
    sim.run()
    rec = sim.record
    state = {k: np.asarray(v).tobytes() for k, v in sim.planes.items()}
    before = dict(driver.copies)
    with pytest.raises(vkml.ShapeError, match="seed 'x' has shape"):
        vkml.diff.reverse(rec, {"x": np.ones(N + 1)})
    with pytest.raises(vkml.ShapeError, match="seed 'x' has shape"):
        vkml.diff.reverse(rec, {"x": ForeignArray(driver, np.ones(N - 1))})
    with pytest.raises(vkml.DTypeError, match="seed 'v' is a device array of float32"):
        vkml.diff.reverse(rec, {"v": ForeignArray(driver, np.ones(N, np.float32))})
    assert moved(driver, before) == {"htod": 0, "dtoh": 0, "dtod": 0}
    assert not rec.reversed and sim.record is rec and sim.generation == 1
    assert {k: np.asarray(v).tobytes() for k, v in sim.planes.items()} == state


def test_a_kept_record_copies_its_fixed_planes_on_the_device(emulated_cuda):
    backend, driver = emulated_cuda
    planes = drag_planes()
    sim = make(planes)
    sim.run()
    rec = sim.record
    seeds = {s: backend.to_plane(v) for s, v in seeds_for(planes).items()}
    first = host(vkml.diff.reverse(rec, seeds))
    before = dict(driver.copies)
    rec.keep()
    assert moved(driver, before) == {"htod": 0, "dtoh": 0, "dtod": 2}      # c and t_end
    backend.copy_plane_into(sim.planes["c"], np.zeros(N))                   # the user changes c
    sim.run()
    again = host(vkml.diff.reverse(rec, seeds))
    assert {k: v.tobytes() for k, v in again.items()} == {k: v.tobytes() for k, v in first.items()}


# -- the budget where the Record lives, and the host-stepped paths ---------------------------------------

def test_the_default_budget_is_half_the_free_memory_where_the_record_lives(emulated_cuda):
    backend, driver = emulated_cuda
    assert make(drag_planes()).memory_budget == backend.free_memory() // 2
    from vkml.graph.simulation import available_memory
    host_stepped = make(drag_planes(), window="binomial")
    assert host_stepped.memory_budget == available_memory(on_device=True) == backend.free_memory() // 2


def test_a_model_node_runs_on_host_copies_counted_per_step(emulated_cuda):
    backend, driver = emulated_cuda

    @vkml.kernel
    def pushed(x, corr, k: vkml.Param):
        return {"x": x + 0.1 * k * corr}

    def copies_of(max_steps):
        x, corr = np.linspace(0.5, 1.0, N), np.zeros(N)
        model = vkml.graph.opaque(lambda r: {"corr": -r["x"]}, reads={"x": x}, writes={"corr": corr},
                                  name="model")
        sim = vkml.until_done([model, pushed], max_steps=max_steps, record=True, x=x, corr=corr,
                              k=1.0)
        assert sim.on_device and not sim.loops_on_device           # device planes, host-stepped
        gc.collect()
        before = dict(driver.copies)
        sim.run()
        return moved(driver, before)

    # every step is a submission of the step program on device arrays (a CUDA-graph replay): in
    # go its pointer table and its small-argument block; out come its status words.  The model
    # node runs Python on host values: x comes out and 'corr' goes in, explicitly.  On the
    # device: the initial x into the Record, the final x into its plane
    assert copies_of(5) == {"htod": 3 * 5, "dtoh": 2 * 5, "dtod": 2}
    assert copies_of(10) == {"htod": 3 * 10, "dtoh": 2 * 10, "dtod": 2}


def test_a_simulation_on_the_gpu_is_refused_on_another_backend(emulated_cuda):
    backend, driver = emulated_cuda
    sim = make(drag_planes())
    sim.run()
    vkml.set_backend("numpy")
    try:
        for call in (sim.run, lambda: vkml.diff.reverse(sim.record, {"x": np.ones(N)})):
            with pytest.raises(vkml.BackendError, match="set_backend\\('cuda'\\) first"):
                call()
        assert sim.generation == 1 and not sim.record.reversed
    finally:
        vkml.set_backend("cuda")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_steps_summary_kernel_compiles_with_nvcc(tmp_path):
    """``vk_steps_longest`` (the forward's summary of steps per block of samples) is hand-written
    CUDA beside the generated loops: it compiles with the backend's flags, without a word."""
    source = tmp_path / "steps_longest.cu"
    source.write_text(cuda_loops.STEPS_LONGEST)
    out = tmp_path / "steps_longest.ptx"
    proc = subprocess.run([NVCC, "--ptx", "-arch=sm_90", *cuda_render.NVCC_FLAGS, "-o", str(out),
                           str(source)], capture_output=True, text=True)
    assert proc.returncode == 0 and (proc.stdout + proc.stderr).strip() == "", proc.stderr[-4000:]
    assert ".entry vk_steps_longest(" in out.read_text()
