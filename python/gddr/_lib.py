"""_lib.py -- loads libgddr-client and declares the C API of gddr.h for
ctypes: the result structs mirror the header field by field (python/tests
checks sizes and offsets against a C compiler), and every function gets its
argument and return types, so a wrong call fails in Python rather than in
the library. gddr_client_opts is not mirrored: Opts is a buffer of the size
the library reports, filled by the library and set by name
(gddr_opts_set), and the option list comes from the library too
(gddr_opts_describe), so an option added in C needs nothing here.

Where the library comes from, first found wins:

  1. $GDDR_LIB: the path of libgddr-client.so (a file), or a folder holding it
  2. inside this package (gddr/libgddr-client.so.0: the wheel of `make wheel`
     carries it there, with the CUDA plugin beside it when one was built),
     or next to the package (a copy placed beside gddr/)
  3. the build tree this package sits in (python/gddr -> build/lib), when
     run from a checkout after `make`
  4. where `make install` put it (LIBDIR, recorded in _install.py)
  5. the dynamic loader's own search (libgddr-client.so.0: ldconfig, LD_LIBRARY_PATH;
     how Debian's python3-gddr finds libgddr-client0's library)

`path` is the file that was loaded (for 5, read back from /proc/self/maps).
"""

import ctypes
import os
from pathlib import Path

# ---- structs (gddr.h) ---------------------------------------------------------

LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class ServerInfo(ctypes.Structure):
    _fields_ = [
        ("epoch", ctypes.c_uint64),
        ("mode", ctypes.c_int),
        ("tau", ctypes.c_int),
        ("chunk", ctypes.c_int),
        ("workers", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
    ]


class PushTags(ctypes.Structure):
    _fields_ = [
        ("birth_version", ctypes.c_uint64),
        ("base_version", ctypes.c_uint64),
        ("has_birth", ctypes.c_int),
    ]


class ClientCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "steps", "pushes", "pulls", "bytes_pushed", "bytes_pulled", "values_pushed",
        "reconnects", "staleness_sum", "orphans_received", "tau_sum", "tau_count", "step_ns")]


class ServerStats(ctypes.Structure):
    _fields_ = [
        ("pushes", ctypes.c_uint64),
        ("pulls", ctypes.c_uint64),
        ("rejected", ctypes.c_uint64),
        ("versions_total", ctypes.c_uint64),
        ("staleness_mean", ctypes.c_double),
        ("staleness_ema", ctypes.c_double),
        ("staleness_max", ctypes.c_uint64),
        ("staleness_hist", ctypes.c_uint64 * 17),
        ("worker_staleness_mean", ctypes.c_double),
        ("worker_pushes", ctypes.c_uint64),
        ("tau", ctypes.c_int),
        ("live_workers", ctypes.c_int),
        ("mode", ctypes.c_int),
        ("epoch", ctypes.c_uint64),
    ]


class TableOpts(ctypes.Structure):
    """gddr_table_opts (python/tests checks the layout and the defaults of
    GDDR_TABLE_OPTS_INIT against the compiler). Fields are only ever
    appended in C; gddr_table_register_sized gets sizeof(TableOpts), so a
    newer library gives the defaults for fields this mirror lacks."""

    _fields_ = [
        ("init", ctypes.c_int),
        ("init_scale", ctypes.c_float),
        ("init_seed", ctypes.c_uint64),
        ("admit", ctypes.c_int),
        ("admit_count", ctypes.c_uint),
        ("admit_prob", ctypes.c_float),
        ("optimizer", ctypes.c_char_p),
        ("max_rows", ctypes.c_uint64),
        ("row_ttl", ctypes.c_uint64),
    ]


TINIT = {"zeros": 0, "uniform": 1, "normal": 2}     # GDDR_TINIT_*
TADMIT = {"always": 0, "count": 1, "prob": 2}      # GDDR_TADMIT_*
ROWS_NOCREATE = 1                                  # GDDR_ROWS_NOCREATE


def struct_dict(s):
    """A ctypes struct as a plain dict (arrays become lists)."""
    out = {}
    for name, _ in s._fields_:
        v = getattr(s, name)
        out[name] = list(v) if isinstance(v, ctypes.Array) else v
    return out


# ---- finding the library ------------------------------------------------------

SONAME = "libgddr-client.so.0"
NAMES = ("libgddr-client.so", SONAME)


def _in_dir(d):
    for name in NAMES:
        p = Path(d) / name
        if p.is_file():
            return p
    return None


