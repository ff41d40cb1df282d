/* pushlog.c -- the push log ([durability] push_log, pushlog.h).
 *
 * What a checkpoint does not hold yet is in the log: every request that
 * changes the model or who may change it -- a hello that was accepted, a
 * registration, a push, a table registration, a row push, a bye -- from a
 * worker that holds its rank, in the order the front thread took them.
 * At a restart the newest readable checkpoint is loaded and the records
 * after the LSN it holds are replayed through the same handlers (replies
 * suppressed): the handlers are deterministic given the state and the
 * request in async and ssp mode, so the model, the versions and the
 * exactly-once records come back as the last logged request left them. A
 * request the handler refused is logged too, and refused again on replay.
 *
 * Records go to segments checkpoint_dir/pushlog-<first LSN, hex>.log; a
 * checkpoint starts a new segment (ps_plog_rotate), and once it is written
 * the segments older than the oldest kept checkpoint are deleted. A
 * record: magic, body length, CRC-32C (of what follows it), frame count,
 * LSN, session, then each frame as a length and its bytes. Replay stops at
 * the first record that is short or fails its CRC (a write torn by the
 * crash), cuts the file there and counts what it cut.
 *
 * The front thread only takes a reference to each frame of the request
 * (zmq_msg_copy shares a large frame's buffer: no byte is copied or read
 * on the front thread); a writer thread takes the records gathered so far,
 * lays out their headers, takes their CRCs, writes them through io_uring
 * (small frames copied together, large ones straight from the received
 * buffers) and syncs them: group commit, one fdatasync for every record
 * that arrived meanwhile. batch: the writer waits up to push_log_window_ms for more
 * records, and replies go at once (a kill -9 loses at most the window and
 * one write). always: the writer starts at once, and a reply to a logged
 * request waits in a queue here until its record is on disk
 * (ps_plog_hold); the writer wakes the front thread through an eventfd.
 */
#include "pushlog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "crc32c.h"
#include "log.h"
#include "ps.h"

#define PLOG_MAGIC 0x31504c47u /* "GLP1" little-endian */
#define MAX_SEGS 4096

typedef struct rec_head {
    uint32_t magic, len; /* len: the bytes after this header */
    uint32_t crc;        /* CRC-32C of nframes, lsn, session and the body */
    uint32_t nframes;
    uint64_t lsn, session;
} rec_head;

/* A record waiting for the writer: references to the request's frames. */
typedef struct prec {
    uint64_t lsn, session;
    int n;
    zmq_msg_t f[GDDR_MAX_FRAMES];
} prec;

typedef struct held {
    uint64_t lsn;
    zmq_msg_t ident, hdr;
    zmq_msg_t raw[2];
    int nraw;
} held;

struct ps_plog {
    int mode;
    long long window_ms;
    char dir[4096];
    int fd;               /* the segment being written (writer) */
    uint64_t off;         /* its length (writer) */
    uint64_t next_lsn;    /* front thread */
    uint64_t rotated_lsn; /* the LSN of the last rotation */
    /* the records the front thread gathers, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t written; /* the writer finished a write */
    prec *q, *wq;
    size_t len, cap, wcap; /* records in q; capacities of q and wq */
    int64_t first_ms;     /* when the first record of q came */
    size_t rot_at;        /* a new segment starts at this record of q ... */
    uint64_t rot_lsn;     /* ... with this LSN (0: none pending) */
    /* the writer's layout of a batch */
    char *stage;          /* headers, lengths and small frames, copied */
    size_t stage_cap;
    struct iovec *iov;
    size_t iov_cap;
    int stop;
    pthread_t th;
    int started;
    atomic_uint_fast64_t durable;
    int efd;
    /* checkpoints written (their LSNs), for pruning */
    uint64_t ckpt_lsn[64];
    int nckpt;
    uint64_t pending_ckpt_lsn;
    atomic_uint_fast64_t prune_below; /* segments whose successor starts at or before it go */
    held *h;
    size_t nh, caph;
    ps_plog_stats st;
    pthread_mutex_t stmu; /* st fields the writer updates */
};

