/* auth.c -- who may talk to gddr-ps (docs/design.md section 8).
 *
 * With curve_secret_key_file set, the ROUTER is a CURVE server: traffic is
 * encrypted and every client proves it holds a key pair. libzmq then asks
 * a ZAP handler (RFC 27, inproc://zeromq.zap.01) whether that client's
 * public key may connect; ours answers from the authorized_keys list and
 * names the key as the connection's User-Id, so every message of it can be
 * checked against that key's options (which ranks it may claim, whether it
 * is observer-only). The handler socket is polled by the front thread like
 * the ROUTER, so no lock guards the list, and SIGHUP re-reads it.
 *
 * Clients that never reach the ZAP handler -- a plaintext client, a client
 * with the wrong server key, anything that is not ZMTP -- fail the
 * handshake inside libzmq. A socket monitor reports those failures; they
 * are counted and logged (at most one line a second) like refused keys.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keys.h"
#include "log.h"
#include "ps.h"

#define MONITOR_EP "inproc://gddr-ps-monitor"

int ps_auth_reload(gddr_ps *ps)
{
    gddr__authkey *keys = NULL;
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

static int monitor_setup(gddr_ps *ps, char *err, size_t errlen)
{
    int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(ps->router, MONITOR_EP, events) != 0) {
        snprintf(err, errlen, "cannot monitor the socket: %s", zmq_strerror(errno));
        return GDDR_EIO;
    }
    ps->monitor = zmq_socket(ps->zctx, ZMQ_PAIR);
    int zero = 0;
    zmq_setsockopt(ps->monitor, ZMQ_LINGER, &zero, sizeof zero);
    if (!ps->monitor || zmq_connect(ps->monitor, MONITOR_EP) != 0) {
        snprintf(err, errlen, "cannot connect the socket monitor: %s", zmq_strerror(errno));
        return GDDR_EIO;
    }
    return GDDR_OK;
}

int ps_auth_setup(gddr_ps *ps, char *err, size_t errlen)
{
    int rc = monitor_setup(ps, err, errlen);
    if (rc != GDDR_OK || !ps->cfg.curve_secret_key_file[0])
        return rc;
    if (!zmq_has("curve")) {
        snprintf(err, errlen, "curve_secret_key_file is set but this libzmq has no CURVE support");
        return GDDR_ECONFIG;
    }
    char pub[GDDR_Z85_KEY], sec[GDDR_Z85_KEY], kerr[512];
    if (gddr__keyfile_read(ps->cfg.curve_secret_key_file, pub, sec, kerr, sizeof kerr) < 0) {
        snprintf(err, errlen, "key 'curve_secret_key_file': %s", kerr);
        return GDDR_ECONFIG;
    }
    gddr__authkey *keys = NULL;
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

static const ps_key *find_key(gddr_ps *ps, const unsigned char *key)
{
    for (int i = 0; i < ps->nallow; i++)
        if (memcmp(ps->allow[i].key, key, 32) == 0)
            return &ps->allow[i];
    return NULL;
}

const ps_key *ps_auth_key(gddr_ps *ps, const char *uid)
{
    if (!ps->zap || !uid || strlen(uid) != 40)
        return NULL;
    for (int i = 0; i < ps->nallow; i++)
        if (strcmp(ps->allow[i].z85, uid) == 0)
            return &ps->allow[i];
    return NULL;
}

/* One ZAP request: version, request id, domain, address, identity,
 * mechanism, credentials...; for CURVE the credential is the client's
 * 32-byte public key. */
void ps_auth_poll(gddr_ps *ps)
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
        const ps_key *k = NULL;
        char who[64] = "?";
        if (n >= 7 && zmq_msg_size(&part[5]) == 5 && memcmp(zmq_msg_data(&part[5]), "CURVE", 5) == 0 &&
            zmq_msg_size(&part[6]) == 32) {
            k = find_key(ps, zmq_msg_data(&part[6]));
            zmq_z85_encode(who, zmq_msg_data(&part[6]), 32);
        }
        if (!k) {
            ps->auth_rejected++;
            char addr[64] = "";
            if (n >= 4) {
                size_t l = zmq_msg_size(&part[3]) < sizeof addr - 1 ? zmq_msg_size(&part[3]) : sizeof addr - 1;
                memcpy(addr, zmq_msg_data(&part[3]), l);
                addr[l] = 0;
            }
            ps_log_refusal(ps, "refused a connection from %s: key %s is not in authorized_keys", addr, who);
        }
        /* Reply: version, request id, status code, text, user id, metadata. */
        const char *code = k ? "200" : "400", *text = k ? "OK" : "key not authorized";
        zmq_send(ps->zap, "1.0", 3, ZMQ_SNDMORE);
        if (n >= 2)
            zmq_send(ps->zap, zmq_msg_data(&part[1]), zmq_msg_size(&part[1]), ZMQ_SNDMORE);
        else
            zmq_send(ps->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(ps->zap, code, 3, ZMQ_SNDMORE);
        zmq_send(ps->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(ps->zap, k ? who : "", k ? strlen(who) : 0, ZMQ_SNDMORE);
        zmq_send(ps->zap, "", 0, 0);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&part[i]);
    }
}

/* Monitor events: frame 1 is a 16-bit event and a 32-bit value, frame 2
 * the endpoint. Refused keys are counted by the ZAP handler already. */
void ps_monitor_poll(gddr_ps *ps)
{
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, ps->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        zmq_msg_init(&addr);
        if (zmq_msg_more(&ev))
            zmq_msg_recv(&addr, ps->monitor, 0);
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (char *)zmq_msg_data(&ev) + 2, 4);
        }
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
            /* A peer that went away mid-handshake (EPIPE, ECONNRESET): a
             * client closing early, not an attack or a misconfiguration. */
            gddr_log(GDDR_LOG_DEBUG, "a connection closed during the handshake (errno %u)", value);
        } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
            ps->handshake_failed++;
            const char *why = "";
            if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
                why = ps->zap ? " (a client without CURVE?)" : " (a client with CURVE?)";
            else if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
                why = " (a client with the wrong server key?)";
            ps_log_refusal(ps, "a connection failed the handshake: protocol error 0x%x%s", value, why);
        }
        zmq_msg_close(&addr);
        zmq_msg_close(&ev);
    }
}

void ps_auth_close(gddr_ps *ps)
{
    if (ps->zap)
        zmq_close(ps->zap);
    ps->zap = NULL;
    if (ps->monitor)
        zmq_close(ps->monitor);
    ps->monitor = NULL;
    free(ps->allow);
    ps->allow = NULL;
}
