"""Checkpoint schedules of a recorded simulation: which states its forward run stores, and how
its reverse gets back every other state it needs.

A simulation of ``max_steps`` steps goes through the states ``x_0 .. x_max_steps``; reversing
step ``t`` needs ``x_t``.  A schedule answers, with one interface:

- ``stored_steps(max_steps)``: the steps ``t`` whose state ``x_t`` the forward run stores;
- ``plan(max_steps, last)``: the reverse as a sequence of actions, ``("recompute", c, t)``
  (advance a copy of the held state ``x_c`` by ``t - c`` steps and hold it as ``x_t``) and
  ``("reverse", t)`` (step the adjoint back through step ``t`` from the held ``x_t``, which is
  then freed: no later action needs it).  ``last`` is the last step any sample took; steps at
  or past it change nothing and the plan leaves them out;
- ``predicted_recomputed_steps(max_steps)``: the steps the plan recomputes (one ``recompute``
  from ``c`` to ``t`` counts ``t - c``) when every sample runs all ``max_steps`` steps;
- ``predicted_peak_states(max_steps)``: the most states the reverse needs at once: the stored
  and recomputed states whose step it has not reversed yet (a step is reversed on its own held
  state), plus, while it recomputes, the copy it advances (which it then holds).  The stored
  states themselves stay in the Record, which may be reversed again; ``record.nbytes`` counts
  them.

Two more answers the simulation plans with, before it runs anything:

- ``budget_states(max_steps)``: a bound on the states a sample holds (stored and the
  reverse's), that costs nothing to compute: what the memory budget plans passes with;
- ``loop_window``: the window of the compiled tier's per-sample loops that follow this schedule,
  or None where they cannot (they store a state every ``window`` steps);

and ``keeps_every_state`` says the run stores every state (its Record calls them
``states_all`` rather than ``checkpoints``).

The simulation steps; the schedule only says which states to keep.  A plan is a sequence of
plain tuples, so the same objects can be listed, counted (``walk``) or drawn.
:func:`schedule_for` turns a simulation's ``window=`` (and ``snapshots=``) into its schedule.
"""

from __future__ import annotations

import abc
import math
from functools import lru_cache

from ...validate import check_int


class Schedule(abc.ABC):
    """The interface every checkpoint schedule has (see the module docstring)."""

    #: the run stores every state (nothing is recomputed)
    keeps_every_state = False
    #: the compiled per-sample loops store a state every this many steps; None: they cannot
    #: follow this schedule (the simulation steps it in Python)
    loop_window = None

    @abc.abstractmethod
    def stored_steps(self, max_steps: int):
        """The steps whose state the forward run stores, ascending (a range or a list)."""

    @abc.abstractmethod
    def plan(self, max_steps: int, last: int | None = None):
        """The reverse's actions, in order: ``("recompute", c, t)`` and ``("reverse", t)``."""

    @abc.abstractmethod
    def predicted_recomputed_steps(self, max_steps: int) -> int:
        """How many steps the reverse takes forward again (without running anything)."""

    def predicted_peak_states(self, max_steps: int) -> int:
        return walk(self, max_steps)[1]

    def budget_states(self, max_steps: int) -> int:
        """A bound on the states a sample holds, stored and the reverse's, that costs nothing to
        compute (``predicted_peak_states`` is the exact count of the reverse's)."""
        return self.predicted_peak_states(max_steps)


def walk(schedule, max_steps, last=None):
    """(recomputed steps, peak states) of the schedule's plan, counted without running it."""
    held = {t for t in schedule.stored_steps(max_steps) if last is None or t < last}
    recomputed, peak = 0, len(held)
    for action in schedule.plan(max_steps, last):
        if action[0] == "recompute":
            _, c, t = action
            recomputed += t - c
            peak = max(peak, len(held) + 1)
            held.add(t)
        else:
            held.discard(action[1])
    return recomputed, peak


