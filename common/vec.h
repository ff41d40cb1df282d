/* vec.h -- how the per-value loops of GDDR are built.
 *
 * GDDR_VEC marks a function whose loops over floats should be vectorised:
 * it is built twice (AVX2 and baseline x86-64, chosen at load time) and with
 * GCC's dynamic cost model, because -O2 alone uses the "very cheap" model,
 * which leaves every loop that needs a run-time alias check or a scalar
 * tail unvectorised (measured: the server's SGD loop ran one float at a
 * time, 12% of a 1 MiB push+pull's CPU). Only exact operations (sums,
 * products, divisions, square roots, rint, compares) are vectorised
 * (square roots because the Makefile builds with -fno-math-errno) and the
 * build keeps -ffp-contract=off, so either clone gives the scalar
 * results bit for bit (and the CUDA kernels', tests/check_kernels.c).
 * Reductions (norms, sums of |x|) are written with explicit vector types
 * instead (kernels/blas.c), because their order is part of the result.
 */
#ifndef GDDR_VEC_H
#define GDDR_VEC_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define GDDR_VEC __attribute__((target_clones("avx2", "default"), optimize("vect-cost-model=dynamic")))
#else
#define GDDR_VEC
#endif

#endif
