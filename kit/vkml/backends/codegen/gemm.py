"""A matrix product for generated C with exactly the naive loop's bits, blocked for speed.

Contract: ``vk_gemm_float`` / ``vk_gemm_double`` (in :data:`GEMM_C`) compute, for every output,
``acc = 0; for k in 0..K-1: acc = acc + A[i,k] * B[k,j]`` -- each product rounded to the element
type, then each sum rounded, k in index order, no fused multiply-add -- for operands and result of
any strides (a transposed operand is just other strides), writing only C's M x N elements, with
``pack``, at least :data:`PACK_BYTES` bytes aligned to 64, as scratch.  Why it is fast anyway: the
order constrains only the sequence of additions *into one output*, not which outputs are worked on
together.  So the routine copies blocks of B and A into panels laid out in the order a register-blocked
micro-kernel reads them (GotoBLAS/BLIS style: a KC x NC block of B in NR-wide column panels, an
MC x KC block of A in MR-tall row panels), and the micro-kernel keeps an MR x NR tile of outputs in
vector registers -- MR * NR / lanes independent accumulators, enough to keep the CPU's separate
multiply and add pipes busy -- while it walks k, one product and one add per output per step, in
order.  A K longer than KC is split into blocks; each block continues from the values stored in C,
which hold the accumulator exactly because it has the element type.  Rows and columns of a panel
past the matrix's edge are padded with zeros and their results discarded; k is never padded (adding
0 * 0 would turn an accumulator of -0.0 into +0.0).  When the product's outputs would leave much of
a tile as padding (a result 10 wide), the routine computes the transposed product instead: the same
products (a * b == b * a) summed in the same order.
"""

from __future__ import annotations

from string import Template

#: rows of A per register tile (float, double)
MR = {"float": 8, "double": 8}
#: vectors of B per register tile row (NR = NV * lanes)
NV = {"float": 2, "double": 2}
#: the k-block: a B micro-panel of KC x NR stays in the L1 cache while the tile rows stream past
KC = {"float": 256, "double": 256}
#: rows of A worked on against one packed B block before the next (a multiple of MR): they stay
#: in the L2 cache while every B micro-panel passes
MC = {"float": 128, "double": 64}
#: columns of B packed at once (a multiple of NR at every vector width)
NC = {"float": 512, "double": 256}

SIZEOF = {"float": 4, "double": 8}

#: bytes of scratch the caller passes as ``pack``: one packed B block
PACK_BYTES = max(KC[t] * NC[t] * SIZEOF[t] for t in SIZEOF)

_VECTOR_TYPES = r"""
#if defined(__AVX512F__)
#define VK_GEMM_VBYTES 64
#elif defined(__AVX__)
#define VK_GEMM_VBYTES 32
#else
#define VK_GEMM_VBYTES 16
#endif
typedef float vk_gemm_vfloat __attribute__((vector_size(VK_GEMM_VBYTES), aligned(4), may_alias));
typedef double vk_gemm_vdouble __attribute__((vector_size(VK_GEMM_VBYTES), aligned(8), may_alias));
/* __builtin_shufflevector: clang, and GCC from version 12 */
#if !defined(VK_GEMM_NO_SHUFFLE) && (defined(__clang__) || __GNUC__ >= 12)
#define VK_GEMM_SHUFFLE 1
#else
#define VK_GEMM_SHUFFLE 0
#endif
"""

