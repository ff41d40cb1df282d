"""Hostile traffic: gddr-ps under a stream of malformed and near-valid
requests from three connections, written from proto/gddr.proto alone.

Each request is either a valid-looking one (a push of a registered tensor
with a correct or random chunk bitmap, parts, a residual snapshot, a flush;
a pull with delta bits, parts, a view sequence; a row push or pull of a
registered table with duplicate and extreme keys) with a share of its
fields then overwritten with random values, or any request body with
random fields, random raw frames, a wrong protocol, rank or session, or a
header that is not a protobuf at all. Field values are drawn from the
edges (0, 1, 2^32-1, 2^64-1, NaN, Inf, empty and long strings).

What must hold afterwards, and is asserted:
  - gddr-ps never exits while it is attacked;
  - every reply parses, and answers a request that was sent (req_id);
  - an observer's stats request is still answered;
  - (async) a new tensor pushed and pulled by a worker still gives exactly
    w - lr * g: the attack left the apply path intact;
  - SIGTERM still stops it with status 0 (the server fixture).

The seeds are fixed, so a failure repeats. A longer run, any seed:
GDDR_FUZZ_ITERS=20000 GDDR_FUZZ_SEED=7 python3 -m pytest tests/protocol/test_hostile.py
(and GDDR_BIN=build/address/bin for a `make SANITIZER=address` build).
"""

import os
import random
import struct
import time
import warnings

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from conftest import WAIT_S, f32, sgd, unf32

ITERS = int(os.environ.get("GDDR_FUZZ_ITERS", "1500"))
SEED = int(os.environ.get("GDDR_FUZZ_SEED", "0"))
CHUNK = 4
U32 = [0, 1, 2, 3, 4, 7, 8, 255, 256, 1023, 1024, 65535, 2**31 - 1, 2**31, 2**32 - 1]
U64 = U32 + [2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e30, 3.4e38, float("inf"), float("-inf"),
          float("nan")]
STRINGS = ["", "w", "t0", "e0", "x" * 300, "a b", "\u00e9t\u00e9", "a/b", "\x01"]


class Fuzzer:
    def __init__(self, pb, rng):
        self.pb = pb
        self.rng = rng

    def scalar(self, f):
        r, t = self.rng, f.type
        if t in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
            return r.choice(U32) if r.random() < 0.7 else r.randrange(64)
        if t in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
            return r.choice(U64) if r.random() < 0.7 else r.randrange(5000)
        if t in (FD.TYPE_INT32, FD.TYPE_SINT32):
            return r.choice([0, 1, -1, 5, 2**31 - 1, -2**31])
        if t in (FD.TYPE_INT64, FD.TYPE_SINT64):
            return r.choice([0, 1, -1, 2**63 - 1, -2**63])
        if t in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
            return r.choice(FLOATS)
        if t == FD.TYPE_BOOL:
            return r.random() < 0.5
        if t == FD.TYPE_STRING:
            return r.choice(STRINGS)
        if t == FD.TYPE_BYTES:
            return bytes(r.getrandbits(8) for _ in range(r.choice([0, 1, 2, 3, 8, 33, 200])))
        if t == FD.TYPE_ENUM:
            vals = [v.number for v in f.enum_type.values]
            return r.choice(vals + [max(vals) + 1, 999])
        return None

    def fill(self, msg, depth=0):
        """Overwrites a random share of msg's fields (recursively) with
        values from the edges."""
        for f in msg.DESCRIPTOR.fields:
            if self.rng.random() < 0.45:
                continue
            if f.type == FD.TYPE_MESSAGE:
                if depth < 2 and f.label != FD.LABEL_REPEATED:
                    self.fill(getattr(msg, f.name), depth + 1)
            elif f.label == FD.LABEL_REPEATED:
                continue
            else:
                setattr(msg, f.name, self.scalar(f))
        return msg

    def frames(self, n):
        r = self.rng
        out = []
        for _ in range(r.choice([0, 1, 1, 2, 3])):
            size = r.choice([0, 1, 3, 4, 8, 4 * n, 4 * n + 4, 4 * max(n - 1, 0), 1024, 4096])
            out.append(bytes(r.getrandbits(8) for _ in range(size)))
        return out

    def floats(self, k):
        r = self.rng
        return f32([r.choice(FLOATS) if r.random() < 0.02 else r.uniform(-1, 1) for _ in range(k)])


