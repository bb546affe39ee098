"""Gradients through conditionals and opaque nodes (skippable steps, loops that stop when they
converge, nodes with a user-given vjp).

skippable and repeat_while reverse from the recorded guard and iteration
count (the guard is never evaluated again); an opaque node reverses with the
user's vjp.  Every gradient is checked against central finite differences of
the forward graph (and the analytic value where it is short).
"""

from __future__ import annotations

import numpy as np
import pytest

import vkml
from vkml.errors import VkmlError
from models import wave

N = 40
H = 1e-6


@vkml.kernel
def scale(x, a: vkml.Param):
    return {"u": a * x * x}


@vkml.kernel
def wobble(x, c: vkml.Param):
    return {"u": vkml.sin(c * x)}


@vkml.kernel
def step(s, k: vkml.Param):
    return {"s": s + 0.3 * vkml.sin(k * s)}


@vkml.kernel
def nudge(s, x, k: vkml.Param):
    return {"s": s * vkml.cos(k * x) + 0.1 * x}


class CountingGuard:
    """True for the first ``trips`` reads; counts every read."""

    def __init__(self, trips):
        self.trips, self.calls = trips, 0

    def __call__(self):
        self.calls += 1
        return self.calls <= self.trips


# -- skippable ---------------------------------------------------------------------------------

def _skip_graph(params):
    """first: u = a x^2; maybe (skippable): u = sin(c x); last: z = sin(k u)."""
    x = params["x"].copy()
    u, z = np.zeros(N), np.zeros(N)
    flag = np.array([params["on"]], dtype="uint32")
    maybe = vkml.skippable(wobble.bind(x=x, c=params["c"], u=u).launch, vkml.SkipGuard.nonzero(flag))
    g = (vkml.Graph()
         .add(scale.bind(x=x, a=params["a"], u=u), name="first")
         .add_node(maybe, name="maybe")
         .add(wave.bind(u=u, k=params["k"], y=z), name="last")
         .build(record=True))
    return g, flag, x, z


def _skip_forward(p):
    g, _, _, z = _skip_graph(p)
    g.launch()
    return z.copy()


def _fd(forward, p, name, weights):
    lo, hi = dict(p), dict(p)
    lo[name] = p[name] - H
    hi[name] = p[name] + H
    d = (forward(hi) - forward(lo)) / (2 * H)
    return d if np.ndim(p[name]) else float(np.sum(weights * d))


def test_skippable_flag_on_and_off_without_rebuild_against_finite_differences():
    x0 = np.linspace(0.1, 0.9, N)
    p = {"x": x0, "a": 0.8, "c": 1.3, "k": 1.5, "on": 1}
    g, flag, x, z = _skip_graph(p)
    rev = vkml.diff.Reverse(g)
    seed = np.linspace(0.5, 1.5, N)
    for on in (1, 0, 1):
        flag[0] = on                                   # no rebuild, no new Reverse
        g.launch()
        grads = rev(g.record, {"last.y": seed})
        q = dict(p, on=on)
        np.testing.assert_allclose(z, _skip_forward(q), rtol=1e-14)
        fd_x = (_skip_forward(dict(q, x=x0 + H)) - _skip_forward(dict(q, x=x0 - H))) / (2 * H)
        np.testing.assert_allclose(grads["x"], seed * fd_x, rtol=1e-6, atol=1e-9)
        for name in ("a", "c", "k"):
            np.testing.assert_allclose(grads[name], _fd(_skip_forward, q, name, seed),
                                       rtol=1e-6, atol=1e-9, err_msg=f"on={on} {name}")
        if on:
            # the member overwrote u: the first node's a does not reach z
            assert grads["a"] == 0.0
            u = np.sin(1.3 * x0)
            np.testing.assert_allclose(grads["c"], np.sum(seed * np.cos(1.5 * u) * 1.5 *
                                                          np.cos(1.3 * x0) * x0), rtol=1e-12)
        else:
            # skipped: the adjoint of u passes through to first; the member's Param gets 0
            assert grads["c"] == 0.0
            u = 0.8 * x0 * x0
            np.testing.assert_allclose(grads["a"], np.sum(seed * np.cos(1.5 * u) * 1.5 * x0 * x0),
                                       rtol=1e-12)
            np.testing.assert_allclose(grads["x"], seed * np.cos(1.5 * u) * 1.5 * 1.6 * x0,
                                       rtol=1e-12)


