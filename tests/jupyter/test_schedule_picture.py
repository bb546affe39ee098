"""The picture of a checkpoint schedule (vkml.viz.checkpoint_schedule) and the memory-budget
slider on it (vkml.widgets.explore_schedule).

The picture is read back as SVG: the recomputed steps are measured from the drawn recompute
strokes (their length in time, in units of the drawn forward run's length per step) and the peak
from the drawn memory curve, and both must equal the schedule objects' predictions; the
schedules' own predictions are checked against an independent optimum in tests/test_schedules.py.
The slider is driven from Python (it must not run the model), and its run button's measured
counts, from the reverse's own report, must equal the prediction.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import vkml
from vkml import viz
from vkml.errors import ArgumentError, VkmlError
from vkml.graph.simulation.schedules import Binomial, Full, Window, walk
from vkml.graph.simulation import Simulation
from vkml.graph.simulation.host_steps import HostSteps
from vkml.viz_schedule import WIDTH, SchedulePicture

pytest.importorskip("ipywidgets")
from vkml_jupyter.schedule_explorer import schedule_for  # noqa: E402
from models import pendulum

SVG = "{http://www.w3.org/2000/svg}"


def paths(svg_text):
    """``{class: d}`` of the picture's paths (the strokes of each kind of action)."""
    root = ET.fromstring(svg_text)
    return {p.get("class"): p.get("d") for p in root.iter(SVG + "path")}


def segments(d):
    """``[(x0, y0, x1, y1)]`` of a path made of ``M x y L x y`` segments."""
    return [tuple(map(float, m)) for m in
            re.findall(r"M([-\d.]+) ([-\d.]+)L([-\d.]+) ([-\d.]+)", d or "")]


def drawn_steps(picture, kind):
    """The steps of one kind read from the SVG: the strokes' length in time, measured in the
    forward run's drawn length per step."""
    drawn = paths(picture.svg())
    (fx0, _, fx1, _), = segments(drawn["forward"])
    per_step = (fx1 - fx0) / picture.last
    total = sum(x1 - x0 for x0, _, x1, _ in segments(drawn.get(kind)))
    assert "V" not in (drawn.get(kind) or ""), "a stroke was merged into a pixel column"
    return round(total / per_step)


def drawn_peak_is_predicted(picture):
    """The memory curve's highest point lies on the predicted-peak line (and never above it)."""
    drawn = paths(picture.svg())
    peak_y = float(re.match(r"M[-\d.]+ ([-\d.]+)", drawn["grid predicted-peak"]).group(1))
    ys = [float(v) for v in re.findall(r"[MV][-\d.]+ ?([-\d.]+)?", drawn["memory"]) if v]
    ys += [float(v) for v in re.findall(r"V([-\d.]+)", drawn["memory"])]
    return min(ys) == peak_y


SMALL = [(steps, snaps) for steps in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144)
         for snaps in range(0, 7)]


@pytest.mark.parametrize("steps,snapshots", SMALL)
def test_binomial_counts_in_the_picture_match_the_predictions(steps, snapshots):
    schedule = Binomial(snapshots)
    picture = viz.checkpoint_schedule(schedule, steps)
    predicted = schedule.predicted_recomputed_steps(steps)
    peak = schedule.predicted_peak_states(steps)
    # counted from the drawn actions, for every pair
    assert (picture.recomputed_steps, picture.peak_states) == (predicted, peak)
    tl = picture.timeline
    assert sum(t1 - t0 for t0, _, t1, _ in tl.segments["recompute"]) == predicted
    assert sum(t1 - t0 for t0, _, t1, _ in tl.segments["reverse"]) == steps
    assert max(v for _, v in tl.memory) == peak
    # measured on the SVG itself where every step is at least a pixel wide
    if tl.duration <= WIDTH - 90:
        assert drawn_steps(picture, "recompute") == predicted
        assert drawn_steps(picture, "reverse") == steps
    assert drawn_peak_is_predicted(picture)
    assert f"recomputes {predicted:,} step" in picture.caption
    assert f"predicted: {predicted:,} recomputed, peak {peak:,}" in picture.caption


