"""Matrix products on the cpu tier: one GEMM call each, with one set of bits at every size.

- a float product adds each output's products over k in index order, whether the plain loops
  (small) or the blocked GEMM (big) compute it: checked bit for bit against an oracle written in
  NumPy (an accumulator updated once per k, ``product_oracles``), which BLAS's own order does not
  match -- by default each step a fused multiply-add, with ``VKML_FMA=0`` a rounded product
  then a rounded sum (the plain loops' bits);
- transposed operands are read in place and a transposed product ``(a @ b).T`` is computed as
  ``b.T @ a.T`` straight into its destination (no copy of either);
- a program with big products is one C function (no NumPy fallback), and a training step
  updates its parameters where they are even though a GEMM reads them;
- which results may be computed over an argument counts a GEMM's operands as read whole at its
  call, and never lets a GEMM write over an argument.
"""

import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from product_oracles import fused_loop, plain_loop
from vkml.backends.codegen import products

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))


#: ``a @ b`` (batched over leading axes) with each output's products added for k = 0, 1, ...
#: into an accumulator of the dtype starting at 0, each step one fused multiply-add: the cpu
#: tier's default mode
index_order = fused_loop


def _same_bits(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _operands(dtype, *shapes, seed=0):
    rng = np.random.default_rng(seed)
    # magnitudes spread over 2^-20..2^20: sums that lose low bits, so the order shows
    return [(rng.standard_normal(s) * 2.0 ** rng.integers(-20, 20, s)).astype(dtype) for s in shapes]


CASES = [
    ("x @ w", lambda x, w: x @ w, [(64, 300), (300, 70)]),
    ("x @ w.T (w read transposed)", lambda x, w: x @ w.T, [(64, 300), (70, 300)]),
    ("x.T @ d (x read transposed)", lambda x, d: x.T @ d, [(64, 300), (64, 70)]),
    ("(d.T @ x).T (a transposed product)", lambda d, x: (d.T @ x).T, [(64, 70), (64, 300)]),
    ("batched", lambda a, b: a @ b, [(3, 40, 50), (3, 50, 60)]),
    ("batched, both transposed", lambda a, b: vkml.swapaxes(a, -1, -2) @ vkml.swapaxes(b, -1, -2),
     [(3, 50, 40), (3, 60, 50)]),
    ("small (plain loops)", lambda a, b: a @ b, [(5, 7), (7, 3)]),
]


def _numpy_view(fn, args):
    """What ``fn`` computes, with NumPy operands (the oracle's inputs and layout)."""
    return fn(*[vkml.tensor(a) for a in args])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_a_product_has_the_index_order_bits_at_every_size(name, fn, shapes, dtype):
    args = _operands(dtype, *shapes)
    with vkml.use_backend("numpy"):
        blas = fn(*[vkml.tensor(a) for a in args]).numpy()
    # the oracle: the same expression, its product in index order
    np_fn = {"x @ w": lambda x, w: index_order(x, w),
             "x @ w.T (w read transposed)": lambda x, w: index_order(x, w.T),
             "x.T @ d (x read transposed)": lambda x, d: index_order(x.T, d),
             "(d.T @ x).T (a transposed product)": lambda d, x: index_order(d.T, x).T,
             "batched": index_order,
             "batched, both transposed": lambda a, b: index_order(a.swapaxes(-1, -2), b.swapaxes(-1, -2)),
             "small (plain loops)": index_order}[name]
    want = np_fn(*args)
    with vkml.use_backend("cpu"):
        f = vkml.jit(fn)
        for _ in range(2):
            got = f(*args).numpy()
            assert _same_bits(np.ascontiguousarray(got), np.ascontiguousarray(want)), name
        lazy = fn(*[vkml.tensor(a) for a in args]).numpy()
    assert _same_bits(np.ascontiguousarray(lazy), np.ascontiguousarray(want))
    np.testing.assert_allclose(got, blas, rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=float(np.abs(blas).max()) * 1e-5)


def test_the_oracle_tells_orders_apart():
    """On these operands the fused and the plain step give other bits, and so does k in reverse
    order: a test that passes on the default mode's index order checks the order and the step,
    not just the values.  (OpenBLAS's float product of this size adds k in order with fused
    multiply-adds too: BLAS may well coincide with the fused loop.)"""
    x, w = _operands(np.float32, (64, 300), (300, 70))
    assert not _same_bits(plain_loop(x, w), index_order(x, w))
    assert not _same_bits(index_order(x[:, ::-1], w[::-1]), index_order(x, w))


def test_special_values_pass_through_the_gemm_as_through_the_loops():
    x, w = _operands(np.float32, (64, 300), (300, 70), seed=3)
    x[0, 0], x[1, 5], x[2, :] = np.nan, np.inf, -0.0
    w[7, 3], w[:, 9] = -np.inf, 0.0
    with vkml.use_backend("cpu"):
        got = vkml.jit(lambda x, w: x @ w)(x, w).numpy()
    assert _same_bits(got, index_order(x, w))


def _program(fn, *args):
    return vkml.program(fn, *[np.asarray(a) for a in args])


def test_a_transpose_read_by_several_products_is_read_in_place_not_stored():
    """A weight's transpose read by two products (as a layer's forward and its input gradient
    read it) is never copied: both GEMMs read the weight where it is.  (A stored copy of a
    4096 x 4096 weight's transpose cost the big MLP's step 190 ms of its 460.)"""
    x, w = _operands(np.float32, (64, 300), (70, 300), seed=21)

    def f(x, w):
        wt = vkml.swapaxes(w, -1, -2)
        return x @ wt, (x * 2.0) @ wt
    program = _program(f, x, w)
    _, low = cpu.c_source(program)
    assert not [v for v in low.temp_vars if v.size == w.size], "a copy of the weight was stored"
    with vkml.use_backend("cpu"):
        got = vkml.jit(f)(x, w)
    for g, want in zip(got, (index_order(x, w.T), index_order(x * 2.0, w.T))):
        assert _same_bits(g.numpy(), want)


def test_a_reshape_is_read_in_place_where_strides_describe_it():
    """A reshape of a stored buffer (an image batch's (n, c, h, w) -> (n, c, h * w), a
    convolution's weight gradient reads so) is read where it is, as a transpose is, also
    through a transpose: the one buffer of that size is ``g * 2.0`` itself.  A reshape merging
    two axes a transpose has parted cannot be strides: the transpose is stored (laid out as
    the reshape wants) and read in place.  The bits are the index order's either way."""
    g, x = _operands(np.float32, (4, 8, 6, 6), (4, 36, 50), seed=5)

    def in_place(g, x):
        h = g * 2.0                                        # stored: read by two products
        return vkml.reshape(h, (4, 8, 36)) @ x, vkml.swapaxes(vkml.reshape(h, (4, 8, 36)), -1, -2)

    def parted(g, x):
        h = vkml.transpose(g * 2.0, (0, 2, 1, 3))            # (4, 6, 8, 6): c and h parted
        return vkml.reshape(h, (4, 8, 36)) @ x

    for fn, layout in ((in_place, (4, 8, 6, 6)), (parted, (4, 6, 8, 6))):
        program = _program(fn, g, x)
        _, low = cpu.c_source(program)
        assert [v.shape for v in low.temp_vars if v.size == g.size] == [layout], fn.__name__
        with vkml.use_backend("cpu"):
            got = vkml.jit(fn)(g, x)
        h = g * np.float32(2.0)
        if fn is parted:
            h = np.transpose(h, (0, 2, 1, 3))
        assert _same_bits(np.asarray(got[0] if fn is in_place else got),
                          index_order(np.ascontiguousarray(h).reshape(4, 8, 36), x))


def test_a_transposed_product_is_computed_in_the_layout_wanted():
    """``(d.T @ x).T`` becomes ``x.T @ d``: one GEMM writing the result buffer itself, its
    operands read in place (no temporary holds a transpose or the product)."""
    d, x = _operands(np.float32, (64, 70), (64, 300))
    program = _program(lambda d, x: (d.T @ x).T, d, x)
    rewritten, sites = products.transposed_products(program)
    assert [e.prim.name for e in program.eqns] == ["transpose", "matmul", "transpose"]
    assert [e.prim.name for e in rewritten.eqns] == ["transpose"] * 3 + ["matmul"]
    assert sites == [0, 2, 2, 2]                        # named by the user's transpose
    source, low = cpu.c_source(program)
    (call,) = [line for line in source.splitlines() if "vk_gemm_float(" in line and "LL," in line]
    assert "o0 + 0" in call and "a0 + 0" in call and "a1 + 0" in call
    assert not low.temp_vars[:-1]                       # only the GEMM's packing scratch


def test_a_product_read_elsewhere_keeps_its_transpose():
    d, x = _operands(np.float32, (64, 70), (64, 300))
    program = _program(lambda d, x: (lambda m: (m.T, m.sum()))(d.T @ x), d, x)
    assert products.transposed_products(program) == (program, list(range(len(program.eqns))))


def test_small_and_integer_products_keep_the_plain_loops():
    source, low = cpu.c_source(_program(lambda a, b: a @ b, np.ones((5, 7)), np.ones((7, 3))))
    assert "vk_gemm" not in source and not low.gemm_types
    ints = np.arange(64 * 300).reshape(64, 300) % 7, np.arange(300 * 70).reshape(300, 70) % 5
    source, _ = cpu.c_source(_program(lambda a, b: a @ b, *ints))
    assert "vk_gemm" not in source
    with vkml.use_backend("cpu"):
        got = vkml.jit(lambda a, b: a @ b)(*ints).numpy()
    np.testing.assert_array_equal(got, ints[0] @ ints[1])


def test_an_argument_read_by_a_gemm_may_be_updated_after_it():
    p, x = _operands(np.float32, (80, 80), (80, 80))
    update = _program(lambda p, x: p - 0.5 * (x @ p), p, x)
    # (over x too: the GEMM is done with it before the update's first store)
    assert cpu.c_source(update)[1].overwritable == {0: frozenset({0, 1})}
    # the product itself is never computed over an operand
    assert cpu.c_source(_program(lambda p, x: x @ p, p, x))[1].overwritable == {}
    # an argument a GEMM reads after the result's stores must keep its values until then
    late = _program(lambda p, x: (p + 1.0, x @ p), p, x)
    assert 0 not in cpu.c_source(late)[1].overwritable.get(0, frozenset())
    with vkml.use_backend("cpu"):
        a, b = vkml.jit(lambda p, x: (p + 1.0, x @ p))(p, x)
    assert _same_bits(b.numpy(), index_order(x, p))


def test_a_training_step_with_big_products_is_one_c_function_updating_in_place():
    x = np.random.default_rng(1).standard_normal((64, 300)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 10, 64)
    with vkml.use_backend("cpu"):
        fallbacks = vkml.backend_info()["numpy fallbacks"]
        vkml.nn.manual_seed(0)
        model = vkml.nn.Sequential(vkml.nn.Linear(300, 240), vkml.nn.ReLU(), vkml.nn.Linear(240, 10))
        opt = vkml.optim.Adam(model.parameters(), lr=1e-3)
        step = opt.compile_step(lambda xb, yb: vkml.nn.cross_entropy(model(xb), yb))
        xt, yt = vkml.tensor(x), vkml.tensor(y)
        for _ in range(3):
            step(xt, yt)
        arrays = [weakref.ref(p.ir_var.value) for p in model.parameters()]   # (holding none)
        before = vkml.stats()
        step(xt, yt)
        assert (vkml.stats() - before).submissions == 1
        assert all(p.ir_var.value is a() for p, a in zip(model.parameters(), arrays))
        assert vkml.backend_info()["numpy fallbacks"] == fallbacks
    (program,) = step.programs()
    source, _ = cpu.c_source(program)
    assert source.count("vk_gemm_float(") - source.count("static void vk_gemm_float(") == 5


def test_threads_split_a_products_rows_and_change_no_bit(monkeypatch):
    """With ``VKML_THREADS=2`` a big product's blocks of rows go to two OpenMP threads (GCC
    builds): every output is still one thread's sum in index order, so the bits are the
    one-thread bits.  A bad ``VKML_THREADS`` is refused by name."""
    a, b = _operands(np.float64, (300, 200), (200, 150), seed=5)
    want = index_order(a, b)
    for threads in ("1", "2"):
        monkeypatch.setenv("VKML_THREADS", threads)
        with vkml.use_backend("cpu"):
            got = vkml.jit(lambda a, b: a @ b)(a, b).numpy()
        assert _same_bits(got, want), threads
        low = cpu.c_source(_program(lambda a, b: a @ b, a, b))[1]
        assert cpu._product_threads(low) == (int(threads) if cpu.is_gcc(cpu.compiler()) else 1)
    monkeypatch.setenv("VKML_THREADS", "many")
    with vkml.use_backend("cpu"), pytest.raises(vkml.ArgumentError, match="VKML_THREADS"):
        vkml.jit(lambda a, b: a @ b + 1.0)(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vkml_fma_0_gives_the_plain_loops_bits_and_the_mode_is_part_of_the_cache_key(
        monkeypatch, dtype):
    """``VKML_FMA=0``: each step a rounded product then a rounded sum, in the GEMM and in the
    plain loops alike.  The mode is read when a program is compiled and is part of the
    executable's key: a function jitted after switching back gets the mode's own executable,
    never the other mode's cached one (lazy tensors too).  ``backend_info`` names the mode; a
    bad value is refused by name."""
    big = _operands(dtype, (64, 300), (300, 70), seed=11)
    small = _operands(dtype, (5, 7), (7, 3), seed=12)
    assert not _same_bits(fused_loop(*big), plain_loop(*big))
    with vkml.use_backend("cpu"):
        for flag, oracle in [("0", plain_loop), ("1", fused_loop), ("0", plain_loop)]:
            monkeypatch.setenv("VKML_FMA", flag)
            f = vkml.jit(lambda a, b: a @ b)
            for args in (big, small):
                assert _same_bits(f(*args).numpy(), oracle(*args)), (flag, args[0].shape)
                lazy = (vkml.tensor(args[0]) @ vkml.tensor(args[1])).numpy()
                assert _same_bits(lazy, oracle(*args)), (flag, "lazy")
            assert ("fused" in vkml.backend_info()["products"].split("(")[0]) == (flag == "1")
        monkeypatch.setenv("VKML_FMA", "yes")
        with pytest.raises(vkml.ArgumentError, match="VKML_FMA"):
            vkml.jit(lambda a, b: a @ b)(*big)


def test_rows_times_one_matrix_is_one_product_over_every_row():
    """A Linear layer on a batch of sequences, ``x (B, T, in) @ w.T``: one product of all B*T
    rows (not B products over B copies of the weight), and its weight gradient one product over
    every row (not B products summed).  The forward has the index order's bits of the 2-D
    product; the gradient agrees with float64 NumPy and with central differences."""
    x, w = _operands(np.float32, (6, 40, 30), (20, 30), seed=31)
    x, w = x / np.abs(x).max(), w / np.abs(w).max()        # (finite differences need O(1) values)

    def loss(x, w):
        return vkml.sum((x @ vkml.swapaxes(w, -1, -2)) ** 2)

    grad_program = vkml.program(vkml.grad(loss, argnums=(0, 1)), x, w)
    source, low = cpu.c_source(grad_program)
    calls = [line for line in source.splitlines() if "vk_gemm_float(" in line and "LL," in line]
    assert len(calls) == 3                                   # forward, dx, dw
    assert not any(v.shape == (6, 30, 20) or v.shape == (6, 20, 30) for v in low.temp_vars)
    shapes = {tuple(int(t.strip()[:-2]) for t in call.split("(", 1)[1].split(",")[:3])
              for call in calls}
    # (M, N, K): forward 240 x 20 x 30, input gradient 240 x 30 x 20, weight gradient 20 x 30 x 240
    assert shapes == {(240, 20, 30), (240, 30, 20), (20, 30, 240)}, shapes
    with vkml.use_backend("cpu"):
        value = np.asarray(vkml.jit(lambda x, w: x @ vkml.swapaxes(w, -1, -2))(x, w))
        dx, dw = (np.asarray(g) for g in vkml.jit(vkml.grad(loss, argnums=(0, 1)))(x, w))
    assert _same_bits(value, index_order(x.reshape(240, 30), np.ascontiguousarray(w.T))
                      .reshape(6, 40, 20))
    y = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(dw, 2 * np.einsum("btj,bti->ji", y, x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx, 2 * y @ w.astype(np.float64), rtol=1e-4, atol=1e-5)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    for j, i in ((0, 0), (7, 11), (19, 29)):
        e = np.zeros_like(w64)
        e[j, i] = 1e-6
        numeric = (np.sum((x64 @ (w64 + e).T) ** 2) - np.sum((x64 @ (w64 - e).T) ** 2)) / 2e-6
        assert abs(dw[j, i] - numeric) <= 1e-3 * max(1.0, abs(numeric)), (j, i)


BATCHED_SCRIPT = r"""
import os, sys, numpy as np, vkml
sys.path.insert(0, sys.argv[1])
from product_oracles import fused_loop
rng = np.random.default_rng(11)
a = (rng.standard_normal((6, 96, 200)) * 2.0 ** rng.integers(-20, 20, (6, 96, 200))).astype(np.float32)
b = rng.standard_normal((6, 200, 80)).astype(np.float32)
with vkml.use_backend("cpu"):
    got = np.asarray(vkml.jit(lambda a, b: a @ b)(a, b))
print(got.tobytes() == fused_loop(a, b).tobytes())
"""


@pytest.mark.skipif(not cpu.is_gcc(cpu.compiler() or ""), reason="needs GCC (OpenMP)")
def test_a_batch_of_small_products_runs_its_matrices_side_by_side(monkeypatch, tmp_path):
    """An attention's heads or a convolution's images (a batch of matrices each too small to
    split by rows) run on the threads side by side, each thread its own matrices and packing
    slot: the index order's bits for any thread count -- also where nested OpenMP teams are
    allowed (a product called from a thread never splits again, or two would share a slot)."""
    from vkml.backends.codegen.threaded_nests import THREADED_MARKER
    a, b = _operands(np.float32, (8, 4, 128, 32), (8, 4, 32, 128), seed=12)
    results = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("VKML_THREADS", threads)
        monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path / threads))
        source, _ = cpu.c_source(_program(lambda a, b: a @ b, a, b))
        assert (THREADED_MARKER in source and "omp_get_thread_num()" in source) == (threads != "1")
        vkml.clear_caches()
        with vkml.use_backend("cpu"):
            results[threads] = np.asarray(vkml.jit(lambda a, b: a @ b)(a, b))
    want = index_order(a, b)
    assert all(_same_bits(r, want) for r in results.values())
    env = dict(os.environ, OMP_MAX_ACTIVE_LEVELS="3", OMP_NESTED="true", VKML_THREADS="2",
               VKML_CACHE_DIR=str(tmp_path / "nested"),
               PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", BATCHED_SCRIPT, os.path.dirname(__file__)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "True", out.stderr[-2000:]
