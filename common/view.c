/* view.c -- see view.h. Built with -ffp-contract=off (Makefile): no
 * product and sum is fused, so both ends round alike. */
#include "view.h"

#include <math.h>
#include <string.h>

#include "vec.h"


static size_t chunk_len(size_t n, size_t chunk, size_t ch)
{
    size_t lo = ch * chunk;
    return lo + chunk <= n ? chunk : n - lo;
}

static int selected(const uint8_t *bm, size_t ch)
{
    return bm[ch / 8] >> (ch % 8) & 1;
}

GDDR_VEC float gddr__view_delta_amax(const float *w, const float *m, size_t len)
{
    float a = 0;
    for (size_t i = 0; i < len; i++) {
        float d = fabsf(w[i] - m[i]);
        a = d > a ? d : a;
    }
    return a;
}


/* One chunk of a delta reply: q = round((w - m) / s), and m += q * s as the
 * worker will do it (gddr__view_apply). Returns whether m still differs
 * from w. One loop per width, with no branch inside, so the compiler
 * vectorises it (rint, the division and the clamp are exact operations:
 * the vector code gives the scalar code's results bit for bit). */
#define DELTA_ENCODE(name, type, qmax_)                                                \
    GDDR_VEC static int name(const float *restrict w, float *restrict m, size_t len, \
                                float s, type *restrict q)                             \
    {                                                                                  \
        const float qmax = (qmax_);                                                    \
        int differs = 0;                                                               \
        for (size_t i = 0; i < len; i++) {                                             \
            float x = rintf((w[i] - m[i]) / s);                                        \
            x = x > qmax ? qmax : x < -qmax ? -qmax : x;                               \
            q[i] = (type)x;                                                            \
            m[i] = m[i] + x * s;                                                       \
            differs |= m[i] != w[i];                                                   \
        }                                                                              \
        return differs;                                                                \
    }
DELTA_ENCODE(delta_encode8, int8_t, 127.0f)
DELTA_ENCODE(delta_encode16, int16_t, 32767.0f)

/* amax 0: the chunk equals the view already; every q is 0, and the copy
 * moves as the decoder's v + 0 * s does (a -0 becomes +0). A loop of its
 * own, so it vectorises too: a chunk marked changed whose values did not
 * move (lr 0, a zero gradient) went through it scalar, 38% of the
 * server's encoding time in gddr-bench's delta-pull row. */
GDDR_VEC static int delta_zero(const float *restrict w, float *restrict m, size_t len, float s)
{
    int differs = 0;
    for (size_t i = 0; i < len; i++) {
        m[i] = m[i] + 0.0f * s;
        differs |= m[i] != w[i];
    }
    return differs;
}

static int delta_encode(const float *w, float *m, size_t len, float s, int bits, void *out)
{
    if (!(s > 0)) {
        memset(out, 0, len * (size_t)(bits / 8));
        return delta_zero(w, m, len, s);
    }
    return bits == 8 ? delta_encode8(w, m, len, s, out) : delta_encode16(w, m, len, s, out);
}

/* Adds a delta reply's chunk into the view: v += q * s, in float32 (a
 * product, then a sum), exactly as delta_encode did to its copy; the new
 * value also goes to out (the caller's parameters) in the same pass, so the
 * view is not read again to copy it (out == v when there is no caller's
 * buffer). */
GDDR_VEC static void delta_add(float *v, float *out, const uint8_t *restrict q, size_t len, float s,
                                  int bits)
{
    if (bits == 8) {
        for (size_t i = 0; i < len; i++)
            out[i] = v[i] = v[i] + (float)(int8_t)q[i] * s;
    } else {
        for (size_t i = 0; i < len; i++) {
            int16_t x;
            memcpy(&x, q + 2 * i, 2);
            out[i] = v[i] = v[i] + (float)x * s;
        }
    }
}

size_t gddr__view_payload_bytes(size_t n, size_t chunk, const uint8_t *bm, int bits, size_t *nsel)
{
    size_t nch = chunk ? (n + chunk - 1) / chunk : 0, vals = 0, k = 0;
    for (size_t ch = 0; ch < nch; ch++)
        if (selected(bm, ch)) {
            vals += chunk_len(n, chunk, ch);
            k++;
        }
    if (nsel)
        *nsel = k;
    return bits ? k * 4 + vals * (size_t)(bits / 8) : vals * 4;
}

size_t gddr__view_pack(const float *w, size_t n, size_t chunk, const uint8_t *bm, int bits,
                       float *scale, float *mirror, uint8_t *inexact, uint8_t *out)
{
    size_t nch = (n + chunk - 1) / chunk, nsel;
    gddr__view_payload_bytes(n, chunk, bm, bits, &nsel);
    size_t o = bits ? nsel * sizeof(float) : 0, k = 0;
    for (size_t ch = 0; ch < nch; ch++) {
        if (!selected(bm, ch))
            continue;
        size_t lo = ch * chunk, len = chunk_len(n, chunk, ch);
        if (bits) {
            /* The scale, then the encoding, while the chunk (its values and
             * its mirror) is still in L1: one read of each from memory. */
            float a = gddr__view_delta_amax(w + lo, mirror + lo, len);
            if (!isfinite(a))
                return SIZE_MAX;
            float s = gddr__view_delta_scale(a, bits);
            if (scale)
                scale[ch] = s;
            memcpy(out + k++ * sizeof(float), &s, sizeof(float));
            inexact[ch] = (uint8_t)delta_encode(w + lo, mirror + lo, len, s, bits, out + o);
            o += len * (size_t)(bits / 8);
        } else {
            memcpy(out + o, w + lo, len * sizeof(float));
            o += len * sizeof(float);
            if (mirror) {
                memcpy(mirror + lo, w + lo, len * sizeof(float));
                inexact[ch] = 0;
            }
        }
    }
    return o;
}

int gddr__view_check(size_t n, size_t chunk, const uint8_t *bm, size_t bmlen, int bits, size_t bytes)
{
    size_t nch = chunk ? (n + chunk - 1) / chunk : 0;
    if (!chunk || bmlen != (nch + 7) / 8 || (bits != 0 && bits != 8 && bits != 16))
        return -1;
    if (nch % 8 && bm[bmlen - 1] >> (nch % 8))
        return -1; /* a chunk past the last */
    return gddr__view_payload_bytes(n, chunk, bm, bits, NULL) == bytes ? 0 : -1;
}

void gddr__view_apply(float *view, float *out, size_t n, size_t chunk, const uint8_t *bm, int bits,
                      const uint8_t *payload)
{
    size_t nch = (n + chunk - 1) / chunk, nsel;
    gddr__view_payload_bytes(n, chunk, bm, bits, &nsel);
    const uint8_t *q = payload + (bits ? nsel * 4 : 0);
    float *o = out ? out : view;
    for (size_t ch = 0, k = 0; ch < nch; ch++) {
        size_t lo = ch * chunk, len = chunk_len(n, chunk, ch);
        if (!selected(bm, ch)) {
            if (o != view)
                memcpy(o + lo, view + lo, len * 4);
            continue;
        }
        if (bits) {
            float s;
            memcpy(&s, payload + 4 * k++, 4);
            delta_add(view + lo, o + lo, q, len, s, bits);
            q += len * (size_t)(bits / 8);
        } else {
            memcpy(view + lo, q, len * 4);
            if (o != view)
                memcpy(o + lo, q, len * 4);
            q += len * 4;
        }
    }
}
