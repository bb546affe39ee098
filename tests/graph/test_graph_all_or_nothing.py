"""A refused call of the graph layer changes nothing, and every refusal is a ``vkml.VkmlError``.

For every refusal path of ``Graph.launch``/``update``, ``Record.keep``, ``diff.reverse`` /
``Reverse`` and ``simulation``/``until_done`` runs and reverses, each test builds a small graph,
puts it in the state the refusal needs, snapshots everything a call could change -- the bytes,
shape and dtype of every plane, the generation, the Record (which one, its state, its copies and
Param values) and the Param cells -- makes the call fail, and checks that the error is a
``VkmlError`` whose message names the node or plane, and that the snapshot is unchanged.  Then
the argument checks of the constructors (``Graph.add``, ``kernel.bind``, ``opaque``, ``reduce``,
``skippable``, ``repeat_while``, ``SkipGuard``, ``simulation``): each bad argument is a
``VkmlError``, never a bare ``TypeError``/``KeyError``/``IndexError``.

Every test runs on the NumPy backend and on the compiled CPU tier.
"""

from __future__ import annotations

import numpy as np
import pytest
from backends_under_test import BACKENDS

import vkml
from vkml.errors import (ArgumentError, Busy, DTypeError, ExecutionError, RecordError, RefusedError,
                         ShapeError, VkmlError)
from models import square, wave

pytestmark = pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)

N = 32


@vkml.kernel
def look(i, u, table: vkml.Param):
    return {"y": table[i] * u}


@vkml.kernel
def count(c, n: vkml.Param):
    return {"c": c + n}


@vkml.kernel
def nudge(s, k: vkml.Param):
    return {"s": s * k}


@vkml.kernel
def two_out(x):
    return {"p": x + 1, "q": x * 2}


# -- snapshots -------------------------------------------------------------------------------

def planes_of(graph):
    """Every plane and Param cell a graph's nodes read or write, by a readable label."""
    out = {}
    for node in graph.nodes:
        for op in node.launches() or [node.op]:
            for which in ("reads", "writes"):
                for name, plane in getattr(op, which).items():
                    out[f"{node.name}.{name}"] = plane
    return out


def array_state(a):
    return (a.shape, str(a.dtype), a.flags.writeable, a.tobytes())


def record_state(rec):
    if rec is None:
        return None
    saved = {k: array_state(v) for k, v in rec.saved.items()}
    cells = {k: array_state(v) for k, v in rec.cells.items()}
    return (id(rec), rec.generation, rec.kept, rec.reversed, rec.live, rec.nbytes, saved, cells,
            len(rec.tape))


def graph_state(graph):
    """Everything a refused graph call must leave as it was."""
    return ({k: array_state(p) for k, p in planes_of(graph).items()}, graph.generation,
            {k: array_state(c) for k, c in graph.cells.items()}, record_state(graph.record),
            graph.recording, graph.built)


def sim_state(sim):
    planes = {f"{op_name}.{name}": array_state(p) for op_name, op in
              [("step", sim.launch)] + [(node.name, node) for node in sim.nodes]
              for which in (op.reads, op.writes) for name, p in which.items()}
    rec = sim.record
    rec_state = None if rec is None else (
        id(rec), rec.generation, rec.kept, rec.reversed, rec.steps.tobytes(), rec.nbytes,
        {t: {k: v.tobytes() for k, v in c.items()} for t, c in rec.checkpoints.items()},
        {k: array_state(v) for k, v in rec.fixed.items()})
    return planes, sim.generation, rec_state


def refused(call, snapshot, kind, match):
    """``call()`` raises ``kind`` (a VkmlError) matching ``match``, and ``snapshot()`` is unchanged."""
    before = snapshot()
    with pytest.raises(kind, match=match) as err:
        call()
    assert isinstance(err.value, VkmlError), type(err.value)
    assert snapshot() == before
    return err.value


# -- a recorded two-node graph (one fused program) ------------------------------------------------

class Fused:
    """square: u = x*x;  look: y = table[i] * u -- launched once, its Record live."""

    def __init__(self, record=True):
        self.x = np.linspace(0.1, 0.9, N).copy()      # owns its memory (resize needs that)
        self.u, self.y = np.zeros(N), np.zeros(N)
        self.i = (np.arange(N) % 3).astype(np.int64)
        self.table = np.array([1.0, 2.0, 3.0])
        self.graph = (vkml.Graph().add(square.bind(x=self.x, u=self.u), name="square")
                      .add(look.bind(i=self.i, u=self.u, table=self.table, y=self.y), name="look")
                      .build(record=record))
        self.graph.launch()

    def free(self):
        """Reverse the live Record, so the next recording launch and update are allowed."""
        vkml.diff.reverse(self.graph.record, {"y": np.ones(N)})
        return self

    def state(self):
        return graph_state(self.graph)


def _launch_refused(w, kind, match, call=None):
    return refused(call or w.graph.launch, w.state, kind, match)


def test_launch_with_a_live_record_is_refused():
    w = Fused()
    _launch_refused(w, RecordError, r"Record of generation 1 is still live")


def test_an_index_out_of_range_in_the_second_node_writes_nothing():
    w = Fused().free()
    w.x[:] = np.linspace(0.2, 1.0, N)           # the first node would write new values into u
    w.i[5] = 7
    err = _launch_refused(w, ExecutionError, r"node 'look' \(look\): gather.*index 7 is out of range "
                                             r"for axis 0 of size 3.*nothing was written")
    assert isinstance(err.__cause__, IndexError)
    w.i[5] = 1                                    # fixed: the same graph launches again
    w.graph.launch()
    np.testing.assert_allclose(w.y, w.table[w.i] * w.x * w.x, rtol=1e-15)
    assert w.graph.generation == 2


