"""The bench helpers: the interleaving order and its min-of-medians, the pinning, and the bench
scripts end to end in their quick mode (counts and exit codes only: no timing is asserted)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import _timing  # noqa: E402
import run_all  # noqa: E402


def tree_env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "kit"), str(ROOT / "extensions")]))


def table_rows(out):
    """The first word of every row of the printed tables (a name, then a time)."""
    rows = set()
    for line in out.splitlines():
        words = line.split()
        number = len(words) > 1 and words[1].replace(",", "").replace(".", "").isdigit()
        if line.startswith("  ") and number:
            rows.add(words[0])
    return rows


def test_interleave_alternates_sides_and_keeps_the_least_median_of_each_phase():
    calls = []
    script = {"a": iter([(9.0, 9.0), (3.0, 5.0), (4.0, 1.0)]), "b": iter([(9.0,), (2.0,), (7.0,)])}

    def side(name):
        def one_round():
            calls.append(name)
            return next(script[name])
        return one_round

    best = _timing.interleave({"a": side("a"), "b": side("b")}, rounds=2, warmup_rounds=1)
    assert calls == ["a", "b", "b", "a", "a", "b"]          # the order rotates every round
    assert best == {"a": (3.0, 1.0), "b": (2.0,)}           # the warm-up round (9s) is discarded
    assert list(best) == ["a", "b"]


def test_sampler_runs_between_untimed_before_every_repetition_and_each_phase_number_times():
    log = []
    one_round = _timing.sampler(lambda: log.append("first"), lambda: log.append("second"), reps=3,
                                number=2, between=lambda: log.append("between"))
    medians = one_round()
    assert len(medians) == 2 and all(m >= 0 for m in medians)
    assert log == ["between", "first", "first", "second", "second"] * 3


def test_time_sides_gives_one_number_per_side_in_order():
    counts = {"x": 0, "y": 0}

    def bump(k):
        counts[k] += 1

    out = _timing.time_sides({"x": lambda: bump("x"), "y": lambda: bump("y")}, rounds=3, reps=4,
                             warmup_rounds=1)
    assert list(out) == ["x", "y"] and all(isinstance(v, float) for v in out.values())
    assert counts == {"x": 16, "y": 16}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_pin_binds_the_process_to_one_cpu_and_sets_one_thread_everywhere():
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import _timing; "
            "_timing.pin(cpu=min(os.sched_getaffinity(0))); "
            "print(len(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
            "os.environ['VKML_THREADS'], os.environ['OPENBLAS_NUM_THREADS'])")
    out = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["1", "1", "1", "1"]


def test_run_all_finds_the_benches_but_not_the_helpers_or_tools():
    names = [Path(p).name for p in run_all.benches()]
    assert {"compiled.py", "mlp_step.py", "scan_grad.py", "graph_reverse.py", "simulation.py",
            "gpu.py", "gemm.py", "training.py"} <= set(names)
    assert not any(n.startswith("_") or n in run_all.TOOLS for n in names)


def test_ab_help_and_a_bad_bench_name():
    ok = subprocess.run([sys.executable, str(BENCH / "ab.py"), "--help"], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and "--quick" in ok.stdout and "new/old" in ok.stdout
    bad = subprocess.run([sys.executable, str(BENCH / "ab.py"), "HEAD", "--bench", "nosuch"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "nosuch" in bad.stderr


def test_a_quick_bench_runs_end_to_end_with_or_without_its_peers():
    proc = subprocess.run([sys.executable, str(BENCH / "mlp_step.py"), "--quick", "--repeat", "5"],
                          capture_output=True, text=True, timeout=120, env=tree_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "one training step" in proc.stdout and "pinned to CPU" in proc.stdout
    assert {"vkml", "numpy"} <= table_rows(proc.stdout)


def test_a_bench_runs_its_vkml_side_and_notes_a_missing_peer():
    # None in sys.modules makes `import eagle` fail, as on a machine without the peer
    code = ("import runpy, sys; sys.modules.update(eagle=None, hawk=None, jax=None, torch=None); "
            "sys.argv = ['graph_reverse.py', '--quick', '--sizes', '1000']; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=tree_env(), cwd=BENCH)
    assert proc.returncode == 0, proc.stderr
    assert "eagle unavailable" in proc.stdout
    assert {"vkml", "numpy"} <= table_rows(proc.stdout) and "eagle" not in table_rows(proc.stdout)


def test_the_training_bench_runs_vkml_and_names_each_missing_peer():
    """``training.py`` on one step: vkml's compiled step and the hand-written NumPy one agree on
    the first loss and are timed; each peer that cannot be imported is named as skipped, and the
    table names the CPU."""
    code = ("import runpy, sys; sys.modules.update(jax=None, torch=None); "
            "sys.argv = ['training.py', '--quick', '--only', 'mlp-256']; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=tree_env(), cwd=BENCH)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "CPU: " in out and "mlp-256: vkml ready" in out and "mlp-256: numpy ready" in out
    for peer in ("torch", "torch.compile", "jax.jit"):
        assert f"mlp-256: {peer} skipped" in out, peer
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("mlp-256 "))
    assert row[1].replace(".", "", 1).isdigit() and row[3].endswith("x"), row   # time, /numpy


def test_no_bench_script_shadows_an_installed_package():
    """The benches (and these tests) put bench/ first on sys.path: a script named like an installed
    package (a bench/distributed.py) hid Dask's ``distributed`` from everything imported later."""
    import importlib.metadata
    installed = set(importlib.metadata.packages_distributions())
    clashes = sorted(p.stem for p in BENCH.glob("*.py") if p.stem in installed)
    assert not clashes, f"bench scripts named like installed packages: {clashes}"


