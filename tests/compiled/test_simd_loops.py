"""The cpu tier's simulation loops in SIMD lanes, with glibc's vector math (libmvec).

A lane group's samples are stepped together in SIMD registers and sin/cos/exp/... go to the
vector versions, which differ from scalar libm (and from NumPy) by a few ulps.  What must hold:
a sample's bits never depend on where it sits -- the number of samples (padding lanes), its
neighbours' stops, the threads, a memory budget's passes -- and the reverse recomputes a window
with the very bits the forward recorded (the Record's report says so).  Gradients are checked
against central finite differences and against the NumPy backend (the oracle for the step's
math), to a tolerance of a few ulps per step; a kernel of + - * / sqrt only keeps NumPy's bits.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen.sample_loops import SIMD_MARKER
from vkml.graph.simulation.compiled_loops import compiled_loops
from test_simulation import pendulum   # the damped pendulum with a per-sample stop


def loops_of(sim):
    """The cpu tier's compiled loops a simulation runs on."""
    return compiled_loops(sim, sim.backend)[0]

DT = 0.01
H = 1e-6
SIZES = (1, 7, 8, 9, 1000, 1001)

needs_libmvec = pytest.mark.skipif(not cpu.vector_math() or cpu.compiler() is None,
                                   reason="no C compiler or no glibc vector math (libmvec) here")
#: where the loops are built for this CPU's widest registers (AVX2 or AVX-512 here) GCC vectorises
#: every lanes' loop; built for plain SSE2 it leaves the pendulum's forward scalar, and the
#: loops fall back to scalar libm (checked by the tests that do not need this mark)
needs_vector_loops = pytest.mark.skipif("-march=native" not in cpu.FLAGS,
                                        reason="the loops are not built for this CPU (-march=native)")


@vkml.kernel
def decay(x, v, rate: vkml.Param):
    """Only + - * / and sqrt: the cpu tier keeps NumPy's bits."""
    a = -rate * x / vkml.sqrt(1.0 + x * x)
    return {"x": x + DT * v, "v": v + DT * a}


def inputs(n):
    """The first ``n`` of one fixed set of samples (so a sample is the same at every ``n``); end
    times off the step grid and spread, so lane groups hold samples that stop at other steps."""
    rng = np.random.default_rng(5)
    theta0 = rng.uniform(0.1, 1.2, 1001)[:n]
    omega0 = rng.uniform(-0.5, 0.5, 1001)[:n]
    t_end = (np.round(rng.uniform(0.05, 0.5, 1001), 2) + 0.005)[:n]
    return theta0, omega0, t_end


def pendulum_sim(n, max_steps=40, window=6, **kw):
    theta0, omega0, t_end = inputs(n)
    return vkml.simulation(pendulum, max_steps=max_steps, record=True, window=window,
                           theta=theta0.copy(), omega=omega0.copy(), t=np.zeros(n), t_end=t_end,
                           length=1.3, damping=0.2, **kw)


def run_and_reverse(n, **kw):
    """Final states, steps and the gradients of J = sum(theta) + 0.5 sum(omega)."""
    sim = pendulum_sim(n, **kw)
    sim.run()
    grads = vkml.diff.reverse(sim.record, {"theta": np.ones(n), "omega": np.full(n, 0.5)})
    out = {"theta_T": sim.launch.writes["theta"].copy(), "omega_T": sim.launch.writes["omega"].copy(),
           "steps": np.asarray(sim.record.steps).copy()}
    out.update({f"d_{k}": np.asarray(grads[k]).copy() for k in ("theta", "omega", "length", "damping")})
    out["report"] = grads.report
    return sim, out


@pytest.fixture
def threads():
    old = os.environ.get("VKML_THREADS")

    def set_threads(count):
        os.environ["VKML_THREADS"] = str(count)
    yield set_threads
    if old is None:
        os.environ.pop("VKML_THREADS", None)
    else:
        os.environ["VKML_THREADS"] = old


