"""A stack of one view at offsets that follow the operand's number (a convolution's or a
pooling's windows) is stored by one loop nest over the whole stack, its offsets computed from
the stacked axis's loop: the offset forms against Python's own arithmetic, the loop nests
counted in the generated C, and the results against the NumPy backend (bit for bit) and a
direct convolution in float64 (a product's order of additions is not NumPy's BLAS's)."""

import itertools
import re

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen.stacked_views import _following

needs_cc = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def _evaluate(expression, k):
    """A C expression of ``k`` (non-negative ints) evaluated in Python (``/`` is ``//``)."""
    return eval(re.sub(r"(?<!/)/(?!/)", "//", str(expression)), {}, {"k": k})


@pytest.mark.parametrize("n, m, a, b, c", [(25, 5, 0, 1, 0), (25, 5, 0, 0, 1), (9, 3, 2, 2, 2),
                                           (6, 2, -1, 3, 0), (7, 7, 4, 0, -2), (12, 4, 0, 3, 1),
                                           (5, 5, 3, 0, 0)])
def test_offsets_of_taps_rows_and_runs_are_found_and_computed(n, m, a, b, c):
    values = [a + b * (i // m) + c * (i % m) for i in range(n)]
    form = _following(values)
    assert form is not None
    assert [_evaluate(form("k"), k) for k in range(n)] == values


@pytest.mark.parametrize("values", [[0, 3, 1, 2], [0, 1, 2, 4, 5, 7], [5, 0, 5, 1, 7, 2], [0, 0, 1, 0]])
def test_offsets_that_follow_no_such_form_are_refused(values):
    assert _following(values) is None


def _stores_reading(source, name):
    """The generated body's store statements that read buffer ``name``."""
    body = source[source.index("static int vk_main_body"):]
    return [line for line in body.splitlines() if re.search(rf"\] = .*\b{name}\[", line)]


def _direct_conv(x, w, stride, dilation):
    """A convolution by its definition, in float64 loops (no padding)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ho = (h - (kh - 1) * dilation - 1) // stride + 1
    wo = (wd - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((n, o, ho, wo))
    for i, j in itertools.product(range(kh), range(kw)):
        window = x[:, :, i * dilation:i * dilation + (ho - 1) * stride + 1:stride,
                   j * dilation:j * dilation + (wo - 1) * stride + 1:stride]
        out += np.einsum("nchw,oc->nohw", window, w[:, :, i, j])
    return out


@needs_cc
@pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2)])
def test_a_convolutions_columns_are_one_loop_nest(stride, dilation):
    rng = np.random.default_rng(stride * 10 + dilation)
    x = rng.standard_normal((2, 3, 11, 11))
    w = rng.standard_normal((4, 3, 3, 3))

    def conv(v):
        return vkml.conv2d(v, w, stride=stride, dilation=dilation)

    # (the product reads the columns where they are: ``products.gathered_operands``; stored, as
    # where they are too big to gather or something else reads them, they are one nest)
    assert _stores_reading(cpu.c_source(vkml.program(conv, x))[0], "a0") == []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu, "gathered_operands", lambda *a: ({}, set()))
        source, _ = cpu.c_source(vkml.program(conv, x))
    assert len(_stores_reading(source, "a0")) == 1, "nine windows, one nest"
    with vkml.use_backend("cpu"):
        out = np.asarray(vkml.jit(conv)(x))
    np.testing.assert_allclose(out, _direct_conv(x, w, stride, dilation), atol=1e-12)


@needs_cc
def test_an_overlapping_poolings_windows_and_its_gradient():
    """A 3 x 3 max pool of stride 1 stacks its nine windows on the last axis: one nest; the
    value and the gradient are the NumPy backend's bits, and the gradient a finite difference's."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 7, 7))

    def loss(v):
        return vkml.sum(vkml.max_pool2d(v * 1.5 - 0.25, 3, 1) ** 2)

    source, _ = cpu.c_source(vkml.program(lambda v: vkml.max_pool2d(v, 3, 1), x))
    assert len(_stores_reading(source, "a0")) == 1
    outs = {}
    for backend in ("numpy", "cpu"):
        with vkml.use_backend(backend):
            outs[backend] = (np.asarray(vkml.jit(loss)(x)), np.asarray(vkml.jit(vkml.grad(loss))(x)))
    for mine, theirs in zip(outs["cpu"], outs["numpy"]):
        assert mine.tobytes() == theirs.tobytes()
    e = np.zeros_like(x)
    e[1, 0, 3, 4] = 1e-6
    numeric = (float(loss(x + e)) - float(loss(x - e))) / 2e-6
    assert abs(outs["cpu"][1][1, 0, 3, 4] - numeric) < 1e-5 * max(1.0, abs(numeric))


@needs_cc
def test_stacks_that_are_not_one_view_keep_a_nest_per_operand():
    """Operands that differ in more than their offsets (another function, another source, starts
    in no regular order) are stored one by one, with the right values."""
    x = np.arange(40.0).reshape(4, 10)
    y = x[::-1].copy()

    def f(v, u):
        irregular = [v[:, s:s + 4] for s in (0, 3, 1, 2)]
        return (vkml.stack([v * 2.0, v + 1.0]), vkml.stack([v, u]),
                vkml.stack(irregular, axis=1))

    source, _ = cpu.c_source(vkml.program(f, x, y))
    assert len(_stores_reading(source, "a0")) == 2 + 1 + 4
    with vkml.use_backend("cpu"):
        two, pair, windows = (np.asarray(t) for t in vkml.jit(f)(x, y))
    np.testing.assert_array_equal(two, np.stack([x * 2.0, x + 1.0]))
    np.testing.assert_array_equal(pair, np.stack([x, y]))
    np.testing.assert_array_equal(windows, np.stack([x[:, s:s + 4] for s in (0, 3, 1, 2)], axis=1))