def test_a_large_fused_launch_that_fails_writes_nothing_into_its_planes():
    """Planes of 64 KiB and more are computed straight into on success; a program that reads by
    index computes into its own buffers instead, so a failure leaves them as they were."""
    n = 1 << 14
    x, u, y = np.linspace(0.1, 0.9, n), np.zeros(n), np.zeros(n)
    i = (np.arange(n) % 3).astype(np.int64)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(look.bind(i=i, u=u, table=np.ones(3), y=y), name="look").build())
    g.launch()
    x[:] = 0.5
    i[n - 1] = 3
    refused(g.launch, lambda: graph_state(g), ExecutionError, r"node 'look' \(look\): gather.*index 3")
    i[n - 1] = 2
    g.launch()
    np.testing.assert_allclose(u, 0.25)
    np.testing.assert_allclose(y, 0.25)


def test_an_index_out_of_range_on_threads_writes_nothing(monkeypatch):
    """With VKML_THREADS=2 the nodes run one by one (not one fused program): still nothing."""
    w = Fused().free()
    monkeypatch.setenv("VKML_THREADS", "2")
    w.x[:] = np.linspace(0.2, 1.0, N)
    w.i[5] = 9
    _launch_refused(w, ExecutionError, r"node 'look' \(look\): gather.*index 9 is out of range")


@vkml.kernel
def hop(i, t: vkml.Param):
    return {"i": t[i]}


def test_launch_n_refused_at_a_later_run_writes_nothing():
    """launch(4) of a graph whose fourth run fails: the three good runs are undone too."""
    i = np.zeros(N, np.int64)
    table = np.array([1, 2, 5], np.int64)              # 0 -> 1 -> 2 -> 5 -> out of range
    g = vkml.Graph().add(hop.bind(i=i, t=table), name="hop").build()
    refused(lambda: g.launch(4), lambda: graph_state(g), ExecutionError,
            r"node 'hop' \(hop\): gather.*index 5 is out of range")
    assert np.all(i == 0) and g.generation == 0
    g.launch(2)
    assert np.all(i == 2) and g.generation == 2


@pytest.mark.parametrize("bad", ["0", "-2", "four", ""])
def test_a_bad_thread_count_is_refused_before_anything_runs(monkeypatch, bad):
    w = Fused().free()
    monkeypatch.setenv("VKML_THREADS", bad)
    if bad == "":
        w.graph.launch()                # empty means unset: one thread
        return
    _launch_refused(w, ArgumentError, r"VKML_THREADS must be a positive whole number")


@pytest.mark.parametrize("n", [0, -1, "2", 2.0, True, None])
def test_launch_counts_that_are_not_positive_ints_are_refused(n):
    w = Fused(record=False)
    _launch_refused(w, ArgumentError, r"Graph.launch: n \(runs\) must be a positive int",
                    lambda: w.graph.launch(n))


def test_a_launch_count_beyond_reach_is_refused_not_run():
    w = Fused(record=False)
    _launch_refused(w, ArgumentError, r"Graph.launch: n \(runs\) must be at most 2147483648",
                    lambda: w.graph.launch(2 ** 70))


def test_launch_of_a_recording_graph_twice_per_call_is_refused():
    w = Fused().free()
    _launch_refused(w, RecordError, r"records one run per launch", lambda: w.graph.launch(2))


def test_launch_before_build_is_refused():
    x, u = np.ones(N), np.zeros(N)
    g = vkml.Graph().add(square.bind(x=x, u=u))
    refused(g.launch, lambda: (x.tobytes(), u.tobytes(), g.generation), ArgumentError,
            r"call build\(\)")


# -- planes changed after build() -------------------------------------------------------------

def test_a_plane_resized_in_place_is_refused_naming_it():
    w = Fused().free()
    w.x.resize(2 * N, refcheck=False)
    _launch_refused(w, ShapeError, r"launch: plane 'x' changed since build\(\): its "
                                   r"shape was \(32,\), now \(64,\); rebuild the graph with build\(\) "
                                   r"after replacing/resizing plane 'x'")


def test_a_plane_reshaped_is_refused():
    w = Fused().free()
    w.u.shape = (N, 1)
    _launch_refused(w, ShapeError, r"plane 'u' changed since build\(\): its shape was \(32,\), now "
                                   r"\(32, 1\)")


def test_a_plane_viewed_as_another_dtype_in_place_is_refused():
    w = Fused().free()
    w.x.dtype = np.int64
    _launch_refused(w, ShapeError, r"plane 'x' changed since build\(\): its dtype was float64, now int64")


def test_a_plane_made_read_only_is_refused():
    w = Fused().free()
    w.y.flags.writeable = False
    _launch_refused(w, ShapeError, r"plane 'y' changed since build\(\): whether it is writeable was "
                                   r"True, now False")


def test_a_plane_replaced_in_a_binding_is_refused():
    w = Fused().free()
    w.graph.node("look").op.reads["u"] = np.zeros(N)
    _launch_refused(w, ShapeError, r"launch: plane 'u' of node 'look' was replaced by another array "
                                   r"since build\(\); rebuild the graph with build\(\)")


def test_a_plane_resized_away_and_back_is_read_where_its_memory_now_is():
    """Same shape, strides and dtype: the programs still fit it, and each launch reads the
    array itself, so no rebuild is needed."""
    w = Fused().free()
    w.x.resize(4 * N, refcheck=False)
    w.x.resize(N, refcheck=False)
    w.x[:] = np.linspace(0.2, 0.4, N)
    w.graph.launch()
    np.testing.assert_allclose(w.u, w.x * w.x, rtol=1e-15)


def test_a_rebuild_accepts_the_changed_plane():
    w = Fused().free()
    w.x = np.linspace(0.3, 0.6, N)
    w.graph.node("square").op.reads["x"] = w.x        # another array in the old one's place
    w.graph.build(record=True)
    w.graph.launch()
    np.testing.assert_allclose(w.u, w.x * w.x, rtol=1e-15)


