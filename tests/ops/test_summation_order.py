"""One summation order per reduction, on every tier: the same bits on every call, backend and thread.

Every float sum of vkml is the canonical tree (``vkml.ops.treesum``): the perfect binary tree over
the reduced elements in row-major order, zero-padded to a power of two.  Checked here:

- an independent oracle (a recursive tree over Python floats, rounded to the dtype after every
  add) gives the NumPy implementation's bits on small sizes, with -0.0, inf, NaN, huge and tiny
  values; the deterministic matrix product is that oracle over k;
- the first and the 100th call of a jitted sum give the same bits on every backend under test
  (the cpu tier runs a program on NumPy first, then compiled C), for sizes 0..10^6 and every
  axis, axis pair and all axes of 3-d arrays, float32 and float64;
- the NumPy backend, the cpu tier and the emulated CUDA backend agree bit for bit on every
  reduction of the per-op suite (sum, mean, var, std, logsumexp, cumsum, norm, trace, einsum, the
  deterministic matmul, ...) and on gradients of sum, mean and the deterministic matmul;
- ``cumsum`` adds in index order (NumPy's ``cumsum`` equals a sequential loop);
- a program holding a BLAS matmul on the cpu tier never switches between NumPy and C.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import subprocess
import warnings

import numpy as np
import pytest

import vkml
import vkml.numpy as vnp
from backends_under_test import BACKENDS
from cuda_emulation import CXX, fake_driver
from vkml.ops.treesum import tree_matmul, tree_reduce, tree_sum

SIZES = [0, 1, 2, 3, 5, 7, 8, 9, 255, 256, 257, 1000, 4097, 10**5, 10**6]
DTYPES = [np.float32, np.float64]
SHAPES_3D = [(5, 33, 64), (7, 1, 257)]
AXES_3D = [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)]


@pytest.fixture(autouse=True)
def _tiering_as_users_get_it(monkeypatch):
    """The cpu tier as users get it (the suite's conftest compiles at once): a program runs on
    NumPy first and in C from its second call, so call-to-call stability covers the switch."""
    monkeypatch.setenv("VKML_CPU_HOT", "1")


# -- the independent oracle -----------------------------------------------------------------------

def oracle_tree(values, dtype):
    """The canonical tree written out: zero-padded to a power of two, halves summed recursively,
    every add over Python floats rounded to ``dtype`` (double rounding is exact for + here)."""
    dtype = np.dtype(dtype).type
    leaves = [float(v) for v in values]
    if not leaves:
        return dtype(0.0)
    width = 1 << (len(leaves) - 1).bit_length()
    leaves += [0.0] * (width - len(leaves))

    def total(lo, hi):
        if hi - lo == 1:
            return dtype(leaves[lo])
        mid = (lo + hi) // 2
        with np.errstate(over="ignore", invalid="ignore"):
            return dtype(float(total(lo, mid)) + float(total(mid, hi)))
    return total(0, width)


def _values(kind, shape, dtype, seed):
    """Test data: ``normal`` (mixed magnitudes), ``zeros`` (signed zeros), ``huge`` (partial sums
    overflow in some orders only), ``tiny`` (subnormals), ``special`` (sparse inf/-inf/NaN)."""
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    if kind == "normal":
        x = rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 7, shape)
    elif kind == "zeros":
        x = np.where(rng.random(shape) < 0.7, -0.0, 0.0)
    elif kind == "huge":
        x = rng.choice([1.0, -1.0, 0.75, -0.5], shape) * float(info.max) * 0.6
    elif kind == "tiny":
        x = rng.standard_normal(shape) * float(info.smallest_subnormal) * 7
    else:
        x = rng.standard_normal(shape)
        flat = x.reshape(-1)
        if flat.size:
            picks = rng.integers(0, flat.size, max(1, flat.size // 50))
            flat[picks] = rng.choice([np.inf, -np.inf, np.nan, -0.0], picks.size)
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(dtype)


KINDS = ["normal", "zeros", "huge", "tiny", "special"]


def _same(a, b):
    """The same bits, except that any NaN equals any NaN: IEEE leaves the sign and payload of a
    NaN made from two NaN operands to the hardware's operand order, which a C compiler may swap
    for a commutative add."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        if not np.array_equal(nan_a, nan_b):
            return False
        a, b = np.where(nan_a, 0, a), np.where(nan_b, 0, b)
    return a.tobytes() == b.tobytes()


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_numpy_tree_is_the_oracles_tree(kind, dtype):
    for n in [0, 1, 2, 3, 5, 7, 8, 9, 31, 255, 256, 257]:
        x = _values(kind, (n,), dtype, n)
        assert _same(tree_sum(x), np.asarray(oracle_tree(x, dtype))), (kind, n)


def test_signed_zeros_follow_the_padded_tree():
    z = -0.0
    assert np.signbit(tree_sum(np.array([z])))                  # one element: itself
    assert np.signbit(tree_sum(np.array([z, z])))               # -0 + -0 = -0
    assert not np.signbit(tree_sum(np.array([z, z, z])))        # the padding adds +0.0
    assert np.signbit(tree_sum(np.array([z, z, z, z])))
    assert _same(tree_sum(np.zeros(0)), np.array(0.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_a_sum_over_several_axes_is_the_tree_over_them_in_row_major_order(dtype):
    x = _values("normal", (3, 5, 6, 7), dtype, 1)
    for axes in [(1,), (3,), (0, 2), (1, 3), (2, 1), (0, 1, 2, 3), (0, 3)]:
        kept = [i for i in range(4) if i not in axes]
        moved = np.transpose(x, kept + sorted(axes)).reshape([x.shape[i] for i in kept] + [-1])
        want = np.array([oracle_tree(row, dtype) for row in moved.reshape(-1, moved.shape[-1])],
                        dtype).reshape(moved.shape[:-1])
        assert _same(tree_reduce(x, axes), want), axes


def test_aligned_chunks_are_subtrees():
    """Chunked sums (threads, passes, GPU blocks) give the one-pass bits."""
    from vkml.graph.treesum import chunk_sum
    x = _values("normal", (1000, 3), np.float32, 2)
    for size in [1, 2, 8, 256, 512, 1024]:
        assert _same(chunk_sum(x, size), tree_sum(x)), size


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_the_deterministic_matmul_is_the_tree_over_k(dtype):
    rng = np.random.default_rng(3)
    for m, k, n in [(1, 1, 1), (3, 7, 2), (4, 33, 5), (2, 300, 3)]:
        a = (rng.standard_normal((2, m, k)) * 10.0 ** rng.integers(-4, 5, (2, m, k))).astype(dtype)
        b = (rng.standard_normal((2, k, n)) * 10.0 ** rng.integers(-4, 5, (2, k, n))).astype(dtype)
        want = np.empty((2, m, n), dtype)
        for z, i, j in itertools.product(range(2), range(m), range(n)):
            want[z, i, j] = oracle_tree([a[z, i, q] * b[z, q, j] for q in range(k)], dtype)
        assert _same(tree_matmul(a, b), want), (m, k, n)
        got = vkml.matmul(a, b, deterministic=True).numpy()
        assert _same(got, want), (m, k, n)


def test_the_deterministic_matmul_keeps_its_blocks_subtrees(monkeypatch):
    """Blocked over k (a short last block): the same bits as one block."""
    from vkml.ops import treesum
    a = _values("normal", (3, 5, 37), np.float64, 4)
    b = _values("normal", (3, 37, 4), np.float64, 5)
    whole = tree_matmul(a, b)
    monkeypatch.setattr(treesum, "TREE_MATMUL_BLOCK", 3 * 5 * 4 * 8)       # blocks of 8 values of k
    assert _same(tree_matmul(a, b), whole)


# -- first call == 100th call, on every backend ---------------------------------------------------

def _on(backend):
    """A ``with`` block running on ``backend`` ("cuda": the emulated driver)."""
    @contextlib.contextmanager
    def block():
        with (fake_driver() if backend == "cuda" else contextlib.nullcontext()):
            vkml.set_backend(backend)
            try:
                yield
            finally:
                vkml.set_backend("numpy")
    return block()


def _first_and_hundredth(fn, *args):
    f = vkml.jit(fn)
    first = f(*args).numpy()
    for _ in range(98):
        f(*args)
    return first, f(*args).numpy()


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid:RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_a_sum_has_the_same_bits_on_the_first_and_the_hundredth_call(backend, dtype):
    with _on(backend):
        for n, kind in itertools.product(SIZES, KINDS):
            x = _values(kind, (n,), dtype, n)
            first, last = _first_and_hundredth(lambda x: vkml.sum(x * x * 2.0 + x), x)
            with np.errstate(over="ignore", invalid="ignore"):
                want = tree_sum(x * x * dtype(2.0) + x)
            assert _same(first, want) and _same(last, want), (n, kind)


@pytest.mark.skipif(CXX is None, reason="the emulated CUDA backend needs a C++ compiler")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_emulated_cuda_sums_have_the_trees_bits_on_every_call(dtype):
    """One thread per output below 2048 elements, two stages of aligned subtrees above."""
    with _on("cuda"):
        for n in SIZES:
            x = _values("normal", (n,), dtype, n)
            f = vkml.jit(lambda x: vkml.sum(x * x * 2.0 + x))
            want = tree_sum(x * x * dtype(2.0) + x)
            assert all(_same(f(x).numpy(), want) for _ in range(3)), n


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_every_axis_of_a_3d_sum_has_the_same_bits_on_every_call(backend, kind, dtype):
    with _on(backend), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)        # overflow in the huge sums
        for shape, axes in itertools.product(SHAPES_3D, AXES_3D):
            x = _values(kind, shape, dtype, hash((shape, axes)) % 1000)
            f = vkml.jit(lambda x, axes=axes: vkml.sum(x, axis=axes))
            calls = [f(x).numpy() for _ in range(3)]
            want = tree_reduce(x, axes)
            assert all(_same(c, want) for c in calls), (shape, axes)


def test_the_briefs_example_is_stable_on_the_cpu_tier(monkeypatch):
    """The cpu tier's first call runs on NumPy, the second in C: the same bits."""
    if "cpu" not in BACKENDS:
        pytest.skip("cpu tier not under test")
    from vkml.backends import cpu
    ran = []
    real_c, real_numpy = cpu.CpuBackend._compile_c, cpu.CpuBackend._numpy
    monkeypatch.setattr(cpu.CpuBackend, "_compile_c", lambda self, p: ran.append("C") or real_c(self, p))
    monkeypatch.setattr(cpu.CpuBackend, "_numpy", lambda self, p, **kw: ran.append("NumPy") or real_numpy(self, p, **kw))
    x = np.linspace(-1, 1, 1001) * 4
    vkml.clear_caches()
    with _on("cpu"):
        f = vkml.jit(lambda x: vkml.sum(x * x * 2.0 + x))
        a, b, c = (f(x).numpy() for _ in range(3))
    assert ran == ["NumPy", "C"]
    assert _same(a, b) and _same(b, c) and a.tobytes() == tree_sum(x * x * 2.0 + x).tobytes()


# -- NumPy = cpu tier = emulated CUDA, for every reduction ----------------------------------------

def _reductions():
    """(name, fn, args): the reductions of the per-op suite and what is built on them."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 300, 9))
    x32 = x.astype(np.float32)
    big = rng.standard_normal(5000)
    a, b = rng.standard_normal((4, 50, 70)), rng.standard_normal((4, 70, 6))
    sq = rng.standard_normal((40, 40))
    dup = rng.integers(0, 7, (300, 1))             # duplicate indices: added in index order
    return [
        ("sum", lambda x: vkml.sum(x), (x,)),
        ("sum axis", lambda x: vkml.sum(x, axis=1), (x32,)),
        ("sum big", lambda x: vkml.sum(x), (big,)),
        ("sum big columns", lambda x: vkml.sum(x, axis=(0, 2)), (rng.standard_normal((1031, 3, 4)),)),
        ("mean", lambda x: vkml.mean(x, axis=(0, 2)), (x,)),
        ("var", lambda x: vkml.var(x, axis=1), (x,)),
        ("std", lambda x: vkml.std(x, axis=0), (x32,)),
        ("logsumexp", lambda x: vkml.logsumexp(x, axis=1), (x,)),
        ("cumsum", lambda x: vnp.cumsum(x, axis=1), (x,)),
        ("cumsum flat", lambda x: vnp.cumsum(x), (x32,)),
        ("norm", lambda x: vnp.linalg.norm(x), (big,)),
        ("trace", lambda x: vnp.trace(x), (sq,)),
        ("einsum", lambda x: vnp.einsum("ijk->j", x), (x,)),
        ("vdot", lambda x, y: vnp.vdot(x, y), (big, big[::-1].copy())),
        ("matmul tree", lambda a, b: vkml.matmul(a, b, deterministic=True), (a, b)),
        ("matmul tree f32", lambda a, b: vkml.matmul(a, b, deterministic=True),
         (a.astype(np.float32), b.astype(np.float32))),
        ("scatter_add", lambda base, upd: vkml.scatter_add(base, dup, upd), (big[:7], big[:300])),
        ("grad of a gather", vkml.grad(lambda x: vkml.sum(vkml.gather(x, dup) * big[:300])), (big[:7],)),
        ("grad of a broadcast", vkml.grad(lambda b: vkml.sum((x + b) * x)), (x[0, 0],)),
        ("grad sum", vkml.grad(lambda x: vkml.sum(vkml.sin(x) * x)), (x,)),
        ("grad mean", vkml.grad(lambda x: vkml.mean(x * x, axis=1).sum()), (x32,)),
        ("grad matmul tree", vkml.grad(lambda a, b: vkml.sum(vkml.matmul(a, b, deterministic=True)
                                                             * vkml.matmul(a, b, deterministic=True)),
                                       argnums=(0, 1)), (a, b)),
    ]


#: the emulated CUDA backend compiles with the host's C++ compiler
CUDA = ["cuda"] if CXX is not None else []


def _run_all(backend):
    out = {}
    with _on(backend):
        for name, fn, args in _reductions():
            f = vkml.jit(fn)
            r = f(*args)
            r2 = f(*args)
            leaves = r if isinstance(r, tuple) else (r,)
            leaves2 = r2 if isinstance(r2, tuple) else (r2,)
            out[name] = [t.numpy() for t in leaves]
            assert all(_same(p.numpy(), q) for p, q in zip(leaves2, out[name])), (backend, name)
    return out


@pytest.fixture(scope="module")
def reference():
    return _run_all("numpy")


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "numpy"] + CUDA)
def test_every_reduction_has_the_numpy_backends_bits(backend, reference, monkeypatch):
    # the order of the sums is what is checked: on the cpu tier the few entries holding exp, log
    # or sin run them on scalar libm (whose results match NumPy's on these inputs), not on the
    # vector versions its programs call by default (within a few ulps, not bit for bit)
    monkeypatch.setenv("VKML_VECTOR_MATH", "0")
    got = _run_all(backend)
    bad = [name for name in reference
           if not all(_same(p, q) for p, q in zip(reference[name], got[name]))]
    assert not bad, f"{backend}: different bits in {bad}"


def test_the_numpy_backend_matches_the_oracle_on_the_suite(reference):
    """The per-op suite's sums are the tree (not NumPy's pairwise sum)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 300, 9))
    assert _same(reference["sum"][0], tree_sum(x.reshape(-1)))
    assert _same(reference["einsum"][0], tree_reduce(x, (0, 2)))


