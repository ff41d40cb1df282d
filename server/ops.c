/* ops.c -- what operators touch: SIGHUP reload and the metrics endpoint.
 *
 * Reload re-reads the config file and takes only the keys marked
 * reloadable in the table (learning rate, AdaDelay, tau bounds, alarms,
 * log level...); a file that no longer parses is refused whole and the old
 * values stay. The metrics endpoint is a ZMQ_STREAM socket speaking just
 * enough HTTP/1.0 for a Prometheus scrape: any request gets the text page.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "snapshot.h"
#include "table_wire.h"

char *ps_metrics_page(gddr_ps *ps)
{
    char *dense = ps_metrics_text(ps), *tables = ps_tables_metrics_text(ps);
    size_t a = dense ? strlen(dense) : 0, b = tables ? strlen(tables) : 0;
    char *page = dense && tables ? realloc(dense, a + b + 1) : NULL;
    if (page)
        memcpy(page + a, tables, b + 1);
    else
        free(dense);
    free(tables);
    return page;
}

/* The file's settings (and the command line's, which win) in *fresh; -1
 * with the reason logged when they do not read, apply or validate. */
static int reload_read(gddr_ps *ps, gddr_ps_config *fresh)
{
    char err[512];
    if (!ps->cfg_path[0]) {
        gddr_log(GDDR_LOG_WARN, "SIGHUP: no config file to reload");
        return -1;
    }
    if (ps_config_read(fresh, ps->cfg_path, err, sizeof err) < 0)
        goto refused;
    /* The command line still wins over the file, as it did at start. */
    for (int i = 0; i < ps->noverrides; i++)
        if (ps_config_apply_override(fresh, ps->overrides[i], err, sizeof err) < 0)
            goto refused;
    if (ps_config_validate(fresh, ps->cfg_path, err, sizeof err) < 0)
        goto refused;
    return 0;
refused:
    gddr_log(GDDR_LOG_ERROR, "SIGHUP: keeping the old settings: %s", err);
    return -1;
}

void ps_reload(gddr_ps *ps)
{
    gddr_ps_config fresh;
    if (reload_read(ps, &fresh) < 0) {
        ps->reload_failures++;
        return;
    }
    int changed = 0, afill = ps->cfg.async_fill;
    for (const gddr__conf_key *k = ps_conf_table; k->name; k++) {
        char a[GDDR_CONF_STRMAX + 32], b[GDDR_CONF_STRMAX + 32];
        gddr__conf_format(k, &ps->cfg, a, sizeof a);
        gddr__conf_format(k, &fresh, b, sizeof b);
        if (strcmp(a, b) == 0)
            continue;
        if (!k->reloadable) {
            gddr_log(GDDR_LOG_WARN, "SIGHUP: '%s' changed (%s -> %s) but needs a restart", k->name, a, b);
            continue;
        }
        char e2[256];
        gddr__conf_set(ps_conf_table, &ps->cfg, k->section, k->name, b, e2, sizeof e2);
        gddr_log(GDDR_LOG_INFO, "SIGHUP: %s = %s (was %s)", k->name, b, a);
        changed++;
    }
    gddr__log_global.level = ps->cfg.log_level;
    if (ps->zap)
        ps_auth_reload(ps);
    /* Keep every tensor's tau inside the new bounds. */
    for (size_t i = 0; i < ps->ntensors; i++) {
        ps_tensor *t = ps->tensors[i];
        if (t->tau < ps->cfg.tau_min)
            t->tau = (int)ps->cfg.tau_min;
        if (t->tau > ps->cfg.tau_max)
            t->tau = (int)ps->cfg.tau_max;
    }
    /* moment keeps no fresh values: after a switch either way, what recent
     * would find is from before it. A held chunk then waits until the chunk
     * is next sent fresh. (Sync steps keep their own sums there: untouched.) */
    if (ps->cfg.async_fill != afill && ps_tensor_mode(ps, NULL) != GDDR_PS_MODE_SYNC)
        ps_tensor_fresh_reset(ps);
    ps->reloads++;
    gddr_log(GDDR_LOG_INFO, "SIGHUP: reloaded %s, %d key(s) changed", ps->cfg_path, changed);
}

int ps_metrics_open(gddr_ps *ps, char *err, size_t errlen)
{
    if (!ps->cfg.metrics_listen[0])
        return GDDR_OK;
    ps->metrics = zmq_socket(ps->zctx, ZMQ_STREAM);
    int zero = 0;
    zmq_setsockopt(ps->metrics, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(ps->metrics, ps->cfg.metrics_listen) != 0) {
        snprintf(err, errlen, "cannot bind metrics_listen %s: %s", ps->cfg.metrics_listen,
                 zmq_strerror(errno));
        return GDDR_EIO;
    }
    char ep[256];
    size_t len = sizeof ep;
    zmq_getsockopt(ps->metrics, ZMQ_LAST_ENDPOINT, ep, &len);
    gddr_log(GDDR_LOG_INFO, "metrics on http://%s/metrics", ep + 6);
    return GDDR_OK;
}

/* A ZMQ_STREAM socket delivers [peer id, bytes]; an empty data frame means
 * a connect or a disconnect. We answer the first data of a connection with
 * the whole page and close it (HTTP/1.0, Connection: close). */
void ps_metrics_poll(gddr_ps *ps)
{
    for (int i = 0; i < 64; i++) {
        zmq_msg_t id, data;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, ps->metrics, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return;
        }
        zmq_msg_init(&data);
        zmq_msg_recv(&data, ps->metrics, 0);
        size_t dlen = zmq_msg_size(&data);
        if (dlen > 0) {
            char *body = ps_metrics_page(ps);
            size_t blen = body ? strlen(body) : 0;
            char head[256];
            int hl = snprintf(head, sizeof head,
                              "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                              "Content-Length: %zu\r\nConnection: close\r\n\r\n", blen);
            size_t total = (size_t)hl + blen;
            char *resp = malloc(total);
            if (resp) {
                memcpy(resp, head, (size_t)hl);
                if (blen)
                    memcpy(resp + hl, body, blen);
                zmq_send(ps->metrics, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
                zmq_send(ps->metrics, resp, total, 0);
                /* An empty frame to the peer closes the connection. */
                zmq_send(ps->metrics, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
                zmq_send(ps->metrics, "", 0, 0);
                free(resp);
            }
            free(body);
        }
        zmq_msg_close(&data);
        zmq_msg_close(&id);
    }
}
