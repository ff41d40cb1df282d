/* wire.h -- framing shared by gddr-ps and libgddr-client.
 *
 * A GDDR message is [identity] + header + raw frames: the header is a packed
 * protobuf-c Request or Reply (proto/gddr.proto), the raw frames carry
 * little-endian float32 tensor values. These helpers pack and send such a
 * message and receive one into zmq_msg_t parts without copying the payload.
 */
#ifndef GDDR_COMMON_WIRE_H
#define GDDR_COMMON_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "gddr.pb-c.h"

#define GDDR_MAX_FRAMES 8

typedef struct gddr__frames {
    zmq_msg_t part[GDDR_MAX_FRAMES];
    int n;          /* parts received and kept */
    int truncated;  /* more parts arrived than fit; they were dropped */
    size_t bytes;   /* total bytes of every part, for accounting */
    char user[48];  /* the connection's ZAP User-Id (CURVE: the client key), or "" */
} gddr__frames;

/* Receives one whole multipart message. flags: 0 or ZMQ_DONTWAIT. Returns
 * the number of parts, or -1 with errno (EAGAIN when nothing is waiting). */
int gddr__frames_recv(void *sock, gddr__frames *f, int flags);
void gddr__frames_close(gddr__frames *f);
static inline void *gddr__frame_data(gddr__frames *f, int i) { return zmq_msg_data(&f->part[i]); }
static inline size_t gddr__frame_size(gddr__frames *f, int i) { return zmq_msg_size(&f->part[i]); }

/* A raw frame to send after the header: `data` is copied by ZeroMQ unless
 * `free_fn` is set, in which case ZeroMQ takes ownership and calls it
 * (gddr__send calls it itself when the send fails first: either way it is
 * called exactly once). */
typedef struct gddr__raw {
    const void *data;
    size_t len;
    zmq_free_fn *free_fn;
    void *hint;
} gddr__raw;

/* Sends [identity?] + packed header + raws. identity may be NULL (client
 * side). Returns total bytes sent, or -1 with errno. */
long gddr__send(void *sock, zmq_msg_t *identity, const ProtobufCMessage *header,
                const gddr__raw *raws, int nraw);

/* A free function for zmq_msg_init_data that calls free(). */
void gddr__zfree(void *data, void *hint);

/* Monotonic milliseconds. */
int64_t gddr__now_ms(void);
/* Monotonic microseconds. */
int64_t gddr__now_us(void);

#endif
