/* fake_cuda.c -- a stand-in for libgddr-cuda.so that runs on the CPU.
 *
 * No GPU is lent to most test runs, yet the client's device path (step.c)
 * is where the fused passes, the one wait per step and the error routing
 * live. This plugin serves the same table (kernels/cuda_api.h) over host
 * memory: "device" allocations are malloc()ed blocks kept in a registry,
 * so gddr_cuda_is_device_ptr() tells them from the caller's host memory,
 * and every copy checks that its device side is one of them (a host/device
 * mix-up in step.c fails the test instead of passing by accident). New
 * device memory is filled with NaN bit patterns, so reading what was never
 * written shows. The kernels are the CPU twins. Streams are synchronous;
 * gddr_fake_cuda_syncs() counts the waits, and gddr_fake_cuda_fail(name)
 * makes the next call of that name fail with GDDR_ECUDA and a message, the
 * way a CUDA error would.
 *
 * It says nothing about the real kernels (tests/check_kernels.c holds those
 * against the twins on a GPU); it tests the orchestration around them.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "gddr/gddr.h"

struct gddr_cuda_ctx {
    int unused;
};

#define MAX_BLOCKS 4096
static struct {
    char *p;
    size_t n;
} blocks[MAX_BLOCKS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int syncs;
static char fail_next[64];
static __thread char err[256];

__attribute__((visibility("default"))) void gddr_fake_cuda_fail(const char *name)
{
    pthread_mutex_lock(&mu);
    snprintf(fail_next, sizeof fail_next, "%s", name ? name : "");
    pthread_mutex_unlock(&mu);
}

__attribute__((visibility("default"))) int gddr_fake_cuda_syncs(void)
{
    pthread_mutex_lock(&mu);
    int n = syncs;
    pthread_mutex_unlock(&mu);
    return n;
}

static int fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, sizeof err, fmt, ap);
    va_end(ap);
    return rc;
}

/* The injected failure, once. */
static int injected(const char *name)
{
    pthread_mutex_lock(&mu);
    int hit = strcmp(fail_next, name) == 0;
    if (hit)
        fail_next[0] = 0;
    pthread_mutex_unlock(&mu);
    if (hit)
        fail(GDDR_ECUDA, "fake_cuda: %s: injected failure (an illegal memory access, say)", name);
    return hit;
}

#define INJECT(name)                                                                          \
    do {                                                                                      \
        if (injected(name))                                                                   \
            return GDDR_ECUDA;                                                                \
    } while (0)

/* The block that holds [p, p + n), or -1. */
static int find(const void *p, size_t n)
{
    const char *c = p;
    int at = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_BLOCKS && at < 0; i++)
        if (blocks[i].p && c >= blocks[i].p && c + n <= blocks[i].p + blocks[i].n)
            at = i;
    pthread_mutex_unlock(&mu);
    return at;
}

#define DEV(p, bytes, what)                                                                   \
    do {                                                                                      \
        if ((bytes) != 0 && find((p), (bytes)) < 0)                                           \
            return fail(GDDR_EINVAL, "fake_cuda: %s: %p (%zu bytes) is not device memory",    \
                        what, (const void *)(p), (size_t)(bytes));                            \
    } while (0)

static size_t take_error(char *buf, size_t len)
{
    size_t n = strlen(err);
    if (buf && len)
        snprintf(buf, len, "%s", err);
    err[0] = 0;
    return n;
}

static int available(char *why, size_t whylen)
{
    if (why && whylen)
        snprintf(why, whylen, "fake CUDA plugin (host memory, CPU twins)");
    return 1;
}

int gddr_cuda_ctx_create(gddr_cuda_ctx **out)
{
    INJECT("gddr_cuda_ctx_create");
    *out = calloc(1, sizeof **out);
    return *out ? GDDR_OK : GDDR_ENOMEM;
}

static void ctx_destroy(gddr_cuda_ctx **ctx)
{
    if (ctx) {
        free(*ctx);
        *ctx = NULL;
    }
}

static void *ctx_stream(gddr_cuda_ctx *ctx)
{
    return ctx;
}

