/* cuda_plugin.c -- the top of the CUDA plugin libgddr-cuda.so: the table of
 * every entry point (cuda_api.h) that the client library's loader
 * (cuda_loader.c) calls through, and the one exported symbol that hands it
 * over. It names the host side (cuda_rt.c), the kernels (*.cu) and the
 * error message (cuda_err.c); none of them calls back up here.
 */
#include "blas.h"
#include "cuda_api.h"
#include "cuda_err.h"

static const gddr_cuda_api table =
    GDDR_CUDA_TABLE(gddr__cuda_take_error, gddr_cuda_available, gddr_cuda_ctx_destroy,
                    gddr_cuda_ctx_stream, gddr_cuda_is_device_ptr);

/* The plugin's only exported symbol (libgddr-cuda.map). */
__attribute__((visibility("default"))) const gddr_cuda_api *gddr_cuda_plugin_entry(void)
{
    return &table;
}

