"""What a reverse of a graph refuses, and the two mistakes everyone makes once.

Each refusal is a ``vkml.VkmlError`` whose message names the node or plane and
says what to do instead, and each test then shows that the refused call
changed nothing: the Record is still live (or kept) exactly as before, and a
later reverse works and gives the right (analytic) gradient.

Not applicable to vkml, so not tested here: "a kernel that reads a plane
before assigning it" (a vkml kernel is a pure function of its inputs; a value
carried from one launch to the next lives in a plane, which the Record copies
before its overwrite -- see test_graph.test_record_copies_only_what_is_overwritten),
and the events="refine" crossing cases (vkml refuses ``events=`` altogether;
tested below).
"""

from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml.errors import VkmlError
from models import square, wave

N = 32
K = 1.5


@vkml.kernel(vjp_of=wave)
def wave_vjp(u, k: vkml.Param, y_bar):
    return {"u_bar": y_bar * k * vkml.cos(k * u), "k_bar": y_bar * u * vkml.cos(k * u)}


@vkml.kernel(vjp_of=wave)
def wrong_wave_vjp(u, k: vkml.Param, y_bar):
    return {"u_bar": y_bar * vkml.cos(k * u), "k_bar": y_bar * u * vkml.cos(k * u)}


@vkml.kernel(vjp_of=square)
def square_vjp(x, u_bar):
    return {"x_bar": 2 * x * u_bar}


@vkml.custom_jvp
def not_linear(x):
    return x * x


@not_linear.defjvp
def _not_linear_rule(primals, tangents):
    return primals[0] * primals[0], tangents[0] * tangents[0]      # not linear in the tangent


@vkml.kernel
def no_vjp(x):
    return {"y": not_linear(x)}


def two_node():
    x = np.linspace(0.1, 0.9, N)
    u, y = np.zeros(N), np.zeros(N)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=K, y=y), name="wave").build(record=True))
    g.launch()
    return g, x


def expected(x, k=K):
    u = x * x
    return 2 * x * k * np.cos(k * u), float(np.sum(u * np.cos(k * u)))


def still_live_and_right(g, x, seeds=None):
    """The refused call changed nothing: the same Record is live and reverses to the right values."""
    rec = g.record
    assert rec.live and rec.generation == g.generation
    with pytest.raises(VkmlError, match="still live"):
        g.launch()
    grads = vkml.diff.reverse(rec, seeds or {"wave.y": np.ones(N)})
    gx, gk = expected(x)
    np.testing.assert_allclose(grads["x"], gx, rtol=1e-12)
    np.testing.assert_allclose(grads["k"], gk, rtol=1e-12)
    assert not rec.live


# -- the two mistakes everyone makes once ------------------------------------------------------------

def test_seeding_an_input_says_it_is_grads_x():
    g, x = two_node()
    with pytest.raises(VkmlError, match=r"seed 'x': that is an input of the graph, not an output; "
                                        r"its gradient is grads\['x'\]"):
        vkml.diff.reverse(g.record, {"x": np.ones(N)})
    with pytest.raises(VkmlError, match=r"seed 'square\.x'.*grads\['square\.x'\]"):
        vkml.diff.reverse(g.record, {"square.x": np.ones(N), "wave.y": np.ones(N)})
    with pytest.raises(VkmlError, match=r"seed 'z': no node writes a plane of that name; outputs: "
                                        r"\['square\.u', 'wave\.y'\]"):
        vkml.diff.reverse(g.record, {"z": np.ones(N)})
    still_live_and_right(g, x)


@pytest.mark.parametrize("seed", [np.ones(N + 1), np.ones((N, 1)), 1.0, np.ones(1)])
def test_a_seed_that_is_not_one_value_per_sample(seed):
    g, x = two_node()
    rev = vkml.diff.Reverse(g)
    with pytest.raises(VkmlError, match=r"seed 'wave\.y' has shape .*holds one value per sample, "
                                        r"\(32,\); pass one seed per sample"):
        rev(g.record, {"wave.y": seed})
    still_live_and_right(g, x)


