/* checkpoint.c -- see checkpoint.h and docs/checkpoint-format.md.
 *
 * Writing: the file is described as a list of pieces (header, per-section
 * record, the caller's data, zero padding, trailer) that is never copied
 * into one buffer; it is cut into blocks of up to 1 MiB, each block becomes
 * one IORING_OP_WRITEV over the caller's memory, and up to 16 are in flight.
 * The CRC32C of a block is computed just before it is submitted, so hashing
 * overlaps the I/O of the blocks before it; the trailer (which holds the CRC)
 * is the last piece. Then IORING_OP_FSYNC, rename(), fsync(dir).
 *
 * Reading: one sequential pass with pread() through a 1 MiB buffer (large
 * section data is read straight into its own malloc'd buffer), checking each
 * length against the end of the content before trusting it, and the CRC at
 * the end.
 */
#define _GNU_SOURCE
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "log.h"

#define ckpt_log gddr_log

/* ---- format constants (docs/checkpoint-format.md) ------------------------ */
#define CKPT_MAGIC "GDDRCKPT"
#define CKPT_END_MAGIC "KPTE"
#define CKPT_VERSION 1u
#define CKPT_HDR_LEN 40u
#define CKPT_TRL_LEN 16u
#define CKPT_NAME_MAX 63u

/* ---- I/O tuning ---------------------------------------------------------- */
#define CKPT_QD 16                  /* writes in flight */
#define CKPT_BLOCK (1u << 20)       /* bytes per write */
#define CKPT_MAX_IOV 64             /* pieces per write */
#define CKPT_RDBUF (1u << 20)

int gddr__ckpt_test_flags = 0;

/* ======================================================================== */
/* helpers                                                                  */
/* ======================================================================== */

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t align8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* "ckpt-" + 20 digits + ".gddr" (+ ".tmp" when tmp). */
static int parse_name(const char *name, int tmp, uint64_t *seq)
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

static int ckpt_path(char *buf, size_t len, const char *dir, uint64_t seq, int tmp)
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
static int scan_dir(const char *dir, uint64_t **out, size_t *count, int *exists, char *err,
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
        seterr(err, errlen, "opendir %s: %s", dir, strerror(errno));
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
                seterr(err, errlen, "readdir %s: %s", dir, strerror(errno));
                rc = GDDR_EIO;
            }
            break;
        }
        uint64_t seq;
        if (!parse_name(e->d_name, 0, &seq))
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            uint64_t *nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                seterr(err, errlen, "listing %s: out of memory", dir);
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
    int rc = scan_dir(dir, &v, &n, NULL, NULL, 0);
    if (rc != GDDR_OK)
        return rc;
    for (size_t i = 0; i < n && i < max; i++)
        seqs[i] = v[i];
    *count = n;
    free(v);
    return GDDR_OK;
}

/* ======================================================================== */
/* writing                                                                  */
/* ======================================================================== */

typedef struct piece {
    const uint8_t *p;
    uint64_t len;
    int trailer; /* the trailer: CRC goes in before it is written, not hashed */
} piece;

typedef struct wctx {
    const piece *pc;
    size_t npc, pi;
    uint64_t po;      /* offset inside pc[pi] */
    uint64_t fileoff; /* file offset of the next block */
    uint32_t crc;
    uint8_t *trailer; /* 16 bytes inside meta */
    double hash_ms;
} wctx;

typedef struct wreq {
    struct iovec iov[CKPT_MAX_IOV];
    int niov;
    uint64_t off;
    size_t len;
    int used;
} wreq;

static int wctx_done(const wctx *c)
{
    size_t pi = c->pi;
    uint64_t po = c->po;
    while (pi < c->npc && po >= c->pc[pi].len) {
        pi++;
        po = 0;
    }
    return pi >= c->npc;
}

/* Fills r with the next block (up to CKPT_BLOCK bytes, CKPT_MAX_IOV pieces),
 * hashing what it takes. */
