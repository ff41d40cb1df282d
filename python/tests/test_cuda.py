"""The device path from Python without torch: gradients and parameters in
CUDA memory (cudaMalloc through the cudart the library links) go to
gddr_step as device pointers (Client.step_ptrs), and end where the same
steps from host memory end. Needs a CUDA build of the library and a GPU;
skipped with the reason elsewhere (scripts/gpu-check.sh runs it on a GPU).
"""

import ctypes

import numpy as np
import pytest

import gddr
from gddr import _lib


def test_has_cuda_asks_the_library():
    """gddr.has_cuda is the library's own answer (gddr_cuda_status), with the
    reason when it is False; it used to look for a CUDA symbol on the
    library, which has none since CUDA moved into the plugin, so it was
    False on every GPU host."""
    why = ctypes.create_string_buffer(512)
    assert gddr.has_cuda is bool(_lib.lib.gddr_cuda_status(why, len(why)))
    if not gddr.has_cuda:
        assert gddr.cuda_reason and gddr.cuda_reason == why.value.decode()
    else:
        assert gddr.cuda_reason == ""


def cudart():
    """The CUDA runtime the library's plugin loaded (found in this process's
    mappings), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libcudart.so" in path:
                    return ctypes.CDLL(path)
    except OSError:
        pass
    return None


CUDART = cudart() if gddr.has_cuda else None


def cuda_devices():
    """(count, why not) of the CUDA devices the library could use."""
    if not gddr.has_cuda:
        return 0, "no CUDA for libgddr-client: " + gddr.cuda_reason
    if CUDART is None:
        return 0, "the CUDA runtime is not loaded in this process"
    n = ctypes.c_int(0)
    err = CUDART.cudaGetDeviceCount(ctypes.byref(n))
    if err != 0:
        return 0, "no usable CUDA device (cudaGetDeviceCount: error %d)" % err
    return n.value, ""


COUNT, WHY = cuda_devices()
needs_gpu = pytest.mark.skipif(COUNT == 0, reason=WHY + "; scripts/gpu-check.sh runs this on a GPU")

H2D, D2H = 1, 2


class DeviceArray:
    def __init__(self, host):
        self.n = host.size
        self.ptr = ctypes.c_void_p()
        assert CUDART.cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(4 * self.n)) == 0
        self.put(host)

    def put(self, host):
        assert CUDART.cudaMemcpy(self.ptr, ctypes.c_void_p(host.ctypes.data),
                                   ctypes.c_size_t(4 * self.n), H2D) == 0

    def get(self):
        out = np.empty(self.n, np.float32)
        assert CUDART.cudaMemcpy(ctypes.c_void_p(out.ctypes.data), self.ptr,
                                   ctypes.c_size_t(4 * self.n), D2H) == 0
        return out

    def free(self):
        CUDART.cudaFree(self.ptr)


@needs_gpu
@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_device_pointers_step_like_host_arrays(server, clients, alpha):
    n, steps = 5000, 12
    target = ((np.arange(n) % 7) * 0.37 - 1.0).astype(np.float32)
    finals = []
    for device in (True, False):
        srv = server(lr=0.1, chunk=256)
        c = clients(srv, delay_fraction=alpha, dc_lambda=0.1)
        w = np.zeros(n, np.float32)
        c.register("w", w)
        c.pull("w", w)
        dw, dg = (DeviceArray(w), DeviceArray(w)) if device else (None, None)
        g = np.empty_like(w)
        for _ in range(steps):
            if device:
                np.subtract(dw.get(), target, out=g)
                dg.put(g)
                c.step_ptrs([dg.ptr.value], [dw.ptr.value])
            else:
                np.subtract(w, target, out=g)
                c.step([g], [w])
        finals.append(dw.get() if device else w.copy())
        if device:
            dw.free(), dg.free()
    np.testing.assert_allclose(finals[0], finals[1], rtol=1e-5, atol=1e-6)
    assert not np.array_equal(finals[1], np.zeros(n, np.float32))