static void seg_path(const ps_plog *pl, uint64_t start, char *out, size_t len)
{
    snprintf(out, len, "%s/pushlog-%016llx.log", pl->dir, (unsigned long long)start);
}

static uint32_t rec_crc(const rec_head *h, const void *body)
{
    uint32_t c = gddr__crc32c(0, &h->nframes, sizeof h->nframes + sizeof h->lsn + sizeof h->session);
    return gddr__crc32c(c, body, h->len);
}

static void sync_dir(const char *dir)
{
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        fsync(d);
        close(d);
    }
}

/* Segments in dir, sorted by first LSN. */
static size_t list_segments(const char *dir, uint64_t *out, size_t max)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        unsigned long long v;
        char tail[8];
        if (sscanf(e->d_name, "pushlog-%16llx.%4s", &v, tail) == 2 && strcmp(tail, "log") == 0)
            out[n++] = v;
    }
    closedir(d);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && out[j - 1] > out[j]; j--) {
            uint64_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

static int open_segment(ps_plog *pl, uint64_t start)
{
    char p[4200];
    seg_path(pl, start, p, sizeof p);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    sync_dir(pl->dir);
    if (pl->fd >= 0)
        close(pl->fd);
    pl->fd = fd;
    pl->off = 0;
    return 0;
}

/* Deletes the segments whose every record is at most below - 1: those
 * followed by a segment starting at or before `below`. Called when a
 * checkpoint was written and when the writer opens a segment (the one a
 * checkpoint started may come after the checkpoint is written). */
static void do_prune(ps_plog *pl)
{
    uint64_t below = atomic_load(&pl->prune_below);
    if (!below)
        return;
    uint64_t *segs = malloc(MAX_SEGS * sizeof *segs);
    if (!segs)
        return;
    size_t n = list_segments(pl->dir, segs, MAX_SEGS);
    for (size_t i = 0; i + 1 < n; i++) {
        if (segs[i + 1] > below)
            break;
        char p[4200];
        seg_path(pl, segs[i], p, sizeof p);
        if (unlink(p) != 0 && errno != ENOENT) /* ENOENT: the other thread's prune took it */
            gddr_log(GDDR_LOG_WARN, "push log: cannot remove %s: %s", p, strerror(errno));
    }
    free(segs);
}

/* ---- the writer ------------------------------------------------------------- */

/* Frames up to this size are copied into the stage with the headers;
 * larger ones are written from their own buffers. */
#define COPY_MAX 4096
#define IOV_BATCH 512

/* Writes iov[0..n) at the segment's end: io_uring writev, or pwritev. */
static int write_iov(ps_plog *pl, struct io_uring *ring, int have_ring, struct iovec *iov, size_t n)
{
    while (n > 0) {
        size_t k = n < IOV_BATCH ? n : IOV_BATCH;
        size_t want = 0;
        for (size_t i = 0; i < k; i++)
            want += iov[i].iov_len;
        ssize_t w;
        if (have_ring) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            io_uring_prep_writev(sqe, pl->fd, iov, (unsigned)k, pl->off);
            int r = io_uring_submit_and_wait(ring, 1);
            if (r < 0)
                return r;
            struct io_uring_cqe *cqe;
            if ((r = io_uring_wait_cqe(ring, &cqe)) < 0)
                return r;
            w = cqe->res;
            io_uring_cqe_seen(ring, cqe);
        } else {
            w = pwritev(pl->fd, iov, (int)k, (off_t)pl->off);
            if (w < 0)
                w = -errno;
        }
        if (w < 0)
            return (int)w;
        pl->off += (uint64_t)w;
        if ((size_t)w == want) {
            iov += k;
            n -= k;
            continue;
        }
        /* short: skip what went, go on from the rest */
        size_t done = (size_t)w;
        while (done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            n--;
        }
        iov->iov_base = (char *)iov->iov_base + done;
        iov->iov_len -= done;
    }
    return 0;
}

