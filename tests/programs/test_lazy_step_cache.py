"""The lazy training step's host work: graphs freed as soon as their last tensor goes, the
optimiser's update through the jitted fast path, and the user's line found once per module.

Each of these must be invisible: the same values to the bit, the same gradients (checked against
autograd and finite differences), the same error lines.  Counts, never times.
"""

import gc
import inspect
import os
import weakref

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
from vkml import nn, optim
from vkml.ir import collect, current_serial
from vkml.programs import jit
from test_nn_optim import _loss_oracle

HERE = os.path.basename(__file__)


@pytest.fixture
def no_collector():
    """The cycle collector off for the test: what is freed is freed by reference counting."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


def small_mlp(seed=0, dtype=np.float32):
    nn.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 4, dtype=dtype), nn.ReLU(), nn.Linear(4, 3, dtype=dtype))
    rng = np.random.default_rng(seed)
    x = vkml.tensor(rng.standard_normal((8, 5)).astype(dtype))
    y = np.arange(8) % 3
    return model, x, y


def inner_vars(t):
    """Weak references to every Var with an equation behind ``t`` (the graph a backward walks)."""
    _, eqns = collect([t.ir_var], is_leaf=lambda v: False)
    return [weakref.ref(o) for e in eqns for o in e.outputs]


# -- graphs are freed by reference counting ---------------------------------------------------------

def test_a_dropped_loss_frees_its_whole_graph_without_the_cycle_collector(no_collector):
    model, x, y = small_mlp()
    for _ in range(3):      # the first graphs may be held by what was derived from them
        loss = nn.cross_entropy(model(x), y)
        loss.backward()
        refs = inner_vars(loss)
        assert len(refs) > 8 and all(r() is not None for r in refs)
        del loss
    assert [r() for r in refs] == [None] * len(refs)


def test_repeated_steps_leave_no_garbage_for_the_collector(no_collector):
    model, x, y = small_mlp()
    opt = optim.Adam(model.parameters(), lr=1e-2)

    def step():
        opt.zero_grad()
        loss = nn.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    before = len(gc.get_objects())
    for _ in range(20):
        step()
    # a graph left to the collector would leave tens of objects per step
    assert len(gc.get_objects()) - before < 20


def test_a_tensor_still_held_keeps_the_graph_behind_it(no_collector):
    model, x, y = small_mlp()
    hidden = model[1](model[0](x))
    loss = nn.cross_entropy(model[2](hidden), y)
    refs = inner_vars(hidden)
    del loss
    assert all(r() is not None for r in refs)
    assert hidden.ir_var.eqn is not None
    w, b = model[0].weight.numpy(), model[0].bias.numpy()
    np.testing.assert_allclose(hidden.numpy(), np.maximum(x.numpy() @ w.T + b, 0), rtol=1e-6)


def test_a_kept_loss_can_go_backward_twice_after_its_pieces_are_dropped(no_collector):
    w = vkml.tensor(np.array([1.5, -2.0]), requires_grad=True)
    loss = vkml.sum(vkml.exp(w * w) * 0.5)     # the intermediate tensors are dropped at once
    loss.backward()
    first = w.grad.numpy().copy()
    loss.backward()                             # gradients accumulate: the graph is still there
    want = np.exp(w.numpy() ** 2) * w.numpy()
    np.testing.assert_allclose(first, want, rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), 2 * want, rtol=1e-12)


def test_a_tensor_used_twice_is_freed_and_differentiated_right(no_collector):
    x = vkml.tensor(np.array([0.3, -1.2, 2.0]), requires_grad=True)
    for _ in range(3):      # the first graphs may be held by what was derived from them
        x.zero_grad()
        y = x * x
        loss = vkml.sum(y * y + y)             # y read twice, x read twice
        loss.backward()
        refs = inner_vars(loss)
        np.testing.assert_allclose(x.grad.numpy(), 4 * x.numpy() ** 3 + 2 * x.numpy(), rtol=1e-12)
        del loss
    assert sum(r() is not None for r in refs) == 1    # y: the user still holds it
    del y
    assert [r() for r in refs] == [None] * len(refs)


def test_a_var_held_outside_a_tensor_keeps_its_equation(no_collector):
    x = vkml.tensor(np.arange(3.0))
    t = vkml.exp(x) + 1
    inner = t.ir_var.eqn.inputs[0]             # exp(x), held here, not by a tensor
    del t
    assert inner.eqn is not None and inner.eqn.prim.name == "exp"
    np.testing.assert_allclose(vkml.Tensor(inner).numpy(), np.exp(np.arange(3.0)), rtol=1e-15)


def test_gradients_of_a_small_mlp_match_autograd_and_finite_differences_step_after_step():
    model, x, y = small_mlp(dtype=np.float64)
    oracle = _loss_oracle(x.numpy(), y)

    opt = optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):                          # graphs of earlier steps freed in between
        params = [np.array(p.numpy()) for p in model.parameters()]
        opt.zero_grad()
        loss = nn.cross_entropy(model(x), y)
        loss.backward()
        want = autograd.grad(lambda ps: oracle(*ps))(params)
        for p, g in zip(model.parameters(), want):
            np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-10, atol=1e-13)
        # one central difference per parameter, in the direction of its gradient
        eps = 1e-6
        for k, g in enumerate(want):
            d = g / np.linalg.norm(g)
            plus = [q + eps * d if j == k else q for j, q in enumerate(params)]
            minus = [q - eps * d if j == k else q for j, q in enumerate(params)]
            fd = (oracle(*plus) - oracle(*minus)) / (2 * eps)
            np.testing.assert_allclose(np.sum(model.parameters()[k].grad.numpy() * d), fd,
                                       rtol=1e-6)
        opt.step()


# -- the optimiser's update: the jitted math's bits, few objects ------------------------------------

def reference_step(opt, math):
    """``opt.step()`` as the update was written before: ``jit(cls._math)`` on pytrees of tensors
    (its general path) and one ``vkml.assign``."""
    active = [i for i, p in enumerate(opt.params) if p.grad is not None]
    order, dsts, states, hyper = opt._host(active)
    params = [opt.params[i] for i in order]
    with vkml.no_grad():
        srcs = math([p.detach() for p in params], [p.grad for p in params], states, hyper)
    vkml.assign(dsts, srcs)
    opt._stepped(active)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("make_opt", [
    lambda ps: optim.Adam(ps, lr=1e-2, weight_decay=0.01),
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda ps: optim.SGD(ps, lr=0.1),
], ids=["adam-decay", "sgd-momentum-decay", "sgd"])
def test_the_update_gives_the_bits_of_the_jitted_math_and_assign(make_opt, backend, monkeypatch,
                                                                 tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        (model, x, y), (ref_model, _, _) = small_mlp(), small_mlp()
        opt, ref_opt = make_opt(model.parameters()), make_opt(ref_model.parameters())
        math = jit(lambda *a: type(ref_opt)._math(*a))
        for k in range(4):
            for m, o in ((model, opt), (ref_model, ref_opt)):
                o.zero_grad()
                # every other step the first layer is left out: a step of a subset of the
                # parameters (Adam: two groups of step counts after that)
                out = m(x) if k % 2 == 0 else m[2](m[1](m[0](x).detach()))
                nn.cross_entropy(out, y).backward()
            opt.step()
            reference_step(ref_opt, math)
            for p, q in zip(model.parameters(), ref_model.parameters()):
                assert p.numpy().tobytes() == q.numpy().tobytes()
            for state in ("exp_avg", "exp_avg_sq", "momentum_buffers"):
                for s, t in zip(getattr(opt, state, []), getattr(ref_opt, state, [])):
                    assert (s is None) == (t is None)
                    if s is not None:
                        assert s.numpy().tobytes() == t.numpy().tobytes()


def test_a_warm_update_makes_a_var_per_new_value_and_per_number_only():
    model, x, y = small_mlp()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        nn.cross_entropy(model(x), y).backward()
        before, hits = current_serial(), optim._update_program(optim.Adam).cache_info()["hits"]
        opt.step()
        made = current_serial() - before
    # 4 parameters: 12 new values (m, v, parameter) and 4 numbers (two bias-correction terms,
    # 1 - beta1, 1 - beta2); the general path made about 50
    assert made <= 12 + 4
    assert optim._update_program(optim.Adam).cache_info()["hits"] - hits == 1
    for p in model.parameters():
        assert p.requires_grad and p.is_leaf and p.ir_var.value is not None


class _ScaledStep(optim.Optimizer):
    """An optimiser whose hyperparameters come as a dict: the update's general flattening."""

    def _host(self, active):
        return active, [self.params[i] for i in active], [], {"lr": self.lr}

    @staticmethod
    def _math(params, grads, states, hyper):
        return [p - hyper["lr"] * g for p, g in zip(params, grads)]


