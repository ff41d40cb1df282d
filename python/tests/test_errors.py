"""Every error path raises the gddr.Error subclass of its code, with the
library's message; arrays gddr cannot use in place are refused before
anything is sent (the server's books show nothing arrived).
"""

import socket

import numpy as np
import pytest

import gddr


def raises(cls, code, fn, *args, **kw):
    """Calls fn, expects `cls` with `code` and a message; returns it."""
    with pytest.raises(cls) as e:
        fn(*args, **kw)
    err = e.value
    assert isinstance(err, gddr.Error)
    assert type(err) is cls, "expected %s, got %s: %s" % (cls.__name__, type(err).__name__, err)
    assert err.code == code and err.name == gddr.errors.BY_CODE[code].name
    assert err.message
    return err


def nothing_arrived(c, tensors=()):
    """The server took no push and holds only `tensors`."""
    s = c.stats()
    assert (s["pushes"], s["versions_total"], s["rejected"]) == (0, 0, 0)
    m = c.metrics()
    held = sorted(line.split('"')[1] for line in m.splitlines()
                  if line.startswith("gddr_tensor_version{"))
    assert held == sorted(tensors)
    assert "gddr_pushes_total 0\n" in m


BAD_ARRAYS = [
    ("float64", lambda: np.zeros(6, np.float64), "dtype float64"),
    ("int32", lambda: np.zeros(6, np.int32), "dtype int32"),
    ("big-endian", lambda: np.zeros(6, ">f4"), "dtype >f4"),
    ("strided", lambda: np.zeros(12, np.float32)[::2], "not C-contiguous"),
    ("fortran", lambda: np.zeros((2, 3), np.float32, order="F"), "not C-contiguous"),
    ("list", lambda: [0.0] * 6, "numpy.ndarray"),
]


@pytest.mark.parametrize("make,text", [(m, t) for _, m, t in BAD_ARRAYS],
                         ids=[i for i, _, _ in BAD_ARRAYS])
def test_bad_arrays_are_refused_before_sending(server, clients, make, text):
    srv = server(lr=1.0)
    c = clients(srv)
    watcher = clients(srv, observer=True)
    bad = make()
    e = raises(gddr.InvalidArgument, 1, c.register, "bad", bad)
    assert text in e.message
    nothing_arrived(watcher)  # not even registered
    w = np.zeros(6, np.float32)
    c.register("good", w)
    for call in (lambda: c.push("good", bad), lambda: c.push_async("good", bad),
                 lambda: c.pull("good", bad), lambda: c.pull_async("good", bad),
                 lambda: c.step([bad], [w]), lambda: c.step([w], [bad]),
                 lambda: c.step_submit([bad])):
        assert text in raises(gddr.InvalidArgument, 1, call).message
    nothing_arrived(watcher, ["good"])
    np.testing.assert_array_equal(w, np.zeros(6, np.float32))


def test_wrong_sizes_and_read_only(server, clients):
    srv = server(lr=1.0)
    c = clients(srv)
    watcher = clients(srv, observer=True)
    w = np.zeros(6, np.float32)
    c.register("w", w)
    e = raises(gddr.LengthMismatch, 6, c.push, "w", np.zeros(5, np.float32))
    assert "holds 5 values, the tensor has 6" in e.message
    raises(gddr.LengthMismatch, 6, c.step, [np.zeros(7, np.float32)], [w])
    e = raises(gddr.InvalidArgument, 1, c.step, [w, w], [w, w])
    assert "2 arrays for 1 registered tensors" in e.message
    ro = np.zeros(6, np.float32)
    ro.flags.writeable = False
    assert "read-only" in raises(gddr.InvalidArgument, 1, c.pull, "w", ro).message
    raises(gddr.InvalidArgument, 1, c.register, "empty", np.zeros(0, np.float32))
    nothing_arrived(watcher, ["w"])