def test_seeds_that_are_not_a_dict_of_names():
    g, x = two_node()
    with pytest.raises(VkmlError, match="seeds must be a dict of output plane name"):
        vkml.diff.reverse(g.record, np.ones(N))
    with pytest.raises(VkmlError, match="seed names must be strings"):
        vkml.diff.reverse(g.record, {0: np.ones(N)})
    still_live_and_right(g, x)


# -- What a reverse refuses --------------------------------------------------------------------------

def test_an_opaque_node_without_a_vjp():
    x = np.linspace(0.1, 0.9, N)
    u, y = np.zeros(N), np.zeros(N)
    node = vkml.graph.opaque(lambda r: {"u": r["x"] ** 2}, reads={"x": x}, writes={"u": u},
                             name="model")
    g = (vkml.Graph().add(node, name="model").add(wave.bind(u=u, k=K, y=y), name="wave")
         .build(record=True))
    g.launch()
    with pytest.raises(VkmlError, match=r"node 'model' is an opaque node; vkml cannot know its "
                                        r"derivative -- pass its vjp: vjps=\{'model': fn\}"):
        vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
    with pytest.raises(VkmlError, match=r"node 'model' is an opaque node"):
        vkml.diff.Reverse(g)
    with pytest.raises(VkmlError, match=r"the vjp of node 'model' is a graph node; pass a function"):
        vkml.diff.reverse(g.record, {"wave.y": np.ones(N)}, vjps={"model": node})
    with pytest.raises(VkmlError, match=r"vjps names 'modle', but the graph has no such node"):
        vkml.diff.reverse(g.record, {"wave.y": np.ones(N)}, vjps={"modle": lambda p, c: {}})
    assert g.record.live
    grads = vkml.diff.reverse(g.record, {"wave.y": np.ones(N)},
                              vjps={"model": lambda p, c: {"x": 2 * p["x"] * c["u"]}})
    gx, gk = expected(x)
    np.testing.assert_allclose(grads["x"], gx, rtol=1e-12)
    np.testing.assert_allclose(grads["k"], gk, rtol=1e-12)


@pytest.mark.parametrize("op", ["max", "all", "min", "any"])
def test_a_max_or_all_reduction(op):
    x = np.linspace(0.1, 0.9, N)
    u, y = np.zeros(N), np.zeros(N)
    dst = np.zeros(1)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=K, y=y), name="wave")
         .add(vkml.graph.reduce(y, dst, op), name="pool").build(record=True))
    g.launch()
    with pytest.raises(VkmlError, match=rf"node 'pool' is a '{op}' reduction; a tie has no single "
                                        r"derivative -- use a 'sum' reduction"):
        vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
    assert g.record.live


def test_a_sum_reduction_reverses_with_the_canonical_tree():
    x = np.linspace(0.1, 0.9, N)
    u, y = np.zeros(N), np.zeros(N)
    total = np.zeros(1)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=K, y=y), name="wave")
         .add(vkml.graph.reduce(y, total, "sum"), name="total").build(record=True))
    g.launch()
    assert total[0] == vkml.graph.tree_sum(y)
    grads = vkml.diff.reverse(g.record, {"total.dst": np.array([2.0])})
    gx, gk = expected(x)
    np.testing.assert_allclose(grads["x"], 2 * gx, rtol=1e-12)
    np.testing.assert_allclose(grads["k"], 2 * gk, rtol=1e-12)


def test_a_reverse_of_a_reverse():
    g, x = two_node()
    rev = vkml.diff.Reverse(g)
    grads = rev(g.record, {"wave.y": np.ones(N)})
    g.launch()
    for call in (lambda: vkml.diff.Reverse(rev), lambda: vkml.diff.Reverse(grads),
                 lambda: vkml.diff.reverse(grads, {"x": np.ones(N)})):
        with pytest.raises(VkmlError, match=r"a reverse of a reverse \(second order\) is not supported"):
            call()
    still_live_and_right(g, x)