# -- cumsum: index order everywhere ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_numpys_cumsum_adds_in_index_order(dtype):
    x = _values("normal", (4097,), dtype, 9)
    running, want = dtype(0), np.empty_like(x)
    for i, v in enumerate(x):
        running = dtype(running + v)
        want[i] = running
    assert _same(np.cumsum(x, dtype=dtype), want)
    assert _same(vnp.cumsum(x).numpy(), want)


# -- matmul on the cpu tier: stable across calls ---------------------------------------------------

def test_a_program_with_a_blas_matmul_is_never_switched_between_numpy_and_c(monkeypatch):
    """Small (plain loops) or big (the GEMM): compiled at once, C adding over k in order on every
    call, never NumPy's BLAS first."""
    if "cpu" not in BACKENDS:
        pytest.skip("cpu tier not under test")
    from vkml.backends import cpu
    tiered, compiled = [], []
    monkeypatch.setattr(cpu, "Tiered", lambda *a: tiered.append(a) or pytest.fail("tiered"))
    real = cpu.CpuBackend._compile_c
    monkeypatch.setattr(cpu.CpuBackend, "_compile_c",
                        lambda self, program, *math: compiled.append(program) or
                        real(self, program, *math))
    rng = np.random.default_rng(11)
    small = rng.standard_normal((8, 130)), rng.standard_normal((130, 5))
    large = rng.standard_normal((300, 300)), rng.standard_normal((300, 300))
    with _on("cpu"):
        for (a, b), want_compiled in ((small, 1), (large, 1)):
            compiled.clear()
            f = vkml.jit(lambda a, b: (a @ b) * 2.0)
            calls = [f(a, b).numpy() for _ in range(4)]
            assert all(_same(c, calls[0]) for c in calls), a.shape
            assert len(compiled) == want_compiled, a.shape
    assert not tiered


