/* config.h -- gddr-ps settings: one struct, one table (config.c). */
#ifndef GDDR_SERVER_CONFIG_H
#define GDDR_SERVER_CONFIG_H

#include "conf.h"

enum { GDDR_PS_MODE_ASYNC = 0, GDDR_PS_MODE_SYNC = 1, GDDR_PS_MODE_SSP = 2 };

typedef struct gddr_ps_config {
    /* [server] */
    char listen[GDDR_CONF_STRMAX];
    char endpoint_file[GDDR_CONF_STRMAX];
    long long threads;
    long long chunk;
    long long max_message_bytes;
    long long max_tensors;
    long long max_workers;
    long long pull_wait_max_ms;
    int log_level;
    char metrics_listen[GDDR_CONF_STRMAX];
    long long max_queued_reply_bytes;
    long long max_parked_pulls;
    long long max_snapshot_bytes;
    long long max_pull_view_bytes;
    long long max_fill_bytes;
    int allow_register;
    long long shard_index;
    long long shard_count;
    long long max_tables;
    long long max_table_rows;
    long long max_table_bytes;
    /* [consistency] */
    int mode;
    long long workers;
    long long sync_quorum;
    long long staleness_bound;
    long long async_warmup_steps;
    double worker_timeout_s;
    double sync_stall_s;
    int fill_held;
    int async_fill;    /* PS_AFILL_* (ps.h): what stands in for an async held chunk */
    /* [optimizer] */
    int opt_kind;      /* PS_OPT_* (ps.h) */
    double lr;
    double adadelay;
    double momentum;
    double beta1, beta2, eps, weight_decay;
    double max_grad_norm;
    /* [staleness] */
    double staleness_alarm;
    double staleness_ema_decay;
    /* [tau] */
    long long tau_init, tau_min, tau_max;
    double tau_rate_high, tau_rate_low, tau_ema;
    long long tau_patience;
    int tau_dynamic;
    /* [checkpoint] */
    char checkpoint_dir[GDDR_CONF_STRMAX];
    double checkpoint_interval_s;
    long long checkpoint_keep;
    int checkpoint_allow_empty;
    /* [durability] */
    int push_log;              /* PS_PLOG_OFF, _BATCH, _ALWAYS */
    long long push_log_window_ms;
    /* [security] */
    char curve_secret_key_file[GDDR_CONF_STRMAX];
    char authorized_keys[GDDR_CONF_STRMAX];
    /* Where each key of ps_conf_table got its value: the file's line,
     * GDDR_CONF_FROM_SET or GDDR_CONF_FROM_DEFAULT (errors name it). */
    int line[GDDR_CONF_MAXKEYS];
    int curve_key_from_credential; /* curve_secret_key_file is a systemd credential */
} gddr_ps_config;

/* A systemd credential (LoadCredential=NAME:PATH) by this name stands in for
 * curve_secret_key_file: gddr-ps reads $CREDENTIALS_DIRECTORY/NAME. */
#define GDDR_PS_CURVE_CREDENTIAL "curve_secret_key_file"

extern const gddr__conf_key ps_conf_table[];

/* Defaults, then the file (path may be NULL), then validation across keys.
 * Returns 0 or -1 with a message in err. */
int ps_config_load(gddr_ps_config *cfg, const char *path, char *err, size_t errlen);
/* Defaults, the file and the CURVE credential, without the cross-key checks
 * (for callers that apply overrides before validating). */
int ps_config_read(gddr_ps_config *cfg, const char *path, char *err, size_t errlen);
/* Applies one command-line override, "key=value" or "section.key=value". */
int ps_config_apply_override(gddr_ps_config *cfg, const char *kv, char *err, size_t errlen);
/* Cross-key checks (tau_min <= tau_init <= tau_max, ...). Errors name the
 * file and line (or --set) that gave the key. */
int ps_config_validate(const gddr_ps_config *cfg, const char *path, char *err, size_t errlen);
/* What the daemon will need from the file system: checkpoint_dir a
 * writable directory (or one it can create), endpoint_file and an ipc://
 * listen in writable directories, the key files readable. */
int ps_config_check_paths(const gddr_ps_config *cfg, const char *path, char *err,
                               size_t errlen);
/* "FILE:LINE", "--set" or "FILE" (a default): where key got its value. */
const char *ps_config_where(const gddr_ps_config *cfg, const char *path, const char *key,
                                 char *buf, size_t len);

#endif
