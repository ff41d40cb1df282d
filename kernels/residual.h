/* residual.h -- GDDR residual merging, masking and chunk packing.
 *
 * docs/design.md section 6 step 4: the worker keeps a residual r and a
 * per-chunk age next to each tensor. Every step it forms u = r + g, decides
 * per chunk whether to hold it (keep u in r) or send it (append u to the
 * packed payload, zero r), and describes the sent chunks with a bitmap.
 * Nothing is dropped: the sum of everything sent plus r equals the sum of
 * every g.
 *
 * Each operation has a CPU twin (residual.c, always built) and a CUDA version
 * (residual.cu, built with nvcc into the plugin libgddr-cuda.so; without the
 * plugin, cuda_loader.c's forwarders answer GDDR_ENOTSUP). Both draw the hold mask from gddr_hash.h, so their bitmaps are
 * identical and their values bit-identical (u = r + g is one rounding).
 *
 * Bitmap layout, shared with the wire: bit c % 8 of byte c / 8 (LSB first)
 * is chunk c; padding bits in the last byte are 0.
 *
 * Thread-safety: every function touches only the buffers it is given; calls
 * on disjoint buffers may run concurrently. Callers own every buffer.
 */
#ifndef GDDR_KERNELS_RESIDUAL_H
#define GDDR_KERNELS_RESIDUAL_H

#include <stddef.h>
#include <stdint.h>

#include "gddr_hash.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gddr_residual_args {
    size_t n;          /* tensor length */
    uint32_t chunk;    /* elements per chunk; last chunk may be short */
    float alpha;       /* hold probability: gddr_hold_probability(delay_fraction, tau) */
    uint32_t tau;      /* a chunk whose age has reached tau is always sent */
    uint64_t seed;
    uint32_t worker;
    uint32_t key;      /* gddr_key_hash(tensor name) */
    uint64_t step;
    uint32_t chunk0;   /* index of chunk 0 in the whole tensor (a shard's piece of
                        * a tensor split over servers; 0 otherwise): the mask
                        * hashes the whole tensor's chunk index */
    uint32_t period;   /* 0: each chunk held with probability alpha, drawn per worker
                        * and step. > tau: the staggered schedule: each chunk is held
                        * tau steps of every `period`, at a place in the cycle that
                        * depends on the chunk (not on the worker or the step) plus
                        * `phase`; gddr_hold_period() */
    uint32_t phase;    /* staggered: this worker's shift at this step, in [0, period)
                        * (gddr_hold_phase) */
    const uint8_t *pick; /* hold_schedule = smallest: host memory, per chunk 1 = hold
                          * (while its age is below tau), from gddr_hold_smallest();
                          * NULL: the hash (or the staggered cycle) decides. The
                          * CPU twins and gddr_residual_plan_cpu() take it; the
                          * device step (gddr_residual_step_cuda) refuses it */
} gddr_residual_args;

/* hold_schedule = staggered (docs/design.md, "The staggered schedule"): the
 * cycle length L = floor(tau / delay_fraction), at least tau + 1, so a chunk
 * is held tau steps of every L (a share tau / L, within 1 / L above
 * delay_fraction) and sent the other L - tau: once as its release, then
 * fresh. 0 when nothing is held (delay_fraction <= 0 or tau 0). */
uint32_t gddr_hold_period(double delay_fraction, uint32_t tau);

/* This worker's shift in the cycle at time `clock` (the client passes the
 * tensor's version in sync mode, its own step count otherwise): worker w
 * of `world` starts w * L / world places on, so the workers' hold windows
 * are spread evenly over the cycle and at any step about
 * world * (tau + 1) / L of them hold or release a chunk -- the others send
 * it fresh. 0 when period is 0. */
uint32_t gddr_hold_phase(uint32_t period, uint32_t worker, uint32_t world, uint64_t clock);

/* The staggered schedule's arguments make sense: a period above tau (or
 * 0: the random schedule) and a phase inside it; a pick goes without a
 * period. Checked by both twins. */