def test_a_launch_node_with_no_vjp_and_none_passed():
    x = np.linspace(0.1, 0.9, N)
    y = np.zeros(N)
    g = vkml.Graph().add(no_vjp.bind(x=x, y=y), name="odd").build(record=True)
    g.launch()
    np.testing.assert_allclose(y, x * x, rtol=1e-15)
    with pytest.raises(VkmlError, match=r"node 'odd' \(no_vjp\) has no vjp .*pass one with "
                                        r"vjps=\{'odd': vjp_kernel\}"):
        vkml.diff.reverse(g.record, {"y": np.ones(N)})
    assert g.record.live
    # the fix the message names: a hand-written vjp kernel, checked against central differences
    with pytest.raises(VkmlError, match=r"wrong_no_vjp_vjp is not the vjp of node 'odd''s kernel "
                                        r"no_vjp: its x_bar disagrees with central differences"):
        vkml.diff.reverse(g.record, {"y": np.ones(N)}, vjps={"odd": wrong_no_vjp_vjp})
    assert g.record.live
    seed = np.linspace(1, 2, N)
    grads = vkml.diff.reverse(g.record, {"y": seed}, vjps={"odd": no_vjp_vjp})
    np.testing.assert_allclose(grads["x"], 2 * x * seed, rtol=1e-15)


@vkml.kernel(vjp_of=no_vjp)
def no_vjp_vjp(x, y_bar):
    return {"x_bar": 2 * x * y_bar}


@vkml.kernel(vjp_of=no_vjp)
def wrong_no_vjp_vjp(x, y_bar):
    return {"x_bar": x * y_bar}


def test_a_vjp_kernel_that_is_not_the_nodes_vjp_and_a_vjp_in_a_forward_graph():
    g, x = two_node()
    with pytest.raises(VkmlError, match=r"square_vjp is not the vjp of node 'wave''s kernel wave "
                                        r"\(it is marked vjp_of=square\)"):
        vkml.diff.Reverse(g, vjps={"wave": square_vjp})
    with pytest.raises(VkmlError, match=r"wrong_wave_vjp is not the vjp of node 'wave''s kernel "
                                        r"wave: its u_bar disagrees"):
        vkml.diff.Reverse(g, vjps={"wave": wrong_wave_vjp})
    with pytest.raises(VkmlError, match=r"wave_vjp is the vjp of wave; a vjp is a kernel of the "
                                        r"reverse, never a step of a forward graph"):
        vkml.Graph().add(wave_vjp.bind(u=x, k=K, y_bar=x, u_bar=np.zeros(N), k_bar=np.zeros(N)))
    still_live_and_right(g, x)
    g.launch()
    grads = vkml.diff.Reverse(g, vjps={"wave": wave_vjp, "square": square_vjp})(
        g.record, {"wave.y": np.ones(N)})
    np.testing.assert_allclose(grads["x"], expected(x)[0], rtol=1e-12)


def test_reverse_of_a_graph_that_does_not_record_or_with_unknown_wrt():
    x = np.linspace(0.1, 0.9, N)
    u, y = np.zeros(N), np.zeros(N)
    g = vkml.Graph().add(square.bind(x=x, u=u), name="square").add(wave.bind(u=u, k=K, y=y))
    with pytest.raises(VkmlError, match=r"build the graph first"):
        vkml.diff.Reverse(g)
    g.build()
    with pytest.raises(VkmlError, match=r"built without record=True; build it with build\(record=True\)"):
        vkml.diff.Reverse(g)
    g2, x2 = two_node()
    with pytest.raises(VkmlError, match=r"wrt names \['q'\] are not inputs or Params"):
        vkml.diff.reverse(g2.record, {"wave.y": np.ones(N)}, wrt=["q"])
    only_k = vkml.diff.reverse(g2.record, {"wave.y": np.ones(N)}, wrt="k")
    assert set(only_k) == {"k", "wave.k"}
    np.testing.assert_allclose(only_k["k"], expected(x2)[1], rtol=1e-12)


@vkml.kernel
def look(i, x, table: vkml.Param):
    return {"y": table[i] * x}


