#!/usr/bin/env python3
"""lying_server.py -- a ROUTER that answers libgddr-client's requests with
replies a gddr-ps never sends, for tests/fuzz/client_driver.c
(scripts/fuzz-client.sh runs the two).

Each reply starts as a plausible one (a hello with a chunk of 4, 256, 3
or 0; an init of the asked length; pulls whole, in parts at random
offsets, or as 8- and 16-bit deltas with bitmaps of any length; pushes
taken or not; tables of another dim; row pulls of the wrong size; whole
pulls in parts laid out at random, tiling or overlapping) and then,
often, has fields overwritten with values from the edges (the Fuzzer of
tests/protocol/test_hostile.py), its frames replaced, its header replaced
with random bytes, is sent twice, not at all, or is preceded by an unasked
Orphan.

  lying_server.py SEED SECONDS ENDPOINT_FILE
"""
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import zmq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "protocol"))
from conftest import compile_proto  # noqa: E402
from test_hostile import Fuzzer  # noqa: E402


def main():
    seed, seconds, ep_file = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    with tempfile.TemporaryDirectory(prefix="gddr_pb2.") as d:
        pb = compile_proto(d)  # imported: the folder may go
    rng = random.Random(seed)
    fz = Fuzzer(pb, rng)
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    with open(ep_file + ".tmp", "w") as f:
        f.write("tcp://127.0.0.1:%d" % port)
    os.replace(ep_file + ".tmp", ep_file)
    epoch, version, kinds = rng.getrandbits(63) | 1, 0, {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not s.poll(200):
            continue
        fr = s.recv_multipart()
        ident = fr[0]
        try:
            rq = pb.Request.FromString(fr[1])
        except Exception:
            continue
        kind = rq.WhichOneof("body")
        kinds[kind] = kinds.get(kind, 0) + 1
        rp = pb.Reply(protocol=pb.PROTOCOL_VERSION, req_id=rq.req_id, epoch=epoch, tau=4)
        frames = []
        if kind == "hello":
            h = rp.hello
            h.mode, h.chunk, h.workers, h.tau = 0, rng.choice([4, 4, 256, 0, 3]), 1, 4
            h.max_message_bytes = 1 << 30
            # The layout the client says it expects (a sharded client's
            # hello names it), so sharded clients get past their hello.
            h.shard_index, h.shard_count = rq.hello.shard_index, max(rq.hello.shard_count, 1)
        elif kind == "init":
            rp.init.id, rp.init.version, rp.init.n, rp.init.created = 0, version, rq.init.n, True
        elif kind == "pull":
            n = rng.choice([10, 3000, 7, 0])
            p = rp.pull
            p.id, p.version, p.payload_bytes = rq.pull.id, version, 4 * n
            bits = rq.pull.delta_bits if rng.random() < 0.5 else rng.choice([0, 8, 16, 5])
            if bits and rng.random() < 0.5:
                p.delta_bits = bits
                p.view_seq = rng.choice([0, 1, rq.pull.view_seq, rq.pull.view_seq + 1])
                p.payload_bytes = rng.choice([n * bits // 8, n * bits // 8 + 4 * ((n + 3) // 4), 0, 17])
                size = p.payload_bytes if rng.random() < 0.8 else rng.randrange(64)
                frames = [bytes(rng.getrandbits(8) for _ in range(size))]
            else:
                frames = [fz.floats(n)]
            if rng.random() < 0.3:
                p.bitmap = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 2, 3, 100])))
            if rng.random() < 0.2:
                p.parts, p.part = rng.choice([1, 2, 3]), rng.randrange(4)
                p.offset = rng.choice([0, 4, 12, 1 << 40])
            elif rng.random() < 0.25 and not p.delta_bits:
                # A whole answer in parts, laid out at random: in order or
                # not, tiling the values or overlapping them.
                parts = rng.choice([2, 3])
                for k in range(parts):
                    q = pb.Reply()
                    q.CopyFrom(rp)
                    m = rng.choice([0, n // 2, n // 3, n, 4]) if rng.random() < 0.5 else k * (n // parts)
                    size = rng.choice([n, n // parts, n - m if n >= m else 0, 1])
                    q.pull.parts, q.pull.part, q.pull.offset = parts, k if rng.random() < 0.9 else 0, m
                    q.pull.payload_bytes = 4 * size
                    if k < parts - 1:
                        s.send_multipart([ident, q.SerializeToString(), fz.floats(size)])
                    else:
                        rp, frames = q, [fz.floats(size)]
        elif kind == "push":
            version += 1
            p = rp.push
            p.id, p.version, p.applied = rq.push.id, version, rng.random() < 0.8
            p.sync_target = rng.choice([0, version, version + 1, 2**64 - 1])
        elif kind == "init_table":
            t = rp.init_table
            t.id, t.version, t.created = rng.choice([0, 0, 1, 7]), version, True
            t.dim = rng.choice([rq.init_table.dim, rq.init_table.dim, 0, 8, 65536])
        elif kind == "pull_rows":
            k = rq.pull_rows.nkeys if rng.random() < 0.7 else rng.choice([0, 1, 100])
            dim = rng.choice([4, 4, 4, 3, 8])
            p = rp.pull_rows
            p.table, p.version, p.nkeys = rq.pull_rows.table, version, k
            p.payload_bytes = 4 * k * dim if rng.random() < 0.8 else rng.choice([0, 4, 1 << 40])
            frames = [fz.floats(k * dim)]
        elif kind == "push_rows":
            version += 1
            rp.push.id, rp.push.version, rp.push.applied = rq.push_rows.table, version, True
        elif kind in ("bye", "heartbeat", "checkpoint"):
            rp.ack.SetInParent()
        else:
            rp.error.code = pb.E_NOTSUP
        if rng.random() < 0.35 and rp.WhichOneof("body"):
            fz.fill(getattr(rp, rp.WhichOneof("body")))
        if rng.random() < 0.05:
            fz.fill(rp)
        if rng.random() < 0.1:
            frames = fz.frames(10)
        out = [ident, rp.SerializeToString()] + frames
        if rng.random() < 0.03:
            out = [ident, bytes(rng.getrandbits(8) for _ in range(rng.randrange(30)))]
        if rng.random() < 0.05:
            continue  # no reply at all
        if rng.random() < 0.05:
            s.send_multipart(out)  # the same reply twice
        if rng.random() < 0.05:  # an unasked Orphan first
            o = pb.Reply(protocol=pb.PROTOCOL_VERSION, req_id=0, epoch=epoch)
            o.orphan.SetInParent()
            fz.fill(o.orphan)
            s.send_multipart([ident, o.SerializeToString()] + fz.frames(10))
        s.send_multipart(out)
    print("lying_server: seed %d, %d requests: %s" % (seed, sum(kinds.values()),
          " ".join("%s %d" % kv for kv in sorted(kinds.items()))))


if __name__ == "__main__":
    main()
