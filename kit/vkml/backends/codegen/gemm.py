"""A matrix product for generated C with exactly the naive loop's bits, blocked for speed.

Contract: ``vk_gemm_float`` / ``vk_gemm_double`` (in :data:`GEMM_C`) compute, for every output,
``acc = 0; for k in 0..K-1: acc = acc + A[i,k] * B[k,j]`` -- each product rounded to the element
type, then each sum rounded, k in index order, no fused multiply-add -- or, in the fused mode
(:data:`FUSED_GEMM_C`), ``acc = fma(A[i,k], B[k,j], acc)``, each step rounded once (the FMA
instructions where the CPU has them, C's exactly rounded ``fma`` a lane at a time elsewhere: the
same bits everywhere) -- for operands and result of
any strides (a transposed operand is just other strides), writing only C's M x N elements, with
``pack``, at least :data:`PACK_BYTES` bytes aligned to 64, as scratch.  Why it is fast anyway: the
order constrains only the sequence of additions *into one output*, not which outputs are worked on
together.  A register-blocked micro-kernel keeps an MR x NR tile of outputs in vector registers --
MR * NR / lanes independent accumulators, enough to keep the CPU's multiply-add pipes busy -- and
walks k, one step per output, in order: a row of NR values of B times one value of A broadcast.
B's rows come from a panel packed so that they are adjacent (GotoBLAS/BLIS style; a row-major B
that only a few tiles read is read in place), A's values from A itself where its rows or its k
are adjacent (each broadcast from where it is), else from a block of it packed per thread
where several panels read it (a tile's values for one k adjacent).  Threads take
blocks of rows: each output is still one thread's sum in k order.  A K longer than the k-block is split; each block
continues from the values stored in C, which hold the accumulator exactly because it has the
element type.  Rows and columns past the matrix's edge are padded (their results discarded);
k never is (adding 0 * 0 would turn an accumulator of -0.0 into +0.0).  From a rough cost of
each (padding, packing, scattering C), the routine picks a tile (wide, narrow or one row) and
the product or its transpose ``C^T = B^T A^T`` (the same products, ``a * b == b * a``, in the
same order).  A tiny product runs as the plain loop itself; a matrix-vector product whose outputs
lie side by side in the matrix streams it once instead of packing it (``vk_gemv``).
``vk_gemm_gathered_float`` / ``_double`` take a B that is no array of its own but a movement of
one buffer, element (k, j) at ``B[rk[k] + cj[j]]`` (a convolution's columns, read from the images):
packed from there, with the same sums in the same order.
"""

from __future__ import annotations

from string import Template

#: the register tiles: rows of A (MR) by vectors of B (NV; NR = NV * lanes) -- a wide one for
#: most products, a two-vector one where the wide one's 48 columns would pad much (a layer 256
#: wide: 64x256x784 went 95 -> 115 GFLOPS), a narrow one for results a few columns wide and a
#: single row for a vector-matrix product -- with AVX-512's 32 vector registers, and with the 16
#: of AVX2 and SSE
#: (MR * NV accumulators, NV values of B and a broadcast value of A must fit, or the
#: accumulators spill to memory)
VARIANTS = {"wide": {32: (8, 3), 16: (6, 2)}, "wide2": {32: (8, 2), 16: (6, 2)},
            "narrow": {32: (16, 1), 16: (12, 1)}, "row": {32: (1, 4), 16: (1, 4)}}
#: the k-block (values of k per packed block): the B micro-panel (KC x NR) streams from the L2
#: cache, every further k-block reloads and restores C's tiles.  Floats: 512 (on a Zen 4 core
#: +1-4 % over 256 on the training steps' products and the squares, 128 and 192 -2-4 %, 1024
#: mixed; a Sapphire Rapids core measured 256 best of 192, 256 and 1024); doubles: 256
KC = {"float": 512, "double": 256}
#: columns of B packed at once (a multiple of every variant's NR at every vector width): each
#: packed block of A is read by NC / NR micro-panels before the next is packed
NC = {"float": 768, "double": 768}
#: rows of A worked on against one packed B block before the next (a multiple of every MR)
MC = {"float": 96, "double": 48}
#: the plain mode's own tiles and blocks (a separate multiply and add need twice the cycles per
#: step, so a narrower tile and longer k-blocks keep its pipes as busy: 97-100 GFLOPS on the
#: squares where the fused mode's blocking gave it 83-89)
PLAIN = {"VARIANTS": {**{name: tiles for name, tiles in VARIANTS.items() if name != "wide2"},
                      "wide": VARIANTS["wide2"]},
         "KC": {"float": 1024, "double": 512}, "NC": {"float": 256, "double": 256}}


def _blocking(fused: bool):
    """``(VARIANTS, KC, NC)`` of a mode."""
    return (VARIANTS, KC, NC) if fused else (PLAIN["VARIANTS"], PLAIN["KC"], PLAIN["NC"])


SIZEOF = {"float": 4, "double": 8}

#: products of fewer multiply-adds than this run as the plain loop (the blocked routine's set-up
#: would cost more than the loop itself)
TINY = 512


def pack_bytes(threads: int = 1) -> int:
    """Bytes of scratch the caller passes as ``pack`` to a GEMM splitting its rows over
    ``threads`` (``vk_gemm_threads`` at most that): one packed B block and a packed A block
    per thread."""
    return max((kc[t] * nc[t] + threads * MC[t] * kc[t]) * SIZEOF[t] for t in SIZEOF
               for kc, nc in ((KC, NC), (PLAIN["KC"], PLAIN["NC"])))


#: bytes of scratch a one-thread GEMM takes as ``pack``
PACK_BYTES = pack_bytes(1)

#: the fewest multiply-adds of a product the GEMM splits over its threads (``VK_GEMM_SPLIT_WORK``)
SPLIT_WORK = 1 << 20