def test_an_optimiser_with_other_containers_takes_the_general_flattening():
    w = vkml.tensor(np.array([1.0, -2.0], dtype=np.float32), requires_grad=True)
    opt = _ScaledStep([w], lr=0.25)
    for _ in range(2):
        start = w.numpy().copy()
        opt.zero_grad()
        vkml.sum(w * w).backward()
        opt.step()
        assert w.numpy().tobytes() == (start - np.float32(0.25) * (2 * start)).tobytes()


def test_a_bad_update_result_is_refused_before_anything_is_written():
    class Broken(_ScaledStep):
        @staticmethod
        def _math(params, grads, states, hyper):
            return [vkml.concatenate([p, p]) for p in params]     # twice as long

    w = vkml.tensor(np.array([1.0, -2.0, 3.0], dtype=np.float32), requires_grad=True)
    v = vkml.tensor(np.array([4.0], dtype=np.float32), requires_grad=True)
    opt = Broken([v, w], lr=0.5)
    vkml.sum(w * v).backward()
    before = [w.numpy().copy(), v.numpy().copy()]
    with pytest.raises(vkml.ShapeError):
        opt.step()
    assert w.numpy().tobytes() == before[0].tobytes() and v.numpy().tobytes() == before[1].tobytes()


# -- the user's line ------------------------------------------------------------------------------

