/* check_table.c -- the storage engine of sparse tables (server/table.c), in
 * process, against the contract of server/table.h.
 *
 *   init_is_pure_function_of_seed_key  two tables, keys in different orders:
 *                         the same rows, equal to the formula of table.h
 *                         recomputed here; uniform within [-s, s)
 *   init_normal_moments   mean and stddev over 160k values
 *   zeros_init_and_inference_pull  zeros init; create = 0 reads zeros and
 *                         creates nothing
 *   optimizers_match_reference  sgd, adagrad, adam (a row stepped 3 times,
 *                         another once: each with its own bias correction)
 *   push_check_refuses_duplicates  small and large pushes; nothing changes
 *   push_check_refuses_nonfinite  NaN and inf, named
 *   push_check_nonfinite_blocks   one bad value at every position of 16-float blocks and a tail
 *   admit_count           k-1 pulls: no row, initial value, push dropped and
 *                         counted; the k-th creates
 *   admit_count_pending_bounded  the side map of sightings holds 2^20 keys
 *                         at most; the most recent stay
 *   admit_prob_deterministic  same admissions in two tables, as the formula
 *   max_rows_keeps_hot_set  never over the cap; 90+ of 100 hot rows survive
 *                         100k cold keys through 1000 rows; evicted_cap
 *   server_cap_shared     two tables under one server cap
 *   row_ttl_bound         no row goes before it expires; every expired row
 *                         is gone within the bound of table.h
 *   foreach_put_row_round_trip  identical pulls and identical Adam steps
 *   index_random_ops_vs_reference  200k puts, removes and lookups against
 *                         a plain array
 *   row_bytes_vs_allocation  ps_table_bytes <= rows * row_bytes + constant
 *                         at full capacity
 *   keys_zero_and_max     0 and UINT64_MAX are keys like others
 *   rowsum_first_insertion_order  sums and order
 *   conf_check_refuses    out-of-range configurations
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"
#include "table.h"

static ps_table_conf conf(uint32_t dim, ps_tinit init, ps_topt opt)
{
    ps_table_conf c = { 0 };
    c.dim = dim;
    c.init = init;
    c.init_scale = 0.5f;
    c.init_seed = 12345;
    c.admit = PS_TADMIT_ALWAYS;
    c.admit_count = 1;
    c.admit_prob = 1;
    c.opt = opt;
    c.lr = 0.1f;
    c.beta1 = 0.9f;
    c.beta2 = 0.999f;
    c.eps = 1e-8f;
    c.adagrad_init = 0.1f;
    return c;
}

static ps_table *mk(const ps_table_conf *c, uint64_t *srows, uint64_t smax)
{
    char why[128];
    ck_assert_msg(ps_table_conf_check(c, why, sizeof why) == 0, "%s", why);
    ps_table *t = NULL;
    ck_assert_int_eq(ps_table_new(c, srows, smax, &t), 0);
    return t;
}

static ps_table_counts counts(const ps_table *t)
{
    ps_table_counts n;
    ps_table_counts_get(t, &n);
    return n;
}

static uint64_t key_of(uint64_t i)
{
    return i * 0xd1b54a32d192ed03ull + 7;
}

/* Whether key has a row, without touching it. */
typedef struct { uint64_t key; int found; } find_ctx;
static int find_fn(void *u, uint64_t key, const float *w, const float *s1, const float *s2,
                   uint32_t steps, uint64_t touched)
{
    find_ctx *f = u;
    if (key == f->key)
        f->found = 1;
    return f->found;
}

static int has_row(const ps_table *t, uint64_t key)
{
    find_ctx f = { key, 0 };
    ps_table_foreach(t, find_fn, &f);
    return f.found;
}

/* The formula of table.h, written out again. */
static float ref_u(uint64_t seed, uint64_t key, uint64_t i)
{
    uint64_t h = gddr_splitmix64(seed ^ gddr_splitmix64(key ^ (i * 0x9e3779b97f4a7c15ull)));
    return (float)(h >> 40) / 16777216.0f;
}