def test_a_reverse_and_keep_refuse_a_plane_resized_after_the_launch():
    w = Fused()
    w.x.resize(2 * N, refcheck=False)
    refused(lambda: vkml.diff.reverse(w.graph.record, {"y": np.ones(N)}), w.state, ShapeError,
            r"reverse: plane 'x' changed since build\(\)")
    refused(w.graph.record.keep, w.state, ShapeError, r"keep: plane 'x' changed since build\(\)")


def test_a_launch_outside_a_graph_refuses_a_read_only_output():
    x, u = np.linspace(0.1, 0.9, N), np.zeros(N)
    bound = two_out.bind(x=x, p=np.zeros(N), q=u)
    u.flags.writeable = False
    refused(bound.launch, lambda: (x.tobytes(), u.tobytes(), bound.writes["p"].tobytes()), ArgumentError,
            r"kernel two_out: output plane 'q' is read-only")


def test_a_launch_outside_a_graph_refuses_a_resized_plane():
    x, u = np.linspace(0.1, 0.9, N).copy(), np.zeros(N)
    bound = square.bind(x=x, u=u)
    x.resize(N + 3, refcheck=False)
    refused(bound.launch, lambda: (x.tobytes(), u.tobytes()), ShapeError,
            r"kernel square: plane 'x' is now float64 \(35,\), but was bound as float64 \(32,\)")


# -- update ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, kind, match", [
    ({"table": None}, ArgumentError, r"update: Param 'table' must be a number or an array of numbers, "
                                     r"got NoneType"),
    ({"table": "abc"}, ArgumentError, r"Param 'table' must be a number"),
    ({"table": [1.0, object(), 2.0]}, ArgumentError, r"Param 'table' must be a number"),
    ({"table": np.ones(5)}, ShapeError, r"update: Param look.table holds shape \(3,\), got \(5,\)"),
    ({"nope": 1.0}, ArgumentError, r"update: no Param 'nope'; Params: \['look.table', 'table'\]"),
    ({"look.nope": 1.0}, ArgumentError, r"no Param 'look.nope'"),
])
def test_update_refusals_change_no_cell(args, kind, match):
    w = Fused().free()
    refused(lambda: w.graph.update(**args), w.state, kind, match)


def test_update_refuses_a_mapping_that_is_not_one_and_a_key_that_is_not_a_name():
    w = Fused().free()
    refused(lambda: w.graph.update([("table", 1.0)]), w.state, ArgumentError, r"update: pass Params as")
    refused(lambda: w.graph.update({3: 1.0}), w.state, ArgumentError, r"Param names are strings")


def test_update_checks_every_value_before_writing_any():
    w = Fused().free()
    refused(lambda: w.graph.update({"table": np.ones(3), "nope": 2.0}), w.state, ArgumentError,
            r"no Param 'nope'")


def test_update_of_an_integer_param_refuses_fractions():
    c = np.zeros(N, np.int64)
    g = vkml.Graph().add(count.bind(c=c, n=np.int64(2)), name="count").build()
    refused(lambda: g.update(n=0.5), lambda: graph_state(g), DTypeError,
            r"update: Param count.n holds int64 values, got float64")
    g.update(n=3)
    g.launch()
    assert np.all(c == 3)


def test_update_with_a_live_record_is_refused():
    w = Fused()
    refused(lambda: w.graph.update(table=np.ones(3)), w.state, RecordError,
            r"update: the Record of generation 1 is still live")


def test_update_during_a_reverse_is_busy():
    w = Fused()
    rec = w.graph.record
    rec.readers += 1                     # what a reverse in another thread holds while it reads
    try:
        refused(lambda: w.graph.update(table=np.ones(3)), w.state, Busy, r"a reverse is reading")
        refused(w.graph.launch, w.state, Busy, r"a reverse is reading")
    finally:
        rec.readers -= 1


# -- reverse ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seeds, kind, match", [
    ({"y": None}, ArgumentError, r"seed 'y' must be an array of numbers, one per sample .*got NoneType"),
    ({"y": "ones"}, ArgumentError, r"seed 'y' must be an array of numbers.*got str"),
    ({"y": np.ones(N, complex)}, ArgumentError, r"seed 'y' must be an array of numbers.*complex"),
    ({"y": [object()] * N}, ArgumentError, r"seed 'y' must be an array of numbers.*object"),
    ({"y": np.ones(N - 1)}, ShapeError, r"seed 'y' has shape \(31,\), but plane 'y' holds one value per "
                                        r"sample, \(32,\)"),
    ({"z": np.ones(N)}, ArgumentError, r"seed 'z': no node writes a plane of that name"),
    ({"x": np.ones(N)}, ArgumentError, r"seed 'x': that is an input of the graph"),
    ({3: np.ones(N)}, ArgumentError, r"seed names must be strings"),
    ([("y", np.ones(N))], ArgumentError, r"seeds must be a dict"),
    (None, ArgumentError, r"seeds must be a dict"),
])
def test_bad_seeds_are_refused_and_the_record_stays_live(seeds, kind, match):
    w = Fused()
    refused(lambda: vkml.diff.reverse(w.graph.record, seeds), w.state, kind, match)
    assert w.graph.record.live


def test_nan_seeds_are_values_like_any_other():
    w = Fused()
    seed = np.ones(N)
    seed[3] = np.nan
    grads = vkml.diff.reverse(w.graph.record, {"y": seed})
    assert np.isnan(grads["x"][3]) and np.isfinite(np.delete(grads["x"], 3)).all()