static int sync_seg(ps_plog *pl, struct io_uring *ring, int have_ring)
{
    if (!have_ring)
        return fdatasync(pl->fd) == 0 ? 0 : -errno;
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    io_uring_prep_fsync(sqe, pl->fd, IORING_FSYNC_DATASYNC);
    int r = io_uring_submit_and_wait(ring, 1);
    if (r < 0)
        return r;
    struct io_uring_cqe *cqe;
    if ((r = io_uring_wait_cqe(ring, &cqe)) < 0)
        return r;
    r = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    return r;
}

static int grow(void **p, size_t *cap, size_t need, size_t each)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, nc * each);
    if (!np)
        return -1;
    *p = np;
    *cap = nc;
    return 0;
}

/* Lays records r[0..n) out (headers, CRCs, iovecs), writes them and
 * releases their frames. Returns 0 or -errno. */
static int write_records(ps_plog *pl, struct io_uring *ring, int have_ring, prec *r, size_t n,
                         uint64_t *bytes)
{
    size_t stage_need = 0, iov_need = 0;
    for (size_t i = 0; i < n; i++) {
        stage_need += sizeof(rec_head) + 4 * (size_t)r[i].n;
        iov_need += 1 + 2 * (size_t)r[i].n;
        for (int k = 0; k < r[i].n; k++)
            if (zmq_msg_size(&r[i].f[k]) <= COPY_MAX)
                stage_need += zmq_msg_size(&r[i].f[k]);
    }
    if (grow((void **)&pl->stage, &pl->stage_cap, stage_need, 1) < 0 ||
        grow((void **)&pl->iov, &pl->iov_cap, iov_need, sizeof *pl->iov) < 0)
        return -ENOMEM;
    /* The stage is not moved below (it was grown to its size first), so
     * iovecs may point into it. Small pieces next to each other are merged. */
    char *st = pl->stage;
    size_t niov = 0;
#define ADD(ptr, len)                                                                          \
    do {                                                                                       \
        if (niov && (char *)pl->iov[niov - 1].iov_base + pl->iov[niov - 1].iov_len == (ptr)) \
            pl->iov[niov - 1].iov_len += (len);                                                \
        else                                                                                   \
            pl->iov[niov++] = (struct iovec){ (void *)(ptr), (len) };                          \
    } while (0)
    for (size_t i = 0; i < n; i++) {
        rec_head h = { PLOG_MAGIC, 0, 0, (uint32_t)r[i].n, r[i].lsn, r[i].session };
        for (int k = 0; k < r[i].n; k++)
            h.len += 4 + (uint32_t)zmq_msg_size(&r[i].f[k]);
        uint32_t c = gddr__crc32c(0, &h.nframes, sizeof h.nframes + sizeof h.lsn + sizeof h.session);
        char *hp = st;
        st += sizeof h;
        ADD(hp, sizeof h);
        for (int k = 0; k < r[i].n; k++) {
            uint32_t fl = (uint32_t)zmq_msg_size(&r[i].f[k]);
            const char *d = zmq_msg_data(&r[i].f[k]);
            memcpy(st, &fl, 4);
            c = gddr__crc32c(c, st, 4);
            c = gddr__crc32c(c, d, fl);
            ADD(st, 4);
            st += 4;
            if (fl <= COPY_MAX) {
                memcpy(st, d, fl);
                ADD(st, fl);
                st += fl;
            } else {
                ADD(d, fl);
            }
        }
        h.crc = c;
        memcpy(hp, &h, sizeof h);
    }
#undef ADD
    int rc = write_iov(pl, ring, have_ring, pl->iov, niov);
    if (rc == 0)
        *bytes += stage_need; /* (headers and small frames; large ones below) */
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < r[i].n; k++) {
            if (rc == 0 && zmq_msg_size(&r[i].f[k]) > COPY_MAX)
                *bytes += zmq_msg_size(&r[i].f[k]);
            zmq_msg_close(&r[i].f[k]);
        }
    return rc;
}

