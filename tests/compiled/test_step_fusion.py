"""A compiled training step on the cpu tier, counted (never timed) and checked bit for bit.

- the step keeps its bits: after a few steps its parameters are those of the lazy path
  (``backward`` + ``Adam.step``) on the same backend, bit for bit, and within float32 rounding
  of an independent float64 Adam whose gradients come from HIPS autograd;
- it is traced and compiled once, and a steady-state step allocates no output or scratch
  buffer and skips the jitted call's full path (flattening, key, Vars);
- the Adam update is one loop nest per parameter (the new moments are used in the iteration
  that computes them); a result that reads a nest's value at another element gets a nest of
  its own, with NumPy's bits;
- a failure in a program whose calls were spliced and whose products were turned around still
  names the user's operation;
- code built for this CPU's widest vectors is cached under this CPU's signature.
"""

import re

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
from vkml import nn, optim
from vkml.backends import cpu

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")

SIZES, BATCH, LR, BETAS, EPS = (300, 240, 10), 64, 1e-3, (0.9, 0.999), 1e-8


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))


def _batch():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((BATCH, SIZES[0])).astype(np.float32),
            rng.integers(0, SIZES[-1], BATCH))


def _model():
    """The bench's network at a smaller width: its products (64x300 @ 300x240 and the gradients')
    are GEMM calls on the cpu tier, the whole step one C function."""
    nn.manual_seed(3)
    d_in, d_hid, d_out = SIZES
    model = nn.Sequential(nn.Linear(d_in, d_hid), nn.ReLU(), nn.Linear(d_hid, d_out))
    return model, optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS)


def _oracle_adam(init, x, y, steps):
    """Adam in float64 NumPy, with the gradient of the same loss from HIPS autograd."""
    def loss(ps):
        w1, b1, w2, b2 = ps
        h = anp.maximum(x @ w1.T + b1, 0.0)
        z = h @ w2.T + b2
        z = z - anp.max(z, axis=1, keepdims=True)
        logp = z - anp.log(anp.sum(anp.exp(z), axis=1, keepdims=True))
        return -anp.mean(logp[np.arange(len(y)), y])
    grad = autograd.grad(loss)
    ps = [p.astype(np.float64) for p in init]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    b1, b2 = BETAS
    for t in range(1, steps + 1):
        for k, g in enumerate(grad(ps)):
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat, v_hat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
            ps[k] = ps[k] - LR * m_hat / (np.sqrt(v_hat) + EPS)
    return ps


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_the_compiled_step_has_the_lazy_steps_bits_and_adams_values(backend):
    x, y = _batch()
    steps = 4
    with vkml.use_backend(backend):
        lazy_model, lazy_opt = _model()
        model, opt = _model()
        init = [np.array(p.numpy()) for p in model.parameters()]
        step = opt.compile_step(lambda xb, yb: nn.cross_entropy(model(xb), yb))
        xt, yt = vkml.tensor(x), vkml.tensor(y)
        for _ in range(steps):
            lazy_opt.zero_grad()
            want = nn.cross_entropy(lazy_model(xt), yt)
            want.backward()
            lazy_opt.step()
            assert step(xt, yt).numpy().tobytes() == want.numpy().tobytes()
        got = [p.numpy() for p in model.parameters()]
        assert [g.tobytes() for g in got] == [p.numpy().tobytes() for p in lazy_model.parameters()]
        for m, m_lazy in zip(opt.exp_avg + opt.exp_avg_sq, lazy_opt.exp_avg + lazy_opt.exp_avg_sq):
            assert m.numpy().tobytes() == m_lazy.numpy().tobytes()
    want = _oracle_adam(init, x.astype(np.float64), y, steps)
    for g, w, p0 in zip(got, want, init):
        assert not np.array_equal(g, p0)                     # every parameter moved
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)   # a step moves by ~LR = 1e-3


def _compiled_programs():
    """Every compiled C executable the cpu tier holds (nested runs among them)."""
    backend = vkml.backends.base._backend_named("cpu", "test")
    exes = [getattr(exe, "current", exe) for exe in backend._executables.values()]
    return [exe for exe in exes if isinstance(exe, cpu.CompiledProgram)]