static int is_device_ptr(const void *p)
{
    return p && find(p, 1) >= 0;
}

int gddr_cuda_malloc(void **p, size_t bytes)
{
    INJECT("gddr_cuda_malloc");
    size_t n = bytes ? bytes : 1;
    char *m = malloc(n);
    if (!m)
        return fail(GDDR_ENOMEM, "fake_cuda: out of memory");
    memset(m, 0xff, n); /* NaN floats: what was never written shows */
    pthread_mutex_lock(&mu);
    int slot = -1;
    for (int i = 0; i < MAX_BLOCKS && slot < 0; i++)
        if (!blocks[i].p)
            slot = i;
    if (slot >= 0) {
        blocks[slot].p = m;
        blocks[slot].n = n;
    }
    pthread_mutex_unlock(&mu);
    if (slot < 0) {
        free(m);
        return fail(GDDR_ENOMEM, "fake_cuda: too many blocks");
    }
    *p = m;
    return GDDR_OK;
}

int gddr_cuda_free(void *p)
{
    int i = find(p, 1);
    if (i < 0 || blocks[i].p != p)
        return fail(GDDR_EINVAL, "fake_cuda: free of %p, not a device block", p);
    pthread_mutex_lock(&mu);
    blocks[i].p = NULL;
    pthread_mutex_unlock(&mu);
    free(p);
    return GDDR_OK;
}

int gddr_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes, void *stream)
{
    INJECT("gddr_cuda_memcpy_h2d");
    DEV(dst, bytes, "h2d destination");
    if (bytes && find(src, 1) >= 0)
        return fail(GDDR_EINVAL, "fake_cuda: h2d from device memory");
    if (bytes)
        memcpy(dst, src, bytes);
    return GDDR_OK;
}

int gddr_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes, void *stream)
{
    INJECT("gddr_cuda_memcpy_d2h");
    DEV(src, bytes, "d2h source");
    if (bytes && find(dst, 1) >= 0)
        return fail(GDDR_EINVAL, "fake_cuda: d2h into device memory");
    if (bytes)
        memcpy(dst, src, bytes);
    return GDDR_OK;
}

int gddr_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
    INJECT("gddr_cuda_memcpy_d2d");
    DEV(dst, bytes, "d2d destination");
    DEV(src, bytes, "d2d source");
    if (bytes)
        memmove(dst, src, bytes);
    return GDDR_OK;
}

int gddr_cuda_host_alloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    return *p ? GDDR_OK : GDDR_ENOMEM;
}

int gddr_cuda_host_free(void *p)
{
    free(p);
    return GDDR_OK;
}

int gddr_cuda_sync(void *stream)
{
    INJECT("gddr_cuda_sync");
    pthread_mutex_lock(&mu);
    syncs++;
    pthread_mutex_unlock(&mu);
    return GDDR_OK;
}

int gddr_cuda_get_device(int *dev)
{
    *dev = 0;
    return GDDR_OK;
}

int gddr_cuda_set_device(int dev)
{
    return dev == 0 ? GDDR_OK : fail(GDDR_EINVAL, "fake_cuda: no device %d", dev);
}

int gddr_nrm2_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *out)
{
    DEV(d_x, n * 4, "nrm2");
    *out = gddr_nrm2_cpu(d_x, n);
    return GDDR_OK;
}

int gddr_asum_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *out)
{
    DEV(d_x, n * 4, "asum");
    *out = gddr_asum_cpu(d_x, n);
    return GDDR_OK;
}

int gddr_scal_cuda(gddr_cuda_ctx *ctx, float *d_x, size_t n, float a)
{
    DEV(d_x, n * 4, "scal");
    gddr_scal_cpu(d_x, n, a);
    return GDDR_OK;
}

int gddr_axpy_cuda(gddr_cuda_ctx *ctx, float *d_y, const float *d_x, size_t n, float a)
{
    DEV(d_y, n * 4, "axpy");
    DEV(d_x, n * 4, "axpy");
    gddr_axpy_cpu(d_y, d_x, n, a);
    return GDDR_OK;
}

