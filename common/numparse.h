/* numparse.h -- numbers from the command line and INI files, parsed whole.
 *
 * atoi("two") is 0 and atof("0,4") is 0: a typo becomes a silent setting.
 * These accept only a complete decimal number (no hexadecimal, no inf or
 * nan, nothing after it) within a range, and say what was wrong. */
#ifndef GDDR_NUMPARSE_H
#define GDDR_NUMPARSE_H

/* 0 and *out when s is a whole decimal integer in [lo, hi]; else -1 and a
 * reason in why (may be NULL). */
int gddr__parse_int(const char *s, long long lo, long long hi, long long *out, char *why, int whylen);
/* 0 and *out when s is a whole, finite decimal number in [lo, hi]. */
int gddr__parse_num(const char *s, double lo, double hi, double *out, char *why, int whylen);

/* The same for a tool's flag: on error prints "TOOL: FLAG: REASON" to
 * stderr and returns -1. */
int gddr__arg_int(const char *tool, const char *flag, const char *s, long long lo, long long hi,
                  long long *out);
int gddr__arg_num(const char *tool, const char *flag, const char *s, double lo, double hi, double *out);

#endif