_COMMON = r"""
#if defined(__AVX512F__)
#define VK_GEMM_VBYTES 64
#elif defined(__AVX__)
#define VK_GEMM_VBYTES 32
#else
#define VK_GEMM_VBYTES 16
#endif
typedef float vk_gemm_vfloat __attribute__((vector_size(VK_GEMM_VBYTES), aligned(4), may_alias));
typedef double vk_gemm_vdouble __attribute__((vector_size(VK_GEMM_VBYTES), aligned(8), may_alias));
/* tests turn off reading in place an A whose rows are adjacent, and a row-major B */
#ifndef VK_GEMM_A_IN_PLACE
#define VK_GEMM_A_IN_PLACE 1
#endif
#ifndef VK_GEMM_ROWS_IN_PLACE
#define VK_GEMM_ROWS_IN_PLACE 1
#endif
/* __builtin_shufflevector: clang, and GCC from version 12 */
#if !defined(VK_GEMM_NO_SHUFFLE) && (defined(__clang__) || __GNUC__ >= 12)
#define VK_GEMM_SHUFFLE 1
#else
#define VK_GEMM_SHUFFLE 0
#endif
/* the fused mode's multiply-add, acc + a * b rounded once, on vectors (a: one value splat over
   the lanes; x - 0 is x for every x, -0.0 included, where 0 + x would turn -0.0 into +0.0) and
   on scalars: GCC's own builtins for AVX-512 and AVX2's FMA instructions (immintrin.h would
   add 0.4 s to every compile), else a lane at a time through C's fma, which is the same
   exactly rounded operation -- in hardware where the CPU has it, in libm's software where not */
#define VK_GEMM_SPLAT_float(a) ((a) - (vk_gemm_vfloat){0})
#define VK_GEMM_SPLAT_double(a) ((a) - (vk_gemm_vdouble){0})
#define VK_GEMM_FMA1_float(a, b, c) __builtin_fmaf(a, b, c)
#define VK_GEMM_FMA1_double(a, b, c) __builtin_fma(a, b, c)
#if !defined(VK_GEMM_SOFT_FMA) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__AVX512F__) && VK_GEMM_VBYTES == 64
#define VK_GEMM_FMA_float(a, b, c) \
    ((vk_gemm_vfloat)__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4))
#define VK_GEMM_FMA_double(a, b, c) \
    ((vk_gemm_vdouble)__builtin_ia32_vfmaddpd512_mask(a, b, c, (unsigned char)-1, 4))
#elif !defined(VK_GEMM_SOFT_FMA) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__FMA__) && VK_GEMM_VBYTES == 32
#define VK_GEMM_FMA_float(a, b, c) ((vk_gemm_vfloat)__builtin_ia32_vfmaddps256(a, b, c))
#define VK_GEMM_FMA_double(a, b, c) ((vk_gemm_vdouble)__builtin_ia32_vfmaddpd256(a, b, c))
#else
static inline vk_gemm_vfloat VK_GEMM_FMA_float(vk_gemm_vfloat a, vk_gemm_vfloat b, vk_gemm_vfloat c)
{
    for (int l = 0; l < VK_GEMM_VBYTES / 4; l++) c[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return c;
}
static inline vk_gemm_vdouble VK_GEMM_FMA_double(vk_gemm_vdouble a, vk_gemm_vdouble b,
                                                 vk_gemm_vdouble c)
{
    for (int l = 0; l < VK_GEMM_VBYTES / 8; l++) c[l] = __builtin_fma(a[l], b[l], c[l]);
    return c;
}
#endif
/* the threads a product's blocks of rows are split over, in a library built with OpenMP (the
   backend sets it from VKML_THREADS): each output is still computed by one thread, in order */
int vk_gemm_threads = 1;
/* the fewest multiply-adds of a product split over threads (waking them costs microseconds) */
#define VK_GEMM_SPLIT_WORK $SPLIT_WORK
/* a product called from threads already running side by side (a batch of them, each thread
   its own matrices and packing slot) is never split again: its one thread uses slot 0 */
/* whether a product of ``work`` multiply-adds is split over the threads */
#define VK_GEMM_SPLIT(work) (vk_gemm_threads > 1 && (work) >= VK_GEMM_SPLIT_WORK && !vk_gemm_nested())
/* whether rows ``apart`` bytes apart, ``rows`` of them, fall at most 4 to a set of the L1
   cache (64 sets of 64-byte lines, 8 or more ways): read side by side in place, more would
   evict each other (rows a multiple of 4 KB apart all share one set) */
static int vk_gemm_rows_spread(int64_t apart, int64_t rows)
{
    int in_set[64] = {0};
    for (int64_t i = 0; i < rows; i++)
        if (++in_set[(i * apart >> 6) & 63] > 4) return 0;
    return 1;
}
/* the way of least cost, the first of equals */
static int vk_gemm_cheapest(const double* cost, int ways)
{
    int way = 0;
    for (int w = 1; w < ways; w++)
        if (cost[w] < cost[way]) way = w;
    return way;
}
#ifdef _OPENMP
int omp_get_thread_num(void);
int omp_in_parallel(void);
#define vk_gemm_thread() omp_get_thread_num()
#define vk_gemm_nested() omp_in_parallel()
#else
#define vk_gemm_thread() 0
#define vk_gemm_nested() 0
#endif
"""

