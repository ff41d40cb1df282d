/* options.c -- client options, driven by their table (common/client_conf.c):
 * defaults, setters and getters by name, the option list, the [client]
 * section of an INI file, the rank and world size from the launcher's
 * environment; and the sized entry points that keep gddr_client_opts
 * extensible (docs/client.md, "ABI"): the caller says how large its struct
 * is, fields past that get their defaults, and the symbols of the first
 * gddr.h (gddr_client_opts_init, gddr_client_open, gddr_client_open_ini)
 * stay, reading the frozen prefix only. The public functions themselves
 * are api.c's (the one file defining gddr_*); these are what they call. */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_conf.h"
#include "client_int.h"
#include "conf.h"

#define FULL sizeof(gddr_client_opts)

static __thread char errmsg[320];

static int fail(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return rc;
}

const char *gddr__opts_errmsg(void)
{
    return errmsg;
}

size_t gddr__opts_size(void)
{
    return FULL;
}

static int has_field(const gddr__client_opt *r, size_t size)
{
    return r->offset != GDDR_OPT_NOFIELD && r->offset + r->size <= size;
}

/* A struct of `size` bytes is one this library can read: at least the
 * frozen prefix, at most what it knows. */
static int check_size(const char *what, size_t size)
{
    if (size < GDDR_CLIENT_OPTS_V0_SIZE)
        return fail(GDDR_EINVAL, "%s: a gddr_client_opts of %zu bytes is smaller than the first gddr.h's "
                    "(%zu bytes): pass sizeof(gddr_client_opts)", what, size,
                    (size_t)GDDR_CLIENT_OPTS_V0_SIZE);
    if (size > FULL)
        return fail(GDDR_ENOTSUP, "%s: this program was built against a newer gddr.h (gddr_client_opts "
                    "of %zu bytes) than this libgddr-client knows (%zu bytes): its new options "
                    "would be ignored; upgrade libgddr-client", what, size, FULL);
    return GDDR_OK;
}

/* Parses text as row r's type into s (enums also by value); conf.c's
 * checks and messages ("key 'x': ..."). */
static int parse_row(const gddr__client_opt *r, const char *text, gddr__client_slot *s)
{
    gddr__conf_key tab[2];
    gddr__client_opt_key(r, &tab[0]);
    memset(&tab[1], 0, sizeof tab[1]);
    tab[0].offset = 0;
    memset(s, 0, sizeof *s);
    if (r->type == GDDR_OPT_ENUM) {
        char *end;
        long v = strtol(text, &end, 10);
        for (int i = 0; r->names[i] && *text && !*end; i++)
            if ((r->values ? r->values[i] : i) == v) {
                s->e = i;
                return 0;
            }
    }
    char err[256];
    if (gddr__conf_set(tab, s, NULL, r->name, text, err, sizeof err) < 0)
        return fail(GDDR_EINVAL, "gddr_opts_set: %s", err);
    return 0;
}

/* The defaults of every field within size (pointers and strings NULL). */
static void fill_defaults(gddr_client_opts *o, size_t size)
{
    for (const gddr__client_opt *r = gddr__client_opts_table; r->name; r++) {
        if (!has_field(r, size))
            continue;
        gddr__client_slot s;
        if (r->type == GDDR_OPT_STRING)
            *(const char **)((char *)o + r->offset) = r->def[0] ? r->def : NULL;
        else if (r->type == GDDR_OPT_PTR || parse_row(r, r->def, &s) != 0)
            memset((char *)o + r->offset, 0, r->size); /* a bad default fails gddr-tests opts */
        else
            gddr__client_opt_store(r, &s, o);
    }
}

int gddr__opts_init_sized(gddr_client_opts *o, size_t size)
{
    errmsg[0] = 0;
    if (!o)
        return fail(GDDR_EINVAL, "gddr_client_opts_init_sized: NULL options");
    int rc = check_size("gddr_client_opts_init_sized", size);
    if (rc == GDDR_EINVAL)
        return rc;
    if (size > FULL)
        memset((char *)o + FULL, 0, size - FULL);
    fill_defaults(o, size < FULL ? size : FULL);
    return rc;
}

/* The caller's struct of `size` bytes as a complete one: its fields, the
 * defaults of those past its end. */
