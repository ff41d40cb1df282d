/* replay.c -- CPU twin of orphan residual installments (see replay.h). */
#include "replay.h"

#include "gddr_base.h"

int gddr_replay_cpu(float *r, float *rem, size_t n, float gamma, int last)
{
    if (!(gamma >= 0.0f && gamma <= 1.0f))
        return GDDR_EINVAL;
    if (n == 0)
        return GDDR_OK;
    if (!r || !rem)
        return GDDR_EINVAL;
    if (last) {
        for (size_t i = 0; i < n; i++) {
            r[i] = r[i] + rem[i];
            rem[i] = 0.0f;
        }
        return GDDR_OK;
    }
    for (size_t i = 0; i < n; i++) {
        const float old = rem[i];
        const float left = old - gamma * old;
        /* Recomputing the installment from what is left makes
         * installment + left == old exactly (Sterbenz) for gamma <= 0.5. */
        r[i] = r[i] + (old - left);
        rem[i] = left;
    }
    return GDDR_OK;
}
