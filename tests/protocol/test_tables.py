"""Sparse embedding tables on the wire, spoken from proto/gddr.proto and
docs/protocol.md ("Tables") alone: InitTable, PullRows, PushRows.

Every expected value is computed here in float32 the way the page says
the server computes it (initial rows, SGD, Adagrad, Adam with the row's own
step count, sync steps as the mean of the workers' pushes).
"""
import math
import re
import struct

import numpy as np
import pytest

from conftest import WAIT_S

M64 = (1 << 64) - 1


def keys_frame(keys):
    return struct.pack("<%dQ" % len(keys), *keys)


def rows_frame(rows):
    return np.asarray(rows, dtype="<f4").tobytes()


def hello(pb, c, world=1):
    r = c.call(pb.Hello(world_size=world, client="test_tables.py"))
    assert r.kind == "hello", r


def worker(pb, connect, srv, rank=0, world=1):
    c = connect(srv, rank=rank)
    hello(pb, c, world)
    return c


def init_table(pb, c, key, dim, **fields):
    r = c.call(pb.InitTable(key=key, dim=dim, **fields))
    return r


def pull_rows(pb, c, tid, keys, create=True, min_version=0, dim=None):
    r = c.call(pb.PullRows(table=tid, nkeys=len(keys), create=create, min_version=min_version,
                           wait_ms=int(WAIT_S * 1000)), [keys_frame(keys)])
    assert r.kind == "pull_rows", r
    assert r.body.nkeys == len(keys)
    assert r.body.payload_bytes == len(r.frames[0])
    vals = np.frombuffer(r.frames[0], dtype="<f4")
    if dim:
        vals = vals.reshape(len(keys), dim)
    return r.body, vals


def push_rows(pb, c, tid, keys, grads, step, base=0, lr=0.0):
    g = rows_frame(grads)
    return c.call(pb.PushRows(table=tid, nkeys=len(keys), step=step, base_version=base, lr=lr,
                              payload_bytes=len(g)), [keys_frame(keys), g])


def expect_error(pb, r, code):
    assert r.kind == "error", "expected %s, got %r" % (pb.ErrorCode.Name(code), r)
    assert r.body.code == code, "expected %s, got %s (%s)" % (
        pb.ErrorCode.Name(code), pb.ErrorCode.Name(r.body.code), r.body.message)
    assert r.body.message


def metric(pb, c, name, table):
    """The sum of the samples of `name` labelled table="TABLE" (all reasons)."""
    r = c.call(pb.StatsRequest(prometheus=True))
    m = re.findall(r'^%s\{table="%s"[^}]*\} (\S+)$' % (re.escape(name), re.escape(table)),
                   r.body.prometheus, re.M)
    assert m, "no %s for table %s in:\n%s" % (name, table, r.body.prometheus)
    return sum(float(x) for x in m)


# ---- registration ------------------------------------------------------------


def test_table_registration_is_by_key_and_checks_dim(pb, server, connect):
    srv = server()
    c = worker(pb, connect, srv)
    r = init_table(pb, c, "emb", 8)
    assert r.kind == "init_table", r
    assert r.body.created and r.body.dim == 8 and r.body.version == 0 and r.body.rows == 0
    # values (32 B) + index share at least: the server states what a row costs
    assert r.body.row_bytes >= 8 * 4 + 8
    again = init_table(pb, c, "emb", 8)
    assert again.kind == "init_table" and not again.body.created and again.body.id == r.body.id
    other = init_table(pb, c, "emb2", 3)
    assert other.body.created and other.body.id != r.body.id
    expect_error(pb, init_table(pb, c, "emb", 4), pb.E_LENGTH)
    expect_error(pb, init_table(pb, c, "bad key", 4), pb.E_INVAL)
    expect_error(pb, init_table(pb, c, "z", 0), pb.E_INVAL)
    expect_error(pb, init_table(pb, c, "m", 4, optimizer=pb.Optimizer(kind=pb.OPT_SGD, lr=0.1,
                                                                       momentum=0.9)), pb.E_INVAL)
    expect_error(pb, init_table(pb, c, "a", 4, optimizer=pb.Optimizer(kind=pb.OPT_ADAMW, lr=0.1,
                                                                       beta1=0.9, beta2=0.99,
                                                                       eps=1e-8)), pb.E_INVAL)
    # An observer may look a table up, not create one.
    o = connect(srv, observer=True)
    hello(pb, o)
    assert init_table(pb, o, "emb", 8).body.id == r.body.id
    expect_error(pb, init_table(pb, o, "new", 8), pb.E_NOKEY)


# ---- pulls -------------------------------------------------------------------


