/* conf.h -- one config table drives parsing, validation, defaults and dumps.
 *
 * Each program (gddr-ps, the client library) describes its keys in one
 * array of gddr__conf_key rows (redis style: name, type, bounds, default,
 * target field). The same table fills defaults, parses an INI file through
 * inih, applies command-line overrides and prints --dump-config, so a key
 * can never be documented in one place and parsed differently in another.
 * Errors read "file:line: key 'name': what is wrong".
 */
#ifndef GDDR_COMMON_CONF_H
#define GDDR_COMMON_CONF_H

#include <stddef.h>
#include <stdio.h>

#define GDDR_CONF_STRMAX 256
/* Longest line inih reads (INI_MAX_LINE in Debian's build), newline included. */
#define GDDR_CONF_LINEMAX 200
/* Most keys one table may hold (the loader keeps a line number per key). */
#define GDDR_CONF_MAXKEYS 96
/* Where a key's value came from, in a lines[] array (else its file line). */
#define GDDR_CONF_FROM_DEFAULT 0
#define GDDR_CONF_FROM_SET (-1)

typedef enum gddr__conf_type {
    GDDR_CONF_INT,    /* long long field */
    GDDR_CONF_DOUBLE, /* double field */
    GDDR_CONF_BOOL,   /* int field: true/false/yes/no/on/off/1/0 */
    GDDR_CONF_STRING, /* char[GDDR_CONF_STRMAX] field */
    GDDR_CONF_ENUM    /* int field, index into names */
} gddr__conf_type;

typedef struct gddr__conf_key {
    const char *section;   /* INI section the key lives in */
    const char *name;
    gddr__conf_type type;
    size_t offset;         /* offsetof(target struct, field) */
    const char *def;       /* default, written as in a file */
    double min, max;       /* inclusive bounds for INT and DOUBLE */
    const char *const *names; /* ENUM: NULL-terminated value names */
    int reloadable;        /* SIGHUP may change it */
    const char *help;      /* one sentence for --dump-config and the README */
} gddr__conf_key;

/* Fills every field with its default. Returns 0, or -1 if a default in the
 * table is itself invalid (a programming error, reported in err). */
int gddr__conf_defaults(const gddr__conf_key *tab, void *target, char *err, size_t errlen);

/* Parses an INI file onto target (defaults are not applied here). Stops at
 * nothing: the first error is reported as "path:line: ..." and -1 returned.
 * A key set twice is an error naming both lines. */
int gddr__conf_load(const gddr__conf_key *tab, void *target, const char *path,
                    char *err, size_t errlen);

/* The same, and lines[i] (GDDR_CONF_MAXKEYS entries, may be NULL) gets the
 * line that set key i of tab (left alone for keys the file does not set). */
int gddr__conf_load_lines(const gddr__conf_key *tab, void *target, const char *path,
                          int *lines, char *err, size_t errlen);

/* Same from a string (tests); `name` stands for the file name in errors. */
int gddr__conf_load_string(const gddr__conf_key *tab, void *target, const char *text,
                           const char *name, char *err, size_t errlen);

/* Sets one key from text, e.g. a "--set key=value" override. section may be
 * NULL to match the key in any section. */
int gddr__conf_set(const gddr__conf_key *tab, void *target, const char *section,
                   const char *key, const char *value, char *err, size_t errlen);

/* The longest value a string key takes: it must fit GDDR_CONF_STRMAX and,
 * written as "name = value", one line inih can read back. */
size_t gddr__conf_strmax(const gddr__conf_key *k);

/* Prints the table as Markdown rows (| `key` | `default` | help |), a
 * "| **[section]** | | |" row before each section; "(SIGHUP)" ends the help
 * of a reloadable key. No header row. */
void gddr__conf_markdown(const gddr__conf_key *tab, FILE *out);

/* Looks a key up; NULL if unknown. */
const gddr__conf_key *gddr__conf_find(const gddr__conf_key *tab, const char *section,
                                      const char *key);

/* Prints target as a complete INI file with each key's help as a comment. */
void gddr__conf_dump(const gddr__conf_key *tab, const void *target, FILE *out);

/* Formats one key's current value into buf. */
void gddr__conf_format(const gddr__conf_key *k, const void *target, char *buf, size_t len);

#endif