@pytest.mark.parametrize("schedule", [Full(), Window(1), Window(3), Window(8), Window(40)],
                         ids=repr)
def test_window_and_full_counts_in_the_picture_match_the_predictions(schedule):
    for steps in (1, 2, 7, 16, 40, 100, 250):
        picture = viz.checkpoint_schedule(schedule, steps)
        predicted = schedule.predicted_recomputed_steps(steps)
        assert picture.recomputed_steps == predicted
        assert picture.peak_states == schedule.predicted_peak_states(steps)
        assert drawn_steps(picture, "recompute") == predicted
        assert drawn_peak_is_predicted(picture)


def test_snapshots_are_drawn_where_the_run_stores_them():
    picture = viz.checkpoint_schedule(Binomial(3), 30)
    stored = set(Binomial(3).stored_steps(30))
    assert {step for step, _, _ in picture.timeline.snapshots} == stored
    root = ET.fromstring(picture.svg())
    circles = [c for c in root.iter(SVG + "circle")]
    assert len(circles) == len(stored)


def test_width_fits_the_output_area_and_long_plans_stay_small():
    for schedule, steps in [(Binomial(0), 200_000), (Full(), 200_000), (Window(1), 100_000),
                            (Binomial(5), 50_000)]:
        picture = viz.checkpoint_schedule(schedule, steps)
        svg = picture.svg()
        root = ET.fromstring(svg)
        assert int(root.get("width")) <= 1000
        assert root.get("viewBox").split()[2] == root.get("width")
        assert len(svg) < 200_000, (schedule, len(svg))
        assert picture.recomputed_steps == schedule.predicted_recomputed_steps(steps)
        assert drawn_peak_is_predicted(picture)


def test_same_object_same_bytes_and_a_dark_scheme():
    picture = viz.checkpoint_schedule(Binomial(4), 77)
    assert picture.pipe() == picture.pipe() == viz.checkpoint_schedule(Binomial(4), 77).pipe()
    assert picture.pipe() != viz.checkpoint_schedule(Binomial(5), 77).pipe()
    bundle = picture._repr_mimebundle_()
    assert bundle["image/svg+xml"].encode() == picture.pipe()
    assert bundle["text/plain"] == picture.text and "predicted" in picture.text
    style = ET.fromstring(picture.svg()).find(SVG + "style").text
    assert "prefers-color-scheme: dark" in style and "var(--jp-layout-color0" in style
    assert " id=" not in picture.svg()            # nothing that two pictures on a page could share


def test_the_same_bytes_in_another_process():
    """Nothing in the picture depends on set order or hashing: another interpreter with another
    hash seed draws the same bytes."""
    import hashlib
    import os
    import subprocess
    import sys
    code = ("import hashlib; from vkml import viz; from vkml.graph.simulation.schedules import Binomial; "
            "print(hashlib.sha256(viz.checkpoint_schedule(Binomial(3), 500).pipe()).hexdigest())")
    here = hashlib.sha256(viz.checkpoint_schedule(Binomial(3), 500).pipe()).hexdigest()
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env=dict(os.environ, PYTHONHASHSEED=seed))
        assert out.stdout.strip() == here


DT = 0.01


def make_sim(n=8, max_steps=40, t_end=1e9, **kw):
    kw.setdefault("window", 8)
    return vkml.simulation(pendulum, max_steps=max_steps, record=True,
                           theta=np.linspace(0.1, 1.0, n), omega=np.zeros(n), t=np.zeros(n),
                           t_end=np.broadcast_to(np.asarray(t_end, float), (n,)).copy(),
                           length=1.3, damping=0.2, **kw)


