/* residual.c -- CPU twin of the GDDR residual kernels (see residual.h).
 *
 * This is the reference the CUDA kernels are tested against and the path a
 * worker takes when its gradient lives in host memory. The loops run chunk by
 * chunk: the hold decision is made once per chunk, then the chunk's floats
 * are merged in one pass, so every float is read and written once.
 */
#include "residual.h"

#include <math.h>
#include <string.h>

#include "blas.h"
#include "fused.h"
#include "gddr_base.h"
#include "gddr_hash.h"
#include "log.h"
#include "vec.h"

/* The hash takes the chunk index as 32 bits; longer tensors would repeat
 * masks, so they are refused rather than silently aliased. */
static int chunk_geometry_ok(size_t n, uint32_t chunk, const char *who)
{
    if (chunk == 0) {
        gddr_log(GDDR_LOG_ERROR, "%s: chunk size is 0", who);
        return 0;
    }
    if (gddr_nchunks(n, chunk) > (size_t)UINT32_MAX) {
        gddr_log(GDDR_LOG_ERROR, "%s: %zu floats in chunks of %u is more than 2^32 chunks", who,
                 n, chunk);
        return 0;
    }
    return 1;
}

float gddr_hold_probability(float alpha, uint32_t tau)
{
    if (!(alpha > 0) || tau == 0)
        return 0.0f;
    if (alpha >= 1)
        return 1.0f;
    const double want = 1.0 / (1.0 - (double)alpha);
    /* Called for every tensor of every step: 40 halvings (past float's
     * precision), and the sum stops where its terms no longer count, so a
     * large tau (up to tau_max's 1000) costs no more than a small one. */
    double lo = 0, hi = 1;
    for (int it = 0; it < 40; it++) {
        double p = 0.5 * (lo + hi), sum = 1, pk = 1;
        for (uint32_t k = 0; k < tau && pk > 1e-12; k++) {
            pk *= p;
            sum += pk;
        }
        if (sum < want)
            lo = p;
        else
            hi = p;
    }
    return (float)hi;
}

uint32_t gddr_hold_period(double delay_fraction, uint32_t tau)
{
    if (!(delay_fraction > 0) || tau == 0)
        return 0;
    double l = delay_fraction < 1 ? (double)tau / delay_fraction : 0;
    if (!(l < (double)(1u << 24)))
        l = (double)(1u << 24); /* a tiny fraction: a chunk held tau steps in 2^24 */
    uint32_t period = (uint32_t)l;
    return period > tau ? period : tau + 1;
}

uint32_t gddr_hold_phase(uint32_t period, uint32_t worker, uint32_t world, uint64_t clock)
{
    if (period == 0)
        return 0;
    if (world == 0)
        world = 1;
    uint64_t shift = (uint64_t)(worker % world) * period / world;
    return (uint32_t)((shift + clock % period) % period);
}

/* docs/design.md section 6 step 4 (gddr__chunk_held, residual.h); with a
 * pick (hold_schedule = smallest) the pick decides, under the same bound. */
static inline int chunk_held(const gddr_residual_args *a, uint64_t prefix, uint32_t age,
                             size_t c)
{
    if (a->pick)
        return age < a->tau && a->pick[c];
    return gddr__chunk_held(prefix, a->chunk0 + (uint32_t)c, a->alpha, a->tau, a->period,
                            a->phase, age);
}

/* What the step and the plan share before their chunk loop: the checks of
 * the arguments both take (the buffers each needs are checked by each), the
 * bitmap cleared, the hash prefix. GDDR_OK or GDDR_EINVAL. */
static int mask_begin(const gddr_residual_args *a, uint8_t *bitmap, size_t *npacked,
                      size_t *nsent, int bufs_ok, const char *who, uint64_t *prefix)
{
    if (!a || !npacked || !nsent || !chunk_geometry_ok(a->n, a->chunk, who) || isnan(a->alpha))
        return GDDR_EINVAL;
    if (!gddr__hold_args_ok(a)) {
        gddr_log(GDDR_LOG_ERROR, "%s: hold period %u must be above tau %u and phase %u below it%s",
                 who, a->period, a->tau, a->phase, a->pick ? ", and 0 with a pick" : "");
        return GDDR_EINVAL;
    }
    if (a->n > 0 && (!bufs_ok || !bitmap))
        return GDDR_EINVAL;
    const size_t nchunks = gddr_nchunks(a->n, a->chunk);
    if (nchunks > 0)
        memset(bitmap, 0, gddr_bitmap_bytes(nchunks));
    *prefix = gddr__mask_prefix(a);
    return GDDR_OK;
}

static inline int bit_is_set(const uint8_t *bitmap, size_t c)
{
    return (bitmap[c >> 3] >> (c & 7)) & 1;
}


