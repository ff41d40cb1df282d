/* wire.c -- see wire.h. */
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t gddr__now_ms(void)
{
    return gddr__now_us() / 1000;
}

int64_t gddr__now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void gddr__zfree(void *data, void *hint)
{
    (void)hint;
    free(data);
}

void gddr__frames_close(gddr__frames *f)
{
    for (int i = 0; i < f->n; i++)
        zmq_msg_close(&f->part[i]);
    f->n = 0;
}

/* libzmq hands out received frames at whatever offset they had in its
 * receive buffer, so a float frame may start at an odd address; reading
 * floats there is undefined behaviour (UBSan caught it). Such a frame is
 * moved to a malloc'd (aligned) buffer: one memcpy, only when misaligned. */
static void align_part(zmq_msg_t *m)
{
    size_t n = zmq_msg_size(m);
    if (n < sizeof(float) || ((uintptr_t)zmq_msg_data(m) & (sizeof(float) - 1)) == 0)
        return;
    void *buf = malloc(n);
    if (!buf)
        return; /* stays as it is: x86 and arm64 load it right, only C objects */
    memcpy(buf, zmq_msg_data(m), n);
    zmq_msg_t aligned;
    if (zmq_msg_init_data(&aligned, buf, n, gddr__zfree, NULL) != 0) {
        free(buf);
        return;
    }
    zmq_msg_move(m, &aligned); /* closes what m held */
    zmq_msg_close(&aligned);
}

int gddr__frames_recv(void *sock, gddr__frames *f, int flags)
{
    f->n = 0;
    f->truncated = 0;
    f->bytes = 0;
    f->user[0] = 0;
    for (;;) {
        zmq_msg_t scratch, *m = f->n < GDDR_MAX_FRAMES ? &f->part[f->n] : &scratch;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, f->n == 0 && !f->truncated ? flags : 0) < 0) {
            int e = errno;
            zmq_msg_close(m);
            gddr__frames_close(f);
            errno = e;
            return -1;
        }
        f->bytes += zmq_msg_size(m);
        int more = zmq_msg_more(m);
        /* Read before align_part, whose copy carries no metadata. */
        if (!f->user[0]) {
            const char *uid = zmq_msg_gets(m, "User-Id");
            if (uid)
                snprintf(f->user, sizeof f->user, "%s", uid);
        }
        if (m != &scratch)
            align_part(m);
        if (m == &scratch) {
            zmq_msg_close(m);
            f->truncated = 1;
        } else {
            f->n++;
        }
        if (!more)
            break;
    }
    return f->n;
}

/* Gives raws[from..nraw) with a free function back to their owners: the
 * send failed before ZeroMQ took them. */
static void release_raws(const gddr__raw *raws, int from, int nraw)
{
    for (int i = from; i < nraw; i++)
        if (raws[i].free_fn)
            raws[i].free_fn((void *)raws[i].data, raws[i].hint);
}

long gddr__send(void *sock, zmq_msg_t *identity, const ProtobufCMessage *header,
                const gddr__raw *raws, int nraw)
{
    long total = 0;
    if (identity) {
        zmq_msg_t id;
        zmq_msg_init(&id);
        zmq_msg_copy(&id, identity);
        total += (long)zmq_msg_size(&id);
        if (zmq_msg_send(&id, sock, ZMQ_SNDMORE) < 0) {
            zmq_msg_close(&id);
            release_raws(raws, 0, nraw);
            return -1;
        }
    }
    size_t hlen = protobuf_c_message_get_packed_size(header);
    zmq_msg_t h;
    if (zmq_msg_init_size(&h, hlen) != 0) {
        release_raws(raws, 0, nraw);
        return -1;
    }
    protobuf_c_message_pack(header, zmq_msg_data(&h));
    total += (long)hlen;
    if (zmq_msg_send(&h, sock, nraw > 0 ? ZMQ_SNDMORE : 0) < 0) {
        zmq_msg_close(&h);
        release_raws(raws, 0, nraw);
        return -1;
    }
    for (int i = 0; i < nraw; i++) {
        zmq_msg_t m;
        int rc;
        if (raws[i].free_fn) {
            rc = zmq_msg_init_data(&m, (void *)raws[i].data, raws[i].len, raws[i].free_fn,
                                   raws[i].hint);
        } else {
            rc = zmq_msg_init_size(&m, raws[i].len);
            if (rc == 0 && raws[i].len)
                memcpy(zmq_msg_data(&m), raws[i].data, raws[i].len);
        }
        if (rc != 0) {
            release_raws(raws, i, nraw);
            return -1;
        }
        total += (long)raws[i].len;
        if (zmq_msg_send(&m, sock, i + 1 < nraw ? ZMQ_SNDMORE : 0) < 0) {
            zmq_msg_close(&m); /* calls raws[i]'s free function */
            release_raws(raws, i + 1, nraw);
            return -1;
        }
    }
    return total;
}
