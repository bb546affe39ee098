"""A product only a sum of padded windows reads -- a convolution's input gradient -- computed an
image at a time inside the sum's loop over images (``blocked_products``), never stored whole.

The reference is the same program with the product stored whole first (the tier as it was):
the bits must not change, at one thread and at two; values are checked against the NumPy
backend too (to rounding: its products take BLAS's order)."""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.base import Cache
from vkml.backends.codegen import blocked_products as blocked

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="no C compiler on this machine")

RNG = np.random.default_rng(53)

#: (batch, channels, size, outputs, kernel, stride, padding, dilation): each input gradient's
#: product big enough per image to be blocked
GEOMETRIES = [(4, 8, 12, 16, 5, 1, 0, 1), (5, 4, 14, 24, 3, 1, 2, 2), (2, 12, 9, 8, 4, 1, 1, 1),
              (6, 5, 11, 32, 3, 1, 1, 1), (2, 16, 10, 16, 2, 1, 0, 1), (3, 8, 15, 24, 3, 2, 1, 1),
              (2, 8, 17, 32, 3, 2, 0, 1), (1, 8, 12, 16, 5, 1, 0, 1), (3, 8, 12, 16, 5, 1, 0, 1)]


def _arguments(geometry, dtype):
    n, c, h, o, k, s, p, d = geometry
    return (RNG.standard_normal((n, c, h, h)).astype(dtype),
            RNG.standard_normal((o, c, k, k)).astype(dtype))


def _gradients(geometry):
    n, c, h, o, k, s, p, d = geometry

    def loss(x, w):
        return vkml.sum(vkml.tanh(vkml.conv2d(x, w, stride=s, padding=p, dilation=d)) * 1.5)

    return vkml.jit(vkml.grad(loss, argnums=(0, 1)))


def _whole(monkeypatch):
    """The cpu tier with every product stored whole (and an executable cache of its own)."""
    monkeypatch.setattr(cpu, "blocked_products", lambda *a: ({}, set()))
    monkeypatch.setattr(vkml.backends.current(), "_executables", Cache("whole products"))


@pytest.fixture
def fresh_cpu(on_cpu, monkeypatch):
    """The cpu tier with an executable cache of its own (programs compiled again here)."""
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    monkeypatch.setattr(vkml.backends.current(), "_executables", Cache("test executables"))


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_input_gradient_computed_an_image_at_a_time_has_the_same_bits(fresh_cpu, monkeypatch,
                                                                         dtype, threads):
    monkeypatch.setenv("VKML_THREADS", threads)
    for geometry in GEOMETRIES:
        args = _arguments(geometry, dtype)
        prog = vkml.program(vkml.grad(lambda x, w: vkml.sum(vkml.conv2d(
            x, w, stride=geometry[5], padding=geometry[6], dilation=geometry[7]) ** 2)), *args)
        assert "vk_image" in cpu.c_source(prog)[0], geometry     # (the case is the blocked one)
        got = [t.numpy() for t in _gradients(geometry)(*args)]
        with monkeypatch.context() as m:
            _whole(m)
            want = [t.numpy() for t in _gradients(geometry)(*args)]
        for g, w in zip(got, want):
            assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), geometry
        with vkml.use_backend("numpy"):
            ref = [t.numpy() for t in _gradients(geometry)(*args)]
        tol = 2e-4 if dtype == np.float32 else 1e-11
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=tol, atol=tol)


def test_the_input_gradients_product_is_never_stored_whole(on_cpu, monkeypatch):
    """The C: a GEMM call per image inside the loop over images, into a buffer of one image's
    block; no temporary the size of the columns is left (the forward product and the weight
    gradient read the columns in place); on two threads each thread has a buffer of its own."""
    monkeypatch.setenv("VKML_THREADS", "1")
    x = np.zeros((16, 8, 12, 12), np.float32)
    w = np.zeros((16, 8, 5, 5), np.float32)
    prog = vkml.program(vkml.grad(lambda x, w: vkml.sum(vkml.conv2d(x, w) ** 2), argnums=(0, 1)), x, w)
    columns = 8 * 25 * 16 * 8 * 8
    source, lowering = cpu.c_source(prog)
    assert source.count("vk_gemm_float(200LL, 64LL, 16LL,") == 1      # (rows, an image's pixels, k)
    assert [v.size for v in lowering.temp_vars].count(columns) == 0
    assert 200 * 64 in [v.size - 16 for v in lowering.temp_vars]     # (one image's block, aligned)
    with monkeypatch.context() as m:
        _whole(m)
        whole_source, whole = cpu.c_source(prog)
    assert "vk_image" not in whole_source
    assert [v.size for v in whole.temp_vars].count(columns) == 1
    monkeypatch.setenv("VKML_THREADS", "2")
    threaded_source, threaded = cpu.c_source(prog)
    assert "omp_get_thread_num() * 12800LL" in threaded_source       # (a block per thread)
    # one image: blocked too, on one thread (no team of none: OpenMP's num_threads must be > 0)
    one = vkml.program(vkml.grad(lambda x, w: vkml.sum(vkml.conv2d(x, w) ** 2)), x[:1], w)
    one_source = cpu.c_source(one)[0]
    assert "vk_image" in one_source and "num_threads(0)" not in one_source


def test_a_product_read_by_anything_else_is_stored_whole(fresh_cpu):
    """The columns' gradient also read by a sum of its own (or handed back) is stored as before;
    both give NumPy's values."""
    x = RNG.standard_normal((4, 8, 12, 12))
    w = RNG.standard_normal((16, 8, 5, 5))
    dy = RNG.standard_normal((4, 16, 8, 8))

    def both(x, w, dy):
        # the input gradient of conv2d(x, w) for the output gradient dy, and its columns' sum
        _, vjp = vkml.vjp(lambda x: vkml.conv2d(x, w), x)
        return vjp(dy)[0], vkml.sum(vkml.reshape(w, (16, 200)).T @ vkml.reshape(
            vkml.transpose(dy, (1, 0, 2, 3)), (16, 256)))

    source = cpu.c_source(vkml.program(both, x, w, dy))[0]
    got = [t.numpy() for t in vkml.jit(both)(x, w, dy)]
    with vkml.use_backend("numpy"):
        want = [t.numpy() for t in vkml.jit(both)(x, w, dy)]
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-11)
    assert "vk_image" in source          # (this one's own product is blocked; the sum's is not)


def test_a_window_reaching_into_another_images_block_is_not_blocked():
    """The offsets prove where each window element lies: one in another image's columns (or at
    a place that depends on the image) refuses the blocking."""
    columns, width = 4 * 6, 6
    own = np.arange(3 * 4 * 6).reshape(3, 4, 6)        # rows 3, images 4, pixels 6
    window = own.transpose(1, 0, 2)[:, :, 1:5]         # image b's rows, pixels 1..4
    assert blocked._place_in_block(window, columns, width) == (1, [6, 1])
    shifted = np.roll(window, 1, axis=0)               # image b reading image b-1's pixels
    assert blocked._place_in_block(shifted, columns, width) is None
    uneven = window.copy()
    uneven[2, 0, 0] += 1                               # one element elsewhere in its own block
    assert blocked._place_in_block(uneven, columns, width) is None
