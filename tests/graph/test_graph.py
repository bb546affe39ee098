"""Graphs of per-sample kernels and their reverse (the tutorial "Gradients through a graph" and
more): gradients, Records, same bits.

Every gradient is checked against the analytic derivative, central finite
differences of the forward graph, or HIPS autograd -- never against vkml's own
derivative machinery.  Bitwise claims are checked with ``np.array_equal``
against sums computed here (a pure-Python pairwise tree) on kernels whose
per-sample contributions are exact, so they hold on every backend.
"""

from __future__ import annotations

import hashlib
import os
import threading

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
from vkml.errors import VkmlError
from models import square, wave

N = 64
K = 1.5


@vkml.kernel
def scaled(x, k: vkml.Param):
    return {"y": k * x}


@vkml.kernel
def spin(s, k: vkml.Param):
    return {"s": vkml.sin(k * s)}


@vkml.kernel
def two_outs(x, k: vkml.Param):
    return {"p": vkml.sin(k * x), "q": k * x * x}


@vkml.kernel
def scaled_a(x, a: vkml.Param):
    return {"y": a * x * x}


@vkml.kernel
def sine(x):
    return {"y": vkml.sin(x)}


def two_node(n=N, k=K):
    x = np.linspace(0.1, 0.9, n)
    u, y = np.zeros(n), np.zeros(n)
    g = (vkml.Graph()
         .add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=k, y=y), name="wave")
         .build(record=True))
    return g, x, u, y


def forward_y(x, k):
    return np.sin(k * x * x)


def analytic(x, k):
    u = x * x
    return 2 * x * k * np.cos(k * u), float(np.sum(u * np.cos(k * u)))


def pairwise(values):
    """The canonical tree written out in plain Python: pad to a power of two, halve recursively."""
    vals = [float(v) for v in values]
    width = 1
    while width < len(vals):
        width *= 2
    vals += [0.0] * (width - len(vals))

    def rec(lo, hi):
        if hi - lo == 1:
            return vals[lo]
        mid = (lo + hi) // 2
        return rec(lo, mid) + rec(mid, hi)
    return rec(0, width) if vals else 0.0


def sequential(values):
    total = 0.0
    for v in values:
        total += float(v)
    return total


def fingerprint(record):
    """A hash of every array a Record holds or points at (copies, planes, Param cells, checkpoints)."""
    h = hashlib.sha256()
    arrays = list(record.saved.values()) + list(record.planes.values()) + list(record.cells.values())
    for e in record.tape:
        for c in getattr(e, "checkpoints", {}).values():
            arrays += list(c.values())
    if record._kept_planes is not None:
        arrays += list(record._kept_planes.values())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# -- the two-node graph ---------------------------------------------------------------------------

