"""A picture of a checkpoint schedule: which states a recorded run stores, which steps its reverse
takes forward again, and how many states it holds at each moment.

:func:`checkpoint_schedule` draws the classic diagram of checkpointing (Griewank's): time runs
to the right, one unit per step taken; the height is the step index.  The recorded run climbs
from step 0 to the last step, storing its snapshots on the way; the reverse then walks back down
one step at a time, and whenever it needs a state it does not hold it restarts from a held one
and climbs again (the recomputed steps).  Each snapshot is a line from the moment it is stored to
the moment its step is reversed.  Under it, a second panel shows how many states are held at each
moment, with the schedule's predicted peak; the caption gives the recomputed steps and the peak,
counted from the drawn actions and as the schedule predicts them.

Nothing runs: the picture reads the schedule's plan (``graph/schedules.py``).  It is drawn here,
without graphviz, as deterministic SVG (the same schedule gives the same bytes) at most
:data:`WIDTH` pixels wide, with colours that follow JupyterLab's theme when shown inline and the
browser's dark colour scheme when shown as an image.  Long plans stay small: steps closer than a
pixel are drawn as that pixel column's extent.
"""

from __future__ import annotations

import html
import math

import numpy as np

from .errors import ArgumentError
from .graph.simulation import Simulation
from .graph.simulation.schedules import Binomial, Full, Schedule, Window, walk

__all__ = ["checkpoint_schedule", "SchedulePicture", "describe", "WIDTH", "MAX_DRAWN_STEPS"]

#: The picture's width in pixels (it fits a notebook's output area without a scroll bar).
WIDTH = 960
#: The most steps a picture draws: its plan is walked action by action.
MAX_DRAWN_STEPS = 200_000

_LEFT, _RIGHT, _TOP = 70, 20, 70
_PLOT_H, _GAP, _MEM_H = 250, 46, 100
_LEGEND_H = 40
_PLOT_W = WIDTH - _LEFT - _RIGHT

#: Stroke colours, one per kind of action; mid-tones readable on light and dark backgrounds.
COLOURS = {"forward": "#3b82f6", "recompute": "#f59e0b", "reverse": "#ef4444",
           "snapshot": "#10b981", "memory": "#a855f7"}

#: Theme colours as CSS variables: JupyterLab's own when the SVG is inline in the page (the
#: schedule explorer), else light, or dark in a dark colour scheme (an SVG shown as an image).
STYLE = (
    "<style>"
    ".vkml-schedule { --vks-bg: var(--jp-layout-color0, #ffffff);"
    " --vks-fg: var(--jp-ui-font-color0, #111827); --vks-muted: var(--jp-ui-font-color2, #6b7280);"
    " --vks-grid: var(--jp-border-color2, #e5e7eb); }"
    "@media (prefers-color-scheme: dark) {"
    " .vkml-schedule { --vks-bg: var(--jp-layout-color0, #111827);"
    " --vks-fg: var(--jp-ui-font-color0, #f3f4f6); --vks-muted: var(--jp-ui-font-color2, #9ca3af);"
    " --vks-grid: var(--jp-border-color2, #374151); } }"
    ".vkml-schedule text { fill: var(--vks-fg); font-family: Helvetica, Arial, sans-serif;"
    " font-size: 12px; }"
    ".vkml-schedule text.muted { fill: var(--vks-muted); font-size: 11px; }"
    ".vkml-schedule .bg { fill: var(--vks-bg); }"
    ".vkml-schedule .axis { stroke: var(--vks-muted); fill: none; }"
    ".vkml-schedule .grid { stroke: var(--vks-grid); fill: none; stroke-dasharray: 4 3; }"
    "</style>")


def describe(schedule) -> str:
    """A schedule in words, as the simulation's ``window=`` names it."""
    if isinstance(schedule, Window):
        return f"window={schedule.n}: a checkpoint every {schedule.n} step{'s' * (schedule.n != 1)}"
    if isinstance(schedule, Full):
        return 'window="full": every state stored'
    if isinstance(schedule, Binomial):
        s = schedule.snapshots
        return f'window="binomial", {s} snapshot{"s" * (s != 1)} (Revolve)'
    return repr(schedule)


# -- the timeline: what happens, when -------------------------------------------------------

