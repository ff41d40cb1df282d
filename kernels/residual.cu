/* residual.cu -- CUDA versions of the GDDR residual kernels (see residual.h).
 *
 * The step runs as four launches on the caller's stream:
 *   1. mask: one thread per chunk draws the hold decision from gddr_hash.h
 *      (bit-identical to the CPU twin), updates the age, writes a 0/1 "sent"
 *      flag, and each warp writes its 32 decisions as 4 bitmap bytes from one
 *      __ballot_sync, so no atomics touch the bitmap;
 *   2. an exclusive scan (CUB) of the flags gives every sent chunk its rank
 *      among sent chunks; since only the last chunk can be short, a sent
 *      chunk's place in the packed buffer is simply rank * chunk;
 *   3. merge/pack: one pass over the floats, u = r + g, written either to r
 *      (held) or to packed (sent, r zeroed), with float4 loads and stores
 *      when chunk and pointers allow;
 *   4. a one-thread kernel turns the last rank into the counts, which are
 *      copied back before the call returns.
 * Pack and unpack reuse 2-3 with the flags read from a bitmap instead.
 *
 * The number of chunks is n / chunk, small next to n, so the scan and the
 * flag arrays cost a few percent of the merge's memory traffic.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cub/device/device_scan.cuh>

#include "blas.h"
#include "cuda_err.h"
#include "gddr_base.h"
#include "gddr_hash.h"
#include "residual.h"

#define THREADS 256
/* Grid-stride loops cover any n; more blocks than this only adds scheduling. */
#define MAX_BLOCKS 65536u

static unsigned blocks_for(size_t work)
{
    size_t b = (work + THREADS - 1) / THREADS;
    return b == 0 ? 1u : b > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)b;
}

/* ---- scratch memory ------------------------------------------------------ */

/* Scratch (flags, ranks, CUB's temporary storage, the counts) comes from a
 * pool of our own per device. The default pool gives memory back to the
 * driver at every synchronisation, which would turn each step into a fresh
 * physical allocation; our pool keeps what it has, and what it has is small
 * (8 bytes per chunk). Its memory is never returned before exit. */
#define MAX_DEVICES 64
static cudaMemPool_t pools[MAX_DEVICES];
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;

static int scratch_pool(cudaMemPool_t *out)
{
    int dev = 0;
    GDDR_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MAX_DEVICES)
        return GDDR_ENOTSUP;
    pthread_mutex_lock(&pools_lock);
    cudaError_t e = cudaSuccess;
    if (!pools[dev]) {
        cudaMemPoolProps props = {};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        cudaMemPool_t p;
        e = cudaMemPoolCreate(&p, &props);
        if (e == cudaSuccess) {
            uint64_t keep = UINT64_MAX;
            e = cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep);
            if (e == cudaSuccess)
                pools[dev] = p;
            else
                cudaMemPoolDestroy(p);
        }
    }
    *out = pools[dev];
    pthread_mutex_unlock(&pools_lock);
    GDDR_CUDA_TRY(e);
    return GDDR_OK;
}

static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

/* The pieces of one call's scratch block. */
typedef struct scratch {
    void *base;
    uint32_t *flag;               /* 1 when the chunk is sent / selected */
    uint32_t *rank;               /* exclusive scan of flag */
    void *cub_tmp;
    size_t cub_bytes;
    unsigned long long *counts;   /* [0] chunks sent, [1] floats packed */
} scratch;

static int scratch_get(scratch *s, size_t nchunks, cudaStream_t st)
{
    s->base = NULL;
    s->cub_bytes = 0;
    GDDR_CUDA_TRY(cub::DeviceScan::ExclusiveSum(NULL, s->cub_bytes, (uint32_t *)NULL,
                                                (uint32_t *)NULL, (int)nchunks, st));
    const size_t fl = align256(nchunks * sizeof(uint32_t));
    const size_t total = 2 * fl + align256(s->cub_bytes) + align256(2 * sizeof(unsigned long long));
    cudaMemPool_t pool;
    int rc = scratch_pool(&pool);
    if (rc != GDDR_OK)
        return rc;
    GDDR_CUDA_TRY(cudaMallocFromPoolAsync(&s->base, total, pool, st));
    char *p = (char *)s->base;
    s->flag = (uint32_t *)p;
    s->rank = (uint32_t *)(p + fl);
    s->cub_tmp = p + 2 * fl;
    s->counts = (unsigned long long *)(p + 2 * fl + align256(s->cub_bytes));
    return GDDR_OK;
}

