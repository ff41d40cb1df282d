/* check_kernels.c -- tests of kernels/: the CPU twins against invariants and
 * hand-computed values, then every CUDA kernel against its CPU twin.
 *
 * The CPU cases always run. The GPU cases run only where a usable GPU
 * exists; elsewhere a single case prints "SKIP gpu: <reason>" and passes,
 * because Check has no skip status. Whether a GPU is usable is asked in a
 * forked child (tests/gpu.h): CUDA initialised in the runner process would
 * not survive the fork() Check does for every case.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blas.h"
#include "dc.h"
#include "fused.h"
#include "gddr/gddr.h"
#include "gddr_hash.h"
#include "gpu.h"
#include "harness.h"
#include "kcompare.h"
#include "replay.h"
#include "residual.h"

/* ---- helpers -------------------------------------------------------------- */

/* A deterministic generator so a failure reproduces. */
static uint64_t rng_state = 0x1234567887654321ull;

static uint64_t rng_u64(void)
{
    rng_state += 0x9e3779b97f4a7c15ull;
    return gddr__mix64(rng_state);
}

static float rng_float(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng_u64() >> 40) * (1.0f / 16777216.0f);
}

static void fill_random(float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_float(lo, hi);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

static int bit(const uint8_t *bm, size_t c)
{
    return (bm[c >> 3] >> (c & 7)) & 1;
}

static gddr_residual_args args_for(size_t n, uint32_t chunk, float alpha, uint32_t tau,
                                   uint64_t step)
{
    gddr_residual_args a = { n, chunk, alpha, tau, 0x5eedull, 3, gddr_key_hash("layer0.weight"),
                             step, 0, 0, 0, NULL };
    return a;
}

/* ---- hash ----------------------------------------------------------------- */

START_TEST(test_hash_pure)
{
    /* Golden values pin the mask: a change to the hash would silently change
     * which chunks every worker holds, so it must be a deliberate one. */
    ck_assert_uint_eq(gddr_hash_u32(0, 0, 0, 0, 0), 0x631753f7u);
    ck_assert_uint_eq(gddr_hash_u32(0x9e3779b97f4a7c15ull, 7, 0xdeadbeefu, 123456789ull, 42),
                      0xd4c34daau);
    for (uint32_t c = 0; c < 1000; c++) {
        const uint32_t h = gddr_hash_u32(1, 2, 3, 4, c);
        ck_assert_uint_eq(h, gddr_hash_u32(1, 2, 3, 4, c));
        const float u = gddr_hash_uniform(1, 2, 3, 4, c);
        ck_assert(u >= 0.0f && u < 1.0f);
        ck_assert(u == (float)(h >> 8) / 16777216.0f);
    }
    /* Each counter changes the output. */
    const uint32_t base = gddr_hash_u32(1, 2, 3, 4, 5);
    ck_assert_uint_ne(base, gddr_hash_u32(2, 2, 3, 4, 5));
    ck_assert_uint_ne(base, gddr_hash_u32(1, 3, 3, 4, 5));
    ck_assert_uint_ne(base, gddr_hash_u32(1, 2, 4, 4, 5));
    ck_assert_uint_ne(base, gddr_hash_u32(1, 2, 3, 5, 5));
    ck_assert_uint_ne(base, gddr_hash_u32(1, 2, 3, 4, 6));
    /* FNV-1a 32 test vectors. */
    ck_assert_uint_eq(gddr_key_hash(""), 0x811c9dc5u);
    ck_assert_uint_eq(gddr_key_hash("a"), 0xe40c292cu);
    ck_assert_uint_eq(gddr_key_hash("foobar"), 0xbf9cf968u);
}
END_TEST

/* ---- residual step, CPU --------------------------------------------------- */

static const struct { size_t n; uint32_t chunk; } shapes[] = {
    { 1, 1 }, { 5, 2 }, { 64, 64 }, { 1000, 64 }, { 4097, 256 }, { 777, 1 }, { 100003, 1000 },
};

/* Runs many steps with a changing tau and checks, every step, that the
 * decision matches the rule of docs/design.md section 6 step 4, and at the
 * end that nothing was dropped: everything sent, scattered back, plus r
 * equals the sum of every gradient. */
START_TEST(test_residual_conservation)
{
    static const float alphas[] = { 0.0f, 0.3f, 0.75f, 1.0f };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (size_t ai = 0; ai < sizeof alphas / sizeof alphas[0]; ai++) {
            const size_t n = shapes[si].n;
            const uint32_t chunk = shapes[si].chunk;
            const size_t nc = gddr_nchunks(n, chunk), nb = gddr_bitmap_bytes(nc);
            float *g = xmalloc(n * sizeof *g), *r = calloc(n, sizeof *r);
            float *packed = xmalloc(n * sizeof *packed), *tmp = xmalloc(n * sizeof *tmp);
            uint32_t *age = calloc(nc, sizeof *age), *prev = xmalloc(nc * sizeof *prev);
            uint8_t *bm = xmalloc(nb);
            double *gsum = calloc(n, sizeof *gsum), *ssum = calloc(n, sizeof *ssum);
            ck_assert(r && age && gsum && ssum);
            for (uint64_t step = 0; step < 40; step++) {
                const uint32_t tau = step < 15 ? 4 : step < 25 ? 1 : 7;
                const int zero_g = step % 7 == 6;
                fill_random(g, n, -1.0f, 1.0f);
                memcpy(prev, age, nc * sizeof *age);
                memset(bm, 0xff, nb);
                gddr_residual_args a = args_for(n, chunk, alphas[ai], tau, step);
                /* every third step on the staggered schedule (world of 4) */
                const int stag = step % 3 == 2 && alphas[ai] > 0;
                if (stag) {
                    a.period = gddr_hold_period(alphas[ai], tau);
                    a.phase = gddr_hold_phase(a.period, a.worker, 4, step);
                }
                size_t np = 0, ns = 0;
                if (step % 2) {
                    /* the host step's form: the residual's L1 taken in the same pass */
                    double l1 = -1;
                    ck_assert_int_eq(gddr_residual_step_l1_cpu(&a, zero_g ? NULL : g, r, age, packed,
                                                               bm, &np, &ns, &l1),
                                     GDDR_OK);
                    const double want = gddr_asum_cpu(r, n);
                    /* float precision: summed per chunk with gddr_asum_fp32_cpu */
                    ck_assert_msg(fabs(l1 - want) <= 4e-6 * want + 1e-12,
                                  "n=%zu chunk=%u alpha=%g step %llu: L1 in the step %.17g, asum %.17g",
                                  n, chunk, alphas[ai], (unsigned long long)step, l1, want);
                } else {
                    ck_assert_int_eq(gddr_residual_step_cpu(&a, zero_g ? NULL : g, r, age, packed,
                                                            bm, &np, &ns),
                                     GDDR_OK);
                }
                size_t cs, cf;
                gddr_bitmap_count(bm, n, chunk, &cs, &cf);
                ck_assert_uint_eq(cs, ns);
                ck_assert_uint_eq(cf, np);
                for (size_t c = nc; c < nb * 8; c++)
                    ck_assert_msg(!bit(bm, c), "padding bit %zu set", c);
                for (size_t c = 0; c < nc; c++) {
                    const uint32_t h = gddr_hash_u32(a.seed, stag ? UINT32_MAX : a.worker, a.key,
                                                     stag ? 0 : step, (uint32_t)c);
                    const int held = prev[c] < tau &&
                                     (stag ? (h % a.period + a.phase) % a.period < tau
                                           : gddr_hash_uniform(a.seed, a.worker, a.key, step,
                                                               (uint32_t)c) < a.alpha);
                    ck_assert_int_eq(bit(bm, c), !held);
                    ck_assert_uint_eq(age[c], held ? prev[c] + 1 : 0);
                    ck_assert_uint_le(age[c], tau);
                    const size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
                    if (!held)
                        for (size_t i = lo; i < hi; i++)
                            ck_assert(r[i] == 0.0f);
                }
                memset(tmp, 0, n * sizeof *tmp);
                ck_assert_int_eq(gddr_unpack_cpu(packed, bm, n, chunk, 1.0f, 0, tmp), GDDR_OK);
                for (size_t i = 0; i < n; i++) {
                    ssum[i] += tmp[i];
                    gsum[i] += zero_g ? 0.0 : g[i];
                }
            }
            for (size_t i = 0; i < n; i++) {
                const double err = fabs(ssum[i] + r[i] - gsum[i]);
                ck_assert_msg(err <= 1e-4 + 1e-5 * fabs(gsum[i]),
                              "n=%zu chunk=%u alpha=%g: element %zu lost %g", n, chunk,
                              alphas[ai], i, err);
            }
            free(g), free(r), free(packed), free(tmp), free(age), free(prev), free(bm);
            free(gsum), free(ssum);
        }
    }
}
END_TEST

/* The held fraction is Binomial(nchunks, alpha) when no chunk is at its age
 * bound; 5 sigma keeps this from ever flaking while still catching a biased
 * or broken uniform map. */
START_TEST(test_residual_held_fraction)
{
    static const float alphas[] = { 0.05f, 0.25f, 0.5f, 0.9f };
    const size_t n = 65536 * 4 + 3;
    const uint32_t chunk = 4;
    const size_t nc = gddr_nchunks(n, chunk);
    float *r = calloc(n, sizeof *r), *packed = xmalloc(n * sizeof *packed);
    uint32_t *age = calloc(nc, sizeof *age);
    uint8_t *bm = xmalloc(gddr_bitmap_bytes(nc));
    ck_assert(r && age);
    for (size_t ai = 0; ai < sizeof alphas / sizeof alphas[0]; ai++) {
        for (uint64_t step = 0; step < 5; step++) {
            memset(age, 0, nc * sizeof *age);
            gddr_residual_args a = args_for(n, chunk, alphas[ai], 8, step);
            a.worker = (uint32_t)(step * 3 + ai);
            size_t np, ns;
            ck_assert_int_eq(gddr_residual_step_cpu(&a, NULL, r, age, packed, bm, &np, &ns),
                             GDDR_OK);
            const double held = (double)(nc - ns), p = alphas[ai];
            const double mean = nc * p, sigma = sqrt(nc * p * (1 - p));
            ck_assert_msg(fabs(held - mean) <= 5 * sigma + 1,
                          "alpha %g: held %g of %zu, expected %g +- %g", p, held, nc, mean,
                          5 * sigma);
        }
    }
    /* The extremes are exact: alpha 0 holds nothing, alpha 1 everything. */
    memset(age, 0, nc * sizeof *age);
    gddr_residual_args a = args_for(n, chunk, 0.0f, 8, 1);
    size_t np, ns;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, NULL, r, age, packed, bm, &np, &ns), GDDR_OK);
    ck_assert_uint_eq(ns, nc);
    ck_assert_uint_eq(np, n);
    a.alpha = 1.0f;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, NULL, r, age, packed, bm, &np, &ns), GDDR_OK);
    ck_assert_uint_eq(ns, 0);
    ck_assert_uint_eq(np, 0);
    free(r), free(packed), free(age), free(bm);
}
END_TEST

/* With alpha = 1 only the age bound sends, so every chunk goes out exactly
 * every tau + 1 steps and r carries tau + 1 gradients; tau = 0 sends all. */
START_TEST(test_residual_age_bound)
{
    const size_t n = 300;
    const uint32_t chunk = 32;
    const size_t nc = gddr_nchunks(n, chunk);
    float g[300], r[300] = { 0 }, packed[300];
    uint32_t age[10] = { 0 };
    uint8_t bm[2];
    for (size_t i = 0; i < n; i++)
        g[i] = 1.0f;
    for (uint64_t step = 0; step < 12; step++) {
        gddr_residual_args a = args_for(n, chunk, 1.0f, 3, step);
        size_t np, ns;
        ck_assert_int_eq(gddr_residual_step_cpu(&a, g, r, age, packed, bm, &np, &ns), GDDR_OK);
        if (step % 4 == 3) {
            ck_assert_uint_eq(ns, nc);
            ck_assert_uint_eq(np, n);
            for (size_t i = 0; i < n; i++)
                ck_assert(packed[i] == 4.0f);
        } else {
            ck_assert_uint_eq(ns, 0);
            for (size_t c = 0; c < nc; c++)
                ck_assert_uint_eq(age[c], step % 4 + 1);
        }
    }
    gddr_residual_args a = args_for(n, chunk, 1.0f, 0, 99);
    size_t np, ns;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, g, r, age, packed, bm, &np, &ns), GDDR_OK);
    ck_assert_uint_eq(ns, nc);
}
END_TEST

