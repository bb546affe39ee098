"""What the fast paths of a call save, counted (never timed): buffers allocated per call of a
compiled executable, submissions and traces per call, and that every shortcut gives the bits
and the errors of the full path.

- a compiled (cpu tier) executable reuses its outputs once the caller dropped them, keeps a
  spare for a result held one call longer (an optimiser's parameters), never writes into an
  array anyone still holds, and keeps its heap temporaries in one scratch block;
- a jitted call with plain arguments (NumPy arrays, Tensors with values) takes a prepared
  plan: one submission, no trace, the full path's results and errors, a result never a view of
  the caller's (mutable) array, and clearing the caches traces again;
- a training step's submissions stay constant per step.
"""

import threading

import numpy as np
import pytest

import vkml
from vkml.backends import cpu

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def _compiled(jitted):
    """The compiled C executable behind a jitted function's only variant."""
    (entry,) = jitted._entries.values()
    (exe,) = entry.executables.values()
    exe = getattr(exe, "current", exe)
    assert isinstance(exe, cpu.CompiledProgram), type(exe)
    return exe


def test_a_steady_call_whose_result_was_dropped_allocates_nothing(on_cpu):
    f = vkml.jit(lambda x, y: x * y + 1.0)
    x, y = np.linspace(0, 1, 1000), np.linspace(1, 2, 1000)
    want = x * y + 1.0
    f(x, y), f(x, y)                            # on NumPy first, then compiled
    pool = _compiled(f)._pool
    before = pool.allocations
    for _ in range(10):
        assert np.array_equal(f(x, y).numpy(), want)     # each result dropped at once
    assert pool.allocations == before


def test_a_held_result_is_never_written_again(on_cpu):
    f = vkml.jit(lambda x: x * 2.0)
    f(np.ones(8)), f(np.ones(8))
    pool = _compiled(f)._pool
    held = [f(np.full(8, float(k))) for k in range(5)]
    views = [h.numpy() for h in held]
    for _ in range(3):
        f(np.full(8, -1.0))
    assert [v.tolist() for v in views] == [[2.0 * k] * 8 for k in range(5)]
    raw = f(np.full(8, 7.0)).numpy()            # a view of the result outlives its Tensor
    f(np.full(8, 9.0))
    assert raw.tolist() == [14.0] * 8
    assert pool.allocations >= 5


def test_a_result_held_one_call_longer_uses_the_spare(on_cpu):
    """An optimiser's pattern: step k's values are held while step k+1 is computed from them,
    then dropped -- two buffers per output serve every step."""
    f = vkml.jit(lambda p: p * 0.5 + 1.0)
    p = vkml.tensor(np.zeros(4096))
    p, p = f(p), f(p)
    pool = _compiled(f)._pool
    for _ in range(3):
        p = f(p)
    before = pool.allocations
    want = p.numpy().copy()
    for _ in range(10):
        p = f(p)
        want = want * 0.5 + 1.0
    assert pool.allocations == before
    assert np.array_equal(p.numpy(), want)


def test_heap_temporaries_come_from_one_scratch_block(on_cpu):
    def body(xs):
        def step(c, x):
            c = c * 0.5 + x
            return c, c.sum()
        return vkml.scan(step, np.zeros(100), xs)
    f = vkml.jit(body)
    xs = np.random.default_rng(0).normal(size=(50, 100))
    f(xs)
    exe = _compiled(f)
    assert exe._pool.scratch_bytes > 0           # the 100-element carry lives on the heap
    fresh = [o.copy() for o in exe._call_fresh([xs], None)]
    before = exe._pool.allocations
    for _ in range(5):
        c2, s2 = f(xs)
        assert np.array_equal(c2.numpy(), fresh[0]) and np.array_equal(s2.numpy(), fresh[1])
        del c2, s2
    assert exe._pool.allocations == before and exe._pool.scratch is not None


