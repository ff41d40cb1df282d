/* bench_raw.h -- gddr-bench's baseline: the same push and pull round trips
 * over bare ZeroMQ (a ROUTER that answers at once, a DEALER per client),
 * the least any server on ZeroMQ pays. gddr-bench runs the server as
 * itself with --raw-server. */
#ifndef GDDR_TOOLS_BENCH_RAW_H
#define GDDR_TOOLS_BENCH_RAW_H

#include <stddef.h>

/* Binds a ROUTER on 127.0.0.1, writes its endpoint to `file` (through a
 * rename, so a reader sees it whole) and serves until the process ends: a
 * push (header "P" + payload) gets an empty ack, a pull (header "G" +
 * 8-byte size) that many bytes from one buffer, sent without a copy.
 * With apply set, a push as large as that buffer is also read once for
 * its norm and, when finite, applied to the buffer in place after its ack
 * (w -= lr * g, on the same thread, before the next request): the least a
 * server that validates and keeps the model pays, with none of gddr-ps's
 * protocol, threads or bookkeeping. (Several clients' replies may then
 * see a buffer being written: a ceiling for timing, not a server.)
 * Returns 1 when it cannot start. */
int raw_server(const char *file, int apply);

/* 1 when the server at ep, started with apply, applies a push of `bytes`
 * exactly as raw_server says and refuses one holding a NaN. */
int raw_check_apply(const char *ep, size_t bytes);

/* One raw client: a DEALER of its own context. */
typedef struct raw_client {
    void *ctx, *sock;
} raw_client;

void raw_connect(raw_client *r, const char *ep);
void raw_close(raw_client *r);
/* A push of `bytes` from push (zero-copy) and its ack. */
void raw_push(raw_client *r, const float *push, size_t bytes);
/* A pull of `bytes` into pull (one copy out of the reply). */
void raw_pull(raw_client *r, float *pull, size_t bytes);
/* raw_push, then raw_pull. */
void raw_roundtrips(raw_client *r, const float *push, float *pull, size_t bytes);

#endif
