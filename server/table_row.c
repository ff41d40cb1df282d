/* table_row.c -- what a row of a sparse table is: its bytes, its initial
 * value, its admission by probability and its optimizer step (pure
 * functions of the configuration and the row), and the check of a push.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table_int.h"
#include "vec.h"

#define GOLDEN 0x9e3779b97f4a7c15ull
#define ADMIT_SALT 0x61646d6974ull /* "admit" */

uint32_t ps_trow_nstate(const ps_table_conf *c)
{
    return c->opt == PS_TOPT_ADAM ? 2 : c->opt == PS_TOPT_ADAGRAD ? 1 : 0;
}

/* Per slot: values and state, meta (key, touch), step count, and at most
 * four index entries (the index has the smallest power of two >= 2 * slots
 * entries, under 4 * slots). */
size_t ps_table_row_bytes(const ps_table_conf *c)
{
    return (size_t)c->dim * sizeof(float) * (1 + ps_trow_nstate(c)) + sizeof(ps_tmeta) +
           sizeof(uint32_t) + 4 * sizeof(uint64_t);
}

static int bad(char *why, size_t len, const char *what, double v)
{
    snprintf(why, len, "%s %g is out of range", what, v);
    return -1;
}

int ps_table_conf_check(const ps_table_conf *c, char *why, size_t len)
{
    if (c->dim < 1 || c->dim > 65536)
        return bad(why, len, "dim", c->dim);
    if (c->init != PS_TINIT_ZEROS && c->init != PS_TINIT_UNIFORM && c->init != PS_TINIT_NORMAL)
        return bad(why, len, "init", c->init);
    if (!isfinite(c->init_scale) || c->init_scale < 0)
        return bad(why, len, "init_scale", c->init_scale);
    if (c->admit == PS_TADMIT_COUNT) {
        if (c->admit_count < 1)
            return bad(why, len, "admit_count", c->admit_count);
    } else if (c->admit == PS_TADMIT_PROB) {
        if (!(c->admit_prob > 0 && c->admit_prob <= 1))
            return bad(why, len, "admit_prob", c->admit_prob);
    } else if (c->admit != PS_TADMIT_ALWAYS) {
        return bad(why, len, "admit", c->admit);
    }
    if (c->opt != PS_TOPT_SGD && c->opt != PS_TOPT_ADAGRAD && c->opt != PS_TOPT_ADAM)
        return bad(why, len, "opt", c->opt);
    if (!isfinite(c->lr) || c->lr < 0 || c->lr > 1e6)
        return bad(why, len, "lr", c->lr);
    if (c->opt == PS_TOPT_ADAM) {
        if (!(c->beta1 >= 0 && c->beta1 < 1))
            return bad(why, len, "beta1", c->beta1);
        if (!(c->beta2 >= 0 && c->beta2 < 1))
            return bad(why, len, "beta2", c->beta2);
    }
    if (c->opt != PS_TOPT_SGD && !(isfinite(c->eps) && c->eps > 0))
        return bad(why, len, "eps", c->eps);
    if (c->opt == PS_TOPT_ADAGRAD && !(isfinite(c->adagrad_init) && c->adagrad_init >= 0))
        return bad(why, len, "adagrad_init", c->adagrad_init);
    if (c->max_rows > PS_TABLE_MAX_SLOTS)
        return bad(why, len, "max_rows", (double)c->max_rows);
    return 0;
}

/* u(seed, key, i): 24 bits of a counter-based hash, a float in [0, 1). */
static inline __attribute__((always_inline)) float row_u(uint64_t seed, uint64_t key, uint64_t i)
{
    uint64_t h = gddr_splitmix64(seed ^ gddr_splitmix64(key ^ (i * GOLDEN)));
    return (float)(h >> 40) * (1.0f / 16777216.0f);
}

void ps_table_init_row(const ps_table_conf *c, uint64_t key, float *out)
{
    uint32_t d = c->dim;
    switch (c->init) {
    case PS_TINIT_UNIFORM:
        /* 2u - 1 is exact in float (24 bits), so one rounding: the product. */
        for (uint32_t i = 0; i < d; i++)
            out[i] = c->init_scale * (2.0f * row_u(c->init_seed, key, i) - 1.0f);
        break;
    case PS_TINIT_NORMAL:
        for (uint32_t i = 0; i < d; i++) {
            double u1 = row_u(c->init_seed, key, 2 * (uint64_t)i);
            double u2 = row_u(c->init_seed, key, 2 * (uint64_t)i + 1);
            double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
            out[i] = (float)((double)c->init_scale * z);
        }
        break;
    default:
        for (uint32_t i = 0; i < d; i++)
            out[i] = 0.0f;
    }
}

