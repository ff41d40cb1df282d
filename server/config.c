/* config.c -- the table of every gddr-ps key: section, name, type, default,
 * bounds and one sentence of help. README's config reference (`make
 * config-table`, i.e. `gddr-ps --dump-config --markdown`, checked by
 * `gddr-tests conf`) and `gddr-ps --dump-config` both come from here. */
#include "config.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const mode_names[] = { "async", "sync", "ssp", NULL };
static const char *const level_names[] = { "error", "warn", "info", "debug", NULL };
/* In the order of PS_PLOG_* (pushlog.h). */
static const char *const plog_names[] = { "off", "batch", "always", NULL };
/* In the order of PS_OPT_* (ps.h). */
static const char *const opt_names[] = { "sgd", "adam", "adamw", "adagrad", NULL };
static const char *const afill_names[] = { "recent", "moment", NULL };

#define OFF(f) offsetof(gddr_ps_config, f)
#define BIG 9.2e18

const gddr__conf_key ps_conf_table[] = {
    { "server", "listen", GDDR_CONF_STRING, OFF(listen), "tcp://127.0.0.1:5555", 0, 0, NULL, 0,
      "ZeroMQ endpoint to bind; a port of * lets the OS choose" },
    { "server", "endpoint_file", GDDR_CONF_STRING, OFF(endpoint_file), "", 0, 0, NULL, 0,
      "file to write the bound endpoint into (useful with port *); empty = none" },
    { "server", "threads", GDDR_CONF_INT, OFF(threads), "2", 1, 256, NULL, 0,
      "apply threads; each owns a chunk range of every tensor" },
    { "server", "chunk", GDDR_CONF_INT, OFF(chunk), "1024", 1, 1 << 24, NULL, 0,
      "elements per chunk (the unit of sparse pushes and parallel apply)" },
    { "server", "max_message_bytes", GDDR_CONF_INT, OFF(max_message_bytes), "1073741824", 1024,
      BIG, NULL, 0, "largest message accepted (ZMQ_MAXMSGSIZE); bigger ones are dropped" },
    { "server", "max_tensors", GDDR_CONF_INT, OFF(max_tensors), "4096", 1, 1 << 20, NULL, 0,
      "most tensors a server holds" },
    { "server", "max_workers", GDDR_CONF_INT, OFF(max_workers), "1024", 1, 65536, NULL, 0,
      "highest worker rank accepted plus one" },
    { "server", "pull_wait_max_ms", GDDR_CONF_INT, OFF(pull_wait_max_ms), "60000", 0, 3600000,
      NULL, 0, "longest a pull may be parked waiting for a version (sync) or the slowest worker (ssp)" },
    { "server", "log_level", GDDR_CONF_ENUM, OFF(log_level), "info", 0, 0, level_names, 1,
      "error, warn, info or debug" },
    { "server", "metrics_listen", GDDR_CONF_STRING, OFF(metrics_listen), "", 0, 0, NULL, 0,
      "tcp endpoint serving Prometheus text over HTTP, e.g. tcp://127.0.0.1:9464; empty = off" },
    { "server", "max_queued_reply_bytes", GDDR_CONF_INT, OFF(max_queued_reply_bytes), "1073741824",
      0, BIG, NULL, 1,
      "reply bytes one connection may have unread before its pulls get E_BUSY (one reply always goes)" },
    { "server", "max_parked_pulls", GDDR_CONF_INT, OFF(max_parked_pulls), "16384", 1, 1 << 24, NULL,
      1, "pulls one connection may have waiting for a version or the ssp bound" },
    { "server", "max_snapshot_bytes", GDDR_CONF_INT, OFF(max_snapshot_bytes), "0", 0, BIG, NULL, 1,
      "bound on the residual snapshots held for all workers; 0 = the expected workers times the model size" },
    { "server", "max_pull_view_bytes", GDDR_CONF_INT, OFF(max_pull_view_bytes), "0", 0, BIG, NULL, 1,
      "bound on the workers' views kept for lazy and delta pulls (beyond it pulls go whole); 0 = the expected workers times the model size" },
    { "server", "max_fill_bytes", GDDR_CONF_INT, OFF(max_fill_bytes), "0", 0, BIG, NULL, 1,
      "bound on all workers' fill credits (fill_held); beyond it held chunks count as zeros; 0 = the expected workers times the model size" },
    { "server", "allow_register", GDDR_CONF_BOOL, OFF(allow_register), "true", 0, 0, NULL, 1,
      "workers may register new tensors; false freezes the set (existing ones still answer)" },
    { "server", "shard_index", GDDR_CONF_INT, OFF(shard_index), "0", 0, 65535, NULL, 0,
      "which shard of a sharded model this server holds, 0-based (below shard_count)" },
    { "server", "shard_count", GDDR_CONF_INT, OFF(shard_count), "1", 1, 65536, NULL, 0,
      "servers the model is sharded over; a worker's server list must put this one at shard_index" },
    { "server", "max_tables", GDDR_CONF_INT, OFF(max_tables), "256", 1, 1 << 16, NULL, 0,
      "most sparse embedding tables a server holds" },
    { "server", "max_table_rows", GDDR_CONF_INT, OFF(max_table_rows), "10000000", 0, BIG, NULL, 0,
      "rows of all tables together; beyond it the least recently touched rows are evicted (sampled); 0 = no bound" },
    { "server", "max_table_bytes", GDDR_CONF_INT, OFF(max_table_bytes), "0", 0, BIG, NULL, 0,
      "memory of all tables' rows together (values, optimizer state, index: row_bytes each); beyond it rows are evicted as for max_table_rows; 0 = half the machine's memory" },

    { "consistency", "mode", GDDR_CONF_ENUM, OFF(mode), "async", 0, 0, mode_names, 0,
      "async (apply each push), sync (apply the mean once per step) or ssp (bounded staleness)" },
    { "consistency", "workers", GDDR_CONF_INT, OFF(workers), "0", 0, 65536, NULL, 0,
      "workers a sync step waits for; 0 = the largest world_size a worker announced" },
    { "consistency", "sync_quorum", GDDR_CONF_INT, OFF(sync_quorum), "0", 0, 65536, NULL, 0,
      "sync: apply a step once this many workers pushed; 0 = all live workers" },
    { "consistency", "staleness_bound", GDDR_CONF_INT, OFF(staleness_bound), "2", 0, 1000000,
      NULL, 0, "ssp: how many steps a worker may run ahead of the slowest live worker" },
    { "consistency", "async_warmup_steps", GDDR_CONF_INT, OFF(async_warmup_steps), "0", 0, BIG,
      NULL, 0, "sync mode: run async until a tensor reaches this version (hybrid); 0 = off" },
    { "consistency", "worker_timeout_s", GDDR_CONF_DOUBLE, OFF(worker_timeout_s), "10", 0.1,
      86400, NULL, 0, "a worker silent this long is declared dead" },
    { "consistency", "sync_stall_s", GDDR_CONF_DOUBLE, OFF(sync_stall_s), "60", 0, 86400, NULL, 1,
      "sync: a step that has waited this long for live workers closes as it is (their pushes come late, none lost); 0 = wait for ever" },
    { "consistency", "fill_held", GDDR_CONF_BOOL, OFF(fill_held), "true", 0, 0, NULL, 1,
      "sync: a chunk a GDDR worker holds back counts as the mean of those that sent it, credited and taken off when it comes" },
    { "consistency", "async_fill", GDDR_CONF_ENUM, OFF(async_fill), "recent", 0, 0, afill_names, 1,
      "async, ssp with adam or adamw and fill_held: what a held chunk is stepped with: recent (another worker's fresh push, once) or moment (Adam's m-hat)" },

    { "optimizer", "kind", GDDR_CONF_ENUM, OFF(opt_kind), "sgd", 0, 0, opt_names, 0,
      "what the server runs for tensors registered without an optimizer of their own: sgd, adam, adamw or adagrad" },
    { "optimizer", "lr", GDDR_CONF_DOUBLE, OFF(lr), "0.1", 0, 1e6, NULL, 1,
      "learning rate applied by the server (a push may carry its own: a schedule on the worker)" },
    { "optimizer", "adadelay", GDDR_CONF_DOUBLE, OFF(adadelay), "0", 0, 1e6, NULL, 1,
      "AdaDelay: lr_eff = lr / (1 + adadelay * tau); 0 = off" },
    { "optimizer", "momentum", GDDR_CONF_DOUBLE, OFF(momentum), "0", 0, 0.9999, NULL, 1,
      "sgd: heavy-ball momentum mu: v = mu*v + lr_eff*G, w -= v; 0 = off" },
    { "optimizer", "beta1", GDDR_CONF_DOUBLE, OFF(beta1), "0.9", 0, 0.999999, NULL, 1,
      "adam, adamw: decay of the first moment" },
    { "optimizer", "beta2", GDDR_CONF_DOUBLE, OFF(beta2), "0.999", 0, 0.999999, NULL, 1,
      "adam, adamw: decay of the second moment" },
    { "optimizer", "eps", GDDR_CONF_DOUBLE, OFF(eps), "1e-8", 1e-30, 1, NULL, 1,
      "adam, adamw, adagrad: added to the root of the second moment" },
    { "optimizer", "weight_decay", GDDR_CONF_DOUBLE, OFF(weight_decay), "0", 0, 1e6, NULL, 1,
      "L2 weight decay (adamw: decoupled, w -= lr*weight_decay*w); 0 = off" },
    { "optimizer", "max_grad_norm", GDDR_CONF_DOUBLE, OFF(max_grad_norm), "0", 0, 1e30, NULL, 1,
      "reject a push whose values (as sent) have an L2 norm above this; 0 = off" },

    { "staleness", "staleness_alarm", GDDR_CONF_DOUBLE, OFF(staleness_alarm), "0", 0, 1e9, NULL,
      1, "warn once each time the staleness EMA crosses this; 0 = off" },
    { "staleness", "staleness_ema_decay", GDDR_CONF_DOUBLE, OFF(staleness_ema_decay), "0.99",
      0, 0.999999, NULL, 1, "EMA factor of the staleness average" },

    { "tau", "tau_dynamic", GDDR_CONF_BOOL, OFF(tau_dynamic), "true", 0, 0, NULL, 1,
      "adapt the GDDR delay bound tau to the gradient-norm change rate" },
    { "tau", "tau_init", GDDR_CONF_INT, OFF(tau_init), "4", 1, 1000, NULL, 1,
      "starting GDDR delay bound tau (steps a held chunk may wait)" },
    { "tau", "tau_min", GDDR_CONF_INT, OFF(tau_min), "2", 1, 1000, NULL, 1,
      "lowest tau the controller goes to" },
    { "tau", "tau_max", GDDR_CONF_INT, OFF(tau_max), "8", 1, 1000, NULL, 1,
      "highest tau the controller goes to" },
    { "tau", "tau_ema", GDDR_CONF_DOUBLE, OFF(tau_ema), "0.9", 0, 0.999999, NULL, 1,
      "EMA factor of the pushed gradient norm and of its change rate" },
    { "tau", "tau_rate_high", GDDR_CONF_DOUBLE, OFF(tau_rate_high), "0.6", 0, 1e9, NULL, 1,
      "change rate above which tau is halved" },
    { "tau", "tau_rate_low", GDDR_CONF_DOUBLE, OFF(tau_rate_low), "0.3", 0, 1e9, NULL, 1,
      "change rate below which (for tau_patience pushes) tau grows by one" },
    { "tau", "tau_patience", GDDR_CONF_INT, OFF(tau_patience), "20", 1, 1000000, NULL, 1,
      "calm pushes needed before tau grows" },

    { "checkpoint", "checkpoint_dir", GDDR_CONF_STRING, OFF(checkpoint_dir), "", 0, 0, NULL, 0,
      "directory for checkpoints; empty = no checkpoints" },
    { "checkpoint", "checkpoint_interval_s", GDDR_CONF_DOUBLE, OFF(checkpoint_interval_s), "30",
      0, 1e7, NULL, 1, "seconds between checkpoints; 0 = only on SIGTERM and on request" },
    { "checkpoint", "checkpoint_keep", GDDR_CONF_INT, OFF(checkpoint_keep), "3", 1, 1000, NULL,
      0, "how many checkpoints to keep (with sparse tables, also the full ones later ones rest on)" },
    { "checkpoint", "checkpoint_allow_empty", GDDR_CONF_BOOL, OFF(checkpoint_allow_empty), "false",
      0, 0, NULL, 0,
      "start empty when checkpoint_dir holds checkpoints but none is readable (they are moved aside)" },

    { "durability", "push_log", GDDR_CONF_ENUM, OFF(push_log), "off", 0, 0, plog_names, 0,
      "pushes logged in checkpoint_dir, replayed at a restart: off; batch (synced every "
      "push_log_window_ms); always (a reply waits for its push on disk)" },
    { "durability", "push_log_window_ms", GDDR_CONF_INT, OFF(push_log_window_ms), "20", 1, 60000,
      NULL, 0, "batch: the longest a push waits in memory before it is written and synced" },

    { "security", "curve_secret_key_file", GDDR_CONF_STRING, OFF(curve_secret_key_file), "", 0, 0,
      NULL, 0, "the server's CURVE key file (gddr-keygen); set = encrypt and authenticate every connection; "
      "under systemd, the credential curve_secret_key_file wins (LoadCredential=)" },
    { "security", "authorized_keys", GDDR_CONF_STRING, OFF(authorized_keys), "", 0, 0, NULL, 0,
      "file of client public keys allowed in, one per line, options first (`ranks=0-3 KEY`, "
      "`observer KEY`); re-read on SIGHUP; needs curve_secret_key_file" },
    { NULL, NULL, 0, 0, NULL, 0, 0, NULL, 0, NULL },
};

