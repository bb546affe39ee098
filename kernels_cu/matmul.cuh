// A tiled matrix product for the CUDA backend (used when cuBLAS is not, or for integer dtypes).
//
// c[z] = a[z] @ b[z] for z < batch, a [M, K], b [K, N], c [M, N], all row-major and contiguous.
// Each thread owns one output and adds a[i, k] * b[k, j] for k = 0, 1, ..., K-1 in that order
// from 0, exactly as the generated loop does (and the CPU tier's C), so with -fmad=false the two
// give the same bits; the tiles only stage operands in shared memory.
//
// Launch: blockDim (VK_TILE, VK_TILE), grid (ceil(N / VK_TILE), ceil(M / VK_TILE), min(batch, 65535)).
#define VK_TILE 16

// acc + x * y; integers wrap around as NumPy's do (through unsigned arithmetic: signed overflow is
// undefined in device code, which has no -fwrapv)
template <typename T>
__device__ __forceinline__ T vk_mul_add(T acc, T x, T y) { return acc + x * y; }
template <>
__device__ __forceinline__ int32_t vk_mul_add(int32_t acc, int32_t x, int32_t y) {
    return (int32_t)((uint32_t)acc + (uint32_t)x * (uint32_t)y);
}
template <>
__device__ __forceinline__ int64_t vk_mul_add(int64_t acc, int64_t x, int64_t y) {
    return (int64_t)((uint64_t)acc + (uint64_t)x * (uint64_t)y);
}

template <typename T>
__device__ void vk_matmul_tiled(const T* a, const T* b, T* c, long long batch, long long M,
                                long long N, long long K) {
    __shared__ T as[VK_TILE][VK_TILE];
    __shared__ T bs[VK_TILE][VK_TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long i = (long long)blockIdx.y * VK_TILE + ty;
    const long long j = (long long)blockIdx.x * VK_TILE + tx;
    for (long long z = blockIdx.z; z < batch; z += gridDim.z) {
        const T* az = a + z * M * K;
        const T* bz = b + z * K * N;
        T acc = 0;
        for (long long k0 = 0; k0 < K; k0 += VK_TILE) {
            as[ty][tx] = (i < M && k0 + tx < K) ? az[i * K + k0 + tx] : (T)0;
            bs[ty][tx] = (k0 + ty < K && j < N) ? bz[(k0 + ty) * N + j] : (T)0;
            __syncthreads();
            const long long kn = (K - k0) < VK_TILE ? (K - k0) : VK_TILE;
            for (int kk = 0; kk < kn; kk++) acc = vk_mul_add(acc, as[ty][kk], bs[kk][tx]);
            __syncthreads();
        }
        if (i < M && j < N) c[z * M * N + i * N + j] = acc;
    }
}