# what one element type shares between its variants
_TYPE = Template(r"""
#define VK_GEMM_L_$T (VK_GEMM_VBYTES / (int)sizeof($T))
/* the scratch: one packed B block, then a packed A block per thread */
#define VK_GEMM_BPACK_$T ((int64_t)$KC * $NC)
#define VK_GEMM_APACK_$T ((int64_t)$MC * $KC)

typedef $T vk_gemm_v8$T __attribute__((vector_size(8 * sizeof($T)), aligned(sizeof($T)),
                                      may_alias));

/* the fused step on 8 lanes (the matrix-vector product's): C's exactly rounded fma a lane at
   a time, which GCC makes one vector instruction where the CPU has them */
static inline vk_gemm_v8$T vk_gemm_fma8_$T(vk_gemm_v8$T a, vk_gemm_v8$T b, vk_gemm_v8$T c)
{
    for (int l = 0; l < 8; l++) c[l] = VK_GEMM_FMA1_$T(a[l], b[l], c[l]);
    return c;
}

#if VK_GEMM_SHUFFLE
/* dst[kk * ld + jj] = src[jj * ss + kk] for an 8 x 8 block (k contiguous in src): three rounds
   of interleaving the rows i and i + 4 transpose it in registers */
static void vk_gemm_transpose8_$T(const $T* src, int64_t ss, $T* dst, int64_t ld)
{
$TRANSPOSE8
}
#endif

/* B[k0.., j0..] (kc x n, n <= nr) -> dst[k * nr + j], columns n..nr-1 zero */
static void vk_gemm_pack_b_$T(int64_t kc, int64_t n, const $T* B, int64_t sbk, int64_t sbn,
                              $T* dst, int64_t nr)
{
    if (n < nr)                          /* padding columns: zeros (one call, not one per row) */
        __builtin_memset(dst, 0, (unsigned long)(kc * nr) * sizeof($T));
    if (sbn == 1 && n == nr) {                  /* rows of B: copies */
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < nr; j++) dst[k * nr + j] = B[k * sbk + j];
        return;
    }
    if (sbn <= sbk) {
        for (int64_t k = 0; k < kc; k++) {
            const $T* src = B + k * sbk;
            for (int64_t j = 0; j < n; j++) dst[k * nr + j] = src[j * sbn];
        }
        return;
    }
    int64_t j8 = 0, k8 = 0;
#if VK_GEMM_SHUFFLE
    if (sbk == 1) {                             /* columns of B contiguous: 8 x 8 transposes */
        j8 = n / 8 * 8, k8 = kc / 8 * 8;
        for (int64_t j = 0; j < j8; j += 8)
            for (int64_t k = 0; k < k8; k += 8)
                vk_gemm_transpose8_$T(B + j * sbn + k, sbn, dst + k * nr + j, nr);
    }
#endif
    for (int64_t j = 0; j < n; j++) {
        const $T* src = B + j * sbn;
        for (int64_t k = j < j8 ? k8 : 0; k < kc; k++) dst[k * nr + j] = src[k * sbk];
    }
}

#if VK_GEMM_SHUFFLE
/* dst[kk * ld + jj] = rows[jj][off + kk] for an 8 x 8 block: as vk_gemm_transpose8_$T, the
   rows anywhere */
static void vk_gemm_transpose8_rows_$T(const $T* const* rows, int64_t off, $T* dst, int64_t ld)
{
$TRANSPOSE8_ROWS
}

/* p[0], p[2], ..., p[14]: two loads, every other lane kept (the second load starts at p[7], so
   nothing past p[14] is read) -- a stride-2 convolution's pixels */
#define VK_GEMM_EVENS_$T(p) __builtin_shufflevector(*(const vk_gemm_v8$T*)(p), \
    *(const vk_gemm_v8$T*)((p) + 7), 0, 2, 4, 6, 9, 11, 13, 15)

/* dst[kk * ld + jj] = rows[jj][off + 2 * kk] for an 8 x 8 block: the rows' elements two apart */
static void vk_gemm_transpose8_rows2_$T(const $T* const* rows, int64_t off, $T* dst, int64_t ld)
{
$TRANSPOSE8_ROWS2
}
#endif

/* a gathered B (B[k, j] = B[rk[k] + cj[j]], see vk_gemm_gathered_$T) -> dst as above.  Columns
   in runs of adjacent elements (cj[j + 1] == cj[j] + 1: a convolution's pixels along an image
   row) are copied 8 at a time; else rows in runs of 8 (rk: a weight gradient's pixels, its
   columns the taps) are transposed 8 x 8; what is left, an element at a time */
static void vk_gemm_pack_b_gathered_$T(int64_t kc, int64_t n, const $T* B, const int64_t* rk,
                                       const int64_t* cj, $T* dst, int64_t nr)
{
    if (n < nr)
        __builtin_memset(dst, 0, (unsigned long)(kc * nr) * sizeof($T));
    /* runs of columns whose elements are one apart (or two: a stride-2 convolution's pixels,
       where copying 8 is two loads and a shuffle) */
    int64_t start[n], length[n], step[n], runs = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t d = j > 0 ? cj[j] - cj[j - 1] : 0;
        if (j > 0 && (length[runs - 1] == 1 ? d == 1 || (d == 2 && VK_GEMM_SHUFFLE)
                                            : d == step[runs - 1])) {
            step[runs - 1] = d;
            length[runs - 1]++;
        } else {
            start[runs] = j, length[runs] = 1, step[runs] = 1;
            runs++;
        }
    }
    int64_t k0 = 0;
#if VK_GEMM_SHUFFLE
    if (runs * 8 > n && n >= 8) {               /* short runs: transposes where k runs */
        const $T* rows[8];
        int64_t j8 = n / 8 * 8;
        for (; k0 + 8 <= kc; k0 += 8) {
            int64_t apart = rk[k0 + 1] - rk[k0];    /* (one, or two: a stride-2 weight gradient) */
            int even = apart == 1 || apart == 2;
            for (int t = 2; t < 8; t++) even &= rk[k0 + t] == rk[k0] + t * apart;
            if (!even) break;
            for (int64_t j = 0; j < j8; j += 8) {
                for (int t = 0; t < 8; t++) rows[t] = B + cj[j + t];
                if (apart == 1)
                    vk_gemm_transpose8_rows_$T(rows, rk[k0], dst + k0 * nr + j, nr);
                else
                    vk_gemm_transpose8_rows2_$T(rows, rk[k0], dst + k0 * nr + j, nr);
            }
            for (int64_t kk = k0; kk < k0 + 8; kk++)
                for (int64_t j = j8; j < n; j++) dst[kk * nr + j] = B[rk[kk] + cj[j]];
        }
    }
#endif
    /* a run at a time, down k: the loop over k is a load of rk and a copy or a few (the run's
       strip of the panel; its image rows stay in the L1 cache), where a row at a time reloaded
       every run's start, length and offset for each k (a LeNet's second convolution, 64 x 4096
       x 800 on one Zen 4 core, 4.76 -> 4.15 ms) */
    for (int64_t r = 0; r < runs; r++) {
        const $T* src = B + cj[start[r]];
        $T* to = dst + k0 * nr + start[r];
        int64_t len = length[r], len8 = len / 8 * 8;
#if VK_GEMM_SHUFFLE
        if (step[r] == 2) {
            for (int64_t k = k0; k < kc; k++, to += nr) {
                const $T* from = src + rk[k];
                int64_t t = 0;
                for (; t < len8; t += 8)
                    *(vk_gemm_v8$T*)(to + t) = VK_GEMM_EVENS_$T(from + 2 * t);
                for (; t < len; t++) to[t] = from[2 * t];
            }
            continue;
        }
#endif
        if (len == 8) {
            for (int64_t k = k0; k < kc; k++, to += nr)
                *(vk_gemm_v8$T*)to = *(const vk_gemm_v8$T*)(src + rk[k]);
            continue;
        }
        for (int64_t k = k0; k < kc; k++, to += nr) {
            const $T* from = src + rk[k];
            int64_t t = 0;
            for (; t < len8; t += 8)
                *(vk_gemm_v8$T*)(to + t) = *(const vk_gemm_v8$T*)(from + t);
            for (; t < len; t++) to[t] = from[t];
        }
    }
}

/* A[i0.., k0..] (mc x kc) -> one panel of kc x mr per tile of mr rows, dst[ir * kc + k * mr + i]
   (a tile's values for one k adjacent, the tiles one after another); a last tile of fewer rows
   has only its real rows (the kernel never reads past row m - 1) */
static void vk_gemm_pack_a_$T(int64_t mc, int64_t kc, const $T* A, int64_t sam, int64_t sak,
                              $T* dst, int64_t mr)
{
    for (int64_t ir = 0; ir < mc; ir += mr) {
        int64_t m = mc - ir < mr ? mc - ir : mr;
        const $T* src = A + ir * sam;
        $T* d = dst + ir * kc;
        int64_t k8 = 0;
#if VK_GEMM_SHUFFLE
        if (sak == 1 && m == mr && mr % 8 == 0) {   /* rows of A contiguous: 8 x 8 transposes */
            k8 = kc / 8 * 8;
            for (int64_t i = 0; i < mr; i += 8)
                for (int64_t k = 0; k < k8; k += 8)
                    vk_gemm_transpose8_$T(src + i * sam + k, sam, d + k * mr + i, mr);
        }
#endif
        for (int64_t k = k8; k < kc; k++)
            for (int64_t i = 0; i < m; i++) d[k * mr + i] = src[i * sam + k * sak];
    }
}

/* rough cycles of one orientation and tile: the padded tiles' arithmetic, packing B (a
   transposing copy costs more than a row copy), and C's tiles through a private tile where C's
   rows are not contiguous (once per k-block) */
static double vk_gemm_cost_$T(int64_t M, int64_t N, int64_t K, int64_t sbk, int64_t sbn,
                              int64_t scn, int64_t mr, int64_t nr, double slower)
{
    double tiles = (double)((M + mr - 1) / mr * mr) * (double)((N + nr - 1) / nr * nr);
    double work = tiles * (double)K * (2.0 / (2 * 2 * VK_GEMM_L_$T)) * slower;
    double pack = (double)K * (double)N *
        (sbn == 1 ? (VK_GEMM_ROWS_IN_PLACE && M <= 4 * mr ? 0.0 : 0.1)
                  : (sbk == 1 && VK_GEMM_SHUFFLE ? 0.3 : 1.5));
    if (N % nr)                                 /* the edge panel: zeroed, then filled */
        pack += (double)K * (double)nr * 0.25;
    double blocks = (double)((K + $KC - 1) / $KC);
    double scatter = scn == 1 ? 0.0 : (double)M * (double)N * 2.0 * blocks;
    return work + pack + scatter;
}
""")

