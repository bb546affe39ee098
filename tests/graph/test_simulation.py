"""Recorded simulations and their checkpointed reverse: a memory budget, and a model of the
user's (an opaque node with its vjp) inside a recorded loop.

Gradients are checked against central finite differences of the forward run
and against a plain NumPy loop of the same step; the bitwise claims (memory
budgets, threads) with ``np.array_equal``; the memory claim with tracemalloc.
"""

from __future__ import annotations

import gc
import math
import os
import threading
import tracemalloc

import numpy as np
import pytest

import vkml
from vkml.backends import background
from vkml.errors import VkmlError
from vkml.graph.simulation import binomial_cost
from models import pendulum

DT = 0.01
H = 1e-6


@vkml.kernel
def free_pendulum(theta, omega, length: vkml.Param, damping: vkml.Param):
    acc = -9.81 / length * vkml.sin(theta) - damping * omega
    om = omega + DT * acc
    return {"theta": theta + DT * om, "omega": om}


def numpy_pendulum(theta, omega, t_end, length, damping, max_steps):
    """The same step in NumPy, each sample stopping after the step at which t >= t_end."""
    theta, omega = theta.copy(), omega.copy()
    t = np.zeros_like(theta)
    active = np.ones(theta.shape, bool)
    steps = np.zeros(theta.shape, np.int64)
    for _ in range(max_steps):
        if not active.any():
            break
        om = omega + DT * (-9.81 / length * np.sin(theta) - damping * omega)
        th = theta + DT * om
        tn = t + DT
        theta, omega, t = (np.where(active, th, theta), np.where(active, om, omega),
                           np.where(active, tn, t))
        steps += active
        active &= ~(tn >= t_end)
    return theta, omega, steps


def make(theta0, omega0, t_end, *, length=1.0, damping=0.1, max_steps=400, record=True, **kw):
    n = theta0.shape[0]
    return vkml.simulation(pendulum, max_steps=max_steps, record=record, theta=theta0.copy(),
                           omega=omega0.copy(), t=np.zeros(n), t_end=t_end, length=length,
                           damping=damping, **kw)


def final(theta0, omega0, t_end, **kw):
    sim = make(theta0, omega0, t_end, record=False, **kw)
    sim.run()
    return sim.launch.writes["theta"].copy(), sim.launch.writes["omega"].copy()


def setup(n=64, seed=0):
    rng = np.random.default_rng(seed)
    theta0 = rng.uniform(0.1, 1.2, n)
    omega0 = rng.uniform(-0.5, 0.5, n)
    # end times off the step grid (no sample sits on a tie), some past max_steps * DT
    t_end = np.round(rng.uniform(0.3, 4.5, n), 2) + 0.005
    return theta0, omega0, t_end


def test_damped_pendulum_samples_stop_at_their_own_end_times_against_finite_differences():
    theta0, omega0, t_end = setup()
    n = theta0.size
    sim = make(theta0, omega0, t_end)
    sim.run()
    th_np, om_np, steps_np = numpy_pendulum(theta0, omega0, t_end, 1.0, 0.1, 400)
    assert np.array_equal(sim.record.steps, steps_np)
    assert len(set(sim.record.steps.tolist())) > 20 and sim.record.steps.max() == 400
    np.testing.assert_allclose(sim.launch.writes["theta"], th_np, rtol=1e-12, atol=1e-14)
    w_th, w_om = np.linspace(1, 2, n), np.linspace(-1, 0.5, n)
    grads = vkml.diff.reverse(sim.record, {"theta": w_th, "omega": w_om})

    def J(th, om):
        return w_th * th + w_om * om                      # per sample: the Jacobian is diagonal
    fd_th = (J(*final(theta0 + H, omega0, t_end)) - J(*final(theta0 - H, omega0, t_end))) / (2 * H)
    fd_om = (J(*final(theta0, omega0 + H, t_end)) - J(*final(theta0, omega0 - H, t_end))) / (2 * H)
    fd_len = np.sum(J(*final(theta0, omega0, t_end, length=1 + H)) -
                    J(*final(theta0, omega0, t_end, length=1 - H))) / (2 * H)
    fd_damp = np.sum(J(*final(theta0, omega0, t_end, damping=0.1 + H)) -
                     J(*final(theta0, omega0, t_end, damping=0.1 - H))) / (2 * H)
    np.testing.assert_allclose(grads["theta"], fd_th, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grads["omega"], fd_om, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grads["length"], fd_len, rtol=1e-6)
    np.testing.assert_allclose(grads["damping"], fd_damp, rtol=1e-6)
    assert grads.report.chunks == 1 and grads.report.generation == 1


