// vkml's scalar helpers, shared by every renderer: the C renderer defines VK_FN as
// `static inline`, the CUDA prelude as `__device__ __forceinline__`.  One definition of the
// semantics both backends must have: max/min propagate NaN as NumPy's maximum/minimum do, the
// sign of a zero is +0 and of NaN is NaN (NumPy's), integer floor division rounds toward minus
// infinity (0 for a zero divisor), integer powers wrap around.  A NaN stays a NaN, but not the
// same NaN everywhere: x86 arithmetic keeps an operand's sign and payload, a GPU's returns its
// one canonical NaN; NaN results agree as NaN, never by their bits.
VK_FN double vk_max_double(double a, double b) { return (a != a) ? a : ((b != b) ? b : (a >= b ? a : b)); }
VK_FN float vk_max_float(float a, float b) { return (a != a) ? a : ((b != b) ? b : (a >= b ? a : b)); }
VK_FN double vk_min_double(double a, double b) { return (a != a) ? a : ((b != b) ? b : (a <= b ? a : b)); }
VK_FN float vk_min_float(float a, float b) { return (a != a) ? a : ((b != b) ? b : (a <= b ? a : b)); }
VK_FN double vk_sign_double(double a) { return a > 0 ? 1.0 : (a < 0 ? -1.0 : (a == 0 ? 0.0 : a)); }
VK_FN float vk_sign_float(float a) { return a > 0 ? 1.0f : (a < 0 ? -1.0f : (a == 0 ? 0.0f : a)); }
// where(c, a, b) with both a and b computed for every element (a C function's arguments are),
// so a libm call in either is never a conditional call: the loop vectorises whatever the
// condition, and a sample's bits never depend on what the compiler could fold.
// A renderer defining VK_WHERE_BITS gets the float ones as a select of bits (the same value: a's
// bits or b's), which a compiler never turns into a branch on the condition.
#define VK_WHERE(T) VK_FN T vk_where_##T(int c, T a, T b) { return c ? a : b; }
#ifdef VK_WHERE_BITS
#define VK_WHERE_BITS_OF(T, U) VK_FN T vk_where_##T(int c, T a, T b) { \
    union { T f; U u; } x = {a}, y = {b}; U m = (U)0 - (U)(c != 0); \
    x.u = (x.u & m) | (y.u & ~m); return x.f; }
VK_WHERE_BITS_OF(double, uint64_t) VK_WHERE_BITS_OF(float, uint32_t)
#else
VK_WHERE(double) VK_WHERE(float)
#endif
VK_WHERE(int64_t) VK_WHERE(int32_t) VK_WHERE(uint8_t)
// Float to integer as NumPy converts on x86, on every backend: truncation toward zero, and the
// type's minimum (x86's "integer indefinite") for NaN and for values outside the type, where a
// plain C cast is undefined -- a GPU saturates instead (NaN to 0, +inf to the maximum), x86 gives
// the minimum.  uint8 goes through int32 and keeps the low byte, as NumPy's conversion does.
VK_FN int32_t vk_to_int32_t(double x) {
    return (x > -2147483649.0 && x < 2147483648.0) ? (int32_t)x : (int32_t)(-2147483647 - 1); }
VK_FN int64_t vk_to_int64_t(double x) {
    return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (int64_t)x
                                                                       : (int64_t)(-9223372036854775807LL - 1); }
VK_FN uint8_t vk_to_uint8_t(double x) { return (uint8_t)(uint32_t)vk_to_int32_t(x); }
// Integer division is defined for every input, as NumPy defines it: a zero divisor gives 0, and
// MIN // -1 wraps around to MIN (MIN % -1 is 0) -- computed without the C operations that trap or
// are undefined there (MIN / -1 raises SIGFPE on x86).  Powers multiply in the unsigned type, so
// they wrap around as NumPy's do without signed-overflow undefined behaviour; a negative exponent
// is refused by the generated code before it gets here (NumPy refuses it), 0 is returned for one.
#define VK_INT_HELPERS(T, U) \
VK_FN T vk_floordiv_##T(T a, T b) { \
    if (b == 0) return 0; \
    if (b == -1) return (T)((U)0 - (U)a); \
    T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; } \
