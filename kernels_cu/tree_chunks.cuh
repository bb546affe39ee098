// The first stage of a large float sum on the CUDA backend, reading its input coalesced, with the
// bits of the canonical tree (kit/vkml/ops/treesum.py).
//
// x holds `outs` rows of `total` contiguous elements; row o's sum is split into `parts` aligned
// chunks of `chunk` elements (a power of two, at least 2 * VK_CHUNK_THREADS, never wider than the
// row padded to a power of two), and part[o * parts + c] becomes the canonical tree over chunk c --
// exactly a subtree of the row's tree, the last one padded with zeros.  One block per (row, chunk)
// at a time: in each pass its threads read 2 * VK_CHUNK_THREADS consecutive elements as pairs (one
// pair per thread: neighbouring threads read neighbouring memory), add each pair (the tree's first
// level), and finish that span's subtree in shared memory level by level; thread 0 pushes the
// span's sum onto the streamed tree of helpers.h (vk_tree_push at level log2(span)) and folds it at
// the end.  Zeros past the row's end are the tree's own zero padding, so -0.0, NaN and infinities
// come out as on the CPU.  Compiled with -fmad=false: IEEE additions, the same bits.
//
// Launch: blockDim.x = VK_CHUNK_THREADS, any grid (blocks stride over the outs * parts jobs).
#ifndef VK_CHUNK_THREADS            // (the host emulation may run fewer: the bits are the same for
#define VK_CHUNK_THREADS 256        // any power of two, each span being a subtree of the chunk)
#define VK_CHUNK_LEVEL 9            // log2(2 * VK_CHUNK_THREADS)
#endif

__device__ __forceinline__ void vk_tree_push_any(float* st, int64_t n, int l, float v) {
    vk_tree_push_float(st, n, l, v);
}
__device__ __forceinline__ void vk_tree_push_any(double* st, int64_t n, int l, double v) {
    vk_tree_push_double(st, n, l, v);
}
__device__ __forceinline__ float vk_tree_fold_any(const float* st, int64_t n, int levels) {
    return vk_tree_fold_float(st, n, levels);
}
__device__ __forceinline__ double vk_tree_fold_any(const double* st, int64_t n, int levels) {
    return vk_tree_fold_double(st, n, levels);
}

template <typename T>
__device__ void vk_tree_chunks(const T* __restrict__ x, T* __restrict__ part, long long outs,
                               long long total, long long parts, long long chunk, int levels) {
    __shared__ T s[VK_CHUNK_THREADS];
    const int t = threadIdx.x;
    const long long span = 2 * VK_CHUNK_THREADS;
    T st[64];                                   // thread 0's streamed tree over the spans
    for (long long job = blockIdx.x; job < outs * parts; job += gridDim.x) {
        const long long o = job / parts, c = job % parts;
        const T* row = x + o * total;
        const long long begin = c * chunk;
        const long long valid = total - begin < chunk ? total - begin : chunk;
        long long count = 0;
        for (long long at = 0; at < valid; at += span) {
            const long long i = at + 2 * t;
            const T l0 = i < valid ? row[begin + i] : (T)0;
            const T l1 = i + 1 < valid ? row[begin + i + 1] : (T)0;
            s[t] = l0 + l1;
            __syncthreads();
            for (int len = VK_CHUNK_THREADS; len > 1; len /= 2) {
                const int h = len / 2;
                T v = (T)0;
                if (t < h) v = s[2 * t] + s[2 * t + 1];
                __syncthreads();
                if (t < h) s[t] = v;
                __syncthreads();
            }
            if (t == 0) vk_tree_push_any(st, count, VK_CHUNK_LEVEL, s[0]);
            count += span;
            __syncthreads();
        }
        if (t == 0) part[o * parts + c] = vk_tree_fold_any(st, count, levels);
    }
}
