/* table.h -- sparse embedding tables: rows of `dim` float32 values named by
 * 64-bit keys, created on first touch, stepped by a per-row optimizer,
 * bounded in number (ttl and sampled LRU). The storage engine only: no
 * wire, no threads (the front thread owns every table; table_wire.c speaks
 * the protocol and does sync steps, exactly-once and AdaDelay).
 *
 * Layout: an open-addressing hash index (linear probing, backward-shift
 * deletion) maps a key to a slot; slots are rows in parallel arrays
 * (values, optimizer state, key, last touch, per-row step count), so the
 * memory of a row is fixed (ps_table_row_bytes) and a pull is a lookup
 * and a memcpy of dim floats per key. Rows are dense in slots 0..rows-1 (a
 * removal moves the last row into the hole). The slot arrays grow by
 * doubling (realloc) from 16 up to the smaller cap (max_rows, the server's,
 * 2^31); the index has the smallest power of two >= 2 * slots entries of 8
 * bytes and is rebuilt when the slots grow, so its load never exceeds 0.5.
 * Nothing shrinks. server/table_int.h has the details.
 *
 * Memory: ps_table_bytes(t) <= C * ps_table_row_bytes(c) + C / 8 + 8 (the
 * dirty bits of incremental checkpoints) + the struct +
 * the pending keys of count/prob admission (at most 52 bytes per key of
 * a capacity that doubles up to max(max_rows, 2^20) keys) + push_check's
 * scratch (under 32 bytes per key of the largest push checked), C the
 * slot capacity: C = the cap
 * (max_rows or the server's) once a capped table is full, otherwise C <
 * max(16, 2 * the most rows held); slots above the rows are allocated but
 * never written, so on Linux they take no resident memory.
 *
 * Limits: 2^31 rows per table. Keys are any 64-bit values (0 and
 * UINT64_MAX too).
 */
#ifndef GDDR_PS_TABLE_H
#define GDDR_PS_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "rowkey.h"

typedef enum { PS_TINIT_ZEROS = 0, PS_TINIT_UNIFORM = 1, PS_TINIT_NORMAL = 2 } ps_tinit;
/* Admission of a new key: always; once it was seen admit_count times (a
 * training pull of it counts one); with probability admit_prob per sighting
 * (decided by a hash of seed, key and sighting number: the same on every
 * server and in every run). Until admitted a key reads as its initial value
 * and gradients pushed for it are dropped (counted).
 *
 * Exactly: with u(seed, key, i) as in ps_table_init_row, sighting number s
 * (1, 2, ...) of key admits it when u(init_seed ^ 0x61646d6974, key, s) <
 * admit_prob (float compare). Count and prob admission both keep the
 * sightings of keys not admitted yet in a side map of at most
 * max(max_rows, 2^20) keys; when it is full, the key seen least recently
 * (by table version) of 8 drawn at random is forgotten, and its count
 * starts over at its next sighting. */
typedef enum { PS_TADMIT_ALWAYS = 0, PS_TADMIT_COUNT = 1, PS_TADMIT_PROB = 2 } ps_tadmit;
typedef enum { PS_TOPT_SGD = 0, PS_TOPT_ADAGRAD = 1, PS_TOPT_ADAM = 2 } ps_topt;

typedef struct ps_table_conf {
    uint32_t dim;            /* floats per row, 1..65536 */
    ps_tinit init;
    float init_scale;        /* uniform: U(-s, s); normal: N(0, s^2) */
    uint64_t init_seed;      /* a row's initial value depends on (init_seed, key) only */
    ps_tadmit admit;
    uint32_t admit_count;    /* PS_TADMIT_COUNT: sightings needed (>= 1) */
    float admit_prob;        /* PS_TADMIT_PROB: 0 < p <= 1 */
    ps_topt opt;
    float lr;                /* default step size (a push may bring its own) */
    float beta1, beta2, eps; /* adam; adagrad uses eps */
    float adagrad_init;      /* adagrad: the accumulator's initial value */
    uint64_t max_rows;       /* 0: no cap of its own */
    uint64_t row_ttl;        /* evict rows not touched for this many table versions; 0: never */
} ps_table_conf;

