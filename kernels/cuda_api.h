/* cuda_api.h -- the table between libgddr-client and its CUDA plugin.
 *
 * libgddr-client links no CUDA library. Every `_cuda` function of kernels/
 * and the CUDA context, memory and stream helpers of blas.h live in a
 * separate shared object, libgddr-cuda.so (cuda_rt.c, cuda_err.c, the .cu
 * files and the table in cuda_plugin.c), which links cudart and cuBLAS. The client library loads it with dlopen()
 * the first time a caller hands it device memory (or asks
 * gddr_cuda_available()), and calls it through this table;
 * cuda_loader.c holds the client side, with one forwarding function per
 * entry, so the rest of the library calls the functions of blas.h, dc.h,
 * residual.h and fused.h as if they were linked in.
 *
 * The plugin exports exactly one symbol, GDDR_CUDA_ENTRY, which returns its
 * table. A table whose abi or size differs from this header's is refused
 * (a plugin left over from another build), with the reason reported.
 *
 * Errors: every plugin function that fails leaves a message for the calling
 * thread ("file:line: call: CUDA's own message"); the loader takes it right
 * after the failing call, and gddr_cuda_errmsg() returns it, so the client
 * reports it through its own logger and gddr_client_errmsg().
 */
#ifndef GDDR_KERNELS_CUDA_API_H
#define GDDR_KERNELS_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "blas.h"
#include "dc.h"
#include "fused.h"
#include "replay.h"
#include "residual.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Raise on any change of this header's table or of a signature in it. */
#define GDDR_CUDA_ABI 2u
#define GDDR_CUDA_ENTRY "gddr_cuda_plugin_entry"
#define GDDR_CUDA_PLUGIN_FILE "libgddr-cuda.so"

/* Every int-returning call: X(name, parameters, arguments, prologue). The
 * loader's forwarder of each runs the prologue (clears an out pointer, or
 * accepts freeing NULL without loading anything), then returns
 * GDDR_ENOTSUP while no plugin is loaded. */
