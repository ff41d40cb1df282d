/* checkpoint_format.c -- the on-disk format of a checkpoint: encoding and
 * checking its header, records and trailer, the file names, and listing a
 * directory's checkpoints. The byte layout is in checkpoint_format.h and
 * docs/checkpoint-format.md; the reader is checkpoint_read.c, the writer
 * checkpoint_write.c.
 */
#include "checkpoint_format.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gddr__ckpt_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void gddr__ckpt_free_sections(gddr_ckpt_section *s, size_t n)
{
    if (!s)
        return;
    for (size_t i = 0; i < n; i++)
        free(s[i].data);
    free(s);
}

/* ---- header, records, trailer -------------------------------------------- */

void gddr__ckpt_encode_header(uint8_t *hdr, uint64_t seq, uint64_t wall_ns, uint32_t nsect)
{
    memcpy(hdr, CKPT_MAGIC, 8);
    ckpt_put32(hdr + 8, CKPT_VERSION);
    ckpt_put32(hdr + 12, 0);
    ckpt_put64(hdr + 16, seq);
    ckpt_put64(hdr + 24, wall_ns);
    ckpt_put32(hdr + 32, nsect);
    ckpt_put32(hdr + 36, 0);
}

void gddr__ckpt_encode_record(uint8_t *rec, const char *name, uint64_t datalen)
{
    size_t nl = strlen(name);
    uint64_t rl = ckpt_record_len(nl);
    ckpt_put16(rec, (uint16_t)nl);
    memcpy(rec + 2, name, nl);
    memset(rec + 2 + nl, 0, (size_t)(rl - 8 - 2 - nl));
    ckpt_put64(rec + rl - 8, datalen);
}

void gddr__ckpt_encode_trailer(uint8_t *trl, uint64_t content)
{
    ckpt_put64(trl, content);
    ckpt_put32(trl + 8, 0);
    memcpy(trl + 12, CKPT_END_MAGIC, 4);
}

void gddr__ckpt_encode_crc(uint8_t *trl, uint32_t crc) { ckpt_put32(trl + 8, crc); }

int gddr__ckpt_decode_ends(const uint8_t *hdr, const uint8_t *trl, uint64_t size, uint64_t seq,
                           uint32_t *count, uint64_t *content, uint32_t *crc, char *why,
                           size_t whylen)
{
    if (memcmp(hdr, CKPT_MAGIC, 8) != 0) {
        gddr__ckpt_seterr(why, whylen, "bad magic");
        return 1;
    }
    uint32_t version = ckpt_get32(hdr + 8), flags = ckpt_get32(hdr + 12);
    if (version != CKPT_VERSION) {
        gddr__ckpt_seterr(why, whylen, "unknown format version %" PRIu32, version);
        return 1;
    }
    if (flags != 0) {
        gddr__ckpt_seterr(why, whylen, "unknown flags 0x%" PRIx32, flags);
        return 1;
    }
    if (memcmp(trl + 12, CKPT_END_MAGIC, 4) != 0) {
        gddr__ckpt_seterr(why, whylen, "bad trailer magic (truncated or not a checkpoint)");
        return 1;
    }
    uint64_t clen = ckpt_get64(trl);
    if (clen != size - CKPT_TRL_LEN) {
        gddr__ckpt_seterr(why, whylen,
                          "content length %" PRIu64 " does not match file size %" PRIu64, clen,
                          size);
        return 1;
    }
    uint64_t hseq = ckpt_get64(hdr + 16);
    if (hseq != seq) {
        gddr__ckpt_seterr(why, whylen,
                          "seq %" PRIu64 " in the header does not match the file name", hseq);
        return 1;
    }
    if (ckpt_get32(hdr + 36) != 0) {
        gddr__ckpt_seterr(why, whylen, "reserved header field not zero");
        return 1;
    }
    *count = ckpt_get32(hdr + 32);
    *content = clen;
    *crc = ckpt_get32(trl + 8);
    return 0;
}

