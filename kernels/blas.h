/* blas.h -- norms and vector updates, and the small CUDA runtime surface the
 * client library needs.
 *
 * Clipping (DESIGN section 6 step 2) needs a global norm and a scale; the
 * worker's GPU path also needs a stream, a cuBLAS handle bound to it, device
 * and pinned allocations and copies. All of that is declared here as plain C
 * with streams passed as void *, so callers never include CUDA headers. In a
 * build without nvcc every CUDA entry point returns GDDR_ENOTSUP
 * (cuda_stub.c) and gddr_cuda_available() says why.
 */
#ifndef GDDR_KERNELS_BLAS_H
#define GDDR_KERNELS_BLAS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CPU twins. Pure functions of their arguments; the caller owns x and y. */
double gddr_nrm2_cpu(const float *x, size_t n);                 /* accumulates in double */
double gddr_asum_cpu(const float *x, size_t n);                 /* sum of |x|, in double */
void gddr_scal_cpu(float *x, size_t n, float a);                /* x *= a */
void gddr_axpy_cpu(float *y, const float *x, size_t n, float a); /* y += a*x */

/* One CUDA stream and one cuBLAS handle bound to it, on the device current
 * when it was created. Opaque. A context must be used by one thread at a
 * time (cuBLAS handles are not thread-safe). */
typedef struct gddr_cuda_ctx gddr_cuda_ctx;

/* 1 when a usable GPU exists (a device is present and a probe kernel runs);
 * otherwise 0 and a reason in why (may be NULL), e.g. "no CUDA device
 * (cudaGetDeviceCount: ...)" or "built without CUDA (no nvcc at build time)".
 * Initialises the CUDA runtime in this process when built with CUDA, so do
 * not call it in a process that will fork() and use CUDA in the child. */
int gddr_cuda_available(char *why, size_t whylen);

/* Creates a stream and a cuBLAS handle; on success *out owns them, released
 * by gddr_cuda_ctx_destroy(). */
int gddr_cuda_ctx_create(gddr_cuda_ctx **out);
/* Waits for the stream, releases everything and sets *ctx to NULL. NULL-safe. */
void gddr_cuda_ctx_destroy(gddr_cuda_ctx **ctx);
/* The context's cudaStream_t, borrowed (valid until destroy); NULL for NULL. */
void *gddr_cuda_ctx_stream(gddr_cuda_ctx *ctx);
/* 1 for device or managed memory, 0 for host memory or on any error (and
 * always 0 without CUDA). Never leaves a sticky CUDA error behind. */
int gddr_cuda_is_device_ptr(const void *p);

/* cuBLAS on the context's stream. nrm2 waits for the result (host pointer
 * mode); scal and axpy are queued and return at once. */
int gddr_nrm2_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *out);
int gddr_asum_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *out);
int gddr_scal_cuda(gddr_cuda_ctx *ctx, float *d_x, size_t n, float a);
int gddr_axpy_cuda(gddr_cuda_ctx *ctx, float *d_y, const float *d_x, size_t n, float a);

/* Memory. The caller owns what it allocates and frees it with the matching
 * free. Copies are queued on `stream` (NULL = default stream); pageable host
 * memory makes them effectively synchronous, pinned memory does not. */
int gddr_cuda_malloc(void **p, size_t bytes);
int gddr_cuda_free(void *p);                                   /* NULL-safe */
int gddr_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes, void *stream);
int gddr_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes, void *stream);
int gddr_cuda_host_alloc(void **p, size_t bytes);              /* pinned */
int gddr_cuda_host_free(void *p);                              /* NULL-safe */
int gddr_cuda_sync(void *stream);                              /* waits for the stream */

/* Internal: launches a one-thread kernel and waits for it, so "a device
 * exists" and "our kernels run on it" (right architecture, working driver)
 * are told apart. Defined in blas.cu. */
int gddr__cuda_probe(char *why, size_t whylen);

/* Error wrappers for the files that call CUDA (they must include the CUDA
 * runtime and cuBLAS headers and log.h before expanding these). Each logs
 * file:line, the failing call and CUDA's own message, then returns
 * GDDR_ECUDA, or stores it in `rc` and jumps to `label` (the _GOTO forms,
 * for functions that must release scratch memory first). */
#define GDDR_CUDA_TRY(call)                                                     \
    do {                                                                        \
        cudaError_t gddr__e = (call);                                           \
        if (gddr__e != cudaSuccess) {                                           \
            gddr_log(GDDR_LOG_ERROR, "%s:%d: %s: %s", __FILE__, __LINE__, #call, \
                     cudaGetErrorString(gddr__e));                              \
            return GDDR_ECUDA;                                                  \
        }                                                                       \
    } while (0)

#define GDDR_CUDA_TRY_GOTO(call, rc, label)                                     \
    do {                                                                        \
        cudaError_t gddr__e = (call);                                           \
        if (gddr__e != cudaSuccess) {                                           \
            gddr_log(GDDR_LOG_ERROR, "%s:%d: %s: %s", __FILE__, __LINE__, #call, \
                     cudaGetErrorString(gddr__e));                              \
            (rc) = GDDR_ECUDA;                                                  \
            goto label;                                                         \
        }                                                                       \
    } while (0)

#define GDDR_CUBLAS_TRY(call)                                                   \
    do {                                                                        \
        cublasStatus_t gddr__s = (call);                                        \
        if (gddr__s != CUBLAS_STATUS_SUCCESS) {                                 \
            gddr_log(GDDR_LOG_ERROR, "%s:%d: %s: %s", __FILE__, __LINE__, #call, \
                     cublasGetStatusString(gddr__s));                           \
            return GDDR_ECUDA;                                                  \
        }                                                                       \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* GDDR_KERNELS_BLAS_H */
