/* fused.cu -- CUDA version of the fused step passes (see fused.h).
 *
 * pass 1  sumsq_kernel: grid-stride sum of x^2 in double per thread (four
 *         floats a load when x is 16-byte aligned), a block tree, one partial per block into the context's scratch,
 *         then finish_kernel sums the partials in a fixed order. No
 *         atomics, so the result is the same every run for a given n.
 * clip    clip_kernel: one thread applies gddr_clip_ctl() to every
 *         tensor's sum, so clipping needs no host round trip.
 * pass 2  fused_kernel: per element g' = g * ctl[0], DC-ASGD on g'
 *         (dc_dev.cuh), then u = r + g' kept in r (held chunk) or written to
 *         out at rank * chunk + offset (sent chunk, r zeroed), the L1 of the
 *         new r summed like pass 1. Nothing is written when ctl[1] == 0.
 *
 * Float arithmetic uses round-to-nearest intrinsics in fused.c's order, so
 * r, out and ms equal the CPU twin's bit for bit; the two double sums
 * differ from the twin's only by summation order. Every launch is queued
 * on the context's stream; nothing here waits.
 *
 * The element loops index with 32-bit integers when n allows it (64-bit
 * division, element -> chunk, is many instructions on the GPU).
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "blas.h"
#include "cuda_err.h"
#include "dc_dev.cuh"
#include "fused.h"
#include "gddr_base.h"

#define THREADS 256

static unsigned blocks_for(size_t n)
{
    size_t b = (n + THREADS - 1) / THREADS;
    return b == 0 ? 1u : b > GDDR_REDUCE_BLOCKS ? GDDR_REDUCE_BLOCKS : (unsigned)b;
}

/* Tree sum over the block in a fixed order; every thread must call it.
 * Thread 0 gets the block's sum. */
static __device__ double block_sum(double v)
{
    __shared__ double s[THREADS];
    s[threadIdx.x] = v;
    __syncthreads();
    for (unsigned k = THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k)
            s[threadIdx.x] = __dadd_rn(s[threadIdx.x], s[threadIdx.x + k]);
        __syncthreads();
    }
    return s[0];
}

/* x^2 + y^2 in double, rounded as written. */
static __device__ double sq2(float x, float y)
{
    const double a = (double)x, b = (double)y;
    return __dadd_rn(__dmul_rn(a, a), __dmul_rn(b, b));
}

/* A 16-byte-aligned x is read four floats a load (one load of one float a
 * thread held pass 1 to 60% of a device copy's rate on an H200,
 * docs/performance.md), into two accumulators; the tail, and an x that is
 * not aligned (a tensor at an odd offset of a larger allocation), one
 * float at a time. The order is fixed by n, the grid and the alignment:
 * the same result every run. */
template <typename Idx>
static __global__ void sumsq_kernel(Idx n, const float *__restrict__ x, double *__restrict__ part)
{
    double a0 = 0.0, a1 = 0.0;
    const Idx stride = (Idx)gridDim.x * blockDim.x;
    const Idx t = (Idx)blockIdx.x * blockDim.x + threadIdx.x;
    Idx done = 0;
    if (((uintptr_t)x & 15) == 0) {
        const Idx n4 = n / 4;
        const float4 *x4 = (const float4 *)x;
        for (Idx i = t; i < n4; i += stride) {
            const float4 v = __ldg(x4 + i);
            a0 = __dadd_rn(a0, sq2(v.x, v.y));
            a1 = __dadd_rn(a1, sq2(v.z, v.w));
        }
        done = n4 * 4;
    }
    for (Idx i = done + t; i < n; i += stride) {
        const double v = (double)__ldg(x + i);
        a0 = __dadd_rn(a0, __dmul_rn(v, v));
    }
    const double acc = block_sum(__dadd_rn(a0, a1));
    if (threadIdx.x == 0)
        part[blockIdx.x] = acc;
}

/* One block: thread t sums partials t, t + THREADS, ... then the tree.
 * With ctl (the fused pass) and ctl[1] == 0 it writes nothing. */
static __global__ void finish_kernel(const double *__restrict__ part, unsigned nparts,
                                     double *__restrict__ out, const float *__restrict__ ctl)
{
    if (ctl && ctl[1] == 0.0f)
        return;
    double acc = 0.0;
    for (unsigned k = threadIdx.x; k < nparts; k += THREADS)
        acc = __dadd_rn(acc, part[k]);
    acc = block_sum(acc);
    if (threadIdx.x == 0)
        *out = acc;
}

static __global__ void clip_kernel(const double *sumsq, int nt, double clip, float *ctl)
{
    gddr_clip_ctl(sumsq, nt, clip, ctl);
}

struct dc_params {
    float lambda, decay, keep, eps, scale;
};

/* DCM: 0 none, 1 diag, 2 identity. */
template <typename Idx, bool RES, int DCM, bool AD>
static __global__ void fused_kernel(Idx n, Idx chunk, dc_params p, const float *__restrict__ ctl,
                                    const float *__restrict__ g, const float *__restrict__ w_new,
                                    const float *__restrict__ w_bak, float *__restrict__ ms,
                                    float *__restrict__ r, const uint32_t *__restrict__ rank,
                                    float *__restrict__ out, double *__restrict__ part)
{
    double acc = 0.0;
    /* The same for every thread, so the block reaches block_sum together. */
    if (ctl[1] != 0.0f) {
        const float scale = ctl[0];
        for (Idx i = (Idx)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (Idx)gridDim.x * blockDim.x) {
            float gi = __fmul_rn(__ldg(g + i), scale);
            if (DCM != 0)
                gi = dc_one_dev<DCM == 1, AD>(gi, __ldg(w_new + i), __ldg(w_bak + i),
                                              AD ? ms + i : NULL, p.lambda, p.decay, p.keep,
                                              p.eps, p.scale);
            if (!RES) {
                out[i] = gi;
                continue;
            }
            const Idx c = i / chunk;
            const float u = __fadd_rn(r[i], gi);
            const uint32_t k = __ldg(rank + c);
            if (k == GDDR_HELD) {
                r[i] = u;
                acc = __dadd_rn(acc, fabs((double)u));
            } else {
                out[(Idx)k * chunk + (i - c * chunk)] = u;
                r[i] = 0.0f;
            }
        }
    }
    if (RES) {
        acc = block_sum(acc);
        if (threadIdx.x == 0)
            part[blockIdx.x] = acc;
    }
}