def test_the_gemm_bench_describes_each_layout_to_mkl_as_cblas_reads_it():
    """``gemm.py``'s MKL side passes cblas_?gemm (row-major) a transpose flag and a leading
    dimension per operand: a stand-in library that reads the operands back from those, as cblas
    does, gets ``a @ b`` for a row-major operand and for a transposed view alike."""
    import ctypes

    import numpy as np
    gemm_bench = pytest.importorskip("gemm")

    calls = []

    def cblas_gemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        assert order == 101 and alpha.value == 1.0 and beta.value == 0.0
        calls.append((ta, tb))
        real = np.ctypeslib.as_ctypes_type(np.float32 if isinstance(alpha, ctypes.c_float)
                                           else np.float64)

        def at(ptr, shape):
            return np.ctypeslib.as_array(ctypes.cast(ptr.value, ctypes.POINTER(real)), shape=shape)

        def read(ptr, trans, rows, cols, ld):         # the (rows, cols) operand cblas reads
            return at(ptr, (cols, ld))[:, :rows].T if trans == 112 else at(ptr, (rows, ld))[:, :cols]
        at(c, (m, ldc))[:, :n] = read(a, ta, m, k, lda) @ read(b, tb, k, n, ldb)

    class CblasStandIn:
        cblas_sgemm = cblas_dgemm = staticmethod(cblas_gemm)

    lib = CblasStandIn()
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        for ta in (False, True):
            for tb in (False, True):
                a = gemm_bench.operand(rng, 5, 7, dtype, ta)
                b = gemm_bench.operand(rng, 7, 3, dtype, tb)
                c = np.full((5, 3), np.nan, dtype)
                gemm_bench.mkl_side(lib, a, b, c, 2)()
                np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    assert sorted(set(calls)) == [(111, 111), (111, 112), (112, 111), (112, 112)]
    assert len(calls) == 16
    lib, said = gemm_bench.mkl_library(1)             # (None where MKL is not installed)
    assert said.startswith("MKL: ") and (lib is not None or "not installed" in said)