const char *ps_config_where(const gddr_ps_config *cfg, const char *path, const char *key,
                                 char *buf, size_t len)
{
    const gddr__conf_key *k = gddr__conf_find(ps_conf_table, NULL, key);
    int line = k ? cfg->line[k - ps_conf_table] : GDDR_CONF_FROM_DEFAULT;
    if (line == GDDR_CONF_FROM_SET)
        snprintf(buf, len, "--set");
    else if (k && cfg->curve_key_from_credential && strcmp(key, "curve_secret_key_file") == 0)
        snprintf(buf, len, "credential %s", GDDR_PS_CURVE_CREDENTIAL);
    else if (line > 0 && path)
        snprintf(buf, len, "%s:%d", path, line);
    else
        snprintf(buf, len, "%s", path ? path : "configuration");
    return buf;
}

/* " (line N)", " (--set)" or " (its default)": where the other key of a
 * cross-key error came from. */
static const char *also(const gddr_ps_config *cfg, const char *key, char *buf, size_t len)
{
    const gddr__conf_key *k = gddr__conf_find(ps_conf_table, NULL, key);
    int line = k ? cfg->line[k - ps_conf_table] : GDDR_CONF_FROM_DEFAULT;
    if (line > 0)
        snprintf(buf, len, " (%s on line %d)", key, line);
    else
        snprintf(buf, len, " (%s %s)", key, line == GDDR_CONF_FROM_SET ? "from --set" : "by default");
    return buf;
}