# one register tile of one element type: its micro-kernel, its edge tiles and its loops
_VARIANT = Template(r"""
#define VK_GEMM_NR_$S ($NV * VK_GEMM_L_$T)

$KERNEL

/* one MR x NR tile of C at c (m x n of it real), general strides: through a private tile */
static void vk_gemm_tile_$S(int64_t kc, const $T* a, int64_t sam, int64_t sak, const $T* bp,
                            int64_t ldb, $T* c, int64_t scm, int64_t scn, int64_t m, int64_t n,
                            int first)
{
    const int64_t nr = VK_GEMM_NR_$S;
    if (scn == 1 && m == $MR && n == nr) {
        vk_gemm_kernel_$S(kc, a, sam, sak, m, bp, ldb, c, scm, first);
        return;
    }
    $T tile[$MR * VK_GEMM_NR_$S] __attribute__((aligned(64)));
    if (m == $MR && n == nr && scm == 1) {      /* a full tile of a column-major C */
        if (!first)
            for (int64_t j = 0; j < VK_GEMM_NR_$S; j++)
                for (int64_t i = 0; i < $MR; i++) tile[i * nr + j] = c[i + j * scn];
        vk_gemm_kernel_$S(kc, a, sam, sak, m, bp, ldb, tile, nr, first);
        for (int64_t j = 0; j < VK_GEMM_NR_$S; j++)
            for (int64_t i = 0; i < $MR; i++) c[i + j * scn] = tile[i * nr + j];
        return;
    }
    if (!first)
        for (int64_t i = 0; i < $MR; i++)
            for (int64_t j = 0; j < nr; j++)
                tile[i * nr + j] = (i < m && j < n) ? c[i * scm + j * scn] : 0;
    vk_gemm_kernel_$S(kc, a, sam, sak, m, bp, ldb, tile, nr, first);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            c[i * scm + j * scn] = tile[i * nr + j];
}

static double vk_gemm_${S}_cost(int64_t M, int64_t N, int64_t K, int64_t sbk, int64_t sbn,
                              int64_t scn)
{
    return vk_gemm_cost_$T(M, N, K, sbk, sbn, scn, $MR, VK_GEMM_NR_$S, $SLOWER);
}

/* the product with this tile, M, N, K > 0; B at strides sbk, sbn, or gathered where rk is
   not 0 (B[k, j] = B[rk[k] + cj[j]]) */
static void vk_gemm_$S(int64_t M, int64_t N, int64_t K,
                       const $T* A, int64_t sam, int64_t sak,
                       const $T* B, int64_t sbk, int64_t sbn, const int64_t* rk, const int64_t* cj,
                       $T* C, int64_t scm, int64_t scn, $T* bpack)
{
    const int64_t mr = $MR, nr = VK_GEMM_NR_$S;
    /* a full panel of a row-major B read by a few tiles only: the kernel reads B's rows where
       they are (for many tiles a packed copy pays: rows far apart thrash the L1 cache) */
    const int rows_in_place = VK_GEMM_ROWS_IN_PLACE && !rk && sbn == 1 && M <= 4 * mr;
#define VK_GEMM_IN_PLACE(jr) (rows_in_place && nc - (jr) >= nr)
    int64_t kblocks = (K + $KC - 1) / $KC;
    int64_t kstep = (K + kblocks - 1) / kblocks;
    /* over threads: as many blocks of rows as makes each thread's share equal (rounded to
       tiles, at most MC), for a product worth waking them for */
    int64_t mcb = $MC;
    const int split = M > mr && VK_GEMM_SPLIT((double)M * N * K);
    if (split) {
        int64_t blocks = (M + $MC - 1) / $MC;
        blocks = (blocks + vk_gemm_threads - 1) / vk_gemm_threads * vk_gemm_threads;
        mcb = ((M + blocks - 1) / blocks + mr - 1) / mr * mr;
    }
    /* an A whose rows are adjacent (a transposed row-major matrix: a layer's weight in
       its forward product) already holds a tile's values for one k side by side: read in
       place (a conv's 64x64x800 per image 71 -> 110 GFLOPS, 1024^3 93 -> 104 on Zen 4);
       so is a row-major A whose rows do not crowd into a few of the L1 cache's sets (each
       of a tile's rows a stream along k: packing it cost a pass over A that the kernel's
       broadcasts do not need -- a 784-256 layer's forward at batch 1024 100 -> 103 GFLOPS
       from memory, 1024 x 128 x 512 104 -> 112 from the caches, on Zen 4; rows 16 KB
       apart, a conv's weight gradient, ran at half speed in place) */
    const int a_in_place = VK_GEMM_A_IN_PLACE && (sam == 1 ||
        (sak == 1 && vk_gemm_rows_spread(sam * (int64_t)sizeof($T), mr)));
    /* one team of threads for the whole product (every thread walks the same blocks; a
       long K of many blocks would otherwise start and join the team once a block: a conv's
       weight gradient, K = 36864, 144 times for 16 x 25 outputs a thread) */
#pragma omp parallel num_threads(vk_gemm_threads) if (split)
    for (int64_t jc = 0; jc < N; jc += $NC) {
        int64_t nc = N - jc < $NC ? N - jc : $NC;
        /* A packed where several panels read it, unless it is read in place (above) */
        const int pack_a = mr > 1 && nc > nr && !a_in_place;
        for (int64_t pc = 0; pc < K; pc += kstep) {
            int64_t kc = K - pc < kstep ? K - pc : kstep;
            /* B's panels packed between the threads, then (after the loop's barrier) their
               shares of the rows (whose closing barrier keeps B's panels until all are done) */
#pragma omp for schedule(static)
            for (int64_t jr = 0; jr < nc; jr += nr)
                if (rk)
                    vk_gemm_pack_b_gathered_$T(kc, nc - jr < nr ? nc - jr : nr, B, rk + pc,
                                               cj + jc + jr, bpack + jr * kc, nr);
                else if (!VK_GEMM_IN_PLACE(jr))
                    vk_gemm_pack_b_$T(kc, nc - jr < nr ? nc - jr : nr,
                                      B + pc * sbk + (jc + jr) * sbn, sbk, sbn, bpack + jr * kc,
                                      nr);
#pragma omp for schedule(static)
            for (int64_t ic = 0; ic < M; ic += mcb) {
                int64_t mc = M - ic < mcb ? M - ic : mcb;
                /* A's block packed (each thread its own slot) where several panels read it: its
                   rows, far apart, would share the L1 cache's sets and the TLB's pages */
                const $T* ab = A + ic * sam + pc * sak;
                int64_t asm_ = sam, ask = sak;
                if (pack_a) {
                    $T* ap = bpack + VK_GEMM_BPACK_$T + (int64_t)vk_gemm_thread() * VK_GEMM_APACK_$T;
                    vk_gemm_pack_a_$T(mc, kc, ab, sam, sak, ap, mr);
                    ab = ap, asm_ = 1, ask = mr;
                }
                for (int64_t jr = 0; jr < nc; jr += nr) {
                    int in_place = VK_GEMM_IN_PLACE(jr);
                    const $T* bp = in_place ? B + pc * sbk + jc + jr : bpack + jr * kc;
                    for (int64_t ir = 0; ir < mc; ir += mr)
                        vk_gemm_tile_$S(kc, pack_a ? ab + ir * kc : ab + ir * sam, asm_, ask,
                                        bp, in_place ? sbk : nr,
                                        C + (ic + ir) * scm + (jc + jr) * scn, scm, scn,
                                        mc - ir < mr ? mc - ir : mr, nc - jr < nr ? nc - jr : nr,
                                        pc == 0);
                }
            }
        }
    }
}
""")