class _Picks(nn.Module):
    """A user's module: its own forward's lines are the ones its operations name."""

    def __init__(self, index):
        super().__init__()
        self.index = index

    def forward(self, x):
        self.line = inspect.currentframe().f_lineno + 1
        return vkml.gather(x, self.index) * 2.0


def test_an_operation_in_a_users_module_inside_sequential_names_the_users_line():
    bad = vkml.argmax(vkml.tensor(np.arange(4.0))) + 3      # 6, known only when it runs
    picks = _Picks(vkml.reshape(bad, (1, 1)))
    model = nn.Sequential(nn.Linear(3, 2), picks)
    out = model(vkml.ones((4, 3)))
    with pytest.raises(vkml.ExecutionError) as err:
        out.numpy()
    assert "gather" in str(err.value) and f"{HERE}:{picks.line}" in str(err.value)


def test_an_operation_of_vkmls_own_module_names_the_line_that_called_the_model():
    layer = nn.Linear(3, 2)
    line = inspect.currentframe().f_lineno + 1
    out = layer(vkml.ones((4, 3)))
    assert out.ir_var.eqn.where[0].co_filename == __file__
    assert out.ir_var.eqn.where[1] == line


# -- backward finds a graph made of replayed ops without walking it ---------------------------------

from vkml import runtime  # noqa: E402


def tape_counts():
    return dict(runtime.TAPE_COUNTS)


def test_a_warm_step_finds_its_graph_without_walking_it():
    model, x, y = small_mlp()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(4):
        opt.zero_grad()
        before, stats = tape_counts(), vkml.stats()
        nn.cross_entropy(model(x), y).backward()
        opt.step()
    cost = vkml.stats() - stats
    assert tape_counts()["from tape"] - before["from tape"] == 1
    assert tape_counts()["walked"] == before["walked"]
    assert cost.derivations == 0 and cost.compiles == 0 and cost.submissions == 2


def _grads(params):
    return [None if p.grad is None else p.grad.numpy().tobytes() for p in params]


def _fresh(build, params):
    """The gradients of ``build()`` with every cache emptied first (so its graph is walked)."""
    vkml.clear_caches()
    for p in params:
        p.zero_grad()
    build().backward()
    return _grads(params)


rng0 = np.random.default_rng(7)
W = [rng0.standard_normal((4, 5)), rng0.standard_normal((4, 5)), rng0.standard_normal(4)]
XS = rng0.standard_normal((6, 5))


