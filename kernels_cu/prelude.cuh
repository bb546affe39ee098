// vkml CUDA prelude: what every generated module starts with.
//
// The helper functions have the semantics of c_render.HELPERS (the CPU tier), so the CUDA backend,
// the compiled CPU tier and the NumPy reference agree: max/min propagate NaN as NumPy's
// maximum/minimum do, sign keeps a zero's sign and NaN, integer floor division rounds toward minus
// infinity (0 for a zero divisor), integer powers wrap around.  Generated code is compiled with
// -fmad=false (no contraction of a*b+c into an FMA), IEEE division and square root and no
// flush-to-zero, so +, -, *, / and sqrt give the same bits as on the CPU.
//
// Kernels report a failure (a gather index out of range) through a status array of four 64-bit
// words in device memory: the error code (1 + the failing primitive's place in the program's
// error list), then the bad index, the axis and its size.  The first failure wins (atomicCAS);
// every later kernel of the submission sees a nonzero status and returns at once.
#include <stdint.h>
#ifdef __CUDACC__
// the lowering does not remove stores nobody reads (a scan output that is dropped): no warning
#pragma nv_diag_suppress 550
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif

#define VK_DEV __device__ __forceinline__

VK_DEV double vk_max_double(double a, double b) { return (a != a) ? a : ((b != b) ? b : (a >= b ? a : b)); }
VK_DEV float vk_max_float(float a, float b) { return (a != a) ? a : ((b != b) ? b : (a >= b ? a : b)); }
VK_DEV double vk_min_double(double a, double b) { return (a != a) ? a : ((b != b) ? b : (a <= b ? a : b)); }
VK_DEV float vk_min_float(float a, float b) { return (a != a) ? a : ((b != b) ? b : (a <= b ? a : b)); }
VK_DEV double vk_sign_double(double a) { return a > 0 ? 1.0 : (a < 0 ? -1.0 : a); }
VK_DEV float vk_sign_float(float a) { return a > 0 ? 1.0f : (a < 0 ? -1.0f : a); }
#define VK_INT_HELPERS(T) \
VK_DEV T vk_floordiv_##T(T a, T b) { if (b == 0) return 0; T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; } \
VK_DEV T vk_ipow_##T(T a, T b) { T r = 1; if (b < 0) return (a == 1) ? 1 : ((a == -1) ? ((b & 1) ? -1 : 1) : 0); while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
VK_INT_HELPERS(int32_t)
VK_INT_HELPERS(int64_t)
VK_DEV uint8_t vk_floordiv_uint8_t(uint8_t a, uint8_t b) { return b ? a / b : 0; }
VK_DEV uint8_t vk_ipow_uint8_t(uint8_t a, uint8_t b) { return b ? a : 1; }

// The first failure of a submission wins; its details follow the code.
VK_DEV void vk_report(unsigned long long* status, int code, const int64_t* info) {
    if (atomicCAS(status, 0ULL, (unsigned long long)code) == 0ULL) {
        status[1] = (unsigned long long)info[0];
        status[2] = (unsigned long long)info[1];
        status[3] = (unsigned long long)info[2];
    }
}

// Whether an earlier kernel of this submission failed (read through volatile: another block, or
// another kernel, wrote it).
VK_DEV bool vk_failed(const unsigned long long* status) {
    return *(const volatile unsigned long long*)status != 0ULL;
}
