"""Generated code never corrupts the process: every risky input gives NumPy's answer or a clean error.

Each risky call runs in a SUBPROCESS (several cases per process), so a crash
-- a SIGFPE from ``MIN // -1``, a segfault from an unchecked ``malloc`` or a
stack overflow -- fails a test instead of killing the run.  Every case runs
on the NumPy backend and on the compiled cpu tier (compiled at the first
call, ``VKML_CPU_HOT=0``, with a private cache), and both must print the
same answer or the same error class:

- integer ``//`` for int8..int64 and uint8..uint64: ``MIN // -1`` wraps to
  MIN and ``// 0`` gives 0, as NumPy does;
- a broadcast too large for memory, a shape whose element count overflows
  int64, a reverse with a huge ``window=``;
- a gather index out of range in a jitted program, into an empty slice, and
  inside a compiled simulation step and its reverse;
- a negative integer power; argmax over an empty axis.

Without a subprocess: the scalar helpers the C and CUDA renderers share
(``kernels_cu/helpers.h``: floor division, modulo, powers) against NumPy for
every edge case, and the CUDA renderer's integer-division, power and gather
kernels compiled with ``nvcc --ptx`` and run in the host emulation.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import vkml
from cuda_emulation import CXX, emulate, fake_driver, host_library
from vkml.backends.codegen import cuda_render
from vkml.backends.codegen.c_render import prelude
from vkml.backends.codegen.cuda_render import cuda_plan

NVCC = shutil.which("nvcc")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INT_TYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]

# The cases, run in a child process: each prints "CASE <name> <result>" where the result is
# "value <dtype> <repr>" or "error <vkml's exception class> | <message>".
CHILD = textwrap.dedent(r'''
    import sys, warnings
    import numpy as np
    import vkml

    warnings.simplefilter("ignore")

    def twice(fn, *args):
        """A jitted call made twice: the second call is the compiled one on a tiered backend."""
        f = vkml.jit(fn)
        f(*args)
        return np.asarray(f(*args))

    def int_division():
        for name in %(types)r:
            info = np.iinfo(name)
            signed = info.min < 0
            top = min(int(info.max), int(np.iinfo(np.int64).max))   # uint64 past int64 is refused
            a = np.array([info.min, info.min, 7, top, 0, 5] + ([-7, -7] if signed else [8, 9]),
                         name)
            b = np.array([-1 if signed else 3, 0, 0, 0, 0, 2] + ([2, -2] if signed else [3, 4]),
                         name)
            yield "floordiv_" + name, lambda a=a, b=b: twice(lambda x, y: x // y, a, b)
            yield "mod_" + name, lambda a=a, b=b: twice(vkml.mod, a, b)

    @vkml.kernel
    def hop(x, table: vkml.Param):
        j = x.astype(np.int64)
        return {"x": x + 1.0 + 0.0 * vkml.take(table, j)}

    @vkml.kernel
    def decay(x, k: vkml.Param):
        return {"x": x - 0.01 * k * x}

    def simulation_gather(max_steps):
        x = np.linspace(0.0, 0.5, 8)
        sim = vkml.simulation(hop, max_steps=max_steps, record=True, window=4, x=x,
                              table=np.arange(5.0))
        sim.run()
        return x

    def simulation_reverse_gather():
        """A valid run, then a checkpoint the reverse recomputes from moved out of the table."""
        x = np.linspace(0.0, 0.5, 8)
        sim = vkml.simulation(hop, max_steps=3, record=True, window=2, x=x, table=np.arange(5.0))
        sim.run()
        sim.record.checkpoints[2]["x"][...] = 40.0
        return vkml.diff.reverse(sim.record, {"x": np.ones(8)})["x"]

    def large_window():
        x = np.linspace(0.5, 1.0, 4)
        sim = vkml.simulation(decay, max_steps=30, record=True, window=2_000_000, x=x, k=0.5)
        sim.run()
        return vkml.diff.reverse(sim.record, {"x": np.ones(4)})["x"]

    CASES = {
        "huge_broadcast": lambda: twice(
            lambda x: (vkml.broadcast_to(x, (1 << 22, 1 << 22)) * 2.0).sum(), np.ones(1)),
        "overflowing_shape": lambda: twice(
            lambda x: (vkml.broadcast_to(x, (1 << 32, 1 << 32, 1 << 32)) * 2.0).sum(), np.ones(1)),
        "negative_int_power": lambda: twice(lambda x, y: x ** y, np.array([2, 3]),
                                            np.array([2, -1])),
        "argmax_empty_axis": lambda: twice(lambda x: vkml.argmax(x, axis=1), np.zeros((3, 0))),
        "gather_out_of_range": lambda: twice(vkml.gather, np.arange(4.0), np.array([[0], [5]])),
        "gather_into_empty_slice": lambda: twice(vkml.gather, np.zeros((3, 0)), np.array([[7]])),
        "scatter_out_of_range": lambda: twice(
            vkml.scatter_add, np.zeros(4), np.array([[1], [-1]]), np.ones(2)),
        "simulation_gather_in_range": lambda: simulation_gather(3),
        "simulation_gather_out_of_range": lambda: simulation_gather(10),
        "simulation_reverse_gather_out_of_range": simulation_reverse_gather,
        "large_window_reverse": large_window,
    }

    def run(name, fn):
        try:
            value = fn()
        except Exception as e:
            # the most specific public class (an internal subclass reads as its public parent)
            public = next((c for c in type(e).__mro__ if getattr(vkml, c.__name__, None) is c),
                          type(e))
            print("CASE", name, "error", public.__name__, "|", " ".join(str(e).split())[:200])
        else:
            value = np.asarray(value)
            print("CASE", name, "value", value.dtype.name, repr(value.tolist()))
        sys.stdout.flush()

    which = sys.argv[1]
    cases = list(int_division()) if which == "int_division" else \
        [(n, CASES[n]) for n in which.split(",")]
    for name, fn in cases:
        run(name, fn)
''') % {"types": INT_TYPES}


def run_child(which, backend, tmp_path):
    """Run the cases ``which`` in a fresh process on ``backend``; the process must exit cleanly.
    Returns {case: (kind, value-or-class)}."""
    env = dict(os.environ, VKML_BACKEND=backend, VKML_CPU_HOT="0",
               VKML_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "kit"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, which], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, f"the child crashed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, kind, rest = line.split(" ", 3)
            out[name] = (kind, rest.split(" |")[0] if kind == "error" else rest)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every subprocess case on both backends (run once for the module)."""
    groups = ["int_division",
              "huge_broadcast,overflowing_shape,negative_int_power,argmax_empty_axis,"
              "gather_out_of_range,gather_into_empty_slice,scatter_out_of_range",
              "simulation_gather_in_range,simulation_gather_out_of_range,"
              "simulation_reverse_gather_out_of_range,large_window_reverse"]
    got = {}
    for backend in ("numpy", "cpu"):
        got[backend] = {}
        for group in groups:
            got[backend].update(run_child(group, backend, tmp_path_factory.mktemp(backend)))
    return got