static void next_block(wctx *c, wreq *r)
{
    r->niov = 0;
    r->len = 0;
    r->off = c->fileoff;
    while (r->niov < CKPT_MAX_IOV && r->len < CKPT_BLOCK && c->pi < c->npc) {
        const piece *p = &c->pc[c->pi];
        if (c->po >= p->len) {
            c->pi++;
            c->po = 0;
            continue;
        }
        uint64_t take = p->len - c->po;
        if (take > CKPT_BLOCK - r->len)
            take = CKPT_BLOCK - r->len;
        const uint8_t *src = p->p + c->po;
        if (p->trailer) {
            if (c->po == 0)
                put32(c->trailer + 8, c->crc);
        } else {
            double t0 = now_ms();
            c->crc = gddr__crc32c(c->crc, src, (size_t)take);
            c->hash_ms += now_ms() - t0;
        }
        r->iov[r->niov].iov_base = (void *)src;
        r->iov[r->niov].iov_len = (size_t)take;
        r->niov++;
        r->len += (size_t)take;
        c->po += take;
    }
    c->fileoff += r->len;
}

/* Drops the first `done` bytes of r (after a short write). */
static void advance_req(wreq *r, size_t done)
{
    r->off += done;
    r->len -= done;
    int i = 0;
    while (i < r->niov && done >= r->iov[i].iov_len) {
        done -= r->iov[i].iov_len;
        i++;
    }
    if (i < r->niov) {
        r->iov[i].iov_base = (uint8_t *)r->iov[i].iov_base + done;
        r->iov[i].iov_len -= done;
    }
    memmove(r->iov, r->iov + i, (size_t)(r->niov - i) * sizeof r->iov[0]);
    r->niov -= i;
}

static atomic_int uring_warned;

/* Writes everything with io_uring, then fsyncs. Returns 0, -errno on an I/O
 * error (what says which step), or 1 when io_uring cannot be set up (the
 * caller falls back; nothing has been written). */
static int write_uring(int fd, wctx *c, wreq *reqs, const char **what, double *t_write,
                       double *t_fsync)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(CKPT_QD * 2, &ring, 0);
    if (rc < 0) {
        if (!atomic_exchange(&uring_warned, 1))
            ckpt_log(GDDR_LOG_WARN, "checkpoint: io_uring unavailable (%s); using pwritev",
                     strerror(-rc));
        return 1;
    }
    double t0 = now_ms();
    int inflight = 0, queued = 0, fail = 0;
    *what = "write";
    for (;;) {
        while (!fail && inflight + queued < CKPT_QD && !wctx_done(c)) {
            int slot = 0;
            while (reqs[slot].used)
                slot++;
            wreq *r = &reqs[slot];
            next_block(c, r);
            if (r->len == 0)
                break;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe)
                break; /* cannot happen: ring has 2*QD entries */
            r->used = 1;
            io_uring_prep_writev(sqe, fd, r->iov, (unsigned)r->niov, r->off);
            io_uring_sqe_set_data64(sqe, (uint64_t)slot);
            queued++;
        }
        if (queued) {
            int k = io_uring_submit(&ring);
            if (k >= 0) {
                inflight += k;
                queued -= k;
            } else if (k != -EINTR && k != -EAGAIN && k != -EBUSY) {
                if (!fail)
                    fail = k;
                queued = 0; /* never submitted; dropped with the ring */
            }
        }
        if (inflight == 0) {
            if (queued && !fail)
                continue;
            break;
        }
        struct io_uring_cqe *cqe;
        int w = io_uring_wait_cqe(&ring, &cqe);
        if (w == -EINTR)
            continue;
        if (w < 0) {
            /* Should not happen; bail out without touching the requests. */
            if (!fail)
                fail = w;
            break;
        }
        int slot = (int)io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        wreq *r = &reqs[slot];
        inflight--;
        if (res < 0) {
            if (!fail)
                fail = res;
            r->used = 0;
        } else if ((size_t)res < r->len && !fail) {
            if (res == 0) {
                fail = -EIO;
                r->used = 0;
                continue;
            }
            advance_req(r, (size_t)res);
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe) {
                fail = -EBUSY;
                r->used = 0;
                continue;
            }
            io_uring_prep_writev(sqe, fd, r->iov, (unsigned)r->niov, r->off);
            io_uring_sqe_set_data64(sqe, (uint64_t)slot);
            queued++;
        } else {
            r->used = 0;
        }
    }
    *t_write = now_ms() - t0;
    if (fail) {
        io_uring_queue_exit(&ring);
        return fail;
    }
    double t1 = now_ms();
    *what = "fsync";
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_fsync(sqe, fd, 0);
    io_uring_sqe_set_data64(sqe, 0);
    rc = io_uring_submit(&ring);
    if (rc >= 0) {
        struct io_uring_cqe *cqe;
        do
            rc = io_uring_wait_cqe(&ring, &cqe);
        while (rc == -EINTR);
        if (rc == 0) {
            rc = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
        }
    }
    *t_fsync = now_ms() - t1;
    io_uring_queue_exit(&ring);
    return rc < 0 ? rc : 0;
}

