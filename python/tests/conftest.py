"""Fixtures for the Python package's tests.

  server   a factory: server(lr=0.5, mode="sync", ...) starts $GDDR_BIN/gddr-ps
           on 127.0.0.1 with an OS-chosen port (the Server of
           tests/protocol/conftest.py); every server started is stopped
           with SIGTERM at the end of the test and must exit 0
  c_peer   the path of c_peer (c_peer.c built against gddr.h and the
           library the package loads)
  clients  a factory for gddr.Client that closes what it opened

The package is imported from python/ and loads the library of the build
the tests run against ($GDDR_BIN/../lib, i.e. build/lib) unless GDDR_LIB
says otherwise. Time is only ever an upper bound on a wait.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY = REPO / "python"
# Debian's python3 explicitly: the package's interpreter in every subprocess.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# The protocol test's server fixture is the one to reuse (same start-up,
# endpoint file, SIGTERM and exit-status checks).
_spec = importlib.util.spec_from_file_location("protocol_conftest",
                                               REPO / "tests" / "protocol" / "conftest.py")
protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(protocol)
WAIT_S = protocol.WAIT_S
bin_dir = protocol.bin_dir

os.environ.setdefault("GDDR_LIB", str(bin_dir().parent / "lib" / "libgddr-client.so"))
sys.path.insert(0, str(PY))
import gddr  # noqa: E402


def pytest_report_header(config):
    return "gddr package from %s, library %s (CUDA build: %s)" % (
        Path(gddr.__file__).parent, gddr.library_path, gddr.has_cuda)


@pytest.fixture
def server(tmp_path):
    """server(**keys) -> a running gddr-ps with --set key=value for each
    (worker_timeout_s 600 unless given: no worker dies of a slow machine)."""
    yield from protocol.servers(tmp_path)


@pytest.fixture
def clients():
    """clients(srv, **kw) -> gddr.Client on srv (rank 0 of 1 unless given);
    all are closed at the end of the test."""
    opened = []

    def open_client(srv, **kw):
        kw.setdefault("rank", 0)
        kw.setdefault("world_size", 1)
        c = gddr.Client(srv.endpoint, **kw)
        opened.append(c)
        return c

    yield open_client
    for c in opened:
        c.close()


@pytest.fixture(scope="session")
def c_peer(tmp_path_factory):
    """c_peer.c compiled against gddr.h and linked to the library the
    package loaded (through a libgddr-client.so.0 link beside it)."""
    out = tmp_path_factory.mktemp("c_peer")
    (out / "libgddr-client.so.0").symlink_to(Path(gddr.library_path).resolve())
    exe = out / "c_peer"
    cmd = [os.environ.get("CC", "cc"), "-O2", "-ffp-contract=off", "-Wall",
           "-I", str(REPO / "client" / "include"), str(Path(__file__).with_name("c_peer.c")),
           "-o", str(exe), str(out / "libgddr-client.so.0"), "-Wl,-rpath," + str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.fail("cannot build c_peer: %s\n%s" % (" ".join(cmd), r.stderr))
    return exe


def run(argv, timeout=WAIT_S * 4, env=None):
    """Runs a command; fails the test with its output when it fails."""
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                       env=env)
    assert r.returncode == 0, "%s exited %d:\n%s\n%s" % (argv, r.returncode, r.stdout, r.stderr)
    return r.stdout
