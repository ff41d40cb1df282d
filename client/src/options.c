/* options.c -- client options from an INI file ([client] section, read
 * with the key table of common/client_conf.c) and the rank and world size
 * from the launcher's environment. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_conf.h"
#include "client_int.h"
#include "conf.h"

/* Strings from the file live here until gddr_client_open copies them. */
static __thread char curve_server_buf[GDDR_CONF_STRMAX], curve_file_buf[GDDR_CONF_STRMAX];

int gddr__opts_from_ini(const char *path, gddr_client_opts *o, char *strbuf, size_t buflen,
                        char *err, size_t errlen)
{
    gddr__client_conf cc;
    memset(&cc, 0, sizeof cc);
    if (gddr__conf_defaults(gddr__client_conf_table, &cc, err, errlen) < 0 ||
        gddr__conf_load(gddr__client_conf_table, &cc, path, err, errlen) < 0)
        return GDDR_ECONFIG;
    snprintf(strbuf, buflen, "%s", cc.servers[0] ? cc.servers : cc.server);
    o->server = strbuf;
    o->rank = (int)cc.rank;
    o->world_size = (int)cc.world_size;
    o->timeout_ms = (int)cc.timeout_ms;
    o->reconnect_timeout_ms = (int)cc.reconnect_timeout_ms;
    o->connect_timeout_ms = (int)cc.connect_timeout_ms;
    o->clip_norm = cc.clip_norm;
    o->dc_lambda = cc.dc_lambda;
    o->dc_mode = cc.dc_mode;
    o->dc_adaptive = cc.dc_adaptive;
    o->dc_ms_decay = cc.dc_ms_decay;
    o->delay_fraction = cc.delay_fraction;
    o->seed = (uint64_t)cc.seed;
    o->residual_checkpoint_steps = (int)cc.residual_checkpoint_steps;
    o->replay_decay = cc.replay_decay;
    o->log_level = cc.log_level;
    o->heartbeat_ms = (int)cc.heartbeat_ms;
    o->part_bytes = (uint64_t)cc.part_bytes;
    o->accumulate_steps = (int)cc.accumulate_steps;
    o->pull_delay_fraction = cc.pull_delay_fraction;
    o->pull_delta_bits = cc.pull_delta_bits * 8;
    if (cc.curve_server_key[0]) {
        snprintf(curve_server_buf, sizeof curve_server_buf, "%s", cc.curve_server_key);
        snprintf(curve_file_buf, sizeof curve_file_buf, "%s", cc.curve_key_file);
        o->curve_server_key = curve_server_buf;
        o->curve_key_file = curve_file_buf;
    }
    return GDDR_OK;
}

int gddr_client_open_ini(const char *path, const gddr_client_opts *overrides, gddr_client **out,
                         char *errbuf, size_t errlen)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    char server[GDDR_CONF_STRMAX];
    char dummy[8];
    if (!errbuf) {
        errbuf = dummy;
        errlen = sizeof dummy;
    }
    int rc = gddr__opts_from_ini(path, &o, server, sizeof server, errbuf, errlen);
    if (rc != GDDR_OK)
        return rc;
    if (overrides) {
        /* A field the caller changed from the defaults wins over the file. */
        const gddr_client_opts d = GDDR_CLIENT_OPTS_INIT;
#define OVR(f) if (overrides->f != d.f) o.f = overrides->f
        OVR(server); OVR(rank); OVR(world_size); OVR(timeout_ms); OVR(reconnect_timeout_ms);
        OVR(clip_norm); OVR(dc_lambda); OVR(dc_mode); OVR(dc_adaptive); OVR(dc_ms_decay);
        OVR(delay_fraction); OVR(seed); OVR(residual_checkpoint_steps); OVR(replay_decay);
        OVR(async_pipeline); OVR(log); OVR(log_user); OVR(log_level); OVR(observer);
        OVR(curve_server_key); OVR(curve_key_file); OVR(heartbeat_ms);
        OVR(part_bytes); OVR(accumulate_steps); OVR(pull_delay_fraction);
        OVR(pull_delta_bits); OVR(connect_timeout_ms);
#undef OVR
    }
    char why[512] = "";
    /* Its own message says why (the server's sentence when it refused). */
    rc = gddr__server_count(o.server) > 1 ? gddr__shards_open(&o, out, why, sizeof why)
                                          : gddr__client_open_shard(&o, 0, 0, out, why, sizeof why);
    if (rc != GDDR_OK)
        snprintf(errbuf, errlen, "cannot open a client to %s: %s", o.server, why[0] ? why : gddr_strerror(rc));
    return rc;
}

static int env_int(const char *const *names, int dflt)
{
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (!*end && x >= 0 && x < 1 << 20)
                return (int)x;
        }
    }
    return dflt;
}

int gddr__env_rank(void)
{
    static const char *const n[] = { "GDDR_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "RANK", NULL };
    return env_int(n, 0);
}

int gddr__env_world(void)
{
    static const char *const n[] = { "GDDR_WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE",
                                     "WORLD_SIZE", NULL };
    return env_int(n, 1);
}

void gddr_client_opts_init(gddr_client_opts *o)
{
    if (o)
        *o = (gddr_client_opts)GDDR_CLIENT_OPTS_INIT;
}
