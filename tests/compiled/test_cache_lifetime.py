"""Caches have a lifetime: bounded, clearable, and freed with what they belong to.

The soak tests run a loop a couple of thousand times and compare the memory
vkml's own modules hold (``tracemalloc``, filtered to the package) a quarter
of the way in and at the end: a loop that keeps something per iteration grows
by kilobytes per hundred iterations and fails; counts of cache entries are
checked against the limit.  Nothing here measures time.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
import weakref

import numpy as np
import pytest

import vkml
from vkml.backends import background
from vkml import optim
from models import square, wave

#: what vkml's own code may come to hold more over the last three quarters of a soak loop (the
#: loops below keep nothing per iteration; one kept per iteration would be 100 KB and more)
SLACK = 48 * 1024
PACKAGE = os.path.dirname(vkml.__file__)


@pytest.fixture
def limit():
    """Run with a small cache limit; restore the old one after."""
    old = vkml.cache_limit()
    vkml.set_cache_limit(32)
    yield 32
    vkml.set_cache_limit(old)


def _held_by_vkml() -> int:
    """What vkml's modules hold now; optimised builds running in the background are waited for
    first (their compile's strings are vkml's while they run, but not kept)."""
    background.wait()
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, PACKAGE + "/*")])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def _soak(n, body):
    """Run ``body(i)`` n times; the growth of vkml's memory over the last three quarters."""
    tracemalloc.start()
    try:
        for i in range(n):
            body(i)
            if i == n // 4:
                early = _held_by_vkml()
        return _held_by_vkml() - early
    finally:
        tracemalloc.stop()


def test_a_training_loop_holds_flat_memory_and_flat_caches():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 5)).astype(np.float32)
    y = rng.standard_normal((16, 1)).astype(np.float32)
    w1 = vkml.tensor(rng.standard_normal((5, 8)).astype(np.float32), requires_grad=True)
    w2 = vkml.tensor(rng.standard_normal((8, 1)).astype(np.float32), requires_grad=True)
    opt = optim.Adam([w1, w2], lr=0.01)
    sizes = []

    def step(i):
        opt.zero_grad()
        d = vkml.tanh(vkml.matmul(x, w1)) @ w2 - y
        (d * d).mean().backward()
        opt.step()
        if i in (10, 1400):
            gc.collect()                # jitted functions other tests dropped go now, not mid-loop
            sizes.append(vkml.stats().caches)
    assert _soak(1500, step) < SLACK
    assert sizes[0] == sizes[1]


def test_a_reused_reverse_holds_flat_memory():
    n = 64
    x = np.linspace(0.1, 0.9, n)
    u, y = np.zeros(n), np.zeros(n)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(wave.bind(u=u, k=1.5, y=y), name="wave").build(record=True))
    rev = vkml.diff.Reverse(g)
    seeds = {"wave.y": np.ones(n)}
    grads = {}

    def sweep(i):
        k = 1.0 + i % 7
        g.update(k=k)
        g.launch()
        grads[k] = rev(g.record, seeds)["k"]
    assert _soak(2000, sweep) < SLACK
    for k, gk in grads.items():         # still the right gradient: d/dk sum sin(k x^2)
        np.testing.assert_allclose(gk, np.sum(np.cos(k * x * x) * x * x), rtol=1e-12)


def _dropped_jits(i, x, refs):
    def f(v):
        return v * float(i)             # a constant of its own: a program of its own
    jf = vkml.jit(f)
    assert jf(x).numpy()[0] == float(i)
    assert vkml.jit(f) is jf            # the same function while it lives
    refs.append((weakref.ref(f), weakref.ref(jf)))


def _executables() -> int:
    return vkml.runtime.current_backend().cache_size


def test_a_dropped_jitted_function_is_freed_with_its_programs(limit):
    x = vkml.tensor(np.ones(3, np.float32))
    refs = []
    gc.collect()
    jitted_before = vkml.stats().caches.get("jit programs", 0)
    growth = _soak(1500, lambda i: _dropped_jits(i, x, refs))
    gc.collect()
    assert [r for r in refs if r[0]() is not None or r[1]() is not None] == []
    assert growth < SLACK
    caches = vkml.stats().caches
    assert caches.get("jit programs", 0) <= jitted_before and _executables() <= limit


def test_other_jitted_callables_are_freed_too():
    class Model:
        def __init__(self):
            self.scale = 2.0

        def forward(self, v):
            return v * self.scale

        def __call__(self, v):
            return v + self.scale
    x = vkml.tensor(np.ones(2, np.float32))
    model = Model()
    bound, called = vkml.jit(model.forward), vkml.jit(model)
    assert bound(x).numpy().tolist() == [2.0, 2.0] and called(x).numpy().tolist() == [3.0, 3.0]
    assert vkml.jit(model) is called    # found again while it lives
    step = optim.SGD([vkml.tensor(np.ones(2, np.float32), requires_grad=True)], lr=0.1)
    compiled = step.compile_step(lambda: (step.params[0] * step.params[0]).sum())
    compiled()
    alive = [weakref.ref(o) for o in (model, bound, called, compiled)]
    del model, bound, called, compiled, step
    gc.collect()
    assert [r for r in alive if r() is not None] == []


