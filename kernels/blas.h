/* blas.h -- norms and vector updates, and the small CUDA runtime surface the
 * client library needs.
 *
 * Clipping (docs/design.md section 6 step 2) needs a global norm and a scale;
 * the worker's GPU path also needs a stream, a cuBLAS handle bound to it,
 * device and pinned allocations and copies. All of that is declared here as
 * plain C with streams passed as void *, so callers never include CUDA
 * headers.
 *
 * The CUDA half is not linked into libgddr-client: it lives in the plugin
 * libgddr-cuda.so (cuda_rt.c and the .cu files, see cuda_api.h), loaded on
 * first use by cuda_loader.c. Until it is loaded -- no NVIDIA driver, no
 * plugin found, or a build without nvcc -- every CUDA entry point returns
 * GDDR_ENOTSUP, gddr_cuda_is_device_ptr() answers from the driver alone, and
 * gddr_cuda_available() and gddr_cuda_errmsg() say why.
 */
#ifndef GDDR_KERNELS_BLAS_H
#define GDDR_KERNELS_BLAS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CPU twins. Pure functions of their arguments; the caller owns x and y. */
double gddr_sumsq_cpu(const float *x, size_t n);                /* sum of x^2, in double */
double gddr_nrm2_cpu(const float *x, size_t n);                 /* sqrt(gddr_sumsq_cpu()) */
double gddr_asum_cpu(const float *x, size_t n);                 /* sum of |x|, in double */
/* The same sums to float precision (relative error under ~2e-6), three times
 * faster: blocks of 1024 values summed in float, the blocks in double. NaN or
 * Inf in x gives NaN or Inf, as above; finite x a finite sum. For checks and
 * reported figures (a push's finiteness and norm, a residual's L1), not for
 * what scales values (clipping uses gddr_sumsq_cpu, as the CUDA path does). */
double gddr_sumsq_fp32_cpu(const float *x, size_t n);
/* 1 when x holds no NaN or Inf (one read: gddr_sumsq_fp32_cpu is finite). */
int gddr_finite_cpu(const float *x, size_t n);
double gddr_asum_fp32_cpu(const float *x, size_t n);
void gddr_scal_cpu(float *x, size_t n, float a);                /* x *= a */
void gddr_axpy_cpu(float *y, const float *x, size_t n, float a); /* y += a*x */

/* One CUDA stream and one cuBLAS handle bound to it, on the device current
 * when it was created. Opaque. A context must be used by one thread at a
 * time (cuBLAS handles are not thread-safe). */
typedef struct gddr_cuda_ctx gddr_cuda_ctx;

/* 1 when a usable GPU exists (the driver and the plugin load, a device is
 * present and a probe kernel runs); otherwise 0 and a reason in why (may be
 * NULL), e.g. "no NVIDIA driver (libcuda.so.1: ...)", "no CUDA device
 * (cudaGetDeviceCount: ...)" or "built without CUDA (no nvcc at build time)".
 * Loads the plugin and initialises the CUDA runtime in this process when it
 * can, so do not call it in a process that will fork() and use CUDA in the
 * child. */
int gddr_cuda_available(char *why, size_t whylen);

/* Creates a stream and a cuBLAS handle; on success *out owns them, released
 * by gddr_cuda_ctx_destroy(). */
int gddr_cuda_ctx_create(gddr_cuda_ctx **out);
/* Waits for the stream, releases everything and sets *ctx to NULL. NULL-safe. */
void gddr_cuda_ctx_destroy(gddr_cuda_ctx **ctx);
/* The context's cudaStream_t, borrowed (valid until destroy); NULL for NULL. */
void *gddr_cuda_ctx_stream(gddr_cuda_ctx *ctx);
/* 1 for device or managed memory, 0 for host memory or on any error (and
 * always 0 without CUDA). Never leaves a sticky CUDA error behind. Loads
 * nothing in a process that has not loaded the CUDA driver itself (no
 * device memory can exist there); when the driver is loaded but the plugin
 * cannot be, asks the driver (cuPointerGetAttribute), so device memory is
 * still recognised and refused with a reason rather than read as host
 * memory. */
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
int gddr_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream);
int gddr_cuda_host_alloc(void **p, size_t bytes);              /* pinned */
int gddr_cuda_host_free(void *p);                              /* NULL-safe */
int gddr_cuda_sync(void *stream);                              /* waits for the stream */
/* The calling thread's current device (cudaGetDevice / cudaSetDevice). */
int gddr_cuda_get_device(int *dev);
int gddr_cuda_set_device(int dev);

/* What the last failing CUDA call of this thread said ("file:line: call:
 * CUDA's message"), or why the CUDA plugin is not loaded; "" when nothing
 * failed. Valid until the thread's next CUDA call. Only the client side
 * (cuda_loader.c) defines it. */
const char *gddr_cuda_errmsg(void);

/* Internal: launches a one-thread kernel and waits for it, so "a device
 * exists" and "our kernels run on it" (right architecture, working driver)
 * are told apart. Defined in blas.cu, inside the plugin. */
int gddr__cuda_probe(char *why, size_t whylen);

/* Test hooks of cuda_loader.c. Loads the plugin at `path` now, skipping the
 * driver check and the search (GDDR_OK, or an error code and the reason in
 * why); GDDR_ESTATE when another plugin is loaded already. */
int gddr__cuda_plugin_load(const char *path, char *why, size_t whylen);
/* The file of the loaded plugin and its dlopen handle; NULL when none. */
const char *gddr__cuda_plugin_path(void);
void *gddr__cuda_plugin_handle(void);

#ifdef __cplusplus
}
#endif
#endif /* GDDR_KERNELS_BLAS_H */
