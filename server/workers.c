/* workers.c -- who is a worker of this server
 * (docs/design.md sections 7 and 8).
 *
 * A connection becomes worker `rank` only with an accepted Hello: rank
 * below its world_size (and below `workers` when set), a key allowed that
 * rank (CURVE), and the rank not held by another live session. Nothing
 * else makes a worker: a refused hello, a stats request or a stranger's
 * push changes no worker state.
 *
 * Sessions. Every request of a worker carries its session (a random
 * number the worker draws once per process; Request.session), or else the
 * server uses the connection as the session. A live rank belongs to the
 * session that said hello first until it says bye or is declared dead, so
 * another connection cannot take the rank over or say bye for it. The
 * same session may reconnect on a new socket (after a timeout or a server
 * pause) and go on; a new session for a rank is a new process: it gets a
 * fresh exactly-once history. A worker declared dead that turns out to be
 * the same session (it was only slow) is taken back by its next request.
 *
 * Exactly once: per (rank, tensor) the server keeps the last step it took
 * from the session and that push's answer (ps_wtensor); a push whose step
 * is not above it is a resend and gets the first answer again (push.c).
 * The records go into checkpoints with the workers (persist.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ps.h"
#include "pushlog.h"
#include "snapshot.h"

uint64_t ps_request_session(const Gddr__Request *rq, const ps_conn *c)
{
    return rq->session ? rq->session : c ? c->session : 0;
}

ps_wtensor *ps_worker_tensor(gddr_ps *ps, uint32_t rank, uint32_t id)
{
    ps_worker *w = &ps->workers[rank];
    if (id >= w->nwt) {
        size_t n = ps->ntensors > id ? ps->ntensors : id + 1;
        ps_wtensor *p = realloc(w->wt, n * sizeof *p);
        if (!p)
            return NULL;
        memset(p + w->nwt, 0, (n - w->nwt) * sizeof *p);
        w->wt = p;
        w->nwt = n;
    }
    return &w->wt[id];
}

/* Copies what a hello says it is, with anything unprintable escaped, so a
 * client string cannot forge log lines. */
static void copy_client(char *dst, size_t len, const char *src)
{
    size_t o = 0;
    for (const unsigned char *s = (const unsigned char *)(src ? src : "?"); *s && o + 5 < len; s++) {
        if (*s >= 0x20 && *s < 0x7f && *s != '\\')
            dst[o++] = (char)*s;
        else
            o += (size_t)snprintf(dst + o, len - o, "\\x%02x", *s);
    }
    dst[o] = 0;
}

int ps_worker_hello(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, uint64_t session,
                    const ps_key *key)
{
    const Gddr__Hello *h = rq->hello;
    uint32_t rank = rq->rank;
    if (h->world_size == 0 || h->world_size > (uint32_t)ps->cfg.max_workers)
        return ps_reject(ps, ident, rq->req_id, GDDR_EWORKER,
                         "world_size %u is not in [1, max_workers = %lld]", h->world_size,
                         ps->cfg.max_workers);
    if (rank >= h->world_size)
        return ps_reject(ps, ident, rq->req_id, GDDR_EWORKER, "rank %u is not below world_size %u",
                         rank, h->world_size);
    if (ps->cfg.workers && rank >= (uint64_t)ps->cfg.workers)
        return ps_reject(ps, ident, rq->req_id, GDDR_EWORKER,
                         "rank %u is not below the %lld workers this server is configured for", rank,
                         ps->cfg.workers);
    if (key && (key->observer_only ||
                (key->rank_lo >= 0 && ((int)rank < key->rank_lo || (int)rank > key->rank_hi))))
        return ps_reject(ps, ident, rq->req_id, GDDR_EWORKER, "key %.8s... may not act as worker %u",
                         key->z85, rank);
    if (!session)
        return ps_reject(ps, ident, rq->req_id, GDDR_EWORKER, "no session");
    ps_worker *w = &ps->workers[rank];
    int64_t now = gddr__now_ms();
    if (w->state == PS_W_LIVE && !w->restored && w->session != session) {
        /* Transient: the holder frees the rank by a bye or by its silence. */
        int64_t left = (int64_t)(ps->cfg.worker_timeout_s * 1000) - (now - w->last_seen_ms);
        /* Two live processes asking for one rank: most often several
         * workers started without --rank (each then is rank 0 of 1). */
        const char *hint = h->world_size <= 1 && ps_expected_workers(ps) > 1
                               ? " (this hello says world 1: did several workers start without "
                                 "--rank and --world?)"
                               : "";
        if (!w->held_said) {
            w->held_said = 1;
            gddr_log(GDDR_LOG_WARN, "a second process asks for rank %u, held by a live worker%s", rank, hint);
        }
        return ps_reject_retry(ps, ident, rq->req_id, GDDR_EWORKER,
                               (uint32_t)(left < 100 ? 100 : left),
                               "rank %u is held by another live worker%s; it is free once that one "
                               "says bye or is silent for worker_timeout_s = %g s",
                               rank, hint, ps->cfg.worker_timeout_s);
    }
    char client[64];
    copy_client(client, sizeof client, h->client);
    if (w->session != session) {
        /* A new process for this rank: a fresh exactly-once history. */
        if (w->state != PS_W_NONE)
            gddr_log(GDDR_LOG_INFO, "worker %u rejoined as a new process (%s)", rank, client);
        else
            gddr_log(GDDR_LOG_INFO, "worker %u joined (world %u, %s)", rank, h->world_size, client);
        free(w->wt);
        w->wt = NULL;
        w->nwt = 0;
        ps_pviews_free(w); /* a new process has no view yet */
        ps_fill_free_worker(ps, w); /* nor a residual: what was filled in for it stays */
        ps_parts_drop_rank(ps, rank); /* the old process's half-sent pushes */
        w->session = session;
        if (w->state == PS_W_DEAD || w->state == PS_W_LEFT)
            ps->rejoins++;
        /* In place of an earlier process that took part in steps (dead,
         * gone, or live in a restored checkpoint), it starts its loop at
         * the top: excused from steps of tensors and tables it has not
         * pushed to yet (members.c). (A rank's first process is waited for
         * from its hello, as sync steps always did.) */
        w->joined = w->state != PS_W_NONE && w->pushes > 0 ? ++ps->joins : 0;
    } else if (w->state == PS_W_LIVE && w->restored) {
        gddr_log(GDDR_LOG_INFO, "worker %u reconnected after the server restart", rank);
    } else if (w->state == PS_W_LIVE) {
        gddr_log(GDDR_LOG_DEBUG, "worker %u said hello again (reconnect)", rank);
    } else {
        gddr_log(GDDR_LOG_INFO, "worker %u rejoined: the same process, after a reconnect", rank);
        ps->rejoins++;
    }
    snprintf(w->client, sizeof w->client, "%s", client);
    int was_live = w->state == PS_W_LIVE;
    w->state = PS_W_LIVE;
    w->restored = 0;
    w->last_seen_ms = now;
    if (!ps->first_hello_ms)
        ps->first_hello_ms = now;
    if ((int)h->world_size > ps->announced_world)
        ps->announced_world = (int)h->world_size;
    if (!was_live)
        ps_membership_changed(ps);
    return GDDR_OK;
}

