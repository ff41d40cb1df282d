/* replay.h -- re-injecting an orphaned residual in installments.
 *
 * docs/design.md section 7: when a worker dies, the server hands the residual
 * it still held (the orphan) to a live worker, which adds it to its own
 * residual a geometric installment at a time so one step does not receive a
 * burst of stale mass. The last installment is the whole remainder, so the
 * installments sum to the orphan and nothing is lost.
 *
 * CPU twin in replay.c, CUDA version in replay.cu (GDDR_ENOTSUP without
 * nvcc). The caller owns both buffers.
 */
#ifndef GDDR_KERNELS_REPLAY_H
#define GDDR_KERNELS_REPLAY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One installment over n floats: inst = gamma*rem; r += inst; rem -= inst;
 * when last != 0 the whole remainder goes: r += rem; rem = 0.
 * inst is taken as rem - fl(rem - gamma*rem), which differs from gamma*rem
 * by at most one rounding and makes inst + new rem == old rem exactly for
 * gamma in [0, 0.5], so the installments sum to the orphan bit for bit.
 * Returns GDDR_OK, or GDDR_EINVAL for NULL buffers or gamma outside [0,1]. */
int gddr_replay_cpu(float *r, float *rem, size_t n, float gamma, int last);

/* Device buffers, queued on `stream` (a cudaStream_t); returns without
 * waiting. */
int gddr_replay_cuda(float *d_r, float *d_rem, size_t n, float gamma, int last, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* GDDR_KERNELS_REPLAY_H */
