/* blas.c -- CPU norms and vector updates declared in blas.h.
 *
 * The CUDA half of blas.h (context, memory, cuBLAS) is in cuda_rt.c, inside
 * the plugin libgddr-cuda.so; the client library reaches it through
 * cuda_loader.c.
 */
#include "blas.h"

#include <math.h>
#include <string.h>

/* The CPU reductions run once per push on both ends, so they must keep up
 * with memory: 16 floats a turn, widened to double in four vector
 * accumulators (GCC vector extensions; the compiler picks SSE2, AVX2 or
 * AVX-512 at load time through target_clones). Double accumulation keeps
 * the norm of a 100M-float gradient accurate to float precision without
 * cuBLAS's scaling passes; a NaN or Inf anywhere makes the result NaN or
 * Inf, which is how the server checks finiteness in the same pass. */
typedef float gddr__v4f __attribute__((vector_size(16)));
typedef double gddr__v4d __attribute__((vector_size(32)));
typedef long long gddr__v4l __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define GDDR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GDDR_CLONES
#endif

/* Always inlined into the clones, so their 32-byte vector returns never
 * cross a call (-Wpsabi, silenced for this file in the Makefile, warns
 * about an ABI that is never used). */
static inline __attribute__((always_inline)) gddr__v4d widen(const float *p)
{
    gddr__v4f f;
    memcpy(&f, p, sizeof f);
    return __builtin_convertvector(f, gddr__v4d);
}

static inline __attribute__((always_inline)) gddr__v4d vabs(gddr__v4d a)
{
    const long long m = 0x7fffffffffffffffLL;
    return (gddr__v4d)((gddr__v4l)a & (gddr__v4l){ m, m, m, m });
}

/* Four accumulators, not two: a vector add waits about four cycles for
 * the one before it into the same accumulator, so two of them held the
 * sum to 2 floats a cycle (measured: a 1 MiB norm took as long as the
 * server's whole SGD apply of it, 48 us); four let the loads set the pace. */
GDDR_CLONES double gddr_sumsq_cpu(const float *x, size_t n)
{
    gddr__v4d s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 };
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        gddr__v4d a = widen(x + i), b = widen(x + i + 4), c = widen(x + i + 8), d = widen(x + i + 12);
        s0 += a * a;
        s1 += b * b;
        s2 += c * c;
        s3 += d * d;
    }
    for (; i + 4 <= n; i += 4) {
        gddr__v4d a = widen(x + i);
        s0 += a * a;
    }
    double s = 0.0;
    for (; i < n; i++)
        s += (double)x[i] * (double)x[i];
    gddr__v4d t = (s0 + s1) + (s2 + s3);
    return ((t[0] + t[1]) + (t[2] + t[3])) + s;
}

double gddr_nrm2_cpu(const float *x, size_t n)
{
    return sqrt(gddr_sumsq_cpu(x, n));
}

GDDR_CLONES double gddr_asum_cpu(const float *x, size_t n)
{
    gddr__v4d s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 };
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        gddr__v4d a = widen(x + i), b = widen(x + i + 4), c = widen(x + i + 8), d = widen(x + i + 12);
        s0 += vabs(a);
        s1 += vabs(b);
        s2 += vabs(c);
        s3 += vabs(d);
    }
    for (; i + 4 <= n; i += 4)
        s0 += vabs(widen(x + i));
    double s = 0.0;
    for (; i < n; i++)
        s += fabs((double)x[i]);
    gddr__v4d t = (s0 + s1) + (s2 + s3);
    return ((t[0] + t[1]) + (t[2] + t[3])) + s;
}

/* The float-precision reductions. Summing in double costs a widening per
 * value, and on this project's 2-core build machine that, not memory, set
 * the pace: a 1 MiB sum of squares took 31-34 us in double and 10-13 us in
 * float (bench_kernels, rows "sumsq (pass1)" and "sumsq fp32"). So these sum
 * blocks of GDDR_FP32_BLOCK values in float (8 lanes x 4 accumulators: 32
 * terms per lane, a relative error of at most ~2e-6), and the blocks in
 * double. A block whose float sum is not finite (NaN, Inf, or finite squares
 * that overflowed a float) or is tiny (squares that may have underflowed;
 * an all-zero block too, at the double sum's speed) is summed again the
 * double way, so NaN or Inf in x still gives NaN or Inf,
 * finite x always a finite sum, and tiny values are not lost. The order is
 * fixed by the code, not the instruction set: every clone gives the same
 * bits. */
#define GDDR_FP32_BLOCK 1024
typedef float gddr__v8f __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) gddr__v8f load8(const float *p)
{
    gddr__v8f f;
    memcpy(&f, p, sizeof f);
    return f;
}

static inline __attribute__((always_inline)) double lanes(gddr__v8f t)
{
    return (((double)t[0] + t[1]) + ((double)t[2] + t[3])) + (((double)t[4] + t[5]) + ((double)t[6] + t[7]));
}

/* Below this a block's float sum of squares may have lost underflowed
 * terms (each lost square is under FLT_MIN, 2^-126, so their share of a
 * sum above 2^-80 is under 1e-11). */
#define GDDR_FP32_TINY 0x1p-80
#define GDDR_FP32_INF ((double)__builtin_inff())

/* One term of the float sums: x^2 (squares) or |x|, lane by lane. */
static inline __attribute__((always_inline)) gddr__v8f term8(const float *p, int squares)
{
    typedef int gddr__v8i __attribute__((vector_size(32)));
    const int m = 0x7fffffff;
    const gddr__v8i abs_mask = { m, m, m, m, m, m, m, m };
    gddr__v8f v = load8(p);
    return squares ? v * v : (gddr__v8f)((gddr__v8i)v & abs_mask);
}

/* Both float sums; squares is a constant at each call, so each clone of
 * the two callers gets its own loop. A block is summed again the double
 * way when its float sum is not finite, or (squares) tiny. */
static inline __attribute__((always_inline)) double fp32_sum(const float *x, size_t n, int squares)
{
    double total = 0.0;
    size_t i = 0;
    while (n - i >= 32) {
        const size_t lo = i, span = n - i < GDDR_FP32_BLOCK ? (n - i) & ~(size_t)31 : GDDR_FP32_BLOCK;
        gddr__v8f s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 };
        for (; i < lo + span; i += 32) {
            s0 += term8(x + i, squares);
            s1 += term8(x + i + 8, squares);
            s2 += term8(x + i + 16, squares);
            s3 += term8(x + i + 24, squares);
        }
        double b = lanes((s0 + s1) + (s2 + s3));
        if (!(b < GDDR_FP32_INF) || (squares && b < GDDR_FP32_TINY))
            b = squares ? gddr_sumsq_cpu(x + lo, span) : gddr_asum_cpu(x + lo, span);
        total += b;
    }
    for (; i < n; i++)
        total += squares ? (double)x[i] * (double)x[i] : fabs((double)x[i]);
    return total;
}

GDDR_CLONES double gddr_sumsq_fp32_cpu(const float *x, size_t n)
{
    return fp32_sum(x, n, 1);
}

int gddr_finite_cpu(const float *x, size_t n)
{
    return isfinite(gddr_sumsq_fp32_cpu(x, n));
}

GDDR_CLONES double gddr_asum_fp32_cpu(const float *x, size_t n)
{
    return fp32_sum(x, n, 0);
}

void gddr_scal_cpu(float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}

void gddr_axpy_cpu(float *y, const float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        y[i] = y[i] + a * x[i];
}
