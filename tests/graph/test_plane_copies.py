"""The one copy rule of a Record, the graph's own caches, and the interface a Reverse calls.

The rule (``vkml/graph/versions.py``): a recording run copies a plane version just before it is
overwritten, if some launch read it, once; nothing else.  Every way a graph runs asks one
function, ``PlaneVersions.copy_before_write``; the tests count what it answers on each path (node
by node, fused into one program, inside a ``repeat_while``) and check it against the rule
worked out by hand for each graph, and the copies against the values the launches read.
"""

from __future__ import annotations

import ast
import contextlib
import pathlib

import numpy as np
import pytest

import vkml
from vkml.graph import run as run_module
from vkml.graph.reversible import Reversible
from vkml.graph.simulation.schedules import Binomial, Full, Window
from vkml.graph.versions import PlaneVersions
from models import wave

N = 24


@vkml.kernel
def scale(x, a: vkml.Param):
    return {"u": a * x * x}


@vkml.kernel
def wobble(x, c: vkml.Param):
    return {"u": vkml.sin(c * x)}


@vkml.kernel
def step(s, k: vkml.Param):
    return {"s": s + 0.3 * vkml.sin(k * s)}


@pytest.fixture
def copies(monkeypatch):
    """Every version the rule told a run to copy, in order (the one function, instrumented)."""
    told = []
    rule = PlaneVersions.copy_before_write

    def counted(self, pid):
        key = rule(self, pid)
        if key is not None:
            told.append(key)
        return key
    monkeypatch.setattr(PlaneVersions, "copy_before_write", counted)
    return told


def _chain():
    """first: u = a x^2 | w1: y = sin(k u) | again: u = sin(c y) (overwrites u, read by w1) |
    w2: x = sin(k u) (overwrites x, read by first) | grow: x += 0.3 sin(k x) (overwrites x,
    read by itself) | out: z = sin(k u) (written, never read: not copied)."""
    x0 = np.linspace(-1.0, 1.0, N)
    planes = {"x": x0.copy(), "u": np.zeros(N), "y": np.zeros(N), "z": np.zeros(N)}
    x, u, y, z = (planes[k] for k in "xuyz")
    g = (vkml.Graph().add(scale.bind(x=x, a=0.7, u=u), name="first")
         .add(wave.bind(u=u, k=1.3, y=y), name="w1")
         .add(wobble.bind(x=y, c=0.9, u=u), name="again")
         .add(wave.bind(u=u, k=0.4, y=x), name="w2")
         .add(step.bind(s=x, k=0.8), name="grow")
         .add(wave.bind(u=u, k=1.1, y=z), name="out")
         .build(record=True))
    # the rule by hand: (u, 1) before "again", (x, 0) before "w2", (x, 1) before "grow"
    expected = [(id(u), 1), (id(x), 0), (id(x), 1)]
    return g, planes, x0, expected


@pytest.mark.parametrize("threads", ["1", "2"])
def test_node_by_node_and_fused_runs_copy_exactly_what_the_rule_says(threads, copies, monkeypatch):
    monkeypatch.setenv("VKML_THREADS", threads)
    g, planes, x0, expected = _chain()
    assert run_module.fused_launch(g) == (threads == "1")     # both paths are exercised
    g.launch()
    rec = g.record
    assert copies == expected and list(rec.saved) == expected
    assert rec.copied == ["u", "x"] and rec.nbytes == 3 * N * 8
    # each copy holds the values the launch that read it saw
    u1 = 0.7 * x0 * x0
    np.testing.assert_allclose(rec.saved[expected[0]], u1, rtol=1e-15)
    np.testing.assert_array_equal(rec.saved[expected[1]], x0)
    np.testing.assert_allclose(rec.saved[expected[2]], np.sin(0.4 * np.sin(0.9 * np.sin(1.3 * u1))),
                               rtol=1e-14)
    # a second launch copies the same versions again: node by node asking the rule again, fused
    # by the program the rule shaped once (its plan is reused)
    vkml.diff.reverse(rec, {"out.y": np.ones(N)})
    del copies[:]
    g.launch()
    assert copies == ([] if threads == "1" else expected) and list(g.record.saved) == expected