def _numpy_floordiv(a, b):
    with np.errstate(all="ignore"):
        return np.floor_divide(a, b)


@pytest.mark.parametrize("dtype", INT_TYPES)
def test_integer_floor_division_is_numpys_for_every_input(results, dtype):
    """MIN // -1 wraps to MIN, x // 0 is 0: NumPy's answers, never a SIGFPE."""
    info = np.iinfo(dtype)
    signed = info.min < 0
    top = min(int(info.max), int(np.iinfo(np.int64).max))   # uint64 past int64 is refused
    a = np.array([info.min, info.min, 7, top, 0, 5] + ([-7, -7] if signed else [8, 9]), dtype)
    b = np.array([-1 if signed else 3, 0, 0, 0, 0, 2] + ([2, -2] if signed else [3, 4]), dtype)
    for backend in ("numpy", "cpu"):
        kind, value = results[backend][f"floordiv_{dtype}"]
        assert kind == "value", (backend, value)
        used, values = value.split(" ", 1)          # vkml computes in its canonical integer dtype
        a, b = a.astype(used), b.astype(used)
        assert values == repr(_numpy_floordiv(a, b).tolist()), backend
        if f"mod_{dtype}" in results[backend]:
            with np.errstate(all="ignore"):
                want = repr(np.mod(a, b).tolist())
            assert results[backend][f"mod_{dtype}"][1].split(" ", 1)[1] == want, backend