# the entry point of one element type: the plain loop for a tiny product, else the cheapest way
_ENTRY = Template(r"""
/* the naive loop itself */
static void vk_gemm_plain_$T(int64_t M, int64_t N, int64_t K,
                             const $T* A, int64_t sam, int64_t sak,
                             const $T* B, int64_t sbk, int64_t sbn,
                             $T* C, int64_t scm, int64_t scn)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            $T acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc = $MULADD;
            C[i * scm + j * scn] = acc;
        }
}

/* y = A @ x for a matrix-vector product whose outputs are adjacent in A (A[i, k] at
   A[i + k * sak]: a vector-matrix product w @ X of a row-major X, or X.T @ w), y[i] = the sum
   over k in order of A[i, k] * x[k], each step as the mode rounds it.  The blocked kernels
   would pad the one row or column to a register tile and pack all of A, which is read only
   once; here blocks of up to 1024 outputs are kept in a local array (the L1 cache) and four of
   A's rows at a time streamed through them, each output one chain in k order (a big product's
   blocks shared out between the threads: each output still one thread's chain) */
static void vk_gemv_$T(int64_t M, int64_t K, const $T* A, int64_t sak, const $T* x, int64_t sx,
                       $T* y, int64_t sy)
{
    enum { OUTPUTS = 1024 };
    /* over threads (each block of outputs one thread's): blocks of an equal share each */
    const int split = VK_GEMM_SPLIT((double)M * K);
    int64_t block = OUTPUTS;
    if (split) {
        int64_t share = (M + vk_gemm_threads - 1) / vk_gemm_threads;
        share = (share + 63) / 64 * 64;
        block = share < OUTPUTS ? share : OUTPUTS;
    }
#pragma omp parallel for num_threads(vk_gemm_threads) schedule(static) if (split)
    for (int64_t i0 = 0; i0 < M; i0 += block) {
        $T acc[OUTPUTS];
        int64_t m = M - i0 < block ? M - i0 : block;
        for (int64_t i = 0; i < m; i++) acc[i] = 0;
        int64_t k = 0;
        for (; k + 4 <= K; k += 4) {
            const $T* r0 = A + i0 + k * sak;
            const $T *r1 = r0 + sak, *r2 = r1 + sak, *r3 = r2 + sak;
            const $T x0 = x[k * sx], x1 = x[(k + 1) * sx], x2 = x[(k + 2) * sx], x3 = x[(k + 3) * sx];
            for (int64_t i = 0; i < m; i++) acc[i] = $STEP4;
        }
        for (; k < K; k++) {
            const $T* r0 = A + i0 + k * sak;
            const $T x0 = x[k * sx];
            for (int64_t i = 0; i < m; i++) acc[i] = $STEP1;
        }
        for (int64_t i = 0; i < m; i++) y[(i0 + i) * sy] = acc[i];
    }
}

#if VK_GEMM_SHUFFLE
$GEMV_ROWS
#endif

static void vk_gemm_$T(int64_t M, int64_t N, int64_t K,
                       const $T* A, int64_t sam, int64_t sak,
                       const $T* B, int64_t sbk, int64_t sbn,
                       $T* C, int64_t scm, int64_t scn, $T* pack)
{
    if (M <= 0 || N <= 0) return;
    /* the plain loop: about a cycle a multiply-add (its sums wait on each other) */
    double plain = (double)M * (double)N * (double)K;
#ifndef VK_GEMM_WAY
    if (plain < $TINY) {
        vk_gemm_plain_$T(M, N, K, A, sam, sak, B, sbk, sbn, C, scm, scn);
        return;
    }
#endif
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * scm + j * scn] = 0;
        return;
    }
#ifndef VK_GEMM_WAY
    /* a matrix-vector product whose outputs are adjacent in the matrix, either way round
       (b * a is a * b exactly) */
    if (N == 1 && sam == 1) {
        vk_gemv_$T(M, K, A, sak, B, sbk, C, scm);
        return;
    }
#if VK_GEMM_SHUFFLE
    if (N == 1 && sak == 1 && K >= 8) {
        vk_gemv_rows_$T(M, K, A, sam, B, sbk, C, scm);
        return;
    }
#endif
    if (M == 1 && sbn == 1) {
        vk_gemv_$T(N, K, B, sbk, A, sak, C, scn);
        return;
    }
#if VK_GEMM_SHUFFLE
    if (M == 1 && sbk == 1 && K >= 8) {     /* x @ W.T: a layer's forward at batch 1 */
        vk_gemv_rows_$T(N, K, B, sbn, A, sak, C, scn);
        return;
    }
#endif
#endif
    /* the ways: each tile, on the product or on its transpose C^T = B^T A^T */
    double cost[$WAYS] = {$COSTS};
    int way = vk_gemm_cheapest(cost, $WAYS);
#ifdef VK_GEMM_WAY
    way = VK_GEMM_WAY;                          /* tests: every way on every input */
#else
    if (plain <= cost[way]) {                   /* a few long dot products */
        vk_gemm_plain_$T(M, N, K, A, sam, sak, B, sbk, sbn, C, scm, scn);
        return;
    }
#endif
    switch (way) {
$CALLS
    }
}
""")

