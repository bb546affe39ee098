"""The cpu tier's blocked matrix product (``codegen/gemm.py``) against the naive loop's bits, in
both of its modes.

The oracles are written in NumPy, independently of the C (``product_oracles``): in the plain mode
``acc = 0`` then ``acc = acc + A[:, k] * B[k, :]`` for k in order, every NumPy float operation
rounding to the element type exactly as C's does; in the fused mode ``acc = fma(A[:, k], B[k, :],
acc)``, each step computed exactly and rounded once.  Every test runs in both modes (the
``mode`` fixture).  Results are compared bit for bit; the one freedom allowed is *which* NaN comes out where the
oracle has a NaN: the naive C loop itself does not fix that (x86 returns the first operand's NaN
and the compiler may swap the operands of a commutative ``*`` or ``+``), so any NaN matches any
NaN, while -0.0, infinities and subnormals must match exactly.
"""

import ctypes
import ctypes.util
import functools

import numpy as np
import pytest

from product_oracles import fma_step, fused_loop, plain_loop
from vkml.backends import cpu
from vkml.backends.codegen import gemm
from vkml.backends.codegen.c_render import prelude

CTYPES = {np.float32: "float", np.float64: "double"}

WRAPPERS = "".join(f"""
void vk_test_gemm_{t}(int64_t M, int64_t N, int64_t K, const {t}* A, int64_t sam, int64_t sak,
                      const {t}* B, int64_t sbk, int64_t sbn, {t}* C, int64_t scm, int64_t scn,
                      {t}* pack)
{{ vk_gemm_{t}(M, N, K, A, sam, sak, B, sbk, sbn, C, scm, scn, pack); }}
void vk_test_gemm_gathered_{t}(int64_t M, int64_t N, int64_t K, const {t}* A, int64_t sam,
                               int64_t sak, const {t}* B, const int64_t* rk, const int64_t* cj,
                               {t}* C, int64_t scm, int64_t scn, {t}* pack)
{{ vk_gemm_gathered_{t}(M, N, K, A, sam, sak, B, rk, cj, C, scm, scn, pack); }}
""" for t in ("float", "double"))

#: builds of the routine: the machine's own vector width, the narrower fallbacks (-mno-... after
#: -march=native turns the wider instruction sets off), the scalar transposing copy a compiler
#: without __builtin_shufflevector gets, a row-major B always packed (never read in place) and
#: an A whose rows or whose k are adjacent always packed too
BUILDS = {"native": (), "avx2": ("-mno-avx512f",), "sse": ("-mno-avx",),
          "no shuffles": ("-DVK_GEMM_NO_SHUFFLE",), "B rows packed": ("-DVK_GEMM_ROWS_IN_PLACE=0",),
          "A always packed": ("-DVK_GEMM_A_IN_PLACE=0",),
          # the fused mode a lane at a time through C's fma, and with no FMA instructions at all
          # (libm's fma: a machine without FMA units gets the same bits, slowly)
          "fma by lanes": ("-DVK_GEMM_SOFT_FMA",), "no fma instructions": ("-mno-fma",),
          "openmp": ("-fopenmp",)}
#: the routine picks a way by a cost estimate (a tile, on the product or on its transpose, in
#: this order); these builds take one way always, so each is checked on every shape
#: (each mode has its own tiles: a way is numbered within its mode's, and a tile the mode lacks
#: is skipped there)
TILES = {"fused": list(gemm.VARIANTS), "plain": list(gemm.PLAIN["VARIANTS"])}
WAYS = [f"{tile}{on}" for tile in dict.fromkeys(TILES["fused"] + TILES["plain"])
        for on in ("", " on the transpose")]


def way_flags(way, mode):
    """The build taking ``way`` always in ``mode`` (None: the mode has no such tile)."""
    tile, on = way.split(" ")[0], " on the transpose" in way
    if tile not in TILES[mode]:
        return None
    return (f"-DVK_GEMM_WAY={2 * TILES[mode].index(tile) + on}",)


#: each mode: its C text and its oracle
MODES = {"plain": (gemm.GEMM_C, plain_loop), "fused": (gemm.FUSED_GEMM_C, fused_loop)}
MODE = "plain"