def candidates():
    """Where the library is looked for, in order (paths that exist only)."""
    here = Path(__file__).resolve().parent
    found = []
    env = os.environ.get("GDDR_LIB")
    if env:
        p = Path(env)
        found.append(p if p.is_file() else _in_dir(p))
        if found[-1] is None:
            raise OSError("GDDR_LIB=%s is neither libgddr-client.so nor a folder holding it" % env)
        return found
    for d in (here, here.parent, here.parent.parent / "build" / "lib"):
        p = _in_dir(d)
        if p:
            found.append(p)
    try:
        from . import _install  # written by `make install`
        p = _in_dir(_install.LIBDIR)
        if p:
            found.append(p)
    except ImportError:
        pass
    return found


def _mapped(name):
    """The path of the loaded object whose file name is `name`, else `name`."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split(None, 5)[-1].strip()
                if p.endswith("/" + name):
                    return p
    except OSError:
        pass
    return name


def load():
    tried = []
    for p in candidates():
        try:
            return ctypes.CDLL(str(p)), str(p)
        except OSError as e:
            tried.append("%s: %s" % (p, e))
    try:
        return ctypes.CDLL(SONAME), _mapped(SONAME)
    except OSError as e:
        tried.append("%s: %s" % (SONAME, e))
    raise OSError("gddr: cannot load libgddr-client (install the wheel of `make wheel`, which "
                  "carries it, or the Debian package libgddr-client0; or build it with `make`, "
                  "install it with `make install`, or set GDDR_LIB to its path); tried:\n  "
                  + "\n  ".join(tried))


lib, path = load()

# ---- prototypes ---------------------------------------------------------------

_c = ctypes
_P = _c.c_void_p            # gddr_client * (opaque)
_FP = _c.POINTER(_c.c_float)
_U64P = _c.POINTER(_c.c_uint64)


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_S = _c.POINTER(_c.c_char_p)
strerror = _proto("gddr_strerror", _c.c_char_p, _c.c_int)
opts_size = _proto("gddr_client_opts_size", _c.c_size_t)
opts_init_sized = _proto("gddr_client_opts_init_sized", _c.c_int, _P, _c.c_size_t)
opts_set = _proto("gddr_opts_set", _c.c_int, _P, _c.c_size_t, _c.c_char_p, _c.c_char_p)
opts_set_ptr = _proto("gddr_opts_set_ptr", _c.c_int, _P, _c.c_size_t, _c.c_char_p, _c.c_void_p)
opts_get = _proto("gddr_opts_get", _c.c_int, _P, _c.c_size_t, _c.c_char_p, _c.c_char_p, _c.c_size_t)
opts_describe = _proto("gddr_opts_describe", _c.c_char_p, _c.c_size_t, _S, _S, _S, _S)
opts_errmsg = _proto("gddr_opts_errmsg", _c.c_char_p)
client_open_sized = _proto("gddr_client_open_sized", _c.c_int, _P, _c.c_size_t, _c.POINTER(_P))
client_open_ini_sized = _proto("gddr_client_open_ini_sized", _c.c_int, _c.c_char_p, _P, _c.c_size_t,
                               _c.POINTER(_P), _c.c_char_p, _c.c_size_t)
client_close = _proto("gddr_client_close", None, _c.POINTER(_P))
client_errmsg = _proto("gddr_client_errmsg", _c.c_char_p, _P)
client_info = _proto("gddr_client_info", _c.c_int, _P, _c.POINTER(ServerInfo))
register = _proto("gddr_register", _c.c_int, _P, _c.c_char_p, _P, _c.c_size_t,
                  _c.POINTER(_c.c_int), _U64P)
register_opt = _proto("gddr_register_opt", _c.c_int, _P, _c.c_char_p, _P, _c.c_size_t, _c.c_char_p,
                      _c.POINTER(_c.c_int), _U64P)
tensor_optimizer = _proto("gddr_tensor_optimizer", _c.c_int, _P, _c.c_int, _c.c_char_p, _c.c_size_t)
set_lr = _proto("gddr_set_lr", _c.c_int, _P, _c.c_double)
pull = _proto("gddr_pull", _c.c_int, _P, _c.c_int, _P, _c.c_uint64, _U64P)
push = _proto("gddr_push", _c.c_int, _P, _c.c_int, _P, _U64P)
push_ex = _proto("gddr_push_ex", _c.c_int, _P, _c.c_int, _P, _c.POINTER(PushTags), _U64P)
pull_async = _proto("gddr_pull_async", _c.c_int, _P, _c.c_int, _P, _c.c_uint64, _U64P)
push_async = _proto("gddr_push_async", _c.c_int, _P, _c.c_int, _P, _c.POINTER(PushTags), _U64P)
wait = _proto("gddr_wait", _c.c_int, _P, _c.c_uint64, _c.c_int, _U64P)
# Pointer arrays are passed as arrays of void * (host or CUDA device addresses).
step = _proto("gddr_step", _c.c_int, _P, _c.POINTER(_P), _c.POINTER(_P))
step_submit = _proto("gddr_step_submit", _c.c_int, _P, _c.POINTER(_P))
step_wait = _proto("gddr_step_wait", _c.c_int, _P, _c.POINTER(_P))
metrics_text = _proto("gddr_server_metrics_text", _c.c_int, _P, _c.POINTER(_c.c_void_p))
request_checkpoint = _proto("gddr_request_checkpoint", _c.c_int, _P)
next_step = _proto("gddr_next_step", _c.c_uint64, _P)
tensor_version = _proto("gddr_tensor_version", _c.c_int, _P, _c.c_int, _U64P)
counters_get = _proto("gddr_client_counters_get", _c.c_int, _P, _c.POINTER(ClientCounters))
stats_get = _proto("gddr_server_stats_get", _c.c_int, _P, _c.POINTER(ServerStats))
table_register_sized = _proto("gddr_table_register_sized", _c.c_int, _P, _c.c_char_p, _c.c_uint32,
                              _c.POINTER(TableOpts), _c.c_size_t, _c.POINTER(_c.c_int))
pull_rows = _proto("gddr_pull_rows", _c.c_int, _P, _c.c_int, _U64P, _c.c_size_t, _FP, _c.c_uint,
                   _c.c_uint64, _U64P)
push_rows = _proto("gddr_push_rows", _c.c_int, _P, _c.c_int, _U64P, _c.c_size_t, _FP, _U64P)

# gddr_server_metrics_text's string is malloc'd by the library: free() it
# with the C library's free (the same allocator in one process).
libc = ctypes.CDLL(None)
libc.free.argtypes = [_c.c_void_p]
libc.free.restype = None

# Whether the library takes CUDA device memory: asked of the library
# (gddr_cuda_status: built with CUDA, its plugin and the driver found, a
# device present), with the reason when not. (CUDA lives in the plugin
# libgddr-cuda.so, so no CUDA symbol is visible on the library itself.)
_cuda_status = _proto("gddr_cuda_status", _c.c_int, _c.c_char_p, _c.c_size_t)
_why = _c.create_string_buffer(512)
HAS_CUDA = bool(_cuda_status(_why, len(_why)))
CUDA_REASON = _why.value.decode("utf-8", "replace")


# ---- options, by name -----------------------------------------------------------


def describe():
    """Every field of gddr_client_opts as the library describes it
    (gddr_opts_describe): a list of dicts with name, type ("int", "uint64",
    "double", "bool", "enum", "string", "pointer"), default (text), choices
    ({name: value} of an enum, else {}) and help."""
    out, i = [], 0
    while True:
        t, d, ch, h = _c.c_char_p(), _c.c_char_p(), _c.c_char_p(), _c.c_char_p()
        name = opts_describe(i, _c.byref(t), _c.byref(d), _c.byref(ch), _c.byref(h))
        if name is None:
            return out
        choices = {}
        for pair in filter(None, ch.value.decode().split(",")):
            k, _, v = pair.partition("=")
            choices[k] = int(v)
        out.append({"name": name.decode(), "type": t.value.decode(), "default": d.value.decode(),
                    "choices": choices, "help": h.value.decode()})
        i += 1


class OptsError(ValueError):
    """gddr_opts_set refused a name or value (the library's sentence)."""


class Opts:
    """A gddr_client_opts of the size the library reports, with its
    defaults (gddr_client_opts_init_sized), set and read by name. The
    strings and the callback it points at are kept alive here."""

    def __init__(self):
        self.size = opts_size()
        # Whole uint64 words: aligned for every field.
        self.buf = (_c.c_uint64 * ((self.size + 7) // 8))()
        self._keep = []
        rc = opts_init_sized(self.buf, self.size)
        if rc != 0:
            raise OptsError(opts_errmsg().decode(errors="replace"))

    def set(self, name, text):
        b = text.encode() if isinstance(text, str) else bytes(text)
        self._keep.append(b)
        if opts_set(self.buf, self.size, name.encode(), b) != 0:
            raise OptsError(opts_errmsg().decode(errors="replace"))

    def set_ptr(self, name, ptr):
        self._keep.append(ptr)
        if opts_set_ptr(self.buf, self.size, name.encode(), _c.cast(ptr, _c.c_void_p)) != 0:
            raise OptsError(opts_errmsg().decode(errors="replace"))

    def get(self, name):
        out = _c.create_string_buffer(512)
        if opts_get(self.buf, self.size, name.encode(), out, len(out)) != 0:
            raise OptsError(opts_errmsg().decode(errors="replace"))
        return out.value.decode(errors="replace")
