/* check_view.c -- the lazy/delta pull payload (common/view.c): the
 * server's encoder against the client's decoder, in process.
 *
 * What must hold: a worker's view, moved by every decoded reply, equals
 * the server's copy of it (moved by the encoder) bit for bit, reply after
 * reply; a delta reply brings each value within max|difference| / 254
 * (8 bits) or / 65534 (16 bits) of the server's, and the encoder's
 * "inexact" flag says exactly which chunks still differ; a float32 reply
 * copies the selected chunks and leaves the others alone; the layout check
 * takes exactly the payloads the encoder makes.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"
#include "view.h"

enum { N = 1000, CHUNK = 60, /* 17 chunks, the last one short */ NCH = (N + CHUNK - 1) / CHUNK, BM = (NCH + 7) / 8 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void random_bitmap(uint8_t *bm)
{
    memset(bm, 0, BM);
    for (size_t ch = 0; ch < NCH; ch++)
        if (uniform() < 0.6)
            bm[ch / 8] |= (uint8_t)(1u << (ch % 8));
}

static int selected(const uint8_t *bm, size_t ch)
{
    return bm[ch / 8] >> (ch % 8) & 1;
}

/* Twenty replies of `bits` over a drifting tensor. */
static void round_trips(int bits)
{
    static float w[N], mirror[N], view[N], scale[NCH];
    static float out[N];
    static uint8_t inexact[NCH], bm[BM], payload[N * 4 + NCH * 4];
    for (size_t i = 0; i < N; i++)
        w[i] = mirror[i] = view[i] = (float)(uniform() - 0.5);
    memset(inexact, 0, sizeof inexact);
    for (int step = 0; step < 20; step++) {
        for (size_t i = 0; i < N; i++) /* an update, larger on some values */
            w[i] += (float)((uniform() - 0.5) * (i % 7 == 0 ? 1.0 : 1e-3));
        random_bitmap(bm);
        float amax[NCH];
        for (size_t ch = 0; ch < NCH; ch++) {
            size_t lo = ch * CHUNK, len = lo + CHUNK <= N ? CHUNK : N - lo;
            amax[ch] = gddr__view_delta_amax(w + lo, mirror + lo, len);
            scale[ch] = gddr__view_delta_scale(amax[ch], bits ? bits : 8);
        }
        size_t bytes = gddr__view_pack(w, N, CHUNK, bm, bits, scale, mirror, inexact, payload);
        ck_assert_uint_eq(bytes, gddr__view_payload_bytes(N, CHUNK, bm, bits, NULL));
        ck_assert_int_eq(gddr__view_check(N, CHUNK, bm, BM, bits, bytes), 0);
        /* Decoded into the caller's buffer in the same pass: what it gets
         * is the new view, every chunk (sent or not), bit for bit. */
        for (size_t i = 0; i < N; i++)
            out[i] = -7.0f;
        gddr__view_apply(view, out, N, CHUNK, bm, bits, payload);
        /* The worker's view is the server's copy of it, bit for bit. */
        ck_assert_msg(memcmp(view, mirror, sizeof view) == 0, "bits %d, reply %d: view and mirror differ",
                      bits, step);
        ck_assert_msg(memcmp(out, view, sizeof view) == 0, "bits %d, reply %d: the output is not the view",
                      bits, step);
        for (size_t ch = 0; ch < NCH; ch++) {
            if (!selected(bm, ch))
                continue;
            size_t lo = ch * CHUNK, len = lo + CHUNK <= N ? CHUNK : N - lo;
            int differs = 0;
            for (size_t i = lo; i < lo + len; i++) {
                differs |= view[i] != w[i];
                if (bits == 0)
                    ck_assert(view[i] == w[i]);
                else /* half a step of the scale, and the rounding of the sum */
                    ck_assert_msg(fabsf(view[i] - w[i]) <= amax[ch] / (bits == 8 ? 254.0f : 65534.0f) * 1.001f +
                                                                  1e-6f * fabsf(w[i]),
                                  "bits %d, value %zu: %g from %g (max difference %g)", bits, i,
                                  (double)view[i], (double)w[i], (double)amax[ch]);
            }
            ck_assert_int_eq(inexact[ch], differs);
        }
    }
}

START_TEST(test_view_float32_replies_copy_selected_chunks)
{
    round_trips(0);
    /* A lazy reply without a mirror (Pull.delay_fraction alone): only the
     * selected chunks change. */
    static float w[N], view[N];
    static uint8_t bm[BM], payload[N * 4];
    for (size_t i = 0; i < N; i++) {
        w[i] = (float)i;
        view[i] = -1.0f;
    }
    random_bitmap(bm);
    size_t bytes = gddr__view_pack(w, N, CHUNK, bm, 0, NULL, NULL, NULL, payload);
    ck_assert_int_eq(gddr__view_check(N, CHUNK, bm, BM, 0, bytes), 0);
    gddr__view_apply(view, NULL, N, CHUNK, bm, 0, payload);
    for (size_t i = 0; i < N; i++)
        ck_assert(view[i] == (selected(bm, i / CHUNK) ? w[i] : -1.0f));
}
END_TEST

