/* view.h -- the payload of a lazy or delta pull reply, both ends of it.
 *
 * A worker that pulls lazily (Pull.delay_fraction) or in deltas
 * (Pull.delta_bits) keeps a view of each tensor; the server keeps what it
 * knows of that view and answers with only the chunks the view lacks,
 * named by a chunk bitmap (docs/protocol.md, PullReply). The payload holds,
 * for the chunks the bitmap selects, in chunk order:
 *
 *   bits 0     their values, float32;
 *   bits 8/16  first one float32 scale s per selected chunk, then per
 *              chunk its differences q from the view, int8 or int16, with
 *              view += q * s (float32, a product then a sum).
 *
 * The server (server/conn.c) encodes with gddr__view_pack, the client
 * (client/src/conn_reply.c) decodes with gddr__view_apply; the server's copy of
 * the view (its "mirror") is updated by the very arithmetic the client
 * does, so the two stay equal bit for bit (tests/check_view.c).
 */
#ifndef GDDR_COMMON_VIEW_H
#define GDDR_COMMON_VIEW_H

#include <stddef.h>
#include <stdint.h>

/* Largest |w - m| over len values (inf when a difference overflows). */
float gddr__view_delta_amax(const float *w, const float *m, size_t len);

/* The scale of a chunk whose largest difference is amax. */
static inline float gddr__view_delta_scale(float amax, int bits)
{
    return amax / (bits == 8 ? 127.0f : 32767.0f);
}

/* Encodes the chunks bm selects of w (n values in chunks of `chunk`) into
 * out, which must hold gddr__view_payload_bytes(). bits 8/16: each chunk's
 * scale comes from its largest difference from mirror (the worker's view as
 * the server knows it) and goes to scale[ch] too when scale is not NULL;
 * mirror advances as the worker's view will; inexact[ch] says whether it
 * still differs from w. bits 0: the values; mirror and inexact, when not
 * NULL, become w and 0 for those chunks. Returns the payload's bytes, or
 * SIZE_MAX when a difference overflows float (bits 8/16): the chunks
 * encoded before it have moved their mirror, so the caller packs the reply
 * again with bits 0, which sets every selected chunk's mirror to w. */
size_t gddr__view_pack(const float *w, size_t n, size_t chunk, const uint8_t *bm, int bits,
                       float *scale, float *mirror, uint8_t *inexact, uint8_t *out);

/* The bytes of a payload for bitmap bm (n values in chunks of `chunk`);
 * *nsel (may be NULL) gets the chunks it selects. */
size_t gddr__view_payload_bytes(size_t n, size_t chunk, const uint8_t *bm, int bits, size_t *nsel);

/* Checks a reply's layout: bits 0, 8 or 16, a bitmap of exactly the
 * tensor's chunks (no bit past the last) and a payload of exactly the
 * bytes it selects. Returns 0, or -1. */
int gddr__view_check(size_t n, size_t chunk, const uint8_t *bm, size_t bmlen, int bits, size_t bytes);

/* Applies a checked payload to the view (n values) and, when out is not
 * NULL, writes the whole new view to out in the same pass (each chunk the
 * reply changed is decoded straight into both; the others are copied). */
void gddr__view_apply(float *view, float *out, size_t n, size_t chunk, const uint8_t *bm, int bits,
                      const uint8_t *payload);

#endif
