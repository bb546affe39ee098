"""The first minute on a GPU: six checks that each fail loudly if the CUDA backend cannot work at
all, before the long test runs (``scripts/device-check`` runs this first).

1. graph replay: the same program twice, the second run replays its captured CUDA graph;
2. a gather index out of range is an ExecutionError naming the index, the axis and its size;
3. ``tree_sum`` on the device has the host's bits;
4. one product through cuBLAS (or the tiled kernel, when cuBLAS is not found: said so);
5. a NaN / infinity to int32 cast gives NumPy's results (a GPU would saturate);
6. a run on a thread of its own, in a fresh interpreter: the thread ends and the process exits
   cleanly (PyCUDA aborts when a thread ends with a context still pushed).

``VKML_EMULATED_CUDA=1`` runs them on the emulated driver of ``tests/cuda_emulation.py`` (no GPU).
Prints one line per check; exit status 1 when any failed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMULATED = os.environ.get("VKML_EMULATED_CUDA") == "1"

THREAD_CHILD = """
import os, sys, threading, numpy as np
sys.path.insert(0, os.path.join({root!r}, "tests"))
import vkml
from contextlib import nullcontext
if os.environ.get("VKML_EMULATED_CUDA") == "1":
    from cuda_emulation import fake_driver
    driver = fake_driver()
else:
    driver = nullcontext()
with driver:
    vkml.set_backend("cuda")
    out = {{}}
    def work():
        out["y"] = (vkml.tensor(np.arange(8.0)) * 3.0).numpy()
    t = threading.Thread(target=work)
    t.start(); t.join()
    assert out["y"].tolist() == [3.0 * i for i in range(8)], out
    vkml.set_backend("numpy")
print("thread ok")
"""


def check_replay(vkml, backend):
    x = np.linspace(-1.0, 1.0, 4096, dtype=np.float32)
    first = (vkml.tanh(vkml.tensor(x)) * 2.0 + 1.0).numpy()
    vkml.reset_stats()
    again = (vkml.tanh(vkml.tensor(x)) * 2.0 + 1.0).numpy()
    s = vkml.stats()
    assert s.graph_launches == 1 and s.compiles == 0, s
    assert first.tobytes() == again.tobytes()
    np.testing.assert_allclose(again, np.tanh(x) * 2.0 + 1.0, rtol=2e-6, atol=2e-6)
    return f"second run replayed its graph ({backend.captures} captured)"


def check_gather(vkml, backend):
    x = vkml.tensor(np.arange(12.0).reshape(4, 3))
    try:
        vkml.take(x, vkml.tensor(np.array([0, 7])), axis=0).numpy()
    except vkml.ExecutionError as e:
        assert "index 7 is out of range for axis 0 of size 4" in str(e), e
        return "ExecutionError: " + str(e).split("\n")[0][:70]
    raise AssertionError("an out-of-range gather index raised nothing")


def check_tree_sum(vkml, backend):
    from vkml.graph.treesum import tree_sum
    rng = np.random.default_rng(0)
    sizes = (1, 1025, 5000) if EMULATED else (1, 1025, 70_000)   # the emulator is slow
    for n in sizes:
        x = (rng.normal(size=(n, 3)) * 10.0 ** rng.integers(-6, 6, (n, 3))).astype(np.float32)
        assert backend.tree_sum(x).tobytes() == tree_sum(x).tobytes(), n
    return f"bitwise equal at {', '.join(map(str, sizes))} samples"


def check_cublas(vkml, backend):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(128, 128)), rng.normal(size=(128, 128))
    for _ in range(2):                 # the first run uncaptured (cuBLAS sets itself up), then a replay
        c = vkml.matmul(vkml.tensor(a), vkml.tensor(b)).numpy()
        np.testing.assert_allclose(c, a @ b, rtol=1e-10, atol=1e-10)
    path = backend.info()["cublas"]
    return f"cuBLAS {os.path.basename(path)}" if path else "no cuBLAS found: the tiled kernel"


def check_cast(vkml, backend):
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -2.5])
    with np.errstate(invalid="ignore"):
        want = x.astype(np.int32)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = vkml.tensor(x).astype(np.int32).numpy()
    assert got.tolist() == want.tolist(), (got, want)
    return f"NaN, +-inf, 3e9, -2.5 -> {got.tolist()} (NumPy's)"


def check_thread():
    proc = subprocess.run([sys.executable, "-c", THREAD_CHILD.format(root=ROOT)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "thread ok" in proc.stdout, \
        f"exit {proc.returncode}: {proc.stderr[-600:]}"
    return "the thread ended and the process exited cleanly"


def main() -> int:
    import vkml
    driver = contextlib.nullcontext()
    if EMULATED:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from cuda_emulation import fake_driver
        driver = fake_driver()
    failed = 0
    with driver:
        try:
            backend = vkml.set_backend("cuda")
        except vkml.BackendError as e:
            print(f"smoke: the cuda backend does not start: {e}")
            return 1
        print(f"smoke: {vkml.backend_info()['cuda']}")
        checks = [("graph replay", check_replay), ("bad gather index", check_gather),
                  ("tree_sum bits", check_tree_sum), ("cuBLAS product", check_cublas),
                  ("NaN-to-int cast", check_cast)]
        for name, check in checks:
            t0 = time.perf_counter()
            try:
                what = check(vkml, backend)
                print(f"smoke: {name:<18} ok      {time.perf_counter() - t0:6.2f}s  {what}")
            except Exception:
                failed += 1
                print(f"smoke: {name:<18} FAILED  {time.perf_counter() - t0:6.2f}s")
                traceback.print_exc(limit=4)
        vkml.set_backend("numpy")
    t0 = time.perf_counter()
    try:
        what = check_thread()
        print(f"smoke: {'GPU thread':<18} ok      {time.perf_counter() - t0:6.2f}s  {what}")
    except Exception as e:
        failed += 1
        print(f"smoke: {'GPU thread':<18} FAILED  {time.perf_counter() - t0:6.2f}s  {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