static void run_mask(gddr_residual_args a, uint8_t *bm)
{
    float *r = calloc(a.n, sizeof *r), *packed = xmalloc(a.n * sizeof *packed);
    uint32_t *age = calloc(gddr_nchunks(a.n, a.chunk), sizeof *age);
    ck_assert(r && age);
    size_t np, ns;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, NULL, r, age, packed, bm, &np, &ns), GDDR_OK);
    free(r), free(packed), free(age);
}

/* hold_schedule = smallest (residual.h): the chunk scores, the pick and the
 * step that follows it. */
START_TEST(test_residual_smallest)
{
    /* Scores by hand: chunk 0 holds u = 1, 2, -2 (sum 9), chunk 1 u = 0.5
     * (0.25); with g NULL they are r's own. */
    float r3[4] = { 0.5f, 1.0f, -1.0f, 0.25f }, g3[4] = { 0.5f, 1.0f, -1.0f, 0.25f };
    double sc[2];
    ck_assert_int_eq(gddr_chunk_scores_cpu(g3, r3, 4, 3, sc), GDDR_OK);
    ck_assert(sc[0] == 9.0 && sc[1] == 0.25);
    ck_assert_int_eq(gddr_chunk_scores_cpu(NULL, r3, 4, 3, sc), GDDR_OK);
    ck_assert(sc[0] == 2.25 && sc[1] == 0.0625);
    ck_assert_int_eq(gddr_chunk_scores_cpu(g3, NULL, 4, 3, sc), GDDR_EINVAL);
    ck_assert_int_eq(gddr_chunk_scores_cpu(g3, r3, 4, 0, sc), GDDR_EINVAL);

    enum { NC = 100, CH = 37, STEPS = 400 };
    const size_t n = (size_t)NC * CH - 5; /* a short last chunk */
    const uint32_t tau = 3;
    const double share = 0.375;
    float *g = xmalloc(n * 4), *r = calloc(n, 4), *packed = xmalloc(n * 4), *r2 = xmalloc(n * 4);
    double *score = xmalloc(NC * sizeof *score), *gsum = calloc(n, sizeof *gsum),
           *ssum = calloc(n, sizeof *ssum);
    uint32_t *age = calloc(NC, sizeof *age), *age2 = xmalloc(NC * sizeof *age2),
             *order = xmalloc(NC * sizeof *order), *rank = xmalloc(NC * sizeof *rank);
    uint8_t *pick = xmalloc(NC), *bm = xmalloc(gddr_bitmap_bytes(NC)), *bm2 = xmalloc(gddr_bitmap_bytes(NC));
    ck_assert(r && gsum && ssum && age);
    /* Against a plain double sum of the same squares: the order differs, the
     * value to double rounding. */
    fill_random(g, n, -1.0f, 1.0f);
    fill_random(r2, n, -1.0f, 1.0f);
    ck_assert_int_eq(gddr_chunk_scores_cpu(g, r2, n, CH, score), GDDR_OK);
    for (size_t c = 0; c < NC; c++) {
        double want = 0;
        for (size_t i = c * CH; i < n && i < (c + 1) * CH; i++) {
            const float u = r2[i] + g[i];
            want += (double)u * u;
        }
        ck_assert_msg(fabs(score[c] - want) <= 1e-12 * want, "chunk %zu: %.17g vs %.17g", c, score[c], want);
    }
    long total = 0;
    for (uint64_t step = 0; step < STEPS; step++) {
        /* Gradients of very different sizes per chunk, so that the pick matters. */
        for (size_t i = 0; i < n; i++)
            g[i] = rng_float(-1.0f, 1.0f) * (float)(1 + (i / CH) % 7);
        gddr_residual_args a = args_for(n, CH, 0.5f, tau, step);
        ck_assert_int_eq(gddr_chunk_scores_cpu(g, r, n, CH, score), GDDR_OK);
        long k = gddr_hold_smallest(&a, share, score, age, pick, order);
        ck_assert_msg(k == 37 || k == 38, "step %llu: %ld picked", (unsigned long long)step, k);
        total += k;
        /* exactly k picked, all younger than tau, and none scores above an
         * unpicked younger chunk (ties: the lower index picked) */
        long cnt = 0;
        double top = -1;
        size_t topc = 0;
        for (size_t c = 0; c < NC; c++)
            if (pick[c]) {
                cnt++;
                ck_assert_uint_lt(age[c], tau);
                if (score[c] > top || (score[c] == top && c > topc))
                    top = score[c], topc = c;
            }
        ck_assert_int_eq(cnt, k);
        for (size_t c = 0; c < NC; c++)
            if (!pick[c] && age[c] < tau)
                ck_assert_msg(score[c] > top || (score[c] == top && c > topc),
                              "chunk %zu (%.9g) unpicked under the largest picked %.9g", c, score[c], top);
        a.pick = pick;
        /* the plan takes the pick as the step does */
        size_t np = 0, ns = 0, np2 = 0, ns2 = 0;
        memcpy(age2, age, NC * sizeof *age2);
        ck_assert_int_eq(gddr_residual_plan_cpu(&a, age2, bm2, rank, &np2, &ns2), GDDR_OK);
        ck_assert_int_eq(gddr_residual_step_cpu(&a, g, r, age, packed, bm, &np, &ns), GDDR_OK);
        ck_assert_uint_eq(ns, NC - (size_t)k);
        ck_assert(np == np2 && ns == ns2 && memcmp(bm, bm2, gddr_bitmap_bytes(NC)) == 0 &&
                  memcmp(age, age2, NC * sizeof *age) == 0);
        for (size_t c = 0; c < NC; c++) {
            ck_assert_int_eq(bit(bm, c), !pick[c]);
            ck_assert_uint_le(age[c], tau);
        }
        /* nothing dropped: what was sent plus r is the sum of the gradients */
        for (size_t i = 0; i < n; i++)
            gsum[i] += g[i];
        size_t off = 0;
        for (size_t c = 0; c < NC; c++) {
            if (!bit(bm, c))
                continue;
            for (size_t i = c * CH; i < n && i < (c + 1) * CH; i++)
                ssum[i] += packed[off++];
        }
        ck_assert_uint_eq(off, np);
    }
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(ssum[i] + r[i] - gsum[i]) <= 1e-3, "element %zu lost mass", i);
    /* the share held is `share` on the mean: 37.5 chunks a step */
    ck_assert_msg(fabs((double)total / STEPS - share * NC) < 0.1, "%.3f held a step", (double)total / STEPS);
    /* a chunk at its bound is sent whatever the pick says; fewer young
     * chunks than wanted: all of them */
    for (size_t c = 0; c < NC; c++)
        age[c] = c < 3 ? 0 : tau;
    gddr_residual_args a = args_for(n, CH, 0.5f, tau, 0);
    ck_assert_int_eq(gddr_hold_smallest(&a, share, score, age, pick, order), 3);
    ck_assert(pick[0] && pick[1] && pick[2] && !pick[3]);
    memset(pick, 1, NC);
    a.pick = pick;
    size_t np, ns;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, g, r, age, packed, bm, &np, &ns), GDDR_OK);
    ck_assert_uint_eq(ns, NC - 3);
    /* share 0 holds nothing; bad arguments */
    ck_assert_int_eq(gddr_hold_smallest(&a, 0.0, score, age, pick, order), 0);
    ck_assert_int_eq(gddr_hold_smallest(&a, -1.0, score, age, pick, order), -1);
    ck_assert_int_eq(gddr_hold_smallest(&a, 0.4, NULL, age, pick, order), -1);
    a.period = 10;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, g, r, age, packed, bm, &np, &ns), GDDR_EINVAL);
    free(g), free(r), free(packed), free(r2), free(score), free(gsum), free(ssum);
    free(age), free(age2), free(order), free(rank), free(pick), free(bm), free(bm2);
}
END_TEST

/* hold_schedule = staggered (docs/design.md, "The staggered schedule"): the
 * period and phases, and what the schedule is for. 4 workers, tau 4,
 * delay_fraction 0.4: period 10, each worker holds each chunk 4 steps of
 * every 10 and the workers' windows are spread over the cycle, so from the
 * first full cycle on exactly 2 of the 4 send every chunk fresh (not held,
 * not a release) at every step, and each holds exactly 40 %. The random
 * schedule, same share, leaves chunk-steps that no worker sends fresh (a
 * sync step then has no fresh mean to fill the holders' share with). */
