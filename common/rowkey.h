/* rowkey.h -- where a row of a sparse table lives, and the hash behind its
 * initial value: both part of the protocol (docs/protocol.md, "Tables"),
 * so a client in any language computes the same.
 *
 * splitmix64 is the output function of Steele, Lea and Flood's SplitMix64
 * generator (also Java's SplittableRandom): a bijection of 64-bit integers
 * that mixes every input bit into every output bit. */
#ifndef GDDR_ROWKEY_H
#define GDDR_ROWKEY_H

#include <stdint.h>

static inline uint64_t gddr_splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The server (0..S-1) that holds key's row in a table spread over S
 * servers: splitmix64(key) mod S. */
static inline uint32_t gddr_row_shard(uint64_t key, uint32_t S)
{
    return S > 1 ? (uint32_t)(gddr_splitmix64(key) % S) : 0;
}

#endif
