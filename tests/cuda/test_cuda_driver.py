"""What a real CUDA driver does that a naive backend gets wrong, checked on the emulated driver.

Each test here failed on the backend as it was before these were fixed, under the emulation of
``cuda_emulation.py`` (per-thread context stacks that abort a thread ending with one pushed,
asynchronous streams, captures invalidated by the legacy default stream, GPU float-to-int
conversion, an emulated cuBLAS that sets itself up on its first product):

1. contexts: a thread that used the GPU ends cleanly; allocations and frees on any thread
   happen with the context current; a failed start leaves none pushed;
2. cuBLAS: its first product runs uncaptured and checked, every status code is checked;
3. float-to-integer casts give NumPy's results on the GPU as on the CPU tier;
4. memory: runs on device arrays allocate nothing for them; an evicted executable's memory goes
   back to the driver; clearing the cache never frees what a graph-layer memo still runs;
5. reductions: a large sum spreads over every multiprocessor, reading coalesced pairs;
6. streams: another library's legacy-stream work during a capture does not invalidate it; an
   imported array's stream is waited for.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import vkml
from cuda_emulation import CXX, fake_driver

pytestmark = pytest.mark.skipif(CXX is None, reason="the emulated driver needs a C++ compiler")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = np.random.default_rng(32)


@pytest.fixture
def emulated(vk_backend):
    """The emulated driver and the cuda backend on it."""
    with fake_driver() as driver:
        backend = vkml.set_backend("cuda")
        try:
            yield driver, backend
        finally:
            vkml.set_backend("numpy")


def _in_subprocess(code: str, env=None):
    """Run ``code`` in a fresh interpreter with the emulated driver (an abort kills only it)."""
    path = os.pathsep.join([os.path.join(ROOT, "kit"), os.path.join(ROOT, "extensions"),
                            os.path.join(ROOT, "tests")])
    full = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=600)


# -- 1. contexts ------------------------------------------------------------------------------------

def test_threads_that_used_the_gpu_end_without_aborting_the_process():
    """PyCUDA aborts the process when a thread ends with a context still pushed: a realize, a
    plane made and copied, and a graph reverse on worker threads must leave none behind."""
    code = """
import threading, numpy as np, vkml
from cuda_emulation import fake_driver
with fake_driver() as driver:
    backend = vkml.set_backend("cuda")
    out = {}
    def work():
        x = vkml.tensor(np.arange(6.0))
        out["y"] = (vkml.tanh(x) * 2.0).numpy()
        plane = backend.to_plane(np.ones(4))          # allocations on a thread of its own
        zeros = backend.zeros_plane((3,), np.float64)
        out["copy"] = plane.copy().numpy()
        out["zeros"] = zeros.numpy()
        del plane, zeros                               # frees from this thread
    for _ in range(3):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    np.testing.assert_allclose(out["y"], np.tanh(np.arange(6.0)) * 2.0)
    assert out["copy"].tolist() == [1.0] * 4 and out["zeros"].tolist() == [0.0] * 3
    assert driver.leaked == 0 and not driver.stack()
    vkml.set_backend("numpy")