START_TEST(test_init_pure)
{
    enum { N = 500, D = 7 };
    ps_table_conf c = conf(D, PS_TINIT_UNIFORM, PS_TOPT_SGD);
    ps_table *a = mk(&c, NULL, 0), *b = mk(&c, NULL, 0);
    uint64_t ka[N], kb[N];
    for (int i = 0; i < N; i++) {
        ka[i] = key_of(i);
        kb[i] = key_of(N - 1 - i);
    }
    static float oa[N * D], ob[N * D];
    ck_assert_int_eq(ps_table_pull(a, ka, N, 1, oa, NULL), 0);
    ck_assert_int_eq(ps_table_pull(b, kb, N, 1, ob, NULL), 0);
    /* Pulled again (rows exist now): the same values. */
    ck_assert_int_eq(ps_table_pull(b, ka, N, 1, ob, NULL), 0);
    for (int i = 0; i < N * D; i++) {
        ck_assert(oa[i] == ob[i]);
        float want = c.init_scale * (2.0f * ref_u(c.init_seed, ka[i / D], i % D) - 1.0f);
        ck_assert(oa[i] == want);
        ck_assert(oa[i] >= -c.init_scale && oa[i] < c.init_scale);
    }
    /* Another seed, other values. */
    ps_table_conf c2 = c;
    c2.init_seed = 999;
    float r1[D], r2[D];
    ps_table_init_row(&c, 42, r1);
    ps_table_init_row(&c2, 42, r2);
    ck_assert(memcmp(r1, r2, sizeof r1) != 0);
    ps_table_free(a);
    ps_table_free(b);
}
END_TEST

START_TEST(test_init_normal)
{
    enum { N = 20000, D = 8 };
    ps_table_conf c = conf(D, PS_TINIT_NORMAL, PS_TOPT_SGD);
    c.init_scale = 2.0f;
    double sum = 0, sq = 0;
    float r[D];
    for (int i = 0; i < N; i++) {
        ps_table_init_row(&c, key_of(i), r);
        for (int j = 0; j < D; j++) {
            ck_assert(isfinite(r[j]));
            sum += r[j];
            sq += (double)r[j] * r[j];
        }
    }
    double n = (double)N * D, mean = sum / n, sd = sqrt(sq / n - mean * mean);
    /* stderr of the mean 2/400 = 0.005 */
    ck_assert_msg(fabs(mean) < 0.02, "mean %g", mean);
    ck_assert_msg(fabs(sd - 2.0) < 0.03, "sd %g", sd);
    /* value 0 of a key, by the formula */
    ps_table_init_row(&c, 77, r);
    double u1 = ref_u(c.init_seed, 77, 0), u2 = ref_u(c.init_seed, 77, 1);
    ck_assert(r[0] == (float)(2.0 * sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2)));
}
END_TEST

START_TEST(test_zeros_inference)
{
    enum { D = 4 };
    ps_table_conf c = conf(D, PS_TINIT_UNIFORM, PS_TOPT_SGD);
    ps_table *t = mk(&c, NULL, 0);
    uint64_t k[3] = { 1, 2, 3 };
    float o[3 * D];
    size_t made = 99;
    memset(o, 0x7f, sizeof o);
    ck_assert_int_eq(ps_table_pull(t, k, 3, 0, o, &made), 0);
    ck_assert_uint_eq(made, 0);
    for (int i = 0; i < 3 * D; i++)
        ck_assert(o[i] == 0.0f);
    ps_table_counts n = counts(t);
    ck_assert_uint_eq(n.rows, 0);
    ck_assert_uint_eq(n.created, 0);
    ck_assert_int_eq(ps_table_pull(t, k, 3, 1, o, &made), 0);
    ck_assert_uint_eq(made, 3);
    ck_assert(o[0] != 0.0f);
    ps_table_free(t);

    c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    t = mk(&c, NULL, 0);
    memset(o, 0x7f, sizeof o);
    ck_assert_int_eq(ps_table_pull(t, k, 3, 1, o, &made), 0);
    ck_assert_uint_eq(made, 3);
    for (int i = 0; i < 3 * D; i++)
        ck_assert(o[i] == 0.0f);
    ck_assert_uint_eq(counts(t).rows, 3);
    ps_table_free(t);
}
END_TEST

