/* fused.c -- CPU twin of the fused pass (see fused.h).
 *
 * Per element the operations are those of gddr_scal_cpu(), gddr_dc_cpu()
 * (the same gddr__dc_one()) and gddr_residual_step_cpu() in that order, so
 * the results are the unfused sequence's bit for bit; only the L1 sum of r
 * is accumulated in another order than gddr_asum_cpu()'s. This is the
 * reference for fused.cu and the "kernel" of the test plugin that runs the
 * client's device path on the CPU.
 */
#include "fused.h"

#include <math.h>

#include "gddr_base.h"

int gddr_fused_cpu(const gddr_fused_args *a, const gddr_fused_bufs *b)
{
    if (!a || !b || !b->ctl)
        return GDDR_EINVAL;
    const gddr_dc_args *d = &a->dca;
    if (a->dc && d->mode != GDDR_DC_DIAG && d->mode != GDDR_DC_IDENTITY)
        return GDDR_EINVAL;
    if (a->residual && (a->chunk == 0 || gddr_nchunks(a->n, a->chunk) > (size_t)UINT32_MAX))
        return GDDR_EINVAL;
    if (a->n == 0) {
        if (a->residual && b->l1 && b->ctl[1] != 0.0f)
            *b->l1 = 0.0;
        return GDDR_OK;
    }
    if (!b->g || !b->out || (a->residual && (!b->r || !b->rank)) ||
        (a->dc && (!b->w_new || !b->w_bak || (d->adaptive && !b->ms))))
        return GDDR_EINVAL;
    if (b->ctl[1] == 0.0f)
        return GDDR_OK; /* a non-finite norm: the step fails, nothing changes */

    const float scale = b->ctl[0];
    const float lambda = d->lambda, decay = d->ms_decay, keep = 1.0f - d->ms_decay;
    const float msc = d->ms_scale > 0.0f ? d->ms_scale : 1.0f;
    const int diag = d->mode == GDDR_DC_DIAG, adaptive = a->dc && d->adaptive;
    const size_t n = a->n;
    /* Dense is one run of n floats; a residual pass walks the chunks, so
     * each chunk's fate is read once (elements stay in order). */
    const size_t run = a->residual ? a->chunk : n;
    double l1 = 0.0;
    for (size_t lo = 0, c = 0; lo < n; lo += run, c++) {
        const size_t hi = lo + run < n ? lo + run : n;
        const uint32_t k = a->residual ? b->rank[c] : 0;
        /* where element lo goes: the same place (dense), its packed place
         * (sent), or nowhere (held) */
        float *dst = !a->residual      ? b->out + lo
                     : k == GDDR_HELD ? NULL
                                      : b->out + (size_t)k * a->chunk;
        for (size_t i = lo; i < hi; i++) {
            float gi = b->g[i] * scale;
            if (a->dc)
                gi = gddr__dc_one(gi, b->w_new[i], b->w_bak[i], adaptive ? b->ms + i : NULL,
                                  lambda, decay, keep, d->eps, msc, diag, adaptive);
            if (!a->residual) {
                dst[i - lo] = gi;
                continue;
            }
            const float u = b->r[i] + gi;
            if (!dst) {
                b->r[i] = u;
                l1 += fabs((double)u);
            } else {
                dst[i - lo] = u;
                b->r[i] = 0.0f;
            }
        }
    }
    if (a->residual && b->l1)
        *b->l1 = l1;
    return GDDR_OK;
}
