"""A float sum of zero-padded windows (a convolution's input gradient) is computed by one pass
per window into an accumulator that starts at -0.0, with + 0.0 where a window misses: the NumPy
backend's bits for the sum as written -- signed zeros, NaN and the buffers reused by later calls
included -- in every arrangement of the passes (inside the loops over the batch and channels,
with the image in a local array or not, or over the whole array), against a finite difference."""

import re

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen import padded_sums

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def _windows_loss(shape, k, coef):
    """sum(windows(x)^2 * coef): its gradient is the sum of the k*k windows, each padded back."""
    ho, wo = shape[-2] - k + 1, shape[-1] - k + 1

    def loss(x):
        s = vkml.stack([x[..., i:i + ho, j:j + wo] for i in range(k) for j in range(k)])
        return vkml.sum(s * s * coef)
    return loss


def _both(fn, x, calls=3):
    """``fn``'s results on the NumPy backend (once) and on the cpu tier (``calls`` times)."""
    with vkml.use_backend("numpy"):
        want = np.array(vkml.jit(fn)(x))
    with vkml.use_backend("cpu"):
        f = vkml.jit(fn)
        got = [np.array(f(x)) for _ in range(calls)]
    return want, got


@pytest.mark.parametrize("shape, k, dtype", [((2, 3, 12, 12), 5, np.float32),
                                             ((1, 2, 7, 9), 3, np.float64),
                                             ((3, 1, 6, 6), 2, np.float32),
                                             ((1, 1, 70, 66), 3, np.float32),   # no local array
                                             ((30, 9), 3, np.float64)])         # no outer loop
@pytest.mark.parametrize("fill", [-0.0, 0.0, np.nan])
def test_the_passes_give_the_sums_bits(shape, k, dtype, fill):
    rng = np.random.default_rng(len(shape) * 10 + k)
    x = (np.abs(rng.standard_normal(shape)) + 0.1).astype(dtype)
    coef = np.full((k * k,) + shape[:-2] + (shape[-2] - k + 1, shape[-1] - k + 1), -0.0, dtype)
    coef[rng.random(coef.shape) < 0.05] = fill
    coef[rng.random(coef.shape) < 0.03] = rng.standard_normal() + 1.0
    g = vkml.grad(_windows_loss(shape, k, coef))
    source, _ = cpu.c_source(vkml.program(g, x))
    assert re.search(r"= -0\.0f?;", source), "the sum is computed by passes"
    want, got = _both(g, x)
    assert (want == 0).any() and np.signbit(want[want == 0]).any(), "some sums are -0.0"
    for g_ in got:
        assert g_.tobytes() == want.tobytes()


def test_three_windows_stay_one_expression():
    x = np.ones((2, 10), np.float32)
    g = vkml.grad(lambda v: vkml.sum(vkml.stack([v[:, i:i + 8] for i in range(3)]) ** 2))
    assert padded_sums.MIN_WINDOWS > 3
    assert not re.search(r"= -0\.0f?;", cpu.c_source(vkml.program(g, np.ones((2, 10))))[0])
    want, got = _both(g, x, 1)
    assert got[0].tobytes() == want.tobytes()


def test_a_convolutions_input_gradient_against_central_differences():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 9))
    w = rng.standard_normal((4, 3, 3, 3)) / 3

    def loss(v):
        return vkml.sum(vkml.tanh(vkml.conv2d(v, w, padding=1)) ** 2)

    source, _ = cpu.c_source(vkml.program(vkml.grad(loss), x))
    assert re.search(r"= -0\.0;", source)
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(vkml.grad(loss))(x))
    for at in [(0, 0, 0, 0), (1, 2, 4, 8), (0, 1, 8, 3), (1, 0, 5, 5)]:
        e = np.zeros_like(x)
        e[at] = 1e-6
        numeric = (float(loss(x + e)) - float(loss(x - e))) / 2e-6
        assert abs(got[at] - numeric) < 1e-6 * max(1.0, abs(numeric)), at


@pytest.mark.parametrize("pieces", [(0, 4, 8, 12), (0, 3, 7, 10), (0, 2, 4, 6, 8, 10, 12)])
def test_disjoint_windows_are_a_copy_each_with_the_sums_bits(pieces):
    """A split's gradient (its pieces padded back, side by side, maybe with a gap): each
    element is one window's term plus the others' zeros -- -0.0 terms come out +0.0."""
    rng = np.random.default_rng(len(pieces))
    x = rng.standard_normal((4, 6, 12)).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = -0.0
    c = rng.standard_normal((4, 6, pieces[-1])).astype(np.float32)
    c[rng.random(c.shape) < 0.3] = -0.0

    def loss(v):
        parts = [v[..., a:b] for a, b in zip(pieces, pieces[1:])]
        return vkml.sum(vkml.concatenate([p * p for p in parts], -1) * c)
    g = vkml.grad(loss)
    source, _ = cpu.c_source(vkml.program(g, x))
    assert "+ 0.0f;" in source and not re.search(r"= -0\.0f;", source)
    want, got = _both(g, x)
    zeros = want == 0
    assert zeros.any() and not np.signbit(want[zeros]).any()
    assert (np.signbit(x) & (x == 0)).any()
    for g_ in got:
        assert g_.tobytes() == want.tobytes()