def fingerprint(record):
    """A hash of every array a simulation Record holds or points at."""
    import hashlib
    h = hashlib.sha256()
    arrays = [record.steps] + list(record.fixed.values()) + list(record.cells.values())
    for group in (record.checkpoints, record.states_all or {}):
        for t in sorted(group):
            arrays += [group[t][k] for k in sorted(group[t])]
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def test_window_full_and_binomial_agree_to_rounding():
    theta0, omega0, t_end = setup()
    seeds = {"theta": np.ones(theta0.size)}
    out = {}
    for window in (20, 7, "full", "binomial"):
        sim = make(theta0, omega0, t_end, window=window)
        sim.run()
        before = fingerprint(sim.record)
        out[window] = vkml.diff.reverse(sim.record, seeds)
        assert fingerprint(sim.record) == before, window      # a reverse never writes the Record
    assert out["full"].report.recomputed_steps == 0
    assert out[20].report.recomputed_steps > 0 and out["binomial"].report.recomputed_steps > 0
    for window in (7, "full", "binomial"):
        for name in ("theta", "omega", "length", "damping"):
            np.testing.assert_allclose(out[window][name], out[20][name], rtol=1e-12, atol=1e-15)


def test_binomial_recomputes_fewer_steps_than_fixed_windows_for_the_same_held_states():
    """A run to max_steps = 400 (no sample terminates): window=20 holds 20 checkpoints + 19
    recomputed window states and recomputes 19 steps per window; Revolve holding as many states
    (the start, 37 snapshots and the state before the last step) recomputes fewer."""
    n = 256
    theta0 = np.linspace(0.1, 1.0, n)
    cost = {}
    for window, kw in ((20, {}), (10, {}), (40, {}), ("binomial", {"snapshots": 37})):
        sim = vkml.simulation(free_pendulum, max_steps=400, record=True, window=window,
                              theta=theta0.copy(), omega=np.zeros(n), length=1.0, damping=0.1, **kw)
        sim.run()
        assert sim.record.steps.min() == 400
        rep = vkml.diff.reverse(sim.record, {"theta": np.ones(n)}).report
        cost[window if not kw else "binomial"] = (rep.recomputed_steps, rep.peak_states)
    print("recomputed steps, peak states:", cost)
    assert cost[20] == (380, 39) and cost[10] == (360, 49) and cost[40] == (390, 49)
    rec_b, peak_b = cost["binomial"]
    assert peak_b <= cost[20][1] and rec_b < cost[20][0]
    assert peak_b < cost[10][1] and rec_b < cost[40][0]
    # Griewank's count: the forward steps of Revolve with 38 checkpoints besides the start, less
    # the first sweep's 399, which the recorded run has already taken
    assert rec_b == binomial_cost(400, 37) - 399


def _budget_run(n, budget_passes, seeds):
    theta0, omega0, t_end = setup(n=n, seed=7)
    probe = make(theta0, omega0, t_end, max_steps=30, window=5)
    psb = probe.per_sample_bytes
    size = {1: n, 2: 4096, 3: 2048, 5: 1024, 20: 256}[budget_passes]
    sim = make(theta0, omega0, t_end, max_steps=30, window=5, memory_budget=size * psb)
    sim.run()
    return vkml.diff.reverse(sim.record, seeds)


def test_memory_budget_passes_give_the_same_bits():
    """n = 5000: budgets for passes of 5000 (1 pass), 4096 (2), 1024 (5) and 256 (20) samples."""
    n = 5000
    rng = np.random.default_rng(3)
    seeds = {"theta": rng.uniform(0.5, 1.5, n), "omega": rng.uniform(-1, 1, n)}
    runs = {p: _budget_run(n, p, seeds) for p in (1, 2, 5, 20)}
    for p, grads in runs.items():
        assert grads.report.chunks == p
        for name in ("theta", "omega", "length", "damping"):
            assert np.array_equal(grads[name], runs[1][name]), (p, name)
    theta0, omega0, t_end = setup(n=n, seed=7)
    fd = np.sum(seeds["theta"] * (final(theta0, omega0, t_end, max_steps=30, length=1 + H)[0] -
                                  final(theta0, omega0, t_end, max_steps=30, length=1 - H)[0])) / (2 * H)
    grads_theta_only = _budget_run(n, 5, {"theta": seeds["theta"]})
    np.testing.assert_allclose(grads_theta_only["length"], fd, rtol=1e-6)


