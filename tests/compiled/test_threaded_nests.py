"""The cpu tier splits a program's big loop nests over threads and keeps the one-thread bits.

Each element of an elementwise or movement nest, and each output of a reduction (its additions
in their fixed tree), is computed on its own, so which thread computes it cannot change it:
results are compared byte for byte across thread counts, and the sums against the NumPy
backend's canonical trees.  What must stay whole is checked in the generated C: small nests,
nests that may stop the program (an index check), a scan's steps and the column trees that
share their stacks across rows.
"""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen.threaded_nests import THREAD_MIN_WORK, THREADED_MARKER

pytestmark = pytest.mark.skipif(cpu.compiler() is None or not cpu.is_gcc(cpu.compiler()),
                                reason="needs GCC (OpenMP)")


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("VKML_CPU_HOT", "0")          # compiled at the first call


def _source(monkeypatch, threads, fn, *args):
    monkeypatch.setenv("VKML_THREADS", str(threads))
    return cpu.c_source(vkml.program(fn, *args))[0]


def _run(monkeypatch, threads, fn, *args):
    monkeypatch.setenv("VKML_THREADS", str(threads))
    with vkml.use_backend("cpu"):
        out = vkml.jit(fn)(*args)
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


def _layer(x, w):
    """Elementwise work with vector math, a transpose, a row sum, a column max, a product."""
    h = vkml.tanh(x * 0.5 + 1.0) * vkml.exp(-x * x)
    return h.T * 2.0, vkml.sum(h * h, axis=1), vkml.max(h, axis=0), h @ w


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    # magnitudes spread over 2^-20..2^20: a sum's bits show the order of its additions
    x = (rng.standard_normal((300, 400)) * 2.0 ** rng.integers(-20, 20, (300, 400)))
    return x.astype(np.float32), rng.standard_normal((400, 64)).astype(np.float32)


def test_big_nests_are_split_and_every_bit_is_the_one_thread_bit(monkeypatch):
    x, w = _inputs()
    assert THREADED_MARKER not in _source(monkeypatch, 1, _layer, x, w)
    assert _source(monkeypatch, 2, _layer, x, w).count(THREADED_MARKER) >= 3
    one = _run(monkeypatch, 1, _layer, x, w)
    for threads in (2, 3, 4):
        got = _run(monkeypatch, threads, _layer, x, w)
        assert [g.tobytes() for g in got] == [o.tobytes() for o in one], threads


def test_a_split_sum_keeps_the_canonical_tree(monkeypatch):
    x, _ = _inputs(1)

    def sums(x):
        return vkml.sum(x, axis=1), vkml.sum(x * 3.0, axis=(0, 1)), vkml.max(x, axis=1)

    assert THREADED_MARKER in _source(monkeypatch, 2, sums, x)
    got = _run(monkeypatch, 2, sums, x)
    with vkml.use_backend("numpy"):
        want = [np.asarray(o) for o in vkml.jit(sums)(x)]
    assert [g.tobytes() for g in got] == [o.tobytes() for o in want]
    exact = x.astype(np.float64).sum(axis=1)
    bound = 400 * np.finfo(np.float32).eps * np.abs(x.astype(np.float64)).sum(axis=1)
    assert np.all(np.abs(got[0] - exact) <= bound)


def test_small_nests_checked_nests_scans_and_column_trees_stay_whole(monkeypatch):
    side = int(np.sqrt(THREAD_MIN_WORK)) // 2
    small = np.ones((side, side), np.float32)
    assert THREADED_MARKER not in _source(monkeypatch, 2, lambda a: a * 2.0 + 1.0, small)
    table = np.arange(400 * 200, dtype=np.float32).reshape(400, 200)
    rows = np.arange(400)[::-1] % 400
    source = _source(monkeypatch, 2, lambda t, i: vkml.take(t, i, axis=0) * 2.0, table, rows)
    assert THREADED_MARKER in source and "goto" in source       # (the gather checks its rows)
    for nest in source.split(THREADED_MARKER)[1:]:
        assert "goto" not in nest.split("\n    }\n")[0]        # no check inside a split nest
    columns = _source(monkeypatch, 2, lambda a: vkml.sum(a * 2.0, axis=0), table)
    assert "vk_tree_cols_push" in columns
    assert all("vk_tree_cols_push" not in n.split("\n    }\n")[0]
               for n in columns.split(THREADED_MARKER)[1:])

    def cumulative(xs):
        return vkml.scan(lambda c, x: (c + x * 2.0, c * x), vkml.zeros((200,)), xs)

    xs = np.ones((400, 200), np.float32)
    assert THREADED_MARKER not in _source(monkeypatch, 2, cumulative, xs)   # (steps in turn)
    one, two = _run(monkeypatch, 1, cumulative, xs), _run(monkeypatch, 2, cumulative, xs)
    assert [a.tobytes() for a in one] == [b.tobytes() for b in two]