/* What a table did, cumulative (metrics). */
typedef struct ps_table_counts {
    uint64_t rows;           /* live rows now */
    uint64_t created;        /* rows created */
    uint64_t evicted_ttl;    /* rows evicted for row_ttl */
    uint64_t evicted_cap;    /* rows evicted for max_rows (or the server's cap) */
    uint64_t dropped;        /* gradient rows dropped: key not admitted (yet) */
    uint64_t pending;        /* keys seen but not admitted yet (count, prob admission) */
} ps_table_counts;

typedef struct ps_table ps_table;

/* Bytes one row costs with this configuration: its values, its optimizer
 * state, its key, last touch and step count, and its share of the hash
 * index at the worst load factor. Exactly: 4 * dim * (1 + k) + 16 + 4 + 32,
 * k = 0 sgd, 1 adagrad, 2 adam (key and last touch 8 bytes each, step
 * count 4, and 4 index entries of 8 bytes: the index has under 4 entries
 * per slot, exactly 2 when the slot capacity is a power of two). */
size_t ps_table_row_bytes(const ps_table_conf *c);
/* Bytes the table has allocated now, all of it (see Memory above). */
size_t ps_table_bytes(const ps_table *t);

/* Checks c (dim, probabilities, ...): 0, or -1 with why filled. */
int ps_table_conf_check(const ps_table_conf *c, char *why, size_t whylen);

/* A new empty table (version 0). server_rows (may be NULL): a counter of
 * live rows shared by every table of a server, bounded by server_max_rows
 * (0: no bound); a table over either cap evicts its least recently touched
 * rows (sampled) before it creates one. Returns 0 or -1 (no memory).
 *
 * Sampled LRU: of 16 live rows of the creating table drawn at random (a
 * counter-based draw from init_seed: deterministic), the one with the
 * oldest last touch (a table version) goes; counted in evicted_cap. A
 * table at the server's cap with no row of its own to give creates none:
 * the key reads as its initial value, its gradients are dropped (counted),
 * as if not admitted. */
int ps_table_new(const ps_table_conf *c, uint64_t *server_rows, uint64_t server_max_rows,
                 ps_table **out);
void ps_table_free(ps_table *t);
/* A second shared bound, in bytes: server_bytes (shared by every table of
 * a server) counts ps_table_row_bytes per live row, and a table whose next
 * row would take it over max_bytes (0: no bound) evicts its least recently
 * touched rows first, as for server_max_rows. What keeps tables of large
 * rows from taking the machine's memory under a row count meant for small
 * ones. */
void ps_table_set_server_bytes(ps_table *t, uint64_t *server_bytes, uint64_t max_bytes);
const ps_table_conf *ps_table_config(const ps_table *t);

/* A key's initial value (dim floats): a pure function of (init_seed, key,
 * index), so it does not depend on which worker touched the key first or
 * which server holds it. Exactly, with sm = gddr_splitmix64, G =
 * 0x9e3779b97f4a7c15 and 64-bit wrapping arithmetic:
 *
 *   u(seed, key, i) = (sm(seed ^ sm(key ^ (i * G))) >> 40) * 2^-24
 *                     (a float32 in [0, 1), exact)
 *   zeros    w[i] = 0
 *   uniform  w[i] = s * (2 * u(seed, key, i) - 1)         in float32
 *            (2u - 1 is exact; one rounding, of the product): [-s, s)
 *   normal   u1 = u(seed, key, 2i), u2 = u(seed, key, 2i + 1),
 *            w[i] = (float)(s * sqrt(-2 * log(1 - u1)) * cos(2 * pi * u2))
 *            computed in double (Box-Muller; 1 - u1 is in (0, 1])
 *
 * with s = init_scale and seed = init_seed. */
void ps_table_init_row(const ps_table_conf *c, uint64_t key, float *out);

