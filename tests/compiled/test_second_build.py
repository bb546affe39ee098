"""A big program's first build is a quick -O1 one; its -O2 build follows on a background thread
after the first call, and the program switches to it only where it gives the same bits (the
same vector versions of libm).  The size a program must have is lowered here so that a small
program stands in for a CNN's or a transformer's step."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import vkml
from vkml.backends import background, cpu
from vkml.backends.numpy_backend import compile_program

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def _step_program():
    """A small training step's program: products, tanh and exp (vector libm), a reduction."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    w1 = (rng.standard_normal((48, 32)) / 7).astype(np.float32)
    w2 = (rng.standard_normal((32, 5)) / 6).astype(np.float32)

    def loss(w1, w2, x):
        h = vkml.tanh(x @ w1)
        return vkml.sum(vkml.exp(h @ w2 * 0.5))
    return vkml.program(vkml.value_and_grad(loss, argnums=(0, 1)), w1, w2, x), [w1, w2, x]


def _compile(prog):
    """``prog``'s compiled C function on the cpu tier, calling libm's vector versions."""
    backend = vkml.backends.current()
    exe = backend._compile_c(prog, backend.graph_variant())
    assert cpu.SIMD_MARKER in exe.source
    return exe


@pytest.fixture
def builds(monkeypatch):
    """Each compile of a generated program: ``(optimisation level, thread name)``, with quick
    first builds on (the suite turns them off elsewhere: see conftest)."""
    monkeypatch.setenv("VKML_SECOND_BUILD", "1")
    assert background.wait(120)
    seen = []
    real = cpu._compile_c

    def spy(cc, flags, source, folder):
        if "vk_gemm_lib_" not in source:
            seen.append(("-O1" if "-O1" in flags else "-O2", threading.current_thread().name))
        return real(cc, flags, source, folder)
    monkeypatch.setattr(cpu, "_compile_c", spy)
    return seen


def test_the_quick_build_runs_first_then_the_optimised_one_with_the_same_bits(
        on_cpu, monkeypatch, builds):
    monkeypatch.setattr(cpu, "SECOND_BUILD_SOURCE", 1000)
    prog, args = _step_program()
    exe = _compile(prog)
    assert builds == [("-O1", "MainThread")]
    assert not exe.optimised.is_set(), "the second build waits for the first call"
    first = [np.array(r) for r in exe(args)]
    assert exe.optimised.wait(120)
    assert builds == [("-O1", "MainThread"), ("-O2", "vkml-optimise")]
    assert len(exe._keep) == 2, "switched to the optimised build"
    again = exe(args)
    for a, b in zip(first, again):
        assert a.tobytes() == np.asarray(b).tobytes()
    for a, w in zip(first, compile_program(prog)(args)):
        np.testing.assert_allclose(a, np.asarray(w), rtol=2e-5, atol=2e-5)
    # the cache keeps the optimised build: the program's next build loads it, compiling nothing
    compiles = cpu.STATS.compiles
    exe2 = _compile(prog)
    assert cpu.STATS.compiles == compiles and exe2.optimised.is_set()
    assert builds == [("-O1", "MainThread"), ("-O2", "vkml-optimise")]
    for a, b in zip(first, exe2(args)):
        assert a.tobytes() == np.asarray(b).tobytes()


def test_an_optimised_build_calling_other_vector_versions_is_not_switched_to(
        on_cpu, monkeypatch, builds):
    monkeypatch.setattr(cpu, "SECOND_BUILD_SOURCE", 1000)
    real = cpu.math_imports

    def other_versions(data, names):
        found = real(data, names)
        if threading.current_thread().name == "vkml-optimise":
            found = {name: {"_ZGVbN4v_" + name} for name in found}
        return found
    monkeypatch.setattr(cpu, "math_imports", other_versions)
    prog, args = _step_program()
    exe = _compile(prog)
    first = [np.array(r) for r in exe(args)]
    assert exe.optimised.wait(120)
    assert builds == [("-O1", "MainThread"), ("-O2", "vkml-optimise")]
    assert len(exe._keep) == 1, "kept the quick build"
    for a, b in zip(first, exe(args)):
        assert a.tobytes() == np.asarray(b).tobytes()


def test_small_programs_and_the_switch_turned_off_build_once_at_O2(on_cpu, monkeypatch, builds):
    prog, args = _step_program()
    exe = _compile(prog)          # below the default size
    assert builds == [("-O2", "MainThread")] and exe.optimised.is_set()
    monkeypatch.setattr(cpu, "SECOND_BUILD_SOURCE", 1000)
    monkeypatch.setenv("VKML_SECOND_BUILD", "0")
    prog2 = vkml.program(lambda x: vkml.sum(vkml.tanh(x @ x.T) * 3.0), args[2])
    exe2 = _compile(prog2)
    assert builds == [("-O2", "MainThread")] * 2 and exe2.optimised.is_set()


def test_a_bad_VKML_SECOND_BUILD_is_refused_with_the_fix_and_builds_nothing(
        on_cpu, monkeypatch, builds):
    monkeypatch.setattr(cpu, "SECOND_BUILD_SOURCE", 1000)
    monkeypatch.setenv("VKML_SECOND_BUILD", "yes")
    prog, _ = _step_program()
    with pytest.raises(vkml.ArgumentError, match="VKML_SECOND_BUILD must be 1 .* or 0"):
        _compile(prog)
    assert builds == []
    assert "VKML_SECOND_BUILD must be" in vkml.backend_info()["big programs"]
    monkeypatch.setenv("VKML_SECOND_BUILD", "1")
    assert "-O1 for the first call" in vkml.backend_info()["big programs"]


def test_a_process_ending_during_a_second_build_leaves_no_compiler_and_no_build_folder(tmp_path):
    """The optimised build is still compiling when the script ends (its compiler made to take a
    minute): the compiler is stopped, its scratch folder removed, and the process ends at once."""
    slow_cc = tmp_path / "slow-cc"
    slow_cc.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys, time
        if "-O2" in sys.argv and os.environ.get("SLOW_O2"):
            time.sleep(60)
        os.execvp("cc", ["cc"] + sys.argv[1:])
    """))
    slow_cc.chmod(0o755)
    script = textwrap.dedent(f"""
        import os, threading, time, numpy as np, vkml
        from vkml.backends import cpu
        vkml.set_backend("cpu")
        x = np.random.default_rng(0).standard_normal((40, 40)).astype(np.float32)
        vkml.jit(lambda x: x @ x)(x)                    # the GEMM library, at -O2
        os.environ.update(CC={str(slow_cc)!r}, SLOW_O2="1")
        cpu.SECOND_BUILD_SOURCE = 1000
        vkml.jit(lambda x: vkml.sum(vkml.exp(vkml.tanh(x @ x.T) * x)))(x)
        start = time.time()
        while not any(t.name == "vkml-optimise" for t in threading.enumerate()):
            time.sleep(0.01)
        time.sleep(0.5)                                 # its compiler is running
        print("leaving", flush=True)
    """)
    cache = tmp_path / "cache"
    env = dict(os.environ, VKML_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(sys.path),
               VKML_SECOND_BUILD="1")
    env.pop("CC", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stderr
    assert "leaving" in done.stdout
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(cache) not in ps and str(slow_cc) not in ps
    left = [name for _, dirs, _ in os.walk(cache) for name in dirs if name.startswith(".build-")]
    assert not left
