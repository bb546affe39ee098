"""The lazy path's host work: tensor operations replayed from recorded equations (``vkml.ops.recipes``),
and a training step that, once warm, records, traces, derives and compiles nothing.

Replaying must be invisible: the same equations, the same values to the bit, the same errors and
the same source lines as binding afresh.  Counts, never times.
"""

import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vkml
from vkml import nn, optim
from vkml.ir import collect_keyed
from vkml.ops import recipes


def graph_key(t):
    """The structural key of the graph behind ``t`` (what its programs are cached by)."""
    return collect_keyed([t.ir_var], is_leaf=lambda v: False)[2]


def mlp_loss(x, y, w1, b1, w2, b2):
    h = vkml.relu(x @ vkml.transpose(w1) + b1)
    return nn.cross_entropy(h @ w2.T + b2, y)


@pytest.fixture
def mlp(rng):
    x = rng.standard_normal((8, 5)).astype(np.float32)
    y = np.arange(8) % 3
    params = [vkml.tensor(rng.standard_normal(s).astype(np.float32) * 0.5, requires_grad=True)
              for s in ((4, 5), (4,), (3, 4), (3,))]
    return vkml.tensor(x), y, params


def test_a_replayed_graph_is_the_graph_bound_afresh(mlp):
    x, y, params = mlp
    recipes.clear()
    fresh = mlp_loss(x, y, *params)
    assert recipes.info()["kept"] == 0                      # a call made once keeps nothing
    mlp_loss(x, y, *params)                                 # the second time: recorded
    assert recipes.info()["kept"] >= 6
    before = recipes.info()
    replayed = mlp_loss(x, y, *params)
    after = recipes.info()
    assert after["recorded"] == before["recorded"]          # nothing recorded the second time
    assert after["replayed"] - before["replayed"] >= 6      # every op came from its recipe
    assert graph_key(replayed) == graph_key(fresh)
    assert replayed.item() == fresh.item()
    x_arr, w1 = x.numpy(), params[0].numpy()
    h = np.maximum(x_arr @ w1.T + params[1].numpy(), 0)      # the oracle: NumPy by hand
    z = h @ params[2].numpy().T + params[3].numpy()
    z = z - z.max(axis=1, keepdims=True)
    want = np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(8), y])
    np.testing.assert_allclose(replayed.item(), want, rtol=1e-5)


def test_the_same_operand_twice_is_not_two_operands(rng):
    a = vkml.tensor(rng.standard_normal(3))
    b = vkml.tensor(rng.standard_normal(3))
    for _ in range(2):                          # recorded the second time, replayed after
        np.testing.assert_array_equal((a * a).numpy(), a.numpy() ** 2)
    np.testing.assert_array_equal((a * b).numpy(), a.numpy() * b.numpy())
    np.testing.assert_array_equal((a * b).numpy(), a.numpy() * b.numpy())
    np.testing.assert_array_equal((b * b).numpy(), b.numpy() ** 2)


def test_numbers_are_part_of_the_key_down_to_the_sign_of_zero():
    x = vkml.tensor(np.array([1.0, -2.0]))
    for _ in range(2):
        assert np.all(np.signbit((x * 0.0).numpy()) == [False, True])
        np.testing.assert_array_equal((x * 2.0).numpy(), [2.0, -4.0])
    assert np.all(np.signbit((x * -0.0).numpy()) == [True, False])
    np.testing.assert_array_equal((x * 3.0).numpy(), [3.0, -6.0])
    i = vkml.tensor(np.array([1, 2], dtype=np.int32))
    for _ in range(2):
        assert (i + 1).dtype == np.int32 and (i + 1.5).dtype == np.float64
    np.testing.assert_array_equal((i + True).numpy(), [2, 3])


def test_an_op_that_reads_index_values_is_bound_afresh_every_time():
    x = vkml.tensor(np.array([10.0, 20.0, 30.0]))
    for _ in range(2):
        np.testing.assert_array_equal(vkml.take(x, vkml.tensor([0, 2])).numpy(), [10.0, 30.0])
    np.testing.assert_array_equal(vkml.take(x, vkml.tensor([-1, 1])).numpy(), [30.0, 20.0])


def test_a_failing_op_keeps_failing_with_the_same_error_and_records_nothing(rng):
    a, b = vkml.tensor(np.ones((2, 3))), vkml.tensor(np.ones((4,)))
    before = recipes.info()["recorded"]
    messages = set()
    for _ in range(2):
        with pytest.raises(vkml.ShapeError) as err:
            a + b
        messages.add(str(err.value))
    assert len(messages) == 1 and "cannot be broadcast" in messages.pop()
    assert recipes.info()["recorded"] == before


