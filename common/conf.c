/* conf.c -- see conf.h. inih does the INI syntax; this file does meaning. */
#include "conf.h"
#include "numparse.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const gddr__conf_key *gddr__conf_find(const gddr__conf_key *tab, const char *section,
                                      const char *key)
{
    for (const gddr__conf_key *k = tab; k->name; k++)
        if (strcmp(k->name, key) == 0 && (!section || strcmp(k->section, section) == 0))
            return k;
    return NULL;
}

/* The section a key lives in when looked up in another one (for the hint
 * "it is in [server]"); NULL when no section has it. */
static const char *home_section(const gddr__conf_key *tab, const char *key)
{
    const gddr__conf_key *k = gddr__conf_find(tab, NULL, key);
    return k ? k->section : NULL;
}

static void unknown_key(const gddr__conf_key *tab, const char *section, const char *key,
                        char *err, size_t errlen)
{
    const char *home = section ? home_section(tab, key) : NULL;
    if (home)
        snprintf(err, errlen, "unknown key '%s' in section [%s]: it is in [%s]", key, section, home);
    else if (section)
        snprintf(err, errlen, "unknown key '%s' in section [%s]", key, section);
    else
        snprintf(err, errlen, "unknown key '%s'", key);
}

size_t gddr__conf_strmax(const gddr__conf_key *k)
{
    /* "name = value\n" plus inih's terminator must fit GDDR_CONF_LINEMAX. */
    size_t line = GDDR_CONF_LINEMAX - 2 - strlen(k->name) - 3;
    return line < GDDR_CONF_STRMAX - 1 ? line : GDDR_CONF_STRMAX - 1;
}

static int parse_bool(const char *v, int *out)
{
    static const char *yes[] = { "1", "true", "yes", "on" };
    static const char *no[] = { "0", "false", "no", "off" };
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) { *out = 1; return 0; }
        if (strcasecmp(v, no[i]) == 0) { *out = 0; return 0; }
    }
    return -1;
}

/* Parses and range-checks value for key k into target; on error writes a
 * message without the file/line prefix. */
static int set_value(const gddr__conf_key *k, void *target, const char *value, char *err,
                     size_t errlen)
{
    char *field = (char *)target + k->offset;
    char *end;
    switch (k->type) {
    case GDDR_CONF_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end) {
            snprintf(err, errlen, "'%s' is not an integer", value);
            return -1;
        }
        if ((double)v < k->min || (double)v > k->max) {
            snprintf(err, errlen, "%lld is out of range [%.0f, %.0f]", v, k->min, k->max);
            return -1;
        }
        *(long long *)field = v;
        return 0;
    }
    case GDDR_CONF_DOUBLE: {
        double v;
        /* Decimal only: strtod would read 0x10 as 16 and accept inf and nan. */
        if (gddr__parse_num(value, -HUGE_VAL, HUGE_VAL, &v, err, (int)errlen) < 0)
            return -1;
        if (v < k->min || v > k->max) {
            snprintf(err, errlen, "%g is out of range [%g, %g]", v, k->min, k->max);
            return -1;
        }
        *(double *)field = v;
        return 0;
    }
    case GDDR_CONF_BOOL:
        if (parse_bool(value, (int *)field) < 0) {
            snprintf(err, errlen, "'%s' is not a boolean (use true or false)", value);
            return -1;
        }
        return 0;
    case GDDR_CONF_STRING:
        if (strlen(value) > gddr__conf_strmax(k)) {
            snprintf(err, errlen, "value is %zu characters, longer than the %zu this key takes",
                     strlen(value), gddr__conf_strmax(k));
            return -1;
        }
        strcpy(field, value);
        return 0;
    case GDDR_CONF_ENUM:
        for (int i = 0; k->names[i]; i++)
            if (strcasecmp(value, k->names[i]) == 0) {
                *(int *)field = i;
                return 0;
            }
        {
            size_t off = (size_t)snprintf(err, errlen, "'%s' is not one of", value);
            for (int i = 0; k->names[i] && off < errlen; i++)
                off += (size_t)snprintf(err + off, errlen - off, "%s %s", i ? "," : "", k->names[i]);
        }
        return -1;
    }
    snprintf(err, errlen, "bad key type");
    return -1;
}