class _Timeline:
    """The recorded run and its reverse as straight segments in (time, step) and the number of
    states held over time, built from the schedule's stored steps and plan.

    ``segments[kind]``: ``(t0, s0, t1, s1)`` -- the run climbing (``forward``), the reverse
    climbing again (``recompute``) or stepping back (``reverse``), one time unit per step;
    ``snapshots``: ``(step, stored at, freed at)``; ``memory``: ``(time, states held)`` change
    points; ``recomputed`` and ``peak`` count the drawn actions the way the schedule predicts.
    """

    def __init__(self, schedule, max_steps, last):
        self.segments = {"forward": [], "recompute": [], "reverse": []}
        self.snapshots = []
        self.memory = [(0, 0)]
        stored = sorted(t for t in schedule.stored_steps(max_steps) if t < last)
        self.stored = len(stored)
        if last:
            self.segments["forward"].append((0, 0, last, last))
        for i, t in enumerate(stored):
            self.memory.append((t, i + 1))
        held, born = set(stored), {t: t for t in stored}
        now, recomputed, peak = last, 0, len(held)
        for action in schedule.plan(max_steps, last):
            if action[0] == "recompute":
                _, c, t = action
                self._add("recompute", now, c, now + t - c, t)
                peak = max(peak, len(held) + 1)
                self.memory.append((now, len(held) + 1))
                recomputed += t - c
                now += t - c
                held.add(t)
                born.setdefault(t, None)
            else:
                t = action[1]
                self._add("reverse", now, t + 1, now + 1, t)
                if t in held:
                    held.discard(t)
                    if born.get(t) is not None:
                        self.snapshots.append((t, born.pop(t), now + 1))
                    else:
                        born.pop(t, None)
                now += 1
                self.memory.append((now, len(held)))
        self.duration = now
        self.recomputed, self.peak = recomputed, peak

    def _add(self, kind, t0, s0, t1, s1):
        """Extend the last segment when this one continues it in time and in step."""
        runs = self.segments[kind]
        if runs and runs[-1][2] == t0 and runs[-1][3] == s0:
            a, b, _, _ = runs[-1]
            runs[-1] = (a, b, t1, s1)
        else:
            runs.append((t0, s0, t1, s1))


# -- SVG helpers ----------------------------------------------------------------------------

def _f(x) -> str:
    """A coordinate with at most two decimals and no trailing zeros (deterministic text)."""
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _text(x, y, words, anchor="start", cls=None, bold=False):
    attrs = f' class="{cls}"' if cls else ""
    attrs += f' text-anchor="{anchor}"' if anchor != "start" else ""
    attrs += ' font-weight="bold"' if bold else ""
    return f'<text x="{_f(x)}" y="{_f(y)}"{attrs}>{html.escape(words)}</text>'


def _segments_path(segments, x_of, y_of):
    """Segments as one path.  A segment within one pixel column joins that column's vertical
    extent, so a path has at most a few commands per column however long the plan is."""
    parts, columns = [], {}
    for t0, s0, t1, s1 in segments:
        x0, x1 = x_of(t0), x_of(t1)
        y0, y1 = y_of(s0), y_of(s1)
        if math.floor(x0) == math.floor(x1) and x1 - x0 < 1:
            col = math.floor(x0)
            lo, hi = columns.get(col, (min(y0, y1), max(y0, y1)))
            columns[col] = (min(lo, y0, y1), max(hi, y0, y1))
        else:
            parts.append(f"M{_f(x0)} {_f(y0)}L{_f(x1)} {_f(y1)}")
    for col in sorted(columns):
        lo, hi = columns[col]
        parts.append(f"M{_f(col + 0.5)} {_f(lo)}V{_f(max(hi, lo + 1))}")
    return "".join(parts)


def _step_path(changes, x_of, y_of, end):
    """A step function (``(time, value)`` change points) as a path, one column at a time: the
    first, highest, lowest and last value of each pixel column."""
    columns = []
    for time, value in changes:
        x = x_of(time)
        col = math.floor(x)
        if columns and columns[-1][0] == col:
            c = columns[-1]
            c[2], c[3], c[4] = min(c[2], value), max(c[3], value), value
        else:
            columns.append([col, x, value, value, value])
    if not columns:
        return ""
    path = [f"M{_f(columns[0][1])} {_f(y_of(columns[0][2]))}"]
    for col, x, lo, hi, last in columns:
        path.append(f"H{_f(x)}V{_f(y_of(hi))}V{_f(y_of(lo))}V{_f(y_of(last))}")
    path.append(f"H{_f(x_of(end))}")
    return "".join(path)