START_TEST(test_residual_staggered)
{
    ck_assert_uint_eq(gddr_hold_period(0.4, 4), 10);
    ck_assert_uint_eq(gddr_hold_period(0.4, 2), 5);
    ck_assert_uint_eq(gddr_hold_period(0.4, 3), 7);
    ck_assert_uint_eq(gddr_hold_period(0.9, 4), 5); /* at least tau + 1 */
    ck_assert_uint_eq(gddr_hold_period(1.0, 4), 5);
    ck_assert_uint_eq(gddr_hold_period(0.0, 4), 0);
    ck_assert_uint_eq(gddr_hold_period(0.4, 0), 0);
    ck_assert_uint_eq(gddr_hold_period(1e-12, 4), 1u << 24);
    ck_assert_uint_eq(gddr_hold_phase(10, 0, 4, 0), 0);
    ck_assert_uint_eq(gddr_hold_phase(10, 1, 4, 0), 2);
    ck_assert_uint_eq(gddr_hold_phase(10, 2, 4, 0), 5);
    ck_assert_uint_eq(gddr_hold_phase(10, 3, 4, 13), 0); /* 7 + 13 */
    ck_assert_uint_eq(gddr_hold_phase(10, 5, 4, 1), 3);  /* rank 5 of 4 sits where rank 1 does */
    ck_assert_uint_eq(gddr_hold_phase(10, 1, 0, 0), 0);  /* world 0 taken as 1 */
    ck_assert_uint_eq(gddr_hold_phase(0, 1, 4, 3), 0);

    enum { W = 4, NC = 512, CH = 8, STEPS = 60 };
    const size_t n = (size_t)NC * CH, nb = gddr_bitmap_bytes(NC);
    const uint32_t tau = 4;
    float *g = xmalloc(n * sizeof *g), *packed = xmalloc(n * sizeof *packed);
    float *tmp = xmalloc(n * sizeof *tmp);
    uint8_t *bm = xmalloc(nb);
    uint32_t *prev = xmalloc(NC * sizeof *prev);
    {
        /* a period at or under tau, or a phase past it, is refused */
        float r[16] = { 0 };
        uint32_t age[2] = { 0, 0 };
        size_t np, ns;
        gddr_residual_args a = args_for(16, CH, 0.5f, 4, 0);
        a.period = 4;
        ck_assert_int_eq(gddr_residual_step_cpu(&a, r, r, age, packed, bm, &np, &ns), GDDR_EINVAL);
        a.period = 10, a.phase = 10;
        ck_assert_int_eq(gddr_residual_step_cpu(&a, r, r, age, packed, bm, &np, &ns), GDDR_EINVAL);
    }
    for (int stag = 1; stag >= 0; stag--) {
        float *r[W];
        uint32_t *age[W];
        double *gsum = calloc(n, sizeof *gsum), *ssum = calloc(n, sizeof *ssum);
        size_t held[W] = { 0 }, no_fresh = 0, fresh_total = 0;
        for (int w = 0; w < W; w++) {
            r[w] = calloc(n, sizeof(float));
            age[w] = calloc(NC, sizeof(uint32_t));
            ck_assert(r[w] && age[w]);
        }
        ck_assert(gsum && ssum);
        for (uint64_t step = 0; step < STEPS; step++) {
            int fresh[NC] = { 0 };
            for (int w = 0; w < W; w++) {
                gddr_residual_args a = args_for(n, CH, gddr_hold_probability(0.4f, tau), tau, step);
                a.worker = (uint32_t)w;
                if (stag) {
                    a.period = gddr_hold_period(0.4, tau);
                    a.phase = gddr_hold_phase(a.period, a.worker, W, step);
                }
                fill_random(g, n, -1.0f, 1.0f);
                memcpy(prev, age[w], NC * sizeof *prev);
                size_t np = 0, ns = 0;
                ck_assert_int_eq(gddr_residual_step_cpu(&a, g, r[w], age[w], packed, bm, &np, &ns),
                                 GDDR_OK);
                for (size_t c = 0; c < NC; c++) {
                    if (!bit(bm, c))
                        held[w]++;
                    else if (prev[c] == 0)
                        fresh[c]++;
                    if (age[w][c] > tau) /* one check per chunk, not an assertion each */
                        ck_abort_msg("worker %d chunk %zu: age %u over tau", w, c, age[w][c]);
                }
                memset(tmp, 0, n * sizeof *tmp);
                ck_assert_int_eq(gddr_unpack_cpu(packed, bm, n, CH, 1.0f, 0, tmp), GDDR_OK);
                for (size_t i = 0; i < n; i++)
                    ssum[i] += tmp[i], gsum[i] += g[i];
            }
            for (size_t c = 0; c < NC; c++) {
                no_fresh += fresh[c] == 0;
                fresh_total += (size_t)fresh[c];
                if (stag && step >= 10 && fresh[c] != 2)
                    ck_abort_msg("step %llu chunk %zu: %d workers sent it fresh",
                                 (unsigned long long)step, c, fresh[c]);
            }
        }
        for (int w = 0; w < W; w++) {
            if (stag)
                ck_assert_uint_eq(held[w], (size_t)NC * STEPS * 4 / 10);
            else
                ck_assert(held[w] > (size_t)NC * STEPS * 35 / 100 && held[w] < (size_t)NC * STEPS * 45 / 100);
        }
        for (size_t i = 0; i < n; i++) { /* nothing lost: sent + held = every gradient */
            double rs = 0;
            for (int w = 0; w < W; w++)
                rs += r[w][i];
            if (!(fabs(ssum[i] + rs - gsum[i]) < 1e-3))
                ck_abort_msg("value %zu: sent %g + held %g != %g", i, ssum[i], rs, gsum[i]);
        }
        if (stag)
            ck_assert_uint_eq(no_fresh, 0);
        else
            ck_assert_msg(no_fresh > (size_t)NC * STEPS / 20,
                          "random schedule: only %zu chunk-steps without a fresh push", no_fresh);
        printf("kernels: %s schedule, 4 workers, tau 4, 0.4 held: %.2f fresh pushes a chunk-step, "
               "%.1f %% of chunk-steps with none\n", stag ? "staggered" : "random",
               (double)fresh_total / (NC * STEPS), 100.0 * (double)no_fresh / (NC * STEPS));
        for (int w = 0; w < W; w++)
            free(r[w]), free(age[w]);
        free(gsum), free(ssum);
    }
    free(g), free(packed), free(tmp), free(bm), free(prev);
}
END_TEST

/* The mask is a pure function of (seed, worker, key, step, chunk): the same
 * inputs give the same bitmap, and changing any one of them changes it
 * (4096 chunks at alpha 0.5: a collision has probability 2^-4096). */
START_TEST(test_residual_mask_pure)
{
    const size_t n = 4096 * 16;
    const uint32_t chunk = 16;
    const size_t nb = gddr_bitmap_bytes(gddr_nchunks(n, chunk));
    uint8_t *b0 = xmalloc(nb), *b1 = xmalloc(nb);
    const gddr_residual_args base = args_for(n, chunk, 0.5f, 4, 17);
    run_mask(base, b0);
    run_mask(base, b1);
    ck_assert_int_eq(memcmp(b0, b1, nb), 0);
    gddr_residual_args v[4] = { base, base, base, base };
    v[0].step++, v[1].worker++, v[2].key++, v[3].seed++;
    for (int k = 0; k < 4; k++) {
        run_mask(v[k], b1);
        ck_assert_msg(memcmp(b0, b1, nb) != 0, "variant %d gave the same mask", k);
    }
    free(b0), free(b1);
}
END_TEST

/* ---- pack / unpack / count ------------------------------------------------ */

START_TEST(test_bitmap_count)
{
    /* 10 floats in chunks of 4: lengths 4, 4, 2. */
    size_t cs, cf;
    uint8_t bm = 0x5;
    gddr_bitmap_count(&bm, 10, 4, &cs, &cf);
    ck_assert_uint_eq(cs, 2);
    ck_assert_uint_eq(cf, 6);
    bm = 0x3;
    gddr_bitmap_count(&bm, 10, 4, &cs, &cf);
    ck_assert_uint_eq(cs, 2);
    ck_assert_uint_eq(cf, 8);
    bm = 0xff; /* padding bits are ignored */
    gddr_bitmap_count(&bm, 10, 4, &cs, &cf);
    ck_assert_uint_eq(cs, 3);
    ck_assert_uint_eq(cf, 10);
    uint8_t big[3] = { 0xff, 0x0f, 0x80 }; /* 17 chunks of 3 over 50 floats; last has 2 */
    gddr_bitmap_count(big, 50, 3, &cs, &cf);
    ck_assert_uint_eq(cs, 12);
    ck_assert_uint_eq(cf, 36);
    big[2] = 0x01;
    gddr_bitmap_count(big, 50, 3, &cs, &cf);
    ck_assert_uint_eq(cs, 13);
    ck_assert_uint_eq(cf, 38);
    gddr_bitmap_count(NULL, 0, 3, &cs, &cf);
    ck_assert_uint_eq(cs, 0);
    ck_assert_uint_eq(cf, 0);
}
END_TEST

START_TEST(test_pack_unpack_roundtrip)
{
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const size_t n = shapes[si].n;
        const uint32_t chunk = shapes[si].chunk;
        const size_t nc = gddr_nchunks(n, chunk), nb = gddr_bitmap_bytes(nc);
        float *src = xmalloc(n * sizeof *src), *packed = xmalloc(n * sizeof *packed);
        float *dense = xmalloc(n * sizeof *dense);
        uint8_t *bm = xmalloc(nb);
        fill_random(src, n, -3.0f, 3.0f);
        for (size_t b = 0; b < nb; b++)
            bm[b] = (uint8_t)rng_u64(); /* padding bits too: they must be ignored */
        size_t np, cs, cf;
        ck_assert_int_eq(gddr_pack_cpu(src, n, chunk, bm, packed, &np), GDDR_OK);
        gddr_bitmap_count(bm, n, chunk, &cs, &cf);
        ck_assert_uint_eq(np, cf);
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (bit(bm, i / chunk))
                ck_assert(packed[k++] == src[i]);
        ck_assert_uint_eq(k, np);

        for (size_t i = 0; i < n; i++)
            dense[i] = 42.0f;
        ck_assert_int_eq(gddr_unpack_cpu(packed, bm, n, chunk, 1.0f, 0, dense), GDDR_OK);
        for (size_t i = 0; i < n; i++)
            ck_assert(dense[i] == (bit(bm, i / chunk) ? src[i] : 42.0f));
        /* dense = src + (-2) * src = -src on the set chunks. */
        ck_assert_int_eq(gddr_unpack_cpu(packed, bm, n, chunk, -2.0f, 1, dense), GDDR_OK);
        for (size_t i = 0; i < n; i++)
            ck_assert(dense[i] == (bit(bm, i / chunk) ? -src[i] : 42.0f));

        memset(bm, 0xff, nb);
        ck_assert_int_eq(gddr_pack_cpu(src, n, chunk, bm, packed, &np), GDDR_OK);
        ck_assert_uint_eq(np, n);
        ck_assert_int_eq(memcmp(packed, src, n * sizeof *src), 0);
        memset(bm, 0, nb);
        ck_assert_int_eq(gddr_pack_cpu(src, n, chunk, bm, packed, &np), GDDR_OK);
        ck_assert_uint_eq(np, 0);
        free(src), free(packed), free(dense), free(bm);
    }
}
END_TEST

START_TEST(test_invalid_args)
{
    float x[4] = { 0 }, p[4];
    uint32_t age[4] = { 0 };
    uint8_t bm[1];
    size_t np, ns;
    gddr_residual_args a = args_for(4, 0, 0.5f, 4, 0);
    ck_assert_int_eq(gddr_residual_step_cpu(&a, x, x, age, p, bm, &np, &ns), GDDR_EINVAL);
    a.chunk = 2;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, x, NULL, age, p, bm, &np, &ns), GDDR_EINVAL);
    ck_assert_int_eq(gddr_residual_step_cpu(NULL, x, x, age, p, bm, &np, &ns), GDDR_EINVAL);
    a.alpha = NAN;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, x, x, age, p, bm, &np, &ns), GDDR_EINVAL);
    a.n = 0, a.alpha = 0.5f;
    ck_assert_int_eq(gddr_residual_step_cpu(&a, NULL, NULL, NULL, NULL, NULL, &np, &ns), GDDR_OK);
    ck_assert_uint_eq(np, 0);
    ck_assert_uint_eq(ns, 0);
    ck_assert_int_eq(gddr_pack_cpu(x, 4, 0, bm, p, &np), GDDR_EINVAL);
    ck_assert_int_eq(gddr_unpack_cpu(p, NULL, 4, 2, 1.0f, 0, x), GDDR_EINVAL);
    gddr_dc_args d = GDDR_DC_ARGS_INIT;
    d.n = 4, d.mode = 7;
    ck_assert_int_eq(gddr_dc_cpu(&d, x, x, x, NULL), GDDR_EINVAL);
    d.mode = GDDR_DC_DIAG, d.adaptive = 1;
    ck_assert_int_eq(gddr_dc_cpu(&d, x, x, x, NULL), GDDR_EINVAL);
    ck_assert_int_eq(gddr_replay_cpu(x, p, 4, 1.5f, 0), GDDR_EINVAL);
    ck_assert_int_eq(gddr_replay_cpu(x, NULL, 4, 0.5f, 0), GDDR_EINVAL);
}
END_TEST

/* ---- DC-ASGD ------------------------------------------------------------- */

static void assert_close(const float *got, const float *want, size_t n)
{
    ck_assert_uint_eq(kc_compare_f32("dc", got, want, n, 1e-6, 1e-6, NULL), 0);
}