int gddr__conf_defaults(const gddr__conf_key *tab, void *target, char *err, size_t errlen)
{
    for (const gddr__conf_key *k = tab; k->name; k++) {
        char msg[256];
        if (set_value(k, target, k->def, msg, sizeof msg) < 0) {
            snprintf(err, errlen, "default of key '%s': %s", k->name, msg);
            return -1;
        }
    }
    return 0;
}

int gddr__conf_set(const gddr__conf_key *tab, void *target, const char *section,
                   const char *key, const char *value, char *err, size_t errlen)
{
    const gddr__conf_key *k = gddr__conf_find(tab, section, key);
    if (!k) {
        unknown_key(tab, section, key, err, errlen);
        return -1;
    }
    char msg[256];
    if (set_value(k, target, value, msg, sizeof msg) < 0) {
        snprintf(err, errlen, "key '%s': %s", key, msg);
        return -1;
    }
    return 0;
}

/* inih calls back without a line number (Debian builds it without
 * INI_HANDLER_LINENO), so the reader below counts lines itself and the
 * handler reads the count. */
struct parse_state {
    const gddr__conf_key *tab;
    void *target;
    const char *name;
    int line;
    int err_line;
    int seen[GDDR_CONF_MAXKEYS]; /* line that set each key, 0 = not yet */
    char err[512];
    /* stream: either a FILE or a string cursor */
    FILE *fp;
    const char *cur;
    int too_long;   /* line number of a line longer than inih reads */
};

static char *count_reader(char *str, int num, void *stream)
{
    struct parse_state *st = stream;
    char *r;
    if (st->fp) {
        r = fgets(str, num, st->fp);
    } else {
        if (!*st->cur)
            return NULL;
        const char *nl = strchr(st->cur, '\n');
        size_t len = nl ? (size_t)(nl - st->cur + 1) : strlen(st->cur);
        if (len > (size_t)num - 1)
            len = (size_t)num - 1;
        memcpy(str, st->cur, len);
        str[len] = 0;
        st->cur += len;
        r = str;
    }
    if (r) {
        st->line++;
        size_t len = strlen(r);
        /* inih reads at most `num` bytes a line; a longer one would be cut
         * and its tail parsed as a line of its own. Refuse it instead. */
        if (len == (size_t)num - 1 && r[len - 1] != '\n' && !st->too_long) {
            int more = st->fp ? !feof(st->fp) : *st->cur != 0;
            if (more) {
                st->too_long = st->line;
                return NULL;
            }
        }
    }
    return r;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
    struct parse_state *st = user;
    if (st->err_line)
        return 1; /* keep only the first error */
    char msg[400];
    int known_section = 0;
    for (const gddr__conf_key *k = st->tab; k->name; k++)
        if (strcmp(k->section, section) == 0)
            known_section = 1;
    if (!known_section) {
        snprintf(msg, sizeof msg, "key '%s' is in unknown section [%s]", name, section);
    } else if (!gddr__conf_find(st->tab, section, name)) {
        unknown_key(st->tab, section, name, msg, sizeof msg);
    } else {
        size_t i = (size_t)(gddr__conf_find(st->tab, section, name) - st->tab);
        if (i < GDDR_CONF_MAXKEYS && st->seen[i])
            snprintf(msg, sizeof msg, "key '%s' is set twice in [%s], first on line %d", name,
                     section, st->seen[i]);
        else if (gddr__conf_set(st->tab, st->target, section, name, value, msg, sizeof msg) == 0) {
            if (i < GDDR_CONF_MAXKEYS)
                st->seen[i] = st->line;
            return 1;
        }
    }
    st->err_line = st->line;
    snprintf(st->err, sizeof st->err, "%s:%d: %s", st->name, st->line, msg);
    return 0;
}

