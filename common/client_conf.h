/* client_conf.h -- every client option, one row each: the table that
 * drives gddr_client_opts_init(), the [client] section of an INI file, the
 * setters by name (gddr_opts_set/get), the environment look-ups, the
 * option list the Python package and gddr-train --help print, and the
 * README's reference (gddr-ps --dump-config --markdown).
 *
 * The client library reads it (client/src/options.c); gddr-ps prints its
 * [client] keys with its own. It lives below both, so the daemon links no
 * client code to print it. It needs the public struct only for offsetof.
 *
 * Adding an option: append its field at the end of gddr_client_opts
 * (client/include/gddr/gddr.h) and one row at the end of the table in
 * client_conf.c. Nothing else (docs/client.md, "Adding an option").
 */
#ifndef GDDR_COMMON_CLIENT_CONF_H
#define GDDR_COMMON_CLIENT_CONF_H

#include <stddef.h>

#include "conf.h"
#include "gddr/gddr.h"

/* The C type of an option's field. */
typedef enum gddr__opt_type {
    GDDR_OPT_INT,    /* int */
    GDDR_OPT_U64,    /* uint64_t */
    GDDR_OPT_DOUBLE, /* double */
    GDDR_OPT_BOOL,   /* int, 0 or 1 */
    GDDR_OPT_ENUM,   /* int: one of values (NULL: the index of its name) */
    GDDR_OPT_STRING, /* const char *, the caller's (NULL: unset) */
    GDDR_OPT_PTR     /* a pointer (callback, user data): set with gddr_opts_set_ptr */
} gddr__opt_type;

/* Row flags. */
#define GDDR_OPT_INI 1u     /* a key of the [client] section */
#define GDDR_OPT_NOFIELD ((size_t)-1) /* offset of an INI key without a field of its own */

typedef struct gddr__client_opt {
    const char *name;       /* the field's name (the INI key's too) */
    gddr__opt_type type;
    size_t offset, size;    /* offsetof and sizeof the field in gddr_client_opts */
    const char *def;        /* default as text ("" = NULL / none) */
    double min, max;        /* inclusive bounds of INT, U64 and DOUBLE */
    const char *const *names; /* ENUM: NULL-terminated value names */
    const int *values;      /* ENUM: the value of each name; NULL = its index */
    const char *env;        /* space-separated environment variables read, in order,
                               when the field is left at its default (rank, world_size) */
    const char *ini_def;    /* the INI key's default when it differs from def (NULL: def) */
    unsigned flags;         /* GDDR_OPT_INI */
    const char *help;       /* one sentence (INI dump, README, --help, Python docs) */
} gddr__client_opt;

/* Every option in the order of the struct's fields, ended by a row of
 * NULLs (the INI-only key "servers" sits after "server"). */
extern const gddr__client_opt gddr__client_opts_table[];
/* Number of rows (without the end row). */
size_t gddr__client_opts_count(void);
/* The row named name; NULL if none. */
const gddr__client_opt *gddr__client_opt_find(const char *name);
/* The type as a word: "int", "uint64", "double", "bool", "enum", "string", "pointer". */
const char *gddr__opt_type_name(gddr__opt_type t);

/* The [client] section: the gddr__conf_key rows of the INI rows, in table
 * order, ended by a row of NULLs, each targeting slot i of a
 * gddr__client_slot array indexed like gddr__client_opts_table. Built
 * once (thread-safe). */
typedef union gddr__client_slot {
    long long i;
    double d;
    int e;
    char s[GDDR_CONF_STRMAX];
} gddr__client_slot;
const gddr__conf_key *gddr__client_conf_keys(void);
/* The conf key of any row (INI or not), targeting slot row - table. */
void gddr__client_opt_key(const gddr__client_opt *row, gddr__conf_key *k);

/* Writes a slot (as conf.c parsed it) into the row's field; strings point
 * into the slot, which must outlive the field's use. */
void gddr__client_opt_store(const gddr__client_opt *row, const gddr__client_slot *s, void *opts);
/* Formats the row's field as text gddr_opts_set takes back. */
void gddr__client_opt_format(const gddr__client_opt *row, const void *opts, char *buf, size_t len);
/* Whether the row's field differs between a and b (strings by pointer). */
int gddr__client_opt_differs(const gddr__client_opt *row, const void *a, const void *b);

/* The rank and world size from the launcher's environment: the first of
 * the rank / world_size row's variables that holds a whole number in
 * [0, 2^20), else 0 / 1. */
int gddr__env_rank(void);
int gddr__env_world(void);

#endif
