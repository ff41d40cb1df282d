/* prom.h -- reading the Prometheus text gddr-ps exports (gddr-ctl, tests). */
#ifndef GDDR_COMMON_PROM_H
#define GDDR_COMMON_PROM_H

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

#endif