def test_two_node_gradients_against_analytic_and_central_differences():
    g, x, u, y = two_node()
    g.launch()
    np.testing.assert_allclose(y, forward_y(x, K), rtol=1e-13)
    grads = vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
    gx, gk = analytic(x, K)
    np.testing.assert_allclose(grads["x"], gx, rtol=1e-12)
    np.testing.assert_allclose(grads["k"], gk, rtol=1e-12)
    h = 1e-6
    fd_x = (forward_y(x + h, K) - forward_y(x - h, K)) / (2 * h)      # per sample (diagonal Jacobian)
    fd_k = (forward_y(x, K + h).sum() - forward_y(x, K - h).sum()) / (2 * h)
    np.testing.assert_allclose(grads["x"], fd_x, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(grads["k"], fd_k, rtol=1e-7)
    assert grads.report.generation == g.generation == 1
    assert grads.report.bitwise["k"] and grads.report.bitwise["x"]
    # a read-only mapping
    with pytest.raises(TypeError):
        grads["x"] = 0
    with pytest.raises(KeyError, match="no gradient named"):
        grads["nope"]


def test_gradient_is_of_the_forward_the_graph_ran_checked_by_finite_differences_of_the_graph():
    """Central differences of vkml's own forward graph, perturbing the planes and the Param."""
    g, x, u, y = two_node()
    g.launch()
    grads = vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
    h = 1e-6
    x0 = x.copy()

    def run(xv, k):
        x[...] = xv
        g.update(k=k)
        g.launch()
        out = y.copy()
        g.record.keep()          # let the next recording launch through
        return out
    fd_x = (run(x0 + h, K) - run(x0 - h, K)) / (2 * h)
    fd_k = (run(x0, K + h).sum() - run(x0, K - h).sum()) / (2 * h)
    np.testing.assert_allclose(grads["x"], fd_x, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(grads["k"], fd_k, rtol=1e-7)


def test_reverse_reused_across_update_gives_each_ks_gradient_and_repeats_bitwise():
    g, x, u, y = two_node()
    rev = vkml.diff.Reverse(g)
    for k in (1.5, 0.7, -2.0, 3.25):
        g.update(k=k)
        g.launch()
        np.testing.assert_allclose(y, forward_y(x, k), rtol=1e-13)
        a = rev(g.record, {"wave.y": np.ones(N)})
        b = rev(g.record, {"wave.y": np.ones(N)})           # repeated: same bits
        c = vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
        gx, gk = analytic(x, k)
        np.testing.assert_allclose(a["x"], gx, rtol=1e-12)
        np.testing.assert_allclose(a["k"], gk, rtol=1e-12)
        for other in (b, c):
            assert np.array_equal(a["x"], other["x"]) and np.array_equal(a["k"], other["k"])
    # one node's Param by "node.k"
    g.update({"wave.k": 0.3})
    g.launch()
    np.testing.assert_allclose(rev(g.record, {"wave.y": np.ones(N)})["k"], analytic(x, 0.3)[1],
                               rtol=1e-12)


def test_update_refuses_an_unknown_param_or_a_wrong_shape_and_changes_nothing():
    g, x, u, y = two_node()
    g.launch()
    g.record.keep()
    with pytest.raises(VkmlError, match=r"no Param 'kk'.*wave\.k"):
        g.update(k=2.0, kk=1.0)
    with pytest.raises(VkmlError, match=r"wave\.k holds shape \(\)"):
        g.update(k=np.ones(3))
    g.launch()
    np.testing.assert_allclose(y, forward_y(x, K), rtol=1e-13)       # k is still 1.5
    np.testing.assert_allclose(vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})["k"],
                               analytic(x, K)[1], rtol=1e-12)


def test_record_copies_only_what_is_overwritten():
    g, x, u, y = two_node()
    g.launch()
    assert g.record.nbytes == 0 and g.record.copied == []     # nothing overwritten: nothing copied
    # a node updating a plane in place: the version it read is copied once, just before the overwrite
    s = np.linspace(0.1, 0.9, N)
    s0 = s.copy()
    g2 = vkml.Graph().add(spin.bind(s=s, k=K), name="spin").build(record=True)
    g2.launch()
    assert g2.record.nbytes == s.nbytes and g2.record.copied == ["s"]
    grads = vkml.diff.reverse(g2.record, {"s": np.ones(N)})
    np.testing.assert_allclose(grads["s"], K * np.cos(K * s0), rtol=1e-12)
    np.testing.assert_allclose(grads["k"], np.sum(s0 * np.cos(K * s0)), rtol=1e-12)
    # a later node overwriting a plane an earlier one read: that plane's bytes, not more
    x2 = np.linspace(0.1, 0.9, N)
    u2, y2 = np.zeros(N), np.zeros(N)
    g3 = (vkml.Graph().add(square.bind(x=x2, u=u2), name="square")
          .add(wave.bind(u=u2, k=K, y=y2), name="wave")
          .add(square.bind(x=y2, u=u2), name="again")          # overwrites u2, which wave read
          .build(record=True))
    g3.launch()
    assert g3.record.nbytes == u2.nbytes and g3.record.copied == ["u"]
    grads = vkml.diff.reverse(g3.record, {"again.u": np.ones(N)})
    # d/dx of (sin(k x^2))^2 = 2 sin(k x^2) cos(k x^2) 2 k x
    yv = np.sin(K * x2 * x2)
    np.testing.assert_allclose(grads["x"], 2 * yv * np.cos(K * x2 * x2) * 2 * K * x2, rtol=1e-12)


