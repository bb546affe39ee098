"""Products whose operand is a movement of one buffer -- a convolution's columns -- read it where
its elements are (``products.gathered_operands``, ``vk_gemm_gathered``) instead of storing a copy.

The reference is the same program compiled with the columns stored first (the tier as it was):
the bits must not change, at one thread and at two.  Values are checked against the NumPy
backend too (to rounding: its products take BLAS's order)."""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.backends.base import Cache

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="no C compiler on this machine")

RNG = np.random.default_rng(31)

#: (batch, channels, size, outputs, kernel, stride, padding, dilation, groups)
GEOMETRIES = [(6, 3, 11, 5, 3, 1, 0, 1, 1), (4, 2, 12, 7, 5, 2, 1, 1, 1), (3, 4, 13, 6, 3, 1, 2, 2, 1),
              (2, 4, 9, 4, 3, 1, 1, 1, 2), (5, 1, 16, 8, 5, 1, 0, 1, 1), (3, 6, 7, 9, 1, 1, 0, 1, 1)]


def _arguments(geometry, dtype):
    n, c, h, o, k, s, p, d, g = geometry
    return (RNG.standard_normal((n, c, h, h)).astype(dtype),
            RNG.standard_normal((o, c // g, k, k)).astype(dtype))


def _conv_programs(geometry):
    n, c, h, o, k, s, p, d, g = geometry

    def conv(x, w):
        return vkml.conv2d(x, w, stride=s, padding=p, dilation=d, groups=g)

    def loss(x, w):
        return vkml.sum(vkml.tanh(conv(x, w)) * 1.5)

    return [vkml.jit(conv), vkml.jit(vkml.grad(loss, argnums=(0, 1)))]


def _results(geometry, args):
    fns = _conv_programs(geometry)
    return [fns[0](*args).numpy()] + [t.numpy() for t in fns[1](*args)]


@pytest.fixture
def fresh_cpu(on_cpu, monkeypatch):
    """The cpu tier with an executable cache of its own (programs compiled again here)."""
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    monkeypatch.setattr(vkml.backends.current(), "_executables", Cache("test executables"))


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_convolutions_read_their_columns_in_place_with_the_same_bits(fresh_cpu, monkeypatch,
                                                                     dtype, threads):
    monkeypatch.setenv("VKML_THREADS", threads)
    for geometry in GEOMETRIES:
        args = _arguments(geometry, dtype)
        got = _results(geometry, args)
        with monkeypatch.context() as m:
            m.setattr(cpu, "gathered_operands", lambda *a: ({}, set()))
            m.setattr(vkml.backends.current(), "_executables", Cache("stored columns"))
            want = _results(geometry, args)
        for g, w in zip(got, want):
            assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), geometry
        with vkml.use_backend("numpy"):
            ref = _results(geometry, args)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=2e-4 if dtype == np.float32 else 1e-11,
                                       atol=2e-4 if dtype == np.float32 else 1e-11)


def test_the_columns_are_never_stored(on_cpu, monkeypatch):
    """A convolution's gradient: the forward product and the weight gradient's both gather (two
    calls), and of the temporaries the size of the columns only the input gradient's (the
    product of the weight and the output's gradient) is left -- where that product is stored
    whole (``test_blocked_products``: it is computed an image at a time)."""
    monkeypatch.setattr(cpu, "blocked_products", lambda *a: ({}, set()))
    x = np.zeros((16, 8, 12, 12), np.float32)
    w = np.zeros((16, 8, 5, 5), np.float32)
    prog = vkml.program(vkml.grad(lambda x, w: vkml.sum(vkml.conv2d(x, w) ** 2), argnums=(0, 1)), x, w)
    columns = 8 * 25 * 16 * 8 * 8
    source, lowering = cpu.c_source(prog)
    assert source.count("vk_gemm_gathered_float(") == 2
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu, "gathered_operands", lambda *a: ({}, set()))
        plain_source, plain = cpu.c_source(prog)
    assert "vk_gemm_gathered_float(" not in plain_source
    assert [v.size for v in lowering.temp_vars].count(columns) == 1
    assert [v.size for v in plain.temp_vars].count(columns) == 2


