/* optspec.c -- see optspec.h. */
#include "optspec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kinds[] = { "sgd", "adam", "adamw", "adagrad" };
#define NKINDS 4

/* A whole number of the word, or -1. */
static int number(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int gddr__optim_parse(const char *spec, gddr__optim *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (!spec || !*spec)
        return 0;
    char buf[512];
    if (strlen(spec) >= sizeof buf) {
        snprintf(err, errlen, "optimizer: text too long");
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL, *w = strtok_r(buf, " \t", &save);
    if (!w)
        return 0;
    o->kind = -1;
    for (int k = 0; k < NKINDS; k++)
        if (strcmp(w, kinds[k]) == 0)
            o->kind = k;
    if (o->kind < 0) {
        snprintf(err, errlen, "optimizer: unknown kind '%s' (sgd, adam, adamw or adagrad)", w);
        return -1;
    }
    o->set = 1;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = o->kind == 3 ? 1e-10 : 1e-8;
    while ((w = strtok_r(NULL, " \t", &save))) {
        char *eq = strchr(w, '=');
        if (!eq) {
            snprintf(err, errlen, "optimizer: '%s' is not key=value", w);
            return -1;
        }
        *eq = 0;
        const char *key = w, *val = eq + 1;
        double v = 0;
        if (strcmp(key, "betas") == 0) {
            char *comma = strchr(eq + 1, ',');
            double b2;
            if (!comma) {
                snprintf(err, errlen, "optimizer: betas=%s needs two numbers, B1,B2", val);
                return -1;
            }
            *comma = 0;
            if (number(val, &v) < 0 || number(comma + 1, &b2) < 0) {
                snprintf(err, errlen, "optimizer: betas: '%s,%s' are not two numbers", val, comma + 1);
                return -1;
            }
            o->beta1 = v;
            o->beta2 = b2;
            continue;
        }
        double *field = strcmp(key, "lr") == 0             ? &o->lr
                        : strcmp(key, "momentum") == 0     ? &o->momentum
                        : strcmp(key, "beta1") == 0        ? &o->beta1
                        : strcmp(key, "beta2") == 0        ? &o->beta2
                        : strcmp(key, "eps") == 0          ? &o->eps
                        : strcmp(key, "weight_decay") == 0 ? &o->weight_decay
                                                           : NULL;
        if (!field) {
            snprintf(err, errlen, "optimizer: unknown key '%s' (lr, momentum, beta1, beta2, betas, eps, "
                     "weight_decay)", key);
            return -1;
        }
        if (number(val, &v) < 0) {
            snprintf(err, errlen, "optimizer: %s=%s is not a number", key, val);
            return -1;
        }
        *field = v;
    }
    if (o->momentum != 0 && o->kind != 0) {
        snprintf(err, errlen, "optimizer: momentum is for sgd (%s has beta1)", kinds[o->kind]);
        return -1;
    }
    if (o->lr < 0 || o->momentum < 0 || o->momentum >= 1 || o->beta1 < 0 || o->beta1 >= 1 ||
        o->beta2 < 0 || o->beta2 >= 1 || o->eps < 0 || o->weight_decay < 0) {
        snprintf(err, errlen, "optimizer: a value is out of range (lr, eps, weight_decay >= 0; "
                 "momentum, beta1, beta2 in [0, 1))");
        return -1;
    }
    return 0;
}

int gddr__optim_format(const gddr__optim *o, char *buf, size_t len)
{
    if (!o->set)
        return snprintf(buf, len, "server");
    const char *k = o->kind >= 0 && o->kind < NKINDS ? kinds[o->kind] : "?";
    switch (o->kind) {
    case 0:
        return snprintf(buf, len, "%s lr=%.9g momentum=%.9g weight_decay=%.9g", k, o->lr, o->momentum,
                        o->weight_decay);
    case 3:
        return snprintf(buf, len, "%s lr=%.9g eps=%.9g weight_decay=%.9g", k, o->lr, o->eps,
                        o->weight_decay);
    default:
        return snprintf(buf, len, "%s lr=%.9g beta1=%.9g beta2=%.9g eps=%.9g weight_decay=%.9g", k,
                        o->lr, o->beta1, o->beta2, o->eps, o->weight_decay);
    }
}