START_TEST(test_optimizers)
{
    enum { D = 5 };
    const float scale = 0.5f, lr = 0.05f;
    float g[D], w0[D];
    for (int j = 0; j < D; j++)
        g[j] = (float)(j + 1) * 0.3f - 0.7f;
    for (int opt = PS_TOPT_SGD; opt <= PS_TOPT_ADAM; opt++) {
        ps_table_conf c = conf(D, PS_TINIT_UNIFORM, (ps_topt)opt);
        ps_table *t = mk(&c, NULL, 0);
        uint64_t ka = 10, kb = 20;
        /* a: 3 steps, b: 1 step; adam's reference keeps per-row k. */
        float wa[D], wb[D], sa[2 * D] = { 0 }, sb[2 * D] = { 0 };
        ps_table_init_row(&c, ka, wa);
        ps_table_init_row(&c, kb, wb);
        if (opt == PS_TOPT_ADAGRAD)
            for (int j = 0; j < D; j++)
                sa[j] = sb[j] = c.adagrad_init;
        for (int step = 1; step <= 3; step++) {
            uint64_t keys[2] = { ka, kb };
            size_t n = step == 2 ? 2 : 1; /* b only in step 2 */
            if (step == 2) {
                keys[0] = kb;
                keys[1] = ka;
            }
            float gg[2 * D];
            memcpy(gg, g, sizeof g);
            memcpy(gg + D, g, sizeof g);
            ck_assert_int_eq(ps_table_apply(t, keys, n, gg, scale, lr), (long)n);
            int k_a = step;
            float *rows[2] = { wa, wb }, *st[2] = { sa, sb };
            int ks[2] = { k_a, 1 };
            for (int r = 0; r < (step == 2 ? 2 : 1); r++) {
                float *w = rows[r], *s = st[r];
                for (int j = 0; j < D; j++) {
                    float gi = scale * g[j];
                    if (opt == PS_TOPT_SGD) {
                        w[j] -= lr * gi;
                    } else if (opt == PS_TOPT_ADAGRAD) {
                        s[j] += gi * gi;
                        w[j] -= lr * gi / (sqrtf(s[j]) + c.eps);
                    } else {
                        float bc1 = (float)(1.0 / (1.0 - pow(c.beta1, ks[r])));
                        float bc2 = (float)(1.0 / (1.0 - pow(c.beta2, ks[r])));
                        s[j] = c.beta1 * s[j] + (1.0f - c.beta1) * gi;
                        s[D + j] = c.beta2 * s[D + j] + (1.0f - c.beta2) * gi * gi;
                        w[j] -= lr * (s[j] * bc1) / (sqrtf(s[D + j] * bc2) + c.eps);
                    }
                }
            }
        }
        uint64_t keys[2] = { ka, kb };
        float out[2 * D];
        ck_assert_int_eq(ps_table_pull(t, keys, 2, 0, out, NULL), 0);
        for (int j = 0; j < D; j++) {
            ck_assert_msg(out[j] == wa[j], "opt %d a[%d] %.9g want %.9g", opt, j, out[j], wa[j]);
            ck_assert_msg(out[D + j] == wb[j], "opt %d b[%d] %.9g want %.9g", opt, j, out[D + j],
                          wb[j]);
        }
        (void)w0;
        ps_table_free(t);
    }
}
END_TEST

START_TEST(test_push_check_duplicates)
{
    enum { D = 3, N = 100 };
    ps_table_conf c = conf(D, PS_TINIT_UNIFORM, PS_TOPT_SGD);
    ps_table *t = mk(&c, NULL, 0);
    static uint64_t k[N];
    static float g[N * D], before[N * D], after[N * D];
    for (int i = 0; i < N; i++)
        k[i] = key_of(i);
    for (int i = 0; i < N * D; i++)
        g[i] = 1.0f;
    ck_assert_int_eq(ps_table_pull(t, k, N, 1, before, NULL), 0);
    char why[128] = "";
    ck_assert_int_eq(ps_table_push_check(t, k, N, g, why, sizeof why), 0);
    ck_assert_int_eq(ps_table_push_check(t, k, 10, g, why, sizeof why), 0);
    k[77] = k[5];
    ck_assert_int_eq(ps_table_push_check(t, k, N, g, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "twice") != NULL, "%s", why);
    k[3] = k[1];
    ck_assert_int_eq(ps_table_push_check(t, k, 10, g, why, sizeof why), -1);
    /* Nothing changed: same rows, same counts. */
    ps_table_counts n = counts(t);
    ck_assert_uint_eq(n.rows, N);
    k[77] = key_of(77);
    k[3] = key_of(3);
    ck_assert_int_eq(ps_table_pull(t, k, N, 0, after, NULL), 0);
    ck_assert(memcmp(before, after, sizeof before) == 0);
    ck_assert_int_eq(ps_table_push_check(t, k, N, g, why, sizeof why), 0);
    ps_table_free(t);
}
END_TEST

/* The check runs in blocks of 16 floats and a tail: a row of 37 floats
 * (2 blocks + 5) with one bad value at every position, and with the
 * largest finite values everywhere. */
START_TEST(test_push_check_nonfinite_blocks)
{
    enum { D = 37 };
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    ps_table *t = mk(&c, NULL, 0);
    uint64_t k[2] = { 5, 6 };
    float g[2 * D];
    char why[128] = "";
    for (int i = 0; i < 2 * D; i++)
        g[i] = i % 2 ? -FLT_MAX : FLT_MAX;
    ck_assert_int_eq(ps_table_push_check(t, k, 2, g, why, sizeof why), 0);
    static const float bad[3] = { NAN, INFINITY, -INFINITY };
    for (int p = 0; p < 2 * D; p++)
        for (int b = 0; b < 3; b++) {
            float keep = g[p];
            g[p] = bad[b];
            ck_assert_int_eq(ps_table_push_check(t, k, 2, g, why, sizeof why), PS_TABLE_NONFINITE);
            ck_assert_msg(strstr(why, p < D ? "key 5" : "key 6") != NULL, "position %d: %s", p, why);
            g[p] = keep;
        }
    ps_table_free(t);
}
END_TEST

