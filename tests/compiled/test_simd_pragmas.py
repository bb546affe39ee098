"""Innermost loops whose iterations are independent carry ``#pragma omp simd`` (the compiler then
vectorises a read it cannot prove apart from the store, a pooling gradient's ``g[x / 2]``);
reductions, scans and loops with checks never do, nor a loop an OpenMP pragma collapses; and
the results keep the NumPy backend's bits on one thread and on two."""

import re

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen.c_render import SIMD_LOOP, emit
from vkml.backends.codegen.statements import Block, Loop

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def _loops_after_pragma(source):
    """The ``for`` lines that follow a SIMD pragma."""
    lines = source.splitlines()
    return [lines[k + 1].strip() for k, line in enumerate(lines) if line.strip() == SIMD_LOOP]


def test_only_independent_innermost_loops_get_the_pragma():
    store = Loop("i2", 8, ["t1[i1*8 + i2] = a0[i1*8 + i2] * 2.0;"], parallel=True)
    nest = Loop("i1", 4, [store], parallel=True)
    reduction = Loop("r3", 8, ["acc = acc + a0[r3];"])                      # not parallel
    checked = Loop("i4", 8, ["if (a0[i4] < 0) { *err = 1; goto done; }"], parallel=True)
    collapsed = Block(["#pragma omp parallel for collapse(1) num_threads(2) schedule(static)",
                       Loop("i5", 64, ["o0[i5] = a0[i5] + 1.0;"], parallel=True)])
    lines = []
    emit([nest, reduction, checked, collapsed], lines, "", simd=True)
    text = "\n".join(lines)
    assert _loops_after_pragma(text) == ["for (int64_t i2 = 0; i2 < 8; i2++) {"]
    plain = []
    emit([nest], plain, "")
    assert SIMD_LOOP not in "\n".join(plain)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_pooling_gradient_loop_carries_the_pragma_and_keeps_the_bits(monkeypatch, threads):
    monkeypatch.setenv("VKML_THREADS", threads)
    x = np.random.default_rng(8).standard_normal((16, 8, 24, 24)).astype(np.float32)

    def loss(v):
        return vkml.sum(vkml.max_pool2d(vkml.relu(v * 1.5 - 0.25), 2) ** 2)

    source, _ = cpu.c_source(vkml.program(vkml.grad(loss), x))
    body = source[source.index("static int vk_main_body"):]
    assert re.search(r"#pragma omp simd\n\s*for \(int64_t (i\d+) = 0; \1 < 24;", body)
    outs = {}
    for backend in ("numpy", "cpu"):
        with vkml.use_backend(backend):
            outs[backend] = np.asarray(vkml.jit(vkml.grad(loss))(x))
    assert outs["cpu"].tobytes() == outs["numpy"].tobytes()
