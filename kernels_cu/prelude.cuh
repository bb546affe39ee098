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

// The scalar helpers shared with the C renderer come next, from helpers.h (VK_FN = VK_DEV).
#define VK_FN VK_DEV

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