def test_seed_names_node_plane_when_both_nodes_call_their_output_y():
    """The tutorial's two-node graph: square.y and wave.y; the plain "y" is ambiguous."""
    x = np.linspace(0.1, 0.9, N)
    y, z = np.zeros(N), np.zeros(N)
    g = (vkml.Graph()
         .add(scaled_a.bind(x=x, a=0.5, y=y), name="square")
         .add(sine.bind(x=y, y=z), name="wave")
         .build(record=True))
    g.launch()
    with pytest.raises(VkmlError, match=r"seed 'y' is ambiguous: square\.y, wave\.y.*'node\.plane'"):
        vkml.diff.reverse(g.record, {"y": np.ones(N)})
    assert g.record.live                                      # the refusal changed nothing
    grads = vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
    inner = 0.5 * x * x
    np.testing.assert_allclose(grads["x"], np.cos(inner) * x, rtol=1e-12)     # 0.5 * 2x
    np.testing.assert_allclose(grads["a"], np.sum(np.cos(inner) * x * x), rtol=1e-12)
    # seeding the first node's y instead
    g.launch()
    grads = vkml.diff.reverse(g.record, {"square.y": np.ones(N)})
    np.testing.assert_allclose(grads["x"], x, rtol=1e-13)
    np.testing.assert_allclose(grads["a"], np.sum(x * x), rtol=1e-13)


def test_unnamed_outputs_are_seeded_with_zero():
    x = np.linspace(-0.8, 0.9, N)
    p, q = np.zeros(N), np.zeros(N)
    g = vkml.Graph().add(two_outs.bind(x=x, k=K, p=p, q=q), name="two").build(record=True)
    g.launch()
    seed = np.linspace(1.0, 2.0, N)
    only_p = vkml.diff.reverse(g.record, {"p": seed})
    np.testing.assert_allclose(only_p["x"], seed * K * np.cos(K * x), rtol=1e-12)
    np.testing.assert_allclose(only_p["k"], np.sum(seed * x * np.cos(K * x)), rtol=1e-12)
    only_q = vkml.diff.reverse(g.record, {"q": seed})
    np.testing.assert_allclose(only_q["x"], seed * 2 * K * x, rtol=1e-12)
    np.testing.assert_allclose(only_q["k"], np.sum(seed * x * x), rtol=1e-12)
    # and against autograd, the objective being only p
    f = lambda xv, k: anp.sum(seed * anp.sin(k * xv))                     # noqa: E731
    np.testing.assert_allclose(only_p["x"], autograd.grad(f, 0)(x, K), rtol=1e-12)
    np.testing.assert_allclose(only_p["k"], autograd.grad(f, 1)(x, K), rtol=1e-12)


def test_per_sample_gradients_come_back_in_sample_order():
    rng = np.random.default_rng(1)
    x = rng.uniform(0.1, 0.9, N)                  # no order to the values: the rows are the samples
    u, y = np.zeros(N), np.zeros(N)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=K, y=y), name="wave").build(record=True))
    g.launch()
    seed = rng.uniform(-1, 1, N)
    grads = vkml.diff.reverse(g.record, {"wave.y": seed})
    gx, _ = analytic(x, K)
    np.testing.assert_allclose(grads["x"], seed * gx, rtol=1e-12)


def test_tree_sum_is_the_pure_python_pairwise_tree():
    rng = np.random.default_rng(2)
    # both ways of computing it: padded (up to treesum.SMALL samples) and carrying (above)
    for n in (1, 2, 3, 5, 8, 13, 255, 256, 257, 1000, 4096, 4097, 6001, 8192):
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
        v[-1] = -0.0                                # a carried -0.0 becomes +0.0, as padding gives
        assert vkml.graph.tree_sum(v).tobytes() == np.float64(pairwise(v)).tobytes(), n
    v = rng.standard_normal((37, 3))
    got = vkml.graph.tree_sum(v)
    assert all(got[j] == pairwise(v[:, j]) for j in range(3))
    assert vkml.graph.tree_sum(np.zeros((0, 2))).shape == (2,)