def test_skippable_guard_is_read_once_per_launch_and_never_by_the_reverse():
    class CountingSkipGuard(vkml.SkipGuard):
        reads = 0

        def __call__(self):
            self.reads += 1
            return super().__call__()
    guard = CountingSkipGuard(np.array([1], dtype="uint32"))
    x = np.linspace(0.1, 0.9, N)
    u, z = np.zeros(N), np.zeros(N)
    g = (vkml.Graph().add(scale.bind(x=x, a=0.8, u=u), name="first")
         .add_node(vkml.skippable(wobble.bind(x=x, c=1.3, u=u), guard), name="maybe")
         .add(wave.bind(u=u, k=1.5, y=z), name="last").build(record=True))
    g.launch()
    assert guard.reads == 1
    guard.cell[0] = 0                   # flipping the guard after the launch changes nothing
    grads = vkml.diff.reverse(g.record, {"last.y": np.ones(N)})
    assert guard.reads == 1 and grads["a"] == 0.0 and grads["c"] != 0.0


# -- repeat_while --------------------------------------------------------------------------------

def _loop_graph(s0, k, trips, max_iters=12):
    s = s0.copy()
    y = np.zeros(N)
    guard = CountingGuard(trips)
    g = (vkml.Graph()
         .add_node(vkml.repeat_while(step.bind(s=s, k=k), guard, max_iters=max_iters), name="loop")
         .add(wave.bind(u=s, k=0.7, y=y), name="out")
         .build(record=True))
    return g, guard, s, y


def _loop_forward(s0, k, trips):
    g, _, _, y = _loop_graph(s0, k, trips)
    g.launch()
    return y.copy()


def _loop_numpy(s0, k, trips):
    s = s0.copy()
    for _ in range(trips):
        s = s + 0.3 * np.sin(k * s)
    return np.sin(0.7 * s)