def test_a_replayed_equation_names_the_line_that_made_it():
    x = vkml.tensor(np.ones(2))
    for _ in range(2):
        x + 1.0                                 # recorded
    first = x + 1.0; line_first = inspect.currentframe().f_lineno      # noqa: E702
    second = x + 1.0; line_second = inspect.currentframe().f_lineno    # noqa: E702
    assert first.ir_var.eqn.where[1] == line_first
    assert second.ir_var.eqn.where[1] == line_second
    assert second.ir_var.eqn.where[0].co_filename == __file__


def test_the_matmul_mode_is_part_of_the_key():
    a, b = vkml.tensor(np.ones((2, 3))), vkml.tensor(np.ones((3, 2)))
    for _ in range(2):
        assert (a @ b).ir_var.eqn.params == {}
    with vkml.deterministic_matmul():
        assert (a @ b).ir_var.eqn.params == {"order": "tree"}
    assert (a @ b).ir_var.eqn.params == {}


def test_eager_mode_still_runs_each_replayed_op_at_once():
    x = vkml.tensor(np.array([1.0, 4.0]))
    for _ in range(2):
        _ = vkml.sqrt(x) + 1.0               # recorded lazily
    with vkml.eager():
        y = vkml.sqrt(x) + 1.0
        assert y.ir_var.value is not None
        np.testing.assert_array_equal(y.numpy(), [2.0, 3.0])


def test_ops_traced_inside_jit_replay_with_placeholders():
    f = vkml.jit(lambda v: vkml.relu(v) * 2.0)
    np.testing.assert_array_equal(f(np.array([-1.0, 3.0])).numpy(), [0.0, 6.0])
    for _ in range(2):
        np.testing.assert_array_equal(vkml.relu(vkml.tensor([-2.0, 5.0])).numpy(), [0.0, 5.0])
    np.testing.assert_array_equal(f(np.array([[2.0], [-3.0]])).numpy(), [[4.0], [0.0]])
    g = vkml.grad(lambda v: vkml.sum(vkml.relu(v) * 2.0))
    np.testing.assert_array_equal(g(np.array([-1.0, 3.0])).numpy(), [0.0, 2.0])


def test_recipes_are_bounded():
    old = vkml.cache_limit()
    vkml.set_cache_limit(8)
    try:
        for n in range(1, 30):
            for _ in range(2):                  # recorded the second time
                vkml.realize(vkml.tensor(np.ones(n)) * 2.0)
            assert 1 <= recipes.info()["kept"] <= 8
    finally:
        vkml.set_cache_limit(old)


def test_clear_caches_forgets_every_recipe():
    """In a fresh process: emptying every backend's cache here would change what later tests in
    this one find."""
    code = ("import numpy as np, vkml; from vkml.ops import recipes; x = vkml.tensor(np.ones(2)); "
            "[vkml.realize(x * 2.0) for _ in range(2)]; assert recipes.info()['kept'] >= 1; "
            "vkml.clear_caches(); assert recipes.info()['kept'] == 0, recipes.info()")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{root / 'kit'}{os.pathsep}{root / 'extensions'}")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_warm_lazy_training_step_records_traces_derives_and_compiles_nothing(mlp):
    x, y, params = mlp
    opt = optim.Adam(params, lr=1e-2)

    def step():
        opt.zero_grad()
        loss = mlp_loss(x, y, *params)
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):
        step()
    before, rec = vkml.stats(), recipes.info()
    for _ in range(5):
        step()
    cost, now = vkml.stats() - before, recipes.info()
    assert (cost.traces, cost.derivations, cost.compiles) == (0, 0, 0)
    assert cost.submissions == 10                     # backward and update: two per step
    assert cost.cache_hits >= 10                      # each found its program cached
    assert now["recorded"] == rec["recorded"]         # every op replayed its recipe
    assert now["replayed"] - rec["replayed"] >= 5 * 8


def test_replayed_steps_give_the_bits_of_steps_bound_afresh(rng):
    x = vkml.tensor(rng.standard_normal((8, 5)).astype(np.float32))
    y = np.arange(8) % 3
    start = [rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((4, 5), (4,), (3, 4), (3,))]

    def train(fresh):
        params = [vkml.tensor(a, requires_grad=True) for a in start]
        opt = optim.Adam(params, lr=1e-2)
        for _ in range(4):
            if fresh:
                recipes.clear()               # every op records again: bound from scratch
            opt.zero_grad()
            mlp_loss(x, y, *params).backward()
            opt.step()
        return [p.numpy() for p in params]

    for a, b in zip(train(fresh=True), train(fresh=False)):
        np.testing.assert_array_equal(a, b)


