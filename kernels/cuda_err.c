/* cuda_err.c -- the plugin's per-thread error message (cuda_err.h): set by
 * the host side (cuda_rt.c) and the kernels' launchers (*.cu), taken by the
 * client through the plugin's table. A file of its own, below both, so
 * that the kernels do not call back into cuda_rt.c. Plugin only, like
 * cuda_rt.c.
 */
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda_err.h"

static __thread char last_err[512];

void gddr__cuda_seterr(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
    /* A failed call may leave a sticky-looking error for the next
     * cudaGetLastError(); the message above has it already. */
    (void)cudaGetLastError();
}

size_t gddr__cuda_take_error(char *buf, size_t len)
{
    size_t n = strlen(last_err);
    if (buf && len) {
        snprintf(buf, len, "%s", last_err);
    }
    last_err[0] = 0;
    return n;
}
