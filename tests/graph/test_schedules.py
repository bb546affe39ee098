"""Checkpoint schedules of recorded simulations (vkml.graph.simulation.schedules).

The binomial schedule's recomputation is checked against an independent dynamic program over
(steps, snapshots) -- a brute-force minimum over every first checkpoint, not the closed form
the schedule uses.  What both count: the recorded run stores the initial state, the state
before the last step and ``snapshots`` checkpoints wherever it likes (the run passes every
state once anyway); the reverse needs the state before each step, and a recomputed step is one
step the reverse takes forward again to rebuild a state it does not hold.  The measured counts
of real reverses are checked against the schedules' predictions, and the gradients of every
schedule against ``window="full"`` (which recomputes nothing) bit for bit (within a few ulps for
a window schedule on the cpu tier, whose compiled loops call the vector sin).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import vkml
from backends_under_test import BACKENDS
from vkml.backends import cpu
from vkml.graph.simulation.schedules import Binomial, Full, Window, walk
from models import pendulum

MOST_STEPS, MOST_SNAPSHOTS = 130, 7


@lru_cache(maxsize=None)
def tables():
    """Bottom-up over (steps, snapshots), each entry a brute-force minimum over every first
    checkpoint m:

    ``reverse_only[l][s]``: fewest recomputed steps to reverse l steps holding only their start
    state, with s slots for more (each state rebuilt from the start when s = 0; else m steps to
    the first checkpoint, its right part with one slot fewer, then the left part with the slot
    back);

    ``recorded[l][s]``: the same for a recorded run, which also holds the state before the last
    step and placed its s checkpoints for free on its way."""
    reverse_only = [[0] * MOST_SNAPSHOTS for _ in range(MOST_STEPS + 1)]
    recorded = [[0] * MOST_SNAPSHOTS for _ in range(MOST_STEPS + 1)]
    for steps in range(2, MOST_STEPS + 1):
        for snaps in range(MOST_SNAPSHOTS):
            best = steps * (steps - 1) // 2
            end = (steps - 1) * (steps - 2) // 2       # every state but the last from the start
            if snaps:
                best = min([best] + [m + reverse_only[steps - m][snaps - 1] + reverse_only[m][snaps]
                                     for m in range(1, steps)])
                end = min([end] + [reverse_only[m][snaps] + recorded[steps - m][snaps - 1]
                                   for m in range(1, steps)])
            reverse_only[steps][snaps], recorded[steps][snaps] = best, end
    return recorded


def optimum(steps, snapshots):
    return tables()[steps][snapshots]


def test_the_issues_numbers_old_and_optimal():
    """Before, snapshots=s recomputed what the optimum needs with s - 1 snapshots."""
    assert (optimum(10, 0), optimum(10, 1)) == (36, 11)
    assert (optimum(100, 2), optimum(100, 3)) == (391, 275)
    assert Binomial(1).predicted_recomputed_steps(10) == 11
    assert Binomial(3).predicted_recomputed_steps(100) == 275


@pytest.mark.parametrize("steps", list(range(1, 61)) + [77, 100, 128, MOST_STEPS])
def test_binomial_reaches_the_optimum(steps):
    for snapshots in range(0, 7):
        schedule = Binomial(snapshots)
        planned, peak = walk(schedule, steps)
        assert planned == schedule.predicted_recomputed_steps(steps) == optimum(steps, snapshots), \
            (steps, snapshots)
        assert len(schedule.stored_steps(steps)) <= snapshots + 2
        assert peak <= snapshots + 2, (steps, snapshots, peak)


def check_plan(schedule, steps, last):
    """Every step below ``last`` reversed once, from the last; every state used is held."""
    held = {t for t in schedule.stored_steps(steps) if t < last}
    reversed_steps = []
    for action in schedule.plan(steps, last):
        if action[0] == "recompute":
            _, c, t = action
            assert c in held and c < t < last, (schedule, action)
            held.add(t)
        else:
            t = action[1]
            assert t in held, (schedule, action)
            held.discard(t)
            reversed_steps.append(t)
    assert reversed_steps == list(reversed(range(last))), schedule


@pytest.mark.parametrize("schedule", [Full(), Window(1), Window(3), Window(8), Binomial(0),
                                      Binomial(1), Binomial(2), Binomial(5), Binomial(40)],
                         ids=repr)
def test_plans_reverse_every_step_once_from_held_states(schedule):
    for steps in (1, 2, 3, 7, 16, 31):
        for last in sorted({0, 1, steps // 2, steps - 1, steps}):
            check_plan(schedule, steps, last)


@pytest.mark.parametrize("schedule", [Full(), Window(1), Window(2), Window(3), Window(7), Window(20)],
                         ids=repr)
def test_closed_forms_count_what_the_plan_does(schedule):
    for steps in range(0, 70):
        assert walk(schedule, steps) == (schedule.predicted_recomputed_steps(steps),
                                         schedule.predicted_peak_states(steps)), steps


DT = 0.01


SCHEDULES = [("full", {}), (1, {}), (4, {}), (9, {}), ("binomial", {}), ("binomial", {"snapshots": 0}),
             ("binomial", {"snapshots": 1}), ("binomial", {"snapshots": 3}),
             ("binomial", {"snapshots": 30})]


def reverse_with(window, kw, max_steps, t_end):
    n = t_end.size
    rng = np.random.default_rng(11)
    sim = vkml.simulation(pendulum, max_steps=max_steps, record=True, window=window,
                          theta=rng.uniform(0.1, 1.0, n), omega=rng.normal(size=n), t=np.zeros(n),
                          t_end=t_end, length=1.3, damping=0.2, **kw)
    sim.run()
    grads = vkml.diff.reverse(sim.record, {"theta": np.linspace(0.5, 1.5, n), "omega": np.ones(n)})
    return sim, grads


@pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("max_steps", [1, 2, 13, 40])
def test_measured_counts_match_the_prediction_and_gradients_match_full(vk_backend, max_steps):
    """Runs where no sample stops early (the counts are the predictions) and where all do (the
    plan leaves out the steps past the last, so the counts are those of the shortened plan)."""
    n = 19
    for t_end in (np.full(n, 1e9), np.linspace(0.02, 0.25, n)):
        _, reference = reverse_with("full", {}, max_steps, t_end)
        for window, kw in SCHEDULES:
            sim, grads = reverse_with(window, kw, max_steps, t_end)
            last = int(sim.record.steps.max())
            report = grads.report
            if last == max_steps:
                assert report.recomputed_steps == sim.schedule.predicted_recomputed_steps(max_steps)
                assert report.peak_states == sim.schedule.predicted_peak_states(max_steps)
            assert (report.recomputed_steps, report.peak_states) == walk(sim.schedule, max_steps, last)
            assert report.recomputed_steps <= sim.schedule.predicted_recomputed_steps(max_steps)
            for name in ("theta", "omega", "length", "damping"):
                got, want = np.asarray(grads[name]), np.asarray(reference[name])
                if vector_sin(vk_backend, window):
                    np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"{window} {kw} {name}")
                else:
                    assert got.tobytes() == want.tobytes(), (window, kw, name)


def vector_sin(backend, window):
    """Whether a window schedule's sin on this backend is the cpu tier's vector version (its
    per-sample loops call glibc's libmvec), which differs from the scalar libm that "full" and
    "binomial" use there by a few ulps: those compare within 1e-12, not bit for bit."""
    return backend == "cpu" and isinstance(window, int) and bool(cpu.vector_math())


def test_binomial_recomputes_fewer_steps_than_before_on_a_real_run():
    """10 steps, 1 snapshot: 11 recomputed steps (the old placement spent the snapshot on the
    state before the last step and recomputed 36)."""
    sim, grads = reverse_with("binomial", {"snapshots": 1}, 10, np.full(5, 1e9))
    assert grads.report.recomputed_steps == 11
    assert sim.record.steps.min() == 10


@pytest.mark.parametrize("make", [lambda: Binomial(-1), lambda: Window(0), lambda: Window(-3),
                                  lambda: Window(2.5), lambda: Binomial("3")])
def test_a_schedule_with_a_bad_size_is_refused_by_name(make):
    with pytest.raises(vkml.ArgumentError, match="Window|Binomial"):
        make()
