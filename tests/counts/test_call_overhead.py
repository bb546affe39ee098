"""What the shortcuts of small calls save, counted (never timed), and that each gives the bits,
results and errors of the long way.

- a jitted call whose arrays are contiguous hands them to the compiled function without
  checking them again (its plan knows their types and strides);
- ``grad``/``value_and_grad`` of a jitted function with plain arguments is one submission (the
  known part and the transposed part in one program), copies no argument, and hands back
  results that survive the next call;
- arming Ctrl-C around a long compiled call reads the Python handler once, never through
  ``signal.getsignal`` (which raises and catches an error inside for a function handler), and a
  short scan is not armed at all;
- a graph's fused reverse puts its Gradients together from a recipe made once per plan: the same
  names, order, shared arrays, Param parts and bits as the launch-by-launch sweep; a chunked one
  allocates its gradient and a few small objects, nothing per chunk.
"""

import signal

import numpy as np
import pytest

import vkml
from vkml.backends import cpu, interrupts
from backends_under_test import BACKENDS
from test_graph_allocations import call_peak   # one call's tracemalloc peak, collector off
from test_pictures import running_sum as running_sum_loss   # the tutorial's running-sum scan

needs_cc = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def want_running_sum_grad(xs):
    return 2 * np.cumsum(np.cumsum(xs)[::-1])[::-1]


# -- jitted tiny calls ------------------------------------------------------------------------------

@needs_cc
def test_a_call_with_contiguous_arrays_skips_the_argument_checks(on_cpu, monkeypatch):
    f = vkml.jit(lambda x, y: x * y + 1.0)
    a, b = np.linspace(0.0, 1.0, 8), np.linspace(1.0, 2.0, 8)
    for _ in range(3):                            # NumPy first, then compiled; the plan made
        f(a, b)
    checked = []
    plain_call = cpu.CompiledProgram.__call__
    monkeypatch.setattr(cpu.CompiledProgram, "__call__",
                        lambda self, *args, **kw: checked.append(1) or plain_call(self, *args, **kw))
    before = vkml.stats()
    got = f(a, b).numpy()
    assert (vkml.stats() - before).submissions == 1 and checked == []
    assert got.tobytes() == (a * b + 1.0).tobytes()
    # strided arrays are another key: that plan goes through the checks (and copies them)
    wide = np.linspace(0.0, 1.0, 16)
    for _ in range(2):
        strided = f(wide[::2], b).numpy()
    assert checked and strided.tobytes() == (wide[::2] * b + 1.0).tobytes()


