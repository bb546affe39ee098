"""A long program's body compiled as several part functions (``c_render.split_body``): the same
bits as the one-function body, errors found in a later part reported as before with nothing
written, and values passed between parts -- heap temporaries, stack temporaries several parts
read, 0-d arguments read into locals -- intact.  The cut is forced down to a statement per part
here (``SPLIT_BYTES`` and ``PART_BYTES`` of 1)."""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen import c_render

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))


def _long(x, w, s, idx):
    """Reductions to a few values (stack temporaries) read by later statements, a 0-d
    argument, a product, a gather at the end."""
    m = vkml.max(x, axis=1, keepdims=True)
    e = vkml.exp(x - m)
    p = e / vkml.sum(e, axis=1, keepdims=True)
    h = vkml.tanh(p @ w) * s
    col = vkml.sum(h, axis=0)                      # 7 values: on the stack
    y = h - col / (1.0 + vkml.abs(s))
    z = vkml.sqrt(y * y + 1.0) + vkml.mean(y)
    return vkml.take(z, idx, axis=0) * 2.0, col, p


def _arguments():
    rng = np.random.default_rng(8)
    return (rng.standard_normal((96, 40)).astype(np.float32),
            rng.standard_normal((40, 7)).astype(np.float32),
            np.float32(0.75), np.array([3, 0, 95, 17]))


def _run(monkeypatch, split, args):
    if split:
        monkeypatch.setattr(c_render, "SPLIT_BYTES", 1)
        monkeypatch.setattr(c_render, "PART_BYTES", 1)
    else:
        monkeypatch.setattr(c_render, "SPLIT_BYTES", 1 << 30)
    sources = []
    real = cpu.c_source
    vkml.clear_caches()                # (the cut is not part of an executable's key)

    def spy(program, *rest):
        source, low = real(program, *rest)
        sources.append(source)
        return source, low
    monkeypatch.setattr(cpu, "c_source", spy)
    with vkml.use_backend("cpu"):
        out = [np.asarray(o) for o in vkml.jit(_long)(*args)]
    monkeypatch.undo()
    return out, sources


def test_a_split_body_gives_the_one_function_bodys_bits(monkeypatch):
    whole, whole_sources = _run(monkeypatch, False, _arguments())
    parts, part_sources = _run(monkeypatch, True, _arguments())
    assert not any("vk_part" in s for s in whole_sources)
    assert max(s.count("static int vk_part") for s in part_sources) >= 5
    for w, p in zip(whole, parts):
        assert w.tobytes() == p.tobytes()
    with vkml.use_backend("numpy"):
        reference = [np.asarray(o) for o in vkml.jit(_long)(*_arguments())]
    for r, p in zip(reference, parts):
        np.testing.assert_allclose(p, r, rtol=2e-6, atol=1e-6)


def test_an_error_in_a_later_part_is_reported_and_writes_nothing(monkeypatch):
    monkeypatch.setattr(c_render, "SPLIT_BYTES", 1)
    monkeypatch.setattr(c_render, "PART_BYTES", 1)
    vkml.clear_caches()
    x, w, s, _ = _arguments()
    f = vkml.jit(_long)
    with vkml.use_backend("cpu"):
        good = [np.asarray(o) for o in f(x, w, s, np.array([1, 2, 3, 4]))]
        with pytest.raises(vkml.VkmlError, match="take|index"):
            f(x, w, s, np.array([1, 2, 300, 4]))
        again = [np.asarray(o) for o in f(x, w, s, np.array([1, 2, 3, 4]))]
    for g, a in zip(good, again):
        assert g.tobytes() == a.tobytes()


def test_a_split_body_that_does_not_compile_is_built_whole(monkeypatch):
    """A cut that parted a declaration from its use would not compile: the program is built
    again as one function, with the same bits (here every part is made to name a variable no
    part declares)."""
    whole, _ = _run(monkeypatch, False, _arguments())
    real = c_render.split_body

    def broken(*args):
        parts = real(*args)
        if parts is None:
            return None
        functions, passed = parts
        return [f.replace("    goto done;\ndone:", "    vk_undeclared = 1;\n    goto done;\ndone:")
                for f in functions], passed
    monkeypatch.setattr(c_render, "split_body", broken)
    got, sources = _run(monkeypatch, True, _arguments())
    assert any("vk_undeclared" in s for s in sources)            # the cut was tried
    assert any("vk_part" not in s and "vk_main_body" in s for s in sources)   # then whole
    for w, g in zip(whole, got):
        assert w.tobytes() == g.tobytes()


def test_a_long_body_on_two_threads_compiles_as_two_units_side_by_side(monkeypatch, tmp_path):
    """With two threads allowed, the last half of the part functions is a compilation unit of
    its own (the two compilers run at once, then one link): the bits of one unit, an error in
    a part of the second unit reported as before."""
    monkeypatch.setenv("VKML_THREADS", "1")
    one, one_sources = _run(monkeypatch, True, _arguments())
    monkeypatch.setenv("VKML_THREADS", "2")         # (``_run`` undid the fixture's cache too)
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path / "two"))
    commands = []
    real = cpu._run_compiler
    monkeypatch.setattr(cpu, "_run_compiler",
                        lambda cmds, size: commands.append(cmds) or real(cmds, size))
    two, two_sources = _run(monkeypatch, True, _arguments())
    assert all(len(c_render.units_of(s)) == 1 for s in one_sources)
    assert max(len(c_render.units_of(s)) for s in two_sources) == 2
    assert [len(c) for c in commands[:2]] == [2, 1]                    # two compiles, a link
    for a, b in zip(one, two):
        assert a.tobytes() == b.tobytes()
    monkeypatch.setattr(c_render, "SPLIT_BYTES", 1)
    monkeypatch.setattr(c_render, "PART_BYTES", 1)
    monkeypatch.setenv("VKML_THREADS", "2")
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path / "error"))
    vkml.clear_caches()
    x, w, s, _ = _arguments()
    with vkml.use_backend("cpu"):
        with pytest.raises(vkml.VkmlError, match="take|index"):
            vkml.jit(_long)(x, w, s, np.array([1, 2, 300, 4]))