@pytest.mark.parametrize("kwargs, kind, match", [
    ({"wrt": 3}, ArgumentError, r"wrt must be a name or a list of names"),
    ({"wrt": [None]}, ArgumentError, r"wrt must be a name or a list of names"),
    ({"wrt": ["nope"]}, ArgumentError, r"wrt names \['nope'\] are not inputs or Params"),
    ({"vjps": [1]}, ArgumentError, r"vjps must be a dict of node name"),
    ({"vjps": {"look": 5}}, ArgumentError, r"the vjp of node 'look' must be a function"),
    ({"vjps": {1: print}}, ArgumentError, r"vjps keys are node names"),
    ({"vjps": {"nope": print}}, ArgumentError, r"vjps names 'nope', but the graph has no such node"),
    ({"strict": "yes"}, ArgumentError, r"strict must be True or False"),
    ({"strict": True}, RefusedError, r"strict=True.*\['look.table'\] are scatter-adds"),
])
def test_bad_reverse_arguments_are_refused_and_the_record_stays_live(kwargs, kind, match):
    w = Fused()
    refused(lambda: vkml.diff.reverse(w.graph.record, {"y": np.ones(N)}, **kwargs), w.state, kind,
            match)
    assert w.graph.record.live


def test_a_reused_reverse_refuses_bad_calls_and_then_works():
    w = Fused()
    rev = vkml.diff.Reverse(w.graph)
    rec = w.graph.record
    refused(lambda: rev(rec, {"y": None}), w.state, ArgumentError, r"seed 'y'")
    refused(lambda: rev(rec, {"y": np.ones(N)}, wrt=7), w.state, ArgumentError, r"wrt must be")
    refused(lambda: rev("record", {"y": np.ones(N)}), w.state, ArgumentError, r"expected a Record")
    other = Fused()
    refused(lambda: rev(other.graph.record, {"y": np.ones(N)}), w.state, ArgumentError,
            r"belongs to another graph")
    grads = rev(rec, {"y": np.ones(N)})
    np.testing.assert_allclose(grads["x"], 2 * w.x * w.table[w.i], rtol=1e-13)


def test_a_stale_record_and_second_order_are_refused():
    w = Fused()
    rec = w.graph.record
    rec.keep()
    w.graph.launch()
    rec.kept = False                       # as a Record that was never kept
    try:
        refused(lambda: vkml.diff.reverse(rec, {"y": np.ones(N)}), w.state, RecordError,
                r"generation 1, but the graph has launched since and is at generation 2")
        refused(rec.keep, w.state, RecordError, r"keep: this Record is of generation 1")
    finally:
        rec.kept = True
    grads = vkml.diff.reverse(w.graph.record, {"y": np.ones(N)})
    refused(lambda: vkml.diff.reverse(grads, {"y": np.ones(N)}), w.state, RefusedError,
            r"second order")
    refused(lambda: vkml.diff.Reverse(vkml.diff.Reverse(w.graph)), w.state, RefusedError,
            r"second order")


def test_reverse_of_a_graph_built_without_record_is_refused():
    w = Fused(record=False)
    refused(lambda: vkml.diff.Reverse(w.graph), w.state, ArgumentError, r"built without record=True")
    refused(lambda: vkml.diff.Reverse("graph"), w.state, ArgumentError, r"expected a Graph")
    refused(lambda: vkml.diff.reverse(None, {}), w.state, ArgumentError,
            r"there is no Record.*build\(record=True\)")


# -- a graph that runs node by node: opaque, skippable, repeat_while, reduce ---------------------

class Steps:
    """model (opaque): u = x^2;  maybe (skippable): y = sin(k u);  loop (repeat_while): s *= k2
    while the guard says so;  total (reduce): sum of y."""

    def __init__(self, fn=None, guard=None, record=True, op="sum"):
        self.x = np.linspace(0.1, 0.9, N)
        self.u, self.y, self.s = np.zeros(N), np.zeros(N), np.ones(N)
        self.total = np.zeros(1)
        self.flag = np.array([1], np.uint32)
        self.trips = [0]

        def two_trips():
            self.trips[0] += 1
            return self.trips[0] % 3 != 0

        model = vkml.graph.opaque(fn or (lambda r: {"u": r["x"] ** 2}), reads={"x": self.x},
                                  writes={"u": self.u}, name="model")
        self.graph = (vkml.Graph().add(model, name="model")
                      .add(vkml.skippable(wave.bind(u=self.u, k=1.5, y=self.y),
                                          vkml.SkipGuard.nonzero(self.flag)), name="maybe")
                      .add(vkml.repeat_while(nudge.bind(s=self.s, k=1.01), guard or two_trips,
                                             max_iters=5), name="loop")
                      .add(vkml.graph.reduce(self.y, self.total, op), name="total")
                      .build(record=record))

    def state(self):
        return graph_state(self.graph), self.flag.tobytes()


def _model_vjp(primals, cts):
    return {"x": 2 * primals["x"] * cts["u"]}


def test_the_node_by_node_graph_reverses_against_the_analytic_gradient():
    """The graph the refusals below use works, and its gradient is right (analytic)."""
    w = Steps()
    w.graph.launch()
    grads = vkml.diff.reverse(w.graph.record, {"total.dst": np.ones(1)}, vjps={"model": _model_vjp})
    np.testing.assert_allclose(grads["x"], 1.5 * np.cos(1.5 * w.x ** 2) * 2 * w.x, rtol=1e-12)


@pytest.mark.parametrize("fn, kind, match", [
    (lambda r: 1 / 0, ExecutionError, r"opaque node 'model' raised ZeroDivisionError: division by zero"),
    (lambda r: {"v": r["x"]}, ArgumentError, r"opaque node 'model' must return a dict with exactly "
                                             r"\['u'\], got \['v'\]"),
    (lambda r: "u", ArgumentError, r"opaque node 'model' must return a dict.*got str"),
    (lambda r: {"u": "x squared"}, ArgumentError, r"opaque node 'model': output 'u' must be an array"),
    (lambda r: {"u": np.ones(N + 1)}, ShapeError, r"opaque node 'model': output 'u' must be an array "
                                                  r"of shape \(32,\)"),
])
def test_an_opaque_node_that_fails_writes_nothing(fn, kind, match):
    broken = []
    w = Steps(lambda r: fn(r) if broken else {"u": r["x"] ** 2})
    w.graph.launch()
    vkml.diff.reverse(w.graph.record, {"total.dst": np.ones(1)}, vjps={"model": _model_vjp})
    broken.append(True)
    w.x[:] = np.linspace(0.3, 0.7, N)
    refused(w.graph.launch, w.state, kind, match)