def test_a_simulations_picture_is_its_schedule_for_the_steps_its_samples_took():
    sim = make_sim(t_end=np.linspace(0.05, 0.25, 8), window="binomial", snapshots=3)
    before = viz.checkpoint_schedule(sim)
    assert (before.schedule, before.last, before.samples) == (sim.schedule, 40, 8)
    assert before.state_bytes == sim.state_bytes and "B per sample" in before.caption
    sim.run()
    last = int(sim.record.steps.max())
    assert last < 40
    after = viz.checkpoint_schedule(sim)
    assert after.last == last and f"stopped by step {last} of 40" in after.title
    report = vkml.diff.reverse(sim.record, {"theta": np.ones(8)}).report
    assert (after.recomputed_steps, after.peak_states) == \
        (report.recomputed_steps, report.peak_states) == walk(sim.schedule, 40, last)


@pytest.mark.parametrize("bad,message", [
    ((42,), "expected a simulation"),
    ((Binomial(2),), "needs max_steps"),
    ((Binomial(2), -1), "whole number"),
    ((Binomial(2), True), "whole number"),
    ((Binomial(2), 2.5), "whole number"),
    ((Binomial(2), 10 ** 9), "more steps than a picture draws"),
])
def test_bad_input_is_refused_by_name(bad, message):
    with pytest.raises(ArgumentError, match=message):
        viz.checkpoint_schedule(*bad)


def test_bad_keywords_are_refused_by_name():
    with pytest.raises(ArgumentError, match="last"):
        viz.checkpoint_schedule(Window(2), 10, last="all")
    with pytest.raises(ArgumentError, match="samples"):
        viz.checkpoint_schedule(Window(2), 10, samples=-3)
    with pytest.raises(ArgumentError, match="max_steps=40"):
        viz.checkpoint_schedule(make_sim(), 50)
    with pytest.raises(ArgumentError, match="format='svg'"):
        viz.checkpoint_schedule(Window(2), 10).pipe("png")
    assert isinstance(viz.checkpoint_schedule(Window(2), 0), SchedulePicture)


# -- the slider ------------------------------------------------------------------------------

def test_the_slider_predicts_without_running_and_matches_the_schedule_objects(monkeypatch):
    sim = make_sim(max_steps=60)

    def refuse(*args, **kwargs):
        raise AssertionError("the slider ran the model")

    ex = vkml.widgets.explore_schedule(sim, budget=2)
    monkeypatch.setattr(Simulation, "run", refuse)
    monkeypatch.setattr(HostSteps, "step", refuse)
    seen = []
    for budget in (2, 3, 4, 6, 10, 20, 40, 60):
        ex.budget.value = budget
        schedule = Binomial(budget - 2)
        assert ex.schedule.snapshots == schedule.snapshots and ex.fits
        assert ex.predicted == (schedule.predicted_recomputed_steps(60),
                                schedule.predicted_peak_states(60))
        assert f"recomputes {ex.predicted[0]:,} step" in ex.picture.value
        assert f"{ex.predicted[0]:,} recomputed steps" in ex.readout.value
        seen.append(ex.predicted[0])
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == len(seen)
    assert seen[-1] == 0 and seen[0] == 59 * 58 // 2     # from x_0 to each of x_1 .. x_58
    ex.kind.value = "window"
    for budget in (5, 16, 30, 60):
        ex.budget.value = budget
        assert ex.predicted[1] <= budget or not ex.fits
        assert ex.predicted == (ex.schedule.predicted_recomputed_steps(60),
                                ex.schedule.predicted_peak_states(60))
    assert isinstance(ex.schedule, Full) and ex.predicted == (0, 60)
    assert sim.generation == 0 and sim.record is None