# the entry point of a product whose B is gathered: never transposed (A's reads have strides only)
_GATHERED = Template(r"""
/* C = A @ B where B[k, j] = B[rk[k] + cj[j]]: a movement of one buffer whose element offset is
   a sum of a part from k and a part from j (a convolution's columns, read from the images
   where they are: rk per (channel, tap), cj per output pixel), packed from there instead of
   from a copy.  The same sums in the same order as vk_gemm_$T */
static void vk_gemm_gathered_$T(int64_t M, int64_t N, int64_t K,
                                const $T* A, int64_t sam, int64_t sak,
                                const $T* B, const int64_t* rk, const int64_t* cj,
                                $T* C, int64_t scm, int64_t scn, $T* pack)
{
    if (M <= 0 || N <= 0) return;
    double plain = (double)M * (double)N * (double)K;
    double cost[$WAYS] = {$COSTS};
    int way = vk_gemm_cheapest(cost, $WAYS);
#ifdef VK_GEMM_WAY
    way = VK_GEMM_WAY / 2;
    if (K <= 0) {
#else
    if (K <= 0 || plain <= cost[way]) {
#endif
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                $T acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc = $MULADD;
                C[i * scm + j * scn] = acc;
            }
        return;
    }
    switch (way) {
$CALLS
    }
}
""")


def _entry(t: str, fused: bool) -> str:
    """``vk_gemm_<t>`` (every variant on the product, way 2 v, and on its transpose, 2 v + 1;
    the matrix-vector path ``vk_gemv_<t>``) and ``vk_gemm_gathered_<t>`` (the variants on the
    product only: its B is gathered)."""
    def step(x, y, acc, fma=f"VK_GEMM_FMA1_{t}"):
        """``acc`` plus ``x * y`` as the mode rounds it (one fused step, or two roundings)."""
        return f"{fma}({x}, {y}, {acc})" if fused else f"({acc} + {x} * {y})"

    a = "A[i * sam + k * sak]"
    costs, calls, gathered_costs, gathered_calls = [], [], [], []
    for n, variant in enumerate(_blocking(fused)[0]):
        f = f"vk_gemm_{t}_{variant}"
        costs += [f"{f}_cost(M, N, K, sbk, sbn, scn)", f"{f}_cost(N, M, K, sak, sam, scm)"]
        calls += [f"    case {2 * n}: {f}(M, N, K, A, sam, sak, B, sbk, sbn, 0, 0, C, scm, scn, pack); "
                  "break;",
                  f"    case {2 * n + 1}: {f}(N, M, K, B, sbn, sbk, A, sak, sam, 0, 0, C, scn, scm, "
                  "pack); break;"]
        # a gathered B is packed as a row-major one is
        gathered_costs.append(f"{f}_cost(M, N, K, N, 1, scn)")
        gathered_calls.append(f"    case {n}: {f}(M, N, K, A, sam, sak, B, 0, 0, rk, cj, C, scm, "
                              "scn, pack); break;")
    four = "acc[i]"
    for n in range(4):
        four = step(f"r{n}[i]", f"x{n}", four)
    entry = _ENTRY.safe_substitute(T=t, TINY=TINY, MULADD=step(a, "B[k * sbk + j * sbn]", "acc"),
                                   WAYS=len(costs), COSTS=",\n        ".join(costs),
                                   CALLS="\n".join(calls))
    entry = entry.replace("$STEP4", four).replace("$STEP1", step("r0[i]", "x0", "acc[i]"))
    entry = entry.replace("$GEMV_ROWS", _gemv_rows(t, step))
    return entry + _GATHERED.substitute(T=t, MULADD=step(a, "B[rk[k] + cj[j]]", "acc"),
                                        WAYS=len(gathered_costs),
                                        COSTS=",\n        ".join(gathered_costs),
                                        CALLS="\n".join(gathered_calls))


#: how much slower per product a variant's kernel runs than the wide one (measured on Zen 5; the
#: row's 4 accumulators wait on the adder's latency)
_SLOWER = {"wide": 1.0, "wide2": 1.05, "narrow": 1.06, "row": 1.5}