_DRIVER = Template(r"""
#define VK_GEMM_L_$T (VK_GEMM_VBYTES / (int)sizeof($T))
#define VK_GEMM_NR_$T ($NV * VK_GEMM_L_$T)

typedef $T vk_gemm_v8$T __attribute__((vector_size(8 * sizeof($T)), aligned(sizeof($T)),
                                      may_alias));

#if VK_GEMM_SHUFFLE
/* dst[kk * ld + jj] = src[jj * ss + kk] for an 8 x 8 block (k contiguous in src): three rounds
   of interleaving the rows i and i + 4 transpose it in registers */
static void vk_gemm_transpose8_$T(const $T* src, int64_t ss, $T* dst, int64_t ld)
{
$TRANSPOSE8
}
#endif

/* B[k0.., j0..] (kc x n, n <= NR) -> dst[k * NR + j], columns n..NR-1 zero */
static void vk_gemm_pack_b_$T(int64_t kc, int64_t n, const $T* B, int64_t sbk, int64_t sbn,
                              $T* dst)
{
    const int64_t nr = VK_GEMM_NR_$T;
    if (sbn == 1 && n == nr) {                  /* rows of B: copies */
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < VK_GEMM_NR_$T; j++) dst[k * nr + j] = B[k * sbk + j];
        return;
    }
    if (sbn <= sbk) {
        for (int64_t k = 0; k < kc; k++) {
            const $T* src = B + k * sbk;
            $T* row = dst + k * nr;
            int64_t j = 0;
            for (; j < n; j++) row[j] = src[j * sbn];
            for (; j < nr; j++) row[j] = 0;
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
    for (int64_t k = 0; k < kc; k++)
        for (int64_t j = n; j < nr; j++) dst[k * nr + j] = 0;
}

$KERNEL

/* one MR x NR tile of C at c (m x n of it real), general strides: through a private tile */
static void vk_gemm_tile_$T(int64_t kc, const $T* a, int64_t sam, int64_t sak, const $T* bp,
                            $T* c, int64_t scm, int64_t scn, int64_t m, int64_t n, int first)
{
    const int64_t nr = VK_GEMM_NR_$T;
    if (scn == 1 && m == $MR && n == nr) {
        vk_gemm_kernel_$T(kc, a, sam, sak, m, bp, c, scm, first);
        return;
    }
    $T tile[$MR * VK_GEMM_NR_$T] __attribute__((aligned(64)));
    if (m == $MR && n == nr && scm == 1) {      /* a full tile of a column-major C */
        if (!first)
            for (int64_t j = 0; j < VK_GEMM_NR_$T; j++)
                for (int64_t i = 0; i < $MR; i++) tile[i * nr + j] = c[i + j * scn];
        vk_gemm_kernel_$T(kc, a, sam, sak, m, bp, tile, nr, first);
        for (int64_t j = 0; j < VK_GEMM_NR_$T; j++)
            for (int64_t i = 0; i < $MR; i++) c[i + j * scn] = tile[i * nr + j];
        return;
    }
    if (!first)
        for (int64_t i = 0; i < $MR; i++)
            for (int64_t j = 0; j < nr; j++)
                tile[i * nr + j] = (i < m && j < n) ? c[i * scm + j * scn] : 0;
    vk_gemm_kernel_$T(kc, a, sam, sak, m, bp, tile, nr, first);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            c[i * scm + j * scn] = tile[i * nr + j];
}

/* rough cycles of one orientation: the padded tiles' arithmetic, packing B (a transposing copy
   costs more than a row copy), and C's tiles through the private tile where C's rows are not
   contiguous (once per k-block) */
static double vk_gemm_cost_$T(int64_t M, int64_t N, int64_t K, int64_t sbk, int64_t sbn,
                              int64_t scn)
{
    const int64_t mr = $MR, nr = VK_GEMM_NR_$T;
    double tiles = (double)((M + mr - 1) / mr * mr) * (double)((N + nr - 1) / nr * nr);
    double work = tiles * (double)K * (2.0 / (2 * 2 * VK_GEMM_L_$T));
    double pack = (double)K * (double)N * (sbn == 1 ? 0.1 : (sbk == 1 && VK_GEMM_SHUFFLE ? 0.3 : 1.5));
    double blocks = (double)((K + $KC - 1) / $KC);
    double scatter = scn == 1 ? 0.0 : (double)M * (double)N * 2.0 * blocks;
    return work + pack + scatter;
}

static void vk_gemm_$T(int64_t M, int64_t N, int64_t K,
                       const $T* A, int64_t sam, int64_t sak,
                       const $T* B, int64_t sbk, int64_t sbn,
                       $T* C, int64_t scm, int64_t scn, $T* pack)
{
    const int64_t mr = $MR, nr = VK_GEMM_NR_$T;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * scm + j * scn] = 0;
        return;
    }
    /* the transposed product C^T = B^T A^T where it costs less */
    if (vk_gemm_cost_$T(N, M, K, sak, sam, scm) < vk_gemm_cost_$T(M, N, K, sbk, sbn, scn)) {
        int64_t t;
        const $T* p;
        t = M; M = N; N = t;
        p = A; A = B; B = p;
        t = sam; sam = sbn; sbn = t;
        t = sak; sak = sbk; sbk = t;
        t = scm; scm = scn; scn = t;
    }
    $T* bpack = pack;
    int64_t kblocks = (K + $KC - 1) / $KC;
    int64_t kstep = (K + kblocks - 1) / kblocks;
    for (int64_t jc = 0; jc < N; jc += $NC) {
        int64_t nc = N - jc < $NC ? N - jc : $NC;
        for (int64_t pc = 0; pc < K; pc += kstep) {
            int64_t kc = K - pc < kstep ? K - pc : kstep;
            for (int64_t jr = 0; jr < nc; jr += nr)
                vk_gemm_pack_b_$T(kc, nc - jr < nr ? nc - jr : nr, B + pc * sbk + (jc + jr) * sbn,
                                  sbk, sbn, bpack + jr * kc);
            for (int64_t ic = 0; ic < M; ic += $MC) {
                int64_t mc = M - ic < $MC ? M - ic : $MC;
                for (int64_t jr = 0; jr < nc; jr += nr)
                    for (int64_t ir = 0; ir < mc; ir += mr)
                        vk_gemm_tile_$T(kc, A + (ic + ir) * sam + pc * sak, sam, sak,
                                        bpack + jr * kc,
                                        C + (ic + ir) * scm + (jc + jr) * scn, scm, scn,
                                        mc - ir < mr ? mc - ir : mr, nc - jr < nr ? nc - jr : nr,
                                        pc == 0);
            }
        }
    }
}
""")