def test_a_failing_node_after_others_have_written_puts_their_planes_back():
    """model and maybe write u and y, loop writes s in place once; then its guard raises."""
    sensor = {"calls": 0, "broken": False}

    def guard():                                 # one trip; a broken sensor fails the second call
        sensor["calls"] += 1
        if sensor["broken"] and sensor["calls"] > 1:
            raise RuntimeError("sensor offline")
        return sensor["calls"] == 1

    w = Steps(guard=guard, record=False)
    w.graph.launch()
    np.testing.assert_allclose(w.s, 1.01)
    sensor.update(calls=0, broken=True)
    w.x[:] = np.linspace(0.3, 0.7, N)
    refused(w.graph.launch, w.state, ExecutionError, r"the guard of node 'loop' raised RuntimeError: "
                                                     r"sensor offline")
    np.testing.assert_allclose(w.s, 1.01)       # the member's in-place write was put back


def test_an_index_out_of_range_in_a_skippable_member_writes_nothing():
    i = (np.arange(N) % 3).astype(np.int64)
    x, u, y = np.linspace(0.1, 0.9, N), np.zeros(N), np.zeros(N)
    flag = np.array([1], np.uint32)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(vkml.skippable(look.bind(i=i, u=u, table=np.ones(3), y=y), vkml.SkipGuard.nonzero(flag)),
              name="maybe").build(record=True))
    g.launch()
    g.record.keep()
    x[:] = 0.5
    i[0] = 3
    refused(g.launch, lambda: graph_state(g), ExecutionError, r"node 'maybe' \(look\): gather.*index 3 "
                                                              r"is out of range")
    flag[0] = 0                                   # skipped: the bad index is never read
    g.launch()
    np.testing.assert_allclose(u, 0.25)


@pytest.mark.parametrize("vjp, kind, match", [
    (lambda p, c: {"x": "the gradient"}, ArgumentError, r"the vjp of opaque node 'model': gradient "
                                                        r"'x' must be an array of floats"),
    (lambda p, c: {"x": np.ones(3)}, ShapeError, r"the vjp of opaque node 'model': gradient 'x' must be "
                                                 r"an array of shape \(32,\)"),
    (lambda p, c: {"x": np.ones(N, complex)}, ArgumentError, r"gradient 'x' must be an array of floats"),
    (lambda p, c: {"nope": np.ones(N)}, ArgumentError, r"returned gradients for \['nope'\], which the "
                                                       r"node does not read"),
    (lambda p, c: [np.ones(N)], ArgumentError, r"must return a dict of read plane name -> gradient"),
    (lambda p, c: 1 / 0, ExecutionError, r"the vjp of opaque node 'model' raised ZeroDivisionError"),
])
def test_an_opaque_vjp_returning_anything_but_gradients_is_refused(vjp, kind, match):
    w = Steps()
    w.graph.launch()
    refused(lambda: vkml.diff.reverse(w.graph.record, {"total.dst": np.ones(1)}, vjps={"model": vjp}),
            w.state, kind, match)
    assert w.graph.record.live
    good = vkml.diff.reverse(w.graph.record, {"total.dst": np.ones(1)}, vjps={"model": _model_vjp})
    assert good["x"].shape == (N,)


def test_refusals_of_what_cannot_be_reversed_change_nothing():
    w = Steps()
    w.graph.launch()
    refused(lambda: vkml.diff.reverse(w.graph.record, {"total.dst": np.ones(1)}), w.state, RefusedError,
            r"node 'model' is an opaque node")
    refused(lambda: vkml.diff.reverse(w.graph.record, {"total.dst": np.ones(1)},
                                      vjps={"model": w.graph.node("model").op}),
            w.state, RefusedError, r"the vjp of node 'model' is a graph node")
    m = Steps(op="max")
    m.graph.launch()
    refused(lambda: vkml.diff.reverse(m.graph.record, {"total.dst": np.ones(1)},
                                      vjps={"model": _model_vjp}), m.state, RefusedError,
            r"node 'total' is a 'max' reduction")


# -- simulations -----------------------------------------------------------------------------

@vkml.kernel
def drift(x, v, k: vkml.Param):
    return {"x": x + 0.01 * v, "v": v - 0.01 * k * x}


@vkml.kernel
def lookup_drift(x, i, table: vkml.Param):
    return {"x": x + 0.01 * table[i]}


@vkml.kernel
def pushed(x, corr):
    return {"x": x + 0.01 * corr}


def _sim(record=True, **kw):
    x, v = np.linspace(-0.5, 0.5, N).copy(), np.zeros(N)
    return vkml.simulation(drift, max_steps=20, record=record, x=x, v=v, k=1.0, **kw), x, v


def test_a_simulation_step_with_an_index_out_of_range_writes_nothing(vk_backend):
    x, i = np.linspace(-0.5, 0.5, N), (np.arange(N) % 3).astype(np.int64)
    sim = vkml.simulation(lookup_drift, max_steps=10, record=True, x=x, i=i, table=np.ones(3))
    i[7] = 4
    pattern = (r"simulation step lookup_drift: gather.*index 4 is out of range" if vk_backend == "numpy"
               else r"lookup_drift.*(out of range|sample 7)")
    refused(sim.run, lambda: sim_state(sim), ExecutionError, pattern)


