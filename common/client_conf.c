/* client_conf.c -- see client_conf.h. */
#include "client_conf.h"

#include <stddef.h>

static const char *const dc_modes[] = { "diag", "identity", NULL };
/* pull_delta_bits: the index is the option's value / 8 (0, 8, 16). */
static const char *const delta_bits[] = { "0", "8", "16", NULL };
static const char *const levels[] = { "error", "warn", "info", "debug", NULL };

#define OFF(f) offsetof(gddr__client_conf, f)
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
      "GDDR alpha: the share of chunks held in the residual each step (whatever tau); 0 = dense pushes" },
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