@needs_libmvec
@needs_vector_loops
def test_the_pendulums_loops_run_in_simd_lanes_with_vector_sin_and_cos():
    with vkml.use_backend("cpu"):
        sim = pendulum_sim(16)
        assert loops_of(sim).vector_math is True
        info = vkml.backend_info()
    assert "sin" in info["simulation vector math"]
    assert info["simulation vector math"].startswith("libmvec")


@needs_libmvec
@needs_vector_loops
def test_the_generated_c_and_its_libraries_call_only_vector_versions(monkeypatch):
    """The generated C declares the vector versions and loops over lanes in SIMD; the very
    libraries built import sin (forward and the reverse's recomputation) and cos (the
    vjp) imported in one vector version each, no scalar one."""
    seen = []
    real_library = cpu.library

    def spy(source, extra_flags=(), inspect=None):
        def both(data):
            seen.append((source, cpu.math_imports(data, ("sin", "cos"))))
            if inspect is not None:
                inspect(data)
        return real_library(source, extra_flags, both)
    monkeypatch.setattr(cpu, "library", spy)
    vkml.clear_caches()                  # loops built afresh (not ones an earlier test made)
    with vkml.use_backend("cpu"):
        loops = loops_of(pendulum_sim(24, window=7))
    assert loops.vector_math is True
    fwd = [imports for source, imports in seen if "vk_fwd" in source and SIMD_MARKER in source]
    rev = [imports for source, imports in seen if "vk_rev" in source and SIMD_MARKER in source]
    assert fwd and rev
    source = [source for source, _ in seen if SIMD_MARKER in source][-1]
    assert "#pragma omp declare simd notinbranch" in source and "#pragma omp simd" in source
    assert len(fwd[-1]["sin"]) == 1 and next(iter(fwd[-1]["sin"])).startswith("_ZGV")
    assert rev[-1]["sin"] == fwd[-1]["sin"]
    assert len(rev[-1]["cos"]) == 1 and next(iter(rev[-1]["cos"])).startswith("_ZGV")


@needs_libmvec
@pytest.mark.parametrize("count", [1, 2])
def test_a_samples_bits_do_not_depend_on_n_or_threads(threads, count):
    threads(count)
    with vkml.use_backend("cpu"):
        runs = {n: run_and_reverse(n)[1] for n in SIZES}
    whole = runs[1001]
    assert len(set(whole["steps"].tolist())) > 5            # stops staggered within lane groups
    for n, got in runs.items():
        assert got["report"].bitwise["theta"] and got["report"].bitwise["omega"], n
        for key in ("theta_T", "omega_T", "steps", "d_theta", "d_omega"):
            assert np.array_equal(got[key], whole[key][:n]), (n, key)


@needs_libmvec
def test_two_threads_and_budget_passes_give_the_same_bits(threads):
    n = 1001
    with vkml.use_backend("cpu"):
        threads(1)
        sim, one = run_and_reverse(n)
        psb = sim.per_sample_bytes
        threads(2)
        _, two = run_and_reverse(n)
        _, passes = run_and_reverse(n, memory_budget=300 * psb)
    assert passes["report"].chunks > 1
    for key in ("theta_T", "omega_T", "steps", "d_theta", "d_omega", "d_length", "d_damping"):
        assert np.array_equal(two[key], one[key]), key
        assert np.array_equal(passes[key], one[key]), key


@needs_libmvec
def test_gradients_against_finite_differences_and_the_numpy_backend():
    n = 9
    with vkml.use_backend("cpu"):
        _, got = run_and_reverse(n)
    with vkml.use_backend("numpy"):
        _, ref = run_and_reverse(n)
    assert np.array_equal(got["steps"], ref["steps"])
    # a few ulps per sin, carried over 40 steps: far below 1e-12 relative
    for key in ("theta_T", "omega_T", "d_theta", "d_omega", "d_length", "d_damping"):
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-12, atol=1e-14, err_msg=key)

    def objective(length=1.3, theta_shift=0.0):
        theta0, omega0, t_end = inputs(n)
        with vkml.use_backend("cpu"):
            sim = vkml.simulation(pendulum, max_steps=40, theta=theta0 + theta_shift,
                                  omega=omega0.copy(), t=np.zeros(n), t_end=t_end, length=length,
                                  damping=0.2)
            sim.run()
            return sim.launch.writes["theta"].sum() + 0.5 * sim.launch.writes["omega"].sum()
    fd_length = (objective(length=1.3 + H) - objective(length=1.3 - H)) / (2 * H)
    np.testing.assert_allclose(np.sum(got["d_length"]), fd_length, rtol=1e-6)
    fd_theta = (objective(theta_shift=H) - objective(theta_shift=-H)) / (2 * H)
    np.testing.assert_allclose(np.sum(got["d_theta"]), fd_theta, rtol=1e-6)