int ps_config_validate(const gddr_ps_config *cfg, const char *path, char *err, size_t errlen)
{
    char w[GDDR_CONF_STRMAX + 32], o[96];
#define WHERE(key) ps_config_where(cfg, path, key, w, sizeof w)
#define ALSO(key) also(cfg, key, o, sizeof o)
    if (cfg->tau_min > cfg->tau_max) {
        snprintf(err, errlen, "%s: key 'tau_min': %lld is above tau_max %lld%s", WHERE("tau_min"),
                 cfg->tau_min, cfg->tau_max, ALSO("tau_max"));
        return -1;
    }
    if (cfg->tau_init < cfg->tau_min || cfg->tau_init > cfg->tau_max) {
        snprintf(err, errlen, "%s: key 'tau_init': %lld is outside [tau_min, tau_max] = [%lld, %lld]",
                 WHERE("tau_init"), cfg->tau_init, cfg->tau_min, cfg->tau_max);
        return -1;
    }
    if (cfg->tau_rate_low > cfg->tau_rate_high) {
        snprintf(err, errlen, "%s: key 'tau_rate_low': %g is above tau_rate_high %g%s",
                 WHERE("tau_rate_low"), cfg->tau_rate_low, cfg->tau_rate_high,
                 ALSO("tau_rate_high"));
        return -1;
    }
    if (cfg->sync_quorum && cfg->workers && cfg->sync_quorum > cfg->workers) {
        snprintf(err, errlen, "%s: key 'sync_quorum': %lld is above workers %lld%s",
                 WHERE("sync_quorum"), cfg->sync_quorum, cfg->workers, ALSO("workers"));
        return -1;
    }
    if (cfg->momentum > 0 && cfg->opt_kind != 0) {
        snprintf(err, errlen, "%s: key 'momentum': %g is for kind = sgd; kind is %s%s (its first "
                 "moment is beta1)", WHERE("momentum"), cfg->momentum, opt_names[cfg->opt_kind],
                 ALSO("kind"));
        return -1;
    }
    if (cfg->authorized_keys[0] && !cfg->curve_secret_key_file[0]) {
        snprintf(err, errlen, "%s: key 'authorized_keys': needs curve_secret_key_file (no CURVE, no keys to check)",
                 WHERE("authorized_keys"));
        return -1;
    }
    if (cfg->curve_secret_key_file[0] && !cfg->authorized_keys[0]) {
        snprintf(err, errlen, "%s: key 'curve_secret_key_file': set authorized_keys too (CURVE without an allowlist lets any key in)",
                 WHERE("curve_secret_key_file"));
        return -1;
    }
    if (cfg->push_log && !cfg->checkpoint_dir[0]) {
        snprintf(err, errlen, "%s: key 'push_log': the log lives in checkpoint_dir, which is not set",
                 WHERE("push_log"));
        return -1;
    }
    if (cfg->shard_index >= cfg->shard_count) {
        snprintf(err, errlen, "%s: key 'shard_index': %lld is not below shard_count %lld%s (shards are 0 to %lld)",
                 WHERE("shard_index"), cfg->shard_index, cfg->shard_count, ALSO("shard_count"),
                 cfg->shard_count - 1);
        return -1;
    }
    if (strncmp(cfg->listen, "tcp://", 6) && strncmp(cfg->listen, "ipc://", 6) &&
        strncmp(cfg->listen, "inproc://", 9)) {
        snprintf(err, errlen, "%s: key 'listen': '%s' is not a tcp://, ipc:// or inproc:// endpoint",
                 WHERE("listen"), cfg->listen);
        return -1;
    }
#undef WHERE
#undef ALSO
    return 0;
}

