"""client.py -- gddr.Client: libgddr-client's C API for Python.

Arrays go to the library as pointers: a NumPy float32, C-contiguous array
is read (push, register) or written (pull, step) in place, never copied on
the way. Anything else is refused with gddr.InvalidArgument (or
gddr.LengthMismatch for a wrong size) before the library is called, so a
refused array never reaches the server.

A Client is one worker (or an observer) and, like the C handle it owns,
is used by one thread at a time; a lock makes a second thread wait rather
than corrupt it. The library's calls run without the GIL.
"""

import atexit
import ctypes
import logging
import math
import threading
import weakref

import numpy as np

from . import _lib
from .errors import InvalidArgument, LengthMismatch, StateError, from_code
from .optim import LR_MAX, check_name, optimizer_text
from .table import register_table as _register_table

MODES = {0: "async", 1: "sync", 2: "ssp"}
_PY_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}

# Every field of gddr_client_opts as the library describes it: names,
# types, defaults and help come from its table (common/client_conf.c), so
# an option added there is a keyword here with nothing to change.
OPTION_INFO = {d["name"]: d for d in _lib.describe()}
DC_MODES = dict(OPTION_INFO["dc_mode"]["choices"])
LOG_LEVELS = dict(OPTION_INFO["log_level"]["choices"])

# The options a caller may set by keyword (gddr_client_opts less the ones
# that have their own argument and the pointers, which the package owns).
OPTIONS = tuple(name for name, d in OPTION_INFO.items()
                if name not in ("server", "rank", "world_size") and d["type"] != "pointer")

log = logging.getLogger("gddr")


def strerror(code):
    """gddr_strerror: the library's sentence for an error code."""
    return _lib.strerror(code).decode()


def _typed(name, text):
    """An option's text (gddr_opts_get, a default) as the Python value:
    numbers, 0/1 for booleans, an enum's number, None for no string."""
    d = OPTION_INFO[name]
    t = d["type"]
    if t in ("int", "uint64"):
        return int(text)
    if t == "double":
        return float(text)
    if t == "bool":
        return int(text.lower() in ("1", "true", "yes", "on"))
    if t == "enum":
        return d["choices"][text] if text in d["choices"] else int(text)
    return text or None


def default_options():
    """The defaults of gddr_client_opts_init(), as a dict of OPTIONS."""
    return {k: _typed(k, OPTION_INFO[k]["default"]) for k in OPTIONS}


def _option_text(name, value):
    """A keyword option as text for gddr_opts_set."""
    d = OPTION_INFO[name]
    if d["type"] == "enum" and isinstance(value, str) and value not in d["choices"]:
        raise InvalidArgument("%s must be one of %s, not %r" % (name, list(d["choices"]), value))
    if value is None and d["type"] == "string":
        return ""
    if isinstance(value, bool) or d["type"] == "bool":
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _options_markdown():
    """docs/python.md's table of options, from the library's description
    (`make config-table` writes it there; python/tests checks it)."""
    lines = ["| option | default | what |", "|---|---|---|"]
    for k in OPTIONS:
        d = OPTION_INFO[k]
        v = _typed(k, d["default"])
        if d["type"] == "bool":
            cell = str(bool(v))
        elif d["type"] == "enum" and not d["default"].isdigit():
            cell = '`"%s"`' % d["default"]
        else:
            cell = repr(v)
        lines.append("| `%s` | %s | %s |" % (k, cell, d["help"].replace("|", "\\|")))
    return "\n".join(lines) + "\n"


def _log_trampoline():
    """One C callback for every client: the library's lines go to the
    Python logger "gddr" at the matching level."""

    def cb(user, level, msg):
        try:
            log.log(_PY_LEVELS.get(level, logging.DEBUG), "%s", msg.decode(errors="replace"))
        except Exception:  # never let an exception cross into C
            pass

    return _lib.LOG_FN(cb)


_LOG_CB = _log_trampoline()

# Clients still open when the interpreter exits are closed (bye, residual
# flush) before Python goes away under the library's threads.
_open_clients = weakref.WeakSet()