int ps_trow_admit_prob(uint64_t seed, uint64_t key, uint32_t s, float p)
{
    return row_u(seed ^ ADMIT_SALT, key, s) < p;
}

void ps_trow_init_state(const ps_table_conf *c, float *s)
{
    size_t n = (size_t)c->dim * ps_trow_nstate(c);
    float v = c->opt == PS_TOPT_ADAGRAD ? c->adagrad_init : 0.0f;
    for (size_t i = 0; i < n; i++)
        s[i] = v;
}

/* The arithmetic of server/optim.c (float, no fused multiply-add), with
 * Adam's bias correction by the row's own step count. */
GDDR_VEC void ps_trow_step(const ps_table_conf *c, float *w, float *s, uint32_t *steps, const float *g,
                  float scale, float lr)
{
    uint32_t d = c->dim;
    if (*steps < UINT32_MAX)
        (*steps)++;
    if (c->opt == PS_TOPT_SGD) {
        for (uint32_t i = 0; i < d; i++)
            w[i] -= lr * (scale * g[i]);
    } else if (c->opt == PS_TOPT_ADAGRAD) {
        float eps = c->eps;
        for (uint32_t i = 0; i < d; i++) {
            float gi = scale * g[i];
            s[i] += gi * gi;
            w[i] -= lr * gi / (sqrtf(s[i]) + eps);
        }
    } else {
        double d1 = 1.0 - pow(c->beta1, *steps), d2 = 1.0 - pow(c->beta2, *steps);
        float bc1 = d1 > 0 ? (float)(1.0 / d1) : 1.0f, bc2 = d2 > 0 ? (float)(1.0 / d2) : 1.0f;
        float b1 = c->beta1, b2 = c->beta2, eps = c->eps;
        float *m = s, *v = s + d;
        for (uint32_t i = 0; i < d; i++) {
            float gi = scale * g[i];
            m[i] = b1 * m[i] + (1.0f - b1) * gi;
            v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
            w[i] -= lr * (m[i] * bc1) / (sqrtf(v[i] * bc2) + eps);
        }
    }
}

/* ---- push check -------------------------------------------------------------- */

/* Whether keys repeat: pairwise for a few, else through the table's
 * scratch set (entries point into keys itself). -1: no memory. */
static int has_duplicate(const ps_table *t, const uint64_t *keys, size_t n, size_t *dup)
{
    if (n <= 16) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (keys[i] == keys[j]) {
                    *dup = i;
                    return 1;
                }
        return 0;
    }
    ps_tindex *x = t->scratch;
    uint64_t want = ps_tix_entries_for(n);
    if (!x->ent || x->mask + 1 < want) {
        ps_tix_free(x);
        if (ps_tix_init(x, want) < 0)
            return -1;
    } else {
        ps_tix_clear(x);
    }
    for (size_t i = 0; i < n; i++) {
        if (ps_tix_find(x, keys, 1, keys[i]) >= 0) {
            *dup = i;
            return 1;
        }
        ps_tix_insert(x, keys[i], (uint32_t)i);
    }
    return 0;
}

/* Whether any of n floats is inf or NaN (exponent all ones): integer ops
 * without an early exit, in blocks of 16 that GCC vectorizes at -O2 (its
 * cheap cost model at -O2 leaves a loop of unknown trip count scalar: a
 * sete and an or per float, 80% of a 64k x 64 push check's samples), then
 * the tail one by one. */
static int any_nonfinite(const float *g, size_t n)
{
    uint32_t bad = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        uint32_t b = 0;
        for (size_t j = 0; j < 16; j++) {
            uint32_t u;
            memcpy(&u, g + i + j, sizeof u);
            b |= (u & 0x7f800000u) == 0x7f800000u;
        }
        bad |= b;
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, g + i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}

int ps_table_push_check(const ps_table *t, const uint64_t *keys, size_t n, const float *g,
                        char *why, size_t whylen)
{
    size_t d = t->c.dim;
    if (n >= PS_TABLE_MAX_SLOTS) {
        snprintf(why, whylen, "%zu rows in one push", n);
        return -1;
    }
    for (size_t r = 0; r < n; r++) {
        const float *gr = g + r * d;
        if (!any_nonfinite(gr, d))
            continue;
        size_t j = 0;
        while (isfinite(gr[j]))
            j++;
        snprintf(why, whylen, "value %zu of key %llu is %g", j, (unsigned long long)keys[r],
                 gr[j]);
        return PS_TABLE_NONFINITE;
    }
    size_t dup = 0;
    int r = has_duplicate(t, keys, n, &dup);
    if (r < 0) {
        snprintf(why, whylen, "no memory to check %zu keys", n);
        return -1;
    }
    if (r > 0) {
        snprintf(why, whylen, "key %llu twice (row %zu)", (unsigned long long)keys[dup], dup);
        return -1;
    }
    return 0;
}