static void *writer_main(void *arg)
{
    ps_plog *pl = arg;
    struct io_uring ring;
    int have_ring = io_uring_queue_init(8, &ring, 0) == 0;
    if (!have_ring)
        gddr_log(GDDR_LOG_WARN, "push log: io_uring unavailable; using pwritev and fdatasync");
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        while (!pl->stop && pl->len == 0)
            pthread_cond_wait(&pl->cv, &pl->mu);
        if (pl->len == 0 && pl->stop)
            break;
        if (pl->mode == PS_PLOG_BATCH && !pl->stop) {
            /* Gather what comes within the window of the first record. */
            int64_t due = pl->first_ms + pl->window_ms;
            while (!pl->stop && gddr__now_ms() < due) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                int64_t left = due - gddr__now_ms();
                ts.tv_sec += left / 1000;
                ts.tv_nsec += (left % 1000) * 1000000;
                if (ts.tv_nsec >= 1000000000) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000;
                }
                pthread_cond_timedwait(&pl->cv, &pl->mu, &ts);
            }
        }
        prec *b = pl->q;
        size_t n = pl->len, rot_at = pl->rot_at, cap = pl->cap;
        uint64_t last = b[n - 1].lsn, rot_lsn = pl->rot_lsn;
        pl->q = pl->wq;
        pl->cap = pl->wcap;
        pl->wq = b;
        pl->wcap = cap;
        pl->len = 0;
        pl->rot_lsn = 0;
        pthread_mutex_unlock(&pl->mu);
        int rc = 0;
        uint64_t bytes = 0;
        if (rot_lsn) {
            rc = write_records(pl, &ring, have_ring, b, rot_at, &bytes);
            if (rc == 0)
                rc = sync_seg(pl, &ring, have_ring);
            if (rc == 0 && (rc = open_segment(pl, rot_lsn)) == 0)
                do_prune(pl);
            if (rc == 0)
                rc = write_records(pl, &ring, have_ring, b + rot_at, n - rot_at, &bytes);
            else
                for (size_t i = rot_at; i < n; i++)
                    for (int k = 0; k < b[i].n; k++)
                        zmq_msg_close(&b[i].f[k]);
        } else {
            rc = write_records(pl, &ring, have_ring, b, n, &bytes);
        }
        if (rc == 0)
            rc = sync_seg(pl, &ring, have_ring);
        pthread_mutex_lock(&pl->stmu);
        pl->st.bytes += bytes;
        if (rc == 0) {
            pl->st.syncs++;
        } else if (!pl->st.write_error) {
            pl->st.write_error = -rc;
            gddr_log(GDDR_LOG_ERROR, "push log: writing to %s failed: %s; replies of always wait "
                     "for good (pushes are still applied, a kill now loses them)", pl->dir,
                     strerror(-rc));
        }
        pthread_mutex_unlock(&pl->stmu);
        pthread_mutex_lock(&pl->mu);
        pthread_cond_broadcast(&pl->written);
        pthread_mutex_unlock(&pl->mu);
        if (rc == 0) {
            atomic_store(&pl->durable, last);
            uint64_t one = 1;
            if (write(pl->efd, &one, sizeof one) < 0) {
                /* a full counter still wakes the poll */
            }
        }
        pthread_mutex_lock(&pl->mu);
    }
    pthread_mutex_unlock(&pl->mu);
    if (have_ring)
        io_uring_queue_exit(&ring);
    return NULL;
}

/* ---- replay -------------------------------------------------------------------- */

/* Replays one record (frames copied out, each its own allocation, since
 * the apply pool may keep a payload frame past this call). */