START_TEST(test_dc_hand)
{
    const float w_new[3] = { 1.0f, 1.0f, 1.0f }, w_bak[3] = { 0.0f, 0.5f, 2.0f };
    gddr_dc_args a = GDDR_DC_ARGS_INIT;
    a.n = 3, a.lambda = 0.5f;

    /* diag: g += 0.5 * g^2 * (w_new - w_bak), with w_new - w_bak = 1, 0.5, -1. */
    float g[3] = { 1.0f, 2.0f, -1.0f };
    ck_assert_int_eq(gddr_dc_cpu(&a, g, w_new, w_bak, NULL), GDDR_OK);
    const float want_diag[3] = { 1.5f, 3.0f, -1.5f };
    assert_close(g, want_diag, 3);

    /* identity: g += 0.5 * (w_new - w_bak). */
    float g2[3] = { 1.0f, 2.0f, -1.0f };
    a.mode = GDDR_DC_IDENTITY;
    ck_assert_int_eq(gddr_dc_cpu(&a, g2, w_new, w_bak, NULL), GDDR_OK);
    const float want_id[3] = { 1.5f, 2.25f, -1.5f };
    assert_close(g2, want_id, 3);

    /* adaptive: ms = 0.5*14 + 0.5*g^2 = 9, 25, so lambda_i = 3/3, 3/5. */
    const float wn[2] = { 1.0f, 0.0f }, wb[2] = { 0.5f, 1.0f };
    float ms[2] = { 14.0f, 14.0f }, g3[2] = { 2.0f, 6.0f };
    gddr_dc_args ad = { 2, 3.0f, GDDR_DC_DIAG, 1, 0.5f, 0.0f, 1.0f };
    ck_assert_int_eq(gddr_dc_cpu(&ad, g3, wn, wb, ms), GDDR_OK);
    const float want_ms[2] = { 9.0f, 25.0f }, want_ad[2] = { 2.0f + 1.0f * 4 * 0.5f,
                                                             6.0f - 0.6f * 36 };
    assert_close(ms, want_ms, 2);
    assert_close(g3, want_ad, 2);

    float ms2[2] = { 14.0f, 14.0f }, g4[2] = { 2.0f, 6.0f };
    ad.mode = GDDR_DC_IDENTITY;
    ad.eps = 1e-7f; /* the default eps moves the result by far less than the tolerance */
    ck_assert_int_eq(gddr_dc_cpu(&ad, g4, wn, wb, ms2), GDDR_OK);
    const float want_adi[2] = { 2.5f, 5.4f };
    assert_close(g4, want_adi, 2);

    /* Bias correction: ms is used as ms * ms_scale. ms = 9, 25 as above,
     * scaled by 4: lambda_i = 3/6, 3/10; ms itself is stored unscaled. */
    float ms3[2] = { 14.0f, 14.0f }, g5[2] = { 2.0f, 6.0f };
    ad.mode = GDDR_DC_IDENTITY;
    ad.eps = 0.0f;
    ad.ms_scale = 4.0f;
    ck_assert_int_eq(gddr_dc_cpu(&ad, g5, wn, wb, ms3), GDDR_OK);
    const float want_bc[2] = { 2.0f + 0.5f * 0.5f, 6.0f - 0.3f * 1.0f };
    assert_close(ms3, want_ms, 2);
    assert_close(g5, want_bc, 2);
}
END_TEST

/* ---- replay --------------------------------------------------------------- */

/* With r zeroed before each call, r after the call is the installment itself;
 * their double sum must equal the orphan exactly and rem must end at 0. */
START_TEST(test_replay_installments)
{
    static const float gammas[] = { 0.5f, 0.3f };
    const size_t n = 1000;
    float orphan[1000], rem[1000], r[1000];
    double sum[1000];
    for (size_t gi = 0; gi < 2; gi++) {
        fill_random(orphan, n, -5.0f, 5.0f);
        memcpy(rem, orphan, sizeof rem);
        memset(sum, 0, sizeof sum);
        for (int k = 0; k < 6; k++) {
            memset(r, 0, sizeof r);
            ck_assert_int_eq(gddr_replay_cpu(r, rem, n, gammas[gi], k == 5), GDDR_OK);
            for (size_t i = 0; i < n; i++) {
                if (k == 0 && gammas[gi] == 0.5f)
                    ck_assert(r[i] == 0.5f * orphan[i]);
                sum[i] += r[i];
            }
        }
        for (size_t i = 0; i < n; i++) {
            ck_assert(rem[i] == 0.0f);
            ck_assert_msg(sum[i] == (double)orphan[i],
                          "gamma %g: element %zu sums to %.9g, not %.9g", gammas[gi], i, sum[i],
                          orphan[i]);
        }
    }
    /* Installments land on top of an existing residual. */
    float rr[2] = { 1.0f, -1.0f }, rm[2] = { 4.0f, 8.0f };
    ck_assert_int_eq(gddr_replay_cpu(rr, rm, 2, 0.5f, 0), GDDR_OK);
    ck_assert(rr[0] == 3.0f && rr[1] == 3.0f && rm[0] == 2.0f && rm[1] == 4.0f);
    ck_assert_int_eq(gddr_replay_cpu(rr, rm, 2, 0.5f, 1), GDDR_OK);
    ck_assert(rr[0] == 5.0f && rr[1] == 7.0f && rm[0] == 0.0f && rm[1] == 0.0f);
}
END_TEST

/* ---- blas ----------------------------------------------------------------- */

START_TEST(test_blas_cpu)
{
    const float v[2] = { 3.0f, 4.0f };
    ck_assert(gddr_nrm2_cpu(v, 2) == 5.0);
    ck_assert(gddr_nrm2_cpu(v, 0) == 0.0);
    const size_t n = 1000000;
    float *ones = xmalloc(n * sizeof *ones);
    for (size_t i = 0; i < n; i++)
        ones[i] = 1.0f;
    ck_assert(gddr_nrm2_cpu(ones, n) == 1000.0);
    free(ones);
    float x[3] = { 1.0f, -2.0f, 0.5f }, y[3] = { 1.0f, 1.0f, 1.0f };
    gddr_axpy_cpu(y, x, 3, 2.0f);
    ck_assert(y[0] == 3.0f && y[1] == -3.0f && y[2] == 2.0f);
    gddr_scal_cpu(x, 3, -4.0f);
    ck_assert(x[0] == -4.0f && x[1] == 8.0f && x[2] == -2.0f);
}
END_TEST


/* ---- fused passes, CPU ----------------------------------------------------- */

/* One fused-pass case: clipping factor, DC-ASGD mode, residual or dense. */
typedef struct fcase {
    float scale;
    int dc, mode, adaptive;
    int residual;
} fcase;

static const fcase fcases[] = {
    { 1.0f, 0, 0, 0, 1 },                  /* plain GDDR step */
    { 0.3712f, 0, 0, 0, 1 },               /* clipped */
    { 0.5f, 1, GDDR_DC_DIAG, 0, 1 },       /* clipped + DC diag */
    { 1.0f, 1, GDDR_DC_IDENTITY, 1, 1 },   /* DC-ASGD-a, identity */
    { 0.8125f, 1, GDDR_DC_DIAG, 1, 1 },    /* all of it */
    { 0.25f, 1, GDDR_DC_DIAG, 1, 0 },      /* dense: clipped + DC, no residual */
    { 1.0f, 0, 0, 0, 0 },                  /* dense copy */
};

/* The fused pass (after the plan) against the unfused sequence the host
 * step runs -- gddr_scal_cpu (only when clipping), gddr_dc_cpu,
 * gddr_residual_step_cpu, gddr_asum_cpu -- over several steps from the same
 * state: r, packed values, ages, bitmaps, counts and the g^2 EMA agree bit
 * for bit; the L1 of r within 1e-12 relative (both sum in double, in other
 * orders). The gradient itself is never written. */
START_TEST(test_fused_cpu_equals_unfused)
{
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (size_t fi = 0; fi < sizeof fcases / sizeof fcases[0]; fi++) {
            const fcase *k = &fcases[fi];
            const size_t n = shapes[si].n;
            const uint32_t chunk = shapes[si].chunk;
            const size_t nc = gddr_nchunks(n, chunk), nb = gddr_bitmap_bytes(nc);
            float *g = xmalloc(n * 4), *g0 = xmalloc(n * 4), *gr = xmalloc(n * 4);
            float *wn = xmalloc(n * 4), *wb = xmalloc(n * 4);
            float *ms_ref = xmalloc(n * 4), *ms = xmalloc(n * 4);
            float *r_ref = xmalloc(n * 4), *r = xmalloc(n * 4);
            float *p_ref = xmalloc(n * 4), *out = xmalloc(n * 4);
            uint32_t *age_ref = calloc(nc, 4), *age = calloc(nc, 4), *rank = xmalloc(nc * 4);
            uint8_t *bm_ref = xmalloc(nb), *bm = xmalloc(nb);
            ck_assert(age_ref && age);
            fill_random(r_ref, n, -1.0f, 1.0f);
            memcpy(r, r_ref, n * 4);
            fill_random(ms_ref, n, 0.0f, 1.0f);
            memcpy(ms, ms_ref, n * 4);
            for (uint64_t step = 0; step < 5; step++) {
                fill_random(g, n, -2.0f, 2.0f);
                fill_random(wn, n, -1.0f, 1.0f);
                fill_random(wb, n, -1.0f, 1.0f);
                memcpy(g0, g, n * 4);
                memcpy(gr, g, n * 4);
                gddr_dc_args da = { n, 0.1f, k->mode, k->adaptive, 0.9f, 1e-7f, 1.5f };
                /* the unfused reference */
                if (k->scale != 1.0f)
                    gddr_scal_cpu(gr, n, k->scale);
                if (k->dc)
                    ck_assert_int_eq(gddr_dc_cpu(&da, gr, wn, wb, k->adaptive ? ms_ref : NULL),
                                     GDDR_OK);
                gddr_residual_args ra = args_for(n, chunk, 0.5f, 3, step);
                size_t np_ref = 0, ns_ref = 0;
                double l1_ref = 0.0;
                if (k->residual) {
                    ck_assert_int_eq(gddr_residual_step_cpu(&ra, gr, r_ref, age_ref, p_ref, bm_ref,
                                                            &np_ref, &ns_ref),
                                     GDDR_OK);
                    l1_ref = gddr_asum_cpu(r_ref, n);
                }
                /* plan + fused */
                size_t np = 7, ns = 7;
                double l1 = -1.0;
                if (k->residual)
                    ck_assert_int_eq(gddr_residual_plan_cpu(&ra, age, bm, rank, &np, &ns), GDDR_OK);
                const float ctl[2] = { k->scale, 1.0f };
                gddr_fused_args fa = { n, chunk, k->residual, k->dc, da };
                gddr_fused_bufs fb = { g, wn, wb, k->adaptive ? ms : NULL, r, rank, out, &l1, ctl };
                ck_assert_int_eq(gddr_fused_cpu(&fa, &fb), GDDR_OK);

                char what[128];
                snprintf(what, sizeof what, "n=%zu chunk=%u case %zu step %llu", n, chunk, fi,
                         (unsigned long long)step);
                ck_assert_msg(memcmp(g, g0, n * 4) == 0, "%s: g was written", what);
                size_t bad = 0;
                if (k->residual) {
                    ck_assert_uint_eq(np, np_ref);
                    ck_assert_uint_eq(ns, ns_ref);
                    bad += kc_compare_u8("bitmap", bm, bm_ref, nb) +
                           kc_compare_u32("age", age, age_ref, nc) +
                           kc_compare_f32("r", r, r_ref, n, 0.0, 0.0, NULL) +
                           kc_compare_f32("packed", out, p_ref, np, 0.0, 0.0, NULL);
                    for (size_t c = 0; c < nc; c++)
                        ck_assert_uint_eq(rank[c] == GDDR_HELD, !bit(bm, c));
                    ck_assert_msg(fabs(l1 - l1_ref) <= 1e-12 * l1_ref, "%s: l1 %.17g vs %.17g",
                                  what, l1, l1_ref);
                } else {
                    bad += kc_compare_f32("dense", out, gr, n, 0.0, 0.0, NULL);
                    ck_assert(l1 == -1.0); /* dense: no residual, no L1 */
                }
                if (k->dc && k->adaptive)
                    bad += kc_compare_f32("ms", ms, ms_ref, n, 0.0, 0.0, NULL);
                ck_assert_msg(bad == 0, "%s: %zu differ", what, bad);
            }
            free(g), free(g0), free(gr), free(wn), free(wb), free(ms_ref), free(ms);
            free(r_ref), free(r), free(p_ref), free(out), free(age_ref), free(age), free(rank);
            free(bm_ref), free(bm);
        }
    }
}
END_TEST