#define GDDR_CUDA_CALLS(X)                                                                         \
    X(gddr_cuda_ctx_create, (gddr_cuda_ctx * *out), (out), if (out) *out = NULL;)                  \
    X(gddr_nrm2_cuda, (gddr_cuda_ctx * ctx, const float *d_x, size_t n, double *out),              \
      (ctx, d_x, n, out), )                                                                        \
    X(gddr_asum_cuda, (gddr_cuda_ctx * ctx, const float *d_x, size_t n, double *out),              \
      (ctx, d_x, n, out), )                                                                        \
    X(gddr_scal_cuda, (gddr_cuda_ctx * ctx, float *d_x, size_t n, float a), (ctx, d_x, n, a), )    \
    X(gddr_axpy_cuda, (gddr_cuda_ctx * ctx, float *d_y, const float *d_x, size_t n, float a),      \
      (ctx, d_y, d_x, n, a), )                                                                     \
    X(gddr_cuda_malloc, (void **p, size_t bytes), (p, bytes), if (p) *p = NULL;)                   \
    X(gddr_cuda_free, (void *p), (p), if (!p) return GDDR_OK;)                                     \
    X(gddr_cuda_memcpy_h2d, (void *dst, const void *src, size_t bytes, void *stream),              \
      (dst, src, bytes, stream), )                                                                 \
    X(gddr_cuda_memcpy_d2h, (void *dst, const void *src, size_t bytes, void *stream),              \
      (dst, src, bytes, stream), )                                                                 \
    X(gddr_cuda_memcpy_d2d, (void *dst, const void *src, size_t bytes, void *stream),              \
      (dst, src, bytes, stream), )                                                                 \
    X(gddr_cuda_host_alloc, (void **p, size_t bytes), (p, bytes), if (p) *p = NULL;)               \
    X(gddr_cuda_host_free, (void *p), (p), if (!p) return GDDR_OK;)                                \
    X(gddr_cuda_sync, (void *stream), (stream), )                                                  \
    X(gddr_cuda_get_device, (int *dev), (dev), )                                                   \
    X(gddr_cuda_set_device, (int dev), (dev), )                                                    \
    X(gddr_residual_step_cuda,                                                                     \
      (const gddr_residual_args *a, const float *d_g, float *d_r, uint32_t *d_age,                 \
       float *d_packed, uint8_t *d_bitmap, size_t *npacked, size_t *nsent, void *stream),          \
      (a, d_g, d_r, d_age, d_packed, d_bitmap, npacked, nsent, stream), )                          \
    X(gddr_chunk_scores_cuda,                                                                      \
      (const float *d_g, const float *d_r, size_t n, uint32_t chunk, double *d_score,              \
       void *stream),                                                                              \
      (d_g, d_r, n, chunk, d_score, stream), )                                                     \
    X(gddr_pack_cuda,                                                                              \
      (const float *d_src, size_t n, uint32_t chunk, const uint8_t *d_bitmap, float *d_packed,     \
       size_t *npacked, void *stream),                                                             \
      (d_src, n, chunk, d_bitmap, d_packed, npacked, stream), )                                    \
    X(gddr_unpack_cuda,                                                                            \
      (const float *d_packed, const uint8_t *d_bitmap, size_t n, uint32_t chunk, float scale,      \
       int accumulate, float *d_dense, void *stream),                                              \
      (d_packed, d_bitmap, n, chunk, scale, accumulate, d_dense, stream), )                        \
    X(gddr_dc_cuda,                                                                                \
      (const gddr_dc_args *a, float *d_g, const float *d_w_new, const float *d_w_bak,              \
       float *d_ms, void *stream),                                                                 \
      (a, d_g, d_w_new, d_w_bak, d_ms, stream), )                                                  \
    X(gddr_replay_cuda, (float *d_r, float *d_rem, size_t n, float gamma, int last, void *stream), \
      (d_r, d_rem, n, gamma, last, stream), )                                                      \
    X(gddr_sumsq_cuda, (gddr_cuda_ctx * ctx, const float *d_x, size_t n, double *d_out),           \
      (ctx, d_x, n, d_out), )                                                                      \
    X(gddr_clip_cuda, (gddr_cuda_ctx * ctx, const double *d_sumsq, int nt, double clip,            \
                       float *d_ctl),                                                              \
      (ctx, d_sumsq, nt, clip, d_ctl), )                                                           \
    X(gddr_fused_cuda, (gddr_cuda_ctx * ctx, const gddr_fused_args *a, const gddr_fused_bufs *b),  \
      (ctx, a, b), )

typedef struct gddr_cuda_api {
    uint32_t abi;  /* GDDR_CUDA_ABI */
    uint32_t size; /* sizeof(gddr_cuda_api) */
    /* Copies the calling thread's last error message into buf (always
     * terminated) and clears it; returns its length (0: none). */
    size_t (*take_error)(char *buf, size_t len);
    int (*available)(char *why, size_t whylen);
    void (*ctx_destroy)(gddr_cuda_ctx **ctx);
    void *(*ctx_stream)(gddr_cuda_ctx *ctx);
    int (*is_device_ptr)(const void *p);
#define GDDR__CUDA_API_MEMBER(name, params, args, prologue) int(*name) params;
    GDDR_CUDA_CALLS(GDDR__CUDA_API_MEMBER)
#undef GDDR__CUDA_API_MEMBER
} gddr_cuda_api;

typedef const gddr_cuda_api *(*gddr_cuda_entry_fn)(void);

/* A plugin's table: the five special entries by name, every call of
 * GDDR_CUDA_CALLS by the function of the same name. */
#define GDDR__CUDA_TABLE_ENTRY(name, params, args, prologue) .name = name,
#define GDDR_CUDA_TABLE(take_error_fn, available_fn, ctx_destroy_fn, ctx_stream_fn, is_dev_fn) \
    {                                                                                          \
        .abi = GDDR_CUDA_ABI, .size = sizeof(gddr_cuda_api), .take_error = take_error_fn,      \
        .available = available_fn, .ctx_destroy = ctx_destroy_fn,                              \
        .ctx_stream = ctx_stream_fn, .is_device_ptr = is_dev_fn,                               \
        GDDR_CUDA_CALLS(GDDR__CUDA_TABLE_ENTRY)                                                \
    }

#ifdef __cplusplus
}
#endif
#endif /* GDDR_KERNELS_CUDA_API_H */
