/* options.c -- client options from an INI file ([client] section) and the
 * rank and world size from the launcher's environment. The table below is
 * the one place a client key is defined (README's reference comes from
 * it too). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "conf.h"

typedef struct client_conf {
    char server[GDDR_CONF_STRMAX], servers[GDDR_CONF_STRMAX];
    long long rank, world_size, timeout_ms, reconnect_timeout_ms, connect_timeout_ms, residual_checkpoint_steps;
    double clip_norm, dc_lambda, dc_ms_decay, delay_fraction, replay_decay, pull_delay_fraction;
    int dc_mode, dc_adaptive, log_level;
    long long seed;
    char curve_server_key[GDDR_CONF_STRMAX], curve_key_file[GDDR_CONF_STRMAX];
    long long heartbeat_ms, part_bytes, accumulate_steps;
    int pull_delta_bits;
} client_conf;

static const char *const dc_modes[] = { "diag", "identity", NULL };
/* pull_delta_bits: the index is the option's value / 8 (0, 8, 16). */
static const char *const delta_bits[] = { "0", "8", "16", NULL };
static const char *const levels[] = { "error", "warn", "info", "debug", NULL };

#define OFF(f) offsetof(client_conf, f)
const gddr__conf_key gddr__client_conf_table[] = {
    { "client", "server", GDDR_CONF_STRING, OFF(server), "tcp://127.0.0.1:5555", 0, 0, NULL, 0,
      "endpoint of gddr-ps (or several, comma-separated, in shard order)" },
    { "client", "servers", GDDR_CONF_STRING, OFF(servers), "", 0, 0, NULL, 0,
      "a model sharded over several gddr-ps: their endpoints, comma-separated, in shard order "
      "(wins over server)" },
    { "client", "rank", GDDR_CONF_INT, OFF(rank), "-1", -1, 65535, NULL, 0,
      "worker rank; -1 = GDDR_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or RANK" },
    { "client", "world_size", GDDR_CONF_INT, OFF(world_size), "0", 0, 65536, NULL, 0,
      "workers in the job; 0 = GDDR_WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE or WORLD_SIZE" },
    { "client", "timeout_ms", GDDR_CONF_INT, OFF(timeout_ms), "5000", 1, 3600000, NULL, 0,
      "bound on every wait for a reply" },
    { "client", "reconnect_timeout_ms", GDDR_CONF_INT, OFF(reconnect_timeout_ms), "30000", 0,
      86400000, NULL, 0, "how long to keep retrying a lost or restarted server" },
    { "client", "connect_timeout_ms", GDDR_CONF_INT, OFF(connect_timeout_ms), "-1", -1, 86400000, NULL,
      0, "how long opening waits for a server not there (yet); -1 = reconnect_timeout_ms" },
    { "client", "clip_norm", GDDR_CONF_DOUBLE, OFF(clip_norm), "0", 0, 1e30, NULL, 0,
      "clip the gradient to this global L2 norm; 0 = off" },
    { "client", "dc_lambda", GDDR_CONF_DOUBLE, OFF(dc_lambda), "0", 0, 1e6, NULL, 0,
      "DC-ASGD lambda (lambda0 when adaptive); 0 = off" },
    { "client", "dc_mode", GDDR_CONF_ENUM, OFF(dc_mode), "diag", 0, 0, dc_modes, 0,
      "diag: g + lambda*g*g*(w'-w_bak); identity: g + lambda*(w'-w_bak)" },
    { "client", "dc_adaptive", GDDR_CONF_BOOL, OFF(dc_adaptive), "false", 0, 0, NULL, 0,
      "lambda_t = lambda0 / sqrt(ms + eps), ms an EMA of g*g (DC-ASGD-a)" },
    { "client", "dc_ms_decay", GDDR_CONF_DOUBLE, OFF(dc_ms_decay), "0.95", 0, 0.999999, NULL, 0,
      "EMA factor of g*g for adaptive DC" },
    { "client", "delay_fraction", GDDR_CONF_DOUBLE, OFF(delay_fraction), "0", 0, 0.99, NULL, 0,
      "GDDR alpha: probability a chunk is held in the residual; 0 = dense pushes" },
    { "client", "seed", GDDR_CONF_INT, OFF(seed), "12345", 0, 9.2e18, NULL, 0,
      "seed of the GDDR hold mask" },
    { "client", "residual_checkpoint_steps", GDDR_CONF_INT, OFF(residual_checkpoint_steps), "0",
      0, 1000000, NULL, 0, "attach the held residual to a push every N steps; 0 = never" },
    { "client", "replay_decay", GDDR_CONF_DOUBLE, OFF(replay_decay), "0.5", 0.01, 1, NULL, 0,
      "gamma of orphan installments" },
    { "client", "log_level", GDDR_CONF_ENUM, OFF(log_level), "warn", 0, 0, levels, 0,
      "library log level (needs a logger callback)" },
    { "client", "curve_server_key", GDDR_CONF_STRING, OFF(curve_server_key), "", 0, 0, NULL, 0,
      "the server's CURVE public key (Z85, from its .pub file); empty = no encryption" },
    { "client", "curve_key_file", GDDR_CONF_STRING, OFF(curve_key_file), "", 0, 0, NULL, 0,
      "this client's key file from gddr-keygen (NAME.key, mode 600)" },
    { "client", "heartbeat_ms", GDDR_CONF_INT, OFF(heartbeat_ms), "2000", 0, 3600000, NULL, 0,
      "a library thread tells the server this worker is alive this often; 0 = off" },
    { "client", "part_bytes", GDDR_CONF_INT, OFF(part_bytes), "4194304", 0, 1e12, NULL, 0,
      "tensors larger than this travel in parts of at most this many bytes; 0 = whole" },
    { "client", "accumulate_steps", GDDR_CONF_INT, OFF(accumulate_steps), "1", 1, 1000000, NULL, 0,
      "push the mean of every k gradients (gradient accumulation); 1 = every step" },
    { "client", "pull_delay_fraction", GDDR_CONF_DOUBLE, OFF(pull_delay_fraction), "0", 0, 0.99, NULL, 0,
      "GDDR on pulls: hold back a changed chunk with this probability, at most tau pulls; 0 = whole pulls" },
    { "client", "pull_delta_bits", GDDR_CONF_ENUM, OFF(pull_delta_bits), "0", 0, 0, delta_bits, 0,
      "pulls carry 8- or 16-bit differences from the worker's view (error kept on the server); 0 = float32" },
    { NULL, NULL, 0, 0, NULL, 0, 0, NULL, 0, NULL },
};

/* Strings from the file live here until gddr_client_open copies them. */
static __thread char curve_server_buf[GDDR_CONF_STRMAX], curve_file_buf[GDDR_CONF_STRMAX];

int gddr__opts_from_ini(const char *path, gddr_client_opts *o, char *strbuf, size_t buflen,
                        char *err, size_t errlen)
{
    client_conf cc;
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