/* ctl[1] == 0 (a non-finite norm somewhere): the pass writes nothing. */
START_TEST(test_fused_cpu_stop_writes_nothing)
{
    const size_t n = 1000;
    const uint32_t chunk = 64;
    const size_t nc = gddr_nchunks(n, chunk);
    float g[1000], wn[1000], wb[1000], ms[1000], r[1000], out[1000], r0[1000], ms0[1000];
    uint32_t rank[16];
    fill_random(g, n, -1.0f, 1.0f), fill_random(wn, n, -1.0f, 1.0f);
    fill_random(wb, n, -1.0f, 1.0f), fill_random(ms, n, 0.0f, 1.0f);
    fill_random(r, n, -1.0f, 1.0f);
    kc_fill_guard_f32(out, n);
    memcpy(r0, r, sizeof r), memcpy(ms0, ms, sizeof ms);
    for (size_t c = 0; c < nc; c++)
        rank[c] = c % 2 ? GDDR_HELD : (uint32_t)(c / 2);
    double l1 = 42.0;
    const float ctl[2] = { 0.5f, 0.0f };
    gddr_dc_args da = { n, 0.1f, GDDR_DC_DIAG, 1, 0.9f, 1e-7f, 1.0f };
    for (int residual = 0; residual < 2; residual++) {
        gddr_fused_args fa = { n, chunk, residual, 1, da };
        gddr_fused_bufs fb = { g, wn, wb, ms, r, rank, out, &l1, ctl };
        ck_assert_int_eq(gddr_fused_cpu(&fa, &fb), GDDR_OK);
        ck_assert_int_eq(memcmp(r, r0, sizeof r), 0);
        ck_assert_int_eq(memcmp(ms, ms0, sizeof ms), 0);
        ck_assert_uint_eq(kc_check_guard_f32("out", out, n), 0);
        ck_assert(l1 == 42.0);
    }
    /* Bad arguments are refused before anything is read. */
    gddr_fused_args bad = { n, 0, 1, 0, da };
    gddr_fused_bufs fb = { g, NULL, NULL, NULL, r, rank, out, &l1, ctl };
    ck_assert_int_eq(gddr_fused_cpu(&bad, &fb), GDDR_EINVAL);
    bad.chunk = chunk, bad.dc = 1, bad.dca.mode = 9;
    ck_assert_int_eq(gddr_fused_cpu(&bad, &fb), GDDR_EINVAL);
    bad.dca.mode = GDDR_DC_DIAG; /* DC without w_new / w_bak */
    ck_assert_int_eq(gddr_fused_cpu(&bad, &fb), GDDR_EINVAL);
}
END_TEST

/* The clip rule by hand, and the sum of squares behind the norm. */
START_TEST(test_clip_ctl_and_sumsq)
{
    float ctl[2];
    const double s[2] = { 9.0, 16.0 }; /* norms 3 and 4: total 5 */
    gddr_clip_ctl(s, 2, 2.5, ctl);
    ck_assert(ctl[0] == 0.5f && ctl[1] == 1.0f);
    gddr_clip_ctl(s, 2, 0.0, ctl); /* clipping off */
    ck_assert(ctl[0] == 1.0f && ctl[1] == 1.0f);
    gddr_clip_ctl(s, 2, 5.0, ctl); /* at the bound: not clipped (total > clip only) */
    ck_assert(ctl[0] == 1.0f && ctl[1] == 1.0f);
    gddr_clip_ctl(s, 2, 4.0, ctl);
    ck_assert(ctl[0] == 0.8f && ctl[1] == 1.0f);
    const double inf[2] = { 9.0, INFINITY }, nan_[2] = { NAN, 1.0 };
    gddr_clip_ctl(inf, 2, 1.0, ctl);
    ck_assert(ctl[0] == 1.0f && ctl[1] == 0.0f);
    gddr_clip_ctl(nan_, 2, 0.0, ctl);
    ck_assert(ctl[1] == 0.0f);
    gddr_clip_ctl(NULL, 0, 1.0, ctl); /* no tensors: total 0, nothing to clip */
    ck_assert(ctl[0] == 1.0f && ctl[1] == 1.0f);

    const float v[3] = { 3.0f, 4.0f, 12.0f };
    ck_assert(gddr_sumsq_cpu(v, 3) == 169.0);
    ck_assert(gddr_nrm2_cpu(v, 3) == 13.0);
    float x[1001];
    fill_random(x, 1001, -3.0f, 3.0f);
    double want = 0.0;
    for (int i = 0; i < 1001; i++)
        want += (double)x[i] * x[i];
    ck_assert(fabs(gddr_sumsq_cpu(x, 1001) - want) <= 1e-13 * want);
    x[500] = NAN;
    ck_assert(isnan(gddr_sumsq_cpu(x, 1001)));
}
END_TEST

/* gddr_sumsq_fp32_cpu and gddr_asum_fp32_cpu against the double sums:
 * within float precision at every length and alignment, NaN and Inf where
 * the input has them, and finite sums of finite inputs whose squares
 * overflow or underflow a float (the blocks summed again in double). */
static void fp32_pair(const float *x, size_t n, const char *what)
{
    const double s = gddr_sumsq_cpu(x, n), sf = gddr_sumsq_fp32_cpu(x, n);
    const double a = gddr_asum_cpu(x, n), af = gddr_asum_fp32_cpu(x, n);
    ck_assert_msg(fabs(sf - s) <= 2e-6 * s, "%s n=%zu: sumsq fp32 %.17g, double %.17g", what, n, sf, s);
    ck_assert_msg(fabs(af - a) <= 2e-6 * a, "%s n=%zu: asum fp32 %.17g, double %.17g", what, n, af, a);
    ck_assert_msg(isfinite(sf) && isfinite(af), "%s n=%zu: finite input, sums %g %g", what, n, sf, af);
}

START_TEST(test_fp32_reductions)
{
    const size_t lens[] = { 0, 1, 31, 32, 33, 1023, 1024, 1025, 1056, 5000, 262147 };
    const size_t big = 262147 + 1;
    float *x = xmalloc(big * sizeof *x);
    fill_random(x, big, -3.0f, 3.0f);
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        fp32_pair(x, lens[k], "random");
        fp32_pair(x + 1, lens[k], "random at x + 1"); /* blocks not 32-byte aligned */
    }
    ck_assert(gddr_sumsq_fp32_cpu(x, 0) == 0.0 && gddr_asum_fp32_cpu(x, 0) == 0.0);
    /* Exact where every partial sum is: 1024 ones, 3-4-12. */
    float ones[2048];
    for (int i = 0; i < 2048; i++)
        ones[i] = 1.0f;
    ck_assert(gddr_sumsq_fp32_cpu(ones, 2048) == 2048.0 && gddr_asum_fp32_cpu(ones, 2000) == 2000.0);
    const float v[3] = { 3.0f, 4.0f, 12.0f };
    ck_assert(gddr_sumsq_fp32_cpu(v, 3) == 169.0);
    /* NaN or Inf anywhere (first block, a middle block, the tail). */
    const size_t at[] = { 0, 40, 1500, 5000 - 3 };
    for (size_t k = 0; k < 4; k++) {
        float keep = x[at[k]];
        x[at[k]] = NAN;
        ck_assert_msg(isnan(gddr_sumsq_fp32_cpu(x, 5000)) && isnan(gddr_asum_fp32_cpu(x, 5000)),
                      "NaN at %zu", at[k]);
        x[at[k]] = -INFINITY;
        ck_assert_msg(gddr_sumsq_fp32_cpu(x, 5000) == INFINITY && gddr_asum_fp32_cpu(x, 5000) == INFINITY,
                      "-Inf at %zu", at[k]);
        x[at[k]] = keep;
    }
    /* Squares past FLT_MAX, and a float sum of |x| past it: still finite. */
    float *h = xmalloc(3000 * sizeof *h);
    for (int i = 0; i < 3000; i++)
        h[i] = (i % 2 ? -1.0f : 1.0f) * 3.0e38f * (0.5f + 0.5f * (float)(i % 7) / 7.0f);
    fp32_pair(h, 3000, "huge");
    for (int i = 0; i < 3000; i++)
        h[i] = 2.0e19f * (1.0f + (float)(i % 5));
    fp32_pair(h, 3000, "squares over FLT_MAX");
    /* Squares under FLT_MIN: summed again in double, not lost. */
    for (int i = 0; i < 3000; i++)
        h[i] = 1.0e-25f * (1.0f + (float)(i % 3));
    fp32_pair(h, 3000, "tiny");
    ck_assert(gddr_sumsq_fp32_cpu(h, 3000) > 0.0);
    /* One large value among tiny ones, in the same block. */
    h[100] = 1.0f;
    fp32_pair(h, 3000, "mixed");
    free(h);
    free(x);
}
END_TEST

/* ---- the CUDA plugin loader ------------------------------------------------ */

/* The plugin files of this build, next to the programs (GDDR_BIN). */
static void build_file(char *buf, size_t len, const char *rel)
{
    snprintf(buf, len, "%s/../%s", gt_bin_dir(), rel);
}

static int maps_contain(const char *what)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

/* Without a plugin every CUDA call refuses cleanly and says why; on a host
 * without the NVIDIA driver nothing of CUDA is loaded, whatever is asked. */
START_TEST(test_loader_without_plugin)
{
    char why[1024] = "";
    int usable = gddr_cuda_available(why, sizeof why);
    ck_assert_msg(why[0] != 0, "no reason given");
    if (usable) {
        printf("SKIP loader_without_plugin: a GPU is usable here (%s)\n", why);
        return;
    }
#ifndef GDDR_HAVE_CUDA
    ck_assert_msg(strstr(why, "built without CUDA") != NULL, "why: %s", why);
#else
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!drv)
        drv = dlopen("libcuda.so.1", RTLD_LAZY);
    if (drv) {
        dlclose(drv);
        printf("SKIP loader_without_plugin: an NVIDIA driver is installed (%s)\n", why);
        return;
    }
    ck_assert_msg(strstr(why, "no NVIDIA driver") && strstr(why, "libcuda.so.1"), "why: %s", why);
#endif
    ck_assert_msg(!maps_contain("libcudart") && !maps_contain("libcublas"),
                  "CUDA libraries were loaded on a host that cannot use them");
    float h[4] = { 1, 2, 3, 4 };
    ck_assert_int_eq(gddr_cuda_is_device_ptr(h), 0);
    ck_assert_int_eq(gddr_cuda_is_device_ptr(NULL), 0);
    void *p = h;
    ck_assert_int_eq(gddr_cuda_malloc(&p, 64), GDDR_ENOTSUP);
    ck_assert_ptr_null(p);
    ck_assert_str_eq(gddr_cuda_errmsg(), why);
    gddr_cuda_ctx *ctx = (gddr_cuda_ctx *)h;
    ck_assert_int_eq(gddr_cuda_ctx_create(&ctx), GDDR_ENOTSUP);
    ck_assert_ptr_null(ctx);
    ck_assert_ptr_null(gddr_cuda_ctx_stream(ctx));
    ck_assert_int_eq(gddr_cuda_free(NULL), GDDR_OK);
    ck_assert_int_eq(gddr_cuda_host_free(NULL), GDDR_OK);
    size_t np, ns;
    gddr_residual_args a = args_for(4, 2, 0.5f, 4, 0);
    ck_assert_int_eq(gddr_residual_step_cuda(&a, NULL, NULL, NULL, NULL, NULL, &np, &ns, NULL),
                     GDDR_ENOTSUP);
    gddr_dc_args d = GDDR_DC_ARGS_INIT;
    ck_assert_int_eq(gddr_dc_cuda(&d, NULL, NULL, NULL, NULL, NULL), GDDR_ENOTSUP);
    ck_assert_int_eq(gddr_sumsq_cuda(NULL, NULL, 0, NULL), GDDR_ENOTSUP);
    ck_assert_ptr_null(gddr__cuda_plugin_path());
    ck_assert_msg(!maps_contain("libcudart"), "a refused call loaded cudart");
}
END_TEST

/* Every dlopen() of this program (libgddr-client is linked in statically)
 * goes through here and is counted, then done by the C library's. */
static int dlopen_calls;
void *dlopen(const char *file, int flags)
{
    static void *(*real)(const char *, int);
    if (!real) {
        void *sym = dlsym(RTLD_NEXT, "dlopen");
        memcpy(&real, &sym, sizeof real);
    }
    dlopen_calls++;
    return real(file, flags);
}

/* gddr_step asks whether the gradient is device memory on every step. In a
 * process without the NVIDIA driver the answer must come without a dlopen:
 * one of a library that is not loaded searches the disk (92 us here) and
 * unmaps ld.so.cache, which interrupts every core the process runs on. */