static int cmp_name_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int gddr__ckpt_check_sections(const gddr_ckpt_section *s, size_t n, char *err, size_t errlen)
{
    if (n > UINT32_MAX) {
        gddr__ckpt_seterr(err, errlen, "checkpoint: too many sections (%zu)", n);
        return GDDR_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t nl = strnlen(s[i].name, sizeof s[i].name);
        if (nl == 0 || nl > CKPT_NAME_MAX) {
            gddr__ckpt_seterr(err, errlen,
                              "checkpoint: section %zu: name empty or not NUL-terminated", i);
            return GDDR_EINVAL;
        }
        if (!s[i].data && s[i].len) {
            gddr__ckpt_seterr(err, errlen, "checkpoint: section %s: NULL data", s[i].name);
            return GDDR_EINVAL;
        }
    }
    if (n < 2)
        return GDDR_OK;
    const char **names = malloc(n * sizeof *names);
    if (!names) {
        gddr__ckpt_seterr(err, errlen, "checkpoint: out of memory");
        return GDDR_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        names[i] = s[i].name;
    qsort(names, n, sizeof *names, cmp_name_ptr);
    int rc = GDDR_OK;
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            gddr__ckpt_seterr(err, errlen, "checkpoint: duplicate section name %s", names[i]);
            rc = GDDR_EINVAL;
            break;
        }
    free(names);
    return rc;
}

/* ---- file names and directories ------------------------------------------- */

/* "ckpt-" + 20 digits + ".gddr" (+ ".tmp" when tmp). */
int gddr__ckpt_parse_name(const char *name, int tmp, uint64_t *seq)
{
    size_t len = strlen(name);
    if (len != (tmp ? 34u : 30u) || strncmp(name, "ckpt-", 5) != 0 ||
        strncmp(name + 25, tmp ? ".gddr.tmp" : ".gddr", tmp ? 10 : 6) != 0)
        return 0;
    uint64_t v = 0;
    for (int i = 5; i < 25; i++) {
        char ch = name[i];
        if (ch < '0' || ch > '9')
            return 0;
        unsigned d = (unsigned)(ch - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *seq = v;
    return 1;
}

int gddr__ckpt_path(char *buf, size_t len, const char *dir, uint64_t seq, int tmp)
{
    int k = snprintf(buf, len, "%s/ckpt-%020" PRIu64 ".gddr%s", dir, seq, tmp ? ".tmp" : "");
    return k > 0 && (size_t)k < len;
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* All checkpoint seqs in dir, newest first. *exists = 0 (and GDDR_OK) when
 * dir is missing. */
int gddr__ckpt_scan_dir(const char *dir, uint64_t **out, size_t *count, int *exists, char *err,
                        size_t errlen)
{
    *out = NULL;
    *count = 0;
    if (exists)
        *exists = 1;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT || errno == ENOTDIR) {
            if (exists)
                *exists = 0;
            return GDDR_OK;
        }
        gddr__ckpt_seterr(err, errlen, "opendir %s: %s", dir, strerror(errno));
        return GDDR_EIO;
    }
    uint64_t *v = NULL;
    size_t n = 0, cap = 0;
    int rc = GDDR_OK;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) {
                gddr__ckpt_seterr(err, errlen, "readdir %s: %s", dir, strerror(errno));
                rc = GDDR_EIO;
            }
            break;
        }
        uint64_t seq;
        if (!gddr__ckpt_parse_name(e->d_name, 0, &seq))
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            uint64_t *nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                gddr__ckpt_seterr(err, errlen, "listing %s: out of memory", dir);
                rc = GDDR_ENOMEM;
                break;
            }
            v = nv;
            cap = ncap;
        }
        v[n++] = seq;
    }
    closedir(d);
    if (rc != GDDR_OK) {
        free(v);
        return rc;
    }
    if (n)
        qsort(v, n, sizeof *v, cmp_desc);
    *out = v;
    *count = n;
    return GDDR_OK;
}

int gddr__ckpt_list(const char *dir, uint64_t *seqs, size_t max, size_t *count)
{
    if (!dir || !count || (max && !seqs))
        return GDDR_EINVAL;
    uint64_t *v;
    size_t n;
    int rc = gddr__ckpt_scan_dir(dir, &v, &n, NULL, NULL, 0);
    if (rc != GDDR_OK)
        return rc;
    for (size_t i = 0; i < n && i < max; i++)
        seqs[i] = v[i];
    *count = n;
    free(v);
    return GDDR_OK;
}