def test_pull_creates_rows_and_inference_pull_does_not(pb, server, connect):
    srv = server()
    c = worker(pb, connect, srv)
    tid = init_table(pb, c, "emb", 4, init=pb.TINIT_UNIFORM, init_scale=0.5, init_seed=7).body.id
    keys = [0, M64, 42, 42, 1 << 63]
    body, v = pull_rows(pb, c, tid, keys, dim=4)
    assert body.created == 4  # 42 twice is one row
    assert np.all(np.abs(v) <= 0.5) and np.any(v != 0)
    assert np.array_equal(v[2], v[3])
    # The same rows again: the same values, nothing created.
    body2, v2 = pull_rows(pb, c, tid, keys, dim=4)
    assert body2.created == 0 and np.array_equal(v, v2)
    # Inference: a key without a row reads as zeros and creates nothing.
    body3, v3 = pull_rows(pb, c, tid, [42, 99], create=False, dim=4)
    assert body3.created == 0
    assert np.array_equal(v3[0], v[2]) and np.all(v3[1] == 0)
    assert metric(pb, c, "gddr_table_rows", "emb") == 4
    # An observer's pull never creates, whatever it asks.
    o = connect(srv, observer=True)
    hello(pb, o)
    body4, v4 = pull_rows(pb, o, tid, [12345], create=True, dim=4)
    assert body4.created == 0 and np.all(v4 == 0)
    assert metric(pb, c, "gddr_table_rows", "emb") == 4


def test_initial_rows_do_not_depend_on_server_or_order(pb, server, connect):
    a, b = server(), server()
    ca, cb = worker(pb, connect, a), worker(pb, connect, b)
    fields = dict(init=pb.TINIT_NORMAL, init_scale=0.1, init_seed=99)
    ta = init_table(pb, ca, "e", 16, **fields).body.id
    tb = init_table(pb, cb, "e", 16, **fields).body.id
    keys = [5, 17, 3, 1 << 40, 8]
    _, va = pull_rows(pb, ca, ta, keys, dim=16)
    _, vb = pull_rows(pb, cb, tb, keys[::-1], dim=16)
    assert np.array_equal(va, vb[::-1])
    _, zeros = pull_rows(pb, ca, init_table(pb, ca, "z", 16).body.id, [5], dim=16)
    assert np.all(zeros == 0)


def test_malformed_row_requests_are_refused(pb, server, connect):
    srv = server()
    c = worker(pb, connect, srv)
    tid = init_table(pb, c, "emb", 2).body.id
    r = c.call(pb.PullRows(table=tid, nkeys=3, create=True), [keys_frame([1, 2])])
    expect_error(pb, r, pb.E_LENGTH)
    r = c.call(pb.PullRows(table=tid + 7, nkeys=1), [keys_frame([1])])
    expect_error(pb, r, pb.E_NOKEY)
    r = c.call(pb.PullRows(table=tid, nkeys=1))
    expect_error(pb, r, pb.E_PROTO)
    g = rows_frame([[1.0, 2.0]])
    r = c.call(pb.PushRows(table=tid, nkeys=1, step=1, payload_bytes=4), [keys_frame([1]), g])
    expect_error(pb, r, pb.E_LENGTH)
    # An observer cannot push rows.
    o = connect(srv, observer=True)
    hello(pb, o)
    expect_error(pb, push_rows(pb, o, tid, [1], [[1.0, 2.0]], step=1), pb.E_WORKER)


# ---- pushes: optimizers --------------------------------------------------------


def test_sgd_rows_async(pb, server, connect):
    srv = server(lr=0.5)
    c = worker(pb, connect, srv)
    tid = init_table(pb, c, "emb", 3).body.id  # zeros, plain SGD at the server's lr
    pull_rows(pb, c, tid, [10, 20])
    r = push_rows(pb, c, tid, [20, 10], [[1.0, 2.0, 4.0], [0.5, -1.0, 8.0]], step=1)
    assert r.kind == "push" and r.body.applied and r.body.version == 1 and not r.body.duplicate
    _, v = pull_rows(pb, c, tid, [10, 20], dim=3)
    assert v.tolist() == [[-0.25, 0.5, -4.0], [-0.5, -1.0, -2.0]]
    # A resend of step 1 is answered again and applied no second time.
    r2 = push_rows(pb, c, tid, [20, 10], [[1.0, 2.0, 4.0], [0.5, -1.0, 8.0]], step=1)
    assert r2.body.duplicate and r2.body.version == 1
    _, v2 = pull_rows(pb, c, tid, [10, 20], dim=3)
    assert np.array_equal(v, v2)
    # The push's own lr wins over the table's.
    push_rows(pb, c, tid, [10], [[1.0, 1.0, 1.0]], step=2, base=1, lr=0.25)
    _, v3 = pull_rows(pb, c, tid, [10], dim=3)
    assert v3.tolist() == [[-0.5, 0.25, -4.25]]


