/* reply.c -- answering requests: every reply's common header, sending
 * it, and refusals (a gddr_err code, a counter, an Error reply), with
 * their rate-limited log line. Every file that answers a peer comes here;
 * this file calls none of them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "ps.h"

void ps_reply_init(gddr_ps *ps, Gddr__Reply *r, uint64_t req_id, const ps_tensor *t)
{
    gddr__reply__init(r);
    r->protocol = GDDR__CONST__PROTOCOL_VERSION;
    r->req_id = req_id;
    r->epoch = ps->epoch;
    r->tau = t ? (uint32_t)t->tau : (uint32_t)ps->cfg.tau_init;
}

void ps_send_push_reply(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, const ps_tensor *t, uint32_t id,
                        const ps_push_answer *a, int duplicate)
{
    Gddr__Reply r;
    Gddr__PushReply pr = GDDR__PUSH_REPLY__INIT;
    ps_reply_init(ps, &r, req_id, t);
    pr.id = id;
    pr.version = a->version;
    pr.applied = a->applied;
    pr.staleness = a->staleness;
    pr.mode = (Gddr__Mode)a->mode;
    pr.sync_target = a->sync_target;
    pr.behind = a->behind;
    pr.duplicate = duplicate;
    r.body_case = GDDR__REPLY__BODY_PUSH;
    r.push = &pr;
    ps_send_reply(ps, ident, &r, NULL, 0);
}

void ps_send_reply(gddr_ps *ps, zmq_msg_t *ident, Gddr__Reply *r, const gddr__raw *raws, int nraw)
{
    if (ps->replaying)
        return; /* the push log's replay (pushlog.c): the peer got its answer before the crash */
    if (ps->hold_replies && ps->hold_reply) {
        /* push_log = always: the answer to a logged request waits until
         * its record is on disk (pushlog.c). */
        size_t hlen = protobuf_c_message_get_packed_size(&r->base);
        uint8_t *hdr = malloc(hlen ? hlen : 1);
        if (hdr) {
            protobuf_c_message_pack(&r->base, hdr);
            int held = ps->hold_reply(ps, ident, hdr, hlen, raws, nraw);
            free(hdr);
            if (held)
                return;
        }
    }
    long n = gddr__send(ps->router, ident, &r->base, raws, nraw);
    if (n > 0)
        ps->bytes_out += (uint64_t)n;
}

static int vreject(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, int code, uint32_t retry_ms,
                   const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    ps->rejected[code > 0 && code < PS_NERR ? code : 0]++;
    gddr_log(GDDR_LOG_DEBUG, "rejected request %llu: %s: %s", (unsigned long long)req_id,
             gddr_strerror(code), msg);
    Gddr__Reply r;
    Gddr__Error e = GDDR__ERROR__INIT;
    ps_reply_init(ps, &r, req_id, NULL);
    e.code = (uint32_t)code;
    e.message = msg;
    e.retry_ms = retry_ms;
    r.body_case = GDDR__REPLY__BODY_ERROR;
    r.error = &e;
    if (ident)
        ps_send_reply(ps, ident, &r, NULL, 0);
    return code;
}

int ps_reject(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vreject(ps, ident, req_id, code, 0, fmt, ap);
    va_end(ap);
    return rc;
}

int ps_reject_retry(gddr_ps *ps, zmq_msg_t *ident, uint64_t req_id, int code, uint32_t retry_ms,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vreject(ps, ident, req_id, code, retry_ms, fmt, ap);
    va_end(ap);
    return rc;
}

void ps_log_refusal(gddr_ps *ps, const char *fmt, ...)
{
    int64_t now = gddr__now_ms();
    if (ps->last_refusal_log_ms && now - ps->last_refusal_log_ms < 1000) {
        ps->refusals_unlogged++;
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ps->refusals_unlogged)
        gddr_log(GDDR_LOG_WARN, "%s (and %llu more refusals not logged since the last line)", msg,
                 (unsigned long long)ps->refusals_unlogged);
    else
        gddr_log(GDDR_LOG_WARN, "%s", msg);
    ps->refusals_unlogged = 0;
    ps->last_refusal_log_ms = now;
}
