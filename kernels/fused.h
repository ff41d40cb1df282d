/* fused.h -- one training step's worker-side math in two passes per tensor.
 *
 * docs/design.md section 6 steps 1-4 touch every gradient float four or five
 * times when done one operation at a time (norm, clipping scale, DC-ASGD,
 * residual merge and pack, the residual's L1 norm). Here:
 *
 *   pass 1  sum of squares of g (the norm; a NaN or Inf makes it non-finite)
 *   --      clip factor from every tensor's sum (gddr_clip_ctl), on the
 *           device a one-thread kernel, so no host round trip is needed
 *   pass 2  per element: g' = g * scale; DC-ASGD on g' (optional);
 *           residual: u = r + g', held chunks keep u in r, sent chunks go to
 *           `out` at their packed place and r is zeroed, and the L1 norm of
 *           the new r is summed on the way; dense: out = g'.
 *
 * Which chunks are held is decided before pass 2 on the host by
 * gddr_residual_plan_cpu() (the mask is integer hashing over chunks, no
 * gradient values): it updates the ages, writes the wire bitmap and gives
 * each chunk its rank among sent chunks, so the host knows how many floats
 * the push carries without waiting for the GPU, and one stream
 * synchronisation per step suffices.
 *
 * The CPU twin (fused.c) performs the same float operations in the same
 * order as clipping with gddr_scal_cpu(), then gddr_dc_cpu(), then
 * gddr_residual_step_cpu(): r, out, ms and the ages are bit-identical to
 * that unfused sequence. The L1 sum is accumulated in double in element
 * order, gddr_asum_cpu() in vector lanes: the two agree to ~1e-15 relative,
 * not bit for bit. The CUDA version (fused.cu) uses round-to-nearest
 * intrinsics in the same order, so it matches the twin bit for bit except
 * for the two double reductions, whose block order differs (deterministic
 * for a given n).
 */
#ifndef GDDR_KERNELS_FUSED_H
#define GDDR_KERNELS_FUSED_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "blas.h"
#include "dc.h"
#include "residual.h"

#ifdef __cplusplus
extern "C" {
#endif

/* rank[c] of a held chunk. */
#define GDDR_HELD UINT32_MAX

/* The hold decisions of one residual step (the mask of
 * gddr_residual_step_cpu(), no values touched): ages updated, bitmap fully
 * rewritten, rank[c] = index of chunk c among sent chunks or GDDR_HELD,
 * *npacked = floats the sent chunks hold, *nsent = chunks sent. age and
 * rank: nchunks entries; bitmap: gddr_bitmap_bytes(nchunks). */
int gddr_residual_plan_cpu(const gddr_residual_args *a, uint32_t *age, uint8_t *bitmap,
                           uint32_t *rank, size_t *npacked, size_t *nsent);

typedef struct gddr_fused_args {
    size_t n;          /* tensor length */
    uint32_t chunk;    /* residual: elements per chunk (as planned) */
    int residual;      /* 1: merge into r and pack by rank; 0: dense, out = g' */
    int dc;            /* 1: DC-ASGD with dca (dca.n is ignored) */
    gddr_dc_args dca;
} gddr_fused_args;

/* Buffers of pass 2: all host memory for the CPU twin, all device memory
 * for the CUDA version. */
typedef struct gddr_fused_bufs {
    const float *g;        /* n: the gradient as computed; never written */
    const float *w_new;    /* dc: n */
    const float *w_bak;    /* dc: n */
    float *ms;             /* dc adaptive: n, updated */
    float *r;              /* residual: n, updated */
    const uint32_t *rank;  /* residual: nchunks, from gddr_residual_plan_cpu() */
    float *out;            /* residual: sent chunks, packed; dense: n floats */
    double *l1;            /* residual: receives sum |r| after the pass (may be NULL) */
    const float *ctl;      /* ctl[0]: factor g is multiplied by; ctl[1] != 0: go. When
                            * ctl[1] == 0 nothing is written (not r, ms, out, l1). */
} gddr_fused_bufs;

int gddr_fused_cpu(const gddr_fused_args *a, const gddr_fused_bufs *b);

/* Pass 2 on the context's stream; returns without waiting. */
int gddr_fused_cuda(gddr_cuda_ctx *ctx, const gddr_fused_args *a, const gddr_fused_bufs *b);

/* Pass 1 on the device: *d_out (device memory) = sum of x[i]^2 in double,
 * queued on the context's stream. Its CPU twin is gddr_sumsq_cpu() (the
 * same sum in another order: equal to ~1e-15 relative). */
int gddr_sumsq_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *d_out);

/* The clip rule on the device: d_ctl[0..1] = gddr_clip_ctl(d_sumsq[0..nt-1]),
 * one thread, queued on the context's stream. */
int gddr_clip_cuda(gddr_cuda_ctx *ctx, const double *d_sumsq, int nt, double clip,
                   float *d_ctl);

/* Plugin-internal: the context's scratch for block partial sums
 * (GDDR_REDUCE_BLOCKS doubles). */
#define GDDR_REDUCE_BLOCKS 1024
double *gddr__cuda_ctx_partials(gddr_cuda_ctx *ctx);

#ifdef __CUDACC__
#define GDDR_HOSTDEV __host__ __device__
#else
#define GDDR_HOSTDEV
#endif

/* docs/design.md section 6 step 2 from every tensor's sum of squares, exactly
 * as step.c's host path computes it (nrm_i = sqrt(sumsq_i),
 * total = sqrt(sum of nrm_i^2) in tensor order): ctl[0] = clip / total when
 * clip > 0 and total > clip, else 1; ctl[1] = 1 when every norm is finite,
 * else 0. x - x == 0 is the finiteness test usable on host and device. */
GDDR_HOSTDEV static inline void gddr_clip_ctl(const double *sumsq, int nt, double clip,
                                              float *ctl)
{
    double total = 0.0;
    int ok = 1;
    for (int i = 0; i < nt; i++) {
        const double nrm = sqrt(sumsq[i]);
        if (!(nrm - nrm == 0.0))
            ok = 0;
        total += nrm * nrm;
    }
    total = sqrt(total);
    ctl[0] = ok && clip > 0 && total > clip ? (float)(clip / total) : 1.0f;
    ctl[1] = ok ? 1.0f : 0.0f;
}

#ifdef __cplusplus
}
#endif
#endif /* GDDR_KERNELS_FUSED_H */