@atexit.register
def _close_all():
    for c in list(_open_clients):
        c.close()


def _array_ptr(a, what, n=None, writable=False):
    """The address of a float32 C-contiguous array of n values, or a clear
    error before anything is sent."""
    if not isinstance(a, np.ndarray):
        raise InvalidArgument("%s must be a numpy.ndarray of float32, not %s"
                              % (what, type(a).__name__))
    if a.dtype != np.float32:
        raise InvalidArgument("%s has dtype %s; gddr takes float32 only (a.astype(numpy.float32) "
                              "makes a copy, which pull and step would not write back)"
                              % (what, a.dtype))
    if not a.flags.c_contiguous or not a.flags.aligned:
        raise InvalidArgument("%s is not C-contiguous; gddr reads and writes arrays in place "
                              "(numpy.ascontiguousarray makes a copy)" % what)
    if writable and not a.flags.writeable:
        raise InvalidArgument("%s is read-only, but gddr writes into it" % what)
    if n is not None and a.size != n:
        raise LengthMismatch("%s holds %d values, the tensor has %d" % (what, a.size, n))
    if a.size == 0:
        raise InvalidArgument("%s is empty" % what)
    return a.ctypes.data


class Tensor:
    """A registered tensor: its name, length and id (registration order)."""

    __slots__ = ("name", "n", "id")

    def __init__(self, name, n, id):
        self.name, self.n, self.id = name, n, id

    def __repr__(self):
        return "Tensor(%r, n=%d, id=%d)" % (self.name, self.n, self.id)


class Ticket:
    """A request in flight (gddr_push_async / gddr_pull_async). wait()
    returns the version the reply carried; a pull's array (`out`) holds the
    values once wait() returned."""

    def __init__(self, client, ticket, kind, tensor, out=None):
        self.client, self.ticket, self.kind, self.tensor, self.out = client, ticket, kind, tensor, out
        self.done = False
        self.version = None

    def wait(self, timeout_ms=None):
        """Waits up to timeout_ms (None: the client's timeout) and returns
        the version; raises gddr.Timeout when the reply did not come in
        time (the library then forgets the request: send it again)."""
        return self.client.wait(self, timeout_ms)

    def __repr__(self):
        return "Ticket(%s %s, %s)" % (self.kind, self.tensor.name,
                                      "done, version %s" % self.version if self.done else "in flight")