@pytest.mark.parametrize("case, error", [
    ("huge_broadcast", "ExecutionError"),
    ("overflowing_shape", "ShapeError"),
    ("negative_int_power", "ExecutionError"),
    ("argmax_empty_axis", "ShapeError"),        # refused at the call, before anything runs
    ("gather_out_of_range", "ExecutionError"),
    ("gather_into_empty_slice", "ExecutionError"),
    ("scatter_out_of_range", "ExecutionError"),
    ("simulation_gather_out_of_range", "ExecutionError"),
    ("simulation_reverse_gather_out_of_range", "ExecutionError"),
])
def test_risky_input_is_the_same_clean_error_on_every_backend(results, case, error):
    for backend in ("numpy", "cpu"):
        assert results[backend][case] == ("error", error), (backend, results[backend][case])
        assert issubclass(getattr(vkml, error), vkml.VkmlError)


def test_what_runs_gives_the_same_values_on_every_backend(results):
    """The in-range simulation, and a reverse whose window (2,000,000 steps) would overflow a
    thread's stack, give the NumPy backend's values on the cpu tier."""
    for case in ("simulation_gather_in_range", "large_window_reverse"):
        kind, value = results["cpu"][case]
        assert kind == "value" and results["numpy"][case][0] == "value", (case, value)
        np.testing.assert_allclose(eval(value.split(" ", 1)[1]),
                                   eval(results["numpy"][case][1].split(" ", 1)[1]), rtol=1e-12)


# -- the scalar helpers every renderer shares ---------------------------------------------------

def _edge_pairs(dtype):
    info = np.iinfo(dtype)
    values = [info.min, info.min + 1, -7, -2, -1, 0, 1, 2, 7, info.max - 1, info.max]
    a = np.array([x for x in values for _ in values], dtype)
    b = np.array([y for _ in values for y in values], dtype)
    return a, b


HELPER_DRIVER = r"""
void vk_helpers_%(T)s(const %(T)s* a, const %(T)s* b, %(T)s* q, %(T)s* r, %(T)s* p, long long n) {
    for (long long i = 0; i < n; i++) {
        q[i] = vk_floordiv_%(T)s(a[i], b[i]);
        r[i] = vk_mod_%(T)s(a[i], b[i]);
        p[i] = vk_ipow_%(T)s(a[i], b[i] < 0 ? 0 : b[i]);
    }
}
"""