class Window(Schedule):
    """The state at the start of every ``n`` steps; the reverse recomputes one window at a time
    from the last, holding that window's states."""

    def __init__(self, n: int):
        self.n = check_int(n, "n", "Window", low=1)
        self.loop_window = self.n

    def __repr__(self):
        return f"Window({self.n})"

    def budget_states(self, max_steps):
        return math.ceil(max_steps / self.n) + self.n

    def stored_steps(self, max_steps):
        return range(0, max_steps, self.n)

    def plan(self, max_steps, last=None):
        last = max_steps if last is None else min(last, max_steps)
        for c in reversed(range(0, last, self.n)):
            end = min(c + self.n, last)
            for t in range(c + 1, end):
                yield ("recompute", t - 1, t)
            for t in reversed(range(c, end)):
                yield ("reverse", t)

    def predicted_recomputed_steps(self, max_steps):
        return sum(min(c + self.n, max_steps) - c - 1 for c in range(0, max_steps, self.n))

    def predicted_peak_states(self, max_steps):
        # the last window is recomputed while every checkpoint is held; an earlier full window
        # while the checkpoints before it are
        if max_steps <= 0:
            return 0
        windows = math.ceil(max_steps / self.n)
        last_len = max_steps - (windows - 1) * self.n
        return max(windows, windows + last_len - 1, windows - 2 + self.n if windows > 1 else 0)


class Full(Schedule):
    """Every state: nothing is recomputed."""

    keeps_every_state = True

    def __repr__(self):
        return "Full()"

    def budget_states(self, max_steps):
        return max_steps + 1

    def stored_steps(self, max_steps):
        return range(max_steps)

    def plan(self, max_steps, last=None):
        last = max_steps if last is None else min(last, max_steps)
        for t in reversed(range(last)):
            yield ("reverse", t)

    def predicted_recomputed_steps(self, max_steps):
        return 0

    def predicted_peak_states(self, max_steps):
        return max_steps


class Binomial(Schedule):
    """Griewank and Walther's binomial checkpointing (Revolve), with the fewest recomputed steps
    for the states it holds.

    The states held: the forward run stores the initial state ``x_0``, the state before the
    last step ``x_{max_steps-1}`` (the one the reverse starts on, which Revolve has in hand after
    its first sweep) and ``snapshots`` checkpoints, placed where the optimal schedule's first
    sweep would take them.  The reverse reuses a checkpoint's slot once its step is reversed, so
    it never needs more than ``snapshots + 2`` states at once (``predicted_peak_states``), the
    same as the run stores.  A recomputed step is one step the reverse takes forward again to rebuild a state it
    does not hold.  No schedule holding those states recomputes fewer:
    ``predicted_recomputed_steps`` is the optimum, ``cost(max_steps, snapshots) - (max_steps - 1)``
    (Griewank's count includes the first sweep's ``max_steps - 1`` steps, which the recorded run
    has already taken).
    """

    def __init__(self, snapshots: int):
        self.snapshots = check_int(snapshots, "snapshots", "Binomial", low=0)

    def __repr__(self):
        return f"Binomial({self.snapshots})"

    def budget_states(self, max_steps):
        return self.snapshots + 2

    def stored_steps(self, max_steps):
        return sorted({0, max_steps - 1, *first_sweep(max_steps, self.snapshots)})

    def plan(self, max_steps, last=None):
        last = max_steps if last is None else min(last, max_steps)
        return _first(0, max_steps, self.snapshots, last)

    def predicted_recomputed_steps(self, max_steps):
        return binomial_cost(max_steps, self.snapshots) - (max_steps - 1) if max_steps > 1 else 0


def _first(a, b, snaps, last):
    """Reverse steps a..b-1 on the forward run's first sweep: x_a, the sweep's checkpoints past a
    and x_{b-1} are stored; ``snaps`` checkpoint slots are left."""
    if a >= last:
        return
    if b - a == 1:
        yield ("reverse", a)
        return
    if snaps == 0:
        if b - 1 < last:
            yield ("reverse", b - 1)
        yield from _again(a, b - 1, 0, last)
        return
    m = binomial_split(b - a, snaps)
    yield from _first(a + m, b, snaps - 1, last)
    yield from _again(a, a + m, snaps, last)