def test_threads_give_the_same_bits_in_a_simulation():
    n = 2000
    theta0, omega0, t_end = setup(n=n, seed=9)
    out = {}
    old = os.environ.get("VKML_THREADS")
    try:
        for t in (1, 2, 4):
            os.environ["VKML_THREADS"] = str(t)
            sim = make(theta0, omega0, t_end, max_steps=40, window=6)
            sim.run()
            out[t] = vkml.diff.reverse(sim.record, {"theta": np.ones(n)})
    finally:
        if old is None:
            os.environ.pop("VKML_THREADS", None)
        else:
            os.environ["VKML_THREADS"] = old
    for t in (2, 4):
        for name in ("theta", "omega", "length", "damping"):
            assert np.array_equal(out[t][name], out[1][name]), (t, name)


def test_reverse_of_a_simulation_is_repeatable_and_a_stale_record_is_refused_unless_kept():
    theta0, omega0, t_end = setup(n=32)
    sim = make(theta0, omega0, t_end, max_steps=100, window=10)
    sim.run()
    old = sim.record
    a = vkml.diff.reverse(old, {"theta": np.ones(32)})
    b = vkml.diff.Reverse(sim)(old, {"theta": np.ones(32)})
    assert np.array_equal(a["theta"], b["theta"]) and a["length"] == b["length"]
    sim.launch.writes["theta"][...] = theta0 * 0.5           # the planes are the caller's to reset
    sim.launch.writes["omega"][...] = 0.0
    sim.launch.reads["t"][...] = 0.0
    sim.run()
    with pytest.raises(VkmlError, match=r"generation 1, but the simulation has run since and is at "
                                        r"generation 2.*keep\(\)"):
        vkml.diff.reverse(old, {"theta": np.ones(32)})
    kept = sim.record.keep()
    expect = vkml.diff.reverse(kept, {"theta": np.ones(32)})
    sim.launch.reads["t"][...] = 0.0
    sim.run()
    later = vkml.diff.reverse(kept, {"theta": np.ones(32)})
    assert np.array_equal(later["theta"], expect["theta"]) and later["length"] == expect["length"]


@vkml.kernel
def forced(x, f, k: vkml.Param):
    return {"x": x + 0.1 * vkml.sin(k * x) * f}


def test_kept_simulation_record_copies_the_per_sample_inputs_it_reads():
    n = 32
    x0, f = np.linspace(0.1, 1.0, n), np.linspace(1.0, 3.0, n)
    x = x0.copy()
    sim = vkml.simulation(forced, max_steps=25, record=True, window=5, x=x, f=f, k=0.8)
    sim.run()
    kept = sim.record.keep()
    expect = vkml.diff.reverse(kept, {"x": np.ones(n)})
    f[...] = -5.0                                            # the next run's forcing
    x[...] = x0
    sim.run()
    later = vkml.diff.reverse(kept, {"x": np.ones(n)})
    assert np.array_equal(later["x"], expect["x"]) and np.array_equal(later["f"], expect["f"])
    assert later["k"] == expect["k"]
    fresh = vkml.diff.reverse(sim.record, {"x": np.ones(n)})
    assert not np.array_equal(fresh["x"], expect["x"])
    # against finite differences of the first run
    f[...] = np.linspace(1.0, 3.0, n)

    def fwd(xv, k=0.8):
        xs = xv.copy()
        vkml.simulation(forced, max_steps=25, x=xs, f=f, k=k).run()
        return xs
    np.testing.assert_allclose(expect["x"], (fwd(x0 + H) - fwd(x0 - H)) / (2 * H), rtol=1e-6)
    np.testing.assert_allclose(expect["k"], np.sum(fwd(x0, 0.8 + H) - fwd(x0, 0.8 - H)) / (2 * H),
                               rtol=1e-6)


# -- a user model node inside a recorded loop ----------------------------------------------------

@vkml.kernel
def oscillator(x, v, corr, k: vkml.Param):
    v2 = v + 0.05 * (corr - k * x)
    return {"x": x + 0.05 * v2, "v": v2}


@vkml.kernel
def oscillator_until(x, v, corr, t, t_end, k: vkml.Param):
    v2 = v + 0.05 * (corr - k * x)
    return {"x": x + 0.05 * v2, "v": v2, "t": t + 1.0, "terminated": t + 1.0 >= t_end}


class Model:
    """corr = -w x^3 v^0 (pure: same inputs, same outputs); its vjp accumulates dJ/dw."""

    def __init__(self, w):
        self.w, self.grad, self.calls = w, 0.0, 0

    def __call__(self, reads):
        return {"corr": -self.w * reads["x"] ** 3}

    def vjp(self, primals, cts):
        self.calls += 1
        self.grad += float(np.sum(-primals["x"] ** 3 * cts["corr"]))
        return {"x": -3 * self.w * primals["x"] ** 2 * cts["corr"]}


