"""A simulation's per-sample loops on the CUDA backend (``backends/cuda_loops.py``).

One generator (``codegen/sample_loops.py``) writes the loops for the cpu tier
(C, one OpenMP thread per sample) and for the CUDA backend (one GPU thread per
sample, ``target="cuda"``).  Checked here, for a few simulations -- the
damped pendulum (sin, two Params, per-sample ``terminated``), a drag model
using only + - * / sqrt with a floating fixed plane in float64 and float32,
and a vector-state spring using exp in float32:

- with ``nvcc`` (no GPU needed): every loop source compiles with
  ``nvcc --ptx`` and the backend's flags, without a word of output; the C and
  CUDA sources differ only in their frame;
- on the emulated driver (``cuda_emulation.fake_driver``): ``set_backend("cuda")``
  runs a recorded simulation through :class:`CudaSampleLoops` -- one
  submission per run and per reverse, temporaries freed, kernels from the
  disk cache the second time -- and its final planes, per-sample steps and
  reverse gradients are the cpu tier's (bit for bit where the step uses only
  + - * / sqrt: the emulation runs the same C operations; with a grid too
  small for the samples as well; within a few ulps where it uses sin or exp,
  which the cpu tier calls in glibc's vector versions), the
  NumPy backend's and finite differences';
- on a GPU (marked ``cuda``, skipped without one): the same against the cpu
  tier, bit for bit where the step uses only + - * / sqrt, within 1e-12
  (float64) or 1e-5 (float32) relative where it uses sin or exp (libdevice).
"""

from __future__ import annotations

import gc
import subprocess
from dataclasses import replace

import numpy as np
import pytest

import vkml
from cuda_emulation import CXX, fake_driver
from test_cuda_codegen import NVCC
from test_simulation import H, pendulum
from vkml.backends import cpu, cuda_loops
from vkml.backends.codegen import cuda_render
from vkml.backends.codegen.lower import Unsupported
from vkml.backends.codegen.sample_loops import CUDA_LOCAL_LIMIT, LoopSpec, forward_source, reverse_source
from vkml.backends.cuda_loops import CudaSampleLoops

DT = 0.01


@vkml.kernel
def drag(x, v, c, t, t_end, k: vkml.Param):
    """+ - * / sqrt only: correctly rounded everywhere, so every backend gives the same bits."""
    a = -k * x - c * v * vkml.sqrt(v * v + 1.0) / (1.0 + x * x)
    v2 = v + DT * a
    tn = t + DT
    return {"x": x + DT * v2, "v": v2, "t": tn, "terminated": tn >= t_end}


@vkml.kernel
def spring3(x, v, k: vkml.Param):
    v2 = v - DT * k * x * vkml.exp(-0.1 * vkml.sum(x * x))
    return {"x": x + DT * v2, "v": v2}


def _pendulum(n, rng):
    return {"theta": rng.uniform(0.1, 1.2, n), "omega": rng.uniform(-0.5, 0.5, n), "t": np.zeros(n),
            "t_end": np.round(rng.uniform(0.1, 0.9, n), 2) + 0.005, "length": 1.0, "damping": 0.1}


def _drag(dtype):
    def planes(n, rng):
        return {"x": rng.uniform(-1, 1, n).astype(dtype), "v": rng.uniform(-1, 1, n).astype(dtype),
                "c": rng.uniform(0.1, 0.3, n).astype(dtype), "t": np.zeros(n, dtype),
                "t_end": (np.round(rng.uniform(0.1, 0.6, n), 2) + 0.005).astype(dtype),
                "k": dtype(1.5)}
    return planes


def _spring3(n, rng):
    return {"x": rng.normal(size=(n, 3)).astype(np.float32), "v": np.zeros((n, 3), np.float32),
            "k": np.float32(2.0)}


#: name -> (kernel, planes(n, rng), max_steps, window, exact: only + - * / sqrt)
CASES = {
    "pendulum": (pendulum, _pendulum, 100, 9, False),
    "drag": (drag, _drag(np.float64), 70, 8, True),
    "drag32": (drag, _drag(np.float32), 70, 8, True),
    "spring3_f32": (spring3, _spring3, 40, 6, False),
}


