/* gddr_hash.h -- the counter-based hash behind the GDDR hold mask.
 *
 * docs/design.md section 6 step 4 holds chunk c of a tensor back when
 * U(seed, worker, key, step, c) < alpha. The CPU twin and the CUDA kernel
 * must draw the same U for the same inputs, so the mask cannot come from a
 * stateful generator: it is a pure function of its five counters, built from
 * 64-bit integer multiplies, xors and shifts only (splitmix64 finalizer
 * rounds), which every compiler and GPU evaluate bit-identically. The same
 * header is compiled by gcc and by nvcc; GDDR_HD marks the functions
 * __host__ __device__ under nvcc and is empty otherwise.
 */
#ifndef GDDR_KERNELS_HASH_H
#define GDDR_KERNELS_HASH_H

#include <stdint.h>

#if defined(__CUDACC__)
#define GDDR_HD __host__ __device__
#else
#define GDDR_HD
#endif

/* splitmix64's output function: a bijection on 64 bits with full avalanche,
 * so xoring one counter in and mixing again decorrelates neighbours. */
static inline GDDR_HD uint64_t gddr__mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Mixes the per-call prefix (seed, worker, key, step). The kernels compute
 * it once per call and only the chunk round per chunk; the result is the same
 * as gddr_hash_u32() because that function is written in terms of it. */
static inline GDDR_HD uint64_t gddr__hash_prefix(uint64_t seed, uint32_t worker, uint32_t key,
                                                 uint64_t step)
{
    uint64_t h = gddr__mix64(seed + 0x9e3779b97f4a7c15ull);
    h = gddr__mix64(h ^ (((uint64_t)worker << 32) | (uint64_t)key));
    return gddr__mix64(h ^ step);
}

static inline GDDR_HD uint32_t gddr__hash_chunk(uint64_t prefix, uint32_t chunk)
{
    /* The odd constant keeps chunk 0 from being a fixed point of the xor. */
    return (uint32_t)(gddr__mix64(prefix ^ ((uint64_t)chunk * 0xd6e8feb86659fd93ull + 1u)) >> 32);
}

/* 32 well-mixed bits for one (seed, worker, key, step, chunk). Pure. */
static inline GDDR_HD uint32_t gddr_hash_u32(uint64_t seed, uint32_t worker, uint32_t key,
                                             uint64_t step, uint32_t chunk)
{
    return gddr__hash_chunk(gddr__hash_prefix(seed, worker, key, step), chunk);
}

/* Maps 24 hash bits to a float in [0, 1). 24 bits fit a float mantissa, so
 * the conversion and the scale by 2^-24 are exact on every platform. */
static inline GDDR_HD float gddr__u32_to_uniform(uint32_t h)
{
    return (float)(h >> 8) * (1.0f / 16777216.0f);
}

static inline GDDR_HD float gddr_hash_uniform(uint64_t seed, uint32_t worker, uint32_t key,
                                              uint64_t step, uint32_t chunk)
{
    return gddr__u32_to_uniform(gddr_hash_u32(seed, worker, key, step, chunk));
}

/* FNV-1a (32 bit) of a NUL-terminated tensor name: the `key` counter of the
 * mask, so each tensor gets its own independent hold pattern. */
static inline uint32_t gddr_key_hash(const char *name)
{
    uint32_t h = 0x811c9dc5u;
    for (const unsigned char *p = (const unsigned char *)name; p && *p; p++) {
        h ^= *p;
        h *= 0x01000193u;
    }
    return h;
}

#endif /* GDDR_KERNELS_HASH_H */
