"""The compiled CPU tier: its floating-point contract, its disk cache, its fallback."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import vkml
from vkml.backends import cpu

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="no C compiler on this machine")

RNG = np.random.default_rng(7)


def on_both(fn, *args):
    """``fn`` run on the NumPy backend and, compiled, on the cpu tier."""
    out = []
    for name in ("numpy", "cpu"):
        vkml.set_backend(name)
        res = fn(*[vkml.tensor(a) for a in args])
        out.append(res.numpy())
    vkml.set_backend("numpy")
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "sqrt", "chain"])
def test_exact_operations_have_numpys_bits(op, dtype, monkeypatch):
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    a = RNG.uniform(0.1, 10, (5, 7)).astype(dtype)
    b = RNG.uniform(0.1, 10, (5, 7)).astype(dtype)
    fns = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
           "div": lambda x, y: x / y, "sqrt": lambda x, y: vkml.sqrt(x) + y,
           "chain": lambda x, y: ((x * y - x) / (y + 1.5)) * vkml.sqrt(x * x + y) - y}
    ref, got = on_both(fns[op], a, b)
    assert got.dtype == ref.dtype == dtype
    np.testing.assert_array_equal(got, ref)        # bit for bit: no FMA, no reassociation


def test_transcendentals_within_the_stated_tolerance(monkeypatch):
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    x = RNG.uniform(-3, 3, 1000)
    for fn in (vkml.sin, vkml.cos, vkml.tanh, vkml.exp):
        ref, got = on_both(fn, x)
        np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-15)
    ref, got = on_both(vkml.log, np.abs(x) + 0.1)
    np.testing.assert_allclose(got, ref, rtol=1e-13)


def test_canonical_tree_sums_are_bitwise_equal_to_numpys(monkeypatch):
    """A graph whose kernel uses +, -, *, / only: per-sample and Param gradients, the latter
    canonical-tree sums, have the same bits on both backends."""
    monkeypatch.setenv("VKML_CPU_HOT", "0")

    @vkml.kernel
    def poly(x, a: vkml.Param, b: vkml.Param):
        return {"y": (a * x * x + b * x) / (x + 2.0)}

    results = []
    for name in ("numpy", "cpu"):
        vkml.set_backend(name)
        n = 3000
        x = np.linspace(-1, 1, n)
        y = np.zeros(n)
        g = vkml.Graph().add(poly.bind(x=x, a=0.3, b=-1.7, y=y), name="poly").build(record=True)
        g.launch()
        grads = vkml.diff.reverse(g.record, {"y": np.cos(x)})
        results.append((y.copy(), grads["x"], grads["a"], grads["b"]))
    vkml.set_backend("numpy")
    for r, c in zip(*results):
        np.testing.assert_array_equal(r, c)


def test_a_scan_runs_inside_one_compiled_call(monkeypatch):
    monkeypatch.setenv("VKML_CPU_HOT", "1")
    vkml.set_backend("cpu")
    vkml.clear_caches()        # only this test's executables (others' may hold the word "row")

    def body(xs):
        _, ys = vkml.scan(lambda c, r: (c * 0.5 + r, c), np.float64(0.0), xs)
        return vkml.sum(ys)

    f = vkml.jit(body)
    f(np.ones(1000))
    exe = next(e for e in vkml.backends.current()._executables.values()
               if isinstance(e, cpu.CompiledProgram) and "row" in e.source)
    assert "for (int64_t row" in exe.source            # the loop over rows is C, not Python
    s0 = vkml.stats()
    f(np.ones(1000))
    assert (vkml.stats() - s0).submissions == 1


CHILD = textwrap.dedent("""
    import json, numpy as np, vkml
    vkml.set_backend("cpu")
    f = vkml.jit(lambda x: vkml.tanh(x) * 3.0 + x * x - 0.25)
    out = f(np.linspace(0, 1, 257)).numpy()
    print(json.dumps({"compiles": vkml.stats().compiles, "hits": vkml.stats().cache_hits,
                      "first": float(out[3])}))
