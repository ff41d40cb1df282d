/* auth.c -- who may talk to gddr-ps (DESIGN section 8).
 *
 * With curve_secret_key_file set, the ROUTER is a CURVE server: traffic is
 * encrypted and every client proves it holds a key pair. libzmq then asks
 * a ZAP handler (RFC 27, inproc://zeromq.zap.01) whether that client's
 * public key may connect; ours answers from the authorized_keys list. The
 * handler socket is polled by the front thread like the ROUTER, so no lock
 * guards the list, and SIGHUP re-reads it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keys.h"
#include "log.h"
#include "ps.h"

int gddr_ps_auth_reload(gddr_ps *ps)
{
    unsigned char(*keys)[32] = NULL;
    char err[512];
    int n = gddr__authorized_keys_read(ps->cfg.authorized_keys, &keys, err, sizeof err);
    if (n < 0) {
        gddr_log(GDDR_LOG_ERROR, "authorized_keys: %s (keeping the old list)", err);
        return -1;
    }
    free(ps->allow);
    ps->allow = keys;
    ps->nallow = n;
    gddr_log(GDDR_LOG_INFO, "authorized_keys: %d client key(s) from %s", n, ps->cfg.authorized_keys);
    return 0;
}

int gddr_ps_auth_setup(gddr_ps *ps, char *err, size_t errlen)
{
    if (!ps->cfg.curve_secret_key_file[0])
        return GDDR_OK;
    if (!zmq_has("curve")) {
        snprintf(err, errlen, "curve_secret_key_file is set but this libzmq has no CURVE support");
        return GDDR_ECONFIG;
    }
    char pub[GDDR_Z85_KEY], sec[GDDR_Z85_KEY], kerr[512];
    if (gddr__keyfile_read(ps->cfg.curve_secret_key_file, pub, sec, kerr, sizeof kerr) < 0) {
        snprintf(err, errlen, "key 'curve_secret_key_file': %s", kerr);
        return GDDR_ECONFIG;
    }
    unsigned char(*keys)[32] = NULL;
    int n = gddr__authorized_keys_read(ps->cfg.authorized_keys, &keys, kerr, sizeof kerr);
    if (n < 0) {
        snprintf(err, errlen, "key 'authorized_keys': %s", kerr);
        return GDDR_ECONFIG;
    }
    ps->allow = keys;
    ps->nallow = n;
    /* The handler must be bound before the ROUTER accepts anyone. */
    ps->zap = zmq_socket(ps->zctx, ZMQ_REP);
    int zero = 0, one = 1;
    zmq_setsockopt(ps->zap, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(ps->zap, "inproc://zeromq.zap.01") != 0) {
        snprintf(err, errlen, "cannot bind the ZAP handler: %s", zmq_strerror(errno));
        return GDDR_EIO;
    }
    zmq_setsockopt(ps->router, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(ps->router, ZMQ_CURVE_SECRETKEY, sec, 40);
    zmq_setsockopt(ps->router, ZMQ_ZAP_DOMAIN, "gddr", 4);
    memset(sec, 0, sizeof sec);
    gddr_log(GDDR_LOG_INFO, "CURVE on: server public key %s, %d authorized client key(s)", pub, n);
    return GDDR_OK;
}

/* One ZAP request: version, request id, domain, address, identity,
 * mechanism, credentials...; for CURVE the credential is the client's
 * 32-byte public key. */
void gddr_ps_auth_poll(gddr_ps *ps)
{
    for (;;) {
        zmq_msg_t part[8];
        int n = 0, more = 1;
        while (more) {
            zmq_msg_t scratch, *m = n < 8 ? &part[n] : &scratch;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, ps->zap, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(m);
                for (int i = 0; i < n; i++)
                    zmq_msg_close(&part[i]);
                return;
            }
            more = zmq_msg_more(m);
            if (m == &scratch)
                zmq_msg_close(m);
            else
                n++;
        }
        int ok = 0;
        char who[64] = "?";
        if (n >= 7 && zmq_msg_size(&part[5]) == 5 && memcmp(zmq_msg_data(&part[5]), "CURVE", 5) == 0 &&
            zmq_msg_size(&part[6]) == 32) {
            const unsigned char *key = zmq_msg_data(&part[6]);
            for (int i = 0; i < ps->nallow && !ok; i++)
                ok = memcmp(ps->allow[i], key, 32) == 0;
            zmq_z85_encode(who, key, 32);
        }
        if (!ok) {
            ps->auth_rejected++;
            char addr[64] = "";
            if (n >= 4) {
                size_t l = zmq_msg_size(&part[3]) < sizeof addr - 1 ? zmq_msg_size(&part[3]) : sizeof addr - 1;
                memcpy(addr, zmq_msg_data(&part[3]), l);
                addr[l] = 0;
            }
            gddr_log(GDDR_LOG_WARN, "refused a connection from %s: key %s is not in authorized_keys", addr, who);
        }
        /* Reply: version, request id, status code, text, user id, metadata. */
        const char *code = ok ? "200" : "400", *text = ok ? "OK" : "key not authorized";
        zmq_send(ps->zap, "1.0", 3, ZMQ_SNDMORE);
        if (n >= 2)
            zmq_send(ps->zap, zmq_msg_data(&part[1]), zmq_msg_size(&part[1]), ZMQ_SNDMORE);
        else
            zmq_send(ps->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(ps->zap, code, 3, ZMQ_SNDMORE);
        zmq_send(ps->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(ps->zap, ok ? who : "", ok ? strlen(who) : 0, ZMQ_SNDMORE);
        zmq_send(ps->zap, "", 0, 0);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&part[i]);
    }
}

void gddr_ps_auth_close(gddr_ps *ps)
{
    if (ps->zap)
        zmq_close(ps->zap);
    ps->zap = NULL;
    free(ps->allow);
    ps->allow = NULL;
}