static inline GDDR_HD int gddr__hold_args_ok(const gddr_residual_args *a)
{
    if (a->pick && a->period)
        return 0;
    return a->period == 0 || (a->period > a->tau && a->phase < a->period);
}

/* hold_schedule = smallest (docs/design.md, "Holding the smallest
 * chunks"): a worker holds the chunks whose merged value u = r + g is
 * smallest, the way top-k sparsification with a residual does, instead of
 * a random draw.
 *
 * gddr_chunk_scores_*: score[c] = sum over chunk c of u*u, in double (each
 * product exact), in one fixed order that both twins follow: 32 lanes, lane
 * l adding elements l, l + 32, ... of the chunk in turn, then lane l +=
 * lane l + off for off = 16, 8, 4, 2, 1; score = lane 0. So the CPU twin
 * and the GPU (one warp per chunk) agree bit for bit, and so do the holds
 * picked from them. g == NULL: a zero gradient (u = r). The CUDA version
 * takes device buffers and queues its work on `stream` without waiting. */
#define GDDR_SCORE_LANES 32
int gddr_chunk_scores_cpu(const float *g, const float *r, size_t n, uint32_t chunk, double *score);
int gddr_chunk_scores_cuda(const float *d_g, const float *d_r, size_t n, uint32_t chunk,
                           double *d_score, void *stream);

/* The pick (host memory): among the chunks younger than tau (older ones
 * are sent whatever), the `want` with the smallest scores get pick = 1
 * (ties: the lower chunk index), every other chunk 0, where want =
 * floor(share * nchunks) plus one more with probability equal to the
 * fraction left over (drawn from the mask hash of a's seed, worker, key
 * and step), so the share held is `share` (the client's delay_fraction) on
 * average for a tensor of any size; all the younger chunks when fewer
 * than want are. order: scratch of nchunks. Returns how many are picked,
 * or -1 on bad arguments. A quickselect: O(nchunks) expected, not a sort. */
long gddr_hold_smallest(const gddr_residual_args *a, double share, const double *score,
                        const uint32_t *age, uint8_t *pick, uint32_t *order);

/* The hash prefix of a mask: per worker and step for the random schedule;
 * per tensor only for the staggered one (every worker's cycle of a chunk
 * starts at the same place; the phase shifts it). */
static inline GDDR_HD uint64_t gddr__mask_prefix(const gddr_residual_args *a)
{
    return a->period ? gddr__hash_prefix(a->seed, UINT32_MAX, a->key, 0)
                     : gddr__hash_prefix(a->seed, a->worker, a->key, a->step);
}

/* Whether chunk c (of the whole tensor) is held at this age; one function
 * for the CPU twin and the CUDA kernel. age is tested first, so a chunk at
 * its bound is sent whatever the schedule says: the delay is bounded by
 * tau. */
static inline GDDR_HD int gddr__chunk_held(uint64_t prefix, uint32_t c, float alpha, uint32_t tau,
                                           uint32_t period, uint32_t phase, uint32_t age)
{
    if (age >= tau)
        return 0;
    const uint32_t h = gddr__hash_chunk(prefix, c);
    if (period)
        return (h % period + phase) % period < tau;
    return gddr__u32_to_uniform(h) < alpha;
}

/* The hold probability p that makes alpha the share of chunk sends held
 * back when no chunk may wait more than tau steps. A chunk held with
 * probability p while its age is below tau is sent on average once every
 * 1 + p + ... + p^tau steps, so p solves that sum = 1 / (1 - alpha); p =
 * alpha would send more than 1 - alpha of the chunks (at tau 2, alpha 0.4:
 * 64%, not 60%). 1 when alpha is more than
 * tau allows (every chunk then waits exactly tau steps); 0 for alpha <= 0.
 * Plain arithmetic (no libm), so every worker and the GPU path agree. */
float gddr_hold_probability(float alpha, uint32_t tau);

/* Number of chunks of an n-float tensor; 0 when chunk is 0. */
static inline size_t gddr_nchunks(size_t n, uint32_t chunk)
{
    return chunk ? (n + chunk - 1) / chunk : 0;
}

