/* numparse.c -- see numparse.h. */
#include "numparse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void say(char *why, int len, const char *fmt, const char *s, double lo, double hi)
{
    if (why && len > 0)
        snprintf(why, (size_t)len, fmt, s, lo, hi);
}

int gddr__parse_int(const char *s, long long lo, long long hi, long long *out, char *why, int whylen)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || errno || end == s || *end) {
        say(why, whylen, "'%s' is not a whole decimal number", s ? s : "", 0, 0);
        return -1;
    }
    if (v < lo || v > hi) {
        if (why && whylen > 0)
            snprintf(why, (size_t)whylen, "%lld is out of range [%lld, %lld]", v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int gddr__parse_num(const char *s, double lo, double hi, double *out, char *why, int whylen)
{
    /* Decimal only: strtod also reads 0x10 (16), inf, nan and "1e" locales. */
    if (!s || !*s || strspn(s, "+-.0123456789eE") != strlen(s)) {
        say(why, whylen, "'%s' is not a decimal number", s ? s : "", 0, 0);
        return -1;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        say(why, whylen, "'%s' is not a finite decimal number", s, 0, 0);
        return -1;
    }
    if (v < lo || v > hi) {
        if (why && whylen > 0)
            snprintf(why, (size_t)whylen, "%g is out of range [%g, %g]", v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int gddr__arg_int(const char *tool, const char *flag, const char *s, long long lo, long long hi,
                  long long *out)
{
    char why[160];
    if (gddr__parse_int(s, lo, hi, out, why, sizeof why) == 0)
        return 0;
    fprintf(stderr, "%s: %s: %s\n", tool, flag, why);
    return -1;
}

int gddr__arg_num(const char *tool, const char *flag, const char *s, double lo, double hi, double *out)
{
    char why[160];
    if (gddr__parse_num(s, lo, hi, out, why, sizeof why) == 0)
        return 0;
    fprintf(stderr, "%s: %s: %s\n", tool, flag, why);
    return -1;
}