def _merge_rows(snapshots, x_of, y_of):
    """Snapshot lines merged per pixel row (overlapping lines on one row drawn once)."""
    rows = {}
    for step, t0, t1 in snapshots:
        rows.setdefault(round(y_of(step) * 2) / 2, []).append((x_of(t0), x_of(t1)))
    parts = []
    for y in sorted(rows):
        spans = sorted(rows[y])
        a, b = spans[0]
        for c, d in spans[1:] + [(math.inf, math.inf)]:
            if c <= b + 0.5:
                b = max(b, d)
                continue
            parts.append(f"M{_f(a)} {_f(y)}H{_f(b)}")
            a, b = c, d
    return "".join(parts)


# -- the picture ----------------------------------------------------------------------------

class SchedulePicture:
    """A checkpoint schedule drawn as SVG (see the module docstring).

    Attributes: ``schedule``, ``max_steps``, ``last`` (the steps the reverse plans: the longest
    sample's, at most ``max_steps``), ``recomputed_steps`` and ``peak_states`` (counted from the
    drawn actions), ``predicted_recomputed_steps`` and ``predicted_peak_states`` (the schedule's
    own predictions for ``last`` steps), ``state_bytes`` and ``samples`` (when drawn from a
    simulation: bytes of one sample's state, samples), ``caption`` and ``text``.
    """

    kind = "checkpoint schedule"

    def __init__(self, schedule, max_steps, last=None, state_bytes=None, samples=None):
        self.schedule = schedule
        self.max_steps = max_steps
        self.last = max_steps if last is None else min(last, max_steps)
        self.state_bytes, self.samples = state_bytes, samples
        self.timeline = _Timeline(schedule, max_steps, self.last)
        self.recomputed_steps, self.peak_states = self.timeline.recomputed, self.timeline.peak
        if self.last == max_steps:
            self.predicted_recomputed_steps = schedule.predicted_recomputed_steps(max_steps)
            self.predicted_peak_states = schedule.predicted_peak_states(max_steps)
        else:                      # the samples stopped early: the reverse plans fewer steps
            self.predicted_recomputed_steps, self.predicted_peak_states = \
                walk(schedule, max_steps, self.last)

    # -- words --------------------------------------------------------------------------------
    def _bytes(self, states) -> str:
        if not self.state_bytes:
            return ""
        per = states * self.state_bytes
        whole = f", {per * self.samples:,} B for {self.samples:,} samples" if self.samples else ""
        return f" ({per:,} B per sample{whole})"

    @property
    def title(self) -> str:
        stop = (f" (the samples stopped by step {self.last} of {self.max_steps})"
                if self.last != self.max_steps else "")
        return f"{describe(self.schedule)}; {self.last:,} steps{stop}"

    @property
    def caption(self) -> str:
        r, p = self.recomputed_steps, self.peak_states
        return (f"recomputes {r:,} step{'s' * (r != 1)}, holds at most {p:,} "
                f"state{'s' * (p != 1)}{self._bytes(p)}; predicted: "
                f"{self.predicted_recomputed_steps:,} recomputed, peak "
                f"{self.predicted_peak_states:,}")

    @property
    def text(self) -> str:
        tl = self.timeline
        stored = tl.stored
        lines = [f"checkpoint schedule: {self.title}",
                 f"  {self.caption}",
                 f"  forward run: {self.last:,} steps, storing {stored:,} state"
                 f"{'s' * (stored != 1)}",
                 f"  reverse: {self.last:,} steps reversed, {self.recomputed_steps:,} "
                 f"recomputed in {len(tl.segments['recompute']):,} run"
                 f"{'s' * (len(tl.segments['recompute']) != 1)}",
                 f"  time: {tl.duration:,} steps taken in all"]
        return "\n".join(lines)

    def __str__(self):
        return self.text

    def __repr__(self):
        return (f"<vkml.viz checkpoint schedule {self.schedule!r}, {self.last} steps: "
                f"{self.recomputed_steps} recomputed, peak {self.peak_states}>")

    # -- SVG ----------------------------------------------------------------------------------
    def svg(self) -> str:
        """The picture as SVG text (deterministic: the same schedule gives the same text)."""
        tl = self.timeline
        duration = max(tl.duration, 1)
        top_steps = max(self.last, 1)
        mem_top = max(self.peak_states, self.predicted_peak_states, 1)
        plot_y0 = _TOP
        mem_y0 = plot_y0 + _PLOT_H + _GAP
        height = mem_y0 + _MEM_H + 28 + _LEGEND_H

        def x_of(t):
            return _LEFT + _PLOT_W * t / duration

        def y_of(step):
            return plot_y0 + _PLOT_H * (1 - step / top_steps)

        def m_of(states):
            return mem_y0 + _MEM_H * (1 - states / mem_top)

        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="vkml-schedule" width="{WIDTH}" '
               f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
               'style="max-width: 100%; height: auto" '
               f'aria-label="{html.escape(self.title + ". " + self.caption)}">',
               STYLE,
               f'<rect class="bg" x="0" y="0" width="{WIDTH}" height="{height}"/>',
               _text(_LEFT, 20, f"checkpoint schedule: {self.title}", bold=True),
               f'<g class="caption">{_text(_LEFT, 38, self.caption)}</g>']
        # panel 1: steps over time
        right, bottom = _LEFT + _PLOT_W, plot_y0 + _PLOT_H
        out.append(f'<path class="axis" d="M{_LEFT} {plot_y0}V{bottom}H{right}"/>')
        if self.last:
            split = x_of(self.last)
            out.append(f'<path class="grid" d="M{_f(split)} {plot_y0}V{bottom}"/>')
            if split - _LEFT >= 100:
                out.append(_text(split - 4, plot_y0 - 6, "recorded run \u2190", "end", "muted"))
                out.append(_text(split + 4, plot_y0 - 6, "\u2192 reverse pass", cls="muted"))
            else:                  # a short run beside a long reverse: both words on the right
                out.append(_text(split + 4, plot_y0 - 6, "\u2190 recorded run | reverse pass "
                                 "\u2192", cls="muted"))
        out += [_text(_LEFT - 6, bottom + 4, "0", "end", "muted"),
                _text(_LEFT - 6, plot_y0 + 8, f"{self.last:,}", "end", "muted"),
                _text(_LEFT - 40, plot_y0 + _PLOT_H / 2, "step", "middle", "muted"),
                _text(_LEFT, bottom + 16, "0", "middle", "muted"),
                _text(right, bottom + 16, f"{tl.duration:,}", "end", "muted"),
                _text(_LEFT + _PLOT_W / 2, bottom + 16,
                      "time: steps taken (run, recomputed, reversed)", "middle", "muted")]
        snaps = _merge_rows(tl.snapshots, x_of, y_of)
        if snaps:
            out.append(f'<path class="snapshot" d="{snaps}" stroke="{COLOURS["snapshot"]}" '
                       'stroke-width="1.5" stroke-opacity="0.55" fill="none"/>')
        for kind in ("forward", "recompute", "reverse"):
            d = _segments_path(tl.segments[kind], x_of, y_of)
            if d:
                out.append(f'<path class="{kind}" d="{d}" stroke="{COLOURS[kind]}" '
                           'stroke-width="1.6" fill="none"/>')
        dots = sorted({(round(x_of(t)), round(y_of(t))) for t, _, _ in tl.snapshots})
        if dots:
            out.append(f'<g class="stored" fill="{COLOURS["snapshot"]}">' + "".join(
                f'<circle cx="{_f(x)}" cy="{_f(y)}" r="2.5"/>' for x, y in dots) + "</g>")
        # panel 2: states held over time
        mem_bottom = mem_y0 + _MEM_H
        out.append(f'<path class="axis" d="M{_LEFT} {mem_y0}V{mem_bottom}H{right}"/>')
        out += [_text(_LEFT - 6, mem_bottom + 4, "0", "end", "muted"),
                _text(_LEFT - 6, m_of(mem_top) + 4, f"{mem_top:,}", "end", "muted"),
                _text(_LEFT - 40, mem_y0 + _MEM_H / 2, "held", "middle", "muted"),
                _text(_LEFT + _PLOT_W / 2, mem_bottom + 16, "states held over time",
                      "middle", "muted")]
        peak_y = m_of(self.predicted_peak_states)
        out.append(f'<path class="grid predicted-peak" d="M{_LEFT} {_f(peak_y)}H{right}"/>')
        out.append(_text(right - 4, peak_y - 4,
                         f"predicted peak: {self.predicted_peak_states:,} states", "end", "muted"))
        d = _step_path(tl.memory, x_of, m_of, tl.duration)
        if d:
            out.append(f'<path class="memory" d="{d}" stroke="{COLOURS["memory"]}" '
                       'stroke-width="1.5" fill="none"/>')
        # legend
        ly = mem_bottom + 28 + 18
        x = _LEFT
        for kind, words in (("forward", "recorded run"), ("snapshot", "snapshot held"),
                            ("recompute", "recomputed steps"), ("reverse", "reverse steps"),
                            ("memory", "states held")):
            out.append(f'<path class="legend" d="M{x} {ly - 4}h22" stroke="{COLOURS[kind]}" '
                       'stroke-width="3"/>')
            out.append(_text(x + 28, ly, words))
            x += 28 + 8 * len(words) + 24
        out.append("</svg>")
        return "\n".join(out) + "\n"

    def pipe(self, format: str = "svg") -> bytes:
        """The picture as bytes; only SVG is drawn here."""
        if format != "svg":
            raise ArgumentError(f"checkpoint_schedule: only format='svg' is drawn, got {format!r}")
        return self.svg().encode("utf-8")

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/svg+xml": self.svg(), "text/plain": self.text}


