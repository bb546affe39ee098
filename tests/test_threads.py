"""Modes belong to their thread and task; shared caches compile each key once; same bits in threads.

Each training test runs its models one after another first, then at the same
time (threads, or asyncio tasks), and compares the bytes of every result: a
mode seen across threads (one thread's ``no_grad`` switching off another's
gradients, one thread's backend running another's work) would change a
result or raise.  A Barrier forces the threads to interleave; sleeps inside a
slowed compile only widen the window in which two threads could compile one
key twice -- nothing here measures time.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import vkml
from backends_under_test import BACKENDS
from vkml import optim

STEPS = 12
WORKERS = 4
#: a thread that failed leaves the others waiting at a Barrier: they give up after this long
#: (a guard against a hung test run, not a measurement)
STUCK = 120


_BARRIERS = []


def _barrier(n):
    barrier = threading.Barrier(n, timeout=STUCK)
    _BARRIERS.append(barrier)
    return barrier


def _data(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 5)).astype(np.float32)
    y = (x @ rng.standard_normal((5, 1))).astype(np.float32)
    params = [vkml.tensor(rng.standard_normal((5, 8)).astype(np.float32) * 0.3, requires_grad=True),
              vkml.tensor(np.zeros(8, np.float32), requires_grad=True),
              vkml.tensor(rng.standard_normal((8, 1)).astype(np.float32) * 0.3, requires_grad=True)]
    return x, y, params


def _loss(params, x, y):
    w1, b1, w2 = params
    h = vkml.tanh(vkml.matmul(x, w1) + b1)
    d = h @ w2 - y
    return (d * d).mean()


def _bytes(params, losses):
    return b"".join(p.numpy().tobytes() for p in params) + np.array(losses, np.float32).tobytes()


def _lazy_steps(seed, between=lambda: None):
    """Forward, backward, an evaluation under ``no_grad`` (a mode another thread must not see)
    and an Adam step, ``STEPS`` times; ``between()`` runs in the middle of each step."""
    x, y, params = _data(seed)
    opt = optim.Adam(params, lr=0.05)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = _loss(params, x, y)
        between()
        with vkml.no_grad():
            assert not _loss(params, x, y).requires_grad
            between()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return _bytes(params, losses)


def _compiled_steps(seed, between=lambda: None):
    x, y, params = _data(seed)
    opt = optim.Adam(params, lr=0.05)
    step = opt.compile_step(lambda x, y: _loss(params, x, y))
    losses = []
    for _ in range(STEPS):
        losses.append(step(x, y).item())
        between()
    return _bytes(params, losses)


def _in_threads(fn, n, *args):
    """``fn(i, *args)`` for i < n in n threads started together; results in order, errors raised."""
    results, errors = [None] * n, []
    start = _barrier(n)

    def run(i):
        try:
            start.wait()
            results[i] = fn(i, *args)
        except BaseException as err:      # noqa: BLE001  (reported to the test below)
            errors.append(err)
            for barrier in _BARRIERS:      # the others stop waiting for this one
                barrier.abort()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _BARRIERS.clear()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return results


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [_lazy_steps, _compiled_steps], ids=["lazy", "compile_step"])
def test_four_threads_train_separate_models_with_the_bits_of_a_serial_run(train, backend, monkeypatch):
    """On the cpu tier as users get it (``VKML_CPU_HOT=1``): the serial run's programs start on
    NumPy and switch to C when hot, the threads then run them in C -- the same bits, since every
    sum adds in the one canonical order on both tiers."""
    monkeypatch.setenv("VKML_CPU_HOT", "1")
    vkml.clear_caches()

    def on_backend(seed, between=lambda: None):
        with vkml.use_backend(backend):                      # a thread starts from the default
            return train(seed, between)
    serial = [on_backend(seed) for seed in range(WORKERS)]
    assert len(set(serial)) == WORKERS                       # four different models
    rounds = _barrier(WORKERS)

    def worker(i):
        return on_backend(i, between=lambda: rounds.wait())  # every step interleaves with the others
    for _ in range(3):
        assert _in_threads(worker, WORKERS) == serial


@pytest.mark.parametrize("train", [_lazy_steps, _compiled_steps], ids=["lazy", "compile_step"])
def test_asyncio_tasks_train_separate_models_with_the_bits_of_a_serial_run(train):
    """Tasks switch at every ``await``, here inside the ``no_grad`` evaluation: the other tasks
    run while one is in it and must keep recording their gradients."""
    serial = [train(seed) for seed in range(WORKERS)]

    async def task(seed):
        # the same steps, written as a coroutine that yields in the middle of each one
        x, y, params = _data(seed)
        opt = optim.Adam(params, lr=0.05)
        losses = []
        if train is _compiled_steps:
            step = opt.compile_step(lambda x, y: _loss(params, x, y))
            for _ in range(STEPS):
                losses.append(step(x, y).item())
                await asyncio.sleep(0)
            return _bytes(params, losses)
        for _ in range(STEPS):
            opt.zero_grad()
            loss = _loss(params, x, y)
            await asyncio.sleep(0)
            with vkml.no_grad():
                await asyncio.sleep(0)
                assert not vkml.is_grad_enabled()
            assert vkml.is_grad_enabled()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return _bytes(params, losses)

    async def main():
        return await asyncio.gather(*[task(seed) for seed in range(WORKERS)])
    assert asyncio.run(main()) == serial


def test_modes_set_in_one_thread_are_never_seen_in_another():
    """Six threads, each changing or checking its own mode in lock step, many rounds."""
    rounds = 1000
    barrier = _barrier(6)
    seen = []

    def check(ok, what):
        if not ok:
            seen.append(what)

    def no_grad_thread(_):
        for _ in range(rounds):
            with vkml.no_grad():
                barrier.wait()
                check(not vkml.is_grad_enabled(), "no_grad thread records gradients")
                barrier.wait()

    def grad_thread(_):
        x = vkml.tensor(np.ones(3, np.float32), requires_grad=True)
        for _ in range(rounds):
            barrier.wait()
            check(vkml.is_grad_enabled() and (x * 2).requires_grad, "grad thread lost gradients")
            barrier.wait()

    def eager_thread(_):
        for _ in range(rounds):
            with vkml.eager():
                barrier.wait()
                y = vkml.tensor(np.ones(2, np.float32)) + 1
                check(vkml.is_eager() and y.ir_var.value is not None, "eager thread ran lazily")
                barrier.wait()

    def lazy_thread(_):
        for _ in range(rounds):
            barrier.wait()
            y = vkml.tensor(np.ones(2, np.float32)) + 1
            check(not vkml.is_eager() and y.ir_var.value is None, "lazy thread ran eagerly")
            barrier.wait()

    def backend_thread(name):
        def run(_):
            for _ in range(rounds):
                vkml.set_backend(name)          # a global call, made in each round by both threads
                barrier.wait()
                check(vkml.runtime.current_backend().name == name, f"{name} thread saw another")
                barrier.wait()
        return run
    roles = [no_grad_thread, grad_thread, eager_thread, lazy_thread, backend_thread("numpy"),
             backend_thread("cpu")]
    _in_threads(lambda i: roles[i](i), len(roles))
    assert not seen, f"{len(seen)} rounds saw another thread's mode, e.g. {seen[0]}"


def test_use_backend_is_local_and_a_new_thread_starts_from_the_process_default():
    vkml.set_backend("numpy")
    with vkml.use_backend("cpu"):
        assert vkml.backend_info()["backend"] == "cpu"
        other = _in_threads(lambda i: vkml.backend_info()["backend"], 1)
        assert other == ["numpy"]           # the block is this thread's only
    assert vkml.backend_info()["backend"] == "numpy"
    vkml.set_backend("cpu")                 # global calls: threads started later follow them
    vkml.set_eager(True)
    try:
        with vkml.no_grad():                # a block: not for the threads it starts
            started = _in_threads(lambda i: (vkml.backend_info()["backend"], vkml.is_eager(),
                                             vkml.is_grad_enabled()), 2)
        assert started == [("cpu", True, True)] * 2
    finally:
        vkml.set_eager(False)
        vkml.set_backend("numpy")
    assert _in_threads(lambda i: (vkml.backend_info()["backend"], vkml.is_eager()), 1) == \
        [("numpy", False)]
    with pytest.raises(vkml.BackendError, match="use_backend"):
        vkml.use_backend(3)                 # refused at the call, before any block


def test_an_asyncio_task_inherits_its_creators_modes_and_keeps_its_own():
    async def inner():
        return vkml.is_grad_enabled(), vkml.is_eager()

    async def main():
        with vkml.no_grad(), vkml.eager():
            child = asyncio.ensure_future(inner())     # created inside: a copy of these modes
        outside = asyncio.ensure_future(inner())
        return await child, await outside
    assert asyncio.run(main()) == ((False, True), (True, False))


@pytest.fixture
def slow_compiles(monkeypatch):
    """Every compile on the NumPy backend takes a while, so threads that want one key at once
    overlap inside it (without the cache's per-key wait, each would compile it)."""
    backend = vkml.runtime.current_backend()
    compile_ = backend._compile

    def slow(program):
        time.sleep(0.02)
        return compile_(program)
    monkeypatch.setattr(backend, "_compile", slow)
    return backend


def test_threads_asking_for_one_new_key_at_once_compile_it_once(slow_compiles):
    n = 8
    data = np.arange(7, dtype=np.float32)

    def lazy(i):
        return (vkml.tensor(data) * 3.0 + 1.0).sum().item()     # one structure, one new key
    before = vkml.stats()
    assert _in_threads(lazy, n) == [lazy(0)] * n
    assert (vkml.stats() - before).compiles == 1

    def f(x):
        return vkml.sin(x) * 2.0
    jf = vkml.jit(f)
    before = vkml.stats()
    outs = _in_threads(lambda i: jf(data).numpy().tobytes(), n)
    assert len(set(outs)) == 1
    assert (vkml.stats() - before).compiles == 1 and jf.cache_info()["compiles"] == 1


def test_threads_deriving_one_gradient_at_once_derive_and_compile_it_once(slow_compiles):
    def loss(w, x):
        return vkml.sum(vkml.tanh(x * w) ** 2)

    def grads(shape, n):
        g = vkml.grad(loss)
        x = np.linspace(-1, 1, shape[0]).astype(np.float32)
        w = np.float32(0.5)
        before = vkml.stats()
        outs = _in_threads(lambda i: g(w, x).numpy().tobytes(), n)
        assert len(set(outs)) == 1
        return vkml.stats() - before
    alone = grads((9,), 1)                   # a shape of its own: derives and compiles from scratch
    together = grads((11,), 8)
    assert alone.derivations > 0 and alone.compiles > 0
    assert together.derivations == alone.derivations and together.compiles == alone.compiles


def test_a_graph_split_over_worker_threads_runs_on_the_callers_backend(monkeypatch):
    """``VKML_THREADS`` workers run a launch's parts with the modes of the thread that launched it."""
    @vkml.kernel
    def double(x):
        return {"y": x * 2.0}
    n = 2048
    x, y = np.linspace(0, 1, n), np.zeros(n)
    g = vkml.Graph().add(double.bind(x=x, y=y), name="double").build()
    monkeypatch.setenv("VKML_THREADS", "4")
    ran_on = set()
    for name in ("numpy", "cpu"):
        with vkml.use_backend(name) as backend:
            run = type(backend).run

            def spy(self, *args, run=run, **kwargs):
                ran_on.add((self.name, threading.current_thread().name.startswith("vkml")))
                return run(self, *args, **kwargs)
            monkeypatch.setattr(type(backend), "run", spy)
            g.launch()
            np.testing.assert_array_equal(y, x * 2.0)
    assert ("cpu", True) in ran_on and ("numpy", True) in ran_on


def test_mode_state_is_reached_only_through_the_runtime():
    """Modes live in per-thread variables that only their owners touch; every other module asks
    ``vkml.runtime`` (a module writing one directly would bypass the per-thread rules)."""
    import pathlib
    import re
    root = pathlib.Path(vkml.__file__).parent
    owners = {"runtime.py": (), "ops/core.py": ("CURRENT_SITE",),
              "ops/operands.py": ("DEFAULT_DEVICE",), "backends/base.py": ("_CURRENT", "DEFAULT_DEVICE")}
    state = ["_GRAD_LEAVES", "_GRAD_ENABLED", "_EAGER", "CURRENT_SITE", "DEFAULT_DEVICE",
             "_CURRENT", "_submit", "_settle", "_is_traced"]
    files = list(root.rglob("*.py")) + list((root.parent.parent / "extensions").rglob("*.py"))
    found = []
    for path in files:
        rel = path.relative_to(root).as_posix() if root in path.parents else path.name
        if rel == "runtime.py":
            continue
        text = path.read_text()
        for name in state:
            if name not in owners.get(rel, ()) and re.search(rf"\b{name}\b", text):
                found.append(f"{rel}: {name}")
    assert not found, found


def test_manual_seed_is_per_thread_so_models_built_side_by_side_match_a_serial_build():
    # thread A seeds, then B seeds, then A draws, then B draws: with one shared generator B's
    # seed would reset A's stream and the two models would differ
    import vkml.nn as nn
    nn.manual_seed(7)
    serial = nn.Linear(5, 3).weight.numpy()
    turn = [threading.Barrier(2) for _ in range(3)]
    got = {}

    def build(name, first):
        if first:
            nn.manual_seed(7)
        turn[0].wait()
        if not first:
            nn.manual_seed(7)
        turn[1].wait()
        if first:
            got[name] = nn.Linear(5, 3).weight.numpy()
        turn[2].wait()
        if not first:
            got[name] = nn.Linear(5, 3).weight.numpy()

    threads = [threading.Thread(target=build, args=("a", True)),
               threading.Thread(target=build, args=("b", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert np.array_equal(got["a"], serial) and np.array_equal(got["b"], serial)
    # a thread that never seeds draws from the latest seeded default, as before
    nn.manual_seed(3)
    expected = np.random.default_rng(3).uniform(-1 / np.sqrt(5), 1 / np.sqrt(5), size=(3, 5))
    drawn = {}
    t = threading.Thread(target=lambda: drawn.update(w=nn.Linear(5, 3).weight.numpy()))
    t.start()
    t.join()
    assert np.allclose(drawn["w"], expected.astype(drawn["w"].dtype))