def test_the_deterministic_mode_is_read_when_ops_are_bound_and_keys_the_jit_cache():
    a, b = np.random.default_rng(1).standard_normal((2, 3, 5)), np.ones((2, 5, 4))
    f = vkml.jit(lambda a, b: a @ b)
    plain = vkml.program(f, a, b)
    with vkml.deterministic_matmul():
        assert vkml.is_deterministic_matmul()
        tree = vkml.program(f, a, b)
        layer = vkml.nn.Linear(5, 2)
        traced = vkml.program(lambda x: layer(x), np.ones((3, 5), np.float32))
    assert not vkml.is_deterministic_matmul()
    assert "order=tree" not in str(plain) and "order=tree" in str(tree)
    assert "order=tree" in str(traced)
    with vkml.deterministic_matmul():
        assert _same(f(a, b).numpy(), tree_matmul(a, b))
    derived = vkml.program(vkml.grad(lambda a, b: vkml.sum(vkml.matmul(a, b, deterministic=True))), a, b)
    assert str(derived).count("order=tree") >= 2       # its derivatives are deterministic products


def test_bad_deterministic_values_are_refused():
    with pytest.raises(vkml.ArgumentError, match="deterministic"):
        vkml.matmul(np.ones((2, 2)), np.ones((2, 2)), deterministic="yes")
    with pytest.raises(vkml.VkmlError, match="enabled"):
        vkml.deterministic_matmul("yes")


