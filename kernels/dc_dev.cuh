/* dc_dev.cuh -- one element of DC-ASGD on the device, shared by dc.cu and
 * fused.cu. The arithmetic follows gddr__dc_one() (dc.h) step by step with
 * round-to-nearest intrinsics, which keep nvcc from fusing multiply-adds the
 * CPU twin does not fuse. */
#ifndef GDDR_KERNELS_DC_DEV_CUH
#define GDDR_KERNELS_DC_DEV_CUH

template <bool DIAG, bool ADAPTIVE>
static __device__ __forceinline__ float dc_one_dev(float gi, float w_new, float w_bak, float *ms,
                                                   float lambda, float decay, float keep,
                                                   float eps, float scale)
{
    const float d = __fsub_rn(w_new, w_bak);
    const float g2 = __fmul_rn(gi, gi);
    float lam = lambda;
    if (ADAPTIVE) {
        const float m = __fadd_rn(__fmul_rn(decay, *ms), __fmul_rn(keep, g2));
        *ms = m;
        lam = __fdiv_rn(lambda, __fsqrt_rn(__fadd_rn(__fmul_rn(m, scale), eps)));
    }
    const float h = DIAG ? __fmul_rn(g2, d) : d;
    return __fadd_rn(gi, __fmul_rn(lam, h));
}

#endif
