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
#include <string.h>

#include "gddr/gddr.h"
#include "log.h"

/* The CPU reductions run once per push on both ends, so they must keep up
 * with memory: 8 floats a turn, widened to double in two vector
 * accumulators (GCC vector extensions; the compiler picks SSE2, AVX2 or
 * AVX-512 at load time through target_clones). Double accumulation keeps
 * the norm of a 100M-float gradient accurate to float precision without
 * cuBLAS's scaling passes; a NaN or Inf anywhere makes the result NaN or
 * Inf, which is how the server checks finiteness in the same pass. */
typedef float gddr__v4f __attribute__((vector_size(16)));
typedef double gddr__v4d __attribute__((vector_size(32)));
typedef long long gddr__v4l __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define GDDR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GDDR_CLONES
#endif

/* Always inlined into the clones, so their 32-byte vector returns never
 * cross a call (-Wpsabi, silenced for this file in the Makefile, warns
 * about an ABI that is never used). */
static inline __attribute__((always_inline)) gddr__v4d widen(const float *p)
{
    gddr__v4f f;
    memcpy(&f, p, sizeof f);
    return __builtin_convertvector(f, gddr__v4d);
}

static inline __attribute__((always_inline)) gddr__v4d vabs(gddr__v4d a)
{
    const long long m = 0x7fffffffffffffffLL;
    return (gddr__v4d)((gddr__v4l)a & (gddr__v4l){ m, m, m, m });
}

GDDR_CLONES double gddr_nrm2_cpu(const float *x, size_t n)
{
    gddr__v4d s0 = { 0 }, s1 = { 0 };
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        gddr__v4d a = widen(x + i), b = widen(x + i + 4);
        s0 += a * a;
        s1 += b * b;
    }
    double s = 0.0;
    for (; i < n; i++)
        s += (double)x[i] * (double)x[i];
    gddr__v4d t = s0 + s1;
    return sqrt(((t[0] + t[1]) + (t[2] + t[3])) + s);
}

GDDR_CLONES double gddr_asum_cpu(const float *x, size_t n)
{
    gddr__v4d s0 = { 0 }, s1 = { 0 };
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        gddr__v4d a = widen(x + i), b = widen(x + i + 4);
        s0 += vabs(a);
        s1 += vabs(b);
    }
    double s = 0.0;
    for (; i < n; i++)
        s += fabs((double)x[i]);
    gddr__v4d t = s0 + s1;
    return ((t[0] + t[1]) + (t[2] + t[3])) + s;
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