START_TEST(test_device_ptr_without_driver_is_free)
{
    if (maps_contain("libcuda.so")) {
        printf("SKIP device_ptr_without_driver_is_free: this process has the driver loaded\n");
        return;
    }
    float h[4] = { 1, 2, 3, 4 };
    dlopen_calls = 0;
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(gddr_cuda_is_device_ptr(h + (i & 3)), 0);
    ck_assert_int_eq(dlopen_calls, 0);
    ck_assert_msg(!maps_contain("libcuda.so"), "asking loaded the driver");
}
END_TEST

/* Files that are not a plugin are refused with the reason; a plugin loads
 * once, and a second, different one is refused. */
START_TEST(test_loader_bad_files)
{
    char why[1024], path[1024];
    ck_assert_int_eq(gddr__cuda_plugin_load("/nonexistent/libgddr-cuda.so", why, sizeof why),
                     GDDR_ENOTSUP);
    ck_assert_msg(strstr(why, "/nonexistent/libgddr-cuda.so: not found"), "why: %s", why);
    build_file(path, sizeof path, "lib/libgddr-client.so");
    ck_assert_int_eq(gddr__cuda_plugin_load(path, why, sizeof why), GDDR_ENOTSUP);
    ck_assert_msg(strstr(why, "not a GDDR CUDA plugin"), "why: %s", why);
    ck_assert_ptr_null(gddr__cuda_plugin_path());

    build_file(path, sizeof path, "tests/libgddr-fakecuda.so");
    ck_assert_int_eq(gddr__cuda_plugin_load(path, why, sizeof why), GDDR_OK);
    ck_assert_str_eq(gddr__cuda_plugin_path(), path);
    ck_assert_int_eq(gddr__cuda_plugin_load(path, why, sizeof why), GDDR_OK); /* the same: fine */
    build_file(path, sizeof path, "lib/libgddr-cuda.so");
    ck_assert_int_eq(gddr__cuda_plugin_load(path, why, sizeof why), GDDR_ESTATE);
    ck_assert_msg(strstr(why, "another CUDA plugin is loaded"), "why: %s", why);
    /* Calls now go through it: its device memory is recognised, a failing
     * call leaves its message. */
    ck_assert_int_eq(gddr_cuda_available(why, sizeof why), 1);
    ck_assert_msg(strstr(why, "fake CUDA plugin"), "why: %s", why);
    float *d = NULL, h[8] = { 0 };
    ck_assert_int_eq(gddr_cuda_malloc((void **)&d, sizeof h), GDDR_OK);
    ck_assert_int_eq(gddr_cuda_is_device_ptr(d), 1);
    ck_assert_int_eq(gddr_cuda_is_device_ptr(h), 0);
    ck_assert_int_eq(gddr_cuda_memcpy_d2h(d, h, sizeof h, NULL), GDDR_EINVAL); /* swapped */
    ck_assert_msg(strstr(gddr_cuda_errmsg(), "is not device memory"), "errmsg: %s",
                  gddr_cuda_errmsg());
    ck_assert_int_eq(gddr_cuda_free(d), GDDR_OK);
}
END_TEST

#ifdef GDDR_HAVE_CUDA
/* The real plugin loads and reports through the same channel. Without a
 * GPU (no driver) the CUDA runtime's own error must come back as the
 * message of the failing call. */
START_TEST(test_loader_real_plugin)
{
    char why[1024], path[1024];
    build_file(path, sizeof path, "lib/libgddr-cuda.so");
    int rc = gddr__cuda_plugin_load(path, why, sizeof why);
    ck_assert_msg(rc == GDDR_OK, "%s: %s", path, why);
    ck_assert(maps_contain("libcudart"));
    if (gddr_cuda_available(why, sizeof why)) {
        printf("plugin %s: %s\n", path, why);
        return; /* a GPU: the gpu cases below use it */
    }
    ck_assert_msg(why[0] != 0, "no reason");
    void *p = NULL;
    rc = gddr_cuda_malloc(&p, 64);
    ck_assert_int_eq(rc, GDDR_ECUDA);
    ck_assert_msg(strstr(gddr_cuda_errmsg(), "cudaMalloc") != NULL, "errmsg: %s",
                  gddr_cuda_errmsg());
    gddr_cuda_ctx *ctx = NULL;
    ck_assert_int_eq(gddr_cuda_ctx_create(&ctx), GDDR_ECUDA);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(gddr_cuda_errmsg(), "cuda_rt.c:") != NULL, "errmsg: %s",
                  gddr_cuda_errmsg());
    printf("real plugin without a GPU: %s / %s\n", why, gddr_cuda_errmsg());
}
END_TEST
#endif

/* ---- GPU against the CPU twins ------------------------------------------- */

#define CUDA_OK(call) ck_assert_int_eq((call), GDDR_OK)

static void *dev_alloc(size_t bytes)
{
    void *d = NULL;
    CUDA_OK(gddr_cuda_malloc(&d, bytes));
    return d;
}

static void *dev_from(const void *h, size_t bytes)
{
    void *d = dev_alloc(bytes);
    CUDA_OK(gddr_cuda_memcpy_h2d(d, h, bytes, NULL));
    return d;
}

static void to_host(void *h, const void *d, size_t bytes)
{
    CUDA_OK(gddr_cuda_memcpy_d2h(h, d, bytes, NULL));
    CUDA_OK(gddr_cuda_sync(NULL));
}

START_TEST(test_gpu_context)
{
    gddr_cuda_ctx *ctx = NULL;
    CUDA_OK(gddr_cuda_ctx_create(&ctx));
    ck_assert_ptr_nonnull(ctx);
    ck_assert_ptr_nonnull(gddr_cuda_ctx_stream(ctx));
    float h[16], back[16], *pinned = NULL;
    fill_random(h, 16, -1.0f, 1.0f);
    float *d = dev_from(h, sizeof h);
    ck_assert_int_eq(gddr_cuda_is_device_ptr(d), 1);
    ck_assert_int_eq(gddr_cuda_is_device_ptr(h), 0);
    ck_assert_int_eq(gddr_cuda_is_device_ptr(NULL), 0);
    CUDA_OK(gddr_cuda_host_alloc((void **)&pinned, sizeof h));
    ck_assert_int_eq(gddr_cuda_is_device_ptr(pinned), 0);
    CUDA_OK(gddr_cuda_memcpy_d2h(pinned, d, sizeof h, gddr_cuda_ctx_stream(ctx)));
    CUDA_OK(gddr_cuda_sync(gddr_cuda_ctx_stream(ctx)));
    to_host(back, d, sizeof back);
    ck_assert_int_eq(memcmp(back, h, sizeof h), 0);
    ck_assert_int_eq(memcmp(pinned, h, sizeof h), 0);
    CUDA_OK(gddr_cuda_host_free(pinned));
    CUDA_OK(gddr_cuda_free(d));
    gddr_cuda_ctx_destroy(&ctx);
    ck_assert_ptr_null(ctx);
}
END_TEST

static const struct { size_t n; uint32_t chunk; int misalign; } gshapes[] = {
    { 1, 1, 0 },       { 1000, 64, 0 },      { 4097, 256, 0 },   { 100003, 1000, 0 },
    { 1000003, 256, 0 }, { 200001, 7, 0 },   { 1 << 20, 1, 0 },  { 50000, 256, 1 },
};

/* Both twins take the same steps from the same state; after every step the
 * bitmaps, ages, residuals and packed values must agree exactly (u = r + g
 * is one rounding on both), and nothing past any output may change. */
START_TEST(test_gpu_residual)
{
    static const float alphas[] = { 0.0f, 0.5f, 1.0f };
    static const uint32_t taus[] = { 4, 1, 6 };
    const size_t G = KC_GUARD;
    for (size_t si = 0; si < sizeof gshapes / sizeof gshapes[0]; si++) {
        const size_t n = gshapes[si].n, off = (size_t)gshapes[si].misalign;
        const uint32_t chunk = gshapes[si].chunk;
        const size_t nc = gddr_nchunks(n, chunk), nb = gddr_bitmap_bytes(nc);
        float *g = xmalloc(n * sizeof *g), *r = xmalloc((n + G) * sizeof *r);
        float *packed = xmalloc((n + G) * sizeof *packed);
        float *got_r = xmalloc((n + G + off) * sizeof *got_r);
        float *got_p = xmalloc((n + G + off) * sizeof *got_p);
        uint32_t *age = xmalloc((nc + G) * sizeof *age), *got_age = xmalloc((nc + G) * sizeof *age);
        uint8_t *bm = xmalloc(nb + G), *got_bm = xmalloc(nb + G);
        for (size_t ai = 0; ai < sizeof alphas / sizeof alphas[0]; ai++) {
            fill_random(r, n, -1.0f, 1.0f);
            kc_fill_guard_f32(r + n, G);
            for (size_t c = 0; c < nc + G; c++)
                age[c] = c < nc ? (uint32_t)(rng_u64() % 6) : 0xa5a5a5a5u;
            /* Offsetting every device pointer by one float forces the
             * one-float path even where chunk % 4 == 0. */
            float *d_rbase = dev_alloc((n + G + off) * sizeof *r), *d_r = d_rbase + off;
            CUDA_OK(gddr_cuda_memcpy_h2d(d_r, r, (n + G) * sizeof *r, NULL));
            float *d_gbase = dev_alloc((n + off) * sizeof *g), *d_g = d_gbase + off;
            float *d_pbase = dev_alloc((n + G + off) * sizeof *packed), *d_p = d_pbase + off;
            uint32_t *d_age = dev_from(age, (nc + G) * sizeof *age);
            uint8_t *d_bm = dev_alloc(nb + G);
            for (uint64_t step = 0; step < 6; step++) {
                const int zero_g = step == 4;
                fill_random(g, n, -1.0f, 1.0f);
                CUDA_OK(gddr_cuda_memcpy_h2d(d_g, g, n * sizeof *g, NULL));
                kc_fill_guard_f32(got_p, n + G);
                CUDA_OK(gddr_cuda_memcpy_h2d(d_p, got_p, (n + G) * sizeof *got_p, NULL));
                memset(got_bm, KC_SENTINEL_U8, nb + G);
                CUDA_OK(gddr_cuda_memcpy_h2d(d_bm, got_bm, nb + G, NULL));

                gddr_residual_args a = args_for(n, chunk, alphas[ai], taus[step % 3], step);
                if (step % 2 && alphas[ai] > 0) { /* the staggered schedule, rank 3 of 5 */
                    a.period = gddr_hold_period(alphas[ai], a.tau);
                    a.phase = gddr_hold_phase(a.period, a.worker, 5, step);
                }
                size_t np, ns, gnp = 7, gns = 7;
                CUDA_OK(gddr_residual_step_cpu(&a, zero_g ? NULL : g, r, age, packed, bm, &np,
                                               &ns));
                CUDA_OK(gddr_residual_step_cuda(&a, zero_g ? NULL : d_g, d_r, d_age, d_p, d_bm,
                                                &gnp, &gns, NULL));
                ck_assert_uint_eq(gnp, np);
                ck_assert_uint_eq(gns, ns);
                to_host(got_r, d_r, (n + G) * sizeof *got_r);
                to_host(got_p, d_p, (n + G) * sizeof *got_p);
                to_host(got_age, d_age, (nc + G) * sizeof *got_age);
                to_host(got_bm, d_bm, nb + G);
                size_t bad = kc_compare_u8("bitmap", got_bm, bm, nb) +
                             kc_compare_u32("age", got_age, age, nc) +
                             kc_compare_f32("r", got_r, r, n, 0.0, 0.0, NULL) +
                             kc_compare_f32("packed", got_p, packed, np, 0.0, 0.0, NULL) +
                             kc_check_guard_f32("r guard", got_r + n, G) +
                             kc_check_guard_f32("packed tail", got_p + np, n + G - np) +
                             kc_check_guard_bytes("bitmap guard", got_bm + nb, G, KC_SENTINEL_U8) +
                             kc_check_guard_bytes("age guard", got_age + nc, G * sizeof *age,
                                                  0xa5);
                ck_assert_msg(bad == 0, "n=%zu chunk=%u misalign=%zu alpha=%g step=%llu: %zu bad",
                              n, chunk, off, alphas[ai], (unsigned long long)step, bad);
            }
            CUDA_OK(gddr_cuda_free(d_rbase));
            CUDA_OK(gddr_cuda_free(d_gbase));
            CUDA_OK(gddr_cuda_free(d_pbase));
            CUDA_OK(gddr_cuda_free(d_age));
            CUDA_OK(gddr_cuda_free(d_bm));
        }
        free(g), free(r), free(packed), free(got_r), free(got_p), free(age), free(got_age);
        free(bm), free(got_bm);
    }
}
END_TEST