static int write_sync(int fd, wctx *c, wreq *r, const char **what, double *t_write,
                      double *t_fsync)
{
    double t0 = now_ms();
    *what = "write";
    while (!wctx_done(c)) {
        next_block(c, r);
        while (r->len) {
            ssize_t k = pwritev(fd, r->iov, r->niov, (off_t)r->off);
            if (k < 0) {
                if (errno == EINTR)
                    continue;
                *t_write = now_ms() - t0;
                return -errno;
            }
            if (k == 0) {
                *t_write = now_ms() - t0;
                return -EIO;
            }
            advance_req(r, (size_t)k);
        }
    }
    *t_write = now_ms() - t0;
    double t1 = now_ms();
    *what = "fsync";
    int rc = fsync(fd) ? -errno : 0;
    *t_fsync = now_ms() - t1;
    return rc;
}

static int cmp_name_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_sections(const gddr_ckpt_section *s, size_t n, char *err, size_t errlen)
{
    if (n > UINT32_MAX) {
        seterr(err, errlen, "checkpoint: too many sections (%zu)", n);
        return GDDR_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t nl = strnlen(s[i].name, sizeof s[i].name);
        if (nl == 0 || nl > CKPT_NAME_MAX) {
            seterr(err, errlen, "checkpoint: section %zu: name empty or not NUL-terminated", i);
            return GDDR_EINVAL;
        }
        if (!s[i].data && s[i].len) {
            seterr(err, errlen, "checkpoint: section %s: NULL data", s[i].name);
            return GDDR_EINVAL;
        }
    }
    if (n < 2)
        return GDDR_OK;
    const char **names = malloc(n * sizeof *names);
    if (!names) {
        seterr(err, errlen, "checkpoint: out of memory");
        return GDDR_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        names[i] = s[i].name;
    qsort(names, n, sizeof *names, cmp_name_ptr);
    int rc = GDDR_OK;
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            seterr(err, errlen, "checkpoint: duplicate section name %s", names[i]);
            rc = GDDR_EINVAL;
            break;
        }
    free(names);
    return rc;
}

static void retain(const char *dir, uint64_t written, int keep)
{
    if (keep <= 0)
        return;
    uint64_t *v;
    size_t n;
    char err[256];
    if (scan_dir(dir, &v, &n, NULL, err, sizeof err) != GDDR_OK) {
        ckpt_log(GDDR_LOG_WARN, "checkpoint: cannot delete old checkpoints: %s", err);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (i < (size_t)keep)
            continue;
        if (v[i] == written) {
            ckpt_log(GDDR_LOG_WARN,
                     "checkpoint %" PRIu64 " is older than %d others in %s; kept anyway",
                     written, keep, dir);
            continue;
        }
        char path[4096];
        if (!ckpt_path(path, sizeof path, dir, v[i], 0))
            continue;
        if (unlink(path) != 0 && errno != ENOENT)
            ckpt_log(GDDR_LOG_WARN, "checkpoint: unlink %s: %s", path, strerror(errno));
    }
    free(v);
}