START_TEST(test_view_delta8_decoder_equals_encoder)
{
    round_trips(8);
}
END_TEST

START_TEST(test_view_delta16_decoder_equals_encoder)
{
    round_trips(16);
}
END_TEST

/* The vectorised encoder and decoder give what the plain loops of the
 * format's definition give, byte for byte: q = round-half-even((w - m) /
 * s) clamped to +-qmax, m += q * s; the decoder v += q * s. Values are
 * drawn to hit ties of the rounding, the clamp and long runs (the
 * vector loops' bodies and their tails). */
static void reference_pack(const float *w, float *m, size_t n, int bits, float *scale, uint8_t *out)
{
    const float qmax = bits == 8 ? 127.0f : 32767.0f;
    size_t nch = (n + CHUNK - 1) / CHUNK, o = nch * 4;
    for (size_t ch = 0; ch < nch; ch++) {
        size_t lo = ch * CHUNK, len = lo + CHUNK <= n ? CHUNK : n - lo;
        float a = 0;
        for (size_t i = lo; i < lo + len; i++)
            a = fabsf(w[i] - m[i]) > a ? fabsf(w[i] - m[i]) : a;
        float sc = a / qmax;
        scale[ch] = sc;
        memcpy(out + 4 * ch, &sc, 4);
        for (size_t i = lo; i < lo + len; i++) {
            volatile float d = w[i] - m[i];
            float q = sc > 0 ? rintf(d / sc) : 0.0f;
            q = q > qmax ? qmax : q < -qmax ? -qmax : q;
            if (bits == 8)
                out[o++] = (uint8_t)(int8_t)q;
            else {
                int16_t x = (int16_t)q;
                memcpy(out + o, &x, 2);
                o += 2;
            }
            volatile float p = q * sc;
            m[i] = m[i] + p;
        }
    }
}

static void vector_matches_reference(int bits)
{
    enum { VN = 4099 }; /* the last chunk short, odd lengths for the tails */
    static float w[VN], m0[VN], m1[VN], m2[VN], sc[(VN + CHUNK - 1) / CHUNK], sc2[(VN + CHUNK - 1) / CHUNK];
    static uint8_t bm[((VN + CHUNK - 1) / CHUNK + 7) / 8], inex[(VN + CHUNK - 1) / CHUNK];
    static uint8_t a[VN * 2 + 4 * ((VN + CHUNK - 1) / CHUNK)], b[sizeof a];
    size_t nch = (VN + CHUNK - 1) / CHUNK;
    for (int round = 0; round < 20; round++) {
        for (size_t i = 0; i < VN; i++) {
            m0[i] = (float)(uniform() - 0.5);
            /* ties: differences of exact multiples of half a step */
            w[i] = round % 3 == 0 ? m0[i] + (float)((int)(uniform() * 9) - 4) * 0.5f * 0x1p-10f
                                  : m0[i] + (float)(uniform() - 0.5) * (round % 2 ? 1e-3f : 10.0f);
        }
        if (round % 4 == 1) /* a chunk marked changed whose values did not move (amax 0),
                             * with -0 in the view: the copy must become +0 as v + 0 * 0 does */
            for (size_t i = CHUNK; i < 2 * CHUNK; i++)
                w[i] = m0[i] = i % 2 ? m0[i] : -0.0f;
        memset(bm, 0xff, sizeof bm);
        memcpy(m1, m0, sizeof m0);
        memcpy(m2, m0, sizeof m0);
        size_t o = gddr__view_pack(w, VN, CHUNK, bm, bits, sc, m1, inex, a);
        reference_pack(w, m2, VN, bits, sc2, b);
        ck_assert_uint_eq(o, nch * 4 + VN * (size_t)(bits / 8));
        ck_assert_msg(memcmp(a, b, o) == 0, "round %d: the encoder's bytes differ from the reference", round);
        ck_assert_msg(memcmp(m1, m2, sizeof m1) == 0, "round %d: the mirror differs from the reference", round);
        if (round % 4 == 1) {
            ck_assert_msg(sc[1] == 0 && inex[1] == 0, "round %d: an unmoved chunk has scale %g, inexact %d", round,
                          (double)sc[1], inex[1]);
            ck_assert_msg(!signbit(m1[CHUNK]), "round %d: the mirror kept a -0 the decoder turns into +0", round);
        }
        /* The decoder moves a copy of the old view to the same values. */
        memcpy(m2, m0, sizeof m0);
        gddr__view_apply(m2, NULL, VN, CHUNK, bm, bits, a);
        ck_assert_msg(memcmp(m1, m2, sizeof m1) == 0, "round %d: the decoder differs from the encoder", round);
    }
}

