/* kcompare.h -- comparing a kernel's output with its CPU twin.
 *
 * One rule for every kernel test and benchmark (ggml's test-backend-ops,
 * llm.c's dev/cuda): element i passes when |got - ref| <= abs + |ref|*rel,
 * NaN matches only NaN. On failure the first few mismatches and the largest
 * error are printed, which says more than a bare assertion. Guard elements
 * placed after an output must still hold their sentinel bit pattern, which
 * catches a kernel that writes past its end.
 */
#ifndef GDDR_TESTS_KCOMPARE_H
#define GDDR_TESTS_KCOMPARE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KC_SHOW 5   /* mismatches printed per comparison */

/* Returns the number of mismatches; *max_err (may be NULL) receives the
 * largest |got - ref| seen. */
static inline size_t kc_compare_f32(const char *what, const float *got, const float *ref,
                                    size_t n, double abs_tol, double rel_tol, double *max_err)
{
    size_t bad = 0, worst_at = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double g = got[i], r = ref[i];
        int ok;
        double err;
        if (isnan(r) || isnan(g)) {
            ok = isnan(r) && isnan(g);
            err = ok ? 0.0 : INFINITY;
        } else {
            err = fabs(g - r);
            ok = err <= abs_tol + fabs(r) * rel_tol;
        }
        if (err > worst) {
            worst = err;
            worst_at = i;
        }
        if (!ok) {
            if (bad < KC_SHOW)
                fprintf(stderr, "  %s[%zu]: got %.9g, want %.9g (err %.3g)\n", what, i, g, r, err);
            bad++;
        }
    }
    if (bad)
        fprintf(stderr, "  %s: %zu of %zu mismatch (abs %.3g + rel %.3g); max error %.3g at %zu\n",
                what, bad, n, abs_tol, rel_tol, worst, worst_at);
    if (max_err)
        *max_err = worst;
    return bad;
}

/* Exact comparison of integer or byte arrays (ages, bitmaps). */
#define KC_DEFINE_EXACT(name, type, fmt)                                                   \
    static inline size_t name(const char *what, const type *got, const type *ref, size_t n) \
    {                                                                                      \
        size_t bad = 0;                                                                    \
        for (size_t i = 0; i < n; i++) {                                                   \
            if (got[i] != ref[i]) {                                                        \
                if (bad < KC_SHOW)                                                         \
                    fprintf(stderr, "  %s[%zu]: got " fmt ", want " fmt "\n", what, i,     \
                            got[i], ref[i]);                                               \
                bad++;                                                                     \
            }                                                                              \
        }                                                                                  \
        if (bad)                                                                           \
            fprintf(stderr, "  %s: %zu of %zu differ\n", what, bad, n);                    \
        return bad;                                                                        \
    }
KC_DEFINE_EXACT(kc_compare_u32, uint32_t, "%u")
KC_DEFINE_EXACT(kc_compare_u8, uint8_t, "0x%02x")

/* Guard regions: a float bit pattern no kernel produces by accident. */
#define KC_GUARD 64
static const uint32_t kc_sentinel_bits = 0x7fa5a5a5u; /* a quiet NaN with a payload */
#define KC_SENTINEL_U8 0xa5

static inline void kc_fill_guard_f32(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        memcpy(p + i, &kc_sentinel_bits, sizeof *p);
}

/* Returns the number of guard floats that lost their sentinel. */
static inline size_t kc_check_guard_f32(const char *what, const float *p, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, p + i, sizeof b);
        if (b != kc_sentinel_bits) {
            if (bad < KC_SHOW)
                fprintf(stderr, "  %s: guard float %zu overwritten (0x%08x)\n", what, i, b);
            bad++;
        }
    }
    return bad;
}

static inline size_t kc_check_guard_bytes(const char *what, const void *p, size_t n, int byte)
{
    size_t bad = 0;
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)byte) {
            if (bad < KC_SHOW)
                fprintf(stderr, "  %s: guard byte %zu overwritten (0x%02x)\n", what, i, b[i]);
            bad++;
        }
    return bad;
}

#endif /* GDDR_TESTS_KCOMPARE_H */
