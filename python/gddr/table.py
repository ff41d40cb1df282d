"""table.py -- sparse embedding tables (gddr.h "Sparse embedding tables",
docs/protocol.md "Tables"): rows of `dim` float32 values named by 64-bit
keys, created on the server at first touch and stepped there by the
table's own optimizer with the gradients pushed for them.

    t = client.register_table("words", 64, init="uniform", init_scale=0.01,
                              optimizer="adagrad lr=0.1")
    keys = np.array([7, 2**64 - 1, 7], np.uint64)   # int64 works too (same bits)
    rows = t.pull(keys)                 # (3, 64) float32; key 7's row twice
    t.push(keys, grads)                 # (3, 64): key 7's two gradients summed

Keys are uint64. An int64 array is read as uint64 with the same bits (no
copy: -1 is key 2**64 - 1), so torch's LongTensor ids go as they are;
Python ints are taken modulo 2**64. In sync mode every worker pushes every
table once a step, an empty push (no keys) when it has no rows to push.
"""

import ctypes

import numpy as np

from . import _lib
from .errors import InvalidArgument, LengthMismatch
from .optim import check_name, optimizer_text

_U64P = ctypes.POINTER(ctypes.c_uint64)
_FP = ctypes.POINTER(ctypes.c_float)
_MASK = (1 << 64) - 1


def as_keys(keys):
    """keys as a C-contiguous uint64 array: a uint64 array as it is, an
    int64 one viewed as uint64 (same bits, no copy), any other integer
    array or a list of Python ints converted (ints modulo 2**64)."""
    if isinstance(keys, np.ndarray):
        if keys.dtype == np.uint64 or keys.dtype == np.int64:
            k = np.ascontiguousarray(keys).reshape(-1)
            return k.view(np.uint64)
        if keys.dtype.kind in "iu":
            return np.ascontiguousarray(keys.astype(np.int64)).reshape(-1).view(np.uint64)
        raise InvalidArgument("keys must be integers (uint64 or int64), not %s" % keys.dtype)
    if isinstance(keys, (int, np.integer)):
        keys = [keys]
    try:
        vals = [int(k) & _MASK for k in keys]
    except (TypeError, ValueError):
        raise InvalidArgument("keys must be integers (a numpy uint64/int64 array or a list "
                              "of ints), not %r" % (keys,)) from None
    if any(isinstance(k, (bool, float)) for k in keys):
        raise InvalidArgument("keys must be integers, not floats or booleans")
    return np.array(vals, dtype=np.uint64)


def _key_ptr(keys):
    return keys.ctypes.data_as(_U64P) if keys.size else None


class Table:
    """A registered table: key (its name), dim, id (the table handle, its
    own namespace: not a tensor id), and version (the table's version as
    the last pull or push of this object reported it; on several servers
    the smallest)."""

    def __init__(self, client, key, dim, id):
        self.client, self.key, self.dim, self.id = client, key, dim, id
        self.version = 0

    def pull(self, keys, create=True, min_version=0, out=None):
        """The rows of `keys` as an (n, dim) float32 array (in the order of
        the keys; a key may repeat). create=True is a training pull: rows
        are created as the table's admission says. create=False is
        inference (GDDR_ROWS_NOCREATE): a key without a row reads as zeros
        and nothing is created (an observer's pulls are always this). Waits
        until the table has min_version and this client's last push is in
        (a sync step completed). out: an (n, dim) float32 C-contiguous array
        to write into."""
        k = as_keys(keys)
        n = k.size
        if out is None:
            out = np.empty((n, self.dim), dtype=np.float32)
        elif (not isinstance(out, np.ndarray) or out.dtype != np.float32
              or not out.flags.c_contiguous or not out.flags.writeable):
            raise InvalidArgument("out must be a writable C-contiguous float32 numpy array")
        elif out.size != n * self.dim:
            raise LengthMismatch("out holds %d values, %d keys of dim %d need %d"
                                 % (out.size, n, self.dim, n * self.dim))
        flags = 0 if create else _lib.ROWS_NOCREATE
        c = self.client
        with c._lock:
            v = ctypes.c_uint64()
            rc = _lib.pull_rows(c._handle(), self.id, _key_ptr(k), n,
                                out.ctypes.data_as(_FP) if n else None, flags, int(min_version),
                                ctypes.byref(v))
            c._check(rc, "pull_rows %r" % self.key)
        self.version = v.value
        return out

    def push(self, keys, grads):
        """Pushes the gradients of the rows of `keys` (grads: (n, dim) or
        n * dim floats, in the order of the keys; a repeated key's
        gradients are summed). Float arrays of another dtype or layout are
        converted (a copy). No keys is an empty push: in sync mode a worker
        without rows this step still makes one. Returns the table's version
        after it."""
        k = as_keys(keys)
        n = k.size
        g = np.ascontiguousarray(grads, dtype=np.float32)
        if g.size != n * self.dim:
            raise LengthMismatch("push %r: %d gradient values for %d keys of dim %d (%d needed)"
                                 % (self.key, g.size, n, self.dim, n * self.dim))
        c = self.client
        with c._lock:
            v = ctypes.c_uint64()
            rc = _lib.push_rows(c._handle(), self.id, _key_ptr(k), n,
                                g.ctypes.data_as(_FP) if n else None, ctypes.byref(v))
            c._check(rc, "push_rows %r" % self.key)
        self.version = v.value
        return v.value

    def __repr__(self):
        return "Table(%r, dim=%d, id=%d)" % (self.key, self.dim, self.id)


def _choice(name, value, table):
    if value not in table:
        raise InvalidArgument("%s must be one of %s, not %r" % (name, sorted(table, key=table.get),
                                                                 value))
    return table[value]


def register_table(client, key, dim, init="zeros", init_scale=0.0, init_seed=0, admit="always",
                   admit_count=1, admit_prob=1.0, optimizer=None, max_rows=0, row_ttl=0):
    """Client.register_table's body (gddr_table_register)."""
    raw = check_name(key)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= dim <= 65536:
        raise InvalidArgument("dim must be an integer in 1..65536, not %r" % (dim,))
    text = optimizer_text(optimizer)
    o = _lib.TableOpts()
    o.init = _choice("init", init, _lib.TINIT)
    o.init_scale = float(init_scale)
    o.init_seed = int(init_seed) & _MASK
    o.admit = _choice("admit", admit, _lib.TADMIT)
    if isinstance(admit_count, bool) or not isinstance(admit_count, (int, np.integer)) \
            or not 0 <= admit_count < 2 ** 32:
        raise InvalidArgument("admit_count must be an integer >= 1, not %r" % (admit_count,))
    o.admit_count = int(admit_count)
    o.admit_prob = float(admit_prob)
    enc = None if text is None else text.encode()
    o.optimizer = enc
    for name, v in (("max_rows", max_rows), ("row_ttl", row_ttl)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < 2 ** 64:
            raise InvalidArgument("%s must be an integer >= 0, not %r" % (name, v))
    o.max_rows, o.row_ttl = int(max_rows), int(row_ttl)
    with client._lock:
        tid = ctypes.c_int()
        rc = _lib.table_register_sized(client._handle(), raw, int(dim), ctypes.byref(o),
                                       ctypes.sizeof(o), ctypes.byref(tid))
        client._check(rc, "register_table %r" % key)
    t = Table(client, key, int(dim), tid.value)
    client._tables[key] = t
    return t