def _again(a, b, snaps, last):
    """Reverse steps a..b-1 holding only x_a, with ``snaps`` free checkpoint slots (Revolve)."""
    if a >= last or b <= a:
        return
    if b - a == 1:
        yield ("reverse", a)
        return
    if snaps == 0:
        for t in reversed(range(a, min(b, last))):
            if t > a:
                yield ("recompute", a, t)
            yield ("reverse", t)
        return
    m = binomial_split(b - a, snaps)
    if a + m < last:
        yield ("recompute", a, a + m)
        yield from _again(a + m, b, snaps - 1, last)
    yield from _again(a, a + m, snaps, last)


# -- a simulation's window= ----------------------------------------------------------------------

def default_window(max_steps: int) -> int:
    """A simulation's window when none is given: ``clamp(ceil(sqrt(max_steps)), 16, 1024)``."""
    return min(1024, max(16, math.isqrt(max(max_steps, 1) - 1) + 1))


#: the named schedules a simulation's ``window=`` may choose, besides a whole number of steps
NAMED = {"full": lambda max_steps, snapshots: Full(),
         "binomial": lambda max_steps, snapshots: Binomial(
             snapshots if snapshots is not None else
             math.ceil(max_steps / default_window(max_steps)) + default_window(max_steps) - 1)}


def schedule_for(window, max_steps: int, snapshots=None) -> Schedule:
    """The schedule of a simulation's ``window=`` (checked by the caller): ``"full"``,
    ``"binomial"`` (with ``snapshots`` checkpoints, by default about as many states as the default
    window holds) or a whole number of steps."""
    make = NAMED.get(window) if isinstance(window, str) else None
    return make(max_steps, snapshots) if make is not None else Window(window)


# -- Griewank's binomial counts ---------------------------------------------------------------

def _beta(s, t):
    return math.comb(s + t, s)


def _repetitions(steps, snaps):
    """The least t with beta(snaps + 1, t) >= steps: how often the most recomputed step runs."""
    t = 0
    while _beta(snaps + 1, t) < steps:
        t += 1
    return t


@lru_cache(maxsize=None)
def binomial_cost(steps: int, snaps: int) -> int:
    """The fewest forward steps, the first sweep to x_{steps-1} included, that reverse ``steps``
    steps from the held x_0 with ``snaps`` free checkpoint slots besides it (Griewank's closed
    form t*l - beta(c + 1, t - 1), c = snaps + 1 checkpoints counting x_0)."""
    if steps <= 1:
        return 0
    t = _repetitions(steps, snaps)
    return t * steps - _beta(snaps + 2, t - 1)


@lru_cache(maxsize=None)
def binomial_split(steps: int, snaps: int) -> int:
    """Where the next checkpoint goes: an offset m achieving the optimal cost
    m + cost(steps - m, snaps - 1) + cost(m, snaps)."""
    best = binomial_cost(steps, snaps)

    def optimal(m):
        return m + binomial_cost(steps - m, snaps - 1) + binomial_cost(m, snaps) == best

    t = _repetitions(steps, snaps)
    lo = max(1, steps - _beta(snaps, t))
    hi = min(steps - 1, _beta(snaps + 1, t - 1))
    for m in range(min(lo, hi), max(lo, hi) + 1):
        if 1 <= m < steps and optimal(m):
            return m
    return next(m for m in range(1, steps) if optimal(m))


def first_sweep(steps: int, snaps: int) -> list:
    """The checkpoint positions of the optimal schedule's first sweep (the forward run stores them)."""
    positions, a = [], 0
    while snaps > 0 and steps - a > 1:
        a += binomial_split(steps - a, snaps)
        positions.append(a)
        snaps -= 1
    return positions
