/* model.c -- forward and backward passes of softmax regression and the MLP.
 *
 * Everything is single-threaded float32 with a fixed loop order, so the
 * same parameters and batch give bit-identical loss and gradients on every
 * run and every worker built with the same compiler. The hot loops are all
 * "row += scalar * row" (axpy) over contiguous outputs: gcc 12 at -O2 uses
 * its very-cheap vectorizer cost model, which refuses loops with an unknown
 * trip count, so axpy walks blocks of exactly 8 and finishes with a scalar
 * tail. Reductions (dot products) would need -ffast-math to vectorize and
 * are kept out of the hot paths. Zero inputs are skipped: about half the
 * Fashion-MNIST pixels and half the ReLU outputs are 0.
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gddr/gddr.h"

#define MAX_TENSORS 4
/* Examples per forward pass in gddr_model_evaluate. */
#define EVAL_CHUNK 256

struct gddr_model {
    gddr_model_kind kind;
    int dim, hidden, classes, nt;
    const char *name[MAX_TENSORS];
    size_t len[MAX_TENSORS];
    float *p[MAX_TENSORS], *g[MAX_TENSORS];
    /* Scratch for `cap` examples: hidden activations h and their gradient
     * dh (MLP only), then logits z, which become d(loss)/dz in place. */
    int cap;
    float *scratch, *h, *dh, *z;
};

static void axpy(int n, float a, const float *restrict x, float *restrict y)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            y[i + j] += a * x[i + j];
    for (; i < n; i++)
        y[i] += a * x[i];
}

int gddr_model_create(gddr_model_kind kind, int dim, int hidden, int classes, gddr_model **out)
{
    if (!out)
        return GDDR_EINVAL;
    *out = NULL;
    if (dim < 1 || classes < 1 || classes > 256 ||
        (kind == GDDR_MODEL_MLP && hidden < 1) ||
        (kind != GDDR_MODEL_SOFTMAX && kind != GDDR_MODEL_MLP))
        return GDDR_EINVAL;
    gddr_model *m = calloc(1, sizeof *m);
    if (!m)
        return GDDR_ENOMEM;
    m->kind = kind;
    m->dim = dim;
    m->classes = classes;
    if (kind == GDDR_MODEL_SOFTMAX) {
        m->nt = 2;
        m->name[0] = "softmax.W", m->len[0] = (size_t)dim * (size_t)classes;
        m->name[1] = "softmax.b", m->len[1] = (size_t)classes;
    } else {
        m->hidden = hidden;
        m->nt = 4;
        m->name[0] = "mlp.W1", m->len[0] = (size_t)dim * (size_t)hidden;
        m->name[1] = "mlp.b1", m->len[1] = (size_t)hidden;
        m->name[2] = "mlp.W2", m->len[2] = (size_t)hidden * (size_t)classes;
        m->name[3] = "mlp.b2", m->len[3] = (size_t)classes;
    }
    for (int i = 0; i < m->nt; i++) {
        /* Tensor lengths travel as int in places; keep them well inside. */
        if (m->len[i] > (size_t)INT32_MAX) {
            gddr_model_free(&m);
            return GDDR_EINVAL;
        }
        m->p[i] = calloc(m->len[i], sizeof(float));
        m->g[i] = calloc(m->len[i], sizeof(float));
        if (!m->p[i] || !m->g[i]) {
            gddr_model_free(&m);
            return GDDR_ENOMEM;
        }
    }
    *out = m;
    return GDDR_OK;
}

void gddr_model_free(gddr_model **mp)
{
    if (!mp || !*mp)
        return;
    gddr_model *m = *mp;
    for (int i = 0; i < m->nt; i++) {
        free(m->p[i]);
        free(m->g[i]);
    }
    free(m->scratch);
    free(m);
    *mp = NULL;
}

int gddr_model_ntensors(const gddr_model *m) { return m ? m->nt : 0; }

const char *gddr_model_tensor_name(const gddr_model *m, int i)
{
    return m && i >= 0 && i < m->nt ? m->name[i] : NULL;
}

size_t gddr_model_tensor_len(const gddr_model *m, int i)
{
    return m && i >= 0 && i < m->nt ? m->len[i] : 0;
}

float *gddr_model_params(gddr_model *m, int i)
{
    return m && i >= 0 && i < m->nt ? m->p[i] : NULL;
}

