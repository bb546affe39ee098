"""The cpu tier's graph programs with glibc's vector math (libmvec).

A graph's launch and reverse are programs over every sample; on the cpu tier their elementwise
loops call sin/cos/exp/log/tanh in libmvec's vector versions, a few ulps from scalar libm and
from NumPy.  What must hold: a sample's bits never depend on where it sits -- the number of
samples (a loop's last, partial vector), the threads a launch is split over -- and the reverse
stays within a few ulps of the NumPy backend, agreeing with central finite differences and with
HIPS autograd.  ``VKML_VECTOR_MATH=0`` gives the scalar libm of before, bit for bit; so does the
check of the built library when a call came out scalar even through lane functions (where only
a block's loop stayed scalar, its calls go through lane functions: still the vector versions).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
import vkml.numpy as vnp
import vkml.scipy.special as vsp
from vkml.backends import cpu
from vkml.backends.codegen.vector_nests import SIMD_MARKER
from models import square

needs_libmvec = pytest.mark.skipif(not cpu.vector_math() or cpu.compiler() is None,
                                   reason="no C compiler or no glibc vector math (libmvec) here")

#: sample counts around the vector block (8) and the threads' chunks (256 * 2**q)
SIZES = (1, 2, 7, 8, 9, 15, 17, 255, 256, 257, 1000, 1001)
K = 1.3


@vkml.kernel
def mix(x, w, k: vkml.Param):
    """Every transcendental a graph kernel commonly holds, in one sample's function."""
    a = vkml.sin(k * x) * vkml.cos(w)
    b = vkml.exp(-x * x) + vkml.log(1.0 + w * w)
    return {"y": vkml.tanh(a + b)}


@vkml.kernel
def wave(y, k: vkml.Param):
    return {"z": vkml.sin(k * y) + y}


def mix_np(x, w, k, np_=np):
    """``mix`` then ``wave``, written again with NumPy (or autograd's NumPy)."""
    y = np_.tanh(np_.sin(k * x) * np_.cos(w) + np_.exp(-x * x) + np_.log(1.0 + w * w))
    return np_.sin(k * y) + y


def samples(n, dtype=np.float64):
    """The first ``n`` of one fixed set of samples: a sample is the same at every ``n``."""
    rng = np.random.default_rng(11)
    x, w = rng.uniform(-2.0, 2.0, 1001), rng.uniform(-3.0, 3.0, 1001)
    return x[:n].astype(dtype), w[:n].astype(dtype)


def run(n, dtype=np.float64, seed=None):
    """Launch the two-node graph over ``n`` samples and reverse it: ``(y, z, grads)``."""
    x, w = samples(n, dtype)
    y, z, k = np.zeros(n, dtype), np.zeros(n, dtype), np.asarray(K, dtype)
    g = (vkml.Graph().add(mix.bind(x=x, w=w, k=k, y=y), name="mix")
         .add(wave.bind(y=y, k=k, z=z), name="wave").build(record=True))
    g.launch()
    grads = vkml.diff.reverse(g.record, {"z": np.ones(n, dtype) if seed is None else seed})
    return y, z, {name: np.asarray(grads[name]) for name in ("x", "w", "mix.k", "wave.k")}


def graph_sources():
    """The C sources of the graph programs the cpu tier has built (launches and reverses)."""
    backend = vkml.backends.current()
    return [getattr(exe, "source", None) or "" for key, exe in backend._executables._data.items()
            if key[0] in cpu.GRAPH_PROGRAMS]


def scalar_libm(name):
    """glibc's scalar ``name`` (what the cpu tier called before), element by element."""
    fn = getattr(ctypes.CDLL(ctypes.util.find_library("m")), name)
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double]
    return np.vectorize(fn, otypes=[np.float64])


@needs_libmvec
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_samples_bits_do_not_depend_on_the_number_of_samples(on_cpu, dtype):
    full = run(1001, dtype)
    for n in SIZES:
        y, z, grads = run(n, dtype)
        assert y.tobytes() == full[0][:n].tobytes(), n
        assert z.tobytes() == full[1][:n].tobytes(), n
        for name in ("x", "w"):
            assert grads[name].tobytes() == full[2][name][:n].tobytes(), (n, name)
    sources = graph_sources()
    # the fused launch and reverse of every size, each with its vector blocks
    assert sum(SIMD_MARKER in s for s in sources) >= 2 * len(SIZES)