def simulate(case, n=64, seed=0, record=True, **overrides):
    """The case's simulation on the current backend: (output planes after the run, per-sample
    steps, reverse gradients of a weighted sum of the final state) -- steps and gradients only
    when recorded."""
    kernel, make, max_steps, window, _ = CASES[case]
    planes = make(n, np.random.default_rng(seed))
    planes.update(overrides)
    sim = vkml.simulation(kernel, max_steps=max_steps, record=record,
                          window=window if record else None, **planes)
    sim.run()
    out = {k: np.array(sim.planes[k], copy=True) for k in sim.launch.writes}   # device planes too
    if not record:
        return out, None, None
    state = [k for k in out if k != "terminated"]
    seeds = {s: np.linspace(1.0, 2.0, out[s].size).reshape(out[s].shape).astype(out[s].dtype)
             for s in state}
    grads = vkml.diff.reverse(sim.record, seeds)
    return out, sim.record.steps.copy(), {k: np.array(g) for k, g in grads.items()}


def assert_same(got, want, exact):
    """Bit for bit (``exact``), else within a few ulps of libm/libdevice math."""
    assert got.keys() == want.keys()
    for k in want:
        g, w = got[k], want[k]
        assert g.shape == w.shape and g.dtype == w.dtype, k
        if exact or w.dtype.kind != "f":
            assert g.tobytes() == w.tobytes(), k
        else:
            tol = 1e-5 if w.dtype == np.float32 else 1e-12
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * 1e-3, err_msg=k)


def assert_like_cpu(result, want, exact):
    out, steps, grads = result
    assert_same(out, want[0], exact)
    assert np.array_equal(steps, want[1])
    assert_same(grads, want[2], exact)


def on_cpu(case, **kw):
    vkml.set_backend("cpu")
    try:
        return simulate(case, **kw)
    finally:
        vkml.set_backend("numpy")


# -- the generated CUDA, with nvcc ----------------------------------------------------------------

@pytest.fixture(scope="module")
def loop_specs():
    """``case -> (step, vjp, spec)`` as the graph layer asks the backend for its loops."""
    seen = {}
    real = cpu.CpuBackend.sample_loops
    mp = pytest.MonkeyPatch()
    for case in CASES:
        def record(self, step, vjp, spec, case=case):
            seen.setdefault(case, (step, vjp, spec))
            return real(self, step, vjp, spec)
        mp.setattr(cpu.CpuBackend, "sample_loops", record)
        on_cpu(case, n=4)
    mp.undo()
    assert seen.keys() == CASES.keys()
    return seen