def test_a_slice_or_a_stack_of_rows_is_gathered_and_a_column_read_elsewhere_is_stored(fresh_cpu):
    """Any movement of one buffer qualifies (a slice, a stack of row windows); one also read by
    an elementwise operation is stored as before, and both give NumPy's values."""
    a = RNG.standard_normal((70, 90))
    w = RNG.standard_normal((40, 33))

    def windows(a, w):
        return vkml.stack([a[i:i + 40, 3:36] for i in range(0, 30, 3)], 0).reshape(400, 33) @ w.T

    def shared(a, w):
        s = a[5:45, 2:35]
        return (s @ w.T) + vkml.sum(s * 2.0)

    for f, want in [(windows, np.stack([a[i:i + 40, 3:36] for i in range(0, 30, 3)]).reshape(400, 33) @ w.T),
                    (shared, a[5:45, 2:35] @ w.T + np.sum(a[5:45, 2:35] * 2.0))]:
        np.testing.assert_allclose(vkml.jit(f)(a, w).numpy(), want, rtol=1e-12, atol=1e-12)
    assert cpu.c_source(vkml.program(windows, a, w))[0].count("vk_gemm_gathered_double(") == 1
    assert "vk_gemm_gathered_double(" not in cpu.c_source(vkml.program(shared, a, w))[0]


def _random_movement(rng, x):
    """A random chain of movements of ``x`` (transposes, stepped slices, flips, concatenations
    and stacks of it with itself), flattened: the NumPy array or the vkml tensor."""
    F = np if isinstance(x, np.ndarray) else vkml
    t = x
    for _ in range(rng.integers(1, 4)):
        choice = rng.integers(0, 4)
        if choice == 0:
            t = F.transpose(t, tuple(rng.permutation(t.ndim)))
        elif choice == 1:
            cuts = []
            for n in t.shape:
                start = int(rng.integers(0, max(1, n // 3)))
                cuts.append(slice(start, int(rng.integers(start + 1, n + 1)), int(rng.integers(1, 3))))
            t = t[tuple(cuts)]
        elif choice == 2:
            t = F.flip(t, int(rng.integers(0, t.ndim)))
        else:
            axis = int(rng.integers(0, t.ndim))
            t = F.concatenate([t, t], axis) if rng.random() < 0.5 else F.stack([t, t], axis)
    return F.reshape(t, (-1,))


@pytest.mark.parametrize("threads", ["1", "2"])
def test_random_movements_into_products_keep_their_bits(fresh_cpu, monkeypatch, threads):
    """Random chains of movements of one array, cut into a matrix, as either operand of a product
    and in a gradient: the bits of the program with the operand stored, NumPy's values."""
    monkeypatch.setenv("VKML_THREADS", threads)
    rng = np.random.default_rng(43 + int(threads))
    gathered = 0
    for case in range(24):
        dtype = [np.float32, np.float64][case % 2]
        x = rng.standard_normal(tuple(int(s) for s in rng.integers(4, 15, 3))).astype(dtype)
        seed = int(rng.integers(1 << 30))
        flat = _random_movement(np.random.default_rng(seed), x)
        sizes = [d for d in range(1, flat.size + 1) if flat.size % d == 0]
        rows = sizes[int(rng.integers(0, len(sizes)))]
        cols = flat.size // rows
        w = rng.standard_normal((cols, 40)).astype(dtype)
        v = rng.standard_normal((30, rows)).astype(dtype)

        def products(x, w, v):
            b = vkml.reshape(_random_movement(np.random.default_rng(seed), x), (rows, cols))
            return b @ w, v @ b

        def programs():
            return (vkml.jit(products),
                    vkml.jit(vkml.grad(lambda x, w, v: vkml.sum(products(x, w, v)[0] ** 2),
                                       argnums=(0, 1))))

        def run(fns):
            return [t.numpy() for t in fns[0](x, w, v)] + [t.numpy() for t in fns[1](x, w, v)]

        got = run(programs())
        gathered += "vk_gemm_gathered" in cpu.c_source(vkml.program(products, x, w, v))[0]
        with monkeypatch.context() as m:
            m.setattr(cpu, "gathered_operands", lambda *a: ({}, set()))
            m.setattr(vkml.backends.current(), "_executables", Cache("stored operands"))
            want = run(programs())
        for g, s in zip(got, want):
            assert np.array_equal(g.view(np.uint8), s.view(np.uint8)), case
        b = flat.reshape(rows, cols)
        tol = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(got[0], b @ w, rtol=tol, atol=tol)
        np.testing.assert_allclose(got[1], v @ b, rtol=tol, atol=tol)
    assert gathered >= 8                 # (the chains do reach the gathered products)
