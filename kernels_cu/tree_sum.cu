// The canonical-tree ordered sum over samples, on the GPU, with the bits of
// kit/vkml/graph/treesum.py's tree_sum.
//
// tree_sum sums x[0..n-1] (each sample a row of m values) as the perfect binary tree over the sample
// index padded with zeros to a power of two, leaves in sample order: level by level,
// y[j] = x[2j] + x[2j+1].  An aligned chunk of 2^k samples is exactly a subtree, so this kernel sums
// chunks of `chunk` samples (a power of two, at most 1024, and never more than the padded width:
// a wider chunk would add zero subtrees above the root, and 0.0 + -0.0 is 0.0) into one partial each,
// and the host runs it again over the partials until one is left.  Padding samples are added as
// zeros, exactly as tree_sum adds them (so -0.0 and NaN come out as on the CPU).  Compiled with
// -fmad=false; additions are IEEE, so the result is bitwise equal to tree_sum's.
//
// Launch: blockDim.x = max(1, chunk / 2), dynamic shared memory chunk / 2 * sizeof(T) (at least one
// element), any grid; block b handles (chunk, column) pairs b, b + gridDim.x, ...  x is [n, m]
// row-major; out is [ceil(width / chunk), m] row-major.

template <typename T>
__device__ void vk_tree_sum_level(const T* __restrict__ x, T* __restrict__ out, long long n,
                                  long long m, long long chunks, int chunk, T* s) {
    const int t = threadIdx.x;
    const int half = chunk / 2;
    for (long long pair = blockIdx.x; pair < chunks * m; pair += gridDim.x) {
        const long long c = pair / m, col = pair % m;
        const long long base = c * (long long)chunk;
        if (chunk == 1) {
            if (t == 0) out[c * m + col] = base < n ? x[base * m + col] : (T)0;
            continue;
        }
        // the first level: leaves 2t and 2t+1 of this chunk (zeros past the last sample)
        const long long i0 = base + 2 * t, i1 = i0 + 1;
        const T l0 = i0 < n ? x[i0 * m + col] : (T)0;
        const T l1 = i1 < n ? x[i1 * m + col] : (T)0;
        s[t] = l0 + l1;
        __syncthreads();
        for (int len = half; len > 1; len /= 2) {
            const int h = len / 2;
            T v = (T)0;
            if (t < h) v = s[2 * t] + s[2 * t + 1];
            __syncthreads();
            if (t < h) s[t] = v;
            __syncthreads();
        }
        if (t == 0) out[c * m + col] = s[0];
        __syncthreads();
    }
}

extern "C" __global__ void vk_tree_sum_float(const float* x, float* out, long long n, long long m,
                                             long long chunks, int chunk) {
    extern __shared__ unsigned char vk_smem[];
    vk_tree_sum_level<float>(x, out, n, m, chunks, chunk, (float*)vk_smem);
}

extern "C" __global__ void vk_tree_sum_double(const double* x, double* out, long long n, long long m,
                                              long long chunks, int chunk) {
    extern __shared__ unsigned char vk_smem[];
    vk_tree_sum_level<double>(x, out, n, m, chunks, chunk, (double*)vk_smem);
}