def _until_done(model, x0, k, *, record=True, window=None, max_steps=60, stop=False):
    n = x0.size
    x, v, corr = x0.copy(), np.zeros(n), np.zeros(n)
    node = vkml.graph.opaque(model, reads={"x": x, "v": v}, writes={"corr": corr}, name="model")
    if stop:                     # sample i stops after 20 + i steps: the vjp sees fewer samples
        planes = dict(t=np.zeros(n), t_end=20.0 + np.arange(n))
        step = oscillator_until
    else:
        planes, step = {}, oscillator
    runner = vkml.until_done([node, step], max_steps=max_steps, record=record, window=window,
                             x=x, v=v, corr=corr, k=k, **planes)
    runner.run()
    return runner, x


@pytest.mark.parametrize("stop", [False, True])
def test_until_done_with_an_opaque_node_and_its_vjp_against_finite_differences(stop):
    n = 48
    x0 = np.linspace(-0.9, 0.9, n)
    model = Model(0.7)
    runner, x = _until_done(model, x0, 1.3, window=8, stop=stop)
    if stop:
        assert np.array_equal(runner.record.steps, np.minimum(20 + np.arange(n), 60))
    seed = np.linspace(1, 2, n)
    grads = vkml.diff.reverse(runner.record, {"x": seed}, vjps={"model": model.vjp})
    assert model.calls == 60                                   # once per step

    def fwd(xv=x0, k=1.3):
        return _until_done(model, xv, k, record=False, stop=stop)[1]
    fd_x = (fwd(xv=x0 + H) - fwd(xv=x0 - H)) / (2 * H)
    fd_k = np.sum(seed * (fwd(k=1.3 + H) - fwd(k=1.3 - H))) / (2 * H)
    np.testing.assert_allclose(grads["x"], seed * fd_x, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(grads["k"], fd_k, rtol=1e-6)
    w_grad, w = model.grad, model.w
    model.w = w + H
    hi = np.sum(seed * fwd())
    model.w = w - H
    lo = np.sum(seed * fwd())
    model.w = w                                                 # exactly as it was
    np.testing.assert_allclose(w_grad, (hi - lo) / (2 * H), rtol=1e-6)
    # reverse twice, compare: the check that catches an impure node
    model.grad = 0.0
    again = vkml.diff.reverse(runner.record, {"x": seed}, vjps={"model": model.vjp})
    assert np.array_equal(again["x"], grads["x"]) and model.grad == w_grad


def test_run_or_a_shared_reverse_while_a_simulation_reverse_reads_its_record_is_busy():
    n = 16
    x0 = np.linspace(-0.9, 0.9, n)
    model = Model(0.7)
    runner, x = _until_done(model, x0, 1.3, window=8, max_steps=20)
    seen = {}
    rev = None

    def vjp(primals, cts):
        if not seen:
            seen["run"] = _catch(runner.run)
            t = threading.Thread(target=lambda: seen.setdefault("shared", _catch(
                lambda: rev(runner.record, {"x": np.ones(n)}))))
            t.start()
            t.join()
            d = vkml.diff.Reverse(runner, vjps={"model": Model(0.7).vjp})
            t = threading.Thread(target=lambda: seen.setdefault("distinct", d(runner.record,
                                                                              {"x": np.ones(n)})))
            t.start()
            t.join()
        return model.vjp(primals, cts)

    rev = vkml.diff.Reverse(runner, vjps={"model": vjp})
    x_after = x.copy()
    grads = rev(runner.record, {"x": np.ones(n)})
    assert "a reverse is reading the last Record" in seen["run"]
    assert "another thread is running this Reverse" in seen["shared"]
    assert np.array_equal(seen["distinct"]["x"], grads["x"])
    assert runner.generation == 1 and np.array_equal(x, x_after)      # the refused run did nothing
    runner.run()                                                      # free again afterwards
    assert runner.generation == 2


def _catch(fn):
    try:
        fn()
        return "ran"
    except vkml.Busy as err:
        return str(err)


# -- memory ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_reverse_peak_memory_follows_the_window_formula(vk_backend):
    """A recorded 4000-step pendulum: what the reverse holds at its peak is the Record's checkpoints
    (ceil(4000/window) states) plus one window of recomputed states, plus small temporaries.

    Measured: the bytes of the checkpoint arrays the Record holds, plus tracemalloc's peak during the
    reverse above its starting point (every array the reverse allocates: recomputed states,
    adjoints, temporaries).  The run itself is not traced, to keep the test fast."""
    if vk_backend != "numpy":
        pytest.skip("the held states are NumPy arrays the graph layer allocates on every backend; "
                    "measured once, on the reference backend, to keep the suite fast")
    n, steps = 256, 4000
    theta0 = np.linspace(0.1, 1.0, n)
    state_bytes = 2 * 8 * n                               # theta and omega, float64
    warm = vkml.simulation(free_pendulum, max_steps=3, record=True, window=2, theta=theta0.copy(),
                           omega=np.zeros(n), length=1.0, damping=0.1)
    warm.run()
    vkml.diff.reverse(warm.record, {"theta": np.ones(n)})    # compile outside the measurement
    rows = []
    for window in (16, 64, 400):
        sim = vkml.simulation(free_pendulum, max_steps=steps, record=True, window=window,
                              theta=theta0.copy(), omega=np.zeros(n), length=1.0, damping=0.1)
        sim.run()
        held = sum(a.nbytes for c in sim.record.checkpoints.values() for a in c.values())
        background.wait()       # tracemalloc counts every thread: no earlier test's build running
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            grads = vkml.diff.reverse(sim.record, {"theta": np.ones(n)})
            extra = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        formula = (math.ceil(steps / window) + window) * state_bytes
        rows.append((window, formula, held, extra, (held + extra) / formula))
        assert held == math.ceil(steps / window) * state_bytes
        # the checkpoints not yet reversed and one window's states recomputed from its checkpoint
        assert grads.report.peak_states == sim.schedule.predicted_peak_states(steps) <= \
            math.ceil(steps / window) + window - 1
    for window, formula, held, extra, ratio in rows:
        print(f"window {window:4d}: formula {formula:>9,} B; checkpoints {held:>9,} B + reverse "
              f"peak {extra:>9,} B = {held + extra:>9,} B, measured/formula {ratio:.2f}")
    for window, formula, held, extra, ratio in rows:
        assert 0.9 < ratio < 2.0, (window, ratio)
        # the reverse's own share is about one window of states, not two
        assert extra < 1.6 * window * state_bytes + 64_000, (window, extra)
    total = {w: h + e for w, _, h, e, _ in rows}
    assert total[64] < total[16] < total[400]               # formula: 127 < 266 < 410 states


def test_default_window_and_memory_budget():
    """window: clamp(ceil(sqrt(max_steps)), 16, 1024); memory_budget: half the available host RAM
    (on a GPU backend, at most half its free device memory)."""
    n = 8
    for max_steps, window in ((1, 16), (100, 16), (400, 20), (401, 21), (4000, 64), (10**7, 1024)):
        sim = vkml.simulation(free_pendulum, max_steps=max_steps, record=True, theta=np.zeros(n),
                              omega=np.zeros(n), length=1.0, damping=0.1)
        assert sim.window == window, max_steps
        assert sim.per_sample_bytes == (math.ceil(max_steps / window) + window) * 16
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    device = getattr(vkml.backends.current(), "free_memory", None)
    if device is not None:
        avail = min(avail, device())
    assert abs(sim.memory_budget - avail / 2) < 0.1 * avail


@vkml.kernel
def _shared_end_pendulum(theta, omega, t, length: vkml.Param, t_end: vkml.Param):
    om = omega - 0.01 * (9.81 / length) * vkml.sin(theta)
    return {"theta": theta + 0.01 * om, "omega": om, "t": t + 0.01, "terminated": t + 0.01 >= t_end}


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_stop_flag_that_is_not_one_bool_per_sample_is_refused_by_name(backend):
    """A Param given as an array of n values is one array shared by every sample: comparing the
    per-sample time with it gives n flags per sample, which the numpy run crashed on and the
    compiled run read past."""
    n = 4
    theta, omega, t = np.full(n, 0.5), np.zeros(n), np.zeros(n)
    before = theta.copy()
    with vkml.use_backend(backend):
        with pytest.raises(vkml.ShapeError, match=r"'terminated' is one bool per sample.*t_end"):
            vkml.simulation(_shared_end_pendulum, max_steps=5, theta=theta, omega=omega, t=t,
                            length=1.2, t_end=np.ones(n)).run()
        np.testing.assert_array_equal(theta, before)           # refused before anything ran
        sim = vkml.simulation(_shared_end_pendulum, max_steps=5, theta=theta, omega=omega, t=t,
                              length=1.2, t_end=0.02)            # one end time for all: fine
        sim.run()
    assert not np.array_equal(theta, before)