def test_both_paths_keep_the_same_copies_and_give_the_same_gradients(monkeypatch):
    results = []
    for threads in ("1", "2"):
        monkeypatch.setenv("VKML_THREADS", threads)
        g, planes, _, _ = _chain()
        g.launch()
        grads = vkml.diff.reverse(g.record, {"out.y": np.ones(N), "grow.s": np.full(N, 0.5)})
        results.append(([a.tobytes() for a in g.record.saved.values()],
                        {k: np.asarray(v).tobytes() for k, v in grads.items()}))
    assert results[0] == results[1]


def test_a_graph_that_overwrites_nothing_copies_nothing(copies):
    x, u, y = np.linspace(0, 1, N), np.zeros(N), np.zeros(N)
    g = vkml.Graph().add(scale.bind(x=x, a=0.5, u=u)).add(wave.bind(u=u, k=1.0, y=y)).build(record=True)
    g.launch()
    assert copies == [] and g.record.nbytes == 0
    g2 = vkml.Graph().add(step.bind(s=x, k=0.5)).build(record=False)
    g2.launch()                             # not recording: the rule copies nothing
    assert copies == []


class Trips:
    def __init__(self, trips):
        self.trips, self.calls = trips, 0

    def __call__(self):
        self.calls += 1
        return self.calls <= self.trips


@pytest.mark.parametrize("trips", [0, 1, 4])
def test_a_loop_copies_only_the_versions_from_before_it(trips, copies):
    """pre: u = a s^2 reads s (version 0) | loop: s += ... ``trips`` times | post: y = sin(k s).
    The loop's first iteration overwrites version 0 (read by pre and by the loop itself): copied;
    its later iterations overwrite the loop's own versions, rebuilt from its checkpoints."""
    s0 = np.linspace(0.2, 0.8, N)
    s, u, y = s0.copy(), np.zeros(N), np.zeros(N)
    g = (vkml.Graph().add(scale.bind(x=s, a=0.5, u=u), name="pre")
         .add_node(vkml.repeat_while(step.bind(s=s, k=0.8), Trips(trips), max_iters=9), name="loop")
         .add(wave.bind(u=s, k=1.5, y=y), name="post").build(record=True))
    g.launch()
    expected = [(id(s), 0)] if trips else []
    assert copies == expected and list(g.record.saved) == expected
    if trips:
        np.testing.assert_array_equal(g.record.saved[(id(s), 0)], s0)
    loop = next(e for e in g.record.tape if e.node.name == "loop")
    assert sorted(loop.checkpoints) == list(range(0, trips, loop.window))


@pytest.mark.parametrize("schedule", [Window(5), Full(), Binomial(3)])
def test_a_simulation_copies_no_versions_and_stores_what_its_schedule_names(schedule, copies):
    window = {"Window": 5, "Full": "full", "Binomial": "binomial"}[type(schedule).__name__]
    x = np.linspace(0.1, 0.9, N)
    sim = vkml.simulation(step, max_steps=23, record=True, window=window, snapshots=3, s=x.copy(),
                          k=0.6) if window == "binomial" else \
        vkml.simulation(step, max_steps=23, record=True, window=window, s=x.copy(), k=0.6)
    assert repr(sim.schedule) == repr(schedule)
    sim.run()
    assert copies == []
    assert sorted(sim.record.stored) == list(schedule.stored_steps(23))
    every = schedule.keeps_every_state
    assert (sim.record.states_all if every else sim.record.checkpoints) is sim.record.stored
    assert (sim.record.checkpoints if every else sim.record.states_all) == {}


# -- the graph's caches ---------------------------------------------------------------------------

def _small_graph():
    x, u, y = np.linspace(0, 1, N), np.zeros(N), np.zeros(N)
    return vkml.Graph().add(scale.bind(x=x, a=0.5, u=u), name="s").add(
        wave.bind(u=u, k=1.0, y=y), name="w").build(record=True)