static int widen(const char *what, const gddr_client_opts *o, size_t size, gddr_client_opts *full)
{
    int rc = check_size(what, size);
    if (rc != GDDR_OK)
        return rc;
    memset(full, 0, sizeof *full);
    fill_defaults(full, FULL);
    for (const gddr__client_opt *r = gddr__client_opts_table; r->name; r++)
        if (has_field(r, size))
            memcpy((char *)full + r->offset, (const char *)o + r->offset, r->size);
    return GDDR_OK;
}

int gddr__opts_open_full(const gddr_client_opts *opts, gddr_client **out)
{
    if (!opts || !out || !opts->server || !opts->server[0])
        return GDDR_EINVAL;
    /* Its reason (the server's sentence when it refused) for
     * gddr_opts_errmsg(): the code alone says "bad worker rank". */
    char why[sizeof errmsg] = "";
    int rc = gddr__server_count(opts->server) > 1 ? gddr__shards_open(opts, out, why, sizeof why)
                                                  : gddr__client_open_shard(opts, 0, 0, out, why, sizeof why);
    if (rc != GDDR_OK)
        snprintf(errmsg, sizeof errmsg, "%s", why[0] ? why : gddr_strerror(rc));
    return rc;
}

int gddr__opts_open_sized(const gddr_client_opts *opts, size_t size, gddr_client **out)
{
    errmsg[0] = 0;
    if (!opts || !out)
        return GDDR_EINVAL;
    gddr_client_opts o;
    int rc = widen("gddr_client_open", opts, size, &o);
    return rc != GDDR_OK ? rc : gddr__opts_open_full(&o, out);
}

/* ---- by name ---------------------------------------------------------------- */

static const gddr__client_opt *named(const gddr_client_opts *o, size_t size, const char *name,
                                     const char *what)
{
    errmsg[0] = 0;
    const gddr__client_opt *r = gddr__client_opt_find(name);
    if (!o || !name) {
        fail(GDDR_EINVAL, "%s: NULL options or name", what);
        return NULL;
    }
    if (size < GDDR_CLIENT_OPTS_V0_SIZE) {
        check_size(what, size);
        return NULL;
    }
    if (!r) {
        fail(GDDR_EINVAL, "%s: unknown client option '%s' (gddr_opts_describe lists them)", what, name);
        return NULL;
    }
    if (r->offset == GDDR_OPT_NOFIELD) {
        fail(GDDR_EINVAL, "%s: '%s' is a key of the INI file only (set server to the comma-separated "
             "list)", what, name);
        return NULL;
    }
    if (!has_field(r, size)) {
        fail(GDDR_EINVAL, "%s: option '%s' lies past the gddr_client_opts of %zu bytes given (built "
             "against an older gddr.h)", what, name, size);
        return NULL;
    }
    return r;
}

int gddr__opts_set(gddr_client_opts *o, size_t size, const char *name, const char *value)
{
    const gddr__client_opt *r = named(o, size, name, "gddr_opts_set");
    if (!r)
        return GDDR_EINVAL;
    if (!value)
        return fail(GDDR_EINVAL, "gddr_opts_set: NULL value for '%s'", name);
    if (r->type == GDDR_OPT_PTR)
        return fail(GDDR_EINVAL, "gddr_opts_set: '%s' is a pointer: set it with gddr_opts_set_ptr", name);
    if (r->type == GDDR_OPT_STRING) {
        *(const char **)((char *)o + r->offset) = value[0] ? value : NULL;
        return GDDR_OK;
    }
    gddr__client_slot s;
    if (parse_row(r, value, &s) != 0)
        return GDDR_EINVAL;
    gddr__client_opt_store(r, &s, o);
    return GDDR_OK;
}

int gddr__opts_set_ptr(gddr_client_opts *o, size_t size, const char *name, void *value)
{
    const gddr__client_opt *r = named(o, size, name, "gddr_opts_set_ptr");
    if (!r)
        return GDDR_EINVAL;
    if (r->type != GDDR_OPT_PTR)
        return fail(GDDR_EINVAL, "gddr_opts_set_ptr: '%s' is not a pointer: set it with gddr_opts_set",
                    name);
    memcpy((char *)o + r->offset, &value, sizeof value);
    return GDDR_OK;
}

int gddr__opts_get(const gddr_client_opts *o, size_t size, const char *name, char *buf, size_t len)
{
    const gddr__client_opt *r = named(o, size, name, "gddr_opts_get");
    if (buf && len)
        buf[0] = 0;
    if (!r)
        return GDDR_EINVAL;
    if (!buf || !len)
        return fail(GDDR_EINVAL, "gddr_opts_get: no buffer");
    gddr__client_opt_format(r, o, buf, len);
    return GDDR_OK;
}