def test_a_table_read_by_index_is_not_bitwise_and_strict_refuses_it():
    n = 300
    i = (np.arange(n) * 7 % 5).astype(np.int64)
    x = np.linspace(0.1, 0.9, n)
    y = np.zeros(n)
    table = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    g = vkml.Graph().add(look.bind(i=i, x=x, table=table, y=y), name="look").build(record=True)
    g.launch()
    np.testing.assert_allclose(y, table[i] * x, rtol=1e-15)
    seed = np.linspace(1, 2, n)
    with pytest.raises(VkmlError, match=r"strict=True.*\['look\.table'\] are scatter-adds across "
                                        r"samples.*pass strict=False, or leave them out by naming only the other inputs in wrt"):
        vkml.diff.reverse(g.record, {"y": seed}, strict=True)
    assert g.record.live
    only_x = vkml.diff.reverse(g.record, {"y": seed}, strict=True, wrt=["x"])   # no table: allowed
    np.testing.assert_allclose(only_x["x"], seed * table[i], rtol=1e-15)
    grads = vkml.diff.reverse(g.record, {"y": seed})
    assert grads.report.bitwise["table"] is False and grads.report.bitwise["x"] is True
    np.testing.assert_allclose(grads["table"], [np.sum((seed * x)[i == j]) for j in range(5)],
                               rtol=1e-13)


# -- recorded simulations ----------------------------------------------------------------------------

@vkml.kernel
def drift(x, v, corr, k: vkml.Param):
    v2 = v + 0.05 * (corr - k * x)
    return {"x": x + 0.05 * v2, "v": v2}


@vkml.kernel
def kick(x, v):
    return {"v": v - 0.01 * x}


@vkml.kernel
def lookup_step(x, i, table: vkml.Param):
    return {"x": x + 0.01 * table[i]}


def _planes(n=N):
    return np.linspace(-0.5, 0.5, n), np.zeros(n), np.zeros(n)


def test_recorded_step_refusals_name_the_node_and_the_fix():
    x, v, corr = _planes()
    model = vkml.graph.opaque(lambda r: {"corr": -r["x"] ** 3}, reads={"x": x, "v": v},
                              writes={"corr": corr}, name="model")
    with pytest.raises(VkmlError, match=r"a record=True run of a step made of 2 kernels \['drift', "
                                        r"'kick'\].*record one kernel per step"):
        vkml.until_done([drift, kick], max_steps=10, record=True, x=x, v=v, corr=corr, k=1.0)
    with pytest.raises(VkmlError, match=r"several steps per launch.*steps_per_launch=1"):
        vkml.simulation(drift, max_steps=10, record=True, steps_per_launch=4, x=x, v=v, corr=corr,
                        k=1.0)
    with pytest.raises(VkmlError, match=r"node 'model' comes after the kernel.*put the node first"):
        vkml.until_done([drift, model], max_steps=10, record=True, x=x, v=v, corr=corr, k=1.0)
    extra = np.zeros(N)
    second = vkml.graph.opaque(lambda r: {"v": r["corr"]}, reads={"corr": corr}, writes={"v": extra},
                               name="second")
    with pytest.raises(VkmlError, match=r"node 'second' reads a plane another node writes"):
        vkml.until_done([model, second, drift], max_steps=10, record=True, x=x, v=v, corr=corr, k=1.0)
    by_name = vkml.graph.opaque(lambda r: {"corr": r["k"] * r["x"]}, reads={"x": x, "k": x},
                                writes={"corr": corr}, name="by_name")
    with pytest.raises(VkmlError, match=r"node 'by_name' reads a Param; a recorded node reads planes "
                                        r"only"):
        vkml.until_done([by_name, drift], max_steps=10, record=True, x=x, v=v, corr=corr, k=1.0)
    with pytest.raises(VkmlError, match=r"events= \(event refinement\) is not supported"):
        vkml.simulation(drift, max_steps=10, record=True, events="refine", x=x, v=v, corr=corr, k=1.0)
    with pytest.raises(VkmlError, match=r"window= and memory_budget= apply to a recorded run; pass "
                                        r"record=True"):
        vkml.simulation(drift, max_steps=10, window=4, x=x, v=v, corr=corr, k=1.0)
    with pytest.raises(VkmlError, match=r"window= and memory_budget= apply to a recorded run"):
        vkml.simulation(drift, max_steps=10, memory_budget=10**6, x=x, v=v, corr=corr, k=1.0)
    # nothing ran and nothing was bound: the planes are as they were
    assert np.array_equal(x, np.linspace(-0.5, 0.5, N)) and not v.any() and not corr.any()