int gddr_residual_step_cuda(const gddr_residual_args *a, const float *d_g, float *d_r,
                            uint32_t *d_age, float *d_packed, uint8_t *d_bitmap, size_t *npacked,
                            size_t *nsent, void *stream)
{
    return gddr_residual_step_cpu(a, d_g, d_r, d_age, d_packed, d_bitmap, npacked, nsent);
}

int gddr_pack_cuda(const float *d_src, size_t n, uint32_t chunk, const uint8_t *d_bitmap,
                   float *d_packed, size_t *npacked, void *stream)
{
    return gddr_pack_cpu(d_src, n, chunk, d_bitmap, d_packed, npacked);
}

int gddr_unpack_cuda(const float *d_packed, const uint8_t *d_bitmap, size_t n, uint32_t chunk,
                     float scale, int accumulate, float *d_dense, void *stream)
{
    return gddr_unpack_cpu(d_packed, d_bitmap, n, chunk, scale, accumulate, d_dense);
}

int gddr_dc_cuda(const gddr_dc_args *a, float *d_g, const float *d_w_new, const float *d_w_bak,
                 float *d_ms, void *stream)
{
    return gddr_dc_cpu(a, d_g, d_w_new, d_w_bak, d_ms);
}

int gddr_replay_cuda(float *d_r, float *d_rem, size_t n, float gamma, int last, void *stream)
{
    return gddr_replay_cpu(d_r, d_rem, n, gamma, last);
}

int gddr_chunk_scores_cuda(const float *d_g, const float *d_r, size_t n, uint32_t chunk,
                           double *d_score, void *stream)
{
    (void)stream;
    INJECT("gddr_chunk_scores_cuda");
    if (d_g)
        DEV(d_g, n * 4, "scores g");
    DEV(d_r, n * 4, "scores r");
    DEV(d_score, gddr_nchunks(n, chunk) * sizeof *d_score, "scores");
    return gddr_chunk_scores_cpu(d_g, d_r, n, chunk, d_score);
}

int gddr_sumsq_cuda(gddr_cuda_ctx *ctx, const float *d_x, size_t n, double *d_out)
{
    INJECT("gddr_sumsq_cuda");
    DEV(d_x, n * 4, "sum of squares input");
    DEV(d_out, sizeof *d_out, "sum of squares output");
    *d_out = gddr_sumsq_cpu(d_x, n);
    return GDDR_OK;
}

int gddr_clip_cuda(gddr_cuda_ctx *ctx, const double *d_sumsq, int nt, double clip, float *d_ctl)
{
    DEV(d_sumsq, (size_t)nt * sizeof *d_sumsq, "clip input");
    DEV(d_ctl, 2 * sizeof *d_ctl, "clip output");
    gddr_clip_ctl(d_sumsq, nt, clip, d_ctl);
    return GDDR_OK;
}

int gddr_fused_cuda(gddr_cuda_ctx *ctx, const gddr_fused_args *a, const gddr_fused_bufs *b)
{
    INJECT("gddr_fused_cuda");
    const size_t n4 = a->n * 4;
    DEV(b->g, n4, "fused g");
    DEV(b->ctl, 2 * sizeof *b->ctl, "fused ctl");
    if (a->residual) {
        DEV(b->r, n4, "fused r");
        DEV(b->rank, gddr_nchunks(a->n, a->chunk) * 4, "fused rank");
    }
    if (a->dc) {
        DEV(b->w_new, n4, "fused w_new");
        DEV(b->w_bak, n4, "fused w_bak");
        if (a->dca.adaptive)
            DEV(b->ms, n4, "fused ms");
    }
    if (b->l1)
        DEV(b->l1, sizeof *b->l1, "fused l1");
    return gddr_fused_cpu(a, b);
}

static const gddr_cuda_api table =
    GDDR_CUDA_TABLE(take_error, available, ctx_destroy, ctx_stream, is_device_ptr);

__attribute__((visibility("default"))) const gddr_cuda_api *gddr_cuda_plugin_entry(void)
{
    return &table;
}
