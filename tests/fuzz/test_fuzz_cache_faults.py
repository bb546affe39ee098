"""The compiled-code cache failing under a build costs a recompile, never a program.

A cache folder that is full (a real 64 KiB tmpfs, or a file-size limit the kernel enforces),
read-only, or removed while a program compiles: the program still runs, with the bits of the
NumPy backend's run, and the user sees one ``VkmlWarning`` per problem.  Each case runs in a child
process (its own cache folder, limits and warnings).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None and
                                shutil.which("cc") is None, reason="needs a C compiler")

#: programs of several kinds, each compiled anew (random constants: no earlier cache entry)
PROGRAMS = """
    import json, random, warnings
    import numpy as np
    import vkml
    r = random.Random()
    c = r.random()
    x = np.linspace(-1.0, 1.0, 257)

    def f(x):
        return vkml.sum(vkml.sin(x * c) * vkml.exp(x) + c)

    def body(carry, row):
        nxt = carry * 0.5 + row * c
        return nxt, nxt

    def g(xs):
        return vkml.scan(body, 0.0, xs)[1]

    results = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with vkml.use_backend("cpu"):
            got = [vkml.jit(f)(x).numpy(), vkml.grad(f)(x).numpy(), vkml.jit(g)(x).numpy()]
    with vkml.use_backend("numpy"):
        want = [vkml.jit(f)(x).numpy(), vkml.grad(f)(x).numpy(), vkml.jit(g)(x).numpy()]
    results["same as numpy"] = all(np.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(got, want))
    results["warnings"] = [f"{type(w.message).__name__}: {w.message}" for w in caught]
    print(json.dumps(results))
"""


def run(prelude, env_extra, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "kit"),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.update(env_extra)
    code = textwrap.dedent(prelude) + textwrap.dedent(PROGRAMS)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def vkml_warnings(result):
    return [w for w in result["warnings"] if w.startswith("VkmlWarning")]


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (a real full disk: ENOSPC), or a skip where mounting is not allowed."""
    where = tmp_path / "tiny"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_cache_folder_builds_in_a_private_one_with_one_warning(tiny_tmpfs, tmp_path):
    result = run("", {"VKML_CACHE_DIR": str(tiny_tmpfs / "cache"), "TMPDIR": str(tmp_path)})
    assert result["same as numpy"]
    warned = vkml_warnings(result)
    assert len(warned) == 1 and "No space left on device" in warned[0], result["warnings"]
    assert "private temporary folder" in warned[0]


def test_a_read_only_cache_folder_builds_in_a_private_one(tiny_tmpfs, tmp_path):
    (tiny_tmpfs / "cache" / "vkml" / "cpu").mkdir(parents=True, mode=0o700)
    os.chmod(tiny_tmpfs / "cache", 0o700)
    os.chmod(tiny_tmpfs / "cache" / "vkml", 0o700)
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    result = run("", {"XDG_CACHE_HOME": str(tiny_tmpfs / "cache"), "TMPDIR": str(tmp_path)})
    assert result["same as numpy"]
    assert len(vkml_warnings(result)) == 1, result["warnings"]
    assert "private temporary folder" in vkml_warnings(result)[0]


def test_when_no_folder_can_hold_a_build_programs_run_on_numpy(tmp_path):
    # RLIMIT_FSIZE: the kernel refuses every write past 2 KiB (EFBIG), in the cache folder and in
    # the private temporary one alike (SIGXFSZ ignored, as a process that handles it would)
    prelude = """
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
    """
    result = run(prelude, {"VKML_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)})
    assert result["same as numpy"]
    warned = vkml_warnings(result)
    assert 1 <= len(warned) <= 2, result["warnings"]
    assert any("on NumPy instead" in w for w in warned), warned


def test_a_cache_folder_removed_while_compiling_costs_a_recompile(tmp_path):
    # the folder disappears under the first build (another process cleaning caches)
    prelude = f"""
        import shutil
        from vkml.backends import cpu
        _compile_c, removed = cpu._compile_c, []

        def vanishing(cc, flags, source, folder):
            if not removed:
                removed.append(folder)
                shutil.rmtree({str(tmp_path / 'cache')!r})
            return _compile_c(cc, flags, source, folder)
        cpu._compile_c = vanishing
    """
    result = run(prelude, {"VKML_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)})
    assert result["same as numpy"]
    warned = vkml_warnings(result)
    assert len(warned) == 1 and "No such file or directory" in warned[0], result["warnings"]