/* 0 when dir (of a file to be created there) is a directory this process
 * may create files in; else -1 with errno's sentence in why. */
static int writable_dir(const char *dir, char *why, size_t len)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        snprintf(why, len, "%s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(why, len, "%s is not a directory", dir);
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, len, "%s is not writable: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* The directory part of path ("." when it has none). */
static void parent_of(const char *path, char *buf, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, len, ".");
    else if (slash == path)
        snprintf(buf, len, "/");
    else
        snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

int ps_config_check_paths(const gddr_ps_config *cfg, const char *path, char *err,
                               size_t errlen)
{
    char w[GDDR_CONF_STRMAX + 32], why[GDDR_CONF_STRMAX * 2 + 64], dir[GDDR_CONF_STRMAX];
    struct stat sb;
    if (cfg->checkpoint_dir[0]) {
        /* The daemon creates the directory itself when its parent lets it. */
        parent_of(cfg->checkpoint_dir, dir, sizeof dir);
        int missing = stat(cfg->checkpoint_dir, &sb) != 0 && errno == ENOENT;
        if (missing ? writable_dir(dir, why, sizeof why) < 0
                    : writable_dir(cfg->checkpoint_dir, why, sizeof why) < 0) {
            snprintf(err, errlen, "%s: key 'checkpoint_dir': %s%s",
                     ps_config_where(cfg, path, "checkpoint_dir", w, sizeof w), why,
                     missing ? " (checkpoint_dir does not exist, and cannot be made there)" : "");
            return -1;
        }
    }
    if (cfg->endpoint_file[0]) {
        parent_of(cfg->endpoint_file, dir, sizeof dir);
        if (writable_dir(dir, why, sizeof why) < 0) {
            snprintf(err, errlen, "%s: key 'endpoint_file': cannot write %s there: %s",
                     ps_config_where(cfg, path, "endpoint_file", w, sizeof w),
                     cfg->endpoint_file, why);
            return -1;
        }
    }
    if (strncmp(cfg->listen, "ipc://", 6) == 0 && cfg->listen[6] != '@') {
        parent_of(cfg->listen + 6, dir, sizeof dir);
        if (writable_dir(dir, why, sizeof why) < 0) {
            snprintf(err, errlen, "%s: key 'listen': cannot make the socket %s: %s",
                     ps_config_where(cfg, path, "listen", w, sizeof w), cfg->listen + 6, why);
            return -1;
        }
    }
    static const char *const files[] = { "curve_secret_key_file", "authorized_keys" };
    const char *values[] = { cfg->curve_secret_key_file, cfg->authorized_keys };
    for (int i = 0; i < 2; i++)
        if (values[i][0] && access(values[i], R_OK) != 0) {
            snprintf(err, errlen, "%s: key '%s': cannot read %s: %s",
                     ps_config_where(cfg, path, files[i], w, sizeof w), files[i], values[i],
                     strerror(errno));
            return -1;
        }
    return 0;
}

int ps_config_read(gddr_ps_config *cfg, const char *path, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    if (gddr__conf_defaults(ps_conf_table, cfg, err, errlen) < 0)
        return -1;
    if (path && gddr__conf_load_lines(ps_conf_table, cfg, path, cfg->line, err, errlen) < 0)
        return -1;
    /* Under systemd, LoadCredential= hands a root-only key to the service
     * user as a file of its own: it wins over the file's path. */
    const char *creds = getenv("CREDENTIALS_DIRECTORY");
    if (creds && *creds) {
        char cred[GDDR_CONF_STRMAX * 2];
        snprintf(cred, sizeof cred, "%s/%s", creds, GDDR_PS_CURVE_CREDENTIAL);
        if (access(cred, F_OK) == 0) {
            char msg[256];
            if (gddr__conf_set(ps_conf_table, cfg, NULL, "curve_secret_key_file", cred, msg,
                               sizeof msg) < 0) {
                snprintf(err, errlen, "credential %s: %s", GDDR_PS_CURVE_CREDENTIAL, msg);
                return -1;
            }
            cfg->curve_key_from_credential = 1;
        }
    }
    return 0;
}

int ps_config_load(gddr_ps_config *cfg, const char *path, char *err, size_t errlen)
{
    if (ps_config_read(cfg, path, err, errlen) < 0)
        return -1;
    return ps_config_validate(cfg, path, err, errlen);
}

int ps_config_apply_override(gddr_ps_config *cfg, const char *kv, char *err, size_t errlen)
{
    char buf[GDDR_CONF_STRMAX * 2];
    snprintf(buf, sizeof buf, "%s", kv);
    char *eq = strchr(buf, '=');
    if (!eq) {
        snprintf(err, errlen, "--set needs KEY=VALUE, got '%s'", kv);
        return -1;
    }
    *eq = 0;
    char *key = buf, *section = NULL, *dot = strchr(key, '.');
    if (dot) {
        *dot = 0;
        section = key;
        key = dot + 1;
    }
    char msg[512];
    if (gddr__conf_set(ps_conf_table, cfg, section, key, eq + 1, msg, sizeof msg) < 0) {
        snprintf(err, errlen, "--set: %s", msg);
        return -1;
    }
    const gddr__conf_key *k = gddr__conf_find(ps_conf_table, section, key);
    cfg->line[k - ps_conf_table] = GDDR_CONF_FROM_SET;
    if (strcmp(key, "curve_secret_key_file") == 0)
        cfg->curve_key_from_credential = 0; /* the command line wins */
    return 0;
}