def test_a_model_node_failing_part_way_through_a_run_writes_nothing():
    """until_done([node, kernel]) runs on NumPy on every backend; the node fails at step 5."""
    x, corr = np.linspace(-0.5, 0.5, N), np.zeros(N)
    calls = [0]

    def model(r):
        calls[0] += 1
        if calls[0] == 5:
            raise FloatingPointError("diverged")
        return {"corr": -r["x"] ** 3}

    node = vkml.graph.opaque(model, reads={"x": x}, writes={"corr": corr}, name="model")
    sim = vkml.until_done([node, pushed], max_steps=10, record=True, x=x, corr=corr)
    err = refused(sim.run, lambda: sim_state(sim), ExecutionError,
                  r"opaque node 'model' raised FloatingPointError: diverged")
    assert isinstance(err.__cause__, FloatingPointError)        # the user's error, kept as the cause
    assert sim.record is None and sim.generation == 0


def test_a_simulation_refuses_a_plane_resized_after_it_was_made():
    sim, x, v = _sim()
    sim.run()
    v.resize(N + 1, refcheck=False)
    refused(sim.run, lambda: sim_state(sim), ShapeError,
            r"simulation.run: plane 'v' changed since the simulation was made: its shape was "
            r"\(32,\), now \(33,\).*make the simulation again")


def test_a_simulation_reverse_and_keep_refuse_a_fixed_plane_resized_after_the_run():
    x, i = np.linspace(-0.5, 0.5, N), (np.arange(N) % 3).astype(np.int64)
    sim = vkml.simulation(lookup_drift, max_steps=10, record=True, x=x, i=i, table=np.ones(3))
    sim.run()
    i.resize(N + 1, refcheck=False)
    refused(lambda: vkml.diff.reverse(sim.record, {"x": np.ones(N)}), lambda: sim_state(sim), ShapeError,
            r"reverse: plane 'i' changed")
    refused(sim.record.keep, lambda: sim_state(sim), ShapeError, r"keep: plane 'i' changed")


@pytest.mark.parametrize("seeds, kwargs, kind, match", [
    ({"x": None}, {}, ArgumentError, r"seed 'x' must be an array of numbers"),
    ({"x": "ones"}, {}, ArgumentError, r"seed 'x' must be an array of numbers"),
    ({"x": np.ones(N - 1)}, {}, ShapeError, r"seed 'x' has shape \(31,\)"),
    ([("x", 1)], {}, ArgumentError, r"seeds must be a dict"),
    ({1: np.ones(N)}, {}, ArgumentError, r"seed names are state plane names"),
    ({"k": np.ones(N)}, {}, ArgumentError, r"seed 'k': that is an input of the simulation"),
    ({"x": np.ones(N)}, {"wrt": ["nope"]}, ArgumentError, r"wrt names \['nope'\] are not inputs"),
    ({"x": np.ones(N)}, {"wrt": 5}, ArgumentError, r"wrt must be a name or a list of names"),
    ({"x": np.ones(N)}, {"vjps": "no"}, ArgumentError, r"vjps must be a dict"),
    ({"x": np.ones(N)}, {"strict": 1}, ArgumentError, r"strict must be True or False"),
])
def test_bad_simulation_reverse_arguments_change_nothing(seeds, kwargs, kind, match):
    sim, x, v = _sim()
    sim.run()
    refused(lambda: vkml.diff.reverse(sim.record, seeds, **kwargs), lambda: sim_state(sim), kind, match)
    assert not sim.record.reversed
    grads = vkml.diff.reverse(sim.record, {"x": np.ones(N)})
    assert grads["x"].shape == (N,)


def test_a_simulation_node_vjp_returning_a_string_is_refused():
    x, corr = np.linspace(-0.5, 0.5, N), np.zeros(N)
    node = vkml.graph.opaque(lambda r: {"corr": -r["x"] ** 3}, reads={"x": x}, writes={"corr": corr},
                             name="model")
    sim = vkml.until_done([node, pushed], max_steps=10, record=True, x=x, corr=corr)
    sim.run()
    refused(lambda: vkml.diff.reverse(sim.record, {"x": np.ones(N)},
                                      vjps={"model": lambda p, c: {"x": "slope"}}),
            lambda: sim_state(sim), ArgumentError,
            r"the vjp of opaque node 'model': gradient 'x' must be an array of floats")
    refused(lambda: vkml.diff.reverse(sim.record, {"x": np.ones(N)},
                                      vjps={"model": lambda p, c: {"x": np.ones(2)}}),
            lambda: sim_state(sim), ShapeError, r"gradient 'x' must be an array of shape")


@pytest.mark.parametrize("kwargs, match", [
    ({"max_steps": True}, r"max_steps must be a positive int"),
    ({"max_steps": 0}, r"max_steps must be a positive int"),
    ({"max_steps": "10"}, r"max_steps must be a positive int"),
    ({"max_steps": 2 ** 70}, r"max_steps must be at most 1099511627776"),
    ({"max_steps": 10, "record": "yes"}, r"record must be True or False"),
    ({"max_steps": 10, "record": True, "window": True}, r"window must be a positive int, 'full' or "
                                                        r"'binomial'"),
    ({"max_steps": 10, "record": True, "window": np.array([2, 3])}, r"window must be"),
    ({"max_steps": 10, "record": True, "window": "half"}, r"window must be"),
    ({"max_steps": 10, "record": True, "memory_budget": "1GB"}, r"memory_budget must be a positive "
                                                                r"number of bytes"),
    ({"max_steps": 10, "record": True, "memory_budget": -5}, r"memory_budget must be a positive"),
    ({"max_steps": 10, "record": True, "memory_budget": float("nan")}, r"memory_budget must be"),
    ({"max_steps": 10, "record": True, "window": "binomial", "snapshots": "3"},
     r"snapshots must be a whole number >= 0"),
    ({"max_steps": 10, "record": True, "window": "binomial", "snapshots": -1}, r"snapshots must be"),
    ({"max_steps": 10, "steps_per_launch": 0}, r"steps_per_launch must be a positive int"),
    ({"max_steps": 10, "progress": "yes"}, r"progress must be True, False or None"),
])
def test_simulation_arguments_are_checked(kwargs, match):
    x, v = np.linspace(-0.5, 0.5, N), np.zeros(N)
    before = (x.tobytes(), v.tobytes())
    with pytest.raises(ArgumentError, match=match):
        vkml.simulation(drift, x=x, v=v, k=1.0, **kwargs)
    with pytest.raises(ArgumentError, match=match):
        vkml.until_done(drift, x=x, v=v, k=1.0, **kwargs)
    assert (x.tobytes(), v.tobytes()) == before