def _sources(step, vjp, spec, target):
    s = LoopSpec(**dict(spec))
    return forward_source(step, s, target=target), reverse_source(step, vjp, s, target=target)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_sample_loop_source_compiles_with_nvcc(loop_specs, tmp_path):
    procs = []
    for case, (step, vjp, spec) in loop_specs.items():
        for name, source in zip(("vk_fwd", "vk_rev"), _sources(step, vjp, spec, "cuda")):
            path = tmp_path / f"{case}_{name}.cu"
            path.write_text(source)
            out = path.with_suffix(".ptx")
            procs.append((case, name, out, subprocess.Popen(
                [NVCC, "--ptx", "-arch=sm_90", *cuda_render.NVCC_FLAGS, "-o", str(out), str(path)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for case, name, out, proc in procs:
        log, _ = proc.communicate()
        assert proc.returncode == 0, (case, name, log[-4000:])
        assert log.strip() == "", (case, name, log[-4000:])       # PyCUDA warns on any output
        assert f".entry {name}(" in out.read_text(), (case, name)


def test_c_and_cuda_loops_differ_only_in_their_frame(loop_specs):
    """One generator: the loops inside are the same text in both dialects."""
    def body(source, start):
        lines = source.split("\n")
        lines = lines[next(i for i, line in enumerate(lines) if line.startswith(start)) + 1:]
        return [line for line in lines if not line.lstrip().startswith(
            ("#pragma omp", "for (int64_t s = ", "int err_ = 0;", "return"))]
    for case, (step, vjp, spec) in loop_specs.items():
        for c_src, cu_src, name in zip(_sources(step, vjp, spec, "c"),
                                       _sources(step, vjp, spec, "cuda"), ("vk_fwd", "vk_rev")):
            assert "__global__" not in c_src and "#pragma omp parallel for" in c_src
            assert "#pragma omp" not in cu_src and "static const" not in cu_src
            c_body = body(c_src, f"int {name}(")[1:]          # after `int64_t n = info[0], ...`
            assert c_body == body(cu_src, f'extern "C" __global__ void {name}('), case


def test_a_window_too_large_for_a_gpu_thread_is_refused(loop_specs):
    """The reverse holds a window of states per thread; on the GPU that is local memory, bounded:
    the backend then says Unsupported and the simulation steps batch by batch instead."""
    step, vjp, spec = loop_specs["drag"]
    spec = LoopSpec(**dict(spec))
    big = CUDA_LOCAL_LIMIT // (8 * spec.n_state) + 1
    assert "vk_rev" in reverse_source(step, vjp, replace(spec, window=big))    # C: no such limit
    with pytest.raises(Unsupported, match="local memory"):
        reverse_source(step, vjp, replace(spec, window=big), target="cuda")
    assert "__global__" in reverse_source(step, vjp, replace(spec, window=big - 1), target="cuda")


# -- on the emulated driver ---------------------------------------------------------------------------

needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the emulated kernels")


def _loops(backend):
    return [v for v in backend._executables.values() if isinstance(v, CudaSampleLoops)]


@needs_cxx
@pytest.mark.parametrize("case", list(CASES))
def test_emulated_cuda_loops_give_the_cpu_tiers_results(case):
    want = on_cpu(case)
    with fake_driver() as driver:
        backend = vkml.set_backend("cuda")
        try:
            vkml.reset_stats()
            got = simulate(case)
            (loops,) = _loops(backend)
            assert loops.launches == 2
            # the forward and its summary of steps per block; the reverse and its Param sums
            names = [name for name, _, _ in driver.launches]
            assert names[:3] == ["vk_fwd", "vk_steps_longest", "vk_rev"]
            assert {n[:len("vk_tree_sum")] for n in names[3:]} == {"vk_tree_sum"}
            assert vkml.stats().compiles == 4        # the three loop kernels and the tree sum's
        finally:
            vkml.set_backend("numpy")
    # the emulation runs the same C operations as the cpu tier with scalar libm: a case of + - * /
    # sqrt has its bits; one with sin or exp is within a few ulps, the cpu tier's loops calling
    # the vector versions of glibc's libm (libmvec) where it has them
    assert_like_cpu(got, want, exact=CASES[case][4] or not cpu.vector_math())


@needs_cxx
def test_emulated_loops_stride_over_samples_count_submissions_and_free_their_buffers(monkeypatch):
    want = on_cpu("drag", n=64)
    with fake_driver() as driver:
        backend = vkml.set_backend("cuda")
        try:
            assert_like_cpu(simulate("drag", n=64), want, exact=True)
            # 4 blocks of 5 threads for 64 samples: each thread strides over three or four
            monkeypatch.setattr(cuda_loops, "THREADS", 5)
            monkeypatch.setattr(cuda_loops, "BLOCKS_PER_SM", 1)     # the emulated GPU has 4 SMs
            del driver.launches[:]
            gc.collect()                  # the first simulation's device memory back to the pool
            held = driver.allocations
            vkml.reset_stats()
            kernel, make, max_steps, window, _ = CASES["drag"]
            planes = make(64, np.random.default_rng(0))
            sim = vkml.simulation(kernel, max_steps=max_steps, record=True, window=window, **planes)
            sim.run()
            s = vkml.stats()
            assert (s.submissions, s.compiles) == (1, 0) and s.cache_hits >= 1
            assert driver.allocations == held          # planes, Record, temporaries: from the pool
            assert driver.launches == [("vk_fwd", (4, 1, 1), (5, 1, 1)),
                                       ("vk_steps_longest", (1, 1, 1), (5, 1, 1))]
            assert sim.planes["x"].numpy().tobytes() == want[0]["x"].tobytes()
            vkml.reset_stats()
            grads = vkml.diff.reverse(sim.record, {s_: np.linspace(1.0, 2.0, 64)
                                                   for s_ in ("x", "v", "t")})
            # one submission (the Param sum's own launches aside); only the tree sum's levels
            # may allocate (from the pool: once at most)
            assert vkml.stats().submissions == 1 and driver.allocations - held <= 1
            assert_same({k: np.array(g) for k, g in grads.items()}, want[2], exact=True)
            # a new process: both kernels come from the disk cache, nvcc does not run
            backend.clear_cache()
            backend.gpu.modules.clear()
            vkml.reset_stats()
            assert_like_cpu(simulate("drag", n=64), want, exact=True)
            assert vkml.stats().compiles == 0 and vkml.stats().cache_hits >= 1
        finally:
            vkml.set_backend("numpy")


@needs_cxx
def test_emulated_loops_against_the_numpy_backend_and_finite_differences():
    n = 8
    with fake_driver():
        vkml.set_backend("cuda")
        try:
            got = simulate("pendulum", n=n)
            assert len(set(got[1].tolist())) > 1                   # samples stop apart

            def final(**over):
                out = simulate("pendulum", n=n, record=False, **over)[0]
                return np.linspace(1.0, 2.0, n) @ out["omega"] + np.linspace(1.0, 2.0, n) @ \
                    out["t"] + np.linspace(1.0, 2.0, n) @ out["theta"]
            planes = _pendulum(n, np.random.default_rng(0))
            fd = {}
            for name in ("theta", "omega"):
                fd[name] = np.empty(n)
                for i in range(n):
                    up, down = planes[name].copy(), planes[name].copy()
                    up[i] += H
                    down[i] -= H
                    fd[name][i] = (final(**{name: up}) - final(**{name: down})) / (2 * H)
            for name in ("length", "damping"):
                fd[name] = (final(**{name: planes[name] + H}) - final(**{name: planes[name] - H})) \
                    / (2 * H)
        finally:
            vkml.set_backend("numpy")
    want = simulate("pendulum", n=n)                    # the NumPy backend: a Python loop of steps
    assert np.array_equal(got[1], want[1])
    for k in want[0]:
        np.testing.assert_allclose(got[0][k], want[0][k], rtol=1e-12, atol=1e-15, err_msg=k)
    for k in want[2]:
        np.testing.assert_allclose(got[2][k], want[2][k], rtol=1e-12, atol=1e-15, err_msg=k)
    for k, v in fd.items():
        np.testing.assert_allclose(got[2][k], v, rtol=1e-6, atol=1e-8, err_msg=k)


# -- on a GPU --------------------------------------------------------------------------------------

@pytest.fixture
def gpu_backend(vk_backend):
    """The cuda backend on a real GPU (or on the emulation, under ``-p cuda_emulation``)."""
    drv = pytest.importorskip("pycuda.driver", exc_type=ImportError)
    try:
        drv.init()
        count = drv.Device.count()
    except Exception:
        count = 0
    if count == 0:
        pytest.skip("no GPU on this machine")
    backend = vkml.set_backend("cuda")
    vkml.reset_stats()
    yield backend
    vkml.set_backend("numpy")


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_sample_loops_on_a_gpu_give_the_cpu_tiers_results(gpu_backend, case):
    want = on_cpu(case, n=1000)
    vkml.set_backend("cuda")
    before = sum(loops.launches for loops in _loops(gpu_backend))
    got = simulate(case, n=1000)
    assert sum(loops.launches for loops in _loops(gpu_backend)) == before + 2     # run, reverse
    assert_like_cpu(got, want, exact=CASES[case][4])


def _checkpoints(backend, n=19):
    """Every stored checkpoint of the drag case (samples stopping at their own step, most of
    them long before max_steps) on ``backend``, as host arrays."""
    kernel, make, max_steps, window, _ = CASES["drag"]
    vkml.set_backend(backend)
    try:
        sim = vkml.simulation(kernel, max_steps=max_steps, record=True, window=window,
                              **make(n, np.random.default_rng(3)))
        sim.run()
        steps = np.asarray(sim.record.steps)
        return steps, {t: {k: np.array(v) for k, v in ck.items()}
                       for t, ck in sim.record.checkpoints.items()}
    finally:
        vkml.set_backend("numpy")


@needs_cxx
def test_a_stopped_samples_later_checkpoints_hold_its_last_state_on_every_tier():
    """The compiled loops used to leave the checkpoint rows of a sample that had stopped
    uninitialised (the reverse never reads them, but ``record.checkpoints`` showed them)."""
    steps, want = _checkpoints("numpy")
    assert steps.min() < 24 and steps.max() <= 70      # most rows stop before the later windows
    got_cpu = _checkpoints("cpu")
    with fake_driver():
        got_cuda = _checkpoints("cuda")
    for got in (got_cpu, got_cuda):
        assert np.array_equal(got[0], steps) and sorted(got[1]) == sorted(want)
        for t in want:
            for k in want[t]:
                assert want[t][k].tobytes() == got[1][t][k].tobytes(), (t, k)