#: one kernel per libm function the graph programs call in vector versions, each written so that
#: its derivative holds a ``where`` around the call (pow's does: ``where(b == 0, 0, ...)``)
ONE_FUNCTION = {
    "exp": lambda x: vkml.exp(x * 0.7), "log": lambda x: vkml.log(vkml.abs(x) + 0.5),
    "sin": lambda x: vkml.sin(3.0 * x), "cos": lambda x: vkml.cos(3.0 * x),
    "tanh": lambda x: vkml.tanh(2.0 * x), "pow": lambda x: vkml.pow(vkml.abs(x) + 0.5, 1.7),
    "log1p": lambda x: vnp.log1p(vkml.abs(x)), "expm1": lambda x: vnp.expm1(x),
    "erf": lambda x: vsp.erf(x), "atan2": lambda x: vnp.arctan2(x, 1.5 - x),
    "relu of sin": lambda x: vkml.where(x > 0.3, vkml.sin(x), vkml.exp(x)),
}


@needs_libmvec
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(ONE_FUNCTION))
def test_every_vector_math_function_keeps_its_bits_at_every_n_one_included(on_cpu, name, dtype):
    fn = ONE_FUNCTION[name]

    @vkml.kernel
    def one(x):
        return {"y": fn(x)}

    def launch_and_reverse(x):
        y = np.zeros_like(x)
        g = vkml.Graph().add(one.bind(x=x, y=y), name="one").build(record=True)
        g.launch()
        return y, np.asarray(vkml.diff.reverse(g.record, {"one.y": np.ones_like(x)})["x"])

    x = np.random.default_rng(5).uniform(-3.0, 3.0, 40).astype(dtype)
    y40, g40 = launch_and_reverse(x.copy())
    for n in (1, 2, 3, 9):
        for start in range(0, 40 - n + 1, n):
            y, g = launch_and_reverse(x[start:start + n].copy())
            assert y.tobytes() == y40[start:start + n].tobytes(), (n, start)
            assert g.tobytes() == g40[start:start + n].tobytes(), (n, start)


@needs_libmvec
def test_a_samples_bits_do_not_depend_on_the_threads(on_cpu, monkeypatch):
    """Two threads split the samples into chunks of 512 (each its own program, of its own
    length): the same bits as one fused program over all of them."""
    one = run(1001)
    monkeypatch.setenv("VKML_THREADS", "2")
    two = run(1001)
    for a, b in zip(one[:2], two[:2]):
        assert a.tobytes() == b.tobytes()
    for name in one[2]:
        assert one[2][name].tobytes() == two[2][name].tobytes(), name


@needs_libmvec
def test_a_samples_bits_do_not_depend_on_the_reverses_chunks(on_cpu, monkeypatch):
    """A reverse over more samples than FUSE_SAMPLES runs its program over aligned chunks (here
    of 256, the last one of 233): the same bits as one program over all of them."""
    whole = run(1001)
    monkeypatch.setattr(vkml.graph.graph_reverse, "FUSE_SAMPLES", 256)
    chunked = run(1001)
    sizes = {key[1].inputs[0].shape[0] for key in vkml.backends.current()._executables._data
             if key[0] == "graph-reverse"}
    assert {256, 233} <= sizes
    for name in whole[2]:
        assert whole[2][name].tobytes() == chunked[2][name].tobytes(), name


@needs_libmvec
def test_per_sample_vectors_keep_their_bits_too(on_cpu):
    """A plane of 3 values per sample: the loop runs over n * 3 elements, still in blocks."""
    @vkml.kernel
    def spin(v, k: vkml.Param):
        return {"s": vkml.sin(k * v) * vkml.exp(-v)}
    rng = np.random.default_rng(3)
    base = rng.uniform(-1, 1, (1001, 3))
    outs = {}
    for n in (1, 2, 3, 333, 1001):
        s = np.zeros((n, 3))
        g = vkml.Graph().add(spin.bind(v=base[:n].copy(), k=0.7, s=s), name="spin").build(record=True)
        g.launch()
        outs[n] = (s, np.asarray(vkml.diff.reverse(g.record, {"s": np.ones((n, 3))})["v"]))
    for n, (s, gv) in outs.items():
        assert s.tobytes() == outs[1001][0][:n].tobytes(), n
        assert gv.tobytes() == outs[1001][1][:n].tobytes(), n
    assert any(SIMD_MARKER in s for s in graph_sources())