static void scratch_put(scratch *s, cudaStream_t st)
{
    if (s->base)
        cudaFreeAsync(s->base, st);
    s->base = NULL;
}

/* ---- kernels ------------------------------------------------------------- */

static __global__ void mask_kernel(size_t nchunks, uint64_t prefix, uint32_t chunk0, float alpha,
                                   uint32_t tau, uint32_t period, uint32_t phase,
                                   uint32_t *__restrict__ age, uint8_t *__restrict__ bitmap,
                                   size_t nbytes, uint32_t *__restrict__ flag)
{
    const unsigned lane = threadIdx.x & 31;
    const size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
    /* The loop bound is the same for all lanes of a warp, so every lane
     * reaches the ballot; lanes past the end vote 0, which also zeroes the
     * bitmap's padding bits. */
    for (size_t base = warp * 32; base < nchunks; base += nwarps * 32) {
        const size_t c = base + lane;
        int sent = 0;
        if (c < nchunks) {
            const uint32_t a = age[c];
            const int hold = gddr__chunk_held(prefix, chunk0 + (uint32_t)c, alpha, tau, period, phase, a);
            sent = !hold;
            age[c] = hold ? a + 1 : 0;
            flag[c] = (uint32_t)sent;
        }
        const unsigned bits = __ballot_sync(0xffffffffu, sent);
        const size_t byte = base / 8 + lane;
        if (lane < 4 && byte < nbytes)
            bitmap[byte] = (uint8_t)(bits >> (8 * lane));
    }
}

/* gddr_chunk_scores_cuda: one warp per chunk, in the order residual.h
 * gives (lane l sums elements l, l + 32, ...; then the shuffle tree), so
 * the CPU twin's scores are the same bits (.cu files build with
 * -fmad=false, and u*u is exact in double). */
static_assert(GDDR_SCORE_LANES == 32, "scores_kernel: one lane of the sum per thread of a warp");
static __global__ void scores_kernel(size_t n, uint32_t chunk, size_t nchunks,
                                     const float *__restrict__ g, const float *__restrict__ r,
                                     double *__restrict__ score)
{
    const unsigned lane = threadIdx.x & 31;
    const size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t c = warp; c < nchunks; c += nwarps) { /* the same c for the whole warp */
        const size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        double p = 0.0;
        for (size_t i = lo + lane; i < hi; i += GDDR_SCORE_LANES) {
            const float u = g ? r[i] + g[i] : r[i];
            p += (double)u * (double)u;
        }
        for (int off = GDDR_SCORE_LANES / 2; off > 0; off >>= 1)
            p += __shfl_down_sync(0xffffffffu, p, off);
        if (lane == 0)
            score[c] = p;
    }
}

static __global__ void flags_kernel(size_t nchunks, const uint8_t *__restrict__ bitmap,
                                    uint32_t *__restrict__ flag)
{
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < nchunks;
         c += (size_t)gridDim.x * blockDim.x)
        flag[c] = (bitmap[c >> 3] >> (c & 7)) & 1u;
}

static __global__ void counts_kernel(size_t nchunks, size_t n, uint32_t chunk,
                                     const uint32_t *flag, const uint32_t *rank,
                                     unsigned long long *counts)
{
    const size_t last = nchunks - 1;
    const unsigned long long sent = (unsigned long long)rank[last] + flag[last];
    const unsigned long long last_len = n - last * chunk;
    counts[0] = sent;
    counts[1] = sent * chunk - (flag[last] ? chunk - last_len : 0);
}

/* What the element pass does with a float of a flagged chunk. */
enum { OP_STEP_G, OP_STEP_NOG, OP_PACK, OP_UNPACK, OP_UNPACK_ACC };

/* One float. `a` is r (step), src (pack) or dense (unpack); `p` is the
 * float's slot in the packed buffer when its chunk is flagged. The _rn
 * intrinsics stop nvcc from fusing a multiply and an add into an FMA, which
 * the CPU twin does not do. */