GDDR_VEC
int gddr_chunk_scores_cpu(const float *g, const float *r, size_t n, uint32_t chunk, double *score)
{
    if (!r || !score || !chunk_geometry_ok(n, chunk, "chunk scores"))
        return GDDR_EINVAL;
    const size_t nchunks = gddr_nchunks(n, chunk);
    for (size_t c = 0; c < nchunks; c++) {
        const size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        double p[GDDR_SCORE_LANES] = { 0 };
        size_t i = lo;
        /* whole rows of 32 (a fixed inner loop the compiler vectorises),
         * then the short row: element i always lands in lane (i - lo) % 32 */
        if (g) {
            for (; i + GDDR_SCORE_LANES <= hi; i += GDDR_SCORE_LANES)
                for (size_t l = 0; l < GDDR_SCORE_LANES; l++) {
                    const float u = r[i + l] + g[i + l];
                    p[l] += (double)u * (double)u;
                }
        } else {
            for (; i + GDDR_SCORE_LANES <= hi; i += GDDR_SCORE_LANES)
                for (size_t l = 0; l < GDDR_SCORE_LANES; l++)
                    p[l] += (double)r[i + l] * (double)r[i + l];
        }
        for (size_t l = 0; i < hi; i++, l++) {
            const float u = g ? r[i] + g[i] : r[i];
            p[l] += (double)u * (double)u;
        }
        for (size_t off = GDDR_SCORE_LANES / 2; off > 0; off /= 2)
            for (size_t l = 0; l < off; l++)
                p[l] = p[l] + p[l + off];
        score[c] = p[0];
    }
    return GDDR_OK;
}

/* Chunk x before chunk y: the smaller score, then the lower index. */
static inline int score_before(const double *s, uint32_t x, uint32_t y)
{
    return s[x] < s[y] || (s[x] == s[y] && x < y);
}

static inline void swap_u32(uint32_t *o, size_t i, size_t j)
{
    uint32_t t = o[i];
    o[i] = o[j];
    o[j] = t;
}

/* Rearranges o[0, m) so that o[k] is the chunk that sorts k-th and every
 * chunk before it sorts before it (quickselect, median of three). */
static void select_kth(const double *s, uint32_t *o, size_t m, size_t k)
{
    size_t lo = 0, hi = m - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (score_before(s, o[mid], o[lo]))
            swap_u32(o, mid, lo);
        if (score_before(s, o[hi], o[lo]))
            swap_u32(o, hi, lo);
        if (score_before(s, o[hi], o[mid]))
            swap_u32(o, hi, mid);
        swap_u32(o, mid, hi); /* the median is the pivot, at hi */
        const uint32_t piv = o[hi];
        size_t st = lo;
        for (size_t i = lo; i < hi; i++)
            if (score_before(s, o[i], piv))
                swap_u32(o, i, st++);
        swap_u32(o, st, hi);
        if (k == st)
            return;
        if (k < st)
            hi = st - 1;
        else
            lo = st + 1;
    }
}

long gddr_hold_smallest(const gddr_residual_args *a, double share, const double *score,
                        const uint32_t *age, uint8_t *pick, uint32_t *order)
{
    if (!a || !(share >= 0) || !chunk_geometry_ok(a->n, a->chunk, "hold smallest"))
        return -1;
    const size_t nchunks = gddr_nchunks(a->n, a->chunk);
    if (nchunks == 0)
        return 0;
    if (!score || !age || !pick || !order)
        return -1;
    memset(pick, 0, nchunks);
    double whole = share < 1 ? share * (double)nchunks : (double)nchunks;
    size_t want = (size_t)whole;
    const uint64_t prefix = gddr__hash_prefix(a->seed, a->worker, a->key, a->step);
    if ((double)gddr__u32_to_uniform(gddr__hash_chunk(prefix, UINT32_MAX)) < whole - (double)want)
        want++;
    size_t m = 0;
    for (size_t c = 0; c < nchunks; c++)
        if (age[c] < a->tau)
            order[m++] = (uint32_t)c;
    if (want > m)
        want = m;
    if (want == 0)
        return 0;
    if (want < m)
        select_kth(score, order, m, want - 1);
    for (size_t k = 0; k < want; k++)
        pick[order[k]] = 1;
    return (long)want;
}

int gddr_residual_step_cpu(const gddr_residual_args *a, const float *g, float *r, uint32_t *age,
                           float *packed, uint8_t *bitmap, size_t *npacked, size_t *nsent)
{
    return gddr_residual_step_l1_cpu(a, g, r, age, packed, bitmap, npacked, nsent, NULL);
}

