"""The GDDR wire, spoken by hand: a client written from proto/gddr.proto and
docs/protocol.md alone (no libgddr-client), against a real gddr-ps.

Every test starts its own server (conftest.py) and checks what the server
computes, bit for bit where values are involved. The learning rates and
gradients are chosen so that lr * g is exact in float32: the expected
values then do not depend on how the server's compiler rounds.

    /usr/bin/python3 -m pytest -q tests/protocol
"""

import math
import struct

import pytest

from conftest import WAIT_S, f32, r32, sgd, unf32


# ---- helpers ------------------------------------------------------------------


def hello(pb, c, world=1, **header):
    return c.call(pb.Hello(world_size=world, client="test_wire.py"), **header)


def worker(pb, connect, srv, rank=0, world=1):
    """A connection that said hello as `rank` of `world` and was accepted."""
    c = connect(srv, rank=rank)
    r = hello(pb, c, world)
    assert r.kind == "hello", r
    return c


def register(pb, c, key, values):
    return c.call(pb.InitTensor(key=key, n=len(values), payload_bytes=4 * len(values)),
                  [f32(values)])


def pull(pb, c, tid, min_version=0, wait_ms=WAIT_S * 1000, step=0):
    r = c.call(pb.Pull(id=tid, min_version=min_version, wait_ms=int(wait_ms), step=step))
    assert r.kind == "pull", r
    assert len(r.frames) == 1
    assert r.body.payload_bytes == len(r.frames[0])
    return r.body.version, r.frames[0]


def push(pb, c, tid, values, step, version=0, bitmap=b"", **fields):
    norm = math.sqrt(sum(v * v for v in values if math.isfinite(v)))
    p = pb.Push(id=tid, birth_version=version, base_version=version, step=step,
                grad_norm=norm, bitmap=bitmap, payload_bytes=4 * len(values))
    for k, v in fields.items():
        setattr(p, k, v)
    return c.call(p, [f32(values)])


def expect_error(pb, r, code, retry=False):
    assert r.kind == "error", "expected %s, got %r" % (pb.ErrorCode.Name(code), r)
    assert r.body.code == code, "expected %s, got %s (%s)" % (
        pb.ErrorCode.Name(code), pb.ErrorCode.Name(r.body.code), r.body.message)
    assert r.body.message, "an error says why"
    assert r.frames == []
    if retry:
        assert r.body.retry_ms > 0, r
    else:
        assert r.body.retry_ms == 0, r


def stats(pb, c, prometheus=False):
    r = c.call(pb.StatsRequest(prometheus=prometheus))
    assert r.kind == "stats", r
    return r.body


W6 = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


# ---- hello, sessions, ranks ------------------------------------------------------


def test_hello_accepted(pb, server, connect):
    srv = server(chunk=4, tau_init=3)
    c = connect(srv, rank=1)
    r = hello(pb, c, world=3)
    assert r.kind == "hello", r
    h = r.header
    assert h.protocol == pb.PROTOCOL_VERSION
    assert h.req_id == 1
    assert h.epoch != 0
    assert h.tau == 3
    assert r.body.mode == pb.MODE_ASYNC
    assert r.body.chunk == 4
    assert r.body.workers == 3  # workers = 0 in the config: the announced world_size
    assert r.body.tau == 3
    assert r.body.max_message_bytes == 1 << 30
    assert r.frames == []
    # The same session says hello again (a reconnect): accepted.
    assert hello(pb, c, world=3).kind == "hello"


def test_hello_refused(pb, server, connect):
    srv = server(chunk=4, workers=2)
    c = connect(srv, rank=2)
    expect_error(pb, hello(pb, c, world=2), pb.E_WORKER)    # rank not below world_size
    expect_error(pb, hello(pb, c, world=4), pb.E_WORKER)    # not below the server's workers = 2
    expect_error(pb, hello(pb, c, world=0), pb.E_WORKER)    # world_size 0
    expect_error(pb, hello(pb, c, world=1, rank=5000), pb.E_WORKER)  # not below max_workers
    # A refused hello makes no worker: this connection still may not register.
    expect_error(pb, register(pb, c, "w", W6), pb.E_WORKER)
    assert stats(pb, c).live_workers <= 2


def test_hello_shard_layout(pb, server, connect):
    """A sharded model: each server is shard_index of shard_count. A hello
    says where the client's server list puts this server; another place, or
    no layout at all on a server that is one of several, is refused for good
    (E_CONFIG, no retry) with both layouts named, and makes no worker."""
    srv = server(chunk=4, shard_index=1, shard_count=3)

    def shard_hello(c, idx, cnt, world=2):
        return c.call(pb.Hello(world_size=world, client="test_wire.py",
                               shard_index=idx, shard_count=cnt))

    c = connect(srv, rank=0)
    for idx, cnt, says in [(0, 2, "puts it at 0 of 2"), (0, 3, "puts it at 0 of 3"),
                           (0, 0, "sharded over 3 servers")]:
        r = shard_hello(c, idx, cnt)
        expect_error(pb, r, pb.E_CONFIG)
        assert "this server is shard 1 of 3" in r.body.message, r
        assert says in r.body.message, r
    expect_error(pb, register(pb, c, "w", W6), pb.E_WORKER)  # still no worker
    r = shard_hello(c, 1, 3)
    assert r.kind == "hello", r
    assert (r.body.shard_index, r.body.shard_count) == (1, 3)
    assert register(pb, c, "w", W6).kind == "init"
    # An observer without a layout may read this one shard; with a wrong one not.
    o = connect(srv, observer=True)
    r = shard_hello(o, 0, 0)
    assert r.kind == "hello" and (r.body.shard_index, r.body.shard_count) == (1, 3), r
    expect_error(pb, shard_hello(o, 0, 3), pb.E_CONFIG)
    text = stats(pb, o, prometheus=True).prometheus
    assert '\ngddr_shard_info{shard_index="1",shard_count="3"} 1\n' in text
    # An unsharded server is shard 0 of 1 and says so.
    one = server(chunk=4)
    c = connect(one, rank=0)
    r = hello(pb, c)
    assert r.kind == "hello" and (r.body.shard_index, r.body.shard_count) == (0, 1), r
    r = shard_hello(c, 0, 2)
    expect_error(pb, r, pb.E_CONFIG)
    assert "this server is shard 0 of 1 (its shard_index and shard_count), the client's list puts it at 0 of 2" in r.body.message