START_TEST(test_push_check_nonfinite)
{
    enum { D = 4 };
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    ps_table *t = mk(&c, NULL, 0);
    uint64_t k[2] = { 5, 6 };
    float g[2 * D] = { 0 };
    char why[128] = "";
    g[6] = NAN;
    ck_assert_int_eq(ps_table_push_check(t, k, 2, g, why, sizeof why), PS_TABLE_NONFINITE);
    ck_assert_msg(strstr(why, "key 6") != NULL, "%s", why);
    g[6] = 0;
    g[1] = -INFINITY;
    ck_assert_int_eq(ps_table_push_check(t, k, 2, g, why, sizeof why), PS_TABLE_NONFINITE);
    ck_assert_msg(strstr(why, "key 5") != NULL, "%s", why);
    /* The largest float, a denormal and -0 are finite. */
    g[1] = -FLT_MAX;
    g[2] = FLT_MAX;
    g[3] = 1e-45f;
    g[4] = -0.0f;
    ck_assert_int_eq(ps_table_push_check(t, k, 2, g, why, sizeof why), 0);
    ck_assert_uint_eq(counts(t).rows, 0);
    ps_table_free(t);
}
END_TEST

START_TEST(test_admit_count)
{
    enum { D = 3, K = 4 };
    ps_table_conf c = conf(D, PS_TINIT_UNIFORM, PS_TOPT_SGD);
    c.admit = PS_TADMIT_COUNT;
    c.admit_count = K;
    ps_table *t = mk(&c, NULL, 0);
    uint64_t key = 0xabcdef;
    float init[D], o[D], g[D] = { 1, 1, 1 };
    ps_table_init_row(&c, key, init);
    for (int i = 1; i < K; i++) {
        size_t made = 9;
        ck_assert_int_eq(ps_table_pull(t, &key, 1, 1, o, &made), 0);
        ck_assert_uint_eq(made, 0);
        ck_assert(memcmp(o, init, sizeof o) == 0);
        ck_assert_int_eq(ps_table_apply(t, &key, 1, g, 1.0f, 0.1f), 0);
        ps_table_counts n = counts(t);
        ck_assert_uint_eq(n.rows, 0);
        ck_assert_uint_eq(n.dropped, (uint64_t)i);
        ck_assert_uint_eq(n.pending, 1);
    }
    /* An inference pull is no sighting. */
    ck_assert_int_eq(ps_table_pull(t, &key, 1, 0, o, NULL), 0);
    ck_assert_uint_eq(counts(t).rows, 0);
    size_t made = 0;
    ck_assert_int_eq(ps_table_pull(t, &key, 1, 1, o, &made), 0);
    ck_assert_uint_eq(made, 1);
    ck_assert(memcmp(o, init, sizeof o) == 0);
    ps_table_counts n = counts(t);
    ck_assert_uint_eq(n.rows, 1);
    ck_assert_uint_eq(n.pending, 0);
    ck_assert_int_eq(ps_table_apply(t, &key, 1, g, 1.0f, 0.1f), 1);
    ck_assert_int_eq(ps_table_pull(t, &key, 1, 1, o, NULL), 0);
    ck_assert(o[0] == init[0] - 0.1f);
    ps_table_free(t);
}
END_TEST

START_TEST(test_admit_pending_bounded)
{
    enum { D = 1, N = (1 << 20) + 50000, B = 65536 };
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    c.admit = PS_TADMIT_COUNT;
    c.admit_count = 2;
    ps_table *t = mk(&c, NULL, 0);
    static uint64_t k[B];
    static float o[B * D];
    for (uint64_t i = 0; i < N; i += B) {
        size_t n = N - i < B ? N - i : B;
        for (size_t j = 0; j < n; j++)
            k[j] = key_of(i + j);
        ck_assert_int_eq(ps_table_pull(t, k, n, 1, o, NULL), 0);
        ps_table_advance(t);
    }
    ps_table_counts n = counts(t);
    ck_assert_uint_eq(n.pending, 1u << 20);
    ck_assert_uint_eq(n.rows, 0);
    /* The last keys seen are still pending: their second sighting admits. */
    k[0] = key_of(N - 1);
    size_t made = 0;
    ck_assert_int_eq(ps_table_pull(t, k, 1, 1, o, &made), 0);
    ck_assert_uint_eq(made, 1);
    ck_assert_uint_eq(counts(t).pending, (1u << 20) - 1);
    ps_table_free(t);
}
END_TEST

