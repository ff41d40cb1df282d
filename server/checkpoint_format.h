/* checkpoint_format.h -- the on-disk format of a checkpoint, shared by its
 * reader (checkpoint_read.c) and its writer (checkpoint_write.c); private
 * to those files. The byte layout is in docs/checkpoint-format.md:
 *
 *   header   40 bytes: "GDDRCKPT", u32 version, u32 flags, u64 seq,
 *            u64 wall-clock ns, u32 section count, u32 reserved
 *   records  per section: u16 name length, the name, zero pad to 8,
 *            u64 data length; then the data, zero pad to 8
 *   trailer  16 bytes: u64 content length, u32 CRC32C of the content,
 *            "KPTE"
 *
 * Every integer is little-endian. The CRC covers everything before the
 * trailer. */
#ifndef GDDR_SERVER_CHECKPOINT_FORMAT_H
#define GDDR_SERVER_CHECKPOINT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"

#define CKPT_MAGIC "GDDRCKPT"
#define CKPT_END_MAGIC "KPTE"
#define CKPT_VERSION 1u
#define CKPT_HDR_LEN 40u
#define CKPT_TRL_LEN 16u
#define CKPT_NAME_MAX 63u

static inline uint64_t ckpt_align8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

static inline void ckpt_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void ckpt_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void ckpt_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t ckpt_get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t ckpt_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t ckpt_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Bytes of a section's record (length, name, pad, data length), without
 * its data. */
static inline uint64_t ckpt_record_len(size_t namelen) { return ckpt_align8(2 + namelen) + 8; }

/* Writes the header of checkpoint seq with nsect sections, stamped
 * wall_ns, into hdr[CKPT_HDR_LEN]. */
void gddr__ckpt_encode_header(uint8_t *hdr, uint64_t seq, uint64_t wall_ns, uint32_t nsect);
/* Writes a section's record into rec[ckpt_record_len(strlen(name))]. */
void gddr__ckpt_encode_record(uint8_t *rec, const char *name, uint64_t datalen);
/* Writes the trailer into trl[CKPT_TRL_LEN], all but the CRC, which goes
 * into trl + 8 once the content is hashed (gddr__ckpt_encode_crc). */
void gddr__ckpt_encode_trailer(uint8_t *trl, uint64_t content);
void gddr__ckpt_encode_crc(uint8_t *trl, uint32_t crc);

/* Checks a file's header and trailer against each other, the file's size
 * and the seq its name says. 0 and *count (sections), *content (bytes the
 * CRC covers) and *crc (the stored CRC) set; or 1 with why filled: not a
 * valid checkpoint. */
int gddr__ckpt_decode_ends(const uint8_t *hdr, const uint8_t *trl, uint64_t size, uint64_t seq,
                           uint32_t *count, uint64_t *content, uint32_t *crc, char *why,
                           size_t whylen);

/* Sections fit to write: names 1..CKPT_NAME_MAX bytes and unique, data
 * present. GDDR_OK, or GDDR_EINVAL/ENOMEM with err filled. */
int gddr__ckpt_check_sections(const gddr_ckpt_section *s, size_t n, char *err, size_t errlen);

/* File names: "ckpt-" + 20 digits + ".gddr" (+ ".tmp" when tmp). */
int gddr__ckpt_parse_name(const char *name, int tmp, uint64_t *seq);
/* The path of checkpoint seq in dir; 0 when it does not fit len. */
int gddr__ckpt_path(char *buf, size_t len, const char *dir, uint64_t seq, int tmp);
/* All checkpoint seqs in dir, newest first (*out malloc'd). *exists = 0
 * (and GDDR_OK) when dir is missing. */
int gddr__ckpt_scan_dir(const char *dir, uint64_t **out, size_t *count, int *exists, char *err,
                        size_t errlen);

/* Frees s[0..n) and every s[i].data; s may be NULL. */
void gddr__ckpt_free_sections(gddr_ckpt_section *s, size_t n);
/* snprintf into err unless err is NULL or errlen 0. */
void gddr__ckpt_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