print("ok")
"""
    proc = _in_subprocess(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_no_context_stays_pushed_on_the_calling_thread(emulated):
    driver, backend = emulated
    assert not driver.stack()                    # making the backend pushed and popped
    (vkml.tensor(np.ones(5)) * 3.0).numpy()
    backend.zeros_plane((4,), np.float32).numpy()
    assert not driver.stack()


def test_device_memory_dropped_on_another_thread_is_freed_not_leaked(emulated):
    driver, backend = emulated
    planes = [backend.to_plane(np.full(1000, float(i))) for i in range(4)]
    vkml.set_cache_limit(1)
    try:
        def drop():
            # another program evicts the first one's executable from this thread
            (vkml.tensor(np.ones(300)) * 2.0).numpy()
            (vkml.tensor(np.ones(300)) - 1.0).numpy()
            planes.clear()
            backend.empty_cache()
        (vkml.tensor(np.ones(300)) + 1.0).numpy()
        t = threading.Thread(target=drop)
        t.start()
        t.join()
    finally:
        vkml.set_cache_limit(1024)
    assert driver.leaked == 0


@pytest.mark.parametrize("call", ["cublasSetStream_v2", "cublasSetWorkspace_v2"])
def test_a_failed_cublas_setup_is_a_backend_error_naming_the_call(call, vk_backend,
                                                                  monkeypatch):
    with fake_driver() as driver:
        monkeypatch.setenv("VKML_FAKE_CUBLAS_FAIL", call)
        with pytest.raises(vkml.BackendError, match=f"{call} failed: CUBLAS_STATUS_INVALID_VALUE"
                                                    ".*VKML_CUDA_CUBLAS=0"):
            vkml.set_backend("cuda")
        assert not driver.stack()                # the failed start left no context pushed
        monkeypatch.setenv("VKML_CUDA_CUBLAS", "0")
        backend = vkml.set_backend("cuda")       # the way out the message names
        assert backend.info()["cublas"] is None
        vkml.set_backend("numpy")


# -- 2. cuBLAS ----------------------------------------------------------------------------------------

def test_a_cublas_product_runs_uncaptured_first_then_replays_its_graph(emulated):
    """cuBLAS allocates on its first product, which a capture refuses: the first run of an
    executable goes launch by launch (checked), the capture comes after it."""
    driver, backend = emulated
    assert backend.info()["cublas"].endswith("libcublas_emulated.so")
    a, b = RNG.normal(size=(64, 64)), RNG.normal(size=(64, 64))
    outs = []
    for _ in range(3):
        vkml.reset_stats()
        outs.append(vkml.matmul(vkml.tensor(a), vkml.tensor(b)).numpy())
    assert vkml.stats().graph_launches == 1           # the third run replayed the graph
    assert driver.cublas_setups == 1
    assert sum(name == "cublas gemm" for name, *_ in driver.launches) == 3
    # cuBLAS accumulates with fused multiply-adds: close to NumPy, not its bits
    np.testing.assert_allclose(outs[0], a @ b, rtol=1e-12, atol=1e-12)
    assert outs[0].tobytes() == outs[2].tobytes()


# -- 3. casts -----------------------------------------------------------------------------------------

EDGES = np.array([np.nan, np.inf, -np.inf, 300.0, -1.0, 3e9, -3e9, 1e19, -1e19, -2.5, 2.7, -0.0])


@pytest.mark.filterwarnings("ignore:cast. invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("source", [np.float64, np.float32])
def test_float_to_int_casts_give_numpys_results_on_the_gpu(dtype, source, emulated):
    """A GPU converts NaN to 0 and saturates out-of-range values; NumPy (x86) gives the type's
    minimum: the generated code converts as NumPy does on every backend."""
    x = EDGES.astype(source)
    with np.errstate(invalid="ignore"):
        want = x.astype(dtype)
    got = vkml.tensor(x).astype(dtype).numpy()
    assert got.tolist() == want.tolist()


@pytest.mark.filterwarnings("ignore:cast. invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_float_to_int_casts_give_numpys_results_on_the_cpu_tier(dtype, vk_backend):
    backend = vkml.set_backend("cpu")
    if backend.name != "cpu":
        pytest.skip("no C compiler for the cpu tier")
    try:
        with np.errstate(invalid="ignore"):
            want = EDGES.astype(dtype)
        # in a compiled loop long enough to be vectorised, and alone
        x = np.tile(EDGES, 40)
        assert vkml.tensor(x).astype(dtype).numpy().tolist() == np.tile(want, 40).tolist()
        assert vkml.tensor(EDGES).astype(dtype).numpy().tolist() == want.tolist()
    finally:
        vkml.set_backend("numpy")


# -- 4. memory ----------------------------------------------------------------------------------------

def test_runs_on_device_arrays_allocate_nothing_for_them(emulated):
    driver, backend = emulated
    x = (vkml.tensor(RNG.normal(size=(256, 256))) * 1.0).realize()   # 512 KB on the device
    before = driver.live_bytes
    y = (vkml.tanh(x) + 1.0).realize()
    added = driver.live_bytes - before - y.ir_var.value._nbytes
    # the pointer table, the status words: no buffer of the argument's or the result's size
    assert added < 4096, added
    np.testing.assert_allclose(y.numpy(), np.tanh(x.numpy()) + 1.0)


def test_an_evicted_executable_gives_its_device_memory_back(emulated):
    driver, backend = emulated
    x = RNG.normal(size=(128, 128))                 # a NumPy argument: staged in its own buffer
    vkml.set_cache_limit(2)
    try:
        sizes = []
        for k in range(8):                          # eight different programs
            y = vkml.tensor(x)
            for _ in range(k + 1):
                y = vkml.tanh(y)
            y.numpy()
            sizes.append(driver.live_bytes)
    finally:
        vkml.set_cache_limit(1024)
    # held: at most the cache's executables, not one per program ever compiled
    assert sizes[-1] - sizes[2] < x.nbytes, sizes


def test_clearing_the_cache_frees_nothing_a_graph_memo_still_runs(emulated):
    from vkml.graph import device
    driver, backend = emulated
    a, b = backend.to_plane(np.arange(5.0)), backend.to_plane(np.ones(5))
    assert device.plus(a, b).numpy().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    backend.clear_cache()
    assert device.plus(a, b).numpy().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


# -- 6. streams ---------------------------------------------------------------------------------------

def test_another_librarys_default_stream_work_does_not_invalidate_a_capture(emulated):
    """Legacy-default-stream work (another library's synchronous copy) while vkml captures: on a
    blocking stream the capture is invalidated; vkml's stream is non-blocking."""
    driver, backend = emulated
    import pycuda.driver as drv
    foreign, errors = [], []

    def other_library():
        def work():
            ctx = backend.gpu.context
            ctx.push()
            try:
                buf = drv.mem_alloc(64)
                drv.memcpy_htod(buf, np.arange(16, dtype=np.float32))
                foreign.append(buf)
            except Exception as e:          # what the other library would see
                errors.append(e)
            finally:
                drv.Context.pop()
        t = threading.Thread(target=work)
        t.start()
        t.join()
    driver.on_capture = other_library
    try:
        x = RNG.normal(size=(16,))
        for _ in range(2):
            np.testing.assert_allclose((vkml.tensor(x) * 2.0).numpy(), x * 2.0)
    finally:
        driver.on_capture = None
    assert foreign and not errors


class _ForeignArray:
    """Another library's device array, written on its own stream (not finished yet)."""

    def __init__(self, backend, values):
        import pycuda.driver as drv
        gpu = backend.gpu
        with gpu.active():
            self.stream = drv.Stream(flags=1)
            self.mem = drv.mem_alloc(values.nbytes)
            self.host = np.ascontiguousarray(values)
            drv.memcpy_htod_async(self.mem, self.host, self.stream)    # queued, not done
        self.values = values

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.values.shape, "typestr": self.values.dtype.str,
                "data": (int(self.mem), False), "version": 3, "strides": None,
                "stream": self.stream.handle}