def test_every_cache_is_bounded_by_the_limit(limit):
    jf = vkml.jit(lambda v: vkml.sin(v) * 2.0)
    gf = vkml.grad(lambda v: vkml.sum(vkml.sin(v)))
    for n in range(1, 3 * limit):
        x = np.linspace(0, 1, n).astype(np.float32)
        jf(x)
        gf(x)
        w = vkml.tensor(x, requires_grad=True)
        vkml.backward((w * w).sum())              # the lazy graph and its backward, per shape
    caches = vkml.stats().caches
    backend = vkml.backend_info()["backend"]
    # each cache is bounded; "jit programs" sums the caches of every jitted function alive
    assert all(caches[name] == limit for name in (f"{backend} executables", "derived programs",
                                                 "backward programs")), caches
    assert _executables() == limit
    assert jf.cache_info()["keys"] == limit
    before = vkml.stats()
    jf(np.linspace(0, 1, 3 * limit - 1).astype(np.float32))     # recent: still cached
    assert (vkml.stats() - before).traces == 0
    jf(np.linspace(0, 1, 1).astype(np.float32))                 # least recent: dropped, traced again
    assert (vkml.stats() - before).traces == 1


def test_lowering_the_limit_trims_at_once_and_bad_limits_change_nothing(limit):
    jf = vkml.jit(lambda v: v + 1.0)
    for n in range(1, 20):
        jf(np.zeros(n, np.float32))
    assert jf.cache_info()["keys"] == 19
    vkml.set_cache_limit(5)
    assert jf.cache_info()["keys"] == 5 and _executables() <= 5
    for bad in (0, -3, 2.5, "10", None, True):
        with pytest.raises(vkml.ArgumentError, match="set_cache_limit"):
            vkml.set_cache_limit(bad)
    assert vkml.cache_limit() == 5


def test_clear_caches_empties_every_cache_and_the_next_call_traces_and_compiles_again():
    def f(v):
        return vkml.sum(vkml.tanh(v) * v)
    jf, gf = vkml.jit(f), vkml.grad(f)
    x = np.linspace(-1, 1, 5).astype(np.float32)

    def everything():
        w = vkml.tensor(x, requires_grad=True)
        vkml.backward(f(w))
        return [jf(x).numpy().tobytes(), gf(x).numpy().tobytes(), w.grad.numpy().tobytes()]
    first = everything()
    assert everything() == first
    # every cache this test fills (another backend made by an earlier test keeps an empty one)
    current = f"{vkml.backend_info()['backend']} executables"
    filled = {k for k, v in vkml.stats().caches.items() if v}
    assert {"backward programs", "derived programs", "jit programs", current} <= filled
    vkml.clear_caches()
    assert set(vkml.stats().caches.values()) == {0}
    assert jf.cache_info()["keys"] == 0
    before = vkml.stats()
    assert everything() == first                    # same bits, made again
    again = vkml.stats() - before
    assert again.traces >= 1 and again.derivations >= 2 and again.compiles >= 3
    before = vkml.stats()
    everything()
    assert (vkml.stats() - before).compiles == 0 and (vkml.stats() - before).traces == 0


def test_the_limit_comes_from_the_environment_and_shows_in_vkml_info():
    code = "import vkml; print(vkml.cache_limit())"
    env = dict(os.environ, VKML_CACHE_LIMIT="7", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "7", out.stderr
    del env["VKML_CACHE_LIMIT"]
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "1024", out.stderr
    from vkml_jupyter.magics import info_text
    vkml.jit(lambda v: v * 3.0)(np.ones(2, np.float32))
    line = next(l for l in info_text().splitlines() if l.startswith("caches"))
    assert f"at most {vkml.cache_limit()} entries" in line and "numpy executables" in line


@vkml.kernel
def halve(x):
    return {"y": x * 0.5}


def test_a_kernel_launched_on_many_sample_counts_keeps_a_bounded_cache(limit):
    for n in range(1, 3 * limit):
        x, y = np.arange(n, dtype=np.float64), np.zeros(n)
        halve.bind(x=x, y=y).launch()           # a launch outside a graph: batched per count
        np.testing.assert_array_equal(y, x * 0.5)
    assert vkml.stats().caches["kernel batches"] <= limit
    vkml.clear_caches()
    assert vkml.stats().caches.get("kernel batches", 0) == 0
