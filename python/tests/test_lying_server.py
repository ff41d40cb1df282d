"""libgddr-client against a server that lies: a scripted ROUTER written
from proto/gddr.proto answers the library's requests with replies a
gddr-ps never sends. The library must refuse them with an error that says
what was wrong, and never write past its own buffers.

Found by running the library (built with SANITIZER=address) against a
fake server answering with random mutations of valid replies:
  - a pull answered in two parts over the same values: both were kept as
    the tensor's last values and later joined past the tensor's end;
  - a hello naming another chunk size after a reconnect (or none): every
    residual, age array and bitmap of the client is laid out in the first
    one, and the next GDDR step or flush ran past them.
"""

import threading

import numpy as np
import pytest

import gddr
from conftest import WAIT_S, protocol


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    return protocol.compile_proto(tmp_path_factory.mktemp("gddr_pb2"))


class LyingServer:
    """A ROUTER on 127.0.0.1 that answers each request with the replies
    answer(kind, request, count) returns: a list of (Reply, [raw frames]),
    sent in order (req_id and protocol filled in). count is how many
    requests of that kind came before."""

    def __init__(self, pb, answer):
        import zmq

        self.pb, self.answer = pb, answer
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = "tcp://127.0.0.1:%d" % port
        self.seen = {}
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            if not self.sock.poll(50):
                continue
            frames = self.sock.recv_multipart()
            rq = self.pb.Request.FromString(frames[1])
            kind = rq.WhichOneof("body")
            n = self.seen.get(kind, 0)
            self.seen[kind] = n + 1
            for reply, raw in self.answer(kind, rq, n):
                reply.protocol, reply.req_id = self.pb.PROTOCOL_VERSION, rq.req_id
                self.sock.send_multipart([frames[0], reply.SerializeToString()] + list(raw))

    def close(self):
        self.stop = True
        self.thread.join(WAIT_S)
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def lying(pb):
    made = []

    def make(answer):
        s = LyingServer(pb, answer)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def hello(pb, epoch, chunk):
    r = pb.Reply(epoch=epoch, tau=4)
    r.hello.mode, r.hello.chunk, r.hello.workers, r.hello.tau = pb.MODE_ASYNC, chunk, 1, 4
    r.hello.max_message_bytes, r.hello.shard_count = 1 << 30, 1
    return r


def plain(pb, rq, epoch, n=0):
    """What a gddr-ps would answer to the requests a test does not lie
    about: a tensor of id 0 and n values, pushes taken (version 1), pulls
    answered with n zeros at version 1, acks."""
    kind = rq.WhichOneof("body")
    r = pb.Reply(epoch=epoch, tau=4)
    raw = []
    if kind == "init":
        r.init.id, r.init.n, r.init.created = 0, rq.init.n, True
    elif kind == "push":
        r.push.id, r.push.version, r.push.applied = 0, 1, True
    elif kind == "pull":
        r.pull.id, r.pull.version, r.pull.payload_bytes = 0, 1, 4 * n
        raw = [bytes(4 * n)]
    else:
        r.ack.SetInParent()
    return [(r, raw)]


def client(srv, **kw):
    kw.setdefault("timeout_ms", 2000)
    kw.setdefault("reconnect_timeout_ms", 3000)
    kw.setdefault("heartbeat_ms", 0)
    return gddr.Client(srv.endpoint, rank=0, world_size=1, **kw)


def test_pull_parts_over_the_same_values_are_refused(pb, lying):
    n = 10
    vals = np.arange(n, dtype=np.float32)

    def answer(kind, rq, count):
        if kind == "hello":
            return [(hello(pb, 7, 4), [])]
        if kind != "pull":
            return plain(pb, rq, 7)
        # Two parts: part 0 holds every value, and part 1 says it is the
        # last, at offset 0, holding every value again.
        out = []
        for part in (0, 1):
            r = pb.Reply(epoch=7, tau=4)
            p = r.pull
            p.id, p.version, p.payload_bytes = 0, 1, 4 * n
            p.parts, p.part, p.offset = 2, part, 0
            out.append((r, [vals.tobytes()]))
        return out

    c = client(lying(answer))
    w = np.zeros(n, np.float32)
    c.register("t", w)
    with pytest.raises(gddr.Error) as e:
        c.pull("t", w)
    assert e.value.code == 6, e.value  # GDDR_ELENGTH
    assert "part 1 of 2 holds 40 bytes at value 0" in e.value.message, e.value.message
    c.close()


@pytest.mark.parametrize("chunk", [0, (1 << 24) + 1])
def test_a_hello_without_a_usable_chunk_is_refused(pb, lying, chunk):
    srv = lying(lambda kind, rq, count: [(hello(pb, 7, chunk), [])] if kind == "hello"
                else plain(pb, rq, 7))
    with pytest.raises(gddr.Error) as e:
        client(srv)
    assert e.value.code == 12, e.value  # GDDR_ECONFIG
    # The library's reason, not only its code's name.
    assert "chunk is %d values, where this client accepts 1 to 16777216" % chunk in e.value.message, \
        e.value.message


def test_a_restarted_server_with_another_chunk_is_refused(pb, lying):
    """The first server says chunk 4, and GDDR steps hold chunks of 4 in the
    residual; then the server "restarts": a reply from a new epoch, pushes
    refused as from a stranger (what a restarted gddr-ps says), and a hello
    that says chunk 8. The client must stop there, not step its residual
    with the new chunk."""
    n = 64
    epoch = [7]

    def answer(kind, rq, count):
        if kind == "hello":
            return [(hello(pb, epoch[0], 4 if count == 0 else 8), [])]
        if kind == "push" and count == 3:
            epoch[0] = 8  # restarted: this reply already comes from the new one
        if kind == "push" and epoch[0] == 8:
            r = pb.Reply(epoch=8, tau=4)
            r.error.code, r.error.message = pb.E_WORKER, "say hello first"
            return [(r, [])]
        return plain(pb, rq, epoch[0], n)

    c = client(lying(answer), delay_fraction=0.4)
    g = np.full(n, 0.5, np.float32)
    w = np.zeros(n, np.float32)
    c.register("t", w)
    for _ in range(3):
        c.step([g], [w])  # GDDR steps: the residual holds chunks of 4
    with pytest.raises(gddr.Error) as e:
        for _ in range(3):
            c.step([g], [w])
    assert e.value.code == 12, e.value  # GDDR_ECONFIG
    assert "chunk is 8 values, where this client started with 4" in e.value.message, e.value.message
    c.close()