@pytest.fixture(autouse=True, params=sorted(MODES))
def mode(request):
    """Every test in each mode: ``library`` builds it, ``naive`` is its oracle."""
    global MODE
    MODE = request.param
    yield MODE
    MODE = "plain"


@functools.lru_cache(maxsize=None)
def _library(build, mode):
    flags = BUILDS[build] if build in BUILDS else way_flags(build, mode)
    lib, _ = cpu.library(prelude() + MODES[mode][0] + WRAPPERS, extra_flags=flags)
    return lib


def library(build="native"):
    return _library(build, MODE)


def element_strides(x):
    assert all(s >= 0 for s in x.strides)
    return [s // x.itemsize for s in x.strides]


def pack_buffer(size, guard=256):
    """``size`` bytes aligned to 64, followed by ``guard`` bytes of a pattern the routine must
    leave."""
    raw = np.full(size + 64 + guard, 0xA5, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw, start


def run_gemm(a, b, c, build="native", lib=None, threads=1):
    """C := A @ B through the C routine (of ``build``, or in ``lib``, splitting rows over
    ``threads``), A, B, C any (non-negative) strided views."""
    t = CTYPES[a.dtype.type]
    (m, k), (k2, n) = a.shape, b.shape
    assert k == k2 and c.shape == (m, n) and a.dtype == b.dtype == c.dtype
    size = gemm.pack_bytes(threads)
    raw, start = pack_buffer(size)
    fn = getattr(lib or library(build), f"vk_test_gemm_{t}")
    i64 = ctypes.c_int64
    fn(i64(m), i64(n), i64(k), ctypes.c_void_p(a.ctypes.data), *map(i64, element_strides(a)),
       ctypes.c_void_p(b.ctypes.data), *map(i64, element_strides(b)),
       ctypes.c_void_p(c.ctypes.data), *map(i64, element_strides(c)),
       ctypes.c_void_p(raw.ctypes.data + start))
    assert (raw[start + size:] == 0xA5).all(), "wrote past pack_bytes(threads) of the scratch"
    return c


def naive(a, b):
    """The oracle of the mode: k in index order, each step rounded as the mode rounds it."""
    return MODES[MODE][1](a, b)


def bits(x):
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint64)


def assert_same_bits(got, want):
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), "NaNs in other places"
    g = bits(np.where(nan, 0, got).astype(got.dtype))
    w = bits(np.where(nan, 0, want).astype(want.dtype))
    bad = np.argwhere(g != w)
    assert bad.size == 0, (f"{len(bad)} outputs differ, first at {tuple(bad[0])}: "
                           f"{got[tuple(bad[0])]!r} != {want[tuple(bad[0])]!r}")


def product(a, b, build="native"):
    c = np.full((a.shape[0], b.shape[1]), np.nan, a.dtype)
    return run_gemm(a, b, c, build)


