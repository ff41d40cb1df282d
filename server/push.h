/* push.h -- the Push request (push.c), for the front end (server.c). */
#ifndef GDDR_SERVER_PUSH_H
#define GDDR_SERVER_PUSH_H

#include "ps.h"

/* Serves a Push from a worker that owns its rank (dispatch checked it):
 * answers it, or refuses it with a reply that says why, and returns that
 * gddr_err. */
int ps_on_push(gddr_ps *ps, zmq_msg_t *ident, const Gddr__Request *rq, gddr__frames *f);

#endif