static int replay_record(gddr_ps *ps, const rec_head *h, const char *body)
{
    gddr__frames f;
    memset(&f, 0, sizeof f);
    if (h->nframes < 1 || h->nframes + 1 > GDDR_MAX_FRAMES)
        return -1;
    zmq_msg_init(&f.part[0]); /* no identity: replies are not sent */
    f.n = 1;
    const char *p = body, *end = body + h->len;
    for (uint32_t i = 0; i < h->nframes; i++) {
        uint32_t fl;
        if (end - p < 4)
            goto bad;
        memcpy(&fl, p, 4);
        p += 4;
        if ((size_t)(end - p) < fl)
            goto bad;
        if (zmq_msg_init_size(&f.part[f.n], fl) != 0)
            goto bad;
        if (fl)
            memcpy(zmq_msg_data(&f.part[f.n]), p, fl);
        f.bytes += fl;
        f.n++;
        p += fl;
    }
    Gddr__Request *rq = gddr__request__unpack(NULL, gddr__frame_size(&f, 1), gddr__frame_data(&f, 1));
    if (!rq)
        goto bad;
    ps_replay_request(ps, &f, rq, h->session);
    gddr__request__free_unpacked(rq, NULL);
    gddr__frames_close(&f);
    return 0;
bad:
    gddr__frames_close(&f);
    return -1;
}

/* Replays segment path from the LSN after *lsn; cuts it at a torn record.
 * Returns 0, or 1 when the segment ended in a torn record (nothing after
 * it is trusted). */
static int replay_segment(gddr_ps *ps, ps_plog *pl, const char *path, uint64_t *lsn)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        gddr_log(GDDR_LOG_WARN, "push log: cannot open %s: %s", path, strerror(errno));
        return 1;
    }
    struct stat sb;
    fstat(fd, &sb);
    uint64_t off = 0, size = (uint64_t)sb.st_size;
    char *body = NULL;
    size_t bcap = 0;
    int torn = 0;
    while (off < size) {
        rec_head h;
        if (size - off < sizeof h || pread(fd, &h, sizeof h, (off_t)off) != (ssize_t)sizeof h ||
            h.magic != PLOG_MAGIC || size - off - sizeof h < h.len) {
            torn = 1;
            break;
        }
        if (h.len > bcap) {
            char *nb = realloc(body, h.len);
            if (!nb) {
                torn = 1;
                break;
            }
            body = nb;
            bcap = h.len;
        }
        if (pread(fd, body, h.len, (off_t)(off + sizeof h)) != (ssize_t)h.len || rec_crc(&h, body) != h.crc) {
            torn = 1;
            break;
        }
        if (h.lsn > *lsn + 1) {
            /* A gap: a segment between the checkpoint and this one is gone. */
            gddr_log(GDDR_LOG_ERROR, "push log: %s starts at LSN %llu, but the state holds LSN %llu: "
                     "the records between are missing; nothing after them is replayed",
                     path, (unsigned long long)h.lsn, (unsigned long long)*lsn);
            pl->st.gap = 1;
            free(body);
            close(fd);
            return 1;
        }
        if (h.lsn == *lsn + 1) {
            if (replay_record(ps, &h, body) < 0)
                gddr_log(GDDR_LOG_WARN, "push log: record %llu of %s cannot be read back; skipped",
                         (unsigned long long)h.lsn, path);
            *lsn = h.lsn;
            pl->st.replayed++;
        }
        off += sizeof h + h.len;
    }
    if (torn) {
        pl->st.torn_records++;
        pl->st.torn_bytes += size - off;
        gddr_log(GDDR_LOG_WARN, "push log: %s ends in a torn record at byte %llu (%llu bytes cut): "
                 "a write the crash interrupted (under push_log = always, of requests not yet "
                 "answered)", path, (unsigned long long)off, (unsigned long long)(size - off));
        if (ftruncate(fd, (off_t)off) == 0)
            fdatasync(fd);
    }
    free(body);
    close(fd);
    return torn;
}

/* ---- the front thread's side ------------------------------------------------- */

