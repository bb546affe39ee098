"""A program's heap temporaries share bytes of its scratch block where their lives do not overlap
(``c_render.scratch_layout``): a life runs from the first top-level statement naming the
temporary to the last, a loop being one statement.

Checked two ways: the layout itself against a brute-force reading of the lives (random
statements, loops among them: no two temporaries alive at one statement share a byte, and the
block at least what is alive at once and at most every temporary apart, give or take the lines
that stagger their starts), and whole
programs -- a training step with a layer norm, a softmax and products, a scan and a
``fori_loop`` with temporaries inside their bodies -- whose every result must have the same bits
as the same program compiled with a block of every temporary apart, at one thread and two.  A
temporary overwritten while still needed would change them."""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.base import Cache
from vkml.backends.codegen import c_render
from vkml.backends.codegen.statements import Block, Loop

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="no C compiler on this machine")


def _random_body(rng, names):
    """Top-level statements naming temporaries: lines, and loops whose bodies name several."""
    stmts = []
    for _ in range(rng.integers(5, 40)):
        picked = [str(n) for n in rng.choice(names, rng.integers(1, 4))]
        line = " + ".join(f"{n}[0]" for n in picked) + ";"
        if rng.random() < 0.3:
            stmts.append(Loop("i0", 4, [Block([line]), f"{rng.choice(names)}[i0] = 0;"]))
        else:
            stmts.append(line)
    return stmts


def _lives(temps, stmts):
    """{temporary index: (first, last)} read from the statements' text, the slow way."""
    lives = {}
    for at, stmt in enumerate(stmts):
        text = []
        c_render.emit([stmt], text, "")
        words = set("\n".join(text).replace("[", " ").replace("]", " ").replace(";", " ").split())
        for k, (name, _, _) in enumerate(temps):
            if name in words:
                lives[k] = (lives.get(k, (at, at))[0], at)
    return lives


@pytest.mark.parametrize("seed", range(40))
def test_temporaries_alive_together_never_share_a_byte(seed):
    rng = np.random.default_rng(seed)
    count = int(rng.integers(2, 30))
    temps = [(f"t{k + 1}", str(rng.choice(["float", "double", "int64_t"])),
              int(rng.choice([8, 65, 100, 4096, 1 << 18]))) for k in range(count)]
    heap = [f"t{k + 1}" for k in range(count) if temps[k][2] > c_render.STACK_LIMIT]
    if not heap:
        return
    stmts = _random_body(rng, heap)
    offsets, total = c_render.scratch_layout(temps, stmts)
    lives = _lives(temps, stmts)
    spans = {k: (offsets[k], offsets[k] + c_render.CSIZE[temps[k][1]] * temps[k][2])
             for k in range(count) if temps[k][2] > c_render.STACK_LIMIT}
    assert all(offsets[k] is None for k in range(count) if k not in spans)
    assert all(start % c_render.SCRATCH_ALIGN == 0 and end <= total for start, end in spans.values())
    for a in lives:
        for b in lives:
            if a < b and not (lives[a][1] < lives[b][0] or lives[b][1] < lives[a][0]):
                (s1, e1), (s2, e2) = spans[a], spans[b]
                assert e1 <= s2 or e2 <= s1, (temps[a], temps[b], lives[a], lives[b])
    apart = c_render.scratch_layout(temps)[1]        # (each may be padded by its colour)
    assert total <= apart + len(spans) * c_render.SCRATCH_PAGE
    alive_at_once = max(sum(spans[k][1] - spans[k][0] for k in lives if lives[k][0] <= at <= lives[k][1])
                        for at in range(len(stmts)))
    assert total >= alive_at_once


def test_arrays_alive_together_start_on_different_lines_of_a_page():
    """Twelve saved trajectories of 8 MB read at one index by one loop: placed end to end they
    would all start at one offset modulo 4096 (one L1 cache set for all twelve reads)."""
    temps = [(f"t{k + 1}", "double", 1 << 20) for k in range(12)]
    offsets, _ = c_render.scratch_layout(temps, [" ".join(f"t{k + 1}[0];" for k in range(12))])
    assert len({o % 4096 for o in offsets}) == 12


def _step():
    """A small transformer-style training step: layer norm, a product, softmax over rows, a
    second product, the mean squared error's gradient for both weights."""
    def loss(w1, w2, x, target):
        mu = vkml.mean(x, axis=-1, keepdims=True)
        var = vkml.mean((x - mu) ** 2, axis=-1, keepdims=True)
        h = (x - mu) / vkml.sqrt(var + 1e-5) @ w1
        h = h - vkml.max(h, axis=-1, keepdims=True)
        p = vkml.exp(h) / vkml.sum(vkml.exp(h), axis=-1, keepdims=True)
        return vkml.mean((p @ w2 - target) ** 2)
    return vkml.jit(vkml.value_and_grad(loss, argnums=(0, 1)))


def _loops():
    """A scan and a fori_loop whose bodies make temporaries of their own."""
    def scanned(xs, h0):
        def cell(h, x):
            a = vkml.tanh(h * 0.5 + x)
            b = vkml.sum(a * a, axis=-1, keepdims=True)
            h = a / (1.0 + b)
            return h, vkml.sum(h, axis=-1)
        return vkml.scan(cell, h0, xs)

    def looped(x):
        def body(i, v):
            w = vkml.exp(-v * v) * 0.25
            return v + w - vkml.mean(w, axis=-1, keepdims=True)
        return vkml.sum(vkml.fori_loop(0, 7, body, x) ** 2, axis=-1)
    return [vkml.jit(scanned), vkml.jit(looped)]


def _flat(results):
    out = []
    for r in results if isinstance(results, (tuple, list)) else [results]:
        out += _flat(r) if isinstance(r, (tuple, list)) else [np.asarray(r.numpy())]
    return out


def _run_all(dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((512, 192)).astype(dtype)
    w1 = (rng.standard_normal((192, 256)) * 0.1).astype(dtype)
    w2 = (rng.standard_normal((256, 32)) * 0.1).astype(dtype)
    target = rng.standard_normal((512, 32)).astype(dtype)
    xs = rng.standard_normal((12, 40, 64)).astype(dtype)
    h0 = rng.standard_normal((40, 64)).astype(dtype)
    v = np.ascontiguousarray(x[:40, :64])
    scanned, looped = _loops()
    return _flat(_step()(w1, w2, x, target)) + _flat(scanned(xs, h0)) + _flat(looped(v))


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_programs_sharing_their_scratch_keep_their_bits(on_cpu, monkeypatch, dtype, threads):
    monkeypatch.setenv("VKML_THREADS", threads)
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    layouts = []
    real = c_render.scratch_layout

    def spy(temps, stmts=None):
        layout = real(temps, stmts)
        spans = [(at, at + c_render.CSIZE[ctype] * count)
                 for at, (_, ctype, count) in zip(layout[0], temps) if at is not None]
        layouts.append(sum(s1 < e2 and s2 < e1 for i, (s1, e1) in enumerate(spans)
                           for s2, e2 in spans[:i]))
        return layout
    monkeypatch.setattr(c_render, "scratch_layout", spy)
    monkeypatch.setattr(vkml.backends.current(), "_executables", Cache("shared scratch"))
    got = _run_all(dtype)
    assert layouts[0] >= 3, layouts          # temporaries of the step that do share bytes
    monkeypatch.setattr(c_render, "scratch_layout", lambda temps, stmts=None: real(temps))
    monkeypatch.setattr(vkml.backends.current(), "_executables", Cache("scratch apart"))
    want = _run_all(dtype)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
