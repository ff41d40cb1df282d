/* bench_raw.c -- see bench_raw.h. */
#include "bench_raw.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "blas.h"
#include "vec.h"

/* The raw+apply server's step size, and what raw_check_apply expects. */
#define RAW_LR 1e-6f

/* The least a server that keeps the model pays for a push beyond moving
 * it: one read of the payload for its squared norm before the ack (a NaN
 * or Inf must be refused, so it cannot be acked first) -- gddr-ps's own
 * validation sum (gddr_sumsq_fp32_cpu) -- then, after the ack is queued
 * (so its flight overlaps the work, as gddr-ps's reply overlaps its
 * apply), w -= lr * g in place on the same thread, before the next
 * request is read, vectorised as gddr-ps's loops are (common/vec.h). */
GDDR_VEC static void raw_apply(float *restrict w, const float *restrict g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] -= RAW_LR * g[i];
}

/* A ROUTER that answers a push (header "P" + payload) with an empty ack and
 * a pull (header "G" + 8-byte size) with that many bytes from one buffer,
 * sent without a copy. The minimum any server on ZeroMQ pays. With apply
 * set, a push of as many bytes as the buffer holds is also validated and
 * applied to it (raw_apply): the minimum any parameter server pays. */
int raw_server(const char *file, int apply)
{
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    int64_t maxmsg = -1;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (zmq_bind(s, "tcp://127.0.0.1:*") != 0)
        return 1;
    char ep[256];
    size_t len = sizeof ep;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return 1;
    fprintf(f, "%s\n", ep);
    fclose(f);
    rename(tmp, file);
    size_t cap = 0;
    char *buf = NULL;
    for (;;) {
        zmq_msg_t id, hdr, body;
        zmq_msg_init(&id);
        zmq_msg_init(&hdr);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&hdr, s, 0) < 0)
            break;
        int more = zmq_msg_more(&hdr);
        if (more)
            zmq_msg_recv(&body, s, 0);
        char kind = zmq_msg_size(&hdr) ? *(char *)zmq_msg_data(&hdr) : 0;
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        if (kind == 'G' && zmq_msg_size(&hdr) == 9) {
            uint64_t n;
            memcpy(&n, (char *)zmq_msg_data(&hdr) + 1, 8);
            if (n > cap || (apply && n != cap)) { /* apply: the buffer is the tensor */
                free(buf);
                buf = malloc(n);
                cap = n;
                /* Real pages: a calloc'd buffer never written is the one
                 * shared zero page over and over, always in cache, and
                 * sending it cost a fraction of sending values (measured:
                 * the kernel's copy of a 1 MiB reply was 5x cheaper). */
                if (buf && apply) /* floats that stay normal under the applies */
                    for (uint64_t i = 0; i + 4 <= n; i += 4) {
                        float v = 0.5f + 1e-3f * (float)(i / 4 % 97);
                        memcpy(buf + i, &v, 4);
                    }
                else if (buf)
                    for (uint64_t i = 0; i < n; i++)
                        buf[i] = (char)(i * 131 + 7);
            }
            zmq_send(s, "g", 1, ZMQ_SNDMORE);
            zmq_msg_t out;
            zmq_msg_init_data(&out, buf, n, NULL, NULL);
            zmq_msg_send(&out, s, 0);
        } else {
            int take = apply && buf && zmq_msg_size(&body) == cap && cap % 4 == 0 &&
                       isfinite(gddr_sumsq_fp32_cpu(zmq_msg_data(&body), cap / 4));
            zmq_send(s, take || !apply ? "p" : "e", 1, 0);
            if (take)
                raw_apply((float *)buf, zmq_msg_data(&body), cap / 4);
        }
        zmq_msg_close(&hdr);
        zmq_msg_close(&body);
    }
    return 0;
}


void raw_connect(raw_client *r, const char *ep)
{
    r->ctx = zmq_ctx_new();
    r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(r->sock, ep);
}

void raw_close(raw_client *r)
{
    zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
}

void raw_push(raw_client *r, const float *push, size_t bytes)
{
    /* header + payload (zero-copy from the caller's buffer), ack */
    zmq_send(r->sock, "P", 1, ZMQ_SNDMORE);
    zmq_msg_t m;
    zmq_msg_init_data(&m, (void *)push, bytes, NULL, NULL);
    zmq_msg_send(&m, r->sock, 0);
    zmq_msg_t a;
    zmq_msg_init(&a);
    zmq_msg_recv(&a, r->sock, 0);
    zmq_msg_close(&a);
}

void raw_pull(raw_client *r, float *pull, size_t bytes)
{
    /* header, header + payload copied into the caller's buffer */
    char hdr[9] = { 'G' };
    uint64_t n = bytes;
    memcpy(hdr + 1, &n, 8);
    zmq_send(r->sock, hdr, 9, 0);
    zmq_msg_t a;
    zmq_msg_init(&a);
    zmq_msg_recv(&a, r->sock, 0);
    zmq_msg_close(&a);
    zmq_msg_t b;
    zmq_msg_init(&b);
    zmq_msg_recv(&b, r->sock, 0);
    memcpy(pull, zmq_msg_data(&b), zmq_msg_size(&b) < bytes ? zmq_msg_size(&b) : bytes);
    zmq_msg_close(&b);
}

void raw_roundtrips(raw_client *r, const float *push, float *pull, size_t bytes)
{
    raw_push(r, push, bytes);
    raw_pull(r, pull, bytes);
}

/* Whether raw_server(apply) applies what the benchmark says it does: a
 * pull, a push of g, a pull: every value must have moved by exactly
 * -RAW_LR * g (the same float operation); then a push with a NaN in its last
 * value must be refused and change nothing. */
int raw_check_apply(const char *ep, size_t bytes)
{
    size_t n = bytes / 4;
    float *g = malloc(bytes), *a = malloc(bytes), *b = malloc(bytes);
    int ok = g && a && b && n > 0;
    raw_client r;
    raw_connect(&r, ep);
    if (ok) {
        for (size_t i = 0; i < n; i++)
            g[i] = 0.25f * (float)(i % 13) - 1.0f;
        raw_pull(&r, a, bytes);
        raw_push(&r, g, bytes);
        raw_pull(&r, b, bytes);
        for (size_t i = 0; i < n && ok; i++)
            ok = b[i] == a[i] - RAW_LR * g[i];
        g[n - 1] = NAN;
        raw_push(&r, g, bytes);
        raw_pull(&r, a, bytes);
        ok = ok && memcmp(a, b, bytes) == 0;
    }
    raw_close(&r);
    free(g);
    free(a);
    free(b);
    return ok;
}