START_TEST(test_admit_prob)
{
    enum { N = 4000, D = 2 };
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    c.admit = PS_TADMIT_PROB;
    c.admit_prob = 0.3f;
    ps_table *a = mk(&c, NULL, 0), *b = mk(&c, NULL, 0);
    static uint64_t k[N], kr[N];
    static float o[N * D];
    for (int i = 0; i < N; i++) {
        k[i] = key_of(i);
        kr[i] = key_of(N - 1 - i);
    }
    /* Two sightings of every key, in other orders. */
    ck_assert_int_eq(ps_table_pull(a, k, N, 1, o, NULL), 0);
    ck_assert_int_eq(ps_table_pull(b, kr, N, 1, o, NULL), 0);
    size_t first = counts(a).rows;
    ck_assert_int_eq(ps_table_pull(a, kr, N, 1, o, NULL), 0);
    ck_assert_int_eq(ps_table_pull(b, k, N, 1, o, NULL), 0);
    ck_assert_uint_eq(counts(a).rows, counts(b).rows);
    ck_assert_msg(first > N * 0.25 && first < N * 0.35, "first sighting admitted %zu", first);
    for (int i = 0; i < N; i++) {
        float u1 = ref_u(c.init_seed ^ 0x61646d6974ull, k[i], 1);
        float u2 = ref_u(c.init_seed ^ 0x61646d6974ull, k[i], 2);
        int want = u1 < c.admit_prob || u2 < c.admit_prob;
        ck_assert_int_eq(has_row(a, k[i]), want);
        ck_assert_int_eq(has_row(b, k[i]), want);
    }
    ps_table_free(a);
    ps_table_free(b);
}
END_TEST

START_TEST(test_max_rows_hot)
{
    enum { D = 2, CAP = 1000, HOT = 100, COLD_PER = 100, COLD = 100000 };
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    c.max_rows = CAP;
    ps_table *t = mk(&c, NULL, 0);
    uint64_t hot[HOT], cold[COLD_PER];
    float o[COLD_PER * D];
    for (int i = 0; i < HOT; i++)
        hot[i] = key_of(i);
    for (int step = 0; step < COLD / COLD_PER; step++) {
        ck_assert_int_eq(ps_table_pull(t, hot, HOT, 1, o, NULL), 0);
        for (int i = 0; i < COLD_PER; i++)
            cold[i] = key_of(HOT + (uint64_t)step * COLD_PER + i);
        ck_assert_int_eq(ps_table_pull(t, cold, COLD_PER, 1, o, NULL), 0);
        ck_assert_uint_le(counts(t).rows, CAP);
        ps_table_advance(t);
    }
    int alive = 0;
    for (int i = 0; i < HOT; i++)
        alive += has_row(t, hot[i]);
    ps_table_counts n = counts(t);
    ck_assert_msg(alive >= 90, "%d hot rows alive", alive);
    ck_assert_uint_eq(n.rows, CAP);
    ck_assert_uint_eq(n.evicted_cap, n.created - CAP);
    ck_assert_uint_ge(n.created, COLD);
    ps_table_free(t);
}
END_TEST

START_TEST(test_server_cap)
{
    enum { D = 2 };
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    uint64_t srows = 0;
    ps_table *a = mk(&c, &srows, 500), *b = mk(&c, &srows, 500);
    static uint64_t k[1000];
    static float o[1000 * D];
    for (int i = 0; i < 1000; i++)
        k[i] = key_of(i);
    ck_assert_int_eq(ps_table_pull(a, k, 400, 1, o, NULL), 0);
    ck_assert_uint_eq(srows, 400);
    ck_assert_int_eq(ps_table_pull(b, k + 400, 300, 1, o, NULL), 0);
    ck_assert_uint_eq(srows, 500);
    /* b evicted its own rows to stay under the shared cap. */
    ck_assert_uint_eq(counts(a).rows, 400);
    ck_assert_uint_eq(counts(b).rows, 100);
    ck_assert_uint_eq(counts(b).evicted_cap, 200);
    /* A third table with nothing to give creates nothing. */
    ps_table *z = mk(&c, &srows, 500);
    float g[D] = { 1, 1 };
    size_t made = 9;
    ck_assert_int_eq(ps_table_pull(z, k + 900, 1, 1, o, &made), 0);
    ck_assert_uint_eq(made, 0);
    ck_assert_int_eq(ps_table_apply(z, k + 900, 1, g, 1, 0.1f), 0);
    ck_assert_uint_eq(counts(z).dropped, 1);
    ps_table_free(b);
    ck_assert_uint_eq(srows, 400);
    ck_assert_int_eq(ps_table_apply(z, k + 900, 1, g, 1, 0.1f), 1);
    ck_assert_uint_eq(srows, 401);
    ps_table_free(z);
    ps_table_free(a);
    ck_assert_uint_eq(srows, 0);
}
END_TEST