def test_calls_from_two_threads_get_their_own_results(on_cpu):
    f = vkml.jit(lambda x: x * 3.0 - 1.0)
    f(np.ones(5000)), f(np.ones(5000))
    errors = []

    def work(k):
        x = np.full(5000, float(k))
        for _ in range(200):
            if not np.array_equal(f(x).numpy(), x * 3.0 - 1.0):
                errors.append(k)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_plain_call_is_one_submission_and_no_trace(backend, monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        f = vkml.jit(lambda x, y: (x + y, x * y))
        a, b = np.arange(4.0), np.ones(4)
        t = vkml.tensor(np.full(4, 2.0))
        full = [r.numpy().tobytes() for r in f(a, b)]
        for _ in range(3):
            f(a, b), f(a, t)
        before = vkml.stats()
        got = f(a, b)
        d = vkml.stats() - before
        assert (d.submissions, d.traces, d.compiles) == (1, 0, 0)
        assert [r.numpy().tobytes() for r in got] == full
        # a NumPy array and a Tensor of the same type make one key: one program, two plans
        assert f.cache_info()["traces"] == 1 and len(f._fast) == 2


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_result_is_never_a_view_of_the_callers_array(backend, monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        same, shaped = vkml.jit(lambda x: x), vkml.jit(lambda x: x.reshape(2, 2))
        for _ in range(3):
            a = np.arange(4.0)
            r1, r2 = same(a), shaped(a)
            a[:] = -5.0
            assert r1.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
            assert r2.numpy().tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_clearing_the_caches_traces_a_plain_call_again():
    f = vkml.jit(lambda x: x + 1.0)
    for _ in range(3):
        f(np.ones(3))
    vkml.clear_caches()
    before = vkml.stats()
    assert f(np.ones(3)).numpy().tolist() == [2.0] * 3
    assert (vkml.stats() - before).traces == 1


def test_the_matmul_mode_is_part_of_a_plain_calls_key():
    f = vkml.jit(lambda a, b: a @ b)
    a = np.random.default_rng(1).normal(size=(3, 5))
    for _ in range(2):
        f(a, a.T)
    with vkml.deterministic_matmul():
        before = vkml.stats()
        f(a, a.T)
        assert (vkml.stats() - before).traces == 1
    assert f.cache_info()["traces"] == 2


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_failing_plain_call_names_the_equation_as_the_full_path_does(backend, monkeypatch,
                                                                        tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        f = vkml.jit(lambda x, i: vkml.take(x, i) if hasattr(vkml, "take") else x[i])
        x = np.arange(5.0)
        f(x, np.array([0, 1])), f(x, np.array([1, 2]))
        messages = []
        for _ in range(2):              # the full path's plan exists: both take the fast path
            with pytest.raises(vkml.VkmlError) as err:
                f(x, np.array([0, 9]))
            messages.append(str(err.value))
        assert messages[0] == messages[1] and "9" in messages[0]


def _mlp(backend, steps, compiled):
    with vkml.use_backend(backend):
        vkml.nn.manual_seed(0)
        model = vkml.nn.Sequential(vkml.nn.Linear(300, 240), vkml.nn.ReLU(), vkml.nn.Linear(240, 10))
        opt = vkml.optim.Adam(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(0)
        x = vkml.tensor(rng.normal(size=(64, 300)).astype(np.float32))
        y = vkml.tensor(rng.integers(0, 10, 64))
        step = opt.compile_step(lambda x, y: vkml.nn.cross_entropy(model(x), y))
        counts = []
        for _ in range(steps):
            before = vkml.stats()
            if compiled:
                step(x, y)
            else:
                opt.zero_grad()
                vkml.nn.cross_entropy(model(x), y).backward()
                opt.step()
            counts.append((vkml.stats() - before).submissions)
        return [p.numpy().tobytes() for p in model.parameters()], counts


@pytest.mark.parametrize("compiled", [False, True])
def test_a_training_steps_submissions_are_constant(compiled, monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    _, counts = _mlp("cpu", 6, compiled)
    assert len(set(counts[1:])) == 1 and counts[-1] == (1 if compiled else 2), counts