float *gddr_model_grads(gddr_model *m, int i)
{
    return m && i >= 0 && i < m->nt ? m->g[i] : NULL;
}

/* splitmix64, the same generator as the synthetic dataset. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_uniform(float *w, size_t n, double limit, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        double u = (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
        w[i] = (float)((2.0 * u - 1.0) * limit);
    }
}

void gddr_model_init(gddr_model *m, uint64_t seed)
{
    if (!m)
        return;
    uint64_t s = seed;
    for (int i = 0; i < m->nt; i++)
        memset(m->p[i], 0, m->len[i] * sizeof(float));
    if (m->kind == GDDR_MODEL_MLP) {
        fill_uniform(m->p[0], m->len[0], sqrt(6.0 / m->dim), &s);
        fill_uniform(m->p[2], m->len[2], sqrt(6.0 / (m->hidden + m->classes)), &s);
    }
}

static int ensure_scratch(gddr_model *m, int batch)
{
    if (batch <= m->cap)
        return 0;
    size_t per = 2 * (size_t)m->hidden + (size_t)m->classes;
    float *s = malloc((size_t)batch * per * sizeof(float));
    if (!s)
        return -1;
    free(m->scratch);
    m->scratch = s;
    m->cap = batch;
    m->h = s;
    m->dh = s + (size_t)batch * (size_t)m->hidden;
    m->z = s + 2 * (size_t)batch * (size_t)m->hidden;
    return 0;
}

/* Row b of the batch: ds[idx[b]], or ds[start + b] when idx is NULL. */
static inline const float *xrow(const gddr_dataset *ds, const int *idx, int start, int b)
{
    return ds->x + (size_t)(idx ? idx[b] : start + b) * (size_t)ds->dim;
}

static inline int yrow(const gddr_dataset *ds, const int *idx, int start, int b)
{
    return ds->y[idx ? idx[b] : start + b];
}

/* Fills m->z with the logits of the batch (and m->h for the MLP). */
static void forward(gddr_model *m, const gddr_dataset *ds, const int *idx, int start, int batch)
{
    const int D = m->dim, C = m->classes, H = m->hidden;
    if (m->kind == GDDR_MODEL_SOFTMAX) {
        const float *W = m->p[0], *bias = m->p[1];
        for (int b = 0; b < batch; b++) {
            const float *x = xrow(ds, idx, start, b);
            float *z = m->z + (size_t)b * C;
            memcpy(z, bias, (size_t)C * sizeof(float));
            for (int k = 0; k < D; k++)
                if (x[k] != 0.0f)
                    axpy(C, x[k], W + (size_t)k * C, z);
        }
        return;
    }
    const float *W1 = m->p[0], *b1 = m->p[1], *W2 = m->p[2], *b2 = m->p[3];
    for (int b = 0; b < batch; b++) {
        const float *x = xrow(ds, idx, start, b);
        float *h = m->h + (size_t)b * H, *z = m->z + (size_t)b * C;
        memcpy(h, b1, (size_t)H * sizeof(float));
        for (int k = 0; k < D; k++)
            if (x[k] != 0.0f)
                axpy(H, x[k], W1 + (size_t)k * H, h);
        memcpy(z, b2, (size_t)C * sizeof(float));
        for (int j = 0; j < H; j++) {
            h[j] = h[j] > 0.0f ? h[j] : 0.0f;
            if (h[j] != 0.0f)
                axpy(C, h[j], W2 + (size_t)j * C, z);
        }
    }
}

/* Turns logits into the summed cross-entropy of the batch. With grad set,
 * m->z becomes d(mean loss)/dz = (softmax - onehot) / batch. Counts the
 * examples whose largest logit (the first, on ties) is the label. Returns
 * NAN on a label out of range. */
static double xent(gddr_model *m, const gddr_dataset *ds, const int *idx, int start, int batch,
                   int grad, long *correct)
{
    const int C = m->classes;
    double total = 0.0;
    for (int b = 0; b < batch; b++) {
        float *z = m->z + (size_t)b * C;
        int y = yrow(ds, idx, start, b);
        if (y >= C)
            return NAN;
        int arg = 0;
        for (int c = 1; c < C; c++)
            if (z[c] > z[arg])
                arg = c;
        *correct += arg == y;
        /* Subtracting the max keeps expf below 1, so it cannot overflow. */
        float mx = z[arg];
        double sum = 0.0;
        float zy = z[y];
        for (int c = 0; c < C; c++) {
            z[c] = expf(z[c] - mx);
            sum += z[c];
        }
        total += log(sum) - (double)(zy - mx);
        if (grad) {
            float inv = (float)(1.0 / (sum * batch));
            for (int c = 0; c < C; c++)
                z[c] *= inv;
            z[y] -= 1.0f / (float)batch;
        }
    }
    return total;
}

