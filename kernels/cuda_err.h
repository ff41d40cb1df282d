/* cuda_err.h -- error reporting inside the CUDA plugin (libgddr-cuda.so).
 *
 * The plugin has no logger: a process-global one would be NULL inside a
 * library, and the plugin does not know which client called it. Instead
 * every failure leaves one message for the calling thread, which the
 * client side takes right after the call (cuda_api.h take_error) and
 * reports through the client's own logger and gddr_client_errmsg().
 *
 * The macros are for the files that call CUDA (they must include the CUDA
 * runtime and cuBLAS headers first). Each records file:line, the failing
 * call and CUDA's own message, then returns GDDR_ECUDA, or stores it in
 * `rc` and jumps to `label` (the _GOTO form, for functions that must
 * release scratch memory first).
 */
#ifndef GDDR_KERNELS_CUDA_ERR_H
#define GDDR_KERNELS_CUDA_ERR_H

#include <stddef.h>

#include "gddr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the calling thread's message (cuda_err.c). */
void gddr__cuda_seterr(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Copies it into buf, clears it, returns its length. */
size_t gddr__cuda_take_error(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#define GDDR_CUDA_TRY(call)                                                                  \
    do {                                                                                     \
        cudaError_t gddr__e = (call);                                                        \
        if (gddr__e != cudaSuccess) {                                                        \
            gddr__cuda_seterr("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                              cudaGetErrorString(gddr__e));                                  \
            return GDDR_ECUDA;                                                               \
        }                                                                                    \
    } while (0)

#define GDDR_CUDA_TRY_GOTO(call, rc, label)                                                  \
    do {                                                                                     \
        cudaError_t gddr__e = (call);                                                        \
        if (gddr__e != cudaSuccess) {                                                        \
            gddr__cuda_seterr("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                              cudaGetErrorString(gddr__e));                                  \
            (rc) = GDDR_ECUDA;                                                               \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

#define GDDR_CUBLAS_TRY(call)                                                                \
    do {                                                                                     \
        cublasStatus_t gddr__s = (call);                                                     \
        if (gddr__s != CUBLAS_STATUS_SUCCESS) {                                              \
            gddr__cuda_seterr("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                              cublasGetStatusString(gddr__s));                               \
            return GDDR_ECUDA;                                                               \
        }                                                                                    \
    } while (0)

#endif /* GDDR_KERNELS_CUDA_ERR_H */