extern "C" int gddr_sumsq_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *d_out)
{
    double *part = gddr__cuda_ctx_partials(ctx);
    if (!part || !d_out || (n > 0 && !d_x))
        return GDDR_EINVAL;
    cudaStream_t st = (cudaStream_t)gddr_cuda_ctx_stream(ctx);
    const unsigned nb = blocks_for(n);
    if (n <= (size_t)INT32_MAX)
        sumsq_kernel<uint32_t><<<nb, THREADS, 0, st>>>((uint32_t)n, d_x, part);
    else
        sumsq_kernel<uint64_t><<<nb, THREADS, 0, st>>>((uint64_t)n, d_x, part);
    GDDR_CUDA_TRY(cudaGetLastError());
    finish_kernel<<<1, THREADS, 0, st>>>(part, nb, d_out, NULL);
    GDDR_CUDA_TRY(cudaGetLastError());
    return GDDR_OK;
}

extern "C" int gddr_clip_cuda(gddr_cuda_ctx *ctx, const double *d_sumsq, int nt, double clip,
                              float *d_ctl)
{
    if (!ctx || !d_ctl || nt < 0 || (nt > 0 && !d_sumsq))
        return GDDR_EINVAL;
    clip_kernel<<<1, 1, 0, (cudaStream_t)gddr_cuda_ctx_stream(ctx)>>>(d_sumsq, nt, clip, d_ctl);
    GDDR_CUDA_TRY(cudaGetLastError());
    return GDDR_OK;
}

template <typename Idx, bool RES, int DCM, bool AD>
static void launch(unsigned nb, cudaStream_t st, const gddr_fused_args *a,
                   const gddr_fused_bufs *b, const dc_params &p, double *part)
{
    fused_kernel<Idx, RES, DCM, AD><<<nb, THREADS, 0, st>>>(
        (Idx)a->n, (Idx)a->chunk, p, b->ctl, b->g, b->w_new, b->w_bak, b->ms, b->r, b->rank,
        b->out, part);
}

template <typename Idx, bool RES>
static void launch_dc(unsigned nb, cudaStream_t st, const gddr_fused_args *a,
                      const gddr_fused_bufs *b, const dc_params &p, double *part)
{
    const bool ad = a->dca.adaptive != 0;
    if (!a->dc)
        launch<Idx, RES, 0, false>(nb, st, a, b, p, part);
    else if (a->dca.mode == GDDR_DC_DIAG)
        ad ? launch<Idx, RES, 1, true>(nb, st, a, b, p, part)
           : launch<Idx, RES, 1, false>(nb, st, a, b, p, part);
    else
        ad ? launch<Idx, RES, 2, true>(nb, st, a, b, p, part)
           : launch<Idx, RES, 2, false>(nb, st, a, b, p, part);
}

extern "C" int gddr_fused_cuda(gddr_cuda_ctx *ctx, const gddr_fused_args *a,
                               const gddr_fused_bufs *b)
{
    double *part = gddr__cuda_ctx_partials(ctx);
    if (!part || !a || !b || !b->ctl)
        return GDDR_EINVAL;
    const gddr_dc_args *d = &a->dca;
    if (a->dc && d->mode != GDDR_DC_DIAG && d->mode != GDDR_DC_IDENTITY) {
        gddr__cuda_seterr("fused (cuda): unknown DC mode %d", d->mode);
        return GDDR_EINVAL;
    }
    if (a->residual && (a->chunk == 0 || gddr_nchunks(a->n, a->chunk) > (size_t)UINT32_MAX))
        return GDDR_EINVAL;
    if (a->n > 0 && (!b->g || !b->out || (a->residual && (!b->r || !b->rank)) ||
                     (a->dc && (!b->w_new || !b->w_bak || (d->adaptive && !b->ms)))))
        return GDDR_EINVAL;
    cudaStream_t st = (cudaStream_t)gddr_cuda_ctx_stream(ctx);
    /* Same expressions as fused.c, evaluated once on the host for both. */
    const dc_params p = { d->lambda, d->ms_decay, 1.0f - d->ms_decay, d->eps,
                          d->ms_scale > 0.0f ? d->ms_scale : 1.0f };
    const unsigned nb = blocks_for(a->n);
    /* 32-bit indices need every index, packed places included, below 2^31. */
    const bool small = a->n <= (size_t)INT32_MAX;
    if (a->residual) {
        small ? launch_dc<uint32_t, true>(nb, st, a, b, p, part)
              : launch_dc<uint64_t, true>(nb, st, a, b, p, part);
    } else {
        small ? launch_dc<uint32_t, false>(nb, st, a, b, p, part)
              : launch_dc<uint64_t, false>(nb, st, a, b, p, part);
    }
    GDDR_CUDA_TRY(cudaGetLastError());
    if (a->residual && b->l1) {
        finish_kernel<<<1, THREADS, 0, st>>>(part, nb, b->l1, b->ctl);
        GDDR_CUDA_TRY(cudaGetLastError());
    }
    return GDDR_OK;
}
