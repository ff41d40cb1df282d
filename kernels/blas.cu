/* blas.cu -- the probe kernel behind gddr_cuda_available().
 *
 * A device can be present and still unable to run our code (a driver older
 * than the runtime, a GPU of an architecture the fatbinary lacks). Launching
 * one trivial kernel and reading back its answer is the cheapest way to tell
 * "can compile CUDA" from "can run CUDA" before any test or training step
 * depends on it. Everything else in blas.h is host code in blas.c.
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "blas.h"
#include "cuda_err.h"
#include "gddr_base.h"

static __global__ void probe_kernel(int *out)
{
    *out = 0x600d;
}

extern "C" int gddr__cuda_probe(char *why, size_t whylen)
{
    int *d = NULL, h = 0;
    cudaError_t e = cudaMalloc((void **)&d, sizeof *d);
    if (e == cudaSuccess) {
        probe_kernel<<<1, 1>>>(d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    if (d)
        cudaFree(d);
    if (e != cudaSuccess || h != 0x600d) {
        if (why && whylen)
            snprintf(why, whylen, "CUDA device present but kernels do not run (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "probe kernel wrote nothing");
        (void)cudaGetLastError();
        return 0;
    }
    return 1;
}
