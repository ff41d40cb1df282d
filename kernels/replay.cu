/* replay.cu -- CUDA version of orphan residual installments (see replay.h).
 *
 * Elementwise and memory bound. The installment is computed exactly as in
 * replay.c (inst = rem - fl(rem - gamma*rem)) with round-to-nearest
 * intrinsics, so the GPU moves the same mass as the CPU twin, bit for bit,
 * and installments still sum to the orphan exactly for gamma <= 0.5.
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "blas.h"
#include "cuda_err.h"
#include "gddr_base.h"
#include "replay.h"

#define THREADS 256
#define MAX_BLOCKS 65536u

template <bool LAST>
static __global__ void replay_kernel(size_t n, float gamma, float *__restrict__ r,
                                     float *__restrict__ rem)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float old = rem[i];
        if (LAST) {
            r[i] = __fadd_rn(r[i], old);
            rem[i] = 0.0f;
        } else {
            const float left = __fsub_rn(old, __fmul_rn(gamma, old));
            r[i] = __fadd_rn(r[i], __fsub_rn(old, left));
            rem[i] = left;
        }
    }
}

extern "C" int gddr_replay_cuda(float *d_r, float *d_rem, size_t n, float gamma, int last,
                                void *stream)
{
    if (!(gamma >= 0.0f && gamma <= 1.0f))
        return GDDR_EINVAL;
    if (n == 0)
        return GDDR_OK;
    if (!d_r || !d_rem)
        return GDDR_EINVAL;
    cudaStream_t st = (cudaStream_t)stream;
    size_t b = (n + THREADS - 1) / THREADS;
    const unsigned blocks = b > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)b;
    if (last)
        replay_kernel<true><<<blocks, THREADS, 0, st>>>(n, gamma, d_r, d_rem);
    else
        replay_kernel<false><<<blocks, THREADS, 0, st>>>(n, gamma, d_r, d_rem);
    GDDR_CUDA_TRY(cudaGetLastError());
    return GDDR_OK;
}