def test_uniform_gradient_is_the_canonical_tree_of_the_per_sample_contributions():
    """y = k * x seeded with ones: sample i contributes exactly x_i to dJ/dk, so the gradient must be
    the canonical tree of x in sample order, bit for bit (and that tree differs from a sequential sum
    for these values, so the check has teeth)."""
    rng = np.random.default_rng(3)
    n = 1000
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)
    y = np.zeros(n)
    g = vkml.Graph().add(scaled.bind(x=x, k=0.5, y=y), name="scale").build(record=True)
    g.launch()
    grads = vkml.diff.reverse(g.record, {"y": np.ones(n)})
    assert grads["k"] == pairwise(x) == vkml.graph.tree_sum(x)
    assert sequential(x) != pairwise(x)
    assert np.array_equal(grads["x"], np.full(n, 0.5))
    # the two-node graph: the per-sample contributions computed here, summed with tree_sum
    g2, x2, u2, y2 = two_node(n=777)
    g2.launch()
    grads = vkml.diff.reverse(g2.record, {"wave.y": np.ones(777)})
    contrib = x2 * x2 * np.cos(K * (x2 * x2))
    np.testing.assert_allclose(grads["k"], vkml.graph.tree_sum(contrib), rtol=1e-14)


def test_sample_permutation():
    """vkml has no ActiveSet: the sample order is the row order of the planes.  What we test:
    running the permuted samples and un-permuting the per-sample gradients gives the original
    per-sample bits; each run's uniform gradient is the canonical tree in *its* row order (the
    original run's equals the tree over the original order, bit for bit)."""
    rng = np.random.default_rng(4)
    n = 1000
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)
    perm = rng.permutation(n)
    inv = np.argsort(perm)
    out = {}
    for name, xv in (("orig", x.copy()), ("perm", x[perm].copy())):
        u, y = np.zeros(n), np.zeros(n)
        g = (vkml.Graph().add(square.bind(x=xv, u=u), name="square")
             .add(scaled.bind(x=u, k=0.5, y=y), name="scale").build(record=True))
        g.launch()
        out[name] = vkml.diff.reverse(g.record, {"y": np.ones(n)})
    assert np.array_equal(out["perm"]["x"][inv], out["orig"]["x"])
    assert out["orig"]["k"] == pairwise(x * x)                  # original sample order
    assert out["perm"]["k"] == pairwise((x * x)[perm])          # the permuted run: its own row order
    np.testing.assert_allclose(out["perm"]["k"], out["orig"]["k"], rtol=1e-13)


def test_adjoints_of_a_plane_read_by_several_nodes_add_seed_first_then_readers_in_order_added():
    """w = 1 * x is seeded and read by three linear readers y_i = c_i * w, each seeded s_i: every
    term is one exact product, so the adjoint of w -- and grads["x"] = 1 * adjoint -- must be
    ((s0 + c1 s1) + c2 s2) + c3 s3 bit for bit."""
    n = 2000
    rng = np.random.default_rng(6)
    x = rng.standard_normal(n)
    w = np.zeros(n)
    cs = [0.3, -1.7, 2.9]
    ys = [np.zeros(n) for _ in cs]
    g = vkml.Graph().add(scaled.bind(x=x, k=1.0, y=w), name="w")
    for i, (c, y) in enumerate(zip(cs, ys)):
        g.add(scaled.bind(x=w, k=c, y=y), name=f"r{i + 1}")
    g.build(record=True).launch()
    seeds = {f"r{i + 1}.y": rng.standard_normal(n) * 10.0 ** rng.integers(-4, 4, n) for i in range(3)}
    seeds["w.y"] = rng.standard_normal(n) * 10.0 ** rng.integers(-4, 4, n)
    grads = vkml.diff.reverse(g.record, seeds)
    terms = [seeds["w.y"]] + [c * seeds[f"r{i + 1}.y"] for i, c in enumerate(cs)]
    in_order = ((terms[0] + terms[1]) + terms[2]) + terms[3]
    assert np.array_equal(grads["x"], in_order)
    backwards = ((terms[3] + terms[2]) + terms[1]) + terms[0]
    assert not np.array_equal(in_order, backwards)           # the order is visible in the bits
    for i, c in enumerate(cs):                                # each reader's k: tree over w * s_i
        assert grads[f"r{i + 1}.k"] == pairwise(x * seeds[f"r{i + 1}.y"])


def _threads(value):
    old = os.environ.get("VKML_THREADS")
    os.environ["VKML_THREADS"] = str(value)
    return old


def _restore(old):
    if old is None:
        os.environ.pop("VKML_THREADS", None)
    else:
        os.environ["VKML_THREADS"] = old