@pytest.mark.parametrize("trips", [0, 1, 2, 5, 12, 20])
def test_repeat_while_trip_counts_against_finite_differences(trips):
    s0 = np.linspace(-1.0, 1.2, N)
    k = 1.4
    g, guard, s, y = _loop_graph(s0, k, trips)
    g.launch()
    ran = min(trips, 12)                                   # max_iters caps the loop
    assert guard.calls == ran + (1 if trips < 12 else 0)     # the cap stops it unread
    np.testing.assert_allclose(y, _loop_numpy(s0, k, ran), rtol=1e-13)
    calls = guard.calls
    seed = np.linspace(1.0, 2.0, N)
    grads = vkml.diff.reverse(g.record, {"out.y": seed})
    assert guard.calls == calls                            # the reverse never reads the guard
    fd_s = (_loop_forward(s0 + H, k, trips) - _loop_forward(s0 - H, k, trips)) / (2 * H)
    fd_k = np.sum(seed * (_loop_forward(s0, k + H, trips) - _loop_forward(s0, k - H, trips))) / (2 * H)
    np.testing.assert_allclose(grads["s"], seed * fd_s, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(grads["loop.k"], fd_k, rtol=1e-6, atol=1e-9)
    if ran == 0:
        assert grads["loop.k"] == 0.0


def test_repeat_while_same_bits_as_the_chain_written_out():
    """grads["k"] of repeat_while (3 iterations) == grads["k"] of a Graph adding the kernel 3 times
    (the sum over iterations runs oldest first, the order of the written-out chain)."""
    n = 1000
    rng = np.random.default_rng(0)
    s0 = rng.uniform(-2, 2, n)
    seed = rng.uniform(0.5, 1.5, n)
    s = s0.copy()
    loop = vkml.Graph().add_node(vkml.repeat_while(step.bind(s=s, k=1.4), CountingGuard(3),
                                                   max_iters=10), name="loop").build(record=True)
    loop.launch()
    a = vkml.diff.reverse(loop.record, {"s": seed})
    s2 = s0.copy()
    chain = vkml.Graph()
    for i in range(3):
        chain.add(step.bind(s=s2, k=1.4), name=f"step{i}")
    chain.build(record=True).launch()
    b = vkml.diff.reverse(chain.record, {"step2.s": seed})
    assert np.array_equal(s, s2)
    assert a["k"] == b["k"]
    assert np.array_equal(a["s"], b["s"])
    # a sum over iterations newest first would (for these values) give other bits: the check has teeth
    per_it = []
    cur = s0.copy()
    states = []
    for _ in range(3):
        states.append(cur)
        cur = cur + 0.3 * np.sin(1.4 * cur)
    ct = seed.copy()
    for st in reversed(states):                           # per-iteration dk in numpy
        per_it.append(vkml.graph.tree_sum(ct * 0.3 * np.cos(1.4 * st) * st))
        ct = ct * (1 + 0.3 * np.cos(1.4 * st) * 1.4)
    np.testing.assert_allclose(a["k"], per_it[2] + per_it[1] + per_it[0], rtol=1e-13)


def test_repeat_while_with_a_fixed_input_and_checkpoints():
    """An input the member reads but does not update gets its gradient summed over iterations."""
    x0 = np.linspace(0.2, 0.8, N)
    s_init = np.linspace(1.0, 2.0, N)

    def build(xv, k, trips):
        s, x = s_init.copy(), xv.copy()
        g = vkml.Graph().add_node(vkml.repeat_while(nudge.bind(s=s, x=x, k=k), CountingGuard(trips),
                                                    max_iters=30), name="loop").build(record=True)
        return g, s
    for trips in (1, 7, 30):
        g, s = build(x0, 0.9, trips)
        g.launch()
        assert g.record.nbytes > 0                           # checkpoints every few iterations
        grads = vkml.diff.reverse(g.record, {"s": np.ones(N)})

        def fwd(xv, k):
            gg, ss = build(xv, k, trips)
            gg.launch()
            return ss.copy()
        fd_x = (fwd(x0 + H, 0.9) - fwd(x0 - H, 0.9)) / (2 * H)
        fd_k = np.sum(fwd(x0, 0.9 + H) - fwd(x0, 0.9 - H)) / (2 * H)
        np.testing.assert_allclose(grads["x"], fd_x, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(grads["k"], fd_k, rtol=1e-6)


# -- opaque nodes ------------------------------------------------------------------------------

def test_opaque_node_in_a_graph_with_a_user_vjp_against_finite_differences():
    weights = {"w": 0.6, "grad": 0.0}

    def model(reads):
        return {"corr": weights["w"] * np.tanh(reads["x"]) * reads["v"]}

    def model_vjp(primals, cts):
        x, v, c = primals["x"], primals["v"], cts["corr"]
        weights["grad"] += float(np.sum(np.tanh(x) * v * c))
        return {"x": weights["w"] * (1 - np.tanh(x) ** 2) * v * c, "v": weights["w"] * np.tanh(x) * c}

    def build(xv, vv, k):
        x, v = xv.copy(), vv.copy()
        corr, y = np.zeros(N), np.zeros(N)
        node = vkml.graph.opaque(model, reads={"x": x, "v": v}, writes={"corr": corr}, name="model")
        g = (vkml.Graph().add(node, name="model")
             .add(wave.bind(u=corr, k=k, y=y), name="wave").build(record=True))
        return g, y
    x0, v0 = np.linspace(-1, 1, N), np.linspace(0.5, 1.5, N)

    def fwd(xv=x0, vv=v0, k=1.5):
        g, y = build(xv, vv, k)
        g.launch()
        return y.copy()
    g, y = build(x0, v0, 1.5)
    g.launch()
    grads = vkml.diff.reverse(g.record, {"wave.y": np.ones(N)}, vjps={"model": model_vjp})
    np.testing.assert_allclose(grads["x"], (fwd(xv=x0 + H) - fwd(xv=x0 - H)) / (2 * H), rtol=1e-6,
                               atol=1e-9)
    np.testing.assert_allclose(grads["v"], (fwd(vv=v0 + H) - fwd(vv=v0 - H)) / (2 * H), rtol=1e-6,
                               atol=1e-9)
    np.testing.assert_allclose(grads["k"], np.sum(fwd(k=1.5 + H) - fwd(k=1.5 - H)) / (2 * H),
                               rtol=1e-6)
    w_grad = weights["grad"]
    weights["w"] += H
    hi = fwd().sum()
    weights["w"] -= 2 * H
    lo = fwd().sum()
    weights["w"] += H
    np.testing.assert_allclose(w_grad, (hi - lo) / (2 * H), rtol=1e-6)     # the model's own gradient


def test_conditionals_refuse_what_is_not_a_kernel_launch():
    x = np.zeros(N)
    node = vkml.graph.opaque(lambda r: {"x": r["x"]}, reads={"x": x}, writes={"x": x}, name="model")
    with pytest.raises(VkmlError, match=r"repeat_while: the member \(opaque node 'model'\) is not a "
                                        r"kernel launch.*kernel\.bind"):
        vkml.repeat_while(node, CountingGuard(1), max_iters=3)
    with pytest.raises(VkmlError, match=r"skippable: the member must be a kernel launch"):
        vkml.skippable(node, vkml.SkipGuard.nonzero(np.array([1], dtype="uint32")))
    with pytest.raises(VkmlError, match=r"max_iters must be a positive int"):
        vkml.repeat_while(step.bind(s=x, k=1.0), CountingGuard(1), max_iters=0)