def test_gradients_agree_with_finite_differences_and_autograd(on_cpu):
    n = 257
    x, w = samples(n)
    seed = np.random.default_rng(5).uniform(0.5, 1.5, n)
    _, z, grads = run(n, seed=seed)
    np.testing.assert_allclose(z, mix_np(x, w, K), rtol=1e-13, atol=1e-15)

    def loss(x_, w_, k1, k2):
        y = anp.tanh(anp.sin(k1 * x_) * anp.cos(w_) + anp.exp(-x_ * x_) + anp.log(1.0 + w_ * w_))
        return anp.sum(seed * (anp.sin(k2 * y) + y))
    want = [autograd.grad(loss, i)(x, w, K, K) for i in range(4)]
    for got, oracle in zip([grads["x"], grads["w"], grads["mix.k"], grads["wave.k"]], want):
        np.testing.assert_allclose(got, oracle, rtol=1e-12, atol=1e-14)
    h = 1e-6          # central differences, per sample (samples are independent)
    for name, bump in (("x", lambda d: (x + d, w)), ("w", lambda d: (x, w + d))):
        fd = seed * (mix_np(*bump(h), K) - mix_np(*bump(-h), K)) / (2 * h)
        np.testing.assert_allclose(grads[name], fd, rtol=1e-6, atol=1e-8)
    fd_k = (loss(x, w, K + h, K) - loss(x, w, K - h, K)) / (2 * h)
    np.testing.assert_allclose(grads["mix.k"], fd_k, rtol=1e-6)


def test_within_a_few_ulps_of_the_numpy_backend(on_cpu):
    """A few ulps of the terms (of size about 1: y is a tanh of a sum that may cancel)."""
    y, z, grads = run(1001)
    with vkml.use_backend("numpy"):
        want = run(1001)
    eps = np.finfo(np.float64).eps
    np.testing.assert_allclose(y, want[0], rtol=4 * eps, atol=4 * eps)
    np.testing.assert_allclose(z, want[1], rtol=8 * eps, atol=8 * eps)
    for name in grads:
        np.testing.assert_allclose(grads[name], want[2][name], rtol=1e-12, atol=1e-14, err_msg=name)


@vkml.kernel
def sine(u, k: vkml.Param):
    return {"y": vkml.sin(k * u)}


def sine_graph(n=1001):
    """The two-node graph of the tutorial: ``y = sin(k * x * x)``, launched; ``(x, y)``."""
    x = np.linspace(-3.0, 3.0, n)
    u, y = np.zeros(n), np.zeros(n)
    g = (vkml.Graph().add(square.bind(x=x, u=u), name="square")
         .add(sine.bind(u=u, k=K, y=y), name="sine").build(record=True))
    g.launch()
    return x, y


def test_vector_math_off_gives_scalar_libm_bit_for_bit(on_cpu, monkeypatch):
    """Set after graphs were built with vector math (the same kernels batched before): a graph
    built now calls glibc's scalar sin, the bits of before."""
    sine_graph()
    monkeypatch.setenv("VKML_VECTOR_MATH", "0")
    x, y = sine_graph()
    assert y.tobytes() == scalar_libm("sin")(K * (x * x)).tobytes()
    assert vkml.backend_info()["graph vector math"] == "none (scalar libm)"


@needs_libmvec
def test_vector_math_is_what_backend_info_says(on_cpu):
    sine_graph()
    info = vkml.backend_info()["graph vector math"]
    assert info.startswith("libmvec") and "sin" in info.split()
    assert any(SIMD_MARKER in s for s in graph_sources())


@needs_libmvec
def test_a_call_left_scalar_sends_the_program_back_to_scalar_libm(on_cpu, scalar_sin_left_in):
    """The check of the built library: a scalar sin next to a vector one (a loop the compiler
    did not vectorise) and the program is built again with scalar libm throughout."""
    vkml.clear_caches()
    x, y = sine_graph()
    assert y.tobytes() == scalar_libm("sin")(K * (x * x)).tobytes()
    assert not any(SIMD_MARKER in s for s in graph_sources())