/* The rows that are fields, in order; an enum's "name=value,..." each. */
static const gddr__client_opt *fields[GDDR_CONF_MAXKEYS];
static char choices[GDDR_CONF_MAXKEYS][160];
static size_t nfields;
static pthread_once_t fields_once = PTHREAD_ONCE_INIT;

static void list_fields(void)
{
    for (const gddr__client_opt *r = gddr__client_opts_table; r->name && nfields < GDDR_CONF_MAXKEYS; r++) {
        if (r->offset == GDDR_OPT_NOFIELD)
            continue;
        size_t off = 0;
        for (int i = 0; r->type == GDDR_OPT_ENUM && r->names[i]; i++)
            off += (size_t)snprintf(choices[nfields] + off, sizeof choices[0] - off, "%s%s=%d",
                                    i ? "," : "", r->names[i], r->values ? r->values[i] : i);
        fields[nfields++] = r;
    }
}

const char *gddr__opts_describe(size_t i, const char **type, const char **def, const char **choice,
                               const char **help)
{
    pthread_once(&fields_once, list_fields);
    if (i >= nfields)
        return NULL;
    const gddr__client_opt *r = fields[i];
    if (type)
        *type = gddr__opt_type_name(r->type);
    if (def)
        *def = r->def;
    if (choice)
        *choice = choices[i];
    if (help)
        *help = r->help;
    return r->name;
}

/* ---- the [client] section ----------------------------------------------------- */

int gddr__opts_from_ini(const char *path, gddr_client_opts *o, gddr__client_slot *slots, char *err,
                        size_t errlen)
{
    const gddr__conf_key *keys = gddr__client_conf_keys();
    size_t n = gddr__client_opts_count();
    if (n > GDDR_CONF_MAXKEYS) {
        snprintf(err, errlen, "%zu client options, more than GDDR_CONF_MAXKEYS", n);
        return GDDR_ECONFIG;
    }
    memset(slots, 0, n * sizeof *slots);
    if (gddr__conf_defaults(keys, slots, err, errlen) < 0 || gddr__conf_load(keys, slots, path, err, errlen) < 0)
        return GDDR_ECONFIG;
    for (size_t i = 0; i < n; i++)
        if (gddr__client_opts_table[i].flags & GDDR_OPT_INI)
            gddr__client_opt_store(&gddr__client_opts_table[i], &slots[i], o);
    /* servers (a sharded model) wins over server. */
    const gddr__client_opt *servers = gddr__client_opt_find("servers");
    if (servers && slots[servers - gddr__client_opts_table].s[0])
        o->server = slots[servers - gddr__client_opts_table].s;
    return GDDR_OK;
}

int gddr__opts_open_ini_sized(const char *path, const gddr_client_opts *overrides, size_t size,
                               gddr_client **out, char *errbuf, size_t errlen)
{
    gddr_client_opts o, ov, d;
    gddr__client_slot slots[GDDR_CONF_MAXKEYS];
    char dummy[8];
    errmsg[0] = 0;
    if (!errbuf) {
        errbuf = dummy;
        errlen = sizeof dummy;
    }
    fill_defaults(&o, FULL);
    int rc = overrides ? widen("gddr_client_open_ini", overrides, size, &ov) : GDDR_OK;
    if (rc != GDDR_OK) {
        snprintf(errbuf, errlen, "%s", errmsg);
        return rc;
    }
    rc = gddr__opts_from_ini(path, &o, slots, errbuf, errlen);
    if (rc != GDDR_OK)
        return rc;
    if (overrides) {
        /* A field the caller changed from the defaults wins over the file. */
        fill_defaults(&d, FULL);
        for (const gddr__client_opt *r = gddr__client_opts_table; r->name; r++)
            if (gddr__client_opt_differs(r, &ov, &d))
                memcpy((char *)&o + r->offset, (char *)&ov + r->offset, r->size);
    }
    char why[512] = "";
    /* Its own message says why (the server's sentence when it refused). */
    rc = gddr__server_count(o.server) > 1 ? gddr__shards_open(&o, out, why, sizeof why)
                                          : gddr__client_open_shard(&o, 0, 0, out, why, sizeof why);
    if (rc != GDDR_OK)
        snprintf(errbuf, errlen, "cannot open a client to %s: %s", o.server, why[0] ? why : gddr_strerror(rc));
    return rc;
}


