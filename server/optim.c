/* optim.c -- the optimizers the server runs: SGD with heavy-ball momentum,
 * Adam, AdamW and Adagrad, per element, over one chunk at a time.
 *
 * Every update reads a gradient g (a push's values, or a sync step's mean,
 * times a scale gs) and a step size lr (lr_eff: the push's or the tensor's
 * lr, divided by AdaDelay's 1 + adadelay * tau). State lives next to the
 * weights, as long as the tensor (ps_tensor.s1, .s2):
 *
 *   sgd      s1 = v:  v = mu*v + lr*(g + wd*w);  w -= v   (mu = 0: no s1)
 *   adam     s1 = m, s2 = v:  g' = g + wd*w;  m = b1*m + (1-b1)*g';
 *            v = b2*v + (1-b2)*g'*g';  w -= lr * (m*bc1) / (sqrt(v*bc2) + eps)
 *   adamw    as adam on g, then w -= lr*wd*w (decoupled weight decay)
 *   adagrad  s1 = G:  g' = g + wd*w;  G += g'*g';  w -= lr * g' / (sqrt(G) + eps)
 *
 * bc1 = 1/(1 - b1^k), bc2 = 1/(1 - b2^k) for the update that makes the
 * tensor's version k (Adam's step counter is the version, so it survives
 * checkpoints and is the same on every shard).
 *
 * A "join" (a closing GDDR worker's flush in sync mode) adds late mass to
 * the step just applied instead of making a step of its own: a step of its
 * own would let momentum coast once more over every flushed chunk (v = mu*v
 * with no gradient to correct it), and measured on the Fashion-MNIST MLP
 * with momentum 0.9 that coasting cost 5 pp of the server's final accuracy
 * (scripts/momsim.py, docs/results.md). Joined: sgd v += lr*g, w -= lr*g;
 * adam/adamw m += (1-b1)*g, w -= lr*(1-b1)*g*bc1/(sqrt(v*bc2)+eps) (v kept:
 * a first-order share of the last step); adagrad w -= lr*g/(sqrt(G)+eps).
 *
 * Async fill (adam, adamw): a push marked Push.held whose worker holds a
 * chunk back steps that chunk with m-hat = m/(1-b1^(k-1)), the running mean
 * of its gradients, as the gradient, and credits m-hat to the worker; when
 * it sends the chunk (all it gathered) the credits come off. Without it a
 * held chunk is not stepped at all while held, then stepped once with the
 * sum of several gradients -- and Adam, being scale-free, turns that sum
 * into about one step's worth of movement: the held share of every chunk
 * trained at roughly (1 - alpha) of the rate, and the large sums inflated
 * v. (8 async workers, Fashion-MNIST MLP: -0.74 pp vs sync dense without.)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "ps.h"
#include "vec.h"


static const char *const kind_names[] = { "sgd", "adam", "adamw", "adagrad" };

const char *ps_optim_name(int kind)
{
    return kind >= 0 && kind < PS_OPT_KINDS ? kind_names[kind] : "?";
}

void ps_optim_from_config(const gddr_ps_config *cfg, ps_optim *o)
{
    o->kind = cfg->opt_kind;
    o->explicit_ = 0;
    o->lr = cfg->lr;
    o->momentum = cfg->opt_kind == PS_OPT_SGD ? cfg->momentum : 0.0;
    o->beta1 = cfg->beta1;
    o->beta2 = cfg->beta2;
    o->eps = cfg->eps;
    o->weight_decay = cfg->weight_decay;
}

const ps_optim *ps_optim_of(const gddr_ps *ps, const ps_tensor *t, ps_optim *tmp)
{
    if (t->opt.explicit_)
        return &t->opt;
    ps_optim_from_config(&ps->cfg, tmp);
    return tmp;
}

int ps_optim_check(const ps_optim *o, char *msg, size_t len)
{
    if (o->kind < 0 || o->kind >= PS_OPT_KINDS) {
        snprintf(msg, len, "unknown optimizer kind %d", o->kind);
        return -1;
    }
    if (!isfinite(o->lr) || o->lr < 0 || o->lr > 1e6) {
        snprintf(msg, len, "lr %g is not in [0, 1e6]", o->lr);
        return -1;
    }
    const double b[3] = { o->momentum, o->beta1, o->beta2 };
    const char *bn[3] = { "momentum", "beta1", "beta2" };
    for (int i = 0; i < 3; i++)
        if (!isfinite(b[i]) || b[i] < 0 || b[i] >= 1) {
            snprintf(msg, len, "%s %g is not in [0, 1)", bn[i], b[i]);
            return -1;
        }
    if (!isfinite(o->eps) || o->eps < 0 || (o->eps == 0 && o->kind != PS_OPT_SGD)) {
        snprintf(msg, len, "eps %g must be finite and above 0", o->eps);
        return -1;
    }
    if (!isfinite(o->weight_decay) || o->weight_decay < 0) {
        snprintf(msg, len, "weight_decay %g must be finite and at least 0", o->weight_decay);
        return -1;
    }
    if (o->momentum > 0 && o->kind != PS_OPT_SGD) {
        snprintf(msg, len, "momentum %g is for sgd only (%s has beta1)", o->momentum,
                 ps_optim_name(o->kind));
        return -1;
    }
    return 0;
}

int ps_optim_equal(const ps_optim *a, const ps_optim *b)
{
    return a->kind == b->kind && a->lr == b->lr && a->momentum == b->momentum &&
           a->beta1 == b->beta1 && a->beta2 == b->beta2 && a->eps == b->eps &&
           a->weight_decay == b->weight_decay;
}

int ps_optim_describe(const ps_optim *o, char *buf, size_t len)
{
    switch (o->kind) {
    case PS_OPT_SGD:
        return snprintf(buf, len, "sgd lr=%g momentum=%g weight_decay=%g", o->lr, o->momentum,
                        o->weight_decay);
    case PS_OPT_ADAGRAD:
        return snprintf(buf, len, "adagrad lr=%g eps=%g weight_decay=%g", o->lr, o->eps,
                        o->weight_decay);
    default:
        return snprintf(buf, len, "%s lr=%g beta1=%g beta2=%g eps=%g weight_decay=%g",
                        ps_optim_name(o->kind), o->lr, o->beta1, o->beta2, o->eps, o->weight_decay);
    }
}

int ps_optim_nstate(const ps_optim *o)
{
    switch (o->kind) {
    case PS_OPT_SGD:
        return o->momentum > 0 ? 1 : 0;
    case PS_OPT_ADAGRAD:
        return 1;
    default:
        return 2;
    }
}

int ps_optim_state(const gddr_ps *ps, ps_tensor *t)
{
    ps_optim tmp;
    int k = ps_optim_nstate(ps_optim_of(ps, t, &tmp));
    if (k >= 1 && !t->s1 && !(t->s1 = calloc(t->n, sizeof(float))))
        return -1;
    if (k >= 2 && !t->s2 && !(t->s2 = calloc(t->n, sizeof(float))))
        return -1;
    return 0;
}

void ps_upd_for(const gddr_ps *ps, const ps_tensor *t, double lr, ps_upd *u)
{
    ps_optim tmp;
    const ps_optim *o = ps_optim_of(ps, t, &tmp);
    memset(u, 0, sizeof *u);
    u->kind = o->kind;
    u->lr = (float)lr;
    u->mu = (float)o->momentum;
    u->b1 = (float)o->beta1;
    u->b2 = (float)o->beta2;
    u->eps = (float)o->eps;
    u->wd = (float)o->weight_decay;
    double k = (double)(t->version + 1); /* the version this update makes */
    double d1 = 1.0 - pow(o->beta1, k), d2 = 1.0 - pow(o->beta2, k);
    u->bc1 = d1 > 0 ? (float)(1.0 / d1) : 1.0f;
    u->bc2 = d2 > 0 ? (float)(1.0 / d2) : 1.0f;
    double d0 = 1.0 - pow(o->beta1, k - 1.0);
    u->mh = k > 1 && d0 > 0 ? (float)(1.0 / d0) : 0.0f;
}