template <int OP>
static __device__ __forceinline__ void one(float *a, const float *g, float *p, bool sent,
                                           float scale)
{
    if (OP == OP_STEP_G || OP == OP_STEP_NOG) {
        const float u = OP == OP_STEP_G ? __fadd_rn(*a, *g) : *a;
        if (sent) {
            *p = u;
            *a = 0.0f;
        } else if (OP == OP_STEP_G) {
            *a = u;
        }
    } else if (OP == OP_PACK) {
        if (sent)
            *p = *a;
    } else if (sent) {
        const float v = __fmul_rn(scale, *p);
        *a = OP == OP_UNPACK_ACC ? __fadd_rn(*a, v) : v;
    }
}

template <int OP>
static __device__ __forceinline__ void four(float *a, const float *g, float *p, bool sent,
                                            float scale)
{
    /* Plain unpack overwrites dense, so it alone skips reading it. */
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (OP != OP_UNPACK)
        x = *(const float4 *)a;
    if (OP == OP_STEP_G || OP == OP_STEP_NOG) {
        if (OP == OP_STEP_G) {
            const float4 y = __ldg((const float4 *)g);
            x.x = __fadd_rn(x.x, y.x);
            x.y = __fadd_rn(x.y, y.y);
            x.z = __fadd_rn(x.z, y.z);
            x.w = __fadd_rn(x.w, y.w);
        }
        if (sent) {
            *(float4 *)p = x;
            *(float4 *)a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        } else if (OP == OP_STEP_G) {
            *(float4 *)a = x;
        }
    } else if (OP == OP_PACK) {
        if (sent)
            *(float4 *)p = x;
    } else if (sent) {
        const float4 q = *(const float4 *)p;
        float4 v = make_float4(__fmul_rn(scale, q.x), __fmul_rn(scale, q.y),
                               __fmul_rn(scale, q.z), __fmul_rn(scale, q.w));
        if (OP == OP_UNPACK_ACC) {
            v.x = __fadd_rn(x.x, v.x);
            v.y = __fadd_rn(x.y, v.y);
            v.z = __fadd_rn(x.z, v.z);
            v.w = __fadd_rn(x.w, v.w);
        }
        *(float4 *)a = v;
    }
}

/* The element pass. Idx is 32 bits whenever n allows it, because 64-bit
 * division (element -> chunk) is many instructions on the GPU. V = 4 needs
 * chunk % 4 == 0 (then 4 aligned floats never straddle a chunk) and 16-byte
 * aligned buffers; the tensor's tail that is not a whole float4 goes one
 * float at a time. Unflagged chunks are skipped after reading their flag,
 * except in the step, which must still fold g into a held r. */
template <typename Idx, int V, int OP>
static __global__ void elem_kernel(Idx n, Idx chunk, float *__restrict__ a,
                                   const float *__restrict__ g, float *__restrict__ packed,
                                   const uint32_t *__restrict__ flag,
                                   const uint32_t *__restrict__ rank, float scale)
{
    const Idx nv = n / V + (n % V != 0);
    for (Idx v = (Idx)blockIdx.x * blockDim.x + threadIdx.x; v < nv;
         v += (Idx)gridDim.x * blockDim.x) {
        const Idx i = v * V;
        const Idx c = i / chunk;
        const bool sent = __ldg(flag + c) != 0;
        if (!sent && OP != OP_STEP_G)
            continue;
        float *p = sent ? packed + ((Idx)__ldg(rank + c) * chunk + (i - c * chunk)) : NULL;
        if (V == 4 && i + 4 <= n) {
            four<OP>(a + i, g ? g + i : NULL, p, sent, scale);
        } else {
            const Idx end = i + V < n ? i + V : n;
            for (Idx j = i; j < end; j++)
                one<OP>(a + j, g ? g + j : NULL, p ? p + (j - i) : NULL, sent, scale);
        }
    }
}

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

template <int OP>
static int launch_elem(size_t n, uint32_t chunk, float *a, const float *g, float *packed,
                       const scratch *s, float scale, cudaStream_t st)
{
    const int vec = chunk % 4 == 0 && aligned16(a) && aligned16(packed) && (!g || aligned16(g));
    const size_t work = vec ? (n + 3) / 4 : n;
    const unsigned blocks = blocks_for(work);
    if (n <= (size_t)INT32_MAX) {
        if (vec)
            elem_kernel<uint32_t, 4, OP><<<blocks, THREADS, 0, st>>>(
                (uint32_t)n, chunk, a, g, packed, s->flag, s->rank, scale);
        else
            elem_kernel<uint32_t, 1, OP><<<blocks, THREADS, 0, st>>>(
                (uint32_t)n, chunk, a, g, packed, s->flag, s->rank, scale);
    } else {
        if (vec)
            elem_kernel<uint64_t, 4, OP><<<blocks, THREADS, 0, st>>>(
                (uint64_t)n, chunk, a, g, packed, s->flag, s->rank, scale);
        else
            elem_kernel<uint64_t, 1, OP><<<blocks, THREADS, 0, st>>>(
                (uint64_t)n, chunk, a, g, packed, s->flag, s->rank, scale);
    }
    GDDR_CUDA_TRY(cudaGetLastError());
    return GDDR_OK;
}