# -- gradients of jitted functions ------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_value_and_grad_of_a_jitted_scan_is_one_submission(backend, monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        # (a function of this test's own: vkml.jit caches its Jitted per function, and another
        # test file in this process may have traced running_sum already)
        vg = vkml.value_and_grad(vkml.jit(lambda xs: running_sum_loss(xs)))
        xs = np.random.default_rng(0).normal(size=300)
        value, grad = vg(xs)                      # the long way: two submissions
        first = (value.numpy().tobytes(), grad.numpy().tobytes())
        counts = []
        for _ in range(3):
            before = vkml.stats()
            value, grad = vg(xs)
            d = vkml.stats() - before
            counts.append((d.submissions, d.traces, d.derivations))
            assert (value.numpy().tobytes(), grad.numpy().tobytes()) == first
        assert counts == [(1, 0, 0)] * 3
        np.testing.assert_allclose(grad.numpy(), want_running_sum_grad(xs), rtol=1e-12)
        assert vg.cache_info()["traces"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_with_aux_and_two_argnums_takes_one_submission_with_the_same_results(
        backend, monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))

    def f(w, x, scale):
        y = vkml.sin(w * x) * scale
        return vkml.sum(y * y), y

    with vkml.use_backend(backend):
        g = vkml.grad(vkml.jit(f), argnums=(0, 2), has_aux=True)
        w, x, s = np.linspace(0.1, 1.0, 5), np.linspace(-1.0, 1.0, 5), np.array(0.5)
        (gw, gs), aux = g(w, x, s)
        first = [gw.numpy().tobytes(), gs.numpy().tobytes(), aux.numpy().tobytes()]
        before = vkml.stats()
        (gw, gs), aux = g(w, x, s)
        assert (vkml.stats() - before).submissions == 1
        assert [gw.numpy().tobytes(), gs.numpy().tobytes(), aux.numpy().tobytes()] == first
        # d/dw sum((sin(w x) s)^2) = 2 s^2 sin(w x) cos(w x) x
        np.testing.assert_allclose(gw.numpy(), 2 * s * s * np.sin(w * x) * np.cos(w * x) * x,
                                   rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_is_never_the_callers_array_and_survives_the_next_call(backend, monkeypatch,
                                                                          tmp_path):
    """``f(x) = sum(x)`` has the gradient ones and ``aux = x`` is the argument itself: neither
    may be (a view of) the caller's array, and a result held across the next call keeps its
    values."""
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        vg = vkml.value_and_grad(vkml.jit(lambda x: (vkml.sum(x * 2.0), x)), has_aux=True)
        x = np.arange(4.0)
        for _ in range(3):
            (_, aux), grad = vg(x)
        held = grad.numpy().copy()
        x2 = np.arange(4.0) + 10.0
        (_, aux2), grad2 = vg(x2)
        x2[:] = -1.0
        assert np.array_equal(grad.numpy(), held) and np.array_equal(grad2.numpy(), held)
        assert aux2.numpy().tolist() == [10.0, 11.0, 12.0, 13.0]
        assert not np.may_share_memory(aux2.numpy(), x2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_plan_follows_clear_caches_tensor_arguments_and_new_shapes(backend, monkeypatch,
                                                                            tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        vg = vkml.value_and_grad(vkml.jit(lambda xs: running_sum_loss(xs)))    # never traced yet
        xs = np.linspace(-1.0, 1.0, 64)
        before = vkml.stats()
        vg(xs)
        first_traces = (vkml.stats() - before).traces        # the function's and its scan step's
        vg(xs)
        vkml.clear_caches()                       # the plan's program is gone: traced again
        before = vkml.stats()
        _, grad = vg(xs)
        assert (vkml.stats() - before).traces == first_traces >= 1
        np.testing.assert_allclose(grad.numpy(), want_running_sum_grad(xs), rtol=1e-12)
        t = vkml.tensor(xs)                       # a Tensor with a value: a plan of its own
        for _ in range(2):
            before = vkml.stats()
            _, grad = vg(t)
        assert (vkml.stats() - before).submissions == 1
        np.testing.assert_allclose(grad.numpy(), want_running_sum_grad(xs), rtol=1e-12)
        for n in (10, 11, 10):                    # another shape, another key; back again
            ys = np.linspace(0.0, 1.0, n)
            np.testing.assert_allclose(vg(ys)[1].numpy(), want_running_sum_grad(ys), rtol=1e-12)
        needs = vkml.tensor(xs, requires_grad=True)    # the long way: a lazy call, autograd on
        value, grad = vg(needs)
        np.testing.assert_allclose(grad.numpy(), want_running_sum_grad(xs), rtol=1e-12)


@needs_cc
def test_a_steady_value_and_grad_copies_no_argument(on_cpu):
    vg = vkml.value_and_grad(vkml.jit(running_sum_loss))
    xs = np.random.default_rng(1).normal(size=100_000)
    for _ in range(3):
        vg(xs)                                    # results dropped: their arrays are reused
    peak = call_peak(lambda: vg(xs)[1].numpy()[0])
    assert peak < xs.nbytes // 4, peak


# -- arming Ctrl-C ------------------------------------------------------------------------------------

@needs_cc
def test_an_armed_call_reads_the_handler_once_and_a_short_scan_is_not_armed(on_cpu, monkeypatch):
    if interrupts._library() is None:
        pytest.skip("no interrupt helper library here")
    vg = vkml.value_and_grad(vkml.jit(running_sum_loss))
    long_xs = np.linspace(-1.0, 1.0, 2 * cpu.SHORT_WORK)      # more work than SHORT_WORK: armed
    short_xs = np.linspace(-1.0, 1.0, 1000)                  # far less: never armed
    for xs in (long_xs, short_xs):
        vg(xs), vg(xs)
    reads, getsignal_calls = [], []
    read = interrupts.python_handler
    monkeypatch.setattr(interrupts, "python_handler", lambda: reads.append(1) or read())
    monkeypatch.setattr(signal, "getsignal", lambda *a: getsignal_calls.append(a) or
                        pytest.fail("signal.getsignal called by an armed call"))
    for xs, armed in ((long_xs, 3), (short_xs, 0)):
        del reads[:]
        for _ in range(3):
            np.testing.assert_allclose(vg(xs)[1].numpy(), want_running_sum_grad(xs), rtol=1e-9)
        assert len(reads) == armed and getsignal_calls == []
    assert signal.default_int_handler is read()            # nothing left installed


# -- graph reverse --------------------------------------------------------------------------------------

@vkml.kernel
def square(x, k: vkml.Param):
    return {"u": k * x * x}


@vkml.kernel
def poly(u, w, k: vkml.Param):
    return {"y": (k * u * u - w * u) / (u + 2.0)}


def shared_param_graph(n):
    """Two nodes sharing the Param name ``k`` (its gradient folds two parts) and two inputs."""
    x, w = np.linspace(0.1, 0.9, n), np.linspace(1.0, -1.0, n)
    u, y = np.zeros(n), np.zeros(n)
    g = (vkml.Graph().add(square.bind(x=x, k=0.5, u=u), name="square")
         .add(poly.bind(u=u, w=w, k=1.5, y=y), name="poly").build(record=True))
    return g, np.linspace(-1.0, 2.0, n)


def reversed_twice(n):
    g, seed = shared_param_graph(n)
    rev = vkml.diff.Reverse(g)
    out = []
    for _ in range(2):
        g.launch()
        out.append(rev(g.record, {"y": seed}))
    return out


@pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("n", [1000, 70_000])
def test_a_fused_reverse_hands_back_what_the_launch_by_launch_sweep_does(vk_backend, n,
                                                                        monkeypatch):
    fused = reversed_twice(n)                     # one thread: one program (over chunks above 2^15)
    monkeypatch.setenv("VKML_THREADS", "2")
    swept = reversed_twice(n)                     # launch by launch, with the workspace
    for a, b in zip(fused, swept):
        assert list(a) == list(b)
        assert a.report.bitwise == b.report.bitwise
        for name in a:
            assert np.asarray(a[name]).tobytes() == np.asarray(b[name]).tobytes(), name
        assert a["x"] is a["square.x"] and a["w"] is a["poly.w"]
        assert {k: [o for o, _ in v] for k, v in a.parts.items()} == \
            {k: [o for o, _ in v] for k, v in b.parts.items()}
        assert len(a.parts[("square", "k")]) == len(a.parts[("poly", "k")]) == 1
    np.testing.assert_allclose(fused[0]["k"], fused[0]["square.k"] + fused[0]["poly.k"],
                               rtol=1e-12)


@needs_cc
def test_a_chunked_reverse_allocates_its_gradients_and_nothing_per_chunk(on_cpu):
    """Ten chunks or forty: the same few small objects above the two gradients it hands back."""
    extra = {}
    for chunks in (10, 40):
        n = chunks << 15
        g, seed = shared_param_graph(n)
        rev = vkml.diff.Reverse(g)
        for _ in range(2):
            g.launch()
            rev(g.record, {"y": seed})
        g.launch()
        extra[chunks] = call_peak(lambda: rev(g.record, {"y": seed})) - 2 * n * 8
    assert 0 <= extra[10] < 32 * 1024 and 0 <= extra[40] < 32 * 1024, extra
