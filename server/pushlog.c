/* pushlog.c -- the push log ([durability] push_log, pushlog.h).
 *
 * What a checkpoint does not hold yet is in the log: every request that
 * changes the model or who may change it -- a hello that was accepted, a
 * registration, a push, a table registration, a row push, a bye -- from a
 * worker that holds its rank, in the order the front thread took them.
 * What changed the state on a clock goes in as events between them: a
 * sync step completed (with the live workers it divided by) and a worker
 * declared dead. At a restart the newest readable checkpoint is loaded and
 * the records after the LSN it holds are replayed through the same
 * handlers (replies suppressed), the events applied where they stand, and
 * no sync step completes on the replay's own clock: the handlers are then
 * a function of the state and the records, so the model, the versions,
 * the open sync steps and the exactly-once records come back as the last
 * record left them. A request the handler refused is logged too, and
 * refused again on replay.
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
#include "pushlog_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

/* ---- replay -------------------------------------------------------------------- */

/* Replays one record (frames copied out, each its own allocation, since
 * the apply pool may keep a payload frame past this call). */
static int replay_record(gddr_ps *ps, ps_plog_replay_fn replay, ps_plog_event_fn event,
                         const rec_head *h, const char *body)
{
    if (h->magic == PLOG_EVENT_MAGIC) {
        uint32_t fl, type, id;
        uint64_t arg;
        if (h->nframes != 1 || h->len != 4 + 16)
            return -1;
        memcpy(&fl, body, 4);
        memcpy(&type, body + 4, 4);
        memcpy(&id, body + 8, 4);
        memcpy(&arg, body + 12, 8);
        if (fl != 16)
            return -1;
        event(ps, type, id, arg);
        return 0;
    }
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
    replay(ps, &f, rq, h->session);
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
static int replay_segment(gddr_ps *ps, ps_plog *pl, ps_plog_replay_fn replay,
                          ps_plog_event_fn event, const char *path, uint64_t *lsn)
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
            (h.magic != PLOG_MAGIC && h.magic != PLOG_EVENT_MAGIC) || size - off - sizeof h < h.len) {
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
        if (pread(fd, body, h.len, (off_t)(off + sizeof h)) != (ssize_t)h.len || ps_plog_rec_crc(&h, body) != h.crc) {
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
            if (replay_record(ps, replay, event, &h, body) < 0)
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

int ps_plog_open(gddr_ps *ps, uint64_t ckpt_lsn, ps_plog_replay_fn replay, ps_plog_event_fn event,
                 char *err, size_t errlen)
{
    const gddr_ps_config *cfg = &ps->cfg;
    if (!cfg->checkpoint_dir[0])
        return GDDR_OK;
    uint64_t *segs = malloc(MAX_SEGS * sizeof *segs);
    if (!segs) {
        snprintf(err, errlen, "out of memory");
        return GDDR_ENOMEM;
    }
    size_t nseg = ps_plog_list_segments(cfg->checkpoint_dir, segs, MAX_SEGS);
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
        ps_plog_seg_path(pl, segs[i], p, sizeof p);
        if (replay_segment(ps, pl, replay, event, p, &lsn) != 0) {
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
    int rc = ps_plog_open_segment(pl, pl->next_lsn);
    if (rc < 0) {
        snprintf(err, errlen, "push log: cannot create a segment in %s: %s", pl->dir, strerror(-rc));
        return GDDR_EIO;
    }
    pl->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pl->efd < 0 || pthread_create(&pl->th, NULL, ps_plog_writer_main, pl) != 0) {
        snprintf(err, errlen, "push log: cannot start its writer");
        return GDDR_ENOMEM;
    }
    pl->started = 1;
    ps->log_event = ps_plog_event; /* sync.c, table_wire.c, workers.c */
    if (pl->mode == PS_PLOG_ALWAYS)
        ps->hold_reply = ps_plog_hold; /* reply.c: answers to logged requests wait here */
    return GDDR_OK;
}

static uint64_t append(gddr_ps *ps, const gddr__frames *f, uint64_t session, int event);

uint64_t ps_plog_append(gddr_ps *ps, const gddr__frames *f, uint64_t session)
{
    return append(ps, f, session, 0);
}

static uint64_t append(gddr_ps *ps, const gddr__frames *f, uint64_t session, int event)
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
    if (ps_plog_grow((void **)&pl->q, &pl->cap, pl->len + 1, sizeof *pl->q) < 0) {
        pthread_mutex_unlock(&pl->mu);
        gddr_log(GDDR_LOG_ERROR, "push log: no memory for a record; this request is not logged");
        return 0;
    }
    prec *r = &pl->q[pl->len];
    r->lsn = pl->next_lsn;
    r->session = session;
    r->event = event;
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

void ps_plog_event(gddr_ps *ps, uint32_t type, uint32_t id, uint64_t arg)
{
    ps_plog *pl = ps->plog;
    if (!pl || ps->replaying)
        return;
    gddr__frames f;
    memset(&f, 0, sizeof f);
    zmq_msg_init(&f.part[0]);
    zmq_msg_init_size(&f.part[1], 16);
    char *d = zmq_msg_data(&f.part[1]);
    memcpy(d, &type, 4);
    memcpy(d + 4, &id, 4);
    memcpy(d + 8, &arg, 8);
    f.n = 2;
    append(ps, &f, 0, 1);
    gddr__frames_close(&f);
}

int ps_plog_hold(gddr_ps *ps, zmq_msg_t *ident, void *hdr, size_t hlen, const gddr__raw *raws, int nraw)
{
    ps_plog *pl = ps->plog;
    /* The request's record and the events its handling logged (a step it
     * completed): everything appended so far. */
    uint64_t lsn = pl ? pl->next_lsn - 1 : 0;
    if (!pl || !lsn || atomic_load(&pl->durable) >= lsn || nraw > 2)
        return 0;
    if (ps_plog_grow((void **)&pl->h, &pl->caph, pl->nh + 1, sizeof *pl->h) < 0)
        return 0; /* sent now: better early than never */
    held *e = &pl->h[pl->nh];
    e->lsn = lsn;
    zmq_msg_init(&e->ident);
    zmq_msg_copy(&e->ident, ident);
    zmq_msg_init_size(&e->hdr, hlen);
    memcpy(zmq_msg_data(&e->hdr), hdr, hlen);
    e->nraw = nraw;
    for (int i = 0; i < nraw; i++) {
        /* A frame with a free function (a pull reply's values) is taken
         * as it is; a borrowed one is copied. */
        if (raws[i].free_fn &&
            zmq_msg_init_data(&e->raw[i], (void *)raws[i].data, raws[i].len, raws[i].free_fn, raws[i].hint) == 0)
            continue;
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
    ps_plog_prune_now(pl);
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
    ps->hold_reply = NULL;
    ps->log_event = NULL;
}
