"""The reshape rule's index expressions, evaluated for every element of random reshapes (axes of
one element, merges, splits, groups that are both), against NumPy's own ravel/unravel; and a
reshape-heavy program's bits on the cpu tier against the NumPy backend."""

import itertools
import re

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.codegen.rules import reshaped_index


def _factorisations(rng, size):
    """A random shape of ``size`` elements (ones sprinkled in)."""
    factors = []
    n = size
    for p in (2, 3, 5, 7):
        while n % p == 0:
            factors.append(p)
            n //= p
    rng.shuffle(factors)
    shape, k = [], 0
    while k < len(factors):
        take = int(rng.integers(1, 3))
        shape.append(int(np.prod(factors[k:k + take])))
        k += take
        if rng.random() < 0.2:
            shape.append(1)
    return tuple(shape)


def _evaluate(expression, names):
    """A C index expression of non-negative ints evaluated in Python (``/`` is ``//`` there)."""
    return eval(re.sub(r"(?<!/)/(?!/)", "//", expression), {}, names)


@pytest.mark.parametrize("seed", range(40))
def test_every_element_of_a_random_reshape_maps_to_numpys(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.choice([1, 6, 12, 30, 36, 60, 72, 210]))
    out_shape, in_shape = _factorisations(rng, size), _factorisations(rng, size)
    names = [f"i{k}" for k in range(len(out_shape))]
    sub = reshaped_index(names, out_shape, in_shape)
    assert len(sub) == len(in_shape)
    for point in itertools.product(*(range(d) for d in out_shape)):
        env = dict(zip(names, point))
        got = tuple(_evaluate(s, env) for s in sub)
        flat = np.ravel_multi_index(point, out_shape) if out_shape else 0
        want = np.unravel_index(flat, in_shape) if in_shape else ()
        assert got == tuple(int(w) for w in want), (out_shape, in_shape, point)


def test_merges_and_splits_read_plain_strides():
    """An image batch's (n, c, h, w) -> (n, c, h * w) and an attention's (n, s, 3d) -> (n, s, 3,
    h, d) divide no index but the split axis's own."""
    assert reshaped_index(["a", "b", "c"], (64, 32, 144), (64, 32, 12, 12)) == \
        ["(a)", "(b)", "((c) / 12)", "((c) % 12)"]
    assert reshaped_index(list("abcde"), (8, 128, 3, 4, 32), (8, 128, 384)) == \
        ["(a)", "(b)", "((c)*128 + (d)*32 + e)"]


@pytest.mark.parametrize("seed", range(40))
def test_a_reshape_read_from_a_buffer_names_the_same_flat_element(seed):
    """Read from a row-major buffer (``runs``), each group's offset rides on its last axis: the
    flat offset the index makes is NumPy's ravel of the element, with no division at all."""
    rng = np.random.default_rng(100 + seed)
    size = int(rng.choice([1, 6, 12, 30, 36, 60, 72, 210]))
    out_shape, in_shape = _factorisations(rng, size), _factorisations(rng, size)
    names = [f"i{k}" for k in range(len(out_shape))]
    sub = reshaped_index(names, out_shape, in_shape, runs=True)
    assert not any("/" in s or "%" in s for s in sub)
    strides = [int(np.prod(in_shape[k + 1:])) for k in range(len(in_shape))]
    for point in itertools.product(*(range(d) for d in out_shape)):
        env = dict(zip(names, point))
        offset = sum(_evaluate(s, env) * st for s, st in zip(sub, strides))
        assert offset == (np.ravel_multi_index(point, out_shape) if out_shape else 0)


@pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")
def test_a_pooling_gradient_reads_its_windows_at_unit_stride():
    """A 2 x 2 max pool's gradient reads the (n, c, 12, 2, 12, 2) windows back in the image's
    (n, c, 24, 24) layout: the stored buffer is read at the image's own index (no / or %), and
    the bits are the NumPy backend's."""
    x = np.random.default_rng(6).standard_normal((4, 3, 24, 24)).astype(np.float32)

    def loss(v):
        return vkml.sum(vkml.max_pool2d(vkml.relu(v * 2.0 - 0.5), 2) ** 2)

    source, _ = cpu.c_source(vkml.program(vkml.grad(loss), x))
    body = source[source.index("static int vk_main_body"):]
    windows = [line for line in body.splitlines() if "*48 + (" in line and " = " in line]
    assert windows and not any(re.search(r"i\d+\) / 2\)\)\*48", line) for line in windows)
    outs = {}
    for backend in ("numpy", "cpu"):
        with vkml.use_backend(backend):
            outs[backend] = np.asarray(vkml.jit(vkml.grad(loss))(x))
    assert outs["cpu"].tobytes() == outs["numpy"].tobytes()


@pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")
def test_a_reshape_heavy_program_has_the_numpy_backends_bits():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6, 10, 3)).astype(np.float32)

    def f(v):
        heads = vkml.transpose(vkml.reshape(v, (4, 6, 5, 2, 3)), (2, 0, 3, 1, 4))
        flat = vkml.reshape(heads * 1.5 + 1.0, (5, 4, 36))
        return vkml.reshape(vkml.swapaxes(flat, 0, 2), (6, 6, 20)) - vkml.reshape(v, (6, 6, 20))

    outs = {}
    for backend in ("numpy", "cpu"):
        with vkml.use_backend(backend):
            outs[backend] = np.asarray(vkml.jit(f)(x))
    assert outs["cpu"].tobytes() == outs["numpy"].tobytes()


@pytest.mark.parametrize("seed", range(40))
def test_reshaped_strides_are_numpys_view_strides_or_none_where_numpy_copies(seed):
    """The strides a GEMM reads a reshape of a (transposed) buffer with, against the view NumPy
    makes of the same reshape; None exactly where NumPy has to copy."""
    from vkml.backends.codegen.lower import reshaped_strides
    rng = np.random.default_rng(100 + seed)
    size = int(rng.choice([6, 12, 30, 36, 60, 72, 210]))
    base = np.arange(size, dtype=np.float32).reshape(_factorisations(rng, size))
    view = np.transpose(base, rng.permutation(base.ndim)) if rng.random() < 0.6 else base
    out_shape = _factorisations(rng, size)
    got = reshaped_strides(view.shape, [s // 4 for s in view.strides], out_shape)
    reshaped = view.reshape(out_shape)
    is_view = np.shares_memory(reshaped, base)
    assert (got is not None) == is_view, (view.shape, view.strides, out_shape)
    if is_view:
        for d, mine, theirs in zip(out_shape, got, reshaped.strides):
            assert d == 1 or mine == theirs // 4, (view.shape, out_shape, got, reshaped.strides)


@pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")
def test_a_stored_reshape_of_a_temporary_is_that_temporary():
    """A convolution's input gradient: its columns' gradient (a product's result, (C*kh*kw,
    N*Ho*Wo)) is read back as (C, taps, N, Ho*Wo), tap by tap, by padded windows -- a reshape
    stored for its many readers: it is the product's own buffer, never a copy of it; the
    gradient is the NumPy backend's, bit for bit, and a finite difference's."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 10, 10))
    w = rng.standard_normal((4, 3, 3, 3)) / 3

    def loss(x):
        return vkml.sum(vkml.conv2d(x, w) ** 2)

    source, _ = cpu.c_source(vkml.program(vkml.grad(loss), x))
    body = source[source.index("static int vk_main_body"):]
    # (the output's gradient read as (O, N*Ho*Wo) where it is: a gathered B, see
    # ``products.gathered_operands``)
    product = re.search(r"vk_gemm_double\(27LL, 128LL, 4LL, (?:[^,]+, \d+LL, \d+LL, ){2}"
                        r"(t\d+) \+ 0, ", body) or \
        re.search(r"vk_gemm_gathered_double\(27LL, 128LL, 4LL, (?:[^,]+, ){6}(t\d+), ", body)
    assert product, "the columns' gradient is one product"
    copies = [line for line in body.splitlines()
              if re.match(rf"\s*t\d+\[[^\]]*\] = \(*{product.group(1)}\[", line)]
    assert not copies
    outs = {}
    for backend in ("numpy", "cpu"):
        with vkml.use_backend(backend):
            outs[backend] = np.asarray(vkml.jit(vkml.grad(loss))(x))
    assert outs["cpu"].tobytes() == outs["numpy"].tobytes()
    e = np.zeros_like(x)
    e[1, 2, 4, 7] = 1e-6
    numeric = (float(loss(x + e)) - float(loss(x - e))) / 2e-6
    assert abs(outs["cpu"][1, 2, 4, 7] - numeric) < 1e-5 * max(1.0, abs(numeric))
