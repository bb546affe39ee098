// vkml's scalar helpers, shared by every renderer: the C renderer defines VK_FN as
// `static inline`, the CUDA prelude as `__device__ __forceinline__`.  One definition of the
// semantics both backends must have: max/min propagate NaN as NumPy's maximum/minimum do, the
// sign of a zero is +0 and of NaN is NaN (NumPy's), integer floor division rounds toward minus
// infinity (0 for a zero divisor), integer powers wrap around.
VK_FN double vk_max_double(double a, double b) { return (a != a) ? a : ((b != b) ? b : (a >= b ? a : b)); }
VK_FN float vk_max_float(float a, float b) { return (a != a) ? a : ((b != b) ? b : (a >= b ? a : b)); }
VK_FN double vk_min_double(double a, double b) { return (a != a) ? a : ((b != b) ? b : (a <= b ? a : b)); }
VK_FN float vk_min_float(float a, float b) { return (a != a) ? a : ((b != b) ? b : (a <= b ? a : b)); }
VK_FN double vk_sign_double(double a) { return a > 0 ? 1.0 : (a < 0 ? -1.0 : (a == 0 ? 0.0 : a)); }
VK_FN float vk_sign_float(float a) { return a > 0 ? 1.0f : (a < 0 ? -1.0f : (a == 0 ? 0.0f : a)); }
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