def _strided_loss(shape, k, step, coef, taps=None):
    """sum(windows(x)^2 * coef) over windows taking every ``step``-th element: its gradient is a
    sum of windows padded back with interior padding (a strided convolution's input gradient)."""
    ho, wo = (shape[-2] - k) // step + 1, (shape[-1] - k) // step + 1
    taps = taps or [(i, j) for i in range(k) for j in range(k)]

    def loss(x):
        s = vkml.stack([x[..., i:i + (ho - 1) * step + 1:step, j:j + (wo - 1) * step + 1:step]
                        for i, j in taps])
        return vkml.sum(s * s * coef)
    return loss, (len(taps),) + shape[:-2] + (ho, wo)


@pytest.mark.parametrize("shape, k, step, dtype", [((2, 3, 13, 13), 3, 2, np.float32),
                                                   ((1, 2, 11, 14), 4, 3, np.float64),
                                                   ((3, 2, 9, 9), 2, 2, np.float32),
                                                   ((1, 1, 80, 70), 3, 2, np.float32)])
@pytest.mark.parametrize("fill", [-0.0, 0.0, np.nan])
def test_windows_a_step_apart_take_the_passes_with_the_sums_bits(shape, k, step, dtype, fill):
    """Interior padding: each window's elements land ``step`` apart; every element is missed by
    some window here, so each gets + 0.0 after the passes (signed zeros, NaN as the sum)."""
    rng = np.random.default_rng(shape[-1] * 10 + k + step)
    x = (np.abs(rng.standard_normal(shape)) + 0.1).astype(dtype)
    loss, coef_shape = _strided_loss(shape, k, step, None)
    coef = np.full(coef_shape, -0.0, dtype)
    coef[rng.random(coef.shape) < 0.05] = fill
    coef[rng.random(coef.shape) < 0.03] = rng.standard_normal() + 1.0
    g = vkml.grad(_strided_loss(shape, k, step, coef)[0])
    source, _ = cpu.c_source(vkml.program(g, x))
    assert re.search(r"= -0\.0f?;", source), "the sum is computed by passes"
    assert re.search(rf"\* {step} \+ 1\)", source), "a window's elements a step apart"
    want, got = _both(g, x)
    assert (want == 0).any() and not np.signbit(want[want == 0]).any()
    for g_ in got:
        assert g_.tobytes() == want.tobytes()


def test_windows_a_step_apart_that_all_cover_some_elements_but_not_others_stay_one_expression():
    """Four windows on the even positions only, overlapping in the middle: some elements every
    window covers, some one misses -- no box says which, so the sum stays as written."""
    shape, step = (2, 2, 15, 15), 2
    taps = [(0, 0), (0, 2), (2, 0), (2, 2)]
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape)
    loss, coef_shape = _strided_loss(shape, 5, step, None, taps)
    coef = rng.standard_normal(coef_shape)
    coef[rng.random(coef.shape) < 0.2] = -0.0
    g = vkml.grad(_strided_loss(shape, 5, step, coef, taps)[0])
    assert not re.search(r"= -0\.0;", cpu.c_source(vkml.program(g, x))[0])
    want, got = _both(g, x, 2)
    for g_ in got:
        assert g_.tobytes() == want.tobytes()


def test_a_strided_convolutions_input_gradient_against_central_differences():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 11, 11))
    w = rng.standard_normal((4, 3, 3, 3)) / 3

    def loss(v):
        return vkml.sum(vkml.tanh(vkml.conv2d(v, w, stride=2, padding=1)) ** 2)

    source, _ = cpu.c_source(vkml.program(vkml.grad(loss), x))
    assert re.search(r"= -0\.0;", source)
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(vkml.grad(loss))(x))
    for at in [(0, 0, 0, 0), (1, 2, 4, 8), (0, 1, 10, 3), (1, 0, 5, 5), (1, 1, 10, 10)]:
        e = np.zeros_like(x)
        e[at] = 1e-6
        numeric = (float(loss(x + e)) - float(loss(x - e))) / 2e-6
        assert abs(got[at] - numeric) < 1e-6 * max(1.0, abs(numeric)), at


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_a_stored_pad_is_its_border_and_its_operand_apart(dtype):
    """A stored pad (a program's result, or a convolution's padded input) is one nest per side of
    each padded axis and one over its operand, with no bounds test per element: NumPy's values
    (signed zeros and NaN of the operand kept) for random shapes and widths, zero widths too."""
    rng = np.random.default_rng(7)
    for case in range(12):
        nd = int(rng.integers(1, 5))
        shape = tuple(int(s) for s in rng.integers(1, 7, nd))
        lo = [int(v) for v in rng.integers(0, 3, nd)]
        hi = [int(v) for v in rng.integers(0, 3, nd)]
        x = (rng.standard_normal(shape) * 4).astype(dtype)
        if x.dtype.kind == "f":
            x[rng.random(shape) < 0.2] = -0.0
            x[rng.random(shape) < 0.1] = np.nan

        def f(v):
            return vkml.pad(vkml.maximum(v, v * 0.5) if x.dtype.kind == "f" else v + 1, lo, hi)
        want = np.pad(np.maximum(x, x * 0.5) if x.dtype.kind == "f" else x + 1,
                      list(zip(lo, hi)))
        with vkml.use_backend("cpu"):
            jitted = vkml.jit(f)
            for _ in range(3):       # (past the first calls, which may run on NumPy)
                got = np.asarray(jitted(x))
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (shape, lo, hi)
        body = cpu.c_source(vkml.program(f, x))[0].split("static int vk_main_body")[1]
        assert ">= 0 &&" not in body, "no bounds test per element"
        zeros = re.findall(r"\] = \((?:float|double|int32_t)\)0;", body)
        assert len(zeros) == sum(a > 0 for a in lo) + sum(b > 0 for b in hi), (shape, lo, hi)
