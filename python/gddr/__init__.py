"""gddr -- Python client of the GDDR parameter server, over libgddr-client.

    import numpy as np, gddr
    with gddr.Client("tcp://127.0.0.1:5555", rank=0, world_size=1) as c:
        w = np.zeros(1000, np.float32); g = np.empty_like(w)
        c.register("layer0.weight", w)   # optimizer=gddr.Optimizer("adam", lr=1e-3): the server runs Adam
        c.pull("layer0.weight", w)
        for _ in range(100):
            g[:] = w - 3.0                 # your model's gradient
            c.step([g], [w])               # push g, get the next w, in the server's mode

gddr.torch wraps a torch.nn.Module (import it explicitly: it needs torch).
docs/python.md has the whole API.
"""

from . import _lib
from .client import (DC_MODES, LOG_LEVELS, MODES, OPTIONS, Client, Tensor, Ticket,
                     default_options, strerror)
from .table import Table, as_keys
from .optim import KINDS as OPTIMIZERS, Optimizer, check_name
from .errors import *  # noqa: F401,F403 (one class per gddr_err)
from .errors import __all__ as _errors_all

__version__ = "0.1.0"
library_path = _lib.path
has_cuda = _lib.HAS_CUDA
cuda_reason = _lib.CUDA_REASON  # why has_cuda is False ("" when True)

__all__ = ["Client", "Tensor", "Ticket", "default_options", "strerror", "OPTIONS", "MODES",
           "DC_MODES", "LOG_LEVELS", "library_path", "has_cuda", "cuda_reason", "Optimizer",
           "OPTIMIZERS", "check_name", "Table", "as_keys"] + _errors_all
