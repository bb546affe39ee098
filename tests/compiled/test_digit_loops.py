"""A loop whose index is read only in digits (a reshape splitting an axis: ``(i / 128)``,
``((i / 32) % 4)``, ``(i % 32)``) becomes nested loops over the digits: the same elements from the
same reads -- checked on the loop's text (what is split, what is left) and on programs against
the NumPy backend, bit for bit, on one and two threads."""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen.digit_loops import split_digit_loops
from vkml.backends.codegen.statements import Loop

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def _loop(extent, line):
    return [Loop("i1", 8, [Loop("i2", extent, [line], True)], True)]


def test_a_loop_read_in_digits_becomes_digit_loops():
    line = "o0[(i1)*384 + i2] = (a0[(((i2) / 128))*131072 + ((((i2) / 32) % 4))*4096 + ((i2) % 32)]);"
    outer, = split_digit_loops(_loop(384, line))
    d2, = outer.body
    d1, = d2.body
    d0, = d1.body
    assert [(d.var, d.extent, d.parallel) for d in (d2, d1, d0)] == \
        [("i2_d2", 3, True), ("i2_d1", 4, True), ("i2_d0", 32, True)]
    assert d0.body == ["o0[(i1)*384 + (i2_d0 + i2_d1 * 32 + i2_d2 * 128)] = "
                       "(a0[(i2_d2)*131072 + (i2_d1)*4096 + i2_d0]);"]
    # every value of i2 gives the same indices
    for i in range(384):
        d = {"i2_d0": i % 32, "i2_d1": (i // 32) % 4, "i2_d2": i // 128, "i1": 0}
        old = eval(line.split("a0[")[1].split("]")[0].replace("/", "//"), {}, {"i2": i})
        new = eval(d0.body[0].split("a0[")[1].split("]")[0], {}, d)
        assert old == new


@pytest.mark.parametrize("line", [
    "o0[i2] = a0[((i2) / 3) + ((i2) % 4)];",             # places 3 and 4: neither divides the other
    "o0[i2] = a0[(i2) + 1];",                             # no digit
    "o0[i2] = a0[((i2) / 2)] * i2 ? 1.0 : 0.0;",          # a condition
    "o0[i2] = a0[((i2) % 0)];"])                          # (no division by zero)
def test_other_loops_are_left_as_they_are(line):
    stmts = _loop(12, line)
    assert split_digit_loops(stmts)[0].body[0].body == [line]


@pytest.mark.parametrize("threads", ["1", "2"])
def test_heads_merged_back_have_the_numpy_backends_bits(threads, monkeypatch):
    """An attention's q, k, v gradients merged back into one (rows, 3 * width) array: the
    merge reads each head's rows at the digits of the column; against the NumPy backend."""
    monkeypatch.setenv("VKML_THREADS", threads)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 16, 48)).astype(np.float32)
    w = rng.standard_normal((4, 16, 16)).astype(np.float32)

    def loss(x):
        qkv = vkml.transpose(vkml.reshape(x, (4, 16, 3, 2, 8)), (2, 0, 3, 1, 4))
        mixed = qkv[0] * qkv[1] + qkv[2]
        return vkml.sum(vkml.reshape(vkml.transpose(mixed, (0, 2, 1, 3)), (4, 16, 16)) ** 2 * w)
    g = vkml.grad(loss)
    source, _ = cpu.c_source(vkml.program(g, x))
    assert "_d0 = 0" in source
    outs = {}
    for backend in ("numpy", "cpu"):
        with vkml.use_backend(backend):
            outs[backend] = np.asarray(vkml.jit(g)(x))
    assert outs["cpu"].tobytes() == outs["numpy"].tobytes()


def test_an_innermost_digit_shorter_than_a_vector_is_left():
    """A pooling's upsampled read, ``g[(x / 2)]``: loops of 2 innermost would vectorise worse."""
    line = "o0[(i1)*24 + i2] = g[(i1)*12 + ((i2) / 2)];"
    assert split_digit_loops(_loop(24, line))[0].body[0].body == [line]