class Client:
    """One connection to gddr-ps (gddr_client_open).

    server      endpoint, e.g. "tcp://127.0.0.1:5555"
    rank        this worker's rank; None: GDDR_RANK, SLURM_PROCID,
                OMPI_COMM_WORLD_RANK or RANK (as the C library reads them)
    world_size  workers in the job; None: GDDR_WORLD_SIZE, SLURM_NTASKS,
                OMPI_COMM_WORLD_SIZE or WORLD_SIZE
    **options   any field of gddr_client_opts: timeout_ms, delay_fraction,
                dc_lambda, dc_mode ("diag"/"identity"), clip_norm, observer,
                log_level ("error".."debug", to the logger "gddr"), ...
                (gddr.OPTIONS lists them, gddr.default_options() their defaults)
    """

    def __init__(self, server, rank=None, world_size=None, **options):
        opts = self._opts(server, rank, world_size, options)
        handle = ctypes.c_void_p()
        rc = _lib.client_open_sized(opts.buf, opts.size, ctypes.byref(handle))
        if rc != 0:
            why = _lib.opts_errmsg().decode(errors="replace")  # the library's reason
            raise from_code(rc, "cannot open a client to %s: %s" % (server, why or strerror(rc)))
        self._setup(handle, opts)

    @classmethod
    def from_ini(cls, path, **overrides):
        """A client from the [client] section of an INI file
        (gddr_client_open_ini); keyword overrides (server, rank,
        world_size and any option) win over the file."""
        opts = cls._opts(overrides.pop("server", None), overrides.pop("rank", None),
                         overrides.pop("world_size", None), overrides)
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = _lib.client_open_ini_sized(str(path).encode(), opts.buf, opts.size, ctypes.byref(handle),
                                        err, len(err))
        if rc != 0:
            raise from_code(rc, err.value.decode(errors="replace") or strerror(rc))
        self = cls.__new__(cls)
        self._setup(handle, None)
        return self

    @staticmethod
    def _opts(server, rank, world_size, options):
        """A gddr_client_opts of the library's size, set by name."""
        o = _lib.Opts()
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError("unknown gddr option(s) %s; known: %s" % (", ".join(unknown),
                                                                      ", ".join(OPTIONS)))
        given = dict(options)
        if server is not None:
            given["server"] = str(server)
        if rank is not None:
            given["rank"] = int(rank)
        if world_size is not None:
            given["world_size"] = int(world_size)
        try:
            for k, v in given.items():
                o.set(k, _option_text(k, v))
        except _lib.OptsError as e:
            raise InvalidArgument(str(e)) from None
        o.set_ptr("log", _LOG_CB)
        return o

    def _setup(self, handle, opts):
        self._h = handle
        self._lock = threading.RLock()
        self._tensors = []
        self._by_name = {}
        self._tables = {}   # key -> Table
        self._pending = {}  # ticket -> Ticket, whose array the library may still write
        self._lr = 0.0      # set_lr's (0: the tensors' own)
        # The options given (None from an INI file: the library read them
        # and keeps them to itself).
        self.options = {k: _typed(k, opts.get(k)) for k in OPTIONS} if opts is not None else None
        self.has_cuda = _lib.HAS_CUDA
        info = self.info()
        self.rank, self.mode, self.world_size = info["rank"], info["mode"], info["world_size"]
        _open_clients.add(self)

    # ---- plumbing -----------------------------------------------------------

    def _handle(self):
        if not self._h:
            raise StateError("this gddr.Client is closed")
        return self._h

    def _check(self, rc, what):
        if rc != 0:
            msg = _lib.client_errmsg(self._h).decode(errors="replace") if self._h else ""
            raise from_code(rc, "%s: %s" % (what, msg or strerror(rc)))

    def _tensor(self, t):
        if isinstance(t, Tensor):
            t = t.id
        if isinstance(t, str):
            if t not in self._by_name:
                raise from_code(5, "no tensor named %r is registered" % t)
            return self._by_name[t]
        if isinstance(t, (int, np.integer)) and 0 <= t < len(self._tensors):
            return self._tensors[t]
        raise from_code(5, "no tensor with id %r (%d registered)" % (t, len(self._tensors)))

    def _ptr_list(self, arrays, what, writable):
        if len(arrays) != len(self._tensors):
            raise InvalidArgument("%s: %d arrays for %d registered tensors"
                                  % (what, len(arrays), len(self._tensors)))
        ptrs = [_array_ptr(a, "%s[%d] (%s)" % (what, i, t.name), t.n, writable)
                for i, (a, t) in enumerate(zip(arrays, self._tensors))]
        return (ctypes.c_void_p * len(ptrs))(*ptrs)

    def _raw_ptrs(self, ptrs, what):
        """Addresses given as integers (CUDA device memory from gddr.torch)."""
        if len(ptrs) != len(self._tensors):
            raise InvalidArgument("%s: %d pointers for %d registered tensors"
                                  % (what, len(ptrs), len(self._tensors)))
        if any(not p for p in ptrs):
            raise InvalidArgument("%s: a NULL pointer" % what)
        return (ctypes.c_void_p * len(ptrs))(*ptrs)

    # ---- tensors ------------------------------------------------------------

    @property
    def tensors(self):
        """The registered tensors, in registration (= id) order."""
        return list(self._tensors)

    def register(self, name, array, optimizer=None):
        """Registers tensor `name` with the values of `array` (float32,
        C-contiguous, any shape; flattened). The first registration of a
        name creates it on the server; a later one with the same length
        gets the existing tensor (values unchanged: pull() them). Returns
        the Tensor (its id is the index in step()'s lists).

        optimizer: what the server runs for this tensor (gddr_register_opt),
        a gddr.Optimizer or its text ("adam lr=0.001"); None: the server's
        [optimizer] section. The first registration decides; a later one
        naming another optimizer raises gddr.ConfigError. The name may not
        hold a NUL byte (check_name)."""
        raw = check_name(name)
        text = optimizer_text(optimizer)
        ptr = _array_ptr(array, "register(%r)" % name)
        with self._lock:
            tid, ver = ctypes.c_int(), ctypes.c_uint64()
            rc = _lib.register_opt(self._handle(), raw, ptr, array.size,
                                   None if text is None else text.encode(),
                                   ctypes.byref(tid), ctypes.byref(ver))
            self._check(rc, "register %r" % name)
            t = Tensor(name, array.size, tid.value)
            assert t.id == len(self._tensors), "ids follow registration order"
            self._tensors.append(t)
            self._by_name[name] = t
            return t

    def tensor_optimizer(self, tensor):
        """What the server runs for `tensor` (its Tensor, name or id), as
        text in the form register() takes, e.g. "adam lr=0.001 beta1=0.9
        beta2=0.999 eps=1e-08 weight_decay=0" (gddr_tensor_optimizer;
        gddr.Optimizer.parse reads it)."""
        t = self._tensor(tensor)
        buf = ctypes.create_string_buffer(512)
        with self._lock:
            self._check(_lib.tensor_optimizer(self._handle(), t.id, buf, len(buf)),
                        "tensor_optimizer %r" % t.name)
        return buf.value.decode()

    def set_lr(self, lr):
        """The learning rate every later push carries (gddr_set_lr), in
        place of the tensors' lr; the server still divides it by AdaDelay's
        1 + adadelay * staleness. 0: the tensors' own lr again. In [0, 1e6].
        A sync step takes the lr of the pushes that make it."""
        if isinstance(lr, bool) or not isinstance(lr, (int, float, np.floating, np.integer)):
            raise InvalidArgument("lr must be a number, not %r" % (lr,))
        lr = float(lr)
        if not math.isfinite(lr) or not 0 <= lr <= LR_MAX:
            raise InvalidArgument("lr %r is not in [0, 1e6] (0: the tensors' own lr)" % lr)
        with self._lock:
            self._check(_lib.set_lr(self._handle(), lr), "set_lr")
            self._lr = lr

    @property
    def lr(self):
        """The lr set by set_lr() (0.0: the tensors' own); assigning calls
        set_lr()."""
        return self._lr

    @lr.setter
    def lr(self, value):
        self.set_lr(value)

    def version(self, tensor):
        """The version of `tensor` this client last pulled (what its next
        push is tagged with)."""
        t = self._tensor(tensor)
        with self._lock:
            v = ctypes.c_uint64()
            self._check(_lib.tensor_version(self._handle(), t.id, ctypes.byref(v)), "version")
            return v.value

    def pull(self, tensor, out=None, min_version=0):
        """Copies the server's values of `tensor` into `out` (a new float32
        array when None) once its version is at least min_version; returns
        `out`. The version is then client.version(tensor)."""
        t = self._tensor(tensor)
        if out is None:
            out = np.empty(t.n, dtype=np.float32)
        ptr = _array_ptr(out, "pull(%r) out" % t.name, t.n, writable=True)
        with self._lock:
            self._check(_lib.pull(self._handle(), t.id, ptr, min_version, None), "pull %r" % t.name)
        return out

    def push(self, tensor, grad, birth_version=None, base_version=None):
        """Pushes a dense gradient (gddr_push_ex), tagged with the version
        of the last pull unless birth_version says otherwise; returns the
        version after the server took it."""
        t = self._tensor(tensor)
        ptr = _array_ptr(grad, "push(%r) grad" % t.name, t.n)
        tags = self._tags(birth_version, base_version)
        with self._lock:
            v = ctypes.c_uint64()
            rc = _lib.push_ex(self._handle(), t.id, ptr, tags, ctypes.byref(v))
            self._check(rc, "push %r" % t.name)
            return v.value

    @staticmethod
    def _tags(birth_version, base_version):
        if birth_version is None:
            if base_version is not None:
                raise InvalidArgument("base_version needs birth_version")
            return None
        tags = _lib.PushTags(birth_version=birth_version, has_birth=1,
                             base_version=base_version if base_version is not None else birth_version)
        return ctypes.byref(tags)

    def push_async(self, tensor, grad, birth_version=None, base_version=None):
        """Sends a push and returns a Ticket at once (the values are on
        their way when this returns: `grad` may change afterwards). Not
        retried after a reconnect (see gddr.h)."""
        t = self._tensor(tensor)
        ptr = _array_ptr(grad, "push_async(%r) grad" % t.name, t.n)
        tags = self._tags(birth_version, base_version)
        with self._lock:
            tk = ctypes.c_uint64()
            self._check(_lib.push_async(self._handle(), t.id, ptr, tags, ctypes.byref(tk)),
                        "push_async %r" % t.name)
            return Ticket(self, tk.value, "push", t)

    def pull_async(self, tensor, out=None, min_version=0):
        """Sends a pull and returns a Ticket; the values land in `out` (or
        ticket.out, a new array) by the time ticket.wait() returns. The
        client keeps `out` alive until then."""
        t = self._tensor(tensor)
        if out is None:
            out = np.empty(t.n, dtype=np.float32)
        ptr = _array_ptr(out, "pull_async(%r) out" % t.name, t.n, writable=True)
        with self._lock:
            tk = ctypes.c_uint64()
            self._check(_lib.pull_async(self._handle(), t.id, ptr, min_version, ctypes.byref(tk)),
                        "pull_async %r" % t.name)
            ticket = Ticket(self, tk.value, "pull", t, out)
            self._pending[tk.value] = ticket
            return ticket

    def wait(self, ticket, timeout_ms=None):
        """gddr_wait: the version the reply carried. Whatever the outcome,
        the ticket is collected: after an error (gddr.Timeout included,
        whose late reply the library drops) waiting again raises
        gddr.UnknownTicket, and a push must be sent again to count."""
        if ticket.done:
            return ticket.version
        with self._lock:
            v = ctypes.c_uint64()
            rc = _lib.wait(self._handle(), ticket.ticket, -1 if timeout_ms is None else timeout_ms,
                           ctypes.byref(v))
            self._pending.pop(ticket.ticket, None)
            self._check(rc, "wait for %s %r" % (ticket.kind, ticket.tensor.name))
            ticket.done, ticket.version = True, v.value
            return v.value

    # ---- sparse tables (gddr.table) -------------------------------------------

    def register_table(self, key, dim, init="zeros", init_scale=0.0, init_seed=0,
                       admit="always", admit_count=1, admit_prob=1.0, optimizer=None,
                       max_rows=0, row_ttl=0):
        """Registers the sparse table `key` of rows of `dim` floats
        (gddr_table_register; on every server of a sharded client), or
        looks up the existing one (same dim; another dim raises
        gddr.LengthMismatch). Returns a gddr.Table (pull, push).

        init        "zeros", "uniform" U(-init_scale, init_scale) or
                    "normal" N(0, init_scale^2); a row's initial value
                    depends on (init_seed, key) only
        admit       "always" (a row at first touch), "count" (at the
                    admit_count-th training pull that saw the key) or
                    "prob" (with probability admit_prob a sighting)
        optimizer   "sgd lr=0.1", "adagrad lr=0.05", "adam lr=0.001" (or
                    a gddr.Optimizer; no momentum or weight decay), None:
                    SGD at the server's lr
        max_rows    rows the table may hold per server (0: the server's
                    bound); row_ttl: evict rows untouched for this many
                    table versions (0: never)
        The first registration of a key decides every field."""
        return _register_table(self, key, dim, init, init_scale, init_seed, admit, admit_count,
                               admit_prob, optimizer, max_rows, row_ttl)

    @property
    def tables(self):
        """The tables this client registered, {key: Table}."""
        return dict(self._tables)

    # ---- steps --------------------------------------------------------------

    def step(self, grads, params):
        """One training step over every registered tensor (gddr_step):
        clip, DC-ASGD, GDDR residual, push, pull, in the server's mode.
        grads[i] and params[i] are tensor i's arrays (registration order);
        params receive the parameters for the next step."""
        g = self._ptr_list(grads, "step grads", False)
        p = self._ptr_list(params, "step params", True)
        self._step(g, p)

    def _step(self, g, p):
        with self._lock:
            self._check(_lib.step(self._handle(), g, p), "step")

    def step_ptrs(self, grad_ptrs, param_ptrs):
        """step() on raw addresses (ints): host memory, or CUDA device
        memory when the library was built with CUDA (client.has_cuda).
        Nothing is checked but their count: the caller vouches for n floats
        at each. gddr.torch uses it for CUDA tensors."""
        self._step(self._raw_ptrs(grad_ptrs, "step grads"), self._raw_ptrs(param_ptrs, "step params"))

    def step_submit(self, grads):
        """Pipelined step (gddr_step_submit): the gradients are copied and
        a library thread runs the step while the caller goes on."""
        g = self._ptr_list(grads, "step_submit grads", False)
        with self._lock:
            self._check(_lib.step_submit(self._handle(), g), "step_submit")

    def step_wait(self, params):
        """Waits for the oldest submitted step; params receive its result."""
        p = self._ptr_list(params, "step_wait params", True)
        with self._lock:
            self._check(_lib.step_wait(self._handle(), p), "step_wait")

    def next_step(self):
        """Bumps the step counter (step() does it; call it when driving
        push/pull by hand). Returns the new step."""
        with self._lock:
            return _lib.next_step(self._handle())

    # ---- what the server and the client know -------------------------------------

    def info(self):
        """What the server said at hello and since: epoch, mode ("async",
        "sync", "ssp"), tau, chunk, workers, rank, and world_size (this
        client's job: its option, or the launcher's environment)."""
        with self._lock:
            i = _lib.ServerInfo()
            self._check(_lib.client_info(self._handle(), ctypes.byref(i)), "info")
        d = _lib.struct_dict(i)
        d["mode"] = MODES.get(d["mode"], d["mode"])
        return d

    def stats(self):
        """The server's statistics (one request): pushes, pulls, rejected,
        versions_total, staleness_*, tau, live_workers, mode, epoch, and
        this worker's worker_pushes / worker_staleness_mean."""
        with self._lock:
            s = _lib.ServerStats()
            self._check(_lib.stats_get(self._handle(), ctypes.byref(s)), "stats")
        d = _lib.struct_dict(s)
        d["mode"] = MODES.get(d["mode"], d["mode"])
        return d

    def counters(self):
        """What this client counted: steps, pushes, pulls, bytes_pushed,
        bytes_pulled (wire bytes), values_pushed, reconnects, ..."""
        with self._lock:
            k = _lib.ClientCounters()
            self._check(_lib.counters_get(self._handle(), ctypes.byref(k)), "counters")
        return _lib.struct_dict(k)

    def metrics(self):
        """The server's metrics in Prometheus text format."""
        with self._lock:
            p = ctypes.c_void_p()
            self._check(_lib.metrics_text(self._handle(), ctypes.byref(p)), "metrics")
        try:
            return ctypes.string_at(p.value).decode()
        finally:
            _lib.libc.free(p)

    def request_checkpoint(self):
        """Asks the server to write a checkpoint now."""
        with self._lock:
            self._check(_lib.request_checkpoint(self._handle()), "checkpoint")

    # ---- the end ------------------------------------------------------------

    def close(self):
        """Says bye (sync steps stop waiting for this worker), flushes a
        GDDR residual, frees the client. Safe to call twice."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if self._h:
                _lib.client_close(ctypes.byref(self._h))
                self._h = None
                self._pending.clear()
        _open_clients.discard(self)

    @property
    def closed(self):
        return not self._h

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if not getattr(self, "_h", None):
            return "<gddr.Client closed>"
        return "<gddr.Client rank %d, %s, %d tensors>" % (self.rank, self.mode, len(self._tensors))