@needs_libmvec
def test_a_function_libmvec_lacks_keeps_its_calls_scalar_and_the_others_stay_vector(on_cpu,
                                                                                    monkeypatch):
    """Without a vector cos, a loop calling sin and cos cannot be a vector block: the program
    is built again with its sin through a lane function -- the vector sin every other program
    calls, so the bits of sin(k u) are those of a kernel holding sin alone -- and its cos on
    scalar libm (there is no other)."""
    @vkml.kernel
    def both(u, k: vkml.Param):
        return {"y": vkml.sin(k * u) * vkml.cos(u)}

    @vkml.kernel
    def sine(u, k: vkml.Param):
        return {"y": vkml.sin(k * u)}

    def launch(kernel):
        u = np.linspace(-2.0, 2.0, 100)
        y = np.zeros(100)
        vkml.Graph().add(kernel.bind(u=u, k=K, y=y), name="one").build().launch()
        return u, y
    available = cpu.vector_math()
    monkeypatch.setattr(cpu, "vector_math", lambda: available - {"cos"})
    vkml.clear_caches()
    u, lacking = launch(both)
    assert any("vk_lane_sin" in s for s in graph_sources())
    assert not any("vk_block" in s for s in graph_sources())
    _, vector_sine = launch(sine)
    assert lacking.tobytes() == (vector_sine * scalar_libm("cos")(u)).tobytes()
    monkeypatch.undo()
    monkeypatch.setenv("VKML_VECTOR_MATH", "0")
    vkml.clear_caches()
    _, scalar = launch(both)
    assert scalar.tobytes() == (scalar_libm("sin")(K * u) * scalar_libm("cos")(u)).tobytes()


@needs_libmvec
@pytest.mark.skipif("-march=native" not in cpu.FLAGS, reason="not built for this CPU's registers")
def test_a_full_schedule_gives_the_window_schedules_bits(on_cpu):
    """A "full" schedule steps the pendulum with per-step graph programs, a window schedule with
    the per-sample loops: both call the same vector sin, so the gradients are the same bits (the
    step's terminated flag, a byte, is stored after the vector loop, which it would keep scalar)."""
    from test_simd_loops import pendulum_sim
    grads = {}
    for window in (5, "full"):
        sim = pendulum_sim(50, window=window)
        sim.run()
        got = vkml.diff.reverse(sim.record, {"theta": np.ones(50), "omega": np.ones(50)})
        grads[window] = {name: np.asarray(got[name]) for name in ("theta", "omega", "length")}
    for name, value in grads[5].items():
        assert value.tobytes() == grads["full"][name].tobytes(), name
    assert sum(SIMD_MARKER in s for s in graph_sources()) >= 2


def nest(n, line):
    """A loop over ``n`` elements storing ``line`` (the lowering's text, index ``i1``)."""
    from vkml.backends.codegen.statements import Loop
    return [Loop("i1", n, [line])]


TYPES = {"a0": "double", "a1": "double", "o0": "double", "t1": "double"}


def test_a_block_functions_text_does_not_depend_on_the_number_of_elements():
    from vkml.backends.codegen.vector_nests import vectorised
    line = "o0[i1] = sin((a1[0] * a0[i1]));"
    texts = {n: vectorised(nest(n, line), {"sin"}, TYPES)[1] for n in (2, 7, 8, 9, 1001)}
    assert all(len(t) == 1 for t in texts.values())
    assert len({t[0] for t in texts.values()}) == 1          # one text for every length
    # one element: its loop stays, its call goes through the lane function (the same bits)
    assert vectorised(nest(1, line), {"sin"}, TYPES)[1] == []
    assert "noipa" in texts[9][0] and "#pragma omp simd" in texts[9][0]


def test_nests_that_are_not_flat_keep_their_scalar_loops():
    """A read a condition guards (a pad's), another element of what the nest computes, an
    empty loop and a loop with no vector function are left as they are."""
    from vkml.backends.codegen.vector_nests import vectorised
    for n, line in [(1024, "o0[i1] = ((i1 < 1000) ? sin(a0[(i1)]) : 0.0);"),
                    (1000, "o0[i1] = sin(o0[(999 - i1)]);"),
                    (0, "o0[i1] = sin(a0[i1]);"),
                    (1000, "o0[i1] = (a0[i1] * a0[i1]);")]:
        stmts = nest(n, line)
        assert vectorised(stmts, {"sin"}, TYPES) == (stmts, []), line