/* ---- entry points -------------------------------------------------------- */

/* CUB's scan counts items in an int, which bounds the number of chunks. */
static int geometry_ok(size_t n, uint32_t chunk, const char *who)
{
    if (chunk == 0 || gddr_nchunks(n, chunk) > (size_t)INT_MAX) {
        gddr__cuda_seterr("%s: %zu floats in chunks of %u is not supported", who, n, chunk);
        return 0;
    }
    return 1;
}

/* Scan the flags, run the element pass, and (when counts are wanted) fetch
 * them; the scratch block is released on every path. */
template <int OP>
static int scan_and_apply(size_t n, uint32_t chunk, float *a, const float *g, float *packed,
                          scratch *s, float scale, unsigned long long *counts, cudaStream_t st)
{
    const size_t nchunks = gddr_nchunks(n, chunk);
    int rc = GDDR_OK;
    GDDR_CUDA_TRY_GOTO(cub::DeviceScan::ExclusiveSum(s->cub_tmp, s->cub_bytes, s->flag, s->rank,
                                                     (int)nchunks, st),
                       rc, out);
    rc = launch_elem<OP>(n, chunk, a, g, packed, s, scale, st);
    if (rc != GDDR_OK)
        goto out;
    if (counts) {
        counts_kernel<<<1, 1, 0, st>>>(nchunks, n, chunk, s->flag, s->rank, s->counts);
        GDDR_CUDA_TRY_GOTO(cudaGetLastError(), rc, out);
        GDDR_CUDA_TRY_GOTO(cudaMemcpyAsync(counts, s->counts, 2 * sizeof *counts,
                                           cudaMemcpyDeviceToHost, st),
                           rc, out);
    }
out:
    scratch_put(s, st);
    if (rc == GDDR_OK && counts)
        GDDR_CUDA_TRY(cudaStreamSynchronize(st));
    return rc;
}

extern "C" int gddr_residual_step_cuda(const gddr_residual_args *a, const float *d_g, float *d_r,
                                       uint32_t *d_age, float *d_packed, uint8_t *d_bitmap,
                                       size_t *npacked, size_t *nsent, void *stream)
{
    if (!a || !npacked || !nsent || !geometry_ok(a->n, a->chunk, "residual step (cuda)") ||
        a->alpha != a->alpha || !gddr__hold_args_ok(a))
        return GDDR_EINVAL;
    if (a->pick) { /* host memory: the smallest schedule is planned on the host */
        gddr__cuda_seterr("residual step (cuda): a pick (hold_schedule = smallest) is for "
                          "gddr_residual_plan_cpu and the fused pass");
        return GDDR_EINVAL;
    }
    if (a->n > 0 && (!d_r || !d_age || !d_packed || !d_bitmap))
        return GDDR_EINVAL;
    *npacked = *nsent = 0;
    if (a->n == 0)
        return GDDR_OK;

    cudaStream_t st = (cudaStream_t)stream;
    const size_t nchunks = gddr_nchunks(a->n, a->chunk);
    scratch s;
    int rc = scratch_get(&s, nchunks, st);
    if (rc != GDDR_OK)
        return rc;
    const uint64_t prefix = gddr__mask_prefix(a);
    mask_kernel<<<blocks_for((nchunks + 31) / 32 * 32), THREADS, 0, st>>>(
        nchunks, prefix, a->chunk0, a->alpha, a->tau, a->period, a->phase, d_age, d_bitmap, gddr_bitmap_bytes(nchunks), s.flag);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        gddr__cuda_seterr("%s:%d: mask_kernel: %s", __FILE__, __LINE__,
                 cudaGetErrorString(e));
        scratch_put(&s, st);
        return GDDR_ECUDA;
    }
    unsigned long long counts[2] = { 0, 0 };
    if (d_g)
        rc = scan_and_apply<OP_STEP_G>(a->n, a->chunk, d_r, d_g, d_packed, &s, 1.0f, counts, st);
    else
        rc = scan_and_apply<OP_STEP_NOG>(a->n, a->chunk, d_r, NULL, d_packed, &s, 1.0f, counts,
                                         st);
    if (rc != GDDR_OK)
        return rc;
    *nsent = (size_t)counts[0];
    *npacked = (size_t)counts[1];
    return GDDR_OK;
}