static int run_parse(struct parse_state *st, char *err, size_t errlen)
{
    int rc = ini_parse_stream(count_reader, st, handler, st);
    if (st->too_long && (rc == 0 || rc >= st->too_long) && !(st->err_line && st->err_line < st->too_long)) {
        snprintf(err, errlen, "%s:%d: line is longer than %d characters", st->name, st->too_long,
                 GDDR_CONF_LINEMAX - 2);
        return -1;
    }
    if (rc == 0)
        return 0;
    /* inih reports the first failing line: ours if the handler refused a key
     * there, else a syntax error that came first. */
    if (st->err_line && st->err_line == rc)
        snprintf(err, errlen, "%s", st->err);
    else
        snprintf(err, errlen, "%s:%d: syntax error (expected 'key = value' or '[section]')",
                 st->name, rc);
    return -1;
}

int gddr__conf_load_lines(const gddr__conf_key *tab, void *target, const char *path,
                          int *lines, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct parse_state st = { .tab = tab, .target = target, .name = path, .fp = fp };
    int rc = run_parse(&st, err, errlen);
    fclose(fp);
    for (int i = 0; lines && rc == 0 && i < GDDR_CONF_MAXKEYS && tab[i].name; i++)
        if (st.seen[i])
            lines[i] = st.seen[i];
    return rc;
}

int gddr__conf_load(const gddr__conf_key *tab, void *target, const char *path, char *err,
                    size_t errlen)
{
    return gddr__conf_load_lines(tab, target, path, NULL, err, errlen);
}

int gddr__conf_load_string(const gddr__conf_key *tab, void *target, const char *text,
                           const char *name, char *err, size_t errlen)
{
    struct parse_state st = { .tab = tab, .target = target, .name = name, .cur = text };
    return run_parse(&st, err, errlen);
}

void gddr__conf_format(const gddr__conf_key *k, const void *target, char *buf, size_t len)
{
    const char *field = (const char *)target + k->offset;
    switch (k->type) {
    case GDDR_CONF_INT: snprintf(buf, len, "%lld", *(const long long *)field); break;
    case GDDR_CONF_DOUBLE: {
        /* The shortest text that reads back as the same double; a whole
         * number as one ("10", not "1e+01"). */
        double v = *(const double *)field;
        if (v == floor(v) && fabs(v) < 1e15) {
            snprintf(buf, len, "%.0f", v);
            break;
        }
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, len, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
        break;
    }
    case GDDR_CONF_BOOL: snprintf(buf, len, "%s", *(const int *)field ? "true" : "false"); break;
    case GDDR_CONF_STRING: snprintf(buf, len, "%s", field); break;
    case GDDR_CONF_ENUM: snprintf(buf, len, "%s", k->names[*(const int *)field]); break;
    }
}

void gddr__conf_dump(const gddr__conf_key *tab, const void *target, FILE *out)
{
    const char *section = NULL;
    for (const gddr__conf_key *k = tab; k->name; k++) {
        if (!section || strcmp(section, k->section) != 0) {
            fprintf(out, "%s[%s]\n", section ? "\n" : "", k->section);
            section = k->section;
        }
        char val[GDDR_CONF_STRMAX + 32];
        gddr__conf_format(k, target, val, sizeof val);
        fprintf(out, "; %s (default: %s%s)\n%s = %s\n", k->help, k->def[0] ? k->def : "\"\"",
                k->reloadable ? "; SIGHUP reloads it" : "", k->name, val);
    }
}

void gddr__conf_markdown(const gddr__conf_key *tab, FILE *out)
{
    const char *section = NULL;
    for (const gddr__conf_key *k = tab; k->name; k++) {
        if (!section || strcmp(section, k->section) != 0) {
            fprintf(out, "| **[%s]** | | |\n", k->section);
            section = k->section;
        }
        fprintf(out, "| `%s` | `%s` | ", k->name, k->def[0] ? k->def : "\"\"");
        for (const char *c = k->help; *c; c++) { /* a '|' would end the cell */
            if (*c == '|')
                putc('\\', out);
            putc(*c, out);
        }
        fprintf(out, "%s |\n", k->reloadable ? " (SIGHUP)" : "");
    }
}