# -- argument checks of the constructors ------------------------------------------------------

def _x():
    return np.linspace(0.1, 0.9, N)


@pytest.mark.parametrize("make, kind, match", [
    (lambda: vkml.Graph().add(square), ArgumentError, r"kernel square is not bound"),
    (lambda: vkml.Graph().add("square"), ArgumentError, r"cannot add a str"),
    (lambda: vkml.Graph().add(square.bind(x=_x(), u=np.zeros(N)), name=5), ArgumentError,
     r"node name 5 must be a non-empty string"),
    (lambda: vkml.Graph().add(square.bind(x=_x(), u=np.zeros(N)), name="a.b"), ArgumentError,
     r"without '\.'"),
    (lambda: vkml.Graph().build(), ArgumentError, r"the graph has no nodes"),
    (lambda: vkml.Graph().n, ArgumentError, r"the graph has no nodes yet"),
    (lambda: vkml.Graph().add(square.bind(x=_x(), u=np.zeros(N))).build(record="yes"), ArgumentError,
     r"record must be True or False"),
    (lambda: vkml.Graph().add(square.bind(x=_x(), u=np.zeros(N))).node("nope"), ArgumentError,
     r"no node named 'nope'"),
    (lambda: vkml.Graph().add(square.bind(x=_x(), u=np.zeros(N))).add(
        square.bind(x=np.ones(N + 1), u=np.zeros(N + 1)), name="b").build(), ShapeError,
     r"different numbers of samples"),
    (lambda: square.bind(x=np.array(["a"] * N), u=np.zeros(N)), DTypeError, r"plane 'x' holds <U1"),
    (lambda: square.bind(x=[1.0] * N, u=np.zeros(N)), ArgumentError, r"plane 'x' must be a NumPy array"),
    (lambda: square.bind(x=_x()), ArgumentError, r"output 'u' is not bound"),
    (lambda: square.bind(u=np.zeros(N)), ArgumentError, r"input 'x' is not bound"),
    (lambda: wave.bind(u=_x(), k=None, y=np.zeros(N)), ArgumentError, r"Param 'k' must be a number"),
    (lambda: wave.bind(u=_x(), k="fast", y=np.zeros(N)), ArgumentError, r"Param 'k' must be a number"),
    (lambda: vkml.graph.opaque(5, reads={}, writes={"u": np.zeros(N)}), ArgumentError,
     r"fn must be callable"),
    (lambda: vkml.graph.opaque(print, reads=[_x()], writes={"u": np.zeros(N)}), ArgumentError,
     r"reads must be a dict of name \(str\) -> NumPy plane"),
    (lambda: vkml.graph.opaque(print, reads={1: _x()}, writes={"u": np.zeros(N)}), ArgumentError,
     r"reads must be a dict"),
    (lambda: vkml.graph.opaque(print, reads={"x": _x()}, writes={}), ArgumentError, r"writes is empty"),
    (lambda: vkml.graph.opaque(print, reads={"x": _x()}, writes={"u": np.zeros(N + 1)}), ShapeError,
     r"different numbers of rows"),
    (lambda: vkml.graph.opaque(print, reads={"x": np.float64(1)}, writes={"u": np.zeros(N)}),
     ArgumentError, r"reads must be a dict"),
    (lambda: vkml.graph.opaque(print, reads={"x": np.zeros(())}, writes={"u": np.zeros(N)}),
     ShapeError, r"plane 'x' must be an array of numbers with one row per sample"),
    (lambda: vkml.graph.opaque(print, reads={"x": _x()}, writes={"u": np.zeros(N)}, name=""),
     ArgumentError, r"name must be a non-empty string"),
    (lambda: vkml.graph.opaque(print, reads={"x": _x()}, writes={"u": _frozen()}), ArgumentError,
     r"write plane 'u' is read-only"),
    (lambda: vkml.graph.reduce(_x(), np.zeros(1), op=["sum"]), ArgumentError, r"op must be one of"),
    (lambda: vkml.graph.reduce(_x(), np.zeros(1), op="mean"), ArgumentError, r"op must be one of"),
    (lambda: vkml.graph.reduce(_x(), [0.0]), ArgumentError, r"src and dst must be NumPy planes"),
    (lambda: vkml.graph.reduce(np.zeros(()), np.zeros(())), ShapeError, r"one row per sample"),
    (lambda: vkml.graph.reduce(_x(), _frozen(1)), ArgumentError, r"dst is read-only"),
    (lambda: vkml.SkipGuard.nonzero([1]), ArgumentError, r"the guard must be a NumPy array cell"),
    (lambda: vkml.SkipGuard.nonzero(np.array([], np.uint32)), ArgumentError, r"NumPy array cell"),
    (lambda: vkml.SkipGuard.nonzero(np.array(["on"])), ArgumentError, r"NumPy array cell of numbers"),
    (lambda: vkml.SkipGuard(np.ones(1), how="zero"), ArgumentError, r"how must be 'nonzero'"),
    (lambda: vkml.skippable(square.bind(x=_x(), u=np.zeros(N)), "yes"), ArgumentError,
     r"skippable: the guard must be"),
    (lambda: vkml.skippable(print, np.ones(1)), ArgumentError, r"the member must be a kernel launch"),
    (lambda: vkml.repeat_while(nudge.bind(s=_x(), k=1.0), 3, max_iters=2), ArgumentError,
     r"repeat_while: the guard must be"),
    (lambda: vkml.repeat_while(nudge.bind(s=_x(), k=1.0), np.ones(1), max_iters=True), ArgumentError,
     r"max_iters must be a positive int"),
    (lambda: vkml.repeat_while(nudge.bind(s=_x(), k=1.0), np.ones(1), max_iters="3"), ArgumentError,
     r"max_iters must be a positive int"),
])
def test_constructor_arguments_are_refused_with_vkml_errors(make, kind, match):
    with pytest.raises(kind, match=match) as err:
        make()
    assert isinstance(err.value, VkmlError)