def test_rank_held_by_another_session(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv, rank=0, world=2)
    tid = register(pb, a, "w", W6).body.id
    b = connect(srv, rank=0)  # another process claims rank 0
    r = hello(pb, b, world=2)
    expect_error(pb, r, pb.E_WORKER, retry=True)
    # The stranger can neither push for the rank nor say bye for it.
    expect_error(pb, push(pb, b, tid, [1.0] * 6, step=1), pb.E_WORKER)
    expect_error(pb, b.call(pb.Bye()), pb.E_WORKER)
    # The holder is undisturbed.
    r = push(pb, a, tid, [1.0] * 6, step=1)
    assert r.kind == "push" and r.body.version == 1
    # Once the holder says bye, the rank is free.
    assert a.call(pb.Bye()).body.text == "bye"
    assert hello(pb, b, world=2).kind == "hello"
    assert push(pb, b, tid, [1.0] * 6, step=1, version=1).body.version == 2


def test_same_session_on_a_new_socket(pb, server, connect):
    """A reconnect: the same session on a new socket keeps the rank and its
    exactly-once history, so a resend there is still a duplicate."""
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    assert push(pb, a, tid, [1.0] * 6, step=7).body.version == 1
    b = connect(srv, rank=0, session=a.session)
    assert hello(pb, b).kind == "hello"
    r = push(pb, b, tid, [1.0] * 6, step=7)
    assert r.body.duplicate and r.body.version == 1
    assert push(pb, b, tid, [1.0] * 6, step=8, version=1).body.version == 2


