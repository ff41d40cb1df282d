/* dc.cu -- CUDA version of DC-ASGD compensation (see dc.h).
 *
 * One elementwise pass, memory bound: it reads g, w_new, w_bak (and ms) and
 * writes g (and ms). The mode and the adaptive switch are template
 * parameters so the loop body carries no branches. The arithmetic is
 * dc_dev.cuh's, the device twin of dc.h's gddr__dc_one().
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "blas.h"
#include "cuda_err.h"
#include "dc.h"
#include "dc_dev.cuh"
#include "gddr_base.h"

#define THREADS 256
#define MAX_BLOCKS 65536u

template <bool DIAG, bool ADAPTIVE>
static __global__ void dc_kernel(size_t n, float lambda, float decay, float keep, float eps,
                                 float scale,
                                 float *__restrict__ g, const float *__restrict__ w_new,
                                 const float *__restrict__ w_bak, float *__restrict__ ms)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        g[i] = dc_one_dev<DIAG, ADAPTIVE>(g[i], __ldg(w_new + i), __ldg(w_bak + i),
                                          ADAPTIVE ? ms + i : NULL, lambda, decay, keep, eps,
                                          scale);
    }
}

extern "C" int gddr_dc_cuda(const gddr_dc_args *a, float *d_g, const float *d_w_new,
                            const float *d_w_bak, float *d_ms, void *stream)
{
    if (!a || (a->mode != GDDR_DC_DIAG && a->mode != GDDR_DC_IDENTITY)) {
        gddr__cuda_seterr("dc (cuda): unknown mode %d", a ? a->mode : -1);
        return GDDR_EINVAL;
    }
    if (a->n == 0)
        return GDDR_OK;
    if (!d_g || !d_w_new || !d_w_bak || (a->adaptive && !d_ms))
        return GDDR_EINVAL;

    cudaStream_t st = (cudaStream_t)stream;
    size_t b = (a->n + THREADS - 1) / THREADS;
    const unsigned blocks = b > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)b;
    /* Same expression as dc.c, evaluated once on the host for both. */
    const float keep = 1.0f - a->ms_decay;
    const float scale = a->ms_scale > 0.0f ? a->ms_scale : 1.0f;
    const int diag = a->mode == GDDR_DC_DIAG;
#define DC_LAUNCH(D, A)                                                                       \
    dc_kernel<D, A><<<blocks, THREADS, 0, st>>>(a->n, a->lambda, a->ms_decay, keep, a->eps, scale, d_g, \
                                                d_w_new, d_w_bak, d_ms)
    if (diag && a->adaptive)
        DC_LAUNCH(true, true);
    else if (diag)
        DC_LAUNCH(true, false);
    else if (a->adaptive)
        DC_LAUNCH(false, true);
    else
        DC_LAUNCH(false, false);
#undef DC_LAUNCH
    GDDR_CUDA_TRY(cudaGetLastError());
    return GDDR_OK;
}