def test_same_bits_for_1_2_and_4_threads():
    """n = 5000 splits into 4096+904 samples on 2 threads and 3 chunks of 2048 on 4."""
    from vkml.graph import execute
    n = 5000
    rng = np.random.default_rng(5)
    x0 = rng.uniform(-2, 2, n)
    results = {}
    for t in (1, 2, 4):
        old = _threads(t)
        try:
            x = x0.copy()
            u, y = np.zeros(n), np.zeros(n)
            s = x0 * 0.3
            g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
                 .add(wave.bind(u=u, k=K, y=y), name="wave")
                 .add(spin.bind(s=s, k=0.8), name="spin")
                 .build(record=True))
            g.launch()
            results[t] = (y.copy(), vkml.diff.reverse(g.record, {"wave.y": np.ones(n), "s": x0}))
        finally:
            _restore(old)
    assert {2, 4} <= set(execute.POOLS)               # the thread pools really ran chunks
    y1, g1 = results[1]
    for t in (2, 4):
        yt, gt = results[t]
        assert np.array_equal(yt, y1)
        for name in ("x", "s", "k", "wave.k", "spin.k"):
            assert np.array_equal(gt[name], g1[name]), (t, name)
    np.testing.assert_allclose(g1["x"], analytic(x0, K)[0], rtol=1e-12)


@vkml.kernel
def mixed(x, k: vkml.Param, w):
    return {"y": k * x + w * w}


def test_a_param_before_an_input_in_the_signature():
    x, w = np.linspace(0.1, 0.9, N), np.linspace(-1, 1, N)
    y = np.zeros(N)
    g = vkml.Graph().add(mixed.bind(x=x, k=2.5, w=w, y=y), name="mixed").build(record=True)
    g.launch()
    np.testing.assert_allclose(y, 2.5 * x + w * w, rtol=1e-15)
    grads = vkml.diff.reverse(g.record, {"y": np.ones(N)})
    np.testing.assert_allclose(grads["x"], np.full(N, 2.5), rtol=1e-15)
    np.testing.assert_allclose(grads["w"], 2 * w, rtol=1e-15)
    np.testing.assert_allclose(grads["k"], vkml.graph.tree_sum(x), rtol=1e-15)


# -- the Record rules ---------------------------------------------------------------------------

def test_one_recorded_run_per_launch():
    g, x, u, y = two_node()
    with pytest.raises(VkmlError, match=r"records one run per launch\(\).*launch\(\) once per run"):
        g.launch(2)
    assert g.generation == 0 and g.record is None and not y.any()     # nothing ran
    g.launch()
    assert g.generation == 1
    # a graph built without record=True runs launch(n) n times
    s = np.full(N, 0.5)
    g2 = vkml.Graph().add(spin.bind(s=s, k=1.0), name="spin").build()
    g2.launch(3)
    np.testing.assert_allclose(s, np.sin(np.sin(np.sin(np.full(N, 0.5)))), rtol=1e-14)
    assert g2.record is None and g2.generation == 3


def test_live_record_refuses_the_next_recording_launch_and_update():
    g, x, u, y = two_node()
    g.launch()
    rec = g.record
    y_before = y.copy()
    x[...] = x[::-1]                        # what a refused launch would have changed
    with pytest.raises(VkmlError, match=r"generation 1 is still live; reverse it first, or keep"):
        g.launch()
    with pytest.raises(VkmlError, match=r"generation 1 is still live; reverse it \(or keep\(\) it\)"):
        g.update(k=0.1)
    x[...] = x[::-1]
    assert g.record is rec and rec.live and g.generation == 1 and np.array_equal(y, y_before)
    grads = vkml.diff.reverse(rec, {"wave.y": np.ones(N)})
    np.testing.assert_allclose(grads["k"], analytic(x, K)[1], rtol=1e-12)     # k was not updated
    assert not rec.live
    g.update(k=0.1)
    g.launch()


def test_stale_record_is_refused_naming_both_generations():
    g, x, u, y = two_node()
    g.launch()
    old = g.record
    first = vkml.diff.reverse(old, {"wave.y": np.ones(N)})
    x *= 0.5
    g.launch()
    new = vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
    np.testing.assert_allclose(new["x"], analytic(x, K)[0], rtol=1e-12)
    with pytest.raises(VkmlError, match=r"generation 1, but the graph has launched since and is at "
                                        r"generation 2.*keep\(\)"):
        vkml.diff.reverse(old, {"wave.y": np.ones(N)})
    with pytest.raises(VkmlError, match=r"generation 1 but the graph is at generation 2"):
        old.keep()
    assert not np.array_equal(first["x"], new["x"])