def test_push_without_hello(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    s = connect(srv, rank=1)  # never said hello
    expect_error(pb, push(pb, s, tid, [1.0] * 6, step=1), pb.E_WORKER)
    expect_error(pb, register(pb, s, "v", W6), pb.E_WORKER)
    expect_error(pb, s.call(pb.Heartbeat(step=1)), pb.E_WORKER)
    # ... but anyone may pull and ask for stats.
    v, vals = pull(pb, s, tid)
    assert v == 0 and vals == f32(W6)
    assert stats(pb, s).pushes == 0


def test_heartbeat_and_bye(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    r = a.call(pb.Heartbeat(step=3))
    assert r.kind == "ack" and r.body.text == "alive"
    r = a.call(pb.Bye())
    assert r.kind == "ack" and r.body.text == "bye"
    # After bye the connection is no worker any more.
    expect_error(pb, push(pb, a, tid, [1.0] * 6, step=1), pb.E_WORKER)


def test_observer(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    register(pb, a, "w", W6)
    o = connect(srv, observer=True)
    assert hello(pb, o).kind == "hello"
    # An observer may look a tensor up by key (its values are ignored) ...
    r = register(pb, o, "w", [0.0] * 6)
    assert r.kind == "init" and not r.body.created and r.body.id == 0
    assert pull(pb, o, 0) == (0, f32(W6))
    # ... but not create one, nor push.
    expect_error(pb, register(pb, o, "new", W6), pb.E_NOKEY)
    expect_error(pb, push(pb, o, 0, [1.0] * 6, step=1), pb.E_WORKER)
    assert o.call(pb.Heartbeat()).body.text == "observer"


# ---- registration and pulls --------------------------------------------------------


def test_register_and_pull_bit_exact(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv, rank=0, world=2)
    # Values whose bits a lossy path would change: -0.0, a subnormal, the
    # largest float, 0.1 (not a short binary fraction).
    init = [-0.0, 1e-45, 3.4028234663852886e38, r32(0.1), -7.5, 1.0, 2.0]
    r = register(pb, a, "layer0.weight", init)
    assert r.kind == "init", r
    assert r.body.created and r.body.id == 0 and r.body.version == 0 and r.body.n == 7
    r2 = register(pb, a, "layer0.bias", [0.5, 0.25])
    assert r2.body.created and r2.body.id == 1
    v, vals = pull(pb, a, 0)
    assert v == 0 and vals == f32(init)
    # Another worker registering the same key gets the existing tensor; its
    # own initial values are ignored.
    b = worker(pb, connect, srv, rank=1, world=2)
    r = register(pb, b, "layer0.weight", [9.0] * 7)
    assert r.kind == "init" and not r.body.created and r.body.id == 0 and r.body.version == 0
    assert pull(pb, b, 0)[1] == f32(init)
    # The same key with another length is refused.
    expect_error(pb, register(pb, b, "layer0.weight", [9.0] * 8), pb.E_LENGTH)
    # A bad key, and initial values that are not finite.
    expect_error(pb, register(pb, b, "has space", [1.0]), pb.E_INVAL)
    expect_error(pb, register(pb, b, "nan", [float("nan")]), pb.E_NONFINITE)


def test_register_length_mismatch(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    r = a.call(pb.InitTensor(key="w", n=6, payload_bytes=24), [f32(W6[:5])])
    expect_error(pb, r, pb.E_LENGTH)
    r = a.call(pb.InitTensor(key="w", n=6, payload_bytes=20), [f32(W6)])
    expect_error(pb, r, pb.E_LENGTH)
    r = a.call(pb.InitTensor(key="w", n=6, payload_bytes=24))  # no value frame
    expect_error(pb, r, pb.E_LENGTH)
    assert register(pb, a, "w", W6).body.created


def test_unknown_tensor(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    register(pb, a, "w", W6)
    expect_error(pb, a.call(pb.Pull(id=7, wait_ms=1000)), pb.E_NOKEY)
    expect_error(pb, push(pb, a, 7, [1.0] * 6, step=1), pb.E_NOKEY)


def test_pull_waits_for_a_version(pb, server, connect):
    srv = server(chunk=4, lr=0.5, max_parked_pulls=1)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    # Far beyond what any step could reach: refused at once.
    expect_error(pb, a.call(pb.Pull(id=tid, min_version=1000, wait_ms=1000)), pb.E_VERSION)
    # The next version: parked; a second parked pull is over max_parked_pulls.
    first = a.send(pb.Pull(id=tid, min_version=1, wait_ms=int(WAIT_S * 1000)))
    second = a.send(pb.Pull(id=tid, min_version=1, wait_ms=int(WAIT_S * 1000)))
    r = a.recv()
    assert r.header.req_id == second, r
    expect_error(pb, r, pb.E_BUSY)
    # A push makes version 1: the parked pull is answered after the push's reply.
    push_id = a.send(pb.Push(id=tid, step=1, payload_bytes=24), [f32([2.0] * 6)])
    r = a.recv()
    assert r.header.req_id == push_id and r.body.version == 1, r
    r = a.recv()
    assert r.header.req_id == first and r.kind == "pull", r
    assert r.body.version == 1 and r.frames[0] == f32([w - 1.0 for w in W6])
    # It says it was parked (the second pull's refusal proved it was, before
    # the push); a pull answered at once says 0.
    assert r.body.parked_us > 0, r
    r = a.call(pb.Pull(id=tid, min_version=1))
    assert r.kind == "pull" and r.body.parked_us == 0, r
    # Nobody pushes again: a pull of version 2 runs out of its wait_ms; with
    # wait_ms 0 it does not wait at all.
    expect_error(pb, a.call(pb.Pull(id=tid, min_version=2, wait_ms=100)), pb.E_TIMEDOUT)
    expect_error(pb, a.call(pb.Pull(id=tid, min_version=2)), pb.E_TIMEDOUT)


# ---- pushes --------------------------------------------------------------------------


def test_dense_push(pb, server, connect):
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    g = [1.0, -2.0, 0.25, 3.0, -0.5, 8.0]
    r = push(pb, a, tid, g, step=1)
    assert r.kind == "push", r
    assert r.body.id == tid and r.body.version == 1 and r.body.applied
    assert not r.body.duplicate and r.body.staleness == 0
    assert r.body.mode == pb.MODE_ASYNC and r.body.sync_target == 0
    v, vals = pull(pb, a, tid)
    assert v == 1
    assert vals == f32(sgd(W6, g, 0.5))
    assert unf32(vals) == [0.5, 3.0, 2.875, 2.5, 5.25, 2.0]


def test_stale_push(pb, server, connect):
    """A gradient computed on version 0 and pushed when the tensor is at 2:
    staleness 2, applied as it is (adadelay = 0)."""
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    push(pb, a, tid, [1.0] * 6, step=1, version=0)
    push(pb, a, tid, [1.0] * 6, step=2, version=0)
    r = push(pb, a, tid, [2.0] * 6, step=3, version=0)
    assert r.body.version == 3 and r.body.staleness == 2
    assert pull(pb, a, tid) == (3, f32([w - 2.0 for w in W6]))
    st = stats(pb, a)
    assert st.staleness_max == 2 and list(st.staleness_hist[:3]) == [1, 1, 1]


def test_sparse_push(pb, server, connect):
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    w = [float(i) for i in range(10)]  # chunks [0..3] [4..7] [8, 9]
    tid = register(pb, a, "w", w).body.id
    # Chunks 0 and 2 (bits 0 and 2 of byte 0: 0x05); the payload is chunk 0
    # then the short last chunk, 4 + 2 values.
    g = [1.0, 2.0, 3.0, 4.0, 10.0, 20.0]
    r = push(pb, a, tid, g, step=1, bitmap=bytes([0b101]))
    assert r.kind == "push" and r.body.version == 1 and r.body.applied, r
    want = w[:]
    for i, gi in zip([0, 1, 2, 3, 8, 9], g):
        want[i] = r32(w[i] - 0.5 * gi)
    assert pull(pb, a, tid) == (1, f32(want))
    # Chunk 1 alone.
    r = push(pb, a, tid, [2.0] * 4, step=2, version=1, bitmap=bytes([0b010]))
    assert r.body.version == 2
    want[4:8] = [x - 1.0 for x in want[4:8]]
    assert pull(pb, a, tid) == (2, f32(want))


def test_resend_is_a_duplicate(pb, server, connect):
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    g = [2.0] * 6
    first = push(pb, a, tid, g, step=5)
    assert first.body.version == 1 and not first.body.duplicate
    again = push(pb, a, tid, g, step=5)
    assert again.kind == "push", again
    assert again.body.duplicate
    assert again.body.version == 1 and again.body.applied == first.body.applied
    assert again.body.staleness == first.body.staleness
    # An older step is a duplicate too, whatever it carries.
    assert push(pb, a, tid, [100.0] * 6, step=3).body.duplicate
    assert pull(pb, a, tid) == (1, f32([w - 1.0 for w in W6]))  # applied once
    st = stats(pb, a)
    assert st.pushes == 1 and st.duplicates == 2
    # The next step is new.
    r = push(pb, a, tid, g, step=6, version=1)
    assert not r.body.duplicate and r.body.version == 2
    # Steps count per (rank, tensor): another tensor starts its own history.
    t2 = register(pb, a, "v", [0.0, 0.0]).body.id
    assert not push(pb, a, t2, [1.0, 1.0], step=1).body.duplicate


def test_refused_push_uses_no_step(pb, server, connect):
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    expect_error(pb, push(pb, a, tid, [1.0] * 6, step=1, version=3), pb.E_VERSION)
    r = push(pb, a, tid, [1.0] * 6, step=1, version=0)
    assert r.kind == "push" and not r.body.duplicate and r.body.version == 1


def test_wrong_payload_length(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    # payload_bytes says 24, the frame holds 20.
    p = pb.Push(id=tid, step=1, payload_bytes=24)
    expect_error(pb, a.call(p, [f32([1.0] * 5)]), pb.E_LENGTH)
    # Consistent with itself, but a dense push must carry all 6 values.
    expect_error(pb, push(pb, a, tid, [1.0] * 5, step=1), pb.E_LENGTH)
    # A push without its value frame, or with one too many.
    expect_error(pb, a.call(pb.Push(id=tid, step=1, payload_bytes=24)), pb.E_PROTO)
    expect_error(pb, a.call(pb.Push(id=tid, step=1, payload_bytes=24),
                            [f32([1.0] * 6), b""]), pb.E_PROTO)
    assert pull(pb, a, tid) == (0, f32(W6))


def test_bad_bitmap(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id  # 2 chunks: 1 bitmap byte
    # Two bytes for two chunks.
    expect_error(pb, push(pb, a, tid, [1.0] * 4, step=1, bitmap=b"\x01\x00"), pb.E_BITMAP)
    # A bit past the last chunk.
    expect_error(pb, push(pb, a, tid, [1.0] * 4, step=1, bitmap=b"\x05"), pb.E_BITMAP)
    # Chunk 0 selected (4 values) but 2 values sent.
    expect_error(pb, push(pb, a, tid, [1.0] * 2, step=1, bitmap=b"\x01"), pb.E_BITMAP)
    # Chunk 1 is short: it takes 2 values, not 4.
    expect_error(pb, push(pb, a, tid, [1.0] * 4, step=1, bitmap=b"\x02"), pb.E_BITMAP)
    assert pull(pb, a, tid) == (0, f32(W6))


def test_nonfinite(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    for bad in (float("nan"), float("inf"), float("-inf")):
        g = [1.0, 1.0, bad, 1.0, 1.0, 1.0]
        expect_error(pb, push(pb, a, tid, g, step=1), pb.E_NONFINITE)
    expect_error(pb, push(pb, a, tid, [1.0] * 6, step=1, grad_norm=float("nan")), pb.E_NONFINITE)
    assert pull(pb, a, tid) == (0, f32(W6))


def test_norm_from_payload(pb, server, connect):
    """norm_from_payload: the server takes the payload's measured norm as
    the fresh gradient's. Two tensors get the same gradients, one with the
    norm given and one without: tau moves the same way on both (and does
    move, so the norm is really used); a bitmap or a flush is refused."""
    srv = server(chunk=4, lr=0.0, tau_init=4, tau_min=2, tau_max=8)
    a = worker(pb, connect, srv)
    given = register(pb, a, "given", W6).body.id
    measured = register(pb, a, "measured", W6).body.id
    taus = {given: [], measured: []}
    for step in range(1, 41):
        scale = 1.0 if step % 2 else 64.0  # a norm that keeps changing: tau falls
        g = [scale * (i + 1) for i in range(6)]
        r = push(pb, a, given, g, step=step, version=step - 1)
        assert r.kind == "push", r
        taus[given].append(r.header.tau)
        r = push(pb, a, measured, g, step=step, version=step - 1,
                 grad_norm=0.0, norm_from_payload=True)
        assert r.kind == "push", r
        taus[measured].append(r.header.tau)
    assert taus[measured] == taus[given]
    assert min(taus[given]) < 4, taus[given]
    bm = bytes([0b01])
    expect_error(pb, push(pb, a, measured, W6[:4], step=41, version=40, bitmap=bm,
                          grad_norm=0.0, norm_from_payload=True), pb.E_INVAL)
    expect_error(pb, push(pb, a, measured, W6, step=41, version=40, flush=True,
                          grad_norm=0.0, norm_from_payload=True), pb.E_INVAL)


W10 = [float(i) for i in range(10)]  # chunk 4: chunks [0..3] [4..7] [8, 9]


def send_part(pb, c, tid, values, step, part, parts, first, nchunks, req_id, bitmap=b"",
              version=0):
    norm = 2.0  # any finite norm; every part repeats it
    p = pb.Push(id=tid, birth_version=version, base_version=version, step=step, grad_norm=norm,
                bitmap=bitmap, payload_bytes=4 * len(values), part=part, parts=parts,
                first_chunk=first, part_chunks=nchunks)
    return c.send(p, [f32(values)], req_id=req_id)


def test_push_in_parts(pb, server, connect):
    """A push in two parts is one update, answered once at its last part;
    a resend of it is a duplicate, answered once too."""
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W10).body.id
    g = [1.0, 2.0, -1.0, 0.5, 4.0, -2.0, 0.25, 1.0, 8.0, -0.5]
    send_part(pb, a, tid, g[:8], 1, 0, 2, 0, 2, req_id=100)
    assert a.quiet(), "the first part is not answered"
    send_part(pb, a, tid, g[8:], 1, 1, 2, 2, 1, req_id=100)
    r = a.recv()
    assert r.header.req_id == 100 and r.kind == "push", r
    assert r.body.version == 1 and r.body.applied and not r.body.duplicate
    assert pull(pb, a, tid) == (1, f32(sgd(W10, g, 0.5)))
    # The whole push again: nothing applied, one duplicate answer.
    send_part(pb, a, tid, g[:8], 1, 0, 2, 0, 2, req_id=101)
    send_part(pb, a, tid, g[8:], 1, 1, 2, 2, 1, req_id=101)
    r = a.recv()
    assert r.header.req_id == 101 and r.body.duplicate and r.body.version == 1, r
    assert a.quiet()
    assert pull(pb, a, tid) == (1, f32(sgd(W10, g, 0.5)))


def test_push_in_parts_sparse_and_restarted(pb, server, connect):
    """Parts with their own bitmaps; a push started over from part 0 (a
    resend after a broken connection) is taken once, from the new parts."""
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W10).body.id
    first = [9.0] * 4  # sent, then abandoned with the connection
    send_part(pb, a, tid, first, 1, 0, 2, 0, 2, req_id=7, bitmap=bytes([0b01]))
    b = connect(srv, session=a.session)  # the same worker on a new socket
    send_part(pb, b, tid, [1.0] * 4, 1, 0, 2, 0, 2, req_id=8, bitmap=bytes([0b10]))  # chunk 1
    send_part(pb, b, tid, [2.0, 2.0], 1, 1, 2, 2, 1, req_id=8, bitmap=bytes([0b1]))  # chunk 2
    r = b.recv()
    assert r.header.req_id == 8 and r.kind == "push" and r.body.version == 1, r
    g = [0.0] * 4 + [1.0] * 4 + [2.0] * 2
    assert pull(pb, b, tid) == (1, f32(sgd(W10, g, 0.5)))
    assert a.quiet()


def test_push_in_parts_refused(pb, server, connect):
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W10).body.id
    # A gap: part 1 of 3 never came.
    send_part(pb, a, tid, [1.0] * 4, 1, 0, 3, 0, 1, req_id=20)
    send_part(pb, a, tid, [1.0] * 2, 1, 2, 3, 2, 1, req_id=20)
    expect_error(pb, a.recv(), pb.E_PROTO)
    # Chunks that do not follow on, or do not end the tensor at the last part.
    send_part(pb, a, tid, [1.0] * 4, 2, 0, 2, 0, 1, req_id=21)
    send_part(pb, a, tid, [1.0] * 4, 2, 1, 2, 1, 1, req_id=21)
    expect_error(pb, a.recv(), pb.E_PROTO)
    # A part whose payload does not match its chunks.
    send_part(pb, a, tid, [1.0] * 3, 3, 0, 2, 0, 1, req_id=22)
    expect_error(pb, a.recv(), pb.E_LENGTH)
    # A NaN in a later part refuses the whole push.
    send_part(pb, a, tid, [1.0] * 8, 4, 0, 2, 0, 2, req_id=23)
    send_part(pb, a, tid, [1.0, float("nan")], 4, 1, 2, 2, 1, req_id=23)
    expect_error(pb, a.recv(), pb.E_NONFINITE)
    # More parts than the tensor has chunks (3): refused before anything is kept.
    send_part(pb, a, tid, [1.0] * 4, 6, 0, 4000000000, 0, 1, req_id=25)
    expect_error(pb, a.recv(), pb.E_PROTO)
    # Parts that disagree on the versions.
    send_part(pb, a, tid, [1.0] * 8, 5, 0, 2, 0, 2, req_id=24)
    send_part(pb, a, tid, [1.0] * 2, 5, 1, 2, 2, 1, req_id=24, version=1)
    expect_error(pb, a.recv(), pb.E_PROTO)
    assert a.quiet()
    assert pull(pb, a, tid) == (0, f32(W10)), "nothing of a refused push is applied"


def test_pull_in_parts(pb, server, connect):
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W10).body.id
    push(pb, a, tid, [1.0] * 10, step=1)
    req = a.send(pb.Pull(id=tid, wait_ms=1000, part_bytes=20))  # 5 values: one chunk a part
    got = b""
    for k in range(3):
        r = a.recv()
        assert r.header.req_id == req and r.kind == "pull", r
        assert (r.body.part, r.body.parts, r.body.offset) == (k, 3, 4 * k), r
        assert r.body.version == 1 and r.body.payload_bytes == len(r.frames[0])
        got += r.frames[0]
    assert got == f32([w - 0.5 for w in W10])
    assert a.quiet()


def view_pull(pb, c, tid, seq=None, **kw):
    """A lazy or delta pull that echoes the view_seq of the last such reply
    this connection's worker applied (docs/protocol.md, "Pulls against a
    view"), or `seq` when given."""
    seqs = c.__dict__.setdefault("view_seqs", {})
    r = c.call(pb.Pull(id=tid, wait_ms=1000, view_seq=seqs.get(tid, 0) if seq is None else seq, **kw))
    assert r.kind == "pull", r
    assert r.body.payload_bytes == len(r.frames[0])
    if r.body.bitmap:
        assert r.body.view_seq > 0
        seqs[tid] = r.body.view_seq
    return r.body, r.frames[0]


def lazy_pull(pb, c, tid, alpha, full=False):
    return view_pull(pb, c, tid, delay_fraction=alpha, full=full)


def test_lazy_pulls(pb, server, connect):
    """Pull-side savings: a lazy pull sends only the chunks the worker's
    view lacks, holds changed ones back at most tau pulls in a row, and
    tags the view with the oldest version it holds."""
    srv = server(chunk=4, lr=0.5, tau_init=3, tau_dynamic=False)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W10).body.id  # chunks [0..3] [4..7] [8, 9]
    g = [1.0] * 10
    push(pb, a, tid, g, step=1)
    w1 = sgd(W10, g, 0.5)
    # The first lazy pull knows nothing of the worker's values: all of it.
    b, f = lazy_pull(pb, a, tid, 0.999)
    assert (b.version, b.view_version, b.bitmap) == (1, 1, bytes([0b111]))
    assert f == f32(w1)
    # Chunk 1 changes; chunks 0 and 2 do not and are never sent.
    push(pb, a, tid, [2.0] * 4, step=2, version=1, bitmap=bytes([0b010]))
    w2 = w1[:4] + [x - 1.0 for x in w1[4:8]] + w1[8:]
    held = 0
    while True:
        b, f = lazy_pull(pb, a, tid, 0.999)
        assert b.version == 2
        if b.bitmap == bytes([0]):
            held += 1
            assert f == b"" and b.view_version == 1, b
            continue
        assert b.bitmap == bytes([0b010]) and f == f32(w2[4:8]) and b.view_version == 2, b
        break
    assert held == 3, "chunk 1 was held %d pulls in a row; tau is 3" % held
    # Nothing changed since: an empty lazy reply, the view current.
    b, f = lazy_pull(pb, a, tid, 0.999)
    assert (b.bitmap, f, b.view_version) == (bytes([0]), b"", 2)
    # full: every changed chunk at once.
    push(pb, a, tid, [1.0] * 10, step=3, version=2)
    b, f = lazy_pull(pb, a, tid, 0.999, full=True)
    assert b.bitmap == bytes([0b111]) and f == f32(sgd(w2, [1.0] * 10, 0.5)) and b.view_version == 3
    # An observer (no view kept) gets the whole tensor, no bitmap.
    o = connect(srv, observer=True)
    r = o.call(pb.Pull(id=tid, wait_ms=1000, delay_fraction=0.5))
    assert r.kind == "pull" and r.body.bitmap == b"" and len(r.frames[0]) == 40
    st = stats(pb, a, prometheus=True)
    assert "gddr_lazy_pulls_total 7" in st.prometheus
    assert "gddr_pull_view_bytes 30" in st.prometheus  # 3 chunks x 10 bytes, one worker


def delta_pull(pb, c, tid, bits, full=False, seq=None):
    return view_pull(pb, c, tid, seq=seq, delta_bits=bits, full=full)


def apply_delta(view, body, frame, chunk):
    """The worker's side of a delta reply, from the comments in gddr.proto:
    per chunk whose bit is set, a float32 scale first, then the chunks'
    int8/int16 differences; view += float32(q) * scale in float32."""
    import numpy as np
    n = len(view)
    sel = [ch for ch in range((n + chunk - 1) // chunk) if body.bitmap[ch // 8] >> (ch % 8) & 1]
    v = np.array(view, dtype=np.float32)
    if body.delta_bits == 0:
        vals = np.frombuffer(frame, dtype="<f4")
        o = 0
        for ch in sel:
            lo, hi = ch * chunk, min(n, (ch + 1) * chunk)
            v[lo:hi] = vals[o:o + hi - lo]
            o += hi - lo
        assert o == len(vals)
        return list(v)
    scales = np.frombuffer(frame[:4 * len(sel)], dtype="<f4")
    q = np.frombuffer(frame[4 * len(sel):], dtype="<i1" if body.delta_bits == 8 else "<i2")
    o = 0
    for ch, s in zip(sel, scales):
        lo, hi = ch * chunk, min(n, (ch + 1) * chunk)
        v[lo:hi] = v[lo:hi] + q[o:o + hi - lo].astype(np.float32) * np.float32(s)
        o += hi - lo
    assert o == len(q)
    return list(v)


@pytest.mark.parametrize("bits", [8, 16])
def test_delta_pulls(pb, server, connect, bits):
    """Pulls in reduced precision: the first delta pull is whole (float32),
    the next carry scaled 8/16-bit differences from the worker's view,
    within half a step of the server's values; repeated pulls with nothing
    new converge to the server's values bit for bit (the error is kept on
    the server), and `full` is exact at once."""
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    w = [0.1, -2.0, 3.5, 0.25, 1e-3, 7.0, -0.5, 2.0, 9.0, -9.0]
    tid = register(pb, a, "w", w).body.id  # chunks [0..3] [4..7] [8, 9]
    expect_error(pb, a.call(pb.Pull(id=tid, wait_ms=1000, delta_bits=5)), pb.E_INVAL)
    b, f = delta_pull(pb, a, tid, bits)
    assert (b.delta_bits, b.bitmap, b.version) == (0, bytes([0b111]), 0)
    view = apply_delta([0.0] * 10, b, f, 4)
    assert f32(view) == f32(w)
    g = [0.3, 1.7, -0.9, 0.01, 2.5, -1.25, 0.125, 3.0, -0.7, 0.2]
    push(pb, a, tid, g, step=1)
    _, exact = pull(pb, a, tid)
    server_w = unf32(exact)
    b, f = delta_pull(pb, a, tid, bits)
    assert (b.delta_bits, b.bitmap, b.version, b.view_version) == (bits, bytes([0b111]), 1, 1)
    assert len(f) == 3 * 4 + 10 * bits // 8, "a scale a chunk, then the differences"
    prev, view = view, apply_delta(view, b, f, 4)
    qmax = 127 if bits == 8 else 32767
    for ch in range(3):
        lo, hi = 4 * ch, min(10, 4 * ch + 4)
        amax = max(abs(server_w[i] - prev[i]) for i in range(lo, hi))
        for i in range(lo, hi):
            assert abs(view[i] - server_w[i]) <= amax / qmax / 2 + 1e-6 * (amax + abs(server_w[i])), (i, view[i])
    # Nothing new: each pull sends what rounding left out, finer each time,
    # until the view is the server's to the bit and the reply is empty.
    for k in range(8):
        b, f = delta_pull(pb, a, tid, bits)
        view = apply_delta(view, b, f, 4)
        if b.bitmap == bytes([0]):
            break
    assert b.bitmap == bytes([0]) and f == b"", "still %r after 8 pulls" % b
    assert f32(view) == exact, "the view converged to the server's values"
    assert k >= 1, "an 8/16-bit difference of these values cannot be exact at once"
    # full: float32 values of every chunk, exact.
    push(pb, a, tid, [1.0] * 10, step=2, version=1)
    b, f = delta_pull(pb, a, tid, bits, full=True)
    assert (b.delta_bits, b.bitmap) == (0, bytes([0b111]))
    _, exact = pull(pb, a, tid)
    assert f32(apply_delta(view, b, f, 4)) == exact == f
    st = stats(pb, a, prometheus=True)
    assert "gddr_pull_view_bytes 73" in st.prometheus  # 3 chunks x 11 bytes + 10 values x 4
    assert "gddr_delta_pulls_total %d" % (k + 2) in st.prometheus  # the first and the full were values
    # A pull naming an older reply than the server's latest (a lost reply)
    # is answered in full: float32 values of every chunk, exact.
    seq = a.view_seqs[tid]
    b, f = delta_pull(pb, a, tid, bits, seq=seq - 1)
    assert (b.delta_bits, b.bitmap, b.view_seq) == (0, bytes([0b111]), seq + 1)
    assert f == exact
    st = stats(pb, a, prometheus=True)
    assert "gddr_pull_view_resyncs_total 1" in st.prometheus
    # An observer keeps no view: whole float32 values.
    o = connect(srv, observer=True)
    r = o.call(pb.Pull(id=tid, wait_ms=1000, delta_bits=bits))
    assert r.kind == "pull" and r.body.bitmap == b"" and r.body.delta_bits == 0 and r.frames[0] == exact


def test_version_from_the_future(pb, server, connect):
    srv = server(chunk=4)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    # base 1 > the tensor's version 0
    expect_error(pb, push(pb, a, tid, [1.0] * 6, step=1, version=1), pb.E_VERSION)
    # birth 1 > base 0
    p = pb.Push(id=tid, birth_version=1, base_version=0, step=1, payload_bytes=24)
    expect_error(pb, a.call(p, [f32([1.0] * 6)]), pb.E_VERSION)
    assert pull(pb, a, tid) == (0, f32(W6))


def test_residual_snapshot_frame(pb, server, connect):
    """Frame 3 is there exactly when residual_snapshot is set; its bitmap is
    always full length, and may select nothing (an empty frame)."""
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    g = [1.0] * 4
    # A snapshot frame without residual_snapshot.
    p = pb.Push(id=tid, step=1, bitmap=b"\x01", payload_bytes=16)
    expect_error(pb, a.call(p, [f32(g), f32([0.5, 0.5])]), pb.E_PROTO)
    # residual_snapshot without the frame.
    p = pb.Push(id=tid, step=1, bitmap=b"\x01", payload_bytes=16, residual_snapshot=True,
                residual_bitmap=b"\x02", residual_payload_bytes=8)
    expect_error(pb, a.call(p, [f32(g)]), pb.E_PROTO)
    # The snapshot's bitmap must be full length even when it selects nothing.
    p = pb.Push(id=tid, step=1, bitmap=b"\x01", payload_bytes=16, residual_snapshot=True)
    expect_error(pb, a.call(p, [f32(g), b""]), pb.E_BITMAP)
    # Right: chunk 0 pushed, chunk 1 held (2 values in the snapshot).
    p = pb.Push(id=tid, step=1, bitmap=b"\x01", payload_bytes=16, residual_snapshot=True,
                residual_bitmap=b"\x02", residual_payload_bytes=8, residual_l1=1.0)
    r = a.call(p, [f32(g), f32([0.5, 0.5])])
    assert r.kind == "push" and r.body.version == 1, r
    # An empty selection: a zero bitmap and an empty frame.
    p = pb.Push(id=tid, step=2, birth_version=1, base_version=1, bitmap=b"\x01",
                payload_bytes=16, residual_snapshot=True, residual_bitmap=b"\x00",
                residual_payload_bytes=0)
    r = a.call(p, [f32(g), b""])
    assert r.kind == "push" and r.body.version == 2, r
    assert pull(pb, a, tid) == (2, f32([0.0, 1.0, 2.0, 3.0, 5.0, 6.0]))


# ---- malformed requests ---------------------------------------------------------------


def test_garbage_header(pb, server, connect):
    srv = server(chunk=4)
    c = connect(srv)
    c.send_raw([b"\xff\xff\xff\xff not a protobuf"])
    r = c.recv()
    assert r.header.req_id == 0
    expect_error(pb, r, pb.E_PROTO)
    assert r.header.epoch != 0


def test_wrong_protocol(pb, server, connect):
    srv = server(chunk=4)
    c = connect(srv)
    req_id = c.send(pb.Hello(world_size=1), protocol=pb.PROTOCOL_VERSION + 1)
    r = c.recv()
    assert r.header.req_id == req_id
    expect_error(pb, r, pb.E_PROTO)
    # Nor does a request without a body, or a pull with a value frame, pass.
    expect_error(pb, c.call(pb.StatsRequest(), [f32([1.0])]), pb.E_PROTO)
    c.next_id += 1
    rq = pb.Request(protocol=pb.PROTOCOL_VERSION, req_id=c.next_id, session=c.session)
    c.send_raw([rq.SerializeToString()])
    r = c.recv()
    assert r.header.req_id == c.next_id
    expect_error(pb, r, pb.E_PROTO)


# ---- sync mode: a parked pull answered out of order --------------------------------------


def test_sync_parked_pull_out_of_order(pb, server, connect):
    srv = server(chunk=4, lr=0.5, mode="sync", workers=2)
    a = worker(pb, connect, srv, rank=0, world=2)
    b = worker(pb, connect, srv, rank=1, world=2)
    tid = register(pb, a, "w", W6).body.id
    assert register(pb, b, "w", W6).body.id == tid
    ga = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    gb = [3.0, 2.0, 1.0, 0.0, -1.0, -2.0]
    r = push(pb, a, tid, ga, step=1)
    assert r.kind == "push", r
    assert not r.body.applied and r.body.version == 0
    assert r.body.sync_target == 1 and r.body.mode == pb.MODE_SYNC
    # Worker 0 pulls the version its step completes at, then asks for stats.
    pull_id = a.send(pb.Pull(id=tid, min_version=r.body.sync_target, wait_ms=int(WAIT_S * 1000)))
    stats_id = a.send(pb.StatsRequest())
    r = a.recv()
    assert r.header.req_id == stats_id and r.kind == "stats", r  # the later request first
    assert a.quiet(), "the pull was answered before its version existed"
    # Worker 1's push completes the step: both pushes applied as their mean.
    r = push(pb, b, tid, gb, step=1)
    assert r.body.applied and r.body.version == 1 and r.body.sync_target == 1
    r = a.recv()
    assert r.header.req_id == pull_id and r.kind == "pull", r
    assert r.body.version == 1
    want = [w - 0.5 * (x + y) / 2 for w, x, y in zip(W6, ga, gb)]
    assert r.frames[0] == f32(want)
    # A resend of worker 0's push now: the first answer again (not applied).
    r = push(pb, a, tid, ga, step=1)
    assert r.body.duplicate and not r.body.applied and r.body.sync_target == 1


def test_sync_late_push_is_folded_and_not_waited_for(pb, server, connect):
    # A push whose step here completed without it (by its worker's own step
    # numbers: quorum here, a worker declared dead in a real run) is late:
    # its values join the open step as mass, not as its worker's push of
    # it, and it is answered at once with `behind`. A worker parked on the
    # open step while the others wait for it in another phase of their
    # loop (a table's step) would wait for good; one counted in the open
    # step would land its later pushes a step early.
    srv = server(chunk=4, lr=0.5, mode="sync", workers=3, sync_quorum=2)
    a, b, c = (worker(pb, connect, srv, rank=r, world=3) for r in range(3))
    tid = register(pb, a, "w", W6).body.id
    for x in (b, c):
        assert register(pb, x, "w", W6).body.id == tid
    g1 = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    g2 = [3.0, 2.0, 1.0, 0.0, -1.0, -2.0]
    g3 = [0.5] * 6
    assert not push(pb, a, tid, g1, step=1).body.applied
    assert push(pb, b, tid, g2, step=1).body.version == 1  # the quorum
    assert push(pb, a, tid, g3, step=2, version=1).body.behind == 0
    assert push(pb, c, tid, g3, step=1).body.version == 2  # c's first: step 2
    # b's step 2 completed without it: late, one step behind.
    r = push(pb, b, tid, g1, step=2, version=1)
    assert not r.body.applied and r.body.version == 2 and r.body.behind == 1
    assert r.body.sync_target == 2, "a late push must not wait for the open step"
    v, _ = pull(pb, b, tid, min_version=r.body.sync_target)
    assert v == 2
    # Step 3 still wants b's push of it; a alone is no quorum (b's late
    # push is mass, not b's push).
    r = push(pb, a, tid, g2, step=3, version=2)
    assert not r.body.applied and r.body.sync_target == 3
    r = push(pb, b, tid, g3, step=3, version=2)
    assert r.body.applied and r.body.version == 3 and r.body.behind == 0
    step1 = [w - 0.5 * (x + y) / 3 for w, x, y in zip(W6, g1, g2)]
    step2 = [w - 0.5 * (x + y) / 3 for w, x, y in zip(step1, g3, g3)]
    want = [w - 0.5 * (x + y + z) / 3 for w, x, y, z in zip(step2, g1, g2, g3)]
    v, vals = pull(pb, c, tid, min_version=3)
    assert v == 3
    assert all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(unf32(vals), want))
    # Two steps behind: c misses steps 3 and 4. With tensors only (one
    # phase) a late worker skips what it missed: its next push is its push
    # of the open step. (With a table too it catches up one push a step:
    # test_tables.py.)
    assert not push(pb, a, tid, g1, step=4, version=3).body.applied
    assert push(pb, b, tid, g1, step=4, version=3).body.version == 4
    r = push(pb, c, tid, g1, step=2, version=2)
    assert r.body.behind == 2 and r.body.sync_target == 4 and not r.body.applied
    r = push(pb, c, tid, g1, step=3, version=4)
    assert r.body.behind == 0 and r.body.sync_target == 5 and not r.body.applied


def test_sync_step_that_stalls_closes_as_it_is(pb, server, connect):
    # sync_stall_s: a step that has waited that long (up to twice: each
    # server waits its own share longer) for a live worker closes with the
    # pushes it has, and the workers' places on it are forgotten -- the
    # safety net for workers waiting on each other in different phases.
    srv = server(chunk=4, lr=1.0, mode="sync", workers=2, sync_stall_s=0.5)
    a = worker(pb, connect, srv, rank=0, world=2)
    b = worker(pb, connect, srv, rank=1, world=2)
    tid = register(pb, a, "w", [0.0] * 4).body.id
    assert register(pb, b, "w", [0.0] * 4).body.id == tid
    assert not push(pb, a, tid, [2.0] * 4, step=1).body.applied
    assert push(pb, b, tid, [2.0] * 4, step=1).body.version == 1  # -2
    r = push(pb, a, tid, [2.0] * 4, step=2, version=1)
    assert not r.body.applied and r.body.sync_target == 2
    v, vals = pull(pb, a, tid, min_version=2)  # b does not push: the net closes it
    assert v == 2 and unf32(vals) == [-3.0] * 4  # 2 divided by the 2 live workers
    assert "gddr_sync_stalls_total 1" in stats(pb, a, prometheus=True).prometheus
    # The closed step's places are forgotten: b's next push (its step 2)
    # is its push of the open step 3, as a's step 3 is.
    r = push(pb, b, tid, [4.0] * 4, step=2, version=1)
    assert r.body.behind == 0 and r.body.sync_target == 3 and not r.body.applied
    r = push(pb, a, tid, [8.0] * 4, step=3, version=2)
    assert r.body.applied and r.body.version == 3
    v, vals = pull(pb, b, tid, min_version=3)
    assert v == 3 and unf32(vals) == [-3.0 - (4.0 + 8.0) / 2] * 4


def test_sync_step_waits_for_the_live_worker_after_one_left(pb, server, connect):
    # Worker 0 pushes its step and leaves; the step must wait for worker 1's
    # push (a count of one push for one live worker would have let it go
    # alone, and worker 1's push would then have made a second step).
    srv = server(chunk=4, lr=0.5, mode="sync", workers=2)
    a = worker(pb, connect, srv, rank=0, world=2)
    b = worker(pb, connect, srv, rank=1, world=2)
    tid = register(pb, a, "w", W6).body.id
    assert register(pb, b, "w", W6).body.id == tid
    ga = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    gb = [3.0, 2.0, 1.0, 0.0, -1.0, -2.0]
    assert not push(pb, a, tid, ga, step=1).body.applied
    assert a.call(pb.Bye()).kind == "ack"
    version, vals = pull(pb, b, tid)
    assert version == 0 and vals == f32(W6)
    r = push(pb, b, tid, gb, step=1)
    assert r.body.applied and r.body.version == 1
    version, vals = pull(pb, b, tid, min_version=1)
    assert version == 1
    assert vals == f32([w - 0.5 * (x + y) / 2 for w, x, y in zip(W6, ga, gb)])


# ---- stats -----------------------------------------------------------------------------------


def test_stats(pb, server, connect):
    srv = server(chunk=4, lr=0.5)
    a = worker(pb, connect, srv)
    tid = register(pb, a, "w", W6).body.id
    push(pb, a, tid, [1.0] * 6, step=1)
    push(pb, a, tid, [1.0] * 6, step=1)  # duplicate
    push(pb, a, tid, [1.0] * 6, step=2, version=1)
    expect_error(pb, push(pb, a, tid, [1.0] * 5, step=3), pb.E_LENGTH)
    pull(pb, a, tid)
    st = stats(pb, a, prometheus=True)
    assert st.pushes == 2
    assert st.duplicates == 1
    assert st.pulls == 1
    assert st.rejected == 1
    assert st.versions_total == 2
    assert st.staleness_max == 0 and st.staleness_mean == 0.0
    assert len(st.staleness_hist) == 17 and st.staleness_hist[0] == 2
    assert st.live_workers == 1
    assert st.worker_pushes == 2  # asked by the worker itself
    assert "gddr_" in st.prometheus
    # Asked by a stranger: no per-worker part, no Prometheus text unless asked.
    s = connect(srv, rank=0)
    st = stats(pb, s)
    assert st.worker_pushes == 0 and st.prometheus == "" and st.pushes == 2


def test_epoch_changes_on_restart(pb, server, connect):
    s1 = server(chunk=4)
    a = connect(s1)
    e1 = hello(pb, a).header.epoch
    assert a.call(pb.StatsRequest()).header.epoch == e1  # the same on every reply
    s1.stop()
    s2 = server(chunk=4)
    b = connect(s2)
    assert hello(pb, b).header.epoch != e1


# ---- the worked example of docs/protocol.md -----------------------------------------------------


def test_worked_example(pb, server, connect):
    """The exchange docs/protocol.md walks through, with the values it shows
    (lr left at its default 0.1, chunk 4)."""
    srv = server(chunk=4)
    c = connect(srv, rank=0, session=0x1D2C3B4A59687706)

    def header(req_id, **body):
        rq = pb.Request(protocol=1, req_id=req_id, session=c.session, **body)
        return rq.SerializeToString().hex()

    # The request headers docs/protocol.md shows byte by byte.
    s = "0801100%d2886eea1cba5e98e961d"
    assert header(1, hello=pb.Hello(world_size=1, client="doc-example/1")) == \
        s % 1 + "521110011a0d646f632d6578616d706c652f31"
    assert header(4, push=pb.Push(step=1, grad_norm=3.0, payload_bytes=24)) == \
        s % 4 + "6a0920012d000040403818"
    assert header(8, bye=pb.Bye()) == s % 8 + "8a0100"

    r = c.call(pb.Hello(world_size=1, client="doc-example/1"))
    assert r.kind == "hello" and r.body.chunk == 4 and r.body.workers == 1
    assert (r.body.shard_index, r.body.shard_count) == (0, 1)
    epoch = r.header.epoch

    r = c.call(pb.InitTensor(key="w", n=6, payload_bytes=24), [f32(W6)])
    assert r.kind == "init" and r.body.created and r.body.id == 0 and r.body.version == 0
    assert r.body.n == 6

    r = c.call(pb.Pull(id=0, min_version=0, wait_ms=1000))
    assert r.body.version == 0 and r.body.payload_bytes == 24
    assert r.frames[0].hex() == "0000803f" "00000040" "00004040" "00008040" "0000a040" "0000c040"

    g = [0.5, -0.5, 0.5, -0.5, 2.0, 2.0]
    r = c.call(pb.Push(id=0, birth_version=0, base_version=0, step=1, grad_norm=3.0,
                       payload_bytes=24), [f32(g)])
    assert r.kind == "push" and r.body.version == 1 and r.body.applied
    assert not r.body.duplicate and r.body.staleness == 0

    sparse = pb.Push(id=0, birth_version=1, base_version=1, step=2, grad_norm=r32(math.sqrt(2)),
                     bitmap=b"\x02", payload_bytes=8)
    r = c.call(sparse, [f32([1.0, 1.0])])
    assert r.body.version == 2 and r.body.applied and not r.body.duplicate

    r = c.call(sparse, [f32([1.0, 1.0])])  # the resend
    assert r.body.version == 2 and r.body.applied and r.body.duplicate

    r = c.call(pb.Pull(id=0, min_version=2, wait_ms=1000))
    assert r.body.version == 2 and r.header.epoch == epoch
    # The bytes docs/protocol.md shows: float32 arithmetic, one rounding per
    # operation (4.7000003 and 5.7000003 are one ulp above float32(4.7), (5.7)).
    want = "3333733f" "33330340" "cdcc3c40" "9a998140" "67669640" "6766b640"
    assert r.frames[0].hex() == want
    w1 = sgd(W6, g, 0.1)
    assert r.frames[0] == f32(w1[:4] + sgd(w1[4:], [1.0, 1.0], 0.1))

    r = c.call(pb.Bye())
    assert r.kind == "ack" and r.body.text == "bye"
