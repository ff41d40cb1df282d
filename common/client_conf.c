/* client_conf.c -- see client_conf.h. The table below is the one place a
 * client option is defined: one row per field of gddr_client_opts, in the
 * order of the fields (a new option: its field appended to the struct, its
 * row appended here). */
#include "client_conf.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const dc_modes[] = { "diag", "identity", NULL };
static const char *const delta_bits[] = { "0", "8", "16", NULL };
static const int delta_values[] = { 0, 8, 16 };
static const char *const levels[] = { "error", "warn", "info", "debug", NULL };
static const char *const hold_schedules[] = { "auto", "random", "staggered", "smallest", NULL };

/* The field's name, place and size, from the struct itself. */
#define FIELD(f)                                                                                   \
    .name = #f, .offset = offsetof(gddr_client_opts, f), .size = sizeof(((gddr_client_opts *)0)->f)
#define INI .flags = GDDR_OPT_INI

const gddr__client_opt gddr__client_opts_table[] = {
    { FIELD(server), .type = GDDR_OPT_STRING, .def = "", .ini_def = "tcp://127.0.0.1:5555", INI,
      .help = "endpoint of gddr-ps (or several, comma-separated, in shard order)" },
    { .name = "servers", .offset = GDDR_OPT_NOFIELD, .type = GDDR_OPT_STRING, .def = "", INI,
      .help = "a model sharded over several gddr-ps: their endpoints, comma-separated, in shard order "
              "(wins over server)" },
    { FIELD(rank), .type = GDDR_OPT_INT, .def = "-1", .min = -1, .max = 65535, INI,
      .env = "GDDR_RANK SLURM_PROCID OMPI_COMM_WORLD_RANK RANK",
      .help = "worker rank; -1 = GDDR_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or RANK" },
    { FIELD(world_size), .type = GDDR_OPT_INT, .def = "0", .min = 0, .max = 65536, INI,
      .env = "GDDR_WORLD_SIZE SLURM_NTASKS OMPI_COMM_WORLD_SIZE WORLD_SIZE",
      .help = "workers in the job; 0 = GDDR_WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE or WORLD_SIZE" },
    { FIELD(timeout_ms), .type = GDDR_OPT_INT, .def = "5000", .min = 1, .max = 3600000, INI,
      .help = "bound on every wait for a reply" },
    { FIELD(reconnect_timeout_ms), .type = GDDR_OPT_INT, .def = "30000", .min = 0, .max = 86400000, INI,
      .help = "how long to keep retrying a lost or restarted server" },
    { FIELD(clip_norm), .type = GDDR_OPT_DOUBLE, .def = "0", .min = 0, .max = 1e30, INI,
      .help = "clip the gradient to this global L2 norm; 0 = off" },
    { FIELD(dc_lambda), .type = GDDR_OPT_DOUBLE, .def = "0", .min = 0, .max = 1e6, INI,
      .help = "DC-ASGD lambda (lambda0 when adaptive); 0 = off" },
    { FIELD(dc_mode), .type = GDDR_OPT_ENUM, .def = "diag", .names = dc_modes, INI,
      .help = "diag: g + lambda*g*g*(w'-w_bak); identity: g + lambda*(w'-w_bak)" },
    { FIELD(dc_adaptive), .type = GDDR_OPT_BOOL, .def = "false", INI,
      .help = "lambda_t = lambda0 / sqrt(ms + eps), ms an EMA of g*g (DC-ASGD-a)" },
    { FIELD(dc_ms_decay), .type = GDDR_OPT_DOUBLE, .def = "0.95", .min = 0, .max = 0.999999, INI,
      .help = "EMA factor of g*g for adaptive DC" },
    { FIELD(delay_fraction), .type = GDDR_OPT_DOUBLE, .def = "0", .min = 0, .max = 0.99, INI,
      .help = "GDDR alpha: the share of chunks held in the residual each step (whatever tau); 0 = dense pushes" },
    { FIELD(seed), .type = GDDR_OPT_U64, .def = "12345", .min = 0, .max = 9.2e18, INI,
      .help = "seed of the GDDR hold mask" },
    { FIELD(residual_checkpoint_steps), .type = GDDR_OPT_INT, .def = "0", .min = 0, .max = 1000000, INI,
      .help = "attach the held residual to a push every N steps; 0 = never" },
    { FIELD(replay_decay), .type = GDDR_OPT_DOUBLE, .def = "0.5", .min = 0.01, .max = 1, INI,
      .help = "gamma of orphan installments" },
    { FIELD(async_pipeline), .type = GDDR_OPT_BOOL, .def = "true",
      .help = "gddr_step_submit runs the step on a library thread; false: inside gddr_step_submit" },
    { FIELD(log), .type = GDDR_OPT_PTR, .def = "",
      .help = "logger callback (gddr_log_fn); none: silent" },
    { FIELD(log_user), .type = GDDR_OPT_PTR, .def = "", .help = "first argument of the logger callback" },
    { FIELD(log_level), .type = GDDR_OPT_ENUM, .def = "warn", .names = levels, INI,
      .help = "library log level (needs a logger callback)" },
    { FIELD(observer), .type = GDDR_OPT_BOOL, .def = "false",
      .help = "a tool (gddr-ctl), not a worker: never counted in sync steps, may not push" },
    { FIELD(curve_server_key), .type = GDDR_OPT_STRING, .def = "", INI,
      .help = "the server's CURVE public key (Z85, from its .pub file); empty = no encryption" },
    { FIELD(curve_key_file), .type = GDDR_OPT_STRING, .def = "", INI,
      .help = "this client's key file from gddr-keygen (NAME.key, mode 600)" },
    { FIELD(heartbeat_ms), .type = GDDR_OPT_INT, .def = "2000", .min = 0, .max = 3600000, INI,
      .help = "a library thread tells the server this worker is alive this often; 0 = off" },
    { FIELD(part_bytes), .type = GDDR_OPT_U64, .def = "4194304", .min = 0, .max = 1e12, INI,
      .help = "tensors larger than this travel in parts of at most this many bytes; 0 = whole" },
    { FIELD(accumulate_steps), .type = GDDR_OPT_INT, .def = "1", .min = 1, .max = 1000000, INI,
      .help = "push the mean of every k gradients (gradient accumulation); 1 = every step" },
    { FIELD(pull_delay_fraction), .type = GDDR_OPT_DOUBLE, .def = "0", .min = 0, .max = 0.99, INI,
      .help = "GDDR on pulls: hold back a changed chunk with this probability, at most tau pulls; 0 = whole pulls" },
    { FIELD(pull_delta_bits), .type = GDDR_OPT_ENUM, .def = "0", .names = delta_bits,
      .values = delta_values, INI,
      .help = "pulls carry 8- or 16-bit differences from the worker's view (error kept on the server); 0 = float32" },
    { FIELD(connect_timeout_ms), .type = GDDR_OPT_INT, .def = "-1", .min = -1, .max = 86400000, INI,
      .help = "how long opening waits for a server not there (yet); -1 = reconnect_timeout_ms" },
    { FIELD(pull_delta_auto), .type = GDDR_OPT_BOOL, .def = "false", INI,
      .help = "reduced pulls only while cheaper than whole ones (timed; fast links: whole)" },
    { FIELD(hold_schedule), .type = GDDR_OPT_ENUM, .def = "auto", .names = hold_schedules, INI,
      .help = "which chunks GDDR holds: staggered (tau steps of a cycle, workers spread by rank), "
              "random (per worker and step) or smallest (those with the least r + g); "
              "auto = staggered in sync mode, smallest in async and ssp" },
    { FIELD(delay_auto), .type = GDDR_OPT_BOOL, .def = "false", INI,
      .help = "GDDR holds only while they make pushes cheaper (timed; fast links: every chunk sent)" },
    /* New options: append the field to gddr_client_opts and the row here. */
    { .name = NULL },
};