# -- the CUDA source of the tree compiles for the GPU ---------------------------------------------

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_cuda_tree_kernels_compile_with_nvcc(tmp_path):
    """Every reduction of the suite (grid sums, two-stage split sums, the deterministic product,
    gradients) as one translation unit, compiled with ``nvcc --ptx -arch=sm_90``."""
    from vkml.backends.codegen import cuda_render
    plans = [cuda_render.cuda_plan(vkml.program(fn, *args), prefix=f"vk_{i}_")
             for i, (_, fn, args) in enumerate(_reductions())]
    assert any("vk_tree_push_double" in p.source for p in plans)
    kinds = {k.kind for p in plans for k in p.kernels}
    assert {"grid", "chunks"} <= kinds       # split sums: a thread per chunk, a block per chunk
    path = tmp_path / "tree.cu"
    path.write_text(cuda_render.module_source(plans, namespaces=True))
    proc = subprocess.run(["nvcc", "--ptx", "-arch=sm_90", *cuda_render.NVCC_FLAGS, "-o",
                           str(tmp_path / "tree.ptx"), str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vk_tree_push" in path.read_text()


def test_300_adam_steps_give_the_same_parameters_on_every_backend():
    """The issue's example: a sum's bits no longer change between calls or tiers, so a training
    run no longer drifts (NumPy backend = cpu tier, which switches to C after one call)."""
    def train(backend):
        with _on(backend):
            w = vkml.tensor(np.linspace(-1, 1, 1001) * 4, requires_grad=True)
            opt = vkml.optim.Adam([w], lr=0.01)
            losses = []
            for _ in range(300):
                opt.zero_grad()
                loss = vkml.sum(w * w * 2.0 + w)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return w.numpy().tobytes() + np.array(losses).tobytes()
    runs = {b: train(b) for b in BACKENDS}
    assert len(set(runs.values())) == 1, list(runs)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_a_program_with_a_libm_function_gives_the_same_bits_on_every_call():
    """NumPy's exp/tanh (SIMD) and libm's differ in the last bits: such a program is compiled at
    once on the cpu tier, never run first on NumPy, so its first and later calls agree."""
    x = _values("normal", (4099,), np.float32, 12)
    for fn in (lambda x: vkml.tanh(x) * 3.0 + x, lambda x: vkml.logsumexp(x),
               lambda x: vkml.sum(vkml.exp(x * 1e-3) * x)):
        for backend in BACKENDS:
            with _on(backend):
                first, last = _first_and_hundredth(fn, x)
            assert _same(first, last), backend
