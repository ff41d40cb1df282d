/* prom.h -- reading the Prometheus text gddr-ps exports (gddr-ctl, tests). */
#ifndef GDDR_COMMON_PROM_H
#define GDDR_COMMON_PROM_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of the unlabelled sample `name` ("name VALUE" at the start of
 * a line) in text; `absent` when there is none. */
static inline double gddr__prom_sample(const char *text, const char *name, double absent)
{
    size_t nl = strlen(name);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, name, nl) == 0 && p[nl] == ' ')
            return strtod(p + nl + 1, NULL);
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return absent;
}

/* Most metric families gddr__prom_merge() takes. */
#define GDDR_PROM_MAX_FAMILIES 1024

/* Writes the texts of n servers to out as one exposition: each family once,
 * its HELP and TYPE lines from the first text that has them, then its
 * samples from every text in turn, each with shard="labels[i]" as its first
 * label (a histogram's _bucket, _sum and _count lines go with their
 * family). Returns 0; -1 out of memory; -2 more than
 * GDDR_PROM_MAX_FAMILIES families. */
int gddr__prom_merge(const char *const *texts, const int *labels, int n, FILE *out);

#endif