def test_keep_copies_what_the_reverse_reads_and_stays_valid():
    g, x, u, y = two_node()
    g.launch()
    kept = g.record.keep()
    assert kept.kept and not kept.live
    right_after = vkml.diff.reverse(kept, {"wave.y": np.ones(N)})
    g.launch()                                    # allowed: the Record is kept
    vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
    x[...] = 0.25                                 # inputs changed, more launches, other Params
    g.update(k=-0.5)
    for _ in range(2):
        g.launch()
        vkml.diff.reverse(g.record, {"wave.y": np.ones(N)})
    later = vkml.diff.reverse(kept, {"wave.y": np.ones(N)})
    assert np.array_equal(later["x"], right_after["x"]) and later["k"] == right_after["k"]
    xs = np.linspace(0.1, 0.9, N)
    np.testing.assert_allclose(later["x"], analytic(xs, K)[0], rtol=1e-12)
    # kept Record of a graph that overwrites in place: the pre-overwrite copy and the planes
    s = np.linspace(0.1, 0.9, N)
    g2 = vkml.Graph().add(spin.bind(s=s, k=K), name="spin").add(spin.bind(s=s, k=K), name="spin2")
    g2.build(record=True).launch()
    k2 = g2.record.keep()
    expect = vkml.diff.reverse(k2, {"spin2.s": np.ones(N)})
    s[...] = 3.0
    g2.launch()
    again = vkml.diff.reverse(k2, {"spin2.s": np.ones(N)})
    assert np.array_equal(expect["s"], again["s"]) and expect["k"] == again["k"]
    s0 = np.linspace(0.1, 0.9, N)
    np.testing.assert_allclose(expect["s"], K * np.cos(K * np.sin(K * s0)) * K * np.cos(K * s0),
                               rtol=1e-12)


def test_update_after_a_reverse_does_not_leak_into_a_later_reverse_of_that_record():
    """The Record holds the Param values its launch used: a reverse sees its launch's Params."""
    g, x, u, y = two_node()
    g.launch()
    rec = g.record
    first = vkml.diff.reverse(rec, {"wave.y": np.ones(N)})
    g.update(k=2.0)
    again = vkml.diff.reverse(rec, {"wave.y": np.ones(N)})
    assert np.array_equal(first["x"], again["x"]) and first["k"] == again["k"]
    np.testing.assert_allclose(again["x"], analytic(x, K)[0], rtol=1e-12)


def test_a_reverse_never_writes_the_record():
    s = np.linspace(0.1, 0.9, N)
    x = np.linspace(0.2, 0.7, N)
    u, y = np.zeros(N), np.zeros(N)
    corr = np.zeros(N)
    r = np.linspace(0.2, 0.6, N)
    loop_runs = [True] * 9                       # nine iterations: checkpoints every 5
    node = vkml.graph.opaque(lambda r: {"corr": r["x"] ** 3}, reads={"x": x}, writes={"corr": corr},
                             name="cube")
    cube_vjp = lambda p, c: {"x": 3 * p["x"] ** 2 * c["corr"]}             # noqa: E731
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(spin.bind(s=s, k=K), name="spin")
         .add(spin.bind(s=s, k=K), name="spin2")
         .add(node, name="cube")
         .add(wave.bind(u=corr, k=0.7, y=y), name="wave")
         .add(square.bind(x=s, u=u), name="over")
         .add_node(vkml.repeat_while(spin.bind(s=r, k=0.9), lambda: loop_runs.pop() if loop_runs
                                     else False, max_iters=20), name="loop")
         .build(record=True))
    g.launch()
    rec = g.record
    assert rec.nbytes > 0
    before = fingerprint(rec)
    seeds = {"wave.y": np.ones(N), "over.u": np.ones(N), "loop.s": np.ones(N)}
    a = vkml.diff.reverse(rec, seeds, vjps={"cube": cube_vjp})
    b = vkml.diff.reverse(rec, seeds, vjps={"cube": cube_vjp})
    assert fingerprint(rec) == before
    # two planes are bound as "s" (spin's and the loop's): only "node.s" names them
    assert "s" not in a and np.array_equal(a["spin.s"], b["spin.s"])
    np.testing.assert_allclose(a["x"], 0.7 * np.cos(0.7 * x ** 3) * 3 * x ** 2, rtol=1e-12)
    s0 = np.linspace(0.1, 0.9, N)
    s1 = np.sin(K * s0)
    np.testing.assert_allclose(a["spin.s"], 2 * np.sin(K * s1) * K * np.cos(K * s1) * K * np.cos(K * s0),
                               rtol=1e-12)
    rv = np.linspace(0.2, 0.6, N)
    d = np.ones(N)
    for _ in range(9):                                        # d/dr of sin(0.9 .) applied 9 times
        d = d * 0.9 * np.cos(0.9 * rv)
        rv = np.sin(0.9 * rv)
    np.testing.assert_allclose(a["loop.s"], d, rtol=1e-12)
    assert np.array_equal(a["loop.s"], b["loop.s"])