/* Fills the gradients from m->z = dL/dz (and m->h for the MLP). The weight
 * gradients loop over inputs k outside and examples inside, so one row of
 * dW stays in L1 while the batch streams past it. */
static void backward(gddr_model *m, const gddr_dataset *ds, const int *idx, int batch)
{
    const int D = m->dim, C = m->classes, H = m->hidden;
    for (int i = 0; i < m->nt; i++)
        memset(m->g[i], 0, m->len[i] * sizeof(float));
    if (m->kind == GDDR_MODEL_SOFTMAX) {
        float *dW = m->g[0], *db = m->g[1];
        for (int b = 0; b < batch; b++)
            axpy(C, 1.0f, m->z + (size_t)b * C, db);
        for (int k = 0; k < D; k++)
            for (int b = 0; b < batch; b++) {
                float xv = xrow(ds, idx, 0, b)[k];
                if (xv != 0.0f)
                    axpy(C, xv, m->z + (size_t)b * C, dW + (size_t)k * C);
            }
        return;
    }
    float *dW1 = m->g[0], *db1 = m->g[1], *dW2 = m->g[2], *db2 = m->g[3];
    const float *W2 = m->p[2];
    for (int b = 0; b < batch; b++) {
        const float *dz = m->z + (size_t)b * C, *h = m->h + (size_t)b * H;
        float *dh = m->dh + (size_t)b * H;
        axpy(C, 1.0f, dz, db2);
        for (int j = 0; j < H; j++) {
            float acc = 0.0f;
            if (h[j] != 0.0f) {
                axpy(C, h[j], dz, dW2 + (size_t)j * C);
                /* A dot product over C (10) classes: too short to matter. */
                for (int c = 0; c < C; c++)
                    acc += W2[(size_t)j * C + c] * dz[c];
            }
            /* ReLU passes the gradient only where it was active. */
            dh[j] = acc;
        }
        axpy(H, 1.0f, dh, db1);
    }
    for (int k = 0; k < D; k++)
        for (int b = 0; b < batch; b++) {
            float xv = xrow(ds, idx, 0, b)[k];
            if (xv != 0.0f)
                axpy(H, xv, m->dh + (size_t)b * H, dW1 + (size_t)k * H);
        }
}

static int ds_ok(const gddr_model *m, const gddr_dataset *ds)
{
    return m && ds && ds->dim == m->dim && ds->n >= 0 && (ds->n == 0 || (ds->x && ds->y));
}

double gddr_model_loss_grad(gddr_model *m, const gddr_dataset *ds, const int *idx, int batch)
{
    if (!ds_ok(m, ds) || !idx || batch < 1)
        return NAN;
    for (int b = 0; b < batch; b++)
        if (idx[b] < 0 || idx[b] >= ds->n)
            return NAN;
    if (ensure_scratch(m, batch))
        return NAN;
    forward(m, ds, idx, 0, batch);
    long correct = 0;
    double total = xent(m, ds, idx, 0, batch, 1, &correct);
    if (isnan(total))
        return NAN;
    backward(m, ds, idx, batch);
    return total / batch;
}

double gddr_model_evaluate(gddr_model *m, const gddr_dataset *ds, double *mean_loss)
{
    if (mean_loss)
        *mean_loss = NAN;
    if (!ds_ok(m, ds) || ds->n < 1)
        return NAN;
    int chunk = ds->n < EVAL_CHUNK ? ds->n : EVAL_CHUNK;
    if (ensure_scratch(m, chunk))
        return NAN;
    double total = 0.0;
    long correct = 0;
    for (int start = 0; start < ds->n; start += chunk) {
        int nb = ds->n - start < chunk ? ds->n - start : chunk;
        forward(m, ds, NULL, start, nb);
        total += xent(m, ds, NULL, start, nb, 0, &correct);
        if (isnan(total))
            return NAN;
    }
    if (mean_loss)
        *mean_loss = total / ds->n;
    return (double)correct / ds->n;
}