def _recorded_until_done(n=N):
    x, v, corr = _planes(n)
    x0 = x.copy()
    model = vkml.graph.opaque(lambda r: {"corr": -r["x"] ** 3}, reads={"x": x, "v": v},
                              writes={"corr": corr}, name="model")
    runner = vkml.until_done([model, drift], max_steps=30, record=True, window=5, x=x, v=v,
                             corr=corr, k=1.0)
    runner.run()
    return runner, model, x0


def _model_vjp(primals, cts):
    return {"x": -3 * primals["x"] ** 2 * cts["corr"]}


def test_simulation_reverse_refusals_and_mistakes_change_nothing():
    runner, model, x0 = _recorded_until_done()
    rec = runner.record
    with pytest.raises(VkmlError, match=r"node 'model' is an opaque node; vkml cannot know its "
                                        r"derivative -- pass vjps=\{'model': fn\}"):
        vkml.diff.reverse(rec, {"x": np.ones(N)})
    with pytest.raises(VkmlError, match=r"the vjp of node 'model' is a Node; pass a function"):
        vkml.diff.reverse(rec, {"x": np.ones(N)}, vjps={"model": model})
    first = vkml.diff.reverse(rec, {"x": np.ones(N)}, vjps={"model": _model_vjp})
    # the two mistakes
    with pytest.raises(VkmlError, match=r"seed 'k': that is an input of the simulation, not part of "
                                        r"its final state; its gradient is grads\['k'\]"):
        vkml.diff.reverse(rec, {"k": np.ones(N)}, vjps={"model": _model_vjp})
    with pytest.raises(VkmlError, match=r"seed 'x' has shape \(31,\), but plane 'x' holds one value "
                                        r"per sample, \(32,\); pass one seed per sample"):
        vkml.diff.reverse(rec, {"x": np.ones(N - 1)}, vjps={"model": _model_vjp})
    with pytest.raises(VkmlError, match=r"seed 'corr': node 'model' writes that plane on every step; "
                                        r"only the final state \['x', 'v'\] can be seeded"):
        vkml.diff.reverse(rec, {"corr": np.ones(N)}, vjps={"model": _model_vjp})
    again = vkml.diff.reverse(rec, {"x": np.ones(N)}, vjps={"model": _model_vjp})
    assert np.array_equal(again["x"], first["x"]) and again["k"] == first["k"]
    # and the gradient itself, against central differences of the forward run
    h = 1e-6

    def final(xv):
        x, v, corr = xv.copy(), np.zeros(N), np.zeros(N)
        node = vkml.graph.opaque(lambda r: {"corr": -r["x"] ** 3}, reads={"x": x, "v": v},
                                 writes={"corr": corr}, name="model")
        vkml.until_done([node, drift], max_steps=30, x=x, v=v, corr=corr, k=1.0).run()
        return x
    np.testing.assert_allclose(first["x"], (final(x0 + h) - final(x0 - h)) / (2 * h), rtol=1e-6)


def test_simulation_table_gradient_is_not_bitwise_and_strict_refuses_it():
    n = 256
    x = np.zeros(n)
    i = (np.arange(n) % 3).astype(np.int64)
    sim = vkml.simulation(lookup_step, max_steps=5, record=True, x=x, i=i,
                          table=np.array([1.0, 2.0, 3.0]))
    sim.run()
    with pytest.raises(VkmlError, match=r"strict=True.*\['table'\] in lookup_step are scatter-adds "
                                        r"across samples"):
        vkml.diff.reverse(sim.record, {"x": np.ones(n)}, strict=True)
    grads = vkml.diff.reverse(sim.record, {"x": np.ones(n)})
    assert grads.report.bitwise["table"] is False and grads.report.bitwise["x"] is True
    np.testing.assert_allclose(grads["table"], [5 * 0.01 * np.sum(i == j) for j in range(3)],
                               rtol=1e-13)


