/* optspec.h -- a tensor's optimizer as the client names it: a short text
 * ("adam lr=3e-4 weight_decay=0.01") read into the fields of the wire's
 * Optimizer message (proto/gddr.proto). Shared by libgddr-client and its
 * tools; the server reads its own [optimizer] section instead. */
#ifndef GDDR_COMMON_OPTSPEC_H
#define GDDR_COMMON_OPTSPEC_H

#include <stddef.h>

/* kind: the wire's OptimizerKind (0 sgd, 1 adam, 2 adamw, 3 adagrad). */
typedef struct gddr__optim {
    int set;                /* 0: the server's [optimizer] section */
    int kind;
    double lr;              /* 0: the server's lr */
    double momentum, beta1, beta2, eps, weight_decay;
} gddr__optim;

/* Reads "KIND [key=value ...]" with KIND sgd, adam, adamw or adagrad and
 * keys lr, momentum (sgd), beta1, beta2, betas=B1,B2, eps, weight_decay
 * (torch.optim's defaults for what is not given; lr 0 = the server's).
 * NULL or "" gives set = 0. Returns 0, or -1 with a sentence in err naming
 * the word that is wrong. */
int gddr__optim_parse(const char *spec, gddr__optim *o, char *err, size_t errlen);

/* Writes o back as text the parser takes (set = 0: "server"). */
int gddr__optim_format(const gddr__optim *o, char *buf, size_t len);

#endif