def test_an_imported_arrays_stream_is_waited_for(emulated):
    driver, backend = emulated
    values = np.linspace(0.0, 1.0, 32)
    foreign = _ForeignArray(backend, values)
    plane = backend.to_plane(foreign)
    np.testing.assert_array_equal(plane.numpy(), values)


def test_an_imported_array_with_stream_0_is_refused(emulated):
    driver, backend = emulated
    foreign = _ForeignArray(backend, np.ones(4))
    face = dict(foreign.__cuda_array_interface__, stream=0)

    class Zero:
        __cuda_array_interface__ = face
    with pytest.raises(vkml.ArgumentError, match="stream is 0"):
        backend.to_plane(Zero())


# -- 5. bandwidth -------------------------------------------------------------------------------------

def test_large_one_thread_operations_run_on_the_host_small_ones_on_the_gpu(emulated):
    """scatter_add (and argsort, solve, cholesky) run on one GPU thread: above a size, the program
    goes to the host instead (the backend's fallback), with the same result."""
    from vkml.backends.codegen import cuda_render
    driver, backend = emulated
    for n in (1000, cuda_render.SERIAL_LIMIT + 1):
        idx = RNG.integers(0, 50, n)
        vals = RNG.normal(size=n)
        before = backend.fallbacks
        got = vkml.scatter_add(vkml.zeros(50, dtype=np.float64), vkml.tensor(idx[:, None]),
                               vkml.tensor(vals)).numpy()
        want = np.zeros(50)
        np.add.at(want, idx, vals)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert backend.fallbacks - before == (n > cuda_render.SERIAL_LIMIT)


# -- 7. the first run on a GPU machine ------------------------------------------------------------

def test_the_smoke_stage_passes_on_the_emulated_driver():
    env = {**os.environ, "VKML_EMULATED_CUDA": "1",
           "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "kit"),
                                          os.path.join(ROOT, "extensions")])}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_smoke.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = [line for line in proc.stdout.splitlines() if line.startswith("smoke: ") and
              line[7:].split("  ")[-1] and line[26:34].strip() == "ok"]
    assert len(passed) == 6 and "FAILED" not in proc.stdout, proc.stdout


