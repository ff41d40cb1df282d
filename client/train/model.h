/* model.h -- the models gddr-train trains: softmax regression and a
 * one-hidden-layer MLP, forward and backward in plain C.
 *
 * A model is a list of named flat float32 tensors, because that is what the
 * parameter server stores; the trainer registers each tensor by name, pulls
 * into gddr_model_params() and pushes gddr_model_grads(). Weights are kept
 * [in][out] row-major, W[k*out + j] for input k and output j, so that the
 * forward pass is y = x W + b and every inner loop runs along contiguous
 * outputs (it vectorizes without -ffast-math). One gddr_model must be used
 * by one thread at a time; separate models share nothing.
 */
#ifndef GDDR_TRAIN_MODEL_H
#define GDDR_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"

typedef enum { GDDR_MODEL_SOFTMAX = 0, GDDR_MODEL_MLP = 1 } gddr_model_kind;

typedef struct gddr_model gddr_model; /* opaque */

/* Creates a model with zeroed parameters and gradients. Softmax regression
 * has "softmax.W" (dim*classes) and "softmax.b" (classes); the MLP
 * dim-hidden-classes with ReLU has "mlp.W1" (dim*hidden), "mlp.b1"
 * (hidden), "mlp.W2" (hidden*classes) and "mlp.b2" (classes); `hidden` is
 * ignored for softmax. Returns GDDR_OK and *out (the caller owns it and
 * frees it with gddr_model_free), GDDR_EINVAL (dim, classes < 1, classes >
 * 256, hidden < 1 for the MLP, sizes over 2^31 elements) or GDDR_ENOMEM. */
int gddr_model_create(gddr_model_kind kind, int dim, int hidden, int classes, gddr_model **out);

/* Frees *m and sets it to NULL; safe on NULL and on *m == NULL. */
void gddr_model_free(gddr_model **m);

/* The number of tensors, and the name and element count of tensor i in
 * 0..ntensors-1 (NULL / 0 for any other i). The name belongs to the model. */
int gddr_model_ntensors(const gddr_model *m);
const char *gddr_model_tensor_name(const gddr_model *m, int i);
size_t gddr_model_tensor_len(const gddr_model *m, int i);

/* The model's parameter buffer for tensor i (len floats, owned by the
 * model, valid until gddr_model_free); the trainer overwrites it with
 * pulled values. NULL for a bad i. */
float *gddr_model_params(gddr_model *m, int i);

/* The gradient buffer for tensor i, filled by gddr_model_loss_grad. */
float *gddr_model_grads(gddr_model *m, int i);

/* Sets the parameters from seed alone, so every worker starts from the
 * same point: MLP weights He-uniform (W1, before the ReLU) and
 * Xavier-uniform (W2), softmax weights 0 (the loss is convex and starts at
 * ln(classes)), biases 0. */
void gddr_model_init(gddr_model *m, uint64_t seed);

/* Mean cross-entropy over the `batch` examples ds[idx[0..batch-1]] at the
 * current parameters; fills every gradient buffer with d(mean loss)/d(param)
 * (overwriting, not accumulating). Uses a scratch buffer inside the model
 * that grows to the largest batch seen. The same inputs give bit-identical
 * results. Returns NAN, with the gradients unspecified, on bad arguments
 * (ds->dim or classes that do not match, an index out of range, a label >=
 * classes, batch < 1) or when the scratch cannot grow. */
double gddr_model_loss_grad(gddr_model *m, const gddr_dataset *ds, const int *idx, int batch);

/* Accuracy in [0,1] over all of ds at the current parameters, and the mean
 * cross-entropy in *mean_loss when it is not NULL. Leaves the gradients
 * alone. Returns NAN (and *mean_loss NAN) on the same bad arguments as
 * gddr_model_loss_grad or an empty ds. */
double gddr_model_evaluate(gddr_model *m, const gddr_dataset *ds, double *mean_loss);

/* The 1-D quadratic f(w)=0.5(w-5)^2 used to reproduce the seed experiment. */
static inline double gddr_quadratic_loss(double w) { return 0.5 * (w - 5.0) * (w - 5.0); }
static inline double gddr_quadratic_grad(double w) { return w - 5.0; }

#endif