/* Reads n rows into out (n * dim floats, in the order of keys; a key may
 * repeat). create = 1 (training): a key that has no row counts a sighting
 * and gets its row when admission says so; a key still not admitted reads
 * as its initial value. create = 0 (inference): a key without a row reads
 * as zeros and nothing changes. Every row read is touched (its ttl starts
 * over). *created (may be NULL): rows this call created. Returns 0, or -1
 * when out of memory (rows created before that stay). */
int ps_table_pull(ps_table *t, const uint64_t *keys, size_t n, int create, float *out,
                  size_t *created);

/* Checks a push before anything changes: every value finite, no key twice
 * (the client sums duplicates; the wire refuses them). Returns 0;
 * PS_TABLE_NONFINITE for a NaN or Inf, -1 for anything else, with why
 * filled (naming the first offending key or value). The
 * duplicate check of more than 16 keys uses a scratch set the table keeps
 * (allocated apart, kept between calls, in ps_table_bytes): t is not
 * modified, but two threads must not check pushes on one table at once
 * (the front thread owns every table anyway). */
#define PS_TABLE_NONFINITE (-2)
int ps_table_push_check(const ps_table *t, const uint64_t *keys, size_t n, const float *g,
                        char *why, size_t whylen);

/* One optimizer step per key with gradient scale * g[i*dim ...] and step
 * size lr (> 0; the push's lr_eff after AdaDelay): sgd w -= lr*g;
 * adagrad G += g^2, w -= lr*g/(sqrt(G)+eps); adam with the row's own step
 * count for the bias correction (a row stepped k times uses k; rows of a
 * sparse table are stepped at different rates). A key without a row gets
 * one first when admission allows (PS_TADMIT_ALWAYS: always; otherwise
 * only rows a pull admitted exist, and the gradient of any other key is
 * dropped and counted). Keys must have passed ps_table_push_check.
 * Touches every stepped row. Returns the rows stepped, or -1 (no memory).
 *
 * Exactly (float32, no fused multiply-add, as server/optim.c), with g' =
 * scale * g and k the row's step count after this step: adam m = b1*m +
 * (1-b1)*g'; v = b2*v + (1-b2)*g'*g'; w -= lr * (m*bc1) / (sqrtf(v*bc2) +
 * eps), bc1 = (float)(1 / (1 - b1^k)), bc2 likewise, in double. Every
 * optimizer counts steps (foreach reports them). */
long ps_table_apply(ps_table *t, const uint64_t *keys, size_t n, const float *g, float scale,
                    float lr);

/* The table's version (one per applied push in async mode, one per step
 * in sync: table_wire.c calls advance); advancing also evicts, a bounded
 * number of slots per call, rows whose last touch is more than row_ttl
 * versions old.
 *
 * The ttl sweep: advance adds 1 to the version, then checks slots from a
 * cursor, max(16, ceil(8 * C / row_ttl)) of them at most (C the slot
 * capacity; an eviction counts as a check), and stops when the cursor
 * reaches the last row: a pass over the rows starts with an advance and
 * takes at most P = ceil(row_ttl / 4) advances. Guarantee: a row last
 * touched at version T and not touched since is expired from version T +
 * row_ttl + 1 on, and gone by version T + row_ttl + 2P (about 1.5 row_ttl
 * after its last touch), as long as the slot capacity does not grow
 * meanwhile (a growth during a pass can make that pass up to P advances
 * longer). A row is never evicted for ttl before it is expired. Cost:
 * reading 8 * C / row_ttl slots' last touch (16 bytes apart) per advance. */
uint64_t ps_table_version(const ps_table *t);
void ps_table_advance(ps_table *t);

void ps_table_counts_get(const ps_table *t, ps_table_counts *out);

/* Removes key's row (not an eviction: no counter moves). Returns 1, or 0
 * when key has no row. */
int ps_table_remove(ps_table *t, uint64_t key);

/* Checkpoints: every live row in slot order (key, dim values, the
 * optimizer's state: adagrad dim floats, adam 2*dim floats, NULL for sgd,
 * its step count and last touch). fn returns nonzero to stop. */
