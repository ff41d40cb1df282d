/* dc.h -- DC-ASGD delay compensation of a stale gradient.
 *
 * docs/design.md section 6 step 3: a gradient computed at parameters w_bak is
 * pushed after the server has moved to w_new. DC-ASGD corrects it with a
 * cheap approximation of the Hessian: diag mode uses g (.) g as its diagonal
 * (the DC-ASGD paper), identity mode uses the identity (first order). The
 * adaptive variant (DC-ASGD-a) scales lambda by 1/sqrt of an EMA of g^2 so
 * the correction does not blow up where gradients are large.
 *
 * CPU twin in dc.c, CUDA version in dc.cu (GDDR_ENOTSUP without nvcc).
 * Both touch only the buffers they are given; the caller owns them.
 */
#ifndef GDDR_KERNELS_DC_H
#define GDDR_KERNELS_DC_H

#include <math.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gddr_dc_args {
    size_t n;        /* tensor length */
    float lambda;    /* lambda (lambda0 when adaptive) */
    int mode;        /* GDDR_DC_DIAG or GDDR_DC_IDENTITY (gddr_base.h) */
    int adaptive;    /* 1: lambda_i = lambda / sqrtf(ms[i] + eps) */
    float ms_decay;  /* EMA factor of g^2 */
    float eps;       /* keeps the adaptive scale finite; 1e-7 by default */
    float ms_scale;  /* adaptive: ms is used as ms*ms_scale (Adam-style bias correction,
                        1/(1-ms_decay^t) at the t-th step); 0 means 1 */
} gddr_dc_args;

#define GDDR_DC_ARGS_INIT { 0, 0.0f, 0 /* GDDR_DC_DIAG */, 0, 0.95f, 1e-7f, 1.0f }

/* In place on g (n floats). If adaptive: ms[i] = ms_decay*ms[i] +
 * (1-ms_decay)*g[i]*g[i] (g before compensation), lam_i =
 * lambda/sqrtf(ms[i]*ms_scale+eps); else lam_i = lambda and ms may be NULL.
 * The EMA starts at 0, so without the correction lambda_t is 1/sqrt(1-decay)
 * times too large at the first step (4.5x for decay 0.95).
 * diag: g[i] += lam_i*g[i]*g[i]*(w_new[i]-w_bak[i]);
 * identity: g[i] += lam_i*(w_new[i]-w_bak[i]).
 * Returns GDDR_OK or GDDR_EINVAL (bad mode, NULL buffer). */
int gddr_dc_cpu(const gddr_dc_args *a, float *g, const float *w_new, const float *w_bak,
                float *ms);

/* One element of gddr_dc_cpu() (also used by the fused pass, fused.c):
 * returns the compensated gi and updates *ms when adaptive. keep is
 * 1 - decay, scale the effective ms_scale (> 0). */
static inline float gddr__dc_one(float gi, float w_new, float w_bak, float *ms, float lambda,
                                 float decay, float keep, float eps, float scale, int diag,
                                 int adaptive)
{
    const float d = w_new - w_bak;
    float lam = lambda;
    if (adaptive) {
        const float m = decay * *ms + keep * (gi * gi);
        *ms = m;
        lam = lambda / sqrtf(m * scale + eps);
    }
    const float h = diag ? (gi * gi) * d : d;
    return gi + lam * h;
}

/* The same with device buffers, queued on `stream` (a cudaStream_t; NULL =
 * default stream); returns without waiting. */
int gddr_dc_cuda(const gddr_dc_args *a, float *d_g, const float *d_w_new, const float *d_w_bak,
                 float *d_ms, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* GDDR_KERNELS_DC_H */