def test_library_errors(server, clients):
    """Errors the library or the server find, each with its class and code."""
    srv = server(lr=1.0, max_grad_norm=10)
    c = clients(srv)
    c.register("t", np.zeros(4, np.float32))
    # EINVAL from the library: a second registration of a name in one client.
    e = raises(gddr.InvalidArgument, 1, c.register, "t", np.zeros(4, np.float32))
    assert "already registered" in e.message
    # ELENGTH from the server: another client, another length.
    other = clients(srv, observer=True)
    e = raises(gddr.LengthMismatch, 6, other.register, "t", np.zeros(5, np.float32))
    assert "register 't'" in e.message
    # ENOKEY: no such tensor.
    raises(gddr.UnknownTensor, 5, c.pull, "nope")
    raises(gddr.UnknownTensor, 5, c.push, 7, np.zeros(4, np.float32))
    # ENONFINITE: the server refuses NaN.
    g = np.zeros(4, np.float32)
    g[2] = np.nan
    raises(gddr.NonFinite, 8, c.push, "t", g)
    # EGRADNORM: above the server's max_grad_norm.
    raises(gddr.GradNormTooLarge, 10, c.push, "t", np.full(4, 100.0, np.float32))
    # EVERSION: tagged with a version the server has not reached (an async
    # push is sent as tagged; a blocking one would be re-tagged on retry).
    tk = c.push_async("t", np.ones(4, np.float32), birth_version=1000)
    raises(gddr.VersionFromFuture, 7, tk.wait)
    # ENOTICKET: a ticket the library never issued.
    raises(gddr.UnknownTicket, 19, gddr.Ticket(c, 123456, "pull", c.tensors[0]).wait)
    # ESTATE: register while pipelined steps are in flight.
    c.step_submit([np.zeros(4, np.float32)])
    raises(gddr.StateError, 16, c.register, "late", np.zeros(1, np.float32))
    c.step_wait([np.zeros(4, np.float32)])
    s = other.stats()
    assert s["pushes"] == 1 and s["rejected"] >= 3  # only the pipelined step's push counted


def test_step_without_tensors(server, clients):
    c = clients(server())
    raises(gddr.StateError, 16, c.step, [], [])


def test_open_errors(server, tmp_path):
    srv = server()
    # EINVAL: options the library refuses.
    raises(gddr.InvalidArgument, 1, gddr.Client, srv.endpoint, rank=0, world_size=1,
           delay_fraction=1.5)
    raises(gddr.InvalidArgument, 1, gddr.Client, "", rank=0, world_size=1)
    # EWORKER: a rank outside the world.
    e = raises(gddr.WorkerError, 18, gddr.Client, srv.endpoint, rank=4, world_size=4)
    # The library's reason (here the server's), not only the code's name.
    assert "rank 4" in e.message, e.message
    # ECONFIG: a CURVE server key of the wrong length.
    raises(gddr.ConfigError, 12, gddr.Client, srv.endpoint, rank=0, world_size=1,
           curve_server_key="short", curve_key_file=str(tmp_path / "k"))
    # ETIMEDOUT: nobody listens there (a port just freed by the OS).
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    e = raises(gddr.Timeout, 3, gddr.Client, "tcp://127.0.0.1:%d" % port, rank=0,
               world_size=1, timeout_ms=100, reconnect_timeout_ms=200)
    assert isinstance(e, TimeoutError)
    assert "nothing accepts connections at tcp://127.0.0.1:%d" % port in e.message, e.message
    # Python-side mistakes are Python's exceptions.
    with pytest.raises(TypeError, match="unknown gddr option"):
        gddr.Client(srv.endpoint, rank=0, world_size=1, delay_fractoin=0.4)
    raises(gddr.InvalidArgument, 1, gddr.Client, srv.endpoint, rank=0, world_size=1,
           dc_mode="sideways")


def test_errors_after_a_server_stop(server):
    """The server went away for good: the call gives up after
    reconnect_timeout_ms with ETIMEDOUT, carrying the library's message."""
    srv = server(lr=1.0)
    c = gddr.Client(srv.endpoint, rank=0, world_size=1, timeout_ms=200, reconnect_timeout_ms=300)
    try:
        c.register("t", np.zeros(2, np.float32))
        assert srv.stop() == 0
        e = raises(gddr.Timeout, 3, c.pull, "t")
        assert "pull 't'" in e.message and srv.endpoint in e.message
    finally:
        c.close()
