/* heartbeat.c -- tells gddr-ps this worker is alive while the trainer is
 * busy elsewhere.
 *
 * The server declares a worker dead after worker_timeout_s without a
 * message from it; a trainer computing a long step sends none. So a small
 * thread with a socket of its own (ZeroMQ sockets are not shared between
 * threads) sends a Heartbeat every heartbeat_ms and drops the replies. It
 * proves the process is alive, not that it makes progress: a trainer stuck
 * in a deadlock keeps its heartbeat, as in ps-lite.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "client_int.h"

struct heartbeat {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    void *sock;
    int ms;
    uint32_t rank;
    uint64_t session;
    uint64_t sent;
};

static void *hb_main(void *arg)
{
    struct heartbeat *hb = arg;
    uint64_t req = 1ull << 63; /* its own id space; nobody waits for these */
    pthread_mutex_lock(&hb->mu);
    while (!hb->stop) {
        struct timespec until;
        /* Monotonic: a wall-clock step back must not stall heartbeats
         * (and get a healthy worker declared dead). */
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += hb->ms / 1000;
        until.tv_nsec += (long)(hb->ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!hb->stop && pthread_cond_timedwait(&hb->cv, &hb->mu, &until) != ETIMEDOUT)
            ;
        if (hb->stop)
            break;
        pthread_mutex_unlock(&hb->mu);
        Gddr__Request rq = GDDR__REQUEST__INIT;
        Gddr__Heartbeat h = GDDR__HEARTBEAT__INIT;
        rq.protocol = GDDR__CONST__PROTOCOL_VERSION;
        rq.req_id = req++;
        rq.rank = hb->rank;
        rq.session = hb->session; /* only the worker's own session keeps it alive */
        rq.body_case = GDDR__REQUEST__BODY_HEARTBEAT;
        rq.heartbeat = &h;
        if (gddr__send(hb->sock, NULL, &rq.base, NULL, 0) >= 0)
            hb->sent++;
        gddr__frames f;
        while (gddr__frames_recv(hb->sock, &f, ZMQ_DONTWAIT) >= 0)
            gddr__frames_close(&f); /* acks */
        pthread_mutex_lock(&hb->mu);
    }
    pthread_mutex_unlock(&hb->mu);
    return NULL;
}

int gddr__heartbeat_start(gddr_client *c)
{
    struct heartbeat *hb = calloc(1, sizeof *hb);
    if (!hb)
        return gddr__set_err(c, GDDR_ENOMEM, "no memory for the heartbeat");
    int rc = gddr__socket_new(c, &hb->sock, NULL);
    if (rc != GDDR_OK) {
        free(hb);
        return rc;
    }
    /* A heartbeat must never block the thread (and so close): if the
     * server is gone long enough to fill the queue, drop it. */
    int sndtimeo = 100;
    zmq_setsockopt(hb->sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    hb->ms = c->o.heartbeat_ms;
    hb->rank = (uint32_t)c->info.rank;
    hb->session = c->session;
    pthread_mutex_init(&hb->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&hb->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&hb->th, NULL, hb_main, hb) != 0) {
        zmq_close(hb->sock);
        free(hb);
        return gddr__set_err(c, GDDR_ENOMEM, "cannot start the heartbeat thread");
    }
    c->hb = hb;
    return GDDR_OK;
}

void gddr__heartbeat_stop(gddr_client *c)
{
    struct heartbeat *hb = c->hb;
    if (!hb)
        return;
    pthread_mutex_lock(&hb->mu);
    hb->stop = 1;
    pthread_cond_signal(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
    pthread_join(hb->th, NULL);
    zmq_close(hb->sock);
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->cv);
    free(hb);
    c->hb = NULL;
}