START_TEST(test_gpu_pack_unpack)
{
    const size_t G = KC_GUARD;
    for (size_t si = 0; si < sizeof gshapes / sizeof gshapes[0]; si++) {
        const size_t n = gshapes[si].n;
        const uint32_t chunk = gshapes[si].chunk;
        const size_t nc = gddr_nchunks(n, chunk), nb = gddr_bitmap_bytes(nc);
        float *src = xmalloc(n * sizeof *src), *packed = xmalloc(n * sizeof *packed);
        float *got = xmalloc((n + G) * sizeof *got), *dense = xmalloc((n + G) * sizeof *dense);
        uint8_t *bm = xmalloc(nb);
        fill_random(src, n, -3.0f, 3.0f);
        for (size_t b = 0; b < nb; b++)
            bm[b] = (uint8_t)rng_u64();
        float *d_src = dev_from(src, n * sizeof *src);
        uint8_t *d_bm = dev_from(bm, nb);
        kc_fill_guard_f32(got, n + G);
        float *d_p = dev_from(got, (n + G) * sizeof *got);

        size_t np, gnp = 7;
        CUDA_OK(gddr_pack_cpu(src, n, chunk, bm, packed, &np));
        CUDA_OK(gddr_pack_cuda(d_src, n, chunk, d_bm, d_p, &gnp, NULL));
        ck_assert_uint_eq(gnp, np);
        to_host(got, d_p, (n + G) * sizeof *got);
        ck_assert_uint_eq(kc_compare_f32("pack", got, packed, np, 0.0, 0.0, NULL) +
                              kc_check_guard_f32("pack tail", got + np, n + G - np),
                          0);

        for (int acc = 0; acc < 2; acc++) {
            const float scale = acc ? -1.5f : 0.25f;
            fill_random(dense, n, -1.0f, 1.0f);
            kc_fill_guard_f32(dense + n, G);
            float *d_dense = dev_from(dense, (n + G) * sizeof *dense);
            CUDA_OK(gddr_unpack_cpu(packed, bm, n, chunk, scale, acc, dense));
            CUDA_OK(gddr_unpack_cuda(d_p, d_bm, n, chunk, scale, acc, d_dense, NULL));
            to_host(got, d_dense, (n + G) * sizeof *got);
            ck_assert_msg(kc_compare_f32("unpack", got, dense, n, 1e-7, 1e-6, NULL) +
                                  kc_check_guard_f32("unpack guard", got + n, G) ==
                              0,
                          "n=%zu chunk=%u accumulate=%d", n, chunk, acc);
            CUDA_OK(gddr_cuda_free(d_dense));
        }
        CUDA_OK(gddr_cuda_free(d_src));
        CUDA_OK(gddr_cuda_free(d_bm));
        CUDA_OK(gddr_cuda_free(d_p));
        free(src), free(packed), free(got), free(dense), free(bm);
    }
}
END_TEST

static const size_t gsizes[] = { 1, 1000, 65536, (1 << 20) + 3 };

START_TEST(test_gpu_dc)
{
    const size_t G = KC_GUARD;
    for (size_t si = 0; si < sizeof gsizes / sizeof gsizes[0]; si++) {
        const size_t n = gsizes[si];
        float *g = xmalloc((n + G) * sizeof *g), *wn = xmalloc(n * sizeof *wn);
        float *wb = xmalloc(n * sizeof *wb), *ms = xmalloc((n + G) * sizeof *ms);
        float *got = xmalloc((n + G) * sizeof *got);
        for (int mode = GDDR_DC_DIAG; mode <= GDDR_DC_IDENTITY; mode++) {
            for (int adaptive = 0; adaptive < 2; adaptive++) {
                fill_random(g, n, -2.0f, 2.0f);
                fill_random(wn, n, -1.0f, 1.0f);
                fill_random(wb, n, -1.0f, 1.0f);
                fill_random(ms, n, 0.0f, 1.0f);
                kc_fill_guard_f32(g + n, G);
                kc_fill_guard_f32(ms + n, G);
                float *d_g = dev_from(g, (n + G) * sizeof *g), *d_ms = dev_from(ms, (n + G) * 4);
                float *d_wn = dev_from(wn, n * sizeof *wn), *d_wb = dev_from(wb, n * sizeof *wb);
                gddr_dc_args a = { n, 0.1f, mode, adaptive, 0.9f, 1e-7f, adaptive ? 3.0f : 1.0f };
                CUDA_OK(gddr_dc_cpu(&a, g, wn, wb, adaptive ? ms : NULL));
                CUDA_OK(gddr_dc_cuda(&a, d_g, d_wn, d_wb, adaptive ? d_ms : NULL, NULL));
                size_t bad = 0;
                to_host(got, d_g, (n + G) * sizeof *got);
                bad += kc_compare_f32("dc g", got, g, n, 1e-6, 1e-5, NULL) +
                       kc_check_guard_f32("dc g guard", got + n, G);
                to_host(got, d_ms, (n + G) * sizeof *got);
                bad += kc_compare_f32("dc ms", got, ms, n, 1e-6, 1e-5, NULL) +
                       kc_check_guard_f32("dc ms guard", got + n, G);
                ck_assert_msg(bad == 0, "n=%zu mode=%d adaptive=%d", n, mode, adaptive);
                CUDA_OK(gddr_cuda_free(d_g));
                CUDA_OK(gddr_cuda_free(d_ms));
                CUDA_OK(gddr_cuda_free(d_wn));
                CUDA_OK(gddr_cuda_free(d_wb));
            }
        }
        free(g), free(wn), free(wb), free(ms), free(got);
    }
}
END_TEST

START_TEST(test_gpu_replay)
{
    const size_t G = KC_GUARD;
    for (size_t si = 0; si < sizeof gsizes / sizeof gsizes[0]; si++) {
        const size_t n = gsizes[si];
        float *r = xmalloc((n + G) * sizeof *r), *rem = xmalloc((n + G) * sizeof *rem);
        float *got = xmalloc((n + G) * sizeof *got);
        fill_random(r, n, -1.0f, 1.0f);
        fill_random(rem, n, -5.0f, 5.0f);
        kc_fill_guard_f32(r + n, G);
        kc_fill_guard_f32(rem + n, G);
        float *d_r = dev_from(r, (n + G) * sizeof *r), *d_rem = dev_from(rem, (n + G) * 4);
        for (int k = 0; k < 5; k++) {
            const float gamma = k < 2 ? 0.5f : 0.3f;
            CUDA_OK(gddr_replay_cpu(r, rem, n, gamma, k == 4));
            CUDA_OK(gddr_replay_cuda(d_r, d_rem, n, gamma, k == 4, NULL));
            size_t bad = 0;
            to_host(got, d_r, (n + G) * sizeof *got);
            bad += kc_compare_f32("replay r", got, r, n, 1e-6, 1e-6, NULL) +
                   kc_check_guard_f32("replay r guard", got + n, G);
            to_host(got, d_rem, (n + G) * sizeof *got);
            bad += kc_compare_f32("replay rem", got, rem, n, 1e-6, 1e-6, NULL) +
                   kc_check_guard_f32("replay rem guard", got + n, G);
            ck_assert_msg(bad == 0, "n=%zu installment %d", n, k);
        }
        CUDA_OK(gddr_cuda_free(d_r));
        CUDA_OK(gddr_cuda_free(d_rem));
        free(r), free(rem), free(got);
    }
}
END_TEST

START_TEST(test_gpu_blas)
{
    const size_t G = KC_GUARD;
    gddr_cuda_ctx *ctx = NULL;
    CUDA_OK(gddr_cuda_ctx_create(&ctx));
    for (size_t si = 0; si < sizeof gsizes / sizeof gsizes[0]; si++) {
        const size_t n = gsizes[si];
        float *x = xmalloc(n * sizeof *x), *y = xmalloc((n + G) * sizeof *y);
        float *got = xmalloc((n + G) * sizeof *got);
        fill_random(x, n, -1.0f, 1.0f);
        fill_random(y, n, -1.0f, 1.0f);
        kc_fill_guard_f32(y + n, G);
        float *d_x = dev_from(x, n * sizeof *x), *d_y = dev_from(y, (n + G) * sizeof *y);
        double nrm = -1.0;
        CUDA_OK(gddr_nrm2_cuda(ctx, d_x, n, &nrm));
        const double want = gddr_nrm2_cpu(x, n);
        ck_assert_msg(fabs(nrm - want) <= 1e-5 * want, "nrm2 n=%zu: %.9g vs %.9g", n, nrm, want);
        gddr_axpy_cpu(y, x, n, 0.75f);
        CUDA_OK(gddr_axpy_cuda(ctx, d_y, d_x, n, 0.75f));
        gddr_scal_cpu(y, n, -3.0f);
        CUDA_OK(gddr_scal_cuda(ctx, d_y, n, -3.0f));
        CUDA_OK(gddr_cuda_sync(gddr_cuda_ctx_stream(ctx)));
        to_host(got, d_y, (n + G) * sizeof *got);
        ck_assert_uint_eq(kc_compare_f32("axpy+scal", got, y, n, 1e-6, 1e-6, NULL) +
                              kc_check_guard_f32("axpy guard", got + n, G),
                          0);
        CUDA_OK(gddr_cuda_free(d_x));
        CUDA_OK(gddr_cuda_free(d_y));
        free(x), free(y), free(got);
    }
    gddr_cuda_ctx_destroy(&ctx);
}
END_TEST


/* Pass 1 and the clip kernel against their twins. */
/* hold_schedule = smallest on the GPU: the chunk scores are the CPU
 * twin's bits (the same lane order), with and without g; the device step
 * refuses a pick (host memory; the smallest schedule is planned on the host). */
START_TEST(test_gpu_chunk_scores)
{
    gddr_cuda_ctx *ctx = NULL;
    CUDA_OK(gddr_cuda_ctx_create(&ctx));
    void *st = gddr_cuda_ctx_stream(ctx);
    static const uint32_t chunks[] = { 1, 37, 1024 };
    for (size_t i = 0; i < sizeof gsizes / sizeof gsizes[0]; i++)
        for (size_t k = 0; k < 3; k++) {
            const size_t n = gsizes[i], nc = gddr_nchunks(n, chunks[k]);
            float *g = xmalloc(n * 4), *r = xmalloc(n * 4);
            fill_random(g, n, -2.0f, 2.0f);
            fill_random(r, n, -1.0f, 1.0f);
            float *d_g = dev_from(g, n * 4), *d_r = dev_from(r, n * 4);
            double *want = xmalloc(nc * 8), *got = xmalloc(nc * 8), *d_s = dev_alloc(nc * 8);
            for (int withg = 0; withg < 2; withg++) {
                ck_assert_int_eq(gddr_chunk_scores_cpu(withg ? g : NULL, r, n, chunks[k], want), GDDR_OK);
                CUDA_OK(gddr_chunk_scores_cuda(withg ? d_g : NULL, d_r, n, chunks[k], d_s, st));
                CUDA_OK(gddr_cuda_sync(st));
                to_host(got, d_s, nc * 8);
                ck_assert_msg(memcmp(got, want, nc * 8) == 0, "scores n=%zu chunk %u g=%d differ", n,
                              chunks[k], withg);
            }
            CUDA_OK(gddr_cuda_free(d_g));
            CUDA_OK(gddr_cuda_free(d_r));
            CUDA_OK(gddr_cuda_free(d_s));
            free(g), free(r), free(want), free(got);
        }
    uint8_t pick[1] = { 1 };
    gddr_residual_args a = args_for(16, 16, 0.5f, 4, 0);
    a.pick = pick;
    float *d_x = dev_alloc(64), *d_p = dev_alloc(64);
    uint32_t *d_age = dev_alloc(4);
    uint8_t *d_bm = dev_alloc(1);
    size_t np, ns;
    ck_assert_int_eq(gddr_residual_step_cuda(&a, d_x, d_x, d_age, d_p, d_bm, &np, &ns, st), GDDR_EINVAL);
    CUDA_OK(gddr_cuda_free(d_x));
    CUDA_OK(gddr_cuda_free(d_p));
    CUDA_OK(gddr_cuda_free(d_age));
    CUDA_OK(gddr_cuda_free(d_bm));
    gddr_cuda_ctx_destroy(&ctx);
}
END_TEST

