/* blas.c -- CPU norms and vector updates, and (with CUDA) the context,
 * memory and cuBLAS wrappers declared in blas.h.
 *
 * The CUDA half is host code only, so gcc compiles it against the CUDA
 * runtime and cuBLAS C headers; the one kernel it needs (the probe) lives in
 * blas.cu. Without GDDR_HAVE_CUDA only the CPU half is built and cuda_stub.c
 * supplies the rest.
 */
#include "blas.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gddr/gddr.h"
#include "log.h"

double gddr_nrm2_cpu(const float *x, size_t n)
{
    /* Double accumulation keeps the norm of a 100M-float gradient accurate
     * to float precision without cuBLAS's scaling passes. */
    /* Four partial sums break the add-latency chain so the loop runs at
     * memory speed instead of one add every few cycles. */
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)x[i] * (double)x[i];
        s1 += (double)x[i + 1] * (double)x[i + 1];
        s2 += (double)x[i + 2] * (double)x[i + 2];
        s3 += (double)x[i + 3] * (double)x[i + 3];
    }
    for (; i < n; i++)
        s0 += (double)x[i] * (double)x[i];
    return sqrt((s0 + s1) + (s2 + s3));
}

double gddr_asum_cpu(const float *x, size_t n)
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += fabs((double)x[i]);
        s1 += fabs((double)x[i + 1]);
        s2 += fabs((double)x[i + 2]);
        s3 += fabs((double)x[i + 3]);
    }
    for (; i < n; i++)
        s0 += fabs((double)x[i]);
    return (s0 + s1) + (s2 + s3);
}

void gddr_scal_cpu(float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}

void gddr_axpy_cpu(float *y, const float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        y[i] = y[i] + a * x[i];
}

#ifdef GDDR_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

struct gddr_cuda_ctx {
    cudaStream_t stream;
    cublasHandle_t blas;
};

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
        gddr_log(GDDR_LOG_ERROR, "%s:%d: cudaStreamCreateWithFlags: %s", __FILE__, __LINE__,
                 cudaGetErrorString(e));
        free(c);
        return GDDR_ECUDA;
    }
    cublasStatus_t s = cublasCreate(&c->blas);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasSetStream(c->blas, c->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        gddr_log(GDDR_LOG_ERROR, "%s:%d: cublasCreate/cublasSetStream: %s", __FILE__, __LINE__,
                 cublasGetStatusString(s));
        if (c->blas)
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

#endif /* GDDR_HAVE_CUDA */
