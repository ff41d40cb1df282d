/* shard_fan.c -- the sharded client's fan-out (shard.h): one thread per
 * server but the first, which runs on the caller, so that a call talks to
 * every server at once. A call hands each thread fn(c, s, arg) under the
 * lock and waits until every shard is done.
 */
#include <pthread.h>
#include <stdlib.h>

#include "shard.h"

struct shard_thread {
    gddr_client *c;
    int s;
};

static void *shard_main(void *arg)
{
    struct shard_thread *a = arg;
    gddr_client *c = a->c;
    int s = a->s;
    free(a);
    gddr__shards *h = c->shards;
    uint64_t seen = 0;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->gen == seen && !h->stop)
            pthread_cond_wait(&h->go, &h->mu);
        if (h->stop)
            break;
        seen = h->gen;
        pthread_mutex_unlock(&h->mu);
        int rc = h->fn(c, s, h->arg);
        pthread_mutex_lock(&h->mu);
        h->rc[s] = rc;
        if (--h->busy == 0)
            pthread_cond_signal(&h->done);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

int gddr__fan(gddr_client *c, int (*fn)(gddr_client *, int, void *), void *arg)
{
    gddr__shards *h = c->shards;
    pthread_mutex_lock(&h->mu);
    h->fn = fn;
    h->arg = arg;
    h->busy = h->S - 1;
    h->gen++;
    pthread_cond_broadcast(&h->go);
    pthread_mutex_unlock(&h->mu);
    h->rc[0] = fn(c, 0, arg);
    pthread_mutex_lock(&h->mu);
    while (h->busy > 0)
        pthread_cond_wait(&h->done, &h->mu);
    pthread_mutex_unlock(&h->mu);
    for (int s = 0; s < h->S; s++)
        if (h->rc[s] != GDDR_OK)
            return gddr__set_err(c, h->rc[s], "shard %d (%s): %s", s, h->ep[s],
                                 h->sub[s] ? h->sub[s]->errmsg
                                 : h->why[s][0] ? h->why[s] : gddr_strerror(h->rc[s]));
    return GDDR_OK;
}

int gddr__fan_start(gddr_client *c, int rc)
{
    gddr__shards *h = c->shards;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->go, NULL);
    pthread_cond_init(&h->done, NULL);
    for (int s = 1; rc == GDDR_OK && s < h->S; s++) {
        struct shard_thread *a = malloc(sizeof *a);
        if (a) {
            a->c = c;
            a->s = s;
        }
        if (!a || pthread_create(&h->th[s - 1], NULL, shard_main, a) != 0) {
            free(a);
            /* the threads started so far are joined by gddr__fan_stop */
            h->S = s;
            rc = GDDR_ENOMEM;
            break;
        }
    }
    return rc;
}

void gddr__fan_stop(gddr__shards *h)
{
    if (h->th) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->go);
        pthread_mutex_unlock(&h->mu);
        for (int s = 1; s < h->S; s++)
            pthread_join(h->th[s - 1], NULL);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->go);
    pthread_cond_destroy(&h->done);
}