START_TEST(test_gpu_sumsq_clip)
{
    gddr_cuda_ctx *ctx = NULL;
    CUDA_OK(gddr_cuda_ctx_create(&ctx));
    void *st = gddr_cuda_ctx_stream(ctx);
    const int nt = (int)(sizeof gsizes / sizeof gsizes[0]);
    double *d_s = dev_alloc(nt * sizeof(double)), want[8], got[8];
    float *d_ctl = dev_alloc(2 * sizeof(float));
    for (int i = 0; i < nt; i++) {
        const size_t n = gsizes[i];
        float *x = xmalloc(n * 4);
        fill_random(x, n, -2.0f, 2.0f);
        float *d_x = dev_from(x, n * 4);
        CUDA_OK(gddr_sumsq_cuda(ctx, d_x, n, d_s + i));
        CUDA_OK(gddr_cuda_sync(st));
        if (n > 1) {
            /* A tensor at an offset that is not 16-byte aligned (the
             * kernel reads four floats a load only when it is). */
            double odd = 0.0, *d_odd = dev_alloc(sizeof(double));
            CUDA_OK(gddr_sumsq_cuda(ctx, d_x + 1, n - 1, d_odd));
            CUDA_OK(gddr_cuda_sync(st));
            to_host(&odd, d_odd, sizeof odd);
            const double w1 = gddr_sumsq_cpu(x + 1, n - 1);
            ck_assert_msg(fabs(odd - w1) <= 1e-12 * w1, "sumsq at x + 1, n=%zu: %.17g vs %.17g", n - 1, odd,
                          w1);
            CUDA_OK(gddr_cuda_free(d_odd));
        }
        CUDA_OK(gddr_cuda_free(d_x));
        want[i] = gddr_sumsq_cpu(x, n);
        free(x);
    }
    to_host(got, d_s, nt * sizeof(double));
    for (int i = 0; i < nt; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= 1e-12 * want[i], "sumsq n=%zu: %.17g vs %.17g",
                      gsizes[i], got[i], want[i]);
    static const double clips[] = { 0.0, 1.0, 1e9 };
    for (int k = 0; k < 3; k++) {
        float ctl[2], gctl[2];
        gddr_clip_ctl(got, nt, clips[k], ctl); /* the same sums on both sides */
        CUDA_OK(gddr_clip_cuda(ctx, d_s, nt, clips[k], d_ctl));
        CUDA_OK(gddr_cuda_sync(st));
        to_host(gctl, d_ctl, sizeof gctl);
        ck_assert_msg(memcmp(ctl, gctl, sizeof ctl) == 0, "clip %g: %.9g/%g vs %.9g/%g", clips[k],
                      gctl[0], gctl[1], ctl[0], ctl[1]);
    }
    CUDA_OK(gddr_cuda_free(d_s));
    CUDA_OK(gddr_cuda_free(d_ctl));
    gddr_cuda_ctx_destroy(&ctx);
}
END_TEST

/* Pass 2 against the CPU twin from the same state and plan: r, out and ms
 * bit for bit, l1 within 1e-12 relative, nothing past any output touched,
 * and nothing at all when ctl[1] == 0. */
START_TEST(test_gpu_fused)
{
    const size_t G = KC_GUARD;
    gddr_cuda_ctx *ctx = NULL;
    CUDA_OK(gddr_cuda_ctx_create(&ctx));
    void *st = gddr_cuda_ctx_stream(ctx);
    for (size_t si = 0; si < sizeof gshapes / sizeof gshapes[0]; si++) {
        const size_t n = gshapes[si].n;
        const uint32_t chunk = gshapes[si].chunk;
        const size_t nc = gddr_nchunks(n, chunk), nb = gddr_bitmap_bytes(nc);
        for (size_t fi = 0; fi < sizeof fcases / sizeof fcases[0]; fi++) {
            const fcase *k = &fcases[fi];
            float *g = xmalloc(n * 4), *wn = xmalloc(n * 4), *wb = xmalloc(n * 4);
            float *ms = xmalloc((n + G) * 4), *r = xmalloc((n + G) * 4);
            float *out = xmalloc((n + G) * 4), *got = xmalloc((n + G) * 4);
            uint32_t *age = calloc(nc, 4), *rank = xmalloc(nc * 4);
            uint8_t *bm = xmalloc(nb);
            ck_assert_ptr_nonnull(age);
            fill_random(g, n, -2.0f, 2.0f), fill_random(wn, n, -1.0f, 1.0f);
            fill_random(wb, n, -1.0f, 1.0f), fill_random(ms, n, 0.0f, 1.0f);
            fill_random(r, n, -1.0f, 1.0f);
            kc_fill_guard_f32(ms + n, G), kc_fill_guard_f32(r + n, G);
            kc_fill_guard_f32(out, n + G);
            float *d_g = dev_from(g, n * 4), *d_wn = dev_from(wn, n * 4), *d_wb = dev_from(wb, n * 4);
            float *d_ms = dev_from(ms, (n + G) * 4), *d_r = dev_from(r, (n + G) * 4);
            float *d_out = dev_from(out, (n + G) * 4);
            double *d_l1 = dev_alloc(sizeof(double));
            float *d_ctl = dev_alloc(2 * sizeof(float));
            for (int go = 0; go < 2; go++) {
                size_t np = n, ns = 0;
                gddr_residual_args ra = args_for(n, chunk, 0.5f, 3, (uint64_t)si);
                if (k->residual)
                    CUDA_OK(gddr_residual_plan_cpu(&ra, age, bm, rank, &np, &ns));
                uint32_t *d_rank = dev_from(rank, nc * 4);
                const float ctl[2] = { k->scale, go ? 1.0f : 0.0f };
                CUDA_OK(gddr_cuda_memcpy_h2d(d_ctl, ctl, sizeof ctl, NULL));
                double l1 = -1.0, gl1 = -1.0;
                CUDA_OK(gddr_cuda_memcpy_h2d(d_l1, &gl1, sizeof gl1, NULL));
                gddr_dc_args da = { n, 0.1f, k->mode, k->adaptive, 0.9f, 1e-7f, 1.5f };
                gddr_fused_args fa = { n, chunk, k->residual, k->dc, da };
                gddr_fused_bufs hb = { g, wn, wb, k->adaptive ? ms : NULL, r, rank, out, &l1, ctl };
                gddr_fused_bufs db = { d_g, d_wn, d_wb, k->adaptive ? d_ms : NULL, d_r, d_rank,
                                       d_out, d_l1, d_ctl };
                CUDA_OK(gddr_cuda_sync(NULL));
                CUDA_OK(gddr_fused_cpu(&fa, &hb));
                CUDA_OK(gddr_fused_cuda(ctx, &fa, &db));
                CUDA_OK(gddr_cuda_sync(st));
                const size_t nout = k->residual ? np : n;
                size_t bad = 0;
                to_host(got, d_out, (n + G) * 4);
                bad += kc_compare_f32("out", got, out, nout, 0.0, 0.0, NULL) +
                       kc_check_guard_f32("out tail", got + nout, n + G - nout);
                to_host(got, d_r, (n + G) * 4);
                bad += kc_compare_f32("r", got, r, n, 0.0, 0.0, NULL) +
                       kc_check_guard_f32("r guard", got + n, G);
                to_host(got, d_ms, (n + G) * 4);
                bad += kc_compare_f32("ms", got, ms, n, 0.0, 0.0, NULL) +
                       kc_check_guard_f32("ms guard", got + n, G);
                to_host(&gl1, d_l1, sizeof gl1);
                if (!k->residual || !go)
                    bad += gl1 != -1.0; /* not written */
                else
                    bad += !(fabs(gl1 - l1) <= 1e-12 * l1);
                ck_assert_msg(bad == 0, "n=%zu chunk=%u case %zu go=%d: %zu bad (l1 %.17g vs %.17g)",
                              n, chunk, fi, go, bad, gl1, l1);
                CUDA_OK(gddr_cuda_free(d_rank));
            }
            void *dp[] = { d_g, d_wn, d_wb, d_ms, d_r, d_out, d_l1, d_ctl };
            for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++)
                CUDA_OK(gddr_cuda_free(dp[i]));
            free(g), free(wn), free(wb), free(ms), free(r), free(out), free(got), free(age);
            free(rank), free(bm);
        }
    }
    gddr_cuda_ctx_destroy(&ctx);
}
END_TEST

/* ---- GPU availability ---------------------------------------------------- */

static char gpu_why[256];

START_TEST(test_gpu_skipped)
{
    /* What a host without a usable GPU gets instead is tested by the
     * loader cases above. */
    printf("SKIP gpu: %s\n", gpu_why);
    fflush(stdout);
    ck_assert(gpu_why[0] != 0);
}
END_TEST

Suite *suite_kernels(void)
{
    Suite *s = suite_create("kernels");
    TCase *cpu = tcase_create("cpu");
    tcase_set_timeout(cpu, 60);
    tcase_add_test(cpu, test_hash_pure);
    tcase_add_test(cpu, test_residual_conservation);
    tcase_add_test(cpu, test_residual_held_fraction);
    tcase_add_test(cpu, test_residual_age_bound);
    tcase_add_test(cpu, test_residual_mask_pure);
    tcase_add_test(cpu, test_residual_staggered);
    tcase_add_test(cpu, test_residual_smallest);
    tcase_add_test(cpu, test_bitmap_count);
    tcase_add_test(cpu, test_pack_unpack_roundtrip);
    tcase_add_test(cpu, test_invalid_args);
    tcase_add_test(cpu, test_dc_hand);
    tcase_add_test(cpu, test_replay_installments);
    tcase_add_test(cpu, test_blas_cpu);
    tcase_add_test(cpu, test_fused_cpu_equals_unfused);
    tcase_add_test(cpu, test_fused_cpu_stop_writes_nothing);
    tcase_add_test(cpu, test_clip_ctl_and_sumsq);
    tcase_add_test(cpu, test_fp32_reductions);
    suite_add_tcase(s, cpu);

    TCase *loader = tcase_create("loader");
    tcase_set_timeout(loader, 60);
    tcase_add_test(loader, test_loader_without_plugin);
    tcase_add_test(loader, test_device_ptr_without_driver_is_free);
    tcase_add_test(loader, test_loader_bad_files);
#ifdef GDDR_HAVE_CUDA
    tcase_add_test(loader, test_loader_real_plugin);
#endif
    suite_add_tcase(s, loader);

    TCase *gpu = tcase_create("gpu");
    if (gt_gpu_probe(gpu_why, sizeof gpu_why)) {
        tcase_set_timeout(gpu, 120);
        tcase_add_test(gpu, test_gpu_context);
        tcase_add_test(gpu, test_gpu_residual);
        tcase_add_test(gpu, test_gpu_pack_unpack);
        tcase_add_test(gpu, test_gpu_dc);
        tcase_add_test(gpu, test_gpu_replay);
        tcase_add_test(gpu, test_gpu_blas);
        tcase_add_test(gpu, test_gpu_sumsq_clip);
        tcase_add_test(gpu, test_gpu_chunk_scores);
        tcase_add_test(gpu, test_gpu_fused);
    } else {
        tcase_add_test(gpu, test_gpu_skipped);
    }
    suite_add_tcase(s, gpu);
    return s;
}
