/* pushlog_write.c -- the push log's segments and its writer thread
 * (pushlog.c says what the log is): records laid out with their CRCs,
 * written through io_uring, synced once a batch. */
#include "pushlog_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "log.h"

void ps_plog_seg_path(const ps_plog *pl, uint64_t start, char *out, size_t len)
{
    snprintf(out, len, "%s/pushlog-%016llx.log", pl->dir, (unsigned long long)start);
}

uint32_t ps_plog_rec_crc(const rec_head *h, const void *body)
{
    uint32_t c = gddr__crc32c(0, &h->nframes, sizeof h->nframes + sizeof h->lsn + sizeof h->session);
    return gddr__crc32c(c, body, h->len);
}

static void plog_sync_dir(const char *dir)
{
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        fsync(d);
        close(d);
    }
}

/* Segments in dir, sorted by first LSN. */
size_t ps_plog_list_segments(const char *dir, uint64_t *out, size_t max)
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

int ps_plog_open_segment(ps_plog *pl, uint64_t start)
{
    char p[4200];
    ps_plog_seg_path(pl, start, p, sizeof p);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    plog_sync_dir(pl->dir);
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
void ps_plog_prune_now(ps_plog *pl)
{
    uint64_t below = atomic_load(&pl->prune_below);
    if (!below)
        return;
    uint64_t *segs = malloc(MAX_SEGS * sizeof *segs);
    if (!segs)
        return;
    size_t n = ps_plog_list_segments(pl->dir, segs, MAX_SEGS);
    for (size_t i = 0; i + 1 < n; i++) {
        if (segs[i + 1] > below)
            break;
        char p[4200];
        ps_plog_seg_path(pl, segs[i], p, sizeof p);
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

/* Submits the one request prepared on ring and returns its result (or a
 * negative errno of io_uring itself). */
static int ring_one(struct io_uring *ring)
{
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
            io_uring_prep_writev(io_uring_get_sqe(ring), pl->fd, iov, (unsigned)k, pl->off);
            w = ring_one(ring);
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
    io_uring_prep_fsync(io_uring_get_sqe(ring), pl->fd, IORING_FSYNC_DATASYNC);
    return ring_one(ring);
}

int ps_plog_grow(void **p, size_t *cap, size_t need, size_t each)
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
    if (ps_plog_grow((void **)&pl->stage, &pl->stage_cap, stage_need, 1) < 0 ||
        ps_plog_grow((void **)&pl->iov, &pl->iov_cap, iov_need, sizeof *pl->iov) < 0)
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
        rec_head h = { r[i].event ? PLOG_EVENT_MAGIC : PLOG_MAGIC, 0, 0, (uint32_t)r[i].n, r[i].lsn,
                       r[i].session };
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

void *ps_plog_writer_main(void *arg)
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
            if (rc == 0 && (rc = ps_plog_open_segment(pl, rot_lsn)) == 0)
                ps_plog_prune_now(pl);
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