/* Live keys into a flag array indexed by key (keys 0..N-1 here). */
typedef struct { uint8_t *live; uint64_t n; } live_ctx;
static int live_fn(void *u, uint64_t key, const float *w, const float *s1, const float *s2,
                   uint32_t steps, uint64_t touched)
{
    live_ctx *l = u;
    ck_assert_uint_lt(key, l->n);
    l->live[key] = 1;
    return 0;
}

START_TEST(test_row_ttl)
{
    /* Rows created PER per version for GEN versions, never touched again,
     * except the HOT first keys, pulled at every version. */
    enum { D = 1, TTL = 40, PER = 300, GEN = 60, HOT = 50, N = PER * GEN };
    const uint64_t P = (TTL + 3) / 4;
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    c.row_ttl = TTL;
    ps_table *t = mk(&c, NULL, 0);
    static uint64_t keys[N], born[N];
    static uint8_t live[N];
    static float o[N * D];
    for (uint64_t i = 0; i < N; i++) {
        keys[i] = i;
        born[i] = i / PER;
    }
    uint64_t gone = 0;
    for (uint64_t v = 0; v < GEN + TTL + 2 * P + 5; v++) {
        ck_assert_uint_eq(ps_table_version(t), v);
        if (v < GEN)
            ck_assert_int_eq(ps_table_pull(t, keys + v * PER, PER, 1, o, NULL), 0);
        ck_assert_int_eq(ps_table_pull(t, keys, HOT, 1, o, NULL), 0);
        memset(live, 0, sizeof live);
        live_ctx l = { live, N };
        ps_table_foreach(t, live_fn, &l);
        for (uint64_t i = 0; i < N; i++) {
            uint64_t touched = i < HOT ? v : born[i];
            if (born[i] > v)
                ck_assert(!live[i]);
            else if (v - touched <= TTL)
                ck_assert_msg(live[i], "row %llu (touched %llu) gone at %llu", (unsigned long long)i,
                              (unsigned long long)touched, (unsigned long long)v);
            else if (v >= touched + TTL + 2 * P)
                ck_assert_msg(!live[i], "row %llu (touched %llu) still there at %llu",
                              (unsigned long long)i, (unsigned long long)touched,
                              (unsigned long long)v);
        }
        ps_table_advance(t);
    }
    for (uint64_t i = HOT; i < N; i++)
        gone += !live[i];
    ps_table_counts n = counts(t);
    ck_assert_uint_eq(gone, N - HOT);
    ck_assert_uint_eq(n.evicted_ttl, N - HOT);
    ck_assert_uint_eq(n.rows, HOT);
    ps_table_free(t);
}
END_TEST

typedef struct { ps_table *to; } copy_ctx;
static int copy_fn(void *u, uint64_t key, const float *w, const float *s1, const float *s2,
                   uint32_t steps, uint64_t touched)
{
    copy_ctx *cc = u;
    ck_assert_int_eq(ps_table_put_row(cc->to, key, w, s1, s2, steps, touched), 0);
    return 0;
}

START_TEST(test_round_trip)
{
    enum { D = 6, N = 200 };
    ps_table_conf c = conf(D, PS_TINIT_NORMAL, PS_TOPT_ADAM);
    ps_table *a = mk(&c, NULL, 0);
    static uint64_t k[N];
    static float g[N * D], oa[N * D], ob[N * D];
    for (int i = 0; i < N; i++)
        k[i] = key_of(i);
    for (int i = 0; i < N * D; i++)
        g[i] = sinf((float)i);
    /* Rows stepped 1..4 times. */
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(ps_table_apply(a, k, N - r * 50, g, 1.0f, 0.01f), N - r * 50);
        ps_table_advance(a);
    }
    ps_table *b = mk(&c, NULL, 0);
    copy_ctx cc = { b };
    ck_assert_int_eq(ps_table_foreach(a, copy_fn, &cc), 0);
    ps_table_set_version(b, ps_table_version(a));
    ck_assert_uint_eq(counts(b).rows, N);
    ck_assert_int_eq(ps_table_pull(a, k, N, 0, oa, NULL), 0);
    ck_assert_int_eq(ps_table_pull(b, k, N, 0, ob, NULL), 0);
    ck_assert(memcmp(oa, ob, sizeof oa) == 0);
    ck_assert_int_eq(ps_table_apply(a, k, N, g, 0.5f, 0.01f), N);
    ck_assert_int_eq(ps_table_apply(b, k, N, g, 0.5f, 0.01f), N);
    ck_assert_int_eq(ps_table_pull(a, k, N, 0, oa, NULL), 0);
    ck_assert_int_eq(ps_table_pull(b, k, N, 0, ob, NULL), 0);
    ck_assert(memcmp(oa, ob, sizeof oa) == 0);
    /* put_row replaces a row of that key. */
    float w[D] = { 1, 2, 3, 4, 5, 6 };
    ck_assert_int_eq(ps_table_put_row(b, k[0], w, NULL, NULL, 0, 0), 0);
    ck_assert_uint_eq(counts(b).rows, N);
    ck_assert_int_eq(ps_table_pull(b, k, 1, 0, ob, NULL), 0);
    ck_assert(memcmp(ob, w, sizeof w) == 0);
    ps_table_free(a);
    ps_table_free(b);
}
END_TEST

