/* dc.c -- CPU twin of DC-ASGD compensation (see dc.h).
 *
 * The arithmetic is written as separate multiplies and adds in the order
 * dc.cu performs them with round-to-nearest intrinsics, so the two agree to
 * the last bit whenever the host compiler does not fuse them (gcc on x86-64
 * without -mfma does not); the tests still compare with a tolerance.
 */
#include "dc.h"

#include <math.h>

#include "blas.h"
#include "gddr_base.h"
#include "log.h"

int gddr_dc_cpu(const gddr_dc_args *a, float *g, const float *w_new, const float *w_bak,
                float *ms)
{
    if (!a || (a->mode != GDDR_DC_DIAG && a->mode != GDDR_DC_IDENTITY)) {
        gddr_log(GDDR_LOG_ERROR, "dc: unknown mode %d", a ? a->mode : -1);
        return GDDR_EINVAL;
    }
    if (a->n == 0)
        return GDDR_OK;
    if (!g || !w_new || !w_bak || (a->adaptive && !ms))
        return GDDR_EINVAL;

    const float lambda = a->lambda, decay = a->ms_decay, keep = 1.0f - a->ms_decay;
    const float scale = a->ms_scale > 0.0f ? a->ms_scale : 1.0f;
    const int diag = a->mode == GDDR_DC_DIAG;
    for (size_t i = 0; i < a->n; i++)
        g[i] = gddr__dc_one(g[i], w_new[i], w_bak[i], a->adaptive ? ms + i : NULL, lambda, decay,
                            keep, a->eps, scale, diag, a->adaptive);
    return GDDR_OK;
}