def test_graph_caches_are_owned_made_anew_by_build_and_emptied_by_clear_caches(monkeypatch):
    monkeypatch.setenv("VKML_THREADS", "1")
    g = _small_graph()
    caches = g.caches
    g.launch()
    first = vkml.diff.reverse(g.record, {"y": np.ones(N)})
    assert len(caches.launch_plans) == 1 and len(caches.reverse_plans) == 1
    assert vkml.stats().caches["graph launch plans"] >= 1
    vkml.clear_caches()
    assert len(caches.launch_plans) == 0 and len(caches.reverse_plans) == 0
    assert len(caches.structure) == 0
    g.launch()                                           # made again: the same bits
    again = vkml.diff.reverse(g.record, {"y": np.ones(N)})
    assert {k: np.asarray(v).tobytes() for k, v in again.items()} == \
        {k: np.asarray(v).tobytes() for k, v in first.items()}
    g.build(record=True)                                 # a new build: nothing derived survives
    assert g.caches is not caches and len(g.caches.launch_plans) == 0


def test_reverse_plans_are_bounded_by_the_cache_limit(monkeypatch):
    monkeypatch.setenv("VKML_THREADS", "1")
    old = vkml.cache_limit()
    vkml.set_cache_limit(2)
    try:
        g = _small_graph()
        rev = vkml.diff.Reverse(g)
        for seeds in ({"y": np.ones(N)}, {"u": np.ones(N)}, {"y": np.ones(N), "u": np.ones(N)}):
            g.launch()
            rev(g.record, seeds)                         # one fused reverse plan per seed set
        assert len(g.caches.reverse_plans) == 2
    finally:
        vkml.set_cache_limit(old)


# -- the interface a Reverse calls ------------------------------------------------------------------

def test_a_reverse_calls_only_the_reversible_interface():
    """A Reverse asks its forward to check itself once; per Record, to check the call, to count a
    reader around the sweep and to sweep; it needs to know nothing else about it (so a Graph, a
    simulation and a sharded graph need no branch in diff.py), and it takes its own lock and
    marks the Record reversed itself."""
    calls = []

    class Record:
        reversed = False

    class Forward(Reversible):
        def check_reversible(self, vjps):
            calls.append(("check", list(vjps)))

        def bitwise(self):
            return {"w": True}

        def prepare_reverse(self, record, seeds, wrt, strict):
            calls.append(("prepare", dict(seeds), wrt, strict))
            return "prepared"

        @contextlib.contextmanager
        def reading(self, record):
            calls.append(("reading", record.reversed))
            yield
            calls.append(("read", record.reversed))

        def sweep(self, record, prepared, vjps, workspace):
            calls.append(("sweep", prepared, list(vjps), rev.workspace is workspace))
            return "gradients"

    rev = vkml.diff.Reverse(Forward(), vjps={"n": lambda p, c: {}}, strict=True)
    assert rev.bitwise() == {"w": True}
    record = Record()
    assert rev(record, {"y": 1}, wrt="w") == "gradients" and record.reversed
    assert calls == [("check", ["n"]), ("prepare", {"y": 1}, ["w"], True), ("reading", False),
                     ("sweep", "prepared", ["n"], True), ("read", False)]
    with pytest.raises(vkml.ArgumentError, match="expected a Graph or a simulation, got type"):
        vkml.diff.Reverse(vkml.graph.Simulation)


def test_graph_reverse_called_directly_checks_its_vjps_like_a_reverse():
    g = _small_graph()
    g.launch()
    with pytest.raises(vkml.ArgumentError, match="vjps names 'nope'"):
        g.reverse(g.record, {"y": np.ones(N)}, vjps={"nope": lambda p, c: {}})
    direct = g.reverse(g.record, {"y": np.ones(N)})
    g.launch()
    through = vkml.diff.Reverse(g)(g.record, {"y": np.ones(N)})
    assert {k: np.asarray(v).tobytes() for k, v in direct.items()} == \
        {k: np.asarray(v).tobytes() for k, v in through.items()}
    assert sorted(direct) == ["a", "k", "s.a", "s.x", "w.k", "x"]


def test_diff_does_not_import_the_simulation():
    source = pathlib.Path(vkml.diff.__file__).read_text()
    imported = [node.module for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ImportFrom)]
    assert not any(m and "simulation" in m for m in imported), imported