/* Bytes of a bitmap with one bit per chunk. */
static inline size_t gddr_bitmap_bytes(size_t nchunks)
{
    return (nchunks + 7) / 8;
}

/* Fused step. u = r + g elementwise. Chunk c is held when age[c] < tau and
 * gddr_hash_uniform(seed, worker, key, step, c) < alpha: then r[c-range] = u
 * and age[c] += 1. Otherwise the chunk is sent: its u values are appended to
 * `packed` (sent chunks contiguous, in chunk order), r[c-range] = 0,
 * age[c] = 0 and bit c is set in `bitmap` (fully rewritten).
 * *npacked = floats written to packed, *nsent = chunks sent.
 * g == NULL means a zero gradient. Buffers: g, r: n floats; age: nchunks;
 * packed: room for n floats (the worst case: everything sent); bitmap:
 * gddr_bitmap_bytes(nchunks). Returns GDDR_OK or GDDR_EINVAL. */
int gddr_residual_step_cpu(const gddr_residual_args *a, const float *g, float *r, uint32_t *age,
                           float *packed, uint8_t *bitmap, size_t *npacked, size_t *nsent);
/* The same, and *l1 (when l1 is not NULL) = the residual's mass sum |r|
 * after the step, taken chunk by chunk as each held chunk is written (sent
 * chunks are 0): the host step's residual L1 without a pass of its own.
 * Each chunk's share is summed with gddr_asum_fp32_cpu (blas.h), so the two
 * agree to float precision (2e-6), not bit for bit. */
int gddr_residual_step_l1_cpu(const gddr_residual_args *a, const float *g, float *r, uint32_t *age,
                              float *packed, uint8_t *bitmap, size_t *npacked, size_t *nsent,
                              double *l1);

/* The same on the GPU: every buffer is device memory, npacked/nsent are host
 * memory. Work is queued on `stream` (a cudaStream_t; NULL = default stream)
 * and the call waits for it, so the counts and buffers are ready on return.
 * Uses a little stream-ordered scratch memory. GDDR_ECUDA on a CUDA error. */
int gddr_residual_step_cuda(const gddr_residual_args *a, const float *d_g, float *d_r,
                            uint32_t *d_age, float *d_packed, uint8_t *d_bitmap,
                            size_t *npacked, size_t *nsent, void *stream);

/* Packs the chunks selected by bitmap from src (n floats) into packed
 * (contiguous, chunk order); *npacked receives the floats written. */
int gddr_pack_cpu(const float *src, size_t n, uint32_t chunk, const uint8_t *bitmap,
                  float *packed, size_t *npacked);
/* Device buffers, host *npacked; waits for the stream like the step does. */
int gddr_pack_cuda(const float *d_src, size_t n, uint32_t chunk, const uint8_t *d_bitmap,
                   float *d_packed, size_t *npacked, void *stream);

/* Scatter: for each chunk with its bit set, dense[chunk] = scale * packed
 * chunk (accumulate = 0) or dense[chunk] += scale * packed chunk
 * (accumulate = 1); other chunks are untouched. packed holds the set chunks
 * contiguously, as gddr_pack_*() wrote them. */
int gddr_unpack_cpu(const float *packed, const uint8_t *bitmap, size_t n, uint32_t chunk,
                    float scale, int accumulate, float *dense);
/* Device buffers; queued on the stream, returns without waiting. */
int gddr_unpack_cuda(const float *d_packed, const uint8_t *d_bitmap, size_t n, uint32_t chunk,
                     float scale, int accumulate, float *d_dense, void *stream);

/* Number of set chunk bits of an n-float tensor's bitmap and the number of
 * floats those chunks cover (the short last chunk counts its true length).
 * Padding bits are ignored. Host memory. */
void gddr_bitmap_count(const uint8_t *bitmap, size_t n, uint32_t chunk, size_t *nchunks_set,
                       size_t *nfloats);

#ifdef __cplusplus
}
#endif
#endif /* GDDR_KERNELS_RESIDUAL_H */
