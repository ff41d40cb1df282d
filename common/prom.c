/* prom.c -- see prom.h. */
#include "prom.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The metric name a line is about: "# HELP name ..." / "# TYPE name ..." or
 * a sample "name{...} v" / "name v". Returns its length; *name points at it. */
static size_t line_name(const char *line, const char **name)
{
    const char *p = line;
    if (strncmp(p, "# HELP ", 7) == 0 || strncmp(p, "# TYPE ", 7) == 0)
        p += 7;
    *name = p;
    return strcspn(p, " {\n");
}

typedef struct family {
    const char *name;
    size_t len;
    const char *help, *type; /* lines (up to '\n') from the first server that has them */
} family;

static int find_family(family *f, int nf, const char *name, size_t len)
{
    for (int i = 0; i < nf; i++)
        if (f[i].len == len && strncmp(f[i].name, name, len) == 0)
            return i;
    return -1;
}

/* Prints a sample line with shard="I" as its first label. */
static void print_labelled(FILE *out, const char *line, size_t len, int shard)
{
    size_t nl = strcspn(line, " {\n");
    if (nl < len && line[nl] == '{') {
        int empty = nl + 1 < len && line[nl + 1] == '}';
        fprintf(out, "%.*s{shard=\"%d\"%s%.*s\n", (int)nl, line, shard, empty ? "" : ",",
               (int)(len - nl - 1), line + nl + 1);
    } else {
        fprintf(out, "%.*s{shard=\"%d\"}%.*s\n", (int)nl, line, shard, (int)(len - nl), line + nl);
    }
}

/* Which family each line of a text belongs to: the one its last HELP or
 * TYPE named (a histogram's _bucket, _sum and _count lines follow their
 * family's TYPE), else the sample's own name. Adds new families to f. */
static int collect_families(const char *text, family *f, int *nf, int cap)
{
    int cur = -1;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n");
        if (len && (p[0] != '#' || strncmp(p, "# HELP ", 7) == 0 || strncmp(p, "# TYPE ", 7) == 0)) {
            const char *name;
            size_t nlen = line_name(p, &name);
            int meta = p[0] == '#';
            if (meta || cur < 0) {
                cur = find_family(f, *nf, name, nlen);
                if (cur < 0) {
                    if (*nf >= cap)
                        return -1;
                    cur = (*nf)++;
                    memset(&f[cur], 0, sizeof f[cur]);
                    f[cur].name = name;
                    f[cur].len = nlen;
                }
                if (strncmp(p, "# HELP ", 7) == 0 && !f[cur].help)
                    f[cur].help = p;
                if (strncmp(p, "# TYPE ", 7) == 0 && !f[cur].type)
                    f[cur].type = p;
            }
        }
        p += len;
        if (*p)
            p++;
    }
    return 0;
}

/* Prints the samples of family fi in text, labelled with shard. */
static void print_family_samples(FILE *out, const char *text, const family *f, int nf, int fi,
                                 int shard)
{
    int cur = -1;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n");
        if (len && p[0] != '#') {
            const char *name;
            size_t nlen = line_name(p, &name);
            if (cur < 0)
                cur = find_family((family *)f, nf, name, nlen);
            if (cur == fi)
                print_labelled(out, p, len, shard);
        } else if (strncmp(p, "# HELP ", 7) == 0 || strncmp(p, "# TYPE ", 7) == 0) {
            const char *name;
            size_t nlen = line_name(p, &name);
            cur = find_family((family *)f, nf, name, nlen);
        }
        p += len;
        if (*p)
            p++;
    }
}

int gddr__prom_merge(const char *const *texts, const int *labels, int n, FILE *out)
{
    family *f = calloc(GDDR_PROM_MAX_FAMILIES, sizeof *f);
    int nf = 0;
    if (!f)
        return -1;
    for (int i = 0; i < n; i++)
        if (collect_families(texts[i], f, &nf, GDDR_PROM_MAX_FAMILIES) < 0) {
            free(f);
            return -2;
        }
    for (int k = 0; k < nf; k++) {
        if (f[k].help)
            fprintf(out, "%.*s\n", (int)strcspn(f[k].help, "\n"), f[k].help);
        if (f[k].type)
            fprintf(out, "%.*s\n", (int)strcspn(f[k].type, "\n"), f[k].type);
        for (int i = 0; i < n; i++)
            print_family_samples(out, texts[i], f, nf, k, labels[i]);
    }
    free(f);
    return 0;
}
