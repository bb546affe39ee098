"""A layer's forward as one replayed call, and the backward's one-pass look at the tape.

``nn.Linear`` and ``nn.cross_entropy`` (over known labels) record the equations of their whole
forward once and replay them, and a backward whose graph is the whole tape finds its key in one
pass.  Each must be invisible: the same equations, the same bits, the same gradients as the
operations written out one by one.  Counts, never times.
"""

import gc

import numpy as np
import pytest

import vkml
from vkml import nn, optim, runtime
from vkml.ir import collect_keyed
from vkml.ops import recipes


def _structure(t):
    """The structural key of the whole graph behind ``t`` (what its programs are cached by)."""
    return collect_keyed([t.ir_var], is_leaf=lambda v: False)[2]


def _op_by_op(x, layer, labels):
    """``layer`` then the loss, written out one operation at a time."""
    y = vkml.matmul(x, vkml.transpose(layer.weight))
    if layer.bias is not None:
        y = y + layer.bias
    coords = vkml.tensor(np.stack([np.arange(len(labels)), labels], axis=1))
    return -vkml.mean(vkml.gather(vkml.log_softmax(y, -1), coords))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_layer_and_its_loss_bind_the_equations_of_their_operations(bias, dtype):
    rng = np.random.default_rng(3)
    x = vkml.tensor(rng.standard_normal((6, 5)).astype(dtype))
    labels = rng.integers(0, 4, 6)
    layer = nn.Linear(5, 4, bias=bias, rng=1, dtype=dtype)
    for _ in range(3):                          # run, recorded, replayed: the same each time
        fused = nn.cross_entropy(layer(x), labels)
        written = _op_by_op(x, layer, labels)
        assert _structure(fused) == _structure(written)
        assert fused.requires_grad and written.requires_grad
        for p in layer.parameters():
            p.zero_grad()
        fused.backward()
        want = [p.grad.numpy().tobytes() for p in layer.parameters()]
        for p in layer.parameters():
            p.zero_grad()
        written.backward()
        assert [p.grad.numpy().tobytes() for p in layer.parameters()] == want
        assert fused.numpy().tobytes() == written.numpy().tobytes()


def test_a_warm_mlp_forward_replays_one_call_per_layer_and_one_for_the_loss():
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    x = vkml.tensor(np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32))
    y = vkml.tensor(np.arange(8) % 3)
    for _ in range(4):
        opt.zero_grad()
        before = recipes.info()["replayed"]
        loss = nn.cross_entropy(model(x), y)
        replayed = recipes.info()["replayed"] - before
        loss.backward()
        opt.step()
    assert replayed == 4                # Linear, ReLU, Linear, the loss: not 11 operations


def test_a_layer_in_no_grad_makes_no_gradient():
    layer = nn.Linear(3, 2, rng=0)
    x = vkml.ones((4, 3))
    for _ in range(3):
        with vkml.no_grad():
            out = layer(x)
        assert not out.requires_grad
        assert layer(x).requires_grad


def test_a_layers_shape_error_still_names_the_layer():
    layer = nn.Linear(3, 2, rng=0)
    with pytest.raises(vkml.ShapeError, match=r"Linear\(3, 2\)"):
        layer(vkml.ones((4, 5)))


# -- the tape in one pass --------------------------------------------------------------------

def _both_ways(root, monkeypatch):
    """``tape_graph(root)`` as found, and as the walk back from the root finds it."""
    records = list(recipes._TAPE.records)
    found = recipes.tape_graph(root)
    with monkeypatch.context() as m:
        m.setattr(recipes, "_whole_tape", lambda records: None)
        recipes._TAPE.records = records
        walked = recipes.tape_graph(root)
    return found, walked


def _same(found, walked):
    assert found is not None and walked is not None
    assert found[0] == walked[0]
    assert len(found[1]) == len(walked[1]) and all(a is b for a, b in zip(found[1], walked[1]))


def test_a_step_shaped_tape_gives_the_key_and_leaves_of_the_walk(monkeypatch):
    w = vkml.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    b = vkml.tensor(np.ones(2), requires_grad=True)
    x = vkml.tensor(np.linspace(-1, 1, 12).reshape(4, 3))

    def loss():
        h = vkml.tanh(x @ w.T + b)
        return vkml.sum(h * h + h)              # one result read twice, an operand twice

    loss(), loss()                              # run, then recorded: replayed from now on
    for _ in range(3):
        recipes.reset_tape()
        root = loss()
        assert recipes._whole_tape(recipes._TAPE.records) is not None
        _same(*_both_ways(root.ir_var, monkeypatch))
        recipes.reset_tape()


def test_a_tape_with_a_replay_the_root_does_not_read_is_walked_and_right(monkeypatch):
    # (a clean start: replays an earlier test left on the tape, and a recipe cache an earlier
    # test filled -- then cos(w) * 2.0 would never become a replay, and the tape would be whole)
    vkml.clear_caches()
    recipes.reset_tape()
    w = vkml.tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    for _ in range(4):
        w.zero_grad()
        a = vkml.sin(w)
        unread = vkml.cos(w) * 2.0              # on the tape, but no part of the loss
        root = vkml.sum(a * w)
        assert recipes._whole_tape(recipes._TAPE.records) is None
        found, walked = _both_ways(root.ir_var, monkeypatch)
        if found is not None:                   # once the ops are recorded
            _same(found, walked)
        root.backward()
        del unread
        gc.collect()              # (a replay in a reference cycle leaves the tape only when collected)
    x = np.array([1.0, -2.0, 3.0])
    np.testing.assert_allclose(w.grad.numpy(), np.cos(x) * x + np.sin(x), rtol=1e-15)


def test_a_plans_backward_programs_go_with_the_caches():
    model = nn.Sequential(nn.Linear(5, 4, rng=0), nn.ReLU(), nn.Linear(4, 3, rng=1))
    x = vkml.tensor(np.random.default_rng(1).standard_normal((8, 5)).astype(np.float32))
    y = np.arange(8) % 3

    def step():
        for p in model.parameters():
            p.zero_grad()
        stats = vkml.stats()
        nn.cross_entropy(model(x), y).backward()
        return (vkml.stats() - stats).derivations, [p.grad.numpy().tobytes() for p in
                                                    model.parameters()]

    for _ in range(4):
        derived, want = step()
    assert derived == 0
    before = dict(runtime.TAPE_COUNTS)
    step()
    assert runtime.TAPE_COUNTS["from tape"] == before["from tape"] + 1
    vkml.clear_caches()
    derived, grads = step()
    assert derived == 1 and grads == want       # derived again, not kept past clear_caches