# -- Busy and threads -------------------------------------------------------------------------------

def _busy_graph(n=N):
    """A graph whose opaque node's vjp runs while a reverse reads the Record."""
    x = np.linspace(0.1, 0.9, n)
    corr, y = np.zeros(n), np.zeros(n)
    node = vkml.graph.opaque(lambda r: {"corr": r["x"] ** 3}, reads={"x": x}, writes={"corr": corr},
                             name="cube")
    g = (vkml.Graph().add(node, name="cube").add(wave.bind(u=corr, k=K, y=y), name="wave")
         .build(record=True))
    return g, x


def _expected_x(x):
    return K * np.cos(K * x ** 3) * 3 * x ** 2


def test_launch_or_update_while_a_reverse_reads_the_record_is_busy():
    g, x = _busy_graph()
    g.launch()
    rec = g.record
    seen = []

    def vjp(primals, cts):
        for call in (g.launch, lambda: g.update(k=0.1)):
            try:
                call()
                seen.append("ran")
            except vkml.Busy as err:
                seen.append(str(err))
        # from another thread too
        t = threading.Thread(target=lambda: seen.append(_catch(g.launch)))
        t.start()
        t.join()
        return {"x": 3 * primals["x"] ** 2 * cts["corr"]}

    grads = vkml.diff.reverse(rec, {"wave.y": np.ones(N)}, vjps={"cube": vjp})
    assert len(seen) == 3 and all("a reverse is reading the Record of generation 1" in m for m in seen)
    assert g.generation == 1 and g.record is rec                      # nothing launched
    np.testing.assert_allclose(grads["x"], _expected_x(x), rtol=1e-12)
    np.testing.assert_allclose(grads["k"], np.sum(x ** 3 * np.cos(K * x ** 3)), rtol=1e-12)
    g.launch()                                                          # free again afterwards
    assert g.generation == 2


def _catch(fn):
    try:
        fn()
        return "ran"
    except vkml.Busy as err:
        return str(err)


def test_a_reverse_update_or_launch_while_the_graph_launches_is_busy():
    """Never a gradient from a mix of two launches: an opaque node runs mid-launch (after square
    overwrote u) and tries to reverse the previous, already reversed, Record of the graph."""
    x = np.linspace(0.1, 0.9, N)
    u, y, copy = np.zeros(N), np.zeros(N), np.zeros(N)
    seen = []

    def middle(reads):
        if g.generation == 1:
            for call in (lambda: vkml.diff.reverse(first, {"wave.y": np.ones(N)}, vjps=vjps),
                         lambda: g.update(k=0.2), g.launch):
                seen.append(_catch(call))
        return {"c": reads["u"] * 1.0}
    node = vkml.graph.opaque(middle, reads={"u": u}, writes={"c": copy}, name="middle")
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square").add(node, name="middle")
         .add(wave.bind(u=u, k=K, y=y), name="wave").build(record=True))
    g.launch()
    first = g.record
    vjps = {"middle": lambda p, c: {"u": c["c"]}}
    expect = vkml.diff.reverse(first, {"wave.y": np.ones(N)}, vjps=vjps)
    x *= 2.0                                              # the second launch overwrites u
    g.launch()
    assert len(seen) == 3
    assert "the graph is running launch 2, which overwrites the planes this Record reads" in seen[0]
    assert all("the graph is running launch 2; wait for it to return" in m for m in seen[1:])
    np.testing.assert_allclose(y, forward_y(x, K), rtol=1e-12)     # k was not updated mid-launch
    np.testing.assert_allclose(expect["x"], analytic(x / 2, K)[0], rtol=1e-12)