START_TEST(test_index_random)
{
    enum { D = 2, KEYS = 30000, OPS = 200000 };
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_SGD);
    ps_table *t = mk(&c, NULL, 0);
    static uint64_t key[KEYS];
    static float ref[KEYS]; /* 0: no row */
    uint64_t live = 0, r = 88172645463325252ull;
    for (int i = 0; i < KEYS; i++)
        key[i] = key_of(i) ^ ((uint64_t)i << 40);
    key[0] = 0;
    key[1] = UINT64_MAX;
    key[2] = 1;
    for (int op = 1; op <= OPS; op++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        /* A small key range first (collisions, reuse), then all of it. */
        int range = op < OPS / 4 ? 2000 : KEYS;
        int i = (int)((r >> 20) % (uint64_t)range), what = (int)((r >> 8) % 100);
        if (what < 45) {
            float w[D] = { (float)op, (float)i };
            ck_assert_int_eq(ps_table_put_row(t, key[i], w, NULL, NULL, 0, 0), 0);
            live += ref[i] == 0;
            ref[i] = (float)op;
        } else if (what < 65) {
            ck_assert_int_eq(ps_table_remove(t, key[i]), ref[i] != 0);
            live -= ref[i] != 0;
            ref[i] = 0;
        } else {
            float o[D];
            ck_assert_int_eq(ps_table_pull(t, &key[i], 1, 0, o, NULL), 0);
            ck_assert_msg(o[0] == ref[i], "op %d key %d: %g, want %g", op, i, o[0], ref[i]);
            if (ref[i] != 0)
                ck_assert(o[1] == (float)i);
        }
        if (op % 1000 == 0)
            ck_assert_uint_eq(counts(t).rows, live);
    }
    for (int i = 0; i < KEYS; i++) {
        float o[D];
        ck_assert_int_eq(ps_table_pull(t, &key[i], 1, 0, o, NULL), 0);
        ck_assert(o[0] == ref[i]);
    }
    ps_table_free(t);
}
END_TEST

START_TEST(test_row_bytes)
{
    enum { D = 16, CAP = 1000 };
    ps_table_conf c = conf(D, PS_TINIT_ZEROS, PS_TOPT_ADAM);
    size_t rb = ps_table_row_bytes(&c);
    ck_assert_uint_eq(rb, 4 * D * 3 + 16 + 4 + 32);
    c.max_rows = CAP;
    ps_table *t = mk(&c, NULL, 0);
    static uint64_t k[4096];
    static float o[4096 * D];
    for (int i = 0; i < 4096; i++)
        k[i] = key_of(i);
    ck_assert_int_eq(ps_table_pull(t, k, CAP, 1, o, NULL), 0);
    size_t bytes = ps_table_bytes(t);
    ck_assert_msg(bytes <= CAP * rb + 4096, "%zu bytes for %d rows of %zu", bytes, CAP, rb);
    ck_assert_uint_ge(bytes, CAP * (rb - 32));
    ps_table_free(t);
    /* Uncapped at a power of two: the index is 2 entries (16 bytes) a row. */
    c.max_rows = 0;
    t = mk(&c, NULL, 0);
    ck_assert_int_eq(ps_table_pull(t, k, 4096, 1, o, NULL), 0);
    bytes = ps_table_bytes(t);
    ck_assert_msg(bytes <= 4096 * (rb - 16) + 4096, "%zu bytes for 4096 rows of %zu", bytes, rb);
    ps_table_free(t);
}
END_TEST

START_TEST(test_keys_zero_max)
{
    enum { D = 3 };
    ps_table_conf c = conf(D, PS_TINIT_UNIFORM, PS_TOPT_ADAGRAD);
    ps_table *t = mk(&c, NULL, 0);
    uint64_t k[4] = { 0, UINT64_MAX, 1, UINT64_MAX - 1 };
    float o[4 * D], init[4 * D], g[4 * D];
    for (int i = 0; i < 4; i++)
        ps_table_init_row(&c, k[i], init + i * D);
    for (int i = 0; i < 4 * D; i++)
        g[i] = (float)(i + 1);
    char why[64];
    ck_assert_int_eq(ps_table_push_check(t, k, 4, g, why, sizeof why), 0);
    ck_assert_int_eq(ps_table_pull(t, k, 4, 1, o, NULL), 0);
    ck_assert(memcmp(o, init, sizeof o) == 0);
    ck_assert_int_eq(ps_table_apply(t, k, 2, g, 1, 0.1f), 2);
    ck_assert_int_eq(ps_table_pull(t, k, 4, 0, o, NULL), 0);
    for (int i = 0; i < 2 * D; i++)
        ck_assert(o[i] != init[i]);
    ck_assert(memcmp(o + 2 * D, init + 2 * D, 2 * D * sizeof(float)) == 0);
    ck_assert_int_eq(ps_table_remove(t, 0), 1);
    ck_assert_int_eq(ps_table_remove(t, 0), 0);
    ck_assert_int_eq(has_row(t, UINT64_MAX), 1);
    ck_assert_uint_eq(counts(t).rows, 3);
    ps_table_free(t);
}
END_TEST