@pytest.mark.skipif(not shutil.which("timeout") or not shutil.which("bash"),
                    reason="needs bash and coreutils' timeout")
def test_device_check_keeps_its_logs_when_the_time_limit_stops_it(tmp_path):
    """The whole run is under a time limit, and every line and step log is in $OUT as it goes:
    a run stopped at the limit still brings back what it did."""
    env = {**os.environ, "OUT": str(tmp_path), "VKML_DEVICE_CHECK_LIMIT": "14",
           "PYTHON": sys.executable, "VKML_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("VKML_DEVICE_CHECK_INNER", None)
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "device-check"), "--emulated"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 124, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = (tmp_path / "device-check.txt").read_text()
    assert "smoke: graph replay" in text and "stopped at the 14s limit" in text
    assert (tmp_path / "device-check-logs" / "smoke.log").exists()


class _FakeNvrtc:
    """libnvrtc's calls as ctypes would make them, recording what it was asked; ``fail`` makes
    the compile step fail with a log."""

    def __init__(self, fail=False):
        self.fail, self.sources, self.options = fail, [], []

    def nvrtcVersion(self, major, minor):
        major._obj.value, minor._obj.value = 13, 0
        return 0

    def nvrtcCreateProgram(self, prog, source, name, n, headers, names):
        self.sources.append(source.decode())
        prog._obj.value = 1
        return 0

    def nvrtcCompileProgram(self, prog, n, options):
        self.options.append([options[i].decode() for i in range(n)])
        return 6 if self.fail else 0

    def nvrtcGetProgramLogSize(self, prog, size):
        size._obj.value = 32
        return 0

    def nvrtcGetProgramLog(self, prog, log):
        log.value = b"error: something NVRTC refused"
        return 0

    def nvrtcGetCUBINSize(self, prog, size):
        size._obj.value = 5
        return 0

    def nvrtcGetCUBIN(self, prog, out):
        ctypes.memmove(out, b"CUBIN", 5)
        return 0

    def nvrtcDestroyProgram(self, prog):
        return 0


def test_nvrtc_compiles_with_the_same_flags_and_without_c_headers():
    from vkml.backends import nvrtc
    from vkml.backends.codegen import cuda_render
    fake = _FakeNvrtc()
    lib = nvrtc.Nvrtc(fake, "libnvrtc.so.13")
    assert lib.version == "nvrtc 13.0"
    source = cuda_render.cuda_plan(vkml.program(lambda x: x * 2.0, np.ones(3))).source
    assert "#include <stdint.h>" in source
    assert lib.cubin(source, "sm_90", cuda_render.NVCC_FLAGS) == b"CUBIN"
    assert fake.options == [["--gpu-architecture=sm_90", *cuda_render.NVCC_FLAGS]]
    assert "#include" not in fake.sources[0] and "typedef long long int64_t;" in fake.sources[0]
    with pytest.raises(nvrtc.NvrtcError, match="something NVRTC refused"):
        nvrtc.Nvrtc(_FakeNvrtc(fail=True), "x").cubin(source, "sm_90", [])


def test_a_module_nvrtc_refuses_is_compiled_by_nvcc_from_then_on(emulated):
    from vkml.backends import nvrtc
    driver, backend = emulated
    backend.gpu.nvrtc = nvrtc.Nvrtc(_FakeNvrtc(fail=True), "libnvrtc-fake.so")
    compiles = driver.compiles
    np.testing.assert_allclose((vkml.tensor(np.arange(4.0)) * 7.0 - 1.0).numpy(),
                               np.arange(4.0) * 7.0 - 1.0)
    assert driver.compiles == compiles + 1 and backend.gpu.nvrtc is None
    assert "NVRTC failed" in backend.info()["compiler"]


def test_a_failing_driver_call_is_a_backend_error_naming_it(emulated, monkeypatch):
    driver, backend = emulated

    def out_of_memory(nbytes):
        raise sys.modules["pycuda.driver"].Error("cuMemAlloc failed: out of memory")
    monkeypatch.setattr(driver, "alloc", out_of_memory)
    with pytest.raises(vkml.BackendError, match="cuMemAlloc failed: out of memory"):
        backend.to_plane(np.ones(1 << 16))
    assert not driver.stack()
