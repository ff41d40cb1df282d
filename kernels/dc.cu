/* dc.cu -- CUDA version of DC-ASGD compensation (see dc.h).
 *
 * One elementwise pass, memory bound: it reads g, w_new, w_bak (and ms) and
 * writes g (and ms). The mode and the adaptive switch are template
 * parameters so the loop body carries no branches. The arithmetic follows
 * dc.c step by step with round-to-nearest intrinsics, which keep nvcc from
 * fusing multiply-adds the CPU twin does not fuse.
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "gddr/gddr.h"
extern "C" {
#include "log.h"
}
#include "blas.h"
#include "dc.h"

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
        const float gi = g[i];
        const float d = __fsub_rn(__ldg(w_new + i), __ldg(w_bak + i));
        const float g2 = __fmul_rn(gi, gi);
        float lam = lambda;
        if (ADAPTIVE) {
            const float m = __fadd_rn(__fmul_rn(decay, ms[i]), __fmul_rn(keep, g2));
            ms[i] = m;
            lam = __fdiv_rn(lambda, __fsqrt_rn(__fadd_rn(__fmul_rn(m, scale), eps)));
        }
        const float h = DIAG ? __fmul_rn(g2, d) : d;
        g[i] = __fadd_rn(gi, __fmul_rn(lam, h));
    }
}

extern "C" int gddr_dc_cuda(const gddr_dc_args *a, float *d_g, const float *d_w_new,
                            const float *d_w_bak, float *d_ms, void *stream)
{
    if (!a || (a->mode != GDDR_DC_DIAG && a->mode != GDDR_DC_IDENTITY)) {
        gddr_log(GDDR_LOG_ERROR, "dc (cuda): unknown mode %d", a ? a->mode : -1);
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
