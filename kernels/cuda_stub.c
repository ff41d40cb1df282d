/* cuda_stub.c -- every CUDA entry point of kernels/ for a build without nvcc.
 *
 * The client library calls the _cuda functions whenever a gradient is a
 * device pointer; in a CPU-only build no pointer is one
 * (gddr_cuda_is_device_ptr() is 0), so these are reached only by callers
 * that insist, and they answer GDDR_ENOTSUP rather than fail to link. With
 * GDDR_HAVE_CUDA the real definitions live in blas.c and the .cu files and
 * this file compiles to nothing.
 */
#include "gddr/gddr.h"

#ifndef GDDR_HAVE_CUDA

#include <stdio.h>

#include "blas.h"
#include "dc.h"
#include "replay.h"
#include "residual.h"

int gddr_cuda_available(char *why, size_t whylen)
{
    if (why && whylen)
        snprintf(why, whylen, "built without CUDA (no nvcc at build time)");
    return 0;
}

int gddr__cuda_probe(char *why, size_t whylen)
{
    return gddr_cuda_available(why, whylen);
}

int gddr_cuda_ctx_create(gddr_cuda_ctx **out)
{
    if (out)
        *out = NULL;
    return GDDR_ENOTSUP;
}

void gddr_cuda_ctx_destroy(gddr_cuda_ctx **ctx)
{
    if (ctx)
        *ctx = NULL;
}

void *gddr_cuda_ctx_stream(gddr_cuda_ctx *ctx) { return NULL; }
int gddr_cuda_is_device_ptr(const void *p) { return 0; }

int gddr_nrm2_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *out)
{
    return GDDR_ENOTSUP;
}
int gddr_asum_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *out)
{
    return GDDR_ENOTSUP;
}
int gddr_scal_cuda(gddr_cuda_ctx *ctx, float *d_x, size_t n, float a) { return GDDR_ENOTSUP; }
int gddr_axpy_cuda(gddr_cuda_ctx *ctx, float *d_y, const float *d_x, size_t n, float a)
{
    return GDDR_ENOTSUP;
}

int gddr_cuda_malloc(void **p, size_t bytes)
{
    if (p)
        *p = NULL;
    return GDDR_ENOTSUP;
}
/* Freeing NULL is fine everywhere, so the stubs accept it. */
int gddr_cuda_free(void *p) { return p ? GDDR_ENOTSUP : GDDR_OK; }
int gddr_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes, void *stream)
{
    return GDDR_ENOTSUP;
}
int gddr_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes, void *stream)
{
    return GDDR_ENOTSUP;
}
int gddr_cuda_host_alloc(void **p, size_t bytes)
{
    if (p)
        *p = NULL;
    return GDDR_ENOTSUP;
}
int gddr_cuda_host_free(void *p) { return p ? GDDR_ENOTSUP : GDDR_OK; }
int gddr_cuda_sync(void *stream) { return GDDR_ENOTSUP; }

int gddr_residual_step_cuda(const gddr_residual_args *a, const float *d_g, float *d_r,
                            uint32_t *d_age, float *d_packed, uint8_t *d_bitmap,
                            size_t *npacked, size_t *nsent, void *stream)
{
    return GDDR_ENOTSUP;
}
int gddr_pack_cuda(const float *d_src, size_t n, uint32_t chunk, const uint8_t *d_bitmap,
                   float *d_packed, size_t *npacked, void *stream)
{
    return GDDR_ENOTSUP;
}
int gddr_unpack_cuda(const float *d_packed, const uint8_t *d_bitmap, size_t n, uint32_t chunk,
                     float scale, int accumulate, float *d_dense, void *stream)
{
    return GDDR_ENOTSUP;
}

int gddr_dc_cuda(const gddr_dc_args *a, float *d_g, const float *d_w_new, const float *d_w_bak,
                 float *d_ms, void *stream)
{
    return GDDR_ENOTSUP;
}

int gddr_replay_cuda(float *d_r, float *d_rem, size_t n, float gamma, int last, void *stream)
{
    return GDDR_ENOTSUP;
}

#else
/* ISO C wants at least one declaration per translation unit. */
typedef int gddr__cuda_stub_unused;
#endif /* GDDR_HAVE_CUDA */