def test_bad_row_push_changes_nothing(pb, server, connect):
    srv = server(lr=0.5)
    c = worker(pb, connect, srv)
    tid = init_table(pb, c, "emb", 2).body.id
    pull_rows(pb, c, tid, [1, 2])
    expect_error(pb, push_rows(pb, c, tid, [1, 2, 1], [[1, 1], [1, 1], [1, 1]], step=1), pb.E_INVAL)
    expect_error(pb, push_rows(pb, c, tid, [1, 2], [[1, 1], [1, float("nan")]], step=2),
                 pb.E_NONFINITE)
    expect_error(pb, push_rows(pb, c, tid, [1], [[1, 1]], step=3, base=5), pb.E_VERSION)
    _, v = pull_rows(pb, c, tid, [1, 2], dim=2)
    assert np.all(v == 0)
    r = push_rows(pb, c, tid, [1], [[1, 1]], step=4)
    assert r.body.version == 1  # the refused pushes made no version


def adam_ref(g_steps, lr, b1, b2, eps):
    """Adam in float32 over a row's own steps (the row's step count is k)."""
    f = np.float32
    w = np.zeros_like(g_steps[0], dtype=np.float32)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for k, g in enumerate(g_steps, 1):
        g = np.asarray(g, dtype=np.float32)
        m = f(b1) * m + f(1 - b1) * g
        v = f(b2) * v + f(1 - b2) * g * g
        mh = m / f(1 - b1 ** k)
        vh = v / f(1 - b2 ** k)
        w = w - f(lr) * mh / (np.sqrt(vh) + f(eps))
    return w


