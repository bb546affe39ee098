"""A memory-budget slider on a simulation's checkpoint schedule.

:func:`explore_schedule` shows the picture of a recorded simulation's checkpoint schedule
(:func:`vkml.viz.checkpoint_schedule`) under a slider for the memory budget: the most states one
sample may hold during the reverse.  Moving the slider picks the schedule that fits the budget
and recomputes the fewest steps, and redraws the picture with its predicted recomputation and
peak; nothing runs, the schedule objects predict both.  The "run" button then runs the model
with that schedule (a fresh copy of the simulation, from the same starting state) and reverses
it, and shows the reverse's own report beside the prediction.

Two kinds of schedule: ``"binomial"`` (Griewank's binomial checkpointing, with ``budget - 2``
snapshots besides the first state and the one before the last step) and ``"window"`` (a
checkpoint every ``w`` steps, the ``w`` that fits and recomputes fewest; ``"full"`` once the
budget holds every state).
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import numpy as np

import vkml
from vkml import viz
from vkml.errors import ArgumentError, RefusedError, VkmlError
from vkml.graph.simulation.schedules import Binomial, Full, Window, walk
from vkml.graph.simulation import Simulation
from vkml.graph.treesum import chunk_bounds
from vkml.viz_schedule import describe

from .static import StaticPicture

__all__ = ["explore_schedule", "ScheduleExplorer", "schedule_for", "KINDS"]

#: The kinds of schedule the explorer chooses between.
KINDS = ("binomial", "window")


def explore_schedule(sim, *, budget=None, kind="binomial", seeds=None):
    """A memory-budget slider on ``sim``'s checkpoint schedule, with its picture, its predicted
    recomputed steps and peak, and a button that runs the reverse with that budget.

    ``sim`` is a ``vkml.simulation`` (run or not); ``budget`` the starting number of states one
    sample may hold (2 to ``max_steps``; by default what ``sim``'s own schedule needs);
    ``kind`` ``"binomial"`` or ``"window"``; ``seeds`` the reverse's seeds on the final state
    (state plane name -> per-sample seed; by default ones on every floating state plane).

    Returns a :class:`ScheduleExplorer` (an ipywidgets ``VBox``): display it, or drive it from
    Python (``explorer.budget.value = 8``, ``explorer.run()``).

    >>> from vkml_jupyter.widgets import explore_schedule
    >>> @vkml.kernel
    ... def drift(x, v, k: vkml.Param):
    ...     return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
    ...
    >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
    >>> sim = vkml.simulation(drift, max_steps=20, record=True, window=5, x=x, v=v, k=1.0)
    >>> ex = explore_schedule(sim, budget=6)    # a widget; nothing runs until "run"
    >>> ex
    ScheduleExplorer(drift, budget 6: Binomial(4))
    >>> ex.predicted                            # recomputed steps, peak states per sample
    (14, 6)
    >>> ex.budget.value = 4                     # as the slider does
    >>> ex.schedule, ex.fits, ex.predicted
    (Binomial(2), True, (26, 4))
    """
    return ScheduleExplorer(sim, budget=budget, kind=kind, seeds=seeds)


def schedule_for(kind, budget, max_steps):
    """The schedule of ``kind`` holding at most ``budget`` states per sample over a run of
    ``max_steps`` steps that recomputes the fewest steps, and whether it fits (when none of that
    kind fits, the one holding fewest states)."""
    if kind == "binomial":
        schedule = Binomial(max(0, min(budget, max_steps) - 2))
        return schedule, schedule.predicted_peak_states(max_steps) <= budget
    candidates = [Full()] + [Window(w) for w in range(1, max_steps + 1)]
    costs = [(s.predicted_recomputed_steps(max_steps), s.predicted_peak_states(max_steps), i)
             for i, s in enumerate(candidates)]
    fitting = [c for c in costs if c[1] <= budget]
    if fitting:
        return candidates[min(fitting)[2]], True
    return candidates[min(costs, key=lambda c: (c[1], c[0], c[2]))[2]], False


def _window_argument(schedule):
    """The simulation's ``window=`` (and ``snapshots=``) for a schedule object."""
    if isinstance(schedule, Binomial):
        return {"window": "binomial", "snapshots": schedule.snapshots}
    if isinstance(schedule, Full):
        return {"window": "full"}
    return {"window": schedule.n}


def _check_seeds(sim, seeds):
    floats = [s for s in sim.state if sim.launch.reads[s].dtype.kind == "f"]
    if seeds is None:
        if not floats:
            raise ArgumentError("explore_schedule: the simulation has no floating state plane to "
                                "seed; pass seeds={plane: per-sample seed}")
        return {s: np.ones_like(sim.launch.reads[s]) for s in floats}
    if not isinstance(seeds, dict) or not seeds:
        raise ArgumentError(f"explore_schedule: seeds must be a dict of state plane name -> "
                            f"per-sample seed, got {type(seeds).__name__}")
    unknown = [k for k in seeds if k not in sim.state]
    if unknown:
        raise ArgumentError(f"explore_schedule: seeds name {unknown!r}, which are not state planes "
                            f"of the simulation; its state planes are {sim.state}")
    return dict(seeds)


class ScheduleExplorer(StaticPicture, widgets.VBox):
    """The widget :func:`explore_schedule` returns.

    Controls: ``kind`` (ToggleButtons), ``budget`` (IntSlider, states per sample), ``run_button``.
    Outputs: ``readout`` (HTML), ``picture`` (HTML holding the SVG), ``result`` (HTML).  Read
    ``schedule`` (the schedule chosen), ``fits``, ``drawing`` (the
    :class:`vkml.viz_schedule.SchedulePicture`), ``predicted`` (recomputed steps, peak states),
    ``updates``; after a run, ``measured`` and ``predicted_run`` (the same two counts, from the
    reverse's report and from the schedule for the steps each pass took) and ``report``.

    >>> from vkml_jupyter.widgets import ScheduleExplorer
    >>> @vkml.kernel
    ... def drift(x, v, k: vkml.Param):
    ...     return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
    ...
    >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
    >>> sim = vkml.simulation(drift, max_steps=20, record=True, window=5, x=x, v=v, k=1.0)
    >>> ex = ScheduleExplorer(sim, budget=4, kind="window")
    >>> ex.schedule, ex.fits                    # no window holds only 4 states over 20 steps
    (Window(3), False)
    >>> ex.kind.value = "binomial"              # as the toggle does
    >>> ex.schedule, ex.fits, ex.updates
    (Binomial(2), True, 2)
    """

    def __init__(self, sim, *, budget=None, kind="binomial", seeds=None):
        if not isinstance(sim, Simulation):
            raise ArgumentError(f"explore_schedule: expected a simulation (vkml.simulation(...)), "
                                f"got {type(sim).__name__}")
        if not isinstance(kind, str) or kind not in KINDS:
            raise ArgumentError(f"explore_schedule: kind must be one of {KINDS}, got {kind!r}")
        top = max(sim.max_steps, 2)
        if budget is None:
            budget = min(top, max(2, sim.schedule.predicted_peak_states(sim.max_steps)))
        if (not isinstance(budget, (int, np.integer)) or isinstance(budget, (bool, np.bool_))
                or not 2 <= budget <= top):
            raise ArgumentError(f"explore_schedule: budget is the states one sample may hold, a "
                                f"whole number from 2 to {top} (max_steps), got {budget!r}")
        self.sim = sim
        self.seeds = _check_seeds(sim, seeds)
        # the starting state of a run on request: the Record's first state once the simulation
        # has run (its planes then hold the final state), else the planes as they are now
        self._x0 = {s: sim.launch.reads[s].copy() for s in sim.state}
        self.kind = widgets.ToggleButtons(options=list(KINDS), value=kind, description="schedule")
        self.budget = widgets.IntSlider(value=int(budget), min=2, max=top, description="budget",
                                        continuous_update=False,
                                        layout=widgets.Layout(width="520px"))
        self.run_button = widgets.Button(description="run the reverse with this budget",
                                         layout=widgets.Layout(width="280px"))
        self.readout = widgets.HTML()
        self.picture = widgets.HTML()
        self.result = widgets.HTML()
        self.updates = 0
        self.measured = self.predicted_run = self.report = None
        if sim.nodes:
            self.run_button.disabled = True
            self.run_button.tooltip = ("a step with opaque nodes needs their vjps; "
                                       "reverse it yourself")
        self.run_button.on_click(self._on_click)
        for w in (self.kind, self.budget):
            w.observe(lambda _: self.update(), names="value")
        note = widgets.HTML("<span class='vkml-budget-unit'>states held per sample</span>")
        super().__init__([self.kind, widgets.HBox([self.budget, note]), self.readout,
                          self.picture, widgets.HBox([self.run_button]), self.result])
        self.update()

    @property
    def last(self):
        """The steps the reverse plans: the longest sample's in the last recorded run, else
        ``max_steps``.

        >>> from vkml_jupyter.widgets import explore_schedule
        >>> @vkml.kernel
        ... def drift(x, v, k: vkml.Param):
        ...     return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
        ...
        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=20, record=True, window=5, x=x, v=v, k=1.0)
        >>> explore_schedule(sim).last             # not run yet: max_steps
        20
        """
        record = self.sim.record
        return int(record.steps.max(initial=0)) if record is not None else self.sim.max_steps

    def update(self):
        """Pick the schedule for the budget, predict its cost and redraw: nothing runs.

        >>> from vkml_jupyter.widgets import explore_schedule
        >>> @vkml.kernel
        ... def drift(x, v, k: vkml.Param):
        ...     return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
        ...
        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=20, record=True, window=5, x=x, v=v, k=1.0)
        >>> ex = explore_schedule(sim, budget=6)
        >>> ex.updates, ex.predicted
        (1, (14, 6))
        >>> ex.update()                             # what moving a control calls
        >>> ex.updates, ex.drawing.predicted_peak_states
        (2, 6)
        """
        sim = self.sim
        self.schedule, self.fits = schedule_for(self.kind.value, self.budget.value, sim.max_steps)
        self.drawing = viz.checkpoint_schedule(self.schedule, sim.max_steps, last=self.last,
                                               state_bytes=sim.state_bytes, samples=sim.n)
        self.predicted = (self.drawing.predicted_recomputed_steps,
                          self.drawing.predicted_peak_states)
        self.updates += 1
        fit = ("fits the budget" if self.fits else
               f"<b>does not fit</b>: no {self.kind.value} schedule holds only "
               f"{self.budget.value} states over {sim.max_steps} steps; this one holds fewest")
        r, p = self.predicted
        self.readout.value = (
            "<div class='vkml-readout vkml-schedule-readout'>"
            f"budget {self.budget.value} states per sample: "
            f"<b>{html.escape(describe(self.schedule))}</b> ({fit})<br>predicted: "
            f"<span class='vkml-predicted-recomputed'>{r:,} recomputed steps</span>, peak "
            f"<span class='vkml-predicted-peak'>{p:,} states</span> "
            f"({p * sim.state_bytes:,} B per sample, {p * sim.state_bytes * sim.n:,} B "
            f"for {sim.n:,} samples); nothing ran</div>")
        self.picture.value = self.drawing.svg()
        self.result.value = ("<div class='vkml-readout vkml-schedule-result'>press run to run "
                             "the model with this schedule and compare</div>")

    def _start_state(self):
        record = self.sim.record
        if record is None:
            return self._x0
        stored = record.states_all if record.states_all else record.checkpoints
        return {s: np.asarray(stored[0][s]) for s in self.sim.state}

    def fresh_simulation(self):
        """A copy of the simulation with the chosen schedule, on copies of its planes, starting
        from the state the explorer's simulation started from.

        >>> from vkml_jupyter.widgets import explore_schedule
        >>> @vkml.kernel
        ... def drift(x, v, k: vkml.Param):
        ...     return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
        ...
        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=20, record=True, window=5, x=x, v=v, k=1.0)
        >>> ex = explore_schedule(sim, budget=6)
        >>> copy = ex.fresh_simulation()
        >>> copy is sim, copy.schedule, copy.max_steps
        (False, Binomial(4), 20)
        """
        sim = self.sim
        if sim.nodes:
            raise RefusedError("explore_schedule: a step with opaque nodes is reversed with their "
                               "vjps; run it yourself with vkml.simulation(..., window=...)")
        launch = sim.launch
        start = self._start_state()
        planes = {name: (start[name] if name in start else plane).copy()
                  for name, plane in list(launch.reads.items()) + list(launch.writes.items())}
        return vkml.simulation(launch.kernel, max_steps=sim.max_steps, record=True,
                               memory_budget=sim.memory_budget, progress=False,
                               **_window_argument(self.schedule), **planes, **launch.params)

    def run(self):
        """Run the model with the chosen schedule and reverse it: ``measured`` (the reverse's
        report) against ``predicted_run`` (the schedule's counts for the steps each pass of
        samples took).

        >>> from vkml_jupyter.widgets import explore_schedule
        >>> @vkml.kernel
        ... def drift(x, v, k: vkml.Param):
        ...     return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
        ...
        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=20, record=True, window=5, x=x, v=v, k=1.0)
        >>> ex = explore_schedule(sim, budget=6)
        >>> ex.run().measured == ex.predicted_run   # recomputed steps and peak, as predicted
        True
        >>> ex.measured
        (14, 6)
        """
        run_sim = self.fresh_simulation().run()
        grads = vkml.diff.reverse(run_sim.record, self.seeds)
        steps = run_sim.record.steps
        n, size = run_sim.n, run_sim.pass_size
        bounds = [(0, n)] if size >= n else chunk_bounds(n, size)
        counts = [walk(run_sim.schedule, run_sim.max_steps, int(steps[a:b].max(initial=0)))
                  for a, b in bounds]
        self.report = grads.report
        self.measured = (grads.report.recomputed_steps, grads.report.peak_states)
        self.predicted_run = (sum(c[0] for c in counts), max(c[1] for c in counts))
        self._show_run(len(bounds))
        return self

    def _show_run(self, passes):
        def row(what, predicted, measured):
            mark = "&#10003;" if predicted == measured else "&#10007; (differs)"
            return (f"<tr><td>{what}</td><td>{predicted:,}</td><td>{measured:,}</td>"
                    f"<td>{mark}</td></tr>")

        (pr, pp), (mr, mp) = self.predicted_run, self.measured
        self.result.value = (
            "<div class='vkml-readout vkml-schedule-result'>"
            f"ran {self.sim.max_steps} steps at most with {html.escape(describe(self.schedule))}, "
            f"reversed in {passes} pass{'es' * (passes != 1)}:"
            "<table><tr><th></th><th>predicted</th><th>measured</th><th></th></tr>"
            f"{row('recomputed steps', pr, mr)}{row('peak states', pp, mp)}</table></div>")

    def _on_click(self, _):
        try:
            self.run()
        except VkmlError as err:          # shown where the button is, not in the log console
            self.result.value = ("<div class='vkml-readout vkml-schedule-result'>"
                                 f"{type(err).__name__}: {html.escape(str(err))}</div>")

    def static_picture(self):
        """The schedule's picture as it is now (SVG): what a reader sees without a kernel.

        >>> from vkml_jupyter.widgets import ScheduleExplorer
        >>> @vkml.kernel
        ... def drift(x, v, k: vkml.Param):
        ...     return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
        ...
        >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
        >>> sim = vkml.simulation(drift, max_steps=20, record=True, window=5, x=x, v=v, k=1.0)
        >>> ScheduleExplorer(sim, budget=4, kind="window").static_picture()[0]
        'image/svg+xml'
        """
        svg = self.picture.value
        return ("image/svg+xml", svg) if "<svg" in svg[:2000] else None

    def __repr__(self):
        return (f"ScheduleExplorer({self.sim.launch.kernel.name}, budget {self.budget.value}: "
                f"{self.schedule!r})")