def test_an_in_place_update_split_over_threads_matches_one_thread(monkeypatch):
    shapes = [(512, 300), (300,)]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    y = rng.integers(0, 300, 256)
    results = []
    for threads in (1, 2):
        monkeypatch.setenv("VKML_THREADS", str(threads))
        with vkml.use_backend("cpu"):
            params = [vkml.nn.Parameter(rng.standard_normal(s).astype(np.float32) * 0 +
                                        np.float32(0.01) * np.arange(np.prod(s), dtype=np.float32)
                                        .reshape(s) / np.prod(s)) for s in shapes]
            opt = vkml.optim.Adam(params, lr=1e-3)
            step = opt.compile_step(lambda xb, yb: vkml.nn.cross_entropy(
                vkml.tanh(xb @ params[0] + params[1]), yb))
            for _ in range(3):
                step(vkml.tensor(x), vkml.tensor(y))
            results.append([p.numpy().tobytes() for p in params])
    assert results[0] == results[1]


def test_a_middling_nest_wakes_a_few_threads_not_all(monkeypatch):
    """On a machine of many cores (``VKML_THREADS=8`` here) each thread of a split nest gets at
    least half of ``THREAD_MIN_WORK`` iterations: a nest of 40,000 elements runs on 2, one of
    1,000,000 on all 8; a batch of six small products on 3 (two matrices each).  The bits are
    one thread's either way."""
    import re

    def teams(source):
        return sorted(int(t) for t in re.findall(r"num_threads\((\d+)\)", source))

    middling = np.ones((200, 200), np.float32)
    big = np.ones((1000, 1000), np.float32)
    assert teams(_source(monkeypatch, 8, lambda a: a * 2.0 + 1.0, middling)) == [2]
    assert teams(_source(monkeypatch, 8, lambda a: a * 2.0 + 1.0, big)) == [8]
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((6, 64, 48)).astype(np.float32), \
        rng.standard_normal((6, 48, 40)).astype(np.float32)
    assert teams(_source(monkeypatch, 8, lambda a, b: a @ b, a, b)) == [3]
    one, eight = _run(monkeypatch, 1, lambda a, b: a @ b, a, b), \
        _run(monkeypatch, 8, lambda a, b: a @ b, a, b)
    assert one[0].tobytes() == eight[0].tobytes()


def test_only_enough_outer_loops_are_collapsed_for_the_threads(monkeypatch):
    """A max pool's (n, c, 12, 2, 12, 2) nest splits its batch loop alone on two threads (64
    iterations: 32 each), keeping the loops inside whole; with a batch of 2 the channels are
    collapsed with it; the bits are one thread's either way."""
    import re
    rng = np.random.default_rng(3)

    def pool(v):
        return vkml.max_pool2d(vkml.relu(v - 0.2), 2)

    for batch, loops in ((64, 1), (2, 2)):
        x = rng.standard_normal((batch, 32, 24, 24)).astype(np.float32)
        source = _source(monkeypatch, 2, pool, x)
        collapsed = {int(n) for n in re.findall(r"collapse\((\d+)\)", source)}
        assert collapsed == {loops}, (batch, collapsed)
        one = _run(monkeypatch, 1, pool, x)
        assert _run(monkeypatch, 2, pool, x)[0].tobytes() == one[0].tobytes()