def test_one_reverse_shared_by_two_threads_is_busy_distinct_reverses_run_at_once():
    g, x = _busy_graph(n=300)
    g.launch()
    rec = g.record
    seeds = {"wave.y": np.linspace(1, 2, 300)}
    other = {}
    state = {"inner": False}

    def vjp(primals, cts):
        if not state["inner"]:
            state["inner"] = True
            t1 = threading.Thread(target=lambda: other.setdefault("shared", _catch(
                lambda: rev(rec, seeds))))
            t2 = threading.Thread(target=lambda: other.setdefault("distinct", vkml.diff.Reverse(
                g, vjps={"cube": vjp})(rec, seeds)))
            for t in (t1, t2):
                t.start()
                t.join()
        return {"x": 3 * primals["x"] ** 2 * cts["corr"]}

    rev = vkml.diff.Reverse(g, vjps={"cube": vjp})
    grads = rev(rec, seeds)
    assert "another thread is running this Reverse; give each thread its own" in other["shared"]
    d = other["distinct"]                    # ran to completion while `rev` was mid-sweep
    assert np.array_equal(d["x"], grads["x"]) and d["k"] == grads["k"]
    np.testing.assert_allclose(grads["x"], seeds["wave.y"] * _expected_x(x), rtol=1e-12)
    # the shared Reverse still works afterwards
    again = rev(rec, seeds)
    assert np.array_equal(again["x"], grads["x"])


def test_distinct_reverses_in_threads_on_one_record_give_the_same_bits():
    n = 3000
    g, x, u, y = two_node(n=n)
    g.launch()
    rec = g.record
    seeds = {"wave.y": np.cos(np.arange(n))}
    revs = [vkml.diff.Reverse(g) for _ in range(4)]
    barrier = threading.Barrier(4)
    out = [None] * 4

    def work(i):
        barrier.wait()
        out[i] = [revs[i](rec, seeds) for _ in range(3)]
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ref = out[0][0]
    for res in out:
        for r in res:
            assert np.array_equal(r["x"], ref["x"]) and r["k"] == ref["k"]
    np.testing.assert_allclose(ref["x"], seeds["wave.y"] * analytic(x, K)[0], rtol=1e-12)


def test_a_large_launch_computes_its_planes_in_place_with_the_same_bits():
    """Written planes the launch does not read are the program's destinations: computed straight
    into them (no copy) when large, copied into when small or overlapping an argument; same bits."""
    n = 20_000                                   # 160 KB planes: above DIRECT_MIN_BYTES
    g, x, u, y = two_node(n)
    u_id, y_id = id(u), id(y)
    g.launch()
    grads = vkml.diff.reverse(g.record, {"y": np.ones(n)})
    assert id(u) == u_id and id(y) == y_id
    assert u.tobytes() == (x * x).tobytes()
    np.testing.assert_allclose(y, np.sin(K * x * x), rtol=1e-15)
    np.testing.assert_allclose(grads["x"], 2 * x * K * np.cos(K * x * x), rtol=1e-12)
    small, xs, us, ys = two_node(64)             # small planes: copied into, the same values
    small.launch()
    assert us.tobytes() == (xs * xs).tobytes()
    np.testing.assert_allclose(ys, np.sin(K * xs * xs), rtol=1e-15)
    # at the executable level: a destination is the result itself, written or copied into
    backend = vkml.backends.current()
    prog = vkml.program(lambda a: vkml.sin(a * 1.5) + a, x)
    exe = backend.executable(("into-probe", n), lambda: prog)
    want = backend.run(exe, [x])[0]
    dest = np.empty(n)
    out = backend.run(exe, [x], into=[dest])[0]
    assert out is dest and dest.tobytes() == want.tobytes()
    if backend.name in ("numpy", "cpu"):          # host backends write into it themselves
        direct = np.empty(n)
        assert exe.writes_into and exe([x], into=[direct])[0] is direct
        assert direct.tobytes() == want.tobytes()
    inplace = x.copy()                            # the destination is the argument: copied after
    out = backend.run(exe, [inplace], into=[inplace])[0]
    assert out is inplace and inplace.tobytes() == want.tobytes()