def test_a_steady_step_compiles_nothing_allocates_nothing_and_skips_the_full_call(monkeypatch):
    x, y = _batch()
    with vkml.use_backend("cpu"):
        model, opt = _model()
        step = opt.compile_step(lambda xb, yb: nn.cross_entropy(model(xb), yb))
        xt, yt = vkml.tensor(x), vkml.tensor(y)
        for _ in range(4):                       # traced and compiled, then steady
            step(xt, yt)
        pools = [exe._pool for exe in _compiled_programs() if exe._pool is not None]
        assert pools, "the step should be compiled"
        before = [pool.allocations for pool in pools]
        full_calls = []
        lookup = vkml.programs.Jitted._lookup
        monkeypatch.setattr(vkml.programs.Jitted, "_lookup",
                            lambda self, args: full_calls.append(1) or lookup(self, args))
        cost = vkml.stats()
        for _ in range(5):
            step(xt, yt)
        cost = vkml.stats() - cost
    assert (cost.submissions, cost.traces, cost.compiles) == (5, 0, 0)
    assert [pool.allocations for pool in pools] == before
    assert full_calls == []
    assert step.cache_info()["traces"] == 1 and len(step.programs()) == 1


def _top_level_nests(source):
    """The loop nests of a generated function's body, as the C text of each (the body's own
    statements are indented by four spaces)."""
    body = source[source.index("static int vk_main_body"):source.index("\ndone:")]
    return re.findall(r"^    for \(.*?^    \}$", body, flags=re.S | re.M)


def test_an_adam_update_is_one_loop_nest_per_parameter(monkeypatch):
    monkeypatch.setenv("VKML_THREADS", "1")     # (split over threads, a nest sits in a block)
    shapes = [(240, 300), (240,), (10, 240), (10,)]
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    states = [[(np.zeros(s, np.float32), np.ones(s, np.float32)) for s in shapes]]
    hyper = ([(2.0, 0.5)], 0.1, 0.001, None)
    program = vkml.program(optim.Adam._math, params, grads, states, hyper)
    source, _ = cpu.c_source(program)
    nests = _top_level_nests(source)
    assert len(nests) == len(shapes)
    for nest in nests:                        # moments and parameter stored in one iteration
        assert len(re.findall(r"\bo\d+\[[^\]]*\] = ", nest)) == 3, nest
    with vkml.use_backend("numpy"):
        want = vkml.jit(optim.Adam._math)(params, grads, states, hyper)
    with vkml.use_backend("cpu"):
        f = vkml.jit(optim.Adam._math)
        for _ in range(3):                    # NumPy, then compiled: the same bits
            got = f(params, grads, states, hyper)
            assert [g.numpy().tobytes() for g in got] == [w.numpy().tobytes() for w in want]


def test_a_result_read_at_another_element_gets_a_nest_of_its_own(monkeypatch):
    def f(x):
        y = x / 2.0 + 1.0          # (a division: stored, not computed again in each reader)
        return vkml.flip(y, 0) + y, y * 3.0, (x * x).sum() * 2.0
    x = np.linspace(-1.0, 1.0, 1001)
    source, _ = cpu.c_source(vkml.program(f, x))
    nests = _top_level_nests(source)
    flipped = [n for n in nests if re.search(r"\w+\[\(1000 - i\d+\)\]", n)]
    assert len(flipped) == 1                  # the flipped read is there, in one nest ...
    (y,) = re.findall(r"(\w+)\[\(1000 - i\d+\)\]", flipped[0])
    assert not re.search(rf"\b{y}\[[^\]]*\] = ", flipped[0])   # ... not the nest storing y
    assert any(re.search(rf"\b{y}\[[^\]]*\] = ", n) for n in nests)
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    with vkml.use_backend("numpy"):
        want = [w.numpy() for w in vkml.jit(f)(x)]
    with vkml.use_backend("cpu"):
        got = [g.numpy() for g in vkml.jit(f)(x)]
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


def test_code_for_this_cpus_vectors_is_cached_under_its_signature(monkeypatch):
    if "-march=native" not in cpu.FLAGS:
        pytest.skip("native code is built on x86-64 only (or VKML_CPU_NATIVE=0)")
    source = "int vk_probe(void) { return 7; }\n"
    cost = vkml.stats()
    cpu.library(source)
    cpu.library(source)
    assert (vkml.stats() - cost).compiles == 1
    monkeypatch.setattr(cpu, "cpu_signature", lambda: "another cpu")
    lib, compiled = cpu.library(source)
    assert compiled and (vkml.stats() - cost).compiles == 2 and lib.vk_probe() == 7