int ps_worker_owns(gddr_ps *ps, const Gddr__Request *rq, uint64_t session)
{
    if (rq->observer || rq->rank >= (uint32_t)ps->cfg.max_workers || !session)
        return 0;
    ps_worker *w = &ps->workers[rq->rank];
    if (w->session != session || w->state == PS_W_NONE || w->state == PS_W_LEFT)
        return 0;
    w->last_seen_ms = gddr__now_ms();
    if (w->state == PS_W_DEAD) {
        /* Declared dead but only slow: the same process is back. */
        w->state = PS_W_LIVE;
        ps->rejoins++;
        gddr_log(GDDR_LOG_INFO, "worker %u rejoined: it was declared dead but was only slow", rq->rank);
        ps_membership_changed(ps);
    }
    return 1;
}

void ps_worker_left(gddr_ps *ps, uint32_t rank)
{
    ps_worker *w = &ps->workers[rank];
    if (w->state != PS_W_LIVE)
        return;
    w->state = PS_W_LEFT;
    gddr_log(GDDR_LOG_INFO, "worker %u left after %llu pushes", rank, (unsigned long long)w->pushes);
    ps_snapshot_worker_died(ps, (int)rank);
    ps_membership_changed(ps);
}

void ps_worker_declare_dead(gddr_ps *ps, int r)
{
    ps_worker *w = &ps->workers[r];
    if (w->state != PS_W_LIVE)
        return;
    w->state = PS_W_DEAD;
    w->restored = 0;
    ps->deaths++;
    if (ps->log_event)
        ps->log_event(ps, PS_PLOG_EV_DEAD, (uint32_t)r, 0);
    ps_snapshot_worker_died(ps, r);
}

int ps_workers_check(gddr_ps *ps)
{
    int64_t now = gddr__now_ms();
    int64_t limit = (int64_t)(ps->cfg.worker_timeout_s * 1000);
    int changed = 0;
    for (int r = 0; r < ps->cfg.max_workers; r++) {
        ps_worker *w = &ps->workers[r];
        if (w->state == PS_W_LIVE && now - w->last_seen_ms > limit) {
            gddr_log(GDDR_LOG_WARN, "worker %d declared dead: silent for %.1f s", r,
                     (double)(now - w->last_seen_ms) / 1000.0);
            ps_worker_declare_dead(ps, r);
            changed = 1;
        }
    }
    return changed;
}

void ps_workers_free(gddr_ps *ps)
{
    for (int r = 0; ps->workers && r < ps->cfg.max_workers; r++) {
        free(ps->workers[r].wt);
        ps_pviews_free(&ps->workers[r]);
        ps_fill_free_worker(ps, &ps->workers[r]);
    }
    free(ps->workers);
    ps->workers = NULL;
}