def _frozen(n=N):
    a = np.zeros(n)
    a.flags.writeable = False
    return a


def test_a_graph_writing_a_read_only_plane_is_refused_at_build():
    u = np.zeros(N)
    g = vkml.Graph().add(square.bind(x=_x(), u=u), name="square")
    u.flags.writeable = False
    with pytest.raises(ArgumentError, match=r"node 'square' writes plane 'u', which is read-only"):
        g.build()


# -- more refusals of a stateful call: each leaves everything as it was -----------------------------

@vkml.kernel(vjp_of=wave)
def wrong_wave_vjp(u, k: vkml.Param, y_bar):
    return {"u_bar": y_bar * vkml.cos(k * u)}           # misses the factor k


@vkml.kernel(vjp_of=square)
def square_vjp(x, u_bar):
    return {"x_bar": 2 * x * u_bar}


def _waves():
    x, u, y = np.linspace(0.1, 0.9, N), np.zeros(N), np.zeros(N)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=1.5, y=y), name="wave").build(record=True))
    g.launch()
    return g


def test_wrong_vjp_kernels_are_refused_and_the_record_stays_live():
    g = _waves()
    snap = lambda: graph_state(g)                                      # noqa: E731
    refused(lambda: vkml.diff.reverse(g.record, {"y": np.ones(N)}, vjps={"wave": wrong_wave_vjp}),
            snap, RefusedError, r"wrong_wave_vjp is not the vjp of node 'wave'.*u_bar disagrees")
    refused(lambda: vkml.diff.reverse(g.record, {"y": np.ones(N)}, vjps={"wave": square_vjp}),
            snap, RefusedError, r"square_vjp is not the vjp of node 'wave'")
    assert g.record.live


def test_a_reverse_while_a_launch_runs_and_a_shared_reverse_are_busy():
    g = _waves()
    rev = vkml.diff.Reverse(g)
    g.launching = True                    # what another thread's launch holds while it runs
    try:
        refused(lambda: rev(g.record, {"y": np.ones(N)}), lambda: graph_state(g), Busy,
                r"reverse: the graph is running launch 2")
        refused(g.launch, lambda: graph_state(g), Busy, r"launch: the graph is running launch 2")
    finally:
        g.launching = False
    with rev._lock:                        # another thread inside this Reverse
        refused(lambda: rev(g.record, {"y": np.ones(N)}), lambda: graph_state(g), Busy,
                r"another thread is running this Reverse")
    assert g.record.live


def test_a_graph_changed_after_build_refuses_launch_and_update():
    g = _waves()
    vkml.diff.reverse(g.record, {"y": np.ones(N)})
    g.add(square.bind(x=np.ones(N), u=np.zeros(N)), name="again")
    refused(g.launch, lambda: graph_state(g), ArgumentError, r"Graph.launch: call build\(\)")
    refused(lambda: g.update(k=2.0), lambda: graph_state(g), ArgumentError, r"update: call build\(\)")


def test_simulation_run_and_reverse_refusals_of_state_change_nothing():
    sim, x, v = _sim()
    sim.run()
    old = sim.record
    snap = lambda: sim_state(sim)                                       # noqa: E731
    old.readers += 1                      # a reverse reading the Record in another thread
    try:
        refused(sim.run, snap, Busy, r"simulation.run: a reverse is reading the last Record")
    finally:
        old.readers -= 1
    sim.run()                              # old is now stale
    refused(lambda: vkml.diff.reverse(old, {"x": np.ones(N)}), snap, RecordError,
            r"this Record is of generation 1, but the simulation has run since")
    refused(old.keep, snap, RecordError, r"keep: this Record is of generation 1")
    other, _, _ = _sim()
    refused(lambda: vkml.diff.Reverse(other)(sim.record, {"x": np.ones(N)}), snap, ArgumentError,
            r"this Record belongs to another simulation")
    plain, _, _ = _sim(record=False)
    refused(lambda: vkml.diff.Reverse(plain), snap, ArgumentError, r"made without record=True")
    grads = vkml.diff.reverse(sim.record, {"x": np.ones(N)})
    assert grads["x"].shape == (N,)


def test_a_strict_simulation_reverse_of_a_table_read_by_index_changes_nothing():
    x, i = np.linspace(-0.5, 0.5, N), (np.arange(N) % 3).astype(np.int64)
    sim = vkml.simulation(lookup_drift, max_steps=10, record=True, x=x, i=i, table=np.ones(3))
    sim.run()
    refused(lambda: vkml.diff.reverse(sim.record, {"x": np.ones(N)}, strict=True),
            lambda: sim_state(sim), RefusedError, r"strict=True.*\['table'\] in lookup_drift")
    assert not sim.record.reversed


def test_a_plane_listed_twice_is_backed_up_once_and_restored(vk_backend):
    """The all-or-nothing block copies each plane once however often it is listed (two nodes
    writing the same plane list it twice), and still puts it back when the call fails."""
    from vkml.graph.execute import all_or_nothing
    plane = np.arange(4.0)
    block = all_or_nothing([plane, plane, plane])
    assert len(block.backups) == 1
    with pytest.raises(ExecutionError, match="nothing was changed"):
        with all_or_nothing([plane, plane]):
            plane[:] = -1.0
            raise RuntimeError("a user's node failed")
    assert plane.tolist() == [0.0, 1.0, 2.0, 3.0]