size_t gddr__client_opts_count(void)
{
    size_t n = 0;
    while (gddr__client_opts_table[n].name)
        n++;
    return n;
}

const gddr__client_opt *gddr__client_opt_find(const char *name)
{
    for (const gddr__client_opt *r = gddr__client_opts_table; name && r->name; r++)
        if (strcmp(r->name, name) == 0)
            return r;
    return NULL;
}

const char *gddr__opt_type_name(gddr__opt_type t)
{
    static const char *const w[] = { "int", "uint64", "double", "bool", "enum", "string", "pointer" };
    return (unsigned)t < sizeof w / sizeof w[0] ? w[t] : "?";
}

void gddr__client_opt_key(const gddr__client_opt *row, gddr__conf_key *k)
{
    static const gddr__conf_type conf_type[] = {
        [GDDR_OPT_INT] = GDDR_CONF_INT,   [GDDR_OPT_U64] = GDDR_CONF_INT,
        [GDDR_OPT_DOUBLE] = GDDR_CONF_DOUBLE, [GDDR_OPT_BOOL] = GDDR_CONF_BOOL,
        [GDDR_OPT_ENUM] = GDDR_CONF_ENUM, [GDDR_OPT_STRING] = GDDR_CONF_STRING,
        [GDDR_OPT_PTR] = GDDR_CONF_STRING,
    };
    memset(k, 0, sizeof *k);
    k->section = "client";
    k->name = row->name;
    k->type = conf_type[row->type];
    k->offset = (size_t)(row - gddr__client_opts_table) * sizeof(gddr__client_slot);
    k->def = row->ini_def ? row->ini_def : row->def;
    k->min = row->min;
    k->max = row->max;
    k->names = row->names;
    k->help = row->help;
}