def _steps_arg(value, what):
    if not _whole(value):
        raise ArgumentError(f"checkpoint_schedule: {what} must be a whole number >= 0, got "
                            f"{value!r}")
    if value > MAX_DRAWN_STEPS:
        raise ArgumentError(f"checkpoint_schedule: {what}={value:,} is more steps than a picture "
                            f"draws ({MAX_DRAWN_STEPS:,}); draw a shorter run with the same "
                            "schedule (its shape is the same)")
    return int(value)


def checkpoint_schedule(sim_or_schedule, max_steps=None, *, last=None, state_bytes=None,
                        samples=None) -> SchedulePicture:
    """A picture of a checkpoint schedule: stored, recomputed and reversed steps over time, the
    states held over the reverse pass, and the recomputation and peak it predicts.

    ``sim_or_schedule`` is a simulation (``vkml.simulation(..., window=...)``: its schedule, its
    ``max_steps``, and, once it has run with ``record=True``, the steps its longest sample took,
    which are what the reverse plans) or a schedule object (``vkml.graph.schedules.Window(k)``,
    ``Full()``, ``Binomial(snapshots)``) with ``max_steps``.  ``last`` draws a run whose samples
    all stopped by that step; ``state_bytes`` and ``samples`` turn states into bytes in the caption
    (a simulation gives them).

    >>> pic = vkml.viz.checkpoint_schedule(vkml.graph.schedules.Window(4), 12)
    >>> pic
    <vkml.viz checkpoint schedule Window(4), 12 steps: 9 recomputed, peak 6>
    >>> print(pic.text)
    checkpoint schedule: window=4: a checkpoint every 4 steps; 12 steps
      recomputes 9 steps, holds at most 6 states; predicted: 9 recomputed, peak 6
      forward run: 12 steps, storing 3 states
      reverse: 12 steps reversed, 9 recomputed in 3 runs
      time: 33 steps taken in all
    >>> pic.svg().startswith("<svg")
    True

    From a simulation (its schedule, its steps, and bytes in the caption):

    >>> @vkml.kernel
    ... def drift(x, v, k: vkml.Param):
    ...     return {"x": x + 0.1 * v, "v": v - 0.1 * k * x}
    ...
    >>> x, v = np.array([1.0, 0.5]), np.zeros(2)
    >>> sim = vkml.simulation(drift, max_steps=10, record=True, window=5, x=x, v=v, k=1.0)
    >>> print(vkml.viz.checkpoint_schedule(sim).caption)
    recomputes 8 steps, holds at most 6 states (96 B per sample, 192 B for 2 samples); predicted: 8 recomputed, peak 6
    """
    if isinstance(sim_or_schedule, Simulation):
        sim = sim_or_schedule
        schedule = sim.schedule
        if max_steps is not None and max_steps != sim.max_steps:
            raise ArgumentError(f"checkpoint_schedule: the simulation runs max_steps="
                                f"{sim.max_steps}; leave max_steps out (or draw "
                                "sim.schedule with another max_steps)")
        max_steps = sim.max_steps
        if last is None and sim.record is not None:
            last = int(sim.record.steps.max(initial=0))
        state_bytes = sim.state_bytes if state_bytes is None else state_bytes
        samples = sim.n if samples is None else samples
    elif isinstance(sim_or_schedule, Schedule):
        schedule = sim_or_schedule
        if max_steps is None:
            raise ArgumentError(f"checkpoint_schedule: a schedule ({schedule!r}) needs max_steps, "
                                "the steps of the run to draw: checkpoint_schedule(schedule, 100)")
    else:
        raise ArgumentError(f"checkpoint_schedule: expected a simulation (vkml.simulation) or a "
                            f"schedule (Window, Full, Binomial), got "
                            f"{type(sim_or_schedule).__name__}")
    max_steps = _steps_arg(max_steps, "max_steps")
    if last is not None:
        last = _steps_arg(last, "last")
    for name, value in (("state_bytes", state_bytes), ("samples", samples)):
        if value is not None and not _whole(value):
            raise ArgumentError(f"checkpoint_schedule: {name} must be a whole number >= 0, got "
                                f"{value!r}")
    return SchedulePicture(schedule, max_steps, last, state_bytes, samples)


def _whole(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
        and value >= 0