VK_FN T vk_mod_##T(T a, T b) { \
    if (b == 0 || b == -1) return 0; \
    T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; } \
VK_FN T vk_ipow_##T(T a, T b) { \
    U r = 1, x = (U)a; if (b < 0) return 0; \
    while (b) { if (b & 1) r *= x; x *= x; b >>= 1; } return (T)r; }
VK_INT_HELPERS(int32_t, uint32_t)
VK_INT_HELPERS(int64_t, uint64_t)
VK_FN uint8_t vk_floordiv_uint8_t(uint8_t a, uint8_t b) { return b ? a / b : 0; }
VK_FN uint8_t vk_mod_uint8_t(uint8_t a, uint8_t b) { return b ? a % b : 0; }
VK_FN uint8_t vk_ipow_uint8_t(uint8_t a, uint8_t b) { return b ? a : 1; }
// The canonical tree (kit/vkml/ops/treesum.py) streamed through a binary counter: every summing
// reduction adds in this order on every backend.  vk_tree_push adds one item standing for 2^level
// consecutive elements (count of them came before it, a multiple of 2^level) and merges equal
// levels, earlier subtree on the left; st[l] then holds the finished subtree of 2^l elements for
// each set bit l of the count.  vk_tree_fold finishes the sum of n elements padded with zeros to
// 2^levels: the last partial subtree is carried up adding +0.0 where its partner is padding and
// joined under its left neighbours -- the very additions of the zero-padded tree, so -0.0, NaN
// and infinities come out as in NumPy.  No order-free shortcut: x + 0.0 is not x for x = -0.0.
#define VK_TREE_HELPERS(T) \
VK_FN void vk_tree_push_##T(T* st, int64_t count, int level, T v) { \
    int64_t q = count >> level; \
    while (q & 1) { v = st[level] + v; q >>= 1; level++; } \
    st[level] = v; } \
VK_FN T vk_tree_fold_##T(const T* st, int64_t n, int levels) { \
    if (n <= 0) return (T)0; \
    int low = 0; \
    while (!((n >> low) & 1)) low++; \
    T acc = st[low]; \
    for (int l = low; l < levels; l++) acc = (l > low && ((n >> l) & 1)) ? st[l] + acc : acc + (T)0; \
    return acc; }
VK_TREE_HELPERS(float)
VK_TREE_HELPERS(double)
/* n canonical trees side by side (a sum over rows of each of n columns): the items of one push
   are v[0..n-1], the stack is levels x n; every tree carries at the same counts, so each step
   of vk_tree_push / vk_tree_fold above becomes a loop over the columns (the same additions in
   the same order per column) */
#define VK_TREE_COLS_HELPERS(T) \
VK_FN void vk_tree_cols_push_##T(T* st, int64_t count, int level, T* v, int64_t n) { \
    int64_t q = count >> level; \
    while (q & 1) { const T* s = st + (int64_t)level * n; \
        for (int64_t c = 0; c < n; c++) v[c] = s[c] + v[c]; q >>= 1; level++; } \
    T* d = st + (int64_t)level * n; \
    for (int64_t c = 0; c < n; c++) d[c] = v[c]; } \
VK_FN void vk_tree_cols_fold_##T(const T* st, int64_t count, int levels, T* acc, int64_t n, \
                                 T* out) { \
    if (count <= 0) { for (int64_t c = 0; c < n; c++) out[c] = (T)0; return; } \
    int low = 0; \
    while (!((count >> low) & 1)) low++; \
    for (int64_t c = 0; c < n; c++) acc[c] = st[(int64_t)low * n + c]; \
    for (int l = low; l < levels; l++) { \
        const T* s = st + (int64_t)l * n; \
        if (l > low && ((count >> l) & 1)) { for (int64_t c = 0; c < n; c++) acc[c] = s[c] + acc[c]; } \
        else { for (int64_t c = 0; c < n; c++) acc[c] = acc[c] + (T)0; } } \
    for (int64_t c = 0; c < n; c++) out[c] = acc[c]; }
VK_TREE_COLS_HELPERS(float)
VK_TREE_COLS_HELPERS(double)