def test_a_warm_forward_binds_no_primitive_afresh(mlp, monkeypatch):
    """The host work a recipe saves: no shape rule, promotion or broadcasting decision runs again."""
    from vkml.ops import core
    x, y, params = mlp
    for _ in range(2):
        mlp_loss(x, y, *params)                # warm: every op has its recipe
    binds = []
    real = core.bind_at
    monkeypatch.setattr(core, "bind_at", lambda *a: binds.append(a[1].name) or real(*a))
    warm = mlp_loss(x, y, *params)
    assert binds == []
    recipes.clear()
    cold = mlp_loss(x, y, *params)
    leaves, eqns, _ = collect_keyed([cold.ir_var], is_leaf=lambda v: False)
    assert len(binds) == len(eqns)             # afresh: one bind per equation of the graph
    assert graph_key(warm) == graph_key(cold)


def test_basic_indexing_replays_and_a_tensor_index_is_bound_afresh():
    x = vkml.tensor(np.arange(12.0).reshape(3, 4))
    ref = np.arange(12.0).reshape(3, 4)
    for _ in range(2):                          # seen, then recorded
        for index in [(slice(None), 1), (slice(None), 2), 1, -1, (Ellipsis, slice(None, None, 2)),
                      (None, 0), (slice(1, None), slice(None, -1))]:
            np.testing.assert_array_equal(x[index].numpy(), ref[index])
    before = recipes.info()
    np.testing.assert_array_equal(x[:, 2].numpy(), ref[:, 2])     # the same index again
    assert recipes.info()["replayed"] == before["replayed"] + 1
    np.testing.assert_array_equal(x[vkml.tensor([0, 2])].numpy(), ref[[0, 2]])
    np.testing.assert_array_equal(x[vkml.tensor([-1, 0])].numpy(), ref[[-1, 0]])
    np.testing.assert_array_equal(x[[0, 1]].numpy(), ref[[0, 1]])
    np.testing.assert_array_equal(x[[-1, 1]].numpy(), ref[[-1, 1]])
    assert recipes.info()["recorded"] == before["recorded"]


def test_cross_entropy_over_the_same_labels_tensor_makes_their_coordinates_once(rng):
    logits = vkml.tensor(rng.standard_normal((4, 3)))
    labels = vkml.tensor(np.array([0, 2, 1, 2]))
    first = nn.cross_entropy(logits, labels)
    second = nn.cross_entropy(logits, labels)
    coords = [next(e.inputs[1] for e in collect_keyed([t.ir_var], is_leaf=lambda v: False)[1]
                   if e.prim.name == "gather") for t in (first, second)]
    assert coords[0] is coords[1]                       # made once, for that labels tensor
    assert first.item() == second.item()
    with pytest.raises(vkml.ArgumentError, match="label 2 is not a class index"):
        nn.cross_entropy(logits[:, :2], labels)         # fewer classes: checked again
    with pytest.raises(vkml.ShapeError, match="labels must have shape"):
        nn.cross_entropy(logits[:3], labels)            # another batch: checked again
    new_labels = vkml.tensor(np.array([1, 1, 1, 1]))
    want = -np.mean(np.log(np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(1, keepdims=True))[:, 1])
    np.testing.assert_allclose(nn.cross_entropy(logits, new_labels).item(), want, rtol=1e-12)


def test_a_jitted_call_on_lists_of_tensors_and_floats_keeps_its_structure_and_weak_floats():
    """The optimiser's call shape: containers are found by their signature, floats stay weak."""
    f = vkml.jit(lambda ps, hyper: [p * hyper[0] + (0.0 if hyper[1] is None else hyper[1])
                                    for p in ps])
    ps = [vkml.tensor(np.ones(2, np.float32)), vkml.tensor(np.arange(3.0))]
    for scale in (2.0, 3.0):
        out = f(ps, (scale, 0.5))
        assert out[0].dtype == np.float32 and out[1].dtype == np.float64
        np.testing.assert_array_equal(out[1].numpy(), np.arange(3.0) * scale + 0.5)
    assert f.cache_info()["traces"] == 1             # a float is an input, not structure
    f(ps, [2.0, 0.5])                                # a list where a tuple was: another structure
    f(ps, (2.0, None))                               # None is structure too
    assert f.cache_info()["traces"] == 3