@needs_libmvec
def test_scalar_libm_when_vector_math_is_off_differs_by_a_few_ulps_at_most(monkeypatch):
    with vkml.use_backend("cpu"):
        _, vector = run_and_reverse(64, window=5)   # the loops read VKML_VECTOR_MATH when built
    monkeypatch.setenv("VKML_VECTOR_MATH", "0")
    with vkml.use_backend("cpu"):
        # the same simulation again: the vector math in use is part of the loops' key, so
        # these are other loops, built with scalar libm
        sim, scalar = run_and_reverse(64, window=5)
        assert loops_of(sim).vector_math is False
        assert vkml.backend_info()["simulation vector math"] == "none (scalar libm)"
    assert np.array_equal(vector["steps"], scalar["steps"])
    np.testing.assert_allclose(vector["theta_T"], scalar["theta_T"], rtol=1e-13)


def test_kernels_without_transcendentals_keep_numpys_bits():
    n = 37
    rng = np.random.default_rng(2)
    x0, v0 = rng.uniform(-2, 2, n), rng.uniform(-1, 1, n)
    out = {}
    for backend in ("numpy", "cpu"):
        with vkml.use_backend(backend):
            sim = vkml.simulation(decay, max_steps=25, record=True, window=4, x=x0.copy(),
                                  v=v0.copy(), rate=0.7)
            sim.run()
            grads = vkml.diff.reverse(sim.record, {"x": np.ones(n)})
            out[backend] = [sim.launch.writes["x"].copy(), sim.launch.writes["v"].copy(),
                            np.asarray(grads["x"]), np.asarray(grads["v"]), np.asarray(grads["rate"])]
    for got, want in zip(out["cpu"], out["numpy"]):
        assert np.array_equal(got, want)


def test_math_imports_reads_scalar_and_vector_versions_off_symbol_names():
    data = b"\0free\0sin\0_ZGVeN8v_cos\0_ZGVdN4vv_pow\0sinh\0_ZGVeN8v_sinf\0"
    assert cpu.math_imports(data, ("sin", "cos", "pow", "exp", "sinf")) == {
        "sin": {"sin"}, "cos": {"_ZGVeN8v_cos"}, "pow": {"_ZGVdN4vv_pow"}, "sinf": {"_ZGVeN8v_sinf"}}


@needs_libmvec
def test_a_call_the_compiler_left_scalar_sends_the_loops_back_to_scalar_libm(scalar_sin_left_in,
                                                                             monkeypatch):
    """If a built library imports a scalar sin next to the vector one (a loop GCC did not
    vectorise), the forward and the reverse's recomputation could differ: both are built again
    with scalar libm, and give exactly what VKML_VECTOR_MATH=0 gives."""
    with vkml.use_backend("cpu"):
        sim, mixed = run_and_reverse(50, window=11)
        assert loops_of(sim).vector_math is False
    monkeypatch.undo()
    monkeypatch.setenv("VKML_VECTOR_MATH", "0")
    with vkml.use_backend("cpu"):
        plain, scalar = run_and_reverse(50, window=12)    # loops of their own (the window does
        assert loops_of(plain) is not loops_of(sim)   # not change a bit)
        assert loops_of(plain).vector_math is False
    for key in ("theta_T", "omega_T", "steps", "d_theta", "d_omega", "d_length", "d_damping"):
        assert np.array_equal(mixed[key], scalar[key]), key