typedef int (*ps_table_row_fn)(void *user, uint64_t key, const float *w, const float *s1,
                               const float *s2, uint32_t steps, uint64_t touched);
int ps_table_foreach(const ps_table *t, ps_table_row_fn fn, void *user);
/* Puts a row back as it was (checkpoint load); replaces one of that key.
 * s1, s2 may be NULL (the state a new row gets). Not subject to admission
 * but to the caps (it may evict). Returns 0, or -1 (no memory, or the
 * server's cap leaves it no row). */
int ps_table_put_row(ps_table *t, uint64_t key, const float *w, const float *s1, const float *s2,
                     uint32_t steps, uint64_t touched);
/* Sets the version (checkpoint load). */
void ps_table_set_version(ps_table *t, uint64_t v);

/* Checkpoints, in bulk: the table's arrays as they are (valid until the
 * table next changes), so that a copy is one memcpy per array. Rows are in
 * slots 0..rows-1: meta[2s] the key of slot s, meta[2s + 1] its last touch,
 * w[s*dim ..] its values, s[s*dim*nstate ..] its optimizer state (nstate
 * 0 sgd, 1 adagrad G, 2 adam m then v; NULL when 0), steps[s] its step
 * count. The pending keys of count/prob admission likewise: pend[2i] the
 * key, pend[2i + 1] the version of its last sighting, sightings[i] its
 * sightings so far. dirty: a bit per slot (bit s & 63 of dirty[s >> 6]), set
 * for a row created, stepped or put back since the last
 * ps_table_dirty_clear; it moves with its row (a row whose bit is clear
 * holds, under the same key, the values, state and step count it had at
 * that clear). */
typedef struct ps_table_view {
    uint64_t rows, npend;
    uint32_t dim, nstate;
    const float *w, *s;
    const uint64_t *meta;
    const uint32_t *steps;
    const uint64_t *pend;
    const uint32_t *sightings;
    const uint64_t *dirty;
} ps_table_view;
void ps_table_view_get(const ps_table *t, ps_table_view *v);
/* Rows whose dirty bit is set; clearing every bit (a full checkpoint). */
uint64_t ps_table_dirty_count(const ps_table *t);
void ps_table_dirty_clear(ps_table *t);

/* The rest of what makes a table's future: its version, the ttl sweep's
 * cursor, the draw counters of the sampled LRU and of the pending keys'
 * sampling, and the counters (rows and pending are ignored by set: they
 * are what the table holds). Restoring rows (put_row in slot order), the
 * pending keys (put_pending in order) and then this state makes a table
 * that evolves bit for bit as the saved one would have. */
typedef struct ps_table_state {
    uint64_t version, sweep, rng, pend_rng;
    ps_table_counts n;
} ps_table_state;
void ps_table_state_get(const ps_table *t, ps_table_state *st);
void ps_table_state_set(ps_table *t, const ps_table_state *st);
/* Puts a pending key back (checkpoint load): key not admitted yet, seen
 * `sightings` times, last at version `seen`; appended after those put
 * before. A key that has a row or is pending already is left alone.
 * Returns 0, or -1 (no memory). */
int ps_table_put_pending(ps_table *t, uint64_t key, uint64_t seen, uint32_t sightings);

/* A sparse sum: rows by key, in first-insertion order, for a sync step's
 * pushes (added in rank order, so the sum does not depend on arrival).
 * Hashed like a table's index; clear keeps the memory. */
typedef struct ps_rowsum ps_rowsum;
ps_rowsum *ps_rowsum_new(uint32_t dim);
void ps_rowsum_free(ps_rowsum *s);
/* Adds n rows (keys unique within the call). Returns 0 or -1 (no memory). */
int ps_rowsum_add(ps_rowsum *s, const uint64_t *keys, size_t n, const float *g);
/* The keys and sums so far (count rows, dim floats each, contiguous). */
size_t ps_rowsum_get(const ps_rowsum *s, const uint64_t **keys, const float **sums);
void ps_rowsum_clear(ps_rowsum *s);

#endif
