/* table_int.h -- the inside of a sparse table, shared by table.c (rows,
 * eviction, pulls and steps), table_row.c (what a row holds and how it is
 * stepped: pure functions) and table_index.c (the hash index, the pending
 * keys of count and prob admission, the row sums). Nothing outside the
 * table* files includes it.
 *
 * The index. Open addressing with linear probing over 2^j entries of 64
 * bits: the low 32 bits of the key's hash (the tag) and a 32-bit slot
 * number. The tag's low j bits are the home position, the rest skip most
 * key compares, and backward-shift deletion finds an entry's home without
 * reading its key. The empty entry is all ones: slot numbers stay below
 * 2^31, so no live entry is all ones, whatever its key (0 and UINT64_MAX
 * are keys like any other).
 *
 * The hash is splitmix64 of the key xor a salt, not splitmix64(key) bare:
 * gddr_row_shard places a key on server splitmix64(key) mod S, so on one
 * server of a power-of-two S the low bits of splitmix64(key) are all the
 * same, and an index keyed by them would pile every key onto 1/S of its
 * positions.
 */
#ifndef GDDR_PS_TABLE_INT_H
#define GDDR_PS_TABLE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

#define PS_TIX_EMPTY UINT64_MAX
#define PS_TIX_SALT 0x7461626c65696478ull /* "tableidx" */
/* At most this many slots in a table (slot numbers below 2^31). */
#define PS_TABLE_MAX_SLOTS (1ull << 31)

typedef struct ps_tindex {
    uint64_t *ent;
    uint64_t mask; /* entries - 1; entries a power of two, at most 2^32 */
} ps_tindex;

static inline uint64_t ps_tix_hash(uint64_t key)
{
    return gddr_splitmix64(key ^ PS_TIX_SALT);
}

/* The slot of key, or -1. keys[s * stride] is the key of slot s. */
static inline int64_t ps_tix_find(const ps_tindex *x, const uint64_t *keys, size_t stride,
                                  uint64_t key)
{
    uint32_t tag = (uint32_t)ps_tix_hash(key);
    for (uint64_t i = tag & x->mask;; i = (i + 1) & x->mask) {
        uint64_t e = x->ent[i];
        if (e == PS_TIX_EMPTY)
            return -1;
        if ((uint32_t)(e >> 32) == tag && keys[(size_t)(uint32_t)e * stride] == key)
            return (uint32_t)e;
    }
}

/* Entries an index needs for `slots` slots: the smallest power of two at
 * least 2 * slots, so the load stays at or under 0.5. */
uint64_t ps_tix_entries_for(uint64_t slots);
/* A new index of `entries` entries (a power of two), every one empty. */
int ps_tix_init(ps_tindex *x, uint64_t entries);
void ps_tix_free(ps_tindex *x);
void ps_tix_clear(ps_tindex *x);
/* Adds key -> slot (key absent, a free entry left). */
void ps_tix_insert(ps_tindex *x, uint64_t key, uint32_t slot);
/* Removes key (present) from the index. */
void ps_tix_erase(ps_tindex *x, const uint64_t *keys, size_t stride, uint64_t key);
/* Points key's entry (present, at slot from) at slot to. */
void ps_tix_reslot(ps_tindex *x, uint64_t key, uint32_t from, uint32_t to);
/* Replaces x by an index of `entries` entries over slots 0..n-1. On no
 * memory x is left as it was and -1 returned. */
int ps_tix_rebuild(ps_tindex *x, uint64_t entries, const uint64_t *keys, size_t stride,
                   uint64_t n);

/* Keys seen but not admitted yet, with their sightings: dense entries with
 * swap-remove, at most `bound` of them (the one seen least recently of a
 * sample is forgotten to make room). */
typedef struct ps_tpend_ent {
    uint64_t key;
    uint64_t seen; /* table version of the last sighting */
} ps_tpend_ent;

typedef struct ps_tpend {
    ps_tpend_ent *e;
    uint32_t *sightings;
    uint64_t n, cap, bound;
    uint64_t rng;
    ps_tindex ix;
} ps_tpend;

#define PS_TPEND_SAMPLE 8

void ps_tpend_free(ps_tpend *p);
int64_t ps_tpend_find(const ps_tpend *p, uint64_t key);
/* Adds key with 0 sightings; -1 on no memory. */
int64_t ps_tpend_add(ps_tpend *p, uint64_t key, uint64_t seen);
void ps_tpend_remove(ps_tpend *p, uint64_t i);
size_t ps_tpend_bytes(const ps_tpend *p);

/* Whether key is admitted at its sighting number s (1, 2, ...) with
 * probability p (table.h: the exact formula). */
int ps_trow_admit_prob(uint64_t seed, uint64_t key, uint32_t s, float p);
/* Floats of optimizer state per value: 0 sgd, 1 adagrad, 2 adam. */
uint32_t ps_trow_nstate(const ps_table_conf *c);
/* The state of a new row (dim * nstate floats). */
void ps_trow_init_state(const ps_table_conf *c, float *s);
/* One optimizer step of a row stepped *steps times before (table.h). */
void ps_trow_step(const ps_table_conf *c, float *w, float *s, uint32_t *steps, const float *g,
                  float scale, float lr);

static inline void ps_tbit_set(uint64_t *b, uint64_t s) { b[s >> 6] |= 1ull << (s & 63); }
static inline void ps_tbit_clr(uint64_t *b, uint64_t s) { b[s >> 6] &= ~(1ull << (s & 63)); }
static inline int ps_tbit(const uint64_t *b, uint64_t s) { return (int)(b[s >> 6] >> (s & 63) & 1); }

/* Slot meta: the key and the last touch side by side, one cache line for
 * a pull's key compare and touch. */
typedef struct ps_tmeta {
    uint64_t key;
    uint64_t touched;
} ps_tmeta;

struct ps_table {
    ps_table_conf c;
    uint32_t nstate;
    /* Rows live in slots 0..rows-1 (a removal moves the last row into the
     * hole), capacity cap, growing by doubling up to hard. */
    float *w;          /* cap * dim */
    float *s;          /* cap * dim * nstate: [s1 | s2] per row */
    ps_tmeta *meta;    /* cap */
    uint32_t *steps;   /* cap */
    uint64_t *dirty;   /* cap bits: rows created, stepped or put since the
                        * last ps_table_dirty_clear (a bit moves with its row) */
    uint64_t rows, cap, hard;
    ps_tindex ix;
    uint64_t version;
    uint64_t sweep;    /* the ttl sweep's next slot */
    uint64_t rng;      /* counter of the sampled LRU's draws */
    uint64_t *server_rows, server_max;
    uint64_t *server_bytes, server_max_bytes, row_bytes; /* ps_table_set_server_bytes */
    ps_table_counts n;
    ps_tpend pend;
    ps_tindex *scratch; /* push_check's key set (a const table may use it) */
};

#endif