GDDR_VEC
int gddr_residual_step_l1_cpu(const gddr_residual_args *a, const float *g, float *r, uint32_t *age,
                              float *packed, uint8_t *bitmap, size_t *npacked, size_t *nsent,
                              double *l1)
{
    double held_l1 = 0.0;
    uint64_t prefix;
    if (mask_begin(a, bitmap, npacked, nsent, r && age && packed, "residual step", &prefix) !=
        GDDR_OK)
        return GDDR_EINVAL;
    const size_t n = a->n, chunk = a->chunk, nchunks = gddr_nchunks(n, a->chunk);
    size_t out = 0, sent = 0;
    for (size_t c = 0; c < nchunks; c++) {
        const size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        float *rc = r + lo;
        const float *gc = g ? g + lo : NULL;
        const size_t len = hi - lo;
        const int hold = chunk_held(a, prefix, age[c], c);
        if (hold) {
            if (gc)
                for (size_t i = 0; i < len; i++)
                    rc[i] = rc[i] + gc[i];
            if (l1) /* the chunk is in L1 cache now: its share of the residual's mass */
                held_l1 += gddr_asum_fp32_cpu(rc, len);
            age[c] += 1;
        } else {
            float *pc = packed + out;
            if (gc)
                for (size_t i = 0; i < len; i++)
                    pc[i] = rc[i] + gc[i];
            else
                memcpy(pc, rc, len * sizeof *pc);
            memset(rc, 0, len * sizeof *rc);
            age[c] = 0;
            bitmap[c >> 3] |= (uint8_t)(1u << (c & 7));
            out += len;
            sent++;
        }
    }
    *npacked = out;
    *nsent = sent;
    if (l1)
        *l1 = held_l1;
    return GDDR_OK;
}

int gddr_residual_plan_cpu(const gddr_residual_args *a, uint32_t *age, uint8_t *bitmap,
                           uint32_t *rank, size_t *npacked, size_t *nsent)
{
    uint64_t prefix;
    if (mask_begin(a, bitmap, npacked, nsent, age && rank, "residual plan", &prefix) != GDDR_OK)
        return GDDR_EINVAL;
    const size_t n = a->n, chunk = a->chunk, nchunks = gddr_nchunks(n, a->chunk);
    size_t out = 0, sent = 0;
    for (size_t c = 0; c < nchunks; c++) {
        if (chunk_held(a, prefix, age[c], c)) {
            age[c] += 1;
            rank[c] = GDDR_HELD;
        } else {
            const size_t lo = c * chunk, len = lo + chunk < n ? chunk : n - lo;
            age[c] = 0;
            bitmap[c >> 3] |= (uint8_t)(1u << (c & 7));
            rank[c] = (uint32_t)sent;
            out += len;
            sent++;
        }
    }
    *npacked = out;
    *nsent = sent;
    return GDDR_OK;
}

int gddr_pack_cpu(const float *src, size_t n, uint32_t chunk, const uint8_t *bitmap,
                  float *packed, size_t *npacked)
{
    if (!npacked || !chunk_geometry_ok(n, chunk, "pack"))
        return GDDR_EINVAL;
    if (n > 0 && (!src || !bitmap || !packed))
        return GDDR_EINVAL;
    const size_t nchunks = gddr_nchunks(n, chunk);
    size_t out = 0;
    for (size_t c = 0; c < nchunks; c++) {
        if (!bit_is_set(bitmap, c))
            continue;
        const size_t lo = c * (size_t)chunk, len = lo + chunk < n ? chunk : n - lo;
        memcpy(packed + out, src + lo, len * sizeof *packed);
        out += len;
    }
    *npacked = out;
    return GDDR_OK;
}

int gddr_unpack_cpu(const float *packed, const uint8_t *bitmap, size_t n, uint32_t chunk,
                    float scale, int accumulate, float *dense)
{
    if (!chunk_geometry_ok(n, chunk, "unpack"))
        return GDDR_EINVAL;
    if (n > 0 && (!packed || !bitmap || !dense))
        return GDDR_EINVAL;
    const size_t nchunks = gddr_nchunks(n, chunk);
    size_t in = 0;
    for (size_t c = 0; c < nchunks; c++) {
        if (!bit_is_set(bitmap, c))
            continue;
        const size_t lo = c * (size_t)chunk, len = lo + chunk < n ? chunk : n - lo;
        const float *pc = packed + in;
        float *dc = dense + lo;
        if (accumulate)
            for (size_t i = 0; i < len; i++)
                dc[i] = dc[i] + scale * pc[i];
        else
            for (size_t i = 0; i < len; i++)
                dc[i] = scale * pc[i];
        in += len;
    }
    return GDDR_OK;
}

void gddr_bitmap_count(const uint8_t *bitmap, size_t n, uint32_t chunk, size_t *nchunks_set,
                       size_t *nfloats)
{
    size_t set = 0, floats = 0;
    const size_t nchunks = gddr_nchunks(n, chunk);
    if (bitmap && nchunks > 0) {
        const size_t full = nchunks / 8;
        for (size_t b = 0; b < full; b++)
            set += (size_t)__builtin_popcount(bitmap[b]);
        for (size_t c = full * 8; c < nchunks; c++)
            set += (size_t)bit_is_set(bitmap, c);
        floats = set * chunk;
        /* Only the last chunk can be short; take back what it lacks. */
        const size_t last_len = n - (nchunks - 1) * (size_t)chunk;
        if (bit_is_set(bitmap, nchunks - 1))
            floats -= chunk - last_len;
    }
    if (nchunks_set)
        *nchunks_set = set;
    if (nfloats)
        *nfloats = floats;
}
