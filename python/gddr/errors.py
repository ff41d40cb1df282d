"""errors.py -- one exception class per gddr_err code of gddr.h
(the list is common/gddr_base.h, which gddr.h includes).

Every failing call raises a subclass of gddr.Error carrying `code` (the
number, as on the wire), `name` (e.g. "GDDR_ETIMEDOUT") and `message`: the
library's detail for that call (gddr_client_errmsg, often the server's own
sentence), or gddr_strerror's text when there is none. The table below
mirrors the GDDR_ERRORS list row for row; python/tests checks
that they agree.
"""


class Error(Exception):
    """A gddr_err other than GDDR_OK."""

    code = -1
    name = "GDDR_E?"

    def __init__(self, message, code=None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__("%s (%s, code %d)" % (message, self.name, self.code))


# (code, C name, class name, extra Python base)
_TABLE = [
    (1, "GDDR_EINVAL", "InvalidArgument", ValueError),
    (2, "GDDR_ENOMEM", "OutOfMemory", MemoryError),
    (3, "GDDR_ETIMEDOUT", "Timeout", TimeoutError),
    (4, "GDDR_EPROTO", "ProtocolError", None),
    (5, "GDDR_ENOKEY", "UnknownTensor", LookupError),
    (6, "GDDR_ELENGTH", "LengthMismatch", ValueError),
    (7, "GDDR_EVERSION", "VersionFromFuture", None),
    (8, "GDDR_ENONFINITE", "NonFinite", ValueError),
    (9, "GDDR_ETOOBIG", "TooBig", None),
    (10, "GDDR_EGRADNORM", "GradNormTooLarge", None),
    (11, "GDDR_ENOTSUP", "NotSupported", None),
    (12, "GDDR_ECONFIG", "ConfigError", None),
    (13, "GDDR_EIO", "IOFailure", OSError),
    (14, "GDDR_ESHUTDOWN", "ServerShutdown", None),
    (15, "GDDR_EBITMAP", "BitmapMismatch", None),
    (16, "GDDR_ESTATE", "StateError", None),
    (17, "GDDR_ECUDA", "CudaError", None),
    (18, "GDDR_EWORKER", "WorkerError", None),
    (19, "GDDR_ENOTICKET", "UnknownTicket", None),
    (20, "GDDR_EBUSY", "Busy", None),
    (21, "GDDR_EAUTH", "AuthError", PermissionError),
]

BY_CODE = {}
for _code, _cname, _pyname, _extra in _TABLE:
    _bases = (Error, _extra) if _extra else (Error,)
    _cls = type(_pyname, _bases, {"code": _code, "name": _cname,
                                  "__doc__": "%s (code %d)" % (_cname, _code),
                                  "__module__": "gddr"})
    globals()[_pyname] = _cls
    BY_CODE[_code] = _cls
del _code, _cname, _pyname, _extra, _bases, _cls

__all__ = ["Error"] + [row[2] for row in _TABLE]


def from_code(code, message):
    """The exception for a gddr_err; an unknown code (a newer library)
    still gives a gddr.Error with that code."""
    cls = BY_CODE.get(code)
    return cls(message) if cls else Error(message, code)