START_TEST(test_view_vector_loops_match_the_definition)
{
    vector_matches_reference(8);
    vector_matches_reference(16);
}
END_TEST

/* A difference that overflows float (w and the view of opposite signs near
 * FLT_MAX) cannot be scaled: the encoder says so, having moved the mirror
 * of the chunks before it, and the reply packed again as values leaves
 * every selected chunk's mirror equal to w, the bytes the worker gets. */
START_TEST(test_view_overflowing_difference_goes_as_values)
{
    static float w[N], mirror[N], scale[NCH];
    static uint8_t inexact[NCH], bm[BM], payload[N * 4 + NCH * 4];
    for (size_t i = 0; i < N; i++) {
        w[i] = (float)(uniform() - 0.5);
        mirror[i] = w[i] + 1e-3f;
    }
    size_t last = (NCH - 1) * CHUNK;
    w[last] = 3e38f, mirror[last] = -3e38f;
    memset(bm, 0xff, BM);
    bm[BM - 1] = (uint8_t)((1u << (NCH % 8)) - 1);
    memset(inexact, 7, sizeof inexact);
    ck_assert_uint_eq(gddr__view_pack(w, N, CHUNK, bm, 8, scale, mirror, inexact, payload), SIZE_MAX);
    ck_assert_msg(mirror[0] != w[0] + 1e-3f, "the chunks before the overflow were not encoded");
    size_t o = gddr__view_pack(w, N, CHUNK, bm, 0, NULL, mirror, inexact, payload);
    ck_assert_uint_eq(o, N * 4);
    ck_assert_msg(memcmp(mirror, w, sizeof w) == 0, "the mirror is not the values sent");
    ck_assert_msg(memcmp(payload, w, sizeof w) == 0, "the payload is not the values");
    for (size_t ch = 0; ch < NCH; ch++)
        ck_assert_int_eq(inexact[ch], 0);
}
END_TEST

START_TEST(test_view_check_refuses_bad_layouts)
{
    uint8_t bm[BM];
    memset(bm, 0xff, BM);
    if (NCH % 8)
        bm[BM - 1] = (uint8_t)((1u << (NCH % 8)) - 1); /* every chunk, no padding bit */
    size_t b8 = gddr__view_payload_bytes(N, CHUNK, bm, 8, NULL);
    ck_assert_uint_eq(b8, NCH * 4 + N);
    ck_assert_uint_eq(gddr__view_payload_bytes(N, CHUNK, bm, 16, NULL), NCH * 4 + 2 * N);
    ck_assert_uint_eq(gddr__view_payload_bytes(N, CHUNK, bm, 0, NULL), 4 * N);
    ck_assert_int_eq(gddr__view_check(N, CHUNK, bm, BM, 8, b8), 0);
    ck_assert_int_eq(gddr__view_check(N, CHUNK, bm, BM, 8, b8 + 1), -1);
    ck_assert_int_eq(gddr__view_check(N, CHUNK, bm, BM, 8, b8 - 1), -1);
    ck_assert_int_eq(gddr__view_check(N, CHUNK, bm, BM, 4, b8), -1);
    ck_assert_int_eq(gddr__view_check(N, CHUNK, bm, BM - 1, 8, b8), -1);
    ck_assert_int_eq(gddr__view_check(N, 0, bm, BM, 8, b8), -1);
    _Static_assert(NCH % 8, "the bitmap needs a padding bit");
    bm[BM - 1] |= (uint8_t)(1u << (NCH % 8)); /* a chunk past the last */
    ck_assert_int_eq(gddr__view_check(N, CHUNK, bm, BM, 8, b8), -1);
}
END_TEST

Suite *suite_view(void)
{
    Suite *s = suite_create("view");
    TCase *tc = tcase_create("view");
    tcase_add_test(tc, test_view_float32_replies_copy_selected_chunks);
    tcase_add_test(tc, test_view_delta8_decoder_equals_encoder);
    tcase_add_test(tc, test_view_delta16_decoder_equals_encoder);
    tcase_add_test(tc, test_view_check_refuses_bad_layouts);
    tcase_add_test(tc, test_view_vector_loops_match_the_definition);
    tcase_add_test(tc, test_view_overflowing_difference_goes_as_values);
    suite_add_tcase(s, tc);
    return s;
}