int gddr__ckpt_write(const char *dir, uint64_t seq, const gddr_ckpt_section *s, size_t n,
                     int keep, gddr_ckpt_stats *st, char *err, size_t errlen)
{
    double t_start = now_ms();
    if (st)
        memset(st, 0, sizeof *st);
    if (err && errlen)
        err[0] = '\0';
    if (!dir || (n && !s)) {
        seterr(err, errlen, "checkpoint: invalid argument");
        return GDDR_EINVAL;
    }
    int rc = check_sections(s, n, err, errlen);
    if (rc != GDDR_OK)
        return rc;
    char path[4096], tmp[4096];
    if (!ckpt_path(path, sizeof path, dir, seq, 0) || !ckpt_path(tmp, sizeof tmp, dir, seq, 1)) {
        seterr(err, errlen, "checkpoint: path too long: %s", dir);
        return GDDR_EINVAL;
    }

    /* Layout: metadata (header, per-section records, trailer) in one buffer. */
    double t_enc = now_ms();
    uint64_t metalen = CKPT_HDR_LEN + CKPT_TRL_LEN;
    for (size_t i = 0; i < n; i++)
        metalen += align8(2 + strlen(s[i].name)) + 8;
    uint8_t *meta = calloc(1, metalen);
    piece *pc = malloc((3 * n + 2) * sizeof *pc);
    wreq *reqs = calloc(CKPT_QD, sizeof *reqs);
    if (!meta || !pc || !reqs) {
        free(meta);
        free(pc);
        free(reqs);
        seterr(err, errlen, "checkpoint: out of memory");
        return GDDR_ENOMEM;
    }
    static const uint8_t zeros[8];
    size_t npc = 0;
    uint64_t mo = 0, content = 0;
    memcpy(meta, CKPT_MAGIC, 8);
    put32(meta + 8, CKPT_VERSION);
    put32(meta + 12, 0);
    put64(meta + 16, seq);
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    put64(meta + 24, (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec);
    put32(meta + 32, (uint32_t)n);
    put32(meta + 36, 0);
    pc[npc++] = (piece){ meta, CKPT_HDR_LEN, 0 };
    mo = content = CKPT_HDR_LEN;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(s[i].name);
        uint64_t rl = align8(2 + nl) + 8;
        put16(meta + mo, (uint16_t)nl);
        memcpy(meta + mo + 2, s[i].name, nl);
        put64(meta + mo + rl - 8, s[i].len);
        pc[npc++] = (piece){ meta + mo, rl, 0 };
        mo += rl;
        pc[npc++] = (piece){ (const uint8_t *)s[i].data, s[i].len, 0 };
        uint64_t pad = align8(s[i].len) - s[i].len;
        pc[npc++] = (piece){ zeros, pad, 0 };
        content += rl + s[i].len + pad;
    }
    uint8_t *trl = meta + mo;
    put64(trl, content);
    memcpy(trl + 12, CKPT_END_MAGIC, 4);
    pc[npc++] = (piece){ trl, CKPT_TRL_LEN, 1 };
    uint64_t total = content + CKPT_TRL_LEN;
    double enc_ms = now_ms() - t_enc;

    wctx c = { .pc = pc, .npc = npc, .trailer = trl };
    const char *what = "open";
    double t_write = 0, t_fsync = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        seterr(err, errlen, "open %s: %s", tmp, strerror(errno));
        rc = GDDR_EIO;
        goto out;
    }
    /* Reserve the space first: a full disk fails here, not after gigabytes. */
    int fr = 0;
    if (!(gddr__ckpt_test_flags & GDDR_CKPT_TEST_NO_FALLOCATE) &&
        fallocate(fd, 0, 0, (off_t)total) != 0)
        fr = errno; /* EOPNOTSUPP and the like: go on without */
    if (fr == ENOSPC || fr == EFBIG || fr == EDQUOT || fr == EIO) {
        seterr(err, errlen, "allocate %" PRIu64 " bytes for %s: %s", total, tmp, strerror(fr));
        rc = GDDR_EIO;
        goto out_unlink;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int wr = 1;
    if (!(gddr__ckpt_test_flags & GDDR_CKPT_TEST_NO_URING))
        wr = write_uring(fd, &c, reqs, &what, &t_write, &t_fsync);
    if (wr == 1) {
        memset(reqs, 0, sizeof *reqs);
        wr = write_sync(fd, &c, reqs, &what, &t_write, &t_fsync);
    }
    if (wr < 0) {
        seterr(err, errlen, "%s %s: %s", what, tmp, strerror(-wr));
        rc = GDDR_EIO;
        goto out_unlink;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        seterr(err, errlen, "close %s: %s", tmp, strerror(errno));
        rc = GDDR_EIO;
        goto out_unlink;
    }
    if (rename(tmp, path) != 0) {
        seterr(err, errlen, "rename %s: %s", tmp, strerror(errno));
        rc = GDDR_EIO;
        goto out_unlink;
    }
    double t_dir = now_ms();
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        seterr(err, errlen, "fsync directory %s: %s", dir, strerror(errno));
        rc = GDDR_EIO;
    }
    if (dfd >= 0)
        close(dfd);
    t_fsync += now_ms() - t_dir;
    if (rc == GDDR_OK)
        retain(dir, seq, keep);
    goto out;