int ps_plog_open(gddr_ps *ps, uint64_t ckpt_lsn, char *err, size_t errlen)
{
    const gddr_ps_config *cfg = &ps->cfg;
    if (!cfg->checkpoint_dir[0])
        return GDDR_OK;
    uint64_t *segs = malloc(MAX_SEGS * sizeof *segs);
    if (!segs) {
        snprintf(err, errlen, "out of memory");
        return GDDR_ENOMEM;
    }
    size_t nseg = list_segments(cfg->checkpoint_dir, segs, MAX_SEGS);
    if (cfg->push_log == PS_PLOG_OFF) {
        /* A later start with the log on must not replay these: they hold
         * pushes from before the checkpoints this run writes. */
        for (size_t i = 0; i < nseg; i++) {
            char p[4200], q[4300];
            snprintf(p, sizeof p, "%s/pushlog-%016llx.log", cfg->checkpoint_dir, (unsigned long long)segs[i]);
            snprintf(q, sizeof q, "%s.unused", p);
            if (rename(p, q) == 0)
                gddr_log(GDDR_LOG_WARN, "push_log is off: moved %s aside (%s)", p, q);
        }
        free(segs);
        ps->plog_lsn0 = ckpt_lsn;
        return GDDR_OK;
    }
    ps_plog *pl = calloc(1, sizeof *pl);
    if (!pl) {
        free(segs);
        snprintf(err, errlen, "out of memory");
        return GDDR_ENOMEM;
    }
    pl->mode = cfg->push_log;
    pl->window_ms = cfg->push_log_window_ms;
    pl->fd = -1;
    pl->efd = -1;
    snprintf(pl->dir, sizeof pl->dir, "%s", cfg->checkpoint_dir);
    pthread_mutex_init(&pl->mu, NULL);
    pthread_mutex_init(&pl->stmu, NULL);
    pthread_cond_init(&pl->cv, NULL);
    pthread_cond_init(&pl->written, NULL);
    ps->plog = pl;
    /* Replay: the records after the checkpoint's LSN, in order. */
    uint64_t lsn = ckpt_lsn;
    int64_t t0 = gddr__now_ms();
    ps->replaying = 1;
    for (size_t i = 0; i < nseg; i++) {
        if (i + 1 < nseg && segs[i + 1] <= lsn + 1)
            continue; /* all of it is in the checkpoint */
        char p[4200];
        seg_path(pl, segs[i], p, sizeof p);
        if (replay_segment(ps, pl, p, &lsn) != 0) {
            if (i + 1 < nseg)
                gddr_log(GDDR_LOG_WARN, "push log: %zu later segment(s) not replayed", nseg - i - 1);
            break;
        }
    }
    ps_settle_all(ps);
    ps->replaying = 0;
    free(segs);
    pl->st.replay_ms = (uint64_t)(gddr__now_ms() - t0);
    if (pl->st.replayed)
        gddr_log(GDDR_LOG_INFO, "push log: replayed %llu records after checkpoint LSN %llu in %llu ms",
                 (unsigned long long)pl->st.replayed, (unsigned long long)ckpt_lsn,
                 (unsigned long long)pl->st.replay_ms);
    pl->next_lsn = lsn + 1;
    pl->rotated_lsn = ckpt_lsn;
    pl->st.appended_lsn = lsn;
    atomic_init(&pl->durable, lsn);
    pl->ckpt_lsn[pl->nckpt++] = ckpt_lsn;
    atomic_init(&pl->prune_below, 0);
    int rc = open_segment(pl, pl->next_lsn);
    if (rc < 0) {
        snprintf(err, errlen, "push log: cannot create a segment in %s: %s", pl->dir, strerror(-rc));
        return GDDR_EIO;
    }
    pl->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pl->efd < 0 || pthread_create(&pl->th, NULL, writer_main, pl) != 0) {
        snprintf(err, errlen, "push log: cannot start its writer");
        return GDDR_ENOMEM;
    }
    pl->started = 1;
    return GDDR_OK;
}