/* ---- the loops (restrict, so that the compiler vectorises them) ---------- */

GDDR_VEC static void sgd_plain(float *out, const float *w, const float *restrict g, float gs, float lr,
                                float wd, size_t n)
{
    if (wd == 0) {
        for (size_t i = 0; i < n; i++)
            out[i] = w[i] - lr * (gs * g[i]);
        return;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = w[i] - lr * (gs * g[i] + wd * w[i]);
}

GDDR_VEC static void sgd_momentum(float *out, const float *w, float *restrict v, const float *restrict g,
                                   float gs, float lr, float mu, float wd, size_t n)
{
    if (wd == 0) {
        for (size_t i = 0; i < n; i++) {
            v[i] = mu * v[i] + lr * (gs * g[i]);
            out[i] = w[i] - v[i];
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = mu * v[i] + lr * (gs * g[i] + wd * w[i]);
        out[i] = w[i] - v[i];
    }
}

/* One element's Adam step with gradient d (weight decay already in d for
 * adam): the moments move, the new weight is returned. Shared by the
 * update and by async fill, so the two are the same arithmetic. wdec
 * (adamw's decoupled decay) is a constant at each call, so the loops that
 * inline it have no branch and vectorise. */
static inline __attribute__((always_inline)) float adam_el(float w, float d, float *m, float *v,
                                                           const ps_upd *u, int wdec)
{
    *m = u->b1 * *m + (1.0f - u->b1) * d;
    *v = u->b2 * *v + (1.0f - u->b2) * (d * d);
    float step = (*m * u->bc1) / (sqrtf(*v * u->bc2) + u->eps);
    if (wdec)
        step += u->wd * w;
    return w - u->lr * step;
}

GDDR_VEC static void adam(float *out, const float *w, float *restrict m, float *restrict v,
                          const float *restrict g, float gs, const ps_upd *u, int decoupled, size_t n)
{
    const ps_upd k = *u; /* a local: the loop keeps it in registers (m, v cannot alias it) */
    if (decoupled && k.wd != 0) {
        for (size_t i = 0; i < n; i++)
            out[i] = adam_el(w[i], gs * g[i], &m[i], &v[i], &k, 1);
    } else if (decoupled || k.wd == 0) {
        for (size_t i = 0; i < n; i++)
            out[i] = adam_el(w[i], gs * g[i], &m[i], &v[i], &k, 0);
    } else { /* adam: L2 in the gradient */
        for (size_t i = 0; i < n; i++)
            out[i] = adam_el(w[i], gs * g[i] + k.wd * w[i], &m[i], &v[i], &k, 0);
    }
}

GDDR_VEC static void adagrad(float *out, const float *w, float *restrict G, const float *restrict g,
                             float gs, float lr, float eps, float wd, size_t n)
{
    if (wd == 0) {
        for (size_t i = 0; i < n; i++) {
            float d = gs * g[i];
            G[i] += d * d;
            out[i] = w[i] - lr * d / (sqrtf(G[i]) + eps);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float d = gs * g[i] + wd * w[i];
        G[i] += d * d;
        out[i] = w[i] - lr * d / (sqrtf(G[i]) + eps);
    }
}

void ps_upd_run(const ps_upd *u, float *out, const float *w, float *s1, float *s2, const float *g,
                float gs, size_t n)
{
    switch (u->kind) {
    case PS_OPT_SGD:
        if (u->mu > 0 && s1)
            sgd_momentum(out, w, s1, g, gs, u->lr, u->mu, u->wd, n);
        else
            sgd_plain(out, w, g, gs, u->lr, u->wd, n);
        return;
    case PS_OPT_ADAM:
    case PS_OPT_ADAMW:
        adam(out, w, s1, s2, g, gs, u, u->kind == PS_OPT_ADAMW, n);
        return;
    case PS_OPT_ADAGRAD:
        adagrad(out, w, s1, g, gs, u->lr, u->eps, u->wd, n);
        return;
    }
}

int ps_upd_normalises(int kind)
{
    return kind == PS_OPT_ADAM || kind == PS_OPT_ADAMW || kind == PS_OPT_ADAGRAD;
}

int ps_upd_fills(const ps_upd *u)
{
    return u->kind == PS_OPT_ADAM || u->kind == PS_OPT_ADAMW;
}

GDDR_VEC static void adam_fill(float *out, const float *w, float *restrict m, float *restrict v,
                              float *restrict cr, const ps_upd *u, int decoupled, size_t n)
{
    const ps_upd k = *u;
    if (decoupled && k.wd != 0) {
        for (size_t i = 0; i < n; i++) {
            float d = m[i] * k.mh; /* m-hat: weight decay is in it already */
            cr[i] += d;
            out[i] = adam_el(w[i], d, &m[i], &v[i], &k, 1);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float d = m[i] * k.mh;
        cr[i] += d;
        out[i] = adam_el(w[i], d, &m[i], &v[i], &k, 0);
    }
}

void ps_upd_fill(const ps_upd *u, float *out, const float *w, float *s1, float *s2, float *cred,
                 const float *est, size_t n)
{
    if (!ps_upd_fills(u) || !s1 || !s2) {
        if (out != w)
            memcpy(out, w, n * sizeof *out);
    } else if (est) {
        /* est is the gradient, as a pushed one (adam's L2 decay added in
         * adam()); the credit is est alone, what the release is net of */
        adam(out, w, s1, s2, est, 1.0f, u, u->kind == PS_OPT_ADAMW, n);
        gddr_axpy_cpu(cred, est, n, 1.0f);
    } else {
        adam_fill(out, w, s1, s2, cred, u, u->kind == PS_OPT_ADAMW, n);
    }
}

void ps_upd_join(const ps_upd *u, float *out, const float *w, float *s1, const float *s2,
                 const float *g, float gs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float d = gs * g[i];
        float step;
        switch (u->kind) {
        case PS_OPT_SGD:
            step = u->lr * d;
            if (u->mu > 0 && s1)
                s1[i] += step;
            break;
        case PS_OPT_ADAM:
        case PS_OPT_ADAMW:
            s1[i] += (1.0f - u->b1) * d;
            step = u->lr * ((1.0f - u->b1) * d * u->bc1) / (sqrtf(s2[i] * u->bc2) + u->eps);
            break;
        default: /* adagrad */
            step = u->lr * d / (sqrtf(s1[i]) + u->eps);
            break;
        }
        out[i] = w[i] - step;
    }
}