def _check_helpers(lib, dtype, ctype):
    a, b = _edge_pairs(dtype)
    q, r, p = (np.empty_like(a) for _ in range(3))
    fn = getattr(lib, f"vk_helpers_{ctype}")
    fn(*(ctypes.c_void_p(x.ctypes.data) for x in (a, b, q, r, p)), ctypes.c_longlong(a.size))
    e = np.where(b < 0, 0, b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(q, np.floor_divide(a, b))
        np.testing.assert_array_equal(r, np.mod(a, b))
        np.testing.assert_array_equal(p, np.power(a, e))


def test_c_helpers_divide_and_power_as_numpy_for_every_edge_case(tmp_path):
    source = prelude() + "".join(HELPER_DRIVER % {"T": t} for t in ("int32_t", "int64_t"))
    src = tmp_path / "helpers.c"
    src.write_text(source)
    so = tmp_path / "helpers.so"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-std=c99", "-ftrapv", "-o", str(so),
                           str(src), "-lm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(so))
    for dtype, ctype in ((np.int32, "int32_t"), (np.int64, "int64_t")):
        _check_helpers(lib, dtype, ctype)


# -- the CUDA renderer ----------------------------------------------------------------------------

def _cuda_cases():
    """(label, program, args, expected status primitive or None) for the CUDA checks."""
    i64 = np.iinfo(np.int64)
    a = np.array([i64.min, i64.min, 7, -7, 7, 0], np.int64)
    b = np.array([-1, 0, 0, 2, -2, 0], np.int64)
    i32 = np.iinfo(np.int32)
    a32 = np.array([i32.min, 5, -5], np.int32)
    b32 = np.array([-1, 0, 3], np.int32)
    x = np.arange(12.0).reshape(4, 3)
    return [
        ("floordiv64", vkml.program(lambda x, y: x // y + x // (y + 1), a, b), [a, b], None),
        ("floordiv32", vkml.program(lambda x, y: x // y, a32, b32), [a32, b32], None),
        ("pow_ok", vkml.program(lambda x, y: x ** y, a32, np.abs(b32)), [a32, np.abs(b32)], None),
        ("pow_negative", vkml.program(lambda x, y: x ** y, a32, b32), [a32, b32], "pow"),
        ("gather", vkml.program(lambda x, i: vkml.gather(x, i) * 2.0, x, np.array([[0], [9]])),
         [x, np.array([[0], [9]])], "gather"),
        ("gather_empty_slice", vkml.program(vkml.gather, np.zeros((3, 0)), np.array([[5]])),
         [np.zeros((3, 0)), np.array([[5]])], "gather"),
    ]


@pytest.fixture(scope="module")
def cuda_cases():
    cases = []
    for i, (label, prog, args, failing) in enumerate(_cuda_cases()):
        cases.append((label, prog, args, failing, cuda_plan(prog, prefix=f"vk_s{i}_")))
    return cases


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_cuda_division_power_and_index_kernels_compile_with_nvcc(cuda_cases, tmp_path):
    path = tmp_path / "safety.cu"
    path.write_text(cuda_render.module_source([c[-1] for c in cuda_cases], namespaces=True))
    proc = subprocess.run([NVCC, "--ptx", "-arch=sm_90", *cuda_render.NVCC_FLAGS, "-o",
                           str(tmp_path / "safety.ptx"), str(path)], capture_output=True, text=True)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stderr[-3000:]


@pytest.mark.skipif(CXX is None, reason="no C++ compiler for the emulated kernels")
def test_cuda_kernels_give_numpys_answers_or_report_the_failing_primitive(cuda_cases, tmp_path):
    lib = host_library(cuda_render.module_source([c[-1] for c in cuda_cases], namespaces=True),
                       str(tmp_path), "safety")
    for label, prog, args, failing, plan in cuda_cases:
        avals = [(v.shape, v.dtype) for v in prog.outputs]
        outs, status = emulate(lib, plan, [np.asarray(a) for a in args], avals)
        code = int(status[0])
        if failing is None:
            assert code == 0, label
            with np.errstate(all="ignore"):
                want = vkml.backends.numpy_backend.compile_program(prog)(args)
            for o, w in zip(outs, want):
                np.testing.assert_array_equal(o, w, err_msg=label)
        else:
            assert code and plan.errors[code - 1] == failing, (label, status)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler for the emulated kernels")
def test_a_gather_out_of_range_inside_cuda_sample_loops_is_an_execution_error():
    """The simulation's per-sample loops on the emulated CUDA driver report the failing sample's
    gather instead of skipping it."""
    @vkml.kernel
    def hop(x, table: vkml.Param):
        return {"x": x + 1.0 + 0.0 * vkml.take(table, x.astype(np.int64))}

    with fake_driver():
        vkml.set_backend("cuda")
        try:
            x = np.linspace(0.0, 0.5, 8)
            ok = vkml.simulation(hop, max_steps=3, record=True, window=4, x=x, table=np.arange(5.0))
            ok.run()                      # on the GPU: its device plane (x was copied there)
            np.testing.assert_array_equal(ok.planes["x"].numpy(),
                                          np.linspace(0.0, 0.5, 8) + 1.0 + 1.0 + 1.0)
            x = np.linspace(0.0, 0.5, 8)
            bad = vkml.simulation(hop, max_steps=10, record=True, window=4, x=x,
                                  table=np.arange(5.0))
            with pytest.raises(vkml.ExecutionError, match="gather.*index 5 is out of range"):
                bad.run()
            np.testing.assert_array_equal(bad.planes["x"].numpy(), np.linspace(0.0, 0.5, 8))
        finally:
            vkml.set_backend("numpy")