uint64_t ps_plog_append(gddr_ps *ps, const gddr__frames *f, uint64_t session)
{
    ps_plog *pl = ps->plog;
    if (!pl || ps->replaying)
        return 0;
    pthread_mutex_lock(&pl->mu);
    if (pl->mode == PS_PLOG_BATCH) {
        /* The window bounds what a kill loses only if the writer keeps up:
         * when the oldest record waiting is two windows old (the disk is
         * slower than the pushes), the front thread waits for the write. */
        while (pl->len > 0 && !pl->st.write_error &&
               gddr__now_ms() - pl->first_ms > 2 * pl->window_ms) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&pl->written, &pl->mu, &ts);
            pl->st.waits++;
        }
    }
    if (grow((void **)&pl->q, &pl->cap, pl->len + 1, sizeof *pl->q) < 0) {
        pthread_mutex_unlock(&pl->mu);
        gddr_log(GDDR_LOG_ERROR, "push log: no memory for a record; this request is not logged");
        return 0;
    }
    prec *r = &pl->q[pl->len];
    r->lsn = pl->next_lsn;
    r->session = session;
    r->n = f->n - 1;
    for (int i = 1; i < f->n; i++) {
        /* a reference: a large frame's buffer is shared, not copied */
        zmq_msg_init(&r->f[i - 1]);
        zmq_msg_copy(&r->f[i - 1], (zmq_msg_t *)&f->part[i]);
    }
    if (pl->len == 0)
        pl->first_ms = gddr__now_ms();
    pl->len++;
    pthread_cond_signal(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
    pl->st.records++;
    pl->st.appended_lsn = pl->next_lsn;
    return pl->next_lsn++;
}

int ps_plog_hold(gddr_ps *ps, uint64_t lsn, zmq_msg_t *ident, void *hdr, size_t hlen,
                 const gddr__raw *raws, int nraw)
{
    ps_plog *pl = ps->plog;
    if (!pl || !lsn || atomic_load(&pl->durable) >= lsn || nraw > 2)
        return 0;
    if (pl->nh == pl->caph) {
        size_t nc = pl->caph ? pl->caph * 2 : 64;
        held *nh = realloc(pl->h, nc * sizeof *nh);
        if (!nh)
            return 0; /* sent now: better early than never */
        pl->h = nh;
        pl->caph = nc;
    }
    held *e = &pl->h[pl->nh];
    e->lsn = lsn;
    zmq_msg_init(&e->ident);
    zmq_msg_copy(&e->ident, ident);
    zmq_msg_init_size(&e->hdr, hlen);
    memcpy(zmq_msg_data(&e->hdr), hdr, hlen);
    e->nraw = nraw;
    for (int i = 0; i < nraw; i++) {
        zmq_msg_init_size(&e->raw[i], raws[i].len);
        memcpy(zmq_msg_data(&e->raw[i]), raws[i].data, raws[i].len);
        if (raws[i].free_fn)
            raws[i].free_fn((void *)raws[i].data, raws[i].hint);
    }
    pl->nh++;
    return 1;
}

static void send_held(gddr_ps *ps, held *e)
{
    ps->bytes_out += zmq_msg_size(&e->hdr);
    zmq_msg_send(&e->ident, ps->router, ZMQ_SNDMORE);
    zmq_msg_send(&e->hdr, ps->router, e->nraw ? ZMQ_SNDMORE : 0);
    for (int i = 0; i < e->nraw; i++) {
        ps->bytes_out += zmq_msg_size(&e->raw[i]);
        zmq_msg_send(&e->raw[i], ps->router, i + 1 < e->nraw ? ZMQ_SNDMORE : 0);
    }
    zmq_msg_close(&e->ident), zmq_msg_close(&e->hdr);
    for (int i = 0; i < e->nraw; i++)
        zmq_msg_close(&e->raw[i]);
}

void ps_plog_poll(gddr_ps *ps)
{
    ps_plog *pl = ps->plog;
    if (!pl)
        return;
    uint64_t v;
    if (read(pl->efd, &v, sizeof v) < 0) {
        /* nothing signalled: held replies may still be due (see below) */
    }
    uint64_t d = atomic_load(&pl->durable);
    size_t k = 0;
    while (k < pl->nh && pl->h[k].lsn <= d)
        send_held(ps, &pl->h[k++]);
    if (k) {
        memmove(pl->h, pl->h + k, (pl->nh - k) * sizeof *pl->h);
        pl->nh -= k;
    }
}