/* Pack and unpack start from a bitmap rather than the hash. */
static int flags_from_bitmap(scratch *s, size_t n, uint32_t chunk, const uint8_t *d_bitmap,
                             cudaStream_t st)
{
    const size_t nchunks = gddr_nchunks(n, chunk);
    int rc = scratch_get(s, nchunks, st);
    if (rc != GDDR_OK)
        return rc;
    flags_kernel<<<blocks_for(nchunks), THREADS, 0, st>>>(nchunks, d_bitmap, s->flag);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        gddr__cuda_seterr("%s:%d: flags_kernel: %s", __FILE__, __LINE__,
                 cudaGetErrorString(e));
        scratch_put(s, st);
        return GDDR_ECUDA;
    }
    return GDDR_OK;
}

extern "C" int gddr_pack_cuda(const float *d_src, size_t n, uint32_t chunk,
                              const uint8_t *d_bitmap, float *d_packed, size_t *npacked,
                              void *stream)
{
    if (!npacked || !geometry_ok(n, chunk, "pack (cuda)"))
        return GDDR_EINVAL;
    if (n > 0 && (!d_src || !d_bitmap || !d_packed))
        return GDDR_EINVAL;
    *npacked = 0;
    if (n == 0)
        return GDDR_OK;
    cudaStream_t st = (cudaStream_t)stream;
    scratch s;
    int rc = flags_from_bitmap(&s, n, chunk, d_bitmap, st);
    if (rc != GDDR_OK)
        return rc;
    unsigned long long counts[2] = { 0, 0 };
    /* The element pass only reads src in this mode; the cast is for the
     * shared signature. */
    rc = scan_and_apply<OP_PACK>(n, chunk, (float *)d_src, NULL, d_packed, &s, 1.0f, counts, st);
    if (rc != GDDR_OK)
        return rc;
    *npacked = (size_t)counts[1];
    return GDDR_OK;
}

extern "C" int gddr_chunk_scores_cuda(const float *d_g, const float *d_r, size_t n, uint32_t chunk,
                                      double *d_score, void *stream)
{
    if (!d_r || !d_score || !geometry_ok(n, chunk, "chunk scores (cuda)"))
        return GDDR_EINVAL;
    const size_t nchunks = gddr_nchunks(n, chunk);
    if (nchunks == 0)
        return GDDR_OK;
    cudaStream_t st = (cudaStream_t)stream;
    scores_kernel<<<blocks_for(nchunks * GDDR_SCORE_LANES), THREADS, 0, st>>>(n, chunk, nchunks, d_g, d_r, d_score);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        gddr__cuda_seterr("%s:%d: scores_kernel: %s", __FILE__, __LINE__, cudaGetErrorString(e));
        return GDDR_ECUDA;
    }
    return GDDR_OK;
}

extern "C" int gddr_unpack_cuda(const float *d_packed, const uint8_t *d_bitmap, size_t n,
                                uint32_t chunk, float scale, int accumulate, float *d_dense,
                                void *stream)
{
    if (!geometry_ok(n, chunk, "unpack (cuda)"))
        return GDDR_EINVAL;
    if (n > 0 && (!d_packed || !d_bitmap || !d_dense))
        return GDDR_EINVAL;
    if (n == 0)
        return GDDR_OK;
    cudaStream_t st = (cudaStream_t)stream;
    scratch s;
    int rc = flags_from_bitmap(&s, n, chunk, d_bitmap, st);
    if (rc != GDDR_OK)
        return rc;
    float *packed = (float *)d_packed;  /* read only in the unpack modes */
    if (accumulate)
        return scan_and_apply<OP_UNPACK_ACC>(n, chunk, d_dense, NULL, packed, &s, scale, NULL, st);
    return scan_and_apply<OP_UNPACK>(n, chunk, d_dense, NULL, packed, &s, scale, NULL, st);
}
