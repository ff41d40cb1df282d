/* pushlog_int.h -- what the two halves of the push log share: the record
 * layout, the log's state, and the writer's entry points (pushlog.c is the
 * front thread's side and the replay, pushlog_write.c the segments and the
 * writer thread). Only those two files include it. */
#ifndef GDDR_PUSHLOG_INT_H
#define GDDR_PUSHLOG_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ps.h"
#include "pushlog.h"

#define PLOG_MAGIC 0x31504c47u       /* "GLP1" little-endian: a request */
#define PLOG_EVENT_MAGIC 0x31454c47u /* "GLE1": an event (pushlog.h, PS_PLOG_EV_*) */
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
    int event; /* its one frame is an event (type, id, arg), not a request */
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

uint32_t ps_plog_rec_crc(const rec_head *h, const void *body);
void ps_plog_seg_path(const ps_plog *pl, uint64_t start, char *out, size_t len);
/* Segments in dir, sorted by first LSN. */
size_t ps_plog_list_segments(const char *dir, uint64_t *out, size_t max);
/* Creates segment `start` and makes it the one written (writer). */
int ps_plog_open_segment(ps_plog *pl, uint64_t start);
/* Deletes the segments no kept checkpoint needs (pl->prune_below). */
void ps_plog_prune_now(ps_plog *pl);
/* Grows *p (cap elements of `each` bytes) to hold need; -1: no memory. */
int ps_plog_grow(void **p, size_t *cap, size_t need, size_t each);
/* The writer thread (pthread_create's start routine). */
void *ps_plog_writer_main(void *arg);

#endif
