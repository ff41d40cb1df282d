/* client_conf.h -- the [client] section of an INI file: its key table and
 * the struct the table fills.
 *
 * The client library reads it (client/src/options.c turns it into a
 * gddr_client_opts); gddr-ps prints it with its own keys (--dump-config
 * --markdown, the README's reference). It lives below both, so the daemon
 * links no client code to print it. The table is the one place a client
 * key is defined.
 */
#ifndef GDDR_COMMON_CLIENT_CONF_H
#define GDDR_COMMON_CLIENT_CONF_H

#include "conf.h"

typedef struct gddr__client_conf {
    char server[GDDR_CONF_STRMAX], servers[GDDR_CONF_STRMAX];
    long long rank, world_size, timeout_ms, reconnect_timeout_ms, connect_timeout_ms, residual_checkpoint_steps;
    double clip_norm, dc_lambda, dc_ms_decay, delay_fraction, replay_decay, pull_delay_fraction;
    int dc_mode, dc_adaptive, log_level;
    long long seed;
    char curve_server_key[GDDR_CONF_STRMAX], curve_key_file[GDDR_CONF_STRMAX];
    long long heartbeat_ms, part_bytes, accumulate_steps;
    int pull_delta_bits;
} gddr__client_conf;

/* Every [client] key, ended by a row of NULLs. */
extern const gddr__conf_key gddr__client_conf_table[];

#endif