out_unlink:
    if (fd >= 0) {
        close(fd);
        fd = -1;
    }
    unlink(tmp);
out:
    if (fd >= 0)
        close(fd);
    free(meta);
    free(pc);
    free(reqs);
    if (st) {
        st->copy_ms = enc_ms + c.hash_ms;
        st->write_ms = t_write;
        st->fsync_ms = t_fsync;
        st->total_ms = now_ms() - t_start;
        st->bytes = rc == GDDR_OK ? total : 0;
    }
    return rc;
}

/* ======================================================================== */
/* reading                                                                  */
/* ======================================================================== */

typedef struct rdr {
    int fd;
    uint64_t pos;     /* content bytes consumed */
    uint64_t filepos; /* bytes read from the file */
    uint64_t end;     /* content length: bytes covered by the CRC */
    uint8_t *buf;
    size_t blen, boff;
    uint32_t crc;
} rdr;

/* Reads exactly n bytes at off. 0, -errno, or 1 for a short read. */
static int pread_full(int fd, void *dst, size_t n, uint64_t off)
{
    uint8_t *p = dst;
    while (n) {
        size_t want = n > (1u << 30) ? (1u << 30) : n;
        ssize_t k = pread(fd, p, want, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (k == 0)
            return 1;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* Consumes n content bytes into dst (the caller checked pos + n <= end). */
static int rd(rdr *r, void *dst, uint64_t n)
{
    uint8_t *d = dst;
    while (n) {
        if (r->boff < r->blen) {
            size_t take = r->blen - r->boff;
            if (take > n)
                take = (size_t)n;
            memcpy(d, r->buf + r->boff, take);
            r->boff += take;
            d += take;
            n -= take;
            r->pos += take;
            continue;
        }
        if (n >= CKPT_RDBUF) {
            int k = pread_full(r->fd, d, (size_t)n, r->filepos);
            if (k)
                return k;
            r->crc = gddr__crc32c(r->crc, d, (size_t)n);
            r->filepos += n;
            r->pos += n;
            return 0;
        }
        uint64_t want = r->end - r->filepos;
        if (want == 0)
            return 1; /* callers check bounds first; never spin */
        if (want > CKPT_RDBUF)
            want = CKPT_RDBUF;
        int k = pread_full(r->fd, r->buf, (size_t)want, r->filepos);
        if (k)
            return k;
        r->crc = gddr__crc32c(r->crc, r->buf, (size_t)want);
        r->filepos += want;
        r->blen = (size_t)want;
        r->boff = 0;
    }
    return 0;
}

static void free_sections(gddr_ckpt_section *s, size_t n)
{
    if (!s)
        return;
    for (size_t i = 0; i < n; i++)
        free(s[i].data);
    free(s);
}

/* Loads one file. GDDR_OK; 1 = invalid (why says so); GDDR_EIO/ENOMEM (err). */
static int load_file(const char *path, uint64_t seq, gddr_ckpt *out, char *why, size_t whylen,
                     char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            seterr(why, whylen, "removed while loading");
            return 1;
        }
        seterr(err, errlen, "open %s: %s", path, strerror(errno));
        return GDDR_EIO;
    }
    rdr r = { .fd = fd };
    gddr_ckpt_section *s = NULL;
    size_t n = 0, cap = 0;
    int rc = 1;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        seterr(err, errlen, "stat %s: %s", path, strerror(errno));
        rc = GDDR_EIO;
        goto done;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (!S_ISREG(sb.st_mode)) {
        seterr(why, whylen, "not a regular file");
        goto done;
    }
    if (size < CKPT_HDR_LEN + CKPT_TRL_LEN) {
        seterr(why, whylen, "short file (%" PRIu64 " bytes)", size);
        goto done;
    }
    uint8_t hdr[CKPT_HDR_LEN], trl[CKPT_TRL_LEN];
    int k = pread_full(fd, trl, CKPT_TRL_LEN, size - CKPT_TRL_LEN);
    if (k == 0)
        k = pread_full(fd, hdr, CKPT_HDR_LEN, 0);
    if (k < 0) {
        seterr(err, errlen, "read %s: %s", path, strerror(-k));
        rc = GDDR_EIO;
        goto done;
    }
    if (k > 0) {
        seterr(why, whylen, "file shrank while loading");
        goto done;
    }
    if (memcmp(hdr, CKPT_MAGIC, 8) != 0) {
        seterr(why, whylen, "bad magic");
        goto done;
    }
    uint32_t version = get32(hdr + 8), flags = get32(hdr + 12);
    if (version != CKPT_VERSION) {
        seterr(why, whylen, "unknown format version %" PRIu32, version);
        goto done;
    }
    if (flags != 0) {
        seterr(why, whylen, "unknown flags 0x%" PRIx32, flags);
        goto done;
    }
    if (memcmp(trl + 12, CKPT_END_MAGIC, 4) != 0) {
        seterr(why, whylen, "bad trailer magic (truncated or not a checkpoint)");
        goto done;
    }
    uint64_t content = get64(trl);
    if (content != size - CKPT_TRL_LEN) {
        seterr(why, whylen, "content length %" PRIu64 " does not match file size %" PRIu64,
               content, size);
        goto done;
    }
    uint64_t hseq = get64(hdr + 16);
    if (hseq != seq) {
        seterr(why, whylen, "seq %" PRIu64 " in the header does not match the file name", hseq);
        goto done;
    }
    uint32_t count = get32(hdr + 32);
    if (get32(hdr + 36) != 0) {
        seterr(why, whylen, "reserved header field not zero");
        goto done;
    }
    r.end = content;
    r.buf = malloc(CKPT_RDBUF);
    if (!r.buf) {
        seterr(err, errlen, "loading %s: out of memory", path);
        rc = GDDR_ENOMEM;
        goto done;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint8_t tmp[CKPT_HDR_LEN];
    if ((k = rd(&r, tmp, CKPT_HDR_LEN)) != 0)
        goto rderr;
    for (uint32_t i = 0; i < count; i++) {
        uint8_t rec[2 + 80]; /* u16 name length, then at most 78: name, pad, u64 length */
        if (r.end - r.pos < 2) {
            seterr(why, whylen, "section %" PRIu32 " runs past the end", i);
            goto done;
        }
        if ((k = rd(&r, rec, 2)) != 0)
            goto rderr;
        uint16_t nl = get16(rec);
        if (nl == 0 || nl > CKPT_NAME_MAX) {
            seterr(why, whylen, "section %" PRIu32 " name length %u invalid", i, (unsigned)nl);
            goto done;
        }
        uint64_t rest = align8(2u + nl) - 2 + 8; /* name, pad, data length */
        if (r.end - r.pos < rest) {
            seterr(why, whylen, "section %" PRIu32 " runs past the end", i);
            goto done;
        }
        if ((k = rd(&r, rec + 2, rest)) != 0)
            goto rderr;
        if (memchr(rec + 2, '\0', nl)) {
            seterr(why, whylen, "section %" PRIu32 " name contains NUL", i);
            goto done;
        }
        uint64_t dlen = get64(rec + 2 + rest - 8);
        uint64_t left = r.end - r.pos;
        if (dlen > left || align8(dlen) > left) {
            seterr(why, whylen,
                   "section %" PRIu32 " length %" PRIu64 " runs past the end (%" PRIu64
                   " bytes left)",
                   i, dlen, left);
            goto done;
        }
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            gddr_ckpt_section *ns = realloc(s, ncap * sizeof *ns);
            if (!ns) {
                seterr(err, errlen, "loading %s: out of memory", path);
                rc = GDDR_ENOMEM;
                goto done;
            }
            s = ns;
            cap = ncap;
        }
        gddr_ckpt_section *sec = &s[n];
        memset(sec, 0, sizeof *sec);
        memcpy(sec->name, rec + 2, nl);
        sec->len = dlen;
        sec->data = malloc(dlen ? (size_t)dlen : 1);
        if (!sec->data) {
            seterr(err, errlen, "loading %s: out of memory for section %s (%" PRIu64 " bytes)",
                   path, sec->name, dlen);
            rc = GDDR_ENOMEM;
            goto done;
        }
        n++;
        if ((k = rd(&r, sec->data, dlen)) != 0)
            goto rderr;
        uint8_t pad[8];
        if ((k = rd(&r, pad, align8(dlen) - dlen)) != 0)
            goto rderr;
    }
    if (r.pos != r.end) {
        seterr(why, whylen, "%" PRIu64 " stray bytes after the last section", r.end - r.pos);
        goto done;
    }
    /* The buffered reader hashes whole buffers; account for what it read. */
    if (r.filepos != r.end) { /* cannot happen: pos == end and filepos <= end */
        seterr(why, whylen, "internal read accounting error");
        goto done;
    }
    uint32_t stored = get32(trl + 8);
    if (stored != r.crc) {
        seterr(why, whylen, "CRC mismatch (stored %08" PRIx32 ", computed %08" PRIx32 ")",
               stored, r.crc);
        goto done;
    }
    out->seq = seq;
    snprintf(out->path, sizeof out->path, "%s", path);
    out->n = n;
    out->s = s;
    s = NULL;
    n = 0;
    rc = GDDR_OK;
    goto done;

rderr:
    if (k < 0) {
        seterr(err, errlen, "read %s: %s", path, strerror(-k));
        rc = GDDR_EIO;
    } else {
        seterr(why, whylen, "file shrank while loading");
        rc = 1;
    }
done:
    free_sections(s, n);
    free(r.buf);
    close(fd);
    return rc;
}

int gddr__ckpt_load_newest(const char *dir, gddr_ckpt *out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out)
        return GDDR_EINVAL;
    memset(out, 0, sizeof *out);
    if (!dir) {
        seterr(err, errlen, "checkpoint: no directory");
        return GDDR_EINVAL;
    }
    uint64_t *v;
    size_t n;
    int rc = scan_dir(dir, &v, &n, NULL, err, errlen);
    if (rc != GDDR_OK)
        return rc;
    rc = 1;
    for (size_t i = 0; i < n; i++) {
        char path[4096], why[256] = "";
        if (!ckpt_path(path, sizeof path, dir, v[i], 0)) {
            seterr(err, errlen, "checkpoint: path too long: %s", dir);
            rc = GDDR_EINVAL;
            break;
        }
        int k = load_file(path, v[i], out, why, sizeof why, err, errlen);
        if (k == 1) {
            ckpt_log(GDDR_LOG_WARN, "checkpoint %s skipped: %s", path, why);
            continue;
        }
        rc = k;
        break;
    }
    free(v);
    if (rc != GDDR_OK)
        memset(out, 0, sizeof *out);
    return rc;
}