static gddr__conf_key ini_keys[GDDR_CONF_MAXKEYS + 1];
static pthread_once_t ini_once = PTHREAD_ONCE_INIT;

static void build_ini_keys(void)
{
    size_t n = 0;
    for (const gddr__client_opt *r = gddr__client_opts_table; r->name && n < GDDR_CONF_MAXKEYS; r++)
        if (r->flags & GDDR_OPT_INI)
            gddr__client_opt_key(r, &ini_keys[n++]);
}

const gddr__conf_key *gddr__client_conf_keys(void)
{
    pthread_once(&ini_once, build_ini_keys);
    return ini_keys;
}

void gddr__client_opt_store(const gddr__client_opt *row, const gddr__client_slot *s, void *opts)
{
    if (row->offset == GDDR_OPT_NOFIELD)
        return;
    char *f = (char *)opts + row->offset;
    switch (row->type) {
    case GDDR_OPT_INT: *(int *)f = (int)s->i; break;
    case GDDR_OPT_U64: *(uint64_t *)f = (uint64_t)s->i; break;
    case GDDR_OPT_DOUBLE: *(double *)f = s->d; break;
    case GDDR_OPT_BOOL: *(int *)f = s->e != 0; break;
    case GDDR_OPT_ENUM: *(int *)f = row->values ? row->values[s->e] : s->e; break;
    case GDDR_OPT_STRING: *(const char **)f = s->s[0] ? s->s : NULL; break;
    case GDDR_OPT_PTR: break;
    }
}

void gddr__client_opt_format(const gddr__client_opt *row, const void *opts, char *buf, size_t len)
{
    if (!len)
        return;
    buf[0] = 0;
    if (row->offset == GDDR_OPT_NOFIELD)
        return;
    const char *f = (const char *)opts + row->offset;
    switch (row->type) {
    case GDDR_OPT_INT: snprintf(buf, len, "%d", *(const int *)f); break;
    case GDDR_OPT_U64: snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)f); break;
    case GDDR_OPT_DOUBLE: {
        /* The shortest text that reads back as the same double. */
        double v = *(const double *)f;
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, len, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
        break;
    }
    case GDDR_OPT_BOOL: snprintf(buf, len, "%s", *(const int *)f ? "true" : "false"); break;
    case GDDR_OPT_ENUM: {
        int v = *(const int *)f;
        snprintf(buf, len, "%d", v); /* a value without a name stays a number */
        for (int i = 0; row->names[i]; i++)
            if ((row->values ? row->values[i] : i) == v)
                snprintf(buf, len, "%s", row->names[i]);
        break;
    }
    case GDDR_OPT_STRING: {
        const char *s = *(const char *const *)f;
        snprintf(buf, len, "%s", s ? s : "");
        break;
    }
    case GDDR_OPT_PTR: {
        void *p = *(void *const *)f;
        if (p)
            snprintf(buf, len, "%p", p);
        break;
    }
    }
}

int gddr__client_opt_differs(const gddr__client_opt *row, const void *a, const void *b)
{
    if (row->offset == GDDR_OPT_NOFIELD)
        return 0;
    const char *fa = (const char *)a + row->offset, *fb = (const char *)b + row->offset;
    if (row->type == GDDR_OPT_DOUBLE)
        return *(const double *)fa != *(const double *)fb;
    return memcmp(fa, fb, row->size) != 0;
}

/* ---- the launcher's environment ----------------------------------------------- */

/* The first of the row's environment variables that holds a whole number
 * in [0, 2^20), else dflt. */
static int env_int(const char *option, int dflt)
{
    const gddr__client_opt *r = gddr__client_opt_find(option);
    const char *p = r && r->env ? r->env : "";
    while (*p) {
        size_t n = strcspn(p, " ");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), p);
        const char *v = getenv(name);
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (!*end && x >= 0 && x < 1 << 20)
                return (int)x;
        }
        p += n + strspn(p + n, " ");
    }
    return dflt;
}

int gddr__env_rank(void)
{
    return env_int("rank", 0);
}

int gddr__env_world(void)
{
    return env_int("world_size", 1);
}