class Attack:
    """ITERS requests over conns, each a near-valid one with edge values
    (rows, push or pull) or a random one; every reply is checked as it
    comes (drain). The requests and their order depend on rng alone."""

    BODIES = ["hello", "init", "pull", "push", "stats", "heartbeat", "checkpoint", "bye",
              "init_table", "pull_rows", "push_rows"]

    def __init__(self, pb, srv, conns, rng, tensors, tables):
        self.pb, self.srv, self.conns, self.rng = pb, srv, conns, rng
        self.tensors, self.tables = tensors, tables
        self.fz = Fuzzer(pb, rng)
        self.step = 1
        self.sent = {id(c): set() for c in conns}
        self.answered = 0
        self.lost = set()

    def drain(self):
        for c in self.conns:
            while not c.quiet(0):
                r = c.recv()  # parses, or the test fails here
                rid = r.header.req_id
                assert rid == 0 or rid in self.sent[id(c)], "a reply to a request never sent: %r" % r
                if r.kind == "error" and r.body.code == self.pb.E_WORKER:
                    self.lost.add(id(c))  # a Bye or a stranger took its rank: hello again
                self.answered += 1

    def rows(self, rq):
        """A pull_rows or push_rows of a table, keys at the edges."""
        rng = self.rng
        tb, dim = rng.choice(sorted(self.tables.items()))
        k = rng.choice([0, 1, 2, 5, 17])
        keys = [rng.choice([0, 1, 2, 3, 2**63, 2**64 - 1, rng.getrandbits(64)]) for _ in range(k)]
        frames = [struct.pack("<%dQ" % k, *keys)]
        if rng.random() < 0.5:
            m = rq.pull_rows
            m.table, m.nkeys, m.create = tb, k, rng.random() < 0.7
            m.min_version, m.wait_ms = rng.choice([0, 0, 1, 5]), rng.choice([0, 0, 20])
        else:
            m = rq.push_rows
            m.table, m.nkeys, m.step = tb, k, self.step
            m.base_version, m.payload_bytes = rng.choice([0, 1, 2]), 4 * k * dim
            self.step += 1
            frames.append(self.fz.floats(k * dim))
        return frames

    def push(self, rq, tid, n):
        """A push of tensor tid (n values): dense or by bitmap, maybe held,
        a snapshot, a flush, a part, norm_from_payload."""
        rng = self.rng
        nch = (n + CHUNK - 1) // CHUNK
        m = rq.push
        m.id, m.step = tid, self.step
        self.step += rng.choice([0, 1, 1, 1])
        m.base_version = m.birth_version = rng.choice([0, 1, 2, 5])
        count = n
        if rng.random() < 0.5:
            bm = bytearray(rng.getrandbits(8) for _ in range((nch + 7) // 8))
            if rng.random() < 0.8 and nch % 8:
                bm[-1] &= (1 << (nch % 8)) - 1
            m.bitmap = bytes(bm)
            m.held = rng.random() < 0.5
            count = sum(min(CHUNK, n - ch * CHUNK) for ch in range(nch) if bm[ch >> 3] >> (ch & 7) & 1)
        m.payload_bytes = 4 * count
        frames = [self.fz.floats(count)]
        if rng.random() < 0.2:
            m.residual_snapshot = True
            m.residual_bitmap = bytes((nch + 7) // 8)
            frames.append(b"")
        m.flush = rng.random() < 0.1
        m.norm_from_payload = rng.random() < 0.1
        if rng.random() < 0.15:
            m.parts, m.part = rng.choice([1, 2, 3]), rng.randrange(3)
            m.first_chunk, m.part_chunks = rng.randrange(nch + 1), rng.randrange(nch + 1)
        return m, frames

    def pull(self, rq, tid):
        """A pull of tensor tid: versions, waits, delta bits, views, parts."""
        rng = self.rng
        m = rq.pull
        m.id, m.min_version = tid, rng.choice([0, 0, 1, 2, 2**63])
        m.wait_ms, m.delta_bits = rng.choice([0, 1, 50]), rng.choice([0, 0, 8, 16, 3])
        m.view_seq = rng.choice([0, 1, 2, 7])
        if rng.random() < 0.3:
            m.delay_fraction = rng.choice([0.4, 1.0, -1.0, float("nan")])
        if rng.random() < 0.2:
            m.part_bytes = rng.choice([4, 8, 12, 16, 1 << 20])
        return m

    def anything(self, rq, c):
        """Any body with random fields and frames; sometimes the header's
        own fields too."""
        rng = self.rng
        m = getattr(rq, rng.choice(self.BODIES))
        m.SetInParent()
        self.fz.fill(m)
        frames = self.fz.frames(rng.choice([1, 4, 10]))
        if rng.random() < 0.1:
            self.fz.fill(rq)  # protocol, rank, session, observer; req_id too
            rq.req_id = c.next_id
        return frames

    def request(self, c):
        """The next request on c: (header bytes, frames)."""
        pb, rng = self.pb, self.rng
        c.next_id += 1
        rq = pb.Request(protocol=pb.PROTOCOL_VERSION, req_id=c.next_id, rank=c.rank, session=c.session)
        frames = []
        roll = rng.random()
        if id(c) in self.lost and rng.random() < 0.5:
            self.lost.discard(id(c))
            rq.hello.world_size = 2
        elif roll < 0.2 and self.tables:
            frames = self.rows(rq)
        elif roll < 0.7 and self.tensors:
            tid, n = rng.choice(sorted(self.tensors.items()))
            if rng.random() < 0.65:
                m, frames = self.push(rq, tid, n)
            else:
                m = self.pull(rq, tid)
            if rng.random() < 0.3:
                self.fz.fill(m)
        else:
            frames = self.anything(rq, c)
        header = rq.SerializeToString()
        self.sent[id(c)].add(c.next_id)
        if rng.random() < 0.03:
            header = bytes(rng.getrandbits(8) for _ in range(rng.randrange(40)))
            with warnings.catch_warnings():  # random bytes may well be a valid Request,
                warnings.simplefilter("ignore")  # with a req_id of their own
                try:
                    self.sent[id(c)].add(pb.Request.FromString(header).req_id)
                except Exception:
                    pass
        return header, frames

    def run(self):
        """Sends ITERS requests; returns the replies seen."""
        for it in range(ITERS):
            c = self.rng.choice(self.conns)
            header, frames = self.request(c)
            c.send_raw([header] + frames)
            self.drain()
            if it % 100 == 0:
                srv = self.srv
                assert srv.proc.poll() is None, "gddr-ps exited (%s) after %d requests:\n%s" % (
                    srv.proc.returncode, it + 1, srv.log_text()[-4000:])
        # The last replies: until every connection has been quiet for a second
        # (a loaded machine answers late, not never).
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not all(c.quiet(1.0) for c in self.conns):
            self.drain()
        return self.answered


@pytest.mark.parametrize("mode,optimizer", [("async", "sgd"), ("sync", "adam"),
                                            ("ssp", "adagrad")])
def test_hostile_traffic(pb, server, connect, mode, optimizer):
    srv = server(chunk=CHUNK, mode=mode, workers=2, lr=0.5, **{"optimizer.kind": optimizer})
    rng = random.Random("%d/%s" % (SEED, mode))
    conns = [connect(srv, rank=0), connect(srv, rank=1), connect(srv, rank=0)]
    tensors, tables = {}, {}
    for c in conns[:2]:
        assert c.call(pb.Hello(world_size=2)).kind == "hello"
        for key, n in (("t0", 10), ("t1", 8), ("t2", 1)):
            r = c.call(pb.InitTensor(key=key, n=n, payload_bytes=4 * n), [f32([0.5] * n)])
            assert r.kind == "init", r
            tensors[r.body.id] = n
        for key, dim, extra in (("e0", 4, {}), ("e1", 3, {"max_rows": 5, "row_ttl": 3})):
            r = c.call(pb.InitTable(key=key, dim=dim, **extra))
            assert r.kind == "init_table", r
            tables[r.body.id] = dim
    answered = Attack(pb, srv, conns, rng, tensors, tables).run()
    assert answered > ITERS // 2, "only %d replies to %d requests" % (answered, ITERS)
    assert srv.proc.poll() is None, srv.log_text()[-4000:]

    obs = connect(srv, observer=True)
    r = obs.call(pb.StatsRequest())
    assert r.kind == "stats", r
    if mode != "async":
        return
    # A worker again, with a session that still holds (or may take) a
    # rank: the attack may have said Bye or taken rank 0 from a third session.
    for c in conns:
        w = connect(srv, rank=c.rank, session=c.session)
        if w.call(pb.Hello(world_size=2)).kind == "hello":
            break
    else:
        pytest.fail("no session can take a rank after the attack")
    w0 = [0.25, -1.0, 2.0, 0.5, 4.0]
    g = [1.0, 0.5, -2.0, 0.25, -0.125]
    r = w.call(pb.InitTensor(key="after", n=5, payload_bytes=20), [f32(w0)])
    assert r.kind == "init" and r.body.created, r
    tid = r.body.id
    r = w.call(pb.Push(id=tid, step=10**9, payload_bytes=20), [f32(g)])
    assert r.kind == "push" and r.body.applied, r
    r = w.call(pb.Pull(id=tid, min_version=1, wait_ms=int(WAIT_S * 1000)))
    assert r.kind == "pull", r
    assert unf32(r.frames[0]) == sgd(w0, g, 0.5)