""")


def _child(env):
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         check=True)
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_reuses_the_cached_library_and_a_corrupted_one_is_rebuilt(tmp_path):
    env = dict(os.environ, VKML_CACHE_DIR=str(tmp_path), VKML_CPU_HOT="0")
    first = _child(env)
    assert first["compiles"] == 1                        # built once
    second = _child(env)
    assert second["compiles"] == 0 and second["hits"] >= 1 and second["first"] == first["first"]
    libs = list((tmp_path / "cpu").glob("*.so"))
    assert len(libs) == 1
    assert oct((tmp_path / "cpu").stat().st_mode & 0o777) == "0o700"
    with open(libs[0], "r+b") as f:                      # corrupt it: flip bytes in the middle
        f.seek(2000)
        f.write(b"\x00garbage\x00")
    third = _child(env)
    assert third["compiles"] == 1 and third["first"] == first["first"]   # detected, rebuilt
    fourth = _child(env)
    assert fourth["compiles"] == 0
    os.chmod(libs[0], 0o666)                             # writable by others: never loaded
    fifth = _child(env)
    assert fifth["compiles"] == 1


def test_without_a_compiler_it_falls_back_to_numpy_and_says_so(tmp_path):
    code = textwrap.dedent("""
        import warnings, numpy as np, vkml
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            vkml.set_backend("cpu")
            x = vkml.tensor(np.arange(3.0))
            print((x * 2).numpy().tolist(), vkml.backend_info()["compiler"], len(w), str(w[0].message))
    """)
    env = dict(os.environ, CC="/nonexistent-cc", PATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    line = out.stdout.strip()
    assert line.startswith("[0.0, 2.0, 4.0] None 1 vkml: no C compiler found")


def _default_backend_in_a_fresh_process(env):
    code = ("import vkml; info = vkml.backend_info(); "
            "print(info['backend'] + '|' + info['default'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().split("|")


def test_the_compiled_tier_is_the_default_where_a_compiler_is_found(tmp_path):
    """A fresh ``import vkml`` runs on the cpu tier where a C compiler is found and says why;
    without one on NumPy, saying what would change that; VKML_BACKEND decides when set."""
    unset = {k: v for k, v in os.environ.items() if k != "VKML_BACKEND"}
    name, why = _default_backend_in_a_fresh_process(unset)
    assert name == "cpu" and why.startswith("cpu: a C compiler was found (") and cpu.compiler() in why
    name, why = _default_backend_in_a_fresh_process(dict(unset, CC="/nonexistent-cc",
                                                         PATH=str(tmp_path)))
    assert name == "numpy" and "C compiler" in why and "cpu tier" in why
    name, why = _default_backend_in_a_fresh_process(dict(os.environ, VKML_BACKEND="numpy"))
    assert (name, why) == ("numpy", "numpy: VKML_BACKEND=numpy")


def test_a_compile_longer_than_a_second_is_announced_where_progress_is_shown(tmp_path, monkeypatch,
                                                                             capfd):
    """A compiler taking 1.3 s: with progress on, a note names the compile when it passes a
    second and its time when it ends; with progress off (scripts, tests) nothing is printed."""
    slow = tmp_path / "slow-cc"
    slow.write_text(f"#!/bin/sh\nsleep 1.3\nexec {cpu.compiler()} \"$@\"\n")
    slow.chmod(0o755)
    for shown in ("1", "0"):
        monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path / f"cache{shown}"))
        monkeypatch.setenv("VKML_PROGRESS", shown)
        monkeypatch.setenv("CC", str(slow))
        lib, compiled = cpu.library(f"int vk_note_{shown}(void) {{ return 7; }}\n")
        assert compiled and getattr(lib, f"vk_note_{shown}")() == 7
        err = capfd.readouterr().err
        if shown == "1":
            assert "vkml: compiling a new program" in err and "vkml: compiled in 1." in err
        else:
            assert "vkml:" not in err


def test_generated_source_for_a_fused_chain_is_one_loop(monkeypatch):
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    prog = vkml.program(lambda x: ((x * 2.0 + 1.0) * x - 3.0) / (x + 4.0), np.ones(100))
    source, _ = cpu.c_source(prog)
    body = source.split("int vk_main")[1]
    assert body.count("for (int64_t") == 1              # four elementwise ops, one loop, no temps
    assert "malloc" not in body


def test_a_jitted_function_closing_over_a_large_array_is_compiled(on_cpu, monkeypatch):
    """A constant of more than ``STATIC_MAX`` elements (a dataset the function closes over) is
    handed to the C function as an argument, not written into its source: the program is
    compiled (it fell back to NumPy), its value and gradient are NumPy's, the constant is never
    written (no result is computed in its buffer), and the source holds none of its data."""
    from vkml.backends.codegen.lower import STATIC_MAX
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    data = RNG.uniform(-1, 1, (2000, 40))        # (past 65,536 elements: was a fallback)
    assert data.size > STATIC_MAX
    kept = data.copy()
    small = RNG.uniform(-1, 1, 7)

    def loss(w):
        return vkml.sum(vkml.tanh(data @ w[:40]) * 2.0) + vkml.sum(w[40:] * small)

    w = RNG.uniform(-1, 1, 47)
    before = vkml.backend_info()["numpy fallbacks"]
    value = vkml.jit(loss)(w).item()
    grad = vkml.jit(vkml.grad(loss))(w).numpy()
    update = vkml.jit(lambda w: data * w[0] + 1.0)(w).numpy()     # a result of the constant's shape
    assert vkml.backend_info()["numpy fallbacks"] == before
    np.testing.assert_allclose(value, np.sum(np.tanh(data @ w[:40]) * 2.0) + np.sum(w[40:] * small),
                               rtol=1e-12)
    inner = 1.0 - np.tanh(data @ w[:40]) ** 2
    np.testing.assert_allclose(grad, np.concatenate([data.T @ (2.0 * inner), small]), rtol=1e-10)
    np.testing.assert_array_equal(update, data * w[0] + 1.0)
    np.testing.assert_array_equal(data, kept)
    source, lowering = cpu.c_source(vkml.program(loss, w))
    assert len(lowering.lifted) == 1 and repr(float(data[0, 0]))[:12] not in source