const gddr_ckpt_section *gddr__ckpt_find(const gddr_ckpt *c, const char *name)
{
    if (!c || !name)
        return NULL;
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->s[i].name, name) == 0)
            return &c->s[i];
    return NULL;
}

void gddr__ckpt_free(gddr_ckpt *c)
{
    if (!c)
        return;
    free_sections(c->s, c->n);
    memset(c, 0, sizeof *c);
}

/* ======================================================================== */
/* background writer                                                        */
/* ======================================================================== */

struct gddr_ckpt_writer {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    pthread_t th;
    char *dir;
    int keep;
    int stop;
    int busy;        /* a job submitted and not yet recorded */
    int have_job;    /* job fields below waiting for the thread */
    uint64_t job_seq;
    gddr_ckpt_section *job_s;
    size_t job_n;
    int last_rc;
    uint64_t last_seq;
    gddr_ckpt_stats last;
};

static void *writer_main(void *arg)
{
    gddr_ckpt_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->have_job && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->have_job)
            break; /* stopping and nothing left */
        uint64_t seq = w->job_seq;
        gddr_ckpt_section *s = w->job_s;
        size_t n = w->job_n;
        w->have_job = 0;
        w->job_s = NULL;
        pthread_mutex_unlock(&w->mu);

        gddr_ckpt_stats st;
        char err[512];
        int rc = gddr__ckpt_write(w->dir, seq, s, n, w->keep, &st, err, sizeof err);
        free_sections(s, n);
        if (rc == GDDR_OK)
            ckpt_log(GDDR_LOG_INFO,
                     "checkpoint %s/ckpt-%020" PRIu64 ".gddr written: %.1f MiB in %.1f ms "
                     "(write %.1f ms, fsync %.1f ms)",
                     w->dir, seq, (double)st.bytes / (1024.0 * 1024.0), st.total_ms,
                     st.write_ms, st.fsync_ms);
        else
            ckpt_log(GDDR_LOG_ERROR, "checkpoint %" PRIu64 " failed: %s", seq, err);

        pthread_mutex_lock(&w->mu);
        w->last_rc = rc;
        w->last_seq = seq;
        w->last = st;
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void remove_stale_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint64_t seq;
        if (!parse_name(e->d_name, 1, &seq))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            ckpt_log(GDDR_LOG_INFO, "checkpoint: removed stale temp file %s/%s", dir,
                     e->d_name);
    }
    closedir(d);
}