def _variants():
    """Pairs of losses whose graphs differ in one thing a too-coarse key could miss."""
    def leaves():
        return [vkml.tensor(w, requires_grad=True) for w in W] + [vkml.tensor(XS)]

    def op(which):
        w1, w2, b, x = ps = leaves()
        f = vkml.tanh if which else vkml.sin
        return ps, lambda: vkml.sum(f(x @ w1.T + b))

    def shape(which):
        w1, w2, b, x = ps = leaves()
        rows = vkml.tensor(XS[:4]) if which else x
        return ps, lambda: vkml.sum(vkml.tanh(rows @ w1.T + b))

    def dtype(which):
        w1, w2, b, x = ps = leaves()
        if which:
            ps = [vkml.tensor(np.float32(w), requires_grad=True) for w in W] + \
                [vkml.tensor(np.float32(XS))]
            w1, w2, b, x = ps
        return ps, lambda: vkml.sum(vkml.tanh(x @ w1.T + b))

    def used_twice(which):
        w1, w2, b, x = ps = leaves()

        def loss():
            h = vkml.tanh(x @ w1.T + b)
            g = h if which else vkml.tanh(x @ w2.T + b)   # one node twice, or two of one shape
            return vkml.sum(h * g)
        return ps, loss

    def other_leaf(which):
        w1, w2, b, x = ps = leaves()
        return ps, lambda: vkml.sum(vkml.tanh(x @ (w2 if which else w1).T + b))

    def frozen(which):
        w1, w2, b, x = ps = leaves()
        if which:
            w1.requires_grad_(False)
        return ps, lambda: vkml.sum(vkml.tanh(x @ w1.T + b) * vkml.tanh(x @ w2.T))

    def wiring(which):
        w1, w2, b, x = ps = leaves()

        def loss():
            s, c = vkml.sin(w1), vkml.cos(w1)       # the same ops in the same order ...
            return vkml.sum((c - s if which else s - c) * w2)   # ... wired the other way
        return ps, loss

    return {"op": op, "shape": shape, "dtype": dtype, "used twice": used_twice,
            "other leaf": other_leaf, "frozen": frozen, "wiring": wiring}


@pytest.mark.parametrize("variant", sorted(_variants()))
def test_graphs_that_differ_in_one_thing_never_share_a_backward(variant):
    make = _variants()[variant]
    sides = [make(0), make(1)]
    want = [_fresh(build, ps) for ps, build in sides]
    assert want[0] != want[1]
    before = tape_counts()
    for k in range(10):                     # both warm, then alternating: each finds its own
        ps, build = sides[k % 2]
        for p in ps:
            p.zero_grad()
        build().backward()
        assert _grads(ps) == want[k % 2], (variant, k)
    assert tape_counts()["from tape"] - before["from tape"] >= 4


def test_the_frozen_parameter_gets_no_gradient_and_the_others_autograds():
    ps, build = _variants()["frozen"](1)
    w1, w2, b, x = ps
    for _ in range(3):
        w2.zero_grad()
        build().backward()
    assert w1.grad is None
    want = autograd.grad(lambda v: anp.sum(anp.tanh(XS @ W[0].T + v[1]) * anp.tanh(XS @ v[0].T)))(
        [W[1], W[2]])
    np.testing.assert_allclose(w2.grad.numpy(), want[0], rtol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), want[1] * 3, rtol=1e-12)   # never zeroed: 3 steps


def test_a_graph_with_an_op_bound_afresh_is_walked():
    w = vkml.tensor(np.arange(5.0), requires_grad=True)
    for _ in range(3):
        w.zero_grad()
        idx = vkml.tensor(np.array([4, 0, 4]))
        before = tape_counts()
        vkml.sum(vkml.take(w * w, idx)).backward()      # take reads its index: never replayed
        assert tape_counts()["walked"] == before["walked"] + 1
    np.testing.assert_array_equal(w.grad.numpy(), [0.0, 0.0, 0.0, 0.0, 16.0])


def test_a_second_backward_of_one_loss_and_a_loss_made_in_another_thread_are_walked():
    import threading
    model, x, y = small_mlp()
    for _ in range(3):
        nn.cross_entropy(model(x), y).backward()
    loss = nn.cross_entropy(model(x), y)
    for p in model.parameters():
        p.zero_grad()
    loss.backward()
    once = _grads(model.parameters())
    before = tape_counts()
    loss.backward()                                     # the tape was used up by the first
    assert tape_counts()["walked"] == before["walked"] + 1
    twice = [p.grad.numpy() for p in model.parameters()]
    for g, g1 in zip(twice, once):
        np.testing.assert_array_equal(g, 2 * np.frombuffer(g1, np.float32).reshape(g.shape))
    made = []
    thread = threading.Thread(target=lambda: made.append(nn.cross_entropy(model(x), y)))
    thread.start()
    thread.join()
    for p in model.parameters():
        p.zero_grad()
    before = tape_counts()
    made[0].backward()
    assert tape_counts()["walked"] == before["walked"] + 1
    assert _grads(model.parameters()) == once


def test_graphs_built_and_never_observed_leave_the_tape_bounded():
    from vkml.ops import recipes
    w = vkml.tensor(np.ones(3), requires_grad=True)
    for _ in range(recipes.TAPE_LIMIT + 50):
        w * 2.0
    assert len(recipes._TAPE.records) <= recipes.TAPE_LIMIT
    (w * 2.0).sum().backward()                          # still right (walked)
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0, 2.0])
    assert recipes._TAPE.records == []