def test_schedule_for_picks_the_fewest_recomputed_steps_that_fit():
    for budget in range(2, 41):
        schedule, fits = schedule_for("window", budget, 40)
        options = [Full()] + [Window(w) for w in range(1, 41)]
        fitting = [s.predicted_recomputed_steps(40) for s in options
                   if s.predicted_peak_states(40) <= budget]
        assert fits == bool(fitting)
        if fitting:
            assert schedule.predicted_recomputed_steps(40) == min(fitting)
            assert schedule.predicted_peak_states(40) <= budget


@pytest.mark.parametrize("kind,budgets", [("binomial", (2, 3, 7, 40)), ("window", (14, 20, 40))])
def test_run_on_request_measures_what_was_predicted(kind, budgets):
    sim = make_sim()
    ex = vkml.widgets.explore_schedule(sim, kind=kind)
    for budget in budgets:
        ex.budget.value = budget
        ex.run_button.click()
        assert ex.measured == ex.predicted_run == ex.predicted, (budget, ex.schedule)
        assert "&#10007;" not in ex.result.value and ex.result.value.count("&#10003;") == 2


def test_run_on_request_after_the_simulation_ran_starts_from_its_first_state():
    sim = make_sim(t_end=np.linspace(0.05, 0.3, 8)).run()
    expected_theta = sim.launch.writes["theta"].copy()
    ex = vkml.widgets.explore_schedule(sim, budget=5)
    fresh = ex.fresh_simulation().run()
    assert fresh.launch.writes["theta"].tobytes() == expected_theta.tobytes()
    ex.run()
    last = int(sim.record.steps.max())
    assert ex.predicted == walk(ex.schedule, 40, last) == ex.measured == ex.predicted_run
    assert sim.launch.writes["theta"].tobytes() == expected_theta.tobytes()   # untouched


def test_run_in_several_passes_sums_the_passes_predictions():
    n = 600
    # 6 states of 24 bytes per sample: 256 samples fit in 50,000 bytes, 600 do not
    sim = make_sim(n=n, t_end=np.linspace(0.05, 0.4, n), window="binomial", snapshots=4,
                   memory_budget=50_000)
    ex = vkml.widgets.explore_schedule(sim, budget=6)
    ex.run()
    assert ex.report.chunks > 1
    assert ex.measured == ex.predicted_run


def test_explorer_bad_input_names_the_problem():
    sim = make_sim()
    for kwargs, message in [({"kind": "revolve"}, "kind must be one of"),
                            ({"budget": 1}, "from 2 to 40"), ({"budget": 41}, "from 2 to 40"),
                            ({"budget": 2.5}, "whole number"), ({"budget": True}, "whole number"),
                            ({"seeds": {"nope": np.ones(8)}}, "not state planes"),
                            ({"seeds": [1.0]}, "seeds must be a dict")]:
        with pytest.raises(ArgumentError, match=message):
            vkml.widgets.explore_schedule(sim, **kwargs)
    with pytest.raises(ArgumentError, match="expected a simulation"):
        vkml.widgets.explore_schedule("sim")


def test_a_failing_run_is_shown_under_the_button_and_changes_nothing():
    sim = make_sim()
    ex = vkml.widgets.explore_schedule(sim, seeds={"theta": np.ones(3)})   # 8 samples
    ex.run_button.click()
    assert "Error" in ex.result.value and ex.measured is None
    with pytest.raises(VkmlError):
        ex.run()
    assert sim.generation == 0


def test_a_step_with_an_opaque_node_is_explored_but_not_run_on_request():
    from vkml.errors import RefusedError
    from test_simulation import Model, _until_done
    runner, _ = _until_done(Model(0.7), np.linspace(-0.9, 0.9, 8), 1.3, window=8, max_steps=30)
    ex = vkml.widgets.explore_schedule(runner, budget=4)
    assert ex.run_button.disabled and ex.predicted == walk(Binomial(2), 30)
    with pytest.raises(RefusedError, match="opaque nodes"):
        ex.run()
    ex.run_button.click()
    assert "RefusedError" in ex.result.value and ex.measured is None
