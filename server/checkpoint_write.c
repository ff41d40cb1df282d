/* checkpoint_write.c -- writing checkpoints (checkpoint.h): the io_uring
 * write path and the background writer thread.
 *
 * The file is described as a list of pieces (header, per-section record,
 * the caller's data, zero padding, trailer) that is never copied into one
 * buffer; it is cut into blocks of up to 1 MiB, each block becomes one
 * IORING_OP_WRITEV over the caller's memory, and up to 16 are in flight.
 * The CRC32C of a block is computed just before it is submitted, so hashing
 * overlaps the I/O of the blocks before it; the trailer (which holds the CRC)
 * is the last piece. Then IORING_OP_FSYNC, rename(), fsync(dir). The bytes
 * themselves are laid out by checkpoint_format.c.
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
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_format.h"
#include "crc32c.h"
#include "log.h"

/* ---- I/O tuning ---------------------------------------------------------- */
#define CKPT_QD 16                  /* writes in flight */
#define CKPT_BLOCK (1u << 20)       /* bytes per write */
#define CKPT_MAX_IOV 64             /* pieces per write */

int gddr__ckpt_test_flags = 0;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
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
                gddr__ckpt_encode_crc(c->trailer, c->crc);
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
            gddr_log(GDDR_LOG_WARN, "checkpoint: io_uring unavailable (%s); using pwritev",
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

static void retain(const char *dir, uint64_t written, int keep, const uint64_t *pin)
{
    if (keep <= 0)
        return;
    uint64_t *v;
    size_t n;
    char err[256];
    if (gddr__ckpt_scan_dir(dir, &v, &n, NULL, err, sizeof err) != GDDR_OK) {
        gddr_log(GDDR_LOG_WARN, "checkpoint: cannot delete old checkpoints: %s", err);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (i < (size_t)keep || (pin && v[i] && (v[i] == pin[0] || v[i] == pin[1])))
            continue;
        if (v[i] == written) {
            gddr_log(GDDR_LOG_WARN,
                     "checkpoint %" PRIu64 " is older than %d others in %s; kept anyway",
                     written, keep, dir);
            continue;
        }
        char path[4096];
        if (!gddr__ckpt_path(path, sizeof path, dir, v[i], 0))
            continue;
        if (unlink(path) != 0 && errno != ENOENT)
            gddr_log(GDDR_LOG_WARN, "checkpoint: unlink %s: %s", path, strerror(errno));
    }
    free(v);
}

/* gddr__ckpt_write, whose retention spares pin[0] and pin[1] (pin NULL: none). */
static int write_pinned(const char *dir, uint64_t seq, const gddr_ckpt_section *s, size_t n,
                        int keep, const uint64_t *pin, gddr_ckpt_stats *st, char *err,
                        size_t errlen)
{
    double t_start = now_ms();
    if (st)
        memset(st, 0, sizeof *st);
    if (err && errlen)
        err[0] = '\0';
    if (!dir || (n && !s)) {
        gddr__ckpt_seterr(err, errlen, "checkpoint: invalid argument");
        return GDDR_EINVAL;
    }
    int rc = gddr__ckpt_check_sections(s, n, err, errlen);
    if (rc != GDDR_OK)
        return rc;
    char path[4096], tmp[4096];
    if (!gddr__ckpt_path(path, sizeof path, dir, seq, 0) ||
        !gddr__ckpt_path(tmp, sizeof tmp, dir, seq, 1)) {
        gddr__ckpt_seterr(err, errlen, "checkpoint: path too long: %s", dir);
        return GDDR_EINVAL;
    }

    /* Layout: metadata (header, per-section records, trailer) in one buffer. */
    double t_enc = now_ms();
    uint64_t metalen = CKPT_HDR_LEN + CKPT_TRL_LEN;
    for (size_t i = 0; i < n; i++)
        metalen += ckpt_record_len(strlen(s[i].name));
    uint8_t *meta = calloc(1, metalen);
    piece *pc = malloc((3 * n + 2) * sizeof *pc);
    wreq *reqs = calloc(CKPT_QD, sizeof *reqs);
    if (!meta || !pc || !reqs) {
        free(meta);
        free(pc);
        free(reqs);
        gddr__ckpt_seterr(err, errlen, "checkpoint: out of memory");
        return GDDR_ENOMEM;
    }
    static const uint8_t zeros[8];
    size_t npc = 0;
    uint64_t mo = 0, content = 0;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    gddr__ckpt_encode_header(meta, seq, (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec,
                             (uint32_t)n);
    pc[npc++] = (piece){ meta, CKPT_HDR_LEN, 0 };
    mo = content = CKPT_HDR_LEN;
    for (size_t i = 0; i < n; i++) {
        uint64_t rl = ckpt_record_len(strlen(s[i].name));
        gddr__ckpt_encode_record(meta + mo, s[i].name, s[i].len);
        pc[npc++] = (piece){ meta + mo, rl, 0 };
        mo += rl;
        pc[npc++] = (piece){ (const uint8_t *)s[i].data, s[i].len, 0 };
        uint64_t pad = ckpt_align8(s[i].len) - s[i].len;
        pc[npc++] = (piece){ zeros, pad, 0 };
        content += rl + s[i].len + pad;
    }
    uint8_t *trl = meta + mo;
    gddr__ckpt_encode_trailer(trl, content);
    pc[npc++] = (piece){ trl, CKPT_TRL_LEN, 1 };
    uint64_t total = content + CKPT_TRL_LEN;
    double enc_ms = now_ms() - t_enc;

    wctx c = { .pc = pc, .npc = npc, .trailer = trl };
    const char *what = "open";
    double t_write = 0, t_fsync = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        gddr__ckpt_seterr(err, errlen, "open %s: %s", tmp, strerror(errno));
        rc = GDDR_EIO;
        goto out;
    }
    /* Reserve the space first: a full disk fails here, not after gigabytes. */
    int fr = 0;
    if (!(gddr__ckpt_test_flags & GDDR_CKPT_TEST_NO_FALLOCATE) &&
        fallocate(fd, 0, 0, (off_t)total) != 0)
        fr = errno; /* EOPNOTSUPP and the like: go on without */
    if (fr == ENOSPC || fr == EFBIG || fr == EDQUOT || fr == EIO) {
        gddr__ckpt_seterr(err, errlen, "allocate %" PRIu64 " bytes for %s: %s", total, tmp,
                          strerror(fr));
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
        gddr__ckpt_seterr(err, errlen, "%s %s: %s", what, tmp, strerror(-wr));
        rc = GDDR_EIO;
        goto out_unlink;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        gddr__ckpt_seterr(err, errlen, "close %s: %s", tmp, strerror(errno));
        rc = GDDR_EIO;
        goto out_unlink;
    }
    if (rename(tmp, path) != 0) {
        gddr__ckpt_seterr(err, errlen, "rename %s: %s", tmp, strerror(errno));
        rc = GDDR_EIO;
        goto out_unlink;
    }
    double t_dir = now_ms();
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        gddr__ckpt_seterr(err, errlen, "fsync directory %s: %s", dir, strerror(errno));
        rc = GDDR_EIO;
    }
    if (dfd >= 0)
        close(dfd);
    t_fsync += now_ms() - t_dir;
    if (rc == GDDR_OK)
        retain(dir, seq, keep, pin);
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

int gddr__ckpt_write(const char *dir, uint64_t seq, const gddr_ckpt_section *s, size_t n,
                     int keep, gddr_ckpt_stats *st, char *err, size_t errlen)
{
    return write_pinned(dir, seq, s, n, keep, NULL, st, err, errlen);
}

/* ---- background writer ---------------------------------------------------- */

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
    uint64_t pin[2]; /* not deleted by retention (gddr__ckpt_writer_pin) */
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
        uint64_t pin[2] = { w->pin[0], w->pin[1] };
        w->have_job = 0;
        w->job_s = NULL;
        pthread_mutex_unlock(&w->mu);

        gddr_ckpt_stats st;
        char err[512];
        int rc = write_pinned(w->dir, seq, s, n, w->keep, pin, &st, err, sizeof err);
        gddr__ckpt_free_sections(s, n);
        if (rc == GDDR_OK)
            gddr_log(GDDR_LOG_INFO,
                     "checkpoint %s/ckpt-%020" PRIu64 ".gddr written: %.1f MiB in %.1f ms "
                     "(write %.1f ms, fsync %.1f ms)",
                     w->dir, seq, (double)st.bytes / (1024.0 * 1024.0), st.total_ms,
                     st.write_ms, st.fsync_ms);
        else
            gddr_log(GDDR_LOG_ERROR, "checkpoint %" PRIu64 " failed: %s", seq, err);

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
        if (!gddr__ckpt_parse_name(e->d_name, 1, &seq))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            gddr_log(GDDR_LOG_INFO, "checkpoint: removed stale temp file %s/%s", dir,
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
        gddr_log(GDDR_LOG_INFO, "checkpoint: created directory %s", dir);
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        gddr_log(GDDR_LOG_ERROR, "checkpoint directory %s: %s", dir, strerror(errno));
        return GDDR_EIO;
    }
    if (!S_ISDIR(sb.st_mode)) {
        gddr_log(GDDR_LOG_ERROR, "checkpoint directory %s: not a directory", dir);
        return GDDR_EIO;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        gddr_log(GDDR_LOG_ERROR, "checkpoint directory %s: %s", dir, strerror(errno));
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
        gddr_log(GDDR_LOG_ERROR, "checkpoint: pthread_create: %s", strerror(rc));
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

void gddr__ckpt_writer_pin(gddr_ckpt_writer *w, uint64_t a, uint64_t b)
{
    pthread_mutex_lock(&w->mu);
    w->pin[0] = a, w->pin[1] = b;
    pthread_mutex_unlock(&w->mu);
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
    gddr__ckpt_free_sections(w->job_s, w->job_n); /* NULL: the thread takes every job */
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->dir);
    free(w);
    *pw = NULL;
}

