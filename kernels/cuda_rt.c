/* cuda_rt.c -- the host side of the CUDA plugin libgddr-cuda.so: the
 * context (stream + cuBLAS handle), memory and copies, cuBLAS norms,
 * pointer classification and the availability probe. The per-thread
 * error message is cuda_err.c, the table the client library calls through
 * (cuda_api.h) cuda_plugin.c.
 *
 * Host code only, so gcc compiles it against the CUDA runtime and cuBLAS C
 * headers; the kernels are in the .cu files of this folder. This file and
 * the .cu files are the only ones that link cudart and cuBLAS, and only
 * into the plugin: libgddr-client itself links no CUDA library.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "cuda_api.h"
#include "cuda_err.h"
#include "fused.h"
#include "gddr_base.h"

/* The context: one stream, a cuBLAS handle bound to it, and scratch for
 * the block partial sums of the reductions in fused.cu (ctx_scratch()). */
struct gddr_cuda_ctx {
    cudaStream_t stream;
    cublasHandle_t blas;
    double *partials;
};

double *gddr__cuda_ctx_partials(gddr_cuda_ctx *ctx)
{
    return ctx ? ctx->partials : NULL;
}

int gddr_cuda_available(char *why, size_t whylen)
{
    char scratch[8];
    if (!why) {
        why = scratch;
        whylen = sizeof scratch;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, whylen, "no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return 0;
    }
    if (count == 0) {
        snprintf(why, whylen, "no CUDA device (cudaGetDeviceCount: 0 devices)");
        return 0;
    }
    /* The residual step takes its scratch memory from the stream-ordered
     * allocator, which every supported GPU has but a few virtualised ones
     * do not; better to say so here than fail mid-training. */
    int dev = 0, pools = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess) {
        snprintf(why, whylen, "CUDA device query failed (%s)",
                 cudaGetErrorString(cudaGetLastError()));
        return 0;
    }
    if (!pools) {
        snprintf(why, whylen, "CUDA device %d lacks stream-ordered memory pools", dev);
        return 0;
    }
    if (!gddr__cuda_probe(why, whylen))
        return 0;
    snprintf(why, whylen, "CUDA device %d usable", dev);
    return 1;
}

int gddr_cuda_ctx_create(gddr_cuda_ctx **out)
{
    if (!out)
        return GDDR_EINVAL;
    *out = NULL;
    gddr_cuda_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return GDDR_ENOMEM;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        gddr__cuda_seterr("%s:%d: cudaStreamCreateWithFlags: %s", __FILE__, __LINE__,
                 cudaGetErrorString(e));
        free(c);
        return GDDR_ECUDA;
    }
    cublasStatus_t s = cublasCreate(&c->blas);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasSetStream(c->blas, c->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        gddr__cuda_seterr("%s:%d: cublasCreate/cublasSetStream: %s", __FILE__, __LINE__,
                 cublasGetStatusString(s));
        if (c->blas)
            cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        return GDDR_ECUDA;
    }
    e = cudaMalloc((void **)&c->partials, GDDR_REDUCE_BLOCKS * sizeof(double));
    if (e != cudaSuccess) {
        gddr__cuda_seterr("%s:%d: cudaMalloc (reduction scratch): %s", __FILE__, __LINE__,
                          cudaGetErrorString(e));
        cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        return GDDR_ECUDA;
    }
    *out = c;
    return GDDR_OK;
}

void gddr_cuda_ctx_destroy(gddr_cuda_ctx **ctx)
{
    if (!ctx || !*ctx)
        return;
    gddr_cuda_ctx *c = *ctx;
    /* Work still queued may use buffers the caller frees next; wait first. */
    cudaStreamSynchronize(c->stream);
    cudaFree(c->partials);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    free(c);
    *ctx = NULL;
}

void *gddr_cuda_ctx_stream(gddr_cuda_ctx *ctx)
{
    return ctx ? (void *)ctx->stream : NULL;
}

int gddr_cuda_is_device_ptr(const void *p)
{
    if (!p)
        return 0;
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        /* Older runtimes report plain host memory as an error; clear it so
         * it does not surface in the next unrelated check. */
        (void)cudaGetLastError();
        return 0;
    }
    return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

int gddr_nrm2_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *out)
{
    if (!ctx || !out || (n > 0 && !d_x))
        return GDDR_EINVAL;
    float r = 0.0f;
    if (n > 0)
        GDDR_CUBLAS_TRY(cublasSnrm2_64(ctx->blas, (int64_t)n, d_x, 1, &r));
    *out = r;
    return GDDR_OK;
}

int gddr_asum_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *out)
{
    if (!ctx || !out || (n > 0 && !d_x))
        return GDDR_EINVAL;
    float r = 0.0f;
    if (n > 0)
        GDDR_CUBLAS_TRY(cublasSasum_64(ctx->blas, (int64_t)n, d_x, 1, &r));
    *out = r;
    return GDDR_OK;
}

int gddr_scal_cuda(gddr_cuda_ctx *ctx, float *d_x, size_t n, float a)
{
    if (!ctx || (n > 0 && !d_x))
        return GDDR_EINVAL;
    if (n > 0)
        GDDR_CUBLAS_TRY(cublasSscal_64(ctx->blas, (int64_t)n, &a, d_x, 1));
    return GDDR_OK;
}

int gddr_axpy_cuda(gddr_cuda_ctx *ctx, float *d_y, const float *d_x, size_t n, float a)
{
    if (!ctx || (n > 0 && (!d_x || !d_y)))
        return GDDR_EINVAL;
    if (n > 0)
        GDDR_CUBLAS_TRY(cublasSaxpy_64(ctx->blas, (int64_t)n, &a, d_x, 1, d_y, 1));
    return GDDR_OK;
}

int gddr_cuda_malloc(void **p, size_t bytes)
{
    if (!p)
        return GDDR_EINVAL;
    *p = NULL;
    GDDR_CUDA_TRY(cudaMalloc(p, bytes ? bytes : 1));
    return GDDR_OK;
}

int gddr_cuda_free(void *p)
{
    if (p)
        GDDR_CUDA_TRY(cudaFree(p));
    return GDDR_OK;
}

int gddr_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0)
        return GDDR_OK;
    if (!dst || !src)
        return GDDR_EINVAL;
    GDDR_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    return GDDR_OK;
}

int gddr_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0)
        return GDDR_OK;
    if (!dst || !src)
        return GDDR_EINVAL;
    GDDR_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    return GDDR_OK;
}

int gddr_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0)
        return GDDR_OK;
    if (!dst || !src)
        return GDDR_EINVAL;
    GDDR_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    return GDDR_OK;
}

int gddr_cuda_host_alloc(void **p, size_t bytes)
{
    if (!p)
        return GDDR_EINVAL;
    *p = NULL;
    GDDR_CUDA_TRY(cudaMallocHost(p, bytes ? bytes : 1));
    return GDDR_OK;
}

int gddr_cuda_host_free(void *p)
{
    if (p)
        GDDR_CUDA_TRY(cudaFreeHost(p));
    return GDDR_OK;
}

int gddr_cuda_sync(void *stream)
{
    GDDR_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return GDDR_OK;
}

int gddr_cuda_get_device(int *dev)
{
    if (!dev)
        return GDDR_EINVAL;
    GDDR_CUDA_TRY(cudaGetDevice(dev));
    return GDDR_OK;
}

int gddr_cuda_set_device(int dev)
{
    GDDR_CUDA_TRY(cudaSetDevice(dev));
    return GDDR_OK;
}