int gddr__ckpt_writer_start(const char *dir, int keep, gddr_ckpt_writer **out)
{
    if (!dir || !*dir || !out)
        return GDDR_EINVAL;
    *out = NULL;
    if (mkdir(dir, 0750) == 0)
        ckpt_log(GDDR_LOG_INFO, "checkpoint: created directory %s", dir);
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        ckpt_log(GDDR_LOG_ERROR, "checkpoint directory %s: %s", dir, strerror(errno));
        return GDDR_EIO;
    }
    if (!S_ISDIR(sb.st_mode)) {
        ckpt_log(GDDR_LOG_ERROR, "checkpoint directory %s: not a directory", dir);
        return GDDR_EIO;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        ckpt_log(GDDR_LOG_ERROR, "checkpoint directory %s: %s", dir, strerror(errno));
        return GDDR_EIO;
    }
    remove_stale_tmp(dir);

    gddr_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w)
        return GDDR_ENOMEM;
    w->dir = strdup(dir);
    w->keep = keep;
    if (!w->dir) {
        free(w);
        return GDDR_ENOMEM;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);

    /* The thread starts with every signal blocked, so SIGTERM and friends
     * go to the server's own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&w->th, NULL, writer_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        ckpt_log(GDDR_LOG_ERROR, "checkpoint: pthread_create: %s", strerror(rc));
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w->dir);
        free(w);
        return rc == ENOMEM || rc == EAGAIN ? GDDR_ENOMEM : GDDR_EIO;
    }
    pthread_setname_np(w->th, "gddr-ckpt");
    *out = w;
    return GDDR_OK;
}

int gddr__ckpt_writer_submit(gddr_ckpt_writer *w, uint64_t seq, gddr_ckpt_section *s, size_t n)
{
    if (!w || (n && !s))
        return GDDR_EINVAL;
    pthread_mutex_lock(&w->mu);
    int rc = GDDR_OK;
    if (w->stop)
        rc = GDDR_ESHUTDOWN;
    else if (w->busy)
        rc = GDDR_ESTATE;
    else {
        w->busy = 1;
        w->have_job = 1;
        w->job_seq = seq;
        w->job_s = s;
        w->job_n = n;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int gddr__ckpt_writer_busy(gddr_ckpt_writer *w)
{
    if (!w)
        return 0;
    pthread_mutex_lock(&w->mu);
    int b = w->busy;
    pthread_mutex_unlock(&w->mu);
    return b;
}

int gddr__ckpt_writer_wait(gddr_ckpt_writer *w, int timeout_ms, int *last_rc,
                           gddr_ckpt_stats *last, uint64_t *last_seq)
{
    if (!w)
        return GDDR_EINVAL;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&w->mu);
    int rc = GDDR_OK;
    while (w->busy) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&w->cv, &w->mu);
        } else if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT && w->busy) {
            rc = GDDR_ETIMEDOUT;
            break;
        }
    }
    if (rc == GDDR_OK) {
        if (last_rc)
            *last_rc = w->last_rc;
        if (last)
            *last = w->last;
        if (last_seq)
            *last_seq = w->last_seq;
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

void gddr__ckpt_writer_stop(gddr_ckpt_writer **pw)
{
    if (!pw || !*pw)
        return;
    gddr_ckpt_writer *w = *pw;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    free_sections(w->job_s, w->job_n); /* NULL: the thread takes every job */
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->dir);
    free(w);
    *pw = NULL;
}