int ps_plog_fd(gddr_ps *ps)
{
    return ps->plog ? ps->plog->efd : -1;
}

uint64_t ps_plog_rotate(gddr_ps *ps)
{
    ps_plog *pl = ps->plog;
    if (!pl)
        return ps->plog_lsn0;
    uint64_t lsn = pl->next_lsn - 1;
    pl->pending_ckpt_lsn = lsn;
    if (lsn == pl->rotated_lsn)
        return lsn; /* nothing logged since the last checkpoint: no new segment */
    pthread_mutex_lock(&pl->mu);
    if (!pl->rot_lsn) {
        /* One rotation a buffer: a second one before the writer took the
         * first only makes that segment longer. */
        pl->rot_at = pl->len;
        pl->rot_lsn = lsn + 1;
        pl->rotated_lsn = lsn;
        if (pl->len == 0)
            pl->first_ms = gddr__now_ms(); /* the writer opens the segment now */
        pthread_cond_signal(&pl->cv);
    }
    pthread_mutex_unlock(&pl->mu);
    return lsn;
}

void ps_plog_prune(gddr_ps *ps)
{
    ps_plog *pl = ps->plog;
    if (!pl)
        return;
    if (pl->nckpt == (int)(sizeof pl->ckpt_lsn / sizeof *pl->ckpt_lsn)) {
        memmove(pl->ckpt_lsn, pl->ckpt_lsn + 1, (size_t)(pl->nckpt - 1) * sizeof *pl->ckpt_lsn);
        pl->nckpt--;
    }
    pl->ckpt_lsn[pl->nckpt++] = pl->pending_ckpt_lsn;
    int keep = (int)ps->cfg.checkpoint_keep;
    if (pl->nckpt < keep)
        return;
    /* The oldest checkpoint kept replays from the segment holding its
     * LSN + 1: everything before that segment can go. */
    atomic_store(&pl->prune_below, pl->ckpt_lsn[pl->nckpt - keep] + 1);
    do_prune(pl);
}

void ps_plog_stats_get(gddr_ps *ps, ps_plog_stats *st)
{
    ps_plog *pl = ps->plog;
    memset(st, 0, sizeof *st);
    if (!pl)
        return;
    pthread_mutex_lock(&pl->stmu);
    *st = pl->st;
    pthread_mutex_unlock(&pl->stmu);
    st->durable_lsn = atomic_load(&pl->durable);
    st->held_replies = pl->nh;
}

void ps_plog_close(gddr_ps *ps)
{
    ps_plog *pl = ps->plog;
    if (!pl)
        return;
    if (pl->started) {
        pthread_mutex_lock(&pl->mu);
        pl->stop = 1;
        pthread_cond_signal(&pl->cv);
        pthread_mutex_unlock(&pl->mu);
        pthread_join(pl->th, NULL);
    }
    ps_plog_poll(ps); /* what the last write made durable */
    for (size_t i = 0; i < pl->nh; i++) {
        zmq_msg_close(&pl->h[i].ident), zmq_msg_close(&pl->h[i].hdr);
        for (int k = 0; k < pl->h[i].nraw; k++)
            zmq_msg_close(&pl->h[i].raw[k]);
    }
    free(pl->h);
    if (pl->fd >= 0)
        close(pl->fd);
    if (pl->efd >= 0)
        close(pl->efd);
    free(pl->q);
    free(pl->wq);
    free(pl->stage);
    free(pl->iov);
    pthread_mutex_destroy(&pl->mu);
    pthread_mutex_destroy(&pl->stmu);
    pthread_cond_destroy(&pl->cv);
    pthread_cond_destroy(&pl->written);
    free(pl);
    ps->plog = NULL;
}
