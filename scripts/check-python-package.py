#!/usr/bin/python3
"""check-python-package.py ENDPOINT PACKAGE_DIR LIBRARY [PLUGIN]: an
installed gddr package (the wheel in a venv, scripts/test-wheel.sh; the
Debian package python3-gddr in a scratch root, scripts/test-deb.sh) works.

Asserts that `import gddr` took the package from PACKAGE_DIR and loaded
LIBRARY (GDDR_LIB must be unset: the package finds its library itself);
that one tensor registered on the gddr-ps at ENDPOINT pulls back exactly,
and that one pushed gradient changes it exactly by lr * g (the server runs
plain SGD with --set lr=0.5); with PLUGIN, that the CUDA plugin was loaded
from that file (run with a stand-in libcuda.so.1 on LD_LIBRARY_PATH, so
that the library looks for its plugin on a host without a GPU)."""
import os
import sys

import numpy as np

ep, pkg_dir, library = sys.argv[1:4]
plugin = sys.argv[4] if len(sys.argv) > 4 else None
assert "GDDR_LIB" not in os.environ, "GDDR_LIB is set: the test must not name the library"
import gddr  # noqa: E402

real = os.path.realpath
assert real(gddr.__file__) == real(os.path.join(pkg_dir, "gddr", "__init__.py")), gddr.__file__
assert real(gddr.library_path) == real(library), "loaded %s, expected %s" % (gddr.library_path, library)
if plugin:
    maps = open("/proc/self/maps").read()
    assert real(plugin) in maps, "plugin %s not loaded (%s)" % (plugin, gddr.cuda_reason)
    assert "not loaded" not in gddr.cuda_reason, gddr.cuda_reason
w0 = (np.arange(16, dtype=np.float32) * 0.25).reshape(4, 4)
with gddr.Client(ep, rank=0, world_size=1, timeout_ms=10000) as c:
    name = "pkg.w.%d" % os.getpid()  # a new tensor, whatever ran before on that server
    c.register(name, w0)
    w = c.pull(name)
    assert np.array_equal(w, w0.ravel()), w
    g = np.full(16, 2.0, np.float32)
    c.push(name, g)
    w = c.pull(name, min_version=1)
    assert np.array_equal(w, w0.ravel() - 1.0), w  # lr 0.5 * g 2.0, exact in float32
print("gddr %s from %s, library %s%s: pulled and pushed exactly" % (
    gddr.__version__, os.path.dirname(gddr.__file__),
    gddr.library_path, ", plugin %s" % plugin if plugin else ""))
