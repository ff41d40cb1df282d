/* keys.c -- see keys.h. Key material comes from libzmq's own CURVE
 * (zmq_curve_keypair, zmq_z85_*), nothing is hand-rolled. */
#include "keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
        *--e = 0;
    return s;
}

static int valid_z85_key(const char *k)
{
    unsigned char bin[32];
    return strlen(k) == 40 && zmq_z85_decode(bin, k) != NULL;
}

int gddr__keyfile_read(const char *path, char pub[GDDR_Z85_KEY], char sec[GDDR_Z85_KEY],
                       char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (sec) {
        struct stat st;
        if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077)) {
            fclose(f);
            snprintf(err, errlen, "%s: secret key file is readable by group or others (chmod 600 it)", path);
            return -1;
        }
    }
    char line[256];
    pub[0] = 0;
    if (sec)
        sec[0] = 0;
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq)
            continue;
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        char *dst = strcmp(key, "public") == 0 ? pub : strcmp(key, "secret") == 0 ? sec : NULL;
        if (!dst)
            continue;
        if (!valid_z85_key(val)) {
            fclose(f);
            snprintf(err, errlen, "%s:%d: '%s' is not a 40-character Z85 key", path, lineno, key);
            return -1;
        }
        memcpy(dst, val, GDDR_Z85_KEY);
    }
    fclose(f);
    if (!pub[0] || (sec && !sec[0])) {
        snprintf(err, errlen, "%s: no '%s = ...' line", path, !pub[0] ? "public" : "secret");
        return -1;
    }
    if (sec) {
        char derived[GDDR_Z85_KEY];
        if (zmq_curve_public(derived, sec) != 0 || strcmp(derived, pub) != 0) {
            snprintf(err, errlen, "%s: the public key does not belong to the secret key", path);
            return -1;
        }
    }
    return 0;
}

int gddr__keyfile_generate(const char *name, char pub[GDDR_Z85_KEY], char *err, size_t errlen)
{
    char sec[GDDR_Z85_KEY], path[4096];
    if (zmq_curve_keypair(pub, sec) != 0) {
        snprintf(err, errlen, "zmq_curve_keypair: %s (libzmq built without CURVE?)", zmq_strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s.key", name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char text[256];
    int n = snprintf(text, sizeof text, "# GDDR CURVE key pair: keep this file secret\npublic = %s\nsecret = %s\n", pub, sec);
    if (write(fd, text, (size_t)n) != n || close(fd) != 0) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s.pub", name);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "public = %s\n", pub) < 0 || fclose(f) != 0) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Parses the options before a key ("ranks=0-3", "observer", comma
 * separated) into k; -1 with err on anything else. */
static int parse_key_options(char *opts, gddr__authkey *k, char *err, size_t errlen)
{
    for (char *save = NULL, *o = strtok_r(opts, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
        if (strcmp(o, "observer") == 0) {
            k->observer_only = 1;
            continue;
        }
        if (strncmp(o, "ranks=", 6) == 0) {
            char *end;
            long lo = strtol(o + 6, &end, 10), hi = lo;
            if (end != o + 6 && *end == '-')
                hi = strtol(end + 1, &end, 10);
            if (end == o + 6 || *end || lo < 0 || hi < lo || hi > 65535) {
                snprintf(err, errlen, "'%s' is not ranks=N or ranks=LO-HI", o);
                return -1;
            }
            k->rank_lo = (int)lo;
            k->rank_hi = (int)hi;
            continue;
        }
        snprintf(err, errlen, "unknown option '%s' (ranks=LO-HI or observer)", o);
        return -1;
    }
    return 0;
}

/* A line of a .pub file as gddr-keygen writes it, "public = KEY", is a
 * key line too (appending NAME.pub to authorized_keys works, as with ssh):
 * s past "public =". */
static char *skip_public(char *s)
{
    if (strncmp(s, "public", 6) != 0 || (s[6] != ' ' && s[6] != '\t' && s[6] != '='))
        return s;
    char *p = s + 6;
    p += strspn(p, " \t");
    if (*p != '=')
        return s;
    p++;
    return p + strspn(p, " \t");
}

int gddr__authorized_keys_read(const char *path, gddr__authkey **keys, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    gddr__authkey *arr = NULL;
    int n = 0, cap = 0, lineno = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        gddr__authkey k;
        memset(&k, 0, sizeof k);
        k.rank_lo = k.rank_hi = -1;
        s = skip_public(s);
        size_t len = strcspn(s, " \t");
        if (len != 40) {
            /* Options first, then the key. */
            char opts[256], why[256];
            snprintf(opts, sizeof opts, "%.*s", (int)len, s);
            if (parse_key_options(opts, &k, why, sizeof why) < 0) {
                fclose(f);
                free(arr);
                snprintf(err, errlen, "%s:%d: %s", path, lineno, why);
                return -1;
            }
            s = skip_public(trim(s + len));
            len = strcspn(s, " \t");
        }
        if (len != 40) {
            fclose(f);
            free(arr);
            snprintf(err, errlen, "%s:%d: expected a 40-character Z85 public key", path, lineno);
            return -1;
        }
        memcpy(k.z85, s, 40);
        k.z85[40] = 0;
        if (!zmq_z85_decode(k.key, k.z85)) {
            fclose(f);
            free(arr);
            snprintf(err, errlen, "%s:%d: not a valid Z85 key", path, lineno);
            return -1;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            void *p = realloc(arr, (size_t)cap * sizeof *arr);
            if (!p) {
                fclose(f);
                free(arr);
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            arr = p;
        }
        arr[n++] = k;
    }
    fclose(f);
    *keys = arr;
    return n;
}