def test_memory_budget_refusals_say_the_bytes_and_the_fix():
    n = 1000
    x, v, corr = _planes(n)
    probe = vkml.simulation(drift, max_steps=100, record=True, window=10, x=x, v=v, corr=corr, k=1.0)
    psb = probe.per_sample_bytes
    assert psb == (10 + 10) * (8 + 8)                     # ceil(100/10) + 10 states of x and v
    with pytest.raises(vkml.BudgetError, match=rf"one sample needs {psb:,} bytes but memory_budget is "
                                               rf"{psb - 1:,} bytes; raise memory_budget, lower "
                                               r"max_steps, or set window"):
        vkml.simulation(drift, max_steps=100, record=True, window=10, memory_budget=psb - 1, x=x, v=v,
                        corr=corr, k=1.0)
    with pytest.raises(vkml.BudgetError, match=rf"a pass needs at least 256 samples "
                                               rf"\({256 * psb:,} bytes\) to keep parameter gradients "
                                               rf"bitwise, but memory_budget is {255 * psb:,} bytes; "
                                               r"raise memory_budget"):
        vkml.simulation(drift, max_steps=100, record=True, window=10, memory_budget=255 * psb, x=x,
                        v=v, corr=corr, k=1.0)
    ok = vkml.simulation(drift, max_steps=100, record=True, window=10, memory_budget=256 * psb, x=x,
                         v=v, corr=corr, k=1.0)
    assert ok.pass_size == 256
    assert np.array_equal(x, np.linspace(-0.5, 0.5, n)) and not v.any()


@pytest.mark.parametrize("value, says", [
    (1, "'z' is bound to a int, but it is not an input or a Param"),
    ([1.0, 2.0], "'z' is bound to a list, but it is not an input or a Param"),
    (np.zeros(3), "['z'] are neither inputs, Params nor outputs of the kernel"),
])
def test_binding_a_name_the_kernel_does_not_have_says_which_names_it_has(value, says):
    x, u = np.ones(3), np.zeros(3)
    with pytest.raises(vkml.ArgumentError) as err:
        square.bind(x=x, u=u, z=value)
    assert says in str(err.value) and "inputs ['x']" in str(err.value)
    assert np.array_equal(u, np.zeros(3))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("change", ["one element", "a swap", "the last bit", "an intermediate"])
def test_a_reverse_of_planes_written_after_the_launch_is_refused_by_name(backend, change):
    with vkml.use_backend(backend):
        _written_after_the_launch(change)


def _written_after_the_launch(change):
    x, u, y = np.linspace(0.1, 0.9, N), np.zeros(N), np.zeros(N)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=1.5, y=y), name="wave").build(record=True))
    g.launch()
    rec = g.record
    before = {"x": x.copy(), "u": u.copy()}
    if change == "one element":
        x[N // 2] += 1.0
    elif change == "a swap":
        x[[3, 4]] = x[[4, 3]]
    elif change == "the last bit":
        x[-1] = np.nextafter(x[-1], 2.0)
    else:
        u[0] = 7.0                                    # written by square, read by wave's vjp
    name = "u" if change == "an intermediate" else "x"
    with pytest.raises(vkml.RecordError, match=rf"reverse: plane '{name}' was written after launch 1 "
                                               r"recorded it; launch again"):
        vkml.diff.reverse(rec, {"wave.y": np.ones(N)})
    assert rec.live                                   # refused before anything was read
    with pytest.raises(vkml.RecordError, match=rf"keep: plane '{name}' was written"):
        rec.keep()
    y[:] = 0.0                       # (an output the reverse does not read may change freely)
    x[:], u[:] = before["x"], before["u"]             # the launch's values again: it reverses
    grads = vkml.diff.reverse(rec, {"wave.y": np.ones(N)})
    np.testing.assert_allclose(grads["x"], 2 * x * 1.5 * np.cos(1.5 * x * x), rtol=1e-12)


def test_a_kept_record_reverses_whatever_the_planes_hold_later():
    x, u, y = np.linspace(0.1, 0.9, N), np.zeros(N), np.zeros(N)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=1.5, y=y), name="wave").build(record=True))
    g.launch()
    rec = g.record.keep()
    x0 = x.copy()
    x[:] = 0.0
    grads = vkml.diff.reverse(rec, {"wave.y": np.ones(N)})
    np.testing.assert_allclose(grads["x"], 2 * x0 * 1.5 * np.cos(1.5 * x0 * x0), rtol=1e-12)