def test_parameters_of_one_shape_get_a_nest_each():
    """One nest for all of them would touch too many buffers to be vectorised."""
    shapes = [(64, 64)] * 3
    params = [np.full(s, 1.0, np.float32) for s in shapes]
    grads = [np.full(s, 0.5, np.float32) for s in shapes]
    states = [[(np.zeros(s, np.float32), np.ones(s, np.float32)) for s in shapes]]
    source, _ = cpu.c_source(vkml.program(optim.Adam._math, params, grads, states,
                                          ([(2.0, 0.5)], 0.1, 0.001, None)))
    nests = _top_level_nests(source)
    assert len(nests) == 3
    assert all(len(re.findall(r"\bo\d+\[[^\]]*\] = ", n)) == 3 for n in nests)


def test_a_failure_in_a_rewritten_program_names_the_equation_that_failed():
    """Splicing calls and turning a transposed product around change a program's equations; a
    failure still names the user's operation (a gather after them) on every call, and the next
    good call works."""
    inner = vkml.jit(lambda x, w: (x.T @ w).T)          # a call holding a transposed product

    def f(x, w, i):
        return vkml.exp((inner(x, w) * 2.0 + 1.0 - 3.0)[i] * 2.0)
    x, w = np.ones((300, 300)), np.full((300, 300), 1e-3)
    with vkml.use_backend("cpu"):
        g = vkml.jit(f)
        for _ in range(3):
            with pytest.raises(vkml.ExecutionError, match=r"^gather\(.*index 400 is out of range"):
                g(x, w, np.array([5, 400]))
        got = g(x, w, np.array([5, 299])).numpy()
    with vkml.use_backend("numpy"):
        np.testing.assert_allclose(got, vkml.jit(f)(x, w, np.array([5, 299])).numpy(), rtol=1e-12)


def test_a_cheap_value_read_by_several_nests_is_computed_again_not_stored():
    """``y = x * 3 + 1`` read by two reductions' operands: computed in each of their nests (two
    operations each time) rather than stored and read back -- the same bits, one buffer of
    x's size fewer; ``y - 2.0`` (three operations) is read by the max as its expression, not
    stored either.  An expensive value (an exp) read twice is stored once, and the reductions
    read their cheap operands computed from it (``y * y``, ``y - 2.0``) as expressions."""
    x = np.random.default_rng(4).standard_normal((300, 200)).astype(np.float32)   # (60,000)

    def cheap(x):
        y = x * 3.0 + 1.0
        return vkml.sum(y * y, axis=1), vkml.max(y - 2.0, axis=1)

    def costly(x):
        y = vkml.exp(x)
        return vkml.sum(y * y, axis=1), vkml.max(y - 2.0, axis=1)

    for fn, stored in ((cheap, 1), (costly, 1)):
        _, low = cpu.c_source(vkml.program(fn, x))
        assert sum(v.shape == x.shape for v in low.temp_vars) == stored, fn.__name__
    with vkml.use_backend("numpy"):
        want = [np.asarray(w) for w in vkml.jit(cheap)(x)]
    with vkml.use_backend("cpu"):
        got = [np.asarray(g) for g in vkml.jit(cheap)(x)]
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
    np.testing.assert_allclose(got[0], ((x.astype(np.float64) * 3 + 1) ** 2).sum(axis=1),
                               rtol=1e-5)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_reduction_reads_its_cheap_operand_as_an_expression(threads, monkeypatch):
    """A layer norm's variance, ``mean((x - mu) ** 2)``, and a max's tie count, ``sum(x ==
    max)``: their operands are read by the reductions' loops as expressions, never stored (no
    temporary of x's size), and the results have the NumPy backend's bits -- the canonical
    trees over the same rounded values -- on one thread and two; against float64 too."""
    monkeypatch.setenv("VKML_THREADS", threads)
    x = np.random.default_rng(5).standard_normal((256, 96)).astype(np.float32)
    x[3, 7] = x[3].max()                        # (a row whose max appears twice)

    def f(x):
        mu = vkml.mean(x, axis=-1, keepdims=True)
        var = vkml.mean((x - mu) ** 2, axis=-1)
        ties = vkml.sum((x == vkml.max(x, axis=-1, keepdims=True)).astype(np.float32), axis=-1)
        return var, ties
    _, low = cpu.c_source(vkml.program(f, x))
    assert not any(v.shape == x.shape for v in low.temp_vars)
    with vkml.use_backend("numpy"):
        want = [np.asarray(w) for w in vkml.jit(f)(x)]
    with vkml.use_backend("cpu"):
        got = [np.asarray(g) for g in vkml.jit(f)(x)]
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
    np.testing.assert_allclose(got[0], x.astype(np.float64).var(axis=-1), rtol=1e-5)
    assert got[1][3] == 2 and (got[1] >= 1).all()