def test_adam_rows_count_their_own_steps(pb, server, connect):
    srv = server()
    c = worker(pb, connect, srv)
    opt = pb.Optimizer(kind=pb.OPT_ADAM, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8)
    tid = init_table(pb, c, "emb", 4, optimizer=opt).body.id
    rng = np.random.default_rng(1)
    hot = [rng.standard_normal(4).astype(np.float32) for _ in range(3)]
    cold = rng.standard_normal(4).astype(np.float32)
    # Row 7 is pushed three times, row 8 once (at the third push).
    push_rows(pb, c, tid, [7], [hot[0]], step=1, base=0)
    push_rows(pb, c, tid, [7], [hot[1]], step=2, base=1)
    push_rows(pb, c, tid, [7, 8], [hot[2], cold], step=3, base=2)
    _, v = pull_rows(pb, c, tid, [7, 8], dim=4)
    np.testing.assert_allclose(v[0], adam_ref(hot, 0.01, 0.9, 0.999, 1e-8), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(v[1], adam_ref([cold], 0.01, 0.9, 0.999, 1e-8), rtol=2e-5, atol=1e-7)
    # Adam's first step moves every coordinate by about lr whatever g is:
    np.testing.assert_allclose(np.abs(v[1]), 0.01, rtol=1e-3)


def test_adagrad_rows(pb, server, connect):
    srv = server()
    c = worker(pb, connect, srv)
    opt = pb.Optimizer(kind=pb.OPT_ADAGRAD, lr=0.5, eps=1e-6)
    tid = init_table(pb, c, "emb", 2, optimizer=opt).body.id
    push_rows(pb, c, tid, [3], [[2.0, -4.0]], step=1)
    push_rows(pb, c, tid, [3], [[2.0, 3.0]], step=2, base=1)
    _, v = pull_rows(pb, c, tid, [3], dim=2)
    f = np.float32
    G = np.zeros(2, np.float32)
    w = np.zeros(2, np.float32)
    for g in ([2.0, -4.0], [2.0, 3.0]):
        g = np.asarray(g, np.float32)
        G = G + g * g
        w = w - f(0.5) * g / (np.sqrt(G) + f(1e-6))
    np.testing.assert_allclose(v[0], w, rtol=1e-6)


def test_adadelay_scales_stale_row_pushes(pb, server, connect):
    srv = server(lr=1.0, adadelay=1.0)
    c = worker(pb, connect, srv)
    tid = init_table(pb, c, "emb", 1).body.id
    push_rows(pb, c, tid, [1], [[1.0]], step=1, base=0)   # tau 0: lr 1
    push_rows(pb, c, tid, [2], [[1.0]], step=2, base=1)   # tau 0
    r = push_rows(pb, c, tid, [3], [[1.0]], step=3, base=0)  # tau 2: lr 1/3
    assert r.body.staleness == 2
    _, v = pull_rows(pb, c, tid, [1, 2, 3])
    np.testing.assert_allclose(v, [-1.0, -1.0, -1.0 / 3], rtol=1e-6)


# ---- sync --------------------------------------------------------------------


def test_sync_step_is_the_mean_of_every_workers_rows(pb, server, connect):
    srv = server(lr=1.0, mode="sync", workers=2)
    w0 = worker(pb, connect, srv, rank=0, world=2)
    w1 = worker(pb, connect, srv, rank=1, world=2)
    tid = init_table(pb, w0, "emb", 2).body.id
    assert init_table(pb, w1, "emb", 2).body.id == tid
    r0 = push_rows(pb, w0, tid, [5, 6], [[1.0, 2.0], [4.0, 4.0]], step=1)
    assert r0.body.applied is False and r0.body.sync_target == 1
    # A pull for the step's version waits until the step is complete.
    req = w0.send(pb.PullRows(table=tid, nkeys=2, create=True, min_version=1,
                              wait_ms=int(WAIT_S * 1000)), [keys_frame([5, 6])])
    assert w0.quiet(0.3)
    r1 = push_rows(pb, w1, tid, [6, 7], [[2.0, 2.0], [8.0, -8.0]], step=1)
    assert r1.body.applied and r1.body.version == 1
    rep = w0.recv()
    assert rep.header.req_id == req and rep.kind == "pull_rows" and rep.body.version == 1
    v = np.frombuffer(rep.frames[0], dtype="<f4").reshape(2, 2)
    assert v.tolist() == [[-0.5, -1.0], [-3.0, -3.0]]
    _, v7 = pull_rows(pb, w1, tid, [7], dim=2)
    assert v7.tolist() == [[-4.0, 4.0]]
    # A worker with no rows this step pushes an empty one: the step completes.
    push_rows(pb, w0, tid, [], np.zeros((0, 2)), step=2, base=1)
    r = push_rows(pb, w1, tid, [5], [[2.0, 2.0]], step=2, base=1)
    assert r.body.applied and r.body.version == 2
    _, v5 = pull_rows(pb, w0, tid, [5], dim=2)
    assert v5.tolist() == [[-1.5, -2.0]]


def test_sync_new_process_mid_run_is_not_waited_for_where_it_has_not_pushed(pb, server, connect):
    # A new process for a rank starts its loop at the top (the tensors'
    # step) whatever phase the others are in. Were the table's step to wait
    # for it, the others would wait for its rows while it waits for them in
    # the tensors' step, for good (the sync soak's hang). It is waited for
    # on a tensor or table from its first push there.
    srv = server(lr=1.0, mode="sync", workers=2)
    a = worker(pb, connect, srv, rank=0, world=2)
    b = worker(pb, connect, srv, rank=1, world=2)
    tid = init_table(pb, a, "emb", 1).body.id
    assert init_table(pb, b, "emb", 1).body.id == tid
    xid = a.call(pb.InitTensor(key="w", n=1, payload_bytes=4), [rows_frame([[0.0]])]).body.id

    def push_w(c, g, step, base):
        return c.call(pb.Push(id=xid, birth_version=base, base_version=base, step=step,
                              grad_norm=abs(g), payload_bytes=4), [rows_frame([[g]])])

    assert b.call(pb.InitTensor(key="w", n=1, payload_bytes=4), [rows_frame([[0.0]])]).body.id == xid
    assert not push_w(a, 1.0, 1, 0).body.applied
    assert push_w(b, 3.0, 1, 0).body.version == 1
    assert not push_rows(pb, a, tid, [1], [[2.0]], step=1).body.applied
    assert push_rows(pb, b, tid, [1], [[4.0]], step=1).body.version == 1
    assert b.call(pb.Bye()).body.text == "bye"          # rank 1's process ends
    assert push_w(a, 2.0, 2, 1).body.applied              # alone: version 2
    b2 = worker(pb, connect, srv, rank=1, world=2)      # a new process for rank 1
    # a's rows: b2 has pushed no rows yet, so the step does not wait for it.
    r = push_rows(pb, a, tid, [1], [[6.0]], step=2, base=1)
    assert r.body.applied and r.body.version == 2, "the table's step waited for a new process"
    # b2 starts at the tensors' step, and is waited for there from now on.
    r = b2.call(pb.InitTensor(key="w", n=1, payload_bytes=4), [rows_frame([[0.0]])])
    assert r.body.id == xid and r.body.version == 2
    r = push_w(b2, 5.0, 1, 2)
    assert not r.body.applied and r.body.sync_target == 3
    # The metrics say who the open step waits for: rank 0.
    text = a.call(pb.StatsRequest(prometheus=True)).body.prometheus
    assert re.findall(r'^gddr_sync_step_rank\{tensor="w",rank="(\d)"\} (-?\d)$', text, re.M) == [
        ("0", "0"), ("1", "1")], text
    assert push_w(a, 7.0, 3, 2).body.applied
    assert init_table(pb, b2, "emb", 1).body.version == 2
    assert not push_rows(pb, b2, tid, [1], [[8.0]], step=1, base=2).body.applied
    text = a.call(pb.StatsRequest(prometheus=True)).body.prometheus
    assert re.findall(r'^gddr_table_sync_step_rank\{table="emb",rank="(\d)"\} (-?\d)$', text, re.M) == [
        ("0", "0"), ("1", "1")], text
    r = push_rows(pb, a, tid, [1], [[2.0]], step=3, base=2)
    assert r.body.applied and r.body.version == 3
    # Divided by the live workers: rows -(2+4)/2 - 6/2 (b2 live, excused)
    # - (8+2)/2; the tensor -(1+3)/2 - 2/1 (a alone, b gone) - (5+7)/2.
    assert pull_rows(pb, a, tid, [1])[1].tolist() == [-11.0]
    r = a.call(pb.Pull(id=xid, min_version=3, wait_ms=int(WAIT_S * 1000)))
    assert r.body.version == 3 and np.frombuffer(r.frames[0], "<f4").tolist() == [-10.0]


def test_sync_table_step_that_stalls_closes_as_it_is(pb, server, connect):
    # The stall net for a table (test_wire.py has the tensors'): the step
    # closes with rank 0's rows after sync_stall_s, and rank 1's next push
    # is its push of the open step (its place was forgotten), not late.
    srv = server(lr=1.0, mode="sync", workers=2, sync_stall_s=0.5)
    w0 = worker(pb, connect, srv, rank=0, world=2)
    w1 = worker(pb, connect, srv, rank=1, world=2)
    tid = init_table(pb, w0, "emb", 1).body.id
    assert init_table(pb, w1, "emb", 1).body.id == tid
    assert not push_rows(pb, w0, tid, [1], [[2.0]], step=1).body.applied
    assert push_rows(pb, w1, tid, [1], [[2.0]], step=1).body.version == 1  # -2
    assert not push_rows(pb, w0, tid, [1], [[4.0]], step=2, base=1).body.applied
    body, v = pull_rows(pb, w0, tid, [1], min_version=2)  # rank 1 does not push
    assert body.version == 2 and v.tolist() == [-4.0]
    text = w0.call(pb.StatsRequest(prometheus=True)).body.prometheus
    assert "gddr_sync_stalls_total 1" in text, text
    r = push_rows(pb, w1, tid, [1], [[6.0]], step=2, base=1)
    assert r.body.behind == 0 and r.body.sync_target == 3 and not r.body.applied
    r = push_rows(pb, w0, tid, [1], [[2.0]], step=3, base=2)
    assert r.body.applied and r.body.version == 3
    _, v = pull_rows(pb, w1, tid, [1], min_version=3)
    assert v.tolist() == [-8.0]


def test_sync_late_row_push_is_folded_and_not_waited_for(pb, server, connect):
    # As for tensors (test_wire.py): a row push whose step here completed
    # without it joins the open step as mass and is answered at once, so
    # its worker's row pull does not wait on a step the others are not in
    # (tensors then a table in one loop: the sync soak's hang).
    srv = server(lr=1.0, mode="sync", workers=3, sync_quorum=2)
    w = [worker(pb, connect, srv, rank=r, world=3) for r in range(3)]
    tid = init_table(pb, w[0], "emb", 1).body.id
    for x in w[1:]:
        assert init_table(pb, x, "emb", 1).body.id == tid
    assert not push_rows(pb, w[0], tid, [1], [[3.0]], step=1).body.applied
    assert push_rows(pb, w[1], tid, [1], [[6.0]], step=1).body.version == 1  # quorum
    assert not push_rows(pb, w[0], tid, [2], [[3.0]], step=2, base=1).body.applied
    assert push_rows(pb, w[2], tid, [1], [[3.0]], step=1, base=1).body.version == 2
    r = push_rows(pb, w[1], tid, [1, 2], [[9.0], [3.0]], step=2, base=1)
    assert not r.body.applied and r.body.version == 2 and r.body.behind == 1
    assert r.body.sync_target == 2, "a late row push must not wait for the open step"
    body, v = pull_rows(pb, w[1], tid, [1, 2], min_version=r.body.sync_target)
    assert body.version == 2 and v.tolist() == [-4.0, -1.0]
    # Step 3 still wants rank 1's push of it (its late one is mass): rank 0
    # alone is no quorum.
    r = push_rows(pb, w[0], tid, [1], [[3.0]], step=3, base=2)
    assert not r.body.applied and r.body.sync_target == 3
    r = push_rows(pb, w[1], tid, [2], [[3.0]], step=3, base=2)
    assert r.body.applied and r.body.version == 3 and r.body.behind == 0
    _, v = pull_rows(pb, w[2], tid, [1, 2], min_version=3)
    assert v.tolist() == [-8.0, -3.0]
    # With a tensor registered too (two phases), a worker two steps behind
    # catches up one push a step, so its place moves alike in the tensor's
    # steps and the table's; one phase skips (test_wire.py).
    w[0].call(pb.InitTensor(key="x", n=1, payload_bytes=4), [rows_frame([[0.0]])])
    assert not push_rows(pb, w[0], tid, [1], [[1.0]], step=4, base=3).body.applied
    assert push_rows(pb, w[1], tid, [1], [[1.0]], step=4, base=3).body.version == 4
    assert not push_rows(pb, w[0], tid, [1], [[1.0]], step=5, base=4).body.applied
    assert push_rows(pb, w[1], tid, [1], [[1.0]], step=5, base=4).body.version == 5
    # Rank 2's step 1 was step 2 here: its steps 2, 3 and 4 are 3, 4 and 5,
    # all completed without it; its step 5 is the open step 6.
    for step, behind in ((2, 3), (3, 2), (4, 1)):
        r = push_rows(pb, w[2], tid, [1], [[1.0]], step=step, base=5)
        assert r.body.behind == behind and r.body.sync_target == 5, (step, r)
    r = push_rows(pb, w[2], tid, [1], [[1.0]], step=5, base=5)
    assert r.body.behind == 0 and r.body.sync_target == 6 and not r.body.applied


def test_sync_step_completes_when_a_worker_leaves(pb, server, connect):
    srv = server(lr=1.0, mode="sync", workers=2)
    w0 = worker(pb, connect, srv, rank=0, world=2)
    w1 = worker(pb, connect, srv, rank=1, world=2)
    tid = init_table(pb, w0, "emb", 1).body.id
    r = push_rows(pb, w0, tid, [1], [[4.0]], step=1)
    assert not r.body.applied
    assert w1.call(pb.Bye()).kind == "ack"
    body, v = pull_rows(pb, w0, tid, [1], min_version=1)
    # As for a tensor: the step divides by the workers that took part or
    # are live, whichever is more: 1 after the bye.
    assert body.version == 1 and v.tolist() == [-4.0]


# ---- bounds --------------------------------------------------------------------


def test_max_rows_evicts_least_recently_touched(pb, server, connect):
    srv = server()
    c = worker(pb, connect, srv)
    tid = init_table(pb, c, "emb", 2, max_rows=50).body.id
    hot = list(range(10))
    for i in range(40):
        pull_rows(pb, c, tid, hot + [1000 + 20 * i + j for j in range(20)])
        # Recency is the table version of the last touch: a push (here an
        # empty one) makes the next version.
        assert push_rows(pb, c, tid, [], np.zeros((0, 2)), step=i + 1, base=i).body.version == i + 1
    assert metric(pb, c, "gddr_table_rows", "emb") <= 50
    evicted = metric(pb, c, "gddr_table_rows_evicted_total", "emb")
    created = metric(pb, c, "gddr_table_rows_created_total", "emb")
    assert created == 10 + 40 * 20
    assert evicted == created - metric(pb, c, "gddr_table_rows", "emb")
    # The hot rows were touched every time: (sampled) LRU keeps most of them.
    body, _ = pull_rows(pb, c, tid, hot)
    assert body.created <= 3


def test_server_row_cap_spans_tables(pb, server, connect):
    srv = server(max_table_rows=30)
    c = worker(pb, connect, srv)
    a = init_table(pb, c, "a", 2).body.id
    b = init_table(pb, c, "b", 2).body.id
    pull_rows(pb, c, a, list(range(25)))
    pull_rows(pb, c, b, list(range(25)))
    assert metric(pb, c, "gddr_table_rows", "a") + metric(pb, c, "gddr_table_rows", "b") <= 30


def test_row_ttl_expires_untouched_rows(pb, server, connect):
    srv = server(lr=0.5)
    c = worker(pb, connect, srv)
    tid = init_table(pb, c, "emb", 1, row_ttl=3).body.id
    push_rows(pb, c, tid, [1, 2], [[1.0], [1.0]], step=1)
    # Row 1 is pushed every version; row 2 never again.
    for s in range(2, 40):
        push_rows(pb, c, tid, [1], [[0.0]], step=s, base=s - 1)
    assert metric(pb, c, "gddr_table_rows_evicted_total", "emb") >= 1
    _, v = pull_rows(pb, c, tid, [1, 2], create=False)
    assert v.tolist() == [-0.5, 0.0]  # row 2 is gone: reads as zeros without a row


def test_admission_by_count(pb, server, connect):
    srv = server(lr=1.0)
    c = worker(pb, connect, srv)
    tid = init_table(pb, c, "emb", 1, init=pb.TINIT_UNIFORM, init_scale=1.0, init_seed=3,
                     admit=pb.TADMIT_COUNT, admit_count=3).body.id
    b1, v1 = pull_rows(pb, c, tid, [9])
    assert b1.created == 0 and v1[0] != 0  # not admitted: its initial value, no row
    push_rows(pb, c, tid, [9], [[1.0]], step=1)  # dropped
    assert metric(pb, c, "gddr_table_gradients_dropped_total", "emb") == 1
    b2, v2 = pull_rows(pb, c, tid, [9])
    assert b2.created == 0 and v2[0] == v1[0]
    b3, v3 = pull_rows(pb, c, tid, [9])
    assert b3.created == 1 and v3[0] == v1[0]
    push_rows(pb, c, tid, [9], [[1.0]], step=2, base=1)
    _, v4 = pull_rows(pb, c, tid, [9])
    assert v4[0] == np.float32(v1[0] - 1.0)


# ---- several servers -------------------------------------------------------------


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def test_splitmix64_matches_the_documented_constants():
    # SplitMix64's published first outputs for seed 0 (the generator adds
    # the golden gamma before mixing, as gddr_splitmix64 does).
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def sharded_worker(pb, connect, srv, rank, world, idx, count):
    c = connect(srv, rank=rank)
    r = c.call(pb.Hello(world_size=world, client="test_tables.py", shard_index=idx,
                        shard_count=count))
    assert r.kind == "hello", r
    return c


def test_a_server_refuses_keys_of_another_shard(pb, server, connect):
    srv = server(shard_index=1, shard_count=2)
    c = sharded_worker(pb, connect, srv, 0, 1, 1, 2)
    tid = init_table(pb, c, "emb", 1).body.id
    mine = [k for k in range(20) if splitmix64(k) % 2 == 1]
    theirs = [k for k in range(20) if splitmix64(k) % 2 == 0]
    body, _ = pull_rows(pb, c, tid, mine)
    assert body.created == len(mine)
    r = c.call(pb.PullRows(table=tid, nkeys=1, create=True), [keys_frame(theirs[:1])])
    expect_error(pb, r, pb.E_INVAL)
    assert "shard 0" in r.body.message
    expect_error(pb, push_rows(pb, c, tid, theirs[:1], [[1.0]], step=1), pb.E_INVAL)


def run_sync_adam(pb, server, connect, S, steps=6, dim=8):
    """Two workers, sync, Adam rows over S servers split by key; returns
    the final rows of every key touched, pulled back from their servers."""
    srvs = [server(mode="sync", workers=2, shard_index=i, shard_count=S) for i in range(S)]
    ws = [[sharded_worker(pb, connect, srvs[i], r, 2, i, S) if S > 1 else worker(pb, connect, srvs[i], r, 2)
           for i in range(S)] for r in range(2)]
    opt = pb.Optimizer(kind=pb.OPT_ADAM, lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8)
    tids = [init_table(pb, ws[r][i], "emb", dim, init=pb.TINIT_NORMAL, init_scale=0.1, init_seed=5,
                       optimizer=opt).body.id for r in range(2) for i in range(S)][:S]
    rng = np.random.default_rng(3)
    touched = set()
    for step in range(1, steps + 1):
        for r in range(2):
            keys = sorted(set(int(k) for k in rng.integers(0, 60, size=12)))
            touched.update(keys)
            grads = rng.standard_normal((len(keys), dim)).astype(np.float32)
            for i in range(S):
                sel = [j for j, k in enumerate(keys) if (splitmix64(k) % S if S > 1 else 0) == i]
                pull_rows(pb, ws[r][i], tids[i], [keys[j] for j in sel], min_version=step - 1)
                rep = push_rows(pb, ws[r][i], tids[i], [keys[j] for j in sel],
                                grads[sel] if sel else np.zeros((0, dim)), step=step, base=step - 1)
                assert rep.kind == "push", rep
    out = {}
    for k in sorted(touched):
        i = splitmix64(k) % S if S > 1 else 0
        _, v = pull_rows(pb, ws[0][i], tids[i], [k], create=False, min_version=steps, dim=dim)
        out[k] = v[0].tobytes()
    return out


def test_sync_rows_over_three_servers_are_bit_identical_to_one(pb, server, connect):
    one = run_sync_adam(pb, server, connect, 1)
    three = run_sync_adam(pb, server, connect, 3)
    assert one.keys() == three.keys() and len(one) > 30
    assert one == three


def u01(seed, key, i):
    return (splitmix64(seed ^ splitmix64(key ^ ((i * 0x9E3779B97F4A7C15) & M64))) >> 40) * 2.0 ** -24


def test_initial_rows_follow_the_documented_formula(pb, server, connect):
    srv = server()
    c = worker(pb, connect, srv)
    dim, seed, s = 5, 0xDEADBEEF, 0.25
    tu = init_table(pb, c, "u", dim, init=pb.TINIT_UNIFORM, init_scale=s, init_seed=seed).body.id
    tn = init_table(pb, c, "n", dim, init=pb.TINIT_NORMAL, init_scale=s, init_seed=seed).body.id
    keys = [0, 1, 12345, M64, 1 << 33]
    _, vu = pull_rows(pb, c, tu, keys, dim=dim)
    _, vn = pull_rows(pb, c, tn, keys, dim=dim)
    f = np.float32
    for r, k in enumerate(keys):
        want_u = [f(s) * (f(2) * f(u01(seed, k, i)) - f(1)) for i in range(dim)]
        assert vu[r].tolist() == [float(w) for w in want_u], k
        want_n = [f(s * math.sqrt(-2 * math.log(1 - u01(seed, k, 2 * i)))
                    * math.cos(2 * math.pi * u01(seed, k, 2 * i + 1))) for i in range(dim)]
        np.testing.assert_allclose(vn[r], want_n, rtol=1e-6, atol=1e-9)


def test_server_byte_cap_bounds_rows_of_any_size(pb, server, connect):
    # 20 rows of the first table's size: a table of larger rows gets fewer.
    srv = server(max_table_bytes=20 * (4 * 64 + 52))
    c = worker(pb, connect, srv)
    small = init_table(pb, c, "small", 64)
    assert small.body.row_bytes == 4 * 64 + 52  # values + key, touch, steps, index share
    pull_rows(pb, c, small.body.id, list(range(50)))
    assert metric(pb, c, "gddr_table_rows", "small") == 20
    big = init_table(pb, c, "big", 640, optimizer=pb.Optimizer(kind=pb.OPT_ADAM, lr=0.01, beta1=0.9,
                                                               beta2=0.999, eps=1e-8))
    assert big.body.row_bytes == 3 * 4 * 640 + 52
    body, _ = pull_rows(pb, c, big.body.id, list(range(10)))
    rows_small = metric(pb, c, "gddr_table_rows", "small")
    rows_big = metric(pb, c, "gddr_table_rows", "big")
    assert rows_small * small.body.row_bytes + rows_big * big.body.row_bytes <= 20 * (4 * 64 + 52)
    # A table evicts only its own rows: one with none to give back creates
    # nothing (its keys read as their initial values, gradients are dropped).
    assert rows_big == 0 and rows_small == 20


def test_sync_step_waits_for_live_workers_not_for_a_count(pb, server, connect):
    # A worker that pushed and left must not let the step go without the
    # one still to push (a count of pushes would have matched the live
    # workers: 1 and 1).
    srv = server(lr=1.0, mode="sync", workers=2)
    w0 = worker(pb, connect, srv, rank=0, world=2)
    w1 = worker(pb, connect, srv, rank=1, world=2)
    tid = init_table(pb, w0, "s", 1).body.id
    init_table(pb, w1, "s", 1)
    assert not push_rows(pb, w0, tid, [1], [[1.0]], step=1).body.applied
    assert w0.call(pb.Bye()).kind == "ack"
    _, v = pull_rows(pb, w1, tid, [1], create=False)
    assert v.tolist() == [0.0]
    r = push_rows(pb, w1, tid, [1], [[1.0]], step=1)
    assert r.body.applied and r.body.version == 1
    _, v = pull_rows(pb, w1, tid, [1], min_version=1)
    assert v.tolist() == [-1.0]  # the mean of both pushes: one step, not two


def test_sync_step_takes_the_pushes_lr(pb, server, connect):
    # A worker's lr schedule reaches a sync step of rows as it reaches a
    # tensor's: the step runs at the lr its pushes carried (first in rank
    # order), not the table's.
    srv = server(lr=1.0, mode="sync", workers=2)
    w0 = worker(pb, connect, srv, rank=0, world=2)
    w1 = worker(pb, connect, srv, rank=1, world=2)
    tid = init_table(pb, w0, "s", 1).body.id
    init_table(pb, w1, "s", 1)
    push_rows(pb, w0, tid, [1], [[2.0]], step=1, lr=0.25)
    assert push_rows(pb, w1, tid, [1], [[2.0]], step=1, lr=0.25).body.applied
    _, v = pull_rows(pb, w1, tid, [1], min_version=1)
    assert v.tolist() == [-0.5]  # 0.25 x the mean 2
    # The resend of a push is answered and counted as one.
    assert push_rows(pb, w0, tid, [1], [[2.0]], step=1, lr=0.25).body.duplicate
    assert metric(pb, w0, "gddr_table_duplicates_total", "s") == 1
    assert metric(pb, w0, "gddr_table_pushes_total", "s") == 2