def _kernel(t: str, variant: str, mr: int, nv: int, fused: bool) -> str:
    """The micro-kernel's C text: an MR x NR tile held in MR * NV named vector registers, each
    output one accumulator that gets, per k, one rounded product added (never fused).  A is read
    in place (``a`` at A[i0, k0], rows ``sam`` apart, k ``sak`` apart): its values are broadcast
    one at a time, so its layout costs little and it needs no packing; rows past the ``m`` real
    ones read the last real row again (their results are discarded)."""
    s = f"{t}_{variant}"
    v = f"vk_gemm_v{t}"
    lanes = f"VK_GEMM_L_{t}"
    accs = [[f"c{i}_{j}" for j in range(nv)] for i in range(mr)]
    flat = [a for row in accs for a in row]
    lines = [f"static void vk_gemm_kernel_{s}(int64_t kc, const {t}* a, int64_t sam, int64_t sak, "
             f"int64_t m, const {t}* restrict bp, int64_t ldb, {t}* c, int64_t ldc, int first)",
             "{"]
    lines += [f"    const int64_t o{i} = ({i} < m ? {i} : m - 1) * sam;" for i in range(mr)]
    if mr > 1:   # the next tile's C rows (usually the next call's), while this one computes
        lines += ["    " + " ".join(f"__builtin_prefetch(c + {mr + i} * ldc + {j} * {lanes}, 1);"
                                     for i in range(mr) for j in range(nv))]
    lines += [f"    {v} {', '.join(flat)};",
              "    if (first) {",
              f"        {v} zero = {{0}};",
              "        " + " ".join(f"{a} = zero;" for a in flat),
              "    } else {"]
    for i in range(mr):
        lines.append("        " + " ".join(
            f"{accs[i][j]} = *(const {v}*)(c + {i} * ldc + {j} * {lanes});" for j in range(nv)))
    lines += ["    }",
              "    _Pragma(\"GCC unroll 4\")",
              "    for (int64_t k = 0; k < kc; k++) {",
              "        " + " ".join(f"{v} b{j} = *(const {v}*)(bp + {j} * {lanes});"
                                    for j in range(nv))]
    for i in range(mr):
        if fused:
            lines.append(f"        {{ {v} ai = VK_GEMM_SPLAT_{t}(a[o{i}]); " + " ".join(
                f"{accs[i][j]} = VK_GEMM_FMA_{t}(ai, b{j}, {accs[i][j]});" for j in range(nv))
                + " }")
        else:
            lines.append(f"        {{ {t} ai = a[o{i}]; " + " ".join(
                f"{accs[i][j]} = {accs[i][j]} + ai * b{j};" for j in range(nv)) + " }")
    lines += ["        a += sak; bp += ldb;",
              "    }"]
    for i in range(mr):
        lines.append("    " + " ".join(
            f"*({v}*)(c + {i} * ldc + {j} * {lanes}) = {accs[i][j]};" for j in range(nv)))
    lines.append("}")
    return "\n".join(lines)


#: groups of 8 rows a matrix-vector product along rows takes side by side (one chain of 8
#: outputs per group): many where the matrix comes from the caches (8 chains in flight hide the
#: multiply-add's latency: 512^2 and 1024^2 14 -> 17 GFLOPS, 10 x 256 2 -> 6 on a Zen 4 core),
#: few where it streams from memory (64 rows side by side are more streams than the hardware's
#: prefetchers follow: 4096^2 went 7.5 -> 4.6)
GEMV_GROUPS = (8, 2)
#: bytes of matrix up to which it is taken to come from the caches
GEMV_CACHED = 4 << 20


def _gemv_rows(t: str, step) -> str:
    """``vk_gemv_rows_<t>``: y = A @ x for a row-major A, each output the chain of its row's
    products in k order (``step(a, b, acc)``: one step as the mode rounds it)."""
    v8 = f"vk_gemm_v8{t}"

    def block(groups, kb):
        """The function for ``8 * groups`` rows at A: per ``kb`` values of k, the rows' block
        transposed 8 x 8 into a local array (each group's rows read kb values at a time, so
        rows a page apart do not evict each other from the L1 cache), then per k one step of
        every group's chain, the groups independent of each other."""
        rows = 8 * groups

        def chain_step(g):
            return step(f"*(const {v8}*)(a + {8 * g})", "xk", f"c{g}", fma=f"vk_gemm_fma8_{t}")
        lines = [f"static inline void vk_gemv_rows{groups}_{t}(int64_t K, const {t}* A, "
                 f"int64_t sam, const {t}* x, int64_t sx, {t}* y, int64_t sy)", "{",
                 f"    enum {{ KB = {kb} }};",
                 f"    {t} cols[KB * {rows}] __attribute__((aligned(64)));",
                 "    " + " ".join(f"{v8} c{g} = {{0}};" for g in range(groups)),
                 "    const int64_t k8 = K / 8 * 8;",
                 "    for (int64_t k0 = 0; k0 < k8; k0 += KB) {",
                 "        int64_t kb = k8 - k0 < KB ? k8 - k0 : KB;",
                 f"        for (int64_t r = 0; r < {rows}; r += 8)",
                 "            for (int64_t kk = 0; kk < kb; kk += 8)",
                 f"                vk_gemm_transpose8_{t}(A + r * sam + k0 + kk, sam, "
                 f"cols + kk * {rows} + r, {rows});",
                 "        for (int64_t kk = 0; kk < kb; kk++) {",
                 f"            const {t}* a = cols + kk * {rows};",
                 f"            {v8} xk = x[(k0 + kk) * sx] - ({v8}){{0}};",
                 "            " + " ".join(f"c{g} = {chain_step(g)};" for g in range(groups)),
                 "        }", "    }"]
        lines += [f"    {t} out[{rows}];"]
        lines += [f"    *({v8}*)(out + {8 * g}) = c{g};" for g in range(groups)]
        lines += [f"    for (int64_t r = 0; r < {rows}; r++) {{",
                  f"        {t} acc = out[r];",
                  f"        const {t}* row = A + r * sam;",
                  "        for (int64_t k = k8; k < K; k++) acc = "
                  f"{step('row[k]', 'x[k * sx]', 'acc')};",
                  "        y[r * sy] = acc;", "    }", "}"]
        return "\n".join(lines)

    many, few = GEMV_GROUPS
    return f"""{block(many, 64)}

{block(few, 128)}

{block(1, 128)}

/* y = A @ x for a row-major A (A[i, k] at A[i * sam + k]), y[i] = the sum over k in order of
   A[i, k] * x[k]: each output is a chain along its row, so rows are taken side by side,
   {8 * many} at a time where the matrix is at most {GEMV_CACHED >> 20} MB (from the caches),
   else {8 * few} (more rows read side by side than the memory's prefetchers follow slow a
   bigger one down), the rest 8 at a time, the last few one chain each (a big product's blocks
   shared out between the threads: each output still one thread's chain) */
static void vk_gemv_rows_{t}(int64_t M, int64_t K, const {t}* A, int64_t sam, const {t}* x,
                            int64_t sx, {t}* y, int64_t sy)
{{
    const int cached = (double)M * (double)sam * sizeof({t}) <= {GEMV_CACHED}.0;
    const int64_t R = cached ? {8 * many} : {8 * few};
    const int64_t whole = M / R * R, eights = M / 8 * 8;
    const int split = VK_GEMM_SPLIT((double)M * K);
#pragma omp parallel for num_threads(vk_gemm_threads) schedule(static) if (split)
    for (int64_t i0 = 0; i0 < whole; i0 += R) {{
        if (cached)
            vk_gemv_rows{many}_{t}(K, A + i0 * sam, sam, x, sx, y + i0 * sy, sy);
        else
            vk_gemv_rows{few}_{t}(K, A + i0 * sam, sam, x, sx, y + i0 * sy, sy);
    }}
    for (int64_t i0 = whole; i0 < eights; i0 += 8)
        vk_gemv_rows1_{t}(K, A + i0 * sam, sam, x, sx, y + i0 * sy, sy);
    for (int64_t i0 = eights; i0 < M; i0++) {{
        {t} acc = 0;
        const {t}* row = A + i0 * sam;
        for (int64_t k = 0; k < K; k++) acc = {step('row[k]', 'x[k * sx]', 'acc')};
        y[i0 * sy] = acc;
    }}
}}"""