START_TEST(test_rowsum)
{
    ps_rowsum *s = ps_rowsum_new(2);
    ck_assert_ptr_nonnull(s);
    uint64_t k1[3] = { 5, UINT64_MAX, 0 }, k2[2] = { 0, 9 };
    float g1[6] = { 1, 2, 3, 4, 5, 6 }, g2[4] = { 10, 20, 30, 40 };
    ck_assert_int_eq(ps_rowsum_add(s, k1, 3, g1), 0);
    ck_assert_int_eq(ps_rowsum_add(s, k2, 2, g2), 0);
    const uint64_t *keys;
    const float *sums;
    ck_assert_uint_eq(ps_rowsum_get(s, &keys, &sums), 4);
    uint64_t wk[4] = { 5, UINT64_MAX, 0, 9 };
    float ws[8] = { 1, 2, 3, 4, 15, 26, 30, 40 };
    ck_assert(memcmp(keys, wk, sizeof wk) == 0);
    ck_assert(memcmp(sums, ws, sizeof ws) == 0);
    ps_rowsum_clear(s);
    ck_assert_uint_eq(ps_rowsum_get(s, &keys, &sums), 0);
    /* Many rows: growth keeps order and sums. */
    for (uint64_t i = 0; i < 5000; i++) {
        uint64_t kk = key_of(i % 1000);
        float gg[2] = { 1, (float)i };
        ck_assert_int_eq(ps_rowsum_add(s, &kk, 1, gg), 0);
    }
    ck_assert_uint_eq(ps_rowsum_get(s, &keys, &sums), 1000);
    for (uint64_t i = 0; i < 1000; i++) {
        ck_assert(keys[i] == key_of(i));
        ck_assert(sums[2 * i] == 5.0f);
    }
    ps_rowsum_free(s);
}
END_TEST

START_TEST(test_conf_check)
{
    char why[128];
    ps_table_conf ok = conf(4, PS_TINIT_NORMAL, PS_TOPT_ADAM), c;
    ck_assert_int_eq(ps_table_conf_check(&ok, why, sizeof why), 0);
    c = ok; c.dim = 0;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
    c = ok; c.dim = 65537;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
    c = ok; c.admit = PS_TADMIT_PROB; c.admit_prob = 0;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
    c = ok; c.admit = PS_TADMIT_PROB; c.admit_prob = 1.5f;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
    c = ok; c.admit = PS_TADMIT_COUNT; c.admit_count = 0;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
    c = ok; c.beta2 = 1;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
    c = ok; c.eps = 0;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
    c = ok; c.init_scale = NAN;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
    c = ok; c.opt = (ps_topt)7;
    ck_assert_int_eq(ps_table_conf_check(&c, why, sizeof why), -1);
}
END_TEST

Suite *suite_table(void)
{
    Suite *s = suite_create("table");
    struct { const char *name; const TTest *fn; } cases[] = {
        { "init_is_pure_function_of_seed_key", test_init_pure },
        { "init_normal_moments", test_init_normal },
        { "zeros_init_and_inference_pull", test_zeros_inference },
        { "optimizers_match_reference", test_optimizers },
        { "push_check_refuses_duplicates", test_push_check_duplicates },
        { "push_check_refuses_nonfinite", test_push_check_nonfinite },
        { "push_check_nonfinite_blocks", test_push_check_nonfinite_blocks },
        { "admit_count", test_admit_count },
        { "admit_count_pending_bounded", test_admit_pending_bounded },
        { "admit_prob_deterministic", test_admit_prob },
        { "max_rows_keeps_hot_set", test_max_rows_hot },
        { "server_cap_shared", test_server_cap },
        { "row_ttl_bound", test_row_ttl },
        { "foreach_put_row_round_trip", test_round_trip },
        { "index_random_ops_vs_reference", test_index_random },
        { "row_bytes_vs_allocation", test_row_bytes },
        { "keys_zero_and_max", test_keys_zero_max },
        { "rowsum_first_insertion_order", test_rowsum },
        { "conf_check_refuses", test_conf_check },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases[i].fn);
        suite_add_tcase(s, tc);
    }
    return s;
}