def random(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# sizes around the vector width, the register tiles and the blocks: 0, 1, odd, prime, N < lanes,
# M, N, K past MC, NC and KC (the k-block: several of them continue from C's stored values),
# tiny products and long dot products (the plain loop), vector-matrix products (the row tile)
SHAPES = [(0, 5, 3), (4, 0, 3), (3, 4, 0), (1, 1, 1), (1, 7, 1), (7, 1, 5), (2, 3, 4),
          (5, 10, 9), (13, 17, 19), (8, 32, 16), (9, 33, 31), (16, 15, 1), (31, 47, 64),
          (64, 10, 256), (10, 64, 37), (97, 3, 101), (3, 97, 257), (129, 40, 300),
          (17, 513, 11), (300, 37, 600), (9, 40, 2 * gemm.KC["float"] + 3),
          (33, 20, gemm.KC["float"] + 1), (5, 3, 3 * gemm.KC["double"] - 1),
          (1, 1, 784), (2, 3, 700), (1, 300, 40), (70, 1, 33),
          # past the plain mode's own k-blocks too
          (9, 20, 2 * gemm.PLAIN["KC"]["float"] + 3), (5, 3, 2 * gemm.PLAIN["KC"]["double"] + 1)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_row_major_shapes_match_the_naive_loop(dtype, shape):
    rng = np.random.default_rng(hash(shape) % 2**32)
    m, n, k = shape
    a, b = random(rng, (m, k), dtype), random(rng, (k, n), dtype)
    assert_same_bits(product(a, b), naive(a, b))


def layout(x, how, rng):
    """``x`` (a fresh array) laid out as ``how``: row-major, transposed (column-major), or a
    strided view inside a bigger array of garbage."""
    if how == "row":
        return x.copy()
    if how == "transposed":
        return np.ascontiguousarray(x.T).T
    big = rng.standard_normal((x.shape[0] * 2 + 1, x.shape[1] * 3 + 2)).astype(x.dtype)
    view = big[1::2, 2::3][: x.shape[0], : x.shape[1]]
    view[...] = x
    return view


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("how_a", ["row", "transposed", "strided"])
@pytest.mark.parametrize("how_b", ["row", "transposed", "strided"])
def test_any_operand_strides(dtype, how_a, how_b):
    rng = np.random.default_rng(7)
    for m, n, k in [(37, 45, 300), (64, 10, 70), (5, 130, 9)]:
        a0, b0 = random(rng, (m, k), dtype), random(rng, (k, n), dtype)
        a, b = layout(a0, how_a, rng), layout(b0, how_b, rng)
        assert_same_bits(product(a, b), naive(a0, b0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_operands_with_zero_strides(dtype):
    """A row or column broadcast over the other axis (stride 0) reads the same values again."""
    rng = np.random.default_rng(19)
    for m, n, k in [(20, 40, 30), (3, 70, 9)]:
        row, col = random(rng, (1, k), dtype), random(rng, (k, 1), dtype)
        a, b = np.broadcast_to(row, (m, k)), np.broadcast_to(col, (k, n))
        assert element_strides(a)[0] == 0 and element_strides(b)[1] == 0
        assert_same_bits(product(a, b), naive(np.array(a), np.array(b)))
        one = np.broadcast_to(random(rng, (1, 1), dtype), (k, n))
        assert_same_bits(product(a, one), naive(np.array(a), np.array(one)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("how_c", ["column-major", "strided", "row-major inside wider rows"])
def test_destinations_of_any_strides_and_nothing_written_around_them(dtype, how_c):
    rng = np.random.default_rng(11)
    for m, n, k in [(19, 70, 260), (64, 33, 20), (1, 9, 3), (40, 1, 513)]:
        a, b = random(rng, (m, k), dtype), random(rng, (k, n), dtype)
        # (shape of the surrounding array, C as a view of it)
        shape, view = {"column-major": ((n + 2, m), lambda x: x[1:n + 1].T),   # columns: rows
                       "strided": ((3 * m + 2, 2 * n + 1), lambda x: x[1::3, 1::2][:m, :n]),
                       "row-major inside wider rows": ((m + 2, n + 5),
                                                       lambda x: x[1:m + 1, 2:n + 2])}[how_c]
        sentinel = dtype(-7.25)
        big = np.full(shape, sentinel, dtype)
        c = run_gemm(a, b, view(big))
        assert_same_bits(c, naive(a, b))
        outside = np.ones(shape, bool)
        view(outside)[...] = False
        assert outside.sum() > 0 and (big[outside] == sentinel).all(), "wrote outside C"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_inf_signed_zeros_and_subnormals_come_out_as_the_naive_loop_gives_them(dtype):
    rng = np.random.default_rng(3)
    tiny = np.finfo(dtype).smallest_subnormal
    huge = np.finfo(dtype).max
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, tiny, -tiny, 3 * tiny, huge, -huge,
                         np.finfo(dtype).tiny, 1.0, -1.0], dtype)
    for m, n, k in [(9, 40, 7), (33, 17, 300), (4, 4, 1)]:
        a = rng.choice(specials, (m, k)).astype(dtype)
        b = rng.choice(specials, (k, n)).astype(dtype)
        assert_same_bits(product(a, b), naive(a, b))
    # -0.0 products only: the naive loop gives +0 (0 + -0, or fma(-0, 1, +0)), never -0
    a, b = np.full((3, 5), -0.0, dtype), np.full((5, 18), 1.0, dtype)
    got = product(a, b)
    assert_same_bits(got, naive(a, b))
    assert not np.signbit(got).any()
    # subnormal products and sums that stay subnormal (nothing flushed to zero)
    a = np.full((5, 6), tiny * 4, dtype)
    b = np.full((6, 19), 0.5, dtype)
    got = product(a, b)
    assert_same_bits(got, naive(a, b))
    assert (got == dtype(tiny * 12)).all()


def cancelling(rng, dtype, shape):
    """Values over a huge range of magnitudes and both signs: most sums depend on their order."""
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 7, shape)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_order_of_the_sum_matters_and_is_kept(dtype, mode):
    """On this input a reordered sum, the other mode's step, and (in the plain mode) BLAS each
    differ from the naive loop, so a routine doing any of them would fail here.  (OpenBLAS's
    double product of this size happens to be the fused loop itself: k in order, fused.)"""
    rng = np.random.default_rng(5)
    m, n, k = 24, 40, 300
    a, b = cancelling(rng, dtype, (m, k)), cancelling(rng, dtype, (k, n))
    want = naive(a, b)
    assert_same_bits(product(a, b), want)
    reversed_sum = naive(a[:, ::-1], b[::-1])
    assert (bits(reversed_sum) != bits(want)).any()
    other_mode = plain_loop if mode == "fused" else fused_loop
    assert (bits(other_mode(a, b)) != bits(want)).any()
    if mode == "plain":
        assert (bits(np.matmul(a, b)) != bits(want)).any()
    pairwise = np.ascontiguousarray(a[:, None, :] * b.T[None, :, :]).sum(axis=-1)  # along k
    assert (bits(pairwise.astype(dtype)) != bits(want)).any()
    # k split in two halves summed separately, then added: what a wrong k-blocking would do
    half = k // 2
    split = naive(a[:, :half], b[:half]) + naive(a[:, half:], b[half:])
    assert (bits(split) != bits(want)).any()


def test_the_mode_decides_whether_a_multiply_add_is_fused(mode):
    """acc = -(1 + 2^-11), then + (1 + 2^-12)^2: rounded first, the product is 1 + 2^-11 and the
    sum 0; fused, the sum keeps the product's last bit, 2^-24.  Each mode gives its own answer
    (so a plain routine that fused, or a fused one that did not, fails here)."""
    e = np.float32(1 + 2.0 ** -12)
    a = np.array([[1.0, e]], np.float32)
    b = np.array([[-(1 + 2.0 ** -11)], [e]], np.float32)
    fused = np.float32(np.float64(b[0, 0]) + np.float64(e) * np.float64(e))
    assert fused == np.float32(2.0 ** -24)
    want = naive(a, b)
    assert want[0, 0] == (fused if mode == "fused" else 0)
    assert_same_bits(product(a, b), want)
    # the same pair of values inside a full register tile and a long k
    rng = np.random.default_rng(9)
    a = random(rng, (16, 400), np.float32)
    b = random(rng, (400, 48), np.float32)
    a[:, 298], a[:, 299] = 1.0, e
    b[298], b[299] = -(1 + 2.0 ** -11), e
    assert_same_bits(product(a, b), naive(a, b))


@pytest.mark.parametrize("build", ["avx2", "sse", "no shuffles", "B rows packed", "fma by lanes",
                                   "no fma instructions"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_other_builds_give_the_same_bits(build, dtype):
    rng = np.random.default_rng(13)
    for m, n, k in [(1, 1, 1), (9, 33, 31), (64, 10, 256), (129, 20, 300), (3, 520, 5),
                    (40, 70, 90)]:
        a, b = cancelling(rng, dtype, (m, k)), cancelling(rng, dtype, (k, n))
        for how_a, how_b in [("transposed", "row"), ("row", "transposed")]:
            got = product(layout(a, how_a, rng), layout(b, how_b, rng), build)
            assert_same_bits(got, naive(a, b))


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_way_gives_the_same_bits(way, dtype):
    if way_flags(way, MODE) is None:
        pytest.skip(f"the {MODE} mode has no {way.split()[0]} tile")
    rng = np.random.default_rng(17)
    layouts = ["row", "transposed", "strided"]
    for n, (m, n_, k) in enumerate(SHAPES):
        a, b = cancelling(rng, dtype, (m, k)), cancelling(rng, dtype, (k, n_))
        a_view, b_view = layout(a, layouts[n % 3], rng), layout(b, layouts[n // 3 % 3], rng)
        c = np.full((n_ + 1, m), np.nan, dtype)[1:].T if n % 2 else np.full((m, n_), np.nan, dtype)
        assert_same_bits(run_gemm(a_view, b_view, c, way), naive(a, b))


def test_one_element_type_alone_compiles_and_computes(mode):
    wrapper = WRAPPERS.split("void vk_test_gemm_double")[0]
    lib, _ = cpu.library(prelude() + gemm.gemm_c(("float",), mode == "fused") + wrapper)
    assert "vk_gemm_double" not in gemm.gemm_c(("float",))
    rng = np.random.default_rng(23)
    a, b = random(rng, (20, 30), np.float32), random(rng, (30, 40), np.float32)
    assert_same_bits(run_gemm(a, b, np.zeros((20, 40), np.float32), lib=lib), naive(a, b))


def test_pack_bytes_is_a_modest_fixed_size():
    assert isinstance(gemm.PACK_BYTES, int) and 0 < gemm.PACK_BYTES <= 2 << 20
    assert gemm.PACK_BYTES % 64 == 0
    assert gemm.pack_bytes(1) == gemm.PACK_BYTES < gemm.pack_bytes(4) <= 4 << 20


def test_the_fused_oracle_agrees_with_the_c_librarys_fma():
    """The fused oracle's one step against glibc's ``fma``/``fmaf`` (exactly rounded, and
    independent of both the oracle and the routine) on random triples over 80 decades, near
    ties, and special values."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    rng = np.random.default_rng(29)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-310, -1e-310, 1e300, -1e300,
                2.0 ** -1074, 1 + 2.0 ** -52, 2.0 ** -30]
    for dtype, fn, ctype in [(np.float32, libm.fmaf, ctypes.c_float),
                             (np.float64, libm.fma, ctypes.c_double)]:
        fn.restype, fn.argtypes = ctype, [ctype] * 3
        n = 4000
        with np.errstate(all="ignore"):     # (float32 overflows to infinities: more specials)
            x, y, c = ((rng.standard_normal(n) * 10.0 ** rng.integers(-40, 40, n)).astype(dtype)
                       for _ in range(3))
            # near ties: c cancels most of x * y
            c[:1000] = -(x[:1000].astype(np.float64) * y[:1000]).astype(dtype)
            sx, sy, sc = (np.array(specials, np.float64).astype(dtype) for _ in range(3))
        grid = np.array(np.meshgrid(sx, sy, sc)).reshape(3, -1).astype(dtype)
        x, y, c = (np.concatenate([v, g]) for v, g in zip((x, y, c), grid))
        want = np.array([fn(*map(float, t)) for t in zip(x, y, c)], dtype)
        with np.errstate(all="ignore"):
            got = fma_step(x, y, c)
        assert_same_bits(got, want)


@pytest.mark.skipif(not cpu.is_gcc(cpu.compiler()), reason="the GEMM's threads need GCC's OpenMP")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threads_split_the_rows_and_change_no_bit(dtype):
    """Rows split over 2, 3 or 4 threads (blocks evened out across them, each thread packing A
    into its own slot of the scratch): every output is one thread's sum in k order, so the bits
    are the one-thread bits; nothing is written past ``pack_bytes(threads)``."""
    lib = library("openmp")
    knob = ctypes.c_int.in_dll(lib, "vk_gemm_threads")
    rng = np.random.default_rng(31)
    try:
        for m, n, k in [(256, 300, 40), (97, 130, 300), (500, 64, 70), (1000, 17, 90),
                        (130, 800, 33)]:
            a, b = cancelling(rng, dtype, (m, k)), cancelling(rng, dtype, (k, n))
            want = naive(a, b)
            for threads in (1, 2, 3, 4):
                knob.value = threads
                for how in ("row", "transposed"):
                    got = run_gemm(layout(a, how, rng), b, np.full((m, n), np.nan, dtype),
                                   lib=lib, threads=threads)
                    assert_same_bits(got, want)
    finally:
        knob.value = 1


def _gathered_tables(rng, kind, k, n):
    """``(rk, cj)`` of a gathered B of k x n: element (k, j) at ``rk[k] + cj[j]``."""
    if kind == "conv":           # columns in runs of 8 (a row of pixels), rows a channel and tap
        cj = np.array([(j // 8) * 40 + j % 8 for j in range(n)])
        rk = np.array([(q // 3) * 7 + q % 3 for q in range(k)]) * 400
    elif kind == "conv transposed":   # rows in runs of 8 (pixels), columns in runs of 5 (taps)
        rk = np.array([(q // 8) * 40 + q % 8 for q in range(k)])
        cj = np.array([(j // 5) * 13 + j % 5 for j in range(n)]) * 9000
    elif kind == "strided conv":    # columns two apart in runs of 11 (a stride-2 row of pixels)
        cj = np.array([(j // 11) * 50 + (j % 11) * 2 for j in range(n)])
        rk = np.array([(q // 3) * 7 + q % 3 for q in range(k)]) * 400
    elif kind == "strided conv transposed":   # rows two apart in runs of 8, columns runs of 5
        rk = np.array([(q // 8) * 40 + (q % 8) * 2 for q in range(k)])
        cj = np.array([(j // 5) * 13 + j % 5 for j in range(n)]) * 9000
    elif kind == "mixed steps":     # one, two or three apart, changing anywhere
        rk = np.cumsum(rng.choice([1, 2, 2, 3], k)) * (n * 3 + 1)
        cj = np.cumsum(rng.choice([1, 2, 2, 3], n))
    elif kind == "long runs":
        rk, cj = np.arange(k) * (n + 3), np.arange(n)
    else:                        # anywhere (repeats too): the element-at-a-time path
        rk, cj = rng.integers(0, 500, k) * 97, rng.integers(0, 90, n)
    return rk.astype(np.int64), cj.astype(np.int64)


def run_gathered(a, source, rk, cj, build="native", threads=1):
    t = CTYPES[a.dtype.type]
    m, n = a.shape[0], len(cj)
    c = np.full((m, n), np.nan, a.dtype)
    size = gemm.pack_bytes(threads)
    raw, start = pack_buffer(size)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    getattr(library(build), f"vk_test_gemm_gathered_{t}")(
        i64(m), i64(n), i64(a.shape[1]), ptr(a.ctypes.data), *map(i64, element_strides(a)),
        ptr(source.ctypes.data), ptr(rk.ctypes.data), ptr(cj.ctypes.data), ptr(c.ctypes.data),
        i64(n), i64(1), ptr(raw.ctypes.data + start))
    assert (raw[start + size:] == 0xA5).all(), "wrote past pack_bytes(threads) of the scratch"
    return c


@pytest.mark.parametrize("build", ["native", "no shuffles", "avx2", "sse"] + WAYS[::2])
@pytest.mark.parametrize("kind", ["conv", "conv transposed", "strided conv", "strided conv transposed",
                                  "mixed steps", "long runs", "anywhere"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_gathered_b_gives_the_bits_of_its_copy(build, kind, dtype):
    """``vk_gemm_gathered``: B's element (k, j) read at ``rk[k] + cj[j]`` of a buffer (a
    convolution's columns read from the images) -- packed by runs of columns (elements one or
    two apart), by 8 x 8 transposes where rows run (one or two apart), else element by element
    -- gives the bits of the product with
    B copied out first, on every shape and way (the plain loop of small products too)."""
    if build in WAYS and way_flags(build, MODE) is None:
        pytest.skip(f"the {MODE} mode has no {build.split()[0]} tile")
    rng = np.random.default_rng(23)
    for m, n, k in [(1, 1, 1), (2, 3, 4), (9, 33, 31), (64, 50, 256), (13, 97, 19), (129, 20, 300),
                    (8, 200, 70), (40, 45, 2 * gemm.KC["float"] + 9), (3, 520, 17)]:
        rk, cj = _gathered_tables(rng, kind, k, n)
        source = cancelling(rng, dtype, (int(rk.max() + cj.max()) + 1,))
        a = layout(cancelling(rng, dtype, (m, k)), ["row", "transposed"][n % 2], rng)
        b = source[rk[:, None] + cj[None, :]]
        assert_same_bits(run_gathered(a, source, rk, cj, build), naive(np.ascontiguousarray(a), b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("how", ["row", "transposed", "strided"])
def test_matrix_vector_products_whose_outputs_are_adjacent(dtype, how):
    """``w @ X`` of a row-major X and ``X.T @ w`` run without packing (``vk_gemv``: blocks of
    1024 outputs, four of the matrix's rows at a time, then the rest one at a time): the naive
    loop's bits across the block and unrolling edges, with NaN, infinities and signed zeros,
    for vectors and results at any stride."""
    rng = np.random.default_rng(29)
    for n, k in [(16, 1), (17, 3), (1023, 4), (1024, 5), (1025, 9), (2100, 7), (40, 300)]:
        mat = cancelling(rng, dtype, (k, n))
        mat[0, :3] = [np.nan, np.inf, -0.0]
        vec = cancelling(rng, dtype, (1, k))
        vec[0, -1] = -0.0
        v, x = layout(vec, how, rng), layout(mat, "row", rng)
        assert_same_bits(product(v, x), naive(vec, mat))                          # w @ X
        c = np.full((n + 3, 3), np.nan, dtype)[1:n + 1, 1:2]                       # y at a stride
        assert_same_bits(run_gemm(x.T, layout(vec.T, how, rng), c),
                         naive(mat.T, vec.T))                                      # X.T @ w



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("how", ["row", "strided"])
def test_matrix_vector_products_along_rows(dtype, how):
    """``X @ w`` of a row-major X (``vk_gemv_rows``: 64 rows at a time, 64 columns transposed
    8 x 8 at a time, for a matrix from the caches, 16 rows and 128 columns for a bigger one,
    then 8 rows at a time, the last columns and rows one chain each): the naive loop's bits
    across those edges, with NaN, infinities and signed zeros, vector and result at any
    stride."""
    rng = np.random.default_rng(41)
    for m, k in [(16, 8), (17, 9), (15, 300), (40, 127), (33, 128), (64, 129), (300, 1000), (5, 3),
                 (10, 256), (72, 65), (137, 70), (1100, 1000)]:
        mat = cancelling(rng, dtype, (m, k))
        mat[0, :3] = [np.nan, np.inf, -0.0][:min(3, k)]
        vec = cancelling(rng, dtype, (k, 1))
        vec[-1, 0] = -0.0
        c = np.full((m + 3, 3), np.nan, dtype)[1:m + 1, 1:2]
        assert_same_bits(run_gemm(layout(mat, "row", rng), layout(vec, how, rng), c), naive(mat, vec))
        assert_same_bits(run_gemm(layout(vec.T, how, rng), layout(mat, "row", rng).T, c.T),
                         naive(vec.T, mat.T))                                      # w @ X.T


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matrix_vector_products_split_over_threads_change_no_bit(dtype):
    """A big ``w @ X`` or ``X @ w`` shares its blocks of outputs out between 2, 3 or 4 threads
    (each output one thread's chain): the one-thread bits."""
    lib = library("openmp")
    knob = ctypes.c_int.in_dll(lib, "vk_gemm_threads")
    rng = np.random.default_rng(37)
    try:
        for n, k in [(2100, 600), (700, 1500), (5000, 300)]:
            mat, vec = cancelling(rng, dtype, (k, n)), cancelling(rng, dtype, (1, k))
            want, want_rows = naive(vec, mat), naive(mat.T, vec.T)
            rows = np.ascontiguousarray(mat.T)                  # (n, k) row-major: X @ w
            for threads in (1, 2, 3, 4):
                knob.value = threads
                got = run_gemm(vec, mat, np.full((1, n), np.nan, dtype), lib=lib, threads=threads)
                assert_same_bits(got, want)
                got = run_gemm(rows, vec.T, np.full((n, 1), np.nan, dtype), lib=lib, threads=threads)
                assert_same_bits(got, want_rows)
    finally:
        knob.value = 1