def _transpose8(t: str, row="src + {i} * ss", load="*(const vk_gemm_v8{t}*)") -> str:
    """The body of the 8 x 8 transpose, written out (named registers, no arrays: an array of
    vectors would live in memory at -O2); ``row``: where its row ``i`` starts; ``load``: what
    reads a row's 8 values from there."""
    v8 = f"vk_gemm_v8{t}"
    lines = ["    " + " ".join(f"{v8} r0_{i} = {load.format(t=t)}({row.format(i=i)});"
                             for i in range(8))]
    for rnd in range(3):
        for i in range(4):
            a, b = f"r{rnd}_{i}", f"r{rnd}_{i + 4}"
            lines.append(f"    {v8} r{rnd + 1}_{2 * i} = __builtin_shufflevector({a}, {b}, "
                         "0, 8, 1, 9, 2, 10, 3, 11);")
            lines.append(f"    {v8} r{rnd + 1}_{2 * i + 1} = __builtin_shufflevector({a}, {b}, "
                         "4, 12, 5, 13, 6, 14, 7, 15);")
    lines.append("    " + " ".join(f"*({v8}*)(dst + {i} * ld) = r3_{i};" for i in range(8)))
    return "\n".join(lines)


def _source(t: str, fused: bool) -> str:
    """``vk_gemm_<t>`` and everything it calls."""
    variants, kc, nc = _blocking(fused)
    parts = [_TYPE.substitute(T=t, KC=kc[t], NC=nc[t], MC=MC[t], TRANSPOSE8=_transpose8(t),
                             TRANSPOSE8_ROWS=_transpose8(t, "rows[{i}] + off"),
                             TRANSPOSE8_ROWS2=_transpose8(t, "rows[{i}] + off", "VK_GEMM_EVENS_{t}"))]
    for variant, tiles in variants.items():
        for registers, (mr, nv) in tiles.items():
            parts.append("\n#if VK_GEMM_VBYTES == 64\n" if registers == 32 else "\n#else\n")
            parts.append(_VARIANT.substitute(T=t, S=f"{t}_{variant}", MR=mr, NV=nv, KC=kc[t],
                                             NC=nc[t], MC=MC[t], SLOWER=_SLOWER[variant],
                                             KERNEL=_kernel(t, variant, mr, nv, fused)))
        parts.append("#endif\n")
    parts.append(_entry(t, fused))
    return "".join(parts)


def gemm_c(types=("float", "double"), fused=False) -> str:
    """The C text of ``vk_gemm_<type>`` for each of ``types`` (once per program, after the
    prelude's types): a program that multiplies only floats compiles in half the time without the
    double version (about 0.2 s instead of 0.45 s with GCC at -O2).  ``fused``: each step of an
    output's sum is one fused multiply-add (the fused mode), else a rounded product then a
    rounded sum (the plain loops' bits)."""
    return _COMMON.replace("$SPLIT_WORK", str(SPLIT_WORK)) + "".join(_source(t, fused) for t in types)


#: the parameters of ``vk_gemm_<T>``: C = A @ B of M x K and K x N, each operand and the result
#: at any element strides, ``pack`` the scratch (``pack_bytes``)
_PARAMS = ("int64_t M, int64_t N, int64_t K, const {T}* A, int64_t sam, int64_t sak, "
           "const {T}* B, int64_t sbk, int64_t sbn, {T}* C, int64_t scm, int64_t scn, {T}* pack")
_ARGS = "M, N, K, A, sam, sak, B, sbk, sbn, C, scm, scn, pack"
#: those of ``vk_gemm_gathered_<T>``: B[k, j] at ``B[rk[k] + cj[j]]``
_GATHERED_PARAMS = ("int64_t M, int64_t N, int64_t K, const {T}* A, int64_t sam, int64_t sak, "
                    "const {T}* B, const int64_t* rk, const int64_t* cj, {T}* C, int64_t scm, "
                    "int64_t scn, {T}* pack")
_GATHERED_ARGS = "M, N, K, A, sam, sak, B, rk, cj, C, scm, scn, pack"


def library_source(types=("float", "double"), fused=False) -> str:
    """The C of the GEMM as a library of its own (after the program's prelude): ``vk_gemm_<T>``
    exported as ``vk_gemm_lib_<T>`` for each of ``types``, and ``vk_gemm_threads``.  Programs
    call it through a pointer (``pointer_declarations``) instead of compiling its 90 KB of C
    each: it is built once per mode and thread setting and kept in the disk cache."""
    exports = "".join(f"\nvoid vk_gemm_lib_{t}({_PARAMS.format(T=t)}) {{ vk_gemm_{t}({_ARGS}); }}\n"
                      f"void vk_gemm_lib_gathered_{t}({_GATHERED_PARAMS.format(T=t)}) "
                      f"{{ vk_gemm_gathered_{t}({_GATHERED_ARGS}); }}\n" for t in types)
    return gemm_c(types, fused) + exports


def pointer_declarations(types, extern=False) -> str:
    """What a program calling the GEMM library declares: ``vk_gemm_<T>`` as a pointer the
    backend sets to the library's function when it loads the program (a call reads the same).
    ``extern``: the declaration a second compilation unit of the program reads it through."""
    head = "extern " if extern else ""
    tail = "" if extern else " = 0"
    return "".join(f"{head}void (*vk_gemm_{t})({_PARAMS.format(T=t)}){tail};\n"
                   f"{head}void (*vk_gemm_gathered_{t})({_GATHERED_PARAMS.format(T=t)}){tail};\n"
                   for t in types)


#: the C text of ``vk_gemm_float`` and ``vk_gemm_double`` (after the program's prelude types),
#: separate multiply and add: the plain loops' bits
GEMM_C = gemm_c()
#: the same with fused multiply-adds (twice the arithmetic per cycle where the CPU has FMA)
FUSED_GEMM_C = gemm_c(fused=True)