def _kernel(t: str) -> str:
    """The micro-kernel's C text: an MR x NR tile held in MR * NV named vector registers, each
    output one accumulator that gets, per k, one rounded product added (never fused).  A is read
    in place (``a`` at A[i0, k0], rows ``sam`` apart, k ``sak`` apart): its values are broadcast
    one at a time, so its layout costs little and it needs no packing; rows past the ``m`` real
    ones read the last real row again (their results are discarded)."""
    mr, nv = MR[t], NV[t]
    v = f"vk_gemm_v{t}"
    lanes = f"VK_GEMM_L_{t}"
    accs = [[f"c{i}_{j}" for j in range(nv)] for i in range(mr)]
    flat = [a for row in accs for a in row]
    lines = [f"static void vk_gemm_kernel_{t}(int64_t kc, const {t}* a, int64_t sam, int64_t sak, "
             f"int64_t m, const {t}* restrict bp, {t}* c, int64_t ldc, int first)",
             "{",
             "    " + " ".join(f"const int64_t o{i} = ({i} < m ? {i} : m - 1) * sam;"
                               for i in range(mr)),
             f"    {v} {', '.join(flat)};",
             "    if (first) {",
             f"        {v} zero = {{0}};",
             "        " + " ".join(f"{a} = zero;" for a in flat),
             "    } else {"]
    for i in range(mr):
        lines.append("        " + " ".join(
            f"{accs[i][j]} = *(const {v}*)(c + {i} * ldc + {j} * {lanes});" for j in range(nv)))
    lines += ["    }",
              "    for (int64_t k = 0; k < kc; k++) {",
              "        " + " ".join(f"{v} b{j} = *(const {v}*)(bp + {j} * {lanes});"
                                    for j in range(nv))]
    for i in range(mr):
        lines.append(f"        {{ {t} ai = a[o{i}]; " + " ".join(
            f"{accs[i][j]} = {accs[i][j]} + ai * b{j};" for j in range(nv)) + " }")
    lines += [f"        a += sak; bp += {nv} * {lanes};",
              "    }"]
    for i in range(mr):
        lines.append("    " + " ".join(
            f"*({v}*)(c + {i} * ldc + {j} * {lanes}) = {accs[i][j]};" for j in range(nv)))
    lines.append("}")
    return "\n".join(lines)


def _transpose8(t: str) -> str:
    """The body of the 8 x 8 transpose, written out (named registers, no arrays: an array of
    vectors would live in memory at -O2)."""
    v8 = f"vk_gemm_v8{t}"
    lines = ["    " + " ".join(f"{v8} r0_{i} = *(const {v8}*)(src + {i} * ss);" for i in range(8))]
    for rnd in range(3):
        for i in range(4):
            a, b = f"r{rnd}_{i}", f"r{rnd}_{i + 4}"
            lines.append(f"    {v8} r{rnd + 1}_{2 * i} = __builtin_shufflevector({a}, {b}, "
                         "0, 8, 1, 9, 2, 10, 3, 11);")
            lines.append(f"    {v8} r{rnd + 1}_{2 * i + 1} = __builtin_shufflevector({a}, {b}, "
                         "4, 12, 5, 13, 6, 14, 7, 15);")
    lines.append("    " + " ".join(f"*({v8}*)(dst + {i} * ld) = r3_{i};" for i in range(8)))
    return "\n".join(lines)


def _source(t: str) -> str:
    return _DRIVER.substitute(T=t, MR=MR[t], NV=NV[t], KC=KC[t], MC=MC[t], NC=NC[t],
                              KERNEL=_kernel(t), TRANSPOSE8=_transpose8(t))


#: the C text of ``vk_gemm_float`` and ``vk_gemm_double`` (after the program's prelude types)
GEMM_C = _VECTOR_TYPES + _source("float") + _source("double")
